/*
 * Delegated records: on the etcd path, a group's ranks hand their ready
 * record and their commit vote to the group's leader (rank 0) over the
 * transfer endpoints, and the leader writes the group's records in one etcd
 * transaction each (graft_membership_quorum_wait_opts(),
 * graft_membership_commit_vote_opts()). A round then costs O(G) etcd
 * requests, not O(G·R) (docs/RUNTIME.md, "Delegated records").
 *
 *   ready: rank --ANNOUNCE--> leader; the leader gathers its ranks for up
 *          to gather_timeout_ms, announces with their records, and tells
 *          each --ANNOUNCED(round)--> (and the ranks it did not hear from
 *          that it announced without them); round 0, word that the leader
 *          went without it, or no answer in time: the rank announces itself.
 *   vote:  rank --VOTE_DELEGATE--> leader; the leader gathers and votes
 *          with their votes; each rank waits for its key to show in etcd,
 *          and writes it itself if it does not, at once when the leader's
 *          own vote shows without it.
 *
 * Nothing here decides anything: the records and the rules that read them
 * are those of every rank writing its own, so a lost, late or repeated
 * message costs time, never a wrong round. A record is determined by the
 * rank's incarnation, round and committed step, so a stale ANNOUNCE for a
 * round the rank then announced itself writes the same bytes again; one
 * for an earlier round is dropped. Messages go through the group channel
 * (runtime_channel.c), which keys and checks their MAC.
 */
#include "runtime_internal.h"

#include "proto/graft.pb-c.h"

#include <inttypes.h>
#include <string.h>

/* A rank waits for its leader's answer this long beyond the gather. */
#define DELEGATE_SLACK_MS 1000u

/* Delegation applies: a group of several ranks, and the setting on. */
static bool delegating(const graft_runtime_t *rt)
{
    return rt->ranks > 1 && rt->cfg->gather_timeout_ms > 0;
}

static uint32_t rank_wait_ms(const graft_runtime_t *rt)
{
    return (uint32_t)GRAFT_MIN(2 * rt->cfg->gather_timeout_ms + DELEGATE_SLACK_MS,
                               rt->cfg->join_timeout_ms);
}

/* The transfer addresses of this group's ranks, from the view (NULL where
 * a rank has none or is not in it). */
static graft_status_t group_addresses(graft_runtime_t *rt, char **addr)
{
    graft_membership_view_t *v = NULL;
    graft_status_t st = graft_membership_view_get(rt->m, &v);
    if (st != GRAFT_OK)
        return st;
    for (size_t i = 0; i < v->n_members && st == GRAFT_OK; i++) {
        const graft_member_t *mb = &v->members[i];
        if (mb->group != rt->group || mb->rank >= rt->ranks || mb->transfer_address == NULL ||
            mb->transfer_address[0] == '\0' || addr[mb->rank] != NULL)
            continue;
        if ((addr[mb->rank] = graft__strdup(mb->transfer_address)) == NULL)
            st = GRAFT_ENOMEM;
    }
    graft_membership_view_free(v);
    return st;
}

static void addresses_free(graft_runtime_t *rt, char **addr)
{
    for (uint32_t r = 0; addr != NULL && r < rt->ranks; r++)
        graft_free(addr[r]);
    graft_free(addr);
}

static graft_status_t send_to(graft_runtime_t *rt, const char *to, graft__step_msg_t *m,
                              uint32_t timeout_ms)
{
    graft_status_t st = graft__channel_send(rt->channel, to, m, timeout_ms);
    if (st != GRAFT_OK)
        GRAFT_DEBUG(GRAFT_MOD_RUNTIME, "group %" PRIu32 " rank %" PRIu32 ": delegated record "
                    "not sent to %s: %s", rt->group, rt->rank, to, graft_status_string(st));
    return st;
}

/* Receive until @p done says so or the deadline passes; the steady path's
 * messages stay in the channel's stash for it. true when done. */
