/*
 * Joining the job (the coordinator's, at the first graft_quorum() and after
 * an in-place restart): the member record and the start-up decision
 * (donors, else disk, else cold; docs/RUNTIME.md "Start-up decision"). A
 * runtime started with spare = 1 (docs/RUNTIME.md, "Spares") has its
 * endpoint up and its regions registered, but no group: it first waits in
 * membership (membership_spare.c) until it took a dead rank's slot, then
 * takes up that group (the endpoint's group, the step channel, the
 * checkpoint writer) and joins on the slot's record like a replacement.
 */
#include "runtime_internal.h"
#include "runtime_channel.h"
#include "../membership/membership_keys.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* What speaks for the group: its step channel and its checkpoint writer.
 * A spare opens them once it knows its group. */
graft_status_t graft__rt_group_open(graft_runtime_t *rt)
{
    graft_status_t st = graft__channel_create(rt->ep, rt->secret, rt->secret_len, rt->group,
                                              rt->rank, &rt->channel);
    if (st == GRAFT_OK)
        st = graft__rt_persist_open(rt);
    return st;
}

graft_status_t graft__rt_spare_promote(graft_runtime_t *rt, graft_membership_config_t *mc)
{
    graft_membership_spare_t *sp = NULL;
    uint32_t group = 0;
    graft_status_t st = graft_membership_spare_create(mc, rt->groups, &sp);
    if (st == GRAFT_OK && rt->cfg->spare_follow)
        st = graft__rt_follow_start(rt, sp);
    if (st == GRAFT_OK)
        st = graft_membership_spare_wait(sp, 0, &group);
    /* The step the follower holds: the spare joins with it (and pulls only
     * if the job is past it); 0 when it holds none. */
    uint64_t followed = graft__rt_follow_stop(rt);
    if (st == GRAFT_ECANCELED)
        rt->finished = true; /* the job ended without needing this spare */
    if (st != GRAFT_OK) {
        if (st != GRAFT_ECANCELED)
            GRAFT_ERROR(GRAFT_MOD_RUNTIME, "spare of rank %" PRIu32 " in job %s: %s", rt->rank,
                        rt->cfg->job, graft_status_string(st));
        graft_membership_spare_destroy(sp);
        return st;
    }
    graft_membership_spare_adopt(sp, mc);
    if (followed > 0) {
        rt->state_valid = true;
        rt->need_state = false;
        graft__rt_set_step(rt, followed);
        mc->committed_step = followed;
    }
    /* Freed at graft_destroy(): its watches take up to a poll interval
     * (200 ms) to stop, which the recovery must not wait for. */
    rt->spare = sp;
    rt->group = group;
    /* The recovery is timed from here: the wait before it was no failure's. */
    rt->start_ns = graft__now_ns();
    st = graft_transfer_endpoint_group_set(rt->ep, group);
    if (st == GRAFT_OK)
        st = graft__rt_group_open(rt);
    if (st != GRAFT_OK) {
        GRAFT_ERROR(GRAFT_MOD_RUNTIME, "spare promoted to group %" PRIu32 " rank %" PRIu32
                    " cannot take it up: %s", group, rt->rank, graft_status_string(st));
        return st;
    }
    char detail[64];
    snprintf(detail, sizeof(detail), "group %" PRIu32 " rank %" PRIu32, group, rt->rank);
    graft_runtime_event_t ev = {.kind = GRAFT_RUNTIME_EVENT_SPARE_PROMOTED, .detail = detail};
    graft__rt_emit(rt, &ev);
    return GRAFT_OK;
}

static uint32_t lease_ttl_s(const graft_runtime_t *rt)
{
    uint64_t s = (rt->cfg->lease_ttl_ms + 999) / 1000;
    return (uint32_t)GRAFT_MAX(1u, s);
}

/* Is there a group other than ours whose ranks are all healthy (they
 * committed a step together) and hold committed state? Then this group
 * starts by pulling from it. A rank that merely restored is not counted:
 * its group may still be deciding, and the quorum sorts that out. */
