/*
 * The persistent tier on a real file system: exact round trips over many
 * layouts, dtypes, chunk sizes and compression levels; resharding; region
 * and kind filters; fingerprints; the distributed commit hook; the second
 * tier; retention; a full disk; the automatic compression level. Golden
 * files, the manifest's JSON and allocation failures are in
 * test_persist_golden.c, corruption and hostile inputs in
 * test_persist_corrupt.c, kill -9 in test_persist_kill.c.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "alloc_fail.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <jansson.h>
#include <xxhash.h>

#include "persist/persist_internal.h"
#include "persist_fixture.h"

/* --------------------------------------------------------------- split --- */

static void test_split_even(void **state)
{
    (void)state;
    uint64_t off, len, sum = 0, expect_off = 0;
    for (uint32_t r = 0; r < 3; r++) {
        assert_int_equal(graft_persist_split_even(40, 4, r, 3, &off, &len), GRAFT_OK);
        assert_int_equal(off, expect_off);
        assert_int_equal(len % 4, 0);
        expect_off += len;
        sum += len;
    }
    assert_int_equal(sum, 40);
    assert_int_equal(graft_persist_split_even(40, 4, 0, 3, &off, &len), GRAFT_OK);
    assert_int_equal(len, 16); /* 10 elements: 4, 3, 3 */
    assert_int_equal(graft_persist_split_even(8, 4, 2, 3, &off, &len), GRAFT_OK);
    assert_int_equal(len, 0);
    assert_int_equal(off, 8);
    assert_int_equal(graft_persist_split_even(10, 4, 0, 3, &off, &len), GRAFT_EINVAL);
    assert_int_equal(graft_persist_split_even(8, 0, 0, 3, &off, &len), GRAFT_EINVAL);
    assert_int_equal(graft_persist_split_even(8, 1, 3, 3, &off, &len), GRAFT_EINVAL);
    assert_int_equal(graft_persist_split_even(8, 1, 0, 0, &off, &len), GRAFT_EINVAL);
}

/* ---------------------------------------------------------- round trip --- */

static void test_round_trips(void **state)
{
    (void)state;
    char *root = pt_tmpdir();
    uint64_t rng = 12345;
    static const int levels[] = {0, 1, 3, -1, GRAFT_PERSIST_LEVEL_AUTO, -5};
    static const uint64_t chunks[] = {4096, 8192, 65536};
    uint64_t step = 1;
    for (int iter = 0; iter < 24; iter++) {
        graft_persist_config_t cfg = {0};
        cfg.root = root;
        cfg.compression_level = levels[iter % 6];
        cfg.chunk_bytes = chunks[(iter / 4) % 3];
        cfg.threads = 1 + (uint32_t)(iter % 3);
        cfg.code_revision = "abc123";
        graft_persist_writer_t *w;
        assert_int_equal(graft_persist_writer_create(&cfg, &w), GRAFT_OK);
        uint32_t ranks = 1 + (uint32_t)(pt_rand(&rng) % 4);
        pt_layout_t *lay = pt_layout_random(&rng, ranks, iter);
        uint64_t s = step++;
        pt_layout_fill(lay, s);
        graft_persist_commit_opts_t o = {.has_fingerprint = true, .fingerprint = s * 7};
        assert_int_equal(graft_persist_save(w, s, ranks, (const graft_persist_region_t *const *)lay->regions,
                                            lay->nregions, &o),
                         GRAFT_OK);
        graft_persist_write_result_t res;
        assert_int_equal(graft_persist_wait(w, s, &res), GRAFT_OK);
        assert_int_equal(res.raw_bytes, pt_layout_raw(lay));
        /* Patterned data compresses (AUTO may store any chunk: see
         * test_auto_level). */
        if (cfg.compression_level != 0 && cfg.compression_level != GRAFT_PERSIST_LEVEL_AUTO &&
            res.raw_bytes > 65536)
            assert_true(res.stored_bytes < res.raw_bytes);
        assert_true(res.stored_bytes <= res.raw_bytes);
        if (cfg.compression_level == 0)
            assert_int_equal(res.stored_bytes, res.raw_bytes);
        assert_int_equal(graft_persist_wait(w, s, &res), GRAFT_ENOTFOUND);
        graft_persist_writer_destroy(w);

        graft_persist_entry_t e;
        assert_int_equal(graft_persist_verify(root, s, GRAFT_PERSIST_VERIFY_FULL, &e), GRAFT_OK);
        assert_int_equal(e.state, GRAFT_PERSIST_COMPLETE);
        assert_int_equal(e.ranks, ranks);
        /* Same layout back, rank by rank. */
        pt_layout_t *back = pt_layout_clone_empty(lay);
        for (uint32_t r = 0; r < ranks; r++) {
            graft_persist_restore_params_t p = {0};
            p.rank = r;
            p.ranks = ranks;
            p.regions = back->regions[r];
            p.nregions = back->nregions[r];
            graft_persist_restore_result_t rr;
            assert_int_equal(graft_persist_restore(root, &p, &rr), GRAFT_OK);
            assert_int_equal(rr.step, s);
            assert_int_equal(rr.skipped, 0);
            assert_true(rr.has_fingerprint);
            assert_int_equal(rr.fingerprint, s * 7);
        }
        assert_true(pt_layout_equal(lay, back));
        pt_layout_free(back);
        pt_layout_free(lay);
    }
    /* The JSON sidecar is there and says what the manifest says. */
    char *json = pt_read_file_str(root, 1, "manifest.json");
    assert_non_null(json);
    assert_non_null(strstr(json, "\"code_revision\": \"abc123\""));
    assert_non_null(strstr(json, "\"compression_ratio\""));
    assert_non_null(strstr(json, "\"fingerprint\": \"0000000000000007\""));
    free(json);
    graft_persist_entry_t *list;
    size_t n;
    assert_int_equal(graft_persist_list(root, &list, &n), GRAFT_OK);
    assert_int_equal(n, 24);
    for (size_t i = 0; i < n; i++) {
        assert_int_equal(list[i].step, 24 - i); /* newest first */
        assert_int_equal(list[i].state, GRAFT_PERSIST_COMPLETE);
    }
    graft_free(list);
    pt_rmtree(root);
}

