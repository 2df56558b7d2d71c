/*
 * Event appends do not contend: N handles appending at once against a real
 * etcd record all N events, each with a constant number of etcd requests
 * (before, each append was a compare-and-swap on one counter key, so of N
 * simultaneous appenders the k-th needed about k transactions), and every
 * reader sees them in the same order, the order of append (etcd revision).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <graft/membership.h>

#include "etcd_fixture.h"
#include "membership_fixture.h"
#include "etcd/etcd_internal.h"
#include "membership/membership_internal.h"

#define N_WRITERS 32
/* One transaction an append; a trim (rare) adds a read and a delete txn. */
#define MAX_REQUESTS_PER_APPEND 3

/* The membership fixture's etcd, with a client timeout of 5 s (32
 * appenders at once). */
static int group_setup(void **state)
{
    if (mf_group_setup(state) != 0)
        return -1;
    mf_etcd_cfg = graft_test_etcd_config(&mf_endpoint, 1, 5000);
    return 0;
}

static graft_membership_t *observe(const char *job, uint32_t history)
{
    graft_membership_config_t c = {0};
    c.job = job;
    c.etcd = &mf_etcd_cfg;
    c.ranks_per_group = 1;
    c.min_groups = 1;
    c.lease_ttl_s = 5;
    c.event_history = history;
    c.observer = true;
    graft_membership_t *m = NULL;
    assert_int_equal(graft_membership_create(&c, &m), GRAFT_OK);
    return m;
}

typedef struct {
    graft_membership_t *m;
    pthread_barrier_t *go;
    uint32_t id;
    graft_status_t st;
    uint64_t requests; /* HTTP requests of the handle's clients during the append */
} writer_t;

static void *writer_main(void *arg)
{
    writer_t *w = arg;
    graft_event_t ev = {0};
    graft_etcd_stats_t before, after;
    ev.kind = GRAFT_EVENT_CHECKPOINT;
    ev.group = w->id;
    ev.step = w->id;
    ev.detail = "concurrent";
    pthread_barrier_wait(w->go);
    graft_etcd_stats_get(w->m->bg, &before);
    w->st = graft_membership_event_append(w->m, &ev);
    graft_etcd_stats_get(w->m->bg, &after);
    w->requests = after.requests - before.requests;
    return NULL;
}

/* N writers, one handle each on `job`, append at the same moment; each
 * records its event with at most MAX_REQUESTS_PER_APPEND requests. */
static void append_together(const char *job, uint32_t history, graft_membership_t **ms, size_t n)
{
    pthread_barrier_t go;
    writer_t w[N_WRITERS];
    pthread_t th[N_WRITERS];
    uint64_t most = 0, total = 0;
    for (size_t i = 0; i < n; i++)
        ms[i] = observe(job, history);
    assert_int_equal(pthread_barrier_init(&go, NULL, (unsigned)n), 0);
    for (size_t i = 0; i < n; i++) {
        w[i] = (writer_t){ms[i], &go, (uint32_t)i, GRAFT_EINTERNAL, 0};
        assert_int_equal(pthread_create(&th[i], NULL, writer_main, &w[i]), 0);
    }
    for (size_t i = 0; i < n; i++)
        assert_int_equal(pthread_join(th[i], NULL), 0);
    pthread_barrier_destroy(&go);
    for (size_t i = 0; i < n; i++) {
        assert_int_equal(w[i].st, GRAFT_OK);
        most = w[i].requests > most ? w[i].requests : most;
        total += w[i].requests;
    }
    printf("# %zu simultaneous appends: %" PRIu64 " etcd requests in all, at most %" PRIu64
           " by one\n",
           n, total, most);
    assert_true(most <= MAX_REQUESTS_PER_APPEND);
}

static void close_all(graft_membership_t **ms, size_t n)
{
    for (size_t i = 0; i < n; i++)
        graft_membership_destroy(ms[i]);
}

static void test_simultaneous_appends_cost_constant(void **state)
{
    (void)state;
    graft_membership_t *ms[N_WRITERS];
    append_together("evapp", 0, ms, N_WRITERS);

    /* Two readers see all N events, in the same order: ascending seq, each
     * writer once. */
    graft_event_t *a = NULL, *b = NULL;
    size_t na = 0, nb = 0;
    assert_int_equal(graft_membership_events_read(ms[0], 0, &a, &na), GRAFT_OK);
    assert_int_equal(graft_membership_events_read(ms[N_WRITERS - 1], 0, &b, &nb), GRAFT_OK);
    assert_int_equal(na, N_WRITERS);
    assert_int_equal(nb, N_WRITERS);
    bool seen[N_WRITERS] = {false};
    for (size_t i = 0; i < na; i++) {
        assert_int_equal(a[i].seq, b[i].seq);
        assert_int_equal(a[i].group, b[i].group);
        assert_true(i == 0 || a[i].seq > a[i - 1].seq);
        assert_true(a[i].group < N_WRITERS && !seen[a[i].group]);
        seen[a[i].group] = true;
        assert_int_equal(a[i].kind, GRAFT_EVENT_CHECKPOINT);
        assert_string_equal(a[i].detail, "concurrent");
    }
    /* A cursor: events after the 10th are the last N - 10, in order. */
    uint64_t cursor = a[9].seq;
    graft_membership_events_free(b, nb);
    assert_int_equal(graft_membership_events_read(ms[1], cursor, &b, &nb), GRAFT_OK);
    assert_int_equal(nb, N_WRITERS - 10);
    for (size_t i = 0; i < nb; i++)
        assert_int_equal(b[i].seq, a[10 + i].seq);
    /* An append made after the read comes after every event read. */
    graft_event_t late = {0};
    late.kind = GRAFT_EVENT_ERROR;
    late.detail = "late";
    assert_int_equal(graft_membership_event_append(ms[2], &late), GRAFT_OK);
    graft_membership_events_free(b, nb);
    assert_int_equal(graft_membership_events_read(ms[3], a[na - 1].seq, &b, &nb), GRAFT_OK);
    assert_int_equal(nb, 1);
    assert_int_equal(b[0].kind, GRAFT_EVENT_ERROR);
    graft_membership_events_free(a, na);
    graft_membership_events_free(b, nb);
    close_all(ms, N_WRITERS);
}

/* The history stays bounded when many appenders cross the bound at once:
 * between history and history + history / 8 events remain, the newest. */
static void test_simultaneous_appends_keep_the_bound(void **state)
{
    (void)state;
    graft_membership_t *ms[N_WRITERS];
    append_together("evtrim", 8, ms, N_WRITERS);
    graft_event_t *a = NULL;
    size_t na = 0;
    assert_int_equal(graft_membership_events_read(ms[0], 0, &a, &na), GRAFT_OK);
    printf("# history 8: %zu events kept of %d\n", na, N_WRITERS);
    assert_true(na >= 8 && na <= 9);
    for (size_t i = 1; i < na; i++)
        assert_true(a[i].seq > a[i - 1].seq);
    graft_membership_events_free(a, na);
    close_all(ms, N_WRITERS);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_simultaneous_appends_cost_constant),
        cmocka_unit_test(test_simultaneous_appends_keep_the_bound),
    };
    return cmocka_run_group_tests_name("events_append", tests, group_setup, mf_group_teardown);
}
