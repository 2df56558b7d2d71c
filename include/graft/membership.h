/**
 * @file graft/membership.h
 * @brief Replica-group membership, quorums, commit votes, blobs and events on etcd.
 *
 * Every rank of every replica group creates one ::graft_membership_t. It
 * joins the job by writing a member record under its own etcd lease (renewed
 * by a keep-alive thread every TTL/3) and keeps a watch-driven view of every
 * other member. A group is healthy when all of its ranks are live.
 *
 * At the start of each step every rank calls graft_membership_quorum_wait().
 * It announces that the rank is ready for the next quorum round; a group is
 * ready when all of its ranks are. The round forms when every live group is
 * ready, or after the join timeout with at least `min_groups` ready groups.
 * Formation is a compare-and-swap transaction on the quorum key: exactly one
 * record per round, read by everyone, no leader process. In steady state
 * (same groups and processes, everyone one step on) the rank whose
 * announcement completes the round forms it in that same transaction,
 * guarded by compares on every other rank's ready record (docs/KEYS.md,
 * "fast path"). The quorum id is an
 * epoch that changes only when the member set (groups and the incarnations
 * of their ranks) changes, so a trainer rebuilds its cross-group
 * communicator only then.
 *
 * Before the optimizer step every rank calls graft_membership_commit_vote();
 * the decision is the AND of its group's votes, a missing vote being a no.
 *
 * Failures are never silent: a lost lease is reported through the callback
 * and through ::GRAFT_ELEASE from the next call, and the rank re-joins as a
 * new incarnation; an unreachable etcd makes calls retry with backoff and end
 * with ::GRAFT_EUNREACHABLE; records that do not decode are logged, counted
 * and skipped. The key layout is documented in docs/KEYS.md.
 *
 * Sections: life cycle; view; quorum; commit vote; blobs; events; statistics.
 *
 * Thread safety: the functions of one handle may be called from several
 * threads, but quorum_wait and commit_vote are meant for the training thread.
 */
#ifndef GRAFT_MEMBERSHIP_H
#define GRAFT_MEMBERSHIP_H

#include <graft/common.h>
#include <graft/etcd.h>

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* ------------------------------------------------------------------------ */
/* Life cycle                                                               */
/* ------------------------------------------------------------------------ */

typedef struct graft_membership graft_membership_t;

/** State a member advertises in its record. */
typedef enum graft_member_state {
    GRAFT_MEMBER_UNSPECIFIED = 0,
    GRAFT_MEMBER_JOINING = 1,
    GRAFT_MEMBER_HEALTHY = 2,
    GRAFT_MEMBER_RECOVERING = 3,
    GRAFT_MEMBER_LEAVING = 4,
    /** Live and holding its step, but its transfer endpoint cannot serve
     *  (graft_transfer_serve_failures() above 0): not a donor to count on. */
    GRAFT_MEMBER_CANNOT_SERVE = 5
} graft_member_state_t;

/** What the lease callback reports. */
typedef enum graft_membership_notice {
    GRAFT_MEMBERSHIP_LEASE_LOST, /**< the lease expired or was revoked */
    GRAFT_MEMBERSHIP_REJOINED    /**< joined again with a new lease and incarnation */
} graft_membership_notice_t;

/**
 * Lease callback, called from the keep-alive thread.
 * @param what         what happened.
 * @param incarnation  the incarnation lost (LEASE_LOST) or the new one (REJOINED).
 * @param why          GRAFT_ENOTFOUND (revoked or expired in etcd) or the
 *                     error that kept the lease from being renewed past its TTL.
 * @param arg          the config's lease_arg.
 */
typedef void (*graft_membership_lease_fn)(graft_membership_notice_t what, uint64_t incarnation,
                                          graft_status_t why, void *arg);

