/*
 * An NCCL pair's setup, shared by its two sides (runtime_nccl_pair.h): who
 * pairs is read from the quorum record; the communicator's id goes through
 * etcd (membership's pair blobs). The donor's side is runtime_nccl.c (the
 * serve), the recipient's runtime_heal.c (the heal).
 */
#include "runtime_internal.h"
#include "runtime_nccl_pair.h"

#include <inttypes.h>
#include <string.h>

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

uint32_t graft__rt_pair_timeout_ms(const graft_runtime_t *rt)
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
                                        graft__rt_pair_timeout_ms(rt), &data, &len);
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

void graft__rt_pair_init(graft__rt_pair_t *p, graft_runtime_t *rt, uint64_t round,
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
    p->opts.timeout_ms = graft__rt_pair_timeout_ms(rt);
}

graft_status_t graft__rt_nccl_exchange(graft_runtime_t *rt, uint64_t round, uint32_t donor,
                                       uint32_t recipient, bool publish, uint8_t *uid,
                                       size_t uid_bytes)
{
    graft__rt_pair_t p;
    graft__rt_pair_init(&p, rt, round, 0, donor, recipient);
    return uid_exchange(publish, uid, uid_bytes, 0, &p);
}
