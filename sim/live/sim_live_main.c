/*
 * The entry point of `graft-sim run`'s live engine: the failure plan (its
 * file read, GRAFT_SIM_PLAN_ONLY), the knobs in the environment (the
 * trainers' ballast and simulated compute), the persistent roots, --netns,
 * the embedded etcd, the fault-free reference, one run
 * (graft_sim_run_once() in sim_live.c), the verdict and the report.
 */
#include "sim_live.h"
#include "sim_live_int.h"
#include "sim_netns.h"

#include "etcd_launcher.h"

#include <errno.h>
#include <inttypes.h>
#include <jansson.h>
#include <limits.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* The trainers' ballast (--blob-mib) when the plan kills donors: big enough
 * that a pull outlasts the time from the donor's "serving" line to its
 * SIGKILL (a few ms), measured in docs/SIM.md. GRAFT_SIM_BALLAST_MIB
 * overrides it (0: none). */
#define SIM_BALLAST_MIB 16
#define SIM_STEP_MS 5

static char *sim_read_file(const char *path)
{
    FILE *f = fopen(path, "r");
    if (f == NULL) {
        return NULL;
    }
    char *buf = NULL;
    size_t len = 0;
    FILE *m = open_memstream(&buf, &len);
    char chunk[4096];
    size_t n;
    while (m != NULL && (n = fread(chunk, 1, sizeof(chunk), f)) > 0) {
        fwrite(chunk, 1, n, m);
    }
    fclose(f);
    if (m != NULL) {
        fclose(m);
    }
    return buf;
}

/* *out_p = the environment's name as an integer in 0..max, or dflt when
 * unset or empty; -1 (said on stderr) when it is something else. */
static int sim_env_int(const char *name, long max, int dflt, int *out_p)
{
    const char *v = getenv(name);
    *out_p = dflt;
    if (v == NULL || v[0] == '\0')
        return 0;
    char *end = NULL;
    errno = 0;
    long x = strtol(v, &end, 10);
    if (*end != '\0' || errno != 0 || x < 0 || x > max) {
        fprintf(stderr, "graft-sim run: error: %s: '%s' is not 0..%ld\n", name, v, max);
        return -1;
    }
    *out_p = (int)x;
    return 0;
}

/* Whether the plan has an event of this kind. */
static int sim_plan_has(const graft_sim_schedule_t *sched, graft_sim_kind_t kind)
{
    for (size_t i = 0; i < sched->n_events; i++) {
        if (sched->events[i].kind == kind) {
            return 1;
        }
    }
    return 0;
}

/* The failure plan from the options and the schedule file's text, and the
 * trainers' knobs that depend on it. 0, or 2 (bad usage, said on stderr). */
static int sim_live_plan(const graft_sim_live_opts_t *o, const char *text,
                         graft_sim_schedule_t **sched_p, char **err_p)
{
    graft_status_t st = graft_sim_schedule_plan(o, text, sched_p, err_p);
    if (st != GRAFT_OK) {
        fprintf(stderr, "graft-sim run: error: schedule%s%s: %s (%s)\n",
                o->schedule_path ? " " : "", o->schedule_path ? o->schedule_path : "",
                *err_p ? *err_p : "invalid", graft_status_name(st));
        return 2;
    }
    /* Ballast only where it is needed: a plan that kills donors or cuts
     * them off (the pull must outlast the reaction to the serve). */
    int ballast = sim_plan_has(*sched_p, GRAFT_SIM_KILL_DONOR) ||
                          sim_plan_has(*sched_p, GRAFT_SIM_CUT_DONOR)
                      ? SIM_BALLAST_MIB
                      : 0;
    /* Simulated compute per step. Without it a steady step of the example
     * trainer takes well under a millisecond (the steady path involves no
     * etcd), so a whole run passes between two looks of the injector and
     * no failure lands at the step it was planned for. */
    if (sim_env_int("GRAFT_SIM_BALLAST_MIB", 4096, ballast, &graft_sim_ballast_mib) != 0 ||
        sim_env_int("GRAFT_SIM_STEP_MS", 60000, SIM_STEP_MS, &graft_sim_step_ms) != 0) {
        return 2;
    }
    return 0;
}

/* GRAFT_SIM_PLAN_ONLY=1: print the plan and stop (scripts and tests compare
 * plans this way). Whether it did. */
static bool sim_live_plan_only(const graft_sim_schedule_t *sched)
{
    const char *dump = getenv("GRAFT_SIM_PLAN_ONLY");
    if (dump == NULL || dump[0] != '1') {
        return false;
    }
    json_t *j = graft_sim_schedule_json(sched);
    char *s = j ? json_dumps(j, JSON_COMPACT) : NULL;
    printf("%s\n", s ? s : "null");
    free(s);
    json_decref(j);
    return true;
}

/* Persistent checkpoints: the user's root, or one in a temp dir, so a
 * disaster always has something to restore from. tmp_persist is the temp
 * dir (the reference's roots go there too); run_root the run's root. */
