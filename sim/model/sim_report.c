/*
 * Table and JSON renderings of a model report (sim_report.h). JSON goes
 * through jansson so that infinities and escaping are never hand-made:
 * JSON has no infinity, so an infinite interval is written as null.
 */
#include "sim_report.h"

#include "sim_params.h"

#include <errno.h>
#include <jansson.h>
#include <math.h>
#include <string.h>

/* Human-readable duration into @buf. */
static const char *sim_fmt_duration(double s, char *buf, size_t len)
{
    if (isinf(s)) {
        snprintf(buf, len, "never");
    } else if (s < 120) {
        snprintf(buf, len, "%.1f s", s);
    } else if (s < 7200) {
        snprintf(buf, len, "%.1f min", s / 60);
    } else if (s < 2 * 86400) {
        snprintf(buf, len, "%.2f h", s / 3600);
    } else {
        snprintf(buf, len, "%.2f d", s / 86400);
    }
    return buf;
}

/* The P2P strategies with and without spares, side by side. */
static void sim_spares_print(const graft_sim_report_t *report, FILE *out)
{
    const graft_sim_params_t *p = &report->params;
    char a[32], b[32], c[32];
    fprintf(out, "\nwith spares: each heal's replacement in its slot after %s (spare_seconds) "
                 "instead of %s (spawn_seconds), at each strategy's best interval:\n",
            sim_fmt_duration(p->spare_seconds, a, sizeof(a)),
            sim_fmt_duration(p->spawn_seconds, b, sizeof(b)));
    fprintf(out, "%-19s %11s %10s %12s %7s %11s\n", "strategy", "interval", "goodput",
            "with spares", "down%", "down% spares");
    for (int s = GRAFT_SIM_P2P_SINGLE; s < GRAFT_SIM_NSTRATEGIES; s++) {
        const graft_sim_result_t *w = &report->without_spares[s], *x = &report->with_spares[s];
        fprintf(out, "%-19s %11s %9.2f%% %11.2f%% %7.2f %11.2f\n",
                graft_sim_strategy_name((graft_sim_strategy_t)s),
                sim_fmt_duration(w->interval_seconds, c, sizeof(c)), 100 * w->goodput,
                100 * x->goodput, 100 * w->downtime_frac, 100 * x->downtime_frac);
    }
}

