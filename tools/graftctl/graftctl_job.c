/*
 * graftctl status, watch, drift and evict: the job as etcd holds it, read
 * through an observer's view and the job's event history.
 */
#include "graftctl.h"
#include "graftctl_dash.h"

#include <graft/graft.h>

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <jansson.h>

static const char *member_state_name(graft_member_state_t s)
{
    switch (s) {
    case GRAFT_MEMBER_JOINING: return "joining";
    case GRAFT_MEMBER_HEALTHY: return "healthy";
    case GRAFT_MEMBER_RECOVERING: return "recovering";
    case GRAFT_MEMBER_LEAVING: return "leaving";
    case GRAFT_MEMBER_CANNOT_SERVE: return "cannot-serve";
    default: return "unspecified";
    }
}

static bool in_list(const uint32_t *v, size_t n, uint32_t x)
{
    for (size_t i = 0; i < n; i++)
        if (v[i] == x)
            return true;
    return false;
}

static json_t *quorum_json(const graft_quorum_t *q)
{
    json_t *members = json_array();
    json_t *recs = json_array();
    for (size_t i = 0; i < q->n_members; i++)
        json_array_append_new(members, json_integer(q->members[i]));
    for (size_t i = 0; i < q->n_recoveries; i++) {
        json_t *donors = json_array();
        for (size_t d = 0; d < q->recoveries[i].n_donors; d++)
            json_array_append_new(donors, json_integer(q->recoveries[i].donors[d]));
        json_array_append_new(recs, json_pack("{s:I,s:o}", "recipient",
                                              (json_int_t)q->recoveries[i].recipient, "donors",
                                              donors));
    }
    return json_pack("{s:I,s:I,s:I,s:o,s:o,s:I,s:I}", "id", (json_int_t)q->id, "round",
                     (json_int_t)q->round, "step", (json_int_t)q->step, "members", members,
                     "recoveries", recs, "min_groups", (json_int_t)q->min_groups,
                     "formed_unix_ms", (json_int_t)q->formed_unix_ms);
}

/* Whether every rank of the group the history names ended cleanly: its
 * last membership event (join, leave, lease_lost) is the "leave" that
 * graft_destroy() records before it revokes its lease; not an eviction,
 * a lost lease, or a kill (which records nothing after the join). No write
 * of its own: the rank's leave event is the record (docs/OPERATIONS.md). */
static bool group_finished(const graft_event_t *ev, size_t nev, uint32_t group)
{
    uint32_t seen[256]; /* ranks whose newest membership event was read */
    size_t n = 0;
    for (size_t i = nev; i-- > 0;) {
        const graft_event_t *e = &ev[i];
        if (e->group != group || (e->kind != GRAFT_EVENT_JOIN && e->kind != GRAFT_EVENT_LEAVE &&
                                  e->kind != GRAFT_EVENT_LEASE_LOST))
            continue;
        if (in_list(seen, n, e->rank))
            continue; /* only the newest event of each rank counts */
        if (n == sizeof(seen) / sizeof(seen[0]))
            return false;
        seen[n++] = e->rank;
        if (e->kind != GRAFT_EVENT_LEAVE || e->detail == NULL || strcmp(e->detail, "leave") != 0)
            return false;
    }
    return n > 0;
}

/* The job's state from its groups' health: completed (every group
 * finished), failed (no rank live and some group did not finish: the state
 * in memory is gone), degraded (a group dead while others run), running. */
static const char *job_state(json_t *jgroups)
{
    size_t i, n = json_array_size(jgroups), finished = 0, dead = 0;
    json_t *g;
    json_array_foreach(jgroups, i, g) {
        const char *h = json_string_value(json_object_get(g, "health"));
        finished += strcmp(h, "finished") == 0;
        dead += strcmp(h, "dead") == 0;
    }
    if (n > 0 && finished == n)
        return "completed";
    if (n > 0 && finished + dead == n)
        return "failed";
    return dead > 0 ? "degraded" : "running";
}

/* Health of one group: dead (no rank live), finished (no rank live, and
 * each left cleanly: group_finished), recovering (a rank missing,
 * joining or recovering), cannot-serve (a rank's transfer endpoint cannot
 * serve, so the group is no donor to count on), voting-no (its votes fail
 * again and again: graftctl_group_voting_no), hung (every rank live but left out of the
 * latest quorum: its leases are renewed while its training loop is not
 * announcing) or healthy. */
