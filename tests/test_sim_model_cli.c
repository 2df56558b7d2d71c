/*
 * graft-sim's two command lines: `graft-sim model` in-process (the flags,
 * --params and --bench-json files against flags, the JSON and SVG outputs,
 * bad usage) and `graft-sim run`'s parsing (every flag handed to the live
 * engine, bad usage never reaching it), and the built binary's exit
 * statuses.
 *
 * The program links the simulator's library part (libgraft-sim.a) and
 * stands in for its live engine; the fixture it shares with
 * test_sim_model_params.c is tests/support/sim_model_fixture.c.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <errno.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "sim/sim_cli.h"
#include "sim/live/sim_live.h"
#include "sim/model/sim_model.h"
#include "sim/model/sim_params.h"
#include "sim_model_fixture.h"

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

static void write_file(const char *path, const char *text)
{
    assert_int_equal(graft_test_sim_write(path, text), 0);
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
    char *buf = graft_test_sim_slurp(path);
    if (buf == NULL) {
        fail_msg("%s: %s", path, strerror(errno));
    }
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
    snprintf(json, sizeof(json), "%s/out.json", graft_test_sim_dir());
    snprintf(svg, sizeof(svg), "%s/out.svg", graft_test_sim_dir());
    snprintf(params, sizeof(params), "%s/cli-params.json", graft_test_sim_dir());
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
    snprintf(missing, sizeof(missing), "%s/nope.json", graft_test_sim_dir());
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
    snprintf(sched, sizeof(sched), "%s/schedule.json", graft_test_sim_dir());
    snprintf(persist, sizeof(persist), "%s/persist", graft_test_sim_dir());
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
    /* Spares and the spawn delay. */
    assert_int_equal(run_main("--spares", "2", "--spawn-delay-ms", "30000", NULL), 42);
    assert_int_equal(live_seen.spares, 2);
    assert_int_equal(live_seen.spawn_delay_ms, 30000);
    live_calls--;
    /* Defaults. */
    assert_int_equal(run_main(NULL), 42);
    assert_int_equal(live_seen.spares, 0);
    assert_int_equal(live_seen.spawn_delay_ms, 100);
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
    assert_int_equal(run_main("--spares", "-1", NULL), 2);
    assert_int_equal(run_main("--spares", "two", NULL), 2);
    assert_int_equal(run_main("--spares", NULL), 2);
    assert_int_equal(run_main("--spawn-delay-ms", "-5", NULL), 2);
    assert_int_equal(run_main("--spawn-delay-ms", "3600001", NULL), 2);
    /* A spare knows its group only once it took a slot: no torch world's
     * rendezvous, no group's namespace to start it in. */
    assert_int_equal(run_main("--spares", "1", "--torch-world", NULL), 2);
    assert_int_equal(run_main("--spares", "1", "--netns", NULL), 2);
    assert_int_equal(run_main("--spares", "0", "--torch-world", NULL), 42);
    live_calls--;
    /* Bad usage never reaches the engine. */
    assert_int_equal(live_calls, 2);
}

static void test_binary_exit_status(void **state)
{
    (void)state;
    char err[4096];
    char *bogus[] = {"model", "--link-gbs", "5", NULL};
    assert_int_equal(graft_test_sim_run_binary(bogus, err, sizeof(err)), 2);
    assert_non_null(strstr(err, "unknown option '--link-gbs'"));

    char *range[] = {"model", "--donors", "0", NULL};
    assert_int_equal(graft_test_sim_run_binary(range, err, sizeof(err)), 2);
    assert_non_null(strstr(err, "donors"));

    /* The live engine is built (tests/test_sim_live.c runs it); a flag it
     * cannot honour here is refused before anything starts. */
    char *live[] = {"run", "--groups", "2", "--ranks", "1", "--netns", "--etcd",
                    "http://127.0.0.1:1", NULL};
    assert_int_equal(graft_test_sim_run_binary(live, err, sizeof(err)), 2);
    assert_non_null(strstr(err, "--netns"));

    char *badrun[] = {"run", "--frobnicate", NULL};
    assert_int_equal(graft_test_sim_run_binary(badrun, err, sizeof(err)), 2);
    assert_non_null(strstr(err, "unknown option '--frobnicate'"));

    char *nomode[] = {"simulate", NULL};
    assert_int_equal(graft_test_sim_run_binary(nomode, err, sizeof(err)), 2);
    assert_non_null(strstr(err, "unknown mode"));

    char *ok[] = {"model", "--horizon-days", "2", "--runs", "1", "--sweep-points", "3", NULL};
    assert_int_equal(graft_test_sim_run_binary(ok, err, sizeof(err)), 0);
}

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
    snprintf(buf, len, "%s/%s", graft_test_sim_dir(), name);
    write_file(buf, text);
}

