/*
 * UCX backend of the transfer engine.
 *
 * Donor side: one worker driven by a progress thread. It accepts
 * connections on the listener, answers TransferRequests (active messages)
 * with a manifest, streams chunk hashes as the hashing threads finish them,
 * and counts TransferDone messages for the fence. Recipients read the
 * regions with one-sided gets, so the donor's training thread never
 * participates.
 *
 * Recipient side: graft_transfer_pull() creates a worker of its own on the
 * endpoint's context (the context is shared between workers, so the donor
 * side keeps serving meanwhile) and drives it from the calling thread.
 */
#include "ucx_int.h"

#include "proto/graft.pb-c.h"
#include <xxhash.h>

#include <arpa/inet.h>
#include <assert.h>
#include <errno.h>
#include <ifaddrs.h>
#include <netinet/in.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

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

/* ------------------------------------------------------------------------ */
/* Shared pieces                                                            */
/* ------------------------------------------------------------------------ */

/* A received message waiting for the progress loop: AM callbacks run inside
 * ucp_worker_progress(), where sending and ep management are best avoided. */
typedef struct ucx_msg {
    struct ucx_msg *next;
    unsigned id;
    ucp_ep_h reply_ep;
    uint64_t header;
    bool has_header;
    bool too_large;
    size_t len;
    uint8_t data[];
} ucx_msg_t;

typedef struct msg_queue {
    ucx_msg_t *head;
    ucx_msg_t **tail;
} msg_queue_t;

static void msgq_init(msg_queue_t *q)
{
    q->head = NULL;
    q->tail = &q->head;
}

static void msgq_push(msg_queue_t *q, ucx_msg_t *m)
{
    m->next = NULL;
    *q->tail = m;
    q->tail = &m->next;
}

static ucx_msg_t *msgq_pop(msg_queue_t *q)
{
    ucx_msg_t *m = q->head;
    if (m != NULL) {
        q->head = m->next;
        if (q->head == NULL)
            q->tail = &q->head;
    }
    return m;
}

static void msgq_clear(msg_queue_t *q)
{
    ucx_msg_t *m;
    while ((m = msgq_pop(q)) != NULL)
        graft_free(m);
}

graft_status_t graft__ucx_status(ucs_status_t st)
{
    switch (st) {
    case UCS_OK:
        return GRAFT_OK;
    case UCS_ERR_NO_MEMORY:
        return GRAFT_ENOMEM;
    case UCS_ERR_UNREACHABLE:
    case UCS_ERR_REJECTED:
        return GRAFT_EPEER_UNREACHABLE;
    case UCS_ERR_TIMED_OUT:
    case UCS_ERR_ENDPOINT_TIMEOUT:
        return GRAFT_EPEER_TIMEOUT;
    case UCS_ERR_CONNECTION_RESET:
        return GRAFT_EPEER;
    case UCS_ERR_CANCELED:
        return GRAFT_ECANCELED;
    default:
        return GRAFT_ETRANSPORT;
    }
}

/* "a.b.c.d:port" -> sockaddr. */
graft_status_t graft__ucx_parse_address(const char *s, struct sockaddr_in *sa)
{
    char host[INET_ADDRSTRLEN];
    const char *colon = strrchr(s, ':');
    char *end = NULL;
    unsigned long port;
    size_t hl;

    if (colon == NULL)
        return GRAFT_EINVAL;
    hl = (size_t)(colon - s);
    if (hl == 0 || hl >= sizeof(host))
        return GRAFT_EINVAL;
    memcpy(host, s, hl);
    host[hl] = '\0';
    errno = 0;
    port = strtoul(colon + 1, &end, 10);
    if (errno != 0 || end == colon + 1 || *end != '\0' || port == 0 || port > 65535)
        return GRAFT_EINVAL;
    memset(sa, 0, sizeof(*sa));
    sa->sin_family = AF_INET;
    sa->sin_port = htons((uint16_t)port);
    if (inet_pton(AF_INET, host, &sa->sin_addr) != 1)
        return GRAFT_EINVAL;
    return GRAFT_OK;
}

/* @name: an IPv4 address, or the name of an interface whose first IPv4
 * address is taken. GRAFT_EINVAL when it is neither, logged unless @quiet. */
static graft_status_t resolve_host_q(const char *name, struct in_addr *in, bool quiet)
{
    struct ifaddrs *ifs = NULL;
    bool found_if = false;
    graft_status_t status = GRAFT_EINVAL;

    if (inet_pton(AF_INET, name, in) == 1)
        return GRAFT_OK;
    if (getifaddrs(&ifs) != 0) {
        GRAFT_ERROR(GRAFT__XFER_MOD, "getifaddrs: %s", strerror(errno));
        return GRAFT_ESYS;
    }
    for (const struct ifaddrs *i = ifs; i != NULL; i = i->ifa_next) {
        if (i->ifa_name == NULL || strcmp(i->ifa_name, name) != 0)
            continue;
        found_if = true;
        if (i->ifa_addr != NULL && i->ifa_addr->sa_family == AF_INET) {
            *in = ((const struct sockaddr_in *)(const void *)i->ifa_addr)->sin_addr;
            status = GRAFT_OK;
            break;
        }
    }
    freeifaddrs(ifs);
    if (status != GRAFT_OK && !quiet)
        GRAFT_ERROR(GRAFT__XFER_MOD, found_if ? "interface '%s' has no IPv4 address"
                                              : "'%s' is neither an IPv4 address nor an interface",
                    name);
    return status;
}

static graft_status_t resolve_host(const char *name, struct in_addr *in)
{
    return resolve_host_q(name, in, false);
}

/* Where to listen: "host" or "host:port", host an IPv4 address or an
 * interface name (a whole string that names an interface, e.g. the alias
 * "eth0:1", is a name, not a name and a port); @p port is the configured
 * one, which a port in the string must agree with when both are given. */
static graft_status_t listen_sockaddr(const char *s, uint16_t port, struct sockaddr_in *sa)
{
    char host[64];
    struct in_addr in;
    const char *colon = strrchr(s, ':');
    unsigned long p = port;
    graft_status_t status;

    memset(sa, 0, sizeof(*sa));
    if (strlen(s) >= sizeof(host) || s[0] == '\0') {
        GRAFT_ERROR(GRAFT__XFER_MOD, "bad listen address '%s'", s);
        return GRAFT_EINVAL;
    }
    snprintf(host, sizeof(host), "%s", s);
    if (colon != NULL && resolve_host_q(s, &in, true) != GRAFT_OK) {
        char *end = NULL;
        errno = 0;
        p = strtoul(colon + 1, &end, 10);
        host[colon - s] = '\0';
        if (errno != 0 || end == colon + 1 || *end != '\0' || p > 65535 || host[0] == '\0' ||
            (port != 0 && p != 0 && p != port)) {
            GRAFT_ERROR(GRAFT__XFER_MOD, "bad listen address '%s' (port %u configured)", s,
                        (unsigned)port);
            return GRAFT_EINVAL;
        }
        if (p == 0)
            p = port;
    }
    status = resolve_host(host, &in);
    if (status != GRAFT_OK)
        return status;
    sa->sin_family = AF_INET;
    sa->sin_port = htons((uint16_t)p);
    sa->sin_addr = in;
    return GRAFT_OK;
}

static void send_done_cb(void *request, ucs_status_t status, void *user_data)
{
    (void)status;
    graft_free(user_data);
    ucp_request_free(request);
}

/*
 * Send @p len bytes already packed at buf + 8 with the 8-byte AM header at
 * buf (UCX 1.13 needs the header alive until completion, so it travels in
 * the same allocation). Takes ownership of @p buf.
 */
static graft_status_t am_send_owned(ucp_ep_h uep, unsigned id, uint8_t *buf, size_t len,
                                    bool want_reply)
{
    ucp_request_param_t prm;
    ucs_status_ptr_t req;

    memset(&prm, 0, sizeof(prm));
    prm.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA |
                       UCP_OP_ATTR_FIELD_FLAGS;
    prm.cb.send = send_done_cb;
    prm.user_data = buf;
    prm.flags = want_reply ? UCP_AM_SEND_FLAG_REPLY : 0;
    req = ucp_am_send_nbx(uep, id, buf, sizeof(uint64_t), buf + sizeof(uint64_t), len, &prm);
    if (req == NULL) {
        graft_free(buf);
        return GRAFT_OK;
    }
    if (UCS_PTR_IS_ERR(req)) {
        GRAFT_WARN(GRAFT__XFER_MOD, "am send: %s", ucs_status_string(UCS_PTR_STATUS(req)));
        graft_free(buf);
        return graft__ucx_status(UCS_PTR_STATUS(req));
    }
    return GRAFT_OK;
}

/* Allocate [header][packed message] and send it. */
static graft_status_t am_send_msg(ucp_ep_h uep, unsigned id, uint64_t header,
                                  const ProtobufCMessage *msg, bool want_reply)
{
    size_t len = protobuf_c_message_get_packed_size(msg);
    uint8_t *buf = graft__malloc(sizeof(uint64_t) + len + 1);
    if (buf == NULL)
        return GRAFT_ENOMEM;
    memcpy(buf, &header, sizeof(header));
    protobuf_c_message_pack(msg, buf + sizeof(uint64_t));
    return am_send_owned(uep, id, buf, len, want_reply);
}

/*
 * ucp_ep_rkey_unpack() takes no length: it trusts the key to be what
 * ucp_rkey_pack() made, so a key that a broken or hostile donor cut short or
 * made up would be read past its end (an empty one is a NULL dereference).
 * A key from the wire is therefore checked against the layout of UCX 1.x
 * packed keys first: a 64-bit map of memory domains, a memory-type byte, then
 * for each domain in the map a length byte and that many bytes (bytes after
 * them, such as device distances, are allowed). It is unpacked from a copy
 * followed by RKEY_PAD zero bytes, because a transport's unpack reads its
 * own fixed-size key whatever the length byte says. The endpoint checks its
 * own packed keys against the same layout; should one fail (a UCX with
 * another layout), the check is skipped and only the padded copy remains.
 */
#define RKEY_MAX_BYTES 4096u
#define RKEY_PAD 256u

static bool rkey_layout_ok(const uint8_t *k, size_t len)
{
    uint64_t map;
    size_t at = sizeof(map) + 1;
    if (k == NULL || len < at)
        return false;
    memcpy(&map, k, sizeof(map));
    for (unsigned bit = 0; bit < 64; bit++) {
        if ((map & (1ull << bit)) == 0)
            continue;
        if (at >= len)
            return false;
        at += 1u + (size_t)k[at];
        if (at > len)
            return false;
    }
    return true;
}

/* Calibrate the check above on a key this endpoint packed itself. */
static void rkey_layout_learn(bool *unknown, const graft__region_t *r)
{
    if (!*unknown && !rkey_layout_ok(r->rkey, r->rkey_len)) {
        *unknown = true;
        GRAFT_WARN(GRAFT__XFER_MOD, "UCX packs remote keys in an unknown layout (%zu bytes for "
                   "region '%s'): donors' keys are unpacked unchecked", r->rkey_len, r->name);
    }
}

/* ------------------------------------------------------------------------ */
/* Endpoint: context, worker, listener, progress thread                     */
/* ------------------------------------------------------------------------ */

/* One accepted connection (donor side), on a worker of its own: over
 * shared memory every sender to a worker writes into its one receive FIFO,
 * and a recipient killed in the middle of a write would leave an element
 * that is never completed, blocking every other recipient behind it. */
typedef struct ucx_conn {
    struct ucx_conn *next;
    ucp_worker_h worker;
    int efd;
    ucp_ep_h ep;
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
    /* Answered GRAFT_EBUSY: waiting for admission, in queue_seq order. A
     * queued recipient asks again every QUEUE_ASK_NS; one that stopped
     * asking for QUEUE_STALE_NS holds no place. */
    bool queued;
    uint64_t queue_seq;
    uint64_t asked_ns;
} ucx_conn_t;

struct graft__transport_state {
    graft_transfer_endpoint_t *ep;
    ucp_context_h ctx;
    ucp_worker_h worker; /* the listener's; each connection has its own */
    /* A connection's worker made ahead, while no connection is open: making
     * one takes several milliseconds that a new recipient would wait. */
    ucp_worker_h spare;
    int spare_efd;
    bool spare_failed; /* not retried until the next connection */
    ucp_listener_h listener;
    int efd;
    struct pollfd *pfds; /* the progress thread's: this worker's and the connections' */
    size_t pfds_cap;
    pthread_t thread;
    bool thread_started;
    atomic_bool stop;
    ucx_conn_t *conns;
    uint64_t queue_seq; /* the last place given */
    msg_queue_t msgs;
    bool rkey_layout_unknown; /* our own keys do not have the layout checked */
};

static void donor_conn_err_cb(void *arg, ucp_ep_h uep, ucs_status_t status)
{
    ucx_conn_t *c = arg;
    (void)uep;
    GRAFT_DEBUG(GRAFT__XFER_MOD, "recipient connection failed: %s", ucs_status_string(status));
    c->failed = true;
}

static graft_status_t set_am_handler(ucp_worker_h w, unsigned id, ucp_am_recv_callback_t cb,
                                     void *arg);
static ucs_status_t donor_request_cb(void *arg, const void *header, size_t header_length,
                                     void *data, size_t length, const ucp_am_recv_param_t *param);
static ucs_status_t donor_done_cb(void *arg, const void *header, size_t header_length,
                                  void *data, size_t length, const ucp_am_recv_param_t *param);
