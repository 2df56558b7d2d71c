/*
 * flood_bench: what a flood of idle, unauthenticated connections costs a
 * donor. One donor process serves --mib MiB; a recipient pulls it --runs
 * times with no flood, then again while a flooder process (a UCX client of
 * its own, never sending a request) holds --conns connections open to the
 * donor's listener, side by side in one run. Prints the pull times
 * (median, worst), failed pulls, and the donor's descriptors and memory.
 *
 *   flood_bench [--mib N] [--conns N] [--runs N] [--tls T] [--json]
 *
 * With --json the last line is one JSON object with every figure.
 */
#include "bench_args.h"
#include "bench_stats.h"

#include <graft/transfer.h>

#include <arpa/inet.h>
#include <dirent.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <ucp/api/ucp.h>

#define SECRET "flood-bench-job-secret-0123456789"
#define STEP 7
#define MAX_RUNS 64

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static bool rd(int fd, void *buf, size_t n)
{
    for (size_t got = 0; got < n;) {
        ssize_t r = read(fd, (char *)buf + got, n - got);
        if (r <= 0)
            return false;
        got += (size_t)r;
    }
    return true;
}

static bool wr(int fd, const void *buf, size_t n)
{
    return write(fd, buf, n) == (ssize_t)n;
}

static uint64_t fd_count(void)
{
    uint64_t n = 0;
    DIR *d = opendir("/proc/self/fd");
    for (struct dirent *e = d != NULL ? readdir(d) : NULL; e != NULL; e = readdir(d))
        n += e->d_name[0] != '.';
    if (d != NULL)
        closedir(d);
    return n;
}

static uint64_t rss_mib(void)
{
    unsigned long size = 0, rss = 0;
    FILE *f = fopen("/proc/self/statm", "r");
    if (f != NULL && fscanf(f, "%lu %lu", &size, &rss) != 2)
        rss = 0;
    if (f != NULL)
        fclose(f);
    return (uint64_t)rss * (uint64_t)sysconf(_SC_PAGESIZE) >> 20;
}

/* The donor: writes its address, then answers each byte on @cmd with its
 * descriptors and RSS; exits when @cmd closes. */
static int donor_main(size_t mib, int cmd, int resp)
{
    graft_transfer_config_t cfg = {.job_secret = SECRET, .job_secret_len = sizeof(SECRET) - 1,
                                   .group = 1};
    graft_transfer_endpoint_t *ep = NULL;
    uint8_t *mem = malloc(mib << 20);
    char addr[64] = {0};
    if (mem == NULL || graft_transfer_endpoint_create(&cfg, &ep) != GRAFT_OK)
        return 1;
    memset(mem, 0x5c, mib << 20);
    graft_transfer_region_t r = {.name = "state", .kind = GRAFT_TRANSFER_REGION_PARAM,
                                 .ptr = mem, .bytes = mib << 20};
    if (graft_transfer_region_register(ep, &r) != GRAFT_OK ||
        graft_transfer_serve_begin(ep, STEP) != GRAFT_OK)
        return 1;
    snprintf(addr, sizeof(addr), "%s", graft_transfer_endpoint_address(ep));
    if (!wr(resp, addr, sizeof(addr)))
        return 1;
    char c;
    while (rd(cmd, &c, 1)) {
        uint64_t out[2] = {fd_count(), rss_mib()};
        if (!wr(resp, out, sizeof(out)))
            break;
    }
    if (graft_transfer_serve_end(ep) != GRAFT_OK)
        fprintf(stderr, "flood_bench: serve_end failed\n");
    graft_transfer_endpoint_destroy(ep);
    free(mem);
    return 0;
}

static void flood_err_cb(void *arg, ucp_ep_h ep, ucs_status_t status)
{
    (void)arg, (void)ep, (void)status;
}

/* Whatever the donor says (its challenge): ignored. */
static ucs_status_t flood_ignore_cb(void *arg, const void *header, size_t header_length,
                                       void *data, size_t length,
                                       const ucp_am_recv_param_t *param)
{
    (void)arg, (void)header, (void)header_length, (void)data, (void)length, (void)param;
    return UCS_OK;
}

/* The flooder: @conns connections to @addr that never send anything, kept
 * progressing until @cmd closes; writes one byte once they are made. */
