/*
 * UCX backend, the donor's connections: accepted on the listener's worker
 * with a challenge, their messages queued for the progress thread
 * (ucx_donor.c answers them), and failed ones closed and reaped, a lost
 * recipient counted for the fence.
 */
#include "ucx_int.h"

#include "proto/graft.pb-c.h"

#include <string.h>

ucx_conn_t *graft__ucx_conn_find(graft__transport_state_t *t, ucp_ep_h uep)
{
    for (ucx_conn_t *c = t->conns; c != NULL; c = c->next) {
        if (c->ep == uep)
            return c;
    }
    return NULL;
}

static void donor_conn_err_cb(void *arg, ucp_ep_h uep, ucs_status_t status)
{
    ucx_conn_t *c = arg;
    (void)uep;
    GRAFT_DEBUG(GRAFT_MOD_TRANSFER, "recipient connection failed: %s", ucs_status_string(status));
    c->failed = true;
}

/* The listener's callback: accept @p req on the listener's worker at once
 * (a request left for later finds more clients gone) and send it the
 * challenge: a recipient's request must carry a MAC over our nonce. */
void graft__ucx_conn_handler(ucp_conn_request_h req, void *arg)
{
    graft__transport_state_t *t = arg;
    graft_transfer_endpoint_t *ep = t->ep;
    ucp_ep_params_t prm;
    ucs_status_t st;

    if (!graft__ucx_make_room(t)) {
        graft__ucx_conn_refuse(t, req);
        return;
    }
    ucx_conn_t *c = graft__calloc(1, sizeof(*c));
    if (c == NULL || graft__random_bytes(c->nonce, sizeof(c->nonce)) != GRAFT_OK) {
        GRAFT_ERROR(GRAFT_MOD_TRANSFER, "%s accepting a connection",
                    c == NULL ? "out of memory" : "no random bytes");
        (void)ucp_listener_reject(t->listener, req);
        graft_free(c);
        return;
    }
    c->t = t;
    c->accepted_ns = graft__now_ns();
    c->shm_efd = -1;
    ucp_conn_request_attr_t ra = {.field_mask = UCP_CONN_REQUEST_ATTR_FIELD_CLIENT_ADDR};
    c->peer_local = t->shm_ctx != NULL && ucp_conn_request_query(req, &ra) == UCS_OK &&
                    graft__ucx_addr_is_local((const struct sockaddr *)&ra.client_address);
    graft__ucx_accept_params(&prm, req, donor_conn_err_cb, c);
    st = ucp_ep_create(t->worker, &prm, &c->ep);
    if (st == UCS_ERR_UNREACHABLE || st == UCS_ERR_CONNECTION_RESET ||
        st == UCS_ERR_NOT_CONNECTED || st == UCS_ERR_ENDPOINT_TIMEOUT) {
        /* The client left before it was accepted: nothing of ours failed. */
        GRAFT_DEBUG(GRAFT_MOD_TRANSFER, "accepting a connection: %s", ucs_status_string(st));
        graft_free(c);
        return;
    }
    if (st != UCS_OK) {
        uint64_t n = atomic_fetch_add(&ep->serve_failures, 1) + 1;
        GRAFT_ERROR(GRAFT_MOD_TRANSFER, "accepting a connection: %s; this endpoint cannot serve "
                    "(%llu in a row, graft_transfer_serve_failures)", ucs_status_string(st),
                    (unsigned long long)n);
        graft_free(c);
        return;
    }
    atomic_store(&ep->serve_failures, 0);
    c->next = t->conns;
    t->conns = c;
    Graft__TransferChallenge ch = GRAFT__TRANSFER_CHALLENGE__INIT;
    ch.version = GRAFT__XFER_WIRE_VERSION;
    ch.nonce.data = c->nonce;
    ch.nonce.len = sizeof(c->nonce);
    c->challenged =
        graft__ucx_am_send(c->ep, GRAFT__XFER_AM_CHALLENGE, 0, &ch.base, false) == GRAFT_OK;
    if (!c->challenged)
        GRAFT_WARN(GRAFT_MOD_TRANSFER, "could not send a new connection its challenge");
}

static ucs_status_t donor_request_cb(void *arg, const void *header, size_t header_length,
                                     void *data, size_t length, const ucp_am_recv_param_t *param)
{
    return graft__ucx_donor_enqueue(arg, NULL, GRAFT__XFER_AM_REQUEST, header, header_length,
                                    data, length, param);
}

static ucs_status_t donor_done_cb(void *arg, const void *header, size_t header_length,
                                  void *data, size_t length, const ucp_am_recv_param_t *param)
{
    return graft__ucx_donor_enqueue(arg, NULL, GRAFT__XFER_AM_DONE, header, header_length, data,
                                    length, param);
}

static ucs_status_t donor_chunk_req_cb(void *arg, const void *header, size_t header_length,
                                       void *data, size_t length,
                                       const ucp_am_recv_param_t *param)
{
    return graft__ucx_donor_enqueue(arg, NULL, GRAFT__XFER_AM_CHUNK_REQ, header, header_length,
                                    data, length, param);
}

/* A short message (graft_transfer_msg_send): into the endpoint's inbox. A
 * rendezvous one is longer than any message and is refused. */
