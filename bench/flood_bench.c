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
 * With --job, a whole job instead: --groups G one-process groups of a
 * strict job (real etcd, the steady path) take --steps steps three times:
 * with no flood; while the flooder holds --conns connections to a decoy (a
 * transfer endpoint outside the job, in a process of its own: the flood's
 * cost to the host's cores, which a machine with cores to spare does not
 * pay); and while it holds them spread over every group's transfer
 * endpoint (opened after the groups' warm-up, re-opened as the groups
 * close them). The step time (median, p99), the steady path's fallbacks to
 * etcd, the heals and the steps taken again, side by side: the flood on
 * the job is judged against the flood on the decoy.
 *
 *   flood_bench --job [--groups G] [--steps N] [--conns N] [--json]
 *
 * With --json the last line is one JSON object with every figure.
 */
#include "bench_args.h"
#include "bench_stats.h"
#include "etcd_fixture.h"

#include <graft/graft.h>
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

/* The flooder's connections: one that the donor closed is opened again,
 * as a flood would. */
#define MAX_ADDRS 16
#define MAX_CONNS 4096
typedef struct flood_conn {
    ucp_ep_h ep;
    int addr;
    bool failed;
} flood_conn_t;

static void flood_err_cb(void *arg, ucp_ep_h ep, ucs_status_t status)
{
    (void)ep, (void)status;
    ((flood_conn_t *)arg)->failed = true;
}

/* Whatever the donor says (its challenge): ignored. */
static ucs_status_t flood_ignore_cb(void *arg, const void *header, size_t header_length,
                                       void *data, size_t length,
                                       const ucp_am_recv_param_t *param)
{
    (void)arg, (void)header, (void)header_length, (void)data, (void)length, (void)param;
    return UCS_OK;
}

static bool flood_connect(ucp_worker_h w, const struct sockaddr_in *sa, flood_conn_t *c)
{
    ucp_ep_params_t prm = {.field_mask = UCP_EP_PARAM_FIELD_FLAGS | UCP_EP_PARAM_FIELD_SOCK_ADDR |
                                         UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE |
                                         UCP_EP_PARAM_FIELD_ERR_HANDLER,
                           .flags = UCP_EP_PARAMS_FLAGS_CLIENT_SERVER,
                           .sockaddr = {.addr = (const struct sockaddr *)sa,
                                        .addrlen = sizeof(*sa)},
                           .err_mode = UCP_ERR_HANDLING_MODE_PEER,
                           .err_handler = {.cb = flood_err_cb, .arg = c}};
    c->failed = false;
    return ucp_ep_create(w, &prm, &c->ep) == UCS_OK;
}

static bool parse_addr(const char *addr, struct sockaddr_in *sa)
{
    char host[64];
    const char *colon = strrchr(addr, ':');
    if (colon == NULL)
        return false;
    memset(sa, 0, sizeof(*sa));
    sa->sin_family = AF_INET;
    snprintf(host, sizeof(host), "%.*s", (int)(colon - addr), addr);
    sa->sin_port = htons((uint16_t)atoi(colon + 1));
    return inet_pton(AF_INET, host, &sa->sin_addr) == 1;
}

static bool cmd_closed(int cmd)
{
    fd_set s;
    FD_ZERO(&s);
    FD_SET(cmd, &s);
    struct timeval tv = {0, 0};
    return select(cmd + 1, &s, NULL, NULL, &tv) > 0;
}

/* The flooder: @conns connections spread over @n_addrs addresses that
 * never send anything, kept progressing (and opened again when closed)
 * until @cmd closes; writes one byte once they are made. */
