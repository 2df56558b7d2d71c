/*
 * The runtime's life cycle and region table: the top of runtime/. The step
 * protocol itself is in runtime_step.c, the persistent tier in
 * runtime_persist.c, the drift check in runtime_drift.c, and the accessors,
 * metrics and events that every other file uses in runtime_observe.c.
 */
#include "runtime_internal.h"

#include <inttypes.h>
#include <stdlib.h>
#include <stdio.h>
#include <string.h>

/* A private copy of the configuration, through the public setters so every
 * string is owned by the copy. */
static graft_status_t config_copy(const graft_config_t *src, graft_config_t **dst_p)
{
    graft_config_t *c = NULL;
    graft_status_t st = graft_config_create(&c);
    if (st != GRAFT_OK)
        return st;
    /* Numbers and the mode are plain values: copy the struct, then give the
     * copy its own strings (the defaults' strings are freed first). */
    graft_free(c->etcd_endpoints);
    graft_free(c->transfer_address);
    *c = *src;
    char **slots[] = {&c->job,       &c->etcd_endpoints, &c->etcd_user, &c->etcd_password,
                      &c->etcd_ca,   &c->etcd_cert,      &c->etcd_key,  &c->transfer_address,
                      &c->transfer_advertise, &c->job_secret_file, &c->persist_root,
                      &c->persist_second_root, &c->persist_remote,
                      &c->persist_remote_endpoint, &c->persist_remote_region, &c->spare_group};
    const char *vals[GRAFT_ARRAY_SIZE(slots)];
    for (size_t i = 0; i < GRAFT_ARRAY_SIZE(slots); i++) {
        vals[i] = *slots[i];
        *slots[i] = NULL;
    }
    for (size_t i = 0; i < GRAFT_ARRAY_SIZE(slots); i++) {
        if (vals[i] == NULL)
            continue;
        *slots[i] = graft__strdup(vals[i]);
        if (*slots[i] == NULL) {
            st = GRAFT_ENOMEM;
            goto fail;
        }
    }
    *dst_p = c;
    return GRAFT_OK;
fail:
    graft_config_destroy(c);
    return st;
}

/* The transfer endpoint parses the address forms itself (IPv4 or interface
 * name, optional ":port", an interface alias such as "eth0:1" as a name). */
static graft_status_t endpoint_open(graft_runtime_t *rt, graft_transfer_endpoint_t **ep_p)
{
    const char *addr = rt->cfg->transfer_address;
    const char *adv = rt->cfg->transfer_advertise;
    graft_transfer_config_t tc = {
        .listen_address = addr[0] != '\0' ? addr : "127.0.0.1",
        .advertise_address = adv != NULL && adv[0] != '\0' ? adv : NULL,
        .job_secret = rt->secret,
        .job_secret_len = rt->secret_len,
        .group = rt->group,
        .rank = rt->rank,
        .chunk_bytes = rt->cfg->transfer_chunk_bytes,
        .max_recipients = (uint32_t)rt->cfg->transfer_max_recipients,
    };
    graft_status_t st = graft_transfer_endpoint_create(&tc, ep_p);
    if (st == GRAFT_EINVAL)
        GRAFT_ERROR(GRAFT_MOD_RUNTIME, "config: transfer_address '%s'%s%s%s: not usable (an IPv4 "
                    "address or interface name, optionally with :port; the wildcard needs "
                    "transfer_advertise)", addr, tc.advertise_address ? ", transfer_advertise '" : "",
                    tc.advertise_address ? tc.advertise_address : "",
                    tc.advertise_address ? "'" : "");
    return st;
}

uint32_t graft_group(graft_runtime_t *rt)
{
    return rt != NULL ? rt->group : UINT32_MAX;
}

/* The transfer side of every region (after a new endpoint). */
static graft_status_t regions_register(graft_runtime_t *rt)
{
    for (size_t i = 0; i < rt->n_regions; i++) {
        const graft_region_t *r = &rt->regions[i].r;
        graft_transfer_region_t tr = {.name = r->name, .kind = r->kind, .dtype = r->dtype,
                                      .device = r->device, .ptr = r->ptr, .bytes = r->bytes};
        graft_status_t st = graft_transfer_region_register(rt->ep, &tr);
        if (st != GRAFT_OK)
            return st;
    }
    return GRAFT_OK;
}

