/*
 * The relay of test_transfer_forgery.c (header-only, static; one includer):
 * a process of its own that stands between a recipient and an honest
 * donor over real UCX. It accepts the recipient's connection, opens one of
 * its own to the donor's listener and carries every message both ways,
 * changing the donor's answers as its mode says. It holds no job secret.
 */
#ifndef GRAFT_TEST_TRANSFER_FORGERY_RELAY_H
#define GRAFT_TEST_TRANSFER_FORGERY_RELAY_H

#include "transfer_fixture.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include <ucp/api/ucp.h>

#include "proto/graft.pb-c.h"
#include "transfer/transfer_int.h"

enum relay_mode {
    R_PASS = 1,       /* every message as it came */
    R_SWAP,           /* regions 0 and 1 swapped: addresses, keys, and their hashes with them */
    R_PART_FORGED,    /* one hash of answer 1 (a hash part) changed */
    R_PART_REORDER,   /* answers 1 and 2 (hash parts) swapped */
    R_PART_DROP,      /* answer 1 dropped */
    R_PART_REPLAY,    /* answer 1 sent again after answer 2 */
    R_BUSY_FORGED,    /* every answer replaced by a made-up "queued" (GRAFT_EBUSY) */
    R_REFUSAL_SEALED, /* the manifest's status set to GRAFT_ELAYOUT, its seal kept */
    R_REPLAY_CONN,    /* the first answer of an earlier connection instead of this one's */
    R_LAST = R_REPLAY_CONN
};

/* ---- the relay ------------------------------------------------------------ */

/* A message on its way through the relay. */
typedef struct fwd {
    struct fwd *next;
    struct pair *pair;
    bool to_donor;
    unsigned id;
    volatile bool ready; /* a rendezvous message's bytes arrived */
    bool failed;
    uint8_t hdr[16];
    size_t hlen;
    size_t len;
    uint8_t data[];
} fwd_t;

/* A recipient's connection and the relay's own to the donor, on a worker
 * of its own so that the donor's answers say whose they are. */
typedef struct pair {
    struct relay *r;
    ucp_ep_h rep;
    ucp_worker_h dw;
    ucp_ep_h dep;
    int answers; /* from the donor so far */
    fwd_t *held; /* answer 1, sent after answer 2 */
    bool broken; /* one side went away: close the other (the donor counts it) */
    bool closed;
} pair_t;

typedef struct relay {
    ucp_context_h ctx;
    ucp_worker_h w;
    struct sockaddr_in donor;
    int mode;
    ucp_listener_h listener;
    ucp_conn_request_h pending[16];
    int n_pending;
    pair_t pairs[128];
    int n_pairs;
    fwd_t *head, **tail;
    fwd_t *first_answer; /* of the first connection (R_REPLAY_CONN) */
} relay_t;

static void relay_err_cb(void *arg, ucp_ep_h ep, ucs_status_t status)
{
    pair_t *pr = arg;
    (void)ep, (void)status;
    if (getenv("RELAY_DEBUG"))
        fprintf(stderr, "RELAY pair %d %s side: %s\n", (int)(pr - pr->r->pairs),
                ep == pr->rep ? "recipient" : "donor", ucs_status_string(status));
    pr->broken = true;
}

static void ep_close(ucp_worker_h w, ucp_ep_h ep)
{
    ucp_request_param_t prm = {.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS,
                               .flags = UCP_EP_CLOSE_FLAG_FORCE};
    ucs_status_ptr_t q = ucp_ep_close_nbx(ep, &prm);
    if (UCS_PTR_IS_PTR(q)) {
        double end = graft_test_now_s() + 2.0;
        while (ucp_request_check_status(q) == UCS_INPROGRESS && graft_test_now_s() < end)
            ucp_worker_progress(w);
        ucp_request_free(q);
    }
}

static void relay_conn_cb(ucp_conn_request_h req, void *arg)
{
    relay_t *r = arg;
    if (r->n_pending < (int)ARRAY_SIZE(r->pending))
        r->pending[r->n_pending++] = req;
    else
        (void)ucp_listener_reject(r->listener, req);
}

static void fwd_push(relay_t *r, fwd_t *f)
{
    f->next = NULL;
    *r->tail = f;
    r->tail = &f->next;
}

static void fwd_recv_cb(void *request, ucs_status_t status, size_t length, void *user_data)
{
    fwd_t *f = user_data;
    f->failed = status != UCS_OK || length != f->len;
    f->ready = true;
    ucp_request_free(request);
}

