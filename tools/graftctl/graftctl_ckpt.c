/*
 * graftctl ckpt: a checkpoint root on disk, without etcd. ls, verify
 * (every chunk, the manifest.json sidecar against manifest.pb, and with
 * --secret-file the manifest's MAC under the job secret), inspect, prune
 * and restore --dry-run, all through graft/persist.h.
 */
#include "graftctl.h"
#include "graftctl_ckpt.h"

#include <graft/persist.h>

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <jansson.h>

static bool has_step_dir(DIR *d)
{
    bool any = false;
    for (struct dirent *e = readdir(d); e != NULL && !any; e = readdir(d))
        any = strncmp(e->d_name, "step-", 5) == 0;
    return any;
}

/* A root that does not exist, cannot be read or holds no step-* folder is
 * named as such, rather than listed as empty. */
static int check_root(const char *root)
{
    struct stat sb;
    if (stat(root, &sb) != 0) {
        fprintf(stderr, "graftctl ckpt: %s: %s\n", root,
                errno == EACCES ? "permission denied" : strerror(errno));
        return GRAFTCTL_FAIL;
    }
    if (!S_ISDIR(sb.st_mode)) {
        fprintf(stderr, "graftctl ckpt: %s: not a checkpoint directory (not a directory)\n", root);
        return GRAFTCTL_FAIL;
    }
    DIR *d = opendir(root);
    if (d == NULL) {
        fprintf(stderr, "graftctl ckpt: %s: %s\n", root,
                errno == EACCES ? "permission denied" : strerror(errno));
        return GRAFTCTL_FAIL;
    }
    bool any = has_step_dir(d);
    closedir(d);
    if (!any) {
        /* A persist root of several jobs: say which folders hold them. */
        json_t *jobs = graftctl_ckpt_job_folders(root);
        char names[1024] = "";
        size_t i, used = 0;
        json_t *j;
        json_array_foreach(jobs, i, j)
            if (used + 64 < sizeof(names))
                used += (size_t)snprintf(names + used, sizeof(names) - used, "%s%.60s",
                                         i ? ", " : "",
                                         json_string_value(json_object_get(j, "job")));
        char text[GRAFTCTL_TEXT_LEN];
        fprintf(stderr, "graftctl ckpt: %s: not a checkpoint directory (no step-* folder)%s%s\n",
                root, used ? "; it holds the job folders " : "",
                used ? graftctl_text(names, text, sizeof(text)) : "");
        json_decref(jobs);
        return GRAFTCTL_FAIL;
    }
    return GRAFTCTL_OK;
}

/* The job secret from a file, read as graft_init() reads job_secret_file:
 * 16 to 256 bytes, a trailing newline not part of it. */
static int secret_load(const char *path, ckpt_args_t *a)
{
    uint8_t buf[GRAFT_PERSIST_SECRET_MAX_BYTES + 2];
    size_t n = 0;
    struct stat sb;
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    bool ok = fd >= 0 && fstat(fd, &sb) == 0;
    if (!ok || !S_ISREG(sb.st_mode)) {
        fprintf(stderr, "graftctl ckpt: --secret-file %s: %s\n", path,
                !ok ? strerror(errno) : "not a regular file");
        if (fd >= 0)
            close(fd);
        return GRAFTCTL_USAGE;
    }
    for (;;) {
        ssize_t r = read(fd, buf + n, sizeof(buf) - n);
        if (r < 0 && errno == EINTR)
            continue;
        if (r <= 0 || (n += (size_t)r) == sizeof(buf))
            break;
    }
    close(fd);
    if (n > 0 && buf[n - 1] == '\n')
        n--;
    if (n < 16 || n > GRAFT_PERSIST_SECRET_MAX_BYTES) {
        fprintf(stderr, "graftctl ckpt: --secret-file %s: a job secret has 16 to %u bytes\n",
                path, GRAFT_PERSIST_SECRET_MAX_BYTES);
        explicit_bzero(buf, sizeof(buf));
        return GRAFTCTL_USAGE;
    }
    memcpy(a->secret, buf, n);
    a->secret_len = n;
    explicit_bzero(buf, sizeof(buf));
    return GRAFTCTL_OK;
}

/* A directory that is not a complete checkpoint is pruned only once nothing
 * was added to it for this long: a job may still be committing it. */
#define GRAFTCTL_LEFTOVER_AGE_MS (10u * 60u * 1000u)

