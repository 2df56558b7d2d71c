/* Membership's lease against a real etcd, in one process: a revoked lease
 * re-joins, a quorum waits for the re-join, the keepalive client never
 * retries; etcd out of reach (no commit, a wait past the TTL). The fixture
 * is tests/support/membership_fixture.h. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "alloc_fail.h"

#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <graft/membership.h>

#include "etcd_fixture.h"
#include "membership_fixture.h"
#include "etcd/etcd_internal.h"
#include "membership/membership_internal.h"

/* ------------------------------------------------------ lease revoked --- */

typedef struct lease_log {
    pthread_mutex_t mu;
    int lost, rejoined;
    uint64_t lost_inc, new_inc;
    graft_status_t why;
} lease_log_t;

static void on_lease(graft_membership_notice_t what, uint64_t inc, graft_status_t why, void *arg)
{
    lease_log_t *l = arg;
    pthread_mutex_lock(&l->mu);
    if (what == GRAFT_MEMBERSHIP_LEASE_LOST) {
        l->lost++;
        l->lost_inc = inc;
        l->why = why;
    } else {
        l->rejoined++;
        l->new_inc = inc;
    }
    pthread_mutex_unlock(&l->mu);
}

/* A one-rank job's handle with a 1 s lease whose notices go to cb, and
 * its incarnation; then an operator revokes the lease. */
static graft_membership_t *join_then_revoke(const char *job, graft_membership_lease_fn cb,
                                            lease_log_t *log, uint64_t *inc_p)
{
    graft_membership_config_t c = mf_cfg_for(job, 0, 0, 1);
    c.lease_ttl_s = 1;
    c.lease_cb = cb;
    c.lease_arg = log;
    graft_membership_t *m = NULL;
    assert_int_equal(graft_membership_create(&c, &m), GRAFT_OK);
    graft_membership_view_t *v = NULL;
    assert_int_equal(graft_membership_view_get(m, &v), GRAFT_OK);
    assert_int_equal(v->n_members, 1);
    int64_t lease = v->members[0].lease_id;
    *inc_p = v->members[0].incarnation;
    graft_membership_view_free(v);
    assert_int_equal(graft_etcd_lease_revoke(mf_etcd.client, lease), GRAFT_OK);
    return m;
}

/* Wait up to 5 s for a count of the log to be positive. */
static void wait_notice(lease_log_t *log, const int *count)
{
    uint64_t end = graft__now_ns() + 5000000000ull;
    for (;;) {
        pthread_mutex_lock(&log->mu);
        bool seen = *count > 0;
        pthread_mutex_unlock(&log->mu);
        if (seen || graft__now_ns() > end)
            break;
        usleep(10000);
    }
}

static void test_lease_revoked_rejoins(void **state)
{
    (void)state;
    lease_log_t log = {PTHREAD_MUTEX_INITIALIZER, 0, 0, 0, 0, GRAFT_OK};
    uint64_t inc0 = 0;
    graft_membership_t *m = join_then_revoke("revoke", on_lease, &log, &inc0);
    wait_notice(&log, &log.rejoined);
    assert_int_equal(log.lost, 1);
    assert_int_equal(log.rejoined, 1);
    assert_int_equal(log.lost_inc, inc0);
    assert_int_equal(log.why, GRAFT_ENOTFOUND);
    assert_true(log.new_inc > inc0);
    assert_int_equal(graft_membership_incarnation(m), log.new_inc);
    /* reported once through the next call, then business as usual */
    graft_quorum_t *q = NULL;
    assert_int_equal(graft_membership_quorum_wait(m, 0, 3000, &q), GRAFT_ELEASE);
    assert_int_equal(graft_membership_quorum_wait(m, 0, 3000, &q), GRAFT_OK);
    assert_int_equal(q->n_members, 1);
    graft_membership_quorum_free(q);
    graft_membership_stats_t st;
    graft_membership_stats_get(m, &st);
    assert_int_equal(st.lease_losses, 1);
    assert_true(st.keepalives > 0);
    /* the record is back with the new incarnation */
    graft_membership_view_t *v = NULL;
    assert_int_equal(graft_membership_view_get(m, &v), GRAFT_OK);
    assert_int_equal(v->n_members, 1);
    assert_int_equal(v->members[0].incarnation, log.new_inc);
    graft_membership_view_free(v);
    graft_event_t *evs = NULL;
    size_t n = 0;
    assert_int_equal(graft_membership_events_read(m, 0, &evs, &n), GRAFT_OK);
    bool lost_logged = false;
    for (size_t i = 0; i < n; i++)
        lost_logged |= evs[i].kind == GRAFT_EVENT_LEASE_LOST && evs[i].incarnation == inc0;
    assert_true(lost_logged);
    graft_membership_events_free(evs, n);
    graft_membership_destroy(m);
}

/* The loss, once reported, is not reported again while the keep-alive
 * thread re-joins: the next quorum call waits for the re-mf_join (here held
 * up by the callback) up to its timeout, instead of returning GRAFT_ELEASE
 * at once to a caller that would ask again in a tight loop. */
