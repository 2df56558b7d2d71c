/*
 * Spares (docs/RUNTIME.md, "Spares"): a process that did everything a
 * trainer does before its first quorum waits under spares/<rank>/<inc>
 * with a lease of its own, and promotes itself into a vacant slot (g, rank)
 * by one compare-and-swap:
 *
 *   members/<g>/<rank>  does not exist        (the slot is vacant: its old
 *                                              lease lapsed or was revoked)
 *   group_progress/<g>  exists                (g is a group of this job that
 *                                              trained, not a slot whose
 *                                              first process is still coming;
 *                                              or, for a group that died before
 *                                              its first commit, g is in the
 *                                              latest quorum the spare read)
 *   finished/<g>        does not exist        (g did not end cleanly)
 *   spares/<rank>/<inc> is on this spare's lease (it is still a spare)
 *
 * and, if all hold, puts members/<g>/<rank> on its lease and deletes its
 * spare record in the same transaction. So two spares never take one slot
 * (the second compare on members/ fails), and a spare is promoted at most
 * once (its record is gone after the first). The spare then hands its
 * lease and incarnation to graft_membership_create(), which writes the
 * member record on them, and it heals like any replacement.
 *
 * The spare's thread renews the lease itself while it waits; the members'
 * view comes from an observer handle (its watch), so a vacancy is seen as
 * soon as etcd deletes the lapsed record, or the evicted one
 * (graft_membership_evict(), at the end: whoever saw the process die
 * revokes its lease).
 *
 * A group of spares (spare_group: the ranks of one world) is promoted
 * whole: its rank 0 takes every slot of a group whose ranks all died, in
 * one transaction over every slot and every spare record of the world,
 * and the world's other ranks find their promotion as a member record
 * carrying their incarnation.
 */
#include "membership_internal.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* How often the eligible groups (group_progress/, finished/) are read
 * again while some slot of this rank is vacant. */
#define SPARE_LIST_EVERY_NS 250000000ull
/* The longest wait on the view between two looks. */
#define SPARE_POLL_MS 200u

/* What a spare knows of a group's slots (eligible_read()). */
enum {
    ELIGIBLE_NO = 0,      /* not known to be this job's: no slot to fill */
    ELIGIBLE_TRAINED = 1, /* a group_progress record: it committed steps */
    ELIGIBLE_FINISHED = 2, /* it ended the job cleanly: never filled */
    ELIGIBLE_FORMED = 3   /* a member of a formed quorum, no commit recorded */
};

struct graft_membership_spare {
    graft_membership_t *obs; /* observer: the view, the clients, the job prefix */
    uint32_t groups;
    uint32_t rank;
    uint32_t ranks;     /* R */
    char *spare_group;  /* NULL: promoted alone */
    uint32_t ttl_s;
    int64_t lease;
    uint64_t incarnation;
    uint64_t joined_ms;
    char *key;          /* spares/<rank>/<inc> */
    uint64_t renewed_ns;
    bool promoted;
    uint32_t group;
    uint64_t listed_ns; /* when eligible[] was read; 0: never */
    uint8_t *eligible;  /* per group: ELIGIBLE_* */
    bool layout_warned; /* said that its region table is not the live ranks' */
};

static graft_status_t record_encode(const graft_membership_spare_t *sp, uint32_t group,
                                    uint8_t **buf_p, size_t *len_p)
{
    const graft_membership_t *m = sp->obs;
    graft_member_t mem = {
        .group = group,
        .rank = sp->rank,
        .incarnation = sp->incarnation,
        .host = m->host,
        .pid = (int32_t)getpid(),
        .transfer_address = m->transfer_address,
        .layout_hash = m->cfg.layout_hash,
        .committed_step = 0,
        .state = GRAFT_MEMBER_JOINING,
        .lease_id = sp->lease,
        .joined_unix_ms = sp->joined_ms,
        .spare_group = group == UINT32_MAX ? sp->spare_group : NULL,
    };
    return graft__mship_member_encode(&mem, buf_p, len_p);
}

