/*
 * The library's one host-staged CUDA copy, and pinned host memory. The
 * transfer engine serves and fills device regions through pinned host
 * shadows (Debian's UCX has no CUDA support); the persistent tier snapshots
 * device regions into its staging buffers and restores them from shards.
 * Built only when CUDA and NCCL are found; common/nocuda.c stands in
 * otherwise.
 */
#include "graft_internal.h"

#include <cuda_runtime.h>

/* Piece size of a staged copy: large enough to run at copy-engine speed,
 * small enough that two streams overlap consecutive pieces. */
#define STAGE_PIECE (8ull << 20)

int graft__cuda_devices(void)
{
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess)
        return 0;
    return n;
}

graft_status_t graft__cuda_usable(void)
{
    int n = 0;
    cudaError_t e = cudaGetDeviceCount(&n);
    if (e != cudaSuccess || n == 0) {
        GRAFT_ERROR(GRAFT_MOD_CUDA, "device memory: no usable CUDA device (%s)",
                    e != cudaSuccess ? cudaGetErrorString(e) : "none found");
        return GRAFT_ENOTSUP;
    }
    return GRAFT_OK;
}

graft_status_t graft__cuda_host_alloc(uint64_t bytes, void **host_p)
{
    void *p = NULL;
    cudaError_t e;

    graft_status_t st = graft__cuda_usable();
    if (st != GRAFT_OK)
        return st;
    e = cudaHostAlloc(&p, bytes != 0 ? bytes : 1, cudaHostAllocPortable);
    if (e != cudaSuccess) {
        GRAFT_ERROR(GRAFT_MOD_CUDA, "cudaHostAlloc(%llu): %s", (unsigned long long)bytes,
                    cudaGetErrorString(e));
        return e == cudaErrorMemoryAllocation ? GRAFT_ENOMEM : GRAFT_EIO;
    }
    *host_p = p;
    return GRAFT_OK;
}

void graft__cuda_host_free(void *host)
{
    if (host != NULL)
        (void)cudaFreeHost(host);
}

graft_status_t graft__cuda_copy(void *dst, const void *src, uint64_t bytes, bool to_device)
{
    cudaStream_t streams[2] = {NULL, NULL};
    enum cudaMemcpyKind kind = to_device ? cudaMemcpyHostToDevice : cudaMemcpyDeviceToHost;
    struct cudaPointerAttributes attr;
    graft_status_t status = GRAFT_OK;
    int prev = -1;
    cudaError_t e;

    /* Copy on the device that holds the region, and give the calling
     * thread (often the trainer's) its current device back afterwards. */
    e = cudaGetDevice(&prev);
    if (e == cudaSuccess)
        e = cudaPointerGetAttributes(&attr, to_device ? dst : src);
    if (e == cudaSuccess && attr.device >= 0 && attr.device != prev)
        e = cudaSetDevice(attr.device);
    if (e != cudaSuccess)
        goto cuda_err;
    for (int i = 0; i < 2; i++) {
        e = cudaStreamCreateWithFlags(&streams[i], cudaStreamNonBlocking);
        if (e != cudaSuccess)
            goto cuda_err;
    }
    /* Alternate pieces between two streams: one piece's copy overlaps the
     * next one's launch and the copy engines stay busy (double buffering
     * of the pinned shadow). Pageable host memory (the persistent tier's
     * staging) is copied the same way; CUDA stages it through its own
     * pinned buffers. */
    for (uint64_t off = 0, i = 0; off < bytes; off += STAGE_PIECE, i++) {
        uint64_t n = GRAFT_MIN(STAGE_PIECE, bytes - off);
        e = cudaMemcpyAsync((char *)dst + off, (const char *)src + off, n, kind, streams[i & 1]);
        if (e != cudaSuccess)
            goto cuda_err;
    }
    for (int i = 0; i < 2; i++) {
        e = cudaStreamSynchronize(streams[i]);
        if (e != cudaSuccess)
            goto cuda_err;
    }
    goto out;

cuda_err:
    GRAFT_ERROR(GRAFT_MOD_CUDA, "copying %llu bytes %s the device: %s",
                (unsigned long long)bytes, to_device ? "to" : "from", cudaGetErrorString(e));
    status = GRAFT_EIO;
out:
    for (int i = 0; i < 2; i++) {
        if (streams[i] != NULL)
            (void)cudaStreamDestroy(streams[i]);
    }
    if (prev >= 0)
        (void)cudaSetDevice(prev);
    return status;
}
