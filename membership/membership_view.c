/*
 * The view: what a handle knows of its job, kept by watches on etcd (the
 * members, the latest quorum, the votes of the rank's own group), each with
 * its own thread, and read by the rest of the module under the handle's
 * mutex. A record that does not decode is reported and treated as absent;
 * a watch whose revision was compacted reads its prefix again.
 */
#include "membership_internal.h"

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define VIEW_POLL_MS 200u

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

static void view_clear(graft__mview_t *v)
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

static graft_status_t apply_member(graft_membership_t *m, graft__mview_t *v, bool is_put,
                                   const graft_etcd_kv_t *kv, graft__mkey_t k)
{
    graft_member_t mem;
    v->members_gen++;
    if (k.group == m->cfg.group && k.rank == m->cfg.rank)
        v->own_member_bad_mod = 0; /* set again below if this one is bad too */
    if (!is_put) {
        member_entry_remove(v, k.group, k.rank);
        return GRAFT_OK;
    }
    graft_status_t st = graft__mship_member_decode(kv->value, kv->value_len, &mem);
    if (st == GRAFT_OK && (mem.group != k.group || mem.rank != k.rank)) {
        graft__mship_member_clear(&mem);
        st = GRAFT_EMALFORMED;
    }
    if (st == GRAFT_OK) {
        st = member_entry_put(v, &mem);
        if (st != GRAFT_OK)
            graft__mship_member_clear(&mem);
        return st;
    }
    if (st == GRAFT_ENOMEM)
        return st;
    report_malformed(m, v, kv, st);
    member_entry_remove(v, k.group, k.rank);
    if (k.group == m->cfg.group && k.rank == m->cfg.rank && !m->cfg.observer) {
        v->own_member_bad_mod = kv->mod_revision;
        v->own_member_bad_reason = st;
    }
    return GRAFT_OK;
}

static graft_status_t apply_vote(graft_membership_t *m, graft__mview_t *v, bool is_put,
                                 const graft_etcd_kv_t *kv, graft__mkey_t k)
{
    graft__vote_t vote;
    if (!is_put) {
        vote_entry_remove(v, k.group, k.rank, k.number);
        return GRAFT_OK;
    }
    graft_status_t st = graft__mship_vote_decode(kv->value, kv->value_len, &vote);
    if (st == GRAFT_OK && (vote.group != k.group || vote.rank != k.rank || vote.round != k.number))
        st = GRAFT_EMALFORMED;
    if (st == GRAFT_OK)
        return vote_entry_put(v, &vote);
    if (st == GRAFT_ENOMEM)
        return st;
    report_malformed(m, v, kv, st);
    /* The key exists, so nobody can record a vote under it any more: for
     * the round it names, that rank's vote is a no (quorum id 0 matches no
     * quorum), as the voting transaction's read counts it. */
    vote = (graft__vote_t){.group = k.group, .rank = k.rank, .round = k.number};
    snprintf(vote.reason, sizeof(vote.reason), "unreadable vote record");
    return vote_entry_put(v, &vote);
}

static graft_status_t apply_quorum(graft_membership_t *m, graft__mview_t *v, bool is_put,
                                   const graft_etcd_kv_t *kv)
{
    /* The mod_revision always follows the key, so the next formation's
     * compare-and-swap can replace even a record that does not decode; the
     * last good record stays as the reference for ids and rounds. */
    v->quorum_mod = is_put ? kv->mod_revision : 0;
    v->quorum_bad_mod = 0;
    if (!is_put) {
        v->quorum_followed = false;
        return GRAFT_OK;
    }
    graft_quorum_t *q = NULL;
    graft_status_t st = graft__mship_quorum_decode(kv->value, kv->value_len, &q);
    if (st == GRAFT_OK) {
        graft_membership_quorum_free(v->quorum);
        v->quorum = q;
        v->quorum_followed = true;
        return GRAFT_OK;
    }
    if (st == GRAFT_ENOMEM)
        return st;
    report_malformed(m, v, kv, st);
    v->quorum_bad_mod = kv->mod_revision;
    v->quorum_bad_reason = st;
    v->repair_after_ns = 0;
    return GRAFT_OK;
}

