/*
 * graftctl ckpt ls|verify|inspect|prune|restore --dry-run on an s3:// URL,
 * against a real S3-compatible server (moto_server, tests/support/
 * s3_fixture.c): the checkpoints a writer uploaded are listed, verified
 * object by object (a corrupt or missing object named precisely), pruned
 * by the remote retention (manifest first, an upload that never got its
 * manifest removed too); missing credentials named, credentials refused
 * and an endpoint nobody answers reported as such.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <dirent.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "graft_internal.h"
#include "s3_fixture.h"
#include "persist_fixture.h"

static const uint8_t secret[] = "graftctl-remote-test-secret"; /* 27 bytes + NUL */
#define PER (3u << 20)

static char ctl_bin[PATH_MAX + 32];

typedef struct fix {
    graft_test_s3_t s3;
    char *root;
    char secret_file[PATH_MAX];
    uint8_t *w[2];
} fix_t;

static void save_steps(fix_t *f, const uint64_t *steps, size_t n)
{
    graft_persist_remote_config_t remote = graft_test_s3_remote(&f->s3, "job");
    graft_persist_config_t cfg = {.root = f->root, .chunk_bytes = 1u << 20, .secret = secret,
                                  .secret_len = sizeof(secret), .remote = &remote};
    graft_persist_writer_t *w = NULL;
    assert_int_equal(graft_persist_writer_create(&cfg, &w), GRAFT_OK);
    for (size_t i = 0; i < n; i++) {
        graft_persist_region_t regs[2][1];
        const graft_persist_region_t *rp[2];
        size_t nr[2] = {1, 1};
        for (uint32_t r = 0; r < 2; r++) {
            pt_fill(f->w[r], PER, steps[i] * 3 + r);
            regs[r][0] = (graft_persist_region_t){.name = "w", .kind = GRAFT_PERSIST_KIND_PARAM,
                                                  .dtype = 1, .ptr = f->w[r], .bytes = PER,
                                                  .global_offset = r * (uint64_t)PER,
                                                  .global_bytes = 2ull * PER};
            rp[r] = regs[r];
        }
        assert_int_equal(graft_persist_save(w, steps[i], 2, rp, nr, NULL), GRAFT_OK);
        assert_int_equal(graft_persist_wait(w, steps[i], NULL), GRAFT_OK);
        assert_int_equal(graft_persist_remote_flush(w, 120000), GRAFT_OK);
    }
    graft_persist_remote_stats_t st;
    assert_int_equal(graft_persist_remote_stats(w, &st), GRAFT_OK);
    assert_int_equal(st.uploaded, n);
    graft_persist_writer_destroy(w);
}

static int setup(void **state)
{
    char self[PATH_MAX];
    ssize_t len = readlink("/proc/self/exe", self, sizeof(self) - 1);
    if (len <= 0)
        return -1;
    self[len] = '\0';
    *strrchr(self, '/') = '\0';
    snprintf(ctl_bin, sizeof(ctl_bin), "%s/../bin/graftctl", self);
    fix_t *f = calloc(1, sizeof(*f));
    *state = NULL;
    int rc = graft_test_s3_setup(&f->s3, "graft-ctl");
    if (rc != 0) {
        free(f);
        return rc > 0 ? 0 : -1;
    }
    f->root = pt_tmpdir();
    snprintf(f->secret_file, sizeof(f->secret_file), "%s.secret", f->root);
    FILE *sf = fopen(f->secret_file, "w");
    assert_non_null(sf);
    fwrite(secret, 1, sizeof(secret), sf);
    fclose(sf);
    f->w[0] = malloc(PER);
    f->w[1] = malloc(PER);
    save_steps(f, (const uint64_t[]){10, 20}, 2);
    *state = f;
    return 0;
}

static int teardown(void **state)
{
    fix_t *f = *state;
    if (f == NULL)
        return 0;
    graft_test_s3_stop(&f->s3);
    pt_rmtree(f->root);
    unlink(f->secret_file);
    free(f->w[0]);
    free(f->w[1]);
    free(f);
    return 0;
}

