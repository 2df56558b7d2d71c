/*
 * Tests of `graft-sim run` that run no trainer: its plans, the verdict's
 * pieces and the built binary's refusals.
 *
 *  - Schedules: the same seed plans the same events, another seed others;
 *    --random-failures covers every kind; malformed schedule files get a
 *    precise status and message; the network kinds need --netns.
 *  - The verdict compares commits within each epoch between disasters
 *    (hand-written hash logs); the stall measure of an etcd leader kill is
 *    checked on made-up samples.
 *  - The built binary: bad flags and schedules exit 2 with a message; its
 *    plan alone (GRAFT_SIM_PLAN_ONLY) is the same for the same seed.
 *
 * The live runs are in test_sim_live.c, those under --netns in
 * test_sim_netns.c; the fixture the three share is test_sim_util.h.
 */
#include "test_sim_util.h"

#include <math.h>
#include <sys/stat.h>

#include "sim/live/sim_live_int.h"
#include "sim/live/sim_schedule.h"

/* -------------------------------------------------------------- plans --- */

/* The options of the plans below: 4 groups x 2 ranks, 500 steps, seed 1. */
static graft_sim_live_opts_t base_opts(void)
{
    graft_sim_live_opts_t o;
    memset(&o, 0, sizeof(o));
    o.groups = 4;
    o.ranks = 2;
    o.steps = 500;
    o.seed = 1;
    return o;
}

/* The plan of @o and schedule file @json, as compact JSON (free it). */
static char *plan_string(const graft_sim_live_opts_t *o, const char *json)
{
    graft_sim_schedule_t *s = NULL;
    char *err = NULL;
    assert_int_equal(graft_sim_schedule_plan(o, json, &s, &err), GRAFT_OK);
    json_t *j = graft_sim_schedule_json(s);
    assert_non_null(j);
    char *txt = json_dumps(j, JSON_COMPACT);
    json_decref(j);
    graft_sim_schedule_destroy(s);
    free(err);
    return txt;
}

/* ---------------------------------------------------------- schedules --- */

static void test_schedule_same_seed_same_plan(void **state)
{
    (void)state;
    graft_sim_live_opts_t o = base_opts();
    o.random_failures = 60;
    o.seed = 42;
    const char *file = "{\"events\":[{\"kind\":\"kill_rank\",\"at_step\":10},"
                       "{\"kind\":\"hang\",\"at_ms\":500}],\"random_kill_rate_per_step\":0.02}";
    char *a = plan_string(&o, file), *b = plan_string(&o, file);
    assert_string_equal(a, b);
    o.seed = 43;
    char *c = plan_string(&o, file);
    assert_string_not_equal(a, c);
    free(a);
    free(b);
    free(c);
}

static void test_schedule_random_covers_every_kind(void **state)
{
    (void)state;
    graft_sim_live_opts_t o = base_opts();
    o.random_failures = 50;
    graft_sim_schedule_t *s = NULL;
    char *err = NULL;
    assert_int_equal(graft_sim_schedule_plan(&o, NULL, &s, &err), GRAFT_OK);
    assert_int_equal(s->n_events, 50);
    size_t by_kind[GRAFT_SIM_KIND_COUNT] = {0};
    long long prev = -1;
    for (size_t i = 0; i < s->n_events; i++) {
        const graft_sim_event_t *e = &s->events[i];
        by_kind[e->kind]++;
        assert_true(e->at_step >= prev); /* sorted by step */
        assert_true(e->at_step >= 0 && e->at_step < o.steps);
        prev = e->at_step;
        if (e->kind == GRAFT_SIM_HANG) {
            assert_true(e->duration_ms >= 1500); /* longer than the 1 s lease */
        }
    }
    for (int k = 0; k < GRAFT_SIM_KIND_COUNT; k++) {
        if (k == GRAFT_SIM_PARTITION || k == GRAFT_SIM_ISOLATE || k == GRAFT_SIM_NETEM ||
            k == GRAFT_SIM_THROTTLE || k == GRAFT_SIM_CUT_DONOR ||
            k == GRAFT_SIM_ETCD_LEADER_KILL || k == GRAFT_SIM_LOSE_DISKS) {
            /* no --netns, one etcd member, no object store */
            assert_int_equal(by_kind[k], 0);
        } else {
            assert_true(by_kind[k] > 0);
        }
    }
    /* A cluster of 3 loses its leader instead of restarting whole. */
    graft_sim_schedule_destroy(s);
    o.etcd_members = 3;
    assert_int_equal(graft_sim_schedule_plan(&o, NULL, &s, &err), GRAFT_OK);
    memset(by_kind, 0, sizeof(by_kind));
    for (size_t i = 0; i < s->n_events; i++) {
        by_kind[s->events[i].kind]++;
    }
    assert_true(by_kind[GRAFT_SIM_ETCD_LEADER_KILL] > 0);
    assert_int_equal(by_kind[GRAFT_SIM_ETCD_RESTART], 0);
    o.etcd_members = 0;
    /* With an external etcd it cannot restart etcd; with one group there
     * is no donor to kill. */
    graft_sim_schedule_destroy(s);
    o.etcd_url = "http://127.0.0.1:1";
    o.groups = 1;
    assert_int_equal(graft_sim_schedule_plan(&o, NULL, &s, &err), GRAFT_OK);
    for (size_t i = 0; i < s->n_events; i++) {
        assert_int_not_equal(s->events[i].kind, GRAFT_SIM_ETCD_RESTART);
        assert_int_not_equal(s->events[i].kind, GRAFT_SIM_KILL_DONOR);
    }
    graft_sim_schedule_destroy(s);
    free(err);
}

