/*
 * graftctl ckpt on an s3://bucket/prefix URL: ls, verify, inspect, prune and
 * restore --dry-run through the library's remote calls (graft/persist.h:
 * graft_persist_remote_entries, _fetch, _prune). verify, inspect and
 * restore --dry-run download a checkpoint into a scratch directory as a
 * restore does (every object, every chunk verified), then read it there.
 */
#include "graftctl_ckpt.h"

#include <dirent.h>
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* The store: --endpoint, else GRAFT_PERSIST_REMOTE_ENDPOINT, else the
 * library's AWS_ENDPOINT_URL(_S3); credentials from AWS_*. A tool gives up
 * sooner than a job's uploader. */
static graft_persist_remote_config_t remote_config(const ckpt_args_t *a)
{
    const char *ep = a->endpoint != NULL ? a->endpoint : getenv("GRAFT_PERSIST_REMOTE_ENDPOINT");
    const char *region = a->region != NULL ? a->region : getenv("GRAFT_PERSIST_REMOTE_REGION");
    return (graft_persist_remote_config_t){.url = a->root,
                                           .endpoint = ep != NULL && ep[0] ? ep : NULL,
                                           .region = region != NULL && region[0] ? region : NULL,
                                           .max_retries = 2,
                                           .backoff_ms = 200,
                                           .timeout_ms = 30000};
}

static int store_error(const char *sub, const char *url, graft_status_t st, const char *why)
{
    char t[GRAFTCTL_TEXT_LEN];
    /* The library's reasons often start with the URL already. */
    bool named = strncmp(why, url, strlen(url)) == 0 && why[strlen(url)] == ':';
    fprintf(stderr, "graftctl ckpt %s: %s%s%s\n", sub, named ? "" : url, named ? "" : ": ",
            why[0] ? graftctl_text(why, t, sizeof(t)) : graft_status_string(st));
    return GRAFTCTL_FAIL;
}

/* A scratch root for downloads: $TMPDIR/graftctl-s3.XXXXXX. */
static char *scratch_make(void)
{
    const char *tmp = getenv("TMPDIR");
    char *dir = NULL;
    if (asprintf(&dir, "%s/graftctl-s3.XXXXXX", tmp != NULL && tmp[0] ? tmp : "/tmp") < 0)
        return NULL;
    if (mkdtemp(dir) == NULL) {
        fprintf(stderr, "graftctl ckpt: scratch directory %s: %s\n", dir, strerror(errno));
        free(dir);
        return NULL;
    }
    return dir;
}

/* Remove what a download left under the scratch root (flat step-* dirs). */
static void scratch_clear(const char *root, bool remove_root)
{
    DIR *d = opendir(root);
    struct dirent *e;
    while (d != NULL && (e = readdir(d)) != NULL) {
        if (e->d_name[0] == '.' && (e->d_name[1] == '\0' || strcmp(e->d_name, "..") == 0))
            continue;
        char path[4096];
        snprintf(path, sizeof(path), "%s/%s", root, e->d_name);
        DIR *sub = opendir(path);
        struct dirent *f;
        while (sub != NULL && (f = readdir(sub)) != NULL)
            if (f->d_name[0] != '.' || (f->d_name[1] != '\0' && strcmp(f->d_name, "..") != 0))
                (void)unlinkat(dirfd(sub), f->d_name, 0);
        if (sub != NULL)
            closedir(sub);
        if (rmdir(path) != 0)
            (void)unlink(path);
    }
    if (d != NULL)
        closedir(d);
    if (remove_root)
        (void)rmdir(root);
}

static int list(const ckpt_args_t *a, const char *sub, graft_persist_remote_entry_t **e_p,
                size_t *n_p)
{
    graft_persist_remote_config_t rc = remote_config(a);
    char why[512] = "";
    graft_status_t st = graft_persist_remote_entries(&rc, e_p, n_p, why, sizeof(why));
    return st == GRAFT_OK ? GRAFTCTL_OK : store_error(sub, a->root, st, why);
}

