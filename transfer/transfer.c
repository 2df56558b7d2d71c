/*
 * The transfer engine: configuration, the region table and its layout hash,
 * background chunk hashing for donors, and dispatch to the transport
 * backend (transfer/ucx*.c, transfer/nccl.c). The recipients' fence and
 * the groups served are transfer_fence.c's, which the backends write too.
 */
#include "transfer_int.h"

#include <protobuf-c/protobuf-c.h>

#include <errno.h>
#include <stdlib.h>
#include <string.h>

/* ------------------------------------------------------------------------ */
/* Life cycle                                                               */
/* ------------------------------------------------------------------------ */

/* Add one region to the layout hash. */
static void layout_hash_add(graft_transfer_endpoint_t *ep, const graft__region_t *r)
{
    XXH3_state_t *st = &ep->layout_state;
    uint32_t name_len = (uint32_t)strlen(r->name);
    uint32_t kind = (uint32_t)r->kind, device = (uint32_t)r->device;
    /* Length-prefix the name so ("ab","c") and ("a","bc") differ. */
    XXH3_64bits_update(st, &name_len, sizeof(name_len));
    XXH3_64bits_update(st, r->name, name_len);
    XXH3_64bits_update(st, &kind, sizeof(kind));
    XXH3_64bits_update(st, &r->dtype, sizeof(r->dtype));
    XXH3_64bits_update(st, &device, sizeof(device));
    XXH3_64bits_update(st, &r->bytes, sizeof(r->bytes));
    ep->layout_hash = XXH3_64bits_digest(st);
}

graft_status_t graft_transfer_endpoint_create(const graft_transfer_config_t *config,
                                              graft_transfer_endpoint_t **ep_p)
{
    graft_transfer_config_t defaults = {0};
    graft_transfer_endpoint_t *ep = NULL;
    graft_status_t status;

    if (ep_p == NULL)
        return GRAFT_EINVAL;
    if (config == NULL)
        config = &defaults;

    ep = graft__calloc(1, sizeof(*ep));
    if (ep == NULL)
        return GRAFT_ENOMEM;
    ep->listen_address =
        graft__strdup(config->listen_address != NULL ? config->listen_address : "127.0.0.1");
    if (config->job_secret == NULL || config->job_secret_len < GRAFT_TRANSFER_SECRET_MIN_BYTES ||
        config->job_secret_len > GRAFT_TRANSFER_SECRET_MAX_BYTES) {
        GRAFT_ERROR(GRAFT_MOD_TRANSFER, "a transfer endpoint needs a job secret of %u to %u bytes "
                    "(%zu given)", GRAFT_TRANSFER_SECRET_MIN_BYTES,
                    GRAFT_TRANSFER_SECRET_MAX_BYTES,
                    config->job_secret != NULL ? config->job_secret_len : 0);
        graft_free(ep->listen_address);
        graft_free(ep);
        return GRAFT_EINVAL;
    }
    memcpy(ep->job_secret, config->job_secret, config->job_secret_len);
    ep->job_secret_len = config->job_secret_len;
    if (config->advertise_address != NULL)
        ep->advertise_address = graft__strdup(config->advertise_address);
    if (ep->listen_address == NULL ||
        (config->advertise_address != NULL && ep->advertise_address == NULL)) {
        status = GRAFT_ENOMEM;
        goto err_free;
    }
    ep->port = config->port;
    ep->group = config->group;
    ep->rank = config->rank;
    ep->chunk_bytes =
        config->chunk_bytes != 0 ? config->chunk_bytes : GRAFT_TRANSFER_DEFAULT_CHUNK_BYTES;
    ep->hash_threads = config->hash_threads != 0 ? config->hash_threads : 2;
    ep->max_recipients = config->max_recipients != 0 ? config->max_recipients
                                                      : GRAFT_TRANSFER_DEFAULT_MAX_RECIPIENTS;
    if (ep->hash_threads > 64) {
        GRAFT_ERROR(GRAFT_MOD_TRANSFER, "hash_threads %u is more than 64", ep->hash_threads);
        status = GRAFT_EINVAL;
        goto err_free;
    }
    XXH3_64bits_reset(&ep->layout_state);
    ep->layout_hash = XXH3_64bits_digest(&ep->layout_state);
    atomic_init(&ep->hash_next, 0);
    atomic_init(&ep->hash_stop, false);
    atomic_init(&ep->pulling, false);
    atomic_init(&ep->cancel, false);
    if (pthread_mutex_init(&ep->lock, NULL) != 0) {
        status = GRAFT_ESYS;
        goto err_free;
    }
    if (pthread_cond_init(&ep->cond, NULL) != 0) {
        status = GRAFT_ESYS;
        goto err_mutex;
    }
    status = graft__transfer_msgbox_init(ep);
    if (status != GRAFT_OK)
        goto err_cond;

    ep->ops = &graft__ucx_ops;
    status = ep->ops->init(ep);
    if (status != GRAFT_OK)
        goto err_msg_cond;

    *ep_p = ep;
    return GRAFT_OK;

err_msg_cond:
    graft__transfer_msgbox_destroy(ep);
err_cond:
    pthread_cond_destroy(&ep->cond);
err_mutex:
    pthread_mutex_destroy(&ep->lock);
err_free:
    graft_free(ep->listen_address);
    graft_free(ep->advertise_address);
    explicit_bzero(ep->job_secret, sizeof(ep->job_secret));
    graft_free(ep->recipients);
    graft_free(ep);
    return status;
}

