/*
 * Membership handle: join and leave, the keep-alive thread that renews the
 * rank's lease and re-joins after losing it, and the watch-driven view
 * (members, the quorum, the votes of the rank's own group).
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

#define VIEW_POLL_MS 200u

/* ------------------------------------------------------------- helpers --- */

char *graft__mship_key(const graft_membership_t *m, const char *fmt, ...)
{
    char rest[128];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(rest, sizeof(rest), fmt, ap);
    va_end(ap);
    if (n < 0 || (size_t)n >= sizeof(rest))
        return NULL;
    return graft__asprintf("%s%s", m->prefix, rest);
}

/* The handle's condition variable runs on CLOCK_MONOTONIC (see create). */
void graft__mship_deadline(struct timespec *ts, uint64_t wait_ns)
{
    uint64_t t = graft__now_ns() + wait_ns;
    ts->tv_sec = (time_t)(t / 1000000000ull);
    ts->tv_nsec = (long)(t % 1000000000ull);
}

static bool job_name_ok(const char *job)
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
    char *p = graft__asprintf("/graft/%s/", job);
    if (p == NULL)
        return GRAFT_ENOMEM;
    *prefix_p = p;
    return GRAFT_OK;
}

/* --------------------------------------------------------------- view --- */

static void member_entry_remove(graft__mview_t *v, uint32_t group, uint32_t rank)
{
    for (size_t i = 0; i < v->n_members; i++) {
        if (v->members[i].group == group && v->members[i].rank == rank) {
            graft__mship_member_clear(&v->members[i]);
            memmove(&v->members[i], &v->members[i + 1], (v->n_members - i - 1) * sizeof(*v->members));
            v->n_members--;
            return;
        }
    }
}

/* Takes ownership of *mem's strings on success. */
static graft_status_t member_entry_put(graft__mview_t *v, graft_member_t *mem)
{
    size_t i = 0;
    while (i < v->n_members && (v->members[i].group < mem->group ||
                                (v->members[i].group == mem->group && v->members[i].rank < mem->rank)))
        i++;
    if (i < v->n_members && v->members[i].group == mem->group && v->members[i].rank == mem->rank) {
        graft__mship_member_clear(&v->members[i]);
        v->members[i] = *mem;
        return GRAFT_OK;
    }
    graft_member_t *grown = graft__realloc(v->members, (v->n_members + 1) * sizeof(*grown));
    if (grown == NULL)
        return GRAFT_ENOMEM;
    v->members = grown;
    memmove(&v->members[i + 1], &v->members[i], (v->n_members - i) * sizeof(*v->members));
    v->members[i] = *mem;
    v->n_members++;
    return GRAFT_OK;
}

/* Ready records and votes are small fixed structs: one generic upsert. */
static graft_status_t small_put(void **arr, size_t *n, size_t elem, const void *item,
                                uint32_t group, uint32_t rank, size_t off_group, size_t off_rank)
{
    char *a = *arr;
    for (size_t i = 0; i < *n; i++) {
        uint32_t g, r;
        memcpy(&g, a + i * elem + off_group, sizeof(g));
        memcpy(&r, a + i * elem + off_rank, sizeof(r));
        if (g == group && r == rank) {
            memcpy(a + i * elem, item, elem);
            return GRAFT_OK;
        }
    }
    char *grown = graft__realloc(a, (*n + 1) * elem);
    if (grown == NULL)
        return GRAFT_ENOMEM;
    memcpy(grown + *n * elem, item, elem);
    *arr = grown;
    (*n)++;
    return GRAFT_OK;
}

static void small_remove(void *arr, size_t *n, size_t elem, uint32_t group, uint32_t rank,
                         size_t off_group, size_t off_rank)
{
    char *a = arr;
    for (size_t i = 0; i < *n; i++) {
        uint32_t g, r;
        memcpy(&g, a + i * elem + off_group, sizeof(g));
        memcpy(&r, a + i * elem + off_rank, sizeof(r));
        if (g == group && r == rank) {
            memmove(a + i * elem, a + (i + 1) * elem, (*n - i - 1) * elem);
            (*n)--;
            return;
        }
    }
}

