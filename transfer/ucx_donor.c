/*
 * UCX backend, the donor's side: what it answers. One listener worker,
 * driven by the progress thread here, accepts every connection
 * (ucx_donor_conns.c). A connection's TransferRequest is answered with a
 * manifest (or a refusal, or a place in the admission queue), its chunk
 * hashes are streamed as the hashing threads finish them, chunk requests
 * are served for pushes, and TransferDone messages are counted for the
 * fence. The donor's training thread never takes part.
 */
#include "ucx_int.h"

#include "proto/graft.pb-c.h"

#include <assert.h>
#include <errno.h>
#include <poll.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

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

/*
 * Send @p m to the recipient of @p c. @p sealed: only after its request was
 * authenticated (c->peer_nonce is its nonce), the answer is sealed with the
 * job secret, both nonces and the connection's next sequence number
 * (transfer_auth.c), which counts it once it is sent. Unsealed: a refusal
 * of a request that could not be authenticated, which the recipient takes
 * for a failed handshake whatever it says.
 */
static graft_status_t answer_send(graft_transfer_endpoint_t *ep, ucx_conn_t *c,
                                  const Graft__TransferManifest *m, bool sealed)
{
    size_t len = graft__transfer_manifest__get_packed_size(m);
    uint8_t *buf = graft__malloc(sizeof(uint64_t) + len + GRAFT__XFER_SEAL_BYTES);
    if (buf == NULL)
        return GRAFT_ENOMEM;
    memcpy(buf, &c->echo, sizeof(uint64_t));
    graft__transfer_manifest__pack(m, buf + sizeof(uint64_t));
    if (sealed) {
        graft_status_t st = graft__xfer_seal(ep->job_secret, ep->job_secret_len, c->peer_nonce,
                                             c->nonce, c->seq, buf + sizeof(uint64_t), len);
        if (st != GRAFT_OK) {
            graft_free(buf);
            return st;
        }
        len += GRAFT__XFER_SEAL_BYTES;
    }
    graft_status_t st = graft__ucx_am_send_owned(c->ep, GRAFT__XFER_AM_MANIFEST, buf, len, false);
    if (st == GRAFT_OK && sealed)
        c->seq++;
    return st;
}

/* A refusal, @p sealed when its request was authenticated; for
 * GRAFT_ESTEP it says which step the donor serves, if any. */
static void reply_refusal(graft_transfer_endpoint_t *ep, ucx_conn_t *c, graft_status_t code,
                          const char *why, bool serving, uint64_t serve_step, bool sealed)
{
    Graft__TransferManifest m;
    graft__transfer_manifest__init(&m);
    m.version = GRAFT__XFER_WIRE_VERSION;
    m.status = code;
    m.error = (char *)why;
    m.donor_serving = serving;
    m.step = serve_step;
    GRAFT_INFO(GRAFT_MOD_TRANSFER, "refusing a transfer request: %s (%s)", why,
               graft_status_name(code));
    if (answer_send(ep, c, &m, sealed) != GRAFT_OK)
        GRAFT_WARN(GRAFT_MOD_TRANSFER, "could not send a refusal");
}