static const char *group_health(const graft_membership_view_t *v, const graft_quorum_t *q,
                                uint32_t group, uint32_t ranks, uint64_t progress,
                                bool finished, const char *mismatch, bool voting_no)
{
    uint32_t live = 0;
    bool busy = false, cannot_serve = false;
    for (size_t i = 0; i < v->n_members; i++) {
        const graft_member_t *m = &v->members[i];
        if (m->group != group)
            continue;
        live++;
        busy |= m->state == GRAFT_MEMBER_JOINING || m->state == GRAFT_MEMBER_RECOVERING;
        cannot_serve |= m->state == GRAFT_MEMBER_CANNOT_SERVE;
    }
    if (live == 0)
        return finished ? "finished" : "dead";
    if (mismatch != NULL)
        return "misconfigured"; /* its settings and the quorum's disagree */
    if (live < ranks || busy)
        return "recovering";
    if (cannot_serve)
        return "cannot-serve";
    if (voting_no)
        return "voting-no";
    if (q != NULL && !in_list(q->members, q->n_members, group))
        return "hung";
    /* A recipient of the latest quorum recovers until the job committed
     * that quorum's step: steps after it go between the members (the
     * steady path) and leave the quorum record as it was. */
    if (q != NULL && progress <= q->step) {
        for (size_t i = 0; i < q->n_recoveries; i++)
            if (q->recoveries[i].recipient == group)
                return "recovering";
    }
    return "healthy";
}

/* A group's progress record is stale (the group stopped committing, ended
 * or died) when it is older than three record periods and than three of
 * the group's steps at the rate it last reported (a job of 30 s steps is
 * not stale after 6 s); its rate then reads 0. */
static uint64_t stale_after_ms(double steps_per_second)
{
    uint64_t ms = 3u * GRAFT_GROUP_PROGRESS_EVERY_MS;
    if (steps_per_second > 0 && 3000.0 / steps_per_second > (double)ms)
        ms = (uint64_t)(3000.0 / steps_per_second);
    return ms;
}

static const graft_group_progress_t *group_progress_find(const graft_group_progress_t *gp,
                                                         size_t n, uint32_t group)
{
    for (size_t i = 0; i < n; i++)
        if (gp[i].group == group)
            return &gp[i];
    return NULL;
}

/* The group's progress as its rank 0 last reported it (null without a
 * record): step, rate (0 once stale), and the record's age. */
static json_t *group_progress_json(const graft_group_progress_t *p, uint64_t now_ms)
{
    if (p == NULL)
        return json_null();
    uint64_t age = now_ms > p->unix_ms ? now_ms - p->unix_ms : 0;
    bool stale = age > stale_after_ms(p->steps_per_second);
    return json_pack("{s:I,s:f,s:I,s:I,s:b,s:I}", "step", (json_int_t)p->step,
                     "steps_per_second", stale ? 0.0 : p->steps_per_second, "unix_ms",
                     (json_int_t)p->unix_ms, "age_ms", (json_int_t)age, "stale", stale,
                     "quorum_id", (json_int_t)p->quorum_id);
}

/* A live rank: its member record, its lease's time left, and its step.
 * The member record has the step at which the rank turned healthy; a rank
 * that holds its group's step has the step its rank 0 reported since. */
static json_t *rank_json(graftctl_conn_t *c, const graft_member_t *m,
                         const graft_group_progress_t *gpr)
{
    int64_t ttl = -1;
    if (graft_etcd_lease_ttl(c->etcd, m->lease_id, &ttl, NULL) != GRAFT_OK)
        ttl = -1;
    uint64_t step = m->committed_step;
    bool holds = m->state == GRAFT_MEMBER_HEALTHY || m->state == GRAFT_MEMBER_CANNOT_SERVE;
    if (holds && gpr != NULL && gpr->step > step)
        step = gpr->step;
    return json_pack("{s:I,s:s,s:I,s:I,s:o,s:I,s:o,s:I,s:I}", "rank", (json_int_t)m->rank,
                     "state", member_state_name(m->state), "step", (json_int_t)step,
                     "incarnation", (json_int_t)m->incarnation, "host",
                     graftctl_json_text(m->host), "pid", (json_int_t)m->pid,
                     "transfer_address", graftctl_json_text(m->transfer_address), "lease_ttl_s",
                     (json_int_t)ttl, "lease_id", (json_int_t)m->lease_id);
}

