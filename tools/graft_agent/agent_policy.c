/*
 * graft-agent: the decisions, as pure functions of their inputs (no
 * process is started here): the units the options ask for, the back-off,
 * what to do when a process ended (agent_exit_decide), the names and texts
 * the reports use, and the {slot}-style words of the command. Below every
 * other file of the agent.
 */
#include "agent.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>

uint64_t agent_now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
}

uint64_t agent_unix_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
}

uint32_t agent_backoff_ms(uint32_t failures, uint32_t base_ms, uint32_t max_ms)
{
    uint64_t d = base_ms;
    for (uint32_t i = 1; i < failures && d < max_ms; i++)
        d *= 2;
    return (uint32_t)(d < max_ms ? d : max_ms);
}

agent_decision_t agent_exit_decide(const agent_opts_t *o, const agent_unit_t *u, int wstatus,
                                   uint64_t ran_ms)
{
    agent_decision_t d = {.action = AGENT_ACT_DONE,
                          .role = o->spares > 0 ? AGENT_ROLE_SPARE : AGENT_ROLE_PRIMARY};
    if (u->stopping || (WIFEXITED(wstatus) && WEXITSTATUS(wstatus) == 0))
        return d;
    /* A process that ran a while before it died is a new failure, not one
     * more of a crash loop. */
    d.failures = ran_ms >= o->healthy_ms ? 1 : u->failures + 1;
    if (d.failures > o->max_restarts) {
        d.action = AGENT_ACT_GIVE_UP;
        return d;
    }
    d.action = AGENT_ACT_RESTART;
    d.delay_ms = agent_backoff_ms(d.failures, o->backoff_ms, o->backoff_max_ms);
    return d;
}

void agent_status_text(int wstatus, char *buf, size_t len)
{
    if (wstatus < 0)
        snprintf(buf, len, "not run");
    else if (WIFEXITED(wstatus))
        snprintf(buf, len, "exit %d", WEXITSTATUS(wstatus));
    else if (WIFSIGNALED(wstatus))
        snprintf(buf, len, "killed by signal %d (%s)", WTERMSIG(wstatus),
                 strsignal(WTERMSIG(wstatus)));
    else
        snprintf(buf, len, "status 0x%x", (unsigned)wstatus);
}

const char *agent_unit_kind(const agent_unit_t *u)
{
    if (u->rank == UINT32_MAX)
        return u->role == AGENT_ROLE_SPARE ? "spare-world" : "world";
    return u->role == AGENT_ROLE_SPARE ? "spare" : "rank";
}

int agent_units_plan(const agent_opts_t *o, agent_unit_t *u)
{
    int n = 0;
    size_t per = o->mode == AGENT_MODE_LAUNCHER ? 1 : o->n_ranks;
    for (uint32_t copy = o->have_group ? 0 : 1; copy <= o->spares; copy++)
        for (size_t i = 0; i < per && n < AGENT_MAX_UNITS; i++) {
            agent_unit_t *x = &u[n];
            memset(x, 0, sizeof(*x));
            x->slot = n++;
            x->rank = o->mode == AGENT_MODE_LAUNCHER ? UINT32_MAX : o->ranks[i];
            x->spare_slot = copy > 0;
            x->role = copy > 0 ? AGENT_ROLE_SPARE : AGENT_ROLE_PRIMARY;
            x->group = x->role == AGENT_ROLE_PRIMARY ? (int64_t)o->group : -1;
            x->last_status = -1;
        }
    return n;
}

char *agent_arg_expand(const char *arg, const agent_unit_t *u, const agent_opts_t *o)
{
    char vals[4][24];
    static const char *const keys[] = {"{slot}", "{start}", "{rank}", "{group}"};
    snprintf(vals[0], sizeof(vals[0]), "%d", u->slot);
    snprintf(vals[1], sizeof(vals[1]), "%u", u->starts);
    snprintf(vals[2], sizeof(vals[2]), u->rank == UINT32_MAX ? "all" : "%u", u->rank);
    snprintf(vals[3], sizeof(vals[3]), u->role == AGENT_ROLE_SPARE ? "spare" : "%u", o->group);
    size_t cap = strlen(arg) * 24 + 1, n = 0;
    char *out = malloc(cap);
    if (out == NULL)
        return NULL;
    while (*arg != '\0') {
        size_t k = 0;
        while (k < 4 && strncmp(arg, keys[k], strlen(keys[k])) != 0)
            k++;
        if (k < 4) {
            n += (size_t)snprintf(out + n, cap - n, "%s", vals[k]);
            arg += strlen(keys[k]);
        } else {
            out[n++] = *arg++;
        }
    }
    out[n] = '\0';
    return out;
}
