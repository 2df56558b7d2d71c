/*
 * Private state of the transfer engine, shared by the engine (transfer.c)
 * and its backends (ucx*.c, nccl.c). Not installed.
 */
#ifndef GRAFT_TRANSFER_INT_H
#define GRAFT_TRANSFER_INT_H

#include <graft/transfer.h>

#include "graft_internal.h"
#include "pb_alloc.h"

#define XXH_STATIC_LINKING_ONLY
#include <xxhash.h>

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

#define GRAFT_MOD_TRANSFER "transfer"
#define GRAFT__XFER_WIRE_VERSION 1u

/* Active-message ids on a transfer connection. */
#define GRAFT__XFER_AM_REQUEST 11u  /* recipient -> donor: TransferRequest */
#define GRAFT__XFER_AM_MANIFEST 12u /* donor -> recipient: TransferManifest */
#define GRAFT__XFER_AM_DONE 13u     /* recipient -> donor: TransferDone */
#define GRAFT__XFER_AM_CHUNK_REQ 14u  /* recipient -> donor: ChunkRequest (push reads) */
#define GRAFT__XFER_AM_CHUNK_DATA 15u /* donor -> recipient: a chunk's bytes (push reads) */
#define GRAFT__XFER_AM_MSG 16u        /* any peer -> endpoint: a short message (msgbox.c) */
#define GRAFT__XFER_AM_CHALLENGE 17u  /* donor -> recipient: TransferChallenge */

/* One block from graft_transfer_host_alloc(). Regions that lie inside it
 * reuse its mapping instead of mapping their memory a second time. */
typedef struct graft__host_alloc {
    struct graft__host_alloc *next;
    void *ptr;         /* what the caller got */
    uint64_t bytes;    /* usable bytes from ptr on (at least what was asked) */
    void *memh;        /* backend's handle; NULL for plain memory */
    void *raw;         /* plain-memory fallback: the block to free */
    uint32_t n_regions; /* registered regions inside it: it cannot be freed */
} graft__host_alloc_t;

/* One registered region. */
typedef struct graft__region {
    char *name;
    graft_transfer_region_kind_t kind;
    uint32_t dtype;
    graft_transfer_device_t device;
    void *ptr;         /* the caller's memory */
    void *host;        /* what the network reads/writes: ptr, or a pinned
                          host shadow of device memory */
    uint64_t bytes;
    uint64_t n_chunks;
    uint64_t first_chunk; /* index of its first chunk in the endpoint's list */
    void *memh;           /* backend's handle of the mapped memory */
    void *rkey;           /* packed remote key, owned by the backend */
    size_t rkey_len;
    graft__host_alloc_t *alloc; /* the block it lies in, whose memh it borrows */
} graft__region_t;

typedef struct graft__transport_state graft__transport_state_t;

/*
 * A transport backend. The engine owns the region table, hashing and the
 * fence; a backend moves bytes.
 */
struct graft_transport_ops {
    const char *name;
    /* Bring up the transport: contexts, listener, progress thread. */
    graft_status_t (*init)(graft_transfer_endpoint_t *ep);
    void (*fini)(graft_transfer_endpoint_t *ep);
    /* Make a region reachable (map it, pack its key). */
    graft_status_t (*region_map)(graft_transfer_endpoint_t *ep, graft__region_t *r);
    void (*region_unmap)(graft_transfer_endpoint_t *ep, graft__region_t *r);
    /* Pull every region; fills the report. */
    graft_status_t (*pull)(graft_transfer_endpoint_t *ep, const graft_transfer_pull_options_t *o,
                           graft_transfer_report_t *report);
    /* Allocate host memory that peers can read one-sidedly; fills ptr, bytes
     * and memh of @a. NULL: the engine hands out plain aligned memory. */
    graft_status_t (*host_alloc)(graft_transfer_endpoint_t *ep, uint64_t bytes,
                                 graft__host_alloc_t *a);
    void (*host_free)(graft_transfer_endpoint_t *ep, graft__host_alloc_t *a);
    /* Donor side of a pairwise transport (NCCL); NULL for one-sided ones. */
    graft_status_t (*serve_pair)(graft_transfer_endpoint_t *ep, uint64_t step,
                                 const graft_transfer_nccl_options_t *o);
    /* Send a short message to the endpoint at @p address (graft_transfer_msg_send);
     * NULL: the backend has no message channel. */
    graft_status_t (*msg_send)(graft_transfer_endpoint_t *ep, const char *address,
                               const void *msg, size_t len, uint64_t deadline_ns);
    /* Close the connections msg_send keeps. */
    void (*msg_forget)(graft_transfer_endpoint_t *ep);
};

extern const struct graft_transport_ops graft__ucx_ops;

/* NCCL pairs: transfer/nccl.c, or transfer/nonccl.c's stub (GRAFT_ENOTSUP)
 * in a build without CUDA. */
extern const struct graft_transport_ops graft__nccl_ops;

