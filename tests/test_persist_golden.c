/*
 * The persistent tier's files against golden copies (tests/golden: each
 * format version still restores and is written byte for byte the same),
 * the manifest's JSON, and every allocation of a save and a restore failed
 * in turn. The round trips and the rest are in test_persist.c.
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

/* -------------------------------------------------------------- golden --- */

#ifndef GRAFT_GOLDEN_DIR
#define GRAFT_GOLDEN_DIR "tests/golden"
#endif

static void golden_write(const char *root, uint64_t step, int level)
{
    pt_global_t *g = pt_global_small(step);
    pt_layout_t *lay = pt_global_split(g, 2);
    graft_persist_config_t cfg = {.root = root, .compression_level = level, .chunk_bytes = 4096,
                                  .threads = 1, .code_revision = "golden"};
    graft_persist_writer_t *w;
    assert_int_equal(graft_persist_writer_create(&cfg, &w), GRAFT_OK);
    graft_persist_commit_opts_t o = {.has_fingerprint = true, .fingerprint = 0x1234};
    assert_int_equal(graft_persist_save(w, step, 2,
                                        (const graft_persist_region_t *const *)lay->regions,
                                        lay->nregions, &o),
                     GRAFT_OK);
    assert_int_equal(graft_persist_wait(w, step, NULL), GRAFT_OK);
    graft_persist_writer_destroy(w);
    pt_layout_free(lay);
    pt_global_free(g);
}

static uint8_t *read_all(const char *path, size_t *len_p)
{
    FILE *f = fopen(path, "rb");
    assert_non_null(f);
    assert_int_equal(fseek(f, 0, SEEK_END), 0);
    long n = ftell(f);
    assert_true(n >= 0);
    rewind(f);
    uint8_t *b = malloc((size_t)n + 1);
    assert_int_equal(fread(b, 1, (size_t)n, f), (size_t)n);
    fclose(f);
    *len_p = (size_t)n;
    return b;
}

static uint64_t le64(const uint8_t *p)
{
    uint64_t v = 0;
    for (int i = 7; i >= 0; i--)
        v = (v << 8) | p[i];
    return v;
}

/* The 40-byte manifest wrapper, field by field as docs/FORMAT.md has it. */
static void wrapper_check(const uint8_t *b, size_t len)
{
    assert_true(len > GP_MANIFEST_HEADER_BYTES);
    assert_memory_equal(b, "GRAFTMF1", 8);
    assert_int_equal(le64(b + 8), 1);
    assert_int_equal(le64(b + 16), len - 40);
    assert_int_equal(le64(b + 24), XXH3_64bits(b + 40, len - 40));
    assert_int_equal(le64(b + 32), XXH3_64bits(b, 32));
}

/* What may differ between the golden manifest and today's: the wall-clock
 * time and the library version always; with zstd, also what depends on the
 * zstd library's output (sizes and footer hashes). Everything else must be
 * the same bytes (manifest.pb) or the same values (manifest.json). */
static const char *const golden_json_varying[] = {"unix_ms", "library_version"};
static const char *const golden_json_zstd[] = {"stored_bytes", "compression_ratio"};
static const char *const golden_json_zstd_shard[] = {"stored_bytes", "file_bytes",
                                                     "footer_hash"};
/* Keys of manifest.json added since the golden files were made (fields are
 * only added; docs/FORMAT.md): allowed in today's sidecar only. */
static const char *const golden_json_added_shard[] = {"written_by_group"};

static void golden_json_strip(json_t *j, bool zstd, bool today)
{
    for (size_t i = 0; i < sizeof(golden_json_varying) / sizeof(golden_json_varying[0]); i++)
        assert_int_equal(json_object_del(j, golden_json_varying[i]), 0);
    for (size_t i = 0; zstd && i < sizeof(golden_json_zstd) / sizeof(golden_json_zstd[0]); i++)
        assert_int_equal(json_object_del(j, golden_json_zstd[i]), 0);
    size_t k;
    json_t *sh;
    json_array_foreach(json_object_get(j, "shards"), k, sh) {
        for (size_t i = 0;
             zstd && i < sizeof(golden_json_zstd_shard) / sizeof(golden_json_zstd_shard[0]); i++)
            assert_int_equal(json_object_del(sh, golden_json_zstd_shard[i]), 0);
        for (size_t i = 0;
             today && i < sizeof(golden_json_added_shard) / sizeof(golden_json_added_shard[0]);
             i++)
            (void)json_object_del(sh, golden_json_added_shard[i]);
    }
}

