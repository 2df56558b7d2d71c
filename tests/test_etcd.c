/* The etcd client against a real etcd (Debian's, started by the test). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <netinet/in.h>
#include <arpa/inet.h>
#include <unistd.h>
#include <time.h>

#include <graft/etcd.h>

#include "etcd_fixture.h"

static graft_test_etcd_t T;

static int group_setup(void **state)
{
    (void)state;
    return graft_test_etcd_start(&T, NULL);
}

static int group_teardown(void **state)
{
    (void)state;
    graft_test_etcd_stop(&T);
    return 0;
}

static void put_str(const char *key, const char *value, int64_t lease, int64_t *rev_p)
{
    assert_int_equal(graft_etcd_put(T.client, key, value, strlen(value), lease, NULL, rev_p),
                     GRAFT_OK);
}

static void test_put_get_delete(void **state)
{
    (void)state;
    graft_etcd_kv_t kv;
    int64_t rev1 = 0, rev2 = 0, rev = 0;
    assert_int_equal(graft_etcd_get(T.client, "/t/kv/a", &kv, NULL), GRAFT_ENOTFOUND);
    put_str("/t/kv/a", "one", 0, &rev1);
    assert_true(rev1 > 0);
    assert_int_equal(graft_etcd_get(T.client, "/t/kv/a", &kv, &rev), GRAFT_OK);
    assert_string_equal(kv.key, "/t/kv/a");
    assert_int_equal(kv.value_len, 3);
    assert_memory_equal(kv.value, "one", 3);
    assert_int_equal(kv.value[3], 0);
    assert_int_equal(kv.create_revision, rev1);
    assert_int_equal(kv.mod_revision, rev1);
    assert_int_equal(kv.version, 1);
    assert_int_equal(kv.lease, 0);
    assert_int_equal(rev, rev1);
    graft_etcd_kv_clear(&kv);

    /* prev_kv, binary values with NUL bytes, empty values */
    graft_etcd_kv_t prev;
    const uint8_t bin[] = {0, 1, 2, 0xff, 0, 'x'};
    assert_int_equal(graft_etcd_put(T.client, "/t/kv/a", bin, sizeof(bin), 0, &prev, &rev2),
                     GRAFT_OK);
    assert_true(rev2 > rev1);
    assert_non_null(prev.key);
    assert_memory_equal(prev.value, "one", 3);
    graft_etcd_kv_clear(&prev);
    assert_int_equal(graft_etcd_get(T.client, "/t/kv/a", &kv, NULL), GRAFT_OK);
    assert_int_equal(kv.value_len, sizeof(bin));
    assert_memory_equal(kv.value, bin, sizeof(bin));
    assert_int_equal(kv.version, 2);
    assert_int_equal(kv.create_revision, rev1);
    graft_etcd_kv_clear(&kv);
    assert_int_equal(graft_etcd_put(T.client, "/t/kv/new", NULL, 0, 0, &prev, NULL), GRAFT_OK);
    assert_null(prev.key);
    assert_int_equal(graft_etcd_get(T.client, "/t/kv/new", &kv, NULL), GRAFT_OK);
    assert_int_equal(kv.value_len, 0);
    graft_etcd_kv_clear(&kv);

    int64_t deleted = -1;
    assert_int_equal(graft_etcd_delete(T.client, "/t/kv/a", false, &deleted, &rev), GRAFT_OK);
    assert_int_equal(deleted, 1);
    assert_true(rev > rev2);
    assert_int_equal(graft_etcd_delete(T.client, "/t/kv/a", false, &deleted, NULL), GRAFT_OK);
    assert_int_equal(deleted, 0);
    assert_int_equal(graft_etcd_get(T.client, "/t/kv/a", &kv, NULL), GRAFT_ENOTFOUND);

    /* invalid arguments */
    assert_int_equal(graft_etcd_put(T.client, NULL, "x", 1, 0, NULL, NULL), GRAFT_EINVAL);
    assert_int_equal(graft_etcd_put(T.client, "/t/x", NULL, 1, 0, NULL, NULL), GRAFT_EINVAL);
    assert_int_equal(graft_etcd_get(NULL, "/t/x", &kv, NULL), GRAFT_EINVAL);
}

