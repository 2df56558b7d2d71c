/*
 * What one live run records, shared by the engine (sim_live.c with
 * sim_observe.c, sim_inject.c and sim_reference.c), the verdict and report
 * (sim_verdict.c) and the timeline plot (sim_timeline.c); and, at the end,
 * the engine's own state, shared by its parts.
 */
#ifndef GRAFT_SIM_LIVE_INT_H
#define GRAFT_SIM_LIVE_INT_H

#include "sim_netns.h"
#include "sim_schedule.h"
#include "sim_supervisor.h"

#include "etcd_launcher.h"
#include <graft/membership.h>

#include <jansson.h>
#include <limits.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>

/** One observed recovery: from the failure to the group computing again. */
typedef struct graft_sim_recovery {
    graft_sim_kind_t kind;
    const char *role; /**< "group", "rank", "donor", "job" (disaster), "etcd" */
    int group;        /**< -1: every group */
    int rank;         /**< -1: every rank of the group */
    double t_fail, t_detect, t_restart, t_rejoin, t_healed; /**< s since start; <0: not seen */
    long long step_at_fail;  /**< disaster: the highest step logged before it */
    long long restored_step; /**< disaster: the step the job restarted from (the step
                                  before the first commit logged after it) */
    long long corrupted_step; /**< disaster with corrupt: the checkpoint whose shard was
                                   corrupted (-1: none) */
    long long checkpoint_step; /**< disaster: the newest complete checkpoint not corrupted
                                    when every rank was dead, the one the job should
                                    restart from (-1: none) */
    int promoted_slots; /**< once healed: its slots a spare waiting at the failure took */
    int spawned_slots;  /**< once healed: its slots given a process started for them */
    int done;
} graft_sim_recovery_t;

/** One progress sample. */
typedef struct graft_sim_sample {
    double t;
    long long step;
    int healthy;
    uint64_t quorum_id;
} graft_sim_sample_t;

/** One injected failure, in injection order. */
typedef struct graft_sim_injected {
    double t;
    size_t plan_index;
    graft_sim_event_t ev; /**< kill_donor, cut_donor: ev.rank/.group as planned */
    int donor_group;      /**< kill_donor: the donor actually killed; cut_donor: the donor
                               group cut off the recipient; else -1 */
    int donor_rank;       /**< kill_donor, cut_donor: the donor rank seen serving (or
                               picked on the fallback) */
    long long donor_step; /**< kill_donor, cut_donor: the step it was serving (-1: acted
                               on the fallback) */
    double donor_t;       /**< kill_donor, cut_donor: when it was killed or cut, s */
    int donor_serving;    /**< kill_donor, cut_donor: acted on its endpoint's "serving"
                               signal */
    int donor_mid_serve;  /**< kill_donor, cut_donor: the recipient's heal of donor_step
                               reported that donor lost with chunks read or in flight */
    int donor_heal_ok;    /**< kill_donor, cut_donor: that heal's outcome; -1: not seen */
    double link_restored_t; /**< --netns kinds: when the link was restored, s; <0: not yet */
    int etcd_member;      /**< etcd_leader_kill: the member killed (the leader), else -1 */
    int etcd_new_leader;  /**< etcd_leader_kill: the member that led next; -1: not seen */
    double etcd_elected_t; /**< etcd_leader_kill: when it was seen leading, s; <0: not seen */
    double etcd_restart_t; /**< etcd_leader_kill: when the killed member was back, s */
} graft_sim_injected_t;

