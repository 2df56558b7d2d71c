/*
 * etcd v3 client over the JSON gateway: the handle and its endpoints, and
 * the request path (a pool of curl easy handles, each keeping its
 * connection alive; endpoint failover; retries with backoff;
 * authentication). The calls built on it are etcd_kv.c; watches are
 * etcd_watch.c; endpoint lists and their checks are etcd_endpoints.c.
 */
#include "etcd_internal.h"

#include <stdlib.h>
#include <string.h>

static pthread_once_t curl_once = PTHREAD_ONCE_INIT;
static CURLcode curl_init_rc = CURLE_OK;

static void curl_init_once(void)
{
    curl_init_rc = curl_global_init(CURL_GLOBAL_DEFAULT);
}

graft_status_t graft__etcd_curl_init(void)
{
    pthread_once(&curl_once, curl_init_once);
    if (curl_init_rc != CURLE_OK) {
        GRAFT_ERROR(GRAFT_MOD_ETCD, "curl_global_init: %s", curl_easy_strerror(curl_init_rc));
        return GRAFT_ESYS;
    }
    return GRAFT_OK;
}

/* ------------------------------------------------------------------------ */
/* Passwords in clear (the endpoint checks: etcd_endpoints.c)               */
/* ------------------------------------------------------------------------ */

/* A password sent over plain http crosses the network in clear (etcd's
 * JSON gateway takes it in the body of /v3/auth/authenticate): said once
 * per process, whatever the number of clients. */
static void password_in_clear_warn(const graft_etcd_config_t *config)
{
    static atomic_flag warned = ATOMIC_FLAG_INIT;
    if (config->password == NULL)
        return;
    for (size_t i = 0; i < config->n_endpoints; i++) {
        const char *e = config->endpoints[i];
        if (strncmp(e, "http://", 7) != 0 || graft_etcd_endpoint_is_loopback(e))
            continue;
        if (!atomic_flag_test_and_set(&warned))
            GRAFT_WARN(GRAFT_MOD_ETCD, "etcd password for user '%s' goes over plain http to %s: "
                       "anyone on the path reads it; use https:// endpoints (etcd "
                       "--cert-file/--key-file) or client certificates", config->username, e);
        return;
    }
}

/* ------------------------------------------------------------------------ */
/* Life cycle                                                               */
/* ------------------------------------------------------------------------ */

static char *dup_opt(const char *s, bool *failed)
{
    if (s == NULL)
        return NULL;
    char *d = graft__strdup(s);
    if (d == NULL)
        *failed = true;
    return d;
}

