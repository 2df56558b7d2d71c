/*
 * The asynchronous writer. The trainer blocks only for the snapshot (a copy
 * of its regions into a reused staging buffer); one background thread then
 * writes each shard (chunks hashed and compressed by the compression pool,
 * persist_pool.c; temp file, fsync, rename, fsync of the directory) and, in
 * single-process mode, commits the checkpoint (persist_commit.c).
 *
 * Under GRAFT_PERSIST_LEVEL_AUTO writeback is paced with sync_file_range so
 * that "the disk can take it" (see persist_pool.c) means the disk, not the
 * page cache.
 */
#include "persist_internal.h"
#include "persist_remote.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <xxhash.h>

/* Pacing: bytes written but not yet on disk before the background thread
 * waits for the disk (at least 4 chunks). */
#define GP_PACE_BYTES (16ull << 20)

/* ------------------------------------------------------------ helpers --- */

graft_status_t graft_persist_split_even(uint64_t global_bytes, uint64_t elem_bytes, uint32_t rank,
                                        uint32_t ranks, uint64_t *offset_p, uint64_t *bytes_p)
{
    if (elem_bytes == 0 || ranks == 0 || rank >= ranks || global_bytes % elem_bytes != 0 ||
        offset_p == NULL || bytes_p == NULL)
        return GRAFT_EINVAL;
    uint64_t elems = global_bytes / elem_bytes;
    uint64_t base = elems / ranks;
    uint64_t extra = elems % ranks;
    uint64_t first = (uint64_t)rank * base + GRAFT_MIN((uint64_t)rank, extra);
    uint64_t count = base + (rank < extra ? 1 : 0);
    *offset_p = first * elem_bytes;
    *bytes_p = count * elem_bytes;
    return GRAFT_OK;
}

static graft_status_t regions_check(const graft_persist_region_t *regions, size_t n,
                                    uint64_t *raw_p)
{
    uint64_t total = 0;
    if (n > 0 && regions == NULL)
        return GRAFT_EINVAL;
    for (size_t i = 0; i < n; i++) {
        const graft_persist_region_t *r = &regions[i];
        uint64_t gsize = r->global_bytes ? r->global_bytes : r->bytes;
        uint64_t goff = r->global_bytes ? r->global_offset : 0;
        if (r->name == NULL || r->name[0] == '\0' || strlen(r->name) > GP_MAX_NAME ||
            r->kind < GRAFT_PERSIST_KIND_PARAM || r->kind > GRAFT_PERSIST_KIND_BLOB ||
            (r->ptr == NULL && r->bytes > 0) || goff > gsize || r->bytes > gsize - goff ||
            (r->device != GRAFT_PERSIST_DEVICE_HOST && r->device != GRAFT_PERSIST_DEVICE_CUDA) ||
            r->bytes > UINT64_MAX - total) {
            GRAFT_ERROR(GRAFT_MOD_PERSIST, "region %zu (%s): invalid description", i,
                        r->name ? r->name : "(null)");
            return GRAFT_EINVAL;
        }
        for (size_t j = 0; j < i; j++)
            if (strcmp(regions[j].name, r->name) == 0) {
                GRAFT_ERROR(GRAFT_MOD_PERSIST, "region %s listed twice", r->name);
                return GRAFT_EINVAL;
            }
        total += r->bytes;
    }
    *raw_p = total;
    return GRAFT_OK;
}

/* Bytes a shard takes at most: chunks never grow, since a chunk that does
 * not shrink under zstd is stored as is. */
static uint64_t shard_bound(uint64_t raw, uint64_t chunk_bytes)
{
    uint64_t chunks = raw / chunk_bytes + 1;
    return GP_HEADER_BYTES + raw + chunks * GP_INDEX_ENTRY_BYTES + GP_FOOTER_BYTES;
}

/* ---------------------------------------------------------------- job --- */

/* A job and its staging buffer (persist_staging.c). */
static void job_free(gp_job_t *j)
{
    if (j == NULL)
        return;
    for (size_t i = 0; i < j->nregions; i++)
        graft_free((char *)j->regions[i].name);
    graft_free(j->regions);
    graft__persist_staging_free(j->staging);
    graft_free(j);
}

/* --------------------------------------------------------- shard write --- */

