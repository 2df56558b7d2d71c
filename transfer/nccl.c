/*
 * NCCL backend of the transfer engine: a 2-rank communicator per
 * donor/recipient pair (donor = rank 0), its unique id exchanged through a
 * callback that the runtime wires to etcd. Non-blocking communicator, so a
 * peer that dies or hangs is cut off by the timeout with ncclCommAbort().
 *
 * One pair transfer:
 *   1. both ranks swap a header (version, step, layout hash, chunk count)
 *      and refuse a mismatch;
 *   2. one group call: the donor sends every CUDA region and then the
 *      XXH3-64 hashes of their chunks (computed on the host from the pinned
 *      shadow the serve step staged); the recipient receives them;
 *   3. the recipient copies the regions back to the host and checks every
 *      chunk against the donor's hashes before reporting anything installed.
 * Built only when CUDA and NCCL are found.
 */
#include "transfer_int.h"

#include <cuda_runtime.h>
/* nccl.h declares a few functions as f() */
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wstrict-prototypes"
#include <nccl.h>
#pragma GCC diagnostic pop
#include <xxhash.h>

#include <stdio.h>
#include <string.h>

#define HDR_WORDS 4
#define HDR_MAGIC 0x6772616674763031ull /* "graftv01" */
#define DEFAULT_TIMEOUT_MS 30000u

typedef struct pair {
    graft_transfer_endpoint_t *ep;
    const graft_transfer_nccl_options_t *o;
    ncclComm_t comm;
    cudaStream_t stream;
    uint64_t deadline_ns;
    uint64_t *d_buf; /* device: header out, header in, hashes */
    uint64_t n_hashes;
} pair_t;

static uint64_t cuda_chunks(const graft_transfer_endpoint_t *ep)
{
    uint64_t n = 0;
    for (size_t i = 0; i < ep->n_regions; i++) {
        if (ep->regions[i].device == GRAFT_TRANSFER_CUDA)
            n += ep->regions[i].n_chunks;
    }
    return n;
}

/* Wait for the communicator's pending work and the stream, or abort. */
static graft_status_t pair_wait(pair_t *p, bool stream_too)
{
    for (;;) {
        ncclResult_t async = ncclSuccess;
        ncclResult_t r = ncclCommGetAsyncError(p->comm, &async);
        if (r != ncclSuccess || (async != ncclSuccess && async != ncclInProgress)) {
            GRAFT_ERROR(GRAFT_MOD_TRANSFER, "NCCL: %s",
                        ncclGetErrorString(r != ncclSuccess ? r : async));
            return GRAFT_ETRANSPORT;
        }
        if (async == ncclSuccess) {
            if (!stream_too)
                return GRAFT_OK;
            cudaError_t e = cudaStreamQuery(p->stream);
            if (e == cudaSuccess)
                return GRAFT_OK;
            if (e != cudaErrorNotReady) {
                GRAFT_ERROR(GRAFT_MOD_TRANSFER, "CUDA stream: %s", cudaGetErrorString(e));
                return GRAFT_ETRANSPORT;
            }
        }
        if (graft__now_ns() > p->deadline_ns) {
            GRAFT_ERROR(GRAFT_MOD_TRANSFER, "NCCL pair transfer timed out after %u ms",
                        p->o->timeout_ms != 0 ? p->o->timeout_ms : DEFAULT_TIMEOUT_MS);
            return GRAFT_ETIMEOUT;
        }
        graft__sleep_ns(100000);
    }
}