static int parse_args(int argc, char **argv, int first, ckpt_args_t *a)
{
    memset(a, 0, sizeof(*a));
    a->policy.leftover_min_age_ms = GRAFTCTL_LEFTOVER_AGE_MS;
    for (int i = first; i < argc; i++) {
        const char *s = argv[i];
        uint64_t v;
        if (strcmp(s, "--quick") == 0) {
            a->quick = true;
        } else if (strcmp(s, "--dry-run") == 0) {
            a->dry_run = true;
        } else if (strcmp(s, "--geometric") == 0) {
            a->policy.geometric = true;
        } else if (strcmp(s, "--endpoint") == 0 && i + 1 < argc) {
            a->endpoint = argv[++i];
        } else if (strcmp(s, "--region") == 0 && i + 1 < argc) {
            a->region = argv[++i];
        } else if (strcmp(s, "--secret-file") == 0 && i + 1 < argc) {
            int rc = secret_load(argv[++i], a);
            if (rc != GRAFTCTL_OK)
                return rc;
        } else if ((strcmp(s, "--keep-last") == 0 || strcmp(s, "--milestone-every") == 0 ||
                    strcmp(s, "--step") == 0) &&
                   i + 1 < argc && graftctl_parse_u64(argv[i + 1], &v)) {
            if (strcmp(s, "--keep-last") == 0) {
                a->policy.keep_last = (uint32_t)(v > UINT32_MAX ? UINT32_MAX : v);
            } else if (strcmp(s, "--milestone-every") == 0) {
                a->policy.milestone_every = v;
            } else {
                a->has_step = true;
                a->step = v;
            }
            i++;
        } else if (s[0] != '-' && a->root == NULL) {
            a->root = s;
        } else if (s[0] != '-' && !a->has_step && graftctl_parse_u64(s, &v)) {
            a->has_step = true;
            a->step = v;
        } else {
            fprintf(stderr, "graftctl ckpt %s: bad argument '%s'\n", argv[first - 1], s);
            return GRAFTCTL_USAGE;
        }
    }
    if (a->root == NULL) {
        fprintf(stderr, "graftctl ckpt %s: give the checkpoint ROOT\n", argv[first - 1]);
        return GRAFTCTL_USAGE;
    }
    if (graftctl_ckpt_is_remote(a->root))
        return GRAFTCTL_OK; /* the store is asked by the command itself */
    if (a->endpoint != NULL || a->region != NULL) {
        fprintf(stderr, "graftctl ckpt %s: --endpoint and --region are for an s3:// ROOT\n",
                argv[first - 1]);
        return GRAFTCTL_USAGE;
    }
    return check_root(a->root);
}

static int list_entries(const char *root, graft_persist_entry_t **e_p, size_t *n_p)
{
    graft_status_t st = graft_persist_list(root, e_p, n_p);
    if (st != GRAFT_OK) {
        fprintf(stderr, "graftctl ckpt: listing %s: %s\n", root, graft_status_string(st));
        return GRAFTCTL_FAIL;
    }
    return GRAFTCTL_OK;
}

/* Retention class of each complete checkpoint under a policy: why it is
 * kept (newest, milestone, config_change, kept) or that it would go. */
static const char *retention_class(const graft_persist_retention_t *p,
                                   const graft_persist_entry_t *e, bool newest, bool keep)
{
    if (e->state != GRAFT_PERSIST_COMPLETE)
        return "invalid";
    if (newest)
        return "newest";
    if (e->before_config_change)
        return "config_change";
    if (p->milestone_every > 0 && e->step % p->milestone_every == 0)
        return "milestone";
    return keep ? "kept" : "prunable";
}

/* What retention does with a directory that is not a complete checkpoint
 * (graft_persist_retention_apply): removed when older than the newest
 * complete one and left alone for the policy's minimum age, so that a
 * checkpoint a running job is still committing is never taken for a
 * crash's leftover. */
static bool leftover_dropped(const char *root, const graft_persist_retention_t *p,
                             const graft_persist_entry_t *e, uint64_t newest_complete,
                             bool any_complete)
{
    if (!any_complete || e->step >= newest_complete)
        return false;
    char dir[PATH_MAX];
    struct stat sb;
    snprintf(dir, sizeof(dir), "%s/step-%020" PRIu64, root, e->step);
    if (p->leftover_min_age_ms == 0 || stat(dir, &sb) != 0)
        return true;
    return (time(NULL) - sb.st_mtime) * 1000 >= (time_t)p->leftover_min_age_ms;
}