static ucs_status_t donor_chunk_req_cb(void *arg, const void *header, size_t header_length,
                                       void *data, size_t length,
                                       const ucp_am_recv_param_t *param);
static ucs_status_t msg_cb(void *arg, const void *header, size_t header_length, void *data,
                           size_t length, const ucp_am_recv_param_t *param);

/* A worker for one connection, with the donor's message handlers. */
static graft_status_t conn_worker_create(graft__transport_state_t *t, ucp_worker_h *w_p,
                                         int *efd_p)
{
    ucp_worker_h w = NULL;
    graft_status_t status = graft__ucx_worker_create(t->ctx, &w);
    if (status == GRAFT_OK && ucp_worker_get_efd(w, efd_p) != UCS_OK)
        status = GRAFT_ETRANSPORT;
    if (status == GRAFT_OK)
        status = set_am_handler(w, GRAFT__XFER_AM_REQUEST, donor_request_cb, t);
    if (status == GRAFT_OK)
        status = set_am_handler(w, GRAFT__XFER_AM_DONE, donor_done_cb, t);
    if (status == GRAFT_OK)
        status = set_am_handler(w, GRAFT__XFER_AM_CHUNK_REQ, donor_chunk_req_cb, t);
    if (status == GRAFT_OK)
        status = set_am_handler(w, GRAFT__XFER_AM_MSG, msg_cb, t);
    if (status != GRAFT_OK && w != NULL)
        ucp_worker_destroy(w);
    if (status == GRAFT_OK)
        *w_p = w;
    return status;
}

static graft_status_t conn_worker(graft__transport_state_t *t, ucx_conn_t *c)
{
    t->spare_failed = false;
    if (t->spare != NULL) {
        c->worker = t->spare;
        c->efd = t->spare_efd;
        t->spare = NULL;
        return GRAFT_OK;
    }
    return conn_worker_create(t, &c->worker, &c->efd);
}

static void conn_handler(ucp_conn_request_h req, void *arg)
{
    graft__transport_state_t *t = arg;
    ucp_ep_params_t prm;
    ucx_conn_t *c = graft__calloc(1, sizeof(*c));
    ucs_status_t st;

    if (c == NULL || conn_worker(t, c) != GRAFT_OK) {
        GRAFT_ERROR(GRAFT__XFER_MOD, "%s accepting a connection",
                    c == NULL ? "out of memory" : "no UCX worker");
        (void)ucp_listener_reject(t->listener, req);
        goto fail;
    }
    memset(&prm, 0, sizeof(prm));
    prm.field_mask = UCP_EP_PARAM_FIELD_CONN_REQUEST | UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE |
                     UCP_EP_PARAM_FIELD_ERR_HANDLER;
    prm.conn_request = req;
    prm.err_mode = UCP_ERR_HANDLING_MODE_PEER;
    prm.err_handler.cb = donor_conn_err_cb;
    prm.err_handler.arg = c;
    st = ucp_ep_create(c->worker, &prm, &c->ep);
    if (st != UCS_OK) {
        GRAFT_WARN(GRAFT__XFER_MOD, "accepting a connection: %s", ucs_status_string(st));
        goto fail;
    }
    c->next = t->conns;
    t->conns = c;
    return;
fail:
    if (c != NULL && c->worker != NULL)
        ucp_worker_destroy(c->worker);
    graft_free(c);
}

/* Requests and TransferDone: queued for the progress loop. */
static ucs_status_t donor_am_enqueue(graft__transport_state_t *t, unsigned id, const void *header,
                                     size_t header_length, void *data, size_t length,
                                     const ucp_am_recv_param_t *param)
{
    bool rndv = (param->recv_attr & UCP_AM_RECV_ATTR_FLAG_RNDV) != 0;
    bool too_large = rndv || length > REQUEST_MAX_BYTES;
    ucx_msg_t *m = graft__malloc(sizeof(*m) + (too_large ? 0 : length));

    if (m == NULL) {
        GRAFT_ERROR(GRAFT__XFER_MOD, "out of memory receiving a request");
        return rndv ? UCS_ERR_NO_MEMORY : UCS_OK;
    }
    memset(m, 0, sizeof(*m));
    m->id = id;
    m->reply_ep = (param->recv_attr & UCP_AM_RECV_ATTR_FIELD_REPLY_EP) ? param->reply_ep : NULL;
    m->has_header = header_length == sizeof(uint64_t);
    if (m->has_header)
        memcpy(&m->header, header, sizeof(uint64_t));
    m->too_large = too_large;
    m->len = too_large ? 0 : length;
    if (!too_large && length > 0)
        memcpy(m->data, data, length);
    msgq_push(&t->msgs, m);
    /* A rendezvous request is refused: the sender's send completes with
     * this status and the donor replies with an error. */
    return rndv ? UCS_ERR_MESSAGE_TRUNCATED : UCS_OK;
}

static ucs_status_t donor_request_cb(void *arg, const void *header, size_t header_length,
                                     void *data, size_t length, const ucp_am_recv_param_t *param)
{
    return donor_am_enqueue(arg, GRAFT__XFER_AM_REQUEST, header, header_length, data, length,
                            param);
}

static ucs_status_t donor_done_cb(void *arg, const void *header, size_t header_length,
                                  void *data, size_t length, const ucp_am_recv_param_t *param)
{
    return donor_am_enqueue(arg, GRAFT__XFER_AM_DONE, header, header_length, data, length,
                            param);
}

static ucs_status_t donor_chunk_req_cb(void *arg, const void *header, size_t header_length,
                                       void *data, size_t length,
                                       const ucp_am_recv_param_t *param)
{
    return donor_am_enqueue(arg, GRAFT__XFER_AM_CHUNK_REQ, header, header_length, data, length,
                            param);
}

/* A short message (graft_transfer_msg_send): into the endpoint's inbox. A
 * rendezvous one is longer than any message and is refused. */
static ucs_status_t msg_cb(void *arg, const void *header, size_t header_length, void *data,
                           size_t length, const ucp_am_recv_param_t *param)
{
    graft__transport_state_t *t = arg;
    (void)header;
    (void)header_length;
    if (param->recv_attr & UCP_AM_RECV_ATTR_FLAG_RNDV) {
        GRAFT_DEBUG(GRAFT__XFER_MOD, "a message of %zu bytes refused", length);
        return UCS_ERR_MESSAGE_TRUNCATED;
    }
    graft__transfer_msg_deliver(t->ep, data, length);
    return UCS_OK;
}

ucp_context_h graft__ucx_context(graft_transfer_endpoint_t *ep)
{
    return ep->transport->ctx;
}

static ucx_conn_t *conn_find(graft__transport_state_t *t, ucp_ep_h uep)
{
    for (ucx_conn_t *c = t->conns; c != NULL; c = c->next) {
        if (c->ep == uep)
            return c;
    }
    return NULL;
}

/*
 * Fill hash parts for chunks [c->cursor, end) into @p m. Caller holds
 * ep->lock and has checked that the hashes belong to the conn's step.
 */
static graft_status_t fill_hash_parts(graft_transfer_endpoint_t *ep, ucx_conn_t *c, uint64_t end,
                                      Graft__TransferManifest *m, Graft__ChunkHashes **parts,
                                      Graft__ChunkHashes *part_store, size_t max_parts)
{
    size_t n = 0;
    while (c->cursor < end && n < max_parts) {
        while (c->region_cursor < ep->n_regions &&
               c->cursor >= ep->regions[c->region_cursor].first_chunk +
                                ep->regions[c->region_cursor].n_chunks)
            c->region_cursor++;
        assert(c->region_cursor < ep->n_regions);
        const graft__region_t *r = &ep->regions[c->region_cursor];
        uint64_t stop = GRAFT_MIN(end, r->first_chunk + r->n_chunks);
        Graft__ChunkHashes *p = &part_store[n];
        graft__chunk_hashes__init(p);
        p->region = (uint32_t)c->region_cursor;
        p->first_chunk = c->cursor - r->first_chunk;
        p->n_hashes = (size_t)(stop - c->cursor);
        p->hashes = &ep->hashes[c->cursor];
        parts[n++] = p;
        c->cursor = stop;
    }
    m->n_hash_parts = n;
    m->hash_parts = parts;
    return GRAFT_OK;
}

/* First contiguous chunk from @p from whose hash is not done yet, at most
 * HASHES_PER_PART further. */
static uint64_t hashed_prefix(graft_transfer_endpoint_t *ep, uint64_t from)
{
    uint64_t end = from, lim = GRAFT_MIN(ep->total_chunks, from + HASHES_PER_PART);
    while (end < lim && atomic_load_explicit(&ep->hash_done[end], memory_order_acquire))
        end++;
    return end;
}

/* A refusal; for GRAFT_ESTEP it says which step the donor serves, if any. */
static void reply_refusal(ucp_ep_h uep, uint64_t header, graft_status_t code, const char *why,
                          bool serving, uint64_t serve_step)
{
    Graft__TransferManifest m;
    graft__transfer_manifest__init(&m);
    m.version = GRAFT__XFER_WIRE_VERSION;
    m.status = code;
    m.error = (char *)why;
    m.donor_serving = serving;
    m.step = serve_step;
    GRAFT_INFO(GRAFT__XFER_MOD, "refusing a transfer request: %s (%s)", why,
               graft_status_name(code));
    if (am_send_msg(uep, GRAFT__XFER_AM_MANIFEST, header, &m.base, false) != GRAFT_OK)
        GRAFT_WARN(GRAFT__XFER_MOD, "could not send a refusal");
}

static void reply_error(ucp_ep_h uep, uint64_t header, graft_status_t code, const char *why)
{
    reply_refusal(uep, header, code, why, false, 0);
}

/* Recipients of the current serve being served now: a manifest went out
 * and no TransferDone came back. Caller holds ep->lock. */
static uint32_t conns_admitted(graft__transport_state_t *t)
{
    uint32_t n = 0;
    for (ucx_conn_t *o = t->conns; o != NULL; o = o->next)
        n += o->active && o->fence_owed && !o->failed && o->gen == t->ep->serve_gen;
    return n;
}

/* Place of @p c among the live queued recipients of @p step (their number
 * when @p c is not queued yet). */
static uint32_t queue_place(graft__transport_state_t *t, const ucx_conn_t *c, uint64_t step,
                            uint64_t now)
{
    uint32_t n = 0;
    for (ucx_conn_t *o = t->conns; o != NULL; o = o->next)
        n += o != c && o->queued && !o->failed && o->fence_step == step &&
             now - o->asked_ns < QUEUE_STALE_NS && (!c->queued || o->queue_seq < c->queue_seq);
    return n;
}

/* Queue @p c for @p step and tell it its place. A queued recipient owes
 * the fence like an admitted one: if it gives up (it finished from other
 * donors), its closed connection counts. Caller holds ep->lock. */
static void queue_reply(graft__transport_state_t *t, ucx_conn_t *c, uint64_t step,
                        uint32_t place, uint32_t admitted, uint64_t now)
{
    graft_transfer_endpoint_t *ep = t->ep;
    char why[128];
    if (!c->queued) {
        c->queued = true;
        c->queue_seq = ++t->queue_seq;
    }
    c->asked_ns = now;
    c->fence_owed = true;
    c->fence_step = step;
    c->gen = ep->serve_gen;
    if (ep->serving)
        snprintf(why, sizeof(why), "queued at place %u; serving %u recipients at once", place,
                 admitted);
    else
        snprintf(why, sizeof(why), "queued at place %u; serving step %llu once this donor "
                 "holds it", place, (unsigned long long)step);
    Graft__TransferManifest m;
    graft__transfer_manifest__init(&m);
    m.version = GRAFT__XFER_WIRE_VERSION;
    m.status = GRAFT_EBUSY;
    m.error = why;
    m.step = step;
    m.donor_serving = ep->serving;
    m.queue_position = place;
    if (am_send_msg(c->ep, GRAFT__XFER_AM_MANIFEST, c->echo, &m.base, false) != GRAFT_OK)
        GRAFT_WARN(GRAFT__XFER_MOD, "could not send a queue place");
}

/* Build and send the first manifest of a connection: regions, keys and
 * whatever hashes are ready. Caller holds ep->lock. */