/* The groups the job has: live members, the latest quorum, and every
 * group the history names (a dead group has no member record left). */
static void note_group(uint32_t *groups, size_t *n, size_t cap, uint32_t g)
{
    if (!in_list(groups, *n, g) && *n < cap)
        groups[(*n)++] = g;
}

/* Every group of the job (note_group) and the ranks per group, as the
 * member records and the history show them. */
static size_t job_groups(const graft_membership_view_t *v, const graft_quorum_t *q,
                         const graft_event_t *ev, size_t nev, uint32_t *groups, size_t cap,
                         uint32_t *ranks_p)
{
    size_t ng = 0;
    for (size_t i = 0; i < v->n_members; i++) {
        note_group(groups, &ng, cap, v->members[i].group);
        if (v->members[i].rank + 1 > *ranks_p)
            *ranks_p = v->members[i].rank + 1;
    }
    for (size_t i = 0; q != NULL && i < q->n_members; i++)
        note_group(groups, &ng, cap, q->members[i]);
    for (size_t i = 0; i < nev; i++) {
        if (ev[i].kind == GRAFT_EVENT_JOIN || ev[i].kind == GRAFT_EVENT_LEAVE ||
            ev[i].kind == GRAFT_EVENT_LEASE_LOST) {
            note_group(groups, &ng, cap, ev[i].group);
            if (ev[i].rank + 1 > *ranks_p)
                *ranks_p = ev[i].rank + 1;
        }
    }
    return ng;
}

static int cmp_u32(const void *a, const void *b)
{
    uint32_t x = *(const uint32_t *)a, y = *(const uint32_t *)b;
    return x < y ? -1 : x > y;
}

/* A quorum record that does not decode (docs/KEYS.md): the one the key
 * holds now, else the latest replacement the history records; null when
 * neither. */
static json_t *quorum_record_json(const graftctl_conn_t *c, const graft_membership_view_t *v,
                                  const graft_event_t *ev, size_t nev)
{
    if (v->quorum_bad_mod != 0)
        return json_sprintf(GRAFT_MEMBERSHIP_QUORUM_BAD_TEXT " at %squorum does not decode: %s "
                            "(mod_revision %" PRId64 "); the next formation replaces it",
                            c->prefix, graft_status_string(v->quorum_bad_reason),
                            v->quorum_bad_mod);
    static const char lead[] = GRAFT_MEMBERSHIP_QUORUM_BAD_TEXT " at ";
    for (size_t i = nev; i-- > 0;)
        if (ev[i].kind == GRAFT_EVENT_ERROR && ev[i].detail != NULL &&
            strncmp(ev[i].detail, lead, strlen(lead)) == 0)
            return graftctl_json_text(ev[i].detail); /* json_string(): NULL if not UTF-8 */
    return json_null();
}

/* What each group's entry of the status reads. */
typedef struct status_ctx {
    graftctl_conn_t *c;
    const graft_membership_view_t *v;
    const graft_quorum_t *q;
    const graft_event_t *ev;
    size_t nev;
    const graft_group_progress_t *gp;
    size_t ngp;
    uint32_t ranks;
    uint64_t job_step, now_ms;
} status_ctx_t;

/* One group's entry: its health and why, its progress and its ranks. The
 * job's rate (*rate_p) is the fastest fresh group's, as the groups of a
 * quorum commit together; *healthy_p counts the healthy groups. */