/** Configuration. Zero values select the defaults given. */
typedef struct graft_membership_config {
    const char *job;                  /**< required; [A-Za-z0-9_.-]+ */
    const graft_etcd_config_t *etcd;  /**< required; the handle opens its own clients */
    bool observer;                    /**< view and events only: no lease, no record */
    uint32_t group;                   /**< this rank's replica group */
    uint32_t rank;                    /**< this rank inside its group */
    uint32_t ranks_per_group;         /**< R; default 1 */
    uint32_t min_groups;              /**< default 1 */
    uint32_t lease_ttl_s;             /**< default 5; keep-alive every TTL/3 */
    uint32_t join_timeout_ms;         /**< default 3000 */
    uint32_t event_history;           /**< events kept under events/ (up to 1/8 more
                                           between trims); default 1000 */
    const char *host;                 /**< default: gethostname() */
    const char *transfer_address;     /**< published for donors; may be NULL */
    uint64_t layout_hash;
    uint64_t committed_step;          /**< initial value in the member record */
    graft_member_state_t state;       /**< initial state; default JOINING */
    graft_membership_lease_fn lease_cb; /**< may be NULL */
    void *lease_arg;
    /** A promoted spare's lease and incarnation (graft_membership_spare_adopt()):
     *  the first join writes the member record on them instead of granting
     *  a lease; 0: grant one. */
    int64_t adopt_lease;
    uint64_t adopt_incarnation;
    /** graft_membership_spare_create(): the spare's group of spares, the
     *  ranks of one world promoted together into one group
     *  ([A-Za-z0-9_.-]{1,64}); NULL or "": promoted alone. */
    const char *spare_group;
} graft_membership_config_t;

/**
 * @brief The etcd folder of a job, "/graft/<job>/": every key graft keeps for
 *        the job lies below it (docs/KEYS.md). The one place that spells
 *        the prefix; the runtime and tools ask here.
 * @param [in]  job       the job's name; graft_membership_create() accepts
 *                        [A-Za-z0-9_.-]{1,64}, this call only composes.
 * @param [out] prefix_p  the prefix; free with graft_free().
 * @return GRAFT_OK, GRAFT_EINVAL (NULL or empty), GRAFT_ENOMEM.
 */
GRAFT_WUR graft_status_t graft_membership_job_prefix(const char *job, char **prefix_p);

/**
 * @brief Create a handle: joins the job (unless observer) and starts the
 *        keep-alive and view threads. Returns once the view holds a first
 *        consistent snapshot that includes this rank's own record.
 * @param [in]  config  configuration; copied.
 * @param [out] m_p     the handle.
 * @return GRAFT_OK, GRAFT_EINVAL, GRAFT_ENOMEM, GRAFT_ESYS, or an etcd
 *         error. A record left by an earlier process of the same group and
 *         rank is replaced (a replacement must not wait for the old lease).
 */
GRAFT_WUR graft_status_t graft_membership_create(const graft_membership_config_t *config,
                                                 graft_membership_t **m_p);

/**
 * @brief Leave the job: revokes the lease, which removes every record
 *        attached to it. Later calls return GRAFT_ESTATE.
 * @param [in] m  the handle.
 * @return GRAFT_OK, GRAFT_ESTATE (already left, or an observer), or an etcd error.
 */
GRAFT_WUR graft_status_t graft_membership_leave(graft_membership_t *m);

/**
 * @brief Stop the threads, leave if still joined, free. Accepts NULL.
 * @param [in] m  the handle.
 */
void graft_membership_destroy(graft_membership_t *m);

/**
 * @brief Current incarnation (changes at every re-join).
 * @param [in] m  the handle.
 * @return the incarnation; 0 for observers.
 */
uint64_t graft_membership_incarnation(graft_membership_t *m);

/**
 * @brief Rewrite this rank's member record with a new state and step.
 * @param [in] m               the handle.
 * @param [in] state           new state.
 * @param [in] committed_step  new committed step.
 * @return GRAFT_OK, GRAFT_ESTATE, GRAFT_ELEASE, or an etcd error.
 */
GRAFT_WUR graft_status_t graft_membership_update(graft_membership_t *m, graft_member_state_t state,
                                                 uint64_t committed_step);

/* ------------------------------------------------------------------------ */
/* View                                                                     */
/* ------------------------------------------------------------------------ */

/** One live member as the view sees it. */
typedef struct graft_member {
    uint32_t group;
    uint32_t rank;
    uint64_t incarnation;
    char *host;
    int32_t pid;
    char *transfer_address;
    uint64_t layout_hash;
    uint64_t committed_step;
    graft_member_state_t state;
    int64_t lease_id;
    uint64_t joined_unix_ms;
    char *spare_group; /**< a registered spare's group of spares ("": none) */
} graft_member_t;

/** A snapshot of the view. */
typedef struct graft_membership_view {
    uint64_t version;          /**< increases at every change of the view */
    int64_t revision;          /**< etcd revision the view reflects */
    graft_member_t *members;   /**< sorted by (group, rank) */
    size_t n_members;
    uint32_t *healthy_groups;  /**< groups with all ranks live, ascending */
    size_t n_healthy_groups;
    uint64_t malformed;        /**< records skipped because they did not decode */
    uint64_t resyncs;          /**< full re-reads after compaction */
    /** The quorum key holds a record that does not decode: its
     *  mod_revision (0: none) and why (GRAFT_EMALFORMED, GRAFT_EFORMAT).
     *  The view treats it as absent; a member or the next formation
     *  replaces it by compare-and-swap. */
    int64_t quorum_bad_mod;
    graft_status_t quorum_bad_reason;
} graft_membership_view_t;

