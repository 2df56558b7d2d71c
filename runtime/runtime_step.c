/*
 * The step protocol: joining and the start-up decision, graft_quorum() with
 * the background heal and the donor's serve, graft_commit() with the fence
 * and the group's vote. docs/RUNTIME.md describes it as built.
 */
#include "runtime_internal.h"

#include <assert.h>
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

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
            healthy += mb->state == GRAFT_MEMBER_HEALTHY && mb->committed_step > 0;
            j++;
        }
        found = v->members[i].group != rt->group && healthy == rt->ranks;
        i = j;
    }
    graft_membership_view_free(v);
    return found;
}

static void set_step(graft_runtime_t *rt, uint64_t step)
{
    pthread_mutex_lock(&rt->mu);
    rt->metrics.step = step;
    pthread_mutex_unlock(&rt->mu);
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
    pkey = graft__asprintf("%sprogress", rt->prefix);
    ckey = graft__asprintf("%scheckpoints/", rt->prefix);
    if (pkey == NULL || ckey == NULL)
        goto out;
    st = graft_etcd_get(rt->etcd, pkey, &kv, NULL);
    if (st == GRAFT_OK) {
        char text[24] = "";
        memcpy(text, kv.value, GRAFT_MIN(kv.value_len, sizeof(text) - 1));
        /* Unparsable text still says the job progressed. */
        pstep = GRAFT_MAX(strtoull(text, NULL, 10), 1u);
    } else if (st != GRAFT_ENOTFOUND) {
        GRAFT_ERROR(GRAFT_RT_MOD, "cannot read %s: %s", pkey, graft_status_string(st));
        goto out;
    }
    st = graft_etcd_range(rt->etcd, ckey, &ro, &res);
    if (st != GRAFT_OK) {
        GRAFT_ERROR(GRAFT_RT_MOD, "cannot read %s: %s", ckey, graft_status_string(st));
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

/* Mark the job as having committed steps (see job_progress). Once per
 * process, so the steady state pays nothing; a failure is retried at the
 * next commit. */
static void publish_progress(graft_runtime_t *rt, uint64_t step)
{
    char text[24];
    char *key = graft__asprintf("%sprogress", rt->prefix);
    if (key == NULL)
        return;
    int n = snprintf(text, sizeof(text), "%" PRIu64, step);
    graft_status_t st = graft_etcd_put(rt->etcd, key, text, (size_t)n, 0, NULL, NULL);
    if (st == GRAFT_OK)
        rt->progress_published = true;
    else
        GRAFT_WARN(GRAFT_RT_MOD, "cannot write %s: %s", key, graft_status_string(st));
    graft_free(key);
}

graft_status_t graft__rt_join(graft_runtime_t *rt)
{
    graft_status_t st;
    if (rt->n_regions == 0) {
        GRAFT_ERROR(GRAFT_RT_MOD, "graft_quorum: register the regions first");
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
    };
    st = graft_membership_create(&mc, &rt->m);
    if (st != GRAFT_OK) {
        GRAFT_ERROR(GRAFT_RT_MOD, "group %" PRIu32 " rank %" PRIu32 ": cannot join job %s: %s",
                    rt->group, rt->rank, rt->cfg->job, graft_status_string(st));
        return st;
    }
    rt->joined = true;
    uint64_t joined_ns = graft__now_ns();
    rt->heal_detect_ns = joined_ns - rt->start_ns;

    /* The start-up decision (DESIGN.md): donors, else disk, else cold. */
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
            GRAFT_WARN(GRAFT_RT_MOD, "group %" PRIu32 " rank %" PRIu32 ": job %s has committed "
                       "steps (progress at step %" PRIu64 ", %" PRId64 " checkpoint records) "
                       "but no donor and no valid checkpoint: not a cold start; the state must "
                       "come from a group at the first quorum", rt->group, rt->rank, rt->cfg->job,
                       pstep, n_ckpt);
            kind = GRAFT_START_PEER;
            rt->state_valid = false;
            rt->need_state = true;
        }
    }
    set_step(rt, step);
    pthread_mutex_lock(&rt->mu);
    rt->start_kind = kind;
    pthread_mutex_unlock(&rt->mu);
    GRAFT_INFO(GRAFT_RT_MOD, "group %" PRIu32 " rank %" PRIu32 ": start: %s at step %" PRIu64,
               rt->group, rt->rank,
               kind == GRAFT_START_PEER ? "pull from donors"
               : kind == GRAFT_START_RESTORE ? "restored" : "cold", step);
    return GRAFT_OK;
}

