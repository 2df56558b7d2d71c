/*
 * Hostile inputs to the decoders of outside bytes, one test per finding
 * (from the libFuzzer harnesses under fuzz/ or from review), kept as
 * regression tests. Each test names what went wrong before the fix.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "membership/membership_internal.h"

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

/*
 * A quorum record the size etcd accepts (1.5 MiB) with 5000 members, 4999
 * recoveries and the one remaining member repeated as donor about 700000
 * times. Checking it compared every donor with every member and every
 * recipient, about 10^10 steps: a rank reading the record spent tens of
 * seconds in the decoder (2.5 s on an idle machine, more under load or a
 * sanitizer). The check is now O(n log n) in the record's size and the
 * record is decoded (it is consistent: duplicated donors are harmless) in
 * about 10 ms; the bound below leaves fifty times that.
 */
static void test_quorum_record_check_is_not_quadratic(void **state)
{
    (void)state;
    enum { MEMBERS = 5000, DONORS_EACH = 140 };
    uint32_t *members = malloc(MEMBERS * sizeof(*members));
    uint32_t *donors = malloc(DONORS_EACH * sizeof(*donors));
    graft_recovery_t *rec = calloc(MEMBERS - 1, sizeof(*rec));
    assert_true(members != NULL && donors != NULL && rec != NULL);
    for (uint32_t i = 0; i < MEMBERS; i++)
        members[i] = i;
    /* The last member, the only one that is not a recipient, is the worst
     * case for a linear search. */
    for (uint32_t i = 0; i < DONORS_EACH; i++)
        donors[i] = MEMBERS - 1;
    for (uint32_t i = 0; i < MEMBERS - 1; i++) {
        rec[i].recipient = i;
        rec[i].donors = donors;
        rec[i].n_donors = DONORS_EACH;
    }
    graft_quorum_t q = {.id = 1, .round = 1, .members = members, .n_members = MEMBERS,
                        .recoveries = rec, .n_recoveries = MEMBERS - 1};
    uint8_t *buf = NULL;
    size_t len = 0;
    assert_int_equal(graft__mship_quorum_encode(&q, &buf, &len), GRAFT_OK);
    assert_true(len <= 1572864);

    graft_quorum_t *got = NULL;
    double t0 = now_s();
    assert_int_equal(graft__mship_quorum_decode(buf, len, &got), GRAFT_OK);
    double took = now_s() - t0;
    assert_int_equal(got->n_recoveries, MEMBERS - 1);
    assert_int_equal(got->recoveries[MEMBERS - 2].donors[DONORS_EACH - 1], MEMBERS - 1);
    graft_membership_quorum_free(got);
    if (took > 0.5)
        fail_msg("decoding a %zu-byte quorum record took %.1f s", len, took);

    /* The same record with one donor that is also a recipient is refused. */
    donors[DONORS_EACH - 1] = MEMBERS - 2;
    graft_free(buf);
    assert_int_equal(graft__mship_quorum_encode(&q, &buf, &len), GRAFT_OK);
    t0 = now_s();
    assert_int_equal(graft__mship_quorum_decode(buf, len, &got), GRAFT_EMALFORMED);
    took = now_s() - t0;
    if (took > 0.5)
        fail_msg("refusing a %zu-byte quorum record took %.1f s", len, took);
    graft_free(buf);
    free(rec);
    free(donors);
    free(members);
}

int main(void)
{
    graft_log_level_set(GRAFT_LOG_OFF);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_quorum_record_check_is_not_quadratic),
    };
    if (getenv("TEST_FILTER") != NULL)
        cmocka_set_test_filter(getenv("TEST_FILTER"));
    return cmocka_run_group_tests(tests, NULL, NULL);
}
