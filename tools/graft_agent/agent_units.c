/*
 * graft-agent: a unit's process: started (fork and exec with the unit's
 * GRAFT_* settings, in a process group of its own that dies with the
 * agent) and signalled. What to start and when is agent_policy.c's.
 */
#include "agent.h"

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

static void child_env(const agent_t *a, const agent_unit_t *u)
{
    const agent_opts_t *o = &a->o;
    char v[32];
    if (o->job != NULL)
        setenv("GRAFT_JOB", o->job, 1);
    setenv("GRAFT_ETCD_ENDPOINTS", o->endpoints_text, 1);
    if (u->role == AGENT_ROLE_SPARE) {
        setenv("GRAFT_SPARE", "1", 1);
        if (o->follow)
            setenv("GRAFT_SPARE_FOLLOW", "1", 1);
        else
            unsetenv("GRAFT_SPARE_FOLLOW");
        unsetenv("GRAFT_GROUP");
        /* A launcher's spare world is one group of spares, promoted whole
         * (docs/RUNTIME.md, "Groups of spares"): a name per host, slot and
         * start. */
        if (u->rank == UINT32_MAX) {
            char name[96];
            snprintf(name, sizeof(name), "%.60s-s%d-%u", a->host, u->slot, u->starts);
            for (char *c = name; *c != '\0'; c++)
                if (!((*c >= 'a' && *c <= 'z') || (*c >= 'A' && *c <= 'Z') ||
                      (*c >= '0' && *c <= '9') || *c == '-' || *c == '_' || *c == '.'))
                    *c = '_';
            setenv("GRAFT_SPARE_GROUP", name, 1);
        } else {
            unsetenv("GRAFT_SPARE_GROUP");
        }
    } else {
        unsetenv("GRAFT_SPARE_GROUP");
        unsetenv("GRAFT_SPARE");
        unsetenv("GRAFT_SPARE_FOLLOW"); /* a rank with a group refuses it */
        snprintf(v, sizeof(v), "%u", o->group);
        setenv("GRAFT_GROUP", v, 1);
    }
    if (u->rank != UINT32_MAX) {
        snprintf(v, sizeof(v), "%u", u->rank);
        setenv("GRAFT_RANK", v, 1);
    }
    if (o->ranks_per_group > 0) {
        snprintf(v, sizeof(v), "%u", o->ranks_per_group);
        setenv("GRAFT_RANKS_PER_GROUP", v, 1);
    }
    if (o->groups > 0) {
        snprintf(v, sizeof(v), "%u", o->groups);
        setenv("GRAFT_GROUPS", v, 1);
    }
    snprintf(v, sizeof(v), "%d", u->slot);
    setenv("GRAFT_AGENT_SLOT", v, 1);
}

static void redirect(const char *path, int fd)
{
    int f = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (f < 0) {
        fprintf(stderr, "graft-agent: cannot open %s: %s\n", path, strerror(errno));
        _exit(127);
    }
    dup2(f, fd);
    close(f);
}

/* In the child: its own process group (a launcher's world is signalled
 * whole), gone with the agent, then exec. Never returns. */
static void child_exec(const agent_t *a, const agent_unit_t *u, char **argv, pid_t parent)
{
    sigset_t none;
    sigemptyset(&none);
    sigprocmask(SIG_SETMASK, &none, NULL);
    signal(SIGTERM, SIG_DFL);
    signal(SIGINT, SIG_DFL);
    signal(SIGPIPE, SIG_DFL);
    setpgid(0, 0);
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (getppid() != parent)
        _exit(127);
    child_env(a, u);
    if (a->o.log_dir != NULL) {
        char path[1024];
        const char *kind = agent_unit_kind(u);
        char rank[16];
        snprintf(rank, sizeof(rank), u->rank == UINT32_MAX ? "all" : "%u", u->rank);
        snprintf(path, sizeof(path), "%s/%s-r%s-s%d-%u.out", a->o.log_dir, kind, rank, u->slot,
                 u->starts);
        redirect(path, 1);
        snprintf(path, sizeof(path), "%s/%s-r%s-s%d-%u.err", a->o.log_dir, kind, rank, u->slot,
                 u->starts);
        redirect(path, 2);
    }
    execvp(argv[0], argv);
    fprintf(stderr, "graft-agent: cannot run %s: %s\n", argv[0], strerror(errno));
    _exit(127);
}

bool agent_unit_start(agent_t *a, agent_unit_t *u)
{
    char **argv = calloc((size_t)a->o.n_cmd + 1, sizeof(char *));
    bool ok = argv != NULL;
    for (int i = 0; ok && i < a->o.n_cmd; i++)
        ok = (argv[i] = agent_arg_expand(a->o.cmd[i], u, &a->o)) != NULL;
    pid_t parent = getpid(), pid = ok ? fork() : -1;
    if (pid == 0)
        child_exec(a, u, argv, parent);
    for (int i = 0; argv != NULL && i < a->o.n_cmd; i++)
        free(argv[i]);
    free(argv);
    if (pid < 0) {
        agent_event(a, "start_failed", "slot %d: %s", u->slot,
                    ok ? strerror(errno) : "out of memory");
        return false;
    }
    setpgid(pid, pid); /* as the child does: whichever runs first */
    u->pid = pid;
    u->state = AGENT_UNIT_RUNNING;
    u->started_ms = agent_now_ms();
    u->group = u->role == AGENT_ROLE_PRIMARY ? (int64_t)a->o.group : -1;
    u->stopping = false;
    u->n_records = 0;
    u->starts++;
    a->c.starts++;
    char who[48];
    if (u->rank == UINT32_MAX)
        snprintf(who, sizeof(who), "%s", u->role == AGENT_ROLE_PRIMARY ? "world" : "spare world");
    else
        snprintf(who, sizeof(who), "%s %u", u->role == AGENT_ROLE_PRIMARY ? "rank" : "spare of rank",
                 u->rank);
    if (u->role == AGENT_ROLE_PRIMARY)
        agent_event(a, "start", "slot %d: %s of group %u, pid %d (start %u)", u->slot, who,
                    a->o.group, (int)pid, u->starts);
    else
        agent_event(a, "start", "slot %d: %s, pid %d (start %u)", u->slot, who, (int)pid,
                    u->starts);
    return true;
}

void agent_unit_signal(agent_unit_t *u, bool kill_now)
{
    if (u->pid <= 0)
        return;
    u->stopping = true;
    if (kill(-u->pid, kill_now ? SIGKILL : SIGTERM) != 0)
        kill(u->pid, kill_now ? SIGKILL : SIGTERM);
}
