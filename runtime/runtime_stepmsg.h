/*
 * The step message (StepMessage, proto/graft.proto) that the steady path
 * and the delegated records send, and its MAC (runtime_stepmsg.c).
 */
#ifndef GRAFT_RUNTIME_STEPMSG_H
#define GRAFT_RUNTIME_STEPMSG_H

#include "graft_internal.h"

typedef struct graft__step_msg {
    int kind; /* Graft__StepMessage__Kind */
    uint64_t quorum_id, members_hash, epoch_round, step;
    uint32_t group, rank, round; /* round: the barrier round */
    bool ok;
    /* The delegated records' kinds only (ANNOUNCE, ANNOUNCED, VOTE_DELEGATE). */
    uint64_t incarnation, etcd_round, prev_round;
    int64_t lease;
    char reason[96];
} graft__step_msg_t;
/* HMAC-SHA256 under the job secret over "graft/step/v1" and each field
 * (kind, quorum_id, members_hash, epoch_round, step, group, rank, round,
 * ok) as a big-endian u64; for the delegated records' kinds, then
 * incarnation, lease, etcd_round, prev_round, the reason's length and its
 * bytes. */
GRAFT_WUR graft_status_t graft__rt_step_mac(const uint8_t *secret, size_t secret_len,
                                            const graft__step_msg_t *m,
                                            uint8_t out[GRAFT_MAC_BYTES]);
/* Is kind one of the delegated records' (their extra fields count)? */
bool graft__rt_step_delegated(int kind);
/* m with its MAC into buf (cap bytes); GRAFT_ERANGE when it does not fit. */
GRAFT_WUR graft_status_t graft__rt_step_encode(const uint8_t *secret, size_t secret_len,
                                               const graft__step_msg_t *m, uint8_t *buf,
                                               size_t cap, size_t *len_p);
/* A received message, *m_p only when authentic: GRAFT_OK; GRAFT_ETOKEN
 * (no MAC, or a wrong one: forged, or keyed with another secret);
 * GRAFT_EPROTO (not a StepMessage); GRAFT_EFORMAT (another version);
 * GRAFT_ENOMEM. */
GRAFT_WUR graft_status_t graft__rt_step_decode(const uint8_t *secret, size_t secret_len,
                                               const uint8_t *buf, size_t len,
                                               graft__step_msg_t *m_p);

#endif /* GRAFT_RUNTIME_STEPMSG_H */