/* keep[i] for every entry: retention's plan for the complete ones (the
 * newest always kept); an incomplete one older than the newest complete
 * checkpoint is a leftover that prune removes. */
static int plan(const ckpt_args_t *a, const graft_persist_remote_entry_t *e, size_t n, bool *keep)
{
    uint64_t *steps = calloc(n + 1, sizeof(*steps));
    bool *k = calloc(n + 1, sizeof(*k));
    size_t nc = 0;
    int rc = GRAFTCTL_FAIL;
    if (steps == NULL || k == NULL)
        goto out;
    for (size_t i = 0; i < n; i++)
        if (e[i].complete)
            steps[nc++] = e[i].step;
    graft_persist_retention_t p = {.keep_last = a->policy.keep_last,
                                   .milestone_every = a->policy.milestone_every};
    if (graft_persist_retention_plan(&p, steps, NULL, nc, k) != GRAFT_OK)
        goto out;
    for (size_t i = 0, j = 0; i < n; i++)
        keep[i] = e[i].complete ? k[j++] : nc == 0 || e[i].step > steps[0];
    rc = GRAFTCTL_OK;
out:
    free(steps);
    free(k);
    return rc;
}

static const char *retention_class(const ckpt_args_t *a, const graft_persist_remote_entry_t *e,
                                   bool newest, bool keep)
{
    if (!e->complete)
        return keep ? "in_progress" : "leftover";
    if (newest)
        return "newest";
    if (a->policy.milestone_every > 0 && e->step % a->policy.milestone_every == 0)
        return "milestone";
    return keep ? "kept" : "prunable";
}

static int remote_ls(const graftctl_opts_t *o, const ckpt_args_t *a)
{
    graft_persist_remote_entry_t *e = NULL;
    size_t n = 0;
    int rc = list(a, "ls", &e, &n);
    bool *keep = rc == GRAFTCTL_OK ? calloc(n + 1, sizeof(*keep)) : NULL;
    if (rc == GRAFTCTL_OK && (keep == NULL || plan(a, e, n, keep) != GRAFTCTL_OK)) {
        fprintf(stderr, "graftctl ckpt ls: out of memory\n");
        rc = GRAFTCTL_FAIL;
    }
    if (rc != GRAFTCTL_OK)
        goto out;
    json_t *arr = json_array();
    if (!o->json)
        printf("%-10s %-10s %-8s %s\n", "STEP", "STATE", "OBJECTS", "RETENTION");
    bool seen = false;
    for (size_t i = 0; i < n; i++) {
        bool newest = e[i].complete && !seen;
        seen |= newest;
        const char *cls = retention_class(a, &e[i], newest, keep[i]);
        const char *state = e[i].complete ? "complete" : "incomplete";
        if (o->json)
            json_array_append_new(arr, json_pack("{s:I,s:s,s:I,s:s}", "step", (json_int_t)e[i].step,
                                                 "state", state, "objects",
                                                 (json_int_t)e[i].objects, "retention", cls));
        else
            printf("%-10" PRIu64 " %-10s %-8" PRIu32 " %s\n", e[i].step, state, e[i].objects, cls);
    }
    if (o->json)
        graftctl_print_json(json_pack("{s:s,s:o}", "root", a->root, "checkpoints", arr));
    else
        json_decref(arr);
out:
    free(keep);
    graft_free(e);
    return rc;
}

/* Download step into scratch (verified as a restore does); on success *v
 * is its entry there. why names the object that failed. */
static graft_status_t fetch(const ckpt_args_t *a, const char *scratch, uint64_t step,
                            graft_persist_entry_t *v, char *why, size_t why_len)
{
    graft_persist_remote_config_t rc = remote_config(a);
    scratch_clear(scratch, false);
    graft_status_t st = graft_persist_remote_fetch(&rc, step, scratch,
                                                   a->secret_len > 0 ? a->secret : NULL,
                                                   a->secret_len, why, why_len);
    if (st == GRAFT_OK)
        st = graft_persist_verify(scratch, step, GRAFT_PERSIST_VERIFY_QUICK, v);
    return st;
}

