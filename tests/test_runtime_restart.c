/*
 * In-place restart end to end (docs/RUNTIME.md, "In-place restart"): real
 * etcd, real UCX on loopback, a job of examples/train_mlp (3 groups x 2
 * ranks) as real processes. A rank whose communication failed but whose
 * process survived calls graft_restart() (train_mlp --restart-at N: once
 * step N's quorum returned, instead of voting): its transfer endpoint and
 * membership are torn down and made anew, the process stays, the step it
 * abandoned is not committed by its group, and it rejoins as a new
 * incarnation. The job ends bit-identical to the fault-free run with no
 * process started after the start.
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
#include <unistd.h>

#include <graft/graft.h>

#include "runtime_procs.h"

#define STEPS 30

static void run_restart(const char *name, const char *steady_path)
{
    job_t j;
    char env[64];
    rp_job_init(&j, name);
    snprintf(env, sizeof(env), "GRAFT_STEADY_PATH=%s", steady_path);
    j.extra_env[0] = env;
    j.capture_err = true;
    const char *flags[] = {"--steps", "30", "--step-delay-ms", "20", NULL};
    const char *restart[] = {"--steps", "30", "--step-delay-ms", "20", "--restart-at", "8", NULL};
    for (int g = 0; g < G; g++)
        for (int r = 0; r < R; r++)
            rp_spawn(&j, g, r, g == 1 && r == 1 ? restart : flags);
    rp_wait_all(&j, 120);
    proc_t *p = &j.p[1 * R + 1];
    if (!rp_file_contains(p->err, "restarted in place at step 8")) {
        rp_print_err_tail(p);
        fail_msg("group 1 rank 1 did not restart in place at step 8");
    }
    assert_int_equal(j.n, G * R); /* no process was started again */
    int recovered = rp_check_final(&j, STEPS);
    assert_int_equal(recovered, 0); /* every process started cold: none was replaced */
    rp_check_logs(&j, STEPS);
    /* Its group did not commit step 8 (the restarted rank never voted):
     * the others did, and the group pulled their step 9 (no commit of it
     * in its log) before it went on; each step logged once, in order. */
    FILE *f = fopen(p->log, "r");
    assert_non_null(f);
    unsigned s, prev = 0;
    bool skipped = false;
    char h[17];
    while (fscanf(f, "%u %16s", &s, h) == 2) {
        assert_true(s > prev);
        skipped = skipped || (s > prev + 1 && prev >= 8);
        prev = s;
    }
    fclose(f);
    assert_int_equal(prev, STEPS);
    assert_true(skipped);
    uint64_t step, recoveries;
    char hash[17], start[16];
    rp_read_final(p, &step, hash, start, &recoveries);
    assert_string_equal(start, "cold"); /* the same process throughout */
    assert_true(recoveries >= 1);
    rp_rm_rf(j.dir);
}

/* On the steady path (steps agreed between the members) and on etcd's. */
static void test_restart_in_place_steady(void **state)
{
    (void)state;
    run_restart("restart-peers", "peers");
}

static void test_restart_in_place_etcd(void **state)
{
    (void)state;
    run_restart("restart-etcd", "etcd");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_restart_in_place_steady),
        cmocka_unit_test(test_restart_in_place_etcd),
    };
    if (getenv("TEST_FILTER") != NULL)
        cmocka_set_test_filter(getenv("TEST_FILTER"));
    return cmocka_run_group_tests(tests, rp_setup, rp_teardown);
}