static graft_status_t pair_open(pair_t *p, int rank, uint64_t step)
{
    const graft_transfer_nccl_options_t *o = p->o;
    ncclUniqueId uid;
    ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
    graft_status_t status;
    cudaError_t e;
    ncclResult_t r;

    p->deadline_ns =
        graft__now_ns() + (uint64_t)(o->timeout_ms != 0 ? o->timeout_ms : DEFAULT_TIMEOUT_MS) *
                              1000000ull;
    e = cudaSetDevice(o->cuda_device);
    if (e == cudaSuccess)
        e = cudaStreamCreateWithFlags(&p->stream, cudaStreamNonBlocking);
    if (e == cudaSuccess)
        e = cudaMalloc((void **)&p->d_buf, (2 * HDR_WORDS + p->n_hashes + 1) * sizeof(uint64_t));
    if (e != cudaSuccess) {
        GRAFT_ERROR(GRAFT_MOD_TRANSFER, "CUDA: %s", cudaGetErrorString(e));
        return GRAFT_ETRANSPORT;
    }
    memset(&uid, 0, sizeof(uid));
    if (rank == 0) {
        r = ncclGetUniqueId(&uid);
        if (r != ncclSuccess) {
            GRAFT_ERROR(GRAFT_MOD_TRANSFER, "ncclGetUniqueId: %s", ncclGetErrorString(r));
            return GRAFT_ETRANSPORT;
        }
    }
    status = o->exchange(rank == 0, (uint8_t *)uid.internal, sizeof(uid.internal), step,
                         o->exchange_arg);
    if (status != GRAFT_OK) {
        GRAFT_ERROR(GRAFT_MOD_TRANSFER, "NCCL id exchange: %s", graft_status_string(status));
        return status;
    }
    /* Non-blocking: a peer that never shows up is cut off by the deadline. */
    cfg.blocking = 0;
    r = ncclCommInitRankConfig(&p->comm, 2, uid, rank, &cfg);
    if (r != ncclSuccess && r != ncclInProgress) {
        GRAFT_ERROR(GRAFT_MOD_TRANSFER, "ncclCommInitRankConfig: %s", ncclGetErrorString(r));
        p->comm = NULL;
        return GRAFT_ETRANSPORT;
    }
    return pair_wait(p, false);
}

static void pair_close(pair_t *p, bool ok)
{
    if (p->comm != NULL) {
        if (ok && ncclCommFinalize(p->comm) == ncclSuccess && pair_wait(p, false) == GRAFT_OK)
            (void)ncclCommDestroy(p->comm);
        else
            (void)ncclCommAbort(p->comm);
    }
    if (p->d_buf != NULL)
        (void)cudaFree(p->d_buf);
    if (p->stream != NULL)
        (void)cudaStreamDestroy(p->stream);
}

/* Both ranks swap headers; each refuses a mismatch on its own. */
static graft_status_t pair_headers(pair_t *p, int rank, uint64_t step)
{
    uint64_t mine[HDR_WORDS] = {HDR_MAGIC, step, p->ep->layout_hash, p->n_hashes};
    uint64_t theirs[HDR_WORDS];
    graft_status_t status;
    cudaError_t e;

    /* On the pair's stream: a cudaMemcpy from pageable memory may return
     * before its DMA lands, and the non-blocking stream that NCCL uses does
     * not wait for the legacy default stream. `mine` outlives the copy:
     * pair_wait() below waits for the stream. */
    e = cudaMemcpyAsync(p->d_buf, mine, sizeof(mine), cudaMemcpyHostToDevice, p->stream);
    if (e != cudaSuccess) {
        GRAFT_ERROR(GRAFT_MOD_TRANSFER, "CUDA: %s", cudaGetErrorString(e));
        return GRAFT_ETRANSPORT;
    }
    (void)ncclGroupStart();
    (void)ncclSend(p->d_buf, HDR_WORDS, ncclUint64, 1 - rank, p->comm, p->stream);
    (void)ncclRecv(p->d_buf + HDR_WORDS, HDR_WORDS, ncclUint64, 1 - rank, p->comm, p->stream);
    (void)ncclGroupEnd();
    status = pair_wait(p, true);
    if (status != GRAFT_OK)
        return status;
    e = cudaMemcpy(theirs, p->d_buf + HDR_WORDS, sizeof(theirs), cudaMemcpyDeviceToHost);
    if (e != cudaSuccess) {
        GRAFT_ERROR(GRAFT_MOD_TRANSFER, "CUDA: %s", cudaGetErrorString(e));
        return GRAFT_ETRANSPORT;
    }
    if (theirs[0] != HDR_MAGIC)
        return GRAFT_EPROTO;
    if (theirs[1] != step)
        return GRAFT_ESTEP;
    if (theirs[2] != p->ep->layout_hash || theirs[3] != p->n_hashes)
        return GRAFT_ELAYOUT;
    return GRAFT_OK;
}