/* ---------------------------------------------------------------- heal --- */

/* The address of the NCCL donor, for the report ("" when not in the view:
 * the pair then fails at its id exchange). */
static const char *nccl_donor_address(const graft_runtime_t *rt)
{
    for (size_t i = 0; i < rt->n_heal_donors; i++)
        if (rt->heal_donor_groups[i] == rt->nccl_donor)
            return rt->heal_donors[i];
    return "";
}

static void *heal_main(void *arg)
{
    graft_runtime_t *rt = arg;
    bool nccl = graft__rt_nccl_on(rt);
    graft_transfer_pull_options_t po = {
        .donors = (const char *const *)rt->heal_donors,
        .n_donors = rt->n_heal_donors,
        .step = rt->q->step,
        .stall_timeout_ms = (uint32_t)rt->cfg->stall_timeout_ms,
        .connect_timeout_ms = (uint32_t)rt->cfg->stall_timeout_ms,
        .timeout_ms = (uint32_t)rt->cfg->transfer_timeout_ms,
        .host_only = nccl,
    };
    memset(&rt->heal_report, 0, sizeof(rt->heal_report));
    rt->heal_status = GRAFT_OK;
    rt->nccl_status = GRAFT_OK;
    if (!nccl || graft__rt_has_host_regions(rt))
        rt->heal_status = graft_transfer_pull(rt->ep, &po, &rt->heal_report);
    if (nccl) {
        /* Also after a failed UCX pull: the NCCL donor holds its step until
         * this pair is over or times out. */
        graft_transfer_report_t nrep;
        graft_transfer_report_t *rep = &rt->heal_report;
        rt->nccl_status = graft__rt_nccl_pull(rt, nccl_donor_address(rt), &nrep);
        rep->bytes += nrep.bytes;
        rep->chunks += nrep.chunks;
        rep->elapsed_ns += nrep.elapsed_ns;
        if (rt->heal_status == GRAFT_OK) {
            rt->heal_status = rt->nccl_status;
            if (nrep.drift.region[0] != '\0')
                rep->drift = nrep.drift;
        }
    }
    if (rt->relay) {
        /* A relay serves its recipients as soon as its own state is in
         * (they wait queued); a failed heal withdraws the serve, so they
         * are refused instead of waiting. */
        graft_status_t st = rt->heal_status == GRAFT_OK
                                 ? graft_transfer_serve_begin(rt->ep, rt->q->step)
                                 : GRAFT_ECANCELED;
        rt->relay_served = st == GRAFT_OK;
        if (!rt->relay_served) {
            if (rt->heal_status == GRAFT_OK)
                GRAFT_ERROR(GRAFT_RT_MOD, "relay: cannot serve step %" PRIu64 ": %s",
                            rt->q->step, graft_status_string(st));
            if (graft_transfer_serve_end(rt->ep) != GRAFT_OK)
                GRAFT_DEBUG(GRAFT_RT_MOD, "relay: no serve to withdraw");
        }
    }
    return NULL;
}

static void free_donors(graft_runtime_t *rt)
{
    for (size_t i = 0; i < rt->n_heal_donors; i++)
        graft_free(rt->heal_donors[i]);
    graft_free(rt->heal_donors);
    rt->heal_donors = NULL;
    rt->n_heal_donors = 0;
}

/* The transfer addresses of rank `rank` of the donor groups that view v
 * has, into rt->heal_donors (empty, allocated for n_donors). */
static graft_status_t donors_in_view(graft_runtime_t *rt, const graft_membership_view_t *v,
                                     const uint32_t *donors, size_t n_donors)
{
    for (size_t d = 0; d < n_donors && rt->n_heal_donors < GRAFT_TRANSFER_MAX_DONORS; d++) {
        for (size_t i = 0; i < v->n_members; i++) {
            const graft_member_t *mb = &v->members[i];
            if (mb->group != donors[d] || mb->rank != rt->rank || mb->transfer_address == NULL ||
                mb->transfer_address[0] == '\0')
                continue;
            rt->heal_donors[rt->n_heal_donors] = graft__strdup(mb->transfer_address);
            if (rt->heal_donors[rt->n_heal_donors] == NULL)
                return GRAFT_ENOMEM;
            rt->heal_donor_groups[rt->n_heal_donors] = donors[d];
            rt->n_heal_donors++;
            break;
        }
    }
    return GRAFT_OK;
}

/* Start pulling this rank's regions from rank `rank` of the donor groups;
 * CUDA regions over NCCL come from the first of them (runtime_nccl.c). */
