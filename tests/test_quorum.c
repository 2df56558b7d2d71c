/* Membership records and the quorum decision, without etcd: codecs (good,
 * garbage, truncated, wrong version), key classification, the pure
 * decision's rules and allocation-failure torture of both. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "membership/membership_internal.h"

/* ---------------------------------------------------------- allocation --- */

static long allocs_left = -1; /* -1: unlimited */
static void *t_malloc(size_t n, void *arg)
{
    (void)arg;
    if (allocs_left == 0)
        return NULL;
    if (allocs_left > 0)
        allocs_left--;
    return malloc(n);
}
static void *t_realloc(void *p, size_t n, void *arg)
{
    (void)arg;
    if (allocs_left == 0)
        return NULL;
    if (allocs_left > 0)
        allocs_left--;
    return realloc(p, n);
}
static void t_free(void *p, void *arg)
{
    (void)arg;
    free(p);
}
static const graft_alloc_hooks_t torture_hooks = {t_malloc, t_realloc, t_free, NULL};

/* -------------------------------------------------------------- codecs --- */

static void test_member_roundtrip(void **state)
{
    (void)state;
    graft_member_t in = {3, 1, 77, "hostA", 1234, "ucx://10.0.0.1:5000", 0xabcdef, 42,
                         GRAFT_MEMBER_HEALTHY, 999, 1700000000000ull, "sg-1"};
    uint8_t *buf;
    size_t len;
    assert_int_equal(graft__mship_member_encode(&in, &buf, &len), GRAFT_OK);
    graft_member_t out;
    assert_int_equal(graft__mship_member_decode(buf, len, &out), GRAFT_OK);
    assert_int_equal(out.group, 3);
    assert_int_equal(out.rank, 1);
    assert_int_equal(out.incarnation, 77);
    assert_string_equal(out.host, "hostA");
    assert_string_equal(out.transfer_address, "ucx://10.0.0.1:5000");
    assert_int_equal(out.committed_step, 42);
    assert_int_equal(out.state, GRAFT_MEMBER_HEALTHY);
    assert_int_equal(out.lease_id, 999);
    assert_string_equal(out.spare_group, "sg-1");
    graft__mship_member_clear(&out);

    /* Truncated: every proper prefix either fails cleanly or (when the cut
     * falls between fields) decodes without the later fields, never crashes. */
    for (size_t cut = 0; cut < len; cut++) {
        graft_status_t st = graft__mship_member_decode(buf, cut, &out);
        if (st == GRAFT_OK)
            graft__mship_member_clear(&out);
        else
            assert_true(st == GRAFT_EMALFORMED || st == GRAFT_EFORMAT);
    }
    graft_free(buf);

    /* Garbage bytes. */
    const uint8_t garbage[] = {0xff, 0xff, 0xff, 0xff, 0xff, 0x01, 0x02};
    assert_int_equal(graft__mship_member_decode(garbage, sizeof(garbage), &out), GRAFT_EMALFORMED);
    const char *text = "hello, I am not a protobuf";
    assert_int_equal(graft__mship_member_decode((const uint8_t *)text, strlen(text), &out),
                     GRAFT_EMALFORMED);
    /* Empty: version 0 */
    assert_int_equal(graft__mship_member_decode(NULL, 0, &out), GRAFT_EMALFORMED);
}

static void test_member_version_and_state_checked(void **state)
{
    (void)state;
    /* version 2 (field 1 varint 2), incarnation 5 (field 4), state 2 (field 10) */
    const uint8_t v2[] = {0x08, 0x02, 0x20, 0x05, 0x50, 0x02};
    graft_member_t out;
    assert_int_equal(graft__mship_member_decode(v2, sizeof(v2), &out), GRAFT_EFORMAT);
    /* version 1 but state 9: nonsense */
    const uint8_t badstate[] = {0x08, 0x01, 0x20, 0x05, 0x50, 0x09};
    assert_int_equal(graft__mship_member_decode(badstate, sizeof(badstate), &out), GRAFT_EMALFORMED);
    /* version 1 but incarnation 0 */
    const uint8_t noinc[] = {0x08, 0x01, 0x50, 0x02};
    assert_int_equal(graft__mship_member_decode(noinc, sizeof(noinc), &out), GRAFT_EMALFORMED);
}

