/**
 * @file graft/graft.h
 * @brief The trainer's API: configuration and the step protocol.
 *
 * A trainer creates one runtime per rank from a ::graft_config_t, registers
 * the regions of its training state, and calls graft_quorum() at the start
 * of each step and graft_commit() before the optimizer step (see
 * docs/RUNTIME.md, "The step protocol").
 *
 * Sections, from simple to advanced:
 *  - Configuration (graft/graft_config.h): every setting by name, from
 *    code or from the environment (GRAFT_<NAME> in upper case), validated
 *    with an error that names the bad field.
 *  - Life cycle and regions: graft_init(), graft_region_register(),
 *    graft_destroy().
 *  - The step protocol: graft_quorum(), graft_heal_wait(), graft_commit(),
 *    and the accessors of the current step and quorum.
 *  - A blob per quorum id (a communicator's unique id):
 *    graft_quorum_blob_publish(), graft_quorum_blob_get().
 *  - Persistent tier: automatic every persist_every steps, or
 *    graft_checkpoint_now().
 *  - Observability (graft/graft_observe.h): metrics (a struct), events
 *    (a callback), the log callback, the version.
 *
 * A typical loop (see examples/train_mlp.c):
 *
 *     graft_quorum(rt, &info);      // joins, restores or heals as needed
 *     graft_heal_wait(rt);          // before reading the state
 *     compute_gradient();           // reads the regions only
 *     graft_commit(rt, &apply);     // donors' fence, drift check, the vote
 *     if (apply) optimizer_step();  // the only writer of the regions
 *
 * Start-up decision (at the first graft_quorum()): when a healthy group of
 * the job has committed steps, this group pulls from the up-to-date groups
 * (striped across all of them); when none has but persist_root holds a
 * checkpoint that verifies, the newest one is restored (resharded when the
 * number of ranks changed); otherwise the job cold-starts and, at step 0,
 * every group pulls the state of the lowest member group so all groups start
 * bit-identical.
 *
 * Thread safety: a ::graft_config_t is not locked; fill it from one thread.
 * A ::graft_runtime_t belongs to the training thread: graft_region_register,
 * graft_quorum, graft_heal_wait, graft_commit, graft_checkpoint_now and
 * graft_checkpoint_wait must be called from one thread at a time. graft_metrics_get, graft_step,
 * graft_quorum_id, graft_replica_rank, graft_replica_world and
 * graft_start_kind may be called from any thread. Event callbacks run on the
 * training thread or on the runtime's checkpoint thread, one at a time; they
 * must not call back into the runtime. The fingerprint callback runs on the
 * training thread.
 *
 * Test-only switch GRAFT_TEST_SKIP_REGION=<region name>, present only in the
 * test build of the library (-DGRAFT_TEST_FAULTS, see docs/RUNTIME.md; the
 * library that is shipped ignores the variable): when this variable
 * is set in the environment of graft_init(), every heal of that runtime (the
 * recipient side of a pull, cold-start sync included) leaves the named host
 * region's bytes as they were before the pull and still reports the heal as
 * successful. It is a deliberately broken recovery that exists only so that
 * an end-to-end check (the simulator's verdict) can be shown to fail; never
 * set it in training. A name that matches no registered region makes the
 * first graft_quorum() fail with GRAFT_EINVAL (a CUDA region:
 * GRAFT_ENOTSUP); an empty value makes graft_init() fail with GRAFT_EINVAL.
 */
#ifndef GRAFT_GRAFT_H
#define GRAFT_GRAFT_H

#include <graft/common.h>
#include <graft/graft_config.h>  /* Configuration */
#include <graft/graft_observe.h> /* Observability */

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* ------------------------------------------------------------------------ */
/* Life cycle and regions                                                   */
/* ------------------------------------------------------------------------ */

/** One rank's runtime. */
typedef struct graft_runtime graft_runtime_t;

/* graft_region_kind_t and graft_device_t are in graft/common.h. */

/**
 * A named, contiguous piece of this rank's state. Rank r of every group
 * registers the same table (names, kinds, dtypes, sizes, in the same order):
 * its layout hash is checked by donors.
 *
 * For the persistent tier, a region may be one rank's piece of a larger
 * region split across the group's ranks: global_bytes is the size across
 * ranks and global_offset where this piece starts, so a restore onto a
 * different number of ranks reshards it. global_bytes = 0 means the region
 * belongs to this rank alone (stored as "r<rank>/<name>"; restorable onto
 * the same number of ranks only).
 */
