/*
 * The etcd client and the membership layer against a real 3-member etcd
 * cluster (Debian's, started by the test) whose leader is killed with
 * SIGKILL mid-use: requests, transactions, lease renewals and watches must
 * go on through the two members left, and the killed member must rejoin.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <graft/etcd.h>
#include <graft/membership.h>

#include "etcd_fixture.h"

static graft_test_etcd_cluster_t C;

/* A new election takes one to two election timeouts (1 s by default). */
#define LEADER_WAIT_MS 10000u

static int group_setup(void **state)
{
    (void)state;
    return graft_test_etcd_cluster_start(&C, 3);
}

static int group_teardown(void **state)
{
    (void)state;
    graft_test_etcd_cluster_stop(&C);
    return 0;
}

/* Every test starts with the whole cluster: a member a failed test left
 * dead comes back first. */
static int setup(void **state)
{
    (void)state;
    for (size_t i = 0; i < graft_etcd_cluster_size(C.cluster); i++) {
        graft_etcd_server_t *m = graft_etcd_cluster_member(C.cluster, i);
        if (graft_etcd_server_pid(m) <= 0 && graft_etcd_server_restart(m) != GRAFT_OK)
            return -1;
    }
    return 0;
}

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

/* The endpoints with the leader's first, so a client starts out on the
 * member about to die. out must hold C.n_endpoints entries. */
static void endpoints_leader_first(size_t leader, const char **out)
{
    size_t k = 0;
    out[k++] = C.endpoints[leader];
    for (size_t i = 0; i < C.n_endpoints; i++)
        if (i != leader)
            out[k++] = C.endpoints[i];
}

static size_t leader_now(void)
{
    size_t leader = SIZE_MAX;
    assert_int_equal(graft_test_etcd_cluster_wait_leader(&C, LEADER_WAIT_MS, &leader), 0);
    assert_true(leader < C.n_endpoints);
    return leader;
}

/* Kill the leader; returns its index. The cluster is left one short. */
static size_t kill_leader(void)
{
    size_t leader = leader_now();
    graft_etcd_server_t *m = graft_etcd_cluster_member(C.cluster, leader);
    assert_non_null(m);
    assert_int_equal(graft_etcd_server_kill(m), GRAFT_OK);
    assert_int_equal(graft_etcd_server_pid(m), -1);
    return leader;
}

/* Bring the killed member back and wait until all three agree on a leader. */
static void restart_member(size_t index)
{
    graft_etcd_server_t *m = graft_etcd_cluster_member(C.cluster, index);
    assert_int_equal(graft_etcd_server_restart(m), GRAFT_OK);
    assert_true(graft_etcd_server_pid(m) > 0);
    uint64_t leader_id = 0;
    for (size_t i = 0; i < C.n_endpoints; i++) {
        const char *ep = C.endpoints[i];
        graft_etcd_t *e = graft_test_etcd_client(&ep, 1, NULL, NULL);
        assert_non_null(e);
        graft_etcd_member_status_t ms = {0};
        for (int tries = 0; tries < 100; tries++) {
            if (graft_etcd_member_status(e, &ms) == GRAFT_OK && ms.leader_id != 0)
                break;
            usleep(100 * 1000);
        }
        graft_etcd_destroy(e);
        assert_true(ms.member_id != 0);
        assert_true(ms.leader_id != 0);
        if (leader_id == 0)
            leader_id = ms.leader_id;
        assert_true(ms.leader_id == leader_id);
    }
}

static void test_cluster_has_one_leader(void **state)
{
    (void)state;
    assert_int_equal(graft_etcd_cluster_size(C.cluster), 3);
    assert_int_equal(C.n_endpoints, 3);
    assert_null(graft_etcd_cluster_member(C.cluster, 3));
    size_t leader = leader_now();
    /* Every member names the same leader, and exactly one is it. */
    uint64_t ids[3] = {0}, leader_id = 0;
    int leaders = 0;
    for (size_t i = 0; i < 3; i++) {
        const char *ep = C.endpoints[i];
        graft_etcd_t *e = graft_test_etcd_client(&ep, 1, NULL, NULL);
        assert_non_null(e);
        graft_etcd_member_status_t ms;
        assert_int_equal(graft_etcd_member_status(e, &ms), GRAFT_OK);
        graft_etcd_destroy(e);
        ids[i] = ms.member_id;
        assert_true(ms.raft_term > 0);
        if (leader_id == 0)
            leader_id = ms.leader_id;
        assert_true(ms.leader_id == leader_id);
        leaders += ms.member_id == ms.leader_id;
    }
    assert_int_equal(leaders, 1);
    assert_true(ids[leader] == leader_id);
    assert_true(ids[0] != ids[1] && ids[1] != ids[2] && ids[0] != ids[2]);
    /* A write through one member is read through another. */
    assert_int_equal(graft_etcd_put(C.client, "/ha/one", "x", 1, 0, NULL, NULL), GRAFT_OK);
    const char *other = C.endpoints[(leader + 1) % 3];
    graft_etcd_t *e = graft_test_etcd_client(&other, 1, NULL, NULL);
    graft_etcd_kv_t kv;
    assert_int_equal(graft_etcd_get(e, "/ha/one", &kv, NULL), GRAFT_OK);
    assert_memory_equal(kv.value, "x", 1);
    graft_etcd_kv_clear(&kv);
    graft_etcd_destroy(e);
}

