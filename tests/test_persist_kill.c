/*
 * kill -9 during a checkpoint. A child process writes one checkpoint and is
 * SIGKILLed either at a seeded point of the durable-write sequence (the
 * library's crash hook: after a header, a chunk batch, the index, the
 * fsync, the rename, each manifest file) or after a seeded delay. After
 * every kill: no checkpoint lists as complete yet fails to verify or
 * restore; the newest complete one restores with exactly its data; the
 * baseline checkpoint written before all of this always restores; a child
 * that was not killed left a complete checkpoint.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "persist/persist_internal.h"
#include "tests/test_persist_util.h"

#define KILL_RUNS 90
/* crash points of one checkpoint below (2 shards of ~8 chunks, 2 threads) */
#define CRASH_POINTS 22

static graft_status_t write_step(const char *root, uint64_t step)
{
    pt_global_t *g = pt_global_new(step);
    pt_layout_t *lay = pt_global_split(g, 2);
    graft_persist_config_t cfg = {.root = root, .compression_level = 1, .chunk_bytes = 16384,
                                  .threads = 2};
    graft_persist_writer_t *w;
    graft_status_t st = graft_persist_writer_create(&cfg, &w);
    if (st == GRAFT_OK) {
        st = graft_persist_save(w, step, 2, (const graft_persist_region_t *const *)lay->regions,
                                lay->nregions, NULL);
        if (st == GRAFT_OK)
            st = graft_persist_wait(w, step, NULL);
        graft_persist_writer_destroy(w);
    }
    pt_layout_free(lay);
    pt_global_free(g);
    return st;
}

static void restore_check(const char *root, uint64_t step, uint64_t expect_step)
{
    pt_global_t *want = pt_global_new(expect_step);
    pt_global_t *got = pt_global_clone_empty(want);
    pt_layout_t *lay = pt_global_split(got, 3); /* and reshard while at it */
    for (uint32_t r = 0; r < 3; r++) {
        graft_persist_restore_params_t p = {.rank = r, .ranks = 3, .regions = lay->regions[r],
                                            .nregions = lay->nregions[r], .step = step};
        graft_persist_restore_result_t rr;
        graft_status_t st = graft_persist_restore(root, &p, &rr);
        if (st != GRAFT_OK)
            fail_msg("restore of step %llu failed: %s", (unsigned long long)step,
                     graft_status_name(st));
        assert_int_equal(rr.step, expect_step);
    }
    assert_true(pt_global_equal(want, got));
    pt_layout_free(lay);
    pt_global_free(got);
    pt_global_free(want);
}

static void test_kill_during_checkpoint(void **state)
{
    (void)state;
    graft_log_level_set(GRAFT_LOG_OFF);
    char *root = pt_tmpdir();
    assert_int_equal(write_step(root, 1), GRAFT_OK);
    uint64_t rng = 20261122;
    int killed = 0, finished = 0;
    for (int i = 0; i < KILL_RUNS; i++) {
        uint64_t step = (uint64_t)i + 2;
        bool by_point = i % 3 != 0; /* 60 at crash points, 30 after a delay */
        int countdown = 1 + (int)(pt_rand(&rng) % CRASH_POINTS);
        long delay_us = (long)(pt_rand(&rng) % 15000);
        pid_t pid = fork();
        assert_true(pid >= 0);
        if (pid == 0) {
            if (by_point)
                graft__persist_crash_countdown = countdown;
            _exit(write_step(root, step) == GRAFT_OK ? 0 : 1);
        }
        if (!by_point) {
            struct timespec ts = {0, delay_us * 1000};
            nanosleep(&ts, NULL);
            kill(pid, SIGKILL);
        }
        int status;
        assert_int_equal(waitpid(pid, &status, 0), pid);
        bool was_killed = WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL;
        if (by_point && !was_killed)
            fail_msg("run %d: crash point %d was never reached", i, countdown);
        if (was_killed)
            killed++;
        else {
            assert_true(WIFEXITED(status));
            assert_int_equal(WEXITSTATUS(status), 0);
            finished++;
        }

        graft_persist_entry_t *e;
        size_t n;
        assert_int_equal(graft_persist_list(root, &e, &n), GRAFT_OK);
        uint64_t newest = 0;
        for (size_t k = 0; k < n; k++) {
            if (e[k].state == GRAFT_PERSIST_CORRUPT)
                fail_msg("run %d: step %llu lists as corrupt: %s", i,
                         (unsigned long long)e[k].step, e[k].reason);
            if (e[k].state == GRAFT_PERSIST_COMPLETE && newest == 0)
                newest = e[k].step;
            if (e[k].step == step) {
                if (!was_killed)
                    assert_int_equal(e[k].state, GRAFT_PERSIST_COMPLETE);
                if (e[k].state == GRAFT_PERSIST_COMPLETE)
                    assert_int_equal(graft_persist_verify(root, step, GRAFT_PERSIST_VERIFY_FULL, NULL),
                                     GRAFT_OK);
            }
        }
        graft_free(e);
        assert_true(newest >= 1);
        /* The newest that lists as complete is what a restore brings back. */
        restore_check(root, 0, newest);
        if (i % 10 == 9)
            restore_check(root, 1, 1);
    }
    fprintf(stderr, "# %d runs killed mid-checkpoint, %d finished\n", killed, finished);
    assert_true(killed >= 50);
    restore_check(root, 1, 1);
    /* Retention cleans up what the kills left behind. */
    graft_persist_retention_t pol = {.keep_last = 1};
    size_t deleted;
    assert_int_equal(graft_persist_retention_apply(root, &pol, &deleted), GRAFT_OK);
    graft_persist_entry_t *e;
    size_t n;
    assert_int_equal(graft_persist_list(root, &e, &n), GRAFT_OK);
    /* one complete checkpoint; only leftovers newer than it may stay */
    size_t complete = 0;
    uint64_t kept = 0;
    for (size_t k = 0; k < n; k++)
        if (e[k].state == GRAFT_PERSIST_COMPLETE) {
            complete++;
            kept = e[k].step;
        }
    assert_int_equal(complete, 1);
    for (size_t k = 0; k < n; k++)
        assert_true(e[k].state == GRAFT_PERSIST_COMPLETE || e[k].step > kept);
    graft_free(e);
    pt_rmtree(root);
    graft_log_level_set(GRAFT_LOG_WARN);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_kill_during_checkpoint),
    };
    return cmocka_run_group_tests_name("persist_kill", tests, NULL, NULL);
}