static void test_ready_vote_roundtrip(void **state)
{
    (void)state;
    graft__ready_t r = {2, 1, 9, 17, 100, 5, 0}, r2;
    uint8_t *buf;
    size_t len;
    assert_int_equal(graft__mship_ready_encode(&r, &buf, &len), GRAFT_OK);
    assert_int_equal(graft__mship_ready_decode(buf, len, &r2), GRAFT_OK);
    assert_int_equal(r2.group, 2);
    assert_int_equal(r2.rank, 1);
    assert_int_equal(r2.round, 17);
    assert_int_equal(r2.committed_step, 100);
    assert_int_equal(r2.incarnation, 9);
    graft_free(buf);
    assert_int_equal(graft__mship_ready_decode((const uint8_t *)"\x08\x01", 2, &r2), GRAFT_EMALFORMED);

    graft__vote_t v = {1, 0, 3, 4, 5, 6, false, "nan in grads"}, v2;
    assert_int_equal(graft__mship_vote_encode(&v, &buf, &len), GRAFT_OK);
    assert_int_equal(graft__mship_vote_decode(buf, len, &v2), GRAFT_OK);
    assert_int_equal(v2.quorum_id, 4);
    assert_int_equal(v2.round, 5);
    assert_int_equal(v2.step, 6);
    assert_false(v2.ok);
    assert_string_equal(v2.reason, "nan in grads");
    graft_free(buf);
    const uint8_t junk[] = {0x0a, 0x80};
    assert_int_equal(graft__mship_vote_decode(junk, sizeof(junk), &v2), GRAFT_EMALFORMED);
}

static graft_quorum_t *make_quorum(void)
{
    static uint32_t members[] = {0, 2, 5, 7};
    static uint32_t d1[] = {0, 7}, d2[] = {7, 0};
    static graft_recovery_t recs[] = {{2, d1, 2}, {5, d2, 2}};
    static graft_quorum_t q;
    memset(&q, 0, sizeof(q));
    q.id = 3;
    q.round = 10;
    q.step = 50;
    q.max_committed_step = 50;
    q.members = members;
    q.n_members = 4;
    q.recoveries = recs;
    q.n_recoveries = 2;
    q.min_groups = 2;
    q.members_hash = 0x1234;
    return &q;
}

static void test_quorum_roundtrip_and_consistency(void **state)
{
    (void)state;
    graft_quorum_t *q = make_quorum(), *out = NULL;
    uint8_t *buf;
    size_t len;
    assert_int_equal(graft__mship_quorum_encode(q, &buf, &len), GRAFT_OK);
    assert_int_equal(graft__mship_quorum_decode(buf, len, &out), GRAFT_OK);
    assert_int_equal(out->id, 3);
    assert_int_equal(out->round, 10);
    assert_int_equal(out->n_members, 4);
    assert_int_equal(out->members[3], 7);
    assert_int_equal(out->n_recoveries, 2);
    assert_int_equal(out->recoveries[1].recipient, 5);
    assert_int_equal(out->recoveries[1].donors[0], 7);
    assert_int_equal(out->members_hash, 0x1234);
    graft_membership_quorum_free(out);
    graft_free(buf);

    /* Inconsistent records are refused: members not ascending, a donor that
     * is not a member, a recipient donating. */
    uint32_t unsorted[] = {2, 0, 5, 7};
    q->members = unsorted;
    assert_int_equal(graft__mship_quorum_encode(q, &buf, &len), GRAFT_OK);
    assert_int_equal(graft__mship_quorum_decode(buf, len, &out), GRAFT_EMALFORMED);
    graft_free(buf);
    q = make_quorum();
    uint32_t stranger[] = {9};
    q->recoveries[0].donors = stranger;
    q->recoveries[0].n_donors = 1;
    assert_int_equal(graft__mship_quorum_encode(q, &buf, &len), GRAFT_OK);
    assert_int_equal(graft__mship_quorum_decode(buf, len, &out), GRAFT_EMALFORMED);
    graft_free(buf);
    q = make_quorum();
    uint32_t recipient_donor[] = {5};
    q->recoveries[0].donors = recipient_donor;
    q->recoveries[0].n_donors = 1;
    assert_int_equal(graft__mship_quorum_encode(q, &buf, &len), GRAFT_OK);
    assert_int_equal(graft__mship_quorum_decode(buf, len, &out), GRAFT_EMALFORMED);
    graft_free(buf);
    const uint8_t garbage[] = "\x12\x34\x56\x78\x9a\xbc\xde\xf0";
    assert_int_equal(graft__mship_quorum_decode(garbage, 8, &out), GRAFT_EMALFORMED);
}

