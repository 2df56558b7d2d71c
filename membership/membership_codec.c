/*
 * Codecs of the records the membership layer keeps in etcd (graft.proto's
 * MemberRecord, ReadyRecord, Quorum, Vote, Event); the keys they live
 * under are membership_keys.c's. Records in etcd can be written by anyone with
 * access, so every decoder treats its input as hostile: it checks the
 * version, the ranges and the internal consistency, and reports
 * GRAFT_EMALFORMED instead of handing nonsense to the quorum logic.
 */
#include "membership_internal.h"

#include "pb_alloc.h"
#include "proto/graft.pb-c.h"

#include <assert.h>
#include <errno.h>
#include <inttypes.h>
#include <stddef.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Pack any message into a fresh buffer. */
static graft_status_t pack_message(const ProtobufCMessage *msg, uint8_t **buf_p, size_t *len_p)
{
    size_t len = protobuf_c_message_get_packed_size(msg);
    uint8_t *buf = graft__malloc(len);
    if (buf == NULL)
        return GRAFT_ENOMEM;
    size_t done = protobuf_c_message_pack(msg, buf);
    assert(done == len);
    (void)done;
    *buf_p = buf;
    *len_p = len;
    return GRAFT_OK;
}

/*
 * protobuf-c returns NULL both for bytes that do not decode and for a failed
 * allocation. Telling them apart matters (a record is skipped as malformed,
 * an allocation failure is the caller's problem), so a NULL is retried once
 * with the default allocator only to classify it; nothing from that second
 * attempt is kept.
 */
static graft_status_t unpack_status(const ProtobufCMessageDescriptor *desc, const uint8_t *buf,
                                    size_t len)
{
    ProtobufCMessage *probe = protobuf_c_message_unpack(desc, NULL, len, buf);
    if (probe == NULL)
        return GRAFT_EMALFORMED;
    protobuf_c_message_free_unpacked(probe, NULL);
    return GRAFT_ENOMEM;
}

/* Unpack a record of any kind and check its `version` field (every record
 * has one): GRAFT_EMALFORMED for bytes that do not decode or a version of 0,
 * GRAFT_EFORMAT for a version this reader does not know, GRAFT_ENOMEM.
 * Free *rec_p with record_free(). */
static graft_status_t record_unpack(const ProtobufCMessageDescriptor *desc, const uint8_t *buf,
                                    size_t len, ProtobufCMessage **rec_p)
{
    ProtobufCMessage *rec = protobuf_c_message_unpack(desc, &graft__pb_allocator, len, buf);
    if (rec == NULL)
        return unpack_status(desc, buf, len);
    const ProtobufCFieldDescriptor *f =
        protobuf_c_message_descriptor_get_field_by_name(desc, "version");
    assert(f != NULL && f->type == PROTOBUF_C_TYPE_UINT32);
    uint32_t version;
    memcpy(&version, (const char *)rec + f->offset, sizeof(version));
    if (version != GRAFT_MSHIP_RECORD_VERSION) {
        protobuf_c_message_free_unpacked(rec, &graft__pb_allocator);
        return version == 0 ? GRAFT_EMALFORMED : GRAFT_EFORMAT;
    }
    *rec_p = rec;
    return GRAFT_OK;
}

static void record_free(void *rec)
{
    protobuf_c_message_free_unpacked(rec, &graft__pb_allocator);
}

/* -------------------------------------------------------------- member --- */

graft_status_t graft__mship_member_encode(const graft_member_t *mem, uint8_t **buf_p, size_t *len_p)
{
    Graft__MemberRecord rec = GRAFT__MEMBER_RECORD__INIT;
    rec.version = GRAFT_MSHIP_RECORD_VERSION;
    rec.group = mem->group;
    rec.rank = mem->rank;
    rec.incarnation = mem->incarnation;
    rec.host = mem->host != NULL ? mem->host : (char *)"";
    rec.pid = mem->pid;
    rec.transfer_address = mem->transfer_address != NULL ? mem->transfer_address : (char *)"";
    rec.layout_hash = mem->layout_hash;
    rec.committed_step = mem->committed_step;
    rec.state = (Graft__MemberState)mem->state;
    rec.lease_id = mem->lease_id;
    rec.joined_unix_ms = mem->joined_unix_ms;
    rec.spare_group = mem->spare_group != NULL ? mem->spare_group : (char *)"";
    return pack_message(&rec.base, buf_p, len_p);
}

