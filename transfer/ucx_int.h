/*
 * Shared by the files of the UCX backend: ucx.c (endpoint, regions, host
 * memory), ucx_wire.c (pieces both sides use), ucx_donor.c (serving),
 * ucx_donor_conns.c (the donor's connections), ucx_strangers.c
 * (connections not authenticated yet), ucx_shm.c (shared memory for
 * authenticated recipients on this host), ucx_pull*.c (pulling, see
 * ucx_pull.h), ucx_msg.c (short messages). Each calls only the files below
 * it: ucx.c -> ucx_donor.c -> ucx_donor_conns.c -> ucx_strangers.c and
 * ucx_shm.c; ucx.c -> ucx_pull*.c and ucx_msg.c; all -> ucx_wire.c. Not
 * installed.
 */
#ifndef GRAFT_UCX_INT_H
#define GRAFT_UCX_INT_H

#include "transfer_int.h"

#include <ucp/api/ucp.h>

#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>

/* A request bigger than this is refused unread. */
#define REQUEST_MAX_BYTES (64u << 10)
/* A manifest bigger than this is a protocol error. */
#define MANIFEST_MAX_BYTES (512u << 20)
/* Hashes per streamed manifest part. */
#define HASHES_PER_PART 16384u
/* How long teardown waits for UCX to finish closing. */
#define TEARDOWN_NS (3000ull * 1000000ull)
/* A queued recipient asks again this often; a donor forgets one that has
 * not asked for QUEUE_STALE_NS (it gave up, or its process died). */
#define QUEUE_ASK_NS (100ull * 1000000ull)
#define QUEUE_STALE_NS (2000ull * 1000000ull)
/* Connections that have not sent an authenticated request yet: at most
 * this many at once, the oldest closed to make room; each closed after
 * AUTH_DEADLINE_NS. */
#define MAX_UNAUTH_CONNS 16u
#define AUTH_DEADLINE_NS (2000ull * 1000000ull)
/* When all are taken, the oldest makes room only if it is at least this
 * old (a recipient authenticates within a round trip); otherwise the new
 * connection is refused: told to come back (REFUSE_RETRY_MS), never
 * challenged, and closed REFUSE_HOLD_NS later. */
#define UNAUTH_EVICT_NS (250ull * 1000000ull)
#define REFUSE_HOLD_NS (250ull * 1000000ull)
/* What a refused connection is told: connect again after about this. */
#define REFUSE_RETRY_MS 50u
/* The donor's progress thread calls ucp_worker_progress() at most this
 * many times in a row before it serves what came in. */
#define PROGRESS_BATCH 64u
/* At most one warning about refused or closed strangers this often. */
#define STRANGER_WARN_NS (10000ull * 1000000ull)

/* A peer's packed remote key: at most this long, unpacked from a copy
 * followed by RKEY_PAD zero bytes (ucx_wire.c says why). */
#define RKEY_MAX_BYTES 4096u
#define RKEY_PAD 256u
/* A donor's shared-memory worker address (ucx_shm.c): at most this long. */
#define SHM_ADDRESS_MAX_BYTES 8192u

/* Header of a CHUNK_DATA message: the request's echo, its tag, a status. */
typedef struct chunk_hdr {
    uint64_t echo;
    uint32_t tag;
    int32_t status;
} chunk_hdr_t;

/* A received message waiting for the progress loop: AM callbacks run inside
 * ucp_worker_progress(), where sending and ep management are best avoided. */
typedef struct ucx_msg {
    struct ucx_msg *next;
    unsigned id;
    ucp_ep_h reply_ep;
    /* Came on this connection's shared-memory worker (reply_ep is there);
     * NULL: on the listener's worker. */
    struct ucx_conn *conn;
    uint64_t header;
    bool has_header;
    bool too_large;
    bool ready; /* a recipient's answer: all its bytes are here */
    size_t len;
    uint8_t data[];
} ucx_msg_t;

typedef struct msg_queue {
    ucx_msg_t *head;
    ucx_msg_t **tail;
} msg_queue_t;

/* One accepted connection (donor side), on the listener's worker: one
 * worker and one asynchronous context for every connection, so that UCX
 * never moves a socket between asynchronous contexts (a flood of
 * connections made and closed made UCX 1.13 abort on that). That worker's
 * context has no shared memory (ucx.c says why). */
