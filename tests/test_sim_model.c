/*
 * graft-sim model: the discrete-event model against closed forms (no
 * failures; Daly's exact expectation and Young's first order for
 * checkpoint-restart; the optimum against Young/Daly; a peer-to-peer
 * renewal estimate), reproducibility, the ordering of the strategies, the
 * parameter files and both command lines (in-process and the real binary).
 *
 * The program links the simulator's library part (libgraft-sim.a) and
 * stands in for its live engine.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "sim/sim_cli.h"
#include "sim/live/sim_live.h"
#include "sim/model/sim_model.h"
#include "sim/model/sim_params.h"
#include "sim/model/sim_report.h"

/* The live engine is not compiled in: this stand-in records what the
 * command line handed over, so the test checks the parsing itself. */
static graft_sim_live_opts_t live_seen;
static int live_calls;

int graft_sim_live_run(const graft_sim_live_opts_t *opts)
{
    live_seen = *opts;
    live_calls++;
    return 42;
}

static const char *test_argv0;
static char test_dir[256];

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

static void write_file(const char *path, const char *text)
{
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    assert_true(fputs(text, f) >= 0);
    assert_int_equal(fclose(f), 0);
}

static void test_params_files(void **state)
{
    (void)state;
    char path[512], err[300];
    graft_sim_params_t p, orig;
    graft_sim_params_default(&orig);
    snprintf(path, sizeof(path), "%s/params.json", test_dir);

    write_file(path, "{\"link_gb_s\": 4.5, \"donors\": 2, \"checkpoint_seconds\": 12}");
    p = orig;
    assert_int_equal(graft_sim_params_load(&p, path, err, sizeof(err)), GRAFT_OK);
    assert_true(p.link_gb_s == 4.5 && p.donors == 2 && p.checkpoint_seconds == 12);

    /* Some text, then an object whose model_params member holds them. */
    write_file(path, "measured on host a\n{\"host\": \"a\", \"model_params\": "
                     "{\"link_gb_s\": 5.1, \"verify_gb_s\": 30}}\n\n");
    p = orig;
    assert_int_equal(graft_sim_params_load(&p, path, err, sizeof(err)), GRAFT_OK);
    assert_true(p.link_gb_s == 5.1 && p.verify_gb_s == 30);

    struct {
        const char *text;
        graft_status_t want;
        const char *in_err;
    } bad[] = {
        {"{", GRAFT_EFORMAT, "not JSON"},
        {"", GRAFT_EFORMAT, "not JSON"},
        {"[1, 2]", GRAFT_EFORMAT, "object"},
        {"{\"model_params\": 3}", GRAFT_EFORMAT, "object"},
        {"{\"link_gbs\": 3}", GRAFT_ENOTFOUND, "link_gbs"},
        {"{\"link-gb-s\": 3}", GRAFT_ENOTFOUND, "link-gb-s"},
        {"{\"donors\": \"4\"}", GRAFT_EINVAL, "donors"},
        {"{\"donors\": 2.5}", GRAFT_EINVAL, "donors"},
        {"{\"donors\": 1e30}", GRAFT_EINVAL, "donors"},
        {"{\"state_gb\": -1}", GRAFT_ERANGE, "state_gb"},
        {"{\"groups\": 4, \"disaster_fraction\": 2}", GRAFT_ERANGE, "disaster_fraction"},
        {"{\"runs\": null}", GRAFT_EINVAL, "runs"},
    };
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        write_file(path, bad[i].text);
        p = orig;
        err[0] = '\0';
        assert_int_equal(graft_sim_params_load(&p, path, err, sizeof(err)), bad[i].want);
        assert_non_null(strstr(err, bad[i].in_err));
        assert_non_null(strstr(err, path));
        /* Nothing is applied from a file that fails. */
        assert_memory_equal(&p, &orig, sizeof(p));
    }
    snprintf(path, sizeof(path), "%s/missing.json", test_dir);
    assert_int_equal(graft_sim_params_load(&p, path, err, sizeof(err)), GRAFT_EIO);
    assert_non_null(strstr(err, "No such file"));
}

#define TRANSFER_TABLE_ROWS \
    "tcp   push malloc    0.85 GB/s  0.73 GB/s  0.85 GB/s    1.20 GB/s     1." \
    "30 GB/s     3.74 GB/s      0.23x     0.76 GB/s     0.70 GB/s      1.13x " \
    "  0.045 s   0.061 s\nshm   push malloc    0.77 GB/s  0.66 GB/s  0.54 GB/s" \
    "    0.88 GB/s    17.52 GB/s     0.26 GB/s      0.04x    20.08 GB/s     6" \
    ".05 GB/s      0.04x   0.047 s   0.062 s\n"
#define TRANSFER_JSON \
    "{\"bench\":\"transfer\",\"bytes\":16777216,\"chunk\":4194304,\"window\":4,\"reps\":1" \
    ",\"results\":[{\"tls\":\"tcp\",\"read\":\"push\",\"alloc\":\"malloc\",\"pull_gbps\":[0.8" \
    "52,0.734,0.850],\"pull_noverify_gbps\":1.195,\"perftest_ucp_get_gbps\":1.302" \
    ",\"perftest_tag_bw_gbps\":3.739,\"ratio_vs_best_perftest\":0.228,\"perftest_p" \
    "lain_ucp_get_gbps\":0.756,\"perftest_plain_tag_bw_gbps\":0.701,\"ratio_vs_be" \
    "st_plain_perftest\":1.126,\"recover_s\":0.045,\"fail_at_s\":0.038,\"restart_fr" \
    "om_zero_s\":0.061},{\"tls\":\"shm\",\"read\":\"push\",\"alloc\":\"malloc\",\"pull_gbps" \
    "\":[0.772,0.665,0.536],\"pull_noverify_gbps\":0.882,\"perftest_ucp_get_gbps\"" \
    ":17.520,\"perftest_tag_bw_gbps\":0.265,\"ratio_vs_best_perftest\":0.044,\"per" \
    "ftest_plain_ucp_get_gbps\":20.082,\"perftest_plain_tag_bw_gbps\":6.048,\"rat" \
    "io_vs_best_plain_perftest\":0.038,\"recover_s\":0.047,\"fail_at_s\":0.037,\"re" \
    "start_from_zero_s\":0.062}]}\n"
