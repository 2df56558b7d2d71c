/*
 * etcd v3 client: the calls, each one request through the client's request
 * path (etcd_client.c): key-value (range, get, put, delete, compact),
 * transactions, leases, and a member's status.
 */
#include "etcd_internal.h"

#include <stdlib.h>
#include <string.h>

/* ------------------------------------------------------------------------ */
/* Key-value                                                                */
/* ------------------------------------------------------------------------ */

static graft_status_t set_range_end(json_t *req, const char *key, bool prefix,
                                    const char *range_end)
{
    if (prefix) {
        char *end = NULL;
        size_t len = 0;
        graft_status_t st = graft__etcd_prefix_end(key, &end, &len);
        if (st != GRAFT_OK)
            return st;
        st = graft__etcd_json_set_bytes(req, "range_end", end, len);
        graft_free(end);
        return st;
    }
    if (range_end != NULL)
        return graft__etcd_json_set_bytes(req, "range_end", range_end, strlen(range_end));
    return GRAFT_OK;
}

static graft_status_t range_request(const char *key, const graft_etcd_range_opts_t *o,
                                    json_t **req_p)
{
    graft_status_t st = GRAFT_ENOMEM;
    json_t *req = json_object();
    if (req == NULL)
        goto out;
    if ((st = graft__etcd_json_set_bytes(req, "key", key, strlen(key))) != GRAFT_OK ||
        (st = set_range_end(req, key, o->prefix, o->range_end)) != GRAFT_OK)
        goto err_req;
    if ((o->limit > 0 && (st = graft__etcd_json_set_int64(req, "limit", o->limit)) != GRAFT_OK) ||
        (o->revision > 0 &&
         (st = graft__etcd_json_set_int64(req, "revision", o->revision)) != GRAFT_OK))
        goto err_req;
    st = GRAFT_ENOMEM;
    if ((o->keys_only && json_object_set_new(req, "keys_only", json_true()) != 0) ||
        (o->count_only && json_object_set_new(req, "count_only", json_true()) != 0))
        goto err_req;
    *req_p = req;
    return GRAFT_OK;

err_req:
    json_decref(req);
out:
    return st;
}

static bool key_ok(const char *key)
{
    return key != NULL;
}

graft_status_t graft_etcd_range(graft_etcd_t *etcd, const char *key,
                                const graft_etcd_range_opts_t *opts,
                                graft_etcd_range_result_t *result_p)
{
    static const graft_etcd_range_opts_t defaults = {0};
    graft_status_t st = GRAFT_EINVAL;
    json_t *req = NULL, *resp = NULL;

    if (etcd == NULL || !key_ok(key) || result_p == NULL)
        goto out;
    if (opts == NULL)
        opts = &defaults;
    if (opts->limit < 0 || opts->revision < 0)
        goto out;
    st = range_request(key, opts, &req);
    if (st != GRAFT_OK)
        goto out;
    st = graft__etcd_call(etcd, "/v3/kv/range", req, &resp);
    if (st != GRAFT_OK)
        goto err_req;
    st = graft__etcd_range_decode(resp, result_p);
    if (st != GRAFT_OK)
        GRAFT_ERROR(GRAFT_MOD_ETCD, "etcd range: %s", graft_status_string(st));
    json_decref(resp);
err_req:
    json_decref(req);
out:
    return st;
}

graft_status_t graft_etcd_get(graft_etcd_t *etcd, const char *key, graft_etcd_kv_t *kv_p,
                              int64_t *revision_p)
{
    graft_etcd_range_result_t r;
    if (kv_p == NULL)
        return GRAFT_EINVAL;
    graft_status_t st = graft_etcd_range(etcd, key, NULL, &r);
    if (st != GRAFT_OK)
        return st;
    if (r.n_kvs == 0) {
        st = GRAFT_ENOTFOUND;
    } else {
        *kv_p = r.kvs[0];
        memset(&r.kvs[0], 0, sizeof(r.kvs[0]));
        if (revision_p != NULL)
            *revision_p = r.revision;
    }
    graft_etcd_range_result_clear(&r);
    return st;
}