static void hashing_stop(graft_transfer_endpoint_t *ep)
{
    atomic_store(&ep->hash_stop, true);
    for (uint32_t i = 0; i < ep->n_hash_tids; i++)
        pthread_join(ep->hash_tids[i], NULL);
    graft_free(ep->hash_tids);
    ep->hash_tids = NULL;
    ep->n_hash_tids = 0;
}

void graft_transfer_endpoint_destroy(graft_transfer_endpoint_t *ep)
{
    if (ep == NULL)
        return;
    hashing_stop(ep);
    /* The backend's progress thread reads the region table: stop it first.
     * It also unmaps the host blocks the caller left allocated. */
    ep->ops->fini(ep);
    while (ep->host_allocs != NULL) {
        graft__host_alloc_t *a = ep->host_allocs;
        ep->host_allocs = a->next;
        graft_free(a->raw);
        graft_free(a);
    }
    for (size_t i = 0; i < ep->n_regions; i++)
        graft_free(ep->regions[i].name);
    graft_free(ep->regions);
    graft_free(ep->hashes);
    graft_free(ep->hash_done);
    graft__transfer_msgbox_destroy(ep);
    pthread_cond_destroy(&ep->cond);
    pthread_mutex_destroy(&ep->lock);
    graft_free(ep->listen_address);
    graft_free(ep->advertise_address);
    explicit_bzero(ep->job_secret, sizeof(ep->job_secret));
    graft_free(ep->recipients);
    graft_free(ep);
}

const char *graft_transfer_endpoint_address(const graft_transfer_endpoint_t *ep)
{
    return ep != NULL ? ep->address : "";
}

graft_status_t graft_transfer_endpoint_group_set(graft_transfer_endpoint_t *ep, uint32_t group)
{
    if (ep == NULL)
        return GRAFT_EINVAL;
    pthread_mutex_lock(&ep->lock);
    bool used = ep->serving || ep->serve_gen != 0 || atomic_load(&ep->pulling);
    if (!used)
        ep->group = group;
    pthread_mutex_unlock(&ep->lock);
    return used ? GRAFT_ESTATE : GRAFT_OK;
}

/* ------------------------------------------------------------------------ */
/* Regions                                                                  */
/* ------------------------------------------------------------------------ */

/* ------------------------------------------------------------------------ */
/* Host memory that the transport can read one-sidedly                      */
/* ------------------------------------------------------------------------ */

/* Page alignment for the plain fallback, as the UCX allocators give. */
#define HOST_PLAIN_ALIGN 4096u
#define HOST_PLAIN_ALLOC_SLACK (HOST_PLAIN_ALIGN - 1)

static graft_status_t host_alloc_plain(const graft_transfer_endpoint_t *ep, uint64_t bytes,
                                       graft__host_alloc_t *a)
{
    static atomic_bool said;
    if (bytes > SIZE_MAX - HOST_PLAIN_ALLOC_SLACK)
        return GRAFT_ENOMEM;
    a->raw = graft__malloc((size_t)bytes + HOST_PLAIN_ALLOC_SLACK);
    if (a->raw == NULL)
        return GRAFT_ENOMEM;
    a->ptr = (void *)(((uintptr_t)a->raw + HOST_PLAIN_ALIGN - 1) & ~(uintptr_t)(HOST_PLAIN_ALIGN - 1));
    a->bytes = bytes;
    if (!atomic_exchange(&said, true))
        GRAFT_INFO(GRAFT_MOD_TRANSFER,
                   "transport %s cannot allocate shareable memory: host blocks are plain "
                   "aligned memory, mapped like any other region",
                   ep->ops->name);
    return GRAFT_OK;
}