#define RUNTIME_JSON \
    "{\"bench\":\"runtime\",\"etcd_put_median_ms\":0.631,\"steady\":[{\"groups\":2,\"med" \
    "ian_ms\":8.539,\"p99_ms\":10.462,\"quorum_median_ms\":4.704,\"commit_median_ms" \
    "\":4.155,\"etcd_cpu_ms_per_step\":9.000}],\"recovery\":[{\"mib\":8,\"total_s\":0." \
    "3757,\"detect_s\":0.2943,\"quorum_s\":0.0077,\"transfer_s\":0.0197,\"verify_s\":" \
    "0.0022,\"restore_s\":0.0169,\"restore_over_p2p\":0.86}]}\n"
#define MEMBERSHIP_JSON \
    "{\"bench\":\"membership\",\"ranks_per_group\":1,\"ttl_ms\":2000,\"detect_samples\"" \
    ":6,\"detect_median_ms\":2247.1,\"detect_p99_ms\":2396.5,\"detect_max_ms\":2396" \
    ".5,\"detect_bound_ms\":2666.7,\"form_median_ms\":{\"8\":8.84,\"64\":45.08,\"256\":" \
    "529.02},\"form_p99_ms\":{\"8\":8.96,\"64\":58.37,\"256\":530.14},\"form_goal_ms_6" \
    "4\":50,\"requests_per_group_step\":{\"8\":2.00,\"64\":2.02,\"256\":2.00},\"request" \
    "s_per_rank_step\":{\"8\":2.00,\"64\":2.02,\"256\":2.00},\"requests_goal\":3,\"fail" \
    "s\":0}\n"
#define PERSIST_JSON \
    "{\"bench\":\"persist\",\"mib\":16,\"reps\":1,\"block_ms\":2.318,\"memcpy_ms\":2.239," \
    "\"block_vs_memcpy\":1.035,\"write_MBps\":620.3,\"plain_write_fsync_MBps\":562." \
    "6,\"write_vs_plain\":1.103,\"dd_MBps\":860.7,\"restore_MBps\":889.5,\"cat_MBps\"" \
    ":992.1,\"restore_vs_cat\":0.897,\"zstd\":[{\"level\":-3,\"ratio\":1.548,\"MBps\":4" \
    "83.8},{\"level\":-1,\"ratio\":1.644,\"MBps\":444.5},{\"level\":1,\"ratio\":1.770,\"" \
    "MBps\":409.9},{\"level\":3,\"ratio\":1.778,\"MBps\":364.7}]}\n"
#define TRANSFER_TCP_1 0.852
#define TRANSFER_TCP_MAX 0.852
#define RUNTIME_DETECT_S 0.2943
#define RUNTIME_QUORUM_S 0.0077
#define MEMBERSHIP_DETECT_MS 2247.1
#define PERSIST_MIB 16.0
#define PERSIST_BLOCK_MS 2.318
#define PERSIST_RESTORE_MBPS 889.5

/*
 * The --json lines of the real benchmarks, as they printed them on this
 * machine (the printf at the end of each bench/ source; quick settings): transfer_bench --bytes 16777216
 * --reps 1 --tls tcp,shm --read push --alloc malloc, runtime_bench --groups
 * 2 --steps 5 --mib 8, membership_bench --quick, persist_bench --mib 16
 * --reps 1.
 */
static const char bench_transfer[] = TRANSFER_TABLE_ROWS TRANSFER_JSON;
static const char bench_runtime[] = RUNTIME_JSON;
static const char bench_membership[] = MEMBERSHIP_JSON;
static const char bench_persist[] = PERSIST_JSON;

static void load_ok(const char *path, const char *text, graft_sim_params_t *p)
{
    char err[300] = "";
    write_file(path, text);
    graft_status_t st = graft_sim_params_load(p, path, err, sizeof(err));
    if (st != GRAFT_OK) {
        fail_msg("%s: %s (%s)", path, err, graft_status_name(st));
    }
}

/* Each benchmark's figures land on the parameters they measure, and only
 * there; the model then uses them. */