graft_status_t graft_etcd_put(graft_etcd_t *etcd, const char *key, const void *value, size_t len,
                              int64_t lease, graft_etcd_kv_t *prev_kv_p, int64_t *revision_p)
{
    graft_status_t st = GRAFT_EINVAL;
    json_t *req = NULL, *resp = NULL;
    graft_etcd_kv_t prev = {0};
    int64_t rev = 0;

    if (etcd == NULL || !key_ok(key) || (value == NULL && len > 0) || lease < 0)
        goto out;
    st = GRAFT_ENOMEM;
    req = json_object();
    if (req == NULL)
        goto out;
    if ((st = graft__etcd_json_set_bytes(req, "key", key, strlen(key))) != GRAFT_OK ||
        (st = graft__etcd_json_set_bytes(req, "value", value ? value : "", len)) != GRAFT_OK ||
        (lease != 0 && (st = graft__etcd_json_set_int64(req, "lease", lease)) != GRAFT_OK))
        goto err_req;
    if (prev_kv_p != NULL && json_object_set_new(req, "prev_kv", json_true()) != 0) {
        st = GRAFT_ENOMEM;
        goto err_req;
    }
    st = graft__etcd_call(etcd, "/v3/kv/put", req, &resp);
    if (st != GRAFT_OK)
        goto err_req;
    st = graft__etcd_header_revision(resp, &rev);
    if (st != GRAFT_OK)
        goto err_resp;
    const json_t *p = json_object_get(resp, "prev_kv");
    if (prev_kv_p != NULL && p != NULL) {
        st = graft__etcd_kv_decode(p, &prev);
        if (st != GRAFT_OK)
            goto err_resp;
    }
    if (prev_kv_p != NULL)
        *prev_kv_p = prev;
    if (revision_p != NULL)
        *revision_p = rev;
err_resp:
    json_decref(resp);
err_req:
    json_decref(req);
out:
    return st;
}

graft_status_t graft_etcd_delete(graft_etcd_t *etcd, const char *key, bool prefix,
                                 int64_t *deleted_p, int64_t *revision_p)
{
    graft_status_t st = GRAFT_EINVAL;
    json_t *req = NULL, *resp = NULL;
    int64_t deleted = 0, rev = 0;

    if (etcd == NULL || !key_ok(key))
        goto out;
    st = GRAFT_ENOMEM;
    req = json_object();
    if (req == NULL)
        goto out;
    if ((st = graft__etcd_json_set_bytes(req, "key", key, strlen(key))) != GRAFT_OK ||
        (st = set_range_end(req, key, prefix, NULL)) != GRAFT_OK)
        goto err_req;
    st = graft__etcd_call(etcd, "/v3/kv/deleterange", req, &resp);
    if (st != GRAFT_OK)
        goto err_req;
    if ((st = graft__etcd_header_revision(resp, &rev)) != GRAFT_OK ||
        (st = graft__etcd_json_int64(resp, "deleted", &deleted)) != GRAFT_OK)
        goto err_resp;
    if (deleted_p != NULL)
        *deleted_p = deleted;
    if (revision_p != NULL)
        *revision_p = rev;
err_resp:
    json_decref(resp);
err_req:
    json_decref(req);
out:
    return st;
}

graft_status_t graft_etcd_compact(graft_etcd_t *etcd, int64_t revision)
{
    graft_status_t st = GRAFT_EINVAL;
    json_t *req = NULL, *resp = NULL;

    if (etcd == NULL || revision <= 0)
        goto out;
    st = GRAFT_ENOMEM;
    req = json_object();
    if (req == NULL)
        goto out;
    /* physical: answer only once the compaction is applied, so a watch or
     * range issued afterwards sees it. */
    if ((st = graft__etcd_json_set_int64(req, "revision", revision)) != GRAFT_OK)
        goto err_req;
    if (json_object_set_new(req, "physical", json_true()) != 0) {
        st = GRAFT_ENOMEM;
        goto err_req;
    }
    st = graft__etcd_call(etcd, "/v3/kv/compaction", req, &resp);
    json_decref(resp);
err_req:
    json_decref(req);
out:
    return st;
}

