/* The runtime's private state, shared by its files. */
#ifndef GRAFT_RUNTIME_INTERNAL_H
#define GRAFT_RUNTIME_INTERNAL_H

#include <graft/etcd.h>
#include <graft/graft.h>
#include <graft/membership.h>
#include <graft/persist.h>
#include <graft/transfer.h>

#include "graft_internal.h"
#include "runtime_config.h"
#include "runtime_channel.h"
#include "runtime_stepmsg.h"

#include <pthread.h>
#include <stdatomic.h>

#define GRAFT_MOD_RUNTIME "runtime"

typedef struct graft__rt_region {
    graft_region_t r; /* r.name points to name below */
    char *name;
    char *persist_name; /* name in the persistent tier */
} graft__rt_region_t;

/* One checkpoint this rank takes part in (writer of a shard, or committer). */
typedef struct graft__rt_ckpt {
    uint64_t step;
    bool write_shard;      /* this rank writes its shard of step */
    bool commit_manifest;  /* this rank collects the records and writes the manifest */
    bool whole_group;      /* checkpoint_now: this group writes every shard */
    graft_persist_commit_opts_t opts;
} graft__rt_ckpt_t;

typedef struct graft__rt_pair graft__rt_pair_t;

/* A recipient this rank serves in the open quorum: what it owes the fence
 * (its UCX pull, its NCCL pair), and its rank's incarnation when the serve
 * began (0: not in the view yet), so that a fence need not wait for a
 * recipient that has left the job (runtime_step.c). */
typedef struct graft__rt_peer {
    uint32_t group;
    uint64_t incarnation;
    bool ucx;
    bool nccl;
    bool finished; /* voted in the round or later, or left: reads no more */
} graft__rt_peer_t;

/* Fan-out of a quorum round (runtime_fanout.c): whom this group pulls
 * from, and whom it serves. */
#define GRAFT__FANOUT_DONORS 4 /* donors of a first-level recipient */
/* The request timeout of etcd_quick: the progress record at a commit. */
#define GRAFT__RT_PROGRESS_TIMEOUT_MS 250u

typedef struct graft__fanout_peer {
    uint32_t group;
    bool primary; /* this group is the recipient's first donor (its NCCL pair) */
} graft__fanout_peer_t;

typedef struct graft__fanout {
    uint32_t donors[GRAFT__FANOUT_DONORS]; /* none: this group is not a recipient */
    size_t n_donors;
    graft__fanout_peer_t *serves;          /* the recipients this group serves */
    size_t n_serves;
    bool relay; /* a recipient that serves its own recipients once healed */
} graft__fanout_t;

/* The plan of quorum q for group: k recipients at once per donor, relays
 * only when allowed (not with NCCL pairs). Free with graft__fanout_free(). */
graft_status_t graft__fanout_plan(const graft_quorum_t *q, uint32_t group, uint32_t k,
                                  bool relays, graft__fanout_t *plan);
void graft__fanout_free(graft__fanout_t *plan);

typedef struct graft__steady graft__steady_t;

/* The heal (runtime_heal.c): the recipient's pull on a background thread. */
typedef struct graft__rt_heal {
    pthread_t thread;
    bool running;
    graft_status_t status;
    bool relay;        /* a relay's heal: begin its serve when done */
    bool relay_served; /* and it did */
    char **donors;     /* transfer addresses of the donors in the view */
    size_t n_donors;
    uint32_t donor_groups[GRAFT_TRANSFER_MAX_DONORS]; /* group of donors[i] */
    graft_transfer_report_t report;
    /* NCCL pairs (transfer_backend = nccl, with CUDA regions). */
    uint32_t nccl_donor;        /* the group its CUDA regions come from */
    graft_status_t nccl_status; /* the NCCL pull's outcome */
} graft__rt_heal_t;