static void test_params_from_benchmarks(void **state)
{
    (void)state;
    char path[512], err[300];
    graft_sim_params_t p, orig;
    graft_sim_params_default(&orig);
    snprintf(path, sizeof(path), "%s/bench.json", test_dir);

    /* transfer: the tcp row (a network transport) though shm's is listed
     * too; one donor's verified pull is the link, the best with 1-3 donors
     * the recipient's cap. */
    p = orig;
    load_ok(path, bench_transfer, &p);
    assert_true(p.link_gb_s == TRANSFER_TCP_1);
    assert_true(p.nic_gb_s == TRANSFER_TCP_MAX);
    graft_sim_params_t q = p;
    q.link_gb_s = orig.link_gb_s;
    q.nic_gb_s = orig.nic_gb_s;
    assert_memory_equal(&q, &orig, sizeof(q));

    /* runtime: the largest state's recovery; kill -> the replacement
     * joined is the spawn, its quorum phase the quorum. */
    p = orig;
    load_ok(path, bench_runtime, &p);
    assert_true(p.spawn_seconds == RUNTIME_DETECT_S);
    assert_true(p.quorum_seconds == RUNTIME_QUORUM_S);
    q = p;
    q.spawn_seconds = orig.spawn_seconds;
    q.quorum_seconds = orig.quorum_seconds;
    assert_memory_equal(&q, &orig, sizeof(q));

    /* membership: kill -> group unhealthy is the detection. */
    p = orig;
    load_ok(path, bench_membership, &p);
    assert_true(fabs(p.detect_seconds - MEMBERSHIP_DETECT_MS / 1e3) < 1e-12);
    q = p;
    q.detect_seconds = orig.detect_seconds;
    assert_memory_equal(&q, &orig, sizeof(q));

    /* persist: the blocking save as a throughput replaces the assumed C;
     * the cold-cache restore is the loading part of a restart. */
    p = orig;
    load_ok(path, bench_persist, &p);
    double gb = PERSIST_MIB * 1048576.0 / 1e9;
    assert_true(fabs(p.checkpoint_gb_s - gb / (PERSIST_BLOCK_MS / 1e3)) < 1e-9);
    assert_true(p.checkpoint_seconds == 0);
    assert_true(fabs(p.restore_gb_s - PERSIST_RESTORE_MBPS / 1e3) < 1e-12);
    assert_true(fabs(graft_sim_checkpoint_cost(&p) - p.state_gb / p.checkpoint_gb_s) < 1e-9);
    assert_true(fabs(graft_sim_restart_cost(&p) -
                     (orig.restart_seconds + p.state_gb / p.restore_gb_s)) < 1e-9);
    q = p;
    q.checkpoint_gb_s = orig.checkpoint_gb_s;
    q.checkpoint_seconds = orig.checkpoint_seconds;
    q.restore_gb_s = orig.restore_gb_s;
    assert_memory_equal(&q, &orig, sizeof(q));

    /* All four, one after the other: each sets its own parameters. */
    p = orig;
    load_ok(path, bench_transfer, &p);
    load_ok(path, bench_runtime, &p);
    load_ok(path, bench_membership, &p);
    load_ok(path, bench_persist, &p);
    assert_true(p.link_gb_s == TRANSFER_TCP_1 && p.spawn_seconds == RUNTIME_DETECT_S &&
                p.checkpoint_seconds == 0 && p.restore_gb_s > 0);
    assert_int_equal(graft_sim_params_check(&p, err, sizeof(err)), GRAFT_OK);

    /* The measured checkpoint cost is what Young's interval uses. */
    graft_sim_params_t m = p;
    m.runs = 1;
    m.horizon_days = 1;
    graft_sim_result_t grid[3];
    graft_sim_optimum_t opt;
    assert_int_equal(graft_sim_model_sweep(&m, GRAFT_SIM_CHECKPOINT_RESTART, 60, 600, 3, 1, grid,
                                           &opt),
                     GRAFT_OK);
    assert_true(fabs(opt.young_seconds -
                     graft_sim_young_seconds(graft_sim_checkpoint_cost(&m),
                                             opt.disk_mtbf_seconds)) < 1e-9);
    assert_true(fabs(graft_sim_checkpoint_cost(&m) -
                     m.state_gb / (16 * 1048576.0 / 1e9 / 2.318e-3)) < 1e-9);

    struct {
        const char *text;
        graft_status_t want;
        const char *in_err;
    } bad[] = {
        {"{\"bench\":\"etcd\",\"put_ms\":1}", GRAFT_ENOTSUP, "bench 'etcd'"},
        {"{\"bench\":\"transfer\",\"results\":[]}", GRAFT_EFORMAT, "results"},
        {"{\"bench\":\"transfer\",\"results\":[{\"tls\":\"tcp\"}]}", GRAFT_EFORMAT,
         "results[0]: no 'pull_gbps'"},
        {"{\"bench\":\"transfer\",\"results\":[{\"tls\":\"tcp\",\"pull_gbps\":[0,0,0]}]}",
         GRAFT_ERANGE, "positive pull_gbps[0]"},
        {"{\"bench\":\"transfer\",\"results\":[{\"tls\":\"tcp\",\"pull_gbps\":[1,\"2\",3]}]}",
         GRAFT_EINVAL, "pull_gbps[1]"},
        {"{\"bench\":\"runtime\",\"steady\":[]}", GRAFT_EFORMAT, "recovery"},
        {"{\"bench\":\"runtime\",\"recovery\":[{\"mib\":8,\"detect_s\":0.3}]}", GRAFT_EFORMAT,
         "quorum_s"},
        {"{\"bench\":\"membership\",\"detect_median_ms\":-1}", GRAFT_ERANGE,
         "detect_median_ms"},
        {"{\"bench\":\"persist\",\"mib\":16,\"block_ms\":0,\"restore_MBps\":900}", GRAFT_ERANGE,
         "block_ms"},
        {"{\"bench\":\"persist\",\"mib\":16,\"block_ms\":2}", GRAFT_EFORMAT, "restore_MBps"},
    };
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        write_file(path, bad[i].text);
        p = orig;
        err[0] = '\0';
        graft_status_t st = graft_sim_params_load(&p, path, err, sizeof(err));
        if (st != bad[i].want || strstr(err, bad[i].in_err) == NULL || strstr(err, path) == NULL)
            fail_msg("%s: got %s '%s', want %s with '%s'", bad[i].text, graft_status_name(st),
                     err, graft_status_name(bad[i].want), bad[i].in_err);
        /* Nothing is applied from a file that fails. */
        assert_memory_equal(&p, &orig, sizeof(p));
    }
}

/* Runs graft_sim_model_main with a NULL-terminated argument list. */
static int model_main(const char *first, ...)
{
    char *argv[64];
    int argc = 0;
    va_list ap;
    argv[argc++] = (char *)"model";
    va_start(ap, first);
    for (const char *a = first; a != NULL && argc < 63; a = va_arg(ap, const char *)) {
        argv[argc++] = (char *)a;
    }
    va_end(ap);
    argv[argc] = NULL;
    return graft_sim_model_main(argc, argv);
}

static int run_main(const char *first, ...)
{
    char *argv[64];
    int argc = 0;
    va_list ap;
    argv[argc++] = (char *)"run";
    va_start(ap, first);
    for (const char *a = first; a != NULL && argc < 63; a = va_arg(ap, const char *)) {
        argv[argc++] = (char *)a;
    }
    va_end(ap);
    argv[argc] = NULL;
    return graft_sim_run_main(argc, argv);
}