/* Today's manifest of @p step under @p root against the golden one. */
static void golden_manifest_check(const char *root, uint64_t step, bool zstd)
{
    char *mine_path = pt_path(root, step, GP_MANIFEST_PB);
    char *gold_path = pt_path(GRAFT_GOLDEN_DIR, step, GP_MANIFEST_PB);
    size_t mine_len, gold_len;
    uint8_t *mine = read_all(mine_path, &mine_len);
    uint8_t *gold = read_all(gold_path, &gold_len);
    wrapper_check(gold, gold_len);
    wrapper_check(mine, mine_len);
    Graft__CheckpointManifest *g =
        graft__checkpoint_manifest__unpack(NULL, gold_len - 40, gold + 40);
    Graft__CheckpointManifest *m =
        graft__checkpoint_manifest__unpack(NULL, mine_len - 40, mine + 40);
    assert_non_null(g);
    assert_non_null(m);
    /* protobuf-c packs deterministically (fields in number order), so
     * packing what was read gives back the writer's bytes... */
    size_t n = graft__checkpoint_manifest__get_packed_size(m);
    assert_int_equal(n, mine_len - 40);
    uint8_t *re = malloc(n + 1);
    graft__checkpoint_manifest__pack(m, re);
    assert_memory_equal(re, mine + 40, n);
    free(re);
    /* ...and with the fields that legitimately vary set to the golden
     * values, today's manifest must be the golden payload byte for byte. */
    uint64_t unix_ms = m->unix_ms;
    char *library_version = m->library_version;
    assert_int_not_equal(g->unix_ms, 0);
    m->unix_ms = g->unix_ms;
    m->library_version = g->library_version;
    uint64_t *saved = calloc(3 * m->n_shards + 1, sizeof(*saved));
    uint64_t stored = m->stored_bytes;
    if (zstd) {
        assert_int_equal(m->n_shards, g->n_shards);
        m->stored_bytes = g->stored_bytes;
        for (size_t i = 0; i < m->n_shards; i++) {
            saved[3 * i] = m->shards[i]->stored_bytes;
            saved[3 * i + 1] = m->shards[i]->file_bytes;
            saved[3 * i + 2] = m->shards[i]->file_hash;
            m->shards[i]->stored_bytes = g->shards[i]->stored_bytes;
            m->shards[i]->file_bytes = g->shards[i]->file_bytes;
            m->shards[i]->file_hash = g->shards[i]->file_hash;
        }
    }
    n = graft__checkpoint_manifest__get_packed_size(m);
    re = malloc(n + 1);
    graft__checkpoint_manifest__pack(m, re);
    if (n != gold_len - 40 || memcmp(re, gold + 40, n) != 0)
        fail_msg("step %llu: manifest.pb differs from %s (%zu vs %zu payload bytes)",
                 (unsigned long long)step, gold_path, n, gold_len - 40);
    free(re);
    /* restore what the unpacker owns before freeing */
    m->unix_ms = unix_ms;
    m->library_version = library_version;
    m->stored_bytes = stored;
    for (size_t i = 0; zstd && i < m->n_shards; i++) {
        m->shards[i]->stored_bytes = saved[3 * i];
        m->shards[i]->file_bytes = saved[3 * i + 1];
        m->shards[i]->file_hash = saved[3 * i + 2];
    }
    free(saved);
    graft__checkpoint_manifest__free_unpacked(m, NULL);
    graft__checkpoint_manifest__free_unpacked(g, NULL);
    free(mine);
    free(gold);
    free(mine_path);
    free(gold_path);

    /* The JSON sidecar: the same values, minus the same fields. */
    mine_path = pt_path(root, step, GP_MANIFEST_JSON);
    gold_path = pt_path(GRAFT_GOLDEN_DIR, step, GP_MANIFEST_JSON);
    json_t *jm = json_load_file(mine_path, 0, NULL);
    json_t *jg = json_load_file(gold_path, 0, NULL);
    assert_non_null(jm);
    assert_non_null(jg);
    golden_json_strip(jm, zstd, true);
    golden_json_strip(jg, zstd, false);
    if (!json_equal(jm, jg)) {
        char *a = json_dumps(jm, JSON_SORT_KEYS | JSON_COMPACT);
        char *b = json_dumps(jg, JSON_SORT_KEYS | JSON_COMPACT);
        fail_msg("step %llu: manifest.json differs from %s:\n today  %s\n golden %s",
                 (unsigned long long)step, gold_path, a, b);
    }
    json_decref(jm);
    json_decref(jg);
    free(mine_path);
    free(gold_path);
}

static void test_golden(void **state)
{
    (void)state;
    const char *regen = getenv("GRAFT_GOLDEN_REGEN");
    if (regen != NULL) {
        golden_write(regen, 7, 0);
        golden_write(regen, 8, 3);
        return;
    }
    /* The committed files restore to the data they were made from, onto
     * 2 ranks and resharded onto 3. */
    for (uint64_t step = 7; step <= 8; step++) {
        assert_int_equal(
            graft_persist_verify(GRAFT_GOLDEN_DIR, step, GRAFT_PERSIST_VERIFY_FULL, NULL),
            GRAFT_OK);
        pt_global_t *g = pt_global_small(step);
        pt_restore_global(GRAFT_GOLDEN_DIR, 2, step, g);
        pt_restore_global(GRAFT_GOLDEN_DIR, 3, step, g);
        pt_global_free(g);
    }
    /* Today's writer still produces the same bytes for stored shards, and
     * the same manifests (see golden_manifest_check for what may vary). */
    char *root = pt_tmpdir();
    golden_write(root, 7, 0);
    golden_write(root, 8, 3);
    for (int r = 0; r < 2; r++) {
        char name[32];
        snprintf(name, sizeof(name), "shard-%d-of-2", r);
        char *mine = pt_path(root, 7, name);
        char *gold = pt_path(GRAFT_GOLDEN_DIR, 7, name);
        assert_true(pt_files_equal(mine, gold));
        free(mine);
        free(gold);
    }
    golden_manifest_check(root, 7, false);
    golden_manifest_check(root, 8, true);
    pt_rmtree(root);
}

