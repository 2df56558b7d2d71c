/*
 * The etcd gateway's answer to a transaction (graft__etcd_txn_decode) and
 * the integer and boolean fields the lease answers are read with. Byte 0
 * gives the number of operations of the branch that ran (0..4), byte 1
 * their types (two bits each); the rest is the answer. What decodes has
 * one range result per range operation.
 */
#include "fuzz_common.h"
#include "etcd_internal.h"

#include <assert.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static const graft_etcd_op_type_t types[4] = {GRAFT_ETCD_OP_PUT, GRAFT_ETCD_OP_RANGE,
                                                  GRAFT_ETCD_OP_DELETE, GRAFT_ETCD_OP_RANGE};
    graft_etcd_op_t ops[4];
    if (size < 2)
        return 0;
    size_t n_ops = data[0] % 5, n_ranges = 0;
    memset(ops, 0, sizeof(ops));
    for (size_t i = 0; i < n_ops; i++) {
        ops[i].type = types[(data[1] >> (2 * i)) & 3];
        n_ranges += ops[i].type == GRAFT_ETCD_OP_RANGE;
    }
    json_error_t jerr;
    json_t *root = json_loadb((const char *)data + 2, size - 2, JSON_REJECT_DUPLICATES, &jerr);
    if (root == NULL)
        return 0;
    graft_etcd_txn_result_t r = {0};
    if (graft__etcd_txn_decode(root, ops, n_ops, &r) == GRAFT_OK) {
        assert(r.n_ranges == n_ranges);
        for (size_t i = 0; i < r.n_ranges; i++)
            assert(r.ranges[i].revision == r.revision);
    }
    graft_etcd_txn_result_clear(&r);
    /* The lease answers: {"ID": ..., "TTL": ...} and {"result": {"TTL": ...}}. */
    int64_t v = 0;
    bool b = false;
    (void)graft__etcd_json_int64(root, "ID", &v);
    (void)graft__etcd_json_int64(root, "TTL", &v);
    (void)graft__etcd_json_bool(root, "succeeded", &b);
    json_decref(root);
    return 0;
}
