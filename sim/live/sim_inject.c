/*
 * The live engine's injector (sim_live.c runs it every tick): fires the
 * planned failures at the trainers, the etcd members and the network
 * namespaces, once each one's preconditions hold, and ends those that take
 * time (a hang resumed, a link restored, etcd restarted, a donor killed or
 * cut off its recipient).
 */
#include "sim_live_int.h"

#include "etcd_launcher.h"

#include <assert.h>
#include <errno.h>
#include <limits.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define SIM_GAP_NS 50000000ull /* between two injections */
#define SIM_DONOR_WAIT_NS 8000000000ull

static int sim_alive(graft_sim_run_t *r, int g, int k)
{
    return graft_sim_sup_state(r->sup, g, k) == GRAFT_SIM_PROC_RUNNING;
}

static int sim_group_alive(graft_sim_run_t *r, int g)
{
    for (int k = 0; k < r->o->ranks; k++) {
        if (!sim_alive(r, g, k)) {
            return 0;
        }
    }
    return 1;
}

static void sim_kill(graft_sim_run_t *r, int g, int k)
{
    if (graft_sim_sup_signal(r->sup, g, k, SIGKILL) != GRAFT_OK) {
        /* it died on its own meanwhile: the supervisor restarts it anyway */
    }
}

/* Whether a group other than g is whole, running and not in an open
 * recovery (healing, hung, restoring after a disaster): a copy of every
 * rank's state that a failure in g leaves standing. Failures due at once
 * (a soak plans several per step) could otherwise take every copy and lose
 * the job by design, which is not what they are meant to show. */
static int sim_other_copy(graft_sim_run_t *r, int g)
{
    for (int h = 0; h < r->o->groups; h++) {
        if (h == g || !sim_group_alive(r, h)) {
            continue;
        }
        int busy = 0;
        for (size_t k = 0; k < r->n_open && !busy; k++) {
            const graft_sim_recovery_t *rec = &r->res->recoveries[r->open[k].rec];
            busy = rec->group == h || graft_sim_kind_is_disaster(rec->kind);
        }
        if (!busy) {
            return 1;
        }
    }
    return 0;
}

/* Every rank is dead: where each hash log ends now separates the commits
 * of before the disaster from those after it (its replacements append to
 * the same file). */
static void sim_note_disaster(graft_sim_run_t *r)
{
    graft_sim_result_t *res = r->res;
    long *offs = realloc(res->disaster_offs,
                         (res->n_disasters + 1) * (size_t)r->nslots * sizeof(long));
    if (offs == NULL) {
        graft_sim_run_fail(r, "out of memory");
        return;
    }
    res->disaster_offs = offs;
    for (int i = 0; i < r->nslots; i++) {
        struct stat sb;
        const char *cp = graft_sim_sup_commits_path(r->sup, i / r->o->ranks, i % r->o->ranks);
        offs[res->n_disasters * (size_t)r->nslots + (size_t)i] =
            stat(cp, &sb) == 0 ? (long)sb.st_size : 0;
    }
    res->n_disasters++;
}

static void sim_record_injected(graft_sim_run_t *r, size_t plan_index, const graft_sim_event_t *ev)
{
    graft_sim_result_t *res = r->res;
    if (graft_sim_grow((void **)&res->injected, &res->cap_injected, res->n_injected,
                       sizeof(*res->injected)) != 0) {
        return;
    }
    graft_sim_injected_t *in = &res->injected[res->n_injected++];
    in->t = graft_sim_run_elapsed(r);
    in->plan_index = plan_index;
    in->ev = *ev;
    in->donor_group = -1;
    in->donor_rank = -1;
    in->donor_step = -1;
    in->donor_t = -1.0;
    in->donor_serving = 0;
    in->donor_mid_serve = 0;
    in->donor_heal_ok = -1;
    in->etcd_member = -1;
    in->etcd_new_leader = -1;
    in->etcd_elected_t = -1.0;
    in->etcd_restart_t = -1.0;
    in->link_restored_t = -1.0;
    r->last_inject_ns = graft_sim_now_ns();
    if (!r->tty) {
        printf("graft-sim: t=%.2fs step %lld: inject %s", in->t, r->job_step,
               graft_sim_kind_name(ev->kind));
        if (ev->group >= 0) {
            printf(" group %d", ev->group);
        }
        if (ev->rank >= 0 && ev->kind != GRAFT_SIM_KILL_DONOR &&
            ev->kind != GRAFT_SIM_CUT_DONOR) {
            printf(" rank %d", ev->rank);
        }
        printf("\n");
        fflush(stdout);
    }
}

