/*
 * The final checkpoint at a clean end (persist_final, graft_finish()): a
 * 2-group strict job of two runtimes in this process, against a real etcd,
 * with persist_every larger than its step count, so no scheduled checkpoint
 * is ever due. Each group trains STEPS steps, then opens one more step only
 * to end: graft_finish() between its quorum and its commit. With
 * persist_final on (the default) the checkpoint of step STEPS is on disk
 * when graft_commit() returns, it verifies, `graftctl ckpt ls` lists it,
 * and a restarted job restores it; with persist_final 0 nothing is written.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <limits.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <graft/graft.h>
#include <graft/persist.h>

#include "etcd_fixture.h"
#include "runtime_fixture.h"

#define STEPS 6
#define WORDS 64
#define SECRET "a-final-checkpoint-test-secret-0123"

/* One group's trainer on a thread of its own (cmocka's assertions belong
 * to the main thread: it records what happened instead). */
typedef struct trainer {
    graft_runtime_t *rt;
    uint64_t w[WORDS];
    bool finish;           /* end with a step marked by graft_finish() */
    int steps;             /* steps to train (0: only the first quorum) */
    graft_status_t st;     /* the first error */
    const char *where;     /* and the call that returned it */
    graft_start_kind_t start;
    uint64_t first_step;   /* the first quorum's step */
    bool final_apply;      /* graft_commit()'s apply at the final step */
    uint64_t end_step;     /* graft_step() at the end */
} trainer_t;

static graft_runtime_t *make_rt(const char *job, int group, const char *root, const char *final)
{
    graft_config_t *c = NULL;
    graft_runtime_t *rt = NULL;
    char g[16];
    snprintf(g, sizeof(g), "%d", group);
    assert_int_equal(setenv("GRAFT_JOB_SECRET", SECRET, 1), 0);
    assert_int_equal(graft_config_create(&c), GRAFT_OK);
    const char *set[][2] = {
        {"job", job},
        {"groups", "2"},
        {"group", g},
        {"etcd_endpoints", graft_etcd_server_endpoint(rtf_etcd.server)},
        {"lease_ttl_ms", "2000"},
        {"join_timeout_ms", "1000"},
        {"fence_timeout_ms", "5000"},
        {"quorum_timeout_ms", "30000"},
        {"persist_root", root},
        {"persist_every", "1000"},
        {"persist_final", final},
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
            return NULL;                                                                       \
        }                                                                                      \
    } while (0)

static void *train(void *arg)
{
    trainer_t *t = arg;
    graft_step_info_t info;
    bool apply = false;
    FAIL_AT(t, graft_quorum(t->rt, &info));
    t->start = graft_start_kind(t->rt);
    t->first_step = info.step;
    for (;;) {
        FAIL_AT(t, graft_heal_wait(t->rt));
        bool last = info.step >= (uint64_t)t->steps;
        if (last && t->finish)
            FAIL_AT(t, graft_finish(t->rt));
        FAIL_AT(t, graft_commit(t->rt, &apply));
        if (last) {
            t->final_apply = apply;
            break;
        }
        if (apply)
            t->w[0]++; /* the optimizer step: w[0] counts the steps applied */
        FAIL_AT(t, graft_quorum(t->rt, &info));
    }
    t->end_step = graft_step(t->rt);
    return NULL;
}

/* Both groups of `job` train to `steps` (the second group's runtime on a
 * thread), each ending with a final step (graft_finish() when `finish`). */
static void run_job(const char *job, const char *root, const char *final, int steps,
                    bool finish, trainer_t t[2])
{
    memset(t, 0, 2 * sizeof(*t));
    for (int g = 0; g < 2; g++) {
        t[g].rt = make_rt(job, g, root, final);
        t[g].finish = finish;
        t[g].steps = steps;
        for (size_t i = 0; i < WORDS; i++)
            t[g].w[i] = i;
        graft_region_t r = {"w", GRAFT_REGION_PARAM, 0, GRAFT_DEVICE_HOST, t[g].w,
                            sizeof(t[g].w), 0, 0};
        assert_int_equal(graft_region_register(t[g].rt, &r), GRAFT_OK);
    }
    pthread_t th;
    assert_int_equal(pthread_create(&th, NULL, train, &t[1]), 0);
    train(&t[0]);
    assert_int_equal(pthread_join(th, NULL), 0);
    for (int g = 0; g < 2; g++) {
        if (t[g].st != GRAFT_OK)
            fail_msg("group %d: %s: %s", g, t[g].where, graft_status_string(t[g].st));
        graft_destroy(t[g].rt);
    }
}

static size_t checkpoints(const char *root, uint64_t *newest_p)
{
    graft_persist_entry_t *e = NULL;
    size_t n = 0;
    assert_int_equal(graft_persist_list(root, &e, &n), GRAFT_OK);
    *newest_p = n > 0 ? e[0].step : 0;
    graft_free(e);
    return n;
}

static void rm_rf(const char *dir)
{
    char cmd[PATH_MAX + 16];
    snprintf(cmd, sizeof(cmd), "rm -rf '%s'", dir);
    assert_int_equal(system(cmd), 0);
}