/* Regions (and, from the donor, hashes) in one group call. */
static graft_status_t pair_move(pair_t *p, int rank)
{
    graft_transfer_endpoint_t *ep = p->ep;
    uint64_t *d_hashes = p->d_buf + 2 * HDR_WORDS;

    (void)ncclGroupStart();
    for (size_t i = 0; i < ep->n_regions; i++) {
        graft__region_t *r = &ep->regions[i];
        if (r->device != GRAFT_TRANSFER_CUDA || r->bytes == 0)
            continue;
        if (rank == 0)
            (void)ncclSend(r->ptr, r->bytes, ncclUint8, 1, p->comm, p->stream);
        else
            (void)ncclRecv(r->ptr, r->bytes, ncclUint8, 0, p->comm, p->stream);
    }
    if (p->n_hashes > 0) {
        if (rank == 0)
            (void)ncclSend(d_hashes, p->n_hashes, ncclUint64, 1, p->comm, p->stream);
        else
            (void)ncclRecv(d_hashes, p->n_hashes, ncclUint64, 0, p->comm, p->stream);
    }
    (void)ncclGroupEnd();
    return pair_wait(p, true);
}

/* This build has CUDA; the machine may still have no GPU. */
static bool gpu_present(void)
{
    if (graft__cuda_devices() > 0)
        return true;
    GRAFT_ERROR(GRAFT_MOD_TRANSFER, "the NCCL backend needs a GPU; none found");
    return false;
}

static graft_status_t nccl_serve(graft_transfer_endpoint_t *ep, uint64_t step,
                                 const graft_transfer_nccl_options_t *o)
{
    if (!gpu_present())
        return GRAFT_ENOTSUP;
    pair_t p = {.ep = ep, .o = o, .n_hashes = cuda_chunks(ep)};
    uint64_t *h = NULL, gen = 0;
    graft_status_t status;

    /* The hashes of this step must be complete before they are sent. */
    for (;;) {
        bool all = true;
        pthread_mutex_lock(&ep->lock);
        if (!ep->serving || ep->serve_step != step) {
            pthread_mutex_unlock(&ep->lock);
            return GRAFT_ESTATE;
        }
        gen = ep->serve_gen;
        for (uint64_t c = 0; c < ep->total_chunks && all; c++)
            all = atomic_load(&ep->hash_done[c]) != 0;
        pthread_mutex_unlock(&ep->lock);
        if (all)
            break;
        graft__sleep_ns(1000000);
    }
    h = graft__calloc(p.n_hashes + 1, sizeof(*h));
    if (h == NULL)
        return GRAFT_ENOMEM;
    pthread_mutex_lock(&ep->lock);
    for (size_t i = 0, k = 0; i < ep->n_regions; i++) {
        const graft__region_t *r = &ep->regions[i];
        if (r->device != GRAFT_TRANSFER_CUDA)
            continue;
        memcpy(&h[k], &ep->hashes[r->first_chunk], r->n_chunks * sizeof(*h));
        k += r->n_chunks;
    }
    pthread_mutex_unlock(&ep->lock);

    status = pair_open(&p, 0, step);
    /* Stream-ordered before the sends (see pair_headers); h is freed only
     * after pair_move() waited for the stream. */
    if (status == GRAFT_OK && p.n_hashes > 0 &&
        cudaMemcpyAsync(p.d_buf + 2 * HDR_WORDS, h, p.n_hashes * sizeof(*h),
                        cudaMemcpyHostToDevice, p.stream) != cudaSuccess)
        status = GRAFT_ETRANSPORT;
    if (status == GRAFT_OK)
        status = pair_headers(&p, 0, step);
    if (status == GRAFT_OK)
        status = pair_move(&p, 0);
    pair_close(&p, status == GRAFT_OK);
    graft_free(h);
    if (status == GRAFT_OK)
        graft__transfer_fence_note(ep, step, gen);
    return status;
}