static int plan(const char *root, const graft_persist_retention_t *p,
                const graft_persist_entry_t *e, size_t n, bool *keep)
{
    uint64_t *steps = calloc(n + 1, sizeof(*steps));
    bool *marked = calloc(n + 1, sizeof(*marked));
    bool *k = calloc(n + 1, sizeof(*k));
    size_t nv = 0;
    int rc = GRAFTCTL_FAIL;
    if (steps == NULL || marked == NULL || k == NULL)
        goto out;
    for (size_t i = 0; i < n; i++) {
        keep[i] = true;
        if (e[i].state == GRAFT_PERSIST_COMPLETE) {
            steps[nv] = e[i].step;
            marked[nv++] = e[i].before_config_change;
        }
    }
    if (graft_persist_retention_plan(p, steps, marked, nv, k) != GRAFT_OK)
        goto out;
    uint64_t newest = 0;
    for (size_t i = 0; i < n; i++)
        if (e[i].state == GRAFT_PERSIST_COMPLETE)
            newest = e[i].step > newest ? e[i].step : newest;
    for (size_t i = 0, j = 0; i < n; i++) {
        if (e[i].state == GRAFT_PERSIST_COMPLETE) {
            /* The newest complete one always stays, as retention keeps it. */
            keep[i] = k[j++] || e[i].step == newest;
        } else {
            keep[i] = !leftover_dropped(root, p, &e[i], newest, nv > 0);
        }
    }
    rc = GRAFTCTL_OK;
out:
    free(steps);
    free(marked);
    free(k);
    return rc;
}

static int ckpt_ls(const graftctl_opts_t *o, const ckpt_args_t *a)
{
    graft_persist_entry_t *e = NULL;
    size_t n = 0;
    bool *keep = NULL;
    int rc = list_entries(a->root, &e, &n);
    if (rc != GRAFTCTL_OK)
        return rc;
    keep = calloc(n + 1, sizeof(*keep));
    if (keep == NULL || plan(a->root, &a->policy, e, n, keep) != GRAFTCTL_OK) {
        fprintf(stderr, "graftctl ckpt ls: out of memory\n");
        rc = GRAFTCTL_FAIL;
        goto out;
    }
    json_t *list = json_array();
    if (!o->json)
        printf("%-10s %-10s %-6s %-14s %-15s %-13s %s\n", "STEP", "STATE", "RANKS", "BYTES",
               "UNIX_MS", "RETENTION", "REASON");
    bool seen_valid = false;
    for (size_t i = 0; i < n; i++) {
        bool newest = e[i].state == GRAFT_PERSIST_COMPLETE && !seen_valid;
        seen_valid |= newest;
        const char *cls = retention_class(&a->policy, &e[i], newest, keep[i]);
        if (o->json) {
            json_t *j = graftctl_ckpt_entry_json(&e[i]);
            json_object_set_new(j, "retention", json_string(cls));
            json_array_append_new(list, j);
        } else {
            char reason[GRAFTCTL_TEXT_LEN];
            printf("%-10" PRIu64 " %-10s %-6" PRIu32 " %-14" PRIu64 " %-15" PRIu64 " %-13s %s\n",
                   e[i].step, graftctl_ckpt_state_name(e[i].state), e[i].ranks, e[i].raw_bytes,
                   e[i].unix_ms, cls, graftctl_text(e[i].reason, reason, sizeof(reason)));
        }
    }
    if (o->json)
        graftctl_print_json(json_pack("{s:s,s:o}", "root", a->root, "checkpoints", list));
    else
        json_decref(list);
out:
    free(keep);
    graft_free(e);
    return rc;
}

