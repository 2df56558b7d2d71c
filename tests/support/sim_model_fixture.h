/*
 * What the tests of `graft-sim model` (test_sim_model_params.c,
 * test_sim_model_cli.c) share: a temporary directory per program, files
 * written and read back whole, the built graft-sim run with its standard
 * error captured, and the runtime_bench --json line both read. Plain libc,
 * no cmocka: each program asserts on what these return.
 */
#ifndef GRAFT_TEST_SIM_MODEL_FIXTURE_H
#define GRAFT_TEST_SIM_MODEL_FIXTURE_H

#include <stddef.h>

/* runtime_bench --json with a steady curve by groups: peers at 8 and 32
 * groups (0.3 and 2.6 ms), the etcd path at 8 (left out by the model), and
 * a failed size (-1 at 64). */
#define GRAFT_TEST_SIM_RT_STEADY_JSON                                                          \
    "{\"bench\":\"runtime\",\"etcd_put_median_ms\":1.2,\"steady\":["                           \
    "{\"groups\":8,\"path\":\"peers\",\"median_ms\":0.3,\"etcd_requests_per_step\":0,"        \
    "\"etcd_cpu_ms_per_step\":0},"                                                             \
    "{\"groups\":8,\"path\":\"etcd\",\"median_ms\":40,\"etcd_requests_per_step\":30,"         \
    "\"etcd_cpu_ms_per_step\":3},"                                                             \
    "{\"groups\":32,\"path\":\"peers\",\"median_ms\":2.6,\"etcd_requests_per_step\":0,"       \
    "\"etcd_cpu_ms_per_step\":0},"                                                             \
    "{\"groups\":64,\"path\":\"peers\",\"median_ms\":-1,\"etcd_requests_per_step\":0,"        \
    "\"etcd_cpu_ms_per_step\":0}],\"recovery\":[]}\n"

/* A cmocka group setup: a new $TMPDIR/graft-sim-test.XXXXXX for the
 * program's files. 0, or -1 (errno). */
int graft_test_sim_setup(void **state);

/* The group teardown: that directory and the files in it removed. */
int graft_test_sim_teardown(void **state);

/* The program's directory (made by graft_test_sim_setup). */
const char *graft_test_sim_dir(void);

/* Writes text into path (created or truncated). 0, or -1 (errno). */
int graft_test_sim_write(const char *path, const char *text);

/* The whole of path, NUL-terminated (free() it); NULL on an error. */
char *graft_test_sim_slurp(const char *path);

/*
 * Runs the built graft-sim (bin/graft-sim of the build whose tests/ holds
 * this program) with args (NULL-terminated, without the program), its
 * standard output discarded and its standard error into err[errlen] (by
 * way of stderr.txt in the program's directory). Its exit status, or -1
 * when it could not be run or did not exit (the reason in err and on
 * stderr).
 */
int graft_test_sim_run_binary(char *const args[], char *err, size_t errlen);

#endif
