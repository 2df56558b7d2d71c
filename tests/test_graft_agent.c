/*
 * graft-agent (tools/graft_agent/, docs/OPERATIONS.md "graft-agent") end to
 * end: real etcd, real train_mlp processes on UCX over loopback, each group
 * of a 2-group x 2-rank job run by an agent of its own, as two hosts would.
 * The cases:
 *  - spares: 1 spare per rank on each agent; a rank SIGKILLed, a spare takes
 *    its slot, the agent starts a spare in its place (the job's spare count
 *    is back), and the job ends bit-identical to train_mlp --no-graft;
 *  - --launcher: a group world (a torchrun-like script) with a spare world;
 *    a rank killed, the world's records evicted, the spare world takes both
 *    slots, the dead world comes back as a spare world; bit-identical;
 *  - no spares: the dead rank is started again in place after its back-off
 *    and heals; bit-identical again;
 *  - a command that keeps failing: back-off doubling, then the agent gives
 *    up with exit 1 and says why;
 *  - usage: --help, errors, --dry-run;
 *  - the deployment files of deploy/ (Slurm and Kubernetes) checked offline
 *    by scripts/check-deploy.py.
 * TEST_FILTER=<glob> runs some tests only.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <dirent.h>
#include <inttypes.h>
#include <jansson.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <graft/membership.h>

#include "runtime_procs.h"

#define AG_GROUPS 2
#define AG_RANKS 2
#define AG_STEPS 60
static const char *const trainer_flags[] = {"--steps", "60", "--step-delay-ms", "50", NULL};

static char agent_bin[1100];

typedef struct agent_proc {
    pid_t pid;
    int status;
    char dir[300]; /* its processes' output (--log-dir) and hash logs */
    char status_file[400];
    char metrics_file[400];
    char err[400]; /* the agent's own stderr: its event lines */
} agent_proc_t;

/* Run graft-agent with args (NULL-terminated) to the end; its exit status,
 * its stdout and stderr in out (may be NULL). */
static int agent_run(const char *const *args, char *out, size_t len)
{
    char cmd[4096];
    size_t n = (size_t)snprintf(cmd, sizeof(cmd), "'%s'", agent_bin);
    for (size_t i = 0; args[i] != NULL && n < sizeof(cmd); i++)
        n += (size_t)snprintf(cmd + n, sizeof(cmd) - n, " '%s'", args[i]);
    snprintf(cmd + n, sizeof(cmd) - n, " 2>&1");
    FILE *f = popen(cmd, "r");
    assert_non_null(f);
    size_t got = 0;
    if (out != NULL) {
        got = fread(out, 1, len - 1, f);
        out[got] = '\0';
    } else {
        char sink[4096];
        while (fread(sink, 1, sizeof(sink), f) > 0)
            ;
    }
    int st = pclose(f);
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

/* Start an agent for group @p group of job @p job with one more option
 * (mode, may be NULL) and the command after "--" (NULL: train_mlp with
 * trainer_flags and a hash log per process). */
static void agent_start_cmd(agent_proc_t *ap, const char *job, const char *dir, int group,
                            int spares, const char *backoff_ms, const char *mode,
                            const char *const *cmd)
{
    memset(ap, 0, sizeof(*ap));
    snprintf(ap->dir, sizeof(ap->dir), "%s/agent%d", dir, group);
    assert_int_equal(mkdir(ap->dir, 0755), 0);
    snprintf(ap->status_file, sizeof(ap->status_file), "%s/status.json", ap->dir);
    snprintf(ap->metrics_file, sizeof(ap->metrics_file), "%s/metrics.prom", ap->dir);
    snprintf(ap->err, sizeof(ap->err), "%s/agent.err", ap->dir);
    char g[16], s[16], hashlog[400];
    snprintf(g, sizeof(g), "%d", group);
    snprintf(s, sizeof(s), "%d", spares);
    snprintf(hashlog, sizeof(hashlog), "%s/log.{slot}.{start}", ap->dir);
    const char *trainer[] = {rp_trainer, "--hash-log", hashlog, trainer_flags[0], trainer_flags[1],
                             trainer_flags[2], trainer_flags[3], NULL};
    const char *argv[40] = {agent_bin, "--group", g, "--spares", s, "--log-dir", ap->dir,
                            "--status-file", ap->status_file, "--metrics-file", ap->metrics_file,
                            "--backoff-ms", backoff_ms, "--max-restarts", "3", "--stop-grace-ms",
                            "3000"};
    size_t n = 17;
    if (mode != NULL)
        argv[n++] = mode;
    argv[n++] = "--";
    for (size_t i = 0; (cmd != NULL ? cmd : trainer)[i] != NULL && n < 39; i++)
        argv[n++] = (cmd != NULL ? cmd : trainer)[i];
    argv[n] = NULL;
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        setenv("GRAFT_JOB", job, 1);
        setenv("GRAFT_ETCD_ENDPOINTS", graft_etcd_server_endpoint(rtf_etcd.server), 1);
        setenv("GRAFT_GROUPS", "2", 1);
        setenv("GRAFT_RANKS_PER_GROUP", "2", 1);
        setenv("GRAFT_LEASE_TTL_MS", "2000", 1);
        setenv("GRAFT_JOIN_TIMEOUT_MS", "1000", 1);
        setenv("GRAFT_FENCE_TIMEOUT_MS", "3000", 1);
        setenv("GRAFT_STALL_TIMEOUT_MS", "1000", 1);
        setenv("GRAFT_QUORUM_TIMEOUT_MS", "60000", 1);
        if (getenv("GRAFT_LOG") == NULL)
            setenv("GRAFT_LOG", "warn", 1);
        FILE *e = freopen(ap->err, "w", stderr);
        (void)e;
        execv(agent_bin, (char *const *)argv);
        _exit(127);
    }
    ap->pid = pid;
}

