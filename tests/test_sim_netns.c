/*
 * Runs of `graft-sim run --netns`, the groups in network namespaces of
 * their own (as root with "ip netns"; each test skips without them):
 * namespaces never outlive a run; a partition, an isolated group, a
 * throttled link under a heal, netem (where the kernel has it) and a donor
 * cut off its recipient mid-pull all end bit-exact.
 *
 * Runs without namespaces are in test_sim_live.c; the fixture the
 * simulator's test programs share is test_sim_util.h.
 */
#include "test_sim_util.h"

#include <signal.h>

/* ------------------------------------------------------------ --netns --- */

/* What --netns needs: root, "ip netns", and the right to make a namespace
 * (a container may be root without it). The tests skip without them. */
static int netns_usable(void)
{
    char cmd[160];
    if (geteuid() != 0)
        return 0;
    snprintf(cmd, sizeof(cmd),
             "ip netns add graft-probe-%ld >/dev/null 2>&1 && "
             "ip netns del graft-probe-%ld >/dev/null 2>&1",
             (long)getpid(), (long)getpid());
    return system(cmd) == 0;
}

static int netns_exists(long pid)
{
    char path[64];
    snprintf(path, sizeof(path), "/var/run/netns/gsim%ld-0", pid);
    return access(path, F_OK) == 0;
}

/* Starts graft-sim run --netns with a run long enough to be interrupted,
 * waits until its hub namespace exists; returns its pid. Its temporary
 * directories go under this test's: a run killed with SIGKILL cannot
 * remove them itself. */
static pid_t netns_start_long(void)
{
    const char *args[] = {"--netns", "--groups", "2", "--ranks", "1", "--steps", "400", NULL};
    pid_t pid = sim_start(tmpdir, args);
    for (int i = 0; i < 400 && !netns_exists(pid); i++) {
        usleep(25000);
    }
    assert_true(netns_exists(pid));
    usleep(300000); /* into the build of the group namespaces */
    return pid;
}

/*
 * Namespaces never outlive a run: SIGTERM tears them down at once; after
 * SIGKILL they stay until the next --netns run removes them as stale.
 */
static void test_netns_teardown(void **state)
{
    (void)state;
    if (!netns_usable()) {
        print_message("skipped: needs root and 'ip netns'\n");
        skip();
    }
    pid_t a = netns_start_long();
    assert_int_equal(kill(a, SIGTERM), 0);
    int ws;
    assert_int_equal(waitpid(a, &ws, 0), a);
    assert_false(netns_exists(a));

    pid_t b = netns_start_long();
    assert_int_equal(kill(b, SIGKILL), 0);
    assert_int_equal(waitpid(b, &ws, 0), b);
    assert_true(netns_exists(b)); /* nobody could clean up */
    /* The next run removes them (and fails fast here on its bad flag
     * only after the namespaces were made, so use a real short run). */
    char cache[PATH_MAX + 32], trainer_env[PATH_MAX + 96];
    snprintf(cache, sizeof(cache), "GRAFT_SIM_CACHE_DIR=%s/cache", tmpdir);
    snprintf(trainer_env, sizeof(trainer_env), "GRAFT_SIM_TRAINER=%s", trainer_bin);
    const char *args[] = {"--netns", "--groups", "1", "--ranks", "1", "--steps", "3", NULL};
    const char *env[] = {cache, trainer_env, "GRAFT_SIM_TIMEOUT_S=60", NULL};
    char *out = NULL;
    int rc = run_sim(args, env, &out);
    if (rc != 0) {
        print_error("graft-sim run --netns exited %d:\n%s\n", rc, out);
    }
    assert_int_equal(rc, 0);
    assert_non_null(strstr(out, "removed stale namespace"));
    free(out);
    assert_false(netns_exists(b));
}

/* graft-sim run --netns with G groups x 1 rank, N steps and a schedule of
 * these events (JSON array text); checks that it ran in namespaces and
 * ended bit-exact, and returns its report. */