static void apply_eventseq(graft_membership_t *m, graft__mview_t *v, bool is_put,
                           const graft_etcd_kv_t *kv)
{
    if (!is_put) {
        v->event_seq = 0;
        v->eventseq_mod = 0;
        return;
    }
    /* An append of this handle may already have taught us a newer one. */
    if (kv->mod_revision < v->eventseq_mod)
        return;
    uint64_t seq = 0;
    v->eventseq_mod = kv->mod_revision;
    if (graft__mship_eventseq_decode(kv->value, kv->value_len, &seq) != GRAFT_OK) {
        /* The next append replaces it (compare on its mod_revision). */
        report_malformed(m, v, kv, GRAFT_EMALFORMED);
        return;
    }
    v->event_seq = seq;
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
    case GRAFT__MKEY_MEMBER:
        st = apply_member(m, v, is_put, kv, k);
        break;
    case GRAFT__MKEY_VOTE:
        st = apply_vote(m, v, is_put, kv, k);
        break;
    case GRAFT__MKEY_QUORUM:
        st = apply_quorum(m, v, is_put, kv);
        break;
    case GRAFT__MKEY_EVENTSEQ:
        apply_eventseq(m, v, is_put, kv);
        break;
    case GRAFT__MKEY_BAD:
        if (is_put)
            report_malformed(m, v, kv, GRAFT_EMALFORMED);
        break;
    case GRAFT__MKEY_READY: /* read on demand, never watched */
    case GRAFT__MKEY_BLOB:
    case GRAFT__MKEY_EVENT:
    case GRAFT__MKEY_GROUP_PROGRESS: /* the runtime's and the spares' */
    case GRAFT__MKEY_FINISHED:
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
         * was deleted: ids and rounds must never go backwards. But it may
         * not be the record the key held last: no repair puts it back. */
        v->quorum_mod = 0;
        v->quorum_bad_mod = 0;
        v->quorum_followed = false;
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
                graft__mship_sleep(m, 100000000ull);
            }
            continue;
        }
        if (w->owns == GRAFT__MKEY_QUORUM)
            graft__mship_quorum_repair(m);
        if (w->owns == GRAFT__MKEY_MEMBER)
            graft__mship_member_repair(m);
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
        graft__mship_sleep(m, 100000000ull);
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

graft_status_t graft__mship_view_open(graft_membership_t *m)
{
    graft_status_t st = watch_open(m, graft__key_members_folder(m->prefix), GRAFT__MKEY_MEMBER);
    if (st == GRAFT_OK)
        st = watch_open(m, graft__key_quorum(m->prefix), GRAFT__MKEY_QUORUM);
    /* With one rank per group the voting transaction reads back the only
     * vote there is, so nobody needs the watch's echo of it: one watch
     * stream and one event per group and step less for etcd to serve. */
    if (st == GRAFT_OK && !m->cfg.observer && m->cfg.ranks_per_group > 1)
        st = watch_open(m, graft__key_votes_folder(m->prefix, m->cfg.group),
                        GRAFT__MKEY_VOTE);
    for (size_t i = 0; st == GRAFT_OK && i < m->n_watches; i++) {
        if (pthread_create(&m->watches[i].thread, NULL, watch_main, &m->watches[i]) != 0) {
            GRAFT_ERROR(GRAFT_MOD_MEMBERSHIP, "pthread_create: %s", strerror(errno));
            st = GRAFT_ESYS;
            break;
        }
        m->watches[i].started = true;
    }
    return st;
}

void graft__mship_view_stop(graft_membership_t *m)
{
    for (size_t i = 0; i < m->n_watches; i++)
        if (m->watches[i].started)
            pthread_join(m->watches[i].thread, NULL);
}

void graft__mship_view_close(graft_membership_t *m)
{
    for (size_t i = 0; i < m->n_watches; i++) {
        graft_etcd_watch_destroy(m->watches[i].w);
        graft_free(m->watches[i].prefix);
    }
    view_clear(&m->view);
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
    out->quorum_bad_mod = v->quorum_bad_mod;
    out->quorum_bad_reason = v->quorum_bad_reason;
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