/* The serve (runtime_serve.c, runtime_nccl.c): the donor's side. */
typedef struct graft__rt_serve {
    bool serving;
    uint32_t n_recipients;
    graft__rt_peer_t *peers; /* the recipients this rank serves */
    size_t n_peers;
    uint64_t refused_seen;   /* graft_transfer_refused_count() last recorded */
    /* A relay (runtime_fanout.c): serves peers once its heal ends; the heal
     * thread begins the serve, or withdraws it if the heal failed (the
     * heal's relay_served says which). */
    bool relay;
    graft__rt_pair_t *pairs; /* NCCL: one serving thread per recipient */
    size_t n_pairs;
    /* Followers (docs/RUNTIME.md, "Follow spares"): a serve of follow_step
     * opened for them at graft_quorum(), before the quorum; closed at the
     * commit's fence, or before this rank's own heal. */
    bool follow;
    uint64_t follow_step;
} graft__rt_serve_t;

/* A follow spare's follower (runtime_follow.c): while the spare waits for
 * a slot, a thread pulls each step's state from rank `rank` of the lowest
 * healthy group. */
typedef struct graft__rt_follow {
    pthread_t thread;
    bool running;
    atomic_bool stop;
    atomic_bool done;  /* the thread has returned */
    atomic_bool moving; /* the current pull has installed bytes */
    graft_membership_spare_t *sp; /* whose view names the donors */
    /* The step the regions hold, verified (0: none; what the thread writes
     * until it stops, then the join reads). */
    uint64_t step;
} graft__rt_follow_t;

/* The checkpoint tier (runtime_persist.c). */
typedef struct graft__rt_tier {
    graft_persist_writer_t *writer;
    pthread_t thread;
    bool running;
    /* Set when the next periodic checkpoint begins: the pending one stops
     * waiting for shards that will not come (a writer died). */
    atomic_bool superseded;
    graft__rt_ckpt_t ckpt;
    graft_status_t status;
} graft__rt_tier_t;

struct graft_runtime {
    graft_config_t *cfg;   /* own copy */
    uint32_t group, rank, ranks, groups, min_groups;
    uint64_t start_ns;     /* graft_init(): the detect phase starts here */

    graft_etcd_config_t etcd_cfg;
    char **endpoints;
    size_t n_endpoints;
    graft_etcd_t *etcd;
    char *prefix;          /* "/graft/<job>/" */
    /* The job secret (runtime_secret.c): keys the transfer handshake and
     * the steady path's MACs; wiped at graft_destroy(). */
    uint8_t secret[GRAFT_TRANSFER_SECRET_MAX_BYTES];
    size_t secret_len;

    graft_transfer_endpoint_t *ep;
    /* The inbox and outbox of step messages over ep (runtime_channel.c):
     * the steady path's and the delegated records'. */
    graft__channel_t *channel;
    graft_membership_t *m;

    graft__rt_region_t *regions;
    size_t n_regions;
    uint64_t layout_hash;

    graft_fingerprint_fn fp_fn;
    void *fp_arg;
    graft_runtime_event_fn ev_fn;
    void *ev_arg;
    pthread_mutex_t ev_mu; /* one callback at a time */

    /* Step state (training thread). */
    bool joined;
    bool restarted;        /* graft_restart(): the next join keeps the state it holds */
    graft_membership_spare_t *spare; /* a promoted spare's wait, freed at graft_destroy() */
    bool state_valid;      /* regions hold committed_step's state */
    /* The regions must come from the job (an up-to-date group or a
     * checkpoint): a start that expects donors, a start of a job that has
     * committed steps, a failed recovery. Never satisfied by a cold start. */
    bool need_state;
    /* Since when this rank, lacking state, waits for a round with a group
     * that holds it (live outside the quorums formed so far); 0: not. */
    uint64_t state_wait_since_ns;
    bool round_restored;   /* this quorum fell back to a checkpoint of another step */
    bool vetoed;           /* graft_commit_veto() in this step: vote no */
    bool finishing;        /* graft_finish() in this step: the trainer's last */
    bool finished;         /* a closing step committed: graft_finished() */
    /* Other groups that ended the job cleanly (their finished/<group>
     * record, runtime_finish.c), and the highest step they ended at. */
    uint32_t n_finished;
    uint64_t finished_step;
    bool healthy_published;
    bool cannot_serve_published; /* the member record says GRAFT_MEMBER_CANNOT_SERVE */
    bool progress_published; /* the job's progress key, at least once per process */
    uint64_t progress_step;    /* the step this process last wrote there */
    uint64_t progress_ns;      /* and when */
    uint64_t progress_retry_ns; /* after a failed write at a commit, not before */
    bool progress_failing;      /* the last write failed (logged once) */
    char vote_reason[192]; /* a vote's reason built at graft_commit() */
    /* The group's progress record (rank 0 only, runtime_step.c). */
    uint64_t gprogress_step;    /* the step it last wrote */
    uint64_t gprogress_ns;      /* and when (0: never) */
    uint64_t gprogress_retry_ns; /* after a failed write, not before */
    /* For the periodic progress record at a commit: a short timeout and no
     * retry, so that an etcd that hangs holds a committed step back briefly. */
    graft_etcd_t *etcd_quick;
    graft_quorum_t *q;     /* the open step's quorum; NULL between steps */
    bool q_steady;         /* q was agreed on the steady path, not in etcd */
    graft__steady_t *steady; /* runtime_steady.c; NULL until the first quorum */
    uint64_t prev_quorum_id;
    bool cold_sync;        /* step-0 initial sync in this quorum */
    uint64_t quorum_call_ns;
    uint64_t heal_detect_ns, heal_quorum_ns; /* the next heal's phases, for its report */

