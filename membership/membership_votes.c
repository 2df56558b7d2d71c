/*
 * Commit votes: a rank's vote for its round, the "no" written on behalf of
 * a rank that did not vote in time, and the tally every rank makes from
 * what etcd holds.
 */
#include "membership_internal.h"

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <string.h>

/*
 * Votes are keyed per round, votes/<g>/<round>/<rank>, and every write of a
 * vote key is create-if-absent: the rank's own vote, or, from a rank whose
 * timeout passed, a "no" on behalf of a rank that had not voted. So each
 * key of a round is written once, and every rank decides from what etcd
 * holds: yes when a read shows all R keys as yes, no when one shows a no.
 * A late rank cannot turn a round that someone decided no (with a key
 * written by the timeout) into a yes: its own create fails and its read
 * shows the no. docs/KEYS.md has the argument.
 */

enum { VOTE_UNSEEN = 0, VOTE_YES = 1, VOTE_NO = 2 };
enum { TALLY_OPEN = 0, TALLY_YES, TALLY_NO };

/* Note one rank's vote key of this round. A key of the round that is not a
 * yes for this quorum is a no: nobody can write that rank's vote any more. */
static void vote_note(const graft__vote_t *x, uint32_t group, const graft_quorum_t *q, uint32_t R,
                      uint8_t *seen, char *why, size_t why_len)
{
    if (x->group != group || x->round != q->round || x->rank >= R)
        return;
    if (x->ok && x->quorum_id == q->id) {
        if (seen[x->rank] == VOTE_UNSEEN)
            seen[x->rank] = VOTE_YES;
        return;
    }
    seen[x->rank] = VOTE_NO;
    snprintf(why, why_len, "rank %" PRIu32 " voted no: %s", x->rank,
             x->quorum_id == q->id ? x->reason : "record of another quorum");
}

/* The round's votes as one read shows them. A record that does not decode
 * or sits under the wrong key is a no for the rank its key names (the view's
 * watch reports it as malformed). */
static void votes_from_read(graft_membership_t *m, const graft_etcd_range_result_t *r,
                            const graft_quorum_t *q, uint8_t *seen, char *why, size_t why_len)
{
    uint32_t R = m->cfg.ranks_per_group;
    memset(seen, 0, R);
    for (size_t i = 0; i < r->n_kvs; i++) {
        const graft_etcd_kv_t *kv = &r->kvs[i];
        graft__mkey_t k = graft__mship_key_parse(m->prefix, kv->key);
        graft__vote_t v;
        if (k.kind != GRAFT__MKEY_VOTE || k.group != m->cfg.group || k.number != q->round)
            continue;
        if (graft__mship_vote_decode(kv->value, kv->value_len, &v) != GRAFT_OK ||
            v.group != k.group || v.rank != k.rank || v.round != k.number) {
            v = (graft__vote_t){.group = k.group, .rank = k.rank, .round = k.number};
            snprintf(v.reason, sizeof(v.reason), "unreadable vote record");
        }
        vote_note(&v, m->cfg.group, q, R, seen, why, why_len);
    }
}

/* The round's votes as the view (the watch on votes/<own group>/) shows
 * them. Called with m->mu held. */
static void votes_from_view(graft_membership_t *m, const graft_quorum_t *q, uint8_t *seen,
                            char *why, size_t why_len)
{
    uint32_t R = m->cfg.ranks_per_group;
    memset(seen, 0, R);
    for (size_t i = 0; i < m->view.n_votes; i++)
        vote_note(&m->view.votes[i], m->cfg.group, q, R, seen, why, why_len);
}

/* The decision one consistent read allows: no once a rank's key is a no,
 * yes once all R keys are yes, else still open. */
static int tally(const uint8_t *seen, uint32_t R, uint32_t *have_p)
{
    uint32_t have = 0;
    bool any_no = false;
    for (uint32_t k = 0; k < R; k++) {
        have += seen[k] != VOTE_UNSEEN;
        any_no |= seen[k] == VOTE_NO;
    }
    if (have_p != NULL)
        *have_p = have;
    return any_no ? TALLY_NO : have == R ? TALLY_YES : TALLY_OPEN;
}

