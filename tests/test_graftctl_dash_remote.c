/*
 * The dashboard's checkpoint panel shows both tiers (/api/state "remote"),
 * against a live `graftctl dashboard` following a job in a real etcd, its
 * checkpoint root on disk and its bucket on a real S3-compatible server
 * (moto_server) behind the fault proxy, which counts the requests:
 *
 *  - the bucket's step prefixes, and the upload lag: the newest local
 *    checkpoint (step 30, not uploaded) against the newest complete remote
 *    one (step 20), in steps and in seconds (their manifests' times);
 *    once step 30 is uploaded, no lag;
 *  - cheap reads: one LIST request per GRAFTCTL_DASH_REMOTE_MS (10 s)
 *    at most, whatever the dashboard's interval (100 ms here);
 *  - missing credentials named in the panel; no remote tier: null.
 */
#include "graftctl_http.h"

#include <graft/persist.h>

#include "s3_fault_proxy.h"
#include "s3_fixture.h"

typedef struct dash {
    pid_t pid;
    int port;
    char log[PATH_MAX + 32];
} dash_t;

static graft_membership_t *job_member;
static graft_test_s3_t s3;
static graft_test_s3_proxy_t proxy;
static bool have_s3;
static char ck_root[PATH_MAX + 16];
static const uint8_t secret[] = "dash-remote-test-secret";
#define URL "s3://graft-dash/dash"

static graft_persist_writer_t *writer(bool remote)
{
    static graft_persist_remote_config_t rc;
    rc = graft_test_s3_remote(&s3, "dash");
    graft_persist_config_t cfg = {.root = ck_root, .chunk_bytes = 1u << 20, .secret = secret,
                                  .secret_len = sizeof(secret), .remote = remote ? &rc : NULL};
    graft_persist_writer_t *w = NULL;
    assert_int_equal(graft_persist_writer_create(&cfg, &w), GRAFT_OK);
    return w;
}

static void save(graft_persist_writer_t *w, uint64_t step)
{
    static uint8_t buf[256 << 10];
    memset(buf, (int)step, sizeof(buf));
    graft_persist_region_t reg = {.name = "w", .kind = GRAFT_PERSIST_KIND_PARAM, .dtype = 1,
                                  .ptr = buf, .bytes = sizeof(buf)};
    const graft_persist_region_t *rp[1] = {&reg};
    size_t nr[1] = {1};
    assert_int_equal(graft_persist_save(w, step, 1, rp, nr, NULL), GRAFT_OK);
    assert_int_equal(graft_persist_wait(w, step, NULL), GRAFT_OK);
}

static void dash_start(dash_t *d, const char *name, const char *const *extra)
{
    char listen[64];
    d->port = gc_free_port();
    snprintf(listen, sizeof(listen), "127.0.0.1:%d", d->port);
    snprintf(d->log, sizeof(d->log), "%s/%s.log", gc_tmpdir, name);
    const char *argv[32] = {gc_ctl_bin, "--etcd", gc_endpoint, "--job", "dash-remote", "dashboard",
                            "--listen", listen, "--interval-ms", "100", "--ckpt-root", ck_root};
    size_t n = 12;
    for (size_t i = 0; extra[i] != NULL && n < 31; i++)
        argv[n++] = extra[i];
    argv[n] = NULL;
    d->pid = gc_spawn_logged(argv, strrchr(d->log, '/') + 1);
    for (int i = 0; i < 150; i++) {
        if (gc_http(d->port, "GET", "/api/state", NULL, NULL, NULL) == 200)
            return;
        gc_sleep_ms(100);
    }
    fail_msg("the dashboard did not answer: %s", gc_slurp(d->log));
}

static void dash_stop(dash_t *d)
{
    int ws = 0;
    kill(d->pid, SIGTERM);
    assert_int_equal(waitpid(d->pid, &ws, 0), d->pid);
    assert_true(WIFEXITED(ws) && WEXITSTATUS(ws) == 0);
}

/* /api/state's "remote" once done(remote) holds (up to 20 s). */
static json_t *wait_remote(dash_t *d, bool (*done)(json_t *))
{
    char *body = NULL;
    for (int i = 0; i < 200; i++) {
        assert_int_equal(gc_http(d->port, "GET", "/api/state", NULL, NULL, &body), 200);
        json_t *s = json_loads(body, 0, NULL);
        assert_non_null(s);
        json_t *r = json_incref(json_object_get(s, "remote"));
        json_decref(s);
        if (done(r)) {
            free(body);
            return r;
        }
        json_decref(r);
        if (i < 199)
            free(body);
        gc_sleep_ms(100);
    }
    fail_msg("the dashboard's remote tier never came: %s", body);
    return NULL;
}

static bool listed(json_t *r)
{
    return json_is_integer(json_object_get(r, "listed_unix_ms"));
}

static bool caught_up(json_t *r)
{
    return json_integer_value(json_object_get(r, "lag_steps")) == 0 &&
           json_is_integer(json_object_get(r, "lag_steps"));
}

static int setup(void **state)
{
    if (gc_setup(state) != 0 || curl_global_init(CURL_GLOBAL_DEFAULT) != CURLE_OK)
        return -1;
    int rc = graft_test_s3_proxied_setup(&s3, &proxy, "graft-dash");
    if (rc < 0)
        return -1;
    have_s3 = rc == 0;
    const char *eps[] = {gc_endpoint};
    graft_etcd_config_t ec = {.endpoints = eps, .n_endpoints = 1};
    graft_membership_config_t mc = {.job = "dash-remote", .etcd = &ec, .group = 0};
    if (graft_membership_create(&mc, &job_member) != GRAFT_OK)
        return -1;
    snprintf(ck_root, sizeof(ck_root), "%s/ckpt", gc_tmpdir);
    return 0;
}

