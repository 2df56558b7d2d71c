/*
 * The verdict of a live run and its report (text and JSON).
 *
 * strict:  every rank of every group ends with the same state hash as the
 *          same rank of the fault-free reference ("bit-exact").
 * elastic: every group ends identical, and every step that two groups both
 *          logged as committed in the same epoch (between disasters) has
 *          the same hash in both ("consistent").
 *
 * Per-commit hashes come from the trainers' --hash-log files ("step hash"
 * per applied commit, appended by every incarnation). After a disaster in
 * elastic mode a step may legitimately be recomputed by another set of
 * groups, so commits are compared within each epoch between disasters.
 */
#include "sim_live_int.h"

#include <ctype.h>
#include <inttypes.h>
#include <limits.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <xxhash.h>

/* One rank's hash log: its complete "step hash" lines, in order, with the
 * byte offset just past each. */
typedef struct sim_log {
    long long *step;
    char (*hash)[17];
    long *end;
    size_t n, cap;
} sim_log_t;

static int sim_log_hash_ok(const char *h)
{
    size_t n = strlen(h);
    for (size_t i = 0; i < n; i++) {
        if (!isxdigit((unsigned char)h[i])) {
            return 0;
        }
    }
    return n == 16;
}

static void sim_log_read(sim_log_t *lg, const char *path)
{
    memset(lg, 0, sizeof(*lg));
    FILE *f = fopen(path, "r");
    char line[256];
    long off = 0;
    while (f != NULL && fgets(line, sizeof(line), f) != NULL) {
        long long s = -1;
        char h[128];
        off += (long)strlen(line);
        /* A line cut short by a kill is not a commit record. */
        if (strchr(line, '\n') == NULL || sscanf(line, "%lld %127s", &s, h) != 2 || s < 0 ||
            s > 10000000 || !sim_log_hash_ok(h)) {
            continue;
        }
        if (lg->n == lg->cap) {
            size_t nc = lg->cap ? 2 * lg->cap : 256;
            long long *ns = realloc(lg->step, nc * sizeof(*ns));
            if (ns != NULL) {
                lg->step = ns;
            }
            char(*nh)[17] = realloc(lg->hash, nc * sizeof(*nh));
            if (nh != NULL) {
                lg->hash = nh;
            }
            long *ne = realloc(lg->end, nc * sizeof(*ne));
            if (ne != NULL) {
                lg->end = ne;
            }
            if (ns == NULL || nh == NULL || ne == NULL) {
                break;
            }
            lg->cap = nc;
        }
        lg->step[lg->n] = s;
        memcpy(lg->hash[lg->n], h, 17);
        lg->end[lg->n] = off;
        lg->n++;
    }
    if (f != NULL) {
        fclose(f);
    }
}

static void sim_log_free(sim_log_t *lg)
{
    free(lg->step);
    free(lg->hash);
    free(lg->end);
}

/*
 * What the logs say the job committed:
 *  - steps_committed: the highest step that every rank of some group
 *    logged (a group holds a whole copy of the state only with all its
 *    ranks), the most over groups;
 *  - steps_lost: commits logged at a step the same (group, rank) had
 *    already logged, i.e. recomputed after a rollback (a disaster, or a
 *    job-wide fallback to a checkpoint), the most of any (group, rank);
 *  - per disaster, from where each log ended when every rank was dead:
 *    step_at_fail, the highest step logged before it, and restored_step,
 *    the step before the first commit logged after it (and before the
 *    next disaster).
 */
