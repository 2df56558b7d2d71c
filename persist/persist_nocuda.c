/*
 * Device copies when the library is built without CUDA: a device region
 * cannot be read or written, which the caller learns before anything is
 * written.
 */
#include "persist_internal.h"

#ifndef GRAFT_HAVE_CUDA
graft_status_t graft__persist_d2h(void *dst, const void *src, size_t n)
{
    (void)dst;
    (void)src;
    (void)n;
    GRAFT_ERROR(GRAFT_MOD_PERSIST, "device region: this build has no CUDA");
    return GRAFT_ENOTSUP;
}

graft_status_t graft__persist_h2d(void *dst, const void *src, size_t n)
{
    (void)dst;
    (void)src;
    (void)n;
    GRAFT_ERROR(GRAFT_MOD_PERSIST, "device region: this build has no CUDA");
    return GRAFT_ENOTSUP;
}
#endif
