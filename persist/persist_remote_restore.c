/*
 * The remote tier's reading side: the bucket's complete checkpoints,
 * remote retention, and restore (download into a scratch directory under
 * the local root, verify every chunk and the manifest's MAC, install the
 * directory whole, then restore from it as from disk).
 */
#include "persist_internal.h"
#include "persist_remote.h"
#include "persist_s3.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static int step_desc(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? 1 : x > y ? -1 : 0;
}

/* The step of a key "step-<20 digits>/<name>", and whether name is the
 * manifest. */
static bool key_step(const char *key, uint64_t *step_p, bool *manifest_p)
{
    const char *slash = strchr(key, '/');
    if (slash == NULL || (size_t)(slash - key) >= 64)
        return false;
    char dir[64];
    snprintf(dir, sizeof(dir), "%.*s", (int)(slash - key), key);
    if (!graft__persist_parse_step_dir(dir, step_p))
        return false;
    *manifest_p = strcmp(slash + 1, GP_MANIFEST_PB) == 0;
    return true;
}

/* Steps with a manifest.pb, newest first; the keys too when keys_p. */
static graft_status_t list_complete(graft__s3_t *s3, uint64_t **steps_p, size_t *n_p,
                                    char ***keys_p, size_t *nkeys_p, char *why, size_t why_len)
{
    char **keys = NULL;
    size_t nkeys = 0;
    graft_status_t st = graft__s3_list(s3, "", &keys, &nkeys, why, why_len);
    if (st != GRAFT_OK)
        return st;
    uint64_t *steps = graft__calloc(nkeys + 1, sizeof(*steps));
    size_t n = 0;
    for (size_t i = 0; steps != NULL && i < nkeys; i++) {
        uint64_t step;
        bool manifest;
        if (key_step(keys[i], &step, &manifest) && manifest)
            steps[n++] = step;
    }
    if (steps == NULL) {
        graft__s3_keys_free(keys, nkeys);
        return GRAFT_ENOMEM;
    }
    qsort(steps, n, sizeof(*steps), step_desc);
    *steps_p = steps;
    *n_p = n;
    if (keys_p != NULL) {
        *keys_p = keys;
        *nkeys_p = nkeys;
    } else {
        graft__s3_keys_free(keys, nkeys);
    }
    return GRAFT_OK;
}

graft_status_t graft_persist_remote_list(const graft_persist_remote_config_t *remote,
                                         uint64_t **steps_p, size_t *n_p, char *why,
                                         size_t why_len)
{
    char tmp[512];
    if (why == NULL || why_len == 0) {
        why = tmp;
        why_len = sizeof(tmp);
    }
    why[0] = '\0';
    if (remote == NULL || steps_p == NULL || n_p == NULL)
        return GRAFT_EINVAL;
    graft__s3_t *s3 = NULL;
    uint64_t *steps = NULL;
    size_t n = 0;
    graft_status_t st = graft__s3_create(remote, &s3, why, why_len);
    if (st == GRAFT_OK)
        st = list_complete(s3, &steps, &n, NULL, NULL, why, why_len);
    graft__s3_destroy(s3);
    if (st != GRAFT_OK)
        return st;
    if (n == 0) {
        graft_free(steps);
        steps = NULL;
    }
    *steps_p = steps;
    *n_p = n;
    return GRAFT_OK;
}