/* Take a message in (a rendezvous one is received into the copy). */
static ucs_status_t capture(pair_t *pr, ucp_worker_h w, bool to_donor, unsigned id,
                            const void *hdr, size_t hlen, void *data, size_t len,
                            const ucp_am_recv_param_t *param)
{
    fwd_t *f = calloc(1, sizeof(*f) + len + 1);
    if (f == NULL || hlen > sizeof(f->hdr)) {
        free(f);
        return UCS_OK;
    }
    f->pair = pr;
    f->to_donor = to_donor;
    f->id = id;
    f->hlen = hlen;
    memcpy(f->hdr, hdr, hlen);
    f->len = len;
    if (param->recv_attr & UCP_AM_RECV_ATTR_FLAG_RNDV) {
        ucp_request_param_t prm = {.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK |
                                                   UCP_OP_ATTR_FIELD_USER_DATA,
                                   .cb.recv_am = fwd_recv_cb,
                                   .user_data = f};
        ucs_status_ptr_t q = ucp_am_recv_data_nbx(w, data, f->data, len, &prm);
        if (q == NULL || UCS_PTR_IS_ERR(q)) {
            f->failed = UCS_PTR_IS_ERR(q);
            f->ready = true;
        }
    } else {
        memcpy(f->data, data, len);
        f->ready = true;
    }
    fwd_push(pr->r, f);
    return UCS_OK;
}

/* From the recipient (request, chunk request, done), on the listener's
 * worker: whose it is, by the endpoint it came on. */
static ucs_status_t from_recipient(void *arg, const void *hdr, size_t hlen, void *data,
                                   size_t len, const ucp_am_recv_param_t *param, unsigned id)
{
    relay_t *r = arg;
    if (!(param->recv_attr & UCP_AM_RECV_ATTR_FIELD_REPLY_EP))
        return UCS_OK;
    /* A closed pair's endpoint may have been reused by UCX for a new one. */
    for (int i = r->n_pairs - 1; i >= 0; i--) {
        if (!r->pairs[i].closed && r->pairs[i].rep == param->reply_ep)
            return capture(&r->pairs[i], r->w, true, id, hdr, hlen, data, len, param);
    }
    return UCS_OK;
}

static ucs_status_t req_cb(void *arg, const void *hdr, size_t hlen, void *data, size_t len,
                          const ucp_am_recv_param_t *param)
{
    return from_recipient(arg, hdr, hlen, data, len, param, GRAFT__XFER_AM_REQUEST);
}

static ucs_status_t done_cb(void *arg, const void *hdr, size_t hlen, void *data, size_t len,
                           const ucp_am_recv_param_t *param)
{
    return from_recipient(arg, hdr, hlen, data, len, param, GRAFT__XFER_AM_DONE);
}

static ucs_status_t creq_cb(void *arg, const void *hdr, size_t hlen, void *data, size_t len,
                           const ucp_am_recv_param_t *param)
{
    return from_recipient(arg, hdr, hlen, data, len, param, GRAFT__XFER_AM_CHUNK_REQ);
}

/* From the donor (challenge, answers, pushed chunks), on the pair's worker. */
static ucs_status_t chal_cb(void *arg, const void *hdr, size_t hlen, void *data, size_t len,
                           const ucp_am_recv_param_t *param)
{
    pair_t *pr = arg;
    return capture(pr, pr->dw, false, GRAFT__XFER_AM_CHALLENGE, hdr, hlen, data, len, param);
}

static ucs_status_t answer_cb(void *arg, const void *hdr, size_t hlen, void *data, size_t len,
                             const ucp_am_recv_param_t *param)
{
    pair_t *pr = arg;
    return capture(pr, pr->dw, false, GRAFT__XFER_AM_MANIFEST, hdr, hlen, data, len, param);
}

static ucs_status_t chunk_cb(void *arg, const void *hdr, size_t hlen, void *data, size_t len,
                            const ucp_am_recv_param_t *param)
{
    pair_t *pr = arg;
    return capture(pr, pr->dw, false, GRAFT__XFER_AM_CHUNK_DATA, hdr, hlen, data, len, param);
}