static json_t *group_status_json(const status_ctx_t *s, uint32_t group, double *rate_p,
                                 size_t *healthy_p)
{
    const graft_membership_view_t *v = s->v;
    const graft_quorum_t *q = s->q;
    json_t *jranks = json_array();
    const graft_group_progress_t *gpr = group_progress_find(s->gp, s->ngp, group);
    json_t *jprogress = group_progress_json(gpr, s->now_ms);
    for (size_t i = 0; i < v->n_members; i++)
        if (v->members[i].group == group)
            json_array_append_new(jranks, rank_json(s->c, &v->members[i], gpr));
    const char *mismatch = graftctl_group_mismatch(s->ev, s->nev, group);
    char novote[GRAFTCTL_TEXT_LEN + 96];
    bool voting_no = graftctl_group_voting_no(s->ev, s->nev, group, gpr != NULL ? gpr->step : 0,
                                              s->now_ms, novote, sizeof(novote));
    const char *health = group_health(v, q, group, s->ranks, s->job_step,
                                      group_finished(s->ev, s->nev, group), mismatch, voting_no);
    char noserve[GRAFTCTL_TEXT_LEN + 160];
    if (strcmp(health, "cannot-serve") == 0)
        graftctl_group_cannot_serve_reason(v, s->ev, s->nev, group, noserve, sizeof(noserve));
    /* A group that ended steps no more, however fresh its last record. */
    if (strcmp(health, "finished") == 0 && json_is_object(jprogress))
        json_object_set_new(jprogress, "steps_per_second", json_real(0));
    double grate = json_number_value(json_object_get(jprogress, "steps_per_second"));
    if (grate > *rate_p)
        *rate_p = grate;
    *healthy_p += strcmp(health, "healthy") == 0;
    return json_pack("{s:I,s:s,s:o,s:b,s:o,s:o}", "group", (json_int_t)group, "health", health,
                     "reason",
                     strcmp(health, "misconfigured") == 0  ? graftctl_json_text(mismatch)
                     : strcmp(health, "voting-no") == 0    ? graftctl_json_text(novote)
                     : strcmp(health, "cannot-serve") == 0 ? graftctl_json_text(noserve)
                                                           : json_null(),
                     "in_quorum", q != NULL && in_list(q->members, q->n_members, group),
                     "progress", jprogress, "ranks", jranks);
}

json_t *graftctl_status_json(graftctl_conn_t *c, const char *job, graft_status_t *st_p)
{
    json_t *jrecord = NULL;
    graft_status_t st;
    graft_membership_view_t *v = NULL;
    graft_quorum_t *q = NULL;
    graft_event_t *ev = NULL;
    size_t nev = 0;
    json_t *root = NULL;
    uint32_t groups[4096];
    size_t ng = 0;
    uint32_t ranks = 1;
    graft_group_progress_t *gp = NULL;
    size_t ngp = 0;

    st = graft_membership_view_get(c->obs, &v);
    if (st != GRAFT_OK)
        goto out;
    st = graft_membership_quorum_latest(c->obs, &q);
    if (st == GRAFT_ENOTFOUND)
        st = GRAFT_OK;
    if (st != GRAFT_OK)
        goto out;
    st = graft_membership_events_read(c->obs, 0, &ev, &nev);
    if (st != GRAFT_OK)
        goto out;
    ng = job_groups(v, q, ev, nev, groups, 4096, &ranks);
    jrecord = quorum_record_json(c, v, ev, nev);
    /* How far the job got: the quorum record shows where its epoch began
     * (steps of an unchanged epoch do not go through etcd). */
    uint64_t progress = 0;
    graft_status_t pst = graft_progress_read(c->etcd, job, &progress);
    if (pst != GRAFT_OK && pst != GRAFT_ENOTFOUND) {
        st = pst;
        goto out;
    }
    /* Each group's rank 0 reports its step every few seconds: the job's
     * step is the newest of those and the job's record. */
    st = graft_group_progress_read(c->etcd, job, &gp, &ngp);
    if (st != GRAFT_OK)
        goto out;
    uint64_t job_step = pst == GRAFT_OK ? progress : 0, now_ms = graftctl_now_ms();
    double rate = 0;
    for (size_t i = 0; i < ngp; i++) {
        note_group(groups, &ng, 4096, gp[i].group);
        if (gp[i].step > job_step)
            job_step = gp[i].step;
    }
    qsort(groups, ng, sizeof(groups[0]), cmp_u32);

    json_t *jgroups = json_array();
    size_t healthy = 0;
    const status_ctx_t sc = {c, v, q, ev, nev, gp, ngp, ranks, job_step, now_ms};
    for (size_t gi = 0; gi < ng; gi++)
        json_array_append_new(jgroups, group_status_json(&sc, groups[gi], &rate, &healthy));
    root = json_pack("{s:s,s:s,s:I,s:I,s:I,s:I,s:o,s:o,s:f,s:o,s:o,s:o}", "job", job, "state",
                     job_state(jgroups), "revision",
                     (json_int_t)v->revision, "ranks_per_group", (json_int_t)ranks, "groups_known",
                     (json_int_t)ng, "groups_healthy", (json_int_t)healthy, "progress_step",
                     pst == GRAFT_OK ? json_integer((json_int_t)progress) : json_null(),
                     "step", job_step > 0 ? json_integer((json_int_t)job_step) : json_null(),
                     "steps_per_second", rate,
                     "quorum", q != NULL ? quorum_json(q) : json_null(), "quorum_record",
                     jrecord, "groups", jgroups);
    jrecord = NULL;
    if (root == NULL)
        st = GRAFT_ENOMEM;
    else
        graftctl_job_pause_check(root, ev, nev);
out:
    json_decref(jrecord);
    graft_group_progress_free(gp);
    graft_membership_events_free(ev, nev);
    graft_membership_quorum_free(q);
    graft_membership_view_free(v);
    *st_p = st;
    return root;
}