/* One vote key a vote transaction writes, and what goes on it. */
typedef struct vote_write {
    char *key;
    uint8_t *buf;
    size_t len;
    int64_t lease;
} vote_write_t;

/*
 * The rank's vote transaction: *if* its key of this round does not exist,
 * put it; either way delete its key of the round it voted in before and the
 * "no" records it wrote for others at its last timeout, and read the
 * round's folder. The compare fails only when a rank whose timeout passed
 * already recorded a no for this rank, and the read then shows it.
 *
 * A leader's transaction also holds the votes its ranks delegated (each a
 * create-if-absent on the rank's own lease, and the delete of the rank's
 * key of its previous round): all or none of them are written.
 * *batch_failed_p is set when there were delegates and they were not
 * written (a key already there, or a lease etcd no longer knows); the
 * caller then votes alone.
 */
/* What the rank's last vote left to delete: its key's round (*old_round_p)
 * and the "no" records it wrote for others at its last timeout, unless
 * they are of this very round. Only allocation failures are errors. */
static graft_status_t proxies_take(graft_membership_t *m, const graft_quorum_t *q,
                                   uint64_t *old_round_p, uint64_t *proxy_round_p,
                                   uint32_t **proxy_p, size_t *n_proxy_p)
{
    uint32_t *proxy = NULL;
    size_t n_proxy = 0;
    pthread_mutex_lock(&m->mu);
    uint64_t proxy_round = m->proxy_round;
    *old_round_p = m->vote_round;
    if (proxy_round != 0 && proxy_round != q->round && m->n_proxy > 0) {
        proxy = graft__malloc(m->n_proxy * sizeof(*proxy));
        if (proxy != NULL) {
            memcpy(proxy, m->proxy_ranks, m->n_proxy * sizeof(*proxy));
            n_proxy = m->n_proxy;
        }
    }
    bool no_mem = m->n_proxy > 0 && proxy_round != q->round && proxy == NULL;
    pthread_mutex_unlock(&m->mu);
    *proxy_round_p = proxy_round;
    *proxy_p = proxy;
    *n_proxy_p = n_proxy;
    return no_mem ? GRAFT_ENOMEM : GRAFT_OK;
}

/* The vote key of write i (0: this rank's own, with the caller's bytes;
 * else the delegate d's, encoded here), and the delete of the same rank's
 * key of the round it voted in before (prev) into dels[*n_dels_p]. */
static graft_status_t vote_write_prepare(graft_membership_t *m, const graft_quorum_t *q,
                                         const graft_membership_delegate_t *d, int64_t lease,
                                         const uint8_t *buf, size_t len, uint64_t prev,
                                         vote_write_t *w, char **dels, size_t *n_dels_p)
{
    uint32_t rank = d == NULL ? m->cfg.rank : d->rank;
    w->lease = d == NULL ? lease : d->lease;
    w->key = graft__key_vote(m->prefix, m->cfg.group, q->round, rank);
    if (w->key == NULL)
        return GRAFT_ENOMEM;
    if (d == NULL) {
        w->buf = (uint8_t *)buf; /* the caller's */
        w->len = len;
    } else {
        graft__vote_t v = {0};
        v.group = m->cfg.group;
        v.rank = d->rank;
        v.incarnation = d->incarnation;
        v.quorum_id = d->quorum_id;
        v.round = q->round;
        v.step = d->step;
        v.ok = d->ok;
        snprintf(v.reason, sizeof(v.reason), "%.*s", (int)sizeof(d->reason), d->reason);
        graft_status_t st = graft__mship_vote_encode(&v, &w->buf, &w->len);
        if (st != GRAFT_OK)
            return st;
    }
    if (prev != 0 && prev != q->round) {
        dels[*n_dels_p] = graft__key_vote(m->prefix, m->cfg.group, prev, rank);
        if (dels[(*n_dels_p)++] == NULL)
            return GRAFT_ENOMEM;
    }
    return GRAFT_OK;
}