graft_status_t graft_transfer_host_alloc(graft_transfer_endpoint_t *ep, uint64_t bytes,
                                         void **ptr_p)
{
    graft__host_alloc_t *a;
    graft_status_t status;

    if (ep == NULL || bytes == 0 || ptr_p == NULL)
        return GRAFT_EINVAL;
    a = graft__calloc(1, sizeof(*a));
    if (a == NULL)
        return GRAFT_ENOMEM;
    if (ep->ops->host_alloc != NULL)
        status = ep->ops->host_alloc(ep, bytes, a);
    else
        status = host_alloc_plain(ep, bytes, a);
    if (status != GRAFT_OK) {
        graft_free(a);
        return status;
    }
    pthread_mutex_lock(&ep->lock);
    a->next = ep->host_allocs;
    ep->host_allocs = a;
    pthread_mutex_unlock(&ep->lock);
    *ptr_p = a->ptr;
    return GRAFT_OK;
}

graft_status_t graft_transfer_host_free(graft_transfer_endpoint_t *ep, void *ptr)
{
    graft__host_alloc_t **link, *a = NULL;
    graft_status_t status = GRAFT_OK;

    if (ep == NULL)
        return GRAFT_EINVAL;
    if (ptr == NULL)
        return GRAFT_OK;
    pthread_mutex_lock(&ep->lock);
    for (link = &ep->host_allocs; *link != NULL; link = &(*link)->next) {
        if ((*link)->ptr == ptr)
            break;
    }
    if (*link == NULL) {
        GRAFT_ERROR(GRAFT_MOD_TRANSFER, "host_free(%p): not a block of this endpoint", ptr);
        status = GRAFT_EINVAL;
    } else if ((*link)->n_regions > 0) {
        GRAFT_ERROR(GRAFT_MOD_TRANSFER, "host_free(%p): %u registered regions still use it", ptr,
                    (*link)->n_regions);
        status = GRAFT_ESTATE;
    } else {
        a = *link;
        *link = a->next;
    }
    pthread_mutex_unlock(&ep->lock);
    if (a != NULL) {
        if (ep->ops->host_free != NULL)
            ep->ops->host_free(ep, a);
        graft_free(a->raw);
        graft_free(a);
    }
    return status;
}

/* The block that @p region lies in, or NULL; a region that starts in a
 * block must end in it too, since only the block is mapped. */
static graft_status_t host_alloc_find(graft_transfer_endpoint_t *ep,
                                      const graft_transfer_region_t *region,
                                      graft__host_alloc_t **alloc_p)
{
    uintptr_t lo = (uintptr_t)region->ptr;
    graft_status_t status = GRAFT_OK;
    graft__host_alloc_t *found = NULL;

    pthread_mutex_lock(&ep->lock);
    for (graft__host_alloc_t *a = ep->host_allocs; a != NULL; a = a->next) {
        uintptr_t base = (uintptr_t)a->ptr;
        if (lo < base || lo - base >= a->bytes)
            continue;
        if (region->bytes > a->bytes - (lo - base)) {
            GRAFT_ERROR(GRAFT_MOD_TRANSFER,
                        "region '%s' (%llu bytes at %p) runs past the end of host block %p "
                        "(%llu bytes)",
                        region->name, (unsigned long long)region->bytes, region->ptr, a->ptr,
                        (unsigned long long)a->bytes);
            status = GRAFT_EINVAL;
        } else {
            found = a;
        }
        break;
    }
    pthread_mutex_unlock(&ep->lock);
    if (status == GRAFT_OK)
        *alloc_p = found;
    return status;
}

