/*
 * Encoding and decoding of etcd's JSON gateway messages. The gateway writes
 * int64 fields as JSON strings, omits every zero-valued field, and carries
 * keys and values as base64; each decoder here accepts exactly that and
 * answers GRAFT_EMALFORMED for anything else, leaving its outputs untouched.
 */
#include "etcd_internal.h"

#include <errno.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>

#include <openssl/evp.h>

graft_status_t graft__etcd_b64_encode(const void *data, size_t len, char **out_p)
{
    /* EVP_EncodeBlock takes an int length; etcd refuses far smaller requests. */
    if (len > (size_t)INT_MAX / 4 * 3 - 3)
        return GRAFT_ETOOLARGE;
    size_t out_len = 4 * ((len + 2) / 3);
    char *out = graft__malloc(out_len + 1);
    if (out == NULL)
        return GRAFT_ENOMEM;
    if (len == 0)
        out[0] = '\0';
    else
        EVP_EncodeBlock((unsigned char *)out, data, (int)len);
    out[out_len] = '\0';
    *out_p = out;
    return GRAFT_OK;
}

graft_status_t graft__etcd_b64_decode(const char *in, size_t in_len, uint8_t **out_p,
                                      size_t *len_p)
{
    /* The gateway always pads; EVP_DecodeBlock would silently accept a
     * truncated final group, so the length is checked first. */
    if (in_len % 4 != 0 || in_len > (size_t)INT_MAX)
        return GRAFT_EMALFORMED;
    size_t pad = 0;
    if (in_len > 0 && in[in_len - 1] == '=')
        pad++;
    if (in_len > 1 && in[in_len - 2] == '=')
        pad++;
    for (size_t i = 0; i < in_len - pad; i++) {
        char c = in[i];
        bool ok = (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') ||
                  c == '+' || c == '/';
        if (!ok)
            return GRAFT_EMALFORMED;
    }
    uint8_t *out = graft__malloc(in_len / 4 * 3 + 1);
    if (out == NULL)
        return GRAFT_ENOMEM;
    int n = in_len == 0 ? 0 : EVP_DecodeBlock(out, (const unsigned char *)in, (int)in_len);
    if (n < 0 || (size_t)n < pad) {
        graft_free(out);
        return GRAFT_EMALFORMED;
    }
    /* EVP_DecodeBlock counts the padding as zero bytes. */
    size_t len = (size_t)n - pad;
    out[len] = '\0';
    *out_p = out;
    *len_p = len;
    return GRAFT_OK;
}

graft_status_t graft__etcd_json_int64(const json_t *obj, const char *field, int64_t *value_p)
{
    const json_t *v = json_object_get(obj, field);
    if (v == NULL || json_is_null(v)) {
        *value_p = 0;
        return GRAFT_OK;
    }
    if (json_is_integer(v)) {
        *value_p = (int64_t)json_integer_value(v);
        return GRAFT_OK;
    }
    if (!json_is_string(v))
        return GRAFT_EMALFORMED;
    const char *s = json_string_value(v);
    if (s[0] == '\0' || strlen(s) != json_string_length(v))
        return GRAFT_EMALFORMED;
    char *end = NULL;
    errno = 0;
    long long n = strtoll(s, &end, 10);
    if (errno != 0 || *end != '\0' || s[0] == ' ' || s[0] == '+')
        return GRAFT_EMALFORMED;
    *value_p = (int64_t)n;
    return GRAFT_OK;
}

graft_status_t graft__etcd_json_uint64(const json_t *obj, const char *field, uint64_t *value_p)
{
    const json_t *v = json_object_get(obj, field);
    if (v == NULL || json_is_null(v)) {
        *value_p = 0;
        return GRAFT_OK;
    }
    if (json_is_integer(v) && json_integer_value(v) >= 0) {
        *value_p = (uint64_t)json_integer_value(v);
        return GRAFT_OK;
    }
    if (!json_is_string(v))
        return GRAFT_EMALFORMED;
    const char *s = json_string_value(v);
    if (s[0] < '0' || s[0] > '9' || strlen(s) != json_string_length(v))
        return GRAFT_EMALFORMED;
    char *end = NULL;
    errno = 0;
    unsigned long long n = strtoull(s, &end, 10);
    if (errno != 0 || *end != '\0')
        return GRAFT_EMALFORMED;
    *value_p = (uint64_t)n;
    return GRAFT_OK;
}

graft_status_t graft__etcd_json_bool(const json_t *obj, const char *field, bool *value_p)
{
    const json_t *v = json_object_get(obj, field);
    if (v == NULL || json_is_null(v)) {
        *value_p = false;
        return GRAFT_OK;
    }
    if (!json_is_boolean(v))
        return GRAFT_EMALFORMED;
    *value_p = json_is_true(v);
    return GRAFT_OK;
}

graft_status_t graft__etcd_json_set_bytes(json_t *obj, const char *field, const void *data,
                                          size_t len)
{
    char *b64 = NULL;
    graft_status_t st = graft__etcd_b64_encode(data, len, &b64);
    if (st != GRAFT_OK)
        return st;
    json_t *s = json_stringn(b64, strlen(b64));
    graft_free(b64);
    if (s == NULL || json_object_set_new(obj, field, s) != 0)
        return GRAFT_ENOMEM;
    return GRAFT_OK;
}

graft_status_t graft__etcd_json_set_int64(json_t *obj, const char *field, int64_t value)
{
    char num[32];
    snprintf(num, sizeof(num), "%lld", (long long)value);
    if (json_object_set_new(obj, field, json_string(num)) != 0)
        return GRAFT_ENOMEM;
    return GRAFT_OK;
}

graft_status_t graft__etcd_prefix_end(const char *prefix, char **end_p, size_t *len_p)
{
    size_t len = strlen(prefix);
    char *end = graft__malloc(len + 1);
    if (end == NULL)
        return GRAFT_ENOMEM;
    memcpy(end, prefix, len + 1);
    /* Increment the last byte that is not 0xff, dropping the 0xff tail; a
     * prefix of only 0xff bytes (or none) covers everything: "\0". */
    while (len > 0) {
        unsigned char c = (unsigned char)end[len - 1];
        if (c < 0xff) {
            end[len - 1] = (char)(c + 1);
            break;
        }
        len--;
    }
    if (len == 0) {
        end[0] = '\0';
        len = 1;
    }
    *end_p = end;
    *len_p = len;
    return GRAFT_OK;
}

static graft_status_t bytes_field(const json_t *obj, const char *field, uint8_t **out_p,
                                  size_t *len_p)
{
    const json_t *v = json_object_get(obj, field);
    if (v == NULL || json_is_null(v))
        return graft__etcd_b64_decode("", 0, out_p, len_p);
    if (!json_is_string(v))
        return GRAFT_EMALFORMED;
    return graft__etcd_b64_decode(json_string_value(v), json_string_length(v), out_p, len_p);
}

void graft_etcd_kv_clear(graft_etcd_kv_t *kv)
{
    if (kv == NULL)
        return;
    graft_free(kv->key);
    graft_free(kv->value);
    memset(kv, 0, sizeof(*kv));
}

graft_status_t graft__etcd_kv_decode(const json_t *obj, graft_etcd_kv_t *kv_p)
{
    graft_etcd_kv_t kv = {0};
    graft_status_t st = GRAFT_EMALFORMED;
    size_t key_len = 0;

    if (!json_is_object(obj))
        goto out;
    st = bytes_field(obj, "key", (uint8_t **)&kv.key, &key_len);
    if (st != GRAFT_OK)
        goto out;
    /* Keys are C strings in this API; one with a NUL inside is not ours. */
    if (strlen(kv.key) != key_len) {
        st = GRAFT_EMALFORMED;
        goto err_kv;
    }
    st = bytes_field(obj, "value", &kv.value, &kv.value_len);
    if (st != GRAFT_OK)
        goto err_kv;
    if ((st = graft__etcd_json_int64(obj, "create_revision", &kv.create_revision)) != GRAFT_OK ||
        (st = graft__etcd_json_int64(obj, "mod_revision", &kv.mod_revision)) != GRAFT_OK ||
        (st = graft__etcd_json_int64(obj, "version", &kv.version)) != GRAFT_OK ||
        (st = graft__etcd_json_int64(obj, "lease", &kv.lease)) != GRAFT_OK)
        goto err_kv;
    *kv_p = kv;
    return GRAFT_OK;

err_kv:
    graft_etcd_kv_clear(&kv);
out:
    return st;
}

void graft_etcd_range_result_clear(graft_etcd_range_result_t *result)
{
    if (result == NULL)
        return;
    for (size_t i = 0; i < result->n_kvs; i++)
        graft_etcd_kv_clear(&result->kvs[i]);
    graft_free(result->kvs);
    memset(result, 0, sizeof(*result));
}

graft_status_t graft__etcd_header_revision(const json_t *obj, int64_t *revision_p)
{
    const json_t *h = json_object_get(obj, "header");
    if (h == NULL) {
        *revision_p = 0;
        return GRAFT_OK;
    }
    if (!json_is_object(h))
        return GRAFT_EMALFORMED;
    return graft__etcd_json_int64(h, "revision", revision_p);
}

graft_status_t graft__etcd_range_decode(const json_t *obj, graft_etcd_range_result_t *result_p)
{
    graft_etcd_range_result_t r = {0};
    graft_status_t st = GRAFT_EMALFORMED;

    if (!json_is_object(obj))
        goto out;
    if ((st = graft__etcd_header_revision(obj, &r.revision)) != GRAFT_OK ||
        (st = graft__etcd_json_int64(obj, "count", &r.count)) != GRAFT_OK ||
        (st = graft__etcd_json_bool(obj, "more", &r.more)) != GRAFT_OK)
        goto out;
    const json_t *kvs = json_object_get(obj, "kvs");
    if (kvs != NULL && !json_is_null(kvs)) {
        if (!json_is_array(kvs)) {
            st = GRAFT_EMALFORMED;
            goto out;
        }
        size_t n = json_array_size(kvs);
        if (n > 0) {
            r.kvs = graft__calloc(n, sizeof(*r.kvs));
            if (r.kvs == NULL) {
                st = GRAFT_ENOMEM;
                goto out;
            }
        }
        for (size_t i = 0; i < n; i++) {
            st = graft__etcd_kv_decode(json_array_get(kvs, i), &r.kvs[i]);
            if (st != GRAFT_OK)
                goto err_result;
            r.n_kvs++;
        }
    }
    if (r.count < 0 || r.count < (int64_t)r.n_kvs) {
        /* count is omitted with count_only=false answers only when zero, so
         * a count below the kvs returned is inconsistent. */
        st = GRAFT_EMALFORMED;
        goto err_result;
    }
    *result_p = r;
    return GRAFT_OK;

err_result:
    graft_etcd_range_result_clear(&r);
out:
    return st;
}

/* gRPC status codes the gateway reports in "code". */
enum {
    GRPC_INVALID_ARGUMENT = 3,
    GRPC_DEADLINE_EXCEEDED = 4,
    GRPC_NOT_FOUND = 5,
    GRPC_PERMISSION_DENIED = 7,
    GRPC_RESOURCE_EXHAUSTED = 8,
    GRPC_FAILED_PRECONDITION = 9,
    GRPC_UNAVAILABLE = 14,
    GRPC_UNAUTHENTICATED = 16
};

static const char *error_message(const json_t *obj, int64_t *code_p)
{
    const json_t *e = json_object_get(obj, "error");
    const char *msg = NULL;
    *code_p = -1;
    /* Unary answers: {"error": "...", "message": "...", "code": n}.
     * Streams: {"error": {"grpc_code": n, "http_code": n, "message": "..."}}. */
    if (json_is_object(e)) {
        const json_t *m = json_object_get(e, "message");
        msg = json_is_string(m) ? json_string_value(m) : NULL;
        int64_t c = -1;
        if (graft__etcd_json_int64(e, "grpc_code", &c) == GRAFT_OK && c > 0)
            *code_p = c;
        return msg != NULL ? msg : "";
    }
    if (json_is_string(e))
        msg = json_string_value(e);
    const json_t *m = json_object_get(obj, "message");
    if (msg == NULL && json_is_string(m))
        msg = json_string_value(m);
    int64_t c = -1;
    if (graft__etcd_json_int64(obj, "code", &c) == GRAFT_OK && json_object_get(obj, "code"))
        *code_p = c;
    return msg != NULL ? msg : "";
}

bool graft__etcd_error_is_leaderless(const char *body, size_t len)
{
    json_error_t jerr;
    json_t *obj = json_loadb(body, len, 0, &jerr);
    bool yes = false;
    if (json_is_object(obj)) {
        int64_t code;
        const char *msg = error_message(obj, &code);
        /* "no leader", "leader changed", "request timed out, possibly due
         * to previous leader failure", and the "raft proposal dropped" a
         * follower answers a write with while it follows no one. */
        yes = strstr(msg, "leader") != NULL || strstr(msg, "proposal dropped") != NULL;
    }
    json_decref(obj);
    return yes;
}

bool graft__etcd_error_is_bad_token(const json_t *obj)
{
    int64_t code;
    const char *msg = error_message(obj, &code);
    return strstr(msg, "invalid auth token") != NULL || strstr(msg, "auth token") != NULL ||
           (code == GRPC_UNAUTHENTICATED && strstr(msg, "authentication failed") == NULL);
}

graft_status_t graft__etcd_auth_token_decode(const json_t *resp, char **token_p)
{
    const json_t *tok = json_object_get(resp, "token");
    if (!json_is_string(tok))
        return GRAFT_EMALFORMED;
    const char *t = json_string_value(tok);
    size_t len = json_string_length(tok);
    /* A NUL, a line break or another control byte would cut or split the
     * Authorization header the token is sent back in. */
    if (len == 0 || len > GRAFT_ETCD_TOKEN_MAX)
        return GRAFT_EMALFORMED;
    for (size_t i = 0; i < len; i++)
        if ((unsigned char)t[i] < 0x21 || (unsigned char)t[i] > 0x7e)
            return GRAFT_EMALFORMED;
    char *copy = graft__strdup(t);
    if (copy == NULL)
        return GRAFT_ENOMEM;
    *token_p = copy;
    return GRAFT_OK;
}

graft_status_t graft__etcd_error_status(const json_t *obj, long http_code)
{
    int64_t code = -1;
    const char *msg = json_is_object(obj) ? error_message(obj, &code) : "";

    if (strstr(msg, "too large") != NULL || strstr(msg, "larger than max") != NULL ||
        code == GRPC_RESOURCE_EXHAUSTED || http_code == 413)
        return GRAFT_ETOOLARGE;
    if (strstr(msg, "compacted") != NULL)
        return GRAFT_ECOMPACTED;
    if (strstr(msg, "authentication failed") != NULL || strstr(msg, "auth token") != NULL ||
        strstr(msg, "user name is empty") != NULL || strstr(msg, "permission denied") != NULL ||
        code == GRPC_UNAUTHENTICATED || code == GRPC_PERMISSION_DENIED || http_code == 401 ||
        http_code == 403)
        return GRAFT_EAUTH;
    if (code == GRPC_NOT_FOUND || strstr(msg, "not found") != NULL)
        return GRAFT_ENOTFOUND;
    if (code == GRPC_DEADLINE_EXCEEDED || http_code == 504)
        return GRAFT_EETCD_TIMEOUT;
    if (code == GRPC_UNAVAILABLE || http_code == 503)
        return GRAFT_EUNREACHABLE;
    if (!json_is_object(obj) || (json_object_get(obj, "error") == NULL && code < 0))
        return GRAFT_EMALFORMED;
    (void)GRPC_INVALID_ARGUMENT;
    (void)GRPC_FAILED_PRECONDITION;
    return GRAFT_EETCD;
}

void graft_etcd_events_free(graft_etcd_event_t *events, size_t n)
{
    if (events == NULL)
        return;
    for (size_t i = 0; i < n; i++)
        graft_etcd_kv_clear(&events[i].kv);
    graft_free(events);
}

void graft__etcd_watch_msg_clear(graft_etcd_watch_msg_t *msg)
{
    if (msg == NULL)
        return;
    graft_etcd_events_free(msg->events, msg->n_events);
    memset(msg, 0, sizeof(*msg));
}

static graft_status_t events_decode(const json_t *arr, graft_etcd_watch_msg_t *m)
{
    if (arr == NULL || json_is_null(arr))
        return GRAFT_OK;
    if (!json_is_array(arr))
        return GRAFT_EMALFORMED;
    size_t n = json_array_size(arr);
    if (n == 0)
        return GRAFT_OK;
    m->events = graft__calloc(n, sizeof(*m->events));
    if (m->events == NULL)
        return GRAFT_ENOMEM;
    for (size_t i = 0; i < n; i++) {
        const json_t *ev = json_array_get(arr, i);
        if (!json_is_object(ev))
            return GRAFT_EMALFORMED;
        const json_t *type = json_object_get(ev, "type");
        graft_etcd_event_type_t t;
        /* PUT is enum value 0, so the gateway omits it. */
        if (type == NULL || (json_is_string(type) && strcmp(json_string_value(type), "PUT") == 0) ||
            (json_is_integer(type) && json_integer_value(type) == 0))
            t = GRAFT_ETCD_EVENT_PUT;
        else if ((json_is_string(type) && strcmp(json_string_value(type), "DELETE") == 0) ||
                 (json_is_integer(type) && json_integer_value(type) == 1))
            t = GRAFT_ETCD_EVENT_DELETE;
        else
            return GRAFT_EMALFORMED;
        graft_status_t st = graft__etcd_kv_decode(json_object_get(ev, "kv"), &m->events[i].kv);
        if (st != GRAFT_OK)
            return st;
        m->events[i].type = t;
        m->n_events++;
        /* Events within a message come in revision order; anything else
         * would break the no-duplicate bookkeeping of the watch. */
        if (i > 0 && m->events[i].kv.mod_revision < m->events[i - 1].kv.mod_revision)
            return GRAFT_EMALFORMED;
        if (m->events[i].kv.mod_revision <= 0)
            return GRAFT_EMALFORMED;
    }
    return GRAFT_OK;
}

graft_status_t graft__etcd_watch_msg_decode(const char *line, size_t len,
                                            graft_etcd_watch_msg_t *msg_p)
{
    graft_etcd_watch_msg_t m = {0};
    graft_status_t st = GRAFT_EMALFORMED;
    json_error_t jerr;
    json_t *root = json_loadb(line, len, JSON_REJECT_DUPLICATES, &jerr);
    if (root == NULL || !json_is_object(root))
        goto out;
    if (json_object_get(root, "error") != NULL) {
        m.kind = GRAFT_ETCD_WATCH_MSG_ERROR;
        m.error = graft__etcd_error_status(root, 0);
        m.bad_token = graft__etcd_error_is_bad_token(root);
        st = GRAFT_OK;
        goto done;
    }
    const json_t *res = json_object_get(root, "result");
    if (!json_is_object(res))
        goto out;
    bool created = false, canceled = false;
    if ((st = graft__etcd_header_revision(res, &m.header_revision)) != GRAFT_OK ||
        (st = graft__etcd_json_bool(res, "created", &created)) != GRAFT_OK ||
        (st = graft__etcd_json_bool(res, "canceled", &canceled)) != GRAFT_OK ||
        (st = graft__etcd_json_int64(res, "compact_revision", &m.compact_revision)) != GRAFT_OK)
        goto out;
    if (canceled) {
        m.kind = GRAFT_ETCD_WATCH_MSG_CANCELED;
    } else if (created) {
        m.kind = GRAFT_ETCD_WATCH_MSG_CREATED;
    } else {
        m.kind = GRAFT_ETCD_WATCH_MSG_EVENTS;
        st = events_decode(json_object_get(res, "events"), &m);
        if (st != GRAFT_OK)
            goto err_msg;
    }
    st = GRAFT_OK;
done:
    *msg_p = m;
    json_decref(root);
    return st;

err_msg:
    graft__etcd_watch_msg_clear(&m);
out:
    json_decref(root);
    if (st == GRAFT_OK)
        st = GRAFT_EMALFORMED;
    return st;
}
