/*
 * transfer_bench: verified pull throughput of the transfer engine on
 * loopback, beside ucx_perftest (ucp_get and tag_bw, same UCX_TLS, same
 * run), and time-to-recover when a donor dies mid-pull beside a restart
 * from zero.
 *
 *   transfer_bench [--bytes N] [--chunk N] [--reps R] [--window W]
 *                  [--tls tcp,shm] [--read get|push|both]
 *                  [--alloc graft,malloc,cuda|both] [--json]
 *
 * For each transport, read protocol (one-sided get, or donor push) and
 * kind of region memory (malloc, as a trainer's own memory and the
 * default; one block from graft_transfer_host_alloc() on every side; or
 * CUDA device memory on every side, staged through pinned host buffers,
 * in builds with CUDA on a machine with a GPU; "both" is graft,malloc):
 * fork 3 donors holding N bytes (two regions), then pull from 1, 2 and 3
 * of them (median of R runs, hashing on), once from 1
 * with verification off, then run ucx_perftest server+client with the same
 * UCX_TLS for ucp_get and tag_bw (message = chunk size, total = N). Last,
 * pull from 3 donors and SIGKILL one at half way: the time to a verified
 * state is compared with "time until the failure + a full pull from the 2
 * survivors" (what a restart from zero would cost).
 * With --json the last line is one JSON object with every figure.
 */
#include "bench_args.h"
#include "bench_donors.h"
#include "bench_stats.h"
#include "gpu_support.h"

#include <graft/transfer.h>

#include <errno.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define MAX_DONORS 3
#define STEP 1
#define MAX_RESULTS 8

typedef struct cfg {
    uint64_t bytes;
    uint64_t chunk;
    int reps;
    uint32_t window;
    bool json;
    char tls[64];
    char read[16];
    char alloc[32];
} cfg_t;

typedef struct result {
    const char *tls;
    const char *read;
    const char *alloc;
    double pull_gbps[MAX_DONORS];
    double pull_noverify_gbps;
    double perf_get_gbps; /* perftest with peer error handling (-e), as graft runs */
    double perf_tag_gbps;
    double perf_get_plain_gbps; /* perftest without error handling */
    double perf_tag_plain_gbps;
    double recover_s;
    double restart_s;
    double fail_at_s;
} result_t;

typedef struct killer {
    pid_t victim;
    uint64_t at;
    double t0, fired_at;
} killer_t;

static void kill_at(uint64_t done, uint64_t total, void *arg)
{
    killer_t *k = arg;
    (void)total;
    if (k->victim > 0 && done >= k->at) {
        kill(k->victim, SIGKILL);
        k->victim = 0;
        k->fired_at = graft_test_now_s() - k->t0;
        if (getenv("BENCH_TRACE") != NULL)
            fprintf(stderr, "killed donor at %.3f s\n", k->fired_at);
    }
}

static graft_transfer_read_t g_read;

static double pull_once(const cfg_t *c, graft_transfer_endpoint_t *ep, graft_bench_donor_t *d,
                        int k, bool verify, killer_t *killer)
{
    const char *addrs[MAX_DONORS];
    graft_transfer_report_t rep;
    for (int i = 0; i < k; i++)
        addrs[i] = d[i].addr;
    graft_transfer_pull_options_t po = {.donors = addrs,
                                        .n_donors = (size_t)k,
                                        .step = STEP,
                                        .window = c->window,
                                        .stall_timeout_ms = 2000,
                                        .read = g_read,
                                        .skip_verify = !verify};
    if (killer != NULL) {
        po.progress = kill_at;
        po.progress_arg = killer;
        killer->t0 = graft_test_now_s();
    }
    double t0 = graft_test_now_s();
    graft_status_t st = graft_transfer_pull(ep, &po, &rep);
    double t = graft_test_now_s() - t0;
    if (st != GRAFT_OK) {
        fprintf(stderr, "pull from %d donors failed: %s\n", k, graft_status_string(st));
        return -1;
    }
    return t;
}

/* Run ucx_perftest server and client; returns the client's overall MB/s
 * converted to GB/s (perftest's MB is 2^20 bytes), or -1. With @eh both
 * sides create their endpoints with peer error handling (-e), the mode
 * graft's endpoints need to see a donor die; UCX picks its transports by
 * it, so that is the like-for-like figure. */