static int flooder_main(char (*addrs)[64], int n_addrs, int conns, int cmd, int resp)
{
    ucp_config_t *cfg = NULL;
    ucp_context_h ctx;
    ucp_worker_h w;
    ucp_params_t p = {.field_mask = UCP_PARAM_FIELD_FEATURES, .features = UCP_FEATURE_AM};
    ucp_worker_params_t wp = {.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE,
                              .thread_mode = UCS_THREAD_MODE_SINGLE};
    struct sockaddr_in sa[MAX_ADDRS];
    static flood_conn_t c[MAX_CONNS];
    char go;
    if (!rd(cmd, &go, 1) || n_addrs < 1 || n_addrs > MAX_ADDRS || conns > MAX_CONNS)
        return 1;
    for (int a = 0; a < n_addrs; a++)
        if (!parse_addr(addrs[a], &sa[a]))
            return 1;
    if (ucp_config_read(NULL, NULL, &cfg) != UCS_OK ||
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
        c[i].addr = i % n_addrs;
        if (!flood_connect(w, &sa[c[i].addr], &c[i]))
            return 1;
        ucp_worker_progress(w);
    }
    for (int i = 0; i < 200; i++) {
        ucp_worker_progress(w);
        usleep(1000);
    }
    char one = 1;
    if (!wr(resp, &one, 1))
        return 1;
    while (!cmd_closed(cmd)) {
        struct timespec ts = {0, 2000000};
        ucp_worker_progress(w);
        for (int i = 0; i < conns; i++) {
            if (!c[i].failed)
                continue;
            ucp_request_param_t cp = {.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS,
                                      .flags = UCP_EP_CLOSE_FLAG_FORCE};
            void *req = ucp_ep_close_nbx(c[i].ep, &cp);
            if (UCS_PTR_IS_PTR(req))
                ucp_request_free(req);
            if (!flood_connect(w, &sa[c[i].addr], &c[i]))
                c[i].failed = true;
        }
        nanosleep(&ts, NULL);
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
    return flooder_main(&g_addr, 1, g_conns, cmd, resp);
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

/* -------------------------------------------------------------- the job --- */

#define JOB_WARM 20
#define JOB_MAX_MISSES 50
static const char *g_endpoint;
static char g_job[64];
static char g_job_addrs[MAX_ADDRS][64];
static int g_groups, g_steps;

/* A free loopback port for a group's transfer endpoint, below the
 * ephemeral range: the flood's own connections (and their TIME_WAIT
 * sockets) take ports in it, and one took a group's port between this
 * choice and the group's bind ("Address already in use"; the other group
 * then waited for a quorum for good). Released at once: a bench can live
 * with the race that is left. */
static int free_port(void)
{
    int low = 32768, high = 60999;
    FILE *f = fopen("/proc/sys/net/ipv4/ip_local_port_range", "re");
    if (f != NULL && fscanf(f, "%d %d", &low, &high) != 2)
        low = 32768;
    if (f != NULL)
        fclose(f);
    for (int i = 0; i < 100 && low > 12000; i++) {
        int port = 10000 + rand() % (low - 10000), fd = socket(AF_INET, SOCK_STREAM, 0);
        struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port),
                                 .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
        bool ok = fd >= 0 && bind(fd, (struct sockaddr *)&sa, sizeof(sa)) == 0;
        if (fd >= 0)
            close(fd);
        if (ok)
            return port;
    }
    return -1;
}

/* One committed step of one group, to the parent: when it ended, how long
 * it took, and the group's counts so far. */
typedef struct step_rec {
    double end_s, dt_s;
    uint32_t group, misses;
    uint64_t fallbacks, recoveries;
} step_rec_t;

static graft_runtime_t *job_runtime(int group)
{
    graft_config_t *c = NULL;
    graft_runtime_t *rt = NULL;
    char g[16], n[16];
    snprintf(g, sizeof(g), "%d", group);
    snprintf(n, sizeof(n), "%d", g_groups);
    if (graft_config_create(&c) != GRAFT_OK)
        return NULL;
    bool ok = graft_config_set(c, "job", g_job, NULL) == GRAFT_OK &&
              graft_config_set(c, "etcd_endpoints", g_endpoint, NULL) == GRAFT_OK &&
              graft_config_set(c, "groups", n, NULL) == GRAFT_OK &&
              graft_config_set(c, "group", g, NULL) == GRAFT_OK &&
              graft_config_set(c, "transfer_address", g_job_addrs[group], NULL) == GRAFT_OK &&
              graft_config_set(c, "lease_ttl_ms", "3000", NULL) == GRAFT_OK &&
              graft_config_set(c, "join_timeout_ms", "3000", NULL) == GRAFT_OK &&
              graft_config_set(c, "quorum_timeout_ms", "30000", NULL) == GRAFT_OK;
    if (ok && graft_init(c, &rt) != GRAFT_OK)
        rt = NULL;
    graft_config_destroy(c);
    return rt;
}

/* A group's trainer: strict steps whose update is a function of the
 * committed step; a step not applied is taken again, and counted. After
 * its warm-up it says so on @ready and waits for a byte on @go. */
static int group_main(int group, int fd, int ready, int go)
{
    static uint64_t state[512];
    graft_runtime_t *rt = job_runtime(group);
    graft_region_t r = {"w", GRAFT_REGION_PARAM, 0, GRAFT_DEVICE_HOST, state, sizeof(state), 0, 0};
    if (rt == NULL || graft_region_register(rt, &r) != GRAFT_OK)
        return 1;
    uint32_t misses = 0;
    for (int s = 0; s < g_steps + JOB_WARM; s++) {
        bool apply = false;
        char b = 1;
        if (s == JOB_WARM && (!wr(ready, &b, 1) || !rd(go, &b, 1)))
            return 4;
        double t0 = graft_test_now_s();
        graft_status_t st = graft_quorum(rt, NULL);
        if (st == GRAFT_OK) {
            graft_status_t hst = graft_heal_wait(rt);
            (void)hst; /* a failed heal votes no; the step is taken again */
            st = graft_commit(rt, &apply);
        }
        if (st != GRAFT_OK || !apply) {
            if (++misses > JOB_MAX_MISSES)
                return 2;
            s--;
            continue;
        }
        state[graft_step(rt) % 512]++;
        graft_metrics_t m;
        graft_metrics_get(rt, &m);
        step_rec_t rec = {.end_s = graft_test_now_s(), .dt_s = graft_test_now_s() - t0,
                          .group = (uint32_t)group, .misses = misses,
                          .fallbacks = m.steady_fallbacks, .recoveries = m.recoveries};
        if (s >= JOB_WARM && !wr(fd, &rec, sizeof(rec)))
            return 3;
    }
    graft_destroy(rt);
    return 0;
}

/* The runs of --job: no flood; a flood on a decoy (the same listener in a
 * process of its own, outside the job: what the flood costs the host's
 * cores); a flood on the job's own endpoints. */
enum { RUN_QUIET, RUN_DECOY, RUN_FLOOD, RUN_KINDS };
static const char *const run_names[RUN_KINDS] = {"quiet", "decoy", "flood"};

static int flooder_job_fn(void *arg, int cmd, int resp)
{
    (void)arg;
    return flooder_main(g_job_addrs, g_groups, g_conns, cmd, resp);
}

static int flooder_decoy_fn(void *arg, int cmd, int resp)
{
    (void)arg;
    return flooder_main(&g_addr, 1, g_conns, cmd, resp);
}

typedef struct job_result {
    size_t steps;
    double median_ms, p99_ms;
    uint64_t fallbacks, heals, misses;
    int failed_groups;
} job_result_t;

/* Counts of the window: each group's last record less its first. */
static void job_window(const step_rec_t *first, const step_rec_t *last, job_result_t *res)
{
    for (int g = 0; g < g_groups; g++) {
        if (last[g].end_s == 0)
            continue;
        res->fallbacks += last[g].fallbacks - first[g].fallbacks;
        res->heals += last[g].recoveries - first[g].recoveries;
        res->misses += last[g].misses - first[g].misses;
    }
}

/* Every group past its warm-up (a byte each on @ready), then, but for a
 * quiet run, the flooder holding its connections (to the decoy, started
 * first, or to the groups): the groups go on. */
static void job_release(int ready, int go, int kind, child_t *flooder, child_t *decoy)
{
    char b;
    for (int g = 0; g < g_groups; g++)
        if (!rd(ready, &b, 1))
            return;
    g_mib = 1;
    if (kind == RUN_DECOY &&
        (!child_start(decoy, donor_fn, NULL) || !rd(decoy->resp, g_addr, sizeof(g_addr))))
        fprintf(stderr, "flood_bench: the decoy did not start\n");
    if (kind != RUN_QUIET &&
        (!child_start(flooder, kind == RUN_DECOY ? flooder_decoy_fn : flooder_job_fn, NULL) ||
         !wr(flooder->cmd, "g", 1) || !rd(flooder->resp, &b, 1)))
        fprintf(stderr, "flood_bench: the flooder did not start\n");
    for (int g = 0; g < g_groups; g++)
        if (!wr(go, "g", 1))
            return;
}

/* One run of the job; but for RUN_QUIET, every measured step runs while
 * the flooder holds its connections. */
static int job_run(int kind, job_result_t *res)
{
    static int seq;
    int fds[2], ready[2], go[2];
    pid_t pids[MAX_ADDRS];
    snprintf(g_job, sizeof(g_job), "flood-job-%d-%d", (int)getpid(), seq++);
    if (pipe(fds) != 0 || pipe(ready) != 0 || pipe(go) != 0)
        return -1;
    for (int g = 0; g < g_groups; g++)
        snprintf(g_job_addrs[g], sizeof(g_job_addrs[g]), "127.0.0.1:%d", free_port());
    fflush(stdout);
    for (int g = 0; g < g_groups; g++) {
        pids[g] = fork();
        if (pids[g] == 0) {
            prctl(PR_SET_PDEATHSIG, SIGKILL);
            close(fds[0]);
            _exit(group_main(g, fds[1], ready[1], go[0]));
        }
    }
    close(fds[1]);
    close(ready[1]);
    close(go[0]);
    child_t flooder = {.pid = 0}, decoy = {.pid = 0};
    job_release(ready[0], go[1], kind, &flooder, &decoy);
    size_t cap = (size_t)g_groups * (size_t)g_steps, n = 0;
    double *dt = calloc(cap, sizeof(*dt));
    step_rec_t first[MAX_ADDRS] = {{0}}, last[MAX_ADDRS] = {{0}}, rec;
    while (dt != NULL && rd(fds[0], &rec, sizeof(rec))) {
        if (rec.group >= (uint32_t)g_groups)
            continue;
        if (first[rec.group].end_s == 0)
            first[rec.group] = rec;
        last[rec.group] = rec;
        if (n < cap)
            dt[n++] = rec.dt_s * 1e3;
    }
    close(fds[0]);
    close(ready[0]);
    close(go[1]);
    for (int g = 0; g < g_groups; g++) {
        int ws;
        waitpid(pids[g], &ws, 0);
        res->failed_groups += !WIFEXITED(ws) || WEXITSTATUS(ws) != 0;
    }
    if (flooder.pid > 0)
        child_stop(&flooder);
    if (decoy.pid > 0)
        child_stop(&decoy);
    res->steps = n;
    res->median_ms = graft_test_percentile(dt, n, 0.5);
    res->p99_ms = graft_test_percentile(dt, n, 0.99);
    job_window(first, last, res);
    free(dt);
    return res->failed_groups == 0 && n > 0 ? 0 : -1;
}

static int job_main(int groups, int steps, int conns, bool json)
{
    graft_test_etcd_t etcd;
    job_result_t res[RUN_KINDS];
    if (groups < 2 || groups > MAX_ADDRS || steps < 1)
        return 2;
    g_groups = groups;
    g_steps = steps;
    g_conns = conns;
    srand((unsigned)getpid());
    if (graft_test_etcd_start(&etcd, NULL) != 0)
        return 1;
    g_endpoint = graft_etcd_server_endpoint(etcd.server);
    memset(res, 0, sizeof(res));
    int rc = 0;
    for (int k = 0; k < RUN_KINDS; k++)
        rc |= job_run(k, &res[k]) != 0;
    graft_test_etcd_stop(&etcd);
    printf("flood_bench --job: %d groups (strict, steady path), %d steps each after a warm-up, "
           "with no flood, while a decoy outside the job is flooded, and during a flood\n",
           groups, steps);
    printf("  %-24s %7s %10s %8s %10s %6s %8s %7s\n", "idle connections", "steps", "median ms",
           "p99 ms", "fallbacks", "heals", "retried", "failed");
    for (int i = 0; i < RUN_KINDS; i++) {
        char name[40];
        snprintf(name, sizeof(name), i == RUN_QUIET ? "0" : i == RUN_DECOY ? "%d on a decoy"
                                                                          : "%d on the job", conns);
        printf("  %-24s %7zu %10.3f %8.3f %10llu %6llu %8llu %7d\n", name, res[i].steps,
               res[i].median_ms, res[i].p99_ms, (unsigned long long)res[i].fallbacks,
               (unsigned long long)res[i].heals, (unsigned long long)res[i].misses,
               res[i].failed_groups);
    }
    if (json) {
        printf("{\"bench\":\"flood_job\",\"groups\":%d,\"steps\":%d,\"conns\":%d", groups,
               steps, conns);
        for (int i = 0; i < RUN_KINDS; i++)
            printf(",\"%s\":{\"steps\":%zu,\"median_ms\":%.4f,\"p99_ms\":%.4f,"
                   "\"fallbacks\":%llu,\"heals\":%llu,\"retried\":%llu,\"failed_groups\":%d}",
                   run_names[i], res[i].steps, res[i].median_ms, res[i].p99_ms,
                   (unsigned long long)res[i].fallbacks, (unsigned long long)res[i].heals,
                   (unsigned long long)res[i].misses, res[i].failed_groups);
        printf("}\n");
    }
    return rc;
}

int main(int argc, char **argv)
{
    int runs = 5;
    size_t mib = 64;
    int conns = 1000;
    char tls[32] = "tcp";
    bool json = false, job = false;
    int groups = 2, steps = 40000;
    const graft_bench_arg_t cli[] = {
        GRAFT_BENCH_ARG("job", GRAFT_BENCH_FLAG, &job),
        GRAFT_BENCH_ARG("groups", GRAFT_BENCH_INT, &groups),
        GRAFT_BENCH_ARG("steps", GRAFT_BENCH_INT, &steps),
        GRAFT_BENCH_ARG("mib", GRAFT_BENCH_SIZE, &mib),
        GRAFT_BENCH_ARG("conns", GRAFT_BENCH_INT, &conns),
        GRAFT_BENCH_ARG("runs", GRAFT_BENCH_INT, &runs),
        GRAFT_BENCH_ARG_BUF("tls", tls),
        GRAFT_BENCH_ARG("json", GRAFT_BENCH_FLAG, &json),
    };
    if (graft_bench_args(argc, argv, cli, GRAFT_BENCH_NARGS(cli),
                         "[--mib N] [--conns N] [--runs N] [--tls T] [--json] | --job "
                         "[--groups G] [--steps N] [--conns N] [--json]") != 0)
        return 2;
    if (job) {
        signal(SIGPIPE, SIG_IGN);
        graft_log_level_set(GRAFT_LOG_ERROR);
        return job_main(groups, steps, conns, json);
    }
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