static graft_status_t send_manifest(graft_transfer_endpoint_t *ep, ucx_conn_t *c)
{
    Graft__TransferManifest m;
    Graft__RegionManifest *rms = NULL, **rmp = NULL;
    Graft__RegionDesc *descs = NULL;
    Graft__ChunkHashes *store = NULL, **parts = NULL;
    size_t nr = ep->n_regions;
    graft_status_t status = GRAFT_ENOMEM;

    rms = graft__calloc(nr + 1, sizeof(*rms));
    rmp = graft__calloc(nr + 1, sizeof(*rmp));
    descs = graft__calloc(nr + 1, sizeof(*descs));
    store = graft__calloc(nr + 1, sizeof(*store));
    parts = graft__calloc(nr + 1, sizeof(*parts));
    if (rms == NULL || rmp == NULL || descs == NULL || store == NULL || parts == NULL)
        goto out;

    graft__transfer_manifest__init(&m);
    m.version = GRAFT__XFER_WIRE_VERSION;
    m.status = GRAFT_OK;
    m.step = ep->serve_step;
    m.layout_hash = ep->layout_hash;
    m.chunk_bytes = ep->chunk_bytes;
    m.donor_group = ep->group;
    for (size_t i = 0; i < nr; i++) {
        const graft__region_t *r = &ep->regions[i];
        graft__region_desc__init(&descs[i]);
        descs[i].name = r->name;
        descs[i].kind = (Graft__RegionKind)r->kind;
        descs[i].dtype = r->dtype;
        descs[i].device = (uint32_t)r->device;
        descs[i].bytes = r->bytes;
        graft__region_manifest__init(&rms[i]);
        rms[i].region = &descs[i];
        rms[i].remote_address = (uint64_t)(uintptr_t)r->host;
        rms[i].rkey.data = r->rkey;
        rms[i].rkey.len = r->rkey_len;
        rmp[i] = &rms[i];
    }
    m.n_regions = nr;
    m.regions = rmp;

    c->cursor = 0;
    c->region_cursor = 0;
    c->final_sent = false;
    status = fill_hash_parts(ep, c, hashed_prefix(ep, 0), &m, parts, store, nr + 1);
    if (status != GRAFT_OK)
        goto out;
    if (c->cursor == ep->total_chunks) {
        m.hashes_final = true;
        c->final_sent = true;
    }
    status = am_send_msg(c->ep, GRAFT__XFER_AM_MANIFEST, c->echo, &m.base, false);
    if (status == GRAFT_OK) {
        c->active = true;
        c->gen = ep->serve_gen;
    }

out:
    graft_free(rms);
    graft_free(rmp);
    graft_free(descs);
    graft_free(store);
    graft_free(parts);
    return status;
}

static void handle_request(graft__transport_state_t *t, ucx_msg_t *msg)
{
    graft_transfer_endpoint_t *ep = t->ep;
    Graft__TransferRequest *req = NULL;
    ucx_conn_t *c;
    char why[160];

    if (msg->reply_ep == NULL) {
        GRAFT_WARN(GRAFT__XFER_MOD, "transfer request without a reply endpoint: dropped");
        return;
    }
    c = conn_find(t, msg->reply_ep);
    if (c == NULL || c->failed) {
        GRAFT_WARN(GRAFT__XFER_MOD, "transfer request on an unknown connection: dropped");
        return;
    }
    c->echo = msg->has_header ? msg->header : 0;
    c->active = false;
    if (msg->too_large) {
        reply_error(c->ep, c->echo, GRAFT_EPROTO, "request too large");
        return;
    }
    bool oom = false;
    ProtobufCAllocator pa = graft__transfer_pb_alloc_tracked(&oom);
    req = graft__transfer_request__unpack(&pa, msg->len, msg->data);
    if (req == NULL) {
        if (oom)
            reply_error(c->ep, c->echo, GRAFT_ENOMEM, "donor out of memory");
        else
            reply_error(c->ep, c->echo, GRAFT_EPROTO, "malformed TransferRequest");
        return;
    }
    if (req->version != GRAFT__XFER_WIRE_VERSION) {
        snprintf(why, sizeof(why), "unsupported request version %u", req->version);
        reply_error(c->ep, c->echo, GRAFT_EFORMAT, why);
        goto out;
    }
    if (strcmp(req->job_token, ep->job_token) != 0) {
        reply_error(c->ep, c->echo, GRAFT_ETOKEN, "job token rejected");
        goto out;
    }
    pthread_mutex_lock(&ep->lock);
    bool expected = !ep->serving && ep->expecting && ep->expect_step == req->step;
    if (!expected && (!ep->serving || ep->serve_step != req->step)) {
        bool serving = ep->serving;
        uint64_t serve_step = ep->serve_step;
        if (serving)
            snprintf(why, sizeof(why), "donor serves step %llu, not %llu",
                     (unsigned long long)serve_step, (unsigned long long)req->step);
        else
            snprintf(why, sizeof(why), "donor is not serving (asked step %llu)",
                     (unsigned long long)req->step);
        pthread_mutex_unlock(&ep->lock);
        reply_refusal(c->ep, c->echo, GRAFT_ESTEP, why, serving, serving ? serve_step : 0);
        goto out;
    }
    if (req->layout_hash != ep->layout_hash) {
        snprintf(why, sizeof(why), "layout hash %016llx differs from the donor's %016llx",
                 (unsigned long long)req->layout_hash, (unsigned long long)ep->layout_hash);
        pthread_mutex_unlock(&ep->lock);
        reply_error(c->ep, c->echo, GRAFT_ELAYOUT, why);
        goto out;
    }
    /* First come, first served: at most max_recipients at once. */
    uint64_t now = graft__now_ns();
    uint32_t admitted = conns_admitted(t);
    uint32_t place = queue_place(t, c, req->step, now);
    if (expected || admitted >= ep->max_recipients || place >= ep->max_recipients - admitted) {
        queue_reply(t, c, req->step, place, admitted, now);
        pthread_mutex_unlock(&ep->lock);
        GRAFT_DEBUG(GRAFT__XFER_MOD, "group %u rank %u queued at place %u for step %llu",
                    req->recipient_group, req->rank, place, (unsigned long long)req->step);
        goto out;
    }
    c->queued = false;
    if (send_manifest(ep, c) != GRAFT_OK) {
        GRAFT_WARN(GRAFT__XFER_MOD, "could not send a manifest");
    } else {
        c->fence_owed = true;
        c->fence_step = req->step;
        ep->serve_peak = GRAFT_MAX(ep->serve_peak, admitted + 1);
    }
    pthread_mutex_unlock(&ep->lock);
    GRAFT_DEBUG(GRAFT__XFER_MOD, "serving group %u rank %u at step %llu", req->recipient_group,
                req->rank, (unsigned long long)req->step);
out:
    graft__transfer_request__free_unpacked(req, &graft__transfer_pb_alloc);
}

static void handle_done(graft__transport_state_t *t, ucx_msg_t *msg)
{
    Graft__TransferDone *d;
    if (msg->too_large) {
        GRAFT_WARN(GRAFT__XFER_MOD, "oversized TransferDone dropped");
        return;
    }
    d = graft__transfer_done__unpack(&graft__transfer_pb_alloc, msg->len, msg->data);
    if (d == NULL || d->version != GRAFT__XFER_WIRE_VERSION) {
        GRAFT_WARN(GRAFT__XFER_MOD, "malformed TransferDone dropped");
        graft__transfer_done__free_unpacked(d, &graft__transfer_pb_alloc);
        return;
    }
    GRAFT_DEBUG(GRAFT__XFER_MOD, "group %u rank %u done with step %llu (%s)", d->recipient_group,
                d->rank, (unsigned long long)d->step, d->ok ? "ok" : "failed");
    /* One count per served connection: a TransferDone on a connection that
     * got no manifest, or a second one, is not counted; one on a connection
     * already reaped was counted when it was lost. */
    ucx_conn_t *c = msg->reply_ep != NULL ? conn_find(t, msg->reply_ep) : NULL;
    if (c != NULL && c->fence_owed) {
        c->fence_owed = false;
        graft__transfer_fence_note(t->ep, c->fence_step, c->gen);
    }
    graft__transfer_done__free_unpacked(d, &graft__transfer_pb_alloc);
}

/* Header of a CHUNK_DATA message: the request's echo, its tag, a status. */
typedef struct chunk_hdr {
    uint64_t echo;
    uint32_t tag;
    int32_t status;
} chunk_hdr_t;

static void chunk_send_cb(void *request, ucs_status_t status, void *user_data)
{
    (void)status;
    graft_free(user_data);
    ucp_request_free(request);
}

/* Push one chunk: a rendezvous active message straight from the region. */
static void handle_chunk_req(graft__transport_state_t *t, ucx_msg_t *msg)
{
    graft_transfer_endpoint_t *ep = t->ep;
    Graft__ChunkRequest *req = NULL;
    ucx_conn_t *c = msg->reply_ep != NULL ? conn_find(t, msg->reply_ep) : NULL;
    chunk_hdr_t *h;
    const void *src = NULL;
    size_t len = 0;
    ucp_request_param_t prm;
    ucs_status_ptr_t sreq;

    if (c == NULL || c->failed) {
        GRAFT_WARN(GRAFT__XFER_MOD, "chunk request on an unknown connection: dropped");
        return;
    }
    h = graft__calloc(1, sizeof(*h));
    if (h == NULL) {
        GRAFT_ERROR(GRAFT__XFER_MOD, "out of memory answering a chunk request");
        return;
    }
    h->echo = msg->has_header ? msg->header : 0;
    h->status = GRAFT_OK;
    if (!msg->too_large)
        req = graft__chunk_request__unpack(&graft__transfer_pb_alloc, msg->len, msg->data);
    if (req == NULL || req->version != GRAFT__XFER_WIRE_VERSION) {
        h->status = GRAFT_EPROTO;
    } else {
        h->tag = req->tag;
        pthread_mutex_lock(&ep->lock);
        if (!c->active || !ep->serving || c->gen != ep->serve_gen) {
            h->status = GRAFT_ESTEP;
        } else if (req->region >= ep->n_regions ||
                   req->chunk >= ep->regions[req->region].n_chunks) {
            h->status = GRAFT_EPROTO;
        } else {
            const graft__region_t *r = &ep->regions[req->region];
            src = (const char *)r->host + req->chunk * ep->chunk_bytes;
            len = (size_t)graft__region_chunk_len(ep, r, req->chunk);
        }
        pthread_mutex_unlock(&ep->lock);
    }
    graft__chunk_request__free_unpacked(req, &graft__transfer_pb_alloc);
    if (h->status != GRAFT_OK)
        GRAFT_INFO(GRAFT__XFER_MOD, "refusing a chunk request (%s)", graft_status_name(h->status));

    memset(&prm, 0, sizeof(prm));
    prm.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA |
                       UCP_OP_ATTR_FIELD_FLAGS;
    prm.cb.send = chunk_send_cb;
    prm.user_data = h;
    /* Rendezvous: the recipient's UCX pulls the bytes zero-copy where the
     * transport can. The region stays valid until serve_end (contract). */
    prm.flags = len > 0 ? UCP_AM_SEND_FLAG_RNDV : 0;
    sreq = ucp_am_send_nbx(c->ep, GRAFT__XFER_AM_CHUNK_DATA, h, sizeof(*h), src, len, &prm);
    if (sreq == NULL) {
        graft_free(h);
    } else if (UCS_PTR_IS_ERR(sreq)) {
        GRAFT_WARN(GRAFT__XFER_MOD, "sending a chunk: %s",
                   ucs_status_string(UCS_PTR_STATUS(sreq)));
        graft_free(h);
    }
}

/* Send each active connection the hashes finished since its last part. */
static void stream_hashes(graft__transport_state_t *t)
{
    graft_transfer_endpoint_t *ep = t->ep;
    pthread_mutex_lock(&ep->lock);
    for (ucx_conn_t *c = t->conns; c != NULL; c = c->next) {
        if (!c->active || c->failed || c->final_sent)
            continue;
        if (!ep->serving || c->gen != ep->serve_gen) {
            c->active = false;
            continue;
        }
        uint64_t end = hashed_prefix(ep, c->cursor);
        if (end == c->cursor && end < ep->total_chunks)
            continue;
        Graft__TransferManifest m;
        Graft__ChunkHashes store[8], *parts[8];
        graft__transfer_manifest__init(&m);
        m.version = GRAFT__XFER_WIRE_VERSION;
        m.step = ep->serve_step;
        m.layout_hash = ep->layout_hash;
        m.chunk_bytes = ep->chunk_bytes;
        m.donor_group = ep->group;
        uint64_t cursor0 = c->cursor;
        size_t region0 = c->region_cursor;
        if (fill_hash_parts(ep, c, end, &m, parts, store, GRAFT_ARRAY_SIZE(store)) != GRAFT_OK)
            continue;
        m.hashes_final = c->cursor == ep->total_chunks;
        if (am_send_msg(c->ep, GRAFT__XFER_AM_MANIFEST, c->echo, &m.base, false) != GRAFT_OK) {
            /* Try again on the next round. */
            c->cursor = cursor0;
            c->region_cursor = region0;
            continue;
        }
        c->final_sent = m.hashes_final;
    }
    pthread_mutex_unlock(&ep->lock);
}

/* Close a connection by force and destroy its worker (frees nothing else). */
static void conn_close(ucx_conn_t *c)
{
    ucp_request_param_t prm;
    ucs_status_ptr_t req;
    memset(&prm, 0, sizeof(prm));
    prm.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
    prm.flags = UCP_EP_CLOSE_FLAG_FORCE;
    req = ucp_ep_close_nbx(c->ep, &prm);
    if (UCS_PTR_IS_PTR(req)) {
        uint64_t deadline = graft__now_ns() + TEARDOWN_NS;
        while (ucp_request_check_status(req) == UCS_INPROGRESS && graft__now_ns() < deadline)
            ucp_worker_progress(c->worker);
        ucp_request_free(req);
    }
    ucp_worker_destroy(c->worker);
}

static void reap_conns(graft__transport_state_t *t)
{
    ucx_conn_t **pp = &t->conns;
    while (*pp != NULL) {
        ucx_conn_t *c = *pp;
        if (c->failed) {
            *pp = c->next;
            if (c->fence_owed) {
                /* The recipient died or dropped this donor before it said
                 * it was done, or left the queue (it finished from other
                 * donors): it will not read any more, so the fence need
                 * not wait for it (fence_timeout_ms used to). */
                if (c->queued)
                    GRAFT_DEBUG(GRAFT__XFER_MOD, "a queued recipient of step %llu left",
                                (unsigned long long)c->fence_step);
                else
                    GRAFT_WARN(GRAFT__XFER_MOD, "a recipient of step %llu was lost before it "
                               "was done; the fence counts it",
                               (unsigned long long)c->fence_step);
                graft__transfer_fence_note(t->ep, c->fence_step, c->gen);
            }
            conn_close(c);
            graft_free(c);
        } else {
            pp = &c->next;
        }
    }
}