static void sim_logs_measure(graft_sim_result_t *res, const sim_log_t *logs, int groups,
                             int ranks)
{
    int nslots = groups * ranks;
    res->steps_committed = 0;
    res->steps_lost = 0;
    for (int g = 0; g < groups; g++) {
        long long low = LLONG_MAX;
        for (int r = 0; r < ranks; r++) {
            const sim_log_t *lg = &logs[g * ranks + r];
            long long last = lg->n > 0 ? lg->step[lg->n - 1] : 0;
            low = last < low ? last : low;
        }
        if (low != LLONG_MAX && low > res->steps_committed) {
            res->steps_committed = low;
        }
    }
    for (int i = 0; i < nslots; i++) {
        const sim_log_t *lg = &logs[i];
        long long hi = -1, again = 0;
        for (size_t k = 0; k < lg->n; k++) {
            again += lg->step[k] <= hi;
            hi = lg->step[k] > hi ? lg->step[k] : hi;
        }
        res->steps_lost = again > res->steps_lost ? again : res->steps_lost;
    }
    size_t d = 0;
    for (size_t i = 0; i < res->n_recoveries && d < res->n_disasters; i++) {
        graft_sim_recovery_t *rc = &res->recoveries[i];
        if (!graft_sim_kind_is_disaster(rc->kind)) {
            continue;
        }
        const long *at = &res->disaster_offs[d * (size_t)nslots];
        const long *next = d + 1 < res->n_disasters ? at + nslots : NULL;
        long long before = -1, first = LLONG_MAX;
        for (int s = 0; s < nslots; s++) {
            const sim_log_t *lg = &logs[s];
            for (size_t k = 0; k < lg->n; k++) {
                if (lg->end[k] <= at[s]) {
                    before = lg->step[k] > before ? lg->step[k] : before;
                } else if (next == NULL || lg->end[k] <= next[s]) {
                    first = lg->step[k] < first ? lg->step[k] : first;
                    break;
                }
            }
        }
        rc->step_at_fail = before >= 0 ? before : 0;
        rc->restored_step = first != LLONG_MAX ? first - 1 : -1;
        d++;
    }
}

void graft_sim_verdict_scan_logs(graft_sim_result_t *res, const char *dir, int groups, int ranks,
                                 int elastic)
{
    int nslots = groups * ranks;
    sim_log_t *logs = calloc((size_t)nslots, sizeof(*logs));
    if (logs == NULL) {
        return;
    }
    for (int i = 0; i < nslots; i++) {
        char path[4096];
        snprintf(path, sizeof(path), "%s/commits-g%d-r%d.txt", dir, i / ranks, i % ranks);
        sim_log_read(&logs[i], path);
    }
    sim_logs_measure(res, logs, groups, ranks);
    /* First hash seen per (epoch, step, rank); every other group's (and
     * incarnation's) must match. The epochs are the stretches between
     * disasters: after one, every group restarts from a checkpoint and a
     * step may be recomputed by another set of groups (elastic), which
     * need not give the same bytes as the first time; within an epoch
     * every group that commits a step must hold the same state. A line
     * belongs to the epoch of the disasters its log had passed. */
    size_t epochs = res->n_disasters + 1;
    long long steps = 0;
    char **first = NULL;
    free(res->epoch_checks);
    res->epoch_checks = calloc(epochs, sizeof(*res->epoch_checks));
    res->n_epochs = res->epoch_checks != NULL ? epochs : 0;
    for (int i = 0; i < nslots && res->epoch_checks != NULL; i++) {
        const sim_log_t *lg = &logs[i];
        int r = i % ranks;
        size_t e = 0;
        for (size_t k = 0; k < lg->n; k++) {
            long long s = lg->step[k];
            while (e < res->n_disasters &&
                   lg->end[k] > res->disaster_offs[e * (size_t)nslots + (size_t)i]) {
                e++;
            }
            if (s >= steps) {
                long long ns = s + 1 > steps * 2 ? s + 1 : steps * 2;
                char **nf = realloc(first, (size_t)ns * epochs * (size_t)ranks * sizeof(*nf));
                if (nf == NULL) {
                    continue;
                }
                /* Re-lay the table out for the new step count. */
                for (size_t ep = epochs; ep-- > 0;) {
                    memmove(nf + ep * (size_t)(ns * ranks), nf + ep * (size_t)(steps * ranks),
                            (size_t)(steps * ranks) * sizeof(*nf));
                    memset(nf + ep * (size_t)(ns * ranks) + steps * ranks, 0,
                           (size_t)((ns - steps) * ranks) * sizeof(*nf));
                }
                first = nf;
                steps = ns;
            }
            char **slot = &first[e * (size_t)(steps * ranks) + (size_t)(s * ranks + r)];
            if (*slot == NULL) {
                *slot = lg->hash[k];
            } else {
                res->commit_checks++;
                res->epoch_checks[e]++;
                if (strcmp(*slot, lg->hash[k]) != 0) {
                    res->commit_mismatches++;
                }
            }
        }
    }
    free(first);
    for (int i = 0; i < nslots; i++) {
        sim_log_free(&logs[i]);
    }
    free(logs);
}

