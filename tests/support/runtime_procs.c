/* The process fixture of the runtime's end-to-end tests (runtime_procs.h). */
#include "runtime_procs.h"

char rp_trainer[1100];

double rp_now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

/* Every job directory, removed by the group teardown even when a test
 * failed half way. */
static char made_dirs[16][256];
static int n_made_dirs;
/* Every trainer started, killed by the teardown if a failed test left it. */
static pid_t spawned[128];
static int n_spawned;

void rp_job_init(job_t *j, const char *name)
{
    memset(j, 0, sizeof(*j));
    snprintf(j->dir, sizeof(j->dir), "%s/graft-rt-XXXXXX",
             getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp");
    assert_non_null(mkdtemp(j->dir));
    if (n_made_dirs < 16)
        memcpy(made_dirs[n_made_dirs++], j->dir, sizeof(j->dir));
    snprintf(j->name, sizeof(j->name), "%s-%d", name, (int)getpid());
}

void rp_rm_rf(const char *path)
{
    char cmd[300];
    snprintf(cmd, sizeof(cmd), "rm -rf '%s'", path);
    if (system(cmd) != 0)
        fprintf(stderr, "could not remove %s\n", path);
}

static proc_t *spawn(job_t *j, int group, int rank, bool spare, const char *spare_group,
                     const char *const *flags)
{
    assert_true(j->n < MAX_PROCS);
    proc_t *p = &j->p[j->n];
    memset(p, 0, sizeof(*p));
    p->spare = spare;
    p->group = group;
    p->rank = rank;
    char dir[sizeof(j->dir)];
    int idx = j->n;
    memcpy(dir, j->dir, sizeof(dir));
    snprintf(p->out, sizeof(p->out), "%s/out.%d.%d.%d", dir, group, rank, idx);
    snprintf(p->log, sizeof(p->log), "%s/log.%d.%d.%d", dir, group, rank, idx);
    snprintf(p->err, sizeof(p->err), "%s/err.%d.%d.%d", dir, group, rank, idx);
    snprintf(p->role, sizeof(p->role), "%s/role.%d.%d.%d", dir, group, rank, idx);
    bool capture_err = j->capture_err;
    const char *args[32];
    size_t n = 0;
    args[n++] = rp_trainer;
    args[n++] = "--hash-log";
    args[n++] = p->log;
    args[n++] = "--role-log";
    args[n++] = p->role;
    for (size_t i = 0; flags != NULL && flags[i] != NULL && n < 30; i++)
        args[n++] = flags[i];
    args[n] = NULL;
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        char v[32];
        setenv("GRAFT_JOB", j->name, 1);
        setenv("GRAFT_ETCD_ENDPOINTS", graft_etcd_server_endpoint(rtf_etcd.server), 1);
        snprintf(v, sizeof(v), "%d", group);
        if (spare) {
            setenv("GRAFT_SPARE", "1", 1);
            unsetenv("GRAFT_GROUP");
            if (spare_group != NULL)
                setenv("GRAFT_SPARE_GROUP", spare_group, 1);
        } else {
            setenv("GRAFT_GROUP", v, 1);
        }
        snprintf(v, sizeof(v), "%d", rank);
        setenv("GRAFT_RANK", v, 1);
        snprintf(v, sizeof(v), "%d", R);
        setenv("GRAFT_RANKS_PER_GROUP", v, 1);
        snprintf(v, sizeof(v), "%d", G);
        setenv("GRAFT_GROUPS", v, 1);
        setenv("GRAFT_LEASE_TTL_MS", "2000", 1);
        setenv("GRAFT_JOIN_TIMEOUT_MS", "1000", 1);
        setenv("GRAFT_FENCE_TIMEOUT_MS", "3000", 1);
        setenv("GRAFT_STALL_TIMEOUT_MS", "1000", 1);
        setenv("GRAFT_QUORUM_TIMEOUT_MS", "60000", 1);
        if (getenv("GRAFT_LOG") == NULL)
            setenv("GRAFT_LOG", "warn", 1);
        for (size_t i = 0; i < 8 && j->extra_env[i] != NULL; i++)
            putenv((char *)j->extra_env[i]);
        int fd = open(p->out, O_WRONLY | O_CREAT | O_TRUNC, 0644);
        if (fd >= 0) {
            dup2(fd, 1);
            close(fd);
        }
        if (capture_err) {
            fd = open(p->err, O_WRONLY | O_CREAT | O_TRUNC, 0644);
            if (fd >= 0) {
                dup2(fd, 2);
                close(fd);
            }
        }
        execv(rp_trainer, (char *const *)args);
        _exit(127);
    }
    p->pid = pid;
    j->n++;
    if (n_spawned < 128)
        spawned[n_spawned++] = pid;
    return p;
}