    /* The runtime's objects: each owned by its files, touched by them and
     * by the coordinator (runtime.c, runtime_step.c, runtime_step_heal.c)
     * only; none calls another (scripts/check-runtime-objects.sh). */
    graft__rt_heal_t heal;   /* runtime_heal.c */
    graft__rt_serve_t serve; /* runtime_serve.c, runtime_nccl.c */
    graft__rt_tier_t tier;   /* runtime_persist.c */
    graft__rt_follow_t follow; /* runtime_follow.c */

    /* The test build's faults (runtime_skip.c); always NULL in the library
     * that is shipped, which has no code that sets it. */
    struct graft__rt_test_hook *test_hook;

    /* Readable from any thread. */
    pthread_mutex_t mu;
    graft_metrics_t metrics;
    graft_start_kind_t start_kind;
    uint32_t replica_rank, replica_world;
};

/* runtime_observe.c */
void graft__rt_emit(graft_runtime_t *rt, const graft_runtime_event_t *ev);
void graft__rt_job_event(graft_runtime_t *rt, graft_event_kind_t kind, uint64_t step, bool ok,
                         uint64_t duration_us, const char *detail);

/* runtime_join.c: joining (the first graft_quorum(), or after
 * graft_restart()): the member record and the start-up decision. */
GRAFT_WUR graft_status_t graft__rt_join(graft_runtime_t *rt);
/* The group's step channel and checkpoint writer: at graft_init(), or for
 * a spare once it knows its group. */
GRAFT_WUR graft_status_t graft__rt_group_open(graft_runtime_t *rt);
/* A spare's part of the join: wait until it is promoted into a slot, then
 * take up the group (mc's group, lease and incarnation, the endpoint's
 * group, the channel, the checkpoint writer). GRAFT_ECANCELED: the job
 * finished without it. */
GRAFT_WUR graft_status_t graft__rt_spare_promote(graft_runtime_t *rt,
                                                 graft_membership_config_t *mc);
/* The committed step (metrics and membership follow; runtime_observe.c). */
void graft__rt_set_step(graft_runtime_t *rt, uint64_t step);

/* runtime_step.c */
/* Write the job's progress record with this process's committed step
 * (best effort; graft_destroy() calls it for the last step; quick: through
 * etcd_quick). */
void graft__rt_publish_progress(graft_runtime_t *rt, bool quick);

/* runtime_heal.c: start pulling this rank's regions from rank `rank` of
 * the donor groups (a background thread; graft_heal_wait() joins it). */
GRAFT_WUR graft_status_t graft__rt_heal_start(graft_runtime_t *rt, const uint32_t *donors,
                                              size_t n_donors, bool relay);
/* Join the running heal: its status (GRAFT_ELAYOUT when every donor refused
 * this rank's region table), its report in rt->heal.report, and the donors
 * it lost, as "; donor group G lost (...)" parts, into lost. */
GRAFT_WUR graft_status_t graft__rt_heal_join(graft_runtime_t *rt, char *lost, size_t lost_len);

