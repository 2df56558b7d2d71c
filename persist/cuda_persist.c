/*
 * Device copies for CUDA regions. Built only when CUDA is found. The copy
 * goes through a pinned bounce buffer with cudaMemcpyAsync on a private
 * stream, so it never serializes with the trainer's default stream; the
 * call returns once the bytes are on the host. Called with n == 0 it only
 * checks that a device is usable, so a save can refuse device regions up
 * front on a machine without a GPU.
 */
#include "persist_internal.h"

#include <string.h>

#include <cuda_runtime.h>

#define GP_BOUNCE_BYTES (8u << 20)

static graft_status_t device_ready(void)
{
    int count = 0;
    cudaError_t e = cudaGetDeviceCount(&count);
    if (e != cudaSuccess || count == 0) {
        GRAFT_ERROR(GRAFT_MOD_PERSIST, "device region: no usable CUDA device (%s)",
                    e != cudaSuccess ? cudaGetErrorString(e) : "none found");
        return GRAFT_ENOTSUP;
    }
    return GRAFT_OK;
}

static graft_status_t copy(void *dst, const void *src, size_t n, bool to_host)
{
    graft_status_t st = device_ready();
    if (st != GRAFT_OK || n == 0)
        return st;
    cudaStream_t stream = NULL;
    void *bounce = NULL;
    size_t cap = n < GP_BOUNCE_BYTES ? n : GP_BOUNCE_BYTES;
    if (cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking) != cudaSuccess ||
        cudaHostAlloc(&bounce, cap, cudaHostAllocDefault) != cudaSuccess) {
        GRAFT_ERROR(GRAFT_MOD_PERSIST, "cuda: cannot set up a pinned copy of %zu bytes", n);
        st = GRAFT_ENOMEM;
        goto out;
    }
    for (size_t off = 0; off < n; off += cap) {
        size_t len = n - off < cap ? n - off : cap;
        cudaError_t e;
        if (to_host) {
            e = cudaMemcpyAsync(bounce, (const char *)src + off, len, cudaMemcpyDeviceToHost,
                                stream);
            if (e == cudaSuccess)
                e = cudaStreamSynchronize(stream);
            if (e == cudaSuccess)
                memcpy((char *)dst + off, bounce, len);
        } else {
            memcpy(bounce, (const char *)src + off, len);
            e = cudaMemcpyAsync((char *)dst + off, bounce, len, cudaMemcpyHostToDevice, stream);
            if (e == cudaSuccess)
                e = cudaStreamSynchronize(stream);
        }
        if (e != cudaSuccess) {
            GRAFT_ERROR(GRAFT_MOD_PERSIST, "cuda copy: %s", cudaGetErrorString(e));
            st = GRAFT_EIO;
            goto out;
        }
    }
out:
    if (bounce != NULL)
        cudaFreeHost(bounce);
    if (stream != NULL)
        cudaStreamDestroy(stream);
    return st;
}

graft_status_t graft__persist_d2h(void *dst, const void *src, size_t n)
{
    return copy(dst, src, n, true);
}

graft_status_t graft__persist_h2d(void *dst, const void *src, size_t n)
{
    return copy(dst, src, n, false);
}
