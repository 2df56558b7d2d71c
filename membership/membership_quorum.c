/*
 * Quorum rounds: the round object (mround_t) that owns one rank's way from
 * its announcement to the quorum, the compare-and-swap that makes exactly
 * one record per round, and the health of a round. The decision itself is
 * the pure graft__quorum_decide(); the announcing transaction is
 * membership_announce.c's, which this file calls and which never calls
 * back. Commit votes are in membership_votes.c, blob slots in
 * membership_blobs.c, the lease and the retried transaction in
 * membership_lease.c.
 */
#include "membership_internal.h"

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <string.h>

graft_status_t graft_membership_health(graft_membership_t *m, const graft_quorum_t *q,
                                       graft_membership_health_t *h_p)
{
    if (m == NULL || q == NULL || h_p == NULL)
        return GRAFT_EINVAL;
    graft_membership_health_t h = {0};
    graft__qmember_t *mem = NULL;
    uint32_t R = m->cfg.ranks_per_group;
    uint64_t ttl_ns = (uint64_t)m->cfg.lease_ttl_s * 1000000000ull;
    pthread_mutex_lock(&m->mu);
    bool joined = m->joined && !m->left && !m->lease_lost_pending;
    const graft_quorum_t *cur = m->view.quorum;
    bool same_round = cur != NULL && cur->round == q->round && cur->id == q->id;
    size_t n = m->view.n_members;
    graft_status_t st = graft__mship_snapshot_members(m, &mem);
    pthread_mutex_unlock(&m->mu);
    if (st != GRAFT_OK)
        return st;
    /* etcd starts the TTL over when it receives a renewal, which is after
     * it was sent: counting from the send is on the safe side. A sixth of
     * the TTL is left for the clocks of two machines to disagree on rate. */
    uint64_t renewed = atomic_load(&m->lease_renewed_ns);
    uint64_t age = graft__now_ns() - renewed;
    uint64_t usable = ttl_ns - ttl_ns / 6;
    if (joined && renewed != 0 && age < usable) {
        h.lease_fresh = true;
        h.lease_left_ms = (uint32_t)GRAFT_MIN((usable - age) / 1000000ull, UINT32_MAX);
    }
    size_t k = 0;
    for (size_t i = 0; i < n; i++)
        if (mem[i].rank < R)
            mem[k++] = mem[i];
    h.round_current = same_round;
    h.epoch_intact = same_round && graft__mship_same_live_groups(mem, k, R, q) &&
                     graft__quorum_members_hash(mem, k, q->members, q->n_members) ==
                         q->members_hash;
    graft_free(mem);
    *h_p = h;
    return GRAFT_OK;
}

/* Build the caller's copy of a quorum that includes its group. */
static graft_status_t result_for_me(graft_membership_t *m, const graft_quorum_t *q,
                                    graft_quorum_t **out_p)
{
    graft_quorum_t *out = NULL;
    graft_status_t st = graft__mship_quorum_copy(q, &out);
    if (st != GRAFT_OK)
        return st;
    for (size_t i = 0; i < out->n_members; i++)
        if (out->members[i] == m->cfg.group)
            out->replica_rank = (uint32_t)i;
    out->replica_world = (uint32_t)out->n_members;
    for (size_t i = 0; i < out->n_recoveries; i++)
        if (out->recoveries[i].recipient == m->cfg.group)
            out->must_recover = true;
    out->id_changed = out->id != m->last_id;
    m->last_id = out->id;
    m->last_round = GRAFT_MAX(m->last_round, out->round);
    *out_p = out;
    return GRAFT_OK;
}

/* Record a formation in the job's history when it matters to an operator:
 * a new member set or groups to recover. Steady-state rounds are not
 * logged, so the bounded history is not flushed by one event per step. */
