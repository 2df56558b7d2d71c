/*
 * graft-agent: what it reports. Every event is one log line on stderr and
 * kept in a ring of the newest AGENT_MAX_EVENTS; the status (JSON) and the
 * metrics (Prometheus text exposition format 0.0.4, names as graftctl's
 * /metrics: a graft_agent_ prefix, counters in _total) are made from the
 * units and the counters, written to their files by rename (a reader never
 * sees half a file) and handed to the HTTP server.
 */
#include "agent.h"

#include <errno.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

void agent_event(agent_t *a, const char *what, const char *fmt, ...)
{
    agent_event_t *e = &a->events[a->n_events++ % AGENT_MAX_EVENTS];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(e->detail, sizeof(e->detail), fmt, ap);
    va_end(ap);
    snprintf(e->what, sizeof(e->what), "%s", what);
    e->unix_ms = agent_unix_ms();
    time_t t = (time_t)(e->unix_ms / 1000);
    struct tm tm;
    char when[32];
    gmtime_r(&t, &tm);
    strftime(when, sizeof(when), "%Y-%m-%dT%H:%M:%S", &tm);
    fprintf(stderr, "graft-agent: %s.%03uZ %s: %s\n", when, (unsigned)(e->unix_ms % 1000), what,
            e->detail);
}

int agent_spares_warm(const agent_t *a)
{
    int n = 0;
    for (int i = 0; i < a->n_units; i++)
        n += a->units[i].state == AGENT_UNIT_RUNNING && a->units[i].role == AGENT_ROLE_SPARE &&
             a->units[i].group < 0;
    return n;
}

static const char *unit_state(const agent_unit_t *u)
{
    static const char *const names[] = {"running", "backoff", "done"};
    return names[u->state];
}

static json_t *unit_json(const agent_unit_t *u)
{
    char last[96];
    agent_status_text(u->last_status, last, sizeof(last));
    json_t *j = json_pack("{s:i, s:s, s:s, s:b, s:i, s:I, s:I, s:s}", "slot", u->slot, "kind",
                          agent_unit_kind(u), "state", unit_state(u), "spare_slot",
                          u->spare_slot, "pid", (int)u->pid, "starts", (json_int_t)u->starts,
                          "failures_in_row", (json_int_t)u->failures, "last_exit", last);
    if (j == NULL)
        return NULL;
    json_object_set_new(j, "rank", u->rank == UINT32_MAX ? json_null() : json_integer(u->rank));
    json_object_set_new(j, "group", u->group < 0 ? json_null() : json_integer(u->group));
    if (u->state == AGENT_UNIT_BACKOFF) {
        uint64_t now = agent_now_ms();
        json_object_set_new(j, "restart_in_ms",
                            json_integer(u->restart_at_ms > now ? (json_int_t)(u->restart_at_ms - now) : 0));
    }
    return j;
}

json_t *agent_status_json(const agent_t *a)
{
    const agent_opts_t *o = &a->o;
    json_t *units = json_array(), *events = json_array();
    for (int i = 0; i < a->n_units; i++)
        json_array_append_new(units, unit_json(&a->units[i]));
    uint64_t first = a->n_events > AGENT_MAX_EVENTS ? a->n_events - AGENT_MAX_EVENTS : 0;
    for (uint64_t i = first; i < a->n_events; i++) {
        const agent_event_t *e = &a->events[i % AGENT_MAX_EVENTS];
        json_array_append_new(events, json_pack("{s:I, s:s, s:s}", "unix_ms", (json_int_t)e->unix_ms,
                                                "what", e->what, "detail", e->detail));
    }
    const agent_counters_t *c = &a->c;
    json_t *counters = json_pack("{s:I, s:I, s:I, s:I, s:I}", "starts", (json_int_t)c->starts,
                                 "restarts", (json_int_t)c->restarts, "failures",
                                 (json_int_t)c->failures, "clean_exits",
                                 (json_int_t)c->clean_exits, "promotions",
                                 (json_int_t)c->promotions);
    json_t *j = json_pack("{s:s, s:s?, s:s, s:s, s:I, s:i, s:i, s:b, s:o, s:o, s:o}", "state",
                          a->state, "job", o->job, "host", a->host, "mode",
                          o->mode == AGENT_MODE_LAUNCHER ? "launcher" : "ranks",
                          "started_unix_ms", (json_int_t)a->started_unix_ms, "spares_target",
                          (int)(o->spares * (o->mode == AGENT_MODE_LAUNCHER ? 1 : o->n_ranks)),
                          "spares_warm", agent_spares_warm(a), "etcd_observed", a->obs != NULL,
                          "counters", counters, "units", units, "events", events);
    if (j != NULL)
        json_object_set_new(j, "group", o->have_group ? json_integer(o->group) : json_null());
    return j;
}

static void head(FILE *f, const char *name, const char *type, const char *help)
{
    fprintf(f, "# HELP %s %s\n# TYPE %s %s\n", name, help, name, type);
}

