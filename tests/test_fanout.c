/* The fan-out plan of a quorum round (runtime/runtime_fanout.c), without
 * etcd: every recipient has donors, no donor is listed by more than K*D
 * recipients, every relay's recipients are its plan's serves and the other
 * way round, the tree's depth, and the plan with NCCL pairs (no relays). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdlib.h>
#include <string.h>

#include "runtime/runtime_internal.h"

/* A quorum of groups 0..n-1 at step `step`; with recipients, the last
 * n_rec groups recover from the others, each list rotated as the quorum
 * decision rotates it. */
static graft_quorum_t *quorum_make(size_t n, uint64_t step, size_t n_rec)
{
    graft_quorum_t *q = calloc(1, sizeof(*q));
    assert_non_null(q);
    q->step = step;
    q->n_members = n;
    q->members = malloc(n * sizeof(uint32_t));
    assert_non_null(q->members);
    for (size_t i = 0; i < n; i++)
        q->members[i] = (uint32_t)(10 + i); /* group ids need not be indexes */
    size_t n_src = n - n_rec;
    q->n_recoveries = n_rec;
    q->recoveries = n_rec > 0 ? calloc(n_rec, sizeof(*q->recoveries)) : NULL;
    for (size_t r = 0; r < n_rec; r++) {
        q->recoveries[r].recipient = q->members[n_src + r];
        q->recoveries[r].donors = malloc(n_src * sizeof(uint32_t));
        assert_non_null(q->recoveries[r].donors);
        for (size_t k = 0; k < n_src; k++)
            q->recoveries[r].donors[k] = q->members[(r + k) % n_src];
        q->recoveries[r].n_donors = n_src;
    }
    return q;
}

static void quorum_drop(graft_quorum_t *q)
{
    for (size_t r = 0; r < q->n_recoveries; r++)
        free(q->recoveries[r].donors);
    free(q->recoveries);
    free(q->members);
    free(q);
}

typedef struct {
    graft__fanout_t plan[300];
    size_t n;
} plans_t;

static void plans_make(plans_t *p, const graft_quorum_t *q, uint32_t k, bool relays)
{
    p->n = q->n_members;
    assert_true(p->n <= 300);
    for (size_t i = 0; i < p->n; i++)
        assert_int_equal(graft__fanout_plan(q, q->members[i], k, relays, &p->plan[i]), GRAFT_OK);
}

static void plans_free(plans_t *p)
{
    for (size_t i = 0; i < p->n; i++)
        graft__fanout_free(&p->plan[i]);
}

static size_t index_of(const graft_quorum_t *q, uint32_t g)
{
    for (size_t i = 0; i < q->n_members; i++)
        if (q->members[i] == g)
            return i;
    fail_msg("group %u is not a member", g);
    return 0;
}

/* Donors and serves agree; no group pulls from itself; returns the most
 * recipients any group serves, and the deepest pull chain. */
static void plans_check(const plans_t *p, const graft_quorum_t *q, size_t *most_p,
                        size_t *depth_p)
{
    size_t most = 0, depth = 0;
    for (size_t i = 0; i < p->n; i++) {
        const graft__fanout_t *f = &p->plan[i];
        most = f->n_serves > most ? f->n_serves : most;
        for (size_t d = 0; d < f->n_donors; d++) {
            assert_int_not_equal(f->donors[d], q->members[i]);
            /* The donor serves this group, and knows whether it is first. */
            const graft__fanout_t *df = &p->plan[index_of(q, f->donors[d])];
            bool found = false;
            for (size_t s = 0; s < df->n_serves; s++)
                if (df->serves[s].group == q->members[i]) {
                    found = true;
                    assert_int_equal(df->serves[s].primary, d == 0);
                }
            assert_true(found);
        }
        for (size_t s = 0; s < f->n_serves; s++) {
            const graft__fanout_t *rf = &p->plan[index_of(q, f->serves[s].group)];
            bool found = false;
            for (size_t d = 0; d < rf->n_donors; d++)
                found = found || rf->donors[d] == q->members[i];
            assert_true(found);
        }
        /* Follow first donors up to a group that is no recipient. */
        size_t hops = 0;
        const graft__fanout_t *c = f;
        while (c->n_donors > 0) {
            assert_true(++hops <= p->n);
            assert_true(c->relay || c == f);
            c = &p->plan[index_of(q, c->donors[0])];
        }
        depth = hops > depth ? hops : depth;
    }
    *most_p = most;
    *depth_p = depth;
}

/* A cold start of 64 groups: every other group pulls; the lowest serves
 * K; the tree is 3 levels deep (4 + 16 + 43). */
