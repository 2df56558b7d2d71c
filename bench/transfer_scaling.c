/*
 * transfer_scaling: multi-donor scaling of a verified pull over shaped links.
 *
 *   transfer_scaling [--bytes N] [--chunk N] [--reps R] [--window W]
 *                    [--rate 1gbit] [--donors 1,2,4] [--read push|get]
 *                    [--script scripts/netns.sh] [--json]
 *
 * scripts/netns.sh builds a star of network namespaces: the recipient in the
 * hub (NAME-0, on the bridge, unshaped) and each donor in its own namespace
 * behind a veth link shaped with tc to RATE in both directions. Donors are
 * forked, enter their namespace with setns() and serve N bytes (two
 * regions) over UCX_TLS=tcp on their namespace's address; the recipient (this
 * process, moved into the hub) pulls the state striped over 1, 2 and 4
 * donors, median of R runs each, hashing on. The figure is the speed-up over
 * one donor beside the goal 0.85 x k, both from this run. Without root (or
 * without "ip netns") it prints "skipped" and exits 0.
 * With --json the last line is one JSON object with every figure.
 */
#include "bench_args.h"
#include "bench_donors.h"
#include "bench_stats.h"

#include <graft/transfer.h>

#include <errno.h>
#include <fcntl.h>
#include <sched.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mount.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define MAX_DONORS 8
#define MAX_ROWS 8
#define STEP 1

typedef struct cfg {
    uint64_t bytes;
    uint64_t chunk;
    int reps;
    uint32_t window;
    bool json;
    char rate[32];
    char read[8];
    const char *script;
    int rows[MAX_ROWS];
    int n_rows;
    int max_donors;
} cfg_t;

/* The namespaces' name, for the exit and signal handlers' teardown. */
static char g_name[32];
static const char *g_script;
static pid_t g_owner; /* the process that made them; only it tears down */

/* Run the namespace script; returns its exit status (-1: could not run). */
static int script(const char *verb, const char *a1, const char *a2)
{
    pid_t pid = fork();
    if (pid < 0)
        return -1;
    if (pid == 0) {
        execl("/bin/sh", "sh", g_script, verb, g_name, a1, a2, (char *)NULL);
        _exit(127);
    }
    int st;
    while (waitpid(pid, &st, 0) < 0)
        if (errno != EINTR)
            return -1;
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

static void teardown(void)
{
    if (g_owner != 0 && getpid() == g_owner)
        (void)script("down", NULL, NULL);
}

static void on_signal(int sig)
{
    teardown();
    signal(sig, SIG_DFL);
    raise(sig);
}

static int enter_ns(int index)
{
    char path[128];
    snprintf(path, sizeof(path), "/var/run/netns/%s-%d", g_name, index);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        fprintf(stderr, "open %s: %s\n", path, strerror(errno));
        return -1;
    }
    int rc = setns(fd, CLONE_NEWNET);
    if (rc != 0)
        fprintf(stderr, "setns %s: %s\n", path, strerror(errno));
    close(fd);
    /* UCX finds network devices in /sys/class/net, which shows the
     * namespace of whoever mounted /sys: mount a sysfs of this namespace in
     * a private mount namespace, as "ip netns exec" does. */
    if (rc == 0 && (unshare(CLONE_NEWNS) != 0 ||
                    mount("", "/", NULL, MS_SLAVE | MS_REC, NULL) != 0 ||
                    umount2("/sys", MNT_DETACH) != 0 ||
                    mount(path + 15, "/sys", "sysfs", 0, NULL) != 0)) {
        fprintf(stderr, "private /sys for %s: %s\n", path, strerror(errno));
        rc = -1;
    }
    return rc;
}

/* In each donor, before it serves: its own namespace, device and address
 * (donor i is namespace i + 1, 10.77.0.<i + 2>). */
static const char *donor_setup(int index, void *arg, bool *failed_p)
{
    static char listen[32];
    (void)arg;
    if (enter_ns(index + 1) != 0) {
        *failed_p = true;
        return NULL;
    }
    /* A UCX_NET_DEVICES from outside (e.g. "lo") names nothing useful here. */
    setenv("UCX_NET_DEVICES", "eth0", 1);
    snprintf(listen, sizeof(listen), "10.77.0.%d", index + 2);
    return listen;
}

