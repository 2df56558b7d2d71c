/*
 * Membership handle: join and leave, and the keep-alive thread that renews
 * the rank's lease and re-joins after losing it. The watch-driven view is
 * in membership_view.c.
 *
 * Two etcd clients per handle: the keep-alive thread has its own, with short
 * timeouts, so a slow request of the training thread never delays a renewal
 * past the TTL.
 */
#include "membership_internal.h"

#include <errno.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

/* ------------------------------------------------------------- helpers --- */

bool graft__mship_name_ok(const char *job)
{
    if (job == NULL || job[0] == '\0' || strlen(job) > 64)
        return false;
    for (const char *p = job; *p != '\0'; p++) {
        char c = *p;
        bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                  c == '_' || c == '-' || c == '.';
        if (!ok)
            return false;
    }
    return true;
}

graft_status_t graft_membership_job_prefix(const char *job, char **prefix_p)
{
    if (job == NULL || job[0] == '\0' || prefix_p == NULL)
        return GRAFT_EINVAL;
    char *p = graft__key_job_prefix(job);
    if (p == NULL)
        return GRAFT_ENOMEM;
    *prefix_p = p;
    return GRAFT_OK;
}

/* ----------------------------------------------------------- join/lease --- */

/* Grant a lease and write the member record on it, as a new incarnation. A
 * record left by an earlier process of the same rank is overwritten: the
 * replacement must be able to join before the old lease expires. */
static graft_status_t join_once(graft_membership_t *m, graft_etcd_t *c)
{
    int64_t lease = 0;
    graft_status_t st;
    uint64_t sent = graft__now_ns();
    /* A promoted spare joins once on the lease and incarnation its slot's
     * record already has (membership_spare.c); later joins grant anew. */
    bool adopt = m->cfg.adopt_lease != 0;
    if (adopt) {
        lease = m->cfg.adopt_lease;
        m->cfg.adopt_lease = 0;
    } else {
        GRAFT__MSHIP_REQ(m);
        st = graft_etcd_lease_grant(c, m->cfg.lease_ttl_s, &lease, NULL);
        if (st != GRAFT_OK) {
            atomic_fetch_add(&m->n_etcd_errors, 1);
            return st;
        }
    }
    pthread_mutex_lock(&m->mu);
    /* Incarnations grow across processes (wall clock) and within one. */
    uint64_t inc = adopt ? m->cfg.adopt_incarnation
                         : GRAFT_MAX(m->incarnation + 1, graft__wall_ns() / 1000u);
    graft_member_state_t state = m->state;
    uint64_t committed = m->committed_step;
    pthread_mutex_unlock(&m->mu);
    uint64_t joined_ms = graft__wall_ns() / 1000000u;
    st = graft__mship_member_put(m, c, lease, inc, state, committed, joined_ms);
    if (st != GRAFT_OK) {
        GRAFT__MSHIP_REQ(m);
        if (graft_etcd_lease_revoke(c, lease) != GRAFT_OK)
            GRAFT_DEBUG(GRAFT_MOD_MEMBERSHIP, "revoking unused lease %" PRId64 " failed", lease);
        return st;
    }
    pthread_mutex_lock(&m->mu);
    m->lease = lease;
    m->incarnation = inc;
    m->joined_unix_ms = joined_ms;
    m->joined = true;
    atomic_store(&m->lease_renewed_ns, sent);
    pthread_cond_broadcast(&m->cv);
    pthread_mutex_unlock(&m->mu);
    return GRAFT_OK;
}

static void append_simple_event(graft_membership_t *m, graft_event_kind_t kind, uint64_t inc,
                                const char *detail)
{
    graft_event_t ev = {0};
    ev.kind = kind;
    ev.group = m->cfg.group;
    ev.rank = m->cfg.rank;
    ev.incarnation = inc;
    ev.detail = (char *)detail;
    if (graft__mship_event_put(m, &ev) != GRAFT_OK)
        GRAFT_DEBUG(GRAFT_MOD_MEMBERSHIP, "event %s not recorded", graft_event_kind_string(kind));
}