static graft_status_t vote_txn(graft_membership_t *m, const graft_quorum_t *q, int64_t lease,
                               const uint8_t *buf, size_t len,
                               const graft_membership_delegate_t *dl, size_t n_dl,
                               uint64_t deadline, graft_etcd_txn_result_t *res_p,
                               bool *batch_failed_p)
{
    char *folder = NULL;
    char **dels = NULL;
    size_t n_dels = 0, n_proxy = 0;
    uint32_t *proxy = NULL;
    graft_etcd_op_t *ops = NULL;
    graft_etcd_compare_t *cmps = NULL;
    vote_write_t *w = NULL;
    uint64_t old_round = 0, proxy_round = 0;
    *batch_failed_p = false;
    graft_status_t st = proxies_take(m, q, &old_round, &proxy_round, &proxy, &n_proxy);
    bool no_mem = st != GRAFT_OK;
    size_t n_w = n_dl + 1, max_dels = n_proxy + n_w;
    folder = graft__key_votes_round_folder(m->prefix, m->cfg.group, q->round);
    dels = graft__calloc(max_dels, sizeof(*dels));
    ops = graft__calloc(2 * (n_w + max_dels + 1), sizeof(*ops));
    cmps = graft__calloc(n_w, sizeof(*cmps));
    w = graft__calloc(n_w, sizeof(*w));
    if (no_mem || folder == NULL || dels == NULL || ops == NULL || cmps == NULL || w == NULL) {
        st = GRAFT_ENOMEM;
        goto out;
    }
    for (size_t i = 0; i < n_w; i++) {
        const graft_membership_delegate_t *d = i == 0 ? NULL : &dl[i - 1];
        st = vote_write_prepare(m, q, d, lease, buf, len, d == NULL ? old_round : d->prev_round,
                                &w[i], dels, &n_dels);
        if (st != GRAFT_OK)
            goto out;
        cmps[i] = (graft_etcd_compare_t){w[i].key, GRAFT_ETCD_CMP_CREATE, GRAFT_ETCD_CMP_EQUAL, 0,
                                         NULL, 0};
    }
    for (size_t i = 0; i < n_proxy; i++) {
        dels[n_dels] = graft__key_vote(m->prefix, m->cfg.group, proxy_round, proxy[i]);
        if (dels[n_dels++] == NULL) {
            st = GRAFT_ENOMEM;
            goto out;
        }
    }
    /* Success: puts, read, deletes. Failure: read, deletes. */
    graft_etcd_op_t *ok_ops = ops, *fail_ops = ops + n_w + n_dels + 1;
    size_t n_ok = 0, n_fail = 0;
    for (size_t i = 0; i < n_w; i++)
        ok_ops[n_ok++] = (graft_etcd_op_t){GRAFT_ETCD_OP_PUT, w[i].key, w[i].buf, w[i].len,
                                           w[i].lease, false, false};
    ok_ops[n_ok++] = (graft_etcd_op_t){GRAFT_ETCD_OP_RANGE, folder, NULL, 0, 0, true, false};
    fail_ops[n_fail++] = ok_ops[n_ok - 1];
    for (size_t i = 0; i < n_dels; i++) {
        ok_ops[n_ok++] = (graft_etcd_op_t){GRAFT_ETCD_OP_DELETE, dels[i], NULL, 0, 0, false, false};
        fail_ops[n_fail++] = ok_ops[n_ok - 1];
    }
    st = graft__mship_txn_retry(m, cmps, n_w, ok_ops, n_ok, fail_ops, n_fail, n_dl > 0 ? 0 : lease,
                                deadline, n_dl > 0 ? "the group's commit votes" : "commit vote",
                                res_p);
    if (n_dl > 0 && (st == GRAFT_ENOTFOUND || (st == GRAFT_OK && !res_p->succeeded))) {
        *batch_failed_p = true;
        graft_etcd_txn_result_clear(res_p);
        st = GRAFT_OK;
        goto out;
    }
    if (st != GRAFT_OK)
        goto out;
    pthread_mutex_lock(&m->mu);
    m->vote_round = q->round;
    if (m->proxy_round == proxy_round && proxy_round != q->round) {
        m->proxy_round = 0;
        m->n_proxy = 0;
    }
    pthread_mutex_unlock(&m->mu);
out:
    for (size_t i = 0; dels != NULL && i < n_dels; i++)
        graft_free(dels[i]);
    for (size_t i = 0; w != NULL && i < n_w; i++) {
        graft_free(w[i].key);
        if (i > 0)
            graft_free(w[i].buf);
    }
    graft_free(w);
    graft_free(cmps);
    graft_free(dels);
    graft_free(ops);
    graft_free(proxy);
    graft_free(folder);
    return st;
}