/**
 * @brief Take a snapshot of the view.
 * @param [in]  m       the handle.
 * @param [out] view_p  the snapshot; free with graft_membership_view_free().
 * @return GRAFT_OK or GRAFT_ENOMEM.
 */
GRAFT_WUR graft_status_t graft_membership_view_get(graft_membership_t *m,
                                                   graft_membership_view_t **view_p);

/**
 * @brief Free a snapshot. Accepts NULL.
 * @param [in] view  the snapshot.
 */
void graft_membership_view_free(graft_membership_view_t *view);

/**
 * @brief Wait until the view's version exceeds @p after_version.
 * @param [in]  m              the handle.
 * @param [in]  after_version  a version seen before (0: any).
 * @param [in]  timeout_ms     how long to wait.
 * @param [out] version_p      the current version; may be NULL.
 * @return GRAFT_OK (changed) or GRAFT_ETIMEOUT.
 */
GRAFT_WUR graft_status_t graft_membership_view_wait(graft_membership_t *m, uint64_t after_version,
                                                    uint32_t timeout_ms, uint64_t *version_p);

/**
 * @brief Is a group healthy (all its ranks live) in the current view?
 * @param [in] m      the handle.
 * @param [in] group  the group.
 * @return true when healthy.
 */
bool graft_membership_group_healthy(graft_membership_t *m, uint32_t group);

/**
 * @brief Change the number of ready groups the rounds this rank forms need
 *        from now on (the runtime lowers it by the groups that ended the job
 *        cleanly, docs/RUNTIME.md, "A clean end").
 * @param [in] m           the handle.
 * @param [in] min_groups  the new minimum (0 is taken as 1).
 */
void graft_membership_min_groups_set(graft_membership_t *m, uint32_t min_groups);

/* ------------------------------------------------------------------------ */
/* Spares (docs/RUNTIME.md, "Spares")                                       */
/* ------------------------------------------------------------------------ */

/** A process waiting, with a lease, to take a dead rank's slot. */
typedef struct graft_membership_spare graft_membership_spare_t;

/**
 * @brief Register as a spare of rank config->rank: a lease of its own and
 *        the record spares/<rank>/<incarnation> (a MemberRecord whose group
 *        is UINT32_MAX). config->group is not used.
 * @param [in]  config  as for graft_membership_create(); not an observer.
 * @param [in]  groups  the job's number of groups: the slots it may fill.
 * @param [out] sp_p    the spare.
 * @return GRAFT_OK, GRAFT_EINVAL, GRAFT_ENOMEM, or an etcd error.
 */
GRAFT_WUR graft_status_t graft_membership_spare_create(const graft_membership_config_t *config,
                                                       uint32_t groups,
                                                       graft_membership_spare_t **sp_p);

/**
 * @brief Wait until the spare promoted itself into a vacant slot (g, rank):
 *        a group below @p groups that has a group_progress record, no
 *        finished record and no member record for this rank. Promotion is
 *        one compare-and-swap that also deletes the spare record, so a slot
 *        gets one spare and a spare one slot. Renews the lease meanwhile
 *        (registering again if etcd lost it).
 * @param [in]  sp          the spare.
 * @param [in]  timeout_ms  0: no limit.
 * @param [out] group_p     the slot's group.
 * @return GRAFT_OK (promoted; the member record is on the spare's lease),
 *         GRAFT_ECANCELED (every group finished: the job needs no spare),
 *         GRAFT_ETIMEOUT, GRAFT_EINVAL, GRAFT_ENOMEM.
 */
GRAFT_WUR graft_status_t graft_membership_spare_wait(graft_membership_spare_t *sp,
                                                     uint32_t timeout_ms, uint32_t *group_p);

/**
 * @brief After a promotion: set config's group, rank, adopt_lease and
 *        adopt_incarnation, so that graft_membership_create() joins on the
 *        slot the spare holds. Does nothing before a promotion.
 */
void graft_membership_spare_adopt(const graft_membership_spare_t *sp,
                                  graft_membership_config_t *config);

