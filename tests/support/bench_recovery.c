/*
 * The recovery measurement (bench_recovery.h): the groups and their
 * successor as forked processes, the kill, the eviction, the timing by
 * phase, and the restore it is compared with.
 */
#include "bench_recovery.h"

#include "bench_stats.h"

#include <graft/graft.h>
#include <graft/membership.h>
#include <graft/persist.h>

#include <dirent.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>
#include <xxhash.h>

#define GROUPS 3

typedef struct rec_result {
    double t_init, t_state, t_first_commit; /* t_state: its own state filled */
    graft_metrics_t m;
    int ok;
} rec_result_t;

static const graft_bench_rec_config_t *run_cfg;
static bool run_follow; /* the spares of this run follow */
static unsigned run_compute_us = 2000; /* a step's compute in the cost runs */
static int job_seq;
static uint8_t *blob;
static size_t blob_bytes;

const char *graft_bench_successor_name(graft_bench_successor_t s)
{
    static const char *const names[] = {"respawn", "spare", "spare-lapse", "follow",
                                        "follow-lapse"};
    return s < GRAFT_BENCH_N_SUCCESSORS ? names[s] : "?";
}

/* group < 0: a spare. */
static graft_runtime_t *make_runtime(const char *job, int group)
{
    graft_config_t *c = NULL;
    graft_runtime_t *rt = NULL;
    char v[32];
    if (graft_config_create(&c) != GRAFT_OK)
        return NULL;
    snprintf(v, sizeof(v), "%u", run_cfg->lease_ttl_ms);
    int ok = graft_config_set(c, "job", job, NULL) == GRAFT_OK &&
             graft_config_set(c, "etcd_endpoints", run_cfg->endpoint, NULL) == GRAFT_OK &&
             graft_config_set(c, "groups", "3", NULL) == GRAFT_OK &&
             graft_config_set(c, "mode", "strict", NULL) == GRAFT_OK &&
             graft_config_set(c, "steady_path", run_cfg->steady_path, NULL) == GRAFT_OK &&
             graft_config_set(c, "lease_ttl_ms", v, NULL) == GRAFT_OK &&
             graft_config_set(c, "join_timeout_ms", "3000", NULL) == GRAFT_OK &&
             graft_config_set(c, "fence_timeout_ms", "10000", NULL) == GRAFT_OK &&
             graft_config_set(c, "quorum_timeout_ms", "20000", NULL) == GRAFT_OK;
    if (ok && group >= 0) {
        snprintf(v, sizeof(v), "%d", group);
        ok = graft_config_set(c, "group", v, NULL) == GRAFT_OK;
    } else if (ok) {
        ok = graft_config_set(c, "spare", "1", NULL) == GRAFT_OK &&
             graft_config_set(c, "spare_follow", run_follow ? "1" : "0", NULL) == GRAFT_OK;
    }
    if (!ok || graft_init(c, &rt) != GRAFT_OK)
        rt = NULL;
    graft_config_destroy(c);
    return rt;
}

static graft_status_t fp_blob(void *arg, uint64_t *fp_p)
{
    (void)arg;
    *fp_p = XXH3_64bits(blob, blob_bytes);
    return GRAFT_OK;
}

/* A group (or, group < 0, a spare): trains until killed. Its state is
 * allocated here, after the fork, so no copy-on-write fault lands in a
 * measured pull. A group reports on ready_fd after its third commit; the
 * successor (a respawn, or the spare once promoted) reports its first
 * commit on fd. */
