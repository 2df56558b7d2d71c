/*
 * Helpers of the graftctl tests (compiled once, in tests/support; names
 * start with gc_): the binaries next to the test program, a temporary directory,
 * the test's etcd, and running graftctl with its output captured.
 */
#ifndef GRAFT_TEST_GRAFTCTL_FIXTURE_H
#define GRAFT_TEST_GRAFTCTL_FIXTURE_H

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <jansson.h>
#include <limits.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <graft/membership.h>

#include "etcd_fixture.h"

extern char gc_ctl_bin[PATH_MAX + 32];
extern char gc_sim_bin[PATH_MAX + 32];
extern char gc_tmpdir[PATH_MAX];
extern graft_test_etcd_t gc_etcd;
extern const char *gc_endpoint;

char *gc_slurp(const char *path);

/* Runs graftctl with args (NULL-terminated, without the program); stdout
 * and stderr into *out_p and *err_p (either may be NULL); stdin is
 * /dev/null. With as_nobody, the child drops root first and runs a copy of
 * graftctl that nobody can reach (nobody_ctl_copy); the exit status is 127
 * when even that copy cannot be run. */
int gc_run_ctl_as(bool as_nobody, const char *const *args, char **out_p, char **err_p);

int gc_run_ctl(const char *const *args, char **out_p, char **err_p);

/* Runs graftctl, expects exit 0 and JSON on stdout. */
json_t *gc_ctl_json(const char *const *args);

void gc_sh(const char *fmt, ...);

void gc_sleep_ms(long ms);

/* A string field of a group in graftctl status (NULL: no such group or
 * field). */
const char *gc_group_field(json_t *status, int group, const char *field);

/* The health graftctl status gives a group ("absent" if it has none). */
const char *gc_group_health(json_t *status, int group);

/* Starts argv[0] with argv, stdout and stderr into log (tmpdir/<name>);
 * the child's pid. */
pid_t gc_spawn_logged(const char *const *argv, const char *name);

/* Writes text into tmpdir/name; its path into path (len bytes). */
void gc_tmp_file_write(char *path, size_t len, const char *name, const char *text);

/* The job of a `graft-sim run --persist-root root`: the folder the run
 * makes under its persist root (waits up to 60 s). */
void gc_sim_job_wait(const char *root, char *job, size_t len);

/* Group set-up: the binaries next to this program (BUILD/tests/x ->
 * BUILD/bin/graftctl, BUILD/bin/graft-sim), a temporary directory and an
 * etcd. */
int gc_setup(void **state);

int gc_teardown(void **state);

#endif