static void test_range_options(void **state)
{
    (void)state;
    char key[64], val[64];
    int64_t rev_mid = 0;
    for (int i = 0; i < 10; i++) {
        snprintf(key, sizeof(key), "/t/range/k%02d", i);
        snprintf(val, sizeof(val), "v%d", i);
        put_str(key, val, 0, i == 4 ? &rev_mid : NULL);
    }
    put_str("/t/rangeX", "outside", 0, NULL);
    put_str("/t/range/k00", "changed", 0, NULL);

    graft_etcd_range_result_t r;
    graft_etcd_range_opts_t o = {.prefix = true};
    assert_int_equal(graft_etcd_range(T.client, "/t/range/", &o, &r), GRAFT_OK);
    assert_int_equal(r.n_kvs, 10);
    assert_int_equal(r.count, 10);
    assert_false(r.more);
    assert_string_equal(r.kvs[0].key, "/t/range/k00");
    assert_string_equal((char *)r.kvs[0].value, "changed");
    assert_string_equal(r.kvs[9].key, "/t/range/k09");
    graft_etcd_range_result_clear(&r);

    o.limit = 3;
    assert_int_equal(graft_etcd_range(T.client, "/t/range/", &o, &r), GRAFT_OK);
    assert_int_equal(r.n_kvs, 3);
    assert_int_equal(r.count, 10);
    assert_true(r.more);
    graft_etcd_range_result_clear(&r);

    o = (graft_etcd_range_opts_t){.prefix = true, .count_only = true};
    assert_int_equal(graft_etcd_range(T.client, "/t/range/", &o, &r), GRAFT_OK);
    assert_int_equal(r.n_kvs, 0);
    assert_int_equal(r.count, 10);
    graft_etcd_range_result_clear(&r);

    o = (graft_etcd_range_opts_t){.prefix = true, .keys_only = true};
    assert_int_equal(graft_etcd_range(T.client, "/t/range/", &o, &r), GRAFT_OK);
    assert_int_equal(r.n_kvs, 10);
    assert_int_equal(r.kvs[3].value_len, 0);
    assert_string_equal(r.kvs[3].key, "/t/range/k03");
    graft_etcd_range_result_clear(&r);

    /* At an old revision: k05.. did not exist, k00 had its first value. */
    o = (graft_etcd_range_opts_t){.prefix = true, .revision = rev_mid};
    assert_int_equal(graft_etcd_range(T.client, "/t/range/", &o, &r), GRAFT_OK);
    assert_int_equal(r.n_kvs, 5);
    assert_string_equal((char *)r.kvs[0].value, "v0");
    graft_etcd_range_result_clear(&r);

    /* explicit [key, range_end) */
    o = (graft_etcd_range_opts_t){.range_end = "/t/range/k05"};
    assert_int_equal(graft_etcd_range(T.client, "/t/range/k02", &o, &r), GRAFT_OK);
    assert_int_equal(r.n_kvs, 3);
    graft_etcd_range_result_clear(&r);

    /* absent key is not an error */
    assert_int_equal(graft_etcd_range(T.client, "/t/none", NULL, &r), GRAFT_OK);
    assert_int_equal(r.n_kvs, 0);
    assert_int_equal(r.count, 0);
    assert_true(r.revision > 0);
    graft_etcd_range_result_clear(&r);

    /* a future revision is an etcd error, not a crash */
    o = (graft_etcd_range_opts_t){.revision = 1000000};
    assert_int_equal(graft_etcd_range(T.client, "/t/none", &o, &r), GRAFT_EETCD);

    int64_t deleted = 0;
    assert_int_equal(graft_etcd_delete(T.client, "/t/range/", true, &deleted, NULL), GRAFT_OK);
    assert_int_equal(deleted, 10);
    graft_etcd_kv_t kv;
    assert_int_equal(graft_etcd_get(T.client, "/t/rangeX", &kv, NULL), GRAFT_OK);
    graft_etcd_kv_clear(&kv);
}

