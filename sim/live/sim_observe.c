/*
 * The live engine's observer (sim_live.c runs it every tick): what the
 * run's state is, and the recoveries timed from it.
 *
 * How the step of the job is known: from the trainers' --hash-log files
 * (one "step hash" line per applied commit): the runtime publishes a
 * member's committed step in etcd only when it turns healthy, so etcd alone
 * cannot say "the job is at step s". etcd gives what it holds reliably: the
 * member records in an observer's watch-driven view (which incarnation of
 * each rank is live), the latest quorum, and the job's event history (the
 * runtime's recovery_done events: bytes pulled, donors lost). Recoveries
 * are timed from both: a failed rank is detected when its incarnation's
 * record is gone, has rejoined when a new incarnation's record appears, and
 * is healed when it has logged a commit since. After the run the hash logs
 * also give steps_committed, steps_lost and the disasters' steps
 * (sim_verdict.c).
 */
#include "sim_live_int.h"

#include <graft/membership.h>

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* --------------------------------------------------------- observing --- */

/* A spare took slot (m->group, m->rank): said as an injection is. */
static void sim_note_promotion(graft_sim_run_t *r, const graft_member_t *m)
{
    if (!r->tty) {
        printf("graft-sim: t=%.2fs step %lld: spare pid %d promoted into group %u rank %u "
               "(incarnation %" PRIu64 ")\n",
               graft_sim_run_elapsed(r), r->job_step, (int)m->pid, m->group, m->rank,
               m->incarnation);
        fflush(stdout);
    }
}

void graft_sim_observe(graft_sim_run_t *r)
{
    graft_membership_view_t *v = NULL;
    if (graft_membership_view_get(r->obs, &v) != GRAFT_OK) {
        return;
    }
    for (int i = 0; i < r->nslots; i++) {
        r->slots[i].present = 0;
    }
    long long top = -1;
    for (size_t i = 0; i < v->n_members; i++) {
        const graft_member_t *m = &v->members[i];
        if ((int)m->group >= r->o->groups || (int)m->rank >= r->o->ranks) {
            continue;
        }
        graft_sim_slot_t *s = &r->slots[(int)m->group * r->o->ranks + (int)m->rank];
        /* A spare that promoted itself into this slot wrote its pid into
         * the record: from now on the slot's process is that spare. */
        if (r->o->spares > 0 &&
            graft_sim_sup_adopt(r->sup, (int)m->group, (int)m->rank, (pid_t)m->pid)) {
            sim_note_promotion(r, m);
        }
        s->present = 1;
        s->incarnation = m->incarnation;
        if ((long long)m->committed_step > top) {
            top = (long long)m->committed_step;
        }
    }
    (void)top;
    r->healthy = (int)v->n_healthy_groups;
    graft_membership_view_free(v);
    graft_quorum_t *q = NULL;
    if (graft_membership_quorum_latest(r->obs, &q) == GRAFT_OK) {
        graft_membership_quorum_free(r->quorum);
        r->quorum = q;
        r->quorum_id = q->id;
    }
    /* Steps come from the trainers' --hash-log files (one "step hash" line
     * per applied commit): the runtime publishes a member's committed step
     * in etcd only when it turns healthy, so etcd alone cannot say "the
     * job is at step s". The job's step is the highest step any rank has
     * committed since the last restore. */
    long long job = -1;
    for (int i = 0; i < r->nslots; i++) {
        graft_sim_slot_t *s = &r->slots[i];
        FILE *f = fopen(graft_sim_sup_commits_path(r->sup, i / r->o->ranks, i % r->o->ranks),
                        "r");
        if (f != NULL && fseek(f, s->off, SEEK_SET) == 0) {
            char line[256];
            while (fgets(line, sizeof(line), f) != NULL) {
                long long st = -1;
                if (strchr(line, '\n') == NULL) {
                    break; /* being written: read it whole next time */
                }
                s->off += (long)strlen(line);
                if (sscanf(line, "%lld", &st) == 1 && st >= 0) {
                    s->step = st;
                    s->commits++;
                }
            }
        }
        if (f != NULL) {
            fclose(f);
        }
        if (s->step > job) {
            job = s->step;
        }
    }
    if (job >= 0) {
        r->job_step = job;
    }
    graft_sim_result_t *res = r->res;
    if (graft_sim_grow((void **)&res->samples, &res->cap_samples, res->n_samples,
                       sizeof(*res->samples)) == 0) {
        graft_sim_sample_t *smp = &res->samples[res->n_samples++];
        smp->t = graft_sim_run_elapsed(r);
        smp->step = r->job_step;
        smp->healthy = r->healthy;
        smp->quorum_id = r->quorum_id;
    }
}

