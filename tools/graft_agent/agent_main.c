/*
 * graft-agent: main and the loop. Each turn reaps the processes that
 * ended and applies agent_exit_decide() to them, starts the units whose
 * back-off is over, marks the spares etcd shows in a slot, stops the
 * waiting spares once asked to, and reports. Single-threaded apart from
 * the observer's and the HTTP server's own threads.
 */
#include "agent.h"

#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#define AGENT_TURN_MS 100
#define AGENT_REPORT_EVERY_MS 1000

static volatile sig_atomic_t stop_signal;

static void on_signal(int sig)
{
    stop_signal = sig;
}

/* Only there to cut the loop's sleep short when a process ends. */
static void on_child(int sig)
{
    (void)sig;
}

static void rank_text(const agent_unit_t *u, char *buf, size_t len)
{
    snprintf(buf, len, u->rank == UINT32_MAX ? "the world" : "rank %u", u->rank);
}

/* "kind (rank r, group g)" or "kind (rank r, no slot)" for a waiting spare. */
static void unit_text(const agent_unit_t *u, char *buf, size_t len)
{
    char rank[24];
    rank_text(u, rank, sizeof(rank));
    if (u->group < 0)
        snprintf(buf, len, "%s (%s, no slot)", agent_unit_kind(u), rank);
    else
        snprintf(buf, len, "%s (%s, group %lld)", agent_unit_kind(u), rank, (long long)u->group);
}

static void unit_ended(agent_t *a, agent_unit_t *u, int wstatus)
{
    uint64_t ran = agent_now_ms() - u->started_ms;
    agent_decision_t d = agent_exit_decide(&a->o, u, wstatus, ran);
    char how[96], rank[24], what[80];
    agent_status_text(wstatus, how, sizeof(how));
    rank_text(u, rank, sizeof(rank));
    unit_text(u, what, sizeof(what));
    pid_t pid = u->pid;
    u->pid = 0;
    u->last_status = wstatus;
    if (d.action == AGENT_ACT_DONE) {
        bool clean = WIFEXITED(wstatus) && WEXITSTATUS(wstatus) == 0;
        a->c.clean_exits += clean;
        a->held_any |= clean && u->group >= 0;
        u->state = AGENT_UNIT_DONE;
        agent_event(a, clean ? "exit" : "stopped", "slot %d: %s pid %d: %s", u->slot, what,
                    (int)pid, how);
        return;
    }
    a->c.failures++;
    u->failures = d.failures;
    if (d.action == AGENT_ACT_GIVE_UP) {
        u->state = AGENT_UNIT_DONE;
        a->gave_up = true;
        agent_event(a, "gave_up", "slot %d: %s died %u times in a row (the last: pid %d, %s, "
                    "after %.1f s); giving up (--max-restarts %u)", u->slot, rank, d.failures,
                    (int)pid, how, (double)ran / 1000.0, a->o.max_restarts);
        agent_watch_evict(a, u);
        return;
    }
    u->state = AGENT_UNIT_BACKOFF;
    u->restart_at_ms = agent_now_ms() + d.delay_ms;
    agent_event(a, "died", "slot %d: %s pid %d: %s after %.1f s; restart as %s in %u ms "
                "(failure %u of %u in a row)", u->slot, what, (int)pid, how, (double)ran / 1000.0,
                d.role == AGENT_ROLE_SPARE ? "a spare" : "the same rank", d.delay_ms,
                d.failures, a->o.max_restarts);
    agent_watch_evict(a, u);
    u->role = d.role;
    u->group = -1;
}

static void reap(agent_t *a)
{
    int st;
    pid_t pid;
    while ((pid = waitpid(-1, &st, WNOHANG)) > 0)
        for (int i = 0; i < a->n_units; i++)
            if (a->units[i].pid == pid && a->units[i].state == AGENT_UNIT_RUNNING)
                unit_ended(a, &a->units[i], st);
}

