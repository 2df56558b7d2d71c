/*
 * UCX backend, the recipient's pull: a donor's connection. Made (to its
 * listener, then to its shared-memory worker when its first manifest
 * offers one), failed (its chunks go back to the queue) and closed, by
 * force or once its reads drained. Below ucx_pull.c and
 * ucx_pull_donors.c, calling neither.
 */
#include "ucx_pull.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

void graft__ucx_recip_err_cb(void *arg, ucp_ep_h uep, ucs_status_t status)
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

void graft__ucx_ep_close_start(pull_t *p, pdonor_t *d, bool force)
{
    ucp_request_param_t prm;
    ucs_status_ptr_t req;
    if (d->shm_uep != NULL) {
        /* Always by force: its worker at the donor lives only as long as
         * our first connection, which we close next. */
        if (p->rep->donors[d->index].chunks > 0)
            lanes_describe(d->shm_uep, p->rep->donors[d->index].shm_transports,
                           sizeof(p->rep->donors[d->index].shm_transports));
        memset(&prm, 0, sizeof(prm));
        prm.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
        prm.flags = UCP_EP_CLOSE_FLAG_FORCE;
        req = ucp_ep_close_nbx(d->shm_uep, &prm);
        d->shm_uep = NULL;
        if (UCS_PTR_IS_PTR(req))
            d->shm_close_req = req;
    }
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
void graft__ucx_donor_force_close(pull_t *p, pdonor_t *d)
{
    for (size_t i = 0; i < p->n_slots; i++) {
        pslot_t *s = &p->slots[i];
        if ((p->o->read == GRAFT_TRANSFER_READ_PUSH || d->lptr == NULL ||
             d->lptr[p->chunks[s->chunk].region] == NULL) && s->busy && !s->done &&
            s->donor == d->index && !s->recv_started) {
            s->st = UCS_ERR_CANCELED;
            s->done = true;
        }
    }
    d->close_when_drained = false;
    graft__ucx_ep_close_start(p, d, true);
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
void graft__ucx_donor_fail(pull_t *p, pdonor_t *d, graft_status_t why)
{
    if (d->state == D_FAILED)
        return;
    GRAFT_LOG_AT(p->o->follower && why == GRAFT_ESTEP ? GRAFT_LOG_DEBUG : GRAFT_LOG_WARN,
                 GRAFT_MOD_TRANSFER, "donor %u (%s) dropped: %s", d->index, p->o->donors[d->index],
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
        graft__ucx_donor_force_close(p, d);
    else
        d->close_when_drained = true;
}

/* Graceful closes of dropped donors whose reads have drained. */
void graft__ucx_donors_close_drained(pull_t *p)
{
    for (size_t i = 0; i < p->n_donors; i++) {
        pdonor_t *d = &p->donors[i];
        if (d->close_when_drained && d->inflight == 0) {
            d->close_when_drained = false;
            graft__ucx_ep_close_start(p, d, false);
        }
    }
}

graft_status_t graft__ucx_donor_connect(pull_t *p, pdonor_t *d)
{
    struct sockaddr_in sa;
    ucs_status_t st;

    if (graft__ucx_parse_address(p->o->donors[d->index], &sa) != GRAFT_OK) {
        GRAFT_WARN(GRAFT_MOD_TRANSFER, "bad donor address '%s'", p->o->donors[d->index]);
        return GRAFT_EINVAL;
    }
    st = graft__ucx_connect(d->worker, &sa, graft__ucx_recip_err_cb, d, &d->uep);
    if (st != UCS_OK) {
        GRAFT_WARN(GRAFT_MOD_TRANSFER, "connecting to %s: %s", p->o->donors[d->index],
                   ucs_status_string(st));
        d->uep = NULL;
        return GRAFT_EPEER_UNREACHABLE;
    }
    /* The request waits for the donor's challenge (handle_challenge). */
    return graft__random_bytes(d->nonce, sizeof(d->nonce));
}

graft_status_t graft__ucx_donor_reconnect(pull_t *p, pdonor_t *d, uint64_t now)
{
    if (d->state != D_CONNECTING || d->uep != NULL || d->reconnect_at_ns == 0 ||
        now < d->reconnect_at_ns)
        return GRAFT_OK;
    d->reconnect_at_ns = 0;
    return graft__ucx_donor_connect(p, d);
}

graft_status_t graft__ucx_donor_shm_connect(pull_t *p, pdonor_t *d,
                                            const Graft__TransferManifest *m)
{
    uint8_t copy[SHM_ADDRESS_MAX_BYTES + RKEY_PAD];
    ucp_ep_params_t prm;
    ucs_status_t st;

    /* Only where our own UCX_TLS allows shared memory. */
    if (m->shm_address.len == 0 || p->ep->transport->shm_ctx == NULL || d->shm_uep != NULL)
        return GRAFT_OK;
    if (m->shm_address.len > SHM_ADDRESS_MAX_BYTES || m->shm_ticket.len != sizeof(d->shm_ticket)) {
        GRAFT_WARN(GRAFT_MOD_TRANSFER, "donor %u: a malformed shared-memory offer (%zu bytes)",
                   d->index, m->shm_address.len);
        return GRAFT_EPROTO;
    }
    memcpy(d->shm_ticket, m->shm_ticket.data, sizeof(d->shm_ticket));
    /* Unpacked from an aligned copy with zeros behind it, like keys. */
    memcpy(copy, m->shm_address.data, m->shm_address.len);
    memset(copy + m->shm_address.len, 0, RKEY_PAD);
    memset(&prm, 0, sizeof(prm));
    prm.field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS | UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE |
                     UCP_EP_PARAM_FIELD_ERR_HANDLER;
    prm.address = (const ucp_address_t *)(void *)copy;
    prm.err_mode = UCP_ERR_HANDLING_MODE_PEER;
    prm.err_handler.cb = graft__ucx_recip_err_cb;
    prm.err_handler.arg = d;
    st = ucp_ep_create(d->worker, &prm, &d->shm_uep);
    if (st != UCS_OK) {
        /* Another host after all, or no shared memory in common: read
         * over the connection we have. */
        GRAFT_DEBUG(GRAFT_MOD_TRANSFER, "donor %u: no shared memory (%s); reading over %s",
                    d->index, ucs_status_string(st), p->o->donors[d->index]);
        d->shm_uep = NULL;
    }
    return GRAFT_OK;
}