/* -------------------------------------------------------------- reshard --- */

static void test_reshard(void **state)
{
    (void)state;
    char *root = pt_tmpdir();
    pt_global_t *g = pt_global_new(99);
    graft_persist_config_t cfg = {.root = root, .compression_level = 1, .chunk_bytes = 4096};
    graft_persist_writer_t *w;
    assert_int_equal(graft_persist_writer_create(&cfg, &w), GRAFT_OK);
    pt_layout_t *four = pt_global_split(g, 4);
    assert_int_equal(graft_persist_save(w, 10, 4, (const graft_persist_region_t *const *)four->regions,
                                        four->nregions, NULL),
                     GRAFT_OK);
    assert_int_equal(graft_persist_wait(w, 10, NULL), GRAFT_OK);
    static const uint32_t targets[] = {1, 2, 3, 8, 4};
    for (size_t i = 0; i < GRAFT_ARRAY_SIZE(targets); i++)
        pt_restore_global(root, targets[i], 10, g);
    /* ... and back: save from 3 ranks, restore onto 4 and 1. */
    pt_layout_t *three = pt_global_split(g, 3);
    assert_int_equal(graft_persist_save(w, 20, 3, (const graft_persist_region_t *const *)three->regions,
                                        three->nregions, NULL),
                     GRAFT_OK);
    assert_int_equal(graft_persist_wait(w, 20, NULL), GRAFT_OK);
    pt_restore_global(root, 4, 20, g);
    pt_restore_global(root, 1, 20, g);
    /* A region whose global size differs is refused, not half-restored. */
    pt_global_t *other = pt_global_new(99);
    other->bytes[0] += 4;
    other->data[0] = realloc(other->data[0], other->bytes[0]);
    pt_layout_t *bad = pt_global_split(other, 2);
    graft_persist_restore_params_t p = {.rank = 0, .ranks = 2, .regions = bad->regions[0],
                                        .nregions = bad->nregions[0], .step = 20};
    assert_int_equal(graft_persist_restore(root, &p, NULL), GRAFT_ELAYOUT);
    p.step = 0;
    assert_int_equal(graft_persist_restore(root, &p, NULL), GRAFT_ELAYOUT);
    pt_layout_free(bad);
    pt_global_free(other);
    graft_persist_writer_destroy(w);
    pt_layout_free(three);
    pt_layout_free(four);
    pt_global_free(g);
    pt_rmtree(root);
}

/* --------------------------------------------------- filters, callbacks --- */

struct progress {
    uint64_t last;
    uint64_t total;
    int calls;
    bool monotonic;
};

static void on_progress(void *arg, uint64_t done, uint64_t total)
{
    struct progress *p = arg;
    p->monotonic &= done >= p->last && done <= total;
    p->last = done;
    p->total = total;
    p->calls++;
}

static graft_status_t fingerprint_of(void *arg, uint64_t *fp_p)
{
    *fp_p = *(uint64_t *)arg;
    return GRAFT_OK;
}

