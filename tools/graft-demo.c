/*
 * graft-demo: the interim `make demo` until the failure-injection simulator
 * exists. It runs the parts that exist end to end against a real, embedded
 * etcd: three replica groups join under leases, a watch reports them, one
 * group stops renewing its lease (as a crashed process would) and the watch
 * reports its departure when etcd expires the lease. Its records are not
 * membership's (no MemberRecord), so they live in a folder of their own,
 * demo/, under the job "demo" (docs/KEYS.md).
 */
#include "etcd_launcher.h"
#include <graft/membership.h>

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define GROUPS 3
#define TTL_S 2
#define JOB "demo"
#define FOLDER "demo/"

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static double t0;

static void say(const char *fmt, ...) GRAFT_PRINTF(1, 2);
static void say(const char *fmt, ...)
{
    va_list ap;
    printf("[%6.2fs] ", now_s() - t0);
    va_start(ap, fmt);
    vprintf(fmt, ap);
    va_end(ap);
    printf("\n");
    fflush(stdout);
}

static int fail(const char *what, graft_status_t st)
{
    fprintf(stderr, "graft-demo: %s: %s (%s)\n", what, graft_status_string(st),
            graft_status_name(st));
    return 1;
}

/* The groups' leases and what the watch saw, and when. */
typedef struct demo_state {
    int64_t lease[GROUPS];
    bool alive[GROUPS];
    int joins, leaves;
    double stopped_at, left_at;
} demo_state_t;

/* Every group registers under a lease of its own. 0, or 1 (said). */
static int demo_join(graft_etcd_t *etcd, const char *prefix, demo_state_t *s)
{
    graft_status_t st;
    for (int g = 0; g < GROUPS; g++) {
        char key[192], value[128];
        snprintf(key, sizeof(key), "%sgroup-%d", prefix, g);
        snprintf(value, sizeof(value), "{\"group\":%d,\"step\":0,\"addr\":\"127.0.0.1\"}", g);
        if ((st = graft_etcd_lease_grant(etcd, TTL_S, &s->lease[g], NULL)) != GRAFT_OK ||
            (st = graft_etcd_put(etcd, key, value, strlen(value), s->lease[g], NULL, NULL)) !=
                GRAFT_OK) {
            return fail("joining", st);
        }
        s->alive[g] = true;
        say("group-%d registers with a %d s lease (id %lld)", g, TTL_S, (long long)s->lease[g]);
    }
    return 0;
}

/* The watch's events of one wait, counted and told. */
static void demo_events(demo_state_t *s, const graft_etcd_event_t *ev, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        if (ev[i].type == GRAFT_ETCD_EVENT_PUT) {
            s->joins++;
            say("watch: PUT    %s (revision %ld)", ev[i].kv.key, (long)ev[i].kv.mod_revision);
        } else {
            s->leaves++;
            s->left_at = now_s();
            say("watch: DELETE %s (revision %ld): its lease expired", ev[i].kv.key,
                (long)ev[i].kv.mod_revision);
        }
    }
}

/* Everyone renews every TTL/3; after a while group 1 "crashes" and stops,
 * until the watch sees a group leave (15 s at most). 0, or 1 (said). */
static int demo_watch(graft_etcd_t *etcd, graft_etcd_watch_t *watch, demo_state_t *s)
{
    graft_status_t st;
    double last_renew = 0, end = now_s() + 15;
    while (now_s() < end) {
        if (now_s() - last_renew > TTL_S / 3.0) {
            for (int g = 0; g < GROUPS; g++)
                if (s->alive[g] && (st = graft_etcd_lease_keepalive(etcd, s->lease[g], NULL)) !=
                                       GRAFT_OK)
                    return fail("keep-alive", st);
            last_renew = now_s();
        }
        if (s->joins == GROUPS && s->stopped_at == 0 && now_s() - t0 > 3) {
            s->alive[1] = false;
            s->stopped_at = now_s();
            say("group-1 stops renewing its lease (simulated crash)");
        }
        graft_etcd_event_t *ev = NULL;
        size_t n = 0;
        st = graft_etcd_watch_next(watch, 100, &ev, &n);
        if (st != GRAFT_OK)
            return fail("watch", st);
        demo_events(s, ev, n);
        graft_etcd_events_free(ev, n);
        if (s->leaves > 0)
            break;
    }
    return 0;
}