void graft__mship_member_clear(graft_member_t *mem)
{
    if (mem == NULL)
        return;
    graft_free(mem->host);
    graft_free(mem->transfer_address);
    graft_free(mem->spare_group);
    mem->host = NULL;
    mem->transfer_address = NULL;
    mem->spare_group = NULL;
}

graft_status_t graft__mship_member_copy(const graft_member_t *src, graft_member_t *dst_p)
{
    graft_member_t out = *src;
    out.host = graft__strdup(src->host != NULL ? src->host : "");
    out.transfer_address = graft__strdup(src->transfer_address != NULL ? src->transfer_address : "");
    out.spare_group = graft__strdup(src->spare_group != NULL ? src->spare_group : "");
    if (out.host == NULL || out.transfer_address == NULL || out.spare_group == NULL) {
        graft__mship_member_clear(&out);
        return GRAFT_ENOMEM;
    }
    *dst_p = out;
    return GRAFT_OK;
}

graft_status_t graft__mship_member_decode(const uint8_t *buf, size_t len, graft_member_t *mem_p)
{
    ProtobufCMessage *msg;
    graft_member_t out = {0};
    graft_status_t st = record_unpack(&graft__member_record__descriptor, buf, len, &msg);
    if (st != GRAFT_OK)
        return st;
    const Graft__MemberRecord *rec = (const Graft__MemberRecord *)msg;
    if (rec->incarnation == 0 || rec->state < GRAFT__MEMBER_STATE__MEMBER_JOINING ||
        rec->state > GRAFT__MEMBER_STATE__MEMBER_CANNOT_SERVE) {
        st = GRAFT_EMALFORMED;
        goto out_free;
    }
    out.group = rec->group;
    out.rank = rec->rank;
    out.incarnation = rec->incarnation;
    out.pid = rec->pid;
    out.layout_hash = rec->layout_hash;
    out.committed_step = rec->committed_step;
    out.state = (graft_member_state_t)rec->state;
    out.lease_id = rec->lease_id;
    out.joined_unix_ms = rec->joined_unix_ms;
    out.host = rec->host;
    out.transfer_address = rec->transfer_address;
    out.spare_group = rec->spare_group;
    st = graft__mship_member_copy(&out, mem_p);
out_free:
    record_free(msg);
    return st;
}

/* --------------------------------------------------------------- ready --- */

graft_status_t graft__mship_ready_encode(const graft__ready_t *r, uint8_t **buf_p, size_t *len_p)
{
    Graft__ReadyRecord rec = GRAFT__READY_RECORD__INIT;
    rec.version = GRAFT_MSHIP_RECORD_VERSION;
    rec.group = r->group;
    rec.rank = r->rank;
    rec.incarnation = r->incarnation;
    rec.round = r->round;
    rec.step = r->committed_step;
    rec.committed_step = r->committed_step;
    rec.unix_ms = r->unix_ms;
    return pack_message(&rec.base, buf_p, len_p);
}

graft_status_t graft__mship_ready_decode(const uint8_t *buf, size_t len, graft__ready_t *r_p)
{
    ProtobufCMessage *msg;
    graft_status_t st = record_unpack(&graft__ready_record__descriptor, buf, len, &msg);
    if (st != GRAFT_OK)
        return st;
    const Graft__ReadyRecord *rec = (const Graft__ReadyRecord *)msg;
    if (rec->round == 0 || rec->incarnation == 0) {
        st = GRAFT_EMALFORMED;
    } else {
        graft__ready_t out = {0};
        out.group = rec->group;
        out.rank = rec->rank;
        out.incarnation = rec->incarnation;
        out.round = rec->round;
        out.committed_step = rec->committed_step;
        out.unix_ms = rec->unix_ms;
        *r_p = out;
    }
    record_free(msg);
    return st;
}

/* ---------------------------------------------------------------- vote --- */

graft_status_t graft__mship_vote_encode(const graft__vote_t *v, uint8_t **buf_p, size_t *len_p)
{
    Graft__Vote rec = GRAFT__VOTE__INIT;
    rec.version = GRAFT_MSHIP_RECORD_VERSION;
    rec.group = v->group;
    rec.rank = v->rank;
    rec.incarnation = v->incarnation;
    rec.quorum_id = v->quorum_id;
    rec.round = v->round;
    rec.step = v->step;
    rec.ok = v->ok;
    rec.reason = (char *)v->reason;
    return pack_message(&rec.base, buf_p, len_p);
}

