/*
 * Tests of graftctl (build/bin/graftctl), the operator's command line,
 * against a real etcd (tests/support/etcd_fixture.c) and a live
 * `graft-sim run` of the real trainer:
 *
 *  - usage and the errors an operator meets: etcd unreachable (naming the
 *    endpoints tried), unknown job, not a checkpoint directory, permission
 *    denied, bad flags; each with a message and a non-zero exit;
 *  - during a live run with scheduled failures: `watch --json` sees the
 *    killed group leave the healthy state and come back; `status --json`
 *    shows every group and rank; after the run, `events --json` and
 *    `events --recoveries --json` agree with the simulation's own report
 *    (bytes transferred, a heal of every failed group after its failure),
 *    `drift` reports no drift, and the checkpoints the run wrote are listed
 *    and verify;
 *  - `ckpt verify` on copies of a good checkpoint: a flipped byte in a
 *    shard and a truncated shard name the shard file and chunk at fault; a
 *    damaged and a missing manifest.json sidecar are reported; each exits
 *    1; `restore --dry-run` then skips the damaged one; `prune` keeps what
 *    its policy says.
 *
 * The commands' access to etcd (evict, credentials, TLS) and the hung
 * state are tested in test_graftctl_access.c.
 */
#include "graftctl_fixture.h"

#define SIM_GROUPS 3
#define SIM_RANKS 2
#define SIM_STEPS 240

/* ------------------------------------------------------- usage/errors --- */

static void test_usage_and_errors(void **state)
{
    char *out = NULL, *err = NULL;
    assert_int_equal(gc_run_ctl((const char *[]){"--help", NULL}, &out, NULL), 0);
    assert_non_null(strstr(out, "ckpt verify"));
    assert_non_null(strstr(out, "evict GROUP"));
    free(out);

    assert_int_equal(gc_run_ctl((const char *[]){"frobnicate", NULL}, NULL, &err), 2);
    assert_non_null(strstr(err, "unknown command 'frobnicate'"));
    free(err);

    /* Nothing listens on ports 1 and 2: both are named. */
    assert_int_equal(gc_run_ctl((const char *[]){"--etcd", "http://127.0.0.1:1,http://127.0.0.1:2",
                                                 "--job", "j", "--timeout-ms", "500", "status",
                                                 NULL},
                                NULL, &err),
                     1);
    assert_non_null(strstr(err, "etcd unreachable"));
    assert_non_null(strstr(err, "http://127.0.0.1:1,http://127.0.0.1:2"));
    free(err);

    assert_int_equal(gc_run_ctl((const char *[]){"--etcd", gc_endpoint, "--job", "no-such-job",
                                                 "status", NULL},
                                NULL, &err),
                     1);
    assert_non_null(strstr(err, "unknown job 'no-such-job'"));
    free(err);

    assert_int_equal(
        gc_run_ctl((const char *[]){"--etcd", gc_endpoint, "status", NULL}, NULL, &err), 2);
    assert_non_null(strstr(err, "no job"));
    free(err);
    assert_int_equal(
        gc_run_ctl((const char *[]){"--etcd", gc_endpoint, "--job", "bad/job", "status", NULL},
                   NULL, &err),
        2);
    free(err);
    assert_int_equal(gc_run_ctl((const char *[]){"--etcd", gc_endpoint, "--job", "j", "events",
                                                 "--kind", "nonsense", NULL},
                                NULL, &err),
                     2);
    assert_non_null(strstr(err, "unknown kind 'nonsense'"));
    free(err);

    assert_int_equal(gc_run_ctl((const char *[]){"--etcd", gc_endpoint, "--job", "j", "dashboard",
                                                 "--listen", "localhost", NULL},
                                NULL, &err),
                     2);
    assert_non_null(strstr(err, "is not IPv4-ADDRESS:PORT"));
    free(err);
    assert_int_equal(gc_run_ctl((const char *[]){"--etcd", gc_endpoint, "--job", "j", "dashboard",
                                                 "--token", "short", NULL},
                                NULL, &err),
                     2);
    assert_non_null(strstr(err, "8 characters"));
    free(err);

    /* Checkpoint roots. */
    assert_int_equal(gc_run_ctl((const char *[]){"ckpt", "ls", gc_tmpdir, NULL}, NULL, &err), 1);
    assert_non_null(strstr(err, "not a checkpoint directory"));
    free(err);
    char missing[PATH_MAX + 16];
    snprintf(missing, sizeof(missing), "%s/absent", gc_tmpdir);
    assert_int_equal(gc_run_ctl((const char *[]){"ckpt", "verify", missing, NULL}, NULL, &err), 1);
    assert_non_null(strstr(err, "No such file or directory"));
    free(err);
    assert_int_equal(gc_run_ctl((const char *[]){"ckpt", "ls", NULL}, NULL, &err), 2);
    free(err);

    /* Permission denied: a root no one else may read. */
    char locked[PATH_MAX + 16];
    snprintf(locked, sizeof(locked), "%s/locked", gc_tmpdir);
    gc_sh("mkdir -p '%s/step-00000000000000000010' && chmod 0700 '%s' && chmod 0711 '%s'", locked,
          locked, gc_tmpdir);
    int rc;
    if (geteuid() == 0) {
        rc = gc_run_ctl_as(true, (const char *[]){"ckpt", "ls", locked, NULL}, NULL, &err);
        if (rc == 127) {
            /* Even a copy of graftctl in a 0755 folder under /tmp could not
             * be run as nobody (a noexec /tmp, no user 65534). */
            print_message("skipped: graftctl cannot be run as nobody (uid 65534) from /tmp\n");
            free(err);
            gc_sh("chmod 0700 '%s'", gc_tmpdir);
            skip();
        }
    } else {
        gc_sh("chmod 000 '%s'", locked);
        rc = gc_run_ctl((const char *[]){"ckpt", "ls", locked, NULL}, NULL, &err);
        gc_sh("chmod 0700 '%s'", locked);
    }
    assert_int_equal(rc, 1);
    assert_non_null(strstr(err, "permission denied"));
    free(err);
    gc_sh("chmod 0700 '%s'", gc_tmpdir);
}