static int ckpt_verify(const graftctl_opts_t *o, const ckpt_args_t *a)
{
    graft_persist_entry_t *e = NULL;
    size_t n = 0;
    int rc = list_entries(a->root, &e, &n);
    if (rc != GRAFTCTL_OK)
        return rc;
    bool tty = isatty(STDERR_FILENO);
    size_t faults = 0, checked = 0, todo = a->has_step ? 1 : n;
    json_t *list = json_array();
    if (a->has_step) {
        bool found = false;
        for (size_t i = 0; i < n; i++)
            found |= e[i].step == a->step;
        if (!found) {
            fprintf(stderr, "graftctl ckpt verify: %s has no step-%020" PRIu64 "\n", a->root,
                    a->step);
            rc = GRAFTCTL_FAIL;
            goto out;
        }
    }
    for (size_t i = 0; i < n; i++) {
        if (a->has_step && e[i].step != a->step)
            continue;
        checked++;
        if (tty)
            fprintf(stderr, "\rverifying %zu/%zu: step %" PRIu64 " ...", checked, todo,
                    e[i].step);
        graft_persist_entry_t v;
        graft_status_t st = graft_persist_verify_mac(
            a->root, e[i].step, a->quick ? GRAFT_PERSIST_VERIFY_QUICK : GRAFT_PERSIST_VERIFY_FULL,
            a->secret_len > 0 ? a->secret : NULL, a->secret_len, &v);
        char why[512] = "";
        const char *sidecar = st == GRAFT_ENOTFOUND ? "absent"
                                                    : graftctl_ckpt_sidecar(a->root, e[i].step, why,
                                                                    sizeof(why));
        bool bad = st != GRAFT_OK || strcmp(sidecar, "ok") != 0;
        faults += bad;
        if (tty)
            fprintf(stderr, "\r\033[K");
        if (o->json) {
            json_t *j = graftctl_ckpt_entry_json(&v);
            json_object_set_new(j, "ok", json_boolean(!bad));
            json_object_set_new(j, "authenticated", json_boolean(a->secret_len > 0 && st == GRAFT_OK));
            json_object_set_new(j, "sidecar", json_string(sidecar));
            json_object_set_new(j, "sidecar_reason", graftctl_json_text(why));
            json_array_append_new(list, j);
        } else if (!bad) {
            printf("step %" PRIu64 ": ok (%s, %" PRIu32 " shards, %" PRIu64 " bytes%s)\n", v.step,
                   a->quick ? "quick" : "every chunk", v.ranks, v.raw_bytes,
                   a->secret_len > 0 ? ", MAC ok" : "");
        } else {
            char reason[GRAFTCTL_TEXT_LEN], sidecar_why[GRAFTCTL_TEXT_LEN];
            printf("step %" PRIu64 ": FAILED: %s%s%s\n", v.step,
                   st != GRAFT_OK ? graftctl_text(v.reason, reason, sizeof(reason)) : "",
                   st != GRAFT_OK && why[0] ? "; " : "",
                   graftctl_text(why, sidecar_why, sizeof(sidecar_why)));
        }
    }
    if (o->json)
        graftctl_print_json(json_pack("{s:s,s:I,s:I,s:o}", "root", a->root, "checked",
                                      (json_int_t)checked, "faults", (json_int_t)faults,
                                      "checkpoints", list));
    else
        json_decref(list);
    rc = faults > 0 ? GRAFTCTL_FAIL : GRAFTCTL_OK;
    list = NULL;
    if (a->secret_len == 0 && !o->json)
        printf("(manifest MACs not checked: give --secret-file to tell a forged checkpoint "
               "from a genuine one)\n");
out:
    json_decref(list);
    graft_free(e);
    return rc;
}

static int ckpt_inspect(const graftctl_opts_t *o, const ckpt_args_t *a)
{
    char *text = NULL;
    char why[512] = "";
    if (!a->has_step) {
        fprintf(stderr, "graftctl ckpt inspect: give the STEP\n");
        return GRAFTCTL_USAGE;
    }
    graft_status_t st = graft_persist_manifest_json(a->root, a->step, &text);
    if (st != GRAFT_OK) {
        fprintf(stderr, "graftctl ckpt inspect: %s/step-%020" PRIu64 "/manifest.pb: %s\n", a->root,
                a->step, graft_status_string(st));
        return GRAFTCTL_FAIL;
    }
    graft_persist_entry_t v;
    graft_status_t vst = graft_persist_verify(a->root, a->step, GRAFT_PERSIST_VERIFY_QUICK, &v);
    const char *sidecar = graftctl_ckpt_sidecar(a->root, a->step, why, sizeof(why));
    json_t *m = json_loads(text, 0, NULL);
    graft_free(text);
    if (o->json) {
        graftctl_print_json(json_pack("{s:o,s:s,s:o,s:s,s:o}", "manifest",
                                      m != NULL ? m : json_null(), "state",
                                      graftctl_ckpt_state_name(v.state),
                                      "reason", graftctl_json_text(v.reason), "sidecar", sidecar,
                                      "sidecar_reason", graftctl_json_text(why)));
        return GRAFTCTL_OK;
    }
    graftctl_ckpt_inspect_print(m, &v, vst, sidecar, why);
    json_decref(m);
    return GRAFTCTL_OK;
}