/* A new lease, incarnation and spare record. */
static graft_status_t spare_register(graft_membership_spare_t *sp)
{
    graft_membership_t *m = sp->obs;
    int64_t lease = 0;
    GRAFT__MSHIP_REQ(m);
    graft_status_t st = graft_etcd_lease_grant(m->ops, sp->ttl_s, &lease, NULL);
    if (st != GRAFT_OK)
        return st;
    sp->lease = lease;
    sp->incarnation = GRAFT_MAX(sp->incarnation + 1, graft__wall_ns() / 1000u);
    sp->joined_ms = graft__wall_ns() / 1000000u;
    graft_free(sp->key);
    sp->key = graft__key_spare(m->prefix, sp->rank, sp->incarnation);
    uint8_t *buf = NULL;
    size_t len = 0;
    st = sp->key == NULL ? GRAFT_ENOMEM : record_encode(sp, UINT32_MAX, &buf, &len);
    if (st == GRAFT_OK) {
        GRAFT__MSHIP_REQ(m);
        st = graft_etcd_put(m->ops, sp->key, buf, len, lease, NULL, NULL);
    }
    graft_free(buf);
    if (st != GRAFT_OK) {
        if (graft_etcd_lease_revoke(m->ops, lease) != GRAFT_OK)
            GRAFT_DEBUG(GRAFT_MOD_MEMBERSHIP, "revoking unused lease %" PRId64 " failed", lease);
        sp->lease = 0;
        return st;
    }
    sp->renewed_ns = graft__now_ns();
    GRAFT_INFO(GRAFT_MOD_MEMBERSHIP, "job %s rank %" PRIu32 ": waiting as a spare (incarnation %"
               PRIu64 ")", m->job, sp->rank, sp->incarnation);
    return GRAFT_OK;
}

graft_status_t graft_membership_spare_create(const graft_membership_config_t *config,
                                             uint32_t groups, graft_membership_spare_t **sp_p)
{
    if (config == NULL || sp_p == NULL || groups == 0 || config->observer)
        return GRAFT_EINVAL;
    uint32_t R = config->ranks_per_group == 0 ? 1 : config->ranks_per_group;
    if (config->rank >= R) {
        GRAFT_ERROR(GRAFT_MOD_MEMBERSHIP, "spare: rank %" PRIu32 " outside ranks_per_group %"
                    PRIu32, config->rank, R);
        return GRAFT_EINVAL;
    }
    graft_membership_spare_t *sp = graft__calloc(1, sizeof(*sp));
    if (sp == NULL)
        return GRAFT_ENOMEM;
    sp->groups = groups;
    sp->rank = config->rank;
    sp->ranks = R;
    if (config->spare_group != NULL && config->spare_group[0] != '\0' && R > 1) {
        if (!graft__mship_name_ok(config->spare_group)) {
            GRAFT_ERROR(GRAFT_MOD_MEMBERSHIP, "spare: spare_group must be [A-Za-z0-9_.-]{1,64}");
            graft_free(sp);
            return GRAFT_EINVAL;
        }
        sp->spare_group = graft__strdup(config->spare_group);
        if (sp->spare_group == NULL) {
            graft_free(sp);
            return GRAFT_ENOMEM;
        }
    }
    sp->ttl_s = config->lease_ttl_s == 0 ? 5 : config->lease_ttl_s;
    sp->eligible = graft__calloc(groups, 1);
    graft_membership_config_t oc = *config;
    oc.observer = true;
    graft_status_t st = sp->eligible == NULL ? GRAFT_ENOMEM : graft_membership_create(&oc, &sp->obs);
    if (st == GRAFT_OK)
        st = spare_register(sp);
    if (st != GRAFT_OK) {
        graft_membership_spare_destroy(sp);
        return st;
    }
    *sp_p = sp;
    return GRAFT_OK;
}

void graft_membership_spare_destroy(graft_membership_spare_t *sp)
{
    if (sp == NULL)
        return;
    /* A promoted spare's lease is its member record's now. */
    if (!sp->promoted && sp->lease != 0 && sp->obs != NULL &&
        graft_etcd_lease_revoke(sp->obs->ops, sp->lease) != GRAFT_OK)
        GRAFT_DEBUG(GRAFT_MOD_MEMBERSHIP, "revoking spare lease %" PRId64 " failed", sp->lease);
    graft_membership_destroy(sp->obs);
    graft_free(sp->key);
    graft_free(sp->eligible);
    graft_free(sp->spare_group);
    graft_free(sp);
}

/* Renew the lease every TTL/3; a lease etcd no longer knows (the spare was
 * stopped, or etcd lost it) means a new registration. */