static void start_due(agent_t *a)
{
    uint64_t now = agent_now_ms();
    for (int i = 0; i < a->n_units; i++) {
        agent_unit_t *u = &a->units[i];
        if (u->state != AGENT_UNIT_BACKOFF || u->restart_at_ms > now)
            continue;
        if (agent_unit_start(a, u))
            a->c.restarts++;
        else
            u->restart_at_ms = now + a->o.backoff_ms;
    }
}

/* The first start. With spares kept, a slot of this host's group that a
 * live process holds already (this host was replaced: a pod rescheduled,
 * a node swapped) is not taken from it: its unit starts as a spare. */
static void start_all(agent_t *a)
{
    for (int i = 0; i < a->n_units; i++) {
        agent_unit_t *u = &a->units[i];
        if (u->role == AGENT_ROLE_PRIMARY && a->o.spares > 0 &&
            agent_watch_slot_held(a, a->o.group, u->rank)) {
            agent_event(a, "slot_held", "slot %d: group %u's slot of rank %lld is held by a live "
                        "process: started as a spare", u->slot, a->o.group,
                        u->rank == UINT32_MAX ? -1LL : (long long)u->rank);
            u->role = AGENT_ROLE_SPARE;
        }
        u->state = AGENT_UNIT_BACKOFF;
        u->restart_at_ms = 0;
        if (!agent_unit_start(a, u))
            u->restart_at_ms = agent_now_ms() + a->o.backoff_ms;
    }
}

static bool all_done(const agent_t *a)
{
    for (int i = 0; i < a->n_units; i++)
        if (a->units[i].state != AGENT_UNIT_DONE)
            return false;
    return true;
}

/* --stop-spares-after-ms: once every unit that held a slot ended with 0,
 * the spares still waiting are stopped after the delay. */
static void stop_spares_when_due(agent_t *a)
{
    if (a->o.stop_spares_ms < 0 || !a->held_any)
        return;
    for (int i = 0; i < a->n_units; i++) {
        const agent_unit_t *u = &a->units[i];
        bool waiting_spare = u->role == AGENT_ROLE_SPARE && u->group < 0 &&
                             u->state == AGENT_UNIT_RUNNING;
        if (!waiting_spare && u->state != AGENT_UNIT_DONE)
            return;
    }
    uint64_t now = agent_now_ms();
    if (a->spares_idle_since_ms == 0)
        a->spares_idle_since_ms = now;
    if (now - a->spares_idle_since_ms < (uint64_t)a->o.stop_spares_ms)
        return;
    for (int i = 0; i < a->n_units; i++)
        if (a->units[i].state == AGENT_UNIT_RUNNING && !a->units[i].stopping) {
            agent_event(a, "spare_stopped", "slot %d: its slots ended %lld ms ago; pid %d stopped",
                        a->units[i].slot, (long long)a->o.stop_spares_ms, (int)a->units[i].pid);
            agent_unit_signal(&a->units[i], false);
        }
}

/* SIGTERM every process, SIGKILL those left after the grace. */
static void stop_all(agent_t *a)
{
    for (int i = 0; i < a->n_units; i++) {
        if (a->units[i].state == AGENT_UNIT_BACKOFF)
            a->units[i].state = AGENT_UNIT_DONE;
        if (a->units[i].state == AGENT_UNIT_RUNNING)
            agent_unit_signal(&a->units[i], false);
    }
    uint64_t end = agent_now_ms() + a->o.stop_grace_ms;
    while (!all_done(a) && agent_now_ms() < end) {
        usleep(20000);
        reap(a);
    }
    for (int i = 0; i < a->n_units; i++)
        if (a->units[i].state == AGENT_UNIT_RUNNING)
            agent_unit_signal(&a->units[i], true);
    while (!all_done(a)) {
        usleep(20000);
        reap(a);
    }
}

