/*
 * The dashboard's guards (docs/SECURITY.md, "Operator tools"), against a
 * live `graftctl dashboard` process following a job in a real etcd, over
 * HTTP with libcurl:
 *
 *  - the Host header: IP addresses, localhost and --allow-host names are
 *    answered; any other name (a page that rebinds its DNS name to this
 *    host) gets 403 with a clear body, and the refusals are logged on one
 *    line per 10 s, not one per request;
 *  - the operator token: the right one passes (the evict of a group with
 *    no member answers 404), a wrong one of the same length, a prefix, a
 *    longer one and none are refused;
 *  - the checkpoint root: only --ckpt-root or a folder under it is listed;
 *    a checkpoint event that names a folder outside it (directly, through
 *    "..", or through a symbolic link) is not listed and is said so, and a
 *    dashboard without --ckpt-root lists nothing the events name;
 *  - job states: members that end cleanly make the job completed and their
 *    groups finished (none dead) in /metrics and /api/status; a killed
 *    member's group is dead and the job degraded, then failed.
 */
#include "graftctl_http.h"

#define TOKEN "dashboard-test-token"

typedef struct dash {
    pid_t pid;
    int port;
    char log[PATH_MAX + 32];
} dash_t;

static graft_membership_t *job_member;
static const char *dash_job = "dash-job"; /* the job dash_start follows */
static char root[PATH_MAX + 16], outside[PATH_MAX + 16];

/* One request to the dashboard d (graftctl_http). */
static long http(const dash_t *d, const char *method, const char *path, const char *host,
                 const char *auth, char **body_p)
{
    return gc_http(d->port, method, path, host, auth, body_p);
}

/* Starts `graftctl dashboard` for job dash_job with extra arguments
 * (NULL-terminated) and waits until it answers. */
static void dash_start(dash_t *d, const char *name, const char *const *extra)
{
    char listen[64], port_s[16];
    d->port = gc_free_port();
    snprintf(listen, sizeof(listen), "127.0.0.1:%d", d->port);
    snprintf(port_s, sizeof(port_s), "%d", d->port);
    snprintf(d->log, sizeof(d->log), "%s/%s.log", gc_tmpdir, name);
    const char *argv[32] = {gc_ctl_bin, "--etcd", gc_endpoint, "--job", dash_job, "dashboard",
                            "--listen", listen, "--interval-ms", "100"};
    size_t n = 10;
    for (size_t i = 0; extra[i] != NULL && n < 31; i++)
        argv[n++] = extra[i];
    argv[n] = NULL;
    d->pid = fork();
    assert_true(d->pid >= 0);
    if (d->pid == 0) {
        int fd = open(d->log, O_WRONLY | O_CREAT | O_TRUNC, 0644);
        if (fd < 0)
            _exit(126);
        dup2(fd, 1);
        dup2(fd, 2);
        execv(gc_ctl_bin, (char **)argv);
        _exit(127);
    }
    for (int i = 0; i < 150; i++) {
        if (http(d, "GET", "/api/state", NULL, NULL, NULL) == 200)
            return;
        gc_sleep_ms(100);
    }
    char *log = gc_slurp(d->log);
    fail_msg("the dashboard did not answer: %s", log);
}

static void dash_stop(dash_t *d)
{
    int ws = 0;
    kill(d->pid, SIGTERM);
    assert_int_equal(waitpid(d->pid, &ws, 0), d->pid);
    assert_true(WIFEXITED(ws) && WEXITSTATUS(ws) == 0);
}

/* ------------------------------------------------------------ set-up --- */

static int setup(void **state)
{
    if (gc_setup(state) != 0 || curl_global_init(CURL_GLOBAL_DEFAULT) != CURLE_OK)
        return -1;
    const char *eps[] = {gc_endpoint};
    graft_etcd_config_t ec = {.endpoints = eps, .n_endpoints = 1};
    graft_membership_config_t mc = {.job = "dash-job", .etcd = &ec, .group = 0};
    if (graft_membership_create(&mc, &job_member) != GRAFT_OK)
        return -1;
    /* ROOT/job/step-10 under the dashboard's root; OUT/step-77 outside it,
     * reached also as ROOT/link (a symbolic link) and ROOT/../out. */
    snprintf(root, sizeof(root), "%s/root", gc_tmpdir);
    snprintf(outside, sizeof(outside), "%s/out", gc_tmpdir);
    gc_sh("mkdir -p '%s/job/step-00000000000000000010' '%s/step-00000000000000000077' && "
          "ln -s '%s' '%s/link'", root, outside, outside, root);
    return 0;
}

