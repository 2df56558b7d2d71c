/*
 * A quorum record that does not decode (docs/KEYS.md, "Records that do not
 * decode"). The view treats it as absent and keeps the last good record as
 * the reference for rounds and ids. That is not enough on its own: a
 * process that starts while the key holds garbage has no reference, and
 * announces round 1 while the others announce the round after the last
 * good one, so neither round ever completes (a strict job then waits for
 * quorum_timeout_ms). Two things replace the record instead:
 *
 *  - a member whose view followed the key from the good record to the bad
 *    one puts the good record back, by compare-and-swap on the bad
 *    record's mod_revision, as soon as its watch delivers the bad one;
 *  - otherwise the next formation's compare-and-swap (on the same
 *    mod_revision) replaces it.
 *
 * Either way one event in the job's history names the key, the reason and
 * the round that replaced it; graftctl status shows it. The event is a
 * second write: a process killed between the two leaves the record
 * replaced and no event.
 *
 * A rank whose own member record was written over with bytes that do not
 * decode looks dead to every other rank while its lease lives (and the bad
 * record, put without a lease, would outlive it): the rank writes its
 * record again, on its lease.
 */
#include "membership_internal.h"

#include <inttypes.h>
#include <stdio.h>

#define REPAIR_BACKOFF_NS 1000000000ull

void graft__mship_quorum_replaced_event(graft_membership_t *m, graft_status_t reason,
                                        const graft_quorum_t *q)
{
    char *key = graft__key_quorum(m->prefix);
    char detail[256];
    snprintf(detail, sizeof(detail), GRAFT_MEMBERSHIP_QUORUM_BAD_TEXT " at %s does not decode: %s; "
             "replaced at round %" PRIu64, key != NULL ? key : "the quorum key",
             graft_status_string(reason), q->round);
    GRAFT_WARN(GRAFT_MOD_MEMBERSHIP, "job %s: %s", m->job, detail);
    graft_event_t ev = {0};
    ev.kind = GRAFT_EVENT_ERROR;
    ev.group = m->cfg.group;
    ev.rank = m->cfg.rank;
    ev.quorum_id = q->id;
    ev.round = q->round;
    ev.step = q->step;
    ev.ok = true;
    ev.detail = detail;
    if (graft__mship_event_put(m, &ev) != GRAFT_OK)
        GRAFT_DEBUG(GRAFT_MOD_MEMBERSHIP, "replacement event not recorded");
    graft_free(key);
}

/* The good record and the bad record's revision, when this handle should
 * put the one over the other now. Called with m->mu held. */
static bool repair_due(graft_membership_t *m, graft_quorum_t **good_p, int64_t *bad_mod_p,
                       graft_status_t *reason_p)
{
    graft__mview_t *v = &m->view;
    if (m->cfg.observer || !m->joined || m->left || v->quorum_bad_mod == 0 ||
        !v->quorum_followed || v->quorum == NULL || graft__now_ns() < v->repair_after_ns)
        return false;
    if (graft__mship_quorum_copy(v->quorum, good_p) != GRAFT_OK)
        return false;
    *bad_mod_p = v->quorum_bad_mod;
    *reason_p = v->quorum_bad_reason;
    return true;
}

void graft__mship_quorum_repair(graft_membership_t *m)
{
    graft_quorum_t *good = NULL;
    int64_t bad_mod = 0;
    graft_status_t reason = GRAFT_EMALFORMED;
    uint8_t *buf = NULL;
    size_t len = 0;
    graft_etcd_txn_result_t res = {0};
    pthread_mutex_lock(&m->mu);
    bool due = repair_due(m, &good, &bad_mod, &reason);
    pthread_mutex_unlock(&m->mu);
    if (!due)
        return;
    char *key = graft__key_quorum(m->prefix);
    graft_status_t st = key == NULL ? GRAFT_ENOMEM : graft__mship_quorum_encode(good, &buf, &len);
    if (st == GRAFT_OK) {
        graft_etcd_compare_t cmp = {key, GRAFT_ETCD_CMP_MOD, GRAFT_ETCD_CMP_EQUAL, bad_mod,
                                    NULL, 0};
        graft_etcd_op_t put = {GRAFT_ETCD_OP_PUT, key, buf, len, 0, false, false};
        GRAFT__MSHIP_REQ(m);
        st = graft_etcd_txn(m->ops, &cmp, 1, &put, 1, NULL, 0, &res);
    }
    if (st != GRAFT_OK) {
        /* Asked again a little later from the watch's loop; a formation
         * may replace the record first. */
        atomic_fetch_add(&m->n_etcd_errors, 1);
        pthread_mutex_lock(&m->mu);
        if (m->view.quorum_bad_mod == bad_mod)
            m->view.repair_after_ns = graft__now_ns() + REPAIR_BACKOFF_NS;
        pthread_mutex_unlock(&m->mu);
        GRAFT_DEBUG(GRAFT_MOD_MEMBERSHIP, "quorum repair failed: %s", graft_status_string(st));
        goto out;
    }
    if (res.succeeded)
        graft__mship_quorum_replaced_event(m, reason, good);
    /* Lost: another member's repair, a formation or a new write came
     * first; the watch brings what the key holds now. */
    pthread_mutex_lock(&m->mu);
    if (m->view.quorum_bad_mod == bad_mod)
        m->view.repair_after_ns = graft__now_ns() + REPAIR_BACKOFF_NS;
    pthread_mutex_unlock(&m->mu);
out:
    graft_etcd_txn_result_clear(&res);
    graft_free(buf);
    graft_free(key);
    graft_membership_quorum_free(good);
}

void graft__mship_member_repair(graft_membership_t *m)
{
    pthread_mutex_lock(&m->mu);
    int64_t bad_mod = m->view.own_member_bad_mod;
    graft_status_t reason = m->view.own_member_bad_reason;
    graft_member_state_t state = m->state;
    uint64_t step = m->committed_step;
    bool due = bad_mod != 0 && m->joined && !m->left &&
               graft__now_ns() >= m->view.repair_after_ns;
    pthread_mutex_unlock(&m->mu);
    if (!due)
        return;
    graft_status_t st = graft_membership_update(m, state, step);
    pthread_mutex_lock(&m->mu);
    if (m->view.own_member_bad_mod == bad_mod) {
        if (st == GRAFT_OK)
            m->view.own_member_bad_mod = 0;
        else
            m->view.repair_after_ns = graft__now_ns() + REPAIR_BACKOFF_NS;
    }
    pthread_mutex_unlock(&m->mu);
    if (st != GRAFT_OK) {
        GRAFT_DEBUG(GRAFT_MOD_MEMBERSHIP, "member record repair failed: %s",
                    graft_status_string(st));
        return;
    }
    char detail[192];
    char *key = graft__key_member(m->prefix, m->cfg.group, m->cfg.rank);
    snprintf(detail, sizeof(detail), "member record at %s does not decode: %s; written again",
             key != NULL ? key : "its key", graft_status_string(reason));
    graft_free(key);
    GRAFT_WARN(GRAFT_MOD_MEMBERSHIP, "job %s: %s", m->job, detail);
    graft_event_t ev = {0};
    ev.kind = GRAFT_EVENT_ERROR;
    ev.group = m->cfg.group;
    ev.rank = m->cfg.rank;
    ev.step = step;
    ev.ok = true;
    ev.detail = detail;
    if (graft__mship_event_put(m, &ev) != GRAFT_OK)
        GRAFT_DEBUG(GRAFT_MOD_MEMBERSHIP, "member repair event not recorded");
}
