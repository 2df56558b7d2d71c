/*
 * The dashboard's state and its Prometheus metrics (graftctl_dashboard.c,
 * graftctl_metrics.c, graftctl_page.c).
 */
#ifndef GRAFTCTL_DASH_H
#define GRAFTCTL_DASH_H

#include "graftctl.h"

#include <pthread.h>

/* Events and recoveries the dashboard keeps. */
#define GRAFTCTL_DASH_KEEP 2000

/* Step-rate samples the dashboard keeps (one a second: 5 minutes). */
#define GRAFTCTL_DASH_RATE_KEEP 300
/* The remote tier's bucket is listed (one LIST request) at most this often. */
#define GRAFTCTL_DASH_REMOTE_MS 10000

/* Upper bounds of the recovery phase histograms, seconds. */
#define GRAFTCTL_BUCKETS 12
extern const double graftctl_buckets[GRAFTCTL_BUCKETS];

typedef enum graftctl_phase {
    GRAFTCTL_PHASE_REJOIN_TO_ASSIGN,
    GRAFTCTL_PHASE_TRANSFER,
    GRAFTCTL_PHASE_VERIFY,
    GRAFTCTL_PHASE_TOTAL,
    GRAFTCTL_PHASES
} graftctl_phase_t;

typedef struct graftctl_histogram {
    uint64_t counts[GRAFTCTL_BUCKETS]; /* per bucket, not cumulative */
    uint64_t count;
    double sum;
} graftctl_histogram_t;

/* Counters since the dashboard started (the history it found counts too). */
typedef struct graftctl_metrics {
    uint64_t events[GRAFT_EVENT_KIND_LAST + 1]; /* by kind */
    uint64_t recoveries_ok;      /* heals after step 0 */
    uint64_t recoveries_failed;
    uint64_t initial_syncs;      /* heals at step 0: a group's first state, no failure */
    uint64_t recovery_bytes;
    double transfer_seconds;
    graftctl_histogram_t phases[GRAFTCTL_PHASES];
    uint64_t checkpoints_ok;
    uint64_t checkpoints_failed;
    uint64_t last_checkpoint_step;
    uint64_t last_checkpoint_unix_ms;
    uint64_t etcd_errors;
} graftctl_metrics_t;

/* Names a request's Host may carry besides IP addresses and localhost
 * (--allow-host, repeatable). */
#define GRAFTCTL_DASH_HOSTS 16

/* Requests refused for their Host header, logged at most every 10 s. */
typedef struct graftctl_refusals {
    pthread_mutex_t mu;
    uint64_t total;
    uint64_t unlogged;    /* refused since the last log line */
    uint64_t logged_ms;   /* when that line was written */
} graftctl_refusals_t;

typedef struct graftctl_dash {
    pthread_mutex_t mu;
    graftctl_conn_t conn;
    bool connected;      /* etcd answered and the job has keys */
    char waiting[1100];  /* until then: "waiting for job ...: why" */
    const char *job;
    const char *token; /* NULL: evict disabled */
    /* The checkpoint root: only --ckpt-root (ckpt_root, root_given) or a
     * folder under it is listed; the job's checkpoint events name where
     * the job writes (ckpt_named), which is listed only when it is under
     * the given root (ckpt_listed), and said otherwise (ckpt_note). */
    char ckpt_root[1024];
    bool root_given;
    char ckpt_named[1024];
    char ckpt_listed[4096];
    char ckpt_note[2048];
    const char *allow_hosts[GRAFTCTL_DASH_HOSTS];
    size_t n_allow_hosts;
    graftctl_refusals_t refusals;
    uint64_t last_seq;
    uint64_t refreshed_unix_ms;
    json_t *status;      /* graftctl_status_json() */
    json_t *events;      /* graftctl_event_json()s, oldest first */
    json_t *recoveries;  /* graftctl_recovery_json()s */
    json_t *checkpoints;
    /* [unix_ms, job step, steps/s], one a second at most, the newest
     * GRAFTCTL_DASH_RATE_KEEP: the page's step-rate sparkline. */
    json_t *rate_history;
    uint64_t rate_sampled_ms;
    graftctl_metrics_t metrics;
    /* The remote tier (graftctl_dash_remote.c): --ckpt-remote, else
     * GRAFT_PERSIST_REMOTE; NULL: not shown. remote_polled_ms is the main
     * loop's alone. */
    const char *remote_url;
    json_t *remote; /* graftctl_dash_remote_poll()'s newest listing */
    uint64_t remote_polled_ms;
} graftctl_dash_t;

/* A new listing of the bucket when one is due (none for
 * GRAFTCTL_DASH_REMOTE_MS), else NULL; called without the lock. */
json_t *graftctl_dash_remote_poll(const char *url, uint64_t *polled_ms_p);
/* /api/state's "remote": the listing and the upload lag against the local
 * checkpoints (graftctl_dashboard.c's checkpoints_json()); null without a
 * remote tier. */
json_t *graftctl_dash_remote_json(const char *url, json_t *listing, json_t *local);

void graftctl_metrics_count_event(graftctl_metrics_t *m, const graft_event_t *e);
void graftctl_metrics_count_recovery(graftctl_metrics_t *m, json_t *recovery);
/* The exposition text (malloc'ed), from the counters and the status
 * (NULL until the dashboard has seen the job: graft_up 0). */
char *graftctl_metrics_text(const graftctl_metrics_t *m, json_t *status);
void graftctl_metrics_free(graftctl_metrics_t *m);

/* Evict a group: revoke its ranks' leases and record a leave event naming
 * @p who. GRAFT_ENOTFOUND when it has no live member; @p why says what
 * failed; *result_p (JSON) on success. Shared with `graftctl evict`. */
graft_status_t graftctl_evict_group(graftctl_conn_t *c, uint32_t group, const char *who,
                                    json_t **result_p, char *why, size_t why_len);

/* The page (graftctl_page.c). */
extern const char graftctl_dashboard_page[];

#endif
