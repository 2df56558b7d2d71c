/**
 * @file graft/persist.h
 * @brief The persistent tier: sharded, checksummed, asynchronous disk
 *        checkpoints that survive kill -9, bit rot and full disks, and that
 *        restore onto a different number of ranks.
 *
 * A checkpoint of step s lives in `<root>/step-<20-digit s>/`: one shard file
 * per rank (`shard-<rank>-of-<ranks>`) and a manifest (`manifest.pb`, with a
 * human-readable `manifest.json` beside it) that is written LAST. A
 * checkpoint without a manifest does not exist. The on-disk format is
 * described in docs/FORMAT.md.
 *
 * Overview, from simple to advanced:
 *
 *  1. Describe each rank's state as an array of ::graft_persist_region_t. A
 *     region may be split across ranks: rank r holds bytes
 *     [global_offset, global_offset + bytes) of a region whose size across
 *     all ranks is global_bytes; graft_persist_split_even() computes the
 *     default even split.
 *  2. Writing, single process: graft_persist_writer_create(), then
 *     graft_persist_save() with the regions of every rank (it blocks only for
 *     the snapshot: a memcpy into a staging buffer) and graft_persist_wait()
 *     for the background write (chunk, compress, hash, write, fsync, rename,
 *     manifest last).
 *  3. Writing, distributed: every rank calls graft_persist_shard_write() and
 *     graft_persist_shard_wait(), which returns a small serialized shard
 *     record once the shard is durable; the runtime ships the records
 *     (through etcd) to one rank, which calls graft_persist_commit() to write
 *     the manifest.
 *  4. Reading: graft_persist_list() (newest first, with status and why),
 *     graft_persist_verify() (quick or full), graft_persist_restore() (the
 *     newest checkpoint that verifies, reshard by byte-range intersection,
 *     region/kind filters, fingerprint re-check, progress callback).
 *  5. Retention: graft_persist_retention_plan() (pure) and
 *     graft_persist_retention_apply() (deletes what the plan drops).
 *  6. The remote tier: graft_persist_config_t::remote uploads every
 *     checkpoint to an S3-compatible bucket in the background;
 *     graft_persist_remote_restore() restores from it when no local root
 *     holds an intact checkpoint.
 *
 * Thread safety: a writer may be used from one thread at a time; its work
 * runs on its own background threads. Reader functions are reentrant.
 */
#ifndef GRAFT_PERSIST_H
#define GRAFT_PERSIST_H

#include <graft/common.h>

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/** Version of the on-disk format written by this library (docs/FORMAT.md). */
#define GRAFT_PERSIST_FORMAT_VERSION 1

/* ------------------------------------------------------------------------ */
/* Regions                                                                  */
/* ------------------------------------------------------------------------ */

/** What a region holds: graft_region_kind_t (graft/common.h), by older names. */
typedef graft_region_kind_t graft_persist_kind_t;
#define GRAFT_PERSIST_KIND_PARAM GRAFT_REGION_PARAM
#define GRAFT_PERSIST_KIND_OPTIM GRAFT_REGION_OPTIM
#define GRAFT_PERSIST_KIND_RNG GRAFT_REGION_RNG
#define GRAFT_PERSIST_KIND_SCHED GRAFT_REGION_SCHED
#define GRAFT_PERSIST_KIND_DATA GRAFT_REGION_DATA
#define GRAFT_PERSIST_KIND_SCALER GRAFT_REGION_SCALER
#define GRAFT_PERSIST_KIND_STEP GRAFT_REGION_STEP
#define GRAFT_PERSIST_KIND_BLOB GRAFT_REGION_BLOB

/** Bit for @p kind in a kind mask (see ::graft_persist_restore_params_t). */
#define GRAFT_PERSIST_KIND_BIT(kind) (1u << (unsigned)(kind))

/** Where a region's memory lives: graft_device_t (graft/common.h). A CUDA
 * region needs a GPU. */
typedef graft_device_t graft_persist_device_t;
#define GRAFT_PERSIST_DEVICE_HOST GRAFT_DEVICE_HOST
#define GRAFT_PERSIST_DEVICE_CUDA GRAFT_DEVICE_CUDA

/**
 * One rank's piece of one region: this rank holds bytes
 * [global_offset, global_offset + bytes) of the region @p name, whose size
 * across all ranks is @p global_bytes (0 means "not split": global_bytes =
 * bytes and global_offset = 0).
 */
typedef struct graft_persist_region {
    const char *name;              /**< unique within the rank, 1..255 bytes */
    graft_persist_kind_t kind;     /**< what it holds */
    uint32_t dtype;                /**< the trainer's dtype code, stored as is */
    graft_persist_device_t device; /**< host or CUDA */
    void *ptr;                     /**< read by a save, written by a restore */
    uint64_t bytes;                /**< size of this rank's piece */
    uint64_t global_offset;        /**< where the piece starts in the region */
    uint64_t global_bytes;         /**< size of the whole region; 0 = bytes */
} graft_persist_region_t;

