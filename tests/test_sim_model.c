/*
 * graft-sim model: the discrete-event model against closed forms (no
 * failures; Daly's exact expectation and Young's first order for
 * checkpoint-restart; the optimum against Young/Daly; a peer-to-peer
 * renewal estimate), reproducibility, the ordering of the strategies and
 * the checks of the model's arguments.
 *
 * The parameter files and the benchmarks' --json outputs are tested in
 * test_sim_model_params.c, both command lines in test_sim_model_cli.c.
 * The program links the simulator's library part (libgraft-sim.a).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "sim/model/sim_model.h"
#include "sim/model/sim_params.h"

/* Parameters with every recovery cost explicit, for closed-form checks. */
static graft_sim_params_t cr_params(double job_mtbf_s, double c, double detect, double restart,
                                    double horizon_days)
{
    graft_sim_params_t p;
    graft_sim_params_default(&p);
    p.groups = 1;
    p.gpus_per_group = 1;
    p.gpu_mtbf_hours = job_mtbf_s / 3600.0;
    p.disaster_fraction = 0;
    p.checkpoint_seconds = c;
    p.checkpoint_gb_s = 0;
    p.coordination_seconds = 0;
    p.detect_seconds = detect;
    p.restart_seconds = restart;
    p.horizon_days = horizon_days;
    p.runs = 1;
    return p;
}

static void check_accounting(const graft_sim_result_t *r)
{
    /* Every second of wall time is training kept, a checkpoint, lost work
     * or downtime, or per-step coordination. */
    double sum = r->goodput + r->checkpoint_frac + r->rework_frac + r->downtime_frac +
                 r->coordination_frac;
    assert_true(fabs(sum - 1.0) < 1e-9);
}

static void test_no_failures(void **state)
{
    (void)state;
    graft_sim_params_t p = cr_params(1, 10, 5, 100, 100);
    p.gpu_mtbf_hours = INFINITY;
    p.groups = 16;
    for (int s = 0; s < GRAFT_SIM_NSTRATEGIES; s++) {
        graft_sim_result_t r;
        assert_int_equal(graft_sim_model_simulate(&p, (graft_sim_strategy_t)s, 1000, 1, &r),
                         GRAFT_OK);
        /* goodput = T / (T + C) up to the horizon cutting one interval. */
        assert_true(fabs(r.goodput - 1000.0 / 1010.0) < 1e-4);
        assert_true(r.failures == 0 && r.rework_frac == 0 && r.downtime_frac == 0);
        check_accounting(&r);
    }
    /* No checkpoints at all: every second is kept. */
    graft_sim_result_t r;
    assert_int_equal(graft_sim_model_simulate(&p, GRAFT_SIM_CHECKPOINT_RESTART, INFINITY, 1, &r),
                     GRAFT_OK);
    assert_true(fabs(r.goodput - 1.0) < 1e-12);
}

static void test_checkpoint_restart_matches_daly(void **state)
{
    (void)state;
    /* M = 1 h, C = 60 s, D + R = 300 s: far from the first-order regime, so
     * compare with Daly's exact expectation for exponential failures. */
    graft_sim_params_t p = cr_params(3600, 60, 30, 270, 2000);
    const double ts[] = {300, 657, 1500, 4000};
    for (size_t i = 0; i < sizeof(ts) / sizeof(ts[0]); i++) {
        graft_sim_result_t r;
        assert_int_equal(graft_sim_model_simulate(&p, GRAFT_SIM_CHECKPOINT_RESTART, ts[i], 7, &r),
                         GRAFT_OK);
        double expect = graft_sim_daly_goodput(ts[i], 60, 300, 3600);
        print_message("# T=%5.0f simulated %.4f Daly exact %.4f\n", ts[i], r.goodput, expect);
        assert_true(fabs(r.goodput - expect) < 0.01 * expect);
        assert_true(r.failures > 40000);
        assert_true(r.disk_restarts == r.failures);
        check_accounting(&r);
    }

    /* First-order regime (C, R << M): waste ~ C/T + (T/2 + R)/M. */
    graft_sim_params_t q = cr_params(36000, 30, 10, 50, 4000);
    double t = graft_sim_young_seconds(30, 36000);
    graft_sim_result_t r;
    assert_int_equal(graft_sim_model_simulate(&q, GRAFT_SIM_CHECKPOINT_RESTART, t, 3, &r),
                     GRAFT_OK);
    double waste_first = 30 / t + (t / 2 + 60) / 36000;
    double waste_sim = 1 - r.goodput;
    print_message("# first order: waste simulated %.4f, Young/Daly %.4f\n", waste_sim,
                  waste_first);
    assert_true(fabs(waste_sim - waste_first) < 0.10 * waste_first);
}

