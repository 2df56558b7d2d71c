/*
 * The live engine of `graft-sim run`: an embedded etcd (unless --etcd), the
 * supervisor with G x R trainers, the injector walking the planned schedule,
 * and an observer that follows the job.
 *
 * The observer lives in sim_observe.c, the injector in sim_inject.c and the
 * fault-free reference in sim_reference.c; this file runs them: one run's
 * setup, loop and teardown. The entry point (the plan, the knobs, etcd,
 * the reference and the report) is sim_live_main.c.
 */
#include "sim_live.h"
#include "sim_live_int.h"
#include "sim_netns.h"
#include "sim_supervisor.h"

#include "etcd_launcher.h"
#include <graft/membership.h>

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#define SIM_TICK_US 20000
#define SIM_LEASE_TTL_MS 1000
#define SIM_DONOR_TICK_US 2000 /* role-log polling while a kill_donor waits */

/* The trainers' --blob-mib, the same for the reference (0: none). */
int graft_sim_ballast_mib;
/* Milliseconds of simulated compute per trainer step (GRAFT_SIM_STEP_MS). */
int graft_sim_step_ms;

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

/* SIGINT, SIGTERM and SIGHUP stop a run at its next tick; it then cleans
 * up like any other end (trainers, etcd, namespaces, temp directories) and
 * exits 128 + the signal. */
volatile sig_atomic_t graft_sim_stop_signal;

static void sim_on_stop_signal(int sig)
{
    graft_sim_stop_signal = sig;
}

void graft_sim_catch_stop_signals(void)
{
    struct sigaction sa;
    memset(&sa, 0, sizeof(sa));
    sa.sa_handler = sim_on_stop_signal;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGHUP, &sa, NULL);
}

/* ---------------------------------------------------------- progress --- */

static void sim_progress(graft_sim_run_t *r, int final)
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
                     graft_sim_run_elapsed(r), r->job_step, r->o->steps, r->healthy, r->o->groups,
                     r->quorum_id, r->res->n_recoveries - open, open, r->res->n_injected,
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

/* A run that timed out: what each rank still running last logged (the
 * run's directory is gone by the time someone reads the error). */
static void sim_unfinished_logs(graft_sim_run_t *r)
{
    for (int i = 0; i < r->nslots; i++) {
        int g = i / r->o->ranks, k = i % r->o->ranks;
        if (graft_sim_sup_state(r->sup, g, k) != GRAFT_SIM_PROC_DONE)
            graft_sim_sup_log_tail(r->sup, g, k, 1500);
    }
}

/* ------------------------------------------------------------- a run --- */

/* GRAFT_SIM_KEEP set to anything but "" or "0": keep the run directory,
 * with the embedded etcd's log at info level. */
bool graft_sim_keep(void)
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
                                         strcmp(k, "GRAFT_PERSIST_ROOT") != 0 &&
                                         strcmp(k, "GRAFT_PERSIST_REMOTE") != 0
                                     ? user
                                     : v) < 0) {
        s = NULL;
    }
    return s;
}

/*
 * With --netns the trainers reach etcd on the hub address, plain http and
 * not loopback, where the library does not keep the job's secret in etcd
 * (docs/SECURITY.md): the run gives them one in a file of its directory,
 * readable by its owner only.
 */