static void agent_start(agent_proc_t *ap, const char *job, const char *dir, int group, int spares,
                        const char *backoff_ms)
{
    agent_start_cmd(ap, job, dir, group, spares, backoff_ms, NULL, NULL);
}

static void agent_wait(agent_proc_t *ap, double timeout_s)
{
    double end = rp_now_s() + timeout_s;
    while (waitpid(ap->pid, &ap->status, WNOHANG) != ap->pid) {
        if (rp_now_s() > end) {
            kill(ap->pid, SIGTERM);
            waitpid(ap->pid, &ap->status, 0);
            fail_msg("agent %s did not end within %.0f s", ap->dir, timeout_s);
        }
        usleep(50000);
    }
    if (!WIFEXITED(ap->status) || WEXITSTATUS(ap->status) != 0) {
        char cmd[500];
        snprintf(cmd, sizeof(cmd), "tail -n 30 '%s' >&2", ap->err);
        if (system(cmd) != 0)
            fprintf(stderr, "(no %s)\n", ap->err);
        fail_msg("agent %s ended with status 0x%x", ap->dir, ap->status);
    }
}

static json_t *status_of(const agent_proc_t *ap)
{
    json_error_t err;
    json_t *j = json_load_file(ap->status_file, 0, &err);
    if (j == NULL)
        fail_msg("%s: %s", ap->status_file, err.text);
    return j;
}

static int64_t counter(const agent_proc_t *ap, const char *name)
{
    json_t *j = status_of(ap);
    int64_t v = json_integer_value(json_object_get(json_object_get(j, "counters"), name));
    json_decref(j);
    return v;
}

/* The pid of the running unit of @p kind and rank @p rank; 0: none. */
static pid_t unit_pid(const agent_proc_t *ap, const char *kind, int rank)
{
    json_t *j = status_of(ap), *u;
    size_t i;
    pid_t pid = 0;
    json_array_foreach(json_object_get(j, "units"), i, u) {
        if (strcmp(json_string_value(json_object_get(u, "kind")), kind) == 0 &&
            json_integer_value(json_object_get(u, "rank")) == rank &&
            strcmp(json_string_value(json_object_get(u, "state")), "running") == 0)
            pid = (pid_t)json_integer_value(json_object_get(u, "pid"));
    }
    json_decref(j);
    return pid;
}