static void on_lease_slow(graft_membership_notice_t what, uint64_t inc, graft_status_t why,
                          void *arg)
{
    on_lease(what, inc, why, arg);
    if (what == GRAFT_MEMBERSHIP_LEASE_LOST)
        usleep(1000 * 1000); /* the re-mf_join starts after the callback */
}

static void test_quorum_waits_for_rejoin(void **state)
{
    (void)state;
    lease_log_t log = {PTHREAD_MUTEX_INITIALIZER, 0, 0, 0, 0, GRAFT_OK};
    uint64_t inc0 = 0;
    graft_membership_t *m = join_then_revoke("rejoin-wait", on_lease_slow, &log, &inc0);
    wait_notice(&log, &log.lost);
    assert_int_equal(log.lost, 1);
    assert_int_equal(log.lost_inc, inc0);
    graft_quorum_t *q = NULL;
    /* reported once */
    assert_int_equal(graft_membership_quorum_wait(m, 0, 3000, &q), GRAFT_ELEASE);
    /* still re-joining at the timeout: said after the timeout, not before */
    uint64_t t0 = graft__now_ns();
    assert_int_equal(graft_membership_quorum_wait(m, 0, 200, &q), GRAFT_ELEASE);
    assert_true(graft__now_ns() - t0 >= 190000000ull);
    pthread_mutex_lock(&log.mu);
    assert_int_equal(log.rejoined, 0);
    pthread_mutex_unlock(&log.mu);
    /* a longer one sees the re-mf_join through */
    assert_int_equal(graft_membership_quorum_wait(m, 0, 5000, &q), GRAFT_OK);
    assert_int_equal(q->n_members, 1);
    graft_membership_quorum_free(q);
    pthread_mutex_lock(&log.mu);
    assert_int_equal(log.rejoined, 1);
    pthread_mutex_unlock(&log.mu);
    graft_membership_destroy(m);
}

/* A renewal is never retried: the next one comes TTL/3 later anyway, and
 * against a black-holed etcd every retry costs a connect timeout, which
 * would push the detection of a lost lease past the TTL. The requests of
 * the training thread keep the retries the caller asked for. */
static void test_keepalive_client_never_retries(void **state)
{
    (void)state;
    graft_membership_t *m = mf_join("ka-retries", 0, 0, 1);
    assert_int_equal(m->ops->max_retries, mf_etcd_cfg.max_retries);
    assert_int_equal(m->ka->max_retries, 0);
    assert_true(m->ka->request_timeout_ms <= 2000u / 3u + 1u);
    graft_membership_destroy(m);

    /* a zero max_retries still means the default for the caller's requests */
    graft_etcd_config_t e = mf_etcd_cfg;
    e.max_retries = 0;
    graft_membership_config_t c = mf_cfg_for("ka-retries", 0, 0, 1);
    c.etcd = &e;
    assert_int_equal(graft_membership_create(&c, &m), GRAFT_OK);
    assert_int_equal(m->ops->max_retries, 3);
    assert_int_equal(m->ka->max_retries, 0);
    graft_membership_destroy(m);
}

/* ----------------------------------------------------- etcd unreachable --- */

static void test_etcd_down_cannot_commit(void **state)
{
    (void)state;
    graft_membership_config_t c = mf_cfg_for("down", 0, 0, 1);
    c.lease_ttl_s = 5; /* outlives the outage: what is tested is the vote */
    graft_membership_t *a = NULL;
    assert_int_equal(graft_membership_create(&c, &a), GRAFT_OK);
    graft_quorum_t *q = NULL;
    assert_int_equal(graft_membership_quorum_wait(a, 3, 3000, &q), GRAFT_OK);
    assert_int_equal(graft_etcd_server_stop(mf_etcd.server), GRAFT_OK);
    bool d = true;
    uint64_t t0 = graft__now_ns();
    graft_status_t st = graft_membership_commit_vote(a, q, true, NULL, 700, &d);
    uint64_t took_ms = (graft__now_ns() - t0) / 1000000u;
    /* the group cannot commit, says why, and kept retrying until the timeout */
    assert_int_equal(graft_status_class(st), GRAFT_CLASS_JOB);
    assert_false(d);
    assert_true(took_ms >= 600);
    graft_membership_stats_t stats;
    graft_membership_stats_get(a, &stats);
    assert_true(stats.etcd_errors >= 2);
    graft_quorum_t *q2 = NULL;
    st = graft_membership_quorum_wait(a, 4, 700, &q2);
    assert_int_equal(graft_status_class(st), GRAFT_CLASS_JOB);
    assert_null(q2);
    assert_int_equal(graft_etcd_server_restart(mf_etcd.server), GRAFT_OK);
    /* back: the next step works (after at most one lease report) */
    st = graft_membership_quorum_wait(a, 3, 5000, &q2);
    if (st == GRAFT_ELEASE)
        st = graft_membership_quorum_wait(a, 3, 5000, &q2);
    assert_int_equal(st, GRAFT_OK);
    assert_true(q2->round > q->round);
    assert_int_equal(graft_membership_commit_vote(a, q2, true, NULL, 3000, &d), GRAFT_OK);
    assert_true(d);
    graft_membership_quorum_free(q2);
    graft_membership_quorum_free(q);
    graft_membership_destroy(a);
}