/* A recipient count per step, for the fence: of the serve (serve_gen)
 * that began last for that step. A job that rolls back to a checkpoint
 * serves the same step again; completions of the earlier serve must not
 * open the new one's fence. */
typedef struct graft__fence_slot {
    uint64_t step;
    uint64_t gen; /* 0 until a serve or a completion claims it */
    uint32_t done;
    bool used;
} graft__fence_slot_t;

#define GRAFT__FENCE_SLOTS 16

struct graft_transfer_endpoint {
    /* configuration (strings owned) */
    char *listen_address;
    char *advertise_address; /* NULL: publish the listening address */
    uint16_t port;
    uint8_t job_secret[GRAFT_TRANSFER_SECRET_MAX_BYTES];
    size_t job_secret_len;
    uint32_t group;
    uint32_t rank;
    uint64_t chunk_bytes;
    uint32_t hash_threads;
    uint32_t max_recipients; /* served at once; the rest queue */

    const struct graft_transport_ops *ops;
    graft__transport_state_t *transport;
    char address[64];

    graft__region_t *regions;
    size_t n_regions;
    /* graft_transfer_host_alloc() blocks; guarded by lock. The backend frees
     * what is left at fini, before its context goes. */
    graft__host_alloc_t *host_allocs;
    uint64_t total_chunks;
    uint64_t total_bytes;
    uint64_t layout_hash;
    XXH3_state_t layout_state; /* regions only append: the hash is streamed */

    /* Guards serving state, hashes and fence slots. */
    pthread_mutex_t lock;
    pthread_cond_t cond;

    /* serving (donor) */
    bool serving;
    uint64_t serve_step;
    /* graft_transfer_serve_expect(): expect_step will be served; until
     * then its requests queue. */
    bool expecting;
    uint64_t expect_step;
    /* graft_transfer_serve_recipients(): the groups served; none = any. */
    uint32_t *recipients;
    size_t n_recipients;
    uint32_t serve_peak; /* most recipients admitted at once */
    atomic_uint_fast64_t refused; /* requests refused for who sent them */
    atomic_uint_fast64_t serve_failures; /* consecutive: see graft_transfer_serve_failures */
    uint64_t serve_gen; /* bumped by every begin/end: stale connections stop */
    uint64_t *hashes;   /* one per chunk, valid where hash_done is set */
    atomic_uchar *hash_done;
    atomic_uint_fast64_t hash_next;
    atomic_bool hash_stop;
    pthread_t *hash_tids;
    uint32_t n_hash_tids;

    graft__fence_slot_t fence[GRAFT__FENCE_SLOTS];
    /* Followers (graft_transfer_followers_wanted/_wait), under lock: the
     * connections whose follower asked for a step it was not served and
     * has been neither admitted since nor lost; the step the latest ask
     * named, and when; when a follower last asked or was admitted;
     * followers admitted in this serve generation that have not reported
     * done or been lost. */
    uint32_t follow_wanting;
    uint64_t follow_want_step;
    uint64_t follow_want_ns;
    uint64_t follow_seen_ns;
    uint32_t follow_owed;

    atomic_bool pulling;
    atomic_bool cancel;

    /* Short messages received (msgbox.c): a bounded FIFO under msg_lock. */
    pthread_mutex_t msg_lock;
    pthread_cond_t msg_cond;
    struct graft__msg *msg_head, *msg_tail;
    size_t n_msgs;
    uint64_t msgs_dropped;
    struct graft__msg_sender *msg_sender; /* the backend's connections for sending */
};

/* Queue a received message for graft_transfer_msg_recv(); called by the
 * backend's progress thread. Messages beyond the inbox's bound are dropped
 * (counted and logged): the receiver's protocol times out on them. */
void graft__transfer_msg_deliver(graft_transfer_endpoint_t *ep, const void *data, size_t len);
/* The inbox: made with the endpoint; destroyed after the backend stopped. */
GRAFT_WUR graft_status_t graft__transfer_msgbox_init(graft_transfer_endpoint_t *ep);
void graft__transfer_msgbox_destroy(graft_transfer_endpoint_t *ep);

/* Region lookup helpers. */
static inline uint64_t graft__region_chunk_len(const graft_transfer_endpoint_t *ep,
                                               const graft__region_t *r, uint64_t chunk)
{
    uint64_t off = chunk * ep->chunk_bytes;
    return GRAFT_MIN(ep->chunk_bytes, r->bytes - off);
}

/* transfer_fence.c: the fence and the groups served. */
/* Record a recipient of @p step done (or lost) under the serve of
 * generation @p gen (ep->serve_gen while it was served); one of an earlier
 * serve of the same step is not counted. */
void graft__transfer_fence_note(graft_transfer_endpoint_t *ep, uint64_t step, uint64_t gen);
/* A new serve of @p step (under ep->lock): a new generation, and a new
 * count, since the step may have been served before (a rollback). */
void graft__transfer_fence_restart(graft_transfer_endpoint_t *ep, uint64_t step);