proc_t *rp_spawn(job_t *j, int group, int rank, const char *const *flags)
{
    return spawn(j, group, rank, false, NULL, flags);
}

proc_t *rp_spawn_spare(job_t *j, int rank, const char *const *flags)
{
    return spawn(j, -1, rank, true, NULL, flags);
}

proc_t *rp_spawn_spare_in(job_t *j, const char *spare_group, int rank, const char *const *flags)
{
    return spawn(j, -1, rank, true, spare_group, flags);
}

int rp_spare_group(const proc_t *p)
{
    FILE *f = fopen(p->out, "r");
    int group = -1;
    char line[256];
    while (f != NULL && fgets(line, sizeof(line), f) != NULL)
        if (sscanf(line, "spare promoted to group %d", &group) == 1)
            break;
    if (f != NULL)
        fclose(f);
    return group;
}

graft_membership_t *rp_observe(const char *job, uint32_t ranks)
{
    const char *ep = graft_etcd_server_endpoint(rtf_etcd.server);
    graft_etcd_config_t ec = graft_test_etcd_config(&ep, 1, 2000);
    graft_membership_config_t mc = {.job = job, .etcd = &ec, .observer = true,
                                    .ranks_per_group = ranks};
    graft_membership_t *m = NULL;
    assert_int_equal(graft_membership_create(&mc, &m), GRAFT_OK);
    return m;
}

int rp_slot_pid(graft_membership_t *obs, int group, int rank)
{
    graft_membership_view_t *v = NULL;
    assert_int_equal(graft_membership_view_get(obs, &v), GRAFT_OK);
    int pid = 0;
    for (size_t i = 0; i < v->n_members; i++)
        if ((int)v->members[i].group == group && (int)v->members[i].rank == rank)
            pid = v->members[i].pid;
    graft_membership_view_free(v);
    return pid;
}

size_t rp_spares_registered(graft_membership_t *obs)
{
    graft_member_t *sp = NULL;
    size_t n = 0;
    assert_int_equal(graft_membership_spares_list(obs, &sp, &n), GRAFT_OK);
    for (size_t i = 0; i < n; i++)
        assert_int_equal(sp[i].group, UINT32_MAX);
    graft_membership_spares_free(sp, n);
    return n;
}

void rp_wait_spares(graft_membership_t *obs, size_t n, double timeout_s)
{
    double end = rp_now_s() + timeout_s;
    while (rp_spares_registered(obs) != n) {
        if (rp_now_s() > end)
            fail_msg("%zu spares registered, not %zu, after %.0f s", rp_spares_registered(obs), n,
                     timeout_s);
        usleep(50000);
    }
}

void rp_spawn_all(job_t *j, const char *const *flags)
{
    for (int g = 0; g < G; g++)
        for (int r = 0; r < R; r++)
            rp_spawn(j, g, r, flags);
}

void rp_wait_proc(proc_t *p, double timeout_s)
{
    double end = rp_now_s() + timeout_s;
    while (waitpid(p->pid, &p->status, WNOHANG) != p->pid) {
        if (rp_now_s() > end)
            fail_msg("group %d rank %d did not end within %.0f s", p->group, p->rank, timeout_s);
        usleep(10000);
    }
    p->done = true;
}

void rp_wait_all(job_t *j, double timeout_s)
{
    double end = rp_now_s() + timeout_s;
    for (;;) {
        bool all = true;
        for (int i = 0; i < j->n; i++) {
            proc_t *p = &j->p[i];
            if (p->done)
                continue;
            pid_t r = waitpid(p->pid, &p->status, WNOHANG);
            if (r == p->pid)
                p->done = true;
            else
                all = false;
        }
        if (all)
            return;
        if (rp_now_s() > end) {
            for (int i = 0; i < j->n; i++)
                if (!j->p[i].done) {
                    kill(j->p[i].pid, SIGKILL);
                    waitpid(j->p[i].pid, &j->p[i].status, 0);
                    j->p[i].done = true;
                }
            fail_msg("trainers did not finish within %.0f s", timeout_s);
        }
        usleep(20000);
    }
}

