/* The in-process fixture of the runtime tests (runtime_fixture.h). */
#include "runtime_fixture.h"

graft_test_etcd_t rtf_etcd;

int rtf_etcd_setup(void **state)
{
    (void)state;
    return graft_test_etcd_start(&rtf_etcd, NULL);
}

int rtf_etcd_teardown(void **state)
{
    (void)state;
    graft_test_etcd_stop(&rtf_etcd);
    return 0;
}

void rtf_config_set_all(graft_config_t *c, const char *const set[][2], size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (set[i][1] != NULL)
            assert_int_equal(graft_config_set(c, set[i][0], set[i][1], NULL), GRAFT_OK);
}

graft_status_t rtf_make_status(const char *job, int group, const char *name,
                               const char *value, graft_runtime_t **rt_p)
{
    graft_config_t *c = NULL;
    char g[16];
    snprintf(g, sizeof(g), "%d", group);
    assert_int_equal(graft_config_create(&c), GRAFT_OK);
    assert_int_equal(graft_config_set(c, "job", job, NULL), GRAFT_OK);
    assert_int_equal(graft_config_set(c, "groups", "2", NULL), GRAFT_OK);
    assert_int_equal(graft_config_set(c, "group", g, NULL), GRAFT_OK);
    assert_int_equal(
        graft_config_set(c, "etcd_endpoints", graft_etcd_server_endpoint(rtf_etcd.server), NULL),
        GRAFT_OK);
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

graft_runtime_t *rtf_make_set(const char *job, int group, const char *name,
                              const char *value)
{
    graft_runtime_t *rt = NULL;
    assert_int_equal(rtf_make_status(job, group, name, value, &rt), GRAFT_OK);
    return rt;
}

graft_runtime_t *rtf_make(const char *job, int group)
{
    return rtf_make_set(job, group, NULL, NULL);
}

void rtf_register_ab(graft_runtime_t *rt, uint64_t *a, uint64_t *b, size_t n,
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

void *rtf_peer_step(void *arg)
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

void rtf_step_pair(peer_t *p0, peer_t *p1)
{
    pthread_t t;
    assert_int_equal(pthread_create(&t, NULL, rtf_peer_step, p1), 0);
    rtf_peer_step(p0);
    assert_int_equal(pthread_join(t, NULL), 0);
    assert_int_equal(p0->q_st, GRAFT_OK);
    assert_int_equal(p1->q_st, GRAFT_OK);
}