typedef bool (*take_fn)(graft_runtime_t *rt, const graft__step_msg_t *m, void *ctx);

static bool receive_until(graft_runtime_t *rt, uint64_t deadline, take_fn take, void *ctx)
{
    for (;;) {
        uint64_t now = graft__now_ns();
        if (now >= deadline)
            return false;
        uint32_t ms = (uint32_t)GRAFT_MIN((deadline - now) / 1000000ull + 1, 50u);
        graft__step_msg_t m;
        if (graft__channel_recv(rt->channel, ms, &m) != GRAFT_OK)
            continue;
        if (!graft__rt_step_delegated(m.kind)) {
            if (m.kind != GRAFT__STEP_MESSAGE__KIND__CONNECT)
                graft__channel_stash(rt->channel, &m);
            continue;
        }
        if (m.group == rt->group && take(rt, &m, ctx))
            return true;
    }
}

/* ----------------------------------------------------------------- ready --- */

typedef struct gather {
    int kind;
    uint64_t min_round;     /* ready: drop announcements of earlier rounds */
    const graft_quorum_t *q; /* vote: the quorum voted on */
    graft_membership_delegate_t *dl;
    uint64_t *nonce; /* ready: each delegate's, echoed in the answer */
    bool *have;      /* by rank */
    size_t n, want;
} gather_t;

static bool take_delegate(graft_runtime_t *rt, const graft__step_msg_t *m, void *ctx)
{
    gather_t *g = ctx;
    if (m->kind != g->kind || m->rank == 0 || m->rank >= rt->ranks || g->have[m->rank])
        return false;
    if (g->kind == GRAFT__STEP_MESSAGE__KIND__ANNOUNCE && m->etcd_round < g->min_round)
        return false; /* of an earlier round: the rank has moved on */
    if (g->kind == GRAFT__STEP_MESSAGE__KIND__VOTE_DELEGATE &&
        (m->etcd_round != g->q->round || m->quorum_id != g->q->id))
        return false;
    graft_membership_delegate_t *d = &g->dl[g->n];
    memset(d, 0, sizeof(*d));
    d->rank = m->rank;
    d->incarnation = m->incarnation;
    d->lease = m->lease;
    d->round = m->etcd_round;
    d->step = m->step;
    d->prev_round = m->prev_round;
    if (g->kind == GRAFT__STEP_MESSAGE__KIND__ANNOUNCE) {
        g->nonce[g->n] = m->quorum_id;
    } else {
        d->quorum_id = m->quorum_id;
        d->ok = m->ok;
        memcpy(d->reason, m->reason, sizeof(d->reason));
    }
    g->have[m->rank] = true;
    g->n++;
    return g->n >= g->want;
}

/* The leader: gather its ranks' delegates of @p kind for up to the gather
 * timeout. Only ranks the view knows are waited for. */
static graft_status_t leader_gather(graft_runtime_t *rt, gather_t *g)
{
    char **addr = graft__calloc(rt->ranks, sizeof(char *));
    g->dl = graft__calloc(rt->ranks, sizeof(*g->dl));
    g->nonce = graft__calloc(rt->ranks, sizeof(*g->nonce));
    g->have = graft__calloc(rt->ranks, sizeof(*g->have));
    if (addr == NULL || g->dl == NULL || g->nonce == NULL || g->have == NULL) {
        addresses_free(rt, addr);
        return GRAFT_ENOMEM;
    }
    graft_status_t st = group_addresses(rt, addr);
    for (uint32_t r = 1; st == GRAFT_OK && r < rt->ranks; r++)
        g->want += addr[r] != NULL;
    addresses_free(rt, addr);
    if (st != GRAFT_OK)
        return st;
    g->want = GRAFT_MIN(g->want, (size_t)GRAFT_MEMBERSHIP_MAX_DELEGATES);
    if (g->want > 0)
        (void)receive_until(rt, graft__now_ns() + rt->cfg->gather_timeout_ms * 1000000ull,
                            take_delegate, g);
    return GRAFT_OK;
}

