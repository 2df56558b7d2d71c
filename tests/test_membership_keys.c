/* The etcd key layout, without etcd: every builder of membership_keys.c
 * gives the spelling docs/KEYS.md documents, the public calls that hand a
 * job's keys to tools agree with it, and every key of membership's own
 * folders classifies back to the numbers it was built from. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdlib.h>
#include <string.h>

#include <graft/graft.h>

#include "membership/membership_internal.h"

#define P "/graft/job-1/"

typedef struct key_case {
    char *got;
    const char *want;
} key_case_t;

/* One row per builder, spelled out by hand from docs/KEYS.md. */
static void test_every_builder_spells_the_documented_key(void **state)
{
    (void)state;
    const uint64_t big = 12345678901234ull;
    key_case_t cases[] = {
        {graft__key_job_prefix("job-1"), P},
        {graft__key_member(P, 3, 1), P "members/3/1"},
        {graft__key_members_folder(P), P "members/"},
        {graft__key_spare(P, 1, 42), P "spares/1/00000000000000000042"},
        {graft__key_spares_folder(P), P "spares/"},
        {graft__key_ready(P, 7, 3, 1), P "ready/7/3/1"},
        {graft__key_ready_folder(P, 7), P "ready/7/"},
        {graft__key_quorum(P), P "quorum"},
        {graft__key_vote(P, 2, 17, 1), P "votes/2/17/1"},
        {graft__key_votes_round_folder(P, 2, 17), P "votes/2/17/"},
        {graft__key_votes_folder(P, 2), P "votes/2/"},
        {graft__key_blob(P, 7), P "blob/00000000000000000007"},
        {graft__key_pair(P, 9, 1, 4, 2), P "pairs/00000000000000000009/1/4/2"},
        {graft__key_event(P, 123), P "events/00000000000000000123"},
        {graft__key_event(P, UINT64_MAX), P "events/18446744073709551615"},
        {graft__key_events_folder(P), P "events/"},
        {graft__key_progress(P), P "progress"},
        {graft__key_group_progress(P, 5), P "group_progress/5"},
        {graft__key_group_progress_folder(P), P "group_progress/"},
        {graft__key_finished(P, 5), P "finished/5"},
        {graft__key_finished_folder(P), P "finished/"},
        {graft__key_secret(P), P "secret"},
        {graft__key_checkpoint(P, 16), P "checkpoints/00000000000000000016"},
        {graft__key_checkpoints_folder(P), P "checkpoints/"},
        {graft__key_ckpt_shard(P, big, 3), P "ckpt/00000012345678901234/shard/3"},
        {graft__key_ckpt_shards_folder(P, big), P "ckpt/00000012345678901234/shard/"},
        {graft__key_drift(P, 40, 1, 2), P "drift/00000000000000000040/1/2"},
        {graft__key_drift_rank_folder(P, 40, 1), P "drift/00000000000000000040/1/"},
        {graft__key_drift_folder(P), P "drift/"},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        assert_non_null(cases[i].got);
        assert_string_equal(cases[i].got, cases[i].want);
        graft_free(cases[i].got);
    }
}

/* The public calls tools use name the same keys. */
static void test_public_calls_agree(void **state)
{
    (void)state;
    char *prefix = NULL, *folder = NULL;
    assert_int_equal(graft_membership_job_prefix("job-1", &prefix), GRAFT_OK);
    assert_string_equal(prefix, P);
    assert_int_equal(graft_drift_key_folder("job-1", &folder), GRAFT_OK);
    assert_string_equal(folder, P "drift/");
    graft_free(prefix);
    graft_free(folder);
    assert_int_equal(graft_membership_job_prefix("", &prefix), GRAFT_EINVAL);
}

/* What a builder writes, the view's classification reads back. */
static void test_builders_classify_back(void **state)
{
    (void)state;
    struct {
        char *key;
        graft__mkey_kind_t kind;
        uint32_t group, rank;
        uint64_t number;
    } cases[] = {
        {graft__key_member(P, 3, 1), GRAFT__MKEY_MEMBER, 3, 1, 0},
        {graft__key_ready(P, 7, 3, 1), GRAFT__MKEY_READY, 3, 1, 7},
        {graft__key_vote(P, 2, 17, 1), GRAFT__MKEY_VOTE, 2, 1, 17},
        {graft__key_quorum(P), GRAFT__MKEY_QUORUM, 0, 0, 0},
        {graft__key_blob(P, 7), GRAFT__MKEY_BLOB, 0, 0, 7},
        {graft__key_event(P, 123), GRAFT__MKEY_EVENT, 0, 0, 123},
        /* A group's records a spare reads: the group in number. */
        {graft__key_group_progress(P, 5), GRAFT__MKEY_GROUP_PROGRESS, 0, 0, 5},
        {graft__key_finished(P, 5), GRAFT__MKEY_FINISHED, 0, 0, 5},
        /* Not membership's to interpret. */
        {graft__key_progress(P), GRAFT__MKEY_OTHER, 0, 0, 0},
        {graft__key_checkpoint(P, 5), GRAFT__MKEY_OTHER, 0, 0, 0},
        /* Under another job. */
        {graft__key_quorum("/graft/job-10/"), GRAFT__MKEY_OTHER, 0, 0, 0},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        assert_non_null(cases[i].key);
        graft__mkey_t k = graft__mship_key_parse(P, cases[i].key);
        assert_int_equal(k.kind, cases[i].kind);
        if (k.kind == GRAFT__MKEY_MEMBER || k.kind == GRAFT__MKEY_READY ||
            k.kind == GRAFT__MKEY_VOTE) {
            assert_int_equal(k.group, cases[i].group);
            assert_int_equal(k.rank, cases[i].rank);
        }
        if (k.kind != GRAFT__MKEY_OTHER && k.kind != GRAFT__MKEY_QUORUM &&
            k.kind != GRAFT__MKEY_MEMBER)
            assert_int_equal(k.number, cases[i].number);
        graft_free(cases[i].key);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_every_builder_spells_the_documented_key),
        cmocka_unit_test(test_public_calls_agree),
        cmocka_unit_test(test_builders_classify_back),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