static void status_print(json_t *s)
{
    json_t *q = json_object_get(s, "quorum");
    printf("job %s: %s, %" JSON_INTEGER_FORMAT " of %" JSON_INTEGER_FORMAT
           " groups healthy, %" JSON_INTEGER_FORMAT " ranks per group\n",
           json_string_value(json_object_get(s, "job")),
           json_string_value(json_object_get(s, "state")),
           json_integer_value(json_object_get(s, "groups_healthy")),
           json_integer_value(json_object_get(s, "groups_known")),
           json_integer_value(json_object_get(s, "ranks_per_group")));
    json_t *state_reason = json_object_get(s, "state_reason");
    char text[GRAFTCTL_TEXT_LEN];
    if (json_is_string(state_reason))
        printf("paused: %s\n",
               graftctl_text(json_string_value(state_reason), text, sizeof(text)));
    json_t *step = json_object_get(s, "step");
    const char *state = json_string_value(json_object_get(s, "state"));
    bool ended = strcmp(state, "completed") == 0 || strcmp(state, "failed") == 0;
    if (json_is_integer(step) && json_is_true(json_object_get(s, "progress_stale")) && !ended)
        printf("progress: step %" JSON_INTEGER_FORMAT " committed, no progress for %"
               JSON_INTEGER_FORMAT " s (each group's rank 0 reports every %d s)\n",
               json_integer_value(step),
               json_integer_value(json_object_get(s, "progress_age_ms")) / 1000,
               GRAFT_GROUP_PROGRESS_EVERY_MS / 1000);
    else if (json_is_integer(step))
        printf("progress: step %" JSON_INTEGER_FORMAT " committed, %.1f steps/s (each group's "
               "rank 0 reports every %d s)\n", json_integer_value(step),
               json_number_value(json_object_get(s, "steps_per_second")),
               GRAFT_GROUP_PROGRESS_EVERY_MS / 1000);
    if (json_is_object(q)) {
        printf("quorum id %" JSON_INTEGER_FORMAT " round %" JSON_INTEGER_FORMAT
               " formed at step %" JSON_INTEGER_FORMAT " members",
               json_integer_value(json_object_get(q, "id")),
               json_integer_value(json_object_get(q, "round")),
               json_integer_value(json_object_get(q, "step")));
        size_t i;
        json_t *x;
        json_array_foreach(json_object_get(q, "members"), i, x)
            printf(" %" JSON_INTEGER_FORMAT, json_integer_value(x));
        /* Its recipients heal at the quorum's step; once the job is past
         * it they are done (steps after go between the members). */
        bool healed = json_integer_value(step) > json_integer_value(json_object_get(q, "step"));
        json_array_foreach(json_object_get(q, "recoveries"), i, x)
            printf("%s%" JSON_INTEGER_FORMAT, i > 0 ? "," : healed ? "; healed " : "; recovering ",
                   json_integer_value(json_object_get(x, "recipient")));
        printf("\n");
    } else if (!json_is_string(json_object_get(s, "quorum_record"))) {
        printf("quorum: none formed yet\n");
    }
    json_t *record = json_object_get(s, "quorum_record");
    if (json_is_string(record)) {
        printf("%s\n", graftctl_text(json_string_value(record), text, sizeof(text)));
    }
    printf("\n%-6s %-10s %-5s %-11s %-8s %-20s %-8s %-7s %s\n", "GROUP", "HEALTH", "RANK",
           "STATE", "STEP", "INCARNATION", "PID", "LEASE", "TRANSFER");
    size_t gi, ri;
    json_t *g, *r;
    json_array_foreach(json_object_get(s, "groups"), gi, g) {
        json_int_t group = json_integer_value(json_object_get(g, "group"));
        const char *health = json_string_value(json_object_get(g, "health"));
        json_t *ranks = json_object_get(g, "ranks");
        if (json_is_string(json_object_get(g, "reason")))
            printf("group %" JSON_INTEGER_FORMAT " %s: %s\n", group, health,
                   graftctl_text(json_string_value(json_object_get(g, "reason")), text,
                                 sizeof(text)));
        json_t *p = json_object_get(g, "progress");
        if (json_array_size(ranks) > 0 && json_is_true(json_object_get(p, "stale")))
            printf("group %" JSON_INTEGER_FORMAT " %s: no progress for %" JSON_INTEGER_FORMAT
                   " s (at step %" JSON_INTEGER_FORMAT ")\n", group, health,
                   json_integer_value(json_object_get(p, "age_ms")) / 1000,
                   json_integer_value(json_object_get(p, "step")));
        if (json_array_size(ranks) == 0)
            printf("%-6" JSON_INTEGER_FORMAT " %-10s %-5s\n", group, health, "-");
        json_array_foreach(ranks, ri, r) {
            char lease[24], addr[GRAFTCTL_TEXT_LEN];
            json_int_t ttl = json_integer_value(json_object_get(r, "lease_ttl_s"));
            snprintf(lease, sizeof(lease), ttl < 0 ? "gone" : "%" JSON_INTEGER_FORMAT "s", ttl);
            printf("%-6" JSON_INTEGER_FORMAT " %-10s %-5" JSON_INTEGER_FORMAT
                   " %-11s %-8" JSON_INTEGER_FORMAT " %-20" JSON_INTEGER_FORMAT
                   " %-8" JSON_INTEGER_FORMAT " %-7s %s\n",
                   group, health, json_integer_value(json_object_get(r, "rank")),
                   json_string_value(json_object_get(r, "state")),
                   json_integer_value(json_object_get(r, "step")),
                   json_integer_value(json_object_get(r, "incarnation")),
                   json_integer_value(json_object_get(r, "pid")), lease,
                   graftctl_text(json_string_value(json_object_get(r, "transfer_address")),
                                 addr, sizeof(addr)));
        }
    }
}