/*
 * The view keeps one vote per (group, rank): the newest round's. Vote keys
 * are per round (votes/<g>/<round>/<rank>), and a rank's vote transaction
 * puts the new round's key and deletes its old one at the same revision, so
 * a put never replaces a newer round and a delete removes the entry only
 * when it is of the deleted key's round.
 */
static graft_status_t vote_entry_put(graft__mview_t *v, const graft__vote_t *x)
{
    for (size_t i = 0; i < v->n_votes; i++) {
        if (v->votes[i].group == x->group && v->votes[i].rank == x->rank) {
            if (v->votes[i].round <= x->round)
                v->votes[i] = *x;
            return GRAFT_OK;
        }
    }
    return small_put((void **)&v->votes, &v->n_votes, sizeof(graft__vote_t), x, x->group,
                     x->rank, offsetof(graft__vote_t, group), offsetof(graft__vote_t, rank));
}

static void vote_entry_remove(graft__mview_t *v, uint32_t group, uint32_t rank, uint64_t round)
{
    for (size_t i = 0; i < v->n_votes; i++) {
        if (v->votes[i].group == group && v->votes[i].rank == rank) {
            if (v->votes[i].round == round)
                small_remove(v->votes, &v->n_votes, sizeof(graft__vote_t), group, rank,
                             offsetof(graft__vote_t, group), offsetof(graft__vote_t, rank));
            return;
        }
    }
}

void graft__mship_view_clear(graft__mview_t *v)
{
    for (size_t i = 0; i < v->n_members; i++)
        graft__mship_member_clear(&v->members[i]);
    graft_free(v->members);
    graft_free(v->votes);
    graft_membership_quorum_free(v->quorum);
    *v = (graft__mview_t){0};
}

static void report_malformed(graft_membership_t *m, graft__mview_t *v, const graft_etcd_kv_t *kv,
                             graft_status_t st)
{
    v->malformed++;
    GRAFT_WARN(GRAFT_MOD_MEMBERSHIP,
               "skipping record %s (mod_revision %" PRId64 ", %zu bytes) of job %s: %s", kv->key,
               kv->mod_revision, kv->value_len, m->job, graft_status_string(st));
}

/* Apply one put or delete to the view. A record that does not decode is
 * reported and treated as absent, never as a crash or a guess. Only
 * GRAFT_ENOMEM is returned; everything else is absorbed here. */
