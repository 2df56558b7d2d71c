/* Membership against a real etcd, in one process: every rank is a handle
 * with its own clients and lease, driven by its own thread. Join, view and
 * leave; quorum races; min_groups; the event history; compaction
 * resync; a join under allocation failures. The commit votes, the fast
 * path, blobs and garbage records are in test_membership_votes.c, a revoked lease
 * and etcd out of reach in test_membership_lease.c (all three over
 * tests/support/membership_fixture.h); the tests that need real processes
 * (SIGKILL, SIGSTOP, etcd restart) are in test_membership_failures.c. */
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

/* ---------------------------------------------------------------- tests --- */

static void test_config_rejected(void **state)
{
    (void)state;
    graft_membership_t *m = NULL;
    graft_membership_config_t c = mf_cfg_for("bad/job", 0, 0, 1);
    assert_int_equal(graft_membership_create(&c, &m), GRAFT_EINVAL);
    c = mf_cfg_for("", 0, 0, 1);
    assert_int_equal(graft_membership_create(&c, &m), GRAFT_EINVAL);
    c = mf_cfg_for("ok", 0, 2, 2); /* rank outside the group */
    assert_int_equal(graft_membership_create(&c, &m), GRAFT_EINVAL);
    c = mf_cfg_for("ok", 0, 0, 1);
    c.etcd = NULL;
    assert_int_equal(graft_membership_create(&c, &m), GRAFT_EINVAL);
    assert_null(m);
    /* etcd that does not answer: a clear job-class error, no handle */
    const char *dead = "http://127.0.0.1:1";
    graft_etcd_config_t e = mf_etcd_cfg;
    e.endpoints = &dead;
    c = mf_cfg_for("ok", 0, 0, 1);
    c.etcd = &e;
    graft_status_t st = graft_membership_create(&c, &m);
    assert_int_equal(graft_status_class(st), GRAFT_CLASS_JOB);
    assert_null(m);
    graft_membership_destroy(NULL);
}

static void test_join_view_leave(void **state)
{
    (void)state;
    graft_membership_t *obs = mf_observe("jv", 2);
    graft_membership_t *r[4];
    for (int i = 0; i < 4; i++)
        r[i] = mf_join("jv", (uint32_t)i / 2, (uint32_t)i % 2, 2);
    assert_true(mf_wait_view(obs, 4, 2, 3000));
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
    assert_true(mf_wait_view(obs, 3, 1, 3000));
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
    assert_true(mf_wait_view(obs, 0, 0, 3000));
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
    graft_membership_t *obs = mf_observe("race", RACE_R);
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
        runs[i].m = mf_join("race", runs[i].g, runs[i].r, RACE_R);
        /* Every rank re-reads the ready set every millisecond, so many see
         * it complete at once and race to form the round. */
        runs[i].m->race_poll_ns = 1000000;
        /* Every round by compare-and-swap: the fast path has its own test. */
        runs[i].m->fast_path_off = true;
    }
    assert_true(mf_wait_view(obs, RACE_G * RACE_R, RACE_G, 5000));
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
    graft_membership_t *obs = mf_observe("rrank", NR);
    for (uint32_t i = 0; i < NG * NR; i++) {
        memset(&runs[i], 0, sizeof(runs[i]));
        runs[i].g = groups[i / NR];
        runs[i].r = i % NR;
        runs[i].committed = 4;
        /* a mf_join timeout no loaded machine reaches: every group is in */
        graft_membership_config_t c = mf_cfg_for("rrank", runs[i].g, runs[i].r, NR);
        c.join_timeout_ms = 8000;
        assert_int_equal(graft_membership_create(&c, &runs[i].m), GRAFT_OK);
    }
    assert_true(mf_wait_view(obs, NG * NR, NG, 5000));
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
    assert_true(mf_wait_view(obs, (NG - 1) * NR, NG - 1, 5000));
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
    graft_membership_config_t c0 = mf_cfg_for("minq", 0, 0, 1), c1 = mf_cfg_for("minq", 1, 0, 1);
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
    /* after the mf_join timeout (800 ms), not the overall timeout */
    assert_true(took_ms >= 700 && took_ms < 5000);
    assert_null(q);
    pthread_join(th, NULL);
    assert_int_equal(rb.last_st, GRAFT_ENOQUORUM);
    assert_int_equal(graft_membership_quorum_latest(a, &q), GRAFT_ENOTFOUND);
    graft_membership_destroy(a);
    graft_membership_destroy(b);
}