/* A follower admitted under serve generation @p gen is done or lost. */
void graft__transfer_follow_note(graft_transfer_endpoint_t *ep, uint64_t gen);
/* A follower's connection asks for @p step, which it is not served (under
 * ep->lock); *wanting is the connection's own flag. */
void graft__transfer_follow_ask(graft_transfer_endpoint_t *ep, bool *wanting, uint64_t step);
/* Its ask is over: admitted, or the connection lost (takes ep->lock when
 * @p locked is false). */
void graft__transfer_follow_unask(graft_transfer_endpoint_t *ep, bool *wanting, bool locked);

/* Whether the serve admits recipient group @p group
 * (graft_transfer_serve_recipients()). Caller holds ep->lock. */
bool graft__transfer_serves_group(const graft_transfer_endpoint_t *ep, uint32_t group);

/* transfer_auth.c: the handshake's MACs (docs/SECURITY.md). */
typedef struct graft__xfer_request_fields {
    uint64_t step, layout_hash, request_id;
    uint32_t group, rank;
} graft__xfer_request_fields_t;
/* The recipient's: over the donor's nonce, its own, and what it asks. */
GRAFT_WUR graft_status_t graft__xfer_request_mac(const uint8_t *secret, size_t secret_len,
                                                 const uint8_t *donor_nonce,
                                                 const uint8_t *recipient_nonce,
                                                 const graft__xfer_request_fields_t *f,
                                                 uint8_t out[GRAFT_MAC_BYTES]);
/*
 * The seal of the donor's answers to an authenticated request: the
 * TransferManifest's packed bytes, then its field 14 (`seal`) written last
 * as GRAFT__XFER_SEAL_BYTES bytes: the tag byte, the length 32, and
 * HMAC-SHA256(secret, "graft/transfer/manifest/v2" || Nr || Nd || seq ||
 * every byte before the tag), seq as an 8-byte big-endian word: the number
 * of answers the donor sealed before on the connection (0, 1, ...).
 */
#define GRAFT__XFER_SEAL_TAG 0x72u /* field 14, length-delimited */
#define GRAFT__XFER_SEAL_BYTES (2u + GRAFT_MAC_BYTES)
GRAFT_WUR graft_status_t graft__xfer_seal_mac(const uint8_t *secret, size_t secret_len,
                                              const uint8_t *recipient_nonce,
                                              const uint8_t *donor_nonce, uint64_t seq,
                                              const uint8_t *body, size_t body_len,
                                              uint8_t out[GRAFT_MAC_BYTES]);
/* Write the seal of the @p body_len bytes at @p buf behind them; @p buf has
 * GRAFT__XFER_SEAL_BYTES more bytes of room. */
GRAFT_WUR graft_status_t graft__xfer_seal(const uint8_t *secret, size_t secret_len,
                                          const uint8_t *recipient_nonce,
                                          const uint8_t *donor_nonce, uint64_t seq, uint8_t *buf,
                                          size_t body_len);
/* Check the seal of answer number @p seq (@p len bytes at @p msg), before
 * anything else reads it. GRAFT_OK: authentic, its bytes before the seal
 * are the first *@p body_len_p. GRAFT_ETOKEN: not authentic; *@p sealed_p
 * says whether it ended as a seal does at all (a refusal sent before the
 * request was authenticated does not). GRAFT_ENOMEM, GRAFT_ESYS: not
 * checked. */
GRAFT_WUR graft_status_t graft__xfer_unseal(const uint8_t *secret, size_t secret_len,
                                            const uint8_t *recipient_nonce,
                                            const uint8_t *donor_nonce, uint64_t seq,
                                            const uint8_t *msg, size_t len, size_t *body_len_p,
                                            bool *sealed_p);

/* transfer_accept.c: what a recipient checks of a donor's answer once its
 * seal held, apart from the connection. */
struct Graft__TransferManifest;
/* A refusal's status as the pull reports it: a peer-class status,
 * GRAFT_EFORMAT or GRAFT_ENOMEM as it is; anything else GRAFT_EPROTO. */
graft_status_t graft__xfer_refusal_status(int32_t status);
/* A first manifest (status 0) against the table of @p ep for @p step: the
 * step, layout hash, chunk size, and each region's name and size in order,
 * with a remote key of 1 to @p max_key bytes for each non-empty one. Logs
 * what differs as donor @p donor's. GRAFT_OK or GRAFT_EPROTO. */
GRAFT_WUR graft_status_t graft__xfer_manifest_check(const graft_transfer_endpoint_t *ep,
                                                    uint64_t step,
                                                    const struct Graft__TransferManifest *m,
                                                    size_t max_key, uint32_t donor);
/* Every hash part of @p m names a region of @p ep and chunks inside it.
 * GRAFT_OK or GRAFT_EPROTO. */
GRAFT_WUR graft_status_t graft__xfer_hash_parts_check(const graft_transfer_endpoint_t *ep,
                                                      const struct Graft__TransferManifest *m);

#endif /* GRAFT_TRANSFER_INT_H */
