/* Decoders of the etcd JSON gateway's messages, fed well-formed and
 * malformed input, and starved of memory one allocation at a time. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "alloc_fail.h"

#include <stdlib.h>
#include <string.h>

#include "etcd/etcd_internal.h"

static json_t *parse(const char *s)
{
    json_error_t e;
    json_t *j = json_loads(s, 0, &e);
    if (j == NULL)
        fail_msg("test JSON does not parse: %s: %s", s, e.text);
    return j;
}

static void test_base64(void **state)
{
    (void)state;
    char *enc = NULL;
    uint8_t *dec = NULL;
    size_t len = 0;
    const uint8_t bin[] = {0, 0xff, 0x10, 'a', 0};
    for (size_t n = 0; n <= sizeof(bin); n++) {
        assert_int_equal(graft__etcd_b64_encode(bin, n, &enc), GRAFT_OK);
        assert_int_equal(strlen(enc) % 4, 0);
        assert_int_equal(graft__etcd_b64_decode(enc, strlen(enc), &dec, &len), GRAFT_OK);
        assert_int_equal(len, n);
        if (n > 0)
            assert_memory_equal(dec, bin, n);
        assert_int_equal(dec[len], 0);
        graft_free(enc);
        graft_free(dec);
    }
    assert_int_equal(graft__etcd_b64_decode("Zm9v", 4, &dec, &len), GRAFT_OK);
    assert_string_equal((char *)dec, "foo");
    graft_free(dec);
    const char *bad[] = {"Zm9", "Zm9v!", "Zm 9v", "====", "Zm=v", "Z===", "Zm9v\n"};
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++)
        assert_int_equal(graft__etcd_b64_decode(bad[i], strlen(bad[i]), &dec, &len),
                         GRAFT_EMALFORMED);
}

static void test_int64_fields(void **state)
{
    (void)state;
    json_t *j = parse("{\"s\":\"-12\",\"i\":34,\"big\":\"9223372036854775807\","
                      "\"over\":\"9223372036854775808\",\"x\":\"12x\",\"e\":\"\",\"f\":1.5,"
                      "\"b\":true,\"n\":null,\"plus\":\"+1\",\"sp\":\" 1\"}");
    int64_t v = 99;
    assert_int_equal(graft__etcd_json_int64(j, "s", &v), GRAFT_OK);
    assert_int_equal(v, -12);
    assert_int_equal(graft__etcd_json_int64(j, "i", &v), GRAFT_OK);
    assert_int_equal(v, 34);
    assert_int_equal(graft__etcd_json_int64(j, "big", &v), GRAFT_OK);
    assert_true(v == INT64_MAX);
    assert_int_equal(graft__etcd_json_int64(j, "absent", &v), GRAFT_OK);
    assert_int_equal(v, 0);
    assert_int_equal(graft__etcd_json_int64(j, "n", &v), GRAFT_OK);
    assert_int_equal(v, 0);
    const char *bad[] = {"over", "x", "e", "f", "b", "plus", "sp"};
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        v = 5;
        assert_int_equal(graft__etcd_json_int64(j, bad[i], &v), GRAFT_EMALFORMED);
        assert_int_equal(v, 5);
    }
    bool b = true;
    assert_int_equal(graft__etcd_json_bool(j, "absent", &b), GRAFT_OK);
    assert_false(b);
    assert_int_equal(graft__etcd_json_bool(j, "b", &b), GRAFT_OK);
    assert_true(b);
    assert_int_equal(graft__etcd_json_bool(j, "s", &b), GRAFT_EMALFORMED);
    json_decref(j);
}

static void test_prefix_end(void **state)
{
    (void)state;
    char *end = NULL;
    size_t len = 0;
    assert_int_equal(graft__etcd_prefix_end("/a/", &end, &len), GRAFT_OK);
    assert_int_equal(len, 3);
    assert_memory_equal(end, "/a0", 3);
    graft_free(end);
    assert_int_equal(graft__etcd_prefix_end("a\xff\xff", &end, &len), GRAFT_OK);
    assert_int_equal(len, 1);
    assert_int_equal(end[0], 'b');
    graft_free(end);
    assert_int_equal(graft__etcd_prefix_end("", &end, &len), GRAFT_OK);
    assert_int_equal(len, 1);
    assert_int_equal(end[0], 0);
    graft_free(end);
}

static const char *RANGE_OK =
    "{\"header\":{\"revision\":\"9\"},\"count\":\"3\",\"more\":true,\"kvs\":["
    "{\"key\":\"YQ==\",\"value\":\"MQ==\",\"create_revision\":\"2\",\"mod_revision\":\"5\","
    "\"version\":\"2\",\"lease\":\"77\"},"
    "{\"key\":\"Yg==\",\"create_revision\":\"3\",\"mod_revision\":\"3\",\"version\":\"1\"}]}";

static void test_range_decode(void **state)
{
    (void)state;
    json_t *j = parse(RANGE_OK);
    graft_etcd_range_result_t r;
    assert_int_equal(graft__etcd_range_decode(j, &r), GRAFT_OK);
    assert_int_equal(r.revision, 9);
    assert_int_equal(r.count, 3);
    assert_true(r.more);
    assert_int_equal(r.n_kvs, 2);
    assert_string_equal(r.kvs[0].key, "a");
    assert_string_equal((char *)r.kvs[0].value, "1");
    assert_int_equal(r.kvs[0].lease, 77);
    assert_int_equal(r.kvs[0].version, 2);
    assert_int_equal(r.kvs[1].value_len, 0);
    assert_non_null(r.kvs[1].value);
    graft_etcd_range_result_clear(&r);
    graft_etcd_range_result_clear(NULL);
    json_decref(j);

    /* An empty answer: everything omitted. */
    j = parse("{\"header\":{}}");
    assert_int_equal(graft__etcd_range_decode(j, &r), GRAFT_OK);
    assert_int_equal(r.n_kvs, 0);
    assert_int_equal(r.revision, 0);
    graft_etcd_range_result_clear(&r);
    json_decref(j);

    const char *bad[] = {
        "{\"kvs\":{}}",
        "{\"kvs\":[1]}",
        "{\"kvs\":[{\"key\":5}],\"count\":\"1\"}",
        "{\"kvs\":[{\"key\":\"YQ==\",\"version\":\"x\"}],\"count\":\"1\"}",
        "{\"kvs\":[{\"key\":\"YQ==\"},{\"key\":\"%%%%\"}],\"count\":\"2\"}",
        "{\"kvs\":[{\"key\":\"YQBi\"}],\"count\":\"1\"}", /* NUL inside a key */
        "{\"kvs\":[{\"key\":\"YQ==\"}],\"count\":\"0\"}", /* fewer counted than sent */
        "{\"header\":[],\"count\":\"0\"}",
        "{\"count\":\"-1\"}",
        "{\"more\":\"yes\"}",
    };
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        j = parse(bad[i]);
        memset(&r, 0x5a, sizeof(r));
        if (graft__etcd_range_decode(j, &r) != GRAFT_EMALFORMED)
            fail_msg("accepted: %s", bad[i]);
        json_decref(j);
    }
    assert_int_equal(graft__etcd_range_decode(NULL, &r), GRAFT_EMALFORMED);
}

