/*
 * Private to the membership layer: record codecs, the pure quorum decision,
 * and the handle shared by the membership files; the key spellings are
 * membership_keys.h's. The etcd client has its own private header.
 */
#ifndef GRAFT_MEMBERSHIP_INTERNAL_H
#define GRAFT_MEMBERSHIP_INTERNAL_H

#include <graft/etcd.h>
#include <graft/membership.h>

#include "graft_internal.h"
#include "membership_keys.h"

#include <pthread.h>
#include <stdatomic.h>

#define GRAFT_MOD_MEMBERSHIP "membership"
#define GRAFT_MSHIP_RECORD_VERSION 1u
#define GRAFT_MSHIP_BLOB_MAX (64u * 1024u)

/* ------------------------------------------------------------- records --- */

/* A ready announcement as the quorum decision reads it. */
typedef struct graft__ready {
    uint32_t group;
    uint32_t rank;
    uint64_t incarnation;
    uint64_t round;
    uint64_t committed_step;
    uint64_t unix_ms;
    int64_t mod_revision;
} graft__ready_t;

typedef struct graft__vote {
    uint32_t group;
    uint32_t rank;
    uint64_t incarnation;
    uint64_t quorum_id;
    uint64_t round;
    uint64_t step;
    bool ok;
    char reason[128];
} graft__vote_t;

/* Each encoder allocates *buf_p with graft__malloc. Each decoder checks the
 * record version, returns GRAFT_EMALFORMED for bytes that do not decode or
 * decode to nonsense and GRAFT_EFORMAT for a version it does not know. */
GRAFT_WUR graft_status_t graft__mship_member_encode(const graft_member_t *mem, uint8_t **buf_p,
                                                    size_t *len_p);
GRAFT_WUR graft_status_t graft__mship_member_decode(const uint8_t *buf, size_t len,
                                                    graft_member_t *mem_p);
void graft__mship_member_clear(graft_member_t *mem);
GRAFT_WUR graft_status_t graft__mship_member_copy(const graft_member_t *src, graft_member_t *dst_p);

GRAFT_WUR graft_status_t graft__mship_ready_encode(const graft__ready_t *r, uint8_t **buf_p,
                                                   size_t *len_p);
GRAFT_WUR graft_status_t graft__mship_ready_decode(const uint8_t *buf, size_t len,
                                                   graft__ready_t *r_p);

GRAFT_WUR graft_status_t graft__mship_vote_encode(const graft__vote_t *v, uint8_t **buf_p,
                                                  size_t *len_p);
GRAFT_WUR graft_status_t graft__mship_vote_decode(const uint8_t *buf, size_t len,
                                                  graft__vote_t *v_p);

GRAFT_WUR graft_status_t graft__mship_quorum_encode(const graft_quorum_t *q, uint8_t **buf_p,
                                                    size_t *len_p);
/* Allocates *q_p; checks that members ascend and recoveries name members. */
GRAFT_WUR graft_status_t graft__mship_quorum_decode(const uint8_t *buf, size_t len,
                                                    graft_quorum_t **q_p);
GRAFT_WUR graft_status_t graft__mship_quorum_copy(const graft_quorum_t *src, graft_quorum_t **dst_p);

GRAFT_WUR graft_status_t graft__mship_event_encode(const graft_event_t *ev, uint8_t **buf_p,
                                                   size_t *len_p);
/* The eventseq counter: 1 to 20 decimal digits that fill the value, no
 * sign, no space, no overflow; GRAFT_EMALFORMED otherwise. Reads only
 * buf[0..len). */
GRAFT_WUR graft_status_t graft__mship_eventseq_decode(const uint8_t *buf, size_t len,
                                                      uint64_t *seq_p);
GRAFT_WUR graft_status_t graft__mship_event_decode(const uint8_t *buf, size_t len,
                                                   graft_event_t *ev_p);
void graft__mship_event_clear(graft_event_t *ev);

/* -------------------------------------------------- quorum decision --- */

/* A live member as the decision sees it. */
typedef struct graft__qmember {
    uint32_t group;
    uint32_t rank;
    uint64_t incarnation;
} graft__qmember_t;