static void test_txn(void **state)
{
    (void)state;
    graft_etcd_txn_result_t r;
    graft_etcd_compare_t absent = {.key = "/t/txn/k", .target = GRAFT_ETCD_CMP_CREATE,
                                   .op = GRAFT_ETCD_CMP_EQUAL, .number = 0};
    graft_etcd_op_t put = {.type = GRAFT_ETCD_OP_PUT, .key = "/t/txn/k", .value = "first",
                           .value_len = 5};
    graft_etcd_op_t get = {.type = GRAFT_ETCD_OP_RANGE, .key = "/t/txn/k"};
    assert_int_equal(graft_etcd_txn(T.client, &absent, 1, &put, 1, &get, 1, &r), GRAFT_OK);
    assert_true(r.succeeded);
    assert_int_equal(r.n_ranges, 0);
    int64_t created_at = r.revision;
    graft_etcd_txn_result_clear(&r);

    assert_int_equal(graft_etcd_txn(T.client, &absent, 1, &put, 1, &get, 1, &r), GRAFT_OK);
    assert_false(r.succeeded);
    assert_int_equal(r.n_ranges, 1);
    assert_int_equal(r.ranges[0].n_kvs, 1);
    assert_string_equal((char *)r.ranges[0].kvs[0].value, "first");
    assert_int_equal(r.ranges[0].kvs[0].create_revision, created_at);
    graft_etcd_txn_result_clear(&r);

    /* compare on value, version, mod revision; several ops */
    graft_etcd_compare_t cmps[] = {
        {.key = "/t/txn/k", .target = GRAFT_ETCD_CMP_VALUE, .op = GRAFT_ETCD_CMP_EQUAL,
         .value = "first", .value_len = 5},
        {.key = "/t/txn/k", .target = GRAFT_ETCD_CMP_VERSION, .op = GRAFT_ETCD_CMP_EQUAL,
         .number = 1},
        {.key = "/t/txn/k", .target = GRAFT_ETCD_CMP_MOD, .op = GRAFT_ETCD_CMP_LESS,
         .number = created_at + 1},
        {.key = "/t/txn/k", .target = GRAFT_ETCD_CMP_LEASE, .op = GRAFT_ETCD_CMP_EQUAL,
         .number = 0},
    };
    graft_etcd_op_t ops[] = {
        {.type = GRAFT_ETCD_OP_PUT, .key = "/t/txn/k", .value = "second", .value_len = 6},
        {.type = GRAFT_ETCD_OP_PUT, .key = "/t/txn/other", .value = "o", .value_len = 1},
        {.type = GRAFT_ETCD_OP_RANGE, .key = "/t/txn/", .prefix = true},
        {.type = GRAFT_ETCD_OP_DELETE, .key = "/t/txn/gone"},
        {.type = GRAFT_ETCD_OP_RANGE, .key = "/t/txn/", .prefix = true},
    };
    assert_int_equal(graft_etcd_txn(T.client, cmps, 4, ops, 5, NULL, 0, &r), GRAFT_OK);
    assert_true(r.succeeded);
    assert_int_equal(r.n_ranges, 2);
    assert_int_equal(r.ranges[0].n_kvs, 2);
    assert_int_equal(r.ranges[1].n_kvs, 2);
    assert_string_equal((char *)r.ranges[1].kvs[0].value, "second");
    graft_etcd_txn_result_clear(&r);

    /* The same compares now fail (value and version changed). */
    assert_int_equal(graft_etcd_txn(T.client, cmps, 2, ops, 1, NULL, 0, &r), GRAFT_OK);
    assert_false(r.succeeded);
    assert_int_equal(r.n_ranges, 0);
    graft_etcd_txn_result_clear(&r);

    graft_etcd_compare_t ne = {.key = "/t/txn/k", .target = GRAFT_ETCD_CMP_VERSION,
                               .op = GRAFT_ETCD_CMP_GREATER, .number = 1};
    assert_int_equal(graft_etcd_txn(T.client, &ne, 1, NULL, 0, NULL, 0, &r), GRAFT_OK);
    assert_true(r.succeeded);
    graft_etcd_txn_result_clear(&r);

    /* bad arguments */
    graft_etcd_compare_t bad = {.key = "/t/txn/k", .target = (graft_etcd_cmp_target_t)99};
    assert_int_equal(graft_etcd_txn(T.client, &bad, 1, NULL, 0, NULL, 0, &r), GRAFT_EINVAL);
    graft_etcd_op_t badop = {.type = (graft_etcd_op_type_t)7, .key = "x"};
    assert_int_equal(graft_etcd_txn(T.client, NULL, 0, &badop, 1, NULL, 0, &r), GRAFT_EINVAL);
    assert_int_equal(graft_etcd_delete(T.client, "/t/txn/", true, NULL, NULL), GRAFT_OK);
}

#define RACERS 8
static int winners;
static pthread_mutex_t winners_lock = PTHREAD_MUTEX_INITIALIZER;

static void *racer(void *arg)
{
    char me[16];
    snprintf(me, sizeof(me), "racer-%d", (int)(intptr_t)arg);
    graft_etcd_compare_t absent = {.key = "/t/race/leader", .target = GRAFT_ETCD_CMP_CREATE,
                                   .op = GRAFT_ETCD_CMP_EQUAL};
    graft_etcd_op_t put = {.type = GRAFT_ETCD_OP_PUT, .key = "/t/race/leader", .value = me,
                           .value_len = strlen(me)};
    graft_etcd_txn_result_t r;
    if (graft_etcd_txn(T.client, &absent, 1, &put, 1, NULL, 0, &r) != GRAFT_OK)
        return (void *)1;
    if (r.succeeded) {
        pthread_mutex_lock(&winners_lock);
        winners++;
        pthread_mutex_unlock(&winners_lock);
    }
    graft_etcd_txn_result_clear(&r);
    return NULL;
}