static int lease_log_get(lease_log_t *l, int *rejoined_p)
{
    pthread_mutex_lock(&l->mu);
    int lost = l->lost;
    if (rejoined_p != NULL)
        *rejoined_p = l->rejoined;
    pthread_mutex_unlock(&l->mu);
    return lost;
}

/* etcd unreachable for longer than the TTL: the rank cannot know whether
 * etcd still holds its lease, so it stops taking it for alive (not fresh:
 * it would not commit on the steady path) but takes no guess either: no
 * loss is reported and it does not re-mf_join while etcd cannot answer, and a
 * call that needs etcd fails with etcd's error. Once etcd is back (same
 * data directory) its answer decides: etcd keeps leases across a restart,
 * so the lease lived and the same incarnation goes on, with no re-mf_join
 * (each re-mf_join a grant, a record and a revoke that every view follows,
 * and a heal for its group). */
static void test_etcd_down_past_ttl_waits(void **state)
{
    (void)state;
    lease_log_t log = {PTHREAD_MUTEX_INITIALIZER, 0, 0, 0, 0, GRAFT_OK};
    graft_membership_config_t c = mf_cfg_for("downttl", 0, 0, 1);
    c.lease_ttl_s = 2;
    c.lease_cb = on_lease;
    c.lease_arg = &log;
    graft_membership_t *m = NULL;
    assert_int_equal(graft_membership_create(&c, &m), GRAFT_OK);
    uint64_t inc0 = graft_membership_incarnation(m);
    graft_quorum_t *q = NULL;
    assert_int_equal(graft_membership_quorum_wait(m, 0, 3000, &q), GRAFT_OK);
    bool d = false;
    assert_int_equal(graft_membership_commit_vote(m, q, true, NULL, 3000, &d), GRAFT_OK);
    assert_true(d);
    graft_membership_health_t h;
    assert_int_equal(graft_membership_health(m, q, &h), GRAFT_OK);
    assert_true(h.lease_fresh);

    assert_int_equal(graft_etcd_server_stop(mf_etcd.server), GRAFT_OK);
    usleep(2u * c.lease_ttl_s * 1000000u + 500000u);
    assert_int_equal(lease_log_get(&log, NULL), 0);
    assert_int_equal(graft_membership_health(m, q, &h), GRAFT_OK);
    assert_false(h.lease_fresh);
    graft_quorum_t *q2 = NULL;
    graft_status_t st = graft_membership_quorum_wait(m, 1, 1500, &q2);
    assert_int_not_equal(st, GRAFT_OK);
    assert_int_not_equal(st, GRAFT_ELEASE);
    assert_null(q2);

    assert_int_equal(graft_etcd_server_restart(mf_etcd.server), GRAFT_OK);
    uint64_t end = graft__now_ns() + 10000000000ull;
    while (graft__now_ns() < end) {
        assert_int_equal(graft_membership_health(m, q, &h), GRAFT_OK);
        if (h.lease_fresh)
            break;
        usleep(20000);
    }
    assert_true(h.lease_fresh);
    int rejoined = 0;
    assert_int_equal(lease_log_get(&log, &rejoined), 0);
    assert_int_equal(rejoined, 0);
    assert_int_equal(graft_membership_incarnation(m), inc0);
    graft_membership_stats_t stats;
    graft_membership_stats_get(m, &stats);
    assert_int_equal(stats.lease_losses, 0);
    graft_membership_quorum_free(q);

    /* business as usual, as the same incarnation */
    assert_int_equal(graft_membership_quorum_wait(m, 1, 5000, &q), GRAFT_OK);
    assert_int_equal(q->n_members, 1);
    assert_int_equal(graft_membership_commit_vote(m, q, true, NULL, 3000, &d), GRAFT_OK);
    assert_true(d);
    graft_membership_quorum_free(q);
    graft_membership_destroy(m);
}

int main(int argc, char **argv)
{
    (void)argc;
    (void)argv;
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_lease_revoked_rejoins),
        cmocka_unit_test(test_quorum_waits_for_rejoin),
        cmocka_unit_test(test_keepalive_client_never_retries),
        cmocka_unit_test(test_etcd_down_cannot_commit),
        cmocka_unit_test(test_etcd_down_past_ttl_waits),
    };
    /* TEST_FILTER=test_commit_vote* runs only the tests it matches. */
    if (getenv("TEST_FILTER") != NULL)
        cmocka_set_test_filter(getenv("TEST_FILTER"));
    return cmocka_run_group_tests_name("membership_lease", tests, mf_group_setup,
                                       mf_group_teardown);
}