/* A refusal of a request that could not be authenticated (unsealed). */
static void reply_error(graft_transfer_endpoint_t *ep, ucx_conn_t *c, graft_status_t code,
                        const char *why)
{
    reply_refusal(ep, c, code, why, false, 0, false);
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
    if (answer_send(ep, c, &m, true) != GRAFT_OK)
        GRAFT_WARN(GRAFT_MOD_TRANSFER, "could not send a queue place");
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
    /* A recipient on this host reads over shared memory (ucx_shm.c). */
    if (graft__ucx_conn_shm_offer(ep->transport, c)) {
        m.shm_address.data = (uint8_t *)c->shm_address;
        m.shm_address.len = c->shm_address_len;
        m.shm_ticket.data = c->shm_ticket;
        m.shm_ticket.len = sizeof(c->shm_ticket);
    }

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
    /* Sealed: it is our proof of the secret as well (transfer_auth.c). */
    status = answer_send(ep, c, &m, true);
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

/* Whether @p req carries the MAC that only a holder of the job secret can
 * make for this connection's challenge; if so, remember its nonce for the
 * manifest's own MAC. */
static bool request_authentic(graft_transfer_endpoint_t *ep, ucx_conn_t *c,
                              const Graft__TransferRequest *req)
{
    uint8_t want[GRAFT_MAC_BYTES];
    graft__xfer_request_fields_t f = {.step = req->step,
                                      .layout_hash = req->layout_hash,
                                      .request_id = req->request_id,
                                      .group = req->recipient_group,
                                      .rank = req->rank};
    if (!c->challenged || req->nonce.len != GRAFT_NONCE_BYTES ||
        graft__xfer_request_mac(ep->job_secret, ep->job_secret_len, c->nonce, req->nonce.data, &f,
                                want) != GRAFT_OK ||
        !graft__mac_equal(req->mac.data, req->mac.len, want))
        return false;
    memcpy(c->peer_nonce, req->nonce.data, GRAFT_NONCE_BYTES);
    c->authed = true;
    return true;
}

static void handle_request(graft__transport_state_t *t, ucx_msg_t *msg)
{
    graft_transfer_endpoint_t *ep = t->ep;
    Graft__TransferRequest *req = NULL;
    ucx_conn_t *c;
    char why[160];

    if (msg->reply_ep == NULL) {
        GRAFT_WARN(GRAFT_MOD_TRANSFER, "transfer request without a reply endpoint: dropped");
        return;
    }
    c = graft__ucx_conn_find(t, msg->reply_ep);
    if (c == NULL || c->failed) {
        GRAFT_DEBUG(GRAFT_MOD_TRANSFER, "transfer request on an unknown connection: dropped");
        return;
    }
    c->echo = msg->has_header ? msg->header : 0;
    c->active = false;
    if (msg->too_large) {
        reply_error(ep, c, GRAFT_EPROTO, "request too large");
        return;
    }
    bool oom = false;
    ProtobufCAllocator pa = graft__pb_allocator_tracked(&oom);
    req = graft__transfer_request__unpack(&pa, msg->len, msg->data);
    if (req == NULL) {
        if (oom)
            reply_error(ep, c, GRAFT_ENOMEM, "donor out of memory");
        else
            reply_error(ep, c, GRAFT_EPROTO, "malformed TransferRequest");
        return;
    }
    if (req->version != GRAFT__XFER_WIRE_VERSION) {
        snprintf(why, sizeof(why), "unsupported request version %u", req->version);
        reply_error(ep, c, GRAFT_EFORMAT, why);
        goto out;
    }
    if (!request_authentic(ep, c, req)) {
        GRAFT_WARN(GRAFT_MOD_TRANSFER, "a transfer request from a peer claiming group %u rank %u "
                   "failed authentication (wrong job secret, or a replay)",
                   req->recipient_group, req->rank);
        atomic_fetch_add(&ep->refused, 1);
        reply_error(ep, c, GRAFT_ETOKEN, "request not authenticated with the job secret");
        goto out;
    }
    pthread_mutex_lock(&ep->lock);
    c->follower = req->recipient_group == GRAFT_TRANSFER_FOLLOWER_GROUP;
    bool expected = !ep->serving && ep->expecting && ep->expect_step == req->step;
    if (!expected && (!ep->serving || ep->serve_step != req->step)) {
        bool serving = ep->serving;
        uint64_t serve_step = ep->serve_step;
        if (c->follower) /* it proved the secret: graft_transfer_followers_wanted() */
            graft__transfer_follow_ask(ep, &c->follow_wanting, req->step);
        if (serving)
            snprintf(why, sizeof(why), "donor serves step %llu, not %llu",
                     (unsigned long long)serve_step, (unsigned long long)req->step);
        else
            snprintf(why, sizeof(why), "donor is not serving (asked step %llu)",
                     (unsigned long long)req->step);
        pthread_mutex_unlock(&ep->lock);
        reply_refusal(ep, c, GRAFT_ESTEP, why, serving, serving ? serve_step : 0, true);
        goto out;
    }
    if (!graft__transfer_serves_group(ep, req->recipient_group)) {
        snprintf(why, sizeof(why), "group %u is not a recipient of step %llu",
                 req->recipient_group, (unsigned long long)req->step);
        pthread_mutex_unlock(&ep->lock);
        GRAFT_WARN(GRAFT_MOD_TRANSFER, "refused: %s", why);
        atomic_fetch_add(&ep->refused, 1);
        reply_refusal(ep, c, GRAFT_ENOTRECIPIENT, why, false, 0, true);
        goto out;
    }
    if (req->layout_hash != ep->layout_hash) {
        snprintf(why, sizeof(why), "layout hash %016llx differs from the donor's %016llx",
                 (unsigned long long)req->layout_hash, (unsigned long long)ep->layout_hash);
        pthread_mutex_unlock(&ep->lock);
        reply_refusal(ep, c, GRAFT_ELAYOUT, why, false, 0, true);
        goto out;
    }
    /* First come, first served: at most max_recipients at once. */
    uint64_t now = graft__now_ns();
    uint32_t admitted = conns_admitted(t);
    uint32_t place = queue_place(t, c, req->step, now);
    if (expected || admitted >= ep->max_recipients || place >= ep->max_recipients - admitted) {
        queue_reply(t, c, req->step, place, admitted, now);
        pthread_mutex_unlock(&ep->lock);
        GRAFT_DEBUG(GRAFT_MOD_TRANSFER, "group %u rank %u queued at place %u for step %llu",
                    req->recipient_group, req->rank, place, (unsigned long long)req->step);
        goto out;
    }
    c->queued = false;
    if (send_manifest(ep, c) != GRAFT_OK) {
        GRAFT_WARN(GRAFT_MOD_TRANSFER, "could not send a manifest");
    } else {
        c->fence_owed = true;
        c->fence_step = req->step;
        ep->serve_peak = GRAFT_MAX(ep->serve_peak, admitted + 1);
        if (c->follower) {
            ep->follow_owed++;
            graft__transfer_follow_unask(ep, &c->follow_wanting, true);
        }
    }
    pthread_mutex_unlock(&ep->lock);
    GRAFT_DEBUG(GRAFT_MOD_TRANSFER, "serving group %u rank %u at step %llu", req->recipient_group,
                req->rank, (unsigned long long)req->step);
out:
    graft__transfer_request__free_unpacked(req, &graft__pb_allocator);
}

static void handle_done(graft__transport_state_t *t, ucx_msg_t *msg)
{
    Graft__TransferDone *d;
    if (msg->too_large) {
        GRAFT_WARN(GRAFT_MOD_TRANSFER, "oversized TransferDone dropped");
        return;
    }
    d = graft__transfer_done__unpack(&graft__pb_allocator, msg->len, msg->data);
    if (d == NULL || d->version != GRAFT__XFER_WIRE_VERSION) {
        GRAFT_WARN(GRAFT_MOD_TRANSFER, "malformed TransferDone dropped");
        graft__transfer_done__free_unpacked(d, &graft__pb_allocator);
        return;
    }
    GRAFT_DEBUG(GRAFT_MOD_TRANSFER, "group %u rank %u done with step %llu (%s)", d->recipient_group,
                d->rank, (unsigned long long)d->step, d->ok ? "ok" : "failed");
    /* One count per served connection: a TransferDone on a connection that
     * got no manifest, or a second one, is not counted; one on a connection
     * already reaped was counted when it was lost. */
    ucx_conn_t *c = msg->reply_ep != NULL ? graft__ucx_conn_find(t, msg->reply_ep) : NULL;
    if (c != NULL && c->fence_owed) {
        c->fence_owed = false;
        if (c->follower)
            graft__transfer_follow_note(t->ep, c->gen);
        else
            graft__transfer_fence_note(t->ep, c->fence_step, c->gen);
    }
    graft__transfer_done__free_unpacked(d, &graft__pb_allocator);
}

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
    /* On a connection's shared-memory worker, the answer goes back there. */
    ucx_conn_t *c = msg->conn != NULL ? msg->conn
                    : msg->reply_ep != NULL ? graft__ucx_conn_find(t, msg->reply_ep) : NULL;
    ucp_ep_h reply = msg->conn != NULL ? msg->reply_ep : c != NULL ? c->ep : NULL;
    chunk_hdr_t *h;
    const void *src = NULL;
    size_t len = 0;
    ucp_request_param_t prm;
    ucs_status_ptr_t sreq;

    if (c == NULL || c->failed || reply == NULL ||
        (msg->conn != NULL && !graft__ucx_conn_shm_reply_note(c, reply))) {
        GRAFT_WARN(GRAFT_MOD_TRANSFER, "chunk request on an unknown connection: dropped");
        return;
    }
    h = graft__calloc(1, sizeof(*h));
    if (h == NULL) {
        GRAFT_ERROR(GRAFT_MOD_TRANSFER, "out of memory answering a chunk request");
        return;
    }
    h->echo = msg->has_header ? msg->header : 0;
    h->status = GRAFT_OK;
    if (!msg->too_large)
        req = graft__chunk_request__unpack(&graft__pb_allocator, msg->len, msg->data);
    if (req == NULL || req->version != GRAFT__XFER_WIRE_VERSION) {
        h->status = GRAFT_EPROTO;
    } else {
        h->tag = req->tag;
        pthread_mutex_lock(&ep->lock);
        if (!c->active || !ep->serving || c->gen != ep->serve_gen) {
            h->status = GRAFT_ESTEP;
        } else if (msg->conn != NULL &&
                   !graft__mac_equal(req->ticket.data, req->ticket.len, c->shm_ticket)) {
            h->status = GRAFT_ETOKEN;
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
    graft__chunk_request__free_unpacked(req, &graft__pb_allocator);
    if (h->status != GRAFT_OK)
        GRAFT_INFO(GRAFT_MOD_TRANSFER,
                   "refusing a chunk request (%s)", graft_status_name(h->status));

    memset(&prm, 0, sizeof(prm));
    prm.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA |
                       UCP_OP_ATTR_FIELD_FLAGS;
    prm.cb.send = chunk_send_cb;
    prm.user_data = h;
    /* Rendezvous: the recipient's UCX pulls the bytes zero-copy where the
     * transport can. The region stays valid until serve_end (contract). */
    prm.flags = len > 0 ? UCP_AM_SEND_FLAG_RNDV : 0;
    sreq = ucp_am_send_nbx(reply, GRAFT__XFER_AM_CHUNK_DATA, h, sizeof(*h), src, len, &prm);
    if (sreq == NULL) {
        graft_free(h);
    } else if (UCS_PTR_IS_ERR(sreq)) {
        GRAFT_WARN(GRAFT_MOD_TRANSFER, "sending a chunk: %s",
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
        if (answer_send(ep, c, &m, true) != GRAFT_OK) {
            /* Try again on the next round. */
            c->cursor = cursor0;
            c->region_cursor = region0;
            continue;
        }
        c->final_sent = m.hashes_final;
    }
    pthread_mutex_unlock(&ep->lock);
}

/* Arm the workers for a wake-up and wait on their descriptors, at most
 * 1 ms so that hashes finished by the hashing threads go out promptly. */
static void progress_sleep(graft__transport_state_t *t)
{
    struct pollfd pfds[32] = {{.fd = t->efd, .events = POLLIN}};
    size_t n = 1;
    if (ucp_worker_arm(t->worker) == UCS_ERR_BUSY ||
        !graft__ucx_shm_arm(t, pfds, GRAFT_ARRAY_SIZE(pfds), &n))
        return;
    if (poll(pfds, (nfds_t)n, 1) < 0 && errno != EINTR) {
        GRAFT_ERROR(GRAFT_MOD_TRANSFER, "poll: %s", strerror(errno));
        graft__sleep_ns(1000000);
    }
}

void *graft__ucx_progress_thread(void *arg)
{
    graft__transport_state_t *t = arg;
    while (!atomic_load(&t->stop)) {
        ucx_msg_t *m;
        /* Bounded: under a flood the worker always has more to do, and
         * the requests, the reaper and the hashes must still get their turn. */
        for (unsigned n = 0; n < PROGRESS_BATCH && ucp_worker_progress(t->worker) != 0; n++) {
        }
        (void)graft__ucx_shm_progress(t);
        graft__ucx_refused_close(t);
        while ((m = graft__ucx_msgq_pop(&t->msgs)) != NULL) {
            if (m->id == GRAFT__XFER_AM_REQUEST)
                handle_request(t, m);
            else if (m->id == GRAFT__XFER_AM_CHUNK_REQ)
                handle_chunk_req(t, m);
            else
                handle_done(t, m);
            graft_free(m);
        }
        graft__ucx_conns_reap(t);
        stream_hashes(t);
        progress_sleep(t);
    }
    return NULL;
}
