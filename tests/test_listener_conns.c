/*
 * One listener, 256 connections (issue 25): what an accepted connection
 * costs the listening process, now that every connection is on the
 * listener's one UCX worker (docs/TRANSFER.md). A worker per accepted
 * connection, as before, cost each one its own descriptors and memory, and
 * the workers' shared-memory segments ran out before 256 groups on one
 * host.
 *
 * Real UCX on loopback, real processes: a listener process (one endpoint);
 * one sender process whose endpoint sends it a message (the baseline:
 * one connection); then LISTENER_CONNS endpoints in SENDER_PROCS processes
 * send it their group, again every 2 s (delivery is best effort), and keep
 * their connections open (a connection
 * graft_transfer_msg_send() made is kept, as the runtime's steady path
 * keeps them). Every message must arrive; the listener's descriptors
 * (/proc/<pid>/fd) and resident memory (VmRSS) with 1 and with 1 + 256
 * connections are printed per connection and bounded.
 */
#include <graft/transfer.h>

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>

#define LISTENER_CONNS_DEFAULT 256
#define SENDER_PROCS 8
#define MAX_SENDERS 1024
/* What one more connection may cost the listener: a worker per connection
 * cost more than both (docs/PERFORMANCE.md, "A listener with 256
 * connections"). */
#define FDS_PER_CONN_MAX 4.0
#define KIB_PER_CONN_MAX 512.0

static const char secret[] = "job-secret-of-the-listener-test";

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static graft_transfer_endpoint_t *endpoint(uint32_t group)
{
    graft_transfer_config_t cfg = {.listen_address = "127.0.0.1", .group = group,
                                   .job_secret = secret, .job_secret_len = strlen(secret)};
    graft_transfer_endpoint_t *ep = NULL;
    return graft_transfer_endpoint_create(&cfg, &ep) == GRAFT_OK ? ep : NULL;
}

static void write_all(int fd, const void *buf, size_t n)
{
    const char *p = buf;
    while (n > 0) {
        ssize_t w = write(fd, p, n);
        if (w < 0 && errno == EINTR)
            continue;
        if (w <= 0)
            _exit(3);
        p += w;
        n -= (size_t)w;
    }
}

/* The listener: its address on addr_fd, then a byte on got_fd per sender
 * heard from (a message is best effort: senders repeat theirs). */
static void listener_main(int addr_fd, int got_fd)
{
    graft_transfer_endpoint_t *ep = endpoint(0);
    static bool seen[MAX_SENDERS + 2];
    if (ep == NULL)
        _exit(2);
    char addr[128] = {0};
    snprintf(addr, sizeof(addr), "%s", graft_transfer_endpoint_address(ep));
    write_all(addr_fd, addr, sizeof(addr));
    for (;;) {
        char buf[GRAFT_TRANSFER_MSG_MAX];
        size_t len = 0;
        uint32_t id;
        if (graft_transfer_msg_recv(ep, buf, &len, 1000) != GRAFT_OK || len != sizeof(id))
            continue;
        memcpy(&id, buf, sizeof(id));
        if (id < MAX_SENDERS + 2 && !seen[id]) {
            seen[id] = true;
            write_all(got_fd, "m", 1);
        }
    }
}

/* n endpoints (groups first..first+n-1) each send their group to addr,
 * and again every 2 s (delivery is best effort), holding their
 * connections until go_fd is closed. */
static void sender_main(const char *addr, uint32_t first, int n, int go_fd)
{
    graft_transfer_endpoint_t **ep = calloc((size_t)n, sizeof(*ep));
    if (ep == NULL)
        _exit(2);
    for (int i = 0; i < n; i++)
        ep[i] = endpoint(first + (uint32_t)i);
    for (;;) {
        for (int i = 0; i < n; i++) {
            uint32_t id = first + (uint32_t)i;
            graft_status_t st = ep[i] == NULL ? GRAFT_ETRANSPORT
                                              : graft_transfer_msg_send(ep[i], addr, &id,
                                                                        sizeof(id), 5000);
            if (st != GRAFT_OK)
                fprintf(stderr, "sender %u: %s\n", id, ep[i] == NULL ? "no endpoint"
                                                                   : graft_status_string(st));
        }
        struct pollfd p = {go_fd, POLLIN, 0};
        if (poll(&p, 1, 2000) != 0)
            _exit(0);
    }
}

static int conns(void)
{
    const char *v = getenv("LISTENER_CONNS");
    int n = v != NULL ? atoi(v) : LISTENER_CONNS_DEFAULT;
    return n < SENDER_PROCS ? SENDER_PROCS : (n > MAX_SENDERS ? MAX_SENDERS : n);
}