int graftctl_cmd_status(const graftctl_opts_t *o, int argc, char **argv)
{
    graftctl_conn_t c;
    graft_status_t st;
    if (argc > 1) {
        fprintf(stderr, "graftctl status: unexpected argument '%s'\n", argv[1]);
        return GRAFTCTL_USAGE;
    }
    int rc = graftctl_connect(o, &c);
    if (rc != GRAFTCTL_OK)
        return rc;
    json_t *s = graftctl_status_json(&c, o->job, &st);
    if (s == NULL) {
        fprintf(stderr, "graftctl status: %s\n", graft_status_string(st));
        rc = GRAFTCTL_FAIL;
    } else if (o->json) {
        graftctl_print_json(s);
    } else {
        status_print(s);
        json_decref(s);
    }
    graftctl_disconnect(&c);
    return rc;
}

int graftctl_cmd_watch(const graftctl_opts_t *o, int argc, char **argv)
{
    uint64_t interval = 1000, count = 0;
    graftctl_conn_t c;
    graft_status_t st;
    for (int i = 1; i < argc; i++) {
        uint64_t *dst = strcmp(argv[i], "--interval-ms") == 0 ? &interval
                        : strcmp(argv[i], "--count") == 0     ? &count
                                                              : NULL;
        if (dst == NULL || i + 1 >= argc || !graftctl_parse_u64(argv[i + 1], dst) ||
            (dst == &interval && (interval == 0 || interval > 3600000))) {
            fprintf(stderr, "graftctl watch: bad argument '%s' (--interval-ms N, --count N)\n",
                    argv[i]);
            return GRAFTCTL_USAGE;
        }
        i++;
    }
    int rc = graftctl_connect(o, &c);
    if (rc != GRAFTCTL_OK)
        return rc;
    bool tty = isatty(STDOUT_FILENO);
    uint64_t version = 0;
    for (uint64_t n = 0; count == 0 || n < count; n++) {
        json_t *s = graftctl_status_json(&c, o->job, &st);
        if (s == NULL) {
            fprintf(stderr, "graftctl watch: %s\n", graft_status_string(st));
            rc = GRAFTCTL_FAIL;
            break;
        }
        if (o->json) {
            /* One object per line, for scripts that follow the stream. */
            char *text = json_dumps(s, JSON_COMPACT | JSON_PRESERVE_ORDER | JSON_ENSURE_ASCII);
            if (text != NULL)
                printf("%s\n", text);
            free(text);
        } else {
            if (tty)
                printf("\033[H\033[2J");
            status_print(s);
            printf("\n");
        }
        json_decref(s);
        fflush(stdout);
        /* Redraw on a change of the view, and at least every interval
         * (lease times and quorum rounds move without member changes). */
        if (graft_membership_view_wait(c.obs, version, (uint32_t)interval, &version) != GRAFT_OK)
            continue;
    }
    graftctl_disconnect(&c);
    return rc;
}

