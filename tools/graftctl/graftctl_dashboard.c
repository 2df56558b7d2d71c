/*
 * graftctl dashboard: a live view of the job over HTTP (libmicrohttpd).
 *
 *   GET  /              the page (graftctl_page.c; self-contained)
 *   GET  /api/state     everything the page shows, as one JSON object
 *   GET  /api/status    groups, ranks and the latest quorum (as `status --json`)
 *   GET  /api/events    the event history the dashboard holds
 *   GET  /metrics       Prometheus text format (graftctl_metrics.c)
 *   POST /api/evict?group=G   with "Authorization: Bearer TOKEN": evict a group
 *
 * One thread (the caller's) refreshes a snapshot every --interval-ms: the
 * status, the events appended since the last refresh (kept, so counters and
 * histograms survive the job's bounded history) and the checkpoint root's
 * listing. Requests are answered from the snapshot under a mutex; only an
 * evict talks to etcd from a request. Everything else is read-only, and
 * evict is refused unless a token was given at start-up.
 *
 * Guards (docs/SECURITY.md, "Operator tools"): a request whose Host header
 * is not an IP address, localhost or a name given with --allow-host is
 * refused (a page that rebinds its DNS name to this host cannot read the
 * job); the token is compared in constant time; the checkpoint listing
 * reads only --ckpt-root or a folder under it, whatever the job's records
 * say.
 */
#include "graftctl.h"
#include "graftctl_dash.h"
#include "../common/http_answer.h"

#include <graft/persist.h>

#include <arpa/inet.h>
#include <errno.h>
#include <inttypes.h>
#include <limits.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>

#include <microhttpd.h>
#include <openssl/crypto.h>
#include <openssl/evp.h>

static volatile sig_atomic_t stop_flag;

static void on_signal(int sig)
{
    (void)sig;
    stop_flag = 1;
}

/* ------------------------------------------------------------ refresh --- */

/* Where the job writes its checkpoints, as the newest checkpoint event
 * names it ("shard+manifest at ROOT: success"): whoever writes the job's
 * etcd records writes this, so it is only a hint (choose_ckpt_root). */
static void learn_ckpt_root(graftctl_dash_t *d, const graft_event_t *e)
{
    if (e->kind != GRAFT_EVENT_CHECKPOINT || e->detail == NULL)
        return;
    const char *at = strstr(e->detail, " at ");
    const char *end = at != NULL ? strrchr(at, ':') : NULL;
    if (at == NULL || end == NULL || end - (at + 4) <= 0 ||
        (size_t)(end - (at + 4)) >= sizeof(d->ckpt_named))
        return;
    memcpy(d->ckpt_named, at + 4, (size_t)(end - (at + 4)));
    d->ckpt_named[end - (at + 4)] = '\0';
}

/* Whether path is root or a folder under it (both canonical). */
static bool path_under(const char *path, const char *root)
{
    size_t n = strlen(root);
    if (strcmp(root, "/") == 0)
        return path[0] == '/';
    return strncmp(path, root, n) == 0 && (path[n] == '\0' || path[n] == '/');
}

/* The root to list (ckpt_listed, "" for none) and, when the job's events
 * name another, why it is not (ckpt_note, logged once per change). Only
 * --ckpt-root or a folder under it is listed: otherwise anyone who can
 * write the job's events could make the dashboard list any directory of
 * this host. Both paths are resolved first, so neither ".." nor a
 * symbolic link leads out of the given root. */
