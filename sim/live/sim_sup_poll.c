/*
 * The supervisor at work (see sim_supervisor.h): processes reaped, the dead
 * replaced after the spawn delay (started for their slot, or with spares
 * as spares), the injector's signals, and a spare handed the slot it
 * promoted itself into. It starts processes through sim_supervisor.c.
 */
#include "sim_sup_int.h"

#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

/* A death the injector did not cause (a trainer that failed, or a
 * sanitizer's exit) is said where it happens, with the log that says why. */
static void sim_sup_death_note(graft_sim_sup_t *s, sim_seat_t *t, int ws)
{
    bool ours = t->sigkilled && WIFSIGNALED(ws) && WTERMSIG(ws) == SIGKILL;
    char who[48];
    if (ours)
        return;
    if (t->slot >= 0)
        snprintf(who, sizeof(who), "group %d rank %d", t->slot / s->cfg.ranks, t->rank);
    else
        snprintf(who, sizeof(who), "a spare of rank %d", t->rank);
    if (WIFEXITED(ws))
        fprintf(stderr, "graft-sim run: %s exited with status %d (see %s)\n", who,
                WEXITSTATUS(ws), t->log_path);
    else
        fprintf(stderr, "graft-sim run: %s died of %s (see %s)\n", who, strsignal(WTERMSIG(ws)),
                t->log_path);
}

static void sim_sup_kill_seat(sim_seat_t *t)
{
    kill(-t->pid, SIGKILL);
    kill(t->pid, SIGKILL);
    t->sigkilled = true;
}

/* A torch world lost slot i's process: its group's other running ranks
 * are killed (reaped as dead by the next poll and started again), as
 * torchrun stops a world's workers when one fails. Their deaths are the
 * supervisor's own, not failures to report. */
static void sim_sup_end_world(graft_sim_sup_t *s, int i)
{
    int g = i / s->cfg.ranks;
    for (int k = g * s->cfg.ranks; k < (g + 1) * s->cfg.ranks; k++) {
        int seat = s->slots[k].seat;
        sim_seat_t *q = seat >= 0 ? &s->seats[seat] : NULL;
        if (k != i && q != NULL && q->pid > 0 &&
            (q->state == GRAFT_SIM_PROC_RUNNING || q->state == GRAFT_SIM_PROC_STOPPED)) {
            sim_sup_kill_seat(q);
        }
    }
}

/* A replacement spare of @p rank, due after the spawn delay. */
static graft_status_t sim_sup_owe_spare(graft_sim_sup_t *s, int rank, uint64_t now)
{
    if (s->n_due == s->cap_due) {
        size_t cap = s->cap_due ? 2 * s->cap_due : 8;
        sim_due_t *v = realloc(s->due, cap * sizeof(*v));
        if (v == NULL) {
            return GRAFT_ENOMEM;
        }
        s->due = v;
        s->cap_due = cap;
    }
    s->due[s->n_due].rank = rank;
    s->due[s->n_due].at_ns = now + (uint64_t)s->cfg.restart_delay_ms * 1000000ull;
    s->n_due++;
    return GRAFT_OK;
}

/* Slot idx lost its process (died, or fenced off by a spare): its
 * replacement is due after the spawn delay, a spare when there are spares.
 * GRAFT_ERANGE past max_restarts. */
static graft_status_t sim_sup_slot_lost(graft_sim_sup_t *s, int idx, uint64_t now)
{
    sim_slot_t *sl = &s->slots[idx];
    sl->seat = -1;
    sl->deaths++;
    if (sl->deaths > s->cfg.max_restarts) {
        fprintf(stderr, "graft-sim run: error: group %d rank %d died %d times; giving up "
                        "(see %s)\n",
                idx / s->cfg.ranks, idx % s->cfg.ranks, sl->deaths,
                graft_sim_sup_log_path(s, idx / s->cfg.ranks, idx % s->cfg.ranks));
        return GRAFT_ERANGE;
    }
    if (s->cfg.spares > 0) {
        return sim_sup_owe_spare(s, idx % s->cfg.ranks, now);
    }
    sl->restart_at_ns = now + (uint64_t)s->cfg.restart_delay_ms * 1000000ull;
    return GRAFT_OK;
}