/*
 * etcd_leader_kill: SIGKILL the member that leads now (each member's
 * maintenance status says), to be restarted after duration_ms. Not while
 * an earlier one is down or its successor not yet seen: the cluster keeps
 * its quorum only one member short, and each kill is measured alone.
 */
static int sim_kill_leader(graft_sim_run_t *r, size_t idx, const graft_sim_event_t *ev)
{
    size_t leader = SIZE_MAX;
    if (r->cluster == NULL || r->lk_member != SIZE_MAX || r->lk_inj != SIZE_MAX ||
        graft_etcd_cluster_leader(r->cluster, &leader) != GRAFT_OK) {
        return 0; /* no leader right now: try again on the next tick */
    }
    sim_record_injected(r, idx, ev);
    graft_sim_injected_t *in = &r->res->injected[r->res->n_injected - 1];
    in->etcd_member = (int)leader;
    if (graft_etcd_server_kill(graft_etcd_cluster_member(r->cluster, leader)) != GRAFT_OK) {
        graft_sim_run_fail(r, "could not kill etcd member %zu", leader);
        return 1;
    }
    r->lk_member = leader;
    r->lk_inj = r->res->n_injected - 1;
    r->lk_up_at = graft_sim_now_ns() + (uint64_t)ev->duration_ms * 1000000ull;
    return 1;
}

/* How long a killed leader's restart waits, past its duration_ms, for
 * the others to elect a leader. */
#define SIM_LEADER_RESTART_GRACE_NS 5000000000ull

/*
 * After an etcd_leader_kill: note when a member leads again, and restart
 * the killed one when its time is up (at once with now == UINT64_MAX, at
 * the end of the run). The restart waits until it answers /health, which
 * needs a leader: so it also waits for the others' election (a grace
 * later it goes ahead), lest the engine's loop, and with it the sampling
 * of the job's step, stand still until the election ends.
 */
void graft_sim_inject_leader_pending(graft_sim_run_t *r, uint64_t now)
{
    size_t leader;
    graft_sim_injected_t *in = &r->res->injected[r->lk_inj];
    if (r->lk_member != SIZE_MAX && now >= r->lk_up_at &&
        (in->etcd_elected_t >= 0 || now - r->lk_up_at >= SIM_LEADER_RESTART_GRACE_NS)) {
        if (graft_etcd_server_restart(graft_etcd_cluster_member(r->cluster, r->lk_member)) !=
            GRAFT_OK) {
            graft_sim_run_fail(r, "could not restart etcd member %zu", r->lk_member);
        }
        in->etcd_restart_t = graft_sim_run_elapsed(r);
        r->lk_member = SIZE_MAX;
    }
    if (now != UINT64_MAX && in->etcd_elected_t < 0 &&
        graft_etcd_cluster_leader(r->cluster, &leader) == GRAFT_OK) {
        in->etcd_elected_t = graft_sim_run_elapsed(r);
        in->etcd_new_leader = (int)leader;
    }
    if (r->lk_member == SIZE_MAX && (in->etcd_elected_t >= 0 || now == UINT64_MAX)) {
        r->lk_inj = SIZE_MAX;
    }
}