static void test_event_roundtrip(void **state)
{
    (void)state;
    uint32_t members[] = {1, 2, 3};
    graft_event_t ev = {0}, out;
    ev.seq = 12;
    ev.kind = GRAFT_EVENT_QUORUM_FORMED;
    ev.quorum_id = 4;
    ev.members = members;
    ev.n_members = 3;
    ev.duration_us = 1500;
    ev.detail = "new member set";
    uint8_t *buf;
    size_t len;
    assert_int_equal(graft__mship_event_encode(&ev, &buf, &len), GRAFT_OK);
    assert_int_equal(graft__mship_event_decode(buf, len, &out), GRAFT_OK);
    assert_int_equal(out.seq, 12);
    assert_int_equal(out.kind, GRAFT_EVENT_QUORUM_FORMED);
    assert_int_equal(out.n_members, 3);
    assert_int_equal(out.members[2], 3);
    assert_string_equal(out.detail, "new member set");
    graft__mship_event_clear(&out);
    graft_free(buf);
    ev.kind = (graft_event_kind_t)77;
    assert_int_equal(graft__mship_event_encode(&ev, &buf, &len), GRAFT_OK);
    assert_int_equal(graft__mship_event_decode(buf, len, &out), GRAFT_EMALFORMED);
    graft_free(buf);
    assert_string_equal(graft_event_kind_string(GRAFT_EVENT_LEASE_LOST), "lease_lost");
}

