/*
 * UCX backend of the transfer engine: the endpoint's context, listener and
 * progress thread (init and teardown), regions mapped for remote access,
 * and host memory that UCX allocates itself. The donor's side is
 * ucx_donor.c, the recipient's pull ucx_pull.c, the pieces both use
 * ucx_wire.c, short messages ucx_msg.c.
 */
#include "ucx_int.h"

#include <arpa/inet.h>
#include <errno.h>
#include <ifaddrs.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void ucx_fini(graft_transfer_endpoint_t *ep);

bool graft__ucx_flood_caveat(unsigned major, unsigned minor, in_addr_t listen_addr)
{
    return (major < 1 || (major == 1 && minor < 22)) && (ntohl(listen_addr) >> 24) != 127;
}

/* Said once per process: the caveat of docs/SECURITY.md ("A connection
 * flood"), where hosts other than this one reach the listener. */
static void flood_caveat(in_addr_t listen_addr)
{
    static atomic_bool said;
    unsigned major = 0, minor = 0, release = 0;
    ucp_get_version(&major, &minor, &release);
    if (graft__ucx_flood_caveat(major, minor, listen_addr) && !atomic_exchange(&said, true))
        GRAFT_WARN(GRAFT_MOD_TRANSFER, "UCX %u.%u.%u can crash in its own thread under a flood "
                   "of connections to the transfer port (fixed in UCX 1.22): where untrusted "
                   "hosts reach it, build against UCX 1.22 or later (make UCX_PREFIX=DIR, "
                   "docs/OPERATIONS.md)", major, minor, release);
}

/* The interface that holds @p a (loopback: "lo"), into @p out; "" when no
 * interface holds it, or the user chose UCX_NET_DEVICES. */
static void net_device_of(struct in_addr a, char *out, size_t size)
{
    struct ifaddrs *ifs = NULL;
    out[0] = '\0';
    if (getenv("UCX_NET_DEVICES") != NULL || a.s_addr == htonl(INADDR_ANY))
        return;
    if (getifaddrs(&ifs) != 0) {
        GRAFT_WARN(GRAFT_MOD_TRANSFER, "getifaddrs: %s; UCX may use every interface",
                   strerror(errno));
        return;
    }
    for (const struct ifaddrs *i = ifs; i != NULL; i = i->ifa_next) {
        if (i->ifa_name == NULL || i->ifa_addr == NULL || i->ifa_addr->sa_family != AF_INET ||
            ((const struct sockaddr_in *)(const void *)i->ifa_addr)->sin_addr.s_addr != a.s_addr)
            continue;
        snprintf(out, size, "%s", i->ifa_name);
        break;
    }
    freeifaddrs(ifs);
    if (out[0] == '\0' && (ntohl(a.s_addr) >> 24) == 127)
        snprintf(out, size, "lo");
    if (out[0] == '\0')
        GRAFT_WARN(GRAFT_MOD_TRANSFER, "no interface holds the transfer address; UCX may use "
                   "every interface (set UCX_NET_DEVICES)");
}