/* Remember the "no" records written for ranks[] so that the next vote
 * transaction deletes them. Only allocation failures are errors. */
static graft_status_t proxies_track(graft_membership_t *m, uint64_t round, const uint32_t *ranks,
                                    size_t n)
{
    graft_status_t st = GRAFT_OK;
    pthread_mutex_lock(&m->mu);
    size_t base = m->proxy_round == round ? m->n_proxy : 0;
    uint32_t *grown = graft__realloc(m->proxy_ranks, (base + n) * sizeof(*grown));
    if (grown == NULL) {
        st = GRAFT_ENOMEM;
    } else {
        memcpy(grown + base, ranks, n * sizeof(*grown));
        m->proxy_ranks = grown;
        m->n_proxy = base + n;
        m->proxy_round = round;
    }
    pthread_mutex_unlock(&m->mu);
    return st;
}

/*
 * The timeout passed with votes missing. In one transaction, *if* the keys
 * of the ranks still missing do not exist, put a no for each of them (on
 * this rank's lease) and read the round; *else* (one of them voted
 * meanwhile) read the round. Every rank decides from what etcd then holds,
 * so a rank that votes later finds the no instead of its own key. A read
 * that still misses a key is tried again with the new set: each failure
 * means a key appeared, so R + 1 attempts end it unless keys vanish too
 * (leases expiring meanwhile), and then the answer is no.
 */
static graft_status_t record_missing(graft_membership_t *m, const graft_quorum_t *q,
                                     int64_t lease, uint8_t *seen, uint32_t timeout_ms,
                                     char *why, size_t why_len, bool *decision_p)
{
    graft_status_t st = GRAFT_OK;
    uint32_t R = m->cfg.ranks_per_group;
    uint32_t *missing = graft__calloc(R, sizeof(*missing));
    char **keys = graft__calloc(R, sizeof(*keys));
    uint8_t **bufs = graft__calloc(R, sizeof(*bufs));
    graft_etcd_compare_t *cmps = graft__calloc(R, sizeof(*cmps));
    graft_etcd_op_t *ops = graft__calloc(R + 1, sizeof(*ops));
    char *folder = graft__key_votes_round_folder(m->prefix, m->cfg.group, q->round);
    uint64_t deadline = graft__now_ns() + (uint64_t)GRAFT_MIN(timeout_ms, 2000u) * 1000000ull;
    *decision_p = false;
    if (missing == NULL || keys == NULL || bufs == NULL || cmps == NULL || ops == NULL ||
        folder == NULL) {
        st = GRAFT_ENOMEM;
        goto out;
    }
    for (uint32_t attempt = 0; attempt <= R; attempt++) {
        size_t n = 0;
        for (uint32_t k = 0; k < R; k++) {
            if (seen[k] != VOTE_UNSEEN)
                continue;
            graft__vote_t v = {0};
            size_t len = 0;
            v.group = m->cfg.group;
            v.rank = k;
            v.quorum_id = q->id;
            v.round = q->round;
            v.step = q->step;
            v.ok = false;
            snprintf(v.reason, sizeof(v.reason),
                     "no vote by the timeout, recorded by rank %" PRIu32, m->cfg.rank);
            keys[n] = graft__key_vote(m->prefix, m->cfg.group, q->round, k);
            missing[n] = k;
            if (keys[n] == NULL) {
                st = GRAFT_ENOMEM;
                goto out;
            }
            st = graft__mship_vote_encode(&v, &bufs[n], &len);
            n++;
            if (st != GRAFT_OK)
                goto out;
            cmps[n - 1] = (graft_etcd_compare_t){keys[n - 1], GRAFT_ETCD_CMP_CREATE,
                                                 GRAFT_ETCD_CMP_EQUAL, 0, NULL, 0};
            ops[n - 1] = (graft_etcd_op_t){GRAFT_ETCD_OP_PUT, keys[n - 1], bufs[n - 1], len, lease,
                                           false, false};
        }
        ops[n] = (graft_etcd_op_t){GRAFT_ETCD_OP_RANGE, folder, NULL, 0, 0, true, false};
        graft_etcd_txn_result_t res = {0};
        st = graft__mship_txn_retry(m, cmps, n, ops, n + 1, &ops[n], 1, lease, deadline, "missing votes", &res);
        bool wrote = st == GRAFT_OK && res.succeeded && n > 0;
        if (st == GRAFT_OK && res.n_ranges == 1)
            votes_from_read(m, &res.ranges[0], q, seen, why, why_len);
        else if (st == GRAFT_OK)
            st = GRAFT_EMALFORMED;
        graft_etcd_txn_result_clear(&res);
        if (wrote)
            st = proxies_track(m, q->round, missing, n);
        for (size_t i = 0; i < n; i++) {
            graft_free(keys[i]);
            graft_free(bufs[i]);
            keys[i] = NULL;
            bufs[i] = NULL;
        }
        if (st != GRAFT_OK)
            goto out;
        uint32_t have = 0;
        int t = tally(seen, R, &have);
        if (wrote)
            snprintf(why, why_len, "%" PRIu32 " of %" PRIu32 " votes by the timeout",
                     have - (uint32_t)n, R);
        if (t != TALLY_OPEN) {
            *decision_p = t == TALLY_YES;
            goto out;
        }
    }
    GRAFT_WARN(GRAFT_MOD_MEMBERSHIP, "job %s group %" PRIu32 " round %" PRIu64 ": votes appeared "
               "and vanished while recording the missing ones: no", m->job, m->cfg.group,
               q->round);
    snprintf(why, why_len, "votes still incomplete after recording the missing ones");
out:
    for (uint32_t i = 0; keys != NULL && bufs != NULL && i < R; i++) {
        graft_free(keys[i]);
        graft_free(bufs[i]);
    }
    graft_free(folder);
    graft_free(ops);
    graft_free(cmps);
    graft_free(bufs);
    graft_free(keys);
    graft_free(missing);
    return st;
}

