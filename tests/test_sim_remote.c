/*
 * `graft-sim run --persist-remote`: the trainers' object-store tier on a
 * real S3-compatible server (moto_server, tests/support/s3_fixture.c), and
 * the failure kind lose_disks, a disaster that also wipes the local
 * checkpoint root, so the job must come back from the store.
 *
 *  - A run with a lose_disks ends bit-exact, restored from the store's
 *    newest checkpoint at the time of the loss, and the store holds the
 *    job's checkpoints under its own prefix.
 *  - --random-failures draws lose_disks only with a store; a schedule that
 *    names it without one, and malformed flags, are refused.
 */
#include "test_sim_util.h"

#include "s3_fixture.h"

static graft_test_s3_t s3;
static int s3_rc = 1; /* graft_test_s3_start()'s: 0 up, 1 no server (skip), -1 broken */

static int teardown_s3(void **state)
{
    if (s3_rc == 0)
        graft_test_s3_stop(&s3);
    return sim_teardown(state);
}

#define NEED_S3()                                                                            \
    do {                                                                                     \
        if (s3_rc < 0)                                                                       \
            fail_msg("moto_server did not start");                                           \
        if (s3_rc > 0)                                                                       \
            skip(); /* no moto_server: main() printed why */                                 \
    } while (0)

static void write_file(const char *path, const char *text)
{
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    fputs(text, f);
    assert_int_equal(fclose(f), 0);
}

/* The job comes back from the store after losing its disks, bit-exact. */
static void test_lose_disks_restores_from_the_store(void **state)
{
    (void)state;
    NEED_S3();
    char json_path[PATH_MAX + 32], cache[PATH_MAX + 32], trainer_env[PATH_MAX + 96],
        sched[PATH_MAX + 32];
    snprintf(json_path, sizeof(json_path), "%s/lose.json", tmpdir);
    snprintf(cache, sizeof(cache), "GRAFT_SIM_CACHE_DIR=%s/cache", tmpdir);
    snprintf(trainer_env, sizeof(trainer_env), "GRAFT_SIM_TRAINER=%s", trainer_bin);
    snprintf(sched, sizeof(sched), "%s/lose-sched.json", tmpdir);
    write_file(sched, "{\"events\":["
                      "{\"kind\":\"lose_disks\",\"at_step\":40},"
                      "{\"kind\":\"kill_group\",\"group\":1,\"at_step\":60}]}");
    const char *args[] = {"--groups", "2", "--ranks", "2", "--steps", "100", "--seed", "6",
                          "--schedule", sched, "--persist-remote", "s3://sim/runs/",
                          "--persist-remote-endpoint", s3.endpoint, "--json", json_path, NULL};
    const char *env[] = {cache, trainer_env, "GRAFT_SIM_TIMEOUT_S=150", NULL};
    char *out = run_sim_ok(args, env);
    free(out);
    json_t *j = load_json(json_path);
    assert_string_equal(json_string_value(json_object_get(j, "verdict")), "bit-exact");
    assert_int_equal(
        json_integer_value(json_object_get(json_object_get(j, "failures_injected"), "lose_disks")),
        1);
    json_t *recs = json_object_get(j, "recoveries"), *rc = NULL;
    size_t i;
    json_t *e;
    json_array_foreach(recs, i, e) {
        if (strcmp(json_string_value(json_object_get(e, "kind")), "lose_disks") == 0)
            rc = e;
    }
    assert_non_null(rc);
    /* Restored from what the store held when the disks went: the local
     * root was empty, so nothing else could have been read. */
    json_int_t ckpt = json_integer_value(json_object_get(rc, "checkpoint_step"));
    assert_true(ckpt >= 10);
    assert_int_equal(json_integer_value(json_object_get(rc, "restored_step")), ckpt);
    assert_true(json_is_true(json_object_get(rc, "healed")));
    json_decref(j);
    /* The job's checkpoints, under the prefix and the job's own name. */
    char *keys = graft_test_s3_keys(&s3, "runs/");
    assert_non_null(keys);
    assert_non_null(strstr(keys, "runs/sim-"));
    assert_non_null(strstr(keys, "/manifest.pb"));
    assert_non_null(strstr(keys, "/shard-1-of-2"));
    free(keys);
    /* And read back from there: the server's log has the restore's GETs of
     * the shards of that very checkpoint (the uploader only PUTs). */
    char logpath[PATH_MAX], want[96];
    snprintf(logpath, sizeof(logpath), "%s/moto.log", s3.dir);
    snprintf(want, sizeof(want), "/step-%020lld/shard-1-of-2 HTTP", (long long)ckpt);
    FILE *f = fopen(logpath, "r");
    assert_non_null(f);
    char line[1024];
    int gets = 0;
    /* (A ranged GET answered 206 is logged between colour escapes, so the
     * method is matched without the quote before it.) */
    while (fgets(line, sizeof(line), f) != NULL)
        gets += strstr(line, "GET /sim/runs/") != NULL && strstr(line, want) != NULL;
    fclose(f);
    if (gets == 0)
        fail_msg("no GET of %s in %s", want, logpath);
}

