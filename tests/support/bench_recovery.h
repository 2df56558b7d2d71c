/*
 * The recovery measurement of runtime_bench (and of any benchmark that
 * times one): 3 groups in strict mode, each a process with `mib` MiB of
 * state, one killed with SIGKILL once every group committed 3 steps, and
 * the time to the first step its successor commits, by phase. The
 * successor is one of:
 *
 *   respawn      a new process started at once, as an orchestrator would;
 *   spare        a spare (GRAFT_SPARE) started with the job, waiting; the
 *                bench evicts the dead rank (graft_membership_evict(), as
 *                an agent does after waitpid()), so the spare takes the
 *                slot at once;
 *   spare-lapse  the same spare, no eviction: it takes the slot when the
 *                dead rank's lease lapses (lease_ttl_ms);
 *   follow       a follow spare (GRAFT_SPARE_FOLLOW: it pulls each step
 *                from group 0 while it waits), the dead rank evicted;
 *   follow-lapse the follow spare, no eviction.
 *
 * graft_bench_follow_cost() measures what a follower costs its donor: the
 * same 3 groups' steps with and without one follow spare.
 *
 * Each run has a job of its own on the given etcd; the state's own
 * checkpoint is restored afterwards (page cache dropped) for the P2P
 * comparison. Public headers only.
 */
#ifndef GRAFT_TEST_SUPPORT_BENCH_RECOVERY_H
#define GRAFT_TEST_SUPPORT_BENCH_RECOVERY_H

#include <stddef.h>

typedef enum graft_bench_successor {
    GRAFT_BENCH_RESPAWN = 0,
    GRAFT_BENCH_SPARE,
    GRAFT_BENCH_SPARE_LAPSE,
    GRAFT_BENCH_FOLLOW,
    GRAFT_BENCH_FOLLOW_LAPSE,
    GRAFT_BENCH_N_SUCCESSORS
} graft_bench_successor_t;

/** "respawn", "spare", "spare-lapse", "follow", "follow-lapse". */
const char *graft_bench_successor_name(graft_bench_successor_t s);

/** One recovery, in seconds. */
typedef struct graft_bench_rec_row {
    size_t mib;
    graft_bench_successor_t successor;
    double total;    /* kill -> the successor's first committed step */
    double detect;   /* kill -> the successor joined (respawn: started, state
                        filled, joined; spare: evicted or lapsed, promoted) */
    double init;     /* respawn: filling its own state before graft_init() */
    double quorum, transfer, verify;
    double restore;  /* the same state from its own checkpoint; -1: not measured */
} graft_bench_rec_row_t;

/** The runs' settings: etcd endpoint, steady path, lease TTL in ms. */
typedef struct graft_bench_rec_config {
    const char *endpoint;
    const char *steady_path;
    unsigned lease_ttl_ms;
    int with_restore; /* also time the restore from a checkpoint */
} graft_bench_rec_config_t;

/** One run; 0, or -1 with a message on stderr. */
int graft_bench_recovery(const graft_bench_rec_config_t *cfg, size_t mib,
                         graft_bench_successor_t successor, graft_bench_rec_row_t *row);

/** A follower's cost to its donor (group 0), in seconds per step. */
typedef struct graft_bench_follow_row {
    size_t mib;
    unsigned compute_ms;  /* a step's compute (a sleep) */
    double step_alone;    /* group 0's median step (quorum to commit), no follower */
    double step_followed; /* the same with one follow spare of rank 0 */
    double wait;          /* its commit's wait for the follower, mean per step */
    double served;        /* the share of its steps it served to the follower */
    double pulled;        /* the follower's pulled steps over the donor's steps */
} graft_bench_follow_row_t;

/** Both runs of @p steps steps of @p compute_ms each; 0, or -1 with a
 *  message on stderr. */
int graft_bench_follow_cost(const graft_bench_rec_config_t *cfg, size_t mib, int steps,
                            unsigned compute_ms, graft_bench_follow_row_t *row);

/** The median by total of n rows (sorts them). */
graft_bench_rec_row_t graft_bench_rec_median(graft_bench_rec_row_t *rows, int n);

#endif