/* ---------------------------------------------------------------- help --- */

/* Each command's --help (before or after the command) is its own: a usage
 * line that names it, every option its parser takes, exit 0, and not the
 * global text. */
static void test_command_help(void **state)
{
    static const struct {
        const char *cmd, *sub;
        const char *names[6];
    } cases[] = {
        {"status", NULL, {"graftctl [options] status", NULL}},
        {"watch", NULL, {"--interval-ms N", "--count N", NULL}},
        {"events", NULL, {"--kind K", "--group G", "--since T", "--until T", "--recoveries", NULL}},
        {"drift", NULL, {"graftctl [options] drift", NULL}},
        {"evict", NULL, {"evict GROUP", "--yes", NULL}},
        {"dashboard", NULL,
         {"--listen ADDR:PORT", "--token T", "--ckpt-root DIR", "--allow-host NAME",
          "--interval-ms N", NULL}},
        {"ckpt", "ls", {"ckpt ls ROOT", "--keep-last N", "--milestone-every M", "--geometric",
                        NULL}},
        {"ckpt", "verify", {"ckpt verify ROOT", "--quick", "--secret-file F", NULL}},
        {"ckpt", "inspect", {"ckpt inspect ROOT STEP", NULL}},
        {"ckpt", "prune", {"ckpt prune ROOT", "--keep-last N", "--milestone-every M",
                           "--geometric", "--dry-run", NULL}},
        {"ckpt", "restore", {"ckpt restore ROOT", "--dry-run", "--step S", "--secret-file F",
                             NULL}},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        for (int before = 0; before < 2; before++) {
            const char *args[5];
            size_t n = 0;
            if (before)
                args[n++] = "--help";
            args[n++] = cases[i].cmd;
            if (cases[i].sub != NULL)
                args[n++] = cases[i].sub;
            if (!before)
                args[n++] = "--help";
            args[n] = NULL;
            char *out = NULL;
            assert_int_equal(gc_run_ctl(args, &out, NULL), 0);
            if (strncmp(out, "usage: graftctl ", 16) != 0 ||
                strstr(out, "Commands against a job") != NULL)
                print_error("graftctl %s %s --help: not its own help:\n%s\n", cases[i].cmd,
                            cases[i].sub ? cases[i].sub : "", out);
            assert_int_equal(strncmp(out, "usage: graftctl ", 16), 0);
            assert_null(strstr(out, "Commands against a job"));
            for (size_t k = 0; cases[i].names[k] != NULL; k++) {
                if (strstr(out, cases[i].names[k]) == NULL)
                    print_error("graftctl %s %s --help lacks '%s':\n%s\n", cases[i].cmd,
                                cases[i].sub ? cases[i].sub : "", cases[i].names[k], out);
                assert_non_null(strstr(out, cases[i].names[k]));
            }
            free(out);
        }
    }
    /* `ckpt --help` covers every subcommand; the global help lists every
     * command, dashboard included, and ckpt ls's policy. */
    char *out = NULL, *err = NULL;
    assert_int_equal(gc_run_ctl((const char *[]){"ckpt", "--help", NULL}, &out, NULL), 0);
    for (const char *const *w = (const char *[]){"ckpt ls", "ckpt verify", "ckpt inspect",
                                                  "ckpt prune", "ckpt restore", NULL};
         *w != NULL; w++)
        assert_non_null(strstr(out, *w));
    free(out);
    assert_int_equal(gc_run_ctl((const char *[]){"--help", NULL}, &out, NULL), 0);
    for (const char *const *w = (const char *[]){"  status", "  watch", "  events", "  drift",
                                                  "  evict GROUP", "  dashboard",
                                                  "ckpt ls ROOT [--keep-last N]", NULL};
         *w != NULL; w++)
        assert_non_null(strstr(out, *w));
    free(out);
    assert_int_equal(gc_run_ctl((const char *[]){"frobnicate", "--help", NULL}, NULL, &err), 2);
    assert_non_null(strstr(err, "unknown command 'frobnicate'"));
    free(err);
}