/**
 * @brief The spare's view of the job's members (as graft_membership_view_get()
 *        gives a handle's): a follower picks its donor there. Any thread.
 * @param [in]  sp      the spare.
 * @param [out] view_p  free with graft_membership_view_free().
 * @return GRAFT_OK, GRAFT_EINVAL, GRAFT_ENOMEM.
 */
GRAFT_WUR graft_status_t graft_membership_spare_view_get(graft_membership_spare_t *sp,
                                                         graft_membership_view_t **view_p);

/**
 * @brief Free the spare. Before a promotion its lease is revoked (the spare
 *        record goes); after one the lease belongs to the member record.
 *        Accepts NULL.
 */
void graft_membership_spare_destroy(graft_membership_spare_t *sp);

/**
 * @brief The job's registered spares (records under spares/ that decode),
 *        read from etcd now.
 * @param [in]  m          any handle of the job (an observer will do).
 * @param [out] spares_p   the spares (group = UINT32_MAX); free with
 *                         graft_membership_spares_free().
 * @param [out] n_p        how many.
 * @return GRAFT_OK, GRAFT_EINVAL, GRAFT_ENOMEM, or an etcd error.
 */
GRAFT_WUR graft_status_t graft_membership_spares_list(graft_membership_t *m,
                                                      graft_member_t **spares_p, size_t *n_p);

/** Free what graft_membership_spares_list() gave; accepts NULL. */
void graft_membership_spares_free(graft_member_t *spares, size_t n);

/**
 * @brief Evict a rank whose process is known to be dead: revoke the lease
 *        of the member record members/<group>/<rank> when that record is
 *        the one process @p pid on @p host wrote. For whoever saw the
 *        process end (the agent or orchestrator that started it, after
 *        waitpid()): the slot is free at once, so a spare takes it without
 *        waiting for the lease to lapse (docs/RUNTIME.md, "Spares").
 * @param [in] m      any handle of the job (an observer will do).
 * @param [in] group  the slot.
 * @param [in] rank
 * @param [in] host   the host the record names (the dead process's).
 * @param [in] pid    the dead process's pid.
 * @return GRAFT_OK (revoked: the record, and the rank's other records on
 *         that lease, are gone); GRAFT_ENOTFOUND (no record: it lapsed
 *         already); GRAFT_ESTATE (the record is another process's: a
 *         replacement holds the slot, nothing done); GRAFT_EINVAL; an etcd
 *         error or GRAFT_EMALFORMED.
 */
GRAFT_WUR graft_status_t graft_membership_evict(graft_membership_t *m, uint32_t group,
                                                uint32_t rank, const char *host, int32_t pid);

/* ------------------------------------------------------------------------ */
/* Quorum                                                                   */
/* ------------------------------------------------------------------------ */

/** Donor assignment for one group that must recover. */
typedef struct graft_recovery {
    uint32_t recipient;
    uint32_t *donors; /**< every up-to-date group, primary first */
    size_t n_donors;
} graft_recovery_t;

/** A formed quorum as seen by one rank. */
typedef struct graft_quorum {
    uint64_t id;                 /**< epoch: changes when the member set changes */
    uint64_t round;              /**< one quorum record per round */
    uint64_t step;               /**< the step this quorum computes (= max_committed_step) */
    uint64_t max_committed_step;
    uint32_t *members;           /**< member groups, ascending */
    size_t n_members;
    graft_recovery_t *recoveries; /**< groups behind max_committed_step */
    size_t n_recoveries;
    uint32_t min_groups;
    uint64_t formed_unix_ms;
    uint64_t duration_us;        /**< first ready -> formation, as the former measured;
                                      0 for a round formed on the fast path */
    uint64_t members_hash;
    /* Filled for the calling rank by graft_membership_quorum_wait(): */
    uint32_t replica_rank;       /**< index of this group in members */
    uint32_t replica_world;      /**< n_members */
    bool must_recover;           /**< this group is a recipient */
    bool id_changed;             /**< id differs from this rank's previous quorum */
} graft_quorum_t;

/**
 * @brief Announce this rank ready for the next round and wait for a quorum
 *        that includes its group. A round formed without the group (it was
 *        late) makes it announce again for the next round.
 * @param [in]  m               the handle.
 * @param [in]  committed_step  this rank's committed step.
 * @param [in]  timeout_ms      overall limit.
 * @param [out] quorum_p        the quorum; free with graft_membership_quorum_free().
 * @return GRAFT_OK; GRAFT_ENOQUORUM (join timeout passed with fewer than
 *         min_groups ready groups); GRAFT_ELEASE (the lease was lost since the
 *         last call: state was reset, call again); GRAFT_ETIMEOUT;
 *         GRAFT_EUNREACHABLE (etcd could not be reached before the timeout);
 *         GRAFT_ESTATE; GRAFT_ENOMEM.
 */