/* Keep at most GP_PACE_BYTES of the file between write() and the disk, so
 * the background thread runs at the disk's pace: when it finds a chunk not
 * yet compressed, the disk really is waiting. Pacing is an optimization:
 * where sync_file_range is refused it is turned off; the fsync at the end
 * is what makes the file durable. */
typedef struct gp_pace {
    bool on;
    uint64_t flushed;
    uint64_t window;
} gp_pace_t;

static void pace(int fd, gp_pace_t *pc, uint64_t from, uint64_t to)
{
    if (!pc->on || to <= from)
        return;
    if (sync_file_range(fd, (off64_t)from, (off64_t)(to - from), SYNC_FILE_RANGE_WRITE) != 0) {
        GRAFT_DEBUG(GRAFT_MOD_PERSIST, "sync_file_range: %s; writeback not paced", strerror(errno));
        pc->on = false;
        return;
    }
    if (to - pc->flushed <= pc->window)
        return;
    uint64_t upto = to - pc->window;
    if (sync_file_range(fd, (off64_t)pc->flushed, (off64_t)(upto - pc->flushed),
                        SYNC_FILE_RANGE_WAIT_BEFORE | SYNC_FILE_RANGE_WRITE |
                            SYNC_FILE_RANGE_WAIT_AFTER) != 0) {
        GRAFT_DEBUG(GRAFT_MOD_PERSIST, "sync_file_range: %s; writeback not paced", strerror(errno));
        pc->on = false;
        return;
    }
    pc->flushed = upto;
}

static graft_status_t shard_info_pack(const gp_job_t *j, const char *file, uint64_t file_bytes,
                                      uint64_t footer_hash, uint64_t stored_bytes,
                                      uint64_t chunks, uint64_t chunk_bytes, int level,
                                      uint32_t group, uint8_t **info_p,
                                      size_t *len_p)
{
    graft_status_t st = GRAFT_ENOMEM;
    Graft__ShardInfo si = GRAFT__SHARD_INFO__INIT;
    Graft__ShardRegion *srs = graft__calloc(j->nregions + 1, sizeof(*srs));
    Graft__ShardRegion **srp = graft__calloc(j->nregions + 1, sizeof(*srp));
    Graft__GlobalRegion *grs = graft__calloc(j->nregions + 1, sizeof(*grs));
    Graft__GlobalRegion **grp = graft__calloc(j->nregions + 1, sizeof(*grp));
    Graft__RegionDesc *rds = graft__calloc(j->nregions + 1, sizeof(*rds));
    if (srs == NULL || srp == NULL || grs == NULL || grp == NULL || rds == NULL)
        goto out;
    uint64_t off = 0;
    for (size_t i = 0; i < j->nregions; i++) {
        const graft_persist_region_t *r = &j->regions[i];
        graft__shard_region__init(&srs[i]);
        srs[i].name = (char *)r->name;
        srs[i].global_offset = r->global_bytes ? r->global_offset : 0;
        srs[i].bytes = r->bytes;
        srs[i].offset_in_shard = off;
        off += r->bytes;
        srp[i] = &srs[i];
        graft__region_desc__init(&rds[i]);
        rds[i].name = (char *)r->name;
        rds[i].kind = (Graft__RegionKind)r->kind;
        rds[i].dtype = r->dtype;
        rds[i].device = (uint32_t)r->device;
        rds[i].bytes = r->global_bytes ? r->global_bytes : r->bytes;
        graft__global_region__init(&grs[i]);
        grs[i].region = &rds[i];
        grp[i] = &grs[i];
    }
    si.version = 1;
    si.rank = j->rank;
    si.file = (char *)file;
    si.file_bytes = file_bytes;
    si.file_hash = footer_hash;
    si.n_regions = j->nregions;
    si.regions = srp;
    si.step = j->step;
    si.ranks = j->ranks;
    si.layout_hash = j->layout_hash;
    si.raw_bytes = j->raw_bytes;
    si.stored_bytes = stored_bytes;
    si.chunk_count = chunks;
    si.chunk_bytes = chunk_bytes;
    si.compression_level = level;
    si.written_by_group = group;
    si.n_global_regions = j->nregions;
    si.global_regions = grp;
    size_t len = graft__shard_info__get_packed_size(&si);
    uint8_t *buf = graft__malloc(len);
    if (buf == NULL)
        goto out;
    graft__shard_info__pack(&si, buf);
    *info_p = buf;
    *len_p = len;
    st = GRAFT_OK;
out:
    graft_free(srs);
    graft_free(srp);
    graft_free(grs);
    graft_free(grp);
    graft_free(rds);
    return st;
}

