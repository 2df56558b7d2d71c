/*
 * A small opaque blob per quorum id, for the trainer's cross-group
 * communicator (an NCCL unique id): a thin layer over membership's blob
 * slot, which makes the first publisher win by a compare-and-swap in etcd.
 * The runtime adds the quorum id of the latest quorum and a copy into the
 * caller's buffer, so a trainer needs neither membership.h nor graft_free().
 */
#include "runtime_internal.h"

#include <inttypes.h>
#include <string.h>

graft_status_t graft_quorum_blob_publish(graft_runtime_t *rt, const void *data, size_t len)
{
    if (rt == NULL || data == NULL || len == 0 || len > GRAFT_QUORUM_BLOB_MAX) {
        GRAFT_ERROR(GRAFT_MOD_RUNTIME, "quorum_blob_publish: %s",
                    rt == NULL     ? "no runtime"
                    : data == NULL ? "no data"
                                   : "length must be 1..65536 bytes");
        return GRAFT_EINVAL;
    }
    uint64_t id = graft_quorum_id(rt);
    if (rt->m == NULL || id == 0) {
        GRAFT_ERROR(GRAFT_MOD_RUNTIME,
                    "quorum_blob_publish: no quorum yet (call graft_quorum first)");
        return GRAFT_ESTATE;
    }
    graft_status_t st = graft_membership_blob_put(rt->m, id, data, len);
    /* EEXIST is an expected answer (another rank was first), not an error
     * to log; membership has logged etcd failures already. */
    if (st == GRAFT_OK)
        GRAFT_DEBUG(GRAFT_MOD_RUNTIME, "group %" PRIu32 " rank %" PRIu32 ": published a %zu-byte"
                    " blob for quorum %" PRIu64, rt->group, rt->rank, len, id);
    return st;
}

graft_status_t graft_quorum_blob_get(graft_runtime_t *rt, uint64_t quorum_id,
                                     uint32_t timeout_ms, void *buf, size_t cap, size_t *len_p)
{
    void *data = NULL;
    size_t len = 0;
    graft_status_t st;
    if (rt == NULL || buf == NULL || len_p == NULL || quorum_id == 0) {
        GRAFT_ERROR(GRAFT_MOD_RUNTIME, "quorum_blob_get: %s",
                    quorum_id == 0 ? "quorum id 0 never has a blob" : "NULL argument");
        return GRAFT_EINVAL;
    }
    if (rt->m == NULL) {
        GRAFT_ERROR(GRAFT_MOD_RUNTIME, "quorum_blob_get: not joined yet (call graft_quorum first)");
        return GRAFT_ESTATE;
    }
    st = graft_membership_blob_get(rt->m, quorum_id, timeout_ms, &data, &len);
    if (st != GRAFT_OK)
        goto out;
    if (len > cap) {
        GRAFT_ERROR(GRAFT_MOD_RUNTIME,
                    "quorum_blob_get: the blob of quorum %" PRIu64 " has %zu bytes,"
                    " the buffer %zu", quorum_id, len, cap);
        st = GRAFT_ERANGE;
        goto out;
    }
    if (len > 0)
        memcpy(buf, data, len);
    *len_p = len;
out:
    graft_free(data);
    return st;
}
