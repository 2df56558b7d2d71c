/* Delegated records against a real etcd: a group's leader writes its ranks'
 * ready records and commit votes with its own, one transaction each, and
 * the rounds and decisions are those of every rank writing its own. The
 * fallbacks: a delegate whose lease etcd no longer knows, a vote that a rank
 * already wrote itself, a delegate that never reaches the leader. Every
 * rank is a handle with its own clients and lease; one thread drives each
 * group (the runtime sends delegates over the transfer endpoints: that part
 * is in test_runtime_delegate.c). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <inttypes.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>

#include <graft/membership.h>

#include "graft_internal.h"
#include "etcd_fixture.h"
#include "membership_fixture.h"

#define R_MAX 4

/* The membership fixture's rank, with a longer lease and join timeout. */
static graft_membership_t *join(const char *job, uint32_t g, uint32_t r, uint32_t R)
{
    graft_membership_config_t c = mf_cfg_for(job, g, r, R);
    c.lease_ttl_s = 5;
    c.join_timeout_ms = 3000;
    graft_membership_t *m = NULL;
    assert_int_equal(graft_membership_create(&c, &m), GRAFT_OK);
    return m;
}

static uint64_t requests(graft_membership_t *m)
{
    graft_membership_stats_t s;
    graft_membership_stats_get(m, &s);
    return s.requests;
}

/* ------------------------------------------------- one group's thread --- */

typedef struct group_run {
    graft_membership_t *m[R_MAX];
    uint32_t R;
    int steps;
    uint64_t committed;
    uint64_t announced; /* set by the leader's callback */
    bool written;
    int rounds_ok, decisions_yes;
    uint64_t quorum_ids[8];
    uint64_t delegate_requests; /* etcd requests of ranks 1..R-1 over the steps */
    uint64_t leader_requests;
} group_run_t;

static void on_announced(void *arg, uint64_t round, bool written)
{
    group_run_t *g = arg;
    g->announced = round;
    g->written = written;
}

/* A step as the runtime takes it through etcd, every rank's part in turn:
 * the delegates, the leader's batch, then each delegate's wait. */
static void *group_main(void *arg)
{
    group_run_t *g = arg;
    uint64_t before[R_MAX];
    for (uint32_t r = 0; r < g->R; r++)
        before[r] = requests(g->m[r]);
    for (int s = 0; s < g->steps; s++) {
        graft_membership_delegate_t dl[R_MAX];
        graft_quorum_t *q[R_MAX] = {0};
        for (uint32_t r = 1; r < g->R; r++)
            assert_int_equal(graft_membership_ready_delegate(g->m[r], g->committed, &dl[r - 1]),
                             GRAFT_OK);
        graft_membership_round_opts_t lo = {dl, g->R - 1, on_announced, g, 0};
        assert_int_equal(graft_membership_quorum_wait_opts(g->m[0], g->committed, 20000, &lo, &q[0]),
                         GRAFT_OK);
        assert_true(g->written);
        assert_int_equal(g->announced, q[0]->round);
        for (uint32_t r = 1; r < g->R; r++) {
            graft_membership_round_opts_t o = {.announced_round = g->announced};
            assert_int_equal(graft_membership_quorum_wait_opts(g->m[r], g->committed, 20000, &o,
                                                               &q[r]),
                             GRAFT_OK);
            assert_int_equal(q[r]->round, q[0]->round);
            assert_int_equal(q[r]->id, q[0]->id);
        }
        g->rounds_ok++;
        g->quorum_ids[s] = q[0]->id;
        for (uint32_t r = 1; r < g->R; r++)
            assert_int_equal(graft_membership_vote_delegate(g->m[r], q[r], true, NULL, &dl[r - 1]),
                             GRAFT_OK);
        graft_membership_vote_opts_t vo = {dl, g->R - 1, 0};
        bool d0 = false;
        assert_int_equal(graft_membership_commit_vote_opts(g->m[0], q[0], true, NULL, 5000, &vo,
                                                           &d0),
                         GRAFT_OK);
        bool all = d0;
        for (uint32_t r = 1; r < g->R; r++) {
            graft_membership_vote_opts_t o = {.delegated_wait_ms = 2000};
            bool d = false;
            assert_int_equal(graft_membership_commit_vote_opts(g->m[r], q[r], true, NULL, 5000, &o,
                                                               &d),
                             GRAFT_OK);
            all = all && d;
        }
        g->decisions_yes += all;
        if (all)
            g->committed = q[0]->step + 1;
        for (uint32_t r = 0; r < g->R; r++)
            graft_membership_quorum_free(q[r]);
    }
    g->leader_requests = requests(g->m[0]) - before[0];
    for (uint32_t r = 1; r < g->R; r++)
        g->delegate_requests += requests(g->m[r]) - before[r];
    return NULL;
}

/* Two groups of three ranks, four steps: every round forms with both
 * groups and one id, every vote passes, and only the leaders talk to etcd
 * (their ranks' requests are none at all). */