static void gather_free(gather_t *g)
{
    graft_free(g->dl);
    graft_free(g->nonce);
    graft_free(g->have);
}

typedef struct answer {
    graft_runtime_t *rt;
    gather_t *g;
} answer_t;

/* The leader's announcement is written: tell each delegate in which round
 * (0: its record was not written, announce yourself). */
static void answer_delegates(void *arg, uint64_t round, bool written)
{
    answer_t *a = arg;
    graft_runtime_t *rt = a->rt;
    char **addr = graft__calloc(rt->ranks, sizeof(char *));
    if (addr == NULL || group_addresses(rt, addr) != GRAFT_OK) {
        addresses_free(rt, addr);
        return; /* the ranks time out and announce themselves */
    }
    for (size_t i = 0; i < a->g->n; i++) {
        uint32_t r = a->g->dl[i].rank;
        graft__step_msg_t m = {0};
        m.kind = GRAFT__STEP_MESSAGE__KIND__ANNOUNCED;
        m.quorum_id = a->g->nonce[i];
        m.etcd_round = written ? round : 0;
        m.ok = written;
        if (addr[r] != NULL)
            (void)send_to(rt, addr[r], &m, 200);
    }
    /* The ranks whose ANNOUNCE had not come: announced without them, so
     * that one on its way announces itself at once instead of waiting out
     * its wait. (nonce 0: none of theirs; the round tells a stale one.) */
    for (uint32_t r = 1; round != 0 && r < rt->ranks; r++) {
        graft__step_msg_t m = {0};
        m.kind = GRAFT__STEP_MESSAGE__KIND__ANNOUNCED;
        m.etcd_round = round;
        if (!a->g->have[r] && addr[r] != NULL)
            (void)send_to(rt, addr[r], &m, 200);
    }
    addresses_free(rt, addr);
}

typedef struct awaited {
    uint64_t nonce, asked_round; /* what this rank sent */
    uint64_t round;              /* the answer: 0, announce yourself */
} awaited_t;

/* The leader's answer to this rank's ANNOUNCE (its nonce), or word that
 * the leader announced for this round or a later one without it. */
static bool take_answer(graft_runtime_t *rt, const graft__step_msg_t *m, void *ctx)
{
    awaited_t *w = ctx;
    if (m->kind != GRAFT__STEP_MESSAGE__KIND__ANNOUNCED || m->rank != 0)
        return false;
    if (m->quorum_id == w->nonce) {
        w->round = m->ok ? m->etcd_round : 0;
        return true;
    }
    if (m->quorum_id == 0 && m->etcd_round >= w->asked_round) {
        w->round = 0;
        return true;
    }
    return false;
}