static bool set_handler(ucp_worker_h w, unsigned id, ucp_am_recv_callback_t cb, void *arg)
{
    ucp_am_handler_param_t hp = {.field_mask = UCP_AM_HANDLER_PARAM_FIELD_ID |
                                               UCP_AM_HANDLER_PARAM_FIELD_CB |
                                               UCP_AM_HANDLER_PARAM_FIELD_ARG,
                                 .id = id,
                                 .cb = cb,
                                 .arg = arg};
    return ucp_worker_set_am_recv_handler(w, &hp) == UCS_OK;
}

/* A recipient connected: accept it and connect to the donor for it. */
static void pair_open(relay_t *r, ucp_conn_request_h req)
{
    ucp_worker_params_t wp = {.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE,
                              .thread_mode = UCS_THREAD_MODE_SINGLE};
    if (r->n_pairs == (int)ARRAY_SIZE(r->pairs)) {
        (void)ucp_listener_reject(r->listener, req);
        return;
    }
    pair_t *pr = &r->pairs[r->n_pairs];
    ucp_ep_params_t in = {.field_mask = UCP_EP_PARAM_FIELD_CONN_REQUEST |
                                        UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE |
                                        UCP_EP_PARAM_FIELD_ERR_HANDLER,
                          .conn_request = req,
                          .err_mode = UCP_ERR_HANDLING_MODE_PEER,
                          .err_handler = {.cb = relay_err_cb, .arg = pr}};
    ucp_ep_params_t out = {.field_mask = UCP_EP_PARAM_FIELD_FLAGS | UCP_EP_PARAM_FIELD_SOCK_ADDR |
                                         UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE |
                                         UCP_EP_PARAM_FIELD_ERR_HANDLER,
                           .flags = UCP_EP_PARAMS_FLAGS_CLIENT_SERVER,
                           .sockaddr = {.addr = (struct sockaddr *)&r->donor,
                                        .addrlen = sizeof(r->donor)},
                           .err_mode = UCP_ERR_HANDLING_MODE_PEER,
                           .err_handler = {.cb = relay_err_cb, .arg = pr}};
    pr->r = r;
    if (ucp_ep_create(r->w, &in, &pr->rep) != UCS_OK ||
        ucp_worker_create(r->ctx, &wp, &pr->dw) != UCS_OK ||
        !set_handler(pr->dw, 17, chal_cb, pr) || !set_handler(pr->dw, 12, answer_cb, pr) ||
        !set_handler(pr->dw, 15, chunk_cb, pr) || ucp_ep_create(pr->dw, &out, &pr->dep) != UCS_OK)
        return;
    r->n_pairs++;
}

static void fwd_sent_cb(void *request, ucs_status_t status, void *user_data)
{
    (void)status;
    free(user_data);
    ucp_request_free(request);
}

static void fwd_send(fwd_t *f)
{
    pair_t *pr = f->pair;
    if (pr->closed) {
        free(f);
        return;
    }
    ucp_request_param_t prm = {.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK |
                                               UCP_OP_ATTR_FIELD_USER_DATA |
                                               UCP_OP_ATTR_FIELD_FLAGS,
                               .cb.send = fwd_sent_cb,
                               .user_data = f,
                               .flags = f->to_donor ? UCP_AM_SEND_FLAG_REPLY : 0};
    ucs_status_ptr_t q = ucp_am_send_nbx(f->to_donor ? pr->dep : pr->rep, f->id, f->hdr, f->hlen,
                                         f->data, f->len, &prm);
    if (!UCS_PTR_IS_PTR(q))
        free(f);
}

static fwd_t *fwd_copy(const fwd_t *f, const void *data, size_t len)
{
    fwd_t *c = calloc(1, sizeof(*c) + len + 1);
    assert(c != NULL);
    *c = *f;
    c->next = NULL;
    c->len = len;
    memcpy(c->data, data, len);
    return c;
}

/* @p f with its manifest changed by @p change (its seal, field 14, is
 * packed last again, as the donor wrote it). */
