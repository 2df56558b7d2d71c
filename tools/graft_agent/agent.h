/*
 * graft-agent: one per host. It starts this host's ranks of a replica group
 * (or one launcher per group world, such as torchrun), keeps spares warm
 * (GRAFT_SPARE=1), restarts what dies with exponential back-off, sees in
 * etcd which of its spares took a dead rank's slot, and reports all of it
 * as log lines, a JSON status and Prometheus text (docs/OPERATIONS.md,
 * "graft-agent").
 *
 * Files, one concern each:
 *   agent_main.c    the loop: reap, decide, start, watch, report; signals
 *   agent_opts.c    options and environment, --help
 *   agent_policy.c  the decisions as pure functions: the plan of units, the
 *                   back-off, what to do when a process ended
 *   agent_units.c   a unit's process: start (fork/exec), signal
 *   agent_watch.c   the observer of the job: which spares were promoted
 *   agent_report.c  events, the JSON status, Prometheus text, files
 *   agent_http.c    the optional HTTP server (libmicrohttpd)
 * Public headers only (scripts/check-layering.sh).
 */
#ifndef GRAFT_AGENT_H
#define GRAFT_AGENT_H

#include <graft/common.h>
#include <graft/etcd.h>
#include <graft/membership.h>

#include <jansson.h>

#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#define AGENT_OK 0
#define AGENT_FAIL 1
#define AGENT_USAGE 2

#define AGENT_MAX_RANKS 64
#define AGENT_MAX_UNITS 256
#define AGENT_MAX_EVENTS 64
#define AGENT_MAX_ENDPOINTS 8

/* How the agent runs the command after "--". */
typedef enum agent_mode {
    AGENT_MODE_RANKS,    /* one process per rank (GRAFT_RANK set per process) */
    AGENT_MODE_LAUNCHER  /* one process per group world (a launcher: torchrun) */
} agent_mode_t;

typedef struct agent_opts {
    agent_mode_t mode;
    bool have_group;
    uint32_t group;
    uint32_t ranks[AGENT_MAX_RANKS]; /* this host's ranks (mode ranks) */
    size_t n_ranks;
    uint32_t ranks_per_group; /* 0: not given (the trainers' environment decides) */
    uint32_t groups;          /* 0: not given */
    uint32_t spares;          /* per rank (mode ranks) or spare worlds (launcher) */
    uint32_t max_restarts;    /* failures in a row before the agent gives up */
    uint32_t backoff_ms;      /* first back-off, doubled per failure in a row */
    uint32_t backoff_max_ms;
    uint32_t healthy_ms;      /* a process that ran this long resets its count */
    uint32_t stop_grace_ms;   /* SIGTERM, then SIGKILL after this long */
    int64_t stop_spares_ms;   /* < 0: let spares end by themselves */
    const char *job;
    const char *endpoints_text;
    char *endpoints[AGENT_MAX_ENDPOINTS];
    size_t n_endpoints;
    const char *status_file;
    const char *metrics_file;
    const char *listen;       /* HOST:PORT of the HTTP server; NULL: none */
    const char *log_dir;      /* children's stdout and stderr; NULL: inherited */
    bool dry_run;
    bool follow;       /* --follow: the spares follow (GRAFT_SPARE_FOLLOW=1) */
    char **cmd;               /* the command after "--", NULL-terminated */
    int n_cmd;
} agent_opts_t;

/* How a unit's current process was started. */
typedef enum agent_role {
    AGENT_ROLE_PRIMARY, /* GRAFT_GROUP = the agent's group */
    AGENT_ROLE_SPARE    /* GRAFT_SPARE=1: takes whatever slot of its rank falls vacant */
} agent_role_t;

typedef enum agent_unit_state {
    AGENT_UNIT_RUNNING,
    AGENT_UNIT_BACKOFF, /* died; started again at restart_at_ms */
    AGENT_UNIT_DONE     /* exited 0 (or stopped at the end): not started again */
} agent_unit_state_t;

/* A place on this host that always holds one process (one GPU's worth):
 * a rank of the agent's group, or a spare, or (mode launcher) a world. */
typedef struct agent_unit {
    int slot;             /* index among the agent's units */
    uint32_t rank;        /* UINT32_MAX for a launcher's world */
    bool spare_slot;      /* kept as a spare from the start */
    agent_role_t role;
    agent_unit_state_t state;
    pid_t pid;            /* 0: none running */
    int64_t group;        /* the slot it holds: the agent's group, or a promoted
                             spare's; -1: none (an unpromoted spare) */
    uint64_t started_ms;
    uint64_t restart_at_ms;
    uint32_t starts;
    uint32_t failures;    /* in a row */
    int last_status;      /* waitpid() status of the last process; -1: none yet */
    bool stopping;        /* SIGTERM sent by the agent */
    /* The member records its process (or, a launcher's world, the ones
     * below it) wrote, as etcd last showed them: evicted when it dies. */
    struct { uint32_t group, rank; int32_t pid; } records[AGENT_MAX_RANKS];
    int n_records;
} agent_unit_t;