typedef struct ucx_conn {
    struct ucx_conn *next;
    struct graft__transport_state *t;
    uint64_t accepted_ns;
    bool authed;   /* sent a request with a valid MAC */
    bool messaged; /* sent a message (graft_transfer_msg_send) */
    ucp_ep_h ep;
    bool close_due;             /* failed, and seen by the reaper once */
    ucs_status_ptr_t close_req; /* on t->closing: the forced close under way */
    bool failed;
    bool active;         /* manifest sent, hashes streaming */
    bool final_sent;
    uint64_t gen;        /* ep->serve_gen when activated */
    uint64_t cursor;     /* next chunk whose hash is to be sent */
    size_t region_cursor;
    uint64_t echo;       /* AM header the recipient chose */
    /* A manifest of fence_step went out and no TransferDone came back yet:
     * if the connection is lost first, the loss counts for the fence. */
    bool fence_owed;
    uint64_t fence_step;
    /* It asked as a follower (GRAFT_TRANSFER_FOLLOWER_GROUP): its done or
     * loss goes to ep->follow_owed, never to the fence; follow_wanting: it
     * asked for a step not served and counts in ep->follow_wanting. */
    bool follower;
    bool follow_wanting;
    /* Answered GRAFT_EBUSY: waiting for admission, in queue_seq order. A
     * queued recipient asks again every QUEUE_ASK_NS; one that stopped
     * asking for QUEUE_STALE_NS holds no place. */
    bool queued;
    uint64_t queue_seq;
    uint64_t asked_ns;
    /* The handshake (transfer_auth.c): our nonce, sent as the connection
     * was accepted, and the recipient's, from its authenticated request. */
    uint8_t nonce[GRAFT_NONCE_BYTES];
    bool challenged;
    uint8_t peer_nonce[GRAFT_NONCE_BYTES];
    /* Answers sealed so far on this connection: the next one's sequence
     * number (transfer_auth.c, docs/SECURITY.md). */
    uint64_t seq;
    /* The peer connected from one of our own addresses: it may be offered
     * shared memory once authenticated (ucx_shm.c). */
    bool peer_local;
    /* That offer: a worker on t->shm_ctx for this connection alone, its
     * wake-up descriptor and address, and the ticket its requests carry. */
    ucp_worker_h shm_worker;
    int shm_efd;
    ucp_address_t *shm_address;
    size_t shm_address_len;
    /* Where its answers went: endpoints UCX made for whoever sent chunk
     * requests there (the recipient; more only if its address leaked),
     * closed before the worker. A request from a further one is dropped. */
    ucp_ep_h shm_reply_eps[4];
    unsigned n_shm_reply_eps;
    uint8_t shm_ticket[GRAFT_MAC_BYTES];
} ucx_conn_t;

struct graft__transport_state {
    graft_transfer_endpoint_t *ep;
    /* Two contexts (docs/SECURITY.md, "One layer below: UCX"): ctx has
     * UCP_FEATURE_RMA, maps memory and runs the workers of pulls (which
     * connect only to donors they chose); srv_ctx has no RMA and no tcp
     * PUT and no shared memory, and runs every worker a stranger can
     * reach: the listener's, which holds every accepted connection, and
     * the message sender's. */
    ucp_context_h ctx;
    ucp_context_h srv_ctx;
    /* Shared-memory transports only, for authenticated recipients on this
     * host, a worker each (ucx_shm.c); NULL when UCX_TLS allows none. */
    ucp_context_h shm_ctx;
    char net_dev[64]; /* UCX_NET_DEVICES for our contexts; "" = UCX's default */
    ucp_worker_h worker; /* the listener's, and every connection's */
    /* Refused connections: accepted but never challenged, and closed by
     * the progress loop REFUSE_HOLD_NS later.
     * UCX 1.13 under a flood can fail an assertion in its tcp connection
     * manager (tcp_sockcm_ep.c:416) and abort the process when a
     * connection is rejected, or closed, before its handshake is done. */
    ucp_ep_h refused[1024];
    uint64_t refused_ns[1024];
    size_t n_refused;
    /* Strangers turned away since the last warning, and its time, for
     * each reason: 0 closed to make room, 1 at the deadline, 2 refused. */
    uint64_t strangers[3];
    uint64_t stranger_warn_ns[3];
    ucp_listener_h listener;
    int efd;
    pthread_t thread;
    bool thread_started;
    atomic_bool stop;
    ucx_conn_t *conns;
    ucx_conn_t *closing; /* closed, freed once UCX is done with them */
    uint64_t queue_seq; /* the last place given */
    msg_queue_t msgs;
    bool rkey_layout_unknown; /* our own keys do not have the layout checked */
};

