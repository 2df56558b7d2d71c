/*
 * The runtime with a remote tier, end to end: real etcd, real UCX on
 * loopback, real trainer processes, and a real S3-compatible server
 * (moto_server, tests/support/s3_fixture.c). Every group dies and every
 * local disk is lost; the restarted job restores from the bucket and ends
 * identical to the fault-free run.
 */
#include "runtime_procs.h"

#include "s3_fixture.h"

static graft_test_s3_t s3;
static bool have_s3;

static int group_setup(void **state)
{
    int rc = graft_test_s3_start(&s3, "graft-rt");
    if (rc < 0)
        return -1;
    have_s3 = rc == 0;
    if (rc > 0)
        fprintf(stderr, "%s\n", s3.skip_reason);
    return rp_setup(state);
}

static int group_teardown(void **state)
{
    int rc = rp_teardown(state);
    if (have_s3)
        graft_test_s3_stop(&s3);
    return rc;
}

/* The config keys: persist_remote needs persist_root and an s3:// URL. */
static void test_config_keys(void **state)
{
    (void)state;
    graft_config_t *c = NULL;
    char *err = NULL;
    assert_int_equal(graft_config_create(&c), GRAFT_OK);
    assert_int_equal(graft_config_set(c, "job", "j", NULL), GRAFT_OK);
    assert_int_equal(graft_config_set(c, "etcd_endpoints", "http://127.0.0.1:1", NULL), GRAFT_OK);
    assert_int_equal(graft_config_set(c, "groups", "1", NULL), GRAFT_OK);
    assert_int_equal(graft_config_set(c, "group", "0", NULL), GRAFT_OK);
    assert_int_equal(graft_config_set(c, "persist_remote", "s3://b/p", NULL), GRAFT_OK);
    assert_int_equal(graft_config_set(c, "persist_remote_endpoint", "http://127.0.0.1:9", NULL),
                     GRAFT_OK);
    assert_int_equal(graft_config_set(c, "persist_remote_keep_last", "4", NULL), GRAFT_OK);
    assert_int_equal(graft_config_validate(c, &err), GRAFT_EINVAL);
    assert_non_null(strstr(err, "persist_remote: needs persist_root"));
    graft_free(err);
    err = NULL;
    assert_int_equal(graft_config_set(c, "persist_root", "/tmp/x", NULL), GRAFT_OK);
    assert_int_equal(graft_config_validate(c, &err), GRAFT_OK);
    assert_int_equal(graft_config_set(c, "persist_remote", "https://b/p", NULL), GRAFT_OK);
    assert_int_equal(graft_config_validate(c, &err), GRAFT_EINVAL);
    assert_non_null(strstr(err, "s3://"));
    graft_free(err);
    graft_config_destroy(c);
}

/* Flip one byte of every shard of every local checkpoint. */
static void corrupt_all(const char *root)
{
    for (int step = 5; step <= 10; step += 5)
        for (int r = 0; r < R; r++) {
            char shard[400];
            snprintf(shard, sizeof(shard), "%s/step-%020d/shard-%d-of-%d", root, step, r, R);
            FILE *f = fopen(shard, "r+b");
            assert_non_null(f);
            assert_int_equal(fseek(f, 200, SEEK_SET), 0);
            int c = fgetc(f);
            assert_int_equal(fseek(f, 200, SEEK_SET), 0);
            fputc(c ^ 0x40, f);
            fclose(f);
        }
}

/* Every group dies at step 13 (checkpoints every 5 steps); then every
 * local root is deleted (lose_disks) or every local checkpoint corrupted;
 * the restarted job restores from the bucket. */
