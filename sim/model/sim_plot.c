/*
 * SVG plot of a model report: goodput (y) against the persistent checkpoint
 * interval (x, log scale), one line per strategy, a dot at each optimum and
 * a dashed line at each finite Young interval. SVG is plain text, so it is
 * written directly; every string in it is ours, so nothing needs escaping.
 */
#include "sim_report.h"

#include <errno.h>
#include <math.h>
#include <string.h>

#define SIM_PLOT_W 900.0
#define SIM_PLOT_H 520.0
#define SIM_PLOT_L 80.0 /* margins */
#define SIM_PLOT_R 220.0
#define SIM_PLOT_T 40.0
#define SIM_PLOT_B 60.0

static const char *const sim_plot_colors[GRAFT_SIM_NSTRATEGIES] = {"#d62728", "#ff7f0e",
                                                                   "#1f77b4"};

typedef struct sim_plot_axes {
    double lx0, lx1; /* log10 of the x range */
    double y0, y1;   /* goodput range */
} sim_plot_axes_t;

static double sim_plot_x(const sim_plot_axes_t *a, double seconds)
{
    double w = SIM_PLOT_W - SIM_PLOT_L - SIM_PLOT_R;
    return SIM_PLOT_L + w * (log10(seconds) - a->lx0) / (a->lx1 - a->lx0);
}

static double sim_plot_y(const sim_plot_axes_t *a, double goodput)
{
    double h = SIM_PLOT_H - SIM_PLOT_T - SIM_PLOT_B;
    return SIM_PLOT_T + h * (a->y1 - goodput) / (a->y1 - a->y0);
}

static void sim_plot_axes(FILE *f, const sim_plot_axes_t *a)
{
    double x0 = SIM_PLOT_L, x1 = SIM_PLOT_W - SIM_PLOT_R;
    double y0 = SIM_PLOT_T, y1 = SIM_PLOT_H - SIM_PLOT_B;
    fprintf(f, "<rect x='%.1f' y='%.1f' width='%.1f' height='%.1f' fill='none' stroke='#333'/>\n",
            x0, y0, x1 - x0, y1 - y0);
    /* x ticks at round durations that fall inside the range. */
    static const struct {
        double s;
        const char *label;
    } ticks[] = {{1, "1s"},       {10, "10s"},    {60, "1min"},    {600, "10min"},
                 {1800, "30min"}, {3600, "1h"},   {4 * 3600, "4h"}, {12 * 3600, "12h"},
                 {86400, "1d"},   {7 * 86400, "7d"}, {30 * 86400, "30d"}};
    for (size_t i = 0; i < sizeof(ticks) / sizeof(ticks[0]); i++) {
        double l = log10(ticks[i].s);
        if (l < a->lx0 || l > a->lx1) {
            continue;
        }
        double x = sim_plot_x(a, ticks[i].s);
        fprintf(f, "<line x1='%.1f' y1='%.1f' x2='%.1f' y2='%.1f' stroke='#ddd'/>\n", x, y0, x,
                y1);
        fprintf(f, "<text x='%.1f' y='%.1f' font-size='12' text-anchor='middle'>%s</text>\n", x,
                y1 + 18, ticks[i].label);
    }
    /* y ticks: about six round steps. */
    double span = a->y1 - a->y0;
    double step = pow(10, floor(log10(span / 6)));
    if (span / step > 12) {
        step *= 2.5;
    }
    for (double v = ceil(a->y0 / step) * step; v <= a->y1 + 1e-12; v += step) {
        double y = sim_plot_y(a, v);
        fprintf(f, "<line x1='%.1f' y1='%.1f' x2='%.1f' y2='%.1f' stroke='#ddd'/>\n", x0, y, x1,
                y);
        fprintf(f, "<text x='%.1f' y='%.1f' font-size='12' text-anchor='end'>%.4g%%</text>\n",
                x0 - 6, y + 4, 100 * v);
    }
    fprintf(f, "<text x='%.1f' y='%.1f' font-size='13' text-anchor='middle'>persistent "
               "checkpoint interval (training time, log scale)</text>\n",
            (x0 + x1) / 2, SIM_PLOT_H - 15);
    fprintf(f, "<text x='18' y='%.1f' font-size='13' text-anchor='middle' "
               "transform='rotate(-90 18 %.1f)'>goodput</text>\n",
            (y0 + y1) / 2, (y0 + y1) / 2);
}