static graft_status_t heal_start(graft_runtime_t *rt, const uint32_t *donors, size_t n_donors)
{
    graft_membership_view_t *v = NULL;
    graft_status_t st = GRAFT_OK;
    uint64_t deadline = graft__now_ns() + rt->cfg->join_timeout_ms * 1000000ull;
    rt->nccl_donor = n_donors > 0 ? donors[0] : UINT32_MAX;
    rt->heal_donors = graft__calloc(GRAFT_MAX(n_donors, 1), sizeof(char *));
    if (rt->heal_donors == NULL)
        return GRAFT_ENOMEM;
    /* The quorum record and the member records reach this rank by
     * different paths, so the donors' records can still be on their way:
     * wait for the view (up to the join timeout) until one donor is in it. */
    for (;;) {
        st = graft_membership_view_get(rt->m, &v);
        if (st == GRAFT_OK)
            st = donors_in_view(rt, v, donors, n_donors);
        uint64_t now = graft__now_ns();
        if (st != GRAFT_OK || rt->n_heal_donors > 0 || now >= deadline)
            break;
        uint64_t version = v->version;
        graft_membership_view_free(v);
        v = NULL;
        if (graft_membership_view_wait(rt->m, version,
                                       (uint32_t)((deadline - now) / 1000000ull) + 1,
                                       NULL) != GRAFT_OK)
            continue; /* timed out: one last look at the view */
    }
    if (st != GRAFT_OK)
        goto out;
    if (rt->n_heal_donors == 0) {
        GRAFT_ERROR(GRAFT_RT_MOD, "group %" PRIu32 " rank %" PRIu32
                    ": no donor of step %" PRIu64 " is in the view", rt->group, rt->rank,
                    rt->q->step);
        st = GRAFT_ENODONOR;
        goto out;
    }
    rt->state_valid = false; /* the pull overwrites the regions */
    graft__rt_skip_save(rt);
    if (pthread_create(&rt->heal_thread, NULL, heal_main, rt) != 0) {
        GRAFT_ERROR(GRAFT_RT_MOD, "pthread_create: %s", strerror(errno));
        st = GRAFT_ESYS;
        goto out;
    }
    rt->heal_running = true;
out:
    if (st != GRAFT_OK)
        free_donors(rt);
    graft_membership_view_free(v);
    return st;
}

/* The donors a pull dropped, for the recovery's detail: "; donor group G
 * lost (why) after C chunks, N reassigned" each. A pull that completes
 * after losing a donor is a success that would otherwise look like any
 * other; operators (and the simulator) need to see that a donor failed
 * under it and that its chunks moved to the others. */
static void lost_donors(const graft_runtime_t *rt, char *buf, size_t len)
{
    const graft_transfer_report_t *rep = &rt->heal_report;
    size_t used = 0;
    buf[0] = '\0';
    for (size_t i = 0; i < rep->n_donors && i < rt->n_heal_donors && used < len; i++) {
        const graft_transfer_donor_report_t *d = &rep->donors[i];
        if (d->status == GRAFT_OK)
            continue;
        int n = snprintf(buf + used, len - used, "; donor group %" PRIu32 " lost (%s) after %"
                         PRIu64 " chunks, %" PRIu64 " reassigned", rt->heal_donor_groups[i],
                         graft_status_string(d->status), d->chunks, d->reassigned);
        if (n < 0)
            break;
        used += (size_t)n;
    }
}

static void relay_abandon(graft_runtime_t *rt);