/* graft_persist_manifest_json() renders manifest.pb as the writer renders
 * its sidecar: byte for byte the manifest.json of a fresh checkpoint. */
static void test_manifest_json(void **state)
{
    (void)state;
    char *root = pt_tmpdir();
    golden_write(root, 7, 0);
    char *text = NULL;
    assert_int_equal(graft_persist_manifest_json(root, 7, &text), GRAFT_OK);
    char *path = pt_path(root, 7, GP_MANIFEST_JSON);
    size_t len;
    uint8_t *sidecar = read_all(path, &len);
    assert_int_equal(strlen(text), len);
    assert_memory_equal(text, sidecar, len);
    graft_free(text);
    free(sidecar);
    free(path);
    text = NULL;
    assert_int_equal(graft_persist_manifest_json(root, 8, &text), GRAFT_ENOTFOUND);
    assert_null(text);
    assert_int_equal(graft_persist_manifest_json(NULL, 7, &text), GRAFT_EINVAL);
    assert_int_equal(graft_persist_manifest_json(root, 7, NULL), GRAFT_EINVAL);
    /* A damaged manifest.pb is an error, not a rendering of garbage. */
    path = pt_path(root, 7, GP_MANIFEST_PB);
    assert_int_equal(truncate(path, 20), 0);
    assert_int_not_equal(graft_persist_manifest_json(root, 7, &text), GRAFT_OK);
    assert_null(text);
    free(path);
    pt_rmtree(root);
}

/* --------------------------------------------------- allocation failure --- */


static void test_alloc_failures(void **state)
{
    (void)state;
    pt_global_t *g = pt_global_small(3);
    pt_layout_t *lay = pt_global_split(g, 2);
    char *root = pt_tmpdir();
    bool saved = false;
    /* Fail the n-th allocation of a whole save + wait, for every n, until
     * one run sees no failure. Every run must end in a clean error. */
    for (int n = 0; n < 400 && !saved; n++) {
        graft_test_alloc_fail_after(n);
        graft_persist_config_t cfg = {.root = root, .compression_level = 1, .chunk_bytes = 4096};
        graft_persist_writer_t *w = NULL;
        graft_status_t st = graft_persist_writer_create(&cfg, &w);
        if (st == GRAFT_OK) {
            st = graft_persist_save(w, 1, 2, (const graft_persist_region_t *const *)lay->regions,
                                    lay->nregions, NULL);
            if (st == GRAFT_OK)
                st = graft_persist_wait(w, 1, NULL);
        }
        graft_persist_writer_destroy(w);
        graft_test_alloc_restore();
        if (graft_test_alloc_refused() == 0) {
            assert_int_equal(st, GRAFT_OK);
            saved = true;
        } else if (st == GRAFT_OK) {
            /* a failure the writer absorbed (e.g. the step record) must
             * still leave a checkpoint that verifies, or none */
            graft_status_t v = graft_persist_verify(root, 1, GRAFT_PERSIST_VERIFY_FULL, NULL);
            assert_true(v == GRAFT_OK || v == GRAFT_ENOTFOUND);
            pt_rmtree_contents(root);
        } else {
            /* never a checkpoint that lists as valid after a failed save */
            assert_int_not_equal(graft_persist_verify(root, 1, GRAFT_PERSIST_VERIFY_QUICK, NULL),
                                 GRAFT_OK);
            pt_rmtree_contents(root);
        }
    }
    assert_true(saved);
    /* The same for a restore. */
    pt_global_t *got = pt_global_clone_empty(g);
    pt_layout_t *back = pt_global_split(got, 3);
    bool restored = false;
    for (int n = 0; n < 400 && !restored; n++) {
        graft_test_alloc_fail_after(n);
        graft_status_t st = GRAFT_OK;
        for (uint32_t r = 0; r < 3 && st == GRAFT_OK; r++) {
            graft_persist_restore_params_t p = {.rank = r, .ranks = 3, .regions = back->regions[r],
                                                .nregions = back->nregions[r]};
            st = graft_persist_restore(root, &p, NULL);
        }
        graft_test_alloc_restore();
        if (graft_test_alloc_refused() == 0) {
            assert_int_equal(st, GRAFT_OK);
            restored = true;
        } else {
            assert_int_not_equal(st, GRAFT_OK);
        }
    }
    assert_true(restored);
    assert_true(pt_global_equal(g, got));
    pt_layout_free(back);
    pt_global_free(got);
    pt_layout_free(lay);
    pt_global_free(g);
    pt_rmtree(root);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_golden),
        cmocka_unit_test(test_manifest_json),
        cmocka_unit_test(test_alloc_failures),
    };
    return cmocka_run_group_tests_name("persist_golden", tests, NULL, NULL);
}