/* ------------------------------------------------------------------------ */
/* Transactions                                                             */
/* ------------------------------------------------------------------------ */

static graft_status_t compare_encode(const graft_etcd_compare_t *c, json_t **out_p)
{
    static const char *targets[] = {"VERSION", "CREATE", "MOD", "VALUE", "LEASE"};
    static const char *fields[] = {"version", "create_revision", "mod_revision", "value", "lease"};
    static const char *results[] = {"EQUAL", "GREATER", "LESS", "NOT_EQUAL"};
    graft_status_t st = GRAFT_EINVAL;
    json_t *o = NULL;

    if (!key_ok(c->key) || (unsigned)c->target >= GRAFT_ARRAY_SIZE(targets) ||
        (unsigned)c->op >= GRAFT_ARRAY_SIZE(results) ||
        (c->target == GRAFT_ETCD_CMP_VALUE && c->value == NULL && c->value_len > 0))
        goto out;
    st = GRAFT_ENOMEM;
    o = json_pack("{s:s, s:s}", "target", targets[c->target], "result", results[c->op]);
    if (o == NULL)
        goto out;
    if ((st = graft__etcd_json_set_bytes(o, "key", c->key, strlen(c->key))) != GRAFT_OK)
        goto err_o;
    if (c->target == GRAFT_ETCD_CMP_VALUE)
        st = graft__etcd_json_set_bytes(o, "value", c->value ? c->value : "", c->value_len);
    else
        st = graft__etcd_json_set_int64(o, fields[c->target], c->number);
    if (st != GRAFT_OK)
        goto err_o;
    *out_p = o;
    return GRAFT_OK;

err_o:
    json_decref(o);
out:
    return st;
}

static graft_status_t op_encode(const graft_etcd_op_t *op, json_t **out_p)
{
    graft_status_t st = GRAFT_EINVAL;
    json_t *inner = NULL, *o = NULL;
    const char *name;

    if (!key_ok(op->key))
        goto out;
    switch (op->type) {
    case GRAFT_ETCD_OP_PUT:
        name = "request_put";
        if ((op->value == NULL && op->value_len > 0) || op->lease < 0)
            goto out;
        break;
    case GRAFT_ETCD_OP_RANGE:
        name = "request_range";
        break;
    case GRAFT_ETCD_OP_DELETE:
        name = "request_delete_range";
        break;
    default:
        goto out;
    }
    st = GRAFT_ENOMEM;
    inner = json_object();
    if (inner == NULL)
        goto out;
    if ((st = graft__etcd_json_set_bytes(inner, "key", op->key, strlen(op->key))) != GRAFT_OK)
        goto err_inner;
    if (op->type == GRAFT_ETCD_OP_PUT) {
        if ((st = graft__etcd_json_set_bytes(inner, "value", op->value ? op->value : "",
                                             op->value_len)) != GRAFT_OK ||
            (op->lease != 0 &&
             (st = graft__etcd_json_set_int64(inner, "lease", op->lease)) != GRAFT_OK))
            goto err_inner;
    } else if ((st = set_range_end(inner, op->key, op->prefix, NULL)) != GRAFT_OK) {
        goto err_inner;
    }
    st = GRAFT_ENOMEM;
    if (op->type == GRAFT_ETCD_OP_RANGE && op->count_only &&
        json_object_set_new(inner, "count_only", json_true()) != 0)
        goto err_inner;
    o = json_object();
    if (o == NULL)
        goto err_inner;
    if (json_object_set_new(o, name, inner) != 0) {
        inner = NULL; /* json_object_set_new consumed it, even on failure */
        goto err_inner;
    }
    *out_p = o;
    return GRAFT_OK;

err_inner:
    json_decref(inner);
    json_decref(o);
out:
    return st;
}

