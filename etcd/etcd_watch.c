/*
 * Watches over etcd's JSON gateway: one streaming POST /v3/watch per watch,
 * driven by a curl multi handle from the caller's thread inside
 * graft_etcd_watch_next(), so there is no background thread to join and
 * destroy never waits on the network.
 *
 * The stream is newline-delimited JSON. Bytes arrive however curl splits
 * them; they are collected until a newline and each complete line is
 * decoded on its own. The watch remembers the next revision it owes the
 * caller: after a dropped stream it reconnects from there, and any event
 * below it (already delivered) is dropped, so nothing is lost or repeated.
 */
#include "etcd_internal.h"

#include <string.h>

/* etcd 3.4 sends every event of one revision in one message (batches are
 * cut at revision boundaries, and this client never asks for fragments), so
 * "next revision owed" is enough to drop what was already delivered. */

/* Longest pause between reconnect attempts while etcd is down. */
#define WATCH_MAX_BACKOFF_MS 1000u

struct graft_etcd_watch {
    graft_etcd_t *etcd;
    char *prefix;
    int64_t next_rev;     /* first revision not yet delivered; 0: "now" */
    int64_t compact_rev;  /* set when etcd canceled the watch as compacted */
    bool compacted;

    CURLM *multi;
    CURL *easy;           /* the stream; NULL while disconnected */
    struct curl_slist *headers;
    char *body;           /* request body, alive as long as the transfer */
    char *url;
    size_t endpoint;      /* endpoint index of the current/next attempt */
    size_t first_endpoint; /* where the current round of attempts began */
    bool created;         /* the current stream has confirmed the watch */
    bool confirmed;       /* some stream confirmed it since wait_created() began */
    bool force_auth;      /* the last stream rejected our token */

    graft_buf_t line;     /* bytes after the last newline */
    graft_status_t stream_err; /* error found while reading; returned once */
    graft_status_t last_err;   /* why the last attempt to connect failed */
    uint64_t reconnect_at_ns;
    uint32_t backoff_ms;
    uint64_t last_data_ns; /* when the current stream last delivered bytes */

    graft_etcd_event_t *queue;
    size_t n_queue;
    size_t cap_queue;
};

static graft_status_t queue_events(graft_etcd_watch_t *w, graft_etcd_watch_msg_t *m)
{
    int64_t threshold = w->next_rev;
    for (size_t i = 0; i < m->n_events; i++) {
        graft_etcd_event_t *ev = &m->events[i];
        /* Already delivered before the stream was re-established. */
        if (threshold > 0 && ev->kv.mod_revision < threshold)
            continue;
        if (w->n_queue == w->cap_queue) {
            size_t cap = w->cap_queue ? w->cap_queue * 2 : 16;
            graft_etcd_event_t *q = graft__realloc(w->queue, cap * sizeof(*q));
            if (q == NULL)
                return GRAFT_ENOMEM;
            w->queue = q;
            w->cap_queue = cap;
        }
        /* Move the event out of the message. */
        int64_t rev = ev->kv.mod_revision;
        w->queue[w->n_queue++] = *ev;
        memset(&ev->kv, 0, sizeof(ev->kv));
        if (rev + 1 > w->next_rev)
            w->next_rev = rev + 1;
    }
    return GRAFT_OK;
}

static graft_status_t handle_line(graft_etcd_watch_t *w, const char *line, size_t len)
{
    graft_etcd_watch_msg_t m;
    graft_status_t st = graft__etcd_watch_msg_decode(line, len, &m);
    if (st != GRAFT_OK) {
        GRAFT_ERROR(GRAFT_MOD_ETCD, "etcd watch %s: undecodable line of %zu bytes: %.80s",
                    w->prefix, len, line);
        return st;
    }
    switch (m.kind) {
    case GRAFT_ETCD_WATCH_MSG_CREATED:
        w->created = true;
        w->confirmed = true;
        w->backoff_ms = 0;
        w->last_err = GRAFT_OK;
        w->first_endpoint = w->endpoint;
        graft__etcd_endpoint_answered(w->etcd, w->endpoint);
        if (w->next_rev == 0)
            w->next_rev = m.header_revision + 1;
        break;
    case GRAFT_ETCD_WATCH_MSG_EVENTS:
        st = queue_events(w, &m);
        break;
    case GRAFT_ETCD_WATCH_MSG_CANCELED:
        if (m.compact_revision > 0) {
            GRAFT_INFO(GRAFT_MOD_ETCD, "etcd watch %s: revision %lld compacted (at %lld)",
                       w->prefix, (long long)w->next_rev, (long long)m.compact_revision);
            w->compacted = true;
            w->compact_rev = m.compact_revision;
            st = GRAFT_ECOMPACTED;
        } else {
            GRAFT_WARN(GRAFT_MOD_ETCD, "etcd watch %s: canceled by etcd", w->prefix);
            st = GRAFT_EETCD;
        }
        break;
    case GRAFT_ETCD_WATCH_MSG_ERROR:
        st = m.error;
        w->force_auth = m.bad_token;
        GRAFT_WARN(GRAFT_MOD_ETCD, "etcd watch %s: %s", w->prefix, graft_status_string(st));
        break;
    }
    graft__etcd_watch_msg_clear(&m);
    return st;
}