/* Copy the received regions back and check every chunk. */
static graft_status_t verify(pair_t *p, graft_transfer_report_t *rep)
{
    graft_transfer_endpoint_t *ep = p->ep;
    uint64_t *h = graft__calloc(p->n_hashes + 1, sizeof(*h));
    graft_status_t status = GRAFT_OK;
    uint64_t k = 0;

    if (h == NULL)
        return GRAFT_ENOMEM;
    if (p->n_hashes > 0 && cudaMemcpy(h, p->d_buf + 2 * HDR_WORDS, p->n_hashes * sizeof(*h),
                                      cudaMemcpyDeviceToHost) != cudaSuccess) {
        status = GRAFT_ETRANSPORT;
        goto out;
    }
    for (size_t i = 0; i < ep->n_regions && status == GRAFT_OK; i++) {
        graft__region_t *r = &ep->regions[i];
        if (r->device != GRAFT_TRANSFER_CUDA)
            continue;
        status = graft__cuda_copy(r->host, r->ptr, r->bytes, false);
        for (uint64_t c = 0; c < r->n_chunks && status == GRAFT_OK; c++, k++) {
            uint64_t len = graft__region_chunk_len(ep, r, c);
            if (XXH3_64bits((const char *)r->host + c * ep->chunk_bytes, len) != h[k]) {
                GRAFT_ERROR(GRAFT_MOD_TRANSFER, "NCCL pull: chunk %llu of '%s' fails its hash",
                            (unsigned long long)c, r->name);
                snprintf(rep->drift.region, sizeof(rep->drift.region), "%s", r->name);
                rep->drift.chunk = c;
                status = GRAFT_EHASH;
                break;
            }
            rep->donors[0].chunks++;
            rep->donors[0].bytes += len;
        }
    }
out:
    graft_free(h);
    return status;
}

static graft_status_t nccl_pull(graft_transfer_endpoint_t *ep,
                                const graft_transfer_pull_options_t *o,
                                graft_transfer_report_t *rep)
{
    pair_t p = {.ep = ep, .o = o->nccl, .n_hashes = cuda_chunks(ep)};
    uint64_t start = graft__now_ns();
    graft_status_t status;

    if (o->nccl == NULL || o->n_donors != 1)
        return GRAFT_EINVAL;
    if (!gpu_present())
        return GRAFT_ENOTSUP;
    if (o->nccl->exchange == NULL)
        return GRAFT_EINVAL;
    rep->n_donors = 1;
    rep->chunks = p.n_hashes;
    for (size_t i = 0; i < ep->n_regions; i++) {
        if (ep->regions[i].device == GRAFT_TRANSFER_CUDA)
            rep->bytes += ep->regions[i].bytes;
    }
    status = pair_open(&p, 1, o->step);
    if (status == GRAFT_OK)
        status = pair_headers(&p, 1, o->step);
    if (status == GRAFT_OK)
        status = pair_move(&p, 1);
    if (status == GRAFT_OK)
        status = verify(&p, rep);
    pair_close(&p, status == GRAFT_OK);
    rep->donors[0].status = status;
    rep->elapsed_ns = graft__now_ns() - start;
    if (o->progress != NULL && status == GRAFT_OK)
        o->progress(rep->bytes, rep->bytes, o->progress_arg);
    return status;
}

const struct graft_transport_ops graft__nccl_ops = {
    .name = "nccl",
    .pull = nccl_pull,
    .serve_pair = nccl_serve,
};
