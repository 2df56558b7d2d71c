/*
 * The remote tier against a real S3-compatible server (moto_server, started
 * by tests/support/s3_fixture.c on a free loopback port): an upload and a
 * restore that end bit-exact (and reshard); the server killed mid-upload and restarted, with no
 * incomplete checkpoint ever listed; saves never held up by a store that
 * is down, older waiting checkpoints superseded; a corrupt or missing
 * object found on restore with a fallback to the older checkpoint;
 * missing credentials named, and credentials the store refuses, the local
 * tier unaffected either way; remote retention, milestones kept.
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

#define RANKS 2u
#define PER_RANK (11u << 20) /* three 5 MiB parts per shard */

static const uint8_t secret[] = "remote-tier-test-secret";

typedef struct fix {
    graft_test_s3_t s3;
    char *root;
} fix_t;

static int setup(void **state)
{
    fix_t *f = calloc(1, sizeof(*f));
    int rc = graft_test_s3_setup(&f->s3, "graft-ckpt");
    if (rc != 0) {
        free(f);
        *state = NULL;
        return rc > 0 ? 0 : -1;
    }
    f->root = pt_tmpdir();
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
    free(f);
    return 0;
}

#define NEED_SERVER(f)                                                                       \
    do {                                                                                     \
        if ((f) == NULL)                                                                     \
            skip(); /* no moto_server: the reason is printed by setup() */                  \
    } while (0)

/* Two ranks, each holding half of region "w" and its own "step" region. */
typedef struct state2 {
    uint8_t *w[RANKS];
    uint64_t stepv[RANKS];
    graft_persist_region_t regions[RANKS][2];
    const graft_persist_region_t *rp[RANKS];
    size_t nregions[RANKS];
} state2_t;

static void state_make(state2_t *s, uint64_t seed, uint64_t per_rank)
{
    for (uint32_t r = 0; r < RANKS; r++) {
        s->w[r] = malloc(per_rank);
        pt_fill(s->w[r], per_rank, seed * 7 + r);
        s->stepv[r] = seed;
        s->regions[r][0] = (graft_persist_region_t){.name = "w", .kind = GRAFT_PERSIST_KIND_PARAM,
                                                    .dtype = 1, .ptr = s->w[r], .bytes = per_rank,
                                                    .global_offset = r * per_rank,
                                                    .global_bytes = RANKS * per_rank};
        /* Rank r's own region ("step" is not split: only one rank may
         * hold it). */
        s->regions[r][1] = (graft_persist_region_t){.name = r == 0 ? "step0" : "step1",
                                                    .kind = GRAFT_PERSIST_KIND_STEP, .dtype = 2,
                                                    .ptr = &s->stepv[r], .bytes = sizeof(uint64_t)};
        s->rp[r] = s->regions[r];
        s->nregions[r] = 2;
    }
}

static void state_free(state2_t *s)
{
    for (uint32_t r = 0; r < RANKS; r++)
        free(s->w[r]);
}

static graft_persist_writer_t *writer_make(const char *root,
                                           const graft_persist_remote_config_t *remote)
{
    graft_persist_config_t cfg = {.root = root, .compression_level = 0, .chunk_bytes = 1u << 20,
                                  .secret = secret, .secret_len = sizeof(secret),
                                  .remote = remote};
    graft_persist_writer_t *w = NULL;
    assert_int_equal(graft_persist_writer_create(&cfg, &w), GRAFT_OK);
    return w;
}

static void save(graft_persist_writer_t *w, uint64_t step, state2_t *s)
{
    assert_int_equal(graft_persist_save(w, step, RANKS, s->rp, s->nregions, NULL), GRAFT_OK);
    assert_int_equal(graft_persist_wait(w, step, NULL), GRAFT_OK);
}

/* Restore every rank from the bucket into an empty local root and compare
 * with s; returns the step restored. */
