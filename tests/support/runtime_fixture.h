/*
 * The in-process fixture of the runtime tests (compiled once, in
 * tests/support): runtimes of a 2-group strict job against the program's
 * own etcd (`rtf_etcd`, started by the program's group setup),
 * two host regions each, and one step of both runtimes at once, the second
 * on a thread of its own.
 *
 *     graft_runtime_t *rt0 = rtf_make(job, 0), *rt1 = rtf_make(job, 1);
 *     rtf_register_ab(rt0, a0, b0, 512, 1, 2);
 *     rtf_register_ab(rt1, a1, b1, 512, 5, 6);
 *     peer_t p0 = {.rt = rt0}, p1 = {.rt = rt1};
 *     rtf_step_pair(&p0, &p1);          // step 0: group 1 pulls group 0's state
 *     assert_memory_equal(a1, a0, sizeof(a0));
 */
#ifndef GRAFT_TEST_RUNTIME_FIXTURE_H
#define GRAFT_TEST_RUNTIME_FIXTURE_H

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>

#include <graft/graft.h>

#include "etcd_fixture.h"

/* The program's etcd: its group setup starts it, its teardown stops it. */
extern graft_test_etcd_t rtf_etcd;

/* A group setup and teardown that only start and stop rtf_etcd. */
int rtf_etcd_setup(void **state);
int rtf_etcd_teardown(void **state);

/* graft_config_set() of each of the @n (name, value) pairs of @set, which
 * must succeed; a pair whose value is NULL is left unset. */
void rtf_config_set_all(graft_config_t *c, const char *const set[][2], size_t n);

/* graft_init() of a runtime of group `group` of a 2-group strict job,
 * against the program's etcd, with timeouts short enough for a test, and
 * setting `name` to `value` when name is not NULL: the status, and the
 * runtime in *rt_p on success. */
graft_status_t rtf_make_status(const char *job, int group, const char *name,
                               const char *value, graft_runtime_t **rt_p);

/* As rtf_make_status(), which must succeed. */
graft_runtime_t *rtf_make_set(const char *job, int group, const char *name,
                              const char *value);

graft_runtime_t *rtf_make(const char *job, int group);

/* Two host regions "a" and "b", filled with va and vb. */
void rtf_register_ab(graft_runtime_t *rt, uint64_t *a, uint64_t *b, size_t n,
                     uint64_t va, uint64_t vb);

/* One step of one runtime, run on its own thread: cmocka's assertions
 * belong to the main thread, so it records what happened instead. */
typedef struct peer {
    graft_runtime_t *rt;
    const char *publish;  /* publish this blob after the heal (NULL: do not) */
    bool read_blob;       /* wait for the quorum's blob, then try to publish */
    graft_status_t q_st, heal_st, pub_st, get_st, late_pub_st, commit_st;
    graft_step_info_t info;
    char blob[64];
    size_t blob_len;
    bool apply;
} peer_t;

void *rtf_peer_step(void *arg);

/* One step of both runtimes at once (p1 on its own thread); both must
 * have formed the quorum. */
void rtf_step_pair(peer_t *p0, peer_t *p1);

#endif /* GRAFT_TEST_RUNTIME_FIXTURE_H */