void graft_sim_report_print(const graft_sim_report_t *report, FILE *out)
{
    const graft_sim_params_t *p = &report->params;
    char a[32], b[32], c[32], d[32];
    double mtbf = graft_sim_job_mtbf_seconds(p);
    double horizon = p->horizon_days * 86400.0;

    fprintf(out, "graft-sim model: seed %llu, %d run%s of %.1f days per point, %d intervals "
                 "from %s to %s\n",
            (unsigned long long)report->seed, p->runs, p->runs == 1 ? "" : "s", p->horizon_days,
            report->npoints, sim_fmt_duration(report->sweep_lo_seconds, a, sizeof(a)),
            sim_fmt_duration(report->sweep_hi_seconds, b, sizeof(b)));
    fprintf(out, "cluster: %d groups x %d GPUs = %lld GPUs; GPU MTBF %.0f h -> job MTBF %s "
                 "(%.1f failures per run), %.1f%% disasters\n",
            p->groups, p->gpus_per_group, (long long)p->groups * p->gpus_per_group,
            p->gpu_mtbf_hours, sim_fmt_duration(mtbf, a, sizeof(a)), horizon / mtbf,
            100.0 * p->disaster_fraction);
    fprintf(out, "one recovery, nothing else failing: checkpoint-restart %s + lost work; "
                 "single-donor %s; multi-donor %s (%.1f GB per GPU)\n",
            sim_fmt_duration(p->detect_seconds + graft_sim_restart_cost(p), a, sizeof(a)),
            sim_fmt_duration(graft_sim_p2p_recovery_seconds(p, GRAFT_SIM_P2P_SINGLE), b,
                             sizeof(b)),
            sim_fmt_duration(graft_sim_p2p_recovery_seconds(p, GRAFT_SIM_P2P_MULTI), c,
                             sizeof(c)),
            p->state_gb);
    fprintf(out, "\n%-19s %11s %8s %7s %11s %11s %8s %7s %6s %7s %6s %8s %8s\n", "strategy",
            "best every", "goodput", "+-", "Young", "Daly", "@Young", "best/Y", "ckpt%",
            "rework%", "down%", "fail/run", "disk/run");
    for (int s = 0; s < GRAFT_SIM_NSTRATEGIES; s++) {
        const graft_sim_optimum_t *o = &report->optimum[s];
        char ratio[16], at_young[16];
        if (isfinite(o->young_seconds)) {
            snprintf(ratio, sizeof(ratio), "%.2f", o->best_interval_seconds / o->young_seconds);
            snprintf(at_young, sizeof(at_young), "%.2f%%", 100 * o->at_young.goodput);
        } else {
            snprintf(ratio, sizeof(ratio), "n/a");
            snprintf(at_young, sizeof(at_young), "n/a");
        }
        fprintf(out, "%-19s %10s%s %7.2f%% %6.2f%% %11s %11s %8s %7s %6.2f %7.2f %6.2f %8.1f %8.1f\n",
                graft_sim_strategy_name((graft_sim_strategy_t)s),
                sim_fmt_duration(o->best_interval_seconds, a, sizeof(a)),
                o->at_sweep_bound ? "*" : " ", 100 * o->best.goodput,
                100 * o->best.goodput_stddev, sim_fmt_duration(o->young_seconds, b, sizeof(b)),
                sim_fmt_duration(o->daly_seconds, d, sizeof(d)), at_young, ratio,
                100 * o->best.checkpoint_frac, 100 * o->best.rework_frac,
                100 * o->best.downtime_frac, o->best.failures, o->best.disk_restarts);
    }
    int bound = 0;
    for (int s = 0; s < GRAFT_SIM_NSTRATEGIES; s++) {
        bound |= report->optimum[s].at_sweep_bound;
    }
    if (bound) {
        fprintf(out, "* best interval at an end of the sweep: widen --sweep-min-seconds / "
                     "--sweep-max-seconds\n");
    }
    fprintf(out, "Young = sqrt(2 C M) with M the mean time between failures that need the disk "
                 "(all failures for checkpoint-restart, disasters for P2P); +- is the stddev over "
                 "runs\n");
    sim_spares_print(report, out);
    if (report->fixed_interval_seconds > 0) {
        fprintf(out, "\nat a fixed interval of %s:\n",
                sim_fmt_duration(report->fixed_interval_seconds, a, sizeof(a)));
        for (int s = 0; s < GRAFT_SIM_NSTRATEGIES; s++) {
            const graft_sim_result_t *r = &report->fixed[s];
            fprintf(out, "%-19s goodput %6.2f%%  ckpt %5.2f%%  rework %5.2f%%  down %5.2f%%  "
                         "p2p heals %.1f  transfer restarts %.2f  donor losses %.2f\n",
                    graft_sim_strategy_name((graft_sim_strategy_t)s), 100 * r->goodput,
                    100 * r->checkpoint_frac, 100 * r->rework_frac, 100 * r->downtime_frac,
                    r->p2p_recoveries, r->transfer_restarts, r->donor_losses);
        }
    }
}

/* A number, or null for infinity and NaN, which JSON cannot hold. */
static json_t *sim_json_real(double v)
{
    return isfinite(v) ? json_real(v) : json_null();
}

static json_t *sim_json_result(const graft_sim_result_t *r)
{
    return json_pack("{s:o, s:f, s:f, s:f, s:f, s:f, s:f, s:f, s:f, s:f, s:f, s:f, s:f}",
                     "interval_seconds", sim_json_real(r->interval_seconds), "goodput",
                     r->goodput, "goodput_stddev", r->goodput_stddev, "checkpoint_frac",
                     r->checkpoint_frac, "rework_frac", r->rework_frac, "downtime_frac",
                     r->downtime_frac, "failures", r->failures, "disasters", r->disasters,
                     "disk_restarts", r->disk_restarts, "p2p_recoveries", r->p2p_recoveries,
                     "transfer_restarts", r->transfer_restarts, "donor_losses",
                     r->donor_losses, "link_faults", r->link_faults);
}

/* "spares": the P2P strategies with and without spares at their best
 * interval; NULL when out of memory. */