static uint64_t restore_check(const graft_persist_remote_config_t *remote, const char *root,
                              const state2_t *s, uint64_t per_rank,
                              graft_persist_restore_result_t *res_p)
{
    uint64_t got_step = 0;
    for (uint32_t r = 0; r < RANKS; r++) {
        uint8_t *w = calloc(1, per_rank);
        uint64_t stepv = 0;
        graft_persist_region_t regs[2] = {s->regions[r][0], s->regions[r][1]};
        regs[0].ptr = w;
        regs[1].ptr = &stepv;
        graft_persist_restore_params_t p = {.rank = r, .ranks = RANKS, .regions = regs,
                                            .nregions = 2, .verify_full = true,
                                            .secret = secret, .secret_len = sizeof(secret)};
        graft_persist_restore_result_t res;
        assert_int_equal(graft_persist_remote_restore(remote, root, &p, &res), GRAFT_OK);
        assert_memory_equal(w, s->w[r], per_rank);
        assert_int_equal(stepv, s->stepv[r]);
        got_step = res.step;
        if (res_p != NULL)
            *res_p = res;
        free(w);
    }
    return got_step;
}

static void flush_ok(graft_persist_writer_t *w, uint64_t want_uploaded)
{
    assert_int_equal(graft_persist_remote_flush(w, 120000), GRAFT_OK);
    graft_persist_remote_stats_t st;
    assert_int_equal(graft_persist_remote_stats(w, &st), GRAFT_OK);
    if (st.uploaded != want_uploaded)
        fprintf(stderr, "uploaded %llu, failed %llu: %s\n", (unsigned long long)st.uploaded,
                (unsigned long long)st.failed, st.last_error);
    assert_int_equal(st.uploaded, want_uploaded);
}

/* The bucket lists exactly these complete checkpoints (newest first). */
static void assert_remote_steps(const graft_persist_remote_config_t *remote,
                                const uint64_t *want, size_t nwant)
{
    uint64_t *steps = NULL;
    size_t n = 0;
    char why[512];
    assert_int_equal(graft_persist_remote_list(remote, &steps, &n, why, sizeof(why)), GRAFT_OK);
    assert_int_equal(n, nwant);
    for (size_t i = 0; i < n; i++)
        assert_int_equal(steps[i], want[i]);
    graft_free(steps);
}

/* ------------------------------------------------------------ round trip --- */

static void test_upload_restore_bit_exact(void **state)
{
    fix_t *f = *state;
    NEED_SERVER(f);
    graft_persist_remote_config_t remote = graft_test_s3_remote(&f->s3, "jobs/a");
    state2_t s;
    state_make(&s, 10, PER_RANK);
    graft_persist_writer_t *w = writer_make(f->root, &remote);
    save(w, 10, &s);
    flush_ok(w, 1);
    graft_persist_remote_stats_t st;
    assert_int_equal(graft_persist_remote_stats(w, &st), GRAFT_OK);
    assert_true(st.enabled);
    assert_true(st.has_uploaded);
    assert_int_equal(st.last_uploaded_step, 10);
    assert_true(st.bytes_sent >= RANKS * (uint64_t)PER_RANK);
    graft_persist_writer_destroy(w);

    /* The layout of docs/FORMAT.md, "Remote layout". */
    char *keys = graft_test_s3_keys(&f->s3, "jobs/a/");
    assert_non_null(keys);
    assert_non_null(strstr(keys, "jobs/a/step-00000000000000000010/manifest.pb\n"));
    assert_non_null(strstr(keys, "jobs/a/step-00000000000000000010/manifest.json\n"));
    assert_non_null(strstr(keys, "jobs/a/step-00000000000000000010/shard-0-of-2\n"));
    assert_non_null(strstr(keys, "jobs/a/step-00000000000000000010/shard-1-of-2\n"));
    free(keys);
    assert_remote_steps(&remote, (const uint64_t[]){10}, 1);

    /* Every host lost: restore from the bucket into an empty root. */
    pt_rmtree_contents(f->root);
    graft_persist_restore_result_t res;
    assert_int_equal(restore_check(&remote, f->root, &s, PER_RANK, &res), 10);
    assert_int_equal(res.skipped, 0);
    /* The downloaded copy is a local checkpoint again. */
    assert_int_equal(graft_persist_verify_mac(f->root, 10, GRAFT_PERSIST_VERIFY_FULL, secret,
                                              sizeof(secret), NULL),
                     GRAFT_OK);

    /* Resharded onto one rank, from the bucket alone. */
    pt_rmtree_contents(f->root);
    uint8_t *all = calloc(1, RANKS * (uint64_t)PER_RANK);
    uint64_t stepv[RANKS] = {0};
    graft_persist_region_t one[3] = {
        {.name = "w", .kind = GRAFT_PERSIST_KIND_PARAM, .dtype = 1, .ptr = all,
         .bytes = RANKS * (uint64_t)PER_RANK},
        {.name = "step0", .kind = GRAFT_PERSIST_KIND_STEP, .dtype = 2, .ptr = &stepv[0],
         .bytes = sizeof(uint64_t)},
        {.name = "step1", .kind = GRAFT_PERSIST_KIND_STEP, .dtype = 2, .ptr = &stepv[1],
         .bytes = sizeof(uint64_t)}};
    graft_persist_restore_params_t p = {.rank = 0, .ranks = 1, .regions = one, .nregions = 3,
                                        .secret = secret, .secret_len = sizeof(secret)};
    assert_int_equal(graft_persist_remote_restore(&remote, f->root, &p, NULL), GRAFT_OK);
    for (uint32_t r = 0; r < RANKS; r++)
        assert_memory_equal(all + r * (uint64_t)PER_RANK, s.w[r], PER_RANK);
    assert_int_equal(stepv[1], 10);
    free(all);
    state_free(&s);
}

