/* Membership against a real etcd, in one process: every rank is a handle
 * with its own clients and lease, driven by its own thread. Join, view and
 * leave; quorum races; commit votes; blobs; garbage records; min_groups;
 * a revoked lease; compaction resync; the event history. The tests that
 * need real processes (SIGKILL, SIGSTOP, etcd restart) are in
 * test_membership_failures.c. */
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
#include "etcd/etcd_internal.h"
#include "membership/membership_internal.h"

static graft_test_etcd_t T;
static const char *endpoint;
static graft_etcd_config_t etcd_cfg;

static int group_setup(void **state)
{
    (void)state;
    if (graft_test_etcd_start(&T, NULL) != 0)
        return -1;
    endpoint = graft_etcd_server_endpoint(T.server);
    etcd_cfg = graft_test_etcd_config(&endpoint, 1, 2000);
    return 0;
}

static int group_teardown(void **state)
{
    (void)state;
    graft_test_etcd_stop(&T);
    return 0;
}

static graft_membership_config_t cfg_for(const char *job, uint32_t g, uint32_t r, uint32_t R)
{
    graft_membership_config_t c = {0};
    c.job = job;
    c.etcd = &etcd_cfg;
    c.group = g;
    c.rank = r;
    c.ranks_per_group = R;
    c.min_groups = 1;
    c.lease_ttl_s = 2;
    c.join_timeout_ms = 800;
    c.transfer_address = "tcp://127.0.0.1:1";
    return c;
}

static graft_membership_t *join(const char *job, uint32_t g, uint32_t r, uint32_t R)
{
    graft_membership_config_t c = cfg_for(job, g, r, R);
    graft_membership_t *m = NULL;
    assert_int_equal(graft_membership_create(&c, &m), GRAFT_OK);
    return m;
}

static graft_membership_t *observe(const char *job, uint32_t R)
{
    graft_membership_config_t c = cfg_for(job, 0, 0, R);
    c.observer = true;
    graft_membership_t *m = NULL;
    assert_int_equal(graft_membership_create(&c, &m), GRAFT_OK);
    return m;
}

/* Wait until the observer's view has n members and h healthy groups. */
static bool wait_view(graft_membership_t *obs, size_t n, size_t h, uint32_t timeout_ms)
{
    uint64_t end = graft__now_ns() + (uint64_t)timeout_ms * 1000000ull;
    uint64_t version = 0;
    while (graft__now_ns() < end) {
        graft_membership_view_t *v = NULL;
        assert_int_equal(graft_membership_view_get(obs, &v), GRAFT_OK);
        bool ok = v->n_members == n && v->n_healthy_groups == h;
        version = v->version;
        graft_membership_view_free(v);
        if (ok)
            return true;
        if (graft_membership_view_wait(obs, version, 100, NULL) != GRAFT_OK)
            continue;
    }
    return false;
}

/* ---------------------------------------------------------------- tests --- */

static void test_config_rejected(void **state)
{
    (void)state;
    graft_membership_t *m = NULL;
    graft_membership_config_t c = cfg_for("bad/job", 0, 0, 1);
    assert_int_equal(graft_membership_create(&c, &m), GRAFT_EINVAL);
    c = cfg_for("", 0, 0, 1);
    assert_int_equal(graft_membership_create(&c, &m), GRAFT_EINVAL);
    c = cfg_for("ok", 0, 2, 2); /* rank outside the group */
    assert_int_equal(graft_membership_create(&c, &m), GRAFT_EINVAL);
    c = cfg_for("ok", 0, 0, 1);
    c.etcd = NULL;
    assert_int_equal(graft_membership_create(&c, &m), GRAFT_EINVAL);
    assert_null(m);
    /* etcd that does not answer: a clear job-class error, no handle */
    const char *dead = "http://127.0.0.1:1";
    graft_etcd_config_t e = etcd_cfg;
    e.endpoints = &dead;
    c = cfg_for("ok", 0, 0, 1);
    c.etcd = &e;
    graft_status_t st = graft_membership_create(&c, &m);
    assert_int_equal(graft_status_class(st), GRAFT_CLASS_JOB);
    assert_null(m);
    graft_membership_destroy(NULL);
}

static void test_join_view_leave(void **state)
{
    (void)state;
    graft_membership_t *obs = observe("jv", 2);
    graft_membership_t *r[4];
    for (int i = 0; i < 4; i++)
        r[i] = join("jv", (uint32_t)i / 2, (uint32_t)i % 2, 2);
    assert_true(wait_view(obs, 4, 2, 3000));
    graft_membership_view_t *v = NULL;
    assert_int_equal(graft_membership_view_get(obs, &v), GRAFT_OK);
    assert_int_equal(v->members[3].group, 1);
    assert_int_equal(v->members[3].rank, 1);
    assert_int_equal(v->members[3].incarnation, graft_membership_incarnation(r[3]));
    assert_string_equal(v->members[0].transfer_address, "tcp://127.0.0.1:1");
    assert_int_equal(v->members[0].state, GRAFT_MEMBER_JOINING);
    assert_int_equal(v->members[0].pid, getpid());
    assert_true(v->members[0].lease_id != 0);
    graft_membership_view_free(v);
    assert_true(graft_membership_group_healthy(obs, 1));

    /* update rewrites the record in place */
    assert_int_equal(graft_membership_update(r[0], GRAFT_MEMBER_HEALTHY, 17), GRAFT_OK);
    uint64_t end = graft__now_ns() + 3000000000ull;
    bool seen = false;
    while (!seen && graft__now_ns() < end) {
        assert_int_equal(graft_membership_view_get(obs, &v), GRAFT_OK);
        seen = v->n_members > 0 && v->members[0].committed_step == 17 &&
               v->members[0].state == GRAFT_MEMBER_HEALTHY;
        graft_membership_view_free(v);
        if (!seen)
            usleep(20000);
    }
    assert_true(seen);

    /* Leave revokes the lease: the record goes at once, not after the TTL. */
    uint64_t t0 = graft__now_ns();
    assert_int_equal(graft_membership_leave(r[2]), GRAFT_OK);
    assert_int_equal(graft_membership_leave(r[2]), GRAFT_ESTATE);
    assert_true(wait_view(obs, 3, 1, 3000));
    assert_true(graft__now_ns() - t0 < 1000000000ull);
    assert_false(graft_membership_group_healthy(obs, 1));
    assert_true(graft_membership_group_healthy(obs, 0));
    graft_quorum_t *q = NULL;
    assert_int_equal(graft_membership_quorum_wait(r[2], 0, 100, &q), GRAFT_ESTATE);
    assert_int_equal(graft_membership_quorum_wait(obs, 0, 100, &q), GRAFT_ESTATE);

    /* The history has the joins and the leave. */
    graft_event_t *evs = NULL;
    size_t n = 0;
    assert_int_equal(graft_membership_events_read(obs, 0, &evs, &n), GRAFT_OK);
    size_t joins = 0, leaves = 0;
    for (size_t i = 0; i < n; i++) {
        joins += evs[i].kind == GRAFT_EVENT_JOIN;
        leaves += evs[i].kind == GRAFT_EVENT_LEAVE;
        if (i > 0)
            assert_true(evs[i].seq > evs[i - 1].seq); /* create_revisions: not dense */
    }
    assert_int_equal(joins, 4);
    assert_int_equal(leaves, 1);
    graft_membership_events_free(evs, n);

    for (int i = 0; i < 4; i++)
        graft_membership_destroy(r[i]);
    assert_true(wait_view(obs, 0, 0, 3000));
    graft_membership_destroy(obs);
}

/* ------------------------------------------------------ racing threads --- */

#define RACE_G 8
#define RACE_R 2
#define RACE_STEPS 4

typedef struct rank_run {
    const char *job;
    uint32_t g, r, R;
    uint32_t min_groups;
    int steps;
    uint64_t committed;
    graft_membership_t *m;
    /* per round seen: round, id, members hash, n members, step */
    uint64_t rounds[16], ids[16], hashes[16], steps_seen[16];
    size_t n_members[16];
    uint32_t replica_ranks[16], replica_worlds[16];
    uint32_t members[16][16]; /* the first 16 member groups of each round */
    bool decisions[16];
    graft_status_t last_st;
    int done;
} rank_run_t;