/* -------------------------------------------------------- a live run --- */

static char job[128];
static char job_root[PATH_MAX + 160];
static json_t *report;

static void test_live_run(void **state)
{
    char sched[PATH_MAX + 32], root[PATH_MAX + 32], rep[PATH_MAX + 32], watch_out[PATH_MAX + 32];
    snprintf(root, sizeof(root), "%s/ckpt", gc_tmpdir);
    snprintf(rep, sizeof(rep), "%s/run.json", gc_tmpdir);
    snprintf(watch_out, sizeof(watch_out), "%s/watch.out", gc_tmpdir);
    gc_tmp_file_write(sched, sizeof(sched), "sched.json",
                      "{\"events\":[{\"kind\":\"kill_group\",\"group\":1,\"at_step\":140},"
                      "{\"kind\":\"kill_rank\",\"group\":2,\"rank\":1,\"at_step\":200}]}\n");
    mkdir(root, 0755);

    char steps[16];
    snprintf(steps, sizeof(steps), "%d", SIM_STEPS);
    const char *sim_argv[] = {gc_sim_bin, "run", "--groups", "3", "--ranks", "2", "--steps",
                              steps, "--seed", "11", "--schedule", sched, "--etcd", gc_endpoint,
                              "--persist-root", root, "--persist-every", "20", "--json", rep,
                              NULL};
    pid_t sim = gc_spawn_logged(sim_argv, "sim.out");
    gc_sim_job_wait(root, job, sizeof(job));
    snprintf(job_root, sizeof(job_root), "%s/%s", root, job);

    /* status while the run goes on: every group and rank, with addresses. */
    json_t *st = NULL;
    for (int i = 0; i < 100; i++) {
        char *out = NULL;
        int rc = gc_run_ctl(
            (const char *[]){"--etcd", gc_endpoint, "--job", job, "--json", "status", NULL}, &out,
            NULL);
        json_decref(st);
        st = rc == 0 ? json_loads(out, 0, NULL) : NULL;
        free(out);
        if (st != NULL && json_integer_value(json_object_get(st, "groups_healthy")) == SIM_GROUPS)
            break;
        gc_sleep_ms(100);
    }
    assert_non_null(st);
    assert_int_equal(json_integer_value(json_object_get(st, "groups_healthy")), SIM_GROUPS);
    assert_int_equal(json_integer_value(json_object_get(st, "ranks_per_group")), SIM_RANKS);
    size_t gi, ri;
    json_t *g, *r;
    json_array_foreach(json_object_get(st, "groups"), gi, g) {
        assert_int_equal(json_array_size(json_object_get(g, "ranks")), SIM_RANKS);
        json_array_foreach(json_object_get(g, "ranks"), ri, r) {
            assert_true(strlen(json_string_value(json_object_get(r, "transfer_address"))) > 0);
            assert_true(json_integer_value(json_object_get(r, "lease_ttl_s")) >= 0);
            assert_true(json_integer_value(json_object_get(r, "incarnation")) > 0);
        }
    }
    json_t *q = json_object_get(st, "quorum");
    assert_true(json_is_object(q));
    assert_int_equal(json_array_size(json_object_get(q, "members")), SIM_GROUPS);
    json_decref(st);

    /* From here watch follows the run in the background. */
    pid_t watch = fork();
    assert_true(watch >= 0);
    if (watch == 0) {
        int fd = open(watch_out, O_WRONLY | O_CREAT | O_TRUNC, 0644);
        if (fd < 0)
            _exit(126);
        dup2(fd, 1);
        const char *argv[] = {gc_ctl_bin, "--etcd", gc_endpoint, "--job", job, "--json", "watch",
                              "--interval-ms", "50", NULL};
        execv(gc_ctl_bin, (char **)argv);
        _exit(127);
    }

    int ws = 0;
    assert_int_equal(waitpid(sim, &ws, 0), sim);
    kill(watch, SIGTERM);
    waitpid(watch, NULL, 0);
    char *simout = NULL;
    {
        char log[PATH_MAX + 32];
        snprintf(log, sizeof(log), "%s/sim.out", gc_tmpdir);
        simout = gc_slurp(log);
    }
    if (!WIFEXITED(ws) || WEXITSTATUS(ws) != 0)
        print_error("graft-sim run failed:\n%s\n", simout);
    free(simout);
    assert_true(WIFEXITED(ws) && WEXITSTATUS(ws) == 0);
    json_error_t je;
    report = json_load_file(rep, 0, &je);
    assert_non_null(report);
    assert_string_equal(json_string_value(json_object_get(report, "verdict")), "bit-exact");

    /* watch saw group 1 leave the healthy state and come back. */
    char *lines = gc_slurp(watch_out);
    int phase = 0; /* 0: not yet healthy, 1: healthy, 2: unhealthy, 3: healthy again */
    size_t nlines = 0;
    for (char *save = NULL, *line = strtok_r(lines, "\n", &save); line != NULL;
         line = strtok_r(NULL, "\n", &save)) {
        json_t *s = json_loads(line, 0, NULL);
        assert_non_null(s);
        nlines++;
        bool healthy = strcmp(gc_group_health(s, 1), "healthy") == 0;
        if ((phase == 0 && healthy) || (phase == 1 && !healthy) || (phase == 2 && healthy))
            phase++;
        json_decref(s);
    }
    free(lines);
    if (phase < 3)
        print_error("watch: %zu snapshots, group 1 reached phase %d of 3\n", nlines, phase);
    assert_int_equal(phase, 3);
}