/**
 * @brief The default even split of a region across ranks: every rank gets
 *        whole elements, the first (elements % ranks) ranks one more.
 * @param [in]  global_bytes  size of the region; a multiple of @p elem_bytes.
 * @param [in]  elem_bytes    element size (1 for raw bytes); not 0.
 * @param [in]  rank          0..ranks-1.
 * @param [in]  ranks         number of ranks; not 0.
 * @param [out] offset_p      start of rank's piece.
 * @param [out] bytes_p       size of rank's piece (may be 0).
 * @return GRAFT_OK or GRAFT_EINVAL.
 */
GRAFT_WUR graft_status_t graft_persist_split_even(uint64_t global_bytes, uint64_t elem_bytes,
                                                  uint32_t rank, uint32_t ranks,
                                                  uint64_t *offset_p, uint64_t *bytes_p);

/* ------------------------------------------------------------------------ */
/* Writer                                                                   */
/* ------------------------------------------------------------------------ */

/**
 * graft_persist_config_t::compression_level asking for adaptive
 * compression: the background write never waits for compression, so it
 * runs at the disk's pace as with level 0, and chunks are compressed as far
 * as spare CPU allows.
 *
 * The compression helpers (graft_persist_config_t::threads, at the lowest
 * CPU priority, nice +19) compress chunks with zstd's fast level 1 (ZSTD
 * level -1) ahead of the write position, while the background thread
 * writes chunks in order at the disk's pace (writeback is paced with
 * sync_file_range). Whenever the next chunk is not compressed yet when the
 * disk could take it, it is written stored instead of being waited for
 * (a helper half-way through it gives up); the helpers are then handed
 * chunks further ahead. So on a fast disk with little spare CPU most chunks
 * are stored, on a slow disk or with idle cores most are compressed, and
 * which ones varies from run to run. Each chunk records its own codec, so
 * readers need nothing special; the manifest records -1 as the compression
 * level. graft_persist_writer_destroy() joins the helpers, which on a
 * saturated machine may take a while. See docs/PERFORMANCE.md for
 * measurements.
 */
#define GRAFT_PERSIST_LEVEL_AUTO 1000

/** The default compression level: GRAFT_PERSIST_LEVEL_AUTO. */
#define GRAFT_PERSIST_LEVEL_DEFAULT GRAFT_PERSIST_LEVEL_AUTO

/**
 * Mode of the checkpoint files a writer creates when
 * graft_persist_config_t::file_mode is 0: only the owner reads them; their
 * directories get 0700. A wider mode (e.g. 0640) gives each directory the
 * search bit of every class that may read (0750); the process umask still
 * applies on top. Directories that exist already keep their mode.
 */
#define GRAFT_PERSIST_FILE_MODE_DEFAULT 0600u

/** Longest key (job secret) for the manifest MAC. */
#define GRAFT_PERSIST_SECRET_MAX_BYTES 256u

/** Retention policy; see graft_persist_retention_plan(). */
typedef struct graft_persist_retention {
    uint32_t keep_last;       /**< keep the newest N valid checkpoints; 0 = no retention */
    uint64_t milestone_every; /**< keep steps that are multiples of M; 0 = none */
    bool geometric;           /**< thin the rest geometrically instead of deleting them */
    /** An incomplete directory older than the newest valid checkpoint is a
     *  crash's leftover, removed once nothing was added to it (its mtime)
     *  for this long; 0: at once. Writers in several processes set it to
     *  how long a commit may take, so that a checkpoint still being
     *  committed elsewhere, when a newer one completed first, is not taken
     *  for a leftover. */
    uint32_t leftover_min_age_ms;
    /** The job secret: when set, only checkpoints whose manifest MAC is
     *  valid under it count as valid (a forged one is not counted toward
     *  keep_last, is never the newest kept, and is removed like a crash's
     *  leftover when older than the newest genuine one); NULL: every
     *  complete checkpoint counts. */
    const uint8_t *secret;
    size_t secret_len;
} graft_persist_retention_t;