static void test_txn_race_one_winner(void **state)
{
    (void)state;
    pthread_t th[RACERS];
    winners = 0;
    for (int i = 0; i < RACERS; i++)
        assert_int_equal(pthread_create(&th[i], NULL, racer, (void *)(intptr_t)i), 0);
    for (int i = 0; i < RACERS; i++) {
        void *rv;
        pthread_join(th[i], &rv);
        assert_null(rv);
    }
    assert_int_equal(winners, 1);
    graft_etcd_kv_t kv;
    assert_int_equal(graft_etcd_get(T.client, "/t/race/leader", &kv, NULL), GRAFT_OK);
    assert_int_equal(kv.version, 1);
    assert_memory_equal(kv.value, "racer-", 6);
    graft_etcd_kv_clear(&kv);
}

static void test_leases(void **state)
{
    (void)state;
    int64_t id = 0, ttl = 0, granted = 0;
    assert_int_equal(graft_etcd_lease_grant(T.client, 30, &id, &ttl), GRAFT_OK);
    assert_true(id > 0);
    assert_int_equal(ttl, 30);
    put_str("/t/lease/a", "x", id, NULL);
    graft_etcd_kv_t kv;
    assert_int_equal(graft_etcd_get(T.client, "/t/lease/a", &kv, NULL), GRAFT_OK);
    assert_int_equal(kv.lease, id);
    graft_etcd_kv_clear(&kv);
    assert_int_equal(graft_etcd_lease_keepalive(T.client, id, &ttl), GRAFT_OK);
    assert_int_equal(ttl, 30);
    assert_int_equal(graft_etcd_lease_ttl(T.client, id, &ttl, &granted), GRAFT_OK);
    assert_true(ttl > 0 && ttl <= 30);
    assert_int_equal(granted, 30);
    assert_int_equal(graft_etcd_lease_revoke(T.client, id), GRAFT_OK);
    assert_int_equal(graft_etcd_get(T.client, "/t/lease/a", &kv, NULL), GRAFT_ENOTFOUND);
    assert_int_equal(graft_etcd_lease_revoke(T.client, id), GRAFT_ENOTFOUND);
    assert_int_equal(graft_etcd_lease_keepalive(T.client, id, &ttl), GRAFT_ENOTFOUND);
    assert_int_equal(graft_etcd_lease_ttl(T.client, id, &ttl, NULL), GRAFT_ENOTFOUND);
    /* a put on a lease that does not exist */
    assert_int_equal(graft_etcd_put(T.client, "/t/lease/b", "x", 1, id, NULL, NULL),
                     GRAFT_ENOTFOUND);
    assert_int_equal(graft_etcd_lease_grant(T.client, 0, &id, NULL), GRAFT_EINVAL);
}

static void test_lease_expiry_deletes_keys(void **state)
{
    (void)state;
    int64_t id = 0;
    assert_int_equal(graft_etcd_lease_grant(T.client, 1, &id, NULL), GRAFT_OK);
    put_str("/t/expire/a", "x", id, NULL);
    put_str("/t/expire/b", "y", id, NULL);
    graft_etcd_watch_t *w = NULL;
    assert_int_equal(graft_etcd_watch_create(T.client, "/t/expire/", 0, &w), GRAFT_OK);
    /* etcd's lease granularity is coarse: allow a few seconds. */
    int deletes = 0;
    time_t t0 = time(NULL);
    while (deletes < 2 && time(NULL) - t0 < 8) {
        graft_etcd_event_t *ev = NULL;
        size_t n = 0;
        assert_int_equal(graft_etcd_watch_next(w, 500, &ev, &n), GRAFT_OK);
        for (size_t i = 0; i < n; i++) {
            assert_int_equal(ev[i].type, GRAFT_ETCD_EVENT_DELETE);
            deletes++;
        }
        graft_etcd_events_free(ev, n);
    }
    assert_int_equal(deletes, 2);
    graft_etcd_watch_destroy(w);
    graft_etcd_range_result_t r;
    graft_etcd_range_opts_t o = {.prefix = true};
    assert_int_equal(graft_etcd_range(T.client, "/t/expire/", &o, &r), GRAFT_OK);
    assert_int_equal(r.n_kvs, 0);
    graft_etcd_range_result_clear(&r);
    int64_t ttl;
    assert_int_equal(graft_etcd_lease_keepalive(T.client, id, &ttl), GRAFT_ENOTFOUND);
}

