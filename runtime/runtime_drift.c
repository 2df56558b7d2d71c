/*
 * Replica drift check: every drift_check_every steps, at the commit of step
 * s, rank r of every member group publishes an XXH3-64 per region under
 * drift/<s>/<r>/<group> (a DriftRecord, runtime_records.c) and compares
 * with the other groups' records.
 * Per region the reference is the value most groups hold (ties: the lowest
 * group's). A group that differs from the reference votes no, so it stays
 * at its step and heals from the others at the next quorum; every group
 * that sees a mismatch reports it, naming the regions.
 */
#include "runtime_internal.h"

#include <inttypes.h>
#include <stdlib.h>
#include <stdio.h>
#include <string.h>
#include <xxhash.h>

static graft_status_t publish(graft_runtime_t *rt, uint64_t step, const uint64_t *hashes)
{
    uint8_t *buf = NULL;
    size_t len = 0;
    char *key = graft__rt_key_drift(rt, step, rt->rank, rt->group);
    graft_status_t st = key == NULL ? GRAFT_ENOMEM : graft__rt_drift_encode(rt, hashes, &buf, &len);
    if (st == GRAFT_OK) {
        st = graft_etcd_put(rt->etcd, key, buf, len, 0, NULL, NULL);
        if (st != GRAFT_OK)
            GRAFT_ERROR(GRAFT_MOD_RUNTIME, "drift check: cannot write %s: %s", key,
                        graft_status_string(st));
    }
    graft_free(buf);
    graft_free(key);
    return st;
}

/* Parse one group's record: fills hashes (indexed like rt->regions); a
 * region absent keeps `have` false. */
static graft_status_t parse_record(graft_runtime_t *rt, const graft_etcd_kv_t *kv,
                                   uint32_t *group_p, uint64_t *hashes, bool *have)
{
    graft_status_t st = graft__rt_drift_decode(rt, kv->value, kv->value_len, group_p, hashes, have);
    if (st != GRAFT_OK)
        GRAFT_WARN(GRAFT_MOD_RUNTIME, "drift check: malformed record %s skipped", kv->key);
    return st;
}