static void choose_ckpt_root(graftctl_dash_t *d)
{
    char given[PATH_MAX], named[PATH_MAX], t1[1024], t2[1024];
    char note[sizeof(d->ckpt_note)] = "";
    d->ckpt_listed[0] = '\0';
    if (!d->root_given) {
        if (d->ckpt_named[0] != '\0')
            snprintf(note, sizeof(note), "the job's checkpoint events name %s; not listed: "
                     "the dashboard lists only a root given with --ckpt-root, or a folder "
                     "under it", graftctl_text(d->ckpt_named, t1, sizeof(t1)));
        goto out;
    }
    if (realpath(d->ckpt_root, given) == NULL) {
        snprintf(note, sizeof(note), "--ckpt-root %s: %s",
                 graftctl_text(d->ckpt_root, t1, sizeof(t1)), strerror(errno));
        goto out;
    }
    snprintf(d->ckpt_listed, sizeof(d->ckpt_listed), "%s", given);
    if (d->ckpt_named[0] == '\0')
        goto out;
    if (realpath(d->ckpt_named, named) == NULL) {
        snprintf(note, sizeof(note), "the job's checkpoint events name %s: %s; listing "
                 "--ckpt-root", graftctl_text(d->ckpt_named, t1, sizeof(t1)), strerror(errno));
    } else if (!path_under(named, given)) {
        snprintf(note, sizeof(note), "the job's checkpoint events name %s, which is not under "
                 "--ckpt-root %s: not listed", graftctl_text(d->ckpt_named, t1, sizeof(t1)),
                 graftctl_text(given, t2, sizeof(t2)));
    } else {
        snprintf(d->ckpt_listed, sizeof(d->ckpt_listed), "%s", named);
    }
out:
    if (strcmp(note, d->ckpt_note) != 0 && note[0] != '\0')
        fprintf(stderr, "graftctl dashboard: checkpoints: %s\n", note);
    snprintf(d->ckpt_note, sizeof(d->ckpt_note), "%s", note);
}

static json_t *checkpoints_json(graftctl_dash_t *d)
{
    graft_persist_entry_t *e = NULL;
    size_t n = 0;
    json_t *list = json_array();
    choose_ckpt_root(d);
    if (d->ckpt_listed[0] == '\0' || graft_persist_list(d->ckpt_listed, &e, &n) != GRAFT_OK)
        return list;
    bool seen_valid = false;
    for (size_t i = 0; i < n; i++) {
        bool newest = e[i].state == GRAFT_PERSIST_COMPLETE && !seen_valid;
        seen_valid |= newest;
        const char *cls = e[i].state != GRAFT_PERSIST_COMPLETE ? "invalid"
                          : newest                            ? "newest"
                          : e[i].before_config_change         ? "config_change"
                                                              : "kept";
        json_array_append_new(
            list, json_pack("{s:I,s:s,s:s,s:I,s:I,s:I,s:o}", "step", (json_int_t)e[i].step,
                            "state",
                            e[i].state == GRAFT_PERSIST_COMPLETE     ? "complete"
                            : e[i].state == GRAFT_PERSIST_INCOMPLETE ? "incomplete"
                                                                     : "corrupt",
                            "retention", cls, "ranks", (json_int_t)e[i].ranks, "raw_bytes",
                            (json_int_t)e[i].raw_bytes, "unix_ms", (json_int_t)e[i].unix_ms,
                            "reason", graftctl_json_text(e[i].reason)));
    }
    graft_free(e);
    return list;
}

/* Appends the events after the last one held, counting them once. The
 * whole retained history is read each time: a recovery's phases come from
 * the events before its recovery_done, which may be older than the last
 * one held. */

static graft_status_t take_events(graftctl_dash_t *d)
{
    graft_event_t *ev = NULL;
    size_t n = 0;
    graft_status_t st = graft_membership_events_read(d->conn.obs, 0, &ev, &n);
    if (st != GRAFT_OK)
        return st;
    for (size_t i = 0; i < n; i++) {
        if (ev[i].seq <= d->last_seq)
            continue;
        /* seq is the event's create_revision: a read at revision R holds
         * every event created at or before R, so no older one lands later
         * and gaps are other keys' revisions, never an event to wait for. */
        d->last_seq = ev[i].seq;
        learn_ckpt_root(d, &ev[i]);
        json_array_append_new(d->events, graftctl_event_json(&ev[i]));
        graftctl_metrics_count_event(&d->metrics, &ev[i]);
        if (ev[i].kind == GRAFT_EVENT_RECOVERY_DONE) {
            json_t *r = graftctl_recovery_json(ev, n, i);
            if (r != NULL) {
                graftctl_metrics_count_recovery(&d->metrics, r);
                json_array_append_new(d->recoveries, r);
            }
        }
    }
    /* Bounded: the newest GRAFTCTL_DASH_KEEP of each. */
    while (json_array_size(d->events) > GRAFTCTL_DASH_KEEP)
        json_array_remove(d->events, 0);
    while (json_array_size(d->recoveries) > GRAFTCTL_DASH_KEEP)
        json_array_remove(d->recoveries, 0);
    graft_membership_events_free(ev, n);
    return GRAFT_OK;
}