graft_status_t graft__mship_vote_decode(const uint8_t *buf, size_t len, graft__vote_t *v_p)
{
    ProtobufCMessage *msg;
    graft_status_t st = record_unpack(&graft__vote__descriptor, buf, len, &msg);
    if (st != GRAFT_OK)
        return st;
    const Graft__Vote *rec = (const Graft__Vote *)msg;
    if (rec->round == 0 || rec->quorum_id == 0) {
        st = GRAFT_EMALFORMED;
    } else {
        graft__vote_t out = {0};
        out.group = rec->group;
        out.rank = rec->rank;
        out.incarnation = rec->incarnation;
        out.quorum_id = rec->quorum_id;
        out.round = rec->round;
        out.step = rec->step;
        out.ok = rec->ok;
        snprintf(out.reason, sizeof(out.reason), "%s", rec->reason != NULL ? rec->reason : "");
        *v_p = out;
    }
    record_free(msg);
    return st;
}

/* -------------------------------------------------------------- quorum --- */

void graft_membership_quorum_free(graft_quorum_t *q)
{
    if (q == NULL)
        return;
    for (size_t i = 0; i < q->n_recoveries; i++)
        graft_free(q->recoveries[i].donors);
    graft_free(q->recoveries);
    graft_free(q->members);
    graft_free(q);
}

graft_status_t graft__mship_quorum_encode(const graft_quorum_t *q, uint8_t **buf_p, size_t *len_p)
{
    graft_status_t st;
    Graft__Quorum rec = GRAFT__QUORUM__INIT;
    Graft__Recovery *recs = NULL;
    Graft__Recovery **ptrs = NULL;
    if (q->n_recoveries > 0) {
        recs = graft__calloc(q->n_recoveries, sizeof(*recs));
        ptrs = graft__calloc(q->n_recoveries, sizeof(*ptrs));
        if (recs == NULL || ptrs == NULL) {
            st = GRAFT_ENOMEM;
            goto out;
        }
    }
    for (size_t i = 0; i < q->n_recoveries; i++) {
        graft__recovery__init(&recs[i]);
        recs[i].recipient_group = q->recoveries[i].recipient;
        recs[i].n_donor_groups = q->recoveries[i].n_donors;
        recs[i].donor_groups = q->recoveries[i].donors;
        ptrs[i] = &recs[i];
    }
    rec.version = GRAFT_MSHIP_RECORD_VERSION;
    rec.id = q->id;
    rec.round = q->round;
    rec.step = q->step;
    rec.max_committed_step = q->max_committed_step;
    rec.n_members = q->n_members;
    rec.members = q->members;
    rec.n_recoveries = q->n_recoveries;
    rec.recoveries = ptrs;
    rec.formed_unix_ms = q->formed_unix_ms;
    rec.min_groups = q->min_groups;
    rec.members_hash = q->members_hash;
    rec.duration_us = q->duration_us;
    st = pack_message(&rec.base, buf_p, len_p);
out:
    graft_free(ptrs);
    graft_free(recs);
    return st;
}

/* Index of g in the strictly ascending members, or -1. */
static ptrdiff_t member_index(const uint32_t *members, size_t n, uint32_t g)
{
    size_t lo = 0, hi = n;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (members[mid] == g)
            return (ptrdiff_t)mid;
        if (members[mid] < g)
            lo = mid + 1;
        else
            hi = mid;
    }
    return -1;
}

/* A quorum is only usable when it is internally consistent: members strictly
 * ascending, every recipient and donor a member, no group both. The record
 * comes from etcd, so the check costs O(n log n) in its size: a record of
 * many recoveries and donors must not keep a reader busy for seconds.
 * GRAFT_EMALFORMED when it is not consistent. */
graft_status_t graft__mship_eventseq_decode(const uint8_t *buf, size_t len, uint64_t *seq_p)
{
    uint64_t v = 0;
    if (buf == NULL || len == 0 || len > 20)
        return GRAFT_EMALFORMED;
    for (size_t i = 0; i < len; i++) {
        if (buf[i] < '0' || buf[i] > '9')
            return GRAFT_EMALFORMED;
        uint64_t d = (uint64_t)(buf[i] - '0');
        if (v > (UINT64_MAX - d) / 10)
            return GRAFT_EMALFORMED;
        v = v * 10 + d;
    }
    *seq_p = v;
    return GRAFT_OK;
}

