/*
 * The remote tier against a real S3-compatible server (moto_server) with
 * HTTP faults from tests/support/s3_fault_proxy.c. No multipart upload is
 * left behind: an upload whose parts fail past the retries and whose abort
 * is refused too is aborted by the same writer once the store answers
 * again; one left by a writer that is gone is aborted by the next writer's
 * start once it sent nothing for the idle time, and not before (it could
 * be a live writer's). A slow store: parts answered later than the request
 * timeout are resent and the upload completes, or fails naming the part
 * and the timeout; saves are never held up meanwhile.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "graft_internal.h"
#include "s3_fault_proxy.h"
#include "s3_fixture.h"
#include "persist_fixture.h"

#define BYTES (11u << 20) /* three 5 MiB parts */

static const uint8_t secret[] = "remote-clean-test-secret";

typedef struct fix {
    graft_test_s3_t s3;
    graft_test_s3_proxy_t proxy;
    char *root;
    uint8_t *w;
    uint64_t stepv;
    graft_persist_region_t regions[2];
} fix_t;

static int setup(void **state)
{
    fix_t *f = calloc(1, sizeof(*f));
    *state = NULL; /* skipped (no moto_server) or failed */
    int rc = graft_test_s3_proxied_setup(&f->s3, &f->proxy, "graft-clean");
    if (rc != 0) {
        free(f);
        return rc > 0 ? 0 : -1;
    }
    f->root = pt_tmpdir();
    f->w = malloc(BYTES);
    pt_fill(f->w, BYTES, 41);
    f->stepv = 10;
    f->regions[0] = (graft_persist_region_t){.name = "w", .kind = GRAFT_PERSIST_KIND_PARAM,
                                             .dtype = 1, .ptr = f->w, .bytes = BYTES};
    f->regions[1] = (graft_persist_region_t){.name = "step", .kind = GRAFT_PERSIST_KIND_STEP,
                                             .dtype = 2, .ptr = &f->stepv,
                                             .bytes = sizeof(uint64_t)};
    *state = f;
    return 0;
}

static int teardown(void **state)
{
    fix_t *f = *state;
    if (f == NULL)
        return 0;
    graft_test_s3_proxy_stop(&f->proxy);
    graft_test_s3_stop(&f->s3);
    pt_rmtree(f->root);
    free(f->w);
    free(f);
    return 0;
}


static graft_persist_writer_t *writer_make(fix_t *f, const graft_persist_remote_config_t *remote)
{
    graft_persist_config_t cfg = {.root = f->root, .compression_level = 0,
                                  .chunk_bytes = 1u << 20, .secret = secret,
                                  .secret_len = sizeof(secret), .remote = remote};
    graft_persist_writer_t *w = NULL;
    assert_int_equal(graft_persist_writer_create(&cfg, &w), GRAFT_OK);
    return w;
}

/* The multipart uploads the server holds, asked of it directly. */
static int uploads_in_store(const fix_t *f)
{
    uint8_t *data = NULL;
    size_t len = 0;
    assert_int_equal(graft_test_s3_get(&f->s3, "?uploads", &data, &len), 200);
    int n = 0;
    for (const char *p = strstr((const char *)data, "<UploadId>"); p != NULL;
         p = strstr(p + 1, "<UploadId>"))
        n++;
    free(data);
    return n;
}

static graft_persist_remote_stats_t stats_of(graft_persist_writer_t *w)
{
    graft_persist_remote_stats_t st;
    assert_int_equal(graft_persist_remote_stats(w, &st), GRAFT_OK);
    return st;
}

/* A writer through the proxy whose first upload fails: every request about
 * a multipart upload (its parts, ListParts, the abort) answered 500, one
 * retry each, after the first part when with_part (one part at a time).
 * The store is left holding the upload. */
