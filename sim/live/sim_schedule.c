/*
 * Planning failure schedules (see sim_schedule.h). Every random draw comes
 * from one splitmix64 stream seeded by --seed, in a fixed order, so a plan
 * depends on nothing but the options and the schedule file.
 */
#include "sim_schedule.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char *const sim_kind_names[GRAFT_SIM_KIND_COUNT] = {
    "kill_rank", "kill_group", "kill_donor", "hang",
    "disaster",  "etcd_restart", "partition", "etcd_leader_kill",
    "isolate",   "netem",        "throttle",  "cut_donor", "lose_disks"};

const char *graft_sim_kind_name(graft_sim_kind_t kind)
{
    return (unsigned)kind < GRAFT_SIM_KIND_COUNT ? sim_kind_names[kind] : "unknown";
}

int graft_sim_kind_is_disaster(graft_sim_kind_t kind)
{
    return kind == GRAFT_SIM_DISASTER || kind == GRAFT_SIM_LOSE_DISKS;
}

static uint64_t sim_rng_next(uint64_t *s)
{
    uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

/* Uniform in [0, n); n > 0. The modulo bias is irrelevant at these sizes. */
static long long sim_rng_below(uint64_t *s, long long n)
{
    return (long long)(sim_rng_next(s) % (uint64_t)n);
}

static double sim_rng_unit(uint64_t *s)
{
    return (double)(sim_rng_next(s) >> 11) * (1.0 / 9007199254740992.0);
}

static void sim_sched_error(char **error_p, const char *fmt, ...) GRAFT_PRINTF(2, 3);
static void sim_sched_error(char **error_p, const char *fmt, ...)
{
    if (error_p == NULL) {
        return;
    }
    va_list ap;
    va_start(ap, fmt);
    char *msg = NULL;
    if (vasprintf(&msg, fmt, ap) < 0) {
        msg = NULL;
    }
    va_end(ap);
    free(*error_p);
    *error_p = msg;
}

typedef struct sim_plan {
    graft_sim_event_t *ev;
    size_t n, cap;
} sim_plan_t;

static graft_status_t sim_plan_add(sim_plan_t *p, const graft_sim_event_t *ev)
{
    if (p->n == p->cap) {
        size_t cap = p->cap ? p->cap * 2 : 32;
        graft_sim_event_t *ne = realloc(p->ev, cap * sizeof(*ne));
        if (ne == NULL) {
            return GRAFT_ENOMEM;
        }
        p->ev = ne;
        p->cap = cap;
    }
    p->ev[p->n++] = *ev;
    return GRAFT_OK;
}

/* Whether this run can inject a kind at all. */
static int sim_kind_possible(const graft_sim_live_opts_t *o, graft_sim_kind_t k)
{
    switch (k) {
    case GRAFT_SIM_KILL_DONOR:
        return o->groups >= 2;
    case GRAFT_SIM_ETCD_RESTART:
        /* Only an etcd we started can be restarted; a cluster loses one
         * member at a time (etcd_leader_kill). */
        return o->etcd_url == NULL && o->etcd_members <= 1;
    case GRAFT_SIM_ETCD_LEADER_KILL:
        /* The cluster must keep a quorum without its leader. */
        return o->etcd_url == NULL && o->etcd_members >= 3;
    case GRAFT_SIM_PARTITION:
    case GRAFT_SIM_ISOLATE:
    case GRAFT_SIM_NETEM:
    case GRAFT_SIM_THROTTLE:
        return o->netns;
    case GRAFT_SIM_CUT_DONOR:
        /* The recipient must have another donor to fail over to. */
        return o->netns && o->groups >= 3;
    case GRAFT_SIM_LOSE_DISKS:
        return o->persist_remote != NULL;
    default:
        return 1;
    }
}

/* Why sim_kind_possible() said no. */
static const char *sim_kind_needs(const graft_sim_live_opts_t *o, graft_sim_kind_t k)
{
    switch (k) {
    case GRAFT_SIM_KILL_DONOR:
        return "needs at least 2 groups";
    case GRAFT_SIM_ETCD_RESTART:
        return o->etcd_url != NULL ? "needs the embedded etcd, not --etcd"
                                   : "needs the embedded etcd of one member";
    case GRAFT_SIM_ETCD_LEADER_KILL:
        return "needs the embedded etcd with --etcd-members 3 or more";
    case GRAFT_SIM_CUT_DONOR:
        return o->netns ? "needs at least 3 groups: the recipient fails over to another donor"
                        : "needs --netns";
    case GRAFT_SIM_LOSE_DISKS:
        return "needs --persist-remote (the object store the job comes back from)";
    default:
        return "needs --netns";
    }
}

/* Drops the targets a kind does not have (job-wide kinds have none; group
 * kinds no rank; kill_donor and cut_donor keep the rank: the donor's). */
static void sim_event_trim_targets(graft_sim_event_t *ev)
{
    switch (ev->kind) {
    case GRAFT_SIM_DISASTER:
    case GRAFT_SIM_LOSE_DISKS:
    case GRAFT_SIM_ETCD_RESTART:
    case GRAFT_SIM_ETCD_LEADER_KILL:
        ev->group = ev->rank = -1;
        break;
    case GRAFT_SIM_KILL_GROUP:
    case GRAFT_SIM_PARTITION:
    case GRAFT_SIM_ISOLATE:
    case GRAFT_SIM_NETEM:
    case GRAFT_SIM_THROTTLE:
        ev->rank = -1;
        break;
    default:
        break;
    }
}

/* A hang must outlast the lease so that it is detected: the engine asks
 * for a 1 s TTL, but etcd rounds a lease up to its minimum (1.5 x the
 * election timeout, 2 s by default) and checks expiry every 500 ms. An
 * etcd outage is kept short of it. */
static long long sim_default_duration(graft_sim_kind_t k, uint64_t *rng)
{
    switch (k) {
    case GRAFT_SIM_HANG:
        return 3000 + sim_rng_below(rng, 1500);
    case GRAFT_SIM_ETCD_RESTART:
        return 200 + sim_rng_below(rng, 400);
    case GRAFT_SIM_PARTITION:
    case GRAFT_SIM_ISOLATE:
        return 1500 + sim_rng_below(rng, 1000);
    case GRAFT_SIM_NETEM:
        /* Long enough for several lease renewals and steady-path rounds
         * to cross the lossy link. */
        return 2000 + sim_rng_below(rng, 1000);
    case GRAFT_SIM_THROTTLE:
        /* Long enough for a heal of the ballast to start under it. */
        return 3000 + sim_rng_below(rng, 2000);
    case GRAFT_SIM_CUT_DONOR:
        /* Past the recipient's donor stall timeout (5 s by default), so
         * the pull drops the cut donor and fails over, instead of only
         * waiting until the routes are back. */
        return 6000 + sim_rng_below(rng, 1000);
    case GRAFT_SIM_ETCD_LEADER_KILL:
        /* Down for about one election, so the member comes back to a
         * cluster that has just elected another leader. */
        return 1000 + sim_rng_below(rng, 1000);
    default:
        return 0;
    }
}

/*
 * N failures of mixed kinds. The mix cycles through a fixed pattern (kills
 * dominate, as in production) with one disaster per 20 failures and at least
 * one when N >= 7, so a long enough run exercises every kind; the sequence is
 * then shuffled and spread over the middle 80 % of the steps. netem is left
 * out: it needs the kernel's netem qdisc, which a kernel that runs --netns
 * may lack (a schedule file asks for it explicitly). Kinds a run cannot
 * inject are skipped, so appending one keeps the plans of runs without it.
 */
static graft_status_t sim_plan_random(const graft_sim_live_opts_t *o, long long n, uint64_t *rng,
                                      sim_plan_t *p)
{
    static const graft_sim_kind_t cycle[] = {
        GRAFT_SIM_KILL_RANK, GRAFT_SIM_KILL_GROUP,   GRAFT_SIM_HANG,      GRAFT_SIM_KILL_RANK,
        GRAFT_SIM_KILL_DONOR, GRAFT_SIM_ETCD_RESTART, GRAFT_SIM_ETCD_LEADER_KILL,
        GRAFT_SIM_KILL_RANK, GRAFT_SIM_KILL_GROUP, GRAFT_SIM_HANG, GRAFT_SIM_KILL_DONOR,
        GRAFT_SIM_PARTITION, GRAFT_SIM_ISOLATE, GRAFT_SIM_THROTTLE, GRAFT_SIM_CUT_DONOR};
    graft_status_t st = GRAFT_OK;
    graft_sim_kind_t *kinds = NULL;
    if (n <= 0) {
        goto out;
    }
    kinds = calloc((size_t)n, sizeof(*kinds));
    if (kinds == NULL) {
        st = GRAFT_ENOMEM;
        goto out;
    }
    long long disasters = n / 20 + (n >= 7 && n < 20 ? 1 : 0);
    size_t c = 0;
    for (long long i = 0; i < n; i++) {
        if (i < disasters) {
            kinds[i] = GRAFT_SIM_DISASTER;
            continue;
        }
        graft_sim_kind_t k;
        do {
            k = cycle[c++ % (sizeof(cycle) / sizeof(cycle[0]))];
        } while (!sim_kind_possible(o, k));
        kinds[i] = k;
    }
    for (long long i = n - 1; i > 0; i--) { /* Fisher-Yates */
        long long j = sim_rng_below(rng, i + 1);
        graft_sim_kind_t t = kinds[i];
        kinds[i] = kinds[j];
        kinds[j] = t;
    }
    long long lo = o->steps / 10, hi = o->steps - o->steps / 10;
    if (hi <= lo) {
        hi = lo + 1;
    }
    int ndis = 0;
    for (long long i = 0; i < n; i++) {
        graft_sim_event_t ev;
        memset(&ev, 0, sizeof(ev));
        ev.kind = kinds[i];
        ev.group = (int)sim_rng_below(rng, o->groups);
        ev.rank = (int)sim_rng_below(rng, o->ranks);
        double pos = ((double)i + sim_rng_unit(rng)) / (double)n;
        ev.at_step = lo + (long long)floor(pos * (double)(hi - lo));
        ev.at_ms = -1;
        ev.duration_ms = sim_default_duration(ev.kind, rng);
        sim_event_trim_targets(&ev);
        if (ev.kind == GRAFT_SIM_DISASTER && o->persist_remote != NULL && ndis++ % 2 == 0) {
            /* With an object store, every other disaster (the first
             * among them) also loses the disks. */
            ev.kind = GRAFT_SIM_LOSE_DISKS;
        } else if (ev.kind == GRAFT_SIM_DISASTER) {
            /* Every other disaster corrupts the newest checkpoint (the engine
             * always keeps one: a temporary root when none is given). */
            ev.corrupt = ndis++ % 2;
        }
        st = sim_plan_add(p, &ev);
        if (st != GRAFT_OK) {
            goto out;
        }
    }
out:
    free(kinds);
    return st;
}

/* Random single-rank kills at a per-step rate (Bernoulli per step). */
static graft_status_t sim_plan_rate(const graft_sim_live_opts_t *o, double per_step,
                                    uint64_t *rng, sim_plan_t *p)
{
    for (long long s = 1; s < o->steps; s++) {
        if (sim_rng_unit(rng) >= per_step) {
            continue;
        }
        graft_sim_event_t ev;
        memset(&ev, 0, sizeof(ev));
        ev.kind = GRAFT_SIM_KILL_RANK;
        ev.group = (int)sim_rng_below(rng, o->groups);
        ev.rank = (int)sim_rng_below(rng, o->ranks);
        ev.at_step = s;
        ev.at_ms = -1;
        graft_status_t st = sim_plan_add(p, &ev);
        if (st != GRAFT_OK) {
            return st;
        }
    }
    return GRAFT_OK;
}

/* Reads an optional non-negative integer member; -2: wrong type/range. */
static long long sim_json_int(json_t *obj, const char *key, long long dflt)
{
    json_t *v = json_object_get(obj, key);
    if (v == NULL) {
        return dflt;
    }
    if (!json_is_integer(v) || json_integer_value(v) < 0) {
        return -2;
    }
    return (long long)json_integer_value(v);
}

static graft_status_t sim_parse_event(const graft_sim_live_opts_t *o, json_t *e, size_t idx,
                                      uint64_t *rng, graft_sim_event_t *ev_p, char **error_p)
{
    static const char *const allowed[] = {"kind",   "group",       "rank",   "at_step",
                                          "at_ms",  "duration_ms", "corrupt"};
    graft_sim_event_t ev;
    memset(&ev, 0, sizeof(ev));
    if (!json_is_object(e)) {
        sim_sched_error(error_p, "events[%zu]: not an object", idx);
        return GRAFT_EINVAL;
    }
    const char *key;
    json_t *val;
    json_object_foreach(e, key, val) {
        int ok = 0;
        for (size_t i = 0; i < sizeof(allowed) / sizeof(allowed[0]); i++) {
            ok |= strcmp(key, allowed[i]) == 0;
        }
        if (!ok) {
            sim_sched_error(error_p, "events[%zu]: unknown key '%s'", idx, key);
            return GRAFT_EINVAL;
        }
    }
    const char *kind = json_string_value(json_object_get(e, "kind"));
    if (kind == NULL) {
        sim_sched_error(error_p, "events[%zu].kind: missing or not a string", idx);
        return GRAFT_EINVAL;
    }
    ev.kind = GRAFT_SIM_KIND_COUNT;
    for (int k = 0; k < GRAFT_SIM_KIND_COUNT; k++) {
        if (strcmp(kind, sim_kind_names[k]) == 0) {
            ev.kind = (graft_sim_kind_t)k;
        }
    }
    if (ev.kind == GRAFT_SIM_KIND_COUNT) {
        sim_sched_error(error_p, "events[%zu].kind: unknown kind '%s'", idx, kind);
        return GRAFT_EINVAL;
    }
    if (!sim_kind_possible(o, ev.kind)) {
        sim_sched_error(error_p, "events[%zu].kind: '%s' cannot be injected in this run (%s)",
                        idx, kind, sim_kind_needs(o, ev.kind));
        return GRAFT_ENOTSUP;
    }
    long long g = sim_json_int(e, "group", -1), r = sim_json_int(e, "rank", -1);
    ev.at_step = sim_json_int(e, "at_step", -1);
    ev.at_ms = sim_json_int(e, "at_ms", -1);
    ev.duration_ms = sim_json_int(e, "duration_ms", -1);
    if (g == -2 || g >= o->groups) {
        sim_sched_error(error_p, "events[%zu].group: not an integer in [0, %d)", idx, o->groups);
        return GRAFT_EINVAL;
    }
    if (r == -2 || r >= o->ranks) {
        sim_sched_error(error_p, "events[%zu].rank: not an integer in [0, %d)", idx, o->ranks);
        return GRAFT_EINVAL;
    }
    if (ev.at_step == -2 || ev.at_ms == -2 || ev.duration_ms == -2) {
        sim_sched_error(error_p, "events[%zu]: at_step, at_ms and duration_ms must be "
                                 "non-negative integers", idx);
        return GRAFT_EINVAL;
    }
    if ((ev.at_step < 0) == (ev.at_ms < 0)) {
        sim_sched_error(error_p, "events[%zu]: give exactly one of at_step and at_ms", idx);
        return GRAFT_EINVAL;
    }
    if (ev.at_step >= o->steps) {
        sim_sched_error(error_p, "events[%zu].at_step: %lld is not below --steps %lld", idx,
                        ev.at_step, o->steps);
        return GRAFT_EINVAL;
    }
    json_t *c = json_object_get(e, "corrupt");
    if (c != NULL && !json_is_boolean(c)) {
        sim_sched_error(error_p, "events[%zu].corrupt: not a boolean", idx);
        return GRAFT_EINVAL;
    }
    ev.corrupt = json_is_true(c);
    if (ev.corrupt && ev.kind != GRAFT_SIM_DISASTER) {
        sim_sched_error(error_p, "events[%zu].corrupt: only a disaster corrupts a checkpoint",
                        idx);
        return GRAFT_EINVAL;
    }
    /* Unset targets are drawn from the seed, in event order. */
    ev.group = g >= 0 ? (int)g : (int)sim_rng_below(rng, o->groups);
    ev.rank = r >= 0 ? (int)r : (int)sim_rng_below(rng, o->ranks);
    sim_event_trim_targets(&ev);
    if (ev.duration_ms < 0) {
        ev.duration_ms = sim_default_duration(ev.kind, rng);
    }
    *ev_p = ev;
    return GRAFT_OK;
}

static graft_status_t sim_parse_file(const graft_sim_live_opts_t *o, const char *text,
                                     uint64_t *rng, sim_plan_t *p, char **error_p)
{
    graft_status_t st = GRAFT_OK;
    json_error_t jerr;
    json_t *root = json_loads(text, 0, &jerr);
    if (root == NULL) {
        sim_sched_error(error_p, "line %d column %d: %s", jerr.line, jerr.column, jerr.text);
        return GRAFT_EINVAL;
    }
    if (!json_is_object(root)) {
        sim_sched_error(error_p, "the schedule is not a JSON object");
        st = GRAFT_EINVAL;
        goto out;
    }
    const char *key;
    json_t *val;
    json_object_foreach(root, key, val) {
        if (strcmp(key, "events") != 0 && strcmp(key, "random_failures") != 0 &&
            strcmp(key, "random_kill_rate_per_step") != 0) {
            sim_sched_error(error_p, "unknown key '%s' (expected events, random_failures, "
                                     "random_kill_rate_per_step)", key);
            st = GRAFT_EINVAL;
            goto out;
        }
    }
    json_t *events = json_object_get(root, "events");
    if (events != NULL && !json_is_array(events)) {
        sim_sched_error(error_p, "events: not an array");
        st = GRAFT_EINVAL;
        goto out;
    }
    size_t i;
    json_t *e;
    json_array_foreach(events, i, e) {
        graft_sim_event_t ev;
        st = sim_parse_event(o, e, i, rng, &ev, error_p);
        if (st == GRAFT_OK) {
            st = sim_plan_add(p, &ev);
        }
        if (st != GRAFT_OK) {
            goto out;
        }
    }
    long long nrand = sim_json_int(root, "random_failures", 0);
    if (nrand < 0 || nrand > 1000000) {
        sim_sched_error(error_p, "random_failures: not an integer in [0, 1000000]");
        st = GRAFT_EINVAL;
        goto out;
    }
    st = sim_plan_random(o, nrand, rng, p);
    if (st != GRAFT_OK) {
        goto out;
    }
    json_t *rate = json_object_get(root, "random_kill_rate_per_step");
    if (rate != NULL) {
        double r = json_is_number(rate) ? json_number_value(rate) : -1.0;
        if (!(r >= 0.0 && r <= 1.0)) {
            sim_sched_error(error_p, "random_kill_rate_per_step: not a number in [0, 1]");
            st = GRAFT_EINVAL;
            goto out;
        }
        st = sim_plan_rate(o, r, rng, p);
    }
out:
    json_decref(root);
    return st;
}

/* Step-triggered events by step, then timed events by time; stable, so
 * events at the same trigger keep the order they were planned in. */
static int sim_event_cmp(const void *a, const void *b)
{
    const graft_sim_event_t *x = a, *y = b;
    int xs = x->at_step >= 0, ys = y->at_step >= 0;
    if (xs != ys) {
        return ys - xs;
    }
    long long kx = xs ? x->at_step : x->at_ms, ky = ys ? y->at_step : y->at_ms;
    return kx < ky ? -1 : kx > ky;
}

graft_status_t graft_sim_schedule_plan(const graft_sim_live_opts_t *opts, const char *json_text,
                                       graft_sim_schedule_t **sched_p, char **error_p)
{
    graft_status_t st = GRAFT_OK;
    sim_plan_t p = {0};
    graft_sim_schedule_t *s = NULL;
    /* A stream of its own, so the trainers' use of the seed is unrelated. */
    uint64_t rng = opts->seed ^ 0x5ced01e5a11f00d5ull;
    if (json_text != NULL) {
        st = sim_parse_file(opts, json_text, &rng, &p, error_p);
        if (st != GRAFT_OK) {
            goto fail;
        }
    }
    st = sim_plan_random(opts, opts->random_failures, &rng, &p);
    if (st != GRAFT_OK) {
        goto fail;
    }
    /* Insertion sort: stable and plenty fast for a few thousand events. */
    for (size_t i = 1; i < p.n; i++) {
        graft_sim_event_t t = p.ev[i];
        size_t j = i;
        while (j > 0 && sim_event_cmp(&p.ev[j - 1], &t) > 0) {
            p.ev[j] = p.ev[j - 1];
            j--;
        }
        p.ev[j] = t;
    }
    s = calloc(1, sizeof(*s));
    if (s == NULL) {
        st = GRAFT_ENOMEM;
        goto fail;
    }
    s->events = p.ev;
    s->n_events = p.n;
    *sched_p = s;
    return GRAFT_OK;
fail:
    if (st == GRAFT_ENOMEM) {
        sim_sched_error(error_p, "out of memory");
    }
    free(p.ev);
    return st;
}

void graft_sim_schedule_destroy(graft_sim_schedule_t *sched)
{
    if (sched == NULL) {
        return;
    }
    free(sched->events);
    free(sched);
}

json_t *graft_sim_event_json(const graft_sim_event_t *ev)
{
    json_t *o = json_object();
    if (o == NULL) {
        return NULL;
    }
    int bad = json_object_set_new(o, "kind", json_string(graft_sim_kind_name(ev->kind)));
    if (ev->group >= 0) {
        bad |= json_object_set_new(o, "group", json_integer(ev->group));
    }
    if (ev->rank >= 0) {
        bad |= json_object_set_new(o, "rank", json_integer(ev->rank));
    }
    if (ev->at_step >= 0) {
        bad |= json_object_set_new(o, "at_step", json_integer(ev->at_step));
    } else {
        bad |= json_object_set_new(o, "at_ms", json_integer(ev->at_ms));
    }
    if (ev->duration_ms > 0) {
        bad |= json_object_set_new(o, "duration_ms", json_integer(ev->duration_ms));
    }
    if (ev->kind == GRAFT_SIM_DISASTER) {
        bad |= json_object_set_new(o, "corrupt", json_boolean(ev->corrupt));
    }
    if (bad) {
        json_decref(o);
        return NULL;
    }
    return o;
}

json_t *graft_sim_schedule_json(const graft_sim_schedule_t *sched)
{
    json_t *a = json_array();
    for (size_t i = 0; a != NULL && i < sched->n_events; i++) {
        if (json_array_append_new(a, graft_sim_event_json(&sched->events[i])) != 0) {
            json_decref(a);
            a = NULL;
        }
    }
    return a;
}