/* Distributed mode: each rank writes its shard, one rank commits, and the
 * committed checkpoint is handed to the uploader. */
static void test_distributed_commit_upload(void **state)
{
    fix_t *f = *state;
    NEED_SERVER(f);
    graft_persist_remote_config_t remote = graft_test_s3_remote(&f->s3, "dist");
    state2_t s;
    state_make(&s, 15, 2u << 20);
    graft_persist_writer_t *w = writer_make(f->root, &remote);
    uint8_t *infos[RANKS];
    size_t lens[RANKS];
    for (uint32_t r = 0; r < RANKS; r++)
        assert_int_equal(graft_persist_shard_write(w, 15, r, RANKS, s.regions[r], 2), GRAFT_OK);
    for (uint32_t r = 0; r < RANKS; r++)
        assert_int_equal(graft_persist_shard_wait(w, 15, r, &infos[r], &lens[r]), GRAFT_OK);
    graft_persist_commit_opts_t opts = {.secret = secret, .secret_len = sizeof(secret)};
    assert_int_equal(graft_persist_commit(f->root, 15, RANKS, (const uint8_t *const *)infos, lens,
                                          NULL, &opts),
                     GRAFT_OK);
    for (uint32_t r = 0; r < RANKS; r++)
        graft_free(infos[r]);
    assert_int_equal(graft_persist_remote_upload(w, 15), GRAFT_OK);
    flush_ok(w, 1);
    graft_persist_writer_destroy(w);
    pt_rmtree_contents(f->root);
    assert_int_equal(restore_check(&remote, f->root, &s, 2u << 20, NULL), 15);
    state_free(&s);

    /* Without a remote tier there is nothing to hand over to. */
    graft_persist_writer_t *plain = writer_make(f->root, NULL);
    assert_int_equal(graft_persist_remote_upload(plain, 15), GRAFT_ENOTSUP);
    graft_persist_writer_destroy(plain);
}

/* ----------------------------------------------------------- HTTP faults --- */

/* Lines of the server's request log that contain needle. */
static int log_count(const graft_test_s3_t *t, const char *needle)
{
    char path[300], line[2048];
    snprintf(path, sizeof(path), "%s/moto.log", t->dir);
    FILE *fp = fopen(path, "r");
    int n = 0;
    while (fp != NULL && fgets(line, sizeof(line), fp) != NULL)
        n += strstr(line, needle) != NULL;
    if (fp != NULL)
        fclose(fp);
    return n;
}

/* 503s with Retry-After on parts, 500s on the manifest: the part alone is
 * sent again after at least Retry-After, never the whole upload. */
