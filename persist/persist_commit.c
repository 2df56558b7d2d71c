/*
 * Committing a checkpoint: graft_persist_commit() checks the ranks' shard
 * records against each other and the files, then writes the manifest (the
 * commit point). The writer's background thread commits a single-process
 * checkpoint here too (a commit job): it gathers the shard records its
 * shard jobs left, commits, applies retention and copies the checkpoint to
 * the second tier.
 */
#include "persist_internal.h"
#include "persist_remote.h"

#include <stdlib.h>
#include <string.h>

static int cmp_rank(const void *a, const void *b)
{
    const Graft__ShardInfo *x = *(Graft__ShardInfo *const *)a;
    const Graft__ShardInfo *y = *(Graft__ShardInfo *const *)b;
    return x->rank < y->rank ? -1 : x->rank > y->rank;
}

/* The global table: every region in the order ranks list them; ranks must
 * agree on each region's kind, dtype, device and global size. */
static graft_status_t global_regions(Graft__ShardInfo **sh, uint32_t ranks,
                                     Graft__GlobalRegion ***out_p, size_t *n_p)
{
    size_t cap = 0;
    for (uint32_t r = 0; r < ranks; r++)
        cap += sh[r]->n_global_regions;
    Graft__GlobalRegion **out = graft__calloc(cap + 1, sizeof(*out));
    if (out == NULL)
        return GRAFT_ENOMEM;
    size_t n = 0;
    for (uint32_t r = 0; r < ranks; r++)
        for (size_t i = 0; i < sh[r]->n_global_regions; i++) {
            Graft__GlobalRegion *g = sh[r]->global_regions[i];
            if (g->region == NULL || g->region->name == NULL) {
                graft_free(out);
                return GRAFT_EPROTO;
            }
            size_t k = 0;
            while (k < n && strcmp(out[k]->region->name, g->region->name) != 0)
                k++;
            if (k == n) {
                out[n++] = g;
                continue;
            }
            const Graft__RegionDesc *a = out[k]->region, *b = g->region;
            if (a->kind != b->kind || a->dtype != b->dtype || a->bytes != b->bytes ||
                a->device != b->device) {
                GRAFT_ERROR(GRAFT_MOD_PERSIST, "commit: ranks disagree on region %s", a->name);
                graft_free(out);
                return GRAFT_ELAYOUT;
            }
        }
    *out_p = out;
    *n_p = n;
    return GRAFT_OK;
}

