/*
 * The supervisor (see sim_supervisor.h). Everything a child needs (argv,
 * envp, log descriptor) is prepared before fork(), because the simulator
 * has threads (the etcd watch) and a child of a threaded process may only
 * call async-signal-safe functions before exec.
 */
#include "sim_supervisor.h"

#include "etcd_launcher.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <signal.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

extern char **environ;

typedef struct sim_proc {
    pid_t pid;
    graft_sim_proc_state_t state;
    int starts;
    uint64_t started_ns;
    uint64_t restart_at_ns;
    char *log_path;
    char *hash_path;
    char *commits_path;
    char *role_path;
    char **envp; /* the common environment plus this process's group/rank */
    bool sigkilled; /* the injector sent it SIGKILL */
} sim_proc_t;

struct graft_sim_sup {
    graft_sim_sup_config_t cfg;
    /* trainer --steps N --seed S --state-hash-out <slot> --hash-log <slot>
     * [--role-log <slot>] extra... */
    char **argv_tmpl;
    size_t hash_slot, commits_slot, role_slot;
    sim_proc_t *procs; /* groups * ranks */
    int n;
    int done;
};

uint64_t graft_sim_now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static char *sim_sup_fmt(const char *fmt, ...) GRAFT_PRINTF(1, 2);
static char *sim_sup_fmt(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    char *s = NULL;
    if (vasprintf(&s, fmt, ap) < 0) {
        s = NULL;
    }
    va_end(ap);
    return s;
}

void graft_sim_sup_strv_free(char **v)
{
    for (size_t i = 0; v != NULL && v[i] != NULL; i++) {
        free(v[i]);
    }
    free(v);
}

/* What torchrun sets for a worker, set here for a torch world's process. */
static bool sim_sup_torch_var(const char *kv, size_t klen)
{
    static const char *const names[] = {"MASTER_ADDR", "MASTER_PORT", "RANK", "LOCAL_RANK",
                                        "WORLD_SIZE", "LOCAL_WORLD_SIZE"};
    for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++) {
        if (strlen(names[i]) == klen && strncmp(kv, names[i], klen) == 0) {
            return true;
        }
    }
    return false;
}

/* The inherited environment, minus what we set, plus config->env and the
 * per-process GRAFT_GROUP/GRAFT_RANK (and a torch world's variables). */
char **graft_sim_sup_envp(const graft_sim_sup_config_t *c, int g, int r)
{
    size_t n_env = 0, n_add = 0;
    while (environ[n_env] != NULL) {
        n_env++;
    }
    while (c->env != NULL && c->env[n_add] != NULL) {
        n_add++;
    }
    char **v = calloc(n_env + n_add + 9, sizeof(*v));
    if (v == NULL) {
        return NULL;
    }
    size_t k = 0;
    for (size_t i = 0; i < n_env; i++) {
        const char *eq = strchr(environ[i], '=');
        size_t klen = eq ? (size_t)(eq - environ[i]) : strlen(environ[i]);
        int overridden = (klen == 11 && strncmp(environ[i], "GRAFT_GROUP", 11) == 0) ||
                         (klen == 10 && strncmp(environ[i], "GRAFT_RANK", 10) == 0) ||
                         (c->master_ports != NULL && sim_sup_torch_var(environ[i], klen));
        for (size_t j = 0; j < n_add && !overridden; j++) {
            overridden = strncmp(c->env[j], environ[i], klen) == 0 && c->env[j][klen] == '=';
        }
        if (!overridden && (v[k++] = strdup(environ[i])) == NULL) {
            goto fail;
        }
    }
    for (size_t j = 0; j < n_add; j++) {
        if ((v[k++] = strdup(c->env[j])) == NULL) {
            goto fail;
        }
    }
    if ((v[k++] = sim_sup_fmt("GRAFT_GROUP=%d", g)) == NULL ||
        (v[k++] = sim_sup_fmt("GRAFT_RANK=%d", r)) == NULL) {
        goto fail;
    }
    if (c->master_ports != NULL &&
        ((v[k++] = strdup("MASTER_ADDR=127.0.0.1")) == NULL ||
         (v[k++] = sim_sup_fmt("MASTER_PORT=%d", c->master_ports[g])) == NULL ||
         (v[k++] = sim_sup_fmt("RANK=%d", r)) == NULL ||
         (v[k++] = sim_sup_fmt("LOCAL_RANK=%d", r)) == NULL ||
         (v[k++] = sim_sup_fmt("WORLD_SIZE=%d", c->ranks)) == NULL ||
         (v[k++] = sim_sup_fmt("LOCAL_WORLD_SIZE=%d", c->ranks)) == NULL)) {
        goto fail;
    }
    return v;
fail:
    graft_sim_sup_strv_free(v);
    return NULL;
}

