/*
 * graft-sim model's parameters from files: --params (a JSON object, or a
 * benchmark's --json output mapped onto the parameters it measures) and
 * --bench-json (measured curves by size, interpolated and extrapolated for
 * the model's groups and ranks), and the errors of malformed files.
 *
 * The program links the simulator's library part (libgraft-sim.a); the
 * fixture it shares with test_sim_model_cli.c is tests/support/
 * sim_model_fixture.c.
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
#include "sim_model_fixture.h"

static void write_file(const char *path, const char *text)
{
    assert_int_equal(graft_test_sim_write(path, text), 0);
}

static void test_params_files(void **state)
{
    (void)state;
    char path[512], err[300];
    graft_sim_params_t p, orig;
    graft_sim_params_default(&orig);
    snprintf(path, sizeof(path), "%s/params.json", graft_test_sim_dir());

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
    snprintf(path, sizeof(path), "%s/missing.json", graft_test_sim_dir());
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
    snprintf(path, sizeof(path), "%s/bench.json", graft_test_sim_dir());

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

static void bench_path(char *buf, size_t len, const char *name, const char *text)
{
    snprintf(buf, len, "%s/%s", graft_test_sim_dir(), name);
    write_file(buf, text);
}

static void test_bench_json_curves(void **state)
{
    (void)state;
    char rt[512], mem1[512], mem2[512], err[600];
    graft_sim_bench_t b;
    graft_sim_figure_t figs[GRAFT_SIM_NFIGS];
    graft_sim_params_t p;

    bench_path(rt, sizeof(rt), "bench-rt.json",
               "runtime_bench banner\n" GRAFT_TEST_SIM_RT_STEADY_JSON);
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
    snprintf(path, sizeof(path), "%s/bench.json", graft_test_sim_dir());
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
    assert_int_equal(graft_test_sim_run_binary(args, errtext, sizeof(errtext)), 2);
    assert_non_null(strstr(errtext, path));
    assert_non_null(strstr(errtext, "median_ms"));
    char missing[512];
    snprintf(missing, sizeof(missing), "%s/missing.json", graft_test_sim_dir());
    char *args2[] = {"model", "--bench-json", missing, NULL};
    assert_int_equal(graft_test_sim_run_binary(args2, errtext, sizeof(errtext)), 2);
    assert_non_null(strstr(errtext, missing));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_params_files),
        cmocka_unit_test(test_params_from_benchmarks),
        cmocka_unit_test(test_bench_json_curves),
        cmocka_unit_test(test_bench_json_malformed),
    };
    return cmocka_run_group_tests(tests, graft_test_sim_setup, graft_test_sim_teardown);
}