static void rejoin(graft_membership_t *m)
{
    uint64_t backoff = 50000000ull;
    uint64_t old_inc;
    pthread_mutex_lock(&m->mu);
    old_inc = m->incarnation;
    pthread_mutex_unlock(&m->mu);
    while (!atomic_load(&m->stop)) {
        pthread_mutex_lock(&m->mu);
        bool left = m->left;
        pthread_mutex_unlock(&m->mu);
        if (left)
            return;
        graft_status_t st = join_once(m, m->ka);
        if (st == GRAFT_OK)
            break;
        GRAFT_DEBUG(GRAFT_MOD_MEMBERSHIP, "re-join failed: %s", graft_status_string(st));
        graft__mship_sleep(m, graft__jitter_ns(backoff));
        backoff = GRAFT_MIN(backoff * 2, 1000000000ull);
    }
    if (atomic_load(&m->stop))
        return;
    pthread_mutex_lock(&m->mu);
    uint64_t inc = m->incarnation;
    pthread_mutex_unlock(&m->mu);
    GRAFT_WARN(GRAFT_MOD_MEMBERSHIP, "job %s group %" PRIu32 " rank %" PRIu32
               ": re-joined as incarnation %" PRIu64, m->job, m->cfg.group, m->cfg.rank, inc);
    char detail[96];
    snprintf(detail, sizeof(detail), "lost incarnation %" PRIu64, old_inc);
    append_simple_event(m, GRAFT_EVENT_LEASE_LOST, old_inc, detail);
    append_simple_event(m, GRAFT_EVENT_JOIN, inc, "re-join");
    if (m->cfg.lease_cb != NULL)
        m->cfg.lease_cb(GRAFT_MEMBERSHIP_REJOINED, inc, GRAFT_OK, m->cfg.lease_arg);
}

static void *keepalive_main(void *arg)
{
    graft_membership_t *m = arg;
    uint64_t ttl_ns = (uint64_t)m->cfg.lease_ttl_s * 1000000000ull;
    uint64_t last_ok = graft__now_ns();
    bool outage = false, suspect = false;
    while (!atomic_load(&m->stop)) {
        graft__mship_sleep(m, outage ? ttl_ns / 10 : ttl_ns / 3);
        if (atomic_load(&m->stop))
            break;
        pthread_mutex_lock(&m->mu);
        bool active = m->joined && !m->left;
        bool lost = !m->joined && !m->left;
        int64_t lease = m->lease;
        pthread_mutex_unlock(&m->mu);
        if (lost) {
            /* The training thread found the lease gone first. */
            rejoin(m);
            last_ok = graft__now_ns();
            outage = false;
            suspect = false;
            continue;
        }
        if (!active)
            continue;
        atomic_fetch_add(&m->n_keepalives, 1);
        uint64_t sent = graft__now_ns();
        graft_status_t st = graft_etcd_lease_keepalive(m->ka, lease, NULL);
        if (st == GRAFT_OK) {
            atomic_store(&m->lease_renewed_ns, sent);
            if (outage)
                GRAFT_INFO(GRAFT_MOD_MEMBERSHIP, "job %s: lease %" PRId64 " renewed again%s",
                           m->job, lease, suspect ? " (it had outlived the TTL without a renewal)" : "");
            outage = false;
            suspect = false;
            last_ok = graft__now_ns();
            continue;
        }
        atomic_fetch_add(&m->n_etcd_errors, 1);
        /* etcd says the lease is gone: re-join. */
        if (st == GRAFT_ENOTFOUND) {
            graft__mship_lease_failed(m, lease, st);
            rejoin(m);
            last_ok = graft__now_ns();
            outage = false;
            suspect = false;
            continue;
        }
        /* No answer. Past the TTL the lease may be gone, or not: an etcd
         * that is slow, or restarting (leases outlive a restart), has not
         * let it go. Either way this rank already stops committing
         * (graft_membership_health(): not fresh), and a write on a lease
         * that is gone fails and reports the loss. So it keeps asking
         * until etcd answers instead of re-joining on a guess: every
         * re-join is a grant, a record and a revoke that every view
         * follows, and at a slow etcd they made it slower, leases of the
         * others lapsed in turn, and a 16 x 2 job stalled for minutes. */
        if (!outage)
            GRAFT_WARN(GRAFT_MOD_MEMBERSHIP, "job %s: cannot renew lease %" PRId64 ": %s; retrying",
                       m->job, lease, graft_status_string(st));
        if (!suspect && graft__now_ns() - last_ok > ttl_ns) {
            GRAFT_WARN(GRAFT_MOD_MEMBERSHIP, "job %s group %" PRIu32 " rank %" PRIu32 ": lease %"
                       PRId64 " not renewed for a TTL; not committing until etcd answers whether "
                       "it lives", m->job, m->cfg.group, m->cfg.rank, lease);
            suspect = true;
        }
        outage = true;
    }
    return NULL;
}

