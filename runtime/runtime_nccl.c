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
 */
#include "runtime_internal.h"

#include <errno.h>
#include <inttypes.h>
#include <string.h>

struct graft__rt_pair {
    graft_runtime_t *rt;
    uint64_t round, step;
    uint32_t donor, recipient;
    graft_transfer_nccl_options_t opts;
    pthread_t thread; /* donor side */
    bool started;
    graft_status_t status;
};

bool graft__rt_nccl_on(const graft_runtime_t *rt)
{
    if (rt->cfg->transfer_backend != GRAFT_TRANSFER_BACKEND_NCCL)
        return false;
    for (size_t i = 0; i < rt->n_regions; i++)
        if (rt->regions[i].r.device == GRAFT_DEVICE_CUDA)
            return true;
    return false;
}

bool graft__rt_has_host_regions(const graft_runtime_t *rt)
{
    for (size_t i = 0; i < rt->n_regions; i++)
        if (rt->regions[i].r.device == GRAFT_DEVICE_HOST)
            return true;
    return false;
}

/* How long either side waits for the other: the donor holds its step at
 * most the fence timeout, so a pair cannot usefully wait longer. */
static uint32_t pair_timeout_ms(const graft_runtime_t *rt)
{
    return (uint32_t)rt->cfg->fence_timeout_ms;
}

static graft_status_t uid_exchange(bool publish, uint8_t *uid, size_t uid_bytes, uint64_t step,
                                   void *arg)
{
    graft__rt_pair_t *p = arg;
    graft_runtime_t *rt = p->rt;
    void *data = NULL;
    size_t len = 0;
    graft_status_t st;
    if (publish)
        return graft_membership_pair_blob_put(rt->m, p->round, p->donor, p->recipient, uid,
                                              uid_bytes);
    st = graft_membership_pair_blob_get(rt->m, p->round, p->donor, p->recipient,
                                        pair_timeout_ms(rt), &data, &len);
    if (st == GRAFT_OK && len != uid_bytes) {
        GRAFT_ERROR(GRAFT_MOD_RUNTIME, "NCCL id of groups %" PRIu32 " -> %" PRIu32 " in round %"
                    PRIu64 " has %zu bytes, not %zu", p->donor, p->recipient, p->round,
                    len, uid_bytes);
        st = GRAFT_EPROTO;
    }
    if (st == GRAFT_OK)
        memcpy(uid, data, uid_bytes);
    else if (st != GRAFT_EPROTO)
        GRAFT_ERROR(GRAFT_MOD_RUNTIME, "no NCCL id from group %" PRIu32 " for step %" PRIu64 ": %s",
                    p->donor, step, graft_status_string(st));
    graft_free(data);
    return st;
}

static void pair_init(graft__rt_pair_t *p, graft_runtime_t *rt, uint64_t round,
                      uint64_t step, uint32_t donor, uint32_t recipient)
{
    memset(p, 0, sizeof(*p));
    p->rt = rt;
    p->round = round;
    p->step = step;
    p->donor = donor;
    p->recipient = recipient;
    p->opts.exchange = uid_exchange;
    p->opts.exchange_arg = p;
    p->opts.cuda_device = (int)rt->cfg->cuda_device;
    p->opts.timeout_ms = pair_timeout_ms(rt);
}

graft_status_t graft__rt_nccl_exchange(graft_runtime_t *rt, uint64_t round, uint32_t donor,
                                       uint32_t recipient, bool publish, uint8_t *uid,
                                       size_t uid_bytes)
{
    graft__rt_pair_t p;
    pair_init(&p, rt, round, 0, donor, recipient);
    return uid_exchange(publish, uid, uid_bytes, 0, &p);
}

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
    rt->pairs = graft__calloc(rt->n_peers + 1, sizeof(*rt->pairs));
    if (rt->pairs == NULL)
        return GRAFT_ENOMEM;
    for (size_t i = 0; i < rt->n_peers; i++) {
        if (!rt->peers[i].nccl)
            continue;
        graft__rt_pair_t *p = &rt->pairs[rt->n_pairs++];
        pair_init(p, rt, q->round, q->step, rt->group, rt->peers[i].group);
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
    for (size_t i = 0; i < rt->n_pairs; i++) {
        graft__rt_pair_t *p = &rt->pairs[i];
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
    graft_free(rt->pairs);
    rt->pairs = NULL;
    rt->n_pairs = 0;
}

/* ----------------------------------------------------------- recipient --- */

graft_status_t graft__rt_nccl_pull(graft_runtime_t *rt, const char *donor_address,
                                   graft_transfer_report_t *rep)
{
    graft__rt_pair_t p;
    pair_init(&p, rt, rt->q->round, rt->q->step, rt->nccl_donor, rt->group);
    graft_transfer_pull_options_t po = {
        .donors = &donor_address,
        .n_donors = 1,
        .step = rt->q->step,
        .timeout_ms = pair_timeout_ms(rt),
        .backend = GRAFT_TRANSFER_BACKEND_NCCL,
        .nccl = &p.opts,
    };
    memset(rep, 0, sizeof(*rep));
    return graft_transfer_pull(rt->ep, &po, rep);
}