/** Writer configuration. Zeroed fields take their defaults. */
typedef struct graft_persist_config {
    const char *root;          /**< local root directory (created if absent); required */
    const char *second_root;   /**< optional second tier, copied and verified in the background */
    int compression_level;     /**< 0 = stored (no compression); 1..19 zstd levels; -50..-1 zstd fast
                                    levels (faster, less compression): every chunk is compressed at
                                    that level (the background thread waits for it) and stored only
                                    where zstd does not shrink it; GRAFT_PERSIST_LEVEL_AUTO
                                    (= GRAFT_PERSIST_LEVEL_DEFAULT): adaptive, see there. A zeroed
                                    field means 0 (stored), not the default */
    uint32_t threads;          /**< compression helper threads (started at the first shard
                                    written with compression, kept until destroy); 0 = 2 */
    uint64_t chunk_bytes;      /**< raw bytes per chunk; 0 = 4 MiB; 4 KiB..256 MiB */
    uint32_t max_pending;      /**< checkpoints in flight before a save blocks; 0 = 1 */
    const char *code_revision; /**< the training code's revision, recorded in the manifest */
    uint32_t group;            /**< replica group writing the shards (recorded per shard) */
    graft_persist_retention_t retention; /**< applied after every commit (both roots) */
    uint32_t file_mode;        /**< mode of the files created; 0 = GRAFT_PERSIST_FILE_MODE_DEFAULT
                                    (0600). Owner read and write required, nothing outside 0666 */
    const uint8_t *secret;     /**< job secret: every manifest carries its MAC under it
                                    (docs/FORMAT.md); NULL = no MAC. Copied */
    size_t secret_len;         /**< 1..GRAFT_PERSIST_SECRET_MAX_BYTES when secret is set */
    /** The remote tier (an S3-compatible bucket; see "Remote tier" below);
     *  NULL = none. Copied. */
    const struct graft_persist_remote_config *remote;
} graft_persist_config_t;

/** Options of one checkpoint, given at commit. */
typedef struct graft_persist_commit_opts {
    bool has_fingerprint;      /**< the trainer supplied an output fingerprint */
    uint64_t fingerprint;      /**< e.g. a hash of the model's output on a fixed batch */
    bool before_config_change; /**< keep this checkpoint through retention */
    uint32_t file_mode;        /**< graft_persist_commit(): as graft_persist_config_t::file_mode
                                    (a writer uses its own) */
    const uint8_t *secret;     /**< graft_persist_commit(): MAC the manifest under this key
                                    (a writer uses its own); NULL = no MAC */
    size_t secret_len;
} graft_persist_commit_opts_t;

/** Outcome of one checkpoint's background work (graft_persist_wait()). */
typedef struct graft_persist_write_result {
    graft_status_t status;             /**< durable at the local root (manifest written)? */
    graft_status_t second_tier_status; /**< copied and verified at second_root (GRAFT_OK if none) */
    uint64_t raw_bytes;                /**< bytes of state */
    uint64_t stored_bytes;             /**< bytes of chunks on disk */
    uint64_t snapshot_ns;              /**< time the trainer was blocked */
    uint64_t write_ns;                 /**< snapshot end to manifest durable */
} graft_persist_write_result_t;

/** Opaque writer handle. */
typedef struct graft_persist_writer graft_persist_writer_t;

/**
 * @brief Create a writer and its background thread.
 * @param [in]  config    configuration; strings are copied.
 * @param [out] writer_p  the writer.
 * @return GRAFT_OK, GRAFT_EINVAL (bad config), GRAFT_ESYS (root not
 *         creatable), GRAFT_ENOMEM.
 *
 * Files are written relative to the root's directory and never through a
 * symbolic link below it (docs/SECURITY.md, "Checkpoint files"): the root
 * itself may be a link, a step directory that is one is refused, and a
 * link planted at a temporary or final file name is replaced, its target
 * untouched.
 */
GRAFT_WUR graft_status_t graft_persist_writer_create(const graft_persist_config_t *config,
                                                     graft_persist_writer_t **writer_p);

/**
 * @brief Wait for all background work, then free the writer. Uploads to
 *        the remote tier still running or waiting get up to 30 s, then are
 *        canceled (logged).
 * @param [in] writer  may be NULL.
 */
void graft_persist_writer_destroy(graft_persist_writer_t *writer);

/**
 * @brief Checkpoint every rank of a single process (tests, one-process
 *        trainers). Blocks for the snapshot only; shards and manifest are
 *        written in the background. Free space is checked first.
 * @param [in] writer         the writer.
 * @param [in] step           the step; a step already committed is refused.
 * @param [in] ranks          number of ranks, 1..65535.
 * @param [in] regions        per rank r, an array regions[r] of nregions[r] regions.
 * @param [in] nregions       per rank, the number of regions.
 * @param [in] opts           commit options, or NULL.
 * @return GRAFT_OK (queued), GRAFT_EINVAL, GRAFT_EEXIST, GRAFT_ENOSPC (not
 *         enough free space; nothing written), GRAFT_ENOTSUP (device region
 *         without a GPU), GRAFT_ENOMEM.
 */
