/* The etcd client against a misbehaving HTTP server on loopback: garbage,
 * truncated JSON, wrong types, 503s, silence and endless streams must give
 * clear errors, never a crash or a hang. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include <graft/etcd.h>

#include "etcd_fixture.h"

typedef enum {
    FAKE_GARBAGE,        /* not HTTP at all */
    FAKE_NOT_JSON,       /* 200 with a text body */
    FAKE_TRUNCATED,      /* Content-Length larger than what is sent */
    FAKE_WRONG_TYPES,    /* JSON, but not the shape etcd answers with */
    FAKE_BAD_BASE64,     /* a kv whose key is not base64 */
    FAKE_503,            /* always unavailable */
    FAKE_SILENT,         /* reads the request, never answers */
    FAKE_ENDLESS,        /* chunked stream that never ends, no newline */
    FAKE_ENDLESS_LINES,  /* watch created, then progress lines forever */
    FAKE_GARBAGE_LINES,  /* watch created, then a garbage line */
    FAKE_INT_STRINGS,    /* valid range answer with odd int64 encodings */
    FAKE_WATCH_SCRIPT,   /* a watch stream from `script`, in chunks of `split` bytes */
    FAKE_WATCH_QUIET,    /* per watch: created, one event, then silence until hung up */
    FAKE_WATCH_FROZEN,   /* a watch created at revision 1, then a frozen member */
} fake_mode_t;

typedef struct fake {
    int listen_fd;
    int port;
    pthread_t thread;
    atomic_int stop;
    atomic_int requests;
    fake_mode_t mode;
    const char *script; /* FAKE_WATCH_SCRIPT: the whole response body */
    size_t split;       /* bytes per chunk (and per send); 0: all in one */
    char bodies[4][512]; /* the first requests' bodies */
} fake_t;

static void send_all(int fd, const char *s, size_t n)
{
    while (n > 0) {
        ssize_t w = send(fd, s, n, MSG_NOSIGNAL);
        if (w <= 0)
            return;
        s += w;
        n -= (size_t)w;
    }
}

static void send_str(int fd, const char *s)
{
    send_all(fd, s, strlen(s));
}

/* Read one request (headers and Content-Length body). 0 on success. */
static int read_request(fake_t *f, int fd)
{
    char buf[65536];
    size_t len = 0;
    for (;;) {
        struct pollfd p = {.fd = fd, .events = POLLIN};
        if (poll(&p, 1, 100) == 0) {
            if (atomic_load(&f->stop))
                return -1;
            continue;
        }
        ssize_t r = recv(fd, buf + len, sizeof(buf) - 1 - len, 0);
        if (r <= 0)
            return -1;
        len += (size_t)r;
        buf[len] = '\0';
        char *end = strstr(buf, "\r\n\r\n");
        if (end == NULL)
            continue;
        char *cl = strcasestr(buf, "Content-Length:");
        size_t want = cl ? strtoul(cl + 15, NULL, 10) : 0;
        if (len - (size_t)(end + 4 - buf) >= want) {
            int k = atomic_load(&f->requests);
            if (k < 4)
                snprintf(f->bodies[k], sizeof(f->bodies[k]), "%s", end + 4);
            return 0;
        }
        if (len >= sizeof(buf) - 1)
            return 0; /* big body: good enough for these tests */
    }
}

static void chunk(int fd, const char *data)
{
    char head[32];
    snprintf(head, sizeof(head), "%zx\r\n", strlen(data));
    send_str(fd, head);
    send_str(fd, data);
    send_str(fd, "\r\n");
}

