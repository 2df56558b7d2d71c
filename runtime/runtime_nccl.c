/*
 * NCCL pairs (transfer_backend = nccl): a rank's CUDA regions move over a
 * 2-rank NCCL communicator between it and the same rank of one donor group,
 * while its host regions still come over UCX, striped across every donor.
 *
 * Who pairs with whom follows from the quorum record alone, so both sides
 * agree without talking: a recipient takes its CUDA regions from the first
 * donor the quorum lists for it (in the step-0 sync, the lowest member
 * group; runtime_step.c lists a donor's peers). The donor publishes the
 * communicator's unique id in etcd under the pair's slot of the quorum's
 * round (membership's pair blobs, on the donor rank's lease) and the
 * recipient reads it from there; the donor removes the slot when the pair
 * transfer is over.
 *
 * This file is the donor's side, part of the serve; the pair's setup is
 * runtime_nccl_pair.c, the recipient's pull runtime_heal.c.
 */
#include "runtime_internal.h"
#include "runtime_nccl_pair.h"

#include <errno.h>
#include <inttypes.h>
#include <string.h>

/* --------------------------------------------------------------- donor --- */

static void *serve_main(void *arg)
{
    graft__rt_pair_t *p = arg;
    graft_runtime_t *rt = p->rt;
    p->status = graft_transfer_serve_nccl(rt->ep, p->step, &p->opts);
    return NULL;
}

graft_status_t graft__rt_nccl_serve_start(graft_runtime_t *rt, const graft_quorum_t *q)
{
    rt->serve.pairs = graft__calloc(rt->serve.n_peers + 1, sizeof(*rt->serve.pairs));
    if (rt->serve.pairs == NULL)
        return GRAFT_ENOMEM;
    for (size_t i = 0; i < rt->serve.n_peers; i++) {
        if (!rt->serve.peers[i].nccl)
            continue;
        graft__rt_pair_t *p = &rt->serve.pairs[rt->serve.n_pairs++];
        graft__rt_pair_init(p, rt, q->round, q->step, rt->group, rt->serve.peers[i].group);
        if (pthread_create(&p->thread, NULL, serve_main, p) != 0) {
            GRAFT_ERROR(GRAFT_MOD_RUNTIME, "pthread_create: %s", strerror(errno));
            return GRAFT_ESYS; /* the recipient's pair times out */
        }
        p->started = true;
    }
    return GRAFT_OK;
}

void graft__rt_nccl_serve_join(graft_runtime_t *rt)
{
    for (size_t i = 0; i < rt->serve.n_pairs; i++) {
        graft__rt_pair_t *p = &rt->serve.pairs[i];
        if (!p->started)
            continue;
        pthread_join(p->thread, NULL);
        if (p->status != GRAFT_OK)
            GRAFT_WARN(GRAFT_MOD_RUNTIME,
                       "group %" PRIu32 " rank %" PRIu32 ": NCCL pair with group %"
                       PRIu32 " failed: %s", rt->group, rt->rank, p->recipient,
                       graft_status_string(p->status));
        if (graft_membership_pair_blob_delete(rt->m, p->round, p->donor, p->recipient) !=
            GRAFT_OK)
            GRAFT_DEBUG(GRAFT_MOD_RUNTIME, "NCCL id slot of round %" PRIu64 " left to the lease",
                        p->round);
    }
    graft_free(rt->serve.pairs);
    rt->serve.pairs = NULL;
    rt->serve.n_pairs = 0;
}