static int flooder_main(const char *addr, int conns, int cmd, int resp)
{
    ucp_config_t *cfg = NULL;
    ucp_context_h ctx;
    ucp_worker_h w;
    ucp_params_t p = {.field_mask = UCP_PARAM_FIELD_FEATURES, .features = UCP_FEATURE_AM};
    ucp_worker_params_t wp = {.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE,
                              .thread_mode = UCS_THREAD_MODE_SINGLE};
    struct sockaddr_in sa = {.sin_family = AF_INET};
    char host[64];
    const char *colon = strrchr(addr, ':');
    char go;
    if (!rd(cmd, &go, 1))
        return 1;
    snprintf(host, sizeof(host), "%.*s", (int)(colon - addr), addr);
    sa.sin_port = htons((uint16_t)atoi(colon + 1));
    if (inet_pton(AF_INET, host, &sa.sin_addr) != 1 || ucp_config_read(NULL, NULL, &cfg) != UCS_OK ||
        ucp_config_modify(cfg, "TLS", "tcp") != UCS_OK || ucp_init(&p, cfg, &ctx) != UCS_OK ||
        ucp_worker_create(ctx, &wp, &w) != UCS_OK)
        return 1;
    ucp_config_release(cfg);
    /* UCX 1.13 crashes on a message with no handler (ucp_am_handler). */
    for (unsigned id = 0; id < 32; id++) {
        ucp_am_handler_param_t hp = {.field_mask = UCP_AM_HANDLER_PARAM_FIELD_ID |
                                                   UCP_AM_HANDLER_PARAM_FIELD_CB,
                                     .id = id,
                                     .cb = flood_ignore_cb};
        if (ucp_worker_set_am_recv_handler(w, &hp) != UCS_OK)
            return 1;
    }
    for (int i = 0; i < conns; i++) {
        ucp_ep_h ep;
        ucp_ep_params_t prm = {.field_mask = UCP_EP_PARAM_FIELD_FLAGS |
                                             UCP_EP_PARAM_FIELD_SOCK_ADDR |
                                             UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE |
                                             UCP_EP_PARAM_FIELD_ERR_HANDLER,
                               .flags = UCP_EP_PARAMS_FLAGS_CLIENT_SERVER,
                               .sockaddr = {.addr = (const struct sockaddr *)&sa,
                                            .addrlen = sizeof(sa)},
                               .err_mode = UCP_ERR_HANDLING_MODE_PEER,
                               .err_handler = {.cb = flood_err_cb}};
        if (ucp_ep_create(w, &prm, &ep) != UCS_OK)
            return 1;
        ucp_worker_progress(w);
    }
    for (int i = 0; i < 200; i++) {
        ucp_worker_progress(w);
        usleep(1000);
    }
    char c = 1;
    if (!wr(resp, &c, 1))
        return 1;
    /* Until told to stop: opens again whatever the donor closed (as a
     * flood would), keeping --conns attempts going. */
    for (;;) {
        struct timespec ts = {0, 2000000};
        ucp_worker_progress(w);
        nanosleep(&ts, NULL);
        fd_set s;
        FD_ZERO(&s);
        FD_SET(cmd, &s);
        struct timeval tv = {0, 0};
        if (select(cmd + 1, &s, NULL, NULL, &tv) > 0)
            break;
    }
    _exit(0);
}

typedef struct child {
    pid_t pid;
    int cmd, resp;
} child_t;

static bool child_start(child_t *c, int (*fn)(void *, int, int), void *arg)
{
    int a[2], b[2];
    if (pipe(a) != 0 || pipe(b) != 0)
        return false;
    c->pid = fork();
    if (c->pid < 0)
        return false;
    if (c->pid == 0) {
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        close(a[1]);
        close(b[0]);
        _exit(fn(arg, a[0], b[1]));
    }
    close(a[0]);
    close(b[1]);
    c->cmd = a[1];
    c->resp = b[0];
    return true;
}

static void child_stop(child_t *c)
{
    int ws;
    close(c->cmd);
    close(c->resp);
    kill(c->pid, SIGKILL);
    waitpid(c->pid, &ws, 0);
}

static size_t g_mib;
static char g_addr[64];
static int g_conns;

static int donor_fn(void *arg, int cmd, int resp)
{
    (void)arg;
    return donor_main(g_mib, cmd, resp);
}

static int flooder_fn(void *arg, int cmd, int resp)
{
    (void)arg;
    return flooder_main(g_addr, g_conns, cmd, resp);
}

typedef struct result {
    double median_s, worst_s;
    int failed;
    uint64_t fds, rss_mib;
} result_t;

static void pulls(graft_transfer_endpoint_t *rep_ep, uint8_t *mem, int runs, child_t *donor,
                  result_t *res)
{
    const char *donors[1] = {g_addr};
    graft_transfer_pull_options_t po = {.donors = donors, .n_donors = 1, .step = STEP,
                                        .timeout_ms = 60000};
    double t[MAX_RUNS];
    res->failed = 0;
    for (int i = 0; i < runs; i++) {
        graft_transfer_report_t rep;
        memset(mem, 0, g_mib << 20);
        double t0 = now_s();
        graft_status_t st = graft_transfer_pull(rep_ep, &po, &rep);
        t[i] = now_s() - t0;
        res->failed += st != GRAFT_OK || mem[(g_mib << 20) - 1] != 0x5c;
    }
    res->median_s = graft_test_median(t, (size_t)runs);
    res->worst_s = 0;
    for (int i = 0; i < runs; i++)
        res->worst_s = t[i] > res->worst_s ? t[i] : res->worst_s;
    char c = 1;
    uint64_t out[2] = {0, 0};
    if (wr(donor->cmd, &c, 1) && rd(donor->resp, out, sizeof(out))) {
        res->fds = out[0];
        res->rss_mib = out[1];
    }
}