static graft_status_t shard_write(graft_persist_writer_t *w, gp_job_t *j, uint8_t **info_p,
                                  size_t *len_p)
{
    graft_status_t st;
    graft__tmpfile_t f = {.fd = -1};
    graft__pdir_t dir = {.fd = -1};
    bool pooled = false;
    uint8_t *index = NULL;
    char *name = graft__persist_shard_name(j->rank, j->ranks);
    uint64_t cb = w->chunk_bytes;
    uint64_t nchunks = j->raw_bytes / cb + (j->raw_bytes % cb != 0);
    if (name == NULL) {
        st = GRAFT_ENOMEM;
        goto out;
    }
    index = graft__malloc((size_t)(nchunks * GP_INDEX_ENTRY_BYTES + 1));
    if (index == NULL) {
        st = GRAFT_ENOMEM;
        goto out;
    }
    st = graft__persist_dir_open(w->root, j->step, true, w->file_mode, &dir);
    if (st != GRAFT_OK)
        goto out;
    if (w->level != 0) {
        st = graft__persist_pool_prepare(w);
        if (st != GRAFT_OK)
            goto out;
    }
    st = graft__tmpfile_open(&f, &dir, name, w->file_mode);
    if (st != GRAFT_OK)
        goto out;
    graft__shard_header_t h = {GRAFT_PERSIST_FORMAT_VERSION, j->step, j->rank, j->ranks,
                               j->layout_hash, j->raw_bytes, cb};
    uint8_t hb[GP_HEADER_BYTES];
    graft__persist_header_encode(&h, hb);
    st = graft__persist_write_all(f.fd, hb, sizeof(hb), f.tmp);
    if (st != GRAFT_OK)
        goto out;
    GP_CRASH_POINT();
    uint64_t cursor = GP_HEADER_BYTES;
    uint64_t stored_total = 0;
    uint32_t compressed = 0, dropped = 0;
    uint64_t t_write = graft__now_ns();
    gp_pace_t pc = {.on = w->hp.adaptive, .window = GRAFT_MAX(GP_PACE_BYTES, 4 * cb)};
    graft__persist_pool_begin(w, j, nchunks);
    pooled = true;
    for (uint64_t c = 0; c < nchunks; c++) {
        uint64_t t0 = graft__now_ns();
        gp_slot_t *s = graft__persist_chunk_take(w, c, &compressed, &dropped);
        s->entry.offset = cursor;
        graft__persist_entry_encode(&s->entry, index + c * GP_INDEX_ENTRY_BYTES);
        st = graft__persist_write_all(f.fd, s->stored, (size_t)s->entry.stored_bytes, f.tmp);
        if (st == GRAFT_OK) {
            pace(f.fd, &pc, cursor, cursor + s->entry.stored_bytes);
            GP_TEST_DELAY(graft__persist_test_write_delay_us);
        }
        cursor += s->entry.stored_bytes;
        stored_total += s->entry.stored_bytes;
        graft__persist_chunk_done(w, s, graft__now_ns() - t0);
        if (st != GRAFT_OK)
            goto out;
        GP_CRASH_POINT();
    }
    size_t index_len = (size_t)(nchunks * GP_INDEX_ENTRY_BYTES);
    graft__shard_footer_t ft = {cursor, nchunks, XXH3_64bits(index, index_len), j->raw_bytes, 0};
    uint8_t fb[GP_FOOTER_BYTES];
    graft__persist_footer_encode(&ft, fb);
    st = graft__persist_write_all(f.fd, index, index_len, f.tmp);
    if (st == GRAFT_OK)
        st = graft__persist_write_all(f.fd, fb, sizeof(fb), f.tmp);
    if (st != GRAFT_OK)
        goto out;
    uint64_t t_fsync = graft__now_ns();
    st = graft__tmpfile_sync(&f);
    if (st != GRAFT_OK)
        goto out;
    GRAFT_DEBUG(GRAFT_MOD_PERSIST,
                "%s: %llu raw bytes, %llu stored, %u of %llu chunks compressed (%u dropped "
                "half-done): write %.1f ms, fsync %.1f ms",
                f.tmp, (unsigned long long)j->raw_bytes, (unsigned long long)stored_total,
                compressed, (unsigned long long)nchunks, dropped, (double)(t_fsync - t_write) / 1e6,
                (double)(graft__now_ns() - t_fsync) / 1e6);
    /* Never replace a shard of a checkpoint that has been committed since
     * this save was queued: its manifest records the old file. */
    if (graft__persist_manifest_exists(w->root, j->step)) {
        GRAFT_ERROR(GRAFT_MOD_PERSIST, "step %llu was committed meanwhile; not replacing %s",
                    (unsigned long long)j->step, f.final);
        st = GRAFT_EEXIST;
        goto out;
    }
    st = graft__tmpfile_install(&f);
    if (st != GRAFT_OK)
        goto out;
    uint64_t file_bytes = cursor + index_len + GP_FOOTER_BYTES;
    st = shard_info_pack(j, name, file_bytes, ft.footer_hash, stored_total, nchunks, cb,
                         w->hp.adaptive ? GP_AUTO_ZSTD_LEVEL : w->level, w->group, info_p,
                         len_p);

out:
    if (pooled)
        graft__persist_pool_end(w, j);
    graft__tmpfile_close(&f);
    graft__persist_dir_close(&dir);
    graft_free(index);
    graft_free(name);
    return st;
}