static graft_status_t ops_encode(json_t *req, const char *field, const graft_etcd_op_t *ops,
                                 size_t n)
{
    if (n > 0 && ops == NULL)
        return GRAFT_EINVAL;
    json_t *arr = json_array();
    if (arr == NULL || json_object_set_new(req, field, arr) != 0)
        return GRAFT_ENOMEM;
    for (size_t i = 0; i < n; i++) {
        json_t *o = NULL;
        graft_status_t st = op_encode(&ops[i], &o);
        if (st != GRAFT_OK)
            return st;
        if (json_array_append_new(arr, o) != 0)
            return GRAFT_ENOMEM;
    }
    return GRAFT_OK;
}

void graft_etcd_txn_result_clear(graft_etcd_txn_result_t *result)
{
    if (result == NULL)
        return;
    for (size_t i = 0; i < result->n_ranges; i++)
        graft_etcd_range_result_clear(&result->ranges[i]);
    graft_free(result->ranges);
    memset(result, 0, sizeof(*result));
}

graft_status_t graft__etcd_txn_decode(const json_t *resp, const graft_etcd_op_t *ops,
                                     size_t n_ops, graft_etcd_txn_result_t *r)
{
    graft_status_t st;
    if ((st = graft__etcd_json_bool(resp, "succeeded", &r->succeeded)) != GRAFT_OK ||
        (st = graft__etcd_header_revision(resp, &r->revision)) != GRAFT_OK)
        return st;
    const json_t *arr = json_object_get(resp, "responses");
    size_t n_resp = json_is_array(arr) ? json_array_size(arr) : 0;
    if ((arr != NULL && !json_is_array(arr)) || n_resp != n_ops)
        return GRAFT_EMALFORMED;
    size_t n_ranges = 0;
    for (size_t i = 0; i < n_ops; i++)
        n_ranges += ops[i].type == GRAFT_ETCD_OP_RANGE;
    if (n_ranges == 0)
        return GRAFT_OK;
    r->ranges = graft__calloc(n_ranges, sizeof(*r->ranges));
    if (r->ranges == NULL)
        return GRAFT_ENOMEM;
    for (size_t i = 0; i < n_ops; i++) {
        if (ops[i].type != GRAFT_ETCD_OP_RANGE)
            continue;
        const json_t *rr = json_object_get(json_array_get(arr, i), "response_range");
        if (rr == NULL)
            return GRAFT_EMALFORMED;
        st = graft__etcd_range_decode(rr, &r->ranges[r->n_ranges]);
        if (st != GRAFT_OK)
            return st;
        /* Ranges inside a txn carry only a partial header; the txn's is
         * the one that counts. */
        r->ranges[r->n_ranges].revision = r->revision;
        r->n_ranges++;
    }
    return GRAFT_OK;
}