/* A delegating rank: wait up to wait_ms for its vote key of the round to
 * show in the view (its leader wrote it). True when it did: *guess is then
 * the round's votes as the view showed them at that one revision, and the
 * key is this rank's to delete at its next vote. False at once when rank
 * 0's key shows without it: the leader's transaction, which writes its own
 * key with its delegates' at one revision, went without this rank. */
static bool delegated_seen(graft_membership_t *m, const graft_quorum_t *q, uint32_t wait_ms,
                           uint8_t *guess, char *why, size_t why_len)
{
    struct timespec ts;
    bool seen = false;
    graft__mship_deadline(&ts, (uint64_t)wait_ms * 1000000ull);
    pthread_mutex_lock(&m->mu);
    for (;;) {
        votes_from_view(m, q, guess, why, why_len);
        seen = guess[m->cfg.rank] != VOTE_UNSEEN;
        if (seen || guess[0] != VOTE_UNSEEN || m->lease_lost_pending || !m->joined ||
            pthread_cond_timedwait(&m->cv, &m->mu, &ts) == ETIMEDOUT)
            break;
    }
    if (seen)
        m->vote_round = GRAFT_MAX(m->vote_round, q->round);
    pthread_mutex_unlock(&m->mu);
    return seen;
}

graft_status_t graft_membership_vote_delegate(graft_membership_t *m, const graft_quorum_t *q,
                                              bool ok, const char *reason,
                                              graft_membership_delegate_t *d_p)
{
    int64_t lease;
    uint64_t inc;
    if (m == NULL || q == NULL || d_p == NULL || q->id == 0 || q->round == 0)
        return GRAFT_EINVAL;
    graft_status_t st = graft__mship_check_joined(m, &lease, &inc);
    if (st != GRAFT_OK)
        return st;
    memset(d_p, 0, sizeof(*d_p));
    pthread_mutex_lock(&m->mu);
    /* "No" records of an earlier round are deleted by this rank's own
     * vote transaction only. */
    bool must_self = q->round < m->vote_round ||
                     (m->n_proxy > 0 && m->proxy_round != q->round);
    d_p->prev_round = m->vote_round;
    pthread_mutex_unlock(&m->mu);
    if (must_self)
        return GRAFT_ESTATE;
    d_p->rank = m->cfg.rank;
    d_p->incarnation = inc;
    d_p->lease = lease;
    d_p->round = q->round;
    d_p->step = q->step;
    d_p->quorum_id = q->id;
    d_p->ok = ok;
    snprintf(d_p->reason, sizeof(d_p->reason), "%s", reason != NULL ? reason : "");
    return GRAFT_OK;
}

