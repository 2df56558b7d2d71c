/*
 * A clean end that a job of several groups can take (docs/RUNTIME.md, "A
 * clean end: the closing step"): a strict job of 3 groups x 2 ranks (six
 * runtimes on threads of this process, each with its own transfer endpoint
 * and etcd clients) against a real etcd, with a persistent tier whose
 * schedule is never due. After STEPS steps each group opens its closing
 * step (graft_finish()) at its own time: one ends and destroys its runtime
 * at once, one commits its closing step well after the others, and in the
 * second test the group that writes the final checkpoint has its first
 * closing commit fail (a veto, as a failed cross-group collective makes
 * it), so it must open the step again after the two others have ended and
 * left. Every group ends within a few seconds (before the fix, a group
 * whose closing commit failed waited quorum_timeout_ms for a round with
 * the groups that had left, and failed), and one final checkpoint is on
 * disk, written by one group, and verifies.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <graft/graft.h>
#include <graft/persist.h>

#include "etcd_fixture.h"
#include "runtime_fixture.h"
#include "persist_fixture.h"

#define GROUPS 3
#define RANKS 2
#define STEPS 4
#define WORDS 64
#define QUORUM_TIMEOUT_MS 20000
#define SECRET "a-clean-end-test-secret-0123456789"

typedef struct trainer {
    graft_runtime_t *rt;
    int group, rank;
    uint64_t w[WORDS];
    uint32_t late_ms;     /* sleep this long inside the first closing step */
    bool veto_first;      /* veto the first closing commit */
    bool destroy_at_once; /* graft_destroy() as soon as the trainer ends */
    graft_status_t st;    /* the first error */
    const char *where;
    int closings;         /* closing steps opened */
    bool finished;        /* graft_finished() at the end */
    uint64_t end_step;
    uint64_t ended_ns;    /* when the trainer's loop ended */
    graft_metrics_t m;
} trainer_t;

static uint64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static graft_runtime_t *make_rt(const char *job, int group, int rank, const char *root)
{
    graft_config_t *c = NULL;
    graft_runtime_t *rt = NULL;
    char g[16], r[16], qt[16];
    snprintf(g, sizeof(g), "%d", group);
    snprintf(r, sizeof(r), "%d", rank);
    snprintf(qt, sizeof(qt), "%d", QUORUM_TIMEOUT_MS);
    assert_int_equal(setenv("GRAFT_JOB_SECRET", SECRET, 1), 0);
    assert_int_equal(graft_config_create(&c), GRAFT_OK);
    const char *set[][2] = {
        {"job", job},
        {"groups", "3"},
        {"group", g},
        {"rank", r},
        {"ranks_per_group", "2"},
        {"etcd_endpoints", graft_etcd_server_endpoint(rtf_etcd.server)},
        {"lease_ttl_ms", "2000"},
        {"join_timeout_ms", "1000"},
        {"fence_timeout_ms", "5000"},
        {"quorum_timeout_ms", qt},
        {"persist_root", root},
        {"persist_every", "1000"},
    };
    rtf_config_set_all(c, set, sizeof(set) / sizeof(set[0]));
    assert_int_equal(graft_init(c, &rt), GRAFT_OK);
    graft_config_destroy(c);
    return rt;
}

#define FAIL_AT(t, call)                                                                       \
    do {                                                                                       \
        graft_status_t s_ = (call);                                                            \
        if (s_ != GRAFT_OK) {                                                                  \
            (t)->st = s_;                                                                      \
            (t)->where = #call;                                                                \
            goto out;                                                                          \
        }                                                                                      \
    } while (0)

/* The closing step: graft_finish() between the quorum and the commit, and
 * the step opened again until this group commits it. */
static bool closing_step(trainer_t *t)
{
    bool apply = true;
    if (t->closings++ == 0 && t->late_ms > 0)
        usleep(t->late_ms * 1000u);
    if (graft_finish(t->rt) != GRAFT_OK)
        return false;
    if (t->closings == 1 && t->veto_first && graft_commit_veto(t->rt) != GRAFT_OK)
        return false;
    if (graft_commit(t->rt, &apply) != GRAFT_OK || apply)
        return false;
    return true;
}

static void *train(void *arg)
{
    trainer_t *t = arg;
    graft_step_info_t info;
    bool apply = false;
    FAIL_AT(t, graft_quorum(t->rt, &info));
    for (;;) {
        FAIL_AT(t, graft_heal_wait(t->rt));
        if (info.step >= STEPS) {
            if (!closing_step(t)) {
                t->st = GRAFT_EINVAL;
                t->where = "the closing step";
                goto out;
            }
            if (graft_finished(t->rt))
                break;
            if (t->closings > 5) {
                t->st = GRAFT_ETIMEOUT;
                t->where = "5 closing steps that did not commit";
                goto out;
            }
        } else {
            FAIL_AT(t, graft_commit(t->rt, &apply));
            if (apply)
                t->w[0]++; /* the optimizer step: w[0] counts the steps applied */
        }
        FAIL_AT(t, graft_quorum(t->rt, &info));
    }
out:
    t->finished = graft_finished(t->rt);
    t->end_step = graft_step(t->rt);
    if (graft_checkpoint_wait(t->rt) != GRAFT_OK && t->st == GRAFT_OK) {
        t->st = GRAFT_EIO;
        t->where = "graft_checkpoint_wait";
    }
    graft_metrics_get(t->rt, &t->m);
    t->ended_ns = now_ns();
    if (t->destroy_at_once) {
        graft_destroy(t->rt);
        t->rt = NULL;
    }
    return NULL;
}

