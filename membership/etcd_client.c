/*
 * etcd v3 client over the JSON gateway: the request path (a pool of curl
 * easy handles, each keeping its connection alive; endpoint failover;
 * retries with backoff; authentication) and the key-value, transaction and
 * lease calls built on it. Watches live in etcd_watch.c.
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

graft_status_t graft_etcd_endpoints_split(const char *list, char ***endpoints_p, size_t *n_p)
{
    graft_status_t st = GRAFT_EINVAL;
    char **out = NULL;
    size_t k = 0;

    if (list == NULL || endpoints_p == NULL || n_p == NULL)
        goto out;
    size_t n = 1;
    for (const char *p = list; *p != '\0'; p++)
        n += *p == ',';
    st = GRAFT_ENOMEM;
    out = graft__calloc(n, sizeof(*out));
    if (out == NULL)
        goto out;
    for (const char *p = list; *p != '\0';) {
        size_t len = strcspn(p, ",");
        if (len > 0) {
            out[k] = graft__strndup(p, len);
            if (out[k] == NULL)
                goto err_out;
            k++;
        }
        p += len;
        if (*p == ',')
            p++;
    }
    if (k == 0) {
        st = GRAFT_EINVAL;
        goto err_out;
    }
    *endpoints_p = out;
    *n_p = k;
    return GRAFT_OK;

err_out:
    graft_etcd_endpoints_free(out, k);
out:
    return st;
}

void graft_etcd_endpoints_free(char **endpoints, size_t n)
{
    if (endpoints == NULL)
        return;
    for (size_t i = 0; i < n; i++)
        graft_free(endpoints[i]);
    graft_free(endpoints);
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

/* One POST with failover across endpoints and retries with backoff. On
 * GRAFT_OK an HTTP answer arrived: *http_code_p and sink->body hold it. */