static json_t *sim_json_spares(const graft_sim_report_t *report)
{
    json_t *arr = json_array();
    for (int s = GRAFT_SIM_P2P_SINGLE; arr != NULL && s < GRAFT_SIM_NSTRATEGIES; s++) {
        json_t *e = json_pack("{s:s, s:o, s:o, s:o}", "name",
                              graft_sim_strategy_name((graft_sim_strategy_t)s),
                              "interval_seconds",
                              sim_json_real(report->without_spares[s].interval_seconds),
                              "without", sim_json_result(&report->without_spares[s]), "with",
                              sim_json_result(&report->with_spares[s]));
        if (e == NULL || json_array_append_new(arr, e) != 0) {
            json_decref(arr);
            return NULL;
        }
    }
    return arr == NULL ? NULL
                       : json_pack("{s:f, s:f, s:o}", "spawn_seconds",
                                   report->params.spawn_seconds, "spare_seconds",
                                   report->params.spare_seconds, "strategies", arr);
}

static json_t *sim_json_build(const graft_sim_report_t *report)
{
    json_t *root = json_object(), *params = json_object(), *strategies = json_array();
    if (root == NULL || params == NULL || strategies == NULL) {
        goto fail;
    }
    for (int i = 0; i < graft_sim_params_count(); i++) {
        double v;
        const char *key = graft_sim_params_get(&report->params, i, &v);
        if (json_object_set_new(params, key, sim_json_real(v)) != 0) {
            goto fail;
        }
    }
    for (int s = 0; s < GRAFT_SIM_NSTRATEGIES; s++) {
        const graft_sim_optimum_t *o = &report->optimum[s];
        json_t *grid = json_array();
        if (grid == NULL) {
            goto fail;
        }
        for (int i = 0; i < report->npoints; i++) {
            if (json_array_append_new(grid, sim_json_result(&report->grid[s][i])) != 0) {
                json_decref(grid);
                goto fail;
            }
        }
        json_t *st = json_pack(
            "{s:s, s:o, s:b, s:o, s:o, s:o, s:o, s:o, s:o}", "name",
            graft_sim_strategy_name((graft_sim_strategy_t)s), "best_interval_seconds",
            sim_json_real(o->best_interval_seconds), "at_sweep_bound", o->at_sweep_bound, "best",
            sim_json_result(&o->best), "disk_mtbf_seconds", sim_json_real(o->disk_mtbf_seconds),
            "young_seconds", sim_json_real(o->young_seconds), "daly_seconds",
            sim_json_real(o->daly_seconds), "at_young",
            isfinite(o->young_seconds) ? sim_json_result(&o->at_young) : json_null(), "sweep",
            grid);
        if (st == NULL) {
            goto fail;
        }
        if (report->fixed_interval_seconds > 0 &&
            json_object_set_new(st, "fixed", sim_json_result(&report->fixed[s])) != 0) {
            json_decref(st);
            goto fail;
        }
        if (json_array_append_new(strategies, st) != 0) {
            goto fail;
        }
    }
    char seed[32];
    snprintf(seed, sizeof(seed), "%llu", (unsigned long long)report->seed);
    if (json_object_set_new(root, "mode", json_string("model")) != 0 ||
        json_object_set_new(root, "seed", json_string(seed)) != 0 ||
        json_object_set_new(root, "job_mtbf_seconds",
                            sim_json_real(graft_sim_job_mtbf_seconds(&report->params))) != 0 ||
        json_object_set(root, "params", params) != 0 ||
        json_object_set(root, "strategies", strategies) != 0 ||
        json_object_set_new(root, "spares", sim_json_spares(report)) != 0) {
        goto fail;
    }
    json_decref(params);
    json_decref(strategies);
    return root;
fail:
    json_decref(strategies);
    json_decref(params);
    json_decref(root);
    return NULL;
}

graft_status_t graft_sim_report_write_json(const graft_sim_report_t *report, const char *path,
                                           char *err, size_t errlen)
{
    graft_status_t st = GRAFT_OK;
    json_t *root = sim_json_build(report);
    if (root == NULL) {
        snprintf(err, errlen, "%s: out of memory building the JSON report", path);
        st = GRAFT_ENOMEM;
        goto out;
    }
    /* The seed is a string: a 64-bit seed does not survive a double. */
    if (json_dump_file(root, path, JSON_INDENT(1) | JSON_REAL_PRECISION(15)) != 0) {
        snprintf(err, errlen, "%s: cannot write: %s", path, strerror(errno));
        st = GRAFT_EIO;
        goto out;
    }
out:
    json_decref(root);
    return st;
}
