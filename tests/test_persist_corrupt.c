/*
 * Damaged and hostile checkpoints: single bit flips anywhere in a shard or
 * the manifest, truncation, missing and swapped shards, fields with hostile
 * sizes and offsets behind valid checksums, hostile manifests, and a seeded
 * fuzz loop of random corruptions. Every case must be detected with the
 * file (and chunk) named, the previous checkpoint must still restore, and
 * nothing may crash (this program also runs under ASan/UBSan).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <xxhash.h>
#include <zstd.h>

#include "persist/persist_internal.h"
#include "persist_fixture.h"

typedef struct fixture {
    char *root;
    pt_global_t *g1; /* step 1 */
    pt_global_t *g2; /* step 2 */
    char *files[3];  /* step 2: shard-0-of-2, shard-1-of-2, manifest.pb */
    uint8_t *pristine[3];
    long size[3];
} fixture_t;

static uint8_t *slurp(const char *path, long *n_p)
{
    long n = pt_file_size(path);
    uint8_t *b = malloc((size_t)n + 1);
    int fd = open(path, O_RDONLY);
    if (fd < 0 || pread(fd, b, (size_t)n, 0) != n)
        abort();
    close(fd);
    *n_p = n;
    return b;
}

static void put_file(const char *path, const uint8_t *b, long n)
{
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (fd < 0 || (n > 0 && write(fd, b, (size_t)n) != n))
        abort();
    close(fd);
}

static void save_global(const char *root, uint64_t step, pt_global_t *g, int level)
{
    pt_layout_t *lay = pt_global_split(g, 2);
    graft_persist_config_t cfg = {.root = root, .compression_level = level, .chunk_bytes = 4096};
    graft_persist_writer_t *w;
    assert_int_equal(graft_persist_writer_create(&cfg, &w), GRAFT_OK);
    assert_int_equal(graft_persist_save(w, step, 2, (const graft_persist_region_t *const *)lay->regions,
                                        lay->nregions, NULL),
                     GRAFT_OK);
    assert_int_equal(graft_persist_wait(w, step, NULL), GRAFT_OK);
    graft_persist_writer_destroy(w);
    pt_layout_free(lay);
}

static int setup(void **state)
{
    graft_log_level_set(GRAFT_LOG_OFF); /* thousands of expected errors */
    fixture_t *f = calloc(1, sizeof(*f));
    f->root = pt_tmpdir();
    f->g1 = pt_global_small(1);
    f->g2 = pt_global_small(2);
    save_global(f->root, 1, f->g1, 1);
    save_global(f->root, 2, f->g2, 1);
    static const char *const names[3] = {"shard-0-of-2", "shard-1-of-2", "manifest.pb"};
    for (int i = 0; i < 3; i++) {
        f->files[i] = pt_path(f->root, 2, names[i]);
        f->pristine[i] = slurp(f->files[i], &f->size[i]);
    }
    *state = f;
    return 0;
}

static int teardown(void **state)
{
    fixture_t *f = *state;
    for (int i = 0; i < 3; i++) {
        free(f->files[i]);
        free(f->pristine[i]);
    }
    pt_global_free(f->g1);
    pt_global_free(f->g2);
    pt_rmtree(f->root);
    free(f);
    graft_log_level_set(GRAFT_LOG_WARN);
    return 0;
}

static void reset(fixture_t *f)
{
    for (int i = 0; i < 3; i++)
        put_file(f->files[i], f->pristine[i], f->size[i]);
}

/* Restore onto 2 ranks with step 0 and check which checkpoint came back. */
static uint64_t restore_newest(fixture_t *f, uint32_t *skipped_p)
{
    pt_global_t *got = pt_global_clone_empty(f->g1);
    pt_layout_t *lay = pt_global_split(got, 2);
    uint64_t step = 0;
    uint32_t skipped = 0;
    for (uint32_t r = 0; r < 2; r++) {
        /* Full verification, so every rank judges the whole checkpoint
         * and all ranks pick the same one. */
        graft_persist_restore_params_t p = {.rank = r, .ranks = 2, .regions = lay->regions[r],
                                            .nregions = lay->nregions[r], .verify_full = true};
        graft_persist_restore_result_t rr;
        assert_int_equal(graft_persist_restore(f->root, &p, &rr), GRAFT_OK);
        assert_true(step == 0 || step == rr.step);
        step = rr.step;
        skipped = rr.skipped;
    }
    assert_true(step == 1 || step == 2);
    /* whatever was restored is exactly that checkpoint's data */
    assert_true(pt_global_equal(step == 1 ? f->g1 : f->g2, got));
    pt_layout_free(lay);
    pt_global_free(got);
    if (skipped_p)
        *skipped_p = skipped;
    return step;
}

