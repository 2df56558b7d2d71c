/*
 * A group that joins a running job and lacks its state, in one process
 * against the program's etcd (runtime_fixture.h): when its first round
 * forms without the group that holds the state (elastic, min_groups 1;
 * that group live but not ready in time, as on a loaded host), it votes no
 * and waits for a round with it, then heals from it. Declaring the job's
 * state lost there was wrong (it ended a joining group with
 * GRAFT_ESTATELOST in test_runtime's test_donors_lost_no_checkpoint under
 * load). With no such group live, the state is lost as before
 * (test_runtime.c).
 */
#include "runtime_procs.h"

/* An elastic job of 2 groups where one group is enough. */
static graft_runtime_t *elastic_rt(const char *job, int group)
{
    graft_config_t *c = NULL;
    graft_runtime_t *rt = NULL;
    char g[16];
    snprintf(g, sizeof(g), "%d", group);
    assert_int_equal(graft_config_create(&c), GRAFT_OK);
    const char *kv[][2] = {{"job", job}, {"groups", "2"}, {"group", g},
                           {"etcd_endpoints", graft_etcd_server_endpoint(rtf_etcd.server)},
                           {"mode", "elastic"}, {"min_groups", "1"},
                           {"lease_ttl_ms", "2000"}, {"join_timeout_ms", "1000"},
                           {"quorum_timeout_ms", "30000"}};
    for (size_t i = 0; i < sizeof(kv) / sizeof(kv[0]); i++)
        assert_int_equal(graft_config_set(c, kv[i][0], kv[i][1], NULL), GRAFT_OK);
    assert_int_equal(graft_init(c, &rt), GRAFT_OK);
    graft_config_destroy(c);
    return rt;
}

static void test_joiner_waits_for_the_group_with_state(void **state)
{
    (void)state;
    static uint64_t a0[512], b0[512], a1[512], b1[512];
    char job[64];
    snprintf(job, sizeof(job), "joinwait-%d", (int)getpid());
    graft_runtime_t *rt0 = elastic_rt(job, 0);
    rtf_register_ab(rt0, a0, b0, 512, 1, 2);
    graft_step_info_t info;
    bool apply = false;
    /* Group 0 trains alone for 3 steps. */
    for (int s = 0; s < 3; s++) {
        assert_int_equal(graft_quorum(rt0, &info), GRAFT_OK);
        assert_int_equal(graft_heal_wait(rt0), GRAFT_OK);
        assert_int_equal(graft_commit(rt0, &apply), GRAFT_OK);
        assert_true(apply);
        for (size_t i = 0; i < 512; i++)
            a0[i] += 10;
    }
    /* Group 1 joins while group 0 pauses (live, its lease kept, but in no
     * round): the first round forms with group 1 alone. */
    graft_runtime_t *rt1 = elastic_rt(job, 1);
    rtf_register_ab(rt1, a1, b1, 512, 5, 6);
    assert_int_equal(graft_quorum(rt1, &info), GRAFT_OK);
    assert_false(info.healing);
    assert_int_equal(info.step, 0);
    assert_int_equal(graft_commit(rt1, &apply), GRAFT_OK);
    assert_false(apply);
    assert_int_equal(graft_step(rt1), 0);
    /* Group 0 is back: the next round has both, group 1 heals from it. */
    peer_t p0 = {.rt = rt0}, p1 = {.rt = rt1};
    rtf_step_pair(&p0, &p1);
    assert_int_equal(p1.info.step, 3);
    assert_true(p1.info.healing);
    assert_int_equal(p1.heal_st, GRAFT_OK);
    assert_true(p0.apply && p1.apply);
    assert_memory_equal(a1, a0, sizeof(a0));
    assert_memory_equal(b1, b0, sizeof(b0));
    assert_int_equal(graft_step(rt1), 4);
    graft_destroy(rt1);
    graft_destroy(rt0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_joiner_waits_for_the_group_with_state),
    };
    if (getenv("TEST_FILTER") != NULL)
        cmocka_set_test_filter(getenv("TEST_FILTER"));
    return cmocka_run_group_tests(tests, rp_setup, rp_teardown);
}