static void formation_events(graft_membership_t *m, const graft_quorum_t *q, bool new_id)
{
    if (!new_id && q->n_recoveries == 0)
        return;
    graft_event_t ev = {0};
    ev.kind = GRAFT_EVENT_QUORUM_FORMED;
    ev.group = m->cfg.group;
    ev.rank = m->cfg.rank;
    ev.quorum_id = q->id;
    ev.round = q->round;
    ev.step = q->step;
    ev.members = q->members;
    ev.n_members = q->n_members;
    ev.duration_us = q->duration_us;
    ev.ok = true;
    ev.detail = (char *)(new_id ? "new member set" : "same member set");
    if (graft__mship_event_put(m, &ev) != GRAFT_OK)
        GRAFT_DEBUG(GRAFT_MOD_MEMBERSHIP, "quorum event not recorded");
    for (size_t i = 0; i < q->n_recoveries; i++) {
        char detail[64];
        graft_event_t rev = ev;
        rev.kind = GRAFT_EVENT_RECOVERY_ASSIGNED;
        rev.group = q->recoveries[i].recipient;
        rev.rank = 0;
        rev.members = q->recoveries[i].donors;
        rev.n_members = q->recoveries[i].n_donors;
        snprintf(detail, sizeof(detail), "recipient %" PRIu32 ", primary donor %" PRIu32,
                 q->recoveries[i].recipient, q->recoveries[i].donors[0]);
        rev.detail = detail;
        if (graft__mship_event_put(m, &rev) != GRAFT_OK)
            GRAFT_DEBUG(GRAFT_MOD_MEMBERSHIP, "recovery event not recorded");
    }
}

/*
 * The compare-and-swap: write the quorum only if the quorum key is still at
 * the revision the decision was based on. The failure branch reads the key,
 * so a loser learns the winner's record in the same request.
 */
static graft_status_t form_cas(graft_membership_t *m, graft_quorum_t *q, int64_t expect_mod,
                               bool *won_p, int64_t *revision_p, graft_quorum_t **current_p)
{
    uint8_t *buf = NULL;
    size_t len = 0;
    char *key = graft__key_quorum(m->prefix);
    graft_etcd_txn_result_t res = {0};
    graft_status_t st;
    *current_p = NULL;
    if (key == NULL)
        return GRAFT_ENOMEM;
    st = graft__mship_quorum_encode(q, &buf, &len);
    if (st != GRAFT_OK)
        goto out;
    graft_etcd_compare_t cmp = {key, GRAFT_ETCD_CMP_MOD, GRAFT_ETCD_CMP_EQUAL, expect_mod, NULL, 0};
    graft_etcd_op_t put = {GRAFT_ETCD_OP_PUT, key, buf, len, 0, false, false};
    graft_etcd_op_t get = {GRAFT_ETCD_OP_RANGE, key, NULL, 0, 0, false, false};
    atomic_fetch_add(&m->n_quorum_txns, 1);
    GRAFT__MSHIP_REQ(m);
    st = graft_etcd_txn(m->ops, &cmp, 1, &put, 1, &get, 1, &res);
    if (st != GRAFT_OK) {
        atomic_fetch_add(&m->n_etcd_errors, 1);
        goto out;
    }
    *won_p = res.succeeded;
    *revision_p = res.revision;
    if (!res.succeeded) {
        atomic_fetch_add(&m->n_quorum_conflicts, 1);
        if (res.n_ranges == 1 && res.ranges[0].n_kvs == 1) {
            const graft_etcd_kv_t *kv = &res.ranges[0].kvs[0];
            graft_status_t dst = graft__mship_quorum_decode(kv->value, kv->value_len, current_p);
            if (dst == GRAFT_ENOMEM)
                st = dst;
            /* Garbage in the key is reported by the view, which also
             * learns its mod_revision so the next attempt can replace it. */
        }
    }
out:
    graft_etcd_txn_result_clear(&res);
    graft_free(buf);
    graft_free(key);
    return st;
}

/* The round a rank announces for next. */
static uint64_t next_round(graft_membership_t *m)
{
    pthread_mutex_lock(&m->mu);
    uint64_t round = GRAFT_MAX(m->last_round, m->view.quorum != NULL ? m->view.quorum->round : 0) + 1;
    pthread_mutex_unlock(&m->mu);
    return round;
}

graft_status_t graft_membership_ready_delegate(graft_membership_t *m, uint64_t committed_step,
                                               graft_membership_delegate_t *d_p)
{
    int64_t lease;
    uint64_t inc;
    if (m == NULL || d_p == NULL)
        return GRAFT_EINVAL;
    graft_status_t st = graft__mship_check_joined(m, &lease, &inc);
    if (st != GRAFT_OK)
        return st;
    memset(d_p, 0, sizeof(*d_p));
    d_p->rank = m->cfg.rank;
    d_p->incarnation = inc;
    d_p->lease = lease;
    d_p->round = next_round(m);
    d_p->step = committed_step;
    pthread_mutex_lock(&m->mu);
    d_p->prev_round = m->ready_round;
    pthread_mutex_unlock(&m->mu);
    return GRAFT_OK;
}

