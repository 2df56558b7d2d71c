/*
 * The etcd gateway's JSON answers: a range response (with its key-values
 * and base64 fields), the header revision, an error answer, the token of
 * an authenticate answer, and a bare base64 string. Any bytes give a status; what decodes is within bounds.
 */
#include "fuzz_common.h"
#include "etcd_internal.h"

#include <assert.h>

static void check_range(const json_t *root)
{
    graft_etcd_range_result_t r;
    if (graft__etcd_range_decode(root, &r) != GRAFT_OK)
        return;
    assert(r.n_kvs == 0 || r.kvs != NULL);
    for (size_t i = 0; i < r.n_kvs; i++) {
        assert(r.kvs[i].key != NULL);
        assert(r.kvs[i].value_len == 0 || r.kvs[i].value != NULL);
    }
    graft_etcd_range_result_clear(&r);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    json_error_t jerr;
    int64_t rev = 0;
    json_t *root = json_loadb((const char *)data, size, JSON_REJECT_DUPLICATES, &jerr);
    if (root != NULL) {
        check_range(root);
        (void)graft__etcd_header_revision(root, &rev);
        graft_status_t st = graft__etcd_error_status(root, 400);
        assert(st != GRAFT_OK);
        (void)graft__etcd_error_is_bad_token(root);
        char *token = NULL;
        if (graft__etcd_auth_token_decode(root, &token) == GRAFT_OK) {
            size_t n = strlen(token);
            assert(n > 0 && n <= GRAFT_ETCD_TOKEN_MAX && strpbrk(token, " \r\n\t") == NULL);
            graft_free(token);
        }
        json_decref(root);
    }
    /* The same bytes as a base64 field. */
    uint8_t *out = NULL;
    size_t out_len = 0;
    if (graft__etcd_b64_decode((const char *)data, size, &out, &out_len) == GRAFT_OK) {
        assert(out != NULL && out[out_len] == '\0' && out_len <= size);
        graft_free(out);
    }
    return 0;
}
