/*
 * The steady path: steps agreed between the members of a quorum epoch over
 * their transfer endpoints, without etcd (docs/RUNTIME.md, "The steady
 * path"; the reasoning about safety is there).
 *
 * etcd forms an epoch (graft_quorum()'s etcd path). While the epoch holds,
 * the next step's quorum is the last one a step on, so what the members
 * must agree is only that every one of them committed the last step and is
 * still there:
 *
 *   ready:  each rank -> its group's leader (rank 0); the leaders run a
 *           dissemination barrier (round k: send to leader i + 2^k, hear
 *           from i - 2^k; the "ok" is and-ed along, so after ceil(log2 G)
 *           rounds every leader has heard, directly or not, from all);
 *           each leader -> its ranks.
 *   commit: each rank's vote -> its group's leader, which decides for the
 *           group (all yes) as the etcd vote does, and tells its ranks.
 *
 * At ready, a rank whose lease may have expired, or whose view shows the
 * epoch changed (a member left, joined or re-joined, a later round
 * formed), says no; at the vote, only a lease that may have expired or a
 * later round does (a member change after every member was ready does not
 * undo the step). Any no, timeout or transport error ends the epoch for this rank:
 * the step is taken through etcd, which forms the next epoch without
 * whoever is missing.
 *
 * Every message carries a MAC under the job secret; the group channel
 * (runtime_channel.c) drops one without a valid MAC before it is looked
 * at, so a process that does not hold the secret can neither say yes nor
 * no for a member. Which epoch still holds, and what a rank may say, are
 * pure decisions (steady_logic.c).
 */
#include "runtime_internal.h"
#include "steady_logic.h"

#include "proto/graft.pb-c.h"

#include <inttypes.h>
#include <string.h>

/* Receive in slices of this, looking at the view between them. */
#define STEADY_SLICE_MS 50u
/* After a member change, how long the inbox must stay quiet before the
 * wait gives up on the epoch. */
#define STEADY_DRAIN_MS 500u
struct graft__steady {
    graft_quorum_t *epoch; /* the last quorum this rank took part in (step moves on) */
    char **leaders;        /* transfer address of rank 0 of each member group */
    char **ranks;          /* transfer address of each rank of this group */
    uint32_t my_index;     /* this group's index in epoch->members */
    bool ready;            /* the last step ended so that the next may go this way */
    graft__steady_proc_t *procs; /* the live processes of the view at the epoch's start */
    size_t n_procs;
};

static void steady_clear(graft__steady_t *s)
{
    if (s->epoch != NULL) {
        for (size_t i = 0; i < s->epoch->n_members; i++)
            graft_free(s->leaders != NULL ? s->leaders[i] : NULL);
    }
    graft_free(s->leaders);
    s->leaders = NULL;
    graft_free(s->procs);
    s->procs = NULL;
    s->n_procs = 0;
    graft_membership_quorum_free(s->epoch);
    s->epoch = NULL;
    s->ready = false;
}

void graft__rt_steady_free(graft_runtime_t *rt)
{
    graft__steady_t *s = rt->steady;
    if (s == NULL)
        return;
    steady_clear(s);
    for (uint32_t r = 0; s->ranks != NULL && r < rt->ranks; r++)
        graft_free(s->ranks[r]);
    graft_free(s->ranks);
    graft_free(s);
    rt->steady = NULL;
}

/* A copy of q that owns its members; no recoveries (a steady step has none). */
static graft_quorum_t *quorum_copy(const graft_quorum_t *q)
{
    graft_quorum_t *c = graft__calloc(1, sizeof(*c));
    if (c == NULL)
        return NULL;
    *c = *q;
    c->recoveries = NULL;
    c->n_recoveries = 0;
    c->members = graft__calloc(GRAFT_MAX(q->n_members, 1), sizeof(*c->members));
    if (c->members == NULL) {
        graft_free(c);
        return NULL;
    }
    memcpy(c->members, q->members, q->n_members * sizeof(*c->members));
    return c;
}

