/*
 * graft_heal_wait(): the step's end of a heal. It joins the heal
 * (runtime_heal.c), withdraws a relay's serve that never began
 * (runtime_serve.c), runs the trainer's check of the installed state, and
 * records the outcome (step state, metrics, the recovery event). Part of
 * the step's coordinator with runtime_step.c: the objects it calls do not
 * call each other.
 */
#include "runtime_internal.h"

#include <inttypes.h>
#include <stdio.h>
#include <string.h>

/* The heal's outcome into the step state, the metrics and the events. */
static void heal_record(graft_runtime_t *rt, graft_status_t st, uint64_t verify_ns,
                        const char *detail)
{
    const graft_transfer_report_t *rep = &rt->heal.report;
    rt->heal.status = st;
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
        GRAFT_ERROR(GRAFT_MOD_RUNTIME, "group %" PRIu32 " rank %" PRIu32 ": heal failed: %s",
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
}

graft_status_t graft_heal_wait(graft_runtime_t *rt)
{
    if (rt == NULL)
        return GRAFT_EINVAL;
    if (!rt->heal.running)
        return rt->q != NULL && !rt->state_valid ? rt->heal.status : GRAFT_OK;
    char detail[512] = "", lost[320] = "";
    graft_status_t st = graft__rt_heal_join(rt, lost, sizeof(lost));
    const graft_transfer_report_t *rep = &rt->heal.report;
    uint64_t verify_ns = 0;
    /* A no-op unless this was a relay's heal and its serve did not begin. */
    graft__rt_relay_abandon(rt, rt->heal.relay_served);
    if (st == GRAFT_OK)
        graft__rt_skip_restore(rt); /* test-only: a no-op unless the switch is set */
    if (st == GRAFT_OK && rt->fp_fn != NULL) {
        /* The trainer's own check of the installed state; a failing
         * callback fails the heal. */
        uint64_t t = graft__now_ns(), fp = 0;
        st = rt->fp_fn(rt->fp_arg, &fp);
        verify_ns = graft__now_ns() - t;
        if (st != GRAFT_OK)
            GRAFT_ERROR(GRAFT_MOD_RUNTIME, "fingerprint of the healed state failed: %s",
                        graft_status_string(st));
    }
    if (st == GRAFT_EDRIFT)
        snprintf(detail, sizeof(detail), "donors disagree on region %s chunk %" PRIu64,
                 rep->drift.region, rep->drift.chunk);
    else
        snprintf(detail, sizeof(detail), "%zu donors, %" PRIu64 " bytes: %s%s", rep->n_donors,
                 rep->bytes, graft_status_string(st), lost);
    heal_record(rt, st, verify_ns, detail);
    return st;
}
