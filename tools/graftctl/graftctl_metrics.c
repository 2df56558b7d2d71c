/*
 * The dashboard's /metrics: Prometheus text exposition format 0.0.4.
 * Names follow Prometheus conventions: a graft_ prefix, counters end in
 * _total, durations are in seconds and end in _seconds, and the recovery
 * phases are one histogram labelled by phase (the total has its own, so a
 * sum over phase counts each second once).
 */
#include "graftctl_dash.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

const double graftctl_buckets[GRAFTCTL_BUCKETS] = {0.005, 0.01, 0.025, 0.05, 0.1, 0.25,
                                                   0.5,   1,    2.5,   5,    10,  30};

static const char *const phase_names[GRAFTCTL_PHASES] = {"rejoin_to_assign", "transfer",
                                                         "verify", "total"};

void graftctl_metrics_count_event(graftctl_metrics_t *m, const graft_event_t *e)
{
    if (e->kind >= GRAFT_EVENT_JOIN && e->kind <= GRAFT_EVENT_KIND_LAST)
        m->events[e->kind]++;
    if (e->kind == GRAFT_EVENT_CHECKPOINT) {
        if (e->ok) {
            m->checkpoints_ok++;
            if (e->step > m->last_checkpoint_step)
                m->last_checkpoint_step = e->step;
            if (e->unix_ms > m->last_checkpoint_unix_ms)
                m->last_checkpoint_unix_ms = e->unix_ms;
        } else {
            m->checkpoints_failed++;
        }
    }
}

static void observe(graftctl_histogram_t *h, double v)
{
    size_t b = 0;
    while (b < GRAFTCTL_BUCKETS && v > graftctl_buckets[b])
        b++;
    if (b < GRAFTCTL_BUCKETS)
        h->counts[b]++;
    h->count++;
    h->sum += v;
}

void graftctl_metrics_count_recovery(graftctl_metrics_t *m, json_t *r)
{
    if (!json_is_true(json_object_get(r, "ok"))) {
        m->recoveries_failed++;
        return;
    }
    /* A heal that gave a group its first state (a job's groups start from
     * one) is no recovery from a failure; its bytes and phases count like
     * a heal's. */
    if (json_is_true(json_object_get(r, "initial")))
        m->initial_syncs++;
    else
        m->recoveries_ok++;
    m->recovery_bytes += (uint64_t)json_integer_value(json_object_get(r, "bytes"));
    json_t *ph = json_object_get(r, "phases_s");
    for (int p = 0; p < GRAFTCTL_PHASES; p++) {
        json_t *v = json_object_get(ph, phase_names[p]);
        if (json_is_number(v))
            observe(&m->phases[p], json_number_value(v));
    }
    m->transfer_seconds += json_number_value(json_object_get(ph, "transfer"));
}

static void head(FILE *f, const char *name, const char *type, const char *help)
{
    fprintf(f, "# HELP %s %s\n# TYPE %s %s\n", name, help, name, type);
}

/* A gauge per group from a field of its progress record (groups without
 * one have no sample). */
static void group_gauge(FILE *f, json_t *s, const char *name, const char *field,
                        const char *help)
{
    size_t i;
    json_t *g;
    head(f, name, "gauge", help);
    json_array_foreach(json_object_get(s, "groups"), i, g) {
        json_t *v = json_object_get(json_object_get(g, "progress"), field);
        if (v != NULL)
            fprintf(f, "%s{group=\"%" JSON_INTEGER_FORMAT "\"} %.15g\n", name,
                    json_integer_value(json_object_get(g, "group")), json_number_value(v));
    }
}

/* Steps from each group's progress record (its rank 0 writes one every
 * GRAFT_GROUP_PROGRESS_EVERY_MS): the job's step is the newest. */
