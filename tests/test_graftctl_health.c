/*
 * A group whose rank cannot serve, as graftctl shows it: a 2-group strict
 * job of two runtimes in this process against the test's etcd. Group 1's
 * rank counts failed accepts on its transfer endpoint (its counter set as
 * ucx_donor_conns.c sets it when ucp_ep_create() fails, e.g. "No such
 * device" after its interface went away: a real failure of that kind needs
 * an interface to vanish under a running process, which no test here can
 * do without a network namespace). At its next commit the rank publishes
 * CANNOT_SERVE and records why in the job's history; `status` (table and
 * --json), the dashboard's /api/status and /metrics then show the group
 * cannot-serve with that reason, and healthy again once it serves.
 */
#include "graftctl_http.h"

#include <pthread.h>

#include <graft/graft.h>

#include "runtime/runtime_internal.h"
#include "transfer/transfer_int.h"

#define JOB "cannot-serve-job"

typedef struct member {
    graft_runtime_t *rt;
    uint64_t w[16];
    graft_status_t st;
    bool apply;
} member_t;

static graft_runtime_t *make_rt(int group)
{
    graft_config_t *c = NULL;
    graft_runtime_t *rt = NULL;
    char g[16];
    snprintf(g, sizeof(g), "%d", group);
    assert_int_equal(graft_config_create(&c), GRAFT_OK);
    const char *set[][2] = {{"job", JOB},          {"groups", "2"},
                            {"group", g},          {"etcd_endpoints", gc_endpoint},
                            {"lease_ttl_ms", "3000"}, {"join_timeout_ms", "1000"},
                            {"quorum_timeout_ms", "30000"}};
    for (size_t i = 0; i < sizeof(set) / sizeof(set[0]); i++)
        assert_int_equal(graft_config_set(c, set[i][0], set[i][1], NULL), GRAFT_OK);
    assert_int_equal(graft_init(c, &rt), GRAFT_OK);
    graft_config_destroy(c);
    return rt;
}

static void *one_step(void *arg)
{
    member_t *m = arg;
    graft_step_info_t info;
    m->st = graft_quorum(m->rt, &info);
    if (m->st == GRAFT_OK)
        m->st = graft_heal_wait(m->rt);
    if (m->st == GRAFT_OK)
        m->st = graft_commit(m->rt, &m->apply);
    return NULL;
}

/* One step of both groups at once (group 1 on a thread). */
static void step_both(member_t *m)
{
    pthread_t t;
    assert_int_equal(pthread_create(&t, NULL, one_step, &m[1]), 0);
    one_step(&m[0]);
    assert_int_equal(pthread_join(t, NULL), 0);
    for (int g = 0; g < 2; g++) {
        assert_int_equal(m[g].st, GRAFT_OK);
        assert_true(m[g].apply);
    }
}

static json_t *status_json(void)
{
    return gc_ctl_json(
        (const char *[]){"--etcd", gc_endpoint, "--job", JOB, "--json", "status", NULL});
}

/* graftctl status until group 1's health is `want`; that status. */
static json_t *status_until(const char *want)
{
    json_t *st = NULL;
    for (int i = 0; i < 100; i++) {
        json_decref(st);
        st = status_json();
        if (strcmp(gc_group_health(st, 1), want) == 0)
            return st;
        gc_sleep_ms(100);
    }
    fail_msg("group 1 never %s: it is %s", want, gc_group_health(st, 1));
    return NULL;
}

/* GET path until its body holds `want` (the dashboard reads every 200 ms). */
static char *dash_until(int port, const char *path, const char *want, bool present)
{
    char *body = NULL;
    for (int i = 0; i < 100; i++) {
        free(body);
        body = NULL;
        if (gc_http(port, "GET", path, NULL, NULL, &body) == 200 &&
            (strstr(body, want) != NULL) == present)
            return body;
        gc_sleep_ms(100);
    }
    fail_msg("%s never %s '%s': %s", path, present ? "held" : "lost", want,
             body != NULL ? body : "");
    return NULL;
}