/* Descriptors and resident KiB of pid. */
static void measure(pid_t pid, int *fds_p, long *kib_p)
{
    char path[64], line[256];
    snprintf(path, sizeof(path), "/proc/%d/fd", (int)pid);
    DIR *d = opendir(path);
    int n = 0;
    struct dirent *e;
    while (d != NULL && (e = readdir(d)) != NULL)
        n += e->d_name[0] != '.';
    if (d != NULL)
        closedir(d);
    *fds_p = n;
    *kib_p = -1;
    snprintf(path, sizeof(path), "/proc/%d/status", (int)pid);
    FILE *f = fopen(path, "r");
    while (f != NULL && fgets(line, sizeof(line), f) != NULL)
        if (strncmp(line, "VmRSS:", 6) == 0)
            *kib_p = atol(line + 6);
    if (f != NULL)
        fclose(f);
}

/* Read bytes from fd until want arrived or timeout_s passed; the count. */
static int count_bytes(int fd, int have, int want, double timeout_s)
{
    double end = now_s() + timeout_s;
    char buf[512];
    while (have < want && now_s() < end) {
        ssize_t r = read(fd, buf, sizeof(buf));
        if (r > 0)
            have += (int)r;
        else if (r == 0)
            break;
        else if (errno != EINTR && errno != EAGAIN)
            break;
        else
            usleep(10000);
    }
    return have;
}

static pid_t fork_sender(const char *addr, uint32_t first, int n, int go_r, int close_w)
{
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        close(close_w);
        sender_main(addr, first, n, go_r);
    }
    return pid;
}

static void test_listener_with_256_connections(void **state)
{
    (void)state;
    const int n = conns();
    int addr_p[2], got_p[2], go_p[2];
    assert_int_equal(pipe(addr_p), 0);
    assert_int_equal(pipe(got_p), 0);
    assert_int_equal(pipe(go_p), 0);
    pid_t lst = fork();
    assert_true(lst >= 0);
    if (lst == 0) {
        close(addr_p[0]);
        close(got_p[0]);
        close(go_p[0]);
        close(go_p[1]);
        listener_main(addr_p[1], got_p[1]);
    }
    close(addr_p[1]);
    close(got_p[1]);
    assert_int_equal(fcntl(got_p[0], F_SETFL, O_NONBLOCK), 0);
    char addr[128];
    assert_int_equal(read(addr_p[0], addr, sizeof(addr)), (ssize_t)sizeof(addr));
    addr[sizeof(addr) - 1] = '\0';
    pid_t snd[SENDER_PROCS + 1];
    /* The baseline: one connection. */
    snd[0] = fork_sender(addr, 1, 1, go_p[0], go_p[1]);
    int got = count_bytes(got_p[0], 0, 1, 60.0);
    assert_int_equal(got, 1);
    usleep(500 * 1000);
    int fds1, fds2;
    long kib1, kib2;
    measure(lst, &fds1, &kib1);
    double t0 = now_s();
    for (int p = 0; p < SENDER_PROCS; p++) {
        int lo = n * p / SENDER_PROCS, hi = n * (p + 1) / SENDER_PROCS;
        snd[p + 1] = fork_sender(addr, 2 + (uint32_t)lo, hi - lo, go_p[0], go_p[1]);
    }
    close(go_p[0]);
    got = count_bytes(got_p[0], got, 1 + n, 120.0);
    double took = now_s() - t0;
    usleep(500 * 1000);
    measure(lst, &fds2, &kib2);
    double fds_per = (double)(fds2 - fds1) / n, kib_per = (double)(kib2 - kib1) / n;
    print_message("listener with 1 connection: %d descriptors, %ld KiB resident; with %d more "
                  "(%d of them heard from in %.1f s): %d descriptors, %ld KiB: %.2f descriptors "
                  "and %.0f KiB a connection\n",
                  fds1, kib1, n, got - 1, took, fds2, kib2, fds_per, kib_per);
    /* The senders end (their connections close), then the listener. */
    close(go_p[1]);
    for (int p = 0; p <= SENDER_PROCS; p++)
        waitpid(snd[p], NULL, 0);
    kill(lst, SIGKILL);
    waitpid(lst, NULL, 0);
    close(addr_p[0]);
    close(got_p[0]);
    assert_int_equal(got, 1 + n);
    assert_true(fds_per <= FDS_PER_CONN_MAX);
    assert_true(kib_per <= KIB_PER_CONN_MAX);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_listener_with_256_connections),
    };
    signal(SIGPIPE, SIG_IGN);
    return cmocka_run_group_tests(tests, NULL, NULL);
}