static void test_schedule_file_round_trip(void **state)
{
    (void)state;
    graft_sim_live_opts_t o = base_opts();
    o.random_failures = 12;
    char *a = plan_string(&o, NULL);
    /* The plan, reloaded as a schedule file, is the same plan. */
    char *file = NULL;
    assert_true(asprintf(&file, "{\"events\":%s}", a) > 0);
    o.random_failures = 0;
    char *b = plan_string(&o, file);
    assert_string_equal(a, b);
    free(a);
    free(b);
    free(file);
}

static void expect_bad(const graft_sim_live_opts_t *o, const char *json, graft_status_t want,
                       const char *needle)
{
    graft_sim_schedule_t *s = NULL;
    char *err = NULL;
    assert_int_equal(graft_sim_schedule_plan(o, json, &s, &err), want);
    assert_null(s);
    assert_non_null(err);
    if (strstr(err, needle) == NULL) {
        fail_msg("error '%s' does not mention '%s' (schedule %s)", err, needle, json);
    }
    free(err);
}

static void test_schedule_malformed(void **state)
{
    (void)state;
    graft_sim_live_opts_t o = base_opts();
    expect_bad(&o, "{\"events\":[", GRAFT_EINVAL, "line 1");
    expect_bad(&o, "[]", GRAFT_EINVAL, "not a JSON object");
    expect_bad(&o, "{\"evnts\":[]}", GRAFT_EINVAL, "unknown key 'evnts'");
    expect_bad(&o, "{\"events\":{}}", GRAFT_EINVAL, "events: not an array");
    expect_bad(&o, "{\"events\":[3]}", GRAFT_EINVAL, "events[0]: not an object");
    expect_bad(&o, "{\"events\":[{\"at_step\":1}]}", GRAFT_EINVAL, "events[0].kind");
    expect_bad(&o, "{\"events\":[{\"kind\":\"nuke\",\"at_step\":1}]}", GRAFT_EINVAL,
               "unknown kind 'nuke'");
    expect_bad(&o, "{\"events\":[{\"kind\":\"kill_rank\"}]}", GRAFT_EINVAL, "exactly one");
    expect_bad(&o, "{\"events\":[{\"kind\":\"kill_rank\",\"at_step\":1,\"at_ms\":1}]}",
               GRAFT_EINVAL, "exactly one");
    expect_bad(&o, "{\"events\":[{\"kind\":\"kill_rank\",\"at_step\":500}]}", GRAFT_EINVAL,
               "at_step");
    expect_bad(&o, "{\"events\":[{\"kind\":\"kill_rank\",\"at_step\":-1}]}", GRAFT_EINVAL,
               "non-negative");
    expect_bad(&o, "{\"events\":[{\"kind\":\"kill_rank\",\"at_step\":\"1\"}]}", GRAFT_EINVAL,
               "non-negative");
    expect_bad(&o, "{\"events\":[{\"kind\":\"kill_rank\",\"group\":4,\"at_step\":1}]}",
               GRAFT_EINVAL, "events[0].group");
    expect_bad(&o, "{\"events\":[{\"kind\":\"kill_rank\",\"rank\":2,\"at_step\":1}]}",
               GRAFT_EINVAL, "events[0].rank");
    expect_bad(&o, "{\"events\":[{\"kind\":\"kill_rank\",\"at_step\":1,\"color\":1}]}",
               GRAFT_EINVAL, "unknown key 'color'");
    expect_bad(&o, "{\"events\":[{\"kind\":\"kill_rank\",\"at_step\":1,\"corrupt\":true}]}",
               GRAFT_EINVAL, "only a disaster");
    expect_bad(&o, "{\"events\":[{\"kind\":\"disaster\",\"at_step\":1,\"corrupt\":1}]}",
               GRAFT_EINVAL, "not a boolean");
    expect_bad(&o, "{\"random_failures\":-3}", GRAFT_EINVAL, "random_failures");
    expect_bad(&o, "{\"random_kill_rate_per_step\":2}", GRAFT_EINVAL,
               "random_kill_rate_per_step");
    expect_bad(&o, "{\"events\":[{\"kind\":\"partition\",\"group\":1,\"at_step\":1}]}",
               GRAFT_ENOTSUP, "needs --netns");
    expect_bad(&o, "{\"events\":[{\"kind\":\"etcd_leader_kill\",\"at_step\":1}]}",
               GRAFT_ENOTSUP, "--etcd-members 3 or more");
    o.etcd_members = 3;
    expect_bad(&o, "{\"events\":[{\"kind\":\"etcd_restart\",\"at_step\":1}]}", GRAFT_ENOTSUP,
               "of one member");
    o.etcd_members = 0;
    o.etcd_url = "http://127.0.0.1:1";
    expect_bad(&o, "{\"events\":[{\"kind\":\"etcd_restart\",\"at_step\":1}]}", GRAFT_ENOTSUP,
               "embedded etcd");
    o.groups = 1;
    expect_bad(&o, "{\"events\":[{\"kind\":\"kill_donor\",\"at_step\":1}]}", GRAFT_ENOTSUP,
               "2 groups");
}

