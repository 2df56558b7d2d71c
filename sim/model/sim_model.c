/*
 * The discrete-event model behind `graft-sim model` (docs/SIM.md).
 *
 * One run is a state machine over wall time. The job is RUNNING (training
 * time accrues), CHECKPOINTING (the blocking part of a persistent
 * checkpoint), RESTARTING from disk, or HEALING one or more groups from
 * donors. Strict mode is modelled: no step commits while any group heals, so
 * the whole job stalls during a recovery. Failures form a Poisson process per
 * GPU; their superposition is drawn once per run on its own random stream so
 * that every strategy and every checkpoint interval sees the same failures
 * (common random numbers make the comparisons and the optimum far less
 * noisy than independent draws would).
 *
 * The sweep over checkpoint intervals, its optimum and the closed forms
 * (Young, Daly) are in sim_model_sweep.c.
 */
#include "sim_model.h"

#include <assert.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ------------------------------------------------------------------------ */
/* Random numbers: xoshiro256** seeded through splitmix64, so a seed gives   */
/* the same sequence on every platform and libc.                            */
/* ------------------------------------------------------------------------ */

typedef struct sim_rng {
    uint64_t s[4];
} sim_rng_t;

static uint64_t sim_splitmix64(uint64_t *x)
{
    uint64_t z = (*x += 0x9e3779b97f4a7c15ULL);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}

static void sim_rng_seed(sim_rng_t *rng, uint64_t seed, uint64_t run, uint64_t stream)
{
    uint64_t x = seed ^ (run * 0xd1b54a32d192ed03ULL) ^ (stream * 0x8cb92ba72f3d8dd7ULL);
    for (int i = 0; i < 4; i++) {
        rng->s[i] = sim_splitmix64(&x);
    }
}

static uint64_t sim_rotl(uint64_t x, int k)
{
    return (x << k) | (x >> (64 - k));
}

static uint64_t sim_rng_next(sim_rng_t *rng)
{
    uint64_t *s = rng->s;
    uint64_t result = sim_rotl(s[1] * 5, 7) * 9;
    uint64_t t = s[1] << 17;
    s[2] ^= s[0];
    s[3] ^= s[1];
    s[1] ^= s[2];
    s[0] ^= s[3];
    s[2] ^= t;
    s[3] = sim_rotl(s[3], 45);
    return result;
}

/* Uniform in (0, 1]: never 0, so -log() below stays finite. */
static double sim_rng_unit(sim_rng_t *rng)
{
    return ((double)(sim_rng_next(rng) >> 11) + 1.0) * 0x1.0p-53;
}

static double sim_rng_exp(sim_rng_t *rng, double mean)
{
    if (isinf(mean)) {
        /* inf * -log(1) would be NaN. */
        return INFINITY;
    }
    return -mean * log(sim_rng_unit(rng));
}

static int sim_rng_below(sim_rng_t *rng, int n)
{
    return (int)(sim_rng_next(rng) % (uint64_t)n);
}

/* ------------------------------------------------------------------------ */
/* Parameters                                                               */
/* ------------------------------------------------------------------------ */

/* Llama 3 405B: 419 unexpected interruptions in 54 days on 16,384 H100. */
#define SIM_LLAMA3_GPUS 16384.0
#define SIM_LLAMA3_DAYS 54.0
#define SIM_LLAMA3_INTERRUPTIONS 419.0