/* ------------------------------------------------------ background side --- */

static void *writer_main(void *arg)
{
    graft_persist_writer_t *w = arg;
    for (;;) {
        pthread_mutex_lock(&w->mu);
        while (w->head == NULL && !w->stop)
            pthread_cond_wait(&w->cv_work, &w->mu);
        gp_job_t *j = w->head;
        if (j == NULL) {
            pthread_mutex_unlock(&w->mu);
            break;
        }
        w->head = j->next;
        if (w->head == NULL)
            w->tail = NULL;
        pthread_mutex_unlock(&w->mu);
        if (j->type == JOB_SHARD) {
            uint8_t *info = NULL;
            size_t len = 0;
            graft_status_t st = shard_write(w, j, &info, &len);
            graft__persist_staging_put(w, j->staging);
            j->staging = NULL;
            graft__persist_shard_rec_add(w, j->step, j->rank, st, info, len);
        } else {
            graft__persist_commit_job(w, j);
        }
        job_free(j);
    }
    return NULL;
}

static void job_push(graft_persist_writer_t *w, gp_job_t *j)
{
    /* caller holds the lock */
    j->next = NULL;
    if (w->tail)
        w->tail->next = j;
    else
        w->head = j;
    w->tail = j;
    pthread_cond_signal(&w->cv_work);
}

/* ------------------------------------------------------------ public --- */

