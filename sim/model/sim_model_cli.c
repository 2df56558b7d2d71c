/*
 * `graft-sim model`: command line, sweep of every strategy, outputs.
 * Parameter files are applied first, in the order given, then flags, so a
 * flag always wins over a measured value it is meant to override.
 */
#include "../sim_cli.h"
#include "sim_params.h"
#include "sim_report.h"

#include <assert.h>
#include <errno.h>
#include <jansson.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#define SIM_MAX_PARAM_FILES 16
#define SIM_MAX_PARAMS 64

typedef struct sim_model_opts {
    graft_sim_params_t params;
    uint64_t seed;
    const char *json_path;
    const char *plot_path;
    const char *param_files[SIM_MAX_PARAM_FILES];
    int nparam_files;
    double fixed_interval;
    double sweep_lo, sweep_hi;
    int sweep_points;
    double interruptions, period_days;
    int mtbf_flag_given;
    graft_sim_bench_t bench;              /* --bench-json figures */
    const char *given[SIM_MAX_PARAMS];    /* parameter -> the flag or file that set it */
    graft_sim_figure_t figs[GRAFT_SIM_NFIGS];
} sim_model_opts_t;

static void sim_model_usage(FILE *out)
{
    fprintf(out,
            "usage: graft-sim model [options]\n"
            "Discrete-event model of a large cluster: goodput of checkpoint-restart,\n"
            "single-donor P2P and multi-donor verified P2P recovery over a sweep of\n"
            "persistent checkpoint intervals, against Young/Daly. Defaults reproduce\n"
            "Llama 3 405B on 16,384 H100 (419 interruptions in 54 days). See docs/SIM.md.\n\n"
            "  --seed N                   random seed [1]\n"
            "  --params FILE              JSON object of parameters (keys as below with '_'),\n"
            "                             or a benchmark's --json output; repeatable; flags win\n"
            "  --bench-json FILE          --json output of runtime_bench, membership_bench or\n"
            "                             persist_bench (its last line), or a graft-sim run\n"
            "                             --spares --json report (spare_seconds); repeatable.\n"
            "                             Measured figures replace assumed ones; flags and\n"
            "                             --params win\n"
            "  --json FILE                write the report as JSON\n"
            "  --plot FILE.svg            draw goodput vs checkpoint interval\n"
            "  --persist-every-seconds S  also report every strategy at this interval\n"
            "  --sweep-min-seconds S      first interval of the sweep [60]\n"
            "  --sweep-max-seconds S      last interval of the sweep [172800]\n"
            "  --sweep-points N           intervals in the sweep, log-spaced [25]\n"
            "  --interruptions N --period-days D\n"
            "                             set gpu_mtbf_hours from N failures in D days on\n"
            "                             this cluster (instead of --gpu-mtbf-hours)\n"
            "model parameters (--flag value, [default]):\n");
    graft_sim_params_usage(out);
}

static int sim_parse_double(const char *flag, const char *v, double *out_p)
{
    char *end = NULL;
    errno = 0;
    double d = strtod(v, &end);
    if (end == v || *end != '\0' || isnan(d) || errno == ERANGE) {
        fprintf(stderr, "graft-sim model: error: %s: '%s' is not a number\n", flag, v);
        return -1;
    }
    *out_p = d;
    return 0;
}

/* The parameters a --params file changed were given by it. */
static void sim_mark_given(sim_model_opts_t *o, const graft_sim_params_t *before,
                           const char *path)
{
    for (int i = 0; i < graft_sim_params_count(); i++) {
        double a, b;
        (void)graft_sim_params_get(before, i, &a);
        (void)graft_sim_params_get(&o->params, i, &b);
        if (a != b) {
            o->given[i] = path;
        }
    }
}

/* Every figure with where it came from, so nobody mistakes an assumption
 * for a measurement. */