static void test_error_mapping(void **state)
{
    (void)state;
    static const struct {
        const char *json;
        long http;
        graft_status_t want;
    } cases[] = {
        {"{\"error\":\"etcdserver: request is too large\",\"code\":3}", 400, GRAFT_ETOOLARGE},
        {"{\"error\":\"grpc: received message larger than max (3 vs. 2)\",\"code\":8}", 429,
         GRAFT_ETOOLARGE},
        {"{\"error\":\"etcdserver: mvcc: required revision has been compacted\",\"code\":11}", 400,
         GRAFT_ECOMPACTED},
        {"{\"error\":\"etcdserver: mvcc: required revision is a future revision\",\"code\":11}",
         400, GRAFT_EETCD},
        {"{\"error\":\"etcdserver: requested lease not found\",\"code\":5}", 404,
         GRAFT_ENOTFOUND},
        {"{\"error\":\"etcdserver: authentication failed, invalid user ID or password\","
         "\"code\":3}",
         400, GRAFT_EAUTH},
        {"{\"error\":\"etcdserver: invalid auth token\",\"code\":16}", 401, GRAFT_EAUTH},
        {"{\"error\":\"etcdserver: permission denied\",\"code\":7}", 403, GRAFT_EAUTH},
        {"{\"error\":\"etcdserver: user name is empty\",\"code\":3}", 400, GRAFT_EAUTH},
        {"{\"error\":\"context deadline exceeded\",\"code\":4}", 504, GRAFT_EETCD_TIMEOUT},
        {"{\"error\":\"etcdserver: no leader\",\"code\":14}", 503, GRAFT_EUNREACHABLE},
        {"{\"error\":\"etcdserver: duplicate key given in txn request\",\"code\":3}", 400,
         GRAFT_EETCD},
        {"{\"error\":{\"grpc_code\":11,\"http_code\":400,\"message\":\"etcdserver: mvcc: "
         "required revision has been compacted\"}}",
         0, GRAFT_ECOMPACTED},
        {"{\"something\":\"else\"}", 500, GRAFT_EMALFORMED},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        json_t *j = parse(cases[i].json);
        graft_status_t st = graft__etcd_error_status(j, cases[i].http);
        if (st != cases[i].want)
            fail_msg("%s -> %s, want %s", cases[i].json, graft_status_name(st),
                     graft_status_name(cases[i].want));
        json_decref(j);
    }
    json_t *j = parse("{\"error\":\"etcdserver: invalid auth token\",\"code\":16}");
    assert_true(graft__etcd_error_is_bad_token(j));
    json_decref(j);
    j = parse("{\"error\":\"etcdserver: authentication failed, invalid user ID or password\"}");
    assert_false(graft__etcd_error_is_bad_token(j));
    json_decref(j);
}