/* graftctl with args (NULL-terminated), its stdout and stderr. */
static int ctl(char **out_p, char **err_p, const char *const *args)
{
    char outp[] = "/tmp/graftctl-remote-out-XXXXXX", errp[] = "/tmp/graftctl-remote-err-XXXXXX";
    int ofd = mkstemp(outp), efd = mkstemp(errp);
    assert_true(ofd >= 0 && efd >= 0);
    const char *argv[32] = {ctl_bin};
    size_t n = 1;
    for (; args[n - 1] != NULL && n < 31; n++)
        argv[n] = args[n - 1];
    argv[n] = NULL;
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        int in = open("/dev/null", O_RDONLY);
        dup2(in, 0);
        dup2(ofd, 1);
        dup2(efd, 2);
        execv(ctl_bin, (char *const *)argv);
        _exit(127);
    }
    int status = 0;
    assert_int_equal(waitpid(pid, &status, 0), pid);
    char *bufs[2] = {NULL, NULL};
    const char *paths[2] = {outp, errp};
    for (int i = 0; i < 2; i++) {
        FILE *fp = fopen(paths[i], "r");
        bufs[i] = calloc(1, 1 << 20);
        size_t got = fp != NULL ? fread(bufs[i], 1, (1 << 20) - 1, fp) : 0;
        bufs[i][got] = '\0';
        if (fp != NULL)
            fclose(fp);
        unlink(paths[i]);
    }
    close(ofd);
    close(efd);
    fprintf(stderr, "graftctl %s %s: rc %d\n--- stdout\n%s--- stderr\n%s", args[0],
            args[1] != NULL ? args[1] : "", WEXITSTATUS(status), bufs[0], bufs[1]);
    *out_p = bufs[0];
    *err_p = bufs[1];
    return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

#define URL "s3://graft-ctl/job"
#define STEP_KEY(step, name) "job/step-000000000000000000" step "/" name