static void test_bench_json_command_line(void **state)
{
    (void)state;
    char rt[512], slow[512], out[512], out2[512], src[600];
    const char *origin;
    bench_path(rt, sizeof(rt), "bench-rt.json", GRAFT_TEST_SIM_RT_STEADY_JSON);
    snprintf(out, sizeof(out), "%s/out.json", graft_test_sim_dir());
    snprintf(out2, sizeof(out2), "%s/out2.json", graft_test_sim_dir());

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

/* The goodput of a P2P strategy in the report's "spares" comparison. */
static void spares_goodput(const char *path, int strategy, double *without_p, double *with_p)
{
    json_error_t jerr;
    json_t *root = json_load_file(path, 0, &jerr);
    assert_non_null(root);
    json_t *e = json_array_get(json_object_get(json_object_get(root, "spares"), "strategies"),
                               (size_t)strategy);
    assert_non_null(e);
    *without_p = json_real_value(json_object_get(json_object_get(e, "without"), "goodput"));
    *with_p = json_real_value(json_object_get(json_object_get(e, "with"), "goodput"));
    json_decref(root);
}

/* A graft-sim run --spares report gives spare_seconds (its promotions'
 * median); with spares each heal's replacement is up sooner, so both P2P
 * strategies gain goodput; without a promotion the file is refused. */
static void test_spares_command_line(void **state)
{
    (void)state;
    char run[512], bad[512], none[512], out[512], src[600];
    const char *origin;
    bench_path(run, sizeof(run), "sim-run.json",
               "{\"bench\":\"graft-sim-run\",\"verdict\":\"bit-exact\",\"spares\":{"
               "\"promote_seconds\":{\"median\":0.02,\"max\":0.04,\"n\":3}}}");
    bench_path(bad, sizeof(bad), "sim-run-bad.json",
               "{\"bench\":\"graft-sim-run\",\"spares\":null}");
    bench_path(none, sizeof(none), "sim-run-none.json",
               "{\"bench\":\"graft-sim-run\",\"spares\":{\"promote_seconds\":"
               "{\"median\":null,\"max\":null,\"n\":0}}}");
    snprintf(out, sizeof(out), "%s/spares.json", graft_test_sim_dir());

    /* Assumed without a file: 1 s, and the comparison is there. */
    assert_int_equal(model_main("--horizon-days", "5", "--runs", "2", "--sweep-points", "3",
                                "--json", out, NULL),
                     0);
    double v = json_figure(out, "spare_promotion_seconds", &origin, src, sizeof(src));
    assert_true(v == 1.0);
    assert_string_equal(origin, "assumed");
    double without, with;
    for (int s = 0; s < 2; s++) {
        spares_goodput(out, s, &without, &with);
        assert_true(with > without && without > 0.5);
    }

    /* Measured from the run's report, under --bench-json and --params. */
    assert_int_equal(model_main("--horizon-days", "5", "--runs", "2", "--sweep-points", "3",
                                "--bench-json", run, "--json", out, NULL),
                     0);
    v = json_figure(out, "spare_promotion_seconds", &origin, src, sizeof(src));
    assert_true(v == 0.02);
    assert_string_equal(origin, "measured");
    assert_string_equal(src, run);
    assert_int_equal(model_main("--horizon-days", "5", "--runs", "1", "--sweep-points", "3",
                                "--params", run, "--json", out, NULL),
                     0);
    v = json_figure(out, "spare_promotion_seconds", &origin, src, sizeof(src));
    assert_true(v == 0.02);
    assert_string_equal(origin, "given");

    /* A flag wins; a report without promotions is refused. */
    assert_int_equal(model_main("--horizon-days", "5", "--runs", "1", "--sweep-points", "3",
                                "--bench-json", run, "--spare-seconds", "7", "--json", out,
                                NULL),
                     0);
    v = json_figure(out, "spare_promotion_seconds", &origin, src, sizeof(src));
    assert_true(v == 7.0);
    assert_string_equal(origin, "given");
    assert_int_equal(model_main("--bench-json", bad, NULL), 2);
    assert_int_equal(model_main("--bench-json", none, NULL), 2);
    assert_int_equal(model_main("--spare-seconds", "-1", NULL), 2);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_model_command_line),
        cmocka_unit_test(test_run_command_line),
        cmocka_unit_test(test_binary_exit_status),
        cmocka_unit_test(test_bench_json_command_line),
        cmocka_unit_test(test_spares_command_line),
    };
    return cmocka_run_group_tests(tests, graft_test_sim_setup, graft_test_sim_teardown);
}