graft_status_t graft_restart(graft_runtime_t *rt)
{
    if (rt == NULL)
        return GRAFT_EINVAL;
    if (!rt->joined)
        return GRAFT_ESTATE;
    uint64_t step = graft_step(rt);
    /* The open step is abandoned: its heal, its serve, its quorum. */
    if (rt->heal.running) {
        graft_transfer_pull_cancel(rt->ep);
        graft_status_t hst = graft_heal_wait(rt);
        (void)hst; /* a cancelled heal leaves state_valid false: pulled after the join */
    }
    graft__rt_nccl_serve_join(rt);
    if ((rt->serve.serving || rt->serve.follow) && graft_transfer_serve_end(rt->ep) != GRAFT_OK)
        GRAFT_WARN(GRAFT_MOD_RUNTIME, "restart: serve_end failed");
    rt->serve.serving = false;
    rt->serve.follow = false;
    graft_membership_quorum_free(rt->q);
    rt->q = NULL;
    graft__rt_steady_free(rt);
    /* Leave (the lease goes: the others form an epoch without this rank),
     * then new transports. Swapped under mu: graft_metrics_get() reads
     * them from any thread. */
    pthread_mutex_lock(&rt->mu);
    graft_membership_t *m = rt->m;
    graft__channel_t *ch = rt->channel;
    graft_transfer_endpoint_t *ep = rt->ep;
    rt->metrics.steady_rejected += graft__channel_rejected(ch);
    rt->m = NULL;
    rt->channel = NULL;
    rt->ep = NULL;
    rt->joined = false;
    pthread_mutex_unlock(&rt->mu);
    graft_membership_destroy(m);
    graft__channel_destroy(ch);
    graft_transfer_endpoint_destroy(ep);
    ep = NULL;
    ch = NULL;
    graft_status_t st = endpoint_open(rt, &ep);
    if (st == GRAFT_OK)
        st = graft__channel_create(ep, rt->secret, rt->secret_len, rt->group, rt->rank, &ch);
    pthread_mutex_lock(&rt->mu);
    rt->ep = ep;
    rt->channel = ch;
    pthread_mutex_unlock(&rt->mu);
    if (st == GRAFT_OK)
        st = regions_register(rt);
    if (st != GRAFT_OK) {
        GRAFT_ERROR(GRAFT_MOD_RUNTIME, "group %" PRIu32 " rank %" PRIu32 ": restart in place "
                    "failed: %s", rt->group, rt->rank, graft_status_string(st));
        return st;
    }
    rt->start_ns = graft__now_ns(); /* the recovery's phases are timed from here */
    rt->restarted = true;
    GRAFT_WARN(GRAFT_MOD_RUNTIME, "group %" PRIu32 " rank %" PRIu32 ": restarted in place at "
               "step %" PRIu64 " (%s)", rt->group, rt->rank, step,
               rt->state_valid ? "state kept" : "state to pull");
    char detail[64];
    snprintf(detail, sizeof(detail), "at step %" PRIu64 ", %s", step,
             rt->state_valid ? "state kept" : "state to pull");
    graft_runtime_event_t ev = {.kind = GRAFT_RUNTIME_EVENT_RESTARTED, .step = step,
                                .detail = detail};
    graft__rt_emit(rt, &ev);
    return GRAFT_OK;
}