static void test_filters_fingerprint_progress(void **state)
{
    (void)state;
    char *root = pt_tmpdir();
    uint8_t w0[5000], o0[3000], rng0[64];
    pt_fill(w0, sizeof(w0), 1);
    pt_fill(o0, sizeof(o0), 2);
    pt_fill(rng0, sizeof(rng0), 3);
    graft_persist_region_t regs[3] = {
        {.name = "weights", .kind = GRAFT_PERSIST_KIND_PARAM, .dtype = 7, .ptr = w0, .bytes = sizeof(w0)},
        {.name = "adam", .kind = GRAFT_PERSIST_KIND_OPTIM, .dtype = 7, .ptr = o0, .bytes = sizeof(o0)},
        {.name = "rng", .kind = GRAFT_PERSIST_KIND_RNG, .dtype = 0, .ptr = rng0, .bytes = sizeof(rng0)},
    };
    const graft_persist_region_t *per_rank[1] = {regs};
    size_t nregs[1] = {3};
    graft_persist_config_t cfg = {.root = root, .chunk_bytes = 4096};
    graft_persist_writer_t *w;
    assert_int_equal(graft_persist_writer_create(&cfg, &w), GRAFT_OK);
    graft_persist_commit_opts_t o = {.has_fingerprint = true, .fingerprint = 111};
    assert_int_equal(graft_persist_save(w, 1, 1, per_rank, nregs, &o), GRAFT_OK);
    assert_int_equal(graft_persist_wait(w, 1, NULL), GRAFT_OK);
    pt_fill(w0, sizeof(w0), 11);
    o.fingerprint = 222;
    assert_int_equal(graft_persist_save(w, 2, 1, per_rank, nregs, &o), GRAFT_OK);
    assert_int_equal(graft_persist_wait(w, 2, NULL), GRAFT_OK);
    /* saving a committed step again is refused */
    assert_int_equal(graft_persist_save(w, 2, 1, per_rank, nregs, &o), GRAFT_EEXIST);
    /* ...and so is a step still being written */
    assert_int_equal(graft_persist_save(w, 3, 1, per_rank, nregs, &o), GRAFT_OK);
    assert_int_equal(graft_persist_save(w, 3, 1, per_rank, nregs, &o), GRAFT_EEXIST);
    assert_int_equal(graft_persist_wait(w, 3, NULL), GRAFT_OK);
    char *dir3 = pt_path(root, 3, "");
    dir3[strlen(dir3) - 1] = '\0';
    pt_rmtree(dir3); /* the tests below expect steps 1 and 2 only */
    graft_persist_writer_destroy(w);

    uint8_t w1[5000], o1[3000], rng1[64];
    graft_persist_region_t back[3];
    memcpy(back, regs, sizeof(back));
    back[0].ptr = w1;
    back[1].ptr = o1;
    back[2].ptr = rng1;
    /* weights only */
    memset(w1, 0xee, sizeof(w1));
    memset(o1, 0xee, sizeof(o1));
    memset(rng1, 0xee, sizeof(rng1));
    struct progress pr = {.monotonic = true};
    graft_persist_restore_params_t p = {.rank = 0, .ranks = 1, .regions = back, .nregions = 3,
                                        .kind_mask = GRAFT_PERSIST_KIND_BIT(GRAFT_PERSIST_KIND_PARAM),
                                        .progress_fn = on_progress, .progress_arg = &pr};
    graft_persist_restore_result_t rr;
    assert_int_equal(graft_persist_restore(root, &p, &rr), GRAFT_OK);
    assert_int_equal(rr.step, 2);
    assert_int_equal(rr.bytes, sizeof(w0));
    assert_memory_equal(w1, w0, sizeof(w0));
    assert_true(pt_all(o1, sizeof(o1), 0xee));
    assert_true(pt_all(rng1, sizeof(rng1), 0xee));
    assert_true(pr.monotonic);
    assert_true(pr.calls >= 1);
    assert_int_equal(pr.last, sizeof(w0));
    assert_int_equal(pr.total, sizeof(w0));
    /* by name */
    const char *names[] = {"rng"};
    p.kind_mask = 0;
    p.names = names;
    p.nnames = 1;
    assert_int_equal(graft_persist_restore(root, &p, &rr), GRAFT_OK);
    assert_memory_equal(rng1, rng0, sizeof(rng0));
    assert_true(pt_all(o1, sizeof(o1), 0xee));
    /* Fingerprint: the trainer's function matches step 2 -> step 2. */
    p.names = NULL;
    p.nnames = 0;
    uint64_t fp = 222;
    p.fingerprint_fn = fingerprint_of;
    p.fingerprint_arg = &fp;
    assert_int_equal(graft_persist_restore(root, &p, &rr), GRAFT_OK);
    assert_int_equal(rr.step, 2);
    assert_int_equal(rr.skipped, 0);
    /* It does not match step 2 but matches 1: step 2 is skipped, reported. */
    fp = 111;
    assert_int_equal(graft_persist_restore(root, &p, &rr), GRAFT_OK);
    assert_int_equal(rr.step, 1);
    assert_int_equal(rr.skipped, 1);
    assert_non_null(strstr(rr.skipped_reasons, "fingerprint"));
    assert_non_null(strstr(rr.skipped_reasons, "step-00000000000000000002"));
    uint8_t w_step1[5000];
    pt_fill(w_step1, sizeof(w_step1), 1);
    assert_memory_equal(w1, w_step1, sizeof(w1));
    /* Neither matches: no checkpoint. */
    fp = 5;
    assert_int_equal(graft_persist_restore(root, &p, &rr), GRAFT_ENOCHECKPOINT);
    assert_int_equal(rr.skipped, 2);
    /* An exact step that fails returns its own error. */
    p.step = 2;
    assert_int_equal(graft_persist_restore(root, &p, &rr), GRAFT_EHASH);
    p.step = 3;
    assert_int_equal(graft_persist_restore(root, &p, &rr), GRAFT_ENOTFOUND);
    /* bad parameters */
    p.step = 0;
    p.fingerprint_fn = NULL;
    p.rank = 1;
    assert_int_equal(graft_persist_restore(root, &p, &rr), GRAFT_EINVAL);
    assert_int_equal(graft_persist_restore(NULL, &p, &rr), GRAFT_EINVAL);
    p.rank = 0;
    back[0].ptr = NULL;
    assert_int_equal(graft_persist_restore(root, &p, &rr), GRAFT_EINVAL);
    /* an empty root has no checkpoint */
    char *empty = pt_tmpdir();
    back[0].ptr = w1;
    assert_int_equal(graft_persist_restore(empty, &p, &rr), GRAFT_ENOCHECKPOINT);
    pt_rmtree(empty);
    pt_rmtree(root);
}