/* Collect events until want arrive or the time is up. */
static size_t collect(graft_etcd_watch_t *w, graft_etcd_event_t *out, size_t want, int ms)
{
    size_t got = 0;
    uint64_t end = (uint64_t)time(NULL) * 1000 + (uint64_t)ms;
    while (got < want && (uint64_t)time(NULL) * 1000 < end) {
        graft_etcd_event_t *ev = NULL;
        size_t n = 0;
        graft_status_t st = graft_etcd_watch_next(w, 200, &ev, &n);
        assert_true(st == GRAFT_OK || st == GRAFT_EUNREACHABLE);
        for (size_t i = 0; i < n; i++) {
            if (got < want) {
                out[got++] = ev[i];
                memset(&ev[i].kv, 0, sizeof(ev[i].kv));
            } else {
                fail_msg("more events than expected: %s", ev[i].kv.key);
            }
        }
        graft_etcd_events_free(ev, n);
    }
    return got;
}

static void free_events(graft_etcd_event_t *ev, size_t n)
{
    for (size_t i = 0; i < n; i++)
        graft_etcd_kv_clear(&ev[i].kv);
}

static void test_watch_order(void **state)
{
    (void)state;
    graft_etcd_watch_t *w = NULL;
    assert_int_equal(graft_etcd_watch_create(T.client, "/t/watch/", 0, &w), GRAFT_OK);
    put_str("/t/watch/a", "1", 0, NULL);
    put_str("/t/elsewhere", "x", 0, NULL);
    put_str("/t/watch/b", "2", 0, NULL);
    assert_int_equal(graft_etcd_delete(T.client, "/t/watch/a", false, NULL, NULL), GRAFT_OK);
    put_str("/t/watch/a", "3", 0, NULL);
    graft_etcd_event_t ev[8];
    assert_int_equal(collect(w, ev, 4, 5000), 4);
    assert_int_equal(ev[0].type, GRAFT_ETCD_EVENT_PUT);
    assert_string_equal(ev[0].kv.key, "/t/watch/a");
    assert_string_equal((char *)ev[0].kv.value, "1");
    assert_string_equal(ev[1].kv.key, "/t/watch/b");
    assert_int_equal(ev[2].type, GRAFT_ETCD_EVENT_DELETE);
    assert_string_equal(ev[2].kv.key, "/t/watch/a");
    assert_int_equal(ev[3].type, GRAFT_ETCD_EVENT_PUT);
    assert_string_equal((char *)ev[3].kv.value, "3");
    for (int i = 1; i < 4; i++)
        assert_true(ev[i].kv.mod_revision > ev[i - 1].kv.mod_revision);
    int64_t first_rev = ev[0].kv.mod_revision;
    free_events(ev, 4);
    /* Nothing more: a poll returns no events. */
    graft_etcd_event_t *none = NULL;
    size_t n = 9;
    assert_int_equal(graft_etcd_watch_next(w, 0, &none, &n), GRAFT_OK);
    assert_int_equal(n, 0);
    assert_null(none);
    graft_etcd_watch_destroy(w);

    /* From a past revision: the same history again. */
    assert_int_equal(graft_etcd_watch_create(T.client, "/t/watch/", first_rev, &w), GRAFT_OK);
    assert_int_equal(collect(w, ev, 4, 5000), 4);
    assert_int_equal(ev[0].kv.mod_revision, first_rev);
    assert_int_equal(ev[2].type, GRAFT_ETCD_EVENT_DELETE);
    free_events(ev, 4);
    graft_etcd_watch_destroy(w);
    graft_etcd_watch_destroy(NULL);
}

/* A caller that only polls (timeout 0) still gets its events. */
static void test_watch_poll_only(void **state)
{
    (void)state;
    graft_etcd_watch_t *w = NULL;
    assert_int_equal(graft_etcd_watch_create(T.client, "/t/poll/", 0, &w), GRAFT_OK);
    put_str("/t/poll/a", "1", 0, NULL);
    size_t got = 0;
    for (int i = 0; i < 500 && got == 0; i++) {
        graft_etcd_event_t *ev = NULL;
        size_t n = 0;
        assert_int_equal(graft_etcd_watch_next(w, 0, &ev, &n), GRAFT_OK);
        if (n > 0)
            assert_string_equal(ev[0].kv.key, "/t/poll/a");
        got += n;
        graft_etcd_events_free(ev, n);
        usleep(10000);
    }
    assert_int_equal(got, 1);
    graft_etcd_watch_destroy(w);
}