static graft_status_t quorum_check(const Graft__Quorum *rec)
{
    /* A round or id near the top would wrap when the next one is counted
     * from it. */
    if (rec->id == 0 || rec->round == 0 || rec->n_members == 0 || rec->id >= UINT64_MAX / 2 ||
        rec->round >= UINT64_MAX / 2)
        return GRAFT_EMALFORMED;
    for (size_t i = 1; i < rec->n_members; i++)
        if (rec->members[i] <= rec->members[i - 1])
            return GRAFT_EMALFORMED;
    if (rec->n_recoveries >= rec->n_members)
        return GRAFT_EMALFORMED;
    if (rec->n_recoveries == 0)
        return GRAFT_OK;
    bool *recipient = graft__calloc(rec->n_members, sizeof(*recipient));
    if (recipient == NULL)
        return GRAFT_ENOMEM;
    graft_status_t st = GRAFT_OK;
    for (size_t i = 0; i < rec->n_recoveries && st == GRAFT_OK; i++) {
        const Graft__Recovery *r = rec->recoveries[i];
        ptrdiff_t k = member_index(rec->members, rec->n_members, r->recipient_group);
        if (k < 0 || r->n_donor_groups == 0)
            st = GRAFT_EMALFORMED;
        else
            recipient[k] = true;
    }
    for (size_t i = 0; i < rec->n_recoveries && st == GRAFT_OK; i++) {
        const Graft__Recovery *r = rec->recoveries[i];
        for (size_t j = 0; j < r->n_donor_groups && st == GRAFT_OK; j++) {
            ptrdiff_t k = member_index(rec->members, rec->n_members, r->donor_groups[j]);
            if (k < 0 || recipient[k])
                st = GRAFT_EMALFORMED;
        }
    }
    graft_free(recipient);
    return st;
}

static graft_status_t copy_u32s(const uint32_t *src, size_t n, uint32_t **dst_p)
{
    *dst_p = NULL;
    if (n == 0)
        return GRAFT_OK;
    uint32_t *d = graft__malloc(n * sizeof(*d));
    if (d == NULL)
        return GRAFT_ENOMEM;
    memcpy(d, src, n * sizeof(*d));
    *dst_p = d;
    return GRAFT_OK;
}

graft_status_t graft__mship_quorum_decode(const uint8_t *buf, size_t len, graft_quorum_t **q_p)
{
    ProtobufCMessage *msg;
    graft_quorum_t *q = NULL;
    graft_status_t st = record_unpack(&graft__quorum__descriptor, buf, len, &msg);
    if (st != GRAFT_OK)
        return st;
    const Graft__Quorum *rec = (const Graft__Quorum *)msg;
    st = quorum_check(rec);
    if (st != GRAFT_OK)
        goto out;
    q = graft__calloc(1, sizeof(*q));
    if (q == NULL) {
        st = GRAFT_ENOMEM;
        goto out;
    }
    q->id = rec->id;
    q->round = rec->round;
    q->step = rec->step;
    q->max_committed_step = rec->max_committed_step;
    q->formed_unix_ms = rec->formed_unix_ms;
    q->min_groups = rec->min_groups;
    q->members_hash = rec->members_hash;
    q->duration_us = rec->duration_us;
    st = copy_u32s(rec->members, rec->n_members, &q->members);
    if (st != GRAFT_OK)
        goto out;
    q->n_members = rec->n_members;
    if (rec->n_recoveries > 0) {
        q->recoveries = graft__calloc(rec->n_recoveries, sizeof(*q->recoveries));
        if (q->recoveries == NULL) {
            st = GRAFT_ENOMEM;
            goto out;
        }
    }
    for (size_t i = 0; i < rec->n_recoveries; i++) {
        const Graft__Recovery *r = rec->recoveries[i];
        q->recoveries[i].recipient = r->recipient_group;
        st = copy_u32s(r->donor_groups, r->n_donor_groups, &q->recoveries[i].donors);
        if (st != GRAFT_OK)
            goto out;
        q->recoveries[i].n_donors = r->n_donor_groups;
        q->n_recoveries = i + 1;
    }
    *q_p = q;
    q = NULL;
out:
    graft_membership_quorum_free(q);
    record_free(msg);
    return st;
}