/* Until etcd answers and the job has keys: try again at each refresh, and
 * say what it waits for (on the page, and on stderr when it changes). */
static int await_job(graftctl_dash_t *d, const graftctl_opts_t *o)
{
    char why[1024];
    graftctl_conn_t c;
    int rc = graftctl_connect_why(o, &c, why, sizeof(why));
    if (rc == GRAFTCTL_USAGE) {
        fprintf(stderr, "graftctl: %s\n", why); /* no job name, or a bad one */
        return rc;
    }
    if (rc == GRAFTCTL_OK) {
        pthread_mutex_lock(&d->mu);
        d->conn = c;
        d->connected = true;
        d->waiting[0] = '\0';
        pthread_mutex_unlock(&d->mu);
        fprintf(stderr, "graftctl dashboard: job '%s' found\n", o->job);
        return rc;
    }
    char now[sizeof(d->waiting)];
    snprintf(now, sizeof(now), "waiting for job '%s': %s", o->job, why);
    pthread_mutex_lock(&d->mu);
    bool changed = strcmp(now, d->waiting) != 0;
    memcpy(d->waiting, now, sizeof(now));
    d->refreshed_unix_ms = graftctl_now_ms();
    pthread_mutex_unlock(&d->mu);
    if (changed)
        fprintf(stderr, "graftctl dashboard: %s\n", now);
    return rc;
}

/* A step-rate sample (at most one a second) for the page's sparkline. */
static void sample_rate(graftctl_dash_t *d)
{
    uint64_t now = graftctl_now_ms();
    json_t *step = json_object_get(d->status, "step");
    if (d->status == NULL || now < d->rate_sampled_ms + 1000)
        return;
    d->rate_sampled_ms = now;
    json_array_append_new(
        d->rate_history,
        json_pack("[I,I,f]", (json_int_t)now,
                  json_is_integer(step) ? json_integer_value(step) : (json_int_t)0,
                  json_number_value(json_object_get(d->status, "steps_per_second"))));
    while (json_array_size(d->rate_history) > GRAFTCTL_DASH_RATE_KEEP)
        json_array_remove(d->rate_history, 0);
}

static void refresh(graftctl_dash_t *d, bool with_ckpt)
{
    graft_status_t st;
    json_t *remote = graftctl_dash_remote_poll(d->remote_url, &d->remote_polled_ms);
    pthread_mutex_lock(&d->mu);
    if (remote != NULL) {
        json_decref(d->remote);
        d->remote = remote;
    }
    json_t *s = graftctl_status_json(&d->conn, d->job, &st);
    if (s != NULL) {
        json_decref(d->status);
        d->status = s;
    } else {
        d->metrics.etcd_errors++;
    }
    if (take_events(d) != GRAFT_OK)
        d->metrics.etcd_errors++;
    sample_rate(d);
    if (with_ckpt) {
        json_decref(d->checkpoints);
        d->checkpoints = checkpoints_json(d);
    }
    d->refreshed_unix_ms = graftctl_now_ms();
    pthread_mutex_unlock(&d->mu);
}

/* ------------------------------------------------------------ answers --- */

static enum MHD_Result answer_json(struct MHD_Connection *conn, unsigned code, json_t *j)
{
    char *text = j != NULL ? json_dumps(j, JSON_COMPACT | JSON_PRESERVE_ORDER) : NULL;
    json_decref(j);
    return tool_http_answer(conn, code, "application/json", text);
}

static enum MHD_Result answer_error(struct MHD_Connection *conn, unsigned code, const char *why)
{
    return answer_json(conn, code, json_pack("{s:s}", "error", why));
}

