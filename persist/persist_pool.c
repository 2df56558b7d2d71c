/*
 * The compression pool of the asynchronous writer (persist_writer.c):
 * persistent helper threads that hash and compress the chunks of the shard
 * being written, and the background thread's side of handing chunks out
 * and taking them back.
 *
 * Chunks go to the file in order. With a fixed zstd level the background
 * thread waits for each chunk's compression (and compresses a chunk itself
 * when no helper has taken it yet). With GRAFT_PERSIST_LEVEL_AUTO it never
 * waits for compression: a chunk that is not compressed by the time the
 * disk can take it is written stored, and the helpers aim at chunks far
 * enough ahead of the write position to be done in time (see pool_assign).
 * Under AUTO the helpers run at the lowest priority, so they only use CPU
 * time nobody else wants.
 *
 * The background thread hands out the chunks; helpers and the background
 * thread talk through atomic slot states and semaphores only, never a lock,
 * so a low-priority helper that is preempted can never hold the background
 * thread up.
 */
#include "persist_internal.h"

#include <assert.h>
#include <errno.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <xxhash.h>

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
            GRAFT_WARN(GRAFT_MOD_PERSIST, "zstd: %s; chunk stored", ZSTD_getErrorName(n));
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
            GRAFT_DEBUG(GRAFT_MOD_PERSIST, "setpriority: %s", strerror(errno));
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
            GP_TEST_DELAY(graft__persist_test_compress_delay_us);
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
graft_status_t graft__persist_pool_prepare(graft_persist_writer_t *w)
{
    gp_pool_t *p = &w->hp;
    size_t need = ZSTD_compressBound((size_t)w->chunk_bytes);
    if (!p->adaptive && w->cctx == NULL) {
        /* the background thread compresses what no helper took */
        w->cctx = ZSTD_createCCtx();
        if (w->cctx == NULL) {
            GRAFT_ERROR(GRAFT_MOD_PERSIST, "out of memory for a zstd context");
            return GRAFT_ENOMEM;
        }
    }
    if (!p->adaptive && w->own.out == NULL) {
        w->own.out = graft__malloc(need);
        w->own.out_cap = w->own.out ? need : 0;
        if (w->own.out == NULL) {
            GRAFT_ERROR(GRAFT_MOD_PERSIST, "out of memory for compression buffers");
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
                GRAFT_ERROR(GRAFT_MOD_PERSIST, "out of memory for compression buffers");
                return GRAFT_ENOMEM;
            }
        }
        h->pool = p;
        if (sem_init(&h->wake, 0, 0) != 0) {
            GRAFT_WARN(GRAFT_MOD_PERSIST,
                       "sem_init: %s; %u of %u compression helpers", strerror(errno),
                       p->started, w->threads);
            break;
        }
        int rc = pthread_create(&h->tid, NULL, helper_main, h);
        if (rc != 0) {
            sem_destroy(&h->wake);
            GRAFT_WARN(GRAFT_MOD_PERSIST,
                       "pthread_create: %s; %u of %u compression helpers", strerror(rc),
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
            graft__persist_staging_put(w, s);
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

void graft__persist_pool_begin(graft_persist_writer_t *w, gp_job_t *j, uint64_t nchunks)
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
void graft__persist_pool_end(graft_persist_writer_t *w, gp_job_t *j)
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
gp_slot_t *graft__persist_chunk_take(graft_persist_writer_t *w, uint64_t c, uint32_t *compressed_p,
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

void graft__persist_chunk_done(graft_persist_writer_t *w, gp_slot_t *s, uint64_t took_ns)
{
    gp_pool_t *p = &w->hp;
    p->tw_ns = ewma(p->tw_ns, took_ns);
    if (s != &w->own)
        atomic_store(&s->state, SLOT_FREE);
    pool_assign(w);
}

void graft__persist_pool_stop(graft_persist_writer_t *w)
{
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
}

void graft__persist_pool_free(graft_persist_writer_t *w)
{
    for (uint32_t t = 0; t < w->threads; t++)
        for (int k = 0; k < 2; k++)
            graft_free(w->hp.h[t].slots[k].out);
    graft_free(w->hp.h);
    ZSTD_freeCCtx(w->cctx);
    graft_free(w->own.out);
}