graft_status_t graft__mship_quorum_copy(const graft_quorum_t *src, graft_quorum_t **dst_p)
{
    graft_status_t st = GRAFT_OK;
    graft_quorum_t *q = graft__calloc(1, sizeof(*q));
    if (q == NULL)
        return GRAFT_ENOMEM;
    *q = *src;
    q->members = NULL;
    q->recoveries = NULL;
    q->n_recoveries = 0;
    st = copy_u32s(src->members, src->n_members, &q->members);
    if (st != GRAFT_OK)
        goto out;
    if (src->n_recoveries > 0) {
        q->recoveries = graft__calloc(src->n_recoveries, sizeof(*q->recoveries));
        if (q->recoveries == NULL) {
            st = GRAFT_ENOMEM;
            goto out;
        }
    }
    for (size_t i = 0; i < src->n_recoveries; i++) {
        q->recoveries[i].recipient = src->recoveries[i].recipient;
        st = copy_u32s(src->recoveries[i].donors, src->recoveries[i].n_donors,
                       &q->recoveries[i].donors);
        if (st != GRAFT_OK)
            goto out;
        q->recoveries[i].n_donors = src->recoveries[i].n_donors;
        q->n_recoveries = i + 1;
    }
    *dst_p = q;
    q = NULL;
out:
    graft_membership_quorum_free(q);
    return st;
}

/* --------------------------------------------------------------- event --- */

void graft__mship_event_clear(graft_event_t *ev)
{
    if (ev == NULL)
        return;
    graft_free(ev->members);
    graft_free(ev->detail);
    ev->members = NULL;
    ev->detail = NULL;
    ev->n_members = 0;
}

graft_status_t graft__mship_event_encode(const graft_event_t *ev, uint8_t **buf_p, size_t *len_p)
{
    Graft__Event rec = GRAFT__EVENT__INIT;
    rec.version = GRAFT_MSHIP_RECORD_VERSION;
    rec.seq = ev->seq;
    rec.kind = (Graft__EventKind)ev->kind;
    rec.unix_ms = ev->unix_ms;
    rec.group = ev->group;
    rec.rank = ev->rank;
    rec.incarnation = ev->incarnation;
    rec.quorum_id = ev->quorum_id;
    rec.round = ev->round;
    rec.step = ev->step;
    rec.n_members = ev->n_members;
    rec.members = ev->members;
    rec.duration_us = ev->duration_us;
    rec.ok = ev->ok;
    rec.detail = ev->detail != NULL ? ev->detail : (char *)"";
    return pack_message(&rec.base, buf_p, len_p);
}

graft_status_t graft__mship_event_decode(const uint8_t *buf, size_t len, graft_event_t *ev_p)
{
    ProtobufCMessage *msg;
    graft_event_t out = {0};
    graft_status_t st = record_unpack(&graft__event__descriptor, buf, len, &msg);
    if (st != GRAFT_OK)
        return st;
    const Graft__Event *rec = (const Graft__Event *)msg;
    if (rec->seq == 0 || rec->kind < GRAFT__EVENT_KIND__EVENT_JOIN ||
        rec->kind > GRAFT__EVENT_KIND__EVENT_SPARE_PROMOTED) {
        st = GRAFT_EMALFORMED;
        goto out;
    }
    out.seq = rec->seq;
    out.kind = (graft_event_kind_t)rec->kind;
    out.unix_ms = rec->unix_ms;
    out.group = rec->group;
    out.rank = rec->rank;
    out.incarnation = rec->incarnation;
    out.quorum_id = rec->quorum_id;
    out.round = rec->round;
    out.step = rec->step;
    out.duration_us = rec->duration_us;
    out.ok = rec->ok;
    st = copy_u32s(rec->members, rec->n_members, &out.members);
    if (st != GRAFT_OK)
        goto out;
    out.n_members = rec->n_members;
    out.detail = graft__strdup(rec->detail != NULL ? rec->detail : "");
    if (out.detail == NULL) {
        st = GRAFT_ENOMEM;
        goto out;
    }
    *ev_p = out;
    out = (graft_event_t){0};
out:
    graft__mship_event_clear(&out);
    record_free(msg);
    return st;
}

const char *graft_event_kind_string(graft_event_kind_t kind)
{
    switch (kind) {
    case GRAFT_EVENT_JOIN: return "join";
    case GRAFT_EVENT_LEAVE: return "leave";
    case GRAFT_EVENT_LEASE_LOST: return "lease_lost";
    case GRAFT_EVENT_QUORUM_FORMED: return "quorum_formed";
    case GRAFT_EVENT_RECOVERY_ASSIGNED: return "recovery_assigned";
    case GRAFT_EVENT_VOTE_RESULT: return "vote_result";
    case GRAFT_EVENT_RECOVERY_DONE: return "recovery_done";
    case GRAFT_EVENT_CHECKPOINT: return "checkpoint";
    case GRAFT_EVENT_DRIFT: return "drift";
    case GRAFT_EVENT_ERROR: return "error";
    case GRAFT_EVENT_SPARE_PROMOTED: return "spare_promoted";
    }
    return "unknown";
}