static void progress_metrics(FILE *f, json_t *s)
{
    head(f, "graft_job_step", "gauge", "The newest step a group of the job committed.");
    fprintf(f, "graft_job_step %" JSON_INTEGER_FORMAT "\n",
            json_integer_value(json_object_get(s, "step")));
    head(f, "graft_job_steps_per_second", "gauge",
         "Committed steps per second of the job (its fastest group with a fresh record).");
    fprintf(f, "graft_job_steps_per_second %.3f\n",
            json_number_value(json_object_get(s, "steps_per_second")));
    group_gauge(f, s, "graft_group_committed_step", "step",
                "A group's committed step as its rank 0 last reported it.");
    group_gauge(f, s, "graft_group_steps_per_second", "steps_per_second",
                "A group's committed steps per second (0 once its record is stale).");
    size_t i;
    json_t *g;
    head(f, "graft_group_progress_timestamp_seconds", "gauge",
         "When a group's rank 0 last reported its step (at a commit, every 2 s at most): "
         "time() minus it is how long the group has not progressed.");
    json_array_foreach(json_object_get(s, "groups"), i, g) {
        json_t *v = json_object_get(json_object_get(g, "progress"), "unix_ms");
        if (json_is_integer(v))
            fprintf(f, "graft_group_progress_timestamp_seconds{group=\"%" JSON_INTEGER_FORMAT
                    "\"} %.3f\n", json_integer_value(json_object_get(g, "group")),
                    (double)json_integer_value(v) / 1000.0);
    }
}

/* A gauge of 1 for each group of one health (no sample for the others). */
static void health_gauge(FILE *f, json_t *s, const char *name, const char *health,
                         const char *help)
{
    size_t i;
    json_t *g;
    head(f, name, "gauge", help);
    json_array_foreach(json_object_get(s, "groups"), i, g)
        if (strcmp(json_string_value(json_object_get(g, "health")), health) == 0)
            fprintf(f, "%s{group=\"%" JSON_INTEGER_FORMAT "\"} 1\n", name,
                    json_integer_value(json_object_get(g, "group")));
}

static void status_metrics(FILE *f, json_t *s)
{
    static const char *const healths[] = {"healthy",  "recovering", "cannot-serve",
                                          "voting-no", "hung",       "dead",
                                          "finished", "misconfigured"};
    static const char *const states[] = {"running", "degraded", "paused", "completed",
                                         "failed"};
    size_t i, k;
    json_t *g, *r;
    const char *state = json_string_value(json_object_get(s, "state"));
    head(f, "graft_job_state", "gauge", "1 for the job's state, 0 for the others.");
    for (size_t x = 0; x < sizeof(states) / sizeof(states[0]); x++)
        fprintf(f, "graft_job_state{state=\"%s\"} %d\n", states[x],
                state != NULL && strcmp(state, states[x]) == 0);
    head(f, "graft_groups", "gauge", "Groups of the job by health.");
    for (size_t h = 0; h < sizeof(healths) / sizeof(healths[0]); h++) {
        size_t n = 0;
        json_array_foreach(json_object_get(s, "groups"), i, g)
            n += strcmp(json_string_value(json_object_get(g, "health")), healths[h]) == 0;
        fprintf(f, "graft_groups{health=\"%s\"} %zu\n", healths[h], n);
    }
    health_gauge(f, s, "graft_group_config_mismatch", "misconfigured",
                 "1 for a live group whose settings (min_groups) disagree with the quorum's.");
    health_gauge(f, s, "graft_group_voting_no", "voting-no",
                 "1 for a live group whose votes failed again and again (status says which "
                 "rank voted no and why).");
    health_gauge(f, s, "graft_group_cannot_serve", "cannot-serve",
                 "1 for a live group with a rank whose transfer endpoint cannot serve (status "
                 "says which rank and why).");
    head(f, "graft_ranks_live", "gauge", "Ranks with a live member record.");
    size_t live = 0;
    json_array_foreach(json_object_get(s, "groups"), i, g)
        live += json_array_size(json_object_get(g, "ranks"));
    fprintf(f, "graft_ranks_live %zu\n", live);
    json_t *q = json_object_get(s, "quorum");
    if (json_is_object(q)) {
        static const char *const qf[] = {"id", "round", "step"};
        for (size_t x = 0; x < 3; x++) {
            char name[64], help[96];
            snprintf(name, sizeof(name), "graft_quorum_%s", qf[x]);
            snprintf(help, sizeof(help), "The latest quorum's %s.", qf[x]);
            head(f, name, "gauge", help);
            fprintf(f, "%s %" JSON_INTEGER_FORMAT "\n", name,
                    json_integer_value(json_object_get(q, qf[x])));
        }
        head(f, "graft_quorum_members", "gauge", "Groups in the latest quorum.");
        fprintf(f, "graft_quorum_members %zu\n", json_array_size(json_object_get(q, "members")));
    }
    progress_metrics(f, s);
    head(f, "graft_rank_committed_step", "gauge",
         "A live rank's committed step: its group's progress record while it holds the "
         "group's step, else its member record.");
    json_array_foreach(json_object_get(s, "groups"), i, g)
        json_array_foreach(json_object_get(g, "ranks"), k, r)
            fprintf(f, "graft_rank_committed_step{group=\"%" JSON_INTEGER_FORMAT
                       "\",rank=\"%" JSON_INTEGER_FORMAT "\"} %" JSON_INTEGER_FORMAT "\n",
                    json_integer_value(json_object_get(g, "group")),
                    json_integer_value(json_object_get(r, "rank")),
                    json_integer_value(json_object_get(r, "step")));
    head(f, "graft_rank_lease_ttl_seconds", "gauge", "Time left on a rank's lease.");
    json_array_foreach(json_object_get(s, "groups"), i, g)
        json_array_foreach(json_object_get(g, "ranks"), k, r)
            fprintf(f, "graft_rank_lease_ttl_seconds{group=\"%" JSON_INTEGER_FORMAT
                       "\",rank=\"%" JSON_INTEGER_FORMAT "\"} %" JSON_INTEGER_FORMAT "\n",
                    json_integer_value(json_object_get(g, "group")),
                    json_integer_value(json_object_get(r, "rank")),
                    json_integer_value(json_object_get(r, "lease_ttl_s")));
}