static void test_watch_many_events_one_txn(void **state)
{
    (void)state;
    graft_etcd_watch_t *w = NULL;
    assert_int_equal(graft_etcd_watch_create(T.client, "/t/wtxn/", 0, &w), GRAFT_OK);
    graft_etcd_op_t ops[3] = {
        {.type = GRAFT_ETCD_OP_PUT, .key = "/t/wtxn/a", .value = "a", .value_len = 1},
        {.type = GRAFT_ETCD_OP_PUT, .key = "/t/wtxn/b", .value = "b", .value_len = 1},
        {.type = GRAFT_ETCD_OP_PUT, .key = "/t/wtxn/c", .value = "c", .value_len = 1},
    };
    graft_etcd_txn_result_t r;
    assert_int_equal(graft_etcd_txn(T.client, NULL, 0, ops, 3, NULL, 0, &r), GRAFT_OK);
    graft_etcd_txn_result_clear(&r);
    /* A large value arrives across many reads of the stream. */
    size_t big = 512 * 1024;
    char *v = malloc(big);
    assert_non_null(v);
    for (size_t i = 0; i < big; i++)
        v[i] = (char)('a' + i % 26);
    assert_int_equal(graft_etcd_put(T.client, "/t/wtxn/big", v, big, 0, NULL, NULL), GRAFT_OK);
    graft_etcd_event_t ev[4];
    assert_int_equal(collect(w, ev, 4, 5000), 4);
    assert_int_equal(ev[0].kv.mod_revision, ev[2].kv.mod_revision);
    assert_string_equal(ev[2].kv.key, "/t/wtxn/c");
    assert_int_equal(ev[3].kv.value_len, big);
    assert_memory_equal(ev[3].kv.value, v, big);
    free_events(ev, 4);
    free(v);
    graft_etcd_watch_destroy(w);
}

static void test_compaction_resync(void **state)
{
    (void)state;
    int64_t r1 = 0, r2 = 0;
    put_str("/t/compact/a", "1", 0, &r1);
    put_str("/t/compact/a", "2", 0, NULL);
    put_str("/t/compact/b", "3", 0, &r2);
    assert_int_equal(graft_etcd_compact(T.client, r2), GRAFT_OK);
    assert_int_equal(graft_etcd_compact(T.client, r1), GRAFT_ECOMPACTED);
    graft_etcd_range_result_t rr;
    graft_etcd_range_opts_t o = {.revision = r1};
    assert_int_equal(graft_etcd_range(T.client, "/t/compact/a", &o, &rr), GRAFT_ECOMPACTED);

    graft_etcd_watch_t *w = NULL;
    assert_int_equal(graft_etcd_watch_create(T.client, "/t/compact/", r1, &w), GRAFT_OK);
    graft_etcd_event_t *ev = NULL;
    size_t n = 0;
    graft_status_t st = GRAFT_OK;
    for (int i = 0; i < 20 && st == GRAFT_OK; i++)
        st = graft_etcd_watch_next(w, 200, &ev, &n);
    assert_int_equal(st, GRAFT_ECOMPACTED);
    assert_int_equal(n, 0);
    assert_int_equal(graft_etcd_watch_compact_revision(w), r2);
    /* It stays compacted until the caller resyncs. */
    assert_int_equal(graft_etcd_watch_next(w, 0, &ev, &n), GRAFT_ECOMPACTED);

    /* Resync: fresh range, then watch from its revision + 1. */
    o = (graft_etcd_range_opts_t){.prefix = true};
    assert_int_equal(graft_etcd_range(T.client, "/t/compact/", &o, &rr), GRAFT_OK);
    assert_int_equal(rr.n_kvs, 2);
    assert_int_equal(graft_etcd_watch_restart(w, rr.revision + 1), GRAFT_OK);
    graft_etcd_range_result_clear(&rr);
    put_str("/t/compact/c", "4", 0, NULL);
    graft_etcd_event_t got[1];
    assert_int_equal(collect(w, got, 1, 5000), 1);
    assert_string_equal(got[0].kv.key, "/t/compact/c");
    free_events(got, 1);
    graft_etcd_watch_destroy(w);
}