/* Rank 0 records its group's failed vote in the job's history. A group
 * that votes no at every try (a trainer vetoing each step, a setting that
 * differs) would write one event per try, tens a second, and push every
 * join and heal out of the history: the first VOTE_EVENTS_IN_FULL of a run
 * are recorded, then one every VOTE_EVENT_EVERY_NS at most, saying how
 * many it stands for ("(+K failed votes not recorded)"). */
#define VOTE_EVENTS_IN_FULL 3
#define VOTE_EVENT_EVERY_NS 5000000000ull

static void vote_event(graft_membership_t *m, const graft_quorum_t *q, uint64_t inc,
                       const char *why)
{
    uint64_t now = graft__now_ns();
    if (++m->novote_run > VOTE_EVENTS_IN_FULL && now - m->novote_last_ns < VOTE_EVENT_EVERY_NS) {
        m->novote_skipped++;
        return;
    }
    char detail[160 + 64]; /* why: the 160 bytes of commit_vote_opts() */
    snprintf(detail, sizeof(detail), "%s", why);
    if (m->novote_skipped > 0)
        snprintf(detail + strlen(detail), sizeof(detail) - strlen(detail),
                 " (+%" PRIu64 " failed votes not recorded)", m->novote_skipped);
    graft_event_t ev = {0};
    ev.kind = GRAFT_EVENT_VOTE_RESULT;
    ev.group = m->cfg.group;
    ev.incarnation = inc;
    ev.quorum_id = q->id;
    ev.round = q->round;
    ev.step = q->step;
    ev.ok = false;
    ev.detail = detail;
    if (graft__mship_event_put(m, &ev) != GRAFT_OK) {
        GRAFT_DEBUG(GRAFT_MOD_MEMBERSHIP, "vote event not recorded");
        return;
    }
    m->novote_last_ns = now;
    m->novote_skipped = 0;
}

graft_status_t graft_membership_commit_vote(graft_membership_t *m, const graft_quorum_t *q,
                                            bool ok, const char *reason, uint32_t timeout_ms,
                                            bool *decision_p)
{
    return graft_membership_commit_vote_opts(m, q, ok, reason, timeout_ms, NULL, decision_p);
}

/* The checks before a vote: arguments, delegates of this round, the lease,
 * and no vote for a round older than the rank's last. */
static graft_status_t vote_check(graft_membership_t *m, const graft_quorum_t *q,
                                 const graft_membership_vote_opts_t *opts, int64_t *lease_p,
                                 uint64_t *inc_p)
{
    graft_status_t st = graft__mship_delegates_check(m, opts->delegates, opts->n_delegates);
    if (st != GRAFT_OK)
        return st;
    for (size_t i = 0; i < opts->n_delegates; i++)
        if (opts->delegates[i].round != q->round || opts->delegates[i].quorum_id != q->id)
            return GRAFT_EINVAL;
    st = graft__mship_check_joined(m, lease_p, inc_p);
    if (st != GRAFT_OK)
        return st;
    pthread_mutex_lock(&m->mu);
    uint64_t last = m->vote_round;
    pthread_mutex_unlock(&m->mu);
    if (q->round < last) {
        /* Its key of that round is gone: voting again could write a yes
         * where the group already decided. */
        GRAFT_ERROR(GRAFT_MOD_MEMBERSHIP,
                    "job %s group %" PRIu32 " rank %" PRIu32 ": vote for round %"
                    PRIu64 " after voting in round %" PRIu64, m->job, m->cfg.group, m->cfg.rank,
                    q->round, last);
        return GRAFT_ESTATE;
    }
    return GRAFT_OK;
}