graft_status_t graft__ucx_context_create(graft__transport_state_t *t, bool rma,
                                         ucp_context_h *ctx_p)
{
    ucp_config_t *cfg = NULL;
    ucp_params_t p;
    ucs_status_t st = ucp_config_read(NULL, NULL, &cfg);
    if (st != UCS_OK) {
        GRAFT_ERROR(GRAFT_MOD_TRANSFER, "ucp_config_read: %s", ucs_status_string(st));
        return GRAFT_ETRANSPORT;
    }
    /* Only the device of the transfer address (shared memory is not a
     * network device and stays): an interface that comes and goes
     * elsewhere cannot fail our workers. */
    if (t->net_dev[0] != '\0' &&
        (st = ucp_config_modify(cfg, "NET_DEVICES", t->net_dev)) != UCS_OK)
        GRAFT_WARN(GRAFT_MOD_TRANSFER, "UCX_NET_DEVICES=%s: %s", t->net_dev,
                   ucs_status_string(st));
    /* UCT tcp's PUT writes wherever the peer names: not offered by workers
     * that strangers reach (which also makes a stock UCX client emulate
     * its puts by messages that such a worker does not handle). Nor shared
     * memory: every sender to a worker writes into its one receive FIFO,
     * and a peer killed in the middle of a write would leave an element
     * that is never completed, blocking every connection behind it. */
    if (rma)
        graft__ucx_mm_error_handling(cfg);
    if (!rma) {
        char tls[256];
        graft__ucx_strangers_tls(getenv("UCX_TLS"), tls, sizeof(tls));
        /* UCX 1.13 applies "PUT_ENABLE" to tcp (and warns at every worker
         * about "TCP_PUT_ENABLE"); UCX 1.22 takes only "TCP_PUT_ENABLE" (a
         * stranger's put went through, test_rma_malloc): after 1.13, both. */
        unsigned major = 0, minor = 0, release = 0;
        ucp_get_version(&major, &minor, &release);
        ucs_status_t st2 = major > 1 || (major == 1 && minor > 13)
                               ? ucp_config_modify(cfg, "TCP_PUT_ENABLE", "n") : UCS_ERR_UNSUPPORTED;
        if ((st = ucp_config_modify(cfg, "PUT_ENABLE", "n")) != UCS_OK && st2 != UCS_OK)
            GRAFT_WARN(GRAFT_MOD_TRANSFER, "UCX_TCP_PUT_ENABLE=n: %s", ucs_status_string(st));
        if ((st = ucp_config_modify(cfg, "TLS", tls)) != UCS_OK) {
            GRAFT_ERROR(GRAFT_MOD_TRANSFER, "UCX_TLS=%s for the listener: %s", tls,
                        ucs_status_string(st));
            ucp_config_release(cfg);
            return GRAFT_ETRANSPORT;
        }
    }
    memset(&p, 0, sizeof(p));
    p.field_mask = UCP_PARAM_FIELD_FEATURES | UCP_PARAM_FIELD_MT_WORKERS_SHARED;
    p.features = (rma ? UCP_FEATURE_RMA : 0) | UCP_FEATURE_AM | UCP_FEATURE_WAKEUP;
    /* The progress thread's workers and a pull's share the context. */
    p.mt_workers_shared = 1;
    st = ucp_init(&p, cfg, ctx_p);
    ucp_config_release(cfg);
    if (st != UCS_OK) {
        GRAFT_ERROR(GRAFT_MOD_TRANSFER, "ucp_init: %s", ucs_status_string(st));
        return GRAFT_ETRANSPORT;
    }
    return GRAFT_OK;
}

void graft__ucx_strangers_tls(const char *user, char *out, size_t size)
{
    size_t len = 0;
    out[0] = '\0';
    if (user == NULL || user[0] == '\0' || strcmp(user, "all") == 0) {
        snprintf(out, size, "^sm");
        return;
    }
    if (user[0] == '^') {
        snprintf(out, size, "%s,sm", user);
        return;
    }
    for (const char *p = user; *p != '\0';) {
        size_t n = strcspn(p, ",");
        if (n > 0 && !graft__ucx_tls_is_shm(p, n) && len + n + 2 < size) {
            len += (size_t)snprintf(out + len, size - len, "%s%.*s", len > 0 ? "," : "", (int)n,
                                    p);
        }
        p += n + (p[n] == ',');
    }
    if (len == 0 || strcmp(out, "self") == 0) {
        GRAFT_WARN(GRAFT_MOD_TRANSFER, "UCX_TLS=%s leaves the listener no network transport: it "
                   "uses tcp", user);
        snprintf(out, size, "tcp");
    }
}

