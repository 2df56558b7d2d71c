/*
 * The supervisor of `graft-sim run`: it starts G x R trainer processes and,
 * like an orchestrator, starts a replacement whenever one dies (after a
 * short delay), until a process exits 0, which means it finished its steps.
 * It also carries out the signals the injector asks for. Each process leads
 * a process group of its own, and a signal reaches the whole group: a
 * trainer started by a launcher (torchrun and its worker) is killed,
 * stopped and resumed as one.
 */
#ifndef GRAFT_SIM_SUPERVISOR_H
#define GRAFT_SIM_SUPERVISOR_H

#include <graft/common.h>

#include <stdint.h>
#include <sys/types.h>

typedef struct graft_sim_sup graft_sim_sup_t;

/** What a supervisor starts. */
typedef struct graft_sim_sup_config {
    const char *trainer;            /**< path of the trainer program */
    const char *const *extra_args;  /**< NULL-terminated arguments after the common ones */
    const char *const *env;         /**< NULL-terminated "K=V" added to the environment */
    const char *dir;                /**< per-process logs and hash files go here */
    int groups, ranks;
    long long steps;
    uint64_t seed;
    uint32_t restart_delay_ms;      /**< orchestrator's delay before a replacement */
    int max_restarts;               /**< per process; past it the run fails */
    int role_log;                   /**< pass --role-log (train_mlp: serves and heals) */
    /** A group is one torch world: its processes get what torchrun gives a
     *  worker (RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, and
     *  MASTER_ADDR=127.0.0.1, MASTER_PORT=master_ports[g]), and when one
     *  dies the others of its group are killed, so that the world starts
     *  again whole; NULL: the ranks are independent processes. */
    const int *master_ports;
} graft_sim_sup_config_t;

/** State of one supervised process. */
typedef enum graft_sim_proc_state {
    GRAFT_SIM_PROC_RUNNING = 0,
    GRAFT_SIM_PROC_STOPPED, /**< SIGSTOPped by the injector */
    GRAFT_SIM_PROC_DEAD,    /**< waiting for its replacement */
    GRAFT_SIM_PROC_DONE     /**< exited 0 */
} graft_sim_proc_state_t;

/**
 * @brief The environment of process (@p group, @p rank) as the supervisor
 *        starts it: the inherited one, config->env, GRAFT_GROUP and
 *        GRAFT_RANK, and a torch world's variables when config->master_ports
 *        is set. Made before fork(): a child of graft-sim (which has
 *        threads) only execs.
 * @return a NULL-terminated array to free with graft_sim_sup_strv_free(),
 *         or NULL when out of memory.
 */
char **graft_sim_sup_envp(const graft_sim_sup_config_t *config, int group, int rank);

/** Free what graft_sim_sup_envp() returned; accepts NULL. */
void graft_sim_sup_strv_free(char **v);

/**
 * @brief @p n distinct loopback ports that bind now (below the ephemeral
 *        range where there is room), for the groups' torch rendezvous.
 * @param [in]  n      how many.
 * @param [out] ports  n ports.
 * @return GRAFT_OK, GRAFT_ESYS (no free port found).
 */
GRAFT_WUR graft_status_t graft_sim_free_ports(int n, int *ports);

/**
 * @brief Create a supervisor and start every process.
 * @param [in]  config  what to start; copied where needed.
 * @param [out] sup_p   the supervisor.
 * @return GRAFT_OK, GRAFT_ENOMEM, GRAFT_ESYS (fork or open failed).
 */
GRAFT_WUR graft_status_t graft_sim_sup_create(const graft_sim_sup_config_t *config,
                                              graft_sim_sup_t **sup_p);

/**
 * @brief Kill and reap every process, free. Accepts NULL.
 * @param [in] sup  the supervisor.
 */
void graft_sim_sup_destroy(graft_sim_sup_t *sup);

/**
 * @brief Reap exited processes and start due replacements.
 * @param [in] sup  the supervisor.
 * @return GRAFT_OK; GRAFT_ESYS (a replacement could not be started);
 *         GRAFT_ERANGE (a process died more than max_restarts times).
 */
