/*
 * The quorum decision as a pure function of what the view holds: live member
 * records, ready records and the previous quorum. Keeping it free of I/O and
 * clocks lets every rule (who is live, who is ready, who must recover, who
 * serves whom) be tested without etcd, and lets every rank compute the same
 * answer from the same inputs.
 */
#include "membership_internal.h"

#include <stdlib.h>
#include <string.h>
#define XXH_STATIC_LINKING_ONLY /* XXH3_state_t on the stack: no allocation to fail */
#include <xxhash.h>

static int cmp_member(const void *a, const void *b)
{
    const graft__qmember_t *x = a, *y = b;
    if (x->group != y->group)
        return x->group < y->group ? -1 : 1;
    if (x->rank != y->rank)
        return x->rank < y->rank ? -1 : 1;
    return 0;
}

uint64_t graft__quorum_members_hash(const graft__qmember_t *members, size_t n_members,
                                    const uint32_t *groups, size_t n_groups)
{
    XXH3_state_t st;
    XXH3_64bits_reset(&st);
    /* members are sorted by the caller; groups ascend */
    size_t gi = 0;
    for (size_t i = 0; i < n_members && gi < n_groups; i++) {
        while (gi < n_groups && groups[gi] < members[i].group)
            gi++;
        if (gi == n_groups || groups[gi] != members[i].group)
            continue;
        uint64_t t[3] = {members[i].group, members[i].rank, members[i].incarnation};
        XXH3_64bits_update(&st, t, sizeof(t));
    }
    return XXH3_64bits_digest(&st);
}

/* The ready record of one member for the round, or NULL. A record left by an
 * earlier incarnation of the rank does not count. */
static const graft__ready_t *find_ready(const graft__qinput_t *in, const graft__qmember_t *mem)
{
    for (size_t i = 0; i < in->n_ready; i++) {
        const graft__ready_t *r = &in->ready[i];
        if (r->group == mem->group && r->rank == mem->rank && r->incarnation == mem->incarnation &&
            r->round == in->round)
            return r;
    }
    return NULL;
}

/* Fill the recoveries: every group behind the max is a recipient and every
 * up-to-date group serves it. Recipient i starts its donor list at donor i,
 * so when several groups recover at once their primary donors differ. */
static graft_status_t assign_recoveries(graft_quorum_t *q, const uint64_t *committed)
{
    size_t n_donors = 0;
    for (size_t i = 0; i < q->n_members; i++)
        if (committed[i] == q->max_committed_step)
            n_donors++;
    size_t n_rec = q->n_members - n_donors;
    if (n_rec == 0)
        return GRAFT_OK;
    uint32_t *donors = graft__malloc(n_donors * sizeof(*donors));
    q->recoveries = graft__calloc(n_rec, sizeof(*q->recoveries));
    graft_status_t st = GRAFT_OK;
    if (donors == NULL || q->recoveries == NULL) {
        st = GRAFT_ENOMEM;
        goto out;
    }
    size_t d = 0;
    for (size_t i = 0; i < q->n_members; i++)
        if (committed[i] == q->max_committed_step)
            donors[d++] = q->members[i];
    size_t r = 0;
    for (size_t i = 0; i < q->n_members; i++) {
        if (committed[i] == q->max_committed_step)
            continue;
        graft_recovery_t *rec = &q->recoveries[r];
        rec->recipient = q->members[i];
        rec->donors = graft__malloc(n_donors * sizeof(*rec->donors));
        if (rec->donors == NULL) {
            st = GRAFT_ENOMEM;
            goto out;
        }
        for (size_t k = 0; k < n_donors; k++)
            rec->donors[k] = donors[(r + k) % n_donors];
        rec->n_donors = n_donors;
        r++;
        q->n_recoveries = r;
    }
out:
    graft_free(donors);
    return st;
}

/* Is the group of members mem[i..j) ready for the round (every rank has a
 * ready record of its incarnation)? Then *lo_p and *hi_p are the lowest and
 * highest step its ranks committed, and *rev_p and *rank_p the newest
 * record's mod_revision and rank. */
static bool group_ready(const graft__qinput_t *in, const graft__qmember_t *mem, size_t i,
                        size_t j, uint64_t *lo_p, uint64_t *hi_p, int64_t *rev_p,
                        uint32_t *rank_p)
{
    uint64_t lo = UINT64_MAX, hi = 0;
    int64_t rev = -1;
    uint32_t rank = 0;
    for (size_t k = i; k < j; k++) {
        const graft__ready_t *r = find_ready(in, &mem[k]);
        if (r == NULL)
            return false;
        lo = GRAFT_MIN(lo, r->committed_step);
        hi = GRAFT_MAX(hi, r->committed_step);
        if (r->mod_revision > rev) {
            rev = r->mod_revision;
            rank = r->rank;
        }
    }
    *lo_p = lo;
    *hi_p = hi;
    *rev_p = rev;
    *rank_p = rank;
    return true;
}

/* The live groups of the (sorted) members, and of them the ready ones:
 * ready_groups[] ascending, the lowest step each committed, whether its
 * ranks disagree (split). Counts and the last announcer go to *d. */