/* After the run: the history agrees with the simulation's report. */
static void test_events_match_report(void **state)
{
    assert_non_null(report);
    json_t *all = gc_ctl_json(
        (const char *[]){"--etcd", gc_endpoint, "--job", job, "--json", "events", NULL});
    json_t *evs = json_object_get(all, "events");
    assert_true(json_array_size(evs) > 0);
    uint64_t prev = 0;
    size_t i;
    json_t *e;
    json_array_foreach(evs, i, e) {
        uint64_t seq = (uint64_t)json_integer_value(json_object_get(e, "seq"));
        assert_true(seq > prev);
        prev = seq;
    }

    json_t *recs = gc_ctl_json((const char *[]){"--etcd", gc_endpoint, "--job", job, "--json",
                                                "events", "--recoveries", NULL});
    json_int_t bytes = 0;
    json_array_foreach(json_object_get(recs, "recoveries"), i, e) {
        assert_true(json_is_true(json_object_get(e, "ok")));
        bytes += json_integer_value(json_object_get(e, "bytes"));
        json_t *ph = json_object_get(e, "phases_s");
        assert_true(json_real_value(json_object_get(ph, "transfer")) >= 0);
    }
    assert_int_equal(bytes, json_integer_value(json_object_get(report, "bytes_transferred")));
    /* A heal that gave a group its first state is no recovery:
     * graft_initial_syncs_total, not graft_recoveries_total. Every group
     * but the one the job's state came from made one at the start. */
    size_t initial = 0;
    json_array_foreach(json_object_get(recs, "recoveries"), i, e)
        initial += json_is_true(json_object_get(e, "initial"));
    assert_true(initial >= 1 && initial <= (SIM_GROUPS - 1) * SIM_RANKS);

    /* Every failure of the report was healed: a recovery of its group at
     * or after the step it failed at, with its phases cut from the history. */
    json_t *rr;
    size_t k;
    size_t nrec = 0;
    json_array_foreach(json_object_get(report, "recoveries"), k, rr) {
        json_int_t group = json_integer_value(json_object_get(rr, "group"));
        json_int_t at = json_integer_value(json_object_get(rr, "step_at_fail"));
        bool found = false;
        json_array_foreach(json_object_get(recs, "recoveries"), i, e) {
            if (json_integer_value(json_object_get(e, "group")) == group &&
                json_integer_value(json_object_get(e, "step")) >= at &&
                json_object_get(json_object_get(e, "phases_s"), "total") != NULL &&
                json_array_size(json_object_get(e, "donors")) >= 1 &&
                !json_is_true(json_object_get(e, "initial"))) /* a replacement's heal */
                found = true;
        }
        if (!found)
            print_error("no recovery of group %lld at step >= %lld in graftctl's events\n",
                        (long long)group, (long long)at);
        assert_true(found);
        nrec++;
    }
    assert_int_equal(nrec, 2);

    /* Filters: one group, one kind. */
    json_t *g1 =
        gc_ctl_json((const char *[]){"--etcd", gc_endpoint, "--job", job, "--json", "events",
                                     "--group", "1", "--kind", "join,recovery_done", NULL});
    size_t joins = 0, dones = 0;
    json_array_foreach(json_object_get(g1, "events"), i, e) {
        assert_int_equal(json_integer_value(json_object_get(e, "group")), 1);
        const char *kind = json_string_value(json_object_get(e, "kind"));
        joins += strcmp(kind, "join") == 0;
        dones += strcmp(kind, "recovery_done") == 0;
        assert_true(strcmp(kind, "join") == 0 || strcmp(kind, "recovery_done") == 0);
    }
    /* At the start and the replacement's (more if a loaded machine let a
     * 1 s lease lapse: a re-join). */
    assert_true(joins >= 2 * SIM_RANKS);
    assert_true(dones >= SIM_RANKS);
    json_t *none =
        gc_ctl_json((const char *[]){"--etcd", gc_endpoint, "--job", job, "--json", "events",
                                     "--since", "0s", "--until", "1000", NULL});
    assert_int_equal(json_array_size(json_object_get(none, "events")), 0);

    /* The run is over: the last quorum reached the last steps, every
     * group left cleanly (the killed ones too, as their replacements
     * ended), so the job is completed, not dead; no drift was recorded. */
    json_t *st = gc_ctl_json(
        (const char *[]){"--etcd", gc_endpoint, "--job", job, "--json", "status", NULL});
    assert_int_equal(json_integer_value(json_object_get(st, "groups_known")), SIM_GROUPS);
    assert_int_equal(json_integer_value(json_object_get(st, "groups_healthy")), 0);
    for (int g = 0; g < SIM_GROUPS; g++)
        assert_string_equal(gc_group_health(st, g), "finished");
    assert_string_equal(json_string_value(json_object_get(st, "state")), "completed");
    /* The quorum record shows where the last epoch began (steps of an
     * unchanged epoch do not go through etcd); the progress record, written
     * by every trainer as it ends, the last step. */
    json_int_t qstep = json_integer_value(json_object_get(json_object_get(st, "quorum"), "step"));
    assert_true(qstep >= 0 && qstep <= SIM_STEPS);
    assert_int_equal(json_integer_value(json_object_get(st, "progress_step")), SIM_STEPS);
    json_t *dr =
        gc_ctl_json((const char *[]){"--etcd", gc_endpoint, "--job", job, "--json", "drift", NULL});
    assert_int_equal(json_integer_value(json_object_get(dr, "drift_events")), 0);
    assert_true(json_is_null(json_object_get(dr, "last_drift")));

    char *out = NULL;
    assert_int_equal(
        gc_run_ctl((const char *[]){"--etcd", gc_endpoint, "--job", job, "status", NULL}, &out,
                   NULL),
        0);
    assert_non_null(strstr(out, "GROUP"));
    assert_non_null(strstr(out, ": completed, 0 of 3 groups healthy"));
    free(out);
    json_decref(all);
    json_decref(recs);
    json_decref(g1);
    json_decref(none);
    json_decref(st);
    json_decref(dr);
}