static double perftest(const cfg_t *c, const char *test, bool eh)
{
    static int port = 23000;
    char cmd[512], line[512];
    double gbps = -1;
    uint64_t iters = c->bytes / c->chunk;
    int p = port++ + (int)(getpid() % 1000);
    if (iters < 8)
        iters = 8;
    pid_t srv = fork();
    if (srv == 0) {
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        snprintf(cmd, sizeof(cmd), "exec ucx_perftest -p %d %s >/dev/null 2>&1", p,
                 eh ? "-e" : "");
        execl("/bin/sh", "sh", "-c", cmd, (char *)NULL);
        _exit(127);
    }
    usleep(300000);
    snprintf(cmd, sizeof(cmd),
             "ucx_perftest 127.0.0.1 -p %d -t %s -s %llu -n %llu -w 2 %s 2>/dev/null", p, test,
             (unsigned long long)c->chunk, (unsigned long long)iters, eh ? "-e" : "");
    FILE *f = popen(cmd, "r");
    if (f != NULL) {
        while (fgets(line, sizeof(line), f) != NULL) {
            double v[7];
            if (sscanf(line, "Final: %lf %lf %lf %lf %lf %lf %lf", &v[0], &v[1], &v[2], &v[3],
                       &v[4], &v[5], &v[6]) == 7)
                gbps = v[5] * 1048576.0 / 1e9;
        }
        pclose(f);
    }
    kill(srv, SIGTERM);
    waitpid(srv, NULL, 0);
    return gbps;
}

/* Whether @name is one of the comma-separated items of @list. */
static bool in_list(const char *list, const char *name)
{
    size_t n = strlen(name);
    for (const char *p = list; (p = strstr(p, name)) != NULL; p += n)
        if ((p == list || p[-1] == ',') && (p[n] == '\0' || p[n] == ','))
            return true;
    return false;
}

static double best_of(double a, double b)
{
    return a > b ? a : b;
}

static int run_tls(const cfg_t *c, const char *name, const char *read, const char *alloc,
                   result_t *res)
{
    graft_bench_donor_t d[MAX_DONORS] = {0};
    void *mem[2] = {0};
    graft_transfer_endpoint_t *ep = NULL;
    double t[32];
    int rc = -1;

    /* BENCH_SHM_TLS overrides what "shm" means, for experiments. */
    const char *shm = getenv("BENCH_SHM_TLS") != NULL ? getenv("BENCH_SHM_TLS") : "sm,self,tcp";
    setenv("UCX_TLS", strcmp(name, "shm") == 0 ? shm : name, 1);
    res->tls = name;
    res->read = read;
    res->alloc = alloc;
    g_read = strcmp(read, "push") == 0 ? GRAFT_TRANSFER_READ_PUSH : GRAFT_TRANSFER_READ_GET;
    graft_bench_state_t bs = {.bytes = c->bytes,
                              .chunk = c->chunk,
                              .step = STEP,
                              .host_alloc = strcmp(alloc, "graft") == 0,
                              .cuda = strcmp(alloc, "cuda") == 0};
    if (graft_bench_donors_start(&bs, d, MAX_DONORS, NULL, NULL) != 0)
        goto out;
    ep = graft_bench_endpoint(&bs, NULL, false, mem);
    if (ep == NULL)
        goto out;
    /* Warm-up: connections, registration caches, page faults. */
    if (pull_once(c, ep, d, 1, true, NULL) < 0)
        goto out;
    for (int k = 1; k <= MAX_DONORS; k++) {
        for (int r = 0; r < c->reps; r++) {
            t[r] = pull_once(c, ep, d, k, true, NULL);
            if (t[r] < 0)
                goto out;
        }
        res->pull_gbps[k - 1] = (double)c->bytes / graft_test_median(t, (size_t)c->reps) / 1e9;
    }
    for (int r = 0; r < c->reps; r++) {
        t[r] = pull_once(c, ep, d, 1, false, NULL);
        if (t[r] < 0)
            goto out;
    }
    res->pull_noverify_gbps = (double)c->bytes / graft_test_median(t, (size_t)c->reps) / 1e9;

    res->perf_get_gbps = perftest(c, "ucp_get", true);
    res->perf_tag_gbps = perftest(c, "tag_bw", true);
    res->perf_get_plain_gbps = perftest(c, "ucp_get", false);
    res->perf_tag_plain_gbps = perftest(c, "tag_bw", false);

    /* Recovery: restart-from-zero baseline = full pull from 2 donors. */
    double full2 = res->pull_gbps[1] > 0 ? (double)c->bytes / (res->pull_gbps[1] * 1e9) : 0;
    killer_t k = {.victim = d[2].pid, .at = c->bytes / 2};
    double tr = pull_once(c, ep, d, 3, true, &k);
    if (tr < 0)
        goto out;
    waitpid(d[2].pid, NULL, 0);
    d[2].pid = 0;
    close(d[2].cmd_fd);
    res->recover_s = tr;
    res->fail_at_s = k.fired_at;
    res->restart_s = k.fired_at + full2;
    rc = 0;
out:
    graft_transfer_endpoint_destroy(ep);
    graft_bench_mem_free(&bs, mem);
    graft_bench_donors_stop(d, MAX_DONORS);
    return rc;
}