static void *rank_main(void *arg)
{
    rank_run_t *rr = arg;
    for (int s = 0; s < rr->steps; s++) {
        graft_quorum_t *q = NULL;
        graft_status_t st = graft_membership_quorum_wait(rr->m, rr->committed, 10000, &q);
        rr->last_st = st;
        if (st != GRAFT_OK)
            return NULL;
        rr->rounds[s] = q->round;
        rr->ids[s] = q->id;
        rr->hashes[s] = q->members_hash;
        rr->n_members[s] = q->n_members;
        rr->steps_seen[s] = q->step;
        rr->replica_ranks[s] = q->replica_rank;
        rr->replica_worlds[s] = q->replica_world;
        for (size_t i = 0; i < q->n_members && i < 16; i++)
            rr->members[s][i] = q->members[i];
        if (q->must_recover)
            rr->committed = q->step;
        bool decision = false;
        st = graft_membership_commit_vote(rr->m, q, true, NULL, 5000, &decision);
        rr->last_st = st;
        rr->decisions[s] = decision;
        if (st == GRAFT_OK && decision)
            rr->committed = q->step + 1;
        graft_membership_quorum_free(q);
        if (st != GRAFT_OK)
            return NULL;
        rr->done++;
    }
    return NULL;
}

static void test_race_one_quorum_per_round(void **state)
{
    (void)state;
    static rank_run_t runs[RACE_G * RACE_R];
    pthread_t th[RACE_G * RACE_R];
    graft_membership_t *obs = observe("race", RACE_R);
    for (uint32_t i = 0; i < RACE_G * RACE_R; i++) {
        memset(&runs[i], 0, sizeof(runs[i]));
        runs[i].job = "race";
        runs[i].g = i / RACE_R;
        runs[i].r = i % RACE_R;
        runs[i].R = RACE_R;
        runs[i].min_groups = 1;
        runs[i].steps = RACE_STEPS;
        /* group 5 starts behind: it must be told to recover */
        runs[i].committed = runs[i].g == 5 ? 0 : 10;
        runs[i].m = join("race", runs[i].g, runs[i].r, RACE_R);
        /* Every rank re-reads the ready set every millisecond, so many see
         * it complete at once and race to form the round. */
        runs[i].m->race_poll_ns = 1000000;
        /* Every round by compare-and-swap: the fast path has its own test. */
        runs[i].m->fast_path_off = true;
    }
    assert_true(wait_view(obs, RACE_G * RACE_R, RACE_G, 5000));
    for (int i = 0; i < RACE_G * RACE_R; i++)
        assert_int_equal(pthread_create(&th[i], NULL, rank_main, &runs[i]), 0);
    for (int i = 0; i < RACE_G * RACE_R; i++)
        pthread_join(th[i], NULL);
    uint64_t txns = 0, conflicts = 0, reqs = 0;
    for (int i = 0; i < RACE_G * RACE_R; i++) {
        assert_int_equal(runs[i].last_st, GRAFT_OK);
        assert_int_equal(runs[i].done, RACE_STEPS);
        for (int s = 0; s < RACE_STEPS; s++) {
            /* everyone read the same record for each round */
            assert_int_equal(runs[i].rounds[s], runs[0].rounds[s]);
            assert_int_equal(runs[i].ids[s], runs[0].ids[s]);
            assert_int_equal(runs[i].hashes[s], runs[0].hashes[s]);
            assert_int_equal(runs[i].steps_seen[s], runs[0].steps_seen[s]);
            assert_int_equal(runs[i].n_members[s], RACE_G);
            /* groups 0..7 all in: a group's replica rank is its number */
            assert_int_equal(runs[i].replica_ranks[s], runs[i].g);
            assert_int_equal(runs[i].replica_worlds[s], RACE_G);
            assert_true(runs[i].decisions[s]);
            if (s > 0)
                assert_true(runs[i].rounds[s] == runs[i].rounds[s - 1] + 1);
        }
        graft_membership_stats_t st;
        graft_membership_stats_get(runs[i].m, &st);
        txns += st.quorum_txns;
        conflicts += st.quorum_conflicts;
        reqs += st.requests;
    }
    /* Same member set every round: the id never changed. */
    assert_int_equal(runs[0].ids[RACE_STEPS - 1], runs[0].ids[0]);
    assert_int_equal(runs[0].steps_seen[0], 10);
    /* Exactly one winning transaction per round. */
    assert_int_equal(txns - conflicts, RACE_STEPS);
    assert_true(conflicts > 0);
    print_message("# race: %" PRIu64 " formation txns (%" PRIu64 " lost) for %d rounds, "
                  "%" PRIu64 " requests in all\n", txns, conflicts, RACE_STEPS, reqs);

    /* The recovery of group 5 was recorded; everyone agreed it had to. */
    graft_event_t *evs = NULL;
    size_t n = 0;
    assert_int_equal(graft_membership_events_read(obs, 0, &evs, &n), GRAFT_OK);
    size_t formed = 0, assigned = 0;
    for (size_t i = 0; i < n; i++) {
        if (evs[i].kind == GRAFT_EVENT_QUORUM_FORMED) {
            formed++;
            assert_int_equal(evs[i].n_members, RACE_G);
        }
        if (evs[i].kind == GRAFT_EVENT_RECOVERY_ASSIGNED) {
            assigned++;
            assert_int_equal(evs[i].group, 5);
            assert_int_equal(evs[i].n_members, RACE_G - 1); /* every other group donates */
        }
    }
    assert_int_equal(formed, 1); /* only the first round: a new member set with a recovery */
    assert_int_equal(assigned, 1);
    graft_membership_events_free(evs, n);
    for (int i = 0; i < RACE_G * RACE_R; i++)
        graft_membership_destroy(runs[i].m);
    graft_membership_destroy(obs);
}

/* Run `steps` rounds with every handle of `runs` in its own thread. */
static void run_all(rank_run_t *runs, size_t n, int steps)
{
    pthread_t th[16];
    assert_true(n <= 16);
    for (size_t i = 0; i < n; i++) {
        runs[i].steps = steps;
        runs[i].done = 0;
        assert_int_equal(pthread_create(&th[i], NULL, rank_main, &runs[i]), 0);
    }
    for (size_t i = 0; i < n; i++)
        pthread_join(th[i], NULL);
}

/* Every rank of every member group is told its group's index in the
 * sorted member list and the number of member groups, also when the group
 * numbers are sparse, and the indices shift when a group leaves. */
static void test_replica_rank_is_index_in_members(void **state)
{
    (void)state;
    static const uint32_t groups[] = {2, 5, 6, 9};
    enum { NG = 4, NR = 2 };
    static rank_run_t runs[NG * NR];
    graft_membership_t *obs = observe("rrank", NR);
    for (uint32_t i = 0; i < NG * NR; i++) {
        memset(&runs[i], 0, sizeof(runs[i]));
        runs[i].g = groups[i / NR];
        runs[i].r = i % NR;
        runs[i].committed = 4;
        /* a join timeout no loaded machine reaches: every group is in */
        graft_membership_config_t c = cfg_for("rrank", runs[i].g, runs[i].r, NR);
        c.join_timeout_ms = 8000;
        assert_int_equal(graft_membership_create(&c, &runs[i].m), GRAFT_OK);
    }
    assert_true(wait_view(obs, NG * NR, NG, 5000));
    run_all(runs, NG * NR, 2);
    for (uint32_t i = 0; i < NG * NR; i++) {
        assert_int_equal(runs[i].last_st, GRAFT_OK);
        assert_int_equal(runs[i].done, 2);
        for (int s = 0; s < 2; s++) {
            assert_int_equal(runs[i].n_members[s], NG);
            for (uint32_t k = 0; k < NG; k++)
                assert_int_equal(runs[i].members[s][k], groups[k]);
            assert_int_equal(runs[i].replica_ranks[s], i / NR);
            assert_int_equal(runs[i].replica_worlds[s], NG);
        }
    }

    /* Group 5 leaves: 6 and 9 move down one place. */
    graft_membership_destroy(runs[2].m);
    graft_membership_destroy(runs[3].m);
    runs[2].m = runs[3].m = NULL;
    assert_true(wait_view(obs, (NG - 1) * NR, NG - 1, 5000));
    rank_run_t rest[(NG - 1) * NR];
    memcpy(&rest[0], &runs[0], NR * sizeof(rest[0]));
    memcpy(&rest[NR], &runs[2 * NR], 2 * NR * sizeof(rest[0]));
    run_all(rest, (NG - 1) * NR, 1);
    static const uint32_t expect_rank[] = {0, 0, 1, 1, 2, 2};
    for (uint32_t i = 0; i < (NG - 1) * NR; i++) {
        assert_int_equal(rest[i].last_st, GRAFT_OK);
        assert_int_equal(rest[i].done, 1);
        assert_int_equal(rest[i].n_members[0], NG - 1);
        assert_int_equal(rest[i].members[0][1], 6);
        assert_int_equal(rest[i].replica_ranks[0], expect_rank[i]);
        assert_int_equal(rest[i].replica_worlds[0], NG - 1);
        assert_true(rest[i].decisions[0]);
        graft_membership_destroy(rest[i].m);
    }
    graft_membership_destroy(obs);
}