/* ---------------------------------------------------------- life cycle --- */

/* The handle's clients share one view of etcd (slow or not) and its
 * counters, with the caller's clients too when its configuration names
 * one (share_load); each has its own share of the budget while etcd is
 * slow (docs/ETCD.md, "When etcd is slow"). */
static graft_status_t make_client(const graft_etcd_config_t *base, graft_etcd_t *share,
                                  uint32_t timeout_ms, uint32_t retries,
                                  graft_etcd_priority_t priority, graft_etcd_t **etcd_p)
{
    graft_etcd_config_t c = *base;
    if (timeout_ms != 0)
        c.request_timeout_ms = timeout_ms;
    c.max_retries = retries;
    c.priority = priority;
    if (share != NULL)
        c.share_load = share;
    return graft_etcd_create(&c, etcd_p);
}

static graft_status_t check_config(const graft_membership_config_t *c)
{
    if (c == NULL || c->etcd == NULL || !graft__mship_name_ok(c->job)) {
        GRAFT_ERROR(GRAFT_MOD_MEMBERSHIP, "membership config: job must be [A-Za-z0-9_.-]{1,64} and "
                                          "etcd must be set");
        return GRAFT_EINVAL;
    }
    uint32_t R = c->ranks_per_group == 0 ? 1 : c->ranks_per_group;
    if (!c->observer && c->rank >= R) {
        GRAFT_ERROR(GRAFT_MOD_MEMBERSHIP, "membership config: rank %" PRIu32
                    " outside ranks_per_group %" PRIu32, c->rank, R);
        return GRAFT_EINVAL;
    }
    if (c->state > GRAFT_MEMBER_CANNOT_SERVE) {
        GRAFT_ERROR(GRAFT_MOD_MEMBERSHIP, "membership config: unknown state %d", (int)c->state);
        return GRAFT_EINVAL;
    }
    return GRAFT_OK;
}

/* The handle's configuration with its defaults, and owned copies of its
 * strings (the caller's config may go away). */
static graft_status_t config_take(graft_membership_t *m, const graft_membership_config_t *config)
{
    char hostbuf[256];
    m->cfg = *config;
    if (m->cfg.ranks_per_group == 0)
        m->cfg.ranks_per_group = 1;
    if (m->cfg.min_groups == 0)
        m->cfg.min_groups = 1;
    if (m->cfg.lease_ttl_s == 0)
        m->cfg.lease_ttl_s = 5;
    if (m->cfg.join_timeout_ms == 0)
        m->cfg.join_timeout_ms = 3000;
    if (m->cfg.event_history == 0)
        m->cfg.event_history = 1000;
    if (m->cfg.state == GRAFT_MEMBER_UNSPECIFIED)
        m->cfg.state = GRAFT_MEMBER_JOINING;
    if (config->host == NULL && gethostname(hostbuf, sizeof(hostbuf)) != 0)
        snprintf(hostbuf, sizeof(hostbuf), "unknown");
    hostbuf[sizeof(hostbuf) - 1] = '\0';
    m->job = graft__strdup(config->job);
    m->host = graft__strdup(config->host != NULL ? config->host : hostbuf);
    m->transfer_address = graft__strdup(config->transfer_address != NULL ? config->transfer_address : "");
    if (graft_membership_job_prefix(config->job, &m->prefix) != GRAFT_OK)
        m->prefix = NULL; /* the name was checked above: out of memory */
    if (m->job == NULL || m->host == NULL || m->transfer_address == NULL || m->prefix == NULL)
        return GRAFT_ENOMEM;
    m->cfg.job = m->job;
    m->cfg.host = m->host;
    m->cfg.transfer_address = m->transfer_address;
    m->cfg.etcd = NULL; /* not kept: the caller's config may go away */
    m->state = m->cfg.state;
    m->committed_step = m->cfg.committed_step;
    return GRAFT_OK;
}

