/*
 * The NCCL backend in a build without CUDA and NCCL: the same ops table
 * (transfer.c calls it without #ifdef), every call refused with
 * GRAFT_ENOTSUP and the reason, as common/nocuda.c refuses device memory.
 */
#include "transfer_int.h"

#ifndef GRAFT_HAVE_CUDA
static graft_status_t nonccl_pull(graft_transfer_endpoint_t *ep,
                                  const graft_transfer_pull_options_t *o,
                                  graft_transfer_report_t *rep)
{
    (void)ep;
    (void)o;
    (void)rep;
    GRAFT_ERROR(GRAFT_MOD_TRANSFER, "the NCCL backend is not in this build");
    return GRAFT_ENOTSUP;
}

static graft_status_t nonccl_serve(graft_transfer_endpoint_t *ep, uint64_t step,
                                   const graft_transfer_nccl_options_t *o)
{
    (void)ep;
    (void)step;
    (void)o;
    GRAFT_ERROR(GRAFT_MOD_TRANSFER, "the NCCL backend is not in this build");
    return GRAFT_ENOTSUP;
}

const struct graft_transport_ops graft__nccl_ops = {
    .name = "nccl",
    .pull = nonccl_pull,
    .serve_pair = nonccl_serve,
};
#endif