static graft_status_t spare_keepalive(graft_membership_spare_t *sp)
{
    uint64_t now = graft__now_ns();
    if (sp->lease != 0 && now - sp->renewed_ns < sp->ttl_s * 1000000000ull / 3)
        return GRAFT_OK;
    graft_membership_t *m = sp->obs;
    graft_status_t st = GRAFT_ENOTFOUND;
    if (sp->lease != 0) {
        GRAFT__MSHIP_REQ(m);
        st = graft_etcd_lease_keepalive(m->ka, sp->lease, NULL);
    }
    if (st == GRAFT_OK) {
        sp->renewed_ns = now;
        return GRAFT_OK;
    }
    if (st != GRAFT_ENOTFOUND)
        return st; /* no answer: ask again at the next look */
    GRAFT_WARN(GRAFT_MOD_MEMBERSHIP, "job %s rank %" PRIu32 ": spare lease %" PRId64
               " lost; registering again", m->job, sp->rank, sp->lease);
    sp->lease = 0;
    return spare_register(sp);
}

/* Which groups a spare may fill: those with a group_progress record, or in
 * the latest formed quorum, and no finished record. Returns the number of
 * finished groups. */
static graft_status_t eligible_read(graft_membership_spare_t *sp, uint32_t *n_finished_p)
{
    graft_membership_t *m = sp->obs;
    char *folders[2] = {graft__key_group_progress_folder(m->prefix),
                        graft__key_finished_folder(m->prefix)};
    graft_status_t st = folders[0] == NULL || folders[1] == NULL ? GRAFT_ENOMEM : GRAFT_OK;
    memset(sp->eligible, 0, sp->groups);
    for (int f = 0; f < 2 && st == GRAFT_OK; f++) {
        graft_etcd_range_opts_t opts = {.prefix = true, .keys_only = true};
        graft_etcd_range_result_t res = {0};
        GRAFT__MSHIP_REQ(m);
        st = graft_etcd_range(m->ops, folders[f], &opts, &res);
        graft__mkey_kind_t want = f == 0 ? GRAFT__MKEY_GROUP_PROGRESS : GRAFT__MKEY_FINISHED;
        for (size_t i = 0; st == GRAFT_OK && i < res.n_kvs; i++) {
            graft__mkey_t k = graft__mship_key_parse(m->prefix, res.kvs[i].key);
            if (k.kind != want || k.number >= sp->groups)
                continue; /* not a group of this job's size: not ours to fill */
            uint32_t g = (uint32_t)k.number;
            sp->eligible[g] = f == 0 && sp->eligible[g] != ELIGIBLE_FINISHED ? ELIGIBLE_TRAINED
                                                                             : ELIGIBLE_FINISHED;
        }
        graft_etcd_range_result_clear(&res);
    }
    graft_free(folders[0]);
    graft_free(folders[1]);
    graft_quorum_t *q = NULL;
    if (st == GRAFT_OK && graft_membership_quorum_latest(m, &q) == GRAFT_OK) {
        for (size_t i = 0; i < q->n_members; i++)
            if (q->members[i] < sp->groups && sp->eligible[q->members[i]] == ELIGIBLE_NO)
                sp->eligible[q->members[i]] = ELIGIBLE_FORMED;
        graft_membership_quorum_free(q);
    }
    uint32_t n = 0;
    for (uint32_t g = 0; g < sp->groups; g++)
        n += sp->eligible[g] == ELIGIBLE_FINISHED;
    *n_finished_p = n;
    if (st == GRAFT_OK)
        sp->listed_ns = graft__now_ns();
    return st;
}

/* The promotion's compare on group_progress/<g>: its create revision above
 * 0 (the record exists) for a group known by it; above -1, which always
 * holds, for one known from a formed quorum only. */
static int64_t progress_floor(const graft_membership_spare_t *sp, uint32_t g)
{
    return sp->eligible[g] == ELIGIBLE_TRAINED ? 0 : -1;
}