static const char *address_of(const graft_membership_view_t *v, uint32_t group, uint32_t rank)
{
    for (size_t i = 0; i < v->n_members; i++) {
        const graft_member_t *mb = &v->members[i];
        if (mb->group == group && mb->rank == rank && mb->transfer_address != NULL &&
            mb->transfer_address[0] != '\0')
            return mb->transfer_address;
    }
    return NULL;
}

/* The live processes of view v (ranks below @p ranks) into *procs_p. */
static graft_status_t procs_of(const graft_membership_view_t *v, uint32_t ranks,
                               graft__steady_proc_t **procs_p, size_t *n_p)
{
    graft__steady_proc_t *p = graft__calloc(GRAFT_MAX(v->n_members, 1), sizeof(*p));
    if (p == NULL)
        return GRAFT_ENOMEM;
    size_t n = 0;
    for (size_t i = 0; i < v->n_members; i++)
        if (v->members[i].rank < ranks)
            p[n++] = (graft__steady_proc_t){v->members[i].group, v->members[i].rank,
                                            v->members[i].incarnation};
    *procs_p = p;
    *n_p = n;
    return GRAFT_OK;
}

static graft_status_t msg_send(graft_runtime_t *rt, const char *to, int kind, uint64_t step,
                               uint32_t round, bool ok, uint64_t deadline);

/* Open the connections this rank's messages will take (to its leader; as a
 * leader, to its ranks and its barrier partners) now, in a step formed
 * through etcd, so that making them (milliseconds each, far more on a
 * loaded machine) does not count against the first steady step's timeout.
 * A failure here is only logged: the step's own messages try again. */
static void connect_ahead(graft_runtime_t *rt)
{
    graft__steady_t *s = rt->steady;
    uint64_t deadline = graft__now_ns() + rt->cfg->join_timeout_ms * 1000000ull;
    const int kind = GRAFT__STEP_MESSAGE__KIND__CONNECT;
    if (rt->rank != 0) {
        (void)msg_send(rt, s->ranks[0], kind, 0, 0, true, deadline);
        return;
    }
    for (uint32_t r = 1; r < rt->ranks; r++)
        (void)msg_send(rt, s->ranks[r], kind, 0, 0, true, deadline);
    uint32_t G = (uint32_t)s->epoch->n_members, to, from;
    for (uint32_t k = 0; graft__steady_barrier_partners(G, s->my_index, k, &to, &from); k++)
        (void)msg_send(rt, s->leaders[to], kind, 0, 0, true, deadline);
}

graft_status_t graft__rt_steady_enter(graft_runtime_t *rt, const graft_quorum_t *q)
{
    graft_membership_view_t *v = NULL;
    graft__steady_t *s = rt->steady;
    if (rt->cfg->steady_path != GRAFT_STEADY_PEERS)
        return GRAFT_OK;
    if (s == NULL) {
        s = graft__calloc(1, sizeof(*s));
        if (s == NULL)
            return GRAFT_ENOMEM;
        rt->steady = s;
        s->ranks = graft__calloc(rt->ranks, sizeof(char *));
        if (s->ranks == NULL)
            return GRAFT_ENOMEM;
    }
    steady_clear(s);
    graft_status_t st = graft_membership_view_get(rt->m, &v);
    if (st != GRAFT_OK)
        return st;
    s->epoch = quorum_copy(q);
    s->leaders = graft__calloc(GRAFT_MAX(q->n_members, 1), sizeof(char *));
    st = s->epoch == NULL || s->leaders == NULL ? GRAFT_ENOMEM : GRAFT_OK;
    if (st == GRAFT_OK)
        st = procs_of(v, rt->ranks, &s->procs, &s->n_procs);
    bool complete = true;
    for (size_t i = 0; st == GRAFT_OK && i < q->n_members; i++) {
        if (q->members[i] == rt->group)
            s->my_index = (uint32_t)i;
        const char *a = address_of(v, q->members[i], 0);
        complete = complete && a != NULL;
        if (a != NULL && (s->leaders[i] = graft__strdup(a)) == NULL)
            st = GRAFT_ENOMEM;
    }
    for (uint32_t r = 0; st == GRAFT_OK && r < rt->ranks; r++) {
        const char *a = address_of(v, rt->group, r);
        complete = complete && a != NULL;
        graft_free(s->ranks[r]);
        s->ranks[r] = a != NULL ? graft__strdup(a) : NULL;
        if (a != NULL && s->ranks[r] == NULL)
            st = GRAFT_ENOMEM;
    }
    graft_membership_view_free(v);
    if (st != GRAFT_OK || !complete) {
        /* Without every address the epoch is taken through etcd. */
        steady_clear(s);
        return st;
    }
    /* Unread messages stay: a member that learned the quorum sooner may
     * already be at the next step. Those of another epoch never match.
     * Not while state moves (recoveries, or the cold start's sync, which
     * step 0 always is): each new connection costs its listener a worker,
     * made on the progress thread that also serves the pulls. */
    if (q->n_recoveries == 0 && q->step > 0)
        connect_ahead(rt);
    return GRAFT_OK;
}

