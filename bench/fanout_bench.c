/*
 * fanout_bench: whether a job's cold start and a multi-group recovery hold
 * at scale, with the broadcast tree and admission queues (each donor
 * serving transfer_max_recipients = K at once) beside the flat fan-out
 * (K = 1024: every recipient of a cold start on the lowest group at once,
 * as before), measured in the same run. Real etcd, real UCX on loopback,
 * one process per group, strict mode:
 *
 *  1. cold start: G groups, each with its own initial state of --mib MiB,
 *     start together; time from the start to the last group's first
 *     commit, and the heals that failed (at the cold start every group but
 *     the lowest takes its state);
 *  2. recovery: once every group has committed, --kill groups are killed
 *     at once (SIGKILL) and replaced; time from the kill to the last replacement's first commit,
 *     and heals that failed;
 *  and, for both, the most recipients any donor served at once.
 *
 * Usage: fanout_bench [--groups G] [--kill N] [--mib N] [--json]
 * (default 64 groups, 8 killed, 1 MiB).
 */
#include <graft/graft.h>

#include <errno.h>
#include <inttypes.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "bench_args.h"
#include "bench_stats.h"
#include "etcd_fixture.h"

#define STEPS 8
#define MAX_GROUPS 256

static const char *endpoint;

/* What one process reports over the pipe, once per event. */
typedef struct report {
    int32_t group;
    int32_t kind;        /* 0: first commit, 1: finished */
    double t;            /* graft_test_now_s() */
    uint32_t heal_failures;
    uint32_t peak;       /* most recipients served at once */
    uint64_t step;
} report_t;

static int child(const char *job, int groups, int group, uint32_t k, size_t mib, int fd)
{
    graft_config_t *c = NULL;
    graft_runtime_t *rt = NULL;
    char v[32];
    size_t n = mib << 17; /* uint64_t words */
    uint64_t *state = malloc(n * sizeof(*state));
    if (state == NULL || graft_config_create(&c) != GRAFT_OK)
        return 1;
    for (size_t i = 0; i < n; i++)
        state[i] = (uint64_t)group * 0x9e3779b97f4a7c15ull + i; /* differs per group */
    snprintf(v, sizeof(v), "%" PRIu32, k);
    bool ok = graft_config_set(c, "job", job, NULL) == GRAFT_OK &&
              graft_config_set(c, "etcd_endpoints", endpoint, NULL) == GRAFT_OK &&
              graft_config_set(c, "transfer_max_recipients", v, NULL) == GRAFT_OK &&
              graft_config_set(c, "lease_ttl_ms", "5000", NULL) == GRAFT_OK &&
              graft_config_set(c, "join_timeout_ms", "10000", NULL) == GRAFT_OK &&
              graft_config_set(c, "quorum_timeout_ms", "120000", NULL) == GRAFT_OK;
    snprintf(v, sizeof(v), "%d", groups);
    ok = ok && graft_config_set(c, "groups", v, NULL) == GRAFT_OK;
    snprintf(v, sizeof(v), "%d", group);
    ok = ok && graft_config_set(c, "group", v, NULL) == GRAFT_OK;
    graft_region_t r = {"w", GRAFT_REGION_PARAM, 0, GRAFT_DEVICE_HOST, state,
                        n * sizeof(*state), 0, 0};
    if (!ok || graft_init(c, &rt) != GRAFT_OK || graft_region_register(rt, &r) != GRAFT_OK)
        return 1;
    graft_config_destroy(c);
    bool first = true;
    while (graft_step(rt) < STEPS) {
        bool apply = false;
        graft_status_t st = graft_quorum(rt, NULL);
        if (st == GRAFT_OK)
            st = graft_heal_wait(rt);
        if (st != GRAFT_OK && st != GRAFT_ENODONOR && graft_status_class(st) != GRAFT_CLASS_PEER &&
            graft_status_class(st) != GRAFT_CLASS_GROUP) {
            fprintf(stderr, "group %d: %s\n", group, graft_status_string(st));
            return 2;
        }
        if (graft_commit(rt, &apply) != GRAFT_OK && !apply)
            continue;
        if (apply) {
            state[graft_step(rt) % n]++;
            graft_metrics_t m;
            graft_metrics_get(rt, &m);
            report_t rep = {group, first ? 0 : 1, graft_test_now_s(),
                            (uint32_t)m.recovery_failures, (uint32_t)m.serve_peak_recipients,
                            graft_step(rt)};
            if ((first || graft_step(rt) == STEPS) && write(fd, &rep, sizeof(rep)) != sizeof(rep))
                return 3;
            first = false;
        }
    }
    graft_destroy(rt);
    free(state);
    return 0;
}

static pid_t spawn(const char *job, int groups, int group, uint32_t k, size_t mib, int fd)
{
    pid_t pid = fork();
    if (pid == 0)
        _exit(child(job, groups, group, k, mib, fd));
    return pid;
}

typedef struct result {
    double cold_s, recover_s;
    uint32_t cold_heal_failures, recover_heal_failures, peak;
    int ok;
} result_t;