/* ------------------------------------------------------- checkpoints --- */

static json_int_t newest_step(json_t *ls)
{
    return json_integer_value(json_object_get(json_array_get(json_object_get(ls, "checkpoints"), 0),
                                              "step"));
}

/* A writer the run killed can leave a directory without a manifest, which
 * retention removes only once nothing was added to it for a while (it may
 * be a commit still under way; docs/FORMAT.md): removed here by hand, as a
 * later prune would, so that what follows is about the checkpoints. */
static void drop_incomplete(const char *root)
{
    json_t *ls = gc_ctl_json((const char *[]){"--json", "ckpt", "ls", root, NULL});
    size_t i;
    json_t *c;
    json_array_foreach(json_object_get(ls, "checkpoints"), i, c) {
        if (strcmp(json_string_value(json_object_get(c, "state")), "incomplete") == 0)
            gc_sh("rm -rf '%s/step-%020lld'", root,
                  (long long)json_integer_value(json_object_get(c, "step")));
    }
    json_decref(ls);
}

static void test_ckpt_good(void **state)
{
    assert_true(job_root[0] != '\0');
    drop_incomplete(job_root);
    json_t *ls = gc_ctl_json((const char *[]){"--json", "ckpt", "ls", job_root, NULL});
    json_t *cks = json_object_get(ls, "checkpoints");
    assert_true(json_array_size(cks) >= 2);
    size_t i;
    json_t *c;
    json_array_foreach(cks, i, c) {
        assert_string_equal(json_string_value(json_object_get(c, "state")), "complete");
        assert_int_equal(json_integer_value(json_object_get(c, "step")) % 20, 0);
        assert_int_equal(json_integer_value(json_object_get(c, "ranks")), SIM_RANKS);
        assert_true(json_integer_value(json_object_get(c, "step")) <= SIM_STEPS);
    }
    assert_string_equal(json_string_value(json_object_get(json_array_get(cks, 0), "retention")),
                        "newest");
    json_t *v = gc_ctl_json((const char *[]){"--json", "ckpt", "verify", job_root, NULL});
    assert_int_equal(json_integer_value(json_object_get(v, "faults")), 0);
    assert_int_equal((size_t)json_integer_value(json_object_get(v, "checked")),
                     json_array_size(cks));
    char step[32];
    snprintf(step, sizeof(step), "%lld", (long long)newest_step(ls));
    json_t *in = gc_ctl_json((const char *[]){"--json", "ckpt", "inspect", job_root, step, NULL});
    json_t *m = json_object_get(in, "manifest");
    assert_int_equal(json_integer_value(json_object_get(m, "step")), newest_step(ls));
    assert_int_equal(json_array_size(json_object_get(m, "shards")), SIM_RANKS);
    assert_string_equal(json_string_value(json_object_get(in, "sidecar")), "ok");
    json_t *rs = gc_ctl_json((const char *[]){"--json", "ckpt", "restore", job_root, "--dry-run",
                                              NULL});
    assert_int_equal(json_integer_value(json_object_get(json_object_get(rs, "would_restore"),
                                                        "step")),
                     newest_step(ls));
    json_decref(ls);
    json_decref(v);
    json_decref(in);
    json_decref(rs);
}

