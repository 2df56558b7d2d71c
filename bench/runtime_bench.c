/*
 * runtime_bench: what the step protocol costs and how fast a group comes
 * back, each figure beside the comparison it is judged by, measured in the
 * same run (real etcd, real UCX on loopback, one process per group):
 *
 *  1. steady state: graft_quorum() + graft_commit() per step, median and
 *     p99 over every group's steps, at 2, 8 and 32 groups (goal: median
 *     <= 2 ms at 8), beside a bare etcd put round trip measured in the same
 *     run (the floor for one write), the two calls' medians apart, and
 *     etcd's CPU time per step (from /proc/<pid>/stat of the embedded etcd);
 *  2. recovery: 3 groups in strict mode, one killed (SIGKILL) and its
 *     successor (tests/support/bench_recovery.h): a process started at
 *     once, as an orchestrator would; a standby spare, the dead rank
 *     evicted; the spare without the eviction (the lease lapses); a follow
 *     spare (it pulls every step while it waits), evicted and not; kill ->
 *     first committed step of the successor, split into detect (kill ->
 *     joined), quorum, transfer (the verified pull) and verify (a
 *     fingerprint of the healed state), for 64 MiB of state (and 1 GiB
 *     with --big), each beside the respawn's total;
 *  3. the same state restored from its own persistent checkpoint in the
 *     same run (graft_persist_restore, page cache dropped with
 *     posix_fadvise first) vs the P2P transfer (goal: P2P >= 4x faster);
 *  4. with a follow successor: what the follower costs its donor, the
 *     donor's median step with and without one follow spare (40 steps of 2
 *     and of 100 ms of compute), its commit's wait for the follower per
 *     step, the share of its steps it served, and of them the follower
 *     pulled.
 *
 * Usage: runtime_bench [--groups LIST] [--steps N] [--mib N] [--big] [--steady-only]
 *                      [--successor respawn,spare,spare-lapse,follow,follow-lapse] [--json]
 * Medians over the measured steps / 3 recoveries per size.
 *
 * Each steady-state size and path runs in a process of its own with an etcd
 * of its own, so that a size does not inherit the last one's leftovers
 * (leases still running out, keys, processes still exiting). A size that
 * fails says why, per group: graft_init's status, or the status of the
 * steps it missed, or the signal that ended it. "start req/rank" is the
 * etcd requests of one rank (keep-alives aside) from graft_init() to its
 * first committed step: median and most over the ranks.
 */
#include <graft/etcd.h>
#include <graft/graft.h>
#include <graft/persist.h>

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
#include <xxhash.h>

#include "bench_args.h"
#include "bench_recovery.h"
#include "bench_stats.h"
#include "etcd_fixture.h"

static const char *endpoint;
static int job_seq;




/* steady_path of the runtimes made next ("peers" or "etcd"). */
static const char *steady_path = "peers";

/* graft_init()'s status in the last make_runtime() of this process. */
static graft_status_t init_status;

static graft_runtime_t *make_runtime(const char *job, int groups, int group, const char *mode)
{
    graft_config_t *c = NULL;
    graft_runtime_t *rt = NULL;
    char v[32];
    if (graft_config_create(&c) != GRAFT_OK)
        return NULL;
    int ok = graft_config_set(c, "job", job, NULL) == GRAFT_OK &&
             graft_config_set(c, "etcd_endpoints", endpoint, NULL) == GRAFT_OK &&
             (snprintf(v, sizeof(v), "%d", groups), graft_config_set(c, "groups", v, NULL)) ==
                 GRAFT_OK &&
             (snprintf(v, sizeof(v), "%d", group), graft_config_set(c, "group", v, NULL)) ==
                 GRAFT_OK &&
             graft_config_set(c, "mode", mode, NULL) == GRAFT_OK &&
             graft_config_set(c, "steady_path", steady_path, NULL) == GRAFT_OK &&
             graft_config_set(c, "lease_ttl_ms", "3000", NULL) == GRAFT_OK &&
             graft_config_set(c, "join_timeout_ms", "3000", NULL) == GRAFT_OK &&
             graft_config_set(c, "fence_timeout_ms", "10000", NULL) == GRAFT_OK &&
             graft_config_set(c, "quorum_timeout_ms", "20000", NULL) == GRAFT_OK;
    init_status = ok ? graft_init(c, &rt) : GRAFT_EINVAL;
    if (init_status != GRAFT_OK)
        rt = NULL;
    graft_config_destroy(c);
    return rt;
}