/* runtime_serve.c: the donor's side. */
/* The recipients of this rank in the plan, with their incarnations. */
GRAFT_WUR graft_status_t graft__rt_peers_list(graft_runtime_t *rt, const graft__fanout_t *plan);
void graft__rt_peers_free(graft_runtime_t *rt);
/* Serve q's step to rt->peers (UCX, and NCCL pairs where they apply). */
GRAFT_WUR graft_status_t graft__rt_serve_start(graft_runtime_t *rt, const graft_quorum_t *q);
/* A relay announces its serve before its heal; the heal thread begins it. */
GRAFT_WUR graft_status_t graft__rt_relay_start(graft_runtime_t *rt, const graft_quorum_t *q);
/* The relay's heal ended: unless its serve began (served), withdraw the
 * announced serve. */
void graft__rt_relay_abandon(graft_runtime_t *rt, bool served);
/* graft_commit(): the fence (and the followers'), then the serve's end. */
void graft__rt_serve_stop(graft_runtime_t *rt, const graft_quorum_t *q);
/* At graft_quorum(), before the quorum: serve the committed step to the
 * followers that asked for it (none asked: nothing). */
void graft__rt_follow_serve_open(graft_runtime_t *rt);
/* End the followers' serve without waiting for them (this rank heals, or
 * serves another step): their pulls fail and they ask again. */
void graft__rt_follow_serve_close(graft_runtime_t *rt);

/* runtime_follow.c: a follow spare's follower. */
/* Start following (the spare's view names the donors). */
GRAFT_WUR graft_status_t graft__rt_follow_start(graft_runtime_t *rt,
                                                graft_membership_spare_t *sp);
/* Stop following; the step the regions hold, verified (0: none). */
uint64_t graft__rt_follow_stop(graft_runtime_t *rt);

/* runtime_secret.c: the job secret from GRAFT_JOB_SECRET, job_secret_file
 * or the job's record in etcd, in that order (docs/SECURITY.md), into
 * rt->secret. GRAFT_EINVAL (a secret too short or too long, a file that is
 * missing or open to group or others: logged naming where it came from,
 * never its content); an etcd error; GRAFT_EMALFORMED, GRAFT_EFORMAT (a
 * record in etcd it cannot read). */
GRAFT_WUR graft_status_t graft__rt_secret_load(graft_runtime_t *rt);

/* runtime_delegate.c: the etcd path's quorum round and commit vote, with a
 * group's ranks handing their records to its leader (docs/RUNTIME.md,
 * "Delegated records"); as graft_membership_quorum_wait() and
 * graft_membership_commit_vote() when there is one rank per group or
 * gather_timeout_ms is 0. */
GRAFT_WUR graft_status_t graft__rt_delegate_quorum(graft_runtime_t *rt, uint64_t committed,
                                                   uint32_t timeout_ms, graft_quorum_t **q_p);
GRAFT_WUR graft_status_t graft__rt_delegate_vote(graft_runtime_t *rt, const graft_quorum_t *q,
                                                 bool ok, const char *reason, bool *decision_p);

/* runtime_steady.c: steps agreed between the members, without etcd. */
/* After a quorum formed in etcd: remember its epoch and the members'
 * addresses (with steady_path = peers). */
GRAFT_WUR graft_status_t graft__rt_steady_enter(graft_runtime_t *rt, const graft_quorum_t *q);
/* At graft_quorum(): the next step of the epoch, agreed with the members.
 * *q_p NULL (and GRAFT_OK): take this step through etcd. */
GRAFT_WUR graft_status_t graft__rt_steady_quorum(graft_runtime_t *rt, uint64_t committed,
                                                 graft_quorum_t **q_p);
/* At graft_commit() of a step agreed that way: the group's decision. *why
 * says why not, when this rank's part was the reason. */
bool graft__rt_steady_vote(graft_runtime_t *rt, const graft_quorum_t *q, bool ok,
                           const char **why);
/* The step's outcome: a step that did not apply ends the epoch. */
void graft__rt_steady_done(graft_runtime_t *rt, bool applied);
void graft__rt_steady_free(graft_runtime_t *rt);

