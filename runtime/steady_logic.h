/*
 * The steady path's decisions, apart from the messages that carry them
 * (runtime_steady.c): pure functions of what a rank knows, tested by
 * tables without etcd or endpoints (tests/test_steady_logic.c), in the way
 * of membership/quorum_logic.c.
 */
#ifndef GRAFT_STEADY_LOGIC_H
#define GRAFT_STEADY_LOGIC_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef enum {
    GRAFT__EPOCH_HOLDS,    /* this rank may go on in the epoch */
    GRAFT__EPOCH_CHANGED,  /* the members or the round changed */
    GRAFT__EPOCH_NO_LEASE, /* this rank's lease may have expired (or nothing is known) */
} graft__epoch_state_t;

/* Which test of the epoch applies: at the ready, at the vote, and while
 * waiting for a vote or the group's decision. */
typedef enum {
    GRAFT__CHECK_READY,
    GRAFT__CHECK_VOTE,
    GRAFT__CHECK_VOTE_WAIT,
} graft__epoch_check_t;

/* What a rank knows of its epoch from its membership view. */
typedef struct graft__epoch_facts {
    bool known;          /* the membership state could be read at all */
    bool lease_fresh;    /* this rank's lease certainly alive */
    bool epoch_intact;   /* the members are those the epoch formed with */
    bool round_current;  /* no later round formed */
    /* Every rank of this group is the process the epoch formed with; read
     * only where graft__steady_asks_own_ranks() says it matters. */
    bool own_ranks_same;
    /* A live process that the epoch did not form with (a replacement, or a
     * group that joined) is in the view: it waits for a round in etcd.
     * Read only where the epoch changed. */
    bool newcomer;
} graft__epoch_facts_t;

/* Whether the check needs own_ranks_same (it costs a view). */
bool graft__steady_asks_own_ranks(const graft__epoch_facts_t *f, graft__epoch_check_t check);

/* Whether the epoch still holds and this rank may still take part: its
 * lease certainly alive and, at the ready, the members those the epoch
 * formed with. At the vote only a later round ends it: a member that left
 * or joined after every member was ready does not undo the step (as on the
 * etcd path, where a group that dies after the formation leaves the
 * others' commit alone). While waiting for a vote or the group's decision,
 * a rank of this group gone or replaced ends it too (its vote will not
 * come), but not a change in another group: a group that gave up on such
 * a change voted no on a step the others committed, and was then their
 * recipient. *why says why when it does not hold. */
graft__epoch_state_t graft__steady_epoch_state(const graft__epoch_facts_t *f,
                                               graft__epoch_check_t check, const char **why);

/* When the epoch changed while this rank waits for a message, whether it
 * waits on until the inbox is quiet (what a member sent before it left
 * still counts) rather than leaving the epoch at once. Not before a ready
 * while a newcomer waits: the epoch cannot hold at its ready, whatever
 * comes, and the round that lets the newcomer in is waited for. At the
 * vote, always: a change after every member was ready does not undo the
 * step. */
bool graft__steady_drains(const graft__epoch_facts_t *f, graft__epoch_check_t check);

/* One process of the view: its place and incarnation. */
typedef struct graft__steady_proc {
    uint32_t group, rank;
    uint64_t incarnation;
} graft__steady_proc_t;

/* Whether a process of @p now is none of @p was (both any order). */
bool graft__steady_newcomer(const graft__steady_proc_t *was, size_t n_was,
                            const graft__steady_proc_t *now, size_t n_now);

/* Whether this rank may say ready for step @p step of the epoch: the last
 * step ended so that the next may go this way (ready), this rank committed
 * the step before it, and holds that state. */
bool graft__steady_may_ready(bool ready, uint64_t committed, uint64_t step, bool state_valid,
                             bool need_state, const char **why);

/* The leaders' dissemination barrier of G leaders: in round k, leader i
 * sends to *to_p and hears from *from_p (indexes into the members). false
 * when the barrier has no round k. */
bool graft__steady_barrier_partners(uint32_t G, uint32_t i, uint32_t k, uint32_t *to_p,
                                    uint32_t *from_p);
/* Rounds of that barrier: ceil(log2 G). */
uint32_t graft__steady_barrier_rounds(uint32_t G);

#endif /* GRAFT_STEADY_LOGIC_H */
