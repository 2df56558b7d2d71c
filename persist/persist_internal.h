/*
 * Private to persist/: the shard file and manifest encodings (docs/FORMAT.md),
 * a verified shard reader used by the reader, the committer and the second
 * tier, and small durable-file helpers.
 */
#ifndef GRAFT_PERSIST_INTERNAL_H
#define GRAFT_PERSIST_INTERNAL_H

#include "graft_internal.h"
#include "pb_alloc.h"
#include <graft/persist.h>

#include "proto/graft.pb-c.h"

#include <pthread.h>
#include <semaphore.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

#include <zstd.h>

#define GRAFT_MOD_PERSIST "persist"

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

/* A checkpoint directory opened for writing: <root>/step-<20 digits>, the
 * root as configured, the step directory never through a symbolic link
 * (created first with create). */
typedef struct graft__pdir {
    int fd;
    char *path; /* for messages */
} graft__pdir_t;

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

/* The key of a manifest's MAC (the job secret); NULL where there is none. */
typedef struct graft__persist_key {
    const uint8_t *bytes;
    size_t len;
} graft__persist_key_t;

/* Manifest: read, check the wrapper and every invariant; free with
 * graft__manifest_free(). */
GRAFT_WUR graft_status_t graft__manifest_read(const char *dir, uint64_t step,
                                              Graft__CheckpointManifest **m_p, char *why,
                                              size_t why_len);
/* The same, and with a key the manifest's MAC must verify under it: one
 * that has none or a wrong one is GRAFT_ECORRUPT, why saying which. */
GRAFT_WUR graft_status_t graft__manifest_read_keyed(const char *dir, uint64_t step,
                                                    const graft__persist_key_t *key,
                                                    Graft__CheckpointManifest **m_p, char *why,
                                                    size_t why_len);
void graft__manifest_free(Graft__CheckpointManifest *m);
/* Check a manifest's invariants (also used before writing one). */
GRAFT_WUR graft_status_t graft__manifest_check(const Graft__CheckpointManifest *m, char *why,
                                               size_t why_len);
/* Write manifest.json then manifest.pb (the commit point), each durably,
 * in d; with a key, manifest.pb carries the MAC (m's own mac is ignored). */
GRAFT_WUR graft_status_t graft__manifest_write(const graft__pdir_t *d,
                                               const Graft__CheckpointManifest *m,
                                               const graft__persist_key_t *key, uint32_t mode);
/* Quick-verify every shard of a manifest (headers, indexes, footers, record
 * match); with full, every chunk too. */
GRAFT_WUR graft_status_t graft__checkpoint_verify(const char *dir,
                                                  const Graft__CheckpointManifest *m, bool full,
                                                  char *why, size_t why_len);

/* Restore p->step from root opening only the shards it reads (each
 * checked against the manifest when opened, every chunk's hash when
 * decoded), without verifying every shard first: the remote tier's
 * restore, whose download holds only this rank's shards, verified
 * already (persist_reader.c). */
GRAFT_WUR graft_status_t graft__persist_restore_read(const char *root,
                                                     const graft_persist_restore_params_t *p,
                                                     graft_persist_restore_result_t *res,
                                                     char *why, size_t why_len);

/* Layout hash of a rank's region table. */
uint64_t graft__persist_layout_hash(const graft_persist_region_t *regions, size_t n);
/* Layout hash of a manifest's global region table. */
uint64_t graft__persist_global_hash(const Graft__CheckpointManifest *m);

/* Paths and durable I/O (persist_durable.c). */
char *graft__persist_step_dir(const char *root, uint64_t step);
char *graft__persist_shard_name(uint32_t rank, uint32_t ranks);
/* File modes: graft_persist_config_t::file_mode, 0 meaning the default;
 * a directory gets the search bit of each class that may read or write. */