static void test_key_parse(void **state)
{
    (void)state;
    const char *p = "/graft/job1/";
    graft__mkey_t k = graft__mship_key_parse(p, "/graft/job1/members/3/1");
    assert_int_equal(k.kind, GRAFT__MKEY_MEMBER);
    assert_int_equal(k.group, 3);
    assert_int_equal(k.rank, 1);
    k = graft__mship_key_parse(p, "/graft/job1/ready/4/12/0");
    assert_int_equal(k.kind, GRAFT__MKEY_READY);
    assert_int_equal(k.number, 4);
    assert_int_equal(k.group, 12);
    assert_int_equal(graft__mship_key_parse(p, "/graft/job1/ready/12/0").kind, GRAFT__MKEY_BAD);
    assert_int_equal(graft__mship_key_parse(p, "/graft/job1/ready/0/1/0").kind, GRAFT__MKEY_BAD);
    assert_int_equal(graft__mship_key_parse(p, "/graft/job1/quorum").kind, GRAFT__MKEY_QUORUM);
    assert_int_equal(graft__mship_key_parse(p, "/graft/job1/quorumx").kind, GRAFT__MKEY_OTHER);
    k = graft__mship_key_parse(p, "/graft/job1/group_progress/3");
    assert_int_equal(k.kind, GRAFT__MKEY_GROUP_PROGRESS);
    assert_int_equal(k.number, 3);
    assert_int_equal(graft__mship_key_parse(p, "/graft/job1/finished/12").kind,
                     GRAFT__MKEY_FINISHED);
    assert_int_equal(graft__mship_key_parse(p, "/graft/job1/finished/ 1").kind, GRAFT__MKEY_BAD);
    assert_int_equal(graft__mship_key_parse(p, "/graft/job1/finished/+1").kind, GRAFT__MKEY_BAD);
    assert_int_equal(graft__mship_key_parse(p, "/graft/job1/group_progress/1x").kind,
                     GRAFT__MKEY_BAD);
    k = graft__mship_key_parse(p, "/graft/job1/blob/00000000000000000007");
    assert_int_equal(k.kind, GRAFT__MKEY_BLOB);
    assert_int_equal(k.number, 7);
    k = graft__mship_key_parse(p, "/graft/job1/events/00000000000000000123");
    assert_int_equal(k.kind, GRAFT__MKEY_EVENT);
    assert_int_equal(k.number, 123);
    assert_int_equal(graft__mship_key_parse(p, "/graft/job1/eventseq").kind, GRAFT__MKEY_EVENTSEQ);
    /* Malformed numbers are BAD, other jobs and unknown keys are OTHER. */
    assert_int_equal(graft__mship_key_parse(p, "/graft/job1/members/x/1").kind, GRAFT__MKEY_BAD);
    assert_int_equal(graft__mship_key_parse(p, "/graft/job1/members/3").kind, GRAFT__MKEY_BAD);
    assert_int_equal(graft__mship_key_parse(p, "/graft/job1/members/3/1/9").kind, GRAFT__MKEY_BAD);
    assert_int_equal(graft__mship_key_parse(p, "/graft/job1/members/-3/1").kind, GRAFT__MKEY_BAD);
    assert_int_equal(graft__mship_key_parse(p, "/graft/job1/members/99999999999/1").kind,
                     GRAFT__MKEY_BAD);
    assert_int_equal(graft__mship_key_parse(p, "/graft/job1/votes/1/").kind, GRAFT__MKEY_BAD);
    /* votes/<group>/<round>/<rank> */
    k = graft__mship_key_parse(p, "/graft/job1/votes/2/17/1");
    assert_int_equal(k.kind, GRAFT__MKEY_VOTE);
    assert_int_equal(k.group, 2);
    assert_int_equal(k.number, 17);
    assert_int_equal(k.rank, 1);
    assert_int_equal(graft__mship_key_parse(p, "/graft/job1/votes/2/1").kind, GRAFT__MKEY_BAD);
    assert_int_equal(graft__mship_key_parse(p, "/graft/job1/votes/2/0/1").kind, GRAFT__MKEY_BAD);
    assert_int_equal(graft__mship_key_parse(p, "/graft/job1/votes/2/5/").kind, GRAFT__MKEY_BAD);
    assert_int_equal(graft__mship_key_parse(p, "/graft/job1/votes/2/5/1/0").kind, GRAFT__MKEY_BAD);
    assert_int_equal(graft__mship_key_parse(p, "/graft/job1/votes/2/x/1").kind, GRAFT__MKEY_BAD);
    assert_int_equal(graft__mship_key_parse(p, "/graft/job1/votes/2/5/99999999999").kind,
                     GRAFT__MKEY_BAD);
    assert_int_equal(graft__mship_key_parse(p, "/graft/job10/members/3/1").kind, GRAFT__MKEY_OTHER);
    assert_int_equal(graft__mship_key_parse(p, "/graft/job1/checkpoints/5").kind, GRAFT__MKEY_OTHER);
    assert_int_equal(graft__mship_key_parse(p, NULL).kind, GRAFT__MKEY_OTHER);
}

/* ------------------------------------------------------------- decision --- */

#define MAXM 64
typedef struct scenario {
    graft__qmember_t mem[MAXM];
    size_t n_mem;
    graft__ready_t ready[MAXM];
    size_t n_ready;
    int64_t rev;
} scenario_t;

static void add_group(scenario_t *s, uint32_t g, uint32_t R, uint64_t inc)
{
    for (uint32_t r = 0; r < R; r++)
        s->mem[s->n_mem++] = (graft__qmember_t){g, r, inc + r};
}

static void add_ready(scenario_t *s, uint32_t g, uint32_t R, uint64_t inc, uint64_t round,
                      uint64_t committed)
{
    for (uint32_t r = 0; r < R; r++)
        s->ready[s->n_ready++] = (graft__ready_t){g, r, inc + r, round, committed, 0, ++s->rev};
}

static graft__qinput_t input(const scenario_t *s, uint32_t R, uint32_t min_groups, uint64_t round,
                             bool deadline, const graft_quorum_t *prev)
{
    graft__qinput_t in = {s->mem, s->n_mem, s->ready, s->n_ready, R, min_groups, round, deadline,
                          prev, 1000};
    return in;
}

