/*
 * The supervisor's own state, shared by its two files: sim_supervisor.c
 * (environments, starting a process, create and destroy, what is asked of
 * a slot) and sim_sup_poll.c (reaping, replacements, signals, a spare
 * handed its slot), which calls down into the first and never the other
 * way round.
 */
#ifndef GRAFT_SIM_SUP_INT_H
#define GRAFT_SIM_SUP_INT_H

#include "sim_supervisor.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

/* One process the supervisor started: a slot's, or a spare's. Seats are
 * never removed (an index stays valid); a run starts few processes. */
typedef struct sim_seat {
    pid_t pid;                    /* -1 once reaped */
    graft_sim_proc_state_t state; /* RUNNING, STOPPED, DEAD or DONE */
    int slot;                     /* the slot it holds; -1: none (a spare that
                                     waits, or a process fenced off its slot) */
    int rank;
    bool spare;                   /* started with GRAFT_SPARE=1 */
    bool sigkilled;               /* we sent it SIGKILL: its death is no news */
    bool fenced;                  /* killed because a spare took its slot */
    uint64_t spawned_ns;          /* when it was started */
    char *log_path;               /* its standard output and error */
} sim_seat_t;

/* Slot (g, r) = g * R + r: its files and the process that holds it. */
typedef struct sim_slot {
    int seat;                /* the seat holding it; -1: none (dead, or vacant until a
                                spare takes it) */
    int last_seat;           /* the last seat that held it; -1: none yet */
    int starts;              /* processes that took it (started for it or promoted) */
    int promotions;          /* of them, spares */
    int deaths;
    uint64_t started_ns;     /* when its process took it */
    uint64_t restart_at_ns;  /* without spares: when its replacement starts */
    char *log_path;          /* the log of the processes started for it */
    char *hash_path, *commits_path, *role_path;
    char **envp;
} sim_slot_t;

/* A spare to start when its time comes (a replacement after a death). */
typedef struct sim_due {
    int rank;
    uint64_t at_ns;
} sim_due_t;

/* A slot's process that died (with spares): for its record's eviction. */
typedef struct sim_death {
    int group, rank;
    pid_t pid;
} sim_death_t;

/* Per rank, what every spare of that rank is started with: a path
 * template for each per-slot file (GRAFT_SIM_GROUP_PLACEHOLDER where the
 * group goes) and the environment. */
typedef struct sim_spare_kind {
    char *hash_path, *commits_path, *role_path;
    char **envp;
} sim_spare_kind_t;

struct graft_sim_sup {
    graft_sim_sup_config_t cfg;
    /* trainer --steps N --seed S --state-hash-out <file> --hash-log <file>
     * [--role-log <file>] extra... */
    char **argv_tmpl;
    size_t hash_arg, commits_arg, role_arg;
    sim_slot_t *slots; /* groups * ranks */
    int n;
    sim_seat_t *seats;
    size_t n_seats, cap_seats;
    sim_spare_kind_t *spare_kinds; /* per rank; NULL without spares */
    sim_due_t *due;
    size_t n_due, cap_due;
    sim_death_t *deaths; /* with spares: not yet taken by graft_sim_sup_next_death() */
    size_t n_deaths, cap_deaths;
    int n_spare_logs; /* names spare-<k>-r<r>.log */
    int done;
    bool gave_up; /* a slot lost its process more than max_restarts times */
    graft_sim_spare_stats_t stats;
};

/* sim_supervisor.c, for sim_sup_poll.c */

/** Start a process for slot @p idx (a new seat that holds it). */
graft_status_t graft_sim__sup_start_slot(graft_sim_sup_t *s, int idx);

/** Start a spare of rank @p rank (a new seat that holds no slot). */
graft_status_t graft_sim__sup_start_spare(graft_sim_sup_t *s, int rank);

/** The slot of (group, rank), NULL when out of range. */
sim_slot_t *graft_sim__sup_slot(const graft_sim_sup_t *s, int group, int rank);

#endif /* GRAFT_SIM_SUP_INT_H */