/* ------------------------------------------------------------ min_groups --- */

static void test_min_groups_not_met(void **state)
{
    (void)state;
    graft_membership_config_t c0 = cfg_for("minq", 0, 0, 1), c1 = cfg_for("minq", 1, 0, 1);
    c0.min_groups = c1.min_groups = 3;
    graft_membership_t *a = NULL, *b = NULL;
    assert_int_equal(graft_membership_create(&c0, &a), GRAFT_OK);
    assert_int_equal(graft_membership_create(&c1, &b), GRAFT_OK);
    rank_run_t rb;
    memset(&rb, 0, sizeof(rb));
    rb.steps = 1;
    rb.m = b;
    pthread_t th;
    assert_int_equal(pthread_create(&th, NULL, rank_main, &rb), 0);
    graft_quorum_t *q = NULL;
    uint64_t t0 = graft__now_ns();
    assert_int_equal(graft_membership_quorum_wait(a, 0, 10000, &q), GRAFT_ENOQUORUM);
    uint64_t took_ms = (graft__now_ns() - t0) / 1000000u;
    /* after the join timeout (800 ms), not the overall timeout */
    assert_true(took_ms >= 700 && took_ms < 5000);
    assert_null(q);
    pthread_join(th, NULL);
    assert_int_equal(rb.last_st, GRAFT_ENOQUORUM);
    assert_int_equal(graft_membership_quorum_latest(a, &q), GRAFT_ENOTFOUND);
    graft_membership_destroy(a);
    graft_membership_destroy(b);
}

/* ---------------------------------------------------------------- votes --- */

typedef struct step_arg {
    graft_membership_t *m;
    uint64_t committed;
    int vote; /* 1 yes, 0 no, -1 does not vote */
    uint32_t vote_timeout_ms;
    graft_status_t qst, vst;
    bool decision;
    uint64_t round, id;
    uint64_t vote_ms;
} step_arg_t;

static step_arg_t mk(graft_membership_t *m, uint64_t committed, int vote, uint32_t timeout_ms)
{
    step_arg_t a;
    memset(&a, 0, sizeof(a));
    a.m = m;
    a.committed = committed;
    a.vote = vote;
    a.vote_timeout_ms = timeout_ms;
    return a;
}

static void *one_step(void *p)
{
    step_arg_t *a = p;
    graft_quorum_t *q = NULL;
    a->qst = graft_membership_quorum_wait(a->m, a->committed, 5000, &q);
    if (a->qst != GRAFT_OK)
        return NULL;
    a->round = q->round;
    a->id = q->id;
    if (a->vote >= 0) {
        uint64_t t0 = graft__now_ns();
        a->vst = graft_membership_commit_vote(a->m, q, a->vote == 1, a->vote ? NULL : "loss is nan",
                                              a->vote_timeout_ms, &a->decision);
        a->vote_ms = (graft__now_ns() - t0) / 1000000u;
    }
    graft_membership_quorum_free(q);
    return NULL;
}

static void run_pair(step_arg_t *a, step_arg_t *b)
{
    pthread_t ta, tb;
    assert_int_equal(pthread_create(&ta, NULL, one_step, a), 0);
    assert_int_equal(pthread_create(&tb, NULL, one_step, b), 0);
    pthread_join(ta, NULL);
    pthread_join(tb, NULL);
    assert_int_equal(a->qst, GRAFT_OK);
    assert_int_equal(b->qst, GRAFT_OK);
    assert_int_equal(a->round, b->round);
}

static void test_commit_vote(void **state)
{
    (void)state;
    graft_membership_t *a = join("vote", 0, 0, 2), *b = join("vote", 0, 1, 2);
    /* both yes */
    step_arg_t sa = mk(a, 0, 1, 3000), sb = mk(b, 0, 1, 3000);
    run_pair(&sa, &sb);
    assert_int_equal(sa.vst, GRAFT_OK);
    assert_true(sa.decision && sb.decision);
    /* one no: both decide no, at once rather than at the timeout */
    sa = mk(a, 1, 1, 3000);
    sb = mk(b, 1, 0, 3000);
    run_pair(&sa, &sb);
    assert_int_equal(sa.vst, GRAFT_OK);
    assert_int_equal(sb.vst, GRAFT_OK);
    assert_false(sa.decision);
    assert_false(sb.decision);
    assert_true(sa.vote_ms < 2500);
    /* a missing vote is a no once the timeout passes */
    sa = mk(a, 1, 1, 600);
    sb = mk(b, 1, -1, 600);
    run_pair(&sa, &sb);
    assert_int_equal(sa.vst, GRAFT_OK);
    assert_false(sa.decision);
    assert_true(sa.vote_ms >= 550);
    /* bad arguments */
    graft_quorum_t bogus = {0};
    bool d = true;
    assert_int_equal(graft_membership_commit_vote(a, &bogus, true, NULL, 10, &d), GRAFT_EINVAL);
    assert_int_equal(graft_membership_commit_vote(a, NULL, true, NULL, 10, &d), GRAFT_EINVAL);

    /* The two failed votes are in the history, with their reasons. */
    graft_event_t *evs = NULL;
    size_t n = 0;
    assert_int_equal(graft_membership_events_read(a, 0, &evs, &n), GRAFT_OK);
    size_t failed = 0;
    bool nan_seen = false, missing_seen = false;
    for (size_t i = 0; i < n; i++) {
        if (evs[i].kind != GRAFT_EVENT_VOTE_RESULT)
            continue;
        failed++;
        assert_false(evs[i].ok);
        nan_seen |= strstr(evs[i].detail, "loss is nan") != NULL;
        missing_seen |= strstr(evs[i].detail, "1 of 2 votes") != NULL;
    }
    assert_int_equal(failed, 2);
    assert_true(nan_seen && missing_seen);
    graft_membership_events_free(evs, n);
    graft_membership_destroy(a);
    graft_membership_destroy(b);
}

/* One rank per group: no votes watch; the voting transaction's own read
 * decides, yes or no, without waiting for the timeout. */
static void test_commit_vote_one_rank(void **state)
{
    (void)state;
    graft_membership_t *a = join("vote1", 0, 0, 1);
    step_arg_t sa = mk(a, 0, 1, 5000);
    one_step(&sa);
    assert_int_equal(sa.qst, GRAFT_OK);
    assert_int_equal(sa.vst, GRAFT_OK);
    assert_true(sa.decision);
    assert_true(sa.vote_ms < 2500);
    sa = mk(a, 1, 0, 5000);
    one_step(&sa);
    assert_int_equal(sa.vst, GRAFT_OK);
    assert_false(sa.decision);
    assert_true(sa.vote_ms < 2500);
    graft_membership_destroy(a);
}

/* What a donor's fence asks: has a rank voted in a round or a later one?
 * Also after its next vote deleted the earlier round's key. */
