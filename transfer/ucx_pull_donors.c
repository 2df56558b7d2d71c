/*
 * UCX backend, the recipient's pull: each donor's answers. The request,
 * the manifest it answers with (checked against the endpoint's regions and
 * the other donors'), its streamed hash parts (each chunk checked against
 * them, drift between donors reported), and a place in its admission queue
 * or a refusal to retry. Its connection and failure are ucx_pull_conn.c's.
 */
#include "ucx_pull.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

/* Check a fetched chunk against its donor's hash, once both are here (the
 * chunk in ucx_pull.c, the hash in a hash part): a mismatch fails the donor. */
void graft__ucx_chunk_verify(pull_t *p, uint64_t c)
{
    pchunk_t *ch = &p->chunks[c];
    pdonor_t *d = &p->donors[(size_t)ch->donor];
    if (!d->known[c])
        return;
    if (ch->got != d->hash[c]) {
        GRAFT_WARN(GRAFT_MOD_TRANSFER, "chunk %llu of region '%s' from donor %u does not match "
                   "its hash", (unsigned long long)(c - chunk_region(p, c)->first_chunk),
                   chunk_region(p, c)->name, d->index);
        graft__ucx_donor_fail(p, d, GRAFT_EHASH);
        return;
    }
    uint64_t len = chunk_len(p, c);
    ch->state = CH_DONE;
    p->done_chunks++;
    p->done_bytes += len;
    p->rep->donors[d->index].chunks++;
    p->rep->donors[d->index].bytes += len;
}

/* Two donors' manifests disagree on chunk @p c: report the drift. */
static void drift_report(pull_t *p, uint64_t c, uint32_t a, uint32_t b, uint64_t ha,
                         uint64_t hb)
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
    GRAFT_ERROR(GRAFT_MOD_TRANSFER, "replica drift: region '%s' chunk %llu: donor %u has %016llx, "
                "donor %u has %016llx", r->name, (unsigned long long)p->rep->drift.chunk, a,
                (unsigned long long)ha, b, (unsigned long long)hb);
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

/* First manifest of a donor: check it against our table (transfer_accept.c),
 * unpack keys. */
static graft_status_t manifest_accept(pull_t *p, pdonor_t *d, const Graft__TransferManifest *m)
{
    graft_transfer_endpoint_t *ep = p->ep;
    if (m->status != 0) {
        graft_status_t st = graft__xfer_refusal_status(m->status);
        GRAFT_LOG_AT(p->o->follower && st == GRAFT_ESTEP ? GRAFT_LOG_DEBUG : GRAFT_LOG_WARN,
                     GRAFT_MOD_TRANSFER, "donor %u refused: %s (%s)", d->index,
                     m->error != NULL ? m->error : "", graft_status_name(st));
        return st;
    }
    if (graft__xfer_manifest_check(ep, p->step, m, RKEY_MAX_BYTES, d->index) != GRAFT_OK)
        return GRAFT_EPROTO;
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
        d->raddr[i] = rm->remote_address;
        if (r->bytes == 0)
            continue;
        if (!p->ep->transport->rkey_layout_unknown &&
            !graft__ucx_rkey_layout_ok(rm->rkey.data, rm->rkey.len)) {
            GRAFT_WARN(GRAFT_MOD_TRANSFER, "donor %u: remote key of '%s' is malformed (%zu bytes)",
                       d->index, r->name, rm->rkey.len);
            return GRAFT_EPROTO;
        }
        uint8_t key[RKEY_MAX_BYTES + RKEY_PAD];
        memcpy(key, rm->rkey.data, rm->rkey.len);
        memset(key + rm->rkey.len, 0, RKEY_PAD);
        ucs_status_t st = ucp_ep_rkey_unpack(d->uep, key, &d->rkeys[i]);
        if (st != UCS_OK) {
            GRAFT_WARN(GRAFT_MOD_TRANSFER, "donor %u: remote key of '%s': %s", d->index, r->name,
                       ucs_status_string(st));
            return GRAFT_EPROTO;
        }
        void *lp = NULL;
        if (ucp_rkey_ptr(d->rkeys[i], rm->remote_address, &lp) == UCS_OK) {
            if (!range_mapped(lp, r->bytes)) {
                GRAFT_WARN(GRAFT_MOD_TRANSFER,
                           "donor %u: '%s' at %#llx lies outside the memory its "
                           "key maps", d->index, r->name, (unsigned long long)rm->remote_address);
                return GRAFT_EPROTO;
            }
            d->lptr[i] = lp;
            GRAFT_DEBUG(GRAFT_MOD_TRANSFER, "donor %u: '%s' is mapped here", d->index, r->name);
        }
    }
    if (graft__ucx_donor_shm_connect(p, d, m) != GRAFT_OK)
        return GRAFT_EPROTO;
    d->state = D_READY;
    return GRAFT_OK;
}

