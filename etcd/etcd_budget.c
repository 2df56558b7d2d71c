/*
 * The etcd client's retry budget (docs/ETCD.md, "When etcd is slow"):
 * whether etcd is slow, shared by the clients of one load; each client's
 * bucket, its share while it is; best-effort requests shed; the counters.
 * The request path (etcd_client.c) asks before each attempt and reports
 * after it.
 */
#include "etcd_internal.h"

#include <inttypes.h>

/* A client's share while etcd is slow: requests a second, and at once
 * (graft_etcd_priority_t). Best-effort clients have none. */
static void bucket_init(graft__etcd_bucket_t *b, graft_etcd_priority_t priority)
{
    b->rate_per_s = priority == GRAFT_ETCD_PRIORITY_ESSENTIAL ? 4.0 : 1.0;
    b->burst = priority == GRAFT_ETCD_PRIORITY_ESSENTIAL ? 4.0 : 2.0;
    if (priority == GRAFT_ETCD_PRIORITY_BEST_EFFORT)
        b->rate_per_s = b->burst = 0.0;
    b->tokens = b->burst;
    b->last_ns = 0;
}

void graft__etcd_load_release(graft__etcd_load_t *l)
{
    if (l != NULL && atomic_fetch_sub(&l->refs, 1) == 1)
        graft_free(l);
}

graft_status_t graft__etcd_load_attach(graft_etcd_t *etcd, const graft_etcd_config_t *config)
{
    etcd->priority = config->priority;
    if (config->share_load != NULL) {
        etcd->load = config->share_load->load;
        atomic_fetch_add(&etcd->load->refs, 1);
    } else {
        etcd->load = graft__calloc(1, sizeof(*etcd->load));
        if (etcd->load == NULL)
            return GRAFT_ENOMEM;
        atomic_init(&etcd->load->refs, 1);
    }
    bucket_init(&etcd->bucket, etcd->priority);
    return GRAFT_OK;
}

/* Nanoseconds until the bucket holds a token, having taken it when 0. */
static uint64_t bucket_take(graft__etcd_bucket_t *b, uint64_t now)
{
    if (b->last_ns != 0)
        b->tokens = GRAFT_MIN(b->burst, b->tokens + (double)(now - b->last_ns) * 1e-9 *
                                                        b->rate_per_s);
    b->last_ns = now;
    if (b->tokens >= 1.0) {
        b->tokens -= 1.0;
        return 0;
    }
    return (uint64_t)((1.0 - b->tokens) / b->rate_per_s * 1e9) + 1;
}

/* While etcd is slow a request waits for its client's token (pacing, not
 * failing: a paced call still gets its answer), or is shed when its client
 * is best-effort: an event record or a progress record is not worth
 * adding to the load of an etcd that does not keep up. */
bool graft__etcd_load_admit(graft_etcd_t *etcd, bool retry)
{
    graft__etcd_load_t *l = etcd->load;
    for (;;) {
        if (atomic_load(&l->slow_since_ns) == 0)
            break;
        if (etcd->priority == GRAFT_ETCD_PRIORITY_BEST_EFFORT) {
            atomic_fetch_add(&l->shed, 1);
            return false;
        }
        pthread_mutex_lock(&etcd->lock);
        uint64_t wait = bucket_take(&etcd->bucket, graft__now_ns());
        pthread_mutex_unlock(&etcd->lock);
        if (wait == 0)
            break;
        /* A little more than the wait, so that threads of one client
         * queued on the same bucket do not wake together. */
        graft__sleep_ns(wait + graft__jitter_ns(wait / 4));
    }
    atomic_fetch_add(&l->requests, 1);
    if (retry)
        atomic_fetch_add(&l->retries, 1);
    return true;
}

void graft__etcd_load_done(graft_etcd_t *etcd, bool answered, uint64_t took_ns)
{
    graft__etcd_load_t *l = etcd->load;
    uint64_t slow_ns = (uint64_t)etcd->request_timeout_ms * 1000000ull / 2;
    if (answered && took_ns <= slow_ns) {
        uint64_t since = atomic_exchange(&l->slow_since_ns, 0);
        if (since != 0)
            GRAFT_INFO(GRAFT_MOD_ETCD, "etcd answers in time again after %" PRIu64 " ms",
                       (uint64_t)((graft__now_ns() - since) / 1000000ull));
        return;
    }
    if (!answered)
        atomic_fetch_add(&l->failures, 1);
    /* A best-effort client's short timeout (a progress record's) says
     * nothing about the others' requests: it only obeys the state. */
    if (etcd->priority == GRAFT_ETCD_PRIORITY_BEST_EFFORT)
        return;
    uint_fast64_t zero = 0;
    if (atomic_compare_exchange_strong(&l->slow_since_ns, &zero, graft__now_ns())) {
        atomic_fetch_add(&l->slow_periods, 1);
        GRAFT_WARN(GRAFT_MOD_ETCD, "etcd is slow (%s after %" PRIu64 " ms): best-effort "
                   "requests are shed and the others paced until it answers in time",
                   answered ? "an answer" : "no answer", (uint64_t)(took_ns / 1000000ull));
    }
}

void graft_etcd_stats_get(graft_etcd_t *etcd, graft_etcd_stats_t *stats_p)
{
    graft_etcd_stats_t s = {0};
    if (etcd != NULL) {
        graft__etcd_load_t *l = etcd->load;
        s.requests = atomic_load(&l->requests);
        s.retries = atomic_load(&l->retries);
        s.shed = atomic_load(&l->shed);
        s.failures = atomic_load(&l->failures);
        s.slow_periods = atomic_load(&l->slow_periods);
        s.slow = atomic_load(&l->slow_since_ns) != 0;
    }
    *stats_p = s;
}

