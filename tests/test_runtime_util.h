/*
 * The in-process fixture of the runtime tests (header-only, static inline;
 * each test program is one file): runtimes of a 2-group strict job against
 * the program's own etcd (`etcd`, started by the program's group setup),
 * two host regions each, and one step of both runtimes at once, the second
 * on a thread of its own.
 *
 *     graft_runtime_t *rt0 = make_rt(job, 0), *rt1 = make_rt(job, 1);
 *     register_ab(rt0, a0, b0, 512, 1, 2);
 *     register_ab(rt1, a1, b1, 512, 5, 6);
 *     peer_t p0 = {.rt = rt0}, p1 = {.rt = rt1};
 *     step_pair(&p0, &p1);          // step 0: group 1 pulls group 0's state
 *     assert_memory_equal(a1, a0, sizeof(a0));
 */
#ifndef GRAFT_TEST_RUNTIME_UTIL_H
#define GRAFT_TEST_RUNTIME_UTIL_H

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
static graft_test_etcd_t etcd;

/* graft_init() of a runtime of group `group` of a 2-group strict job,
 * against the program's etcd, with timeouts short enough for a test, and
 * setting `name` to `value` when name is not NULL: the status, and the
 * runtime in *rt_p on success. */
static inline graft_status_t make_rt_status(const char *job, int group, const char *name,
                                            const char *value, graft_runtime_t **rt_p)
{
    graft_config_t *c = NULL;
    char g[16];
    snprintf(g, sizeof(g), "%d", group);
    assert_int_equal(graft_config_create(&c), GRAFT_OK);
    assert_int_equal(graft_config_set(c, "job", job, NULL), GRAFT_OK);
    assert_int_equal(graft_config_set(c, "groups", "2", NULL), GRAFT_OK);
    assert_int_equal(graft_config_set(c, "group", g, NULL), GRAFT_OK);
    assert_int_equal(graft_config_set(c, "etcd_endpoints", graft_etcd_server_endpoint(etcd.server),
                                      NULL), GRAFT_OK);
    assert_int_equal(graft_config_set(c, "lease_ttl_ms", "2000", NULL), GRAFT_OK);
    assert_int_equal(graft_config_set(c, "join_timeout_ms", "1000", NULL), GRAFT_OK);
    assert_int_equal(graft_config_set(c, "fence_timeout_ms", "5000", NULL), GRAFT_OK);
    assert_int_equal(graft_config_set(c, "stall_timeout_ms", "2000", NULL), GRAFT_OK);
    assert_int_equal(graft_config_set(c, "quorum_timeout_ms", "30000", NULL), GRAFT_OK);
    if (name != NULL)
        assert_int_equal(graft_config_set(c, name, value, NULL), GRAFT_OK);
    graft_status_t st = graft_init(c, rt_p);
    graft_config_destroy(c);
    return st;
}

/* As make_rt_status(), which must succeed. */
static inline graft_runtime_t *make_rt_set(const char *job, int group, const char *name,
                                           const char *value)
{
    graft_runtime_t *rt = NULL;
    assert_int_equal(make_rt_status(job, group, name, value, &rt), GRAFT_OK);
    return rt;
}

static inline graft_runtime_t *make_rt(const char *job, int group)
{
    return make_rt_set(job, group, NULL, NULL);
}

/* Two host regions "a" and "b", filled with va and vb. */
static inline void register_ab(graft_runtime_t *rt, uint64_t *a, uint64_t *b, size_t n,
                               uint64_t va, uint64_t vb)
{
    for (size_t i = 0; i < n; i++) {
        a[i] = va;
        b[i] = vb;
    }
    graft_region_t ra = {"a", GRAFT_REGION_PARAM, 0, GRAFT_DEVICE_HOST, a, n * 8, 0, 0};
    graft_region_t rb = {"b", GRAFT_REGION_OPTIM, 0, GRAFT_DEVICE_HOST, b, n * 8, 0, 0};
    assert_int_equal(graft_region_register(rt, &ra), GRAFT_OK);
    assert_int_equal(graft_region_register(rt, &rb), GRAFT_OK);
}

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

static inline void *peer_step(void *arg)
{
    peer_t *p = arg;
    p->q_st = graft_quorum(p->rt, &p->info);
    if (p->q_st != GRAFT_OK)
        return NULL;
    p->heal_st = graft_heal_wait(p->rt);
    if (p->publish != NULL)
        p->pub_st = graft_quorum_blob_publish(p->rt, p->publish, strlen(p->publish));
    if (p->read_blob) {
        p->get_st = graft_quorum_blob_get(p->rt, p->info.quorum_id, 20000, p->blob,
                                          sizeof(p->blob) - 1, &p->blob_len);
        p->late_pub_st = graft_quorum_blob_publish(p->rt, "late", 4);
    }
    p->commit_st = graft_commit(p->rt, &p->apply);
    return NULL;
}

/* One step of both runtimes at once (p1 on its own thread); both must
 * have formed the quorum. */
static inline void step_pair(peer_t *p0, peer_t *p1)
{
    pthread_t t;
    assert_int_equal(pthread_create(&t, NULL, peer_step, p1), 0);
    peer_step(p0);
    assert_int_equal(pthread_join(t, NULL), 0);
    assert_int_equal(p0->q_st, GRAFT_OK);
    assert_int_equal(p1->q_st, GRAFT_OK);
}

#endif /* GRAFT_TEST_RUNTIME_UTIL_H */