static void counter(FILE *f, const char *name, uint64_t v, const char *help)
{
    head(f, name, "counter", help);
    fprintf(f, "%s %" PRIu64 "\n", name, v);
}

static void unit_gauges(FILE *f, const agent_t *a)
{
    static const char *const kinds[] = {"rank", "spare", "world", "spare-world"};
    static const char *const states[] = {"running", "backoff", "done"};
    head(f, "graft_agent_units", "gauge", "This host's units by kind (as last started) and state.");
    for (size_t k = 0; k < 4; k++) {
        if ((k >= 2) != (a->o.mode == AGENT_MODE_LAUNCHER))
            continue;
        for (int s = 0; s < 3; s++) {
            int n = 0;
            for (int i = 0; i < a->n_units; i++)
                n += strcmp(agent_unit_kind(&a->units[i]), kinds[k]) == 0 &&
                     (int)a->units[i].state == s;
            fprintf(f, "graft_agent_units{kind=\"%s\",state=\"%s\"} %d\n", kinds[k], states[s], n);
        }
    }
    head(f, "graft_agent_unit_failures_in_row", "gauge",
         "Failures in a row of a unit's processes (the agent gives up past --max-restarts).");
    for (int i = 0; i < a->n_units; i++)
        fprintf(f, "graft_agent_unit_failures_in_row{slot=\"%d\"} %u\n", a->units[i].slot,
                a->units[i].failures);
}

char *agent_metrics_text(const agent_t *a)
{
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    if (f == NULL)
        return NULL;
    static const char *const states[] = {"running", "finished", "failed", "stopped"};
    head(f, "graft_agent_state", "gauge", "The agent's state: 1 for the current one.");
    for (size_t i = 0; i < 4; i++)
        fprintf(f, "graft_agent_state{state=\"%s\"} %d\n", states[i], strcmp(a->state, states[i]) == 0);
    head(f, "graft_agent_spares_warm", "gauge", "Spares of this host waiting for a slot.");
    fprintf(f, "graft_agent_spares_warm %d\n", agent_spares_warm(a));
    head(f, "graft_agent_spares_target", "gauge", "Spares this host keeps (--spares x its ranks).");
    fprintf(f, "graft_agent_spares_target %zu\n",
            (size_t)a->o.spares * (a->o.mode == AGENT_MODE_LAUNCHER ? 1 : a->o.n_ranks));
    unit_gauges(f, a);
    counter(f, "graft_agent_starts_total", a->c.starts, "Processes started (restarts included).");
    counter(f, "graft_agent_restarts_total", a->c.restarts, "Processes started again after one died.");
    counter(f, "graft_agent_failures_total", a->c.failures, "Processes that ended other than with 0.");
    counter(f, "graft_agent_clean_exits_total", a->c.clean_exits, "Processes that ended with 0.");
    counter(f, "graft_agent_promotions_total", a->c.promotions,
            "Spares of this host that took a dead rank's slot.");
    head(f, "graft_agent_start_timestamp_seconds", "gauge", "When the agent started.");
    fprintf(f, "graft_agent_start_timestamp_seconds %.3f\n", (double)a->started_unix_ms / 1000.0);
    if (fclose(f) != 0) {
        free(buf);
        return NULL;
    }
    return buf;
}

/* text into path, through path.tmp and a rename. */
static void write_file(agent_t *a, const char *path, const char *text)
{
    char tmp[4096];
    snprintf(tmp, sizeof(tmp), "%s.tmp", path);
    FILE *f = fopen(tmp, "w");
    bool ok = f != NULL && fputs(text, f) >= 0;
    if (f != NULL && fclose(f) != 0)
        ok = false;
    if (ok && rename(tmp, path) == 0)
        return;
    static uint64_t warned_ms;
    uint64_t now = agent_now_ms();
    if (warned_ms == 0 || now - warned_ms > 60000) {
        warned_ms = now;
        fprintf(stderr, "graft-agent: cannot write %s: %s\n", path, strerror(errno));
    }
    remove(tmp);
}

void agent_report(agent_t *a)
{
    json_t *j = agent_status_json(a);
    char *status = j != NULL ? json_dumps(j, JSON_INDENT(1) | JSON_ENSURE_ASCII) : NULL;
    json_decref(j);
    char *metrics = agent_metrics_text(a);
    if (status != NULL && a->o.status_file != NULL) {
        size_t n = strlen(status);
        char *line = realloc(status, n + 2);
        if (line != NULL) {
            status = line;
            memcpy(status + n, "\n", 2);
        }
        write_file(a, a->o.status_file, status);
    }
    if (metrics != NULL && a->o.metrics_file != NULL)
        write_file(a, a->o.metrics_file, metrics);
    pthread_mutex_lock(&a->report_mu);
    char *old_status = a->status_json, *old_metrics = a->metrics_text;
    a->status_json = status;
    a->metrics_text = metrics;
    pthread_mutex_unlock(&a->report_mu);
    free(old_status);
    free(old_metrics);
}