void graft_sim_params_default(graft_sim_params_t *params_p)
{
    graft_sim_params_t p = {
        .groups = 128,
        .gpus_per_group = 128,
        .gpu_mtbf_hours = SIM_LLAMA3_GPUS * SIM_LLAMA3_DAYS * 24.0 / SIM_LLAMA3_INTERRUPTIONS,
        .disaster_fraction = 0.02,
        .step_seconds = 6.0,
        /* Assumed: 0.5 ms per round of the dissemination barrier, ceil(log2 128) = 7
         * rounds (graft-sim model --bench-json replaces it with a measurement). */
        .coordination_seconds = 7 * 0.5e-3,
        /* 405e9 parameters x 16 bytes (bf16 weights, fp32 master, Adam m
         * and v) spread over the 128 GPUs of one group. */
        .state_gb = 405e9 * 16.0 / 128.0 / 1e9,
        .link_gb_s = 25.0,
        .nic_gb_s = 50.0,
        .verify_gb_s = 0.0,
        .donors = 4,
        .detect_seconds = 10.0,
        .spawn_seconds = 60.0,
        /* Assumed: one etcd compare-and-swap and the spare's join; its
         * process, CUDA and NCCL are up already (graft-sim run --spares
         * measures it: --bench-json with its --json report). */
        .spare_seconds = 1.0,
        .quorum_seconds = 2.0,
        .donor_timeout_seconds = 5.0,
        .link_faults_per_hour = 0.01,
        /* Assumed: graft's blocking part is a memcpy of the state into pinned
         * buffers, 10 GB/s per GPU (--bench-json with persist_bench measures it). */
        .checkpoint_seconds = 0.0,
        .checkpoint_gb_s = 10.0,
        .restart_seconds = 600.0,
        .restore_gb_s = 0.0,
        .horizon_days = 54.0,
        .runs = 20,
    };
    *params_p = p;
}

static graft_status_t sim_check_double(const char *name, double v, double lo, int lo_open,
                                       double hi, char *err, size_t errlen)
{
    if (isnan(v)) {
        snprintf(err, errlen, "%s: not a number", name);
        return GRAFT_EINVAL;
    }
    if ((lo_open && !(v > lo)) || (!lo_open && v < lo) || v > hi) {
        snprintf(err, errlen, "%s: %g is out of range %s%g, %g]", name, v, lo_open ? "(" : "[",
                 lo, hi);
        return GRAFT_ERANGE;
    }
    return GRAFT_OK;
}

static graft_status_t sim_check_int(const char *name, int v, int lo, int hi, char *err,
                                    size_t errlen)
{
    if (v < lo || v > hi) {
        snprintf(err, errlen, "%s: %d is out of range [%d, %d]", name, v, lo, hi);
        return GRAFT_ERANGE;
    }
    return GRAFT_OK;
}