static int teardown(void **state)
{
    graft_membership_destroy(job_member);
    curl_global_cleanup();
    return gc_teardown(state);
}

/* -------------------------------------------------------------- host --- */

static void test_host_header(void **state)
{
    dash_t d;
    dash_start(&d, "host", (const char *const[]){"--allow-host", "dash.example", NULL});
    char ok_hosts[6][64];
    snprintf(ok_hosts[0], 64, "127.0.0.1:%d", d.port);
    snprintf(ok_hosts[1], 64, "localhost:%d", d.port);
    snprintf(ok_hosts[2], 64, "[::1]:%d", d.port);
    snprintf(ok_hosts[3], 64, "LocalHost:%d", d.port);
    snprintf(ok_hosts[4], 64, "dash.example:%d", d.port);
    snprintf(ok_hosts[5], 64, "10.1.2.3");
    for (size_t i = 0; i < 6; i++) {
        long code = http(&d, "GET", "/api/state", ok_hosts[i], NULL, NULL);
        if (code != 200)
            fail_msg("Host %s: %ld, not 200", ok_hosts[i], code);
    }
    assert_int_equal(http(&d, "GET", "/metrics", ok_hosts[1], NULL, NULL), 200);

    /* A rebinding page's own name, with and without the port; names that
     * only look like an allowed one; a Host that is not host[:port]. */
    char bad_hosts[7][96];
    snprintf(bad_hosts[0], 96, "attacker.example:%d", d.port);
    snprintf(bad_hosts[1], 96, "attacker.example");
    snprintf(bad_hosts[2], 96, "127.0.0.1.attacker.example:%d", d.port);
    snprintf(bad_hosts[3], 96, "dash.example.attacker.example");
    snprintf(bad_hosts[4], 96, "localhost.attacker.example:%d", d.port);
    snprintf(bad_hosts[5], 96, "localhost:%d:1", d.port);
    snprintf(bad_hosts[6], 96, "127.0.0.1:port");
    for (size_t i = 0; i < 7; i++) {
        char *body = NULL;
        long code = http(&d, "GET", "/api/state", bad_hosts[i], NULL, &body);
        if (code != 403 || strstr(body, "not a name of this dashboard") == NULL)
            fail_msg("Host %s: %ld, not 403: %s", bad_hosts[i], code, body);
        json_t *j = json_loads(body, 0, NULL);
        assert_non_null(j);
        assert_non_null(strstr(json_string_value(json_object_get(j, "error")), "--allow-host"));
        assert_null(json_object_get(j, "status")); /* nothing of the job */
        json_decref(j);
        free(body);
    }
    /* Every path, the page included. */
    assert_int_equal(http(&d, "GET", "/", bad_hosts[0], NULL, NULL), 403);
    assert_int_equal(http(&d, "GET", "/metrics", bad_hosts[0], NULL, NULL), 403);
    /* No Host at all (HTTP/1.0). */
    char *body = NULL;
    assert_int_equal(http(&d, "GET", "/api/state", "", NULL, &body), 403);
    assert_non_null(strstr(body, "no Host header"));
    free(body);

    /* Ten refusals within a second: one log line, naming the last. */
    dash_stop(&d);
    char *log = gc_slurp(d.log);
    size_t lines = 0;
    for (const char *p = strstr(log, "foreign Host"); p != NULL; p = strstr(p + 1, "foreign Host"))
        lines++;
    if (lines != 1)
        fail_msg("%zu log lines for the refusals, not 1:\n%s", lines, log);
    assert_non_null(strstr(log, "attacker.example"));
    free(log);
}

/* ------------------------------------------------------------- token --- */

static void test_token(void **state)
{
    dash_t d;
    dash_start(&d, "token", (const char *const[]){"--token", TOKEN, NULL});
    char *body = NULL;
    /* The right token passes; group 99 has no live member. */
    assert_int_equal(http(&d, "POST", "/api/evict?group=99", NULL, "Bearer " TOKEN, &body), 404);
    assert_non_null(strstr(body, "no live member"));
    free(body);
    static const char *const wrong[] = {
        "Bearer dashboard-test-tokeN", /* same length, last byte differs */
        "Bearer xashboard-test-token", /* same length, first byte differs */
        "Bearer dashboard-test-toke",  /* a prefix */
        "Bearer " TOKEN "x",           /* longer */
        "Bearer ",
        TOKEN, /* no scheme */
        NULL,  /* no header */
    };
    for (size_t i = 0; i < sizeof(wrong) / sizeof(wrong[0]); i++) {
        long code = http(&d, "POST", "/api/evict?group=99", NULL, wrong[i], &body);
        if (code != 403 || strstr(body, "operator token") == NULL)
            fail_msg("Authorization '%s': %ld: %s", wrong[i] ? wrong[i] : "(none)", code, body);
        free(body);
    }
    /* The right token from a foreign Host is refused before it is read. */
    assert_int_equal(http(&d, "POST", "/api/evict?group=99", "attacker.example", "Bearer " TOKEN,
                          NULL),
                     403);
    dash_stop(&d);
}