#define REASON "rank 0 cannot serve: rank 0's transfer endpoint failed to accept 3 connection(s)"

static void test_cannot_serve_shown(void **state)
{
    member_t m[2];
    memset(m, 0, sizeof(m));
    for (int g = 0; g < 2; g++) {
        m[g].rt = make_rt(g);
        graft_region_t r = {"w", GRAFT_REGION_PARAM, 0, GRAFT_DEVICE_HOST, m[g].w,
                            sizeof(m[g].w), 0, 0};
        assert_int_equal(graft_region_register(m[g].rt, &r), GRAFT_OK);
    }
    for (int s = 0; s < 2; s++)
        step_both(m);
    json_decref(status_until("healthy"));

    char listen[64];
    int port = gc_free_port();
    snprintf(listen, sizeof(listen), "127.0.0.1:%d", port);
    pid_t dash = gc_spawn_logged((const char *[]){gc_ctl_bin, "--etcd", gc_endpoint, "--job", JOB,
                                                  "dashboard", "--listen", listen, "--interval-ms",
                                                  "200", NULL},
                                 "dashboard.log");

    /* Group 1's accepts fail: its next commit says so. */
    atomic_store(&m[1].rt->ep->serve_failures, 3);
    step_both(m);
    json_t *st = status_until("cannot-serve");
    const char *why = gc_group_field(st, 1, "reason");
    print_message("group 1 cannot-serve: %s\n", why != NULL ? why : "(no reason)");
    assert_non_null(why);
    assert_non_null(strstr(why, REASON));
    assert_int_equal(json_integer_value(json_object_get(st, "groups_healthy")), 1);
    json_decref(st);
    char *out = NULL;
    assert_int_equal(
        gc_run_ctl((const char *[]){"--etcd", gc_endpoint, "--job", JOB, "status", NULL}, &out,
                   NULL),
        0);
    assert_non_null(strstr(out, "group 1 cannot-serve: " REASON));
    free(out);
    char *body = dash_until(port, "/api/status", "cannot-serve", true);
    assert_non_null(strstr(body, REASON));
    free(body);
    body = dash_until(port, "/metrics", "graft_group_cannot_serve{group=\"1\"} 1\n", true);
    assert_non_null(strstr(body, "graft_groups{health=\"cannot-serve\"} 1\n"));
    free(body);
    /* The history has the one event, an error. */
    json_t *ev = gc_ctl_json(
        (const char *[]){"--etcd", gc_endpoint, "--job", JOB, "--json", "events", NULL});
    size_t i, n = 0;
    json_t *e;
    json_array_foreach(json_object_get(ev, "events"), i, e) {
        const char *d = json_string_value(json_object_get(e, "detail"));
        n += d != NULL && strstr(d, GRAFT_CANNOT_SERVE_TEXT ": rank 0") == d;
    }
    json_decref(ev);
    assert_int_equal(n, 1);

    /* It serves again: healthy at its next commit, and the gauge goes. */
    atomic_store(&m[1].rt->ep->serve_failures, 0);
    step_both(m);
    st = status_until("healthy");
    assert_null(gc_group_field(st, 1, "reason"));
    json_decref(st);
    free(dash_until(port, "/metrics", "graft_group_cannot_serve{group=\"1\"}", false));
    kill(dash, SIGTERM);
    waitpid(dash, NULL, 0);
    graft_destroy(m[1].rt);
    graft_destroy(m[0].rt);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_cannot_serve_shown),
    };
    if (getenv("TEST_FILTER") != NULL)
        cmocka_set_test_filter(getenv("TEST_FILTER"));
    curl_global_init(CURL_GLOBAL_DEFAULT);
    int rc = cmocka_run_group_tests(tests, gc_setup, gc_teardown);
    curl_global_cleanup();
    return rc;
}