static void test_ls_verify_inspect(void **state)
{
    fix_t *f = *state;
    if (f == NULL)
        skip(); /* no moto_server: setup() said why */
    char *out, *err;
    /* An upload that never got its manifest.pb, older than the newest. */
    assert_int_equal(graft_test_s3_put(&f->s3, STEP_KEY("15", "shard-0-of-2"),
                                       (const uint8_t *)"x", 1), 200);
    assert_int_equal(ctl(&out, &err, (const char *[]){"ckpt", "ls", URL, "--endpoint",
                                                      f->s3.endpoint, "--keep-last", "1",
                                                      NULL}), 0);
    assert_non_null(strstr(out, "20         complete   4        newest"));
    assert_non_null(strstr(out, "15         incomplete 1        leftover"));
    assert_non_null(strstr(out, "10         complete   4        prunable"));
    free(out);
    free(err);

    /* The endpoint from the environment, MACs checked; downloads into a
     * scratch directory under TMPDIR, removed after. */
    setenv("GRAFT_PERSIST_REMOTE_ENDPOINT", f->s3.endpoint, 1);
    char *tmp = pt_tmpdir();
    setenv("TMPDIR", tmp, 1);
    assert_int_equal(ctl(&out, &err, (const char *[]){"ckpt", "verify", URL, "20",
                                                      "--secret-file", f->secret_file, NULL}),
                     0);
    assert_non_null(strstr(out, "step 20: ok (every object, every chunk, 2 shards, 6291456 "
                                "bytes, MAC ok)"));
    free(out);
    free(err);
    assert_int_equal(ctl(&out, &err, (const char *[]){"--json", "ckpt", "inspect", URL, "10",
                                                      NULL}), 0);
    assert_non_null(strstr(out, "\"file\": \"shard-1-of-2\""));
    assert_non_null(strstr(out, "\"sidecar\": \"ok\""));
    free(out);
    free(err);

    /* Bit rot in the store: named down to the object and chunk. */
    uint8_t *data = NULL;
    size_t len = 0;
    assert_int_equal(graft_test_s3_get(&f->s3, STEP_KEY("20", "shard-1-of-2"), &data, &len), 200);
    data[len / 2] ^= 0x10;
    assert_int_equal(graft_test_s3_put(&f->s3, STEP_KEY("20", "shard-1-of-2"), data, len), 200);
    free(data);
    assert_int_equal(ctl(&out, &err, (const char *[]){"ckpt", "verify", URL, NULL}), 1);
    assert_non_null(strstr(out, "step 20: FAILED: s3://graft-ctl/job/step-00000000000000000020/"
                                "shard-1-of-2: chunk"));
    assert_non_null(strstr(out, "step 15: FAILED: " URL "/step-00000000000000000015/manifest.pb: "
                                "missing from the store"));
    assert_non_null(strstr(out, "step 10: ok"));
    free(out);
    free(err);
    /* restore --dry-run skips it for the older one, as a restore does. */
    assert_int_equal(ctl(&out, &err, (const char *[]){"ckpt", "restore", URL, "--dry-run", NULL}),
                     0);
    assert_non_null(strstr(out, "skip step 20: s3://graft-ctl/job/step-00000000000000000020/"
                                "shard-1-of-2"));
    assert_non_null(strstr(out, "would restore step 10 (2 ranks"));
    free(out);
    free(err);
    /* A missing object. */
    assert_int_equal(graft_test_s3_delete(&f->s3, STEP_KEY("10", "shard-0-of-2")), 204);
    assert_int_equal(ctl(&out, &err, (const char *[]){"ckpt", "verify", URL, "10", NULL}), 1);
    assert_non_null(strstr(out, "step 10: FAILED: s3://graft-ctl/job/step-00000000000000000010/"
                                "shard-0-of-2: missing from the store"));
    free(out);
    free(err);
    assert_int_equal(ctl(&out, &err, (const char *[]){"ckpt", "restore", URL, "--dry-run", NULL}),
                     1);
    assert_non_null(strstr(err, "no checkpoint in " URL " verifies"));
    free(out);
    free(err);
    unsetenv("GRAFT_PERSIST_REMOTE_ENDPOINT");
    unsetenv("TMPDIR");
    DIR *d = opendir(tmp);
    assert_non_null(d);
    struct dirent *e;
    while ((e = readdir(d)) != NULL)
        if (strcmp(e->d_name, ".") != 0 && strcmp(e->d_name, "..") != 0)
            fail_msg("left in TMPDIR: %s", e->d_name);
    closedir(d);
    pt_rmtree(tmp);
}

static void test_prune(void **state)
{
    fix_t *f = *state;
    if (f == NULL)
        skip();
    char *out, *err;
    save_steps(f, (const uint64_t[]){30}, 1);
    assert_int_equal(graft_test_s3_put(&f->s3, STEP_KEY("15", "shard-0-of-2"),
                                       (const uint8_t *)"x", 1), 200);
    assert_int_equal(graft_test_s3_put(&f->s3, STEP_KEY("40", "shard-0-of-2"),
                                       (const uint8_t *)"x", 1), 200);
    const char *ep = f->s3.endpoint;
    assert_int_equal(ctl(&out, &err, (const char *[]){"ckpt", "prune", URL, "--endpoint", ep,
                                                      "--keep-last", "2", NULL}), 2);
    assert_non_null(strstr(err, "--yes"));
    free(out);
    free(err);
    assert_int_equal(ctl(&out, &err, (const char *[]){"ckpt", "prune", URL, "--endpoint", ep,
                                                      "--keep-last", "2", "--dry-run", NULL}), 0);
    assert_non_null(strstr(out, "would delete 2 step prefixes: 15 10"));
    free(out);
    free(err);
    char *keys = graft_test_s3_keys(&f->s3, "job/");
    assert_non_null(strstr(keys, STEP_KEY("10", "manifest.pb")));
    free(keys);
    assert_int_equal(ctl(&out, &err, (const char *[]){"--yes", "ckpt", "prune", URL, "--endpoint",
                                                      ep, "--keep-last", "2", NULL}), 0);
    assert_non_null(strstr(out, "deleted 1 checkpoints and 1 incomplete uploads"));
    free(out);
    free(err);
    keys = graft_test_s3_keys(&f->s3, "job/");
    assert_non_null(keys);
    assert_null(strstr(keys, "step-00000000000000000010/"));
    assert_null(strstr(keys, "step-00000000000000000015/"));
    assert_non_null(strstr(keys, STEP_KEY("20", "manifest.pb")));
    assert_non_null(strstr(keys, STEP_KEY("30", "shard-1-of-2")));
    /* Newer than the newest complete one: perhaps an upload going on. */
    assert_non_null(strstr(keys, STEP_KEY("40", "shard-0-of-2")));
    free(keys);
}