static void test_voted_since(void **state)
{
    (void)state;
    graft_membership_t *a = join("vsince", 0, 0, 1);
    graft_quorum_t *q = NULL;
    bool d = false, voted = true;
    assert_int_equal(graft_membership_voted_since(a, 0, 0, 1, NULL), GRAFT_EINVAL);
    assert_int_equal(graft_membership_quorum_wait(a, 0, 5000, &q), GRAFT_OK);
    uint64_t r1 = q->round;
    assert_int_equal(graft_membership_voted_since(a, 0, 0, r1, &voted), GRAFT_OK);
    assert_false(voted);
    assert_int_equal(graft_membership_commit_vote(a, q, true, NULL, 3000, &d), GRAFT_OK);
    graft_membership_quorum_free(q);
    assert_int_equal(graft_membership_voted_since(a, 0, 0, r1, &voted), GRAFT_OK);
    assert_true(voted);
    assert_int_equal(graft_membership_voted_since(a, 0, 0, r1 + 1, &voted), GRAFT_OK);
    assert_false(voted);
    assert_int_equal(graft_membership_voted_since(a, 0, 1, r1, &voted), GRAFT_OK);
    assert_false(voted); /* another rank */
    assert_int_equal(graft_membership_voted_since(a, 1, 0, r1, &voted), GRAFT_OK);
    assert_false(voted); /* another group */
    /* A no in the next round deletes round r1's key; r1 still counts. */
    assert_int_equal(graft_membership_quorum_wait(a, 1, 5000, &q), GRAFT_OK);
    assert_true(q->round > r1);
    assert_int_equal(graft_membership_commit_vote(a, q, false, "test", 3000, &d), GRAFT_OK);
    assert_int_equal(graft_membership_voted_since(a, 0, 0, q->round, &voted), GRAFT_OK);
    assert_true(voted);
    assert_int_equal(graft_membership_voted_since(a, 0, 0, r1, &voted), GRAFT_OK);
    assert_true(voted);
    graft_membership_quorum_free(q);
    graft_membership_destroy(a);
}

/* ------------------------------------------------- vote agreement --- */

/* The quorum of one step for a pair of ranks, formed in two threads. */
typedef struct form_arg {
    graft_membership_t *m;
    uint64_t committed;
    graft_quorum_t *q;
    graft_status_t st;
} form_arg_t;

static void *form_one(void *p)
{
    form_arg_t *a = p;
    a->st = graft_membership_quorum_wait(a->m, a->committed, 5000, &a->q);
    return NULL;
}

static void form_pair(form_arg_t *a, form_arg_t *b)
{
    pthread_t ta, tb;
    assert_int_equal(pthread_create(&ta, NULL, form_one, a), 0);
    assert_int_equal(pthread_create(&tb, NULL, form_one, b), 0);
    pthread_join(ta, NULL);
    pthread_join(tb, NULL);
    assert_int_equal(a->st, GRAFT_OK);
    assert_int_equal(b->st, GRAFT_OK);
    assert_int_equal(a->q->round, b->q->round);
}

typedef struct vote_arg {
    graft_membership_t *m;
    const graft_quorum_t *q;
    uint32_t delay_us; /* held back this long before voting */
    uint32_t timeout_ms;
    graft_status_t st;
    bool decision;
    uint64_t ms;
} vote_arg_t;

static void *vote_one(void *p)
{
    vote_arg_t *a = p;
    if (a->delay_us > 0)
        usleep(a->delay_us);
    uint64_t t0 = graft__now_ns();
    a->st = graft_membership_commit_vote(a->m, a->q, true, NULL, a->timeout_ms, &a->decision);
    a->ms = (graft__now_ns() - t0) / 1000000u;
    return NULL;
}

static void vote_pair(vote_arg_t *a, vote_arg_t *b)
{
    pthread_t ta, tb;
    assert_int_equal(pthread_create(&ta, NULL, vote_one, a), 0);
    assert_int_equal(pthread_create(&tb, NULL, vote_one, b), 0);
    pthread_join(ta, NULL);
    pthread_join(tb, NULL);
    assert_int_equal(a->st, GRAFT_OK);
    assert_int_equal(b->st, GRAFT_OK);
}

static size_t count_keys(const char *prefix)
{
    graft_etcd_range_opts_t opts = {0};
    graft_etcd_range_result_t res = {0};
    opts.prefix = true;
    assert_int_equal(graft_etcd_range(T.client, prefix, &opts, &res), GRAFT_OK);
    size_t n = res.n_kvs;
    graft_etcd_range_result_clear(&res);
    return n;
}

/* A rank whose lease outlives a loaded machine's stalls: what these tests
 * check is the vote, not the lease. */
static graft_membership_t *join_steady(const char *job, uint32_t g, uint32_t r, uint32_t R)
{
    graft_membership_config_t c = cfg_for(job, g, r, R);
    graft_membership_t *m = NULL;
    c.lease_ttl_s = 6;
    c.join_timeout_ms = 3000;
    assert_int_equal(graft_membership_create(&c, &m), GRAFT_OK);
    return m;
}

/* Rank 0 times out waiting for rank 1 and decides no; rank 1, held back
 * until then, votes yes: it must decide no as well, and at once (the no
 * recorded on its behalf is there). The next round both vote yes, rank 0
 * first, so that it learns rank 1's vote from the watch while rank 1's
 * transaction also deletes its key of the round before; and the keys of
 * the decided round are gone. */
static void test_commit_vote_late_rank_agrees(void **state)
{
    (void)state;
    graft_membership_t *a = join_steady("votelate", 0, 0, 2), *b = join_steady("votelate", 0, 1, 2);
    form_arg_t fa = {a, 0, NULL, 0}, fb = {b, 0, NULL, 0};
    form_pair(&fa, &fb);
    vote_arg_t va = {a, fa.q, 0, 300, 0, true, 0};
    vote_one(&va);
    assert_int_equal(va.st, GRAFT_OK);
    assert_false(va.decision);
    assert_true(va.ms >= 250);
    vote_arg_t vb = {b, fb.q, 0, 3000, 0, true, 0};
    vote_one(&vb);
    assert_int_equal(vb.st, GRAFT_OK);
    assert_false(vb.decision); /* the old protocol said yes here */
    assert_true(vb.ms < 2500);
    /* a vote for an older round than one voted in is refused */
    graft_quorum_t old = *fa.q;
    old.round = fa.q->round - 1;
    bool d = true;
    if (old.round > 0)
        assert_int_equal(graft_membership_commit_vote(a, &old, true, NULL, 100, &d), GRAFT_ESTATE);
    graft_membership_quorum_free(fa.q);
    graft_membership_quorum_free(fb.q);

    /* A garbage record and a bad key in the group's folder: reported,
     * skipped, and no crash. */
    const char *junk = "\xff\xfe not a vote";
    assert_int_equal(graft_etcd_put(T.client, "/graft/votelate/votes/0/x/1", junk, strlen(junk), 0,
                                    NULL, NULL), GRAFT_OK);
    assert_int_equal(graft_etcd_put(T.client, "/graft/votelate/votes/0/1/7", junk, strlen(junk), 0,
                                    NULL, NULL), GRAFT_OK);

    /* Next round: still at step 0 (the step was not committed). */
    fa = (form_arg_t){a, 0, NULL, 0};
    fb = (form_arg_t){b, 0, NULL, 0};
    form_pair(&fa, &fb);
    va = (vote_arg_t){a, fa.q, 0, 3000, 0, false, 0};
    vb = (vote_arg_t){b, fb.q, 200000, 3000, 0, false, 0};
    vote_pair(&va, &vb);
    assert_true(va.decision);
    assert_true(vb.decision);
    assert_true(va.ms < 2500); /* from the watch, not at the timeout */
    char prefix[96];
    assert_true(fa.q->round > 1);
    /* Every key of the earlier rounds is gone (the two garbage ones aside). */
    assert_int_equal(count_keys("/graft/votelate/votes/0/"), 2 + 2);
    snprintf(prefix, sizeof(prefix), "/graft/votelate/votes/0/%" PRIu64 "/", fa.q->round);
    assert_int_equal(count_keys(prefix), 2);
    graft_membership_view_t *v = NULL;
    assert_int_equal(graft_membership_view_get(a, &v), GRAFT_OK);
    assert_true(v->malformed >= 2);
    graft_membership_view_free(v);
    graft_membership_quorum_free(fa.q);
    graft_membership_quorum_free(fb.q);
    assert_int_equal(graft_etcd_delete(T.client, "/graft/votelate/votes/0/x/1", false, NULL, NULL),
                     GRAFT_OK);
    assert_int_equal(graft_etcd_delete(T.client, "/graft/votelate/votes/0/1/7", false, NULL, NULL),
                     GRAFT_OK);
    graft_membership_destroy(a);
    graft_membership_destroy(b);
}