static json_t *state_json(graftctl_dash_t *d)
{
    json_t *quorums = json_array();
    size_t i;
    json_t *e;
    json_array_foreach(d->events, i, e)
        if (strcmp(json_string_value(json_object_get(e, "kind")), "quorum_formed") == 0)
            json_array_append(quorums, e);
    json_t *drift = json_array();
    json_array_foreach(d->events, i, e)
        if (strcmp(json_string_value(json_object_get(e, "kind")), "drift") == 0)
            json_array_append(drift, e);
    /* No listing yet (the job not found, or no refresh with it): an empty
     * one of this answer's own ("o" takes it; "O" would keep it forever). */
    json_t *ckpts = d->checkpoints != NULL ? json_incref(d->checkpoints) : json_array();
    json_t *remote = graftctl_dash_remote_json(d->remote_url, d->remote, ckpts);
    return json_pack("{s:s,s:o,s:I,s:b,s:o,s:s,s:O,s:o,s:O,s:o,s:o,s:O,s:o}", "job", d->job,
                     "waiting", d->waiting[0] ? graftctl_json_text(d->waiting) : json_null(),
                     "refreshed_unix_ms", (json_int_t)d->refreshed_unix_ms, "evict_enabled",
                     d->token != NULL, "checkpoint_root", graftctl_json_text(d->ckpt_listed),
                     "checkpoint_root_note", d->ckpt_note, "status",
                     d->status != NULL ? d->status : json_null(), "quorums", quorums,
                     "recoveries", d->recoveries, "checkpoints", ckpts, "drift", drift,
                     "rate_history", d->rate_history, "remote", remote);
}

/* ------------------------------------------------------------- guards --- */

/* Whether the Authorization header carries the operator token. The two
 * are compared as SHA-256 digests with CRYPTO_memcmp, so the time taken
 * shows neither where a guess first differs nor the token's length. */
static bool token_ok(const char *token, const char *auth)
{
    unsigned char want[EVP_MAX_MD_SIZE], got[EVP_MAX_MD_SIZE];
    unsigned int want_len = 0, got_len = 0;
    if (auth == NULL || strncmp(auth, "Bearer ", 7) != 0)
        return false;
    auth += 7;
    if (EVP_Digest(token, strlen(token), want, &want_len, EVP_sha256(), NULL) != 1 ||
        EVP_Digest(auth, strlen(auth), got, &got_len, EVP_sha256(), NULL) != 1 ||
        want_len != got_len)
        return false;
    return CRYPTO_memcmp(want, got, want_len) == 0;
}

/* Whether a request's Host header names this dashboard: an IPv4 address,
 * a bracketed IPv6 address, localhost, or a name given with --allow-host,
 * with or without a port. A page on the web that rebinds its own DNS name
 * to this host's address (DNS rebinding) makes the browser send that name,
 * which is refused; a browser sends an address as Host only to the
 * address its page came from, so a request that names an address reads
 * nothing a page elsewhere could see (the dashboard sends no CORS
 * headers). The port is not compared: a rebinding page changes the name,
 * and a proxy in front may use its own port. */
static bool host_allowed(const graftctl_dash_t *d, const char *host)
{
    char name[256];
    const char *port;
    size_t len;
    if (host == NULL)
        return false;
    if (host[0] == '[') {
        const char *close = strchr(host, ']');
        if (close == NULL)
            return false;
        len = (size_t)(close - host) + 1;
        port = close + 1;
    } else {
        port = strchr(host, ':');
        len = port != NULL ? (size_t)(port - host) : strlen(host);
        port = host + len;
    }
    if (*port == ':') {
        size_t digits = strspn(port + 1, "0123456789");
        if (digits == 0 || digits > 5 || port[1 + digits] != '\0')
            return false;
    } else if (*port != '\0') {
        return false;
    }
    if (len == 0 || len >= sizeof(name))
        return false;
    memcpy(name, host, len);
    name[len] = '\0';
    if (len > 1 && name[len - 1] == '.') /* a fully qualified "localhost." */
        name[--len] = '\0';
    struct in_addr a4;
    struct in6_addr a6;
    if (inet_pton(AF_INET, name, &a4) == 1)
        return true;
    if (name[0] == '[') {
        name[len - 1] = '\0';
        return inet_pton(AF_INET6, name + 1, &a6) == 1;
    }
    if (strcasecmp(name, "localhost") == 0)
        return true;
    for (size_t i = 0; i < d->n_allow_hosts; i++)
        if (strcasecmp(name, d->allow_hosts[i]) == 0)
            return true;
    return false;
}