int graftctl_cmd_drift(const graftctl_opts_t *o, int argc, char **argv)
{
    graftctl_conn_t c;
    graft_event_t *ev = NULL;
    size_t nev = 0;
    graft_etcd_range_result_t res = {0};
    if (argc > 1) {
        fprintf(stderr, "graftctl drift: unexpected argument '%s'\n", argv[1]);
        return GRAFTCTL_USAGE;
    }
    int rc = graftctl_connect(o, &c);
    if (rc != GRAFTCTL_OK)
        return rc;
    graft_status_t st = graft_membership_events_read(c.obs, 0, &ev, &nev);
    if (st != GRAFT_OK) {
        fprintf(stderr, "graftctl drift: reading events: %s\n", graft_status_string(st));
        rc = GRAFTCTL_FAIL;
        goto out;
    }
    /* The newest comparison the runtime left: drift/<step>/<rank>/... */
    char key[128];
    char *folder = NULL;
    st = graft_drift_key_folder(o->job, &folder);
    if (st != GRAFT_OK) {
        fprintf(stderr, "graftctl drift: %s\n", graft_status_string(st));
        rc = GRAFTCTL_FAIL;
        goto out;
    }
    snprintf(key, sizeof(key), "%s", folder);
    graft_free(folder);
    graft_etcd_range_opts_t ro = {.prefix = true, .keys_only = true};
    st = graft_etcd_range(c.etcd, key, &ro, &res);
    if (st != GRAFT_OK) {
        fprintf(stderr, "graftctl drift: reading %s: %s\n", key, graft_status_string(st));
        rc = GRAFTCTL_FAIL;
        goto out;
    }
    uint64_t last_check = 0, records = 0;
    for (size_t i = 0; i < res.n_kvs; i++) {
        unsigned long long s = 0;
        if (sscanf(res.kvs[i].key + strlen(key), "%llu", &s) == 1 && s >= last_check) {
            records = s > last_check ? 1 : records + 1;
            last_check = s;
        }
    }
    const graft_event_t *last = NULL;
    size_t ndrift = 0;
    for (size_t i = 0; i < nev; i++) {
        if (ev[i].kind == GRAFT_EVENT_DRIFT) {
            last = &ev[i];
            ndrift++;
        }
    }
    json_t *j = json_pack("{s:s,s:o,s:I,s:I,s:o}", "job", o->job, "last_check_step",
                          res.n_kvs > 0 ? json_integer((json_int_t)last_check) : json_null(),
                          "check_records", (json_int_t)records, "drift_events", (json_int_t)ndrift,
                          "last_drift",
                          last == NULL ? json_null()
                                       : json_pack("{s:I,s:I,s:I,s:I,s:I,s:o}", "seq",
                                                   (json_int_t)last->seq, "step",
                                                   (json_int_t)last->step, "group",
                                                   (json_int_t)last->group, "rank",
                                                   (json_int_t)last->rank, "unix_ms",
                                                   (json_int_t)last->unix_ms, "detail",
                                                   graftctl_json_text(last->detail)));
    if (o->json) {
        graftctl_print_json(j);
    } else {
        if (res.n_kvs > 0)
            printf("last replica hash comparison: step %" PRIu64 " (%" PRIu64 " records)\n",
                   last_check, records);
        else
            printf("no replica hash comparison recorded\n");
        char detail[GRAFTCTL_TEXT_LEN];
        if (last == NULL)
            printf("no drift in the history\n");
        else
            printf("DRIFT (%zu events); newest at step %" PRIu64 ", group %" PRIu32
                   " rank %" PRIu32 ": %s\n",
                   ndrift, last->step, last->group, last->rank,
                   graftctl_text(last->detail, detail, sizeof(detail)));
        json_decref(j);
    }
    rc = last != NULL ? GRAFTCTL_FAIL : GRAFTCTL_OK;
out:
    graft_etcd_range_result_clear(&res);
    graft_membership_events_free(ev, nev);
    graftctl_disconnect(&c);
    return rc;
}