GRAFT_WUR graft_status_t graft_persist_save(graft_persist_writer_t *writer, uint64_t step,
                                            uint32_t ranks,
                                            const graft_persist_region_t *const *regions,
                                            const size_t *nregions,
                                            const graft_persist_commit_opts_t *opts);

/**
 * @brief Wait for the background work of a graft_persist_save().
 * @param [in]  writer    the writer.
 * @param [in]  step      the step saved.
 * @param [out] result_p  what happened; may be NULL.
 * @return the checkpoint's status (result_p->status); GRAFT_ENOTFOUND when
 *         no save of @p step is known (or it was already waited for).
 */
GRAFT_WUR graft_status_t graft_persist_wait(graft_persist_writer_t *writer, uint64_t step,
                                            graft_persist_write_result_t *result_p);

/**
 * @brief Distributed mode, per rank: snapshot this rank's regions and write
 *        its shard in the background.
 * @param [in] writer    the writer.
 * @param [in] step      the step.
 * @param [in] rank      this rank, 0..ranks-1.
 * @param [in] ranks     number of ranks.
 * @param [in] regions   this rank's regions.
 * @param [in] nregions  their number.
 * @return as graft_persist_save().
 */
GRAFT_WUR graft_status_t graft_persist_shard_write(graft_persist_writer_t *writer, uint64_t step,
                                                   uint32_t rank, uint32_t ranks,
                                                   const graft_persist_region_t *regions,
                                                   size_t nregions);

/**
 * @brief Distributed mode, per rank: wait until the shard is durable and get
 *        its record (a serialized ShardInfo, a few hundred bytes) to hand to
 *        the committing rank.
 * @param [in]  writer  the writer.
 * @param [in]  step    the step.
 * @param [in]  rank    the rank.
 * @param [out] info_p  the record; free with graft_free().
 * @param [out] len_p   its length.
 * @return the shard's status; GRAFT_ENOTFOUND if no such shard is pending.
 */
GRAFT_WUR graft_status_t graft_persist_shard_wait(graft_persist_writer_t *writer, uint64_t step,
                                                  uint32_t rank, uint8_t **info_p, size_t *len_p);

/**
 * @brief Distributed mode, on one rank once every shard is durable: check
 *        the shard records against the files (size, footer hash) and write
 *        the manifest (JSON sidecar, then manifest.pb: the commit point).
 * @param [in] root    the local root.
 * @param [in] step    the step.
 * @param [in] ranks   number of ranks; infos holds one record per rank.
 * @param [in] infos   records from graft_persist_shard_wait(), any order.
 * @param [in] lens    their lengths.
 * @param [in] code_revision  recorded in the manifest; may be NULL.
 * @param [in] opts    commit options, or NULL.
 * @return GRAFT_OK, GRAFT_EINVAL, GRAFT_EPROTO (bad record), GRAFT_ELAYOUT
 *         (ranks disagree on the global layout), GRAFT_ECORRUPT (a shard file
 *         does not match its record), GRAFT_EEXIST, GRAFT_EIO, GRAFT_ENOSPC.
 */
GRAFT_WUR graft_status_t graft_persist_commit(const char *root, uint64_t step, uint32_t ranks,
                                              const uint8_t *const *infos, const size_t *lens,
                                              const char *code_revision,
                                              const graft_persist_commit_opts_t *opts);

/* ------------------------------------------------------------------------ */
/* Reader                                                                   */
/* ------------------------------------------------------------------------ */

/** State of a checkpoint directory. */
typedef enum graft_persist_state {
    GRAFT_PERSIST_COMPLETE = 0,   /**< manifest and every shard check out */
    GRAFT_PERSIST_INCOMPLETE = 1, /**< no manifest: never committed (or being written) */
    GRAFT_PERSIST_CORRUPT = 2     /**< manifest present, but something fails verification */
} graft_persist_state_t;

/** One checkpoint as listed. */
typedef struct graft_persist_entry {
    uint64_t step;
    graft_persist_state_t state;
    graft_status_t status; /**< why it is not complete (GRAFT_OK when complete) */
    char reason[256];      /**< names the file and chunk at fault */
    uint32_t ranks;
    uint64_t raw_bytes;
    uint64_t unix_ms;
    bool before_config_change;
} graft_persist_entry_t;

/** Verification depth. */
typedef enum graft_persist_verify_level {
    GRAFT_PERSIST_VERIFY_QUICK = 0, /**< manifest, shard headers, indexes and footers */
    GRAFT_PERSIST_VERIFY_FULL = 1   /**< also every chunk: stored and raw hashes */
} graft_persist_verify_level_t;