typedef struct graft__qinput {
    const graft__qmember_t *members; /* live member records */
    size_t n_members;
    const graft__ready_t *ready;     /* ready records, any round */
    size_t n_ready;
    uint32_t ranks_per_group;
    uint32_t min_groups;
    uint64_t round;        /* the round to decide */
    bool deadline_passed;  /* the join timeout of the deciding rank passed */
    const graft_quorum_t *prev; /* latest formed quorum, or NULL */
    uint64_t now_unix_ms;
} graft__qinput_t;

typedef enum graft__qaction {
    GRAFT__QUORUM_WAIT,  /* some live group is not ready yet */
    GRAFT__QUORUM_FORM,  /* *q_p holds the quorum to write */
    GRAFT__QUORUM_SHORT  /* the join timeout passed with fewer than min_groups */
} graft__qaction_t;

typedef struct graft__qdecision {
    graft__qaction_t action;
    size_t n_live_groups;
    size_t n_ready_groups;
    /* The rank whose ready record completed the set (highest mod_revision
     * among the included groups), for logs and tests. */
    uint32_t last_group;
    uint32_t last_rank;
} graft__qdecision_t;

/* Pure: no I/O, no clock. Allocates *q_p for GRAFT__QUORUM_FORM. */
GRAFT_WUR graft_status_t graft__quorum_decide(const graft__qinput_t *in,
                                              graft__qdecision_t *decision_p,
                                              graft_quorum_t **q_p);

/* XXH3 of the sorted (group, rank, incarnation) of the given groups' members. */
uint64_t graft__quorum_members_hash(const graft__qmember_t *members, size_t n_members,
                                    const uint32_t *groups, size_t n_groups);

/* --------------------------------------------------------------- handle --- */

/* The watch-driven view. Protected by graft_membership.mu. */
typedef struct graft__mview {
    uint64_t version;
    int64_t revision;
    graft_member_t *members; /* sorted by (group, rank) */
    size_t n_members;
    graft__vote_t *votes;    /* of the handle's own group */
    size_t n_votes;
    graft_quorum_t *quorum; /* latest quorum record, or NULL */
    int64_t quorum_mod;     /* its mod_revision; 0 when absent */
    uint64_t event_seq; /* last sequence in eventseq, as last learned */
    int64_t eventseq_mod;
    uint64_t malformed;
    uint64_t resyncs;
    uint64_t members_gen; /* increases when a member record changes */
    /* The quorum key when its record does not decode: that record's
     * mod_revision (0: the key decodes or is absent) and why. followed:
     * the view saw the key go from the good record it keeps (quorum) to
     * the bad one, with no re-read or delete between; a member then puts
     * the good record back by compare-and-swap on bad_mod
     * (graft__mship_quorum_repair). */
    int64_t quorum_bad_mod;
    graft_status_t quorum_bad_reason;
    bool quorum_followed;
    uint64_t repair_after_ns; /* back-off of a repair that failed (either kind) */
    /* This rank's own member record when it does not decode (someone wrote
     * over it): its mod_revision, 0 when none; the rank writes its record
     * again (graft__mship_member_repair). */
    int64_t own_member_bad_mod;
    graft_status_t own_member_bad_reason;
} graft__mview_t;

/*
 * One watch of the view and the thread that follows it. The view is split
 * over a few narrow prefixes instead of one watch on the whole job, so the
 * records every rank writes at every step (ready, votes) do not fan out to
 * every other rank: that fan-out is quadratic in the number of ranks.
 */
typedef struct graft__mwatch {
    struct graft_membership *m;
    char *prefix;
    graft__mkey_kind_t owns; /* the records this watch keeps in the view */
    graft_etcd_watch_t *w;
    pthread_t thread;
    bool started;
} graft__mwatch_t;

#define GRAFT__MSHIP_WATCHES 3 /* members/, quorum, votes/<own group>/ */

struct graft_membership {
    graft_membership_config_t cfg; /* strings below are owned copies */
    char *job;
    char *host;
    char *transfer_address;
    char *prefix; /* "/graft/<job>/" */
    graft_etcd_t *ops; /* requests of the calling threads and the view's watch */
    graft_etcd_t *ka;  /* keep-alive and re-join, so a slow request never delays renewal */
    graft_etcd_t *bg;  /* best effort (event records): shed while etcd is slow */

