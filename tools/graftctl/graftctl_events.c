/*
 * graftctl events: the job's event history, filtered, and each recovery
 * put together from the events that record it.
 *
 * What the history holds of a recovery: the replacement's `join`, the
 * `recovery_assigned` of the quorum that named it a recipient (with its
 * donors), and its ranks' `recovery_done` (transfer time, bytes, donors
 * lost). The phases are cut from those: `rejoin_to_assign` (join until the
 * quorum named it), `transfer` (the pull, as the recipient measured it) and
 * `verify` (the rest until recovery_done: verification and install). The
 * time from the failure to its detection is not recorded by a process that
 * was killed; graft-sim measures it from outside (docs/SIM.md).
 */
#include "graftctl.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <jansson.h>

typedef struct events_filter {
    uint32_t kinds; /* bit per kind; 0 = all */
    bool has_group;
    uint32_t group;
    uint64_t since_ms;
    uint64_t until_ms;
    bool recoveries;
} events_filter_t;

/* A date or a time of day, local time: today, yesterday, YYYY-MM-DD,
 * YYYY-MM-DD HH:MM[:SS] (or with a T), HH:MM[:SS] (today's, or
 * yesterday's when today's is still to come). */
static bool parse_clock(const char *s, uint64_t *ms_p)
{
    time_t now = time(NULL);
    struct tm tm;
    localtime_r(&now, &tm);
    tm.tm_isdst = -1;
    struct tm day = tm;
    bool date = false, clock = true;
    const char *end = NULL;
    if (strcmp(s, "today") == 0 || strcmp(s, "yesterday") == 0) {
        tm.tm_hour = tm.tm_min = tm.tm_sec = 0;
        tm.tm_mday -= s[0] == 'y';
        end = s + strlen(s);
        clock = false;
    } else if ((end = strptime(s, "%Y-%m-%d", &day)) != NULL) {
        tm = day; /* a failed strptime may have written some fields */
        date = true;
        tm.tm_hour = tm.tm_min = tm.tm_sec = 0;
        if (*end == ' ' || *end == 'T')
            end++;
        else
            clock = false;
    } else {
        end = s;
    }
    if (clock) {
        tm.tm_sec = 0;
        struct tm hms = tm, hm = tm;
        const char *e = strptime(end, "%H:%M:%S", &hms);
        if (e != NULL)
            tm = hms;
        else if ((e = strptime(end, "%H:%M", &hm)) != NULL)
            tm = hm;
        end = e;
    }
    if (end == NULL || *end != '\0')
        return false;
    time_t t = mktime(&tm);
    if (t == (time_t)-1)
        return false;
    if (!date && clock && t > now)
        t -= 86400; /* a time of day still to come: yesterday's */
    if (t < 0)
        return false;
    *ms_p = (uint64_t)t * 1000u;
    return true;
}

/* T is unix milliseconds, an age (90s, 10m, 2h, 1d), or a date or time of
 * day (parse_clock). */
static bool parse_time(const char *s, uint64_t *ms_p)
{
    uint64_t v;
    size_t n = strlen(s);
    if (graftctl_parse_u64(s, &v)) {
        *ms_p = v;
        return true;
    }
    if (parse_clock(s, ms_p))
        return true;
    if (n < 2)
        return false;
    char unit = s[n - 1];
    char num[32];
    if (n - 1 >= sizeof(num))
        return false;
    memcpy(num, s, n - 1);
    num[n - 1] = '\0';
    if (!graftctl_parse_u64(num, &v))
        return false;
    uint64_t mul = unit == 's' ? 1000 : unit == 'm' ? 60000 : unit == 'h' ? 3600000
                   : unit == 'd' ? 86400000 : 0;
    uint64_t now = graftctl_now_ms();
    if (mul == 0 || v > now / mul)
        return false;
    *ms_p = now - v * mul;
    return true;
}

static bool parse_kinds(const char *list, uint32_t *kinds_p)
{
    char buf[256];
    snprintf(buf, sizeof(buf), "%s", list);
    uint32_t kinds = 0;
    for (char *save = NULL, *k = strtok_r(buf, ",", &save); k != NULL;
         k = strtok_r(NULL, ",", &save)) {
        int found = 0;
        for (int i = GRAFT_EVENT_JOIN; i <= GRAFT_EVENT_KIND_LAST; i++)
            if (strcmp(k, graft_event_kind_string((graft_event_kind_t)i)) == 0)
                found = i;
        if (found == 0) {
            fprintf(stderr, "graftctl events: unknown kind '%s' (one of:", k);
            for (int i = GRAFT_EVENT_JOIN; i <= GRAFT_EVENT_KIND_LAST; i++)
                fprintf(stderr, " %s", graft_event_kind_string((graft_event_kind_t)i));
            fprintf(stderr, ")\n");
            return false;
        }
        kinds |= 1u << found;
    }
    *kinds_p = kinds;
    return kinds != 0;
}

