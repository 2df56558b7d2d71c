/*
 * The reader: list, verify and restore. Restore maps each of the caller's
 * regions (in the new layout) onto the pieces the manifest records for the
 * old one and copies the byte-range intersections, so the number of ranks
 * may change between save and restore. A checkpoint that fails anywhere is
 * reported and the next older one is tried; nothing is trusted before the
 * manifest, the shard headers, indexes and footers and every chunk read
 * have been checked.
 */
#include "persist_internal.h"

#include <dirent.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int cmp_desc(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x > y ? -1 : x < y;
}

/* Steps of the checkpoint directories under root, newest first. */
static graft_status_t scan(const char *root, uint64_t **steps_p, size_t *n_p)
{
    *steps_p = NULL;
    *n_p = 0;
    DIR *d = opendir(root);
    if (d == NULL) {
        if (errno == ENOENT)
            return GRAFT_OK;
        GRAFT_ERROR(GRAFT_MOD_PERSIST, "opendir %s: %s", root, strerror(errno));
        return GRAFT_ESYS;
    }
    graft_status_t st = GRAFT_OK;
    uint64_t *steps = NULL;
    size_t n = 0, cap = 0;
    struct dirent *de;
    while ((de = readdir(d)) != NULL) {
        uint64_t step;
        if (!graft__persist_parse_step_dir(de->d_name, &step))
            continue;
        if (n == cap) {
            size_t nc = cap ? cap * 2 : 16;
            uint64_t *p = graft__realloc(steps, nc * sizeof(*steps));
            if (p == NULL) {
                st = GRAFT_ENOMEM;
                break;
            }
            steps = p;
            cap = nc;
        }
        steps[n++] = step;
    }
    closedir(d);
    if (st != GRAFT_OK) {
        graft_free(steps);
        return st;
    }
    if (n > 1)
        qsort(steps, n, sizeof(*steps), cmp_desc);
    *steps_p = steps;
    *n_p = n;
    return GRAFT_OK;
}

static graft_status_t check_one(const char *root, uint64_t step, bool full,
                                const graft__persist_key_t *key, graft_persist_entry_t *e)
{
    char why[256] = "";
    Graft__CheckpointManifest *m = NULL;
    memset(e, 0, sizeof(*e));
    e->step = step;
    char *dir = graft__persist_step_dir(root, step);
    if (dir == NULL)
        return GRAFT_ENOMEM;
    graft_status_t st = graft__manifest_read_keyed(dir, step, key, &m, why, sizeof(why));
    if (st == GRAFT_OK) {
        e->ranks = m->ranks;
        e->raw_bytes = m->raw_bytes;
        e->unix_ms = m->unix_ms;
        e->before_config_change = m->before_config_change;
        st = graft__checkpoint_verify(dir, m, full, why, sizeof(why));
    }
    e->status = st;
    if (st == GRAFT_OK)
        e->state = GRAFT_PERSIST_COMPLETE;
    else if (st == GRAFT_ENOTFOUND)
        e->state = GRAFT_PERSIST_INCOMPLETE;
    else
        e->state = GRAFT_PERSIST_CORRUPT;
    if (st == GRAFT_ENOTFOUND)
        snprintf(e->reason, sizeof(e->reason), "step-%020llu: no manifest (never committed)",
                 (unsigned long long)step);
    else if (st != GRAFT_OK)
        snprintf(e->reason, sizeof(e->reason), "step-%020llu/%.200s", (unsigned long long)step,
                 why);
    graft__manifest_free(m);
    graft_free(dir);
    return st == GRAFT_ENOMEM ? GRAFT_ENOMEM : GRAFT_OK;
}

graft_status_t graft_persist_list(const char *root, graft_persist_entry_t **entries_p, size_t *n_p)
{
    if (root == NULL || entries_p == NULL || n_p == NULL)
        return GRAFT_EINVAL;
    uint64_t *steps;
    size_t n;
    graft_status_t st = scan(root, &steps, &n);
    if (st != GRAFT_OK)
        return st;
    graft_persist_entry_t *e = NULL;
    if (n > 0) {
        e = graft__calloc(n, sizeof(*e));
        if (e == NULL)
            st = GRAFT_ENOMEM;
    }
    for (size_t i = 0; i < n && st == GRAFT_OK; i++)
        st = check_one(root, steps[i], false, NULL, &e[i]);
    graft_free(steps);
    if (st != GRAFT_OK) {
        graft_free(e);
        return st;
    }
    *entries_p = e;
    *n_p = n;
    return GRAFT_OK;
}