/* --netns: start (on) or end a network fault on a group's link: all its
 * traffic cut (partition), only that to the other groups (isolate, etcd
 * still reachable), only that to one group, peer (cut_donor), or the link
 * reshaped (netem, throttle) and back to the run's tbf. */
static graft_status_t sim_link_set(graft_sim_kind_t kind, int group, int peer, int on)
{
    switch (kind) {
    case GRAFT_SIM_PARTITION:
        return graft_sim_netns_partition(graft_sim_net, group, on);
    case GRAFT_SIM_ISOLATE:
        return graft_sim_netns_isolate(graft_sim_net, group, on);
    case GRAFT_SIM_CUT_DONOR:
        return graft_sim_netns_cut_pair(graft_sim_net, group, peer, on);
    case GRAFT_SIM_NETEM:
        return graft_sim_netns_shape(graft_sim_net, group,
                                     on ? GRAFT_SIM_LINK_NETEM : GRAFT_SIM_LINK_BASE);
    case GRAFT_SIM_THROTTLE:
        return graft_sim_netns_shape(graft_sim_net, group,
                                     on ? GRAFT_SIM_LINK_THROTTLE : GRAFT_SIM_LINK_BASE);
    default:
        return GRAFT_EINVAL;
    }
}

/* The network fault just started becomes the active one, until its end. */
static void sim_link_hold(graft_sim_run_t *r, graft_sim_kind_t kind, int group, int peer,
                          size_t inj, long long duration_ms)
{
    assert(r->link.group < 0);
    r->link.kind = kind;
    r->link.group = group;
    r->link.peer = peer;
    r->link.inj = inj;
    r->link.until = graft_sim_now_ns() + (uint64_t)duration_ms * 1000000ull;
}

/*
 * partition, isolate, netem, throttle: one network fault at a time, and
 * none while a kill_donor or cut_donor waits for its donor (a cut needs
 * the slot). A partition or isolate waits for its group to run (a
 * partition is timed as a recovery); a reshaped link needs no process, so
 * a throttle planned right after a kill_group of its group (same step)
 * slows the replacement's heal.
 */
static int sim_inject_link(graft_sim_run_t *r, size_t idx, const graft_sim_event_t *ev)
{
    if (r->link.group >= 0 || r->donor_pending) {
        return 0;
    }
    if ((ev->kind == GRAFT_SIM_PARTITION || ev->kind == GRAFT_SIM_ISOLATE) &&
        !sim_group_alive(r, ev->group)) {
        return 0;
    }
    if (sim_link_set(ev->kind, ev->group, -1, 1) != GRAFT_OK) {
        graft_sim_run_fail(r, "could not start %s on the link of group %d (the failed command "
                              "is logged above)",
                           graft_sim_kind_name(ev->kind), ev->group);
        return 1;
    }
    sim_record_injected(r, idx, ev);
    /* Nothing of an isolated or reshaped group dies: there is no recovery
     * to time, only the verdict. */
    if (ev->kind == GRAFT_SIM_PARTITION) {
        graft_sim_recovery_open(r, ev->kind, "group", ev->group, -1);
    }
    sim_link_hold(r, ev->kind, ev->group, -1, r->res->n_injected - 1, ev->duration_ms);
    return 1;
}

/* kill_group, kill_donor, cut_donor: every rank of a group killed (the
 * donor kinds then wait for a serve to hit); 0 while it must wait. */