static int parse_filter(int argc, char **argv, events_filter_t *f)
{
    memset(f, 0, sizeof(*f));
    f->until_ms = UINT64_MAX;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (strcmp(a, "--recoveries") == 0) {
            f->recoveries = true;
            continue;
        }
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
        uint64_t g = 0;
        bool ok = v != NULL;
        if (ok && strcmp(a, "--kind") == 0) {
            ok = parse_kinds(v, &f->kinds);
        } else if (ok && strcmp(a, "--group") == 0) {
            ok = graftctl_parse_u64(v, &g) && g <= UINT32_MAX;
            f->group = (uint32_t)g;
            f->has_group = true;
        } else if (ok && strcmp(a, "--since") == 0) {
            ok = parse_time(v, &f->since_ms);
        } else if (ok && strcmp(a, "--until") == 0) {
            ok = parse_time(v, &f->until_ms);
        } else {
            ok = false;
        }
        if (!ok) {
            fprintf(stderr, "graftctl events: bad argument '%s%s%s' (--kind K[,K], --group G, "
                    "--since T, --until T, --recoveries)\n", a, v ? " " : "", v ? v : "");
            return GRAFTCTL_USAGE;
        }
        i++;
    }
    return GRAFTCTL_OK;
}

static bool keep(const events_filter_t *f, const graft_event_t *e)
{
    return (f->kinds == 0 || (f->kinds & (1u << e->kind)) != 0) &&
           (!f->has_group || e->group == f->group) && e->unix_ms >= f->since_ms &&
           e->unix_ms <= f->until_ms;
}

json_t *graftctl_event_json(const graft_event_t *e)
{
    json_t *members = json_array();
    for (size_t i = 0; i < e->n_members; i++)
        json_array_append_new(members, json_integer(e->members[i]));
    return json_pack("{s:I,s:s,s:I,s:I,s:I,s:I,s:I,s:I,s:I,s:o,s:I,s:b,s:o}", "seq",
                     (json_int_t)e->seq, "kind", graft_event_kind_string(e->kind), "unix_ms",
                     (json_int_t)e->unix_ms, "group", (json_int_t)e->group, "rank",
                     (json_int_t)e->rank, "incarnation", (json_int_t)e->incarnation, "quorum_id",
                     (json_int_t)e->quorum_id, "round", (json_int_t)e->round, "step",
                     (json_int_t)e->step, "members", members, "duration_us",
                     (json_int_t)e->duration_us, "ok", e->ok, "detail",
                     graftctl_json_text(e->detail));
}

/* Whether the heal @d gave its group its first state rather than healing
 * it from a failure: a heal in a quorum at step 0, where nothing was ever
 * committed, so nothing was lost (a new job's groups take their state from
 * one). Read from the event itself: the history around it is best-effort
 * (events are shed while etcd is slow), and a rule that asked whether the
 * group served or stood in an earlier quorum misread a group whose
 * quorum_formed event had been shed (test_metrics_agree_with_the_report). A
 * group that joins a running job pulls the job's state as a replacement
 * does and counts with the recoveries. */
static bool first_state(const graft_event_t *d)
{
    return d->step == 0;
}

/* One recovery of a rank: its recovery_done and the events before it. */
json_t *graftctl_recovery_json(const graft_event_t *ev, size_t n, size_t done_i)
{
    const graft_event_t *d = &ev[done_i];
    const graft_event_t *assigned = NULL, *join = NULL;
    for (size_t i = done_i; i-- > 0;) {
        if (assigned == NULL && ev[i].kind == GRAFT_EVENT_RECOVERY_ASSIGNED &&
            ev[i].group == d->group)
            assigned = &ev[i];
        else if (assigned != NULL && ev[i].group == d->group && ev[i].rank == d->rank &&
                 (ev[i].kind == GRAFT_EVENT_JOIN || ev[i].kind == GRAFT_EVENT_RECOVERY_DONE)) {
            /* A rank that healed before without joining again since was
             * not replaced: a peer of its group was. */
            join = ev[i].kind == GRAFT_EVENT_JOIN ? &ev[i] : NULL;
            break;
        }
    }
    unsigned long long bytes = 0;
    size_t donors = 0;
    if (d->detail == NULL || sscanf(d->detail, "%zu donors, %llu bytes", &donors, &bytes) != 2)
        bytes = 0;
    double transfer = (double)d->duration_us / 1e6;
    json_t *phases = json_object();
    if (assigned != NULL && join != NULL && assigned->unix_ms >= join->unix_ms)
        json_object_set_new(phases, "rejoin_to_assign",
                            json_real((double)(assigned->unix_ms - join->unix_ms) / 1e3));
    json_object_set_new(phases, "transfer", json_real(transfer));
    if (assigned != NULL && d->unix_ms >= assigned->unix_ms) {
        double rest = (double)(d->unix_ms - assigned->unix_ms) / 1e3 - transfer;
        json_object_set_new(phases, "verify", json_real(rest > 0 ? rest : 0));
        json_object_set_new(phases, "total", json_real((double)(d->unix_ms - assigned->unix_ms) / 1e3));
    }
    bool initial = first_state(d);
    json_t *jd = json_array();
    for (size_t i = 0; assigned != NULL && i < assigned->n_members; i++)
        json_array_append_new(jd, json_integer(assigned->members[i]));
    double gbps = d->duration_us > 0 ? (double)bytes / ((double)d->duration_us * 1e3) : 0;
    return json_pack("{s:I,s:I,s:I,s:I,s:b,s:b,s:I,s:o,s:f,s:o,s:o}", "seq", (json_int_t)d->seq,
                     "group", (json_int_t)d->group, "rank", (json_int_t)d->rank, "step",
                     (json_int_t)d->step, "ok", d->ok, "initial", initial, "bytes",
                     (json_int_t)bytes, "donors", jd,
                     "throughput_gb_s", gbps, "phases_s", phases, "detail",
                     graftctl_json_text(d->detail));
}