static void sim_plot_series(FILE *f, const graft_sim_report_t *r, const sim_plot_axes_t *a, int s)
{
    const graft_sim_optimum_t *o = &r->optimum[s];
    fprintf(f, "<polyline fill='none' stroke='%s' stroke-width='2' points='", sim_plot_colors[s]);
    for (int i = 0; i < r->npoints; i++) {
        double g = fmax(r->grid[s][i].goodput, a->y0);
        fprintf(f, "%.1f,%.1f ", sim_plot_x(a, r->grid[s][i].interval_seconds), sim_plot_y(a, g));
    }
    fprintf(f, "'/>\n");
    fprintf(f, "<circle cx='%.1f' cy='%.1f' r='5' fill='%s'/>\n",
            sim_plot_x(a, o->best_interval_seconds), sim_plot_y(a, o->best.goodput),
            sim_plot_colors[s]);
    if (isfinite(o->young_seconds) && log10(o->young_seconds) >= a->lx0 &&
        log10(o->young_seconds) <= a->lx1) {
        double x = sim_plot_x(a, o->young_seconds);
        fprintf(f, "<line x1='%.1f' y1='%.1f' x2='%.1f' y2='%.1f' stroke='%s' "
                   "stroke-dasharray='5,4'/>\n",
                x, SIM_PLOT_T, x, SIM_PLOT_H - SIM_PLOT_B, sim_plot_colors[s]);
    }
    double ly = SIM_PLOT_T + 20 + 44.0 * s;
    double lx = SIM_PLOT_W - SIM_PLOT_R + 15;
    fprintf(f, "<line x1='%.1f' y1='%.1f' x2='%.1f' y2='%.1f' stroke='%s' stroke-width='2'/>\n",
            lx, ly, lx + 25, ly, sim_plot_colors[s]);
    fprintf(f, "<text x='%.1f' y='%.1f' font-size='12'>%s</text>\n", lx + 30, ly + 4,
            graft_sim_strategy_name((graft_sim_strategy_t)s));
    fprintf(f, "<text x='%.1f' y='%.1f' font-size='11' fill='#555'>best %.2f%%</text>\n",
            lx + 30, ly + 19, 100 * o->best.goodput);
}

graft_status_t graft_sim_plot_write_svg(const graft_sim_report_t *report, const char *path,
                                        char *err, size_t errlen)
{
    graft_status_t st = GRAFT_OK;
    sim_plot_axes_t a;
    FILE *f = fopen(path, "w");
    if (f == NULL) {
        snprintf(err, errlen, "%s: cannot create: %s", path, strerror(errno));
        st = GRAFT_EIO;
        goto out;
    }
    a.lx0 = log10(report->sweep_lo_seconds);
    a.lx1 = log10(report->sweep_hi_seconds);
    /* y from a little under the worst point worth seeing to just over the
     * best; a strategy whose curve dives far down is clipped at the floor
     * so the interesting region keeps its resolution. */
    double best = 0, worst = 1;
    for (int s = 0; s < GRAFT_SIM_NSTRATEGIES; s++) {
        best = fmax(best, report->optimum[s].best.goodput);
        worst = fmin(worst, report->optimum[s].best.goodput);
    }
    double spread = fmax(best - worst, 0.01);
    a.y1 = fmin(1.0, best + 0.1 * spread);
    a.y0 = fmax(0.0, worst - 1.5 * spread);
    if (!(a.y1 > a.y0)) {
        a.y0 = a.y1 - 0.01;
    }
    fprintf(f, "<?xml version='1.0' encoding='UTF-8'?>\n");
    fprintf(f, "<svg xmlns='http://www.w3.org/2000/svg' width='%.0f' height='%.0f' "
               "viewBox='0 0 %.0f %.0f' font-family='sans-serif'>\n",
            SIM_PLOT_W, SIM_PLOT_H, SIM_PLOT_W, SIM_PLOT_H);
    fprintf(f, "<rect width='100%%' height='100%%' fill='white'/>\n");
    fprintf(f, "<text x='%.1f' y='24' font-size='15' text-anchor='middle'>goodput vs persistent "
               "checkpoint interval: %d groups x %d GPUs, seed %llu (dot: best; dashed: "
               "Young)</text>\n",
            SIM_PLOT_W / 2, report->params.groups, report->params.gpus_per_group,
            (unsigned long long)report->seed);
    sim_plot_axes(f, &a);
    for (int s = 0; s < GRAFT_SIM_NSTRATEGIES; s++) {
        sim_plot_series(f, report, &a, s);
    }
    fprintf(f, "</svg>\n");
    if (ferror(f)) {
        snprintf(err, errlen, "%s: write failed: %s", path, strerror(errno));
        st = GRAFT_EIO;
    }
    if (fclose(f) != 0 && st == GRAFT_OK) {
        snprintf(err, errlen, "%s: close failed: %s", path, strerror(errno));
        st = GRAFT_EIO;
    }
out:
    return st;
}
