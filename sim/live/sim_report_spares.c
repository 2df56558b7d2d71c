/*
 * The report's part on replacements (sim_verdict.c calls it): per recovery,
 * whether its slots were taken by spares that promoted themselves
 * (--spares) or given processes the supervisor started, and the time from
 * the failure to the first commit of every replaced rank; in the summary,
 * the median of that time for each way, and what became of the spares.
 *
 * Only recoveries of kill_rank, kill_group, kill_donor and hang are
 * compared: a disaster's time is the whole job's restart from disk, and an
 * etcd failure replaces nothing.
 */
#include "sim_live_int.h"

#include <math.h>
#include <stdlib.h>

/* How a recovery's slots got their processes back. */
typedef enum sim_replaced {
    SIM_REPLACED_NONE = 0, /* nothing replaced (a hang resumed), or not healed */
    SIM_REPLACED_SPARE,    /* every slot by a spare */
    SIM_REPLACED_SPAWN,    /* every slot by a process started for it */
    SIM_REPLACED_BOTH
} sim_replaced_t;

static const char *const sim_replaced_names[] = {NULL, "spare", "spawn", "both"};

static sim_replaced_t sim_replaced(const graft_sim_recovery_t *rc)
{
    if (!rc->done) {
        return SIM_REPLACED_NONE;
    }
    if (rc->promoted_slots > 0) {
        return rc->spawned_slots > 0 ? SIM_REPLACED_BOTH : SIM_REPLACED_SPARE;
    }
    return rc->spawned_slots > 0 ? SIM_REPLACED_SPAWN : SIM_REPLACED_NONE;
}

/* Whether a recovery is one the summary compares (see the file's head). */
static int sim_compared(const graft_sim_recovery_t *rc)
{
    return rc->kind == GRAFT_SIM_KILL_RANK || rc->kind == GRAFT_SIM_KILL_GROUP ||
           rc->kind == GRAFT_SIM_KILL_DONOR || rc->kind == GRAFT_SIM_HANG;
}

/* The failure to every replaced rank's first commit, s; NAN unless healed. */
static double sim_to_commit(const graft_sim_recovery_t *rc)
{
    return rc->done && rc->t_healed >= rc->t_fail ? rc->t_healed - rc->t_fail : NAN;
}

void graft_sim_replacement_summary(const graft_sim_result_t *res,
                                   graft_sim_replacement_summary_t *s_p)
{
    double *spare = calloc(res->n_recoveries + 1, sizeof(double));
    double *spawn = calloc(res->n_recoveries + 1, sizeof(double));
    double *promote = calloc(res->n_recoveries + 1, sizeof(double));
    graft_sim_replacement_summary_t s = {0};
    for (size_t i = 0; spare != NULL && spawn != NULL && promote != NULL && i < res->n_recoveries;
         i++) {
        const graft_sim_recovery_t *rc = &res->recoveries[i];
        double t = sim_to_commit(rc);
        if (!sim_compared(rc) || isnan(t)) {
            continue;
        }
        switch (sim_replaced(rc)) {
        case SIM_REPLACED_SPARE:
            spare[s.n_promoted++] = t;
            if (rc->t_detect >= 0 && rc->t_rejoin >= rc->t_detect) {
                promote[s.n_promote++] = rc->t_rejoin - rc->t_detect;
            }
            break;
        case SIM_REPLACED_SPAWN:
            spawn[s.n_respawned++] = t;
            break;
        case SIM_REPLACED_BOTH:
            s.n_both++;
            break;
        default:
            break;
        }
    }
    graft_sim_median_max(spare, s.n_promoted, &s.promoted_median, &s.promoted_max);
    graft_sim_median_max(spawn, s.n_respawned, &s.respawned_median, &s.respawned_max);
    graft_sim_median_max(promote, s.n_promote, &s.promote_median, &s.promote_max);
    free(spare);
    free(spawn);
    free(promote);
    *s_p = s;
}

/* ------------------------------------------------------------- text --- */

static void sim_text_spares(FILE *out, const graft_sim_result_t *res)
{
    const graft_sim_spare_stats_t *ss = &res->spare_stats;
    int want = res->spares * res->ranks;
    fprintf(out, "spares             %d %sgroup%s (%d processes): %d promoted, %d started in all, "
            "%d dead processes' records evicted, %d hung ones fenced, %d died unpromoted\n",
            res->spares, res->follow ? "follow " : "", res->spares == 1 ? "" : "s", want,
            ss->promoted, ss->started,
            res->evicted, ss->fenced, ss->died);
    if (res->spares_registered < 0) {
        fprintf(out, "  registered       never seen in etcd\n");
        return;
    }
    const char *why = res->spares_registered >= want ? "every promoted spare replaced"
                      : ss->owed > 0 ? "replacements still in their spawn delay at the end"
                      : ss->waiting >= want - res->spares_registered
                          ? "the last replacements were starting"
                          : "short of spares";
    fprintf(out, "  registered       %ld of %d at t=%.1fs (%s)\n", res->spares_registered, want,
            res->spares_registered_t, why);
}