static void test_http_faults_retried(void **state)
{
    fix_t *f = *state;
    NEED_SERVER(f);
    graft_test_s3_proxy_t proxy;
    assert_int_equal(graft_test_s3_proxy_start(&proxy, f->s3.port), 0);
    graft_persist_remote_config_t remote = graft_test_s3_remote(&f->s3, "faults");
    remote.endpoint = proxy.endpoint;
    state2_t s;
    state_make(&s, 25, PER_RANK);
    graft_persist_writer_t *w = writer_make(f->root, &remote);
    graft_test_s3_proxy_inject(&proxy, "partNumber=", 3, 503, 1);
    uint64_t t0 = graft__now_ns();
    save(w, 25, &s);
    flush_ok(w, 1);
    assert_true(graft__now_ns() - t0 >= 1000000000ull);
    assert_int_equal(atomic_load(&proxy.injected), 3);
    graft_persist_remote_stats_t st;
    assert_int_equal(graft_persist_remote_stats(w, &st), GRAFT_OK);
    assert_true(st.retries >= 3);
    /* One multipart upload per shard, each completed once. */
    assert_int_equal(log_count(&f->s3, "?uploads"), 2);
    assert_int_equal(log_count(&f->s3, "shard-0-of-2?uploadId="), 1);

    graft_test_s3_proxy_inject(&proxy, "manifest.pb", 2, 500, 0);
    save(w, 35, &s);
    flush_ok(w, 2);
    assert_int_equal(atomic_load(&proxy.injected), 5);
    graft_persist_writer_destroy(w);
    pt_rmtree_contents(f->root);
    assert_int_equal(restore_check(&remote, f->root, &s, PER_RANK, NULL), 35);
    graft_test_s3_proxy_stop(&proxy);
    state_free(&s);
}

/* ------------------------------------------------------- server killed --- */

/* Every checkpoint with a manifest.pb in the listing has all its objects. */
static void assert_listed_complete(const graft_test_s3_t *t, const char *prefix)
{
    char *keys = graft_test_s3_keys(t, prefix);
    if (keys == NULL)
        return; /* the server is down */
    for (char *p = strstr(keys, "/manifest.pb\n"); p != NULL; p = strstr(p + 1, "/manifest.pb\n")) {
        char *start = p;
        while (start > keys && start[-1] != '\n')
            start--;
        char dir[256], want[300];
        snprintf(dir, sizeof(dir), "%.*s", (int)(p - start), start);
        static const char *const names[] = {"shard-0-of-2", "shard-1-of-2", "manifest.json"};
        for (size_t i = 0; i < 3; i++) {
            snprintf(want, sizeof(want), "%s/%s\n", dir, names[i]);
            if (strstr(keys, want) == NULL)
                fail_msg("listed without %s: incomplete checkpoint visible", want);
        }
    }
    free(keys);
}

static void test_server_killed_mid_upload(void **state)
{
    fix_t *f = *state;
    NEED_SERVER(f);
    graft_persist_remote_config_t remote = graft_test_s3_remote(&f->s3, "killed");
    remote.parallel = 1;
    state2_t s;
    state_make(&s, 20, PER_RANK);
    graft_persist_writer_t *w = writer_make(f->root, &remote);
    save(w, 20, &s);
    /* Kill once the first part is stored, before the checkpoint is. */
    graft_persist_remote_stats_t st;
    for (int i = 0; i < 20000; i++) {
        assert_int_equal(graft_persist_remote_stats(w, &st), GRAFT_OK);
        if (st.bytes_sent > 0 || st.uploaded > 0)
            break;
        usleep(1000);
    }
    assert_int_equal(st.uploaded, 0);
    graft_test_s3_kill(&f->s3);
    usleep(700 * 1000);
    assert_int_equal(graft_test_s3_restart(&f->s3), 0);
    for (int i = 0; i < 100000; i++) {
        assert_listed_complete(&f->s3, "killed/");
        assert_int_equal(graft_persist_remote_stats(w, &st), GRAFT_OK);
        if (st.waiting == 0)
            break;
        usleep(5000);
    }
    flush_ok(w, 1);
    assert_int_equal(graft_persist_remote_stats(w, &st), GRAFT_OK);
    assert_true(st.retries > 0);
    graft_persist_writer_destroy(w);
    assert_listed_complete(&f->s3, "killed/");
    pt_rmtree_contents(f->root);
    assert_int_equal(restore_check(&remote, f->root, &s, PER_RANK, NULL), 20);
    state_free(&s);
}

/* A store that is down holds up no save; checkpoints waiting behind the
 * running upload are superseded by newer ones, and counted. */