/**
 * @brief List the checkpoints under @p root, newest first, each quickly
 *        verified.
 * @param [in]  root       the root.
 * @param [out] entries_p  the array; free with graft_free(). NULL if empty.
 * @param [out] n_p        its length.
 * @return GRAFT_OK (also for an empty or absent root), GRAFT_ESYS, GRAFT_ENOMEM.
 */
GRAFT_WUR graft_status_t graft_persist_list(const char *root, graft_persist_entry_t **entries_p,
                                            size_t *n_p);

/**
 * @brief Verify one checkpoint.
 * @param [in]  root     the root.
 * @param [in]  step     the step.
 * @param [in]  level    quick or full.
 * @param [out] entry_p  state and reason; may be NULL.
 * @return GRAFT_OK if it verifies; else GRAFT_ENOTFOUND (no manifest),
 *         GRAFT_ECORRUPT, GRAFT_EHASH, GRAFT_ETRUNCATED, GRAFT_EFORMAT, ...
 */
GRAFT_WUR graft_status_t graft_persist_verify(const char *root, uint64_t step,
                                              graft_persist_verify_level_t level,
                                              graft_persist_entry_t *entry_p);

/**
 * @brief graft_persist_verify(), and the manifest's MAC under the job
 *        secret: tells a forged checkpoint (a manifest rewritten by someone
 *        without the secret, however consistent its checksums) from a
 *        genuine one.
 * @param [in]  root        the root.
 * @param [in]  step        the step.
 * @param [in]  level       quick or full.
 * @param [in]  secret      the key; NULL = as graft_persist_verify().
 * @param [in]  secret_len  its length, 1..GRAFT_PERSIST_SECRET_MAX_BYTES.
 * @param [out] entry_p     state and reason; may be NULL. A forged
 *                          checkpoint is GRAFT_PERSIST_CORRUPT, its reason
 *                          says "no MAC" or "MAC does not match".
 * @return as graft_persist_verify(); GRAFT_ECORRUPT for a MAC absent or wrong.
 */
GRAFT_WUR graft_status_t graft_persist_verify_mac(const char *root, uint64_t step,
                                                  graft_persist_verify_level_t level,
                                                  const uint8_t *secret, size_t secret_len,
                                                  graft_persist_entry_t *entry_p);

/**
 * @brief The manifest of one checkpoint, decoded from manifest.pb and
 *        rendered as JSON exactly as the writer renders its manifest.json
 *        sidecar, so a tool can show it and compare the sidecar with it.
 * @param [in]  root    the root.
 * @param [in]  step    the step.
 * @param [out] json_p  NUL-terminated text; free with graft_free().
 * @return GRAFT_OK; GRAFT_ENOTFOUND (no manifest); GRAFT_ECORRUPT,
 *         GRAFT_ETRUNCATED, GRAFT_EFORMAT, GRAFT_EIO (manifest.pb unreadable);
 *         GRAFT_EINVAL; GRAFT_ENOMEM.
 */
GRAFT_WUR graft_status_t graft_persist_manifest_json(const char *root, uint64_t step,
                                                     char **json_p);

/** Output fingerprint of the restored state, computed by the trainer. */
typedef graft_status_t (*graft_persist_fingerprint_fn)(void *arg, uint64_t *fingerprint_p);

/** Progress: @p done of @p total bytes restored so far. */
typedef void (*graft_persist_progress_fn)(void *arg, uint64_t done, uint64_t total);

/** What to restore, and where. */
typedef struct graft_persist_restore_params {
    uint32_t rank;                          /**< the restoring rank */
    uint32_t ranks;                         /**< ranks now (may differ from the checkpoint's) */
    const graft_persist_region_t *regions;  /**< this rank's regions in the new layout */
    size_t nregions;
    uint64_t step;            /**< 0 = newest that verifies; else exactly this step */
    uint32_t kind_mask;       /**< GRAFT_PERSIST_KIND_BIT()s to restore; 0 = all */
    const char *const *names; /**< restore only these regions; NULL = all */
    size_t nnames;
    bool verify_full;         /**< full-verify the whole checkpoint before using it */
    graft_persist_fingerprint_fn fingerprint_fn; /**< re-check the manifest's fingerprint */
    void *fingerprint_arg;
    graft_persist_progress_fn progress_fn;
    void *progress_arg;
    /** The job secret: when set, a checkpoint whose manifest has no MAC or
     *  a MAC that does not verify under it is skipped like a corrupt one
     *  (GRAFT_ECORRUPT, the reason saying which). NULL: MACs unchecked. */
    const uint8_t *secret;
    size_t secret_len;
} graft_persist_restore_params_t;