static void rec_child(const char *job, int group, int fd, int ready_fd, bool successor)
{
    rec_result_t res;
    memset(&res, 0, sizeof(res));
    res.t_init = graft_test_now_s();
    blob = malloc(blob_bytes);
    if (blob == NULL)
        _exit(1);
    for (size_t i = 0; i < blob_bytes; i++)
        blob[i] = (uint8_t)(i * 131u + (size_t)(group < 0 ? 7 : group));
    res.t_state = graft_test_now_s();
    graft_runtime_t *rt = make_runtime(job, group);
    graft_region_t r = {"state", GRAFT_REGION_PARAM, 0, GRAFT_DEVICE_HOST, blob, blob_bytes, 0,
                        0};
    if (rt == NULL || graft_region_register(rt, &r) != GRAFT_OK)
        _exit(1);
    graft_fingerprint_set(rt, fp_blob, NULL);
    for (int s = 0;; s++) {
        bool apply = false;
        graft_status_t qst = graft_quorum(rt, NULL);
        if (qst != GRAFT_OK) {
            fprintf(stderr, "group %d: graft_quorum: %s\n", group, graft_status_string(qst));
            _exit(2);
        }
        graft_status_t hst = graft_heal_wait(rt);
        (void)hst; /* a failed heal votes no; the run goes on */
        usleep(2000); /* a step's compute */
        qst = graft_commit(rt, &apply);
        if (qst != GRAFT_OK) {
            fprintf(stderr, "group %d: graft_commit: %s\n", group, graft_status_string(qst));
            _exit(3);
        }
        if (apply)
            blob[(size_t)s * 4099u % blob_bytes]++;
        if (apply && s == 3 && !successor && group >= 0) {
            char c = 1;
            if (write(ready_fd, &c, 1) != 1)
                _exit(5);
        }
        if (successor && apply) {
            res.t_first_commit = graft_test_now_s();
            graft_metrics_get(rt, &res.m);
            res.ok = 1;
            if (write(fd, &res, sizeof(res)) != sizeof(res))
                _exit(4);
            /* Keep serving the others until the parent ends the run. */
            successor = false;
        }
    }
}

static void drop_cache(const char *dir)
{
    DIR *d = opendir(dir);
    struct dirent *e;
    if (d == NULL)
        return;
    while ((e = readdir(d)) != NULL) {
        char p[1400];
        snprintf(p, sizeof(p), "%s/%s", dir, e->d_name);
        int fd = open(p, O_RDONLY);
        if (fd < 0)
            continue;
        fdatasync(fd);
        posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
        close(fd);
    }
    closedir(d);
}

/* Save the state with the persistent tier, then time a restore of it. */
static double restore_s(const char *root)
{
    graft_persist_writer_t *w = NULL;
    graft_persist_config_t pc = {.root = root, .compression_level = 0};
    graft_persist_region_t r = {"state", GRAFT_PERSIST_KIND_PARAM, 0, GRAFT_PERSIST_DEVICE_HOST,
                                blob, blob_bytes, 0, 0};
    const graft_persist_region_t *rs[1] = {&r};
    size_t nr[1] = {1};
    if (graft_persist_writer_create(&pc, &w) != GRAFT_OK ||
        graft_persist_save(w, 1, 1, rs, nr, NULL) != GRAFT_OK ||
        graft_persist_wait(w, 1, NULL) != GRAFT_OK)
        return -1;
    graft_persist_writer_destroy(w);
    char step_dir[1024];
    snprintf(step_dir, sizeof(step_dir), "%s/step-%020d", root, 1);
    drop_cache(step_dir);
    graft_persist_restore_params_t p = {.rank = 0, .ranks = 1, .regions = &r, .nregions = 1};
    graft_persist_restore_result_t res;
    double t0 = graft_test_now_s();
    graft_status_t st = graft_persist_restore(root, &p, &res);
    double dt = graft_test_now_s() - t0;
    char cmd[1100];
    snprintf(cmd, sizeof(cmd), "rm -rf '%s'", root);
    if (system(cmd) != 0)
        fprintf(stderr, "could not remove %s\n", root);
    return st == GRAFT_OK ? dt : -1;
}

static void kill_all(pid_t *pids, int n)
{
    for (int g = 0; g < n; g++) {
        if (pids[g] <= 0)
            continue;
        kill(pids[g], SIGKILL);
        waitpid(pids[g], NULL, 0);
    }
}