static int sim_inject_group(graft_sim_run_t *r, size_t idx, const graft_sim_event_t *ev)
{
    int G = r->o->groups, R = r->o->ranks;
    int donor = ev->kind != GRAFT_SIM_KILL_GROUP;
    if (ev->kind == GRAFT_SIM_CUT_DONOR && graft_sim_net == NULL) {
        graft_sim_run_fail(r, "cut_donor needs --netns");
        return 1;
    }
    if (!sim_group_alive(r, ev->group) || r->donor_pending || !sim_other_copy(r, ev->group)) {
        return 0;
    }
    if (ev->kind == GRAFT_SIM_CUT_DONOR && r->link.group >= 0) {
        return 0; /* its cut will need the one network-fault slot */
    }
    if (donor && r->n_open > 0) {
        /* Not while another recovery is open: a group still healing
         * is no copy of its ranks' state, and killing a donor rank on
         * top can leave some rank's state in no group (seen with 3 x 3,
         * a kill_rank then a kill_donor a step apart, before the first
         * checkpoint: the job was lost by design). A cut_donor
         * waits alike: its recipient's heal must be the only one. */
        return 0;
    }
    if (ev->kind == GRAFT_SIM_KILL_DONOR && G <= 2) {
        /* With two groups the donor's rank holds the last copy of its
         * shard once the other group is dead: like a disaster, not
         * before the persistent tier holds a checkpoint to restore
         * (otherwise the job is lost by design, GRAFT_ESTATELOST). */
        if (graft_sim_complete_checkpoints(r, NULL, 0) < 1) {
            return 0;
        }
    }
    sim_record_injected(r, idx, ev);
    graft_sim_recovery_open(r, ev->kind, "group", ev->group, -1);
    for (int k = 0; k < R; k++) {
        sim_kill(r, ev->group, k);
    }
    if (donor) {
        r->donor_pending = 1;
        r->donor_ev = *ev;
        r->donor_since = graft_sim_now_ns();
        r->donor_inj = r->res->n_injected - 1;
        /* Only serves that begin from now on count. */
        for (int i = 0; i < r->nslots; i++) {
            struct stat sb;
            const char *rp = graft_sim_sup_role_path(r->sup, i / R, i % R);
            r->slots[i].role_off = stat(rp, &sb) == 0 ? (long)sb.st_size : 0;
        }
    }
    return 1;
}

/* hang: a rank stopped (SIGSTOP) until its duration is up. */
static int sim_inject_hang(graft_sim_run_t *r, size_t idx, const graft_sim_event_t *ev)
{
    if (!sim_alive(r, ev->group, ev->rank) || !sim_other_copy(r, ev->group) ||
        r->hang_n == (int)(sizeof(r->hangs) / sizeof(r->hangs[0]))) {
        return 0;
    }
    if (graft_sim_sup_signal(r->sup, ev->group, ev->rank, SIGSTOP) != GRAFT_OK) {
        return 0;
    }
    sim_record_injected(r, idx, ev);
    graft_sim_recovery_open(r, ev->kind, "rank", ev->group, ev->rank);
    r->hangs[r->hang_n].g = ev->group;
    r->hangs[r->hang_n].r = ev->rank;
    r->hangs[r->hang_n].until = graft_sim_now_ns() + (uint64_t)ev->duration_ms * 1000000ull;
    r->hang_n++;
    return 1;
}

/* After a disaster's kills: the kills are asynchronous, so wait for the
 * reaps, that no writer still finishing a checkpoint races the corruption
 * and the hash logs hold every commit of before the disaster. */
static void sim_disaster_reaped(graft_sim_run_t *r)
{
    int G = r->o->groups, R = r->o->ranks;
    for (int tries = 0; tries < 200; tries++) {
        if (graft_sim_sup_poll(r->sup) != GRAFT_OK) {
            break;
        }
        int any = 0;
        for (int g = 0; g < G; g++) {
            for (int k = 0; k < R; k++) {
                any |= graft_sim_sup_state(r->sup, g, k) == GRAFT_SIM_PROC_RUNNING &&
                       graft_sim_sup_starts(r->sup, g, k) ==
                           r->open[r->n_open - 1].starts0[g * R + k];
            }
        }
        if (!any) {
            break;
        }
        usleep(5000);
    }
}

/* disaster, lose_disks: every rank killed, the newest checkpoint corrupted
 * or the local root lost as planned, and the checkpoint the job should
 * come back from noted in its recovery. */