static void endless(fake_t *f, int fd, const char *first, const char *repeat)
{
    send_str(fd, "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                 "Transfer-Encoding: chunked\r\n\r\n");
    if (first != NULL)
        chunk(fd, first);
    while (!atomic_load(&f->stop)) {
        char head[32];
        snprintf(head, sizeof(head), "%zx\r\n", strlen(repeat));
        if (send(fd, head, strlen(head), MSG_NOSIGNAL) <= 0 ||
            send(fd, repeat, strlen(repeat), MSG_NOSIGNAL) <= 0 ||
            send(fd, "\r\n", 2, MSG_NOSIGNAL) <= 0)
            return;
        if (f->mode == FAKE_ENDLESS_LINES)
            usleep(20000);
    }
}

/* Serve `script` as one chunked response, `split` bytes per chunk, each
 * chunk its own send, then keep the stream open as etcd does. curl hands
 * the body of each chunk to the write callback on its own, so a split of 1
 * gives the watch parser one byte per call. */
static void watch_script(fake_t *f, int fd)
{
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    send_str(fd, "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                 "Transfer-Encoding: chunked\r\n\r\n");
    size_t len = strlen(f->script), step = f->split ? f->split : len;
    for (size_t off = 0; off < len; off += step) {
        size_t n = len - off < step ? len - off : step;
        char frame[64 + 4096];
        if (n > 4096) {
            char head[32];
            snprintf(head, sizeof(head), "%zx\r\n", n);
            send_str(fd, head);
            send_all(fd, f->script + off, n);
            send_str(fd, "\r\n");
            continue;
        }
        int h = snprintf(frame, sizeof(frame), "%zx\r\n", n);
        memcpy(frame + h, f->script + off, n);
        memcpy(frame + h + n, "\r\n", 2);
        send_all(fd, frame, (size_t)h + n + 2);
    }
    while (!atomic_load(&f->stop))
        usleep(10000);
}

/* Starts a chunked watch stream with its confirmation at @revision. */
static void watch_created(int fd, int revision)
{
    char created[128];
    send_str(fd, "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                 "Transfer-Encoding: chunked\r\n\r\n");
    snprintf(created, sizeof(created),
             "{\"result\":{\"header\":{\"revision\":\"%d\"},\"created\":true}}\n", revision);
    chunk(fd, created);
}

/* Sends nothing more until the client hangs up (or the fake stops). */
static void wait_hangup(fake_t *f, int fd)
{
    while (!atomic_load(&f->stop)) {
        struct pollfd p = {.fd = fd, .events = POLLIN};
        char b[64];
        if (poll(&p, 1, 20) > 0 && recv(fd, b, sizeof(b), 0) <= 0)
            return;
    }
}

/* The n-th watch (from 1): created at revision 10, then the put of key
 * /x/<n> at revision 10 + n, then nothing until the client hangs up. */
static void watch_quiet(fake_t *f, int fd)
{
    int n = atomic_load(&f->requests);
    char ev[256];
    watch_created(fd, 10);
    /* key "/x/<n>" in base64 is "L3gv" + base64 of the digit */
    snprintf(ev, sizeof(ev),
             "{\"result\":{\"header\":{\"revision\":\"%d\"},\"events\":[{\"kv\":{\"key\":"
             "\"L3gv%s\",\"value\":\"dg==\",\"mod_revision\":\"%d\",\"create_revision\":"
             "\"%d\",\"version\":\"1\"}}]}}\n",
             10 + n, n == 1 ? "MQ==" : n == 2 ? "Mg==" : "Mw==", 10 + n, 10 + n);
    chunk(fd, ev);
    wait_hangup(f, fd);
}

/* Like an etcd member that froze after it confirmed the first watch: that
 * stream and every later request get no byte more, until hung up. */
static void watch_frozen(fake_t *f, int fd)
{
    if (atomic_load(&f->requests) == 1) {
        watch_created(fd, 1);
    }
    wait_hangup(f, fd);
}

static void respond(fake_t *f, int fd)
{
    char body[512];
    switch (f->mode) {
    case FAKE_GARBAGE:
        send_str(fd, "SSH-2.0-OpenSSH_9.2\r\n\x01\x02\x03 this is not http\r\n\r\n");
        break;
    case FAKE_NOT_JSON:
        send_str(fd, "HTTP/1.1 200 OK\r\nContent-Length: 11\r\n\r\nhello world");
        break;
    case FAKE_TRUNCATED:
        send_str(fd, "HTTP/1.1 200 OK\r\nContent-Length: 200\r\n\r\n{\"header\":{\"revision\":\"5\"},\"kvs\":[{\"ke");
        break;
    case FAKE_WRONG_TYPES:
        snprintf(body, sizeof(body), "{\"header\":{\"revision\":\"7\"},\"kvs\":\"nope\",\"count\":true}");
        goto send_body;
    case FAKE_BAD_BASE64:
        snprintf(body, sizeof(body),
                 "{\"header\":{\"revision\":\"7\"},\"kvs\":[{\"key\":\"!!notbase64!!\"}],\"count\":\"1\"}");
        goto send_body;
    case FAKE_INT_STRINGS:
        /* revision as a number, count as a string, version omitted */
        snprintf(body, sizeof(body),
                 "{\"header\":{\"revision\":42},\"kvs\":[{\"key\":\"YQ==\",\"value\":\"Yg==\","
                 "\"mod_revision\":\"9223372036854775807\",\"create_revision\":3}],\"count\":\"1\"}");
        goto send_body;
    case FAKE_503:
        send_str(fd, "HTTP/1.1 503 Service Unavailable\r\nContent-Length: 0\r\n\r\n");
        break;
    case FAKE_SILENT:
        while (!atomic_load(&f->stop))
            usleep(10000);
        break;
    case FAKE_ENDLESS: {
        /* Large chunks so the client's limits, not the sender, are what
         * ends it, even under the sanitizers. */
        static char xs[65536];
        if (xs[0] == 0) {
            memset(xs, 'x', sizeof(xs) - 1);
            xs[sizeof(xs) - 1] = '\0';
        }
        endless(f, fd, NULL, xs);
        break;
    }
    case FAKE_ENDLESS_LINES:
        endless(f, fd, "{\"result\":{\"header\":{\"revision\":\"10\"},\"created\":true}}\n",
                "{\"result\":{\"header\":{\"revision\":\"10\"}}}\n");
        break;
    case FAKE_GARBAGE_LINES:
        endless(f, fd, "{\"result\":{\"header\":{\"revision\":\"10\"},\"created\":true}}\n",
                "{\"result\":{\"events\":[{\"kv\":{\"key\":12}}]}}\n");
        break;
    case FAKE_WATCH_SCRIPT:
        watch_script(f, fd);
        break;
    case FAKE_WATCH_QUIET:
        watch_quiet(f, fd);
        break;
    case FAKE_WATCH_FROZEN:
        watch_frozen(f, fd);
        break;
    }
    return;
send_body: {
    char head[128];
    snprintf(head, sizeof(head), "HTTP/1.1 200 OK\r\nContent-Length: %zu\r\n\r\n", strlen(body));
    send_str(fd, head);
    send_str(fd, body);
}
}

static void *fake_main(void *arg)
{
    fake_t *f = arg;
    while (!atomic_load(&f->stop)) {
        struct pollfd p = {.fd = f->listen_fd, .events = POLLIN};
        if (poll(&p, 1, 50) <= 0)
            continue;
        int fd = accept(f->listen_fd, NULL, NULL);
        if (fd < 0)
            continue;
        if (read_request(f, fd) == 0) {
            atomic_fetch_add(&f->requests, 1);
            respond(f, fd);
        }
        close(fd);
    }
    return NULL;
}

static fake_t *fake_start_script(fake_mode_t mode, const char *script, size_t split)
{
    fake_t *f = calloc(1, sizeof(*f));
    assert_non_null(f);
    f->mode = mode;
    f->script = script;
    f->split = split;
    f->listen_fd = socket(AF_INET, SOCK_STREAM, 0);
    assert_true(f->listen_fd >= 0);
    struct sockaddr_in a = {.sin_family = AF_INET};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t l = sizeof(a);
    assert_int_equal(bind(f->listen_fd, (struct sockaddr *)&a, sizeof(a)), 0);
    assert_int_equal(listen(f->listen_fd, 16), 0);
    assert_int_equal(getsockname(f->listen_fd, (struct sockaddr *)&a, &l), 0);
    f->port = ntohs(a.sin_port);
    assert_int_equal(pthread_create(&f->thread, NULL, fake_main, f), 0);
    return f;
}

static fake_t *fake_start(fake_mode_t mode)
{
    return fake_start_script(mode, NULL, 0);
}

static void fake_stop(fake_t *f)
{
    atomic_store(&f->stop, 1);
    pthread_join(f->thread, NULL);
    close(f->listen_fd);
    free(f);
}

static graft_etcd_t *client_retrying(fake_t *f, uint32_t timeout_ms, uint32_t max_retries)
{
    char ep[64];
    snprintf(ep, sizeof(ep), "http://127.0.0.1:%d", f->port);
    const char *eps[] = {ep};
    graft_etcd_config_t c = {.endpoints = eps, .n_endpoints = 1, .request_timeout_ms = timeout_ms,
                             .connect_timeout_ms = 300, .max_retries = max_retries,
                             .retry_backoff_ms = 10};
    graft_etcd_t *e = NULL;
    assert_int_equal(graft_etcd_create(&c, &e), GRAFT_OK);
    return e;
}

static graft_etcd_t *client_for(fake_t *f, uint32_t timeout_ms)
{
    return client_retrying(f, timeout_ms, 2);
}

static uint64_t now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000 + (uint64_t)ts.tv_nsec / 1000000;
}

static graft_status_t range_against(fake_mode_t mode, uint32_t timeout_ms, int *requests_p)
{
    fake_t *f = fake_start(mode);
    graft_etcd_t *c = client_for(f, timeout_ms);
    graft_etcd_range_result_t r;
    graft_status_t st = graft_etcd_range(c, "a", NULL, &r);
    if (st == GRAFT_OK)
        graft_etcd_range_result_clear(&r);
    graft_etcd_destroy(c);
    if (requests_p != NULL)
        *requests_p = atomic_load(&f->requests);
    fake_stop(f);
    return st;
}

static void test_garbage_answers(void **state)
{
    (void)state;
    assert_int_equal(range_against(FAKE_GARBAGE, 2000, NULL), GRAFT_EMALFORMED);
    assert_int_equal(range_against(FAKE_NOT_JSON, 2000, NULL), GRAFT_EMALFORMED);
    assert_int_equal(range_against(FAKE_TRUNCATED, 2000, NULL), GRAFT_EMALFORMED);
    assert_int_equal(range_against(FAKE_WRONG_TYPES, 2000, NULL), GRAFT_EMALFORMED);
    assert_int_equal(range_against(FAKE_BAD_BASE64, 2000, NULL), GRAFT_EMALFORMED);
}

static void test_int64_encodings(void **state)
{
    (void)state;
    fake_t *f = fake_start(FAKE_INT_STRINGS);
    graft_etcd_t *c = client_for(f, 2000);
    graft_etcd_range_result_t r;
    assert_int_equal(graft_etcd_range(c, "a", NULL, &r), GRAFT_OK);
    assert_int_equal(r.revision, 42);
    assert_int_equal(r.count, 1);
    assert_int_equal(r.n_kvs, 1);
    assert_string_equal(r.kvs[0].key, "a");
    assert_string_equal((char *)r.kvs[0].value, "b");
    assert_true(r.kvs[0].mod_revision == INT64_MAX);
    assert_int_equal(r.kvs[0].create_revision, 3);
    assert_int_equal(r.kvs[0].version, 0);
    graft_etcd_range_result_clear(&r);
    graft_etcd_destroy(c);
    fake_stop(f);
}

static void test_503_is_retried_then_unreachable(void **state)
{
    (void)state;
    int requests = 0;
    assert_int_equal(range_against(FAKE_503, 2000, &requests), GRAFT_EUNREACHABLE);
    assert_int_equal(requests, 3); /* first try + max_retries */
}

/* Count the requests a 503 server sees for one range with a retry setting. */
static int requests_for_503(uint32_t max_retries, graft_status_t *st_p)
{
    fake_t *f = fake_start(FAKE_503);
    graft_etcd_t *c = client_retrying(f, 2000, max_retries);
    graft_etcd_range_result_t r;
    *st_p = graft_etcd_range(c, "a", NULL, &r);
    if (*st_p == GRAFT_OK)
        graft_etcd_range_result_clear(&r);
    graft_etcd_destroy(c);
    int n = atomic_load(&f->requests);
    fake_stop(f);
    return n;
}

/* GRAFT_ETCD_NO_RETRIES means one attempt; 0 keeps meaning the default (3
 * retries), so a zero-initialised configuration still retries. The lease
 * keep-alive of membership relies on the first. */
static void test_503_no_retries_is_one_request(void **state)
{
    (void)state;
    graft_status_t st = GRAFT_OK;
    assert_int_equal(requests_for_503(GRAFT_ETCD_NO_RETRIES, &st), 1);
    assert_int_equal(st, GRAFT_EUNREACHABLE);
    assert_int_equal(requests_for_503(0, &st), 4); /* first try + the default 3 */
    assert_int_equal(st, GRAFT_EUNREACHABLE);
    assert_int_equal(requests_for_503(1, &st), 2);
    assert_int_equal(st, GRAFT_EUNREACHABLE);
}

static void test_silent_server_times_out(void **state)
{
    (void)state;
    uint64_t t0 = now_ms();
    assert_int_equal(range_against(FAKE_SILENT, 300, NULL), GRAFT_EETCD_TIMEOUT);
    assert_true(now_ms() - t0 < 2000);
}

static void test_endless_stream_times_out(void **state)
{
    (void)state;
    uint64_t t0 = now_ms();
    graft_status_t st = range_against(FAKE_ENDLESS, 300, NULL);
    /* Either the timeout or the response cap ends it, never a hang. */
    assert_true(st == GRAFT_EETCD_TIMEOUT || st == GRAFT_EMALFORMED);
    assert_true(now_ms() - t0 < 3000);
}

static void test_watch_endless_and_garbage(void **state)
{
    (void)state;
    /* Progress lines forever: no events, and destroy is prompt. */
    fake_t *f = fake_start(FAKE_ENDLESS_LINES);
    graft_etcd_t *c = client_for(f, 2000);
    graft_etcd_watch_t *w = NULL;
    assert_int_equal(graft_etcd_watch_create(c, "/x/", 0, &w), GRAFT_OK);
    graft_etcd_event_t *ev = NULL;
    size_t n = 7;
    uint64_t t0 = now_ms();
    assert_int_equal(graft_etcd_watch_next(w, 200, &ev, &n), GRAFT_OK);
    assert_int_equal(n, 0);
    assert_true(now_ms() - t0 < 1000);
    t0 = now_ms();
    graft_etcd_watch_destroy(w);
    assert_true(now_ms() - t0 < 100);
    graft_etcd_destroy(c);
    fake_stop(f);

    /* A line with the wrong types: a malformed error, then it keeps going. */
    f = fake_start(FAKE_GARBAGE_LINES);
    c = client_for(f, 2000);
    assert_int_equal(graft_etcd_watch_create(c, "/x/", 0, &w), GRAFT_OK);
    graft_status_t st = GRAFT_OK;
    for (int i = 0; i < 10 && st == GRAFT_OK; i++)
        st = graft_etcd_watch_next(w, 100, &ev, &n);
    assert_int_equal(st, GRAFT_EMALFORMED);
    assert_int_equal(n, 0);
    graft_etcd_watch_destroy(w);
    graft_etcd_destroy(c);
    fake_stop(f);

    /* A stream without newlines: the line cap ends it. */
    f = fake_start(FAKE_ENDLESS);
    c = client_for(f, 3000);
    t0 = now_ms();
    st = graft_etcd_watch_create(c, "/x/", 0, &w);
    assert_int_equal(st, GRAFT_EMALFORMED);
    assert_true(now_ms() - t0 < 4000);
    graft_etcd_destroy(c);
    fake_stop(f);

    /* Not HTTP: the watch cannot be established. */
    f = fake_start(FAKE_GARBAGE);
    c = client_for(f, 500);
    assert_int_equal(graft_etcd_watch_create(c, "/x/", 0, &w), GRAFT_EMALFORMED);
    graft_etcd_destroy(c);
    fake_stop(f);
}

/* --------------------------------------------- watch stream splitting --- */

/* One event the scripted stream carries and the watch must deliver. */
typedef struct script_event {
    int msg; /* events with the same msg travel in one watch message */
    graft_etcd_event_type_t type;
    char key[32];
    uint8_t value[300];
    size_t value_len;
    int64_t mod_revision, create_revision, version;
} script_event_t;

#define SCRIPT_EVENTS 40

static void b64(const uint8_t *in, size_t n, char *out)
{
    static const char a[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    size_t o = 0;
    for (size_t i = 0; i < n; i += 3) {
        uint32_t v = (uint32_t)in[i] << 16;
        if (i + 1 < n)
            v |= (uint32_t)in[i + 1] << 8;
        if (i + 2 < n)
            v |= in[i + 2];
        out[o++] = a[(v >> 18) & 63];
        out[o++] = a[(v >> 12) & 63];
        out[o++] = i + 1 < n ? a[(v >> 6) & 63] : '=';
        out[o++] = i + 2 < n ? a[v & 63] : '=';
    }
    out[o] = '\0';
}

/* The events, and the stream etcd would send for them: the created
 * confirmation at revision 10, then messages of one or several events
 * (several revisions, two events of one transaction's revision), a
 * progress notification, deletes, values with newlines, quotes and every
 * byte value (base64 on the wire), int64s as strings. */
static char *script_build(script_event_t *ev)
{
    int64_t rev = 11;
    int msg = 0;
    for (int i = 0; i < SCRIPT_EVENTS; i++) {
        script_event_t *e = &ev[i];
        memset(e, 0, sizeof(*e));
        e->type = i % 7 == 5 ? GRAFT_ETCD_EVENT_DELETE : GRAFT_ETCD_EVENT_PUT;
        snprintf(e->key, sizeof(e->key), "/x/k%d", i % 9);
        if (e->type == GRAFT_ETCD_EVENT_PUT) {
            if (i % 5 == 1) {
                e->value_len = 256 + (size_t)i;
                for (size_t b = 0; b < e->value_len; b++)
                    e->value[b] = (uint8_t)(b + (size_t)i);
            } else {
                e->value_len = (size_t)snprintf((char *)e->value, sizeof(e->value),
                                                "v%d\n{\"line\":%d}\r\n", i, i);
            }
            e->create_revision = 11;
            e->version = i + 1;
        }
        /* Event 3 shares revision and message with event 2 (a txn);
         * events 10-14 form one message of five revisions. */
        if (i > 0 && i != 3)
            rev++;
        if (i > 0 && i != 3 && !(i > 10 && i <= 14))
            msg++;
        e->mod_revision = rev;
        e->msg = msg;
    }
    size_t cap = 256 * 1024, len = 0;
    char *s = malloc(cap);
    assert_non_null(s);
    len += (size_t)snprintf(s + len, cap - len,
                            "{\"result\":{\"header\":{\"cluster_id\":\"1\",\"revision\":\"10\"},"
                            "\"created\":true}}\n");
    for (int first = 0; first < SCRIPT_EVENTS;) {
        int m = ev[first].msg, past = first;
        while (past < SCRIPT_EVENTS && ev[past].msg == m)
            past++;
        long long last = (long long)ev[past - 1].mod_revision;
        len += (size_t)snprintf(s + len, cap - len,
                                "{\"result\":{\"header\":{\"revision\":\"%lld\"},\"events\":[",
                                last);
        for (int j = first; j < past; j++) {
            char k64[64], v64[512];
            const char *sep = j > first ? "," : "";
            b64((const uint8_t *)ev[j].key, strlen(ev[j].key), k64);
            b64(ev[j].value, ev[j].value_len, v64);
            if (ev[j].type == GRAFT_ETCD_EVENT_DELETE)
                len += (size_t)snprintf(s + len, cap - len,
                                        "%s{\"type\":\"DELETE\",\"kv\":{\"key\":\"%s\","
                                        "\"mod_revision\":\"%lld\"}}",
                                        sep, k64, (long long)ev[j].mod_revision);
            else
                len += (size_t)snprintf(s + len, cap - len,
                                        "%s{\"kv\":{\"key\":\"%s\",\"create_revision\":\"%lld\","
                                        "\"mod_revision\":\"%lld\",\"version\":\"%lld\","
                                        "\"value\":\"%s\"}}",
                                        sep, k64, (long long)ev[j].create_revision,
                                        (long long)ev[j].mod_revision, (long long)ev[j].version,
                                        v64);
        }
        len += (size_t)snprintf(s + len, cap - len, "]}}\n");
        if (m == 6) /* a progress notification: a header and no events */
            len += (size_t)snprintf(s + len, cap - len,
                                    "{\"result\":{\"header\":{\"revision\":\"%lld\"}}}\n",
                                    last);
        assert_true(len < cap - 4096);
        first = past;
    }
    return s;
}

/* However the stream is cut (one byte per write, a few bytes across line
 * boundaries, whole lines, everything at once), every event arrives
 * exactly once, in order, with its key, value and revisions, over the one
 * stream (no reconnect that could hide a lost or doubled event). */
static void test_watch_stream_any_split(void **state)
{
    (void)state;
    static script_event_t ev[SCRIPT_EVENTS];
    char *script = script_build(ev);
    const size_t splits[] = {1, 2, 7, 61, 4096, 0};
    for (size_t s = 0; s < sizeof(splits) / sizeof(splits[0]); s++) {
        fake_t *f = fake_start_script(FAKE_WATCH_SCRIPT, script, splits[s]);
        graft_etcd_t *c = client_for(f, 3000);
        graft_etcd_watch_t *w = NULL;
        assert_int_equal(graft_etcd_watch_create(c, "/x/", 0, &w), GRAFT_OK);
        size_t got = 0;
        uint64_t end = now_ms() + 10000;
        while (got < SCRIPT_EVENTS && now_ms() < end) {
            graft_etcd_event_t *evs = NULL;
            size_t n = 0;
            assert_int_equal(graft_etcd_watch_next(w, 200, &evs, &n), GRAFT_OK);
            for (size_t i = 0; i < n; i++, got++) {
                assert_true(got < SCRIPT_EVENTS);
                const script_event_t *e = &ev[got];
                assert_int_equal(evs[i].type, e->type);
                assert_string_equal(evs[i].kv.key, e->key);
                assert_int_equal(evs[i].kv.value_len, e->value_len);
                if (e->value_len > 0)
                    assert_memory_equal(evs[i].kv.value, e->value, e->value_len);
                assert_int_equal(evs[i].kv.mod_revision, e->mod_revision);
                assert_int_equal(evs[i].kv.create_revision, e->create_revision);
                assert_int_equal(evs[i].kv.version, e->version);
            }
            graft_etcd_events_free(evs, n);
        }
        if (got != SCRIPT_EVENTS)
            print_message("# split %zu: %zu of %d events\n", splits[s], got, SCRIPT_EVENTS);
        assert_int_equal(got, SCRIPT_EVENTS);
        /* nothing more: no event twice */
        graft_etcd_event_t *evs = NULL;
        size_t n = 9;
        assert_int_equal(graft_etcd_watch_next(w, 150, &evs, &n), GRAFT_OK);
        assert_int_equal(n, 0);
        assert_int_equal(atomic_load(&f->requests), 1);
        graft_etcd_watch_destroy(w);
        graft_etcd_destroy(c);
        fake_stop(f);
    }
    free(script);
}

/* Waits up to @ms for events, or until @want arrived; returns how many
 * arrived, keys in @keys. */
static size_t watch_collect(graft_etcd_watch_t *w, uint32_t ms, size_t want, char keys[][16],
                            size_t cap)
{
    size_t got = 0;
    uint64_t end = now_ms() + ms;
    while (now_ms() < end && got < want) {
        graft_etcd_event_t *evs = NULL;
        size_t n = 0;
        assert_int_equal(graft_etcd_watch_next(w, 50, &evs, &n), GRAFT_OK);
        for (size_t i = 0; i < n; i++, got++) {
            assert_true(got < cap);
            snprintf(keys[got], 16, "%s", evs[i].kv.key);
        }
        graft_etcd_events_free(evs, n);
    }
    return got;
}

/*
 * A watch stream that goes quiet is re-opened after watch_idle_ms from the
 * revision it owes: the second stream asks for revision 12 (11 was
 * delivered), its event arrives, and nothing is delivered twice. With
 * GRAFT_ETCD_WATCH_NO_IDLE the quiet stream is kept.
 */
static void test_quiet_watch_is_reopened(void **state)
{
    (void)state;
    fake_t *f = fake_start(FAKE_WATCH_QUIET);
    char ep[64], keys[8][16];
    snprintf(ep, sizeof(ep), "http://127.0.0.1:%d", f->port);
    const char *eps[] = {ep};
    graft_etcd_config_t cfg = {.endpoints = eps, .n_endpoints = 1, .request_timeout_ms = 2000,
                               .connect_timeout_ms = 300, .retry_backoff_ms = 10,
                               .watch_idle_ms = 400};
    graft_etcd_t *c = NULL;
    graft_etcd_watch_t *w = NULL;
    assert_int_equal(graft_etcd_create(&cfg, &c), GRAFT_OK);
    assert_int_equal(graft_etcd_watch_create(c, "/x/", 0, &w), GRAFT_OK);
    uint64_t t0 = now_ms();
    assert_int_equal(watch_collect(w, 2000, 1, keys, 8), 1);
    assert_string_equal(keys[0], "/x/1");
    assert_int_equal(atomic_load(&f->requests), 1);
    /* Quiet past 400 ms: a second stream from revision 12. */
    assert_int_equal(watch_collect(w, 3000, 1, keys, 8), 1);
    assert_string_equal(keys[0], "/x/2");
    assert_true(now_ms() - t0 >= 400);
    assert_int_equal(atomic_load(&f->requests), 2);
    assert_null(strstr(f->bodies[0], "start_revision"));
    assert_non_null(strstr(f->bodies[1], "\"start_revision\":\"12\""));
    graft_etcd_watch_destroy(w);
    graft_etcd_destroy(c);
    fake_stop(f);

    f = fake_start(FAKE_WATCH_QUIET);
    snprintf(ep, sizeof(ep), "http://127.0.0.1:%d", f->port);
    cfg.watch_idle_ms = GRAFT_ETCD_WATCH_NO_IDLE;
    assert_int_equal(graft_etcd_create(&cfg, &c), GRAFT_OK);
    assert_int_equal(graft_etcd_watch_create(c, "/x/", 0, &w), GRAFT_OK);
    assert_int_equal(watch_collect(w, 1200, 8, keys, 8), 1);
    assert_int_equal(atomic_load(&f->requests), 1);
    graft_etcd_watch_destroy(w);
    graft_etcd_destroy(c);
    fake_stop(f);
}

/*
 * The member serving a watch freezes (its connection stays up, nothing
 * more comes): the quiet stream is re-opened, the frozen member does not
 * confirm within the request timeout, and the watch moves to the next
 * endpoint, a real etcd, where a put is then delivered once.
 */
static void test_frozen_member_watch_fails_over(void **state)
{
    (void)state;
    graft_test_etcd_t real;
    assert_int_equal(graft_test_etcd_start(&real, NULL), 0);
    fake_t *f = fake_start(FAKE_WATCH_FROZEN);
    char ep[64], keys[4][16];
    snprintf(ep, sizeof(ep), "http://127.0.0.1:%d", f->port);
    const char *eps[] = {ep, graft_etcd_server_endpoint(real.server)};
    graft_etcd_config_t cfg = {.endpoints = eps, .n_endpoints = 2, .request_timeout_ms = 500,
                               .connect_timeout_ms = 300, .retry_backoff_ms = 10,
                               .watch_idle_ms = 300};
    graft_etcd_t *c = NULL;
    graft_etcd_watch_t *w = NULL;
    assert_int_equal(graft_etcd_create(&cfg, &c), GRAFT_OK);
    assert_int_equal(graft_etcd_watch_create(c, "/x/", 0, &w), GRAFT_OK);
    assert_int_equal(atomic_load(&f->requests), 1); /* served by the fake */
    /* Past the idle time and one attempt's timeout: on the real etcd. */
    assert_int_equal(watch_collect(w, 1500, 1, keys, 4), 0);
    assert_true(atomic_load(&f->requests) >= 2);
    assert_int_equal(graft_etcd_put(real.client, "/x/k", "v", 1, 0, NULL, NULL), GRAFT_OK);
    assert_int_equal(watch_collect(w, 5000, 1, keys, 4), 1);
    assert_string_equal(keys[0], "/x/k");
    assert_int_equal(watch_collect(w, 300, 4, keys, 4), 0);
    graft_etcd_watch_destroy(w);
    graft_etcd_destroy(c);
    fake_stop(f);
    graft_test_etcd_stop(&real);
}

static void test_silent_watch_destroy_is_prompt(void **state)
{
    (void)state;
    fake_t *f = fake_start(FAKE_SILENT);
    graft_etcd_t *c = client_for(f, 300);
    graft_etcd_watch_t *w = NULL;
    uint64_t t0 = now_ms();
    assert_int_equal(graft_etcd_watch_create(c, "/x/", 0, &w), GRAFT_EETCD_TIMEOUT);
    assert_true(now_ms() - t0 < 1500);
    graft_etcd_destroy(c);
    fake_stop(f);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_garbage_answers),
        cmocka_unit_test(test_int64_encodings),
        cmocka_unit_test(test_503_is_retried_then_unreachable),
        cmocka_unit_test(test_503_no_retries_is_one_request),
        cmocka_unit_test(test_silent_server_times_out),
        cmocka_unit_test(test_endless_stream_times_out),
        cmocka_unit_test(test_watch_endless_and_garbage),
        cmocka_unit_test(test_silent_watch_destroy_is_prompt),
        cmocka_unit_test(test_watch_stream_any_split),
        cmocka_unit_test(test_quiet_watch_is_reopened),
        cmocka_unit_test(test_frozen_member_watch_fails_over),
    };
    return cmocka_run_group_tests_name("etcd_fake", tests, NULL, NULL);
}
