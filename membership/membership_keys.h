/*
 * Every etcd key graft writes or reads, spelled in one place
 * (membership_keys.c; the table is docs/KEYS.md). Nothing else formats a
 * key: membership, the runtime and, through the public calls that take a
 * job name (graft_membership_job_prefix(), graft_drift_key_folder(), the
 * record readers), the tools ask here.
 *
 * Each builder takes the job prefix "/graft/<job>/" (from
 * graft__key_job_prefix()) and returns a graft__malloc'd string, or NULL
 * when out of memory. A name ending in _folder is a prefix that ends in '/'
 * (for a range or a watch over the folder). Numbers are decimal; steps,
 * event numbers and quorum ids are zero-padded to 20 digits so that etcd's
 * key order is numeric order.
 *
 * Private to the library; the runtime includes it as
 * "../membership/membership_keys.h".
 */
#ifndef GRAFT_MEMBERSHIP_KEYS_H
#define GRAFT_MEMBERSHIP_KEYS_H

#include <stdbool.h>
#include <stdint.h>

/* "/graft/<job>/"; NULL when out of memory. */
char *graft__key_job_prefix(const char *job);

/* ------------------------------------------------- membership's keys --- */

/* members/<group>/<rank> and members/ */
char *graft__key_member(const char *prefix, uint32_t group, uint32_t rank);
char *graft__key_members_folder(const char *prefix);
/* spares/<rank>/<20-digit incarnation> and spares/ */
char *graft__key_spare(const char *prefix, uint32_t rank, uint64_t incarnation);
char *graft__key_spares_folder(const char *prefix);
/* ready/<round>/<group>/<rank> and ready/<round>/ */
char *graft__key_ready(const char *prefix, uint64_t round, uint32_t group, uint32_t rank);
char *graft__key_ready_folder(const char *prefix, uint64_t round);
/* quorum */
char *graft__key_quorum(const char *prefix);
/* votes/<group>/<round>/<rank>, votes/<group>/<round>/ and votes/<group>/ */
char *graft__key_vote(const char *prefix, uint32_t group, uint64_t round, uint32_t rank);
char *graft__key_votes_round_folder(const char *prefix, uint32_t group, uint64_t round);
char *graft__key_votes_folder(const char *prefix, uint32_t group);
/* blob/<20-digit quorum id> */
char *graft__key_blob(const char *prefix, uint64_t quorum_id);
/* pairs/<20-digit round>/<donor group>/<recipient group>/<rank> */
char *graft__key_pair(const char *prefix, uint64_t round, uint32_t donor, uint32_t recipient,
                      uint32_t rank);
/* events/<20-digit number> and events/ */
char *graft__key_event(const char *prefix, uint64_t number);
char *graft__key_events_folder(const char *prefix);

/* ---------------------------------------------------- runtime's keys --- */

/* progress */
char *graft__key_progress(const char *prefix);
/* group_progress/<group> and group_progress/ */
char *graft__key_group_progress(const char *prefix, uint32_t group);
char *graft__key_group_progress_folder(const char *prefix);
/* finished/<group> and finished/ */
char *graft__key_finished(const char *prefix, uint32_t group);
char *graft__key_finished_folder(const char *prefix);
/* secret */
char *graft__key_secret(const char *prefix);
/* checkpoints/<20-digit step> and checkpoints/ */
char *graft__key_checkpoint(const char *prefix, uint64_t step);
char *graft__key_checkpoints_folder(const char *prefix);
/* ckpt/<20-digit step>/shard/<rank> and ckpt/<20-digit step>/shard/ */
char *graft__key_ckpt_shard(const char *prefix, uint64_t step, uint32_t rank);
char *graft__key_ckpt_shards_folder(const char *prefix, uint64_t step);
/* drift/<20-digit step>/<rank>/<group>, drift/<20-digit step>/<rank>/ and
 * drift/ */
char *graft__key_drift(const char *prefix, uint64_t step, uint32_t rank, uint32_t group);
char *graft__key_drift_rank_folder(const char *prefix, uint64_t step, uint32_t rank);
char *graft__key_drift_folder(const char *prefix);

/* -------------------------------------------------- classification --- */

typedef enum graft__mkey_kind {
    GRAFT__MKEY_OTHER = 0, /* under the job but not membership's to interpret */
    GRAFT__MKEY_MEMBER,
    GRAFT__MKEY_READY,
    GRAFT__MKEY_VOTE,
    GRAFT__MKEY_QUORUM,
    GRAFT__MKEY_BLOB,
    GRAFT__MKEY_EVENTSEQ,
    GRAFT__MKEY_EVENT,
    GRAFT__MKEY_GROUP_PROGRESS, /* group_progress/<group>: number is the group */
    GRAFT__MKEY_FINISHED,       /* finished/<group>: number is the group */
    GRAFT__MKEY_BAD /* looks like ours but its numbers do not parse */
} graft__mkey_kind_t;

typedef struct graft__mkey {
    graft__mkey_kind_t kind;
    uint32_t group; /* MEMBER, READY, VOTE */
    uint32_t rank;
    uint64_t number; /* READY, VOTE: round; BLOB: quorum id; EVENT: sequence;
                        GROUP_PROGRESS, FINISHED: group */
} graft__mkey_t;

/* Classify a key given the job prefix "/graft/<job>/". */
graft__mkey_t graft__mship_key_parse(const char *prefix, const char *key);

#endif /* GRAFT_MEMBERSHIP_KEYS_H */