static void sim_figures_print(const sim_model_opts_t *o, const graft_sim_report_t *rep,
                              FILE *out)
{
    fprintf(out, "figures (measured: a --bench-json file; given: a flag or --params file; "
                 "assumed: the model's default):\n");
    for (int i = 0; i < GRAFT_SIM_NFIGS; i++) {
        const graft_sim_figure_t *f = &o->figs[i];
        fprintf(out, "  %-31s %10.4g %-4s %-8s %s%s%s\n", f->name, f->value, f->unit,
                graft_sim_origin_name(f->origin), f->source, f->source[0] != '\0' ? ": " : "",
                f->basis);
    }
    for (int s = 0; s < GRAFT_SIM_NSTRATEGIES; s++) {
        fprintf(out, "  %-20s per-step coordination takes %.3f%% of wall time at its best "
                     "interval\n",
                graft_sim_strategy_name((graft_sim_strategy_t)s),
                100.0 * rep->optimum[s].best.coordination_frac);
    }
    fprintf(out, "\n");
}

/* Adds the figures and their origins to the report's JSON file. */
static graft_status_t sim_figures_json(const sim_model_opts_t *o, const graft_sim_report_t *rep,
                                       const char *path, char *err, size_t errlen)
{
    graft_status_t st = GRAFT_OK;
    json_error_t jerr;
    json_t *root = json_load_file(path, 0, &jerr);
    json_t *figs = json_object();
    if (root == NULL || figs == NULL) {
        snprintf(err, errlen, "%s: cannot read back: %s", path, jerr.text);
        st = GRAFT_EIO;
        goto out;
    }
    for (int i = 0; i < GRAFT_SIM_NFIGS; i++) {
        const graft_sim_figure_t *f = &o->figs[i];
        json_t *fj = json_pack("{s:f, s:s, s:s, s:s, s:s}", "value", f->value, "unit", f->unit,
                               "origin", graft_sim_origin_name(f->origin), "source", f->source,
                               "basis", f->basis);
        if (fj == NULL || json_object_set_new(figs, f->name, fj) != 0) {
            snprintf(err, errlen, "%s: out of memory", path);
            st = GRAFT_ENOMEM;
            goto out;
        }
    }
    json_t *strategies = json_object_get(root, "strategies");
    for (size_t s = 0; s < json_array_size(strategies) && s < GRAFT_SIM_NSTRATEGIES; s++) {
        json_t *best = json_object_get(json_array_get(strategies, s), "best");
        if (json_is_object(best)) {
            (void)json_object_set_new(best, "coordination_frac",
                                      json_real(rep->optimum[s].best.coordination_frac));
        }
    }
    if (json_object_set(root, "figures", figs) != 0 ||
        json_dump_file(root, path, JSON_INDENT(1) | JSON_REAL_PRECISION(15)) != 0) {
        snprintf(err, errlen, "%s: cannot write", path);
        st = GRAFT_EIO;
    }
out:
    json_decref(figs);
    json_decref(root);
    return st;
}

/* One "--name value" or "--name=value" of argv at *i (moved past its
 * value): name into name[len], *value_p. 0, 1 for --help, 2 on a usage
 * error. */
static int sim_model_arg(int argc, char **argv, int *i, char *name, size_t len,
                         const char **value_p)
{
    const char *arg = argv[*i];
    if (strcmp(arg, "--help") == 0 || strcmp(arg, "-h") == 0) {
        return 1;
    }
    if (strncmp(arg, "--", 2) != 0) {
        fprintf(stderr, "graft-sim model: error: unexpected argument '%s'\n", arg);
        return 2;
    }
    const char *eq = strchr(arg, '=');
    size_t nlen = eq != NULL ? (size_t)(eq - arg - 2) : strlen(arg + 2);
    if (nlen == 0 || nlen >= len) {
        fprintf(stderr, "graft-sim model: error: bad option '%s'\n", arg);
        return 2;
    }
    memcpy(name, arg + 2, nlen);
    name[nlen] = '\0';
    if (eq != NULL) {
        *value_p = eq + 1;
    } else if (*i + 1 < argc) {
        *value_p = argv[++*i];
    } else {
        fprintf(stderr, "graft-sim model: error: --%s needs a value\n", name);
        return 2;
    }
    return 0;
}