/* The converse race: rank 1 votes just as rank 0's timeout passes, a little
 * before or after, round after round. Whatever each round decides, both
 * ranks decide the same. */
#define RACE_ROUNDS 12
#define RACE_TIMEOUT_MS 150

static void test_commit_vote_race_at_timeout(void **state)
{
    (void)state;
    graft_membership_t *a = join_steady("voterace", 0, 0, 2), *b = join_steady("voterace", 0, 1, 2);
    uint64_t committed = 0;
    size_t yes = 0;
    for (int i = 0; i < RACE_ROUNDS; i++) {
        form_arg_t fa = {a, committed, NULL, 0}, fb = {b, committed, NULL, 0};
        form_pair(&fa, &fb);
        /* -15 .. +18 ms around rank 0's timeout */
        int off_ms = (i % 12) * 3 - 15;
        vote_arg_t va = {a, fa.q, 0, RACE_TIMEOUT_MS, 0, false, 0};
        vote_arg_t vb = {b, fb.q, (uint32_t)((RACE_TIMEOUT_MS + off_ms) * 1000), 2000, 0, false, 0};
        vote_pair(&va, &vb);
        print_message("round %" PRIu64 ": rank 1 %+d ms: rank 0 %s, rank 1 %s\n", fa.q->round,
                      off_ms, va.decision ? "yes" : "no", vb.decision ? "yes" : "no");
        assert_int_equal(va.decision, vb.decision);
        if (va.decision) {
            committed++;
            yes++;
        }
        graft_membership_quorum_free(fa.q);
        graft_membership_quorum_free(fb.q);
    }
    print_message("%zu of %d rounds committed\n", yes, RACE_ROUNDS);
    /* Only the last round's keys are left. */
    assert_int_equal(count_keys("/graft/voterace/votes/"), 2);
    graft_membership_destroy(a);
    graft_membership_destroy(b);
}

/* ------------------------------------------------------------ fast path --- */

#define FAST_G 3
#define FAST_R 2

/* One rank's step in the fast-path test. */
typedef struct fstep {
    graft_membership_t *m;
    uint64_t committed;
    bool vote;
    graft_status_t qst, vst;
    bool decision, must_recover;
    uint64_t round, id, step;
    size_t n_members;
} fstep_t;

static void *fstep_main(void *p)
{
    fstep_t *a = p;
    graft_quorum_t *q = NULL;
    a->qst = graft_membership_quorum_wait(a->m, a->committed, 8000, &q);
    if (a->qst != GRAFT_OK)
        return NULL;
    a->round = q->round;
    a->id = q->id;
    a->step = q->step;
    a->n_members = q->n_members;
    a->must_recover = q->must_recover;
    a->vst = graft_membership_commit_vote(a->m, q, a->vote, a->vote ? NULL : "injected no", 3000,
                                          &a->decision);
    if (a->vst == GRAFT_OK && a->decision)
        a->committed = q->step + 1;
    else if (a->must_recover)
        a->committed = q->step; /* healed, even though the vote failed */
    graft_membership_quorum_free(q);
    return NULL;
}

/* Run one step on every non-NULL handle; every rank must get the same round. */
static void fast_step(fstep_t *ranks, size_t n)
{
    pthread_t th[FAST_G * FAST_R];
    for (size_t i = 0; i < n; i++)
        if (ranks[i].m != NULL)
            assert_int_equal(pthread_create(&th[i], NULL, fstep_main, &ranks[i]), 0);
    for (size_t i = 0; i < n; i++)
        if (ranks[i].m != NULL)
            pthread_join(th[i], NULL);
    uint64_t round = 0;
    for (size_t i = 0; i < n; i++) {
        if (ranks[i].m == NULL)
            continue;
        assert_int_equal(ranks[i].qst, GRAFT_OK);
        assert_int_equal(ranks[i].vst, GRAFT_OK);
        if (round == 0)
            round = ranks[i].round;
        assert_int_equal(ranks[i].round, round);
    }
}

static uint64_t fast_count(const fstep_t *ranks, size_t n)
{
    uint64_t fast = 0;
    for (size_t i = 0; i < n; i++) {
        if (ranks[i].m == NULL)
            continue;
        graft_membership_stats_t st;
        graft_membership_stats_get(ranks[i].m, &st);
        fast += st.quorum_fast;
    }
    return fast;
}

/* Wait until every handle's view says group g is (not) healthy. */
static void wait_group(const fstep_t *ranks, size_t n, uint32_t g, bool healthy)
{
    for (size_t i = 0; i < n; i++) {
        uint64_t end = graft__now_ns() + 5000000000ull;
        while (ranks[i].m != NULL && graft_membership_group_healthy(ranks[i].m, g) != healthy) {
            assert_true(graft__now_ns() < end);
            graft__sleep_ns(5000000);
        }
    }
}

/*
 * The steady-state fast path: a round whose live groups are the previous
 * round's members, everyone one step on, is formed by the announcing
 * transaction of the rank that completes the set (one per round, no
 * compare-and-swap). It is not taken when a vote failed (a group is
 * behind), a group left or a group joined: those rounds are formed by the
 * compare-and-swap with a recovery or a new id, as before.
 */
static void test_fast_path(void **state)
{
    (void)state;
    const size_t n = FAST_G * FAST_R;
    fstep_t ranks[FAST_G * FAST_R];
    memset(ranks, 0, sizeof(ranks));
    for (size_t i = 0; i < n; i++) {
        ranks[i].m = join("fast", (uint32_t)(i / FAST_R), (uint32_t)(i % FAST_R), FAST_R);
        ranks[i].vote = true;
    }
    wait_group(ranks, n, FAST_G - 1, true);

    /* Round 1 is a new member set (compare-and-swap); 2..4 are steady. */
    fast_step(ranks, n);
    uint64_t id = ranks[0].id, round = ranks[0].round;
    assert_int_equal(fast_count(ranks, n), 0);
    for (int s = 1; s < 4; s++) {
        fast_step(ranks, n);
        assert_int_equal(ranks[0].round, round + (uint64_t)s);
        assert_int_equal(ranks[0].id, id);
        assert_int_equal(ranks[0].step, (uint64_t)s);
        assert_int_equal(fast_count(ranks, n), (uint64_t)s); /* exactly one former per round */
        for (size_t i = 0; i < n; i++) {
            assert_true(ranks[i].decision);
            assert_int_equal(ranks[i].n_members, FAST_G);
        }
    }

    /* Group 1's rank 0 votes no: the round itself is steady (fast), but
     * group 1 stays at its step, so the next round is not: group 1 must
     * recover, which only the decision assigns. */
    ranks[1 * FAST_R].vote = false;
    fast_step(ranks, n);
    ranks[1 * FAST_R].vote = true;
    assert_int_equal(fast_count(ranks, n), 4);
    assert_false(ranks[1 * FAST_R].decision);
    assert_false(ranks[1 * FAST_R + 1].decision);
    assert_true(ranks[0].decision);
    assert_int_equal(ranks[1 * FAST_R + 1].committed, 4);
    assert_int_equal(ranks[0].committed, 5);
    fast_step(ranks, n);
    assert_int_equal(fast_count(ranks, n), 4);
    assert_true(ranks[1 * FAST_R].must_recover && ranks[1 * FAST_R + 1].must_recover);
    assert_false(ranks[0].must_recover);
    assert_int_equal(ranks[0].id, id);
    assert_int_equal(ranks[0].step, 5);
    /* Healed and committed: steady again. */
    fast_step(ranks, n);
    assert_int_equal(fast_count(ranks, n), 5);
    assert_false(ranks[1 * FAST_R].must_recover);

    /* Group 2 leaves: a new member set, not the fast path. */
    for (size_t i = 2 * FAST_R; i < n; i++) {
        graft_membership_destroy(ranks[i].m);
        ranks[i].m = NULL;
    }
    uint64_t before = fast_count(ranks, n); /* of the handles left */
    wait_group(ranks, n, 2, false);
    fast_step(ranks, n);
    assert_int_equal(fast_count(ranks, n), before);
    assert_int_equal(ranks[0].n_members, FAST_G - 1);
    assert_int_equal(ranks[0].id, id + 1);

    /* Group 2 joins again (new processes, behind): not the fast path
     * either; the new id and its recovery come from the decision. */
    before = fast_count(ranks, n);
    for (size_t i = 2 * FAST_R; i < n; i++) {
        ranks[i].m = join("fast", 2, (uint32_t)(i % FAST_R), FAST_R);
        ranks[i].committed = 0;
    }
    wait_group(ranks, n, 2, true);
    fast_step(ranks, n);
    assert_int_equal(ranks[0].n_members, FAST_G);
    assert_int_equal(ranks[0].id, id + 2);
    assert_true(ranks[2 * FAST_R].must_recover);
    uint64_t after_join = 0;
    for (size_t i = 0; i < 2 * FAST_R; i++) { /* the stats of the old handles */
        graft_membership_stats_t st;
        graft_membership_stats_get(ranks[i].m, &st);
        after_join += st.quorum_fast;
    }
    assert_int_equal(after_join, before);
    /* Everyone at one step again: the fast path is back. */
    fast_step(ranks, n);
    assert_int_equal(fast_count(ranks, n), before + 1);
    assert_int_equal(ranks[0].id, id + 2);
    for (size_t i = 0; i < n; i++)
        graft_membership_destroy(ranks[i].m);
}