static graft_status_t view_apply(graft_membership_t *m, graft__mview_t *v, bool is_put,
                                 const graft_etcd_kv_t *kv)
{
    graft__mkey_t k = graft__mship_key_parse(m->prefix, kv->key);
    graft_status_t st = GRAFT_OK;
    switch (k.kind) {
    case GRAFT__MKEY_MEMBER: {
        graft_member_t mem;
        v->members_gen++;
        if (!is_put) {
            member_entry_remove(v, k.group, k.rank);
            break;
        }
        st = graft__mship_member_decode(kv->value, kv->value_len, &mem);
        if (st == GRAFT_OK && (mem.group != k.group || mem.rank != k.rank)) {
            graft__mship_member_clear(&mem);
            st = GRAFT_EMALFORMED;
        }
        if (st == GRAFT_OK) {
            st = member_entry_put(v, &mem);
            if (st != GRAFT_OK)
                graft__mship_member_clear(&mem);
            break;
        }
        if (st == GRAFT_ENOMEM)
            break;
        report_malformed(m, v, kv, st);
        member_entry_remove(v, k.group, k.rank);
        st = GRAFT_OK;
        break;
    }
    case GRAFT__MKEY_VOTE: {
        graft__vote_t vote;
        if (!is_put) {
            vote_entry_remove(v, k.group, k.rank, k.number);
            break;
        }
        st = graft__mship_vote_decode(kv->value, kv->value_len, &vote);
        if (st == GRAFT_OK &&
            (vote.group != k.group || vote.rank != k.rank || vote.round != k.number))
            st = GRAFT_EMALFORMED;
        if (st == GRAFT_OK) {
            st = vote_entry_put(v, &vote);
            break;
        }
        if (st == GRAFT_ENOMEM)
            break;
        report_malformed(m, v, kv, st);
        /* The key exists, so nobody can record a vote under it any more:
         * for the round it names, that rank's vote is a no (quorum id 0
         * matches no quorum), as the voting transaction's read counts it. */
        vote = (graft__vote_t){.group = k.group, .rank = k.rank, .round = k.number};
        snprintf(vote.reason, sizeof(vote.reason), "unreadable vote record");
        st = vote_entry_put(v, &vote);
        break;
    }
    case GRAFT__MKEY_QUORUM: {
        /* The mod_revision always follows the key, so the next formation's
         * compare-and-swap can replace even a record that does not decode;
         * the last good record stays as the reference for ids and rounds. */
        v->quorum_mod = is_put ? kv->mod_revision : 0;
        if (!is_put)
            break;
        graft_quorum_t *q = NULL;
        st = graft__mship_quorum_decode(kv->value, kv->value_len, &q);
        if (st == GRAFT_OK) {
            graft_membership_quorum_free(v->quorum);
            v->quorum = q;
            break;
        }
        if (st == GRAFT_ENOMEM)
            break;
        report_malformed(m, v, kv, st);
        st = GRAFT_OK;
        break;
    }
    case GRAFT__MKEY_EVENTSEQ: {
        if (!is_put) {
            v->event_seq = 0;
            v->eventseq_mod = 0;
            break;
        }
        /* An append of this handle may already have taught us a newer one. */
        if (kv->mod_revision < v->eventseq_mod)
            break;
        char *end = NULL;
        errno = 0;
        unsigned long long seq = strtoull((const char *)kv->value, &end, 10);
        v->eventseq_mod = kv->mod_revision;
        if (kv->value_len == 0 || errno != 0 || end != (const char *)kv->value + kv->value_len) {
            report_malformed(m, v, kv, GRAFT_EMALFORMED);
            break;
        }
        v->event_seq = seq;
        break;
    }
    case GRAFT__MKEY_BAD:
        if (is_put)
            report_malformed(m, v, kv, GRAFT_EMALFORMED);
        break;
    case GRAFT__MKEY_READY: /* read on demand, never watched */
    case GRAFT__MKEY_BLOB:
    case GRAFT__MKEY_EVENT:
    case GRAFT__MKEY_OTHER:
        break;
    }
    if (kv->mod_revision > v->revision)
        v->revision = kv->mod_revision;
    return st;
}

/* Drop the records a watch keeps, before re-reading them. */
static void view_clear_owned(graft__mview_t *v, graft__mkey_kind_t owns)
{
    switch (owns) {
    case GRAFT__MKEY_MEMBER:
        for (size_t i = 0; i < v->n_members; i++)
            graft__mship_member_clear(&v->members[i]);
        v->n_members = 0;
        v->members_gen++;
        break;
    case GRAFT__MKEY_VOTE:
        v->n_votes = 0;
        break;
    case GRAFT__MKEY_QUORUM:
        /* Keep the last good quorum even if the key now holds garbage or
         * was deleted: ids and rounds must never go backwards. */
        v->quorum_mod = 0;
        break;
    default:
        break;
    }
}

/* Read a watch's prefix and replace its part of the view. Used at creation
 * and after the watch reports a compacted revision. */
