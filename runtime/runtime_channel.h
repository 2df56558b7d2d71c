/*
 * The group channel: this rank's one inbox of step messages (StepMessage,
 * runtime_stepmsg.c) over its transfer endpoint, and its one outbox.
 *
 * It owns what every reader of the inbox needs alike: the MAC under the
 * job secret on each message sent, the check of it on each message
 * received (one without a valid MAC is dropped, counted and logged at most
 * once a second, before anyone looks at it), and a stash where a reader
 * keeps an authentic message that is not the one it waits for, for itself
 * later or for the other reader (the etcd path's delegated records,
 * runtime_delegate.c; the steady path, runtime_steady.c). It decides
 * nothing about a message's meaning.
 *
 * One thread (the training thread) uses a channel. It calls nothing else
 * of the runtime: the runtime's objects never call each other
 * (scripts/check-layering.sh).
 */
#ifndef GRAFT_RUNTIME_CHANNEL_H
#define GRAFT_RUNTIME_CHANNEL_H

#include <graft/transfer.h>

#include "graft_internal.h"
#include "runtime_stepmsg.h"

typedef struct graft__channel graft__channel_t;

/* A channel over ep, keyed with secret (not copied: it must outlive the
 * channel), sending as group/rank. */
GRAFT_WUR graft_status_t graft__channel_create(graft_transfer_endpoint_t *ep,
                                               const uint8_t *secret, size_t secret_len,
                                               uint32_t group, uint32_t rank,
                                               graft__channel_t **ch_p);
void graft__channel_destroy(graft__channel_t *ch);

/* Send m (its group and rank set to the channel's) with its MAC to the
 * endpoint at address `to`. */
GRAFT_WUR graft_status_t graft__channel_send(graft__channel_t *ch, const char *to,
                                             graft__step_msg_t *m, uint32_t timeout_ms);

/* The next message from the endpoint, waiting up to timeout_ms:
 * GRAFT_OK with *m_p when authentic; GRAFT_ETIMEOUT when none came;
 * GRAFT_ETOKEN when one came without a valid MAC (dropped and counted);
 * another status when one came that is not a StepMessage of this version
 * (dropped). The stash is not read. */
GRAFT_WUR graft_status_t graft__channel_recv(graft__channel_t *ch, uint32_t timeout_ms,
                                             graft__step_msg_t *m_p);

/* Keep an authentic message for later; when the stash is full, its oldest
 * message goes. */
void graft__channel_stash(graft__channel_t *ch, const graft__step_msg_t *m);

/* What a reader does with a stashed message. */
typedef enum {
    GRAFT__STASH_KEEP, /* not now */
    GRAFT__STASH_DROP, /* never: it goes */
    GRAFT__STASH_TAKE, /* the one wanted: it goes to the reader */
} graft__stash_verdict_t;
typedef graft__stash_verdict_t (*graft__stash_fn)(const graft__step_msg_t *m, void *ctx);

/* Walk the stash with sort: drop what it drops, and hand the first message
 * it takes to *m_p (true then; the walk stops there). */
bool graft__channel_take(graft__channel_t *ch, graft__stash_fn sort, void *ctx,
                         graft__step_msg_t *m_p);

/* Messages dropped for want of a valid MAC since create. */
uint64_t graft__channel_rejected(const graft__channel_t *ch);

#endif /* GRAFT_RUNTIME_CHANNEL_H */