/* ---------------------------------------------------------------- blobs --- */

static void test_blob(void **state)
{
    (void)state;
    graft_membership_t *a = join("blob", 0, 0, 1), *b = join("blob", 1, 0, 1);
    const uint8_t id[128] = {1, 2, 3, 0, 5};
    void *got = NULL;
    size_t len = 0;
    assert_int_equal(graft_membership_blob_get(b, 7, 100, &got, &len), GRAFT_ETIMEOUT);
    assert_int_equal(graft_membership_blob_put(a, 7, id, sizeof(id)), GRAFT_OK);
    assert_int_equal(graft_membership_blob_put(b, 7, "x", 1), GRAFT_EEXIST);
    assert_int_equal(graft_membership_blob_get(b, 7, 3000, &got, &len), GRAFT_OK);
    assert_int_equal(len, sizeof(id));
    assert_memory_equal(got, id, sizeof(id));
    graft_free(got);
    static uint8_t big[GRAFT_MSHIP_BLOB_MAX + 1];
    assert_int_equal(graft_membership_blob_put(a, 8, big, sizeof(big)), GRAFT_EINVAL);
    assert_int_equal(graft_membership_blob_put(a, 0, id, 1), GRAFT_EINVAL);
    /* old slots are dropped as ids advance: id 7 goes with id 11 */
    assert_int_equal(graft_membership_blob_put(a, 11, "z", 1), GRAFT_OK);
    graft_etcd_kv_t kv;
    assert_int_equal(graft_etcd_get(T.client, "/graft/blob/blob/00000000000000000007", &kv, NULL),
                     GRAFT_ENOTFOUND);
    assert_int_equal(graft_etcd_get(T.client, "/graft/blob/blob/00000000000000000011", &kv, NULL),
                     GRAFT_OK);
    graft_etcd_kv_clear(&kv);
    graft_membership_destroy(a);
    graft_membership_destroy(b);
}

/* Pair slots (an NCCL id per donor/recipient pair): keyed by round, both
 * groups and the rank; on the donor rank's lease, so they go with it. */
static void test_pair_blob(void **state)
{
    (void)state;
    graft_membership_t *d0 = join("pairs", 0, 0, 2), *d1 = join("pairs", 0, 1, 2);
    graft_membership_t *r0 = join("pairs", 2, 0, 2), *r1 = join("pairs", 2, 1, 2);
    const uint8_t id0[128] = {9, 8, 7}, id1[128] = {1, 1, 1};
    void *got = NULL;
    size_t len = 0;
    assert_int_equal(graft_membership_pair_blob_get(r0, 5, 0, 2, 100, &got, &len), GRAFT_ETIMEOUT);
    assert_int_equal(graft_membership_pair_blob_put(d0, 5, 0, 2, id0, sizeof(id0)), GRAFT_OK);
    assert_int_equal(graft_membership_pair_blob_put(d1, 5, 0, 2, id1, sizeof(id1)), GRAFT_OK);
    /* each rank reads its own rank's slot, and only that pair's */
    assert_int_equal(graft_membership_pair_blob_get(r0, 5, 0, 2, 3000, &got, &len), GRAFT_OK);
    assert_int_equal(len, sizeof(id0));
    assert_memory_equal(got, id0, sizeof(id0));
    graft_free(got);
    assert_int_equal(graft_membership_pair_blob_get(r1, 5, 0, 2, 3000, &got, &len), GRAFT_OK);
    assert_memory_equal(got, id1, sizeof(id1));
    graft_free(got);
    assert_int_equal(graft_membership_pair_blob_get(r0, 5, 1, 2, 100, &got, &len), GRAFT_ETIMEOUT);
    assert_int_equal(graft_membership_pair_blob_get(r0, 6, 0, 2, 100, &got, &len), GRAFT_ETIMEOUT);
    assert_int_equal(graft_membership_pair_blob_put(d0, 0, 0, 2, id0, 1), GRAFT_EINVAL);
    assert_int_equal(graft_membership_pair_blob_put(d0, 5, 0, 2, id0, 0), GRAFT_EINVAL);
    /* the donor clears its slot after the pair transfer */
    assert_int_equal(graft_membership_pair_blob_delete(d0, 5, 0, 2), GRAFT_OK);
    assert_int_equal(graft_membership_pair_blob_get(r0, 5, 0, 2, 100, &got, &len), GRAFT_ETIMEOUT);
    /* a donor that goes takes its slot along (lease revoked on leave) */
    graft_etcd_kv_t kv;
    assert_int_equal(graft_etcd_get(T.client, "/graft/pairs/pairs/00000000000000000005/0/2/1", &kv,
                                    NULL), GRAFT_OK);
    graft_etcd_kv_clear(&kv);
    graft_membership_destroy(d1);
    assert_int_equal(graft_etcd_get(T.client, "/graft/pairs/pairs/00000000000000000005/0/2/1", &kv,
                                    NULL), GRAFT_ENOTFOUND);
    graft_membership_destroy(d0);
    graft_membership_destroy(r0);
    graft_membership_destroy(r1);
}

/* ------------------------------------------------------------- garbage --- */