graft_status_t graft_init(const graft_config_t *config, graft_runtime_t **rt_p)
{
    graft_runtime_t *rt = NULL;
    char *err = NULL;
    graft_status_t st;
    if (config == NULL || rt_p == NULL)
        return GRAFT_EINVAL;
    st = graft_config_validate(config, &err);
    if (st != GRAFT_OK) {
        GRAFT_ERROR(GRAFT_MOD_RUNTIME, "%s", err != NULL ? err : "invalid configuration");
        graft_free(err);
        return st;
    }
    rt = graft__calloc(1, sizeof(*rt));
    if (rt == NULL)
        return GRAFT_ENOMEM;
    rt->start_ns = graft__now_ns();
    pthread_mutex_init(&rt->mu, NULL);
    pthread_mutex_init(&rt->ev_mu, NULL);
    st = config_copy(config, &rt->cfg);
    if (st != GRAFT_OK)
        goto fail;
    /* A spare's group is the slot it is promoted into (graft__rt_spare_promote()). */
    rt->group = rt->cfg->spare ? UINT32_MAX : (uint32_t)rt->cfg->group;
    rt->rank = (uint32_t)rt->cfg->rank;
    rt->ranks = (uint32_t)rt->cfg->ranks_per_group;
    rt->groups = (uint32_t)rt->cfg->groups;
    rt->min_groups = (uint32_t)graft__config_min_groups(rt->cfg);
    rt->state_valid = true;
    st = graft_membership_job_prefix(rt->cfg->job, &rt->prefix);
    if (st != GRAFT_OK)
        goto fail;
    st = graft_etcd_endpoints_split(rt->cfg->etcd_endpoints, &rt->endpoints, &rt->n_endpoints);
    if (st != GRAFT_OK) {
        if (st == GRAFT_EINVAL)
            GRAFT_ERROR(GRAFT_MOD_RUNTIME, "config: etcd_endpoints: no endpoint in '%s'",
                        rt->cfg->etcd_endpoints);
        goto fail;
    }
    rt->etcd_cfg.endpoints = (const char *const *)rt->endpoints;
    rt->etcd_cfg.n_endpoints = rt->n_endpoints;
    rt->etcd_cfg.username = rt->cfg->etcd_user;
    rt->etcd_cfg.password = rt->cfg->etcd_password;
    rt->etcd_cfg.ca_file = rt->cfg->etcd_ca;
    rt->etcd_cfg.cert_file = rt->cfg->etcd_cert;
    rt->etcd_cfg.key_file = rt->cfg->etcd_key;
    rt->etcd_cfg.request_timeout_ms =
        (uint32_t)GRAFT_MAX(1000u, GRAFT_MIN(5000u, rt->cfg->lease_ttl_ms));
    st = graft_etcd_create(&rt->etcd_cfg, &rt->etcd);
    if (st != GRAFT_OK)
        goto fail;
    /* Every client of this process (membership's, the persistent tier's)
     * shares one view of etcd and one set of counters (docs/ETCD.md, "When
     * etcd is slow"); the periodic progress records are best effort. */
    rt->etcd_cfg.share_load = rt->etcd;
    graft_etcd_config_t quick = rt->etcd_cfg;
    quick.request_timeout_ms = GRAFT__RT_PROGRESS_TIMEOUT_MS;
    quick.max_retries = GRAFT_ETCD_NO_RETRIES;
    quick.priority = GRAFT_ETCD_PRIORITY_BEST_EFFORT;
    st = graft_etcd_create(&quick, &rt->etcd_quick);
    if (st != GRAFT_OK)
        goto fail;
    /* The endpoint keys its handshake with the job secret: it comes first
     * (from etcd unless the environment or a file gives it). */
    st = graft__rt_secret_load(rt);
    if (st != GRAFT_OK)
        goto fail;
    st = endpoint_open(rt, &rt->ep);
    if (st != GRAFT_OK)
        goto fail;
    if (!rt->cfg->spare) {
        st = graft__rt_group_open(rt);
        if (st != GRAFT_OK)
            goto fail;
    }
    st = graft__rt_skip_init(rt);
    if (st != GRAFT_OK)
        goto fail;
    *rt_p = rt;
    return GRAFT_OK;
fail:
    graft_destroy(rt);
    return st;
}

void graft_destroy(graft_runtime_t *rt)
{
    if (rt == NULL)
        return;
    if (rt->heal.running) {
        graft_transfer_pull_cancel(rt->ep);
        graft_status_t st = graft_heal_wait(rt);
        (void)st;
    }
    graft__rt_nccl_serve_join(rt); /* NCCL pairs end by their timeout at the latest */
    if ((rt->serve.serving || rt->serve.follow) && graft_transfer_serve_end(rt->ep) != GRAFT_OK)
        GRAFT_WARN(GRAFT_MOD_RUNTIME, "serve_end at destroy failed");
    graft_free(rt->serve.peers);
    graft__rt_persist_close(rt);
    if (rt->joined)
        graft__rt_publish_progress(rt, false); /* where this process got to */
    graft__rt_finished_await(rt);
    graft_membership_quorum_free(rt->q);
    graft__rt_steady_free(rt);
    graft_membership_destroy(rt->m);
    graft_membership_spare_destroy(rt->spare);
    graft__channel_destroy(rt->channel);
    graft_transfer_endpoint_destroy(rt->ep);
    graft_etcd_destroy(rt->etcd_quick);
    graft_etcd_destroy(rt->etcd);
    for (size_t i = 0; i < rt->n_regions; i++) {
        graft_free(rt->regions[i].name);
        graft_free(rt->regions[i].persist_name);
    }
    graft_free(rt->regions);
    graft__rt_skip_free(rt);
    graft_etcd_endpoints_free(rt->endpoints, rt->n_endpoints);
    graft_free(rt->prefix);
    explicit_bzero(rt->secret, sizeof(rt->secret));
    graft_config_destroy(rt->cfg);
    pthread_mutex_destroy(&rt->mu);
    pthread_mutex_destroy(&rt->ev_mu);
    graft_free(rt);
}