static char *slurp(const char *path)
{
    FILE *f = fopen(path, "rb");
    assert_non_null(f);
    assert_int_equal(fseek(f, 0, SEEK_END), 0);
    long n = ftell(f);
    assert_true(n >= 0);
    rewind(f);
    char *buf = malloc((size_t)n + 1);
    assert_non_null(buf);
    assert_int_equal(fread(buf, 1, (size_t)n, f), (size_t)n);
    buf[n] = '\0';
    fclose(f);
    return buf;
}

static int count_of(const char *hay, const char *needle)
{
    int n = 0;
    for (const char *p = strstr(hay, needle); p != NULL; p = strstr(p + 1, needle)) {
        n++;
    }
    return n;
}

static void test_model_command_line(void **state)
{
    (void)state;
    char json[512], svg[512], params[512];
    snprintf(json, sizeof(json), "%s/out.json", test_dir);
    snprintf(svg, sizeof(svg), "%s/out.svg", test_dir);
    snprintf(params, sizeof(params), "%s/cli-params.json", test_dir);
    write_file(params, "{\"link_gb_s\": 7, \"donors\": 3}");

    assert_int_equal(model_main("--horizon-days", "5", "--runs", "2", "--sweep-points", "6",
                                "--params", params, "--donors=5", "--interruptions", "419",
                                "--period-days", "54", "--persist-every-seconds", "1800",
                                "--seed", "18446744073709551615", "--json", json, "--plot", svg,
                                NULL),
                     0);
    json_error_t jerr;
    json_t *root = json_load_file(json, 0, &jerr);
    assert_non_null(root);
    json_t *pj = json_object_get(root, "params");
    /* The file set link_gb_s; the flag overrode its donors. */
    assert_true(json_real_value(json_object_get(pj, "link_gb_s")) == 7);
    assert_true(json_real_value(json_object_get(pj, "donors")) == 5);
    graft_sim_params_t d;
    graft_sim_params_default(&d);
    assert_true(fabs(json_real_value(json_object_get(pj, "gpu_mtbf_hours")) / d.gpu_mtbf_hours -
                     1) < 1e-12);
    assert_string_equal(json_string_value(json_object_get(root, "seed")), "18446744073709551615");
    json_t *strategies = json_object_get(root, "strategies");
    assert_int_equal(json_array_size(strategies), GRAFT_SIM_NSTRATEGIES);
    for (size_t i = 0; i < json_array_size(strategies); i++) {
        json_t *s = json_array_get(strategies, i);
        assert_string_equal(json_string_value(json_object_get(s, "name")),
                            graft_sim_strategy_name((graft_sim_strategy_t)i));
        assert_int_equal(json_array_size(json_object_get(s, "sweep")), 6);
        double g = json_real_value(json_object_get(json_object_get(s, "best"), "goodput"));
        assert_true(g > 0.5 && g <= 1.0);
        assert_non_null(json_object_get(s, "fixed"));
        assert_true(json_is_real(json_object_get(s, "young_seconds")));
    }
    json_decref(root);

    char *text = slurp(svg);
    assert_true(strncmp(text, "<?xml", 5) == 0);
    assert_non_null(strstr(text, "</svg>"));
    assert_int_equal(count_of(text, "<polyline"), GRAFT_SIM_NSTRATEGIES);
    assert_non_null(strstr(text, "multi-donor-p2p"));
    assert_null(strstr(text, "nan"));
    free(text);

    /* Bad usage: exit 2, and nothing crashes. */
    char missing[512];
    snprintf(missing, sizeof(missing), "%s/nope.json", test_dir);
    assert_int_equal(model_main("--bogus", "1", NULL), 2);
    assert_int_equal(model_main("--runs", "0", NULL), 2);
    assert_int_equal(model_main("--runs", "abc", NULL), 2);
    assert_int_equal(model_main("--runs", NULL), 2);
    assert_int_equal(model_main("positional", NULL), 2);
    assert_int_equal(model_main("--params", missing, NULL), 2);
    assert_int_equal(model_main("--sweep-min-seconds", "100", "--sweep-max-seconds", "10", NULL),
                     2);
    assert_int_equal(model_main("--sweep-points", "1", NULL), 2);
    assert_int_equal(model_main("--interruptions", "419", NULL), 2);
    assert_int_equal(model_main("--interruptions", "419", "--period-days", "54",
                                "--gpu-mtbf-hours", "5", NULL),
                     2);
    assert_int_equal(model_main("--seed", "-1", NULL), 2);
    assert_int_equal(model_main("--seed", "99999999999999999999", NULL), 2);
    assert_int_equal(model_main("--persist-every-seconds", "0", NULL), 2);
    assert_int_equal(model_main("--=3", NULL), 2);
    /* Runs, but cannot write its output: exit 1. */
    assert_int_equal(model_main("--horizon-days", "1", "--runs", "1", "--sweep-points", "2",
                                "--json", "/nonexistent-dir/x.json", NULL),
                     1);
    assert_int_equal(model_main("--help", NULL), 0);
}