static void test_garbage_records_skipped(void **state)
{
    (void)state;
    graft_membership_t *obs = observe("junk", 1);
    graft_membership_t *a = join("junk", 0, 0, 1), *b = join("junk", 1, 0, 1);
    const char *junk = "\xff\xfe garbage that is not a protobuf \x01";
    /* garbage member record, a record under the wrong key, a bad key, garbage
     * ready and vote records, a garbage event and a garbage counter */
    assert_int_equal(graft_etcd_put(T.client, "/graft/junk/members/5/0", junk, strlen(junk), 0,
                                    NULL, NULL), GRAFT_OK);
    graft_member_t imposter = {6, 0, 5, "h", 1, "", 0, 0, GRAFT_MEMBER_HEALTHY, 0, 0};
    uint8_t *buf;
    size_t len;
    assert_int_equal(graft__mship_member_encode(&imposter, &buf, &len), GRAFT_OK);
    assert_int_equal(graft_etcd_put(T.client, "/graft/junk/members/7/0", buf, len, 0, NULL, NULL),
                     GRAFT_OK);
    graft_free(buf);
    assert_int_equal(graft_etcd_put(T.client, "/graft/junk/members/x/y", "1", 1, 0, NULL, NULL),
                     GRAFT_OK);
    assert_int_equal(graft_etcd_put(T.client, "/graft/junk/ready/1/3/0", junk, 3, 0, NULL, NULL),
                     GRAFT_OK);
    int64_t junk_event_rev = 0; /* an event's seq is its key's create_revision */
    assert_int_equal(graft_etcd_put(T.client, "/graft/junk/events/00000000000000000099", junk,
                                    strlen(junk), 0, NULL, &junk_event_rev), GRAFT_OK);
    uint64_t end = graft__now_ns() + 3000000000ull;
    graft_membership_view_t *v = NULL;
    for (;;) {
        assert_int_equal(graft_membership_view_get(obs, &v), GRAFT_OK);
        if (v->malformed >= 3 || graft__now_ns() > end)
            break;
        graft_membership_view_free(v);
        usleep(20000);
    }
    assert_true(v->malformed >= 3);
    assert_int_equal(v->n_members, 2); /* only the two real ones */
    assert_int_equal(v->n_healthy_groups, 2);
    graft_membership_view_free(v);

    /* a fresh handle reading the same garbage at start-up is not disturbed */
    graft_membership_t *obs2 = observe("junk", 1);
    assert_int_equal(graft_membership_view_get(obs2, &v), GRAFT_OK);
    assert_int_equal(v->n_members, 2);
    assert_true(v->malformed >= 3);
    graft_membership_view_free(v);

    /* the quorum still forms, and events still read (garbage one skipped) */
    step_arg_t sa = mk(a, 0, 1, 3000), sb = mk(b, 0, 1, 3000);
    run_pair(&sa, &sb);
    assert_true(sa.decision && sb.decision);
    /* the garbage ready record was read with the others, reported, skipped */
    graft_membership_stats_t stats;
    graft_membership_stats_get(a, &stats);
    assert_true(stats.malformed >= 4);
    graft_event_t *evs = NULL;
    size_t n = 0;
    assert_int_equal(graft_membership_events_read(obs2, 0, &evs, &n), GRAFT_OK);
    assert_true(n >= 2);
    for (size_t i = 0; i < n; i++)
        assert_int_not_equal(evs[i].seq, (uint64_t)junk_event_rev);
    graft_membership_events_free(evs, n);

    /* garbage in the quorum key: reported, and the next round replaces it */
    assert_int_equal(graft_etcd_put(T.client, "/graft/junk/quorum", junk, strlen(junk), 0, NULL,
                                    NULL), GRAFT_OK);
    sa = mk(a, 1, 1, 3000);
    sb = mk(b, 1, 1, 3000);
    run_pair(&sa, &sb);
    assert_true(sa.decision && sb.decision);
    assert_true(sa.round >= 2);
    graft_membership_destroy(obs2);
    graft_membership_destroy(a);
    graft_membership_destroy(b);
    graft_membership_destroy(obs);
}

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
    graft_membership_config_t c = cfg_for(job, 0, 0, 1);
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
    assert_int_equal(graft_etcd_lease_revoke(T.client, lease), GRAFT_OK);
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
 * thread re-joins: the next quorum call waits for the re-join (here held
 * up by the callback) up to its timeout, instead of returning GRAFT_ELEASE
 * at once to a caller that would ask again in a tight loop. */
static void on_lease_slow(graft_membership_notice_t what, uint64_t inc, graft_status_t why,
                          void *arg)
{
    on_lease(what, inc, why, arg);
    if (what == GRAFT_MEMBERSHIP_LEASE_LOST)
        usleep(1000 * 1000); /* the re-join starts after the callback */
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
    /* a longer one sees the re-join through */
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
    graft_membership_t *m = join("ka-retries", 0, 0, 1);
    assert_int_equal(m->ops->max_retries, etcd_cfg.max_retries);
    assert_int_equal(m->ka->max_retries, 0);
    assert_true(m->ka->request_timeout_ms <= 2000u / 3u + 1u);
    graft_membership_destroy(m);

    /* a zero max_retries still means the default for the caller's requests */
    graft_etcd_config_t e = etcd_cfg;
    e.max_retries = 0;
    graft_membership_config_t c = cfg_for("ka-retries", 0, 0, 1);
    c.etcd = &e;
    assert_int_equal(graft_membership_create(&c, &m), GRAFT_OK);
    assert_int_equal(m->ops->max_retries, 3);
    assert_int_equal(m->ka->max_retries, 0);
    graft_membership_destroy(m);
}

/* --------------------------------------------------------- event history --- */

static void test_event_history_bounded(void **state)
{
    (void)state;
    graft_membership_config_t c = cfg_for("hist", 0, 0, 1);
    c.event_history = 5;
    graft_membership_t *m = NULL;
    assert_int_equal(graft_membership_create(&c, &m), GRAFT_OK); /* 1 join event */
    for (int i = 0; i < 9; i++) {
        graft_event_t ev = {0};
        ev.kind = GRAFT_EVENT_CHECKPOINT;
        ev.step = (uint64_t)i;
        ev.detail = "ckpt";
        assert_int_equal(graft_membership_event_append(m, &ev), GRAFT_OK);
    }
    graft_event_t bad = {0};
    assert_int_equal(graft_membership_event_append(m, &bad), GRAFT_EINVAL);
    graft_event_t *evs = NULL;
    size_t n = 0;
    assert_int_equal(graft_membership_events_read(m, 0, &evs, &n), GRAFT_OK);
    /* The newest 5, oldest first; seq is the event's create_revision. */
    assert_int_equal(n, 5);
    for (size_t i = 0; i < n; i++) {
        assert_int_equal(evs[i].step, 4 + i);
        assert_true(i == 0 || evs[i].seq > evs[i - 1].seq);
    }
    uint64_t after = evs[2].seq;
    graft_membership_events_free(evs, n);
    assert_int_equal(graft_membership_events_read(m, after, &evs, &n), GRAFT_OK);
    assert_int_equal(n, 2);
    assert_int_equal(evs[0].step, 7);
    graft_membership_events_free(evs, n);
    graft_membership_destroy(m);
}

/* ------------------------------------------------------ allocation torture --- */


/* Fail the n-th allocation of a join for each n in turn: every failure is a
 * clean error (never a crash, a hang or a leak under ASan), and with enough
 * allocations the join works. Background threads started before the
 * failing allocation must also wind down cleanly. */
static void test_create_alloc_torture(void **state)
{
    (void)state;
    bool done = false;
    long n;
    for (n = 0; n < 2000 && !done; n += (n < 100 ? 1 : 7)) {
        graft_membership_config_t c = cfg_for("torture", 0, 0, 1);
        graft_membership_t *m = NULL;
        graft_test_alloc_fail_after((int)n);
        graft_status_t st = graft_membership_create(&c, &m);
        graft_test_alloc_fail_after(-1); /* let the threads and the teardown run freely */
        if (st == GRAFT_OK) {
            done = true;
            graft_membership_destroy(m);
        } else {
            assert_null(m);
            assert_true(st == GRAFT_ENOMEM || graft_status_class(st) == GRAFT_CLASS_JOB);
        }
        graft_test_alloc_restore();
    }
    assert_true(done);
    print_message("# create succeeded with %ld allocations allowed\n", n);
}

/* Fail the n-th allocation of a steady-state round for each n in turn:
 * the fast path's preparation, its transaction, the adoption of the round
 * into the view and the caller's copy all fail cleanly (ENOMEM, nothing
 * leaked under ASan), a later call still forms the next round, and with
 * enough allocations the round is formed on the fast path. */