/* ---------------------------------------------------- checkpoint root --- */

static void checkpoint_event(const char *at)
{
    char detail[PATH_MAX + 64];
    snprintf(detail, sizeof(detail), "shard+manifest at %s: success", at);
    graft_event_t e = {.kind = GRAFT_EVENT_CHECKPOINT, .ok = true, .step = 10, .detail = detail};
    assert_int_equal(graft_membership_event_append(job_member, &e), GRAFT_OK);
}

static bool has_step(json_t *state, uint64_t step)
{
    size_t i;
    json_t *c;
    json_array_foreach(json_object_get(state, "checkpoints"), i, c)
        if ((uint64_t)json_integer_value(json_object_get(c, "step")) == step)
            return true;
    return false;
}

/* Waits until /api/state lists `listed` as its root and its note holds
 * `note` ("" for none); returns the state. */
static json_t *wait_root(dash_t *d, const char *listed, const char *note)
{
    char *body = NULL;
    for (int i = 0; i < 100; i++) {
        assert_int_equal(http(d, "GET", "/api/state", NULL, NULL, &body), 200);
        json_t *s = json_loads(body, 0, NULL);
        assert_non_null(s);
        const char *r = json_string_value(json_object_get(s, "checkpoint_root"));
        const char *n = json_string_value(json_object_get(s, "checkpoint_root_note"));
        if (r != NULL && n != NULL && strcmp(r, listed) == 0 &&
            (note[0] == '\0' ? n[0] == '\0' : strstr(n, note) != NULL)) {
            free(body);
            return s;
        }
        json_decref(s);
        if (i < 99)
            free(body);
        gc_sleep_ms(100);
    }
    fail_msg("the dashboard did not come to root '%s' with note '%s': %s", listed, note, body);
    return NULL;
}

static void test_ckpt_root(void **state)
{
    char real_root[PATH_MAX], job_dir[PATH_MAX + 32], real_job[PATH_MAX], via[PATH_MAX + 32];
    assert_non_null(realpath(root, real_root));
    snprintf(job_dir, sizeof(job_dir), "%s/job", root);
    assert_non_null(realpath(job_dir, real_job));
    dash_t d;
    dash_start(&d, "root", (const char *const[]){"--ckpt-root", root, NULL});

    /* The job's folder under the given root: listed. */
    checkpoint_event(job_dir);
    json_t *s = wait_root(&d, real_job, "");
    assert_true(has_step(s, 10));
    json_decref(s);

    /* Outside it: directly, through "..", through a link below the root. */
    const char *const ways[] = {"%s", "%s/../out", "%s/link"};
    for (size_t w = 0; w < 3; w++) {
        snprintf(via, sizeof(via), ways[w], w == 0 ? outside : root);
        checkpoint_event(via);
        char note[sizeof(via) + 64];
        snprintf(note, sizeof(note), "name %s, which is not under --ckpt-root", via);
        s = wait_root(&d, real_root, note);
        if (has_step(s, 77))
            fail_msg("%s is listed", via);
        json_decref(s);
    }
    dash_stop(&d);
    char *log = gc_slurp(d.log);
    assert_non_null(strstr(log, "which is not under --ckpt-root"));
    free(log);

    /* Without --ckpt-root nothing the events name is listed. */
    checkpoint_event(job_dir);
    dash_start(&d, "noroot", (const char *const[]){NULL});
    s = wait_root(&d, "", "not listed");
    assert_int_equal(json_array_size(json_object_get(s, "checkpoints")), 0);
    assert_non_null(strstr(json_string_value(json_object_get(s, "checkpoint_root_note")),
                           "--ckpt-root"));
    json_decref(s);
    dash_stop(&d);
}

/* -------------------------------------------------------- job states --- */

/* A member of group `group` of job (lease_ttl_s 0: the default). */
static graft_status_t join(const char *job, uint32_t group, uint32_t lease_ttl_s,
                           graft_membership_t **m_p)
{
    const char *eps[] = {gc_endpoint};
    graft_etcd_config_t ec = {.endpoints = eps, .n_endpoints = 1};
    graft_membership_config_t mc = {.job = job, .etcd = &ec, .group = group,
                                    .lease_ttl_s = lease_ttl_s};
    return graft_membership_create(&mc, m_p);
}