/* One line for the refusals of the last 10 s at most, so that a page
 * polling from a foreign name does not flood the log. */
static void log_refusal(graftctl_dash_t *d, struct MHD_Connection *conn, const char *shown)
{
    graftctl_refusals_t *r = &d->refusals;
    uint64_t now = graftctl_now_ms(), n;
    pthread_mutex_lock(&r->mu);
    r->total++;
    r->unlogged++;
    bool write = r->logged_ms == 0 || now - r->logged_ms >= 10000;
    n = r->unlogged;
    if (write) {
        r->logged_ms = now;
        r->unlogged = 0;
    }
    pthread_mutex_unlock(&r->mu);
    if (!write)
        return;
    char from[INET6_ADDRSTRLEN] = "?";
    const union MHD_ConnectionInfo *ci =
        MHD_get_connection_info(conn, MHD_CONNECTION_INFO_CLIENT_ADDRESS);
    const struct sockaddr *sa = ci != NULL ? ci->client_addr : NULL;
    if (sa != NULL && sa->sa_family == AF_INET)
        inet_ntop(AF_INET, &((const struct sockaddr_in *)(const void *)sa)->sin_addr, from,
                  sizeof(from));
    else if (sa != NULL && sa->sa_family == AF_INET6)
        inet_ntop(AF_INET6, &((const struct sockaddr_in6 *)(const void *)sa)->sin6_addr, from,
                  sizeof(from));
    fprintf(stderr, "graftctl dashboard: refused %" PRIu64 " request(s) for a foreign Host "
            "(the last from %s with Host '%s'); a name that should reach the dashboard is "
            "given with --allow-host NAME\n", n, from, shown);
    fflush(stderr);
}

static enum MHD_Result refuse_host(graftctl_dash_t *d, struct MHD_Connection *conn,
                                   const char *host)
{
    char shown[256], why[512];
    graftctl_text(host, shown, sizeof(shown));
    log_refusal(d, conn, shown);
    if (host == NULL)
        snprintf(why, sizeof(why), "refused: the request has no Host header");
    else
        snprintf(why, sizeof(why), "refused: Host '%s' is not a name of this dashboard; it "
                 "answers to IP addresses, localhost and names given with --allow-host "
                 "(a guard against DNS rebinding)", shown);
    return answer_error(conn, 403, why);
}

/* ------------------------------------------------------------- evict --- */

static enum MHD_Result evict(graftctl_dash_t *d, struct MHD_Connection *conn)
{
    const char *auth = MHD_lookup_connection_value(conn, MHD_HEADER_KIND, "Authorization");
    const char *g = MHD_lookup_connection_value(conn, MHD_GET_ARGUMENT_KIND, "group");
    uint64_t group;
    if (d->token == NULL)
        return answer_error(conn, 403, "evict is disabled: the dashboard was started without "
                                       "--token");
    if (!token_ok(d->token, auth))
        return answer_error(conn, 403, "bad or missing operator token");
    if (g == NULL || !graftctl_parse_u64(g, &group) || group > UINT32_MAX)
        return answer_error(conn, 400, "give ?group=N");
    pthread_mutex_lock(&d->mu);
    json_t *result = NULL;
    char why[256] = "";
    graft_status_t st = graftctl_evict_group(&d->conn, (uint32_t)group, "the dashboard",
                                             &result, why, sizeof(why));
    pthread_mutex_unlock(&d->mu);
    if (st == GRAFT_ENOTFOUND)
        return answer_error(conn, 404, why);
    if (st != GRAFT_OK)
        return answer_error(conn, 502, why);
    return answer_json(conn, 200, result);
}