/* Arm every worker for a wake-up and wait on their descriptors, at most
 * 1 ms so that hashes finished by the hashing threads go out promptly. */
static void progress_sleep(graft__transport_state_t *t)
{
    size_t n = 1;
    for (ucx_conn_t *c = t->conns; c != NULL; c = c->next)
        n++;
    if (n > t->pfds_cap) {
        struct pollfd *grown = graft__realloc(t->pfds, n * sizeof(*grown));
        if (grown == NULL)
            return; /* spin this round */
        t->pfds = grown;
        t->pfds_cap = n;
    }
    if (ucp_worker_arm(t->worker) == UCS_ERR_BUSY)
        return;
    t->pfds[0] = (struct pollfd){.fd = t->efd, .events = POLLIN};
    n = 1;
    for (ucx_conn_t *c = t->conns; c != NULL; c = c->next) {
        if (ucp_worker_arm(c->worker) == UCS_ERR_BUSY)
            return;
        t->pfds[n++] = (struct pollfd){.fd = c->efd, .events = POLLIN};
    }
    if (poll(t->pfds, n, 1) < 0 && errno != EINTR) {
        GRAFT_ERROR(GRAFT__XFER_MOD, "poll: %s", strerror(errno));
        graft__sleep_ns(1000000);
    }
}

static void *progress_thread(void *arg)
{
    graft__transport_state_t *t = arg;
    while (!atomic_load(&t->stop)) {
        ucx_msg_t *m;
        while (ucp_worker_progress(t->worker) != 0) {
        }
        for (ucx_conn_t *c = t->conns; c != NULL; c = c->next) {
            while (ucp_worker_progress(c->worker) != 0) {
            }
        }
        while ((m = msgq_pop(&t->msgs)) != NULL) {
            if (m->id == GRAFT__XFER_AM_REQUEST)
                handle_request(t, m);
            else if (m->id == GRAFT__XFER_AM_CHUNK_REQ)
                handle_chunk_req(t, m);
            else
                handle_done(t, m);
            graft_free(m);
        }
        reap_conns(t);
        stream_hashes(t);
        if (t->spare == NULL && t->conns == NULL && !t->spare_failed)
            t->spare_failed = conn_worker_create(t, &t->spare, &t->spare_efd) != GRAFT_OK;
        progress_sleep(t);
    }
    return NULL;
}

static graft_status_t set_am_handler(ucp_worker_h w, unsigned id, ucp_am_recv_callback_t cb,
                                     void *arg)
{
    ucp_am_handler_param_t hp;
    memset(&hp, 0, sizeof(hp));
    hp.field_mask = UCP_AM_HANDLER_PARAM_FIELD_ID | UCP_AM_HANDLER_PARAM_FIELD_CB |
                    UCP_AM_HANDLER_PARAM_FIELD_ARG;
    hp.id = id;
    hp.cb = cb;
    hp.arg = arg;
    ucs_status_t st = ucp_worker_set_am_recv_handler(w, &hp);
    if (st != UCS_OK) {
        GRAFT_ERROR(GRAFT__XFER_MOD, "ucp_worker_set_am_recv_handler: %s",
                    ucs_status_string(st));
        return GRAFT_ETRANSPORT;
    }
    return GRAFT_OK;
}

graft_status_t graft__ucx_worker_create(ucp_context_h ctx, ucp_worker_h *w_p)
{
    ucp_worker_params_t wp;
    memset(&wp, 0, sizeof(wp));
    wp.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE;
    wp.thread_mode = UCS_THREAD_MODE_SINGLE;
    ucs_status_t st = ucp_worker_create(ctx, &wp, w_p);
    if (st != UCS_OK) {
        GRAFT_ERROR(GRAFT__XFER_MOD, "ucp_worker_create: %s", ucs_status_string(st));
        return GRAFT_ETRANSPORT;
    }
    return GRAFT_OK;
}

static void ucx_fini(graft_transfer_endpoint_t *ep);

static graft_status_t ucx_init(graft_transfer_endpoint_t *ep)
{
    graft__transport_state_t *t;
    ucp_config_t *cfg = NULL;
    ucp_params_t p;
    ucp_listener_params_t lp;
    ucp_listener_attr_t la;
    struct sockaddr_in sa;
    struct in_addr advertised;
    char host[INET_ADDRSTRLEN];
    ucs_status_t st;
    graft_status_t status;
    int rc;

    status = listen_sockaddr(ep->listen_address, ep->port, &sa);
    if (status != GRAFT_OK)
        return status;
    /* A wildcard in the membership record tells peers nothing: publish
     * what the user advertises, and refuse the wildcard without it. */
    advertised = sa.sin_addr;
    if (ep->advertise_address != NULL) {
        status = resolve_host(ep->advertise_address, &advertised);
        if (status != GRAFT_OK)
            return status;
    }
    if (advertised.s_addr == htonl(INADDR_ANY)) {
        GRAFT_ERROR(GRAFT__XFER_MOD, ep->advertise_address != NULL
                    ? "advertised address '%s' is the wildcard: peers cannot reach it"
                    : "listening on '%s' (the wildcard) needs an advertised address",
                    ep->advertise_address != NULL ? ep->advertise_address : ep->listen_address);
        return GRAFT_EINVAL;
    }
    if (inet_ntop(AF_INET, &advertised, host, sizeof(host)) == NULL)
        return GRAFT_EINVAL;

    t = graft__calloc(1, sizeof(*t));
    if (t == NULL)
        return GRAFT_ENOMEM;
    t->ep = ep;
    t->efd = -1;
    atomic_init(&t->stop, false);
    msgq_init(&t->msgs);
    ep->transport = t;

    /* With peer error handling UCX skips shared memory unless told that it
     * may rely on it; the user's explicit choice wins. */
    if (setenv("UCX_MM_ERROR_HANDLING", "y", 0) != 0)
        GRAFT_WARN(GRAFT__XFER_MOD, "setenv: %s", strerror(errno));
    st = ucp_config_read(NULL, NULL, &cfg);
    if (st != UCS_OK) {
        GRAFT_ERROR(GRAFT__XFER_MOD, "ucp_config_read: %s", ucs_status_string(st));
        status = GRAFT_ETRANSPORT;
        goto err;
    }
    memset(&p, 0, sizeof(p));
    p.field_mask = UCP_PARAM_FIELD_FEATURES | UCP_PARAM_FIELD_MT_WORKERS_SHARED;
    p.features = UCP_FEATURE_RMA | UCP_FEATURE_AM | UCP_FEATURE_WAKEUP;
    /* The progress thread's worker and a pull's worker share the context. */
    p.mt_workers_shared = 1;
    st = ucp_init(&p, cfg, &t->ctx);
    ucp_config_release(cfg);
    if (st != UCS_OK) {
        GRAFT_ERROR(GRAFT__XFER_MOD, "ucp_init: %s", ucs_status_string(st));
        status = GRAFT_ETRANSPORT;
        goto err;
    }
    status = graft__ucx_worker_create(t->ctx, &t->worker);
    if (status != GRAFT_OK)
        goto err;
    st = ucp_worker_get_efd(t->worker, &t->efd);
    if (st != UCS_OK) {
        GRAFT_ERROR(GRAFT__XFER_MOD, "ucp_worker_get_efd: %s", ucs_status_string(st));
        status = GRAFT_ETRANSPORT;
        goto err;
    }

    memset(&lp, 0, sizeof(lp));
    lp.field_mask = UCP_LISTENER_PARAM_FIELD_SOCK_ADDR | UCP_LISTENER_PARAM_FIELD_CONN_HANDLER;
    lp.sockaddr.addr = (const struct sockaddr *)&sa;
    lp.sockaddr.addrlen = sizeof(sa);
    lp.conn_handler.cb = conn_handler;
    lp.conn_handler.arg = t;
    st = ucp_listener_create(t->worker, &lp, &t->listener);
    if (st != UCS_OK) {
        GRAFT_ERROR(GRAFT__XFER_MOD, "listening on %s (port %u): %s", ep->listen_address,
                    (unsigned)ntohs(sa.sin_port), ucs_status_string(st));
        status = GRAFT_ETRANSPORT;
        goto err;
    }
    la.field_mask = UCP_LISTENER_ATTR_FIELD_SOCKADDR;
    st = ucp_listener_query(t->listener, &la);
    if (st != UCS_OK) {
        GRAFT_ERROR(GRAFT__XFER_MOD, "ucp_listener_query: %s", ucs_status_string(st));
        status = GRAFT_ETRANSPORT;
        goto err;
    }
    snprintf(ep->address, sizeof(ep->address), "%s:%u", host,
             (unsigned)ntohs(((struct sockaddr_in *)&la.sockaddr)->sin_port));

    rc = pthread_create(&t->thread, NULL, progress_thread, t);
    if (rc != 0) {
        GRAFT_ERROR(GRAFT__XFER_MOD, "pthread_create: %s", strerror(rc));
        status = GRAFT_ESYS;
        goto err;
    }
    t->thread_started = true;
    GRAFT_DEBUG(GRAFT__XFER_MOD, "endpoint listening on %s", ep->address);
    return GRAFT_OK;

err:
    ucx_fini(ep);
    return status;
}

static void ucx_region_unmap(graft_transfer_endpoint_t *ep, graft__region_t *r)
{
    graft__transport_state_t *t = ep->transport;
    if (r->rkey != NULL)
        ucp_rkey_buffer_release(r->rkey);
    /* A region inside a graft_transfer_host_alloc() block borrows its
     * mapping; the block's owner unmaps it. */
    if (r->memh != NULL && r->alloc == NULL)
        (void)ucp_mem_unmap(t->ctx, r->memh);
    r->rkey = NULL;
    r->memh = NULL;
#ifdef GRAFT_HAVE_CUDA
    if (r->device == GRAFT_TRANSFER_CUDA && r->host != r->ptr) {
        graft__cuda_host_free(r->host);
        r->host = r->ptr;
    }
#endif
}

static void ucx_fini(graft_transfer_endpoint_t *ep)
{
    graft__transport_state_t *t = ep->transport;
    if (t == NULL)
        return;
    if (t->thread_started) {
        atomic_store(&t->stop, true);
        (void)ucp_worker_signal(t->worker);
        pthread_join(t->thread, NULL);
    }
    graft__ucx_msg_fini(ep);
    while (t->conns != NULL) {
        ucx_conn_t *c = t->conns;
        t->conns = c->next;
        conn_close(c);
        graft_free(c);
    }
    msgq_clear(&t->msgs);
    graft_free(t->pfds);
    if (t->spare != NULL)
        ucp_worker_destroy(t->spare);
    if (t->listener != NULL)
        ucp_listener_destroy(t->listener);
    for (size_t i = 0; i < ep->n_regions; i++)
        ucx_region_unmap(ep, &ep->regions[i]);
    /* Blocks the caller did not free: their mappings die with the context. */
    for (graft__host_alloc_t *a = ep->host_allocs; a != NULL; a = a->next) {
        if (a->memh != NULL) {
            GRAFT_DEBUG(GRAFT__XFER_MOD, "host block %p (%llu bytes) freed with the endpoint",
                       a->ptr, (unsigned long long)a->bytes);
            (void)ucp_mem_unmap(t->ctx, a->memh);
            a->memh = NULL;
        }
    }
    if (t->worker != NULL)
        ucp_worker_destroy(t->worker);
    if (t->ctx != NULL)
        ucp_cleanup(t->ctx);
    graft_free(t);
    ep->transport = NULL;
}

static graft_status_t ucx_region_map(graft_transfer_endpoint_t *ep, graft__region_t *r)
{
    graft__transport_state_t *t = ep->transport;
    ucp_mem_map_params_t mp;
    ucs_status_t st;

    if (r->device == GRAFT_TRANSFER_CUDA) {
#ifdef GRAFT_HAVE_CUDA
        /* Debian's UCX has no CUDA support: the network reads and writes a
         * pinned host shadow, staged from/to the device around transfers. */
        graft_status_t status = graft__cuda_host_alloc(r->bytes, &r->host);
        if (status != GRAFT_OK)
            return status;
#else
        GRAFT_ERROR(GRAFT__XFER_MOD, "region '%s': CUDA memory is not supported by this build",
                    r->name);
        return GRAFT_ENOTSUP;
#endif
    }
    if (r->bytes == 0)
        return GRAFT_OK;
    if (r->alloc != NULL) {
        /* Already mapped by ucx_host_alloc(): the key of the whole block
         * also covers this part of it. */
        r->memh = r->alloc->memh;
        st = ucp_rkey_pack(t->ctx, r->memh, &r->rkey, &r->rkey_len);
        if (st != UCS_OK) {
            GRAFT_ERROR(GRAFT__XFER_MOD, "ucp_rkey_pack of region '%s': %s", r->name,
                        ucs_status_string(st));
            r->memh = NULL;
            return GRAFT_ETRANSPORT;
        }
        rkey_layout_learn(&t->rkey_layout_unknown, r);
        return GRAFT_OK;
    }
    memset(&mp, 0, sizeof(mp));
    mp.field_mask = UCP_MEM_MAP_PARAM_FIELD_ADDRESS | UCP_MEM_MAP_PARAM_FIELD_LENGTH;
    mp.address = r->host;
    mp.length = r->bytes;
    st = ucp_mem_map(t->ctx, &mp, (ucp_mem_h *)&r->memh);
    if (st != UCS_OK) {
        GRAFT_ERROR(GRAFT__XFER_MOD, "ucp_mem_map of region '%s' (%llu bytes): %s", r->name,
                    (unsigned long long)r->bytes, ucs_status_string(st));
        goto err_shadow;
    }
    st = ucp_rkey_pack(t->ctx, r->memh, &r->rkey, &r->rkey_len);
    if (st != UCS_OK) {
        GRAFT_ERROR(GRAFT__XFER_MOD, "ucp_rkey_pack of region '%s': %s", r->name,
                    ucs_status_string(st));
        (void)ucp_mem_unmap(t->ctx, r->memh);
        r->memh = NULL;
        goto err_shadow;
    }
    rkey_layout_learn(&t->rkey_layout_unknown, r);
    return GRAFT_OK;

err_shadow:
#ifdef GRAFT_HAVE_CUDA
    if (r->device == GRAFT_TRANSFER_CUDA) {
        graft__cuda_host_free(r->host);
        r->host = r->ptr;
    }
#endif
    return GRAFT_ETRANSPORT;
}