/* A member in a child process (a lease of 2 s), to be killed: a killed rank
 * records nothing, its lease just expires. */
static pid_t member_child(const char *job, uint32_t group)
{
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        graft_membership_t *m = NULL;
        if (join(job, group, 2, &m) != GRAFT_OK)
            _exit(1);
        for (;;)
            pause();
    }
    return pid;
}

/* Waits (up to 15 s) until /metrics holds every line of want (NULL-ended). */
static void metrics_wait(dash_t *d, const char *const *want)
{
    char *body = NULL;
    for (int i = 0; i < 150; i++) {
        free(body);
        body = NULL;
        assert_int_equal(http(d, "GET", "/metrics", NULL, NULL, &body), 200);
        bool all = true;
        for (size_t k = 0; want[k] != NULL && all; k++)
            all = strstr(body, want[k]) != NULL;
        if (all) {
            free(body);
            return;
        }
        gc_sleep_ms(100);
    }
    fail_msg("/metrics never held all of '%s'...: %s", want[0], body);
}

static graft_membership_t *member(const char *job, uint32_t group)
{
    graft_membership_t *m = NULL;
    assert_int_equal(join(job, group, 0, &m), GRAFT_OK);
    return m;
}

/* Ends two members cleanly (graft_membership_destroy: the leave) and waits
 * for /metrics to show want. */
static void end_both(dash_t *d, graft_membership_t *a, graft_membership_t *b,
                     const char *const *want)
{
    graft_membership_destroy(a);
    graft_membership_destroy(b);
    metrics_wait(d, want);
}

/* A job whose groups all end cleanly (graft_destroy's leave) is completed,
 * its groups finished, and no group counts as dead; the dashboard's JSON
 * says so too. A killed group of a running job is dead and the job
 * degraded; once the others end, the job failed (not completed). */
static void test_job_states(void **state)
{
    dash_t d;
    dash_job = "done-job";
    graft_membership_t *m0 = member("done-job", 0), *m1 = member("done-job", 1);
    dash_start(&d, "done", (const char *const[]){NULL});
    metrics_wait(&d, (const char *[]){"graft_job_state{state=\"running\"} 1",
                                      "graft_groups{health=\"healthy\"} 0", "graft_ranks_live 2",
                                      NULL});
    end_both(&d, m0, m1,
             (const char *[]){"graft_job_state{state=\"completed\"} 1",
                              "graft_job_state{state=\"running\"} 0",
                              "graft_groups{health=\"finished\"} 2",
                              "graft_groups{health=\"dead\"} 0", NULL});
    char *body = NULL;
    assert_int_equal(http(&d, "GET", "/api/status", NULL, NULL, &body), 200);
    json_t *st = json_loads(body, 0, NULL);
    assert_non_null(st);
    assert_string_equal(json_string_value(json_object_get(st, "state")), "completed");
    assert_string_equal(gc_group_health(st, 0), "finished");
    assert_string_equal(gc_group_health(st, 1), "finished");
    json_decref(st);
    free(body);
    dash_stop(&d);

    dash_job = "kill-job";
    m0 = member("kill-job", 0);
    m1 = member("kill-job", 1);
    pid_t child = member_child("kill-job", 2);
    dash_start(&d, "kill", (const char *const[]){NULL});
    metrics_wait(&d, (const char *[]){"graft_ranks_live 3", "graft_groups{health=\"dead\"} 0",
                                      NULL});
    assert_int_equal(kill(child, SIGKILL), 0);
    assert_int_equal(waitpid(child, NULL, 0), child);
    metrics_wait(&d, (const char *[]){"graft_job_state{state=\"degraded\"} 1",
                                      "graft_groups{health=\"dead\"} 1", "graft_ranks_live 2",
                                      NULL});
    end_both(&d, m0, m1,
             (const char *[]){"graft_job_state{state=\"failed\"} 1",
                              "graft_job_state{state=\"completed\"} 0",
                              "graft_groups{health=\"finished\"} 2",
                              "graft_groups{health=\"dead\"} 1", NULL});
    dash_stop(&d);
    dash_job = "dash-job";
}

/* ----------------------------------------------------------- waiting --- */