GRAFT_WUR graft_status_t graft_membership_quorum_wait(graft_membership_t *m,
                                                      uint64_t committed_step,
                                                      uint32_t timeout_ms,
                                                      graft_quorum_t **quorum_p);

/**
 * @brief The latest quorum record in the view, whoever it includes.
 * @param [in]  m         the handle.
 * @param [out] quorum_p  the quorum (replica fields unset).
 * @return GRAFT_OK, GRAFT_ENOTFOUND (none formed yet), GRAFT_ENOMEM.
 */
GRAFT_WUR graft_status_t graft_membership_quorum_latest(graft_membership_t *m,
                                                        graft_quorum_t **quorum_p);

/**
 * @brief Free a quorum. Accepts NULL.
 * @param [in] q  the quorum.
 */
void graft_membership_quorum_free(graft_quorum_t *q);

/* ------------------------------------------------------------------------ */
/* Commit vote                                                              */
/* ------------------------------------------------------------------------ */

/**
 * @brief Vote on committing the quorum's step and wait for the group's
 *        decision: the AND of all R ranks' votes; a vote missing when the
 *        timeout passes counts as no.
 * @param [in]  m           the handle.
 * @param [in]  q           the quorum of this step.
 * @param [in]  ok          this rank's vote.
 * @param [in]  reason      why not (for the event log); may be NULL.
 * @param [in]  timeout_ms  how long to wait for the other ranks.
 * @param [out] decision_p  true: apply the step.
 * @return GRAFT_OK (decision_p set, possibly false); GRAFT_EUNREACHABLE (the
 *         vote could not be written: decision_p is false, the group cannot
 *         commit); GRAFT_ELEASE; GRAFT_ESTATE; GRAFT_EINVAL.
 */
GRAFT_WUR graft_status_t graft_membership_commit_vote(graft_membership_t *m, const graft_quorum_t *q,
                                                      bool ok, const char *reason,
                                                      uint32_t timeout_ms, bool *decision_p);

/**
 * @brief Has rank @p rank of @p group a vote of round @p round or a later
 *        one in etcd (its own, or a no recorded for it at a timeout)? One
 *        read of the group's votes, straight from etcd. A donor uses it to
 *        learn that a recipient is past its heal: a rank votes only after
 *        its pull has ended.
 * @param [in]  m        the handle.
 * @param [in]  group    the group.
 * @param [in]  rank     the rank.
 * @param [in]  round    the round.
 * @param [out] voted_p  the answer.
 * @return GRAFT_OK, GRAFT_EINVAL, GRAFT_ENOMEM, or an etcd error.
 */
GRAFT_WUR graft_status_t graft_membership_voted_since(graft_membership_t *m, uint32_t group,
                                                      uint32_t rank, uint64_t round,
                                                      bool *voted_p);

/* ------------------------------------------------------------------------ */
/* Delegated records                                                        */
/* ------------------------------------------------------------------------ */

/**
 * What a rank hands its group's leader (rank 0) so that the leader writes
 * the rank's ready record or commit vote together with its own, in one etcd
 * transaction: a round then costs O(G) etcd requests, not O(G·R)
 * (docs/RUNTIME.md, "Delegated records"). The leader writes the record the
 * rank would have written, under the rank's key and on the rank's lease;
 * records, keys and decision rules are unchanged. How a delegate reaches
 * the leader is the caller's business (the runtime sends it over the
 * transfer endpoints, authenticated with the job secret).
 */
typedef struct graft_membership_delegate {
    uint32_t rank;
    uint64_t incarnation;
    int64_t lease;       /**< the rank's lease: its record goes with it */
    uint64_t round;      /**< ready: the round it would announce for; vote: the quorum's */
    uint64_t step;       /**< ready: its committed step; vote: the quorum's step */
    uint64_t quorum_id;  /**< vote: the quorum voted on */
    uint64_t prev_round; /**< the round of its previous record of the kind, deleted; 0: none */
    bool ok;             /**< vote */
    char reason[96];     /**< vote: why not */
} graft_membership_delegate_t;

/** At most this many delegates in one transaction (etcd's default
 *  --max-txn-ops is 128; each delegate takes a put and a delete). */
#define GRAFT_MEMBERSHIP_MAX_DELEGATES 48u