/* `graftctl ckpt ls ROOT`'s output. */
static char *ckpt_ls(const char *root)
{
    char self[PATH_MAX], cmd[3 * PATH_MAX];
    ssize_t n = readlink("/proc/self/exe", self, sizeof(self) - 1);
    assert_true(n > 0);
    self[n] = '\0';
    *strrchr(self, '/') = '\0'; /* BUILD/tests -> BUILD/bin/graftctl */
    snprintf(cmd, sizeof(cmd), "'%s/../bin/graftctl' ckpt ls '%s' 2>&1", self, root);
    FILE *f = popen(cmd, "r");
    assert_non_null(f);
    static char out[8192];
    size_t got = fread(out, 1, sizeof(out) - 1, f);
    out[got] = '\0';
    int rc = pclose(f);
    if (rc != 0)
        fail_msg("%s: exit %d: %s", cmd, rc, out);
    return out;
}

static void test_final_checkpoint_at_clean_end(void **state)
{
    (void)state;
    char root[] = "/tmp/graft-final.XXXXXX";
    assert_non_null(mkdtemp(root));
    trainer_t t[2];
    run_job("final-on", root, NULL, STEPS, true, t);
    for (int g = 0; g < 2; g++) {
        assert_false(t[g].final_apply);          /* the final step is not applied */
        assert_int_equal(t[g].end_step, STEPS);  /* the committed step is its state's */
        assert_int_equal(t[g].w[0], STEPS);
    }
    /* Durable when graft_commit() returned, and graft_destroy() waited for
     * nothing more: the one checkpoint is the final step's. */
    uint64_t newest = 0;
    assert_int_equal(checkpoints(root, &newest), 1);
    assert_int_equal(newest, STEPS);
    assert_int_equal(graft_persist_verify(root, STEPS, GRAFT_PERSIST_VERIFY_FULL, NULL),
                     GRAFT_OK);
    char *ls = ckpt_ls(root);
    char want[32];
    snprintf(want, sizeof(want), "%d", STEPS);
    if (strstr(ls, want) == NULL || strstr(ls, "complete") == NULL)
        fail_msg("graftctl ckpt ls does not show step %d complete:\n%s", STEPS, ls);

    /* A restarted job restores it: the final state, not a step behind. */
    run_job("final-on-restart", root, NULL, 0, false, t);
    for (int g = 0; g < 2; g++) {
        assert_int_equal(t[g].start, GRAFT_START_RESTORE);
        assert_int_equal(t[g].first_step, STEPS);
        assert_int_equal(t[g].w[0], STEPS);
        assert_int_equal(t[g].w[WORDS - 1], WORDS - 1);
    }
    rm_rf(root);
}

/* persist_final 0: the same end writes nothing. And without graft_finish()
 * (a trainer that ends after its last commit) nothing either: the runtime
 * cannot know the regions hold one step's state outside a step. */
static void test_final_checkpoint_off(void **state)
{
    (void)state;
    char root[] = "/tmp/graft-final-off.XXXXXX";
    assert_non_null(mkdtemp(root));
    trainer_t t[2];
    uint64_t newest = 0;
    run_job("final-off", root, "0", STEPS, true, t);
    for (int g = 0; g < 2; g++) {
        assert_false(t[g].final_apply);
        assert_int_equal(t[g].end_step, STEPS);
    }
    assert_int_equal(checkpoints(root, &newest), 0);

    run_job("final-not-asked", root, NULL, STEPS, false, t);
    for (int g = 0; g < 2; g++)
        assert_true(t[g].final_apply); /* an ordinary commit */
    assert_int_equal(checkpoints(root, &newest), 0);
    rm_rf(root);
}

static void test_finish_misuse(void **state)
{
    (void)state;
    assert_int_equal(graft_finish(NULL), GRAFT_EINVAL);
    char root[] = "/tmp/graft-final-misuse.XXXXXX";
    assert_non_null(mkdtemp(root));
    graft_runtime_t *rt = make_rt("final-misuse", 0, root, NULL);
    assert_int_equal(graft_finish(rt), GRAFT_ESTATE); /* no step open */
    graft_destroy(rt);
    graft_config_t *c = NULL;
    char *err = NULL;
    assert_int_equal(graft_config_create(&c), GRAFT_OK);
    assert_int_equal(graft_config_set(c, "persist_final", "2", &err), GRAFT_EINVAL);
    assert_non_null(err);
    assert_non_null(strstr(err, "persist_final"));
    graft_free(err);
    graft_config_destroy(c);
    rm_rf(root);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_final_checkpoint_at_clean_end),
        cmocka_unit_test(test_final_checkpoint_off),
        cmocka_unit_test(test_finish_misuse),
    };
    if (getenv("TEST_FILTER") != NULL)
        cmocka_set_test_filter(getenv("TEST_FILTER"));
    return cmocka_run_group_tests(tests, rtf_etcd_setup, rtf_etcd_teardown);
}