static void test_leaders_write_for_their_ranks(void **state)
{
    (void)state;
    const char *job = "delegate-basic";
    group_run_t g[2] = {0};
    pthread_t th[2];
    for (uint32_t k = 0; k < 2; k++) {
        g[k].R = 3;
        g[k].steps = 4;
        for (uint32_t r = 0; r < 3; r++)
            g[k].m[r] = join(job, k, r, 3);
    }
    for (int k = 0; k < 2; k++)
        pthread_create(&th[k], NULL, group_main, &g[k]);
    for (int k = 0; k < 2; k++)
        pthread_join(th[k], NULL);
    for (int k = 0; k < 2; k++) {
        assert_int_equal(g[k].rounds_ok, 4);
        assert_int_equal(g[k].decisions_yes, 4);
        assert_int_equal(g[k].delegate_requests, 0);
        /* announce (+ formation) + vote per step, whatever R is */
        assert_true(g[k].leader_requests <= 4u * 3u);
        for (int s = 0; s < 4; s++)
            assert_int_equal(g[0].quorum_ids[s], g[1].quorum_ids[s]);
    }
    for (uint32_t k = 0; k < 2; k++)
        for (uint32_t r = 0; r < 3; r++)
            graft_membership_destroy(g[k].m[r]);
}

/* ------------------------------------------------------------ fallbacks --- */

typedef struct self_announce {
    graft_membership_t *m;
    atomic_bool go;
    graft_status_t st;
    uint64_t round;
    bool vote;
    const graft_quorum_t *q;
    bool decision;
} self_announce_t;

static void on_announced_go(void *arg, uint64_t round, bool written)
{
    self_announce_t *a = arg;
    a->round = round;
    atomic_store(&a->go, !written);
}

static void *rank_main(void *arg)
{
    self_announce_t *a = arg;
    while (!atomic_load(&a->go))
        graft__sleep_ns(1000000);
    if (a->vote) {
        a->st = graft_membership_commit_vote(a->m, a->q, true, NULL, 5000, &a->decision);
        return NULL;
    }
    graft_quorum_t *q = NULL;
    a->st = graft_membership_quorum_wait(a->m, 1, 20000, &q);
    if (a->st == GRAFT_OK)
        a->round = q->round;
    graft_membership_quorum_free(q);
    return NULL;
}

/* A delegate whose lease etcd does not know (its rank died, or the lease
 * was cut off) fails the batch: the leader announces alone and says so,
 * and the rank, told, announces itself; the round then forms. A vote the
 * rank already wrote itself fails the vote batch the same way: the leader
 * votes alone, and the group decides yes from the two keys. */
static void test_batch_falls_back(void **state)
{
    (void)state;
    const char *job = "delegate-fallback";
    graft_membership_t *m0 = join(job, 0, 0, 2), *m1 = join(job, 0, 1, 2);
    graft_membership_delegate_t d;
    assert_int_equal(graft_membership_ready_delegate(m1, 1, &d), GRAFT_OK);
    d.lease ^= 0x5a5a5a5a; /* a lease etcd does not know */
    self_announce_t a = {.m = m1};
    pthread_t th;
    pthread_create(&th, NULL, rank_main, &a);
    graft_membership_round_opts_t o = {&d, 1, on_announced_go, &a, 0};
    graft_quorum_t *q = NULL;
    assert_int_equal(graft_membership_quorum_wait_opts(m0, 1, 20000, &o, &q), GRAFT_OK);
    pthread_join(th, NULL);
    assert_int_equal(a.st, GRAFT_OK);
    assert_int_equal(a.round, q->round);
    assert_int_equal(q->n_members, 1);

    /* rank 1 votes first, by itself, then the leader comes with its
     * (stale) delegate */
    graft_quorum_t *q1 = NULL;
    assert_int_equal(graft_membership_quorum_latest(m1, &q1), GRAFT_OK);
    assert_int_equal(graft_membership_vote_delegate(m1, q1, true, NULL, &d), GRAFT_OK);
    self_announce_t v = {.m = m1, .vote = true, .q = q1};
    atomic_store(&v.go, true);
    pthread_create(&th, NULL, rank_main, &v);
    graft__sleep_ns(300000000ull); /* its vote is in etcd by now, or soon */
    graft_membership_vote_opts_t vo = {&d, 1, 0};
    bool d0 = false;
    assert_int_equal(graft_membership_commit_vote_opts(m0, q, true, NULL, 5000, &vo, &d0),
                     GRAFT_OK);
    pthread_join(th, NULL);
    assert_int_equal(v.st, GRAFT_OK);
    assert_true(d0);
    assert_true(v.decision);
    graft_membership_quorum_free(q1);
    graft_membership_quorum_free(q);
    graft_membership_destroy(m1);
    graft_membership_destroy(m0);
}

/* A rank that handed its vote to a leader that never wrote it (the leader
 * died, or the message was lost) writes it itself after its wait, and the
 * group still decides; a "no" handed over counts as the rank's no. */