static void test_decide_all_ready(void **state)
{
    (void)state;
    scenario_t s = {0};
    for (uint32_t g = 0; g < 8; g++) {
        add_group(&s, g, 2, 100 * (g + 1));
        add_ready(&s, g, 2, 100 * (g + 1), 1, 10);
    }
    graft__qinput_t in = input(&s, 2, 1, 1, false, NULL);
    graft__qdecision_t d;
    graft_quorum_t *q = NULL;
    assert_int_equal(graft__quorum_decide(&in, &d, &q), GRAFT_OK);
    assert_int_equal(d.action, GRAFT__QUORUM_FORM);
    assert_int_equal(d.n_live_groups, 8);
    assert_int_equal(d.n_ready_groups, 8);
    /* the last ready record written was group 7 rank 1 */
    assert_int_equal(d.last_group, 7);
    assert_int_equal(d.last_rank, 1);
    assert_non_null(q);
    assert_int_equal(q->id, 1);
    assert_int_equal(q->round, 1);
    assert_int_equal(q->n_members, 8);
    for (uint32_t g = 0; g < 8; g++)
        assert_int_equal(q->members[g], g);
    assert_int_equal(q->n_recoveries, 0);
    assert_int_equal(q->max_committed_step, 10);

    /* Same member set next round: same id. */
    scenario_t s2 = s;
    s2.n_ready = 0;
    for (uint32_t g = 0; g < 8; g++)
        add_ready(&s2, g, 2, 100 * (g + 1), 2, 11);
    in = input(&s2, 2, 1, 2, false, q);
    graft_quorum_t *q2 = NULL;
    assert_int_equal(graft__quorum_decide(&in, &d, &q2), GRAFT_OK);
    assert_int_equal(d.action, GRAFT__QUORUM_FORM);
    assert_int_equal(q2->id, 1);
    assert_int_equal(q2->round, 2);
    assert_int_equal(q2->members_hash, q->members_hash);

    /* A rank of group 3 replaced (new incarnation): same groups, new id. */
    scenario_t s3 = s2;
    s3.mem[7].incarnation = 999; /* group 3 rank 1 */
    s3.n_ready = 0;
    for (uint32_t g = 0; g < 8; g++)
        add_ready(&s3, g, 2, 100 * (g + 1), 3, 11);
    s3.ready[7].incarnation = 999;
    in = input(&s3, 2, 1, 3, false, q2);
    graft_quorum_t *q3 = NULL;
    assert_int_equal(graft__quorum_decide(&in, &d, &q3), GRAFT_OK);
    assert_int_equal(d.action, GRAFT__QUORUM_FORM);
    assert_int_equal(q3->id, 2);
    assert_int_not_equal(q3->members_hash, q2->members_hash);
    graft_membership_quorum_free(q);
    graft_membership_quorum_free(q2);
    graft_membership_quorum_free(q3);
}