static void wait_lines(const char *path, int lines, double timeout_s)
{
    double end = rp_now_s() + timeout_s;
    while (rp_log_lines(path) < lines) {
        if (rp_now_s() > end)
            fail_msg("%s did not reach %d commits within %.0f s", path, lines, timeout_s);
        usleep(20000);
    }
}

/* train_mlp --no-graft: rank r's hash after AG_STEPS steps. */
static void reference_hash(int rank, char hash[17])
{
    char cmd[1300], line[256] = "", start[16];
    uint64_t step, rec;
    snprintf(cmd, sizeof(cmd), "GRAFT_RANK=%d '%s' --no-graft --steps %d", rank, rp_trainer,
             AG_STEPS);
    FILE *f = popen(cmd, "r");
    assert_non_null(f);
    assert_non_null(fgets(line, sizeof(line), f));
    assert_int_equal(pclose(f), 0);
    assert_int_equal(sscanf(line, "final step %" SCNu64 " hash %16s start %15s recoveries %" SCNu64,
                            &step, hash, start, &rec), 4);
}

typedef struct outcome {
    int finished, unused, unfinished, promoted, healed;
} outcome_t;

/* Every process an agent started (its *.out files): a final line with the
 * reference hash of its rank, or "spare unused", or (a process killed)
 * neither. */
static void check_outputs(const agent_proc_t *ap, char ref[AG_RANKS][17], outcome_t *o)
{
    DIR *d = opendir(ap->dir);
    struct dirent *e;
    assert_non_null(d);
    while ((e = readdir(d)) != NULL) {
        size_t n = strlen(e->d_name);
        const char *r = strstr(e->d_name, "-r");
        if (n < 4 || strcmp(e->d_name + n - 4, ".out") != 0 || r == NULL || r[2] < '0' ||
            r[2] > '9')
            continue; /* not a process's, or a launcher's own output */
        int rank = atoi(r + 2);
        assert_true(rank >= 0 && rank < AG_RANKS);
        char path[700], line[256], hash[17], start[16];
        snprintf(path, sizeof(path), "%s/%s", ap->dir, e->d_name);
        FILE *f = fopen(path, "r");
        bool final = false;
        uint64_t step, rec;
        assert_non_null(f);
        while (fgets(line, sizeof(line), f) != NULL) {
            int g;
            if (sscanf(line, "spare promoted to group %d", &g) == 1)
                o->promoted++;
            if (strncmp(line, "spare unused", 12) == 0)
                o->unused++;
            if (sscanf(line, "final step %" SCNu64 " hash %16s start %15s recoveries %" SCNu64,
                       &step, hash, start, &rec) == 4) {
                final = true;
                assert_int_equal(step, AG_STEPS);
                if (strcmp(hash, ref[rank]) != 0)
                    fail_msg("%s ended with %s, the fault-free run with %s", path, hash, ref[rank]);
                o->healed += strcmp(start, "peer") == 0;
            }
        }
        fclose(f);
        o->finished += final;
        o->unfinished += !final && !rp_file_contains(path, "spare unused");
    }
    closedir(d);
}

/* The agents' event lines, in the test's output (CI keeps it, not the
 * directory). */
static void print_events(const agent_proc_t *ag)
{
    for (int g = 0; g < AG_GROUPS; g++) {
        char cmd[500];
        snprintf(cmd, sizeof(cmd), "grep '^graft-agent:' '%s' | sed 's/^/# /'", ag[g].err);
        if (system(cmd) != 0)
            print_message("# (no events in %s)\n", ag[g].err);
    }
}

static void check_job(agent_proc_t *ag, outcome_t *o, int killed)
{
    char ref[AG_RANKS][17];
    for (int r = 0; r < AG_RANKS; r++)
        reference_hash(r, ref[r]);
    memset(o, 0, sizeof(*o));
    for (int i = 0; i < AG_GROUPS; i++)
        check_outputs(&ag[i], ref, o);
    /* Every slot ended at the last step with the reference's state; the one
     * process killed has no final line. */
    assert_int_equal(o->finished, AG_GROUPS * AG_RANKS);
    assert_int_equal(o->unfinished, killed);
}

