/*
 * Records that do not decode never wedge a job (docs/KEYS.md, "Records that
 * do not decode"). Against a real etcd, with membership handles in one
 * process (one per group) and graftctl as the operator runs it:
 *
 *  - 14 bytes of garbage in the quorum key, then a group restarted: the
 *    survivor and the restarted group meet in one round within the join
 *    timeout (before the repair, they announced different rounds and both
 *    waited for quorum_timeout_ms), the key holds a record again, and the
 *    job's history and graftctl status name the replacement;
 *  - garbage in the quorum key when no process of the job runs: the first
 *    formation replaces it by compare-and-swap, and says so;
 *  - an observer's view (graftctl status) names a record that does not
 *    decode while it is there;
 *  - a rank's own member record written over with garbage: the rank
 *    writes it again on its lease.
 */
#include "graftctl_fixture.h"

#include <pthread.h>

#include "membership/membership_internal.h"

#define JOIN_TIMEOUT_MS 3000u
/* The garbage of the measurement in issue 22: 14 bytes. */
static const char junk[] = "\x0a\xff\x01\x7f garbage!\x02";

static graft_etcd_config_t etcd_cfg;

static int setup(void **state)
{
    if (gc_setup(state) != 0)
        return -1;
    etcd_cfg = graft_test_etcd_config(&gc_endpoint, 1, 2000);
    return 0;
}

static graft_membership_t *join(const char *job, uint32_t g, bool observer)
{
    graft_membership_config_t c = {0};
    c.job = job;
    c.etcd = &etcd_cfg;
    c.group = g;
    c.rank = 0;
    c.ranks_per_group = 1;
    c.min_groups = 2; /* strict: a round needs both groups */
    c.lease_ttl_s = 2;
    c.join_timeout_ms = JOIN_TIMEOUT_MS;
    c.transfer_address = "tcp://127.0.0.1:1";
    c.observer = observer;
    graft_membership_t *m = NULL;
    assert_int_equal(graft_membership_create(&c, &m), GRAFT_OK);
    return m;
}

typedef struct waiter {
    graft_membership_t *m;
    uint64_t committed;
    uint64_t until_ns; /* keeps asking (as the runtime does) until then */
    graft_status_t st;
    uint64_t round, id;
    int attempts;
} waiter_t;

static void *wait_main(void *p)
{
    waiter_t *w = p;
    do {
        graft_quorum_t *q = NULL;
        w->attempts++;
        w->st = graft_membership_quorum_wait(w->m, w->committed, 2 * JOIN_TIMEOUT_MS, &q);
        if (w->st == GRAFT_OK) {
            w->round = q->round;
            w->id = q->id;
            graft_membership_quorum_free(q);
            return NULL;
        }
    } while (graft__now_ns() < w->until_ns);
    return NULL;
}

/* Both handles ask for a round at once; returns how long it took (ms). */
static uint64_t run_round(waiter_t *a, waiter_t *b, uint64_t give_up_ms)
{
    pthread_t ta, tb;
    uint64_t t0 = graft__now_ns();
    a->until_ns = b->until_ns = t0 + give_up_ms * 1000000ull;
    assert_int_equal(pthread_create(&ta, NULL, wait_main, a), 0);
    assert_int_equal(pthread_create(&tb, NULL, wait_main, b), 0);
    pthread_join(ta, NULL);
    pthread_join(tb, NULL);
    return (graft__now_ns() - t0) / 1000000u;
}

static void put_junk(const char *job)
{
    char key[128];
    snprintf(key, sizeof(key), "/graft/%s/quorum", job);
    assert_int_equal(graft_etcd_put(gc_etcd.client, key, junk, sizeof(junk) - 1, 0, NULL, NULL),
                     GRAFT_OK);
}

/* The quorum key decodes (within a few seconds: a repair is asynchronous);
 * returns its round. */
static uint64_t quorum_key_round(const char *job)
{
    char key[128];
    snprintf(key, sizeof(key), "/graft/%s/quorum", job);
    uint64_t end = graft__now_ns() + 5000000000ull;
    for (;;) {
        graft_etcd_range_result_t res = {0};
        graft_etcd_range_opts_t o = {0};
        graft_quorum_t *q = NULL;
        assert_int_equal(graft_etcd_range(gc_etcd.client, key, &o, &res), GRAFT_OK);
        assert_int_equal(res.n_kvs, 1);
        graft_status_t st = graft__mship_quorum_decode(res.kvs[0].value, res.kvs[0].value_len, &q);
        graft_etcd_range_result_clear(&res);
        if (st == GRAFT_OK) {
            uint64_t round = q->round;
            graft_membership_quorum_free(q);
            return round;
        }
        assert_true(graft__now_ns() < end);
        gc_sleep_ms(50);
    }
}