/* Is members/<g>/<rank> ours? (After a transaction whose answer was lost.) */
static bool slot_is_ours(graft_membership_spare_t *sp, const char *key)
{
    graft_etcd_range_result_t res = {0};
    graft_etcd_range_opts_t opts = {0};
    GRAFT__MSHIP_REQ(sp->obs);
    bool ours = false;
    if (graft_etcd_range(sp->obs->ops, key, &opts, &res) == GRAFT_OK && res.n_kvs == 1) {
        graft_member_t mem;
        if (graft__mship_member_decode(res.kvs[0].value, res.kvs[0].value_len, &mem) == GRAFT_OK) {
            ours = mem.incarnation == sp->incarnation && mem.lease_id == sp->lease;
            graft__mship_member_clear(&mem);
        }
    }
    graft_etcd_range_result_clear(&res);
    return ours;
}

/* The compare-and-swap above; *won_p false when a compare failed (the slot
 * or this spare's record was changed by someone else). */
static graft_status_t try_promote(graft_membership_spare_t *sp, uint32_t group, bool *won_p)
{
    graft_membership_t *m = sp->obs;
    char *member = graft__key_member(m->prefix, group, sp->rank);
    char *progress = graft__key_group_progress(m->prefix, group);
    char *finished = graft__key_finished(m->prefix, group);
    uint8_t *buf = NULL;
    size_t len = 0;
    graft_status_t st = member == NULL || progress == NULL || finished == NULL
                            ? GRAFT_ENOMEM
                            : record_encode(sp, group, &buf, &len);
    if (st == GRAFT_OK) {
        graft_etcd_compare_t cmps[] = {
            {.key = member, .target = GRAFT_ETCD_CMP_CREATE, .op = GRAFT_ETCD_CMP_EQUAL, .number = 0},
            {.key = progress, .target = GRAFT_ETCD_CMP_CREATE, .op = GRAFT_ETCD_CMP_GREATER,
             .number = progress_floor(sp, group)},
            {.key = finished, .target = GRAFT_ETCD_CMP_CREATE, .op = GRAFT_ETCD_CMP_EQUAL,
             .number = 0},
            {.key = sp->key, .target = GRAFT_ETCD_CMP_LEASE, .op = GRAFT_ETCD_CMP_EQUAL,
             .number = sp->lease},
        };
        graft_etcd_op_t ops[] = {
            {.type = GRAFT_ETCD_OP_PUT, .key = member, .value = buf, .value_len = len,
             .lease = sp->lease},
            {.type = GRAFT_ETCD_OP_DELETE, .key = sp->key},
        };
        graft_etcd_txn_result_t res = {0};
        GRAFT__MSHIP_REQ(m);
        st = graft_etcd_txn(m->ops, cmps, GRAFT_ARRAY_SIZE(cmps), ops, GRAFT_ARRAY_SIZE(ops), NULL,
                            0, &res);
        *won_p = st == GRAFT_OK && res.succeeded;
        graft_etcd_txn_result_clear(&res);
        /* The answer may have been lost after etcd applied it. */
        if (st != GRAFT_OK && slot_is_ours(sp, member)) {
            *won_p = true;
            st = GRAFT_OK;
        }
    }
    graft_free(buf);
    graft_free(member);
    graft_free(progress);
    graft_free(finished);
    return st;
}

static void promoted_event(graft_membership_spare_t *sp)
{
    char detail[192];
    if (sp->spare_group != NULL)
        snprintf(detail, sizeof(detail), "spare promoted (pid %d) with its group of spares %s",
                 (int)getpid(), sp->spare_group);
    else
        snprintf(detail, sizeof(detail), "spare promoted (pid %d)", (int)getpid());
    graft_event_t ev = {.kind = GRAFT_EVENT_SPARE_PROMOTED, .group = sp->group, .rank = sp->rank,
                        .incarnation = sp->incarnation, .detail = detail};
    if (graft__mship_event_put(sp->obs, &ev) != GRAFT_OK)
        GRAFT_DEBUG(GRAFT_MOD_MEMBERSHIP, "spare_promoted event not recorded");
}

/* The group of spares' records, one per rank, newest first where a rank
 * registered twice; false while some rank has none. */
static bool group_records(graft_membership_spare_t *sp, const graft_member_t *list, size_t n,
                          const graft_member_t **recs)
{
    for (uint32_t r = 0; r < sp->ranks; r++)
        recs[r] = NULL;
    for (size_t i = 0; i < n; i++) {
        const graft_member_t *m = &list[i];
        if (m->rank >= sp->ranks || m->spare_group == NULL ||
            strcmp(m->spare_group, sp->spare_group) != 0)
            continue;
        if (recs[m->rank] == NULL || m->incarnation > recs[m->rank]->incarnation)
            recs[m->rank] = m;
    }
    for (uint32_t r = 0; r < sp->ranks; r++)
        if (recs[r] == NULL)
            return false;
    return recs[sp->rank]->incarnation == sp->incarnation; /* this rank 0 is the group's */
}

