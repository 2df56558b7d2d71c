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

#include <graft/etcd.h>

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

int graft_sim_live_run(const graft_sim_live_opts_t *opts)
{
    int rc = 1;
    graft_sim_live_opts_t o = *opts;
    graft_sim_schedule_t *sched = NULL;
    graft_etcd_cluster_t *cluster = NULL;
    char *text = NULL, *err = NULL, *ref = NULL, *plot = NULL;
    char tmp_persist[PATH_MAX] = "";
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
    graft_status_t st = graft_sim_schedule_plan(&o, text, &sched, &err);
    if (st != GRAFT_OK) {
        fprintf(stderr, "graft-sim run: error: schedule%s%s: %s (%s)\n",
                o.schedule_path ? " " : "", o.schedule_path ? o.schedule_path : "",
                err ? err : "invalid", graft_status_name(st));
        rc = 2;
        goto out;
    }
    /* Ballast only where it is needed: a plan that kills donors or cuts
     * them off (the pull must outlast the reaction to the serve). */
    int ballast = sim_plan_has(sched, GRAFT_SIM_KILL_DONOR) ||
                          sim_plan_has(sched, GRAFT_SIM_CUT_DONOR)
                      ? SIM_BALLAST_MIB
                      : 0;
    /* Simulated compute per step. Without it a steady step of the example
     * trainer takes well under a millisecond (the steady path involves no
     * etcd), so a whole run passes between two looks of the injector and
     * no failure lands at the step it was planned for. */
    if (sim_env_int("GRAFT_SIM_BALLAST_MIB", 4096, ballast, &graft_sim_ballast_mib) != 0 ||
        sim_env_int("GRAFT_SIM_STEP_MS", 60000, SIM_STEP_MS, &graft_sim_step_ms) != 0) {
        rc = 2;
        goto out;
    }
    const char *dump = getenv("GRAFT_SIM_PLAN_ONLY");
    if (dump != NULL && dump[0] == '1') {
        /* Print the plan and stop: scripts and tests compare plans this way. */
        json_t *j = graft_sim_schedule_json(sched);
        char *s = j ? json_dumps(j, JSON_COMPACT) : NULL;
        printf("%s\n", s ? s : "null");
        free(s);
        json_decref(j);
        rc = 0;
        goto out;
    }
    /* Persistent checkpoints: the user's root, or one in a temp dir, so a
     * disaster always has something to restore from. */
    snprintf(tmp_persist, sizeof(tmp_persist), "%s/graft-sim-persist-XXXXXX",
             getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp");
    if (mkdtemp(tmp_persist) == NULL) {
        fprintf(stderr, "graft-sim run: error: mkdtemp: %s\n", strerror(errno));
        goto out;
    }
    char run_root[PATH_MAX + 16];
    if (o.persist_root != NULL) {
        snprintf(run_root, sizeof(run_root), "%s", o.persist_root);
        graft_sim_mkdirs(run_root);
        mkdir(run_root, 0755);
    } else {
        snprintf(run_root, sizeof(run_root), "%s/run", tmp_persist);
        mkdir(run_root, 0755);
        o.persist_every = o.steps >= 10 ? o.steps / 10 : 1;
    }
    graft_etcd_server_opts_t eopts;
    memset(&eopts, 0, sizeof(eopts));
    const char *const etcd_info[] = {"--log-level=info", NULL};
    if (graft_sim_keep()) {
        eopts.extra_args = etcd_info;
    }
    if (o.netns) {
        char tbuf[PATH_MAX];
        const char *rate = getenv("GRAFT_SIM_NETNS_RATE");
        st = graft_sim_netns_create(o.groups, rate != NULL && rate[0] ? rate : "1gbit",
                                    graft_sim_trainer_path(tbuf, sizeof(tbuf)), &graft_sim_net);
        if (st != GRAFT_OK) {
            if (st == GRAFT_ENOTSUP || st == GRAFT_EINVAL) {
                rc = 2;
            }
            goto out;
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
                rc = 2;
                goto out;
            }
            if (st != GRAFT_OK) {
                fprintf(stderr, "graft-sim run: error: --netns: the links' tbf could not be "
                                "restored after trying netem: %s\n", graft_status_string(st));
                goto out;
            }
        }
        eopts.binary = graft_sim_netns_etcd(graft_sim_net);
        printf("graft-sim run: --netns: %d groups in namespaces gsim%d-1..%d, links %s, hub %s\n",
               o.groups, (int)getpid(), o.groups, rate != NULL && rate[0] ? rate : "1gbit",
               graft_sim_netns_hub(graft_sim_net));
    }
    const char *endpoint = o.etcd_url;
    if (endpoint == NULL) {
        size_t members = o.etcd_members > 1 ? (size_t)o.etcd_members : 1;
        st = graft_etcd_cluster_start(&eopts, members, &cluster);
        if (st != GRAFT_OK) {
            fprintf(stderr, "graft-sim run: error: cannot start the embedded etcd: %s\n",
                    graft_status_string(st));
            goto out;
        }
        endpoint = graft_etcd_cluster_endpoints(cluster);
    }
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
    st = graft_sim_run_once(&o, sched, cluster, endpoint, "run", run_root, &res);
    if (st != GRAFT_OK) {
        goto out;
    }
    const char *why = NULL;
    const char *verdict = graft_sim_verdict_judge(&o, &res, ref, &why);
    if (o.plot_path != NULL) {
        plot = strdup(o.plot_path);
    } else if (o.json_path != NULL) {
        size_t n = strlen(o.json_path);
        if (n > 5 && strcmp(o.json_path + n - 5, ".json") == 0) {
            n -= 5;
        }
        if (asprintf(&plot, "%.*s.svg", (int)n, o.json_path) < 0) {
            plot = NULL;
        }
    }
    if (plot != NULL && graft_sim_timeline_svg(plot, &o, &res, verdict) != 0) {
        fprintf(stderr, "graft-sim run: warning: cannot write %s: %s\n", plot, strerror(errno));
        free(plot);
        plot = NULL;
    }
    graft_sim_report_text(stdout, &o, sched, &res, verdict, why, ref, plot);
    if (o.json_path != NULL) {
        json_t *j = graft_sim_report_json(&o, sched, &res, verdict, why, ref);
        if (j == NULL || json_dump_file(j, o.json_path, JSON_INDENT(2)) != 0) {
            fprintf(stderr, "graft-sim run: error: cannot write %s\n", o.json_path);
            json_decref(j);
            goto out;
        }
        json_decref(j);
    }
    rc = strcmp(verdict, "FAILED") == 0 ? 1 : 0;
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