static void test_store_down_supersedes(void **state)
{
    fix_t *f = *state;
    NEED_SERVER(f);
    graft_persist_remote_config_t remote = graft_test_s3_remote(&f->s3, "down");
    remote.max_retries = 40;
    state2_t s[4];
    graft_persist_writer_t *w = writer_make(f->root, &remote);
    graft_test_s3_kill(&f->s3);
    for (int i = 0; i < 4; i++) {
        state_make(&s[i], 50 + 10 * (uint64_t)i, 1u << 20);
        uint64_t t0 = graft__now_ns();
        save(w, 50 + 10 * (uint64_t)i, &s[i]);
        /* Saved locally in well under the store's downtime. */
        assert_true(graft__now_ns() - t0 < 2000000000ull);
    }
    graft_persist_remote_stats_t st;
    assert_int_equal(graft_persist_remote_stats(w, &st), GRAFT_OK);
    assert_int_equal(st.uploaded, 0);
    assert_true(st.superseded >= 2);
    assert_int_equal(st.newest_local_step, 80);
    assert_int_equal(graft_test_s3_restart(&f->s3), 0);
    assert_int_equal(graft_persist_remote_flush(w, 120000), GRAFT_OK);
    assert_int_equal(graft_persist_remote_stats(w, &st), GRAFT_OK);
    assert_true(st.has_uploaded);
    assert_int_equal(st.last_uploaded_step, 80);
    graft_persist_writer_destroy(w);
    pt_rmtree_contents(f->root);
    /* The restore sees the newest state. */
    assert_int_equal(restore_check(&remote, f->root, &s[3], 1u << 20, NULL), 80);
    for (int i = 0; i < 4; i++)
        state_free(&s[i]);
}

/* ------------------------------------------------------- corrupt object --- */

static void test_corrupt_object_falls_back(void **state)
{
    fix_t *f = *state;
    NEED_SERVER(f);
    graft_persist_remote_config_t remote = graft_test_s3_remote(&f->s3, "c");
    const uint64_t per = 3u << 20;
    state2_t s30, s40;
    state_make(&s30, 30, per);
    state_make(&s40, 40, per);
    graft_persist_writer_t *w = writer_make(f->root, &remote);
    save(w, 30, &s30);
    flush_ok(w, 1);
    save(w, 40, &s40);
    flush_ok(w, 2);
    graft_persist_writer_destroy(w);

    /* Bit rot in the store: one byte of step 40's second shard. */
    const char *key = "c/step-00000000000000000040/shard-1-of-2";
    uint8_t *data = NULL;
    size_t len = 0;
    assert_int_equal(graft_test_s3_get(&f->s3, key, &data, &len), 200);
    assert_true(len > per);
    data[len / 2] ^= 0x40;
    assert_int_equal(graft_test_s3_put(&f->s3, key, data, len), 200);
    free(data);

    pt_rmtree_contents(f->root);
    graft_persist_restore_result_t res;
    assert_int_equal(restore_check(&remote, f->root, &s30, per, &res), 30);
    assert_int_equal(res.skipped, 1);
    assert_non_null(strstr(res.skipped_reasons, "step 40: s3://graft-ckpt/c/step-00000000000000000040/"
                                                "shard-1-of-2"));
    /* The corrupt copy was not left behind as a local checkpoint. */
    graft_persist_entry_t *ents = NULL;
    size_t n = 0;
    assert_int_equal(graft_persist_list(f->root, &ents, &n), GRAFT_OK);
    assert_int_equal(n, 1);
    assert_int_equal(ents[0].step, 30);
    graft_free(ents);

    /* A missing object: named, and with nothing older, no checkpoint. */
    assert_int_equal(graft_test_s3_delete(&f->s3, "c/step-00000000000000000030/shard-0-of-2"),
                     204);
    pt_rmtree_contents(f->root);
    uint8_t *buf = calloc(1, per);
    uint64_t stepv;
    graft_persist_region_t regs[2] = {s30.regions[0][0], s30.regions[0][1]};
    regs[0].ptr = buf;
    regs[1].ptr = &stepv;
    /* verify_full: every shard downloaded and verified, so step 40 is
     * refused by rank 0 too, although rank 0 reads only shard 0 (without
     * it, rank 0 would read its own shard of step 40: test below and
     * tests/test_persist_remote_shards.c). */
    graft_persist_restore_params_t p = {.rank = 0, .ranks = RANKS, .regions = regs, .nregions = 2,
                                        .verify_full = true, .secret = secret,
                                        .secret_len = sizeof(secret)};
    assert_int_equal(graft_persist_remote_restore(&remote, f->root, &p, &res),
                     GRAFT_ENOCHECKPOINT);
    assert_int_equal(res.skipped, 2);
    assert_non_null(strstr(res.skipped_reasons, "step 30: s3://graft-ckpt/c/step-00000000000000000030/"
                                                "shard-0-of-2: missing from the store"));
    /* Without verify_full rank 0 downloads and verifies only its own
     * shard (shard 0, intact in step 40), checks shard 1 is stored with its
     * size, and takes step 40; nothing is left under the root. */
    p.verify_full = false;
    assert_int_equal(graft_persist_remote_restore(&remote, f->root, &p, &res), GRAFT_OK);
    assert_int_equal(res.step, 40);
    assert_memory_equal(buf, s40.w[0], per);
    assert_int_equal(graft_persist_list(f->root, &ents, &n), GRAFT_OK);
    assert_int_equal(n, 0);
    graft_free(ents);
    free(buf);
    state_free(&s30);
    state_free(&s40);
}

