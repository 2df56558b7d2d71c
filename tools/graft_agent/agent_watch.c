/*
 * graft-agent: the job as etcd holds it, through an observer membership
 * handle (no lease, no record; a watch-driven view of the members with
 * their hosts and pids). A spare of this host took a slot when a member
 * record names this host and the spare's pid, or (a launcher's world, a
 * wrapper script) a pid that descends from it. Only opened when spares are
 * kept: without them the agent needs no etcd.
 */
#include "agent.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define WATCH_RETRY_MS 2000

void agent_watch_open(agent_t *a)
{
    if (a->obs != NULL || a->o.spares == 0 || agent_now_ms() < a->obs_next_try_ms)
        return;
    graft_etcd_config_t ec = {
        .endpoints = (const char *const *)a->o.endpoints,
        .n_endpoints = a->o.n_endpoints,
        .request_timeout_ms = 2000,
        .connect_timeout_ms = 1000,
        .max_retries = 1,
        .username = getenv("GRAFT_ETCD_USER"),
        .password = getenv("GRAFT_ETCD_PASSWORD"),
        .ca_file = getenv("GRAFT_ETCD_CA"),
        .cert_file = getenv("GRAFT_ETCD_CERT"),
        .key_file = getenv("GRAFT_ETCD_KEY"),
    };
    graft_membership_config_t mc = {
        .job = a->o.job,
        .etcd = &ec,
        .observer = true,
        .ranks_per_group = a->o.ranks_per_group > 0 ? a->o.ranks_per_group : 1,
    };
    graft_status_t st = graft_membership_create(&mc, &a->obs);
    if (st == GRAFT_OK) {
        agent_event(a, "etcd", "observing job '%s' at %s", a->o.job, a->o.endpoints_text);
        a->obs_warned = false;
        return;
    }
    a->obs = NULL;
    a->obs_next_try_ms = agent_now_ms() + WATCH_RETRY_MS;
    if (!a->obs_warned)
        agent_event(a, "etcd_unreachable", "job '%s' at %s: %s; promotions unseen until it "
                    "answers (retried every %d ms)", a->o.job, a->o.endpoints_text,
                    graft_status_string(st), WATCH_RETRY_MS);
    a->obs_warned = true;
}

bool agent_pid_descends(pid_t pid, pid_t ancestor)
{
    for (int depth = 0; depth < 16 && pid > 1; depth++) {
        if (pid == ancestor)
            return true;
        char path[64], buf[512];
        snprintf(path, sizeof(path), "/proc/%d/stat", (int)pid);
        FILE *f = fopen(path, "r");
        if (f == NULL)
            return false;
        size_t n = fread(buf, 1, sizeof(buf) - 1, f);
        fclose(f);
        buf[n] = '\0';
        /* "pid (comm) state ppid ...": comm may hold spaces and ')'. */
        char *close = strrchr(buf, ')');
        int ppid = 0;
        if (close == NULL || sscanf(close + 1, " %*c %d", &ppid) != 1)
            return false;
        pid = ppid;
    }
    return false;
}

/* u's member records in the view: this host's records whose pid is u's
 * process or below it. */
static void unit_records(const agent_t *a, const graft_membership_view_t *v, agent_unit_t *u)
{
    u->n_records = 0;
    for (size_t i = 0; i < v->n_members && u->n_records < AGENT_MAX_RANKS; i++) {
        const graft_member_t *m = &v->members[i];
        if (m->host == NULL || strcmp(m->host, a->host) != 0 || m->pid <= 0 ||
            !agent_pid_descends(m->pid, u->pid))
            continue;
        u->records[u->n_records].group = m->group;
        u->records[u->n_records].rank = m->rank;
        u->records[u->n_records].pid = m->pid;
        u->n_records++;
    }
}

int agent_watch_refresh(agent_t *a)
{
    agent_watch_open(a);
    if (a->obs == NULL)
        return 0;
    graft_membership_view_t *v = NULL;
    if (graft_membership_view_get(a->obs, &v) != GRAFT_OK)
        return 0;
    int n = 0;
    for (int i = 0; v->version != a->obs_seen && i < a->n_units; i++) {
        agent_unit_t *u = &a->units[i];
        if (u->state != AGENT_UNIT_RUNNING)
            continue;
        unit_records(a, v, u);
        if (u->role != AGENT_ROLE_SPARE || u->group >= 0 || u->n_records == 0)
            continue;
        u->group = u->records[0].group;
        a->c.promotions++;
        n++;
        agent_event(a, "spare_promoted", "slot %d: pid %d took slot (group %u, rank %u)",
                    u->slot, (int)u->records[0].pid, u->records[0].group, u->records[0].rank);
    }
    a->obs_seen = v->version;
    graft_membership_view_free(v);
    return n;
}

bool agent_watch_slot_held(agent_t *a, uint32_t group, uint32_t rank)
{
    agent_watch_open(a);
    if (a->obs == NULL)
        return false;
    graft_membership_view_t *v = NULL;
    if (graft_membership_view_get(a->obs, &v) != GRAFT_OK)
        return false;
    bool held = false;
    for (size_t i = 0; i < v->n_members; i++)
        held |= v->members[i].group == group && (rank == UINT32_MAX || v->members[i].rank == rank);
    graft_membership_view_free(v);
    return held;
}

void agent_watch_evict(agent_t *a, agent_unit_t *u)
{
    for (int i = 0; a->obs != NULL && i < u->n_records; i++) {
        uint32_t g = u->records[i].group, r = u->records[i].rank;
        int pid = u->records[i].pid;
        graft_status_t st = graft_membership_evict(a->obs, g, r, a->host, pid);
        if (st == GRAFT_OK)
            agent_event(a, "evicted", "slot %d: the record of (group %u, rank %u) by pid %d: "
                        "its lease revoked, the slot free for a spare now", u->slot, g, r, pid);
        else if (st != GRAFT_ENOTFOUND && st != GRAFT_ESTATE)
            agent_event(a, "evict_failed", "slot %d: (group %u, rank %u): %s; the slot is free "
                        "once its lease lapses", u->slot, g, r, graft_status_string(st));
    }
    u->n_records = 0;
}

void agent_watch_wait(agent_t *a, uint32_t timeout_ms)
{
    if (a->obs != NULL) {
        uint64_t version = 0;
        /* A change or a time-out: either way the loop looks again. Kept, so
         * that a change the loop had no use for does not wake it again. */
        if (graft_membership_view_wait(a->obs, a->obs_version, timeout_ms, &version) == GRAFT_OK)
            a->obs_version = version;
        return;
    }
    struct timespec ts = {.tv_sec = timeout_ms / 1000, .tv_nsec = (long)(timeout_ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

void agent_watch_close(agent_t *a)
{
    graft_membership_destroy(a->obs);
    a->obs = NULL;
}