static json_t *netns_run(const char *name, const char *groups, const char *steps,
                         const char *events)
{
    char json_path[PATH_MAX + 32], sched[PATH_MAX + 32], cache[PATH_MAX + 32],
        trainer_env[PATH_MAX + 96], expect[64];
    snprintf(json_path, sizeof(json_path), "%s/%s.json", tmpdir, name);
    snprintf(sched, sizeof(sched), "%s/%s-schedule.json", tmpdir, name);
    snprintf(cache, sizeof(cache), "GRAFT_SIM_CACHE_DIR=%s/cache", tmpdir);
    snprintf(trainer_env, sizeof(trainer_env), "GRAFT_SIM_TRAINER=%s", trainer_bin);
    FILE *f = fopen(sched, "w");
    assert_non_null(f);
    fprintf(f, "{\"events\":%s}\n", events);
    assert_int_equal(fclose(f), 0);
    /* One rank per group: with two, the runtime's start-up (step 0) heal
     * sometimes races the donor's serve_begin and the job stalls, with or
     * without --netns (reported; not a namespace matter). */
    const char *args[] = {"--netns", "--groups", groups, "--ranks", "1", "--steps", steps,
                          "--schedule", sched, "--json", json_path, NULL};
    const char *env[] = {cache, trainer_env, "GRAFT_SIM_TIMEOUT_S=90", NULL};
    char *out = run_sim_ok(args, env);
    snprintf(expect, sizeof(expect), "--netns: %s groups in namespaces", groups);
    assert_non_null(strstr(out, expect));
    free(out);
    json_t *j = load_json(json_path);
    assert_string_equal(json_string_value(json_object_get(j, "verdict")), "bit-exact");
    assert_string_equal(json_string_value(json_object_get(j, "final_state_hash")),
                        json_string_value(json_object_get(j, "reference_state_hash")));
    return j;
}

/*
 * Groups in namespaces with shaped links: a partition cuts group 1 off for
 * 3 s (longer than the 1 s lease: it loses its membership, re-joins and must
 * heal), then a rank of group 0 is killed; strict mode still ends bit-exact.
 */
static void test_netns_partition_bit_exact(void **state)
{
    (void)state;
    if (!netns_usable()) {
        print_message("skipped: needs root and 'ip netns'\n");
        skip();
    }
    json_t *j = netns_run("netns", "2", "80",
                          "[{\"kind\":\"partition\",\"group\":1,\"at_step\":10,"
                          "\"duration_ms\":3000},"
                          "{\"kind\":\"kill_rank\",\"group\":0,\"rank\":0,\"at_step\":60}]");
    json_t *by = json_object_get(j, "failures_injected");
    assert_int_equal(json_integer_value(json_object_get(by, "partition")), 1);
    assert_int_equal(json_integer_value(json_object_get(by, "kill_rank")), 1);
    /* The partition was noticed (the lease expired) and healed. */
    json_t *recs = json_object_get(j, "recoveries");
    int seen = 0;
    for (size_t i = 0; i < json_array_size(recs); i++) {
        json_t *rec = json_array_get(recs, i);
        if (strcmp(json_string_value(json_object_get(rec, "kind")), "partition") == 0) {
            seen = 1;
            assert_true(json_is_true(json_object_get(rec, "healed")));
            json_t *sec = json_object_get(rec, "seconds");
            assert_true(json_real_value(json_object_get(sec, "detect")) > 0);
        }
    }
    assert_true(seen);
    json_decref(j);
}

/*
 * --netns isolate: a group cut off from the other groups while it still
 * reaches etcd. The members' steady path cannot agree steps with it, so
 * they fall back to etcd, which still sees every group; no step commits
 * without it (strict), nothing splits, and the run ends bit-exact.
 */
static void test_netns_isolate_bit_exact(void **state)
{
    (void)state;
    if (!netns_usable()) {
        print_message("skipped: needs root and 'ip netns'\n");
        skip();
    }
    json_t *j = netns_run("isolate", "3", "60",
                          "[{\"kind\":\"isolate\",\"group\":1,\"at_step\":10,"
                          "\"duration_ms\":3000}]");
    json_t *by = json_object_get(j, "failures_injected");
    assert_int_equal(json_integer_value(json_object_get(by, "isolate")), 1);
    json_decref(j);
}

