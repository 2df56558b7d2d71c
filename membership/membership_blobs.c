/*
 * Blob slots: small values published once per quorum id (e.g. an NCCL
 * unique id) or per donor/recipient pair of a round, and read by polling.
 */
#include "membership_internal.h"

#include <inttypes.h>
#include <stdio.h>
#include <string.h>

graft_status_t graft_membership_blob_put(graft_membership_t *m, uint64_t quorum_id,
                                         const void *data, size_t len)
{
    graft_status_t st = GRAFT_OK;
    graft_etcd_txn_result_t res = {0};
    char *key = NULL, *old = NULL;
    if (m == NULL || quorum_id == 0 || (data == NULL && len > 0) || len > GRAFT_MSHIP_BLOB_MAX)
        return GRAFT_EINVAL;
    key = graft__key_blob(m->prefix, quorum_id);
    old = graft__key_blob(m->prefix, quorum_id > 4 ? quorum_id - 4 : 0);
    if (key == NULL || old == NULL) {
        st = GRAFT_ENOMEM;
        goto out;
    }
    /* First writer wins; the slot of an id four epochs back goes, so the
     * keys stay bounded without a collector. */
    graft_etcd_compare_t cmp = {key, GRAFT_ETCD_CMP_CREATE, GRAFT_ETCD_CMP_EQUAL, 0, NULL, 0};
    graft_etcd_op_t ops[2] = {{GRAFT_ETCD_OP_PUT, key, data, len, 0, false, false},
                              {GRAFT_ETCD_OP_DELETE, old, NULL, 0, 0, false, false}};
    GRAFT__MSHIP_REQ(m);
    st = graft_etcd_txn(m->ops, &cmp, 1, ops, quorum_id > 4 ? 2 : 1, NULL, 0, &res);
    if (st != GRAFT_OK) {
        atomic_fetch_add(&m->n_etcd_errors, 1);
        GRAFT_ERROR(GRAFT_MOD_MEMBERSHIP, "job %s: cannot publish blob of quorum %" PRIu64 ": %s",
                    m->job, quorum_id, graft_status_string(st));
        goto out;
    }
    if (!res.succeeded)
        st = GRAFT_EEXIST;
out:
    graft_etcd_txn_result_clear(&res);
    graft_free(old);
    graft_free(key);
    return st;
}

/* Wait for `key` to exist and copy its value out; polls, since such keys
 * are written once and read by one or a few ranks, not watched by all. */
static graft_status_t blob_wait(graft_membership_t *m, const char *key, uint32_t timeout_ms,
                                void **data_p, size_t *len_p)
{
    uint64_t deadline = graft__now_ns() + (uint64_t)timeout_ms * 1000000ull;
    graft_status_t st;
    for (;;) {
        graft_etcd_kv_t kv;
        GRAFT__MSHIP_REQ(m);
        st = graft_etcd_get(m->ops, key, &kv, NULL);
        if (st == GRAFT_OK) {
            void *copy = graft__malloc(kv.value_len);
            if (copy == NULL) {
                st = GRAFT_ENOMEM;
            } else {
                if (kv.value_len > 0)
                    memcpy(copy, kv.value, kv.value_len);
                *data_p = copy;
                *len_p = kv.value_len;
            }
            graft_etcd_kv_clear(&kv);
            break;
        }
        if (st != GRAFT_ENOTFOUND)
            atomic_fetch_add(&m->n_etcd_errors, 1);
        if (st != GRAFT_ENOTFOUND && graft_status_class(st) != GRAFT_CLASS_JOB)
            break;
        uint64_t now = graft__now_ns();
        if (now >= deadline) {
            st = st == GRAFT_ENOTFOUND ? GRAFT_ETIMEOUT : st;
            break;
        }
        graft__sleep_ns(GRAFT_MIN(20000000ull, deadline - now));
    }
    return st;
}

graft_status_t graft_membership_blob_get(graft_membership_t *m, uint64_t quorum_id,
                                         uint32_t timeout_ms, void **data_p, size_t *len_p)
{
    if (m == NULL || data_p == NULL || len_p == NULL || quorum_id == 0)
        return GRAFT_EINVAL;
    char *key = graft__key_blob(m->prefix, quorum_id);
    if (key == NULL)
        return GRAFT_ENOMEM;
    graft_status_t st = blob_wait(m, key, timeout_ms, data_p, len_p);
    graft_free(key);
    return st;
}

/* The slot of one donor/recipient pair of groups in a round, at this
 * handle's rank. */
static char *pair_key(const graft_membership_t *m, uint64_t round, uint32_t donor,
                      uint32_t recipient)
{
    return graft__key_pair(m->prefix, round, donor, recipient, m->cfg.rank);
}

graft_status_t graft_membership_pair_blob_put(graft_membership_t *m, uint64_t round,
                                              uint32_t donor, uint32_t recipient,
                                              const void *data, size_t len)
{
    int64_t lease = 0;
    uint64_t inc = 0;
    if (m == NULL || round == 0 || data == NULL || len == 0 || len > GRAFT_MSHIP_BLOB_MAX)
        return GRAFT_EINVAL;
    graft_status_t st = graft__mship_check_joined(m, &lease, &inc);
    if (st != GRAFT_OK)
        return st;
    char *key = pair_key(m, round, donor, recipient);
    if (key == NULL)
        return GRAFT_ENOMEM;
    /* On the rank's lease: a donor that dies leaves nothing behind. */
    GRAFT__MSHIP_REQ(m);
    st = graft_etcd_put(m->ops, key, data, len, lease, NULL, NULL);
    if (st != GRAFT_OK) {
        atomic_fetch_add(&m->n_etcd_errors, 1);
        GRAFT_ERROR(GRAFT_MOD_MEMBERSHIP, "job %s: cannot publish the slot of groups %" PRIu32
                    " -> %" PRIu32 " in round %" PRIu64 ": %s", m->job, donor, recipient,
                    round, graft_status_string(st));
    }
    graft_free(key);
    return st;
}

graft_status_t graft_membership_pair_blob_get(graft_membership_t *m, uint64_t round,
                                              uint32_t donor, uint32_t recipient,
                                              uint32_t timeout_ms, void **data_p, size_t *len_p)
{
    if (m == NULL || data_p == NULL || len_p == NULL || round == 0)
        return GRAFT_EINVAL;
    char *key = pair_key(m, round, donor, recipient);
    if (key == NULL)
        return GRAFT_ENOMEM;
    graft_status_t st = blob_wait(m, key, timeout_ms, data_p, len_p);
    graft_free(key);
    return st;
}

graft_status_t graft_membership_pair_blob_delete(graft_membership_t *m, uint64_t round,
                                                 uint32_t donor, uint32_t recipient)
{
    if (m == NULL || round == 0)
        return GRAFT_EINVAL;
    char *key = pair_key(m, round, donor, recipient);
    if (key == NULL)
        return GRAFT_ENOMEM;
    GRAFT__MSHIP_REQ(m);
    graft_status_t st = graft_etcd_delete(m->ops, key, false, NULL, NULL);
    if (st != GRAFT_OK)
        atomic_fetch_add(&m->n_etcd_errors, 1);
    graft_free(key);
    return st;
}