static void run(int groups, int kill_n, uint32_t k, size_t mib, result_t *res)
{
    static int seq;
    char job[64];
    pid_t pids[MAX_GROUPS];
    int fds[2];
    memset(res, 0, sizeof(*res));
    snprintf(job, sizeof(job), "bench-fanout-%d-%d", (int)getpid(), seq++);
    if (pipe(fds) != 0)
        return;
    double t0 = graft_test_now_s(), t_kill = 0, last_first = 0, last_repl = 0;
    for (int g = 0; g < groups; g++)
        pids[g] = spawn(job, groups, g, k, mib, fds[1]);
    int firsts = 0, repl_firsts = 0, finished = 0;
    bool killed = false;
    report_t r;
    /* A run that collapses (no report for 60 s) is stopped and reported
     * failed, with what it reached. */
    struct pollfd pfd = {.fd = fds[0], .events = POLLIN};
    while (finished < groups && poll(&pfd, 1, 60000) == 1 &&
           read(fds[0], &r, sizeof(r)) == sizeof(r)) {
        bool repl = killed && r.group >= groups - kill_n;
        if (r.kind == 0 && !repl) {
            firsts++;
            last_first = r.t > last_first ? r.t : last_first;
            res->cold_heal_failures += r.heal_failures;
        } else if (r.kind == 0) {
            repl_firsts++;
            last_repl = r.t > last_repl ? r.t : last_repl;
            res->recover_heal_failures += r.heal_failures;
        } else {
            finished++;
            res->peak = r.peak > res->peak ? r.peak : res->peak;
        }
        if (!killed && firsts == groups) {
            /* Every group has committed: kill the last kill_n at once and
             * replace them. */
            t_kill = graft_test_now_s();
            for (int g = groups - kill_n; g < groups; g++) {
                kill(pids[g], SIGKILL);
                waitpid(pids[g], NULL, 0);
            }
            for (int g = groups - kill_n; g < groups; g++)
                pids[g] = spawn(job, groups, g, k, mib, fds[1]);
            killed = true;
        }
    }
    close(fds[1]);
    close(fds[0]);
    if (finished < groups)
        for (int g = 0; g < groups; g++)
            kill(pids[g], SIGKILL);
    int bad = 0;
    for (int g = 0; g < groups; g++) {
        int ws;
        waitpid(pids[g], &ws, 0);
        bad += !WIFEXITED(ws) || WEXITSTATUS(ws) != 0;
    }
    res->cold_s = firsts == groups ? last_first - t0 : -1;
    res->recover_s = repl_firsts == kill_n ? last_repl - t_kill : -1;
    res->ok = bad == 0 && finished == groups && repl_firsts == kill_n;
}

int main(int argc, char **argv)
{
    int groups = 64, kill_n = 8;
    size_t mib = 1;
    bool json = false;
    const graft_bench_arg_t cli[] = {
        GRAFT_BENCH_ARG("groups", GRAFT_BENCH_INT, &groups),
        GRAFT_BENCH_ARG("kill", GRAFT_BENCH_INT, &kill_n),
        GRAFT_BENCH_ARG("mib", GRAFT_BENCH_SIZE, &mib),
        GRAFT_BENCH_ARG("json", GRAFT_BENCH_FLAG, &json),
    };
    if (graft_bench_args(argc, argv, cli, GRAFT_BENCH_NARGS(cli),
                         "[--groups G] [--kill N] [--mib N] [--json]") != 0)
        return 2;
    if (groups < 2 || groups > MAX_GROUPS || kill_n < 1 || kill_n >= groups || mib < 1)
        return 2;
    signal(SIGPIPE, SIG_IGN);
    graft_test_etcd_t etcd;
    if (graft_test_etcd_start(&etcd, NULL) != 0)
        return 1;
    endpoint = graft_etcd_server_endpoint(etcd.server);
    const uint32_t ks[2] = {4, 1024};
    const char *names[2] = {"tree, K=4", "flat, K=1024"};
    result_t res[2];
    printf("fan-out: %d groups x 1 rank, %zu MiB each, strict; %d killed at once\n", groups, mib,
           kill_n);
    printf("  %-14s %12s %14s %14s %16s %11s\n", "fan-out", "cold start s", "heals failed",
           "recovery s", "heals failed", "peak");
    for (int i = 0; i < 2; i++) {
        run(groups, kill_n, ks[i], mib, &res[i]);
        printf("  %-14s %12.2f %14u %14.2f %16u %11u%s\n", names[i], res[i].cold_s,
               res[i].cold_heal_failures, res[i].recover_s, res[i].recover_heal_failures,
               res[i].peak, res[i].ok ? "" : "  (run failed)");
    }
    printf("  cold start = start -> last group's first commit; recovery = kill -> last\n"
           "  replacement's first commit (-1: not reached; a run with no commit for 60 s is\n"
           "  stopped); heals failed = failed heals before a group's first commit; peak =\n"
           "  most recipients a donor served at once\n");
    if (json) {
        printf("{\"bench\":\"fanout\",\"groups\":%d,\"killed\":%d,\"mib\":%zu,\"runs\":[", groups,
               kill_n, mib);
        for (int i = 0; i < 2; i++)
            printf("%s{\"max_recipients\":%u,\"ok\":%s,\"cold_start_s\":%.3f,"
                   "\"cold_heals_failed\":%u,\"recovery_s\":%.3f,\"recovery_heals_failed\":%u,"
                   "\"peak_recipients\":%u}", i ? "," : "", ks[i], res[i].ok ? "true" : "false",
                   res[i].cold_s, res[i].cold_heal_failures, res[i].recover_s,
                   res[i].recover_heal_failures, res[i].peak);
        printf("]}\n");
    }
    graft_test_etcd_stop(&etcd);
    return res[0].ok ? 0 : 1;
}
