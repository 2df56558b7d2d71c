/*
 * The supervisor of `graft-sim run`: it starts G x R trainer processes and,
 * like an orchestrator, starts a replacement whenever one dies (after the
 * spawn delay), until a process exits 0, which means it finished its steps.
 * It also carries out the signals the injector asks for. Each process leads
 * a process group of its own, and a signal reaches the whole group: a
 * trainer started by a launcher (torchrun and its worker) is killed,
 * stopped and resumed as one.
 *
 * Slots and processes: slot (g, r), index g * R + r, is where rank r of
 * group g lives; its files (hash, hash log, role log) are the slot's. With
 * spares (config.spares > 0), S x R more processes start as spares
 * (GRAFT_SPARE=1, rank r each) and every replacement is started as a spare
 * too; a spare holds no slot until graft_sim_sup_adopt() hands it the slot
 * whose member record now carries its pid (it promoted itself in etcd).
 * Until then the slot has no process (GRAFT_SIM_PROC_DEAD).
 */
#ifndef GRAFT_SIM_SUPERVISOR_H
#define GRAFT_SIM_SUPERVISOR_H

#include <graft/common.h>

#include <stdint.h>
#include <sys/types.h>

typedef struct graft_sim_sup graft_sim_sup_t;

/** Where a spare's per-slot file paths (--state-hash-out, --hash-log,
 *  --role-log) hold its group: the trainer replaces it with graft_group()
 *  once its first graft_quorum() returned (docs/SIM.md, trainer contract). */
#define GRAFT_SIM_GROUP_PLACEHOLDER "{group}"

/** What a supervisor starts. */
typedef struct graft_sim_sup_config {
    const char *trainer;            /**< path of the trainer program */
    const char *const *extra_args;  /**< NULL-terminated arguments after the common ones */
    const char *const *env;         /**< NULL-terminated "K=V" added to the environment */
    const char *dir;                /**< per-process logs and hash files go here */
    int groups, ranks;
    long long steps;
    uint64_t seed;
    uint32_t restart_delay_ms;      /**< orchestrator's delay before a replacement
                                         (--spawn-delay-ms) */
    int spares;                     /**< spare groups: spares x ranks processes started
                                         with GRAFT_SPARE=1, and every replacement
                                         started as a spare; 0: none */
    int spare_follow;               /**< spares get GRAFT_SPARE_FOLLOW=1 (--follow) */
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
 *        is set; with @p group < 0 a spare's: GRAFT_SPARE=1 and GRAFT_RANK,
 *        no GRAFT_GROUP. Made before fork(): a child of graft-sim (which has
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
 * @brief Hand slot (@p group, @p rank) to the spare whose pid is @p pid: the
 *        observer saw the slot's member record carry that pid, so the spare
 *        promoted itself there. A process the slot still had (hung, its
 *        lease lapsed) is killed, as an orchestrator fences a replaced
 *        node, and its replacement spare is due after the spawn delay.
 * @param [in] sup    the supervisor.
 * @param [in] group  the slot's group.
 * @param [in] rank   its rank.
 * @param [in] pid    the pid in the slot's member record.
 * @return 1 when a spare took the slot now, else 0 (the slot's own process
 *         already, or no waiting spare has that pid).
 */
int graft_sim_sup_adopt(graft_sim_sup_t *sup, int group, int rank, pid_t pid);

/**
 * @brief With spares: the next slot process that died, oldest first. The
 *        supervisor saw it end (waitpid()), so its member record can be
 *        evicted at once (graft_membership_evict()), as an orchestrator
 *        does, and a spare take the slot without waiting for the lease to
 *        lapse. A process fenced off its slot is not listed (a spare holds
 *        the record already).
 * @param [in]  sup    the supervisor.
 * @param [out] group  its slot's group.
 * @param [out] rank   and rank.
 * @param [out] pid    the dead process's pid.
 * @return 1 with the outputs set, 0 when none is left.
 */
int graft_sim_sup_next_death(graft_sim_sup_t *sup, int *group, int *rank, pid_t *pid);

/** What became of the spares (config.spares > 0), counted since the start. */
typedef struct graft_sim_spare_stats {
    int started;  /**< spare processes started (the first S x R and replacements) */
    int promoted; /**< of them, handed a slot (graft_sim_sup_adopt()) */
    int waiting;  /**< running now without a slot */
    int unused;   /**< exited 0 without a slot (the job finished) */
    int died;     /**< died without a slot */
    int fenced;   /**< slot processes killed because a spare took their slot */
    int owed;     /**< replacements due but not started yet (spawn delay) */
} graft_sim_spare_stats_t;

/**
 * @brief The spares' counts.
 * @param [in]  sup  the supervisor.
 * @param [out] st   the counts (all 0 without spares).
 */
void graft_sim_sup_spare_stats(const graft_sim_sup_t *sup, graft_sim_spare_stats_t *st);

/**
 * @brief Number of times a spare took slot (@p group, @p rank).
 * @param [in] sup    the supervisor.
 * @param [in] group  its group.
 * @param [in] rank   its rank.
 * @return the count (also counted in graft_sim_sup_starts()).
 */
int graft_sim_sup_promotions(const graft_sim_sup_t *sup, int group, int rank);

/**
 * @brief When the process now holding slot (@p group, @p rank) was started
 *        (graft_sim_now_ns()): for a spare that took the slot, whether it
 *        was already waiting at a failure or was started after it.
 * @return the time; 0 when no process holds the slot.
 */
uint64_t graft_sim_sup_holder_spawned_ns(const graft_sim_sup_t *sup, int group, int rank);

/**
 * @brief Number of processes that took slot (@p group, @p rank): 1 +
 *        replacements started for it + spares promoted into it.
 * @param [in] sup    the supervisor.
 * @param [in] group  its group.
 * @param [in] rank   its rank.
 * @return the count.
 */
int graft_sim_sup_starts(const graft_sim_sup_t *sup, int group, int rank);

/**
 * @brief Monotonic time (ns) the current process of (group, rank) started,
 *        or a spare took the slot.
 * @param [in] sup    the supervisor.
 * @param [in] group  its group.
 * @param [in] rank   its rank.
 * @return the time, 0 before it was started.
 */
uint64_t graft_sim_sup_started_ns(const graft_sim_sup_t *sup, int group, int rank);

/**
 * @brief Number of slots whose process has exited 0 (spares not counted).
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
 * @brief Path of the output log of (group, rank)'s process, the last one
 *        when it has none (started for the slot: one log for all of them;
 *        a spare: its own).
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