const char *graft_sim_verdict_judge(const graft_sim_live_opts_t *o, graft_sim_result_t *res,
                                    const char *reference_hash, const char **why_p)
{
    *why_p = NULL;
    int R = res->ranks, G = res->groups;
    /* The groups compared: all of them, except in elastic mode the groups
     * ended as stragglers (no hash at all). The first compared group is
     * the one whose hashes are reported. */
    int first = -1, compared = 0;
    res->groups_agree = res->rank_hashes != NULL;
    for (int g = 0; res->rank_hashes != NULL && g < G; g++) {
        int have = 0;
        for (int r = 0; r < R; r++) {
            const char *h = res->rank_hashes[g * R + r];
            have += h != NULL && h[0] != '\0';
        }
        if (have == 0 && o->mode == GRAFT_SIM_LIVE_ELASTIC && res->stragglers > 0) {
            continue;
        }
        if (first < 0) {
            first = g;
        }
        compared++;
        for (int r = 0; r < R; r++) {
            const char *h = res->rank_hashes[g * R + r];
            if (h == NULL || h[0] == '\0' || strcmp(h, res->rank_hashes[first * R + r]) != 0) {
                res->groups_agree = 0;
            }
        }
    }
    if (compared == 0) {
        res->groups_agree = 0;
        first = 0;
    }
    const char *const *base = res->rank_hashes != NULL ? (const char *const *)res->rank_hashes + first * R : NULL;
    free(res->final_hash);
    res->final_hash = NULL;
    if (base != NULL && base[0] != NULL && base[0][0]) {
        if (R == 1) {
            res->final_hash = strdup(base[0]);
        } else {
            XXH3_state_t *st = XXH3_createState();
            if (st != NULL) {
                XXH3_64bits_reset(st);
                for (int r = 0; r < R; r++) {
                    const char *h = base[r] ? base[r] : "";
                    XXH3_64bits_update(st, h, strlen(h) + 1);
                }
                char buf[32];
                snprintf(buf, sizeof(buf), "%016" PRIx64, (uint64_t)XXH3_64bits_digest(st));
                res->final_hash = strdup(buf);
                XXH3_freeState(st);
            }
        }
    }
    if (!res->completed) {
        *why_p = res->error ? res->error : "the run did not complete";
        return "FAILED";
    }
    if (res->final_hash == NULL) {
        *why_p = "no final state hash (the trainer wrote no --state-hash-out file)";
        return "FAILED";
    }
    if (!res->groups_agree) {
        *why_p = "the groups ended with different state";
        return "FAILED";
    }
    if (o->mode == GRAFT_SIM_LIVE_STRICT) {
        if (reference_hash != NULL && strcmp(reference_hash, res->final_hash) != 0) {
            *why_p = "the final state differs from the fault-free reference";
            return "FAILED";
        }
        return "bit-exact";
    }
    if (res->commit_mismatches > 0) {
        *why_p = "groups disagreed on a committed step";
        return "FAILED";
    }
    return "consistent";
}

/* ------------------------------------------------------------ report --- */