graft_status_t graft_persist_verify(const char *root, uint64_t step,
                                    graft_persist_verify_level_t level,
                                    graft_persist_entry_t *entry_p)
{
    return graft_persist_verify_mac(root, step, level, NULL, 0, entry_p);
}

graft_status_t graft_persist_verify_mac(const char *root, uint64_t step,
                                        graft_persist_verify_level_t level, const uint8_t *secret,
                                        size_t secret_len, graft_persist_entry_t *entry_p)
{
    graft__persist_key_t key = {secret, secret_len};
    if (root == NULL ||
        (secret != NULL && (secret_len == 0 || secret_len > GRAFT_PERSIST_SECRET_MAX_BYTES)))
        return GRAFT_EINVAL;
    graft_persist_entry_t e;
    graft_status_t st = check_one(root, step, level == GRAFT_PERSIST_VERIFY_FULL,
                                  secret != NULL ? &key : NULL, &e);
    if (st != GRAFT_OK)
        return st;
    if (entry_p != NULL)
        *entry_p = e;
    return e.status;
}

/* ------------------------------------------------------------ restore --- */

typedef struct restore_ctx {
    const char *dir;
    const Graft__CheckpointManifest *m;
    const graft_persist_restore_params_t *p;
    graft__shard_t **open; /* per manifest shard index */
    uint8_t *bounce;       /* host staging for device regions */
    uint64_t done;
    uint64_t total;
    char why[256];
} restore_ctx_t;

static bool selected(const graft_persist_restore_params_t *p, const graft_persist_region_t *r)
{
    if (p->kind_mask != 0 && (p->kind_mask & GRAFT_PERSIST_KIND_BIT(r->kind)) == 0)
        return false;
    if (p->names == NULL)
        return true;
    for (size_t i = 0; i < p->nnames; i++)
        if (p->names[i] != NULL && strcmp(p->names[i], r->name) == 0)
            return true;
    return false;
}

static graft_status_t shard_get(restore_ctx_t *c, size_t s, graft__shard_t **f_p)
{
    if (c->open[s] != NULL) {
        *f_p = c->open[s];
        return GRAFT_OK;
    }
    const Graft__ShardInfo *sh = c->m->shards[s];
    char *path = graft__asprintf("%s/%s", c->dir, sh->file);
    if (path == NULL)
        return GRAFT_ENOMEM;
    graft__shard_t *f = NULL;
    graft_status_t st = graft__shard_open(path, &f, c->why, sizeof(c->why));
    graft_free(path);
    if (st == GRAFT_ENOTFOUND)
        st = GRAFT_ETRUNCATED;
    if (st != GRAFT_OK)
        return st;
    if (f->file_bytes != sh->file_bytes || f->footer.footer_hash != sh->file_hash ||
        f->header.step != c->m->step || f->header.rank != sh->rank ||
        f->header.raw_bytes != sh->raw_bytes) {
        snprintf(c->why, sizeof(c->why), "%s: does not match the manifest", sh->file);
        graft__shard_close(f);
        return GRAFT_ECORRUPT;
    }
    c->open[s] = f;
    *f_p = f;
    return GRAFT_OK;
}

/* Copy [lo, hi) of the region's global range from shard piece sr. */
static graft_status_t copy_piece(restore_ctx_t *c, size_t s, const Graft__ShardRegion *sr,
                                 const graft_persist_region_t *t, uint64_t toff, uint64_t lo,
                                 uint64_t hi)
{
    graft__shard_t *f;
    graft_status_t st = shard_get(c, s, &f);
    if (st != GRAFT_OK)
        return st;
    /* Progress in steps of at most 16 MiB so a caller sees big regions move. */
    const uint64_t step = 16ull << 20;
    for (uint64_t a = lo; a < hi; a += GRAFT_MIN(step, hi - a)) {
        uint64_t len = GRAFT_MIN(step, hi - a);
        uint64_t src = sr->offset_in_shard + (a - sr->global_offset);
        uint8_t *dst = (uint8_t *)t->ptr + (a - toff);
        if (t->device == GRAFT_PERSIST_DEVICE_CUDA) {
            if (c->bounce == NULL && (c->bounce = graft__malloc((size_t)step)) == NULL)
                return GRAFT_ENOMEM;
            st = graft__shard_read(f, src, c->bounce, len, c->why, sizeof(c->why));
            if (st == GRAFT_OK)
                st = graft__cuda_copy(dst, c->bounce, len, true);
        } else {
            st = graft__shard_read(f, src, dst, len, c->why, sizeof(c->why));
        }
        if (st != GRAFT_OK)
            return st;
        c->done += len;
        if (c->p->progress_fn != NULL)
            c->p->progress_fn(c->p->progress_arg, c->done, c->total);
    }
    return GRAFT_OK;
}