/** Everything one run produced. */
typedef struct graft_sim_result {
    int completed;         /**< every process finished its steps (elastic: or stragglers were ended) */
    int stragglers;        /**< elastic: ranks ended without finishing */
    char *error;           /**< why not, when not */
    double wall_s;
    char **rank_hashes;    /**< groups * ranks final hashes ("" when missing) */
    int groups, ranks;
    char *final_hash;      /**< combined over group 0's ranks, or NULL */
    int groups_agree;      /**< every group's ranks hold the same hashes */
    long long commit_checks;     /**< (epoch, step, rank) commits compared with the first */
    long long commit_mismatches; /**< of which groups disagreed */
    long long *epoch_checks;     /**< commit_checks per epoch (between disasters) */
    size_t n_epochs;
    long long steps_committed;   /**< the highest step some group's every rank logged */
    long long steps_lost;        /**< commits logged again at a step already logged (a
                                      rollback), the most of any (group, rank) */
    long *disaster_offs;         /**< per disaster, per (group, rank): bytes of its hash log
                                      when every rank was dead (the epochs' boundaries) */
    size_t n_disasters;
    unsigned long long bytes_transferred; /**< from the runtime's recovery_done events */
    unsigned long long heals_reported;    /**< recovery_done events with ok */
    int ballast_mib;                      /**< the trainers' --blob-mib (0: none) */
    graft_sim_injected_t *injected;
    size_t n_injected, cap_injected;
    size_t n_skipped; /**< planned but not injected (the run ended first) */
    graft_sim_recovery_t *recoveries;
    size_t n_recoveries, cap_recoveries;
    graft_sim_sample_t *samples;
    size_t n_samples, cap_samples;
    int spares;                           /**< --spares: spare groups (0: none) */
    int follow;                           /**< --follow: they follow the state */
    uint32_t spawn_delay_ms;              /**< --spawn-delay-ms */
    graft_sim_spare_stats_t spare_stats;  /**< the supervisor's, at the end */
    int evicted;                          /**< dead slot processes' records evicted */
    long spares_registered;               /**< spares/ records in etcd at the last look
                                               before a slot finished; -1: never seen */
    double spares_registered_t;           /**< when that look was, s */
} graft_sim_result_t;

/** Free a result's contents. */
void graft_sim_result_clear(graft_sim_result_t *res);

/**
 * Read the hash files and the trainers' logs into @p res and judge it.
 * Returns the verdict string ("bit-exact", "consistent" or "FAILED") and
 * sets *why_p (static or NULL) on failure.
 */
const char *graft_sim_verdict_judge(const graft_sim_live_opts_t *opts, graft_sim_result_t *res,
                                    const char *reference_hash, const char **why_p);

/**
 * Read the trainers' per-commit hash logs in @p dir: compare them across
 * groups (elastic), and measure steps_committed, steps_lost and each
 * disaster's step_at_fail and restored_step.
 */
void graft_sim_verdict_scan_logs(graft_sim_result_t *res, const char *dir, int groups, int ranks,
                                 int elastic);

/** Text summary of a run. */
void graft_sim_report_text(FILE *out, const graft_sim_live_opts_t *opts,
                           const graft_sim_schedule_t *sched, const graft_sim_result_t *res,
                           const char *verdict, const char *why, const char *reference_hash,
                           const char *plot_path);

/** The --json report; NULL when out of memory. */
json_t *graft_sim_report_json(const graft_sim_live_opts_t *opts, const graft_sim_schedule_t *sched,
                              const graft_sim_result_t *res, const char *verdict, const char *why,
                              const char *reference_hash);

/** Write the SVG timeline and recovery-time distribution; 0 or -1 (errno). */
int graft_sim_timeline_svg(const char *path, const graft_sim_live_opts_t *opts,
                           const graft_sim_result_t *res, const char *verdict);

/* ------------------------------------------------------ replacements --- */

/** Failure to first commit of the recoveries whose slots were all taken by
 *  spares waiting at the failure (promoted) or all given processes started
 *  after it (respawned: started for the slot, or spares started after the
 *  failure because every spare was in use); kill_rank, kill_group,
 *  kill_donor and hang only (sim_report_spares.c). */