static bool donors_exist(graft_runtime_t *rt)
{
    graft_membership_view_t *v = NULL;
    bool found = false;
    if (graft_membership_view_get(rt->m, &v) != GRAFT_OK)
        return false;
    for (size_t i = 0; i < v->n_members && !found;) {
        size_t j = i, healthy = 0;
        while (j < v->n_members && v->members[j].group == v->members[i].group) {
            const graft_member_t *mb = &v->members[j];
            /* A rank that cannot serve still holds the job's step. */
            healthy += (mb->state == GRAFT_MEMBER_HEALTHY ||
                        mb->state == GRAFT_MEMBER_CANNOT_SERVE) && mb->committed_step > 0;
            j++;
        }
        found = v->members[i].group != rt->group && healthy == rt->ranks;
        i = j;
    }
    graft_membership_view_free(v);
    return found;
}

/* Has this job committed steps before? The `progress` key (written by
 * every process at its first committed step) and the checkpoint records
 * outlive every member. The latest quorum record cannot tell: a failed
 * start of new processes replaces it with a round at their step 0. The
 * number returned is the step in the progress key (0 if absent). */
static graft_status_t job_progress(graft_runtime_t *rt, uint64_t *progress_step_p,
                                   int64_t *n_checkpoints_p)
{
    graft_etcd_range_result_t res;
    graft_etcd_range_opts_t ro = {.prefix = true, .count_only = true};
    graft_etcd_kv_t kv;
    uint64_t pstep = 0;
    char *ckey = NULL, *pkey = NULL;
    graft_status_t st = GRAFT_ENOMEM;
    memset(&res, 0, sizeof(res));
    memset(&kv, 0, sizeof(kv));
    pkey = graft__rt_key_progress(rt);
    ckey = graft__key_checkpoints_folder(rt->prefix);
    if (pkey == NULL || ckey == NULL)
        goto out;
    st = graft_etcd_get(rt->etcd, pkey, &kv, NULL);
    if (st == GRAFT_OK) {
        /* A record that does not decode still says the job progressed. */
        st = graft__rt_progress_decode(kv.value, kv.value_len, &pstep);
        if (st == GRAFT_ENOMEM)
            goto out;
        if (st != GRAFT_OK)
            GRAFT_WARN(GRAFT_MOD_RUNTIME, "%s: %s; taking the job as progressed", pkey,
                       graft_status_string(st));
        pstep = GRAFT_MAX(pstep, 1u);
        st = GRAFT_OK;
    } else if (st != GRAFT_ENOTFOUND) {
        GRAFT_ERROR(GRAFT_MOD_RUNTIME, "cannot read %s: %s", pkey, graft_status_string(st));
        goto out;
    }
    st = graft_etcd_range(rt->etcd, ckey, &ro, &res);
    if (st != GRAFT_OK) {
        GRAFT_ERROR(GRAFT_MOD_RUNTIME, "cannot read %s: %s", ckey, graft_status_string(st));
        goto out;
    }
    *progress_step_p = pstep;
    *n_checkpoints_p = res.count;
out:
    graft_etcd_range_result_clear(&res);
    graft_etcd_kv_clear(&kv);
    graft_free(ckey);
    graft_free(pkey);
    return st;
}