static graft_persist_writer_t *upload_abandoned(fix_t *f, graft_persist_remote_config_t *remote,
                                                bool with_part)
{
    *remote = graft_test_s3_remote(&f->s3, "clean");
    remote->endpoint = f->proxy.endpoint;
    remote->max_retries = 1;
    remote->backoff_ms = 10;
    remote->parallel = 1;
    graft_persist_writer_t *w = writer_make(f, remote);
    graft_test_s3_proxy_inject_after(&f->proxy, "uploadId=", with_part ? 1 : 0, 100000, 500, 0);
    const graft_persist_region_t *rp[1] = {f->regions};
    size_t nr[1] = {2};
    assert_int_equal(graft_persist_save(w, 10, 1, rp, nr, NULL), GRAFT_OK);
    assert_int_equal(graft_persist_wait(w, 10, NULL), GRAFT_OK);
    assert_int_equal(graft_persist_remote_flush(w, 60000), GRAFT_OK);
    graft_persist_remote_stats_t st = stats_of(w);
    assert_int_equal(st.uploaded, 0);
    assert_int_equal(st.failed, 1);
    assert_int_equal(st.aborted_uploads, 0);
    assert_int_equal(uploads_in_store(f), 1);
    graft_test_s3_proxy_inject(&f->proxy, "uploadId=", 0, 500, 0);
    return w;
}

/* A part failed past the retries and the abort was refused: the same
 * writer aborts the upload after its next upload, once the store answers. */
static void test_failed_upload_aborted_later(void **state)
{
    fix_t *f = *state;
    if (f == NULL)
        skip(); /* no moto_server: setup() said why */
    graft_persist_remote_config_t remote;
    graft_persist_writer_t *w = upload_abandoned(f, &remote, false);
    assert_int_equal(graft_persist_remote_upload(w, 10), GRAFT_OK);
    assert_int_equal(graft_persist_remote_flush(w, 60000), GRAFT_OK);
    graft_persist_remote_stats_t st = stats_of(w);
    if (st.uploaded != 1)
        fprintf(stderr, "second upload: %s\n", st.last_error);
    assert_int_equal(st.uploaded, 1);
    assert_int_equal(st.aborted_uploads, 1);
    assert_int_equal(uploads_in_store(f), 0);
    graft_persist_writer_destroy(w);
}

/* The writer that began the upload is gone, one part stored: a new writer
 * leaves it while it may still be live (a part within the idle time), and
 * aborts it at its start once its newest part is older than that. */
static void test_abandoned_upload_aborted_at_start(void **state)
{
    fix_t *f = *state;
    if (f == NULL)
        skip(); /* no moto_server: setup() said why */
    graft_persist_remote_config_t remote;
    graft_persist_writer_t *w = upload_abandoned(f, &remote, true);
    graft_persist_writer_destroy(w);
    assert_int_equal(uploads_in_store(f), 1);

    /* Young: not touched, even after an upload's sweep. */
    graft_persist_remote_config_t direct = graft_test_s3_remote(&f->s3, "clean");
    direct.abandoned_after_ms = 120000;
    w = writer_make(f, &direct);
    assert_int_equal(graft_persist_remote_upload(w, 10), GRAFT_OK);
    assert_int_equal(graft_persist_remote_flush(w, 60000), GRAFT_OK);
    assert_int_equal(stats_of(w).uploaded, 1);
    assert_int_equal(stats_of(w).aborted_uploads, 0);
    assert_int_equal(uploads_in_store(f), 1);
    graft_persist_writer_destroy(w);

    /* Idle for longer than abandoned_after_ms: the next start aborts it,
     * with nothing uploaded. */
    sleep(3);
    direct.abandoned_after_ms = 1500;
    w = writer_make(f, &direct);
    int n = 1;
    uint64_t aborted = 0;
    for (int i = 0; i < 500 && (n != 0 || aborted == 0); i++) {
        usleep(20000);
        n = uploads_in_store(f);
        aborted = stats_of(w).aborted_uploads;
    }
    assert_int_equal(n, 0);
    assert_int_equal(aborted, 1);
    assert_int_equal(stats_of(w).uploaded, 0);
    graft_persist_writer_destroy(w);
    /* The checkpoint itself is intact in the bucket. */
    char *keys = graft_test_s3_keys(&f->s3, "clean/");
    assert_non_null(keys);
    assert_non_null(strstr(keys, "clean/step-00000000000000000010/manifest.pb\n"));
    assert_non_null(strstr(keys, "clean/step-00000000000000000010/shard-0-of-1\n"));
    free(keys);
}

/* ------------------------------------------------------- a slow store --- */

static double save_wait_s(fix_t *f, graft_persist_writer_t *w, uint64_t step)
{
    const graft_persist_region_t *rp[1] = {f->regions};
    size_t nr[1] = {2};
    uint64_t t0 = graft__now_ns();
    assert_int_equal(graft_persist_save(w, step, 1, rp, nr, NULL), GRAFT_OK);
    assert_int_equal(graft_persist_wait(w, step, NULL), GRAFT_OK);
    return (double)(graft__now_ns() - t0) / 1e9;
}