static graft_status_t ucx_init(graft_transfer_endpoint_t *ep)
{
    graft__transport_state_t *t;
    ucp_listener_params_t lp;
    ucp_listener_attr_t la;
    struct sockaddr_in sa;
    struct in_addr advertised;
    char host[INET_ADDRSTRLEN];
    ucs_status_t st;
    graft_status_t status;
    int rc;

    status = graft__ucx_listen_sockaddr(ep->listen_address, ep->port, &sa);
    if (status != GRAFT_OK)
        return status;
    /* A wildcard in the membership record tells peers nothing: publish
     * what the user advertises, and refuse the wildcard without it. */
    advertised = sa.sin_addr;
    if (ep->advertise_address != NULL) {
        status = graft__ucx_resolve_host(ep->advertise_address, &advertised);
        if (status != GRAFT_OK)
            return status;
    }
    if (advertised.s_addr == htonl(INADDR_ANY)) {
        GRAFT_ERROR(GRAFT_MOD_TRANSFER, ep->advertise_address != NULL
                    ? "advertised address '%s' is the wildcard: peers cannot reach it"
                    : "listening on '%s' (the wildcard) needs an advertised address",
                    ep->advertise_address != NULL ? ep->advertise_address : ep->listen_address);
        return GRAFT_EINVAL;
    }
    if (inet_ntop(AF_INET, &advertised, host, sizeof(host)) == NULL)
        return GRAFT_EINVAL;

    t = graft__calloc(1, sizeof(*t));
    if (t == NULL)
        return GRAFT_ENOMEM;
    t->ep = ep;
    t->efd = -1;
    atomic_init(&t->stop, false);
    graft__ucx_msgq_init(&t->msgs);
    ep->transport = t;

    net_device_of(sa.sin_addr.s_addr != htonl(INADDR_ANY) ? sa.sin_addr : advertised, t->net_dev,
                  sizeof(t->net_dev));
    status = graft__ucx_context_create(t, true, &t->ctx);
    if (status == GRAFT_OK)
        status = graft__ucx_context_create(t, false, &t->srv_ctx);
    if (status == GRAFT_OK)
        status = graft__ucx_worker_create(t->srv_ctx, &t->worker);
    if (status == GRAFT_OK)
        status = graft__ucx_donor_handlers(t);
    if (status != GRAFT_OK)
        goto err;
    graft__ucx_shm_init(t);
    st = ucp_worker_get_efd(t->worker, &t->efd);
    if (st != UCS_OK) {
        GRAFT_ERROR(GRAFT_MOD_TRANSFER, "ucp_worker_get_efd: %s", ucs_status_string(st));
        status = GRAFT_ETRANSPORT;
        goto err;
    }

    memset(&lp, 0, sizeof(lp));
    lp.field_mask = UCP_LISTENER_PARAM_FIELD_SOCK_ADDR | UCP_LISTENER_PARAM_FIELD_CONN_HANDLER;
    lp.sockaddr.addr = (const struct sockaddr *)&sa;
    lp.sockaddr.addrlen = sizeof(sa);
    lp.conn_handler.cb = graft__ucx_conn_handler;
    lp.conn_handler.arg = t;
    st = ucp_listener_create(t->worker, &lp, &t->listener);
    if (st != UCS_OK) {
        GRAFT_ERROR(GRAFT_MOD_TRANSFER, "listening on %s (port %u): %s", ep->listen_address,
                    (unsigned)ntohs(sa.sin_port), ucs_status_string(st));
        status = GRAFT_ETRANSPORT;
        goto err;
    }
    la.field_mask = UCP_LISTENER_ATTR_FIELD_SOCKADDR;
    st = ucp_listener_query(t->listener, &la);
    if (st != UCS_OK) {
        GRAFT_ERROR(GRAFT_MOD_TRANSFER, "ucp_listener_query: %s", ucs_status_string(st));
        status = GRAFT_ETRANSPORT;
        goto err;
    }
    snprintf(ep->address, sizeof(ep->address), "%s:%u", host,
             (unsigned)ntohs(((struct sockaddr_in *)&la.sockaddr)->sin_port));
    flood_caveat(sa.sin_addr.s_addr);

    rc = pthread_create(&t->thread, NULL, graft__ucx_progress_thread, t);
    if (rc != 0) {
        GRAFT_ERROR(GRAFT_MOD_TRANSFER, "pthread_create: %s", strerror(rc));
        status = GRAFT_ESYS;
        goto err;
    }
    t->thread_started = true;
    GRAFT_DEBUG(GRAFT_MOD_TRANSFER, "endpoint listening on %s", ep->address);
    return GRAFT_OK;

err:
    ucx_fini(ep);
    return status;
}

static void ucx_region_unmap(graft_transfer_endpoint_t *ep, graft__region_t *r)
{
    graft__transport_state_t *t = ep->transport;
    if (r->rkey != NULL)
        ucp_rkey_buffer_release(r->rkey);
    /* A region inside a graft_transfer_host_alloc() block borrows its
     * mapping; the block's owner unmaps it. */
    if (r->memh != NULL && r->alloc == NULL)
        (void)ucp_mem_unmap(t->ctx, r->memh);
    r->rkey = NULL;
    r->memh = NULL;
    if (r->device == GRAFT_TRANSFER_CUDA && r->host != r->ptr) {
        graft__cuda_host_free(r->host);
        r->host = r->ptr;
    }
}