static int sim_inject_disaster(graft_sim_run_t *r, size_t idx, const graft_sim_event_t *ev)
{
    int G = r->o->groups, R = r->o->ranks;
    for (int g = 0; g < G; g++) {
        if (!sim_group_alive(r, g)) {
            return 0;
        }
    }
    if (r->donor_pending || r->hang_n > 0 || r->link.group >= 0) {
        return 0;
    }
    /* Not before the persistent tier holds a checkpoint to restore
     * (two when one is to be corrupted): a disaster before that loses
     * the job by design (GRAFT_ESTATELOST), which is not what the event
     * is meant to show. A checkpoint of step s is written in the
     * background after s commits, so a step count alone cannot tell.
     * Losing the disks needs one in the object store. */
    if (ev->kind == GRAFT_SIM_LOSE_DISKS ? graft_sim_remote_newest(r) < 0
                                         : graft_sim_complete_checkpoints(r, NULL, 0) <
                                               (ev->corrupt ? 2 : 1)) {
        return 0;
    }
    sim_record_injected(r, idx, ev);
    graft_sim_recovery_open(r, ev->kind, "job", -1, -1);
    for (int g = 0; g < G; g++) {
        for (int k = 0; k < R; k++) {
            sim_kill(r, g, k);
        }
    }
    sim_disaster_reaped(r);
    sim_note_disaster(r);
    graft_sim_result_t *res = r->res;
    graft_sim_recovery_t none, *rec = &none;
    if (res->n_recoveries > 0 &&
        graft_sim_kind_is_disaster(res->recoveries[res->n_recoveries - 1].kind)) {
        rec = &res->recoveries[res->n_recoveries - 1];
    }
    if (ev->corrupt) {
        rec->corrupted_step = graft_sim_corrupt_newest(r, idx);
    }
    char good[256];
    if (ev->kind == GRAFT_SIM_LOSE_DISKS) {
        /* Every rank is dead: what the store holds now is what the
         * job comes back from, and the local root goes. */
        r->remote_checked_ns = 0;
        rec->checkpoint_step = graft_sim_remote_newest(r);
        graft_sim_wipe_local_root(r);
    } else if (graft_sim_complete_checkpoints(r, good, sizeof(good)) > 0) {
        rec->checkpoint_step = strtoll(good + 5, NULL, 10);
    }
    return 1;
}

/* Tries to inject one event; 0 when its preconditions do not hold yet. */
static int sim_inject(graft_sim_run_t *r, size_t idx)
{
    const graft_sim_event_t *ev = &r->sched->events[idx];
    switch (ev->kind) {
    case GRAFT_SIM_KILL_RANK:
        if (!sim_alive(r, ev->group, ev->rank) || !sim_other_copy(r, ev->group)) {
            return 0;
        }
        sim_record_injected(r, idx, ev);
        graft_sim_recovery_open(r, ev->kind, "rank", ev->group, ev->rank);
        sim_kill(r, ev->group, ev->rank);
        return 1;
    case GRAFT_SIM_KILL_GROUP:
    case GRAFT_SIM_KILL_DONOR:
    case GRAFT_SIM_CUT_DONOR:
        return sim_inject_group(r, idx, ev);
    case GRAFT_SIM_HANG:
        return sim_inject_hang(r, idx, ev);
    case GRAFT_SIM_DISASTER:
    case GRAFT_SIM_LOSE_DISKS:
        return sim_inject_disaster(r, idx, ev);
    case GRAFT_SIM_ETCD_RESTART:
        if (r->server == NULL || r->etcd_up_at != 0) {
            return 0;
        }
        sim_record_injected(r, idx, ev);
        graft_sim_recovery_open(r, ev->kind, "etcd", -1, -1);
        r->etcd_rec = r->res->n_recoveries - 1;
        if (graft_etcd_server_stop(r->server) != GRAFT_OK) {
            graft_sim_run_fail(r, "could not stop etcd");
        }
        r->etcd_up_at = graft_sim_now_ns() + (uint64_t)ev->duration_ms * 1000000ull;
        return 1;
    case GRAFT_SIM_ETCD_LEADER_KILL:
        return sim_kill_leader(r, idx, ev);
    case GRAFT_SIM_PARTITION:
    case GRAFT_SIM_ISOLATE:
    case GRAFT_SIM_NETEM:
    case GRAFT_SIM_THROTTLE:
        if (graft_sim_net == NULL) {
            graft_sim_run_fail(r, "%s needs --netns", graft_sim_kind_name(ev->kind));
            return 1;
        }
        return sim_inject_link(r, idx, ev);
    default:
        graft_sim_run_fail(r, "cannot inject %s in this build", graft_sim_kind_name(ev->kind));
        return 1;
    }
}