static void test_endpoints_split(void **state)
{
    (void)state;
    char **eps = NULL;
    size_t n = 0;
    assert_int_equal(graft_etcd_endpoints_split("http://a:1,,http://b:2,", &eps, &n), GRAFT_OK);
    assert_int_equal(n, 2);
    assert_string_equal(eps[0], "http://a:1");
    assert_string_equal(eps[1], "http://b:2");
    graft_etcd_endpoints_free(eps, n);
    assert_int_equal(graft_etcd_endpoints_split(",,", &eps, &n), GRAFT_EINVAL);
    assert_int_equal(graft_etcd_endpoints_split(NULL, &eps, &n), GRAFT_EINVAL);
    graft_etcd_endpoints_free(NULL, 0);
}

/* Compare-and-swap counter: one txn that must see the last value. */
static graft_status_t cas_increment(graft_etcd_t *e, const char *key, long *value)
{
    char cur[32], next[32];
    snprintf(cur, sizeof(cur), "%ld", *value);
    snprintf(next, sizeof(next), "%ld", *value + 1);
    graft_etcd_compare_t cmp = {.key = key, .target = GRAFT_ETCD_CMP_VALUE,
                                .op = GRAFT_ETCD_CMP_EQUAL, .value = cur,
                                .value_len = strlen(cur)};
    graft_etcd_op_t put = {.type = GRAFT_ETCD_OP_PUT, .key = key, .value = next,
                           .value_len = strlen(next)};
    graft_etcd_txn_result_t r;
    graft_status_t st = graft_etcd_txn(e, &cmp, 1, &put, 1, NULL, 0, &r);
    if (st != GRAFT_OK)
        return st;
    bool ok = r.succeeded;
    graft_etcd_txn_result_clear(&r);
    if (!ok)
        return GRAFT_ESTATE;
    (*value)++;
    return GRAFT_OK;
}

/*
 * A client that talks to the leader keeps working through its death: each
 * call (put, txn, range, lease renewal) returns GRAFT_OK on its own, by
 * failing over and waiting out the election, and a watch opened before
 * the kill reports the writes made after it, in order and once each.
 */
static void test_client_survives_leader_kill(void **state)
{
    (void)state;
    size_t leader = leader_now();
    const char *eps[3];
    endpoints_leader_first(leader, eps);
    graft_etcd_t *e = graft_test_etcd_client(eps, 3, NULL, NULL);
    assert_non_null(e);
    assert_string_equal(graft_etcd_current_endpoint(e), C.endpoints[leader]);

    const char *key = "/ha/ctr";
    long value = 0;
    assert_int_equal(graft_etcd_put(e, key, "0", 1, 0, NULL, NULL), GRAFT_OK);
    int64_t lease = 0;
    assert_int_equal(graft_etcd_lease_grant(e, 5, &lease, NULL), GRAFT_OK);
    assert_int_equal(graft_etcd_put(e, "/ha/leased", "y", 1, lease, NULL, NULL), GRAFT_OK);
    graft_etcd_watch_t *w = NULL;
    assert_int_equal(graft_etcd_watch_create(e, key, 0, &w), GRAFT_OK);
    for (int i = 0; i < 3; i++)
        assert_int_equal(cas_increment(e, key, &value), GRAFT_OK);

    double t_kill = now_s();
    size_t killed = kill_leader();
    assert_int_equal(killed, leader);
    /* Straight away: the first of these meets the dead leader or the
     * election; each must still succeed. */
    double worst = 0;
    int timeouts = 0;
    for (int i = 0; i < 20; i++) {
        double t = now_s();
        graft_status_t st = cas_increment(e, key, &value);
        if (now_s() - t > worst)
            worst = now_s() - t;
        if (st == GRAFT_EETCD_TIMEOUT) {
            /* A txn a follower forwarded to the dying leader is lost and
             * answered only at the timeout; not repeated, since its
             * compare would fail the second time. Read where it stands. */
            timeouts++;
            graft_etcd_kv_t cur;
            assert_int_equal(graft_etcd_get(e, key, &cur, NULL), GRAFT_OK);
            value = strtol((const char *)cur.value, NULL, 10);
            graft_etcd_kv_clear(&cur);
            continue;
        }
        assert_int_equal(st, GRAFT_OK);
    }
    assert_true(timeouts <= 1);
    assert_true(value >= 3 + 19);
    int64_t ttl = 0;
    assert_int_equal(graft_etcd_lease_keepalive(e, lease, &ttl), GRAFT_OK);
    assert_true(ttl > 0);
    graft_etcd_kv_t kv;
    assert_int_equal(graft_etcd_get(e, "/ha/leased", &kv, NULL), GRAFT_OK);
    graft_etcd_kv_clear(&kv);
    assert_string_not_equal(graft_etcd_current_endpoint(e), C.endpoints[leader]);
    size_t new_leader = leader_now();
    assert_true(new_leader != leader);
    printf("# leader %zu killed; new leader %zu; longest txn %.3f s (%d timed out), 20 txns "
           "in %.3f s\n", leader, new_leader, worst, timeouts, now_s() - t_kill);

    /* The watch saw 1..23 exactly once each, in order. */
    long seen = 0;
    double deadline = now_s() + 15;
    while (seen < value && now_s() < deadline) {
        graft_etcd_event_t *evs = NULL;
        size_t n = 0;
        graft_status_t st = graft_etcd_watch_next(w, 500, &evs, &n);
        assert_true(st == GRAFT_OK || st == GRAFT_ETIMEOUT || st == GRAFT_EUNREACHABLE);
        for (size_t i = 0; i < n; i++) {
            char buf[32];
            snprintf(buf, sizeof(buf), "%ld", seen + 1);
            assert_int_equal(evs[i].kv.value_len, strlen(buf));
            assert_memory_equal(evs[i].kv.value, buf, strlen(buf));
            seen++;
        }
        graft_etcd_events_free(evs, n);
    }
    assert_int_equal(seen, value);
    graft_etcd_watch_destroy(w);
    assert_int_equal(graft_etcd_lease_revoke(e, lease), GRAFT_OK);
    graft_etcd_destroy(e);
    restart_member(killed);
}