graft_status_t graft__rt_delegate_quorum(graft_runtime_t *rt, uint64_t committed,
                                         uint32_t timeout_ms, graft_quorum_t **q_p)
{
    graft_membership_round_opts_t o = {0};
    graft_status_t st = GRAFT_OK;
    if (!delegating(rt))
        return graft_membership_quorum_wait(rt->m, committed, timeout_ms, q_p);
    if (rt->rank == 0) {
        gather_t g = {.kind = GRAFT__STEP_MESSAGE__KIND__ANNOUNCE};
        graft_membership_delegate_t self;
        st = graft_membership_ready_delegate(rt->m, committed, &self);
        if (st != GRAFT_OK)
            return graft_membership_quorum_wait(rt->m, committed, timeout_ms, q_p);
        g.min_round = self.round;
        st = leader_gather(rt, &g);
        answer_t a = {rt, &g};
        o.delegates = g.dl;
        o.n_delegates = g.n;
        o.announced = g.n > 0 ? answer_delegates : NULL;
        o.arg = &a;
        if (st == GRAFT_OK)
            st = graft_membership_quorum_wait_opts(rt->m, committed, timeout_ms, &o, q_p);
        gather_free(&g);
        return st;
    }
    char **addr = graft__calloc(rt->ranks, sizeof(char *));
    graft_membership_delegate_t d;
    awaited_t w = {0};
    if (addr == NULL)
        return GRAFT_ENOMEM;
    st = group_addresses(rt, addr);
    if (st == GRAFT_OK && addr[0] != NULL &&
        graft_membership_ready_delegate(rt->m, committed, &d) == GRAFT_OK &&
        graft__random_bytes(&w.nonce, sizeof(w.nonce)) == GRAFT_OK) {
        w.nonce |= 1; /* never 0: that answers no one */
        w.asked_round = d.round;
        graft__step_msg_t m = {0};
        m.kind = GRAFT__STEP_MESSAGE__KIND__ANNOUNCE;
        m.quorum_id = w.nonce;
        m.step = committed;
        m.incarnation = d.incarnation;
        m.lease = d.lease;
        m.etcd_round = d.round;
        m.prev_round = d.prev_round;
        if (send_to(rt, addr[0], &m, 500) == GRAFT_OK &&
            receive_until(rt, graft__now_ns() + rank_wait_ms(rt) * 1000000ull, take_answer, &w))
            o.announced_round = w.round;
    }
    addresses_free(rt, addr);
    if (st != GRAFT_OK)
        return st;
    if (o.announced_round == 0)
        GRAFT_DEBUG(GRAFT_MOD_RUNTIME, "group %" PRIu32 " rank %" PRIu32 ": the leader did not "
                    "announce this rank; announcing itself", rt->group, rt->rank);
    return graft_membership_quorum_wait_opts(rt->m, committed, timeout_ms, &o, q_p);
}

/* ------------------------------------------------------------------ vote --- */

graft_status_t graft__rt_delegate_vote(graft_runtime_t *rt, const graft_quorum_t *q, bool ok,
                                       const char *reason, bool *decision_p)
{
    uint32_t timeout_ms = (uint32_t)rt->cfg->join_timeout_ms;
    graft_membership_vote_opts_t o = {0};
    graft_status_t st = GRAFT_OK;
    if (!delegating(rt))
        return graft_membership_commit_vote(rt->m, q, ok, reason, timeout_ms, decision_p);
    if (rt->rank == 0) {
        gather_t g = {.kind = GRAFT__STEP_MESSAGE__KIND__VOTE_DELEGATE, .q = q};
        st = leader_gather(rt, &g);
        o.delegates = g.dl;
        o.n_delegates = g.n;
        if (st == GRAFT_OK)
            st = graft_membership_commit_vote_opts(rt->m, q, ok, reason, timeout_ms, &o,
                                                   decision_p);
        gather_free(&g);
        return st;
    }
    char **addr = graft__calloc(rt->ranks, sizeof(char *));
    graft_membership_delegate_t d;
    if (addr == NULL)
        return GRAFT_ENOMEM;
    st = group_addresses(rt, addr);
    if (st == GRAFT_OK && addr[0] != NULL &&
        graft_membership_vote_delegate(rt->m, q, ok, reason, &d) == GRAFT_OK) {
        graft__step_msg_t m = {0};
        m.kind = GRAFT__STEP_MESSAGE__KIND__VOTE_DELEGATE;
        m.quorum_id = q->id;
        m.step = q->step;
        m.ok = ok;
        m.incarnation = d.incarnation;
        m.lease = d.lease;
        m.etcd_round = q->round;
        m.prev_round = d.prev_round;
        memcpy(m.reason, d.reason, sizeof(m.reason));
        if (send_to(rt, addr[0], &m, 500) == GRAFT_OK)
            o.delegated_wait_ms = rank_wait_ms(rt);
    }
    addresses_free(rt, addr);
    if (st != GRAFT_OK)
        return st;
    return graft_membership_commit_vote_opts(rt->m, q, ok, reason, timeout_ms, &o, decision_p);
}