graft_status_t graft_sim_params_check(const graft_sim_params_t *params, char *err, size_t errlen)
{
    graft_status_t st = GRAFT_OK;
    const double big = 1e12;
    if (params == NULL || err == NULL || errlen == 0) {
        return GRAFT_EINVAL;
    }
    err[0] = '\0';
    const graft_sim_params_t *p = params;
#define SIM_CHECK(expr)                                                                          \
    do {                                                                                         \
        st = (expr);                                                                             \
        if (st != GRAFT_OK) {                                                                    \
            goto out;                                                                            \
        }                                                                                        \
    } while (0)
    SIM_CHECK(sim_check_int("groups", p->groups, 1, 1000000, err, errlen));
    SIM_CHECK(sim_check_int("gpus_per_group", p->gpus_per_group, 1, 1000000, err, errlen));
    SIM_CHECK(sim_check_double("gpu_mtbf_hours", p->gpu_mtbf_hours, 0, 1, INFINITY, err, errlen));
    SIM_CHECK(sim_check_double("disaster_fraction", p->disaster_fraction, 0, 0, 1, err, errlen));
    SIM_CHECK(sim_check_double("step_seconds", p->step_seconds, 0, 1, big, err, errlen));
    SIM_CHECK(sim_check_double("coordination_seconds", p->coordination_seconds, 0, 0, big, err,
                               errlen));
    SIM_CHECK(sim_check_double("state_gb", p->state_gb, 0, 0, big, err, errlen));
    SIM_CHECK(sim_check_double("link_gb_s", p->link_gb_s, 0, 1, big, err, errlen));
    SIM_CHECK(sim_check_double("nic_gb_s", p->nic_gb_s, 0, 1, big, err, errlen));
    SIM_CHECK(sim_check_double("verify_gb_s", p->verify_gb_s, 0, 0, big, err, errlen));
    SIM_CHECK(sim_check_int("donors", p->donors, 1, GRAFT_SIM_MAX_DONORS, err, errlen));
    SIM_CHECK(sim_check_double("detect_seconds", p->detect_seconds, 0, 0, big, err, errlen));
    SIM_CHECK(sim_check_double("spawn_seconds", p->spawn_seconds, 0, 0, big, err, errlen));
    SIM_CHECK(sim_check_double("spare_seconds", p->spare_seconds, 0, 0, big, err, errlen));
    SIM_CHECK(sim_check_double("quorum_seconds", p->quorum_seconds, 0, 0, big, err, errlen));
    SIM_CHECK(sim_check_double("donor_timeout_seconds", p->donor_timeout_seconds, 0, 0, big, err,
                               errlen));
    SIM_CHECK(sim_check_double("link_faults_per_hour", p->link_faults_per_hour, 0, 0, 1e6, err,
                               errlen));
    SIM_CHECK(
        sim_check_double("checkpoint_seconds", p->checkpoint_seconds, 0, 0, big, err, errlen));
    SIM_CHECK(sim_check_double("checkpoint_gb_s", p->checkpoint_gb_s, 0, 0, big, err, errlen));
    SIM_CHECK(sim_check_double("restart_seconds", p->restart_seconds, 0, 0, big, err, errlen));
    SIM_CHECK(sim_check_double("restore_gb_s", p->restore_gb_s, 0, 0, big, err, errlen));
    /* A horizon over about a century would only burn CPU time. */
    SIM_CHECK(sim_check_double("horizon_days", p->horizon_days, 0, 1, 36500, err, errlen));
    SIM_CHECK(sim_check_int("runs", p->runs, 1, 100000, err, errlen));
#undef SIM_CHECK
out:
    return st;
}

double graft_sim_checkpoint_cost(const graft_sim_params_t *params)
{
    return params->checkpoint_seconds +
           (params->checkpoint_gb_s > 0 ? params->state_gb / params->checkpoint_gb_s : 0.0);
}

double graft_sim_restart_cost(const graft_sim_params_t *params)
{
    return params->restart_seconds +
           (params->restore_gb_s > 0 ? params->state_gb / params->restore_gb_s : 0.0);
}

double graft_sim_job_mtbf_seconds(const graft_sim_params_t *params)
{
    return params->gpu_mtbf_hours * 3600.0 / ((double)params->groups * params->gpus_per_group);
}

static double sim_pull_rate(const graft_sim_params_t *p, graft_sim_strategy_t strategy,
                            int active_donors)
{
    double rate;
    if (strategy == GRAFT_SIM_P2P_SINGLE) {
        rate = fmin(p->link_gb_s, p->nic_gb_s);
    } else {
        rate = fmin(active_donors * p->link_gb_s, p->nic_gb_s);
        if (p->verify_gb_s > 0) {
            rate = fmin(rate, p->verify_gb_s);
        }
    }
    return active_donors > 0 ? rate : 0.0;
}

double graft_sim_p2p_recovery_seconds(const graft_sim_params_t *params,
                                      graft_sim_strategy_t strategy)
{
    int donors = strategy == GRAFT_SIM_P2P_SINGLE ? 1 : params->donors;
    if (donors > params->groups - 1) {
        donors = params->groups - 1;
    }
    double setup = params->detect_seconds + params->spawn_seconds + params->quorum_seconds;
    if (donors < 1) {
        return INFINITY;
    }
    return setup + params->state_gb / sim_pull_rate(params, strategy, donors);
}