/* One histogram's series (labels: "" or `phase="x",`). */
static void histogram(FILE *f, const char *name, const char *labels, const graftctl_histogram_t *h)
{
    uint64_t cum = 0;
    for (int b = 0; b < GRAFTCTL_BUCKETS; b++) {
        cum += h->counts[b];
        fprintf(f, "%s_bucket{%sle=\"%g\"} %" PRIu64 "\n", name, labels, graftctl_buckets[b], cum);
    }
    fprintf(f, "%s_bucket{%sle=\"+Inf\"} %" PRIu64 "\n", name, labels, h->count);
    size_t n = strlen(labels);
    /* The labels without their trailing comma, in braces, or none. */
    fprintf(f, "%s_sum%s%.*s%s %.6f\n", name, n ? "{" : "", (int)(n ? n - 1 : 0), labels,
            n ? "}" : "", h->sum);
    fprintf(f, "%s_count%s%.*s%s %" PRIu64 "\n", name, n ? "{" : "", (int)(n ? n - 1 : 0), labels,
            n ? "}" : "", h->count);
}

/* Times of the newest checkpoint, quorum and commit, for staleness alerts
 * (time() - x > ...); no sample while there is none. */
static void timestamps(FILE *f, const graftctl_metrics_t *m, json_t *s)
{
    uint64_t commit_ms = 0;
    size_t i;
    json_t *g;
    json_array_foreach(json_object_get(s, "groups"), i, g) {
        json_t *u = json_object_get(json_object_get(g, "progress"), "unix_ms");
        if (json_is_integer(u) && (uint64_t)json_integer_value(u) > commit_ms)
            commit_ms = (uint64_t)json_integer_value(u);
    }
    uint64_t quorum_ms = (uint64_t)json_integer_value(
        json_object_get(json_object_get(s, "quorum"), "formed_unix_ms"));
    const struct {
        const char *name, *help;
        uint64_t ms;
    } t[] = {
        {"graft_last_checkpoint_timestamp_seconds", "When the newest checkpoint committed.",
         m->last_checkpoint_unix_ms},
        {"graft_last_quorum_timestamp_seconds", "When the latest quorum was formed.", quorum_ms},
        {"graft_last_commit_timestamp_seconds",
         "When a group last reported a committed step (every few seconds while steps go).",
         commit_ms},
    };
    for (size_t k = 0; k < sizeof(t) / sizeof(t[0]); k++) {
        head(f, t[k].name, "gauge", t[k].help);
        if (t[k].ms > 0)
            fprintf(f, "%s %.3f\n", t[k].name, (double)t[k].ms / 1e3);
    }
}