/* --params and --bench-json, read in the first pass. 0, 2 on an error, -1
 * when name is neither. */
static int sim_model_file_flag(sim_model_opts_t *o, const char *name, const char *value, int pass)
{
    char err[256];
    graft_status_t st;
    if (strcmp(name, "params") == 0) {
        if (pass == 0) {
            if (o->nparam_files == SIM_MAX_PARAM_FILES) {
                fprintf(stderr, "graft-sim model: error: more than %d --params files\n",
                        SIM_MAX_PARAM_FILES);
                return 2;
            }
            o->param_files[o->nparam_files++] = value;
            graft_sim_params_t before = o->params;
            st = graft_sim_params_load(&o->params, value, err, sizeof(err));
            if (st != GRAFT_OK) {
                fprintf(stderr, "graft-sim model: error: %s (%s)\n", err, graft_status_name(st));
                return 2;
            }
            sim_mark_given(o, &before, value);
        }
        return 0;
    }
    if (strcmp(name, "bench-json") == 0) {
        if (pass == 0) {
            st = graft_sim_bench_load(&o->bench, value, err, sizeof(err));
            if (st != GRAFT_OK) {
                fprintf(stderr, "graft-sim model: error: --bench-json %s (%s)\n", err,
                        graft_status_name(st));
                return 2;
            }
        }
        return 0;
    }
    return -1;
}

/* The sweep's and the failure rate's flags. 0, 2 on an error, -1 when
 * name is none of them. */
static int sim_model_sweep_flag(sim_model_opts_t *o, const char *name, const char *value)
{
    if (strcmp(name, "persist-every-seconds") == 0) {
        if (sim_parse_double("--persist-every-seconds", value, &o->fixed_interval) != 0) {
            return 2;
        }
        if (!(o->fixed_interval > 0) || isinf(o->fixed_interval)) {
            fprintf(stderr, "graft-sim model: error: --persist-every-seconds must be "
                            "a positive, finite number of seconds\n");
            return 2;
        }
    } else if (strcmp(name, "sweep-min-seconds") == 0) {
        return sim_parse_double("--sweep-min-seconds", value, &o->sweep_lo) != 0 ? 2 : 0;
    } else if (strcmp(name, "sweep-max-seconds") == 0) {
        return sim_parse_double("--sweep-max-seconds", value, &o->sweep_hi) != 0 ? 2 : 0;
    } else if (strcmp(name, "sweep-points") == 0) {
        double d;
        if (sim_parse_double("--sweep-points", value, &d) != 0) {
            return 2;
        }
        if (d != floor(d) || d < 2 || d > 1000) {
            fprintf(stderr, "graft-sim model: error: --sweep-points: %s is not an "
                            "integer in [2, 1000]\n",
                    value);
            return 2;
        }
        o->sweep_points = (int)d;
    } else if (strcmp(name, "interruptions") == 0) {
        if (sim_parse_double("--interruptions", value, &o->interruptions) != 0) {
            return 2;
        }
        if (!(o->interruptions > 0) || isinf(o->interruptions)) {
            fprintf(stderr, "graft-sim model: error: --interruptions must be > 0\n");
            return 2;
        }
    } else if (strcmp(name, "period-days") == 0) {
        if (sim_parse_double("--period-days", value, &o->period_days) != 0) {
            return 2;
        }
        if (!(o->period_days > 0) || isinf(o->period_days)) {
            fprintf(stderr, "graft-sim model: error: --period-days must be > 0\n");
            return 2;
        }
    } else {
        return -1;
    }
    return 0;
}

/* A flag of the second pass: the seed, the outputs, the sweep, or a model
 * parameter (arg as given, for the figures' origins). 0, or 2. */