graft_status_t graft_membership_quorum_wait(graft_membership_t *m, uint64_t committed_step,
                                            uint32_t timeout_ms, graft_quorum_t **quorum_p)
{
    return graft_membership_quorum_wait_opts(m, committed_step, timeout_ms, NULL, quorum_p);
}

/*
 * One round as this rank takes part in it, from its announcement to the
 * quorum that includes its group: the round it announced for and when, the
 * ready records it last read, and a formation race it lost. It calls down to
 * the announcement (membership_announce.c) and to the pure decision, and
 * forms the round by the compare-and-swap above.
 */
typedef struct mround {
    graft_membership_t *m;
    uint64_t committed;   /* the step this rank announces */
    uint64_t deadline;    /* of the whole wait */
    uint64_t join_ns;     /* the join timeout, counted from the announcement */
    uint64_t round;       /* the round announced for */
    uint64_t announced;   /* when (graft__now_ns()) */
    uint64_t last_read;   /* when the ready records were last read */
    bool read_after_deadline;
    int64_t lost_at_mod;  /* quorum_mod of a lost race: wait for the winner */
    uint64_t members_gen; /* of the view when the records were read */
    graft__ready_t *ready;
    size_t n_ready;
} mround_t;

/* What one pass over the view tells the wait loop. */
typedef enum round_next_t {
    ROUND_DONE,  /* the answer (or an error) is in */
    ROUND_AGAIN, /* announced for another round: look again at once */
    ROUND_WAIT   /* wait for the view to change, or the wake-up time */
} round_next_t;

/* The view, and the decision on it, as one pass saw them under m->mu. */
typedef struct round_seen {
    graft__qdecision_t d;
    graft_quorum_t *formed; /* for GRAFT__QUORUM_FORM */
    int64_t quorum_mod;
    bool replaces_bad;      /* the quorum key holds a record that does not decode */
    graft_status_t bad_reason;
    uint64_t version;
    bool prev_known;
    uint64_t prev_id;
} round_seen_t;

static void round_announced(mround_t *r)
{
    r->announced = r->last_read = graft__now_ns();
    r->read_after_deadline = false;
    r->lost_at_mod = -1;
}

/* The round formed without this group (it was late, or hung): announce for
 * the next one, so that the group comes back (as a recipient if it fell
 * behind). */
static graft_status_t round_announce_next(mround_t *r, uint64_t next)
{
    r->round = next;
    graft_free(r->ready);
    r->ready = NULL;
    r->n_ready = 0;
    graft_status_t st = graft__mship_announce(r->m, r->round, r->committed, NULL, 0, r->deadline,
                                              &r->ready, &r->n_ready, NULL, NULL);
    if (st == GRAFT_OK)
        round_announced(r);
    return st;
}

/* The first announcement of the wait: this rank's own (with its group's
 * delegated records, as a leader), or the one its leader wrote for it.
 * *fast_p is a round the announcement formed on the fast path. */
static graft_status_t round_announce_first(mround_t *r, const graft_membership_round_opts_t *opts,
                                           graft_quorum_t **fast_p)
{
    graft_membership_t *m = r->m;
    *fast_p = NULL;
    r->round = next_round(m);
    pthread_mutex_lock(&m->mu);
    r->members_gen = m->view.members_gen;
    if (opts->announced_round != 0) {
        /* The leader wrote this rank's record: its round is the one. */
        r->round = opts->announced_round;
        m->ready_round = r->round;
    }
    pthread_mutex_unlock(&m->mu);
    if (opts->announced_round == 0) {
        /* A leader announces for the latest round any of its ranks saw. */
        for (size_t i = 0; i < opts->n_delegates; i++)
            r->round = GRAFT_MAX(r->round, opts->delegates[i].round);
        bool delegated = false;
        graft_status_t st = graft__mship_announce(m, r->round, r->committed, opts->delegates,
                                                  opts->n_delegates, r->deadline, &r->ready,
                                                  &r->n_ready, fast_p, &delegated);
        if (opts->announced != NULL)
            opts->announced(opts->arg, st == GRAFT_OK ? r->round : 0, st == GRAFT_OK && delegated);
        if (st != GRAFT_OK)
            return st;
    }
    round_announced(r);
    return GRAFT_OK;
}