graft_status_t graft_persist_commit(const char *root, uint64_t step, uint32_t ranks,
                                    const uint8_t *const *infos, const size_t *lens,
                                    const char *code_revision,
                                    const graft_persist_commit_opts_t *opts)
{
    graft_status_t st = GRAFT_OK;
    char why[256] = "";
    char *dir = NULL;
    Graft__ShardInfo **sh = NULL;
    size_t *saved_ng = NULL;
    Graft__GlobalRegion **globals = NULL;
    size_t nglobals = 0;
    graft__pdir_t d = {.fd = -1};
    graft__persist_key_t key = {0};
    if (root == NULL || ranks == 0 || ranks > GP_MAX_RANKS || infos == NULL || lens == NULL ||
        (opts != NULL && !graft__persist_mode_valid(opts->file_mode)) ||
        (opts != NULL && opts->secret != NULL &&
         (opts->secret_len == 0 || opts->secret_len > GRAFT_PERSIST_SECRET_MAX_BYTES)))
        return GRAFT_EINVAL;
    key.bytes = opts != NULL ? opts->secret : NULL;
    key.len = opts != NULL ? opts->secret_len : 0;
    sh = graft__calloc(ranks, sizeof(*sh));
    saved_ng = graft__calloc(ranks, sizeof(*saved_ng));
    dir = graft__persist_step_dir(root, step);
    if (sh == NULL || saved_ng == NULL || dir == NULL) {
        st = GRAFT_ENOMEM;
        goto out;
    }
    for (uint32_t r = 0; r < ranks; r++) {
        if (infos[r] == NULL) {
            st = GRAFT_EINVAL;
            goto out;
        }
        sh[r] = graft__shard_info__unpack(&graft__pb_allocator, lens[r], infos[r]);
        if (sh[r] == NULL || sh[r]->version != 1 || sh[r]->step != step || sh[r]->ranks != ranks) {
            GRAFT_ERROR(GRAFT_MOD_PERSIST,
                        "commit step %llu: shard record %u is malformed or for another "
                        "checkpoint",
                        (unsigned long long)step, r);
            st = GRAFT_EPROTO;
            goto out;
        }
        saved_ng[r] = sh[r]->n_global_regions;
    }
    qsort(sh, ranks, sizeof(*sh), cmp_rank);
    for (uint32_t r = 0; r < ranks; r++)
        if (sh[r]->rank != r) {
            GRAFT_ERROR(GRAFT_MOD_PERSIST, "commit step %llu: no record for rank %u",
                        (unsigned long long)step, r);
            st = GRAFT_EPROTO;
            goto out;
        }
    for (uint32_t r = 0; r < ranks; r++)
        saved_ng[r] = sh[r]->n_global_regions;
    st = global_regions(sh, ranks, &globals, &nglobals);
    if (st != GRAFT_OK)
        goto out;
    Graft__CheckpointManifest m = GRAFT__CHECKPOINT_MANIFEST__INIT;
    m.version = 1;
    m.format_version = GRAFT_PERSIST_FORMAT_VERSION;
    m.step = step;
    m.unix_ms = graft__wall_ns() / 1000000u;
    m.library_version = (char *)graft_version_string();
    m.code_revision = (char *)(code_revision ? code_revision : "");
    m.ranks = ranks;
    m.n_regions = nglobals;
    m.regions = globals;
    m.n_shards = ranks;
    m.shards = sh;
    if (opts != NULL) {
        m.has_fingerprint = opts->has_fingerprint;
        m.fingerprint = opts->has_fingerprint ? opts->fingerprint : 0;
        m.before_config_change = opts->before_config_change;
    }
    m.compression_level = sh[0]->compression_level;
    for (uint32_t r = 0; r < ranks; r++) {
        m.raw_bytes += sh[r]->raw_bytes;
        m.stored_bytes += sh[r]->stored_bytes;
    }
    m.layout_hash = graft__persist_global_hash(&m);
    /* The per-rank global views are folded into m.regions; keep them out of
     * the manifest (restored before freeing). */
    for (uint32_t r = 0; r < ranks; r++)
        sh[r]->n_global_regions = 0;
    st = graft__manifest_check(&m, why, sizeof(why));
    if (st != GRAFT_OK) {
        GRAFT_ERROR(GRAFT_MOD_PERSIST, "commit step %llu: %s", (unsigned long long)step, why);
        st = st == GRAFT_ECORRUPT ? GRAFT_ELAYOUT : st;
        goto out_restore;
    }
    if (graft__persist_manifest_exists(root, step)) {
        GRAFT_ERROR(GRAFT_MOD_PERSIST,
                    "commit: step %llu already has a manifest", (unsigned long long)step);
        st = GRAFT_EEXIST;
        goto out_restore;
    }
    /* Shards must be durable and exactly what their records describe. */
    st = graft__checkpoint_verify(dir, &m, false, why, sizeof(why));
    if (st != GRAFT_OK) {
        GRAFT_ERROR(GRAFT_MOD_PERSIST, "commit step %llu: %s", (unsigned long long)step, why);
        st = GRAFT_ECORRUPT;
        goto out_restore;
    }
    st = graft__persist_dir_open(root, step, false, 0, &d);
    if (st == GRAFT_OK)
        st = graft__manifest_write(&d, &m, key.bytes != NULL ? &key : NULL,
                                   opts != NULL ? opts->file_mode : 0);
out_restore:
    for (uint32_t r = 0; r < ranks; r++)
        sh[r]->n_global_regions = saved_ng[r];
out:
    if (sh != NULL)
        for (uint32_t r = 0; r < ranks; r++)
            if (sh[r] != NULL)
                graft__shard_info__free_unpacked(sh[r], &graft__pb_allocator);
    graft_free(globals);
    graft_free(sh);
    graft_free(saved_ng);
    graft_free(dir);
    graft__persist_dir_close(&d);
    return st;
}
/* --------------------------------------------------------- commit job --- */

void graft__persist_shard_rec_add(graft_persist_writer_t *w, uint64_t step, uint32_t rank,
                          graft_status_t status, uint8_t *info, size_t len)
{
    gp_shard_rec_t *rec = graft__calloc(1, sizeof(*rec));
    pthread_mutex_lock(&w->mu);
    if (rec != NULL) {
        rec->step = step;
        rec->rank = rank;
        rec->status = status;
        rec->info = info;
        rec->len = len;
        rec->next = w->shards;
        w->shards = rec;
        info = NULL;
    }
    w->inflight_shards--;
    pthread_cond_broadcast(&w->cv_done);
    pthread_mutex_unlock(&w->mu);
    graft_free(info);
}

/* Removes and returns the record; NULL if absent. Caller holds the lock. */
gp_shard_rec_t *graft__persist_shard_rec_take(graft_persist_writer_t *w, uint64_t step, uint32_t rank)
{
    for (gp_shard_rec_t **p = &w->shards; *p; p = &(*p)->next)
        if ((*p)->step == step && (*p)->rank == rank) {
            gp_shard_rec_t *r = *p;
            *p = r->next;
            return r;
        }
    return NULL;
}