    pthread_mutex_t mu;
    pthread_cond_t cv;      /* the view or the identity changed */
    pthread_cond_t stop_cv; /* stop was set: wakes sleeping threads */
    bool mu_init;
    graft__mview_t view;

    /* Identity, under mu. */
    int64_t lease;
    uint64_t incarnation;
    graft_member_state_t state;
    uint64_t committed_step;
    uint64_t joined_unix_ms;
    bool joined;
    bool left;
    bool lease_lost_pending; /* report GRAFT_ELEASE once from the next call */
    uint64_t last_round;
    uint64_t last_id;
    uint64_t ready_round; /* round of this rank's last ready record, 0: none */
    /* Under mu. The round of this rank's last vote key (its own vote or a
     * no recorded on its behalf), deleted by its next vote; 0: none. */
    uint64_t vote_round;
    /* Under mu. The "no" records this rank wrote at a vote timeout for
     * ranks of its group that had not voted: round and ranks. They are on
     * its lease and deleted by its next vote transaction. */
    uint64_t proxy_round;
    uint32_t *proxy_ranks;
    size_t n_proxy;
    /* Tests only: re-read the ready records this often while waiting, so
     * that many ranks see the set complete at once and race to form. */
    uint64_t race_poll_ns;
    /* Tests only: never take the steady-state fast path, so every round
     * is formed by the compare-and-swap. */
    bool fast_path_off;

    pthread_t ka_thread;
    bool ka_started;
    atomic_bool stop;
    graft__mwatch_t watches[GRAFT__MSHIP_WATCHES];
    size_t n_watches;

    /* graft__now_ns() when the last renewal that etcd acknowledged (or the
     * grant) was sent; 0 before the first. */
    atomic_uint_fast64_t lease_renewed_ns;

    atomic_uint_fast64_t n_requests;
    atomic_uint_fast64_t n_keepalives;
    atomic_uint_fast64_t n_watch_events;
    atomic_uint_fast64_t n_lease_losses;
    atomic_uint_fast64_t n_quorum_txns;
    atomic_uint_fast64_t n_quorum_conflicts;
    atomic_uint_fast64_t n_quorum_fast;
    atomic_uint_fast64_t n_etcd_errors;

    /* Failed votes of this group in a row, as its rank 0 records them in
     * the job's history (membership_votes.c, vote_event()): the training
     * thread's alone. */
    uint64_t novote_run;     /* failed votes since the last one that passed */
    uint64_t novote_skipped; /* not recorded since the last recorded one */
    uint64_t novote_last_ns; /* when the last one was recorded */
};

/* Count one etcd request of the handle. */
#define GRAFT__MSHIP_REQ(m) atomic_fetch_add(&(m)->n_requests, 1)

/* A job's (or a group of spares') name: [A-Za-z0-9_.-]{1,64} (membership.c). */
bool graft__mship_name_ok(const char *name);

/* ---------------------------------- lease (membership_lease.c) --- */

/* Absolute CLOCK_MONOTONIC deadline for pthread_cond_timedwait on the
 * handle's condition variables. */
void graft__mship_deadline(struct timespec *ts, uint64_t wait_ns);

/* Sleep for ns, or less once the handle is being destroyed. */
void graft__mship_sleep(graft_membership_t *m, uint64_t ns);

/* Note that `lease` is gone (call under no lock). A report about a lease
 * that was already replaced by a re-join is ignored. */
void graft__mship_lease_failed(graft_membership_t *m, int64_t lease, graft_status_t why);

/* The caller's lease and incarnation, or why it may not write: GRAFT_ESTATE
 * (observer or left) or GRAFT_ELEASE (lost, reported once; not joined). */
GRAFT_WUR graft_status_t graft__mship_check_joined(graft_membership_t *m, int64_t *lease_p,
                                                   uint64_t *inc_p);
/* As graft__mship_check_joined(), but a re-join under way is waited for
 * until deadline_ns instead of reported again. */
GRAFT_WUR graft_status_t graft__mship_await_joined(graft_membership_t *m, uint64_t deadline_ns,
                                                   int64_t *lease_p, uint64_t *inc_p);