static void test_invalid_saves(void **state)
{
    (void)state;
    char *root = pt_tmpdir();
    graft_persist_writer_t *w = NULL;
    graft_persist_config_t cfg = {.root = root, .chunk_bytes = 100};
    assert_int_equal(graft_persist_writer_create(&cfg, &w), GRAFT_EINVAL);
    cfg.chunk_bytes = 0;
    cfg.compression_level = 99;
    assert_int_equal(graft_persist_writer_create(&cfg, &w), GRAFT_EINVAL);
    cfg.compression_level = -51;
    assert_int_equal(graft_persist_writer_create(&cfg, &w), GRAFT_EINVAL);
    cfg.compression_level = 0;
    cfg.second_root = root;
    assert_int_equal(graft_persist_writer_create(&cfg, &w), GRAFT_EINVAL);
    cfg.second_root = NULL;
    assert_int_equal(graft_persist_writer_create(NULL, &w), GRAFT_EINVAL);
    assert_int_equal(graft_persist_writer_create(&cfg, &w), GRAFT_OK);
    uint8_t buf[16] = {0};
    graft_persist_region_t r[2] = {
        {.name = "a", .kind = GRAFT_PERSIST_KIND_PARAM, .ptr = buf, .bytes = 16},
        {.name = "a", .kind = GRAFT_PERSIST_KIND_PARAM, .ptr = buf, .bytes = 16},
    };
    const graft_persist_region_t *pr[1] = {r};
    size_t n[1] = {2};
    assert_int_equal(graft_persist_save(w, 1, 1, pr, n, NULL), GRAFT_EINVAL); /* duplicate */
    r[1].name = "b";
    r[1].kind = 42;
    assert_int_equal(graft_persist_save(w, 1, 1, pr, n, NULL), GRAFT_EINVAL); /* kind */
    r[1].kind = GRAFT_PERSIST_KIND_BLOB;
    r[1].global_bytes = 20;
    r[1].global_offset = 8;
    assert_int_equal(graft_persist_save(w, 1, 1, pr, n, NULL), GRAFT_EINVAL); /* 8+16 > 20 */
    r[1].global_bytes = 0;
    r[1].device = GRAFT_PERSIST_DEVICE_CUDA;
    graft_status_t dev = graft__cuda_usable();
    if (dev != GRAFT_OK) /* no GPU here: refused up front, nothing written */
        assert_int_equal(graft_persist_save(w, 1, 1, pr, n, NULL), GRAFT_ENOTSUP);
    r[1].device = GRAFT_PERSIST_DEVICE_HOST;
    assert_int_equal(graft_persist_save(w, 1, 0, pr, n, NULL), GRAFT_EINVAL);
    assert_int_equal(graft_persist_save(NULL, 1, 1, pr, n, NULL), GRAFT_EINVAL);
    assert_int_equal(graft_persist_wait(w, 1, NULL), GRAFT_ENOTFOUND);
    assert_int_equal(pt_count_entries(root), 0); /* nothing was written */
    graft_persist_writer_destroy(w);
    graft_persist_writer_destroy(NULL);
    pt_rmtree(root);
}

/* -------------------------------------------------- distributed commit --- */

static void test_distributed_commit(void **state)
{
    (void)state;
    char *root = pt_tmpdir();
    pt_global_t *g = pt_global_new(5);
    pt_layout_t *lay = pt_global_split(g, 3);
    graft_persist_config_t cfg = {.root = root, .chunk_bytes = 4096, .max_pending = 3,
                                  .group = 5};
    graft_persist_writer_t *w;
    assert_int_equal(graft_persist_writer_create(&cfg, &w), GRAFT_OK);
    uint8_t *info[3] = {0};
    size_t len[3] = {0};
    for (uint32_t r = 0; r < 3; r++)
        assert_int_equal(graft_persist_shard_write(w, 4, r, 3, lay->regions[r], lay->nregions[r]),
                         GRAFT_OK);
    for (uint32_t r = 0; r < 3; r++)
        assert_int_equal(graft_persist_shard_wait(w, 4, r, &info[r], &len[r]), GRAFT_OK);
    assert_int_equal(graft_persist_shard_wait(w, 4, 0, &info[0], &len[0]), GRAFT_ENOTFOUND);
    /* Nothing is a checkpoint before the commit. */
    graft_persist_entry_t e;
    assert_int_equal(graft_persist_verify(root, 4, GRAFT_PERSIST_VERIFY_QUICK, &e), GRAFT_ENOTFOUND);
    assert_int_equal(e.state, GRAFT_PERSIST_INCOMPLETE);
    /* Records in any order; a missing or foreign record is refused. */
    const uint8_t *in[3] = {info[2], info[0], info[1]};
    size_t ln[3] = {len[2], len[0], len[1]};
    assert_int_equal(graft_persist_commit(root, 4, 2, in, ln, NULL, NULL), GRAFT_EPROTO);
    const uint8_t *dup[3] = {info[0], info[0], info[1]};
    size_t dl[3] = {len[0], len[0], len[1]};
    assert_int_equal(graft_persist_commit(root, 4, 3, dup, dl, NULL, NULL), GRAFT_EPROTO);
    assert_int_equal(graft_persist_commit(root, 5, 3, in, ln, NULL, NULL), GRAFT_EPROTO);
    uint8_t junk[7] = {0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff};
    const uint8_t *bad[3] = {junk, info[0], info[1]};
    size_t bl[3] = {sizeof(junk), len[0], len[1]};
    assert_int_equal(graft_persist_commit(root, 4, 3, bad, bl, NULL, NULL), GRAFT_EPROTO);
    /* A shard file that does not match its record is refused. */
    char *shard = pt_path(root, 4, "shard-1-of-3");
    pt_flip_bit(shard, 20, 1); /* header: step */
    graft_persist_commit_opts_t o = {.before_config_change = true};
    assert_int_equal(graft_persist_commit(root, 4, 3, in, ln, "rev", &o), GRAFT_ECORRUPT);
    pt_flip_bit(shard, 20, 1); /* header: step */
    assert_int_equal(graft_persist_commit(root, 4, 3, in, ln, "rev", &o), GRAFT_OK);
    assert_int_equal(graft_persist_commit(root, 4, 3, in, ln, "rev", &o), GRAFT_EEXIST);
    assert_int_equal(graft_persist_verify(root, 4, GRAFT_PERSIST_VERIFY_FULL, &e), GRAFT_OK);
    assert_true(e.before_config_change);
    char *json = pt_read_file_str(root, 4, "manifest.json");
    assert_non_null(strstr(json, "\"written_by_group\": 5"));
    assert_non_null(strstr(json, "\"code_revision\": \"rev\""));
    free(json);
    pt_restore_global(root, 2, 4, g);
    for (int r = 0; r < 3; r++)
        graft_free(info[r]);
    free(shard);
    graft_persist_writer_destroy(w);
    pt_layout_free(lay);
    pt_global_free(g);
    pt_rmtree(root);
}