static void test_run_command_line(void **state)
{
    (void)state;
    char sched[512], persist[512];
    snprintf(sched, sizeof(sched), "%s/schedule.json", test_dir);
    snprintf(persist, sizeof(persist), "%s/persist", test_dir);
    write_file(sched, "[]");
    /* Every flag of the issue is accepted and reaches the live engine. */
    live_calls = 0;
    assert_int_equal(run_main("--groups", "4", "--ranks", "2", "--steps", "100", "--seed", "7",
                              "--mode", "elastic", "--random-failures", "20", "--schedule", sched,
                              "--etcd", "http://127.0.0.1:2379", "--persist-root", persist,
                              "--persist-every", "10", "--netns", "--json", "x.json", NULL),
                     42);
    assert_int_equal(live_calls, 1);
    assert_int_equal(live_seen.groups, 4);
    assert_int_equal(live_seen.ranks, 2);
    assert_int_equal(live_seen.steps, 100);
    assert_true(live_seen.seed == 7);
    assert_int_equal(live_seen.mode, GRAFT_SIM_LIVE_ELASTIC);
    assert_int_equal(live_seen.random_failures, 20);
    assert_string_equal(live_seen.schedule_path, sched);
    assert_string_equal(live_seen.etcd_url, "http://127.0.0.1:2379");
    assert_string_equal(live_seen.persist_root, persist);
    assert_int_equal(live_seen.persist_every, 10);
    assert_int_equal(live_seen.netns, 1);
    assert_string_equal(live_seen.json_path, "x.json");
    /* Defaults. */
    assert_int_equal(run_main(NULL), 42);
    assert_int_equal(live_seen.groups, 4);
    assert_int_equal(live_seen.mode, GRAFT_SIM_LIVE_STRICT);
    assert_null(live_seen.etcd_url);
    assert_int_equal(live_seen.netns, 0);
    assert_int_equal(live_calls, 2);
    assert_int_equal(run_main("--help", NULL), 0);
    assert_int_equal(run_main("--bogus", NULL), 2);
    assert_int_equal(run_main("--groups", NULL), 2);
    assert_int_equal(run_main("--groups", "0", NULL), 2);
    assert_int_equal(run_main("--groups", "two", NULL), 2);
    assert_int_equal(run_main("--steps", "-5", NULL), 2);
    assert_int_equal(run_main("--mode", "loose", NULL), 2);
    assert_int_equal(run_main("--random-failures", "-1", NULL), 2);
    assert_int_equal(run_main("--schedule", "/nonexistent/schedule.json", NULL), 2);
    assert_int_equal(run_main("--etcd", "ftp://127.0.0.1", NULL), 2);
    assert_int_equal(run_main("--etcd", "http://", NULL), 2);
    assert_int_equal(run_main("--persist-every", "5", NULL), 2);
    assert_int_equal(run_main("--persist-root", "", NULL), 2);
    assert_int_equal(run_main("--seed", "x", NULL), 2);
    /* Bad usage never reaches the engine. */
    assert_int_equal(live_calls, 2);
}

/* Runs the built graft-sim with @args; returns its exit status and puts its
 * standard error into @err. */
static int run_binary(char *const args[], char *err, size_t errlen)
{
    char bin[1024], errpath[512];
    snprintf(bin, sizeof(bin), "%s", test_argv0);
    char *slash = strrchr(bin, '/');
    assert_non_null(slash);
    *slash = '\0';
    slash = strrchr(bin, '/');
    if (slash != NULL) {
        *slash = '\0';
        strncat(bin, "/bin/graft-sim", sizeof(bin) - strlen(bin) - 1);
    } else {
        snprintf(bin, sizeof(bin), "../bin/graft-sim");
    }
    if (access(bin, X_OK) != 0) {
        fail_msg("%s not built (make tests builds it): %s", bin, strerror(errno));
    }
    snprintf(errpath, sizeof(errpath), "%s/stderr.txt", test_dir);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        int fd = open(errpath, O_WRONLY | O_CREAT | O_TRUNC, 0644);
        int devnull = open("/dev/null", O_WRONLY);
        if (fd < 0 || devnull < 0 || dup2(fd, 2) < 0 || dup2(devnull, 1) < 0) {
            _exit(127);
        }
        char *argv[32];
        int n = 0;
        argv[n++] = bin;
        for (int i = 0; args[i] != NULL && n < 31; i++) {
            argv[n++] = args[i];
        }
        argv[n] = NULL;
        execv(bin, argv);
        _exit(127);
    }
    int status;
    assert_int_equal(waitpid(pid, &status, 0), pid);
    assert_true(WIFEXITED(status));
    char *text = slurp(errpath);
    snprintf(err, errlen, "%s", text);
    free(text);
    return WEXITSTATUS(status);
}

static void test_binary_exit_status(void **state)
{
    (void)state;
    char err[4096];
    char *bogus[] = {"model", "--link-gbs", "5", NULL};
    assert_int_equal(run_binary(bogus, err, sizeof(err)), 2);
    assert_non_null(strstr(err, "unknown option '--link-gbs'"));

    char *range[] = {"model", "--donors", "0", NULL};
    assert_int_equal(run_binary(range, err, sizeof(err)), 2);
    assert_non_null(strstr(err, "donors"));

    /* The live engine is built (tests/test_sim_live.c runs it); a flag it
     * cannot honour here is refused before anything starts. */
    char *live[] = {"run", "--groups", "2", "--ranks", "1", "--netns", "--etcd",
                    "http://127.0.0.1:1", NULL};
    assert_int_equal(run_binary(live, err, sizeof(err)), 2);
    assert_non_null(strstr(err, "--netns"));

    char *badrun[] = {"run", "--frobnicate", NULL};
    assert_int_equal(run_binary(badrun, err, sizeof(err)), 2);
    assert_non_null(strstr(err, "unknown option '--frobnicate'"));

    char *nomode[] = {"simulate", NULL};
    assert_int_equal(run_binary(nomode, err, sizeof(err)), 2);
    assert_non_null(strstr(err, "unknown mode"));

    char *ok[] = {"model", "--horizon-days", "2", "--runs", "1", "--sweep-points", "3", NULL};
    assert_int_equal(run_binary(ok, err, sizeof(err)), 0);
}

/* ------------------------------------------------------ --bench-json --- */

#define RT_STEADY_JSON                                                                         \
    "{\"bench\":\"runtime\",\"etcd_put_median_ms\":1.2,\"steady\":["                           \
    "{\"groups\":8,\"path\":\"peers\",\"median_ms\":0.3,\"etcd_requests_per_step\":0,"        \
    "\"etcd_cpu_ms_per_step\":0},"                                                             \
    "{\"groups\":8,\"path\":\"etcd\",\"median_ms\":40,\"etcd_requests_per_step\":30,"         \
    "\"etcd_cpu_ms_per_step\":3},"                                                             \
    "{\"groups\":32,\"path\":\"peers\",\"median_ms\":2.6,\"etcd_requests_per_step\":0,"       \
    "\"etcd_cpu_ms_per_step\":0},"                                                             \
    "{\"groups\":64,\"path\":\"peers\",\"median_ms\":-1,\"etcd_requests_per_step\":0,"        \
    "\"etcd_cpu_ms_per_step\":0}],\"recovery\":[]}\n"