/** What a restore did. */
typedef struct graft_persist_restore_result {
    uint64_t step;            /**< the step restored */
    uint64_t bytes;           /**< bytes written into the regions */
    uint32_t skipped;         /**< newer checkpoints skipped because they failed */
    char skipped_reasons[1024]; /**< one line per skipped checkpoint */
    bool has_fingerprint;     /**< the manifest's fingerprint, for a caller-side check */
    uint64_t fingerprint;
} graft_persist_restore_result_t;

/**
 * @brief Restore this rank's regions from the newest checkpoint that
 *        verifies (or from params->step), resharding by byte-range
 *        intersection when the layout differs. A checkpoint that fails is
 *        reported in the result and the next older one is tried; the regions
 *        then hold the older checkpoint's bytes in full.
 *
 *        Ranks choose independently: with quick verification a damaged
 *        chunk is only found by the ranks that read it, so in a multi-rank
 *        restore either set params->verify_full (every rank judges the whole
 *        checkpoint and all pick the same one) or agree on result_p->step
 *        across ranks and restore again with params->step set.
 * @param [in]  root      the root.
 * @param [in]  params    what and where.
 * @param [out] result_p  what happened; may be NULL.
 * @return GRAFT_OK; GRAFT_ENOCHECKPOINT (none verifies); GRAFT_EINVAL;
 *         GRAFT_ELAYOUT (a region is absent from the checkpoint or differs in
 *         kind, dtype or global size); GRAFT_ENOTSUP (device region without a
 *         GPU); with params->step set, that checkpoint's own error.
 */
GRAFT_WUR graft_status_t graft_persist_restore(const char *root,
                                               const graft_persist_restore_params_t *params,
                                               graft_persist_restore_result_t *result_p);

/* ------------------------------------------------------------------------ */
/* Retention                                                                */
/* ------------------------------------------------------------------------ */

/**
 * @brief Decide which valid checkpoints to keep. Kept: the newest
 *        policy->keep_last; multiples of milestone_every; those marked
 *        before a configuration change; with geometric thinning, of the
 *        rest the newest checkpoint in each distance band [2^k, 2^(k+1))
 *        steps behind the newest step. The newest is always kept.
 * @param [in]  policy    the policy; keep_last 0 keeps everything.
 * @param [in]  steps     valid checkpoints' steps, any order, distinct.
 * @param [in]  marked    per step, marked before a config change; may be NULL.
 * @param [in]  n         number of steps.
 * @param [out] keep      per step, whether it is kept (caller-allocated, n).
 * @return GRAFT_OK or GRAFT_EINVAL.
 */
GRAFT_WUR graft_status_t graft_persist_retention_plan(const graft_persist_retention_t *policy,
                                                      const uint64_t *steps, const bool *marked,
                                                      size_t n, bool *keep);

/**
 * @brief Apply the policy under @p root: delete the valid checkpoints the
 *        plan drops, and incomplete or corrupt ones older than the newest
 *        valid checkpoint (leftovers of crashes). The manifest is removed
 *        first so a half-deleted checkpoint never lists as complete.
 * @param [in]  root       the root.
 * @param [in]  policy     the policy.
 * @param [out] deleted_p  number of directories deleted; may be NULL.
 * @return GRAFT_OK, GRAFT_EINVAL, GRAFT_ESYS.
 */
GRAFT_WUR graft_status_t graft_persist_retention_apply(const char *root,
                                                       const graft_persist_retention_t *policy,
                                                       size_t *deleted_p);

/* ------------------------------------------------------------------------ */
/* Remote tier                                                              */
/* ------------------------------------------------------------------------ */

/**
 * An S3-compatible bucket behind the local root. Once a checkpoint is
 * durable and verified locally, a background uploader sends its shards
 * (multipart uploads of parallel parts, each with its Content-MD5 so that
 * the store verifies it), then manifest.json, checks every shard is stored
 * with its size, and sends manifest.pb LAST: a remote checkpoint is visible
 * only when complete. Requests are signed by libcurl's SigV4. The uploader
 * never blocks a save: while one checkpoint uploads, only the newest of
 * those waiting is kept, the others are superseded (logged, counted in
 * ::graft_persist_remote_stats_t). The remote layout is described in
 * docs/FORMAT.md.
 */