/* Errors of the store or the request, not of one checkpoint. */
static bool store_failed(graft_status_t st)
{
    return st == GRAFT_EINVAL || st == GRAFT_EAUTH || st == GRAFT_ENOMEM ||
           (st == GRAFT_EIO);
}

static int remote_verify(const graftctl_opts_t *o, const ckpt_args_t *a, const char *scratch)
{
    graft_persist_remote_entry_t *e = NULL;
    size_t n = 0, checked = 0, faults = 0;
    int rc = list(a, "verify", &e, &n);
    if (rc != GRAFTCTL_OK)
        return rc;
    json_t *arr = json_array();
    bool found = !a->has_step;
    for (size_t i = 0; i < n && rc == GRAFTCTL_OK; i++) {
        if (a->has_step && e[i].step != a->step)
            continue;
        found = true;
        checked++;
        graft_persist_entry_t v = {.step = e[i].step};
        char why[512] = "", swhy[512] = "";
        graft_status_t st = GRAFT_ENOTFOUND;
        if (!e[i].complete)
            snprintf(why, sizeof(why), "%s/step-%020" PRIu64 "/manifest.pb: missing from the "
                     "store (an upload that did not finish)", a->root, e[i].step);
        else
            st = fetch(a, scratch, e[i].step, &v, why, sizeof(why));
        if (st != GRAFT_OK && store_failed(st)) {
            rc = store_error("verify", a->root, st, why);
            break;
        }
        const char *sidecar = st == GRAFT_OK ? graftctl_ckpt_sidecar(scratch, e[i].step, swhy,
                                                                     sizeof(swhy))
                                             : "unchecked";
        bool bad = st != GRAFT_OK || strcmp(sidecar, "ok") != 0;
        faults += bad;
        char t1[GRAFTCTL_TEXT_LEN], t2[GRAFTCTL_TEXT_LEN];
        if (o->json) {
            json_array_append_new(arr, json_pack("{s:I,s:b,s:s,s:o,s:s,s:o,s:I,s:I,s:b}", "step",
                                                 (json_int_t)e[i].step, "ok", !bad, "status",
                                                 graft_status_name(st), "reason",
                                                 graftctl_json_text(why), "sidecar", sidecar,
                                                 "sidecar_reason", graftctl_json_text(swhy),
                                                 "ranks", (json_int_t)v.ranks, "raw_bytes",
                                                 (json_int_t)v.raw_bytes, "authenticated",
                                                 a->secret_len > 0 && st == GRAFT_OK));
        } else if (!bad) {
            printf("step %" PRIu64 ": ok (every object, every chunk, %" PRIu32 " shards, %" PRIu64
                   " bytes%s)\n",
                   v.step, v.ranks, v.raw_bytes, a->secret_len > 0 ? ", MAC ok" : "");
        } else {
            printf("step %" PRIu64 ": FAILED: %s%s%s\n", e[i].step,
                   graftctl_text(why, t1, sizeof(t1)), why[0] && swhy[0] ? "; " : "",
                   graftctl_text(swhy, t2, sizeof(t2)));
        }
        scratch_clear(scratch, false);
    }
    if (rc == GRAFTCTL_OK && !found) {
        fprintf(stderr, "graftctl ckpt verify: %s has no step-%020" PRIu64 "\n", a->root,
                a->step);
        rc = GRAFTCTL_FAIL;
    }
    if (rc == GRAFTCTL_OK && o->json)
        graftctl_print_json(json_pack("{s:s,s:I,s:I,s:o}", "root", a->root, "checked",
                                      (json_int_t)checked, "faults", (json_int_t)faults,
                                      "checkpoints", arr));
    else
        json_decref(arr);
    if (rc == GRAFTCTL_OK && faults > 0)
        rc = GRAFTCTL_FAIL;
    if (rc == GRAFTCTL_OK && a->secret_len == 0 && !o->json)
        printf("(manifest MACs not checked: give --secret-file to tell a forged checkpoint "
               "from a genuine one)\n");
    graft_free(e);
    return rc;
}