/*
 * Memory that UCX allocates itself (UCP_MEM_MAP_ALLOCATE) comes from its
 * shared-memory domains first (sysv, then posix; UCX_ALLOC_PRIO), which can
 * hand a peer on the same host a key to map the block: its gets become a
 * memcpy in the recipient (rkey_ptr), with no work for the donor. Memory
 * the caller allocated can only be registered, and UCX 1.13 serves gets on
 * it by active messages through the donor's progress thread.
 */
static graft_status_t ucx_host_alloc(graft_transfer_endpoint_t *ep, uint64_t bytes,
                                     graft__host_alloc_t *a)
{
    graft__transport_state_t *t = ep->transport;
    ucp_mem_map_params_t mp;
    ucp_mem_attr_t attr;
    ucp_mem_h memh = NULL;
    graft_status_t status;
    ucs_status_t st;

    if ((uint64_t)(size_t)bytes != bytes) {
        GRAFT_ERROR(GRAFT__XFER_MOD, "host block of %llu bytes is too large",
                    (unsigned long long)bytes);
        return GRAFT_ENOMEM;
    }
    memset(&mp, 0, sizeof(mp));
    mp.field_mask = UCP_MEM_MAP_PARAM_FIELD_ADDRESS | UCP_MEM_MAP_PARAM_FIELD_LENGTH |
                    UCP_MEM_MAP_PARAM_FIELD_FLAGS | UCP_MEM_MAP_PARAM_FIELD_MEMORY_TYPE;
    mp.address = NULL;
    mp.length = (size_t)bytes;
    mp.flags = UCP_MEM_MAP_ALLOCATE;
    mp.memory_type = UCS_MEMORY_TYPE_HOST;
    st = ucp_mem_map(t->ctx, &mp, &memh);
    if (st != UCS_OK) {
        GRAFT_ERROR(GRAFT__XFER_MOD, "ucp_mem_map(ALLOCATE, %llu bytes): %s",
                    (unsigned long long)bytes, ucs_status_string(st));
        return st == UCS_ERR_NO_MEMORY || st == UCS_ERR_EXCEEDS_LIMIT ? GRAFT_ENOMEM
                                                                       : GRAFT_ETRANSPORT;
    }
    attr.field_mask = UCP_MEM_ATTR_FIELD_ADDRESS | UCP_MEM_ATTR_FIELD_LENGTH;
    st = ucp_mem_query(memh, &attr);
    if (st != UCS_OK) {
        GRAFT_ERROR(GRAFT__XFER_MOD, "ucp_mem_query: %s", ucs_status_string(st));
        status = GRAFT_ETRANSPORT;
        goto err_unmap;
    }
    /* The documented alignment; UCX's allocators all return whole pages. */
    if (((uintptr_t)attr.address & 63u) != 0 || attr.length < bytes) {
        GRAFT_ERROR(GRAFT__XFER_MOD, "ucp_mem_map(ALLOCATE) gave %p, %zu bytes", attr.address,
                    attr.length);
        status = GRAFT_ETRANSPORT;
        goto err_unmap;
    }
    a->ptr = attr.address;
    a->bytes = attr.length;
    a->memh = memh;
    GRAFT_DEBUG(GRAFT__XFER_MOD, "host block %p: %zu bytes", attr.address, attr.length);
    return GRAFT_OK;

err_unmap:
    (void)ucp_mem_unmap(t->ctx, memh);
    return status;
}

static void ucx_host_free(graft_transfer_endpoint_t *ep, graft__host_alloc_t *a)
{
    graft__transport_state_t *t = ep->transport;
    if (a->memh != NULL) {
        ucs_status_t st = ucp_mem_unmap(t->ctx, a->memh);
        if (st != UCS_OK)
            GRAFT_WARN(GRAFT__XFER_MOD, "ucp_mem_unmap of host block %p: %s", a->ptr,
                       ucs_status_string(st));
    }
    a->memh = NULL;
}

/* ------------------------------------------------------------------------ */
/* Pull (recipient)                                                         */
/* ------------------------------------------------------------------------ */

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
    ucp_worker_h worker; /* this donor's alone: see ucx_pull */
    ucp_ep_h uep;
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
    uint64_t queued_since_ns;
    void *close_req;
    bool close_when_drained;
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

static void q_push(pull_t *p, uint64_t c)
{
    assert(p->q_count < p->n_chunks);
    p->queue[(p->q_head + p->q_count) % p->n_chunks] = c;
    p->q_count++;
}

static uint64_t q_pop(pull_t *p)
{
    uint64_t c = p->queue[p->q_head];
    p->q_head = (p->q_head + 1) % p->n_chunks;
    p->q_count--;
    return c;
}

static const graft__region_t *chunk_region(const pull_t *p, uint64_t c)
{
    return &p->ep->regions[p->chunks[c].region];
}

static uint64_t chunk_len(const pull_t *p, uint64_t c)
{
    const graft__region_t *r = chunk_region(p, c);
    return graft__region_chunk_len(p->ep, r, c - r->first_chunk);
}

static void recip_err_cb(void *arg, ucp_ep_h uep, ucs_status_t status)
{
    pdonor_t *d = arg;
    (void)uep;
    d->err_flag = true;
    d->err_status = status;
}

/*
 * UCX 1.13 has no query for an endpoint's transports (ucp_ep_query knows
 * only names and socket addresses), so they are read from the text that
 * ucp_ep_print_info() writes, whose lane lines look like
 *   "#                 lane[1]:  2:sysv/memory.0 md[2]  -> md[2]/sysv/sysdev[255] am am_bw#0"
 * and become "sysv/memory:am,am_bw" (the connection manager's lane,
 * "lane[0]: cm ...", is left out). Only a diagnostic: a line of another
 * shape is skipped.
 */
static void lanes_describe(ucp_ep_h uep, char *out, size_t size)
{
    char text[4096], line[512];
    size_t used = 0;
    FILE *f;

    out[0] = '\0';
    memset(text, 0, sizeof(text));
    f = fmemopen(text, sizeof(text) - 1, "w");
    if (f == NULL)
        return;
    ucp_ep_print_info(uep, f);
    fclose(f);
    FILE *in = fmemopen(text, strlen(text), "r");
    if (in == NULL)
        return;
    while (fgets(line, sizeof(line), in) != NULL) {
        char tl[64], rest[256], desc[192], *tok, *save = NULL;
        const char *lane = strstr(line, "lane[");
        const char *arrow = strstr(line, "->");
        if (lane == NULL || arrow == NULL ||
            sscanf(strchr(lane, ':') + 1, " %*u:%63s", tl) != 1)
            continue;
        char *dot = strrchr(tl, '.');
        if (dot != NULL && dot > strchr(tl, '/'))
            *dot = '\0';
        size_t n = (size_t)snprintf(desc, sizeof(desc), "%s", tl);
        /* After the arrow: the remote md, then what the lane is used for. */
        snprintf(rest, sizeof(rest), "%s", arrow + 2);
        tok = strtok_r(rest, " \t\n", &save); /* the remote md */
        for (int k = 0; tok != NULL && n < sizeof(desc); k++) {
            tok = strtok_r(NULL, " \t\n", &save);
            if (tok == NULL)
                break;
            char *hash = strchr(tok, '#');
            if (hash != NULL)
                *hash = '\0';
            n += (size_t)snprintf(desc + n, sizeof(desc) - n, "%c%s", k == 0 ? ':' : ',', tok);
        }
        if (n >= sizeof(desc) || used + (used > 0) + n >= size)
            break; /* cut at a lane boundary */
        used += (size_t)snprintf(out + used, size - used, "%s%s", used > 0 ? " " : "", desc);
    }
    fclose(in);
}

static void ep_close_start(pull_t *p, pdonor_t *d, bool force)
{
    ucp_request_param_t prm;
    ucs_status_ptr_t req;
    if (d->uep == NULL)
        return;
    /* Only a connection the donor answered on is wired up: UCX 1.13's
     * ucp_ep_print_info() of one still on its connection-manager lane reads
     * freed memory (an interface name from getifaddrs; AddressSanitizer). */
    if (d->answered)
        lanes_describe(d->uep, p->rep->donors[d->index].transports,
                       sizeof(p->rep->donors[d->index].transports));
    memset(&prm, 0, sizeof(prm));
    prm.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
    prm.flags = force ? UCP_EP_CLOSE_FLAG_FORCE : 0;
    req = ucp_ep_close_nbx(d->uep, &prm);
    d->uep = NULL;
    if (UCS_PTR_IS_PTR(req))
        d->close_req = req;
}

/* Close a donor's connection by force. A push read whose bytes have not
 * started to arrive has no UCX request that the close could complete: give
 * it up here. Ones being received complete (with an error) through the
 * close, like gets. */
static void donor_force_close(pull_t *p, pdonor_t *d)
{
    for (size_t i = 0; i < p->n_slots; i++) {
        pslot_t *s = &p->slots[i];
        if (p->o->read == GRAFT_TRANSFER_READ_PUSH && s->busy && !s->done &&
            s->donor == d->index && !s->recv_started) {
            s->st = UCS_ERR_CANCELED;
            s->done = true;
        }
    }
    d->close_when_drained = false;
    ep_close_start(p, d, true);
}

/*
 * Drop a donor: its unverified chunks go back to the queue; chunks it has
 * in flight follow when UCX completes them, so no late write can land on a
 * reassigned chunk. A donor whose transport failed or that stalled is
 * closed by force at once (that completes its requests with an error). A
 * donor that is alive but unusable (refusal, bad hash, protocol error) is
 * closed gracefully once its reads drained: UCX 1.13 aborts a donor that
 * receives a read request on an endpoint the recipient force-closed.
 */
static void donor_fail(pull_t *p, pdonor_t *d, graft_status_t why)
{
    if (d->state == D_FAILED)
        return;
    GRAFT_WARN(GRAFT__XFER_MOD, "donor %u (%s) dropped: %s", d->index, p->o->donors[d->index],
               graft_status_string(why));
    d->state = D_FAILED;
    p->rep->donors[d->index].status = why;
    for (uint64_t c = 0; c < p->n_chunks; c++) {
        if (p->chunks[c].state == CH_FETCHED && p->chunks[c].donor == (int8_t)d->index) {
            p->chunks[c].state = CH_PENDING;
            q_push(p, c);
            p->rep->donors[d->index].reassigned++;
        }
    }
    if (d->err_flag || why == GRAFT_EPEER_TIMEOUT)
        donor_force_close(p, d);
    else
        d->close_when_drained = true;
}

/* Graceful closes of dropped donors whose reads have drained. */
static void donors_close_drained(pull_t *p)
{
    for (size_t i = 0; i < p->n_donors; i++) {
        pdonor_t *d = &p->donors[i];
        if (d->close_when_drained && d->inflight == 0) {
            d->close_when_drained = false;
            ep_close_start(p, d, false);
        }
    }
}

static void chunk_verify(pull_t *p, uint64_t c)
{
    pchunk_t *ch = &p->chunks[c];
    pdonor_t *d = &p->donors[(size_t)ch->donor];
    if (!d->known[c])
        return;
    if (ch->got != d->hash[c]) {
        GRAFT_WARN(GRAFT__XFER_MOD, "chunk %llu of region '%s' from donor %u does not match "
                   "its hash", (unsigned long long)(c - chunk_region(p, c)->first_chunk),
                   chunk_region(p, c)->name, d->index);
        donor_fail(p, d, GRAFT_EHASH);
        return;
    }
    uint64_t len = chunk_len(p, c);
    ch->state = CH_DONE;
    p->done_chunks++;
    p->done_bytes += len;
    p->rep->donors[d->index].chunks++;
    p->rep->donors[d->index].bytes += len;
}

