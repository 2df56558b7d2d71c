/*
 * What the trainer and the rest of runtime/ observe of a runtime: the
 * accessors, metrics, the event callback and the job's event history. The
 * bottom of runtime/: every other file of the runtime may use it, it uses
 * none of them.
 */
#include "runtime_internal.h"

uint64_t graft_step(graft_runtime_t *rt)
{
    pthread_mutex_lock(&rt->mu);
    uint64_t s = rt->metrics.step;
    pthread_mutex_unlock(&rt->mu);
    return s;
}

uint64_t graft_quorum_id(graft_runtime_t *rt)
{
    pthread_mutex_lock(&rt->mu);
    uint64_t s = rt->metrics.quorum_id;
    pthread_mutex_unlock(&rt->mu);
    return s;
}

uint32_t graft_replica_rank(graft_runtime_t *rt)
{
    pthread_mutex_lock(&rt->mu);
    uint32_t v = rt->replica_rank;
    pthread_mutex_unlock(&rt->mu);
    return v;
}

uint32_t graft_replica_world(graft_runtime_t *rt)
{
    pthread_mutex_lock(&rt->mu);
    uint32_t v = rt->replica_world;
    pthread_mutex_unlock(&rt->mu);
    return v;
}

graft_start_kind_t graft_start_kind(graft_runtime_t *rt)
{
    pthread_mutex_lock(&rt->mu);
    graft_start_kind_t v = rt->start_kind;
    pthread_mutex_unlock(&rt->mu);
    return v;
}

void graft_fingerprint_set(graft_runtime_t *rt, graft_fingerprint_fn fn, void *arg)
{
    rt->fp_fn = fn;
    rt->fp_arg = arg;
}

void graft_event_callback_set(graft_runtime_t *rt, graft_runtime_event_fn fn, void *arg)
{
    pthread_mutex_lock(&rt->ev_mu);
    rt->ev_fn = fn;
    rt->ev_arg = arg;
    pthread_mutex_unlock(&rt->ev_mu);
}

const char *graft_runtime_event_kind_string(graft_runtime_event_kind_t kind)
{
    switch (kind) {
    case GRAFT_RUNTIME_EVENT_QUORUM_CHANGED: return "quorum_changed";
    case GRAFT_RUNTIME_EVENT_RECOVERY: return "recovery";
    case GRAFT_RUNTIME_EVENT_RESTORE: return "restore";
    case GRAFT_RUNTIME_EVENT_CHECKPOINT: return "checkpoint";
    case GRAFT_RUNTIME_EVENT_DRIFT: return "drift";
    case GRAFT_RUNTIME_EVENT_COMMIT_FAILED: return "commit_failed";
    case GRAFT_RUNTIME_EVENT_SPARE_PROMOTED: return "spare_promoted";
    case GRAFT_RUNTIME_EVENT_RESTARTED: return "restarted";
    }
    return "unknown";
}

void graft_log_callback_set(graft_log_fn fn, void *arg)
{
    graft_log_sink_set(fn, arg);
}

const char *graft_version(void)
{
    return graft_version_string();
}

void graft__rt_emit(graft_runtime_t *rt, const graft_runtime_event_t *ev)
{
    pthread_mutex_lock(&rt->ev_mu);
    if (rt->ev_fn != NULL) {
        graft_runtime_event_t copy = *ev;
        if (copy.detail == NULL)
            copy.detail = "";
        rt->ev_fn(&copy, rt->ev_arg);
    }
    pthread_mutex_unlock(&rt->ev_mu);
}

/* Record an event in the job's history in etcd, for tools and the
 * dashboard. Best effort: the step protocol never fails because of it. */
void graft__rt_job_event(graft_runtime_t *rt, graft_event_kind_t kind, uint64_t step, bool ok,
                         uint64_t duration_us, const char *detail)
{
    if (rt->m == NULL)
        return;
    graft_event_t ev = {
        .kind = kind,
        .group = rt->group,
        .rank = rt->rank,
        .incarnation = graft_membership_incarnation(rt->m),
        .quorum_id = rt->metrics.quorum_id,
        .step = step,
        .duration_us = duration_us,
        .ok = ok,
        .detail = (char *)(detail != NULL ? detail : ""),
    };
    graft_status_t st = graft_membership_event_append(rt->m, &ev);
    if (st != GRAFT_OK)
        GRAFT_WARN(GRAFT_MOD_RUNTIME,
                   "could not record a %s event: %s", graft_event_kind_string(kind),
                   graft_status_string(st));
}

void graft__rt_set_step(graft_runtime_t *rt, uint64_t step)
{
    pthread_mutex_lock(&rt->mu);
    rt->metrics.step = step;
    pthread_mutex_unlock(&rt->mu);
}