static void test_decide_wait_timeout_short(void **state)
{
    (void)state;
    scenario_t s = {0};
    for (uint32_t g = 0; g < 4; g++)
        add_group(&s, g, 2, 10 * (g + 1));
    /* groups 0, 1 fully ready; group 2 only rank 0 (rank 1 hung); group 3
     * ready for an older round only */
    add_ready(&s, 0, 2, 10, 5, 7);
    add_ready(&s, 1, 2, 20, 5, 7);
    s.ready[s.n_ready++] = (graft__ready_t){2, 0, 30, 5, 7, 0, ++s.rev};
    add_ready(&s, 3, 2, 40, 4, 7);
    graft__qdecision_t d;
    graft_quorum_t *q = NULL;
    graft__qinput_t in = input(&s, 2, 2, 5, false, NULL);
    assert_int_equal(graft__quorum_decide(&in, &d, &q), GRAFT_OK);
    assert_int_equal(d.action, GRAFT__QUORUM_WAIT);
    assert_null(q);
    assert_int_equal(d.n_live_groups, 4);
    assert_int_equal(d.n_ready_groups, 2);

    /* After the join timeout: the two ready groups, enough for min 2. */
    in = input(&s, 2, 2, 5, true, NULL);
    assert_int_equal(graft__quorum_decide(&in, &d, &q), GRAFT_OK);
    assert_int_equal(d.action, GRAFT__QUORUM_FORM);
    assert_int_equal(q->n_members, 2);
    assert_int_equal(q->members[0], 0);
    assert_int_equal(q->members[1], 1);
    graft_membership_quorum_free(q);
    q = NULL;

    /* min_groups 3 not met: SHORT after the timeout, WAIT before. */
    in = input(&s, 2, 3, 5, true, NULL);
    assert_int_equal(graft__quorum_decide(&in, &d, &q), GRAFT_OK);
    assert_int_equal(d.action, GRAFT__QUORUM_SHORT);
    assert_null(q);
    in = input(&s, 2, 3, 5, false, NULL);
    assert_int_equal(graft__quorum_decide(&in, &d, &q), GRAFT_OK);
    assert_int_equal(d.action, GRAFT__QUORUM_WAIT);

    /* All live ready but fewer than min_groups: wait, then SHORT. */
    scenario_t one = {0};
    add_group(&one, 0, 1, 1);
    add_ready(&one, 0, 1, 1, 1, 0);
    in = input(&one, 1, 2, 1, false, NULL);
    assert_int_equal(graft__quorum_decide(&in, &d, &q), GRAFT_OK);
    assert_int_equal(d.action, GRAFT__QUORUM_WAIT);
    in = input(&one, 1, 2, 1, true, NULL);
    assert_int_equal(graft__quorum_decide(&in, &d, &q), GRAFT_OK);
    assert_int_equal(d.action, GRAFT__QUORUM_SHORT);

    /* No members at all: nothing to form even after the timeout. */
    scenario_t none = {0};
    in = input(&none, 1, 1, 1, true, NULL);
    assert_int_equal(graft__quorum_decide(&in, &d, &q), GRAFT_OK);
    assert_int_equal(d.action, GRAFT__QUORUM_SHORT);
    in = input(&none, 1, 1, 0, true, NULL);
    assert_int_equal(graft__quorum_decide(&in, &d, &q), GRAFT_EINVAL);
}

static void test_decide_dead_rank_and_stale_ready(void **state)
{
    (void)state;
    scenario_t s = {0};
    add_group(&s, 0, 2, 10);
    add_group(&s, 1, 2, 20);
    /* group 2: only rank 0 live (rank 1's lease expired): not live */
    s.mem[s.n_mem++] = (graft__qmember_t){2, 0, 30};
    /* a misconfigured rank 5 of group 3 does not make group 3 live */
    s.mem[s.n_mem++] = (graft__qmember_t){3, 5, 40};
    add_ready(&s, 0, 2, 10, 1, 3);
    /* group 1 rank 1's ready record is from an earlier incarnation */
    s.ready[s.n_ready++] = (graft__ready_t){1, 0, 20, 1, 3, 0, ++s.rev};
    s.ready[s.n_ready++] = (graft__ready_t){1, 1, 7, 1, 3, 0, ++s.rev};
    s.ready[s.n_ready++] = (graft__ready_t){2, 0, 30, 1, 3, 0, ++s.rev};
    graft__qdecision_t d;
    graft_quorum_t *q = NULL;
    graft__qinput_t in = input(&s, 2, 1, 1, false, NULL);
    assert_int_equal(graft__quorum_decide(&in, &d, &q), GRAFT_OK);
    assert_int_equal(d.n_live_groups, 2);
    assert_int_equal(d.n_ready_groups, 1);
    assert_int_equal(d.action, GRAFT__QUORUM_WAIT);
    /* the stale record is replaced by the live incarnation's */
    s.ready[s.n_ready - 2].incarnation = 21;
    in = input(&s, 2, 1, 1, false, NULL);
    assert_int_equal(graft__quorum_decide(&in, &d, &q), GRAFT_OK);
    assert_int_equal(d.action, GRAFT__QUORUM_FORM);
    assert_int_equal(q->n_members, 2);
    graft_membership_quorum_free(q);
}