/* --------------------------------------------------------- second tier --- */

static void test_second_tier(void **state)
{
    (void)state;
    char *root = pt_tmpdir();
    char *second = pt_tmpdir();
    char *tier2 = malloc(strlen(second) + 16);
    sprintf(tier2, "%s/deep/tier", second);
    pt_global_t *g = pt_global_new(3);
    pt_layout_t *lay = pt_global_split(g, 2);
    graft_persist_config_t cfg = {.root = root, .second_root = tier2, .chunk_bytes = 8192,
                                  .compression_level = 3};
    graft_persist_writer_t *w;
    assert_int_equal(graft_persist_writer_create(&cfg, &w), GRAFT_OK);
    assert_int_equal(graft_persist_save(w, 77, 2, (const graft_persist_region_t *const *)lay->regions,
                                        lay->nregions, NULL),
                     GRAFT_OK);
    graft_persist_write_result_t res;
    assert_int_equal(graft_persist_wait(w, 77, &res), GRAFT_OK);
    assert_int_equal(res.second_tier_status, GRAFT_OK);
    graft_persist_writer_destroy(w);
    assert_int_equal(graft_persist_verify(tier2, 77, GRAFT_PERSIST_VERIFY_FULL, NULL), GRAFT_OK);
    /* A second tier that cannot be written fails alone: the local
     * checkpoint still commits. */
    char *blocked = malloc(strlen(second) + 32);
    sprintf(blocked, "%s/file", second);
    FILE *pf = fopen(blocked, "w");
    assert_non_null(pf);
    fclose(pf);
    char *under_file = malloc(strlen(blocked) + 16);
    sprintf(under_file, "%s/tier", blocked);
    cfg.second_root = under_file;
    assert_int_equal(graft_persist_writer_create(&cfg, &w), GRAFT_OK);
    assert_int_equal(graft_persist_save(w, 78, 2, (const graft_persist_region_t *const *)lay->regions,
                                        lay->nregions, NULL),
                     GRAFT_OK);
    assert_int_equal(graft_persist_wait(w, 78, &res), GRAFT_OK);
    assert_int_not_equal(res.second_tier_status, GRAFT_OK);
    graft_persist_writer_destroy(w);
    assert_int_equal(graft_persist_verify(root, 78, GRAFT_PERSIST_VERIFY_FULL, NULL), GRAFT_OK);
    free(under_file);
    free(blocked);
    /* The local root is lost: restore from the second tier. */
    pt_rmtree(root);
    pt_restore_global(tier2, 3, 77, g);
    free(tier2);
    pt_layout_free(lay);
    pt_global_free(g);
    pt_rmtree(second);
}

/* ----------------------------------------------------------- retention --- */

static void plan(const graft_persist_retention_t *pol, const uint64_t *steps, const bool *marked,
                 size_t n, const char *expect)
{
    bool keep[64];
    assert_int_equal(graft_persist_retention_plan(pol, steps, marked, n, keep), GRAFT_OK);
    char got[512] = "";
    for (size_t i = 0; i < n; i++)
        if (keep[i])
            snprintf(got + strlen(got), sizeof(got) - strlen(got), "%s%llu", got[0] ? " " : "",
                     (unsigned long long)steps[i]);
    assert_string_equal(got, expect);
}