/* A copy of the run's root with one fault in its newest checkpoint. */
static void damaged_copy(const char *name, const char *damage, char *dir, size_t len,
                         json_int_t *newest_p)
{
    json_t *ls = gc_ctl_json((const char *[]){"--json", "ckpt", "ls", job_root, NULL});
    json_int_t newest = newest_step(ls);
    json_decref(ls);
    snprintf(dir, len, "%s/%s", gc_tmpdir, name);
    gc_sh("rm -rf '%s' && cp -a '%s' '%s'", dir, job_root, dir);
    gc_sh("cd '%s/step-%020lld' && %s", dir, (long long)newest, damage);
    *newest_p = newest;
}

static void expect_verify_fails(const char *dir, const char *want1, const char *want2)
{
    char *out = NULL;
    int rc = gc_run_ctl((const char *[]){"ckpt", "verify", dir, NULL}, &out, NULL);
    if (rc != 1 || strstr(out, want1) == NULL || (want2 && strstr(out, want2) == NULL))
        print_error("ckpt verify %s exited %d:\n%s\n", dir, rc, out);
    assert_int_equal(rc, 1);
    assert_non_null(strstr(out, "FAILED"));
    assert_non_null(strstr(out, want1));
    if (want2 != NULL)
        assert_non_null(strstr(out, want2));
    free(out);
}

static void test_ckpt_damaged(void **state)
{
    assert_true(job_root[0] != '\0');
    char dir[PATH_MAX + 64];
    json_int_t newest;

    damaged_copy("flipped",
                 "f=shard-1-of-2; s=$(stat -c %s $f); "
                 "printf '\\377' | dd of=$f bs=1 seek=$((s / 2)) conv=notrunc status=none",
                 dir, sizeof(dir), &newest);
    expect_verify_fails(dir, "shard-1-of-2", "chunk");
    /* The restore a trainer would do skips it for the one before. */
    json_t *rs = gc_ctl_json((const char *[]){"--json", "ckpt", "restore", dir, "--dry-run", NULL});
    json_int_t got = json_integer_value(json_object_get(json_object_get(rs, "would_restore"),
                                                        "step"));
    assert_true(got < newest && got > 0);
    assert_int_equal(json_integer_value(json_object_get(
                         json_array_get(json_object_get(rs, "skipped"), 0), "step")),
                     newest);
    json_decref(rs);

    damaged_copy("truncated", "truncate -s 100 shard-0-of-2", dir, sizeof(dir), &newest);
    expect_verify_fails(dir, "shard-0-of-2", NULL);

    damaged_copy("sidecar", "sed -i 's/\"ranks\": 2/\"ranks\": 3/' manifest.json", dir,
                 sizeof(dir), &newest);
    expect_verify_fails(dir, "manifest.json disagrees with manifest.pb", "ranks");
    char step[32];
    snprintf(step, sizeof(step), "%lld", (long long)newest);
    json_t *in = gc_ctl_json((const char *[]){"--json", "ckpt", "inspect", dir, step, NULL});
    assert_string_equal(json_string_value(json_object_get(in, "sidecar")), "damaged");
    json_decref(in);

    damaged_copy("nosidecar", "rm manifest.json", dir, sizeof(dir), &newest);
    expect_verify_fails(dir, "manifest.json: missing", NULL);

    damaged_copy("garbled", "printf '{not json' > manifest.json", dir, sizeof(dir), &newest);
    expect_verify_fails(dir, "manifest.json", NULL);
}

