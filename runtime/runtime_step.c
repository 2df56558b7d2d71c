/*
 * The step protocol: graft_quorum() (the
 * steady path first, runtime_steady.c; then etcd) and the group's role in
 * it (the heal is runtime_heal.c, the serve runtime_serve.c), and
 * graft_commit() with the fence and the group's vote. docs/RUNTIME.md
 * describes it as built.
 */
#include "runtime_internal.h"
#include "../membership/membership_keys.h"

#include <assert.h>
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The job's progress record (see job_progress): written by every process at
 * its first committed step, then every PROGRESS_EVERY_NS by rank 0 of the
 * quorum's first group, so that tools see where a job on the steady path is
 * (its quorum record shows the epoch's first step), and at graft_destroy()
 * by every process. The first write is what a restart's cold-start check
 * reads (job_progress), so it has the client's timeout and retries; the
 * periodic ones have a short timeout and no retry (quick,
 * GRAFT__RT_PROGRESS_TIMEOUT_MS: an etcd that hangs must not hold the
 * training thread, whose steady path does not need etcd). A failure is
 * retried at a commit PROGRESS_RETRY_NS later and logged once until a
 * write succeeds. */
#define PROGRESS_EVERY_NS (10ull * 1000000000ull)
#define PROGRESS_RETRY_NS (1000ull * 1000000ull)
/* graft_quorum() starts its tries of a round at least this far apart. */
#define QUORUM_RETRY_NS (100ull * 1000000ull)

/* The group's progress record, group_progress/<group>: rank 0 of each group
 * writes the group's committed step and its rate every
 * GRAFT_GROUP_PROGRESS_EVERY_MS at a commit (G groups: G / 2 puts a second
 * at the default, docs/PERFORMANCE.md), at its first commit and at
 * graft_destroy(). The ranks of a group commit together, so rank 0's step
 * is the group's. Quick, like the periodic job record: the training thread
 * never waits long for etcd, and a failure is tried again a second later. */
static void publish_group_progress(graft_runtime_t *rt, bool quick)
{
    uint64_t step = graft_step(rt), now = graft__now_ns();
    uint8_t *buf = NULL;
    size_t len = 0;
    if (rt->rank != 0 || step == 0 || step == rt->gprogress_step)
        return;
    graft_group_progress_t gp = {.group = rt->group, .step = step,
                                 .unix_ms = graft__wall_ns() / 1000000u,
                                 .quorum_id = rt->prev_quorum_id};
    if (rt->gprogress_ns != 0 && now > rt->gprogress_ns && step > rt->gprogress_step)
        gp.steps_per_second = (double)(step - rt->gprogress_step) * 1e9 /
                              (double)(now - rt->gprogress_ns);
    char *key = graft__rt_key_group_progress(rt);
    graft_status_t st = key == NULL ? GRAFT_ENOMEM
                                    : graft__rt_group_progress_encode(&gp, &buf, &len);
    if (st == GRAFT_OK)
        st = graft_etcd_put(quick ? rt->etcd_quick : rt->etcd, key, buf, len, 0, NULL, NULL);
    if (st == GRAFT_OK) {
        rt->gprogress_step = step;
        rt->gprogress_ns = now;
    } else {
        rt->gprogress_retry_ns = now + PROGRESS_RETRY_NS;
        GRAFT_DEBUG(GRAFT_MOD_RUNTIME, "cannot write %s: %s", key != NULL ? key : "",
                    graft_status_string(st));
    }
    graft_free(buf);
    graft_free(key);
}

void graft__rt_publish_progress(graft_runtime_t *rt, bool quick)
{
    uint64_t step = graft_step(rt);
    uint8_t *buf = NULL;
    size_t len = 0;
    if (!quick)
        publish_group_progress(rt, false); /* the first commit, graft_destroy() */
    if (step == 0 || step == rt->progress_step)
        return;
    char *key = graft__rt_key_progress(rt);
    graft_status_t st = key == NULL ? GRAFT_ENOMEM : graft__rt_progress_encode(step, &buf, &len);
    if (st == GRAFT_OK)
        st = graft_etcd_put(quick ? rt->etcd_quick : rt->etcd, key, buf, len, 0, NULL, NULL);
    if (st == GRAFT_OK) {
        rt->progress_published = true;
        rt->progress_step = step;
        rt->progress_ns = graft__now_ns();
        rt->progress_failing = false;
    } else {
        rt->progress_retry_ns = graft__now_ns() + PROGRESS_RETRY_NS;
        if (!rt->progress_failing)
            GRAFT_WARN(GRAFT_MOD_RUNTIME, "cannot write the progress record: %s; trying again "
                       "at a commit", graft_status_string(st));
        rt->progress_failing = true;
    }
    graft_free(buf);
    graft_free(key);
}

/* After a commit: HEALTHY once, after the first; CANNOT_SERVE while the
 * transfer endpoint cannot serve a connection (docs/RUNTIME.md), and back.
 * Each change is one etcd write; a failed one is tried at the next commit. */
static void publish_health(graft_runtime_t *rt, uint64_t step)
{
    uint64_t failures = graft_transfer_serve_failures(rt->ep);
    bool cannot_serve = failures > 0;
    if (rt->healthy_published && cannot_serve == rt->cannot_serve_published)
        return;
    graft_member_state_t state = cannot_serve ? GRAFT_MEMBER_CANNOT_SERVE : GRAFT_MEMBER_HEALTHY;
    if (graft_membership_update(rt->m, state, step) != GRAFT_OK)
        return;
    if (cannot_serve != rt->cannot_serve_published) {
        GRAFT_WARN(GRAFT_MOD_RUNTIME, "group %" PRIu32 " rank %" PRIu32 ": %s", rt->group,
                   rt->rank, cannot_serve ? "its transfer endpoint cannot serve: the member "
                                            "record says so until it can"
                                          : "its transfer endpoint serves again");
        /* The reason, for the tools (the member record has only the
         * state): one event each time the rank stops serving. */
        char detail[192];
        snprintf(detail, sizeof(detail), "%s: rank %" PRIu32 "'s transfer endpoint failed to "
                 "accept %" PRIu64 " connection(s) in a row (its log names UCX's error)",
                 GRAFT_CANNOT_SERVE_TEXT, rt->rank, failures);
        if (cannot_serve)
            graft__rt_job_event(rt, GRAFT_EVENT_ERROR, step, false, 0, detail);
    }
    rt->healthy_published = true;
    rt->cannot_serve_published = cannot_serve;
}

static void progress_due(graft_runtime_t *rt, const graft_quorum_t *q)
{
    uint64_t now = graft__now_ns();
    bool reporter = q->replica_rank == 0 && rt->rank == 0 &&
                    now - rt->progress_ns >= PROGRESS_EVERY_NS;
    if ((!rt->progress_published || reporter) && now >= rt->progress_retry_ns)
        graft__rt_publish_progress(rt, rt->progress_published);
    if (now >= rt->gprogress_retry_ns &&
        (rt->gprogress_ns == 0 ||
         now - rt->gprogress_ns >= GRAFT_GROUP_PROGRESS_EVERY_MS * 1000000ull))
        publish_group_progress(rt, true);
}

/* -------------------------------------------------------------- quorum --- */

static bool is_member(const graft_quorum_t *q, uint32_t group)
{
    for (size_t i = 0; i < q->n_members; i++)
        if (q->members[i] == group)
            return true;
    return false;
}

/* A group outside quorum q whose ranks hold the job's state (healthy, or
 * healthy but unable to serve): a round formed while its readiness lagged
 * (a loaded host, an elastic job of min_groups 1). Its lowest such group
 * into *group_p. */
static bool state_outside(graft_runtime_t *rt, const graft_quorum_t *q, uint32_t *group_p)
{
    graft_membership_view_t *v = NULL;
    if (graft_membership_view_get(rt->m, &v) != GRAFT_OK)
        return false;
    bool found = false;
    for (size_t i = 0; i < v->n_members && !found; i++) {
        const graft_member_t *m = &v->members[i];
        if (m->group == rt->group || is_member(q, m->group))
            continue;
        if (m->state == GRAFT_MEMBER_HEALTHY || m->state == GRAFT_MEMBER_CANNOT_SERVE) {
            found = true;
            *group_p = m->group;
        }
    }
    graft_membership_view_free(v);
    return found;
}

/* Whether this rank, lacking state in quorum q, waits for a later round
 * instead of falling back: a group that holds the state is live outside q
 * (up to quorum_timeout_ms; past it, the fallback decides). Declaring the
 * job's state lost, or rolling back to a checkpoint, while a group holds
 * the state would be wrong: an elastic group joining a loaded job formed
 * its first round alone and ended with "job state lost". */
static bool wait_for_state(graft_runtime_t *rt, const graft_quorum_t *q)
{
    uint32_t other = 0;
    uint64_t now = graft__now_ns();
    if (!state_outside(rt, q, &other)) {
        rt->state_wait_since_ns = 0;
        return false;
    }
    if (rt->state_wait_since_ns == 0) {
        rt->state_wait_since_ns = now;
        GRAFT_WARN(GRAFT_MOD_RUNTIME, "group %" PRIu32 " rank %" PRIu32 ": quorum %" PRIu64
                   " has no group with the job's state at step %" PRIu64 ", but group %" PRIu32
                   " is live outside it: voting no and waiting for a round with it", rt->group,
                   rt->rank, q->id, q->step, other);
        return true;
    }
    if (now - rt->state_wait_since_ns < rt->cfg->quorum_timeout_ms * 1000000ull)
        return true;
    GRAFT_WARN(GRAFT_MOD_RUNTIME, "group %" PRIu32 " rank %" PRIu32 ": group %" PRIu32
               " held the job's state outside every quorum for %" PRIu64 " ms", rt->group,
               rt->rank, other, rt->cfg->quorum_timeout_ms);
    rt->state_wait_since_ns = 0;
    return false;
}

/* No group of quorum q can give this rank the state it lacks: restore the
 * newest checkpoint that verifies, or fail. The ranks of the group that
 * come here (the one lacking state, and those whose step is above the
 * group's) verify every shard and so pick the same checkpoint as each
 * other and as any rank that restored at start-up. When it is of q's step
 * the rank goes on as a member at that step, serving too if its group
 * serves (start_role); when it is not, the group votes no and announces
 * the restored step at the next quorum, where the quorum reconciles it
 * with the others; a deterministic trainer recomputes the lost steps. */
static graft_status_t fallback(graft_runtime_t *rt, const graft_quorum_t *q)
{
    graft_status_t st = GRAFT_ENOCHECKPOINT;
    uint64_t step = 0;
    if (rt->cfg->persist_root != NULL) {
        st = graft__rt_restore(rt, &step);
        if (st != GRAFT_OK && st != GRAFT_ENOCHECKPOINT)
            return st; /* logged by the restore; the regions may be half written */
    }
    if (st == GRAFT_ENOCHECKPOINT) {
        GRAFT_ERROR(GRAFT_MOD_RUNTIME, "group %" PRIu32 " rank %" PRIu32 ": no valid state for "
                    "step %" PRIu64 " of quorum %" PRIu64 ": no up-to-date group can serve it "
                    "and %s%s; the job's committed state is lost (refusing to train on "
                    "unverified state or to start the job over)", rt->group, rt->rank, q->step,
                    q->id, rt->cfg->persist_root != NULL ? "no checkpoint verifies under "
                                                         : "no persistent tier is configured",
                    rt->cfg->persist_root != NULL ? rt->cfg->persist_root : "");
        return GRAFT_ESTATELOST;
    }
    rt->need_state = false;
    rt->state_valid = true;
    rt->round_restored = step != q->step;
    graft__rt_set_step(rt, step);
    pthread_mutex_lock(&rt->mu);
    if (rt->metrics.commits == 0)
        rt->start_kind = GRAFT_START_RESTORE; /* nothing committed from another start */
    pthread_mutex_unlock(&rt->mu);
    GRAFT_WARN(GRAFT_MOD_RUNTIME,
               "group %" PRIu32 " rank %" PRIu32 ": no up-to-date group for step %"
               PRIu64 " of quorum %" PRIu64 "; restored checkpoint step %" PRIu64 " from %s%s",
               rt->group, rt->rank, q->step, q->id, step, rt->cfg->persist_root,
               rt->round_restored ? "; rejoining at that step" : "");
    return GRAFT_OK;
}


/* Decide this group's role in quorum q and start the heal or the serve.
 * *fatal_p: the rank has no valid state and none can be had. */
static graft_status_t start_role(graft_runtime_t *rt, graft_quorum_t *q, bool *fatal_p)
{
    graft_status_t st = GRAFT_OK;
    graft__fanout_t plan = {0};
    rt->serve.n_recipients = 0;
    rt->cold_sync = false;
    rt->serve.relay = false;
    rt->heal.status = GRAFT_OK;
    rt->round_restored = false;
    /* The followers' serve stays open only on a rank that holds q's step
     * and keeps it (serves it, or computes). */
    if (q->must_recover || rt->need_state || graft_step(rt) != q->step ||
        rt->serve.follow_step != q->step)
        graft__rt_follow_serve_close(rt);
    /* The quorum assigns recoveries by the group's step, the lowest of its
     * ranks'. This rank can neither compute nor serve q's step when it
     * lacks the job's state, or when it is ahead of its own group's step
     * (another rank of the group failed to heal): then nobody in q holds
     * that state for it. Checked before serving, so undefined state is
     * never served, and before the step-0 sync, so a job that had
     * progressed is never started over. */
    if (!q->must_recover && (rt->need_state || graft_step(rt) > q->step)) {
        if (wait_for_state(rt, q)) {
            st = GRAFT_ENODONOR; /* not fatal: the vote is no, the next round tries again */
            goto out;
        }
        st = fallback(rt, q);
        *fatal_p = st != GRAFT_OK;
        /* A checkpoint of q's own step is the state every member holds at
         * that step: the rank serves it like the rest of its group (its
         * recipient rank pulls from it). Another step: it votes no. */
        if (st != GRAFT_OK || rt->round_restored)
            goto out;
    }
    if (q->step == 0)
        rt->state_valid = true; /* cold start: the trainer's initial state */
    /* Cold start: every group takes the lowest member group's state so all
     * hold bit-identical state from step 0 on. */
    rt->cold_sync = q->step == 0 && q->n_members > 1;
    st = graft__fanout_plan(q, rt->group, (uint32_t)rt->cfg->transfer_max_recipients,
                            !graft__rt_nccl_on(rt), &plan);
    if (st != GRAFT_OK)
        goto out;
    if (plan.n_donors > 0) {
        rt->state_wait_since_ns = 0;
        graft__rt_follow_serve_close(rt); /* the pull overwrites the regions */
        /* From here until a heal succeeds only a group or a checkpoint can
         * make the regions valid again. */
        if (!rt->cold_sync)
            rt->need_state = true;
        if (plan.relay) {
            st = graft__rt_peers_list(rt, &plan);
            if (st == GRAFT_OK)
                st = graft__rt_relay_start(rt, q);
            if (st != GRAFT_OK)
                goto out;
        }
        st = graft__rt_heal_start(rt, plan.donors, plan.n_donors, rt->serve.relay);
        if (st != GRAFT_OK)
            graft__rt_relay_abandon(rt, false);
        goto out;
    }
    if (q->must_recover) {
        GRAFT_ERROR(GRAFT_MOD_RUNTIME, "quorum %" PRIu64 " says recover but assigns no donors",
                    q->id);
        st = GRAFT_ENODONOR;
        goto out;
    }
    st = graft__rt_peers_list(rt, &plan);
    if (st == GRAFT_OK && rt->serve.n_peers > 0)
        st = graft__rt_serve_start(rt, q);
out:
    graft__fanout_free(&plan);
    return st;
}

/* The etcd path's round, tried again until the deadline: the first try
 * delegated through the group's leader, the others each rank's own. */
static graft_status_t etcd_quorum(graft_runtime_t *rt, uint64_t committed, uint64_t deadline,
                                  graft_quorum_t **q_p)
{
    graft_status_t st = GRAFT_OK;
    graft__rt_finished_refresh(rt, false); /* groups that ended are not waited for */
    for (bool first = true;; first = false) {
        uint64_t now = graft__now_ns();
        if (now >= deadline) {
            GRAFT_ERROR(GRAFT_MOD_RUNTIME, "group %" PRIu32 " rank %" PRIu32
                        ": no quorum within %" PRIu64 " ms: %s", rt->group, rt->rank,
                        rt->cfg->quorum_timeout_ms, graft_status_string(st));
            return st != GRAFT_OK ? st : GRAFT_ETIMEOUT;
        }
        uint32_t left = (uint32_t)GRAFT_MIN((deadline - now) / 1000000ull, UINT32_MAX);
        /* Tries after the first are each rank's own: a round that formed
         * without the group, or a lost lease, is no time to gather. */
        st = first ? graft__rt_delegate_quorum(rt, committed, GRAFT_MAX(left, 1u), q_p)
                   : graft_membership_quorum_wait(rt->m, committed, GRAFT_MAX(left, 1u), q_p);
        if (st == GRAFT_OK)
            return GRAFT_OK;
        /* A short round (too few groups) or a lost lease: the membership
         * layer re-joins by itself; announce again. */
        if (st != GRAFT_ENOQUORUM && st != GRAFT_ELEASE && st != GRAFT_ETIMEOUT &&
            graft_status_class(st) != GRAFT_CLASS_JOB)
            return st;
        GRAFT_DEBUG(GRAFT_MOD_RUNTIME, "quorum round: %s; trying again", graft_status_string(st));
        if (st == GRAFT_ENOQUORUM)
            graft__rt_finished_refresh(rt, true); /* a group may have ended since */
        /* One that failed at once (an etcd that answers every request with
         * an error) is not asked again in a tight loop. */
        uint64_t until = GRAFT_MIN(now + QUORUM_RETRY_NS, deadline);
        uint64_t t = graft__now_ns();
        if (t < until)
            graft__sleep_ns(until - t);
    }
}

/* Quorum q is the open step's: counted, and announced when it changed.
 * Whether it did. */
static bool quorum_adopt(graft_runtime_t *rt, graft_quorum_t *q, uint64_t tq)
{
    assert(is_member(q, rt->group));
    uint64_t formed_ns = graft__now_ns();
    rt->q = q;
    rt->heal_quorum_ns = formed_ns - tq;
    bool changed = q->id != rt->prev_quorum_id;
    rt->prev_quorum_id = q->id;
    pthread_mutex_lock(&rt->mu);
    rt->metrics.quorums++;
    rt->metrics.steady_steps += rt->q_steady;
    rt->metrics.quorum_changes += changed;
    rt->metrics.quorum_id = q->id;
    rt->replica_rank = q->replica_rank;
    rt->replica_world = q->replica_world;
    pthread_mutex_unlock(&rt->mu);
    if (changed) {
        char detail[64];
        snprintf(detail, sizeof(detail), "%zu groups", q->n_members);
        graft_runtime_event_t ev = {.kind = GRAFT_RUNTIME_EVENT_QUORUM_CHANGED,
                                    .step = q->step, .quorum_id = q->id, .detail = detail};
        graft__rt_emit(rt, &ev);
    }
    return changed;
}

graft_status_t graft_quorum(graft_runtime_t *rt, graft_step_info_t *info_p)
{
    graft_status_t st = GRAFT_OK;
    graft_quorum_t *q = NULL;
    if (rt == NULL)
        return GRAFT_EINVAL;
    if (rt->q != NULL)
        return GRAFT_ESTATE;
    uint64_t t0 = graft__now_ns();
    if (!rt->joined) {
        st = graft__rt_join(rt);
        if (st != GRAFT_OK)
            return st;
    }
    /* The quorum phase of a recovery starts once joined. */
    uint64_t tq = graft__now_ns();
    uint64_t deadline = tq + rt->cfg->quorum_timeout_ms * 1000000ull;
    uint64_t committed = graft_step(rt);
    /* Followers read the committed step while the quorum forms and the
     * step computes; the commit's fence waits for them. */
    graft__rt_follow_serve_open(rt);
    st = graft__rt_steady_quorum(rt, committed, &q);
    if (st != GRAFT_OK)
        return st;
    rt->q_steady = q != NULL;
    if (q == NULL) {
        st = etcd_quorum(rt, committed, deadline, &q);
        if (st != GRAFT_OK)
            return st;
    }
    bool changed = quorum_adopt(rt, q, tq);
    bool fatal = false;
    if (!q->must_recover && graft__rt_finished_ahead(rt, q)) {
        /* Only a checkpoint can give this group the step the others ended
         * at: no group left computes a step without them. */
        GRAFT_WARN(GRAFT_MOD_RUNTIME, "group %" PRIu32 " rank %" PRIu32 ": quorum at step %"
                   PRIu64 " formed without the groups that ended at step %" PRIu64,
                   rt->group, rt->rank, q->step, rt->finished_step);
        rt->need_state = true;
    }
    st = start_role(rt, q, &fatal);
    if (!rt->q_steady && !fatal) {
        /* After the role started: a donor's serve must not wait for the
         * connections the steady path opens ahead. */
        graft_status_t sst = graft__rt_steady_enter(rt, q);
        if (sst != GRAFT_OK)
            GRAFT_WARN(GRAFT_MOD_RUNTIME, "steady path off for this epoch: %s",
                       graft_status_string(sst));
    }
    if (fatal) {
        /* Logged by the fallback. The group's vote stays missing (a no);
         * the runtime can be asked again, e.g. once a group is back. */
        rt->q = NULL;
        graft_membership_quorum_free(q);
        return st;
    }
    GRAFT_DEBUG(GRAFT_MOD_RUNTIME, "group %" PRIu32 " rank %" PRIu32 ": quorum round %" PRIu64
                " id %" PRIu64 " step %" PRIu64 " (mine %" PRIu64 ") %zu groups: %s",
                rt->group, rt->rank, q->round, q->id, q->step, committed, q->n_members,
                rt->heal.running ? "healing" : rt->serve.serving ? "serving" : "computing");
    if (st != GRAFT_OK) {
        /* The step goes on; graft_commit() votes no and the group heals at
         * the next quorum. */
        rt->heal.status = st;
        rt->state_valid = false;
    }
    if (info_p != NULL) {
        graft_step_info_t info = {
            .step = q->step,
            .quorum_id = q->id,
            .quorum_changed = changed,
            .replica_rank = q->replica_rank,
            .replica_world = q->replica_world,
            .healing = rt->heal.running,
            .donor = rt->serve.serving,
            .n_recipients = rt->serve.n_recipients,
            .round = q->round,
        };
        *info_p = info;
    }
    pthread_mutex_lock(&rt->mu);
    rt->metrics.last_quorum_ns = graft__now_ns() - t0;
    pthread_mutex_unlock(&rt->mu);
    return GRAFT_OK;
}

/* -------------------------------------------------------------- commit --- */


graft_status_t graft_commit(graft_runtime_t *rt, bool *apply_p)
{
    graft_status_t st = GRAFT_OK, ret = GRAFT_OK;
    bool ok = true, decision = false;
    const char *reason = NULL;
    if (rt == NULL || apply_p == NULL)
        return GRAFT_EINVAL;
    *apply_p = false;
    if (rt->q == NULL)
        return GRAFT_ESTATE;
    graft_quorum_t *q = rt->q;
    uint64_t t0 = graft__now_ns();

    if (rt->heal.running || !rt->state_valid) {
        st = graft_heal_wait(rt);
        if (st != GRAFT_OK || !rt->state_valid) {
            ok = false;
            reason = "heal failed";
        }
    }
    graft__rt_serve_stop(rt, q);
    if (ok && rt->round_restored) {
        ok = false;
        reason = "restored a checkpoint of another step";
    }
    if (ok && rt->vetoed) {
        ok = false;
        reason = "the trainer vetoed the step";
    }
    if (ok && rt->finishing && q->n_members < rt->min_groups)
        graft__rt_finished_refresh(rt, true); /* a round formed by a group that knew */
    if (ok && q->n_members + (rt->finishing ? rt->n_finished : 0) < rt->min_groups) {
        ok = false;
        reason = "too few groups";
        /* The quorum was formed under another group's min_groups: the
         * groups were started with different settings, and no round will
         * ever satisfy this one. Said so in the vote (the job's history). */
        if (q->min_groups != rt->min_groups && rt->n_finished == 0) {
            snprintf(rt->vote_reason, sizeof(rt->vote_reason),
                     GRAFT_CONFIG_MISMATCH_TEXT ": min_groups %" PRIu32 " in group %" PRIu32
                     " (GRAFT_GROUPS %" PRIu32 "), %" PRIu32 " in the quorum another group formed",
                     rt->min_groups, rt->group, rt->groups, q->min_groups);
            reason = rt->vote_reason;
        }
    }
    if (ok && rt->cfg->drift_check_every > 0 && q->step > 0 &&
        q->step % rt->cfg->drift_check_every == 0) {
        st = graft__rt_drift_check(rt, q);
        if (st == GRAFT_EDRIFT) {
            ok = false;
            reason = "replica drift";
            ret = GRAFT_EDRIFT;
        }
    }
    if (rt->q_steady) {
        const char *why = NULL;
        decision = graft__rt_steady_vote(rt, q, ok, &why);
        if (ok && !decision && why != NULL)
            reason = why;
        st = GRAFT_OK;
    } else {
        st = graft__rt_delegate_vote(rt, q, ok, reason, &decision);
    }
    graft__rt_steady_done(rt, decision);
    if (st != GRAFT_OK) {
        GRAFT_ERROR(GRAFT_MOD_RUNTIME,
                    "group %" PRIu32 " rank %" PRIu32 ": commit vote of step %" PRIu64
                    ": %s", rt->group, rt->rank, q->step, graft_status_string(st));
        decision = false;
        if (ret == GRAFT_OK)
            ret = st;
    }
    GRAFT_DEBUG(GRAFT_MOD_RUNTIME, "group %" PRIu32 " rank %" PRIu32 ": step %" PRIu64
                " voted %s, group decided %s", rt->group, rt->rank, q->step, ok ? "yes" : reason,
                decision ? "apply" : "no");
    if (decision) {
        /* The persistent snapshot is of the state the step started from,
         * which is what the regions hold until the optimizer step. */
        graft_status_t pst = rt->finishing ? graft__rt_persist_final(rt, q)
                                           : graft__rt_persist_at_commit(rt, q);
        if (pst != GRAFT_OK)
            GRAFT_WARN(GRAFT_MOD_RUNTIME, "%scheckpoint of step %" PRIu64 " not taken: %s",
                       rt->finishing ? "final " : "", q->step, graft_status_string(pst));
        if (rt->finishing)
            graft__rt_finished_publish(rt, q->step); /* the others no longer wait for it */
        /* The trainer's last step (graft_finish()) is not applied: the
         * committed step stays the one its regions hold. */
        uint64_t committed = rt->finishing ? q->step : q->step + 1;
        graft__rt_set_step(rt, committed);
        publish_health(rt, committed);
        progress_due(rt, q);
    } else {
        /* A healed group holds the quorum's step even when the vote fails. */
        if (rt->state_valid && !rt->round_restored)
            graft__rt_set_step(rt, q->step);
        graft_runtime_event_t ev = {.kind = GRAFT_RUNTIME_EVENT_COMMIT_FAILED,
                                    .status = ret != GRAFT_OK ? ret : GRAFT_EVOTE,
                                    .step = q->step, .quorum_id = q->id,
                                    .detail = reason != NULL ? reason : "another rank voted no"};
        graft__rt_emit(rt, &ev);
    }
    pthread_mutex_lock(&rt->mu);
    if (decision && !rt->finishing)
        rt->metrics.commits++; /* commits that applied: a closing step is not */
    else if (!decision)
        rt->metrics.commits_failed++;
    rt->metrics.last_commit_ns = graft__now_ns() - t0;
    pthread_mutex_unlock(&rt->mu);
    graft_membership_quorum_free(q);
    rt->q = NULL;
    rt->round_restored = false;
    rt->vetoed = false;
    *apply_p = decision && !rt->finishing;
    rt->finishing = false;
    return ret;
}

graft_status_t graft_finish(graft_runtime_t *rt)
{
    if (rt == NULL)
        return GRAFT_EINVAL;
    if (rt->q == NULL)
        return GRAFT_ESTATE;
    rt->finishing = true;
    return GRAFT_OK;
}

graft_status_t graft_commit_veto(graft_runtime_t *rt)
{
    if (rt == NULL)
        return GRAFT_EINVAL;
    if (rt->q == NULL)
        return GRAFT_ESTATE;
    rt->vetoed = true;
    return GRAFT_OK;
}