static void drift_report(pull_t *p, uint64_t c, uint32_t a, uint32_t b, uint64_t ha, uint64_t hb)
{
    const graft__region_t *r = chunk_region(p, c);
    if (p->status != GRAFT_OK)
        return;
    p->status = GRAFT_EDRIFT;
    snprintf(p->rep->drift.region, sizeof(p->rep->drift.region), "%s", r->name);
    p->rep->drift.chunk = c - r->first_chunk;
    p->rep->drift.donor_a = a;
    p->rep->drift.donor_b = b;
    p->rep->drift.hash_a = ha;
    p->rep->drift.hash_b = hb;
    GRAFT_ERROR(GRAFT__XFER_MOD, "replica drift: region '%s' chunk %llu: donor %u has %016llx, "
                "donor %u has %016llx", r->name, (unsigned long long)p->rep->drift.chunk, a,
                (unsigned long long)ha, b, (unsigned long long)hb);
}

/* First manifest of a donor: check it against our table, unpack keys. */
/*
 * A donor's graft_transfer_host_alloc() block on this host is mapped into
 * the recipient when its key is unpacked, afresh for every pull, and gets
 * on it are copies out of that mapping. Faulting its pages in one by one
 * during the copies cost about as much as the copies themselves (one
 * shared-memory fault per 4 KiB), so the recipient populates the page
 * tables of each chunk in one call just before reading it (only the chunks
 * it reads from that donor). Keys that are not mapped (tcp, or memory the
 * donor only registered) have no local pointer; a kernel without
 * MADV_POPULATE_READ (before 5.14) falls back to faulting.
 */
#ifndef MADV_POPULATE_READ
#define MADV_POPULATE_READ 22
#endif
static void chunk_prefault(const uint8_t *lp, uint64_t len)
{
    static atomic_bool unsupported;
    static uintptr_t page;
    if (atomic_load_explicit(&unsupported, memory_order_relaxed))
        return;
    if (page == 0)
        page = (uintptr_t)sysconf(_SC_PAGESIZE);
    uintptr_t lo = (uintptr_t)lp & ~(page - 1);
    uintptr_t hi = ((uintptr_t)lp + (uintptr_t)len + page - 1) & ~(page - 1);
    if (madvise((void *)lo, hi - lo, MADV_POPULATE_READ) != 0 && errno == EINVAL &&
        !atomic_exchange(&unsupported, true))
        GRAFT_DEBUG(GRAFT__XFER_MOD, "madvise(MADV_POPULATE_READ): %s", strerror(errno));
}

/* Whether [lp, lp + len) is mapped in this process, without touching it.
 * UCX turns a shared-memory key and a remote address into a local pointer
 * with no bounds check, so a donor's address past its segment would make
 * the copy fault; mincore() fails with ENOMEM on any unmapped page. */
static bool range_mapped(const uint8_t *lp, uint64_t len)
{
    uintptr_t page = (uintptr_t)sysconf(_SC_PAGESIZE);
    uintptr_t lo = (uintptr_t)lp & ~(page - 1);
    if (len == 0)
        return true;
    if ((uintptr_t)lp + len < (uintptr_t)lp)
        return false;
    uintptr_t hi = ((uintptr_t)lp + (uintptr_t)len + page - 1) & ~(page - 1);
    size_t n = (hi - lo) / page;
    unsigned char small[256];
    unsigned char *vec = n <= sizeof(small) ? small : graft__malloc(n);
    if (vec == NULL)
        return false;
    bool ok = mincore((void *)lo, hi - lo, vec) == 0;
    if (vec != small)
        graft_free(vec);
    return ok;
}

static graft_status_t manifest_accept(pull_t *p, pdonor_t *d, const Graft__TransferManifest *m)
{
    graft_transfer_endpoint_t *ep = p->ep;
    if (m->status != 0) {
        graft_status_t st = (graft_status_t)m->status;
        if (graft_status_class(st) != GRAFT_CLASS_PEER && st != GRAFT_EFORMAT &&
            st != GRAFT_ENOMEM)
            st = GRAFT_EPROTO;
        GRAFT_WARN(GRAFT__XFER_MOD, "donor %u refused: %s (%s)", d->index,
                   m->error != NULL ? m->error : "", graft_status_name(st));
        return st;
    }
    if (m->step != p->o->step || m->layout_hash != ep->layout_hash ||
        m->chunk_bytes != ep->chunk_bytes || m->n_regions != ep->n_regions) {
        GRAFT_WARN(GRAFT__XFER_MOD, "donor %u: manifest does not match the request "
                   "(step %llu, chunk %llu bytes, %zu regions)", d->index,
                   (unsigned long long)m->step, (unsigned long long)m->chunk_bytes, m->n_regions);
        return GRAFT_EPROTO;
    }
    d->rkeys = graft__calloc(ep->n_regions + 1, sizeof(*d->rkeys));
    d->raddr = graft__calloc(ep->n_regions + 1, sizeof(*d->raddr));
    d->lptr = graft__calloc(ep->n_regions + 1, sizeof(*d->lptr));
    d->hash = graft__calloc(p->n_chunks + 1, sizeof(*d->hash));
    d->known = graft__calloc(p->n_chunks + 1, sizeof(*d->known));
    if (d->rkeys == NULL || d->raddr == NULL || d->lptr == NULL || d->hash == NULL ||
        d->known == NULL)
        return GRAFT_ENOMEM;
    for (size_t i = 0; i < ep->n_regions; i++) {
        const Graft__RegionManifest *rm = m->regions[i];
        const graft__region_t *r = &ep->regions[i];
        if (rm->region == NULL || rm->region->name == NULL ||
            strcmp(rm->region->name, r->name) != 0 || rm->region->bytes != r->bytes) {
            GRAFT_WARN(GRAFT__XFER_MOD, "donor %u: region %zu differs from '%s'", d->index, i,
                       r->name);
            return GRAFT_EPROTO;
        }
        d->raddr[i] = rm->remote_address;
        if (r->bytes == 0)
            continue;
        if (rm->rkey.len == 0 || rm->rkey.len > RKEY_MAX_BYTES ||
            (!p->ep->transport->rkey_layout_unknown &&
             !rkey_layout_ok(rm->rkey.data, rm->rkey.len))) {
            GRAFT_WARN(GRAFT__XFER_MOD, "donor %u: remote key of '%s' is malformed (%zu bytes)",
                       d->index, r->name, rm->rkey.len);
            return GRAFT_EPROTO;
        }
        uint8_t key[RKEY_MAX_BYTES + RKEY_PAD];
        memcpy(key, rm->rkey.data, rm->rkey.len);
        memset(key + rm->rkey.len, 0, RKEY_PAD);
        ucs_status_t st = ucp_ep_rkey_unpack(d->uep, key, &d->rkeys[i]);
        if (st != UCS_OK) {
            GRAFT_WARN(GRAFT__XFER_MOD, "donor %u: remote key of '%s': %s", d->index, r->name,
                       ucs_status_string(st));
            return GRAFT_EPROTO;
        }
        void *lp = NULL;
        if (ucp_rkey_ptr(d->rkeys[i], rm->remote_address, &lp) == UCS_OK) {
            if (!range_mapped(lp, r->bytes)) {
                GRAFT_WARN(GRAFT__XFER_MOD, "donor %u: '%s' at %#llx lies outside the memory its "
                           "key maps", d->index, r->name, (unsigned long long)rm->remote_address);
                return GRAFT_EPROTO;
            }
            d->lptr[i] = lp;
        }
    }
    d->state = D_READY;
    return GRAFT_OK;
}

static graft_status_t hash_parts_apply(pull_t *p, pdonor_t *d, const Graft__TransferManifest *m)
{
    graft_transfer_endpoint_t *ep = p->ep;
    for (size_t i = 0; i < m->n_hash_parts; i++) {
        const Graft__ChunkHashes *h = m->hash_parts[i];
        if (h->region >= ep->n_regions)
            return GRAFT_EPROTO;
        const graft__region_t *r = &ep->regions[h->region];
        if (h->first_chunk > r->n_chunks || h->n_hashes > r->n_chunks - h->first_chunk)
            return GRAFT_EPROTO;
        for (size_t k = 0; k < h->n_hashes; k++) {
            uint64_t c = r->first_chunk + h->first_chunk + k;
            uint64_t v = h->hashes[k];
            if (d->known[c] && d->hash[c] != v)
                return GRAFT_EPROTO;
            d->hash[c] = v;
            d->known[c] = 1;
            if (p->ref_donor[c] < 0) {
                p->ref_donor[c] = (int8_t)d->index;
                p->ref_hash[c] = v;
            } else if (p->ref_hash[c] != v) {
                drift_report(p, c, (uint32_t)p->ref_donor[c], d->index, p->ref_hash[c], v);
                return GRAFT_OK;
            }
            if (p->chunks[c].state == CH_FETCHED && p->chunks[c].donor == (int8_t)d->index)
                chunk_verify(p, c);
            if (d->state == D_FAILED)
                return GRAFT_OK;
        }
    }
    if (m->hashes_final) {
        for (uint64_t c = 0; c < p->n_chunks; c++) {
            if (!d->known[c])
                return GRAFT_EPROTO;
        }
        d->final = true;
    }
    return GRAFT_OK;
}

static graft_status_t donor_send_request(pull_t *p, pdonor_t *d);

/* Stop the clock of a donor's queue. */
static void queue_leave(pull_t *p, pdonor_t *d)
{
    if (!d->queued)
        return;
    d->queued = false;
    p->rep->donors[d->index].queued_ns += graft__now_ns() - d->queued_since_ns;
}

/* A donor that queued us (it serves others first, or serves the step once
 * its own pull ends): ask again every QUEUE_ASK_NS. Each answer shows it
 * is alive, so the connect deadline starts over; the stall timeout counts
 * from admission (the first manifest). */
static bool queued_retry(pull_t *p, pdonor_t *d, const Graft__TransferManifest *m)
{
    uint64_t now = graft__now_ns();
    if (m->status != GRAFT_EBUSY || m->step != p->o->step)
        return false;
    if (!d->queued) {
        d->queued = true;
        d->queued_since_ns = now;
        GRAFT_DEBUG(GRAFT__XFER_MOD, "donor %u: %s", d->index, m->error != NULL ? m->error : "");
    }
    d->connect_deadline = now + (uint64_t)p->connect_ms * 1000000ull;
    d->retry_at_ns = now + QUEUE_ASK_NS;
    return true;
}

/* A donor that refused our step because it does not serve it yet (not
 * serving, or an older step) is likely about to begin: the quorum has
 * reached it a moment later than us. Ask again, backing off from 10 ms to
 * 200 ms, until the connect deadline; then its refusal is the answer. */
static bool step_refusal_retry(pull_t *p, pdonor_t *d, const Graft__TransferManifest *m)
{
    uint64_t now = graft__now_ns();
    if (m->status != GRAFT_ESTEP || (m->donor_serving && m->step >= p->o->step))
        return false;
    d->retry_ns = d->retry_ns == 0 ? 10000000ull : GRAFT_MIN(2 * d->retry_ns, 200000000ull);
    if (now + d->retry_ns >= d->connect_deadline)
        return false;
    d->retry_at_ns = now + d->retry_ns;
    d->refused = GRAFT_ESTEP;
    GRAFT_DEBUG(GRAFT__XFER_MOD, "donor %u does not serve step %llu yet (%s): asking again",
                d->index, (unsigned long long)p->o->step, m->error != NULL ? m->error : "");
    return true;
}

/* Send the requests whose back-off is over. */
static void donors_retry(pull_t *p)
{
    uint64_t now = graft__now_ns();
    for (size_t i = 0; i < p->n_donors; i++) {
        pdonor_t *d = &p->donors[i];
        if (d->state != D_CONNECTING || d->retry_at_ns == 0 || now < d->retry_at_ns)
            continue;
        d->retry_at_ns = 0;
        graft_status_t st = donor_send_request(p, d);
        if (st != GRAFT_OK)
            donor_fail(p, d, st);
    }
}

static void handle_manifest(pull_t *p, ucx_msg_t *msg)
{
    uint64_t idx = msg->header & 0xff;
    Graft__TransferManifest *m;
    graft_status_t st;

    if (!msg->has_header || (msg->header >> 8) != p->nonce || idx >= p->n_donors) {
        GRAFT_WARN(GRAFT__XFER_MOD, "manifest for another pull dropped");
        return;
    }
    pdonor_t *d = &p->donors[idx];
    d->answered = true;
    if (d->state == D_FAILED)
        return;
    bool oom = false;
    ProtobufCAllocator pa = graft__transfer_pb_alloc_tracked(&oom);
    m = graft__transfer_manifest__unpack(&pa, msg->len, msg->data);
    if (m == NULL && oom) {
        GRAFT_ERROR(GRAFT__XFER_MOD, "out of memory decoding a manifest");
        if (p->status == GRAFT_OK)
            p->status = GRAFT_ENOMEM;
        goto out;
    }
    if (m == NULL || m->version != GRAFT__XFER_WIRE_VERSION) {
        GRAFT_WARN(GRAFT__XFER_MOD, "donor %u sent a malformed manifest", d->index);
        donor_fail(p, d, GRAFT_EPROTO);
        goto out;
    }
    d->last_ns = graft__now_ns();
    if (d->state == D_CONNECTING && (queued_retry(p, d, m) || step_refusal_retry(p, d, m)))
        goto out;
    if (d->state == D_CONNECTING) {
        queue_leave(p, d);
        st = manifest_accept(p, d, m);
        if (st == GRAFT_ENOMEM) {
            GRAFT_ERROR(GRAFT__XFER_MOD, "out of memory accepting a manifest");
            if (p->status == GRAFT_OK)
                p->status = GRAFT_ENOMEM;
            goto out;
        }
        if (st != GRAFT_OK) {
            donor_fail(p, d, st);
            goto out;
        }
        GRAFT_DEBUG(GRAFT__XFER_MOD, "donor %u: manifest with %zu hash parts%s", d->index,
                    m->n_hash_parts, m->hashes_final ? " (final)" : "");
    } else if (m->n_regions != 0 || m->status != 0) {
        donor_fail(p, d, GRAFT_EPROTO);
        goto out;
    }
    st = hash_parts_apply(p, d, m);
    if (st != GRAFT_OK) {
        GRAFT_WARN(GRAFT__XFER_MOD, "donor %u sent bad chunk hashes", d->index);
        donor_fail(p, d, st);
    }
out:
    graft__transfer_manifest__free_unpacked(m, &graft__transfer_pb_alloc);
}