static graft_status_t hash_parts_apply(pull_t *p, pdonor_t *d, const Graft__TransferManifest *m)
{
    graft_transfer_endpoint_t *ep = p->ep;
    if (graft__xfer_hash_parts_check(ep, m) != GRAFT_OK)
        return GRAFT_EPROTO;
    for (size_t i = 0; i < m->n_hash_parts; i++) {
        const Graft__ChunkHashes *h = m->hash_parts[i];
        const graft__region_t *r = &ep->regions[h->region];
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
                drift_report(p, c, (uint32_t)p->ref_donor[c], d->index,
                                        p->ref_hash[c], v);
                return GRAFT_OK;
            }
            if (p->chunks[c].state == CH_FETCHED && p->chunks[c].donor == (int8_t)d->index)
                graft__ucx_chunk_verify(p, c);
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
void graft__ucx_queue_leave(pull_t *p, pdonor_t *d)
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
    if (m->status != GRAFT_EBUSY || m->step != p->step)
        return false;
    if (!d->queued) {
        d->queued = true;
        d->queued_since_ns = now;
        GRAFT_DEBUG(GRAFT_MOD_TRANSFER, "donor %u: %s", d->index, m->error != NULL ? m->error : "");
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
    if (m->status == GRAFT_ESTEP && m->donor_serving)
        p->rep->donors[d->index].serving_step = m->step;
    if (m->status == GRAFT_ESTEP && m->donor_serving && m->step > p->step && p->o->follower &&
        p->n_donors == 1) {
        /* A follower takes the later step its donor serves, on the same
         * connection: a new one would come too late for a short step. */
        p->step = m->step;
        d->retry_at_ns = now;
        d->refused = GRAFT_ESTEP;
        return true;
    }
    if (m->status != GRAFT_ESTEP || (m->donor_serving && m->step >= p->step))
        return false;
    if (p->o->step_retry_ms > 0)
        d->retry_ns = (uint64_t)p->o->step_retry_ms * 1000000ull;
    else
        d->retry_ns = d->retry_ns == 0 ? 10000000ull : GRAFT_MIN(2 * d->retry_ns, 200000000ull);
    if (now + d->retry_ns >= d->connect_deadline)
        return false;
    d->retry_at_ns = now + d->retry_ns;
    d->refused = GRAFT_ESTEP;
    GRAFT_DEBUG(GRAFT_MOD_TRANSFER, "donor %u does not serve step %llu yet (%s): asking again",
                d->index, (unsigned long long)p->step, m->error != NULL ? m->error : "");
    return true;
}

/* Send the requests whose back-off is over. */
void graft__ucx_donors_retry(pull_t *p)
{
    uint64_t now = graft__now_ns();
    for (size_t i = 0; i < p->n_donors; i++) {
        pdonor_t *d = &p->donors[i];
        if (d->state != D_CONNECTING || !d->challenged || d->retry_at_ns == 0 ||
            now < d->retry_at_ns)
            continue;
        d->retry_at_ns = 0;
        graft_status_t st = donor_send_request(p, d);
        if (st != GRAFT_OK)
            graft__ucx_donor_fail(p, d, st);
    }
}

/* Close the connection to donor @p d and connect again after a jittered
 * back-off of at least @p at_least_ns, if the connect deadline allows. */
static bool donor_retry_later(pull_t *p, pdonor_t *d, uint64_t now, uint64_t at_least_ns,
                              bool force)
{
    d->reconnect_ns = d->reconnect_ns == 0 ? RECONNECT_FIRST_NS
                                           : GRAFT_MIN(2 * d->reconnect_ns, RECONNECT_MAX_NS);
    uint64_t wait = GRAFT_MAX(d->reconnect_ns, at_least_ns), jitter = 0;
    if (graft__random_bytes(&jitter, sizeof(jitter)) != GRAFT_OK)
        jitter = now; /* any spread will do */
    wait = wait / 2 + jitter % (wait / 2 + 1);
    if (now + wait >= d->connect_deadline)
        return false;
    if (d->close_req != NULL)
        ucp_request_free(d->close_req);
    d->close_req = NULL;
    graft__ucx_ep_close_start(p, d, force);
    d->err_flag = false;
    d->reconnect_at_ns = now + wait;
    GRAFT_INFO(GRAFT_MOD_TRANSFER, "donor %u (%s) turned the connection away: again in %llu ms",
               d->index, p->o->donors[d->index], (unsigned long long)(wait / 1000000ull));
    return true;
}

bool graft__ucx_donor_turned_away(pull_t *p, pdonor_t *d, uint64_t now)
{
    if (d->state != D_CONNECTING || d->challenged || d->uep == NULL ||
        d->err_status != UCS_ERR_CONNECTION_RESET)
        return false;
    return donor_retry_later(p, d, now, 0, true);
}

/* The donor's challenge: remember its nonce and send the request, whose
 * MAC covers it. A second challenge on the connection is a protocol error. */
static void handle_challenge(pull_t *p, pdonor_t *d, ucx_msg_t *msg)
{
    bool oom = false;
    ProtobufCAllocator pa = graft__pb_allocator_tracked(&oom);
    Graft__TransferChallenge *ch = graft__transfer_challenge__unpack(&pa, msg->len, msg->data);
    graft_status_t st = GRAFT_EPROTO;
    if (ch == NULL && oom) {
        GRAFT_ERROR(GRAFT_MOD_TRANSFER, "out of memory decoding a challenge");
        if (p->status == GRAFT_OK)
            p->status = GRAFT_ENOMEM;
        return;
    }
    if (ch != NULL && ch->version == GRAFT__XFER_WIRE_VERSION && ch->nonce.len == 0 &&
        ch->busy_retry_ms > 0 && !d->challenged) {
        /* Turned away: the donor's places for new connections are taken. */
        uint64_t at_least = (uint64_t)GRAFT_MIN(ch->busy_retry_ms, 1000u) * 1000000ull;
        if (donor_retry_later(p, d, graft__now_ns(), at_least, false))
            st = GRAFT_OK;
        else
            st = GRAFT_EBUSY;
    } else if (ch == NULL || ch->version != GRAFT__XFER_WIRE_VERSION ||
        ch->nonce.len != GRAFT_NONCE_BYTES || d->challenged) {
        GRAFT_WARN(GRAFT_MOD_TRANSFER, "donor %u (%s) sent a malformed or second challenge",
                   d->index, p->o->donors[d->index]);
    } else {
        memcpy(d->donor_nonce, ch->nonce.data, GRAFT_NONCE_BYTES);
        d->challenged = true;
        st = donor_send_request(p, d);
    }
    graft__transfer_challenge__free_unpacked(ch, &graft__pb_allocator);
    if (st == GRAFT_ENOMEM && p->status == GRAFT_OK)
        p->status = GRAFT_ENOMEM;
    if (st != GRAFT_OK)
        graft__ucx_donor_fail(p, d, st);
}

/*
 * An answer whose seal does not hold (docs/SECURITY.md): nothing of it is
 * used and the donor is dropped with GRAFT_ETOKEN, whatever it says. One
 * that carries no seal at all is what an honest donor sends when it could
 * not authenticate our request (another job secret, a version or request
 * it cannot read): what it claims is logged, never acted on, so a forged
 * refusal cannot keep us queued, make us ask again, or report a refusal
 * the donor did not make. A seal that does not match is an answer altered,
 * reordered, dropped or replayed on the way, or another secret's.
 */
static void answer_unauthentic(pull_t *p, pdonor_t *d, const ucx_msg_t *msg, bool sealed)
{
    Graft__TransferManifest *m = NULL;
    if (!sealed)
        m = graft__transfer_manifest__unpack(&graft__pb_allocator, msg->len, msg->data);
    if (sealed)
        GRAFT_WARN(GRAFT_MOD_TRANSFER, "donor %u (%s): answer %llu fails its seal (altered, "
                   "reordered or replayed on the way, or another job secret's): nothing of it "
                   "is used", d->index, p->o->donors[d->index], (unsigned long long)d->seq);
    else if (m != NULL && m->status != 0)
        GRAFT_WARN(GRAFT_MOD_TRANSFER, "donor %u (%s) answered without proving it holds the job "
                   "secret (unsealed refusal, says %s: %.160s): taken as a failed handshake",
                   d->index, p->o->donors[d->index], graft_status_name((graft_status_t)m->status),
                   m->error != NULL ? m->error : "");
    else
        GRAFT_WARN(GRAFT_MOD_TRANSFER, "donor %u (%s) sent an answer not sealed with the job "
                   "secret: nothing of it is used", d->index, p->o->donors[d->index]);
    graft__transfer_manifest__free_unpacked(m, &graft__pb_allocator);
    graft__ucx_donor_fail(p, d, GRAFT_ETOKEN);
}

/* Check the seal of a donor's answer before anything reads it (unsealed:
 * dropped); then decode the bytes it covers into *@p m_p. */
static graft_status_t answer_open(pull_t *p, pdonor_t *d, const ucx_msg_t *msg,
                                  Graft__TransferManifest **m_p)
{
    size_t body_len = 0;
    bool sealed = false, oom = false;
    graft_status_t st = GRAFT_ETOKEN;
    if (d->challenged)
        st = graft__xfer_unseal(p->ep->job_secret, p->ep->job_secret_len, d->nonce,
                                d->donor_nonce, d->seq, msg->data, msg->len, &body_len, &sealed);
    if (st == GRAFT_ETOKEN) {
        answer_unauthentic(p, d, msg, sealed);
        return st;
    }
    if (st != GRAFT_OK)
        return st;
    d->seq++;
    ProtobufCAllocator pa = graft__pb_allocator_tracked(&oom);
    *m_p = graft__transfer_manifest__unpack(&pa, body_len, msg->data);
    if (*m_p == NULL && oom)
        return GRAFT_ENOMEM;
    if (*m_p == NULL || (*m_p)->version != GRAFT__XFER_WIRE_VERSION) {
        GRAFT_WARN(GRAFT_MOD_TRANSFER, "donor %u sent a malformed manifest", d->index);
        graft__ucx_donor_fail(p, d, GRAFT_EPROTO);
        return GRAFT_EPROTO;
    }
    return GRAFT_OK;
}

void graft__ucx_handle_donor_msg(pull_t *p, ucx_msg_t *msg)
{
    uint64_t idx = msg->header & 0xff;
    Graft__TransferManifest *m = NULL;
    graft_status_t st;

    if (!msg->has_header || (msg->header >> 8) != p->nonce || idx >= p->n_donors) {
        GRAFT_WARN(GRAFT_MOD_TRANSFER, "manifest for another pull dropped");
        return;
    }
    pdonor_t *d = &p->donors[idx];
    d->answered = true;
    if (d->state == D_FAILED)
        return;
    if (msg->id == GRAFT__XFER_AM_CHALLENGE) {
        handle_challenge(p, d, msg);
        return;
    }
    if (msg->too_large) {
        GRAFT_WARN(GRAFT_MOD_TRANSFER, "donor %u: an answer did not arrive whole", d->index);
        graft__ucx_donor_fail(p, d, GRAFT_EPROTO);
        return;
    }
    st = answer_open(p, d, msg, &m);
    if (st == GRAFT_ENOMEM || st == GRAFT_ESYS) {
        GRAFT_ERROR(GRAFT_MOD_TRANSFER, "%s opening a manifest", graft_status_string(st));
        if (p->status == GRAFT_OK)
            p->status = st;
        goto out;
    }
    if (st != GRAFT_OK)
        goto out;
    d->last_ns = graft__now_ns();
    if (d->state == D_CONNECTING && (queued_retry(p, d, m) || step_refusal_retry(p, d, m)))
        goto out;
    if (d->state == D_CONNECTING) {
        graft__ucx_queue_leave(p, d);
        st = manifest_accept(p, d, m);
        if (st == GRAFT_ENOMEM) {
            GRAFT_ERROR(GRAFT_MOD_TRANSFER, "out of memory accepting a manifest");
            if (p->status == GRAFT_OK)
                p->status = GRAFT_ENOMEM;
            goto out;
        }
        if (st != GRAFT_OK) {
            graft__ucx_donor_fail(p, d, st);
            goto out;
        }
        GRAFT_DEBUG(GRAFT_MOD_TRANSFER, "donor %u: manifest with %zu hash parts%s", d->index,
                    m->n_hash_parts, m->hashes_final ? " (final)" : "");
    } else if (m->n_regions != 0 || m->status != 0) {
        graft__ucx_donor_fail(p, d, GRAFT_EPROTO);
        goto out;
    }
    st = hash_parts_apply(p, d, m);
    if (st != GRAFT_OK) {
        GRAFT_WARN(GRAFT_MOD_TRANSFER, "donor %u sent bad chunk hashes", d->index);
        graft__ucx_donor_fail(p, d, st);
    }
out:
    graft__transfer_manifest__free_unpacked(m, &graft__pb_allocator);
}

/*
 * A donor's answers are handled in the order they came, each once all its
 * bytes are here: a big one (a region table, a hash part) comes by
 * rendezvous and completes after small ones sent behind it, and the seal's
 * sequence number counts the answers in the order the donor sent them.
 */
void graft__ucx_donors_answers(pull_t *p)
{
    for (size_t i = 0; i < p->n_donors; i++) {
        pdonor_t *d = &p->donors[i];
        while (d->answers.head != NULL && d->answers.head->ready) {
            ucx_msg_t *m = graft__ucx_msgq_pop(&d->answers);
            graft__ucx_handle_donor_msg(p, m);
            graft_free(m);
        }
    }
}

/* A rendezvous answer's bytes arrived (or did not: it is handled as lost). */
static void rndv_recv_cb(void *request, ucs_status_t status, size_t length, void *user_data)
{
    ucx_msg_t *m = user_data;
    if (status != UCS_OK || length != m->len)
        m->too_large = true;
    m->ready = true;
    ucp_request_free(request);
}

ucs_status_t graft__ucx_recip_challenge_cb(void *arg, const void *header, size_t header_length,
                                           void *data, size_t length,
                                           const ucp_am_recv_param_t *param)
{
    pdonor_t *d = arg;
    pull_t *p = d->pull;
    (void)header;
    (void)header_length;
    if ((param->recv_attr & UCP_AM_RECV_ATTR_FLAG_RNDV) != 0 || length > REQUEST_MAX_BYTES) {
        GRAFT_WARN(GRAFT_MOD_TRANSFER, "oversized challenge from donor %u dropped", d->index);
        return (param->recv_attr & UCP_AM_RECV_ATTR_FLAG_RNDV) != 0 ? UCS_ERR_MESSAGE_TRUNCATED
                                                                    : UCS_OK;
    }
    ucx_msg_t *m = graft__malloc(sizeof(*m) + length);
    if (m == NULL) {
        if (p->status == GRAFT_OK)
            p->status = GRAFT_ENOMEM;
        return UCS_OK;
    }
    memset(m, 0, sizeof(*m));
    m->id = GRAFT__XFER_AM_CHALLENGE;
    /* Each donor has its own worker: the challenge is this donor's. */
    m->has_header = true;
    m->header = (p->nonce << 8) | d->index;
    m->len = length;
    if (length > 0)
        memcpy(m->data, data, length);
    graft__ucx_msgq_push(&p->msgs, m);
    return UCS_OK;
}

ucs_status_t graft__ucx_recip_am_cb(void *arg, const void *header, size_t header_length,
                                    void *data, size_t length, const ucp_am_recv_param_t *param)
{
    pdonor_t *d = arg;
    pull_t *p = d->pull;
    ucx_msg_t *m;
    bool rndv = (param->recv_attr & UCP_AM_RECV_ATTR_FLAG_RNDV) != 0;

    if (length > MANIFEST_MAX_BYTES || header_length != sizeof(uint64_t)) {
        GRAFT_WARN(GRAFT_MOD_TRANSFER, "oversized or headerless manifest dropped");
        return rndv ? UCS_ERR_MESSAGE_TRUNCATED : UCS_OK;
    }
    uint64_t echo;
    memcpy(&echo, header, sizeof(echo));
    if ((echo & 0xff) != d->index) {
        /* Each donor has its own worker: it can only speak for itself. */
        GRAFT_WARN(GRAFT_MOD_TRANSFER, "donor %u sent a manifest as donor %u; dropped", d->index,
                   (unsigned)(echo & 0xff));
        return rndv ? UCS_ERR_CANCELED : UCS_OK;
    }
    m = graft__malloc(sizeof(*m) + length);
    if (m == NULL) {
        GRAFT_ERROR(GRAFT_MOD_TRANSFER, "out of memory receiving a manifest");
        if (p->status == GRAFT_OK)
            p->status = GRAFT_ENOMEM;
        return rndv ? UCS_ERR_NO_MEMORY : UCS_OK;
    }
    memset(m, 0, sizeof(*m));
    m->id = GRAFT__XFER_AM_MANIFEST;
    m->has_header = true;
    memcpy(&m->header, header, sizeof(uint64_t));
    m->len = length;
    /* In the donor's order, whatever protocol brings its bytes. */
    graft__ucx_msgq_push(&d->answers, m);
    if (!rndv) {
        memcpy(m->data, data, length);
        m->ready = true;
        return UCS_OK;
    }
    ucp_request_param_t prm;
    memset(&prm, 0, sizeof(prm));
    prm.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA;
    prm.cb.recv_am = rndv_recv_cb;
    prm.user_data = m;
    ucs_status_ptr_t req = ucp_am_recv_data_nbx(d->worker, data, m->data, length, &prm);
    if (req == NULL) {
        m->ready = true;
    } else if (UCS_PTR_IS_ERR(req)) {
        GRAFT_WARN(GRAFT_MOD_TRANSFER, "receiving a manifest: %s",
                   ucs_status_string(UCS_PTR_STATUS(req)));
        m->too_large = true;
        m->ready = true;
    }
    return UCS_OK;
}

/* Ask the donor for the pull's step (again, after a step refusal). */
static graft_status_t donor_send_request(pull_t *p, pdonor_t *d)
{
    graft_transfer_endpoint_t *ep = p->ep;
    Graft__TransferRequest req;
    graft__transfer_request__init(&req);
    req.version = GRAFT__XFER_WIRE_VERSION;
    req.step = p->step;
    req.layout_hash = ep->layout_hash;
    req.recipient_group = ep->group;
    req.rank = ep->rank;
    req.request_id = p->nonce;
    uint8_t mac[GRAFT_MAC_BYTES];
    graft__xfer_request_fields_t f = {.step = req.step,
                                      .layout_hash = req.layout_hash,
                                      .request_id = req.request_id,
                                      .group = req.recipient_group,
                                      .rank = req.rank};
    graft_status_t st = graft__xfer_request_mac(ep->job_secret, ep->job_secret_len, d->donor_nonce,
                                                d->nonce, &f, mac);
    if (st != GRAFT_OK)
        return st;
    req.nonce.data = d->nonce;
    req.nonce.len = sizeof(d->nonce);
    req.mac.data = mac;
    req.mac.len = sizeof(mac);
    return graft__ucx_am_send(d->uep, GRAFT__XFER_AM_REQUEST, (p->nonce << 8) | d->index,
                              &req.base, true);
}