static void test_retention_plan(void **state)
{
    (void)state;
    uint64_t steps[20];
    for (int i = 0; i < 20; i++)
        steps[i] = (uint64_t)(i + 1) * 10; /* 10..200 */
    graft_persist_retention_t pol = {.keep_last = 3};
    plan(&pol, steps, NULL, 20, "180 190 200");
    pol.milestone_every = 50;
    plan(&pol, steps, NULL, 20, "50 100 150 180 190 200");
    bool marked[20] = {false};
    marked[1] = true; /* step 20 preceded a config change */
    plan(&pol, steps, marked, 20, "20 50 100 150 180 190 200");
    /* geometric: distances 10..190 behind 200, newest of each band
     * [2^k, 2^(k+1)): 170 (30: band 16..31), 160 (40: band 32..63),
     * 130 (70: band 64..127), 70 (130: band 128..255) */
    pol.milestone_every = 0;
    pol.geometric = true;
    plan(&pol, steps, NULL, 20, "70 130 160 170 180 190 200");
    /* keep_last 0 keeps everything; the newest always survives */
    graft_persist_retention_t all = {0};
    plan(&all, steps, NULL, 3, "10 20 30");
    graft_persist_retention_t one = {.keep_last = 1};
    uint64_t shuffled[4] = {30, 10, 40, 20};
    plan(&one, shuffled, NULL, 4, "40");
    assert_int_equal(graft_persist_retention_plan(NULL, steps, NULL, 3, marked), GRAFT_EINVAL);
}

static void test_retention_apply(void **state)
{
    (void)state;
    char *root = pt_tmpdir();
    uint8_t buf[256];
    graft_persist_region_t r = {.name = "x", .kind = GRAFT_PERSIST_KIND_PARAM, .ptr = buf,
                                .bytes = sizeof(buf)};
    const graft_persist_region_t *pr[1] = {&r};
    size_t n1[1] = {1};
    /* Retention applied by the writer after each commit. */
    graft_persist_config_t cfg = {.root = root, .chunk_bytes = 4096,
                                  .retention = {.keep_last = 2, .milestone_every = 4}};
    graft_persist_writer_t *w;
    assert_int_equal(graft_persist_writer_create(&cfg, &w), GRAFT_OK);
    for (uint64_t s = 1; s <= 10; s++) {
        pt_fill(buf, sizeof(buf), s);
        graft_persist_commit_opts_t o = {.before_config_change = s == 3};
        assert_int_equal(graft_persist_save(w, s, 1, pr, n1, &o), GRAFT_OK);
        assert_int_equal(graft_persist_wait(w, s, NULL), GRAFT_OK);
    }
    graft_persist_writer_destroy(w);
    assert_string_equal(pt_list_str(root), "10 9 8 4 3");
    /* A crash leftover older than the newest valid one is removed; a
     * corrupt newest one is kept (and never counts as valid). */
    pt_mkdir_step(root, 5);
    pt_touch(root, 5, "shard-0-of-1.tmp");
    pt_mkdir_step(root, 11);
    pt_touch(root, 11, "shard-0-of-1.tmp");
    graft_persist_retention_t pol = {.keep_last = 1};
    size_t deleted = 0;
    assert_int_equal(graft_persist_retention_apply(root, &pol, &deleted), GRAFT_OK);
    assert_int_equal(deleted, 4); /* 9, 8, 4 (3 is marked) and the leftover 5 */
    assert_string_equal(pt_list_str(root), "11 10 3");
    /* With a minimum age, an incomplete directory that was just written to
     * (a commit still under way elsewhere) stays; one left alone for that
     * long goes. */
    pt_mkdir_step(root, 7);
    pt_touch(root, 7, "shard-0-of-1");
    graft_persist_retention_t aged = {.keep_last = 1, .leftover_min_age_ms = 60000};
    assert_int_equal(graft_persist_retention_apply(root, &aged, &deleted), GRAFT_OK);
    assert_int_equal(deleted, 0);
    assert_string_equal(pt_list_str(root), "11 10 7 3");
    char *d7 = pt_path(root, 7, "");
    struct timespec old_times[2] = {{.tv_sec = time(NULL) - 120}, {.tv_sec = time(NULL) - 120}};
    assert_int_equal(utimensat(AT_FDCWD, d7, old_times, 0), 0);
    free(d7);
    assert_int_equal(graft_persist_retention_apply(root, &aged, &deleted), GRAFT_OK);
    assert_int_equal(deleted, 1);
    assert_string_equal(pt_list_str(root), "11 10 3");
    /* The newest valid checkpoint survives even when everything else is corrupt. */
    char *mf = pt_path(root, 10, "manifest.pb");
    pt_flip_bit(mf, 50, 0);
    assert_int_equal(graft_persist_retention_apply(root, &pol, &deleted), GRAFT_OK);
    assert_string_equal(pt_list_str(root), "11 10 3");
    free(mf);
    assert_int_equal(graft_persist_retention_apply(NULL, &pol, &deleted), GRAFT_EINVAL);
    pt_rmtree(root);
}

/* ----------------------------------------------------------- full disk --- */

