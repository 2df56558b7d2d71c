/*
 * The recipient's pull, shared by its three files, each calling only the
 * ones below it: ucx_pull.c (the chunks: gets and the pull's loop),
 * ucx_pull_donors.c (each donor's answers: request, manifest, hash parts,
 * admission queue) and ucx_pull_conn.c (each donor's connection: connect,
 * shared memory, failure, close). Not installed.
 */
#ifndef GRAFT_UCX_PULL_H
#define GRAFT_UCX_PULL_H

#include "ucx_int.h"

#include "proto/graft.pb-c.h"

#include <assert.h>

/* A donor that turned a connection away is asked again after this, then
 * twice as long each time up to the most (with jitter: half to all). */
#define RECONNECT_FIRST_NS (20ull * 1000000ull)
#define RECONNECT_MAX_NS (400ull * 1000000ull)

enum { CH_PENDING, CH_INFLIGHT, CH_FETCHED, CH_DONE };
enum { D_CONNECTING, D_READY, D_FAILED };

typedef struct pchunk {
    uint32_t region;
    uint8_t state;
    int8_t donor;  /* who it was fetched from */
    uint64_t got;  /* hash of the bytes as fetched */
} pchunk_t;

typedef struct pull pull_t;

typedef struct pdonor {
    pull_t *pull;
    uint32_t index;
    ucp_worker_h worker; /* this donor's alone: see graft__ucx_pull */
    ucp_ep_h uep;
    /* Its shared-memory worker, when it offered one and it is reachable
     * (ucx_shm.c): chunk requests go there. */
    ucp_ep_h shm_uep;
    void *shm_close_req;
    uint8_t shm_ticket[GRAFT_MAC_BYTES];
    int state;
    bool final;
    bool err_flag;
    ucs_status_t err_status;
    ucp_rkey_h *rkeys;
    uint64_t *raddr;
    uint8_t **lptr; /* per region: where its memory is mapped here, or NULL */
    uint64_t *hash;
    uint8_t *known;
    uint32_t inflight;
    uint64_t last_ns;
    uint64_t connect_deadline;
    uint64_t retry_at_ns; /* ask again then (a donor not serving our step yet) */
    uint64_t retry_ns;    /* the current back-off */
    graft_status_t refused; /* its last refusal, reported if it never serves */
    bool answered;          /* a message came back: the connection is wired up */
    bool queued;            /* answered GRAFT_EBUSY: waiting for admission */
    /* The handshake (transfer_auth.c): the donor's challenge, and ours. */
    bool challenged;
    uint8_t donor_nonce[GRAFT_NONCE_BYTES];
    uint8_t nonce[GRAFT_NONCE_BYTES];
    uint64_t seq; /* the sequence number of its next sealed answer */
    /* Its answers in the order they came (graft__ucx_donors_answers()). */
    msg_queue_t answers;
    uint64_t queued_since_ns;
    void *close_req;
    bool close_when_drained;
    /* Turned away before a challenge: connect again then, after this
     * back-off (graft__ucx_donor_reconnect). */
    uint64_t reconnect_at_ns;
    uint64_t reconnect_ns;
} pdonor_t;

typedef struct pslot {
    pull_t *pull;
    bool busy;
    bool done;
    bool proto_err;    /* the donor answered a push read wrongly */
    bool recv_started; /* push read: UCX is receiving the bytes */
    uint32_t donor;
    uint64_t chunk;
    ucs_status_t st;
} pslot_t;

struct pull {
    graft_transfer_endpoint_t *ep;
    const graft_transfer_pull_options_t *o;
    /* The step asked for: o->step, or for a follower the later one its
     * donor serves (step_refusal_retry()). */
    uint64_t step;
    graft_transfer_report_t *rep;
    uint64_t nonce;
    size_t n_donors;
    pdonor_t donors[GRAFT_TRANSFER_MAX_DONORS];
    pchunk_t *chunks;
    uint64_t n_chunks;
    uint64_t *queue; /* ring of pending chunk indexes */
    uint64_t q_head, q_count;
    uint64_t *ref_hash;
    int8_t *ref_donor;
    pslot_t *slots;
    size_t n_slots;
    uint64_t done_chunks, done_bytes;
    uint64_t total_bytes; /* of the regions pulled (host_only leaves CUDA ones out) */
    graft_status_t status;
    msg_queue_t msgs;
    uint32_t window, stall_ms, connect_ms;
};