/* The authenticate answer's token goes back in an HTTP header: only a
 * non-empty run of printable ASCII is taken. */
static void test_auth_token(void **state)
{
    static const struct {
        const char *json;
        graft_status_t st;
    } cases[] = {
        {"{\"token\": \"abc.DEF_123\"}", GRAFT_OK},
        {"{}", GRAFT_EMALFORMED},
        {"{\"token\": 7}", GRAFT_EMALFORMED},
        {"{\"token\": \"\"}", GRAFT_EMALFORMED},
        {"{\"token\": \"a\\r\\nX-Injected: 1\"}", GRAFT_EMALFORMED},
        {"{\"token\": \"a b\"}", GRAFT_EMALFORMED},
        {"{\"token\": \"caf\\u00e9\"}", GRAFT_EMALFORMED},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        json_t *j = parse(cases[i].json);
        char *t = NULL;
        assert_int_equal(graft__etcd_auth_token_decode(j, &t), cases[i].st);
        if (cases[i].st == GRAFT_OK) {
            assert_string_equal(t, "abc.DEF_123");
            graft_free(t);
        } else {
            assert_null(t);
        }
        json_decref(j);
    }
    /* One byte over the bound is refused, the bound itself taken. */
    char *big = malloc(GRAFT_ETCD_TOKEN_MAX + 2);
    assert_non_null(big);
    for (size_t n = GRAFT_ETCD_TOKEN_MAX; n <= GRAFT_ETCD_TOKEN_MAX + 1; n++) {
        memset(big, 'x', n);
        big[n] = '\0';
        json_t *j = json_pack("{s:s}", "token", big);
        char *t = NULL;
        assert_int_equal(graft__etcd_auth_token_decode(j, &t),
                         n == GRAFT_ETCD_TOKEN_MAX ? GRAFT_OK : GRAFT_EMALFORMED);
        graft_free(t);
        json_decref(j);
    }
    free(big);
}

static void test_watch_messages(void **state)
{
    (void)state;
    graft_etcd_watch_msg_t m;
#define DEC(s) graft__etcd_watch_msg_decode(s, strlen(s), &m)
    assert_int_equal(DEC("{\"result\":{\"header\":{\"revision\":\"12\"},\"created\":true}}"),
                     GRAFT_OK);
    assert_int_equal(m.kind, GRAFT_ETCD_WATCH_MSG_CREATED);
    assert_int_equal(m.header_revision, 12);
    graft__etcd_watch_msg_clear(&m);

    assert_int_equal(DEC("{\"result\":{\"header\":{\"revision\":\"14\"},\"events\":["
                         "{\"kv\":{\"key\":\"YQ==\",\"value\":\"MQ==\",\"mod_revision\":\"13\"}},"
                         "{\"type\":\"DELETE\",\"kv\":{\"key\":\"Yg==\",\"mod_revision\":\"14\"}}"
                         "]}}"),
                     GRAFT_OK);
    assert_int_equal(m.kind, GRAFT_ETCD_WATCH_MSG_EVENTS);
    assert_int_equal(m.n_events, 2);
    assert_int_equal(m.events[0].type, GRAFT_ETCD_EVENT_PUT);
    assert_int_equal(m.events[1].type, GRAFT_ETCD_EVENT_DELETE);
    assert_string_equal(m.events[1].kv.key, "b");
    assert_int_equal(m.events[1].kv.mod_revision, 14);
    graft__etcd_watch_msg_clear(&m);

    assert_int_equal(DEC("{\"result\":{\"canceled\":true,\"compact_revision\":\"7\"}}"),
                     GRAFT_OK);
    assert_int_equal(m.kind, GRAFT_ETCD_WATCH_MSG_CANCELED);
    assert_int_equal(m.compact_revision, 7);
    graft__etcd_watch_msg_clear(&m);

    assert_int_equal(DEC("{\"error\":{\"grpc_code\":16,\"message\":\"etcdserver: invalid auth "
                         "token\"}}"),
                     GRAFT_OK);
    assert_int_equal(m.kind, GRAFT_ETCD_WATCH_MSG_ERROR);
    assert_int_equal(m.error, GRAFT_EAUTH);
    assert_true(m.bad_token);
    graft__etcd_watch_msg_clear(&m);

    /* progress notification: no events */
    assert_int_equal(DEC("{\"result\":{\"header\":{\"revision\":\"20\"}}}"), GRAFT_OK);
    assert_int_equal(m.kind, GRAFT_ETCD_WATCH_MSG_EVENTS);
    assert_int_equal(m.n_events, 0);
    graft__etcd_watch_msg_clear(&m);

    const char *bad[] = {
        "",
        "{",
        "[]",
        "{\"result\":{\"header\":{\"revision\":\"1\"},\"created\":true}} trailing",
        "{\"result\":5}",
        "{\"nothing\":{}}",
        "{\"result\":{\"events\":{}}}",
        "{\"result\":{\"events\":[5]}}",
        "{\"result\":{\"events\":[{\"type\":\"EXPLODE\",\"kv\":{\"key\":\"YQ==\","
        "\"mod_revision\":\"1\"}}]}}",
        "{\"result\":{\"events\":[{\"kv\":{\"key\":\"YQ==\"}}]}}", /* no revision */
        "{\"result\":{\"events\":[{\"kv\":{\"key\":\"YQ==\",\"mod_revision\":\"5\"}},"
        "{\"kv\":{\"key\":\"YQ==\",\"mod_revision\":\"4\"}}]}}", /* out of order */
        "{\"result\":{\"events\":[{\"kv\":{\"key\":\"Y\",\"mod_revision\":\"5\"}}]}}",
        "{\"result\":{\"created\":\"yes\"}}",
        "{\"result\":{\"compact_revision\":{}}}",
        "{\"result\":{},\"result\":{}}",
    };
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        if (graft__etcd_watch_msg_decode(bad[i], strlen(bad[i]), &m) != GRAFT_EMALFORMED)
            fail_msg("accepted: %s", bad[i]);
    }