static int ckpt_prune(const graftctl_opts_t *o, const ckpt_args_t *a)
{
    graft_persist_entry_t *e = NULL;
    size_t n = 0, deleted = 0;
    bool *keep = NULL;
    if (a->policy.keep_last == 0) {
        fprintf(stderr, "graftctl ckpt prune: give --keep-last N (N >= 1)\n");
        return GRAFTCTL_USAGE;
    }
    if (!a->dry_run && !o->yes && !isatty(STDIN_FILENO)) {
        fprintf(stderr, "graftctl ckpt prune: not asking on a non-terminal: give --yes or "
                "--dry-run\n");
        return GRAFTCTL_USAGE;
    }
    int rc = list_entries(a->root, &e, &n);
    if (rc != GRAFTCTL_OK)
        return rc;
    keep = calloc(n + 1, sizeof(*keep));
    if (keep == NULL || plan(a->root, &a->policy, e, n, keep) != GRAFTCTL_OK) {
        fprintf(stderr, "graftctl ckpt prune: out of memory\n");
        rc = GRAFTCTL_FAIL;
        goto out;
    }
    json_t *drop = json_array();
    for (size_t i = 0; i < n; i++)
        if (!keep[i])
            json_array_append_new(drop, json_integer((json_int_t)e[i].step));
    if (!a->dry_run && !o->yes) {
        char line[16];
        fprintf(stderr, "delete %zu checkpoints under %s? [y/N] ", json_array_size(drop),
                a->root);
        if (fgets(line, sizeof(line), stdin) == NULL || (line[0] != 'y' && line[0] != 'Y')) {
            fprintf(stderr, "graftctl ckpt prune: not confirmed; nothing done\n");
            json_decref(drop);
            rc = GRAFTCTL_FAIL;
            goto out;
        }
    }
    if (!a->dry_run) {
        graft_status_t st = graft_persist_retention_apply(a->root, &a->policy, &deleted);
        if (st != GRAFT_OK) {
            fprintf(stderr, "graftctl ckpt prune: %s: %s\n", a->root, graft_status_string(st));
            rc = GRAFTCTL_FAIL;
        }
    }
    if (o->json) {
        graftctl_print_json(json_pack("{s:s,s:b,s:o,s:I}", "root", a->root, "dry_run",
                                      a->dry_run, "drop", drop, "deleted", (json_int_t)deleted));
    } else {
        size_t i;
        json_t *x;
        printf("%s %zu checkpoints:", a->dry_run ? "would delete" : "planned to delete",
               json_array_size(drop));
        json_array_foreach(drop, i, x)
            printf(" %" JSON_INTEGER_FORMAT, json_integer_value(x));
        printf("\n");
        if (!a->dry_run)
            printf("deleted %zu directories\n", deleted);
        json_decref(drop);
    }
out:
    free(keep);
    graft_free(e);
    return rc;
}

/* What graft_persist_restore() would load: the newest checkpoint (or the
 * given step) that verifies in full; the ones skipped, and why. */