uint32_t graft__persist_file_mode(uint32_t mode);
uint32_t graft__persist_dir_mode(uint32_t mode);
bool graft__persist_mode_valid(uint32_t mode);
/* Create the configured root and its missing parents (links the operator
 * made on the way are followed). */
GRAFT_WUR graft_status_t graft__persist_mkdirs(const char *path, uint32_t mode);
GRAFT_WUR graft_status_t graft__persist_write_all(int fd, const void *buf, size_t len,
                                                  const char *path);
GRAFT_WUR graft_status_t graft__persist_fsync_dir(const char *dir);

GRAFT_WUR graft_status_t graft__persist_dir_open(const char *root, uint64_t step, bool create,
                                                 uint32_t mode, graft__pdir_t *d);
void graft__persist_dir_close(graft__pdir_t *d);
/* Write a whole file durably (a temporary file, below). */
GRAFT_WUR graft_status_t graft__persist_file_atomic(const graft__pdir_t *d, const char *name,
                                                    const void *data, size_t len, uint32_t mode);

/* A file written under a temporary name and renamed into place once it is
 * durable (persist_durable.c): open (a stale <name>.tmp is unlinked, the
 * new one created O_EXCL|O_NOFOLLOW in d), write to fd, sync (fsync,
 * close), install (renameat, fsync of the directory), with a crash point
 * between the steps; close always, which removes the temporary file unless
 * it was installed. d stays open until then. Every step maps a full disk to
 * GRAFT_ENOSPC, any other failure to GRAFT_EIO. */
typedef struct graft__tmpfile {
    int fd;
    int dir_fd; /* borrowed from the graft__pdir_t */
    bool installed;
    char *name;     /* <name> */
    char *tmp_name; /* <name>.tmp */
    char *tmp;      /* <dir>/<name>.tmp, for messages */
    char *final;    /* <dir>/<name>, for messages */
} graft__tmpfile_t;

GRAFT_WUR graft_status_t graft__tmpfile_open(graft__tmpfile_t *f, const graft__pdir_t *d,
                                             const char *name, uint32_t mode);
GRAFT_WUR graft_status_t graft__tmpfile_sync(graft__tmpfile_t *f);
GRAFT_WUR graft_status_t graft__tmpfile_install(graft__tmpfile_t *f);
void graft__tmpfile_close(graft__tmpfile_t *f);
/* Remove a checkpoint directory: manifest first (then the directory is
 * merely incomplete), then everything else; a symbolic link where the
 * directory should be is removed as a link. */
GRAFT_WUR graft_status_t graft__persist_remove_dir(const char *root, uint64_t step);
/* Parse "step-<digits>"; false if the name is not a checkpoint directory. */
bool graft__persist_parse_step_dir(const char *name, uint64_t *step_p);

/* Copy one checkpoint to another root, manifest last, and full-verify it
 * (its MAC too, when a key is given). */
GRAFT_WUR graft_status_t graft__persist_copy_checkpoint(const char *from_root, const char *to_root,
                                                        uint64_t step,
                                                        const graft__persist_key_t *key,
                                                        uint32_t mode);

/* Test hooks, only in the test build of the library (-DGRAFT_TEST_FAULTS,
 * tests/testlib.mk): the ordinary build has neither the variables nor the
 * calls. graft__persist_crash_countdown: when > 0, counts down at each
 * durable-write step and SIGKILLs the process when it reaches zero.
 * graft__persist_test_*_delay_us, for GRAFT_PERSIST_LEVEL_AUTO: when > 0,
 * every compression helper sleeps this long before each chunk (a starved
 * CPU), and the background thread after writing each chunk (a slow
 * disk). */
#ifdef GRAFT_TEST_FAULTS
extern volatile int graft__persist_crash_countdown;
void graft__persist_crash_point(void);
extern volatile int graft__persist_test_compress_delay_us;
extern volatile int graft__persist_test_write_delay_us;
#define GP_CRASH_POINT() graft__persist_crash_point()
#define GP_TEST_DELAY(var) ((var) > 0 ? (void)usleep((useconds_t)(var)) : (void)0)
#else
#define GP_CRASH_POINT() ((void)0)
#define GP_TEST_DELAY(var) ((void)0)
#endif