static void test_too_large(void **state)
{
    (void)state;
    size_t len = 1600 * 1024;
    char *v = calloc(1, len);
    assert_non_null(v);
    assert_int_equal(graft_etcd_put(T.client, "/t/big", v, len, 0, NULL, NULL), GRAFT_ETOOLARGE);
    len = 3 * 1024 * 1024;
    char *v2 = realloc(v, len);
    assert_non_null(v2);
    memset(v2, 'x', len);
    assert_int_equal(graft_etcd_put(T.client, "/t/big", v2, len, 0, NULL, NULL),
                     GRAFT_ETOOLARGE);
    free(v2);
    graft_etcd_kv_t kv;
    assert_int_equal(graft_etcd_get(T.client, "/t/big", &kv, NULL), GRAFT_ENOTFOUND);
}

/* A loopback port nothing listens on. */
static int dead_port(void)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t l = sizeof(a);
    assert_int_equal(bind(fd, (struct sockaddr *)&a, sizeof(a)), 0);
    assert_int_equal(getsockname(fd, (struct sockaddr *)&a, &l), 0);
    close(fd);
    return ntohs(a.sin_port);
}

static void test_failover_and_unreachable(void **state)
{
    (void)state;
    char dead[64];
    snprintf(dead, sizeof(dead), "http://127.0.0.1:%d", dead_port());
    const char *eps[] = {dead, graft_etcd_server_endpoint(T.server)};
    graft_etcd_t *c = graft_test_etcd_client(eps, 2, NULL, NULL);
    assert_non_null(c);
    assert_string_equal(graft_etcd_current_endpoint(c), dead);
    assert_int_equal(graft_etcd_put(c, "/t/fo", "x", 1, 0, NULL, NULL), GRAFT_OK);
    assert_string_equal(graft_etcd_current_endpoint(c), eps[1]);
    graft_etcd_watch_t *w = NULL;
    assert_int_equal(graft_etcd_watch_create(c, "/t/fo", 0, &w), GRAFT_OK);
    graft_etcd_watch_destroy(w);
    graft_etcd_destroy(c);

    /* watch failover when the dead endpoint comes first */
    const char *eps2[] = {dead, graft_etcd_server_endpoint(T.server)};
    c = graft_test_etcd_client(eps2, 2, NULL, NULL);
    assert_int_equal(graft_etcd_watch_create(c, "/t/fo", 0, &w), GRAFT_OK);
    put_str("/t/fo", "y", 0, NULL);
    graft_etcd_event_t ev[1];
    assert_int_equal(collect(w, ev, 1, 3000), 1);
    free_events(ev, 1);
    graft_etcd_watch_destroy(w);
    graft_etcd_destroy(c);

    /* only dead endpoints */
    const char *only[] = {dead};
    c = graft_test_etcd_client(only, 1, NULL, NULL);
    graft_etcd_kv_t kv;
    assert_int_equal(graft_etcd_get(c, "/t/fo", &kv, NULL), GRAFT_EUNREACHABLE);
    assert_int_equal(graft_etcd_watch_create(c, "/t/fo", 0, &w), GRAFT_EUNREACHABLE);
    graft_etcd_destroy(c);

    /* bad configurations */
    graft_etcd_config_t cfg = {0};
    assert_int_equal(graft_etcd_create(&cfg, &c), GRAFT_EINVAL);
    const char *notaurl[] = {"127.0.0.1:2379"};
    cfg = (graft_etcd_config_t){.endpoints = notaurl, .n_endpoints = 1};
    assert_int_equal(graft_etcd_create(&cfg, &c), GRAFT_EINVAL);
    graft_etcd_destroy(NULL);
}