graft_status_t graft_etcd_create(const graft_etcd_config_t *config, graft_etcd_t **etcd_p)
{
    graft_status_t st = GRAFT_EINVAL;
    graft_etcd_t *etcd = NULL;
    bool failed = false;

    if (config == NULL || etcd_p == NULL || config->n_endpoints == 0 ||
        config->endpoints == NULL) {
        GRAFT_ERROR(GRAFT_MOD_ETCD, "etcd client needs at least one endpoint");
        goto out;
    }
    for (size_t i = 0; i < config->n_endpoints; i++) {
        const char *e = config->endpoints[i];
        if (e == NULL || (strncmp(e, "http://", 7) != 0 && strncmp(e, "https://", 8) != 0)) {
            GRAFT_ERROR(GRAFT_MOD_ETCD, "etcd endpoint '%s' is not an http(s) URL",
                        e ? e : "(null)");
            goto out;
        }
    }
    if ((config->username == NULL) != (config->password == NULL)) {
        GRAFT_ERROR(GRAFT_MOD_ETCD, "etcd username and password go together");
        goto out;
    }
    st = graft__etcd_curl_init();
    if (st != GRAFT_OK)
        goto out;
    password_in_clear_warn(config);

    st = GRAFT_ENOMEM;
    etcd = graft__calloc(1, sizeof(*etcd));
    if (etcd == NULL)
        goto out;
    etcd->endpoints = graft__calloc(config->n_endpoints, sizeof(char *));
    if (etcd->endpoints == NULL)
        goto err_etcd;
    for (size_t i = 0; i < config->n_endpoints; i++) {
        /* Drop a trailing slash so paths can be appended as they are. */
        size_t n = strlen(config->endpoints[i]);
        while (n > 0 && config->endpoints[i][n - 1] == '/')
            n--;
        etcd->endpoints[i] = graft__strndup(config->endpoints[i], n);
        if (etcd->endpoints[i] == NULL)
            goto err_etcd;
        etcd->n_endpoints++;
    }
    etcd->request_timeout_ms = config->request_timeout_ms ? config->request_timeout_ms : 5000;
    etcd->connect_timeout_ms = config->connect_timeout_ms ? config->connect_timeout_ms : 1000;
    if (config->max_retries == GRAFT_ETCD_NO_RETRIES)
        etcd->max_retries = 0;
    else
        etcd->max_retries = config->max_retries ? config->max_retries : 3;
    etcd->retry_backoff_ms = config->retry_backoff_ms ? config->retry_backoff_ms : 50;
    if (config->max_retries == GRAFT_ETCD_NO_RETRIES)
        etcd->election_wait_ms = 0;
    else
        etcd->election_wait_ms = config->election_wait_ms ? config->election_wait_ms : 5000;
    if (config->watch_idle_ms == GRAFT_ETCD_WATCH_NO_IDLE)
        etcd->watch_idle_ms = 0;
    else
        etcd->watch_idle_ms = config->watch_idle_ms ? config->watch_idle_ms : 10000;
    if (graft__etcd_load_attach(etcd, config) != GRAFT_OK)
        goto err_etcd;
    etcd->username = dup_opt(config->username, &failed);
    etcd->password = dup_opt(config->password, &failed);
    etcd->ca_file = dup_opt(config->ca_file, &failed);
    etcd->cert_file = dup_opt(config->cert_file, &failed);
    etcd->key_file = dup_opt(config->key_file, &failed);
    if (failed)
        goto err_etcd;
    if (pthread_mutex_init(&etcd->lock, NULL) != 0) {
        st = GRAFT_ESYS;
        goto err_etcd;
    }
    if (pthread_mutex_init(&etcd->auth_lock, NULL) != 0) {
        st = GRAFT_ESYS;
        goto err_lock;
    }
    *etcd_p = etcd;
    return GRAFT_OK;

err_lock:
    pthread_mutex_destroy(&etcd->lock);
err_etcd:
    graft__etcd_load_release(etcd->load);
    for (size_t i = 0; i < etcd->n_endpoints; i++)
        graft_free(etcd->endpoints[i]);
    graft_free(etcd->endpoints);
    graft_free(etcd->username);
    graft_free(etcd->password);
    graft_free(etcd->ca_file);
    graft_free(etcd->cert_file);
    graft_free(etcd->key_file);
    graft_free(etcd);
out:
    return st;
}

uint64_t graft_etcd_bytes_read(graft_etcd_t *etcd)
{
    return etcd != NULL ? atomic_load(&etcd->bytes_read) : 0;
}

void graft_etcd_destroy(graft_etcd_t *etcd)
{
    if (etcd == NULL)
        return;
    for (size_t i = 0; i < etcd->n_pool; i++)
        curl_easy_cleanup(etcd->pool[i]);
    graft_free(etcd->pool);
    for (size_t i = 0; i < etcd->n_endpoints; i++)
        graft_free(etcd->endpoints[i]);
    graft_free(etcd->endpoints);
    graft_free(etcd->username);
    if (etcd->password != NULL) {
        /* Do not leave the password in freed memory. */
        volatile char *p = etcd->password;
        while (*p)
            *p++ = 0;
    }
    graft_free(etcd->password);
    graft_free(etcd->ca_file);
    graft_free(etcd->cert_file);
    graft_free(etcd->key_file);
    if (etcd->token != NULL)
        graft_free(etcd->token);
    pthread_mutex_destroy(&etcd->auth_lock);
    pthread_mutex_destroy(&etcd->lock);
    graft__etcd_load_release(etcd->load);
    graft_free(etcd);
}

const char *graft_etcd_current_endpoint(graft_etcd_t *etcd)
{
    if (etcd == NULL)
        return "";
    pthread_mutex_lock(&etcd->lock);
    const char *e = etcd->endpoints[etcd->current];
    pthread_mutex_unlock(&etcd->lock);
    return e;
}

size_t graft__etcd_endpoint_first(graft_etcd_t *etcd)
{
    pthread_mutex_lock(&etcd->lock);
    size_t i = etcd->current;
    pthread_mutex_unlock(&etcd->lock);
    return i;
}