static void test_full_disk(void **state)
{
    (void)state;
    char *dir = pt_tmpdir();
    if (mount("tmpfs", dir, "tmpfs", 0, "size=2m") != 0) {
        int e = errno;
        pt_rmtree(dir);
        fprintf(stderr, "# mount tmpfs: %s\n", strerror(e));
        skip(); /* needs root (CAP_SYS_ADMIN) for a small tmpfs */
    }
    char root[4096];
    snprintf(root, sizeof(root), "%s/ckpt", dir);
    graft_persist_config_t cfg = {.root = root, .compression_level = 0, .chunk_bytes = 65536,
                                  .max_pending = 2};
    graft_persist_writer_t *w;
    assert_int_equal(graft_persist_writer_create(&cfg, &w), GRAFT_OK);
    size_t small = 256 << 10, big = 3 << 20, mid = 1200 << 10;
    uint8_t *a = malloc(big), *b = malloc(big);
    pt_fill(a, big, 1);
    graft_persist_region_t r = {.name = "w", .kind = GRAFT_PERSIST_KIND_PARAM, .ptr = a,
                                .bytes = small};
    const graft_persist_region_t *pr[1] = {&r};
    size_t n1[1] = {1};
    assert_int_equal(graft_persist_save(w, 1, 1, pr, n1, NULL), GRAFT_OK);
    assert_int_equal(graft_persist_wait(w, 1, NULL), GRAFT_OK);
    /* Too big for the disk: refused before anything is written. */
    r.bytes = big;
    assert_int_equal(graft_persist_save(w, 2, 1, pr, n1, NULL), GRAFT_ENOSPC);
    assert_int_equal(pt_count_entries(root), 1);
    /* Two that fit one at a time but not together: the second fails,
     * either at the check or while writing, and leaves nothing behind. */
    r.bytes = mid;
    assert_int_equal(graft_persist_save(w, 3, 1, pr, n1, NULL), GRAFT_OK);
    graft_status_t s4 = graft_persist_save(w, 4, 1, pr, n1, NULL);
    assert_int_equal(graft_persist_wait(w, 3, NULL), GRAFT_OK);
    if (s4 == GRAFT_OK)
        s4 = graft_persist_wait(w, 4, NULL);
    assert_int_equal(s4, GRAFT_ENOSPC);
    graft_persist_writer_destroy(w);
    assert_string_equal(pt_list_str(root), "3 1");
    assert_int_equal(pt_count_entries(root), 2);
    /* Older checkpoints untouched. */
    graft_persist_region_t back = r;
    back.ptr = b;
    back.bytes = small;
    graft_persist_restore_params_t p = {.rank = 0, .ranks = 1, .regions = &back, .nregions = 1,
                                        .step = 1};
    assert_int_equal(graft_persist_restore(root, &p, NULL), GRAFT_OK);
    assert_memory_equal(a, b, small);
    back.bytes = mid;
    p.step = 0;
    assert_int_equal(graft_persist_restore(root, &p, NULL), GRAFT_OK);
    assert_memory_equal(a, b, mid);
    free(a);
    free(b);
    assert_int_equal(umount(dir), 0);
    pt_rmtree(dir);
}

/* ------------------------------------------------------------ auto level --- */

/* Chunks stored and chunks compressed in the shards of one checkpoint,
 * read from the shard indexes. */
static void codec_count(const char *root, uint64_t step, uint32_t ranks, int *stored_p,
                        int *zstd_p)
{
    *stored_p = *zstd_p = 0;
    for (uint32_t r = 0; r < ranks; r++) {
        char name[64], why[256];
        snprintf(name, sizeof(name), "shard-%u-of-%u", r, ranks);
        char *path = pt_path(root, step, name);
        graft__shard_t *sh;
        assert_int_equal(graft__shard_open(path, &sh, why, sizeof(why)), GRAFT_OK);
        for (uint64_t i = 0; i < sh->footer.chunk_count; i++) {
            assert_true(sh->chunks[i].codec == GP_CODEC_STORED ||
                        sh->chunks[i].codec == GP_CODEC_ZSTD);
            *(sh->chunks[i].codec == GP_CODEC_ZSTD ? zstd_p : stored_p) += 1;
        }
        graft__shard_close(sh);
        free(path);
    }
}

/* One checkpoint of ~250 KB on 2 ranks in 16 KiB chunks (16 chunks) with
 * the given level and test delays; it must full-verify and restore exactly
 * onto 2 and 3 ranks, whatever mix of codecs it ended with. */
static void auto_run(const char *root, uint64_t step, int level, int compress_delay_us,
                     int write_delay_us, int *stored_p, int *zstd_p)
{
    pt_global_t *g = pt_global_new(step);
    pt_layout_t *lay = pt_global_split(g, 2);
    graft_persist_config_t cfg = {.root = root, .compression_level = level, .chunk_bytes = 16384,
                                  .threads = 2};
    graft_persist_writer_t *w;
    assert_int_equal(graft_persist_writer_create(&cfg, &w), GRAFT_OK);
    graft__persist_test_compress_delay_us = compress_delay_us;
    graft__persist_test_write_delay_us = write_delay_us;
    graft_persist_write_result_t res;
    graft_status_t st = graft_persist_save(w, step, 2,
                                           (const graft_persist_region_t *const *)lay->regions,
                                           lay->nregions, NULL);
    if (st == GRAFT_OK)
        st = graft_persist_wait(w, step, &res);
    graft_persist_writer_destroy(w);
    graft__persist_test_compress_delay_us = 0;
    graft__persist_test_write_delay_us = 0;
    assert_int_equal(st, GRAFT_OK);
    assert_int_equal(graft_persist_verify(root, step, GRAFT_PERSIST_VERIFY_FULL, NULL), GRAFT_OK);
    pt_restore_global(root, 2, step, g);
    pt_restore_global(root, 3, step, g);
    codec_count(root, step, 2, stored_p, zstd_p);
    assert_int_equal(*stored_p + *zstd_p, 16);
    /* stored_bytes adds up to what the chunks took */
    if (*zstd_p == 0)
        assert_int_equal(res.stored_bytes, res.raw_bytes);
    else
        assert_true(res.stored_bytes < res.raw_bytes);
    pt_layout_free(lay);
    pt_global_free(g);
}