/* Read the ready records again only when the decision may change because
 * of them: once at the join timeout, and when members change (a group died
 * or joined). Otherwise the rank whose write completes the set sees it in
 * its own announcement. Only running out of memory is an error. */
static graft_status_t round_reread(mround_t *r, uint64_t now, bool deadline_passed)
{
    graft_membership_t *m = r->m;
    pthread_mutex_lock(&m->mu);
    bool members_changed = m->view.members_gen != r->members_gen;
    pthread_mutex_unlock(&m->mu);
    bool reread = (deadline_passed && !r->read_after_deadline) || members_changed ||
                  (m->race_poll_ns > 0 && now >= r->last_read + m->race_poll_ns);
    if (!reread)
        return GRAFT_OK;
    graft__ready_t *fresh = NULL;
    size_t n_fresh = 0;
    pthread_mutex_lock(&m->mu);
    r->members_gen = m->view.members_gen;
    pthread_mutex_unlock(&m->mu);
    graft_status_t st = graft__mship_read_ready(m, r->round, &fresh, &n_fresh);
    if (st == GRAFT_ENOMEM)
        return st;
    if (st == GRAFT_OK) {
        graft_free(r->ready);
        r->ready = fresh;
        r->n_ready = n_fresh;
        r->read_after_deadline = deadline_passed;
    }
    r->last_read = graft__now_ns();
    return GRAFT_OK;
}

/* The decision on the view as it is now. Called with m->mu held. */
static graft_status_t round_decide_locked(mround_t *r, round_seen_t *s)
{
    graft_membership_t *m = r->m;
    graft__qmember_t *mem = NULL;
    memset(s, 0, sizeof(*s));
    graft_status_t st = graft__mship_snapshot_members(m, &mem);
    graft__qinput_t in = {mem, m->view.n_members, r->ready, r->n_ready, m->cfg.ranks_per_group,
                          m->cfg.min_groups, r->round, r->read_after_deadline, m->view.quorum,
                          graft__wall_ns() / 1000000u};
    if (st == GRAFT_OK)
        st = graft__quorum_decide(&in, &s->d, &s->formed);
    s->quorum_mod = m->view.quorum_mod;
    s->replaces_bad = s->quorum_mod != 0 && m->view.quorum_bad_mod == s->quorum_mod;
    s->bad_reason = m->view.quorum_bad_reason;
    s->version = m->view.version;
    s->prev_known = m->view.quorum != NULL;
    s->prev_id = s->prev_known ? m->view.quorum->id : 0;
    graft_free(mem);
    return st;
}

/* The caller's copy of q, under m->mu. */
static graft_status_t round_result(mround_t *r, const graft_quorum_t *q, graft_quorum_t **out_p)
{
    pthread_mutex_lock(&r->m->mu);
    graft_status_t st = result_for_me(r->m, q, out_p);
    pthread_mutex_unlock(&r->m->mu);
    return st;
}

/* Form the round the decision gave (s->formed, consumed), by the
 * compare-and-swap. A lost race waits for the winner's record (or takes it
 * from the failed compare's read); *wake_p comes closer then. */
