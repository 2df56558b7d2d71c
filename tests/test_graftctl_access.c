/*
 * Tests of graftctl's access to etcd, against real etcd servers and real
 * members (membership handles of this process):
 *
 *  - `evict` revokes the leases of a real member, which learns it lost its
 *    lease and joins again, and records the event; it refuses to act
 *    without --yes when it cannot ask, and names a group with no member;
 *  - a group whose leases are kept alive but which does not announce is
 *    shown hung;
 *  - credentials by flag and by GRAFT_* variable against an etcd with
 *    authentication on; TLS with a client certificate.
 */
#include "graftctl_fixture.h"

/* ------------------------------------------------------------- evict --- */

static atomic_int lease_lost;

static void on_lease(graft_membership_notice_t what, uint64_t inc, graft_status_t why, void *arg)
{
    if (what == GRAFT_MEMBERSHIP_LEASE_LOST)
        atomic_store(&lease_lost, 1);
}

static void test_evict(void **state)
{
    const char *eps[] = {gc_endpoint};
    graft_etcd_config_t ec = {.endpoints = eps, .n_endpoints = 1};
    graft_membership_config_t mc = {.job = "evict-job", .etcd = &ec, .group = 7,
                                    .lease_ttl_s = 9, .lease_cb = on_lease};
    graft_membership_t *m = NULL;
    assert_int_equal(graft_membership_create(&mc, &m), GRAFT_OK);
    uint64_t inc = graft_membership_incarnation(m);

    char *err = NULL;
    /* No terminal to ask on and no --yes: nothing is done. */
    assert_int_equal(gc_run_ctl((const char *[]){"--etcd", gc_endpoint, "--job", "evict-job",
                                                 "evict", "7", NULL},
                                NULL, &err),
                     2);
    assert_non_null(strstr(err, "--yes"));
    free(err);
    assert_int_equal(graft_membership_incarnation(m), inc);
    assert_int_equal(atomic_load(&lease_lost), 0);
    assert_int_equal(gc_run_ctl((const char *[]){"--etcd", gc_endpoint, "--job", "evict-job",
                                                 "--yes", "evict", "3", NULL},
                                NULL, &err),
                     1);
    assert_non_null(strstr(err, "no live member"));
    free(err);

    json_t *j = gc_ctl_json((const char *[]){"--etcd", gc_endpoint, "--job", "evict-job", "--json",
                                             "--yes", "evict", "7", NULL});
    assert_int_equal(json_array_size(json_object_get(j, "leases_revoked")), 1);
    assert_true(json_is_true(json_object_get(j, "event_recorded")));
    json_decref(j);
    /* The member learns it lost its lease at its next keep-alive (every
     * TTL/3), before the 9 s lease could have expired by itself, and joins
     * again as a new incarnation. */
    for (int i = 0; i < 140 && atomic_load(&lease_lost) == 0; i++)
        gc_sleep_ms(50);
    assert_int_equal(atomic_load(&lease_lost), 1);
    for (int i = 0; i < 100 && graft_membership_incarnation(m) == inc; i++)
        gc_sleep_ms(50);
    assert_true(graft_membership_incarnation(m) != inc);

    json_t *ev = gc_ctl_json((const char *[]){"--etcd", gc_endpoint, "--job", "evict-job", "--json",
                                              "events", "--kind", "leave", "--group", "7", NULL});
    json_t *last = json_array_get(json_object_get(ev, "events"), 0);
    assert_non_null(last);
    assert_non_null(strstr(json_string_value(json_object_get(last, "detail")), "evicted"));
    json_decref(ev);
    graft_membership_destroy(m);
}

/* ------------------------------------------------------------ hung --- */

/* A group whose leases are kept alive but which does not announce (its
 * training loop is stuck) is left out of the quorum: status calls it hung,
 * while the group that formed the quorum is healthy. */
static void test_hung_group(void **state)
{
    const char *eps[] = {gc_endpoint};
    graft_etcd_config_t ec = {.endpoints = eps, .n_endpoints = 1};
    graft_membership_config_t mc = {.job = "hung-job", .etcd = &ec, .min_groups = 1,
                                    .join_timeout_ms = 300, .state = GRAFT_MEMBER_HEALTHY};
    graft_membership_t *m0 = NULL, *m1 = NULL;
    mc.group = 0;
    assert_int_equal(graft_membership_create(&mc, &m0), GRAFT_OK);
    mc.group = 1;
    assert_int_equal(graft_membership_create(&mc, &m1), GRAFT_OK);
    graft_quorum_t *q = NULL;
    assert_int_equal(graft_membership_quorum_wait(m0, 0, 10000, &q), GRAFT_OK);
    assert_int_equal(q->n_members, 1);
    graft_membership_quorum_free(q);

    json_t *st = gc_ctl_json((const char *[]){"--etcd", gc_endpoint, "--job", "hung-job", "--json",
                                              "status", NULL});
    assert_string_equal(gc_group_health(st, 0), "healthy");
    assert_string_equal(gc_group_health(st, 1), "hung");
    json_decref(st);
    graft_membership_destroy(m1);
    graft_membership_destroy(m0);
}

/* --------------------------------------------------------------- auth --- */

/* Credentials by flag and by GRAFT_* variable against an etcd with
 * authentication on (users and roles set up with etcdctl); wrong ones are
 * named as an authentication failure. */