/* ----------------------------------------------------------- retention --- */

/* Save and upload steps 1..last (small) under remote's policy; returns
 * the checkpoints retention deleted from the bucket. */
static uint64_t upload_steps(const char *root, const graft_persist_remote_config_t *remote,
                             uint64_t last)
{
    graft_persist_writer_t *w = writer_make(root, remote);
    for (uint64_t i = 1; i <= last; i++) {
        state2_t s;
        state_make(&s, i, 64u << 10);
        save(w, i, &s);
        flush_ok(w, i);
        state_free(&s);
    }
    graft_persist_remote_stats_t st;
    assert_int_equal(graft_persist_remote_stats(w, &st), GRAFT_OK);
    graft_persist_writer_destroy(w);
    return st.deleted;
}

static void test_remote_retention(void **state)
{
    fix_t *f = *state;
    NEED_SERVER(f);
    graft_persist_remote_config_t remote = graft_test_s3_remote(&f->s3, "ret");
    remote.keep_last = 2;
    assert_int_equal(upload_steps(f->root, &remote, 4), 2);
    char *keys = graft_test_s3_keys(&f->s3, "ret/");
    assert_non_null(keys);
    /* Whole checkpoints gone, not only their manifests. */
    assert_null(strstr(keys, "step-00000000000000000001/"));
    assert_null(strstr(keys, "step-00000000000000000002/"));
    assert_non_null(strstr(keys, "step-00000000000000000003/manifest.pb"));
    assert_non_null(strstr(keys, "step-00000000000000000004/shard-1-of-2"));
    free(keys);
    /* The local tier keeps its own policy (none here): all four. */
    graft_persist_entry_t *ents = NULL;
    size_t n = 0;
    assert_int_equal(graft_persist_list(f->root, &ents, &n), GRAFT_OK);
    assert_int_equal(n, 4);
    graft_free(ents);
}

/* Milestones survive remote retention as on disk: keep_last 2 and every
 * third step, over steps 1..7, leave 3, 6 and 7 whole in the bucket. */
static void test_remote_retention_milestones(void **state)
{
    fix_t *f = *state;
    NEED_SERVER(f);
    graft_persist_remote_config_t remote = graft_test_s3_remote(&f->s3, "mil");
    remote.keep_last = 2;
    remote.milestone_every = 3;
    assert_int_equal(upload_steps(f->root, &remote, 7), 4);
    assert_remote_steps(&remote, (const uint64_t[]){7, 6, 3}, 3);
    char *keys = graft_test_s3_keys(&f->s3, "mil/");
    assert_non_null(keys);
    for (int gone = 1; gone <= 5; gone++) {
        char pfx[64];
        snprintf(pfx, sizeof(pfx), "step-%020d/", gone);
        assert_true((strstr(keys, pfx) == NULL) == (gone != 3));
    }
    assert_non_null(strstr(keys, "mil/step-00000000000000000003/shard-0-of-2\n"));
    free(keys);
}

/* --------------------------------------------------------- credentials --- */