static void test_optimum_near_young_daly(void **state)
{
    (void)state;
    graft_sim_params_t p = cr_params(36000, 30, 0, 0, 6000);
    double young = graft_sim_young_seconds(30, 36000);
    graft_sim_result_t grid[25];
    graft_sim_optimum_t o;
    assert_int_equal(graft_sim_model_sweep(&p, GRAFT_SIM_CHECKPOINT_RESTART, young / 6, young * 6,
                                           25, 11, grid, &o),
                     GRAFT_OK);
    print_message("# optimum %.0f s, Young %.0f s, Daly %.0f s\n", o.best_interval_seconds,
                  o.young_seconds, o.daly_seconds);
    assert_true(fabs(o.young_seconds - young) < 1e-9);
    assert_false(o.at_sweep_bound);
    assert_true(fabs(o.best_interval_seconds / young - 1) < 0.15);
    assert_true(fabs(o.best_interval_seconds / o.daly_seconds - 1) < 0.15);
    /* The curve is concave around its top: both ends are clearly worse. */
    assert_true(grid[0].goodput < o.best.goodput - 0.01);
    assert_true(grid[24].goodput < o.best.goodput - 0.01);
    assert_true(o.at_young.goodput > o.best.goodput - 0.002);
}

static void test_p2p_renewal(void **state)
{
    (void)state;
    /* No checkpoints, no disasters: each failure costs the step in flight
     * (about half a step) plus one heal; heals overlapping is rare at this
     * rate. Renewal: goodput ~ (M - step/2) / (M + heal), of which the
     * compute share step / (step + coordination) is training. */
    graft_sim_params_t p;
    graft_sim_params_default(&p);
    p.groups = 64;
    p.gpus_per_group = 8;
    p.disaster_fraction = 0;
    p.horizon_days = 500;
    p.runs = 2;
    p.gpu_mtbf_hours = 4.0 * 64 * 8; /* job MTBF 4 h */
    double m = graft_sim_job_mtbf_seconds(&p);
    assert_true(fabs(m - 4 * 3600) < 1e-6);
    for (int s = GRAFT_SIM_P2P_SINGLE; s <= GRAFT_SIM_P2P_MULTI; s++) {
        graft_sim_result_t r;
        double heal = graft_sim_p2p_recovery_seconds(&p, (graft_sim_strategy_t)s);
        assert_int_equal(graft_sim_model_simulate(&p, (graft_sim_strategy_t)s, INFINITY, 5, &r),
                         GRAFT_OK);
        double expect = (m - p.step_seconds / 2) / (m + heal) * p.step_seconds /
                        (p.step_seconds + p.coordination_seconds);
        print_message("# %s: simulated %.5f renewal %.5f (heal %.1f s)\n",
                      graft_sim_strategy_name((graft_sim_strategy_t)s), r.goodput, expect, heal);
        assert_true(fabs((1 - r.goodput) - (1 - expect)) < 0.05 * (1 - expect));
        assert_true(r.disk_restarts == 0);
        assert_true(r.p2p_recoveries > 0.99 * r.failures - 2);
        check_accounting(&r);
    }
    /* Default pulls: 50.6 GB at 25 GB/s from one donor, 50 GB/s from four. */
    graft_sim_params_default(&p);
    assert_true(fabs(graft_sim_p2p_recovery_seconds(&p, GRAFT_SIM_P2P_SINGLE) -
                     (72 + p.state_gb / 25)) < 1e-9);
    assert_true(fabs(graft_sim_p2p_recovery_seconds(&p, GRAFT_SIM_P2P_MULTI) -
                     (72 + p.state_gb / 50)) < 1e-9);
}