graft_status_t graft__rt_join(graft_runtime_t *rt)
{
    graft_status_t st;
    if (rt->n_regions == 0) {
        GRAFT_ERROR(GRAFT_MOD_RUNTIME, "graft_quorum: register the regions first");
        return GRAFT_EINVAL;
    }
    st = graft__rt_skip_resolve(rt);
    if (st != GRAFT_OK)
        return st;
    st = graft_transfer_layout_hash(rt->ep, &rt->layout_hash);
    if (st != GRAFT_OK)
        return st;
    graft_membership_config_t mc = {
        .job = rt->cfg->job,
        .etcd = &rt->etcd_cfg,
        .group = rt->group,
        .rank = rt->rank,
        .ranks_per_group = rt->ranks,
        .min_groups = rt->min_groups,
        .lease_ttl_s = lease_ttl_s(rt),
        .join_timeout_ms = (uint32_t)rt->cfg->join_timeout_ms,
        .transfer_address = graft_transfer_endpoint_address(rt->ep),
        .layout_hash = rt->layout_hash,
        .committed_step = 0,
        .state = GRAFT_MEMBER_JOINING,
        .spare_group = rt->cfg->spare_group,
    };
    bool followed = false;
    if (rt->cfg->spare) {
        st = graft__rt_spare_promote(rt, &mc);
        if (st != GRAFT_OK)
            return st;
        followed = rt->follow.step > 0; /* graft__rt_follow_stop()'s */
    }
    graft_membership_t *m = NULL;
    st = graft_membership_create(&mc, &m);
    pthread_mutex_lock(&rt->mu); /* graft_metrics_get() reads it from any thread */
    rt->m = m;
    pthread_mutex_unlock(&rt->mu);
    if (st != GRAFT_OK) {
        GRAFT_ERROR(GRAFT_MOD_RUNTIME, "group %" PRIu32 " rank %" PRIu32 ": cannot join job %s: %s",
                    rt->group, rt->rank, rt->cfg->job, graft_status_string(st));
        return st;
    }
    rt->joined = true;
    graft__rt_finished_clear(rt); /* an earlier run's clean end is not this one's */
    uint64_t joined_ns = graft__now_ns();
    rt->heal_detect_ns = joined_ns - rt->start_ns;
    if (rt->restarted) {
        /* In place (graft_restart()): the regions hold the committed step
         * unless a heal was cancelled; the quorum says whether the job
         * moved on. */
        rt->restarted = false;
        rt->need_state = rt->need_state || !rt->state_valid;
        return GRAFT_OK;
    }
    if (followed) {
        /* A follower holds a step it pulled and verified: the quorum says
         * whether the job is past it (then it heals like any replacement). */
        pthread_mutex_lock(&rt->mu);
        rt->start_kind = GRAFT_START_PEER;
        pthread_mutex_unlock(&rt->mu);
        GRAFT_INFO(GRAFT_MOD_RUNTIME, "group %" PRIu32 " rank %" PRIu32 ": start: followed to "
                   "step %" PRIu64, rt->group, rt->rank, graft_step(rt));
        return GRAFT_OK;
    }

    /* The start-up decision (docs/RUNTIME.md): donors, else disk, else cold. */
    graft_start_kind_t kind = GRAFT_START_COLD;
    uint64_t step = 0;
    if (donors_exist(rt)) {
        kind = GRAFT_START_PEER;
        rt->state_valid = false;
        rt->need_state = true;
    } else if (rt->cfg->persist_root != NULL) {
        st = graft__rt_restore(rt, &step);
        if (st == GRAFT_OK) {
            /* HEALTHY is published after the first commit, once the whole
             * group has agreed on this state. */
            kind = GRAFT_START_RESTORE;
        } else if (st == GRAFT_ENOCHECKPOINT) {
            st = GRAFT_OK;
        } else {
            return st;
        }
    }
    if (kind == GRAFT_START_COLD) {
        /* A cold start is only for a new job. One that has committed steps
         * must get its state from a group that holds it (which may come up
         * after us, e.g. restoring) or fail at the first quorum: starting
         * over from the trainer's initial state would silently lose them. */
        uint64_t pstep = 0;
        int64_t n_ckpt = 0;
        st = job_progress(rt, &pstep, &n_ckpt);
        if (st != GRAFT_OK)
            return st;
        if (pstep > 0 || n_ckpt > 0) {
            GRAFT_WARN(GRAFT_MOD_RUNTIME,
                       "group %" PRIu32 " rank %" PRIu32 ": job %s has committed "
                       "steps (progress at step %" PRIu64 ", %" PRId64 " checkpoint records) "
                       "but no donor and no valid checkpoint: not a cold start; the state must "
                       "come from a group at the first quorum", rt->group, rt->rank, rt->cfg->job,
                       pstep, n_ckpt);
            kind = GRAFT_START_PEER;
            rt->state_valid = false;
            rt->need_state = true;
        }
    }
    graft__rt_set_step(rt, step);
    pthread_mutex_lock(&rt->mu);
    rt->start_kind = kind;
    pthread_mutex_unlock(&rt->mu);
    GRAFT_INFO(GRAFT_MOD_RUNTIME, "group %" PRIu32 " rank %" PRIu32 ": start: %s at step %" PRIu64,
               rt->group, rt->rank,
               kind == GRAFT_START_PEER ? "pull from donors"
               : kind == GRAFT_START_RESTORE ? "restored" : "cold", step);
    return GRAFT_OK;
}