typedef struct graft_region {
    const char *name;         /**< 1..200 bytes, unique in the rank; copied */
    graft_region_kind_t kind; /**< what it holds */
    uint32_t dtype;           /**< the trainer's dtype code; part of the layout */
    graft_device_t device;    /**< host or CUDA */
    void *ptr;                /**< the memory; stays owned by the caller */
    uint64_t bytes;           /**< size of this rank's piece; > 0 */
    uint64_t global_offset;   /**< see above */
    uint64_t global_bytes;    /**< see above; 0 = private to the rank */
} graft_region_t;

/**
 * @brief Create this rank's runtime: validates the configuration, takes
 *        the job secret (see the configuration above; from etcd when
 *        neither GRAFT_JOB_SECRET nor job_secret_file gives it), opens the
 *        etcd client and the transfer endpoint. Joining the job happens at
 *        the first graft_quorum(), once the regions are known.
 * @param [in]  config  a configuration; copied, may be destroyed afterwards.
 * @param [out] rt_p    the runtime.
 * @return GRAFT_OK; GRAFT_EINVAL (the configuration does not validate, or
 *         the job secret is unusable: too short or too long, or a
 *         job_secret_file that is missing or open to group or others; the
 *         error is logged naming the field or the file, never the secret);
 *         GRAFT_ENOMEM; GRAFT_ETRANSPORT (the transfer endpoint could not
 *         listen); an etcd error, GRAFT_EMALFORMED or GRAFT_EFORMAT (the
 *         secret was to come from etcd and could not be read or created;
 *         an etcd that does not answer is asked again, with back-off, for
 *         up to quorum_timeout_ms first).
 */
GRAFT_WUR graft_status_t graft_init(const graft_config_t *config, graft_runtime_t **rt_p);

/**
 * @brief Leave the job (the member record goes with the lease), wait for
 *        background checkpoint work, free everything. Accepts NULL.
 * @param [in] rt  the runtime.
 */
void graft_destroy(graft_runtime_t *rt);

/**
 * @brief Register a region. Only before the first graft_quorum().
 *
 * graft reads and writes a CUDA region on streams of its own that do not
 * wait for the trainer's: work that writes the region (kernels, copies, on
 * any stream) must be complete, e.g. with cudaStreamSynchronize(), before
 * graft_quorum(), graft_commit() and graft_checkpoint_now(), and the
 * region must not be written between graft_quorum() and the return of
 * graft_commit() (a donor serves it until then), as for host memory.
 * @param [in] rt      the runtime.
 * @param [in] region  the region; name copied, memory referenced.
 * @return GRAFT_OK, GRAFT_EINVAL (NULL name or pointer, zero size, bad kind
 *         or device, global range inconsistent), GRAFT_EEXIST (name taken),
 *         GRAFT_ESTATE (after the first quorum), GRAFT_ENOTSUP (CUDA memory
 *         in a build without CUDA), GRAFT_ENOMEM, GRAFT_ETRANSPORT.
 */
GRAFT_WUR graft_status_t graft_region_register(graft_runtime_t *rt, const graft_region_t *region);

/* ------------------------------------------------------------------------ */
/* The step protocol                                                        */
/* ------------------------------------------------------------------------ */

/** How this process got its state. */
typedef enum graft_start_kind {
    GRAFT_START_UNDECIDED = 0, /**< before the first graft_quorum() */
    GRAFT_START_COLD = 1,      /**< fresh state, synced from the lowest group at step 0 */
    GRAFT_START_PEER = 2,      /**< pulled from healthy donor groups (also: a job that has
                                    committed steps expects its state from a group) */
    GRAFT_START_RESTORE = 3    /**< restored from a persistent checkpoint (also when the
                                    donors of its first heal were lost, see graft_quorum) */
} graft_start_kind_t;

/** What graft_quorum() tells the trainer. */
typedef struct graft_step_info {
    uint64_t step;           /**< the step this quorum computes (= committed steps) */
    uint64_t quorum_id;      /**< epoch of the member set */
    bool quorum_changed;     /**< id differs from the previous quorum: rebuild communicators */
    uint32_t replica_rank;   /**< index of this group among the members */
    uint32_t replica_world;  /**< number of member groups */
    bool healing;            /**< this group is pulling state: call graft_heal_wait() */
    bool donor;              /**< this group serves recipients this step */
    uint32_t n_recipients;   /**< recipients this group serves */
    /** The etcd round the quorum's epoch formed in: the same in every
     *  member, and new after a step that failed (which ends the epoch), so
     *  (quorum_id, round, step) names one attempt at a step in every
     *  member, e.g. for a communicator's rendezvous. */
    uint64_t round;
} graft_step_info_t;