graft_status_t graft_transfer_region_register(graft_transfer_endpoint_t *ep,
                                              const graft_transfer_region_t *region)
{
    graft__region_t *grown, *r;
    graft_status_t status;

    if (ep == NULL || region == NULL || region->name == NULL || region->name[0] == '\0' ||
        (region->ptr == NULL && region->bytes > 0) || region->kind < GRAFT_TRANSFER_REGION_PARAM ||
        region->kind > GRAFT_TRANSFER_REGION_BLOB ||
        (region->device != GRAFT_TRANSFER_HOST && region->device != GRAFT_TRANSFER_CUDA) ||
        strlen(region->name) >= sizeof(((graft_transfer_report_t *)0)->drift.region))
        return GRAFT_EINVAL;
    if (ep->serving || atomic_load(&ep->pulling) || ep->hashes != NULL)
        return GRAFT_ESTATE;
    for (size_t i = 0; i < ep->n_regions; i++) {
        if (strcmp(ep->regions[i].name, region->name) == 0)
            return GRAFT_EEXIST;
    }

    grown = graft__realloc(ep->regions, (ep->n_regions + 1) * sizeof(*grown));
    if (grown == NULL)
        return GRAFT_ENOMEM;
    ep->regions = grown;
    r = &ep->regions[ep->n_regions];
    memset(r, 0, sizeof(*r));
    r->name = graft__strdup(region->name);
    if (r->name == NULL)
        return GRAFT_ENOMEM;
    r->kind = region->kind;
    r->dtype = region->dtype;
    r->device = region->device;
    r->ptr = region->ptr;
    r->host = region->ptr;
    r->bytes = region->bytes;
    r->n_chunks = (region->bytes + ep->chunk_bytes - 1) / ep->chunk_bytes;
    r->first_chunk = ep->total_chunks;
    if (region->device == GRAFT_TRANSFER_HOST && region->bytes > 0) {
        status = host_alloc_find(ep, region, &r->alloc);
        if (status != GRAFT_OK) {
            graft_free(r->name);
            return status;
        }
    }

    status = ep->ops->region_map(ep, r);
    if (status != GRAFT_OK) {
        graft_free(r->name);
        return status;
    }
    if (r->alloc != NULL) {
        pthread_mutex_lock(&ep->lock);
        r->alloc->n_regions++;
        pthread_mutex_unlock(&ep->lock);
    }
    ep->n_regions++;
    ep->total_chunks += r->n_chunks;
    ep->total_bytes += r->bytes;
    layout_hash_add(ep, r);
    return GRAFT_OK;
}

graft_status_t graft_transfer_layout_hash(const graft_transfer_endpoint_t *ep, uint64_t *hash_p)
{
    if (ep == NULL || hash_p == NULL)
        return GRAFT_EINVAL;
    *hash_p = ep->layout_hash;
    return GRAFT_OK;
}

/* ------------------------------------------------------------------------ */
/* Serving: hash every chunk in the background                              */
/* ------------------------------------------------------------------------ */

/* Chunks are handed out in order, so the prefix of finished hashes that the
 * donor streams to recipients grows steadily. */
static void *hash_thread(void *arg)
{
    graft_transfer_endpoint_t *ep = arg;
    size_t region = 0;

    for (;;) {
        uint64_t c = atomic_fetch_add(&ep->hash_next, 1);
        if (c >= ep->total_chunks || atomic_load(&ep->hash_stop))
            break;
        while (c >= ep->regions[region].first_chunk + ep->regions[region].n_chunks)
            region++;
        const graft__region_t *r = &ep->regions[region];
        uint64_t idx = c - r->first_chunk;
        uint64_t len = graft__region_chunk_len(ep, r, idx);
        ep->hashes[c] = XXH3_64bits((const char *)r->host + idx * ep->chunk_bytes, len);
        atomic_store_explicit(&ep->hash_done[c], 1, memory_order_release);
    }
    return NULL;
}

graft_status_t graft_transfer_serve_expect(graft_transfer_endpoint_t *ep, uint64_t step)
{
    if (ep == NULL)
        return GRAFT_EINVAL;
    pthread_mutex_lock(&ep->lock);
    if (ep->serving) {
        pthread_mutex_unlock(&ep->lock);
        return GRAFT_ESTATE;
    }
    if (!ep->expecting || ep->expect_step != step) {
        ep->expecting = true;
        ep->expect_step = step;
        graft__transfer_fence_restart(ep, step);
    }
    pthread_mutex_unlock(&ep->lock);
    GRAFT_DEBUG(GRAFT_MOD_TRANSFER, "will serve step %llu: its requests queue until then",
                (unsigned long long)step);
    return GRAFT_OK;
}

