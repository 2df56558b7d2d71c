/*
 * What one live run records, shared by the engine (sim_live.c), the verdict
 * and report (sim_verdict.c) and the timeline plot (sim_timeline.c).
 */
#ifndef GRAFT_SIM_LIVE_INT_H
#define GRAFT_SIM_LIVE_INT_H

#include "sim_schedule.h"

#include <jansson.h>
#include <stdint.h>
#include <stdio.h>

/** One observed recovery: from the failure to the group computing again. */
typedef struct graft_sim_recovery {
    graft_sim_kind_t kind;
    const char *role; /**< "group", "rank", "donor", "job" (disaster), "etcd" */
    int group;        /**< -1: every group */
    int rank;         /**< -1: every rank of the group */
    double t_fail, t_detect, t_restart, t_rejoin, t_healed; /**< s since start; <0: not seen */
    long long step_at_fail;  /**< disaster: the highest step logged before it */
    long long restored_step; /**< disaster: the step the job restarted from (the step
                                  before the first commit logged after it) */
    long long corrupted_step; /**< disaster with corrupt: the checkpoint whose shard was
                                   corrupted (-1: none) */
    int done;
} graft_sim_recovery_t;

/** One progress sample. */
typedef struct graft_sim_sample {
    double t;
    long long step;
    int healthy;
    uint64_t quorum_id;
} graft_sim_sample_t;

/** One injected failure, in injection order. */
typedef struct graft_sim_injected {
    double t;
    size_t plan_index;
    graft_sim_event_t ev; /**< kill_donor: ev.rank/.group as planned */
    int donor_group;      /**< kill_donor: the donor actually killed, else -1 */
    int donor_rank;       /**< kill_donor: its rank */
    long long donor_step; /**< kill_donor: the step it was serving (-1: killed on the fallback) */
    double donor_t;       /**< kill_donor: when it was killed, s since start */
    int donor_serving;    /**< kill_donor: killed on its endpoint's "serving" signal */
    int donor_mid_serve;  /**< kill_donor: the recipient's heal of donor_step reported
                               that donor lost with chunks read or in flight */
    int donor_heal_ok;    /**< kill_donor: that heal's outcome; -1: not seen */
    int etcd_member;      /**< etcd_leader_kill: the member killed (the leader), else -1 */
    int etcd_new_leader;  /**< etcd_leader_kill: the member that led next; -1: not seen */
    double etcd_elected_t; /**< etcd_leader_kill: when it was seen leading, s; <0: not seen */
    double etcd_restart_t; /**< etcd_leader_kill: when the killed member was back, s */
} graft_sim_injected_t;

/** Everything one run produced. */
typedef struct graft_sim_result {
    int completed;         /**< every process finished its steps (elastic: or stragglers were ended) */
    int stragglers;        /**< elastic: ranks ended without finishing */
    char *error;           /**< why not, when not */
    double wall_s;
    char **rank_hashes;    /**< groups * ranks final hashes ("" when missing) */
    int groups, ranks;
    char *final_hash;      /**< combined over group 0's ranks, or NULL */
    int groups_agree;      /**< every group's ranks hold the same hashes */
    long long commit_checks;     /**< (epoch, step, rank) commits compared with the first */
    long long commit_mismatches; /**< of which groups disagreed */
    long long *epoch_checks;     /**< commit_checks per epoch (between disasters) */
    size_t n_epochs;
    long long steps_committed;   /**< the highest step some group's every rank logged */
    long long steps_lost;        /**< commits logged again at a step already logged (a
                                      rollback), the most of any (group, rank) */
    long *disaster_offs;         /**< per disaster, per (group, rank): bytes of its hash log
                                      when every rank was dead (the epochs' boundaries) */
    size_t n_disasters;
    unsigned long long bytes_transferred; /**< from the runtime's recovery_done events */
    unsigned long long heals_reported;    /**< recovery_done events with ok */
    int ballast_mib;                      /**< the trainers' --blob-mib (0: none) */
    graft_sim_injected_t *injected;
    size_t n_injected, cap_injected;
    size_t n_skipped; /**< planned but not injected (the run ended first) */
    graft_sim_recovery_t *recoveries;
    size_t n_recoveries, cap_recoveries;
    graft_sim_sample_t *samples;
    size_t n_samples, cap_samples;
} graft_sim_result_t;