static graft_status_t restore_region(restore_ctx_t *c, const graft_persist_region_t *t)
{
    const Graft__CheckpointManifest *m = c->m;
    uint64_t gsize = t->global_bytes ? t->global_bytes : t->bytes;
    uint64_t toff = t->global_bytes ? t->global_offset : 0;
    size_t gi = 0;
    while (gi < m->n_regions && strcmp(m->regions[gi]->region->name, t->name) != 0)
        gi++;
    if (gi == m->n_regions) {
        snprintf(c->why, sizeof(c->why), "region %s is not in the checkpoint", t->name);
        return GRAFT_ELAYOUT;
    }
    const Graft__RegionDesc *g = m->regions[gi]->region;
    if ((uint32_t)g->kind != (uint32_t)t->kind || g->dtype != t->dtype || g->bytes != gsize) {
        snprintf(c->why, sizeof(c->why),
                 "region %s: checkpoint has kind %d dtype %u size %llu, caller %d %u %llu", t->name,
                 (int)g->kind, g->dtype, (unsigned long long)g->bytes, (int)t->kind, t->dtype,
                 (unsigned long long)gsize);
        return GRAFT_ELAYOUT;
    }
    uint64_t thi = toff + t->bytes;
    for (size_t s = 0; s < m->n_shards; s++)
        for (size_t r = 0; r < m->shards[s]->n_regions; r++) {
            const Graft__ShardRegion *sr = m->shards[s]->regions[r];
            if (strcmp(sr->name, t->name) != 0)
                continue;
            uint64_t lo = GRAFT_MAX(toff, sr->global_offset);
            uint64_t hi = GRAFT_MIN(thi, sr->global_offset + sr->bytes);
            if (lo >= hi)
                continue;
            graft_status_t st = copy_piece(c, s, sr, t, toff, lo, hi);
            if (st != GRAFT_OK)
                return st;
        }
    return GRAFT_OK;
}

static graft_status_t restore_step(const char *root, uint64_t step,
                                   const graft_persist_restore_params_t *p, bool upfront,
                                   graft_persist_restore_result_t *res, char *why, size_t why_len)
{
    graft_status_t st;
    Graft__CheckpointManifest *m = NULL;
    restore_ctx_t c;
    memset(&c, 0, sizeof(c));
    char *dir = graft__persist_step_dir(root, step);
    if (dir == NULL)
        return GRAFT_ENOMEM;
    graft__persist_key_t key = {p->secret, p->secret_len};
    st = graft__manifest_read_keyed(dir, step, p->secret != NULL ? &key : NULL, &m, c.why,
                                    sizeof(c.why));
    if (st != GRAFT_OK)
        goto out;
    /* Quick (or full) verification of every shard first, so a checkpoint
     * with a missing or damaged shard is rejected before any byte lands. */
    if (upfront)
        st = graft__checkpoint_verify(dir, m, p->verify_full, c.why, sizeof(c.why));
    if (st != GRAFT_OK)
        goto out;
    c.dir = dir;
    c.m = m;
    c.p = p;
    c.open = graft__calloc(m->n_shards, sizeof(*c.open));
    if (c.open == NULL) {
        st = GRAFT_ENOMEM;
        goto out;
    }
    for (size_t i = 0; i < p->nregions; i++)
        if (selected(p, &p->regions[i]))
            c.total += p->regions[i].bytes;
    for (size_t i = 0; i < p->nregions && st == GRAFT_OK; i++)
        if (selected(p, &p->regions[i]))
            st = restore_region(&c, &p->regions[i]);
    if (st != GRAFT_OK)
        goto out;
    if (p->fingerprint_fn != NULL && m->has_fingerprint) {
        uint64_t fp = 0;
        st = p->fingerprint_fn(p->fingerprint_arg, &fp);
        if (st == GRAFT_OK && fp != m->fingerprint) {
            snprintf(c.why, sizeof(c.why), "output fingerprint %016llx, manifest has %016llx",
                     (unsigned long long)fp, (unsigned long long)m->fingerprint);
            st = GRAFT_EHASH;
        } else if (st != GRAFT_OK) {
            snprintf(c.why, sizeof(c.why), "fingerprint function failed: %s",
                     graft_status_string(st));
        }
        if (st != GRAFT_OK)
            goto out;
    }
    res->step = step;
    res->bytes = c.done;
    res->has_fingerprint = m->has_fingerprint;
    res->fingerprint = m->fingerprint;
out:
    if (st != GRAFT_OK)
        snprintf(why, why_len, "step-%020llu/%.200s", (unsigned long long)step, c.why);
    for (size_t s = 0; c.open != NULL && s < m->n_shards; s++)
        graft__shard_close(c.open[s]);
    graft_free(c.open);
    graft_free(c.bounce);
    graft__manifest_free(m);
    graft_free(dir);
    return st;
}