/* The report, from what the watch saw and what etcd holds now. 0 when the
 * run went as expected, else 1. */
static int demo_report(graft_etcd_t *etcd, const char *prefix, const demo_state_t *s)
{
    graft_etcd_range_result_t r;
    graft_etcd_range_opts_t o = {.prefix = true, .keys_only = true};
    graft_status_t st = graft_etcd_range(etcd, prefix, &o, &r);
    if (st != GRAFT_OK)
        return fail("range", st);
    printf("\nreport\n");
    printf("  groups joined:            %d (seen by the watch)\n", s->joins);
    printf("  groups that left:         %d\n", s->leaves);
    if (s->leaves > 0)
        printf("  failure detected:         %.2f s after it stopped renewing (lease TTL %d s)\n",
               s->left_at - s->stopped_at, TTL_S);
    printf("  members registered now:  ");
    for (size_t i = 0; i < r.n_kvs; i++)
        printf(" %s", r.kvs[i].key + strlen(prefix));
    printf("\n  etcd revision:            %ld\n", (long)r.revision);
    int rc = (s->joins == GROUPS && s->leaves == 1 && r.n_kvs == GROUPS - 1) ? 0 : 1;
    graft_etcd_range_result_clear(&r);
    printf("\nThis is the interim demo of the parts that exist (etcd client, embedded etcd,\n"
           "leases and watches); `make demo` will run the simulator once it exists.\n");
    if (rc != 0)
        fprintf(stderr, "graft-demo: the run did not go as expected\n");
    return rc;
}

int main(void)
{
    graft_etcd_server_t *server = NULL;
    graft_etcd_t *etcd = NULL;
    graft_etcd_watch_t *watch = NULL;
    demo_state_t s;
    int rc = 1;
    char *job_prefix = NULL;
    char prefix[128];
    graft_status_t st;

    memset(&s, 0, sizeof(s));
    t0 = now_s();
    if ((st = graft_membership_job_prefix(JOB, &job_prefix)) != GRAFT_OK)
        return fail("key prefix", st);
    snprintf(prefix, sizeof(prefix), "%s" FOLDER, job_prefix);
    graft_free(job_prefix);
    printf("graft interim demo: the simulator does not exist yet, so this shows the parts\n"
           "that do: an embedded etcd, replica groups joining under leases, a watch\n"
           "reporting them, and a lease expiring when a group stops renewing it.\n\n");

    st = graft_etcd_server_start(NULL, &server);
    if (st != GRAFT_OK)
        return fail("starting etcd (is Debian's etcd-server installed?)", st);
    const char *ep = graft_etcd_server_endpoint(server);
    say("embedded etcd up on %s (pid %d)", ep, graft_etcd_server_pid(server));

    graft_etcd_config_t cfg = {.endpoints = &ep, .n_endpoints = 1};
    if ((st = graft_etcd_create(&cfg, &etcd)) != GRAFT_OK) {
        rc = fail("etcd client", st);
        goto out;
    }
    if ((st = graft_etcd_watch_create(etcd, prefix, 0, &watch)) != GRAFT_OK) {
        rc = fail("watch", st);
        goto out;
    }
    say("watching %s from now on", prefix);
    if (demo_join(etcd, prefix, &s) == 0 && demo_watch(etcd, watch, &s) == 0)
        rc = demo_report(etcd, prefix, &s);
out:
    graft_etcd_watch_destroy(watch);
    graft_etcd_destroy(etcd);
    graft_etcd_server_destroy(server);
    return rc;
}
