/*
 * UCX backend, the recipient's pull. graft_transfer_pull() makes a worker
 * per donor on the endpoint's context (the context is shared between
 * workers, so the donor side keeps serving meanwhile) and drives them from
 * the calling thread: connect, request, accept each donor's manifest and
 * compare them, spread chunk gets over the donors, verify every chunk
 * against the hashes, drop a failing donor and give its chunks to the
 * others.
 */
#include "ucx_pull.h"

#include <xxhash.h>

#include <assert.h>
#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

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
        GRAFT_DEBUG(GRAFT_MOD_TRANSFER, "madvise(MADV_POPULATE_READ): %s", strerror(errno));
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
    GRAFT_DEBUG(GRAFT_MOD_TRANSFER, "unexpected chunk data dropped");
    return UCS_OK;
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
    /* Gets only where the donor's block is mapped here (shared memory,
     * which the OS guards): its listener has no RMA (docs/SECURITY.md). */
    if (p->o->read == GRAFT_TRANSFER_READ_PUSH || d->lptr[ri] == NULL) {
        Graft__ChunkRequest cr;
        graft__chunk_request__init(&cr);
        cr.version = GRAFT__XFER_WIRE_VERSION;
        cr.region = ri;
        cr.chunk = idx;
        cr.tag = (uint32_t)(s - p->slots);
        if (d->shm_uep != NULL) {
            cr.ticket.data = d->shm_ticket;
            cr.ticket.len = sizeof(d->shm_ticket);
#ifdef GRAFT_TEST_FAULTS
            if (graft__ucx_test_no_ticket)
                cr.ticket.len = 0;
#endif
        }
        /* Over the donor's shared-memory worker when it offered one. */
        graft_status_t st = graft__ucx_am_send(d->shm_uep != NULL ? d->shm_uep : d->uep,
                                               GRAFT__XFER_AM_CHUNK_REQ,
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
            graft__ucx_chunk_verify(p, s->chunk);
            continue;
        }
        if (s->st == UCS_ERR_NO_MEMORY && p->status == GRAFT_OK) {
            GRAFT_ERROR(GRAFT_MOD_TRANSFER, "out of memory reading a chunk");
            p->status = GRAFT_ENOMEM;
        }
        ch->state = CH_PENDING;
        q_push(p, s->chunk);
        p->rep->donors[s->donor].reassigned++;
        if (d->state == D_READY)
            graft__ucx_donor_fail(p, d, s->proto_err ? GRAFT_EPROTO : graft__ucx_status(s->st));
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
        GRAFT_ERROR(GRAFT_MOD_TRANSFER, "pull timed out after %u ms", p->o->timeout_ms);
        p->status = GRAFT_ETIMEOUT;
        return true;
    }
    for (size_t i = 0; i < p->n_donors; i++) {
        pdonor_t *d = &p->donors[i];
        if (d->err_flag && d->state != D_FAILED && !graft__ucx_donor_turned_away(p, d, now))
            graft__ucx_donor_fail(p, d, graft__ucx_status(d->err_status) == GRAFT_ETRANSPORT
                                 ? GRAFT_EPEER
                                 : graft__ucx_status(d->err_status));
        graft_status_t rst = graft__ucx_donor_reconnect(p, d, now);
        if (rst != GRAFT_OK)
            graft__ucx_donor_fail(p, d, rst);
        if (d->state == D_CONNECTING && now > d->connect_deadline)
            graft__ucx_donor_fail(p, d, d->refused != GRAFT_OK ? d->refused : GRAFT_EPEER_TIMEOUT);
        if (d->state == D_READY && (d->inflight > 0 || (!d->final && !p->o->skip_verify)) &&
            now - d->last_ns > (uint64_t)p->stall_ms * 1000000ull) {
            GRAFT_WARN(GRAFT_MOD_TRANSFER, "donor %u made no progress for %u ms", d->index,
                       p->stall_ms);
            graft__ucx_donor_fail(p, d, GRAFT_EPEER_TIMEOUT);
        }
        /* A dropped donor that stops answering while draining is cut off. */
        if (d->state == D_FAILED && d->close_when_drained && d->inflight > 0 &&
            now - d->last_ns > (uint64_t)p->stall_ms * 1000000ull)
            graft__ucx_donor_force_close(p, d);
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
        GRAFT_LOG_AT(p->o->follower ? GRAFT_LOG_DEBUG : GRAFT_LOG_ERROR, GRAFT_MOD_TRANSFER,
                     "no usable donor left with %llu of %llu chunks missing",
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
        graft__ucx_queue_leave(p, d);
        if ((d->state != D_READY && !queued) || d->uep == NULL)
            continue;
        Graft__TransferDone done;
        graft__transfer_done__init(&done);
        done.version = GRAFT__XFER_WIRE_VERSION;
        done.request_id = p->nonce;
        done.ok = p->status == GRAFT_OK;
        done.bytes = p->rep->donors[i].bytes;
        done.step = p->step;
        done.recipient_group = p->ep->group;
        done.rank = p->ep->rank;
        if (graft__ucx_am_send(d->uep, GRAFT__XFER_AM_DONE, (p->nonce << 8) | i, &done.base,
                               true) != GRAFT_OK)
            GRAFT_WARN(GRAFT_MOD_TRANSFER, "could not tell donor %zu that the pull is done", i);
    }
    /* Let reads still in flight finish before closing (see graft__ucx_donor_fail). */
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
        graft__ucx_ep_close_start(p, d,
                                  d->err_flag || p->rep->donors[i].status == GRAFT_EPEER_TIMEOUT);
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
            if (d->shm_close_req != NULL &&
                ucp_request_check_status(d->shm_close_req) != UCS_INPROGRESS) {
                ucp_request_free(d->shm_close_req);
                d->shm_close_req = NULL;
            }
            busy = busy || d->close_req != NULL || d->shm_close_req != NULL;
        }
        if (!busy)
            break;
        if (graft__now_ns() > deadline) {
            GRAFT_WARN(GRAFT_MOD_TRANSFER, "closing donor connections took too long");
            break;
        }
    }
    for (size_t i = 0; i < p->n_donors; i++) {
        pdonor_t *d = &p->donors[i];
        if (d->close_req != NULL)
            ucp_request_free(d->close_req);
        d->close_req = NULL;
        if (d->shm_close_req != NULL)
            ucp_request_free(d->shm_close_req);
        d->shm_close_req = NULL;
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
    graft__ucx_msgq_clear(&p->msgs);
    /* After the workers: no receive into an answer is left. */
    for (size_t i = 0; i < p->n_donors; i++)
        graft__ucx_msgq_clear(&p->donors[i].answers);
    graft_free(p->chunks);
    graft_free(p->queue);
    graft_free(p->ref_hash);
    graft_free(p->ref_donor);
    graft_free(p->slots);
}