static void test_auth(void **state)
{
    graft_test_etcd_t a;
    static const char *const args[] = {"--auth-token=simple", "--bcrypt-cost=4", NULL};
    assert_int_equal(graft_test_etcd_start(&a, args), 0);
    const char *ep = graft_etcd_server_endpoint(a.server);
    const char *const setup[][7] = {
        {"user", "add", "root:rootpw", NULL},
        {"user", "grant-role", "root", "root", NULL},
        {"user", "add", "alice:alicepw", NULL},
        {"role", "add", "jobrw", NULL},
        {"role", "grant-permission", "jobrw", "--prefix=true", "readwrite", "/graft/", NULL},
        {"user", "grant-role", "alice", "jobrw", NULL},
        {"auth", "enable", NULL},
    };
    const char *const role_root[] = {"role", "add", "root", NULL};
    (void)graft_test_etcdctl(ep, NULL, 0, role_root); /* may exist already */
    for (size_t i = 0; i < sizeof(setup) / sizeof(setup[0]); i++)
        assert_int_equal(graft_test_etcdctl(ep, NULL, 0, setup[i]), 0);

    const char *eps[] = {ep};
    graft_etcd_config_t ec = {.endpoints = eps, .n_endpoints = 1, .username = "alice",
                              .password = "alicepw"};
    graft_membership_config_t mc = {.job = "auth-job", .etcd = &ec, .group = 0};
    graft_membership_t *m = NULL;
    assert_int_equal(graft_membership_create(&mc, &m), GRAFT_OK);

    json_t *st = gc_ctl_json((const char *[]){"--etcd", ep, "--job", "auth-job", "--user", "alice",
                                              "--password", "alicepw", "--json", "status", NULL});
    assert_int_equal(json_integer_value(json_object_get(st, "groups_known")), 1);
    json_decref(st);
    setenv("GRAFT_ETCD_USER", "alice", 1);
    setenv("GRAFT_ETCD_PASSWORD", "alicepw", 1);
    setenv("GRAFT_ETCD_ENDPOINTS", ep, 1);
    setenv("GRAFT_JOB", "auth-job", 1);
    st = gc_ctl_json((const char *[]){"--json", "status", NULL});
    assert_int_equal(json_integer_value(json_object_get(st, "groups_known")), 1);
    json_decref(st);
    char *err = NULL;
    assert_int_equal(
        gc_run_ctl((const char *[]){"--password", "wrong", "status", NULL}, NULL, &err), 1);
    assert_non_null(strstr(err, "authentication failed"));
    free(err);
    unsetenv("GRAFT_ETCD_USER");
    unsetenv("GRAFT_ETCD_PASSWORD");
    unsetenv("GRAFT_ETCD_ENDPOINTS");
    unsetenv("GRAFT_JOB");
    assert_int_equal(gc_run_ctl((const char *[]){"--etcd", ep, "--job", "auth-job", "status", NULL},
                                NULL, &err),
                     1);
    free(err);
    graft_membership_destroy(m);
    graft_test_etcd_stop(&a);
}

/* TLS with a client certificate: an etcd whose certificates the test makes
 * with the openssl command; without the CA the server is not trusted. */
static void test_tls(void **state)
{
    char dir[PATH_MAX + 16], ca[PATH_MAX + 32], crt[PATH_MAX + 32], key[PATH_MAX + 32];
    char scrt[PATH_MAX + 32], skey[PATH_MAX + 32];
    snprintf(dir, sizeof(dir), "%s/tls", gc_tmpdir);
    gc_sh("mkdir -p '%s'", dir);
    assert_int_equal(graft_test_tls_certs(dir), 0);
    snprintf(ca, sizeof(ca), "%s/ca.crt", dir);
    snprintf(crt, sizeof(crt), "%s/client.crt", dir);
    snprintf(key, sizeof(key), "%s/client.key", dir);
    snprintf(scrt, sizeof(scrt), "%s/server.crt", dir);
    snprintf(skey, sizeof(skey), "%s/server.key", dir);
    graft_etcd_server_opts_t so = {.cert_file = scrt, .key_file = skey, .trusted_ca_file = ca};
    graft_etcd_server_t *server = NULL;
    assert_int_equal(graft_etcd_server_start(&so, &server), GRAFT_OK);
    const char *ep = graft_etcd_server_endpoint(server);
    assert_non_null(strstr(ep, "https://"));

    const char *eps[] = {ep};
    graft_etcd_config_t ec = {.endpoints = eps, .n_endpoints = 1, .ca_file = ca,
                              .cert_file = crt, .key_file = key};
    graft_membership_config_t mc = {.job = "tls-job", .etcd = &ec, .group = 4};
    graft_membership_t *m = NULL;
    assert_int_equal(graft_membership_create(&mc, &m), GRAFT_OK);
    json_t *st = gc_ctl_json((const char *[]){"--etcd", ep, "--job", "tls-job", "--cacert", ca,
                                              "--cert", crt, "--key", key, "--json", "status",
                                              NULL});
    json_t *g = json_array_get(json_object_get(st, "groups"), 0);
    assert_int_equal(json_integer_value(json_object_get(g, "group")), 4);
    json_decref(st);
    char *err = NULL;
    assert_int_equal(gc_run_ctl((const char *[]){"--etcd", ep, "--job", "tls-job", "status", NULL},
                                NULL, &err),
                     1);
    assert_non_null(strstr(err, ep));
    free(err);
    graft_membership_destroy(m);
    graft_etcd_server_destroy(server);
}

/* ------------------------------------------------------------- main --- */

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_evict),
        cmocka_unit_test(test_hung_group),
        cmocka_unit_test(test_auth),
        cmocka_unit_test(test_tls),
    };
    if (getenv("TEST_FILTER") != NULL)
        cmocka_set_test_filter(getenv("TEST_FILTER"));
    return cmocka_run_group_tests(tests, gc_setup, gc_teardown);
}
