/*
 * The runtime's group channel (runtime/runtime_channel.c) over real UCX
 * endpoints on loopback, and the steady path's pure decisions
 * (runtime/steady_logic.c) as tables (a newcomer ends a wait before the
 * ready at once): an authentic message arrives whole;
 * one keyed with another secret, or bytes that are no message, are dropped
 * and counted before a reader sees them; the stash keeps, drops and hands
 * over messages in arrival order and forgets the oldest when full.
 */
#include <graft/transfer.h>

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <cmocka.h>

#include "proto/graft.pb-c.h"
#include "runtime/runtime_channel.h"
#include "runtime/steady_logic.h"

static const uint8_t SECRET[] = "secret-of-the-channel-tests-0123";
static const uint8_t OTHER[] = "another-job-secret-of-these-test";

static graft_transfer_endpoint_t *endpoint(uint32_t group)
{
    graft_transfer_config_t cfg = {.listen_address = "127.0.0.1", .group = group,
                                   .job_secret = SECRET, .job_secret_len = sizeof(SECRET) - 1};
    graft_transfer_endpoint_t *ep = NULL;
    assert_int_equal(graft_transfer_endpoint_create(&cfg, &ep), GRAFT_OK);
    return ep;
}

static graft__step_msg_t ready(uint64_t step, bool ok)
{
    return (graft__step_msg_t){.kind = GRAFT__STEP_MESSAGE__KIND__READY, .quorum_id = 7,
                               .members_hash = 9, .epoch_round = 3, .step = step, .ok = ok};
}

/* A message sent through one channel arrives through the other with the
 * sender's group and rank and every field; one keyed with another secret
 * and raw bytes are dropped, and only the first counts as rejected. */
static void test_channel_authenticates(void **state)
{
    (void)state;
    graft_transfer_endpoint_t *a = endpoint(0), *b = endpoint(1);
    graft__channel_t *ca = NULL, *cb = NULL, *stranger = NULL;
    assert_int_equal(graft__channel_create(a, SECRET, sizeof(SECRET) - 1, 0, 2, &ca), GRAFT_OK);
    assert_int_equal(graft__channel_create(b, SECRET, sizeof(SECRET) - 1, 1, 0, &cb), GRAFT_OK);
    assert_int_equal(graft__channel_create(a, OTHER, sizeof(OTHER) - 1, 0, 2, &stranger),
                     GRAFT_OK);
    const char *to = graft_transfer_endpoint_address(b);

    graft__step_msg_t m = ready(41, true), got;
    m.group = 99; /* the channel sends as its own group and rank */
    assert_int_equal(graft__channel_send(ca, to, &m, 5000), GRAFT_OK);
    assert_int_equal(graft__channel_recv(cb, 5000, &got), GRAFT_OK);
    assert_int_equal(got.kind, GRAFT__STEP_MESSAGE__KIND__READY);
    assert_int_equal(got.step, 41);
    assert_int_equal(got.group, 0);
    assert_int_equal(got.rank, 2);
    assert_true(got.ok);
    assert_int_equal(graft__channel_rejected(cb), 0);

    m = ready(42, true);
    assert_int_equal(graft__channel_send(stranger, to, &m, 5000), GRAFT_OK);
    assert_int_equal(graft__channel_recv(cb, 5000, &got), GRAFT_ETOKEN);
    assert_int_equal(graft__channel_rejected(cb), 1);
    const char junk[] = "not a step message";
    assert_int_equal(graft_transfer_msg_send(a, to, junk, sizeof(junk), 5000), GRAFT_OK);
    graft_status_t st = graft__channel_recv(cb, 5000, &got);
    assert_true(st != GRAFT_OK && st != GRAFT_ETIMEOUT && st != GRAFT_ETOKEN);
    assert_int_equal(graft__channel_rejected(cb), 1);
    assert_int_equal(graft__channel_recv(cb, 50, &got), GRAFT_ETIMEOUT);

    graft__channel_destroy(stranger);
    graft__channel_destroy(ca);
    graft__channel_destroy(cb);
    graft_transfer_endpoint_destroy(a);
    graft_transfer_endpoint_destroy(b);
}

/* Takes the message of step *ctx, drops those of earlier steps. */
static graft__stash_verdict_t sort_step(const graft__step_msg_t *m, void *ctx)
{
    uint64_t want = *(const uint64_t *)ctx;
    if (m->step < want)
        return GRAFT__STASH_DROP;
    return m->step == want ? GRAFT__STASH_TAKE : GRAFT__STASH_KEEP;
}