/* With spares: slot process pid died; its record is to be evicted. */
static graft_status_t sim_sup_note_death(graft_sim_sup_t *s, int slot, pid_t pid)
{
    if (s->n_deaths == s->cap_deaths) {
        size_t cap = s->cap_deaths ? 2 * s->cap_deaths : 8;
        sim_death_t *v = realloc(s->deaths, cap * sizeof(*v));
        if (v == NULL) {
            return GRAFT_ENOMEM;
        }
        s->deaths = v;
        s->cap_deaths = cap;
    }
    s->deaths[s->n_deaths].group = slot / s->cfg.ranks;
    s->deaths[s->n_deaths].rank = slot % s->cfg.ranks;
    s->deaths[s->n_deaths].pid = pid;
    s->n_deaths++;
    return GRAFT_OK;
}

int graft_sim_sup_next_death(graft_sim_sup_t *s, int *group, int *rank, pid_t *pid)
{
    if (s->n_deaths == 0) {
        return 0;
    }
    *group = s->deaths[0].group;
    *rank = s->deaths[0].rank;
    *pid = s->deaths[0].pid;
    memmove(s->deaths, s->deaths + 1, --s->n_deaths * sizeof(*s->deaths));
    return 1;
}

/* Seat i's process ended with status ws. */
static graft_status_t sim_sup_reaped(graft_sim_sup_t *s, size_t i, int ws, uint64_t now)
{
    sim_seat_t *t = &s->seats[i];
    pid_t pid = t->pid;
    /* What it started and left behind (a launcher's worker) goes with it. */
    kill(-t->pid, SIGKILL);
    t->pid = -1;
    if (WIFEXITED(ws) && WEXITSTATUS(ws) == 0) {
        t->state = GRAFT_SIM_PROC_DONE;
        s->done += t->slot >= 0;
        s->stats.unused += t->slot < 0 && t->spare;
        return GRAFT_OK;
    }
    sim_sup_death_note(s, t, ws);
    t->state = GRAFT_SIM_PROC_DEAD;
    if (t->slot >= 0) {
        if (s->cfg.master_ports != NULL) {
            sim_sup_end_world(s, t->slot);
        }
        graft_status_t st = s->cfg.spares > 0 ? sim_sup_note_death(s, t->slot, pid) : GRAFT_OK;
        return st == GRAFT_OK ? sim_sup_slot_lost(s, t->slot, now) : st;
    }
    if (t->fenced) {
        return GRAFT_OK; /* that slot's loss was counted when it was fenced */
    }
    if (++s->stats.died > s->cfg.max_restarts) {
        fprintf(stderr, "graft-sim run: error: %d spares died before taking a slot; giving up "
                        "(see %s)\n", s->stats.died, t->log_path);
        return GRAFT_ERANGE;
    }
    return sim_sup_owe_spare(s, t->rank, now);
}

/* Start what is due: dead slots' replacements (no spares), owed spares. */
static graft_status_t sim_sup_start_due(graft_sim_sup_t *s, uint64_t now)
{
    graft_status_t st = GRAFT_OK;
    for (int i = 0; s->cfg.spares == 0 && st == GRAFT_OK && i < s->n; i++) {
        sim_slot_t *sl = &s->slots[i];
        if (sl->seat < 0 && sl->starts > 0 && now >= sl->restart_at_ns) {
            st = graft_sim__sup_start_slot(s, i);
        }
    }
    for (size_t k = 0; st == GRAFT_OK && k < s->n_due;) {
        if (now < s->due[k].at_ns) {
            k++;
            continue;
        }
        st = graft_sim__sup_start_spare(s, s->due[k].rank);
        s->due[k] = s->due[--s->n_due];
    }
    return st;
}

