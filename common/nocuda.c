/*
 * The CUDA helpers of common/cuda_copy.c in a build without CUDA: no
 * device is usable, so device memory is refused with GRAFT_ENOTSUP before
 * anything is read or written. Callers need no #ifdef.
 */
#include "graft_internal.h"

#ifndef GRAFT_HAVE_CUDA
int graft__cuda_devices(void)
{
    return 0;
}

graft_status_t graft__cuda_usable(void)
{
    GRAFT_ERROR(GRAFT_MOD_CUDA, "device memory: this build has no CUDA");
    return GRAFT_ENOTSUP;
}

graft_status_t graft__cuda_host_alloc(uint64_t bytes, void **host_p)
{
    (void)bytes;
    (void)host_p;
    return graft__cuda_usable();
}

void graft__cuda_host_free(void *host)
{
    (void)host;
}

graft_status_t graft__cuda_copy(void *dst, const void *src, uint64_t bytes, bool to_device)
{
    (void)dst;
    (void)src;
    (void)bytes;
    (void)to_device;
    return graft__cuda_usable();
}
#endif