/* Until every group committed 3 steps (and, with a spare, the spare is
 * registered, seen by *obs_p, an observer kept for the eviction as an
 * agent keeps one). 0, or -1 when a group died first or it took 300 s. */
static int wait_started(const char *job, int ready_fd, pid_t *pids, bool spare,
                        graft_membership_t **obs_p)
{
    int ready = 0;
    double give_up = graft_test_now_s() + 300;
    while (ready < GROUPS && graft_test_now_s() < give_up) {
        struct pollfd pf = {.fd = ready_fd, .events = POLLIN};
        char c;
        if (poll(&pf, 1, 200) == 1 && read(ready_fd, &c, 1) == 1)
            ready++;
        for (int g = 0; g < GROUPS; g++)
            if (waitpid(pids[g], NULL, WNOHANG) == pids[g])
                give_up = 0; /* a group died before the kill: give up */
    }
    if (ready < GROUPS || !spare)
        return ready < GROUPS ? -1 : 0;
    graft_etcd_config_t ec = {.endpoints = &run_cfg->endpoint, .n_endpoints = 1};
    graft_membership_config_t mc = {.job = job, .etcd = &ec, .observer = true};
    if (graft_membership_create(&mc, obs_p) != GRAFT_OK)
        return -1;
    size_t n = 0;
    while (n == 0 && graft_test_now_s() < give_up + 300) {
        graft_member_t *sp = NULL;
        if (graft_membership_spares_list(*obs_p, &sp, &n) != GRAFT_OK)
            n = 0;
        graft_membership_spares_free(sp, n);
        if (n == 0)
            usleep(20000);
    }
    return n > 0 ? 0 : -1;
}

/* Revoke the killed group's lease, as its agent would after waitpid(). */
static int evict(graft_membership_t *obs, pid_t pid)
{
    char host[256];
    if (gethostname(host, sizeof(host)) != 0)
        return -1;
    host[sizeof(host) - 1] = '\0';
    graft_status_t st = graft_membership_evict(obs, 1, 0, host, (int32_t)pid);
    if (st != GRAFT_OK)
        fprintf(stderr, "evict: %s\n", graft_status_string(st));
    return st == GRAFT_OK ? 0 : -1;
}

static void row_fill(graft_bench_rec_row_t *row, const rec_result_t *res, double t_kill,
                     graft_bench_successor_t successor)
{
    row->total = res->t_first_commit - t_kill;
    row->quorum = (double)res->m.last_quorum_phase_ns * 1e-9;
    row->transfer = (double)res->m.last_transfer_ns * 1e-9;
    row->verify = (double)res->m.last_verify_ns * 1e-9;
    if (successor == GRAFT_BENCH_RESPAWN) {
        row->detect = (res->t_init - t_kill) + (double)res->m.last_detect_ns * 1e-9;
        row->init = res->t_state - res->t_init;
    } else {
        /* The spare's own start was long before: kill -> joined is the
         * rest of the total. */
        row->init = 0;
        row->detect = row->total - row->quorum - row->transfer - row->verify;
    }
}