/* ucx_wire.c */
void graft__ucx_msgq_init(msg_queue_t *q);
void graft__ucx_msgq_push(msg_queue_t *q, ucx_msg_t *m);
ucx_msg_t *graft__ucx_msgq_pop(msg_queue_t *q);
void graft__ucx_msgq_clear(msg_queue_t *q);

/* A UCX status as graft's. */
graft_status_t graft__ucx_status(ucs_status_t st);
/* "a.b.c.d:port" -> sockaddr. */
GRAFT_WUR graft_status_t graft__ucx_parse_address(const char *s, struct sockaddr_in *sa);
/* A single-threaded worker on @p ctx. */
GRAFT_WUR graft_status_t graft__ucx_worker_create(ucp_context_h ctx, ucp_worker_h *w_p);
/* A client connection to the listener at @p sa, with peer error handling. */
ucs_status_t graft__ucx_connect(ucp_worker_h w, const struct sockaddr_in *sa,
                                ucp_err_handler_cb_t err_cb, void *err_arg, ucp_ep_h *ep_p);
/* The context of the endpoint's workers that strangers can reach (no RMA). */
ucp_context_h graft__ucx_context(graft_transfer_endpoint_t *ep);
/* A context for @p t's workers: with UCP_FEATURE_RMA when @p rma, else
 * with tcp PUT off and no shared memory; on t->net_dev. */
GRAFT_WUR graft_status_t graft__ucx_context_create(graft__transport_state_t *t, bool rma,
                                                   ucp_context_h *ctx_p);
/* The UCX_TLS of the strangers' context: the user's list @p user (NULL:
 * none set) without shared-memory transports, into @p out. */
void graft__ucx_strangers_tls(const char *user, char *out, size_t size);

/* Resolve a host name or dotted address. */
GRAFT_WUR graft_status_t graft__ucx_resolve_host(const char *name, struct in_addr *in);
/* The listener's address: "host", "host:port" or an interface name, with
 * @p port where the string names none. */
GRAFT_WUR graft_status_t graft__ucx_listen_sockaddr(const char *s, uint16_t port,
                                                    struct sockaddr_in *sa);
/* Send active message @p id: @p len bytes packed at buf + 8, the 8-byte
 * header at buf. Takes ownership of @p buf. */
GRAFT_WUR graft_status_t graft__ucx_am_send_owned(ucp_ep_h uep, unsigned id, uint8_t *buf,
                                                  size_t len, bool want_reply);
/* Pack a protobuf message behind @p header and send it. */
GRAFT_WUR graft_status_t graft__ucx_am_send(ucp_ep_h uep, unsigned id, uint64_t header,
                                            const ProtobufCMessage *msg, bool want_reply);
/* Whether a peer's packed remote key has the layout ucp_rkey_pack() makes
 * (ucp_ep_rkey_unpack() trusts it); learn() calibrates on our own key. */
bool graft__ucx_rkey_layout_ok(const uint8_t *k, size_t len);
void graft__ucx_rkey_layout_learn(bool *unknown, const graft__region_t *r);
GRAFT_WUR graft_status_t graft__ucx_set_am_handler(ucp_worker_h w, unsigned id,
                                                   ucp_am_recv_callback_t cb, void *arg);
/* A handler that drops the message for every id below GRAFT__UCX_AM_IDS
 * (set ours after it): a message for an id without one made UCX 1.13
 * crash in ucp_am_handler (seen in a flooding client); strangers reach
 * the listener's worker (refused connections) and the connections'. */
#define GRAFT__UCX_AM_IDS 32u
GRAFT_WUR graft_status_t graft__ucx_drop_all(ucp_worker_h w);
/* A donor's active message for the progress loop: onto t->msgs, from
 * connection @p conn's shared-memory worker, or from the listener's when
 * NULL. */
ucs_status_t graft__ucx_donor_enqueue(graft__transport_state_t *t, ucx_conn_t *conn, unsigned id,
                                      const void *header, size_t header_length, void *data,
                                      size_t length, const ucp_am_recv_param_t *param);

/* ucx_donor_conns.c */
void graft__ucx_conn_handler(ucp_conn_request_h req, void *arg);
/* The connection whose endpoint is @p uep, or NULL. */
ucx_conn_t *graft__ucx_conn_find(graft__transport_state_t *t, ucp_ep_h uep);
/* Set the donor's message handlers on the listener's worker. */
GRAFT_WUR graft_status_t graft__ucx_donor_handlers(graft__transport_state_t *t);
/* Start a forced close of @p c, unlinked by the caller: onto t->closing. */
void graft__ucx_conn_close(graft__transport_state_t *t, ucx_conn_t *c);
/* Free the connections whose close is done; all of them when @p all
 * (teardown, after waiting at most TEARDOWN_NS). */
