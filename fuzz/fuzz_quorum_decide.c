/*
 * The quorum decision (membership/quorum_logic.c), a pure function: any
 * view (live members, ready records of any round and incarnation, a
 * previous round) gives a decision whose rules hold, and the same answer
 * twice. A formed round has members strictly ascending, each a live group
 * (R ranks) whose every rank is ready for the round, at least min_groups of
 * them, and recoveries whose recipients and donors are members, no
 * recipient a donor. Nothing is formed unless the action says so, and
 * nothing leaks (ASan).
 */
#include "fuzz_common.h"
#include "membership_internal.h"

#include <assert.h>
#include <stdbool.h>

#define MAX_MEMBERS 24
#define MAX_READY 40

typedef struct input_bytes {
    const uint8_t *p;
    size_t n;
} input_bytes_t;

static uint8_t take(input_bytes_t *in)
{
    if (in->n == 0)
        return 0;
    in->n--;
    return *in->p++;
}

static bool has(const uint32_t *v, size_t n, uint32_t x)
{
    for (size_t i = 0; i < n; i++)
        if (v[i] == x)
            return true;
    return false;
}

/* Members of group g with rank < R, and whether each is ready for the round. */
static size_t live_ready(const graft__qinput_t *in, uint32_t R, uint32_t g, bool *all_ready_p)
{
    size_t n = 0;
    bool all = true;
    for (size_t i = 0; i < in->n_members; i++) {
        const graft__qmember_t *m = &in->members[i];
        if (m->group != g || m->rank >= R)
            continue;
        n++;
        bool ready = false;
        for (size_t k = 0; k < in->n_ready; k++) {
            const graft__ready_t *r = &in->ready[k];
            ready |= r->group == g && r->rank == m->rank && r->incarnation == m->incarnation &&
                     r->round == in->round;
        }
        all &= ready;
    }
    *all_ready_p = all;
    return n;
}

static void check_formed(const graft__qinput_t *in, uint32_t R, uint32_t min_groups,
                         const graft__qdecision_t *d, const graft_quorum_t *q)
{
    assert(q != NULL);
    assert(q->n_members == d->n_ready_groups && q->n_members >= min_groups);
    assert(q->round == in->round && q->step == q->max_committed_step);
    for (size_t i = 0; i < q->n_members; i++) {
        bool ready = false;
        assert(i == 0 || q->members[i - 1] < q->members[i]);
        assert(live_ready(in, R, q->members[i], &ready) == R && ready);
    }
    for (size_t i = 0; i < q->n_recoveries; i++) {
        const graft_recovery_t *rec = &q->recoveries[i];
        assert(has(q->members, q->n_members, rec->recipient));
        assert(rec->n_donors > 0);
        for (size_t k = 0; k < rec->n_donors; k++) {
            assert(has(q->members, q->n_members, rec->donors[k]));
            for (size_t j = 0; j < q->n_recoveries; j++)
                assert(q->recoveries[j].recipient != rec->donors[k]);
        }
    }
    if (in->prev == NULL)
        assert(q->id == 1);
    else
        assert(q->id == in->prev->id || q->id == in->prev->id + 1);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    input_bytes_t b = {data, size};
    graft__qmember_t mem[MAX_MEMBERS];
    graft__ready_t ready[MAX_READY];
    uint32_t prev_members[8];
    graft_quorum_t prev = {0};
    uint32_t R = 1u + take(&b) % 3u;
    uint32_t min_groups = take(&b) % 4u;
    uint8_t flags = take(&b);
    graft__qinput_t in = {0};
    in.ranks_per_group = R;
    in.min_groups = min_groups;
    in.round = 1u + take(&b) % 6u;
    in.deadline_passed = flags & 1u;
    in.now_unix_ms = 1000;
    size_t n_mem = 0, n_ready = take(&b) % (MAX_READY + 1);
    /* Members: (group, rank) once each, as etcd's keys are. */
    for (size_t want = take(&b) % (MAX_MEMBERS + 1); n_mem < want && b.n >= 3;) {
        graft__qmember_t m;
        m.group = take(&b) % 6u;
        m.rank = take(&b) % 4u;
        m.incarnation = take(&b) % 3u;
        bool dup = false;
        for (size_t i = 0; i < n_mem; i++)
            dup |= mem[i].group == m.group && mem[i].rank == m.rank;
        if (!dup)
            mem[n_mem++] = m;
        else
            want--;
    }
    for (size_t i = 0; i < n_ready; i++) {
        graft__ready_t *r = &ready[i];
        memset(r, 0, sizeof(*r));
        r->group = take(&b) % 6u;
        r->rank = take(&b) % 4u;
        r->incarnation = take(&b) % 3u;
        r->round = take(&b) % 7u;
        r->committed_step = take(&b) % 5u;
        r->mod_revision = take(&b);
    }
    if (flags & 2u) {
        uint8_t set = take(&b);
        for (uint32_t g = 0; g < 6; g++)
            if (set & (1u << g))
                prev_members[prev.n_members++] = g;
        prev.members = prev_members;
        prev.id = 1u + take(&b);
        prev.round = in.round > 1 ? in.round - 1 : 0;
        prev.members_hash = take(&b);
        in.prev = &prev;
    }
    in.members = mem;
    in.n_members = n_mem;
    in.ready = ready;
    in.n_ready = n_ready;

    graft__qdecision_t d, d2;
    graft_quorum_t *q = NULL, *q2 = NULL;
    graft_status_t st = graft__quorum_decide(&in, &d, &q);
    if (st == GRAFT_ENOMEM)
        return 0;
    assert(st == GRAFT_OK);
    assert(d.n_ready_groups <= d.n_live_groups);
    assert(d.action != GRAFT__QUORUM_SHORT || in.deadline_passed);
    if (d.action == GRAFT__QUORUM_FORM)
        check_formed(&in, R, min_groups == 0 ? 1 : min_groups, &d, q);
    else
        assert(q == NULL);
    /* Pure: the same view, the same answer. */
    assert(graft__quorum_decide(&in, &d2, &q2) == GRAFT_OK);
    assert(d2.action == d.action && d2.n_live_groups == d.n_live_groups &&
           d2.n_ready_groups == d.n_ready_groups);
    if (q != NULL)
        assert(q2 != NULL && q2->id == q->id && q2->members_hash == q->members_hash &&
               q2->n_recoveries == q->n_recoveries && q2->step == q->step);
    graft_membership_quorum_free(q);
    graft_membership_quorum_free(q2);
    return 0;
}