/** Free a result's contents. */
void graft_sim_result_clear(graft_sim_result_t *res);

/**
 * Read the hash files and the trainers' logs into @p res and judge it.
 * Returns the verdict string ("bit-exact", "consistent" or "FAILED") and
 * sets *why_p (static or NULL) on failure.
 */
const char *graft_sim_verdict_judge(const graft_sim_live_opts_t *opts, graft_sim_result_t *res,
                                    const char *reference_hash, const char **why_p);

/**
 * Read the trainers' per-commit hash logs in @p dir: compare them across
 * groups (elastic), and measure steps_committed, steps_lost and each
 * disaster's step_at_fail and restored_step.
 */
void graft_sim_verdict_scan_logs(graft_sim_result_t *res, const char *dir, int groups, int ranks,
                                 int elastic);

/** Text summary of a run. */
void graft_sim_report_text(FILE *out, const graft_sim_live_opts_t *opts,
                           const graft_sim_schedule_t *sched, const graft_sim_result_t *res,
                           const char *verdict, const char *why, const char *reference_hash,
                           const char *plot_path);

/** The --json report; NULL when out of memory. */
json_t *graft_sim_report_json(const graft_sim_live_opts_t *opts, const graft_sim_schedule_t *sched,
                              const graft_sim_result_t *res, const char *verdict, const char *why,
                              const char *reference_hash);

/** Write the SVG timeline and recovery-time distribution; 0 or -1 (errno). */
int graft_sim_timeline_svg(const char *path, const graft_sim_live_opts_t *opts,
                           const graft_sim_result_t *res, const char *verdict);

/* ------------------------------------------------ etcd leader kills --- */

/** How far around an etcd_leader_kill its stall is looked for, s. */
#define GRAFT_SIM_STALL_WINDOW_S 3.0

/** What the etcd_leader_kills of a run cost (sim_stall.c). */
typedef struct graft_sim_leader_summary {
    size_t n;          /**< etcd_leader_kills injected */
    size_t n_isolated; /**< of them, with no other failure within the window */
    double stall_median, stall_max; /**< over the isolated ones, s; NAN: none */
    size_t n_elected;  /**< kills after which another member was seen leading */
    double elect_median, elect_max; /**< kill to that sighting, s; NAN: none */
    double step_gap_median;         /**< what a step costs in this run, s */
} graft_sim_leader_summary_t;

/** Sort v[0..n) and give its median and max (NAN for n == 0). */
void graft_sim_median_max(double *v, size_t n, double *med_p, double *max_p);

/**
 * The longest stretch in which the job's step stood still among those that
 * end after @p t_kill and begin before t_kill + GRAFT_SIM_STALL_WINDOW_S,
 * counted from t_kill at the earliest; NAN without samples there.
 */
double graft_sim_stall_after(const graft_sim_result_t *res, double t_kill);

/** The widest interval between two samples in that window: how finely the
 *  stall was measured. NAN without samples there. */
double graft_sim_stall_resolution(const graft_sim_result_t *res, double t_kill);

/** 1 when no other injected failure lies within GRAFT_SIM_STALL_WINDOW_S of
 *  injected[i], on either side. */
int graft_sim_stall_isolated(const graft_sim_result_t *res, size_t i);

/** Summarize the run's etcd_leader_kills into *s_p. */
void graft_sim_leader_summary(const graft_sim_result_t *res, graft_sim_leader_summary_t *s_p);

#endif /* GRAFT_SIM_LIVE_INT_H */
