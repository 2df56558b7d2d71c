/*
 * The coordinator's part of a spare's life (docs/RUNTIME.md, "Spares"): a
 * runtime started with spare = 1 has its endpoint up and its regions
 * registered, but no group; at its first graft_quorum() it waits in
 * membership (membership_spare.c) until it took a dead rank's slot, then
 * takes up that group (the endpoint's group, the step channel, the
 * checkpoint writer) and joins on the slot's record like a replacement.
 */
#include "runtime_internal.h"
#include "runtime_channel.h"

#include <inttypes.h>
#include <stdio.h>

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
    if (st == GRAFT_OK)
        st = graft_membership_spare_wait(sp, 0, &group);
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