void graft__etcd_endpoint_answered(graft_etcd_t *etcd, size_t index)
{
    pthread_mutex_lock(&etcd->lock);
    if (etcd->current != index)
        GRAFT_INFO(GRAFT_MOD_ETCD, "etcd: now using %s", etcd->endpoints[index]);
    etcd->current = index;
    pthread_mutex_unlock(&etcd->lock);
}

/* ------------------------------------------------------------------------ */
/* HTTP                                                                     */
/* ------------------------------------------------------------------------ */

/* Pause between rounds while waiting out an election: short, since a new
 * leader is usually there one election timeout (1 s by default) after the
 * old one went silent. */
#define ELECTION_BACKOFF_MAX_MS 100u

static CURL *handle_get(graft_etcd_t *etcd)
{
    CURL *h = NULL;
    pthread_mutex_lock(&etcd->lock);
    if (etcd->n_pool > 0)
        h = etcd->pool[--etcd->n_pool];
    pthread_mutex_unlock(&etcd->lock);
    if (h == NULL)
        h = curl_easy_init();
    return h;
}

static void handle_put(graft_etcd_t *etcd, CURL *h)
{
    bool kept = false;
    pthread_mutex_lock(&etcd->lock);
    if (etcd->n_pool == etcd->cap_pool) {
        size_t cap = etcd->cap_pool ? etcd->cap_pool * 2 : 8;
        CURL **p = graft__realloc(etcd->pool, cap * sizeof(*p));
        if (p != NULL) {
            etcd->pool = p;
            etcd->cap_pool = cap;
        }
    }
    if (etcd->n_pool < etcd->cap_pool) {
        etcd->pool[etcd->n_pool++] = h;
        kept = true;
    }
    pthread_mutex_unlock(&etcd->lock);
    if (!kept)
        curl_easy_cleanup(h);
}

