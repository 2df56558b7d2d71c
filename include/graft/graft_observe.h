/**
 * @file graft/graft_observe.h
 * @brief The trainer's observability: metrics, events, progress records,
 *        the log callback, the version.
 *
 * Part of the trainer's API; include <graft/graft.h>, which includes it.
 */
#ifndef GRAFT_GRAFT_OBSERVE_H
#define GRAFT_GRAFT_OBSERVE_H

#include <graft/common.h>

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/** One rank's runtime (graft/graft.h). */
typedef struct graft_runtime graft_runtime_t;

/* ------------------------------------------------------------------------ */
/* Observability                                                            */
/* ------------------------------------------------------------------------ */

/** Counters and latest durations of one runtime (nanoseconds). */
typedef struct graft_metrics {
    uint64_t step;                /**< committed steps */
    uint64_t quorum_id;
    uint64_t quorums;             /**< quorums taken part in */
    uint64_t quorum_changes;      /**< quorum id changes seen */
    uint64_t commits;             /**< commits that applied */
    uint64_t commits_failed;      /**< commits the group did not commit (a
                                       committed closing step counts in neither) */
    uint64_t last_quorum_ns;      /**< graft_quorum() duration, last call */
    uint64_t last_commit_ns;      /**< graft_commit() duration, last call */
    uint64_t recoveries;          /**< heals that installed state */
    uint64_t recovery_failures;
    uint64_t recovery_bytes;      /**< bytes pulled by successful heals */
    uint64_t last_detect_ns;      /**< last recovery, by phase: process start to joined */
    uint64_t last_quorum_phase_ns;/**< graft_quorum() call to quorum formed */
    uint64_t last_transfer_ns;    /**< pull, chunk verification included */
    uint64_t last_verify_ns;      /**< fingerprint check after the pull (0 without one) */
    uint64_t serves;              /**< steps this rank served as a donor */
    uint64_t fence_timeouts;      /**< donor fences that timed out */
    uint64_t restores;            /**< restores from the persistent tier */
    uint64_t checkpoints_written; /**< shards written by this rank */
    uint64_t checkpoints_committed; /**< manifests written by this rank */
    uint64_t checkpoints_failed;
    uint64_t checkpoint_bytes;    /**< raw bytes of shards written */
    uint64_t last_checkpoint_step;
    uint64_t last_snapshot_ns;    /**< time the trainer was blocked */
    uint64_t last_write_ns;       /**< snapshot to shard durable */
    uint64_t drift_checks;
    uint64_t drift_mismatches;
    uint64_t serve_peak_recipients; /**< most recipients this rank served at once */
    uint64_t steady_steps;        /**< steps agreed with the members, without etcd */
    uint64_t steady_fallbacks;    /**< steady-path attempts that went to etcd instead */
    uint64_t etcd_requests;       /**< etcd requests of the membership layer, keep-alives excluded */
    uint64_t steady_rejected;     /**< steady-path messages dropped: no valid MAC (docs/SECURITY.md) */
    /* The remote tier's uploader of this rank (persist_remote; 0 without
     * one, and on ranks that commit no checkpoint). */
    uint64_t remote_uploaded;     /**< checkpoints it made complete in the bucket */
    uint64_t remote_superseded;   /**< checkpoints dropped while waiting, for a newer one */
    uint64_t remote_failed;       /**< uploads it gave up (the reason in its log) */
    uint64_t remote_lag_steps;    /**< the newest step handed to it minus the newest it
                                       completed (0 when it is caught up) */
    /* Follow spares (docs/RUNTIME.md, "Follow spares"). */
    uint64_t follow_pulls;        /**< a follower's pulls of a step, verified */
    uint64_t follow_bytes;        /**< and their bytes */
    uint64_t follow_serves;       /**< steps this rank served to followers */
    uint64_t follow_wait_ns;      /**< commit time spent waiting for followers, in all */
} graft_metrics_t;

/**
 * @brief Read the metrics.
 * @param [in]  rt         the runtime.
 * @param [out] metrics_p  the metrics.
 */
void graft_metrics_get(graft_runtime_t *rt, graft_metrics_t *metrics_p);

/** Kinds of runtime events. */
typedef enum graft_runtime_event_kind {
    GRAFT_RUNTIME_EVENT_QUORUM_CHANGED = 1, /**< a new quorum id */
    GRAFT_RUNTIME_EVENT_RECOVERY = 2,       /**< a heal ended (status says how) */
    GRAFT_RUNTIME_EVENT_RESTORE = 3,        /**< restored from the persistent tier */
    GRAFT_RUNTIME_EVENT_CHECKPOINT = 4,     /**< a shard or a manifest was written, or failed */
    GRAFT_RUNTIME_EVENT_DRIFT = 5,          /**< a drift check ended (status GRAFT_EDRIFT on mismatch) */
    GRAFT_RUNTIME_EVENT_COMMIT_FAILED = 6,  /**< the group's vote was no */
    GRAFT_RUNTIME_EVENT_SPARE_PROMOTED = 7, /**< this spare took a slot (detail names it) */
    GRAFT_RUNTIME_EVENT_RESTARTED = 8       /**< graft_restart(): the rank restarted in place */
} graft_runtime_event_kind_t;

