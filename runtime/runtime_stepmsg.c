/*
 * The steady path's message (StepMessage, proto/graft.proto) and its MAC:
 * an HMAC-SHA256 keyed with the job secret over a label and every field
 * the receiver acts on (docs/SECURITY.md, "Steady-path messages"). Only
 * the encoding and the check live here; runtime_steady.c sends, waits and
 * decides.
 */
#include "runtime_internal.h"

#include "pb_alloc.h"
#include "proto/graft.pb-c.h"

#include <assert.h>
#include <stdio.h>
#include <string.h>

#define STEP_MSG_VERSION 1u
static const char STEP_LABEL[] = "graft/step/v1";

bool graft__rt_step_delegated(int kind)
{
    return kind == GRAFT__STEP_MESSAGE__KIND__ANNOUNCE ||
           kind == GRAFT__STEP_MESSAGE__KIND__ANNOUNCED ||
           kind == GRAFT__STEP_MESSAGE__KIND__VOTE_DELEGATE;
}

graft_status_t graft__rt_step_mac(const uint8_t *secret, size_t secret_len,
                                  const graft__step_msg_t *m, uint8_t out[GRAFT_MAC_BYTES])
{
    const uint64_t v[] = {(uint64_t)(uint32_t)m->kind, m->quorum_id, m->members_hash,
                          m->epoch_round, m->step, m->group, m->rank, m->round, m->ok ? 1u : 0u};
    size_t rlen = strnlen(m->reason, sizeof(m->reason));
    const uint64_t d[] = {m->incarnation, (uint64_t)m->lease, m->etcd_round, m->prev_round,
                          rlen};
    uint8_t buf[sizeof(STEP_LABEL) - 1 + sizeof(v) + sizeof(d) + sizeof(m->reason)];
    size_t at = sizeof(STEP_LABEL) - 1;
    memcpy(buf, STEP_LABEL, at);
    for (size_t i = 0; i < GRAFT_ARRAY_SIZE(v); i++)
        at = graft__mac_put_u64(buf, at, v[i]);
    assert(at == sizeof(STEP_LABEL) - 1 + sizeof(v));
    if (graft__rt_step_delegated(m->kind)) {
        for (size_t i = 0; i < GRAFT_ARRAY_SIZE(d); i++)
            at = graft__mac_put_u64(buf, at, d[i]);
        memcpy(buf + at, m->reason, rlen);
        at += rlen;
    }
    return graft__hmac_sha256(secret, secret_len, buf, at, out);
}

graft_status_t graft__rt_step_encode(const uint8_t *secret, size_t secret_len,
                                     const graft__step_msg_t *m, uint8_t *buf, size_t cap,
                                     size_t *len_p)
{
    uint8_t mac[GRAFT_MAC_BYTES];
    graft_status_t st = graft__rt_step_mac(secret, secret_len, m, mac);
    if (st != GRAFT_OK)
        return st;
    Graft__StepMessage pm = GRAFT__STEP_MESSAGE__INIT;
    pm.version = STEP_MSG_VERSION;
    pm.kind = (Graft__StepMessage__Kind)m->kind;
    pm.quorum_id = m->quorum_id;
    pm.members_hash = m->members_hash;
    pm.epoch_round = m->epoch_round;
    pm.step = m->step;
    pm.group = m->group;
    pm.rank = m->rank;
    pm.barrier_round = m->round;
    pm.ok = m->ok;
    char reason[sizeof(m->reason) + 1];
    snprintf(reason, sizeof(reason), "%.*s", (int)sizeof(m->reason), m->reason);
    if (graft__rt_step_delegated(m->kind)) {
        pm.incarnation = m->incarnation;
        pm.lease = m->lease;
        pm.etcd_round = m->etcd_round;
        pm.prev_round = m->prev_round;
        pm.reason = reason;
    }
    pm.mac.data = mac;
    pm.mac.len = sizeof(mac);
    size_t len = graft__step_message__get_packed_size(&pm);
    if (len > cap)
        return GRAFT_ERANGE;
    graft__step_message__pack(&pm, buf);
    *len_p = len;
    return GRAFT_OK;
}

graft_status_t graft__rt_step_decode(const uint8_t *secret, size_t secret_len, const uint8_t *buf,
                                     size_t len, graft__step_msg_t *m_p)
{
    bool oom = false;
    ProtobufCAllocator pa = graft__pb_allocator_tracked(&oom);
    Graft__StepMessage *pm = graft__step_message__unpack(&pa, len, buf);
    if (pm == NULL)
        return oom ? GRAFT_ENOMEM : GRAFT_EPROTO;
    graft__step_msg_t m = {
        .kind = (int)pm->kind,
        .quorum_id = pm->quorum_id,
        .members_hash = pm->members_hash,
        .epoch_round = pm->epoch_round,
        .step = pm->step,
        .group = pm->group,
        .rank = pm->rank,
        .round = pm->barrier_round,
        .ok = pm->ok,
    };
    graft_status_t st = pm->version != STEP_MSG_VERSION ? GRAFT_EFORMAT : GRAFT_OK;
    if (st == GRAFT_OK && graft__rt_step_delegated(m.kind)) {
        m.incarnation = pm->incarnation;
        m.lease = pm->lease;
        m.etcd_round = pm->etcd_round;
        m.prev_round = pm->prev_round;
        if (pm->reason != NULL && strlen(pm->reason) > sizeof(m.reason))
            st = GRAFT_EPROTO; /* longer than any sender writes */
        else if (pm->reason != NULL)
            memcpy(m.reason, pm->reason, strlen(pm->reason));
    }
    uint8_t want[GRAFT_MAC_BYTES];
    if (st == GRAFT_OK)
        st = graft__rt_step_mac(secret, secret_len, &m, want);
    /* Compared in constant time: how far a guess matched must not show. */
    if (st == GRAFT_OK && !graft__mac_equal(pm->mac.data, pm->mac.len, want))
        st = GRAFT_ETOKEN;
    graft__step_message__free_unpacked(pm, &graft__pb_allocator);
    if (st == GRAFT_OK)
        *m_p = m;
    return st;
}