static void rndv_recv_cb(void *request, ucs_status_t status, size_t length, void *user_data)
{
    ucx_msg_t *m = user_data;
    pull_t *p = (pull_t *)m->reply_ep; /* stashed owner, see recip_am_cb */
    m->reply_ep = NULL;
    if (status == UCS_OK && length == m->len)
        msgq_push(&p->msgs, m);
    else
        graft_free(m);
    ucp_request_free(request);
}

static ucs_status_t recip_am_cb(void *arg, const void *header, size_t header_length, void *data,
                                size_t length, const ucp_am_recv_param_t *param)
{
    pdonor_t *d = arg;
    pull_t *p = d->pull;
    ucx_msg_t *m;
    bool rndv = (param->recv_attr & UCP_AM_RECV_ATTR_FLAG_RNDV) != 0;

    if (length > MANIFEST_MAX_BYTES || header_length != sizeof(uint64_t)) {
        GRAFT_WARN(GRAFT__XFER_MOD, "oversized or headerless manifest dropped");
        return rndv ? UCS_ERR_MESSAGE_TRUNCATED : UCS_OK;
    }
    uint64_t echo;
    memcpy(&echo, header, sizeof(echo));
    if ((echo & 0xff) != d->index) {
        /* Each donor has its own worker: it can only speak for itself. */
        GRAFT_WARN(GRAFT__XFER_MOD, "donor %u sent a manifest as donor %u; dropped", d->index,
                   (unsigned)(echo & 0xff));
        return rndv ? UCS_ERR_CANCELED : UCS_OK;
    }
    m = graft__malloc(sizeof(*m) + length);
    if (m == NULL) {
        GRAFT_ERROR(GRAFT__XFER_MOD, "out of memory receiving a manifest");
        if (p->status == GRAFT_OK)
            p->status = GRAFT_ENOMEM;
        return rndv ? UCS_ERR_NO_MEMORY : UCS_OK;
    }
    memset(m, 0, sizeof(*m));
    m->id = GRAFT__XFER_AM_MANIFEST;
    m->has_header = true;
    memcpy(&m->header, header, sizeof(uint64_t));
    m->len = length;
    if (!rndv) {
        memcpy(m->data, data, length);
        msgq_push(&p->msgs, m);
        return UCS_OK;
    }
    ucp_request_param_t prm;
    memset(&prm, 0, sizeof(prm));
    prm.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA;
    prm.cb.recv_am = rndv_recv_cb;
    prm.user_data = m;
    m->reply_ep = (ucp_ep_h)(void *)p;
    ucs_status_ptr_t req = ucp_am_recv_data_nbx(d->worker, data, m->data, length, &prm);
    if (req == NULL) {
        m->reply_ep = NULL;
        msgq_push(&p->msgs, m);
    } else if (UCS_PTR_IS_ERR(req)) {
        GRAFT_WARN(GRAFT__XFER_MOD, "receiving a manifest: %s",
                   ucs_status_string(UCS_PTR_STATUS(req)));
        graft_free(m);
    }
    return UCS_OK;
}

static void push_recv_cb(void *request, ucs_status_t status, size_t length, void *user_data)
{
    pslot_t *s = user_data;
    s->st = status;
    if (status == UCS_OK && length != chunk_len(s->pull, s->chunk)) {
        s->st = UCS_ERR_MESSAGE_TRUNCATED;
        s->proto_err = true;
    }
    s->done = true;
    ucp_request_free(request);
}

/* A pushed chunk: checked against the slot that asked for it, then received
 * (zero-copy for rendezvous) straight into the region. */
static ucs_status_t recip_chunk_cb(void *arg, const void *header, size_t header_length,
                                   void *data, size_t length, const ucp_am_recv_param_t *param)
{
    pdonor_t *d = arg;
    pull_t *p = d->pull;
    bool rndv = (param->recv_attr & UCP_AM_RECV_ATTR_FLAG_RNDV) != 0;
    chunk_hdr_t h;
    pslot_t *s;

    if (header_length != sizeof(h))
        goto drop;
    memcpy(&h, header, sizeof(h));
    if ((h.echo >> 8) != p->nonce || (h.echo & 0xff) != d->index || h.tag >= p->n_slots)
        goto drop;
    s = &p->slots[h.tag];
    /* A dropped donor that is draining still delivers into its own slots:
     * their chunks are not reassigned before the slot completes. */
    if (!s->busy || s->done || s->recv_started || s->donor != (h.echo & 0xff))
        goto drop;
    if (h.status != GRAFT_OK || length != chunk_len(p, s->chunk)) {
        s->st = UCS_ERR_INVALID_PARAM;
        s->proto_err = h.status != GRAFT_ESTEP;
        s->done = true;
        goto drop;
    }
    const graft__region_t *r = chunk_region(p, s->chunk);
    char *dst = (char *)r->host + (s->chunk - r->first_chunk) * p->ep->chunk_bytes;
    if (!rndv) {
        memcpy(dst, data, length);
        s->st = UCS_OK;
        s->done = true;
        return UCS_OK;
    }
    ucp_request_param_t prm;
    memset(&prm, 0, sizeof(prm));
    prm.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA |
                       UCP_OP_ATTR_FIELD_MEMH;
    prm.cb.recv_am = push_recv_cb;
    prm.user_data = s;
    prm.memh = r->memh;
    s->recv_started = true;
    ucs_status_ptr_t req = ucp_am_recv_data_nbx(d->worker, data, dst, length, &prm);
    if (req == NULL) {
        s->st = UCS_OK;
        s->done = true;
    } else if (UCS_PTR_IS_ERR(req)) {
        s->st = UCS_PTR_STATUS(req);
        s->done = true;
    }
    return UCS_OK;

drop:
    GRAFT_DEBUG(GRAFT__XFER_MOD, "unexpected chunk data dropped");
    return UCS_OK;
}

ucs_status_t graft__ucx_connect(ucp_worker_h w, const struct sockaddr_in *sa,
                                ucp_err_handler_cb_t err_cb, void *err_arg, ucp_ep_h *ep_p)
{
    ucp_ep_params_t prm;
    memset(&prm, 0, sizeof(prm));
    prm.field_mask = UCP_EP_PARAM_FIELD_FLAGS | UCP_EP_PARAM_FIELD_SOCK_ADDR |
                     UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE | UCP_EP_PARAM_FIELD_ERR_HANDLER;
    prm.flags = UCP_EP_PARAMS_FLAGS_CLIENT_SERVER;
    prm.sockaddr.addr = (const struct sockaddr *)sa;
    prm.sockaddr.addrlen = sizeof(*sa);
    prm.err_mode = UCP_ERR_HANDLING_MODE_PEER;
    prm.err_handler.cb = err_cb;
    prm.err_handler.arg = err_arg;
    return ucp_ep_create(w, &prm, ep_p);
}

static graft_status_t donor_connect(pull_t *p, pdonor_t *d)
{
    struct sockaddr_in sa;
    ucs_status_t st;

    if (graft__ucx_parse_address(p->o->donors[d->index], &sa) != GRAFT_OK) {
        GRAFT_WARN(GRAFT__XFER_MOD, "bad donor address '%s'", p->o->donors[d->index]);
        return GRAFT_EINVAL;
    }
    st = graft__ucx_connect(d->worker, &sa, recip_err_cb, d, &d->uep);
    if (st != UCS_OK) {
        GRAFT_WARN(GRAFT__XFER_MOD, "connecting to %s: %s", p->o->donors[d->index],
                   ucs_status_string(st));
        d->uep = NULL;
        return GRAFT_EPEER_UNREACHABLE;
    }
    return donor_send_request(p, d);
}

/* Ask the donor for the pull's step (again, after a step refusal). */
static graft_status_t donor_send_request(pull_t *p, pdonor_t *d)
{
    graft_transfer_endpoint_t *ep = p->ep;
    Graft__TransferRequest req;
    graft__transfer_request__init(&req);
    req.version = GRAFT__XFER_WIRE_VERSION;
    req.job_token = ep->job_token;
    req.step = p->o->step;
    req.layout_hash = ep->layout_hash;
    req.recipient_group = ep->group;
    req.rank = ep->rank;
    req.request_id = p->nonce;
    return am_send_msg(d->uep, GRAFT__XFER_AM_REQUEST, (p->nonce << 8) | d->index, &req.base,
                       true);
}

static void get_cb(void *request, ucs_status_t status, void *user_data)
{
    pslot_t *s = user_data;
    s->st = status;
    s->done = true;
    ucp_request_free(request);
}

static void issue_get(pull_t *p, pdonor_t *d, uint64_t c)
{
    pslot_t *s = NULL;
    for (size_t i = 0; i < p->n_slots; i++) {
        if (!p->slots[i].busy) {
            s = &p->slots[i];
            break;
        }
    }
    assert(s != NULL);
    const graft__region_t *r = chunk_region(p, c);
    uint64_t idx = c - r->first_chunk, off = idx * p->ep->chunk_bytes, len = chunk_len(p, c);
    uint32_t ri = p->chunks[c].region;
    ucp_request_param_t prm;

    s->busy = true;
    s->done = false;
    s->donor = d->index;
    s->chunk = c;
    s->st = UCS_OK;
    p->chunks[c].state = CH_INFLIGHT;
    p->chunks[c].donor = (int8_t)d->index;
    d->inflight++;
    s->proto_err = false;
    s->recv_started = false;
    if (p->o->read == GRAFT_TRANSFER_READ_PUSH) {
        Graft__ChunkRequest cr;
        graft__chunk_request__init(&cr);
        cr.version = GRAFT__XFER_WIRE_VERSION;
        cr.region = ri;
        cr.chunk = idx;
        cr.tag = (uint32_t)(s - p->slots);
        graft_status_t st = am_send_msg(d->uep, GRAFT__XFER_AM_CHUNK_REQ,
                                        (p->nonce << 8) | d->index, &cr.base, true);
        if (st != GRAFT_OK) {
            s->st = st == GRAFT_ENOMEM ? UCS_ERR_NO_MEMORY : UCS_ERR_IO_ERROR;
            s->done = true;
        }
        return;
    }
    memset(&prm, 0, sizeof(prm));
    prm.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA |
                       UCP_OP_ATTR_FIELD_MEMH;
    prm.cb.send = get_cb;
    prm.user_data = s;
    prm.memh = r->memh;
    if (d->lptr[ri] != NULL)
        chunk_prefault(d->lptr[ri] + off, len);
    ucs_status_ptr_t req = ucp_get_nbx(d->uep, (char *)r->host + off, len, d->raddr[ri] + off,
                                       d->rkeys[ri], &prm);
    if (req == NULL) {
        s->done = true;
    } else if (UCS_PTR_IS_ERR(req)) {
        s->st = UCS_PTR_STATUS(req);
        s->done = true;
    }
}

static void slots_reap(pull_t *p)
{
    for (size_t i = 0; i < p->n_slots; i++) {
        pslot_t *s = &p->slots[i];
        if (!s->busy || !s->done)
            continue;
        s->busy = false;
        pdonor_t *d = &p->donors[s->donor];
        pchunk_t *ch = &p->chunks[s->chunk];
        d->inflight--;
        if (s->st == UCS_OK && d->state == D_READY && p->o->skip_verify) {
            uint64_t len = chunk_len(p, s->chunk);
            ch->state = CH_DONE;
            p->done_chunks++;
            p->done_bytes += len;
            p->rep->donors[d->index].chunks++;
            p->rep->donors[d->index].bytes += len;
            d->last_ns = graft__now_ns();
            continue;
        }
        if (s->st == UCS_OK && d->state == D_READY) {
            const graft__region_t *r = chunk_region(p, s->chunk);
            uint64_t off = (s->chunk - r->first_chunk) * p->ep->chunk_bytes;
            ch->got = XXH3_64bits((const char *)r->host + off, chunk_len(p, s->chunk));
            ch->state = CH_FETCHED;
            d->last_ns = graft__now_ns();
            chunk_verify(p, s->chunk);
            continue;
        }
        if (s->st == UCS_ERR_NO_MEMORY && p->status == GRAFT_OK) {
            GRAFT_ERROR(GRAFT__XFER_MOD, "out of memory reading a chunk");
            p->status = GRAFT_ENOMEM;
        }
        ch->state = CH_PENDING;
        q_push(p, s->chunk);
        p->rep->donors[s->donor].reassigned++;
        if (d->state == D_READY)
            donor_fail(p, d, s->proto_err ? GRAFT_EPROTO : graft__ucx_status(s->st));
    }
}