static int remote_inspect(const graftctl_opts_t *o, const ckpt_args_t *a, const char *scratch)
{
    if (!a->has_step) {
        fprintf(stderr, "graftctl ckpt inspect: give the STEP\n");
        return GRAFTCTL_USAGE;
    }
    graft_persist_entry_t v = {.step = a->step};
    char why[512] = "", swhy[512] = "";
    graft_status_t st = fetch(a, scratch, a->step, &v, why, sizeof(why));
    if (st != GRAFT_OK)
        return store_error("inspect", a->root, st, why);
    char *text = NULL;
    st = graft_persist_manifest_json(scratch, a->step, &text);
    if (st != GRAFT_OK)
        return store_error("inspect", a->root, st, "");
    const char *sidecar = graftctl_ckpt_sidecar(scratch, a->step, swhy, sizeof(swhy));
    json_t *m = json_loads(text, 0, NULL);
    graft_free(text);
    if (o->json) {
        graftctl_print_json(json_pack("{s:s,s:o,s:s,s:s,s:o}", "root", a->root, "manifest",
                                      m != NULL ? m : json_null(), "state", "complete", "sidecar",
                                      sidecar, "sidecar_reason", graftctl_json_text(swhy)));
        return GRAFTCTL_OK;
    }
    graftctl_ckpt_inspect_print(m, &v, GRAFT_OK, sidecar, swhy);
    json_decref(m);
    return GRAFTCTL_OK;
}

static int remote_prune(const graftctl_opts_t *o, const ckpt_args_t *a)
{
    if (a->policy.keep_last == 0) {
        fprintf(stderr, "graftctl ckpt prune: give --keep-last N (N >= 1)\n");
        return GRAFTCTL_USAGE;
    }
    if (!a->dry_run && !o->yes) {
        fprintf(stderr, "graftctl ckpt prune: give --yes (delete from %s) or --dry-run\n",
                a->root);
        return GRAFTCTL_USAGE;
    }
    graft_persist_remote_entry_t *e = NULL;
    size_t n = 0, deleted = 0, leftovers = 0;
    int rc = list(a, "prune", &e, &n);
    bool *keep = rc == GRAFTCTL_OK ? calloc(n + 1, sizeof(*keep)) : NULL;
    if (rc == GRAFTCTL_OK && (keep == NULL || plan(a, e, n, keep) != GRAFTCTL_OK)) {
        fprintf(stderr, "graftctl ckpt prune: out of memory\n");
        rc = GRAFTCTL_FAIL;
    }
    if (rc != GRAFTCTL_OK)
        goto out;
    json_t *drop = json_array();
    for (size_t i = 0; i < n; i++)
        if (!keep[i])
            json_array_append_new(drop, json_integer((json_int_t)e[i].step));
    if (!a->dry_run) {
        graft_persist_remote_config_t rcfg = remote_config(a);
        char why[512] = "";
        graft_status_t st = graft_persist_remote_prune(&rcfg, a->policy.keep_last,
                                                       a->policy.milestone_every, &deleted,
                                                       &leftovers, why, sizeof(why));
        if (st != GRAFT_OK)
            rc = store_error("prune", a->root, st, why);
    }
    if (o->json) {
        graftctl_print_json(json_pack("{s:s,s:b,s:o,s:I,s:I}", "root", a->root, "dry_run",
                                      a->dry_run, "drop", drop, "deleted", (json_int_t)deleted,
                                      "leftovers_removed", (json_int_t)leftovers));
    } else {
        size_t i;
        json_t *x;
        printf("%s %zu step prefixes:", a->dry_run ? "would delete" : "planned to delete",
               json_array_size(drop));
        json_array_foreach(drop, i, x)
            printf(" %" JSON_INTEGER_FORMAT, json_integer_value(x));
        printf("\n");
        if (!a->dry_run)
            printf("deleted %zu checkpoints and %zu incomplete uploads (manifest.pb first)\n",
                   deleted, leftovers);
        json_decref(drop);
    }
out:
    free(keep);
    graft_free(e);
    return rc;
}