/*
 * Did a kill_donor (or a cut_donor) land during the pull? The recipient's
 * heal says: the runtime's detail of a heal names each donor the pull
 * dropped ("; donor group G lost (why) after C chunks, K reassigned"). The
 * heal of the rank the killed (or cut) donor served, at the step it served,
 * that lost that donor with chunks read from it or in flight (C + K > 0)
 * was hit mid-pull.
 */
static void sim_match_donor_loss(graft_sim_run_t *r, const graft_event_t *e)
{
    for (size_t i = 0; i < r->res->n_injected; i++) {
        graft_sim_injected_t *in = &r->res->injected[i];
        if ((in->ev.kind != GRAFT_SIM_KILL_DONOR && in->ev.kind != GRAFT_SIM_CUT_DONOR) ||
            in->donor_step < 0 || in->donor_heal_ok >= 0 || (int)e->group != in->ev.group ||
            (int)e->rank != in->donor_rank || (long long)e->step != in->donor_step) {
            continue;
        }
        char needle[64];
        snprintf(needle, sizeof(needle), "; donor group %d lost (", in->donor_group);
        const char *lost = strstr(e->detail, needle);
        const char *after = lost != NULL ? strstr(lost, ") after ") : NULL;
        unsigned long long chunks = 0, reassigned = 0;
        in->donor_heal_ok = e->ok ? 1 : 0;
        in->donor_mid_serve =
            after != NULL &&
            sscanf(after, ") after %llu chunks, %llu reassigned", &chunks, &reassigned) == 2 &&
            chunks + reassigned > 0;
        return;
    }
}

/* The spares registered in etcd (spares/), looked at with the events
 * until a rank committed the last step: the groups then close the job,
 * and a spare that sees every group finished leaves (its record goes)
 * before any process exits. The last look is the run's count. */
static void sim_observe_spares(graft_sim_run_t *r)
{
    graft_sim_spare_stats_t ss;
    graft_sim_sup_spare_stats(r->sup, &ss);
    if (r->o->spares == 0 || r->job_step >= r->o->steps || graft_sim_sup_done(r->sup) > 0 ||
        ss.unused > 0) {
        return;
    }
    graft_member_t *sp = NULL;
    size_t n = 0;
    if (graft_membership_spares_list(r->obs, &sp, &n) != GRAFT_OK) {
        return;
    }
    graft_membership_spares_free(sp, n);
    r->res->spares_registered = (long)n;
    r->res->spares_registered_t = graft_sim_run_elapsed(r);
}

/* The runtime records every heal in the job's event history with its
 * bytes ("N donors, B bytes: success"); read it incrementally, because
 * the history keeps only the newest events. */
void graft_sim_observe_events(graft_sim_run_t *r, int force)
{
    uint64_t now = graft_sim_now_ns();
    if (!force && now - r->last_events_ns < 500000000ull) {
        return;
    }
    /* While the cluster has no leader after an etcd_leader_kill a read can
     * only time out, holding up the loop that samples the job's step (and
     * so overstating the stall): wait until another member leads. */
    if (!force && r->lk_inj != SIZE_MAX && r->res->injected[r->lk_inj].etcd_elected_t < 0) {
        return;
    }
    r->last_events_ns = now;
    graft_event_t *evs = NULL;
    size_t n = 0;
    if (graft_membership_events_read(r->obs, r->event_seq, &evs, &n) != GRAFT_OK) {
        return;
    }
    for (size_t i = 0; i < n; i++) {
        if (evs[i].seq > r->event_seq) {
            r->event_seq = evs[i].seq;
        }
        unsigned long long donors = 0, bytes = 0;
        if (evs[i].kind == GRAFT_EVENT_RECOVERY_DONE && evs[i].ok && evs[i].detail != NULL &&
            sscanf(evs[i].detail, "%llu donors, %llu bytes", &donors, &bytes) == 2) {
            r->res->bytes_transferred += bytes;
            r->res->heals_reported++;
        }
        if (evs[i].kind == GRAFT_EVENT_RECOVERY_DONE && evs[i].detail != NULL) {
            sim_match_donor_loss(r, &evs[i]);
        }
    }
    graft_membership_events_free(evs, n);
    sim_observe_spares(r);
}