/*
 * The network kinds: with --netns a random plan draws partition, isolate,
 * throttle and cut_donor (cut_donor only with 3 groups or more: the
 * recipient needs another donor), never netem (it needs a kernel module a
 * --netns host may lack; a schedule file asks for it); a schedule file's
 * netem and throttle target a group (a rank given is dropped), cut_donor a
 * group and the donor's rank, each with a default duration (cut_donor's past
 * the 5 s donor stall timeout); without --netns or with 2 groups they are
 * refused with the reason.
 */
static void test_schedule_network_kinds(void **state)
{
    (void)state;
    graft_sim_live_opts_t o = base_opts();
    o.netns = 1;
    o.random_failures = 50;
    graft_sim_schedule_t *s = NULL;
    char *err = NULL;
    size_t by_kind[GRAFT_SIM_KIND_COUNT] = {0};
    assert_int_equal(graft_sim_schedule_plan(&o, NULL, &s, &err), GRAFT_OK);
    for (size_t i = 0; i < s->n_events; i++) {
        by_kind[s->events[i].kind]++;
    }
    assert_true(by_kind[GRAFT_SIM_PARTITION] > 0);
    assert_true(by_kind[GRAFT_SIM_ISOLATE] > 0);
    assert_true(by_kind[GRAFT_SIM_THROTTLE] > 0);
    assert_true(by_kind[GRAFT_SIM_CUT_DONOR] > 0);
    assert_int_equal(by_kind[GRAFT_SIM_NETEM], 0);
    graft_sim_schedule_destroy(s);
    o.groups = 2;
    assert_int_equal(graft_sim_schedule_plan(&o, NULL, &s, &err), GRAFT_OK);
    for (size_t i = 0; i < s->n_events; i++) {
        assert_int_not_equal(s->events[i].kind, GRAFT_SIM_CUT_DONOR);
    }
    graft_sim_schedule_destroy(s);

    o.groups = 4;
    o.random_failures = 0;
    assert_int_equal(graft_sim_schedule_plan(&o,
                                             "{\"events\":["
                                             "{\"kind\":\"netem\",\"group\":2,\"rank\":1,"
                                             "\"at_step\":5},"
                                             "{\"kind\":\"throttle\",\"group\":1,\"at_step\":6},"
                                             "{\"kind\":\"cut_donor\",\"group\":3,\"rank\":1,"
                                             "\"at_step\":7}]}",
                                             &s, &err),
                     GRAFT_OK);
    assert_int_equal(s->n_events, 3);
    assert_int_equal(s->events[0].kind, GRAFT_SIM_NETEM);
    assert_int_equal(s->events[0].group, 2);
    assert_int_equal(s->events[0].rank, -1);
    assert_true(s->events[0].duration_ms >= 2000);
    assert_int_equal(s->events[1].kind, GRAFT_SIM_THROTTLE);
    assert_int_equal(s->events[1].rank, -1);
    assert_true(s->events[1].duration_ms >= 3000);
    assert_int_equal(s->events[2].kind, GRAFT_SIM_CUT_DONOR);
    assert_int_equal(s->events[2].group, 3);
    assert_int_equal(s->events[2].rank, 1);
    assert_true(s->events[2].duration_ms > 5000);
    graft_sim_schedule_destroy(s);
    free(err);

    expect_bad(&o, "{\"events\":[{\"kind\":\"cut_donor\",\"group\":1,\"at_step\":1,"
                   "\"duration_ms\":-5}]}",
               GRAFT_EINVAL, "non-negative");
    o.groups = 2;
    expect_bad(&o, "{\"events\":[{\"kind\":\"cut_donor\",\"group\":1,\"at_step\":1}]}",
               GRAFT_ENOTSUP, "at least 3 groups");
    o.groups = 4;
    o.netns = 0;
    expect_bad(&o, "{\"events\":[{\"kind\":\"cut_donor\",\"group\":1,\"at_step\":1}]}",
               GRAFT_ENOTSUP, "needs --netns");
    expect_bad(&o, "{\"events\":[{\"kind\":\"netem\",\"group\":1,\"at_step\":1}]}",
               GRAFT_ENOTSUP, "needs --netns");
    expect_bad(&o, "{\"events\":[{\"kind\":\"throttle\",\"group\":1,\"at_step\":1}]}",
               GRAFT_ENOTSUP, "needs --netns");
}