int graft_bench_recovery(const graft_bench_rec_config_t *cfg, size_t mib,
                         graft_bench_successor_t successor, graft_bench_rec_row_t *row)
{
    char job[64];
    int fds[2], rfds[2];
    bool spare = successor != GRAFT_BENCH_RESPAWN;
    run_cfg = cfg;
    run_follow = successor == GRAFT_BENCH_FOLLOW || successor == GRAFT_BENCH_FOLLOW_LAPSE;
    snprintf(job, sizeof(job), "bench-rec-%d-%d", (int)getpid(), job_seq++);
    blob_bytes = mib << 20;
    if (pipe(fds) != 0)
        return -1;
    if (pipe(rfds) != 0) {
        close(fds[0]);
        close(fds[1]);
        return -1;
    }
    pid_t pids[GROUPS + 1] = {0};
    for (int g = 0; g <= GROUPS; g++) {
        if (g == GROUPS && !spare)
            break;
        pids[g] = fork();
        if (pids[g] == 0)
            rec_child(job, g == GROUPS ? -1 : g, fds[1], rfds[1], g == GROUPS);
    }
    int rc = -1;
    rec_result_t res;
    memset(&res, 0, sizeof(res));
    graft_membership_t *obs = NULL;
    if (wait_started(job, rfds[0], pids, spare, &obs) != 0) {
        fprintf(stderr, "recovery of %zu MiB (%s): the groups never got going\n", mib,
                graft_bench_successor_name(successor));
        goto out;
    }
    double t_kill = graft_test_now_s();
    pid_t victim = pids[1];
    kill(victim, SIGKILL);
    waitpid(victim, NULL, 0);
    pids[1] = 0;
    if ((successor == GRAFT_BENCH_SPARE || successor == GRAFT_BENCH_FOLLOW) &&
        evict(obs, victim) != 0)
        goto out;
    if (!spare) {
        pids[GROUPS] = fork();
        if (pids[GROUPS] == 0)
            rec_child(job, 1, fds[1], rfds[1], true);
    }
    struct pollfd pf = {.fd = fds[0], .events = POLLIN};
    ssize_t n = poll(&pf, 1, 300 * 1000) == 1 ? read(fds[0], &res, sizeof(res)) : -1;
    if (n == sizeof(res) && res.ok) {
        memset(row, 0, sizeof(*row));
        row->mib = mib;
        row->successor = successor;
        row_fill(row, &res, t_kill, successor);
        row->restore = -1;
        rc = 0;
    }
out:
    graft_membership_destroy(obs);
    kill_all(pids, GROUPS + 1);
    close(fds[0]);
    close(fds[1]);
    close(rfds[0]);
    close(rfds[1]);
    if (rc != 0 || !cfg->with_restore)
        return rc;
    char root[256];
    snprintf(root, sizeof(root), "%s/graft-rtbench-%d", getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp",
             (int)getpid());
    blob = malloc(blob_bytes);
    if (blob == NULL)
        return -1;
    for (size_t i = 0; i < blob_bytes; i++)
        blob[i] = (uint8_t)(i * 131u);
    row->restore = restore_s(root);
    free(blob);
    blob = NULL;
    return row->restore < 0 ? -1 : 0;
}

/* What a follower costs: group 0 (the follower's donor) times `steps`
 * steps, quorum to commit with a step's compute (run_compute_us), and reports the
 * median after the first 5, its followers' wait and serves, then waits to
 * be killed; the other groups step on. */
typedef struct cost_result {
    double median;
    graft_metrics_t m;
} cost_result_t;

/* The follower's count of pulled steps, every 100 ms on its pipe (its
 * training thread waits in graft_quorum() for a slot that never opens). */
typedef struct follow_report {
    graft_runtime_t *rt;
    int fd;
} follow_report_t;

static void *follow_report_main(void *arg)
{
    follow_report_t *fr = arg;
    for (;;) {
        usleep(100000);
        graft_metrics_t m;
        graft_metrics_get(fr->rt, &m);
        if (write(fr->fd, &m.follow_pulls, sizeof(m.follow_pulls)) != sizeof(m.follow_pulls))
            _exit(6);
    }
    return NULL;
}