/* The whole-group compare-and-swap: every slot of group g vacant, g trained
 * and not finished, every spare of the group still registered on its
 * lease; then each slot's record on its spare's lease, every spare record
 * deleted. */
static graft_status_t try_promote_group(graft_membership_spare_t *sp, uint32_t g,
                                        const graft_member_t **recs, bool *won_p)
{
    graft_membership_t *m = sp->obs;
    uint32_t R = sp->ranks;
    size_t n_keys = 2u * R + 2u;
    char **keys = graft__calloc(n_keys, sizeof(*keys));
    uint8_t **bufs = graft__calloc(R, sizeof(*bufs));
    size_t *lens = graft__calloc(R, sizeof(*lens));
    graft_etcd_compare_t *cmps = graft__calloc(n_keys, sizeof(*cmps));
    graft_etcd_op_t *ops = graft__calloc(2u * R, sizeof(*ops));
    graft_status_t st = keys && bufs && lens && cmps && ops ? GRAFT_OK : GRAFT_ENOMEM;
    for (uint32_t r = 0; st == GRAFT_OK && r < R; r++) {
        graft_member_t rec = *recs[r];
        rec.group = g;
        rec.state = GRAFT_MEMBER_JOINING;
        rec.spare_group = NULL;
        keys[r] = graft__key_member(m->prefix, g, r);
        keys[R + r] = graft__key_spare(m->prefix, r, recs[r]->incarnation);
        if (keys[r] == NULL || keys[R + r] == NULL)
            st = GRAFT_ENOMEM;
        else
            st = graft__mship_member_encode(&rec, &bufs[r], &lens[r]);
        cmps[r] = (graft_etcd_compare_t){.key = keys[r], .target = GRAFT_ETCD_CMP_CREATE,
                                         .op = GRAFT_ETCD_CMP_EQUAL, .number = 0};
        cmps[R + r] = (graft_etcd_compare_t){.key = keys[R + r], .target = GRAFT_ETCD_CMP_LEASE,
                                             .op = GRAFT_ETCD_CMP_EQUAL,
                                             .number = recs[r]->lease_id};
        ops[r] = (graft_etcd_op_t){.type = GRAFT_ETCD_OP_PUT, .key = keys[r], .value = bufs[r],
                                   .value_len = lens[r], .lease = recs[r]->lease_id};
        ops[R + r] = (graft_etcd_op_t){.type = GRAFT_ETCD_OP_DELETE, .key = keys[R + r]};
    }
    if (st == GRAFT_OK) {
        keys[2 * R] = graft__key_group_progress(m->prefix, g);
        keys[2 * R + 1] = graft__key_finished(m->prefix, g);
        if (keys[2 * R] == NULL || keys[2 * R + 1] == NULL)
            st = GRAFT_ENOMEM;
        cmps[2 * R] = (graft_etcd_compare_t){.key = keys[2 * R], .target = GRAFT_ETCD_CMP_CREATE,
                                             .op = GRAFT_ETCD_CMP_GREATER,
                                             .number = progress_floor(sp, g)};
        cmps[2 * R + 1] = (graft_etcd_compare_t){.key = keys[2 * R + 1],
                                                 .target = GRAFT_ETCD_CMP_CREATE,
                                                 .op = GRAFT_ETCD_CMP_EQUAL, .number = 0};
    }
    if (st == GRAFT_OK) {
        graft_etcd_txn_result_t res = {0};
        GRAFT__MSHIP_REQ(m);
        st = graft_etcd_txn(m->ops, cmps, n_keys, ops, 2u * R, NULL, 0, &res);
        *won_p = st == GRAFT_OK && res.succeeded;
        graft_etcd_txn_result_clear(&res);
        if (st != GRAFT_OK && slot_is_ours(sp, keys[sp->rank])) {
            *won_p = true;
            st = GRAFT_OK;
        }
    }
    for (size_t i = 0; keys != NULL && i < n_keys; i++)
        graft_free(keys[i]);
    for (uint32_t r = 0; bufs != NULL && r < R; r++)
        graft_free(bufs[r]);
    graft_free(keys);
    graft_free(bufs);
    graft_free(lens);
    graft_free(cmps);
    graft_free(ops);
    return st;
}