/* Write the rank's vote (and its delegates', as a leader; alone when the
 * batch fails) and note the round's votes the transaction read in guess[].
 * The round's votes are read in the same transaction: the last rank to
 * vote (with one rank per group, every rank) decides from its own request
 * instead of waiting for the watch to echo the votes. A vote the leader
 * wrote for this rank (opts->delegated_wait_ms) is not written again. */
static graft_status_t vote_write(graft_membership_t *m, const graft_quorum_t *q, int64_t lease,
                                 const uint8_t *buf, size_t len,
                                 const graft_membership_vote_opts_t *opts, uint64_t deadline,
                                 uint8_t *guess, char *why, size_t why_len)
{
    graft_etcd_txn_result_t res = {0};
    graft_status_t st = GRAFT_OK;
    if (opts->delegated_wait_ms > 0 &&
        delegated_seen(m, q, opts->delegated_wait_ms, guess, why, why_len))
        return GRAFT_OK;
    bool batch_failed = false;
    st = vote_txn(m, q, lease, buf, len, opts->delegates, opts->n_delegates, deadline, &res,
                  &batch_failed);
    if (st == GRAFT_OK && batch_failed) {
        GRAFT_INFO(GRAFT_MOD_MEMBERSHIP, "job %s group %" PRIu32 " round %" PRIu64 ": the "
                   "group's votes not written together (a vote already there, or a lease "
                   "gone); rank %" PRIu32 " votes alone", m->job, m->cfg.group, q->round,
                   m->cfg.rank);
        st = vote_txn(m, q, lease, buf, len, NULL, 0, deadline, &res, &batch_failed);
    }
    if (st == GRAFT_OK && res.n_ranges == 1)
        votes_from_read(m, &res.ranges[0], q, guess, why, why_len);
    else if (st == GRAFT_OK)
        st = GRAFT_EMALFORMED;
    graft_etcd_txn_result_clear(&res);
    return st;
}

/* Wait on the view (the watch of votes/<own group>/) until the round's
 * votes decide it, the lease is lost (*lost_p) or the timeout passes; the
 * tally of the last look. */
static int votes_wait_view(graft_membership_t *m, const graft_quorum_t *q, uint8_t *seen,
                           uint32_t timeout_ms, char *why, size_t why_len, bool *lost_p)
{
    uint32_t R = m->cfg.ranks_per_group;
    struct timespec ts;
    int t;
    graft__mship_deadline(&ts, (uint64_t)timeout_ms * 1000000ull);
    pthread_mutex_lock(&m->mu);
    for (;;) {
        votes_from_view(m, q, seen, why, why_len);
        t = tally(seen, R, NULL);
        if (t != TALLY_OPEN || m->lease_lost_pending || !m->joined)
            break;
        if (pthread_cond_timedwait(&m->cv, &m->mu, &ts) == ETIMEDOUT) {
            votes_from_view(m, q, seen, why, why_len);
            t = tally(seen, R, NULL);
            break;
        }
    }
    *lost_p = m->lease_lost_pending || !m->joined;
    pthread_mutex_unlock(&m->mu);
    return t;
}