/* Reads a figure of a model report's JSON: its value and origin. */
static double json_figure(const char *path, const char *name, const char **origin_p,
                          char *source, size_t srclen)
{
    json_error_t jerr;
    json_t *root = json_load_file(path, 0, &jerr);
    assert_non_null(root);
    json_t *f = json_object_get(json_object_get(root, "figures"), name);
    assert_non_null(f);
    double v = json_real_value(json_object_get(f, "value"));
    static char origin[16];
    snprintf(origin, sizeof(origin), "%s", json_string_value(json_object_get(f, "origin")));
    *origin_p = origin;
    snprintf(source, srclen, "%s", json_string_value(json_object_get(f, "source")));
    json_decref(root);
    return v;
}

static void bench_path(char *buf, size_t len, const char *name, const char *text)
{
    snprintf(buf, len, "%s/%s", test_dir, name);
    write_file(buf, text);
}

static void test_bench_json_curves(void **state)
{
    (void)state;
    char rt[512], mem1[512], mem2[512], err[600];
    graft_sim_bench_t b;
    graft_sim_figure_t figs[GRAFT_SIM_NFIGS];
    graft_sim_params_t p;

    bench_path(rt, sizeof(rt), "bench-rt.json", "runtime_bench banner\n" RT_STEADY_JSON);
    memset(&b, 0, sizeof(b));
    assert_int_equal(graft_sim_bench_load(&b, rt, err, sizeof(err)), GRAFT_OK);
    /* The etcd path and the failed size (-1 at 64 groups) are left out. */
    assert_int_equal(b.ncoord, 2);

    struct {
        int groups;
        double ms;
        const char *basis;
    } coord[] = {
        {4, 0.3, "clamped"},
        {8, 0.3, "at the smallest"},
        {16, 0.3 + 0.5 * (2.6 - 0.3), "interpolated"},
        {32, 2.6, "interpolated"},
        /* Beyond 32: 2.6 ms / 5 rounds per round, ceil(log2 128) = 7 rounds. */
        {128, 2.6 / 5 * 7, "extrapolated beyond 32 groups"},
    };
    for (size_t i = 0; i < sizeof(coord) / sizeof(coord[0]); i++) {
        graft_sim_params_default(&p);
        p.groups = coord[i].groups;
        graft_sim_bench_apply(&b, &p, NULL, figs);
        graft_sim_figure_t *f = &figs[GRAFT_SIM_FIG_COORDINATION];
        print_message("# %d groups: %g ms (%s)\n", coord[i].groups, f->value * 1e3, f->basis);
        assert_true(fabs(p.coordination_seconds - coord[i].ms / 1e3) < 1e-12);
        assert_true(f->value == p.coordination_seconds);
        assert_int_equal(f->origin, GRAFT_SIM_MEASURED);
        assert_string_equal(f->source, rt);
        assert_non_null(strstr(f->basis, coord[i].basis));
        /* Nothing measured the others. */
        assert_int_equal(figs[GRAFT_SIM_FIG_FORMATION].origin, GRAFT_SIM_ASSUMED);
        assert_int_equal(figs[GRAFT_SIM_FIG_CHECKPOINT].origin, GRAFT_SIM_ASSUMED);
        assert_int_equal(figs[GRAFT_SIM_FIG_HEAL].origin, GRAFT_SIM_ASSUMED);
    }

    /* Formation: the default run's per-size map (1 rank per group; 256
     * failed) and one --groups/--ranks run, by groups x ranks. */
    bench_path(mem1, sizeof(mem1), "bench-mem1.json",
               "{\"bench\":\"membership\",\"ranks_per_group\":1,\"ttl_ms\":2000,"
               "\"detect_median_ms\":2100,\"form_median_ms\":{\"8\":5,\"64\":50,\"256\":-1},"
               "\"requests_per_rank_step\":{\"8\":2,\"64\":2,\"256\":-1},\"fails\":1}");
    bench_path(mem2, sizeof(mem2), "bench-mem2.json",
               "{\"bench\":\"membership\",\"groups\":16,\"ranks_per_group\":8,\"steps\":10,"
               "\"form_median_ms\":20,\"form_p99_ms\":30,\"requests_per_group_step\":2.5,"
               "\"requests_per_rank_step\":0.4,\"bytes_read_per_rank_step\":300,\"fails\":0}");
    assert_int_equal(graft_sim_bench_load(&b, mem1, err, sizeof(err)), GRAFT_OK);
    assert_int_equal(graft_sim_bench_load(&b, mem2, err, sizeof(err)), GRAFT_OK);
    assert_int_equal(b.nform, 3);
    graft_sim_params_default(&p);
    p.groups = 4;
    p.gpus_per_group = 8; /* 32 ranks: 2/3 of the way from 8 to 64 in log2 */
    graft_sim_bench_apply(&b, &p, NULL, figs);
    assert_true(fabs(p.quorum_seconds - (5 + 2.0 / 3.0 * 45) / 1e3) < 1e-12);
    assert_int_equal(figs[GRAFT_SIM_FIG_FORMATION].origin, GRAFT_SIM_MEASURED);
    assert_non_null(strstr(figs[GRAFT_SIM_FIG_FORMATION].source, mem1));
    assert_non_null(strstr(figs[GRAFT_SIM_FIG_FORMATION].source, mem2));
    graft_sim_params_default(&p); /* 128 x 128: linear in G R beyond 16 x 8 */
    graft_sim_bench_apply(&b, &p, NULL, figs);
    assert_true(fabs(p.quorum_seconds - 20.0 * 16384 / 128 / 1e3) < 1e-12);
    assert_non_null(strstr(figs[GRAFT_SIM_FIG_FORMATION].basis, "extrapolated linearly"));

    /* A given parameter wins over the measurement. */
    graft_sim_params_default(&p);
    const char *given[64] = {0};
    given[graft_sim_params_index("quorum_seconds")] = "--quorum-seconds";
    graft_sim_bench_apply(&b, &p, given, figs);
    assert_true(p.quorum_seconds == 2.0);
    assert_int_equal(figs[GRAFT_SIM_FIG_FORMATION].origin, GRAFT_SIM_GIVEN);
    assert_string_equal(figs[GRAFT_SIM_FIG_FORMATION].source, "--quorum-seconds");

    /* Persist: the blocking snapshot per byte; runtime recovery: the heal. */
    char per[512], rec[512];
    bench_path(per, sizeof(per), "bench-persist.json",
               "{\"bench\":\"persist\",\"mib\":1024,\"reps\":3,\"block_ms\":100,"
               "\"memcpy_ms\":95,\"restore_MBps\":900}");
    bench_path(rec, sizeof(rec), "bench-rec.json",
               "{\"bench\":\"runtime\",\"steady\":[],\"recovery\":["
               "{\"mib\":64,\"total_s\":2,\"detect_s\":1,\"quorum_s\":0.1,\"transfer_s\":0.5},"
               "{\"mib\":256,\"total_s\":3,\"detect_s\":1,\"quorum_s\":0.1,\"transfer_s\":1}]}");
    assert_int_equal(graft_sim_bench_load(&b, per, err, sizeof(err)), GRAFT_OK);
    assert_int_equal(graft_sim_bench_load(&b, rec, err, sizeof(err)), GRAFT_OK);
    graft_sim_params_default(&p);
    graft_sim_bench_apply(&b, &p, NULL, figs);
    double gbs = 1024 * 1048576.0 / 1e9 / 0.1;
    assert_true(fabs(figs[GRAFT_SIM_FIG_CHECKPOINT].value - p.state_gb / gbs) < 1e-9);
    assert_true(fabs(graft_sim_checkpoint_cost(&p) - p.state_gb / gbs) < 1e-9);
    assert_int_equal(figs[GRAFT_SIM_FIG_CHECKPOINT].origin, GRAFT_SIM_MEASURED);
    assert_string_equal(figs[GRAFT_SIM_FIG_CHECKPOINT].source, per);
    assert_true(fabs(p.link_gb_s - 256 * 1048576.0 / 1e9) < 1e-12);
    assert_int_equal(figs[GRAFT_SIM_FIG_HEAL].origin, GRAFT_SIM_MEASURED);
    assert_string_equal(figs[GRAFT_SIM_FIG_HEAL].source, rec);
    /* The runtime file without steady sizes kept the earlier curve. */
    assert_int_equal(figs[GRAFT_SIM_FIG_COORDINATION].origin, GRAFT_SIM_MEASURED);
}