static graft_status_t sim_live_roots(graft_sim_live_opts_t *o, char *tmp_persist, size_t tmp_len,
                                     char *run_root, size_t run_len)
{
    snprintf(tmp_persist, tmp_len, "%s/graft-sim-persist-XXXXXX",
             getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp");
    if (mkdtemp(tmp_persist) == NULL) {
        fprintf(stderr, "graft-sim run: error: mkdtemp: %s\n", strerror(errno));
        return GRAFT_ESYS;
    }
    if (o->persist_root != NULL) {
        snprintf(run_root, run_len, "%s", o->persist_root);
        graft_sim_mkdirs(run_root);
        mkdir(run_root, 0755);
    } else {
        snprintf(run_root, run_len, "%s/run", tmp_persist);
        mkdir(run_root, 0755);
        o->persist_every = o->steps >= 10 ? o->steps / 10 : 1;
    }
    return GRAFT_OK;
}

/* --netns: the namespaces built (and netem probed when the plan has it);
 * the embedded etcd is then started through their wrapper. 0, or the exit
 * status (2: not possible here). */
static int sim_live_netns(const graft_sim_live_opts_t *o, const graft_sim_schedule_t *sched,
                          graft_etcd_server_opts_t *eopts)
{
    char tbuf[PATH_MAX];
    const char *rate = getenv("GRAFT_SIM_NETNS_RATE");
    graft_status_t st = graft_sim_netns_create(o->groups, rate != NULL && rate[0] ? rate : "1gbit",
                                               graft_sim_trainer_path(tbuf, sizeof(tbuf)),
                                               &graft_sim_net);
    if (st != GRAFT_OK) {
        return st == GRAFT_ENOTSUP || st == GRAFT_EINVAL ? 2 : 1;
    }
    /* The namespaces' own handlers tore them down during the build;
     * from here the run's cleanup does. */
    graft_sim_catch_stop_signals();
    if (sim_plan_has(sched, GRAFT_SIM_NETEM)) {
        st = graft_sim_netns_probe(graft_sim_net, GRAFT_SIM_LINK_NETEM);
        char q[160];
        graft_sim_netns_shape_text(graft_sim_net, GRAFT_SIM_LINK_NETEM, q, sizeof(q));
        if (st == GRAFT_ENOTSUP) {
            fprintf(stderr, "graft-sim run: error: --netns: the schedule has netem, but this "
                            "kernel has no netem qdisc (sch_netem, CONFIG_NET_SCH_NETEM): "
                            "'tc qdisc replace ... root %s' failed\n", q);
            return 2;
        }
        if (st != GRAFT_OK) {
            fprintf(stderr, "graft-sim run: error: --netns: the links' tbf could not be "
                            "restored after trying netem: %s\n", graft_status_string(st));
            return 1;
        }
    }
    eopts->binary = graft_sim_netns_etcd(graft_sim_net);
    printf("graft-sim run: --netns: %d groups in namespaces gsim%d-1..%d, links %s, hub %s\n",
           o->groups, (int)getpid(), o->groups, rate != NULL && rate[0] ? rate : "1gbit",
           graft_sim_netns_hub(graft_sim_net));
    return 0;
}

/* The job's etcd: --etcd's, or the embedded one (a cluster with
 * --etcd-members), after the namespaces with --netns. 0, or the exit
 * status. */
static int sim_live_etcd(const graft_sim_live_opts_t *o, const graft_sim_schedule_t *sched,
                         graft_etcd_cluster_t **cluster_p, const char **endpoint_p)
{
    graft_etcd_server_opts_t eopts;
    memset(&eopts, 0, sizeof(eopts));
    const char *const etcd_info[] = {"--log-level=info", NULL};
    if (graft_sim_keep()) {
        eopts.extra_args = etcd_info;
    }
    if (o->netns) {
        int rc = sim_live_netns(o, sched, &eopts);
        if (rc != 0) {
            return rc;
        }
    }
    *endpoint_p = o->etcd_url;
    if (*endpoint_p == NULL) {
        size_t members = o->etcd_members > 1 ? (size_t)o->etcd_members : 1;
        graft_status_t st = graft_etcd_cluster_start(&eopts, members, cluster_p);
        if (st != GRAFT_OK) {
            fprintf(stderr, "graft-sim run: error: cannot start the embedded etcd: %s\n",
                    graft_status_string(st));
            return 1;
        }
        *endpoint_p = graft_etcd_cluster_endpoints(*cluster_p);
    }
    return 0;
}

/* The verdict, the timeline plot (--plot, or next to --json), the text
 * report and the --json one. The exit status: 1 when FAILED. */
static int sim_live_report(const graft_sim_live_opts_t *o, const graft_sim_schedule_t *sched,
                           graft_sim_result_t *res, const char *ref, char **plot_p)
{
    const char *why = NULL;
    const char *verdict = graft_sim_verdict_judge(o, res, ref, &why);
    char *plot = NULL;
    if (o->plot_path != NULL) {
        plot = strdup(o->plot_path);
    } else if (o->json_path != NULL) {
        size_t n = strlen(o->json_path);
        if (n > 5 && strcmp(o->json_path + n - 5, ".json") == 0) {
            n -= 5;
        }
        if (asprintf(&plot, "%.*s.svg", (int)n, o->json_path) < 0) {
            plot = NULL;
        }
    }
    if (plot != NULL && graft_sim_timeline_svg(plot, o, res, verdict) != 0) {
        fprintf(stderr, "graft-sim run: warning: cannot write %s: %s\n", plot, strerror(errno));
        free(plot);
        plot = NULL;
    }
    *plot_p = plot;
    graft_sim_report_text(stdout, o, sched, res, verdict, why, ref, plot);
    if (o->json_path != NULL) {
        json_t *j = graft_sim_report_json(o, sched, res, verdict, why, ref);
        if (j == NULL || json_dump_file(j, o->json_path, JSON_INDENT(2)) != 0) {
            fprintf(stderr, "graft-sim run: error: cannot write %s\n", o->json_path);
            json_decref(j);
            return 1;
        }
        json_decref(j);
    }
    return strcmp(verdict, "FAILED") == 0 ? 1 : 0;
}

int graft_sim_live_run(const graft_sim_live_opts_t *opts)
{
    int rc = 1;
    graft_sim_live_opts_t o = *opts;
    graft_sim_schedule_t *sched = NULL;
    graft_etcd_cluster_t *cluster = NULL;
    const char *endpoint = NULL;
    char *text = NULL, *err = NULL, *ref = NULL, *plot = NULL;
    char tmp_persist[PATH_MAX] = "";
    char run_root[PATH_MAX + 16];
    graft_sim_result_t res;
    memset(&res, 0, sizeof(res));
    signal(SIGPIPE, SIG_IGN);
    graft_sim_stop_signal = 0;
    graft_sim_catch_stop_signals();

    if (o.netns && o.etcd_url != NULL) {
        /* The trainers in their namespaces must reach etcd: the embedded
         * one listens on the hub address; a given URL may be unreachable. */
        fprintf(stderr, "graft-sim run: error: --netns runs its own etcd; it cannot be combined "
                        "with --etcd\n");
        return 2;
    }
    if (o.schedule_path != NULL) {
        text = sim_read_file(o.schedule_path);
        if (text == NULL) {
            fprintf(stderr, "graft-sim run: error: --schedule: cannot read '%s': %s\n",
                    o.schedule_path, strerror(errno));
            return 2;
        }
    }
    rc = sim_live_plan(&o, text, &sched, &err);
    if (rc != 0 || sim_live_plan_only(sched)) {
        goto out;
    }
    rc = 1;
    if (sim_live_roots(&o, tmp_persist, sizeof(tmp_persist), run_root, sizeof(run_root)) !=
        GRAFT_OK) {
        goto out;
    }
    rc = sim_live_etcd(&o, sched, &cluster, &endpoint);
    if (rc != 0) {
        goto out;
    }
    rc = 1;
    printf("graft-sim run: %d groups x %d ranks, %lld steps, seed %" PRIu64 ", %s, %zu failures "
           "planned, etcd %s%s\n",
           o.groups, o.ranks, o.steps, o.seed,
           o.mode == GRAFT_SIM_LIVE_STRICT ? "strict" : "elastic", sched->n_events, endpoint,
           cluster == NULL                          ? ""
           : graft_etcd_cluster_size(cluster) == 1 ? " (embedded)"
                                                   : " (embedded cluster)");
    fflush(stdout);
    int cached = 0;
    if (o.mode == GRAFT_SIM_LIVE_STRICT) {
        ref = graft_sim_reference_hash(&o, tmp_persist, &cached);
        if (ref == NULL) {
            goto out;
        }
        printf("graft-sim: reference state hash %s%s\n", ref, cached ? " (cached)" : "");
    }
    if (graft_sim_run_once(&o, sched, cluster, endpoint, "run", run_root, &res) != GRAFT_OK) {
        goto out;
    }
    rc = sim_live_report(&o, sched, &res, ref, &plot);
out:
    fflush(stdout);
    graft_sim_result_clear(&res);
    graft_etcd_cluster_destroy(cluster);
    graft_sim_netns_destroy(graft_sim_net);
    graft_sim_net = NULL;
    if (tmp_persist[0] != '\0' && strstr(tmp_persist, "XXXXXX") == NULL) {
        char cmd[PATH_MAX + 16];
        snprintf(cmd, sizeof(cmd), "rm -rf '%s'", tmp_persist);
        if (system(cmd) != 0) {
            fprintf(stderr, "graft-sim run: warning: could not remove %s\n", tmp_persist);
        }
    }
    graft_sim_schedule_destroy(sched);
    free(text);
    free(err);
    free(ref);
    free(plot);
    if (graft_sim_stop_signal != 0) {
        fprintf(stderr, "graft-sim run: stopped by %s; trainers, etcd and temporary "
                        "directories were cleaned up\n", strsignal(graft_sim_stop_signal));
        rc = 128 + graft_sim_stop_signal;
    }
    return rc;
}