static void groups_tally(const graft__qinput_t *in, const graft__qmember_t *mem, size_t n,
                         uint32_t R, uint32_t *ready_groups, uint64_t *committed, bool *split,
                         graft__qdecision_t *d)
{
    int64_t last_rev = -1;
    for (size_t i = 0; i < n;) {
        size_t j = i;
        while (j < n && mem[j].group == mem[i].group)
            j++;
        uint64_t lo = 0, hi = 0;
        int64_t rev = -1;
        uint32_t rank = 0;
        if (j - i == R) {
            d->n_live_groups++;
            if (group_ready(in, mem, i, j, &lo, &hi, &rev, &rank)) {
                ready_groups[d->n_ready_groups] = mem[i].group;
                committed[d->n_ready_groups] = lo;
                split[d->n_ready_groups] = hi != lo;
                d->n_ready_groups++;
                if (rev > last_rev) {
                    last_rev = rev;
                    d->last_group = mem[i].group;
                    d->last_rank = rank;
                }
            }
        }
        i = j;
    }
}

/* The round to form, given its members (q->members): step, recoveries,
 * hash and id. committed[] is changed (split groups become recipients). */
static graft_status_t quorum_fill(const graft__qinput_t *in, graft_quorum_t *q,
                                  uint64_t *committed, const bool *split,
                                  const graft__qmember_t *mem, size_t n)
{
    for (size_t i = 0; i < q->n_members; i++)
        q->max_committed_step = GRAFT_MAX(q->max_committed_step, committed[i]);
    q->step = q->max_committed_step;
    /* A group whose ranks committed different steps (a rank whose lease
     * lapsed during a vote does not commit what the others do) holds the
     * round's step for some ranks only, and a rank past it cannot step
     * back: the group recovers from a whole group at the step, when there
     * is one (else its ranks ahead restore a checkpoint, or fail). */
    bool whole = false;
    for (size_t i = 0; i < q->n_members; i++)
        whole |= committed[i] == q->step && !split[i];
    for (size_t i = 0; whole && i < q->n_members; i++)
        if (split[i])
            committed[i] = UINT64_MAX; /* not the step: a recipient */
    graft_status_t st = assign_recoveries(q, committed);
    if (st != GRAFT_OK)
        return st;
    q->members_hash = graft__quorum_members_hash(mem, n, q->members, q->n_members);
    /* The id is an epoch of the member set: the same groups with the same
     * processes keep it, so trainers rebuild communicators only on change. */
    const graft_quorum_t *p = in->prev;
    if (p != NULL && p->members_hash == q->members_hash && p->n_members == q->n_members &&
        memcmp(p->members, q->members, q->n_members * sizeof(*q->members)) == 0)
        q->id = p->id;
    else
        q->id = (p != NULL ? p->id : 0) + 1;
    return GRAFT_OK;
}

graft_status_t graft__quorum_decide(const graft__qinput_t *in, graft__qdecision_t *decision_p,
                                    graft_quorum_t **q_p)
{
    graft_status_t st = GRAFT_OK;
    graft__qdecision_t d = {GRAFT__QUORUM_WAIT, 0, 0, 0, 0};
    graft__qmember_t *mem = NULL;
    uint32_t *ready_groups = NULL;
    uint64_t *committed = NULL;
    bool *split = NULL; /* by ready group: its ranks committed different steps */
    graft_quorum_t *q = NULL;
    uint32_t R = in->ranks_per_group == 0 ? 1 : in->ranks_per_group;
    uint32_t min_groups = in->min_groups == 0 ? 1 : in->min_groups;
    size_t n = 0;

    if (in->round == 0 || (in->n_members > 0 && in->members == NULL) ||
        (in->n_ready > 0 && in->ready == NULL))
        return GRAFT_EINVAL;
    if (in->n_members > 0) {
        mem = graft__malloc(in->n_members * sizeof(*mem));
        ready_groups = graft__malloc(in->n_members * sizeof(*ready_groups));
        committed = graft__malloc(in->n_members * sizeof(*committed));
        split = graft__malloc(in->n_members * sizeof(*split));
        if (mem == NULL || ready_groups == NULL || committed == NULL || split == NULL) {
            st = GRAFT_ENOMEM;
            goto out;
        }
    }
    /* Ranks outside 0..R-1 come from a misconfigured process; they make no
     * group live. */
    for (size_t i = 0; i < in->n_members; i++)
        if (in->members[i].rank < R)
            mem[n++] = in->members[i];
    if (n > 1)
        qsort(mem, n, sizeof(*mem), cmp_member);
    groups_tally(in, mem, n, R, ready_groups, committed, split, &d);

    bool all = d.n_ready_groups == d.n_live_groups;
    if (d.n_ready_groups > 0 && d.n_ready_groups >= min_groups && (all || in->deadline_passed))
        d.action = GRAFT__QUORUM_FORM;
    else if (in->deadline_passed)
        d.action = GRAFT__QUORUM_SHORT;
    if (d.action != GRAFT__QUORUM_FORM)
        goto done;

    q = graft__calloc(1, sizeof(*q));
    if (q == NULL) {
        st = GRAFT_ENOMEM;
        goto out;
    }
    q->members = ready_groups;
    ready_groups = NULL;
    q->n_members = d.n_ready_groups;
    q->round = in->round;
    q->min_groups = min_groups;
    q->formed_unix_ms = in->now_unix_ms;
    st = quorum_fill(in, q, committed, split, mem, n);
    if (st != GRAFT_OK)
        goto out;
done:
    *decision_p = d;
    if (q_p != NULL) {
        *q_p = q;
        q = NULL;
    }
out:
    graft_membership_quorum_free(q);
    graft_free(committed);
    graft_free(split);
    graft_free(ready_groups);
    graft_free(mem);
    return st;
}