static void test_bench_json_command_line(void **state)
{
    (void)state;
    char rt[512], slow[512], out[512], out2[512], src[600];
    const char *origin;
    bench_path(rt, sizeof(rt), "bench-rt.json", RT_STEADY_JSON);
    snprintf(out, sizeof(out), "%s/out.json", test_dir);
    snprintf(out2, sizeof(out2), "%s/out2.json", test_dir);

    /* Without files: every figure assumed, the checkpoint a memcpy. */
    assert_int_equal(model_main("--horizon-days", "5", "--runs", "1", "--sweep-points", "3",
                                "--json", out, NULL),
                     0);
    graft_sim_params_t d;
    graft_sim_params_default(&d);
    const char *names[] = {"coordination_seconds_per_step", "formation_seconds_per_failure",
                           "checkpoint_blocking_seconds", "heal_gb_s_per_donor_link"};
    for (size_t i = 0; i < 4; i++) {
        (void)json_figure(out, names[i], &origin, src, sizeof(src));
        assert_string_equal(origin, "assumed");
        assert_string_equal(src, "");
    }
    double c = json_figure(out, "checkpoint_blocking_seconds", &origin, src, sizeof(src));
    assert_true(c != 30.0);
    assert_true(fabs(c - d.state_gb / 10.0) < 1e-9);
    double base = json_figure(out, "coordination_seconds_per_step", &origin, src, sizeof(src));
    assert_true(fabs(base - 7 * 0.5e-3) < 1e-12);

    /* Measured: 16 groups interpolate between 8 (0.3 ms) and 32 (2.6 ms). */
    assert_int_equal(model_main("--horizon-days", "5", "--runs", "1", "--sweep-points", "3",
                                "--groups", "16", "--bench-json", rt, "--json", out, NULL),
                     0);
    double v = json_figure(out, "coordination_seconds_per_step", &origin, src, sizeof(src));
    assert_true(fabs(v - 1.45e-3) < 1e-12);
    assert_string_equal(origin, "measured");
    assert_string_equal(src, rt);
    json_error_t jerr;
    json_t *root = json_load_file(out, 0, &jerr);
    assert_non_null(root);
    assert_true(fabs(json_real_value(json_object_get(json_object_get(root, "params"),
                                                     "coordination_seconds")) -
                     1.45e-3) < 1e-12);
    json_decref(root);

    /* A slow coordination costs goodput, and it shows as its share. */
    bench_path(slow, sizeof(slow), "bench-slow.json",
               "{\"bench\":\"runtime\",\"steady\":[{\"groups\":8,\"path\":\"peers\","
               "\"median_ms\":600},{\"groups\":32,\"path\":\"peers\",\"median_ms\":1200}]}");
    assert_int_equal(model_main("--horizon-days", "5", "--runs", "1", "--sweep-points", "3",
                                "--bench-json", slow, "--json", out2, NULL),
                     0);
    root = json_load_file(out2, 0, &jerr);
    assert_non_null(root);
    json_t *best = json_object_get(json_array_get(json_object_get(root, "strategies"), 2), "best");
    double frac = json_real_value(json_object_get(best, "coordination_frac"));
    /* 128 groups: 1200 / 5 x 7 = 1680 ms on a 6 s step. */
    print_message("# coordination share %.4f\n", frac);
    assert_true(frac > 0.8 * 1.68 / 7.68 && frac < 1.68 / 7.68 + 1e-9);
    json_decref(root);

    /* A flag wins over the measurement and says so. */
    assert_int_equal(model_main("--horizon-days", "5", "--runs", "1", "--sweep-points", "3",
                                "--bench-json", rt, "--coordination-seconds", "0.01", "--json",
                                out, NULL),
                     0);
    v = json_figure(out, "coordination_seconds_per_step", &origin, src, sizeof(src));
    assert_true(v == 0.01);
    assert_string_equal(origin, "given");
}

