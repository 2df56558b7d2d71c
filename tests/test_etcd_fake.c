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
} fake_mode_t;

typedef struct fake {
    int listen_fd;
    int port;
    pthread_t thread;
    atomic_int stop;
    atomic_int requests;
    fake_mode_t mode;
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
        if (len - (size_t)(end + 4 - buf) >= want)
            return 0;
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

static fake_t *fake_start(fake_mode_t mode)
{
    fake_t *f = calloc(1, sizeof(*f));
    assert_non_null(f);
    f->mode = mode;
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
    };
    return cmocka_run_group_tests_name("etcd_fake", tests, NULL, NULL);
}
