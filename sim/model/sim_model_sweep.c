/*
 * The sweep of `graft-sim model` (docs/SIM.md): every persistent checkpoint
 * interval of a log-spaced grid simulated (sim_model.c), the optimum
 * refined from the grid, and the closed forms it is compared with: Young's
 * and Daly's intervals and Daly's expected goodput.
 */
#include "sim_model.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* ------------------------------------------------------------------------ */
/* Closed forms                                                             */
/* ------------------------------------------------------------------------ */

double graft_sim_young_seconds(double c_seconds, double mtbf_seconds)
{
    return sqrt(2.0 * c_seconds * mtbf_seconds);
}

double graft_sim_daly_seconds(double c_seconds, double mtbf_seconds)
{
    if (isinf(mtbf_seconds)) {
        return INFINITY;
    }
    if (c_seconds >= 2.0 * mtbf_seconds) {
        return mtbf_seconds;
    }
    double x = c_seconds / (2.0 * mtbf_seconds);
    return sqrt(2.0 * c_seconds * mtbf_seconds) * (1.0 + sqrt(x) / 3.0 + x / 9.0) - c_seconds;
}

double graft_sim_daly_goodput(double t_seconds, double c_seconds, double r_seconds,
                              double mtbf_seconds)
{
    if (isinf(mtbf_seconds)) {
        return t_seconds / (t_seconds + c_seconds);
    }
    double m = mtbf_seconds;
    return t_seconds / (m * exp(r_seconds / m) * expm1((t_seconds + c_seconds) / m));
}

/* ------------------------------------------------------------------------ */
/* Sweep and optimum                                                        */
/* ------------------------------------------------------------------------ */

/* Mean time between failures that force a restart from disk. Peer-to-peer
 * strategies only need the disk for disasters (the rare case where every
 * group is down at once is left out of this closed form). */
static double sim_disk_mtbf(const graft_sim_params_t *p, graft_sim_strategy_t strategy)
{
    double m = graft_sim_job_mtbf_seconds(p);
    if (strategy == GRAFT_SIM_CHECKPOINT_RESTART || p->groups == 1) {
        return m;
    }
    return p->disaster_fraction > 0 ? m / p->disaster_fraction : INFINITY;
}

/*
 * The simulated goodput is noisy near its flat maximum, so the argmax of
 * the grid alone wanders. Fit a parabola in log(interval) through the best
 * point and its neighbours (least squares) and take its vertex when it is a
 * maximum inside that window.
 */
static double sim_refine(const double *x, const double *y, int n, int best)
{
    int lo = best - 3 < 0 ? 0 : best - 3;
    int hi = best + 3 >= n ? n - 1 : best + 3;
    if (hi - lo < 2) {
        return x[best];
    }
    /* Normal equations for y = a + b u + c u^2, u = log x - log x[best]. */
    double s[5] = {0}, t[3] = {0};
    double u0 = log(x[best]);
    for (int i = lo; i <= hi; i++) {
        double u = log(x[i]) - u0, pw = 1;
        for (int k = 0; k < 5; k++) {
            s[k] += pw;
            if (k < 3) {
                t[k] += pw * y[i];
            }
            pw *= u;
        }
    }
    double m[3][4] = {{s[0], s[1], s[2], t[0]}, {s[1], s[2], s[3], t[1]}, {s[2], s[3], s[4], t[2]}};
    for (int c = 0; c < 3; c++) {
        int piv = c;
        for (int rr = c + 1; rr < 3; rr++) {
            if (fabs(m[rr][c]) > fabs(m[piv][c])) {
                piv = rr;
            }
        }
        if (fabs(m[piv][c]) < 1e-300) {
            return x[best];
        }
        for (int k = 0; k < 4; k++) {
            double tmp = m[c][k];
            m[c][k] = m[piv][k];
            m[piv][k] = tmp;
        }
        for (int rr = 0; rr < 3; rr++) {
            if (rr != c) {
                double f = m[rr][c] / m[c][c];
                for (int k = c; k < 4; k++) {
                    m[rr][k] -= f * m[c][k];
                }
            }
        }
    }
    double b = m[1][3] / m[1][1], c2 = m[2][3] / m[2][2];
    if (!(c2 < 0)) {
        return x[best];
    }
    double u = -b / (2 * c2);
    double ulo = log(x[lo]) - u0, uhi = log(x[hi]) - u0;
    if (u < ulo || u > uhi) {
        return x[best];
    }
    return exp(u0 + u);
}

graft_status_t graft_sim_model_sweep(const graft_sim_params_t *params,
                                     graft_sim_strategy_t strategy, double lo_seconds,
                                     double hi_seconds, int npoints, uint64_t seed,
                                     graft_sim_result_t *grid, graft_sim_optimum_t *optimum_p)
{
    graft_status_t st = GRAFT_OK;
    double *x = NULL, *y = NULL;
    graft_sim_optimum_t opt;

    if (params == NULL || grid == NULL || optimum_p == NULL || npoints < 2 ||
        !(lo_seconds > 0) || !(hi_seconds > lo_seconds) || isinf(hi_seconds)) {
        st = GRAFT_EINVAL;
        goto out;
    }
    x = calloc((size_t)npoints, sizeof(*x));
    y = calloc((size_t)npoints, sizeof(*y));
    if (x == NULL || y == NULL) {
        st = GRAFT_ENOMEM;
        goto out;
    }
    memset(&opt, 0, sizeof(opt));
    opt.strategy = strategy;
    int best = 0;
    for (int i = 0; i < npoints; i++) {
        x[i] = lo_seconds * pow(hi_seconds / lo_seconds, (double)i / (npoints - 1));
        st = graft_sim_model_simulate(params, strategy, x[i], seed, &grid[i]);
        if (st != GRAFT_OK) {
            goto out;
        }
        y[i] = grid[i].goodput;
        if (y[i] > y[best]) {
            best = i;
        }
    }
    opt.best = grid[best];
    opt.at_sweep_bound = best == 0 || best == npoints - 1;
    opt.best_interval_seconds = opt.at_sweep_bound ? x[best] : sim_refine(x, y, npoints, best);
    opt.disk_mtbf_seconds = sim_disk_mtbf(params, strategy);
    opt.young_seconds =
        graft_sim_young_seconds(graft_sim_checkpoint_cost(params), opt.disk_mtbf_seconds);
    opt.daly_seconds =
        graft_sim_daly_seconds(graft_sim_checkpoint_cost(params), opt.disk_mtbf_seconds);
    if (isfinite(opt.young_seconds) && opt.young_seconds > 0) {
        st = graft_sim_model_simulate(params, strategy, opt.young_seconds, seed, &opt.at_young);
        if (st != GRAFT_OK) {
            goto out;
        }
    }
    *optimum_p = opt;
out:
    free(y);
    free(x);
    return st;
}