static void cost_child(const char *job, int group, int steps, int fd, int follow_fd)
{
    blob = malloc(blob_bytes);
    if (blob == NULL)
        _exit(1);
    memset(blob, group < 0 ? 0 : 1, blob_bytes);
    graft_runtime_t *rt = make_runtime(job, group);
    graft_region_t r = {"state", GRAFT_REGION_PARAM, 0, GRAFT_DEVICE_HOST, blob, blob_bytes, 0,
                        0};
    double *t = calloc((size_t)steps, sizeof(double));
    if (rt == NULL || t == NULL || graft_region_register(rt, &r) != GRAFT_OK)
        _exit(1);
    follow_report_t fr = {rt, follow_fd};
    pthread_t tid;
    if (group < 0 && pthread_create(&tid, NULL, follow_report_main, &fr) != 0)
        _exit(1);
    for (int s = 0;; s++) {
        bool apply = false;
        double t0 = graft_test_now_s();
        if (graft_quorum(rt, NULL) != GRAFT_OK)
            _exit(2);
        graft_status_t hst = graft_heal_wait(rt);
        (void)hst;
        usleep(run_compute_us);
        if (graft_commit(rt, &apply) != GRAFT_OK)
            _exit(3);
        if (apply)
            blob[(size_t)s * 4099u % blob_bytes]++;
        if (group != 0 || s >= steps)
            continue;
        t[s] = graft_test_now_s() - t0;
        if (s == steps - 1) {
            cost_result_t res = {graft_test_median(t + 5, (size_t)(steps - 5)), {0}};
            graft_metrics_get(rt, &res.m);
            if (write(fd, &res, sizeof(res)) != sizeof(res))
                _exit(4);
        }
    }
}

/* One run of the cost: group 0's result, and the steps the follower had
 * pulled by then (0 without one), or -1. */
static int cost_run(size_t mib, int steps, bool follower, cost_result_t *res,
                    uint64_t *pulled_p)
{
    char job[64];
    int fds[2], ffds[2];
    snprintf(job, sizeof(job), "bench-follow-%d-%d", (int)getpid(), job_seq++);
    blob_bytes = mib << 20;
    run_follow = follower;
    if (pipe(fds) != 0)
        return -1;
    if (pipe2(ffds, O_NONBLOCK) != 0) {
        close(fds[0]);
        close(fds[1]);
        return -1;
    }
    pid_t pids[GROUPS + 1] = {0};
    for (int g = 0; g < GROUPS + (follower ? 1 : 0); g++) {
        pids[g] = fork();
        if (pids[g] == 0)
            cost_child(job, g == GROUPS ? -1 : g, steps, fds[1], ffds[1]);
    }
    struct pollfd pf = {.fd = fds[0], .events = POLLIN};
    ssize_t n = poll(&pf, 1, 600 * 1000) == 1 ? read(fds[0], res, sizeof(*res)) : -1;
    *pulled_p = 0;
    uint64_t v;
    while (read(ffds[0], &v, sizeof(v)) == sizeof(v))
        *pulled_p = v; /* the last report */
    kill_all(pids, GROUPS + 1);
    close(fds[0]);
    close(fds[1]);
    close(ffds[0]);
    close(ffds[1]);
    return n == sizeof(*res) ? 0 : -1;
}

int graft_bench_follow_cost(const graft_bench_rec_config_t *cfg, size_t mib, int steps,
                            unsigned compute_ms, graft_bench_follow_row_t *row)
{
    cost_result_t alone, followed;
    uint64_t none, pulled;
    run_cfg = cfg;
    run_compute_us = compute_ms * 1000u;
    if (steps < 10 || cost_run(mib, steps, false, &alone, &none) != 0 ||
        cost_run(mib, steps, true, &followed, &pulled) != 0) {
        fprintf(stderr, "follow cost of %zu MiB: a run did not finish\n", mib);
        return -1;
    }
    row->mib = mib;
    row->compute_ms = compute_ms;
    row->step_alone = alone.median;
    row->step_followed = followed.median;
    row->wait = (double)followed.m.follow_wait_ns * 1e-9 / steps;
    row->served = (double)followed.m.follow_serves / steps;
    row->pulled = (double)pulled / steps;
    return 0;
}

static int cmp_row_total(const void *a, const void *b)
{
    const graft_bench_rec_row_t *x = a, *y = b;
    return x->total < y->total ? -1 : x->total > y->total;
}

graft_bench_rec_row_t graft_bench_rec_median(graft_bench_rec_row_t *rows, int n)
{
    qsort(rows, (size_t)n, sizeof(rows[0]), cmp_row_total);
    return rows[n / 2];
}