static ucs_status_t msg_cb(void *arg, const void *header, size_t header_length, void *data,
                           size_t length, const ucp_am_recv_param_t *param)
{
    graft__transport_state_t *t = arg;
    ucx_conn_t *c = (param->recv_attr & UCP_AM_RECV_ATTR_FIELD_REPLY_EP)
                        ? graft__ucx_conn_find(t, param->reply_ep) : NULL;
    (void)header;
    (void)header_length;
    if (c == NULL || c->failed) {
        GRAFT_DEBUG(GRAFT_MOD_TRANSFER, "a message on an unknown connection dropped");
        return UCS_OK;
    }
    c->messaged = true; /* a sender's connection: no deadline */
    if (param->recv_attr & UCP_AM_RECV_ATTR_FLAG_RNDV) {
        GRAFT_DEBUG(GRAFT_MOD_TRANSFER, "a message of %zu bytes refused", length);
        return UCS_ERR_MESSAGE_TRUNCATED;
    }
    graft__transfer_msg_deliver(t->ep, data, length);
    return UCS_OK;
}

graft_status_t graft__ucx_donor_handlers(graft__transport_state_t *t)
{
    graft_status_t status = graft__ucx_drop_all(t->worker);
    if (status == GRAFT_OK)
        status = graft__ucx_set_am_handler(t->worker, GRAFT__XFER_AM_REQUEST, donor_request_cb, t);
    if (status == GRAFT_OK)
        status = graft__ucx_set_am_handler(t->worker, GRAFT__XFER_AM_DONE, donor_done_cb, t);
    if (status == GRAFT_OK)
        status = graft__ucx_set_am_handler(t->worker, GRAFT__XFER_AM_CHUNK_REQ,
                                           donor_chunk_req_cb, t);
    if (status == GRAFT_OK)
        status = graft__ucx_set_am_handler(t->worker, GRAFT__XFER_AM_MSG, msg_cb, t);
    return status;
}

/* Close a connection by force; UCX completes its requests (with errors)
 * and then the close, and only then is @p c freed: its error callback
 * holds it until then. */
void graft__ucx_conn_close(graft__transport_state_t *t, ucx_conn_t *c)
{
    ucp_request_param_t prm;
    memset(&prm, 0, sizeof(prm));
    prm.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
    prm.flags = UCP_EP_CLOSE_FLAG_FORCE;
    c->close_req = ucp_ep_close_nbx(c->ep, &prm);
    if (UCS_PTR_IS_ERR(c->close_req))
        c->close_req = NULL;
    c->next = t->closing;
    t->closing = c;
}

void graft__ucx_closing_reap(graft__transport_state_t *t, bool all)
{
    if (all) {
        uint64_t deadline = graft__now_ns() + TEARDOWN_NS;
        bool pending = true;
        while (pending && graft__now_ns() < deadline) {
            pending = false;
            for (ucx_conn_t *c = t->closing; c != NULL; c = c->next)
                pending |= c->close_req != NULL &&
                           ucp_request_check_status(c->close_req) == UCS_INPROGRESS;
            if (pending)
                ucp_worker_progress(t->worker);
        }
    }
    ucx_conn_t **pp = &t->closing;
    while (*pp != NULL) {
        ucx_conn_t *c = *pp;
        if (!all && c->close_req != NULL &&
            ucp_request_check_status(c->close_req) == UCS_INPROGRESS) {
            pp = &c->next;
            continue;
        }
        *pp = c->next;
        if (c->close_req != NULL)
            ucp_request_free(c->close_req);
        graft__ucx_conn_shm_close(c);
        graft_free(c);
    }
}

void graft__ucx_conns_reap(graft__transport_state_t *t)
{
    ucx_conn_t **pp = &t->conns;
    graft__ucx_conns_expire(t);
    while (*pp != NULL) {
        ucx_conn_t *c = *pp;
        if (c->failed && !c->close_due) {
            /* Closed after one more ucp_worker_progress(), which delivers
             * the events UCX 1.13 queued for its socket meanwhile: one
             * still queued when the socket closes goes to the next socket
             * given the same descriptor, and fails an assertion there
             * (fixed in UCX 1.22, "Filter stale missed fd events"). */
            c->close_due = true;
            pp = &c->next;
        } else if (c->failed) {
            *pp = c->next;
            graft__transfer_follow_unask(t->ep, &c->follow_wanting, false);
            if (c->fence_owed) {
                /* The recipient died or dropped this donor before it said
                 * it was done, or left the queue (it finished from other
                 * donors): it will not read any more, so the fence need
                 * not wait for it (fence_timeout_ms used to). */
                if (c->queued)
                    GRAFT_DEBUG(GRAFT_MOD_TRANSFER, "a queued recipient of step %llu left",
                                (unsigned long long)c->fence_step);
                else
                    GRAFT_WARN(GRAFT_MOD_TRANSFER, "a recipient of step %llu was lost before it "
                               "was done; the fence counts it",
                               (unsigned long long)c->fence_step);
                if (c->follower && !c->queued)
                    graft__transfer_follow_note(t->ep, c->gen);
                else if (!c->follower)
                    graft__transfer_fence_note(t->ep, c->fence_step, c->gen);
            }
            graft__ucx_conn_close(t, c);
        } else {
            pp = &c->next;
        }
    }
    graft__ucx_closing_reap(t, false);
}
