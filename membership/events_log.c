/*
 * The job's event history: /graft/<job>/events/<20-digit key>. An append is
 * one transaction that creates a key nobody else holds (a random number,
 * compare create_revision = 0) and counts the folder; the event's sequence
 * is the key's create_revision, which etcd assigns, so appenders never race
 * for a counter: N ranks appending at once cost N transactions, not N^2.
 * Readers order events by create_revision. When the count passes the bound
 * by a slack (history / 8), the appender that saw it deletes the oldest
 * events down to the bound (docs/KEYS.md, "Events").
 *
 * Histories written before this change have keys events/<seq> and a counter
 * in eventseq; their events read the same way (create_revision order is their
 * sequence order), are trimmed the same way, and the counter is left alone.
 */
#include "membership_internal.h"

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* A key collision needs two equal 64-bit random numbers: a few tries is plenty. */
#define APPEND_ATTEMPTS 4
/* Deletes of one trim transaction (etcd's --max-txn-ops defaults to 128). */
#define TRIM_OPS_PER_TXN 64

typedef struct {
    char *key;
    int64_t create_revision;
} old_event_t;

static int by_create_revision(const void *a, const void *b)
{
    const old_event_t *x = a, *y = b;
    return (x->create_revision > y->create_revision) - (x->create_revision < y->create_revision);
}

/* Delete the oldest events (by create_revision) so that `keep` remain. Best
 * effort: several appenders may trim at once, and deletes are idempotent. */
static void trim_history(graft_membership_t *m, const char *prefix, size_t keep)
{
    graft_etcd_range_result_t res = {0};
    graft_etcd_range_opts_t opts = {0};
    old_event_t *evs = NULL;
    opts.prefix = true;
    opts.keys_only = true;
    GRAFT__MSHIP_REQ(m);
    if (graft_etcd_range(m->bg, prefix, &opts, &res) != GRAFT_OK) {
        atomic_fetch_add(&m->n_etcd_errors, 1);
        goto out;
    }
    if (res.n_kvs <= keep)
        goto out;
    evs = graft__calloc(res.n_kvs, sizeof(*evs));
    if (evs == NULL)
        goto out;
    for (size_t i = 0; i < res.n_kvs; i++)
        evs[i] = (old_event_t){res.kvs[i].key, res.kvs[i].create_revision};
    qsort(evs, res.n_kvs, sizeof(*evs), by_create_revision);
    size_t n_del = res.n_kvs - keep;
    for (size_t at = 0; at < n_del; at += TRIM_OPS_PER_TXN) {
        graft_etcd_op_t ops[TRIM_OPS_PER_TXN];
        size_t n = GRAFT_MIN(n_del - at, (size_t)TRIM_OPS_PER_TXN);
        for (size_t i = 0; i < n; i++)
            ops[i] = (graft_etcd_op_t){GRAFT_ETCD_OP_DELETE, evs[at + i].key, NULL, 0, 0, false,
                                       false};
        graft_etcd_txn_result_t tres = {0};
        GRAFT__MSHIP_REQ(m);
        graft_status_t st = graft_etcd_txn(m->bg, NULL, 0, ops, n, NULL, 0, &tres);
        graft_etcd_txn_result_clear(&tres);
        if (st != GRAFT_OK) {
            atomic_fetch_add(&m->n_etcd_errors, 1);
            break;
        }
    }
out:
    graft_free(evs);
    graft_etcd_range_result_clear(&res);
}

/* One try: create events/<number> if absent, counting the folder. *done_p:
 * the key was created (or etcd failed); *count_p: events held after it. */
static graft_status_t append_once(graft_membership_t *m, const char *prefix, graft_event_t *ev,
                                  bool *done_p, int64_t *count_p)
{
    uint8_t *buf = NULL;
    size_t len = 0;
    char *ev_key = NULL;
    uint64_t number = 0;
    graft_etcd_txn_result_t res = {0};
    graft_status_t st = graft__random_bytes(&number, sizeof(number));
    *done_p = true;
    if (st != GRAFT_OK)
        return st;
    number = number ? number : 1; /* a decoded event's seq is never 0 */
    ev->seq = number;             /* the value names its key: garbage elsewhere shows */
    st = graft__mship_event_encode(ev, &buf, &len);
    if (st == GRAFT_OK) {
        ev_key = graft__key_event(m->prefix, number);
        if (ev_key == NULL)
            st = GRAFT_ENOMEM;
    }
    if (st != GRAFT_OK)
        goto out;
    graft_etcd_compare_t cmp = {ev_key, GRAFT_ETCD_CMP_CREATE, GRAFT_ETCD_CMP_EQUAL, 0, NULL, 0};
    graft_etcd_op_t ops[2] = {
        {GRAFT_ETCD_OP_PUT, ev_key, buf, len, 0, false, false},
        {GRAFT_ETCD_OP_RANGE, prefix, NULL, 0, 0, true, true},
    };
    GRAFT__MSHIP_REQ(m);
    st = graft_etcd_txn(m->bg, &cmp, 1, ops, 2, NULL, 0, &res);
    if (st != GRAFT_OK) {
        atomic_fetch_add(&m->n_etcd_errors, 1);
        goto out;
    }
    *done_p = res.succeeded;
    if (res.succeeded) {
        ev->seq = (uint64_t)res.revision; /* the key's create_revision */
        *count_p = res.n_ranges == 1 ? res.ranges[0].count : 0;
    }
out:
    graft_etcd_txn_result_clear(&res);
    graft_free(ev_key);
    graft_free(buf);
    return st;
}