/* A writer through the proxy (one part at a time, the given request
 * timeout and retries) whose next n parts are answered delay_ms late. */
static graft_persist_writer_t *slow_writer(fix_t *f, graft_persist_remote_config_t *r,
                                           uint32_t timeout_ms, uint32_t max_retries, int n,
                                           int delay_ms)
{
    *r = graft_test_s3_remote(&f->s3, "slow");
    r->endpoint = f->proxy.endpoint;
    r->timeout_ms = timeout_ms;
    r->max_retries = max_retries;
    r->backoff_ms = 10;
    r->parallel = 1;
    graft_persist_writer_t *w = writer_make(f, r);
    graft_test_s3_proxy_delay(&f->proxy, "partNumber=", n, delay_ms);
    return w;
}

/* Two parts answered 3 s late with a 1.5 s request timeout: both are
 * resent and the upload completes, bit-exact; a save meanwhile takes no
 * longer than a local save. */
static void test_slow_store_completes(void **state)
{
    fix_t *f = *state;
    if (f == NULL)
        skip();
    graft_persist_remote_config_t remote;
    graft_persist_writer_t *w = slow_writer(f, &remote, 1500, 3, 2, 3000);
    uint64_t t0 = graft__now_ns();
    (void)save_wait_s(f, w, 10);
    /* The upload of step 10 is stuck on its first part: a save now. */
    double save_s = save_wait_s(f, w, 20);
    graft_persist_remote_stats_t st = stats_of(w);
    assert_int_equal(st.uploaded, 0);
    assert_true(st.waiting >= 1);
    assert_true(save_s < 1.0);
    assert_int_equal(graft_persist_remote_flush(w, 60000), GRAFT_OK);
    st = stats_of(w);
    if (st.uploaded != 2)
        fprintf(stderr, "slow store: %s\n", st.last_error);
    assert_int_equal(st.uploaded, 2);
    assert_int_equal(st.failed, 0);
    assert_true(st.retries >= 2);
    assert_int_equal(atomic_load(&f->proxy.delayed), 2);
    assert_true(graft__now_ns() - t0 >= 3000000000ull); /* two timeouts at least */
    graft_persist_writer_destroy(w);
    /* Every host lost: step 10 from the bucket, bit-exact. */
    pt_rmtree_contents(f->root);
    uint8_t *back = calloc(1, BYTES);
    uint64_t stepv = 0;
    graft_persist_region_t regs[2] = {f->regions[0], f->regions[1]};
    regs[0].ptr = back;
    regs[1].ptr = &stepv;
    graft_persist_restore_params_t p = {.rank = 0, .ranks = 1, .regions = regs, .nregions = 2,
                                        .step = 10, .verify_full = true, .secret = secret,
                                        .secret_len = sizeof(secret)};
    graft_persist_remote_config_t direct = graft_test_s3_remote(&f->s3, "slow");
    assert_int_equal(graft_persist_remote_restore(&direct, f->root, &p, NULL), GRAFT_OK);
    assert_memory_equal(back, f->w, BYTES);
    assert_int_equal(stepv, 10);
    free(back);
}

/* Every part answered later than the timeout, one retry: the upload fails
 * with an error naming the part and the timeout, is aborted (nothing left
 * in the store), and saves went on. */
static void test_slow_store_times_out(void **state)
{
    fix_t *f = *state;
    if (f == NULL)
        skip();
    graft_persist_remote_config_t remote;
    graft_persist_writer_t *w = slow_writer(f, &remote, 1000, 1, 100000, 2500);
    (void)save_wait_s(f, w, 10);
    assert_true(save_wait_s(f, w, 20) < 1.0);
    assert_int_equal(graft_persist_remote_flush(w, 60000), GRAFT_OK);
    graft_persist_remote_stats_t st = stats_of(w);
    assert_int_equal(st.uploaded, 0);
    assert_true(st.failed >= 1);
    assert_int_equal(st.last_status, GRAFT_EIO);
    assert_non_null(strstr(st.last_error, "UploadPart 1 of slow/step-"));
    assert_non_null(strstr(st.last_error, "within the request timeout (timeout_ms 1000)"));
    assert_int_equal(uploads_in_store(f), 0);
    graft_persist_writer_destroy(w);
    uint64_t *steps = NULL;
    size_t n = 0;
    char why[256];
    graft_persist_remote_config_t direct = graft_test_s3_remote(&f->s3, "slow");
    assert_int_equal(graft_persist_remote_list(&direct, &steps, &n, why, sizeof(why)), GRAFT_OK);
    assert_int_equal(n, 0);
    graft_free(steps);
}