/* ------------------------------------------------------------ messages --- */

static graft_status_t msg_send(graft_runtime_t *rt, const char *to, int kind, uint64_t step,
                               uint32_t round, bool ok, uint64_t deadline)
{
    const graft_quorum_t *e = rt->steady->epoch;
    graft__step_msg_t m = {
        .kind = kind,
        .quorum_id = e->id,
        .members_hash = e->members_hash,
        .epoch_round = e->round,
        .step = step,
        .round = round,
        .ok = ok,
    };
    uint64_t now = graft__now_ns();
    uint32_t ms = now >= deadline ? 1 : (uint32_t)GRAFT_MIN((deadline - now) / 1000000ull + 1,
                                                           UINT32_MAX);
    return graft__channel_send(rt->channel, to, &m, ms);
}

/* Whether every rank of this group is still the process the epoch formed
 * with (the same transfer address in the view). */
static bool own_ranks_same(graft_runtime_t *rt)
{
    graft_membership_view_t *v = NULL;
    if (graft_membership_view_get(rt->m, &v) != GRAFT_OK)
        return false;
    bool same = true;
    for (uint32_t r = 0; r < rt->ranks && same; r++) {
        const char *a = address_of(v, rt->group, r);
        same = a != NULL && rt->steady->ranks[r] != NULL && strcmp(a, rt->steady->ranks[r]) == 0;
    }
    graft_membership_view_free(v);
    return same;
}

/* Whether the view holds a live process the epoch did not form with. */
static bool newcomer_waits(graft_runtime_t *rt)
{
    graft_membership_view_t *v = NULL;
    graft__steady_proc_t *now = NULL;
    size_t n_now = 0;
    if (graft_membership_view_get(rt->m, &v) != GRAFT_OK)
        return false;
    bool found = procs_of(v, rt->ranks, &now, &n_now) == GRAFT_OK &&
                 graft__steady_newcomer(rt->steady->procs, rt->steady->n_procs, now, n_now);
    graft_free(now);
    graft_membership_view_free(v);
    return found;
}

/* The epoch's state for this rank now (steady_logic.c decides), and what
 * it was decided from into *f_p. */
static graft__epoch_state_t epoch_state(graft_runtime_t *rt, graft__epoch_check_t check,
                                        const char **why, graft__epoch_facts_t *f_p)
{
    graft_membership_health_t h;
    graft__epoch_facts_t f = {.known = graft_membership_health(rt->m, rt->steady->epoch, &h) ==
                                       GRAFT_OK};
    if (f.known) {
        f.lease_fresh = h.lease_fresh;
        f.epoch_intact = h.epoch_intact;
        f.round_current = h.round_current;
        f.own_ranks_same = !graft__steady_asks_own_ranks(&f, check) || own_ranks_same(rt);
        f.newcomer = !f.epoch_intact && check == GRAFT__CHECK_READY && newcomer_waits(rt);
    }
    if (f_p != NULL)
        *f_p = f;
    return graft__steady_epoch_state(&f, check, why);
}