/* ------------------------------------------------ the verdict's logs --- */

static long write_log(const char *dir, int g, const char *text, int append)
{
    char path[PATH_MAX + 64];
    snprintf(path, sizeof(path), "%s/commits-g%d-r0.txt", dir, g);
    FILE *f = fopen(path, append ? "a" : "w");
    assert_non_null(f);
    assert_true(fputs(text, f) >= 0);
    long end = ftell(f);
    assert_int_equal(fclose(f), 0);
    return end;
}

#define H(c) #c #c #c #c #c #c #c #c #c #c #c #c #c #c #c #c

/*
 * Commits are compared within each epoch between disasters: step 3 was
 * committed as ccc.. before the disaster and recomputed as ddd.. after it
 * (allowed: another set of groups may compute it), while in each epoch
 * both groups must agree, and a disagreement inside the second epoch is a
 * mismatch. The same logs read as one epoch (no disaster noted) would call
 * the recomputed step a mismatch.
 */
static void test_verdict_epochs(void **state)
{
    (void)state;
    char dir[PATH_MAX + 16];
    snprintf(dir, sizeof(dir), "%s/epochs", tmpdir);
    assert_int_equal(mkdir(dir, 0755), 0);
    long offs[2];
    offs[0] = write_log(dir, 0, "1 " H(a) "\n2 " H(b) "\n3 " H(c) "\n", 0);
    offs[1] = write_log(dir, 1, "1 " H(a) "\n2 " H(b) "\n", 0);
    write_log(dir, 0, "3 " H(d) "\n4 " H(e) "\n", 1);
    write_log(dir, 1, "3 " H(d) "\n4 " H(e) "\n", 1);

    graft_sim_result_t res;
    memset(&res, 0, sizeof(res));
    res.groups = 2;
    res.ranks = 1;
    res.n_disasters = 1;
    res.disaster_offs = offs;
    graft_sim_verdict_scan_logs(&res, dir, 2, 1, 1);
    assert_int_equal(res.commit_mismatches, 0);
    assert_int_equal(res.commit_checks, 4); /* steps 1, 2; then 3, 4 */
    assert_int_equal(res.n_epochs, 2);
    assert_int_equal(res.epoch_checks[0], 2);
    assert_int_equal(res.epoch_checks[1], 2);
    assert_int_equal(res.steps_committed, 4);
    assert_int_equal(res.steps_lost, 1); /* group 0 committed step 3 twice */
    free(res.epoch_checks);

    /* One epoch: the recomputed step 3 differs from the first commit. */
    memset(&res, 0, sizeof(res));
    graft_sim_verdict_scan_logs(&res, dir, 2, 1, 1);
    assert_int_equal(res.n_epochs, 1);
    assert_int_equal(res.commit_mismatches, 2); /* group 0's and group 1's step 3 */
    free(res.epoch_checks);

    /* Inside the second epoch the groups disagree on step 4: a mismatch,
     * and the elastic verdict fails on it. */
    write_log(dir, 1, "1 " H(a) "\n2 " H(b) "\n3 " H(d) "\n4 " H(f) "\n", 0);
    memset(&res, 0, sizeof(res));
    res.groups = 2;
    res.ranks = 1;
    res.n_disasters = 1;
    res.disaster_offs = offs;
    graft_sim_verdict_scan_logs(&res, dir, 2, 1, 1);
    assert_int_equal(res.commit_mismatches, 1);
    assert_int_equal(res.epoch_checks[1], 2);
    free(res.epoch_checks);
    char *hashes[2] = {H(e), H(e)};
    res.rank_hashes = hashes;
    res.completed = 1;
    graft_sim_live_opts_t o = base_opts();
    o.groups = 2;
    o.ranks = 1;
    o.mode = GRAFT_SIM_LIVE_ELASTIC;
    const char *why = NULL;
    assert_string_equal(graft_sim_verdict_judge(&o, &res, NULL, &why), "FAILED");
    assert_string_equal(why, "groups disagreed on a committed step");
    free(res.final_hash);
}