static round_next_t round_form(mround_t *r, round_seen_t *s, graft_quorum_t **quorum_p,
                               graft_status_t *st_p, uint64_t *wake_p)
{
    graft_membership_t *m = r->m;
    graft_quorum_t *formed = s->formed, *current = NULL;
    bool won = false;
    int64_t revision = 0;
    s->formed = NULL;
    formed->duration_us = (graft__now_ns() - r->announced) / 1000u;
    graft_status_t st = form_cas(m, formed, s->quorum_mod, &won, &revision, &current);
    if (st == GRAFT_OK && won) {
        graft__mship_view_adopt(m, formed, revision);
        GRAFT_DEBUG(GRAFT_MOD_MEMBERSHIP, "job %s: formed round %" PRIu64 " id %" PRIu64
                    " with %zu groups", m->job, formed->round, formed->id, formed->n_members);
        if (s->replaces_bad)
            graft__mship_quorum_replaced_event(m, s->bad_reason, formed);
        formation_events(m, formed, !s->prev_known || s->prev_id != formed->id);
        bool mine = graft__mship_has_group(formed, m->cfg.group);
        uint64_t round = formed->round;
        if (mine)
            st = round_result(r, formed, quorum_p);
        graft_membership_quorum_free(formed);
        if (mine) {
            *st_p = st;
            return ROUND_DONE;
        }
        /* Formed after the join timeout without this rank's own group
         * (another rank of it is late): the others go on, this group
         * tries the next round. */
        pthread_mutex_lock(&m->mu);
        m->last_round = GRAFT_MAX(m->last_round, round);
        pthread_mutex_unlock(&m->mu);
        *st_p = round_announce_next(r, round + 1);
        return *st_p == GRAFT_OK ? ROUND_AGAIN : ROUND_DONE;
    }
    graft_membership_quorum_free(formed);
    if (st == GRAFT_OK && current != NULL && current->round == r->round &&
        graft__mship_has_group(current, m->cfg.group)) {
        *st_p = round_result(r, current, quorum_p);
        graft_membership_quorum_free(current);
        return ROUND_DONE;
    }
    graft_membership_quorum_free(current);
    if (st == GRAFT_ENOMEM) {
        *st_p = st;
        return ROUND_DONE;
    }
    if (st != GRAFT_OK)
        GRAFT_DEBUG(GRAFT_MOD_MEMBERSHIP, "formation attempt failed: %s",
                    graft_status_string(st));
    else
        r->lost_at_mod = s->quorum_mod; /* the watch will bring the winner's record */
    *wake_p = GRAFT_MIN(*wake_p, graft__now_ns() + 200000000ull);
    return ROUND_WAIT;
}

/* One look at the view: the round is there (with or without this group),
 * or the decision says wait, give up or form. *version_p is the view's
 * version the look was based on, *wake_p when to look again at the latest. */
static round_next_t round_pass(mround_t *r, graft_quorum_t **quorum_p, graft_status_t *st_p,
                               uint64_t *version_p, uint64_t *wake_p)
{
    graft_membership_t *m = r->m;
    round_seen_t s;
    uint64_t now = graft__now_ns();
    *st_p = round_reread(r, now, now >= r->announced + r->join_ns);
    if (*st_p != GRAFT_OK)
        return ROUND_DONE;
    pthread_mutex_lock(&m->mu);
    if (m->lease_lost_pending || !m->joined || m->left) {
        pthread_mutex_unlock(&m->mu);
        int64_t lease;
        uint64_t inc;
        *st_p = graft__mship_check_joined(m, &lease, &inc);
        /* Re-joined meanwhile: this round's announcement went with the old
         * lease, so the round is announced again by the caller; never a
         * success without a quorum. */
        if (*st_p == GRAFT_OK)
            *st_p = GRAFT_ELEASE;
        return ROUND_DONE;
    }
    const graft_quorum_t *cur = m->view.quorum;
    if (cur != NULL && cur->round >= r->round) {
        if (cur->round == r->round && graft__mship_has_group(cur, m->cfg.group)) {
            *st_p = result_for_me(m, cur, quorum_p);
            pthread_mutex_unlock(&m->mu);
            return ROUND_DONE;
        }
        uint64_t next = cur->round + 1;
        pthread_mutex_unlock(&m->mu);
        GRAFT_INFO(GRAFT_MOD_MEMBERSHIP, "job %s group %" PRIu32 ": round %" PRIu64
                   " formed without this group; announcing for round %" PRIu64, m->job,
                   m->cfg.group, r->round, next);
        *st_p = round_announce_next(r, next);
        return *st_p == GRAFT_OK ? ROUND_AGAIN : ROUND_DONE;
    }
    *st_p = round_decide_locked(r, &s);
    pthread_mutex_unlock(&m->mu);
    if (*st_p != GRAFT_OK)
        return ROUND_DONE;
    *version_p = s.version;
    *wake_p = GRAFT_MIN(r->deadline, r->announced + r->join_ns);
    if (m->race_poll_ns > 0)
        *wake_p = GRAFT_MIN(*wake_p, r->last_read + m->race_poll_ns);
    if (s.d.action == GRAFT__QUORUM_SHORT) {
        GRAFT_WARN(GRAFT_MOD_MEMBERSHIP,
                   "job %s round %" PRIu64 ": only %zu of %zu live groups "
                   "ready after the join timeout, %" PRIu32 " needed: no quorum",
                   m->job, r->round, s.d.n_ready_groups, s.d.n_live_groups, m->cfg.min_groups);
        *st_p = GRAFT_ENOQUORUM;
        return ROUND_DONE;
    }
    if (s.d.action == GRAFT__QUORUM_FORM && s.quorum_mod != r->lost_at_mod)
        return round_form(r, &s, quorum_p, st_p, wake_p);
    graft_membership_quorum_free(s.formed);
    return ROUND_WAIT;
}