/* Whether this kernel has the netem qdisc (CONFIG_NET_SCH_NETEM): tried on
 * a veth in a namespace of its own. */
static int netem_usable(void)
{
    char cmd[512];
    long pid = (long)getpid();
    snprintf(cmd, sizeof(cmd),
             "ip netns add graft-netem-%ld >/dev/null 2>&1 || exit 1; "
             "ip -n graft-netem-%ld link add va type veth peer name vb >/dev/null 2>&1 && "
             "tc -n graft-netem-%ld qdisc add dev va root netem delay 1ms >/dev/null 2>&1; "
             "rc=$?; ip netns del graft-netem-%ld; exit $rc",
             pid, pid, pid, pid);
    return system(cmd) == 0;
}

/* The entry of the report's injected list of this kind (the first). */
static json_t *injected_of(json_t *report, const char *kind)
{
    json_t *inj = json_object_get(report, "injected");
    for (size_t i = 0; i < json_array_size(inj); i++) {
        json_t *e = json_array_get(inj, i);
        if (strcmp(json_string_value(json_object_get(e, "kind")), kind) == 0) {
            return e;
        }
    }
    fail_msg("no %s in the report's injected list", kind);
    return NULL;
}

static double json_num(json_t *o, const char *key)
{
    json_t *v = json_object_get(o, key);
    if (!json_is_number(v)) {
        fail_msg("%s: not a number", key);
    }
    return json_number_value(v);
}

/*
 * --netns link faults in one run, 4 groups x 1 rank, 150 steps:
 *  - kill_group of group 1, and in the same step a throttle of its link to
 *    10 Mbit/s for 5 s: the replacement's heal of the 16 MiB ballast (on
 *    for the cut_donor) runs over the throttled link until it is restored
 *    (~13 s at 10 Mbit/s, ~0.2 s at 1 Gbit/s), so the heal takes over 1 s;
 *  - netem (delay, jitter, loss, reordering) on group 2's link for 3 s,
 *    where the kernel has the netem qdisc; where it has not, a schedule with
 *    netem exits 2 naming sch_netem before anything runs;
 *  - cut_donor: group 3 killed, and the first donor group seen serving its
 *    replacement cut off group 3 (only) for 6 s, past the 5 s donor stall
 *    timeout: the pull fails over to the other donors (or fails and heals
 *    again).
 * The run ends bit-exact, every kind is in the injected list, each link
 * was restored, and the cut happened while the donor served.
 */
