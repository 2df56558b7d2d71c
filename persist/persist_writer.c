/*
 * The asynchronous writer. The trainer blocks only for the snapshot (a copy
 * of its regions into a reused staging buffer); one background thread then
 * writes each shard (chunks hashed and compressed by persistent helper
 * threads, temp file, fsync, rename, fsync of the directory) and, in
 * single-process mode, commits the manifest, applies retention and copies
 * the checkpoint to the second tier.
 *
 * Chunks go to the file in order. With a fixed zstd level the background
 * thread waits for each chunk's compression (and compresses a chunk itself
 * when no helper has taken it yet). With GRAFT_PERSIST_LEVEL_AUTO it never
 * waits for compression: a chunk that is not compressed by the time the
 * disk can take it is written stored, and the helpers aim at chunks far
 * enough ahead of the write position to be done in time (see pool_assign).
 * Under AUTO the helpers run at the lowest priority, so they only use CPU
 * time nobody else wants, and writeback is paced with sync_file_range so
 * that "the disk can take it" means the disk, not the page cache.
 *
 * The background thread hands out the chunks; helpers and the background
 * thread talk through atomic slot states and semaphores only, never a lock,
 * so a low-priority helper that is preempted can never hold the background
 * thread up.
 */
#include "persist_internal.h"

#include <assert.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <semaphore.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <xxhash.h>
#include <zstd.h>

enum { JOB_SHARD, JOB_COMMIT };

typedef struct gp_staging {
    uint8_t *buf;
    uint64_t cap;
    struct gp_staging *next;
    /* Chunks of it handed to compression helpers and not yet read. */
    atomic_uint users;
} gp_staging_t;

typedef struct gp_job {
    int type;
    uint64_t step;
    uint32_t rank;
    uint32_t ranks;
    /* shard */
    gp_staging_t *staging;
    uint64_t raw_bytes;
    graft_persist_region_t *regions; /* names owned, ptr unused */
    size_t nregions;
    uint64_t layout_hash;
    /* commit */
    graft_persist_commit_opts_t opts;
    uint64_t snapshot_ns;
    uint64_t start_ns;
    struct gp_job *next;
} gp_job_t;

typedef struct gp_shard_rec {
    uint64_t step;
    uint32_t rank;
    graft_status_t status;
    uint8_t *info;
    size_t len;
    struct gp_shard_rec *next;
} gp_shard_rec_t;

typedef struct gp_step_rec {
    uint64_t step;
    bool done;
    graft_persist_write_result_t result;
    struct gp_step_rec *next;
} gp_step_rec_t;

/* An output buffer for one chunk's encoding, and who owns it:
 *   FREE      the background thread; it may assign a chunk (-> ASSIGNED)
 *   ASSIGNED  either: the helper starts it (-> BUSY) or the background
 *             thread takes it back (-> FREE)
 *   BUSY      the helper; it finishes (-> DONE), unless the background
 *             thread gave up on it (-> ABANDONED)
 *   DONE      the background thread, which writes it (-> FREE)
 *   ABANDONED the helper, which drops the result when done (-> FREE)
 * Transitions between owners are compare-and-swaps on state. */
enum { SLOT_FREE, SLOT_ASSIGNED, SLOT_BUSY, SLOT_DONE, SLOT_ABANDONED };

typedef struct gp_slot {
    atomic_int state;
    /* the chunk, set before ASSIGNED */
    uint64_t chunk;
    uint64_t assigned_ns;
    const uint8_t *raw;
    size_t len;
    gp_staging_t *src;
    /* the result, set before DONE */
    uint8_t *out;
    size_t out_cap;
    graft__chunk_entry_t entry; /* offset filled in by the writer */
    const uint8_t *stored;      /* out, or the raw bytes for a stored chunk */
} gp_slot_t;

/* One compression helper thread, started at the first compressed shard and
 * kept until the writer is destroyed. Two slots: one being compressed, one
 * waiting for the background thread to write it. */
typedef struct gp_helper {
    pthread_t tid;
    sem_t wake; /* posted for each assignment, and to stop */
    gp_slot_t slots[2];
    _Atomic uint64_t tc_ns; /* running average of its time per chunk */
    struct gp_pool *pool;
} gp_helper_t;

typedef struct gp_pool {
    gp_helper_t *h;   /* `threads` of them */
    uint32_t started; /* helpers running */
    bool adaptive;    /* GRAFT_PERSIST_LEVEL_AUTO */
    int level;
    atomic_bool stop;
    sem_t done;       /* posted after every chunk a helper finishes */
    /* Used by the background thread only: the shard being written. */
    bool active;
    gp_staging_t *staging;
    const uint8_t *raw;
    uint64_t raw_bytes;
    uint64_t chunk_bytes;
    uint64_t nchunks;
    uint64_t wpos;  /* first chunk not yet taken for writing */
    uint64_t next;  /* first chunk not yet assigned or taken */
    uint64_t tw_ns; /* running average of the time to take and write a chunk */
    /* staging buffers of finished shards still being read by a helper */
    gp_staging_t *orphans;
} gp_pool_t;