/**
 * @brief This rank's ready record, for its leader to write.
 * @param [in]  m               the handle.
 * @param [in]  committed_step  this rank's committed step.
 * @param [out] d_p             the delegate.
 * @return GRAFT_OK; GRAFT_ELEASE or GRAFT_ESTATE as graft_membership_quorum_wait().
 */
GRAFT_WUR graft_status_t graft_membership_ready_delegate(graft_membership_t *m,
                                                         uint64_t committed_step,
                                                         graft_membership_delegate_t *d_p);

/**
 * @brief This rank's commit vote, for its leader to write.
 * @return GRAFT_OK; GRAFT_ESTATE when this rank must write its vote itself
 *         (it still holds "no" records it wrote for others, which its own
 *         vote transaction deletes, or it voted in a later round);
 *         GRAFT_ELEASE; GRAFT_EINVAL.
 */
GRAFT_WUR graft_status_t graft_membership_vote_delegate(graft_membership_t *m,
                                                        const graft_quorum_t *q, bool ok,
                                                        const char *reason,
                                                        graft_membership_delegate_t *d_p);

/** Options of graft_membership_quorum_wait_opts(). */
typedef struct graft_membership_round_opts {
    /** A leader: its ranks' ready records, written with its own. */
    const graft_membership_delegate_t *delegates;
    size_t n_delegates;
    /** A leader: called once, after its announcement and before it waits,
     *  with the round announced (0: the announcement failed) and whether
     *  the delegates' records were written (not when a delegate's lease is
     *  gone: those ranks must then announce themselves). */
    void (*announced)(void *arg, uint64_t round, bool delegates_written);
    void *arg;
    /** Not a leader: its leader wrote this rank's ready record for this
     *  round, so it only waits; 0: it announces itself. */
    uint64_t announced_round;
} graft_membership_round_opts_t;

/**
 * @brief graft_membership_quorum_wait() with delegated ready records.
 *        Announcements after a round that formed without the group are
 *        each rank's own. NULL opts: as graft_membership_quorum_wait().
 * @return as graft_membership_quorum_wait(); GRAFT_EINVAL for delegates that
 *         are not other ranks of this group, repeated, or too many.
 */
GRAFT_WUR graft_status_t graft_membership_quorum_wait_opts(
    graft_membership_t *m, uint64_t committed_step, uint32_t timeout_ms,
    const graft_membership_round_opts_t *opts, graft_quorum_t **quorum_p);

/** Options of graft_membership_commit_vote_opts(). */
typedef struct graft_membership_vote_opts {
    /** A leader: its ranks' votes, written with its own (each a
     *  create-if-absent, so a rank that timed out and voted itself makes
     *  the batch fail, and the leader then votes alone). */
    const graft_membership_delegate_t *delegates;
    size_t n_delegates;
    /** Not a leader: its vote was handed to the leader; wait this long for
     *  it to show in etcd before writing it itself. 0: write it itself. */
    uint32_t delegated_wait_ms;
} graft_membership_vote_opts_t;

/**
 * @brief graft_membership_commit_vote() with delegated votes. Every rank
 *        still decides from the votes etcd holds.
 * @return as graft_membership_commit_vote(); GRAFT_EINVAL for bad delegates.
 */
GRAFT_WUR graft_status_t graft_membership_commit_vote_opts(
    graft_membership_t *m, const graft_quorum_t *q, bool ok, const char *reason,
    uint32_t timeout_ms, const graft_membership_vote_opts_t *opts, bool *decision_p);

/* ------------------------------------------------------------------------ */
/* Blobs                                                                    */
/* ------------------------------------------------------------------------ */

/**
 * @brief Publish small opaque bytes for a quorum id (e.g. an NCCL unique id).
 *        The first writer wins; later writers get GRAFT_EEXIST.
 * @param [in] m          the handle.
 * @param [in] quorum_id  the quorum id.
 * @param [in] data       the bytes.
 * @param [in] len        at most 64 KiB.
 * @return GRAFT_OK, GRAFT_EEXIST, GRAFT_EINVAL, or an etcd error.
 */
GRAFT_WUR graft_status_t graft_membership_blob_put(graft_membership_t *m, uint64_t quorum_id,
                                                   const void *data, size_t len);

/**
 * @brief Wait for the blob of a quorum id.
 * @param [in]  m           the handle.
 * @param [in]  quorum_id   the quorum id.
 * @param [in]  timeout_ms  how long to wait.
 * @param [out] data_p      the bytes; free with graft_free().
 * @param [out] len_p       their length.
 * @return GRAFT_OK, GRAFT_ETIMEOUT, GRAFT_ENOMEM.
 */
