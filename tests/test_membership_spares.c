/* Spares against keys someone else wrote, with a real etcd: records under
 * spares/ that do not decode, and group_progress/ or finished/ keys whose
 * group number does not parse or lies past the job's groups. None of them
 * is a spare, a group to fill, or a group that finished. The fixture is
 * tests/support/membership_fixture.h. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <string.h>

#include <graft/membership.h>

#include "etcd_fixture.h"
#include "membership_fixture.h"

/* Put `value` at /graft/<job>/<rest>. */
static void put_raw(const char *job, const char *rest, const char *value)
{
    char key[256];
    snprintf(key, sizeof(key), "/graft/%s/%s", job, rest);
    assert_int_equal(
        graft_etcd_put(mf_etcd.client, key, (const uint8_t *)value, strlen(value), 0, NULL, NULL),
        GRAFT_OK);
}

/* A spare of rank 0 of a job of `groups` groups of one rank. */
static graft_membership_spare_t *spare_of(const char *job, uint32_t groups)
{
    graft_membership_config_t c = mf_cfg_for(job, 0, 0, 1);
    graft_membership_spare_t *sp = NULL;
    assert_int_equal(graft_membership_spare_create(&c, groups, &sp), GRAFT_OK);
    return sp;
}

static void test_undecodable_spare_records_are_skipped(void **state)
{
    (void)state;
    const char *job = "spares-garbage-records";
    put_raw(job, "spares/0/00000000000000000001", "not a MemberRecord");
    put_raw(job, "spares/0/00000000000000000002", "");
    put_raw(job, "spares/junk", "\x08\xff\xff\xff\xff\xff\xff\xff\xff\xff\x01");
    graft_membership_spare_t *sp = spare_of(job, 2);
    graft_membership_t *obs = mf_observe(job, 1);
    graft_member_t *list = NULL;
    size_t n = 0;
    assert_int_equal(graft_membership_spares_list(obs, &list, &n), GRAFT_OK);
    assert_int_equal(n, 1); /* only the spare that registered */
    assert_int_equal(list[0].group, UINT32_MAX);
    assert_int_equal(list[0].rank, 0);
    graft_membership_spares_free(list, n);
    graft_membership_destroy(obs);
    graft_membership_spare_destroy(sp);
}

/* Keys of groups that do not parse or are not the job's: a spare fills
 * none of them, and does not read them as the job's end. */
static void put_hostile_group_keys(const char *job)
{
    static const char *const rests[] = {
        "group_progress/abc", "group_progress/1x", "group_progress/", "group_progress/-1",
        "group_progress/99", "group_progress/4294967296", "finished/abc", "finished/-0x1",
        "finished/2", "finished/18446744073709551616", "finished/ 1",
    };
    for (size_t i = 0; i < sizeof(rests) / sizeof(rests[0]); i++)
        put_raw(job, rests[i], "x");
}

/* Group 0 of a job of two single-rank groups alive, and a spare of rank
 * 0 waiting up to timeout_ms: what its wait returned. */
static graft_status_t spare_beside_group0(const char *job, uint32_t timeout_ms,
                                          uint32_t *group_p)
{
    graft_membership_t *g0 = mf_join(job, 0, 0, 1);
    graft_membership_spare_t *sp = spare_of(job, 2);
    graft_status_t st = graft_membership_spare_wait(sp, timeout_ms, group_p);
    graft_membership_spare_destroy(sp);
    graft_membership_destroy(g0);
    return st;
}

static void test_unparsable_group_keys_fill_nothing(void **state)
{
    (void)state;
    const char *job = "spares-garbage-groups";
    put_hostile_group_keys(job);
    uint32_t group = 7;
    /* No slot it may fill (group 1 never had a member), and the job has
     * not ended: it keeps waiting. */
    assert_int_equal(spare_beside_group0(job, 1500, &group), GRAFT_ETIMEOUT);
    assert_int_equal(group, 7);
}

static void test_valid_group_filled_beside_garbage(void **state)
{
    (void)state;
    const char *job = "spares-garbage-beside";
    put_hostile_group_keys(job);
    put_raw(job, "group_progress/1", "x"); /* group 1 trained, then died */
    uint32_t group = 7;
    assert_int_equal(spare_beside_group0(job, 5000, &group), GRAFT_OK);
    assert_int_equal(group, 1);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_undecodable_spare_records_are_skipped),
        cmocka_unit_test(test_unparsable_group_keys_fill_nothing),
        cmocka_unit_test(test_valid_group_filled_beside_garbage),
    };
    return cmocka_run_group_tests_name("membership_spares", tests, mf_group_setup,
                                       mf_group_teardown);
}