static graft_status_t view_resync(graft_membership_t *m, graft__mwatch_t *w, int64_t *revision_p)
{
    graft_etcd_range_result_t res = {0};
    graft_etcd_range_opts_t opts = {0};
    graft_status_t st;
    opts.prefix = true;
    GRAFT__MSHIP_REQ(m);
    st = graft_etcd_range(m->ops, w->prefix, &opts, &res);
    if (st != GRAFT_OK) {
        atomic_fetch_add(&m->n_etcd_errors, 1);
        return st;
    }
    pthread_mutex_lock(&m->mu);
    view_clear_owned(&m->view, w->owns);
    for (size_t i = 0; i < res.n_kvs && st == GRAFT_OK; i++)
        st = view_apply(m, &m->view, true, &res.kvs[i]);
    if (res.revision > m->view.revision)
        m->view.revision = res.revision;
    m->view.version++;
    pthread_cond_broadcast(&m->cv);
    pthread_mutex_unlock(&m->mu);
    if (st == GRAFT_OK)
        *revision_p = res.revision;
    graft_etcd_range_result_clear(&res);
    return st;
}

static void view_apply_events(graft_membership_t *m, const graft_etcd_event_t *evs, size_t n)
{
    pthread_mutex_lock(&m->mu);
    for (size_t i = 0; i < n; i++) {
        graft_status_t st = view_apply(m, &m->view, evs[i].type == GRAFT_ETCD_EVENT_PUT, &evs[i].kv);
        if (st != GRAFT_OK)
            GRAFT_ERROR(GRAFT_MOD_MEMBERSHIP, "view of job %s: cannot apply %s: %s", m->job,
                        evs[i].kv.key, graft_status_string(st));
    }
    m->view.version++;
    pthread_cond_broadcast(&m->cv);
    pthread_mutex_unlock(&m->mu);
    atomic_fetch_add(&m->n_watch_events, n);
}

/* Sleep on a condition variable rather than in short slices: hundreds of
 * idle handles in one process must not wake up every few milliseconds. */
static void sleep_unless_stopped(graft_membership_t *m, uint64_t ns)
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

static void *watch_main(void *arg)
{
    graft__mwatch_t *w = arg;
    graft_membership_t *m = w->m;
    bool outage = false;
    bool need_resync = false;
    while (!atomic_load(&m->stop)) {
        graft_status_t st;
        if (need_resync) {
            int64_t rev = 0;
            st = view_resync(m, w, &rev);
            if (st == GRAFT_OK)
                st = graft_etcd_watch_restart(w->w, rev + 1);
            if (st == GRAFT_OK) {
                need_resync = false;
                pthread_mutex_lock(&m->mu);
                m->view.resyncs++;
                pthread_mutex_unlock(&m->mu);
                GRAFT_INFO(GRAFT_MOD_MEMBERSHIP, "view %s resynced at revision %" PRId64, w->prefix,
                           rev);
            } else {
                sleep_unless_stopped(m, 100000000ull);
            }
            continue;
        }
        graft_etcd_event_t *evs = NULL;
        size_t n = 0;
        st = graft_etcd_watch_next(w->w, VIEW_POLL_MS, &evs, &n);
        if (st == GRAFT_OK) {
            if (outage)
                GRAFT_INFO(GRAFT_MOD_MEMBERSHIP, "view %s: etcd reachable again", w->prefix);
            outage = false;
            if (n > 0)
                view_apply_events(m, evs, n);
            graft_etcd_events_free(evs, n);
            continue;
        }
        graft_etcd_events_free(evs, n);
        if (st == GRAFT_ECOMPACTED) {
            GRAFT_INFO(GRAFT_MOD_MEMBERSHIP, "view %s: watch revision compacted (at %" PRId64
                       "); resyncing", w->prefix, graft_etcd_watch_compact_revision(w->w));
            need_resync = true;
            continue;
        }
        if (!outage)
            GRAFT_WARN(GRAFT_MOD_MEMBERSHIP, "view %s: watch failed: %s; retrying", w->prefix,
                       graft_status_string(st));
        outage = true;
        atomic_fetch_add(&m->n_etcd_errors, 1);
        sleep_unless_stopped(m, 100000000ull);
    }
    return NULL;
}

