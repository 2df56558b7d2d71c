/*
 * What an etcd_leader_kill cost the job, measured from the run's progress
 * samples alone (pure functions over a graft_sim_result_t, tested without
 * etcd).
 *
 * The job's step is sampled every engine tick (20 ms) from the trainers'
 * hash logs. A kill's stall is the longest stretch in which that step
 * stood still, among the stretches that end after the kill and begin
 * before the kill's window closes (GRAFT_SIM_STALL_WINDOW_S later), a
 * stretch that began before the kill counted from the kill (what an
 * earlier failure had already cost is not this kill's). A
 * kill with another injected failure within the window on either side is
 * not isolated: a heal after a kill_rank stops the step too, so the
 * summary's stall figures come from isolated kills only.
 */
#include "sim_live_int.h"

#include <limits.h>
#include <math.h>
#include <stdlib.h>

static int sim_stall_cmp(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

void graft_sim_median_max(double *v, size_t n, double *med_p, double *max_p)
{
    *med_p = *max_p = NAN;
    if (n == 0) {
        return;
    }
    qsort(v, n, sizeof(double), sim_stall_cmp);
    *med_p = n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
    *max_p = v[n - 1];
}

/*
 * Calls fn(t_from, t_to, arg) for each stretch between the samples at
 * which the job's step changed; the last stretch stays open until the last
 * sample.
 */
static void sim_stall_stretches(const graft_sim_result_t *res,
                                void (*fn)(double from, double to, void *arg), void *arg)
{
    double since = -1;
    long long prev = LLONG_MIN;
    for (size_t i = 0; i < res->n_samples; i++) {
        const graft_sim_sample_t *smp = &res->samples[i];
        if (smp->step != prev || i + 1 == res->n_samples) {
            if (since >= 0) {
                fn(since, smp->t, arg);
            }
            since = smp->t;
            prev = smp->step;
        }
    }
}

typedef struct sim_stall_window {
    double t0, t1, longest;
} sim_stall_window_t;

static void sim_stall_longest(double from, double to, void *arg)
{
    sim_stall_window_t *w = arg;
    double len = to - fmax(from, w->t0);
    if (to > w->t0 && from < w->t1 && (isnan(w->longest) || len > w->longest)) {
        w->longest = len;
    }
}

int graft_sim_stall_isolated(const graft_sim_result_t *res, size_t i)
{
    double t = res->injected[i].t;
    for (size_t k = 0; k < res->n_injected; k++) {
        if (k != i && fabs(res->injected[k].t - t) < GRAFT_SIM_STALL_WINDOW_S) {
            return 0;
        }
    }
    return 1;
}

double graft_sim_stall_after(const graft_sim_result_t *res, double t_kill)
{
    sim_stall_window_t w = {t_kill, t_kill + GRAFT_SIM_STALL_WINDOW_S, NAN};
    sim_stall_stretches(res, sim_stall_longest, &w);
    return w.longest;
}

double graft_sim_stall_resolution(const graft_sim_result_t *res, double t_kill)
{
    double worst = NAN, t1 = t_kill + GRAFT_SIM_STALL_WINDOW_S;
    for (size_t i = 1; i < res->n_samples; i++) {
        double a = res->samples[i - 1].t, b = res->samples[i].t;
        if (b > t_kill && a < t1 && (isnan(worst) || b - a > worst)) {
            worst = b - a;
        }
    }
    return worst;
}

typedef struct sim_stall_all {
    double *v;
    size_t n, cap;
} sim_stall_all_t;

static void sim_stall_collect(double from, double to, void *arg)
{
    sim_stall_all_t *a = arg;
    if (a->n < a->cap) {
        a->v[a->n++] = to - from;
    }
}

void graft_sim_leader_summary(const graft_sim_result_t *res, graft_sim_leader_summary_t *s_p)
{
    graft_sim_leader_summary_t s = {0};
    double *stall = calloc(res->n_injected + 1, sizeof(double));
    double *elect = calloc(res->n_injected + 1, sizeof(double));
    sim_stall_all_t all = {calloc(res->n_samples + 1, sizeof(double)), 0, res->n_samples};
    s.stall_median = s.stall_max = s.elect_median = s.elect_max = s.step_gap_median = NAN;
    if (stall == NULL || elect == NULL || all.v == NULL) {
        goto out;
    }
    for (size_t i = 0; i < res->n_injected; i++) {
        const graft_sim_injected_t *in = &res->injected[i];
        if (in->ev.kind != GRAFT_SIM_ETCD_LEADER_KILL) {
            continue;
        }
        s.n++;
        double x = graft_sim_stall_after(res, in->t);
        if (graft_sim_stall_isolated(res, i) && !isnan(x)) {
            stall[s.n_isolated++] = x;
        }
        if (in->etcd_elected_t >= 0) {
            elect[s.n_elected++] = in->etcd_elected_t - in->t;
        }
    }
    graft_sim_median_max(stall, s.n_isolated, &s.stall_median, &s.stall_max);
    graft_sim_median_max(elect, s.n_elected, &s.elect_median, &s.elect_max);
    sim_stall_stretches(res, sim_stall_collect, &all);
    double unused;
    graft_sim_median_max(all.v, all.n, &s.step_gap_median, &unused);
out:
    free(stall);
    free(elect);
    free(all.v);
    *s_p = s;
}