static const char *const sim_phases[] = {"detect", "restart", "rejoin", "heal", "total"};
#define SIM_NPHASES 5

/* Seconds of one phase of a recovery; NAN when not observed. */
static double sim_phase(const graft_sim_recovery_t *rc, int ph)
{
    double start, end;
    switch (ph) {
    case 0:
        start = rc->t_fail, end = rc->t_detect;
        break;
    case 1:
        start = rc->t_fail, end = rc->t_restart;
        break;
    case 2:
        start = rc->t_detect > rc->t_restart ? rc->t_detect : rc->t_restart, end = rc->t_rejoin;
        break;
    case 3:
        start = rc->t_rejoin, end = rc->t_healed;
        break;
    default:
        start = rc->t_fail, end = rc->t_healed;
        break;
    }
    return start >= 0 && end >= 0 && end >= start ? end - start : NAN;
}

/* Median and max of one phase over finished recoveries; n = count. */
static void sim_phase_stats(const graft_sim_result_t *res, int ph, double *med, double *max,
                            size_t *n)
{
    double *v = calloc(res->n_recoveries + 1, sizeof(double));
    size_t k = 0;
    for (size_t i = 0; v != NULL && i < res->n_recoveries; i++) {
        double x = sim_phase(&res->recoveries[i], ph);
        if (!isnan(x)) {
            v[k++] = x;
        }
    }
    *n = k;
    *med = *max = NAN;
    if (v != NULL) {
        graft_sim_median_max(v, k, med, max);
    }
    free(v);
}

void graft_sim_report_text(FILE *out, const graft_sim_live_opts_t *o,
                           const graft_sim_schedule_t *sched, const graft_sim_result_t *res,
                           const char *verdict, const char *why, const char *reference_hash,
                           const char *plot_path)
{
    size_t by_kind[GRAFT_SIM_KIND_COUNT] = {0};
    for (size_t i = 0; i < res->n_injected; i++) {
        by_kind[res->injected[i].ev.kind]++;
    }
    fprintf(out, "\n== graft-sim run report ==\n");
    fprintf(out, "groups x ranks     %d x %d, %lld steps, seed %" PRIu64 ", %s mode\n", o->groups,
            o->ranks, o->steps, o->seed, o->mode == GRAFT_SIM_LIVE_STRICT ? "strict" : "elastic");
    fprintf(out, "wall time          %.1f s\n", res->wall_s);
    fprintf(out, "failures injected  %zu of %zu planned (%zu not reached)\n", res->n_injected,
            sched->n_events, res->n_skipped);
    for (int k = 0; k < GRAFT_SIM_KIND_COUNT; k++) {
        if (by_kind[k] > 0) {
            fprintf(out, "  %-16s %zu\n", graft_sim_kind_name((graft_sim_kind_t)k), by_kind[k]);
        }
    }
    size_t done = 0;
    for (size_t i = 0; i < res->n_recoveries; i++) {
        done += res->recoveries[i].done != 0;
    }
    fprintf(out, "recoveries         %zu observed, %zu healed\n", res->n_recoveries, done);
    fprintf(out, "  phase     median s    max s   n\n");
    for (int ph = 0; ph < SIM_NPHASES; ph++) {
        double med, max;
        size_t n;
        sim_phase_stats(res, ph, &med, &max, &n);
        if (n > 0) {
            fprintf(out, "  %-8s %8.3f %8.3f %4zu\n", sim_phases[ph], med, max, n);
        }
    }
    fprintf(out, "bytes transferred  %llu\n", res->bytes_transferred);
    for (int cut = 0; cut <= 1; cut++) {
        graft_sim_kind_t kind = cut ? GRAFT_SIM_CUT_DONOR : GRAFT_SIM_KILL_DONOR;
        size_t serving = 0, mid = 0;
        if (by_kind[kind] == 0) {
            continue;
        }
        for (size_t i = 0; i < res->n_injected; i++) {
            const graft_sim_injected_t *in = &res->injected[i];
            serving += in->ev.kind == kind && in->donor_serving;
            mid += in->ev.kind == kind && in->donor_mid_serve;
        }
        fprintf(out, "donors %-11s %zu of %zu while serving, %zu of them mid-pull "
                "(ballast %d MiB)\n", cut ? "cut off" : "killed", serving, by_kind[kind], mid,
                res->ballast_mib);
    }
    if (by_kind[GRAFT_SIM_ETCD_LEADER_KILL] > 0) {
        graft_sim_leader_summary_t ls;
        graft_sim_leader_summary(res, &ls);
        fprintf(out, "etcd leader kills  %zu; stall (longest stretch without a commit within "
                "%.0f s of a kill) median %.3f s, max %.3f s over the %zu isolated ones; "
                "another member led %.3f s after the kill (median; max %.3f s, %zu seen); "
                "a step takes %.3f s (median)\n",
                ls.n, GRAFT_SIM_STALL_WINDOW_S, ls.stall_median, ls.stall_max, ls.n_isolated,
                ls.elect_median, ls.elect_max, ls.n_elected, ls.step_gap_median);
    }
    graft_sim_report_replacements_text(out, res);
    fprintf(out, "steps committed    %lld (lost and recomputed after rollbacks: %lld)\n",
            res->steps_committed, res->steps_lost);
    fprintf(out, "final state hash   %s\n", res->final_hash ? res->final_hash : "(none)");
    if (o->mode == GRAFT_SIM_LIVE_STRICT) {
        fprintf(out, "reference hash     %s\n", reference_hash ? reference_hash : "(none)");
    } else {
        fprintf(out, "commit checks      %lld (step, rank) pairs in %zu epoch%s, %lld mismatches\n",
                res->commit_checks, res->n_epochs, res->n_epochs == 1 ? "" : "s",
                res->commit_mismatches);
        if (res->stragglers > 0) {
            fprintf(out, "stragglers         %d ranks ended behind, after the others finished\n",
                    res->stragglers);
        }
    }
    if (plot_path != NULL) {
        fprintf(out, "plot               %s\n", plot_path);
    }
    fprintf(out, "verdict            %s%s%s\n", verdict, why ? ": " : "", why ? why : "");
}