/**
 * @brief Start of a step: announce this rank ready and wait for a quorum
 *        (retrying short rounds until quorum_timeout_ms). At the first call,
 *        joins the job and makes the start-up decision. When the group is
 *        behind, a heal starts in the background; when other groups are
 *        behind, this rank starts serving its regions, which must then not
 *        be modified until graft_commit() returns. When this rank lacks
 *        the job's state (its heal failed, or it expected donors), or is
 *        ahead of its own group's step, and no group of the quorum can
 *        serve it, it restores the newest checkpoint that verifies; if
 *        that is of the quorum's step, the rank goes on at it (serving when
 *        its group serves); if of another step, this step's commit says no
 *        and the rank rejoins at the restored step at the next quorum (a
 *        deterministic trainer recomputes the lost steps).
 * @param [in]  rt      the runtime.
 * @param [out] info_p  the quorum as this rank sees it; may be NULL.
 * @return GRAFT_OK; GRAFT_ENOQUORUM or GRAFT_ETIMEOUT (no quorum within
 *         quorum_timeout_ms); GRAFT_ESTATE (called twice without a commit);
 *         GRAFT_EINVAL (no regions registered); GRAFT_ESTATELOST (this rank
 *         has no valid state, no group of the quorum can serve it and no
 *         checkpoint verifies: also what a new process of a job that has
 *         committed steps gets instead of a cold start; the step is not
 *         open, the call may be retried once a group holding the state is
 *         back); a restore's error (GRAFT_EIO, ...); an etcd error. A new
 *         job (nothing in etcd) without a checkpoint starts cold.
 */
GRAFT_WUR graft_status_t graft_quorum(graft_runtime_t *rt, graft_step_info_t *info_p);

/**
 * @brief Wait for the background heal started by graft_quorum() (returns at
 *        once when there is none). Call it before reading the state.
 * @param [in] rt  the runtime.
 * @return GRAFT_OK (the regions hold the quorum's step, verified; except,
 *         in the test build, under the switch GRAFT_TEST_SKIP_REGION, the named
 *         region, which is left as it was); the pull's error (GRAFT_ENODONOR, GRAFT_EDRIFT, GRAFT_ETIMEOUT,
 *         GRAFT_ELAYOUT when every donor refused this rank's region table, ...):
 *         the regions' contents are undefined, graft_commit() will vote no
 *         and the group heals again at the next quorum.
 */
GRAFT_WUR graft_status_t graft_heal_wait(graft_runtime_t *rt);

/**
 * @brief End of a step, before the optimizer step: waits for the heal, holds
 *        a donor until its recipients are done (the fence), runs the drift
 *        check and the persistent snapshot when due, and takes the group's
 *        vote (AND of its ranks; no on any heal or transport error or with
 *        fewer than min_groups groups).
 * @param [in]  rt       the runtime.
 * @param [out] apply_p  true: apply the optimizer step now (the committed
 *                       step advances); false: do not, this group stays at
 *                       its step and heals at the next quorum.
 * @return GRAFT_OK (apply_p says what to do); GRAFT_EDRIFT (this group's
 *         state differs from the other groups': apply_p is false, the group
 *         heals next quorum); GRAFT_ESTATE (no quorum open); an etcd error
 *         (apply_p false).
 */
GRAFT_WUR graft_status_t graft_commit(graft_runtime_t *rt, bool *apply_p);

/**
 * @brief Make this rank's vote at the coming graft_commit() a no, for a
 *        failure the runtime cannot see (e.g. the trainer's cross-group
 *        collective failed or timed out): the group does not apply the
 *        step, stays at its step and heals at the next quorum. Call it
 *        between graft_quorum() and graft_commit(), from the training thread.
 * @param [in] rt  the runtime.
 * @return GRAFT_OK; GRAFT_EINVAL (NULL); GRAFT_ESTATE (no quorum open).
 */
GRAFT_WUR graft_status_t graft_commit_veto(graft_runtime_t *rt);