static enum MHD_Result on_request(void *cls, struct MHD_Connection *conn, const char *url,
                                  const char *method, const char *version,
                                  const char *upload_data, size_t *upload_data_size,
                                  void **req_cls)
{
    graftctl_dash_t *d = cls;
    (void)version;
    (void)upload_data;
    if (*req_cls == NULL) {
        /* First call: headers only. */
        *req_cls = (void *)1;
        return MHD_YES;
    }
    if (*upload_data_size != 0) {
        *upload_data_size = 0; /* no endpoint reads a body */
        return MHD_YES;
    }
    const char *host = MHD_lookup_connection_value(conn, MHD_HEADER_KIND, "Host");
    if (!host_allowed(d, host))
        return refuse_host(d, conn, host);
    bool get = strcmp(method, "GET") == 0 || strcmp(method, "HEAD") == 0;
    if (strcmp(url, "/api/evict") == 0) {
        if (strcmp(method, "POST") != 0)
            return answer_error(conn, 405, "POST only");
        return evict(d, conn);
    }
    if (!get)
        return answer_error(conn, 405, "read-only: GET only");
    if (strcmp(url, "/") == 0 || strcmp(url, "/index.html") == 0) {
        char *page = strdup(graftctl_dashboard_page);
        return tool_http_answer(conn, 200, "text/html; charset=utf-8", page);
    }
    enum MHD_Result ret;
    pthread_mutex_lock(&d->mu);
    if (strcmp(url, "/api/state") == 0)
        ret = answer_json(conn, 200, state_json(d));
    else if (strcmp(url, "/api/status") == 0)
        ret = answer_json(conn, d->status != NULL ? 200 : 503,
                          d->status != NULL ? json_incref(d->status)
                                            : json_pack("{s:o}", "error",
                                                        graftctl_json_text(d->waiting[0]
                                                                               ? d->waiting
                                                                               : "no status "
                                                                                 "yet")));
    else if (strcmp(url, "/api/events") == 0)
        ret = answer_json(conn, 200, json_pack("{s:O}", "events", d->events));
    else if (strcmp(url, "/metrics") == 0)
        ret = tool_http_answer(conn, 200, "text/plain; version=0.0.4; charset=utf-8",
                     graftctl_metrics_text(&d->metrics, d->status));
    else
        ret = answer_error(conn, 404, "no such page");
    pthread_mutex_unlock(&d->mu);
    return ret;
}

/* ------------------------------------------------------------ command --- */

static bool parse_listen(const char *s, struct sockaddr_in *sa)
{
    char host[64];
    const char *colon = strrchr(s, ':');
    uint64_t port;
    if (colon == NULL || (size_t)(colon - s) >= sizeof(host) ||
        !graftctl_parse_u64(colon + 1, &port) || port > 65535)
        return false;
    memcpy(host, s, (size_t)(colon - s));
    host[colon - s] = '\0';
    memset(sa, 0, sizeof(*sa));
    sa->sin_family = AF_INET;
    sa->sin_port = htons((uint16_t)port);
    return inet_pton(AF_INET, host, &sa->sin_addr) == 1;
}

/* A name for --allow-host: a DNS name (letters, digits, '-', '.', '_'),
 * without a port; addresses and localhost need none. */
static bool valid_host_name(const char *s)
{
    size_t n = strlen(s);
    return n > 0 && n < 254 && strspn(s, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"
                                         "0123456789-._") == n;
}

/* The command's arguments into d, *listen_p, *sa and *interval_p.
 * GRAFTCTL_OK, or GRAFTCTL_USAGE (said). */