graft_status_t graft_transfer_serve_begin(graft_transfer_endpoint_t *ep, uint64_t step)
{
    uint64_t *hashes = NULL;
    atomic_uchar *done = NULL;
    pthread_t *tids = NULL;
    uint32_t n = 0;
    graft_status_t status = GRAFT_OK;

    if (ep == NULL)
        return GRAFT_EINVAL;
    if (atomic_load(&ep->pulling))
        return GRAFT_ESTATE;
    pthread_mutex_lock(&ep->lock);
    if (ep->serving) {
        status = ep->serve_step == step ? GRAFT_OK : GRAFT_ESTATE;
        pthread_mutex_unlock(&ep->lock);
        return status;
    }
    pthread_mutex_unlock(&ep->lock);

    /* One extra slot so an empty table still allocates. */
    hashes = graft__calloc(ep->total_chunks + 1, sizeof(*hashes));
    done = graft__calloc(ep->total_chunks + 1, sizeof(*done));
    tids = graft__calloc(ep->hash_threads, sizeof(*tids));
    if (hashes == NULL || done == NULL || tids == NULL) {
        status = GRAFT_ENOMEM;
        goto err_free;
    }

    /* Device regions are served from their pinned shadows: refresh them. */
    for (size_t i = 0; i < ep->n_regions; i++) {
        graft__region_t *r = &ep->regions[i];
        if (r->device != GRAFT_TRANSFER_CUDA)
            continue;
        status = graft__cuda_copy(r->host, r->ptr, r->bytes, false);
        if (status != GRAFT_OK)
            goto err_free;
    }
    pthread_mutex_lock(&ep->lock);
    ep->hashes = hashes;
    ep->hash_done = done;
    atomic_store(&ep->hash_next, 0);
    atomic_store(&ep->hash_stop, false);
    ep->serve_step = step;
    ep->serving = true;
    if (ep->expecting && ep->expect_step == step) {
        /* Announced: the fence has counted since then, and the queued
         * recipients keep their places. */
        ep->expecting = false;
    } else {
        ep->expecting = false;
        graft__transfer_fence_restart(ep, step);
    }
    pthread_mutex_unlock(&ep->lock);

    for (n = 0; n < ep->hash_threads; n++) {
        int rc = pthread_create(&tids[n], NULL, hash_thread, ep);
        if (rc != 0) {
            GRAFT_ERROR(GRAFT_MOD_TRANSFER, "pthread_create: %s", strerror(rc));
            status = GRAFT_ESYS;
            break;
        }
    }
    ep->hash_tids = tids;
    ep->n_hash_tids = n;
    if (status != GRAFT_OK) {
        if (graft_transfer_serve_end(ep) != GRAFT_OK)
            GRAFT_WARN(GRAFT_MOD_TRANSFER, "serve_end after a failed serve_begin");
        return status;
    }
    GRAFT_DEBUG(GRAFT_MOD_TRANSFER, "serving step %llu: %llu chunks, %llu bytes",
                (unsigned long long)step, (unsigned long long)ep->total_chunks,
                (unsigned long long)ep->total_bytes);
    return GRAFT_OK;

err_free:
    graft_free(hashes);
    graft_free(done);
    graft_free(tids);
    return status;
}

graft_status_t graft_transfer_serve_recipients(graft_transfer_endpoint_t *ep,
                                               const uint32_t *groups, size_t n)
{
    uint32_t *copy = NULL;
    if (ep == NULL || (n > 0 && groups == NULL) || n > 65536)
        return GRAFT_EINVAL;
    if (n > 0) {
        copy = graft__malloc(n * sizeof(*copy));
        if (copy == NULL)
            return GRAFT_ENOMEM;
        memcpy(copy, groups, n * sizeof(*copy));
    }
    pthread_mutex_lock(&ep->lock);
    uint32_t *old = ep->recipients;
    ep->recipients = copy;
    ep->n_recipients = n;
    pthread_mutex_unlock(&ep->lock);
    graft_free(old);
    return GRAFT_OK;
}