int rp_wait_job_lost(job_t *j, double timeout_s, double grace_s)
{
    double end = rp_now_s() + timeout_s, first_gone = 0.0;
    int killed = 0;
    for (;;) {
        bool all = true;
        for (int i = 0; i < j->n; i++) {
            proc_t *p = &j->p[i];
            if (!p->done && waitpid(p->pid, &p->status, WNOHANG) == p->pid)
                p->done = true;
            all = all && p->done;
            if (p->done && first_gone == 0.0)
                first_gone = rp_now_s();
        }
        if (all)
            break;
        if (rp_now_s() > end)
            fail_msg("no trainer of the job died within %.0f s", timeout_s);
        if (first_gone > 0.0 && rp_now_s() - first_gone > grace_s) {
            for (int i = 0; i < j->n; i++)
                if (!j->p[i].done) {
                    kill(j->p[i].pid, SIGKILL);
                    waitpid(j->p[i].pid, &j->p[i].status, 0);
                    j->p[i].done = true;
                    killed++;
                }
        }
        usleep(20 * 1000);
    }
    if (killed > 0)
        print_message("# %d trainer(s) still waiting %.0f s after the first died: killed\n",
                      killed, grace_s);
    return killed;
}

void rp_kill_proc(proc_t *p)
{
    assert_int_equal(kill(p->pid, SIGKILL), 0);
    assert_int_equal(waitpid(p->pid, &p->status, 0), p->pid);
    p->done = true;
}

int rp_log_lines(const char *path)
{
    FILE *f = fopen(path, "r");
    int n = 0, c;
    if (f == NULL)
        return 0;
    while ((c = fgetc(f)) != EOF)
        n += c == '\n';
    fclose(f);
    return n;
}

void rp_print_err_tail(const proc_t *p)
{
    char cmd[sizeof(p->err) + 32];
    if (p->err[0] == '\0' || access(p->err, F_OK) != 0)
        return;
    snprintf(cmd, sizeof(cmd), "tail -n 40 '%s' >&2", p->err);
    if (system(cmd) != 0)
        fprintf(stderr, "(could not read %s)\n", p->err);
}

void rp_wait_log(const proc_t *p, int lines, double timeout_s)
{
    double end = rp_now_s() + timeout_s;
    while (rp_log_lines(p->log) < lines) {
        if (rp_now_s() > end) {
            rp_print_err_tail(p);
            fail_msg("%s did not reach %d commits", p->log, lines);
        }
        usleep(10000);
    }
}

bool rp_file_contains(const char *path, const char *needle)
{
    char buf[16384];
    FILE *f = fopen(path, "r");
    if (f == NULL)
        return false;
    size_t n = fread(buf, 1, sizeof(buf) - 1, f);
    fclose(f);
    buf[n] = '\0';
    return strstr(buf, needle) != NULL;
}

/* The trainer's output, past a promoted spare's line that precedes it. */
static FILE *open_output(const proc_t *p, char *line, size_t len)
{
    FILE *f = fopen(p->out, "r");
    assert_non_null(f);
    do
        assert_non_null(fgets(line, (int)len, f));
    while (strncmp(line, "spare promoted", 14) == 0);
    return f;
}

void rp_read_final(const proc_t *p, uint64_t *step, char hash[17], char start[16],
                   uint64_t *recoveries)
{
    char line[256] = "";
    fclose(open_output(p, line, sizeof(line)));
    if (sscanf(line, "final step %" SCNu64 " hash %16s start %15s recoveries %" SCNu64, step,
               hash, start, recoveries) != 4)
        fail_msg("unexpected trainer output '%s' in %s", line, p->out);
}

void rp_read_metrics(const proc_t *p, trainer_metrics_t *m)
{
    char line[512];
    FILE *f = open_output(p, line, sizeof(line));
    assert_non_null(fgets(line, sizeof(line), f));
    fclose(f);
    if (sscanf(line, "metrics commits %" SCNu64 " commits_failed %" SCNu64 " drift_checks %" SCNu64
               " drift_mismatches %" SCNu64 " restores %" SCNu64 " recovery_failures %" SCNu64
               " serves %" SCNu64 " checkpoints_written %" SCNu64 " checkpoints_committed %"
               SCNu64 " steady_steps %" SCNu64 " steady_fallbacks %" SCNu64 " etcd_requests %"
               SCNu64 " remote_uploaded %" SCNu64 " remote_superseded %" SCNu64,
               &m->commits, &m->commits_failed, &m->drift_checks, &m->drift_mismatches,
               &m->restores, &m->recovery_failures, &m->serves, &m->checkpoints_written,
               &m->checkpoints_committed, &m->steady_steps, &m->steady_fallbacks,
               &m->etcd_requests, &m->remote_uploaded, &m->remote_superseded) != 14)
        fail_msg("unexpected metrics line '%s' in %s", line, p->out);
}