static void test_credentials_missing(void **state)
{
    fix_t *f = *state;
    NEED_SERVER(f);
    graft_persist_remote_config_t remote = graft_test_s3_remote(&f->s3, "creds");
    char credfile[4096];
    snprintf(credfile, sizeof(credfile), "%s/no-such-credentials", f->root);
    unsetenv("AWS_ACCESS_KEY_ID");
    unsetenv("AWS_SECRET_ACCESS_KEY");
    setenv("AWS_SHARED_CREDENTIALS_FILE", credfile, 1);

    /* The local tier is unaffected; every upload fails, naming what is
     * missing. */
    state2_t s;
    state_make(&s, 5, 256u << 10);
    graft_persist_writer_t *w = writer_make(f->root, &remote);
    save(w, 5, &s);
    assert_int_equal(graft_persist_remote_flush(w, 60000), GRAFT_OK);
    graft_persist_remote_stats_t st;
    assert_int_equal(graft_persist_remote_stats(w, &st), GRAFT_OK);
    assert_int_equal(st.uploaded, 0);
    assert_int_equal(st.failed, 1);
    assert_int_equal(st.last_status, GRAFT_EINVAL);
    assert_non_null(strstr(st.last_error, "AWS_ACCESS_KEY_ID"));
    assert_non_null(strstr(st.last_error, credfile));
    graft_persist_writer_destroy(w);
    assert_int_equal(graft_persist_verify_mac(f->root, 5, GRAFT_PERSIST_VERIFY_FULL, secret,
                                              sizeof(secret), NULL),
                     GRAFT_OK);

    uint64_t *steps = NULL;
    size_t n = 0;
    char why[512] = "";
    assert_int_equal(graft_persist_remote_list(&remote, &steps, &n, why, sizeof(why)),
                     GRAFT_EINVAL);
    assert_non_null(strstr(why, "no credentials"));

    /* Half a pair: the missing half is named. */
    setenv("AWS_ACCESS_KEY_ID", GRAFT_TEST_S3_KEY_ID, 1);
    assert_int_equal(graft_persist_remote_list(&remote, &steps, &n, why, sizeof(why)),
                     GRAFT_EINVAL);
    assert_non_null(strstr(why, "AWS_SECRET_ACCESS_KEY is not"));
    unsetenv("AWS_ACCESS_KEY_ID");

    /* A credentials file with the profile works. */
    FILE *fp = fopen(credfile, "w");
    assert_non_null(fp);
    fprintf(fp, "[other]\naws_access_key_id = x\n\n[default]\naws_access_key_id = %s\n"
                "aws_secret_access_key = %s\n",
            GRAFT_TEST_S3_KEY_ID, GRAFT_TEST_S3_SECRET);
    fclose(fp);
    assert_int_equal(graft_persist_remote_list(&remote, &steps, &n, why, sizeof(why)), GRAFT_OK);
    assert_int_equal(n, 0);
    remote.profile = "other";
    assert_int_equal(graft_persist_remote_list(&remote, &steps, &n, why, sizeof(why)),
                     GRAFT_EINVAL);
    assert_non_null(strstr(why, "[other] profile with aws_secret_access_key"));

    /* A bad URL is refused when the writer is made. */
    remote.url = "s3:/nobucket";
    graft_persist_config_t cfg = {.root = f->root, .remote = &remote};
    graft_persist_writer_t *bad = NULL;
    assert_int_equal(graft_persist_writer_create(&cfg, &bad), GRAFT_EINVAL);

    unsetenv("AWS_SHARED_CREDENTIALS_FILE");
    setenv("AWS_ACCESS_KEY_ID", GRAFT_TEST_S3_KEY_ID, 1);
    setenv("AWS_SECRET_ACCESS_KEY", GRAFT_TEST_S3_SECRET, 1);
    state_free(&s);
}

/* Credentials the store does not know: the store's refusal is named, the
 * local tier goes on. */