/* --------------------------------------------------------- event history --- */

static void test_event_history_bounded(void **state)
{
    (void)state;
    graft_membership_config_t c = mf_cfg_for("hist", 0, 0, 1);
    c.event_history = 5;
    graft_membership_t *m = NULL;
    assert_int_equal(graft_membership_create(&c, &m), GRAFT_OK); /* 1 mf_join event */
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

/* Fail the n-th allocation of a mf_join for each n in turn: every failure is a
 * clean error (never a crash, a hang or a leak under ASan), and with enough
 * allocations the mf_join works. Background threads started before the
 * failing allocation must also wind down cleanly. */
static void test_create_alloc_torture(void **state)
{
    (void)state;
    bool done = false;
    long n;
    for (n = 0; n < 2000 && !done; n += (n < 100 ? 1 : 7)) {
        graft_membership_config_t c = mf_cfg_for("torture", 0, 0, 1);
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

/* ------------------------------------------------ compaction and restart --- */

static void test_view_resyncs_after_compaction(void **state)
{
    (void)state;
    graft_membership_t *obs = mf_observe("compact", 1);
    graft_membership_t *a = mf_join("compact", 0, 0, 1);
    graft_membership_t *b = mf_join("compact", 1, 0, 1);
    assert_true(mf_wait_view(obs, 2, 2, 3000));
    /* Hold the observer's view lock so its watch thread stalls with an
     * event in hand; then break the stream (etcd restart), change the
     * membership and compact past everything the watch has seen. When
     * the thread resumes, its reconnect hits the compacted revision. */
    graft_member_t poke = {8, 0, 5, "h", 1, "", 0, 0, GRAFT_MEMBER_HEALTHY, 0, 0, NULL};
    uint8_t *pbuf;
    size_t plen;
    assert_int_equal(graft__mship_member_encode(&poke, &pbuf, &plen), GRAFT_OK);
    pthread_mutex_lock(&obs->mu);
    assert_int_equal(
        graft_etcd_put(mf_etcd.client, "/graft/compact/members/8/0", pbuf, plen, 0, NULL, NULL),
        GRAFT_OK);
    graft_free(pbuf);
    usleep(300000);
    assert_int_equal(graft_etcd_server_stop(mf_etcd.server), GRAFT_OK);
    assert_int_equal(graft_etcd_server_restart(mf_etcd.server), GRAFT_OK);
    graft_membership_destroy(b); /* leaves: its record goes */
    graft_member_t extra = {9, 0, 5, "h", 1, "", 0, 0, GRAFT_MEMBER_HEALTHY, 0, 0, NULL};
    uint8_t *buf;
    size_t len;
    int64_t rev = 0;
    assert_int_equal(graft__mship_member_encode(&extra, &buf, &len), GRAFT_OK);
    assert_int_equal(
        graft_etcd_put(mf_etcd.client, "/graft/compact/members/9/0", buf, len, 0, NULL, &rev),
        GRAFT_OK);
    graft_free(buf);
    assert_int_equal(graft_etcd_compact(mf_etcd.client, rev), GRAFT_OK);
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
    assert_int_equal(
        graft_etcd_delete(mf_etcd.client, "/graft/compact/members/9/0", false, NULL, NULL),
        GRAFT_OK);
    assert_int_equal(
        graft_etcd_delete(mf_etcd.client, "/graft/compact/members/8/0", false, NULL, NULL),
        GRAFT_OK);
    assert_true(mf_wait_view(obs, 1, 1, 3000));
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
        cmocka_unit_test(test_event_history_bounded),
        cmocka_unit_test(test_create_alloc_torture),
        cmocka_unit_test(test_view_resyncs_after_compaction),
    };
    /* TEST_FILTER=test_commit_vote* runs only the tests it matches. */
    if (getenv("TEST_FILTER") != NULL)
        cmocka_set_test_filter(getenv("TEST_FILTER"));
    return cmocka_run_group_tests_name("membership", tests, mf_group_setup, mf_group_teardown);
}