/* An upload that gives up after its shard is stored (every PUT of
 * manifest.json answered 500) leaves objects without a manifest.pb: never
 * listed, and removed once a newer checkpoint is complete in the bucket. */
static void test_given_up_upload_leftovers_removed(void **state)
{
    fix_t *f = *state;
    if (f == NULL)
        skip(); /* no moto_server: setup() said why */
    graft_persist_remote_config_t remote = graft_test_s3_remote(&f->s3, "left");
    remote.endpoint = f->proxy.endpoint;
    remote.max_retries = 1;
    remote.backoff_ms = 10;
    graft_persist_writer_t *w = writer_make(f, &remote);
    graft_test_s3_proxy_inject(&f->proxy, "manifest.json", 100000, 500, 0);
    const graft_persist_region_t *rp[1] = {f->regions};
    size_t nr[1] = {2};
    assert_int_equal(graft_persist_save(w, 10, 1, rp, nr, NULL), GRAFT_OK);
    assert_int_equal(graft_persist_wait(w, 10, NULL), GRAFT_OK);
    assert_int_equal(graft_persist_remote_flush(w, 60000), GRAFT_OK);
    graft_persist_remote_stats_t st = stats_of(w);
    assert_int_equal(st.failed, 1);
    assert_non_null(strstr(st.last_error, "manifest.json"));
    char *keys = graft_test_s3_keys(&f->s3, "left/");
    assert_non_null(keys);
    assert_non_null(strstr(keys, "left/step-00000000000000000010/shard-0-of-1\n"));
    assert_null(strstr(keys, "manifest.pb"));
    free(keys);
    char why[512];
    uint64_t *steps = NULL;
    size_t n = 9;
    graft_persist_remote_config_t direct = graft_test_s3_remote(&f->s3, "left");
    assert_int_equal(graft_persist_remote_list(&direct, &steps, &n, why, sizeof(why)), GRAFT_OK);
    assert_int_equal(n, 0);

    /* A newer checkpoint completes: step 10's objects go with the sweep
     * that follows it, and a prefix newer than it (an upload perhaps
     * still going) stays. */
    assert_int_equal(graft_test_s3_put(&f->s3, "left/step-00000000000000000030/shard-0-of-1",
                                       (const uint8_t *)"x", 1), 200);
    graft_test_s3_proxy_inject(&f->proxy, "manifest.json", 0, 500, 0);
    f->stepv = 20;
    assert_int_equal(graft_persist_save(w, 20, 1, rp, nr, NULL), GRAFT_OK);
    assert_int_equal(graft_persist_wait(w, 20, NULL), GRAFT_OK);
    assert_int_equal(graft_persist_remote_flush(w, 60000), GRAFT_OK);
    st = stats_of(w);
    if (st.uploaded != 1)
        fprintf(stderr, "upload of step 20: %s\n", st.last_error);
    assert_int_equal(st.uploaded, 1);
    assert_int_equal(st.leftovers_removed, 1);
    graft_persist_writer_destroy(w);
    keys = graft_test_s3_keys(&f->s3, "left/");
    assert_non_null(keys);
    assert_null(strstr(keys, "step-00000000000000000010/"));
    assert_non_null(strstr(keys, "left/step-00000000000000000020/manifest.pb\n"));
    assert_non_null(strstr(keys, "left/step-00000000000000000030/shard-0-of-1\n"));
    free(keys);
    assert_int_equal(graft_persist_remote_list(&direct, &steps, &n, why, sizeof(why)), GRAFT_OK);
    assert_int_equal(n, 1);
    assert_int_equal(steps[0], 20);
    graft_free(steps);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_failed_upload_aborted_later, setup, teardown),
        cmocka_unit_test_setup_teardown(test_abandoned_upload_aborted_at_start, setup, teardown),
        cmocka_unit_test_setup_teardown(test_slow_store_completes, setup, teardown),
        cmocka_unit_test_setup_teardown(test_slow_store_times_out, setup, teardown),
        cmocka_unit_test_setup_teardown(test_given_up_upload_leftovers_removed, setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