#undef DEC
}

/* Allocation failure torture: fail the n-th allocation for every n until
 * the decoder succeeds; each failure must be clean (ASan checks leaks). */

static void test_alloc_failures(void **state)
{
    (void)state;
    json_t *j = parse(RANGE_OK);
    int n;
    for (n = 0; n < 100; n++) {
        graft_test_alloc_fail_after(n);
        graft_etcd_range_result_t r;
        graft_status_t st = graft__etcd_range_decode(j, &r);
        graft_test_alloc_restore();
        if (st == GRAFT_OK) {
            assert_int_equal(r.n_kvs, 2);
            graft_etcd_range_result_clear(&r);
            break;
        }
        assert_int_equal(st, GRAFT_ENOMEM);
    }
    assert_true(n > 0 && n < 100);
    json_decref(j);

    const char *line = "{\"result\":{\"events\":["
                       "{\"kv\":{\"key\":\"YQ==\",\"value\":\"MQ==\",\"mod_revision\":\"13\"}},"
                       "{\"type\":\"DELETE\",\"kv\":{\"key\":\"Yg==\",\"mod_revision\":\"14\"}}]}}";
    for (n = 0; n < 100; n++) {
        graft_test_alloc_fail_after(n);
        graft_etcd_watch_msg_t m;
        graft_status_t st = graft__etcd_watch_msg_decode(line, strlen(line), &m);
        graft_test_alloc_restore();
        if (st == GRAFT_OK) {
            assert_int_equal(m.n_events, 2);
            graft__etcd_watch_msg_clear(&m);
            break;
        }
        assert_int_equal(st, GRAFT_ENOMEM);
    }
    assert_true(n > 0 && n < 100);

    /* Client creation under memory pressure. */
    const char *eps[] = {"http://127.0.0.1:1", "http://127.0.0.1:2"};
    graft_etcd_config_t c = {.endpoints = eps, .n_endpoints = 2, .username = "u",
                             .password = "p", .ca_file = "/ca"};
    for (n = 0; n < 100; n++) {
        graft_test_alloc_fail_after(n);
        graft_etcd_t *e = NULL;
        graft_status_t st = graft_etcd_create(&c, &e);
        graft_test_alloc_restore();
        if (st == GRAFT_OK) {
            graft_etcd_destroy(e);
            break;
        }
        assert_int_equal(st, GRAFT_ENOMEM);
        assert_null(e);
    }
    assert_true(n > 0 && n < 100);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_base64),
        cmocka_unit_test(test_int64_fields),
        cmocka_unit_test(test_prefix_end),
        cmocka_unit_test(test_range_decode),
        cmocka_unit_test(test_error_mapping),
        cmocka_unit_test(test_auth_token),
        cmocka_unit_test(test_watch_messages),
        cmocka_unit_test(test_alloc_failures),
    };
    return cmocka_run_group_tests_name("etcd_json", tests, NULL, NULL);
}
