/*
 * UCX backend: shared memory for authenticated recipients on this host.
 *
 * The listener offers strangers no shared memory (ucx.c says why), so a
 * recipient on the donor's own host would otherwise pull over loopback tcp
 * at about half the speed. Once a recipient on this host has proved the job
 * secret, its first manifest names a second place to read from: the
 * address of a worker made for its connection alone, with shared-memory
 * transports only, and a ticket that chunk requests there must carry. The
 * chunks come back over shared memory (pushed, as over tcp; the rendezvous
 * bytes go by cma). The manifest is sealed; the kernel lets only processes
 * of the same user attach the segments behind the worker
 * (docs/SECURITY.md). A peer killed in the middle of a write can block
 * only that worker's receive FIFO, which dies with its connection.
 *
 * Both sides keep peer error handling, which UCX 1.13 offers over shared
 * memory only with UCX_MM_ERROR_HANDLING (set on our contexts): without
 * it a donor killed during a cma read aborts the recipient
 * (process_vm_readv fails with ESRCH, an unhandled error).
 *
 * This file is the donor's side and the choice of transports; the
 * recipient connects to an offer in ucx_pull_conn.c.
 */
#include "ucx_int.h"

#include <arpa/inet.h>
#include <errno.h>
#include <ifaddrs.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifdef GRAFT_TEST_FAULTS
volatile int graft__ucx_test_no_ticket = 0;
#endif

bool graft__ucx_tls_is_shm(const char *tok, size_t n)
{
    static const char *const shm[] = {"sm", "shm", "mm", "posix", "sysv", "xpmem", "cma", "knem"};
    for (size_t i = 0; i < GRAFT_ARRAY_SIZE(shm); i++) {
        if (strlen(shm[i]) == n && strncmp(tok, shm[i], n) == 0)
            return true;
    }
    return false;
}

bool graft__ucx_shm_tls(const char *user, char *out, size_t size)
{
    size_t len = 0;
    out[0] = '\0';
    if (user == NULL || user[0] == '\0' || strcmp(user, "all") == 0) {
        snprintf(out, size, "sm");
        return true;
    }
    if (user[0] == '^') {
        /* "^x,y": everything but x and y; shared memory unless named. */
        for (const char *p = user + 1; *p != '\0';) {
            size_t n = strcspn(p, ",");
            if (n > 0 && graft__ucx_tls_is_shm(p, n))
                return false;
            p += n + (p[n] == ',');
        }
        snprintf(out, size, "sm");
        return true;
    }
    for (const char *p = user; *p != '\0';) {
        size_t n = strcspn(p, ",");
        if (n > 0 && graft__ucx_tls_is_shm(p, n) && len + n + 2 < size)
            len += (size_t)snprintf(out + len, size - len, "%s%.*s", len > 0 ? "," : "", (int)n,
                                    p);
        p += n + (p[n] == ',');
    }
    return len > 0;
}

void graft__ucx_shm_init(graft__transport_state_t *t)
{
    char tls[256];
    ucp_config_t *cfg = NULL;
    ucp_params_t p;
    ucs_status_t st;

    if (!graft__ucx_shm_tls(getenv("UCX_TLS"), tls, sizeof(tls))) {
        GRAFT_DEBUG(GRAFT_MOD_TRANSFER, "UCX_TLS allows no shared memory: recipients on this "
                    "host pull over the network");
        return;
    }
    if ((st = ucp_config_read(NULL, NULL, &cfg)) != UCS_OK) {
        GRAFT_WARN(GRAFT_MOD_TRANSFER, "ucp_config_read: %s; no shared memory offered",
                   ucs_status_string(st));
        return;
    }
    graft__ucx_mm_error_handling(cfg);
    if ((st = ucp_config_modify(cfg, "TLS", tls)) != UCS_OK) {
        GRAFT_WARN(GRAFT_MOD_TRANSFER, "UCX_TLS=%s: %s; no shared memory offered", tls,
                   ucs_status_string(st));
        ucp_config_release(cfg);
        return;
    }
    memset(&p, 0, sizeof(p));
    p.field_mask = UCP_PARAM_FIELD_FEATURES | UCP_PARAM_FIELD_MT_WORKERS_SHARED;
    /* RMA: rendezvous bytes go by cma (process_vm_readv), which the kernel
     * allows only to processes that may ptrace us. */
    /* RMA: rendezvous bytes go by cma (process_vm_readv), which the kernel
     * allows only to processes that may ptrace us. */
    p.features = UCP_FEATURE_AM | UCP_FEATURE_RMA | UCP_FEATURE_WAKEUP;
    p.mt_workers_shared = 1;
    st = ucp_init(&p, cfg, &t->shm_ctx);
    ucp_config_release(cfg);
    if (st != UCS_OK) {
        GRAFT_WARN(GRAFT_MOD_TRANSFER, "ucp_init with UCX_TLS=%s: %s; no shared memory offered",
                   tls, ucs_status_string(st));
        t->shm_ctx = NULL;
    }
}