/* The random mix has lose_disks only when there is a store to come back from. */
static void test_random_mix_draws_lose_disks_with_a_store(void **state)
{
    (void)state;
    const char *with[] = {"--groups", "3", "--ranks", "1", "--steps", "400",
                          "--random-failures", "30", "--seed", "3", "--persist-remote",
                          "s3://b/p", NULL};
    const char *without[] = {"--groups", "3", "--ranks", "1", "--steps", "400",
                             "--random-failures", "30", "--seed", "3", NULL};
    const char *env[] = {"GRAFT_SIM_PLAN_ONLY=1", NULL};
    char *out = NULL;
    assert_int_equal(run_sim(with, env, &out), 0);
    assert_non_null(strstr(out, "\"lose_disks\""));
    free(out);
    assert_int_equal(run_sim(without, env, &out), 0);
    assert_null(strstr(out, "lose_disks"));
    assert_non_null(strstr(out, "\"disaster\""));
    free(out);
}

static void test_refusals(void **state)
{
    (void)state;
    char sched[PATH_MAX + 32];
    snprintf(sched, sizeof(sched), "%s/lose-only.json", tmpdir);
    write_file(sched, "{\"events\":[{\"kind\":\"lose_disks\",\"at_step\":5}]}");
    const char *no_store[] = {"--groups", "2", "--steps", "20", "--schedule", sched, NULL};
    const char *bad_url[] = {"--persist-remote", "http://x/y", NULL};
    const char *no_bucket[] = {"--persist-remote", "s3:///p", NULL};
    const char *bad_endpoint[] = {"--persist-remote", "s3://b", "--persist-remote-endpoint",
                                  "127.0.0.1:9000", NULL};
    const char *endpoint_alone[] = {"--persist-remote-endpoint", "http://127.0.0.1:9000",
                                    NULL};
    struct {
        const char *const *args;
        const char *says;
    } cases[] = {
        {no_store, "needs --persist-remote"},
        {bad_url, "--persist-remote: 'http://x/y' is not s3://bucket[/prefix]"},
        {no_bucket, "is not s3://bucket[/prefix]"},
        {bad_endpoint, "is not one http:// or https:// URL"},
        {endpoint_alone, "--persist-remote-endpoint needs --persist-remote"},
    };
    for (size_t k = 0; k < ARRAY_SIZE(cases); k++) {
        char *out = NULL;
        assert_int_equal(run_sim(cases[k].args, NULL, &out), 2);
        if (strstr(out, cases[k].says) == NULL)
            fail_msg("case %zu: no \"%s\" in:\n%s", k, cases[k].says, out);
        free(out);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_refusals),
        cmocka_unit_test(test_random_mix_draws_lose_disks_with_a_store),
        cmocka_unit_test(test_lose_disks_restores_from_the_store),
    };
    s3_rc = graft_test_s3_start(&s3, "sim");
    if (s3_rc > 0)
        fprintf(stderr, "%s\n", s3.skip_reason);
    return sim_run_tests("remote", tests, ARRAY_SIZE(tests), teardown_s3);
}