/* ------------------------------------------------------------------------
 * The asynchronous writer: persist_writer.c (snapshot, shard files, the
 * background thread), persist_pool.c (compression helpers) and
 * persist_commit.c (commit and the commit job).
 */

/* zstd level for the chunks that GRAFT_PERSIST_LEVEL_AUTO compresses. */
#define GP_AUTO_ZSTD_LEVEL (-1)

enum { JOB_SHARD, JOB_COMMIT };

typedef struct gp_staging {
    uint8_t *buf;
    uint64_t cap;
    struct gp_staging *next;
    /* Chunks of it handed to compression helpers and not yet read. */
    atomic_uint users;
} gp_staging_t;

typedef struct gp_job {
    int type;
    uint64_t step;
    uint32_t rank;
    uint32_t ranks;
    /* shard */
    gp_staging_t *staging;
    uint64_t raw_bytes;
    graft_persist_region_t *regions; /* names owned, ptr unused */
    size_t nregions;
    uint64_t layout_hash;
    /* commit */
    graft_persist_commit_opts_t opts;
    uint64_t snapshot_ns;
    uint64_t start_ns;
    struct gp_job *next;
} gp_job_t;

typedef struct gp_shard_rec {
    uint64_t step;
    uint32_t rank;
    graft_status_t status;
    uint8_t *info;
    size_t len;
    struct gp_shard_rec *next;
} gp_shard_rec_t;

typedef struct gp_step_rec {
    uint64_t step;
    bool done;
    graft_persist_write_result_t result;
    struct gp_step_rec *next;
} gp_step_rec_t;

/* An output buffer for one chunk's encoding, and who owns it:
 *   FREE      the background thread; it may assign a chunk (-> ASSIGNED)
 *   ASSIGNED  either: the helper starts it (-> BUSY) or the background
 *             thread takes it back (-> FREE)
 *   BUSY      the helper; it finishes (-> DONE), unless the background
 *             thread gave up on it (-> ABANDONED)
 *   DONE      the background thread, which writes it (-> FREE)
 *   ABANDONED the helper, which drops the result when done (-> FREE)
 * Transitions between owners are compare-and-swaps on state. */
enum { SLOT_FREE, SLOT_ASSIGNED, SLOT_BUSY, SLOT_DONE, SLOT_ABANDONED };

typedef struct gp_slot {
    atomic_int state;
    /* the chunk, set before ASSIGNED */
    uint64_t chunk;
    uint64_t assigned_ns;
    const uint8_t *raw;
    size_t len;
    gp_staging_t *src;
    /* the result, set before DONE */
    uint8_t *out;
    size_t out_cap;
    graft__chunk_entry_t entry; /* offset filled in by the writer */
    const uint8_t *stored;      /* out, or the raw bytes for a stored chunk */
} gp_slot_t;

/* One compression helper thread, started at the first compressed shard and
 * kept until the writer is destroyed. Two slots: one being compressed, one
 * waiting for the background thread to write it. */
typedef struct gp_helper {
    pthread_t tid;
    sem_t wake; /* posted for each assignment, and to stop */
    gp_slot_t slots[2];
    _Atomic uint64_t tc_ns; /* running average of its time per chunk */
    struct gp_pool *pool;
} gp_helper_t;

typedef struct gp_pool {
    gp_helper_t *h;   /* `threads` of them */
    uint32_t started; /* helpers running */
    bool adaptive;    /* GRAFT_PERSIST_LEVEL_AUTO */
    int level;
    atomic_bool stop;
    sem_t done;       /* posted after every chunk a helper finishes */
    /* Used by the background thread only: the shard being written. */
    bool active;
    gp_staging_t *staging;
    const uint8_t *raw;
    uint64_t raw_bytes;
    uint64_t chunk_bytes;
    uint64_t nchunks;
    uint64_t wpos;  /* first chunk not yet taken for writing */
    uint64_t next;  /* first chunk not yet assigned or taken */
    uint64_t tw_ns; /* running average of the time to take and write a chunk */
    /* staging buffers of finished shards still being read by a helper */
    gp_staging_t *orphans;
} gp_pool_t;