int main(int argc, char **argv)
{
    cfg_t c = {.bytes = 1ull << 30, .chunk = 4u << 20, .reps = 3, .window = 4};
    result_t res[MAX_RESULTS];
    int n_res = 0;
    const graft_bench_arg_t cli[] = {
        GRAFT_BENCH_ARG("bytes", GRAFT_BENCH_U64, &c.bytes),
        GRAFT_BENCH_ARG("chunk", GRAFT_BENCH_U64, &c.chunk),
        GRAFT_BENCH_ARG("reps", GRAFT_BENCH_INT, &c.reps),
        GRAFT_BENCH_ARG("window", GRAFT_BENCH_U32, &c.window),
        GRAFT_BENCH_ARG_BUF("tls", c.tls),
        GRAFT_BENCH_ARG("json", GRAFT_BENCH_FLAG, &c.json),
        GRAFT_BENCH_ARG_BUF("read", c.read),
        GRAFT_BENCH_ARG_BUF("alloc", c.alloc),
    };

    snprintf(c.tls, sizeof(c.tls), "tcp,shm");
    snprintf(c.read, sizeof(c.read), "both");
    snprintf(c.alloc, sizeof(c.alloc), "malloc");
    if (graft_bench_args(argc, argv, cli, GRAFT_BENCH_NARGS(cli),
                         "[--bytes N] [--chunk N] [--reps R] [--window W] [--tls tcp,shm] "
                         "[--read get|push|both] [--alloc graft,malloc,cuda|both] [--json]") != 0)
        return 2;
    if (strcmp(c.alloc, "both") == 0)
        snprintf(c.alloc, sizeof(c.alloc), "graft,malloc");
    static const char *allocs[3] = {"graft", "malloc", "cuda"};
    int n_alloc = 0;
    for (int a = 0; a < 3; a++)
        n_alloc += in_list(c.alloc, allocs[a]);
    if (c.bytes < 2 * c.chunk || c.chunk == 0 || c.reps < 1 || c.reps > 32 || c.window == 0 ||
        n_alloc == 0) {
        fprintf(stderr, "bad arguments\n");
        return 2;
    }
    if (in_list(c.alloc, "cuda")) {
        /* Its recipient uses CUDA in this process, which then cannot fork
         * the donors of another run. */
        if (strchr(c.tls, ',') != NULL || strcmp(c.read, "both") == 0) {
            fprintf(stderr, "transfer_bench: --alloc cuda takes one --tls and one --read\n");
            return 2;
        }
        if (graft_test_gpu_count() == 0) {
            fprintf(stderr, "transfer_bench: --alloc cuda needs a build with CUDA and a visible "
                            "GPU\n");
            return 2;
        }
    }
    signal(SIGPIPE, SIG_IGN);

    /* By kind of memory, CUDA last: donors are forked processes, and a
     * process that has used CUDA cannot fork usable ones. */
    static char names[MAX_RESULTS][16];
    static const char *reads[2] = {"get", "push"};
    for (int a = 0; a < 3; a++) {
        if (!in_list(c.alloc, allocs[a]))
            continue;
        char tls_list[64];
        snprintf(tls_list, sizeof(tls_list), "%s", c.tls);
        for (char *save = NULL, *tok = strtok_r(tls_list, ",", &save); tok != NULL;
             tok = strtok_r(NULL, ",", &save)) {
            for (int r = 0; r < 2 && n_res < MAX_RESULTS; r++) {
                if (strcmp(c.read, "both") != 0 && strcmp(c.read, reads[r]) != 0)
                    continue;
                memset(&res[n_res], 0, sizeof(res[n_res]));
                snprintf(names[n_res], sizeof(names[n_res]), "%s", tok);
                if (run_tls(&c, names[n_res], reads[r], allocs[a], &res[n_res]) != 0) {
                    fprintf(stderr, "transport %s (%s, %s memory) failed\n", tok, reads[r],
                            allocs[a]);
                    return 1;
                }
                n_res++;
            }
        }
    }

    printf("transfer_bench: %.0f MiB state, %llu KiB chunks, window %u, median of %d\n",
           (double)c.bytes / 1048576, (unsigned long long)(c.chunk >> 10), c.window, c.reps);
    printf("perftest -e: endpoints with peer error handling, as graft's; plain: without\n");
    printf("%-5s %-4s %-6s %9s %9s %9s %11s %12s %12s %10s %12s %12s %10s %9s %9s\n", "tls",
           "read", "memory", "1 donor", "2 donors", "3 donors", "1 no-hash", "get -e", "tag_bw -e", "1d/best-e",
           "get plain", "tag plain", "1d/best", "recover", "restart");
    for (int i = 0; i < n_res; i++) {
        result_t *r = &res[i];
        double best_eh = best_of(r->perf_get_gbps, r->perf_tag_gbps);
        double best = best_of(r->perf_get_plain_gbps, r->perf_tag_plain_gbps);
        printf("%-5s %-4s %-6s %7.2f GB/s %5.2f GB/s %5.2f GB/s %7.2f GB/s %8.2f GB/s %8.2f GB/s %9.2fx "
               "%8.2f GB/s %8.2f GB/s %9.2fx %7.3f s %7.3f s\n",
               r->tls, r->read, r->alloc, r->pull_gbps[0], r->pull_gbps[1], r->pull_gbps[2],
               r->pull_noverify_gbps, r->perf_get_gbps, r->perf_tag_gbps,
               best_eh > 0 ? r->pull_gbps[0] / best_eh : 0, r->perf_get_plain_gbps,
               r->perf_tag_plain_gbps, best > 0 ? r->pull_gbps[0] / best : 0, r->recover_s,
               r->restart_s);
    }
    if (c.json) {
        printf("{\"bench\":\"transfer\",\"bytes\":%llu,\"chunk\":%llu,\"window\":%u,\"reps\":%d,"
               "\"results\":[",
               (unsigned long long)c.bytes, (unsigned long long)c.chunk, c.window, c.reps);
        for (int i = 0; i < n_res; i++) {
            result_t *r = &res[i];
            double best_eh = best_of(r->perf_get_gbps, r->perf_tag_gbps);
            double best = best_of(r->perf_get_plain_gbps, r->perf_tag_plain_gbps);
            printf("%s{\"tls\":\"%s\",\"read\":\"%s\",\"alloc\":\"%s\",\"pull_gbps\":[%.3f,%.3f,%.3f],\"pull_noverify_gbps\":%.3f,"
                   "\"perftest_ucp_get_gbps\":%.3f,\"perftest_tag_bw_gbps\":%.3f,"
                   "\"ratio_vs_best_perftest\":%.3f,"
                   "\"perftest_plain_ucp_get_gbps\":%.3f,\"perftest_plain_tag_bw_gbps\":%.3f,"
                   "\"ratio_vs_best_plain_perftest\":%.3f,\"recover_s\":%.3f,\"fail_at_s\":%.3f,"
                   "\"restart_from_zero_s\":%.3f}",
                   i ? "," : "", r->tls, r->read, r->alloc, r->pull_gbps[0], r->pull_gbps[1], r->pull_gbps[2],
                   r->pull_noverify_gbps, r->perf_get_gbps, r->perf_tag_gbps,
                   best_eh > 0 ? r->pull_gbps[0] / best_eh : 0, r->perf_get_plain_gbps,
                   r->perf_tag_plain_gbps, best > 0 ? r->pull_gbps[0] / best : 0, r->recover_s,
                   r->fail_at_s, r->restart_s);
        }
        printf("]}\n");
    }
    return 0;
}
