/*
 * UCX backend: the pieces both sides use. The queue of received messages
 * (active-message callbacks only queue, the donor's through
 * graft__ucx_donor_enqueue; the loops that own the workers handle them), UCX status and address parsing, active-message sends, the
 * check of a peer's packed remote key, workers and client connections.
 */
#include "ucx_int.h"

#include <arpa/inet.h>
#include <errno.h>
#include <ifaddrs.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void graft__ucx_msgq_init(msg_queue_t *q)
{
    q->head = NULL;
    q->tail = &q->head;
}

void graft__ucx_msgq_push(msg_queue_t *q, ucx_msg_t *m)
{
    m->next = NULL;
    *q->tail = m;
    q->tail = &m->next;
}

ucx_msg_t *graft__ucx_msgq_pop(msg_queue_t *q)
{
    ucx_msg_t *m = q->head;
    if (m != NULL) {
        q->head = m->next;
        if (q->head == NULL)
            q->tail = &q->head;
    }
    return m;
}

void graft__ucx_msgq_clear(msg_queue_t *q)
{
    ucx_msg_t *m;
    while ((m = graft__ucx_msgq_pop(q)) != NULL)
        graft_free(m);
}

/* A donor's requests, chunk requests and TransferDone, from an active-message
 * callback (ucx_donor_conns.c's, ucx_shm.c's): queued for the progress loop. */
ucs_status_t graft__ucx_donor_enqueue(graft__transport_state_t *t, ucx_conn_t *conn, unsigned id,
                                      const void *header, size_t header_length, void *data,
                                      size_t length, const ucp_am_recv_param_t *param)
{
    bool rndv = (param->recv_attr & UCP_AM_RECV_ATTR_FLAG_RNDV) != 0;
    bool too_large = rndv || length > REQUEST_MAX_BYTES;
    ucx_msg_t *m = graft__malloc(sizeof(*m) + (too_large ? 0 : length));

    if (m == NULL) {
        GRAFT_ERROR(GRAFT_MOD_TRANSFER, "out of memory receiving a request");
        return rndv ? UCS_ERR_NO_MEMORY : UCS_OK;
    }
    memset(m, 0, sizeof(*m));
    m->id = id;
    m->conn = conn;
    m->reply_ep = (param->recv_attr & UCP_AM_RECV_ATTR_FIELD_REPLY_EP) ? param->reply_ep : NULL;
    m->has_header = header_length == sizeof(uint64_t);
    if (m->has_header)
        memcpy(&m->header, header, sizeof(uint64_t));
    m->too_large = too_large;
    m->len = too_large ? 0 : length;
    if (!too_large && length > 0)
        memcpy(m->data, data, length);
    graft__ucx_msgq_push(&t->msgs, m);
    /* A rendezvous request is refused: the sender's send completes with
     * this status and the donor replies with an error. */
    return rndv ? UCS_ERR_MESSAGE_TRUNCATED : UCS_OK;
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
        GRAFT_ERROR(GRAFT_MOD_TRANSFER, "getifaddrs: %s", strerror(errno));
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
        GRAFT_ERROR(GRAFT_MOD_TRANSFER, found_if ? "interface '%s' has no IPv4 address"
                                              : "'%s' is neither an IPv4 address nor an interface",
                    name);
    return status;
}

graft_status_t graft__ucx_resolve_host(const char *name, struct in_addr *in)
{
    return resolve_host_q(name, in, false);
}

/* Where to listen: "host" or "host:port", host an IPv4 address or an
 * interface name (a whole string that names an interface, e.g. the alias
 * "eth0:1", is a name, not a name and a port); @p port is the configured
 * one, which a port in the string must agree with when both are given. */