const char *graft_sim_strategy_name(graft_sim_strategy_t strategy)
{
    switch (strategy) {
    case GRAFT_SIM_CHECKPOINT_RESTART:
        return "checkpoint-restart";
    case GRAFT_SIM_P2P_SINGLE:
        return "single-donor-p2p";
    case GRAFT_SIM_P2P_MULTI:
        return "multi-donor-p2p";
    default:
        return "unknown";
    }
}

/* ------------------------------------------------------------------------ */
/* One run                                                                  */
/* ------------------------------------------------------------------------ */

enum sim_mode { SIM_RUNNING, SIM_CHECKPOINTING, SIM_RESTARTING, SIM_HEALING };
enum sim_phase { SIM_SETUP, SIM_PULL };

/* One group being healed from donors. */
typedef struct sim_heal {
    int group;
    enum sim_phase phase;
    double phase_end;  /* end of SETUP */
    double gb_left;    /* during PULL */
    int ndonors;       /* active donors */
    int donors[GRAFT_SIM_MAX_DONORS];
    int npending;      /* lost donors whose stripes wait to be reassigned */
    double pending_at; /* when the pending ones are replaced */
} sim_heal_t;

typedef struct sim_run {
    const graft_sim_params_t *p;
    graft_sim_strategy_t strategy;
    double interval;
    sim_rng_t fail_rng;   /* failure times, kinds and victims */
    sim_rng_t choice_rng; /* donor choices */
    sim_rng_t link_rng;   /* transient faults of donor links */

    double t, horizon;
    enum sim_mode mode;
    double work, work_ckpt, next_ckpt_work;
    double mode_end; /* end of CHECKPOINTING or RESTARTING */

    sim_heal_t *heals; /* nheals entries, at most groups */
    int nheals;
    int *heal_of; /* group -> index in heals, or -1 */
    double *ev;   /* scratch: each heal's next event time */

    double step_eff; /* compute share of a step: step / (step + coordination) */
    double checkpoint_time, rework, downtime, coordination_time;
    double failures, disasters, disk_restarts, p2p_recoveries, transfer_restarts,
        donor_losses, link_faults;
} sim_run_t;

static void sim_disk_restart(sim_run_t *r)
{
    if (r->mode == SIM_RUNNING || r->mode == SIM_CHECKPOINTING) {
        r->rework += r->work - r->work_ckpt;
    } else if (r->mode == SIM_HEALING) {
        /* Steps lost when healing began were counted then; the committed
         * steps since the last checkpoint are lost now. */
        r->rework += r->work - r->work_ckpt;
    }
    r->work = r->work_ckpt;
    r->next_ckpt_work = r->work_ckpt + r->interval;
    for (int i = 0; i < r->nheals; i++) {
        r->heal_of[r->heals[i].group] = -1;
    }
    r->nheals = 0;
    r->mode = SIM_RESTARTING;
    r->mode_end = r->t + r->p->detect_seconds + graft_sim_restart_cost(r->p);
    r->disk_restarts += 1;
}

static int sim_is_donor_of(const sim_heal_t *h, int g)
{
    for (int i = 0; i < h->ndonors; i++) {
        if (h->donors[i] == g) {
            return 1;
        }
    }
    return 0;
}

/* Adds up to @want healthy donors not already serving @h; returns how many. */
static int sim_pick_donors(sim_run_t *r, sim_heal_t *h, int want)
{
    int healthy = r->p->groups - r->nheals;
    int added = 0;
    int candidates = healthy - h->ndonors;
    while (added < want && candidates > 0 && h->ndonors < GRAFT_SIM_MAX_DONORS) {
        /* Rejection sampling is cheap while most groups are healthy; the
         * scan below keeps it bounded when they are not. */
        int g = -1;
        for (int tries = 0; tries < 64 && g < 0; tries++) {
            int c = sim_rng_below(&r->choice_rng, r->p->groups);
            if (r->heal_of[c] < 0 && !sim_is_donor_of(h, c)) {
                g = c;
            }
        }
        for (int c = 0; c < r->p->groups && g < 0; c++) {
            if (r->heal_of[c] < 0 && !sim_is_donor_of(h, c)) {
                g = c;
            }
        }
        assert(g >= 0);
        h->donors[h->ndonors++] = g;
        added++;
        candidates--;
    }
    return added;
}