static graft_status_t commit_local(graft_persist_writer_t *w, gp_job_t *j,
                                   graft_persist_write_result_t *res)
{
    graft_status_t st = GRAFT_OK;
    gp_shard_rec_t **recs = graft__calloc(j->ranks, sizeof(*recs));
    const uint8_t **infos = graft__calloc(j->ranks, sizeof(*infos));
    size_t *lens = graft__calloc(j->ranks, sizeof(*lens));
    pthread_mutex_lock(&w->mu);
    for (uint32_t r = 0; r < j->ranks; r++)
        if (recs != NULL)
            recs[r] = graft__persist_shard_rec_take(w, j->step, r);
    pthread_mutex_unlock(&w->mu);
    if (recs == NULL || infos == NULL || lens == NULL) {
        st = GRAFT_ENOMEM;
        goto out;
    }
    for (uint32_t r = 0; r < j->ranks && st == GRAFT_OK; r++) {
        st = recs[r] == NULL ? GRAFT_EINTERNAL : recs[r]->status;
        if (st == GRAFT_OK) {
            infos[r] = recs[r]->info;
            lens[r] = recs[r]->len;
        }
    }
    graft_persist_commit_opts_t opts = j->opts;
    opts.file_mode = w->file_mode;
    opts.secret = w->secret_len > 0 ? w->secret : NULL;
    opts.secret_len = w->secret_len;
    if (st == GRAFT_OK)
        st = graft_persist_commit(w->root, j->step, j->ranks, infos, lens, w->code_revision,
                                  &opts);
    if (st == GRAFT_OK) {
        for (uint32_t r = 0; r < j->ranks; r++) {
            Graft__ShardInfo *si =
                graft__shard_info__unpack(&graft__pb_allocator, lens[r], infos[r]);
            if (si != NULL) {
                res->stored_bytes += si->stored_bytes;
                res->raw_bytes += si->raw_bytes;
                graft__shard_info__free_unpacked(si, &graft__pb_allocator);
            }
        }
    }
out:
    if (st != GRAFT_OK && st != GRAFT_EEXIST) {
        /* Never leave a half-written checkpoint behind (a full disk must
         * cost nothing but this checkpoint). */
        if (!graft__persist_manifest_exists(w->root, j->step) &&
            graft__persist_remove_dir(w->root, j->step) != GRAFT_OK)
            GRAFT_WARN(GRAFT_MOD_PERSIST, "could not remove the failed checkpoint of step %llu "
                       "under %s", (unsigned long long)j->step, w->root);
    }
    for (uint32_t r = 0; recs != NULL && r < j->ranks; r++)
        if (recs[r] != NULL) {
            graft_free(recs[r]->info);
            graft_free(recs[r]);
        }
    graft_free(recs);
    graft_free(infos);
    graft_free(lens);
    return st;
}

void graft__persist_commit_job(graft_persist_writer_t *w, gp_job_t *j)
{
    graft_persist_write_result_t res = {0};
    res.snapshot_ns = j->snapshot_ns;
    uint64_t t0 = graft__now_ns();
    res.status = commit_local(w, j, &res);
    GRAFT_DEBUG(GRAFT_MOD_PERSIST, "step %llu: commit %.1f ms", (unsigned long long)j->step,
                (double)(graft__now_ns() - t0) / 1e6);
    res.write_ns = graft__now_ns() - j->start_ns;
    size_t deleted = 0;
    if (res.status == GRAFT_OK && w->retention.keep_last > 0 &&
        graft_persist_retention_apply(w->root, &w->retention, &deleted) != GRAFT_OK)
        GRAFT_WARN(GRAFT_MOD_PERSIST, "retention under %s failed", w->root);
    res.second_tier_status = GRAFT_OK;
    if (res.status == GRAFT_OK && w->second_root != NULL) {
        graft__persist_key_t key = {w->secret, w->secret_len};
        graft_status_t st = graft__persist_mkdirs(w->second_root, w->file_mode);
        if (st == GRAFT_OK)
            st = graft__persist_space_check(w->second_root, res.stored_bytes + 4096u * (j->ranks + 1u));
        if (st == GRAFT_OK)
            st = graft__persist_copy_checkpoint(w->root, w->second_root, j->step,
                                                w->secret_len > 0 ? &key : NULL, w->file_mode);
        if (st != GRAFT_OK && graft__persist_remove_dir(w->second_root, j->step) != GRAFT_OK)
            GRAFT_WARN(GRAFT_MOD_PERSIST, "could not remove step %llu under %s",
                       (unsigned long long)j->step, w->second_root);
        if (st == GRAFT_OK && w->retention.keep_last > 0 &&
            graft_persist_retention_apply(w->second_root, &w->retention, &deleted) != GRAFT_OK)
            GRAFT_WARN(GRAFT_MOD_PERSIST, "retention under %s failed", w->second_root);
        res.second_tier_status = st;
    }
    /* Durable and verified locally: the uploader takes it from here,
     * without holding up the next checkpoint. */
    if (res.status == GRAFT_OK && w->remote != NULL)
        graft__persist_remote_enqueue(w->remote, j->step);
    pthread_mutex_lock(&w->mu);
    for (gp_step_rec_t *s = w->steps; s; s = s->next)
        if (s->step == j->step && !s->done) {
            s->result = res;
            s->done = true;
            break;
        }
    pthread_cond_broadcast(&w->cv_done);
    pthread_mutex_unlock(&w->mu);
}