static void print_event(const graft_event_t *e)
{
    char members[128] = "";
    char detail[GRAFTCTL_TEXT_LEN];
    size_t used = 0;
    for (size_t i = 0; i < e->n_members && used + 12 < sizeof(members); i++)
        used += (size_t)snprintf(members + used, sizeof(members) - used, "%s%" PRIu32,
                                 i ? "," : "", e->members[i]);
    char when[40];
    graftctl_time_text(e->unix_ms, when, sizeof(when));
    printf("%-8" PRIu64 " %-23s %-18s %-6" PRIu32 " %-5" PRIu32 " %-8" PRIu64
           " %-5" PRIu64 " %-10s %s\n",
           e->seq, when, graft_event_kind_string(e->kind), e->group, e->rank, e->step,
           e->quorum_id, members[0] ? members : "-",
           graftctl_text(e->detail, detail, sizeof(detail)));
}

int graftctl_cmd_events(const graftctl_opts_t *o, int argc, char **argv)
{
    events_filter_t f;
    graftctl_conn_t c;
    graft_event_t *ev = NULL;
    size_t nev = 0;
    int rc = parse_filter(argc, argv, &f);
    if (rc != GRAFTCTL_OK)
        return rc;
    rc = graftctl_connect(o, &c);
    if (rc != GRAFTCTL_OK)
        return rc;
    graft_status_t st = graft_membership_events_read(c.obs, 0, &ev, &nev);
    if (st != GRAFT_OK) {
        fprintf(stderr, "graftctl events: %s\n", graft_status_string(st));
        rc = GRAFTCTL_FAIL;
        goto out;
    }
    json_t *list = json_array();
    if (!o->json && !f.recoveries)
        printf("%-8s %-23s %-18s %-6s %-5s %-8s %-5s %-10s %s\n", "SEQ", "TIME", "KIND",
               "GROUP", "RANK", "STEP", "QID", "MEMBERS", "DETAIL");
    if (!o->json && f.recoveries)
        printf("%-8s %-6s %-5s %-8s %-4s %-12s %-10s %-10s %-10s %s\n", "SEQ", "GROUP", "RANK",
               "STEP", "OK", "BYTES", "REJOIN_S", "TRANSFER_S", "VERIFY_S", "DONORS");
    for (size_t i = 0; i < nev; i++) {
        if (!keep(&f, &ev[i]))
            continue;
        if (!f.recoveries) {
            if (o->json)
                json_array_append_new(list, graftctl_event_json(&ev[i]));
            else
                print_event(&ev[i]);
            continue;
        }
        if (ev[i].kind != GRAFT_EVENT_RECOVERY_DONE)
            continue;
        json_t *r = graftctl_recovery_json(ev, nev, i);
        if (o->json) {
            json_array_append_new(list, r);
            continue;
        }
        json_t *ph = json_object_get(r, "phases_s");
        json_t *rj = json_object_get(ph, "rejoin_to_assign");
        json_t *vf = json_object_get(ph, "verify");
        char donors[96] = "";
        size_t k, used = 0;
        json_t *x;
        json_array_foreach(json_object_get(r, "donors"), k, x)
            if (used + 12 < sizeof(donors))
                used += (size_t)snprintf(donors + used, sizeof(donors) - used, "%s%" JSON_INTEGER_FORMAT,
                                         k ? "," : "", json_integer_value(x));
        printf("%-8" PRIu64 " %-6" PRIu32 " %-5" PRIu32 " %-8" PRIu64 " %-4s %-12" JSON_INTEGER_FORMAT
               " %-10.3f %-10.3f %-10.3f %s\n",
               ev[i].seq, ev[i].group, ev[i].rank, ev[i].step, ev[i].ok ? "yes" : "NO",
               json_integer_value(json_object_get(r, "bytes")), rj ? json_real_value(rj) : 0.0,
               json_real_value(json_object_get(ph, "transfer")), vf ? json_real_value(vf) : 0.0,
               donors[0] ? donors : "-");
        json_decref(r);
    }
    if (o->json)
        graftctl_print_json(json_pack("{s:s,s:s,s:o}", "job", o->job, "what",
                                      f.recoveries ? "recoveries" : "events",
                                      f.recoveries ? "recoveries" : "events", list));
    else
        json_decref(list);
out:
    graft_membership_events_free(ev, nev);
    graftctl_disconnect(&c);
    return rc;
}