static bool epoch_holds(graft_runtime_t *rt, const char **why)
{
    return epoch_state(rt, GRAFT__CHECK_READY, why, NULL) == GRAFT__EPOCH_HOLDS;
}

static bool may_commit(graft_runtime_t *rt, const char **why)
{
    return epoch_state(rt, GRAFT__CHECK_VOTE, why, NULL) == GRAFT__EPOCH_HOLDS;
}

/* The message a wait is for, and the epoch it must be of. */
typedef struct wanted {
    const graft_quorum_t *epoch;
    int kind;
    uint64_t step;
    uint32_t group, rank, round;
} wanted_t;

/* Sort a message for the wait @p ctx: the one it wants; one of the epoch
 * for a later phase (kept); or one that no phase of the epoch will want
 * (another epoch's, an earlier step's, a connection's opener, a delegated
 * record). */
static graft__stash_verdict_t sort_for_wait(const graft__step_msg_t *m, void *ctx)
{
    const wanted_t *w = ctx;
    const graft_quorum_t *e = w->epoch;
    if (m->quorum_id != e->id || m->members_hash != e->members_hash ||
        m->epoch_round != e->round || m->step < w->step ||
        m->kind == GRAFT__STEP_MESSAGE__KIND__CONNECT || graft__rt_step_delegated(m->kind))
        return GRAFT__STASH_DROP;
    if (m->kind == w->kind && m->step == w->step && m->group == w->group &&
        m->rank == w->rank && m->round == w->round)
        return GRAFT__STASH_TAKE;
    return GRAFT__STASH_KEEP;
}

/* Wait for one message, stashing others of this epoch for later phases.
 * GRAFT_ETIMEOUT at the deadline, GRAFT_ESTATE when the epoch ends. */
static graft_status_t msg_wait(graft_runtime_t *rt, int kind, uint64_t step, uint32_t group,
                               uint32_t rank, uint32_t round, uint64_t deadline, bool *ok_p,
                               const char **why)
{
    wanted_t w = {rt->steady->epoch, kind, step, group, rank, round};
    graft__step_msg_t m;
    if (graft__channel_take(rt->channel, sort_for_wait, &w, &m)) {
        *ok_p = m.ok;
        return GRAFT_OK;
    }
    uint64_t quiet_since = 0; /* the members changed and nothing came since */
    bool at_vote = kind == GRAFT__STEP_MESSAGE__KIND__VOTE ||
                   kind == GRAFT__STEP_MESSAGE__KIND__VOTE_RESULT;
    for (;;) {
        uint64_t now = graft__now_ns();
        if (now >= deadline) {
            *why = "timed out";
            return GRAFT_ETIMEOUT;
        }
        uint32_t ms = (uint32_t)GRAFT_MIN((deadline - now) / 1000000ull + 1, STEADY_SLICE_MS);
        graft_status_t st = graft__channel_recv(rt->channel, ms, &m);
        if (st == GRAFT_ETIMEOUT) {
            /* A lost lease ends the wait at once, and so does a newcomer
             * before the ready (it waits for the next round). Another
             * member change (one that died, or one that finished its last
             * step and left) does once nothing has come for
             * STEADY_DRAIN_MS: what a member sent before it left still
             * counts. */
            graft__epoch_check_t check = at_vote ? GRAFT__CHECK_VOTE_WAIT : GRAFT__CHECK_READY;
            graft__epoch_facts_t f;
            graft__epoch_state_t e = epoch_state(rt, check, why, &f);
            if (e == GRAFT__EPOCH_NO_LEASE)
                return GRAFT_ESTATE;
            if (e == GRAFT__EPOCH_CHANGED && !graft__steady_drains(&f, check)) {
                *why = "a new process waits for the next round";
                return GRAFT_ESTATE;
            }
            if (e == GRAFT__EPOCH_CHANGED) {
                now = graft__now_ns();
                if (quiet_since == 0)
                    quiet_since = now;
                else if (now - quiet_since >= STEADY_DRAIN_MS * 1000000ull)
                    return GRAFT_ESTATE;
            }
            continue;
        }
        /* Only a member's message shows that members are still talking:
         * forged ones must not keep a wait from giving up. */
        if (st != GRAFT_OK)
            continue;
        quiet_since = 0;
        graft__stash_verdict_t v = sort_for_wait(&m, &w);
        if (v == GRAFT__STASH_TAKE) {
            *ok_p = m.ok;
            return GRAFT_OK;
        }
        if (v == GRAFT__STASH_KEEP)
            graft__channel_stash(rt->channel, &m);
    }
}