graft_status_t graft_heal_wait(graft_runtime_t *rt)
{
    if (rt == NULL)
        return GRAFT_EINVAL;
    if (!rt->heal_running)
        return rt->q != NULL && !rt->state_valid ? rt->heal_status : GRAFT_OK;
    pthread_join(rt->heal_thread, NULL);
    rt->heal_running = false;

    graft_status_t st = rt->heal_status;
    const graft_transfer_report_t *rep = &rt->heal_report;
    uint64_t verify_ns = 0;
    char detail[512] = "", lost[320] = "";
    lost_donors(rt, lost, sizeof(lost));
    if (rt->nccl_status != GRAFT_OK) {
        size_t used = strlen(lost);
        snprintf(lost + used, sizeof(lost) - used, "; NCCL pair with donor group %" PRIu32 ": %s",
                 rt->nccl_donor, graft_status_string(rt->nccl_status));
    }
    free_donors(rt);
    relay_abandon(rt); /* a no-op unless this relay's serve did not begin */
    if (st == GRAFT_OK)
        graft__rt_skip_restore(rt); /* test-only: a no-op unless the switch is set */
    if (st == GRAFT_OK && rt->fp_fn != NULL) {
        /* The trainer's own check of the installed state; a failing
         * callback fails the heal. */
        uint64_t t = graft__now_ns(), fp = 0;
        st = rt->fp_fn(rt->fp_arg, &fp);
        verify_ns = graft__now_ns() - t;
        if (st != GRAFT_OK)
            GRAFT_ERROR(GRAFT_RT_MOD, "fingerprint of the healed state failed: %s",
                        graft_status_string(st));
    }
    if (st == GRAFT_EDRIFT)
        snprintf(detail, sizeof(detail), "donors disagree on region %s chunk %" PRIu64,
                 rep->drift.region, rep->drift.chunk);
    else
        snprintf(detail, sizeof(detail), "%zu donors, %" PRIu64 " bytes: %s%s", rep->n_donors,
                 rep->bytes, graft_status_string(st), lost);
    rt->heal_status = st;
    rt->state_valid = st == GRAFT_OK;
    if (st == GRAFT_OK)
        rt->need_state = false;
    pthread_mutex_lock(&rt->mu);
    if (st == GRAFT_OK) {
        rt->metrics.recoveries++;
        rt->metrics.recovery_bytes += rep->bytes;
        rt->metrics.last_detect_ns = rt->heal_detect_ns;
        rt->metrics.last_quorum_phase_ns = rt->heal_quorum_ns;
        rt->metrics.last_transfer_ns = rep->elapsed_ns;
        rt->metrics.last_verify_ns = verify_ns;
        rt->metrics.step = rt->q != NULL ? rt->q->step : rt->metrics.step;
    } else {
        rt->metrics.recovery_failures++;
    }
    pthread_mutex_unlock(&rt->mu);
    if (st != GRAFT_OK)
        GRAFT_ERROR(GRAFT_RT_MOD, "group %" PRIu32 " rank %" PRIu32 ": heal failed: %s",
                    rt->group, rt->rank, detail);
    graft_runtime_event_t ev = {
        .kind = GRAFT_RUNTIME_EVENT_RECOVERY,
        .status = st,
        .step = rt->q != NULL ? rt->q->step : 0,
        .quorum_id = rt->q != NULL ? rt->q->id : 0,
        .bytes = rep->bytes,
        .detect_ns = rt->heal_detect_ns,
        .quorum_ns = rt->heal_quorum_ns,
        .transfer_ns = rep->elapsed_ns,
        .verify_ns = verify_ns,
        .n_donors = (uint32_t)rep->n_donors,
        .detail = detail,
    };
    graft__rt_emit(rt, &ev);
    graft__rt_job_event(rt, st == GRAFT_EDRIFT ? GRAFT_EVENT_DRIFT : GRAFT_EVENT_RECOVERY_DONE,
                        ev.step, st == GRAFT_OK, rep->elapsed_ns / 1000, detail);
    /* Only the first heal of a process has a detection phase (start-up). */
    rt->heal_detect_ns = 0;
    return st;
}

/* -------------------------------------------------------------- quorum --- */

