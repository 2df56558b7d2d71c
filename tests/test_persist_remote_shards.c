/*
 * Restore from the remote tier, rank by rank, against a real S3-compatible
 * server (moto_server) behind the fault proxy (tests/support/
 * s3_fault_proxy.c): without verify_full each rank downloads only the
 * shards holding its regions, as ranged GETs each retried alone, verifies
 * every chunk of them and checks the others are stored with their size;
 * onto other numbers of ranks too. A GET of any other shard is answered
 * 500 by the proxy, so a rank that fetched one would fail.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "graft_internal.h"
#include "s3_fault_proxy.h"
#include "s3_fixture.h"
#include "persist_fixture.h"

#define RANKS 4u
#define PER (11u << 20) /* a shard is three 5 MiB ranges */
#define STEP_PATH "/graft-own/own/step-00000000000000000010/"

static const uint8_t secret[] = "remote-shards-test-secret";

typedef struct fix {
    graft_test_s3_t s3;
    graft_test_s3_proxy_t proxy;
    char *root;
    uint8_t *w[RANKS];
    graft_persist_remote_config_t remote; /* through the proxy */
} fix_t;

static graft_persist_region_t region(uint8_t *ptr, uint64_t off, uint64_t bytes)
{
    return (graft_persist_region_t){.name = "w", .kind = GRAFT_PERSIST_KIND_PARAM, .dtype = 1,
                                    .ptr = ptr, .bytes = bytes, .global_offset = off,
                                    .global_bytes = RANKS * (uint64_t)PER};
}

/* Rank r of RANKS holds [r*PER, (r+1)*PER) of "w"; step 10 uploaded. */
static int setup(void **state)
{
    fix_t *f = calloc(1, sizeof(*f));
    *state = NULL;
    int rc = graft_test_s3_proxied_setup(&f->s3, &f->proxy, "graft-own");
    if (rc != 0) {
        free(f);
        return rc > 0 ? 0 : -1;
    }
    f->root = pt_tmpdir();
    f->remote = graft_test_s3_remote(&f->s3, "own");
    graft_persist_config_t cfg = {.root = f->root, .chunk_bytes = 1u << 20, .secret = secret,
                                  .secret_len = sizeof(secret), .remote = &f->remote};
    graft_persist_writer_t *w = NULL;
    assert_int_equal(graft_persist_writer_create(&cfg, &w), GRAFT_OK);
    graft_persist_region_t regs[RANKS][1];
    const graft_persist_region_t *rp[RANKS];
    size_t nr[RANKS];
    for (uint32_t r = 0; r < RANKS; r++) {
        f->w[r] = malloc(PER);
        pt_fill(f->w[r], PER, 100 + r);
        regs[r][0] = region(f->w[r], r * (uint64_t)PER, PER);
        rp[r] = regs[r];
        nr[r] = 1;
    }
    assert_int_equal(graft_persist_save(w, 10, RANKS, rp, nr, NULL), GRAFT_OK);
    assert_int_equal(graft_persist_wait(w, 10, NULL), GRAFT_OK);
    assert_int_equal(graft_persist_remote_flush(w, 120000), GRAFT_OK);
    graft_persist_remote_stats_t st;
    assert_int_equal(graft_persist_remote_stats(w, &st), GRAFT_OK);
    assert_int_equal(st.uploaded, 1);
    graft_persist_writer_destroy(w);
    pt_rmtree_contents(f->root); /* every host lost */
    f->remote.endpoint = f->proxy.endpoint;
    f->remote.max_retries = 2;
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
    for (uint32_t r = 0; r < RANKS; r++)
        free(f->w[r]);
    free(f);
    return 0;
}

/* Restore [off, off+bytes) of "w" as rank `rank` of `ranks`. */
static graft_status_t restore(fix_t *f, uint32_t rank, uint32_t ranks, uint8_t *buf, uint64_t off,
                              uint64_t bytes, graft_persist_restore_result_t *res)
{
    graft_persist_region_t reg = region(buf, off, bytes);
    graft_persist_restore_params_t p = {.rank = rank, .ranks = ranks, .regions = &reg,
                                        .nregions = 1, .secret = secret,
                                        .secret_len = sizeof(secret)};
    return graft_persist_remote_restore(&f->remote, f->root, &p, res);
}

/* Nothing left under the root: no checkpoint, no scratch directory. */
static void root_empty(const fix_t *f)
{
    DIR *d = opendir(f->root);
    assert_non_null(d);
    struct dirent *e;
    while ((e = readdir(d)) != NULL)
        if (strcmp(e->d_name, ".") != 0 && strcmp(e->d_name, "..") != 0)
            fail_msg("left under the root: %s", e->d_name);
    closedir(d);
}