graft_status_t graft__persist_restore_read(const char *root,
                                           const graft_persist_restore_params_t *p,
                                           graft_persist_restore_result_t *res, char *why,
                                           size_t why_len)
{
    return restore_step(root, p->step, p, false, res, why, why_len);
}

static graft_status_t params_check(const graft_persist_restore_params_t *p)
{
    if (p->ranks == 0 || p->rank >= p->ranks || (p->nregions > 0 && p->regions == NULL) ||
        (p->nnames > 0 && p->names == NULL) ||
        (p->secret != NULL && (p->secret_len == 0 || p->secret_len > GRAFT_PERSIST_SECRET_MAX_BYTES)))
        return GRAFT_EINVAL;
    bool device = false;
    for (size_t i = 0; i < p->nregions; i++) {
        const graft_persist_region_t *r = &p->regions[i];
        uint64_t gsize = r->global_bytes ? r->global_bytes : r->bytes;
        uint64_t goff = r->global_bytes ? r->global_offset : 0;
        if (r->name == NULL || (r->ptr == NULL && r->bytes > 0) || goff > gsize ||
            r->bytes > gsize - goff)
            return GRAFT_EINVAL;
        device |= r->device == GRAFT_PERSIST_DEVICE_CUDA && selected(p, r);
    }
    return device ? graft__cuda_usable() : GRAFT_OK;
}

graft_status_t graft_persist_restore(const char *root, const graft_persist_restore_params_t *params,
                                     graft_persist_restore_result_t *result_p)
{
    if (root == NULL || params == NULL)
        return GRAFT_EINVAL;
    graft_status_t st = params_check(params);
    if (st != GRAFT_OK)
        return st;
    graft_persist_restore_result_t res;
    memset(&res, 0, sizeof(res));
    char why[256];
    if (params->step != 0) {
        st = restore_step(root, params->step, params, true, &res, why, sizeof(why));
        if (st != GRAFT_OK)
            GRAFT_ERROR(GRAFT_MOD_PERSIST, "restore: %s", why);
        goto out;
    }
    uint64_t *steps;
    size_t n;
    st = scan(root, &steps, &n);
    if (st != GRAFT_OK)
        return st;
    bool all_layout = n > 0;
    st = GRAFT_ENOCHECKPOINT;
    for (size_t i = 0; i < n; i++) {
        graft_status_t s1 = restore_step(root, steps[i], params, true, &res, why, sizeof(why));
        if (s1 == GRAFT_OK) {
            st = GRAFT_OK;
            break;
        }
        if (s1 == GRAFT_ENOMEM || s1 == GRAFT_ENOTSUP) {
            st = s1;
            break;
        }
        all_layout &= s1 == GRAFT_ELAYOUT;
        /* A directory without a manifest was never a checkpoint: not worth
         * a warning, but still listed among the skipped. */
        if (s1 != GRAFT_ENOTFOUND)
            GRAFT_WARN(GRAFT_MOD_PERSIST, "restore: skipping %s (%s)", why, graft_status_name(s1));
        res.skipped++;
        size_t used = strlen(res.skipped_reasons);
        if (used + 1 < sizeof(res.skipped_reasons))
            snprintf(res.skipped_reasons + used, sizeof(res.skipped_reasons) - used, "%s: %s\n",
                     graft_status_name(s1), why);
    }
    graft_free(steps);
    if (st == GRAFT_ENOCHECKPOINT && all_layout)
        st = GRAFT_ELAYOUT;
    if (st == GRAFT_ENOCHECKPOINT)
        GRAFT_ERROR(GRAFT_MOD_PERSIST, "restore: no checkpoint under %s verifies", root);
out:
    if (result_p != NULL)
        *result_p = res;
    return st;
}
