/*
 * The fixture of the in-process membership tests (test_membership*.c):
 * the program's etcd, started by the group setup and stopped by its
 * teardown, and handles of a job against it (a rank, an observer) with
 * timeouts short enough for a test.
 *
 *     return cmocka_run_group_tests_name("membership", tests, mf_group_setup,
 *                                        mf_group_teardown);
 *     graft_membership_t *m = mf_join("job", 0, 0, 1);   // group 0 rank 0 of R=1
 *     graft_membership_t *obs = mf_observe("job", 1);
 *     assert_true(mf_wait_view(obs, 1, 1, 5000));
 */
#ifndef GRAFT_TEST_MEMBERSHIP_FIXTURE_H
#define GRAFT_TEST_MEMBERSHIP_FIXTURE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <graft/membership.h>

#include "etcd_fixture.h"

/* The program's etcd, its endpoint, and a client config for it. */
extern graft_test_etcd_t mf_etcd;
extern const char *mf_endpoint;
extern graft_etcd_config_t mf_etcd_cfg;

/* cmocka group setup and teardown: start and stop mf_etcd. */
int mf_group_setup(void **state);
int mf_group_teardown(void **state);

/* The config of rank (g, r) of job `job` with R ranks per group against
 * mf_etcd: min_groups 1, a 2 s lease, an 800 ms join timeout. */
graft_membership_config_t mf_cfg_for(const char *job, uint32_t g, uint32_t r, uint32_t R);

/* A handle of rank (g, r), which must join. */
graft_membership_t *mf_join(const char *job, uint32_t g, uint32_t r, uint32_t R);

/* An observer of job `job`. */
graft_membership_t *mf_observe(const char *job, uint32_t R);

/* Wait until the observer's view has n members and h healthy groups. */
bool mf_wait_view(graft_membership_t *obs, size_t n, size_t h, uint32_t timeout_ms);

#endif /* GRAFT_TEST_MEMBERSHIP_FIXTURE_H */