/**
 * @brief Restart this rank in place, without exiting (docs/RUNTIME.md,
 *        "In-place restart"): for a failure the rank survived but its
 *        communication did not (a collective that failed or timed out, a
 *        communicator in error, a transfer endpoint gone). The open step,
 *        if any, is abandoned (not committed: the trainer must not apply
 *        it), a heal or serve in flight is cancelled, the rank leaves the
 *        job, and its transfer endpoint and step channel are made anew.
 *        The next graft_quorum() joins as a new incarnation; the regions
 *        keep the committed step's state when they hold it and are pulled
 *        from donors when not (a cancelled heal) or when the job moved on.
 *        Call it from the training thread. The trainer rebuilds its own
 *        cross-group communicator at the next quorum id, as always.
 * @param [in] rt  the runtime.
 * @return GRAFT_OK; GRAFT_EINVAL (NULL); GRAFT_ESTATE (never joined, or a
 *         spare not promoted); GRAFT_ETRANSPORT (the new endpoint could not
 *         listen: the rank must exit); GRAFT_ENOMEM.
 */
GRAFT_WUR graft_status_t graft_restart(graft_runtime_t *rt);

/**
 * @brief Committed steps of this rank's state (advanced by a commit that
 *        returned apply = true, set by a heal or a restore).
 * @param [in] rt  the runtime.
 * @return the step.
 */
uint64_t graft_step(graft_runtime_t *rt);

/**
 * @brief Id of the latest quorum (0 before the first).
 * @param [in] rt  the runtime.
 * @return the id.
 */
uint64_t graft_quorum_id(graft_runtime_t *rt);

/**
 * @brief This process's replica group: the configured group, or for a
 *        spare (spare = 1) the group whose slot it was promoted into.
 * @param [in] rt  the runtime.
 * @return the group; UINT32_MAX for a spare not promoted yet.
 */
uint32_t graft_group(graft_runtime_t *rt);

/**
 * @brief Index of this group among the latest quorum's members.
 * @param [in] rt  the runtime.
 * @return the replica rank.
 */
uint32_t graft_replica_rank(graft_runtime_t *rt);

/**
 * @brief Number of groups in the latest quorum.
 * @param [in] rt  the runtime.
 * @return the replica world size (0 before the first quorum).
 */
uint32_t graft_replica_world(graft_runtime_t *rt);

/**
 * @brief How this process got its state.
 * @param [in] rt  the runtime.
 * @return the start kind.
 */
graft_start_kind_t graft_start_kind(graft_runtime_t *rt);

/* ------------------------------------------------------------------------ */
/* Per-quorum blob (e.g. an NCCL unique id)                                 */
/* ------------------------------------------------------------------------ */

/** Largest blob graft_quorum_blob_publish() accepts, in bytes. */
#define GRAFT_QUORUM_BLOB_MAX 65536u

/**
 * @brief Publish a small opaque blob for the latest quorum id, typically
 *        the unique id of the trainer's cross-group communicator, which
 *        must be rebuilt whenever the quorum id changes. There is one blob
 *        per quorum id for the whole job and the first publisher wins, so
 *        one agreed rank publishes (e.g. rank 0 of replica rank 0; with
 *        several ranks per group it packs one id per rank) and the others
 *        call graft_quorum_blob_get() with graft_quorum_id(). Call it after
 *        graft_quorum(), from the training thread. Blobs of ids four or more
 *        epochs older are removed as new ones are published.
 * @param [in] rt    the runtime.
 * @param [in] data  the bytes.
 * @param [in] len   1..GRAFT_QUORUM_BLOB_MAX.
 * @return GRAFT_OK; GRAFT_EEXIST (a blob for this quorum id was already
 *         published, by this or another rank: read it instead);
 *         GRAFT_EINVAL (NULL runtime or data, len 0 or too large);
 *         GRAFT_ESTATE (before the first graft_quorum()); an etcd error.
 */
GRAFT_WUR graft_status_t graft_quorum_blob_publish(graft_runtime_t *rt, const void *data,
                                                   size_t len);

/**
 * @brief Wait for the blob published for a quorum id and copy it out.
 *        A blob of another quorum id is never returned. Call it after the
 *        first graft_quorum(), from the training thread.
 * @param [in]  rt          the runtime.
 * @param [in]  quorum_id   the quorum id (e.g. graft_quorum_id(rt)); > 0.
 * @param [in]  timeout_ms  how long to wait for the publisher.
 * @param [out] buf         receives the bytes.
 * @param [in]  cap         size of @p buf (GRAFT_QUORUM_BLOB_MAX always
 *                          suffices).
 * @param [out] len_p       the blob's length.
 * @return GRAFT_OK; GRAFT_ETIMEOUT (nothing published for that id within
 *         @p timeout_ms); GRAFT_ERANGE (the blob is larger than @p cap;
 *         nothing is written); GRAFT_EINVAL (NULL runtime, buffer or
 *         len_p, quorum id 0); GRAFT_ESTATE (before the first
 *         graft_quorum()); GRAFT_ENOMEM; an etcd error.
 */