void graft__ucx_mm_error_handling(ucp_config_t *cfg)
{
    char tls[256];
    ucs_status_t st;
    /* Where no shared-memory transport is allowed UCX warns about it at
     * every worker (on standard output, by default). */
    if (!graft__ucx_shm_tls(getenv("UCX_TLS"), tls, sizeof(tls)))
        return;
    if (getenv("UCX_MM_ERROR_HANDLING") == NULL &&
        (st = ucp_config_modify(cfg, "MM_ERROR_HANDLING", "y")) != UCS_OK)
        GRAFT_DEBUG(GRAFT_MOD_TRANSFER, "UCX_MM_ERROR_HANDLING: %s", ucs_status_string(st));
}

bool graft__ucx_addr_is_local(const struct sockaddr *sa)
{
    struct ifaddrs *ifs = NULL;
    bool local = false;
    if (sa == NULL || sa->sa_family != AF_INET)
        return false;
    struct in_addr a = ((const struct sockaddr_in *)(const void *)sa)->sin_addr;
    if ((ntohl(a.s_addr) >> 24) == 127)
        return true;
    if (getifaddrs(&ifs) != 0)
        return false;
    for (const struct ifaddrs *i = ifs; i != NULL && !local; i = i->ifa_next) {
        local = i->ifa_addr != NULL && i->ifa_addr->sa_family == AF_INET &&
                ((const struct sockaddr_in *)(const void *)i->ifa_addr)->sin_addr.s_addr ==
                    a.s_addr;
    }
    freeifaddrs(ifs);
    return local;
}

/* Chunk requests on a connection's own worker: tagged with it. */
static ucs_status_t shm_chunk_req_cb(void *arg, const void *header, size_t header_length,
                                     void *data, size_t length, const ucp_am_recv_param_t *param)
{
    ucx_conn_t *c = arg;
    return graft__ucx_donor_enqueue(c->t, c, GRAFT__XFER_AM_CHUNK_REQ, header, header_length, data,
                                    length, param);
}

/* The worker of @p c's offer, its address and a ticket. */
static graft_status_t shm_open(graft__transport_state_t *t, ucx_conn_t *c)
{
    ucp_address_t *addr = NULL;
    graft_status_t status;
    ucs_status_t st;

    c->shm_efd = -1;
    status = graft__random_bytes(c->shm_ticket, sizeof(c->shm_ticket));
    if (status == GRAFT_OK)
        status = graft__ucx_worker_create(t->shm_ctx, &c->shm_worker);
    if (status == GRAFT_OK)
        status = graft__ucx_drop_all(c->shm_worker);
    if (status == GRAFT_OK)
        status = graft__ucx_set_am_handler(c->shm_worker, GRAFT__XFER_AM_CHUNK_REQ,
                                           shm_chunk_req_cb, c);
    if (status != GRAFT_OK)
        return status;
    if ((st = ucp_worker_get_efd(c->shm_worker, &c->shm_efd)) != UCS_OK ||
        (st = ucp_worker_get_address(c->shm_worker, &addr, &c->shm_address_len)) != UCS_OK) {
        GRAFT_DEBUG(GRAFT_MOD_TRANSFER, "shared-memory worker: %s", ucs_status_string(st));
        return GRAFT_ETRANSPORT;
    }
    c->shm_address = graft__malloc(c->shm_address_len);
    if (c->shm_address != NULL)
        memcpy(c->shm_address, addr, c->shm_address_len);
    ucp_worker_release_address(c->shm_worker, addr);
    return c->shm_address != NULL ? GRAFT_OK : GRAFT_ENOMEM;
}

