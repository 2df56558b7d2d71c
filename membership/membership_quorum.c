/*
 * Quorum rounds. The decision itself is the pure graft__quorum_decide();
 * this file announces, waits on the view and runs the compare-and-swap that
 * makes exactly one record per round. Commit votes are in
 * membership_votes.c, blob slots in membership_blobs.c.
 */
#include "membership_internal.h"

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <string.h>

#define RETRY_FIRST_NS 50000000ull
#define RETRY_MAX_NS 1000000000ull

/* Outcome of a check of the lease at the start of a call. */
graft_status_t graft__mship_check_joined(graft_membership_t *m, int64_t *lease_p, uint64_t *inc_p)
{
    graft_status_t st = GRAFT_OK;
    pthread_mutex_lock(&m->mu);
    if (m->cfg.observer || m->left) {
        st = GRAFT_ESTATE;
    } else if (m->lease_lost_pending) {
        /* Reported once; the keep-alive thread is re-joining meanwhile. */
        m->lease_lost_pending = false;
        m->last_id = 0;
        st = GRAFT_ELEASE;
    } else if (!m->joined) {
        st = GRAFT_ELEASE;
    } else {
        *lease_p = m->lease;
        *inc_p = m->incarnation;
    }
    pthread_mutex_unlock(&m->mu);
    return st;
}

/* As graft__mship_check_joined(), but a re-join under way (the keep-alive
 * thread's, after the loss was reported) is waited for until the deadline
 * instead of reported again: a caller that asks again on GRAFT_ELEASE would
 * otherwise spin on the mutex the re-join and the watches need. */
static graft_status_t await_joined(graft_membership_t *m, uint64_t deadline_ns, int64_t *lease_p,
                                   uint64_t *inc_p)
{
    pthread_mutex_lock(&m->mu);
    while (!m->joined && !m->left && !m->lease_lost_pending && !m->cfg.observer &&
           !atomic_load(&m->stop)) {
        uint64_t now = graft__now_ns();
        if (now >= deadline_ns)
            break;
        struct timespec ts;
        graft__mship_deadline(&ts, deadline_ns - now);
        if (pthread_cond_timedwait(&m->cv, &m->mu, &ts) == ETIMEDOUT)
            break;
    }
    pthread_mutex_unlock(&m->mu);
    return graft__mship_check_joined(m, lease_p, inc_p);
}

/*
 * Run a transaction without compares (puts on the rank's lease, maybe a
 * read), retrying with backoff until the deadline while etcd cannot be
 * reached. An unknown lease means it expired or was revoked: that is
 * reported, never papered over.
 */
graft_status_t graft__mship_txn_retry(graft_membership_t *m, const graft_etcd_compare_t *cmps,
                                size_t n_cmps, const graft_etcd_op_t *ops, size_t n_ops,
                                const graft_etcd_op_t *fail, size_t n_fail, int64_t lease,
                                uint64_t deadline_ns, const char *what,
                                graft_etcd_txn_result_t *res_p)
{
    uint64_t backoff = RETRY_FIRST_NS;
    bool warned = false;
    for (;;) {
        GRAFT__MSHIP_REQ(m);
        graft_status_t st = graft_etcd_txn(m->ops, cmps, n_cmps, ops, n_ops, fail, n_fail, res_p);
        if (st == GRAFT_OK) {
            if (warned)
                GRAFT_INFO(GRAFT_MOD_MEMBERSHIP, "job %s: %s written after retrying", m->job, what);
            return GRAFT_OK;
        }
        atomic_fetch_add(&m->n_etcd_errors, 1);
        if (st == GRAFT_ENOTFOUND && lease == 0)
            return st; /* several ranks' leases: the caller tells whose */
        if (st == GRAFT_ENOTFOUND) {
            graft__mship_lease_failed(m, lease, st);
            return GRAFT_ELEASE;
        }
        if (graft_status_class(st) != GRAFT_CLASS_JOB || st == GRAFT_ETOOLARGE) {
            GRAFT_ERROR(GRAFT_MOD_MEMBERSHIP, "job %s: cannot write %s: %s", m->job, what,
                        graft_status_string(st));
            return st;
        }
        uint64_t now = graft__now_ns();
        if (now >= deadline_ns) {
            GRAFT_ERROR(GRAFT_MOD_MEMBERSHIP, "job %s group %" PRIu32 " rank %" PRIu32
                        ": gave up writing %s: %s", m->job, m->cfg.group, m->cfg.rank, what,
                        graft_status_string(st));
            return st;
        }
        if (!warned)
            GRAFT_WARN(GRAFT_MOD_MEMBERSHIP, "job %s group %" PRIu32 " rank %" PRIu32
                       ": cannot write %s: %s; retrying with backoff", m->job, m->cfg.group,
                       m->cfg.rank, what, graft_status_string(st));
        warned = true;
        graft__sleep_ns(GRAFT_MIN(graft__jitter_ns(backoff), deadline_ns - now));
        backoff = GRAFT_MIN(backoff * 2, RETRY_MAX_NS);
    }
}

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