GRAFT_WUR graft_status_t graft_quorum_blob_get(graft_runtime_t *rt, uint64_t quorum_id,
                                               uint32_t timeout_ms, void *buf, size_t cap,
                                               size_t *len_p);

/* ------------------------------------------------------------------------ */
/* Persistent tier                                                          */
/* ------------------------------------------------------------------------ */

/**
 * Output fingerprint of the current state (e.g. a hash of the model's output
 * on a fixed batch), recorded in checkpoints and re-checked on restore.
 */
typedef graft_status_t (*graft_fingerprint_fn)(void *arg, uint64_t *fingerprint_p);

/**
 * @brief Set the fingerprint callback (NULL to remove). Before the first
 *        graft_quorum().
 * @param [in] rt   the runtime.
 * @param [in] fn   the callback.
 * @param [in] arg  passed to it.
 */
void graft_fingerprint_set(graft_runtime_t *rt, graft_fingerprint_fn fn, void *arg);

/**
 * @brief Write a checkpoint of the current committed step now, outside the
 *        persist_every schedule: this group writes every shard. Call it on
 *        every rank of the group, between graft_commit() and the next
 *        graft_quorum(). Blocks until the checkpoint is durable.
 * @param [in] rt  the runtime.
 * @return GRAFT_OK; GRAFT_ENOTSUP (no persist_root); GRAFT_ESTATE (inside a
 *         step, or before the first commit); GRAFT_EEXIST (this step is
 *         already checkpointed); GRAFT_ETIMEOUT (the other ranks' shards did
 *         not arrive); the writer's error (GRAFT_ENOSPC, GRAFT_EIO, ...).
 */
GRAFT_WUR graft_status_t graft_checkpoint_now(graft_runtime_t *rt);

/**
 * @brief Mark the open step as the trainer's last: the trainer opened it
 *        (graft_quorum(), graft_heal_wait()) only to end, its regions hold
 *        the final state and it will not apply it. Call it on every rank of
 *        every group, between graft_quorum() and graft_commit() of that
 *        step. At that graft_commit(), when the group commits, persist_root
 *        is set and persist_final is 1 (the default), the step's checkpoint
 *        is written even off the persist_every schedule, every shard by
 *        one group of the quorum (the one that commits a scheduled
 *        checkpoint of that step), unless one of that step is on disk
 *        already, and graft_commit() returns once this rank's part of it is
 *        durable (its rank 0: the manifest); the committed step stays the
 *        quorum's step and apply_p is false. graft_finished() then says
 *        whether the group committed it (if not, open the step again). Only
 *        inside a step are the regions known to hold one step's state (the
 *        trainer may not have applied its last commit, or may keep state it
 *        packs into a region at the start of a step), so graft_destroy()
 *        writes no checkpoint of its own.
 * @param [in] rt  the runtime.
 * @return GRAFT_OK; GRAFT_EINVAL (NULL); GRAFT_ESTATE (no quorum open).
 */
GRAFT_WUR graft_status_t graft_finish(graft_runtime_t *rt);

/**
 * @brief Whether this rank committed a closing step (one marked by
 *        graft_finish()): the trainer may end. False after a closing
 *        graft_commit() whose group did not commit (a rank voted no, the
 *        step fell back, ...): the trainer opens the step again with
 *        graft_quorum() and calls graft_finish() again. Groups that ended
 *        cleanly are not waited for by the others' rounds (docs/RUNTIME.md,
 *        "A clean end: the closing step").
 * @param [in] rt  the runtime (NULL: false).
 * @return true once a closing step committed.
 */
bool graft_finished(const graft_runtime_t *rt);

/**
 * @brief Wait until the background part of the last persistent checkpoint
 *        (its shard durable and published, the manifest committed when this
 *        rank writes it) has ended. graft_destroy() waits too; a trainer
 *        that reads its metrics before graft_destroy() calls this first so
 *        that the last checkpoint is counted.
 * @param [in] rt  the runtime.
 * @return the status of the last checkpoint's background part (GRAFT_OK
 *         when none was started); GRAFT_EINVAL (NULL).
 */
GRAFT_WUR graft_status_t graft_checkpoint_wait(graft_runtime_t *rt);

#ifdef __cplusplus
}
#endif

#endif /* GRAFT_GRAFT_H */