graft_status_t graft__etcd_watch_split(graft_buf_t *line, const char *data, size_t n,
                                      size_t max_line, graft__etcd_line_fn on_line, void *arg)
{
    size_t start = line->len;
    if (graft__buf_append(line, data, n) != GRAFT_OK)
        return GRAFT_ENOMEM;
    /* Only the newly appended bytes can hold a newline. */
    size_t scan = start;
    size_t consumed = 0;
    while (scan < line->len) {
        char *nl = memchr(line->data + scan, '\n', line->len - scan);
        if (nl == NULL)
            break;
        size_t end = (size_t)(nl - line->data);
        const char *l = line->data + consumed;
        size_t len = end - consumed;
        while (len > 0 && (l[len - 1] == '\r' || l[len - 1] == ' '))
            len--;
        if (len > 0) {
            graft_status_t st = on_line(arg, l, len);
            if (st != GRAFT_OK)
                return st;
        }
        consumed = end + 1;
        scan = consumed;
    }
    graft__buf_consume(line, consumed);
    return line->len > max_line ? GRAFT_EMALFORMED : GRAFT_OK;
}

static graft_status_t stream_line(void *arg, const char *line, size_t len)
{
    return handle_line(arg, line, len);
}

static size_t stream_write(char *ptr, size_t size, size_t nmemb, void *arg)
{
    graft_etcd_watch_t *w = arg;
    size_t n = size * nmemb;
    w->last_data_ns = graft__now_ns();
    graft_status_t st =
        graft__etcd_watch_split(&w->line, ptr, n, GRAFT_ETCD_MAX_WATCH_LINE, stream_line, w);
    if (st != GRAFT_OK) {
        if (st == GRAFT_EMALFORMED && w->line.len > GRAFT_ETCD_MAX_WATCH_LINE)
            GRAFT_ERROR(GRAFT_MOD_ETCD, "etcd watch %s: no line end in %zu bytes", w->prefix,
                        w->line.len);
        w->stream_err = st;
        return 0; /* aborts the transfer */
    }
    return n;
}

static void disconnect(graft_etcd_watch_t *w)
{
    if (w->easy != NULL) {
        curl_multi_remove_handle(w->multi, w->easy);
        curl_easy_cleanup(w->easy);
        w->easy = NULL;
    }
    curl_slist_free_all(w->headers);
    w->headers = NULL;
    free(w->body); /* from json_dumps */
    w->body = NULL;
    graft_free(w->url);
    w->url = NULL;
    graft__buf_reset(&w->line);
    w->created = false;
}

static graft_status_t request_body(graft_etcd_watch_t *w, char **body_p)
{
    graft_status_t st = GRAFT_ENOMEM;
    json_t *req = json_object(), *cr = json_object();
    char *end = NULL;
    size_t end_len = 0;
    if (req == NULL || cr == NULL)
        goto out;
    if ((st = graft__etcd_json_set_bytes(cr, "key", w->prefix, strlen(w->prefix))) != GRAFT_OK ||
        (st = graft__etcd_prefix_end(w->prefix, &end, &end_len)) != GRAFT_OK ||
        (st = graft__etcd_json_set_bytes(cr, "range_end", end, end_len)) != GRAFT_OK ||
        (w->next_rev > 0 &&
         (st = graft__etcd_json_set_int64(cr, "start_revision", w->next_rev)) != GRAFT_OK))
        goto out;
    st = GRAFT_ENOMEM;
    if (json_object_set(req, "create_request", cr) != 0)
        goto out;
    *body_p = json_dumps(req, JSON_COMPACT);
    if (*body_p != NULL)
        st = GRAFT_OK;
out:
    graft_free(end);
    json_decref(cr);
    json_decref(req);
    return st;
}