void graft__ucx_closing_reap(graft__transport_state_t *t, bool all);
/* Expire strangers, close the failed connections (one progress after they
 * failed), count a lost recipient for the fence, free closed ones. */
void graft__ucx_conns_reap(graft__transport_state_t *t);

/* ucx_donor.c */
void *graft__ucx_progress_thread(void *arg);

/* ucx_strangers.c */
/* Room for one more pending connection (the oldest marked failed if it
 * had its chance); false: refuse the new one. */
bool graft__ucx_make_room(graft__transport_state_t *t);
void graft__ucx_conn_refuse(graft__transport_state_t *t, ucp_conn_request_h req);
void graft__ucx_refused_close(graft__transport_state_t *t);
void graft__ucx_conns_expire(graft__transport_state_t *t);
/* The parameters of accepting @p req, with peer error handling. */
void graft__ucx_accept_params(ucp_ep_params_t *prm, ucp_conn_request_h req,
                              ucp_err_handler_cb_t cb, void *arg);

/* ucx_shm.c: shared memory for authenticated recipients on this host. */
/* Our contexts rely on shared memory's peer error handling (UCX 1.13
 * offers shared memory on a connection with peer error handling only
 * then), unless the user chose otherwise. */
void graft__ucx_mm_error_handling(ucp_config_t *cfg);
/* Whether UCX_TLS name @p tok (@p n bytes) is a shared-memory transport or
 * alias. */
bool graft__ucx_tls_is_shm(const char *tok, size_t n);
/* The UCX_TLS of the shared-memory context: the shared-memory transports
 * of the user's list @p user (NULL: none set), into @p out; false when it
 * allows none. */
bool graft__ucx_shm_tls(const char *user, char *out, size_t size);
/* Whether UCX @p major.@p minor (before 1.22: a flood of connections can
 * crash its async thread) listening on @p listen_addr (network order; not
 * loopback: other hosts reach it) deserves the caveat at endpoint creation. */
bool graft__ucx_flood_caveat(unsigned major, unsigned minor, in_addr_t listen_addr);
/* Make t->shm_ctx, or leave it NULL (no shared memory offered). */
void graft__ucx_shm_init(graft__transport_state_t *t);
/* Whether @p sa (a peer's address) is one of this host's. */
bool graft__ucx_addr_is_local(const struct sockaddr *sa);
/* Make @p c's offer on first use (c->shm_address and c->shm_ticket);
 * false when nothing is offered. */
bool graft__ucx_conn_shm_offer(graft__transport_state_t *t, ucx_conn_t *c);
/* Remember @p reply, an endpoint on @p c's worker an answer goes out on;
 * false when it is one too many (the request is dropped). */
bool graft__ucx_conn_shm_reply_note(ucx_conn_t *c, ucp_ep_h reply);
/* Destroy @p c's worker, if it has one (its requests complete, failed). */
void graft__ucx_conn_shm_close(ucx_conn_t *c);
/* Progress every live connection's worker; the work done. */
unsigned graft__ucx_shm_progress(graft__transport_state_t *t);
/* Arm every live connection's worker and add its descriptor to @p pfds
 * (room for @p max); false when one has work already (do not sleep). */
bool graft__ucx_shm_arm(graft__transport_state_t *t, struct pollfd *pfds, size_t max,
                        size_t *n_p);

#ifdef GRAFT_TEST_FAULTS
/* Chunk requests on a donor's shared-memory connection go without the
 * ticket (a test of the donor's check). */
extern volatile int graft__ucx_test_no_ticket;
#endif

/* ucx_pull.c */
GRAFT_WUR graft_status_t graft__ucx_pull(graft_transfer_endpoint_t *ep,
                                         const graft_transfer_pull_options_t *o,
                                         graft_transfer_report_t *rep);

/* ucx_msg.c: the sending half of the message channel. */
graft_status_t graft__ucx_msg_send(graft_transfer_endpoint_t *ep, const char *address,
                                   const void *msg, size_t len, uint64_t deadline_ns);
void graft__ucx_msg_forget(graft_transfer_endpoint_t *ep);
/* Free the sender (backend teardown, before the context goes). */
void graft__ucx_msg_fini(graft_transfer_endpoint_t *ep);

#endif /* GRAFT_UCX_INT_H */