/* Rank -> leader -> rank: the group's and of its ranks' ok. The leader
 * runs @p between (the leaders' barrier) on the group's ok before telling
 * its ranks. */
typedef bool (*between_fn)(graft_runtime_t *rt, uint64_t step, bool ok, uint64_t deadline,
                           const char **why);

static bool group_agree(graft_runtime_t *rt, int ask, int answer, uint64_t step, bool ok,
                        uint64_t deadline, between_fn between, const char **why)
{
    graft__steady_t *s = rt->steady;
    bool got = false;
    if (rt->rank != 0) {
        if (msg_send(rt, s->ranks[0], ask, step, 0, ok, deadline) != GRAFT_OK) {
            *why = "the group's leader is unreachable";
            return false;
        }
        if (msg_wait(rt, answer, step, rt->group, 0, 0, deadline, &got, why) != GRAFT_OK)
            return false;
        if (!got && ok)
            *why = "the group or another member said no";
        return got;
    }
    bool all = ok;
    for (uint32_t r = 1; r < rt->ranks && all; r++) {
        if (msg_wait(rt, ask, step, rt->group, r, 0, deadline, &got, why) != GRAFT_OK)
            all = false;
        else if (!got) {
            all = false;
            *why = "a rank of the group said no";
        }
    }
    if (between != NULL)
        all = between(rt, step, all, deadline, why);
    /* The answer goes out even when it is no, so the ranks need not time out. */
    for (uint32_t r = 1; r < rt->ranks; r++)
        if (msg_send(rt, s->ranks[r], answer, step, 0, all, deadline) != GRAFT_OK)
            GRAFT_DEBUG(GRAFT_MOD_RUNTIME, "steady path: rank %" PRIu32 " unreachable", r);
    return all;
}

/* The leaders' dissemination barrier, and-ing ok along. */
static bool leaders_agree(graft_runtime_t *rt, uint64_t step, bool ok, uint64_t deadline,
                          const char **why)
{
    graft__steady_t *s = rt->steady;
    uint32_t G = (uint32_t)s->epoch->n_members, i = s->my_index, to, from;
    bool all = ok;
    for (uint32_t k = 0; graft__steady_barrier_partners(G, i, k, &to, &from); k++) {
        bool got = false;
        if (msg_send(rt, s->leaders[to], GRAFT__STEP_MESSAGE__KIND__READY_ROUND, step, k, all,
                     deadline) != GRAFT_OK) {
            *why = "a member group's leader is unreachable";
            return false;
        }
        if (msg_wait(rt, GRAFT__STEP_MESSAGE__KIND__READY_ROUND, step, s->epoch->members[from], 0,
                     k, deadline, &got, why) != GRAFT_OK) {
            /* The later rounds' partners hear "no" now instead of timing
             * out (best effort: the barrier is over for this rank). */
            uint64_t soon = graft__now_ns() + 100ull * 1000000ull;
            for (k++; graft__steady_barrier_partners(G, i, k, &to, &from); k++)
                (void)msg_send(rt, s->leaders[to], GRAFT__STEP_MESSAGE__KIND__READY_ROUND, step,
                               k, false, soon);
            return false;
        }
        if (!got && all)
            *why = "another member group said no";
        all = all && got;
    }
    return all;
}

/* This rank says no to the ready of @p step without waiting: to its leader,
 * or, as a leader, to its ranks and to every partner of the leaders'
 * barrier, so that nobody waits for it until the timeout. */