static json_t *sim_num_or_null(double x)
{
    return isnan(x) ? json_null() : json_real(round(x * 1e6) / 1e6);
}

/* A kill_donor's or cut_donor's donor: who, when, and how its heal went. */
static void sim_json_donor(json_t *e, const graft_sim_injected_t *in)
{
    json_object_set_new(e, "donor_group",
                        in->donor_group >= 0 ? json_integer(in->donor_group) : json_null());
    json_object_set_new(e, "donor_rank",
                        in->donor_rank >= 0 ? json_integer(in->donor_rank) : json_null());
    json_object_set_new(e, "donor_t", sim_num_or_null(in->donor_t < 0 ? NAN : in->donor_t));
    json_object_set_new(e, "donor_serving_step",
                        in->donor_step >= 0 ? json_integer(in->donor_step) : json_null());
    json_object_set_new(e,
                        in->ev.kind == GRAFT_SIM_CUT_DONOR ? "donor_cut_serving"
                                                           : "donor_killed_serving",
                        json_boolean(in->donor_serving));
    json_object_set_new(e, "donor_mid_serve", json_boolean(in->donor_mid_serve));
    json_object_set_new(e, "donor_heal_ok", in->donor_heal_ok < 0
                                                ? json_null()
                                                : json_boolean(in->donor_heal_ok));
}

