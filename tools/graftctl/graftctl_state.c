/*
 * The job's states that need more than one group's records: a group whose
 * settings disagree with the quorum's (misconfigured) and a job that has
 * live ranks but commits no step (paused), each with its reason. Read from
 * the status graftctl_status_json() built and the job's event history; no
 * record of its own.
 */
#include "graftctl.h"

#include <graft/graft.h>

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

const char *graftctl_group_mismatch(const graft_event_t *ev, size_t nev, uint32_t group)
{
    /* The group's newest join or vote result: a rank that joined since the
     * failed vote may have been started with the right settings. */
    for (size_t i = nev; i-- > 0;) {
        const graft_event_t *e = &ev[i];
        if (e->group != group ||
            (e->kind != GRAFT_EVENT_JOIN && e->kind != GRAFT_EVENT_VOTE_RESULT))
            continue;
        if (e->kind == GRAFT_EVENT_VOTE_RESULT && !e->ok && e->detail != NULL &&
            strstr(e->detail, GRAFT_CONFIG_MISMATCH_TEXT) != NULL)
            return e->detail;
        return NULL;
    }
    return NULL;
}

/* The failed votes a vote event stands for beyond itself: rank 0 records
 * the first few of a run, then one every few seconds ending "(+K failed
 * votes not recorded)" (membership_votes.c). */
static size_t vote_event_skipped(const char *detail)
{
    const char *p = detail != NULL ? strstr(detail, " (+") : NULL;
    if (p == NULL || strstr(p, " failed votes not recorded)") == NULL)
        return 0;
    return (size_t)strtoull(p + 3, NULL, 10);
}

bool graftctl_group_voting_no(const graft_event_t *ev, size_t nev, uint32_t group,
                              uint64_t committed, uint64_t now_ms, char *why, size_t len)
{
    const graft_event_t *newest = NULL;
    uint64_t first_step = 0;
    size_t n = 0;
    /* Rank 0 of the group records each failed vote of its group (a vote
     * that passes records nothing): "rank R voted no: why". */
    for (size_t i = nev; i-- > 0;) {
        const graft_event_t *e = &ev[i];
        if (e->group != group)
            continue;
        if (e->kind == GRAFT_EVENT_JOIN)
            break; /* a rank joined since: it may vote otherwise */
        if (e->kind != GRAFT_EVENT_VOTE_RESULT || e->ok || e->step < committed)
            continue;
        if (e->detail != NULL && strstr(e->detail, GRAFT_CONFIG_MISMATCH_TEXT) != NULL)
            return false; /* misconfigured says it */
        newest = newest != NULL ? newest : e;
        first_step = e->step;
        n += 1 + vote_event_skipped(e->detail);
    }
    if (n < GRAFTCTL_VOTING_NO_AFTER || newest->unix_ms + GRAFTCTL_VOTING_NO_WITHIN_MS < now_ms)
        return false;
    char text[GRAFTCTL_TEXT_LEN];
    if (first_step == newest->step)
        snprintf(why, len, "%zu failed votes at step %" PRIu64 ", the newest: %s", n,
                 newest->step, graftctl_text(newest->detail, text, sizeof(text)));
    else
        snprintf(why, len, "%zu failed votes, steps %" PRIu64 "-%" PRIu64 ", the newest: %s", n,
                 first_step, newest->step, graftctl_text(newest->detail, text, sizeof(text)));
    return true;
}

void graftctl_group_cannot_serve_reason(const graft_membership_view_t *v, const graft_event_t *ev,
                                        size_t nev, uint32_t group, char *why, size_t len)
{
    char ranks[96] = "", text[GRAFTCTL_TEXT_LEN];
    size_t used = 0;
    for (size_t i = 0; i < v->n_members && used < sizeof(ranks) - 16; i++)
        if (v->members[i].group == group && v->members[i].state == GRAFT_MEMBER_CANNOT_SERVE)
            used += (size_t)snprintf(ranks + used, sizeof(ranks) - used, "%s%" PRIu32,
                                     used > 0 ? "," : "", v->members[i].rank);
    const size_t lead = strlen(GRAFT_CANNOT_SERVE_TEXT);
    for (size_t i = nev; i-- > 0;) {
        const graft_event_t *e = &ev[i];
        if (e->group == group && e->kind == GRAFT_EVENT_ERROR && !e->ok && e->detail != NULL &&
            strncmp(e->detail, GRAFT_CANNOT_SERVE_TEXT, lead) == 0) {
            snprintf(why, len, "rank %s %s (at step %" PRIu64 ")", ranks,
                     graftctl_text(e->detail, text, sizeof(text)), e->step);
            return;
        }
    }
    snprintf(why, len, "rank %s %s: its member record says so (no event in the history)", ranks,
             GRAFT_CANNOT_SERVE_TEXT);
}