static void test_vote_not_written_by_leader(void **state)
{
    (void)state;
    const char *job = "delegate-lost";
    graft_membership_t *m0 = join(job, 0, 0, 2), *m1 = join(job, 0, 1, 2);
    graft_quorum_t *q0 = NULL, *q1 = NULL;
    self_announce_t a = {.m = m1};
    atomic_store(&a.go, true);
    pthread_t th;
    pthread_create(&th, NULL, rank_main, &a);
    assert_int_equal(graft_membership_quorum_wait(m0, 1, 20000, &q0), GRAFT_OK);
    pthread_join(th, NULL);
    assert_int_equal(a.st, GRAFT_OK);
    assert_int_equal(graft_membership_quorum_latest(m1, &q1), GRAFT_OK);
    graft_membership_delegate_t d;
    assert_int_equal(graft_membership_vote_delegate(m1, q1, false, "heal failed", &d), GRAFT_OK);
    /* the leader votes without it; rank 1 waits 200 ms, then votes itself */
    self_announce_t v = {.m = m0, .vote = true, .q = q0};
    atomic_store(&v.go, true);
    pthread_create(&th, NULL, rank_main, &v);
    graft_membership_vote_opts_t o = {.delegated_wait_ms = 200};
    bool d1 = true;
    assert_int_equal(graft_membership_commit_vote_opts(m1, q1, true, NULL, 5000, &o, &d1),
                     GRAFT_OK);
    pthread_join(th, NULL);
    assert_true(d1);
    assert_true(v.decision);
    /* next round: its "no", written by the leader, is the group's no */
    graft_quorum_t *n0 = NULL, *n1 = NULL;
    a = (self_announce_t){.m = m1};
    atomic_store(&a.go, true);
    pthread_create(&th, NULL, rank_main, &a);
    assert_int_equal(graft_membership_quorum_wait(m0, 1, 20000, &n0), GRAFT_OK);
    pthread_join(th, NULL);
    assert_int_equal(graft_membership_quorum_latest(m1, &n1), GRAFT_OK);
    assert_int_equal(n1->round, n0->round);
    assert_int_equal(graft_membership_vote_delegate(m1, n1, false, "heal failed", &d), GRAFT_OK);
    graft_membership_vote_opts_t lo = {&d, 1, 0};
    bool dl0 = true, dl1 = true;
    assert_int_equal(graft_membership_commit_vote_opts(m0, n0, true, NULL, 5000, &lo, &dl0),
                     GRAFT_OK);
    graft_membership_vote_opts_t ro = {.delegated_wait_ms = 2000};
    assert_int_equal(graft_membership_commit_vote_opts(m1, n1, false, "heal failed", 5000, &ro,
                                                       &dl1),
                     GRAFT_OK);
    assert_false(dl0);
    assert_false(dl1);
    graft_membership_quorum_free(n1);
    graft_membership_quorum_free(n0);
    graft_membership_quorum_free(q1);
    graft_membership_quorum_free(q0);
    graft_membership_destroy(m1);
    graft_membership_destroy(m0);
}

/* Delegates that are not other ranks of the group are refused. */
static void test_bad_delegates_refused(void **state)
{
    (void)state;
    const char *job = "delegate-bad";
    graft_membership_t *m0 = join(job, 0, 0, 2);
    graft_membership_delegate_t d[2] = {{.rank = 1, .lease = 1}, {.rank = 1, .lease = 1}};
    graft_quorum_t *q = NULL;
    graft_membership_round_opts_t o = {d, 2, NULL, NULL, 0};
    assert_int_equal(graft_membership_quorum_wait_opts(m0, 1, 1000, &o, &q), GRAFT_EINVAL);
    d[0].rank = 0; /* itself */
    o.n_delegates = 1;
    assert_int_equal(graft_membership_quorum_wait_opts(m0, 1, 1000, &o, &q), GRAFT_EINVAL);
    d[0].rank = 2; /* not a rank of the group */
    assert_int_equal(graft_membership_quorum_wait_opts(m0, 1, 1000, &o, &q), GRAFT_EINVAL);
    graft_quorum_t fake = {.id = 7, .round = 3, .step = 1};
    d[0].rank = 1;
    d[0].round = 2; /* a vote for another round */
    d[0].quorum_id = 7;
    graft_membership_vote_opts_t vo = {d, 1, 0};
    bool dec = true;
    assert_int_equal(graft_membership_commit_vote_opts(m0, &fake, true, NULL, 1000, &vo, &dec),
                     GRAFT_EINVAL);
    assert_null(q);
    graft_membership_destroy(m0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_leaders_write_for_their_ranks),
        cmocka_unit_test(test_batch_falls_back),
        cmocka_unit_test(test_vote_not_written_by_leader),
        cmocka_unit_test(test_bad_delegates_refused),
    };
    return cmocka_run_group_tests(tests, mf_group_setup, mf_group_teardown);
}