static void test_strategy_order(void **state)
{
    (void)state;
    /* Slow links, a large state and flaky links, so that pulls lose donors. */
    graft_sim_params_t p;
    graft_sim_params_default(&p);
    p.groups = 16;
    p.gpus_per_group = 8;
    p.gpu_mtbf_hours = 128 * 1.0; /* job MTBF 1 h */
    p.state_gb = 200;
    p.link_gb_s = 1;
    p.nic_gb_s = 4;
    p.donors = 4;
    p.link_faults_per_hour = 1;
    p.restart_seconds = 1800;
    p.horizon_days = 100;
    p.runs = 2;
    graft_sim_result_t r[GRAFT_SIM_NSTRATEGIES];
    for (int s = 0; s < GRAFT_SIM_NSTRATEGIES; s++) {
        assert_int_equal(graft_sim_model_simulate(&p, (graft_sim_strategy_t)s, 3600, 9, &r[s]),
                         GRAFT_OK);
        check_accounting(&r[s]);
        print_message("# %-18s goodput %.4f restarts %.1f donor losses %.1f\n",
                      graft_sim_strategy_name((graft_sim_strategy_t)s), r[s].goodput,
                      r[s].transfer_restarts, r[s].donor_losses);
    }
    assert_true(r[GRAFT_SIM_P2P_MULTI].goodput > r[GRAFT_SIM_P2P_SINGLE].goodput);
    assert_true(r[GRAFT_SIM_P2P_SINGLE].goodput > r[GRAFT_SIM_CHECKPOINT_RESTART].goodput);
    assert_true(r[GRAFT_SIM_P2P_SINGLE].transfer_restarts > 10);
    assert_true(r[GRAFT_SIM_P2P_MULTI].donor_losses > 10);
    assert_true(r[GRAFT_SIM_P2P_MULTI].link_faults > 10);
    assert_true(r[GRAFT_SIM_P2P_MULTI].transfer_restarts == 0);
    /* All strategies saw the same failures (common random numbers). */
    assert_true(r[0].failures == r[1].failures && r[1].failures == r[2].failures);

    /* Resuming alone is worth something: one donor each, same bandwidth. */
    p.donors = 1;
    graft_sim_result_t single, multi1;
    assert_int_equal(graft_sim_model_simulate(&p, GRAFT_SIM_P2P_SINGLE, 3600, 9, &single),
                     GRAFT_OK);
    assert_int_equal(graft_sim_model_simulate(&p, GRAFT_SIM_P2P_MULTI, 3600, 9, &multi1),
                     GRAFT_OK);
    print_message("# one donor each: restart-from-zero %.4f, resuming %.4f\n", single.goodput,
                  multi1.goodput);
    assert_true(multi1.goodput > single.goodput + 0.005);
    /* In strict mode a donor's death costs its own full heal, which outlasts
     * a restarted pull: without link faults, resuming gains nothing. */
    p.link_faults_per_hour = 0;
    assert_int_equal(graft_sim_model_simulate(&p, GRAFT_SIM_P2P_SINGLE, 3600, 9, &single),
                     GRAFT_OK);
    assert_int_equal(graft_sim_model_simulate(&p, GRAFT_SIM_P2P_MULTI, 3600, 9, &multi1),
                     GRAFT_OK);
    assert_true(fabs(multi1.goodput - single.goodput) < 0.002);
    assert_true(single.transfer_restarts > 0);

    /* Where every failure is a disaster, or there is one group, P2P has no
     * donor and is checkpoint-restart exactly. */
    graft_sim_params_t d = p;
    d.disaster_fraction = 1;
    graft_sim_result_t a, b;
    assert_int_equal(graft_sim_model_simulate(&d, GRAFT_SIM_CHECKPOINT_RESTART, 3600, 4, &a),
                     GRAFT_OK);
    assert_int_equal(graft_sim_model_simulate(&d, GRAFT_SIM_P2P_MULTI, 3600, 4, &b), GRAFT_OK);
    assert_true(a.goodput == b.goodput);
    d = p;
    d.groups = 1;
    assert_int_equal(graft_sim_model_simulate(&d, GRAFT_SIM_CHECKPOINT_RESTART, 3600, 4, &a),
                     GRAFT_OK);
    assert_int_equal(graft_sim_model_simulate(&d, GRAFT_SIM_P2P_SINGLE, 3600, 4, &b), GRAFT_OK);
    assert_true(a.goodput == b.goodput);
}

static void test_same_seed_same_result(void **state)
{
    (void)state;
    graft_sim_params_t p;
    graft_sim_params_default(&p);
    p.horizon_days = 20;
    p.runs = 3;
    graft_sim_result_t a, b, c;
    assert_int_equal(graft_sim_model_simulate(&p, GRAFT_SIM_P2P_MULTI, 3000, 42, &a), GRAFT_OK);
    assert_int_equal(graft_sim_model_simulate(&p, GRAFT_SIM_P2P_MULTI, 3000, 42, &b), GRAFT_OK);
    assert_memory_equal(&a, &b, sizeof(a));
    assert_int_equal(graft_sim_model_simulate(&p, GRAFT_SIM_P2P_MULTI, 3000, 43, &c), GRAFT_OK);
    assert_true(a.goodput != c.goodput);
    assert_true(a.goodput_stddev > 0);
}