static fwd_t *answer_changed(fwd_t *f, void (*change)(Graft__TransferManifest *))
{
    Graft__TransferManifest *m = graft__transfer_manifest__unpack(NULL, f->len, f->data);
    if (m == NULL)
        return f;
    char *error = m->error;
    change(m);
    /* The seal stays where the donor wrote it, behind every other field
     * (later field numbers included), as an attacker would leave it. */
    Graft__TransferManifest seal_only = GRAFT__TRANSFER_MANIFEST__INIT;
    seal_only.seal = m->seal;
    m->seal.len = 0;
    size_t body = graft__transfer_manifest__get_packed_size(m);
    size_t len = body + graft__transfer_manifest__get_packed_size(&seal_only);
    uint8_t *buf = malloc(len + 1);
    assert(buf != NULL);
    graft__transfer_manifest__pack(m, buf);
    graft__transfer_manifest__pack(&seal_only, buf + body);
    m->seal = seal_only.seal;
    m->error = error; /* change_status() points it at a literal */
    fwd_t *c = fwd_copy(f, buf, len);
    free(buf);
    free(f);
    graft__transfer_manifest__free_unpacked(m, NULL);
    return c;
}

/* Regions 0 and 1 trade places: the recipient would read each from the
 * other's memory, and every hash still matches what it reads. */
static void change_swap(Graft__TransferManifest *m)
{
    if (m->n_regions >= 2) {
        Graft__RegionManifest *a = m->regions[0], *b = m->regions[1];
        uint64_t addr = a->remote_address;
        ProtobufCBinaryData key = a->rkey;
        a->remote_address = b->remote_address;
        a->rkey = b->rkey;
        b->remote_address = addr;
        b->rkey = key;
    }
    for (size_t i = 0; i < m->n_hash_parts; i++) {
        if (m->hash_parts[i]->region < 2)
            m->hash_parts[i]->region ^= 1;
    }
}

static void change_hash(Graft__TransferManifest *m)
{
    if (m->n_hash_parts > 0 && m->hash_parts[0]->n_hashes > 0)
        m->hash_parts[0]->hashes[0] ^= 0x5a5a;
}

static void change_status(Graft__TransferManifest *m)
{
    m->status = GRAFT_ELAYOUT;
    m->error = (char *)"forged: the layouts differ";
}

/* What a donor says when it queues a recipient, made up by the relay. */
static fwd_t *answer_busy(fwd_t *f)
{
    Graft__TransferManifest m = GRAFT__TRANSFER_MANIFEST__INIT;
    uint8_t buf[256];
    m.version = 1;
    m.status = GRAFT_EBUSY;
    m.error = (char *)"queued at place 0; serving 4 recipients at once";
    m.step = STEP;
    m.donor_serving = true;
    size_t len = graft__transfer_manifest__pack(&m, buf);
    fwd_t *c = fwd_copy(f, buf, len);
    free(f);
    return c;
}

/* A donor's answer number pr->answers, on its way to the recipient. */
static void answer_relay(relay_t *r, fwd_t *f)
{
    pair_t *pr = f->pair;
    int k = pr->answers++;
    if (k == 0 && r->first_answer == NULL)
        r->first_answer = fwd_copy(f, f->data, f->len);
    switch (r->mode) {
    case R_SWAP:
        f = answer_changed(f, change_swap);
        break;
    case R_PART_FORGED:
        if (k == 1)
            f = answer_changed(f, change_hash);
        break;
    case R_PART_REORDER:
        if (k == 1) {
            pr->held = f;
            return;
        }
        if (k == 2 && pr->held != NULL) {
            fwd_send(f);
            f = pr->held;
            pr->held = NULL;
        }
        break;
    case R_PART_DROP:
        if (k == 1) {
            free(f);
            return;
        }
        break;
    case R_PART_REPLAY:
        if (k == 1)
            pr->held = fwd_copy(f, f->data, f->len);
        if (k == 2 && pr->held != NULL) {
            fwd_send(f);
            f = pr->held;
            pr->held = NULL;
        }
        break;
    case R_BUSY_FORGED:
        f = answer_busy(f);
        break;
    case R_REFUSAL_SEALED:
        if (k == 0)
            f = answer_changed(f, change_status);
        break;
    case R_REPLAY_CONN:
        if (k == 0 && pr != &r->pairs[0] && r->first_answer != NULL) {
            fwd_t *c = fwd_copy(f, r->first_answer->data, r->first_answer->len);
            free(f);
            f = c;
        }
        break;
    default:
        break;
    }
    fwd_send(f);
}

/* Send what arrived whole, in order. */
static bool relay_flush(relay_t *r)
{
    bool any = false;
    while (r->head != NULL && r->head->ready) {
        fwd_t *f = r->head;
        r->head = f->next;
        if (r->head == NULL)
            r->tail = &r->head;
        any = true;
        if (f->failed)
            free(f);
        else if (!f->to_donor && f->id == 12)
            answer_relay(r, f);
        else
            fwd_send(f);
    }
    return any;
}