/* ------------------------------------------------- the stall measure --- */

/*
 * The stall measure on made-up samples: the step moves every 20 ms except
 * from the sample at 1.98 s to the one at 3.10 s (a stall of 1.12 s); a
 * leader kill at 1.9 s, seen replaced at 2.9 s.
 */
static void test_stall_measure(void **state)
{
    (void)state;
    graft_sim_sample_t smp[400];
    long long step = 0;
    for (int i = 0; i < 400; i++) {
        smp[i].t = i * 0.02;
        step += smp[i].t < 1.99 || smp[i].t > 3.09;
        smp[i].step = step;
    }
    graft_sim_injected_t inj[2];
    memset(inj, 0, sizeof(inj));
    inj[0].t = 1.9;
    inj[0].ev.kind = GRAFT_SIM_ETCD_LEADER_KILL;
    inj[0].etcd_elected_t = 2.9;
    inj[1].t = 3.5; /* a kill_rank within the window: not isolated */
    inj[1].ev.kind = GRAFT_SIM_KILL_RANK;
    inj[1].etcd_elected_t = -1;
    graft_sim_result_t res;
    memset(&res, 0, sizeof(res));
    res.samples = smp;
    res.n_samples = 400;
    res.injected = inj;
    res.n_injected = 2;
    assert_true(fabs(graft_sim_stall_after(&res, 1.9) - 1.12) < 1e-6);
    assert_true(fabs(graft_sim_stall_resolution(&res, 1.9) - 0.02) < 1e-6);
    assert_true(fabs(graft_sim_stall_after(&res, 4.0) - 0.02) < 1e-6); /* after it */
    /* A kill inside the standstill owns only what is left of it. */
    assert_true(fabs(graft_sim_stall_after(&res, 2.5) - 0.6) < 1e-6);
    assert_true(isnan(graft_sim_stall_after(&res, 9.0)));              /* past the samples */
    graft_sim_leader_summary_t ls;
    graft_sim_leader_summary(&res, &ls);
    assert_int_equal(ls.n, 1);
    assert_int_equal(ls.n_isolated, 0);
    assert_true(isnan(ls.stall_median));
    assert_int_equal(ls.n_elected, 1);
    assert_true(fabs(ls.elect_median - 1.0) < 1e-9);
    assert_true(fabs(ls.step_gap_median - 0.02) < 1e-6);
    inj[1].t = 5.0; /* outside the window now */
    graft_sim_leader_summary(&res, &ls);
    assert_int_equal(ls.n_isolated, 1);
    assert_true(fabs(ls.stall_median - 1.12) < 1e-6);
    assert_true(fabs(ls.stall_max - 1.12) < 1e-6);
}

/* -------------------------------------------------------- the binary --- */