static void test_cold_start_tree(void **state)
{
    (void)state;
    graft_quorum_t *q = quorum_make(64, 0, 0);
    plans_t *p = calloc(1, sizeof(*p));
    size_t most, depth;
    plans_make(p, q, 4, true);
    plans_check(p, q, &most, &depth);
    assert_int_equal(p->plan[0].n_donors, 0);
    assert_int_equal(p->plan[0].n_serves, 4);
    for (size_t i = 1; i < 64; i++)
        assert_int_equal(p->plan[i].n_donors, 1);
    assert_int_equal(most, 4);
    assert_int_equal(depth, 3);
    /* The first level pulls from the root, the next from relays. */
    assert_int_equal(p->plan[1].donors[0], q->members[0]);
    assert_true(p->plan[1].relay);
    assert_int_equal(p->plan[5].donors[0], q->members[1]);
    assert_false(p->plan[63].relay);
    plans_free(p);
    free(p);
    quorum_drop(q);
}

/* Small jobs keep the flat plan: 5 groups, K = 4, no relay. */
static void test_cold_start_small(void **state)
{
    (void)state;
    graft_quorum_t *q = quorum_make(5, 0, 0);
    plans_t *p = calloc(1, sizeof(*p));
    size_t most, depth;
    plans_make(p, q, 4, true);
    plans_check(p, q, &most, &depth);
    assert_int_equal(most, 4);
    assert_int_equal(depth, 1);
    for (size_t i = 0; i < 5; i++)
        assert_false(p->plan[i].relay);
    plans_free(p);
    free(p);
    quorum_drop(q);
}

/* 8 of 64 recover: each pulls from D = 4 distinct donors, the primaries
 * differ, and no donor serves more than 4 of them. */
static void test_recoveries_spread(void **state)
{
    (void)state;
    graft_quorum_t *q = quorum_make(64, 100, 8);
    plans_t *p = calloc(1, sizeof(*p));
    size_t most, depth;
    plans_make(p, q, 4, true);
    plans_check(p, q, &most, &depth);
    assert_int_equal(depth, 1);
    assert_true(most <= 4);
    for (size_t r = 56; r < 64; r++) {
        assert_int_equal(p->plan[r].n_donors, GRAFT__FANOUT_DONORS);
        for (size_t o = 56; o < r; o++)
            assert_int_not_equal(p->plan[r].donors[0], p->plan[o].donors[0]);
    }
    plans_free(p);
    free(p);
    quorum_drop(q);
}

/* 60 of 64 recover from 4 donors: 16 pull from them (at most K*D = 16
 * listings per donor), the other 44 from relays. */
static void test_recoveries_tree(void **state)
{
    (void)state;
    graft_quorum_t *q = quorum_make(64, 7, 60);
    plans_t *p = calloc(1, sizeof(*p));
    size_t most, depth;
    plans_make(p, q, 4, true);
    plans_check(p, q, &most, &depth);
    for (size_t i = 0; i < 4; i++)
        assert_true(p->plan[i].n_serves <= 16);
    size_t relays = 0;
    for (size_t i = 4; i < 64; i++)
        relays += p->plan[i].relay;
    assert_true(relays >= 11); /* 44 children, 4 each */
    assert_int_equal(depth, 2);
    plans_free(p);
    free(p);
    quorum_drop(q);
}

/* With NCCL pairs (no relays) every recipient pulls from the sources. */
static void test_no_relays(void **state)
{
    (void)state;
    graft_quorum_t *q = quorum_make(64, 0, 0);
    plans_t *p = calloc(1, sizeof(*p));
    size_t most, depth;
    plans_make(p, q, 4, false);
    plans_check(p, q, &most, &depth);
    assert_int_equal(most, 63);
    assert_int_equal(depth, 1);
    for (size_t i = 1; i < 64; i++)
        assert_true(p->plan[0].serves[i - 1].primary);
    plans_free(p);
    free(p);
    quorum_drop(q);
}

/* A steady round and a one-group quorum plan nothing; K = 0 is refused. */
static void test_nothing_to_do(void **state)
{
    (void)state;
    graft__fanout_t f;
    graft_quorum_t *q = quorum_make(8, 50, 0);
    assert_int_equal(graft__fanout_plan(q, q->members[3], 4, true, &f), GRAFT_OK);
    assert_int_equal(f.n_donors + f.n_serves, 0);
    graft__fanout_free(&f);
    assert_int_equal(graft__fanout_plan(q, q->members[3], 0, true, &f), GRAFT_EINVAL);
    quorum_drop(q);
    q = quorum_make(1, 0, 0);
    assert_int_equal(graft__fanout_plan(q, q->members[0], 4, true, &f), GRAFT_OK);
    assert_int_equal(f.n_donors + f.n_serves, 0);
    graft__fanout_free(&f);
    quorum_drop(q);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_cold_start_tree),   cmocka_unit_test(test_cold_start_small),
        cmocka_unit_test(test_recoveries_spread), cmocka_unit_test(test_recoveries_tree),
        cmocka_unit_test(test_no_relays),         cmocka_unit_test(test_nothing_to_do),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
