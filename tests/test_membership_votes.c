/* Membership's commit votes against a real etcd, in one process (every rank
 * a handle driven by its own thread): a vote per round, one rank's vote,
 * voted_since, a late rank agreeing, a race at the timeout; the steady
 * path's fast rounds (and under allocation failures); blobs; garbage
 * records skipped. The fixture is tests/support/membership_fixture.h. */
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
    graft_membership_t *a = mf_join("vote", 0, 0, 2), *b = mf_join("vote", 0, 1, 2);
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
    graft_membership_t *a = mf_join("vote1", 0, 0, 1);
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
    graft_membership_t *a = mf_join("vsince", 0, 0, 1);
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
    assert_int_equal(graft_etcd_range(mf_etcd.client, prefix, &opts, &res), GRAFT_OK);
    size_t n = res.n_kvs;
    graft_etcd_range_result_clear(&res);
    return n;
}

/* A rank whose lease outlives a loaded machine's stalls: what these tests
 * check is the vote, not the lease. */
static graft_membership_t *join_steady(const char *job, uint32_t g, uint32_t r, uint32_t R)
{
    graft_membership_config_t c = mf_cfg_for(job, g, r, R);
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
    assert_int_equal(graft_etcd_put(mf_etcd.client, "/graft/votelate/votes/0/x/1", junk,
                                    strlen(junk), 0, NULL, NULL),
                     GRAFT_OK);
    assert_int_equal(graft_etcd_put(mf_etcd.client, "/graft/votelate/votes/0/1/7", junk,
                                    strlen(junk), 0, NULL, NULL),
                     GRAFT_OK);

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
    assert_int_equal(
        graft_etcd_delete(mf_etcd.client, "/graft/votelate/votes/0/x/1", false, NULL, NULL),
        GRAFT_OK);
    assert_int_equal(
        graft_etcd_delete(mf_etcd.client, "/graft/votelate/votes/0/1/7", false, NULL, NULL),
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
        ranks[i].m = mf_join("fast", (uint32_t)(i / FAST_R), (uint32_t)(i % FAST_R), FAST_R);
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
        ranks[i].m = mf_join("fast", 2, (uint32_t)(i % FAST_R), FAST_R);
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
    graft_membership_t *a = mf_join("blob", 0, 0, 1), *b = mf_join("blob", 1, 0, 1);
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
    assert_int_equal(
        graft_etcd_get(mf_etcd.client, "/graft/blob/blob/00000000000000000007", &kv, NULL),
        GRAFT_ENOTFOUND);
    assert_int_equal(
        graft_etcd_get(mf_etcd.client, "/graft/blob/blob/00000000000000000011", &kv, NULL),
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
    graft_membership_t *d0 = mf_join("pairs", 0, 0, 2), *d1 = mf_join("pairs", 0, 1, 2);
    graft_membership_t *r0 = mf_join("pairs", 2, 0, 2), *r1 = mf_join("pairs", 2, 1, 2);
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
    assert_int_equal(
        graft_etcd_get(mf_etcd.client, "/graft/pairs/pairs/00000000000000000005/0/2/1", &kv, NULL),
        GRAFT_OK);
    graft_etcd_kv_clear(&kv);
    graft_membership_destroy(d1);
    assert_int_equal(
        graft_etcd_get(mf_etcd.client, "/graft/pairs/pairs/00000000000000000005/0/2/1", &kv, NULL),
        GRAFT_ENOTFOUND);
    graft_membership_destroy(d0);
    graft_membership_destroy(r0);
    graft_membership_destroy(r1);
}

/* ------------------------------------------------------------- garbage --- */

static void test_garbage_records_skipped(void **state)
{
    (void)state;
    graft_membership_t *obs = mf_observe("junk", 1);
    graft_membership_t *a = mf_join("junk", 0, 0, 1), *b = mf_join("junk", 1, 0, 1);
    const char *junk = "\xff\xfe garbage that is not a protobuf \x01";
    /* garbage member record, a record under the wrong key, a bad key, garbage
     * ready and vote records, a garbage event and a garbage counter */
    assert_int_equal(graft_etcd_put(mf_etcd.client, "/graft/junk/members/5/0", junk, strlen(junk),
                                    0, NULL, NULL),
                     GRAFT_OK);
    graft_member_t imposter = {6, 0, 5, "h", 1, "", 0, 0, GRAFT_MEMBER_HEALTHY, 0, 0, NULL};
    uint8_t *buf;
    size_t len;
    assert_int_equal(graft__mship_member_encode(&imposter, &buf, &len), GRAFT_OK);
    assert_int_equal(
        graft_etcd_put(mf_etcd.client, "/graft/junk/members/7/0", buf, len, 0, NULL, NULL),
        GRAFT_OK);
    graft_free(buf);
    assert_int_equal(
        graft_etcd_put(mf_etcd.client, "/graft/junk/members/x/y", "1", 1, 0, NULL, NULL), GRAFT_OK);
    assert_int_equal(
        graft_etcd_put(mf_etcd.client, "/graft/junk/ready/1/3/0", junk, 3, 0, NULL, NULL),
        GRAFT_OK);
    int64_t junk_event_rev = 0; /* an event's seq is its key's create_revision */
    assert_int_equal(graft_etcd_put(mf_etcd.client, "/graft/junk/events/00000000000000000099", junk,
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
    graft_membership_t *obs2 = mf_observe("junk", 1);
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
    assert_int_equal(
        graft_etcd_put(mf_etcd.client, "/graft/junk/quorum", junk, strlen(junk), 0, NULL, NULL),
        GRAFT_OK);
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

/* Fail the n-th allocation of a steady-state round for each n in turn:
 * the fast path's preparation, its transaction, the adoption of the round
 * into the view and the caller's copy all fail cleanly (ENOMEM, nothing
 * leaked under ASan), a later call still forms the next round, and with
 * enough allocations the round is formed on the fast path. */
static void test_fast_path_alloc_torture(void **state)
{
    (void)state;
    graft_membership_t *m = mf_join("torture-fast", 0, 0, 1);
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

int main(int argc, char **argv)
{
    (void)argc;
    (void)argv;
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_commit_vote),
        cmocka_unit_test(test_commit_vote_one_rank),
        cmocka_unit_test(test_voted_since),
        cmocka_unit_test(test_commit_vote_late_rank_agrees),
        cmocka_unit_test(test_commit_vote_race_at_timeout),
        cmocka_unit_test(test_fast_path),
        cmocka_unit_test(test_blob),
        cmocka_unit_test(test_pair_blob),
        cmocka_unit_test(test_garbage_records_skipped),
        cmocka_unit_test(test_fast_path_alloc_torture),
    };
    /* TEST_FILTER=test_commit_vote* runs only the tests it matches. */
    if (getenv("TEST_FILTER") != NULL)
        cmocka_set_test_filter(getenv("TEST_FILTER"));
    return cmocka_run_group_tests_name("membership_votes", tests, mf_group_setup,
                                       mf_group_teardown);
}