/* The fault-free reference: the same training without the runtime. */
static void rp_reference_hash_blob(int rank, int steps, int blob_mib, char hash[17])
{
    char cmd[1300];
    snprintf(cmd, sizeof(cmd), "GRAFT_RANK=%d '%s' --no-graft --steps %d --blob-mib %d", rank,
             rp_trainer, steps, blob_mib);
    FILE *f = popen(cmd, "r");
    char line[256] = "";
    uint64_t step, rec;
    char start[16];
    assert_non_null(f);
    assert_non_null(fgets(line, sizeof(line), f));
    assert_int_equal(pclose(f), 0);
    assert_int_equal(sscanf(line, "final step %" SCNu64 " hash %16s start %15s recoveries %" SCNu64,
                            &step, hash, start, &rec), 4);
    assert_int_equal(step, (uint64_t)steps);
}

int rp_check_final_blob(job_t *j, int steps, int blob_mib)
{
    char ref[R][17];
    int recovered = 0;
    for (int r = 0; r < R; r++)
        rp_reference_hash_blob(r, steps, blob_mib, ref[r]);
    for (int i = 0; i < j->n; i++) {
        proc_t *p = &j->p[i];
        if (WIFSIGNALED(p->status))
            continue; /* killed on purpose */
        if (!WIFEXITED(p->status) || WEXITSTATUS(p->status) != 0)
            fail_msg("group %d rank %d (%s) exited with status 0x%x", p->group, p->rank, p->out,
                     p->status);
        if (p->spare && rp_file_contains(p->out, "spare unused"))
            continue; /* the job ended without needing it */
        uint64_t step, rec;
        char hash[17], start[16];
        rp_read_final(p, &step, hash, start, &rec);
        assert_int_equal(step, (uint64_t)steps);
        if (strcmp(hash, ref[p->rank]) != 0)
            fail_msg("group %d rank %d ended with %s, the fault-free run with %s", p->group,
                     p->rank, hash, ref[p->rank]);
        recovered += strcmp(start, "peer") == 0;
    }
    return recovered;
}

int rp_check_final(job_t *j, int steps)
{
    return rp_check_final_blob(j, steps, 0);
}

void rp_check_logs(job_t *j, int steps)
{
    for (int r = 0; r < R; r++) {
        char seen[512][17];
        bool have[512] = {false};
        assert_true(steps < 512);
        for (int i = 0; i < j->n; i++) {
            if (j->p[i].rank != r)
                continue;
            FILE *f = fopen(j->p[i].log, "r");
            if (f == NULL)
                continue;
            unsigned s;
            char h[17];
            while (fscanf(f, "%u %16s", &s, h) == 2) {
                assert_true(s <= (unsigned)steps);
                if (!have[s]) {
                    memcpy(seen[s], h, 17);
                    have[s] = true;
                } else if (strcmp(seen[s], h) != 0) {
                    fail_msg("rank %d step %u: %s holds %s, another group %s", r, s,
                             j->p[i].log, h, seen[s]);
                }
            }
            fclose(f);
        }
    }
}

void rp_check_restarted_from(job_t *j, int first_new, unsigned first_step)
{
    for (int i = first_new; i < j->n; i++) {
        FILE *lf = fopen(j->p[i].log, "r");
        unsigned first = 0;
        char h[17];
        assert_non_null(lf);
        assert_int_equal(fscanf(lf, "%u %16s", &first, h), 2);
        fclose(lf);
        assert_int_equal(first, first_step);
        uint64_t step, rec;
        char hash[17], start[16];
        rp_read_final(&j->p[i], &step, hash, start, &rec);
        if (strcmp(start, "restore") != 0 && strcmp(start, "peer") != 0)
            fail_msg("group %d rank %d started %s", j->p[i].group, j->p[i].rank, start);
    }
}

int rp_setup(void **state)
{
    (void)state;
    char self[1024];
    ssize_t n = readlink("/proc/self/exe", self, sizeof(self) - 1);
    if (n <= 0)
        return -1;
    self[n] = '\0';
    char *slash = strrchr(self, '/');
    *slash = '\0';
    snprintf(rp_trainer, sizeof(rp_trainer), "%s/../bin/train_mlp", self);
    if (access(rp_trainer, X_OK) != 0) {
        fprintf(stderr, "no trainer at %s (build with `make tests`)\n", rp_trainer);
        return -1;
    }
    signal(SIGPIPE, SIG_IGN);
    return graft_test_etcd_start(&rtf_etcd, NULL);
}

int rp_teardown(void **state)
{
    (void)state;
    for (int i = 0; i < n_spawned; i++)
        if (waitpid(spawned[i], NULL, WNOHANG) == 0) {
            kill(spawned[i], SIGKILL);
            waitpid(spawned[i], NULL, 0);
        }
    for (int i = 0; i < n_made_dirs; i++)
        if (access(made_dirs[i], F_OK) == 0)
            rp_rm_rf(made_dirs[i]);
    graft_test_etcd_stop(&rtf_etcd);
    return 0;
}