/* Tools that explain themselves (issue 28, item 5): ckpt ls on the run's
 * persist root (which holds the job's folder) lists the job; restore
 * --dry-run --step says absent or corrupt and why; inspect leaves out a
 * code revision the trainer did not give; events --since takes dates and
 * times of day, and the table shows local times. */
static void test_tools_explain(void **state)
{
    assert_true(job_root[0] != '\0');
    char root[PATH_MAX + 32], dir[PATH_MAX + 64], step[32];
    char *out = NULL, *err = NULL;
    snprintf(root, sizeof(root), "%s/ckpt", gc_tmpdir);
    json_t *jobs = gc_ctl_json((const char *[]){"--json", "ckpt", "ls", root, NULL});
    json_t *j0 = json_array_get(json_object_get(jobs, "jobs"), 0);
    assert_int_equal(json_array_size(json_object_get(jobs, "jobs")), 1);
    assert_string_equal(json_string_value(json_object_get(j0, "job")), job);
    assert_true(json_integer_value(json_object_get(j0, "checkpoints")) >= 2);
    json_decref(jobs);
    assert_int_equal(gc_run_ctl((const char *[]){"ckpt", "ls", root, NULL}, &out, NULL), 0);
    assert_non_null(strstr(out, "holds job folders"));
    assert_non_null(strstr(out, job));
    free(out);
    assert_int_equal(gc_run_ctl((const char *[]){"ckpt", "verify", root, NULL}, NULL, &err), 1);
    assert_non_null(strstr(err, "it holds the job folders "));
    assert_non_null(strstr(err, job));
    free(err);

    assert_int_equal(gc_run_ctl((const char *[]){"ckpt", "restore", job_root, "--dry-run",
                                                 "--step", "25", NULL},
                                NULL, &err),
                     1);
    assert_non_null(strstr(err, "step 25 under "));
    assert_non_null(strstr(err, ": absent"));
    free(err);
    json_int_t newest;
    damaged_copy("flipped-restore",
                 "f=shard-0-of-2; s=$(stat -c %s $f); "
                 "printf '\\377' | dd of=$f bs=1 seek=$((s / 2)) conv=notrunc status=none",
                 dir, sizeof(dir), &newest);
    snprintf(step, sizeof(step), "%lld", (long long)newest);
    assert_int_equal(gc_run_ctl((const char *[]){"--json", "ckpt", "restore", dir, "--dry-run",
                                                 "--step", step, NULL},
                                &out, &err),
                     1);
    json_t *rs = json_loads(out, 0, NULL);
    assert_non_null(rs);
    assert_string_equal(json_string_value(json_object_get(rs, "step_state")), "corrupt");
    json_decref(rs);
    if (strstr(err, ": corrupt: ") == NULL || strstr(err, "shard-0-of-2") == NULL)
        print_error("restore --dry-run --step %s: %s\n", step, err);
    assert_non_null(strstr(err, ": corrupt: "));
    assert_non_null(strstr(err, "shard-0-of-2"));
    free(out);
    free(err);

    assert_int_equal(gc_run_ctl((const char *[]){"ckpt", "inspect", job_root, step, NULL}, &out,
                                NULL),
                     0);
    assert_non_null(strstr(out, " by graft "));
    assert_null(strstr(out, "code revision"));
    free(out);

    const char *base[] = {"--etcd", gc_endpoint, "--job", job, "--json", "events", "--since"};
    json_t *all = gc_ctl_json(
        (const char *[]){"--etcd", gc_endpoint, "--job", job, "--json", "events", NULL});
    size_t n = json_array_size(json_object_get(all, "events"));
    json_decref(all);
    assert_true(n > 0);
    const char *const same[] = {"yesterday", "today", "00:00", "2000-01-01", "2000-01-01 00:00",
                                "2000-01-01T00:00:00"};
    for (size_t k = 0; k < sizeof(same) / sizeof(same[0]); k++) {
        json_t *e = gc_ctl_json((const char *[]){base[0], base[1], base[2], base[3], base[4],
                                                 base[5], base[6], same[k], NULL});
        assert_int_equal(json_array_size(json_object_get(e, "events")), n);
        json_decref(e);
    }
    json_t *o = gc_ctl_json((const char *[]){base[0], base[1], base[2], base[3], "events", "-o",
                                             "json", NULL});
    assert_int_equal(json_array_size(json_object_get(o, "events")), n); /* kubectl's -o json */
    json_decref(o);
    assert_int_equal(gc_run_ctl((const char *[]){base[0], base[1], base[2], base[3], "-o", "yaml",
                                                 "events", NULL},
                                NULL, NULL),
                     2);
    json_t *later = gc_ctl_json((const char *[]){base[0], base[1], base[2], base[3], base[4],
                                                 base[5], base[6], "2999-01-01", NULL});
    assert_int_equal(json_array_size(json_object_get(later, "events")), 0);
    json_decref(later);
    const char *const bad[] = {"25:61", "2026-13-40", "yesterdays", "12:00junk"};
    for (size_t k = 0; k < sizeof(bad) / sizeof(bad[0]); k++)
        assert_int_equal(gc_run_ctl((const char *[]){base[0], base[1], base[2], base[3], "events",
                                                     "--since", bad[k], NULL},
                                    NULL, NULL),
                         2);
    assert_int_equal(gc_run_ctl((const char *[]){base[0], base[1], base[2], base[3], "events",
                                                 "--kind", "join", NULL},
                                &out, NULL),
                     0);
    int y, mo, d, h, mi, se, ms;
    char *line = strchr(out, '\n');
    assert_non_null(line);
    assert_non_null(strstr(out, " TIME "));
    assert_int_equal(sscanf(line + 1, "%*d %d-%d-%d %d:%d:%d.%d", &y, &mo, &d, &h, &mi, &se, &ms),
                     7);
    assert_true(y >= 2024 && mo >= 1 && mo <= 12 && ms >= 0 && ms < 1000);
    free(out);
}

