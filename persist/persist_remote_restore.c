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
#include <sys/file.h>
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

/* Delete every object of step (manifest.pb first, when there is one). */
static graft_status_t delete_step(graft__s3_t *s3, char **keys, size_t nkeys, uint64_t step,
                                  char *why, size_t why_len)
{
    char pfx[40];
    snprintf(pfx, sizeof(pfx), "step-%020llu/", (unsigned long long)step);
    char mkey[64];
    snprintf(mkey, sizeof(mkey), "%s" GP_MANIFEST_PB, pfx);
    graft_status_t st = GRAFT_OK;
    /* Manifest first: a half-deleted checkpoint is never listed. */
    for (size_t k = 0; st == GRAFT_OK && k < nkeys; k++)
        if (strcmp(keys[k], mkey) == 0)
            st = graft__s3_delete(s3, mkey, why, why_len);
    for (size_t k = 0; st == GRAFT_OK && k < nkeys; k++)
        if (strncmp(keys[k], pfx, strlen(pfx)) == 0 && strcmp(keys[k], mkey) != 0)
            st = graft__s3_delete(s3, keys[k], why, why_len);
    return st;
}

/* The steps of the step-* prefixes without a manifest.pb that are older
 * than the newest complete checkpoint (an upload given up or canceled:
 * the uploader never goes back to an older step), newest first. */
static size_t leftover_steps(char **keys, size_t nkeys, const uint64_t *complete, size_t ncomplete,
                             uint64_t *out)
{
    size_t n = 0;
    for (size_t i = 0; ncomplete > 0 && i < nkeys; i++) {
        uint64_t step;
        bool manifest;
        if (!key_step(keys[i], &step, &manifest) || step >= complete[0])
            continue;
        bool known = false;
        for (size_t c = 0; c < ncomplete && !known; c++)
            known = complete[c] == step;
        for (size_t k = 0; k < n && !known; k++)
            known = out[k] == step;
        if (!known)
            out[n++] = step;
    }
    qsort(out, n, sizeof(*out), step_desc);
    return n;
}

/* The plan of remote retention: keep[i] for each complete step. */
static graft_status_t retention_keep(const uint64_t *steps, size_t n, uint32_t keep_last,
                                     uint64_t milestone_every, bool *keep)
{
    /* The local tier's plan (graft_persist_retention_plan()): the newest
     * keep_last, and milestones, whatever their age. */
    graft_persist_retention_t policy = {.keep_last = keep_last,
                                        .milestone_every = milestone_every};
    return graft_persist_retention_plan(&policy, steps, NULL, n, keep);
}