/* The job's history has the event of the replacement; returns its round. */
static uint64_t replaced_event_round(graft_membership_t *obs, const char *job)
{
    char want[160];
    snprintf(want, sizeof(want), "quorum record at /graft/%s/quorum does not decode: ", job);
    uint64_t end = graft__now_ns() + 5000000000ull;
    for (;;) {
        graft_event_t *ev = NULL;
        size_t n = 0;
        uint64_t round = 0;
        assert_int_equal(graft_membership_events_read(obs, 0, &ev, &n), GRAFT_OK);
        for (size_t i = 0; i < n; i++)
            if (ev[i].kind == GRAFT_EVENT_ERROR && ev[i].detail != NULL &&
                strncmp(ev[i].detail, want, strlen(want)) == 0 &&
                strstr(ev[i].detail, "; replaced at round ") != NULL)
                round = ev[i].round;
        graft_membership_events_free(ev, n);
        if (round != 0)
            return round;
        assert_true(graft__now_ns() < end);
        gc_sleep_ms(50);
    }
}

/* graftctl status names the replacement (text and JSON). */
static void status_names_replacement(const char *job, uint64_t round)
{
    char *out = NULL, *err = NULL;
    char want[200];
    const char *args[] = {"--etcd", gc_endpoint, "--job", job, "status", NULL};
    int rc = gc_run_ctl(args, &out, &err);
    if (rc != 0)
        print_error("graftctl status: %d %s\n", rc, err);
    assert_int_equal(rc, 0);
    snprintf(want, sizeof(want), "quorum record at /graft/%s/quorum does not decode: ", job);
    if (strstr(out, want) == NULL)
        print_error("graftctl status:\n%s\n", out);
    assert_non_null(strstr(out, want));
    snprintf(want, sizeof(want), "; replaced at round %" PRIu64, round);
    assert_non_null(strstr(out, want));
    free(out);
    free(err);
    const char *jargs[] = {"--etcd", gc_endpoint, "--job", job, "--json", "status", NULL};
    json_t *j = gc_ctl_json(jargs);
    const char *rec = json_string_value(json_object_get(j, "quorum_record"));
    assert_non_null(rec);
    assert_non_null(strstr(rec, want));
    json_decref(j);
}

static void test_garbage_then_group_restart(void **state)
{
    (void)state;
    const char *job = "malformed-restart";
    graft_membership_t *a = join(job, 0, false), *b = join(job, 1, false);
    graft_membership_t *obs = join(job, 0, true);
    waiter_t wa = {.m = a, .committed = 0}, wb = {.m = b, .committed = 0};
    /* Two rounds, so that the round the job is at is not the first. */
    run_round(&wa, &wb, 10000);
    assert_int_equal(wa.st, GRAFT_OK);
    assert_int_equal(wb.st, GRAFT_OK);
    wa.committed = wb.committed = 1;
    run_round(&wa, &wb, 10000);
    assert_int_equal(wa.st, GRAFT_OK);
    assert_int_equal(wb.st, GRAFT_OK);
    uint64_t round = wa.round;
    assert_int_equal(round, 2);

    put_junk(job);
    /* Group 1 restarts: a new process, which reads the key as it is. */
    graft_membership_destroy(b);
    b = join(job, 1, false);
    wa.committed = 2;
    wb = (waiter_t){.m = b, .committed = 0};
    uint64_t ms = run_round(&wa, &wb, 4 * JOIN_TIMEOUT_MS);
    assert_int_equal(wa.st, GRAFT_OK);
    assert_int_equal(wb.st, GRAFT_OK);
    assert_int_equal(wa.round, wb.round);
    assert_true(wa.round > round);
    print_message("healed in %" PRIu64 " ms (join timeout %u ms), round %" PRIu64 "\n", ms,
                  JOIN_TIMEOUT_MS, wa.round);
    assert_true(ms < JOIN_TIMEOUT_MS);
    assert_true(quorum_key_round(job) >= round);
    uint64_t replaced = replaced_event_round(obs, job);
    assert_true(replaced >= round);
    status_names_replacement(job, replaced);
    graft_membership_destroy(obs);
    graft_membership_destroy(a);
    graft_membership_destroy(b);
}