static bool fillable(const graft_membership_spare_t *sp, uint32_t g)
{
    return sp->eligible[g] == ELIGIBLE_TRAINED || sp->eligible[g] == ELIGIBLE_FORMED;
}

/* What one look at the view says for this spare. */
typedef struct spare_view {
    bool *held;           /* per group: its slot of this spare's rank has a member */
    bool *any;            /* per group: some slot has a member */
    uint64_t *layout;     /* per rank: a live member's region table (0: none live) */
    bool mine;            /* a member record carries this spare's incarnation and lease */
    uint32_t mine_group;
} spare_view_t;

static void spare_view_free(spare_view_t *sv)
{
    graft_free(sv->held);
    graft_free(sv->any);
    graft_free(sv->layout);
}

static graft_status_t spare_view_read(graft_membership_spare_t *sp, spare_view_t *sv)
{
    graft_membership_view_t *v = NULL;
    graft_status_t st = graft_membership_view_get(sp->obs, &v);
    if (st != GRAFT_OK)
        return st;
    *sv = (spare_view_t){0};
    sv->held = graft__calloc(sp->groups, sizeof(*sv->held));
    sv->any = graft__calloc(sp->groups, sizeof(*sv->any));
    sv->layout = graft__calloc(sp->ranks, sizeof(*sv->layout));
    if (sv->held == NULL || sv->any == NULL || sv->layout == NULL) {
        graft_membership_view_free(v);
        spare_view_free(sv);
        return GRAFT_ENOMEM;
    }
    for (size_t i = 0; i < v->n_members; i++) {
        const graft_member_t *mem = &v->members[i];
        if (mem->incarnation == sp->incarnation && mem->lease_id == sp->lease &&
            mem->rank == sp->rank) {
            sv->mine = true; /* our group's rank 0 promoted us */
            sv->mine_group = mem->group;
        }
        if (mem->group < sp->groups) {
            sv->any[mem->group] = true;
            if (mem->rank == sp->rank)
                sv->held[mem->group] = true;
        }
        if (mem->rank < sp->ranks && sv->layout[mem->rank] == 0)
            sv->layout[mem->rank] = mem->layout_hash;
    }
    graft_membership_view_free(v);
    return GRAFT_OK;
}

/* A spare whose region table differs from its rank's live members' would
 * take a slot no donor serves: it stays a spare and says why (once). */
static bool layout_refused(graft_membership_spare_t *sp, uint32_t rank, uint64_t spare_layout,
                           const spare_view_t *sv)
{
    uint64_t theirs = sv->layout[rank];
    if (theirs == 0 || theirs == spare_layout)
        return false;
    if (!sp->layout_warned)
        GRAFT_ERROR(GRAFT_MOD_MEMBERSHIP, "job %s: the region table of a spare of rank %" PRIu32
                    " (layout %016" PRIx64 ") differs from rank %" PRIu32 "'s live members' (%016"
                    PRIx64 "): it takes no slot", sp->obs->job, rank, spare_layout, rank, theirs);
    sp->layout_warned = true;
    return true;
}

/* A lone spare: the vacant slots of its rank it may fill, lowest group
 * first. */
static graft_status_t promote_alone(graft_membership_spare_t *sp, const spare_view_t *sv)
{
    graft_status_t st = GRAFT_OK;
    for (uint32_t g = 0; st == GRAFT_OK && g < sp->groups && !sp->promoted; g++) {
        if (sv->held[g] || !fillable(sp, g))
            continue;
        bool won = false;
        st = try_promote(sp, g, &won);
        if (won) {
            sp->promoted = true;
            sp->group = g;
        }
    }
    return st;
}

/* Rank 0 of a group of spares: a group all of whose slots are vacant, once
 * every rank of the group of spares is registered. */