static int teardown(void **state)
{
    graft_membership_destroy(job_member);
    if (have_s3) {
        graft_test_s3_proxy_stop(&proxy);
        graft_test_s3_stop(&s3);
    }
    curl_global_cleanup();
    return gc_teardown(state);
}

static void test_both_tiers_and_lag(void **state)
{
    if (!have_s3)
        skip(); /* no moto_server: setup() said why */
    /* Steps 10 and 20 in both tiers; 30, 1.2 s later, on disk only. */
    graft_persist_writer_t *w = writer(true);
    save(w, 10);
    assert_int_equal(graft_persist_remote_flush(w, 60000), GRAFT_OK);
    save(w, 20);
    assert_int_equal(graft_persist_remote_flush(w, 60000), GRAFT_OK);
    graft_persist_writer_destroy(w);
    gc_sleep_ms(1200);
    w = writer(false);
    save(w, 30);
    graft_persist_writer_destroy(w);

    setenv("GRAFT_PERSIST_REMOTE_ENDPOINT", proxy.endpoint, 1);
    dash_t d;
    dash_start(&d, "both", (const char *const[]){"--ckpt-remote", URL, NULL});
    json_t *r = wait_remote(&d, listed);
    int forwarded = atomic_load(&proxy.forwarded);
    assert_string_equal(json_string_value(json_object_get(r, "url")), URL);
    assert_string_equal(json_string_value(json_object_get(r, "error")), "");
    json_t *cks = json_object_get(r, "checkpoints");
    assert_int_equal(json_array_size(cks), 2);
    assert_int_equal(json_integer_value(json_object_get(json_array_get(cks, 0), "step")), 20);
    assert_string_equal(json_string_value(json_object_get(json_array_get(cks, 0), "state")),
                        "complete");
    assert_int_equal(json_integer_value(json_object_get(r, "lag_steps")), 10);
    double lag_s = json_real_value(json_object_get(r, "lag_seconds"));
    if (lag_s < 1.2 || lag_s > 60)
        fail_msg("lag_seconds %.3f, not 1.2 .. 60", lag_s);
    json_decref(r);

    /* Cheap: at most one more request to the store in 3 s of 100 ms
     * refreshes (one LIST each GRAFTCTL_DASH_REMOTE_MS). */
    gc_sleep_ms(3000);
    assert_true(atomic_load(&proxy.forwarded) - forwarded <= 1);

    /* Step 30 uploaded: the next listing shows no lag. */
    w = writer(true);
    assert_int_equal(graft_persist_remote_upload(w, 30), GRAFT_OK);
    assert_int_equal(graft_persist_remote_flush(w, 60000), GRAFT_OK);
    graft_persist_writer_destroy(w);
    r = wait_remote(&d, caught_up);
    assert_int_equal(json_integer_value(json_object_get(json_array_get(
                         json_object_get(r, "checkpoints"), 0), "step")),
                     30);
    assert_true(json_real_value(json_object_get(r, "lag_seconds")) == 0.0);
    json_decref(r);
    dash_stop(&d);
    unsetenv("GRAFT_PERSIST_REMOTE_ENDPOINT");
}

static bool errored(json_t *r)
{
    const char *e = json_string_value(json_object_get(r, "error"));
    return e != NULL && e[0] != '\0';
}

static void test_credentials_missing_and_none(void **state)
{
    if (!have_s3)
        skip();
    char *id = strdup(getenv("AWS_ACCESS_KEY_ID")), *key = strdup(getenv("AWS_SECRET_ACCESS_KEY"));
    unsetenv("AWS_ACCESS_KEY_ID");
    unsetenv("AWS_SECRET_ACCESS_KEY");
    setenv("AWS_SHARED_CREDENTIALS_FILE", "/nonexistent/credentials", 1);
    /* The job's own setting names the bucket. */
    setenv("GRAFT_PERSIST_REMOTE", URL, 1);
    setenv("GRAFT_PERSIST_REMOTE_ENDPOINT", s3.endpoint, 1);
    dash_t d;
    dash_start(&d, "nocreds", (const char *const[]){NULL});
    json_t *r = wait_remote(&d, errored);
    assert_non_null(strstr(json_string_value(json_object_get(r, "error")),
                           "no credentials: AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY"));
    assert_true(json_is_null(json_object_get(r, "lag_steps")));
    json_decref(r);
    dash_stop(&d);
    setenv("AWS_ACCESS_KEY_ID", id, 1);
    setenv("AWS_SECRET_ACCESS_KEY", key, 1);
    unsetenv("AWS_SHARED_CREDENTIALS_FILE");
    unsetenv("GRAFT_PERSIST_REMOTE");
    unsetenv("GRAFT_PERSIST_REMOTE_ENDPOINT");
    free(id);
    free(key);

    /* No remote tier at all: null, and the page says how to give one. */
    dash_start(&d, "none", (const char *const[]){NULL});
    char *body = NULL;
    assert_int_equal(gc_http(d.port, "GET", "/api/state", NULL, NULL, &body), 200);
    json_t *s = json_loads(body, 0, NULL);
    assert_true(json_is_null(json_object_get(s, "remote")));
    json_decref(s);
    free(body);
    assert_int_equal(gc_http(d.port, "GET", "/", NULL, NULL, &body), 200);
    assert_non_null(strstr(body, "give --ckpt-remote or GRAFT_PERSIST_REMOTE"));
    free(body);
    dash_stop(&d);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_both_tiers_and_lag),
        cmocka_unit_test(test_credentials_missing_and_none),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