/* --netns: the active network fault ends. After a partition, like a
 * resumed hang, the recovery's restart phase ends here, and commits from
 * here on show the group computing again. */
void graft_sim_inject_link_restore(graft_sim_run_t *r)
{
    graft_sim_link_fault_t *lf = &r->link;
    if (sim_link_set(lf->kind, lf->group, lf->peer, 0) != GRAFT_OK) {
        graft_sim_run_fail(r, "could not end %s on the link of group %d (the failed command is "
                              "logged above)",
                           graft_sim_kind_name(lf->kind), lf->group);
    }
    double t = graft_sim_run_elapsed(r);
    if (lf->inj < r->res->n_injected) {
        r->res->injected[lf->inj].link_restored_t = t;
    }
    if (!r->tty) {
        printf("graft-sim: t=%.2fs: %s on the link of group %d", t, graft_sim_kind_name(lf->kind),
               lf->group);
        if (lf->peer >= 0) {
            printf(" to group %d", lf->peer);
        }
        printf(" ended\n");
        fflush(stdout);
    }
    for (size_t k = 0; k < r->n_open; k++) {
        graft_sim_recovery_t *rec = &r->res->recoveries[r->open[k].rec];
        if (lf->kind == GRAFT_SIM_PARTITION && rec->kind == lf->kind && rec->group == lf->group &&
            rec->t_restart < 0) {
            rec->t_restart = graft_sim_run_elapsed(r);
            for (size_t i = 0; i < r->open[k].n; i++) {
                r->open[k].commits0[i] = r->slots[r->open[k].slots[i]].commits;
            }
        }
    }
    lf->group = -1;
    lf->peer = -1;
}

/* The donor (g, k) of the pending kill_donor is killed, or, for a
 * cut_donor, its group cut off the recipient group for duration_ms (both
 * keep running and reach etcd and the other groups: the recipient's pull
 * stalls on this donor until it drops it and moves its chunks to the
 * others, or fails and heals again). step: the step it was serving, -1
 * when acting on the fallback. */
static void sim_act_on_donor(graft_sim_run_t *r, int g, int k, long long step)
{
    graft_sim_injected_t *in = &r->res->injected[r->donor_inj];
    int cut = r->donor_ev.kind == GRAFT_SIM_CUT_DONOR;
    if (cut) {
        if (sim_link_set(GRAFT_SIM_CUT_DONOR, r->donor_ev.group, g, 1) != GRAFT_OK) {
            graft_sim_run_fail(r, "cut_donor: could not cut group %d off group %d (the failed "
                                  "command is logged above)",
                               g, r->donor_ev.group);
            r->donor_pending = 0;
            return;
        }
        sim_link_hold(r, GRAFT_SIM_CUT_DONOR, r->donor_ev.group, g, r->donor_inj,
                      r->donor_ev.duration_ms);
    } else {
        sim_kill(r, g, k);
        graft_sim_recovery_open(r, GRAFT_SIM_KILL_DONOR, "donor", g, k);
    }
    in->donor_group = g;
    in->donor_rank = k;
    in->donor_step = step;
    in->donor_serving = step >= 0;
    in->donor_t = graft_sim_run_elapsed(r);
    r->donor_pending = 0;
    if (!r->tty) {
        const char *what = cut ? "cut off" : "killed";
        if (step >= 0) {
            printf("graft-sim: t=%.2fs: %s donor group %d rank %d while it serves step %lld "
                   "to group %d\n", in->donor_t, what, g, k, step, r->donor_ev.group);
        } else {
            printf("graft-sim: t=%.2fs: no serve to group %d seen in %.0f s; %s group %d "
                   "rank %d as its likely donor\n", in->donor_t, r->donor_ev.group,
                   (double)SIM_DONOR_WAIT_NS / 1e9, what, g, k);
        }
        fflush(stdout);
    }
}