static graft_status_t promote_group(graft_membership_spare_t *sp, const spare_view_t *sv)
{
    bool due = false;
    for (uint32_t g = 0; g < sp->groups && !due; g++)
        due = !sv->any[g] && fillable(sp, g);
    if (!due)
        return GRAFT_OK;
    graft_member_t *list = NULL;
    size_t n = 0;
    graft_status_t st = graft_membership_spares_list(sp->obs, &list, &n);
    const graft_member_t **recs = graft__calloc(sp->ranks, sizeof(*recs));
    if (st == GRAFT_OK && recs == NULL)
        st = GRAFT_ENOMEM;
    bool whole = st == GRAFT_OK && group_records(sp, list, n, recs);
    for (uint32_t r = 0; whole && r < sp->ranks; r++)
        whole = !layout_refused(sp, r, recs[r]->layout_hash, sv);
    for (uint32_t g = 0; whole && st == GRAFT_OK && g < sp->groups && !sp->promoted; g++) {
        if (sv->any[g] || !fillable(sp, g))
            continue;
        bool won = false;
        st = try_promote_group(sp, g, recs, &won);
        if (won) {
            sp->promoted = true;
            sp->group = g;
        }
    }
    graft_free(recs);
    graft_membership_spares_free(list, n);
    return st;
}

/* One look at the view: promoted by our group of spares' rank 0 already?
 * Every group finished? Else a promotion tried where one is due. */
static graft_status_t look_once(graft_membership_spare_t *sp, bool *finished_p)
{
    spare_view_t sv;
    graft_status_t st = spare_view_read(sp, &sv);
    if (st != GRAFT_OK)
        return st;
    if (sv.mine) {
        sp->promoted = true;
        sp->group = sv.mine_group;
        spare_view_free(&sv);
        return GRAFT_OK;
    }
    bool vacancy = false;
    for (uint32_t g = 0; g < sp->groups && !vacancy; g++)
        vacancy = !sv.held[g];
    uint64_t now = graft__now_ns();
    if (vacancy && (sp->listed_ns == 0 || now - sp->listed_ns >= SPARE_LIST_EVERY_NS)) {
        uint32_t n_finished = 0;
        st = eligible_read(sp, &n_finished);
        *finished_p = st == GRAFT_OK && n_finished == sp->groups;
    }
    if (st == GRAFT_OK && vacancy && !layout_refused(sp, sp->rank, sp->obs->cfg.layout_hash, &sv)) {
        sp->layout_warned = false;
        if (sp->spare_group == NULL)
            st = promote_alone(sp, &sv);
        else if (sp->rank == 0)
            st = promote_group(sp, &sv);
        /* the other ranks of a group of spares wait for its rank 0 */
    }
    spare_view_free(&sv);
    return st;
}

graft_status_t graft_membership_spare_wait(graft_membership_spare_t *sp, uint32_t timeout_ms,
                                           uint32_t *group_p)
{
    if (sp == NULL || group_p == NULL)
        return GRAFT_EINVAL;
    uint64_t deadline = timeout_ms == 0 ? UINT64_MAX : graft__now_ns() + timeout_ms * 1000000ull;
    uint64_t version = 0;
    while (!sp->promoted) {
        bool finished = false;
        graft_status_t st = spare_keepalive(sp);
        if (st == GRAFT_OK && sp->lease != 0)
            st = look_once(sp, &finished);
        if (st != GRAFT_OK && st != GRAFT_ENOMEM)
            GRAFT_DEBUG(GRAFT_MOD_MEMBERSHIP, "spare: %s; looking again", graft_status_string(st));
        if (st == GRAFT_ENOMEM)
            return st;
        if (sp->promoted)
            break;
        if (finished) {
            GRAFT_INFO(GRAFT_MOD_MEMBERSHIP, "job %s: every group finished; spare of rank %"
                       PRIu32 " not needed", sp->obs->job, sp->rank);
            return GRAFT_ECANCELED;
        }
        uint64_t now = graft__now_ns();
        if (now >= deadline)
            return GRAFT_ETIMEOUT;
        uint64_t left_ms = (deadline - now) / 1000000u;
        uint32_t wait_ms = (uint32_t)GRAFT_MIN((uint64_t)SPARE_POLL_MS, left_ms + 1);
        graft_status_t wst = graft_membership_view_wait(sp->obs, version, wait_ms, &version);
        (void)wst; /* a change or the poll interval: look again either way */
    }
    GRAFT_INFO(GRAFT_MOD_MEMBERSHIP, "job %s: spare (incarnation %" PRIu64 ") promoted to group %"
               PRIu32 " rank %" PRIu32, sp->obs->job, sp->incarnation, sp->group, sp->rank);
    promoted_event(sp);
    *group_p = sp->group;
    return GRAFT_OK;
}