graft_status_t graft__mship_event_put(graft_membership_t *m, graft_event_t *ev)
{
    graft_status_t st = GRAFT_OK;
    int64_t count = 0;
    bool done = false;
    char *prefix = graft__key_events_folder(m->prefix);
    if (prefix == NULL)
        return GRAFT_ENOMEM;
    ev->unix_ms = graft__wall_ns() / 1000000u;
    for (int attempt = 0; attempt < APPEND_ATTEMPTS && !done; attempt++)
        st = append_once(m, prefix, ev, &done, &count);
    if (st == GRAFT_OK && !done)
        st = GRAFT_ETIMEOUT;
    if (st != GRAFT_OK) {
        GRAFT_WARN(GRAFT_MOD_MEMBERSHIP, "job %s: event %s not recorded: %s", m->job,
                   graft_event_kind_string(ev->kind), graft_status_string(st));
        goto out;
    }
    size_t bound = m->cfg.event_history;
    if (count > 0 && (uint64_t)count > bound + bound / 8)
        trim_history(m, prefix, bound);
out:
    graft_free(prefix);
    return st;
}

static int by_kv_create_revision(const void *a, const void *b)
{
    const graft_etcd_kv_t *x = a, *y = b;
    return (x->create_revision > y->create_revision) - (x->create_revision < y->create_revision);
}

graft_status_t graft_membership_event_append(graft_membership_t *m, const graft_event_t *ev)
{
    if (m == NULL || ev == NULL || ev->kind < GRAFT_EVENT_JOIN || ev->kind > GRAFT_EVENT_KIND_LAST ||
        (ev->n_members > 0 && ev->members == NULL))
        return GRAFT_EINVAL;
    graft_event_t copy = *ev;
    return graft__mship_event_put(m, &copy);
}

graft_status_t graft_membership_events_read(graft_membership_t *m, uint64_t after_seq,
                                            graft_event_t **events_p, size_t *n_p)
{
    graft_status_t st;
    graft_etcd_range_result_t res = {0};
    graft_etcd_range_opts_t opts = {0};
    graft_event_t *out = NULL;
    size_t n = 0;
    char *prefix = NULL;
    if (m == NULL || events_p == NULL || n_p == NULL)
        return GRAFT_EINVAL;
    prefix = graft__key_events_folder(m->prefix);
    if (prefix == NULL)
        return GRAFT_ENOMEM;
    opts.prefix = true;
    GRAFT__MSHIP_REQ(m);
    st = graft_etcd_range(m->ops, prefix, &opts, &res);
    if (st != GRAFT_OK) {
        atomic_fetch_add(&m->n_etcd_errors, 1);
        goto out;
    }
    if (res.n_kvs > 0) {
        out = graft__calloc(res.n_kvs, sizeof(*out));
        if (out == NULL) {
            st = GRAFT_ENOMEM;
            goto out;
        }
    }
    /* Keys are random: an event's sequence is its create_revision. (No
     * keys: res.kvs is NULL, which qsort must not be given.) */
    if (res.n_kvs > 1)
        qsort(res.kvs, res.n_kvs, sizeof(res.kvs[0]), by_kv_create_revision);
    for (size_t i = 0; i < res.n_kvs; i++) {
        const graft_etcd_kv_t *kv = &res.kvs[i];
        graft__mkey_t k = graft__mship_key_parse(m->prefix, kv->key);
        graft_event_t ev;
        st = k.kind == GRAFT__MKEY_EVENT ? graft__mship_event_decode(kv->value, kv->value_len, &ev)
                                         : GRAFT_EMALFORMED;
        if (st == GRAFT_ENOMEM)
            goto out;
        if (st == GRAFT_OK && ev.seq != k.number) {
            graft__mship_event_clear(&ev);
            st = GRAFT_EMALFORMED;
        }
        if (st != GRAFT_OK) {
            GRAFT_WARN(GRAFT_MOD_MEMBERSHIP, "skipping event record %s (%zu bytes): %s", kv->key,
                       kv->value_len, graft_status_string(st));
            pthread_mutex_lock(&m->mu);
            m->view.malformed++;
            pthread_mutex_unlock(&m->mu);
            st = GRAFT_OK;
            continue;
        }
        ev.seq = (uint64_t)kv->create_revision;
        if (ev.seq <= after_seq) {
            graft__mship_event_clear(&ev);
            continue;
        }
        out[n++] = ev;
    }
    *events_p = out;
    *n_p = n;
    out = NULL;
    n = 0;
out:
    graft_membership_events_free(out, n);
    graft_etcd_range_result_clear(&res);
    graft_free(prefix);
    return st;
}

void graft_membership_events_free(graft_event_t *events, size_t n)
{
    if (events == NULL)
        return;
    for (size_t i = 0; i < n; i++)
        graft__mship_event_clear(&events[i]);
    graft_free(events);
}
