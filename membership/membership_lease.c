/*
 * The handle's lease as every writer of membership sees it: whether the
 * rank may write (joined, not left, its lease not lost), the report of a
 * lost lease, the transaction retried while etcd cannot be reached, the
 * member record, and the waits on the handle's condition variables. The
 * bottom of the handle's files: it calls only the keys, the codecs and the
 * etcd client, so the files above it (membership.c, the view and its
 * repairs, announce, quorum, votes, blobs) never call back and forth.
 */
#include "membership_internal.h"

#include <errno.h>
#include <inttypes.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

/* The handle's condition variable runs on CLOCK_MONOTONIC (see create). */
void graft__mship_deadline(struct timespec *ts, uint64_t wait_ns)
{
    uint64_t t = graft__now_ns() + wait_ns;
    ts->tv_sec = (time_t)(t / 1000000000ull);
    ts->tv_nsec = (long)(t % 1000000000ull);
}

/* Sleep on a condition variable rather than in short slices: hundreds of
 * idle handles in one process must not wake up every few milliseconds. */
void graft__mship_sleep(graft_membership_t *m, uint64_t ns)
{
    struct timespec ts;
    graft__mship_deadline(&ts, ns);
    pthread_mutex_lock(&m->mu);
    while (!atomic_load(&m->stop)) {
        if (pthread_cond_timedwait(&m->stop_cv, &m->mu, &ts) == ETIMEDOUT)
            break;
    }
    pthread_mutex_unlock(&m->mu);
}

void graft__mship_lease_failed(graft_membership_t *m, int64_t lease, graft_status_t why)
{
    pthread_mutex_lock(&m->mu);
    if (!m->joined || m->left || m->lease != lease) {
        pthread_mutex_unlock(&m->mu);
        return;
    }
    uint64_t inc = m->incarnation;
    m->joined = false;
    m->lease_lost_pending = true;
    pthread_cond_broadcast(&m->cv);
    pthread_mutex_unlock(&m->mu);
    atomic_fetch_add(&m->n_lease_losses, 1);
    GRAFT_ERROR(GRAFT_MOD_MEMBERSHIP,
                "job %s group %" PRIu32 " rank %" PRIu32 ": lease %" PRId64
                " lost (incarnation %" PRIu64 "): %s; re-joining as a new incarnation",
                m->job, m->cfg.group, m->cfg.rank, lease, inc, graft_status_string(why));
    if (m->cfg.lease_cb != NULL)
        m->cfg.lease_cb(GRAFT_MEMBERSHIP_LEASE_LOST, inc, why, m->cfg.lease_arg);
}

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
graft_status_t graft__mship_await_joined(graft_membership_t *m, uint64_t deadline_ns,
                                        int64_t *lease_p, uint64_t *inc_p)
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

graft_status_t graft__mship_member_put(graft_membership_t *m, graft_etcd_t *c, int64_t lease,
                                      uint64_t incarnation, graft_member_state_t state,
                                      uint64_t committed_step, uint64_t joined_ms)
{
    graft_member_t mem = {0};
    uint8_t *buf = NULL;
    size_t len = 0;
    char *key = NULL;
    graft_status_t st;
    mem.group = m->cfg.group;
    mem.rank = m->cfg.rank;
    mem.incarnation = incarnation;
    mem.host = m->host;
    mem.pid = (int32_t)getpid();
    mem.transfer_address = m->transfer_address;
    mem.layout_hash = m->cfg.layout_hash;
    mem.committed_step = committed_step;
    mem.state = state;
    mem.lease_id = lease;
    mem.joined_unix_ms = joined_ms;
    st = graft__mship_member_encode(&mem, &buf, &len);
    if (st != GRAFT_OK)
        goto out;
    key = graft__key_member(m->prefix, m->cfg.group, m->cfg.rank);
    if (key == NULL) {
        st = GRAFT_ENOMEM;
        goto out;
    }
    GRAFT__MSHIP_REQ(m);
    st = graft_etcd_put(c, key, buf, len, lease, NULL, NULL);
    if (st != GRAFT_OK)
        atomic_fetch_add(&m->n_etcd_errors, 1);
out:
    graft_free(key);
    graft_free(buf);
    return st;
}

graft_status_t graft_membership_update(graft_membership_t *m, graft_member_state_t state,
                                       uint64_t committed_step)
{
    if (m == NULL || state < GRAFT_MEMBER_JOINING || state > GRAFT_MEMBER_CANNOT_SERVE)
        return GRAFT_EINVAL;
    pthread_mutex_lock(&m->mu);
    if (m->cfg.observer || m->left) {
        pthread_mutex_unlock(&m->mu);
        return GRAFT_ESTATE;
    }
    if (!m->joined) {
        pthread_mutex_unlock(&m->mu);
        return GRAFT_ELEASE;
    }
    m->state = state;
    m->committed_step = committed_step;
    int64_t lease = m->lease;
    uint64_t inc = m->incarnation;
    uint64_t joined_ms = m->joined_unix_ms;
    pthread_mutex_unlock(&m->mu);
    graft_status_t st = graft__mship_member_put(m, m->ops, lease, inc, state, committed_step, joined_ms);
    if (st == GRAFT_ENOTFOUND) {
        graft__mship_lease_failed(m, lease, st);
        st = GRAFT_ELEASE;
    }
    return st;
}
