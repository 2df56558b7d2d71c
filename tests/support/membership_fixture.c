/* The fixture of the in-process membership tests (membership_fixture.h). */
#include "membership_fixture.h"

#include <setjmp.h>
#include <stdarg.h>
#include <cmocka.h>

#include "membership/membership_internal.h"

graft_test_etcd_t mf_etcd;
const char *mf_endpoint;
graft_etcd_config_t mf_etcd_cfg;

int mf_group_setup(void **state)
{
    (void)state;
    if (graft_test_etcd_start(&mf_etcd, NULL) != 0)
        return -1;
    mf_endpoint = graft_etcd_server_endpoint(mf_etcd.server);
    mf_etcd_cfg = graft_test_etcd_config(&mf_endpoint, 1, 2000);
    return 0;
}

int mf_group_teardown(void **state)
{
    (void)state;
    graft_test_etcd_stop(&mf_etcd);
    return 0;
}

graft_membership_config_t mf_cfg_for(const char *job, uint32_t g, uint32_t r, uint32_t R)
{
    graft_membership_config_t c = {0};
    c.job = job;
    c.etcd = &mf_etcd_cfg;
    c.group = g;
    c.rank = r;
    c.ranks_per_group = R;
    c.min_groups = 1;
    c.lease_ttl_s = 2;
    c.join_timeout_ms = 800;
    c.transfer_address = "tcp://127.0.0.1:1";
    return c;
}

graft_membership_t *mf_join(const char *job, uint32_t g, uint32_t r, uint32_t R)
{
    graft_membership_config_t c = mf_cfg_for(job, g, r, R);
    graft_membership_t *m = NULL;
    assert_int_equal(graft_membership_create(&c, &m), GRAFT_OK);
    return m;
}

graft_membership_t *mf_observe(const char *job, uint32_t R)
{
    graft_membership_config_t c = mf_cfg_for(job, 0, 0, R);
    c.observer = true;
    graft_membership_t *m = NULL;
    assert_int_equal(graft_membership_create(&c, &m), GRAFT_OK);
    return m;
}

bool mf_wait_view(graft_membership_t *obs, size_t n, size_t h, uint32_t timeout_ms)
{
    uint64_t end = graft__now_ns() + (uint64_t)timeout_ms * 1000000ull;
    uint64_t version = 0;
    while (graft__now_ns() < end) {
        graft_membership_view_t *v = NULL;
        assert_int_equal(graft_membership_view_get(obs, &v), GRAFT_OK);
        bool ok = v->n_members == n && v->n_healthy_groups == h;
        version = v->version;
        graft_membership_view_free(v);
        if (ok)
            return true;
        if (graft_membership_view_wait(obs, version, 100, NULL) != GRAFT_OK)
            continue;
    }
    return false;
}