static bool is_member(const graft_quorum_t *q, uint32_t group)
{
    for (size_t i = 0; i < q->n_members; i++)
        if (q->members[i] == group)
            return true;
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
        GRAFT_ERROR(GRAFT_RT_MOD, "group %" PRIu32 " rank %" PRIu32 ": no valid state for "
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
    set_step(rt, step);
    pthread_mutex_lock(&rt->mu);
    if (rt->metrics.commits == 0)
        rt->start_kind = GRAFT_START_RESTORE; /* nothing committed from another start */
    pthread_mutex_unlock(&rt->mu);
    GRAFT_WARN(GRAFT_RT_MOD, "group %" PRIu32 " rank %" PRIu32 ": no up-to-date group for step %"
               PRIu64 " of quorum %" PRIu64 "; restored checkpoint step %" PRIu64 " from %s%s",
               rt->group, rt->rank, q->step, q->id, step, rt->cfg->persist_root,
               rt->round_restored ? "; rejoining at that step" : "");
    return GRAFT_OK;
}

/* ----------------------------------------------------------- serving --- */

static uint64_t member_incarnation(const graft_membership_view_t *v, uint32_t group,
                                   uint32_t rank)
{
    for (size_t i = 0; v != NULL && i < v->n_members; i++)
        if (v->members[i].group == group && v->members[i].rank == rank)
            return v->members[i].incarnation;
    return 0;
}

static void peers_free(graft_runtime_t *rt)
{
    graft_free(rt->peers);
    rt->peers = NULL;
    rt->n_peers = 0;
}

/* The recipients this rank serves in q, as the round's fan-out plan has
 * them (runtime_fanout.c). Each pulls over UCX (unless this rank's regions
 * are all CUDA ones that go over NCCL) and, with NCCL pairs, takes its CUDA
 * regions from its first donor. */
static graft_status_t peers_list(graft_runtime_t *rt, const graft__fanout_t *plan)
{
    bool nccl = graft__rt_nccl_on(rt);
    bool ucx = !nccl || graft__rt_has_host_regions(rt);
    graft_membership_view_t *v = NULL;
    peers_free(rt); /* the list of a quorum that served nobody */
    rt->peers = graft__calloc(plan->n_serves + 1, sizeof(*rt->peers));
    if (rt->peers == NULL)
        return GRAFT_ENOMEM;
    if (graft_membership_view_get(rt->m, &v) != GRAFT_OK)
        v = NULL; /* incarnations unknown: learnt while the fence waits */
    for (size_t i = 0; i < plan->n_serves; i++) {
        uint32_t g = plan->serves[i].group;
        rt->peers[rt->n_peers++] = (graft__rt_peer_t){
            g, member_incarnation(v, g, rt->rank), ucx, nccl && plan->serves[i].primary, false};
    }
    graft_membership_view_free(v);
    return GRAFT_OK;
}

static void recipients_count(graft_runtime_t *rt)
{
    for (size_t i = 0; i < rt->n_peers; i++)
        rt->n_recipients += (uint32_t)rt->peers[i].ucx + (uint32_t)rt->peers[i].nccl;
    pthread_mutex_lock(&rt->mu);
    rt->metrics.serves++;
    pthread_mutex_unlock(&rt->mu);
}

/* How long a recipient whose member record this rank's view never showed
 * may take to appear before the fence stops waiting for it: the view can
 * lag the quorum by milliseconds, or the recipient left before it came. */
#define FENCE_UNSEEN_GRACE_NS 1000000000ull

/* How long the fence waits before it asks etcd whether its recipients have
 * voted (a normal pull ends well within), and how often it asks again. */
#define FENCE_VOTE_CHECK_NS 500000000ull

/* Completions the fence can no longer get: those of recipients whose rank
 * has left the job since the serve began (its member record is gone or is
 * a new incarnation, which pulls in a later quorum if at all). */
static uint32_t fence_units_gone(graft_runtime_t *rt, uint64_t waited_ns)
{
    graft_membership_view_t *v = NULL;
    uint32_t gone = 0;
    if (rt->n_peers == 0 || graft_membership_view_get(rt->m, &v) != GRAFT_OK)
        return 0;
    for (size_t i = 0; i < rt->n_peers; i++) {
        graft__rt_peer_t *p = &rt->peers[i];
        uint64_t now = member_incarnation(v, p->group, rt->rank);
        if (p->incarnation == 0 && now != 0) {
            p->incarnation = now; /* arrived late in the view */
        } else if (p->incarnation != 0 ? now != p->incarnation
                                       : waited_ns >= FENCE_UNSEEN_GRACE_NS) {
            gone += (uint32_t)p->ucx + (uint32_t)p->nccl;
            p->finished = true;
        }
    }
    graft_membership_view_free(v);
    return gone;
}

/* Is every recipient past this round: voted in it or a later one (a rank
 * votes only once its pull has ended, whether it read from this rank or
 * not), or left the job? A recipient whose pull failed before it reached
 * this rank (e.g. it gave up while this rank was still learning the
 * quorum) sends no TransferDone, and would otherwise hold the fence until
 * fence_timeout_ms. */
static bool fence_peers_finished(graft_runtime_t *rt, const graft_quorum_t *q)
{
    for (size_t i = 0; i < rt->n_peers; i++) {
        graft__rt_peer_t *p = &rt->peers[i];
        bool voted = false;
        if (!p->finished &&
            graft_membership_voted_since(rt->m, p->group, rt->rank, q->round, &voted) == GRAFT_OK)
            p->finished = voted;
        if (!p->finished)
            return false;
    }
    return true;
}

/* Serve q's step to rt->peers: over UCX (every region, or the host ones
 * when CUDA regions go over NCCL pairs) and over NCCL to the peers that
 * pair with this rank. rt->n_recipients becomes the number of completions
 * the fence waits for. */
static graft_status_t serve_start(graft_runtime_t *rt, const graft_quorum_t *q)
{
    graft_status_t st = graft_transfer_serve_begin(rt->ep, q->step);
    if (st != GRAFT_OK) {
        GRAFT_ERROR(GRAFT_RT_MOD, "cannot serve step %" PRIu64 ": %s", q->step,
                    graft_status_string(st));
        return st;
    }
    rt->serving = true;
    recipients_count(rt);
    if (graft__rt_nccl_on(rt))
        st = graft__rt_nccl_serve_start(rt, q);
    return st;
}

/* A relay announces its serve before its heal: its recipients queue at it
 * instead of being refused, and the heal thread begins the serve once the
 * state is in (heal_main). */
static graft_status_t relay_start(graft_runtime_t *rt, const graft_quorum_t *q)
{
    graft_status_t st = graft_transfer_serve_expect(rt->ep, q->step);
    if (st != GRAFT_OK) {
        GRAFT_ERROR(GRAFT_RT_MOD, "cannot announce the serve of step %" PRIu64 ": %s", q->step,
                    graft_status_string(st));
        return st;
    }
    rt->serving = true;
    rt->relay = true;
    rt->relay_served = false;
    recipients_count(rt);
    return GRAFT_OK;
}

/* The relay's heal ended without its serve (it failed): there is nothing
 * to fence; its recipients were refused and vote no. */
static void relay_abandon(graft_runtime_t *rt)
{
    if (!rt->relay || rt->relay_served)
        return;
    if (graft_transfer_serve_end(rt->ep) != GRAFT_OK)
        GRAFT_DEBUG(GRAFT_RT_MOD, "relay: the announced serve was withdrawn already");
    rt->serving = false;
    rt->relay = false;
    peers_free(rt);
}

/* Decide this group's role in quorum q and start the heal or the serve.
 * *fatal_p: the rank has no valid state and none can be had. */
static graft_status_t start_role(graft_runtime_t *rt, graft_quorum_t *q, bool *fatal_p)
{
    graft_status_t st = GRAFT_OK;
    graft__fanout_t plan = {0};
    rt->n_recipients = 0;
    rt->cold_sync = false;
    rt->relay = false;
    rt->relay_served = false;
    rt->heal_status = GRAFT_OK;
    rt->round_restored = false;
    /* The quorum assigns recoveries by the group's step, the lowest of its
     * ranks'. This rank can neither compute nor serve q's step when it
     * lacks the job's state, or when it is ahead of its own group's step
     * (another rank of the group failed to heal): then nobody in q holds
     * that state for it. Checked before serving, so undefined state is
     * never served, and before the step-0 sync, so a job that had
     * progressed is never started over. */
    if (!q->must_recover && (rt->need_state || graft_step(rt) > q->step)) {
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
        /* From here until a heal succeeds only a group or a checkpoint can
         * make the regions valid again. */
        if (!rt->cold_sync)
            rt->need_state = true;
        if (plan.relay) {
            st = peers_list(rt, &plan);
            if (st == GRAFT_OK)
                st = relay_start(rt, q);
            if (st != GRAFT_OK)
                goto out;
        }
        st = heal_start(rt, plan.donors, plan.n_donors);
        if (st != GRAFT_OK)
            relay_abandon(rt);
        goto out;
    }
    if (q->must_recover) {
        GRAFT_ERROR(GRAFT_RT_MOD, "quorum %" PRIu64 " says recover but assigns no donors",
                    q->id);
        st = GRAFT_ENODONOR;
        goto out;
    }
    st = peers_list(rt, &plan);
    if (st == GRAFT_OK && rt->n_peers > 0)
        st = serve_start(rt, q);
out:
    graft__fanout_free(&plan);
    return st;
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
    st = graft__rt_steady_quorum(rt, committed, &q);
    if (st != GRAFT_OK)
        return st;
    rt->q_steady = q != NULL;
    for (; q == NULL;) {
        uint64_t now = graft__now_ns();
        if (now >= deadline) {
            GRAFT_ERROR(GRAFT_RT_MOD, "group %" PRIu32 " rank %" PRIu32
                        ": no quorum within %" PRIu64 " ms: %s", rt->group, rt->rank,
                        rt->cfg->quorum_timeout_ms, graft_status_string(st));
            return st != GRAFT_OK ? st : GRAFT_ETIMEOUT;
        }
        uint32_t left = (uint32_t)GRAFT_MIN((deadline - now) / 1000000ull, UINT32_MAX);
        st = graft_membership_quorum_wait(rt->m, committed, GRAFT_MAX(left, 1u), &q);
        if (st == GRAFT_OK)
            break;
        /* A short round (too few groups) or a lost lease: the membership
         * layer re-joins by itself; announce again. */
        if (st != GRAFT_ENOQUORUM && st != GRAFT_ELEASE && st != GRAFT_ETIMEOUT &&
            graft_status_class(st) != GRAFT_CLASS_JOB)
            return st;
        GRAFT_DEBUG(GRAFT_RT_MOD, "quorum round: %s; trying again", graft_status_string(st));
    }
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
    bool fatal = false;
    st = start_role(rt, q, &fatal);
    if (!rt->q_steady && !fatal) {
        /* After the role started: a donor's serve must not wait for the
         * connections the steady path opens ahead. */
        graft_status_t sst = graft__rt_steady_enter(rt, q);
        if (sst != GRAFT_OK)
            GRAFT_WARN(GRAFT_RT_MOD, "steady path off for this epoch: %s",
                       graft_status_string(sst));
    }
    if (fatal) {
        /* Logged by the fallback. The group's vote stays missing (a no);
         * the runtime can be asked again, e.g. once a group is back. */
        rt->q = NULL;
        graft_membership_quorum_free(q);
        return st;
    }
    GRAFT_DEBUG(GRAFT_RT_MOD, "group %" PRIu32 " rank %" PRIu32 ": quorum round %" PRIu64
                " id %" PRIu64 " step %" PRIu64 " (mine %" PRIu64 ") %zu groups: %s",
                rt->group, rt->rank, q->round, q->id, q->step, committed, q->n_members,
                rt->heal_running ? "healing" : rt->serving ? "serving" : "computing");
    if (st != GRAFT_OK) {
        /* The step goes on; graft_commit() votes no and the group heals at
         * the next quorum. */
        rt->heal_status = st;
        rt->state_valid = false;
    }
    if (info_p != NULL) {
        graft_step_info_t info = {
            .step = q->step,
            .quorum_id = q->id,
            .quorum_changed = changed,
            .replica_rank = q->replica_rank,
            .replica_world = q->replica_world,
            .healing = rt->heal_running,
            .donor = rt->serving,
            .n_recipients = rt->n_recipients,
        };
        *info_p = info;
    }
    pthread_mutex_lock(&rt->mu);
    rt->metrics.last_quorum_ns = graft__now_ns() - t0;
    pthread_mutex_unlock(&rt->mu);
    return GRAFT_OK;
}

/* -------------------------------------------------------------- commit --- */

static void serve_stop(graft_runtime_t *rt, const graft_quorum_t *q)
{
    if (!rt->serving)
        return;
    /* Wait in slices: between them, a recipient that has left the job (a
     * process killed before it reached this donor cannot be seen by the
     * transport) stops holding the fence, and so, once every recipient has
     * voted or left, does the whole fence (fence_peers_finished). A count
     * can then include one that was done before it left, and the fence
     * opens early: a recipient still reading is then refused or fails its
     * chunk hashes and heals again, so nothing unverified is installed. */
    uint64_t start = graft__now_ns();
    uint64_t deadline = start + rt->cfg->fence_timeout_ms * 1000000ull;
    uint64_t vote_check = start + FENCE_VOTE_CHECK_NS;
    graft_status_t st;
    for (;;) {
        uint64_t now = graft__now_ns();
        uint32_t slice =
            now >= deadline ? 0 : (uint32_t)GRAFT_MIN(100, (deadline - now) / 1000000ull);
        st = graft_transfer_fence_wait(rt->ep, q->step, rt->n_recipients, slice);
        if (st != GRAFT_ETIMEOUT || graft__now_ns() >= deadline)
            break;
        uint32_t gone = fence_units_gone(rt, graft__now_ns() - start);
        if (gone > 0 && graft_transfer_fence_count(rt->ep, q->step) + gone >= rt->n_recipients) {
            GRAFT_WARN(GRAFT_RT_MOD, "group %" PRIu32 " rank %" PRIu32 ": fence of step %" PRIu64
                       ": %" PRIu32 " of %" PRIu32 " recipients done, the rest left the job; "
                       "not waiting for them", rt->group, rt->rank, q->step,
                       graft_transfer_fence_count(rt->ep, q->step), rt->n_recipients);
            st = GRAFT_OK;
            break;
        }
        if (graft__now_ns() >= vote_check) {
            vote_check = graft__now_ns() + FENCE_VOTE_CHECK_NS;
            if (fence_peers_finished(rt, q)) {
                GRAFT_WARN(GRAFT_RT_MOD, "group %" PRIu32 " rank %" PRIu32 ": fence of step %"
                           PRIu64 ": %" PRIu32 " of %" PRIu32 " recipients done, every one "
                           "has voted or left; not waiting for the rest", rt->group, rt->rank,
                           q->step, graft_transfer_fence_count(rt->ep, q->step),
                           rt->n_recipients);
                st = GRAFT_OK;
                break;
            }
        }
    }
    if (st != GRAFT_OK) {
        /* A recipient that died or stalled must not hold the job: it
         * verifies every chunk, so bytes changed under it are caught. */
        GRAFT_WARN(GRAFT_RT_MOD, "group %" PRIu32 " rank %" PRIu32 ": fence of step %" PRIu64
                   ": %" PRIu32 " of %" PRIu32 " recipients done after %" PRIu64 " ms",
                   rt->group, rt->rank, q->step, graft_transfer_fence_count(rt->ep, q->step),
                   rt->n_recipients, rt->cfg->fence_timeout_ms);
        pthread_mutex_lock(&rt->mu);
        rt->metrics.fence_timeouts++;
        pthread_mutex_unlock(&rt->mu);
    }
    graft__rt_nccl_serve_join(rt); /* they read the regions until they end */
    if (graft_transfer_serve_end(rt->ep) != GRAFT_OK)
        GRAFT_WARN(GRAFT_RT_MOD, "serve_end: not serving");
    rt->serving = false;
    peers_free(rt);
}

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

    if (rt->heal_running || !rt->state_valid) {
        st = graft_heal_wait(rt);
        if (st != GRAFT_OK || !rt->state_valid) {
            ok = false;
            reason = "heal failed";
        }
    }
    serve_stop(rt, q);
    if (ok && rt->round_restored) {
        ok = false;
        reason = "restored a checkpoint of another step";
    }
    if (ok && rt->vetoed) {
        ok = false;
        reason = "the trainer vetoed the step";
    }
    if (ok && q->n_members < rt->min_groups) {
        ok = false;
        reason = "too few groups";
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
        st = graft_membership_commit_vote(rt->m, q, ok, reason,
                                          (uint32_t)rt->cfg->join_timeout_ms, &decision);
    }
    graft__rt_steady_done(rt, decision);
    if (st != GRAFT_OK) {
        GRAFT_ERROR(GRAFT_RT_MOD, "group %" PRIu32 " rank %" PRIu32 ": commit vote of step %" PRIu64
                    ": %s", rt->group, rt->rank, q->step, graft_status_string(st));
        decision = false;
        if (ret == GRAFT_OK)
            ret = st;
    }
    GRAFT_DEBUG(GRAFT_RT_MOD, "group %" PRIu32 " rank %" PRIu32 ": step %" PRIu64
                " voted %s, group decided %s", rt->group, rt->rank, q->step, ok ? "yes" : reason,
                decision ? "apply" : "no");
    if (decision) {
        /* The persistent snapshot is of the state the step started from,
         * which is what the regions hold until the optimizer step. */
        graft_status_t pst = graft__rt_persist_at_commit(rt, q);
        if (pst != GRAFT_OK)
            GRAFT_WARN(GRAFT_RT_MOD, "checkpoint of step %" PRIu64 " not taken: %s", q->step,
                       graft_status_string(pst));
        set_step(rt, q->step + 1);
        if (!rt->healthy_published) {
            st = graft_membership_update(rt->m, GRAFT_MEMBER_HEALTHY, q->step + 1);
            rt->healthy_published = st == GRAFT_OK;
        }
        if (!rt->progress_published)
            publish_progress(rt, q->step + 1);
    } else {
        /* A healed group holds the quorum's step even when the vote fails. */
        if (rt->state_valid && !rt->round_restored)
            set_step(rt, q->step);
        graft_runtime_event_t ev = {.kind = GRAFT_RUNTIME_EVENT_COMMIT_FAILED,
                                    .status = ret != GRAFT_OK ? ret : GRAFT_EVOTE,
                                    .step = q->step, .quorum_id = q->id,
                                    .detail = reason != NULL ? reason : "another rank voted no"};
        graft__rt_emit(rt, &ev);
    }
    pthread_mutex_lock(&rt->mu);
    if (decision)
        rt->metrics.commits++;
    else
        rt->metrics.commits_failed++;
    rt->metrics.last_commit_ns = graft__now_ns() - t0;
    pthread_mutex_unlock(&rt->mu);
    graft_membership_quorum_free(q);
    rt->q = NULL;
    rt->round_restored = false;
    rt->vetoed = false;
    *apply_p = decision;
    return ret;
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