void graft_membership_spare_adopt(const graft_membership_spare_t *sp,
                                  graft_membership_config_t *config)
{
    if (sp == NULL || config == NULL || !sp->promoted)
        return;
    config->group = sp->group;
    config->rank = sp->rank;
    config->adopt_lease = sp->lease;
    config->adopt_incarnation = sp->incarnation;
}

graft_status_t graft_membership_spare_view_get(graft_membership_spare_t *sp,
                                              graft_membership_view_t **view_p)
{
    if (sp == NULL || view_p == NULL)
        return GRAFT_EINVAL;
    return graft_membership_view_get(sp->obs, view_p);
}

graft_status_t graft_membership_spares_list(graft_membership_t *m, graft_member_t **spares_p,
                                            size_t *n_p)
{
    if (m == NULL || spares_p == NULL || n_p == NULL)
        return GRAFT_EINVAL;
    *spares_p = NULL;
    *n_p = 0;
    char *folder = graft__key_spares_folder(m->prefix);
    if (folder == NULL)
        return GRAFT_ENOMEM;
    graft_etcd_range_opts_t opts = {.prefix = true};
    graft_etcd_range_result_t res = {0};
    GRAFT__MSHIP_REQ(m);
    graft_status_t st = graft_etcd_range(m->ops, folder, &opts, &res);
    graft_free(folder);
    graft_member_t *list = NULL;
    size_t n = 0;
    if (st == GRAFT_OK && res.n_kvs > 0) {
        list = graft__calloc(res.n_kvs, sizeof(*list));
        if (list == NULL)
            st = GRAFT_ENOMEM;
    }
    for (size_t i = 0; st == GRAFT_OK && i < res.n_kvs; i++) {
        /* A record that does not decode is not a spare anyone can use. */
        if (graft__mship_member_decode(res.kvs[i].value, res.kvs[i].value_len, &list[n]) ==
            GRAFT_OK)
            n++;
    }
    graft_etcd_range_result_clear(&res);
    if (st != GRAFT_OK) {
        graft_membership_spares_free(list, n);
        return st;
    }
    *spares_p = list;
    *n_p = n;
    return GRAFT_OK;
}

void graft_membership_spares_free(graft_member_t *spares, size_t n)
{
    for (size_t i = 0; spares != NULL && i < n; i++)
        graft__mship_member_clear(&spares[i]);
    graft_free(spares);
}

graft_status_t graft_membership_evict(graft_membership_t *m, uint32_t group, uint32_t rank,
                                      const char *host, int32_t pid)
{
    if (m == NULL || host == NULL || pid <= 0)
        return GRAFT_EINVAL;
    char *key = graft__key_member(m->prefix, group, rank);
    if (key == NULL)
        return GRAFT_ENOMEM;
    graft_etcd_range_result_t res = {0};
    graft_etcd_range_opts_t opts = {0};
    GRAFT__MSHIP_REQ(m);
    graft_status_t st = graft_etcd_range(m->ops, key, &opts, &res);
    graft_member_t mem = {0};
    bool decoded = false;
    if (st == GRAFT_OK && res.n_kvs == 0)
        st = GRAFT_ENOTFOUND;
    if (st == GRAFT_OK) {
        st = graft__mship_member_decode(res.kvs[0].value, res.kvs[0].value_len, &mem);
        decoded = st == GRAFT_OK;
    }
    /* Only the record of the process that died: a replacement or spare
     * that already took the slot is not touched. */
    if (st == GRAFT_OK && (mem.pid != pid || mem.host == NULL || strcmp(mem.host, host) != 0))
        st = GRAFT_ESTATE;
    if (st == GRAFT_OK) {
        GRAFT__MSHIP_REQ(m);
        st = graft_etcd_lease_revoke(m->ops, mem.lease_id);
        if (st == GRAFT_OK)
            GRAFT_INFO(GRAFT_MOD_MEMBERSHIP, "job %s: evicted group %" PRIu32 " rank %" PRIu32
                       " (pid %d on %s, lease %" PRId64 ")", m->job, group, rank, (int)pid, host,
                       mem.lease_id);
    }
    if (decoded)
        graft__mship_member_clear(&mem);
    graft_etcd_range_result_clear(&res);
    graft_free(key);
    return st;
}
