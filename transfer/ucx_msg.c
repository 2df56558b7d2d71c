/*
 * UCX backend: sending short messages (graft_transfer_msg_send). One worker
 * of the endpoint's context, driven by the sending thread only while it
 * sends, and one connection per peer address, kept until the peer fails or
 * graft_transfer_msg_reset(). Receiving is the listener's: ucx_donor.c hands each
 * message to the inbox (msgbox.c).
 */
#include "ucx_int.h"

#include <string.h>

/* A dead connection's close waits at most this long. */
#define MSG_CLOSE_NS (200ull * 1000000ull)

typedef struct msg_peer {
    char *address;
    ucp_ep_h uep;
    bool failed; /* set by UCX's error callback */
} msg_peer_t;

struct graft__msg_sender {
    pthread_mutex_t mu;
    ucp_worker_h worker;
    msg_peer_t **peers;
    size_t n_peers;
};

static void peer_err_cb(void *arg, ucp_ep_h uep, ucs_status_t status)
{
    msg_peer_t *p = arg;
    (void)uep;
    GRAFT_DEBUG(GRAFT_MOD_TRANSFER, "message connection to %s failed: %s", p->address,
                ucs_status_string(status));
    p->failed = true;
}

/* A connection is closed by force: every message sent on it was flushed
 * before graft__ucx_msg_send() returned (below), so nothing that left this
 * process is cut off by the close (a leader that leaves right after the
 * last round of a barrier). A flushing close waited on a peer that had
 * exited first, and its request, freed at the deadline, was never
 * completed: UCX's "not returned to mpool" warnings at every exit. */
static void peer_close(ucp_worker_h w, msg_peer_t *p)
{
    if (p->uep != NULL) {
        ucp_request_param_t prm;
        memset(&prm, 0, sizeof(prm));
        prm.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
        prm.flags = UCP_EP_CLOSE_FLAG_FORCE;
        ucs_status_ptr_t req = ucp_ep_close_nbx(p->uep, &prm);
        if (UCS_PTR_IS_PTR(req)) {
            /* A flush to a peer that stopped answering ends with the
             * connection's own error handling; past this wait the request
             * is left to complete (or die) with the worker. */
            uint64_t deadline = graft__now_ns() + MSG_CLOSE_NS;
            while (ucp_request_check_status(req) == UCS_INPROGRESS && graft__now_ns() < deadline)
                ucp_worker_progress(w);
            ucp_request_free(req);
        }
    }
    graft_free(p->address);
    graft_free(p);
}

/* Close and forget one connection (s->mu held). */
static void peer_drop(struct graft__msg_sender *s, msg_peer_t *p)
{
    for (size_t i = 0; i < s->n_peers; i++) {
        if (s->peers[i] == p) {
            s->peers[i] = s->peers[--s->n_peers];
            break;
        }
    }
    peer_close(s->worker, p);
}

/* The sender, made on first use. */
static struct graft__msg_sender *sender_get(graft_transfer_endpoint_t *ep)
{
    pthread_mutex_lock(&ep->msg_lock);
    struct graft__msg_sender *s = ep->msg_sender;
    if (s == NULL) {
        s = graft__calloc(1, sizeof(*s));
        if (s != NULL && pthread_mutex_init(&s->mu, NULL) != 0) {
            graft_free(s);
            s = NULL;
        }
        ep->msg_sender = s;
    }
    pthread_mutex_unlock(&ep->msg_lock);
    return s;
}

/* The connection to @p address, made if there is none (s->mu held). */
static graft_status_t peer_get(graft_transfer_endpoint_t *ep, struct graft__msg_sender *s,
                               const char *address, msg_peer_t **p_p)
{
    for (size_t i = 0; i < s->n_peers; i++) {
        msg_peer_t *p = s->peers[i];
        if (strcmp(p->address, address) != 0)
            continue;
        if (!p->failed) {
            *p_p = p;
            return GRAFT_OK;
        }
        /* Failed before: a fresh connection (the peer may be back). */
        peer_drop(s, p);
        break;
    }
    struct sockaddr_in sa;
    if (graft__ucx_parse_address(address, &sa) != GRAFT_OK)
        return GRAFT_EINVAL;
    msg_peer_t **grown = graft__realloc(s->peers, (s->n_peers + 1) * sizeof(*grown));
    if (grown == NULL)
        return GRAFT_ENOMEM;
    s->peers = grown;
    msg_peer_t *p = graft__calloc(1, sizeof(*p));
    if (p == NULL || (p->address = graft__strdup(address)) == NULL) {
        graft_free(p);
        return GRAFT_ENOMEM;
    }
    ucs_status_t st = graft__ucx_connect(s->worker, &sa, peer_err_cb, p, &p->uep);
    if (st != UCS_OK) {
        GRAFT_DEBUG(GRAFT_MOD_TRANSFER, "connecting to %s: %s", address, ucs_status_string(st));
        p->uep = NULL;
        peer_close(s->worker, p);
        return GRAFT_EPEER_UNREACHABLE;
    }
    (void)ep;
    s->peers[s->n_peers++] = p;
    *p_p = p;
    return GRAFT_OK;
}

static ucs_status_t challenge_ignored_cb(void *arg, const void *header, size_t header_length,
                                         void *data, size_t length,
                                         const ucp_am_recv_param_t *param)
{
    (void)arg;
    (void)header;
    (void)header_length;
    (void)data;
    (void)length;
    (void)param;
    return UCS_OK;
}