graft_status_t graft_persist_writer_create(const graft_persist_config_t *config,
                                           graft_persist_writer_t **writer_p)
{
    graft_status_t st;
    if (config == NULL || writer_p == NULL || config->root == NULL || config->root[0] == '\0' ||
        ((config->compression_level < -50 || config->compression_level > ZSTD_maxCLevel()) &&
         config->compression_level != GRAFT_PERSIST_LEVEL_AUTO) ||
        config->threads > 64 ||
        (config->chunk_bytes != 0 &&
         (config->chunk_bytes < GP_MIN_CHUNK_BYTES || config->chunk_bytes > GP_MAX_CHUNK_BYTES)) ||
        (config->second_root != NULL && strcmp(config->second_root, config->root) == 0) ||
        !graft__persist_mode_valid(config->file_mode) ||
        (config->secret != NULL &&
         (config->secret_len == 0 || config->secret_len > GRAFT_PERSIST_SECRET_MAX_BYTES)))
        return GRAFT_EINVAL;
    graft_persist_writer_t *w = graft__calloc(1, sizeof(*w));
    if (w == NULL)
        return GRAFT_ENOMEM;
    w->hp.adaptive = config->compression_level == GRAFT_PERSIST_LEVEL_AUTO;
    w->hp.level = w->hp.adaptive ? GP_AUTO_ZSTD_LEVEL : config->compression_level;
    w->level = w->hp.level;
    w->threads = config->threads ? config->threads : 2;
    w->chunk_bytes = config->chunk_bytes ? config->chunk_bytes : GP_DEFAULT_CHUNK_BYTES;
    w->max_pending = config->max_pending ? config->max_pending : 1;
    w->retention = config->retention;
    w->group = config->group;
    w->file_mode = config->file_mode;
    if (config->secret != NULL) {
        memcpy(w->secret, config->secret, config->secret_len);
        w->secret_len = config->secret_len;
        /* Retention counts only the checkpoints written under it. */
        w->retention.secret = w->secret;
        w->retention.secret_len = w->secret_len;
    }
    w->root = graft__strdup(config->root);
    w->second_root = config->second_root ? graft__strdup(config->second_root) : NULL;
    w->code_revision = graft__strdup(config->code_revision ? config->code_revision : "");
    w->hp.h = graft__calloc(w->threads, sizeof(*w->hp.h));
    if (w->root == NULL || w->code_revision == NULL || w->hp.h == NULL ||
        (config->second_root != NULL && w->second_root == NULL)) {
        st = GRAFT_ENOMEM;
        goto err;
    }
    st = graft__persist_mkdirs(w->root, w->file_mode);
    if (st == GRAFT_OK && config->remote != NULL)
        st = graft__persist_remote_create(config->remote, w->root, w->secret, w->secret_len,
                                          &w->remote);
    if (st != GRAFT_OK)
        goto err;
    pthread_mutex_init(&w->mu, NULL);
    pthread_cond_init(&w->cv_work, NULL);
    pthread_cond_init(&w->cv_done, NULL);
    if (sem_init(&w->hp.done, 0, 0) != 0) {
        GRAFT_ERROR(GRAFT_MOD_PERSIST, "sem_init: %s", strerror(errno));
        pthread_mutex_destroy(&w->mu);
        pthread_cond_destroy(&w->cv_work);
        pthread_cond_destroy(&w->cv_done);
        st = GRAFT_ESYS;
        goto err;
    }
    if (pthread_create(&w->thread, NULL, writer_main, w) != 0) {
        GRAFT_ERROR(GRAFT_MOD_PERSIST, "pthread_create: %s", strerror(errno));
        pthread_mutex_destroy(&w->mu);
        pthread_cond_destroy(&w->cv_work);
        pthread_cond_destroy(&w->cv_done);
        sem_destroy(&w->hp.done);
        st = GRAFT_ESYS;
        goto err;
    }
    w->thread_started = true;
    *writer_p = w;
    return GRAFT_OK;
err:
    graft__persist_remote_destroy(w->remote);
    graft_free(w->hp.h);
    graft_free(w->root);
    graft_free(w->second_root);
    graft_free(w->code_revision);
    explicit_bzero(w->secret, sizeof(w->secret));
    graft_free(w);
    return st;
}

void graft_persist_writer_destroy(graft_persist_writer_t *w)
{
    if (w == NULL)
        return;
    if (w->thread_started) {
        pthread_mutex_lock(&w->mu);
        w->stop = true;
        pthread_cond_signal(&w->cv_work);
        pthread_mutex_unlock(&w->mu);
        pthread_join(w->thread, NULL);
        graft__persist_pool_stop(w);
        pthread_mutex_destroy(&w->mu);
        pthread_cond_destroy(&w->cv_work);
        pthread_cond_destroy(&w->cv_done);
        sem_destroy(&w->hp.done);
    }
    graft__persist_remote_destroy(w->remote);
    while (w->shards) {
        gp_shard_rec_t *r = w->shards;
        w->shards = r->next;
        graft_free(r->info);
        graft_free(r);
    }
    while (w->steps) {
        gp_step_rec_t *s = w->steps;
        w->steps = s->next;
        graft_free(s);
    }
    while (w->pool) {
        gp_staging_t *s = w->pool;
        w->pool = s->next;
        graft__persist_staging_free(s);
    }
    graft__persist_pool_free(w);
    graft_free(w->root);
    graft_free(w->second_root);
    graft_free(w->code_revision);
    explicit_bzero(w->secret, sizeof(w->secret));
    graft_free(w);
}

