/*
 * Ranged, parallel downloads (restore from the remote tier): an object is
 * fetched as ranges of part_bytes, `parallel` of them in flight on threads
 * of their own, each written at its offset and retried alone.
 */
#include "persist_s3.h"

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

typedef struct ranged {
    graft__s3_t *s3;
    const char *key;
    int fd;
    uint64_t bytes;
    uint64_t nranges;
    atomic_uint_least64_t next;
    pthread_mutex_t mu;
    graft_status_t st;
    char why[512];
} ranged_t;

/* One range, retried on what graft__s3_outcome() calls worth another try
 * and on a short answer. */
static graft_status_t get_range(ranged_t *g, uint64_t off, uint64_t len, char *why,
                                size_t why_len)
{
    graft__s3_t *s3 = g->s3;
    graft__s3_resp_t r = {.fd = g->fd, .at_offset = true, .offset = off, .limit = len};
    char what[400], range[64];
    snprintf(what, sizeof(what), "GET %s%s (bytes %" PRIu64 "-%" PRIu64 ")", s3->prefix, g->key,
             off, off + len - 1);
    snprintf(range, sizeof(range), "%" PRIu64 "-%" PRIu64, off, off + len - 1);
    graft_status_t st = GRAFT_EIO;
    for (uint32_t attempt = 0;; attempt++) {
        if (attempt > 0 && !graft__s3_backoff(s3, attempt, r.retry_after_s)) {
            st = GRAFT_ECANCELED;
            break;
        }
        graft__s3_resp_reset(&r);
        struct curl_slist *h = NULL;
        CURL *e = graft__s3_easy(s3, "GET", g->key, NULL, NULL, 0, NULL, &r, &h);
        if (e == NULL) {
            snprintf(why, why_len, "%s: out of memory", what);
            st = GRAFT_ENOMEM;
            break;
        }
        curl_easy_setopt(e, CURLOPT_RANGE, range);
        CURLcode cc = curl_easy_perform(e);
        curl_easy_cleanup(e);
        curl_slist_free_all(h);
        bool retry = false;
        st = graft__s3_outcome(s3, (int)cc, &r, what, &retry, why, why_len);
        /* A 200 is the whole object: fine when that is the range asked
         * (a store may answer so), else the store ignored the range. */
        bool whole = r.http == 200 && off == 0 && len == g->bytes;
        if (st == GRAFT_OK && ((r.http != 206 && !whole) || r.written != len)) {
            snprintf(why, why_len, "%s: HTTP %ld with %" PRIu64 " bytes, %" PRIu64 " asked",
                     what, r.http, r.written, len);
            st = GRAFT_ETRUNCATED;
        }
        if (st == GRAFT_OK || !retry || attempt >= s3->max_retries)
            break;
    }
    graft_free(r.body);
    return st;
}

static void *ranged_main(void *arg)
{
    ranged_t *g = arg;
    uint64_t part = g->s3->part_bytes;
    for (;;) {
        pthread_mutex_lock(&g->mu);
        bool failed = g->st != GRAFT_OK;
        pthread_mutex_unlock(&g->mu);
        uint64_t i = atomic_fetch_add(&g->next, 1);
        if (failed || i >= g->nranges)
            break;
        char why[512] = "";
        uint64_t off = i * part;
        graft_status_t st = get_range(g, off, GRAFT_MIN(part, g->bytes - off), why, sizeof(why));
        if (st != GRAFT_OK) {
            pthread_mutex_lock(&g->mu);
            if (g->st == GRAFT_OK) {
                g->st = st;
                snprintf(g->why, sizeof(g->why), "%s", why);
            }
            pthread_mutex_unlock(&g->mu);
        }
    }
    return NULL;
}

graft_status_t graft__s3_size_check(graft__s3_t *s3, const char *key, uint64_t bytes, char *why,
                                    size_t why_len)
{
    uint64_t have = 0;
    graft_status_t st = graft__s3_head(s3, key, &have, why, why_len);
    if (st == GRAFT_ENOTFOUND)
        snprintf(why, why_len, "s3://%s/%s%s: missing from the store", s3->bucket, s3->prefix,
                 key);
    if (st == GRAFT_OK && have != bytes) {
        snprintf(why, why_len, "s3://%s/%s%s: %" PRIu64 " bytes, the manifest says %" PRIu64,
                 s3->bucket, s3->prefix, key, have, bytes);
        st = GRAFT_ETRUNCATED;
    }
    return st;
}

graft_status_t graft__s3_get_ranged(graft__s3_t *s3, const char *key, int fd, uint64_t bytes,
                                    char *why, size_t why_len)
{
    /* A ranged GET of a longer object would succeed. */
    graft_status_t st = graft__s3_size_check(s3, key, bytes, why, why_len);
    if (st != GRAFT_OK)
        return st;
    if (ftruncate(fd, (off_t)bytes) != 0) {
        snprintf(why, why_len, "%s%s: sizing the download: %s", s3->prefix, key, strerror(errno));
        return GRAFT_EIO;
    }
    if (bytes == 0)
        return GRAFT_OK;
    ranged_t g = {.s3 = s3, .key = key, .fd = fd, .bytes = bytes, .st = GRAFT_OK};
    g.nranges = (bytes + s3->part_bytes - 1) / s3->part_bytes;
    atomic_init(&g.next, 0);
    pthread_mutex_init(&g.mu, NULL);
    uint32_t nthreads = (uint32_t)GRAFT_MIN((uint64_t)s3->parallel, g.nranges);
    pthread_t threads[64];
    nthreads = GRAFT_MIN(nthreads, 64u);
    uint32_t started = 0;
    for (; started < nthreads; started++)
        if (pthread_create(&threads[started], NULL, ranged_main, &g) != 0)
            break;
    if (started == 0)
        ranged_main(&g); /* no thread to spare: one range after another */
    for (uint32_t i = 0; i < started; i++)
        pthread_join(threads[i], NULL);
    pthread_mutex_destroy(&g.mu);
    if (g.st != GRAFT_OK)
        snprintf(why, why_len, "%s", g.why);
    return g.st;
}