static void test_ckpt_prune(void **state)
{
    assert_true(job_root[0] != '\0');
    char dir[PATH_MAX + 32];
    snprintf(dir, sizeof(dir), "%s/prune", gc_tmpdir);
    gc_sh("rm -rf '%s' && cp -a '%s' '%s'", dir, job_root, dir);
    drop_incomplete(dir);
    json_t *before = gc_ctl_json((const char *[]){"--json", "ckpt", "ls", dir, NULL});
    size_t n = json_array_size(json_object_get(before, "checkpoints"));
    assert_true(n >= 3);
    char *err = NULL;
    assert_int_equal(gc_run_ctl((const char *[]){"ckpt", "prune", dir, "--keep-last", "2", NULL},
                                NULL, &err),
                     2); /* no --yes and no terminal to ask on */
    assert_non_null(strstr(err, "--yes"));
    free(err);
    json_t *dry = gc_ctl_json((const char *[]){"--json", "ckpt", "prune", dir, "--keep-last", "2",
                                               "--dry-run", NULL});
    assert_int_equal(json_array_size(json_object_get(dry, "drop")), n - 2);
    json_t *same = gc_ctl_json((const char *[]){"--json", "ckpt", "ls", dir, NULL});
    assert_int_equal(json_array_size(json_object_get(same, "checkpoints")), n);
    json_t *done = gc_ctl_json((const char *[]){"--json", "--yes", "ckpt", "prune", dir,
                                                "--keep-last", "2", NULL});
    assert_int_equal(json_integer_value(json_object_get(done, "deleted")), (json_int_t)(n - 2));
    json_t *after = gc_ctl_json((const char *[]){"--json", "ckpt", "ls", dir, NULL});
    assert_int_equal(json_array_size(json_object_get(after, "checkpoints")), 2);
    assert_int_equal(newest_step(after), newest_step(before));
    json_decref(before);
    json_decref(dry);
    json_decref(same);
    json_decref(done);
    json_decref(after);
}

/* ------------------------------------------------------------- main --- */

static int teardown(void **state)
{
    json_decref(report);
    return gc_teardown(state);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_usage_and_errors),
        cmocka_unit_test(test_command_help),
        cmocka_unit_test(test_live_run),
        cmocka_unit_test(test_events_match_report),
        cmocka_unit_test(test_ckpt_good),
        cmocka_unit_test(test_ckpt_damaged),
        cmocka_unit_test(test_tools_explain),
        cmocka_unit_test(test_ckpt_prune),
    };
    /* The tests after test_live_run read the run it made; a filter that
     * leaves it out makes them fail on their first assertion. */
    if (getenv("TEST_FILTER") != NULL)
        cmocka_set_test_filter(getenv("TEST_FILTER"));
    return cmocka_run_group_tests(tests, gc_setup, teardown);
}