static graft_status_t connect_stream(graft_etcd_watch_t *w)
{
    graft_status_t st;
    char *auth = NULL;
    struct curl_slist *h2;

    st = graft__etcd_auth_header(w->etcd, w->force_auth, &auth);
    if (st != GRAFT_OK)
        goto out;
    w->force_auth = false;
    st = request_body(w, &w->body);
    if (st != GRAFT_OK)
        goto err_conn;
    st = GRAFT_ENOMEM;
    w->url = graft__asprintf("%s/v3/watch", w->etcd->endpoints[w->endpoint]);
    w->headers = curl_slist_append(NULL, "Content-Type: application/json");
    h2 = w->headers ? curl_slist_append(w->headers, "Expect:") : NULL;
    if (h2 != NULL && auth != NULL)
        h2 = curl_slist_append(w->headers, auth);
    w->easy = curl_easy_init();
    if (w->url == NULL || h2 == NULL || w->easy == NULL)
        goto err_conn;
    /* No overall timeout: the stream is meant to stay open. */
    graft__etcd_curl_setup(w->etcd, w->easy, w->url, 0);
    curl_easy_setopt(w->easy, CURLOPT_POST, 1L);
    curl_easy_setopt(w->easy, CURLOPT_POSTFIELDS, w->body);
    curl_easy_setopt(w->easy, CURLOPT_POSTFIELDSIZE_LARGE, (curl_off_t)strlen(w->body));
    curl_easy_setopt(w->easy, CURLOPT_HTTPHEADER, w->headers);
    curl_easy_setopt(w->easy, CURLOPT_WRITEFUNCTION, stream_write);
    curl_easy_setopt(w->easy, CURLOPT_WRITEDATA, w);
    if (curl_multi_add_handle(w->multi, w->easy) != CURLM_OK)
        goto err_conn;
    /* Counted, not paced: a watch is what tells the view that etcd is
     * back, and it is re-opened with its own back-off. */
    atomic_fetch_add(&w->etcd->load->requests, 1);
    w->last_data_ns = graft__now_ns();
    GRAFT_DEBUG(GRAFT_MOD_ETCD, "etcd watch %s: streaming from %s at revision %lld", w->prefix,
                w->url, (long long)w->next_rev);
    graft_free(auth);
    return GRAFT_OK;

err_conn:
    if (w->easy != NULL) {
        curl_easy_cleanup(w->easy);
        w->easy = NULL;
    }
    disconnect(w);
    graft_free(auth);
out:
    return st;
}

static void next_endpoint(graft_etcd_watch_t *w);

/* The stream ended: decide when and where to reconnect. */
static void stream_done(graft_etcd_watch_t *w, CURLcode rc)
{
    bool was_created = w->created;
    long code = 0;
    curl_easy_getinfo(w->easy, CURLINFO_RESPONSE_CODE, &code);
    disconnect(w);
    if (w->compacted) {
        /* Reported by the next call; the caller restarts the watch. */
        return;
    }
    if (w->stream_err != GRAFT_OK) {
        /* Reported by the next call. A server that keeps sending what we
         * cannot read is retried with backoff, not in a tight loop. */
        uint32_t b = w->backoff_ms ? w->backoff_ms * 2 : w->etcd->retry_backoff_ms;
        w->backoff_ms = GRAFT_MIN(b, WATCH_MAX_BACKOFF_MS);
        w->reconnect_at_ns = graft__now_ns() + graft__jitter_ns((uint64_t)w->backoff_ms * 1000000ull);
        return;
    }
    if (was_created) {
        /* etcd went away after serving us: try again at once. */
        GRAFT_INFO(GRAFT_MOD_ETCD, "etcd watch %s: stream ended (%s); reconnecting from %lld",
                   w->prefix, curl_easy_strerror(rc), (long long)w->next_rev);
        w->reconnect_at_ns = 0;
        w->backoff_ms = 0;
        w->last_err = GRAFT_EUNREACHABLE;
        return;
    }
    w->last_err = rc == CURLE_OK ? (code == 503 ? GRAFT_EUNREACHABLE : GRAFT_EMALFORMED)
                                 : graft__etcd_curl_status(rc);
    GRAFT_DEBUG(GRAFT_MOD_ETCD, "etcd watch %s: %s: %s (HTTP %ld)", w->prefix,
                w->etcd->endpoints[w->endpoint], curl_easy_strerror(rc), code);
    next_endpoint(w);
}

/* After a failed attempt: the next endpoint, at once, or after a backoff
 * once every endpoint failed in this round. */