/* One line per recovery that replaced a process. */
static void sim_text_replaced(FILE *out, const graft_sim_result_t *res)
{
    for (size_t i = 0; i < res->n_recoveries; i++) {
        const graft_sim_recovery_t *rc = &res->recoveries[i];
        sim_replaced_t how = sim_replaced(rc);
        if (how == SIM_REPLACED_NONE) {
            continue;
        }
        fprintf(out, "  %-10s group %2d rank %2d at t=%6.2fs  by %-5s  to first commit %.3f s\n",
                graft_sim_kind_name(rc->kind), rc->group, rc->rank, rc->t_fail,
                sim_replaced_names[how], sim_to_commit(rc));
    }
}

void graft_sim_report_replacements_text(FILE *out, const graft_sim_result_t *res)
{
    graft_sim_replacement_summary_t s;
    graft_sim_replacement_summary(res, &s);
    fprintf(out, "spawn delay        %u ms\n", res->spawn_delay_ms);
    if (res->spares > 0) {
        sim_text_spares(out, res);
        sim_text_replaced(out, res);
    }
    fprintf(out, "fail -> first commit (kill_rank, kill_group, kill_donor, hang)\n");
    fprintf(out, "  promoted spare   median %.3f s, max %.3f s, n %zu\n", s.promoted_median,
            s.promoted_max, s.n_promoted);
    fprintf(out, "  respawned        median %.3f s, max %.3f s, n %zu (started after the "
                 "failure: for the slot, or a spare when none was free)\n", s.respawned_median,
            s.respawned_max, s.n_respawned);
    if (s.n_promote > 0) {
        fprintf(out, "  promotion        median %.3f s, max %.3f s (old record gone -> the "
                "spare's in the view)\n", s.promote_median, s.promote_max);
    }
}

/* ------------------------------------------------------------- JSON --- */

static json_t *sim_json_num(double x)
{
    return isnan(x) ? json_null() : json_real(round(x * 1e6) / 1e6);
}

void graft_sim_report_recovery_json(json_t *e, const graft_sim_recovery_t *rc)
{
    sim_replaced_t how = sim_replaced(rc);
    json_object_set_new(e, "promoted", json_boolean(rc->promoted_slots > 0));
    json_object_set_new(e, "replaced_by", how == SIM_REPLACED_NONE
                                              ? json_null()
                                              : json_string(sim_replaced_names[how]));
    json_object_set_new(e, "kill_to_first_commit_seconds", sim_json_num(sim_to_commit(rc)));
}

static json_t *sim_json_stat(double med, double max, size_t n)
{
    json_t *o = json_object();
    if (o != NULL) {
        json_object_set_new(o, "median", sim_json_num(med));
        json_object_set_new(o, "max", sim_json_num(max));
        json_object_set_new(o, "n", json_integer((json_int_t)n));
    }
    return o != NULL ? o : json_null();
}

static json_t *sim_json_spares(const graft_sim_result_t *res,
                               const graft_sim_replacement_summary_t *s)
{
    const graft_sim_spare_stats_t *ss = &res->spare_stats;
    json_t *o = json_object();
    if (o == NULL) {
        return json_null();
    }
    json_object_set_new(o, "groups", json_integer(res->spares));
    json_object_set_new(o, "processes", json_integer(res->spares * res->ranks));
    json_object_set_new(o, "follow", json_boolean(res->follow));
    json_object_set_new(o, "started", json_integer(ss->started));
    json_object_set_new(o, "promoted", json_integer(ss->promoted));
    json_object_set_new(o, "evicted", json_integer(res->evicted));
    json_object_set_new(o, "fenced", json_integer(ss->fenced));
    json_object_set_new(o, "died", json_integer(ss->died));
    json_object_set_new(o, "owed_at_end", json_integer(ss->owed));
    json_object_set_new(o, "registered_at_end", res->spares_registered >= 0
                                                    ? json_integer(res->spares_registered)
                                                    : json_null());
    json_object_set_new(o, "registered_t", res->spares_registered >= 0
                                               ? sim_json_num(res->spares_registered_t)
                                               : json_null());
    json_object_set_new(o, "promote_seconds",
                        sim_json_stat(s->promote_median, s->promote_max, s->n_promote));
    return o;
}

void graft_sim_report_replacements_json(json_t *j, const graft_sim_result_t *res)
{
    graft_sim_replacement_summary_t s;
    graft_sim_replacement_summary(res, &s);
    json_object_set_new(j, "spawn_delay_ms", json_integer(res->spawn_delay_ms));
    json_object_set_new(j, "spares", res->spares > 0 ? sim_json_spares(res, &s) : json_null());
    json_t *k = json_object();
    if (k != NULL) {
        json_object_set_new(k, "promoted",
                            sim_json_stat(s.promoted_median, s.promoted_max, s.n_promoted));
        json_object_set_new(k, "respawned",
                            sim_json_stat(s.respawned_median, s.respawned_max, s.n_respawned));
        json_object_set_new(k, "both", json_integer((json_int_t)s.n_both));
    }
    json_object_set_new(j, "kill_to_first_commit_seconds", k != NULL ? k : json_null());
}