graft_status_t graft_sim_sup_poll(graft_sim_sup_t *s)
{
    uint64_t now = graft_sim_now_ns();
    if (s->gave_up) {
        return GRAFT_ERANGE;
    }
    for (size_t i = 0; i < s->n_seats; i++) {
        sim_seat_t *t = &s->seats[i];
        if (t->state != GRAFT_SIM_PROC_RUNNING && t->state != GRAFT_SIM_PROC_STOPPED) {
            continue;
        }
        int ws = 0;
        if (waitpid(t->pid, &ws, WNOHANG) == t->pid) {
            graft_status_t st = sim_sup_reaped(s, i, ws, now);
            if (st != GRAFT_OK) {
                return st;
            }
        }
    }
    return sim_sup_start_due(s, now);
}

/* ------------------------------------------------------------- spares --- */

int graft_sim_sup_adopt(graft_sim_sup_t *s, int group, int rank, pid_t pid)
{
    sim_slot_t *sl = graft_sim__sup_slot(s, group, rank);
    if (sl == NULL || pid <= 0 || s->cfg.spares == 0 ||
        (sl->seat >= 0 && s->seats[sl->seat].pid == pid)) {
        return 0;
    }
    size_t k = 0;
    while (k < s->n_seats && !(s->seats[k].spare && s->seats[k].slot < 0 &&
                               s->seats[k].pid == pid && s->seats[k].rank == rank &&
                               s->seats[k].state == GRAFT_SIM_PROC_RUNNING)) {
        k++;
    }
    if (k == s->n_seats || (sl->seat >= 0 && s->seats[sl->seat].state == GRAFT_SIM_PROC_DONE)) {
        return 0;
    }
    int idx = group * s->cfg.ranks + rank;
    uint64_t now = graft_sim_now_ns();
    if (sl->seat >= 0) {
        /* The slot's process lives on (hung past its lease): an
         * orchestrator fences a node whose work moved elsewhere. */
        sim_seat_t *old = &s->seats[sl->seat];
        sim_sup_kill_seat(old);
        old->slot = -1;
        old->fenced = true;
        s->stats.fenced++;
        /* Past max_restarts, the next poll gives up. */
        s->gave_up |= sim_sup_slot_lost(s, idx, now) != GRAFT_OK;
    }
    s->seats[k].slot = idx;
    sl->seat = sl->last_seat = (int)k;
    sl->starts++;
    sl->promotions++;
    sl->started_ns = now;
    s->stats.promoted++;
    return 1;
}

/* --------------------------------------------------------- signals --- */

graft_status_t graft_sim_sup_signal(graft_sim_sup_t *s, int group, int rank, int sig)
{
    sim_slot_t *sl = graft_sim__sup_slot(s, group, rank);
    if (sl == NULL) {
        return GRAFT_EINVAL;
    }
    sim_seat_t *t = sl->seat >= 0 ? &s->seats[sl->seat] : NULL;
    if (t == NULL || t->pid <= 0 ||
        (t->state != GRAFT_SIM_PROC_RUNNING && t->state != GRAFT_SIM_PROC_STOPPED)) {
        return GRAFT_ESTATE;
    }
    if (kill(-t->pid, sig) != 0 && kill(t->pid, sig) != 0) {
        return GRAFT_ESTATE;
    }
    t->sigkilled |= sig == SIGKILL;
    if (sig == SIGSTOP) {
        t->state = GRAFT_SIM_PROC_STOPPED;
    } else if (sig == SIGCONT) {
        t->state = GRAFT_SIM_PROC_RUNNING;
    } else if (sig == SIGKILL && t->state == GRAFT_SIM_PROC_STOPPED) {
        t->state = GRAFT_SIM_PROC_RUNNING; /* reaped as dead by the next poll */
    }
    return GRAFT_OK;
}