graft_status_t graft__persist_remote_retention(graft__s3_t *s3, uint32_t keep_last,
                                               uint64_t milestone_every, size_t *deleted_p)
{
    char why[512] = "";
    uint64_t *steps = NULL;
    char **keys = NULL;
    bool *keep = NULL;
    size_t n = 0, nkeys = 0, deleted = 0;
    graft_status_t st = list_complete(s3, &steps, &n, &keys, &nkeys, why, sizeof(why));
    /* The local tier's plan (graft_persist_retention_plan()): the newest
     * keep_last, and milestones, whatever their age. */
    graft_persist_retention_t policy = {.keep_last = keep_last,
                                        .milestone_every = milestone_every};
    keep = st == GRAFT_OK ? graft__calloc(n + 1, sizeof(*keep)) : NULL;
    if (st == GRAFT_OK && keep == NULL) {
        snprintf(why, sizeof(why), "out of memory");
        st = GRAFT_ENOMEM;
    }
    if (st == GRAFT_OK)
        st = graft_persist_retention_plan(&policy, steps, NULL, n, keep);
    for (size_t i = 0; st == GRAFT_OK && i < n; i++) {
        if (keep[i])
            continue;
        char pfx[40];
        snprintf(pfx, sizeof(pfx), "step-%020llu/", (unsigned long long)steps[i]);
        char mkey[64];
        snprintf(mkey, sizeof(mkey), "%s" GP_MANIFEST_PB, pfx);
        /* Manifest first: a half-deleted checkpoint is never listed. */
        st = graft__s3_delete(s3, mkey, why, sizeof(why));
        for (size_t k = 0; st == GRAFT_OK && k < nkeys; k++)
            if (strncmp(keys[k], pfx, strlen(pfx)) == 0 && strcmp(keys[k], mkey) != 0)
                st = graft__s3_delete(s3, keys[k], why, sizeof(why));
        if (st == GRAFT_OK) {
            deleted++;
            GRAFT_INFO(GRAFT_MOD_PERSIST, "remote retention: deleted step %llu from %s",
                       (unsigned long long)steps[i], s3->url);
        }
    }
    if (st != GRAFT_OK)
        GRAFT_WARN(GRAFT_MOD_PERSIST, "remote retention: %s", why);
    graft_free(steps);
    graft_free(keep);
    graft__s3_keys_free(keys, nkeys);
    if (deleted_p != NULL)
        *deleted_p = deleted;
    return st;
}

/* ------------------------------------------------------------ restore --- */

/* Remove root's directory of step, if there is one. */
static graft_status_t step_remove(const char *root, uint64_t step)
{
    char *dir = graft__persist_step_dir(root, step);
    struct stat sb;
    graft_status_t st = GRAFT_OK;
    if (dir == NULL)
        return GRAFT_ENOMEM;
    if (lstat(dir, &sb) == 0)
        st = graft__persist_remove_dir(root, step);
    graft_free(dir);
    return st;
}

static void scratch_remove(const char *dir)
{
    DIR *d = opendir(dir);
    if (d == NULL)
        return;
    struct dirent *e;
    while ((e = readdir(d)) != NULL)
        if (strcmp(e->d_name, ".") != 0 && strcmp(e->d_name, "..") != 0)
            (void)unlinkat(dirfd(d), e->d_name, 0);
    closedir(d);
    (void)rmdir(dir);
}