/* /api/state once its "waiting" holds want (want NULL: once it is null). */
static void waiting_until(int port, const char *want)
{
    char *body = NULL;
    for (int i = 0; i < 300; i++) {
        free(body);
        body = NULL;
        if (gc_http(port, "GET", "/api/state", NULL, NULL, &body) == 200) {
            json_t *st = json_loads(body, 0, NULL);
            const char *w = json_string_value(json_object_get(st, "waiting"));
            bool done = want != NULL ? w != NULL && strstr(w, want) != NULL : w == NULL;
            json_decref(st);
            if (done) {
                free(body);
                return;
            }
        }
        gc_sleep_ms(100);
    }
    fail_msg("/api/state never had waiting '%s': %s", want ? want : "(null)", body);
}

/* The dashboard started before etcd and before the job (issue 28, item 6):
 * it answers at once, says what it waits for, graft_up 0; then etcd comes
 * up (without the job), then the job's first key: graft_up 1. */
static void test_waits_for_job(void **state)
{
    char listen[64], etcd_url[64], peer_url[64], data[PATH_MAX + 32];
    int port = gc_free_port(), eport = gc_free_port(), pport = gc_free_port();
    snprintf(listen, sizeof(listen), "127.0.0.1:%d", port);
    snprintf(etcd_url, sizeof(etcd_url), "http://127.0.0.1:%d", eport);
    snprintf(peer_url, sizeof(peer_url), "http://127.0.0.1:%d", pport);
    snprintf(data, sizeof(data), "%s/late-etcd", gc_tmpdir);
    const char *dargv[] = {gc_ctl_bin, "--etcd", etcd_url, "--job", "notyet", "dashboard",
                           "--listen", listen, "--interval-ms", "100", NULL};
    pid_t dash = gc_spawn_logged(dargv, "late.log");
    waiting_until(port, "waiting for job 'notyet': etcd unreachable");
    char *m = NULL;
    assert_int_equal(gc_http(port, "GET", "/metrics", NULL, NULL, &m), 200);
    assert_non_null(strstr(m, "\ngraft_up 0\n"));
    free(m);
    assert_int_equal(gc_http(port, "GET", "/api/status", NULL, NULL, &m), 503);
    assert_non_null(strstr(m, "waiting for job"));
    free(m);

    const char *eargv[] = {"/usr/bin/etcd", "--data-dir", data, "--listen-client-urls", etcd_url,
                           "--advertise-client-urls", etcd_url, "--listen-peer-urls", peer_url,
                           "--initial-advertise-peer-urls", peer_url, "--initial-cluster",
                           NULL, "--log-level", "warn", NULL};
    char cluster[96];
    snprintf(cluster, sizeof(cluster), "default=%s", peer_url);
    eargv[12] = cluster;
    pid_t late = gc_spawn_logged(eargv, "late-etcd.log");
    waiting_until(port, "waiting for job 'notyet': unknown job");
    const char *eps[] = {etcd_url};
    graft_etcd_t *c = graft_test_etcd_client(eps, 1, NULL, NULL);
    assert_non_null(c);
    assert_int_equal(graft_etcd_put(c, "/graft/notyet/demo/x", (const uint8_t *)"x", 1, 0,
                                    NULL, NULL),
                     GRAFT_OK);
    waiting_until(port, NULL);
    for (int i = 0; i < 100; i++) {
        m = NULL;
        assert_int_equal(gc_http(port, "GET", "/metrics", NULL, NULL, &m), 200);
        bool up = strstr(m, "\ngraft_up 1\n") != NULL;
        free(m);
        if (up)
            break;
        assert_true(i < 99);
        gc_sleep_ms(100);
    }
    graft_etcd_destroy(c);
    kill(dash, SIGTERM);
    int ws = 0;
    assert_int_equal(waitpid(dash, &ws, 0), dash);
    if (!WIFEXITED(ws) || WEXITSTATUS(ws) != 0) {
        char path[PATH_MAX + 32];
        snprintf(path, sizeof(path), "%s/late.log", gc_tmpdir);
        char *log = gc_slurp(path);
        print_error("the dashboard ended with %d:\n%s\n", ws, log);
        free(log);
    }
    assert_true(WIFEXITED(ws) && WEXITSTATUS(ws) == 0);
    kill(late, SIGTERM);
    waitpid(late, NULL, 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_host_header),
        cmocka_unit_test(test_token),
        cmocka_unit_test(test_ckpt_root),
        cmocka_unit_test(test_job_states),
        cmocka_unit_test(test_waits_for_job),
    };
    if (getenv("TEST_FILTER") != NULL)
        cmocka_set_test_filter(getenv("TEST_FILTER"));
    return cmocka_run_group_tests(tests, setup, teardown);
}