typedef struct graft_sim_replacement_summary {
    size_t n_promoted, n_respawned, n_both;
    double promoted_median, promoted_max;   /**< s; NAN: none */
    double respawned_median, respawned_max; /**< s; NAN: none */
    /** Promoted ones: the old record gone (detect) to the spare's record
     *  in the view (rejoin), the promotion itself; what `graft-sim model
     *  --bench-json` reads as spare_seconds. */
    size_t n_promote;
    double promote_median, promote_max;
} graft_sim_replacement_summary_t;

/** Summarize the run's replacements into *s_p. */
void graft_sim_replacement_summary(const graft_sim_result_t *res,
                                   graft_sim_replacement_summary_t *s_p);

/** The text report's lines on the spawn delay, the spares and the replacements. */
void graft_sim_report_replacements_text(FILE *out, const graft_sim_result_t *res);

/** The --json report's spawn_delay_ms, spares and kill_to_first_commit_seconds. */
void graft_sim_report_replacements_json(json_t *j, const graft_sim_result_t *res);

/** A recovery's promoted, replaced_by and kill_to_first_commit_seconds. */
void graft_sim_report_recovery_json(json_t *e, const graft_sim_recovery_t *rc);

/* ------------------------------------------------ etcd leader kills --- */

/** How far around an etcd_leader_kill its stall is looked for, s. */
#define GRAFT_SIM_STALL_WINDOW_S 3.0

/** What the etcd_leader_kills of a run cost (sim_stall.c). */
typedef struct graft_sim_leader_summary {
    size_t n;          /**< etcd_leader_kills injected */
    size_t n_isolated; /**< of them, with no other failure within the window */
    double stall_median, stall_max; /**< over the isolated ones, s; NAN: none */
    size_t n_elected;  /**< kills after which another member was seen leading */
    double elect_median, elect_max; /**< kill to that sighting, s; NAN: none */
    double step_gap_median;         /**< what a step costs in this run, s */
} graft_sim_leader_summary_t;

/** Sort v[0..n) and give its median and max (NAN for n == 0). */
void graft_sim_median_max(double *v, size_t n, double *med_p, double *max_p);

/**
 * The longest stretch in which the job's step stood still among those that
 * end after @p t_kill and begin before t_kill + GRAFT_SIM_STALL_WINDOW_S,
 * counted from t_kill at the earliest; NAN without samples there.
 */
double graft_sim_stall_after(const graft_sim_result_t *res, double t_kill);

/** The widest interval between two samples in that window: how finely the
 *  stall was measured. NAN without samples there. */
double graft_sim_stall_resolution(const graft_sim_result_t *res, double t_kill);

/** 1 when no other injected failure lies within GRAFT_SIM_STALL_WINDOW_S of
 *  injected[i], on either side. */
int graft_sim_stall_isolated(const graft_sim_result_t *res, size_t i);

/** Summarize the run's etcd_leader_kills into *s_p. */
void graft_sim_leader_summary(const graft_sim_result_t *res, graft_sim_leader_summary_t *s_p);

/* ------------------------------------------------------- the engine --- */

/*
 * The parts of the live engine: sim_live.c sets a run up and runs its loop,
 * which calls the observer (sim_observe.c) and the injector (sim_inject.c)
 * every tick; sim_reference.c gives a strict run its fault-free reference.
 */

/* What the observer knows of one (group, rank): slot group * ranks + rank. */
typedef struct graft_sim_slot {
    int present;          /* a member record is in the view */
    uint64_t incarnation; /* of that record */
    long long step;       /* last step in the rank's --hash-log, -1: none yet */
    uint64_t commits;     /* lines read from it */
    long off;             /* bytes of it consumed */
    long role_off;        /* bytes of its --role-log consumed */
} graft_sim_slot_t;