static int ckpt_restore(const graftctl_opts_t *o, const ckpt_args_t *a)
{
    graft_persist_entry_t *e = NULL;
    size_t n = 0;
    if (!a->dry_run) {
        fprintf(stderr, "graftctl ckpt restore: only --dry-run: the trainer restores its own "
                "state at start-up (graft_persist_restore)\n");
        return GRAFTCTL_USAGE;
    }
    int rc = list_entries(a->root, &e, &n);
    if (rc != GRAFTCTL_OK)
        return rc;
    bool tty = isatty(STDERR_FILENO);
    json_t *skipped = json_array();
    const graft_persist_entry_t *chosen = NULL;
    graft_persist_entry_t v;
    for (size_t i = 0; i < n && chosen == NULL; i++) {
        if (a->has_step && e[i].step != a->step)
            continue;
        if (tty)
            fprintf(stderr, "\rverifying step %" PRIu64 " (%zu of %zu) ...", e[i].step, i + 1, n);
        if (graft_persist_verify_mac(a->root, e[i].step, GRAFT_PERSIST_VERIFY_FULL,
                                     a->secret_len > 0 ? a->secret : NULL, a->secret_len,
                                     &v) == GRAFT_OK)
            chosen = &v;
        else
            json_array_append_new(skipped, json_pack("{s:I,s:o}", "step", (json_int_t)v.step,
                                                     "reason", graftctl_json_text(v.reason)));
    }
    if (tty)
        fprintf(stderr, "\r\033[K");
    /* The step asked for: not there at all, or there and refused. */
    const char *step_state = NULL;
    char step_why[GRAFTCTL_TEXT_LEN] = "";
    if (chosen == NULL && a->has_step) {
        json_t *x = json_array_get(skipped, 0);
        step_state = x == NULL ? "absent" : "corrupt";
        if (x != NULL)
            graftctl_text(json_string_value(json_object_get(x, "reason")), step_why,
                          sizeof(step_why));
    }
    if (o->json) {
        graftctl_print_json(json_pack("{s:s,s:o,s:o,s:o}", "root", a->root, "would_restore",
                                      chosen != NULL ? graftctl_ckpt_entry_json(chosen) : json_null(),
                                      "skipped", skipped, "step_state",
                                      step_state != NULL ? json_string(step_state)
                                                         : json_null()));
    } else {
        size_t i;
        json_t *x;
        char reason[GRAFTCTL_TEXT_LEN];
        json_array_foreach(skipped, i, x)
            printf("skip step %" JSON_INTEGER_FORMAT ": %s\n",
                   json_integer_value(json_object_get(x, "step")),
                   graftctl_text(json_string_value(json_object_get(x, "reason")), reason,
                                 sizeof(reason)));
        if (chosen != NULL)
            printf("would restore step %" PRIu64 " (%" PRIu32 " ranks, %" PRIu64 " bytes)\n",
                   chosen->step, chosen->ranks, chosen->raw_bytes);
        json_decref(skipped);
    }
    if (step_state != NULL) {
        fprintf(stderr, "graftctl ckpt restore: step %" PRIu64 " under %s: %s%s%s\n", a->step,
                a->root, step_state, step_why[0] ? ": " : " (no step-* folder of that step)",
                step_why);
        rc = GRAFTCTL_FAIL;
    } else if (chosen == NULL) {
        fprintf(stderr, "graftctl ckpt restore: no checkpoint under %s verifies\n", a->root);
        rc = GRAFTCTL_FAIL;
    }
    graft_free(e);
    return rc;
}

/* `ckpt ls ROOT` where ROOT holds job folders and no step-* folder: lists
 * the jobs (true), else leaves ls to its usual path (false). */
static bool ls_jobs(const graftctl_opts_t *o, int argc, char **argv)
{
    DIR *d = argc == 3 && argv[2][0] != '-' ? opendir(argv[2]) : NULL;
    if (d == NULL)
        return false; /* check_root() says why */
    bool steps = has_step_dir(d);
    closedir(d);
    if (steps)
        return false;
    json_t *jobs = graftctl_ckpt_job_folders(argv[2]);
    bool listed = json_array_size(jobs) > 0;
    if (listed)
        graftctl_ckpt_jobs_print(argv[2], jobs, o->json);
    json_decref(jobs);
    return listed;
}

int graftctl_cmd_ckpt(const graftctl_opts_t *o, int argc, char **argv)
{
    static const struct {
        const char *name;
        int (*fn)(const graftctl_opts_t *, const ckpt_args_t *);
    } subs[] = {{"ls", ckpt_ls},
                {"verify", ckpt_verify},
                {"inspect", ckpt_inspect},
                {"prune", ckpt_prune},
                {"restore", ckpt_restore}};
    ckpt_args_t a;
    if (argc < 2) {
        fprintf(stderr, "graftctl ckpt: give ls, verify, inspect, prune or restore\n");
        return GRAFTCTL_USAGE;
    }
    for (size_t i = 0; i < sizeof(subs) / sizeof(subs[0]); i++) {
        if (strcmp(argv[1], subs[i].name) != 0)
            continue;
        if (subs[i].fn == ckpt_ls && ls_jobs(o, argc, argv))
            return GRAFTCTL_OK;
        int rc = parse_args(argc, argv, 2, &a);
        if (rc == GRAFTCTL_OK && graftctl_ckpt_is_remote(a.root))
            rc = graftctl_ckpt_remote(o, subs[i].name, &a);
        else if (rc == GRAFTCTL_OK)
            rc = subs[i].fn(o, &a);
        explicit_bzero(a.secret, sizeof(a.secret));
        return rc;
    }
    fprintf(stderr, "graftctl ckpt: unknown subcommand '%s'\n", argv[1]);
    return GRAFTCTL_USAGE;
}