static graft_status_t sim_sup_spawn(graft_sim_sup_t *s, int idx)
{
    sim_proc_t *p = &s->procs[idx];
    int fd = open(p->log_path, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
    if (fd < 0) {
        fprintf(stderr, "graft-sim run: error: open %s: %s\n", p->log_path, strerror(errno));
        return GRAFT_ESYS;
    }
    char banner[96];
    int bl = snprintf(banner, sizeof(banner), "=== graft-sim: start %d of group %d rank %d\n",
                      p->starts + 1, idx / s->cfg.ranks, idx % s->cfg.ranks);
    if (write(fd, banner, (size_t)bl) < 0) {
        /* the banner is only a reading aid; the log itself still works */
    }
    s->argv_tmpl[s->hash_slot] = p->hash_path;
    s->argv_tmpl[s->commits_slot] = p->commits_path;
    if (s->role_slot != 0) {
        s->argv_tmpl[s->role_slot] = p->role_path;
    }
    pid_t parent = getpid();
    pid_t pid = fork();
    if (pid < 0) {
        fprintf(stderr, "graft-sim run: error: fork: %s\n", strerror(errno));
        close(fd);
        return GRAFT_ESYS;
    }
    if (pid == 0) {
        /* Children must not outlive the simulator, whatever kills it. */
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        setpgid(0, 0);
        if (getppid() != parent) {
            _exit(127);
        }
        int devnull = open("/dev/null", O_RDONLY);
        if (devnull >= 0) {
            dup2(devnull, 0);
        }
        dup2(fd, 1);
        dup2(fd, 2);
        execve(s->argv_tmpl[0], s->argv_tmpl, p->envp);
        static const char msg[] = "graft-sim: exec of the trainer failed\n";
        if (write(2, msg, sizeof(msg) - 1) < 0) {
            _exit(127);
        }
        _exit(127);
    }
    close(fd);
    setpgid(pid, pid); /* also here: a signal sent before the child's own call reaches it */
    p->pid = pid;
    p->state = GRAFT_SIM_PROC_RUNNING;
    p->starts++;
    p->started_ns = graft_sim_now_ns();
    return GRAFT_OK;
}

graft_status_t graft_sim_free_ports(int n, int *ports)
{
    for (int i = 0; i < n; i++) {
        int tries = 0;
        bool dup;
        do {
            ports[i] = graft_etcd_server_free_port();
            dup = false;
            for (int j = 0; j < i; j++) {
                dup = dup || ports[j] == ports[i];
            }
        } while ((ports[i] < 0 || dup) && ++tries < 20);
        if (ports[i] < 0 || dup) {
            fprintf(stderr, "graft-sim run: error: no free loopback port for a torch rendezvous\n");
            return GRAFT_ESYS;
        }
    }
    return GRAFT_OK;
}

graft_status_t graft_sim_sup_create(const graft_sim_sup_config_t *config, graft_sim_sup_t **sup_p)
{
    graft_status_t st = GRAFT_ENOMEM;
    graft_sim_sup_t *s = calloc(1, sizeof(*s));
    if (s == NULL) {
        return GRAFT_ENOMEM;
    }
    s->cfg = *config;
    s->n = config->groups * config->ranks;
    size_t n_extra = 0;
    while (config->extra_args != NULL && config->extra_args[n_extra] != NULL) {
        n_extra++;
    }
    s->argv_tmpl = calloc(12 + n_extra, sizeof(char *));
    s->procs = calloc((size_t)s->n, sizeof(*s->procs));
    if (s->argv_tmpl == NULL || s->procs == NULL) {
        goto fail;
    }
    /* argv points into strings owned here; the hash slot is swapped per child. */
    size_t a = 0;
    s->argv_tmpl[a++] = (char *)config->trainer;
    s->argv_tmpl[a++] = "--steps";
    s->argv_tmpl[a++] = sim_sup_fmt("%lld", config->steps);
    s->argv_tmpl[a++] = "--seed";
    s->argv_tmpl[a++] = sim_sup_fmt("%" PRIu64, config->seed);
    s->argv_tmpl[a++] = "--state-hash-out";
    s->hash_slot = a++;
    s->argv_tmpl[a++] = "--hash-log";
    s->commits_slot = a++;
    if (config->role_log) {
        s->argv_tmpl[a++] = "--role-log";
        s->role_slot = a++;
    }
    for (size_t i = 0; i < n_extra; i++) {
        s->argv_tmpl[a++] = (char *)config->extra_args[i];
    }
    if (s->argv_tmpl[2] == NULL || s->argv_tmpl[4] == NULL) {
        goto fail;
    }
    for (int i = 0; i < s->n; i++) {
        int g = i / config->ranks, r = i % config->ranks;
        sim_proc_t *p = &s->procs[i];
        p->pid = -1;
        p->state = GRAFT_SIM_PROC_DEAD;
        p->log_path = sim_sup_fmt("%s/trainer-g%d-r%d.log", config->dir, g, r);
        p->hash_path = sim_sup_fmt("%s/hash-g%d-r%d.txt", config->dir, g, r);
        p->commits_path = sim_sup_fmt("%s/commits-g%d-r%d.txt", config->dir, g, r);
        p->role_path = sim_sup_fmt("%s/role-g%d-r%d.txt", config->dir, g, r);
        p->envp = graft_sim_sup_envp(config, g, r);
        if (p->log_path == NULL || p->hash_path == NULL || p->commits_path == NULL ||
            p->role_path == NULL || p->envp == NULL) {
            goto fail;
        }
    }
    for (int i = 0; i < s->n; i++) {
        st = sim_sup_spawn(s, i);
        if (st != GRAFT_OK) {
            goto fail;
        }
    }
    *sup_p = s;
    return GRAFT_OK;
fail:
    graft_sim_sup_destroy(s);
    return st;
}

void graft_sim_sup_destroy(graft_sim_sup_t *s)
{
    if (s == NULL) {
        return;
    }
    for (int i = 0; s->procs != NULL && i < s->n; i++) {
        sim_proc_t *p = &s->procs[i];
        if (p->pid > 0 && (p->state == GRAFT_SIM_PROC_RUNNING || p->state == GRAFT_SIM_PROC_STOPPED)) {
            kill(-p->pid, SIGKILL);
            kill(p->pid, SIGKILL);
            while (waitpid(p->pid, NULL, 0) < 0 && errno == EINTR) {
            }
        }
        free(p->log_path);
        free(p->hash_path);
        free(p->commits_path);
        free(p->role_path);
        graft_sim_sup_strv_free(p->envp);
    }
    if (s->argv_tmpl != NULL) {
        free(s->argv_tmpl[2]);
        free(s->argv_tmpl[4]);
    }
    free(s->argv_tmpl);
    free(s->procs);
    free(s);
}

/* A death the injector did not cause (a trainer that failed, or a
 * sanitizer's exit) is said where it happens, with the log that says why. */
static void sim_sup_death_note(graft_sim_sup_t *s, sim_proc_t *p, int i, int ws)
{
    bool ours = p->sigkilled && WIFSIGNALED(ws) && WTERMSIG(ws) == SIGKILL;
    p->sigkilled = false;
    if (ours)
        return;
    if (WIFEXITED(ws))
        fprintf(stderr, "graft-sim run: group %d rank %d exited with status %d (see %s)\n",
                i / s->cfg.ranks, i % s->cfg.ranks, WEXITSTATUS(ws), p->log_path);
    else
        fprintf(stderr, "graft-sim run: group %d rank %d died of %s (see %s)\n",
                i / s->cfg.ranks, i % s->cfg.ranks, strsignal(WTERMSIG(ws)), p->log_path);
}

/* A torch world lost rank i: its group's other running ranks are killed
 * (reaped as dead by the next poll and started again), as torchrun stops
 * a world's workers when one fails. Their deaths are the supervisor's own,
 * not failures to report. */
static void sim_sup_end_world(graft_sim_sup_t *s, int i)
{
    int g = i / s->cfg.ranks;
    for (int k = g * s->cfg.ranks; k < (g + 1) * s->cfg.ranks; k++) {
        sim_proc_t *q = &s->procs[k];
        if (k != i && q->pid > 0 &&
            (q->state == GRAFT_SIM_PROC_RUNNING || q->state == GRAFT_SIM_PROC_STOPPED)) {
            kill(-q->pid, SIGKILL);
            kill(q->pid, SIGKILL);
            q->sigkilled = true;
        }
    }
}

graft_status_t graft_sim_sup_poll(graft_sim_sup_t *s)
{
    uint64_t now = graft_sim_now_ns();
    for (int i = 0; i < s->n; i++) {
        sim_proc_t *p = &s->procs[i];
        if (p->state == GRAFT_SIM_PROC_RUNNING || p->state == GRAFT_SIM_PROC_STOPPED) {
            int ws = 0;
            pid_t w = waitpid(p->pid, &ws, WNOHANG);
            if (w == p->pid) {
                /* What it started and left behind (a launcher's worker)
                 * goes with it. */
                kill(-p->pid, SIGKILL);
                if (WIFEXITED(ws) && WEXITSTATUS(ws) == 0) {
                    p->state = GRAFT_SIM_PROC_DONE;
                    s->done++;
                } else {
                    sim_sup_death_note(s, p, i, ws);
                    p->state = GRAFT_SIM_PROC_DEAD;
                    p->restart_at_ns = now + (uint64_t)s->cfg.restart_delay_ms * 1000000ull;
                    if (s->cfg.master_ports != NULL) {
                        sim_sup_end_world(s, i);
                    }
                }
                p->pid = -1;
            }
        }
        if (p->state == GRAFT_SIM_PROC_DEAD && now >= p->restart_at_ns) {
            if (p->starts > s->cfg.max_restarts) {
                fprintf(stderr, "graft-sim run: error: group %d rank %d died %d times; giving up "
                                "(see %s)\n",
                        i / s->cfg.ranks, i % s->cfg.ranks, p->starts, p->log_path);
                return GRAFT_ERANGE;
            }
            graft_status_t st = sim_sup_spawn(s, i);
            if (st != GRAFT_OK) {
                return st;
            }
        }
    }
    return GRAFT_OK;
}

static sim_proc_t *sim_sup_proc(const graft_sim_sup_t *s, int group, int rank)
{
    if (group < 0 || rank < 0 || group >= s->cfg.groups || rank >= s->cfg.ranks) {
        return NULL;
    }
    return &s->procs[group * s->cfg.ranks + rank];
}

graft_status_t graft_sim_sup_signal(graft_sim_sup_t *s, int group, int rank, int sig)
{
    sim_proc_t *p = sim_sup_proc(s, group, rank);
    if (p == NULL) {
        return GRAFT_EINVAL;
    }
    if (p->pid <= 0 || (p->state != GRAFT_SIM_PROC_RUNNING && p->state != GRAFT_SIM_PROC_STOPPED)) {
        return GRAFT_ESTATE;
    }
    if (kill(-p->pid, sig) != 0 && kill(p->pid, sig) != 0) {
        return GRAFT_ESTATE;
    }
    p->sigkilled |= sig == SIGKILL;
    if (sig == SIGSTOP) {
        p->state = GRAFT_SIM_PROC_STOPPED;
    } else if (sig == SIGCONT) {
        p->state = GRAFT_SIM_PROC_RUNNING;
    } else if (sig == SIGKILL && p->state == GRAFT_SIM_PROC_STOPPED) {
        p->state = GRAFT_SIM_PROC_RUNNING; /* reaped as dead by the next poll */
    }
    return GRAFT_OK;
}

graft_sim_proc_state_t graft_sim_sup_state(const graft_sim_sup_t *s, int group, int rank)
{
    sim_proc_t *p = sim_sup_proc(s, group, rank);
    return p != NULL ? p->state : GRAFT_SIM_PROC_DEAD;
}

int graft_sim_sup_starts(const graft_sim_sup_t *s, int group, int rank)
{
    sim_proc_t *p = sim_sup_proc(s, group, rank);
    return p != NULL ? p->starts : 0;
}

uint64_t graft_sim_sup_started_ns(const graft_sim_sup_t *s, int group, int rank)
{
    sim_proc_t *p = sim_sup_proc(s, group, rank);
    return p != NULL ? p->started_ns : 0;
}

int graft_sim_sup_done(const graft_sim_sup_t *s)
{
    return s->done;
}

int graft_sim_sup_dead(const graft_sim_sup_t *s, int *group, int *rank)
{
    for (int i = 0; i < s->n; i++)
        if (s->procs[i].state == GRAFT_SIM_PROC_DEAD) {
            *group = i / s->cfg.ranks;
            *rank = i % s->cfg.ranks;
            return 1;
        }
    return 0;
}

const char *graft_sim_sup_hash_path(const graft_sim_sup_t *s, int group, int rank)
{
    sim_proc_t *p = sim_sup_proc(s, group, rank);
    return p != NULL ? p->hash_path : "";
}

const char *graft_sim_sup_log_path(const graft_sim_sup_t *s, int group, int rank)
{
    sim_proc_t *p = sim_sup_proc(s, group, rank);
    return p != NULL ? p->log_path : "";
}

const char *graft_sim_sup_commits_path(const graft_sim_sup_t *s, int group, int rank)
{
    sim_proc_t *p = sim_sup_proc(s, group, rank);
    return p != NULL ? p->commits_path : "";
}

const char *graft_sim_sup_role_path(const graft_sim_sup_t *s, int group, int rank)
{
    sim_proc_t *p = sim_sup_proc(s, group, rank);
    return p != NULL ? p->role_path : "";
}

void graft_sim_sup_log_tail(const graft_sim_sup_t *s, int group, int rank, long max)
{
    sim_proc_t *p = sim_sup_proc(s, group, rank);
    FILE *f = p != NULL ? fopen(p->log_path, "r") : NULL;
    if (f == NULL)
        return;
    char buf[4096];
    if (max > (long)sizeof(buf) - 1)
        max = (long)sizeof(buf) - 1;
    if (fseek(f, -max, SEEK_END) != 0)
        rewind(f);
    size_t n = fread(buf, 1, (size_t)max, f);
    buf[n] = '\0';
    fclose(f);
    fprintf(stderr, "graft-sim run: %s ends:\n%s\n", p->log_path, buf);
}