typedef struct graft_persist_remote_config {
    const char *url;              /**< s3://bucket[/prefix]; required */
    const char *endpoint;         /**< http(s)://host[:port] of a non-AWS store (path-style
                                       requests); NULL = AWS_ENDPOINT_URL_S3, else
                                       AWS_ENDPOINT_URL, else AWS's endpoint of the region */
    const char *region;           /**< NULL = AWS_REGION, else AWS_DEFAULT_REGION, else us-east-1 */
    const char *credentials_file; /**< used when AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY are
                                       unset; NULL = AWS_SHARED_CREDENTIALS_FILE, else
                                       ~/.aws/credentials */
    const char *profile;          /**< its profile; NULL = AWS_PROFILE, else "default" */
    uint64_t part_bytes;          /**< multipart part size, 5 MiB..5 GiB; 0 = 8 MiB. A file of
                                       at most one part is one PUT */
    uint32_t parallel;            /**< parts in flight per file; 0 = 8 */
    uint32_t max_retries;         /**< retries per request or part; 0 = 8 */
    uint32_t backoff_ms;          /**< first back-off (doubled per retry, jittered, at least
                                       Retry-After); 0 = 200 */
    uint32_t timeout_ms;          /**< per request; 0 = 60000 */
    uint32_t keep_last;           /**< remote retention: keep the newest N complete
                                       checkpoints; 0 = keep all */
    uint64_t milestone_every;     /**< remote retention also keeps the steps that are
                                       multiples of M, as the local tier's
                                       graft_persist_retention_t::milestone_every; 0 = none */
    uint32_t abandoned_after_ms;  /**< a multipart upload below the prefix that sent nothing
                                       for this long is abandoned (a writer killed mid-upload)
                                       and aborted, when the uploader starts and after each
                                       upload; 0 = 2 x timeout_ms + 60 s. Uploads this writer
                                       failed to abort are aborted at its next sweep */
} graft_persist_remote_config_t;

/** The uploader's counters (graft_persist_remote_stats()). */
typedef struct graft_persist_remote_stats {
    bool enabled;               /**< the writer has a remote tier */
    uint64_t uploaded;          /**< checkpoints made complete remotely */
    uint64_t superseded;        /**< checkpoints dropped while waiting for a newer one */
    uint64_t failed;            /**< uploads given up (the reason in last_error) */
    uint64_t retries;           /**< requests and parts resent */
    uint64_t bytes_sent;        /**< bytes accepted by the store */
    uint64_t deleted;           /**< remote checkpoints removed by retention */
    bool has_uploaded;
    uint64_t last_uploaded_step;
    uint64_t newest_local_step; /**< the newest step handed to the uploader */
    uint32_t waiting;           /**< checkpoints queued or uploading */
    graft_status_t last_status; /**< of the last upload (GRAFT_OK before any) */
    char last_error[512];       /**< names what failed (a missing credential, an object) */
    uint64_t aborted_uploads;   /**< abandoned multipart uploads aborted by the sweep */
    uint64_t leftovers_removed; /**< step-* prefixes without manifest.pb (an upload given up)
                                     older than the newest complete checkpoint, removed */
} graft_persist_remote_stats_t;

/**
 * @brief The writer's remote tier counters.
 * @param [in]  writer   the writer.
 * @param [out] stats_p  the counters (enabled false without a remote tier).
 * @return GRAFT_OK or GRAFT_EINVAL.
 */
GRAFT_WUR graft_status_t graft_persist_remote_stats(graft_persist_writer_t *writer,
                                                    graft_persist_remote_stats_t *stats_p);

/**
 * @brief Distributed mode: hand a checkpoint committed under the writer's
 *        root by graft_persist_commit() to the uploader (a writer's own
 *        saves are handed over by themselves). Returns at once; a
 *        checkpoint still waiting is superseded by this one.
 * @param [in] writer  the writer; its configuration has a remote tier.
 * @param [in] step    the step committed.
 * @return GRAFT_OK; GRAFT_ENOTSUP (no remote tier); GRAFT_EINVAL.
 */
GRAFT_WUR graft_status_t graft_persist_remote_upload(graft_persist_writer_t *writer,
                                                     uint64_t step);

/**
 * @brief Wait until the uploader has nothing waiting or running.
 * @param [in] writer      the writer.
 * @param [in] timeout_ms  how long to wait.
 * @return GRAFT_OK, GRAFT_ETIMEOUT, GRAFT_EINVAL.
 */
GRAFT_WUR graft_status_t graft_persist_remote_flush(graft_persist_writer_t *writer,
                                                    uint32_t timeout_ms);

/**
 * @brief The complete checkpoints in the bucket (those with a manifest.pb),
 *        newest first.
 * @param [in]  remote   the bucket.
 * @param [out] steps_p  their steps; free with graft_free(). NULL if none.
 * @param [out] n_p      how many.
 * @param [out] why      the reason of a failure; may be NULL.
 * @param [in]  why_len  its size.
 * @return GRAFT_OK; GRAFT_EINVAL (bad URL, missing credentials: why names
 *         them); GRAFT_EAUTH (the store refused the credentials); GRAFT_EIO.
 */
GRAFT_WUR graft_status_t graft_persist_remote_list(const graft_persist_remote_config_t *remote,
                                                   uint64_t **steps_p, size_t *n_p, char *why,
                                                   size_t why_len);