/* ------------------------------------------------------- steady state --- */

/* Steps a group may fail (a heal that failed, a quorum that timed out)
 * and take again before its run counts as failed. */
#define MAX_MISSES 10

/* What a group sends the parent: a measured step, its start's etcd
 * requests, or why it gave up (one record each, all the same size). */
enum { REC_STEP = 0, REC_START = 1, REC_FAILED = 2, REC_DONE = 3 };
enum { WHY_INIT = 1, WHY_MISSES = 2 };
typedef struct steady_rec {
    int kind, group, why;
    graft_status_t status;
    double v[4]; /* step: total, quorum, commit s, etcd requests; start: requests */
} steady_rec_t;

static void steady_send(int fd, const steady_rec_t *r)
{
    if (write(fd, r, sizeof(*r)) != sizeof(*r))
        _exit(3);
}

static _Noreturn void steady_fail(int fd, int group, int why, graft_status_t st)
{
    steady_rec_t r = {REC_FAILED, group, why, st, {0, 0, 0, 0}};
    steady_send(fd, &r);
    _exit(why);
}

static void steady_child(const char *job, int groups, int group, int steps, int fd)
{
    static uint64_t state[512];
    graft_runtime_t *rt = make_runtime(job, groups, group, "strict");
    graft_region_t r = {"w", GRAFT_REGION_PARAM, 0, GRAFT_DEVICE_HOST, state, sizeof(state), 0, 0};
    if (rt == NULL)
        steady_fail(fd, group, WHY_INIT, init_status);
    if (graft_region_register(rt, &r) != GRAFT_OK)
        steady_fail(fd, group, WHY_INIT, GRAFT_EINTERNAL);
    int warm = 5, misses = 0;
    bool started = false;
    for (int s = 0; s < steps + warm; s++) {
        bool apply = false;
        graft_metrics_t m0;
        graft_metrics_get(rt, &m0);
        double t0 = graft_test_now_s();
        graft_status_t st = graft_quorum(rt, NULL), hst = GRAFT_OK;
        if (st == GRAFT_OK) {
            /* A failed heal is the trainer's to survive: the commit votes
             * no and the next round heals again, as a trainer would. */
            hst = graft_heal_wait(rt);
            st = graft_commit(rt, &apply);
        }
        if (st != GRAFT_OK || !apply) {
            fprintf(stderr, "group %d step %d: %s%s\n", group, s,
                    graft_status_string(st != GRAFT_OK ? st : hst),
                    st == GRAFT_OK ? " (not applied; the step is taken again)" : "");
            if (++misses > MAX_MISSES)
                steady_fail(fd, group, WHY_MISSES, st != GRAFT_OK ? st : hst);
            s--;
            continue;
        }
        steady_rec_t rec = {REC_STEP, group, 0, GRAFT_OK, {graft_test_now_s() - t0, 0, 0, 0}};
        graft_metrics_t mt;
        graft_metrics_get(rt, &mt);
        if (!started) {
            steady_rec_t sr = {REC_START, group, 0, GRAFT_OK, {(double)mt.etcd_requests, 0, 0, 0}};
            steady_send(fd, &sr);
            started = true;
        }
        rec.v[1] = (double)mt.last_quorum_ns * 1e-9;
        rec.v[2] = (double)mt.last_commit_ns * 1e-9;
        rec.v[3] = (double)(mt.etcd_requests - m0.etcd_requests);
        /* The update is a function of the committed step, as a trainer's
         * is: a group that healed mid-run then goes on from the donors'
         * state and step, and stays identical to them. */
        state[graft_step(rt) % 512]++;
        if (s >= warm)
            steady_send(fd, &rec);
    }
    /* Go on stepping, unmeasured, until the parent has every group's last
     * step and ends them all: a group that exits at once would leave a
     * group whose last step did not commit (it heals at the next round)
     * without the quorum that strict mode needs. */
    steady_rec_t done = {REC_DONE, group, 0, GRAFT_OK, {0, 0, 0, 0}};
    steady_send(fd, &done);
    for (;;) {
        bool apply = false;
        if (graft_quorum(rt, NULL) == GRAFT_OK && graft_heal_wait(rt) == GRAFT_OK &&
            graft_commit(rt, &apply) == GRAFT_OK && apply)
            state[graft_step(rt) % 512]++;
    }
}