/* Delegates must be other ranks of this group, each once, and few enough
 * for one transaction. */
graft_status_t graft__mship_delegates_check(const graft_membership_t *m,
                                            const graft_membership_delegate_t *dl, size_t n)
{
    if (n > 0 && dl == NULL)
        return GRAFT_EINVAL;
    if (n > GRAFT_MEMBERSHIP_MAX_DELEGATES)
        return GRAFT_EINVAL;
    for (size_t i = 0; i < n; i++) {
        if (dl[i].rank >= m->cfg.ranks_per_group || dl[i].rank == m->cfg.rank || dl[i].lease == 0)
            return GRAFT_EINVAL;
        for (size_t j = 0; j < i; j++)
            if (dl[j].rank == dl[i].rank)
                return GRAFT_EINVAL;
    }
    return GRAFT_OK;
}

graft_status_t graft_membership_quorum_wait(graft_membership_t *m, uint64_t committed_step,
                                            uint32_t timeout_ms, graft_quorum_t **quorum_p)
{
    return graft_membership_quorum_wait_opts(m, committed_step, timeout_ms, NULL, quorum_p);
}

graft_status_t graft_membership_quorum_wait_opts(graft_membership_t *m, uint64_t committed_step,
                                                 uint32_t timeout_ms,
                                                 const graft_membership_round_opts_t *opts,
                                                 graft_quorum_t **quorum_p)
{
    static const graft_membership_round_opts_t none = {0};
    graft_status_t st;
    int64_t lease;
    uint64_t inc;
    graft__ready_t *ready = NULL;
    size_t n_ready = 0;
    if (m == NULL || quorum_p == NULL)
        return GRAFT_EINVAL;
    if (opts == NULL)
        opts = &none;
    st = graft__mship_delegates_check(m, opts->delegates, opts->n_delegates);
    if (st != GRAFT_OK)
        return st;
    uint64_t deadline = graft__now_ns() + (uint64_t)timeout_ms * 1000000ull;
    st = await_joined(m, deadline, &lease, &inc);
    if (st != GRAFT_OK) {
        if (opts->announced != NULL)
            opts->announced(opts->arg, 0, false);
        return st;
    }
    uint64_t join_ns = (uint64_t)m->cfg.join_timeout_ms * 1000000ull;

    uint64_t round = next_round(m);
    pthread_mutex_lock(&m->mu);
    uint64_t gen = m->view.members_gen;
    pthread_mutex_unlock(&m->mu);
    graft_quorum_t *fast = NULL;
    if (opts->announced_round != 0) {
        /* The leader wrote this rank's record: its round is the one. */
        round = opts->announced_round;
        pthread_mutex_lock(&m->mu);
        m->ready_round = round;
        pthread_mutex_unlock(&m->mu);
    } else {
        /* A leader announces for the latest round any of its ranks saw. */
        for (size_t i = 0; i < opts->n_delegates; i++)
            round = GRAFT_MAX(round, opts->delegates[i].round);
        bool delegated = false;
        st = graft__mship_announce(m, round, committed_step, opts->delegates,
                                   opts->n_delegates, deadline, &ready, &n_ready, &fast,
                                   &delegated);
        if (opts->announced != NULL)
            opts->announced(opts->arg, st == GRAFT_OK ? round : 0, st == GRAFT_OK && delegated);
        if (st != GRAFT_OK)
            return st;
    }
    if (fast != NULL) {
        pthread_mutex_lock(&m->mu);
        st = result_for_me(m, fast, quorum_p);
        pthread_mutex_unlock(&m->mu);
        graft_membership_quorum_free(fast);
        goto out;
    }
    uint64_t announced = graft__now_ns();
    uint64_t last_read = announced;
    bool read_after_deadline = false;
    int64_t lost_at_mod = -1; /* quorum_mod of a lost race: wait for the winner */

    for (;;) {
        graft__qmember_t *mem = NULL;
        graft_quorum_t *formed = NULL;
        graft__qdecision_t d;
        uint64_t now = graft__now_ns();
        bool deadline_passed = now >= announced + join_ns;

        /* Re-read the ready records only when the decision may change
         * because of them: once at the join timeout, and when members
         * change (a group died or joined). Otherwise the rank whose write
         * completes the set sees it in its own announcement. */
        pthread_mutex_lock(&m->mu);
        bool members_changed = m->view.members_gen != gen;
        pthread_mutex_unlock(&m->mu);
        bool reread = (deadline_passed && !read_after_deadline) || members_changed ||
                      (m->race_poll_ns > 0 && now >= last_read + m->race_poll_ns);
        if (reread) {
            graft__ready_t *fresh = NULL;
            size_t n_fresh = 0;
            pthread_mutex_lock(&m->mu);
            gen = m->view.members_gen;
            pthread_mutex_unlock(&m->mu);
            st = graft__mship_read_ready(m, round, &fresh, &n_fresh);
            if (st == GRAFT_ENOMEM)
                goto out;
            if (st == GRAFT_OK) {
                graft_free(ready);
                ready = fresh;
                n_ready = n_fresh;
                read_after_deadline = deadline_passed;
            }
            last_read = graft__now_ns();
        }

        pthread_mutex_lock(&m->mu);
        if (m->lease_lost_pending || !m->joined || m->left) {
            pthread_mutex_unlock(&m->mu);
            st = graft__mship_check_joined(m, &lease, &inc);
            goto out;
        }
        const graft_quorum_t *cur = m->view.quorum;
        if (cur != NULL && cur->round >= round) {
            if (cur->round == round && graft__mship_has_group(cur, m->cfg.group)) {
                st = result_for_me(m, cur, quorum_p);
                pthread_mutex_unlock(&m->mu);
                goto out;
            }
            /* The round formed without this group (it was late, or hung):
             * announce for the next one and come back as a recipient. */
            uint64_t next = cur->round + 1;
            pthread_mutex_unlock(&m->mu);
            GRAFT_INFO(GRAFT_MOD_MEMBERSHIP, "job %s group %" PRIu32 ": round %" PRIu64
                       " formed without this group; announcing for round %" PRIu64, m->job,
                       m->cfg.group, round, next);
            round = next;
            graft_free(ready);
            ready = NULL;
            st = graft__mship_announce(m, round, committed_step, NULL, 0, deadline, &ready, &n_ready, NULL,
                                       NULL);
            if (st != GRAFT_OK)
                goto out;
            announced = last_read = graft__now_ns();
            read_after_deadline = false;
            lost_at_mod = -1;
            continue;
        }
        st = graft__mship_snapshot_members(m, &mem);
        graft__qinput_t in = {mem, m->view.n_members, ready, n_ready, m->cfg.ranks_per_group,
                              m->cfg.min_groups, round, read_after_deadline, m->view.quorum,
                              graft__wall_ns() / 1000000u};
        if (st == GRAFT_OK)
            st = graft__quorum_decide(&in, &d, &formed);
        int64_t quorum_mod = m->view.quorum_mod;
        bool replaces_bad = quorum_mod != 0 && m->view.quorum_bad_mod == quorum_mod;
        graft_status_t bad_reason = m->view.quorum_bad_reason;
        uint64_t version = m->view.version;
        bool prev_known = m->view.quorum != NULL;
        uint64_t prev_id = prev_known ? m->view.quorum->id : 0;
        pthread_mutex_unlock(&m->mu);
        graft_free(mem);
        if (st != GRAFT_OK)
            goto out;

        uint64_t wake = GRAFT_MIN(deadline, announced + join_ns);
        if (m->race_poll_ns > 0)
            wake = GRAFT_MIN(wake, last_read + m->race_poll_ns);
        if (d.action == GRAFT__QUORUM_SHORT) {
            GRAFT_WARN(GRAFT_MOD_MEMBERSHIP,
                       "job %s round %" PRIu64 ": only %zu of %zu live groups "
                       "ready after the join timeout, %" PRIu32 " needed: no quorum",
                       m->job, round, d.n_ready_groups, d.n_live_groups, m->cfg.min_groups);
            st = GRAFT_ENOQUORUM;
            goto out;
        }
        if (d.action == GRAFT__QUORUM_FORM && quorum_mod != lost_at_mod) {
            bool won = false;
            graft_quorum_t *current = NULL;
            int64_t revision = 0;
            formed->duration_us = (graft__now_ns() - announced) / 1000u;
            st = form_cas(m, formed, quorum_mod, &won, &revision, &current);
            if (st == GRAFT_OK && won) {
                graft__mship_view_adopt(m, formed, revision);
                GRAFT_DEBUG(GRAFT_MOD_MEMBERSHIP, "job %s: formed round %" PRIu64 " id %" PRIu64
                            " with %zu groups", m->job, formed->round, formed->id,
                            formed->n_members);
                if (replaces_bad)
                    graft__mship_quorum_replaced_event(m, bad_reason, formed);
                formation_events(m, formed, !prev_known || prev_id != formed->id);
                if (graft__mship_has_group(formed, m->cfg.group)) {
                    pthread_mutex_lock(&m->mu);
                    st = result_for_me(m, formed, quorum_p);
                    pthread_mutex_unlock(&m->mu);
                    graft_membership_quorum_free(formed);
                    goto out;
                }
                /* Formed after the join timeout without this rank's own
                 * group (another rank of it is late): the others go on,
                 * this group tries the next round. */
                pthread_mutex_lock(&m->mu);
                m->last_round = GRAFT_MAX(m->last_round, formed->round);
                pthread_mutex_unlock(&m->mu);
                round = formed->round + 1;
                graft_membership_quorum_free(formed);
                graft_free(ready);
                ready = NULL;
                st = graft__mship_announce(m, round, committed_step, NULL, 0, deadline, &ready, &n_ready, NULL,
                                       NULL);
                if (st != GRAFT_OK)
                    goto out;
                announced = last_read = graft__now_ns();
                read_after_deadline = false;
                lost_at_mod = -1;
                continue;
            }
            graft_membership_quorum_free(formed);
            formed = NULL;
            if (st == GRAFT_OK && current != NULL && current->round == round &&
                graft__mship_has_group(current, m->cfg.group)) {
                pthread_mutex_lock(&m->mu);
                st = result_for_me(m, current, quorum_p);
                pthread_mutex_unlock(&m->mu);
                graft_membership_quorum_free(current);
                goto out;
            }
            graft_membership_quorum_free(current);
            if (st == GRAFT_ENOMEM)
                goto out;
            if (st != GRAFT_OK)
                GRAFT_DEBUG(GRAFT_MOD_MEMBERSHIP, "formation attempt failed: %s",
                            graft_status_string(st));
            else
                lost_at_mod = quorum_mod; /* the watch will bring the winner's record */
            wake = GRAFT_MIN(wake, graft__now_ns() + 200000000ull);
        }
        graft_membership_quorum_free(formed);
        if (graft__now_ns() >= deadline) {
            GRAFT_WARN(GRAFT_MOD_MEMBERSHIP, "job %s group %" PRIu32 " rank %" PRIu32
                       ": no quorum for round %" PRIu64 " within %" PRIu32 " ms", m->job,
                       m->cfg.group, m->cfg.rank, round, timeout_ms);
            st = GRAFT_ETIMEOUT;
            goto out;
        }
        struct timespec ts;
        uint64_t nowns = graft__now_ns();
        graft__mship_deadline(&ts, wake > nowns ? wake - nowns : 1000000ull);
        pthread_mutex_lock(&m->mu);
        while (m->view.version == version && !m->lease_lost_pending) {
            if (pthread_cond_timedwait(&m->cv, &m->mu, &ts) == ETIMEDOUT)
                break;
        }
        pthread_mutex_unlock(&m->mu);
    }
out:
    graft_free(ready);
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
