/* Fault-injecting HTTP proxy for the S3 fixture; see s3_fault_proxy.h. */
#include "s3_fault_proxy.h"

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

typedef struct conn {
    graft_test_s3_proxy_t *p;
    int fd;
} conn_t;

static int send_all(int fd, const char *buf, size_t len)
{
    while (len > 0) {
        ssize_t w = send(fd, buf, len, MSG_NOSIGNAL);
        if (w < 0 && errno == EINTR)
            continue;
        if (w <= 0)
            return -1;
        buf += w;
        len -= (size_t)w;
    }
    return 0;
}

/* Read until the end of the request head; *head_len its length (with the
 * blank line), the rest of buf is body already read. */
static ssize_t read_head(int fd, char *buf, size_t cap, size_t *head_len)
{
    size_t n = 0;
    while (n < cap - 1) {
        ssize_t r = recv(fd, buf + n, cap - 1 - n, 0);
        if (r <= 0)
            return -1;
        n += (size_t)r;
        buf[n] = '\0';
        char *end = strstr(buf, "\r\n\r\n");
        if (end != NULL) {
            *head_len = (size_t)(end - buf) + 4;
            return (ssize_t)n;
        }
    }
    return -1;
}

static long content_length(const char *head)
{
    for (const char *l = strstr(head, "\r\n"); l != NULL; l = strstr(l + 2, "\r\n"))
        if (strncasecmp(l + 2, "content-length:", 15) == 0)
            return strtol(l + 17, NULL, 10);
    return 0;
}

static bool should_inject(graft_test_s3_proxy_t *p, const char *head, int *status, int *ra)
{
    const char *eol = strstr(head, "\r\n");
    bool hit = false;
    pthread_mutex_lock(&p->mu);
    if (p->inject_left > 0 && eol != NULL) {
        char line[1024];
        snprintf(line, sizeof(line), "%.*s", (int)(eol - head), head);
        if (strstr(line, p->pattern) != NULL && p->pass_left > 0) {
            p->pass_left--;
        } else if (strstr(line, p->pattern) != NULL) {
            p->inject_left--;
            hit = true;
            *status = p->status;
            *ra = p->retry_after_s;
        }
    }
    pthread_mutex_unlock(&p->mu);
    return hit;
}

static void inject(int fd, char *buf, ssize_t got, size_t head_len, int status, int ra)
{
    /* Read the body first: closing with unread data would reset the
     * connection before the client reads the answer. */
    long left = content_length(buf) - (long)((size_t)got - head_len);
    char sink[65536];
    while (left > 0) {
        ssize_t r = recv(fd, sink, sizeof(sink), 0);
        if (r <= 0)
            break;
        left -= r;
    }
    static const char body[] = "<Error><Code>SlowDown</Code><Message>injected</Message></Error>";
    char ra_line[64] = "";
    if (ra > 0)
        snprintf(ra_line, sizeof(ra_line), "Retry-After: %d\r\n", ra);
    char resp[512];
    int n = snprintf(resp, sizeof(resp),
                     "HTTP/1.1 %d Injected\r\n%sContent-Type: application/xml\r\n"
                     "Content-Length: %zu\r\nConnection: close\r\n\r\n%s",
                     status, ra_line, sizeof(body) - 1, body);
    (void)send_all(fd, resp, (size_t)n);
}

/* Forward one request (made "Connection: close") and pump until the store
 * closes. */
static void forward(graft_test_s3_proxy_t *p, int fd, char *buf, ssize_t got, size_t head_len)
{
    int up = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)p->upstream_port),
                            .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    if (up < 0 || connect(up, (struct sockaddr *)&a, sizeof(a)) != 0) {
        if (up >= 0)
            close(up);
        return;
    }
    if (send_all(up, buf, head_len - 2) != 0 || send_all(up, "Connection: close\r\n\r\n", 21) != 0 ||
        send_all(up, buf + head_len, (size_t)got - head_len) != 0) {
        close(up);
        return;
    }
    struct pollfd fds[2] = {{.fd = fd, .events = POLLIN}, {.fd = up, .events = POLLIN}};
    char chunk[65536];
    while (!atomic_load(&p->stop)) {
        if (poll(fds, 2, 200) < 0 && errno != EINTR)
            break;
        if (fds[1].revents & (POLLIN | POLLHUP | POLLERR)) {
            ssize_t r = recv(up, chunk, sizeof(chunk), 0);
            if (r <= 0 || send_all(fd, chunk, (size_t)r) != 0)
                break;
        }
        if (fds[0].revents & (POLLIN | POLLHUP | POLLERR)) {
            ssize_t r = recv(fd, chunk, sizeof(chunk), 0);
            if (r <= 0 || send_all(up, chunk, (size_t)r) != 0)
                break;
        }
    }
    close(up);
    atomic_fetch_add(&p->forwarded, 1);
}