static int remote_restore(const graftctl_opts_t *o, const ckpt_args_t *a, const char *scratch)
{
    if (!a->dry_run) {
        fprintf(stderr, "graftctl ckpt restore: only --dry-run: the trainer restores its own "
                "state at start-up (graft_persist_remote_restore)\n");
        return GRAFTCTL_USAGE;
    }
    graft_persist_remote_entry_t *e = NULL;
    size_t n = 0;
    int rc = list(a, "restore", &e, &n);
    if (rc != GRAFTCTL_OK)
        return rc;
    json_t *skipped = json_array();
    graft_persist_entry_t v;
    bool chosen = false, asked_seen = false;
    for (size_t i = 0; i < n && !chosen && rc == GRAFTCTL_OK; i++) {
        if (!e[i].complete || (a->has_step && e[i].step != a->step))
            continue;
        asked_seen = true;
        char why[512] = "";
        graft_status_t st = fetch(a, scratch, e[i].step, &v, why, sizeof(why));
        if (st == GRAFT_OK)
            chosen = true;
        else if (store_failed(st))
            rc = store_error("restore", a->root, st, why);
        else
            json_array_append_new(skipped, json_pack("{s:I,s:o}", "step", (json_int_t)e[i].step,
                                                     "reason", graftctl_json_text(why)));
        scratch_clear(scratch, false);
    }
    if (rc == GRAFTCTL_OK && o->json) {
        graftctl_print_json(json_pack("{s:s,s:o,s:O}", "root", a->root, "would_restore",
                                      chosen ? graftctl_ckpt_entry_json(&v) : json_null(),
                                      "skipped", skipped));
    } else if (rc == GRAFTCTL_OK) {
        size_t i;
        json_t *x;
        char reason[GRAFTCTL_TEXT_LEN];
        json_array_foreach(skipped, i, x)
            printf("skip step %" JSON_INTEGER_FORMAT ": %s\n",
                   json_integer_value(json_object_get(x, "step")),
                   graftctl_text(json_string_value(json_object_get(x, "reason")), reason,
                                 sizeof(reason)));
        if (chosen)
            printf("would restore step %" PRIu64 " (%" PRIu32 " ranks, %" PRIu64 " bytes)\n",
                   v.step, v.ranks, v.raw_bytes);
    }
    json_decref(skipped);
    if (rc == GRAFTCTL_OK && !chosen) {
        if (a->has_step && !asked_seen)
            fprintf(stderr, "graftctl ckpt restore: %s has no complete step %" PRIu64 "\n",
                    a->root, a->step);
        else
            fprintf(stderr, "graftctl ckpt restore: no checkpoint in %s verifies\n", a->root);
        rc = GRAFTCTL_FAIL;
    }
    graft_free(e);
    return rc;
}

int graftctl_ckpt_remote(const graftctl_opts_t *o, const char *sub, const ckpt_args_t *a)
{
    if (a->policy.geometric || a->quick) {
        fprintf(stderr, "graftctl ckpt %s: %s is not available on an s3:// ROOT\n", sub,
                a->quick ? "--quick" : "--geometric");
        return GRAFTCTL_USAGE;
    }
    if (strcmp(sub, "ls") == 0)
        return remote_ls(o, a);
    if (strcmp(sub, "prune") == 0)
        return remote_prune(o, a);
    char *scratch = scratch_make();
    if (scratch == NULL)
        return GRAFTCTL_FAIL;
    int rc = strcmp(sub, "verify") == 0    ? remote_verify(o, a, scratch)
             : strcmp(sub, "inspect") == 0 ? remote_inspect(o, a, scratch)
                                           : remote_restore(o, a, scratch);
    scratch_clear(scratch, true);
    free(scratch);
    return rc;
}