static void sim_heal_begin(sim_run_t *r, sim_heal_t *h, int group)
{
    h->group = group;
    h->phase = SIM_SETUP;
    h->phase_end = r->t + r->p->detect_seconds + r->p->spawn_seconds + r->p->quorum_seconds;
    h->gb_left = r->p->state_gb;
    h->ndonors = 0;
    h->npending = 0;
    h->pending_at = INFINITY;
}

/* Returns 0, or -1 when no healthy group is left to serve (disk restart). */
static int sim_heal_start_pull(sim_run_t *r, sim_heal_t *h)
{
    int want = r->strategy == GRAFT_SIM_P2P_SINGLE ? 1 : r->p->donors;
    h->phase = SIM_PULL;
    h->ndonors = 0;
    h->npending = 0;
    h->pending_at = INFINITY;
    if (sim_pick_donors(r, h, want) == 0) {
        return -1;
    }
    return 0;
}

static void sim_heal_remove(sim_run_t *r, int i)
{
    r->heal_of[r->heals[i].group] = -1;
    int last = r->nheals - 1;
    if (i != last) {
        r->heals[i] = r->heals[last];
        r->ev[i] = r->ev[last];
        r->heal_of[r->heals[i].group] = i;
    }
    r->nheals--;
}

/* Heal @h loses its donor at index @k (the donor died, or its link failed). */
static void sim_heal_drop_donor(sim_run_t *r, sim_heal_t *h, int k)
{
    r->donor_losses += 1;
    if (r->strategy == GRAFT_SIM_P2P_SINGLE) {
        /* Nothing received is kept: after the timeout and a new quorum the
         * pull starts from zero with another donor. */
        r->transfer_restarts += 1;
        h->phase = SIM_SETUP;
        h->phase_end = r->t + r->p->donor_timeout_seconds + r->p->quorum_seconds;
        h->gb_left = r->p->state_gb;
        h->ndonors = 0;
        return;
    }
    h->donors[k] = h->donors[--h->ndonors];
    /* Verified chunks already received are kept; the lost donor's stripes go
     * to a replacement once the loss is noticed. */
    h->npending++;
    if (isinf(h->pending_at)) {
        h->pending_at = r->t + r->p->donor_timeout_seconds;
    }
}

/* A healthy group @g that serves other heals has died: those pulls lose it. */
static void sim_donor_lost(sim_run_t *r, int g)
{
    for (int i = 0; i < r->nheals; i++) {
        sim_heal_t *h = &r->heals[i];
        if (h->phase != SIM_PULL) {
            continue;
        }
        for (int k = 0; k < h->ndonors; k++) {
            if (h->donors[k] == g) {
                sim_heal_drop_donor(r, h, k);
                break;
            }
        }
    }
}

/* Rate of transient link faults: every rank of a recipient pulls over its
 * own link from each of its donors. */
static double sim_link_fault_rate(const sim_run_t *r)
{
    double links = 0;
    for (int i = 0; i < r->nheals; i++) {
        if (r->heals[i].phase == SIM_PULL) {
            links += r->heals[i].ndonors;
        }
    }
    return links * r->p->gpus_per_group * r->p->link_faults_per_hour / 3600.0;
}

/* One rank's link to one donor failed; the donor group itself is fine. The
 * group's pull is as slow as its slowest rank, so for a single donor this
 * restarts the group's pull; for striped pulls that donor's share moves. */