int main(int argc, char **argv)
{
    int runs = 5;
    size_t mib = 64;
    int conns = 1000;
    char tls[32] = "tcp";
    bool json = false;
    const graft_bench_arg_t cli[] = {
        GRAFT_BENCH_ARG("mib", GRAFT_BENCH_SIZE, &mib),
        GRAFT_BENCH_ARG("conns", GRAFT_BENCH_INT, &conns),
        GRAFT_BENCH_ARG("runs", GRAFT_BENCH_INT, &runs),
        GRAFT_BENCH_ARG_BUF("tls", tls),
        GRAFT_BENCH_ARG("json", GRAFT_BENCH_FLAG, &json),
    };
    if (graft_bench_args(argc, argv, cli, GRAFT_BENCH_NARGS(cli),
                         "[--mib N] [--conns N] [--runs N] [--tls T] [--json]") != 0)
        return 2;
    if (runs < 1 || runs > MAX_RUNS || mib < 1 || conns < 0)
        return 2;
    signal(SIGPIPE, SIG_IGN);
    setenv("UCX_TLS", tls, 1);
    graft_log_level_set(GRAFT_LOG_ERROR);
    g_mib = mib;
    g_conns = conns;

    child_t donor, flooder;
    if (!child_start(&donor, donor_fn, NULL) || !rd(donor.resp, g_addr, sizeof(g_addr)))
        return 1;
    /* The flooder is forked before this process has UCX state. */
    if (!child_start(&flooder, flooder_fn, NULL))
        return 1;

    graft_transfer_config_t cfg = {.job_secret = SECRET, .job_secret_len = sizeof(SECRET) - 1,
                                   .group = 2};
    graft_transfer_endpoint_t *ep = NULL;
    uint8_t *mem = malloc(mib << 20);
    if (mem == NULL || graft_transfer_endpoint_create(&cfg, &ep) != GRAFT_OK)
        return 1;
    graft_transfer_region_t r = {.name = "state", .kind = GRAFT_TRANSFER_REGION_PARAM,
                                 .ptr = mem, .bytes = mib << 20};
    if (graft_transfer_region_register(ep, &r) != GRAFT_OK)
        return 1;

    result_t res[2];
    pulls(ep, mem, runs, &donor, &res[0]);
    /* The flooder floods on its first byte and answers once it has. */
    char go = 1;
    if (!wr(flooder.cmd, &go, 1) || !rd(flooder.resp, &go, 1))
        fprintf(stderr, "flood_bench: the flooder did not start\n");
    pulls(ep, mem, runs, &donor, &res[1]);
    child_stop(&flooder);

    printf("flood_bench: %zu MiB pulled over %s, %d pulls each, median and worst\n", mib, tls,
           runs);
    printf("  %-28s %10s %10s %8s %10s %10s\n", "idle connections", "median s", "worst s",
           "failed", "donor fds", "donor MiB");
    const char *names[2] = {"0", NULL};
    char flood_name[32];
    snprintf(flood_name, sizeof(flood_name), "%d (unauthenticated)", conns);
    names[1] = flood_name;
    for (int i = 0; i < 2; i++)
        printf("  %-28s %10.3f %10.3f %8d %10llu %10llu\n", names[i], res[i].median_s,
               res[i].worst_s, res[i].failed, (unsigned long long)res[i].fds,
               (unsigned long long)res[i].rss_mib);
    if (json)
        printf("{\"bench\":\"flood\",\"mib\":%zu,\"tls\":\"%s\",\"runs\":%d,\"conns\":%d,"
               "\"quiet\":{\"median_s\":%.4f,\"worst_s\":%.4f,\"failed\":%d,\"fds\":%llu,"
               "\"rss_mib\":%llu},\"flood\":{\"median_s\":%.4f,\"worst_s\":%.4f,\"failed\":%d,"
               "\"fds\":%llu,\"rss_mib\":%llu}}\n",
               mib, tls, runs, conns, res[0].median_s, res[0].worst_s, res[0].failed,
               (unsigned long long)res[0].fds, (unsigned long long)res[0].rss_mib,
               res[1].median_s, res[1].worst_s, res[1].failed, (unsigned long long)res[1].fds,
               (unsigned long long)res[1].rss_mib);
    graft_transfer_endpoint_destroy(ep);
    free(mem);
    child_stop(&donor);
    return res[0].failed + res[1].failed > 0 ? 1 : 0;
}