static graft_status_t sim_secret_file(const char *dir, char *path, size_t len)
{
    unsigned char raw[32];
    char hex[2 * sizeof(raw) + 2];
    snprintf(path, len, "%s/job-secret", dir);
    int rnd = open("/dev/urandom", O_RDONLY | O_CLOEXEC);
    if (rnd < 0 || read(rnd, raw, sizeof(raw)) != (ssize_t)sizeof(raw)) {
        if (rnd >= 0)
            close(rnd);
        fprintf(stderr, "graft-sim run: error: /dev/urandom: %s\n", strerror(errno));
        return GRAFT_ESYS;
    }
    close(rnd);
    for (size_t i = 0; i < sizeof(raw); i++)
        snprintf(hex + 2 * i, 3, "%02x", raw[i]);
    hex[2 * sizeof(raw)] = '\n';
    int fd = open(path, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
    bool ok = fd >= 0 && write(fd, hex, 2 * sizeof(raw) + 1) == (ssize_t)(2 * sizeof(raw) + 1);
    if (fd >= 0 && close(fd) != 0)
        ok = false;
    if (!ok) {
        fprintf(stderr, "graft-sim run: error: %s: %s\n", path, strerror(errno));
        return GRAFT_ESYS;
    }
    return GRAFT_OK;
}

const char *graft_sim_trainer_path(char *buf, size_t len)
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
 * What one run owns besides its graft_sim_run_t: the trainers' environment
 * and arguments, which the supervisor reads for as long as it lives.
 */
typedef struct {
    graft_sim_run_t r;
    char *env[16];
    int n_env;
    int *master_ports; /* per group, --torch-world */
    char trainer_buf[PATH_MAX];
    const char *trainer;
    char net_endpoint[128];
    const char *trainer_endpoint;
    char proot[PATH_MAX + 160];
    char secret_path[PATH_MAX + 16];
    graft_sim_sup_config_t sc;
    char ballast[24], step_ms[24];
    const char *extra[5];
} sim_once_t;

static void sim_once_init(sim_once_t *s, const graft_sim_live_opts_t *o,
                          const graft_sim_schedule_t *sched, graft_etcd_cluster_t *cluster,
                          const char *endpoint, const char *tag, const char *persist_root,
                          graft_sim_result_t *res)
{
    graft_sim_run_t *r = &s->r;
    memset(res, 0, sizeof(*res));
    r->o = o;
    r->sched = sched;
    r->cluster = cluster;
    r->server = graft_etcd_cluster_size(cluster) == 1 ? graft_etcd_cluster_member(cluster, 0)
                                                      : NULL;
    r->endpoint = endpoint;
    r->lk_member = SIZE_MAX;
    r->lk_inj = SIZE_MAX;
    r->res = res;
    r->persist_root = persist_root;
    r->tty = isatty(STDOUT_FILENO) && strcmp(tag, "ref") != 0;
    r->nslots = o->groups * o->ranks;
    r->link.group = -1;
    r->link.peer = -1;
    r->link.inj = SIZE_MAX;
    res->groups = o->groups;
    res->ranks = o->ranks;
    res->spares = o->spares;
    res->follow = o->follow;
    res->spawn_delay_ms = o->spawn_delay_ms;
    res->spares_registered = -1;
    snprintf(r->job, sizeof(r->job), "sim-%d-%s-%" PRIx64, (int)getpid(), tag,
             (uint64_t)time(NULL));
    s->trainer = graft_sim_trainer_path(s->trainer_buf, sizeof(s->trainer_buf));
    /* --netns: trainers start through the wrapper that enters their
     * group's namespace, and reach etcd on the hub address. */
    s->trainer_endpoint = endpoint;
    if (graft_sim_net != NULL) {
        const char *port = strrchr(endpoint, ':');
        snprintf(s->net_endpoint, sizeof(s->net_endpoint), "http://%s%s",
                 graft_sim_netns_hub(graft_sim_net), port != NULL ? port : "");
        s->trainer_endpoint = s->net_endpoint;
    }
}

/* The trainers' environment (GRAFT_*), with the run's own persistent root
 * and, under --netns, the job's secret in a file of the run directory. */
static graft_status_t sim_once_env(sim_once_t *s)
{
    graft_sim_run_t *r = &s->r;
    const graft_sim_live_opts_t *o = r->o;
    char **env = s->env;
    int e = 0;
    /* Checkpoints of this job only: a root shared with earlier runs would
     * hand the first start a stranger's state. */
    snprintf(s->proot, sizeof(s->proot), "%s/%s", r->persist_root, r->job);
    mkdir(s->proot, 0755);
    r->persist_root = s->proot;
    env[e++] = sim_env("GRAFT_JOB", "%s", r->job);
    env[e++] = sim_env("GRAFT_ETCD_ENDPOINTS", "%s", s->trainer_endpoint);
    env[e++] = sim_env("GRAFT_GROUPS", "%d", o->groups);
    env[e++] = sim_env("GRAFT_RANKS_PER_GROUP", "%d", o->ranks);
    env[e++] = sim_env("GRAFT_MODE", "%s", o->mode == GRAFT_SIM_LIVE_STRICT ? "strict" : "elastic");
    env[e++] = sim_env("GRAFT_MIN_GROUPS", "%d",
                       o->mode == GRAFT_SIM_LIVE_STRICT ? o->groups
                                                        : (o->groups > 1 ? o->groups - 1 : 1));
    env[e++] = sim_env("GRAFT_LEASE_TTL_MS", "%d", SIM_LEASE_TTL_MS);
    env[e++] = sim_env("GRAFT_JOIN_TIMEOUT_MS", "%d", 1000);
    env[e++] = sim_env("GRAFT_PERSIST_ROOT", "%s", s->proot);
    env[e++] = sim_env("GRAFT_PERSIST_EVERY", "%lld", o->persist_every);
    if (o->persist_remote != NULL) {
        /* This job's own prefix in the bucket, as its own local root. */
        size_t n = strlen(o->persist_remote);
        while (n > 5 && o->persist_remote[n - 1] == '/')
            n--;
        snprintf(r->remote_url, sizeof(r->remote_url), "%.*s/%s", (int)n, o->persist_remote,
                 r->job);
        env[e++] = sim_env("GRAFT_PERSIST_REMOTE", "%s", r->remote_url);
        if (o->persist_remote_endpoint != NULL)
            env[e++] = sim_env("GRAFT_PERSIST_REMOTE_ENDPOINT", "%s",
                               o->persist_remote_endpoint);
    }
    /* Without --netns the trainers talk over loopback only: keep UCX off
     * the host's other interfaces, whose coming and going (another job's
     * veths) made every new UCX worker fail with "No such device" in a
     * soak run. The caller's own choice wins. */
    if (graft_sim_net == NULL && getenv("UCX_NET_DEVICES") == NULL)
        env[e++] = sim_env("UCX_NET_DEVICES", "%s", "lo");
    s->n_env = e;
    if (graft_sim_net != NULL && getenv("GRAFT_JOB_SECRET") == NULL) {
        graft_status_t st = sim_secret_file(r->dir, s->secret_path, sizeof(s->secret_path));
        if (st != GRAFT_OK)
            return st;
        env[s->n_env++] = sim_env("GRAFT_JOB_SECRET_FILE", "%s", s->secret_path);
    }
    for (int i = 0; i < s->n_env; i++) {
        if (env[i] == NULL) {
            return GRAFT_ENOMEM;
        }
    }
    return GRAFT_OK;
}

/* The observer's membership handle on the run's job. */
static graft_status_t sim_once_observer(graft_sim_run_t *r)
{
    graft_status_t st = graft_etcd_endpoints_split(r->endpoint, &r->endpoints, &r->n_endpoints);
    if (st != GRAFT_OK) {
        fprintf(stderr, "graft-sim run: error: etcd endpoints '%s': %s\n", r->endpoint,
                graft_status_string(st));
        return st;
    }
    r->ecfg.endpoints = (const char *const *)r->endpoints;
    r->ecfg.n_endpoints = r->n_endpoints;
    r->ecfg.request_timeout_ms = 2000;
    if (r->n_endpoints > 1) {
        /* The observer runs in the loop that samples the job's step: a
         * read stuck on a member whose leader just died would hold the
         * samples up and overstate the stall. Give up on it soon; the
         * next tick asks again. */
        r->ecfg.request_timeout_ms = 300;
        r->ecfg.connect_timeout_ms = 200;
        r->ecfg.max_retries = GRAFT_ETCD_NO_RETRIES;
    }
    graft_membership_config_t mc;
    memset(&mc, 0, sizeof(mc));
    mc.job = r->job;
    mc.etcd = &r->ecfg;
    mc.observer = true;
    mc.ranks_per_group = (uint32_t)r->o->ranks;
    mc.min_groups = 1;
    st = graft_membership_create(&mc, &r->obs);
    if (st != GRAFT_OK) {
        fprintf(stderr, "graft-sim run: error: cannot observe job %s at %s: %s\n", r->job,
                r->endpoint, graft_status_string(st));
    }
    return st;
}

/* The supervisor's configuration: the trainer, its environment and its
 * extra arguments (the ballast, the simulated compute, --torch-world). */
static graft_status_t sim_once_sup_config(sim_once_t *s)
{
    const graft_sim_live_opts_t *o = s->r.o;
    graft_sim_sup_config_t *sc = &s->sc;
    memset(sc, 0, sizeof(*sc));
    sc->trainer = s->trainer;
    sc->env = (const char *const *)s->env;
    sc->dir = s->r.dir;
    sc->groups = o->groups;
    sc->ranks = o->ranks;
    sc->steps = o->steps;
    sc->seed = o->seed;
    sc->restart_delay_ms = o->spawn_delay_ms;
    sc->spares = o->spares;
    sc->spare_follow = o->follow;
    sc->max_restarts = 10 + (int)(s->r.sched->n_events * 2);
    sc->role_log = 1;
    size_t n_extra = 0;
    if (graft_sim_ballast_mib > 0) {
        snprintf(s->ballast, sizeof(s->ballast), "%d", graft_sim_ballast_mib);
        s->extra[n_extra++] = "--blob-mib";
        s->extra[n_extra++] = s->ballast;
    }
    if (graft_sim_step_ms > 0) {
        snprintf(s->step_ms, sizeof(s->step_ms), "%d", graft_sim_step_ms);
        s->extra[n_extra++] = "--step-delay-ms";
        s->extra[n_extra++] = s->step_ms;
    }
    sc->extra_args = s->extra;
    /* --torch-world: each group's rendezvous. */
    if (o->torch_world) {
        s->master_ports = calloc((size_t)o->groups, sizeof(int));
        graft_status_t st = s->master_ports == NULL
                                ? GRAFT_ENOMEM
                                : graft_sim_free_ports(o->groups, s->master_ports);
        if (st != GRAFT_OK) {
            return st;
        }
    }
    sc->master_ports = s->master_ports;
    return GRAFT_OK;
}

/* A run's setup: its slots, the trainers' environment, the observer, and
 * the supervisor with the trainers started. */
static graft_status_t sim_once_setup(sim_once_t *s)
{
    graft_sim_run_t *r = &s->r;
    r->slots = calloc((size_t)r->nslots, sizeof(*r->slots));
    if (r->slots == NULL) {
        return GRAFT_ENOMEM;
    }
    for (int i = 0; i < r->nslots; i++) {
        r->slots[i].step = -1;
    }
    if (gethostname(r->host, sizeof(r->host)) != 0)
        snprintf(r->host, sizeof(r->host), "unknown");
    r->host[sizeof(r->host) - 1] = '\0';
    graft_status_t st = sim_once_env(s);
    if (st == GRAFT_OK)
        st = sim_once_observer(r);
    if (st == GRAFT_OK)
        st = sim_once_sup_config(s);
    if (st != GRAFT_OK)
        return st;
    r->res->ballast_mib = graft_sim_ballast_mib;
    if (access(s->trainer, X_OK) != 0) {
        fprintf(stderr, "graft-sim run: error: trainer %s: %s (set GRAFT_SIM_TRAINER or build "
                        "examples/train_mlp)\n",
                s->trainer, strerror(errno));
        return GRAFT_ENOTFOUND;
    }
    if (graft_sim_net != NULL) {
        s->sc.trainer = graft_sim_netns_trainer(graft_sim_net);
    }
    r->t0 = graft_sim_now_ns();
    st = graft_sim_sup_create(&s->sc, &r->sup);
    if (st != GRAFT_OK) {
        return st;
    }
    while (r->n_step_ev < r->sched->n_events && r->sched->events[r->n_step_ev].at_step >= 0) {
        r->n_step_ev++;
    }
    r->next_time_ev = r->n_step_ev;
    r->ev_done = calloc(r->sched->n_events + 1, 1);
    return r->ev_done == NULL ? GRAFT_ENOMEM : GRAFT_OK;
}

/* Whether the run is over after this tick: every rank finished, the
 * stragglers' grace spent, a death strict mode cannot heal, or the time
 * out. *first_done_ns is when the first rank finished (0: none yet). */
static bool sim_once_over(graft_sim_run_t *r, uint64_t *first_done_ns, uint64_t timeout_ns)
{
    const graft_sim_live_opts_t *o = r->o;
    if (graft_sim_sup_done(r->sup) == r->nslots) {
        r->res->completed = 1;
        return true;
    }
    /* Elastic: once the groups still training have finished, a group
     * left behind may never see a quorum again (its peers are gone);
     * an orchestrator ends the job then. Give stragglers a grace. */
    if (graft_sim_sup_done(r->sup) > 0 && *first_done_ns == 0) {
        *first_done_ns = graft_sim_now_ns();
    }
    /* Strict: every quorum needs every group, and a finished rank has
     * left for good; a rank that dies now can never heal. */
    int dg, dr;
    if (o->mode == GRAFT_SIM_LIVE_STRICT && *first_done_ns != 0 &&
        graft_sim_sup_dead(r->sup, &dg, &dr)) {
        graft_sim_run_fail(r, "group %d rank %d died after a rank had finished its last "
                              "step: in strict mode no quorum can form again (see %s)",
                           dg, dr, graft_sim_sup_log_path(r->sup, dg, dr));
        graft_sim_sup_log_tail(r->sup, dg, dr, 3000);
        return true;
    }
    if (o->mode == GRAFT_SIM_LIVE_ELASTIC && *first_done_ns != 0 &&
        graft_sim_now_ns() - *first_done_ns > 5000000000ull) {
        r->res->completed = 1;
        r->res->stragglers = r->nslots - graft_sim_sup_done(r->sup);
        return true;
    }
    if (graft_sim_now_ns() - r->t0 > timeout_ns) {
        graft_sim_run_fail(r, "timed out after %.0f s at step %lld", (double)timeout_ns / 1e9,
                           r->job_step);
        sim_unfinished_logs(r);
        return true;
    }
    return false;
}

/* With spares, the supervisor is an orchestrator that keeps them: the
 * member records of the slot processes it saw die are evicted at once
 * (graft_membership_evict()), so a spare takes the slot without waiting
 * for the dead process's lease to lapse. A hung process is seen by no
 * waitpid(): its slot still waits for the lease. */
static void sim_once_evict(graft_sim_run_t *r)
{
    int g, k;
    pid_t pid;
    while (graft_sim_sup_next_death(r->sup, &g, &k, &pid)) {
        graft_status_t st = graft_membership_evict(r->obs, (uint32_t)g, (uint32_t)k, r->host,
                                                   (int32_t)pid);
        if (st == GRAFT_OK) {
            r->res->evicted++;
        } else if (st != GRAFT_ENOTFOUND && st != GRAFT_ESTATE) {
            fprintf(stderr, "graft-sim run: warning: evicting group %d rank %d (pid %d): %s; "
                            "its slot is free once the lease lapses\n",
                    g, k, (int)pid, graft_status_string(st));
        }
    }
}

/* A run's loop, one tick at a time: the supervisor, the observer and the
 * injector, until the run is over or stopped. */
static void sim_once_loop(sim_once_t *s)
{
    graft_sim_run_t *r = &s->r;
    const char *tmo = getenv("GRAFT_SIM_TIMEOUT_S");
    uint64_t timeout_ns = (uint64_t)(tmo != NULL ? atoi(tmo) : 600) * 1000000000ull;
    uint64_t first_done_ns = 0;
    for (;;) {
        if (graft_sim_stop_signal != 0) {
            graft_sim_run_fail(r, "stopped by %s", strsignal(graft_sim_stop_signal));
            break;
        }
        graft_status_t st = graft_sim_sup_poll(r->sup);
        if (st != GRAFT_OK) {
            if (st == GRAFT_ERANGE) {
                graft_sim_run_fail(r,
                                   "the supervisor gave up: a rank was started more than %d times "
                                   "(its trainer log says why)",
                                   s->sc.max_restarts);
            } else {
                graft_sim_run_fail(r, "the supervisor gave up: %s", graft_status_string(st));
            }
            break;
        }
        sim_once_evict(r);
        graft_sim_observe(r);
        graft_sim_observe_events(r, 0);
        graft_sim_recovery_track(r);
        graft_sim_inject_pending(r);
        graft_sim_inject_due(r);
        if (r->res->error != NULL) {
            break;
        }
        sim_progress(r, 0);
        if (sim_once_over(r, &first_done_ns, timeout_ns)) {
            break;
        }
        if (r->donor_pending) {
            /* A serve is short: watch for it closely. */
            for (int i = 0; i < SIM_TICK_US / SIM_DONOR_TICK_US && r->donor_pending; i++) {
                usleep(SIM_DONOR_TICK_US);
                graft_sim_inject_donor_poll(r);
            }
        } else {
            usleep(SIM_TICK_US);
        }
    }
}

/* A spare's per-slot files carry GRAFT_SIM_GROUP_PLACEHOLDER for the
 * trainer to fill in; a file named with it left in means a trainer that
 * does not follow the contract, whose commits the engine never saw. */
static void sim_once_placeholder_check(graft_sim_run_t *r)
{
    char path[PATH_MAX + 64];
    for (int k = 0; k < r->o->ranks; k++) {
        snprintf(path, sizeof(path), "%s/commits-g%s-r%d.txt", r->dir,
                 GRAFT_SIM_GROUP_PLACEHOLDER, k);
        if (access(path, F_OK) == 0) {
            graft_sim_run_fail(r, "a spare wrote %s: the trainer did not put its group in "
                                  "place of %s in its file names (docs/SIM.md, trainer "
                                  "contract)", path, GRAFT_SIM_GROUP_PLACEHOLDER);
            return;
        }
    }
}

/* After the loop: what is still broken restored (etcd, a killed member, a
 * cut link), the last observation, and each rank's final hash and logs
 * read before the trainers and their directory go. */
static void sim_once_finish(graft_sim_run_t *r)
{
    graft_sim_result_t *res = r->res;
    const graft_sim_live_opts_t *o = r->o;
    if (r->etcd_up_at != 0 && graft_etcd_server_restart(r->server) != GRAFT_OK) {
        graft_sim_run_fail(r, "could not restart etcd");
    }
    if (r->lk_member != SIZE_MAX) {
        /* The run ended before the killed member's time was up. */
        graft_sim_inject_leader_pending(r, UINT64_MAX);
    }
    if (r->link.group >= 0) {
        graft_sim_inject_link_restore(r);
    }
    graft_sim_observe(r);
    graft_sim_observe_events(r, 1);
    graft_sim_recovery_track(r);
    sim_progress(r, 1);
    res->wall_s = graft_sim_run_elapsed(r);
    res->n_skipped = graft_sim_inject_not_reached(r);
    res->rank_hashes = calloc((size_t)r->nslots, sizeof(char *));
    for (int i = 0; res->rank_hashes != NULL && i < r->nslots; i++) {
        FILE *f = fopen(graft_sim_sup_hash_path(r->sup, i / o->ranks, i % o->ranks), "r");
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
    graft_sim_sup_spare_stats(r->sup, &res->spare_stats);
    if (o->spares > 0) {
        sim_once_placeholder_check(r);
    }
    graft_sim_sup_destroy(r->sup);
    r->sup = NULL;
    /* The logs are read by the verdict before the directory goes. */
    graft_sim_verdict_scan_logs(res, r->dir, o->groups, o->ranks, o->mode == GRAFT_SIM_LIVE_ELASTIC);
}

/* The run directory removed, or kept (GRAFT_SIM_KEEP) with copies of the
 * embedded etcd's logs. */
static void sim_once_dir_done(const graft_sim_run_t *r)
{
    if (!graft_sim_keep()) {
        char cmd[PATH_MAX + 16];
        snprintf(cmd, sizeof(cmd), "rm -rf '%s'", r->dir);
        if (system(cmd) != 0) {
            fprintf(stderr, "graft-sim run: warning: could not remove %s\n", r->dir);
        }
        return;
    }
    /* The embedded etcd's logs go with the cluster: keep copies
     * (etcd.log, then etcd-m1.log, ... for the other members). */
    char cmd[2 * PATH_MAX + 48];
    for (size_t m = 0; m < graft_etcd_cluster_size(r->cluster); m++) {
        const char *elog = graft_etcd_server_log_path(graft_etcd_cluster_member(r->cluster, m));
        if (elog == NULL) {
            continue;
        }
        if (m == 0) {
            snprintf(cmd, sizeof(cmd), "cp '%s' '%s/etcd.log'", elog, r->dir);
        } else {
            snprintf(cmd, sizeof(cmd), "cp '%s' '%s/etcd-m%zu.log'", elog, r->dir, m);
        }
        if (system(cmd) != 0) {
            fprintf(stderr, "graft-sim run: warning: could not copy %s\n", elog);
        }
    }
    printf("graft-sim: kept the run directory %s\n", r->dir);
}

/* A run's teardown, whatever point its setup reached. */
static void sim_once_teardown(sim_once_t *s)
{
    graft_sim_run_t *r = &s->r;
    graft_sim_sup_destroy(r->sup);
    free(s->master_ports);
    graft_membership_destroy(r->obs);
    graft_membership_quorum_free(r->quorum);
    while (r->n_open > 0) {
        graft_sim_recovery_close(r, 0);
    }
    free(r->open);
    free(r->slots);
    free(r->ev_done);
    graft_etcd_endpoints_free(r->endpoints, r->n_endpoints);
    for (int i = 0; i < 16; i++) {
        free(s->env[i]);
    }
    sim_once_dir_done(r);
}

/*
 * One run: the given schedule (empty for the reference) against a fresh
 * set of trainers under a job name of its own.
 */
graft_status_t graft_sim_run_once(const graft_sim_live_opts_t *o,
                                  const graft_sim_schedule_t *sched,
                                  graft_etcd_cluster_t *cluster, const char *endpoint,
                                  const char *tag, const char *persist_root,
                                  graft_sim_result_t *res)
{
    sim_once_t once;
    sim_once_t *s = &once;
    memset(s, 0, sizeof(*s));
    sim_once_init(s, o, sched, cluster, endpoint, tag, persist_root, res);
    graft_sim_run_t *r = &s->r;
    const char *dir_base = getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp";
    snprintf(r->dir, sizeof(r->dir), "%s/graft-sim-%s-XXXXXX", dir_base, tag);
    if (mkdtemp(r->dir) == NULL) {
        fprintf(stderr, "graft-sim run: error: mkdtemp %s: %s\n", r->dir, strerror(errno));
        return GRAFT_ESYS;
    }
    graft_status_t st = sim_once_setup(s);
    if (st == GRAFT_OK) {
        sim_once_loop(s);
        sim_once_finish(r);
    }
    sim_once_teardown(s);
    return st;
}