static void sim_link_fault(sim_run_t *r)
{
    int links = 0;
    for (int i = 0; i < r->nheals; i++) {
        if (r->heals[i].phase == SIM_PULL) {
            links += r->heals[i].ndonors;
        }
    }
    assert(links > 0);
    int pick = sim_rng_below(&r->link_rng, links);
    r->link_faults += 1;
    for (int i = 0; i < r->nheals; i++) {
        sim_heal_t *h = &r->heals[i];
        if (h->phase != SIM_PULL) {
            continue;
        }
        if (pick < h->ndonors) {
            sim_heal_drop_donor(r, h, pick);
            return;
        }
        pick -= h->ndonors;
    }
}

static void sim_fail(sim_run_t *r)
{
    r->failures += 1;
    int disaster = sim_rng_unit(&r->fail_rng) <= r->p->disaster_fraction;
    int g = sim_rng_below(&r->fail_rng, r->p->groups);
    if (disaster) {
        r->disasters += 1;
    }
    if (r->strategy == GRAFT_SIM_CHECKPOINT_RESTART || disaster || r->mode == SIM_RESTARTING) {
        /* A failure during a restart makes the restart begin again. */
        sim_disk_restart(r);
        return;
    }
    if (r->mode == SIM_RUNNING) {
        /* Strict mode retries the step in progress; committed steps stay. */
        double committed = floor(r->work / r->p->step_seconds) * r->p->step_seconds;
        if (committed < r->work_ckpt) {
            committed = r->work_ckpt;
        }
        r->rework += r->work - committed;
        r->work = committed;
    }
    /* A checkpoint in progress is abandoned; the next one is due at once. */
    r->mode = SIM_HEALING;
    int idx = r->heal_of[g];
    if (idx >= 0) {
        /* The replacement itself died: start its heal over. */
        sim_heal_begin(r, &r->heals[idx], g);
        return;
    }
    sim_donor_lost(r, g);
    if (r->nheals + 1 >= r->p->groups) {
        /* Every group is down or healing: nobody can serve. */
        sim_disk_restart(r);
        return;
    }
    idx = r->nheals++;
    r->heal_of[g] = idx;
    sim_heal_begin(r, &r->heals[idx], g);
}

static double sim_heal_next_event(const sim_run_t *r, const sim_heal_t *h)
{
    if (h->phase == SIM_SETUP) {
        return h->phase_end;
    }
    double ev = h->pending_at;
    if (h->gb_left <= 0) {
        return r->t;
    }
    double rate = sim_pull_rate(r->p, r->strategy, h->ndonors);
    if (rate > 0) {
        ev = fmin(ev, r->t + h->gb_left / rate);
    }
    return ev;
}

/* Handles heal @i's event at time r->t; returns -1 to ask for a disk restart. */
static int sim_heal_event(sim_run_t *r, int i)
{
    sim_heal_t *h = &r->heals[i];
    if (h->phase == SIM_SETUP) {
        return sim_heal_start_pull(r, h);
    }
    if (h->pending_at <= r->t) {
        int want = h->npending;
        h->npending = 0;
        h->pending_at = INFINITY;
        sim_pick_donors(r, h, want);
        if (h->ndonors == 0) {
            return -1;
        }
        return 0;
    }
    /* The pull finished. */
    r->p2p_recoveries += 1;
    sim_heal_remove(r, i);
    return 0;
}

static void sim_advance(sim_run_t *r, double t_next)
{
    double dt = t_next - r->t;
    switch (r->mode) {
    case SIM_RUNNING:
        /* Training time accrues at the compute share of each step; the
         * rest of the step is graft's coordination. */
        r->work += dt * r->step_eff;
        r->coordination_time += dt * (1.0 - r->step_eff);
        break;
    case SIM_CHECKPOINTING:
        r->checkpoint_time += dt;
        break;
    case SIM_RESTARTING:
    case SIM_HEALING:
        r->downtime += dt;
        for (int i = 0; i < r->nheals; i++) {
            sim_heal_t *h = &r->heals[i];
            if (h->phase == SIM_PULL) {
                h->gb_left -= dt * sim_pull_rate(r->p, r->strategy, h->ndonors);
            }
        }
        break;
    }
    r->t = t_next;
}