graft_status_t graft_region_register(graft_runtime_t *rt, const graft_region_t *region)
{
    graft__rt_region_t *grown;
    graft__rt_region_t *slot;
    graft_status_t st;
    if (rt == NULL || region == NULL || region->name == NULL || region->name[0] == '\0' ||
        strlen(region->name) > 200 || region->ptr == NULL || region->bytes == 0 ||
        region->kind < GRAFT_REGION_PARAM || region->kind > GRAFT_REGION_BLOB ||
        (region->device != GRAFT_DEVICE_HOST && region->device != GRAFT_DEVICE_CUDA)) {
        GRAFT_ERROR(GRAFT_MOD_RUNTIME, "region_register: invalid region '%s'",
                    region != NULL && region->name != NULL ? region->name : "(null)");
        return GRAFT_EINVAL;
    }
    if (region->global_bytes != 0 && (region->global_offset > region->global_bytes ||
                                      region->bytes > region->global_bytes - region->global_offset)) {
        GRAFT_ERROR(GRAFT_MOD_RUNTIME, "region_register: '%s': [%" PRIu64 ", +%" PRIu64
                    ") lies outside global_bytes %" PRIu64, region->name, region->global_offset,
                    region->bytes, region->global_bytes);
        return GRAFT_EINVAL;
    }
    if (rt->joined)
        return GRAFT_ESTATE;
    for (size_t i = 0; i < rt->n_regions; i++)
        if (strcmp(rt->regions[i].name, region->name) == 0)
            return GRAFT_EEXIST;
    graft_transfer_region_t tr = {
        .name = region->name,
        .kind = region->kind,
        .dtype = region->dtype,
        .device = region->device,
        .ptr = region->ptr,
        .bytes = region->bytes,
    };
    grown = graft__realloc(rt->regions, (rt->n_regions + 1) * sizeof(*grown));
    if (grown == NULL)
        return GRAFT_ENOMEM;
    rt->regions = grown;
    slot = &rt->regions[rt->n_regions];
    memset(slot, 0, sizeof(*slot));
    slot->name = graft__strdup(region->name);
    slot->persist_name = region->global_bytes != 0
                             ? graft__strdup(region->name)
                             : graft__asprintf("r%" PRIu32 "/%s", rt->rank, region->name);
    if (slot->name == NULL || slot->persist_name == NULL) {
        st = GRAFT_ENOMEM;
        goto fail;
    }
    st = graft_transfer_region_register(rt->ep, &tr);
    if (st != GRAFT_OK)
        goto fail;
    slot->r = *region;
    slot->r.name = slot->name;
    rt->n_regions++;
    return GRAFT_OK;
fail:
    graft_free(slot->name);
    graft_free(slot->persist_name);
    return st;
}

void graft_metrics_get(graft_runtime_t *rt, graft_metrics_t *metrics_p)
{
    /* Under mu: graft_restart() replaces the endpoint, the channel and the
     * membership handle (steady_rejected carries the replaced channels'). */
    pthread_mutex_lock(&rt->mu);
    *metrics_p = rt->metrics;
    metrics_p->steady_rejected += graft__channel_rejected(rt->channel);
    metrics_p->serve_peak_recipients = graft_transfer_serve_peak(rt->ep);
    if (rt->m != NULL) {
        graft_membership_stats_t ms;
        graft_membership_stats_get(rt->m, &ms);
        metrics_p->etcd_requests = ms.requests;
    }
    pthread_mutex_unlock(&rt->mu);
    graft__rt_persist_metrics(rt, metrics_p);
}