static bool relay_progress(relay_t *r)
{
    bool any = false;
    while (ucp_worker_progress(r->w) != 0)
        any = true;
    for (int i = 0; i < r->n_pairs; i++) {
        pair_t *pr = &r->pairs[i];
        while (ucp_worker_progress(pr->dw) != 0)
            any = true;
        if (pr->broken && !pr->closed) {
            /* What is still queued for it is dropped (fwd_send()). */
            pr->closed = true;
            ep_close(r->w, pr->rep);
            ep_close(pr->dw, pr->dep);
        }
    }
    for (int i = 0; i < r->n_pending; i++)
        pair_open(r, r->pending[i]);
    any = any || r->n_pending > 0;
    r->n_pending = 0;
    return relay_flush(r) || any;
}

static bool relay_listen(relay_t *r, char addr[64])
{
    struct sockaddr_in sa = {.sin_family = AF_INET};
    inet_pton(AF_INET, "127.0.0.1", &sa.sin_addr);
    ucp_listener_params_t lp = {
        .field_mask = UCP_LISTENER_PARAM_FIELD_SOCK_ADDR | UCP_LISTENER_PARAM_FIELD_CONN_HANDLER,
        .sockaddr = {.addr = (struct sockaddr *)&sa, .addrlen = sizeof(sa)},
        .conn_handler = {.cb = relay_conn_cb, .arg = r}};
    ucp_listener_attr_t la = {.field_mask = UCP_LISTENER_ATTR_FIELD_SOCKADDR};
    if (ucp_listener_create(r->w, &lp, &r->listener) != UCS_OK ||
        ucp_listener_query(r->listener, &la) != UCS_OK)
        return false;
    snprintf(addr, 64, "127.0.0.1:%u",
             (unsigned)ntohs(((struct sockaddr_in *)&la.sockaddr)->sin_port));
    return true;
}

/* The relay process: relays to the donor at @p donor_addr; takes a mode
 * from @cmd_fd (anything else quits). No job secret anywhere in it. */
static int relay_main(const char *donor_addr, int cmd_fd, int resp_fd)
{
    relay_t *r = calloc(1, sizeof(*r));
    ucp_params_t p = {.field_mask = UCP_PARAM_FIELD_FEATURES, .features = UCP_FEATURE_AM};
    ucp_worker_params_t wp = {.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE,
                              .thread_mode = UCS_THREAD_MODE_SINGLE};
    char addr[64] = {0}, host[64];
    unsigned port = 0;

    if (r == NULL || sscanf(donor_addr, "%63[^:]:%u", host, &port) != 2)
        return 1;
    r->tail = &r->head;
    r->mode = R_PASS;
    r->donor.sin_family = AF_INET;
    r->donor.sin_port = htons((uint16_t)port);
    inet_pton(AF_INET, host, &r->donor.sin_addr);
    if (ucp_init(&p, NULL, &r->ctx) != UCS_OK || ucp_worker_create(r->ctx, &wp, &r->w) != UCS_OK ||
        !set_handler(r->w, 11, req_cb, r) || !set_handler(r->w, 13, done_cb, r) ||
        !set_handler(r->w, 14, creq_cb, r) || !relay_listen(r, addr) ||
        !tf_write_full(resp_fd, addr, sizeof(addr)))
        return 1;
    for (;;) {
        struct pollfd pfd = {.fd = cmd_fd, .events = POLLIN};
        bool busy = relay_progress(r);
        if (poll(&pfd, 1, 0) > 0) {
            int32_t mode;
            if (!tf_read_full(cmd_fd, &mode, sizeof(mode), 1000) || mode < R_PASS ||
                mode > R_LAST)
                break;
            r->mode = mode;
            if (!tf_write_full(resp_fd, &mode, sizeof(mode)))
                break;
        }
        if (!busy)
            usleep(50);
    }
    return 0;
}

static int relay_child(const void *arg, int cmd_fd, int resp_fd)
{
    return relay_main(arg, cmd_fd, resp_fd);
}

static void relay_mode(tf_donor_t *relay, int32_t mode)
{
    int32_t ack = 0;
    assert_true(tf_write_full(relay->cmd_fd, &mode, sizeof(mode)));
    assert_true(tf_read_full(relay->resp_fd, &ack, sizeof(ack), 10000));
    assert_int_equal(ack, mode);
}

#endif