graft_status_t graft_etcd_txn(graft_etcd_t *etcd, const graft_etcd_compare_t *cmp, size_t n_cmp,
                              const graft_etcd_op_t *success, size_t n_success,
                              const graft_etcd_op_t *failure, size_t n_failure,
                              graft_etcd_txn_result_t *result_p)
{
    graft_status_t st = GRAFT_EINVAL;
    json_t *req = NULL, *resp = NULL, *arr = NULL;
    graft_etcd_txn_result_t r = {0};

    if (etcd == NULL || result_p == NULL || (n_cmp > 0 && cmp == NULL))
        goto out;
    st = GRAFT_ENOMEM;
    req = json_object();
    arr = json_array();
    if (req == NULL || arr == NULL || json_object_set(req, "compare", arr) != 0)
        goto err_req;
    for (size_t i = 0; i < n_cmp; i++) {
        json_t *c = NULL;
        if ((st = compare_encode(&cmp[i], &c)) != GRAFT_OK)
            goto err_req;
        if (json_array_append_new(arr, c) != 0) {
            st = GRAFT_ENOMEM;
            goto err_req;
        }
    }
    if ((st = ops_encode(req, "success", success, n_success)) != GRAFT_OK ||
        (st = ops_encode(req, "failure", failure, n_failure)) != GRAFT_OK)
        goto err_req;
    st = graft__etcd_call(etcd, "/v3/kv/txn", req, &resp);
    if (st != GRAFT_OK)
        goto err_req;
    bool ok = false;
    if ((st = graft__etcd_json_bool(resp, "succeeded", &ok)) != GRAFT_OK)
        goto err_resp;
    st = ok ? graft__etcd_txn_decode(resp, success, n_success, &r)
            : graft__etcd_txn_decode(resp, failure, n_failure, &r);
    if (st != GRAFT_OK) {
        GRAFT_ERROR(GRAFT_MOD_ETCD, "etcd txn: %s", graft_status_string(st));
        graft_etcd_txn_result_clear(&r);
        goto err_resp;
    }
    *result_p = r;
err_resp:
    json_decref(resp);
err_req:
    json_decref(arr);
    json_decref(req);
out:
    return st;
}

/* ------------------------------------------------------------------------ */
/* Leases                                                                   */
/* ------------------------------------------------------------------------ */

static graft_status_t lease_call(graft_etcd_t *etcd, const char *path, const char *field,
                                 int64_t value, json_t **resp_p)
{
    graft_status_t st = GRAFT_ENOMEM;
    json_t *req = json_object();
    if (req == NULL)
        goto out;
    st = graft__etcd_json_set_int64(req, field, value);
    if (st == GRAFT_OK)
        st = graft__etcd_call(etcd, path, req, resp_p);
    json_decref(req);
out:
    return st;
}

graft_status_t graft_etcd_lease_grant(graft_etcd_t *etcd, int64_t ttl_s, int64_t *lease_id_p,
                                      int64_t *ttl_p)
{
    json_t *resp = NULL;
    int64_t id = 0, ttl = 0;
    if (etcd == NULL || ttl_s <= 0 || lease_id_p == NULL)
        return GRAFT_EINVAL;
    graft_status_t st = lease_call(etcd, "/v3/lease/grant", "TTL", ttl_s, &resp);
    if (st != GRAFT_OK)
        return st;
    const json_t *err = json_object_get(resp, "error");
    if ((st = graft__etcd_json_int64(resp, "ID", &id)) != GRAFT_OK ||
        (st = graft__etcd_json_int64(resp, "TTL", &ttl)) != GRAFT_OK)
        goto out;
    if ((json_is_string(err) && json_string_length(err) > 0) || id <= 0) {
        GRAFT_ERROR(GRAFT_MOD_ETCD, "etcd lease grant: %s",
                    json_is_string(err) ? json_string_value(err) : "no lease id in the answer");
        st = id <= 0 ? GRAFT_EMALFORMED : GRAFT_EETCD;
        goto out;
    }
    *lease_id_p = id;
    if (ttl_p != NULL)
        *ttl_p = ttl;
out:
    json_decref(resp);
    return st;
}