static void next_endpoint(graft_etcd_watch_t *w)
{
    w->endpoint = (w->endpoint + 1) % w->etcd->n_endpoints;
    if (w->endpoint == w->first_endpoint) {
        /* Every endpoint failed once: back off before the next round. */
        uint32_t b = w->backoff_ms ? w->backoff_ms * 2 : w->etcd->retry_backoff_ms;
        w->backoff_ms = GRAFT_MIN(b, WATCH_MAX_BACKOFF_MS);
        w->reconnect_at_ns = graft__now_ns() + graft__jitter_ns((uint64_t)w->backoff_ms * 1000000ull);
    } else {
        w->reconnect_at_ns = 0;
    }
}

/* A stream that says nothing is cut. Before it confirmed the watch, after
 * the request timeout: a failed attempt, the next endpoint is tried. After,
 * once quiet for watch_idle_ms: re-opened at once from the revision owed. */
static void stream_check_idle(graft_etcd_watch_t *w, uint64_t now)
{
    uint32_t limit_ms = w->created ? w->etcd->watch_idle_ms : w->etcd->request_timeout_ms;
    if (w->easy == NULL || limit_ms == 0 || now - w->last_data_ns < (uint64_t)limit_ms * 1000000ull)
        return;
    if (w->created) {
        GRAFT_INFO(GRAFT_MOD_ETCD, "etcd watch %s: nothing for %u ms; re-opening from revision "
                   "%lld", w->prefix, limit_ms, (long long)w->next_rev);
        disconnect(w);
        w->reconnect_at_ns = 0;
        return;
    }
    GRAFT_DEBUG(GRAFT_MOD_ETCD, "etcd watch %s: %s did not confirm the watch within %u ms",
                w->prefix, w->etcd->endpoints[w->endpoint], limit_ms);
    disconnect(w);
    w->last_err = GRAFT_EETCD_TIMEOUT;
    next_endpoint(w);
}

/* Move the stream forward for at most wait_ms. */
static graft_status_t pump(graft_etcd_watch_t *w, uint64_t deadline_ns)
{
    uint64_t now = graft__now_ns();
    if (w->easy == NULL) {
        if (now < w->reconnect_at_ns) {
            uint64_t until = GRAFT_MIN(w->reconnect_at_ns, deadline_ns);
            if (until > now)
                graft__sleep_ns(until - now);
            return GRAFT_OK;
        }
        graft_status_t st = connect_stream(w);
        if (st != GRAFT_OK) {
            w->last_err = st;
            uint32_t b = w->backoff_ms ? w->backoff_ms * 2 : w->etcd->retry_backoff_ms;
            w->backoff_ms = GRAFT_MIN(b, WATCH_MAX_BACKOFF_MS);
            w->reconnect_at_ns = graft__now_ns() + graft__jitter_ns((uint64_t)w->backoff_ms * 1000000ull);
            /* Out of memory or a refused password will not fix itself by
             * waiting; say so now. */
            return st == GRAFT_EUNREACHABLE || st == GRAFT_EETCD_TIMEOUT ? GRAFT_OK : st;
        }
    }
    int running = 0;
    bool was_created = w->created;
    if (curl_multi_perform(w->multi, &running) != CURLM_OK)
        return GRAFT_EINTERNAL;
    int left = 0;
    CURLMsg *msg;
    while ((msg = curl_multi_info_read(w->multi, &left)) != NULL) {
        if (msg->msg == CURLMSG_DONE && msg->easy_handle == w->easy) {
            stream_done(w, msg->data.result);
            return GRAFT_OK;
        }
    }
    /* Something for the caller, including the confirmation that
     * wait_created() waits for (it came with this read: polling on would
     * sit out the whole wait before create returned). */
    if (w->n_queue > 0 || w->stream_err != GRAFT_OK || w->compacted ||
        (w->created && !was_created))
        return GRAFT_OK;
    now = graft__now_ns();
    stream_check_idle(w, now);
    if (w->easy == NULL)
        return GRAFT_OK;
    if (now >= deadline_ns)
        return GRAFT_OK;
    /* Wake at least every 100 ms so a deadline is never overshot by much. */
    uint64_t wait_ms = GRAFT_MIN((deadline_ns - now + 999999ull) / 1000000ull, 100ull);
    if (curl_multi_poll(w->multi, NULL, 0, (int)wait_ms, NULL) != CURLM_OK)
        return GRAFT_EINTERNAL;
    return GRAFT_OK;
}

/* Wait until the current stream has confirmed the watch, bounded by the
 * client's request timeout. */
