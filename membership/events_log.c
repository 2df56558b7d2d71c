/*
 * The job's event history: /graft/<job>/events/<20-digit sequence>, with the
 * last sequence in /graft/<job>/eventseq. An append is one transaction that
 * bumps the counter only if nobody else did since we read it, writes the
 * event, and deletes the event that falls out of the bounded history, so the
 * history never grows and sequences are dense and ordered.
 */
#include "membership_internal.h"

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define APPEND_ATTEMPTS 32

/* Learn the counter from a failed append's read of the eventseq key. */
static void learn_seq(graft_membership_t *m, const graft_etcd_txn_result_t *res)
{
    uint64_t seq = 0;
    int64_t mod = 0;
    if (res->n_ranges == 1 && res->ranges[0].n_kvs == 1) {
        const graft_etcd_kv_t *kv = &res->ranges[0].kvs[0];
        mod = kv->mod_revision;
        /* A counter that does not parse is replaced by the next append
         * (compare on its mod_revision) rather than blocking the history. */
        if (graft__mship_eventseq_decode(kv->value, kv->value_len, &seq) != GRAFT_OK)
            seq = 0;
    }
    pthread_mutex_lock(&m->mu);
    if (mod >= m->view.eventseq_mod) {
        m->view.event_seq = seq;
        m->view.eventseq_mod = mod;
    }
    pthread_mutex_unlock(&m->mu);
}

graft_status_t graft__mship_event_put(graft_membership_t *m, graft_event_t *ev)
{
    graft_status_t st = GRAFT_OK;
    char *seq_key = graft__mship_key(m, "eventseq");
    if (seq_key == NULL)
        return GRAFT_ENOMEM;
    ev->unix_ms = graft__wall_ns() / 1000000u;
    for (int attempt = 0; attempt < APPEND_ATTEMPTS; attempt++) {
        uint8_t *buf = NULL;
        size_t len = 0;
        char *ev_key = NULL, *old_key = NULL;
        char seq_text[24];
        graft_etcd_txn_result_t res = {0};

        pthread_mutex_lock(&m->mu);
        uint64_t seq = m->view.event_seq + 1;
        int64_t mod = m->view.eventseq_mod;
        pthread_mutex_unlock(&m->mu);
        ev->seq = seq;
        snprintf(seq_text, sizeof(seq_text), "%" PRIu64, seq);
        st = graft__mship_event_encode(ev, &buf, &len);
        ev_key = graft__mship_key(m, "events/%020" PRIu64, seq);
        old_key = graft__mship_key(m, "events/%020" PRIu64,
                                   seq > m->cfg.event_history ? seq - m->cfg.event_history : 0);
        if (st == GRAFT_OK && (ev_key == NULL || old_key == NULL))
            st = GRAFT_ENOMEM;
        if (st == GRAFT_OK) {
            graft_etcd_compare_t cmp = {seq_key, GRAFT_ETCD_CMP_MOD, GRAFT_ETCD_CMP_EQUAL, mod,
                                        NULL, 0};
            graft_etcd_op_t ops[3] = {
                {GRAFT_ETCD_OP_PUT, seq_key, seq_text, strlen(seq_text), 0, false, false},
                {GRAFT_ETCD_OP_PUT, ev_key, buf, len, 0, false, false},
                {GRAFT_ETCD_OP_DELETE, old_key, NULL, 0, 0, false, false},
            };
            graft_etcd_op_t get = {GRAFT_ETCD_OP_RANGE, seq_key, NULL, 0, 0, false, false};
            GRAFT__MSHIP_REQ(m);
            st = graft_etcd_txn(m->bg, &cmp, 1, ops, seq > m->cfg.event_history ? 3 : 2, &get,
                                1, &res);
            if (st != GRAFT_OK)
                atomic_fetch_add(&m->n_etcd_errors, 1);
        }
        bool done = st != GRAFT_OK || res.succeeded;
        if (st == GRAFT_OK && res.succeeded) {
            pthread_mutex_lock(&m->mu);
            if (res.revision >= m->view.eventseq_mod) {
                m->view.event_seq = seq;
                m->view.eventseq_mod = res.revision;
            }
            pthread_mutex_unlock(&m->mu);
        } else if (st == GRAFT_OK) {
            learn_seq(m, &res);
            /* Another rank appended first. Ranks that start or re-join
             * together append together: back off with jitter, or every
             * conflict is at once one more transaction. At most 20 ms a
             * time: some callers wait for their record (docs/RUNTIME.md). */
            graft__sleep_ns(graft__jitter_ns((uint64_t)GRAFT_MIN(attempt + 1, 4) * 5000000ull));
        }
        graft_etcd_txn_result_clear(&res);
        graft_free(old_key);
        graft_free(ev_key);
        graft_free(buf);
        if (done)
            goto out;
    }
    st = GRAFT_ETIMEOUT;
out:
    if (st != GRAFT_OK)
        GRAFT_WARN(GRAFT_MOD_MEMBERSHIP, "job %s: event %s not recorded: %s", m->job,
                   graft_event_kind_string(ev->kind), graft_status_string(st));
    graft_free(seq_key);
    return st;
}

graft_status_t graft_membership_event_append(graft_membership_t *m, const graft_event_t *ev)
{
    if (m == NULL || ev == NULL || ev->kind < GRAFT_EVENT_JOIN || ev->kind > GRAFT_EVENT_ERROR ||
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
    prefix = graft__mship_key(m, "events/");
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
    /* Keys are zero-padded, so etcd's key order is sequence order. */
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