static void test_auto_level(void **state)
{
    (void)state;
    assert_int_equal(GRAFT_PERSIST_LEVEL_DEFAULT, GRAFT_PERSIST_LEVEL_AUTO);
    char *root = pt_tmpdir();
    int stored, zstd;
    /* As it comes on this machine: any mix. */
    auto_run(root, 1, GRAFT_PERSIST_LEVEL_AUTO, 0, 0, &stored, &zstd);
    print_message("# auto, as it comes: %d chunks stored, %d compressed\n", stored, zstd);
    char *json = pt_read_file_str(root, 1, "manifest.json");
    assert_non_null(strstr(json, "\"compression_level\": -1,"));
    free(json);
    /* A starved CPU (each chunk takes a helper 30 ms) beside a fast disk:
     * the writer does not wait for compression, so (nearly) every chunk is
     * stored. A writer that waited would have compressed all 16. */
    auto_run(root, 2, GRAFT_PERSIST_LEVEL_AUTO, 30000, 0, &stored, &zstd);
    print_message("# auto, slow CPU: %d chunks stored, %d compressed\n", stored, zstd);
    assert_true(stored >= 8);
    /* A fixed level under the same starved CPU waits: all compressed. */
    auto_run(root, 3, -1, 30000, 0, &stored, &zstd);
    assert_int_equal(zstd, 16);
    /* A slow disk (20 ms per chunk) and idle helpers: compression keeps
     * ahead of the disk, so (nearly) every chunk is compressed. */
    auto_run(root, 4, GRAFT_PERSIST_LEVEL_AUTO, 0, 20000, &stored, &zstd);
    print_message("# auto, slow disk: %d chunks stored, %d compressed\n", stored, zstd);
    assert_true(zstd >= 8);
    /* Big chunks, compressed in steps: the writer drops chunks a helper is
     * half-way through (as it comes; the helper gives up within a step). */
    pt_layout_t *lay = pt_layout_alloc(2, 1, true);
    for (uint32_t r = 0; r < 2; r++) {
        graft_persist_region_t *x = &lay->regions[r][0];
        x->name = strdup("big");
        x->kind = GRAFT_PERSIST_KIND_PARAM;
        x->dtype = 1;
        x->bytes = 6u << 20;
        x->global_offset = r * x->bytes;
        x->global_bytes = 2 * x->bytes;
        x->ptr = malloc(x->bytes);
        pt_fill(x->ptr, x->bytes, 50 + r);
        lay->nregions[r] = 1;
    }
    graft_persist_config_t cfg = {.root = root, .compression_level = GRAFT_PERSIST_LEVEL_AUTO,
                                  .chunk_bytes = 1u << 20};
    graft_persist_writer_t *w;
    assert_int_equal(graft_persist_writer_create(&cfg, &w), GRAFT_OK);
    for (uint64_t s = 5; s <= 6; s++) {
        assert_int_equal(graft_persist_save(w, s, 2,
                                            (const graft_persist_region_t *const *)lay->regions,
                                            lay->nregions, NULL),
                         GRAFT_OK);
        assert_int_equal(graft_persist_wait(w, s, NULL), GRAFT_OK);
    }
    graft_persist_writer_destroy(w);
    for (uint64_t s = 5; s <= 6; s++) {
        assert_int_equal(graft_persist_verify(root, s, GRAFT_PERSIST_VERIFY_FULL, NULL), GRAFT_OK);
        pt_layout_t *back = pt_layout_clone_empty(lay);
        for (uint32_t r = 0; r < 2; r++) {
            graft_persist_restore_params_t p = {.rank = r, .ranks = 2, .regions = back->regions[r],
                                                .nregions = 1, .step = s};
            assert_int_equal(graft_persist_restore(root, &p, NULL), GRAFT_OK);
        }
        assert_true(pt_layout_equal(lay, back));
        pt_layout_free(back);
    }
    pt_layout_free(lay);
    /* Every kind of checkpoint lists as complete. */
    graft_persist_entry_t *e;
    size_t n;
    assert_int_equal(graft_persist_list(root, &e, &n), GRAFT_OK);
    assert_int_equal(n, 6);
    for (size_t i = 0; i < n; i++)
        assert_int_equal(e[i].state, GRAFT_PERSIST_COMPLETE);
    graft_free(e);
    pt_rmtree(root);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_split_even),
        cmocka_unit_test(test_round_trips),
        cmocka_unit_test(test_reshard),
        cmocka_unit_test(test_filters_fingerprint_progress),
        cmocka_unit_test(test_invalid_saves),
        cmocka_unit_test(test_distributed_commit),
        cmocka_unit_test(test_second_tier),
        cmocka_unit_test(test_retention_plan),
        cmocka_unit_test(test_retention_apply),
        cmocka_unit_test(test_full_disk),
        cmocka_unit_test(test_auto_level),
    };
    return cmocka_run_group_tests_name("persist", tests, NULL, NULL);
}