/* What to do when a unit's process ended (agent_exit_decide). */
typedef enum agent_action {
    AGENT_ACT_DONE,
    AGENT_ACT_RESTART,
    AGENT_ACT_GIVE_UP
} agent_action_t;

typedef struct agent_decision {
    agent_action_t action;
    agent_role_t role;   /* the restart's */
    uint32_t failures;   /* failures in a row, this one included */
    uint32_t delay_ms;   /* the restart's back-off */
} agent_decision_t;

typedef struct agent_event {
    uint64_t unix_ms;
    char what[32];
    char detail[200];
} agent_event_t;

typedef struct agent_counters {
    uint64_t starts, restarts, failures, clean_exits, promotions, gave_up;
} agent_counters_t;

typedef struct agent {
    agent_opts_t o;
    char host[256];
    agent_unit_t units[AGENT_MAX_UNITS];
    int n_units;
    agent_counters_t c;
    agent_event_t events[AGENT_MAX_EVENTS]; /* a ring: the newest AGENT_MAX_EVENTS */
    uint64_t n_events;
    uint64_t started_unix_ms;
    const char *state;          /* "running", "finished", "failed", "stopped" */
    bool gave_up;               /* a unit failed past --max-restarts */
    bool held_any;              /* a unit that held a slot ended with 0 */
    uint64_t spares_idle_since_ms; /* --stop-spares-after-ms: since when only spares wait */
    /* The observer of the job (only with spares): promotions from etcd. */
    graft_membership_t *obs;
    uint64_t obs_version;       /* the version the loop waits past */
    uint64_t obs_seen;          /* the version agent_watch_refresh() last read */
    uint64_t obs_next_try_ms;
    bool obs_warned;
    /* The report the HTTP server serves, made by the loop. */
    pthread_mutex_t report_mu;
    char *status_json;
    char *metrics_text;
    void *http; /* agent_http.c's daemon */
} agent_t;

/* agent_opts.c: parse argv and the environment into o; on a usage error
 * writes why into why (len) and returns AGENT_USAGE; --help prints the
 * help and returns -1. */
int agent_opts_parse(int argc, char **argv, agent_opts_t *o, char *why, size_t len);
void agent_opts_clear(agent_opts_t *o);
void agent_help_print(void);

/* agent_policy.c */
uint64_t agent_now_ms(void);      /* monotonic */
uint64_t agent_unix_ms(void);
uint32_t agent_backoff_ms(uint32_t failures, uint32_t base_ms, uint32_t max_ms);
agent_decision_t agent_exit_decide(const agent_opts_t *o, const agent_unit_t *u, int wstatus,
                                   uint64_t ran_ms);
/* How a process ended, for a person: "exit 1", "killed by signal 9 (Killed)". */
void agent_status_text(int wstatus, char *buf, size_t len);
/* The units the options ask for, in u (at most AGENT_MAX_UNITS). */
int agent_units_plan(const agent_opts_t *o, agent_unit_t *u);
const char *agent_unit_kind(const agent_unit_t *u);
/* arg with {slot}, {start}, {rank} and {group} replaced for u; malloc'd
 * (NULL: out of memory). */
char *agent_arg_expand(const char *arg, const agent_unit_t *u, const agent_opts_t *o);

/* agent_units.c: start u's process as u->role; false (and an event) when fork failed. */
bool agent_unit_start(agent_t *a, agent_unit_t *u);
/* SIGTERM u's process group; SIGKILL with kill_now. */
void agent_unit_signal(agent_unit_t *u, bool kill_now);


/* agent_watch.c */
/* Open the observer when spares are kept (retried later when etcd does
 * not answer). */
void agent_watch_open(agent_t *a);
/* When the view changed: each running unit's member records, and the
 * spares among them that took a slot since (marked, counted, an event);
 * returns how many spares were promoted. */
int agent_watch_refresh(agent_t *a);
/* Whether slot (group, rank) is held by a live member (the job is
 * running there already): a primary is then started as a spare. */
bool agent_watch_slot_held(agent_t *a, uint32_t group, uint32_t rank);
/* u's process died: revoke the lease of each slot record it (or its
 * world) wrote when the record is still that process's
 * (graft_membership_evict), so a spare takes the slot at once instead of
 * after the lease's TTL. Nothing without an observer. */
void agent_watch_evict(agent_t *a, agent_unit_t *u);
/* Wait up to timeout_ms for the view to change (or sleep without one). */
void agent_watch_wait(agent_t *a, uint32_t timeout_ms);
void agent_watch_close(agent_t *a);
/* Is pid, or an ancestor of it, ancestor? (/proc) */
bool agent_pid_descends(pid_t pid, pid_t ancestor);

/* agent_report.c */
void agent_event(agent_t *a, const char *what, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
json_t *agent_status_json(const agent_t *a);
char *agent_metrics_text(const agent_t *a);
/* Make the status and the metrics, write the files asked for, hand them
 * to the HTTP server. */
void agent_report(agent_t *a);
int agent_spares_warm(const agent_t *a);

/* agent_http.c: serve /metrics and /status on o.listen; false with why. */
bool agent_http_start(agent_t *a, char *why, size_t len);
void agent_http_stop(agent_t *a);

#endif