/** One runtime event. Pointers are valid during the callback only. */
typedef struct graft_runtime_event {
    graft_runtime_event_kind_t kind;
    graft_status_t status;    /**< GRAFT_OK or what went wrong */
    uint64_t step;
    uint64_t quorum_id;
    uint64_t bytes;           /**< recovery, restore, checkpoint */
    uint64_t detect_ns;       /**< recovery phases */
    uint64_t quorum_ns;
    uint64_t transfer_ns;
    uint64_t verify_ns;
    uint32_t n_donors;        /**< recovery: donors used */
    const char *detail;       /**< e.g. the drifting regions; never NULL */
} graft_runtime_event_t;

/** Event callback. */
typedef void (*graft_runtime_event_fn)(const graft_runtime_event_t *event, void *arg);

/**
 * @brief Set the event callback (NULL to remove).
 * @param [in] rt   the runtime.
 * @param [in] fn   the callback.
 * @param [in] arg  passed to it.
 */
void graft_event_callback_set(graft_runtime_t *rt, graft_runtime_event_fn fn, void *arg);

/**
 * @brief Name of an event kind ("recovery", "drift", ...).
 * @param [in] kind  the kind.
 * @return a static string.
 */
const char *graft_runtime_event_kind_string(graft_runtime_event_kind_t kind);

/**
 * @brief The etcd folder under which the drift check leaves its records for
 *        a job, "/graft/<job>/drift/" (docs/KEYS.md), for tools that read
 *        them; the runtime builds its own drift keys in the same place.
 * @param [in]  job       the job's name.
 * @param [out] folder_p  the folder; free with graft_free().
 * @return GRAFT_OK, GRAFT_EINVAL, GRAFT_ENOMEM.
 */
GRAFT_WUR graft_status_t graft_drift_key_folder(const char *job, char **folder_p);

/**
 * @brief A job's progress record (docs/KEYS.md): a step the job committed,
 *        written at each process's first commit, every 10 s while it runs
 *        and by each process as it ends. With the steady path the quorum
 *        record shows the step its epoch began at, so this is where tools
 *        read how far a job got.
 * @param [in]  etcd    a client of the job's etcd.
 * @param [in]  job     the job's name.
 * @param [out] step_p  the step.
 * @return GRAFT_OK, GRAFT_EINVAL, GRAFT_ENOTFOUND (no step committed yet),
 *         GRAFT_EMALFORMED / GRAFT_EFORMAT (a record it cannot read), or the
 *         etcd client's error.
 */
typedef struct graft_etcd graft_etcd_t; /* <graft/etcd.h> */
GRAFT_WUR graft_status_t graft_progress_read(graft_etcd_t *etcd, const char *job,
                                             uint64_t *step_p);

/** One group's progress record (docs/KEYS.md, `group_progress/<group>`). */
typedef struct graft_group_progress {
    uint32_t group;
    uint64_t step;            /**< the group's committed steps when written */
    double steps_per_second;  /**< since the record before (0 in the first) */
    uint64_t unix_ms;         /**< when rank 0 of the group wrote it */
    uint64_t quorum_id;       /**< the quorum it committed in */
} graft_group_progress_t;

/** How a vote's reason (and so the job's vote_result event) begins when
 *  this group's min_groups (GRAFT_GROUPS / GRAFT_MIN_GROUPS) differs from
 *  the one the quorum was formed with: the groups' settings disagree. */
#define GRAFT_CONFIG_MISMATCH_TEXT "config mismatch"

/** How the error event begins that a rank records in the job's history
 *  when its member record turns GRAFT_MEMBER_CANNOT_SERVE (its transfer
 *  endpoint failed to accept connections): tools read the reason there. */
#define GRAFT_CANNOT_SERVE_TEXT "cannot serve"

/** How often rank 0 of each group writes its group's progress record, at
 *  a commit (and at its first commit and graft_destroy()). */
#define GRAFT_GROUP_PROGRESS_EVERY_MS 2000

/**
 * @brief Every group's progress record: each group's rank 0 writes its
 *        group's committed step and step rate every
 *        GRAFT_GROUP_PROGRESS_EVERY_MS at a commit, so tools see steps of
 *        the steady path (which goes between the members, not through
 *        etcd) without a write per step.
 * @param [in]  etcd    a client of the job's etcd.
 * @param [in]  job     the job's name.
 * @param [out] recs_p  the records (a record that does not decode is left
 *                      out); free with graft_group_progress_free().
 * @param [out] n_p     how many (0: none written yet).
 * @return GRAFT_OK, GRAFT_EINVAL, GRAFT_ENOMEM, or the etcd client's error.
 */
GRAFT_WUR graft_status_t graft_group_progress_read(graft_etcd_t *etcd, const char *job,
                                                   graft_group_progress_t **recs_p, size_t *n_p);

/**
 * @brief Free graft_group_progress_read()'s records. Accepts NULL.
 * @param [in] recs  the records.
 */
void graft_group_progress_free(graft_group_progress_t *recs);

/**
 * @brief Route the library's log messages (the same as graft_log_sink_set()).
 * @param [in] fn   the sink, or NULL for standard error.
 * @param [in] arg  passed to it.
 */
void graft_log_callback_set(graft_log_fn fn, void *arg);

/**
 * @brief The library's version ("0.1.0").
 * @return a static string.
 */
const char *graft_version(void);

#ifdef __cplusplus
}
#endif

#endif /* GRAFT_GRAFT_OBSERVE_H */