static void test_watch_across_restart(void **state)
{
    (void)state;
    graft_etcd_watch_t *w = NULL;
    assert_int_equal(graft_etcd_watch_create(T.client, "/t/restart/", 0, &w), GRAFT_OK);
    put_str("/t/restart/k", "0", 0, NULL);
    put_str("/t/restart/k", "1", 0, NULL);
    graft_etcd_event_t ev[8];
    assert_int_equal(collect(w, ev, 2, 5000), 2);
    free_events(ev, 2);

    int old_pid = graft_etcd_server_pid(T.server);
    assert_int_equal(graft_etcd_server_stop(T.server), GRAFT_OK);
    assert_int_equal(graft_etcd_server_pid(T.server), -1);
    /* While etcd is down the watch reports it and keeps trying. */
    graft_etcd_event_t *none = NULL;
    size_t n = 0;
    graft_status_t st = GRAFT_OK;
    for (int i = 0; i < 10 && st == GRAFT_OK; i++)
        st = graft_etcd_watch_next(w, 100, &none, &n);
    assert_int_equal(st, GRAFT_EUNREACHABLE);
    assert_int_equal(n, 0);
    assert_int_equal(graft_etcd_server_restart(T.server), GRAFT_OK);
    assert_true(graft_etcd_server_pid(T.server) > 0);
    assert_int_not_equal(graft_etcd_server_pid(T.server), old_pid);
    /* The data survived the restart. */
    graft_etcd_kv_t kv;
    assert_int_equal(graft_etcd_get(T.client, "/t/restart/k", &kv, NULL), GRAFT_OK);
    assert_string_equal((char *)kv.value, "1");
    graft_etcd_kv_clear(&kv);
    for (int i = 2; i < 6; i++) {
        char v[16];
        snprintf(v, sizeof(v), "%d", i);
        put_str("/t/restart/k", v, 0, NULL);
    }
    size_t got = collect(w, ev, 4, 8000);
    assert_int_equal(got, 4);
    for (size_t i = 0; i < got; i++) {
        char v[16];
        snprintf(v, sizeof(v), "%d", (int)i + 2);
        assert_string_equal((char *)ev[i].kv.value, v);
    }
    free_events(ev, got);
    assert_int_equal(graft_etcd_watch_next(w, 300, &none, &n), GRAFT_OK);
    assert_int_equal(n, 0);
    graft_etcd_watch_destroy(w);
    assert_int_equal(graft_etcd_server_restart(T.server), GRAFT_ESTATE);
}

/* Stopping etcd between two events while the watch is not reading: the
 * events written before the stop must come once, after the restart too. */
static void test_watch_restart_no_duplicates(void **state)
{
    (void)state;
    graft_etcd_watch_t *w = NULL;
    assert_int_equal(graft_etcd_watch_create(T.client, "/t/dup/", 0, &w), GRAFT_OK);
    put_str("/t/dup/a", "1", 0, NULL);
    put_str("/t/dup/b", "2", 0, NULL);
    assert_int_equal(graft_etcd_server_stop(T.server), GRAFT_OK);
    assert_int_equal(graft_etcd_server_restart(T.server), GRAFT_OK);
    put_str("/t/dup/c", "3", 0, NULL);
    graft_etcd_event_t ev[3];
    assert_int_equal(collect(w, ev, 3, 8000), 3);
    assert_string_equal(ev[0].kv.key, "/t/dup/a");
    assert_string_equal(ev[1].kv.key, "/t/dup/b");
    assert_string_equal(ev[2].kv.key, "/t/dup/c");
    free_events(ev, 3);
    graft_etcd_event_t *more = NULL;
    size_t n = 0;
    assert_int_equal(graft_etcd_watch_next(w, 300, &more, &n), GRAFT_OK);
    assert_int_equal(n, 0);
    graft_etcd_watch_destroy(w);
}

static void test_server_errors(void **state)
{
    (void)state;
    graft_etcd_server_t *s = NULL;
    graft_etcd_server_opts_t o = {.binary = "/nonexistent/etcd"};
    assert_int_equal(graft_etcd_server_start(&o, &s), GRAFT_ENOTFOUND);
    assert_null(s);
    /* etcd that exits at once (an unknown flag) fails fast, not by timeout */
    const char *bad[] = {"--no-such-flag", NULL};
    o = (graft_etcd_server_opts_t){.extra_args = bad, .start_timeout_ms = 10000};
    time_t t0 = time(NULL);
    assert_int_equal(graft_etcd_server_start(&o, &s), GRAFT_ESYS);
    assert_true(time(NULL) - t0 < 5);
    graft_etcd_server_destroy(NULL);
    assert_int_equal(graft_etcd_server_pid(NULL), -1);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_put_get_delete),
        cmocka_unit_test(test_range_options),
        cmocka_unit_test(test_txn),
        cmocka_unit_test(test_txn_race_one_winner),
        cmocka_unit_test(test_leases),
        cmocka_unit_test(test_lease_expiry_deletes_keys),
        cmocka_unit_test(test_watch_order),
        cmocka_unit_test(test_watch_poll_only),
        cmocka_unit_test(test_watch_many_events_one_txn),
        cmocka_unit_test(test_compaction_resync),
        cmocka_unit_test(test_too_large),
        cmocka_unit_test(test_failover_and_unreachable),
        cmocka_unit_test(test_watch_across_restart),
        cmocka_unit_test(test_watch_restart_no_duplicates),
        cmocka_unit_test(test_server_errors),
    };
    return cmocka_run_group_tests_name("etcd", tests, group_setup, group_teardown);
}