/* CPU seconds (user + system) a process has used so far, from
 * /proc/<pid>/stat; -1 when unreadable. */
static double cpu_s(int pid)
{
    char path[64], buf[1024];
    snprintf(path, sizeof(path), "/proc/%d/stat", pid);
    FILE *f = fopen(path, "r");
    if (f == NULL)
        return -1;
    size_t n = fread(buf, 1, sizeof(buf) - 1, f);
    fclose(f);
    buf[n] = '\0';
    /* Fields after the command name, which ends at the last ')'. */
    char *p = strrchr(buf, ')');
    unsigned long ut = 0, st = 0;
    if (p == NULL ||
        sscanf(p + 1, " %*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %lu %lu", &ut, &st) != 2)
        return -1;
    return (double)(ut + st) / (double)sysconf(_SC_CLK_TCK);
}

static int etcd_pid;

/* Medians and p99 of one step (quorum + commit), and medians of the two
 * calls apart, so a change can be traced to the call it affects. */
#define MAX_GROUPS 256 /* one process each */

typedef struct steady_row {
    double med, p99, quorum_med, commit_med;
    double etcd_cpu_ms; /* etcd's CPU time per step, all groups together */
    double etcd_requests; /* etcd requests per step, all groups together (keep-alives aside) */
    double start_req_med, start_req_max; /* a rank's requests up to its first commit */
    double put_ms; /* a bare etcd put on this size's etcd */
} steady_row_t;

static const steady_row_t failed_row = {-1, -1, -1, -1, -1, -1, -1, -1, -1};