static void sim_run_once(sim_run_t *r)
{
    const double job_mtbf = graft_sim_job_mtbf_seconds(r->p);
    double t_fail = sim_rng_exp(&r->fail_rng, job_mtbf);

    while (r->t < r->horizon) {
        /* Next internal event of the current mode. */
        double t_int = INFINITY;
        switch (r->mode) {
        case SIM_RUNNING:
            t_int = r->t + (r->next_ckpt_work - r->work) / r->step_eff;
            break;
        case SIM_CHECKPOINTING:
        case SIM_RESTARTING:
            t_int = r->mode_end;
            break;
        case SIM_HEALING:
            for (int i = 0; i < r->nheals; i++) {
                r->ev[i] = sim_heal_next_event(r, &r->heals[i]);
                t_int = fmin(t_int, r->ev[i]);
            }
            break;
        }
        /* Link faults only matter while pulls run; their rate changes with
         * the pulls, and redrawing the next one at every event is exact for
         * a memoryless process. */
        double link_rate = r->mode == SIM_HEALING ? sim_link_fault_rate(r) : 0;
        double t_link = link_rate > 0 ? r->t + sim_rng_exp(&r->link_rng, 1.0 / link_rate)
                                      : INFINITY;
        double t_next = fmin(fmin(fmin(t_int, t_fail), t_link), r->horizon);
        sim_advance(r, t_next);
        if (t_next >= r->horizon) {
            break;
        }
        if (t_fail <= t_int && t_fail <= t_link) {
            sim_fail(r);
            t_fail = r->t + sim_rng_exp(&r->fail_rng, job_mtbf);
            continue;
        }
        if (t_link <= t_int) {
            sim_link_fault(r);
            continue;
        }
        switch (r->mode) {
        case SIM_RUNNING:
            r->work = r->next_ckpt_work;
            r->mode = SIM_CHECKPOINTING;
            r->mode_end = r->t + graft_sim_checkpoint_cost(r->p);
            break;
        case SIM_CHECKPOINTING:
            /* The manifest is written last: only now does it count. */
            r->work_ckpt = r->work;
            r->next_ckpt_work = r->work + r->interval;
            r->mode = SIM_RUNNING;
            break;
        case SIM_RESTARTING:
            r->mode = SIM_RUNNING;
            break;
        case SIM_HEALING:
            for (int i = r->nheals - 1; i >= 0; i--) {
                if (r->ev[i] <= t_next && sim_heal_event(r, i) != 0) {
                    sim_disk_restart(r);
                    break;
                }
            }
            if (r->mode == SIM_HEALING && r->nheals == 0) {
                r->mode = SIM_RUNNING;
            }
            break;
        }
    }
}

/* r ready for run number `run` of a simulation: its arrays (kept) cleared,
 * its random streams seeded from (seed, run). */
static void sim_run_reset(sim_run_t *r, const graft_sim_params_t *params,
                          graft_sim_strategy_t strategy, double interval_seconds, double horizon,
                          uint64_t seed, int run)
{
    sim_heal_t *heals = r->heals;
    int *heal_of = r->heal_of;
    double *ev = r->ev;
    memset(r, 0, sizeof(*r));
    r->heals = heals;
    r->heal_of = heal_of;
    r->ev = ev;
    for (int g = 0; g < params->groups; g++) {
        r->heal_of[g] = -1;
    }
    r->p = params;
    r->strategy = strategy;
    r->interval = interval_seconds;
    r->horizon = horizon;
    r->mode = SIM_RUNNING;
    r->next_ckpt_work = interval_seconds;
    r->step_eff = params->step_seconds / (params->step_seconds + params->coordination_seconds);
    sim_rng_seed(&r->fail_rng, seed, (uint64_t)run, 1);
    sim_rng_seed(&r->choice_rng, seed, (uint64_t)run, 2);
    sim_rng_seed(&r->link_rng, seed, (uint64_t)run, 3);
}