static void test_decide_recovery_balanced(void **state)
{
    (void)state;
    scenario_t s = {0};
    /* 6 groups: 0, 2, 4 at step 100; 1, 3, 5 behind (5 at 90, 1 and 3 at 0) */
    uint64_t steps[6] = {100, 0, 100, 0, 100, 90};
    for (uint32_t g = 0; g < 6; g++) {
        add_group(&s, g, 1, g + 1);
        add_ready(&s, g, 1, g + 1, 1, steps[g]);
    }
    graft__qdecision_t d;
    graft_quorum_t *q = NULL;
    graft__qinput_t in = input(&s, 1, 1, 1, false, NULL);
    assert_int_equal(graft__quorum_decide(&in, &d, &q), GRAFT_OK);
    assert_int_equal(d.action, GRAFT__QUORUM_FORM);
    assert_int_equal(q->max_committed_step, 100);
    assert_int_equal(q->step, 100);
    assert_int_equal(q->n_recoveries, 3);
    uint32_t primaries[3];
    for (size_t i = 0; i < 3; i++) {
        const graft_recovery_t *r = &q->recoveries[i];
        assert_int_equal(r->recipient, 2 * i + 1);
        /* every up-to-date group serves every recipient */
        assert_int_equal(r->n_donors, 3);
        uint32_t seen = 0;
        for (size_t k = 0; k < r->n_donors; k++) {
            assert_int_equal(r->donors[k] % 2, 0);
            seen |= 1u << r->donors[k];
        }
        assert_int_equal(seen, (1u << 0) | (1u << 2) | (1u << 4));
        primaries[i] = r->donors[0];
    }
    /* balanced: the three recipients start at three different donors */
    assert_int_not_equal(primaries[0], primaries[1]);
    assert_int_not_equal(primaries[1], primaries[2]);
    assert_int_not_equal(primaries[0], primaries[2]);

    /* Encodes and decodes as a consistent record. */
    uint8_t *buf;
    size_t len;
    graft_quorum_t *back = NULL;
    assert_int_equal(graft__mship_quorum_encode(q, &buf, &len), GRAFT_OK);
    assert_int_equal(graft__mship_quorum_decode(buf, len, &back), GRAFT_OK);
    assert_int_equal(back->n_recoveries, 3);
    graft_membership_quorum_free(back);
    graft_free(buf);
    graft_membership_quorum_free(q);

    /* A group whose ranks disagree counts at its lowest committed step. */
    scenario_t t = {0};
    add_group(&t, 0, 2, 1);
    add_group(&t, 1, 2, 10);
    add_ready(&t, 0, 2, 1, 1, 5);
    t.ready[t.n_ready++] = (graft__ready_t){1, 0, 10, 1, 5, 0, ++t.rev};
    t.ready[t.n_ready++] = (graft__ready_t){1, 1, 11, 1, 4, 0, ++t.rev};
    in = input(&t, 2, 1, 1, false, NULL);
    assert_int_equal(graft__quorum_decide(&in, &d, &q), GRAFT_OK);
    assert_int_equal(q->n_recoveries, 1);
    assert_int_equal(q->recoveries[0].recipient, 1);
    graft_membership_quorum_free(q);

    /* A group with a rank past the round's step (it committed a step its
     * group's other rank did not) recovers from a whole group at the step:
     * that rank cannot step back by itself. */
    scenario_t u = {0};
    add_group(&u, 0, 2, 1);
    add_group(&u, 1, 2, 10);
    add_group(&u, 2, 2, 20);
    add_ready(&u, 0, 2, 1, 1, 124);
    u.ready[u.n_ready++] = (graft__ready_t){1, 0, 10, 1, 125, 0, ++u.rev};
    u.ready[u.n_ready++] = (graft__ready_t){1, 1, 11, 1, 124, 0, ++u.rev};
    add_ready(&u, 2, 2, 20, 1, 124);
    in = input(&u, 2, 1, 1, false, NULL);
    assert_int_equal(graft__quorum_decide(&in, &d, &q), GRAFT_OK);
    assert_int_equal(q->step, 124);
    assert_int_equal(q->n_recoveries, 1);
    assert_int_equal(q->recoveries[0].recipient, 1);
    assert_int_equal(q->recoveries[0].n_donors, 2);
    graft_membership_quorum_free(q);

    /* Every group split that way: no group holds the step whole, nobody is
     * told to recover (the ranks ahead restore a checkpoint, or fail). */
    scenario_t w = {0};
    for (uint32_t g = 0; g < 2; g++) {
        add_group(&w, g, 2, 10 * g);
        w.ready[w.n_ready++] = (graft__ready_t){g, 0, 10 * g, 1, 125, 0, ++w.rev};
        w.ready[w.n_ready++] = (graft__ready_t){g, 1, 10 * g + 1, 1, 124, 0, ++w.rev};
    }
    in = input(&w, 2, 1, 1, false, NULL);
    assert_int_equal(graft__quorum_decide(&in, &d, &q), GRAFT_OK);
    assert_int_equal(q->step, 124);
    assert_int_equal(q->n_recoveries, 0);
    graft_membership_quorum_free(q);
}