graft_status_t graft__ucx_listen_sockaddr(const char *s, uint16_t port, struct sockaddr_in *sa)
{
    char host[64];
    struct in_addr in;
    const char *colon = strrchr(s, ':');
    unsigned long p = port;
    graft_status_t status;

    memset(sa, 0, sizeof(*sa));
    if (strlen(s) >= sizeof(host) || s[0] == '\0') {
        GRAFT_ERROR(GRAFT_MOD_TRANSFER, "bad listen address '%s'", s);
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
            GRAFT_ERROR(GRAFT_MOD_TRANSFER, "bad listen address '%s' (port %u configured)", s,
                        (unsigned)port);
            return GRAFT_EINVAL;
        }
        if (p == 0)
            p = port;
    }
    status = graft__ucx_resolve_host(host, &in);
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
graft_status_t graft__ucx_am_send_owned(ucp_ep_h uep, unsigned id, uint8_t *buf, size_t len,
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
        GRAFT_WARN(GRAFT_MOD_TRANSFER, "am send: %s", ucs_status_string(UCS_PTR_STATUS(req)));
        graft_free(buf);
        return graft__ucx_status(UCS_PTR_STATUS(req));
    }
    return GRAFT_OK;
}

/* Allocate [header][packed message] and send it. */
graft_status_t graft__ucx_am_send(ucp_ep_h uep, unsigned id, uint64_t header,
                                  const ProtobufCMessage *msg, bool want_reply)
{
    size_t len = protobuf_c_message_get_packed_size(msg);
    uint8_t *buf = graft__malloc(sizeof(uint64_t) + len + 1);
    if (buf == NULL)
        return GRAFT_ENOMEM;
    memcpy(buf, &header, sizeof(header));
    protobuf_c_message_pack(msg, buf + sizeof(uint64_t));
    return graft__ucx_am_send_owned(uep, id, buf, len, want_reply);
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

bool graft__ucx_rkey_layout_ok(const uint8_t *k, size_t len)
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
void graft__ucx_rkey_layout_learn(bool *unknown, const graft__region_t *r)
{
    if (!*unknown && !graft__ucx_rkey_layout_ok(r->rkey, r->rkey_len)) {
        *unknown = true;
        GRAFT_WARN(GRAFT_MOD_TRANSFER, "UCX packs remote keys in an unknown layout (%zu bytes for "
                   "region '%s'): donors' keys are unpacked unchecked", r->rkey_len, r->name);
    }
}

graft_status_t graft__ucx_set_am_handler(ucp_worker_h w, unsigned id,
                                         ucp_am_recv_callback_t cb, void *arg)
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
        GRAFT_ERROR(GRAFT_MOD_TRANSFER, "ucp_worker_set_am_recv_handler: %s",
                    ucs_status_string(st));
        return GRAFT_ETRANSPORT;
    }
    return GRAFT_OK;
}

static ucs_status_t drop_cb(void *arg, const void *header, size_t header_length, void *data,
                            size_t length, const ucp_am_recv_param_t *param)
{
    (void)arg, (void)header, (void)header_length, (void)data, (void)length;
    return (param->recv_attr & UCP_AM_RECV_ATTR_FLAG_RNDV) ? UCS_ERR_MESSAGE_TRUNCATED : UCS_OK;
}

graft_status_t graft__ucx_drop_all(ucp_worker_h w)
{
    for (unsigned id = 0; id < GRAFT__UCX_AM_IDS; id++) {
        graft_status_t status = graft__ucx_set_am_handler(w, id, drop_cb, NULL);
        if (status != GRAFT_OK)
            return status;
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
    /* A worker opens every network interface UCX may use; one that goes
     * away meanwhile (a container's veth) fails the whole creation with
     * "No such device". The next try sees the interfaces as they are. */
    for (int i = 0; i < 10 && st == UCS_ERR_NO_DEVICE; i++) {
        graft__sleep_ns(20000000ull);
        st = ucp_worker_create(ctx, &wp, w_p);
    }
    if (st != UCS_OK) {
        GRAFT_ERROR(GRAFT_MOD_TRANSFER, "ucp_worker_create: %s", ucs_status_string(st));
        return GRAFT_ETRANSPORT;
    }
    return GRAFT_OK;
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

ucp_context_h graft__ucx_context(graft_transfer_endpoint_t *ep)
{
    return ep->transport->srv_ctx;
}