/* One run's figures added to the sums in res. */
static void sim_result_add(graft_sim_result_t *res, const sim_run_t *r, double horizon)
{
    res->goodput += r->work / horizon;
    res->checkpoint_frac += r->checkpoint_time / horizon;
    res->coordination_frac += r->coordination_time / horizon;
    res->rework_frac += r->rework / horizon;
    res->downtime_frac += r->downtime / horizon;
    res->failures += r->failures;
    res->disasters += r->disasters;
    res->disk_restarts += r->disk_restarts;
    res->p2p_recoveries += r->p2p_recoveries;
    res->transfer_restarts += r->transfer_restarts;
    res->donor_losses += r->donor_losses;
    res->link_faults += r->link_faults;
}

/* The sums in res made means over n runs. */
static void sim_result_mean(graft_sim_result_t *res, double n)
{
    res->goodput /= n;
    res->checkpoint_frac /= n;
    res->coordination_frac /= n;
    res->rework_frac /= n;
    res->downtime_frac /= n;
    res->failures /= n;
    res->disasters /= n;
    res->disk_restarts /= n;
    res->p2p_recoveries /= n;
    res->transfer_restarts /= n;
    res->donor_losses /= n;
    res->link_faults /= n;
}

graft_status_t graft_sim_model_simulate(const graft_sim_params_t *params,
                                        graft_sim_strategy_t strategy, double interval_seconds,
                                        uint64_t seed, graft_sim_result_t *result_p)
{
    graft_status_t st = GRAFT_OK;
    char err[160];
    sim_run_t r;
    double *goodputs = NULL;
    graft_sim_result_t res;

    memset(&r, 0, sizeof(r));
    if (params == NULL || result_p == NULL || (int)strategy < 0 ||
        strategy >= GRAFT_SIM_NSTRATEGIES || !(interval_seconds > 0)) {
        st = GRAFT_EINVAL;
        goto out;
    }
    st = graft_sim_params_check(params, err, sizeof(err));
    if (st != GRAFT_OK) {
        goto out;
    }
    /* Bound the events of one run so that absurd input fails fast instead
     * of running for hours. */
    if (params->horizon_days * 86400.0 / interval_seconds > 1e8 ||
        params->horizon_days * 86400.0 / graft_sim_job_mtbf_seconds(params) > 1e8) {
        st = GRAFT_ERANGE;
        goto out;
    }
    r.heals = calloc((size_t)params->groups, sizeof(*r.heals));
    r.heal_of = calloc((size_t)params->groups, sizeof(*r.heal_of));
    r.ev = calloc((size_t)params->groups, sizeof(*r.ev));
    goodputs = calloc((size_t)params->runs, sizeof(*goodputs));
    if (r.heals == NULL || r.heal_of == NULL || r.ev == NULL || goodputs == NULL) {
        st = GRAFT_ENOMEM;
        goto out_free;
    }

    memset(&res, 0, sizeof(res));
    res.interval_seconds = interval_seconds;
    double horizon = params->horizon_days * 86400.0;
    for (int run = 0; run < params->runs; run++) {
        sim_run_reset(&r, params, strategy, interval_seconds, horizon, seed, run);
        sim_run_once(&r);
        goodputs[run] = r.work / horizon;
        sim_result_add(&res, &r, horizon);
    }
    double n = params->runs;
    sim_result_mean(&res, n);
    if (params->runs > 1) {
        double ss = 0;
        for (int run = 0; run < params->runs; run++) {
            ss += (goodputs[run] - res.goodput) * (goodputs[run] - res.goodput);
        }
        res.goodput_stddev = sqrt(ss / (n - 1));
    }
    *result_p = res;
out_free:
    free(goodputs);
    free(r.ev);
    free(r.heal_of);
    free(r.heals);
out:
    return st;
}