/* Say why groups failed, one line per cause. */
static void steady_causes(int groups, const char *path, const steady_rec_t *fails, int n_fail,
                          const int *exit_sig, const int *exit_code, int n_groups)
{
    for (int i = 0; i < n_fail; i++) {
        const steady_rec_t *f = &fails[i];
        int same = 0;
        bool first = true;
        for (int k = 0; k < n_fail; k++) {
            bool eq = fails[k].why == f->why && fails[k].status == f->status;
            same += eq;
            if (eq && k < i)
                first = false;
        }
        if (first)
            fprintf(stderr, "  %d groups (%s): %d failed: %s: %s\n", groups, path, same,
                    f->why == WHY_INIT ? "graft_init" : "more than 10 steps missed, the last",
                    graft_status_string(f->status));
    }
    for (int g = 0; g < n_groups; g++) {
        if (exit_sig[g] != 0)
            fprintf(stderr, "  %d groups (%s): group %d ended by signal %d\n", groups, path, g,
                    exit_sig[g]);
        else if (exit_code[g] == 3)
            fprintf(stderr, "  %d groups (%s): group %d could not report to the bench\n",
                    groups, path, g);
    }
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static int steady(int groups, int steps, steady_row_t *row_p)
{
    char job[64];
    int fds[2];
    snprintf(job, sizeof(job), "bench-steady-%d-%d", (int)getpid(), job_seq++);
    if (groups < 1 || groups > MAX_GROUPS || steps < 1 || pipe(fds) != 0)
        return -1;
    static pid_t pids[MAX_GROUPS];
    static int exit_sig[MAX_GROUPS], exit_code[MAX_GROUPS];
    static steady_rec_t fails[MAX_GROUPS];
    static double start_req[MAX_GROUPS];
    int n_fail = 0, n_start = 0, n_done = 0;
    double cpu0 = cpu_s(etcd_pid);
    fflush(stdout); /* or a child's exit prints the table again */
    for (int g = 0; g < groups; g++) {
        pids[g] = fork();
        if (pids[g] == 0) {
            close(fds[0]);
            steady_child(job, groups, g, steps, fds[1]);
        }
    }
    close(fds[1]);
    size_t n = (size_t)groups * (size_t)steps, got = 0;
    double *v = calloc(n, sizeof(*v)), *vq = calloc(n, sizeof(*vq)),
           *vc = calloc(n, sizeof(*vc));
    double requests = 0;
    steady_rec_t rec;
    if (v == NULL || vq == NULL || vc == NULL)
        n = 0; /* nothing is kept; the run is reported as failed */
    /* Until every group sent its last step or why it gave up (or closed
     * its end): then all are ended together (SIGKILL; their etcd goes with
     * this process). */
    while (n_done + n_fail < groups && read(fds[0], &rec, sizeof(rec)) == sizeof(rec)) {
        if (rec.kind == REC_DONE) {
            n_done++;
        } else if (rec.kind == REC_FAILED && n_fail < MAX_GROUPS) {
            fails[n_fail++] = rec;
        } else if (rec.kind == REC_START && n_start < MAX_GROUPS) {
            start_req[n_start++] = rec.v[0];
        } else if (rec.kind == REC_STEP && got < n) {
            v[got] = rec.v[0];
            vq[got] = rec.v[1];
            vc[got] = rec.v[2];
            requests += rec.v[3];
            got++;
        }
    }
    row_p->etcd_requests = requests / steps;
    close(fds[0]);
    double cpu1 = cpu_s(etcd_pid);
    int bad = 0;
    for (int g = 0; g < groups; g++)
        kill(pids[g], SIGKILL);
    for (int g = 0; g < groups; g++) {
        int st = 0;
        waitpid(pids[g], &st, 0);
        exit_sig[g] = WIFSIGNALED(st) && WTERMSIG(st) != SIGKILL ? WTERMSIG(st) : 0;
        exit_code[g] = WIFEXITED(st) ? WEXITSTATUS(st) : 0;
        bad += exit_sig[g] != 0 || exit_code[g] != 0;
    }
    if (n_fail > bad)
        bad = n_fail;
    /* Per step of the whole job, warm-up steps and start-up included. */
    row_p->etcd_cpu_ms = cpu0 >= 0 && cpu1 >= 0 ? (cpu1 - cpu0) * 1e3 / (steps + 5) : -1;
    row_p->med = graft_test_percentile(v, got, 0.5) * 1e3;
    row_p->p99 = graft_test_percentile(v, got, 0.99) * 1e3;
    row_p->quorum_med = graft_test_percentile(vq, got, 0.5) * 1e3;
    row_p->commit_med = graft_test_percentile(vc, got, 0.5) * 1e3;
    qsort(start_req, (size_t)n_start, sizeof(double), cmp_double);
    row_p->start_req_med = n_start > 0 ? start_req[n_start / 2] : -1;
    row_p->start_req_max = n_start > 0 ? start_req[n_start - 1] : -1;
    free(v);
    free(vq);
    free(vc);
    if (bad != 0 || n == 0 || got != n) {
        fprintf(stderr, "steady state with %d groups (%s) failed: %zu of %zu steps measured, "
                "%d groups did not end well\n", groups, steady_path, got, n, bad);
        steady_causes(groups, steady_path, fails, n_fail, exit_sig, exit_code, groups);
        return -1;
    }
    return 0;
}

static double etcd_put_ms(void)
{
    graft_etcd_t *e = graft_test_etcd_client(&endpoint, 1, NULL, NULL);
    double v[200];
    for (int i = 0; i < 200; i++) {
        double t0 = graft_test_now_s();
        if (graft_etcd_put(e, "/bench/put", "x", 1, 0, NULL, NULL) != GRAFT_OK)
            v[i] = 0;
        v[i] = (graft_test_now_s() - t0) * 1e3;
    }
    graft_etcd_destroy(e);
    return graft_test_percentile(v, 200, 0.5);
}

/* One size on one path in a process of its own, with an etcd of its own
 * (started and stopped there): *row_p, or failed_row. */
static int steady_isolated(int groups, int steps, const char *path, steady_row_t *row_p)
{
    int fds[2];
    *row_p = failed_row;
    if (pipe(fds) != 0)
        return -1;
    fflush(stdout);
    fflush(stderr);
    pid_t pid = fork();
    if (pid < 0)
        return -1;
    if (pid == 0) {
        close(fds[0]);
        graft_test_etcd_t etcd;
        steady_row_t row = failed_row;
        /* A port picked free can be taken before etcd binds it (other
         * programs on a busy machine): up to 3 tries, each failure said. */
        int tries = 0;
        while (graft_test_etcd_start(&etcd, NULL) != 0) {
            fprintf(stderr, "steady state with %d groups (%s): etcd did not start (try %d of "
                    "3; its log's last lines above)\n", groups, path, tries + 1);
            if (++tries == 3)
                _exit(1);
        }
        endpoint = graft_etcd_server_endpoint(etcd.server);
        etcd_pid = graft_etcd_server_pid(etcd.server);
        steady_path = path;
        double put = etcd_put_ms();
        int rc = steady(groups, steps, &row);
        row.put_ms = put;
        graft_test_etcd_stop(&etcd);
        if (write(fds[1], &row, sizeof(row)) != sizeof(row))
            _exit(3);
        _exit(rc == 0 ? 0 : 1);
    }
    close(fds[1]);
    steady_row_t row;
    ssize_t n = read(fds[0], &row, sizeof(row));
    close(fds[0]);
    int st = 0;
    waitpid(pid, &st, 0);
    if (n == sizeof(row))
        *row_p = row;
    if (WIFSIGNALED(st))
        fprintf(stderr, "steady state with %d groups (%s): the bench's process ended by signal "
                "%d\n", groups, path, WTERMSIG(st));
    return WIFEXITED(st) && WEXITSTATUS(st) == 0 && n == sizeof(row) ? 0 : -1;
}

/* ------------------------------------------------------------ recovery --- */

/* Is name one of the comma-separated list's items? */
static bool listed(const char *list, const char *name)
{
    size_t n = strlen(name);
    for (const char *p = list; p != NULL; p = strchr(p, ',') ? strchr(p, ',') + 1 : NULL)
        if (strncmp(p, name, n) == 0 && (p[n] == ',' || p[n] == '\0'))
            return true;
    return false;
}

/* Each size with each successor named in `successors` (a comma list of
 * respawn, spare, spare-lapse, follow, follow-lapse), 3 runs each, the median printed and kept in
 * rows; the restore is measured with the first successor's runs. */
static int recovery_table(const size_t *sizes, size_t n_sizes, const char *successors,
                          graft_bench_rec_row_t *rows, size_t *n_rows_p)
{
    graft_bench_rec_config_t cfg = {.endpoint = endpoint, .steady_path = "peers",
                                    .lease_ttl_ms = 3000};
    int rc = 0;
    printf("recovery: kill -> first committed step of the successor (3 groups, strict; "
           "median of 3; lease TTL %u ms)\n", cfg.lease_ttl_ms);
    printf("  %-6s %-12s %8s %8s %10s %8s %9s %8s %10s %7s %9s\n", "MiB", "successor",
           "total s", "detect", "state init", "quorum", "transfer", "verify", "restore s",
           "ratio", "/respawn");
    for (size_t k = 0; k < n_sizes; k++) {
        double respawn_total = 0;
        bool restored = false;
        for (int sc = 0; sc < GRAFT_BENCH_N_SUCCESSORS; sc++) {
            const char *name = graft_bench_successor_name((graft_bench_successor_t)sc);
            if (!listed(successors, name))
                continue;
            graft_bench_rec_row_t tries[3];
            int ok = 0;
            cfg.with_restore = !restored;
            for (int t = 0; t < 3; t++)
                if (graft_bench_recovery(&cfg, sizes[k], (graft_bench_successor_t)sc,
                                         &tries[ok]) == 0)
                    ok++;
            if (ok == 0) {
                fprintf(stderr, "recovery of %zu MiB (%s) failed\n", sizes[k], name);
                rc = 1;
                continue;
            }
            restored = true;
            graft_bench_rec_row_t *r = &rows[(*n_rows_p)++];
            *r = graft_bench_rec_median(tries, ok);
            if (sc == GRAFT_BENCH_RESPAWN)
                respawn_total = r->total;
            printf("  %-6zu %-12s %8.3f %8.3f %10.3f %8.3f %9.3f %8.3f", r->mib, name, r->total,
                   r->detect, r->init, r->quorum, r->transfer, r->verify);
            if (r->restore > 0)
                printf(" %10.3f %6.1fx", r->restore, r->transfer > 0 ? r->restore / r->transfer : 0);
            else
                printf(" %10s %7s", "-", "-");
            if (respawn_total > 0)
                printf(" %8.2fx", r->total / respawn_total);
            printf("\n");
        }
    }
    printf("  state init = the respawned process filling its own state before graft_init() (the\n"
           "  trainer's work, part of total); ratio = restore from own checkpoint (cold page\n"
           "  cache) / P2P transfer, goal >= 4x; spare: started with the job, the dead rank\n"
           "  evicted by the bench as its agent would; spare-lapse: not evicted, it waits for\n"
           "  the lease; follow(-lapse): the same with a follow spare; /respawn = total / the\n"
           "  respawn's total\n");
    return rc;
}

/* The follow mode's cost, per size (graft_bench_follow_cost()). */
static int follow_table(const size_t *sizes, size_t n_sizes, graft_bench_follow_row_t *rows,
                        size_t *n_rows_p)
{
    graft_bench_rec_config_t cfg = {.endpoint = endpoint, .steady_path = "peers",
                                    .lease_ttl_ms = 3000};
    int rc = 0;
    static const unsigned computes[2] = {2, 100};
    printf("follow spares: the donor's step with and without one follower (3 groups, median "
           "of 35 steps)\n");
    printf("  %-6s %8s %12s %14s %9s %14s %8s %8s\n", "MiB", "compute", "alone ms",
           "followed ms", "ratio", "wait ms/step", "served", "pulled");
    for (size_t k = 0; k < n_sizes; k++) {
        for (int c = 0; c < 2; c++) {
            graft_bench_follow_row_t *r = &rows[*n_rows_p];
            if (graft_bench_follow_cost(&cfg, sizes[k], 40, computes[c], r) != 0) {
                rc = 1;
                continue;
            }
            (*n_rows_p)++;
            printf("  %-6zu %5u ms %12.2f %14.2f %8.2fx %14.2f %7.0f%% %7.0f%%\n", r->mib,
                   r->compute_ms, r->step_alone * 1e3, r->step_followed * 1e3,
                   r->step_followed / r->step_alone, r->wait * 1e3, r->served * 100,
                   r->pulled * 100);
        }
    }
    printf("  followed / alone: the step the follower costs its donor (each step's state\n"
           "  served and pulled, verified); served: its steps with a followers' serve open;\n"
           "  pulled: the steps the follower pulled, verified, over the donor's steps\n");
    return rc;
}

/* --groups 2,8,32 for graft_bench_args(): at most 8 counts. */
typedef struct groups_arg {
    int *list;
    int *n;
} groups_arg_t;

static int groups_parse(void *dst, const char *value)
{
    groups_arg_t *g = dst;
    char buf[256];
    snprintf(buf, sizeof(buf), "%s", value);
    *g->n = 0;
    for (char *save = NULL, *t = strtok_r(buf, ",", &save); t != NULL && *g->n < 8;
         t = strtok_r(NULL, ",", &save))
        g->list[(*g->n)++] = atoi(t);
    return 0;
}

int main(int argc, char **argv)
{
    int groups_list[8] = {2, 8, 32}, n_groups = 3, steps = 50;
    size_t sizes[2] = {64, 1024}, n_sizes = 1;
    bool json = false, steady_only = false, big = false;
    const char *only_path = "both";
    const char *successors = "respawn,spare,spare-lapse";
    groups_arg_t groups = {groups_list, &n_groups};
    const graft_bench_arg_t cli[] = {
        GRAFT_BENCH_ARG("json", GRAFT_BENCH_FLAG, &json),
        GRAFT_BENCH_ARG("steady-only", GRAFT_BENCH_FLAG, &steady_only),
        GRAFT_BENCH_ARG("big", GRAFT_BENCH_FLAG, &big),
        GRAFT_BENCH_ARG("steps", GRAFT_BENCH_INT, &steps),
        GRAFT_BENCH_ARG("path", GRAFT_BENCH_STR, &only_path),
        GRAFT_BENCH_ARG("successor", GRAFT_BENCH_STR, &successors),
        GRAFT_BENCH_ARG("mib", GRAFT_BENCH_SIZE, &sizes[0]),
        GRAFT_BENCH_ARG_FN("groups", &groups, groups_parse),
    };
    if (graft_bench_args(argc, argv, cli, GRAFT_BENCH_NARGS(cli),
                         "[--groups 2,8,32] [--steps N] [--path etcd|peers|both] [--mib N] "
                         "[--big] [--steady-only] "
                         "[--successor respawn,spare,spare-lapse,follow,follow-lapse] [--json]") != 0)
        return 2;
    if (strcmp(only_path, "both") != 0 && strcmp(only_path, "etcd") != 0 &&
        strcmp(only_path, "peers") != 0) {
        fprintf(stderr, "runtime_bench: --path: etcd, peers or both, not '%s'\n", only_path);
        return 2;
    }
    for (const char *p = successors; p != NULL; p = strchr(p, ',') ? strchr(p, ',') + 1 : NULL) {
        size_t len = strchr(p, ',') ? (size_t)(strchr(p, ',') - p) : strlen(p);
        bool known = false;
        for (int sc = 0; sc < GRAFT_BENCH_N_SUCCESSORS; sc++) {
            const char *name = graft_bench_successor_name((graft_bench_successor_t)sc);
            known = known || (strlen(name) == len && strncmp(p, name, len) == 0);
        }
        if (!known) {
            fprintf(stderr, "runtime_bench: --successor: respawn, spare, spare-lapse, follow "
                            "or follow-lapse, comma-separated, not '%.*s'\n", (int)len, p);
            return 2;
        }
    }
    bool recover = !steady_only;
    if (big)
        n_sizes = 2;
    if (steps < 1 || sizes[0] < 1)
        return 2;
    signal(SIGPIPE, SIG_IGN);
    int rc = 0;

    /* Each size on both paths: every step through etcd, the comparison,
     * and the steady path between the members, each in a process and on
     * an etcd of its own (steady_isolated). */
    static const char *const paths[2] = {"etcd", "peers"};
    steady_row_t sr[8][2];
    printf("steady state: graft_quorum()+graft_commit() per step (%d steps per group)\n", steps);
    printf("  %-8s %-6s %10s %9s %13s %13s %13s %13s %11s %15s %10s\n", "groups", "path",
           "median ms", "p99 ms", "quorum med ms", "commit med ms", "etcd req/step",
           "etcd cpu ms", "etcd put ms", "start req/rank", "etcd/peers");
    for (int i = 0; i < n_groups; i++) {
        for (int p = 0; p < 2; p++) {
            steady_path = paths[p];
            if (strcmp(only_path, "both") != 0 && strcmp(only_path, paths[p]) != 0) {
                sr[i][p] = failed_row;
                continue;
            }
            if (steady_isolated(groups_list[i], steps, paths[p], &sr[i][p]) != 0) {
                rc = 1;
                sr[i][p].med = sr[i][p].p99 = -1; /* what was measured is kept, not shown */
            }
            printf("  %-8d %-6s %10.2f %9.2f %13.2f %13.2f %13.1f %13.2f %11.2f %7.0f /%6.0f",
                   groups_list[i], paths[p], sr[i][p].med, sr[i][p].p99, sr[i][p].quorum_med,
                   sr[i][p].commit_med, sr[i][p].etcd_requests, sr[i][p].etcd_cpu_ms,
                   sr[i][p].put_ms, sr[i][p].start_req_med, sr[i][p].start_req_max);
            if (p == 1 && sr[i][0].med > 0 && sr[i][1].med > 0)
                printf(" %9.1fx", sr[i][0].med / sr[i][1].med);
            printf("\n");
        }
    }

    graft_bench_rec_row_t rows[2 * GRAFT_BENCH_N_SUCCESSORS];
    size_t n_rows = 0;
    graft_bench_follow_row_t frows[4];
    size_t n_frows = 0;
    graft_test_etcd_t etcd = {0};
    if (recover) {
        if (graft_test_etcd_start(&etcd, NULL) != 0)
            return 1;
        endpoint = graft_etcd_server_endpoint(etcd.server);
        etcd_pid = graft_etcd_server_pid(etcd.server);
        if (recovery_table(sizes, n_sizes, successors, rows, &n_rows) != 0)
            rc = 1;
        if ((listed(successors, "follow") || listed(successors, "follow-lapse")) &&
            follow_table(sizes, n_sizes, frows, &n_frows) != 0)
            rc = 1;
    }
    if (json) {
        printf("{\"bench\":\"runtime\",\"steady\":[");
        bool first = true;
        for (int i = 0; i < n_groups; i++)
            for (int p = 0; p < 2; p++) {
                if (strcmp(only_path, "both") != 0 && strcmp(only_path, paths[p]) != 0)
                    continue;
                printf("%s{\"groups\":%d,\"path\":\"%s\",\"median_ms\":%.3f,\"p99_ms\":%.3f,"
                       "\"quorum_median_ms\":%.3f,\"commit_median_ms\":%.3f,"
                       "\"etcd_requests_per_step\":%.2f,\"etcd_cpu_ms_per_step\":%.3f,"
                       "\"etcd_put_median_ms\":%.3f,\"start_requests_per_rank_median\":%.0f,"
                       "\"start_requests_per_rank_max\":%.0f}",
                       first ? "" : ",", groups_list[i], paths[p], sr[i][p].med,
                       sr[i][p].p99, sr[i][p].quorum_med, sr[i][p].commit_med,
                       sr[i][p].etcd_requests, sr[i][p].etcd_cpu_ms, sr[i][p].put_ms,
                       sr[i][p].start_req_med, sr[i][p].start_req_max);
                first = false;
            }
        printf("],\"recovery\":[");
        for (size_t k = 0; k < n_rows; k++) {
            graft_bench_rec_row_t *r = &rows[k];
            printf("%s{\"mib\":%zu,\"successor\":\"%s\",\"total_s\":%.4f,\"detect_s\":%.4f,"
                   "\"state_init_s\":%.4f,\"quorum_s\":%.4f,\"transfer_s\":%.4f,"
                   "\"verify_s\":%.4f,\"restore_s\":%.4f,\"restore_over_p2p\":%.2f}",
                   k ? "," : "", r->mib, graft_bench_successor_name(r->successor), r->total,
                   r->detect, r->init, r->quorum, r->transfer, r->verify, r->restore,
                   r->transfer > 0 && r->restore > 0 ? r->restore / r->transfer : 0);
        }
        printf("],\"follow_cost\":[");
        for (size_t k = 0; k < n_frows; k++) {
            graft_bench_follow_row_t *r = &frows[k];
            printf("%s{\"mib\":%zu,\"compute_ms\":%u,\"step_alone_ms\":%.3f,"
                   "\"step_followed_ms\":%.3f,"
                   "\"followed_over_alone\":%.2f,\"wait_ms_per_step\":%.3f,\"served\":%.2f,"
                   "\"pulled\":%.2f}",
                   k ? "," : "", r->mib, r->compute_ms, r->step_alone * 1e3,
                   r->step_followed * 1e3, r->step_followed / r->step_alone, r->wait * 1e3,
                   r->served, r->pulled);
        }
        printf("]}\n");
    }
    if (recover)
        graft_test_etcd_stop(&etcd);
    return rc;
}