graft_status_t graft__persist_remote_retention(graft__s3_t *s3, uint32_t keep_last,
                                               uint64_t milestone_every, size_t *deleted_p,
                                               size_t *leftovers_p, char *why, size_t why_len)
{
    uint64_t *steps = NULL, *left = NULL;
    char **keys = NULL;
    bool *keep = NULL;
    size_t n = 0, nkeys = 0, deleted = 0, nleft = 0, removed = 0;
    graft_status_t st = list_complete(s3, &steps, &n, &keys, &nkeys, why, why_len);
    keep = st == GRAFT_OK ? graft__calloc(n + 1, sizeof(*keep)) : NULL;
    left = st == GRAFT_OK ? graft__calloc(nkeys + 1, sizeof(*left)) : NULL;
    if (st == GRAFT_OK && (keep == NULL || left == NULL)) {
        snprintf(why, why_len, "out of memory");
        st = GRAFT_ENOMEM;
    }
    if (st == GRAFT_OK)
        st = retention_keep(steps, n, keep_last, milestone_every, keep);
    for (size_t i = 0; st == GRAFT_OK && i < n; i++) {
        if (keep[i])
            continue;
        st = delete_step(s3, keys, nkeys, steps[i], why, why_len);
        if (st == GRAFT_OK) {
            deleted++;
            GRAFT_INFO(GRAFT_MOD_PERSIST, "remote retention: deleted step %llu from %s",
                       (unsigned long long)steps[i], s3->url);
        }
    }
    if (st == GRAFT_OK)
        nleft = leftover_steps(keys, nkeys, steps, n, left);
    for (size_t i = 0; st == GRAFT_OK && i < nleft; i++) {
        st = delete_step(s3, keys, nkeys, left[i], why, why_len);
        if (st == GRAFT_OK) {
            removed++;
            GRAFT_INFO(GRAFT_MOD_PERSIST, "remote retention: removed the objects of step %llu "
                       "from %s (an upload that never got its manifest.pb)",
                       (unsigned long long)left[i], s3->url);
        }
    }
    if (st != GRAFT_OK)
        GRAFT_WARN(GRAFT_MOD_PERSIST, "remote retention: %s", why);
    graft_free(steps);
    graft_free(left);
    graft_free(keep);
    graft__s3_keys_free(keys, nkeys);
    if (deleted_p != NULL)
        *deleted_p = deleted;
    if (leftovers_p != NULL)
        *leftovers_p = removed;
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

/* A size not known before the download (one GET). */
#define GP_SIZE_UNKNOWN UINT64_MAX

/* Download one object to dir/name, durably: with its size known (a shard,
 * from the manifest) as ranged, parallel GETs, else with one GET. */
static graft_status_t fetch(graft__s3_t *s3, const char *pfx, const char *dir, const char *name,
                            uint64_t bytes, char *why, size_t why_len)
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
    if (st == GRAFT_OK)
        st = bytes == GP_SIZE_UNKNOWN ? graft__s3_get_file(s3, key, fd, NULL, why, why_len)
                                      : graft__s3_get_ranged(s3, key, fd, bytes, why, why_len);
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
    return st;
}

/* Download manifest.pb into dir and read it (its MAC checked under key). */
static graft_status_t fetch_manifest(graft__s3_t *s3, const char *pfx, const char *dir,
                                     uint64_t step, const graft__persist_key_t *key,
                                     Graft__CheckpointManifest **m_p, char *why, size_t why_len)
{
    char vwhy[400];
    graft_status_t st = fetch(s3, pfx, dir, GP_MANIFEST_PB, GP_SIZE_UNKNOWN, why, why_len);
    if (st == GRAFT_OK) {
        st = graft__manifest_read_keyed(dir, step, key, m_p, vwhy, sizeof(vwhy));
        if (st != GRAFT_OK)
            snprintf(why, why_len, "s3://%s/%s%s%s", s3->bucket, s3->prefix, pfx, vwhy);
    }
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
static graft_status_t install_locked(const char *root, uint64_t step, const char *scratch,
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
        snprintf(why, why_len, "rename %s: %s", scratch, strerror(errno));
        return GRAFT_EIO;
    }
    return graft__persist_fsync_dir(root);
}

/* The lock of root's installs (ranks sharing a root: one installs, the
 * others find it intact and never remove a copy another rank reads). */
static int install_lock(const char *root)
{
    char *path = graft__asprintf("%s/.remote-install.lock", root);
    int fd = path != NULL ? open(path, O_RDWR | O_CREAT | O_NOFOLLOW | O_CLOEXEC, 0600) : -1;
    graft_free(path);
    while (fd >= 0 && flock(fd, LOCK_EX) != 0 && errno == EINTR) {
    }
    return fd;
}