static void test_bad_arguments(void **state)
{
    (void)state;
    graft_sim_params_t p;
    graft_sim_result_t r;
    char err[200];
    graft_sim_params_default(&p);
    assert_int_equal(graft_sim_params_check(&p, err, sizeof(err)), GRAFT_OK);
    assert_int_equal(graft_sim_model_simulate(NULL, GRAFT_SIM_P2P_MULTI, 10, 1, &r), GRAFT_EINVAL);
    assert_int_equal(graft_sim_model_simulate(&p, GRAFT_SIM_P2P_MULTI, 0, 1, &r), GRAFT_EINVAL);
    assert_int_equal(graft_sim_model_simulate(&p, GRAFT_SIM_P2P_MULTI, NAN, 1, &r), GRAFT_EINVAL);
    assert_int_equal(graft_sim_model_simulate(&p, GRAFT_SIM_NSTRATEGIES, 10, 1, &r),
                     GRAFT_EINVAL);
    /* Absurd event counts fail fast instead of running for hours. */
    assert_int_equal(graft_sim_model_simulate(&p, GRAFT_SIM_P2P_MULTI, 1e-6, 1, &r),
                     GRAFT_ERANGE);
    graft_sim_result_t grid[4];
    graft_sim_optimum_t o;
    assert_int_equal(graft_sim_model_sweep(&p, GRAFT_SIM_P2P_MULTI, 100, 10, 4, 1, grid, &o),
                     GRAFT_EINVAL);
    assert_int_equal(graft_sim_model_sweep(&p, GRAFT_SIM_P2P_MULTI, 10, 100, 1, 1, grid, &o),
                     GRAFT_EINVAL);

    struct {
        const char *key;
        const char *value;
        graft_status_t want;
    } cases[] = {
        {"groups", "0", GRAFT_ERANGE},           {"groups", "1.5", GRAFT_EINVAL},
        {"groups", "abc", GRAFT_EINVAL},         {"link-gb-s", "-1", GRAFT_ERANGE},
        {"link_gb_s", "0", GRAFT_ERANGE},        {"disaster_fraction", "1.5", GRAFT_ERANGE},
        {"gpu_mtbf_hours", "nan", GRAFT_EINVAL}, {"donors", "65", GRAFT_ERANGE},
        {"runs", "", GRAFT_EINVAL},              {"nonsense", "1", GRAFT_ENOTFOUND},
        {"horizon_days", "1e9", GRAFT_ERANGE},   {"step_seconds", "12x", GRAFT_EINVAL},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        graft_sim_params_t q = p;
        err[0] = '\0';
        graft_status_t st = graft_sim_params_set(&q, cases[i].key, cases[i].value, err,
                                                 sizeof(err));
        assert_int_equal(st, cases[i].want);
        assert_memory_equal(&q, &p, sizeof(p));
        assert_true(strlen(err) > 0);
    }
    assert_int_equal(graft_sim_params_set(&p, "gpu-mtbf-hours", "inf", err, sizeof(err)),
                     GRAFT_OK);
    assert_true(isinf(p.gpu_mtbf_hours));
    assert_int_equal(graft_sim_params_set(&p, "donors", "8", err, sizeof(err)), GRAFT_OK);
    assert_int_equal(p.donors, 8);
    p.groups = -3;
    assert_int_equal(graft_sim_params_check(&p, err, sizeof(err)), GRAFT_ERANGE);
    assert_non_null(strstr(err, "groups"));
}

static void test_closed_form_helpers(void **state)
{
    (void)state;
    assert_true(fabs(graft_sim_young_seconds(30, 3600) - sqrt(2 * 30 * 3600.0)) < 1e-9);
    assert_true(isinf(graft_sim_young_seconds(30, INFINITY)));
    assert_true(isinf(graft_sim_daly_seconds(30, INFINITY)));
    /* Daly's optimum is close to Young's when C << M, and M when C >= 2M. */
    double y = graft_sim_young_seconds(1, 1e6), d = graft_sim_daly_seconds(1, 1e6);
    assert_true(fabs(d / y - 1) < 0.01);
    assert_true(graft_sim_daly_seconds(100, 40) == 40);
    /* Without failures the exact goodput is T / (T + C). */
    assert_true(fabs(graft_sim_daly_goodput(90, 10, 5, INFINITY) - 0.9) < 1e-12);
    assert_string_equal(graft_sim_strategy_name(GRAFT_SIM_NSTRATEGIES), "unknown");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_closed_form_helpers),
        cmocka_unit_test(test_no_failures),
        cmocka_unit_test(test_checkpoint_restart_matches_daly),
        cmocka_unit_test(test_optimum_near_young_daly),
        cmocka_unit_test(test_p2p_renewal),
        cmocka_unit_test(test_strategy_order),
        cmocka_unit_test(test_same_seed_same_result),
        cmocka_unit_test(test_bad_arguments),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
