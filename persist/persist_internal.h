/*
 * Private to persist/: the shard file and manifest encodings (docs/FORMAT.md),
 * a verified shard reader used by the reader, the committer and the second
 * tier, and small durable-file helpers.
 */
#ifndef GRAFT_PERSIST_INTERNAL_H
#define GRAFT_PERSIST_INTERNAL_H

#include "graft_internal.h"
#include <graft/persist.h>

#include "proto/graft.pb-c.h"

#include <stdbool.h>
#include <stdint.h>

#define GP_MOD "persist"

#define GP_SHARD_MAGIC "GRAFTSH1"
#define GP_FOOTER_MAGIC "GRAFTEND"
#define GP_MANIFEST_MAGIC "GRAFTMF1"
#define GP_HEADER_BYTES 64u
#define GP_INDEX_ENTRY_BYTES 48u
#define GP_FOOTER_BYTES 48u
#define GP_MANIFEST_HEADER_BYTES 40u
#define GP_MIN_CHUNK_BYTES 4096ull
#define GP_MAX_CHUNK_BYTES (256ull << 20)
#define GP_DEFAULT_CHUNK_BYTES (4ull << 20)
#define GP_MAX_RANKS 65535u
#define GP_MAX_MANIFEST_BYTES (64ull << 20)
#define GP_MAX_NAME 255u
#define GP_CODEC_STORED 0u
#define GP_CODEC_ZSTD 1u

#define GP_MANIFEST_PB "manifest.pb"
#define GP_MANIFEST_JSON "manifest.json"

typedef struct graft__shard_header {
    uint32_t version;
    uint64_t step;
    uint32_t rank;
    uint32_t ranks;
    uint64_t layout_hash;
    uint64_t raw_bytes;
    uint64_t chunk_bytes;
} graft__shard_header_t;

typedef struct graft__chunk_entry {
    uint64_t offset;
    uint64_t stored_bytes;
    uint64_t raw_bytes;
    uint64_t stored_hash;
    uint64_t raw_hash;
    uint32_t codec;
} graft__chunk_entry_t;

typedef struct graft__shard_footer {
    uint64_t index_offset;
    uint64_t chunk_count;
    uint64_t index_hash;
    uint64_t raw_bytes;
    uint64_t footer_hash;
} graft__shard_footer_t;

/* Little-endian encodings of the fixed-size parts. */
void graft__persist_header_encode(const graft__shard_header_t *h, uint8_t out[GP_HEADER_BYTES]);
void graft__persist_entry_encode(const graft__chunk_entry_t *e, uint8_t out[GP_INDEX_ENTRY_BYTES]);
/* Fills f->footer_hash. */
void graft__persist_footer_encode(graft__shard_footer_t *f, uint8_t out[GP_FOOTER_BYTES]);

/* A shard file opened and checked down to its index (quick verification). */
typedef struct graft__shard {
    int fd;
    char *path;
    const char *file; /* basename inside path, for messages */
    uint64_t file_bytes;
    graft__shard_header_t header;
    graft__shard_footer_t footer;
    graft__chunk_entry_t *chunks;
    /* one decoded chunk cached, so ranged reads do not decode twice */
    uint8_t *raw;
    uint64_t raw_cap;
    uint8_t *stored;
    uint64_t stored_cap;
    uint64_t cached;
    void *dctx;
} graft__shard_t;

GRAFT_WUR graft_status_t graft__shard_open(const char *path, graft__shard_t **shard_p, char *why,
                                           size_t why_len);
void graft__shard_close(graft__shard_t *s);
/* Decode and verify chunk i; *raw_p stays valid until the next call. */
GRAFT_WUR graft_status_t graft__shard_chunk(graft__shard_t *s, uint64_t i, const uint8_t **raw_p,
                                            char *why, size_t why_len);
/* Copy raw bytes [off, off+len) of the shard's stream into dst. */
GRAFT_WUR graft_status_t graft__shard_read(graft__shard_t *s, uint64_t off, void *dst,
                                           uint64_t len, char *why, size_t why_len);

/* protobuf-c allocator that goes through graft's allocation hooks. */
extern ProtobufCAllocator graft__persist_pb_allocator;

/* Manifest: read, check the wrapper and every invariant; free with
 * graft__manifest_free(). */
GRAFT_WUR graft_status_t graft__manifest_read(const char *dir, uint64_t step,
                                              Graft__CheckpointManifest **m_p, char *why,
                                              size_t why_len);
void graft__manifest_free(Graft__CheckpointManifest *m);
/* Check a manifest's invariants (also used before writing one). */
GRAFT_WUR graft_status_t graft__manifest_check(const Graft__CheckpointManifest *m, char *why,
                                               size_t why_len);
/* Write manifest.json then manifest.pb (the commit point), each durably. */
GRAFT_WUR graft_status_t graft__manifest_write(const char *dir, const Graft__CheckpointManifest *m);
/* Quick-verify every shard of a manifest (headers, indexes, footers, record
 * match); with full, every chunk too. */
GRAFT_WUR graft_status_t graft__checkpoint_verify(const char *dir,
                                                  const Graft__CheckpointManifest *m, bool full,
                                                  char *why, size_t why_len);

/* Layout hash of a rank's region table. */
uint64_t graft__persist_layout_hash(const graft_persist_region_t *regions, size_t n);
/* Layout hash of a manifest's global region table. */
uint64_t graft__persist_global_hash(const Graft__CheckpointManifest *m);

/* Paths and durable I/O. */
char *graft__persist_step_dir(const char *root, uint64_t step);
char *graft__persist_shard_name(uint32_t rank, uint32_t ranks);
GRAFT_WUR graft_status_t graft__persist_mkdirs(const char *path);
GRAFT_WUR graft_status_t graft__persist_write_all(int fd, const void *buf, size_t len,
                                                  const char *path);
GRAFT_WUR graft_status_t graft__persist_fsync_dir(const char *dir);
GRAFT_WUR graft_status_t graft__persist_file_atomic(const char *dir, const char *name,
                                                    const void *data, size_t len);
/* Remove a checkpoint directory: manifest first (then the directory is
 * merely incomplete), then everything else. */
GRAFT_WUR graft_status_t graft__persist_remove_dir(const char *dir);
/* Parse "step-<digits>"; false if the name is not a checkpoint directory. */
bool graft__persist_parse_step_dir(const char *name, uint64_t *step_p);

/* Copy one checkpoint to another root, manifest last, and full-verify it. */
GRAFT_WUR graft_status_t graft__persist_copy_checkpoint(const char *from_root, const char *to_root,
                                                        uint64_t step);

/* Device copies (persist/cuda_persist.c with CUDA, else persist_nocuda.c). */
GRAFT_WUR graft_status_t graft__persist_d2h(void *dst, const void *src, size_t n);
GRAFT_WUR graft_status_t graft__persist_h2d(void *dst, const void *src, size_t n);

/* Test hook: when > 0, counts down at each durable-write step and SIGKILLs
 * the process when it reaches zero. */
extern volatile int graft__persist_crash_countdown;
void graft__persist_crash_point(void);

/* Test hooks for GRAFT_PERSIST_LEVEL_AUTO: when > 0, every compression
 * helper sleeps this long before each chunk (a starved CPU), and the
 * background thread after writing each chunk (a slow disk). */
extern volatile int graft__persist_test_compress_delay_us;
extern volatile int graft__persist_test_write_delay_us;

#endif /* GRAFT_PERSIST_INTERNAL_H */