/* Download one object to dir/name, durably; size in *bytes_p. */
static graft_status_t fetch(graft__s3_t *s3, const char *pfx, const char *dir, const char *name,
                            uint64_t *bytes_p, char *why, size_t why_len)
{
    char key[300];
    snprintf(key, sizeof(key), "%s%s", pfx, name);
    char *path = graft__asprintf("%s/%s", dir, name);
    if (path == NULL)
        return GRAFT_ENOMEM;
    graft_status_t st = GRAFT_OK;
    int fd = open(path, O_RDWR | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
    if (fd < 0) {
        snprintf(why, why_len, "%s: %s", path, strerror(errno));
        st = GRAFT_EIO;
    }
    uint64_t bytes = 0;
    if (st == GRAFT_OK)
        st = graft__s3_get_file(s3, key, fd, &bytes, why, why_len);
    if (st == GRAFT_ENOTFOUND)
        snprintf(why, why_len, "s3://%s/%s%s: missing from the store", s3->bucket, s3->prefix,
                 key);
    if (st == GRAFT_OK && fsync(fd) != 0) {
        snprintf(why, why_len, "%s: fsync: %s", path, strerror(errno));
        st = GRAFT_EIO;
    }
    if (fd >= 0)
        close(fd);
    graft_free(path);
    if (st == GRAFT_OK && bytes_p != NULL)
        *bytes_p = bytes;
    return st;
}

/* Whether root already holds step intact (another rank installed it). */
static bool local_intact(const char *root, uint64_t step, const graft__persist_key_t *key)
{
    return graft_persist_verify_mac(root, step, GRAFT_PERSIST_VERIFY_FULL,
                                    key != NULL ? key->bytes : NULL, key != NULL ? key->len : 0,
                                    NULL) == GRAFT_OK;
}

/* Install the verified scratch directory whole, as root's step directory
 * (it appears with its manifest), unless an intact copy is there. */
static graft_status_t install(const char *root, uint64_t step, const char *scratch,
                              const char *dir, const graft__persist_key_t *key, char *why,
                              size_t why_len)
{
    if (local_intact(root, step, key))
        return GRAFT_OK;
    if (step_remove(root, step) != GRAFT_OK) {
        snprintf(why, why_len, "%s: could not remove the local copy", dir);
        return GRAFT_EIO;
    }
    if (rename(scratch, dir) != 0) {
        int err = errno;
        if ((err == ENOTEMPTY || err == EEXIST) && local_intact(root, step, key))
            return GRAFT_OK;
        snprintf(why, why_len, "rename %s: %s", scratch, strerror(err));
        return GRAFT_EIO;
    }
    return graft__persist_fsync_dir(root);
}

/* Download, verify and install one checkpoint under root. */
static graft_status_t fetch_checkpoint(graft__s3_t *s3, const char *root, uint64_t step,
                                       const graft__persist_key_t *key, char *why,
                                       size_t why_len)
{
    char pfx[40];
    snprintf(pfx, sizeof(pfx), "step-%020llu/", (unsigned long long)step);
    /* One scratch directory per process: ranks sharing a root download
     * side by side, and the first one installed is used by all. */
    char *scratch = graft__asprintf("%s/.remote-step-%020llu.%ld", root, (unsigned long long)step,
                                    (long)getpid());
    char *dir = graft__persist_step_dir(root, step);
    Graft__CheckpointManifest *m = NULL;
    char vwhy[400];
    graft_status_t st = scratch != NULL && dir != NULL ? GRAFT_OK : GRAFT_ENOMEM;
    if (st == GRAFT_OK && local_intact(root, step, key))
        goto out; /* another rank sharing the root installed it */
    if (st == GRAFT_OK) {
        scratch_remove(scratch);
        if (mkdir(scratch, 0700) != 0) {
            snprintf(why, why_len, "%s: %s", scratch, strerror(errno));
            st = GRAFT_EIO;
        }
    }
    if (st == GRAFT_OK)
        st = fetch(s3, pfx, scratch, GP_MANIFEST_PB, NULL, why, why_len);
    if (st == GRAFT_OK) {
        st = graft__manifest_read_keyed(scratch, step, key, &m, vwhy, sizeof(vwhy));
        if (st != GRAFT_OK)
            snprintf(why, why_len, "s3://%s/%s%s%s", s3->bucket, s3->prefix, pfx, vwhy);
    }
    for (size_t i = 0; st == GRAFT_OK && i < m->n_shards; i++) {
        uint64_t bytes = 0;
        st = fetch(s3, pfx, scratch, m->shards[i]->file, &bytes, why, why_len);
        if (st == GRAFT_OK && bytes != m->shards[i]->file_bytes) {
            snprintf(why, why_len, "s3://%s/%s%s%s: %llu bytes, the manifest says %llu",
                     s3->bucket, s3->prefix, pfx, m->shards[i]->file,
                     (unsigned long long)bytes, (unsigned long long)m->shards[i]->file_bytes);
            st = GRAFT_ETRUNCATED;
        }
    }
    if (st == GRAFT_OK && fetch(s3, pfx, scratch, GP_MANIFEST_JSON, NULL, vwhy, sizeof(vwhy)) !=
                              GRAFT_OK)
        GRAFT_WARN(GRAFT_MOD_PERSIST, "%s (restoring without the JSON sidecar)", vwhy);
    if (st == GRAFT_OK) {
        st = graft__checkpoint_verify(scratch, m, true, vwhy, sizeof(vwhy));
        if (st != GRAFT_OK)
            snprintf(why, why_len, "s3://%s/%s%s%s", s3->bucket, s3->prefix, pfx, vwhy);
    }
    if (st == GRAFT_OK)
        st = install(root, step, scratch, dir, key, why, why_len);
    if (scratch != NULL)
        scratch_remove(scratch);
out:
    if (m != NULL)
        graft__manifest_free(m);
    graft_free(scratch);
    graft_free(dir);
    return st;
}

/* Errors of the caller's request, not of a checkpoint: no fallback. */
static bool caller_error(graft_status_t st)
{
    return st == GRAFT_ELAYOUT || st == GRAFT_EINVAL || st == GRAFT_ENOTSUP ||
           st == GRAFT_ENOMEM || st == GRAFT_EAUTH || st == GRAFT_ECANCELED;
}

static void note_skip(graft_persist_restore_result_t *res, uint64_t step, const char *why)
{
    size_t used = strlen(res->skipped_reasons);
    snprintf(res->skipped_reasons + used, sizeof(res->skipped_reasons) - used, "step %llu: %s\n",
             (unsigned long long)step, why);
    res->skipped++;
}

graft_status_t graft_persist_remote_restore(const graft_persist_remote_config_t *remote,
                                            const char *local_root,
                                            const graft_persist_restore_params_t *params,
                                            graft_persist_restore_result_t *result_p)
{
    if (remote == NULL || local_root == NULL || params == NULL)
        return GRAFT_EINVAL;
    char why[512] = "";
    graft__s3_t *s3 = NULL;
    uint64_t *steps = NULL;
    size_t n = 0;
    graft_persist_restore_result_t res = {0};
    graft__persist_key_t key = {params->secret, params->secret_len};
    graft_status_t st = graft__s3_create(remote, &s3, why, sizeof(why));
    if (st == GRAFT_OK)
        st = graft__persist_mkdirs(local_root, 0);
    if (st == GRAFT_OK)
        st = list_complete(s3, &steps, &n, NULL, NULL, why, sizeof(why));
    if (st != GRAFT_OK) {
        GRAFT_ERROR(GRAFT_MOD_PERSIST, "restore from the remote tier: %s", why);
        goto out;
    }
    st = GRAFT_ENOCHECKPOINT;
    for (size_t i = 0; i < n; i++) {
        if (params->step != 0 && steps[i] != params->step)
            continue;
        st = fetch_checkpoint(s3, local_root, steps[i], params->secret != NULL ? &key : NULL,
                              why, sizeof(why));
        if (st == GRAFT_OK) {
            graft_persist_restore_params_t p = *params;
            graft_persist_restore_result_t one = {0};
            p.step = steps[i];
            st = graft_persist_restore(local_root, &p, &one);
            if (st == GRAFT_OK) {
                one.skipped += res.skipped;
                snprintf(one.skipped_reasons, sizeof(one.skipped_reasons), "%s",
                         res.skipped_reasons);
                res = one;
                goto out;
            }
            snprintf(why, sizeof(why), "restore from the downloaded copy: %s",
                     graft_status_string(st));
        }
        if (caller_error(st))
            goto out;
        GRAFT_WARN(GRAFT_MOD_PERSIST, "remote step %llu skipped: %s",
                   (unsigned long long)steps[i], why);
        note_skip(&res, steps[i], why);
        if (step_remove(local_root, steps[i]) != GRAFT_OK)
            GRAFT_WARN(GRAFT_MOD_PERSIST, "could not remove step %llu under %s",
                       (unsigned long long)steps[i], local_root);
        if (params->step != 0)
            goto out;
        st = GRAFT_ENOCHECKPOINT;
    }
    if (params->step != 0 && st == GRAFT_ENOCHECKPOINT)
        GRAFT_ERROR(GRAFT_MOD_PERSIST, "step %llu: no complete checkpoint in %s",
                    (unsigned long long)params->step, s3->url);
out:
    graft_free(steps);
    graft__s3_destroy(s3);
    if (result_p != NULL)
        *result_p = res;
    return st;
}