static int dash_parse(int argc, char **argv, graftctl_dash_t *d, const char **listen_p,
                      struct sockaddr_in *sa, uint64_t *interval_p)
{
    d->token = getenv("GRAFT_DASHBOARD_TOKEN");
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        bool ok = v != NULL;
        if (ok && strcmp(a, "--listen") == 0)
            *listen_p = v;
        else if (ok && strcmp(a, "--token") == 0)
            d->token = v;
        else if (ok && strcmp(a, "--ckpt-root") == 0) {
            ok = strlen(v) < sizeof(d->ckpt_root);
            snprintf(d->ckpt_root, sizeof(d->ckpt_root), "%s", v);
            d->root_given = true;
        } else if (ok && strcmp(a, "--ckpt-remote") == 0) {
            d->remote_url = v;
        } else if (ok && strcmp(a, "--allow-host") == 0) {
            ok = valid_host_name(v) && d->n_allow_hosts < GRAFTCTL_DASH_HOSTS;
            if (ok)
                d->allow_hosts[d->n_allow_hosts++] = v;
        } else if (ok && strcmp(a, "--interval-ms") == 0)
            ok = graftctl_parse_u64(v, interval_p) && *interval_p >= 50 && *interval_p <= 60000;
        else
            ok = false;
        if (!ok) {
            fprintf(stderr, "graftctl dashboard: bad argument '%s' (--listen HOST:PORT, --token "
                    "T, --ckpt-root DIR, --ckpt-remote s3://B/P, --allow-host NAME (a DNS "
                    "name, up to %d), --interval-ms N)\n", a, GRAFTCTL_DASH_HOSTS);
            return GRAFTCTL_USAGE;
        }
        i++;
    }
    if (d->token != NULL && strlen(d->token) < 8) {
        fprintf(stderr, "graftctl dashboard: the operator token must have 8 characters or more\n");
        return GRAFTCTL_USAGE;
    }
    if (!parse_listen(*listen_p, sa)) {
        fprintf(stderr, "graftctl dashboard: --listen '%s' is not IPv4-ADDRESS:PORT\n", *listen_p);
        return GRAFTCTL_USAGE;
    }
    if (d->remote_url == NULL)
        d->remote_url = getenv("GRAFT_PERSIST_REMOTE");
    if (d->remote_url != NULL && d->remote_url[0] == '\0')
        d->remote_url = NULL;
    return GRAFTCTL_OK;
}

int graftctl_cmd_dashboard(const graftctl_opts_t *o, int argc, char **argv)
{
    const char *listen = "127.0.0.1:8470";
    uint64_t interval = 500;
    struct sockaddr_in sa;
    struct MHD_Daemon *daemon = NULL;
    graftctl_dash_t d;
    memset(&d, 0, sizeof(d));
    if (dash_parse(argc, argv, &d, &listen, &sa, &interval) != GRAFTCTL_OK)
        return GRAFTCTL_USAGE;
    int rc = GRAFTCTL_FAIL;
    d.job = o->job;
    d.events = json_array();
    d.recoveries = json_array();
    d.rate_history = json_array();
    pthread_mutex_init(&d.mu, NULL);
    pthread_mutex_init(&d.refusals.mu, NULL);
    /* It may start before etcd or the job: it serves "waiting" until then. */
    int found = await_job(&d, o);
    if (found == GRAFTCTL_USAGE) {
        rc = found;
        goto out;
    }
    if (found == GRAFTCTL_OK)
        refresh(&d, true);
    daemon = MHD_start_daemon(MHD_USE_INTERNAL_POLLING_THREAD, 0, NULL, NULL,
                              on_request, &d, MHD_OPTION_SOCK_ADDR, (struct sockaddr *)&sa,
                              MHD_OPTION_CONNECTION_TIMEOUT, (unsigned)30, MHD_OPTION_END);
    if (daemon == NULL) {
        fprintf(stderr, "graftctl dashboard: cannot listen on %s: %s\n", listen,
                errno != 0 ? strerror(errno) : "libmicrohttpd refused");
        goto out;
    }
    printf("graftctl dashboard: job %s at http://%s/ (metrics at /metrics; evict %s)\n", o->job,
           listen, d.token != NULL ? "enabled with the operator token" : "disabled");
    fflush(stdout);
    signal(SIGINT, on_signal);
    signal(SIGTERM, on_signal);
    for (unsigned n = 1; !stop_flag; n++) {
        struct timespec ts = {(time_t)(interval / 1000), (long)(interval % 1000) * 1000000L};
        nanosleep(&ts, NULL);
        bool found_now = false;
        if (!d.connected) {
            if (await_job(&d, o) != GRAFTCTL_OK)
                continue;
            found_now = true;
        }
        refresh(&d, found_now || n % 4 == 0);
    }
    rc = GRAFTCTL_OK;
out:
    if (daemon != NULL)
        MHD_stop_daemon(daemon);
    json_decref(d.status);
    json_decref(d.events);
    json_decref(d.recoveries);
    json_decref(d.rate_history);
    json_decref(d.checkpoints);
    json_decref(d.remote);
    graftctl_metrics_free(&d.metrics);
    pthread_mutex_destroy(&d.refusals.mu);
    pthread_mutex_destroy(&d.mu);
    graftctl_disconnect(&d.conn);
    return rc;
}