static void test_credentials_refused(void **state)
{
    fix_t *f = *state;
    NEED_SERVER(f);
    graft_test_s3_t strict;
    assert_int_equal(graft_test_s3_start_auth(&strict, "graft-strict"), 0);
    graft_persist_remote_config_t remote = graft_test_s3_remote(&strict, "job");
    state2_t s;
    state_make(&s, 6, 256u << 10);
    graft_persist_writer_t *w = writer_make(f->root, &remote);
    save(w, 6, &s);
    assert_int_equal(graft_persist_remote_flush(w, 60000), GRAFT_OK);
    graft_persist_remote_stats_t st;
    assert_int_equal(graft_persist_remote_stats(w, &st), GRAFT_OK);
    assert_int_equal(st.uploaded, 0);
    assert_int_equal(st.failed, 1);
    assert_int_equal(st.last_status, GRAFT_EAUTH);
    assert_non_null(strstr(st.last_error, "HTTP 403 InvalidAccessKeyId"));
    assert_non_null(strstr(st.last_error, "AWS_ACCESS_KEY_ID"));
    /* Refused at once, not retried. */
    assert_int_equal(st.retries, 0);
    graft_persist_writer_destroy(w);
    assert_int_equal(graft_persist_verify_mac(f->root, 6, GRAFT_PERSIST_VERIFY_FULL, secret,
                                              sizeof(secret), NULL),
                     GRAFT_OK);
    uint64_t *steps = NULL;
    size_t n = 0;
    char why[512] = "";
    assert_int_equal(graft_persist_remote_list(&remote, &steps, &n, why, sizeof(why)),
                     GRAFT_EAUTH);
    assert_non_null(strstr(why, "InvalidAccessKeyId"));
    graft_test_s3_stop(&strict);
    state_free(&s);
}

/* A server that checks every signature: multipart uploads, listing,
 * retention's deletes and the restore all pass it; a wrong secret is
 * refused as such. */
static void test_signatures_verified(void **state)
{
    fix_t *f = *state;
    NEED_SERVER(f);
    graft_test_s3_t signed_s3;
    assert_int_equal(graft_test_s3_start_signed(&signed_s3, "graft-signed"), 0);
    graft_persist_remote_config_t remote = graft_test_s3_remote(&signed_s3, "sig/job");
    remote.keep_last = 1;
    state2_t s11, s12;
    state_make(&s11, 11, PER_RANK);
    state_make(&s12, 12, PER_RANK);
    graft_persist_writer_t *w = writer_make(f->root, &remote);
    save(w, 11, &s11);
    flush_ok(w, 1);
    save(w, 12, &s12);
    flush_ok(w, 2);
    graft_persist_remote_stats_t st;
    assert_int_equal(graft_persist_remote_stats(w, &st), GRAFT_OK);
    assert_int_equal(st.deleted, 1);
    graft_persist_writer_destroy(w);
    uint64_t *steps = NULL;
    size_t n = 0;
    char why[512] = "";
    assert_int_equal(graft_persist_remote_list(&remote, &steps, &n, why, sizeof(why)), GRAFT_OK);
    assert_int_equal(n, 1);
    assert_int_equal(steps[0], 12);
    graft_free(steps);
    pt_rmtree_contents(f->root);
    assert_int_equal(restore_check(&remote, f->root, &s12, PER_RANK, NULL), 12);

    setenv("AWS_SECRET_ACCESS_KEY", "not-the-secret", 1);
    assert_int_equal(graft_persist_remote_list(&remote, &steps, &n, why, sizeof(why)),
                     GRAFT_EAUTH);
    assert_non_null(strstr(why, "SignatureDoesNotMatch"));
    graft_test_s3_stop(&signed_s3);
    setenv("AWS_ACCESS_KEY_ID", GRAFT_TEST_S3_KEY_ID, 1);
    setenv("AWS_SECRET_ACCESS_KEY", GRAFT_TEST_S3_SECRET, 1);
    state_free(&s11);
    state_free(&s12);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_upload_restore_bit_exact, setup, teardown),
        cmocka_unit_test_setup_teardown(test_distributed_commit_upload, setup, teardown),
        cmocka_unit_test_setup_teardown(test_http_faults_retried, setup, teardown),
        cmocka_unit_test_setup_teardown(test_server_killed_mid_upload, setup, teardown),
        cmocka_unit_test_setup_teardown(test_store_down_supersedes, setup, teardown),
        cmocka_unit_test_setup_teardown(test_corrupt_object_falls_back, setup, teardown),
        cmocka_unit_test_setup_teardown(test_remote_retention, setup, teardown),
        cmocka_unit_test_setup_teardown(test_remote_retention_milestones, setup, teardown),
        cmocka_unit_test_setup_teardown(test_credentials_missing, setup, teardown),
        cmocka_unit_test_setup_teardown(test_credentials_refused, setup, teardown),
        cmocka_unit_test_setup_teardown(test_signatures_verified, setup, teardown),
    };
    return cmocka_run_group_tests_name("persist_remote", tests, NULL, NULL);
}