static void test_errors(void **state)
{
    fix_t *f = *state;
    if (f == NULL)
        skip();
    char *out, *err;
    const char *ep = f->s3.endpoint;
    /* No credentials anywhere: what is missing is named. */
    char *id = strdup(getenv("AWS_ACCESS_KEY_ID")), *key = strdup(getenv("AWS_SECRET_ACCESS_KEY"));
    unsetenv("AWS_ACCESS_KEY_ID");
    unsetenv("AWS_SECRET_ACCESS_KEY");
    setenv("AWS_SHARED_CREDENTIALS_FILE", "/nonexistent/credentials", 1);
    assert_int_equal(ctl(&out, &err, (const char *[]){"ckpt", "ls", URL, "--endpoint", ep, NULL}),
                     1);
    assert_non_null(strstr(err, "graftctl ckpt ls: " URL ": no credentials: AWS_ACCESS_KEY_ID"));
    assert_non_null(strstr(err, "/nonexistent/credentials"));
    free(out);
    free(err);
    setenv("AWS_ACCESS_KEY_ID", id, 1);
    setenv("AWS_SECRET_ACCESS_KEY", key, 1);
    unsetenv("AWS_SHARED_CREDENTIALS_FILE");
    free(id);
    free(key);

    /* Nobody listening: the store is named, and it fails in seconds. */
    uint64_t t0 = graft__now_ns();
    assert_int_equal(ctl(&out, &err, (const char *[]){"ckpt", "verify", URL, "--endpoint",
                                                      "http://127.0.0.1:1", NULL}), 1);
    assert_true(graft__now_ns() - t0 < 20000000000ull);
    assert_non_null(strstr(err, "graftctl ckpt verify: " URL ": "));
    assert_non_null(strstr(err, "onnect"));
    assert_non_null(strstr(err, "http://127.0.0.1:1"));
    free(out);
    free(err);

    /* A store that refuses the key. */
    graft_test_s3_t strict;
    assert_int_equal(graft_test_s3_start_auth(&strict, "graft-ctl"), 0);
    assert_int_equal(ctl(&out, &err, (const char *[]){"ckpt", "ls", URL, "--endpoint",
                                                      strict.endpoint, NULL}), 1);
    assert_non_null(strstr(err, "HTTP 403"));
    assert_non_null(strstr(err, "AWS_ACCESS_KEY_ID"));
    free(out);
    free(err);
    graft_test_s3_stop(&strict);

    /* Not a URL the tools take; --endpoint on a directory. */
    assert_int_equal(ctl(&out, &err, (const char *[]){"ckpt", "ls", "s3://", "--endpoint", ep,
                                                      NULL}), 1);
    assert_non_null(strstr(err, "not an s3://bucket[/prefix] URL"));
    free(out);
    free(err);
    assert_int_equal(ctl(&out, &err, (const char *[]){"ckpt", "ls", f->root, "--endpoint", ep,
                                                      NULL}), 2);
    free(out);
    free(err);
    assert_int_equal(ctl(&out, &err, (const char *[]){"ckpt", "prune", URL, "--keep-last", "1",
                                                      "--geometric", "--dry-run", NULL}), 2);
    assert_non_null(strstr(err, "--geometric is not available on an s3:// ROOT"));
    free(out);
    free(err);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_ls_verify_inspect, setup, teardown),
        cmocka_unit_test_setup_teardown(test_prune, setup, teardown),
        cmocka_unit_test_setup_teardown(test_errors, setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