graft_status_t graft__rt_drift_check(graft_runtime_t *rt, const graft_quorum_t *q)
{
    size_t n = rt->n_regions, g = q->n_members;
    graft_status_t st = GRAFT_ENOMEM, ret = GRAFT_OK;
    uint64_t *mine = graft__calloc(n, sizeof(*mine));
    uint64_t *all = graft__calloc(n * g, sizeof(*all));
    bool *have = graft__calloc(n * g, sizeof(*have));
    uint32_t *groups = graft__calloc(g, sizeof(*groups));
    char *prefix = graft__rt_key_drift_folder(rt, q->step, rt->rank);
    graft_etcd_range_result_t res;
    char detail[512] = "";
    memset(&res, 0, sizeof(res));
    if (mine == NULL || all == NULL || have == NULL || groups == NULL || prefix == NULL)
        goto out;
    for (size_t i = 0; i < n; i++) {
        const graft_region_t *r = &rt->regions[i].r;
        /* CUDA regions are compared through the transfer's chunk hashes
         * instead; their host view is not addressable here. */
        mine[i] = r->device == GRAFT_DEVICE_HOST ? XXH3_64bits(r->ptr, r->bytes) : 0;
    }
    st = publish(rt, q->step, mine);
    if (st != GRAFT_OK)
        goto out;

    /* Wait for the other members' records. */
    uint64_t deadline = graft__now_ns() + rt->cfg->fence_timeout_ms * 1000000ull;
    graft_etcd_range_opts_t ro = {.prefix = true};
    for (;;) {
        graft_etcd_range_result_clear(&res);
        memset(&res, 0, sizeof(res));
        st = graft_etcd_range(rt->etcd, prefix, &ro, &res);
        if (st == GRAFT_OK && res.n_kvs >= g)
            break;
        if (graft__now_ns() >= deadline) {
            GRAFT_WARN(GRAFT_MOD_RUNTIME, "drift check of step %" PRIu64 ": %zu of %zu groups "
                       "reported; comparing those", q->step, st == GRAFT_OK ? res.n_kvs : 0, g);
            break;
        }
        graft__sleep_ns(2000000ull);
    }
    size_t ng = 0;
    for (size_t k = 0; k < res.n_kvs && ng < g; k++) {
        if (parse_record(rt, &res.kvs[k], &groups[ng], &all[ng * n], &have[ng * n]) == GRAFT_OK)
            ng++;
    }
    size_t mismatched = 0;
    bool i_differ = false;
    for (size_t i = 0; i < n; i++) {
        /* Reference: most common value; ties go to the lowest group (records
         * come sorted by key, so by group for equal-width numbers it is not
         * guaranteed: compare group ids explicitly). */
        uint64_t ref = mine[i];
        size_t best = 0;
        uint32_t best_group = UINT32_MAX;
        bool differ = false;
        for (size_t a = 0; a < ng; a++) {
            if (!have[a * n + i])
                continue;
            size_t cnt = 0;
            for (size_t b = 0; b < ng; b++)
                cnt += have[b * n + i] && all[b * n + i] == all[a * n + i];
            if (cnt > best || (cnt == best && groups[a] < best_group)) {
                best = cnt;
                best_group = groups[a];
                ref = all[a * n + i];
            }
            if (all[a * n + i] != mine[i])
                differ = true;
        }
        if (!differ)
            continue;
        mismatched++;
        size_t used = strlen(detail);
        snprintf(detail + used, sizeof(detail) - used, "%s%s", used > 0 ? "," : "",
                 rt->regions[i].name);
        if (ref != mine[i])
            i_differ = true;
    }
    pthread_mutex_lock(&rt->mu);
    rt->metrics.drift_checks++;
    rt->metrics.drift_mismatches += mismatched > 0;
    pthread_mutex_unlock(&rt->mu);
    st = GRAFT_OK;
    if (mismatched > 0) {
        char msg[640];
        snprintf(msg, sizeof(msg), "step %" PRIu64 " rank %" PRIu32 ": regions differ across "
                 "groups: %s%s", q->step, rt->rank, detail,
                 i_differ ? " (this group differs from the majority)" : "");
        GRAFT_ERROR(GRAFT_MOD_RUNTIME, "replica drift: group %" PRIu32 " %s", rt->group, msg);
        graft_runtime_event_t ev = {.kind = GRAFT_RUNTIME_EVENT_DRIFT, .status = GRAFT_EDRIFT,
                                    .step = q->step, .quorum_id = q->id, .detail = msg};
        graft__rt_emit(rt, &ev);
        graft__rt_job_event(rt, GRAFT_EVENT_DRIFT, q->step, false, 0, msg);
        if (i_differ)
            ret = GRAFT_EDRIFT;
    } else {
        graft_runtime_event_t ev = {.kind = GRAFT_RUNTIME_EVENT_DRIFT, .status = GRAFT_OK,
                                    .step = q->step, .quorum_id = q->id,
                                    .detail = "all groups agree"};
        graft__rt_emit(rt, &ev);
    }
    /* The previous check's records are no longer read by anyone: every
     * member finished it before this quorum could form. */
    if (q->replica_rank == 0 && q->step >= rt->cfg->drift_check_every) {
        char *old =
            graft__rt_key_drift_folder(rt, q->step - rt->cfg->drift_check_every, rt->rank);
        if (old != NULL && graft_etcd_delete(rt->etcd, old, true, NULL, NULL) != GRAFT_OK)
            GRAFT_WARN(GRAFT_MOD_RUNTIME, "could not delete %s", old);
        graft_free(old);
    }
out:
    graft_etcd_range_result_clear(&res);
    graft_free(prefix);
    graft_free(groups);
    graft_free(have);
    graft_free(all);
    graft_free(mine);
    return st != GRAFT_OK ? st : ret;
}