char *graftctl_metrics_text(const graftctl_metrics_t *m, json_t *status)
{
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    if (f == NULL)
        return NULL;
    head(f, "graft_up", "gauge", "1 once the dashboard has read the job from etcd, else 0.");
    fprintf(f, "graft_up %d\n", status != NULL);
    if (status != NULL)
        status_metrics(f, status);
    head(f, "graft_events_total", "counter", "Events of the job's history, by kind.");
    for (int k = GRAFT_EVENT_JOIN; k <= GRAFT_EVENT_KIND_LAST; k++)
        fprintf(f, "graft_events_total{kind=\"%s\"} %" PRIu64 "\n",
                graft_event_kind_string((graft_event_kind_t)k), m->events[k]);
    head(f, "graft_recoveries_total", "counter",
         "Heals of a rank that was replaced or fell behind (not a group's first state).");
    fprintf(f, "graft_recoveries_total{result=\"ok\"} %" PRIu64 "\n", m->recoveries_ok);
    fprintf(f, "graft_recoveries_total{result=\"failed\"} %" PRIu64 "\n", m->recoveries_failed);
    head(f, "graft_initial_syncs_total", "counter",
         "Heals that gave a group its first state (a job's start), no failure.");
    fprintf(f, "graft_initial_syncs_total %" PRIu64 "\n", m->initial_syncs);
    head(f, "graft_recovery_bytes_total", "counter",
         "Bytes pulled from donors by heals and initial syncs.");
    fprintf(f, "graft_recovery_bytes_total %" PRIu64 "\n", m->recovery_bytes);
    head(f, "graft_recovery_transfer_seconds_total", "counter",
         "Time heals spent pulling state (bytes_total over this is the throughput).");
    fprintf(f, "graft_recovery_transfer_seconds_total %.6f\n", m->transfer_seconds);
    head(f, "graft_recovery_phase_seconds", "histogram",
         "Duration of each phase of a heal, as the job's events record them; the phases add "
         "up to about graft_recovery_seconds.");
    for (int p = 0; p < GRAFTCTL_PHASE_TOTAL; p++) {
        char labels[64];
        snprintf(labels, sizeof(labels), "phase=\"%s\",", phase_names[p]);
        histogram(f, "graft_recovery_phase_seconds", labels, &m->phases[p]);
    }
    head(f, "graft_recovery_seconds", "histogram",
         "A heal from its assignment to recovery_done.");
    histogram(f, "graft_recovery_seconds", "", &m->phases[GRAFTCTL_PHASE_TOTAL]);
    head(f, "graft_checkpoints_total", "counter", "Checkpoints committed, by result.");
    fprintf(f, "graft_checkpoints_total{result=\"ok\"} %" PRIu64 "\n", m->checkpoints_ok);
    fprintf(f, "graft_checkpoints_total{result=\"failed\"} %" PRIu64 "\n", m->checkpoints_failed);
    head(f, "graft_checkpoint_last_step", "gauge", "Step of the newest committed checkpoint.");
    fprintf(f, "graft_checkpoint_last_step %" PRIu64 "\n", m->last_checkpoint_step);
    if (status != NULL)
        timestamps(f, m, status);
    head(f, "graft_dashboard_etcd_errors_total", "counter",
         "Refreshes of the dashboard that etcd failed.");
    fprintf(f, "graft_dashboard_etcd_errors_total %" PRIu64 "\n", m->etcd_errors);
    if (fclose(f) != 0) {
        free(buf);
        return NULL;
    }
    return buf;
}

void graftctl_metrics_free(graftctl_metrics_t *m)
{
    memset(m, 0, sizeof(*m));
}
