/*
 * Helpers shared by the persist tests (compiled once, tests/support): temporary
 * directories, deterministic data, random layouts, global regions split
 * across ranks, and small file surgery for corruption tests.
 */
#ifndef GRAFT_TEST_PERSIST_FIXTURE_H
#define GRAFT_TEST_PERSIST_FIXTURE_H

#include <dirent.h>
#include <fcntl.h>
#include <ftw.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <graft/persist.h>

uint64_t pt_rand(uint64_t *s);

/* Half random, half runs: compressible but not trivially. */
void pt_fill(void *buf, size_t n, uint64_t seed);

bool pt_all(const void *buf, size_t n, uint8_t v);

char *pt_tmpdir(void);

/* Removes the tree and frees the path. */
void pt_rmtree(char *dir);

void pt_rmtree_contents(const char *dir);

int pt_count_entries(const char *dir);

char *pt_path(const char *root, uint64_t step, const char *name);

void pt_mkdir_step(const char *root, uint64_t step);

void pt_touch(const char *root, uint64_t step, const char *name);

char *pt_read_file_str(const char *root, uint64_t step, const char *name);

long pt_file_size(const char *path);

void pt_flip_bit(const char *path, long off, int bit);

bool pt_files_equal(const char *a, const char *b);

const char *pt_list_str(const char *root);

/* ------------------------------------------------------------- layouts --- */

typedef struct pt_layout {
    uint32_t ranks;
    graft_persist_region_t **regions;
    size_t *nregions;
    bool owns; /* names and buffers */
} pt_layout_t;

pt_layout_t *pt_layout_alloc(uint32_t ranks, size_t max_regions, bool owns);

void pt_layout_free(pt_layout_t *l);

/* Per rank: private regions of assorted sizes and dtypes, plus regions
 * split across all ranks. */
pt_layout_t *pt_layout_random(uint64_t *rng, uint32_t ranks, int iter);

void pt_layout_fill(pt_layout_t *l, uint64_t seed);

uint64_t pt_layout_raw(const pt_layout_t *l);

pt_layout_t *pt_layout_clone_empty(const pt_layout_t *src);

bool pt_layout_equal(const pt_layout_t *a, const pt_layout_t *b);

/* ------------------------------------------------------ global regions --- */

#define PT_MAX_GLOBAL 8
typedef struct pt_global {
    size_t n;
    const char *names[PT_MAX_GLOBAL];
    graft_persist_kind_t kinds[PT_MAX_GLOBAL];
    uint64_t elem[PT_MAX_GLOBAL];
    uint64_t bytes[PT_MAX_GLOBAL];
    uint8_t *data[PT_MAX_GLOBAL];
} pt_global_t;

pt_global_t *pt_global_new(uint64_t seed);

/* About 5 KiB: for the golden files. */
pt_global_t *pt_global_small(uint64_t seed);

pt_global_t *pt_global_clone_empty(const pt_global_t *src);

bool pt_global_equal(const pt_global_t *a, const pt_global_t *b);

void pt_global_free(pt_global_t *g);

/* Each rank's regions point into g's data at its even-split piece. */
pt_layout_t *pt_global_split(pt_global_t *g, uint32_t ranks);

/* Restore step @step of @root as @ranks ranks into a global like @g, which
 * must come back equal to @g (a cmocka assertion fails otherwise). */
void pt_restore_global(const char *root, uint32_t ranks, uint64_t step, pt_global_t *g);

#endif /* GRAFT_TEST_PERSIST_FIXTURE_H */