static void say_no(graft_runtime_t *rt, uint64_t step)
{
    graft__steady_t *s = rt->steady;
    uint64_t soon = graft__now_ns() + 100ull * 1000000ull;
    if (rt->rank != 0) {
        (void)msg_send(rt, s->ranks[0], GRAFT__STEP_MESSAGE__KIND__READY, step, 0, false, soon);
        return;
    }
    for (uint32_t r = 1; r < rt->ranks; r++)
        (void)msg_send(rt, s->ranks[r], GRAFT__STEP_MESSAGE__KIND__READY_RESULT, step, 0, false,
                       soon);
    uint32_t G = (uint32_t)s->epoch->n_members, to, from;
    for (uint32_t k = 0; graft__steady_barrier_partners(G, s->my_index, k, &to, &from); k++)
        (void)msg_send(rt, s->leaders[to], GRAFT__STEP_MESSAGE__KIND__READY_ROUND, step, k,
                       false, soon);
}

/* --------------------------------------------------------------- steps --- */

graft_status_t graft__rt_steady_quorum(graft_runtime_t *rt, uint64_t committed,
                                       graft_quorum_t **q_p)
{
    graft__steady_t *s = rt->steady;
    *q_p = NULL;
    if (s == NULL || s->epoch == NULL || rt->cfg->steady_path != GRAFT_STEADY_PEERS)
        return GRAFT_OK;
    const char *why = NULL;
    uint64_t step = s->epoch->step + 1;
    bool ok = graft__steady_may_ready(s->ready, committed, step, rt->state_valid, rt->need_state,
                                      &why) &&
              epoch_holds(rt, &why);
    bool all = false;
    if (ok) {
        uint64_t deadline = graft__now_ns() + rt->cfg->join_timeout_ms * 1000000ull;
        all = group_agree(rt, GRAFT__STEP_MESSAGE__KIND__READY,
                          GRAFT__STEP_MESSAGE__KIND__READY_RESULT, step, ok, deadline,
                          rt->rank == 0 ? leaders_agree : NULL, &why);
    } else {
        say_no(rt, step);
    }
    s->ready = false;
    if (!all) {
        GRAFT_INFO(GRAFT_MOD_RUNTIME, "group %" PRIu32 " rank %" PRIu32 ": step %" PRIu64
                   " through etcd: %s", rt->group, rt->rank, step, why != NULL ? why : "no");
        pthread_mutex_lock(&rt->mu);
        rt->metrics.steady_fallbacks++;
        pthread_mutex_unlock(&rt->mu);
        steady_clear(s);
        return GRAFT_OK;
    }
    graft_quorum_t *q = quorum_copy(s->epoch);
    if (q == NULL)
        return GRAFT_ENOMEM;
    q->step = q->max_committed_step = step;
    q->must_recover = false;
    q->id_changed = false;
    q->duration_us = 0;
    s->epoch->step = step;
    *q_p = q;
    return GRAFT_OK;
}

bool graft__rt_steady_vote(graft_runtime_t *rt, const graft_quorum_t *q, bool ok, const char **why)
{
    uint64_t deadline = graft__now_ns() + rt->cfg->join_timeout_ms * 1000000ull;
    if (ok && !may_commit(rt, why))
        ok = false;
    bool decision = group_agree(rt, GRAFT__STEP_MESSAGE__KIND__VOTE,
                                GRAFT__STEP_MESSAGE__KIND__VOTE_RESULT, q->step, ok, deadline,
                                NULL, why);
    /* The lease again, now that the group decided: a rank that may have
     * lost it does not commit, whatever the others do (its group then
     * disagrees and recovers at the next etcd round). */
    if (decision && !may_commit(rt, why))
        decision = false;
    return decision;
}

void graft__rt_steady_done(graft_runtime_t *rt, bool applied)
{
    graft__steady_t *s = rt->steady;
    if (s == NULL || s->epoch == NULL)
        return;
    s->ready = applied;
}