static graft_status_t wait_created(graft_etcd_watch_t *w)
{
    uint64_t deadline = graft__now_ns() + (uint64_t)w->etcd->request_timeout_ms * 1000000ull;
    /* Errors after the confirmation (the stream may carry both in one read)
     * are the caller's to see through watch_next(). */
    w->confirmed = false;
    while (!w->confirmed) {
        /* A compaction is the caller's to see through watch_next(). */
        if (w->compacted || w->n_queue > 0)
            return GRAFT_OK;
        if (w->stream_err != GRAFT_OK) {
            graft_status_t st = w->stream_err;
            w->stream_err = GRAFT_OK;
            return st;
        }
        if (graft__now_ns() >= deadline) {
            graft_status_t st = w->last_err != GRAFT_OK ? w->last_err : GRAFT_EETCD_TIMEOUT;
            GRAFT_ERROR(GRAFT_MOD_ETCD, "etcd watch %s: not established: %s", w->prefix,
                        graft_status_string(st));
            return st;
        }
        graft_status_t st = pump(w, deadline);
        if (st != GRAFT_OK)
            return st;
    }
    return GRAFT_OK;
}

graft_status_t graft_etcd_watch_create(graft_etcd_t *etcd, const char *prefix,
                                       int64_t start_revision, graft_etcd_watch_t **watch_p)
{
    graft_status_t st = GRAFT_EINVAL;
    graft_etcd_watch_t *w = NULL;

    if (etcd == NULL || prefix == NULL || start_revision < 0 || watch_p == NULL)
        goto out;
    st = GRAFT_ENOMEM;
    w = graft__calloc(1, sizeof(*w));
    if (w == NULL)
        goto out;
    w->etcd = etcd;
    w->next_rev = start_revision;
    w->endpoint = w->first_endpoint = graft__etcd_endpoint_first(etcd);
    graft__buf_init(&w->line);
    w->prefix = graft__strdup(prefix);
    w->multi = curl_multi_init();
    if (w->prefix == NULL || w->multi == NULL)
        goto err_watch;
    st = wait_created(w);
    if (st != GRAFT_OK)
        goto err_watch;
    *watch_p = w;
    return GRAFT_OK;

err_watch:
    graft_etcd_watch_destroy(w);
out:
    return st;
}

graft_status_t graft_etcd_watch_next(graft_etcd_watch_t *w, uint32_t timeout_ms,
                                     graft_etcd_event_t **events_p, size_t *n_p)
{
    if (w == NULL || events_p == NULL || n_p == NULL)
        return GRAFT_EINVAL;
    *events_p = NULL;
    *n_p = 0;
    uint64_t deadline = graft__now_ns() + (uint64_t)timeout_ms * 1000000ull;
    /* Even a poll (timeout 0) moves the stream once. */
    bool pumped = false;
    for (;;) {
        if (w->n_queue > 0) {
            *events_p = w->queue;
            *n_p = w->n_queue;
            w->queue = NULL;
            w->n_queue = w->cap_queue = 0;
            return GRAFT_OK;
        }
        if (w->compacted)
            return GRAFT_ECOMPACTED;
        if (w->stream_err != GRAFT_OK) {
            graft_status_t st = w->stream_err;
            w->stream_err = GRAFT_OK;
            return st;
        }
        if (pumped && graft__now_ns() >= deadline) {
            /* Connected (or about to reconnect after serving): a plain
             * timeout. Still failing to reach etcd: say why. */
            if (w->easy == NULL && w->last_err != GRAFT_OK)
                return w->last_err;
            return GRAFT_OK;
        }
        graft_status_t st = pump(w, deadline);
        if (st != GRAFT_OK)
            return st;
        pumped = true;
    }
}

int64_t graft_etcd_watch_compact_revision(const graft_etcd_watch_t *watch)
{
    return watch ? watch->compact_rev : 0;
}

graft_status_t graft_etcd_watch_restart(graft_etcd_watch_t *w, int64_t start_revision)
{
    if (w == NULL || start_revision < 0)
        return GRAFT_EINVAL;
    disconnect(w);
    graft_etcd_events_free(w->queue, w->n_queue);
    w->queue = NULL;
    w->n_queue = w->cap_queue = 0;
    w->compacted = false;
    w->compact_rev = 0;
    w->stream_err = GRAFT_OK;
    w->last_err = GRAFT_OK;
    w->backoff_ms = 0;
    w->reconnect_at_ns = 0;
    w->next_rev = start_revision;
    return wait_created(w);
}

void graft_etcd_watch_destroy(graft_etcd_watch_t *w)
{
    if (w == NULL)
        return;
    disconnect(w);
    if (w->multi != NULL)
        curl_multi_cleanup(w->multi);
    graft_etcd_events_free(w->queue, w->n_queue);
    graft__buf_free(&w->line);
    graft_free(w->prefix);
    graft_free(w);
}