/* An open recovery's per-slot bookkeeping. */
typedef struct graft_sim_open {
    size_t rec;            /* index into res->recoveries */
    int *slots;            /* slot indices it covers */
    uint64_t *inc0;        /* their incarnation when they failed (0: none) */
    int *starts0;          /* supervisor starts when they failed */
    int *promotions0;      /* spares promoted into them when they failed */
    size_t n;
    uint64_t *commits0;    /* their commit counts when every slot was back */
    uint64_t total0;       /* etcd: all commits when etcd was back */
} graft_sim_open_t;

/* --netns: the one network fault active at a time, and what its restore
 * undoes (graft_sim_inject_link_restore). */
typedef struct graft_sim_link_fault {
    graft_sim_kind_t kind; /* partition, isolate, netem, throttle or cut_donor */
    int group;             /* the group whose link it is; -1: none active */
    int peer;              /* cut_donor: the donor group cut off group; else -1 */
    size_t inj;            /* its entry in res->injected */
    uint64_t until;        /* when it is restored */
} graft_sim_link_fault_t;

/* One run of the engine (graft_sim_run_once() in sim_live.c). */
typedef struct graft_sim_run {
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
    /* --persist-remote: the job's prefix in the bucket (else empty), and
     * when the store was last seen holding a complete checkpoint. */
    char remote_url[PATH_MAX];
    long long remote_newest;     /* its newest complete checkpoint; -1: none seen */
    uint64_t remote_checked_ns;
    /* Checkpoints a disaster corrupted (their step directories' steps):
     * no longer restorable, so no longer counted before the next one. */
    long long corrupted[256];
    int n_corrupted;
    graft_sim_sup_t *sup;
    graft_membership_t *obs;
    char host[256];                /* this machine: the host the trainers' records name */
    graft_etcd_config_t ecfg;
    graft_sim_result_t *res;
    uint64_t t0;
    int nslots;
    graft_sim_slot_t *slots;
    long long job_step;
    int healthy;
    uint64_t quorum_id;
    graft_quorum_t *quorum;
    graft_sim_open_t *open;
    size_t n_open, cap_open;
    size_t next_step_ev, next_time_ev, n_step_ev;
    unsigned char *ev_done;      /* per planned event: injected */
    uint64_t last_inject_ns;
    /* pending parts of events that take time */
    int donor_pending;           /* kill_donor or cut_donor waiting for its recipient's
                                    heal to start (donor_ev.kind says which) */
    graft_sim_event_t donor_ev;
    uint64_t donor_since;
    size_t donor_inj;
    int hang_n;
    struct { int g, r; uint64_t until; } hangs[16];
    uint64_t etcd_up_at;         /* etcd stopped; restart due */
    graft_sim_link_fault_t link; /* --netns: the network fault active */
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
} graft_sim_run_t;

/** Seconds since the run started. */
static inline double graft_sim_run_elapsed(const graft_sim_run_t *r)
{
    return (double)(graft_sim_now_ns() - r->t0) / 1e9;
}

/* sim_util.c */

/** --netns: the namespaces of this run (NULL without --netns). */
extern graft_sim_netns_t *graft_sim_net;

/** Make room in *arr (*cap elements of elem bytes) for element n; 0, or -1 when out of
 *  memory (*arr unchanged). */
int graft_sim_grow(void **arr, size_t *cap, size_t n, size_t elem);

/** Record why the run failed; the first reason wins. */
void graft_sim_run_fail(graft_sim_run_t *r, const char *fmt, ...) GRAFT_PRINTF(2, 3);

/** Create the directories above path (not path itself). */
void graft_sim_mkdirs(const char *path);

/* sim_live.c */

/** The trainers' --blob-mib, the same for the reference (0: none). */
extern int graft_sim_ballast_mib;
/** The signal that stops the run at its next tick (SIGINT, SIGTERM, SIGHUP); 0: none. */
extern volatile sig_atomic_t graft_sim_stop_signal;

/** Milliseconds of simulated compute per trainer step (GRAFT_SIM_STEP_MS; 0: none). */
extern int graft_sim_step_ms;