static int sim_model_flag(sim_model_opts_t *o, const char *name, const char *value,
                          const char *arg)
{
    char err[256];
    if (strcmp(name, "seed") == 0) {
        char *end = NULL;
        errno = 0;
        unsigned long long s = strtoull(value, &end, 10);
        if (end == value || *end != '\0' || errno == ERANGE || value[0] == '-') {
            fprintf(stderr, "graft-sim model: error: --seed: '%s' is not an unsigned "
                            "64-bit integer\n",
                    value);
            return 2;
        }
        o->seed = s;
        return 0;
    }
    if (strcmp(name, "json") == 0) {
        o->json_path = value;
        return 0;
    }
    if (strcmp(name, "plot") == 0) {
        o->plot_path = value;
        return 0;
    }
    int rc = sim_model_sweep_flag(o, name, value);
    if (rc >= 0) {
        return rc;
    }
    graft_status_t st = graft_sim_params_set(&o->params, name, value, err, sizeof(err));
    if (st == GRAFT_ENOTFOUND) {
        fprintf(stderr, "graft-sim model: error: unknown option '--%s' (see "
                        "graft-sim model --help)\n",
                name);
        return 2;
    }
    if (st != GRAFT_OK) {
        fprintf(stderr, "graft-sim model: error: --%s\n", err);
        return 2;
    }
    if (strcmp(name, "gpu-mtbf-hours") == 0) {
        o->mtbf_flag_given = 1;
    }
    o->given[graft_sim_params_index(name)] = arg;
    return 0;
}

/* After the flags: the failure rate from --interruptions/--period-days,
 * the measured curves applied, and the parameters and sweep checked. 0, or
 * 2. */
static int sim_model_settle(sim_model_opts_t *o)
{
    char err[256];
    if ((o->interruptions > 0) != (o->period_days > 0)) {
        fprintf(stderr, "graft-sim model: error: --interruptions and --period-days go "
                        "together\n");
        return 2;
    }
    if (o->interruptions > 0) {
        if (o->mtbf_flag_given) {
            fprintf(stderr, "graft-sim model: error: give either --gpu-mtbf-hours or "
                            "--interruptions/--period-days, not both\n");
            return 2;
        }
        o->params.gpu_mtbf_hours = (double)o->params.groups * o->params.gpus_per_group *
                                   o->period_days * 24.0 / o->interruptions;
    }
    /* Groups and ranks are final: evaluate the measured curves there. */
    graft_sim_bench_apply(&o->bench, &o->params, o->given, o->figs);
    graft_status_t st = graft_sim_params_check(&o->params, err, sizeof(err));
    if (st != GRAFT_OK) {
        fprintf(stderr, "graft-sim model: error: %s\n", err);
        return 2;
    }
    if (!(o->sweep_lo > 0) || !(o->sweep_hi > o->sweep_lo) || isinf(o->sweep_hi)) {
        fprintf(stderr, "graft-sim model: error: the sweep needs 0 < --sweep-min-seconds < "
                        "--sweep-max-seconds < inf (got %g and %g)\n",
                o->sweep_lo, o->sweep_hi);
        return 2;
    }
    return 0;
}

/* Each P2P strategy at its best interval as it is and with spares (each
 * heal's replacement up after spare_seconds instead of spawn_seconds),
 * same seed: the failures are the same (common random numbers). */
static graft_status_t sim_model_spares(graft_sim_report_t *rep)
{
    graft_sim_params_t with = rep->params;
    with.spawn_seconds = rep->params.spare_seconds;
    graft_status_t st = GRAFT_OK;
    for (int s = GRAFT_SIM_P2P_SINGLE; st == GRAFT_OK && s < GRAFT_SIM_NSTRATEGIES; s++) {
        double t = rep->optimum[s].best_interval_seconds;
        st = graft_sim_model_simulate(&rep->params, (graft_sim_strategy_t)s, t, rep->seed,
                                      &rep->without_spares[s]);
        if (st == GRAFT_OK) {
            st = graft_sim_model_simulate(&with, (graft_sim_strategy_t)s, t, rep->seed,
                                          &rep->with_spares[s]);
        }
    }
    return st;
}