/* An etcd_leader_kill: the member, the election, the restart, the stall. */
static void sim_json_leader_kill(json_t *e, const graft_sim_result_t *res, size_t i)
{
    const graft_sim_injected_t *in = &res->injected[i];
    json_object_set_new(e, "etcd_member", json_integer(in->etcd_member));
    json_object_set_new(e, "etcd_new_leader", in->etcd_new_leader >= 0
                                                  ? json_integer(in->etcd_new_leader)
                                                  : json_null());
    json_object_set_new(e, "election_seconds",
                        sim_num_or_null(in->etcd_elected_t >= 0 ? in->etcd_elected_t - in->t
                                                                : NAN));
    json_object_set_new(e, "member_restarted_t",
                        sim_num_or_null(in->etcd_restart_t >= 0 ? in->etcd_restart_t : NAN));
    json_object_set_new(e, "stall_seconds", sim_num_or_null(graft_sim_stall_after(res, in->t)));
    json_object_set_new(e, "stall_resolution_seconds",
                        sim_num_or_null(graft_sim_stall_resolution(res, in->t)));
    json_object_set_new(e, "isolated", json_boolean(graft_sim_stall_isolated(res, i)));
}

/* The injected failures (inj), the count of each kind (kinds, every kind
 * listed), and how many kill_donors hit a serve mid-pull. -1 on ENOMEM. */
static int sim_json_injected(const graft_sim_result_t *res, json_t *kinds, json_t *inj,
                             json_int_t *mid_serve_p)
{
    for (int k = 0; k < GRAFT_SIM_KIND_COUNT; k++) {
        json_object_set_new(kinds, graft_sim_kind_name((graft_sim_kind_t)k), json_integer(0));
    }
    for (size_t i = 0; i < res->n_injected; i++) {
        const graft_sim_injected_t *in = &res->injected[i];
        const char *name = graft_sim_kind_name(in->ev.kind);
        json_object_set_new(kinds, name,
                            json_integer(json_integer_value(json_object_get(kinds, name)) + 1));
        json_t *e = graft_sim_event_json(&in->ev);
        if (e == NULL) {
            return -1;
        }
        json_object_set_new(e, "t", sim_num_or_null(in->t));
        json_object_set_new(e, "plan_index", json_integer((json_int_t)in->plan_index));
        if (in->ev.kind == GRAFT_SIM_KILL_DONOR || in->ev.kind == GRAFT_SIM_CUT_DONOR) {
            sim_json_donor(e, in);
            *mid_serve_p += in->ev.kind == GRAFT_SIM_KILL_DONOR && in->donor_mid_serve;
        }
        if (in->ev.kind == GRAFT_SIM_PARTITION || in->ev.kind == GRAFT_SIM_ISOLATE ||
            in->ev.kind == GRAFT_SIM_NETEM || in->ev.kind == GRAFT_SIM_THROTTLE ||
            in->ev.kind == GRAFT_SIM_CUT_DONOR) {
            json_object_set_new(e, "link_restored_t", sim_num_or_null(in->link_restored_t >= 0
                                                                          ? in->link_restored_t
                                                                          : NAN));
        }
        if (in->ev.kind == GRAFT_SIM_ETCD_LEADER_KILL) {
            sim_json_leader_kill(e, res, i);
        }
        json_array_append_new(inj, e);
    }
    return 0;
}