static bool confirm(const char *question)
{
    char line[16];
    fprintf(stderr, "%s [y/N] ", question);
    fflush(stderr);
    if (fgets(line, sizeof(line), stdin) == NULL)
        return false;
    return line[0] == 'y' || line[0] == 'Y';
}

graft_status_t graftctl_evict_group(graftctl_conn_t *c, uint32_t group, const char *who,
                                    json_t **result_p, char *why, size_t why_len)
{
    graft_membership_view_t *v = NULL;
    int64_t leases[1024];
    size_t nl = 0, revoked = 0;
    char detail[256];
    json_t *jl = NULL;
    graft_status_t st = graft_membership_view_get(c->obs, &v);
    if (st != GRAFT_OK) {
        snprintf(why, why_len, "%s", graft_status_string(st));
        goto out;
    }
    for (size_t i = 0; i < v->n_members && nl < 1024; i++)
        if (v->members[i].group == group && v->members[i].lease_id != 0)
            leases[nl++] = v->members[i].lease_id;
    if (nl == 0) {
        snprintf(why, why_len, "group %" PRIu32 " has no live member", group);
        st = GRAFT_ENOTFOUND;
        goto out;
    }
    jl = json_array();
    for (size_t i = 0; i < nl; i++) {
        st = graft_etcd_lease_revoke(c->etcd, leases[i]);
        /* A lease that expired meanwhile is gone as the operator wanted. */
        if (st == GRAFT_OK || st == GRAFT_ENOTFOUND) {
            revoked++;
            json_array_append_new(jl, json_integer(leases[i]));
        } else {
            snprintf(why, why_len, "revoking lease %" PRId64 ": %s", leases[i],
                     graft_status_string(st));
        }
    }
    snprintf(detail, sizeof(detail), "evicted by an operator (%s): %zu of %zu leases revoked",
             who, revoked, nl);
    graft_event_t e = {.kind = GRAFT_EVENT_LEAVE, .group = group, .detail = detail};
    graft_status_t est = graft_membership_event_append(c->obs, &e);
    if (est != GRAFT_OK)
        snprintf(why, why_len, "recording the event: %s", graft_status_string(est));
    st = revoked < nl ? GRAFT_EETCD : est;
    *result_p = json_pack("{s:I,s:O,s:b,s:s}", "group", (json_int_t)group, "leases_revoked", jl,
                          "event_recorded", est == GRAFT_OK, "detail", detail);
out:
    json_decref(jl);
    graft_membership_view_free(v);
    return st;
}

int graftctl_cmd_evict(const graftctl_opts_t *o, int argc, char **argv)
{
    uint64_t group;
    graftctl_conn_t c;
    json_t *result = NULL;
    char why[256] = "";
    if (argc != 2 || !graftctl_parse_u64(argv[1], &group) || group > UINT32_MAX) {
        fprintf(stderr, "graftctl evict: give one GROUP number\n");
        return GRAFTCTL_USAGE;
    }
    if (!o->yes && !isatty(STDIN_FILENO)) {
        fprintf(stderr, "graftctl evict: not asking on a non-terminal: give --yes to evict\n");
        return GRAFTCTL_USAGE;
    }
    int rc = graftctl_connect(o, &c);
    if (rc != GRAFTCTL_OK)
        return rc;
    rc = GRAFTCTL_FAIL;
    char question[160];
    snprintf(question, sizeof(question), "evict group %" PRIu64 " of job '%s'?", group, o->job);
    if (!o->yes && !confirm(question)) {
        fprintf(stderr, "graftctl evict: not confirmed; nothing done\n");
        goto out;
    }
    graft_status_t st = graftctl_evict_group(&c, (uint32_t)group, "graftctl", &result, why,
                                             sizeof(why));
    if (st != GRAFT_OK)
        fprintf(stderr, "graftctl evict: job '%s': %s\n", o->job, why);
    if (result != NULL && o->json)
        graftctl_print_json(json_incref(result));
    else if (result != NULL)
        printf("group %" PRIu64 ": %s\n", group,
               json_string_value(json_object_get(result, "detail")));
    rc = st == GRAFT_OK ? GRAFTCTL_OK : GRAFTCTL_FAIL;
out:
    json_decref(result);
    graftctl_disconnect(&c);
    return rc;
}