struct graft_persist_writer {
    char *root;
    char *second_root;
    char *code_revision;
    int level;
    uint32_t threads;
    uint64_t chunk_bytes;
    uint32_t max_pending;
    uint32_t group;
    graft_persist_retention_t retention;

    pthread_t thread;
    bool thread_started;
    pthread_mutex_t mu;
    pthread_cond_t cv_work;
    pthread_cond_t cv_done;
    bool stop;
    gp_job_t *head;
    gp_job_t *tail;
    uint32_t inflight_shards;
    gp_shard_rec_t *shards;
    gp_step_rec_t *steps;
    gp_staging_t *pool;

    gp_pool_t hp; /* compression helpers */
    /* The background thread's own encoder, for chunks no helper took. */
    ZSTD_CCtx *cctx;
    gp_slot_t own;
};

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
            GRAFT_ERROR(GP_MOD, "region %zu (%s): invalid description", i,
                        r->name ? r->name : "(null)");
            return GRAFT_EINVAL;
        }
        for (size_t j = 0; j < i; j++)
            if (strcmp(regions[j].name, r->name) == 0) {
                GRAFT_ERROR(GP_MOD, "region %s listed twice", r->name);
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

static graft_status_t space_check(const char *root, uint64_t need)
{
    struct statvfs sv;
    if (statvfs(root, &sv) != 0) {
        GRAFT_ERROR(GP_MOD, "statvfs %s: %s", root, strerror(errno));
        return GRAFT_ESYS;
    }
    /* Room for the manifest and the file system's own blocks. */
    uint64_t margin = (1ull << 16) + 4ull * sv.f_frsize;
    uint64_t avail = (uint64_t)sv.f_bavail * sv.f_frsize;
    if (avail < need || avail - need < margin) {
        GRAFT_ERROR(GP_MOD, "%s: %llu bytes free, a checkpoint needs %llu", root,
                    (unsigned long long)avail, (unsigned long long)(need + margin));
        return GRAFT_ENOSPC;
    }
    return GRAFT_OK;
}

static bool manifest_exists(const char *root, uint64_t step)
{
    char *dir = graft__persist_step_dir(root, step);
    char *p = dir ? graft__asprintf("%s/" GP_MANIFEST_PB, dir) : NULL;
    bool exists = p != NULL && access(p, F_OK) == 0;
    graft_free(p);
    graft_free(dir);
    return exists;
}

/* ------------------------------------------------------------- staging --- */

static gp_staging_t *staging_get(graft_persist_writer_t *w, uint64_t need)
{
    gp_staging_t **best = NULL;
    pthread_mutex_lock(&w->mu);
    for (gp_staging_t **p = &w->pool; *p; p = &(*p)->next)
        if ((*p)->cap >= need && (best == NULL || (*p)->cap < (*best)->cap))
            best = p;
    gp_staging_t *s = NULL;
    if (best != NULL) {
        s = *best;
        *best = s->next;
    }
    pthread_mutex_unlock(&w->mu);
    if (s != NULL)
        return s;
    s = graft__calloc(1, sizeof(*s));
    if (s == NULL)
        return NULL;
    s->buf = graft__malloc((size_t)(need ? need : 1));
    if (s->buf == NULL) {
        graft_free(s);
        return NULL;
    }
    s->cap = need;
    return s;
}

static void staging_free(gp_staging_t *s)
{
    if (s != NULL) {
        graft_free(s->buf);
        graft_free(s);
    }
}

/* Keep a few buffers so the next snapshot copies into warm memory. */
static void staging_put(graft_persist_writer_t *w, gp_staging_t *s)
{
    if (s == NULL)
        return;
    pthread_mutex_lock(&w->mu);
    size_t n = 0;
    for (gp_staging_t *p = w->pool; p; p = p->next)
        n++;
    if (n < 2u * w->max_pending + 8u) {
        s->next = w->pool;
        w->pool = s;
        s = NULL;
    }
    pthread_mutex_unlock(&w->mu);
    staging_free(s);
}

static void job_free(gp_job_t *j)
{
    if (j == NULL)
        return;
    for (size_t i = 0; i < j->nregions; i++)
        graft_free((char *)j->regions[i].name);
    graft_free(j->regions);
    staging_free(j->staging);
    graft_free(j);
}

/* --------------------------------------------------------- shard write --- */

/* zstd level for the chunks that GRAFT_PERSIST_LEVEL_AUTO compresses. */
#define GP_AUTO_ZSTD_LEVEL (-1)
/* Pacing: bytes written but not yet on disk before the background thread
 * waits for the disk (at least 4 chunks). */
#define GP_PACE_BYTES (16ull << 20)

/* One zstd frame of @p raw (with its content size, which readers check),
 * made GP_STEP_BYTES of input at a time so that a chunk given up on
 * (*give_up reads SLOT_ABANDONED) stops within a step. Returns the frame's
 * size, 0 when given up, @p len when it does not fit (so it is stored), or
 * a zstd error code. */
#define GP_STEP_BYTES (256u << 10)

static size_t compress_steps(ZSTD_CCtx *cctx, const uint8_t *raw, size_t len, int level,
                             uint8_t *out, size_t cap, atomic_int *give_up)
{
    size_t r = ZSTD_CCtx_reset(cctx, ZSTD_reset_session_and_parameters);
    if (!ZSTD_isError(r))
        r = ZSTD_CCtx_setParameter(cctx, ZSTD_c_compressionLevel, level);
    if (!ZSTD_isError(r))
        r = ZSTD_CCtx_setPledgedSrcSize(cctx, len);
    if (ZSTD_isError(r))
        return r;
    ZSTD_inBuffer in = {raw, 0, 0};
    ZSTD_outBuffer ob = {out, cap, 0};
    for (;;) {
        in.size = GRAFT_MIN(len, in.size + GP_STEP_BYTES);
        ZSTD_EndDirective end = in.size == len ? ZSTD_e_end : ZSTD_e_continue;
        do {
            r = ZSTD_compressStream2(cctx, &ob, &in, end);
            if (ZSTD_isError(r))
                return r;
            if (ob.pos == ob.size && (in.pos < in.size || (end == ZSTD_e_end && r != 0)))
                return len;
        } while (in.pos < in.size || (end == ZSTD_e_end && r != 0));
        if (end == ZSTD_e_end)
            return ob.pos;
        if (atomic_load(give_up) == SLOT_ABANDONED)
            return 0;
    }
}

/* Hash (and at a level other than 0, compress) one chunk into @p s. A
 * chunk that zstd cannot shrink, or cannot compress at all, is stored.
 * With @p give_up, compression stops when *give_up reads SLOT_ABANDONED,
 * and the function returns false (s is then left half-done). */
static bool chunk_encode(ZSTD_CCtx *cctx, const uint8_t *raw, size_t len, int level,
                         gp_slot_t *s, atomic_int *give_up)
{
    graft__chunk_entry_t *e = &s->entry;
    e->raw_bytes = len;
    e->codec = GP_CODEC_STORED;
    s->stored = raw;
    e->stored_bytes = len;
    if (level != 0 && len > 0 && cctx != NULL && s->out != NULL) {
        size_t n = give_up == NULL
                       ? ZSTD_compressCCtx(cctx, s->out, s->out_cap, raw, len, level)
                       : compress_steps(cctx, raw, len, level, s->out, s->out_cap, give_up);
        if (give_up != NULL && n == 0)
            return false;
        if (ZSTD_isError(n)) {
            /* Not fatal: the chunk is stored instead. */
            GRAFT_WARN(GP_MOD, "zstd: %s; chunk stored", ZSTD_getErrorName(n));
        } else if (n < len) {
            e->codec = GP_CODEC_ZSTD;
            s->stored = s->out;
            e->stored_bytes = n;
        }
    }
    e->raw_hash = XXH3_64bits(raw, len);
    e->stored_hash = e->codec == GP_CODEC_STORED ? e->raw_hash
                                                 : XXH3_64bits(s->stored, e->stored_bytes);
    return true;
}

static uint64_t ewma(uint64_t avg, uint64_t x)
{
    return avg == 0 ? x : (3 * avg + x) / 4;
}

/* A cautious estimate: up at once, down slowly. */
static uint64_t peak_avg(uint64_t avg, uint64_t x)
{
    return x >= avg ? x : (7 * avg + x) / 8;
}

static bool slot_cas(gp_slot_t *s, int from, int to)
{
    return atomic_compare_exchange_strong(&s->state, &from, to);
}

static void *helper_main(void *arg)
{
    gp_helper_t *h = arg;
    gp_pool_t *p = h->pool;
    if (p->adaptive) {
        /* AUTO compresses with CPU time nobody else wants: the background
         * thread (and the trainer) go first. Nothing the background thread
         * waits for is ever held by a helper. Linux nice values are per
         * thread. */
        if (setpriority(PRIO_PROCESS, (id_t)syscall(SYS_gettid), 19) != 0)
            GRAFT_DEBUG(GP_MOD, "setpriority: %s", strerror(errno));
    }
    /* NULL (out of memory): this helper's chunks are stored */
    ZSTD_CCtx *cctx = ZSTD_createCCtx();
    for (;;) {
        while (sem_wait(&h->wake) != 0) {
        }
        if (atomic_load(&p->stop))
            break;
        for (int k = 0; k < 2; k++) {
            gp_slot_t *s = &h->slots[k];
            if (!slot_cas(s, SLOT_ASSIGNED, SLOT_BUSY))
                continue; /* taken back, or posted for the other slot */
            if (graft__persist_test_compress_delay_us > 0)
                usleep((useconds_t)graft__persist_test_compress_delay_us);
            bool whole = chunk_encode(cctx, s->raw, s->len, p->level, s,
                                      p->adaptive ? &s->state : NULL);
            /* From assignment to result, waiting for a CPU included; a
             * chunk given up on took at least this long. */
            uint64_t took = graft__now_ns() - s->assigned_ns;
            uint64_t tc = atomic_load(&h->tc_ns);
            atomic_store(&h->tc_ns, whole ? peak_avg(tc, took) : GRAFT_MAX(tc, took));
            atomic_fetch_sub(&s->src->users, 1);
            if (!slot_cas(s, SLOT_BUSY, SLOT_DONE))
                atomic_store(&s->state, SLOT_FREE); /* abandoned */
            sem_post(&p->done);
        }
    }
    ZSTD_freeCCtx(cctx);
    return NULL;
}

/* Start the helpers and their buffers, once per writer. Helpers that cannot
 * be started leave their work to the background thread. */
static graft_status_t pool_prepare(graft_persist_writer_t *w)
{
    gp_pool_t *p = &w->hp;
    size_t need = ZSTD_compressBound((size_t)w->chunk_bytes);
    if (!p->adaptive && w->cctx == NULL) {
        /* the background thread compresses what no helper took */
        w->cctx = ZSTD_createCCtx();
        if (w->cctx == NULL) {
            GRAFT_ERROR(GP_MOD, "out of memory for a zstd context");
            return GRAFT_ENOMEM;
        }
    }
    if (!p->adaptive && w->own.out == NULL) {
        w->own.out = graft__malloc(need);
        w->own.out_cap = w->own.out ? need : 0;
        if (w->own.out == NULL) {
            GRAFT_ERROR(GP_MOD, "out of memory for compression buffers");
            return GRAFT_ENOMEM;
        }
    }
    for (uint32_t t = p->started; t < w->threads; t++) {
        gp_helper_t *h = &p->h[t];
        for (int k = 0; k < 2; k++) {
            gp_slot_t *s = &h->slots[k];
            if (s->out == NULL) {
                s->out = graft__malloc(need);
                s->out_cap = s->out ? need : 0;
            }
            if (s->out == NULL) {
                GRAFT_ERROR(GP_MOD, "out of memory for compression buffers");
                return GRAFT_ENOMEM;
            }
        }
        h->pool = p;
        if (sem_init(&h->wake, 0, 0) != 0) {
            GRAFT_WARN(GP_MOD, "sem_init: %s; %u of %u compression helpers", strerror(errno),
                       p->started, w->threads);
            break;
        }
        int rc = pthread_create(&h->tid, NULL, helper_main, h);
        if (rc != 0) {
            sem_destroy(&h->wake);
            GRAFT_WARN(GP_MOD, "pthread_create: %s; %u of %u compression helpers", strerror(rc),
                       p->started, w->threads);
            break;
        }
        p->started++;
    }
    return GRAFT_OK;
}

/* Give back the staging buffers that no helper reads any more. */
static void pool_reap(graft_persist_writer_t *w)
{
    gp_staging_t **o = &w->hp.orphans;
    while (*o != NULL) {
        gp_staging_t *s = *o;
        if (atomic_load(&s->users) == 0) {
            *o = s->next;
            s->next = NULL;
            staging_put(w, s);
        } else {
            o = &s->next;
        }
    }
}

/* Hand chunks to idle helpers.
 *
 * With a fixed level, the next chunks in order. With AUTO, chunks that will
 * be compressed before the background thread gets to them: a helper needs
 * about tc from assignment to result (a cautious running estimate, the
 * slowest helper's); meanwhile the background thread finishes the chunk it
 * is on and takes one more every tw, so assignments skip k chunks past wpos
 * with (k + 1) * tw >= 1.25 * tc. The chunks skipped are written stored. */
static void pool_assign(graft_persist_writer_t *w)
{
    gp_pool_t *p = &w->hp;
    if (!p->active)
        return;
    uint64_t k = 0;
    if (p->adaptive && p->tw_ns > 0) {
        uint64_t tc = 0;
        for (uint32_t t = 0; t < p->started; t++)
            tc = GRAFT_MAX(tc, atomic_load(&p->h[t].tc_ns));
        if (tc > 0) {
            uint64_t need = tc + tc / 4;
            k = GRAFT_MIN((need + p->tw_ns - 1) / p->tw_ns - 1, p->nchunks);
        }
    }
    for (uint32_t t = 0; t < p->started; t++) {
        gp_helper_t *h = &p->h[t];
        gp_slot_t *free_slot = NULL;
        bool working = false;
        for (int i = 0; i < 2; i++) {
            int st = atomic_load(&h->slots[i].state);
            working |= st == SLOT_ASSIGNED || st == SLOT_BUSY || st == SLOT_ABANDONED;
            if (st == SLOT_FREE)
                free_slot = &h->slots[i];
        }
        if (working || free_slot == NULL)
            continue;
        uint64_t c = GRAFT_MAX(p->next, p->wpos + k);
        if (c >= p->nchunks)
            return;
        free_slot->chunk = c;
        free_slot->raw = p->raw + c * p->chunk_bytes;
        free_slot->len = (size_t)GRAFT_MIN(p->chunk_bytes, p->raw_bytes - c * p->chunk_bytes);
        free_slot->src = p->staging;
        free_slot->assigned_ns = graft__now_ns();
        atomic_fetch_add(&p->staging->users, 1);
        atomic_store(&free_slot->state, SLOT_ASSIGNED);
        sem_post(&h->wake);
        p->next = c + 1;
    }
}

static void pool_begin(graft_persist_writer_t *w, gp_job_t *j, uint64_t nchunks)
{
    gp_pool_t *p = &w->hp;
    pool_reap(w);
    p->staging = j->staging;
    p->raw = j->staging->buf;
    p->raw_bytes = j->raw_bytes;
    p->chunk_bytes = w->chunk_bytes;
    p->nchunks = nchunks;
    p->wpos = 0;
    p->next = 0;
    p->active = p->started > 0;
    pool_assign(w);
}

/* Take back what the helpers have not started, give up on what they are
 * doing, drop results not written. A helper still inside a chunk is not
 * waited for (a low-priority helper may take long on a busy machine): the
 * staging buffer then stays with the pool until it is no longer read, and
 * the job no longer owns it. */
static void pool_end(graft_persist_writer_t *w, gp_job_t *j)
{
    gp_pool_t *p = &w->hp;
    p->active = false;
    for (uint32_t t = 0; t < p->started; t++)
        for (int i = 0; i < 2; i++) {
            gp_slot_t *s = &p->h[t].slots[i];
            if (slot_cas(s, SLOT_ASSIGNED, SLOT_FREE))
                atomic_fetch_sub(&s->src->users, 1);
            else if (!slot_cas(s, SLOT_BUSY, SLOT_ABANDONED))
                (void)slot_cas(s, SLOT_DONE, SLOT_FREE);
        }
    if (p->staging != NULL && atomic_load(&p->staging->users) > 0) {
        p->staging->next = p->orphans;
        p->orphans = p->staging;
        j->staging = NULL;
    }
    p->staging = NULL;
    p->raw = NULL;
}

/* The encoding of chunk c, ready to write: a helper's, or made here. With
 * AUTO a chunk still being compressed is not waited for: it is stored, and
 * the helper's result dropped. */
static gp_slot_t *chunk_take(graft_persist_writer_t *w, uint64_t c, uint32_t *compressed_p,
                             uint32_t *dropped_p)
{
    gp_pool_t *p = &w->hp;
    gp_slot_t *s = NULL;
    p->wpos = c + 1;
    for (uint32_t t = 0; t < p->started && s == NULL; t++)
        for (int i = 0; i < 2 && s == NULL; i++) {
            gp_slot_t *x = &p->h[t].slots[i];
            int st = atomic_load(&x->state);
            if ((st == SLOT_ASSIGNED || st == SLOT_BUSY || st == SLOT_DONE) && x->chunk == c)
                s = x;
        }
    while (s != NULL && atomic_load(&s->state) != SLOT_DONE) {
        if (slot_cas(s, SLOT_ASSIGNED, SLOT_FREE)) {
            /* not started: done here instead */
            atomic_fetch_sub(&s->src->users, 1);
            s = NULL;
        } else if (p->adaptive) {
            if (slot_cas(s, SLOT_BUSY, SLOT_ABANDONED)) {
                s = NULL;
                (*dropped_p)++;
            }
        } else {
            /* A fixed level waits, keeping the other helpers busy. */
            pool_assign(w);
            while (sem_wait(&p->done) != 0) {
            }
        }
    }
    p->next = GRAFT_MAX(p->next, c + 1);
    if (s == NULL) {
        uint64_t off = c * w->chunk_bytes;
        s = &w->own;
        (void)chunk_encode(w->cctx, p->raw + off,
                           (size_t)GRAFT_MIN(w->chunk_bytes, p->raw_bytes - off),
                           p->adaptive ? 0 : w->level, s, NULL);
    }
    *compressed_p += s->entry.codec == GP_CODEC_ZSTD;
    return s;
}

static void chunk_done(graft_persist_writer_t *w, gp_slot_t *s, uint64_t took_ns)
{
    gp_pool_t *p = &w->hp;
    p->tw_ns = ewma(p->tw_ns, took_ns);
    if (s != &w->own)
        atomic_store(&s->state, SLOT_FREE);
    pool_assign(w);
}

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
        GRAFT_DEBUG(GP_MOD, "sync_file_range: %s; writeback not paced", strerror(errno));
        pc->on = false;
        return;
    }
    if (to - pc->flushed <= pc->window)
        return;
    uint64_t upto = to - pc->window;
    if (sync_file_range(fd, (off64_t)pc->flushed, (off64_t)(upto - pc->flushed),
                        SYNC_FILE_RANGE_WAIT_BEFORE | SYNC_FILE_RANGE_WRITE |
                            SYNC_FILE_RANGE_WAIT_AFTER) != 0) {
        GRAFT_DEBUG(GP_MOD, "sync_file_range: %s; writeback not paced", strerror(errno));
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
    int fd = -1;
    bool pooled = false;
    uint8_t *index = NULL;
    char *dir = graft__persist_step_dir(w->root, j->step);
    char *name = graft__persist_shard_name(j->rank, j->ranks);
    char *tmp = dir && name ? graft__asprintf("%s/%s.tmp", dir, name) : NULL;
    char *final = dir && name ? graft__asprintf("%s/%s", dir, name) : NULL;
    uint64_t cb = w->chunk_bytes;
    uint64_t nchunks = j->raw_bytes / cb + (j->raw_bytes % cb != 0);
    if (tmp == NULL || final == NULL) {
        st = GRAFT_ENOMEM;
        goto out;
    }
    index = graft__malloc((size_t)(nchunks * GP_INDEX_ENTRY_BYTES + 1));
    if (index == NULL) {
        st = GRAFT_ENOMEM;
        goto out;
    }
    st = graft__persist_mkdirs(dir);
    if (st != GRAFT_OK)
        goto out;
    if (w->level != 0) {
        st = pool_prepare(w);
        if (st != GRAFT_OK)
            goto out;
    }
    fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) {
        GRAFT_ERROR(GP_MOD, "create %s: %s", tmp, strerror(errno));
        st = errno == ENOSPC ? GRAFT_ENOSPC : GRAFT_EIO;
        goto out;
    }
    graft__shard_header_t h = {GRAFT_PERSIST_FORMAT_VERSION, j->step, j->rank, j->ranks,
                               j->layout_hash, j->raw_bytes, cb};
    uint8_t hb[GP_HEADER_BYTES];
    graft__persist_header_encode(&h, hb);
    st = graft__persist_write_all(fd, hb, sizeof(hb), tmp);
    if (st != GRAFT_OK)
        goto out_unlink;
    graft__persist_crash_point();
    uint64_t cursor = GP_HEADER_BYTES;
    uint64_t stored_total = 0;
    uint32_t compressed = 0, dropped = 0;
    uint64_t t_write = graft__now_ns();
    gp_pace_t pc = {.on = w->hp.adaptive, .window = GRAFT_MAX(GP_PACE_BYTES, 4 * cb)};
    pool_begin(w, j, nchunks);
    pooled = true;
    for (uint64_t c = 0; c < nchunks; c++) {
        uint64_t t0 = graft__now_ns();
        gp_slot_t *s = chunk_take(w, c, &compressed, &dropped);
        s->entry.offset = cursor;
        graft__persist_entry_encode(&s->entry, index + c * GP_INDEX_ENTRY_BYTES);
        st = graft__persist_write_all(fd, s->stored, (size_t)s->entry.stored_bytes, tmp);
        if (st == GRAFT_OK) {
            pace(fd, &pc, cursor, cursor + s->entry.stored_bytes);
            if (graft__persist_test_write_delay_us > 0)
                usleep((useconds_t)graft__persist_test_write_delay_us);
        }
        cursor += s->entry.stored_bytes;
        stored_total += s->entry.stored_bytes;
        chunk_done(w, s, graft__now_ns() - t0);
        if (st != GRAFT_OK)
            goto out_unlink;
        graft__persist_crash_point();
    }
    size_t index_len = (size_t)(nchunks * GP_INDEX_ENTRY_BYTES);
    graft__shard_footer_t f = {cursor, nchunks, XXH3_64bits(index, index_len), j->raw_bytes, 0};
    uint8_t fb[GP_FOOTER_BYTES];
    graft__persist_footer_encode(&f, fb);
    st = graft__persist_write_all(fd, index, index_len, tmp);
    if (st == GRAFT_OK)
        st = graft__persist_write_all(fd, fb, sizeof(fb), tmp);
    if (st != GRAFT_OK)
        goto out_unlink;
    graft__persist_crash_point();
    uint64_t t_fsync = graft__now_ns();
    if (fsync(fd) != 0) {
        GRAFT_ERROR(GP_MOD, "fsync %s: %s", tmp, strerror(errno));
        st = errno == ENOSPC ? GRAFT_ENOSPC : GRAFT_EIO;
        goto out_unlink;
    }
    GRAFT_DEBUG(GP_MOD,
                "%s: %llu raw bytes, %llu stored, %u of %llu chunks compressed (%u dropped "
                "half-done): write %.1f ms, fsync %.1f ms",
                tmp, (unsigned long long)j->raw_bytes, (unsigned long long)stored_total,
                compressed, (unsigned long long)nchunks, dropped, (double)(t_fsync - t_write) / 1e6,
                (double)(graft__now_ns() - t_fsync) / 1e6);
    close(fd);
    fd = -1;
    graft__persist_crash_point();
    /* Never replace a shard of a checkpoint that has been committed since
     * this save was queued: its manifest records the old file. */
    if (manifest_exists(w->root, j->step)) {
        GRAFT_ERROR(GP_MOD, "step %llu was committed meanwhile; not replacing %s",
                    (unsigned long long)j->step, final);
        st = GRAFT_EEXIST;
        goto out_unlink;
    }
    if (rename(tmp, final) != 0) {
        GRAFT_ERROR(GP_MOD, "rename %s: %s", tmp, strerror(errno));
        st = GRAFT_EIO;
        goto out_unlink;
    }
    graft__persist_crash_point();
    st = graft__persist_fsync_dir(dir);
    if (st != GRAFT_OK)
        goto out;
    uint64_t file_bytes = cursor + index_len + GP_FOOTER_BYTES;
    st = shard_info_pack(j, name, file_bytes, f.footer_hash, stored_total, nchunks, cb,
                         w->hp.adaptive ? GP_AUTO_ZSTD_LEVEL : w->level, w->group, info_p,
                         len_p);
    goto out;