/** A step-* prefix of the bucket (graft_persist_remote_entries()). */
typedef struct graft_persist_remote_entry {
    uint64_t step;
    bool complete;    /**< it has manifest.pb: a checkpoint */
    uint32_t objects; /**< objects under the prefix */
} graft_persist_remote_entry_t;

/**
 * @brief Every step-* prefix of the bucket, complete or not, newest first.
 * @param [in]  remote     the bucket.
 * @param [out] entries_p  free with graft_free(); NULL if none.
 * @param [out] n_p        how many.
 * @param [out] why        the reason of a failure; may be NULL.
 * @param [in]  why_len    its size.
 * @return as graft_persist_remote_list().
 */
GRAFT_WUR graft_status_t graft_persist_remote_entries(const graft_persist_remote_config_t *remote,
                                                      graft_persist_remote_entry_t **entries_p,
                                                      size_t *n_p, char *why, size_t why_len);

/**
 * @brief Download one complete checkpoint into @p local_root as
 *        graft_persist_remote_restore() does (every shard, every chunk
 *        verified, the MAC under secret when given), installed as
 *        local_root/step-<20 digits>/; nothing is left there when it fails.
 * @return GRAFT_OK; GRAFT_ENOTFOUND (no manifest.pb: why says so);
 *         GRAFT_ECORRUPT, GRAFT_ETRUNCATED, GRAFT_EHASH... with why naming
 *         the object (s3://bucket/prefix/step-.../shard-...) and chunk;
 *         GRAFT_EINVAL, GRAFT_EAUTH, GRAFT_EIO as graft_persist_remote_list().
 */
GRAFT_WUR graft_status_t graft_persist_remote_fetch(const graft_persist_remote_config_t *remote,
                                                    uint64_t step, const char *local_root,
                                                    const uint8_t *secret, size_t secret_len,
                                                    char *why, size_t why_len);

/**
 * @brief Remote retention now: keep the newest keep_last complete
 *        checkpoints (0: all) and the multiples of milestone_every, delete
 *        the others whole (manifest.pb first), then the objects of every
 *        step-* prefix without manifest.pb older than the newest complete
 *        checkpoint.
 * @param [out] deleted_p    checkpoints deleted; may be NULL.
 * @param [out] leftovers_p  incomplete prefixes removed; may be NULL.
 * @return GRAFT_OK; as graft_persist_remote_list() otherwise.
 */
GRAFT_WUR graft_status_t graft_persist_remote_prune(const graft_persist_remote_config_t *remote,
                                                    uint32_t keep_last, uint64_t milestone_every,
                                                    size_t *deleted_p, size_t *leftovers_p,
                                                    char *why, size_t why_len);

/**
 * @brief Restore from the bucket: the newest complete checkpoint (or
 *        params->step), downloaded into @p local_root with ranged,
 *        parallel GETs (part_bytes each, `parallel` in flight, each range
 *        retried alone), then restored as graft_persist_restore() does,
 *        resharding included.
 *        With params->verify_full, every shard is downloaded and every
 *        chunk of each verified (and the manifest's MAC when
 *        params->secret is set), and the checkpoint is installed under
 *        local_root as step-<20 digits>/ (ranks sharing a root download it
 *        once): every rank takes the same checkpoint.
 *        Without it, a rank downloads only the shards holding its regions
 *        into a scratch directory of its own (removed after), verifies
 *        every chunk of those and the manifest's MAC, and checks that the
 *        others are stored with their size (HEAD): a corrupt byte in a
 *        shard it does not read is not seen, as in a quick local check.
 *        A checkpoint with an object missing or corrupt is removed from
 *        local_root, reported in result_p->skipped_reasons (naming the
 *        object), and the next older one is tried.
 * @param [in]  remote      the bucket.
 * @param [in]  local_root  where the checkpoint is downloaded (e.g. the
 *                          emptied local root); created if absent.
 * @param [in]  params      as graft_persist_restore().
 * @param [out] result_p    as graft_persist_restore(); may be NULL.
 * @return GRAFT_OK; GRAFT_ENOCHECKPOINT (none in the bucket verifies);
 *         GRAFT_EINVAL, GRAFT_EAUTH, GRAFT_EIO as graft_persist_remote_list();
 *         with params->step set, that checkpoint's own error.
 */
GRAFT_WUR graft_status_t graft_persist_remote_restore(const graft_persist_remote_config_t *remote,
                                                      const char *local_root,
                                                      const graft_persist_restore_params_t *params,
                                                      graft_persist_restore_result_t *result_p);

#ifdef __cplusplus
}
#endif

#endif /* GRAFT_PERSIST_H */