static void ucx_fini(graft_transfer_endpoint_t *ep)
{
    graft__transport_state_t *t = ep->transport;
    if (t == NULL)
        return;
    if (t->thread_started) {
        atomic_store(&t->stop, true);
        (void)ucp_worker_signal(t->worker);
        pthread_join(t->thread, NULL);
    }
    graft__ucx_msg_fini(ep);
    while (t->conns != NULL) {
        ucx_conn_t *c = t->conns;
        t->conns = c->next;
        graft__ucx_conn_close(t, c);
    }
    graft__ucx_closing_reap(t, true);
    graft__ucx_msgq_clear(&t->msgs);
    if (t->listener != NULL)
        ucp_listener_destroy(t->listener);
    for (size_t i = 0; i < ep->n_regions; i++)
        ucx_region_unmap(ep, &ep->regions[i]);
    /* Blocks the caller did not free: their mappings die with the context. */
    for (graft__host_alloc_t *a = ep->host_allocs; a != NULL; a = a->next) {
        if (a->memh != NULL) {
            GRAFT_DEBUG(GRAFT_MOD_TRANSFER, "host block %p (%llu bytes) freed with the endpoint",
                       a->ptr, (unsigned long long)a->bytes);
            (void)ucp_mem_unmap(t->ctx, a->memh);
            a->memh = NULL;
        }
    }
    if (t->worker != NULL)
        ucp_worker_destroy(t->worker);
    if (t->srv_ctx != NULL)
        ucp_cleanup(t->srv_ctx);
    if (t->shm_ctx != NULL)
        ucp_cleanup(t->shm_ctx);
    if (t->ctx != NULL)
        ucp_cleanup(t->ctx);
    graft_free(t);
    ep->transport = NULL;
}

static graft_status_t ucx_region_map(graft_transfer_endpoint_t *ep, graft__region_t *r)
{
    graft__transport_state_t *t = ep->transport;
    ucp_mem_map_params_t mp;
    ucs_status_t st;

    if (r->device == GRAFT_TRANSFER_CUDA) {
        /* Debian's UCX has no CUDA support: the network reads and writes a
         * pinned host shadow, staged from/to the device around transfers. */
        graft_status_t status = graft__cuda_host_alloc(r->bytes, &r->host);
        if (status != GRAFT_OK) {
            GRAFT_ERROR(GRAFT_MOD_TRANSFER, "region '%s': no pinned host shadow for its device "
                        "memory", r->name);
            return status;
        }
    }
    if (r->bytes == 0)
        return GRAFT_OK;
    if (r->alloc != NULL) {
        /* Already mapped by ucx_host_alloc(): the key of the whole block
         * also covers this part of it. */
        r->memh = r->alloc->memh;
        st = ucp_rkey_pack(t->ctx, r->memh, &r->rkey, &r->rkey_len);
        if (st != UCS_OK) {
            GRAFT_ERROR(GRAFT_MOD_TRANSFER, "ucp_rkey_pack of region '%s': %s", r->name,
                        ucs_status_string(st));
            r->memh = NULL;
            return GRAFT_ETRANSPORT;
        }
        graft__ucx_rkey_layout_learn(&t->rkey_layout_unknown, r);
        return GRAFT_OK;
    }
    memset(&mp, 0, sizeof(mp));
    mp.field_mask = UCP_MEM_MAP_PARAM_FIELD_ADDRESS | UCP_MEM_MAP_PARAM_FIELD_LENGTH;
    mp.address = r->host;
    mp.length = r->bytes;
    st = ucp_mem_map(t->ctx, &mp, (ucp_mem_h *)&r->memh);
    if (st != UCS_OK) {
        GRAFT_ERROR(GRAFT_MOD_TRANSFER, "ucp_mem_map of region '%s' (%llu bytes): %s", r->name,
                    (unsigned long long)r->bytes, ucs_status_string(st));
        goto err_shadow;
    }
    st = ucp_rkey_pack(t->ctx, r->memh, &r->rkey, &r->rkey_len);
    if (st != UCS_OK) {
        GRAFT_ERROR(GRAFT_MOD_TRANSFER, "ucp_rkey_pack of region '%s': %s", r->name,
                    ucs_status_string(st));
        (void)ucp_mem_unmap(t->ctx, r->memh);
        r->memh = NULL;
        goto err_shadow;
    }
    graft__ucx_rkey_layout_learn(&t->rkey_layout_unknown, r);
    return GRAFT_OK;

err_shadow:
    if (r->device == GRAFT_TRANSFER_CUDA) {
        graft__cuda_host_free(r->host);
        r->host = r->ptr;
    }
    return GRAFT_ETRANSPORT;
}

