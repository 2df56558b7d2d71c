/*
 * A clean end that a job of several groups can take (docs/RUNTIME.md, "A
 * clean end: the closing step"). A group that commits its closing step
 * (graft_finish()) writes finished/<group> (no lease: it outlives the
 * process) before graft_commit() returns. A group that did not commit its
 * closing step in the same quorum (its vote failed, or it fell back from
 * the steady path while another group closed and left) counts the finished
 * groups toward min_groups in the rounds it forms, so it never waits for a
 * group that ended cleanly; a group that died has no record and is waited
 * for as before. A quorum that only finished groups made possible is for
 * closing: any other step's commit in it votes no ("too few groups").
 */
#include "runtime_internal.h"
#include "../membership/membership_keys.h"

#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

static char *key_finished_folder(const graft_runtime_t *rt)
{
    return graft__key_finished_folder(rt->prefix);
}

static char *key_finished(const graft_runtime_t *rt, uint32_t group)
{
    return graft__key_finished(rt->prefix, group);
}

bool graft_finished(const graft_runtime_t *rt)
{
    return rt != NULL && rt->finished;
}

void graft__rt_finished_clear(graft_runtime_t *rt)
{
    if (rt->rank != 0)
        return;
    char *key = key_finished(rt, rt->group);
    int64_t n = 0;
    if (key != NULL && graft_etcd_delete(rt->etcd, key, false, &n, NULL) != GRAFT_OK)
        GRAFT_WARN(GRAFT_MOD_RUNTIME, "cannot delete %s", key);
    graft_free(key);
}

void graft__rt_finished_publish(graft_runtime_t *rt, uint64_t step)
{
    rt->finished = true;
    if (rt->rank != 0)
        return;
    graft_group_progress_t gp = {.group = rt->group, .step = step,
                                 .unix_ms = graft__wall_ns() / 1000000u,
                                 .quorum_id = rt->prev_quorum_id};
    uint8_t *buf = NULL;
    size_t len = 0;
    char *key = key_finished(rt, rt->group);
    graft_status_t st = key == NULL ? GRAFT_ENOMEM
                                    : graft__rt_group_progress_encode(&gp, &buf, &len);
    if (st == GRAFT_OK)
        st = graft_etcd_put(rt->etcd, key, buf, len, 0, NULL, NULL);
    if (st != GRAFT_OK)
        GRAFT_WARN(GRAFT_MOD_RUNTIME, "group %" PRIu32 ": cannot write %s: %s; the other "
                   "groups will wait for this one", rt->group, key != NULL ? key : "finished",
                   graft_status_string(st));
    else
        GRAFT_INFO(GRAFT_MOD_RUNTIME, "group %" PRIu32 ": ended cleanly at step %" PRIu64,
                   rt->group, step);
    graft_free(buf);
    graft_free(key);
}

void graft__rt_finished_await(graft_runtime_t *rt)
{
    if (rt->rank == 0 || !rt->finished || rt->m == NULL)
        return;
    char *key = key_finished(rt, rt->group);
    uint64_t end = graft__now_ns() + GRAFT__RT_FINISHED_AWAIT_MS * 1000000ull;
    bool seen = false;
    while (key != NULL && !seen && graft__now_ns() < end) {
        graft_etcd_range_result_t res = {0};
        seen = graft_etcd_range(rt->etcd_quick, key, NULL, &res) == GRAFT_OK && res.n_kvs == 1;
        graft_etcd_range_result_clear(&res);
        if (!seen)
            graft__sleep_ns(20000000ull);
    }
    if (!seen)
        GRAFT_WARN(GRAFT_MOD_RUNTIME, "group %" PRIu32 " rank %" PRIu32 ": leaving before rank 0 "
                   "recorded the group's end; a spare may take this slot", rt->group, rt->rank);
    graft_free(key);
}

/* Whether every group of the job is live in this rank's view. */
static bool all_groups_live(graft_runtime_t *rt)
{
    for (uint32_t g = 0; g < rt->groups; g++)
        if (!graft_membership_group_healthy(rt->m, g))
            return false;
    return true;
}

void graft__rt_finished_refresh(graft_runtime_t *rt, bool always)
{
    graft_etcd_range_result_t res;
    graft_etcd_range_opts_t ro = {.prefix = true};
    memset(&res, 0, sizeof(res));
    if (rt->groups < 2 || (!always && all_groups_live(rt)))
        return;
    /* The quick client (short timeout, no retry): an etcd that hangs must
     * not eat the round's time; a failed read is tried at the next short
     * round. */
    char *folder = key_finished_folder(rt);
    if (folder == NULL || graft_etcd_range(rt->etcd_quick, folder, &ro, &res) != GRAFT_OK)
        goto out;
    uint32_t n = 0;
    uint64_t top = 0;
    size_t flen = strlen(folder);
    for (size_t i = 0; i < res.n_kvs; i++) {
        const char *k = res.kvs[i].key;
        char *end = NULL;
        unsigned long g = strtoul(k + flen, &end, 10);
        uint64_t step = 0;
        if (end == k + flen || *end != '\0' || g >= rt->groups || g == rt->group ||
            graft__rt_progress_decode(res.kvs[i].value, res.kvs[i].value_len, &step) != GRAFT_OK)
            continue;
        n++;
        top = GRAFT_MAX(top, step);
    }
    if (n != rt->n_finished)
        GRAFT_INFO(GRAFT_MOD_RUNTIME, "group %" PRIu32 " rank %" PRIu32 ": %" PRIu32
                   " other group(s) ended the job cleanly (at step %" PRIu64 "): not waited for",
                   rt->group, rt->rank, n, top);
    rt->n_finished = n;
    rt->finished_step = top;
    uint32_t min = rt->min_groups > n ? rt->min_groups - n : 1;
    graft_membership_min_groups_set(rt->m, min);
out:
    graft_etcd_range_result_clear(&res);
    graft_free(folder);
}

bool graft__rt_finished_ahead(const graft_runtime_t *rt, const graft_quorum_t *q)
{
    return rt->n_finished > 0 && q->n_members < rt->min_groups && rt->finished_step > q->step;
}