/* The handle's mutex and condition variables (on CLOCK_MONOTONIC). */
static graft_status_t sync_init(graft_membership_t *m)
{
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    int rc = pthread_cond_init(&m->cv, &ca);
    if (rc == 0) {
        rc = pthread_cond_init(&m->stop_cv, &ca);
        if (rc != 0)
            pthread_cond_destroy(&m->cv);
    }
    pthread_condattr_destroy(&ca);
    if (rc != 0) {
        GRAFT_ERROR(GRAFT_MOD_MEMBERSHIP, "pthread_cond_init: %s", strerror(rc));
        return GRAFT_ESYS;
    }
    pthread_mutex_init(&m->mu, NULL);
    m->mu_init = true;
    return GRAFT_OK;
}

/* The handle's three etcd clients: requests, best-effort events and the
 * keep-alive's. */
static graft_status_t clients_open(graft_membership_t *m, const graft_etcd_config_t *etcd)
{
    graft_status_t st = make_client(etcd, NULL, 0, etcd->max_retries,
                                    GRAFT_ETCD_PRIORITY_ESSENTIAL, &m->ops);
    if (st != GRAFT_OK)
        return st;
    /* Event records: one try, and none while etcd is slow. */
    st = make_client(etcd, m->ops, 0, GRAFT_ETCD_NO_RETRIES, GRAFT_ETCD_PRIORITY_BEST_EFFORT,
                     &m->bg);
    if (st != GRAFT_OK)
        return st;
    /* Renewals must finish well inside TTL/3, and retrying one is pointless:
     * the next renewal comes soon anyway. Against a black-holed etcd each
     * retry would cost another connect timeout and push the detection of a
     * lost lease past the TTL. (0 would mean the default of 3 retries.) */
    return make_client(etcd, m->ops, GRAFT_MAX(200u, m->cfg.lease_ttl_s * 1000u / 3u),
                       GRAFT_ETCD_NO_RETRIES, GRAFT_ETCD_PRIORITY_ESSENTIAL, &m->ka);
}

graft_status_t graft_membership_create(const graft_membership_config_t *config,
                                       graft_membership_t **m_p)
{
    graft_status_t st = check_config(config);
    graft_membership_t *m = NULL;
    if (st != GRAFT_OK || m_p == NULL)
        return GRAFT_EINVAL;
    m = graft__calloc(1, sizeof(*m));
    if (m == NULL)
        return GRAFT_ENOMEM;
    atomic_init(&m->stop, false);
    st = config_take(m, config);
    if (st == GRAFT_OK)
        st = sync_init(m);
    if (st == GRAFT_OK)
        st = clients_open(m, config->etcd);
    if (st != GRAFT_OK)
        goto out_free;
    if (!m->cfg.observer) {
        st = join_once(m, m->ops);
        if (st != GRAFT_OK) {
            GRAFT_ERROR(GRAFT_MOD_MEMBERSHIP, "job %s group %" PRIu32 " rank %" PRIu32
                        ": cannot join: %s", m->job, m->cfg.group, m->cfg.rank,
                        graft_status_string(st));
            goto out_free;
        }
    }
    st = graft__mship_view_open(m);
    if (st != GRAFT_OK)
        goto out_free;
    if (!m->cfg.observer) {
        if (pthread_create(&m->ka_thread, NULL, keepalive_main, m) != 0) {
            GRAFT_ERROR(GRAFT_MOD_MEMBERSHIP, "pthread_create: %s", strerror(errno));
            st = GRAFT_ESYS;
            goto out_free;
        }
        m->ka_started = true;
        append_simple_event(m, GRAFT_EVENT_JOIN, m->incarnation, "join");
    }
    *m_p = m;
    return GRAFT_OK;
out_free:
    graft_membership_destroy(m);
    return st;
}