/* One recovery: what failed, when, from which step, and its phases. */
static json_t *sim_json_recovery(const graft_sim_recovery_t *rc)
{
    json_t *e = json_object();
    json_t *ps = json_object();
    if (e == NULL || ps == NULL) {
        json_decref(e);
        json_decref(ps);
        return NULL;
    }
    json_object_set_new(e, "kind", json_string(graft_sim_kind_name(rc->kind)));
    json_object_set_new(e, "role", json_string(rc->role));
    json_object_set_new(e, "group", rc->group >= 0 ? json_integer(rc->group) : json_null());
    json_object_set_new(e, "rank", rc->rank >= 0 ? json_integer(rc->rank) : json_null());
    json_object_set_new(e, "t_fail", sim_num_or_null(rc->t_fail));
    json_object_set_new(e, "step_at_fail", json_integer(rc->step_at_fail));
    if (rc->restored_step >= 0) {
        json_object_set_new(e, "restored_step", json_integer(rc->restored_step));
    }
    if (rc->corrupted_step >= 0) {
        json_object_set_new(e, "corrupted_step", json_integer(rc->corrupted_step));
    }
    if (graft_sim_kind_is_disaster(rc->kind)) {
        json_object_set_new(e, "checkpoint_step", rc->checkpoint_step >= 0
                                                      ? json_integer(rc->checkpoint_step)
                                                      : json_null());
    }
    json_object_set_new(e, "healed", json_boolean(rc->done));
    graft_sim_report_recovery_json(e, rc);
    for (int ph = 0; ph < SIM_NPHASES; ph++) {
        json_object_set_new(ps, sim_phases[ph], sim_num_or_null(sim_phase(rc, ph)));
    }
    json_object_set_new(e, "seconds", ps);
    return e;
}

/* The recoveries (recs) and each phase's median, max and count (phases).
 * -1 on ENOMEM. */
static int sim_json_recoveries(const graft_sim_result_t *res, json_t *recs, json_t *phases)
{
    for (size_t i = 0; i < res->n_recoveries; i++) {
        json_t *e = sim_json_recovery(&res->recoveries[i]);
        if (e == NULL) {
            return -1;
        }
        json_array_append_new(recs, e);
    }
    for (int ph = 0; ph < SIM_NPHASES; ph++) {
        double med, max;
        size_t n;
        sim_phase_stats(res, ph, &med, &max, &n);
        json_t *p = json_object();
        if (p == NULL) {
            return -1;
        }
        json_object_set_new(p, "median", sim_num_or_null(med));
        json_object_set_new(p, "max", sim_num_or_null(max));
        json_object_set_new(p, "n", json_integer((json_int_t)n));
        json_object_set_new(phases, sim_phases[ph], p);
    }
    return 0;
}

/* The etcd_leader_kills' summary (graft_sim_leader_summary()). */
static json_t *sim_json_leader_kills(const graft_sim_result_t *res)
{
    graft_sim_leader_summary_t ls;
    graft_sim_leader_summary(res, &ls);
    json_t *lk = json_pack("{s:I, s:I, s:{s:o, s:o}, s:I, s:{s:o, s:o}, s:o, s:f}", "n",
                           (json_int_t)ls.n, "n_isolated", (json_int_t)ls.n_isolated,
                           "stall_seconds", "median", sim_num_or_null(ls.stall_median), "max",
                           sim_num_or_null(ls.stall_max), "n_elected", (json_int_t)ls.n_elected,
                           "election_seconds", "median", sim_num_or_null(ls.elect_median), "max",
                           sim_num_or_null(ls.elect_max), "step_gap_median_seconds",
                           sim_num_or_null(ls.step_gap_median), "window_seconds",
                           GRAFT_SIM_STALL_WINDOW_S);
    return lk != NULL ? lk : json_null();
}

/* The report's end: the state hashes and the commit checks. */
static void sim_json_hashes(json_t *j, const graft_sim_result_t *res, const char *reference_hash,
                            json_t *hashes)
{
    for (int i = 0; res->rank_hashes != NULL && i < res->groups * res->ranks; i++) {
        json_array_append_new(hashes, json_string(res->rank_hashes[i] ? res->rank_hashes[i] : ""));
    }
    json_object_set_new(j, "final_state_hash",
                        res->final_hash ? json_string(res->final_hash) : json_null());
    json_object_set_new(j, "reference_state_hash",
                        reference_hash ? json_string(reference_hash) : json_null());
    json_object_set_new(j, "rank_state_hashes", hashes);
    json_object_set_new(j, "steps_committed", json_integer(res->steps_committed));
    json_object_set_new(j, "steps_lost", json_integer(res->steps_lost));
    json_object_set_new(j, "commit_checks", json_integer(res->commit_checks));
    json_t *by_epoch = json_array();
    for (size_t e = 0; by_epoch != NULL && e < res->n_epochs; e++) {
        json_array_append_new(by_epoch, json_integer(res->epoch_checks[e]));
    }
    json_object_set_new(j, "commit_checks_by_epoch", by_epoch != NULL ? by_epoch : json_null());
    json_object_set_new(j, "stragglers", json_integer(res->stragglers));
    json_object_set_new(j, "commit_mismatches", json_integer(res->commit_mismatches));
}