static graft__stash_verdict_t count_all(const graft__step_msg_t *m, void *ctx)
{
    (void)m;
    (*(size_t *)ctx)++;
    return GRAFT__STASH_KEEP;
}

static void test_channel_stash(void **state)
{
    (void)state;
    graft__channel_t *ch = NULL;
    assert_int_equal(graft__channel_create(NULL, SECRET, sizeof(SECRET) - 1, 0, 0, &ch),
                     GRAFT_OK);
    graft__step_msg_t m, got;
    for (uint64_t s = 1; s <= 5; s++) {
        m = ready(s, s % 2 == 0);
        graft__channel_stash(ch, &m);
    }
    m = ready(4, true); /* a second message of step 4, after the first */
    graft__channel_stash(ch, &m);
    uint64_t want = 4;
    assert_true(graft__channel_take(ch, sort_step, &want, &got));
    assert_int_equal(got.step, 4);
    assert_true(got.ok);
    size_t n = 0;
    assert_false(graft__channel_take(ch, count_all, &n, &got));
    assert_int_equal(n, 2); /* steps 1-3 dropped on the way; 5 and the second 4 kept */
    assert_true(graft__channel_take(ch, sort_step, &want, &got));
    assert_int_equal(got.step, 4);
    want = 6;
    assert_false(graft__channel_take(ch, sort_step, &want, &got)); /* 5 dropped */
    n = 0;
    assert_false(graft__channel_take(ch, count_all, &n, &got));
    assert_int_equal(n, 0);
    /* A full stash forgets its oldest message. */
    for (uint64_t s = 1; s <= 300; s++) {
        m = ready(s, true);
        graft__channel_stash(ch, &m);
    }
    n = 0;
    (void)graft__channel_take(ch, count_all, &n, &got);
    assert_int_equal(n, 256);
    want = 44;
    assert_false(graft__channel_take(ch, sort_step, &want, &got));
    want = 45;
    assert_true(graft__channel_take(ch, sort_step, &want, &got));
    graft__channel_destroy(ch);
}

typedef struct epoch_row {
    graft__epoch_facts_t f;
    graft__epoch_check_t check;
    graft__epoch_state_t want;
    bool asks_own_ranks;
} epoch_row_t;

static void test_steady_epoch_state_table(void **state)
{
    (void)state;
#define R GRAFT__CHECK_READY
#define V GRAFT__CHECK_VOTE
#define W GRAFT__CHECK_VOTE_WAIT
#define H GRAFT__EPOCH_HOLDS
#define C GRAFT__EPOCH_CHANGED
#define N GRAFT__EPOCH_NO_LEASE
    /* known, lease_fresh, epoch_intact, round_current, own_ranks_same, newcomer */
    const epoch_row_t rows[] = {
        {{false, true, true, true, true, false}, R, N, false},  /* nothing known: no */
        {{false, true, true, true, true, false}, W, N, false},
        {{true, false, true, true, true, false}, V, N, false},  /* lease in doubt */
        {{true, true, true, true, true, false}, R, H, false},
        {{true, true, false, true, true, false}, R, C, false},  /* members changed: no ready */
        {{true, true, false, true, true, false}, V, H, false},  /* but the vote stands */
        {{true, true, true, false, true, false}, R, H, false},  /* ready reads the members only */
        {{true, true, true, false, true, false}, V, C, false},  /* a later round ends the vote */
        {{true, true, false, true, true, false}, W, H, true},   /* another group changed */
        {{true, true, false, true, false, false}, W, C, true},  /* a rank of ours replaced */
        {{true, true, true, true, false, false}, W, H, false},  /* intact: ranks not asked */
        {{true, true, false, false, false, false}, W, C, false},
    };
#undef R
#undef V
#undef W
#undef H
#undef C
#undef N
    for (size_t i = 0; i < sizeof(rows) / sizeof(rows[0]); i++) {
        const char *why = NULL;
        graft__epoch_state_t got = graft__steady_epoch_state(&rows[i].f, rows[i].check, &why);
        if (got != rows[i].want || graft__steady_asks_own_ranks(&rows[i].f, rows[i].check) !=
                                       rows[i].asks_own_ranks)
            fail_msg("row %zu: state %d (want %d)", i, (int)got, (int)rows[i].want);
        assert_true((got == GRAFT__EPOCH_HOLDS) == (why == NULL));
    }
}

