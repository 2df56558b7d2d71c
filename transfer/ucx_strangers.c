/*
 * UCX backend, the donor's side: connections that have not proved the job
 * secret yet (docs/TRANSFER.md, "Contexts, devices and strangers"). At
 * most MAX_UNAUTH_CONNS of them are challenged; the rest are refused
 * (accepted, never challenged, closed REFUSE_HOLD_NS later); each is
 * closed AUTH_DEADLINE_NS after it was accepted.
 */
#include "ucx_int.h"

#include "proto/graft.pb-c.h"

#include <string.h>

/* Strangers turned away (closed at the deadline, or to make room): one
 * warning per STRANGER_WARN_NS, with the count since the last. */
static void stranger_note(graft__transport_state_t *t, int why)
{
    static const char *const what[3] = {
        "too many connections without an authenticated request: closed the oldest",
        "closed a connection that sent no authenticated request in time",
        "too many connections without an authenticated request: refused a new one"};
    uint64_t now = graft__now_ns();
    t->strangers[why]++;
    if (t->stranger_warn_ns[why] != 0 && now - t->stranger_warn_ns[why] < STRANGER_WARN_NS)
        return;
    GRAFT_WARN(GRAFT_MOD_TRANSFER, "%s (%llu since the last such warning)", what[why],
               (unsigned long long)t->strangers[why]);
    t->strangers[why] = 0;
    t->stranger_warn_ns[why] = now;
}

static void refused_err_cb(void *arg, ucp_ep_h uep, ucs_status_t status)
{
    (void)arg, (void)uep, (void)status;
}

void graft__ucx_accept_params(ucp_ep_params_t *prm, ucp_conn_request_h req, ucp_err_handler_cb_t cb,
                          void *arg)
{
    memset(prm, 0, sizeof(*prm));
    prm->field_mask = UCP_EP_PARAM_FIELD_CONN_REQUEST | UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE |
                      UCP_EP_PARAM_FIELD_ERR_HANDLER;
    prm->conn_request = req;
    prm->err_mode = UCP_ERR_HANDLING_MODE_PEER;
    prm->err_handler.cb = cb;
    prm->err_handler.arg = arg;
}

/* Refuse a connection (see t->refused). */
void graft__ucx_conn_refuse(graft__transport_state_t *t, ucp_conn_request_h req)
{
    ucp_ep_params_t prm;
    ucp_ep_h uep;
    if (t->n_refused == GRAFT_ARRAY_SIZE(t->refused)) {
        (void)ucp_listener_reject(t->listener, req);
        return;
    }
    graft__ucx_accept_params(&prm, req, refused_err_cb, NULL);
    if (ucp_ep_create(t->worker, &prm, &uep) == UCS_OK) {
        t->refused_ns[t->n_refused] = graft__now_ns();
        t->refused[t->n_refused++] = uep;
        /* A recipient turned away comes back soon (a place frees within
         * UNAUTH_EVICT_NS); a stranger learns nothing. */
        Graft__TransferChallenge busy = GRAFT__TRANSFER_CHALLENGE__INIT;
        busy.version = GRAFT__XFER_WIRE_VERSION;
        busy.busy_retry_ms = REFUSE_RETRY_MS;
        if (graft__ucx_am_send(uep, GRAFT__XFER_AM_CHALLENGE, 0, &busy.base, false) != GRAFT_OK)
            GRAFT_DEBUG(GRAFT_MOD_TRANSFER, "could not tell a refused connection to come back");
    }
}

/* Close the refused connections held long enough (outside UCX's
 * callbacks); the endpoint's teardown closes the rest with the worker. */
void graft__ucx_refused_close(graft__transport_state_t *t)
{
    uint64_t now = graft__now_ns();
    size_t kept = 0;
    for (size_t i = 0; i < t->n_refused; i++) {
        if (now - t->refused_ns[i] < REFUSE_HOLD_NS) {
            t->refused_ns[kept] = t->refused_ns[i];
            t->refused[kept++] = t->refused[i];
            continue;
        }
        ucp_request_param_t prm;
        memset(&prm, 0, sizeof(prm));
        prm.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
        prm.flags = UCP_EP_CLOSE_FLAG_FORCE;
        ucs_status_ptr_t r = ucp_ep_close_nbx(t->refused[i], &prm);
        if (UCS_PTR_IS_PTR(r))
            ucp_request_free(r);
    }
    t->n_refused = kept;
}

/* Neither an authenticated request nor a message came on it yet. */
static bool conn_pending(const ucx_conn_t *c)
{
    return !c->authed && !c->messaged && !c->failed;
}

/* At most MAX_UNAUTH_CONNS pending connections: the oldest is closed (by
 * the reaper) to make room for a new one if it had UNAUTH_EVICT_NS to
 * authenticate (a recipient needs a round trip); false: the new one is to
 * be refused. */
bool graft__ucx_make_room(graft__transport_state_t *t)
{
    ucx_conn_t *oldest = NULL;
    uint32_t n = 0;
    for (ucx_conn_t *c = t->conns; c != NULL; c = c->next) {
        if (!conn_pending(c))
            continue;
        n++;
        if (oldest == NULL || c->accepted_ns < oldest->accepted_ns)
            oldest = c;
    }
    if (n < MAX_UNAUTH_CONNS || oldest == NULL)
        return true;
    if (graft__now_ns() - oldest->accepted_ns < UNAUTH_EVICT_NS) {
        stranger_note(t, 2);
        return false;
    }
    stranger_note(t, 0);
    oldest->failed = true;
    return true;
}

/* Close the pending connections past their deadline (the reaper frees
 * them). */
void graft__ucx_conns_expire(graft__transport_state_t *t)
{
    uint64_t now = graft__now_ns();
    for (ucx_conn_t *c = t->conns; c != NULL; c = c->next) {
        if (conn_pending(c) && now - c->accepted_ns > AUTH_DEADLINE_NS) {
            c->failed = true;
            stranger_note(t, 1);
        }
    }
}