static double pull_once(const cfg_t *c, graft_transfer_endpoint_t *ep, graft_bench_donor_t *d,
                        int k)
{
    const char *addrs[MAX_DONORS];
    graft_transfer_report_t rep;
    for (int i = 0; i < k; i++)
        addrs[i] = d[i].addr;
    graft_transfer_pull_options_t po = {
        .donors = addrs,
        .n_donors = (size_t)k,
        .step = STEP,
        .window = c->window,
        .stall_timeout_ms = 10000,
        .connect_timeout_ms = 10000,
        .read = strcmp(c->read, "get") == 0 ? GRAFT_TRANSFER_READ_GET : GRAFT_TRANSFER_READ_PUSH};
    double t0 = graft_test_now_s();
    graft_status_t st = graft_transfer_pull(ep, &po, &rep);
    double t = graft_test_now_s() - t0;
    if (st != GRAFT_OK) {
        fprintf(stderr, "pull from %d donors failed: %s\n", k, graft_status_string(st));
        return -1;
    }
    return t;
}

static int parse_rows(cfg_t *c, const char *s)
{
    char buf[64];
    snprintf(buf, sizeof(buf), "%s", s);
    c->n_rows = 0;
    c->max_donors = 0;
    for (char *save = NULL, *tok = strtok_r(buf, ",", &save); tok != NULL;
         tok = strtok_r(NULL, ",", &save)) {
        char *end;
        long k = strtol(tok, &end, 10);
        if (*end != '\0' || k < 1 || k > MAX_DONORS || c->n_rows == MAX_ROWS)
            return -1;
        c->rows[c->n_rows++] = (int)k;
        if (k > c->max_donors)
            c->max_donors = (int)k;
    }
    return c->n_rows > 0 && c->rows[0] == 1 ? 0 : -1;
}

/* --donors for graft_bench_args(). */
static int donors_arg(void *c, const char *value)
{
    if (parse_rows(c, value) == 0)
        return 0;
    fprintf(stderr, "--donors: a list like 1,2,4 starting at 1 (at most %d)\n", MAX_DONORS);
    return -1;
}

static void print_skipped(const cfg_t *c, const char *why)
{
    printf("transfer_scaling: skipped: %s\n", why);
    if (c->json)
        printf("{\"bench\":\"transfer_scaling\",\"skipped\":\"%s\"}\n", why);
}