/* The blocking part: copy the regions into a staging buffer. */
static graft_status_t snapshot(graft_persist_writer_t *w, uint64_t step, uint32_t rank,
                               uint32_t ranks, const graft_persist_region_t *regions, size_t n,
                               uint64_t raw, gp_job_t **job_p)
{
    graft_status_t st = GRAFT_ENOMEM;
    gp_job_t *j = graft__calloc(1, sizeof(*j));
    if (j == NULL)
        return GRAFT_ENOMEM;
    j->type = JOB_SHARD;
    j->step = step;
    j->rank = rank;
    j->ranks = ranks;
    j->raw_bytes = raw;
    j->regions = graft__calloc(n + 1, sizeof(*j->regions));
    if (j->regions == NULL)
        goto err;
    for (size_t i = 0; i < n; i++) {
        j->regions[i] = regions[i];
        j->regions[i].ptr = NULL;
        j->regions[i].name = graft__strdup(regions[i].name);
        if (j->regions[i].name == NULL)
            goto err;
        j->nregions = i + 1;
    }
    j->layout_hash = graft__persist_layout_hash(regions, n);
    j->staging = graft__persist_staging_get(w, raw);
    if (j->staging == NULL)
        goto err;
    uint64_t off = 0;
    for (size_t i = 0; i < n; i++) {
        const graft_persist_region_t *r = &regions[i];
        if (r->bytes == 0)
            continue;
        if (r->device == GRAFT_PERSIST_DEVICE_CUDA) {
            st = graft__cuda_copy(j->staging->buf + off, r->ptr, r->bytes, false);
            if (st != GRAFT_OK)
                goto err;
        } else {
            memcpy(j->staging->buf + off, r->ptr, (size_t)r->bytes);
        }
        off += r->bytes;
    }
    *job_p = j;
    return GRAFT_OK;
err:
    job_free(j);
    return st;
}

static bool has_device(const graft_persist_region_t *regions, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (regions[i].device == GRAFT_PERSIST_DEVICE_CUDA)
            return true;
    return false;
}

static graft_status_t save_ranks(graft_persist_writer_t *w, uint64_t step, uint32_t first,
                                 uint32_t count, uint32_t ranks,
                                 const graft_persist_region_t *const *regions,
                                 const size_t *nregions, bool commit,
                                 const graft_persist_commit_opts_t *opts)
{
    graft_status_t st;
    uint64_t t0 = graft__now_ns();
    uint64_t need = 0;
    uint64_t *raw = graft__calloc(count, sizeof(*raw));
    gp_job_t **jobs = graft__calloc(count + 1, sizeof(*jobs));
    if (raw == NULL || jobs == NULL) {
        st = GRAFT_ENOMEM;
        goto out;
    }
    for (uint32_t i = 0; i < count; i++) {
        st = regions_check(regions[i], nregions[i], &raw[i]);
        if (st != GRAFT_OK)
            goto out;
        if (has_device(regions[i], nregions[i])) {
            /* Ask the device layer first so nothing is half-done. */
            st = graft__cuda_usable();
            if (st != GRAFT_OK)
                goto out;
        }
        need += shard_bound(raw[i], w->chunk_bytes);
    }
    bool pending = false;
    pthread_mutex_lock(&w->mu);
    for (gp_step_rec_t *r = w->steps; r != NULL; r = r->next)
        pending |= r->step == step && !r->done;
    for (gp_job_t *q = w->head; q != NULL; q = q->next)
        pending |= q->type == JOB_SHARD && q->step == step && q->rank >= first &&
                   q->rank < first + count;
    pthread_mutex_unlock(&w->mu);
    if (pending || graft__persist_manifest_exists(w->root, step)) {
        GRAFT_ERROR(GRAFT_MOD_PERSIST, "step %llu is already %s under %s", (unsigned long long)step,
                    pending ? "being checkpointed" : "checkpointed", w->root);
        st = GRAFT_EEXIST;
        goto out;
    }
    st = graft__persist_space_check(w->root, need);
    if (st != GRAFT_OK)
        goto out;
    /* Bound the memory held by checkpoints in flight. */
    pthread_mutex_lock(&w->mu);
    while (w->inflight_shards > 0 && w->inflight_shards + count > w->max_pending * count)
        pthread_cond_wait(&w->cv_done, &w->mu);
    pthread_mutex_unlock(&w->mu);
    t0 = graft__now_ns();
    for (uint32_t i = 0; i < count; i++) {
        st = snapshot(w, step, first + i, ranks, regions[i], nregions[i], raw[i], &jobs[i]);
        if (st != GRAFT_OK)
            goto out;
    }
    uint64_t snap_ns = graft__now_ns() - t0;
    if (commit) {
        jobs[count] = graft__calloc(1, sizeof(gp_job_t));
        gp_step_rec_t *rec = graft__calloc(1, sizeof(*rec));
        if (jobs[count] == NULL || rec == NULL) {
            graft_free(rec);
            st = GRAFT_ENOMEM;
            goto out;
        }
        jobs[count]->type = JOB_COMMIT;
        jobs[count]->step = step;
        jobs[count]->ranks = ranks;
        jobs[count]->opts = opts ? *opts : (graft_persist_commit_opts_t){0};
        jobs[count]->snapshot_ns = snap_ns;
        jobs[count]->start_ns = t0 + snap_ns;
        rec->step = step;
        pthread_mutex_lock(&w->mu);
        rec->next = w->steps;
        w->steps = rec;
        pthread_mutex_unlock(&w->mu);
    }
    pthread_mutex_lock(&w->mu);
    for (uint32_t i = 0; i <= count; i++)
        if (jobs[i] != NULL) {
            if (jobs[i]->type == JOB_SHARD)
                w->inflight_shards++;
            job_push(w, jobs[i]);
            jobs[i] = NULL;
        }
    pthread_mutex_unlock(&w->mu);
    st = GRAFT_OK;
out:
    for (uint32_t i = 0; jobs != NULL && i <= count; i++)
        job_free(jobs[i]);
    graft_free(jobs);
    graft_free(raw);
    return st;
}