static inline void q_push(pull_t *p, uint64_t c)
{
    assert(p->q_count < p->n_chunks);
    p->queue[(p->q_head + p->q_count) % p->n_chunks] = c;
    p->q_count++;
}

static inline uint64_t q_pop(pull_t *p)
{
    uint64_t c = p->queue[p->q_head];
    p->q_head = (p->q_head + 1) % p->n_chunks;
    p->q_count--;
    return c;
}

static inline const graft__region_t *chunk_region(const pull_t *p, uint64_t c)
{
    return &p->ep->regions[p->chunks[c].region];
}

static inline uint64_t chunk_len(const pull_t *p, uint64_t c)
{
    const graft__region_t *r = chunk_region(p, c);
    return graft__region_chunk_len(p->ep, r, c - r->first_chunk);
}

/* ucx_pull_conn.c: a donor's connection. */
/* A donor's offer of shared memory, from its first manifest: connect to
 * it, or stay on the connection we have. */
GRAFT_WUR graft_status_t graft__ucx_donor_shm_connect(pull_t *p, pdonor_t *d,
                                                      const Graft__TransferManifest *m);
/* A donor connection's error: the donor is dropped in the pull's loop. */
void graft__ucx_recip_err_cb(void *arg, ucp_ep_h uep, ucs_status_t status);
/* Connect to donor @p d; the request goes once its challenge came. */
GRAFT_WUR graft_status_t graft__ucx_donor_connect(pull_t *p, pdonor_t *d);
/* Connect again to a donor turned away, when its back-off is over. */
GRAFT_WUR graft_status_t graft__ucx_donor_reconnect(pull_t *p, pdonor_t *d, uint64_t now);
/* Give up on @p d for @p why: its chunks go back to the queue. */
void graft__ucx_donor_fail(pull_t *p, pdonor_t *d, graft_status_t why);
/* Close a donor's connection by force (ucx_pull_conn.c says how). */
void graft__ucx_donor_force_close(pull_t *p, pdonor_t *d);
/* Graceful closes of dropped donors whose reads have drained. */
void graft__ucx_donors_close_drained(pull_t *p);
void graft__ucx_ep_close_start(pull_t *p, pdonor_t *d, bool force);

/* ucx_pull_donors.c: each donor's answers. */
/* Check a fetched chunk against its donor's hash; a mismatch fails the
 * donor (its chunks go to the others). */
void graft__ucx_chunk_verify(pull_t *p, uint64_t c);
/* A donor that closed the connection before its challenge turned it away
 * (all its places for connections not yet authenticated were taken):
 * close ours and connect again after a jittered back-off, within the
 * connect deadline. False: not such a case, or no time left. */
bool graft__ucx_donor_turned_away(pull_t *p, pdonor_t *d, uint64_t now);
/* Send the requests whose back-off is over. */
void graft__ucx_donors_retry(pull_t *p);
/* A donor's message: its challenge, a manifest (first or a hash part) or a
 * refusal. */
void graft__ucx_handle_donor_msg(pull_t *p, ucx_msg_t *msg);
/* Stop the clock of a donor's queue. */
void graft__ucx_queue_leave(pull_t *p, pdonor_t *d);
/* Handle each donor's answers that are all here, in the order they came. */
void graft__ucx_donors_answers(pull_t *p);
/* Active messages from a donor (manifests): queued for the pull's loop. */
ucs_status_t graft__ucx_recip_am_cb(void *arg, const void *header, size_t header_length,
                                    void *data, size_t length, const ucp_am_recv_param_t *param);
/* A donor's challenge: queued for the pull's loop. */
ucs_status_t graft__ucx_recip_challenge_cb(void *arg, const void *header, size_t header_length,
                                           void *data, size_t length,
                                           const ucp_am_recv_param_t *param);

#endif /* GRAFT_UCX_PULL_H */