/* Fail each allocation in turn: every failure is GRAFT_ENOMEM, nothing leaks
 * (checked by ASan in the SAN build), and with enough allocations it works. */
static void test_alloc_torture(void **state)
{
    (void)state;
    scenario_t s = {0};
    uint64_t steps[4] = {9, 3, 9, 1};
    for (uint32_t g = 0; g < 4; g++) {
        add_group(&s, g, 2, 10 * (g + 1));
        add_ready(&s, g, 2, 10 * (g + 1), 1, steps[g]);
    }
    graft_quorum_t *q0 = make_quorum();
    uint8_t *enc;
    size_t enc_len;
    assert_int_equal(graft__mship_quorum_encode(q0, &enc, &enc_len), GRAFT_OK);
    graft_member_t mem = {3, 1, 77, "hostA", 1234, "ucx://x", 1, 2, GRAFT_MEMBER_HEALTHY, 9, 1, NULL};
    uint8_t *menc;
    size_t menc_len;
    assert_int_equal(graft__mship_member_encode(&mem, &menc, &menc_len), GRAFT_OK);

    graft_alloc_hooks_set(&torture_hooks);
    bool done_decide = false, done_decode = false, done_member = false;
    for (long n = 0; n < 200 && !(done_decide && done_decode && done_member); n++) {
        graft__qdecision_t d;
        graft_quorum_t *q = NULL;
        graft__qinput_t in = input(&s, 2, 1, 1, false, NULL);
        allocs_left = n;
        graft_status_t st = graft__quorum_decide(&in, &d, &q);
        if (st == GRAFT_OK) {
            assert_int_equal(q->n_recoveries, 2);
            graft_membership_quorum_free(q);
            done_decide = true;
        } else {
            assert_int_equal(st, GRAFT_ENOMEM);
            assert_null(q);
        }
        allocs_left = n;
        st = graft__mship_quorum_decode(enc, enc_len, &q);
        if (st == GRAFT_OK) {
            graft_membership_quorum_free(q);
            done_decode = true;
        } else {
            assert_int_equal(st, GRAFT_ENOMEM);
        }
        graft_member_t out;
        allocs_left = n;
        st = graft__mship_member_decode(menc, menc_len, &out);
        if (st == GRAFT_OK) {
            assert_string_equal(out.host, "hostA");
            graft__mship_member_clear(&out);
            done_member = true;
        } else {
            assert_int_equal(st, GRAFT_ENOMEM);
        }
    }
    allocs_left = -1;
    graft_alloc_hooks_set(NULL);
    assert_true(done_decide && done_decode && done_member);
    graft_free(enc);
    graft_free(menc);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_member_roundtrip),
        cmocka_unit_test(test_member_version_and_state_checked),
        cmocka_unit_test(test_ready_vote_roundtrip),
        cmocka_unit_test(test_quorum_roundtrip_and_consistency),
        cmocka_unit_test(test_event_roundtrip),
        cmocka_unit_test(test_key_parse),
        cmocka_unit_test(test_decide_all_ready),
        cmocka_unit_test(test_decide_wait_timeout_short),
        cmocka_unit_test(test_decide_dead_rank_and_stale_ready),
        cmocka_unit_test(test_decide_recovery_balanced),
        cmocka_unit_test(test_alloc_torture),
    };
    return cmocka_run_group_tests_name("quorum", tests, NULL, NULL);
}