/* Work of events that spans time: hangs to resume, etcd to restart, the
 * donor of a kill_donor to kill if no serve was seen in time. */
void graft_sim_inject_pending(graft_sim_run_t *r)
{
    uint64_t now = graft_sim_now_ns();
    for (int i = 0; i < r->hang_n;) {
        if (now >= r->hangs[i].until) {
            if (graft_sim_sup_signal(r->sup, r->hangs[i].g, r->hangs[i].r, SIGCONT) != GRAFT_OK) {
                /* it was killed meanwhile; nothing to resume */
            }
            for (size_t k = 0; k < r->n_open; k++) {
                graft_sim_recovery_t *rec = &r->res->recoveries[r->open[k].rec];
                if (rec->kind == GRAFT_SIM_HANG && rec->group == r->hangs[i].g &&
                    rec->rank == r->hangs[i].r && rec->t_restart < 0) {
                    rec->t_restart = graft_sim_run_elapsed(r);
                    /* Commits from here on show the rank computing again. */
                    r->open[k].commits0[0] = r->slots[r->open[k].slots[0]].commits;
                }
            }
            r->hangs[i] = r->hangs[--r->hang_n];
            continue;
        }
        i++;
    }
    if (r->link.group >= 0 && now >= r->link.until) {
        graft_sim_inject_link_restore(r);
    }
    if (r->lk_inj != SIZE_MAX) {
        graft_sim_inject_leader_pending(r, now);
    }
    if (r->etcd_up_at != 0 && now >= r->etcd_up_at) {
        if (graft_etcd_server_restart(r->server) != GRAFT_OK) {
            graft_sim_run_fail(r, "could not restart etcd");
        }
        r->etcd_up_at = 0;
        if (r->etcd_rec < r->res->n_recoveries) {
            graft_sim_recovery_t *rec = &r->res->recoveries[r->etcd_rec];
            rec->t_restart = rec->t_rejoin = graft_sim_run_elapsed(r);
            uint64_t total = 0;
            for (int i = 0; i < r->nslots; i++) {
                total += r->slots[i].commits;
            }
            for (size_t k = 0; k < r->n_open; k++) {
                if (r->open[k].rec == r->etcd_rec) {
                    r->open[k].total0 = total;
                }
            }
        }
    }
    if (r->donor_pending && r->job_step >= r->o->steps) {
        /* The job reached its last step: the trainers are finishing, and
         * a rank killed now would be replaced with no donor left to serve
         * it. The donor part is reported as not killed. */
        r->donor_pending = 0;
    }
    if (r->donor_pending && now - r->donor_since > SIM_DONOR_WAIT_NS) {
        /* No serve seen in time (the recipient may have healed from a
         * checkpoint, or its pull never reached this rank): kill or cut
         * the next group's rank as the donor it most likely was, and say
         * so. */
        int g = (r->donor_ev.group + 1) % r->o->groups;
        int k = r->donor_ev.rank >= 0 ? r->donor_ev.rank : 0;
        if (sim_alive(r, g, k)) {
            sim_act_on_donor(r, g, k, -1);
        }
    }
}