/* Read a watch's prefix, then follow it from the next revision. */
static graft_status_t watch_open(graft_membership_t *m, char *prefix, graft__mkey_kind_t owns)
{
    graft__mwatch_t *w = &m->watches[m->n_watches];
    int64_t rev = 0;
    graft_status_t st;
    if (prefix == NULL)
        return GRAFT_ENOMEM;
    w->m = m;
    w->prefix = prefix;
    w->owns = owns;
    m->n_watches++;
    st = view_resync(m, w, &rev);
    if (st == GRAFT_OK) {
        GRAFT__MSHIP_REQ(m);
        st = graft_etcd_watch_create(m->ops, prefix, rev + 1, &w->w);
    }
    if (st != GRAFT_OK)
        GRAFT_ERROR(GRAFT_MOD_MEMBERSHIP, "job %s: cannot read or watch %s: %s", m->job, prefix,
                    graft_status_string(st));
    return st;
}

/* ----------------------------------------------------------- join/lease --- */

static graft_status_t put_member_record(graft_membership_t *m, graft_etcd_t *c, int64_t lease,
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
    key = graft__mship_key(m, "members/%" PRIu32 "/%" PRIu32, m->cfg.group, m->cfg.rank);
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

/* Grant a lease and write the member record on it, as a new incarnation. A
 * record left by an earlier process of the same rank is overwritten: the
 * replacement must be able to join before the old lease expires. */
static graft_status_t join_once(graft_membership_t *m, graft_etcd_t *c)
{
    int64_t lease = 0;
    graft_status_t st;
    GRAFT__MSHIP_REQ(m);
    uint64_t sent = graft__now_ns();
    st = graft_etcd_lease_grant(c, m->cfg.lease_ttl_s, &lease, NULL);
    if (st != GRAFT_OK) {
        atomic_fetch_add(&m->n_etcd_errors, 1);
        return st;
    }
    pthread_mutex_lock(&m->mu);
    /* Incarnations grow across processes (wall clock) and within one. */
    uint64_t inc = GRAFT_MAX(m->incarnation + 1, graft__wall_ns() / 1000u);
    graft_member_state_t state = m->state;
    uint64_t committed = m->committed_step;
    pthread_mutex_unlock(&m->mu);
    uint64_t joined_ms = graft__wall_ns() / 1000000u;
    st = put_member_record(m, c, lease, inc, state, committed, joined_ms);
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
        sleep_unless_stopped(m, backoff);
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
        sleep_unless_stopped(m, outage ? ttl_ns / 10 : ttl_ns / 3);
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

static graft_status_t make_client(const graft_etcd_config_t *base, uint32_t timeout_ms,
                                  uint32_t retries, graft_etcd_t **etcd_p)
{
    graft_etcd_config_t c = *base;
    if (timeout_ms != 0)
        c.request_timeout_ms = timeout_ms;
    c.max_retries = retries;
    return graft_etcd_create(&c, etcd_p);
}

static graft_status_t check_config(const graft_membership_config_t *c)
{
    if (c == NULL || c->etcd == NULL || !job_name_ok(c->job)) {
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
    if (c->state > GRAFT_MEMBER_LEAVING) {
        GRAFT_ERROR(GRAFT_MOD_MEMBERSHIP, "membership config: unknown state %d", (int)c->state);
        return GRAFT_EINVAL;
    }
    return GRAFT_OK;
}

graft_status_t graft_membership_create(const graft_membership_config_t *config,
                                       graft_membership_t **m_p)
{
    graft_status_t st = check_config(config);
    graft_membership_t *m = NULL;
    char hostbuf[256];
    if (st != GRAFT_OK || m_p == NULL)
        return GRAFT_EINVAL;
    m = graft__calloc(1, sizeof(*m));
    if (m == NULL)
        return GRAFT_ENOMEM;
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
    if (m->job == NULL || m->host == NULL || m->transfer_address == NULL || m->prefix == NULL) {
        st = GRAFT_ENOMEM;
        goto out_free;
    }
    m->cfg.job = m->job;
    m->cfg.host = m->host;
    m->cfg.transfer_address = m->transfer_address;
    m->cfg.etcd = NULL; /* not kept: the caller's config may go away */
    m->state = m->cfg.state;
    m->committed_step = m->cfg.committed_step;
    atomic_init(&m->stop, false);

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
        st = GRAFT_ESYS;
        goto out_free;
    }
    pthread_mutex_init(&m->mu, NULL);
    m->mu_init = true;

    st = make_client(config->etcd, 0, config->etcd->max_retries, &m->ops);
    if (st != GRAFT_OK)
        goto out_free;
    /* Renewals must finish well inside TTL/3, and retrying one is pointless:
     * the next renewal comes soon anyway. Against a black-holed etcd each
     * retry would cost another connect timeout and push the detection of a
     * lost lease past the TTL. (0 would mean the default of 3 retries.) */
    st = make_client(config->etcd, GRAFT_MAX(200u, m->cfg.lease_ttl_s * 1000u / 3u),
                     GRAFT_ETCD_NO_RETRIES, &m->ka);
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
    st = watch_open(m, graft__mship_key(m, "members/"), GRAFT__MKEY_MEMBER);
    if (st == GRAFT_OK)
        st = watch_open(m, graft__mship_key(m, "quorum"), GRAFT__MKEY_QUORUM);
    /* With one rank per group the voting transaction reads back the only
     * vote there is, so nobody needs the watch's echo of it: one watch
     * stream and one event per group and step less for etcd to serve. */
    if (st == GRAFT_OK && !m->cfg.observer && m->cfg.ranks_per_group > 1)
        st = watch_open(m, graft__mship_key(m, "votes/%" PRIu32 "/", m->cfg.group),
                        GRAFT__MKEY_VOTE);
    if (st != GRAFT_OK)
        goto out_free;
    for (size_t i = 0; i < m->n_watches; i++) {
        if (pthread_create(&m->watches[i].thread, NULL, watch_main, &m->watches[i]) != 0) {
            GRAFT_ERROR(GRAFT_MOD_MEMBERSHIP, "pthread_create: %s", strerror(errno));
            st = GRAFT_ESYS;
            goto out_free;
        }
        m->watches[i].started = true;
    }
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
    for (size_t i = 0; i < m->n_watches; i++)
        if (m->watches[i].started)
            pthread_join(m->watches[i].thread, NULL);
    if (m->mu_init && !m->cfg.observer) {
        pthread_mutex_lock(&m->mu);
        bool joined = m->joined && !m->left;
        pthread_mutex_unlock(&m->mu);
        if (joined && graft_membership_leave(m) != GRAFT_OK)
            GRAFT_DEBUG(GRAFT_MOD_MEMBERSHIP, "leave on destroy failed");
    }
    for (size_t i = 0; i < m->n_watches; i++) {
        graft_etcd_watch_destroy(m->watches[i].w);
        graft_free(m->watches[i].prefix);
    }
    graft_etcd_destroy(m->ka);
    graft_etcd_destroy(m->ops);
    graft__mship_view_clear(&m->view);
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

graft_status_t graft_membership_update(graft_membership_t *m, graft_member_state_t state,
                                       uint64_t committed_step)
{
    if (m == NULL || state < GRAFT_MEMBER_JOINING || state > GRAFT_MEMBER_LEAVING)
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
    graft_status_t st = put_member_record(m, m->ops, lease, inc, state, committed_step, joined_ms);
    if (st == GRAFT_ENOTFOUND) {
        graft__mship_lease_failed(m, lease, st);
        st = GRAFT_ELEASE;
    }
    return st;
}

/* ------------------------------------------------------------ view API --- */

graft_status_t graft_membership_view_get(graft_membership_t *m, graft_membership_view_t **view_p)
{
    graft_status_t st = GRAFT_OK;
    if (m == NULL || view_p == NULL)
        return GRAFT_EINVAL;
    graft_membership_view_t *out = graft__calloc(1, sizeof(*out));
    if (out == NULL)
        return GRAFT_ENOMEM;
    uint32_t R = m->cfg.ranks_per_group;
    pthread_mutex_lock(&m->mu);
    const graft__mview_t *v = &m->view;
    out->version = v->version;
    out->revision = v->revision;
    out->malformed = v->malformed;
    out->resyncs = v->resyncs;
    if (v->n_members > 0) {
        out->members = graft__calloc(v->n_members, sizeof(*out->members));
        out->healthy_groups = graft__calloc(v->n_members, sizeof(*out->healthy_groups));
        if (out->members == NULL || out->healthy_groups == NULL) {
            st = GRAFT_ENOMEM;
            goto unlock;
        }
    }
    for (size_t i = 0; i < v->n_members; i++) {
        st = graft__mship_member_copy(&v->members[i], &out->members[i]);
        if (st != GRAFT_OK)
            goto unlock;
        out->n_members = i + 1;
    }
    /* members are sorted by (group, rank) and unique per key */
    for (size_t i = 0; i < v->n_members;) {
        size_t j = i, live = 0;
        while (j < v->n_members && v->members[j].group == v->members[i].group) {
            if (v->members[j].rank < R)
                live++;
            j++;
        }
        if (live == R)
            out->healthy_groups[out->n_healthy_groups++] = v->members[i].group;
        i = j;
    }
unlock:
    pthread_mutex_unlock(&m->mu);
    if (st != GRAFT_OK) {
        graft_membership_view_free(out);
        return st;
    }
    *view_p = out;
    return GRAFT_OK;
}

void graft_membership_view_free(graft_membership_view_t *view)
{
    if (view == NULL)
        return;
    for (size_t i = 0; i < view->n_members; i++)
        graft__mship_member_clear(&view->members[i]);
    graft_free(view->members);
    graft_free(view->healthy_groups);
    graft_free(view);
}

graft_status_t graft_membership_view_wait(graft_membership_t *m, uint64_t after_version,
                                          uint32_t timeout_ms, uint64_t *version_p)
{
    if (m == NULL)
        return GRAFT_EINVAL;
    struct timespec ts;
    graft__mship_deadline(&ts, (uint64_t)timeout_ms * 1000000ull);
    graft_status_t st = GRAFT_OK;
    pthread_mutex_lock(&m->mu);
    while (m->view.version <= after_version) {
        if (pthread_cond_timedwait(&m->cv, &m->mu, &ts) == ETIMEDOUT) {
            st = m->view.version > after_version ? GRAFT_OK : GRAFT_ETIMEOUT;
            break;
        }
    }
    if (version_p != NULL)
        *version_p = m->view.version;
    pthread_mutex_unlock(&m->mu);
    return st;
}

bool graft_membership_group_healthy(graft_membership_t *m, uint32_t group)
{
    size_t live = 0;
    pthread_mutex_lock(&m->mu);
    for (size_t i = 0; i < m->view.n_members; i++)
        if (m->view.members[i].group == group && m->view.members[i].rank < m->cfg.ranks_per_group)
            live++;
    pthread_mutex_unlock(&m->mu);
    return live == m->cfg.ranks_per_group;
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
    pthread_mutex_lock(&m->mu);
    s.malformed = m->view.malformed;
    pthread_mutex_unlock(&m->mu);
    *stats_p = s;
}