static void issue_gets(pull_t *p)
{
    bool any = true;
    while (p->q_count > 0 && any) {
        any = false;
        for (size_t i = 0; i < p->n_donors && p->q_count > 0; i++) {
            pdonor_t *d = &p->donors[i];
            if (d->state != D_READY || d->inflight >= p->window)
                continue;
            issue_get(p, d, q_pop(p));
            any = true;
        }
    }
}

/* Progresses every donor's worker, each a bounded number of times so that
 * a busy one cannot starve the others. */
static void pull_progress(pull_t *p)
{
    for (size_t i = 0; i < p->n_donors; i++) {
        ucp_worker_h w = p->donors[i].worker;
        for (unsigned n = 0; w != NULL && n < 64 && ucp_worker_progress(w) != 0; n++) {
        }
    }
}

/* Returns true when the pull is finished (status says how). */
static bool pull_check(pull_t *p, uint64_t start_ns)
{
    uint64_t now = graft__now_ns();
    bool live = false, waiting_hashes = false;

    if (p->status != GRAFT_OK)
        return true;
    if (atomic_load(&p->ep->cancel)) {
        p->status = GRAFT_ECANCELED;
        return true;
    }
    if (p->o->timeout_ms != 0 && now - start_ns > (uint64_t)p->o->timeout_ms * 1000000ull) {
        GRAFT_ERROR(GRAFT__XFER_MOD, "pull timed out after %u ms", p->o->timeout_ms);
        p->status = GRAFT_ETIMEOUT;
        return true;
    }
    for (size_t i = 0; i < p->n_donors; i++) {
        pdonor_t *d = &p->donors[i];
        if (d->err_flag && d->state != D_FAILED)
            donor_fail(p, d, graft__ucx_status(d->err_status) == GRAFT_ETRANSPORT
                                 ? GRAFT_EPEER
                                 : graft__ucx_status(d->err_status));
        if (d->state == D_CONNECTING && now > d->connect_deadline)
            donor_fail(p, d, d->refused != GRAFT_OK ? d->refused : GRAFT_EPEER_TIMEOUT);
        if (d->state == D_READY && (d->inflight > 0 || (!d->final && !p->o->skip_verify)) &&
            now - d->last_ns > (uint64_t)p->stall_ms * 1000000ull) {
            GRAFT_WARN(GRAFT__XFER_MOD, "donor %u made no progress for %u ms", d->index,
                       p->stall_ms);
            donor_fail(p, d, GRAFT_EPEER_TIMEOUT);
        }
        /* A dropped donor that stops answering while draining is cut off. */
        if (d->state == D_FAILED && d->close_when_drained && d->inflight > 0 &&
            now - d->last_ns > (uint64_t)p->stall_ms * 1000000ull)
            donor_force_close(p, d);
        if (d->state != D_FAILED)
            live = true;
        if (d->state == D_READY && !d->final && !p->o->skip_verify)
            waiting_hashes = true;
        /* A queued donor is not waited for once the others gave every
         * chunk: it is there for when they fail. */
        if (d->state == D_CONNECTING && !d->queued)
            waiting_hashes = true;
    }
    if (p->done_chunks == p->n_chunks && !waiting_hashes)
        return true;
    if (!live) {
        GRAFT_ERROR(GRAFT__XFER_MOD, "no usable donor left with %llu of %llu chunks missing",
                    (unsigned long long)(p->n_chunks - p->done_chunks),
                    (unsigned long long)p->n_chunks);
        p->status = GRAFT_ENODONOR;
        return true;
    }
    return false;
}

static void pull_teardown(pull_t *p)
{
    uint64_t deadline;

    /* Tell every donor that served or queued us, so its fence can release. */
    for (size_t i = 0; i < p->n_donors; i++) {
        pdonor_t *d = &p->donors[i];
        bool queued = d->state == D_CONNECTING && d->queued;
        queue_leave(p, d);
        if ((d->state != D_READY && !queued) || d->uep == NULL)
            continue;
        Graft__TransferDone done;
        graft__transfer_done__init(&done);
        done.version = GRAFT__XFER_WIRE_VERSION;
        done.request_id = p->nonce;
        done.ok = p->status == GRAFT_OK;
        done.bytes = p->rep->donors[i].bytes;
        done.step = p->o->step;
        done.recipient_group = p->ep->group;
        done.rank = p->ep->rank;
        if (am_send_msg(d->uep, GRAFT__XFER_AM_DONE, (p->nonce << 8) | i, &done.base, true) !=
            GRAFT_OK)
            GRAFT_WARN(GRAFT__XFER_MOD, "could not tell donor %zu that the pull is done", i);
    }
    /* Let reads still in flight finish before closing (see donor_fail). */
    deadline = graft__now_ns() + TEARDOWN_NS;
    for (;;) {
        bool busy = false;
        pull_progress(p);
        for (size_t i = 0; i < p->n_slots; i++)
            busy = busy || (p->slots[i].busy && !p->slots[i].done);
        if (!busy || graft__now_ns() > deadline)
            break;
    }
    for (size_t i = 0; i < p->n_donors; i++) {
        pdonor_t *d = &p->donors[i];
        d->close_when_drained = false;
        ep_close_start(p, d, d->err_flag || p->rep->donors[i].status == GRAFT_EPEER_TIMEOUT);
    }

    deadline = graft__now_ns() + TEARDOWN_NS;
    for (;;) {
        bool busy = false;
        pull_progress(p);
        for (size_t i = 0; i < p->n_slots; i++)
            busy = busy || (p->slots[i].busy && !p->slots[i].done);
        for (size_t i = 0; i < p->n_donors; i++) {
            pdonor_t *d = &p->donors[i];
            if (d->close_req != NULL && ucp_request_check_status(d->close_req) != UCS_INPROGRESS) {
                ucp_request_free(d->close_req);
                d->close_req = NULL;
            }
            busy = busy || d->close_req != NULL;
        }
        if (!busy)
            break;
        if (graft__now_ns() > deadline) {
            GRAFT_WARN(GRAFT__XFER_MOD, "closing donor connections took too long");
            break;
        }
    }
    for (size_t i = 0; i < p->n_donors; i++) {
        pdonor_t *d = &p->donors[i];
        if (d->close_req != NULL)
            ucp_request_free(d->close_req);
        d->close_req = NULL;
        for (size_t r = 0; d->rkeys != NULL && r < p->ep->n_regions; r++) {
            if (d->rkeys[r] != NULL)
                ucp_rkey_destroy(d->rkeys[r]);
        }
    }
}

static graft_status_t pull_alloc(pull_t *p)
{
    graft_transfer_endpoint_t *ep = p->ep;
    p->n_chunks = ep->total_chunks;
    p->chunks = graft__calloc(p->n_chunks + 1, sizeof(*p->chunks));
    p->queue = graft__calloc(p->n_chunks + 1, sizeof(*p->queue));
    p->ref_hash = graft__calloc(p->n_chunks + 1, sizeof(*p->ref_hash));
    p->ref_donor = graft__calloc(p->n_chunks + 1, sizeof(*p->ref_donor));
    p->n_slots = p->n_donors * p->window;
    p->slots = graft__calloc(p->n_slots, sizeof(*p->slots));
    if (p->chunks == NULL || p->queue == NULL || p->ref_hash == NULL || p->ref_donor == NULL ||
        p->slots == NULL)
        return GRAFT_ENOMEM;
    for (size_t r = 0; r < ep->n_regions; r++) {
        /* host_only: the CUDA regions come by another path (NCCL). */
        bool skip = p->o->host_only && ep->regions[r].device == GRAFT_TRANSFER_CUDA;
        if (!skip)
            p->total_bytes += ep->regions[r].bytes;
        for (uint64_t k = 0; k < ep->regions[r].n_chunks; k++) {
            uint64_t c = ep->regions[r].first_chunk + k;
            p->chunks[c].region = (uint32_t)r;
            p->chunks[c].donor = -1;
            p->ref_donor[c] = -1;
            if (skip) {
                p->chunks[c].state = CH_DONE;
                p->done_chunks++;
            } else {
                q_push(p, c);
            }
        }
    }
    for (size_t i = 0; i < p->n_slots; i++)
        p->slots[i].pull = p;
    return GRAFT_OK;
}

static void pull_free(pull_t *p)
{
    for (size_t i = 0; i < p->n_donors; i++) {
        pdonor_t *d = &p->donors[i];
        graft_free(d->rkeys);
        graft_free(d->raddr);
        graft_free(d->lptr);
        graft_free(d->hash);
        graft_free(d->known);
    }
    msgq_clear(&p->msgs);
    graft_free(p->chunks);
    graft_free(p->queue);
    graft_free(p->ref_hash);
    graft_free(p->ref_donor);
    graft_free(p->slots);
}

static graft_status_t ucx_pull(graft_transfer_endpoint_t *ep, const graft_transfer_pull_options_t *o,
                               graft_transfer_report_t *rep)
{
    graft__transport_state_t *t = ep->transport;
    pull_t p;
    uint64_t start = graft__now_ns(), last_progress_bytes = UINT64_MAX;
    graft_status_t status;
    static atomic_uint_fast64_t nonce_counter = 1;

    memset(&p, 0, sizeof(p));
    p.ep = ep;
    p.o = o;
    p.rep = rep;
    p.n_donors = o->n_donors;
    p.window = o->window != 0 ? o->window : 4;
    p.stall_ms = o->stall_timeout_ms != 0 ? o->stall_timeout_ms : 5000;
    p.connect_ms = o->connect_timeout_ms != 0 ? o->connect_timeout_ms : 5000;
    p.nonce = (atomic_fetch_add(&nonce_counter, 1) ^ ((uint64_t)getpid() << 20)) &
              0x00ffffffffffffffull;
    msgq_init(&p.msgs);
    rep->n_donors = o->n_donors;
    status = pull_alloc(&p);
    rep->bytes = p.total_bytes;
    rep->chunks = ep->total_chunks;
    if (status != GRAFT_OK)
        goto out_free;
    /* One worker per donor. Over shared memory all senders to a worker
     * write into its one receive FIFO, and a sender killed in the middle of
     * a write leaves an element that is never completed: every message
     * behind it, from every other donor, would wait forever. With a worker
     * each, a dying donor can only block its own connection. */
    for (size_t i = 0; i < p.n_donors; i++) {
        pdonor_t *d = &p.donors[i];
        d->pull = &p;
        d->index = (uint32_t)i;
        status = graft__ucx_worker_create(t->ctx, &d->worker);
        if (status == GRAFT_OK)
            status = set_am_handler(d->worker, GRAFT__XFER_AM_MANIFEST, recip_am_cb, d);
        if (status == GRAFT_OK)
            status = set_am_handler(d->worker, GRAFT__XFER_AM_CHUNK_DATA, recip_chunk_cb, d);
        if (status != GRAFT_OK)
            goto out_workers;
    }

    for (size_t i = 0; i < p.n_donors; i++) {
        pdonor_t *d = &p.donors[i];
        d->state = D_CONNECTING;
        d->connect_deadline = start + (uint64_t)p.connect_ms * 1000000ull;
        rep->donors[i].status = GRAFT_OK;
        graft_status_t st = donor_connect(&p, d);
        if (st == GRAFT_ENOMEM && p.status == GRAFT_OK)
            p.status = GRAFT_ENOMEM;
        if (st != GRAFT_OK)
            donor_fail(&p, d, st);
    }

    while (!pull_check(&p, start)) {
        ucx_msg_t *m;
        pull_progress(&p);
        while ((m = msgq_pop(&p.msgs)) != NULL) {
            handle_manifest(&p, m);
            graft_free(m);
        }
        slots_reap(&p);
        donors_close_drained(&p);
        donors_retry(&p);
        if (p.status == GRAFT_OK)
            issue_gets(&p);
        if (o->progress != NULL && p.done_bytes != last_progress_bytes) {
            last_progress_bytes = p.done_bytes;
            o->progress(p.done_bytes, p.total_bytes, o->progress_arg);
        }
    }
    status = p.status;
    if (status == GRAFT_OK && p.done_chunks != p.n_chunks)
        status = GRAFT_EINTERNAL;
#ifdef GRAFT_HAVE_CUDA
    /* Verified bytes of device regions sit in their pinned shadows. */
    for (size_t r = 0; r < ep->n_regions && status == GRAFT_OK; r++) {
        graft__region_t *reg = &ep->regions[r];
        if (reg->device == GRAFT_TRANSFER_CUDA && !o->host_only)
            status = graft__cuda_stage(reg->ptr, reg->host, reg->bytes, true);
    }
#endif
    pull_teardown(&p);
    rep->elapsed_ns = graft__now_ns() - start;
    if (status == GRAFT_OK)
        GRAFT_INFO(GRAFT__XFER_MOD, "pulled %llu bytes from %zu donors in %.3f s",
                   (unsigned long long)p.total_bytes, p.n_donors, rep->elapsed_ns / 1e9);

out_workers:
    for (size_t i = 0; i < p.n_donors; i++) {
        if (p.donors[i].worker != NULL)
            ucp_worker_destroy(p.donors[i].worker);
    }
out_free:
    pull_free(&p);
    return status;
}

const struct graft_transport_ops graft__ucx_ops = {
    .name = "ucx",
    .init = ucx_init,
    .fini = ucx_fini,
    .region_map = ucx_region_map,
    .region_unmap = ucx_region_unmap,
    .host_alloc = ucx_host_alloc,
    .host_free = ucx_host_free,
    .pull = ucx_pull,
    .msg_send = graft__ucx_msg_send,
    .msg_forget = graft__ucx_msg_forget,
};