bool graft__ucx_conn_shm_offer(graft__transport_state_t *t, ucx_conn_t *c)
{
    if (t->shm_ctx == NULL || !c->peer_local || !c->authed)
        return false;
    if (c->shm_worker == NULL) {
        graft_status_t status = shm_open(t, c);
        if (status != GRAFT_OK) {
            /* The recipient reads over the connection it has. */
            GRAFT_WARN(GRAFT_MOD_TRANSFER, "no shared memory for a recipient on this host: %s",
                       graft_status_name(status));
            graft__ucx_conn_shm_close(c);
            return false;
        }
    }
    return c->shm_address != NULL;
}

bool graft__ucx_conn_shm_reply_note(ucx_conn_t *c, ucp_ep_h reply)
{
    for (unsigned i = 0; i < c->n_shm_reply_eps; i++) {
        if (c->shm_reply_eps[i] == reply)
            return true;
    }
    if (c->n_shm_reply_eps == GRAFT_ARRAY_SIZE(c->shm_reply_eps))
        return false;
    c->shm_reply_eps[c->n_shm_reply_eps++] = reply;
    return true;
}

void graft__ucx_conn_shm_close(ucx_conn_t *c)
{
    /* The endpoints answers went out on are closed by force first, which
     * fails their requests (UCX 1.13 asserts when a worker is destroyed
     * under an endpoint with requests); the others go with the worker. */
    for (unsigned i = 0; i < c->n_shm_reply_eps; i++) {
        ucp_request_param_t prm = {.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS,
                                   .flags = UCP_EP_CLOSE_FLAG_FORCE};
        ucs_status_ptr_t req = ucp_ep_close_nbx(c->shm_reply_eps[i], &prm);
        uint64_t deadline = graft__now_ns() + TEARDOWN_NS;
        while (UCS_PTR_IS_PTR(req) && ucp_request_check_status(req) == UCS_INPROGRESS &&
               graft__now_ns() < deadline)
            ucp_worker_progress(c->shm_worker);
        if (UCS_PTR_IS_PTR(req))
            ucp_request_free(req);
    }
    c->n_shm_reply_eps = 0;
    if (c->shm_worker != NULL)
        ucp_worker_destroy(c->shm_worker);
    c->shm_worker = NULL;
    c->shm_efd = -1;
    graft_free(c->shm_address);
    c->shm_address = NULL;
    c->shm_address_len = 0;
}

unsigned graft__ucx_shm_progress(graft__transport_state_t *t)
{
    unsigned work = 0;
    for (ucx_conn_t *c = t->conns; c != NULL; c = c->next) {
        if (c->shm_worker == NULL || c->failed)
            continue;
        for (unsigned n = 0; n < PROGRESS_BATCH; n++) {
            unsigned w = ucp_worker_progress(c->shm_worker);
            work += w;
            if (w == 0)
                break;
        }
    }
    return work;
}

bool graft__ucx_shm_arm(graft__transport_state_t *t, struct pollfd *pfds, size_t max,
                        size_t *n_p)
{
    for (ucx_conn_t *c = t->conns; c != NULL; c = c->next) {
        if (c->shm_worker == NULL || c->failed || c->shm_efd < 0)
            continue;
        if (ucp_worker_arm(c->shm_worker) == UCS_ERR_BUSY)
            return false;
        /* More connections than room: the 1 ms poll still serves them. */
        if (*n_p < max) {
            pfds[*n_p].fd = c->shm_efd;
            pfds[*n_p].events = POLLIN;
            pfds[*n_p].revents = 0;
            (*n_p)++;
        }
    }
    return true;
}