static void remote_restore_job(const char *name, bool lose_disks)
{
    job_t j;
    const int steps = 18;
    char root[280], env_root[340], env_remote[200], env_ep[200];
    rp_job_init(&j, name);
    snprintf(root, sizeof(root), "%s/ckpt", j.dir);
    snprintf(env_root, sizeof(env_root), "GRAFT_PERSIST_ROOT=%s", root);
    snprintf(env_remote, sizeof(env_remote), "GRAFT_PERSIST_REMOTE=s3://%s/%s", s3.bucket, j.name);
    snprintf(env_ep, sizeof(env_ep), "GRAFT_PERSIST_REMOTE_ENDPOINT=%s", s3.endpoint);
    j.extra_env[0] = env_root;
    j.extra_env[1] = "GRAFT_PERSIST_EVERY=5";
    j.extra_env[2] = env_remote;
    j.extra_env[3] = env_ep;
    const char *dying[] = {"--steps", "18", "--die-at-step", "13", "--step-delay-ms", "150",
                           NULL};
    rp_spawn_all(&j, dying);
    (void)rp_wait_job_lost(&j, 120, 5.0);
    for (int i = 0; i < j.n; i++)
        assert_true(WIFSIGNALED(j.p[i].status));
    usleep(2600 * 1000);

    /* What reached the bucket before the job died. */
    char prefix[128];
    snprintf(prefix, sizeof(prefix), "%s", j.name);
    graft_persist_remote_config_t rc = graft_test_s3_remote(&s3, prefix);
    uint64_t *rsteps = NULL;
    size_t n = 0;
    char why[512] = "";
    assert_int_equal(graft_persist_remote_list(&rc, &rsteps, &n, why, sizeof(why)), GRAFT_OK);
    if (n == 0)
        fail_msg("no checkpoint reached the bucket before the job died");
    uint64_t newest = rsteps[0];
    graft_free(rsteps);
    assert_true(newest == 5 || newest == 10);

    if (lose_disks)
        rp_rm_rf(root); /* every host lost its disk */
    else
        corrupt_all(root);
    job_t *k = &j;
    int first_new = k->n;
    const char *flags[] = {"--steps", "18", NULL};
    rp_spawn_all(k, flags);
    rp_wait_all(k, 180);
    rp_check_final(k, steps);
    rp_check_logs(k, steps);
    /* Restored from the bucket (or healed from a peer that was). */
    rp_check_restarted_from(k, first_new, (unsigned)newest + 1);
    /* The restarted job's checkpoints reached the bucket before its
     * processes ended (a writer waits for its uploads): step 15, and the
     * final one of step 18 (train_mlp ends with graft_finish()). */
    assert_int_equal(graft_persist_remote_list(&rc, &rsteps, &n, why, sizeof(why)), GRAFT_OK);
    assert_true(n > 1);
    assert_int_equal(rsteps[0], steps);
    assert_int_equal(rsteps[1], 15);
    graft_free(rsteps);
    /* And the uploaders counted them in the metrics: at least those two
     * complete uploads over the restarted processes. */
    uint64_t uploaded = 0;
    for (int i = first_new; i < k->n; i++) {
        trainer_metrics_t m;
        rp_read_metrics(&k->p[i], &m);
        uploaded += m.remote_uploaded;
    }
    if (uploaded < 2)
        fail_msg("the restarted processes counted %" PRIu64 " uploads, not 2 or more", uploaded);
    rp_rm_rf(j.dir);
}

static void test_lose_every_disk_restore_from_bucket(void **state)
{
    (void)state;
    if (!have_s3)
        skip(); /* no moto_server: the reason is printed by the group setup */
    remote_restore_job("remote", true);
}

/* No local checkpoint verifies (each has a corrupt shard): the bucket's. */
static void test_corrupt_disks_restore_from_bucket(void **state)
{
    (void)state;
    if (!have_s3)
        skip();
    remote_restore_job("remote-corrupt", false);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_config_keys),
        cmocka_unit_test(test_lose_every_disk_restore_from_bucket),
        cmocka_unit_test(test_corrupt_disks_restore_from_bucket),
    };
    return cmocka_run_group_tests(tests, group_setup, group_teardown);
}