static void test_bit_flips(void **state)
{
    fixture_t *f = *state;
    graft__shard_t *sh[2];
    char why[256];
    for (int i = 0; i < 2; i++)
        assert_int_equal(graft__shard_open(f->files[i], &sh[i], why, sizeof(why)), GRAFT_OK);
    int flips = 0;
    for (int i = 0; i < 3; i++) {
        const char *base = strrchr(f->files[i], '/') + 1;
        for (long off = 0; off < f->size[i]; off++) {
            int bit = (int)((off * 5 + i) % 8);
            pt_flip_bit(f->files[i], off, bit);
            graft_persist_entry_t e;
            graft_status_t st = graft_persist_verify(f->root, 2, GRAFT_PERSIST_VERIFY_FULL, &e);
            if (st == GRAFT_OK)
                fail_msg("flip of bit %d at %s+%ld not detected", bit, base, off);
            assert_int_equal(e.state, GRAFT_PERSIST_CORRUPT);
            if (strstr(e.reason, base) == NULL)
                fail_msg("flip at %s+%ld: reason '%s' does not name the file", base, off, e.reason);
            if (i < 2 && off >= (long)GP_HEADER_BYTES &&
                off < (long)sh[i]->footer.index_offset) {
                uint64_t c = 0;
                while (c + 1 < sh[i]->footer.chunk_count && sh[i]->chunks[c + 1].offset <= (uint64_t)off)
                    c++;
                char want[48];
                snprintf(want, sizeof(want), "chunk %llu", (unsigned long long)c);
                if (strstr(e.reason, want) == NULL)
                    fail_msg("flip at %s+%ld: reason '%s' does not name %s", base, off, e.reason,
                             want);
            } else {
                /* headers, indexes, footers and the manifest: quick verify
                 * and the listing catch it too */
                assert_int_not_equal(graft_persist_verify(f->root, 2, GRAFT_PERSIST_VERIFY_QUICK, NULL),
                                     GRAFT_OK);
            }
            if (off % 97 == 0) {
                uint32_t skipped;
                assert_int_equal(restore_newest(f, &skipped), 1);
                assert_int_equal(skipped, 1);
            }
            pt_flip_bit(f->files[i], off, bit);
            flips++;
        }
    }
    assert_true(flips > 1000);
    assert_int_equal(graft_persist_verify(f->root, 2, GRAFT_PERSIST_VERIFY_FULL, NULL), GRAFT_OK);
    for (int i = 0; i < 2; i++)
        graft__shard_close(sh[i]);
}

static void test_truncation_and_missing(void **state)
{
    fixture_t *f = *state;
    graft_persist_entry_t e;
    for (int i = 0; i < 3; i++) {
        const char *base = strrchr(f->files[i], '/') + 1;
        long cuts[] = {0, 1, 39, 63, 64, 100, f->size[i] - 49, f->size[i] - 48, f->size[i] - 1};
        for (size_t k = 0; k < GRAFT_ARRAY_SIZE(cuts); k++) {
            if (cuts[k] < 0)
                continue;
            reset(f);
            assert_int_equal(truncate(f->files[i], cuts[k]), 0);
            graft_status_t st = graft_persist_verify(f->root, 2, GRAFT_PERSIST_VERIFY_QUICK, &e);
            assert_true(st == GRAFT_ETRUNCATED || st == GRAFT_ECORRUPT);
            assert_int_equal(e.state, GRAFT_PERSIST_CORRUPT);
            assert_non_null(strstr(e.reason, base));
        }
        /* grown by garbage */
        reset(f);
        int fd = open(f->files[i], O_WRONLY | O_APPEND);
        assert_int_equal(write(fd, "garbage!", 8), 8);
        close(fd);
        assert_int_not_equal(graft_persist_verify(f->root, 2, GRAFT_PERSIST_VERIFY_QUICK, &e), GRAFT_OK);
        assert_non_null(strstr(e.reason, base));
    }
    /* a missing shard */
    reset(f);
    unlink(f->files[1]);
    assert_int_equal(graft_persist_verify(f->root, 2, GRAFT_PERSIST_VERIFY_QUICK, &e), GRAFT_ETRUNCATED);
    assert_non_null(strstr(e.reason, "shard-1-of-2"));
    assert_non_null(strstr(e.reason, "missing"));
    assert_int_equal(restore_newest(f, NULL), 1);
    /* a shard from another checkpoint of the same layout */
    reset(f);
    char *other = pt_path(f->root, 1, "shard-0-of-2");
    long n;
    uint8_t *b = slurp(other, &n);
    put_file(f->files[0], b, n);
    free(b);
    free(other);
    assert_int_equal(graft_persist_verify(f->root, 2, GRAFT_PERSIST_VERIFY_QUICK, &e), GRAFT_ECORRUPT);
    assert_non_null(strstr(e.reason, "shard-0-of-2"));
    assert_int_equal(restore_newest(f, NULL), 1);
    /* no manifest: incomplete, never restored */
    reset(f);
    unlink(f->files[2]);
    assert_int_equal(graft_persist_verify(f->root, 2, GRAFT_PERSIST_VERIFY_QUICK, &e), GRAFT_ENOTFOUND);
    assert_int_equal(e.state, GRAFT_PERSIST_INCOMPLETE);
    graft_persist_entry_t *list;
    size_t cnt;
    assert_int_equal(graft_persist_list(f->root, &list, &cnt), GRAFT_OK);
    assert_int_equal(cnt, 2);
    assert_int_equal(list[0].step, 2);
    assert_int_equal(list[0].state, GRAFT_PERSIST_INCOMPLETE);
    assert_int_equal(list[1].state, GRAFT_PERSIST_COMPLETE);
    graft_free(list);
    assert_int_equal(restore_newest(f, NULL), 1);
    reset(f);
    assert_int_equal(restore_newest(f, NULL), 2);
}

