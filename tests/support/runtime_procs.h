/*
 * The process fixture of the runtime's end-to-end tests (compiled once, in
 * tests/support, over runtime_fixture.h): the program's etcd
 * and jobs of examples/train_mlp (G groups x R ranks) started as real
 * processes, their hash logs, role logs and final lines, and the checks
 * that every group held bit-identical state at every commit and that a job
 * ended bit-identical to a fault-free run (train_mlp --no-graft).
 *
 *     job_t j;
 *     rp_job_init(&j, "name");
 *     rp_spawn_all(&j, flags);       // every rank, with train_mlp's flags
 *     rp_wait_log(&j.p[0], 10, 60);  // group 0 rank 0 committed 10 steps
 *     rp_wait_all(&j, 120);
 *     rp_check_final(&j, steps);     // each rank's hash is the reference's
 *     rp_check_logs(&j, steps);      // every commit equal across groups
 *
 * The group setup (rp_setup) finds the trainer beside the test program and starts
 * etcd; the teardown kills what a failed test left and removes its
 * directories.
 */
#ifndef GRAFT_TEST_SUPPORT_RUNTIME_PROCS_H
#define GRAFT_TEST_SUPPORT_RUNTIME_PROCS_H

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <fcntl.h>
#include <inttypes.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <graft/membership.h>

#include "etcd_fixture.h"
#include "runtime_fixture.h"

#define G 3
#define R 2
#define MAX_PROCS 16

extern char rp_trainer[1100];

typedef struct proc {
    pid_t pid;
    int group, rank;
    char out[400];  /* stdout */
    char log[400];  /* --hash-log */
    char role[400]; /* --role-log: serves and heals */
    char err[400];  /* stderr, when the job captures it */
    int status;
    bool done;
    bool spare; /* started with GRAFT_SPARE=1: group is -1 until it says otherwise */
} proc_t;

typedef struct job {
    char dir[256];
    char name[64];
    const char *extra_env[8]; /* "NAME=value" */
    bool capture_err;         /* stderr to a file per process */
    proc_t p[MAX_PROCS];
    int n;
} job_t;

double rp_now_s(void);

void rp_job_init(job_t *j, const char *name);

void rp_rm_rf(const char *path);

/* Start rank (group, rank) of the trainer with the given flags. */
proc_t *rp_spawn(job_t *j, int group, int rank, const char *const *flags);

void rp_spawn_all(job_t *j, const char *const *flags);

/* Start a spare of rank @p rank (GRAFT_SPARE=1, no GRAFT_GROUP). */
proc_t *rp_spawn_spare(job_t *j, int rank, const char *const *flags);

/* The same, of a group of spares (GRAFT_SPARE_GROUP): promoted together. */
proc_t *rp_spawn_spare_in(job_t *j, const char *spare_group, int rank, const char *const *flags);

/* The group a spare was promoted into, from its output ("spare promoted to
 * group G"); -1 while it was not. */
int rp_spare_group(const proc_t *p);

/* An observer of job `job` (R ranks per group) on the program's etcd, to
 * see slots and spares as etcd holds them. */
graft_membership_t *rp_observe(const char *job, uint32_t ranks);

/* The pid holding slot (group, rank) in the observer's view; 0: vacant. */
int rp_slot_pid(graft_membership_t *obs, int group, int rank);

/* The spares registered now (read from etcd). */
size_t rp_spares_registered(graft_membership_t *obs);

/* Wait until exactly n spares are registered. */
void rp_wait_spares(graft_membership_t *obs, size_t n, double timeout_s);

/* Wait for a process that must end by itself. */
void rp_wait_proc(proc_t *p, double timeout_s);

/* Wait for every process; those still alive after timeout_s are killed
 * (and fail the test). */
void rp_wait_all(job_t *j, double timeout_s);

/* Every process of a job that dies at one step (--die-at-step): once the
 * first is gone, the rest get @p grace_s to reach that step too; one still
 * running then is killed, as the disaster would kill it. A rank whose last
 * vote had not reached it when its peers died waits in graft_quorum() for
 * a quorum that cannot form (60 s, then an error exit): the peers' deaths
 * race their votes. Returns how many were killed here. */
int rp_wait_job_lost(job_t *j, double timeout_s, double grace_s);

void rp_kill_proc(proc_t *p);

/* Lines in a hash log: the last step it reached. */
int rp_log_lines(const char *path);

/* The last lines of a process's captured stderr, for a failure's message
 * (CI keeps the test's output, not the job's directory). */
void rp_print_err_tail(const proc_t *p);

void rp_wait_log(const proc_t *p, int lines, double timeout_s);

bool rp_file_contains(const char *path, const char *needle);

/* Parse "final step N hash H start K recoveries R" from a trainer's output. */
void rp_read_final(const proc_t *p, uint64_t *step, char hash[17], char start[16],
                   uint64_t *recoveries);

/* The trainer's second output line. */
typedef struct trainer_metrics {
    uint64_t commits, commits_failed, drift_checks, drift_mismatches, restores;
    uint64_t recovery_failures, serves, checkpoints_written, checkpoints_committed;
    uint64_t steady_steps, steady_fallbacks, etcd_requests, remote_uploaded, remote_superseded;
} trainer_metrics_t;

void rp_read_metrics(const proc_t *p, trainer_metrics_t *m);

/* Every process that exited normally ended at `steps` with the reference
 * hash of its rank (trained with a blob of blob_mib MiB); returns how many
 * recovered (pulled state). */
int rp_check_final_blob(job_t *j, int steps, int blob_mib);

int rp_check_final(job_t *j, int steps);

/* Every commit any process logged agrees with every other process of the
 * same rank at the same step. */
void rp_check_logs(job_t *j, int steps);

/* Processes first_new.. of j (restarted after every group died) started
 * from a checkpoint (restored, or healed from a peer that restored) and
 * their first committed step is first_step. */
void rp_check_restarted_from(job_t *j, int first_new, unsigned first_step);

int rp_setup(void **state);

int rp_teardown(void **state);

#endif
