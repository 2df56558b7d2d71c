/*
 * The live engine of `graft-sim run`: an embedded etcd (unless --etcd), the
 * supervisor with G x R trainers, the injector walking the planned schedule,
 * and an observer that follows the job.
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
#include "sim_live.h"
#include "sim_live_int.h"
#include "sim_netns.h"
#include "sim_supervisor.h"

#include <graft/etcd.h>
#include <graft/membership.h>

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
#include <xxhash.h>

#define SIM_TICK_US 20000
#define SIM_LEASE_TTL_MS 1000
#define SIM_GAP_NS 50000000ull /* between two injections */
#define SIM_DONOR_WAIT_NS 8000000000ull
#define SIM_DONOR_TICK_US 2000 /* role-log polling while a kill_donor waits */
/* The trainers' ballast (--blob-mib) when the plan kills donors: big enough
 * that a pull outlasts the time from the donor's "serving" line to its
 * SIGKILL (a few ms), measured in docs/SIM.md. GRAFT_SIM_BALLAST_MIB
 * overrides it (0: none). */
#define SIM_BALLAST_MIB 16
#define SIM_STEP_MS 5

/* --netns: the namespaces of this run (NULL without --netns). */
static graft_sim_netns_t *sim_net;
/* The trainers' --blob-mib, the same for the reference (0: none). */
static int sim_ballast_mib;
/* Milliseconds of simulated compute per trainer step (GRAFT_SIM_STEP_MS). */
static int sim_step_ms;

typedef struct sim_slot {
    int present;          /* a member record is in the view */
    uint64_t incarnation; /* of that record */
    long long step;       /* last step in the rank's --hash-log, -1: none yet */
    uint64_t commits;     /* lines read from it */
    long off;             /* bytes of it consumed */
    long role_off;        /* bytes of its --role-log consumed */
} sim_slot_t;

/* An open recovery's per-slot bookkeeping. */
typedef struct sim_open {
    size_t rec;            /* index into res->recoveries */
    int *slots;            /* slot indices it covers */
    uint64_t *inc0;        /* their incarnation when they failed (0: none) */
    int *starts0;          /* supervisor starts when they failed */
    size_t n;
    uint64_t *commits0;    /* their commit counts when every slot was back */
    uint64_t total0;       /* etcd: all commits when etcd was back */
} sim_open_t;

typedef struct sim_run {
    const graft_sim_live_opts_t *o;
    const graft_sim_schedule_t *sched;
    graft_etcd_cluster_t *cluster; /* NULL with --etcd */
    graft_etcd_server_t *server;   /* its one member (etcd_restart); else NULL */
    const char *endpoint;          /* comma-separated */
    char **endpoints;              /* the same, split for the observer's client */
    size_t n_endpoints;
    char job[64];
    char dir[PATH_MAX];
    const char *persist_root;
    graft_sim_sup_t *sup;
    graft_membership_t *obs;
    graft_etcd_config_t ecfg;
    graft_sim_result_t *res;
    uint64_t t0;
    int nslots;
    sim_slot_t *slots;
    long long job_step;
    int healthy;
    uint64_t quorum_id;
    graft_quorum_t *quorum;
    sim_open_t *open;
    size_t n_open, cap_open;
    size_t next_step_ev, next_time_ev, n_step_ev;
    uint64_t last_inject_ns;
    /* pending parts of events that take time */
    int donor_pending;           /* kill_donor waiting for its recipient's heal to start */
    graft_sim_event_t donor_ev;
    uint64_t donor_since;
    size_t donor_inj;
    int hang_n;
    struct { int g, r; uint64_t until; } hangs[16];
    uint64_t etcd_up_at;         /* etcd stopped; restart due */
    int part_g;                  /* --netns: the group cut off, -1: none */
    graft_sim_kind_t part_kind;  /* how: partition or isolate */
    uint64_t part_until;         /* when its link comes back */
    size_t etcd_rec;
    /* etcd_leader_kill: the member killed (SIZE_MAX: none down), when it
     * restarts, and its entry in res->injected while the next leader is
     * unseen or the member down (SIZE_MAX: none) */
    size_t lk_member;
    uint64_t lk_up_at;
    size_t lk_inj;
    uint64_t event_seq;
    uint64_t last_events_ns;
    int tty;
    uint64_t last_progress_ns;
    int progress_len;
} sim_run_t;

static double sim_t(const sim_run_t *r)
{
    return (double)(graft_sim_now_ns() - r->t0) / 1e9;
}

/* ------------------------------------------------------------ result --- */

void graft_sim_result_clear(graft_sim_result_t *res)
{
    if (res == NULL) {
        return;
    }
    for (int i = 0; res->rank_hashes != NULL && i < res->groups * res->ranks; i++) {
        free(res->rank_hashes[i]);
    }
    free(res->rank_hashes);
    free(res->final_hash);
    free(res->error);
    free(res->injected);
    free(res->recoveries);
    free(res->samples);
    free(res->disaster_offs);
    free(res->epoch_checks);
    memset(res, 0, sizeof(*res));
}

static int sim_grow(void **arr, size_t *cap, size_t n, size_t elem)
{
    if (n < *cap) {
        return 0;
    }
    size_t nc = *cap ? *cap * 2 : 64;
    void *na = realloc(*arr, nc * elem);
    if (na == NULL) {
        return -1;
    }
    *arr = na;
    *cap = nc;
    return 0;
}

/* SIGINT, SIGTERM and SIGHUP stop a run at its next tick; it then cleans
 * up like any other end (trainers, etcd, namespaces, temp directories) and
 * exits 128 + the signal. */
static volatile sig_atomic_t sim_stop_signal;

static void sim_on_stop_signal(int sig)
{
    sim_stop_signal = sig;
}

static void sim_catch_stop_signals(void)
{
    struct sigaction sa;
    memset(&sa, 0, sizeof(sa));
    sa.sa_handler = sim_on_stop_signal;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGHUP, &sa, NULL);
}

static void sim_fail(sim_run_t *r, const char *fmt, ...) GRAFT_PRINTF(2, 3);
static void sim_fail(sim_run_t *r, const char *fmt, ...)
{
    if (r->res->error != NULL) {
        return;
    }
    va_list ap;
    va_start(ap, fmt);
    if (vasprintf(&r->res->error, fmt, ap) < 0) {
        r->res->error = NULL;
    }
    va_end(ap);
}

/* --------------------------------------------------------- observing --- */

static void sim_observe(sim_run_t *r)
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
        sim_slot_t *s = &r->slots[(int)m->group * r->o->ranks + (int)m->rank];
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
        sim_slot_t *s = &r->slots[i];
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
    if (sim_grow((void **)&res->samples, &res->cap_samples, res->n_samples,
                 sizeof(*res->samples)) == 0) {
        graft_sim_sample_t *smp = &res->samples[res->n_samples++];
        smp->t = sim_t(r);
        smp->step = r->job_step;
        smp->healthy = r->healthy;
        smp->quorum_id = r->quorum_id;
    }
}

/*
 * Did a kill_donor land during the pull? The recipient's heal says: the
 * runtime's detail of a heal names each donor the pull dropped ("; donor
 * group G lost (why) after C chunks, K reassigned"). The heal of the rank
 * the killed donor served, at the step it served, that lost that donor with
 * chunks read from it or in flight (C + K > 0) was hit mid-pull.
 */