int main(int argc, char **argv)
{
    cfg_t c = {.bytes = 512ull << 20, .chunk = 4u << 20, .reps = 3, .window = 4,
               .script = "scripts/netns.sh"};
    graft_bench_donor_t d[MAX_DONORS] = {0};
    void *mem[2] = {0};
    graft_transfer_endpoint_t *ep = NULL;
    double gbps[MAX_ROWS] = {0}, secs[MAX_ROWS] = {0};
    int rc = 1;
    const graft_bench_arg_t cli[] = {
        GRAFT_BENCH_ARG("bytes", GRAFT_BENCH_U64, &c.bytes),
        GRAFT_BENCH_ARG("chunk", GRAFT_BENCH_U64, &c.chunk),
        GRAFT_BENCH_ARG("reps", GRAFT_BENCH_INT, &c.reps),
        GRAFT_BENCH_ARG("window", GRAFT_BENCH_U32, &c.window),
        GRAFT_BENCH_ARG_BUF("rate", c.rate),
        GRAFT_BENCH_ARG_FN("donors", &c, donors_arg),
        GRAFT_BENCH_ARG_BUF("read", c.read),
        GRAFT_BENCH_ARG("script", GRAFT_BENCH_STR, &c.script),
        GRAFT_BENCH_ARG("json", GRAFT_BENCH_FLAG, &c.json),
    };

    snprintf(c.rate, sizeof(c.rate), "1gbit");
    snprintf(c.read, sizeof(c.read), "push");
    (void)parse_rows(&c, "1,2,4");
    if (graft_bench_args(argc, argv, cli, GRAFT_BENCH_NARGS(cli),
                         "[--bytes N] [--chunk N] [--reps R] [--window W] [--rate 1gbit] "
                         "[--donors 1,2,4] [--read push|get] [--script scripts/netns.sh] "
                         "[--json]") != 0)
        return 2;
    if (c.bytes < 2 * c.chunk || c.chunk == 0 || c.reps < 1 || c.reps > 32 || c.window == 0 ||
        (strcmp(c.read, "push") != 0 && strcmp(c.read, "get") != 0)) {
        fprintf(stderr, "bad arguments\n");
        return 2;
    }
    if (geteuid() != 0) {
        print_skipped(&c, "needs root for network namespaces");
        return 0;
    }
    g_script = c.script;
    snprintf(g_name, sizeof(g_name), "gscale%ld", (long)getpid());
    signal(SIGPIPE, SIG_IGN);
    signal(SIGINT, on_signal);
    signal(SIGTERM, on_signal);
    signal(SIGHUP, on_signal);
    atexit(teardown);

    char kbuf[16];
    snprintf(kbuf, sizeof(kbuf), "%d", c.max_donors);
    g_owner = getpid();
    int up = script("up", kbuf, c.rate);
    if (up != 0) {
        print_skipped(&c, up == 2 ? "needs root for network namespaces (ip netns)"
                                  : "network namespaces could not be made");
        return 0;
    }
    setenv("UCX_TLS", "tcp", 1);
    graft_bench_state_t bs = {.bytes = c.bytes, .chunk = c.chunk, .step = STEP};
    if (graft_bench_donors_start(&bs, d, c.max_donors, donor_setup, NULL) != 0) {
        fprintf(stderr, "donors failed to start\n");
        goto out;
    }
    /* The recipient is this process, in the hub; the donors were forked
     * before any UCX state existed here. */
    if (enter_ns(0) != 0)
        goto out;
    setenv("UCX_NET_DEVICES", "br0", 1);
    ep = graft_bench_endpoint(&bs, "10.77.0.1", false, mem);
    if (ep == NULL)
        goto out;
    /* Warm-up over every link: connections, page faults of the regions. */
    if (pull_once(&c, ep, d, c.max_donors) < 0)
        goto out;
    for (int row = 0; row < c.n_rows; row++) {
        double t[32];
        for (int r = 0; r < c.reps; r++)
            if ((t[r] = pull_once(&c, ep, d, c.rows[row])) < 0)
                goto out;
        secs[row] = graft_test_median(t, (size_t)c.reps);
        gbps[row] = (double)c.bytes * 8 / secs[row] / 1e9;
    }
    rc = 0;

    printf("transfer_scaling: %.0f MiB state, %llu KiB chunks, window %u, read %s, UCX_TLS=tcp, "
           "each donor link %s, median of %d\n",
           (double)c.bytes / 1048576, (unsigned long long)(c.chunk >> 10), c.window, c.read,
           c.rate, c.reps);
    printf("%-7s %9s %14s %9s %10s %5s\n", "donors", "seconds", "throughput", "speed-up",
           "goal", "met");
    for (int row = 0; row < c.n_rows; row++) {
        double sp = gbps[row] / gbps[0], goal = 0.85 * c.rows[row];
        printf("%-7d %9.2f %8.3f Gbit/s %8.2fx %9.2fx %5s\n", c.rows[row], secs[row], gbps[row],
               sp, goal, sp >= goal ? "yes" : "no");
    }
    if (c.json) {
        printf("{\"bench\":\"transfer_scaling\",\"bytes\":%llu,\"chunk\":%llu,\"window\":%u,"
               "\"read\":\"%s\",\"tls\":\"tcp\",\"rate\":\"%s\",\"reps\":%d,\"rows\":[",
               (unsigned long long)c.bytes, (unsigned long long)c.chunk, c.window, c.read, c.rate,
               c.reps);
        for (int row = 0; row < c.n_rows; row++) {
            double sp = gbps[row] / gbps[0], goal = 0.85 * c.rows[row];
            printf("%s{\"donors\":%d,\"seconds\":%.3f,\"gbit_s\":%.3f,\"speedup\":%.3f,"
                   "\"goal\":%.3f,\"met\":%s}",
                   row ? "," : "", c.rows[row], secs[row], gbps[row], sp, goal,
                   sp >= goal ? "true" : "false");
        }
        printf("]}\n");
    }
out:
    graft_transfer_endpoint_destroy(ep);
    graft_bench_mem_free(&bs, mem);
    graft_bench_donors_stop(d, c.max_donors);
    teardown();
    g_owner = 0;
    return rc;
}