GRAFT_WUR graft_status_t graft_sim_sup_poll(graft_sim_sup_t *sup);

/**
 * @brief Send a signal to one process (SIGKILL, SIGSTOP, SIGCONT). A
 *        stopped process that gets SIGKILL is reaped as dead.
 * @param [in] sup    the supervisor.
 * @param [in] group  its group.
 * @param [in] rank   its rank.
 * @param [in] sig    the signal.
 * @return GRAFT_OK, GRAFT_ESTATE (not running), GRAFT_EINVAL.
 */
GRAFT_WUR graft_status_t graft_sim_sup_signal(graft_sim_sup_t *sup, int group, int rank, int sig);

/**
 * @brief State of one process.
 * @param [in] sup    the supervisor.
 * @param [in] group  its group.
 * @param [in] rank   its rank.
 * @return the state.
 */
graft_sim_proc_state_t graft_sim_sup_state(const graft_sim_sup_t *sup, int group, int rank);

/**
 * @brief Number of times a process was started (1 + replacements).
 * @param [in] sup    the supervisor.
 * @param [in] group  its group.
 * @param [in] rank   its rank.
 * @return the count.
 */
int graft_sim_sup_starts(const graft_sim_sup_t *sup, int group, int rank);

/**
 * @brief Monotonic time (ns) the current process of (group, rank) started.
 * @param [in] sup    the supervisor.
 * @param [in] group  its group.
 * @param [in] rank   its rank.
 * @return the time, 0 before it was started.
 */
uint64_t graft_sim_sup_started_ns(const graft_sim_sup_t *sup, int group, int rank);

/**
 * @brief Number of processes that have exited 0.
 * @param [in] sup  the supervisor.
 * @return the count.
 */
int graft_sim_sup_done(const graft_sim_sup_t *sup);

/**
 * @brief Whether a process is dead and waiting for its replacement.
 * @param [in]  sup    the supervisor.
 * @param [out] group  the first such process's group.
 * @param [out] rank   and rank.
 * @return 1 if one is, else 0.
 */
int graft_sim_sup_dead(const graft_sim_sup_t *sup, int *group, int *rank);

/**
 * @brief Path of the state-hash file of (group, rank).
 * @param [in] sup    the supervisor.
 * @param [in] group  its group.
 * @param [in] rank   its rank.
 * @return a string owned by the supervisor.
 */
const char *graft_sim_sup_hash_path(const graft_sim_sup_t *sup, int group, int rank);

/**
 * @brief Path of the output log of (group, rank) (all incarnations).
 * @param [in] sup    the supervisor.
 * @param [in] group  its group.
 * @param [in] rank   its rank.
 * @return a string owned by the supervisor.
 */
const char *graft_sim_sup_log_path(const graft_sim_sup_t *sup, int group, int rank);

/**
 * @brief Print the last @max bytes (at most 4095) of a process's log to
 *        standard error: the run's directory may be gone when the error is read.
 */
void graft_sim_sup_log_tail(const graft_sim_sup_t *sup, int group, int rank, long max);

/**
 * @brief Path of the --hash-log file of (group, rank) ("step hash" per
 *        applied commit, appended by every incarnation).
 * @param [in] sup    the supervisor.
 * @param [in] group  its group.
 * @param [in] rank   its rank.
 * @return a string owned by the supervisor.
 */
const char *graft_sim_sup_commits_path(const graft_sim_sup_t *sup, int group, int rank);

/**
 * @brief Path of the --role-log file of (group, rank) (train_mlp: "step
 *        serving G R" when its endpoint starts serving a recipient, heals,
 *        ...; appended by every incarnation). Written only with role_log.
 * @param [in] sup    the supervisor.
 * @param [in] group  its group.
 * @param [in] rank   its rank.
 * @return a string owned by the supervisor.
 */
const char *graft_sim_sup_role_path(const graft_sim_sup_t *sup, int group, int rank);

/** Monotonic clock in nanoseconds. */
uint64_t graft_sim_now_ns(void);

#endif /* GRAFT_SIM_SUPERVISOR_H */