static void run_job(const char *job, const char *root, trainer_t t[GROUPS * RANKS])
{
    pthread_t th[GROUPS * RANKS];
    for (int i = 0; i < GROUPS * RANKS; i++) {
        t[i].group = i / RANKS;
        t[i].rank = i % RANKS;
        t[i].rt = make_rt(job, t[i].group, t[i].rank, root);
        for (size_t k = 0; k < WORDS; k++)
            t[i].w[k] = k == 0 ? 0 : k + 1000u * (uint64_t)t[i].rank;
        graft_region_t r = {"w", GRAFT_REGION_PARAM, 0, GRAFT_DEVICE_HOST, t[i].w,
                            sizeof(t[i].w), 0, 0};
        assert_int_equal(graft_region_register(t[i].rt, &r), GRAFT_OK);
    }
    for (int i = 0; i < GROUPS * RANKS; i++)
        assert_int_equal(pthread_create(&th[i], NULL, train, &t[i]), 0);
    for (int i = 0; i < GROUPS * RANKS; i++)
        assert_int_equal(pthread_join(th[i], NULL), 0);
    for (int i = 0; i < GROUPS * RANKS; i++) {
        graft_destroy(t[i].rt);
        t[i].rt = NULL;
    }
}

/* Every rank ended its closing step, the slowest within a few seconds of
 * the first, and the one final checkpoint (written once: two shards and
 * one manifest over all six runtimes) verifies. */
static void check_end(trainer_t t[GROUPS * RANKS], const char *root)
{
    uint64_t first = UINT64_MAX, last = 0, shards = 0, manifests = 0;
    for (int i = 0; i < GROUPS * RANKS; i++) {
        if (t[i].st != GRAFT_OK)
            fail_msg("group %d rank %d: %s: %s", t[i].group, t[i].rank, t[i].where,
                     graft_status_string(t[i].st));
        assert_true(t[i].finished);
        assert_int_equal(t[i].end_step, STEPS);
        assert_int_equal(t[i].w[0], STEPS);
        first = t[i].ended_ns < first ? t[i].ended_ns : first;
        last = t[i].ended_ns > last ? t[i].ended_ns : last;
        shards += t[i].m.checkpoints_written;
        manifests += t[i].m.checkpoints_committed;
        assert_int_equal(t[i].m.checkpoints_failed, 0);
    }
    if (last - first > 8000000000ull)
        fail_msg("the groups ended %.1f s apart", (double)(last - first) / 1e9);
    assert_int_equal(shards, RANKS);
    assert_int_equal(manifests, 1);
    graft_persist_entry_t *e = NULL;
    size_t n = 0;
    assert_int_equal(graft_persist_list(root, &e, &n), GRAFT_OK);
    assert_int_equal(n, 1);
    assert_int_equal(e[0].step, STEPS);
    graft_free(e);
    assert_int_equal(graft_persist_verify(root, STEPS, GRAFT_PERSIST_VERIFY_FULL, NULL),
                     GRAFT_OK);
}

/* Group 2 ends and destroys its runtimes as soon as its closing step
 * commits; group 1 commits its closing step 1.5 s after the others. */
static void test_groups_end_at_different_times(void **state)
{
    (void)state;
    char *root = pt_tmpdir();
    static trainer_t t[GROUPS * RANKS];
    memset(t, 0, sizeof(t));
    for (int r = 0; r < RANKS; r++) {
        t[1 * RANKS + r].late_ms = 1500;
        t[2 * RANKS + r].destroy_at_once = true;
    }
    run_job("finish-times", root, t);
    check_end(t, root);
    for (int i = 0; i < GROUPS * RANKS; i++)
        assert_int_equal(t[i].closings, 1);
    pt_rmtree(root);
}

/* The same, and group 0 (the writer of the final checkpoint in the closing
 * quorum of all three) has its first closing commit fail: it opens the
 * step again after groups 1 and 2 ended and left, in a round that counts
 * them as finished instead of waiting for them, and writes the final
 * checkpoint then. */
static void test_failed_closing_commit_ends(void **state)
{
    (void)state;
    char *root = pt_tmpdir();
    static trainer_t t[GROUPS * RANKS];
    memset(t, 0, sizeof(t));
    for (int r = 0; r < RANKS; r++) {
        t[0 * RANKS + r].veto_first = true;
        t[1 * RANKS + r].late_ms = 1500;
        t[2 * RANKS + r].destroy_at_once = true;
    }
    uint64_t t0 = now_ns();
    run_job("finish-veto", root, t);
    check_end(t, root);
    for (int r = 0; r < RANKS; r++) {
        assert_int_equal(t[0 * RANKS + r].closings, 2);
        /* the final checkpoint is group 0's: each of its ranks wrote a shard */
        assert_int_equal(t[0 * RANKS + r].m.checkpoints_written, 1);
    }
    /* Far below the quorum timeout a round with the groups that left
     * would have waited for. */
    uint64_t took = now_ns() - t0;
    if (took > (uint64_t)QUORUM_TIMEOUT_MS * 1000000ull / 2)
        fail_msg("the job took %.1f s", (double)took / 1e9);
    pt_rmtree(root);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_groups_end_at_different_times),
        cmocka_unit_test(test_failed_closing_commit_ends),
    };
    if (getenv("TEST_FILTER") != NULL)
        cmocka_set_test_filter(getenv("TEST_FILTER"));
    return cmocka_run_group_tests(tests, rtf_etcd_setup, rtf_etcd_teardown);
}