/*
 * Memory that UCX allocates itself (UCP_MEM_MAP_ALLOCATE) comes from its
 * shared-memory domains first (sysv, then posix; UCX_ALLOC_PRIO), which can
 * hand a peer on the same host a key to map the block: its gets become a
 * memcpy in the recipient (rkey_ptr), with no work for the donor. Memory
 * the caller allocated can only be registered, and UCX 1.13 serves gets on
 * it by active messages through the donor's progress thread.
 */
static graft_status_t ucx_host_alloc(graft_transfer_endpoint_t *ep, uint64_t bytes,
                                     graft__host_alloc_t *a)
{
    graft__transport_state_t *t = ep->transport;
    ucp_mem_map_params_t mp;
    ucp_mem_attr_t attr;
    ucp_mem_h memh = NULL;
    graft_status_t status;
    ucs_status_t st;

    if ((uint64_t)(size_t)bytes != bytes) {
        GRAFT_ERROR(GRAFT_MOD_TRANSFER, "host block of %llu bytes is too large",
                    (unsigned long long)bytes);
        return GRAFT_ENOMEM;
    }
    memset(&mp, 0, sizeof(mp));
    mp.field_mask = UCP_MEM_MAP_PARAM_FIELD_ADDRESS | UCP_MEM_MAP_PARAM_FIELD_LENGTH |
                    UCP_MEM_MAP_PARAM_FIELD_FLAGS | UCP_MEM_MAP_PARAM_FIELD_MEMORY_TYPE;
    mp.address = NULL;
    mp.length = (size_t)bytes;
    mp.flags = UCP_MEM_MAP_ALLOCATE;
    mp.memory_type = UCS_MEMORY_TYPE_HOST;
    st = ucp_mem_map(t->ctx, &mp, &memh);
    if (st != UCS_OK) {
        GRAFT_ERROR(GRAFT_MOD_TRANSFER, "ucp_mem_map(ALLOCATE, %llu bytes): %s",
                    (unsigned long long)bytes, ucs_status_string(st));
        return st == UCS_ERR_NO_MEMORY || st == UCS_ERR_EXCEEDS_LIMIT ? GRAFT_ENOMEM
                                                                       : GRAFT_ETRANSPORT;
    }
    attr.field_mask = UCP_MEM_ATTR_FIELD_ADDRESS | UCP_MEM_ATTR_FIELD_LENGTH;
    st = ucp_mem_query(memh, &attr);
    if (st != UCS_OK) {
        GRAFT_ERROR(GRAFT_MOD_TRANSFER, "ucp_mem_query: %s", ucs_status_string(st));
        status = GRAFT_ETRANSPORT;
        goto err_unmap;
    }
    /* The documented alignment; UCX's allocators all return whole pages. */
    if (((uintptr_t)attr.address & 63u) != 0 || attr.length < bytes) {
        GRAFT_ERROR(GRAFT_MOD_TRANSFER, "ucp_mem_map(ALLOCATE) gave %p, %zu bytes", attr.address,
                    attr.length);
        status = GRAFT_ETRANSPORT;
        goto err_unmap;
    }
    a->ptr = attr.address;
    a->bytes = attr.length;
    a->memh = memh;
    GRAFT_DEBUG(GRAFT_MOD_TRANSFER, "host block %p: %zu bytes", attr.address, attr.length);
    return GRAFT_OK;

err_unmap:
    (void)ucp_mem_unmap(t->ctx, memh);
    return status;
}

static void ucx_host_free(graft_transfer_endpoint_t *ep, graft__host_alloc_t *a)
{
    graft__transport_state_t *t = ep->transport;
    if (a->memh != NULL) {
        ucs_status_t st = ucp_mem_unmap(t->ctx, a->memh);
        if (st != UCS_OK)
            GRAFT_WARN(GRAFT_MOD_TRANSFER, "ucp_mem_unmap of host block %p: %s", a->ptr,
                       ucs_status_string(st));
    }
    a->memh = NULL;
}

const struct graft_transport_ops graft__ucx_ops = {
    .name = "ucx",
    .init = ucx_init,
    .fini = ucx_fini,
    .region_map = ucx_region_map,
    .region_unmap = ucx_region_unmap,
    .host_alloc = ucx_host_alloc,
    .host_free = ucx_host_free,
    .pull = graft__ucx_pull,
    .msg_send = graft__ucx_msg_send,
    .msg_forget = graft__ucx_msg_forget,
};