graft_status_t graft__ucx_pull(graft_transfer_endpoint_t *ep,
                               const graft_transfer_pull_options_t *o,
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
    p.step = o->step;
    p.rep = rep;
    p.n_donors = o->n_donors;
    p.window = o->window != 0 ? o->window : 4;
    p.stall_ms = o->stall_timeout_ms != 0 ? o->stall_timeout_ms : 5000;
    p.connect_ms = o->connect_timeout_ms != 0 ? o->connect_timeout_ms : 5000;
    p.nonce = (atomic_fetch_add(&nonce_counter, 1) ^ ((uint64_t)getpid() << 20)) &
              0x00ffffffffffffffull;
    graft__ucx_msgq_init(&p.msgs);
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
        graft__ucx_msgq_init(&d->answers);
        status = graft__ucx_worker_create(t->ctx, &d->worker);
        if (status == GRAFT_OK)
            status = graft__ucx_set_am_handler(d->worker, GRAFT__XFER_AM_MANIFEST,
                                               graft__ucx_recip_am_cb, d);
        if (status == GRAFT_OK)
            status = graft__ucx_set_am_handler(d->worker, GRAFT__XFER_AM_CHALLENGE,
                                               graft__ucx_recip_challenge_cb, d);
        if (status == GRAFT_OK)
            status = graft__ucx_set_am_handler(d->worker, GRAFT__XFER_AM_CHUNK_DATA,
                                               recip_chunk_cb, d);
        if (status != GRAFT_OK)
            goto out_workers;
    }

    for (size_t i = 0; i < p.n_donors; i++) {
        pdonor_t *d = &p.donors[i];
        d->state = D_CONNECTING;
        d->connect_deadline = start + (uint64_t)p.connect_ms * 1000000ull;
        rep->donors[i].status = GRAFT_OK;
        graft_status_t st = graft__ucx_donor_connect(&p, d);
        if (st == GRAFT_ENOMEM && p.status == GRAFT_OK)
            p.status = GRAFT_ENOMEM;
        if (st != GRAFT_OK)
            graft__ucx_donor_fail(&p, d, st);
    }

    while (!pull_check(&p, start)) {
        ucx_msg_t *m;
        pull_progress(&p);
        while ((m = graft__ucx_msgq_pop(&p.msgs)) != NULL) {
            graft__ucx_handle_donor_msg(&p, m);
            graft_free(m);
        }
        graft__ucx_donors_answers(&p);
        slots_reap(&p);
        graft__ucx_donors_close_drained(&p);
        graft__ucx_donors_retry(&p);
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
    /* Verified bytes of device regions sit in their pinned shadows. */
    for (size_t r = 0; r < ep->n_regions && status == GRAFT_OK; r++) {
        graft__region_t *reg = &ep->regions[r];
        if (reg->device == GRAFT_TRANSFER_CUDA && !o->host_only)
            status = graft__cuda_copy(reg->ptr, reg->host, reg->bytes, true);
    }
    pull_teardown(&p);
    rep->step = p.step;
    rep->elapsed_ns = graft__now_ns() - start;
    if (status == GRAFT_OK)
        GRAFT_INFO(GRAFT_MOD_TRANSFER, "pulled %llu bytes from %zu donors in %.3f s",
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
