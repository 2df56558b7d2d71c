/*
 * SVG plot of a live run, in the style of sim_plot.c: on top the timeline
 * (committed step against wall time, a marker per injected failure coloured
 * by kind, a band per recovery from failure to heal), below the
 * distribution of recovery times (histogram of fail -> healed seconds).
 * Every string in it is ours, so nothing needs escaping.
 */
#include "sim_live_int.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>

#define SIM_TL_W 900.0
#define SIM_TL_L 70.0
#define SIM_TL_R 170.0
#define SIM_TL_TOP_Y0 40.0
#define SIM_TL_TOP_Y1 300.0
#define SIM_TL_BOT_Y0 360.0
#define SIM_TL_BOT_Y1 540.0
#define SIM_TL_H 590.0
#define SIM_TL_BINS 20

static const char *const sim_tl_colors[GRAFT_SIM_KIND_COUNT] = {
    "#d62728", "#ff7f0e", "#9467bd", "#8c564b", "#000000", "#2ca02c", "#17becf", "#bcbd22",
    "#e377c2", "#7f7f7f", "#aec7e8", "#98df8a"};

int graft_sim_timeline_svg(const char *path, const graft_sim_live_opts_t *o,
                           const graft_sim_result_t *res, const char *verdict)
{
    FILE *f = fopen(path, "w");
    if (f == NULL) {
        return -1;
    }
    double tmax = res->wall_s > 0 ? res->wall_s : 1.0;
    double smax = o->steps > 0 ? (double)o->steps : 1.0;
    double x0 = SIM_TL_L, x1 = SIM_TL_W - SIM_TL_R;
#define TX(t) (x0 + (x1 - x0) * (t) / tmax)
#define SY(s) (SIM_TL_TOP_Y1 - (SIM_TL_TOP_Y1 - SIM_TL_TOP_Y0) * (double)(s) / smax)
    fprintf(f, "<svg xmlns='http://www.w3.org/2000/svg' width='%.0f' height='%.0f' "
               "font-family='sans-serif' font-size='12'>\n",
            SIM_TL_W, SIM_TL_H);
    fprintf(f, "<rect width='100%%' height='100%%' fill='white'/>\n");
    fprintf(f, "<text x='%.1f' y='22' font-size='15'>graft-sim run: %d groups x %d ranks, "
               "%zu failures, verdict %s</text>\n",
            x0, o->groups, o->ranks, res->n_injected, verdict);
    fprintf(f, "<rect x='%.1f' y='%.1f' width='%.1f' height='%.1f' fill='none' stroke='#333'/>\n",
            x0, SIM_TL_TOP_Y0, x1 - x0, SIM_TL_TOP_Y1 - SIM_TL_TOP_Y0);
    for (int i = 0; i <= 4; i++) {
        double s = smax * i / 4, t = tmax * i / 4;
        fprintf(f, "<text x='%.1f' y='%.1f' text-anchor='end'>%.0f</text>\n", x0 - 6,
                SY(s) + 4, s);
        fprintf(f, "<text x='%.1f' y='%.1f' text-anchor='middle'>%.0fs</text>\n", TX(t),
                SIM_TL_TOP_Y1 + 16, t);
    }
    fprintf(f, "<text x='18' y='%.1f' transform='rotate(-90 18 %.1f)' "
               "text-anchor='middle'>committed step</text>\n",
            (SIM_TL_TOP_Y0 + SIM_TL_TOP_Y1) / 2, (SIM_TL_TOP_Y0 + SIM_TL_TOP_Y1) / 2);
    /* Recovery bands under the line. */
    for (size_t i = 0; i < res->n_recoveries; i++) {
        const graft_sim_recovery_t *rc = &res->recoveries[i];
        double end = rc->t_healed >= 0 ? rc->t_healed : tmax;
        fprintf(f, "<rect x='%.1f' y='%.1f' width='%.1f' height='%.1f' fill='%s' "
                   "fill-opacity='0.12'/>\n",
                TX(rc->t_fail), SIM_TL_TOP_Y0, TX(end) - TX(rc->t_fail) + 0.5,
                SIM_TL_TOP_Y1 - SIM_TL_TOP_Y0, sim_tl_colors[rc->kind]);
    }
    fprintf(f, "<polyline fill='none' stroke='#1f77b4' stroke-width='1.5' points='");
    for (size_t i = 0; i < res->n_samples; i++) {
        const graft_sim_sample_t *s = &res->samples[i];
        fprintf(f, "%.1f,%.1f ", TX(s->t), SY(s->step < 0 ? 0 : s->step));
    }
    fprintf(f, "'/>\n");
    for (size_t i = 0; i < res->n_injected; i++) {
        const graft_sim_injected_t *in = &res->injected[i];
        fprintf(f, "<line x1='%.1f' y1='%.1f' x2='%.1f' y2='%.1f' stroke='%s'/>\n", TX(in->t),
                SIM_TL_TOP_Y0, TX(in->t), SIM_TL_TOP_Y0 + 12, sim_tl_colors[in->ev.kind]);
    }
    for (int k = 0; k < GRAFT_SIM_KIND_COUNT; k++) {
        double y = SIM_TL_TOP_Y0 + 10 + 18 * k;
        fprintf(f, "<rect x='%.1f' y='%.1f' width='12' height='12' fill='%s'/>"
                   "<text x='%.1f' y='%.1f'>%s</text>\n",
                x1 + 14, y - 10, sim_tl_colors[k], x1 + 32, y, graft_sim_kind_name(k));
    }
    /* Recovery-time histogram. */
    double vmax = 0;
    size_t n = 0;
    for (size_t i = 0; i < res->n_recoveries; i++) {
        const graft_sim_recovery_t *rc = &res->recoveries[i];
        if (rc->done && rc->t_healed >= rc->t_fail) {
            vmax = fmax(vmax, rc->t_healed - rc->t_fail);
            n++;
        }
    }
    double width = vmax > 0 ? vmax * 1.0001 / SIM_TL_BINS : 1.0;
    int bins[SIM_TL_BINS] = {0}, bmax = 1;
    for (size_t i = 0; i < res->n_recoveries; i++) {
        const graft_sim_recovery_t *rc = &res->recoveries[i];
        if (rc->done && rc->t_healed >= rc->t_fail) {
            int b = (int)((rc->t_healed - rc->t_fail) / width);
            b = b >= SIM_TL_BINS ? SIM_TL_BINS - 1 : b;
            if (++bins[b] > bmax) {
                bmax = bins[b];
            }
        }
    }
    fprintf(f, "<rect x='%.1f' y='%.1f' width='%.1f' height='%.1f' fill='none' stroke='#333'/>\n",
            x0, SIM_TL_BOT_Y0, x1 - x0, SIM_TL_BOT_Y1 - SIM_TL_BOT_Y0);
    double bw = (x1 - x0) / SIM_TL_BINS;
    for (int b = 0; b < SIM_TL_BINS; b++) {
        double h = (SIM_TL_BOT_Y1 - SIM_TL_BOT_Y0) * bins[b] / bmax;
        fprintf(f, "<rect x='%.1f' y='%.1f' width='%.1f' height='%.1f' fill='#1f77b4'/>\n",
                x0 + b * bw + 1, SIM_TL_BOT_Y1 - h, bw - 2, h);
    }
    for (int i = 0; i <= 4; i++) {
        fprintf(f, "<text x='%.1f' y='%.1f' text-anchor='middle'>%.2fs</text>\n",
                x0 + (x1 - x0) * i / 4, SIM_TL_BOT_Y1 + 16, width * SIM_TL_BINS * i / 4);
    }
    fprintf(f, "<text x='%.1f' y='%.1f'>recovery time, failure to healed (%zu recoveries, "
               "max %d per bin)</text>\n",
            x0, SIM_TL_BOT_Y0 - 8, n, bmax);
    fprintf(f, "</svg>\n");
#undef TX
#undef SY
    if (fclose(f) != 0) {
        return -1;
    }
    return 0;
}