graft_status_t graft_membership_leave(graft_membership_t *m)
{
    if (m == NULL)
        return GRAFT_EINVAL;
    pthread_mutex_lock(&m->mu);
    if (m->cfg.observer || m->left) {
        pthread_mutex_unlock(&m->mu);
        return GRAFT_ESTATE;
    }
    bool joined = m->joined;
    int64_t lease = m->lease;
    uint64_t inc = m->incarnation;
    m->left = true;
    m->joined = false;
    pthread_cond_broadcast(&m->cv);
    pthread_mutex_unlock(&m->mu);
    if (!joined)
        return GRAFT_OK; /* the lease is already gone */
    append_simple_event(m, GRAFT_EVENT_LEAVE, inc, "leave");
    GRAFT__MSHIP_REQ(m);
    graft_status_t st = graft_etcd_lease_revoke(m->ops, lease);
    if (st == GRAFT_ENOTFOUND)
        st = GRAFT_OK;
    if (st != GRAFT_OK)
        GRAFT_WARN(GRAFT_MOD_MEMBERSHIP, "job %s: revoking lease %" PRId64 " on leave failed: %s; "
                   "it expires within its TTL", m->job, lease, graft_status_string(st));
    return st;
}

void graft_membership_destroy(graft_membership_t *m)
{
    if (m == NULL)
        return;
    atomic_store(&m->stop, true);
    if (m->mu_init) {
        pthread_mutex_lock(&m->mu);
        pthread_cond_broadcast(&m->stop_cv);
        pthread_mutex_unlock(&m->mu);
    }
    if (m->ka_started)
        pthread_join(m->ka_thread, NULL);
    graft__mship_view_stop(m);
    if (m->mu_init && !m->cfg.observer) {
        pthread_mutex_lock(&m->mu);
        bool joined = m->joined && !m->left;
        pthread_mutex_unlock(&m->mu);
        if (joined && graft_membership_leave(m) != GRAFT_OK)
            GRAFT_DEBUG(GRAFT_MOD_MEMBERSHIP, "leave on destroy failed");
    }
    graft__mship_view_close(m);
    graft_etcd_destroy(m->ka);
    graft_etcd_destroy(m->bg);
    graft_etcd_destroy(m->ops);
    graft_free(m->proxy_ranks);
    if (m->mu_init) {
        pthread_cond_destroy(&m->stop_cv);
        pthread_cond_destroy(&m->cv);
        pthread_mutex_destroy(&m->mu);
    }
    graft_free(m->prefix);
    graft_free(m->transfer_address);
    graft_free(m->host);
    graft_free(m->job);
    graft_free(m);
}

uint64_t graft_membership_incarnation(graft_membership_t *m)
{
    pthread_mutex_lock(&m->mu);
    uint64_t inc = m->cfg.observer ? 0 : m->incarnation;
    pthread_mutex_unlock(&m->mu);
    return inc;
}

void graft_membership_stats_get(graft_membership_t *m, graft_membership_stats_t *stats_p)
{
    graft_membership_stats_t s = {0};
    s.requests = atomic_load(&m->n_requests);
    s.keepalives = atomic_load(&m->n_keepalives);
    s.watch_events = atomic_load(&m->n_watch_events);
    s.lease_losses = atomic_load(&m->n_lease_losses);
    s.quorum_txns = atomic_load(&m->n_quorum_txns);
    s.quorum_conflicts = atomic_load(&m->n_quorum_conflicts);
    s.quorum_fast = atomic_load(&m->n_quorum_fast);
    s.etcd_errors = atomic_load(&m->n_etcd_errors);
    s.bytes_read = graft_etcd_bytes_read(m->ops);
    graft_etcd_stats_t es;
    graft_etcd_stats_get(m->ops, &es);
    s.etcd_sent = es.requests;
    s.etcd_retries = es.retries;
    s.etcd_shed = es.shed;
    pthread_mutex_lock(&m->mu);
    s.malformed = m->view.malformed;
    pthread_mutex_unlock(&m->mu);
    *stats_p = s;
}

void graft_membership_min_groups_set(graft_membership_t *m, uint32_t min_groups)
{
    if (m == NULL)
        return;
    pthread_mutex_lock(&m->mu);
    m->cfg.min_groups = min_groups == 0 ? 1 : min_groups;
    pthread_mutex_unlock(&m->mu);
}