static void test_binary_rejects_bad_input(void **state)
{
    (void)state;
    char *out = NULL;
    /* --netns runs its own etcd, reachable from the namespaces. */
    const char *netns[] = {"--netns", "--etcd", "http://127.0.0.1:1", NULL};
    assert_int_equal(run_sim(netns, NULL, &out), 2);
    assert_non_null(strstr(out, "--netns"));
    free(out);

    /* --etcd-members sizes the embedded etcd only; every URL of a list
     * is checked. */
    const char *both[] = {"--etcd-members", "3", "--etcd", "http://127.0.0.1:1", NULL};
    assert_int_equal(run_sim(both, NULL, &out), 2);
    assert_non_null(strstr(out, "--etcd-members"));
    free(out);
    const char *list[] = {"--etcd", "http://127.0.0.1:1,ftp://127.0.0.1:2", NULL};
    assert_int_equal(run_sim(list, NULL, &out), 2);
    assert_non_null(strstr(out, "'ftp://127.0.0.1:2' is not"));
    free(out);
    const char *zero[] = {"--etcd-members", "0", NULL};
    assert_int_equal(run_sim(zero, NULL, &out), 2);
    free(out);

    /* A spare's group is known only once it takes a slot. */
    const char *spares[] = {"--spares", "1", "--torch-world", NULL};
    assert_int_equal(run_sim(spares, NULL, &out), 2);
    assert_non_null(strstr(out, "--spares cannot be combined with --torch-world"));
    free(out);
    const char *follow[] = {"--follow", NULL};
    assert_int_equal(run_sim(follow, NULL, &out), 2);
    assert_non_null(strstr(out, "--follow needs --spares"));
    free(out);
    const char *delay[] = {"--spawn-delay-ms", "soon", NULL};
    assert_int_equal(run_sim(delay, NULL, &out), 2);
    assert_non_null(strstr(out, "--spawn-delay-ms: 'soon' is not an integer"));
    free(out);

    char bad[PATH_MAX + 32];
    snprintf(bad, sizeof(bad), "%s/bad.json", tmpdir);
    FILE *f = fopen(bad, "w");
    assert_non_null(f);
    fputs("{\"events\":[{\"kind\":\"kill_rank\",\"group\":9,\"at_step\":1}]}", f);
    fclose(f);
    const char *sched[] = {"--schedule", bad, NULL};
    assert_int_equal(run_sim(sched, NULL, &out), 2);
    assert_non_null(strstr(out, "events[0].group"));
    free(out);

    /* The knobs in the environment are checked before anything starts. */
    const char *small[] = {"--groups", "1", "--ranks", "1", "--steps", "5", NULL};
    const char *knob_env[][2] = {{"GRAFT_SIM_STEP_MS=5ms", NULL},
                                 {"GRAFT_SIM_BALLAST_MIB=4097", NULL}};
    const char *knob_says[] = {"GRAFT_SIM_STEP_MS: '5ms' is not 0..60000",
                               "GRAFT_SIM_BALLAST_MIB: '4097' is not 0..4096"};
    for (size_t k = 0; k < ARRAY_SIZE(knob_says); k++) {
        assert_int_equal(run_sim(small, knob_env[k], &out), 2);
        if (strstr(out, knob_says[k]) == NULL)
            fail_msg("no \"%s\" in:\n%s", knob_says[k], out);
        free(out);
    }

    /* A trainer that does not exist is an error, not a verdict. */
    const char *args[] = {"--groups", "1", "--ranks", "1", "--steps", "5", NULL};
    const char *env[] = {"GRAFT_SIM_TRAINER=/nonexistent/trainer", NULL};
    assert_int_not_equal(run_sim(args, env, &out), 0);
    free(out);
}

static void test_plan_only_is_deterministic(void **state)
{
    (void)state;
    const char *args[] = {"--random-failures", "50", "--seed", "9", NULL};
    const char *env[] = {"GRAFT_SIM_PLAN_ONLY=1", NULL};
    char *a = NULL, *b = NULL;
    assert_int_equal(run_sim(args, env, &a), 0);
    assert_int_equal(run_sim(args, env, &b), 0);
    assert_string_equal(a, b);
    json_error_t jerr;
    json_t *j = json_loads(a, 0, &jerr);
    assert_non_null(j);
    assert_int_equal(json_array_size(j), 50);
    json_decref(j);
    free(a);
    free(b);
}

/* ---------------------------------------------------------------- main --- */

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_schedule_same_seed_same_plan),
        cmocka_unit_test(test_schedule_random_covers_every_kind),
        cmocka_unit_test(test_schedule_file_round_trip),
        cmocka_unit_test(test_schedule_malformed),
        cmocka_unit_test(test_schedule_network_kinds),
        cmocka_unit_test(test_verdict_epochs),
        cmocka_unit_test(test_stall_measure),
        cmocka_unit_test(test_binary_rejects_bad_input),
        cmocka_unit_test(test_plan_only_is_deterministic),
    };
    return sim_run_tests("plan", tests, ARRAY_SIZE(tests), sim_teardown);
}