void graft__etcd_curl_setup(graft_etcd_t *etcd, CURL *h, const char *url, uint32_t timeout_ms)
{
    curl_easy_setopt(h, CURLOPT_URL, url);
    curl_easy_setopt(h, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(h, CURLOPT_TCP_NODELAY, 1L);
    curl_easy_setopt(h, CURLOPT_TCP_KEEPALIVE, 1L);
    curl_easy_setopt(h, CURLOPT_CONNECTTIMEOUT_MS, (long)etcd->connect_timeout_ms);
    curl_easy_setopt(h, CURLOPT_TIMEOUT_MS, (long)timeout_ms);
    /* Only the endpoints the caller named; never follow elsewhere. */
    curl_easy_setopt(h, CURLOPT_FOLLOWLOCATION, 0L);
    curl_easy_setopt(h, CURLOPT_PROTOCOLS_STR, "http,https");
    if (etcd->ca_file != NULL)
        curl_easy_setopt(h, CURLOPT_CAINFO, etcd->ca_file);
    if (etcd->cert_file != NULL)
        curl_easy_setopt(h, CURLOPT_SSLCERT, etcd->cert_file);
    if (etcd->key_file != NULL)
        curl_easy_setopt(h, CURLOPT_SSLKEY, etcd->key_file);
}

bool graft__etcd_curl_retryable(CURLcode rc)
{
    switch (rc) {
    case CURLE_COULDNT_CONNECT:
    case CURLE_COULDNT_RESOLVE_HOST:
    case CURLE_COULDNT_RESOLVE_PROXY:
    case CURLE_SEND_ERROR:
    case CURLE_GOT_NOTHING:
    case CURLE_RECV_ERROR:
        return true;
    default:
        return false;
    }
}

graft_status_t graft__etcd_curl_status(CURLcode rc)
{
    switch (rc) {
    case CURLE_OK:
        return GRAFT_OK;
    case CURLE_OPERATION_TIMEDOUT:
        return GRAFT_EETCD_TIMEOUT;
    case CURLE_OUT_OF_MEMORY:
        return GRAFT_ENOMEM;
    case CURLE_WRITE_ERROR:
    case CURLE_PARTIAL_FILE:
    case CURLE_WEIRD_SERVER_REPLY:
    case CURLE_UNSUPPORTED_PROTOCOL:
    case CURLE_BAD_CONTENT_ENCODING:
    case CURLE_HTTP2:
        return GRAFT_EMALFORMED;
    case CURLE_SSL_CONNECT_ERROR:
    case CURLE_PEER_FAILED_VERIFICATION:
    case CURLE_SSL_CERTPROBLEM:
    case CURLE_SSL_CACERT_BADFILE:
        return GRAFT_EAUTH;
    default:
        return graft__etcd_curl_retryable(rc) ? GRAFT_EUNREACHABLE : GRAFT_EUNREACHABLE;
    }
}

typedef struct resp_sink {
    graft_buf_t body;
    bool too_big;
    bool no_mem;
} resp_sink_t;

static size_t sink_write(char *ptr, size_t size, size_t nmemb, void *arg)
{
    resp_sink_t *s = arg;
    size_t n = size * nmemb;
    if (s->body.len + n > GRAFT_ETCD_MAX_RESPONSE) {
        s->too_big = true;
        return 0;
    }
    if (graft__buf_append(&s->body, ptr, n) != GRAFT_OK) {
        s->no_mem = true;
        return 0;
    }
    return n;
}

/* Requests that may be sent twice with the same outcome: reads, renewals,
 * and a put, whose repetition stores the same value again (at a new
 * revision). Not a transaction (its compares may fail the second time), a
 * lease grant (a second lease) or a delete (it reports what it deleted). */
static bool path_idempotent(const char *path)
{
    static const char *const paths[] = {"/v3/kv/range", "/v3/kv/put", "/v3/lease/keepalive",
                                        "/v3/lease/timetolive", "/v3/maintenance/status",
                                        "/v3/auth/authenticate"};
    for (size_t i = 0; i < GRAFT_ARRAY_SIZE(paths); i++)
        if (strcmp(path, paths[i]) == 0)
            return true;
    return false;
}

/* One request of http_post() as it goes from endpoint to endpoint. */
typedef struct post_call {
    graft_etcd_t *etcd;
    CURL *h;
    const char *path;
    const char *body;
    size_t body_len;
    struct curl_slist *headers;
    bool idempotent; /* path_idempotent(path) */
    resp_sink_t *sink;
    long *http_code_p;
    char *url;              /* the endpoint tried last */
    bool leaderless;        /* a member said, in this attempt, it has no leader */
    graft_status_t st;      /* the outcome so far */
} post_call_t;

/* The request's headers, or NULL (out of memory). An empty Expect: stops
 * curl from waiting for "100 Continue" on large bodies, which the gateway
 * never sends. */
static struct curl_slist *post_headers(const char *auth_header)
{
    struct curl_slist *headers = curl_slist_append(NULL, "Content-Type: application/json");
    struct curl_slist *h2 = headers != NULL ? curl_slist_append(headers, "Expect:") : NULL;
    if (h2 != NULL && auth_header != NULL)
        h2 = curl_slist_append(headers, auth_header);
    if (h2 == NULL) {
        curl_slist_free_all(headers);
        return NULL;
    }
    return headers;
}

/* After a transfer that failed with rc (no HTTP answer): true when the
 * next endpoint may be tried, false when c->st is final. */
static bool post_failed_may_go_on(post_call_t *c, CURLcode rc, size_t k)
{
    if (c->sink->no_mem) {
        c->st = GRAFT_ENOMEM;
        return false;
    }
    if (c->sink->too_big) {
        GRAFT_ERROR(GRAFT_MOD_ETCD, "etcd %s: answer over %u bytes", c->url,
                    GRAFT_ETCD_MAX_RESPONSE);
        c->st = GRAFT_EMALFORMED;
        return false;
    }
    /* A connect that timed out (a black-holed endpoint) is a
     * reason to try the next endpoint, not a request timeout. */
    curl_off_t connected_us = 0;
    bool connect_timeout =
        rc == CURLE_OPERATION_TIMEDOUT &&
        curl_easy_getinfo(c->h, CURLINFO_CONNECT_TIME_T, &connected_us) == CURLE_OK &&
        connected_us == 0;
    /* A request that waits on a follower whose leader just died
     * waits in vain: etcd drops what it forwarded and answers only
     * at its own timeout. One whose repetition changes nothing can
     * go to the next member instead. */
    bool repeatable_timeout = rc == CURLE_OPERATION_TIMEDOUT && c->idempotent &&
                              k + 1 < c->etcd->n_endpoints;
    if (!graft__etcd_curl_retryable(rc) && !connect_timeout && !repeatable_timeout) {
        c->st = graft__etcd_curl_status(rc);
        GRAFT_WARN(GRAFT_MOD_ETCD, "etcd %s: %s", c->url, curl_easy_strerror(rc));
        return false;
    }
    GRAFT_DEBUG(GRAFT_MOD_ETCD, "etcd %s: %s", c->url, curl_easy_strerror(rc));
    c->st = GRAFT_EUNREACHABLE;
    return true;
}

/* The request to endpoint idx, the k-th tried in this attempt. True when
 * c->st is final (GRAFT_OK: an HTTP answer, in *c->http_code_p and
 * c->sink->body), false when the next endpoint is to be tried. */
static bool post_one(post_call_t *c, size_t idx, size_t k, uint32_t attempt)
{
    graft_etcd_t *etcd = c->etcd;
    resp_sink_t *sink = c->sink;
    graft_free(c->url);
    c->url = graft__asprintf("%s%s", etcd->endpoints[idx], c->path);
    if (c->url == NULL) {
        c->st = GRAFT_ENOMEM;
        return true;
    }
    graft__buf_reset(&sink->body);
    sink->too_big = sink->no_mem = false;
    curl_easy_reset(c->h);
    graft__etcd_curl_setup(etcd, c->h, c->url, etcd->request_timeout_ms);
    curl_easy_setopt(c->h, CURLOPT_POST, 1L);
    curl_easy_setopt(c->h, CURLOPT_POSTFIELDS, c->body);
    curl_easy_setopt(c->h, CURLOPT_POSTFIELDSIZE_LARGE, (curl_off_t)c->body_len);
    curl_easy_setopt(c->h, CURLOPT_HTTPHEADER, c->headers);
    curl_easy_setopt(c->h, CURLOPT_WRITEFUNCTION, sink_write);
    curl_easy_setopt(c->h, CURLOPT_WRITEDATA, sink);
    if (!graft__etcd_load_admit(etcd, attempt > 0 || k > 0)) {
        GRAFT_DEBUG(GRAFT_MOD_ETCD, "etcd %s: shed (etcd is slow)", c->path);
        c->st = GRAFT_EUNREACHABLE;
        return true;
    }
    uint64_t t0 = graft__now_ns();
    CURLcode rc = curl_easy_perform(c->h);
    long code = 0;
    curl_easy_getinfo(c->h, CURLINFO_RESPONSE_CODE, &code);
    /* A member without a leader answers 503, or 500 for a write it
     * cannot propose: another member may have one already. */
    bool no_leader = rc == CURLE_OK && code >= 500 &&
                     graft__etcd_error_is_leaderless(sink->body.data ? sink->body.data : "",
                                                     sink->body.len);
    graft__etcd_load_done(etcd, rc == CURLE_OK && code != 503 && !no_leader,
                          graft__now_ns() - t0);
    if (rc == CURLE_OK && (code == 503 || no_leader)) {
        GRAFT_DEBUG(GRAFT_MOD_ETCD, "etcd %s: %ld%s", c->url, code,
                    no_leader ? " (no leader)" : "");
        c->leaderless |= no_leader;
        c->st = GRAFT_EUNREACHABLE;
        return false;
    }
    if (rc == CURLE_OK) {
        graft__etcd_endpoint_answered(etcd, idx);
        atomic_fetch_add(&etcd->bytes_read, sink->body.len);
        *c->http_code_p = code;
        c->st = GRAFT_OK;
        return true;
    }
    return !post_failed_may_go_on(c, rc, k);
}

/* One POST with failover across endpoints and retries with backoff. On
 * GRAFT_OK an HTTP answer arrived: *http_code_p and sink->body hold it. */
static graft_status_t http_post(graft_etcd_t *etcd, const char *path, const char *body,
                                size_t body_len, const char *auth_header, long *http_code_p,
                                resp_sink_t *sink)
{
    post_call_t c = {.etcd = etcd, .path = path, .body = body, .body_len = body_len,
                     .idempotent = path_idempotent(path), .sink = sink,
                     .http_code_p = http_code_p, .st = GRAFT_EUNREACHABLE};

    c.h = handle_get(etcd);
    if (c.h == NULL)
        return GRAFT_ENOMEM;
    c.headers = post_headers(auth_header);
    if (c.headers == NULL) {
        c.st = GRAFT_ENOMEM;
        goto cleanup;
    }

    uint32_t backoff = etcd->retry_backoff_ms;
    size_t first = graft__etcd_endpoint_first(etcd);
    uint64_t election_end = graft__now_ns() + (uint64_t)etcd->election_wait_ms * 1000000ull;
    for (uint32_t attempt = 0;; attempt++) {
        /* Past the retries, go on only while a member says an election is
         * on: it ends by itself, within a few election timeouts. */
        if (attempt > etcd->max_retries && !(c.leaderless && graft__now_ns() < election_end))
            break;
        if (attempt > 0) {
            GRAFT_DEBUG(GRAFT_MOD_ETCD, "etcd %s: retry %u after %u ms%s", path, attempt, backoff,
                        c.leaderless ? " (no leader)" : "");
            graft__sleep_ns(graft__jitter_ns((uint64_t)backoff * 1000000ull));
            backoff = backoff > UINT32_MAX / 2 ? backoff : backoff * 2;
            if (c.leaderless && backoff > ELECTION_BACKOFF_MAX_MS)
                backoff = ELECTION_BACKOFF_MAX_MS;
        }
        c.leaderless = false;
        for (size_t k = 0; k < etcd->n_endpoints; k++)
            if (post_one(&c, (first + k) % etcd->n_endpoints, k, attempt))
                goto cleanup;
    }
    GRAFT_WARN(GRAFT_MOD_ETCD, "etcd %s: no endpoint answered after %u attempts", path,
               etcd->max_retries + 1);

cleanup:
    graft_free(c.url);
    curl_slist_free_all(c.headers);
    /* A failed transfer leaves the handle usable; its dead connection is
     * dropped by curl on the next use. */
    handle_put(etcd, c.h);
    return c.st;
}

static graft_status_t parse_body(const resp_sink_t *sink, json_t **json_p)
{
    json_error_t jerr;
    const char *data = sink->body.data ? sink->body.data : "";
    size_t len = sink->body.len;
    /* Streaming endpoints (lease keep-alive) end the object with a newline. */
    while (len > 0 && (data[len - 1] == '\n' || data[len - 1] == '\r'))
        len--;
    json_t *j = json_loadb(data, len, 0, &jerr);
    if (j == NULL || !json_is_object(j)) {
        json_decref(j);
        return GRAFT_EMALFORMED;
    }
    *json_p = j;
    return GRAFT_OK;
}

static graft_status_t authenticate(graft_etcd_t *etcd, uint64_t seen_gen)
{
    graft_status_t st = GRAFT_OK;
    json_t *req = NULL, *resp = NULL;
    char *body = NULL;
    resp_sink_t sink = {0};
    long code = 0;

    pthread_mutex_lock(&etcd->auth_lock);
    pthread_mutex_lock(&etcd->lock);
    bool fresh = etcd->token != NULL && etcd->token_gen != seen_gen;
    pthread_mutex_unlock(&etcd->lock);
    /* Another thread authenticated while this one waited. */
    if (fresh)
        goto out;

    st = GRAFT_ENOMEM;
    req = json_pack("{s:s, s:s}", "name", etcd->username, "password", etcd->password);
    if (req == NULL)
        goto out;
    body = json_dumps(req, JSON_COMPACT);
    if (body == NULL)
        goto out;
    st = http_post(etcd, "/v3/auth/authenticate", body, strlen(body), NULL, &code, &sink);
    if (st != GRAFT_OK)
        goto out;
    st = parse_body(&sink, &resp);
    if (st != GRAFT_OK) {
        /* Not JSON: the gateway's own refusal in plain text, e.g. etcd 3.4
         * with client certificate authentication refuses a certificate
         * with a CommonName on its JSON gateway. Say what it said. */
        int n = (int)GRAFT_MIN(sink.body.len, 200);
        while (n > 0 && (sink.body.data[n - 1] == '\n' || sink.body.data[n - 1] == '\r'))
            n--;
        GRAFT_ERROR(GRAFT_MOD_ETCD, "etcd authenticate: HTTP %ld, not a JSON answer: '%.*s'%s",
                    code, n, sink.body.data != NULL ? sink.body.data : "",
                    strstr(sink.body.data != NULL ? sink.body.data : "", "CommonName") != NULL
                        ? " (with etcd users, use a client certificate without a CommonName)"
                        : "");
        goto out;
    }
    if (code != 200) {
        st = graft__etcd_error_status(resp, code);
        /* Any refusal of authenticate is an authentication failure unless
         * the server was simply unavailable. */
        if (st != GRAFT_EUNREACHABLE && st != GRAFT_EETCD_TIMEOUT)
            st = GRAFT_EAUTH;
        const json_t *m = json_object_get(resp, "message");
        GRAFT_ERROR(GRAFT_MOD_ETCD, "etcd authenticate as '%s': %s", etcd->username,
                    json_is_string(m) ? json_string_value(m) : "refused");
        goto out;
    }
    char *t = NULL;
    st = graft__etcd_auth_token_decode(resp, &t);
    if (st != GRAFT_OK) {
        if (st == GRAFT_EMALFORMED)
            GRAFT_ERROR(GRAFT_MOD_ETCD, "etcd authenticate: answer without a usable token "
                        "(absent, empty, over %u bytes, or not printable ASCII)",
                        GRAFT_ETCD_TOKEN_MAX);
        goto out;
    }
    pthread_mutex_lock(&etcd->lock);
    graft_free(etcd->token);
    etcd->token = t;
    etcd->token_gen++;
    pthread_mutex_unlock(&etcd->lock);
    st = GRAFT_OK;

out:
    pthread_mutex_unlock(&etcd->auth_lock);
    json_decref(resp);
    graft__buf_free(&sink.body);
    free(body); /* json_dumps allocates with jansson's allocator */
    json_decref(req);
    return st;
}

graft_status_t graft__etcd_auth_header(graft_etcd_t *etcd, bool force_new, char **header_p)
{
    *header_p = NULL;
    if (etcd->username == NULL)
        return GRAFT_OK;
    pthread_mutex_lock(&etcd->lock);
    uint64_t gen = etcd->token_gen;
    bool have = etcd->token != NULL;
    pthread_mutex_unlock(&etcd->lock);
    if (!have || force_new) {
        graft_status_t st = authenticate(etcd, force_new ? gen : UINT64_MAX);
        if (st != GRAFT_OK)
            return st;
    }
    pthread_mutex_lock(&etcd->lock);
    char *h = etcd->token ? graft__asprintf("Authorization: %s", etcd->token) : NULL;
    pthread_mutex_unlock(&etcd->lock);
    if (h == NULL)
        return GRAFT_ENOMEM;
    *header_p = h;
    return GRAFT_OK;
}

graft_status_t graft__etcd_call(graft_etcd_t *etcd, const char *path, json_t *req,
                                json_t **resp_p)
{
    graft_status_t st = GRAFT_ENOMEM;
    char *body = json_dumps(req, JSON_COMPACT);
    char *auth = NULL;
    resp_sink_t sink = {0};
    json_t *resp = NULL;

    if (body == NULL)
        goto out;
    for (int round = 0; round < 2; round++) {
        graft_free(auth);
        auth = NULL;
        st = graft__etcd_auth_header(etcd, round > 0, &auth);
        if (st != GRAFT_OK)
            goto out;
        long code = 0;
        st = http_post(etcd, path, body, strlen(body), auth, &code, &sink);
        if (st != GRAFT_OK)
            goto out;
        st = parse_body(&sink, &resp);
        if (st != GRAFT_OK) {
            GRAFT_ERROR(GRAFT_MOD_ETCD, "etcd %s: answer is not JSON (HTTP %ld, %zu bytes)", path,
                        code, sink.body.len);
            goto out;
        }
        if (code == 200 && json_object_get(resp, "error") == NULL) {
            *resp_p = resp;
            resp = NULL;
            st = GRAFT_OK;
            goto out;
        }
        /* A token expires on the server's schedule: get a new one, once. */
        if (etcd->username != NULL && round == 0 && graft__etcd_error_is_bad_token(resp)) {
            GRAFT_INFO(GRAFT_MOD_ETCD, "etcd %s: token rejected, authenticating again", path);
            json_decref(resp);
            resp = NULL;
            continue;
        }
        st = graft__etcd_error_status(resp, code);
        const json_t *m = json_object_get(resp, "message");
        /* Not-found and compacted answers are ordinary outcomes for callers. */
        if (st == GRAFT_ENOTFOUND || st == GRAFT_ECOMPACTED)
            GRAFT_DEBUG(GRAFT_MOD_ETCD, "etcd %s: %s", path,
                        json_is_string(m) ? json_string_value(m) : "error");
        else
            GRAFT_WARN(GRAFT_MOD_ETCD, "etcd %s: HTTP %ld: %s", path, code,
                       json_is_string(m) ? json_string_value(m) : "error");
        goto out;
    }
out:
    json_decref(resp);
    graft__buf_free(&sink.body);
    graft_free(auth);
    free(body);
    return st;
}