static void *conn_main(void *arg)
{
    conn_t *c = arg;
    static __thread char buf[1 << 16];
    size_t head_len = 0;
    ssize_t got = read_head(c->fd, buf, sizeof(buf), &head_len);
    int status = 0, ra = 0;
    if (got > 0) {
        if (should_inject(c->p, buf, &status, &ra) && status == 0) {
            atomic_fetch_add(&c->p->delayed, 1);
            for (int ms = 0; ms < c->p->delay_ms && !atomic_load(&c->p->stop); ms += 10)
                usleep(10000);
            forward(c->p, c->fd, buf, got, head_len);
        } else if (status != 0) {
            inject(c->fd, buf, got, head_len, status, ra);
            atomic_fetch_add(&c->p->injected, 1);
        } else {
            forward(c->p, c->fd, buf, got, head_len);
        }
    }
    graft_test_s3_proxy_t *p = c->p;
    close(c->fd);
    free(c);
    /* The last touch of the proxy: stop waits for it. */
    atomic_fetch_sub(&p->live, 1);
    return NULL;
}

static void *accept_main(void *arg)
{
    graft_test_s3_proxy_t *p = arg;
    while (!atomic_load(&p->stop)) {
        struct pollfd pf = {.fd = p->listen_fd, .events = POLLIN};
        if (poll(&pf, 1, 100) <= 0)
            continue;
        int fd = accept(p->listen_fd, NULL, NULL);
        if (fd < 0)
            continue;
        /* A client that goes quiet cannot hold up graft_test_s3_proxy_stop(). */
        struct timeval tv = {.tv_sec = 2};
        setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
        conn_t *c = malloc(sizeof(*c));
        pthread_t t;
        if (c == NULL) {
            close(fd);
            continue;
        }
        c->p = p;
        c->fd = fd;
        atomic_fetch_add(&p->live, 1);
        if (pthread_create(&t, NULL, conn_main, c) != 0) {
            atomic_fetch_sub(&p->live, 1);
            close(fd);
            free(c);
            continue;
        }
        pthread_detach(t);
    }
    return NULL;
}

int graft_test_s3_proxy_start(graft_test_s3_proxy_t *p, int upstream_port)
{
    memset(p, 0, sizeof(*p));
    p->upstream_port = upstream_port;
    pthread_mutex_init(&p->mu, NULL);
    p->listen_fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t len = sizeof(a);
    if (p->listen_fd < 0 || bind(p->listen_fd, (struct sockaddr *)&a, sizeof(a)) != 0 ||
        listen(p->listen_fd, 64) != 0 ||
        getsockname(p->listen_fd, (struct sockaddr *)&a, &len) != 0) {
        perror("proxy");
        return -1;
    }
    p->port = ntohs(a.sin_port);
    snprintf(p->endpoint, sizeof(p->endpoint), "http://127.0.0.1:%d", p->port);
    if (pthread_create(&p->thread, NULL, accept_main, p) != 0)
        return -1;
    return 0;
}

void graft_test_s3_proxy_inject_after(graft_test_s3_proxy_t *p, const char *pattern, int pass,
                                      int count, int status, int retry_after_s)
{
    pthread_mutex_lock(&p->mu);
    snprintf(p->pattern, sizeof(p->pattern), "%s", pattern);
    p->pass_left = pass;
    p->inject_left = count;
    p->status = status;
    p->retry_after_s = retry_after_s;
    pthread_mutex_unlock(&p->mu);
}

void graft_test_s3_proxy_inject(graft_test_s3_proxy_t *p, const char *pattern, int count,
                                int status, int retry_after_s)
{
    graft_test_s3_proxy_inject_after(p, pattern, 0, count, status, retry_after_s);
}

void graft_test_s3_proxy_delay(graft_test_s3_proxy_t *p, const char *pattern, int count,
                               int delay_ms)
{
    pthread_mutex_lock(&p->mu);
    p->delay_ms = delay_ms;
    pthread_mutex_unlock(&p->mu);
    graft_test_s3_proxy_inject_after(p, pattern, 0, count, 0, 0);
}

void graft_test_s3_proxy_stop(graft_test_s3_proxy_t *p)
{
    atomic_store(&p->stop, true);
    pthread_join(p->thread, NULL);
    close(p->listen_fd);
    /* Connection threads end within a poll period once stop is set. */
    while (atomic_load(&p->live) > 0)
        usleep(10 * 1000);
    pthread_mutex_destroy(&p->mu);
}

int graft_test_s3_proxied_setup(graft_test_s3_t *s3, graft_test_s3_proxy_t *proxy,
                                const char *bucket)
{
    int rc = graft_test_s3_setup(s3, bucket);
    if (rc == 0 && graft_test_s3_proxy_start(proxy, s3->port) != 0) {
        graft_test_s3_stop(s3);
        rc = -1;
    }
    return rc;
}