struct graft_persist_writer {
    char *root;
    char *second_root;
    char *code_revision;
    uint32_t file_mode;
    /* The manifest MAC's key (secret_len 0: none), wiped at destroy. */
    uint8_t secret[GRAFT_PERSIST_SECRET_MAX_BYTES];
    size_t secret_len;
    int level;
    uint32_t threads;
    uint64_t chunk_bytes;
    uint32_t max_pending;
    uint32_t group;
    graft_persist_retention_t retention;

    pthread_t thread;
    bool thread_started;
    pthread_mutex_t mu;
    pthread_cond_t cv_work;
    pthread_cond_t cv_done;
    bool stop;
    gp_job_t *head;
    gp_job_t *tail;
    uint32_t inflight_shards;
    gp_shard_rec_t *shards;
    gp_step_rec_t *steps;
    gp_staging_t *pool;

    /* The remote tier's uploader (persist_remote.c); NULL without one. */
    struct graft__remote *remote;

    gp_pool_t hp; /* compression helpers */
    /* The background thread's own encoder, for chunks no helper took. */
    ZSTD_CCtx *cctx;
    gp_slot_t own;
};

/* Staging buffers (persist_staging.c): one of at least @p need bytes, a
 * warm one when the pool has it (NULL when out of memory); give one back,
 * kept for the next snapshot while the pool has room; free one. */
gp_staging_t *graft__persist_staging_get(graft_persist_writer_t *w, uint64_t need);
void graft__persist_staging_put(graft_persist_writer_t *w, gp_staging_t *s);
void graft__persist_staging_free(gp_staging_t *s);
/* Disk helpers of persist_durable.c that the writer and the commit share:
 * free bytes under root, with a margin (GRAFT_ENOSPC when short of need),
 * and whether a committed checkpoint of step is there. */
GRAFT_WUR graft_status_t graft__persist_space_check(const char *root, uint64_t need);
bool graft__persist_manifest_exists(const char *root, uint64_t step);

/* The compression pool (persist_pool.c), driven by the background thread
 * for the shard it writes: prepare (once per writer; starts the helpers),
 * begin, then take and finish each chunk in order, then end. */
GRAFT_WUR graft_status_t graft__persist_pool_prepare(graft_persist_writer_t *w);
void graft__persist_pool_begin(graft_persist_writer_t *w, gp_job_t *j, uint64_t nchunks);
gp_slot_t *graft__persist_chunk_take(graft_persist_writer_t *w, uint64_t c,
                                     uint32_t *compressed_p, uint32_t *dropped_p);
void graft__persist_chunk_done(graft_persist_writer_t *w, gp_slot_t *s, uint64_t took_ns);
void graft__persist_pool_end(graft_persist_writer_t *w, gp_job_t *j);
/* Stop and join the helpers (after the background thread), then free. */
void graft__persist_pool_stop(graft_persist_writer_t *w);
void graft__persist_pool_free(graft_persist_writer_t *w);

/* Shard records and the commit job (persist_commit.c). */
void graft__persist_shard_rec_add(graft_persist_writer_t *w, uint64_t step, uint32_t rank,
                                  graft_status_t status, uint8_t *info, size_t len);
/* Removes and returns the record; NULL if absent. Caller holds the lock. */
gp_shard_rec_t *graft__persist_shard_rec_take(graft_persist_writer_t *w, uint64_t step,
                                              uint32_t rank);
void graft__persist_commit_job(graft_persist_writer_t *w, gp_job_t *j);

#endif /* GRAFT_PERSIST_INTERNAL_H */