static int run(agent_t *a)
{
    uint64_t reported_ms = 0, reported_events = UINT64_MAX;
    agent_watch_open(a);
    start_all(a);
    while (!all_done(a) && !a->gave_up && stop_signal == 0) {
        reap(a);
        start_due(a);
        agent_watch_refresh(a);
        stop_spares_when_due(a);
        uint64_t now = agent_now_ms();
        if (a->n_events != reported_events || now - reported_ms >= AGENT_REPORT_EVERY_MS) {
            agent_report(a);
            reported_ms = now;
            reported_events = a->n_events;
        }
        agent_watch_wait(a, AGENT_TURN_MS);
    }
    int rc = AGENT_OK;
    if (a->gave_up || stop_signal != 0) {
        if (stop_signal != 0)
            agent_event(a, "signal", "%s: stopping every process", strsignal(stop_signal));
        stop_all(a);
        rc = AGENT_FAIL;
    }
    a->state = a->gave_up ? "failed" : stop_signal != 0 ? "stopped" : "finished";
    agent_event(a, a->state, "%llu started, %llu restarted, %llu failed, %llu promoted",
                (unsigned long long)a->c.starts, (unsigned long long)a->c.restarts,
                (unsigned long long)a->c.failures, (unsigned long long)a->c.promotions);
    agent_report(a);
    return rc;
}

static void dry_run(const agent_t *a)
{
    const agent_opts_t *o = &a->o;
    printf("graft-agent: dry run on %s: job %s, etcd %s, %s mode, %u spare%s per %s\n", a->host,
           o->job != NULL ? o->job : "(from the environment)", o->endpoints_text,
           o->mode == AGENT_MODE_LAUNCHER ? "launcher" : "ranks", o->spares,
           o->spares == 1 ? "" : "s", o->mode == AGENT_MODE_LAUNCHER ? "world" : "rank");
    for (int i = 0; i < a->n_units; i++) {
        const agent_unit_t *u = &a->units[i];
        char rank[24];
        rank_text(u, rank, sizeof(rank));
        printf("slot %d: %s, %s: ", u->slot, agent_unit_kind(u), rank);
        if (u->role == AGENT_ROLE_SPARE)
            printf("GRAFT_SPARE=1%s", o->follow ? " GRAFT_SPARE_FOLLOW=1" : "");
        else
            printf("GRAFT_GROUP=%u", o->group);
        if (u->rank != UINT32_MAX)
            printf(" GRAFT_RANK=%u", u->rank);
        for (int k = 0; k < o->n_cmd; k++) {
            char *arg = agent_arg_expand(o->cmd[k], u, o);
            printf(" %s", arg != NULL ? arg : o->cmd[k]);
            free(arg);
        }
        printf("\n");
    }
}

int main(int argc, char **argv)
{
    static agent_t a; /* large: not on the stack */
    char why[512];
    int rc = agent_opts_parse(argc, argv, &a.o, why, sizeof(why));
    if (rc < 0) {
        agent_help_print();
        return AGENT_OK;
    }
    if (rc != AGENT_OK) {
        fprintf(stderr, "graft-agent: %s\n", why);
        agent_opts_clear(&a.o);
        return rc;
    }
    if (gethostname(a.host, sizeof(a.host)) != 0)
        snprintf(a.host, sizeof(a.host), "unknown");
    a.host[sizeof(a.host) - 1] = '\0';
    a.state = "running";
    a.started_unix_ms = agent_unix_ms();
    pthread_mutex_init(&a.report_mu, NULL);
    a.n_units = agent_units_plan(&a.o, a.units);
    if (a.o.dry_run) {
        dry_run(&a);
        agent_opts_clear(&a.o);
        return AGENT_OK;
    }
    signal(SIGPIPE, SIG_IGN);
    signal(SIGTERM, on_signal);
    signal(SIGINT, on_signal);
    signal(SIGCHLD, on_child);
    agent_report(&a);
    if (!agent_http_start(&a, why, sizeof(why))) {
        fprintf(stderr, "graft-agent: %s\n", why);
        rc = AGENT_USAGE;
    } else {
        rc = run(&a);
    }
    agent_http_stop(&a);
    agent_watch_close(&a);
    free(a.status_json);
    free(a.metrics_text);
    pthread_mutex_destroy(&a.report_mu);
    agent_opts_clear(&a.o);
    return rc;
}