json_t *graft_sim_report_json(const graft_sim_live_opts_t *o, const graft_sim_schedule_t *sched,
                              const graft_sim_result_t *res, const char *verdict, const char *why,
                              const char *reference_hash)
{
    json_t *j = json_object();
    json_t *kinds = json_object();
    json_t *recs = json_array();
    json_t *inj = json_array();
    json_t *plan = graft_sim_schedule_json(sched);
    json_t *phases = json_object();
    json_t *hashes = json_array();
    char seed[32];
    json_int_t mid_serve = 0;
    if (j == NULL || kinds == NULL || recs == NULL || inj == NULL || plan == NULL ||
        phases == NULL || hashes == NULL) {
        goto fail;
    }
    if (sim_json_injected(res, kinds, inj, &mid_serve) != 0 ||
        sim_json_recoveries(res, recs, phases) != 0) {
        goto fail;
    }
    snprintf(seed, sizeof(seed), "%" PRIu64, o->seed);
    /* Names the producer, as graft's benchmarks do: graft-sim model
     * --bench-json reads the spares' promotion time from it. */
    json_object_set_new(j, "bench", json_string("graft-sim-run"));
    json_object_set_new(j, "verdict", json_string(verdict));
    json_object_set_new(j, "why", why ? json_string(why) : json_null());
    json_object_set_new(j, "mode", json_string(o->mode == GRAFT_SIM_LIVE_STRICT ? "strict"
                                                                                : "elastic"));
    json_object_set_new(j, "groups", json_integer(o->groups));
    json_object_set_new(j, "ranks", json_integer(o->ranks));
    json_object_set_new(j, "steps", json_integer(o->steps));
    json_object_set_new(j, "seed", json_string(seed));
    json_object_set_new(j, "wall_seconds", sim_num_or_null(res->wall_s));
    json_object_set_new(j, "failures_planned", json_integer((json_int_t)sched->n_events));
    json_object_set_new(j, "failures_not_reached", json_integer((json_int_t)res->n_skipped));
    json_object_set_new(j, "failures_injected", kinds);
    json_object_set_new(j, "failures_injected_total", json_integer((json_int_t)res->n_injected));
    json_object_set_new(j, "recoveries", recs);
    json_object_set_new(j, "recovery_seconds", phases);
    json_object_set_new(j, "bytes_transferred", json_integer((json_int_t)res->bytes_transferred));
    json_object_set_new(j, "kill_donor_mid_serve", json_integer(mid_serve));
    json_object_set_new(j, "ballast_mib", json_integer(res->ballast_mib));
    /* The embedded etcd's size; an external one's is not known here. */
    json_object_set_new(j, "etcd_members", o->etcd_url != NULL
                                               ? json_null()
                                               : json_integer(o->etcd_members > 1
                                                                  ? o->etcd_members
                                                                  : 1));
    json_object_set_new(j, "etcd_leader_kills", sim_json_leader_kills(res));
    graft_sim_report_replacements_json(j, res);
    sim_json_hashes(j, res, reference_hash, hashes);
    json_object_set_new(j, "plan", plan);
    json_object_set_new(j, "injected", inj);
    return j;
fail:
    json_decref(j);
    json_decref(kinds);
    json_decref(recs);
    json_decref(inj);
    json_decref(plan);
    json_decref(phases);
    json_decref(hashes);
    return NULL;
}