GRAFT_WUR graft_status_t graft_membership_blob_get(graft_membership_t *m, uint64_t quorum_id,
                                                   uint32_t timeout_ms, void **data_p,
                                                   size_t *len_p);

/**
 * @brief Publish small opaque bytes for one donor/recipient pair of groups
 *        in a quorum round, at this handle's rank (e.g. the NCCL unique id
 *        of a pair transfer). Keyed by the round, not the quorum id (which
 *        stays the same over rounds of the same members), so a pair of a
 *        later round never reads an earlier round's bytes. Written on the
 *        rank's lease, so the slot goes with a donor that dies; a later put
 *        replaces it.
 * @param [in] m          the handle (joined).
 * @param [in] round      the quorum's round (graft_quorum_t.round), > 0.
 * @param [in] donor      the donor group.
 * @param [in] recipient  the recipient group.
 * @param [in] data       the bytes.
 * @param [in] len        1..64 KiB.
 * @return GRAFT_OK, GRAFT_EINVAL, GRAFT_ELEASE / GRAFT_ESTATE (not joined),
 *         or an etcd error.
 */
GRAFT_WUR graft_status_t graft_membership_pair_blob_put(graft_membership_t *m, uint64_t round,
                                                        uint32_t donor, uint32_t recipient,
                                                        const void *data, size_t len);

/**
 * @brief Wait for the slot of a donor/recipient pair at this handle's rank.
 * @param [in]  m           the handle.
 * @param [in]  round       the quorum's round.
 * @param [in]  donor       the donor group.
 * @param [in]  recipient   the recipient group.
 * @param [in]  timeout_ms  how long to wait.
 * @param [out] data_p      the bytes; free with graft_free().
 * @param [out] len_p       their length.
 * @return GRAFT_OK, GRAFT_ETIMEOUT, GRAFT_ENOMEM, GRAFT_EINVAL.
 */
GRAFT_WUR graft_status_t graft_membership_pair_blob_get(graft_membership_t *m, uint64_t round,
                                                        uint32_t donor, uint32_t recipient,
                                                        uint32_t timeout_ms, void **data_p,
                                                        size_t *len_p);

/**
 * @brief Remove the slot of a donor/recipient pair at this handle's rank
 *        (the donor, once the pair transfer is over).
 * @return GRAFT_OK (also when there was none), GRAFT_EINVAL, or an etcd error.
 */
GRAFT_WUR graft_status_t graft_membership_pair_blob_delete(graft_membership_t *m,
                                                           uint64_t round, uint32_t donor,
                                                           uint32_t recipient);

/* ------------------------------------------------------------------------ */
/* Events                                                                   */
/* ------------------------------------------------------------------------ */

/** Kinds of events (values match graft.proto's EventKind). */
typedef enum graft_event_kind {
    GRAFT_EVENT_JOIN = 1,
    GRAFT_EVENT_LEAVE = 2,
    GRAFT_EVENT_LEASE_LOST = 3,
    GRAFT_EVENT_QUORUM_FORMED = 4,
    GRAFT_EVENT_RECOVERY_ASSIGNED = 5,
    GRAFT_EVENT_VOTE_RESULT = 6,
    GRAFT_EVENT_RECOVERY_DONE = 7,
    GRAFT_EVENT_CHECKPOINT = 8,
    GRAFT_EVENT_DRIFT = 9,
    GRAFT_EVENT_ERROR = 10,
    GRAFT_EVENT_SPARE_PROMOTED = 11
} graft_event_kind_t;

/** The highest event kind (for tables indexed by kind). */
#define GRAFT_EVENT_KIND_LAST GRAFT_EVENT_SPARE_PROMOTED

/** How the detail of an error event begins when it reports a quorum
 *  record that did not decode: "quorum record at <key> does not decode:
 *  <reason>; replaced at round <N>" (docs/KEYS.md). */
#define GRAFT_MEMBERSHIP_QUORUM_BAD_TEXT "quorum record"

/** One event of the job's history. */
typedef struct graft_event {
    uint64_t seq; /**< the etcd revision that created it: ascending, not dense */
    graft_event_kind_t kind;
    uint64_t unix_ms;
    uint32_t group;
    uint32_t rank;
    uint64_t incarnation;
    uint64_t quorum_id;
    uint64_t round;
    uint64_t step;
    uint32_t *members; /**< quorum members, or a recovery's donors */
    size_t n_members;
    uint64_t duration_us;
    bool ok;
    char *detail;
} graft_event_t;