static void sim_match_donor_loss(sim_run_t *r, const graft_event_t *e)
{
    for (size_t i = 0; i < r->res->n_injected; i++) {
        graft_sim_injected_t *in = &r->res->injected[i];
        if (in->ev.kind != GRAFT_SIM_KILL_DONOR || in->donor_step < 0 ||
            in->donor_heal_ok >= 0 || (int)e->group != in->ev.group ||
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

/* The runtime records every heal in the job's event history with its
 * bytes ("N donors, B bytes: success"); read it incrementally, because
 * the history keeps only the newest events. */
static void sim_read_events(sim_run_t *r, int force)
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
}

/* -------------------------------------------------------- recoveries --- */

static void sim_open_recovery(sim_run_t *r, graft_sim_kind_t kind, const char *role, int group,
                              int rank)
{
    graft_sim_result_t *res = r->res;
    if (sim_grow((void **)&res->recoveries, &res->cap_recoveries, res->n_recoveries,
                 sizeof(*res->recoveries)) != 0 ||
        sim_grow((void **)&r->open, &r->cap_open, r->n_open, sizeof(*r->open)) != 0) {
        return;
    }
    graft_sim_recovery_t *rec = &res->recoveries[res->n_recoveries];
    memset(rec, 0, sizeof(*rec));
    rec->kind = kind;
    rec->role = role;
    rec->group = group;
    rec->rank = rank;
    rec->t_fail = sim_t(r);
    rec->t_detect = rec->t_restart = rec->t_rejoin = rec->t_healed = -1.0;
    rec->step_at_fail = r->job_step;
    rec->restored_step = -1;
    rec->corrupted_step = -1;
    sim_open_t *op = &r->open[r->n_open];
    memset(op, 0, sizeof(*op));
    op->rec = res->n_recoveries;
    size_t cap = (size_t)r->nslots;
    op->slots = calloc(cap, sizeof(int));
    op->inc0 = calloc(cap, sizeof(uint64_t));
    op->starts0 = calloc(cap, sizeof(int));
    op->commits0 = calloc(cap, sizeof(uint64_t));
    if (op->slots == NULL || op->inc0 == NULL || op->starts0 == NULL || op->commits0 == NULL) {
        free(op->slots);
        free(op->inc0);
        free(op->starts0);
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

static void sim_close_open(sim_run_t *r, size_t i)
{
    free(r->open[i].slots);
    free(r->open[i].inc0);
    free(r->open[i].starts0);
    free(r->open[i].commits0);
    r->open[i] = r->open[--r->n_open];
}

/*
 * A recovery is detected when no failed slot's old incarnation is in the
 * view, restarted when the supervisor started every replacement, rejoined
 * when every slot has a record of a new incarnation, and healed when each
 * of them has applied a commit since (see below).
 */
static void sim_track_recoveries(sim_run_t *r)
{
    double now = sim_t(r);
    uint64_t total = 0;
    for (int i = 0; i < r->nslots; i++) {
        total += r->slots[i].commits;
    }
    for (size_t i = 0; i < r->n_open;) {
        sim_open_t *op = &r->open[i];
        graft_sim_recovery_t *rec = &r->res->recoveries[op->rec];
        int gone = 1, restarted = 1, back = 1, committed = 1;
        for (size_t k = 0; k < op->n; k++) {
            const sim_slot_t *s = &r->slots[op->slots[k]];
            int g = op->slots[k] / r->o->ranks, rk = op->slots[k] % r->o->ranks;
            int same = s->present && s->incarnation == op->inc0[k];
            gone &= !same;
            restarted &= graft_sim_sup_starts(r->sup, g, rk) > op->starts0[k];
            back &= s->present && !same;
            committed &= s->commits > op->commits0[k];
        }
        if (rec->t_detect < 0 && gone) {
            rec->t_detect = now;
        }
        /* A hang ends at SIGCONT, a partition when its link is back. */
        int timed = rec->kind == GRAFT_SIM_HANG || rec->kind == GRAFT_SIM_PARTITION;
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
            sim_close_open(r, i);
            continue;
        }
        i++;
    }
}

/* --------------------------------------------------------- injecting --- */

static int sim_alive(sim_run_t *r, int g, int k)
{
    return graft_sim_sup_state(r->sup, g, k) == GRAFT_SIM_PROC_RUNNING;
}

static int sim_group_alive(sim_run_t *r, int g)
{
    for (int k = 0; k < r->o->ranks; k++) {
        if (!sim_alive(r, g, k)) {
            return 0;
        }
    }
    return 1;
}

static void sim_kill(sim_run_t *r, int g, int k)
{
    if (graft_sim_sup_signal(r->sup, g, k, SIGKILL) != GRAFT_OK) {
        /* it died on its own meanwhile: the supervisor restarts it anyway */
    }
}

/* How many complete checkpoints (a step directory with its manifest.pb,
 * written once every shard is durable) the run's persistent tier holds;
 * the newest one's directory name goes to newest (may be NULL). */
static int sim_complete_checkpoints(const sim_run_t *r, char *newest, size_t cap)
{
    DIR *d = opendir(r->persist_root);
    struct dirent *e;
    int n = 0;
    if (newest != NULL) {
        newest[0] = '\0';
    }
    while (d != NULL && (e = readdir(d)) != NULL) {
        char mf[PATH_MAX + 600];
        snprintf(mf, sizeof(mf), "%s/%s/manifest.pb", r->persist_root, e->d_name);
        if (strncmp(e->d_name, "step-", 5) != 0 || access(mf, F_OK) != 0) {
            continue;
        }
        n++;
        if (newest != NULL && strlen(e->d_name) < cap && strcmp(e->d_name, newest) > 0) {
            snprintf(newest, cap, "%s", e->d_name);
        }
    }
    if (d != NULL) {
        closedir(d);
    }
    return n;
}

/*
 * Flip one byte in the middle of ONE shard of the newest complete
 * checkpoint (one with its manifest.pb) so that its restore must fail
 * verification and fall back. One shard, as a real bad disk block or
 * torn copy would: the runtime verifies every shard of a checkpoint before
 * any rank restores it (docs/RUNTIME.md), so every rank of a group skips
 * the whole checkpoint, not only the rank whose shard is bad. Which shard
 * comes from the seed and the event's place in the plan. Returns the
 * checkpoint's step, -1 when none was corrupted.
 */
static long long sim_corrupt_newest(sim_run_t *r, size_t plan_index)
{
    char best[256] = "";
    if (sim_complete_checkpoints(r, best, sizeof(best)) == 0) {
        return -1;
    }
    int rank = (int)((r->o->seed + plan_index) % (uint64_t)r->o->ranks);
    char f[PATH_MAX + 600];
    snprintf(f, sizeof(f), "%s/%s/shard-%d-of-%d", r->persist_root, best, rank, r->o->ranks);
    int fd = open(f, O_RDWR);
    struct stat sb;
    int corrupted = 0;
    if (fd >= 0 && fstat(fd, &sb) == 0 && S_ISREG(sb.st_mode) && sb.st_size > 0) {
        off_t at = sb.st_size / 2;
        unsigned char b = 0;
        if (pread(fd, &b, 1, at) == 1) {
            b ^= 0xff;
            corrupted = pwrite(fd, &b, 1, at) == 1;
        }
    }
    if (fd >= 0) {
        close(fd);
    }
    if (!corrupted) {
        fprintf(stderr, "graft-sim: warning: could not corrupt %s: %s\n", f, strerror(errno));
        return -1;
    }
    if (!r->tty) {
        printf("graft-sim: corrupted shard %d of %d of the newest checkpoint %s\n", rank,
               r->o->ranks, best);
    }
    return strtoll(best + 5, NULL, 10);
}

/* Every rank is dead: where each hash log ends now separates the commits
 * of before the disaster from those after it (its replacements append to
 * the same file). */
static void sim_note_disaster(sim_run_t *r)
{
    graft_sim_result_t *res = r->res;
    long *offs = realloc(res->disaster_offs,
                         (res->n_disasters + 1) * (size_t)r->nslots * sizeof(long));
    if (offs == NULL) {
        sim_fail(r, "out of memory");
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

static void sim_record_injected(sim_run_t *r, size_t plan_index, const graft_sim_event_t *ev)
{
    graft_sim_result_t *res = r->res;
    if (sim_grow((void **)&res->injected, &res->cap_injected, res->n_injected,
                 sizeof(*res->injected)) != 0) {
        return;
    }
    graft_sim_injected_t *in = &res->injected[res->n_injected++];
    in->t = sim_t(r);
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
    r->last_inject_ns = graft_sim_now_ns();
    if (!r->tty) {
        printf("graft-sim: t=%.2fs step %lld: inject %s", in->t, r->job_step,
               graft_sim_kind_name(ev->kind));
        if (ev->group >= 0) {
            printf(" group %d", ev->group);
        }
        if (ev->rank >= 0 && ev->kind != GRAFT_SIM_KILL_DONOR) {
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
static int sim_kill_leader(sim_run_t *r, size_t idx, const graft_sim_event_t *ev)
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
        sim_fail(r, "could not kill etcd member %zu", leader);
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
static void sim_leader_pending(sim_run_t *r, uint64_t now)
{
    size_t leader;
    graft_sim_injected_t *in = &r->res->injected[r->lk_inj];
    if (r->lk_member != SIZE_MAX && now >= r->lk_up_at &&
        (in->etcd_elected_t >= 0 || now - r->lk_up_at >= SIM_LEADER_RESTART_GRACE_NS)) {
        if (graft_etcd_server_restart(graft_etcd_cluster_member(r->cluster, r->lk_member)) !=
            GRAFT_OK) {
            sim_fail(r, "could not restart etcd member %zu", r->lk_member);
        }
        in->etcd_restart_t = sim_t(r);
        r->lk_member = SIZE_MAX;
    }
    if (now != UINT64_MAX && in->etcd_elected_t < 0 &&
        graft_etcd_cluster_leader(r->cluster, &leader) == GRAFT_OK) {
        in->etcd_elected_t = sim_t(r);
        in->etcd_new_leader = (int)leader;
    }
    if (r->lk_member == SIZE_MAX && (in->etcd_elected_t >= 0 || now == UINT64_MAX)) {
        r->lk_inj = SIZE_MAX;
    }
}

/* --netns: cut (or restore) a group's traffic: all of it (partition), or
 * only to the other groups, etcd still reachable (isolate). */
static graft_status_t sim_cut(graft_sim_kind_t kind, int group, int cut)
{
    return kind == GRAFT_SIM_ISOLATE ? graft_sim_netns_isolate(sim_net, group, cut)
                                     : graft_sim_netns_partition(sim_net, group, cut);
}

/* Tries to inject one event; 0 when its preconditions do not hold yet. */
static int sim_inject(sim_run_t *r, size_t idx)
{
    const graft_sim_event_t *ev = &r->sched->events[idx];
    int G = r->o->groups, R = r->o->ranks;
    switch (ev->kind) {
    case GRAFT_SIM_KILL_RANK:
        if (!sim_alive(r, ev->group, ev->rank)) {
            return 0;
        }
        sim_record_injected(r, idx, ev);
        sim_open_recovery(r, ev->kind, "rank", ev->group, ev->rank);
        sim_kill(r, ev->group, ev->rank);
        return 1;
    case GRAFT_SIM_KILL_GROUP:
    case GRAFT_SIM_KILL_DONOR:
        if (!sim_group_alive(r, ev->group) || r->donor_pending) {
            return 0;
        }
        if (ev->kind == GRAFT_SIM_KILL_DONOR && r->n_open > 0) {
            /* Not while another recovery is open: a group still healing
             * is no copy of its ranks' state, and killing a donor rank on
             * top can leave some rank's state in no group (seen with 3 x 3,
             * a kill_rank then a kill_donor a step apart, before the first
             * checkpoint: the job was lost by design). */
            return 0;
        }
        if (ev->kind == GRAFT_SIM_KILL_DONOR && G <= 2) {
            /* With two groups the donor's rank holds the last copy of its
             * shard once the other group is dead: like a disaster, not
             * before the persistent tier holds a checkpoint to restore
             * (otherwise the job is lost by design, GRAFT_ESTATELOST). */
            if (sim_complete_checkpoints(r, NULL, 0) < 1) {
                return 0;
            }
        }
        sim_record_injected(r, idx, ev);
        sim_open_recovery(r, ev->kind, "group", ev->group, -1);
        for (int k = 0; k < R; k++) {
            sim_kill(r, ev->group, k);
        }
        if (ev->kind == GRAFT_SIM_KILL_DONOR) {
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
    case GRAFT_SIM_HANG:
        if (!sim_alive(r, ev->group, ev->rank) ||
            r->hang_n == (int)(sizeof(r->hangs) / sizeof(r->hangs[0]))) {
            return 0;
        }
        if (graft_sim_sup_signal(r->sup, ev->group, ev->rank, SIGSTOP) != GRAFT_OK) {
            return 0;
        }
        sim_record_injected(r, idx, ev);
        sim_open_recovery(r, ev->kind, "rank", ev->group, ev->rank);
        r->hangs[r->hang_n].g = ev->group;
        r->hangs[r->hang_n].r = ev->rank;
        r->hangs[r->hang_n].until = graft_sim_now_ns() + (uint64_t)ev->duration_ms * 1000000ull;
        r->hang_n++;
        return 1;
    case GRAFT_SIM_DISASTER:
        for (int g = 0; g < G; g++) {
            if (!sim_group_alive(r, g)) {
                return 0;
            }
        }
        if (r->donor_pending || r->hang_n > 0 || r->part_g >= 0) {
            return 0;
        }
        /* Not before the persistent tier holds a checkpoint to restore
         * (two when one is to be corrupted): a disaster before that loses
         * the job by design (GRAFT_ESTATELOST), which is not what the event
         * is meant to show. A checkpoint of step s is written in the
         * background after s commits, so a step count alone cannot tell. */
        if (sim_complete_checkpoints(r, NULL, 0) < (ev->corrupt ? 2 : 1)) {
            return 0;
        }
        sim_record_injected(r, idx, ev);
        sim_open_recovery(r, ev->kind, "job", -1, -1);
        for (int g = 0; g < G; g++) {
            for (int k = 0; k < R; k++) {
                sim_kill(r, g, k);
            }
        }
        {
            /* The kills are asynchronous: wait for the reaps, so that no
             * writer still finishing a checkpoint races the corruption and
             * the hash logs hold every commit of before the disaster. */
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
            sim_note_disaster(r);
            if (ev->corrupt) {
                long long cs = sim_corrupt_newest(r, idx);
                graft_sim_result_t *res = r->res;
                if (res->n_recoveries > 0 &&
                    res->recoveries[res->n_recoveries - 1].kind == GRAFT_SIM_DISASTER) {
                    res->recoveries[res->n_recoveries - 1].corrupted_step = cs;
                }
            }
        }
        return 1;
    case GRAFT_SIM_ETCD_RESTART:
        if (r->server == NULL || r->etcd_up_at != 0) {
            return 0;
        }
        sim_record_injected(r, idx, ev);
        sim_open_recovery(r, ev->kind, "etcd", -1, -1);
        r->etcd_rec = r->res->n_recoveries - 1;
        if (graft_etcd_server_stop(r->server) != GRAFT_OK) {
            sim_fail(r, "could not stop etcd");
        }
        r->etcd_up_at = graft_sim_now_ns() + (uint64_t)ev->duration_ms * 1000000ull;
        return 1;
    case GRAFT_SIM_ETCD_LEADER_KILL:
        return sim_kill_leader(r, idx, ev);
    case GRAFT_SIM_PARTITION:
    case GRAFT_SIM_ISOLATE:
        if (sim_net == NULL) {
            sim_fail(r, "%s needs --netns", graft_sim_kind_name(ev->kind));
            return 1;
        }
        if (!sim_group_alive(r, ev->group) || r->part_g >= 0 || r->donor_pending) {
            return 0;
        }
        if (sim_cut(ev->kind, ev->group, 1) != GRAFT_OK) {
            sim_fail(r, "could not cut group %d off %s", ev->group,
                     ev->kind == GRAFT_SIM_ISOLATE ? "its peers" : "the network");
            return 1;
        }
        sim_record_injected(r, idx, ev);
        /* An isolated group keeps its leases and processes: nothing of it
         * dies, so there is no recovery to time, only the verdict. */
        if (ev->kind == GRAFT_SIM_PARTITION)
            sim_open_recovery(r, ev->kind, "group", ev->group, -1);
        r->part_g = ev->group;
        r->part_kind = ev->kind;
        r->part_until = graft_sim_now_ns() + (uint64_t)ev->duration_ms * 1000000ull;
        return 1;
    default:
        sim_fail(r, "cannot inject %s in this build", graft_sim_kind_name(ev->kind));
        return 1;
    }
}

/* --netns: the partitioned group's link comes back. Like a resumed hang,
 * the recovery's restart phase ends here, and commits from here on show
 * the group computing again. */
static void sim_heal_partition(sim_run_t *r)
{
    if (sim_cut(r->part_kind, r->part_g, 0) != GRAFT_OK) {
        sim_fail(r, "could not restore the links of group %d", r->part_g);
    }
    for (size_t k = 0; k < r->n_open; k++) {
        graft_sim_recovery_t *rec = &r->res->recoveries[r->open[k].rec];
        if (rec->kind == r->part_kind && rec->group == r->part_g && rec->t_restart < 0) {
            rec->t_restart = sim_t(r);
            for (size_t i = 0; i < r->open[k].n; i++) {
                r->open[k].commits0[i] = r->slots[r->open[k].slots[i]].commits;
            }
        }
    }
    r->part_g = -1;
}

/* Kill (g, k) as the donor of the pending kill_donor; step: the step it
 * was serving, -1 when killed on the fallback. */
static void sim_kill_donor(sim_run_t *r, int g, int k, long long step)
{
    graft_sim_injected_t *in = &r->res->injected[r->donor_inj];
    sim_kill(r, g, k);
    sim_open_recovery(r, GRAFT_SIM_KILL_DONOR, "donor", g, k);
    in->donor_group = g;
    in->donor_rank = k;
    in->donor_step = step;
    in->donor_serving = step >= 0;
    in->donor_t = sim_t(r);
    r->donor_pending = 0;
    if (!r->tty) {
        if (step >= 0) {
            printf("graft-sim: t=%.2fs: killed donor group %d rank %d while it serves step %lld "
                   "to group %d\n", in->donor_t, g, k, step, r->donor_ev.group);
        } else {
            printf("graft-sim: t=%.2fs: no serve to group %d seen in %.0f s; killed group %d "
                   "rank %d as its likely donor\n", in->donor_t, r->donor_ev.group,
                   (double)SIM_DONOR_WAIT_NS / 1e9, g, k);
        }
        fflush(stdout);
    }
}

/* Work of events that spans time: hangs to resume, etcd to restart, the
 * donor of a kill_donor to kill if no serve was seen in time. */
static void sim_pending(sim_run_t *r)
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
                    rec->t_restart = sim_t(r);
                    /* Commits from here on show the rank computing again. */
                    r->open[k].commits0[0] = r->slots[r->open[k].slots[0]].commits;
                }
            }
            r->hangs[i] = r->hangs[--r->hang_n];
            continue;
        }
        i++;
    }
    if (r->part_g >= 0 && now >= r->part_until) {
        sim_heal_partition(r);
    }
    if (r->lk_inj != SIZE_MAX) {
        sim_leader_pending(r, now);
    }
    if (r->etcd_up_at != 0 && now >= r->etcd_up_at) {
        if (graft_etcd_server_restart(r->server) != GRAFT_OK) {
            sim_fail(r, "could not restart etcd");
        }
        r->etcd_up_at = 0;
        if (r->etcd_rec < r->res->n_recoveries) {
            graft_sim_recovery_t *rec = &r->res->recoveries[r->etcd_rec];
            rec->t_restart = rec->t_rejoin = sim_t(r);
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
         * checkpoint, or its pull never reached this rank): kill the next
         * group's rank as the donor it most likely was, and say so. */
        int g = (r->donor_ev.group + 1) % r->o->groups;
        int k = r->donor_ev.rank >= 0 ? r->donor_ev.rank : 0;
        if (sim_alive(r, g, k)) {
            sim_kill_donor(r, g, k, -1);
        }
    }
}

/*
 * kill_donor: the donor is killed once its transfer endpoint serves the
 * recipient, i.e. when a "<step> serving <group> <rank>" line appears in a
 * role log (train_mlp --role-log), <group> being the recipient group and
 * <rank> the planned rank. The endpoint logs it after it sent that
 * recipient rank its manifest, so the pull reads from it from then on; with
 * the ballast the pull lasts long enough for the kill (a few ms later) to
 * land during it. Whether it did is what the recipient's heal says (see
 * sim_read_events). Called every SIM_DONOR_TICK_US while one is pending.
 */
static void sim_donor_poll(sim_run_t *r)
{
    int k = r->donor_ev.rank >= 0 ? r->donor_ev.rank : 0;
    for (int g = 0; g < r->o->groups && r->donor_pending; g++) {
        if (g == r->donor_ev.group) {
            continue;
        }
        sim_slot_t *sl = &r->slots[g * r->o->ranks + k];
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
            sim_kill_donor(r, g, k, step);
        }
    }
}

static void sim_injector(sim_run_t *r)
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
    if (r->next_step_ev < r->n_step_ev &&
        r->job_step >= r->sched->events[r->next_step_ev].at_step) {
        if (sim_inject(r, r->next_step_ev)) {
            r->next_step_ev++;
            return;
        }
    }
    if (r->next_time_ev < r->sched->n_events &&
        (double)(now - r->t0) / 1e6 >= (double)r->sched->events[r->next_time_ev].at_ms) {
        if (sim_inject(r, r->next_time_ev)) {
            r->next_time_ev++;
        }
    }
}

/* ---------------------------------------------------------- progress --- */

static void sim_progress(sim_run_t *r, int final)
{
    uint64_t now = graft_sim_now_ns();
    uint64_t every = r->tty ? 200000000ull : 2000000000ull;
    if (!final && now - r->last_progress_ns < every) {
        return;
    }
    r->last_progress_ns = now;
    size_t open = r->n_open;
    char line[200];
    int n = snprintf(line, sizeof(line),
                     "t=%5.1fs step %lld/%lld  healthy %d/%d  quorum %" PRIu64
                     "  recoveries %zu (%zu open)  failures %zu/%zu",
                     sim_t(r), r->job_step, r->o->steps, r->healthy, r->o->groups, r->quorum_id,
                     r->res->n_recoveries - open, open, r->res->n_injected,
                     r->sched->n_events);
    if (r->tty) {
        int pad = r->progress_len > n ? r->progress_len - n : 0;
        printf("\r%s%*s%s", line, pad, "", final ? "\n" : "");
        r->progress_len = n;
    } else {
        printf("%s\n", line);
    }
    fflush(stdout);
}

/* ------------------------------------------------------------- a run --- */

/* GRAFT_SIM_KEEP set to anything but "" or "0": keep the run directory,
 * with the embedded etcd's log at info level. */
static bool sim_keep(void)
{
    const char *keep = getenv("GRAFT_SIM_KEEP");
    return keep != NULL && keep[0] != '\0' && strcmp(keep, "0") != 0;
}

static char *sim_env(const char *k, const char *fmt, ...) GRAFT_PRINTF(2, 3);
static char *sim_env(const char *k, const char *fmt, ...)
{
    char v[PATH_MAX];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(v, sizeof(v), fmt, ap);
    va_end(ap);
    char *s = NULL;
    const char *user = getenv(k);
    /* A value the user exported wins (e.g. a longer lease on a slow box). */
    if (asprintf(&s, "%s=%s", k, user != NULL && strcmp(k, "GRAFT_JOB") != 0 &&
                                         strcmp(k, "GRAFT_ETCD_ENDPOINTS") != 0 &&
                                         strcmp(k, "GRAFT_PERSIST_ROOT") != 0
                                     ? user
                                     : v) < 0) {
        s = NULL;
    }
    return s;
}

static const char *sim_trainer_path(char *buf, size_t len)
{
    const char *t = getenv("GRAFT_SIM_TRAINER");
    if (t != NULL && t[0] != '\0') {
        return t;
    }
    /* build/bin/graft-sim runs build/bin/train_mlp. */
    ssize_t n = readlink("/proc/self/exe", buf, len - 32);
    if (n <= 0) {
        return "train_mlp";
    }
    buf[n] = '\0';
    char *slash = strrchr(buf, '/');
    if (slash == NULL) {
        return "train_mlp";
    }
    strcpy(slash + 1, "train_mlp");
    return buf;
}

/*
 * One run: the given schedule (empty for the reference) against a fresh
 * set of trainers under a job name of its own.
 */
static graft_status_t sim_run_once(const graft_sim_live_opts_t *o,
                                   const graft_sim_schedule_t *sched,
                                   graft_etcd_cluster_t *cluster, const char *endpoint,
                                   const char *tag, const char *persist_root,
                                   graft_sim_result_t *res)
{
    graft_status_t st = GRAFT_OK;
    sim_run_t r;
    memset(&r, 0, sizeof(r));
    memset(res, 0, sizeof(*res));
    r.o = o;
    r.sched = sched;
    r.cluster = cluster;
    r.server = graft_etcd_cluster_size(cluster) == 1 ? graft_etcd_cluster_member(cluster, 0) : NULL;
    r.endpoint = endpoint;
    r.lk_member = SIZE_MAX;
    r.lk_inj = SIZE_MAX;
    r.res = res;
    r.persist_root = persist_root;
    r.tty = isatty(STDOUT_FILENO) && strcmp(tag, "ref") != 0;
    r.nslots = o->groups * o->ranks;
    r.part_g = -1;
    res->groups = o->groups;
    res->ranks = o->ranks;
    snprintf(r.job, sizeof(r.job), "sim-%d-%s-%" PRIx64, (int)getpid(), tag,
             (uint64_t)time(NULL));
    char *env[16] = {0};
    char trainer_buf[PATH_MAX];
    const char *trainer = sim_trainer_path(trainer_buf, sizeof(trainer_buf));
    /* --netns: trainers start through the wrapper that enters their
     * group's namespace, and reach etcd on the hub address. */
    char net_endpoint[128];
    const char *trainer_endpoint = endpoint;
    if (sim_net != NULL) {
        const char *port = strrchr(endpoint, ':');
        snprintf(net_endpoint, sizeof(net_endpoint), "http://%s%s", graft_sim_netns_hub(sim_net),
                 port != NULL ? port : "");
        trainer_endpoint = net_endpoint;
    }
    const char *dir_base = getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp";
    snprintf(r.dir, sizeof(r.dir), "%s/graft-sim-%s-XXXXXX", dir_base, tag);
    if (mkdtemp(r.dir) == NULL) {
        fprintf(stderr, "graft-sim run: error: mkdtemp %s: %s\n", r.dir, strerror(errno));
        return GRAFT_ESYS;
    }
    r.slots = calloc((size_t)r.nslots, sizeof(*r.slots));
    if (r.slots == NULL) {
        st = GRAFT_ENOMEM;
        goto out;
    }
    for (int i = 0; i < r.nslots; i++) {
        r.slots[i].step = -1;
    }
    /* Checkpoints of this job only: a root shared with earlier runs would
     * hand the first start a stranger's state. */
    char proot[PATH_MAX + 160];
    snprintf(proot, sizeof(proot), "%s/%s", persist_root, r.job);
    mkdir(proot, 0755);
    r.persist_root = proot;
    int e = 0;
    env[e++] = sim_env("GRAFT_JOB", "%s", r.job);
    env[e++] = sim_env("GRAFT_ETCD_ENDPOINTS", "%s", trainer_endpoint);
    env[e++] = sim_env("GRAFT_GROUPS", "%d", o->groups);
    env[e++] = sim_env("GRAFT_RANKS_PER_GROUP", "%d", o->ranks);
    env[e++] = sim_env("GRAFT_MODE", "%s", o->mode == GRAFT_SIM_LIVE_STRICT ? "strict" : "elastic");
    env[e++] = sim_env("GRAFT_MIN_GROUPS", "%d",
                       o->mode == GRAFT_SIM_LIVE_STRICT ? o->groups
                                                        : (o->groups > 1 ? o->groups - 1 : 1));
    env[e++] = sim_env("GRAFT_LEASE_TTL_MS", "%d", SIM_LEASE_TTL_MS);
    env[e++] = sim_env("GRAFT_JOIN_TIMEOUT_MS", "%d", 1000);
    env[e++] = sim_env("GRAFT_PERSIST_ROOT", "%s", proot);
    env[e++] = sim_env("GRAFT_PERSIST_EVERY", "%lld", o->persist_every);
    for (int i = 0; i < e; i++) {
        if (env[i] == NULL) {
            st = GRAFT_ENOMEM;
            goto out;
        }
    }
    st = graft_etcd_endpoints_split(r.endpoint, &r.endpoints, &r.n_endpoints);
    if (st != GRAFT_OK) {
        fprintf(stderr, "graft-sim run: error: etcd endpoints '%s': %s\n", r.endpoint,
                graft_status_string(st));
        goto out;
    }
    r.ecfg.endpoints = (const char *const *)r.endpoints;
    r.ecfg.n_endpoints = r.n_endpoints;
    r.ecfg.request_timeout_ms = 2000;
    if (r.n_endpoints > 1) {
        /* The observer runs in the loop that samples the job's step: a
         * read stuck on a member whose leader just died would hold the
         * samples up and overstate the stall. Give up on it soon; the
         * next tick asks again. */
        r.ecfg.request_timeout_ms = 300;
        r.ecfg.connect_timeout_ms = 200;
        r.ecfg.max_retries = GRAFT_ETCD_NO_RETRIES;
    }
    graft_membership_config_t mc;
    memset(&mc, 0, sizeof(mc));
    mc.job = r.job;
    mc.etcd = &r.ecfg;
    mc.observer = true;
    mc.ranks_per_group = (uint32_t)o->ranks;
    mc.min_groups = 1;
    st = graft_membership_create(&mc, &r.obs);
    if (st != GRAFT_OK) {
        fprintf(stderr, "graft-sim run: error: cannot observe job %s at %s: %s\n", r.job,
                endpoint, graft_status_string(st));
        goto out;
    }
    graft_sim_sup_config_t sc;
    memset(&sc, 0, sizeof(sc));
    sc.trainer = trainer;
    sc.env = (const char *const *)env;
    sc.dir = r.dir;
    sc.groups = o->groups;
    sc.ranks = o->ranks;
    sc.steps = o->steps;
    sc.seed = o->seed;
    sc.restart_delay_ms = 100;
    sc.max_restarts = 10 + (int)(sched->n_events * 2);
    sc.role_log = 1;
    char ballast[24], step_ms[24];
    const char *extra[5] = {NULL, NULL, NULL, NULL, NULL};
    size_t n_extra = 0;
    if (sim_ballast_mib > 0) {
        snprintf(ballast, sizeof(ballast), "%d", sim_ballast_mib);
        extra[n_extra++] = "--blob-mib";
        extra[n_extra++] = ballast;
    }
    if (sim_step_ms > 0) {
        snprintf(step_ms, sizeof(step_ms), "%d", sim_step_ms);
        extra[n_extra++] = "--step-delay-ms";
        extra[n_extra++] = step_ms;
    }
    sc.extra_args = extra;
    res->ballast_mib = sim_ballast_mib;
    if (access(trainer, X_OK) != 0) {
        fprintf(stderr, "graft-sim run: error: trainer %s: %s (set GRAFT_SIM_TRAINER or build "
                        "examples/train_mlp)\n",
                trainer, strerror(errno));
        st = GRAFT_ENOTFOUND;
        goto out;
    }
    if (sim_net != NULL) {
        sc.trainer = graft_sim_netns_trainer(sim_net);
    }
    r.t0 = graft_sim_now_ns();
    st = graft_sim_sup_create(&sc, &r.sup);
    if (st != GRAFT_OK) {
        goto out;
    }
    while (r.n_step_ev < sched->n_events && sched->events[r.n_step_ev].at_step >= 0) {
        r.n_step_ev++;
    }
    r.next_time_ev = r.n_step_ev;
    const char *tmo = getenv("GRAFT_SIM_TIMEOUT_S");
    uint64_t timeout_ns = (uint64_t)(tmo != NULL ? atoi(tmo) : 600) * 1000000000ull;
    uint64_t first_done_ns = 0;
    for (;;) {
        if (sim_stop_signal != 0) {
            sim_fail(&r, "stopped by %s", strsignal(sim_stop_signal));
            break;
        }
        st = graft_sim_sup_poll(r.sup);
        if (st != GRAFT_OK) {
            if (st == GRAFT_ERANGE) {
                sim_fail(&r, "the supervisor gave up: a rank was started more than %d times "
                             "(its trainer log says why)", sc.max_restarts);
            } else {
                sim_fail(&r, "the supervisor gave up: %s", graft_status_string(st));
            }
            st = GRAFT_OK;
            break;
        }
        sim_observe(&r);
        sim_read_events(&r, 0);
        sim_track_recoveries(&r);
        sim_pending(&r);
        sim_injector(&r);
        if (r.res->error != NULL) {
            break;
        }
        sim_progress(&r, 0);
        if (graft_sim_sup_done(r.sup) == r.nslots) {
            res->completed = 1;
            break;
        }
        /* Elastic: once the groups still training have finished, a group
         * left behind may never see a quorum again (its peers are gone);
         * an orchestrator ends the job then. Give stragglers a grace. */
        if (graft_sim_sup_done(r.sup) > 0 && first_done_ns == 0) {
            first_done_ns = graft_sim_now_ns();
        }
        if (o->mode == GRAFT_SIM_LIVE_ELASTIC && first_done_ns != 0 &&
            graft_sim_now_ns() - first_done_ns > 5000000000ull) {
            res->completed = 1;
            res->stragglers = r.nslots - graft_sim_sup_done(r.sup);
            break;
        }
        if (graft_sim_now_ns() - r.t0 > timeout_ns) {
            sim_fail(&r, "timed out after %.0f s at step %lld", (double)timeout_ns / 1e9,
                     r.job_step);
            break;
        }
        if (r.donor_pending) {
            /* A serve is short: watch for it closely. */
            for (int i = 0; i < SIM_TICK_US / SIM_DONOR_TICK_US && r.donor_pending; i++) {
                usleep(SIM_DONOR_TICK_US);
                sim_donor_poll(&r);
            }
        } else {
            usleep(SIM_TICK_US);
        }
    }
    if (r.etcd_up_at != 0 && graft_etcd_server_restart(r.server) != GRAFT_OK) {
        sim_fail(&r, "could not restart etcd");
    }
    if (r.lk_member != SIZE_MAX) {
        /* The run ended before the killed member's time was up. */
        sim_leader_pending(&r, UINT64_MAX);
    }
    if (r.part_g >= 0) {
        sim_heal_partition(&r);
    }
    sim_observe(&r);
    sim_read_events(&r, 1);
    sim_track_recoveries(&r);
    sim_progress(&r, 1);
    res->wall_s = sim_t(&r);
    res->n_skipped = (r.n_step_ev - r.next_step_ev) + (sched->n_events - r.next_time_ev);
    if (r.donor_pending) {
        res->n_skipped++;
    }
    res->rank_hashes = calloc((size_t)r.nslots, sizeof(char *));
    for (int i = 0; res->rank_hashes != NULL && i < r.nslots; i++) {
        FILE *f = fopen(graft_sim_sup_hash_path(r.sup, i / o->ranks, i % o->ranks), "r");
        char buf[256] = "";
        if (f != NULL) {
            if (fgets(buf, sizeof(buf), f) == NULL) {
                buf[0] = '\0';
            }
            fclose(f);
        }
        buf[strcspn(buf, " \t\r\n")] = '\0';
        res->rank_hashes[i] = strdup(buf);
    }
    graft_sim_sup_destroy(r.sup);
    r.sup = NULL;
    /* The logs are read by the verdict before the directory goes. */
    graft_sim_verdict_scan_logs(res, r.dir, o->groups, o->ranks, o->mode == GRAFT_SIM_LIVE_ELASTIC);
out:
    graft_sim_sup_destroy(r.sup);
    graft_membership_destroy(r.obs);
    graft_membership_quorum_free(r.quorum);
    while (r.n_open > 0) {
        sim_close_open(&r, 0);
    }
    free(r.open);
    free(r.slots);
    graft_etcd_endpoints_free(r.endpoints, r.n_endpoints);
    for (int i = 0; i < 16; i++) {
        free(env[i]);
    }
    if (!sim_keep()) {
        char cmd[PATH_MAX + 16];
        snprintf(cmd, sizeof(cmd), "rm -rf '%s'", r.dir);
        if (system(cmd) != 0) {
            fprintf(stderr, "graft-sim run: warning: could not remove %s\n", r.dir);
        }
    } else {
        /* The embedded etcd's logs go with the cluster: keep copies
         * (etcd.log, then etcd-m1.log, ... for the other members). */
        char cmd[2 * PATH_MAX + 48];
        for (size_t m = 0; m < graft_etcd_cluster_size(cluster); m++) {
            const char *elog = graft_etcd_server_log_path(graft_etcd_cluster_member(cluster, m));
            if (elog == NULL) {
                continue;
            }
            if (m == 0) {
                snprintf(cmd, sizeof(cmd), "cp '%s' '%s/etcd.log'", elog, r.dir);
            } else {
                snprintf(cmd, sizeof(cmd), "cp '%s' '%s/etcd-m%zu.log'", elog, r.dir, m);
            }
            if (system(cmd) != 0) {
                fprintf(stderr, "graft-sim run: warning: could not copy %s\n", elog);
            }
        }
        printf("graft-sim: kept the run directory %s\n", r.dir);
    }
    return st;
}

/* -------------------------------------------------------- reference --- */

static void sim_ref_key(const graft_sim_live_opts_t *o, char *key, size_t len)
{
    char trainer_buf[PATH_MAX];
    const char *trainer = sim_trainer_path(trainer_buf, sizeof(trainer_buf));
    struct stat sb;
    memset(&sb, 0, sizeof(sb));
    if (stat(trainer, &sb) != 0) {
        memset(&sb, 0, sizeof(sb));
    }
    char desc[PATH_MAX + 256];
    /* Everything that decides the final state: the shape, the steps, the
     * seed, the mode, which trainer binary (path, size, mtime) and its
     * ballast (the blob is part of the state). */
    int n = snprintf(desc, sizeof(desc), "v1 g=%d r=%d steps=%lld seed=%" PRIu64
                     " mode=%d trainer=%s size=%lld mtime=%lld.%09ld blob=%d",
                     o->groups, o->ranks, o->steps, o->seed, (int)o->mode, trainer,
                     (long long)sb.st_size, (long long)sb.st_mtim.tv_sec, sb.st_mtim.tv_nsec,
                     sim_ballast_mib);
    snprintf(key, len, "%016" PRIx64, (uint64_t)XXH3_64bits(desc, (size_t)n));
}

static char *sim_cache_path(const graft_sim_live_opts_t *o)
{
    char key[32];
    sim_ref_key(o, key, sizeof(key));
    const char *dir = getenv("GRAFT_SIM_CACHE_DIR");
    char *p = NULL;
    if (dir != NULL && dir[0] != '\0') {
        if (asprintf(&p, "%s/ref-%s.txt", dir, key) < 0) {
            p = NULL;
        }
        return p;
    }
    const char *home = getenv("XDG_CACHE_HOME");
    if (home != NULL && home[0] != '\0') {
        if (asprintf(&p, "%s/graft-sim/ref-%s.txt", home, key) < 0) {
            p = NULL;
        }
    } else if (asprintf(&p, "%s/.cache/graft-sim/ref-%s.txt",
                        getenv("HOME") ? getenv("HOME") : "/tmp", key) < 0) {
        p = NULL;
    }
    return p;
}

/* Creates the directories above path (not path itself). */
static void sim_mkdirs(const char *path)
{
    char *buf = strdup(path);
    for (char *s = buf != NULL ? buf + 1 : NULL; s != NULL && *s; s++) {
        if (*s == '/') {
            *s = '\0';
            mkdir(buf, 0755);
            *s = '/';
        }
    }
    free(buf);
}

/*
 * The fault-free reference: every rank r of the trainer run alone with the
 * same seed (--no-graft, GRAFT_RANK=r). The trainer's data parallelism has
 * every group compute the same global batch, so one group alone ends where
 * G fault-free groups end; the runtime is not involved at all, which is
 * what makes it a reference.
 */
static graft_status_t sim_reference_run(const graft_sim_live_opts_t *o, const char *dir,
                                        char **hash_p)
{
    graft_status_t st = GRAFT_OK;
    char trainer_buf[PATH_MAX];
    const char *trainer = sim_trainer_path(trainer_buf, sizeof(trainer_buf));
    graft_sim_result_t ref;
    memset(&ref, 0, sizeof(ref));
    ref.groups = 1;
    ref.ranks = o->ranks;
    ref.completed = 1;
    ref.rank_hashes = calloc((size_t)o->ranks, sizeof(char *));
    if (ref.rank_hashes == NULL) {
        return GRAFT_ENOMEM;
    }
    for (int k = 0; k < o->ranks && st == GRAFT_OK; k++) {
        char hp[PATH_MAX + 64], steps[32], seed[32], rank[32], blob[32];
        snprintf(hp, sizeof(hp), "%s/ref-hash-r%d.txt", dir, k);
        snprintf(steps, sizeof(steps), "%lld", o->steps);
        snprintf(seed, sizeof(seed), "%" PRIu64, o->seed);
        snprintf(rank, sizeof(rank), "%d", k);
        snprintf(blob, sizeof(blob), "%d", sim_ballast_mib);
        pid_t pid = fork();
        if (pid < 0) {
            st = GRAFT_ESYS;
            break;
        }
        if (pid == 0) {
            /* Dies with graft-sim, like the supervised trainers. */
            prctl(PR_SET_PDEATHSIG, SIGKILL);
            setenv("GRAFT_RANK", rank, 1);
            int devnull = open("/dev/null", O_WRONLY);
            if (devnull >= 0) {
                dup2(devnull, 1);
            }
            execl(trainer, trainer, "--no-graft", "--steps", steps, "--seed", seed,
                  "--state-hash-out", hp, "--blob-mib", blob, (char *)NULL);
            _exit(127);
        }
        int ws = 0;
        if (sim_stop_signal != 0) {
            kill(pid, SIGKILL); /* the signal came before the wait */
        }
        while (waitpid(pid, &ws, 0) < 0 && errno == EINTR) {
            if (sim_stop_signal != 0) {
                kill(pid, SIGKILL);
            }
        }
        if (!WIFEXITED(ws) || WEXITSTATUS(ws) != 0) {
            if (sim_stop_signal == 0) {
                fprintf(stderr, "graft-sim run: error: the reference trainer (rank %d) failed\n",
                        k);
            }
            st = GRAFT_EIO;
            break;
        }
        FILE *f = fopen(hp, "r");
        char buf[256] = "";
        if (f != NULL) {
            if (fgets(buf, sizeof(buf), f) == NULL) {
                buf[0] = '\0';
            }
            fclose(f);
        }
        buf[strcspn(buf, " \t\r\n")] = '\0';
        ref.rank_hashes[k] = strdup(buf);
    }
    const char *why = NULL;
    if (st == GRAFT_OK) {
        (void)graft_sim_verdict_judge(o, &ref, NULL, &why);
        if (ref.final_hash == NULL) {
            st = GRAFT_EIO;
        } else {
            *hash_p = ref.final_hash;
            ref.final_hash = NULL;
        }
    }
    graft_sim_result_clear(&ref);
    return st;
}

/* The reference hash: from the cache, or from a fault-free run stored there. */
static char *sim_reference(const graft_sim_live_opts_t *o, const char *tmp_dir, int *cached_p)
{
    char *path = sim_cache_path(o);
    char *hash = NULL;
    *cached_p = 0;
    FILE *f = path != NULL ? fopen(path, "r") : NULL;
    if (f != NULL) {
        char buf[256];
        if (fgets(buf, sizeof(buf), f) != NULL) {
            buf[strcspn(buf, " \t\r\n")] = '\0';
            if (buf[0] != '\0') {
                hash = strdup(buf);
                *cached_p = 1;
            }
        }
        fclose(f);
    }
    if (hash != NULL) {
        goto out;
    }
    if (sim_reference_run(o, tmp_dir, &hash) != GRAFT_OK || hash == NULL) {
        if (sim_stop_signal == 0) {
            fprintf(stderr, "graft-sim run: error: the fault-free reference did not complete\n");
        }
        goto out;
    }
    if (path != NULL) {
        sim_mkdirs(path);
        char tmp[PATH_MAX + 32];
        snprintf(tmp, sizeof(tmp), "%s.%d", path, (int)getpid());
        FILE *w = fopen(tmp, "w");
        if (w != NULL) {
            fprintf(w, "%s\n", hash);
            if (fclose(w) != 0 || rename(tmp, path) != 0) {
                unlink(tmp);
            }
        }
    }
out:
    free(path);
    return hash;
}

/* ------------------------------------------------------------- entry --- */

static char *sim_read_file(const char *path)
{
    FILE *f = fopen(path, "r");
    if (f == NULL) {
        return NULL;
    }
    char *buf = NULL;
    size_t len = 0;
    FILE *m = open_memstream(&buf, &len);
    char chunk[4096];
    size_t n;
    while (m != NULL && (n = fread(chunk, 1, sizeof(chunk), f)) > 0) {
        fwrite(chunk, 1, n, m);
    }
    fclose(f);
    if (m != NULL) {
        fclose(m);
    }
    return buf;
}

int graft_sim_live_run(const graft_sim_live_opts_t *opts)
{
    int rc = 1;
    graft_sim_live_opts_t o = *opts;
    graft_sim_schedule_t *sched = NULL;
    graft_etcd_cluster_t *cluster = NULL;
    char *text = NULL, *err = NULL, *ref = NULL, *plot = NULL;
    char tmp_persist[PATH_MAX] = "";
    graft_sim_result_t res;
    memset(&res, 0, sizeof(res));
    signal(SIGPIPE, SIG_IGN);
    sim_stop_signal = 0;
    sim_catch_stop_signals();

    if (o.netns && o.etcd_url != NULL) {
        /* The trainers in their namespaces must reach etcd: the embedded
         * one listens on the hub address; a given URL may be unreachable. */
        fprintf(stderr, "graft-sim run: error: --netns runs its own etcd; it cannot be combined "
                        "with --etcd\n");
        return 2;
    }
    if (o.schedule_path != NULL) {
        text = sim_read_file(o.schedule_path);
        if (text == NULL) {
            fprintf(stderr, "graft-sim run: error: --schedule: cannot read '%s': %s\n",
                    o.schedule_path, strerror(errno));
            return 2;
        }
    }
    graft_status_t st = graft_sim_schedule_plan(&o, text, &sched, &err);
    if (st != GRAFT_OK) {
        fprintf(stderr, "graft-sim run: error: schedule%s%s: %s (%s)\n",
                o.schedule_path ? " " : "", o.schedule_path ? o.schedule_path : "",
                err ? err : "invalid", graft_status_name(st));
        rc = 2;
        goto out;
    }
    /* Ballast only where it is needed: a plan that kills donors. */
    sim_ballast_mib = 0;
    for (size_t i = 0; i < sched->n_events; i++) {
        if (sched->events[i].kind == GRAFT_SIM_KILL_DONOR) {
            sim_ballast_mib = SIM_BALLAST_MIB;
        }
    }
    const char *bm = getenv("GRAFT_SIM_BALLAST_MIB");
    if (bm != NULL && bm[0] != '\0') {
        char *end = NULL;
        long v = strtol(bm, &end, 10);
        if (*end != '\0' || v < 0 || v > 4096) {
            fprintf(stderr, "graft-sim run: error: GRAFT_SIM_BALLAST_MIB: '%s' is not 0..4096\n",
                    bm);
            rc = 2;
            goto out;
        }
        sim_ballast_mib = (int)v;
    }
    /* Simulated compute per step. Without it a steady step of the example
     * trainer takes well under a millisecond (the steady path involves no
     * etcd), so a whole run passes between two looks of the injector and
     * no failure lands at the step it was planned for. */
    sim_step_ms = SIM_STEP_MS;
    const char *sm = getenv("GRAFT_SIM_STEP_MS");
    if (sm != NULL && sm[0] != '\0') {
        char *end = NULL;
        long v = strtol(sm, &end, 10);
        if (*end != '\0' || v < 0 || v > 60000) {
            fprintf(stderr, "graft-sim run: error: GRAFT_SIM_STEP_MS: '%s' is not 0..60000\n",
                    sm);
            rc = 2;
            goto out;
        }
        sim_step_ms = (int)v;
    }
    const char *dump = getenv("GRAFT_SIM_PLAN_ONLY");
    if (dump != NULL && dump[0] == '1') {
        /* Print the plan and stop: scripts and tests compare plans this way. */
        json_t *j = graft_sim_schedule_json(sched);
        char *s = j ? json_dumps(j, JSON_COMPACT) : NULL;
        printf("%s\n", s ? s : "null");
        free(s);
        json_decref(j);
        rc = 0;
        goto out;
    }
    /* Persistent checkpoints: the user's root, or one in a temp dir, so a
     * disaster always has something to restore from. */
    snprintf(tmp_persist, sizeof(tmp_persist), "%s/graft-sim-persist-XXXXXX",
             getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp");
    if (mkdtemp(tmp_persist) == NULL) {
        fprintf(stderr, "graft-sim run: error: mkdtemp: %s\n", strerror(errno));
        goto out;
    }
    char run_root[PATH_MAX + 16];
    if (o.persist_root != NULL) {
        snprintf(run_root, sizeof(run_root), "%s", o.persist_root);
        sim_mkdirs(run_root);
        mkdir(run_root, 0755);
    } else {
        snprintf(run_root, sizeof(run_root), "%s/run", tmp_persist);
        mkdir(run_root, 0755);
        o.persist_every = o.steps >= 10 ? o.steps / 10 : 1;
    }
    graft_etcd_server_opts_t eopts;
    memset(&eopts, 0, sizeof(eopts));
    const char *const etcd_info[] = {"--log-level=info", NULL};
    if (sim_keep()) {
        eopts.extra_args = etcd_info;
    }
    if (o.netns) {
        char tbuf[PATH_MAX];
        const char *rate = getenv("GRAFT_SIM_NETNS_RATE");
        st = graft_sim_netns_create(o.groups, rate != NULL && rate[0] ? rate : "1gbit",
                                    sim_trainer_path(tbuf, sizeof(tbuf)), &sim_net);
        if (st != GRAFT_OK) {
            if (st == GRAFT_ENOTSUP || st == GRAFT_EINVAL) {
                rc = 2;
            }
            goto out;
        }
        /* The namespaces' own handlers tore them down during the build;
         * from here the run's cleanup does. */
        sim_catch_stop_signals();
        eopts.binary = graft_sim_netns_etcd(sim_net);
        printf("graft-sim run: --netns: %d groups in namespaces gsim%d-1..%d, links %s, hub %s\n",
               o.groups, (int)getpid(), o.groups, rate != NULL && rate[0] ? rate : "1gbit",
               graft_sim_netns_hub(sim_net));
    }
    const char *endpoint = o.etcd_url;
    if (endpoint == NULL) {
        size_t members = o.etcd_members > 1 ? (size_t)o.etcd_members : 1;
        st = graft_etcd_cluster_start(&eopts, members, &cluster);
        if (st != GRAFT_OK) {
            fprintf(stderr, "graft-sim run: error: cannot start the embedded etcd: %s\n",
                    graft_status_string(st));
            goto out;
        }
        endpoint = graft_etcd_cluster_endpoints(cluster);
    }
    printf("graft-sim run: %d groups x %d ranks, %lld steps, seed %" PRIu64 ", %s, %zu failures "
           "planned, etcd %s%s\n",
           o.groups, o.ranks, o.steps, o.seed,
           o.mode == GRAFT_SIM_LIVE_STRICT ? "strict" : "elastic", sched->n_events, endpoint,
           cluster == NULL                          ? ""
           : graft_etcd_cluster_size(cluster) == 1 ? " (embedded)"
                                                   : " (embedded cluster)");
    fflush(stdout);
    int cached = 0;
    if (o.mode == GRAFT_SIM_LIVE_STRICT) {
        ref = sim_reference(&o, tmp_persist, &cached);
        if (ref == NULL) {
            goto out;
        }
        printf("graft-sim: reference state hash %s%s\n", ref, cached ? " (cached)" : "");
    }
    st = sim_run_once(&o, sched, cluster, endpoint, "run", run_root, &res);
    if (st != GRAFT_OK) {
        goto out;
    }
    const char *why = NULL;
    const char *verdict = graft_sim_verdict_judge(&o, &res, ref, &why);
    if (o.plot_path != NULL) {
        plot = strdup(o.plot_path);
    } else if (o.json_path != NULL) {
        size_t n = strlen(o.json_path);
        if (n > 5 && strcmp(o.json_path + n - 5, ".json") == 0) {
            n -= 5;
        }
        if (asprintf(&plot, "%.*s.svg", (int)n, o.json_path) < 0) {
            plot = NULL;
        }
    }
    if (plot != NULL && graft_sim_timeline_svg(plot, &o, &res, verdict) != 0) {
        fprintf(stderr, "graft-sim run: warning: cannot write %s: %s\n", plot, strerror(errno));
        free(plot);
        plot = NULL;
    }
    graft_sim_report_text(stdout, &o, sched, &res, verdict, why, ref, plot);
    if (o.json_path != NULL) {
        json_t *j = graft_sim_report_json(&o, sched, &res, verdict, why, ref);
        if (j == NULL || json_dump_file(j, o.json_path, JSON_INDENT(2)) != 0) {
            fprintf(stderr, "graft-sim run: error: cannot write %s\n", o.json_path);
            json_decref(j);
            goto out;
        }
        json_decref(j);
    }
    rc = strcmp(verdict, "FAILED") == 0 ? 1 : 0;
out:
    fflush(stdout);
    graft_sim_result_clear(&res);
    graft_etcd_cluster_destroy(cluster);
    graft_sim_netns_destroy(sim_net);
    sim_net = NULL;
    if (tmp_persist[0] != '\0' && strstr(tmp_persist, "XXXXXX") == NULL) {
        char cmd[PATH_MAX + 16];
        snprintf(cmd, sizeof(cmd), "rm -rf '%s'", tmp_persist);
        if (system(cmd) != 0) {
            fprintf(stderr, "graft-sim run: warning: could not remove %s\n", tmp_persist);
        }
    }
    graft_sim_schedule_destroy(sched);
    free(text);
    free(err);
    free(ref);
    free(plot);
    if (sim_stop_signal != 0) {
        fprintf(stderr, "graft-sim run: stopped by %s; trainers, etcd and temporary "
                        "directories were cleaned up\n", strsignal(sim_stop_signal));
        rc = 128 + sim_stop_signal;
    }
    return rc;
}