/*
 * kill_donor, cut_donor: the donor is killed (or cut off) once its
 * transfer endpoint serves the recipient, i.e. when a "<step> serving
 * <group> <rank>" line appears in a role log (train_mlp --role-log),
 * <group> being the recipient group and <rank> the planned rank. The
 * endpoint logs it after it sent that recipient rank its manifest, so the
 * pull reads from it from then on; with the ballast the pull lasts long
 * enough for the kill or the cut (a few ms later) to land during it.
 * Whether it did is what the recipient's heal says (see
 * graft_sim_observe_events). Called every SIM_DONOR_TICK_US while one is
 * pending.
 */
void graft_sim_inject_donor_poll(graft_sim_run_t *r)
{
    int k = r->donor_ev.rank >= 0 ? r->donor_ev.rank : 0;
    for (int g = 0; g < r->o->groups && r->donor_pending; g++) {
        if (g == r->donor_ev.group) {
            continue;
        }
        graft_sim_slot_t *sl = &r->slots[g * r->o->ranks + k];
        FILE *f = fopen(graft_sim_sup_role_path(r->sup, g, k), "r");
        if (f == NULL) {
            continue;
        }
        char line[768];
        long long step = -1;
        if (fseek(f, sl->role_off, SEEK_SET) == 0) {
            while (step < 0 && fgets(line, sizeof(line), f) != NULL) {
                long long st = -1;
                int rg = -1, rk = -1;
                if (strchr(line, '\n') == NULL) {
                    break; /* being written: read it whole next time */
                }
                sl->role_off += (long)strlen(line);
                if (sscanf(line, "%lld serving %d %d", &st, &rg, &rk) == 3 &&
                    rg == r->donor_ev.group && rk == k) {
                    step = st;
                }
            }
        }
        fclose(f);
        if (step >= 0 && sim_alive(r, g, k)) {
            sim_act_on_donor(r, g, k, step);
        }
    }
}

/*
 * The first due event from *next on whose preconditions hold is injected;
 * 1 when one was. An event held back (a disaster waiting for every group to
 * be whole, a kill_donor waiting for the open recoveries to close) does not
 * hold back the due events planned after it: they go ahead, and it stays
 * due and is tried again on every tick. *next moves past the injected ones.
 */
static int sim_inject_first_due(graft_sim_run_t *r, size_t *next, size_t end, uint64_t now)
{
    int injected = 0;
    for (size_t i = *next; i < end && !injected; i++) {
        const graft_sim_event_t *ev = &r->sched->events[i];
        int due = ev->at_step >= 0 ? r->job_step >= ev->at_step
                                   : (double)(now - r->t0) / 1e6 >= (double)ev->at_ms;
        if (!due) {
            break; /* planned in order: nothing later is due either */
        }
        if (!r->ev_done[i] && sim_inject(r, i)) {
            r->ev_done[i] = 1;
            injected = 1;
        }
    }
    while (*next < end && r->ev_done[*next]) {
        (*next)++;
    }
    return injected;
}

void graft_sim_inject_due(graft_sim_run_t *r)
{
    uint64_t now = graft_sim_now_ns();
    /* Nothing once a trainer has finished, or once any rank committed the
     * last step: the others finish right after, and a rank killed then
     * would be replaced with no donor left to serve it (the replacement
     * would wait for a quorum that never comes). */
    if (now - r->last_inject_ns < SIM_GAP_NS || graft_sim_sup_done(r->sup) > 0 ||
        r->job_step >= r->o->steps) {
        return;
    }
    if (!sim_inject_first_due(r, &r->next_step_ev, r->n_step_ev, now)) {
        sim_inject_first_due(r, &r->next_time_ev, r->sched->n_events, now);
    }
}

size_t graft_sim_inject_not_reached(const graft_sim_run_t *r)
{
    size_t n = r->donor_pending ? 1 : 0;
    for (size_t i = 0; i < r->sched->n_events; i++) {
        n += !r->ev_done[i];
    }
    return n;
}