/**
 * @brief Name of an event kind ("join", "quorum_formed", ...).
 * @param [in] kind  the kind.
 * @return a static string.
 */
const char *graft_event_kind_string(graft_event_kind_t kind);

/**
 * @brief Append an event to the job's history (callers outside this module:
 *        recovery done, checkpoint, drift, error).
 * @param [in] m   the handle.
 * @param [in] ev  the event; seq and unix_ms are filled in.
 * @return GRAFT_OK or an etcd error.
 */
GRAFT_WUR graft_status_t graft_membership_event_append(graft_membership_t *m,
                                                       const graft_event_t *ev);

/**
 * @brief Read the retained history, oldest first (by seq: the etcd revision
 *        that created the event, so it ascends with time of append but has
 *        gaps). Records that do not decode are logged and skipped.
 * @param [in]  m          the handle.
 * @param [in]  after_seq  only events with seq > after_seq.
 * @param [out] events_p   the events; free with graft_membership_events_free().
 * @param [out] n_p        their number.
 * @return GRAFT_OK, GRAFT_ENOMEM, or an etcd error.
 */
GRAFT_WUR graft_status_t graft_membership_events_read(graft_membership_t *m, uint64_t after_seq,
                                                      graft_event_t **events_p, size_t *n_p);

/**
 * @brief Free events. Accepts NULL.
 * @param [in] events  the array.
 * @param [in] n       its length.
 */
void graft_membership_events_free(graft_event_t *events, size_t n);

/* ------------------------------------------------------------------------ */
/* Statistics                                                               */
/** What a rank can rely on without asking etcd (the runtime's steady path). */
typedef struct graft_membership_health {
    /** This rank's lease is certainly alive: the last renewal etcd
     *  acknowledged was sent less than 5/6 of the TTL ago. A rank that is
     *  cut off from etcd loses this within the TTL. */
    bool lease_fresh;
    uint32_t lease_left_ms;   /**< with lease_fresh: how long it stays so */
    /** The view's live groups are exactly q's members, with the same
     *  processes (members_hash), and the latest quorum record is still q's
     *  round: nobody joined, left, re-joined or formed a later round. */
    bool epoch_intact;
    /** The latest quorum record is still @p q's round: no later round
     *  formed (members may have changed since, which alone does not undo
     *  a step every member was ready for). */
    bool round_current;
} graft_membership_health_t;

/**
 * @brief Check the lease and whether quorum @p q's epoch still holds in the
 *        view. No etcd request: from the keep-alive thread's last renewal
 *        and the watch.
 * @param [in]  m    the handle.
 * @param [in]  q    a quorum this rank took part in (its round and id).
 * @param [out] h_p  the answer.
 * @return GRAFT_OK, GRAFT_EINVAL, GRAFT_ENOMEM.
 */
GRAFT_WUR graft_status_t graft_membership_health(graft_membership_t *m, const graft_quorum_t *q,
                                                 graft_membership_health_t *h_p);

/* ------------------------------------------------------------------------ */

/** Counters of one handle since its creation. */
typedef struct graft_membership_stats {
    uint64_t requests;          /**< etcd requests made, keep-alives excluded */
    uint64_t keepalives;        /**< lease renewals sent */
    uint64_t watch_events;      /**< events received by the view's watch */
    uint64_t malformed;         /**< records skipped because they did not decode */
    uint64_t lease_losses;
    uint64_t quorum_txns;       /**< formation transactions attempted */
    uint64_t quorum_conflicts;  /**< of which another rank won */
    uint64_t etcd_errors;       /**< failed requests (retried or reported) */
    uint64_t quorum_fast;       /**< rounds this rank formed in its announcing transaction
                                     (same member set, everyone one step on; docs/KEYS.md) */
    uint64_t bytes_read;        /**< bytes of etcd's answers to the requests counted above
                                     (the view's watch streams apart) */
    uint64_t etcd_sent;         /**< HTTP requests sent by the handle's etcd clients and the
                                     clients sharing their load (graft_etcd_stats_t) */
    uint64_t etcd_retries;      /**< of which repeats by the client */
    uint64_t etcd_shed;         /**< requests not sent because etcd was slow */
} graft_membership_stats_t;

/**
 * @brief Read the counters.
 * @param [in]  m        the handle.
 * @param [out] stats_p  the counters.
 */
void graft_membership_stats_get(graft_membership_t *m, graft_membership_stats_t *stats_p);

#ifdef __cplusplus
}
#endif

#endif /* GRAFT_MEMBERSHIP_H */