/* runtime_skip.c: the test-only broken heal. It exists only in the test
 * build of the library (-DGRAFT_TEST_FAULTS, $(BUILD)/testlib/); the
 * library that is shipped compiles these calls to nothing and never reads
 * the variable. */
#ifdef GRAFT_TEST_FAULTS
/* Read GRAFT_TEST_SKIP_REGION at graft_init(). */
GRAFT_WUR graft_status_t graft__rt_skip_init(graft_runtime_t *rt);
/* At the first quorum: resolve the name against the regions. */
GRAFT_WUR graft_status_t graft__rt_skip_resolve(graft_runtime_t *rt);
/* Before a pull: save the region; after a pull that installed: put it back. */
void graft__rt_skip_save(graft_runtime_t *rt);
void graft__rt_skip_restore(graft_runtime_t *rt);
void graft__rt_skip_free(graft_runtime_t *rt);
#else
/* Macros rather than inline functions, so that not even the debug
 * information of the library that is shipped names the switch. */
#define graft__rt_skip_init(rt) ((void)(rt), GRAFT_OK)
#define graft__rt_skip_resolve(rt) ((void)(rt), GRAFT_OK)
#define graft__rt_skip_save(rt) ((void)(rt))
#define graft__rt_skip_restore(rt) ((void)(rt))
#define graft__rt_skip_free(rt) ((void)(rt))
#endif

/* runtime_finish.c: a clean end that a job of several groups can take. */
/* Rank 0 at join: a finished record of an earlier run of this group goes. */
void graft__rt_finished_clear(graft_runtime_t *rt);
/* At graft_destroy() of a rank other than 0 whose group finished: wait (up
 * to GRAFT__RT_FINISHED_AWAIT_MS) until rank 0 recorded the group's end, so
 * that a spare never reads this rank's leave as a death. */
#define GRAFT__RT_FINISHED_AWAIT_MS 3000u
void graft__rt_finished_await(graft_runtime_t *rt);
/* Before an etcd round: read the finished records when a group is missing
 * (or @p always) and lower the rounds' min_groups by the finished groups. */
void graft__rt_finished_refresh(graft_runtime_t *rt, bool always);
/* After a closing step this rank committed: rank 0 writes the record. */
void graft__rt_finished_publish(graft_runtime_t *rt, uint64_t step);
/* Quorum q formed without groups that finished at a later step than q's:
 * no group left can compute q's step, so this rank needs the job's state. */
bool graft__rt_finished_ahead(const graft_runtime_t *rt, const graft_quorum_t *q);

/* runtime_persist.c */
GRAFT_WUR graft_status_t graft__rt_persist_open(graft_runtime_t *rt);
void graft__rt_persist_close(graft_runtime_t *rt);
/* Restore the newest valid checkpoint; GRAFT_ENOCHECKPOINT when there is
 * none, GRAFT_ESTATELOST when there are some and none verifies. */
GRAFT_WUR graft_status_t graft__rt_restore(graft_runtime_t *rt, uint64_t *step_p);
/* At commit of quorum q (state = q->step), before the vote is known. */
GRAFT_WUR graft_status_t graft__rt_persist_at_commit(graft_runtime_t *rt, const graft_quorum_t *q);
/* The final checkpoint at the commit of a step marked by graft_finish()
 * (persist_final): started off the schedule too, and waited for. */
GRAFT_WUR graft_status_t graft__rt_persist_final(graft_runtime_t *rt, const graft_quorum_t *q);
/* Wait for the background checkpoint work of the previous step. */
void graft__rt_persist_join(graft_runtime_t *rt);
/* The remote tier's counters into the metrics (untouched without one). */
void graft__rt_persist_metrics(graft_runtime_t *rt, graft_metrics_t *metrics_p);

/* runtime_nccl_pair.c: CUDA regions over NCCL pairs, the setup; the donor's
 * side in runtime_nccl.c, the recipient's in runtime_heal.c. */
/* transfer_backend is nccl and this rank has CUDA regions. */
bool graft__rt_nccl_on(const graft_runtime_t *rt);
bool graft__rt_has_host_regions(const graft_runtime_t *rt);
/* runtime_nccl.c, the donor's side (part of the serve): start a serving
 * thread per peer that pairs with this rank (rt->peers[i].nccl), for q. */
