/*
 * The supervisor (see sim_supervisor.h): the environments, starting a
 * process, create and destroy, and what is asked of a slot. Reaping,
 * replacements, signals and spares taking slots are sim_sup_poll.c.
 * Everything a child needs (argv, envp, log descriptor) is prepared before
 * fork(), because the simulator has threads (the etcd watch) and a child
 * of a threaded process may only call async-signal-safe functions before
 * exec.
 */
#include "sim_sup_int.h"

#include "etcd_launcher.h"

#include <assert.h>
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
 * per-process GRAFT_GROUP/GRAFT_RANK (and a torch world's variables); a
 * spare's (g < 0) GRAFT_SPARE=1 instead of GRAFT_GROUP, and with --follow
 * GRAFT_SPARE_FOLLOW=1 (a setting a non-spare refuses). */
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
                         (klen == 11 && strncmp(environ[i], "GRAFT_SPARE", 11) == 0) ||
                         (klen == 18 && strncmp(environ[i], "GRAFT_SPARE_FOLLOW", 18) == 0) ||
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
    if ((v[k++] = g >= 0 ? sim_sup_fmt("GRAFT_GROUP=%d", g) : strdup("GRAFT_SPARE=1")) == NULL ||
        (v[k++] = sim_sup_fmt("GRAFT_RANK=%d", r)) == NULL) {
        goto fail;
    }
    if (g < 0 && c->spare_follow && (v[k++] = strdup("GRAFT_SPARE_FOLLOW=1")) == NULL)
        goto fail;
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

/* What one process is started with: its log, its per-slot files (paths or
 * a spare's templates) and its environment. */
typedef struct sim_launch {
    const char *log_path, *hash_path, *commits_path, *role_path;
    char *const *envp;
    const char *what; /* "group 1 rank 0", "spare 3 rank 0": the log's banner */
    int nth;          /* this start's number in that log */
} sim_launch_t;

/* fork() and exec() the trainer; its pid, or -1 (said on standard error). */
static pid_t sim_sup_exec(graft_sim_sup_t *s, const sim_launch_t *l)
{
    int fd = open(l->log_path, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
    if (fd < 0) {
        fprintf(stderr, "graft-sim run: error: open %s: %s\n", l->log_path, strerror(errno));
        return -1;
    }
    char banner[96];
    int bl = snprintf(banner, sizeof(banner), "=== graft-sim: start %d of %s\n", l->nth, l->what);
    if (write(fd, banner, (size_t)bl) < 0) {
        /* the banner is only a reading aid; the log itself still works */
    }
    s->argv_tmpl[s->hash_arg] = (char *)l->hash_path;
    s->argv_tmpl[s->commits_arg] = (char *)l->commits_path;
    if (s->role_arg != 0) {
        s->argv_tmpl[s->role_arg] = (char *)l->role_path;
    }
    pid_t parent = getpid();
    pid_t pid = fork();
    if (pid < 0) {
        fprintf(stderr, "graft-sim run: error: fork: %s\n", strerror(errno));
        close(fd);
        return -1;
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
        execve(s->argv_tmpl[0], s->argv_tmpl, l->envp);
        static const char msg[] = "graft-sim: exec of the trainer failed\n";
        if (write(2, msg, sizeof(msg) - 1) < 0) {
            _exit(127);
        }
        _exit(127);
    }
    close(fd);
    setpgid(pid, pid); /* also here: a signal sent before the child's own call reaches it */
    return pid;
}

/* A new seat for a process just started; its index, or -1 (ENOMEM). Owns
 * log_path from here, also on failure. */
static int sim_sup_seat_add(graft_sim_sup_t *s, pid_t pid, int slot, int rank, bool spare,
                            char *log_path)
{
    if (s->n_seats == s->cap_seats) {
        size_t cap = s->cap_seats ? 2 * s->cap_seats : 16;
        sim_seat_t *v = realloc(s->seats, cap * sizeof(*v));
        if (v == NULL) {
            free(log_path);
            return -1;
        }
        s->seats = v;
        s->cap_seats = cap;
    }
    sim_seat_t *t = &s->seats[s->n_seats];
    memset(t, 0, sizeof(*t));
    t->pid = pid;
    t->state = GRAFT_SIM_PROC_RUNNING;
    t->slot = slot;
    t->rank = rank;
    t->spare = spare;
    t->log_path = log_path;
    t->spawned_ns = graft_sim_now_ns();
    return (int)s->n_seats++;
}

/* Kill a process just started whose seat could not be recorded. */
static void sim_sup_kill_reap(pid_t pid)
{
    kill(-pid, SIGKILL);
    kill(pid, SIGKILL);
    while (waitpid(pid, NULL, 0) < 0 && errno == EINTR) {
    }
}

graft_status_t graft_sim__sup_start_slot(graft_sim_sup_t *s, int idx)
{
    sim_slot_t *sl = &s->slots[idx];
    int R = s->cfg.ranks;
    char what[48];
    snprintf(what, sizeof(what), "group %d rank %d", idx / R, idx % R);
    sim_launch_t l = {sl->log_path, sl->hash_path, sl->commits_path, sl->role_path, sl->envp,
                      what, sl->starts + 1};
    char *log = strdup(sl->log_path);
    pid_t pid = log != NULL ? sim_sup_exec(s, &l) : -1;
    if (pid < 0) {
        free(log);
        return log == NULL ? GRAFT_ENOMEM : GRAFT_ESYS;
    }
    int seat = sim_sup_seat_add(s, pid, idx, idx % R, false, log);
    if (seat < 0) {
        sim_sup_kill_reap(pid);
        return GRAFT_ENOMEM;
    }
    sl->seat = sl->last_seat = seat;
    sl->starts++;
    sl->started_ns = graft_sim_now_ns();
    return GRAFT_OK;
}

graft_status_t graft_sim__sup_start_spare(graft_sim_sup_t *s, int rank)
{
    const sim_spare_kind_t *k = &s->spare_kinds[rank];
    int no = s->n_spare_logs++;
    char what[48];
    snprintf(what, sizeof(what), "spare %d rank %d", no, rank);
    char *log = sim_sup_fmt("%s/spare-%d-r%d.log", s->cfg.dir, no, rank);
    sim_launch_t l = {log, k->hash_path, k->commits_path, k->role_path, k->envp, what, 1};
    pid_t pid = log != NULL ? sim_sup_exec(s, &l) : -1;
    if (pid < 0) {
        free(log);
        return log == NULL ? GRAFT_ENOMEM : GRAFT_ESYS;
    }
    if (sim_sup_seat_add(s, pid, -1, rank, true, log) < 0) {
        sim_sup_kill_reap(pid);
        return GRAFT_ENOMEM;
    }
    s->stats.started++;
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


/* argv: trainer --steps N --seed S --state-hash-out F --hash-log F
 * [--role-log F] extra...; the file arguments are set per start. */
static graft_status_t sim_sup_argv(graft_sim_sup_t *s)
{
    const graft_sim_sup_config_t *c = &s->cfg;
    size_t n_extra = 0;
    while (c->extra_args != NULL && c->extra_args[n_extra] != NULL) {
        n_extra++;
    }
    s->argv_tmpl = calloc(12 + n_extra, sizeof(char *));
    if (s->argv_tmpl == NULL) {
        return GRAFT_ENOMEM;
    }
    size_t a = 0;
    s->argv_tmpl[a++] = (char *)c->trainer;
    s->argv_tmpl[a++] = "--steps";
    s->argv_tmpl[a++] = sim_sup_fmt("%lld", c->steps);
    s->argv_tmpl[a++] = "--seed";
    s->argv_tmpl[a++] = sim_sup_fmt("%" PRIu64, c->seed);
    s->argv_tmpl[a++] = "--state-hash-out";
    s->hash_arg = a++;
    s->argv_tmpl[a++] = "--hash-log";
    s->commits_arg = a++;
    if (c->role_log) {
        s->argv_tmpl[a++] = "--role-log";
        s->role_arg = a++;
    }
    for (size_t i = 0; i < n_extra; i++) {
        s->argv_tmpl[a++] = (char *)c->extra_args[i];
    }
    return s->argv_tmpl[2] == NULL || s->argv_tmpl[4] == NULL ? GRAFT_ENOMEM : GRAFT_OK;
}

/* Every slot's files and environment. */
static graft_status_t sim_sup_slots(graft_sim_sup_t *s)
{
    const graft_sim_sup_config_t *c = &s->cfg;
    s->slots = calloc((size_t)s->n, sizeof(*s->slots));
    if (s->slots == NULL) {
        return GRAFT_ENOMEM;
    }
    for (int i = 0; i < s->n; i++) {
        int g = i / c->ranks, r = i % c->ranks;
        sim_slot_t *sl = &s->slots[i];
        sl->seat = sl->last_seat = -1;
        sl->log_path = sim_sup_fmt("%s/trainer-g%d-r%d.log", c->dir, g, r);
        sl->hash_path = sim_sup_fmt("%s/hash-g%d-r%d.txt", c->dir, g, r);
        sl->commits_path = sim_sup_fmt("%s/commits-g%d-r%d.txt", c->dir, g, r);
        sl->role_path = sim_sup_fmt("%s/role-g%d-r%d.txt", c->dir, g, r);
        sl->envp = graft_sim_sup_envp(c, g, r);
        if (sl->log_path == NULL || sl->hash_path == NULL || sl->commits_path == NULL ||
            sl->role_path == NULL || sl->envp == NULL) {
            return GRAFT_ENOMEM;
        }
    }
    return GRAFT_OK;
}

/* Per rank, the spares' path templates (the slot's names with the group
 * left to the trainer) and environment. */
static graft_status_t sim_sup_spare_kinds(graft_sim_sup_t *s)
{
    const graft_sim_sup_config_t *c = &s->cfg;
    s->spare_kinds = calloc((size_t)c->ranks, sizeof(*s->spare_kinds));
    if (s->spare_kinds == NULL) {
        return GRAFT_ENOMEM;
    }
    const char *ph = GRAFT_SIM_GROUP_PLACEHOLDER;
    for (int r = 0; r < c->ranks; r++) {
        sim_spare_kind_t *k = &s->spare_kinds[r];
        k->hash_path = sim_sup_fmt("%s/hash-g%s-r%d.txt", c->dir, ph, r);
        k->commits_path = sim_sup_fmt("%s/commits-g%s-r%d.txt", c->dir, ph, r);
        k->role_path = sim_sup_fmt("%s/role-g%s-r%d.txt", c->dir, ph, r);
        k->envp = graft_sim_sup_envp(c, -1, r);
        if (k->hash_path == NULL || k->commits_path == NULL || k->role_path == NULL ||
            k->envp == NULL) {
            return GRAFT_ENOMEM;
        }
    }
    return GRAFT_OK;
}

graft_status_t graft_sim_sup_create(const graft_sim_sup_config_t *config, graft_sim_sup_t **sup_p)
{
    assert(config->spares == 0 || config->master_ports == NULL);
    graft_sim_sup_t *s = calloc(1, sizeof(*s));
    if (s == NULL) {
        return GRAFT_ENOMEM;
    }
    s->cfg = *config;
    s->n = config->groups * config->ranks;
    graft_status_t st = sim_sup_argv(s);
    if (st == GRAFT_OK) {
        st = sim_sup_slots(s);
    }
    if (st == GRAFT_OK && config->spares > 0) {
        st = sim_sup_spare_kinds(s);
    }
    for (int i = 0; st == GRAFT_OK && i < s->n; i++) {
        st = graft_sim__sup_start_slot(s, i);
    }
    /* The spares of spare group k, rank r: started after the slots, so a
     * spare never sees a slot whose first process has not started. */
    for (int i = 0; st == GRAFT_OK && i < config->spares * config->ranks; i++) {
        st = graft_sim__sup_start_spare(s, i % config->ranks);
    }
    if (st != GRAFT_OK) {
        graft_sim_sup_destroy(s);
        return st;
    }
    *sup_p = s;
    return GRAFT_OK;
}

static void sim_sup_free_slots(graft_sim_sup_t *s)
{
    for (int i = 0; s->slots != NULL && i < s->n; i++) {
        sim_slot_t *sl = &s->slots[i];
        free(sl->log_path);
        free(sl->hash_path);
        free(sl->commits_path);
        free(sl->role_path);
        graft_sim_sup_strv_free(sl->envp);
    }
    free(s->slots);
    for (int r = 0; s->spare_kinds != NULL && r < s->cfg.ranks; r++) {
        sim_spare_kind_t *k = &s->spare_kinds[r];
        free(k->hash_path);
        free(k->commits_path);
        free(k->role_path);
        graft_sim_sup_strv_free(k->envp);
    }
    free(s->spare_kinds);
}

void graft_sim_sup_destroy(graft_sim_sup_t *s)
{
    if (s == NULL) {
        return;
    }
    for (size_t i = 0; i < s->n_seats; i++) {
        sim_seat_t *t = &s->seats[i];
        if (t->pid > 0 &&
            (t->state == GRAFT_SIM_PROC_RUNNING || t->state == GRAFT_SIM_PROC_STOPPED)) {
            sim_sup_kill_reap(t->pid);
        }
        free(t->log_path);
    }
    free(s->seats);
    free(s->due);
    free(s->deaths);
    sim_sup_free_slots(s);
    if (s->argv_tmpl != NULL) {
        free(s->argv_tmpl[2]);
        free(s->argv_tmpl[4]);
    }
    free(s->argv_tmpl);
    free(s);
}

/* ----------------------------------------------------- what a slot is --- */

sim_slot_t *graft_sim__sup_slot(const graft_sim_sup_t *s, int group, int rank)
{
    if (group < 0 || rank < 0 || group >= s->cfg.groups || rank >= s->cfg.ranks) {
        return NULL;
    }
    return &s->slots[group * s->cfg.ranks + rank];
}

/* A slot's state is its process's; without one it is dead (waiting for a
 * replacement or a spare). */
static graft_sim_proc_state_t sim_sup_slot_state(const graft_sim_sup_t *s, const sim_slot_t *sl)
{
    return sl->seat >= 0 ? s->seats[sl->seat].state : GRAFT_SIM_PROC_DEAD;
}

graft_sim_proc_state_t graft_sim_sup_state(const graft_sim_sup_t *s, int group, int rank)
{
    const sim_slot_t *sl = graft_sim__sup_slot(s, group, rank);
    return sl != NULL ? sim_sup_slot_state(s, sl) : GRAFT_SIM_PROC_DEAD;
}

int graft_sim_sup_starts(const graft_sim_sup_t *s, int group, int rank)
{
    const sim_slot_t *sl = graft_sim__sup_slot(s, group, rank);
    return sl != NULL ? sl->starts : 0;
}

int graft_sim_sup_promotions(const graft_sim_sup_t *s, int group, int rank)
{
    const sim_slot_t *sl = graft_sim__sup_slot(s, group, rank);
    return sl != NULL ? sl->promotions : 0;
}

uint64_t graft_sim_sup_holder_spawned_ns(const graft_sim_sup_t *s, int group, int rank)
{
    const sim_slot_t *sl = graft_sim__sup_slot(s, group, rank);
    return sl != NULL && sl->seat >= 0 ? s->seats[sl->seat].spawned_ns : 0;
}

uint64_t graft_sim_sup_started_ns(const graft_sim_sup_t *s, int group, int rank)
{
    const sim_slot_t *sl = graft_sim__sup_slot(s, group, rank);
    return sl != NULL ? sl->started_ns : 0;
}

int graft_sim_sup_done(const graft_sim_sup_t *s)
{
    return s->done;
}

int graft_sim_sup_dead(const graft_sim_sup_t *s, int *group, int *rank)
{
    for (int i = 0; i < s->n; i++)
        if (sim_sup_slot_state(s, &s->slots[i]) == GRAFT_SIM_PROC_DEAD) {
            *group = i / s->cfg.ranks;
            *rank = i % s->cfg.ranks;
            return 1;
        }
    return 0;
}

void graft_sim_sup_spare_stats(const graft_sim_sup_t *s, graft_sim_spare_stats_t *st)
{
    *st = s->stats;
    st->waiting = 0;
    for (size_t i = 0; i < s->n_seats; i++) {
        const sim_seat_t *t = &s->seats[i];
        st->waiting += t->spare && t->slot < 0 && (t->state == GRAFT_SIM_PROC_RUNNING ||
                                                   t->state == GRAFT_SIM_PROC_STOPPED);
    }
    st->owed = (int)s->n_due;
}

const char *graft_sim_sup_hash_path(const graft_sim_sup_t *s, int group, int rank)
{
    const sim_slot_t *sl = graft_sim__sup_slot(s, group, rank);
    return sl != NULL ? sl->hash_path : "";
}

const char *graft_sim_sup_log_path(const graft_sim_sup_t *s, int group, int rank)
{
    const sim_slot_t *sl = graft_sim__sup_slot(s, group, rank);
    if (sl == NULL) {
        return "";
    }
    return sl->last_seat >= 0 ? s->seats[sl->last_seat].log_path : sl->log_path;
}

const char *graft_sim_sup_commits_path(const graft_sim_sup_t *s, int group, int rank)
{
    const sim_slot_t *sl = graft_sim__sup_slot(s, group, rank);
    return sl != NULL ? sl->commits_path : "";
}

const char *graft_sim_sup_role_path(const graft_sim_sup_t *s, int group, int rank)
{
    const sim_slot_t *sl = graft_sim__sup_slot(s, group, rank);
    return sl != NULL ? sl->role_path : "";
}

void graft_sim_sup_log_tail(const graft_sim_sup_t *s, int group, int rank, long max)
{
    const char *path = graft_sim_sup_log_path(s, group, rank);
    FILE *f = path[0] != '\0' ? fopen(path, "r") : NULL;
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
    fprintf(stderr, "graft-sim run: %s ends:\n%s\n", path, buf);
}