static void test_garbage_before_first_start(void **state)
{
    (void)state;
    const char *job = "malformed-cold";
    put_junk(job);
    graft_membership_t *obs = join(job, 0, true);
    graft_membership_view_t *v = NULL;
    assert_int_equal(graft_membership_view_get(obs, &v), GRAFT_OK);
    assert_true(v->quorum_bad_mod > 0);
    assert_int_equal(v->quorum_bad_reason, GRAFT_EMALFORMED);
    graft_membership_view_free(v);
    /* graftctl status names it while it is there */
    char *out = NULL;
    char want[160];
    const char *args[] = {"--etcd", gc_endpoint, "--job", job, "status", NULL};
    assert_int_equal(gc_run_ctl(args, &out, NULL), 0);
    snprintf(want, sizeof(want), "quorum record at /graft/%s/quorum does not decode: ", job);
    if (strstr(out, want) == NULL)
        print_error("graftctl status:\n%s\n", out);
    assert_non_null(strstr(out, want));
    assert_null(strstr(out, "none formed yet"));
    free(out);

    graft_membership_t *a = join(job, 0, false), *b = join(job, 1, false);
    waiter_t wa = {.m = a, .committed = 0}, wb = {.m = b, .committed = 0};
    uint64_t ms = run_round(&wa, &wb, 4 * JOIN_TIMEOUT_MS);
    assert_int_equal(wa.st, GRAFT_OK);
    assert_int_equal(wb.st, GRAFT_OK);
    assert_int_equal(wa.round, 1);
    assert_true(ms < JOIN_TIMEOUT_MS);
    assert_int_equal(quorum_key_round(job), 1);
    assert_int_equal(replaced_event_round(obs, job), 1);
    status_names_replacement(job, 1);
    /* The observer's view has the good record again. */
    uint64_t end = graft__now_ns() + 3000000000ull;
    for (;;) {
        assert_int_equal(graft_membership_view_get(obs, &v), GRAFT_OK);
        bool clean = v->quorum_bad_mod == 0;
        graft_membership_view_free(v);
        if (clean)
            break;
        assert_true(graft__now_ns() < end);
        gc_sleep_ms(20);
    }
    graft_membership_destroy(obs);
    graft_membership_destroy(a);
    graft_membership_destroy(b);
}

/* A rank's own member record written over with garbage (put without a
 * lease, so it would outlive the rank): the rank writes its record again,
 * on its lease, and the history says so. Before, the rank looked dead to
 * every other rank while its lease lived, and a strict job had one live
 * group. */
static void test_garbage_member_record_rewritten(void **state)
{
    (void)state;
    const char *job = "malformed-member";
    graft_membership_t *a = join(job, 0, false), *b = join(job, 1, false);
    graft_membership_t *obs = join(job, 0, true);
    assert_int_equal(graft_etcd_put(gc_etcd.client, "/graft/malformed-member/members/1/0", junk,
                                    sizeof(junk) - 1, 0, NULL, NULL), GRAFT_OK);
    uint64_t end = graft__now_ns() + 5000000000ull;
    bool healthy = false;
    while (!healthy && graft__now_ns() < end) {
        graft_membership_view_t *v = NULL;
        assert_int_equal(graft_membership_view_get(obs, &v), GRAFT_OK);
        healthy = v->malformed >= 1 && v->n_healthy_groups == 2;
        graft_membership_view_free(v);
        if (!healthy)
            gc_sleep_ms(20);
    }
    assert_true(healthy);
    /* on the rank's lease again: it goes when the lease does */
    graft_etcd_kv_t kv;
    assert_int_equal(
        graft_etcd_get(gc_etcd.client, "/graft/malformed-member/members/1/0", &kv, NULL), GRAFT_OK);
    graft_member_t mem;
    assert_int_equal(graft__mship_member_decode(kv.value, kv.value_len, &mem), GRAFT_OK);
    assert_true(kv.lease != 0 && kv.lease == mem.lease_id);
    graft__mship_member_clear(&mem);
    graft_etcd_kv_clear(&kv);
    bool recorded = false;
    while (!recorded && graft__now_ns() < end) {
        graft_event_t *ev = NULL;
        size_t n = 0;
        assert_int_equal(graft_membership_events_read(obs, 0, &ev, &n), GRAFT_OK);
        for (size_t i = 0; i < n; i++)
            recorded |= ev[i].kind == GRAFT_EVENT_ERROR && ev[i].detail != NULL &&
                        strstr(ev[i].detail, "member record at /graft/malformed-member/members/"
                                             "1/0 does not decode") != NULL;
        graft_membership_events_free(ev, n);
        if (!recorded)
            gc_sleep_ms(20);
    }
    assert_true(recorded);
    waiter_t wa = {.m = a, .committed = 0}, wb = {.m = b, .committed = 0};
    uint64_t ms = run_round(&wa, &wb, 4 * JOIN_TIMEOUT_MS);
    assert_int_equal(wa.st, GRAFT_OK);
    assert_int_equal(wb.st, GRAFT_OK);
    assert_true(ms < JOIN_TIMEOUT_MS);
    graft_membership_destroy(obs);
    graft_membership_destroy(a);
    graft_membership_destroy(b);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_garbage_then_group_restart),
        cmocka_unit_test(test_garbage_before_first_start),
        cmocka_unit_test(test_garbage_member_record_rewritten),
    };
    return cmocka_run_group_tests(tests, setup, gc_teardown);
}