GRAFT_WUR graft_status_t graft__rt_nccl_serve_start(graft_runtime_t *rt, const graft_quorum_t *q);
/* Donor: wait for the serving threads and clear their id slots. */
void graft__rt_nccl_serve_join(graft_runtime_t *rt);
/* runtime_nccl_pair.c: the id exchange of one pair through etcd, for tests. */
GRAFT_WUR graft_status_t graft__rt_nccl_exchange(graft_runtime_t *rt, uint64_t round,
                                                 uint32_t donor, uint32_t recipient, bool publish,
                                                 uint8_t *uid, size_t uid_bytes);

/* runtime_records.c: the runtime's etcd keys, one function per key (NULL
 * on ENOMEM), and their values (docs/KEYS.md). */
char *graft__rt_key_drift_folder(const graft_runtime_t *rt, uint64_t step, uint32_t rank);
char *graft__rt_key_drift(const graft_runtime_t *rt, uint64_t step, uint32_t rank,
                          uint32_t group);
char *graft__rt_key_progress(const graft_runtime_t *rt);
/* group_progress/<this rank's group> */
char *graft__rt_key_group_progress(const graft_runtime_t *rt);
char *graft__rt_key_checkpoint(const graft_runtime_t *rt, uint64_t step);
char *graft__rt_key_shard_folder(const graft_runtime_t *rt, uint64_t step);
char *graft__rt_key_shard(const graft_runtime_t *rt, uint64_t step, uint32_t rank);
char *graft__rt_key_secret(const graft_runtime_t *rt);
/* The JobSecret record of `secret`; the caller wipes and frees *buf_p. */
GRAFT_WUR graft_status_t graft__rt_secret_encode(const uint8_t *secret, size_t len,
                                                 uint8_t **buf_p, size_t *len_p);
/* Decode a JobSecret into secret (cap bytes): GRAFT_EMALFORMED (not one,
 * or a secret shorter than GRAFT_TRANSFER_SECRET_MIN_BYTES or longer than cap),
 * GRAFT_EFORMAT (another version), GRAFT_ENOMEM. */
GRAFT_WUR graft_status_t graft__rt_secret_decode(const uint8_t *buf, size_t len, uint8_t *secret,
                                                 size_t cap, size_t *len_p);
/* A DriftRecord of this rank's region hashes (indexed like rt->regions). */
GRAFT_WUR graft_status_t graft__rt_drift_encode(const graft_runtime_t *rt, const uint64_t *hashes,
                                                uint8_t **buf_p, size_t *len_p);
/* Decode another group's DriftRecord: fills hashes and have (indexed like
 * rt->regions) for the regions it names; GRAFT_EMALFORMED, GRAFT_EFORMAT. */
GRAFT_WUR graft_status_t graft__rt_drift_decode(const graft_runtime_t *rt, const uint8_t *buf,
                                                size_t len, uint32_t *group_p, uint64_t *hashes,
                                                bool *have);
/* The ProgressRecord of `progress`; decode: GRAFT_EMALFORMED, GRAFT_EFORMAT. */
GRAFT_WUR graft_status_t graft__rt_progress_encode(uint64_t step, uint8_t **buf_p, size_t *len_p);
GRAFT_WUR graft_status_t graft__rt_progress_decode(const uint8_t *buf, size_t len,
                                                   uint64_t *step_p);
/* The ProgressRecord of group_progress/<group> (with group, rate, time). */
GRAFT_WUR graft_status_t graft__rt_group_progress_encode(const graft_group_progress_t *gp,
                                                       uint8_t **buf_p, size_t *len_p);
/* Write checkpoints/<step> (best effort: a failure is logged). */
void graft__rt_checkpoint_record_put(graft_runtime_t *rt, graft_etcd_t *etcd, uint64_t step,
                                     const char *status);

/* runtime_drift.c */
/* Compare this rank's region hashes with the other members' at q->step;
 * GRAFT_EDRIFT when this group is on the losing side. */
GRAFT_WUR graft_status_t graft__rt_drift_check(graft_runtime_t *rt, const graft_quorum_t *q);

#endif /* GRAFT_RUNTIME_INTERNAL_H */