graft_status_t graft_transfer_serve_end(graft_transfer_endpoint_t *ep)
{
    uint64_t *hashes;
    atomic_uchar *done;

    if (ep == NULL)
        return GRAFT_EINVAL;
    pthread_mutex_lock(&ep->lock);
    if (!ep->serving) {
        bool expecting = ep->expecting;
        if (expecting) {
            /* The announced serve will not come: queued recipients are
             * refused from now on. */
            ep->expecting = false;
            ep->serve_gen++;
            ep->follow_owed = 0;
        }
        pthread_mutex_unlock(&ep->lock);
        return expecting ? GRAFT_OK : GRAFT_ESTATE;
    }
    ep->serving = false;
    ep->serve_gen++;
    ep->follow_owed = 0;
    pthread_cond_broadcast(&ep->cond); /* graft_transfer_followers_wait() */
    pthread_mutex_unlock(&ep->lock);

    hashing_stop(ep);

    /* The progress thread reads hashes under the lock and checks serving
     * first, so after this no one touches them. */
    pthread_mutex_lock(&ep->lock);
    hashes = ep->hashes;
    done = ep->hash_done;
    ep->hashes = NULL;
    ep->hash_done = NULL;
    pthread_mutex_unlock(&ep->lock);
    graft_free(hashes);
    graft_free(done);
    return GRAFT_OK;
}

/* ------------------------------------------------------------------------ */
/* Counters                                                                 */
/* ------------------------------------------------------------------------ */

uint32_t graft_transfer_serve_peak(graft_transfer_endpoint_t *ep)
{
    uint32_t n;
    if (ep == NULL)
        return 0;
    pthread_mutex_lock(&ep->lock);
    n = ep->serve_peak;
    pthread_mutex_unlock(&ep->lock);
    return n;
}

uint64_t graft_transfer_refused_count(graft_transfer_endpoint_t *ep)
{
    return ep != NULL ? atomic_load(&ep->refused) : 0;
}

uint64_t graft_transfer_serve_failures(graft_transfer_endpoint_t *ep)
{
    return ep != NULL ? atomic_load(&ep->serve_failures) : 0;
}

/* ------------------------------------------------------------------------ */
/* Pull                                                                     */
/* ------------------------------------------------------------------------ */

graft_status_t graft_transfer_pull(graft_transfer_endpoint_t *ep,
                                   const graft_transfer_pull_options_t *options,
                                   graft_transfer_report_t *report_p)
{
    graft_transfer_report_t local;
    graft_transfer_report_t *rep = report_p != NULL ? report_p : &local;
    graft_status_t status;
    bool expected = false;

    memset(rep, 0, sizeof(*rep));
    if (ep == NULL || options == NULL || options->donors == NULL || options->n_donors == 0 ||
        options->n_donors > GRAFT_TRANSFER_MAX_DONORS) {
        rep->status = GRAFT_EINVAL;
        return GRAFT_EINVAL;
    }
    for (size_t i = 0; i < options->n_donors; i++) {
        if (options->donors[i] == NULL) {
            rep->status = GRAFT_EINVAL;
            return GRAFT_EINVAL;
        }
    }
    if (ep->serving || !atomic_compare_exchange_strong(&ep->pulling, &expected, true)) {
        rep->status = GRAFT_ESTATE;
        return GRAFT_ESTATE;
    }
    atomic_store(&ep->cancel, false);
    rep->step = options->step;
    /* The backend, chosen once: UCX is the endpoint's own; NCCL pairs
     * (transfer/nccl.c, or its stub in a build without CUDA). */
    const struct graft_transport_ops *ops = options->backend == GRAFT_TRANSFER_BACKEND_NCCL
                                                ? &graft__nccl_ops
                                            : options->backend == GRAFT_TRANSFER_BACKEND_UCX
                                                ? ep->ops
                                                : NULL;
    status = ops == NULL ? GRAFT_EINVAL : ops->pull(ep, options, rep);
    rep->status = status;
    rep->installed = status == GRAFT_OK;
    atomic_store(&ep->pulling, false);
    return status;
}

void graft_transfer_pull_cancel(graft_transfer_endpoint_t *ep)
{
    if (ep != NULL && atomic_load(&ep->pulling))
        atomic_store(&ep->cancel, true);
}

graft_status_t graft_transfer_serve_nccl(graft_transfer_endpoint_t *ep, uint64_t step,
                                         const graft_transfer_nccl_options_t *options)
{
    if (ep == NULL || options == NULL || options->exchange == NULL)
        return GRAFT_EINVAL;
    return graft__nccl_ops.serve_pair(ep, step, options);
}

int graft_transfer_cuda_device_count(void)
{
    return graft__cuda_devices();
}