graft_status_t graft_membership_commit_vote_opts(graft_membership_t *m, const graft_quorum_t *q,
                                                 bool ok, const char *reason,
                                                 uint32_t timeout_ms,
                                                 const graft_membership_vote_opts_t *opts,
                                                 bool *decision_p)
{
    static const graft_membership_vote_opts_t none = {0};
    int64_t lease;
    uint64_t inc;
    uint8_t *buf = NULL, *seen = NULL, *guess = NULL;
    size_t len = 0;
    char why[160] = "";
    graft_status_t st;
    if (m == NULL || q == NULL || decision_p == NULL || q->id == 0 || q->round == 0)
        return GRAFT_EINVAL;
    if (opts == NULL)
        opts = &none;
    *decision_p = false;
    st = vote_check(m, q, opts, &lease, &inc);
    if (st != GRAFT_OK)
        return st;
    uint64_t deadline = graft__now_ns() + (uint64_t)timeout_ms * 1000000ull;
    graft__vote_t v = {0};
    v.group = m->cfg.group;
    v.rank = m->cfg.rank;
    v.incarnation = inc;
    v.quorum_id = q->id;
    v.round = q->round;
    v.step = q->step;
    v.ok = ok;
    snprintf(v.reason, sizeof(v.reason), "%s", reason != NULL ? reason : "");
    st = graft__mship_vote_encode(&v, &buf, &len);
    if (st != GRAFT_OK)
        goto out;
    uint32_t R = m->cfg.ranks_per_group;
    seen = graft__calloc(R, sizeof(*seen));
    guess = graft__calloc(R, sizeof(*guess));
    if (seen == NULL || guess == NULL) {
        st = GRAFT_ENOMEM;
        goto out;
    }
    st = vote_write(m, q, lease, buf, len, opts, deadline, guess, why, sizeof(why));
    if (st != GRAFT_OK) {
        GRAFT_ERROR(GRAFT_MOD_MEMBERSHIP, "job %s group %" PRIu32 " cannot commit step %" PRIu64
                    ": vote not recorded (%s)", m->job, m->cfg.group, q->step,
                    graft_status_string(st));
        goto out;
    }

    /* Each look decides from one consistent state of the round's keys (the
     * read above, then the view at one revision), never from a mix: keys
     * of a round can be deleted (a rank's next vote, a lease expiring), and
     * a yes seen earlier next to a yes seen later is not a yes of etcd. */
    int t = tally(guess, R, NULL);
    bool lost = false;
    if (t == TALLY_OPEN)
        t = votes_wait_view(m, q, seen, timeout_ms, why, sizeof(why), &lost);
    if (t == TALLY_OPEN && lost) {
        st = graft__mship_check_joined(m, &lease, &inc);
        if (st == GRAFT_OK)
            st = GRAFT_ELEASE;
        goto out;
    }
    bool decision = t == TALLY_YES;
    if (t == TALLY_OPEN) {
        /* Ranks seen in either look are not missing; the compares check it. */
        for (uint32_t k = 0; k < R; k++)
            guess[k] = guess[k] != VOTE_UNSEEN ? guess[k] : seen[k];
        st = record_missing(m, q, lease, guess, timeout_ms, why, sizeof(why), &decision);
        if (st != GRAFT_OK) {
            GRAFT_ERROR(GRAFT_MOD_MEMBERSHIP, "job %s group %" PRIu32 " cannot commit step %" PRIu64
                        ": missing votes not recorded (%s)", m->job, m->cfg.group, q->step,
                        graft_status_string(st));
            goto out;
        }
    }
    *decision_p = decision;
    if (!decision) {
        GRAFT_WARN(GRAFT_MOD_MEMBERSHIP, "job %s group %" PRIu32 " step %" PRIu64 ": commit vote "
                   "failed (%s)", m->job, m->cfg.group, q->step, why);
        if (m->cfg.rank == 0)
            vote_event(m, q, inc, why);
    } else {
        m->novote_run = 0;
        m->novote_skipped = 0;
    }
out:
    graft_free(guess);
    graft_free(seen);
    graft_free(buf);
    return st;
}

graft_status_t graft_membership_voted_since(graft_membership_t *m, uint32_t group,
                                            uint32_t rank, uint64_t round, bool *voted_p)
{
    graft_etcd_range_opts_t ro = {.prefix = true, .keys_only = true};
    graft_etcd_range_result_t res;
    if (m == NULL || voted_p == NULL)
        return GRAFT_EINVAL;
    *voted_p = false;
    char *folder = graft__key_votes_folder(m->prefix, group);
    if (folder == NULL)
        return GRAFT_ENOMEM;
    memset(&res, 0, sizeof(res));
    GRAFT__MSHIP_REQ(m);
    graft_status_t st = graft_etcd_range(m->ops, folder, &ro, &res);
    if (st != GRAFT_OK)
        atomic_fetch_add(&m->n_etcd_errors, 1);
    /* A round's vote keys are deleted once their writer votes in a later
     * one, hence "or later". */
    for (size_t i = 0; st == GRAFT_OK && i < res.n_kvs && !*voted_p; i++) {
        graft__mkey_t k = graft__mship_key_parse(m->prefix, res.kvs[i].key);
        if (k.kind == GRAFT__MKEY_VOTE && k.group == group)
            *voted_p = k.rank == rank && k.number >= round;
    }
    graft_etcd_range_result_clear(&res);
    graft_free(folder);
    return st;
}