static void test_bench_json_malformed(void **state)
{
    (void)state;
    char path[512], err[600];
    graft_sim_bench_t b, before;
    struct {
        const char *text;
        graft_status_t want;
        const char *in_err;
    } bad[] = {
        {"{not json", GRAFT_EFORMAT, "not JSON"},
        {"{\"groups\":8}", GRAFT_EFORMAT, "no \"bench\""},
        {"{\"bench\":\"etcd\",\"put_ms\":1}", GRAFT_ENOTSUP, "bench 'etcd'"},
        {"{\"bench\":\"runtime\",\"steady\":{}}", GRAFT_EFORMAT, "'steady' is not an array"},
        {"{\"bench\":\"runtime\",\"steady\":[{\"groups\":8,\"path\":\"peers\"}]}", GRAFT_EFORMAT,
         "median_ms"},
        {"{\"bench\":\"runtime\",\"steady\":[{\"groups\":8,\"path\":\"peers\",\"median_ms\":-1}]}",
         GRAFT_EFORMAT, "no usable figure"},
        {"{\"bench\":\"runtime\",\"steady\":[{\"path\":\"peers\",\"median_ms\":1}]}",
         GRAFT_EFORMAT, "groups"},
        {"{\"bench\":\"runtime\",\"recovery\":[{\"mib\":8,\"transfer_s\":0}]}", GRAFT_ERANGE,
         "transfer_s"},
        {"{\"bench\":\"membership\",\"ranks_per_group\":1,\"form_median_ms\":\"x\"}",
         GRAFT_EFORMAT, "form_median_ms"},
        {"{\"bench\":\"membership\",\"ranks_per_group\":1,\"form_median_ms\":{\"x\":1}}",
         GRAFT_EFORMAT, "form_median_ms.x"},
        {"{\"bench\":\"membership\",\"form_median_ms\":3,\"groups\":2}", GRAFT_EFORMAT,
         "ranks_per_group"},
        {"{\"bench\":\"persist\",\"mib\":16,\"block_ms\":0}", GRAFT_ERANGE, "block_ms"},
    };
    snprintf(path, sizeof(path), "%s/bench.json", test_dir);
    memset(&b, 0, sizeof(b));
    before = b;
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        write_file(path, bad[i].text);
        graft_status_t st = graft_sim_bench_load(&b, path, err, sizeof(err));
        print_message("# %s -> %s: %s\n", bad[i].text, graft_status_name(st), err);
        assert_int_equal(st, bad[i].want);
        assert_true(strncmp(err, path, strlen(path)) == 0);
        assert_non_null(strstr(err, bad[i].in_err));
        assert_memory_equal(&b, &before, sizeof(b));
    }

    /* The binary: exit 2, and the message names the file. */
    char errtext[4096];
    write_file(path, "{\"bench\":\"runtime\",\"steady\":[{\"groups\":8,\"path\":\"peers\"}]}");
    char *args[] = {"model", "--bench-json", path, NULL};
    assert_int_equal(run_binary(args, errtext, sizeof(errtext)), 2);
    assert_non_null(strstr(errtext, path));
    assert_non_null(strstr(errtext, "median_ms"));
    char missing[512];
    snprintf(missing, sizeof(missing), "%s/missing.json", test_dir);
    char *args2[] = {"model", "--bench-json", missing, NULL};
    assert_int_equal(run_binary(args2, errtext, sizeof(errtext)), 2);
    assert_non_null(strstr(errtext, missing));
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

static int setup_dir(void **state)
{
    (void)state;
    snprintf(test_dir, sizeof(test_dir), "%s/graft-sim-test.XXXXXX",
             getenv("TMPDIR") != NULL ? getenv("TMPDIR") : "/tmp");
    return mkdtemp(test_dir) == NULL ? -1 : 0;
}

static int teardown_dir(void **state)
{
    (void)state;
    const char *names[] = {"params.json",   "missing.json",  "out.json",   "out.svg",
                           "cli-params.json", "schedule.json", "stderr.txt", "bench.json",
                           "out2.json",       "bench-rt.json", "bench-mem1.json",
                           "bench-mem2.json", "bench-persist.json", "bench-rec.json",
                           "bench-slow.json"};
    char path[600];
    for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++) {
        snprintf(path, sizeof(path), "%s/%s", test_dir, names[i]);
        unlink(path);
    }
    return rmdir(test_dir);
}

int main(int argc, char **argv)
{
    (void)argc;
    test_argv0 = argv[0];
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_closed_form_helpers),
        cmocka_unit_test(test_no_failures),
        cmocka_unit_test(test_checkpoint_restart_matches_daly),
        cmocka_unit_test(test_optimum_near_young_daly),
        cmocka_unit_test(test_p2p_renewal),
        cmocka_unit_test(test_strategy_order),
        cmocka_unit_test(test_same_seed_same_result),
        cmocka_unit_test(test_bad_arguments),
        cmocka_unit_test(test_params_files),
        cmocka_unit_test(test_params_from_benchmarks),
        cmocka_unit_test(test_model_command_line),
        cmocka_unit_test(test_run_command_line),
        cmocka_unit_test(test_binary_exit_status),
        cmocka_unit_test(test_bench_json_curves),
        cmocka_unit_test(test_bench_json_command_line),
        cmocka_unit_test(test_bench_json_malformed),
    };
    return cmocka_run_group_tests(tests, setup_dir, teardown_dir);
}