graft_status_t graft__ucx_msg_send(graft_transfer_endpoint_t *ep, const char *address,
                                   const void *msg, size_t len, uint64_t deadline_ns)
{
    struct graft__msg_sender *s = sender_get(ep);
    if (s == NULL)
        return GRAFT_ENOMEM;
    pthread_mutex_lock(&s->mu);
    graft_status_t st = GRAFT_OK;
    if (s->worker == NULL) {
        st = graft__ucx_worker_create(graft__ucx_context(ep), &s->worker);
        /* A listener challenges every connection (the transfer handshake);
         * a message sender has nothing to prove and drops it. */
        if (st == GRAFT_OK)
            st = graft__ucx_set_am_handler(s->worker, GRAFT__XFER_AM_CHALLENGE,
                                           challenge_ignored_cb, NULL);
    }
    msg_peer_t *p = NULL;
    if (st == GRAFT_OK)
        st = peer_get(ep, s, address, &p);
    if (st != GRAFT_OK)
        goto out;
    ucp_request_param_t prm;
    memset(&prm, 0, sizeof(prm));
    prm.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
    /* The reply flag names the connection to the listener's worker, which
     * drops a message it cannot place. */
    prm.flags = UCP_AM_SEND_FLAG_EAGER | UCP_AM_SEND_FLAG_REPLY;
    ucs_status_ptr_t req = ucp_am_send_nbx(p->uep, GRAFT__XFER_AM_MSG, NULL, 0, msg, len, &prm);
    if (UCS_PTR_IS_ERR(req)) {
        st = graft__ucx_status(UCS_PTR_STATUS(req));
        p->failed = true;
        goto out;
    }
    /* The message lives in the caller's buffer: drive the worker until UCX
     * is done with it (a new connection's wire-up comes first). */
    ucs_status_t us = UCS_OK;
    if (req != NULL) {
        while ((us = ucp_request_check_status(req)) == UCS_INPROGRESS && !p->failed &&
               graft__now_ns() < deadline_ns)
            ucp_worker_progress(s->worker);
        if (us == UCS_INPROGRESS) {
            /* A forced close completes the send (with an error), after
             * which UCX no longer reads the caller's buffer; peer_close
             * forces only a failed connection (a graceful one would leave
             * the send queued, reading the caller's buffer later). */
            st = GRAFT_EPEER_TIMEOUT;
            p->failed = true;
            peer_drop(s, p);
            p = NULL;
        } else if (us != UCS_OK) {
            st = graft__ucx_status(us);
            p->failed = true;
        }
        ucp_request_free(req);
    }
    if (p == NULL)
        goto out;
    /* A send can complete at once with the message only copied into UCX,
     * waiting for the new connection's wire-up; nothing drives this worker
     * between sends, so it would wait there until the next one. Flush the
     * connection: the message is then on its way. */
    if (st == GRAFT_OK) {
        memset(&prm, 0, sizeof(prm));
        ucs_status_ptr_t fl = ucp_ep_flush_nbx(p->uep, &prm);
        if (UCS_PTR_IS_ERR(fl)) {
            st = graft__ucx_status(UCS_PTR_STATUS(fl));
            p->failed = true;
        } else if (fl != NULL) {
            while ((us = ucp_request_check_status(fl)) == UCS_INPROGRESS && !p->failed &&
                   graft__now_ns() < deadline_ns)
                ucp_worker_progress(s->worker);
            if (us == UCS_INPROGRESS) {
                st = GRAFT_EPEER_TIMEOUT;
                p->failed = true;
            } else if (us != UCS_OK) {
                st = graft__ucx_status(us);
                p->failed = true;
            }
            /* Released in any state: one still in flight is freed by UCX
             * when it completes, not left to the worker's teardown ("not
             * returned to mpool" at exit). */
            ucp_request_free(fl);
        }
    }
    /* Let an error callback of this send run before the caller sends again. */
    ucp_worker_progress(s->worker);
    if (st == GRAFT_OK && p->failed)
        st = GRAFT_EPEER;
out:
    pthread_mutex_unlock(&s->mu);
    if (st != GRAFT_OK)
        GRAFT_DEBUG(GRAFT_MOD_TRANSFER, "message to %s: %s", address, graft_status_string(st));
    return st;
}

void graft__ucx_msg_forget(graft_transfer_endpoint_t *ep)
{
    struct graft__msg_sender *s = ep->msg_sender;
    if (s == NULL)
        return;
    pthread_mutex_lock(&s->mu);
    for (size_t i = 0; i < s->n_peers; i++)
        peer_close(s->worker, s->peers[i]);
    graft_free(s->peers);
    s->peers = NULL;
    s->n_peers = 0;
    pthread_mutex_unlock(&s->mu);
}

/* Called from the backend's teardown: the sender goes with the context. */
void graft__ucx_msg_fini(graft_transfer_endpoint_t *ep)
{
    struct graft__msg_sender *s = ep->msg_sender;
    if (s == NULL)
        return;
    graft__ucx_msg_forget(ep);
    if (s->worker != NULL)
        ucp_worker_destroy(s->worker);
    pthread_mutex_destroy(&s->mu);
    graft_free(s);
    ep->msg_sender = NULL;
}
