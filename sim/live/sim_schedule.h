/*
 * Failure schedules of `graft-sim run`: what to inject, where and when.
 *
 * A schedule is planned once, before anything runs, from the options and an
 * optional JSON file; every random choice (kinds, targets, steps, durations)
 * is drawn here from the seed, so the same seed and the same file give the
 * same plan, byte for byte. The live engine only decides *when* a planned
 * event's trigger holds. The JSON format is documented in docs/SIM.md.
 */
#ifndef GRAFT_SIM_SCHEDULE_H
#define GRAFT_SIM_SCHEDULE_H

#include "sim_live.h"

#include <graft/common.h>

#include <jansson.h>
#include <stddef.h>
#include <stdint.h>

/** Kinds of injected failures. */
typedef enum graft_sim_kind {
    GRAFT_SIM_KILL_RANK = 0, /**< SIGKILL one rank */
    GRAFT_SIM_KILL_GROUP,    /**< SIGKILL every rank of one group */
    GRAFT_SIM_KILL_DONOR,    /**< kill a group, then a donor while it serves the heal */
    GRAFT_SIM_HANG,          /**< SIGSTOP one rank, SIGCONT after duration_ms */
    GRAFT_SIM_DISASTER,      /**< SIGKILL every group (restore from disk) */
    GRAFT_SIM_ETCD_RESTART,  /**< stop etcd for duration_ms, start it again */
    GRAFT_SIM_PARTITION,     /**< cut a group off the network (--netns only) */
    GRAFT_SIM_ETCD_LEADER_KILL, /**< SIGKILL etcd's leader, restart it after duration_ms
                                     (--etcd-members >= 3) */
    GRAFT_SIM_ISOLATE,       /**< cut a group off its peers only: it still reaches etcd
                                  (--netns only) */
    GRAFT_SIM_NETEM,         /**< delay, jitter, loss and reordering on a group's link for
                                  duration_ms (--netns only) */
    GRAFT_SIM_THROTTLE,      /**< a group's link down to 10 Mbit/s for duration_ms
                                  (--netns only) */
    GRAFT_SIM_CUT_DONOR,     /**< kill a group, then cut the donor group serving its heal
                                  off it for duration_ms (--netns, >= 3 groups) */
    GRAFT_SIM_LOSE_DISKS,    /**< a disaster that also wipes the local checkpoint root: the
                                  job comes back from the object store (--persist-remote) */
    GRAFT_SIM_KIND_COUNT
} graft_sim_kind_t;

/** One planned failure. Exactly one of at_step and at_ms is >= 0. */
typedef struct graft_sim_event {
    graft_sim_kind_t kind;
    int group;             /**< target group (kill_donor, cut_donor: the recipient) */
    int rank;              /**< target rank (kill_donor, cut_donor: the donor's rank) */
    long long at_step;     /**< fire once the job has committed this step; -1: unused */
    long long at_ms;       /**< fire this many ms after the start; -1: unused */
    long long duration_ms; /**< hang, etcd_restart, etcd_leader_kill and the --netns kinds */
    int corrupt;           /**< disaster: corrupt the newest checkpoint first */
} graft_sim_event_t;

/** A planned schedule. */
typedef struct graft_sim_schedule {
    graft_sim_event_t *events; /**< step-triggered first (by step), then timed (by ms) */
    size_t n_events;
} graft_sim_schedule_t;

/**
 * @brief Name of a kind ("kill_rank", ...).
 * @param [in] kind  the kind.
 * @return a static string.
 */
const char *graft_sim_kind_name(graft_sim_kind_t kind);

/** Whether a kind kills every group (disaster, lose_disks). */
int graft_sim_kind_is_disaster(graft_sim_kind_t kind);

/**
 * @brief Plan the schedule of a run: the events of --schedule FILE (if any),
 *        its random failures and random kill rate, and --random-failures N.
 * @param [in]  opts        validated options (groups, ranks, steps, seed, ...).
 * @param [in]  json_text   the schedule file's contents, or NULL.
 * @param [out] sched_p     the schedule; free with graft_sim_schedule_destroy().
 * @param [out] error_p     on failure, a message naming the bad field (free
 *                          with free()); may be NULL.
 * @return GRAFT_OK, GRAFT_EINVAL (bad schedule), GRAFT_ENOTSUP (a kind this
 *         run cannot inject, e.g. partition without --netns), GRAFT_ENOMEM.
 */
GRAFT_WUR graft_status_t graft_sim_schedule_plan(const graft_sim_live_opts_t *opts,
                                                 const char *json_text,
                                                 graft_sim_schedule_t **sched_p,
                                                 char **error_p);

/**
 * @brief Free a schedule. Accepts NULL.
 * @param [in] sched  the schedule.
 */
void graft_sim_schedule_destroy(graft_sim_schedule_t *sched);

/**
 * @brief One event as JSON (the schedule file's form).
 * @param [in] ev  the event.
 * @return a new JSON object, or NULL when out of memory.
 */
json_t *graft_sim_event_json(const graft_sim_event_t *ev);

/**
 * @brief The whole plan as a JSON array (reloadable as a schedule file's
 *        "events").
 * @param [in] sched  the schedule.
 * @return a new JSON array, or NULL when out of memory.
 */
json_t *graft_sim_schedule_json(const graft_sim_schedule_t *sched);

#endif /* GRAFT_SIM_SCHEDULE_H */