static void job_dir(char *dir, size_t len)
{
    snprintf(dir, len, "%s/graft-agent-XXXXXX", getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp");
    assert_non_null(mkdtemp(dir));
}

/* Kill a running rank of group 0 (the agent's slot of rank 1) and return
 * its pid, once group 0 committed a few steps. */
static pid_t kill_rank(agent_proc_t *ap)
{
    char log[400];
    snprintf(log, sizeof(log), "%s/log.1.0", ap->dir);
    wait_lines(log, 5, 60);
    pid_t victim = unit_pid(ap, "rank", 1);
    assert_true(victim > 0);
    assert_int_equal(kill(victim, SIGKILL), 0);
    return victim;
}

/* With one spare per rank on each agent: the SIGKILLed rank's slot goes to
 * a spare (this agent's or the other's), the dead rank's agent starts a
 * spare in its place, so the job again has its 4 spares, and the job ends
 * bit-identical. */
static void test_spare_takes_slot_and_is_replaced(void **state)
{
    (void)state;
    char dir[256], job[64];
    job_dir(dir, sizeof(dir));
    snprintf(job, sizeof(job), "agent-spares-%d", (int)getpid());
    agent_proc_t ag[AG_GROUPS];
    for (int g = 0; g < AG_GROUPS; g++)
        agent_start(&ag[g], job, dir, g, 1, "200");
    graft_membership_t *obs = rp_observe(job, AG_RANKS);
    rp_wait_spares(obs, AG_GROUPS * AG_RANKS, 60);
    pid_t victim = kill_rank(&ag[0]);
    double killed = rp_now_s(), end = killed + 20;
    while (rp_slot_pid(obs, 0, 1) == victim || rp_slot_pid(obs, 0, 1) == 0) {
        if (rp_now_s() > end)
            fail_msg("no spare took slot (0, 1) within 20 s");
        usleep(10000);
    }
    print_message("# slot (0, 1) taken by a spare %.2f s after the kill (lease TTL 2 s)\n",
                  rp_now_s() - killed);
    /* The dead rank's agent started a spare in its place. */
    rp_wait_spares(obs, AG_GROUPS * AG_RANKS, 20);
    for (int g = 0; g < AG_GROUPS; g++)
        agent_wait(&ag[g], 60);
    outcome_t o;
    check_job(ag, &o, 1);
    assert_int_equal(o.promoted, 1);
    assert_int_equal(o.healed, 1);
    assert_int_equal(counter(&ag[0], "failures"), 1);
    assert_int_equal(counter(&ag[0], "restarts"), 1);
    assert_int_equal(counter(&ag[0], "promotions") + counter(&ag[1], "promotions"), 1);
    assert_true(rp_file_contains(ag[0].metrics_file, "graft_agent_restarts_total 1\n"));
    assert_true(rp_file_contains(ag[0].metrics_file, "graft_agent_state{state=\"finished\"} 1"));
    assert_true(rp_file_contains(ag[0].err, "restart as a spare"));
    /* The agent saw its process die: the slot was freed at once. */
    assert_true(rp_file_contains(ag[0].err, "evicted: slot 1: the record of (group 0, rank 1)"));
    print_events(ag);
    graft_membership_destroy(obs);
    rp_rm_rf(dir);
}

/* A launcher of one group world, as torchrun: every rank, each with its
 * own output and hash log; when one fails the others are killed and the
 * launcher exits with the failure's status. */
static const char launcher_sh[] =
    "#!/bin/bash\n"
    "trainer=$1; out=$2; shift 2\n"
    "pids=()\n"
    "for r in 0 1; do\n"
    "    GRAFT_RANK=$r \"$trainer\" --hash-log \"$out-r$r.log\" \"$@\" >\"$out-r$r.out\" &\n"
    "    pids+=($!)\n"
    "done\n"
    "for _ in 0 1; do\n"
    "    wait -n; rc=$?\n"
    "    if [ $rc -ne 0 ]; then kill -9 \"${pids[@]}\" 2>/dev/null; wait; exit $rc; fi\n"
    "done\n";

/* --launcher: group 0 is one world, with a spare world beside it; group 1
 * an agent of ranks. A rank of group 0 is SIGKILLed, its launcher kills
 * the other: the agent evicts both records it saw below the launcher, the
 * spare world's two spares take both slots (seen below the spare world's
 * launcher), the dead world is started again whole as a spare world, and
 * the job ends bit-identical. */
static void test_launcher_world_replaced_by_spare_world(void **state)
{
    (void)state;
    char dir[256], job[64], script[400], out[400];
    job_dir(dir, sizeof(dir));
    snprintf(job, sizeof(job), "agent-launcher-%d", (int)getpid());
    snprintf(script, sizeof(script), "%s/launcher.sh", dir);
    FILE *f = fopen(script, "w");
    assert_non_null(f);
    fputs(launcher_sh, f);
    fclose(f);
    assert_int_equal(chmod(script, 0755), 0);
    agent_proc_t ag[AG_GROUPS];
    snprintf(out, sizeof(out), "%s/agent0/launched-s{slot}-{start}", dir);
    const char *cmd[] = {script, rp_trainer, out, trainer_flags[0], trainer_flags[1],
                         trainer_flags[2], trainer_flags[3], NULL};
    agent_start_cmd(&ag[0], job, dir, 0, 1, "200", "--launcher", cmd);
    agent_start(&ag[1], job, dir, 1, 0, "200");
    graft_membership_t *obs = rp_observe(job, AG_RANKS);
    rp_wait_spares(obs, AG_RANKS, 60);
    char log[500];
    snprintf(log, sizeof(log), "%s/agent0/launched-s0-0-r1.log", dir);
    wait_lines(log, 5, 60);
    int victim = rp_slot_pid(obs, 0, 1), other = rp_slot_pid(obs, 0, 0);
    assert_true(victim > 0 && other > 0);
    assert_int_equal(kill(victim, SIGKILL), 0);
    double end = rp_now_s() + 20;
    for (int r = 0; r < AG_RANKS; r++)
        while (rp_slot_pid(obs, 0, r) == victim || rp_slot_pid(obs, 0, r) == other ||
               rp_slot_pid(obs, 0, r) == 0) {
            if (rp_now_s() > end)
                fail_msg("no spare took slot (0, %d) within 20 s", r);
            usleep(10000);
        }
    rp_wait_spares(obs, AG_RANKS, 20); /* the restarted world's two spares */
    for (int g = 0; g < AG_GROUPS; g++)
        agent_wait(&ag[g], 60);
    print_events(ag);
    outcome_t o;
    check_job(ag, &o, 2);
    assert_int_equal(o.promoted, 2);
    assert_int_equal(counter(&ag[0], "restarts"), 1);
    assert_int_equal(counter(&ag[0], "promotions"), 1);
    assert_true(rp_file_contains(ag[0].err, "evicted: slot 0: the record of (group 0, rank 1)"));
    assert_true(rp_file_contains(ag[0].err, "spare_promoted: slot 1:"));
    graft_membership_destroy(obs);
    rp_rm_rf(dir);
}

/* The unix_ms of the first event of @p what whose detail has @p needle. */
static int64_t event_ms(const agent_proc_t *ap, const char *what, const char *needle)
{
    json_t *j = status_of(ap), *e;
    size_t i;
    int64_t ms = -1;
    json_array_foreach(json_object_get(j, "events"), i, e) {
        if (ms < 0 && strcmp(json_string_value(json_object_get(e, "what")), what) == 0 &&
            strstr(json_string_value(json_object_get(e, "detail")), needle) != NULL)
            ms = json_integer_value(json_object_get(e, "unix_ms"));
    }
    json_decref(j);
    return ms;
}

/* Without spares the dead rank is started again, as the same rank, after
 * its back-off (1.5 s here), pulls the state and the job ends bit-identical. */
static void test_restart_in_place_with_backoff(void **state)
{
    (void)state;
    char dir[256], job[64];
    job_dir(dir, sizeof(dir));
    snprintf(job, sizeof(job), "agent-restart-%d", (int)getpid());
    agent_proc_t ag[AG_GROUPS];
    for (int g = 0; g < AG_GROUPS; g++)
        agent_start(&ag[g], job, dir, g, 0, "1500");
    kill_rank(&ag[0]);
    for (int g = 0; g < AG_GROUPS; g++)
        agent_wait(&ag[g], 60);
    outcome_t o;
    check_job(ag, &o, 1);
    assert_int_equal(o.promoted, 0);
    assert_int_equal(o.healed, 1);
    assert_int_equal(counter(&ag[0], "restarts"), 1);
    assert_true(rp_file_contains(ag[0].err, "restart as the same rank in 1500 ms"));
    int64_t died = event_ms(&ag[0], "died", "slot 1:");
    int64_t again = event_ms(&ag[0], "start", "(start 2)");
    assert_true(died > 0 && again > 0);
    if (again - died < 1500)
        fail_msg("restarted %" PRId64 " ms after the death, before the 1500 ms back-off",
                 again - died);
    rp_rm_rf(dir);
}

/* A command that always fails: back-offs of 50, 100 ms, then the agent gives
 * up after --max-restarts 2 with exit 1 and a message that says why. */
static void test_gives_up_on_crash_loop(void **state)
{
    (void)state;
    char out[8192];
    const char *args[] = {"--group", "0", "--max-restarts", "2", "--backoff-ms", "50", "--",
                          "/bin/sh", "-c", "exit 3", NULL};
    assert_int_equal(agent_run(args, out, sizeof(out)), 1);
    assert_non_null(strstr(out, "in 50 ms (failure 1 of 2"));
    assert_non_null(strstr(out, "in 100 ms (failure 2 of 2"));
    assert_non_null(strstr(out, "rank 0 died 3 times in a row (the last: pid"));
    assert_non_null(strstr(out, "exit 3"));
    assert_non_null(strstr(out, "giving up (--max-restarts 2)"));
    /* A command that cannot run at all fails the same way. */
    const char *missing[] = {"--group", "0", "--max-restarts", "0", "--", "/no/such/trainer", NULL};
    assert_int_equal(agent_run(missing, out, sizeof(out)), 1);
    assert_non_null(strstr(out, "cannot run /no/such/trainer"));
}

static void expect_usage(const char *const *args, const char *why)
{
    char out[8192];
    assert_int_equal(agent_run(args, out, sizeof(out)), 2);
    if (strstr(out, why) == NULL)
        fail_msg("expected '%s' in: %s", why, out);
}

/* --help answers; bad input is refused with a message that names it;
 * --dry-run shows the plan and starts nothing. */
static void test_usage_and_dry_run(void **state)
{
    (void)state;
    char out[8192];
    const char *help[] = {"--help", NULL};
    assert_int_equal(agent_run(help, out, sizeof(out)), 0);
    assert_non_null(strstr(out, "usage: graft-agent"));
    assert_non_null(strstr(out, "--spares N"));
    expect_usage((const char *[]){"--group", "0", NULL}, "no command");
    expect_usage((const char *[]){"--", "true", NULL}, "no group");
    expect_usage((const char *[]){"--group", "x", "--", "true", NULL}, "--group needs a number");
    expect_usage((const char *[]){"--group", "0", "--ranks", "3-1", "--", "true", NULL},
                 "--ranks: bad value '3-1'");
    expect_usage((const char *[]){"--group", "0", "--ranks", "0,0", "--", "true", NULL},
                 "no repeats");
    expect_usage((const char *[]){"--group", "0", "--spares", "1", "--", "true", NULL},
                 "--spares needs the job's name");
    expect_usage((const char *[]){"--group", "0", "--follow", "--", "true", NULL},
                 "--follow makes the spares followers");
    expect_usage((const char *[]){"--group", "0", "--frobnicate", "--", "true", NULL},
                 "unknown option '--frobnicate'");
    expect_usage((const char *[]){"--group", "0", "--launcher", "--ranks", "0", "--", "true", NULL},
                 "--ranks is for one process per rank");
    expect_usage((const char *[]){"--group", "0", "--backoff-ms", "5000", "--backoff-max-ms",
                                  "100", "--", "true", NULL}, "below --backoff-ms");
    expect_usage((const char *[]){"--group", "0", "--listen", "nowhere", "--", "true", NULL},
                 "--listen 'nowhere'");
    expect_usage((const char *[]){"--job", "bad/name", "--group", "0", "--", "true", NULL},
                 "bad job name");
    const char *plan[] = {"--job", "j", "--group", "1", "--ranks", "0-1", "--spares", "1",
                          "--dry-run", "--", "train", "--x", "{rank}", NULL};
    assert_int_equal(agent_run(plan, out, sizeof(out)), 0);
    assert_non_null(strstr(out, "slot 0: rank, rank 0: GRAFT_GROUP=1 GRAFT_RANK=0 train"));
    assert_non_null(strstr(out, "slot 3: spare, rank 1: GRAFT_SPARE=1 GRAFT_RANK=1 train"));
    const char *follow[] = {"--job", "j", "--group", "1", "--ranks", "0", "--spares", "1",
                            "--follow", "--dry-run", "--", "train", NULL};
    assert_int_equal(agent_run(follow, out, sizeof(out)), 0);
    assert_non_null(strstr(out, "slot 0: rank, rank 0: GRAFT_GROUP=1 GRAFT_RANK=0 train"));
    assert_non_null(strstr(out, "spare, rank 0: GRAFT_SPARE=1 GRAFT_SPARE_FOLLOW=1 GRAFT_RANK=0"));
}

/* deploy/: the Slurm batch script and the Kubernetes manifests, checked
 * offline by scripts/check-deploy.py (bash -n and shellcheck, each node's
 * agent options through --dry-run, the manifests against Kubernetes'
 * schemas), with the venv's python (kubernetes-validate) when there is
 * one. Skipped, not passed, when the schemas could not be checked. */
static void test_deploy_files(void **state)
{
    (void)state;
    char cmd[1800], py[300];
    const char *build = getenv("BUILD") != NULL ? getenv("BUILD") : "build";
    if (access("scripts/check-deploy.py", R_OK) != 0)
        fail_msg("run from the repository's root: no scripts/check-deploy.py here");
    snprintf(py, sizeof(py), "%s/venv/bin/python", build);
    snprintf(cmd, sizeof(cmd), "'%s' scripts/check-deploy.py --agent '%s' 2>&1",
             access(py, X_OK) == 0 ? py : "python3", agent_bin);
    FILE *f = popen(cmd, "r");
    char line[1024];
    bool skipped = false;
    assert_non_null(f);
    while (fgets(line, sizeof(line), f) != NULL) {
        print_message("# %s", line);
        skipped |= strstr(line, "check-deploy: skipped") != NULL;
    }
    int st = pclose(f);
    assert_true(WIFEXITED(st));
    if (WEXITSTATUS(st) != 0)
        fail_msg("scripts/check-deploy.py failed (exit %d)", WEXITSTATUS(st));
    if (skipped)
        skip();
}

static int setup(void **state)
{
    if (rp_setup(state) != 0)
        return -1;
    snprintf(agent_bin, sizeof(agent_bin), "%s", rp_trainer);
    char *slash = strrchr(agent_bin, '/');
    snprintf(slash + 1, sizeof(agent_bin) - (size_t)(slash + 1 - agent_bin), "graft-agent");
    if (access(agent_bin, X_OK) != 0) {
        fprintf(stderr, "no graft-agent at %s (build with `make all`)\n", agent_bin);
        return -1;
    }
    return 0;
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_usage_and_dry_run),
        cmocka_unit_test(test_gives_up_on_crash_loop),
        cmocka_unit_test(test_deploy_files),
        cmocka_unit_test(test_spare_takes_slot_and_is_replaced),
        cmocka_unit_test(test_restart_in_place_with_backoff),
        cmocka_unit_test(test_launcher_world_replaced_by_spare_world),
    };
    if (getenv("TEST_FILTER") != NULL)
        cmocka_set_test_filter(getenv("TEST_FILTER"));
    return cmocka_run_group_tests(tests, setup, rp_teardown);
}