static void test_rank_fetches_own_shard(void **state)
{
    fix_t *f = *state;
    if (f == NULL)
        skip(); /* no moto_server: setup() said why */
    /* Every GET of shard 0 refused: ranks 1..3 never ask for it. */
    graft_test_s3_proxy_inject(&f->proxy, "GET " STEP_PATH "shard-0-of-4", 100000, 500, 0);
    uint8_t *buf = calloc(1, PER);
    graft_persist_restore_result_t res;
    for (uint32_t r = 1; r < RANKS; r++) {
        memset(buf, 0, PER);
        assert_int_equal(restore(f, r, RANKS, buf, r * (uint64_t)PER, PER, &res), GRAFT_OK);
        assert_int_equal(res.step, 10);
        assert_int_equal(res.skipped, 0);
        assert_memory_equal(buf, f->w[r], PER);
    }
    assert_int_equal(atomic_load(&f->proxy.injected), 0);
    root_empty(f);
    /* Rank 0 reads shard 0: refused (500, retried twice), named, no
     * older checkpoint to fall back on. */
    assert_int_equal(restore(f, 0, RANKS, buf, 0, PER, &res), GRAFT_ENOCHECKPOINT);
    assert_true(atomic_load(&f->proxy.injected) >= 1);
    assert_non_null(strstr(res.skipped_reasons, "step 10: GET own/step-00000000000000000010/"
                                                "shard-0-of-4 (bytes "));
    assert_non_null(strstr(res.skipped_reasons, "HTTP 500"));
    root_empty(f);
    graft_test_s3_proxy_inject(&f->proxy, "GET", 0, 500, 0);

    /* Ranged: the second of shard 1's three ranges answered 503 once is
     * sent again alone, and the shard ends bit-exact. */
    graft_test_s3_proxy_inject_after(&f->proxy, "GET " STEP_PATH "shard-1-of-4", 1, 1, 503, 0);
    int before = atomic_load(&f->proxy.injected);
    memset(buf, 0, PER);
    assert_int_equal(restore(f, 1, RANKS, buf, PER, PER, &res), GRAFT_OK);
    assert_int_equal(atomic_load(&f->proxy.injected), before + 1);
    assert_memory_equal(buf, f->w[1], PER);
    free(buf);
}

static void test_reshard_from_remote(void **state)
{
    fix_t *f = *state;
    if (f == NULL)
        skip();
    /* 4 ranks onto 2: rank 1 of 2 holds the old ranks 2 and 3, and never
     * asks for shard 0 (the proxy refuses every GET of it). */
    graft_test_s3_proxy_inject(&f->proxy, "GET " STEP_PATH "shard-0-of-4", 100000, 500, 0);
    uint8_t *buf = calloc(1, 2 * (uint64_t)PER);
    graft_persist_restore_result_t res;
    assert_int_equal(restore(f, 1, 2, buf, 2 * (uint64_t)PER, 2 * (uint64_t)PER, &res), GRAFT_OK);
    assert_memory_equal(buf, f->w[2], PER);
    assert_memory_equal(buf + PER, f->w[3], PER);
    /* Onto 3 ranks: rank 1 of 3 straddles the old ranks 1 and 2. */
    const uint64_t third = RANKS * (uint64_t)PER / 3;
    assert_int_equal(restore(f, 1, 3, buf, third, third, &res), GRAFT_OK);
    for (uint64_t i = 0; i < third; i += 4093) {
        uint64_t g = third + i;
        assert_int_equal(buf[i], f->w[g / PER][g % PER]);
    }
    assert_int_equal(atomic_load(&f->proxy.injected), 0);
    root_empty(f);
    free(buf);
}

static void test_own_shard_corrupt_other_missing(void **state)
{
    fix_t *f = *state;
    if (f == NULL)
        skip();
    uint8_t *buf = calloc(1, PER);
    graft_persist_restore_result_t res;
    /* Rank 2's own shard rotted in the store: every chunk is verified. */
    const char *key = "own/step-00000000000000000010/shard-2-of-4";
    uint8_t *data = NULL;
    size_t len = 0;
    assert_int_equal(graft_test_s3_get(&f->s3, key, &data, &len), 200);
    data[len / 3] ^= 0x01;
    assert_int_equal(graft_test_s3_put(&f->s3, key, data, len), 200);
    free(data);
    assert_int_equal(restore(f, 2, RANKS, buf, 2 * (uint64_t)PER, PER, &res), GRAFT_ENOCHECKPOINT);
    assert_non_null(strstr(res.skipped_reasons, "step 10: s3://graft-own/own/"
                                                "step-00000000000000000010/shard-2-of-4: chunk "));
    root_empty(f);
    /* A shard rank 3 does not read, gone from the store: seen (HEAD). */
    assert_int_equal(graft_test_s3_delete(&f->s3, "own/step-00000000000000000010/shard-0-of-4"),
                     204);
    assert_int_equal(restore(f, 3, RANKS, buf, 3 * (uint64_t)PER, PER, &res), GRAFT_ENOCHECKPOINT);
    assert_non_null(strstr(res.skipped_reasons, "step 10: s3://graft-own/own/"
                                                "step-00000000000000000010/shard-0-of-4: missing "
                                                "from the store"));
    root_empty(f);
    free(buf);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_rank_fetches_own_shard, setup, teardown),
        cmocka_unit_test_setup_teardown(test_reshard_from_remote, setup, teardown),
        cmocka_unit_test_setup_teardown(test_own_shard_corrupt_other_missing, setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