/* -------------------------------------------------------- recoveries --- */

void graft_sim_recovery_open(graft_sim_run_t *r, graft_sim_kind_t kind, const char *role, int group,
                             int rank)
{
    graft_sim_result_t *res = r->res;
    if (graft_sim_grow((void **)&res->recoveries, &res->cap_recoveries, res->n_recoveries,
                       sizeof(*res->recoveries)) != 0 ||
        graft_sim_grow((void **)&r->open, &r->cap_open, r->n_open, sizeof(*r->open)) != 0) {
        return;
    }
    graft_sim_recovery_t *rec = &res->recoveries[res->n_recoveries];
    memset(rec, 0, sizeof(*rec));
    rec->kind = kind;
    rec->role = role;
    rec->group = group;
    rec->rank = rank;
    rec->t_fail = graft_sim_run_elapsed(r);
    rec->t_detect = rec->t_restart = rec->t_rejoin = rec->t_healed = -1.0;
    rec->step_at_fail = r->job_step;
    rec->restored_step = -1;
    rec->corrupted_step = -1;
    rec->checkpoint_step = -1;
    graft_sim_open_t *op = &r->open[r->n_open];
    memset(op, 0, sizeof(*op));
    op->rec = res->n_recoveries;
    size_t cap = (size_t)r->nslots;
    op->slots = calloc(cap, sizeof(int));
    op->inc0 = calloc(cap, sizeof(uint64_t));
    op->starts0 = calloc(cap, sizeof(int));
    op->promotions0 = calloc(cap, sizeof(int));
    op->commits0 = calloc(cap, sizeof(uint64_t));
    if (op->slots == NULL || op->inc0 == NULL || op->starts0 == NULL ||
        op->promotions0 == NULL || op->commits0 == NULL) {
        free(op->slots);
        free(op->inc0);
        free(op->starts0);
        free(op->promotions0);
        free(op->commits0);
        return;
    }
    for (int i = 0; i < r->nslots; i++) {
        int g = i / r->o->ranks, k = i % r->o->ranks;
        if ((group >= 0 && g != group) || (rank >= 0 && k != rank)) {
            continue;
        }
        op->slots[op->n] = i;
        op->inc0[op->n] = r->slots[i].present ? r->slots[i].incarnation : 0;
        op->starts0[op->n] = graft_sim_sup_starts(r->sup, g, k);
        op->promotions0[op->n] = graft_sim_sup_promotions(r->sup, g, k);
        op->n++;
    }
    if (role != NULL && strcmp(role, "etcd") == 0) {
        /* Nothing restarts: healed once a quorum forms again after etcd
         * is back (the rejoin is set when it restarts). */
        op->n = 0;
        rec->t_detect = rec->t_fail;
    }
    res->n_recoveries++;
    r->n_open++;
}

void graft_sim_recovery_close(graft_sim_run_t *r, size_t i)
{
    free(r->open[i].slots);
    free(r->open[i].inc0);
    free(r->open[i].starts0);
    free(r->open[i].promotions0);
    free(r->open[i].commits0);
    r->open[i] = r->open[--r->n_open];
}

/* How the slots of open recovery op got their processes back since it
 * opened: taken by a spare that was waiting when the failure came
 * (promoted), or by a process started after it (spawned): one started for
 * the slot, or a spare started after the failure, the spawn the recovery
 * waited for when every spare was in use. */