/* Wait until the view's version moves past `version`, the lease is lost,
 * or `wake`. */
static void view_wait(graft_membership_t *m, uint64_t version, uint64_t wake)
{
    struct timespec ts;
    uint64_t now = graft__now_ns();
    graft__mship_deadline(&ts, wake > now ? wake - now : 1000000ull);
    pthread_mutex_lock(&m->mu);
    while (m->view.version == version && !m->lease_lost_pending) {
        if (pthread_cond_timedwait(&m->cv, &m->mu, &ts) == ETIMEDOUT)
            break;
    }
    pthread_mutex_unlock(&m->mu);
}

graft_status_t graft_membership_quorum_wait_opts(graft_membership_t *m, uint64_t committed_step,
                                                 uint32_t timeout_ms,
                                                 const graft_membership_round_opts_t *opts,
                                                 graft_quorum_t **quorum_p)
{
    static const graft_membership_round_opts_t none = {0};
    graft_quorum_t *fast = NULL;
    int64_t lease;
    uint64_t inc;
    if (m == NULL || quorum_p == NULL)
        return GRAFT_EINVAL;
    if (opts == NULL)
        opts = &none;
    graft_status_t st = graft__mship_delegates_check(m, opts->delegates, opts->n_delegates);
    if (st != GRAFT_OK)
        return st;
    mround_t r = {.m = m, .committed = committed_step,
                  .deadline = graft__now_ns() + (uint64_t)timeout_ms * 1000000ull,
                  .join_ns = (uint64_t)m->cfg.join_timeout_ms * 1000000ull};
    st = graft__mship_await_joined(m, r.deadline, &lease, &inc);
    if (st != GRAFT_OK) {
        if (opts->announced != NULL)
            opts->announced(opts->arg, 0, false);
        return st;
    }
    st = round_announce_first(&r, opts, &fast);
    if (st == GRAFT_OK && fast != NULL) {
        st = round_result(&r, fast, quorum_p);
        graft_membership_quorum_free(fast);
        goto out;
    }
    while (st == GRAFT_OK) {
        uint64_t version = 0, wake = 0;
        round_next_t next = round_pass(&r, quorum_p, &st, &version, &wake);
        if (next == ROUND_DONE)
            break;
        if (next == ROUND_AGAIN)
            continue;
        if (graft__now_ns() >= r.deadline) {
            GRAFT_WARN(GRAFT_MOD_MEMBERSHIP, "job %s group %" PRIu32 " rank %" PRIu32
                       ": no quorum for round %" PRIu64 " within %" PRIu32 " ms", m->job,
                       m->cfg.group, m->cfg.rank, r.round, timeout_ms);
            st = GRAFT_ETIMEOUT;
            break;
        }
        view_wait(m, version, wake);
    }
out:
    graft_free(r.ready);
    return st;
}

graft_status_t graft_membership_quorum_latest(graft_membership_t *m, graft_quorum_t **quorum_p)
{
    if (m == NULL || quorum_p == NULL)
        return GRAFT_EINVAL;
    graft_status_t st = GRAFT_ENOTFOUND;
    pthread_mutex_lock(&m->mu);
    if (m->view.quorum != NULL)
        st = graft__mship_quorum_copy(m->view.quorum, quorum_p);
    pthread_mutex_unlock(&m->mu);
    if (st == GRAFT_OK) {
        (*quorum_p)->replica_rank = 0;
        (*quorum_p)->replica_world = (uint32_t)(*quorum_p)->n_members;
        (*quorum_p)->must_recover = false;
        (*quorum_p)->id_changed = false;
    }
    return st;
}