graft_status_t graft_etcd_lease_keepalive(graft_etcd_t *etcd, int64_t lease, int64_t *ttl_p)
{
    json_t *resp = NULL;
    int64_t ttl = 0;
    if (etcd == NULL || lease <= 0)
        return GRAFT_EINVAL;
    graft_status_t st = lease_call(etcd, "/v3/lease/keepalive", "ID", lease, &resp);
    if (st != GRAFT_OK)
        return st;
    /* The keep-alive endpoint is a stream: {"result": {...}}. A lease that
     * no longer exists answers with its TTL omitted (zero). */
    const json_t *res = json_object_get(resp, "result");
    if (!json_is_object(res)) {
        st = GRAFT_EMALFORMED;
        GRAFT_ERROR(GRAFT_MOD_ETCD, "etcd lease keep-alive: answer without a result");
        goto out;
    }
    if ((st = graft__etcd_json_int64(res, "TTL", &ttl)) != GRAFT_OK)
        goto out;
    if (ttl <= 0) {
        st = GRAFT_ENOTFOUND;
        goto out;
    }
    if (ttl_p != NULL)
        *ttl_p = ttl;
out:
    json_decref(resp);
    return st;
}

graft_status_t graft_etcd_lease_revoke(graft_etcd_t *etcd, int64_t lease)
{
    json_t *resp = NULL;
    if (etcd == NULL || lease <= 0)
        return GRAFT_EINVAL;
    /* etcd 3.4.23's gateway serves both /v3/lease/revoke and the older
     * /v3/kv/lease/revoke (checked against the real server); 3.5 keeps only
     * the first. */
    graft_status_t st = lease_call(etcd, "/v3/lease/revoke", "ID", lease, &resp);
    json_decref(resp);
    return st;
}

graft_status_t graft_etcd_lease_ttl(graft_etcd_t *etcd, int64_t lease, int64_t *ttl_p,
                                    int64_t *granted_p)
{
    json_t *resp = NULL;
    int64_t ttl = 0, granted = 0;
    if (etcd == NULL || lease <= 0 || ttl_p == NULL)
        return GRAFT_EINVAL;
    graft_status_t st = lease_call(etcd, "/v3/lease/timetolive", "ID", lease, &resp);
    if (st != GRAFT_OK)
        return st;
    if ((st = graft__etcd_json_int64(resp, "TTL", &ttl)) != GRAFT_OK ||
        (st = graft__etcd_json_int64(resp, "grantedTTL", &granted)) != GRAFT_OK)
        goto out;
    /* An expired or revoked lease answers TTL -1. */
    if (ttl < 0) {
        st = GRAFT_ENOTFOUND;
        goto out;
    }
    *ttl_p = ttl;
    if (granted_p != NULL)
        *granted_p = granted;
out:
    json_decref(resp);
    return st;
}

/* ------------------------------------------------------------------------ */
/* Maintenance                                                              */
/* ------------------------------------------------------------------------ */

graft_status_t graft_etcd_member_status(graft_etcd_t *etcd, graft_etcd_member_status_t *status_p)
{
    graft_status_t st = GRAFT_EINVAL;
    json_t *req = NULL, *resp = NULL;
    graft_etcd_member_status_t ms = {0};

    if (etcd == NULL || status_p == NULL)
        goto out;
    st = GRAFT_ENOMEM;
    req = json_object();
    if (req == NULL)
        goto out;
    st = graft__etcd_call(etcd, "/v3/maintenance/status", req, &resp);
    if (st != GRAFT_OK)
        goto err_req;
    const json_t *hdr = json_object_get(resp, "header");
    if (!json_is_object(hdr) ||
        (st = graft__etcd_json_uint64(hdr, "member_id", &ms.member_id)) != GRAFT_OK ||
        (st = graft__etcd_json_uint64(resp, "leader", &ms.leader_id)) != GRAFT_OK ||
        (st = graft__etcd_json_uint64(resp, "raftTerm", &ms.raft_term)) != GRAFT_OK ||
        (st = graft__etcd_json_int64(hdr, "revision", &ms.revision)) != GRAFT_OK ||
        ms.member_id == 0) {
        GRAFT_ERROR(GRAFT_MOD_ETCD, "etcd maintenance status: unexpected answer");
        st = GRAFT_EMALFORMED;
        goto err_resp;
    }
    *status_p = ms;
err_resp:
    json_decref(resp);
err_req:
    json_decref(req);
out:
    return st;
}