static void sim_recovery_replaced(graft_sim_run_t *r, const graft_sim_open_t *op,
                                  graft_sim_recovery_t *rec)
{
    uint64_t failed_ns = r->t0 + (uint64_t)(rec->t_fail * 1e9);
    rec->promoted_slots = rec->spawned_slots = 0;
    for (size_t k = 0; k < op->n; k++) {
        int g = op->slots[k] / r->o->ranks, rk = op->slots[k] % r->o->ranks;
        int promoted = graft_sim_sup_promotions(r->sup, g, rk) - op->promotions0[k];
        int started = graft_sim_sup_starts(r->sup, g, rk) - op->starts0[k];
        bool waiting = promoted > 0 && graft_sim_sup_holder_spawned_ns(r->sup, g, rk) <= failed_ns;
        rec->promoted_slots += waiting;
        rec->spawned_slots += !waiting && started > 0;
    }
}

/*
 * A recovery is detected when no failed slot's old incarnation is in the
 * view, restarted when every slot has a new process (started by the
 * supervisor, or a spare that took it), rejoined when every slot has a
 * record of a new incarnation, and healed when each of them has applied a
 * commit since (see below).
 */
void graft_sim_recovery_track(graft_sim_run_t *r)
{
    double now = graft_sim_run_elapsed(r);
    uint64_t total = 0;
    for (int i = 0; i < r->nslots; i++) {
        total += r->slots[i].commits;
    }
    for (size_t i = 0; i < r->n_open;) {
        graft_sim_open_t *op = &r->open[i];
        graft_sim_recovery_t *rec = &r->res->recoveries[op->rec];
        int gone = 1, restarted = 1, back = 1, committed = 1, promoted = 0;
        for (size_t k = 0; k < op->n; k++) {
            const graft_sim_slot_t *s = &r->slots[op->slots[k]];
            int g = op->slots[k] / r->o->ranks, rk = op->slots[k] % r->o->ranks;
            int same = s->present && s->incarnation == op->inc0[k];
            gone &= !same;
            restarted &= graft_sim_sup_starts(r->sup, g, rk) > op->starts0[k];
            promoted |= graft_sim_sup_promotions(r->sup, g, rk) > op->promotions0[k];
            back &= s->present && !same;
            committed &= s->commits > op->commits0[k];
        }
        if (rec->t_detect < 0 && gone) {
            rec->t_detect = now;
        }
        /* A hang ends at SIGCONT, a partition when its link is back; unless
         * a spare took the slot meanwhile (the hung process was fenced). */
        int timed = (rec->kind == GRAFT_SIM_HANG || rec->kind == GRAFT_SIM_PARTITION) && !promoted;
        if (rec->t_restart < 0 && restarted && op->n > 0 && !timed) {
            rec->t_restart = now;
        }
        int just_back = 0;
        if (rec->t_rejoin < 0 && op->n > 0 && back && rec->t_detect >= 0 &&
            rec->t_restart >= 0) {
            rec->t_rejoin = now;
            for (size_t k = 0; k < op->n; k++) {
                op->commits0[k] = r->slots[op->slots[k]].commits;
            }
            just_back = 1;
        }
        /* Healed: every failed rank applied a commit after it was back,
         * which needs its state installed (or, for etcd, any commit after
         * etcd came back). `committed` above compared with the counts
         * before they were taken at the rejoin, so not in the same tick:
         * it would count the killed incarnation's commits and make every
         * heal phase 0. */
        int healed = rec->t_rejoin >= 0 && !just_back &&
                     (op->n > 0 ? committed : total > op->total0);
        if (timed && rec->t_detect < 0 && rec->t_restart >= 0 && committed) {
            /* Resumed before anyone noticed (shorter than the lease): the
             * hang cost time but no recovery; no detect or rejoin phase. */
            healed = 1;
        }
        if (healed) {
            rec->t_healed = now;
            rec->done = 1;
            sim_recovery_replaced(r, op, rec);
            graft_sim_recovery_close(r, i);
            continue;
        }
        i++;
    }
}