out_unlink:
    unlink(tmp);
out:
    if (pooled)
        pool_end(w, j);
    if (fd >= 0)
        close(fd);
    graft_free(index);
    graft_free(tmp);
    graft_free(final);
    graft_free(name);
    graft_free(dir);
    return st;
}

/* ------------------------------------------------------------- commit --- */

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
                GRAFT_ERROR(GP_MOD, "commit: ranks disagree on region %s", a->name);
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
    if (root == NULL || ranks == 0 || ranks > GP_MAX_RANKS || infos == NULL || lens == NULL)
        return GRAFT_EINVAL;
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
        sh[r] = graft__shard_info__unpack(&graft__persist_pb_allocator, lens[r], infos[r]);
        if (sh[r] == NULL || sh[r]->version != 1 || sh[r]->step != step || sh[r]->ranks != ranks) {
            GRAFT_ERROR(GP_MOD, "commit step %llu: shard record %u is malformed or for another "
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
            GRAFT_ERROR(GP_MOD, "commit step %llu: no record for rank %u",
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
        GRAFT_ERROR(GP_MOD, "commit step %llu: %s", (unsigned long long)step, why);
        st = st == GRAFT_ECORRUPT ? GRAFT_ELAYOUT : st;
        goto out_restore;
    }
    if (manifest_exists(root, step)) {
        GRAFT_ERROR(GP_MOD, "commit: step %llu already has a manifest", (unsigned long long)step);
        st = GRAFT_EEXIST;
        goto out_restore;
    }
    /* Shards must be durable and exactly what their records describe. */
    st = graft__checkpoint_verify(dir, &m, false, why, sizeof(why));
    if (st != GRAFT_OK) {
        GRAFT_ERROR(GP_MOD, "commit step %llu: %s", (unsigned long long)step, why);
        st = GRAFT_ECORRUPT;
        goto out_restore;
    }
    st = graft__manifest_write(dir, &m);
out_restore:
    for (uint32_t r = 0; r < ranks; r++)
        sh[r]->n_global_regions = saved_ng[r];
out:
    if (sh != NULL)
        for (uint32_t r = 0; r < ranks; r++)
            if (sh[r] != NULL)
                graft__shard_info__free_unpacked(sh[r], &graft__persist_pb_allocator);
    graft_free(globals);
    graft_free(sh);
    graft_free(saved_ng);
    graft_free(dir);
    return st;
}

/* ------------------------------------------------------ background side --- */

static void shard_rec_add(graft_persist_writer_t *w, uint64_t step, uint32_t rank,
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
static gp_shard_rec_t *shard_rec_take(graft_persist_writer_t *w, uint64_t step, uint32_t rank)
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
            recs[r] = shard_rec_take(w, j->step, r);
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
    if (st == GRAFT_OK)
        st = graft_persist_commit(w->root, j->step, j->ranks, infos, lens, w->code_revision,
                                  &j->opts);
    if (st == GRAFT_OK) {
        for (uint32_t r = 0; r < j->ranks; r++) {
            Graft__ShardInfo *si =
                graft__shard_info__unpack(&graft__persist_pb_allocator, lens[r], infos[r]);
            if (si != NULL) {
                res->stored_bytes += si->stored_bytes;
                res->raw_bytes += si->raw_bytes;
                graft__shard_info__free_unpacked(si, &graft__persist_pb_allocator);
            }
        }
    }
out:
    if (st != GRAFT_OK && st != GRAFT_EEXIST) {
        /* Never leave a half-written checkpoint behind (a full disk must
         * cost nothing but this checkpoint). */
        char *dir = graft__persist_step_dir(w->root, j->step);
        if (dir != NULL && !manifest_exists(w->root, j->step) &&
            graft__persist_remove_dir(dir) != GRAFT_OK)
            GRAFT_WARN(GP_MOD, "could not remove the failed checkpoint %s", dir);
        graft_free(dir);
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

static void commit_job(graft_persist_writer_t *w, gp_job_t *j)
{
    graft_persist_write_result_t res = {0};
    res.snapshot_ns = j->snapshot_ns;
    uint64_t t0 = graft__now_ns();
    res.status = commit_local(w, j, &res);
    GRAFT_DEBUG(GP_MOD, "step %llu: commit %.1f ms", (unsigned long long)j->step,
                (double)(graft__now_ns() - t0) / 1e6);
    res.write_ns = graft__now_ns() - j->start_ns;
    size_t deleted = 0;
    if (res.status == GRAFT_OK && w->retention.keep_last > 0 &&
        graft_persist_retention_apply(w->root, &w->retention, &deleted) != GRAFT_OK)
        GRAFT_WARN(GP_MOD, "retention under %s failed", w->root);
    res.second_tier_status = GRAFT_OK;
    if (res.status == GRAFT_OK && w->second_root != NULL) {
        graft_status_t st = graft__persist_mkdirs(w->second_root);
        if (st == GRAFT_OK)
            st = space_check(w->second_root, res.stored_bytes + 4096u * (j->ranks + 1u));
        if (st == GRAFT_OK)
            st = graft__persist_copy_checkpoint(w->root, w->second_root, j->step);
        if (st != GRAFT_OK) {
            char *dir = graft__persist_step_dir(w->second_root, j->step);
            if (dir != NULL && graft__persist_remove_dir(dir) != GRAFT_OK)
                GRAFT_WARN(GP_MOD, "could not remove %s", dir);
            graft_free(dir);
        }
        if (st == GRAFT_OK && w->retention.keep_last > 0 &&
            graft_persist_retention_apply(w->second_root, &w->retention, &deleted) != GRAFT_OK)
            GRAFT_WARN(GP_MOD, "retention under %s failed", w->second_root);
        res.second_tier_status = st;
    }
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
            staging_put(w, j->staging);
            j->staging = NULL;
            shard_rec_add(w, j->step, j->rank, st, info, len);
        } else {
            commit_job(w, j);
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
        (config->second_root != NULL && strcmp(config->second_root, config->root) == 0))
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
    w->root = graft__strdup(config->root);
    w->second_root = config->second_root ? graft__strdup(config->second_root) : NULL;
    w->code_revision = graft__strdup(config->code_revision ? config->code_revision : "");
    w->hp.h = graft__calloc(w->threads, sizeof(*w->hp.h));
    if (w->root == NULL || w->code_revision == NULL || w->hp.h == NULL ||
        (config->second_root != NULL && w->second_root == NULL)) {
        st = GRAFT_ENOMEM;
        goto err;
    }
    st = graft__persist_mkdirs(w->root);
    if (st != GRAFT_OK)
        goto err;
    pthread_mutex_init(&w->mu, NULL);
    pthread_cond_init(&w->cv_work, NULL);
    pthread_cond_init(&w->cv_done, NULL);
    if (sem_init(&w->hp.done, 0, 0) != 0) {
        GRAFT_ERROR(GP_MOD, "sem_init: %s", strerror(errno));
        pthread_mutex_destroy(&w->mu);
        pthread_cond_destroy(&w->cv_work);
        pthread_cond_destroy(&w->cv_done);
        st = GRAFT_ESYS;
        goto err;
    }
    if (pthread_create(&w->thread, NULL, writer_main, w) != 0) {
        GRAFT_ERROR(GP_MOD, "pthread_create: %s", strerror(errno));
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
    graft_free(w->hp.h);
    graft_free(w->root);
    graft_free(w->second_root);
    graft_free(w->code_revision);
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
        /* Helpers finish the chunk they are in (dropped by now), then stop. */
        atomic_store(&w->hp.stop, true);
        for (uint32_t t = 0; t < w->hp.started; t++)
            sem_post(&w->hp.h[t].wake);
        for (uint32_t t = 0; t < w->hp.started; t++) {
            pthread_join(w->hp.h[t].tid, NULL);
            sem_destroy(&w->hp.h[t].wake);
        }
        pool_reap(w);
        assert(w->hp.orphans == NULL);
        pthread_mutex_destroy(&w->mu);
        pthread_cond_destroy(&w->cv_work);
        pthread_cond_destroy(&w->cv_done);
        sem_destroy(&w->hp.done);
    }
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
        staging_free(s);
    }
    for (uint32_t t = 0; t < w->threads; t++)
        for (int k = 0; k < 2; k++)
            graft_free(w->hp.h[t].slots[k].out);
    graft_free(w->hp.h);
    ZSTD_freeCCtx(w->cctx);
    graft_free(w->own.out);
    graft_free(w->root);
    graft_free(w->second_root);
    graft_free(w->code_revision);
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
    j->staging = staging_get(w, raw);
    if (j->staging == NULL)
        goto err;
    uint64_t off = 0;
    for (size_t i = 0; i < n; i++) {
        const graft_persist_region_t *r = &regions[i];
        if (r->bytes == 0)
            continue;
        if (r->device == GRAFT_PERSIST_DEVICE_CUDA) {
            st = graft__persist_d2h(j->staging->buf + off, r->ptr, (size_t)r->bytes);
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
            st = graft__persist_d2h(NULL, NULL, 0);
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
    if (pending || manifest_exists(w->root, step)) {
        GRAFT_ERROR(GP_MOD, "step %llu is already %s under %s", (unsigned long long)step,
                    pending ? "being checkpointed" : "checkpointed", w->root);
        st = GRAFT_EEXIST;
        goto out;
    }
    st = space_check(w->root, need);
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
        rec = shard_rec_take(w, step, rank);
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