/*
 * A joined rank and an observer, both started on the leader: across the
 * leader's death the rank keeps its lease (same incarnation, no loss), its
 * record updates go through, and the observer's watch-driven view sees
 * them.
 */
static void test_membership_survives_leader_kill(void **state)
{
    (void)state;
    size_t leader = leader_now();
    const char *eps[3];
    endpoints_leader_first(leader, eps);
    graft_etcd_config_t ec = {
        .endpoints = eps,
        .n_endpoints = 3,
        .request_timeout_ms = 1500,
        .connect_timeout_ms = 300,
    };
    graft_membership_config_t mc = {
        .job = "ha",
        .etcd = &ec,
        .group = 0,
        .ranks_per_group = 1,
        .lease_ttl_s = 5,
        .state = GRAFT_MEMBER_HEALTHY,
    };
    graft_membership_t *m = NULL, *obs = NULL;
    assert_int_equal(graft_membership_create(&mc, &m), GRAFT_OK);
    graft_membership_config_t oc = mc;
    oc.observer = true;
    assert_int_equal(graft_membership_create(&oc, &obs), GRAFT_OK);
    uint64_t inc = graft_membership_incarnation(m);
    assert_true(inc > 0);

    size_t killed = kill_leader();
    /* A write that a follower forwarded to the dying leader is lost, and
     * answered only at the request timeout; the caller's next one goes
     * through. */
    int failed = 0;
    for (uint64_t step = 1; step <= 5;) {
        graft_status_t st = graft_membership_update(m, GRAFT_MEMBER_HEALTHY, step);
        if (st == GRAFT_OK) {
            step++;
            continue;
        }
        assert_true(st == GRAFT_EETCD_TIMEOUT || st == GRAFT_EUNREACHABLE);
        assert_true(++failed <= 2);
    }

    /* The observer's view reaches step 5. */
    uint64_t seen_step = 0, version = 0;
    double deadline = now_s() + 15;
    while (seen_step < 5 && now_s() < deadline) {
        graft_membership_view_t *v = NULL;
        assert_int_equal(graft_membership_view_get(obs, &v), GRAFT_OK);
        version = v->version;
        for (size_t i = 0; i < v->n_members; i++)
            if (v->members[i].group == 0 && v->members[i].incarnation == inc)
                seen_step = v->members[i].committed_step;
        graft_membership_view_free(v);
        if (seen_step < 5 && graft_membership_view_wait(obs, version, 500, NULL) != GRAFT_OK) {
        }
    }
    assert_int_equal(seen_step, 5);

    /* Two lease lifetimes later the rank is still the same incarnation and
     * never lost its lease: the renewals found the new leader. */
    sleep(2 * mc.lease_ttl_s);
    graft_membership_stats_t s;
    graft_membership_stats_get(m, &s);
    assert_int_equal(s.lease_losses, 0);
    assert_true(graft_membership_incarnation(m) == inc);
    assert_true(graft_membership_group_healthy(obs, 0));

    assert_int_equal(graft_membership_leave(m), GRAFT_OK);
    graft_membership_destroy(m);
    graft_membership_destroy(obs);
    restart_member(killed);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_endpoints_split),
        cmocka_unit_test_setup(test_cluster_has_one_leader, setup),
        cmocka_unit_test_setup(test_client_survives_leader_kill, setup),
        cmocka_unit_test_setup(test_membership_survives_leader_kill, setup),
        /* Once more, now that the restarted members rejoined: a member that
         * came back must be as good as the others. */
        cmocka_unit_test_setup(test_client_survives_leader_kill, setup),
        cmocka_unit_test_setup(test_membership_survives_leader_kill, setup),
    };
    return cmocka_run_group_tests(tests, group_setup, group_teardown);
}
