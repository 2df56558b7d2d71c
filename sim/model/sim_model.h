/*
 * graft-sim model mode: a discrete-event model of a large cluster that
 * compares the goodput of three recovery strategies (see docs/SIM.md).
 *
 * The model is plain C11 and libc (plus libm); it uses only the public
 * status codes of graft/common.h so that the simulator stays on the user's
 * side of the library's wall.
 */
#ifndef GRAFT_SIM_MODEL_H
#define GRAFT_SIM_MODEL_H

#include <graft/common.h>

#include <stddef.h>
#include <stdint.h>

/** Recovery strategies compared by the model. */
typedef enum graft_sim_strategy {
    GRAFT_SIM_CHECKPOINT_RESTART = 0, /**< every failure restarts the job from disk */
    GRAFT_SIM_P2P_SINGLE,             /**< one donor; its death restarts the pull from zero */
    GRAFT_SIM_P2P_MULTI,              /**< striped over donors, verified, resumes */
    GRAFT_SIM_NSTRATEGIES
} graft_sim_strategy_t;

/** Most donors one recipient stripes over. */
#define GRAFT_SIM_MAX_DONORS 64

/**
 * Model parameters. Every field has a JSON key and a command-line flag of
 * the same name (see sim_params.c); units are in the names.
 */
typedef struct graft_sim_params {
    int groups;                   /**< replica groups G */
    int gpus_per_group;           /**< GPUs (ranks) per group */
    double gpu_mtbf_hours;        /**< mean time between failures of one GPU (with its share of host) */
    double disaster_fraction;     /**< share of failures that take down every group */
    double step_seconds;          /**< one optimizer step (compute) */
    double coordination_seconds;  /**< graft's per-step coordination (quorum and commit vote)
                                       added to every step */
    double state_gb;              /**< training state per GPU that a replacement must pull, GB */
    double link_gb_s;             /**< bandwidth of one donor link, GB/s */
    double nic_gb_s;              /**< recipient's ingress cap per GPU, GB/s */
    double verify_gb_s;           /**< hash throughput of a verified pull, GB/s; 0 = never the bottleneck */
    int donors;                   /**< donors per multi-donor pull */
    double detect_seconds;        /**< failure to detection (lease expiry, watchdog) */
    double spawn_seconds;         /**< a replacement group on a spare is up and initialised */
    double spare_seconds;         /**< with graft's spares (processes already up, waiting
                                       with a lease): detection to a spare in the dead
                                       rank's slot; replaces spawn_seconds in the report's
                                       "with spares" columns */
    double quorum_seconds;        /**< forming the new quorum */
    double donor_timeout_seconds; /**< a donor's loss to its stripes being reassigned */
    double link_faults_per_hour;  /**< transient faults of one rank's link to one donor while it serves */
    double checkpoint_seconds;    /**< blocking part of one persistent checkpoint (C), or its
                                       fixed part when checkpoint_gb_s is set */
    double checkpoint_gb_s;       /**< blocking snapshot throughput per GPU, GB/s; 0 = unused;
                                       else C = checkpoint_seconds + state_gb / checkpoint_gb_s */
    double restart_seconds;       /**< whole-job restart from disk after detection (R), or the
                                       part of it besides loading when restore_gb_s is set */
    double restore_gb_s;          /**< restore (load) throughput per GPU, GB/s; 0 = unused;
                                       else R = restart_seconds + state_gb / restore_gb_s */
    double horizon_days;          /**< simulated time per run */
    int runs;                     /**< independent runs averaged per point */
} graft_sim_params_t;

/** What one strategy at one checkpoint interval achieved, averaged over runs. */
typedef struct graft_sim_result {
    double interval_seconds;  /**< persistent checkpoint every this much training time */
    double goodput;           /**< committed training time / wall time, mean over runs */
    double goodput_stddev;    /**< sample standard deviation over runs (0 for one run) */
    double checkpoint_frac;   /**< share of wall time in blocking checkpoints */
    double coordination_frac; /**< share of wall time in per-step coordination */
    double rework_frac;       /**< share of wall time spent on work that was lost */
    double downtime_frac;     /**< share of wall time stalled in detection and recovery */
    double failures;          /**< failures per run */
    double disasters;         /**< failures per run that took down every group */
    double disk_restarts;     /**< restarts from the persistent tier per run */
    double p2p_recoveries;    /**< groups healed from donors per run */
    double transfer_restarts; /**< single-donor pulls that started again from zero, per run */
    double donor_losses;      /**< donors lost in the middle of a pull (death or link fault), per run */
    double link_faults;       /**< transient donor-link faults during pulls, per run */
} graft_sim_result_t;

/** The numerical optimum of one strategy and its closed-form comparison. */
typedef struct graft_sim_optimum {
    graft_sim_strategy_t strategy;
    double best_interval_seconds; /**< argmax of the simulated goodput */
    int at_sweep_bound;           /**< 1 when the argmax sits at an end of the sweep */
    graft_sim_result_t best;      /**< result at the best grid point */
    double disk_mtbf_seconds;     /**< mean time between failures that need the disk (inf if none) */
    double young_seconds;         /**< sqrt(2 C M) with M = disk_mtbf_seconds (inf if none) */
    double daly_seconds;          /**< Daly's higher-order optimum (inf if none) */
    graft_sim_result_t at_young;  /**< simulated at young_seconds (goodput 0 if infinite) */
} graft_sim_optimum_t;