/* Run a transaction without compares that matter to the caller's retry
 * (puts on the rank's lease, maybe a read), retrying with backoff until
 * deadline_ns while etcd cannot be reached; an unknown lease is reported as
 * GRAFT_ELEASE. With lease 0 the puts are on several ranks' leases, and an
 * unknown one is returned as GRAFT_ENOTFOUND for the caller to sort out.
 * `what` names the records in messages. */
GRAFT_WUR graft_status_t graft__mship_txn_retry(graft_membership_t *m,
                                                const graft_etcd_compare_t *cmps, size_t n_cmps,
                                                const graft_etcd_op_t *ops, size_t n_ops,
                                                const graft_etcd_op_t *fail, size_t n_fail,
                                                int64_t lease, uint64_t deadline_ns,
                                                const char *what, graft_etcd_txn_result_t *res_p);

/* EINVAL unless the delegates are other ranks of this group, each once,
 * and at most GRAFT_MEMBERSHIP_MAX_DELEGATES. */
GRAFT_WUR graft_status_t graft__mship_delegates_check(const graft_membership_t *m,
                                                      const graft_membership_delegate_t *dl,
                                                      size_t n);

/* Write this rank's member record (members/<group>/<rank>) on `lease`
 * with client c. */
GRAFT_WUR graft_status_t graft__mship_member_put(graft_membership_t *m, graft_etcd_t *c,
                                                 int64_t lease, uint64_t incarnation,
                                                 graft_member_state_t state,
                                                 uint64_t committed_step, uint64_t joined_ms);

/* The view (membership_view.c): open reads each watched prefix and starts
 * its watch thread; stop joins the threads (after m->stop is set); close
 * frees the watches and the view's contents. */
GRAFT_WUR graft_status_t graft__mship_view_open(graft_membership_t *m);
void graft__mship_view_stop(graft_membership_t *m);
void graft__mship_view_close(graft_membership_t *m);

/* Append an event; best effort for callers inside the module (logged). */
GRAFT_WUR graft_status_t graft__mship_event_put(graft_membership_t *m, graft_event_t *ev);

/* ------------------------------------------ announce (announce.c) --- */

/* The round (membership_quorum.c) calls down to the announcement, never
 * the other way. */

/* Does q include group g? */
bool graft__mship_has_group(const graft_quorum_t *q, uint32_t g);

/* The view's member records as the decision's input. Called with m->mu
 * held. */
GRAFT_WUR graft_status_t graft__mship_snapshot_members(graft_membership_t *m,
                                                       graft__qmember_t **mem_p);

/* Are the live groups of (sorted) mem exactly the members of prev? */
bool graft__mship_same_live_groups(const graft__qmember_t *mem, size_t n, uint32_t R,
                                   const graft_quorum_t *prev);

/* Put a round this rank formed into its view at once. */
void graft__mship_view_adopt(graft_membership_t *m, const graft_quorum_t *q, int64_t revision);

/* membership_repair.c: a quorum record that does not decode. The repair
 * runs on the quorum watch's thread after each batch of events (and again
 * after a back-off while it fails); the event is also recorded by a
 * formation that replaced such a record. */
void graft__mship_quorum_repair(graft_membership_t *m);
void graft__mship_member_repair(graft_membership_t *m);
void graft__mship_quorum_replaced_event(graft_membership_t *m, graft_status_t reason,
                                        const graft_quorum_t *q);

/* Read the round's ready records. */
GRAFT_WUR graft_status_t graft__mship_read_ready(graft_membership_t *m, uint64_t round,
                                                 graft__ready_t **ready_p, size_t *n_p);

/* Announce ready for a round (with the delegates' records, as a leader);
 * membership_announce.c has the details. */
GRAFT_WUR graft_status_t graft__mship_announce(graft_membership_t *m, uint64_t round,
                                               uint64_t committed,
                                               const graft_membership_delegate_t *dl, size_t n_dl,
                                               uint64_t deadline_ns, graft__ready_t **ready_p,
                                               size_t *n_p, graft_quorum_t **formed_p,
                                               bool *delegated_p);

#endif /* GRAFT_MEMBERSHIP_INTERNAL_H */