static void test_fast_path_alloc_torture(void **state)
{
    (void)state;
    graft_membership_t *m = join("torture-fast", 0, 0, 1);
    uint64_t committed = 0;
    bool fast_done = false;
    long n;
    for (n = 0; n < 400 && !fast_done; n++) {
        graft_membership_stats_t before, after;
        graft_quorum_t *q = NULL;
        graft_membership_stats_get(m, &before);
        graft_test_alloc_fail_after((int)n);
        graft_status_t st = graft_membership_quorum_wait(m, committed, 5000, &q);
        graft_test_alloc_fail_after(-1);
        graft_test_alloc_restore();
        if (st != GRAFT_OK) {
            assert_null(q);
            assert_true(st == GRAFT_ENOMEM || st == GRAFT_ELEASE ||
                        graft_status_class(st) == GRAFT_CLASS_JOB);
            continue;
        }
        assert_int_equal(q->step, committed);
        graft_membership_stats_get(m, &after);
        fast_done = after.quorum_fast > before.quorum_fast;
        bool decision = false;
        assert_int_equal(graft_membership_commit_vote(m, q, true, NULL, 3000, &decision), GRAFT_OK);
        assert_true(decision);
        committed = q->step + 1;
        graft_membership_quorum_free(q);
    }
    assert_true(fast_done);
    print_message("# fast round formed with %ld allocations allowed\n", n - 1);
    graft_membership_destroy(m);
}

/* ----------------------------------------------------- etcd unreachable --- */

static void test_etcd_down_cannot_commit(void **state)
{
    (void)state;
    graft_membership_config_t c = cfg_for("down", 0, 0, 1);
    c.lease_ttl_s = 5; /* outlives the outage: what is tested is the vote */
    graft_membership_t *a = NULL;
    assert_int_equal(graft_membership_create(&c, &a), GRAFT_OK);
    graft_quorum_t *q = NULL;
    assert_int_equal(graft_membership_quorum_wait(a, 3, 3000, &q), GRAFT_OK);
    assert_int_equal(graft_etcd_server_stop(T.server), GRAFT_OK);
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
    assert_int_equal(graft_etcd_server_restart(T.server), GRAFT_OK);
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
 * loss is reported and it does not re-join while etcd cannot answer, and a
 * call that needs etcd fails with etcd's error. Once etcd is back (same
 * data directory) its answer decides: etcd keeps leases across a restart,
 * so the lease lived and the same incarnation goes on, with no re-join
 * (each re-join a grant, a record and a revoke that every view follows,
 * and a heal for its group). */
static void test_etcd_down_past_ttl_waits(void **state)
{
    (void)state;
    lease_log_t log = {PTHREAD_MUTEX_INITIALIZER, 0, 0, 0, 0, GRAFT_OK};
    graft_membership_config_t c = cfg_for("downttl", 0, 0, 1);
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

    assert_int_equal(graft_etcd_server_stop(T.server), GRAFT_OK);
    usleep(2u * c.lease_ttl_s * 1000000u + 500000u);
    assert_int_equal(lease_log_get(&log, NULL), 0);
    assert_int_equal(graft_membership_health(m, q, &h), GRAFT_OK);
    assert_false(h.lease_fresh);
    graft_quorum_t *q2 = NULL;
    graft_status_t st = graft_membership_quorum_wait(m, 1, 1500, &q2);
    assert_int_not_equal(st, GRAFT_OK);
    assert_int_not_equal(st, GRAFT_ELEASE);
    assert_null(q2);

    assert_int_equal(graft_etcd_server_restart(T.server), GRAFT_OK);
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

/* ------------------------------------------------ compaction and restart --- */

static void test_view_resyncs_after_compaction(void **state)
{
    (void)state;
    graft_membership_t *obs = observe("compact", 1);
    graft_membership_t *a = join("compact", 0, 0, 1);
    graft_membership_t *b = join("compact", 1, 0, 1);
    assert_true(wait_view(obs, 2, 2, 3000));
    /* Hold the observer's view lock so its watch thread stalls with an
     * event in hand; then break the stream (etcd restart), change the
     * membership and compact past everything the watch has seen. When
     * the thread resumes, its reconnect hits the compacted revision. */
    graft_member_t poke = {8, 0, 5, "h", 1, "", 0, 0, GRAFT_MEMBER_HEALTHY, 0, 0};
    uint8_t *pbuf;
    size_t plen;
    assert_int_equal(graft__mship_member_encode(&poke, &pbuf, &plen), GRAFT_OK);
    pthread_mutex_lock(&obs->mu);
    assert_int_equal(graft_etcd_put(T.client, "/graft/compact/members/8/0", pbuf, plen, 0, NULL,
                                    NULL), GRAFT_OK);
    graft_free(pbuf);
    usleep(300000);
    assert_int_equal(graft_etcd_server_stop(T.server), GRAFT_OK);
    assert_int_equal(graft_etcd_server_restart(T.server), GRAFT_OK);
    graft_membership_destroy(b); /* leaves: its record goes */
    graft_member_t extra = {9, 0, 5, "h", 1, "", 0, 0, GRAFT_MEMBER_HEALTHY, 0, 0};
    uint8_t *buf;
    size_t len;
    int64_t rev = 0;
    assert_int_equal(graft__mship_member_encode(&extra, &buf, &len), GRAFT_OK);
    assert_int_equal(graft_etcd_put(T.client, "/graft/compact/members/9/0", buf, len, 0, NULL, &rev),
                     GRAFT_OK);
    graft_free(buf);
    assert_int_equal(graft_etcd_compact(T.client, rev), GRAFT_OK);
    pthread_mutex_unlock(&obs->mu);

    uint64_t end = graft__now_ns() + 8000000000ull;
    graft_membership_view_t *v = NULL;
    for (;;) {
        assert_int_equal(graft_membership_view_get(obs, &v), GRAFT_OK);
        bool ok = v->resyncs >= 1 && v->n_members == 3 && v->members[2].group == 9;
        if (ok || graft__now_ns() > end)
            break;
        graft_membership_view_free(v);
        usleep(50000);
    }
    assert_true(v->resyncs >= 1);
    assert_int_equal(v->n_members, 3); /* b's leave seen, the new record seen */
    assert_int_equal(v->members[0].group, 0);
    assert_int_equal(v->members[1].group, 8);
    assert_int_equal(v->members[2].group, 9);
    graft_membership_view_free(v);
    /* and it keeps following changes after the resync */
    assert_int_equal(graft_etcd_delete(T.client, "/graft/compact/members/9/0", false, NULL, NULL),
                     GRAFT_OK);
    assert_int_equal(graft_etcd_delete(T.client, "/graft/compact/members/8/0", false, NULL, NULL),
                     GRAFT_OK);
    assert_true(wait_view(obs, 1, 1, 3000));
    graft_membership_destroy(a);
    graft_membership_destroy(obs);
}

int main(int argc, char **argv)
{
    (void)argc;
    (void)argv;
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_config_rejected),
        cmocka_unit_test(test_join_view_leave),
        cmocka_unit_test(test_race_one_quorum_per_round),
        cmocka_unit_test(test_replica_rank_is_index_in_members),
        cmocka_unit_test(test_min_groups_not_met),
        cmocka_unit_test(test_commit_vote),
        cmocka_unit_test(test_commit_vote_one_rank),
        cmocka_unit_test(test_voted_since),
        cmocka_unit_test(test_commit_vote_late_rank_agrees),
        cmocka_unit_test(test_commit_vote_race_at_timeout),
        cmocka_unit_test(test_fast_path),
        cmocka_unit_test(test_blob),
        cmocka_unit_test(test_pair_blob),
        cmocka_unit_test(test_garbage_records_skipped),
        cmocka_unit_test(test_lease_revoked_rejoins),
        cmocka_unit_test(test_quorum_waits_for_rejoin),
        cmocka_unit_test(test_keepalive_client_never_retries),
        cmocka_unit_test(test_event_history_bounded),
        cmocka_unit_test(test_create_alloc_torture),
        cmocka_unit_test(test_fast_path_alloc_torture),
        cmocka_unit_test(test_etcd_down_cannot_commit),
        cmocka_unit_test(test_etcd_down_past_ttl_waits),
        cmocka_unit_test(test_view_resyncs_after_compaction),
    };
    /* TEST_FILTER=test_commit_vote* runs only the tests it matches. */
    if (getenv("TEST_FILTER") != NULL)
        cmocka_set_test_filter(getenv("TEST_FILTER"));
    return cmocka_run_group_tests_name("membership", tests, group_setup, group_teardown);
}