static graft_status_t http_post(graft_etcd_t *etcd, const char *path, const char *body,
                                size_t body_len, const char *auth_header, long *http_code_p,
                                resp_sink_t *sink)
{
    graft_status_t st = GRAFT_EUNREACHABLE;
    struct curl_slist *headers = NULL, *h2;
    CURL *h = handle_get(etcd);
    char *url = NULL;

    if (h == NULL) {
        st = GRAFT_ENOMEM;
        goto out;
    }
    /* An empty Expect: stops curl from waiting for "100 Continue" on large
     * bodies, which the gateway never sends. */
    headers = curl_slist_append(NULL, "Content-Type: application/json");
    h2 = headers != NULL ? curl_slist_append(headers, "Expect:") : NULL;
    if (h2 != NULL && auth_header != NULL)
        h2 = curl_slist_append(headers, auth_header);
    if (h2 == NULL) {
        st = GRAFT_ENOMEM;
        goto err_headers;
    }

    uint32_t backoff = etcd->retry_backoff_ms;
    size_t first = graft__etcd_endpoint_first(etcd);
    bool idempotent = path_idempotent(path);
    uint64_t election_end = graft__now_ns() + (uint64_t)etcd->election_wait_ms * 1000000ull;
    bool leaderless = false;
    for (uint32_t attempt = 0;; attempt++) {
        /* Past the retries, go on only while a member says an election is
         * on: it ends by itself, within a few election timeouts. */
        if (attempt > etcd->max_retries && !(leaderless && graft__now_ns() < election_end))
            break;
        if (attempt > 0) {
            GRAFT_DEBUG(GRAFT_MOD_ETCD, "etcd %s: retry %u after %u ms%s", path, attempt, backoff,
                        leaderless ? " (no leader)" : "");
            graft__sleep_ns((uint64_t)backoff * 1000000ull);
            backoff = backoff > UINT32_MAX / 2 ? backoff : backoff * 2;
            if (leaderless && backoff > ELECTION_BACKOFF_MAX_MS)
                backoff = ELECTION_BACKOFF_MAX_MS;
        }
        leaderless = false;
        for (size_t k = 0; k < etcd->n_endpoints; k++) {
            size_t idx = (first + k) % etcd->n_endpoints;
            graft_free(url);
            url = graft__asprintf("%s%s", etcd->endpoints[idx], path);
            if (url == NULL) {
                st = GRAFT_ENOMEM;
                goto err_headers;
            }
            graft__buf_reset(&sink->body);
            sink->too_big = sink->no_mem = false;
            curl_easy_reset(h);
            graft__etcd_curl_setup(etcd, h, url, etcd->request_timeout_ms);
            curl_easy_setopt(h, CURLOPT_POST, 1L);
            curl_easy_setopt(h, CURLOPT_POSTFIELDS, body);
            curl_easy_setopt(h, CURLOPT_POSTFIELDSIZE_LARGE, (curl_off_t)body_len);
            curl_easy_setopt(h, CURLOPT_HTTPHEADER, headers);
            curl_easy_setopt(h, CURLOPT_WRITEFUNCTION, sink_write);
            curl_easy_setopt(h, CURLOPT_WRITEDATA, sink);
            CURLcode rc = curl_easy_perform(h);
            long code = 0;
            curl_easy_getinfo(h, CURLINFO_RESPONSE_CODE, &code);
            /* A member without a leader answers 503, or 500 for a write it
             * cannot propose: another member may have one already. */
            bool no_leader = rc == CURLE_OK && code >= 500 &&
                             graft__etcd_error_is_leaderless(sink->body.data ? sink->body.data : "",
                                                             sink->body.len);
            if (rc == CURLE_OK && (code == 503 || no_leader)) {
                GRAFT_DEBUG(GRAFT_MOD_ETCD, "etcd %s: %ld%s", url, code,
                            no_leader ? " (no leader)" : "");
                leaderless |= no_leader;
                st = GRAFT_EUNREACHABLE;
                continue;
            }
            if (rc == CURLE_OK) {
                graft__etcd_endpoint_answered(etcd, idx);
                atomic_fetch_add(&etcd->bytes_read, sink->body.len);
                *http_code_p = code;
                st = GRAFT_OK;
                goto err_headers;
            }
            if (sink->no_mem) {
                st = GRAFT_ENOMEM;
                goto err_headers;
            }
            if (sink->too_big) {
                GRAFT_ERROR(GRAFT_MOD_ETCD, "etcd %s: answer over %u bytes", url,
                            GRAFT_ETCD_MAX_RESPONSE);
                st = GRAFT_EMALFORMED;
                goto err_headers;
            }
            /* A connect that timed out (a black-holed endpoint) is a
             * reason to try the next endpoint, not a request timeout. */
            curl_off_t connected_us = 0;
            bool connect_timeout =
                rc == CURLE_OPERATION_TIMEDOUT &&
                curl_easy_getinfo(h, CURLINFO_CONNECT_TIME_T, &connected_us) == CURLE_OK &&
                connected_us == 0;
            /* A request that waits on a follower whose leader just died
             * waits in vain: etcd drops what it forwarded and answers only
             * at its own timeout. One whose repetition changes nothing can
             * go to the next member instead. */
            bool repeatable_timeout = rc == CURLE_OPERATION_TIMEDOUT && idempotent &&
                                      k + 1 < etcd->n_endpoints;
            if (!graft__etcd_curl_retryable(rc) && !connect_timeout && !repeatable_timeout) {
                st = graft__etcd_curl_status(rc);
                GRAFT_WARN(GRAFT_MOD_ETCD, "etcd %s: %s", url, curl_easy_strerror(rc));
                goto err_headers;
            }
            GRAFT_DEBUG(GRAFT_MOD_ETCD, "etcd %s: %s", url, curl_easy_strerror(rc));
            st = GRAFT_EUNREACHABLE;
        }
    }
    GRAFT_WARN(GRAFT_MOD_ETCD, "etcd %s: no endpoint answered after %u attempts", path,
               etcd->max_retries + 1);

err_headers:
    graft_free(url);
    curl_slist_free_all(headers);
    /* A failed transfer leaves the handle usable; its dead connection is
     * dropped by curl on the next use. */
    handle_put(etcd, h);
out:
    return st;
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
        GRAFT_ERROR(GRAFT_MOD_ETCD, "etcd authenticate: malformed answer (HTTP %ld)", code);
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
    const json_t *tok = json_object_get(resp, "token");
    if (!json_is_string(tok) || json_string_length(tok) == 0 ||
        strpbrk(json_string_value(tok), "\r\n") != NULL) {
        GRAFT_ERROR(GRAFT_MOD_ETCD, "etcd authenticate: answer without a usable token");
        st = GRAFT_EMALFORMED;
        goto out;
    }
    char *t = graft__strdup(json_string_value(tok));
    if (t == NULL) {
        st = GRAFT_ENOMEM;
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

/* ------------------------------------------------------------------------ */
/* Key-value                                                                */
/* ------------------------------------------------------------------------ */

static graft_status_t set_range_end(json_t *req, const char *key, bool prefix,
                                    const char *range_end)
{
    if (prefix) {
        char *end = NULL;
        size_t len = 0;
        graft_status_t st = graft__etcd_prefix_end(key, &end, &len);
        if (st != GRAFT_OK)
            return st;
        st = graft__etcd_json_set_bytes(req, "range_end", end, len);
        graft_free(end);
        return st;
    }
    if (range_end != NULL)
        return graft__etcd_json_set_bytes(req, "range_end", range_end, strlen(range_end));
    return GRAFT_OK;
}

static graft_status_t range_request(const char *key, const graft_etcd_range_opts_t *o,
                                    json_t **req_p)
{
    graft_status_t st = GRAFT_ENOMEM;
    json_t *req = json_object();
    if (req == NULL)
        goto out;
    if ((st = graft__etcd_json_set_bytes(req, "key", key, strlen(key))) != GRAFT_OK ||
        (st = set_range_end(req, key, o->prefix, o->range_end)) != GRAFT_OK)
        goto err_req;
    if ((o->limit > 0 && (st = graft__etcd_json_set_int64(req, "limit", o->limit)) != GRAFT_OK) ||
        (o->revision > 0 &&
         (st = graft__etcd_json_set_int64(req, "revision", o->revision)) != GRAFT_OK))
        goto err_req;
    st = GRAFT_ENOMEM;
    if ((o->keys_only && json_object_set_new(req, "keys_only", json_true()) != 0) ||
        (o->count_only && json_object_set_new(req, "count_only", json_true()) != 0))
        goto err_req;
    *req_p = req;
    return GRAFT_OK;

err_req:
    json_decref(req);
out:
    return st;
}

static bool key_ok(const char *key)
{
    return key != NULL;
}

graft_status_t graft_etcd_range(graft_etcd_t *etcd, const char *key,
                                const graft_etcd_range_opts_t *opts,
                                graft_etcd_range_result_t *result_p)
{
    static const graft_etcd_range_opts_t defaults = {0};
    graft_status_t st = GRAFT_EINVAL;
    json_t *req = NULL, *resp = NULL;

    if (etcd == NULL || !key_ok(key) || result_p == NULL)
        goto out;
    if (opts == NULL)
        opts = &defaults;
    if (opts->limit < 0 || opts->revision < 0)
        goto out;
    st = range_request(key, opts, &req);
    if (st != GRAFT_OK)
        goto out;
    st = graft__etcd_call(etcd, "/v3/kv/range", req, &resp);
    if (st != GRAFT_OK)
        goto err_req;
    st = graft__etcd_range_decode(resp, result_p);
    if (st != GRAFT_OK)
        GRAFT_ERROR(GRAFT_MOD_ETCD, "etcd range: %s", graft_status_string(st));
    json_decref(resp);
err_req:
    json_decref(req);
out:
    return st;
}

graft_status_t graft_etcd_get(graft_etcd_t *etcd, const char *key, graft_etcd_kv_t *kv_p,
                              int64_t *revision_p)
{
    graft_etcd_range_result_t r;
    if (kv_p == NULL)
        return GRAFT_EINVAL;
    graft_status_t st = graft_etcd_range(etcd, key, NULL, &r);
    if (st != GRAFT_OK)
        return st;
    if (r.n_kvs == 0) {
        st = GRAFT_ENOTFOUND;
    } else {
        *kv_p = r.kvs[0];
        memset(&r.kvs[0], 0, sizeof(r.kvs[0]));
        if (revision_p != NULL)
            *revision_p = r.revision;
    }
    graft_etcd_range_result_clear(&r);
    return st;
}

graft_status_t graft_etcd_put(graft_etcd_t *etcd, const char *key, const void *value, size_t len,
                              int64_t lease, graft_etcd_kv_t *prev_kv_p, int64_t *revision_p)
{
    graft_status_t st = GRAFT_EINVAL;
    json_t *req = NULL, *resp = NULL;
    graft_etcd_kv_t prev = {0};
    int64_t rev = 0;

    if (etcd == NULL || !key_ok(key) || (value == NULL && len > 0) || lease < 0)
        goto out;
    st = GRAFT_ENOMEM;
    req = json_object();
    if (req == NULL)
        goto out;
    if ((st = graft__etcd_json_set_bytes(req, "key", key, strlen(key))) != GRAFT_OK ||
        (st = graft__etcd_json_set_bytes(req, "value", value ? value : "", len)) != GRAFT_OK ||
        (lease != 0 && (st = graft__etcd_json_set_int64(req, "lease", lease)) != GRAFT_OK))
        goto err_req;
    if (prev_kv_p != NULL && json_object_set_new(req, "prev_kv", json_true()) != 0) {
        st = GRAFT_ENOMEM;
        goto err_req;
    }
    st = graft__etcd_call(etcd, "/v3/kv/put", req, &resp);
    if (st != GRAFT_OK)
        goto err_req;
    st = graft__etcd_header_revision(resp, &rev);
    if (st != GRAFT_OK)
        goto err_resp;
    const json_t *p = json_object_get(resp, "prev_kv");
    if (prev_kv_p != NULL && p != NULL) {
        st = graft__etcd_kv_decode(p, &prev);
        if (st != GRAFT_OK)
            goto err_resp;
    }
    if (prev_kv_p != NULL)
        *prev_kv_p = prev;
    if (revision_p != NULL)
        *revision_p = rev;
err_resp:
    json_decref(resp);
err_req:
    json_decref(req);
out:
    return st;
}

graft_status_t graft_etcd_delete(graft_etcd_t *etcd, const char *key, bool prefix,
                                 int64_t *deleted_p, int64_t *revision_p)
{
    graft_status_t st = GRAFT_EINVAL;
    json_t *req = NULL, *resp = NULL;
    int64_t deleted = 0, rev = 0;

    if (etcd == NULL || !key_ok(key))
        goto out;
    st = GRAFT_ENOMEM;
    req = json_object();
    if (req == NULL)
        goto out;
    if ((st = graft__etcd_json_set_bytes(req, "key", key, strlen(key))) != GRAFT_OK ||
        (st = set_range_end(req, key, prefix, NULL)) != GRAFT_OK)
        goto err_req;
    st = graft__etcd_call(etcd, "/v3/kv/deleterange", req, &resp);
    if (st != GRAFT_OK)
        goto err_req;
    if ((st = graft__etcd_header_revision(resp, &rev)) != GRAFT_OK ||
        (st = graft__etcd_json_int64(resp, "deleted", &deleted)) != GRAFT_OK)
        goto err_resp;
    if (deleted_p != NULL)
        *deleted_p = deleted;
    if (revision_p != NULL)
        *revision_p = rev;
err_resp:
    json_decref(resp);
err_req:
    json_decref(req);
out:
    return st;
}

graft_status_t graft_etcd_compact(graft_etcd_t *etcd, int64_t revision)
{
    graft_status_t st = GRAFT_EINVAL;
    json_t *req = NULL, *resp = NULL;

    if (etcd == NULL || revision <= 0)
        goto out;
    st = GRAFT_ENOMEM;
    req = json_object();
    if (req == NULL)
        goto out;
    /* physical: answer only once the compaction is applied, so a watch or
     * range issued afterwards sees it. */
    if ((st = graft__etcd_json_set_int64(req, "revision", revision)) != GRAFT_OK)
        goto err_req;
    if (json_object_set_new(req, "physical", json_true()) != 0) {
        st = GRAFT_ENOMEM;
        goto err_req;
    }
    st = graft__etcd_call(etcd, "/v3/kv/compaction", req, &resp);
    json_decref(resp);
err_req:
    json_decref(req);
out:
    return st;
}

/* ------------------------------------------------------------------------ */
/* Transactions                                                             */
/* ------------------------------------------------------------------------ */

static graft_status_t compare_encode(const graft_etcd_compare_t *c, json_t **out_p)
{
    static const char *targets[] = {"VERSION", "CREATE", "MOD", "VALUE", "LEASE"};
    static const char *fields[] = {"version", "create_revision", "mod_revision", "value", "lease"};
    static const char *results[] = {"EQUAL", "GREATER", "LESS", "NOT_EQUAL"};
    graft_status_t st = GRAFT_EINVAL;
    json_t *o = NULL;

    if (!key_ok(c->key) || (unsigned)c->target >= GRAFT_ARRAY_SIZE(targets) ||
        (unsigned)c->op >= GRAFT_ARRAY_SIZE(results) ||
        (c->target == GRAFT_ETCD_CMP_VALUE && c->value == NULL && c->value_len > 0))
        goto out;
    st = GRAFT_ENOMEM;
    o = json_pack("{s:s, s:s}", "target", targets[c->target], "result", results[c->op]);
    if (o == NULL)
        goto out;
    if ((st = graft__etcd_json_set_bytes(o, "key", c->key, strlen(c->key))) != GRAFT_OK)
        goto err_o;
    if (c->target == GRAFT_ETCD_CMP_VALUE)
        st = graft__etcd_json_set_bytes(o, "value", c->value ? c->value : "", c->value_len);
    else
        st = graft__etcd_json_set_int64(o, fields[c->target], c->number);
    if (st != GRAFT_OK)
        goto err_o;
    *out_p = o;
    return GRAFT_OK;

err_o:
    json_decref(o);
out:
    return st;
}

static graft_status_t op_encode(const graft_etcd_op_t *op, json_t **out_p)
{
    graft_status_t st = GRAFT_EINVAL;
    json_t *inner = NULL, *o = NULL;
    const char *name;

    if (!key_ok(op->key))
        goto out;
    switch (op->type) {
    case GRAFT_ETCD_OP_PUT:
        name = "request_put";
        if ((op->value == NULL && op->value_len > 0) || op->lease < 0)
            goto out;
        break;
    case GRAFT_ETCD_OP_RANGE:
        name = "request_range";
        break;
    case GRAFT_ETCD_OP_DELETE:
        name = "request_delete_range";
        break;
    default:
        goto out;
    }
    st = GRAFT_ENOMEM;
    inner = json_object();
    if (inner == NULL)
        goto out;
    if ((st = graft__etcd_json_set_bytes(inner, "key", op->key, strlen(op->key))) != GRAFT_OK)
        goto err_inner;
    if (op->type == GRAFT_ETCD_OP_PUT) {
        if ((st = graft__etcd_json_set_bytes(inner, "value", op->value ? op->value : "",
                                             op->value_len)) != GRAFT_OK ||
            (op->lease != 0 &&
             (st = graft__etcd_json_set_int64(inner, "lease", op->lease)) != GRAFT_OK))
            goto err_inner;
    } else if ((st = set_range_end(inner, op->key, op->prefix, NULL)) != GRAFT_OK) {
        goto err_inner;
    }
    st = GRAFT_ENOMEM;
    if (op->type == GRAFT_ETCD_OP_RANGE && op->count_only &&
        json_object_set_new(inner, "count_only", json_true()) != 0)
        goto err_inner;
    o = json_object();
    if (o == NULL)
        goto err_inner;
    if (json_object_set_new(o, name, inner) != 0) {
        inner = NULL; /* json_object_set_new consumed it, even on failure */
        goto err_inner;
    }
    *out_p = o;
    return GRAFT_OK;

err_inner:
    json_decref(inner);
    json_decref(o);
out:
    return st;
}

static graft_status_t ops_encode(json_t *req, const char *field, const graft_etcd_op_t *ops,
                                 size_t n)
{
    if (n > 0 && ops == NULL)
        return GRAFT_EINVAL;
    json_t *arr = json_array();
    if (arr == NULL || json_object_set_new(req, field, arr) != 0)
        return GRAFT_ENOMEM;
    for (size_t i = 0; i < n; i++) {
        json_t *o = NULL;
        graft_status_t st = op_encode(&ops[i], &o);
        if (st != GRAFT_OK)
            return st;
        if (json_array_append_new(arr, o) != 0)
            return GRAFT_ENOMEM;
    }
    return GRAFT_OK;
}

void graft_etcd_txn_result_clear(graft_etcd_txn_result_t *result)
{
    if (result == NULL)
        return;
    for (size_t i = 0; i < result->n_ranges; i++)
        graft_etcd_range_result_clear(&result->ranges[i]);
    graft_free(result->ranges);
    memset(result, 0, sizeof(*result));
}

graft_status_t graft__etcd_txn_decode(const json_t *resp, const graft_etcd_op_t *ops,
                                     size_t n_ops, graft_etcd_txn_result_t *r)
{
    graft_status_t st;
    if ((st = graft__etcd_json_bool(resp, "succeeded", &r->succeeded)) != GRAFT_OK ||
        (st = graft__etcd_header_revision(resp, &r->revision)) != GRAFT_OK)
        return st;
    const json_t *arr = json_object_get(resp, "responses");
    size_t n_resp = json_is_array(arr) ? json_array_size(arr) : 0;
    if ((arr != NULL && !json_is_array(arr)) || n_resp != n_ops)
        return GRAFT_EMALFORMED;
    size_t n_ranges = 0;
    for (size_t i = 0; i < n_ops; i++)
        n_ranges += ops[i].type == GRAFT_ETCD_OP_RANGE;
    if (n_ranges == 0)
        return GRAFT_OK;
    r->ranges = graft__calloc(n_ranges, sizeof(*r->ranges));
    if (r->ranges == NULL)
        return GRAFT_ENOMEM;
    for (size_t i = 0; i < n_ops; i++) {
        if (ops[i].type != GRAFT_ETCD_OP_RANGE)
            continue;
        const json_t *rr = json_object_get(json_array_get(arr, i), "response_range");
        if (rr == NULL)
            return GRAFT_EMALFORMED;
        st = graft__etcd_range_decode(rr, &r->ranges[r->n_ranges]);
        if (st != GRAFT_OK)
            return st;
        /* Ranges inside a txn carry only a partial header; the txn's is
         * the one that counts. */
        r->ranges[r->n_ranges].revision = r->revision;
        r->n_ranges++;
    }
    return GRAFT_OK;
}

graft_status_t graft_etcd_txn(graft_etcd_t *etcd, const graft_etcd_compare_t *cmp, size_t n_cmp,
                              const graft_etcd_op_t *success, size_t n_success,
                              const graft_etcd_op_t *failure, size_t n_failure,
                              graft_etcd_txn_result_t *result_p)
{
    graft_status_t st = GRAFT_EINVAL;
    json_t *req = NULL, *resp = NULL, *arr = NULL;
    graft_etcd_txn_result_t r = {0};

    if (etcd == NULL || result_p == NULL || (n_cmp > 0 && cmp == NULL))
        goto out;
    st = GRAFT_ENOMEM;
    req = json_object();
    arr = json_array();
    if (req == NULL || arr == NULL || json_object_set(req, "compare", arr) != 0)
        goto err_req;
    for (size_t i = 0; i < n_cmp; i++) {
        json_t *c = NULL;
        if ((st = compare_encode(&cmp[i], &c)) != GRAFT_OK)
            goto err_req;
        if (json_array_append_new(arr, c) != 0) {
            st = GRAFT_ENOMEM;
            goto err_req;
        }
    }
    if ((st = ops_encode(req, "success", success, n_success)) != GRAFT_OK ||
        (st = ops_encode(req, "failure", failure, n_failure)) != GRAFT_OK)
        goto err_req;
    st = graft__etcd_call(etcd, "/v3/kv/txn", req, &resp);
    if (st != GRAFT_OK)
        goto err_req;
    bool ok = false;
    if ((st = graft__etcd_json_bool(resp, "succeeded", &ok)) != GRAFT_OK)
        goto err_resp;
    st = ok ? graft__etcd_txn_decode(resp, success, n_success, &r)
            : graft__etcd_txn_decode(resp, failure, n_failure, &r);
    if (st != GRAFT_OK) {
        GRAFT_ERROR(GRAFT_MOD_ETCD, "etcd txn: %s", graft_status_string(st));
        graft_etcd_txn_result_clear(&r);
        goto err_resp;
    }
    *result_p = r;
err_resp:
    json_decref(resp);
err_req:
    json_decref(arr);
    json_decref(req);
out:
    return st;
}

/* ------------------------------------------------------------------------ */
/* Leases                                                                   */
/* ------------------------------------------------------------------------ */

static graft_status_t lease_call(graft_etcd_t *etcd, const char *path, const char *field,
                                 int64_t value, json_t **resp_p)
{
    graft_status_t st = GRAFT_ENOMEM;
    json_t *req = json_object();
    if (req == NULL)
        goto out;
    st = graft__etcd_json_set_int64(req, field, value);
    if (st == GRAFT_OK)
        st = graft__etcd_call(etcd, path, req, resp_p);
    json_decref(req);
out:
    return st;
}

graft_status_t graft_etcd_lease_grant(graft_etcd_t *etcd, int64_t ttl_s, int64_t *lease_id_p,
                                      int64_t *ttl_p)
{
    json_t *resp = NULL;
    int64_t id = 0, ttl = 0;
    if (etcd == NULL || ttl_s <= 0 || lease_id_p == NULL)
        return GRAFT_EINVAL;
    graft_status_t st = lease_call(etcd, "/v3/lease/grant", "TTL", ttl_s, &resp);
    if (st != GRAFT_OK)
        return st;
    const json_t *err = json_object_get(resp, "error");
    if ((st = graft__etcd_json_int64(resp, "ID", &id)) != GRAFT_OK ||
        (st = graft__etcd_json_int64(resp, "TTL", &ttl)) != GRAFT_OK)
        goto out;
    if ((json_is_string(err) && json_string_length(err) > 0) || id <= 0) {
        GRAFT_ERROR(GRAFT_MOD_ETCD, "etcd lease grant: %s",
                    json_is_string(err) ? json_string_value(err) : "no lease id in the answer");
        st = id <= 0 ? GRAFT_EMALFORMED : GRAFT_EETCD;
        goto out;
    }
    *lease_id_p = id;
    if (ttl_p != NULL)
        *ttl_p = ttl;
out:
    json_decref(resp);
    return st;
}

graft_status_t graft_etcd_lease_keepalive(graft_etcd_t *etcd, int64_t lease, int64_t *ttl_p)
{
    json_t *resp = NULL;
    int64_t ttl = 0;
    if (etcd == NULL || lease <= 0)
        return GRAFT_EINVAL;
    graft_status_t st = lease_call(etcd, "/v3/lease/keepalive", "ID", lease, &resp);
    if (st != GRAFT_OK)
        return st;
    /* The keep-alive endpoint is a stream: {"result": {...}}. A lease that
     * no longer exists answers with its TTL omitted (zero). */
    const json_t *res = json_object_get(resp, "result");
    if (!json_is_object(res)) {
        st = GRAFT_EMALFORMED;
        GRAFT_ERROR(GRAFT_MOD_ETCD, "etcd lease keep-alive: answer without a result");
        goto out;
    }
    if ((st = graft__etcd_json_int64(res, "TTL", &ttl)) != GRAFT_OK)
        goto out;
    if (ttl <= 0) {
        st = GRAFT_ENOTFOUND;
        goto out;
    }
    if (ttl_p != NULL)
        *ttl_p = ttl;
out:
    json_decref(resp);
    return st;
}

graft_status_t graft_etcd_lease_revoke(graft_etcd_t *etcd, int64_t lease)
{
    json_t *resp = NULL;
    if (etcd == NULL || lease <= 0)
        return GRAFT_EINVAL;
    /* etcd 3.4.23's gateway serves both /v3/lease/revoke and the older
     * /v3/kv/lease/revoke (checked against the real server); 3.5 keeps only
     * the first. */
    graft_status_t st = lease_call(etcd, "/v3/lease/revoke", "ID", lease, &resp);
    json_decref(resp);
    return st;
}

graft_status_t graft_etcd_lease_ttl(graft_etcd_t *etcd, int64_t lease, int64_t *ttl_p,
                                    int64_t *granted_p)
{
    json_t *resp = NULL;
    int64_t ttl = 0, granted = 0;
    if (etcd == NULL || lease <= 0 || ttl_p == NULL)
        return GRAFT_EINVAL;
    graft_status_t st = lease_call(etcd, "/v3/lease/timetolive", "ID", lease, &resp);
    if (st != GRAFT_OK)
        return st;
    if ((st = graft__etcd_json_int64(resp, "TTL", &ttl)) != GRAFT_OK ||
        (st = graft__etcd_json_int64(resp, "grantedTTL", &granted)) != GRAFT_OK)
        goto out;
    /* An expired or revoked lease answers TTL -1. */
    if (ttl < 0) {
        st = GRAFT_ENOTFOUND;
        goto out;
    }
    *ttl_p = ttl;
    if (granted_p != NULL)
        *granted_p = granted;
out:
    json_decref(resp);
    return st;
}

/* ------------------------------------------------------------------------ */
/* Maintenance                                                              */
/* ------------------------------------------------------------------------ */

graft_status_t graft_etcd_member_status(graft_etcd_t *etcd, graft_etcd_member_status_t *status_p)
{
    graft_status_t st = GRAFT_EINVAL;
    json_t *req = NULL, *resp = NULL;
    graft_etcd_member_status_t ms = {0};

    if (etcd == NULL || status_p == NULL)
        goto out;
    st = GRAFT_ENOMEM;
    req = json_object();
    if (req == NULL)
        goto out;
    st = graft__etcd_call(etcd, "/v3/maintenance/status", req, &resp);
    if (st != GRAFT_OK)
        goto err_req;
    const json_t *hdr = json_object_get(resp, "header");
    if (!json_is_object(hdr) ||
        (st = graft__etcd_json_uint64(hdr, "member_id", &ms.member_id)) != GRAFT_OK ||
        (st = graft__etcd_json_uint64(resp, "leader", &ms.leader_id)) != GRAFT_OK ||
        (st = graft__etcd_json_uint64(resp, "raftTerm", &ms.raft_term)) != GRAFT_OK ||
        (st = graft__etcd_json_int64(hdr, "revision", &ms.revision)) != GRAFT_OK ||
        ms.member_id == 0) {
        GRAFT_ERROR(GRAFT_MOD_ETCD, "etcd maintenance status: unexpected answer");
        st = GRAFT_EMALFORMED;
        goto err_resp;
    }
    *status_p = ms;
err_resp:
    json_decref(resp);
err_req:
    json_decref(req);
out:
    return st;
}