graft_status_t graft_persist_save(graft_persist_writer_t *w, uint64_t step, uint32_t ranks,
                                  const graft_persist_region_t *const *regions,
                                  const size_t *nregions, const graft_persist_commit_opts_t *opts)
{
    if (w == NULL || ranks == 0 || ranks > GP_MAX_RANKS || regions == NULL || nregions == NULL)
        return GRAFT_EINVAL;
    graft_persist_commit_opts_t o = opts ? *opts : (graft_persist_commit_opts_t){0};
    return save_ranks(w, step, 0, ranks, ranks, regions, nregions, true, &o);
}

graft_status_t graft_persist_wait(graft_persist_writer_t *w, uint64_t step,
                                  graft_persist_write_result_t *result_p)
{
    if (w == NULL)
        return GRAFT_EINVAL;
    pthread_mutex_lock(&w->mu);
    gp_step_rec_t **p = &w->steps;
    while (*p && (*p)->step != step)
        p = &(*p)->next;
    if (*p == NULL) {
        pthread_mutex_unlock(&w->mu);
        return GRAFT_ENOTFOUND;
    }
    gp_step_rec_t *rec = *p;
    while (!rec->done)
        pthread_cond_wait(&w->cv_done, &w->mu);
    for (p = &w->steps; *p != rec; p = &(*p)->next) {
    }
    *p = rec->next;
    pthread_mutex_unlock(&w->mu);
    graft_status_t st = rec->result.status;
    if (result_p != NULL)
        *result_p = rec->result;
    graft_free(rec);
    return st;
}

graft_status_t graft_persist_shard_write(graft_persist_writer_t *w, uint64_t step, uint32_t rank,
                                         uint32_t ranks, const graft_persist_region_t *regions,
                                         size_t nregions)
{
    if (w == NULL || ranks == 0 || ranks > GP_MAX_RANKS || rank >= ranks)
        return GRAFT_EINVAL;
    const graft_persist_region_t *const r[1] = {regions};
    const size_t n[1] = {nregions};
    return save_ranks(w, step, rank, 1, ranks, r, n, false, NULL);
}

graft_status_t graft_persist_shard_wait(graft_persist_writer_t *w, uint64_t step, uint32_t rank,
                                        uint8_t **info_p, size_t *len_p)
{
    if (w == NULL || info_p == NULL || len_p == NULL)
        return GRAFT_EINVAL;
    pthread_mutex_lock(&w->mu);
    gp_shard_rec_t *rec;
    for (;;) {
        rec = graft__persist_shard_rec_take(w, step, rank);
        if (rec != NULL)
            break;
        /* Still queued or being written? */
        bool pending = false;
        for (gp_job_t *j = w->head; j; j = j->next)
            pending |= j->type == JOB_SHARD && j->step == step && j->rank == rank;
        if (!pending && w->inflight_shards == 0) {
            pthread_mutex_unlock(&w->mu);
            return GRAFT_ENOTFOUND;
        }
        pthread_cond_wait(&w->cv_done, &w->mu);
    }
    pthread_mutex_unlock(&w->mu);
    graft_status_t st = rec->status;
    if (st == GRAFT_OK) {
        *info_p = rec->info;
        *len_p = rec->len;
        rec->info = NULL;
    }
    graft_free(rec->info);
    graft_free(rec);
    return st;
}
