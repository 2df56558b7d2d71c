/*
 * Live mode of graft-sim (`graft-sim run`): the options its command line
 * has validated, and the entry point that runs them. The command line lives
 * in sim_run_cli.c; the live engine (sim_live.c, sim_observe.c,
 * sim_inject.c and sim_reference.c, with sim_schedule.c, sim_supervisor.c,
 * sim_verdict.c and sim_timeline.c) implements graft_sim_live_run().
 */
#ifndef GRAFT_SIM_LIVE_H
#define GRAFT_SIM_LIVE_H

#include <stdint.h>

/** Exit status of graft-sim when a mode is not part of this build. */
#define GRAFT_SIM_EXIT_UNAVAILABLE 3

/** Consistency the verdict checks. */
typedef enum graft_sim_live_mode {
    GRAFT_SIM_LIVE_STRICT = 0, /**< final state bit-exact with a fault-free run */
    GRAFT_SIM_LIVE_ELASTIC     /**< every group identical at every commit */
} graft_sim_live_mode_t;

/** Validated options of `graft-sim run` (names as on the command line). */
typedef struct graft_sim_live_opts {
    int groups;                 /**< --groups G, >= 1 */
    int ranks;                  /**< --ranks R, >= 1 */
    long long steps;            /**< --steps N, >= 1 */
    uint64_t seed;              /**< --seed S */
    graft_sim_live_mode_t mode; /**< --mode strict|elastic */
    int random_failures;        /**< --random-failures N, >= 0 */
    const char *schedule_path;  /**< --schedule FILE (readable) or NULL */
    const char *etcd_url;       /**< --etcd URL[,URL...] (http:// or https://) or NULL:
                                     embedded etcd */
    int etcd_members;           /**< --etcd-members N: the embedded etcd's size, >= 1 */
    const char *persist_root;   /**< --persist-root DIR or NULL */
    long long persist_every;    /**< --persist-every K, >= 1 when persist_root is set, else 0 */
    const char *persist_remote; /**< --persist-remote s3://bucket[/prefix] or NULL: the
                                     trainers' remote tier, under prefix/<job> */
    const char *persist_remote_endpoint; /**< --persist-remote-endpoint URL (a non-AWS store)
                                     or NULL */
    int netns;                  /**< --netns given */
    int torch_world;            /**< --torch-world: a group's ranks are one torch world */
    int spares;                 /**< --spares N: spare groups (N x R processes started
                                     with GRAFT_SPARE=1; every replacement a spare), >= 0 */
    int follow;                 /**< --follow: the spares follow the job's state
                                     (GRAFT_SPARE_FOLLOW=1) */
    uint32_t spawn_delay_ms;    /**< --spawn-delay-ms D: a dead process to its
                                     replacement's start [100] */
    const char *json_path;      /**< --json FILE or NULL */
    const char *plot_path;      /**< --plot FILE.svg or NULL (default: the --json path, .svg) */
} graft_sim_live_opts_t;

/**
 * @brief Run the live simulation and judge its verdict.
 * @param [in] opts  validated options.
 * @return the process exit status: 0 only when the verdict holds.
 */
int graft_sim_live_run(const graft_sim_live_opts_t *opts);

#endif /* GRAFT_SIM_LIVE_H */