/* ---------------------------------------------- hostile, resealed fields --- */

static void put64le(uint8_t *p, uint64_t v)
{
    for (int i = 0; i < 8; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}

static uint64_t get64le(const uint8_t *p)
{
    uint64_t v = 0;
    for (int i = 7; i >= 0; i--)
        v = (v << 8) | p[i];
    return v;
}

/* Recompute every checksum of a shard image, so only the semantic checks
 * stand between a hostile value and the reader. */
static void reseal(uint8_t *b, long n)
{
    if (n < 64 + 48)
        return;
    put64le(b + 56, XXH3_64bits(b, 56));
    uint8_t *foot = b + n - 48;
    uint64_t io = get64le(foot);
    if (io <= (uint64_t)(n - 48))
        put64le(foot + 16, XXH3_64bits(b + io, (size_t)((uint64_t)(n - 48) - io)));
    put64le(foot + 32, XXH3_64bits(foot, 32));
}

static graft_status_t verify_image(fixture_t *f, int i, const uint8_t *b, long n, char *reason)
{
    put_file(f->files[i], b, n);
    graft_persist_entry_t e;
    graft_status_t st = graft_persist_verify(f->root, 2, GRAFT_PERSIST_VERIFY_FULL, &e);
    if (reason)
        snprintf(reason, 256, "%s", e.reason);
    return st;
}

static void test_hostile_shard_fields(void **state)
{
    fixture_t *f = *state;
    long n = f->size[0];
    uint8_t *b = malloc((size_t)n + 64);
    char why[256];
    static const uint64_t hostile[] = {0, 1, 63, 64, 4095, 1ull << 32, 1ull << 40, 1ull << 62,
                                       UINT64_MAX, UINT64_MAX - 47};
    /* header fields: step, rank/ranks, layout, raw_bytes, chunk_bytes */
    static const int hdr_off[] = {16, 24, 40, 48};
    /* footer fields: index_offset, chunk_count, raw_bytes */
    static const int foot_off[] = {0, 8, 24};
    for (size_t h = 0; h < GRAFT_ARRAY_SIZE(hostile); h++) {
        for (size_t k = 0; k < GRAFT_ARRAY_SIZE(hdr_off); k++) {
            memcpy(b, f->pristine[0], (size_t)n);
            put64le(b + hdr_off[k], hostile[h]);
            reseal(b, n);
            if (memcmp(b, f->pristine[0], (size_t)n) == 0)
                continue;
            assert_int_not_equal(verify_image(f, 0, b, n, why), GRAFT_OK);
            assert_non_null(strstr(why, "shard-0-of-2"));
        }
        for (size_t k = 0; k < GRAFT_ARRAY_SIZE(foot_off); k++) {
            memcpy(b, f->pristine[0], (size_t)n);
            put64le(b + n - 48 + foot_off[k], hostile[h]);
            reseal(b, n);
            if (memcmp(b, f->pristine[0], (size_t)n) == 0)
                continue;
            assert_int_not_equal(verify_image(f, 0, b, n, why), GRAFT_OK);
        }
        /* every field of every index entry */
        uint64_t io = get64le(f->pristine[0] + n - 48);
        for (uint64_t e = io; e + 48 <= (uint64_t)(n - 48); e += 48)
            for (int fld = 0; fld < 48; fld += 8) {
                memcpy(b, f->pristine[0], (size_t)n);
                put64le(b + e + (uint64_t)fld, hostile[h]);
                reseal(b, n);
                if (memcmp(b, f->pristine[0], (size_t)n) == 0)
                    continue;
                assert_int_not_equal(verify_image(f, 0, b, n, why), GRAFT_OK);
            }
    }
    /* A zstd frame with valid hashes that claims another size. */
    graft__shard_t *s;
    reset(f);
    assert_int_equal(graft__shard_open(f->files[0], &s, why, sizeof(why)), GRAFT_OK);
    const graft__chunk_entry_t *c0 = &s->chunks[0];
    if (c0->codec == GP_CODEC_ZSTD) {
        uint8_t raw[100];
        memset(raw, 7, sizeof(raw));
        uint8_t frame[256];
        size_t fl = ZSTD_compress(frame, sizeof(frame), raw, sizeof(raw), 1);
        assert_false(ZSTD_isError(fl));
        if (fl <= c0->stored_bytes) {
            memcpy(b, f->pristine[0], (size_t)n);
            memset(b + c0->offset, 0, (size_t)c0->stored_bytes);
            memcpy(b + c0->offset, frame, fl);
            /* fix the stored hash in index entry 0 */
            uint64_t io = get64le(b + n - 48);
            put64le(b + io + 24, XXH3_64bits(b + c0->offset, (size_t)c0->stored_bytes));
            reseal(b, n);
            /* The manifest's footer hash already rejects the file... */
            assert_int_equal(verify_image(f, 0, b, n, why), GRAFT_ECORRUPT);
            /* ...and the decoder on its own rejects the frame. */
            graft__shard_t *s2;
            assert_int_equal(graft__shard_open(f->files[0], &s2, why, sizeof(why)), GRAFT_OK);
            const uint8_t *out;
            graft_status_t st = graft__shard_chunk(s2, 0, &out, why, sizeof(why));
            if (st != GRAFT_ECORRUPT || strstr(why, "chunk 0") == NULL)
                fail_msg("forged frame: %s (%s)", graft_status_name(st), why);
            graft__shard_close(s2);
        }
    }
    graft__shard_close(s);
    free(b);
    reset(f);
    assert_int_equal(graft_persist_verify(f->root, 2, GRAFT_PERSIST_VERIFY_FULL, NULL), GRAFT_OK);
}

typedef void (*manifest_edit_fn)(Graft__CheckpointManifest *m);

static void edit_ranks(Graft__CheckpointManifest *m) { m->ranks = 3; }
static void edit_path(Graft__CheckpointManifest *m) { m->shards[0]->file = "../../../etc/passwd"; }
static void edit_dup_rank(Graft__CheckpointManifest *m) { m->shards[1]->rank = 0; }
static void edit_overlap(Graft__CheckpointManifest *m) { m->shards[1]->regions[0]->global_offset = 0; }
static void edit_range(Graft__CheckpointManifest *m) { m->shards[0]->regions[0]->bytes = UINT64_MAX; }
static void edit_in_shard(Graft__CheckpointManifest *m) { m->shards[0]->regions[1]->offset_in_shard = UINT64_MAX - 5; }
static void edit_gsize(Graft__CheckpointManifest *m) { m->regions[0]->region->bytes += 4; }
static void edit_step(Graft__CheckpointManifest *m) { m->step = 1; }
static void edit_version(Graft__CheckpointManifest *m) { m->version = 9; }
static void edit_raw(Graft__CheckpointManifest *m) { m->raw_bytes += 1; }
static void edit_layout(Graft__CheckpointManifest *m) { m->layout_hash ^= 1; }
static void edit_no_regions(Graft__CheckpointManifest *m) { m->n_regions = 0; }
static void edit_footer(Graft__CheckpointManifest *m) { m->shards[1]->file_hash ^= 1; }

static void test_hostile_manifests(void **state)
{
    fixture_t *f = *state;
    static const manifest_edit_fn edits[] = {edit_ranks, edit_path, edit_dup_rank, edit_overlap,
                                             edit_range, edit_in_shard, edit_gsize, edit_step,
                                             edit_version, edit_raw, edit_layout,
                                             edit_no_regions, edit_footer};
    char *dir = pt_path(f->root, 2, "");
    dir[strlen(dir) - 1] = '\0';
    for (size_t i = 0; i < GRAFT_ARRAY_SIZE(edits); i++) {
        reset(f);
        char why[256];
        Graft__CheckpointManifest *m;
        assert_int_equal(graft__manifest_read(dir, 2, &m, why, sizeof(why)), GRAFT_OK);
        size_t saved_regions = m->n_regions;
        char *saved_file = m->shards[0]->file;
        edits[i](m);
        /* written with valid checksums: only the semantic checks catch it */
        graft__pdir_t d;
        assert_int_equal(graft__persist_dir_open(f->root, 2, false, 0, &d), GRAFT_OK);
        assert_int_equal(graft__manifest_write(&d, m, NULL, 0), GRAFT_OK);
        graft__persist_dir_close(&d);
        m->n_regions = saved_regions;
        m->shards[0]->file = saved_file;
        graft__manifest_free(m);
        graft_persist_entry_t e;
        graft_status_t st = graft_persist_verify(f->root, 2, GRAFT_PERSIST_VERIFY_FULL, &e);
        if (st == GRAFT_OK)
            fail_msg("manifest edit %zu not detected", i);
        assert_int_equal(e.state, GRAFT_PERSIST_CORRUPT);
        assert_true(strstr(e.reason, "manifest") != NULL || strstr(e.reason, "shard-") != NULL);
        assert_int_equal(restore_newest(f, NULL), 1);
    }
    free(dir);
    reset(f);
}

/* --------------------------------------------------------------- fuzz --- */

static void test_fuzz(void **state)
{
    fixture_t *f = *state;
    uint64_t rng = 0xf00d;
    const char *env = getenv("GRAFT_FUZZ_ITERS");
    int iters = env ? atoi(env) : 400;
    uint8_t *b = malloc(1 << 16);
    int detected = 0;
    for (int it = 0; it < iters; it++) {
        reset(f);
        int i = (int)(pt_rand(&rng) % 3);
        long n = f->size[i];
        memcpy(b, f->pristine[i], (size_t)n);
        int muts = 1 + (int)(pt_rand(&rng) % 6);
        for (int k = 0; k < muts; k++) {
            uint64_t r = pt_rand(&rng);
            long off = n > 0 ? (long)(r % (uint64_t)n) : 0;
            switch ((r >> 32) % 6) {
            case 0: /* flip */
                if (n > 0)
                    b[off] ^= (uint8_t)(1u << ((r >> 40) % 8));
                break;
            case 1: /* random byte */
                if (n > 0)
                    b[off] = (uint8_t)(r >> 48);
                break;
            case 2: /* truncate */
                n = off;
                break;
            case 3: /* grow */
                if (n + 64 < (1 << 16)) {
                    for (int x = 0; x < 64; x++)
                        b[n + x] = (uint8_t)pt_rand(&rng);
                    n += 1 + (long)((r >> 40) % 64);
                }
                break;
            case 4: /* hostile 8-byte value at an aligned offset */
                if (n >= 8) {
                    long o = (off & ~7L) > n - 8 ? n - 8 : (off & ~7L);
                    put64le(b + o, (r >> 48) % 2 ? UINT64_MAX - (r % 100) : (r >> 20));
                }
                break;
            default: /* re-seal the checksums of a shard */
                if (i < 2)
                    reseal(b, n);
                break;
            }
        }
        bool same = n == f->size[i] && memcmp(b, f->pristine[i], (size_t)n) == 0;
        graft_status_t st = verify_image(f, i, b, n, NULL);
        if (same)
            assert_int_equal(st, GRAFT_OK);
        else
            detected += st != GRAFT_OK;
        graft_persist_entry_t *list;
        size_t cnt;
        assert_int_equal(graft_persist_list(f->root, &list, &cnt), GRAFT_OK);
        graft_free(list);
        if (it % 8 == 0)
            (void)restore_newest(f, NULL); /* asserts the data of whatever it restores */
    }
    assert_true(detected > iters / 2);
    free(b);
    reset(f);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_bit_flips),
        cmocka_unit_test(test_truncation_and_missing),
        cmocka_unit_test(test_hostile_shard_fields),
        cmocka_unit_test(test_hostile_manifests),
        cmocka_unit_test(test_fuzz),
    };
    return cmocka_run_group_tests_name("persist_corrupt", tests, setup, teardown);
}