/* The newest failed vote, its group and detail, for a reason. */
static const graft_event_t *newest_no(const graft_event_t *ev, size_t nev)
{
    for (size_t i = nev; i-- > 0;)
        if (ev[i].kind == GRAFT_EVENT_VOTE_RESULT && !ev[i].ok)
            return &ev[i];
    return NULL;
}

/* Why a job with live ranks commits nothing: a misconfigured group, fewer
 * live groups than the quorum needs, the newest failed vote, or only the
 * time. Writes into why. */
static void pause_reason(json_t *status, const graft_event_t *ev, size_t nev, uint64_t idle_ms,
                         char *why, size_t len)
{
    size_t i, live = 0;
    json_t *g;
    json_array_foreach(json_object_get(status, "groups"), i, g) {
        if (strcmp(json_string_value(json_object_get(g, "health")), "misconfigured") == 0) {
            snprintf(why, len, "group %" JSON_INTEGER_FORMAT ": %s",
                     json_integer_value(json_object_get(g, "group")),
                     json_string_value(json_object_get(g, "reason")));
            return;
        }
        live += json_array_size(json_object_get(g, "ranks")) > 0;
    }
    json_int_t need = json_integer_value(
        json_object_get(json_object_get(status, "quorum"), "min_groups"));
    if ((json_int_t)live < need) {
        snprintf(why, len, "no quorum: %zu groups live, %" JSON_INTEGER_FORMAT " needed "
                 "(min_groups)", live, need);
        return;
    }
    const graft_event_t *no = newest_no(ev, nev);
    if (no != NULL && graftctl_now_ms() - no->unix_ms <= idle_ms) {
        char text[GRAFTCTL_TEXT_LEN];
        snprintf(why, len, "group %" PRIu32 " voted no at step %" PRIu64 ": %s", no->group,
                 no->step, graftctl_text(no->detail, text, sizeof(text)));
        return;
    }
    snprintf(why, len, "no step committed for %" PRIu64 " s", idle_ms / 1000);
}

void graftctl_job_pause_check(json_t *status, const graft_event_t *ev, size_t nev)
{
    size_t i, live = 0, fresh = 0;
    json_t *g;
    uint64_t idle = UINT64_MAX;
    if (!json_is_integer(json_object_get(status, "step")))
        return; /* no step yet: a job starting is not paused */
    /* Paused: every group's progress record is stale (older than three
     * record periods and three of its steps), with ranks live. */
    json_array_foreach(json_object_get(status, "groups"), i, g) {
        live += json_array_size(json_object_get(g, "ranks"));
        json_t *p = json_object_get(g, "progress");
        json_t *age = json_object_get(p, "age_ms");
        fresh += json_is_false(json_object_get(p, "stale"));
        if (json_is_integer(age) && (uint64_t)json_integer_value(age) < idle)
            idle = (uint64_t)json_integer_value(age);
    }
    if (idle == UINT64_MAX)
        return; /* no group record: a job of an older library, or none yet */
    /* How long since any group reported a step, and whether every record
     * is stale: 'no progress for N s' where a rate would mislead. */
    json_object_set_new(status, "progress_age_ms", json_integer((json_int_t)idle));
    json_object_set_new(status, "progress_stale", json_boolean(fresh == 0));
    if (live == 0 || fresh > 0)
        return;
    char why[GRAFTCTL_TEXT_LEN + 128];
    pause_reason(status, ev, nev, idle, why, sizeof(why));
    json_object_set_new(status, "state", json_string("paused"));
    json_object_set_new(status, "state_reason", graftctl_json_text(why));
}