static void test_netns_link_faults_bit_exact(void **state)
{
    (void)state;
    if (!netns_usable()) {
        print_message("skipped: needs root and 'ip netns'\n");
        skip();
    }
    int netem = netem_usable();
    if (!netem) {
        char sched[PATH_MAX + 32], cache[PATH_MAX + 32], trainer_env[PATH_MAX + 96];
        snprintf(sched, sizeof(sched), "%s/netem-schedule.json", tmpdir);
        snprintf(cache, sizeof(cache), "GRAFT_SIM_CACHE_DIR=%s/cache", tmpdir);
        snprintf(trainer_env, sizeof(trainer_env), "GRAFT_SIM_TRAINER=%s", trainer_bin);
        FILE *f = fopen(sched, "w");
        assert_non_null(f);
        fprintf(f, "{\"events\":[{\"kind\":\"netem\",\"group\":0,\"at_step\":5}]}\n");
        assert_int_equal(fclose(f), 0);
        const char *args[] = {"--netns", "--groups", "2", "--ranks", "1", "--steps", "20",
                              "--schedule", sched, NULL};
        const char *env[] = {cache, trainer_env, NULL};
        char *out = NULL;
        assert_int_equal(run_sim(args, env, &out), 2);
        assert_non_null(strstr(out, "sch_netem"));
        free(out);
        print_message("this kernel has no netem qdisc: the run below leaves netem out\n");
    }
    char events[1024];
    snprintf(events, sizeof(events),
             "[{\"kind\":\"kill_group\",\"group\":1,\"at_step\":10},"
             "{\"kind\":\"throttle\",\"group\":1,\"at_step\":10,\"duration_ms\":5000},"
             "%s"
             "{\"kind\":\"cut_donor\",\"group\":3,\"rank\":0,\"at_step\":50,"
             "\"duration_ms\":6000}]",
             netem ? "{\"kind\":\"netem\",\"group\":2,\"at_step\":30,\"duration_ms\":3000},"
                   : "");
    /* 150 steps: netem slows every step to a round trip over its link
     * (~40 ms), so the cut_donor at step 50 still finds steps to go once
     * the netem's 3 s are over (one network fault at a time). */
    json_t *j = netns_run("linkfaults", "4", "150", events);
    json_t *by = json_object_get(j, "failures_injected");
    assert_int_equal(json_integer_value(json_object_get(by, "kill_group")), 1);
    assert_int_equal(json_integer_value(json_object_get(by, "throttle")), 1);
    assert_int_equal(json_integer_value(json_object_get(by, "netem")), netem);
    assert_int_equal(json_integer_value(json_object_get(by, "cut_donor")), 1);
    assert_int_equal(json_integer_value(json_object_get(j, "failures_not_reached")), 0);

    /* The throttle came right after the kill, on the same group, and
     * lasted its 5 s; the replacement's heal crossed the slow link. */
    json_t *kill = injected_of(j, "kill_group");
    json_t *thr = injected_of(j, "throttle");
    assert_int_equal(json_integer_value(json_object_get(thr, "group")), 1);
    assert_true(json_num(thr, "t") - json_num(kill, "t") < 1.0);
    assert_true(json_num(thr, "link_restored_t") >= json_num(thr, "t") + 4.9);
    json_t *recs = json_object_get(j, "recoveries");
    int seen_kill = 0, seen_cut = 0;
    for (size_t i = 0; i < json_array_size(recs); i++) {
        json_t *rec = json_array_get(recs, i);
        const char *kind = json_string_value(json_object_get(rec, "kind"));
        assert_true(json_is_true(json_object_get(rec, "healed")));
        if (strcmp(kind, "kill_group") == 0) {
            seen_kill = 1;
            assert_true(json_num(json_object_get(rec, "seconds"), "heal") > 1.0);
        }
        seen_cut |= strcmp(kind, "cut_donor") == 0;
    }
    assert_true(seen_kill && seen_cut);

    if (netem) {
        json_t *ne = injected_of(j, "netem");
        assert_int_equal(json_integer_value(json_object_get(ne, "group")), 2);
        assert_true(json_num(ne, "link_restored_t") >= json_num(ne, "t") + 2.9);
    }

    /* The cut landed while a donor served group 3's replacement, and
     * only after the kill; its routes were removed 6 s later. */
    json_t *cut = injected_of(j, "cut_donor");
    json_int_t donor = json_integer_value(json_object_get(cut, "donor_group"));
    assert_true(json_is_integer(json_object_get(cut, "donor_group")));
    assert_true(donor >= 0 && donor <= 2);
    assert_true(json_is_true(json_object_get(cut, "donor_cut_serving")));
    assert_true(json_integer_value(json_object_get(cut, "donor_serving_step")) >= 50);
    assert_true(json_num(cut, "donor_t") >= json_num(cut, "t"));
    assert_true(json_num(cut, "link_restored_t") >= json_num(cut, "donor_t") + 5.9);
    print_message("cut_donor: donor group %lld cut off mid-pull: %s, heal ok: %s\n",
                  (long long)donor,
                  json_is_true(json_object_get(cut, "donor_mid_serve")) ? "yes" : "no",
                  json_is_null(json_object_get(cut, "donor_heal_ok"))   ? "not seen"
                  : json_is_true(json_object_get(cut, "donor_heal_ok")) ? "yes"
                                                                        : "no");
    json_decref(j);
}

/* ---------------------------------------------------------------- main --- */

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_netns_teardown),
        cmocka_unit_test(test_netns_partition_bit_exact),
        cmocka_unit_test(test_netns_isolate_bit_exact),
        cmocka_unit_test(test_netns_link_faults_bit_exact),
    };
    return sim_run_tests("netns", tests, ARRAY_SIZE(tests), sim_teardown);
}