/* Returns 0, 1 when --help was asked for, or 2 on a usage error. */
static int sim_model_parse(int argc, char **argv, sim_model_opts_t *o)
{
    /* First pass: parameter files, so that flags override them. */
    for (int pass = 0; pass < 2; pass++) {
        for (int i = 1; i < argc; i++) {
            const char *arg = argv[i];
            char name[64];
            const char *value = NULL;
            int rc = sim_model_arg(argc, argv, &i, name, sizeof(name), &value);
            if (rc == 0) {
                rc = sim_model_file_flag(o, name, value, pass);
            }
            if (rc < 0 && pass == 1) {
                rc = sim_model_flag(o, name, value, arg);
            }
            if (rc > 0) {
                return rc;
            }
        }
    }
    return sim_model_settle(o);
}

int graft_sim_model_main(int argc, char **argv)
{
    int rc = 1;
    char err[256];
    graft_status_t st;
    sim_model_opts_t o;
    graft_sim_report_t rep;

    assert(graft_sim_params_count() <= SIM_MAX_PARAMS);
    memset(&o, 0, sizeof(o));
    memset(&rep, 0, sizeof(rep));
    graft_sim_params_default(&o.params);
    o.seed = 1;
    o.sweep_lo = 60;
    o.sweep_hi = 2 * 86400;
    o.sweep_points = 25;

    int prc = sim_model_parse(argc, argv, &o);
    if (prc == 1) {
        sim_model_usage(stdout);
        rc = 0;
        goto out;
    }
    if (prc != 0) {
        rc = 2;
        goto out;
    }

    rep.params = o.params;
    rep.seed = o.seed;
    rep.sweep_lo_seconds = o.sweep_lo;
    rep.sweep_hi_seconds = o.sweep_hi;
    rep.npoints = o.sweep_points;
    rep.fixed_interval_seconds = o.fixed_interval;
    for (int s = 0; s < GRAFT_SIM_NSTRATEGIES; s++) {
        rep.grid[s] = calloc((size_t)rep.npoints, sizeof(graft_sim_result_t));
        if (rep.grid[s] == NULL) {
            fprintf(stderr, "graft-sim model: error: out of memory\n");
            goto out_free;
        }
        st = graft_sim_model_sweep(&rep.params, (graft_sim_strategy_t)s, o.sweep_lo, o.sweep_hi,
                                   o.sweep_points, o.seed, rep.grid[s], &rep.optimum[s]);
        if (st == GRAFT_OK && o.fixed_interval > 0) {
            st = graft_sim_model_simulate(&rep.params, (graft_sim_strategy_t)s, o.fixed_interval,
                                          o.seed, &rep.fixed[s]);
        }
        if (st != GRAFT_OK) {
            fprintf(stderr, "graft-sim model: error: %s failed: %s%s\n",
                    graft_sim_strategy_name((graft_sim_strategy_t)s), graft_status_string(st),
                    st == GRAFT_ERANGE ? " (too many events: raise the intervals or the MTBF, "
                                         "or shorten --horizon-days)"
                                       : "");
            goto out_free;
        }
    }
    st = sim_model_spares(&rep);
    if (st != GRAFT_OK) {
        fprintf(stderr, "graft-sim model: error: the comparison with spares failed: %s\n",
                graft_status_string(st));
        goto out_free;
    }
    sim_figures_print(&o, &rep, stdout);
    graft_sim_report_print(&rep, stdout);
    if (o.json_path != NULL) {
        st = graft_sim_report_write_json(&rep, o.json_path, err, sizeof(err));
        if (st == GRAFT_OK) {
            st = sim_figures_json(&o, &rep, o.json_path, err, sizeof(err));
        }
        if (st != GRAFT_OK) {
            fprintf(stderr, "graft-sim model: error: %s\n", err);
            goto out_free;
        }
        printf("wrote %s\n", o.json_path);
    }
    if (o.plot_path != NULL) {
        st = graft_sim_plot_write_svg(&rep, o.plot_path, err, sizeof(err));
        if (st != GRAFT_OK) {
            fprintf(stderr, "graft-sim model: error: %s\n", err);
            goto out_free;
        }
        printf("wrote %s\n", o.plot_path);
    }
    rc = 0;
out_free:
    for (int s = 0; s < GRAFT_SIM_NSTRATEGIES; s++) {
        free(rep.grid[s]);
    }
out:
    fflush(stdout);
    return rc;
}