/** SIGINT, SIGTERM and SIGHUP set graft_sim_stop_signal from now on. */
void graft_sim_catch_stop_signals(void);

/** GRAFT_SIM_KEEP set to anything but "" or "0": keep the run directory. */
bool graft_sim_keep(void);

/** One run of the engine: the given schedule (empty for the reference)
 *  against a fresh set of trainers under a job name of its own. */
graft_status_t graft_sim_run_once(const graft_sim_live_opts_t *o,
                                  const graft_sim_schedule_t *sched,
                                  graft_etcd_cluster_t *cluster, const char *endpoint,
                                  const char *tag, const char *persist_root,
                                  graft_sim_result_t *res);

/** The trainer: GRAFT_SIM_TRAINER, else train_mlp beside graft-sim (written into buf). */
const char *graft_sim_trainer_path(char *buf, size_t len);

/* sim_tiers.c */

/** The complete checkpoints of the run's local root not corrupted on
 *  purpose; the newest one's directory name into newest (may be NULL). */
int graft_sim_complete_checkpoints(const graft_sim_run_t *r, char *newest, size_t cap);

/** Flip a byte in ONE shard of the newest complete checkpoint (its rank
 *  from the seed and plan_index); its step, -1 when none was corrupted. */
long long graft_sim_corrupt_newest(graft_sim_run_t *r, size_t plan_index);

/** The object store's newest complete checkpoint (-1: none, or no store),
 *  asked at most every 500 ms (remote_checked_ns = 0 forces a look). */
long long graft_sim_remote_newest(graft_sim_run_t *r);

/** lose_disks: empty the job's local checkpoint root. */
void graft_sim_wipe_local_root(graft_sim_run_t *r);

/* sim_observe.c */

/** Read the membership view, the latest quorum and the hash logs; take a sample. */
void graft_sim_observe(graft_sim_run_t *r);

/** Read the job's new events (every 0.5 s at most unless @p force). */
void graft_sim_observe_events(graft_sim_run_t *r, int force);

/** Open a recovery from a failure of @p kind injected now (-1 group or rank: all). */
void graft_sim_recovery_open(graft_sim_run_t *r, graft_sim_kind_t kind, const char *role,
                             int group, int rank);

/** Stop following open recovery @p i (its record stays in res->recoveries). */
void graft_sim_recovery_close(graft_sim_run_t *r, size_t i);

/** Time the open recoveries' phases from what was observed; close the healed ones. */
void graft_sim_recovery_track(graft_sim_run_t *r);

/* sim_inject.c */

/** Inject the first planned failure that is due and whose preconditions
 *  hold; one held back does not hold back those planned after it. */
void graft_sim_inject_due(graft_sim_run_t *r);

/** Planned failures not injected (a kill_donor whose donor part is still
 *  pending counts once more). */
size_t graft_sim_inject_not_reached(const graft_sim_run_t *r);

/** End what takes time: hangs, network faults, etcd and etcd members down, a
 *  kill_donor or cut_donor. */
void graft_sim_inject_pending(graft_sim_run_t *r);

/** A kill_donor or cut_donor pending: kill or cut the donor once it serves the
 *  recipient. */
void graft_sim_inject_donor_poll(graft_sim_run_t *r);

/** After an etcd_leader_kill (now == UINT64_MAX: the run ended, restart at once). */
void graft_sim_inject_leader_pending(graft_sim_run_t *r, uint64_t now);

/** --netns: end the active network fault (r->link): links up, routes removed,
 *  the base shape back. */
void graft_sim_inject_link_restore(graft_sim_run_t *r);

/* sim_reference.c */

/** The reference state hash (malloc'd; NULL on failure), *cached_p 1 when from the cache. */
char *graft_sim_reference_hash(const graft_sim_live_opts_t *o, const char *tmp_dir,
                               int *cached_p);

#endif /* GRAFT_SIM_LIVE_INT_H */