/**
 * @brief Defaults that reproduce the Llama 3 405B example (16,384 H100 in
 *        128 groups of 128; 419 unexpected interruptions in 54 days).
 * @param [out] params_p  filled in.
 */
void graft_sim_params_default(graft_sim_params_t *params_p);

/**
 * @brief Check every field.
 * @param [in]  params  the parameters.
 * @param [out] err     receives a message naming the bad field.
 * @param [in]  errlen  size of @p err.
 * @return GRAFT_OK, GRAFT_EINVAL or GRAFT_ERANGE.
 */
GRAFT_WUR graft_status_t graft_sim_params_check(const graft_sim_params_t *params, char *err,
                                                size_t errlen);

/**
 * @brief The blocking part of one persistent checkpoint:
 *        checkpoint_seconds, plus state_gb / checkpoint_gb_s when set.
 * @param [in] params  valid parameters.
 * @return seconds.
 */
double graft_sim_checkpoint_cost(const graft_sim_params_t *params);

/**
 * @brief A whole-job restart from disk after detection: restart_seconds,
 *        plus state_gb / restore_gb_s when set.
 * @param [in] params  valid parameters.
 * @return seconds.
 */
double graft_sim_restart_cost(const graft_sim_params_t *params);

/**
 * @brief Mean time between failures of the whole job, in seconds.
 * @param [in] params  valid parameters.
 * @return seconds; infinity when failures are off.
 */
double graft_sim_job_mtbf_seconds(const graft_sim_params_t *params);

/**
 * @brief Seconds a single-group peer-to-peer recovery takes when nothing
 *        else fails (detection, spawn, quorum and the pull).
 * @param [in] params    valid parameters.
 * @param [in] strategy  GRAFT_SIM_P2P_SINGLE or GRAFT_SIM_P2P_MULTI.
 * @return seconds.
 */
double graft_sim_p2p_recovery_seconds(const graft_sim_params_t *params,
                                      graft_sim_strategy_t strategy);

/**
 * @brief Simulate one strategy at one persistent checkpoint interval.
 * @param [in]  params    valid parameters.
 * @param [in]  strategy  the strategy.
 * @param [in]  interval_seconds  training time between persistent
 *                        checkpoints, > 0; INFINITY for none.
 * @param [in]  seed      run r uses a stream derived from (seed, r); the
 *                        failure times do not depend on the strategy or the
 *                        interval, so comparisons use common random numbers.
 * @param [out] result_p  the averaged result.
 * @return GRAFT_OK, GRAFT_EINVAL (bad argument), GRAFT_ENOMEM.
 */
GRAFT_WUR graft_status_t graft_sim_model_simulate(const graft_sim_params_t *params,
                                                  graft_sim_strategy_t strategy,
                                                  double interval_seconds, uint64_t seed,
                                                  graft_sim_result_t *result_p);

/**
 * @brief Simulate a strategy over a log-spaced grid of intervals and find
 *        the best one; compare it with Young/Daly.
 * @param [in]  params    valid parameters.
 * @param [in]  strategy  the strategy.
 * @param [in]  lo_seconds, hi_seconds  grid ends, 0 < lo < hi.
 * @param [in]  npoints   grid points, >= 2.
 * @param [in]  seed      as for graft_sim_model_simulate().
 * @param [out] grid      @p npoints results (caller-owned array).
 * @param [out] optimum_p the optimum.
 * @return GRAFT_OK, GRAFT_EINVAL, GRAFT_ENOMEM.
 */
GRAFT_WUR graft_status_t graft_sim_model_sweep(const graft_sim_params_t *params,
                                               graft_sim_strategy_t strategy, double lo_seconds,
                                               double hi_seconds, int npoints, uint64_t seed,
                                               graft_sim_result_t *grid,
                                               graft_sim_optimum_t *optimum_p);

/**
 * @brief Young's first-order optimum sqrt(2 C M).
 * @param [in] c_seconds     checkpoint cost.
 * @param [in] mtbf_seconds  mean time between failures (may be infinite).
 * @return seconds (infinite when @p mtbf_seconds is).
 */
double graft_sim_young_seconds(double c_seconds, double mtbf_seconds);

/**
 * @brief Daly's higher-order optimum (J. T. Daly, 2006): for C < 2M,
 *        sqrt(2CM) [1 + sqrt(C/2M)/3 + C/(18M)] - C; M otherwise.
 * @param [in] c_seconds     checkpoint cost.
 * @param [in] mtbf_seconds  mean time between failures (may be infinite).
 * @return seconds.
 */
double graft_sim_daly_seconds(double c_seconds, double mtbf_seconds);

/**
 * @brief Daly's exact expected goodput of checkpoint-restart under
 *        exponential failures: T / (M e^{R/M} (e^{(T+C)/M} - 1)).
 * @param [in] t_seconds     work between checkpoints.
 * @param [in] c_seconds     checkpoint cost.
 * @param [in] r_seconds     downtime per failure (detection + restart).
 * @param [in] mtbf_seconds  mean time between failures.
 * @return the goodput in [0, 1].
 */
double graft_sim_daly_goodput(double t_seconds, double c_seconds, double r_seconds,
                              double mtbf_seconds);

/**
 * @brief Short name of a strategy ("checkpoint-restart", ...).
 * @param [in] strategy  the strategy.
 * @return a static string.
 */
const char *graft_sim_strategy_name(graft_sim_strategy_t strategy);

#endif /* GRAFT_SIM_MODEL_H */