static graft_status_t install(const char *root, uint64_t step, const char *scratch,
                              const char *dir, const graft__persist_key_t *key, char *why,
                              size_t why_len)
{
    int fd = install_lock(root);
    if (fd < 0) {
        snprintf(why, why_len, "%s/.remote-install.lock: %s", root, strerror(errno));
        return GRAFT_EIO;
    }
    graft_status_t st = install_locked(root, step, scratch, dir, key, why, why_len);
    close(fd); /* unlocks */
    return st;
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
        st = fetch_manifest(s3, pfx, scratch, step, key, &m, why, why_len);
    for (size_t i = 0; st == GRAFT_OK && i < m->n_shards; i++)
        st = fetch(s3, pfx, scratch, m->shards[i]->file, m->shards[i]->file_bytes, why, why_len);
    if (st == GRAFT_OK &&
        fetch(s3, pfx, scratch, GP_MANIFEST_JSON, GP_SIZE_UNKNOWN, vwhy, sizeof(vwhy)) != GRAFT_OK)
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

/* Whether shard sh holds a piece of a region this rank restores. */
static bool shard_needed(const Graft__ShardInfo *sh, const graft_persist_restore_params_t *p)
{
    for (size_t i = 0; i < p->nregions; i++) {
        const graft_persist_region_t *t = &p->regions[i];
        bool named = p->names == NULL;
        for (size_t k = 0; !named && k < p->nnames; k++)
            named = p->names[k] != NULL && strcmp(p->names[k], t->name) == 0;
        if (!named || (p->kind_mask != 0 && (p->kind_mask & GRAFT_PERSIST_KIND_BIT(t->kind)) == 0))
            continue;
        uint64_t lo = t->global_bytes ? t->global_offset : 0, hi = lo + t->bytes;
        for (size_t r = 0; r < sh->n_regions; r++) {
            const Graft__ShardRegion *sr = sh->regions[r];
            if (strcmp(sr->name, t->name) == 0 && sr->global_offset < hi &&
                lo < sr->global_offset + sr->bytes)
                return true;
        }
    }
    return false;
}

/* A shard this rank does not read: the store holds it, with its size. */
static graft_status_t shard_present(graft__s3_t *s3, const char *pfx, const Graft__ShardInfo *sh,
                                    char *why, size_t why_len)
{
    char key[300];
    snprintf(key, sizeof(key), "%s%s", pfx, sh->file);
    return graft__s3_size_check(s3, key, sh->file_bytes, why, why_len);
}

/* Without verify_full: download manifest.pb and only the shards holding
 * this rank's regions (ranged, parallel GETs) into a scratch root of this
 * process, verify every chunk of those, check the others are stored with
 * their size, and restore from the scratch root, removed after. */
static graft_status_t restore_own(graft__s3_t *s3, const char *root, uint64_t step,
                                  const graft_persist_restore_params_t *params,
                                  const graft__persist_key_t *key,
                                  graft_persist_restore_result_t *res, char *why, size_t why_len)
{
    char pfx[40], vwhy[400];
    snprintf(pfx, sizeof(pfx), "step-%020llu/", (unsigned long long)step);
    char *sroot = graft__asprintf("%s/.remote-rank-%020llu.%ld", root, (unsigned long long)step,
                                  (long)getpid());
    char *scratch = sroot != NULL ? graft__persist_step_dir(sroot, step) : NULL;
    Graft__CheckpointManifest *m = NULL;
    const Graft__ShardInfo **mine = NULL;
    size_t k = 0;
    graft_status_t st = scratch != NULL ? GRAFT_OK : GRAFT_ENOMEM;
    if (st == GRAFT_OK) {
        scratch_remove(scratch);
        (void)rmdir(sroot);
        if (mkdir(sroot, 0700) != 0 || mkdir(scratch, 0700) != 0) {
            snprintf(why, why_len, "%s: %s", scratch, strerror(errno));
            st = GRAFT_EIO;
        }
    }
    if (st == GRAFT_OK)
        st = fetch_manifest(s3, pfx, scratch, step, key, &m, why, why_len);
    if (st == GRAFT_OK && (mine = graft__calloc(m->n_shards + 1, sizeof(*mine))) == NULL)
        st = GRAFT_ENOMEM;
    for (size_t i = 0; st == GRAFT_OK && i < m->n_shards; i++) {
        const Graft__ShardInfo *sh = m->shards[i];
        if (!shard_needed(sh, params)) {
            st = shard_present(s3, pfx, sh, why, why_len);
            continue;
        }
        mine[k++] = sh;
        st = fetch(s3, pfx, scratch, sh->file, sh->file_bytes, why, why_len);
    }
    if (st == GRAFT_OK) {
        /* Every chunk of the shards read, as a full verification would. */
        Graft__CheckpointManifest sub = *m;
        sub.n_shards = k;
        sub.shards = (Graft__ShardInfo **)mine;
        st = graft__checkpoint_verify(scratch, &sub, true, vwhy, sizeof(vwhy));
        if (st != GRAFT_OK)
            snprintf(why, why_len, "s3://%s/%s%s%s", s3->bucket, s3->prefix, pfx, vwhy);
    }
    if (st == GRAFT_OK) {
        graft_persist_restore_params_t p = *params;
        p.step = step;
        st = graft__persist_restore_read(sroot, &p, res, vwhy, sizeof(vwhy));
        if (st != GRAFT_OK)
            snprintf(why, why_len, "restore from the downloaded shards: %s", vwhy);
    }
    if (scratch != NULL)
        scratch_remove(scratch);
    if (sroot != NULL)
        (void)rmdir(sroot);
    graft_free(mine);
    if (m != NULL)
        graft__manifest_free(m);
    graft_free(scratch);
    graft_free(sroot);
    return st;
}

/* One checkpoint: with verify_full, downloaded whole, verified whole and
 * installed under root (every rank then takes the same checkpoint), else
 * only this rank's shards (restore_own). */
static graft_status_t restore_one(graft__s3_t *s3, const char *root, uint64_t step,
                                  const graft_persist_restore_params_t *params,
                                  graft_persist_restore_result_t *one, char *why, size_t why_len)
{
    graft__persist_key_t key = {params->secret, params->secret_len};
    const graft__persist_key_t *kp = params->secret != NULL ? &key : NULL;
    if (!params->verify_full)
        return restore_own(s3, root, step, params, kp, one, why, why_len);
    graft_status_t st = fetch_checkpoint(s3, root, step, kp, why, why_len);
    if (st != GRAFT_OK)
        return st;
    graft_persist_restore_params_t p = *params;
    p.step = step;
    st = graft_persist_restore(root, &p, one);
    if (st != GRAFT_OK)
        snprintf(why, why_len, "restore from the downloaded copy: %s", graft_status_string(st));
    return st;
}

/* After a failed try: root's copy of step, unless it verifies (another
 * rank sharing the root installed it and may be reading it). */
static graft_status_t remove_unless_intact(const char *root, uint64_t step,
                                           const graft_persist_restore_params_t *params)
{
    graft__persist_key_t key = {params->secret, params->secret_len};
    int fd = install_lock(root);
    if (fd < 0)
        return GRAFT_EIO;
    graft_status_t st = GRAFT_OK;
    if (!local_intact(root, step, params->secret != NULL ? &key : NULL))
        st = step_remove(root, step);
    close(fd);
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
        graft_persist_restore_result_t one = {0};
        st = restore_one(s3, local_root, steps[i], params, &one, why, sizeof(why));
        if (st == GRAFT_OK) {
            one.skipped += res.skipped;
            snprintf(one.skipped_reasons, sizeof(one.skipped_reasons), "%s",
                     res.skipped_reasons);
            res = one;
            goto out;
        }
        if (caller_error(st))
            goto out;
        GRAFT_WARN(GRAFT_MOD_PERSIST, "remote step %llu skipped: %s",
                   (unsigned long long)steps[i], why);
        note_skip(&res, steps[i], why);
        if (params->verify_full && remove_unless_intact(local_root, steps[i], params) != GRAFT_OK)
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

/* ------------------------------------------------------- for the tools --- */

/* The client of a public call, with why pointed at a buffer. */
static graft_status_t open_s3(const graft_persist_remote_config_t *remote, graft__s3_t **s3_p,
                              char **why, size_t *why_len, char *tmp, size_t tmp_len)
{
    if (*why == NULL || *why_len == 0) {
        *why = tmp;
        *why_len = tmp_len;
    }
    (*why)[0] = '\0';
    if (remote == NULL)
        return GRAFT_EINVAL;
    return graft__s3_create(remote, s3_p, *why, *why_len);
}

static int entry_desc(const void *a, const void *b)
{
    return step_desc(&((const graft_persist_remote_entry_t *)a)->step,
                     &((const graft_persist_remote_entry_t *)b)->step);
}

graft_status_t graft_persist_remote_entries(const graft_persist_remote_config_t *remote,
                                            graft_persist_remote_entry_t **entries_p,
                                            size_t *n_p, char *why, size_t why_len)
{
    char tmp[512];
    graft__s3_t *s3 = NULL;
    char **keys = NULL;
    size_t nkeys = 0, n = 0;
    graft_persist_remote_entry_t *e = NULL;
    if (entries_p == NULL || n_p == NULL)
        return GRAFT_EINVAL;
    graft_status_t st = open_s3(remote, &s3, &why, &why_len, tmp, sizeof(tmp));
    if (st == GRAFT_OK)
        st = graft__s3_list(s3, "", &keys, &nkeys, why, why_len);
    e = st == GRAFT_OK ? graft__calloc(nkeys + 1, sizeof(*e)) : NULL;
    if (st == GRAFT_OK && e == NULL)
        st = GRAFT_ENOMEM;
    for (size_t i = 0; st == GRAFT_OK && i < nkeys; i++) {
        uint64_t step;
        bool manifest;
        if (!key_step(keys[i], &step, &manifest))
            continue;
        size_t k = 0;
        while (k < n && e[k].step != step)
            k++;
        if (k == n)
            e[n++].step = step;
        e[k].objects++;
        e[k].complete |= manifest;
    }
    graft__s3_keys_free(keys, nkeys);
    graft__s3_destroy(s3);
    if (st != GRAFT_OK || n == 0) {
        graft_free(e);
        e = NULL;
    }
    if (e != NULL)
        qsort(e, n, sizeof(*e), entry_desc);
    if (st == GRAFT_OK) {
        *entries_p = e;
        *n_p = n;
    }
    return st;
}

graft_status_t graft_persist_remote_fetch(const graft_persist_remote_config_t *remote,
                                          uint64_t step, const char *local_root,
                                          const uint8_t *secret, size_t secret_len, char *why,
                                          size_t why_len)
{
    char tmp[512];
    graft__s3_t *s3 = NULL;
    if (local_root == NULL || (secret != NULL && secret_len == 0))
        return GRAFT_EINVAL;
    graft__persist_key_t key = {secret, secret_len};
    graft_status_t st = open_s3(remote, &s3, &why, &why_len, tmp, sizeof(tmp));
    if (st == GRAFT_OK)
        st = graft__persist_mkdirs(local_root, 0);
    if (st == GRAFT_OK)
        st = fetch_checkpoint(s3, local_root, step, secret != NULL ? &key : NULL, why, why_len);
    if (st != GRAFT_OK && st != GRAFT_EINVAL && step_remove(local_root, step) != GRAFT_OK)
        GRAFT_WARN(GRAFT_MOD_PERSIST, "could not remove step %llu under %s",
                   (unsigned long long)step, local_root);
    graft__s3_destroy(s3);
    return st;
}

graft_status_t graft_persist_remote_prune(const graft_persist_remote_config_t *remote,
                                          uint32_t keep_last, uint64_t milestone_every,
                                          size_t *deleted_p, size_t *leftovers_p, char *why,
                                          size_t why_len)
{
    char tmp[512];
    graft__s3_t *s3 = NULL;
    graft_status_t st = open_s3(remote, &s3, &why, &why_len, tmp, sizeof(tmp));
    if (st == GRAFT_OK)
        st = graft__persist_remote_retention(s3, keep_last, milestone_every, deleted_p,
                                             leftovers_p, why, why_len);
    graft__s3_destroy(s3);
    return st;
}