static void test_steady_may_ready_table(void **state)
{
    (void)state;
    const char *why = NULL;
    assert_true(graft__steady_may_ready(true, 9, 9, true, false, &why));
    assert_null(why);
    assert_false(graft__steady_may_ready(false, 9, 9, true, false, &why));
    assert_non_null(why);
    assert_false(graft__steady_may_ready(true, 8, 9, true, false, &why));
    assert_false(graft__steady_may_ready(true, 9, 9, false, false, &why));
    assert_false(graft__steady_may_ready(true, 9, 9, true, true, &why));
}

/* A newcomer (a replacement's new incarnation, or a group that joined)
 * ends a wait before the ready at once; a member that only left is
 * drained for; at the vote nothing is cut short. */
static void test_steady_newcomer_and_drain(void **state)
{
    (void)state;
    const graft__steady_proc_t was[] = {{0, 0, 11}, {0, 1, 12}, {1, 0, 21}, {1, 1, 22}};
    const graft__steady_proc_t same[] = {{1, 1, 22}, {0, 0, 11}, {1, 0, 21}, {0, 1, 12}};
    const graft__steady_proc_t left[] = {{0, 0, 11}, {0, 1, 12}, {1, 0, 21}};
    const graft__steady_proc_t replaced[] = {{0, 0, 11}, {0, 1, 12}, {1, 0, 99}, {1, 1, 22}};
    const graft__steady_proc_t joined[] = {{0, 0, 11}, {0, 1, 12}, {1, 0, 21}, {1, 1, 22},
                                           {2, 0, 31}};
    assert_false(graft__steady_newcomer(was, 4, same, 4));
    assert_false(graft__steady_newcomer(was, 4, left, 3));
    assert_false(graft__steady_newcomer(was, 4, NULL, 0));
    assert_true(graft__steady_newcomer(was, 4, replaced, 4));
    assert_true(graft__steady_newcomer(was, 4, joined, 5));
    assert_true(graft__steady_newcomer(NULL, 0, joined, 1));

    graft__epoch_facts_t f = {true, true, false, true, true, false};
    assert_true(graft__steady_drains(&f, GRAFT__CHECK_READY)); /* one left: drain */
    f.newcomer = true;
    assert_false(graft__steady_drains(&f, GRAFT__CHECK_READY));
    assert_true(graft__steady_drains(&f, GRAFT__CHECK_VOTE_WAIT));
    assert_true(graft__steady_drains(&f, GRAFT__CHECK_VOTE));
}

/* Every leader hears from every other, directly or not, after the rounds
 * of the barrier; and its partners are its mirror's. */
static void test_steady_barrier_reaches_all(void **state)
{
    (void)state;
    for (uint32_t G = 1; G <= 70; G++) {
        uint32_t rounds = graft__steady_barrier_rounds(G), to, from;
        uint64_t heard[70] = {0}; /* bit j of heard[i]: i has j's ok (G < 64 part) */
        for (uint32_t i = 0; i < G; i++)
            heard[i] = i < 64 ? 1ull << i : 0;
        for (uint32_t k = 0; k < rounds; k++) {
            uint64_t next[70];
            for (uint32_t i = 0; i < G; i++) {
                assert_true(graft__steady_barrier_partners(G, i, k, &to, &from));
                assert_true(to < G && from < G);
                uint32_t back_to, back_from;
                assert_true(graft__steady_barrier_partners(G, from, k, &back_to, &back_from));
                assert_int_equal(back_to, i);
                next[i] = heard[i] | heard[from];
            }
            memcpy(heard, next, G * sizeof(heard[0]));
        }
        assert_false(graft__steady_barrier_partners(G, 0, rounds, &to, &from));
        uint64_t all = G >= 64 ? ~0ull : (1ull << G) - 1;
        for (uint32_t i = 0; i < G; i++)
            if (heard[i] != all)
                fail_msg("G=%u: leader %u heard from %#llx", G, i, (unsigned long long)heard[i]);
    }
    uint32_t to, from;
    assert_false(graft__steady_barrier_partners(0, 0, 0, &to, &from));
    assert_false(graft__steady_barrier_partners(4, 4, 0, &to, &from));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_channel_authenticates),
        cmocka_unit_test(test_channel_stash),
        cmocka_unit_test(test_steady_epoch_state_table),
        cmocka_unit_test(test_steady_may_ready_table),
        cmocka_unit_test(test_steady_barrier_reaches_all),
        cmocka_unit_test(test_steady_newcomer_and_drain),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
