/* The etcd client over TLS with client certificates, against a real etcd
 * whose certificates the test makes with the openssl command. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <graft/etcd.h>

#include "etcd_fixture.h"

static char dir[256];
static char ca[300], srv_crt[300], srv_key[300], cli_crt[300], cli_key[300];
static graft_etcd_server_t *server;

static int make_certs(void)
{
    const char *tmp = getenv("TMPDIR");
    snprintf(dir, sizeof(dir), "%s/graft-tls-XXXXXX", tmp && tmp[0] ? tmp : "/tmp");
    if (mkdtemp(dir) == NULL)
        return -1;
    if (graft_test_tls_certs(dir) != 0)
        return -1;
    snprintf(ca, sizeof(ca), "%s/ca.crt", dir);
    snprintf(srv_crt, sizeof(srv_crt), "%s/server.crt", dir);
    snprintf(srv_key, sizeof(srv_key), "%s/server.key", dir);
    snprintf(cli_crt, sizeof(cli_crt), "%s/client.crt", dir);
    snprintf(cli_key, sizeof(cli_key), "%s/client.key", dir);
    return 0;
}

static int group_setup(void **state)
{
    (void)state;
    if (make_certs() != 0) {
        fprintf(stderr, "could not make test certificates with openssl\n");
        return -1;
    }
    graft_etcd_server_opts_t o = {.cert_file = srv_crt, .key_file = srv_key,
                                  .trusted_ca_file = ca};
    graft_status_t st = graft_etcd_server_start(&o, &server);
    if (st != GRAFT_OK) {
        fprintf(stderr, "etcd with TLS: %s\n", graft_status_string(st));
        return -1;
    }
    return 0;
}

static int group_teardown(void **state)
{
    (void)state;
    graft_etcd_server_destroy(server);
    char cmd[400];
    snprintf(cmd, sizeof(cmd), "rm -rf '%s'", dir);
    if (system(cmd) != 0)
        fprintf(stderr, "could not remove %s\n", dir);
    return 0;
}

static graft_etcd_t *client(const char *ca_file, const char *cert, const char *key)
{
    const char *ep = graft_etcd_server_endpoint(server);
    graft_etcd_config_t c = {.endpoints = &ep, .n_endpoints = 1, .request_timeout_ms = 3000,
                             .max_retries = 1, .retry_backoff_ms = 10, .ca_file = ca_file,
                             .cert_file = cert, .key_file = key};
    graft_etcd_t *e = NULL;
    assert_int_equal(graft_etcd_create(&c, &e), GRAFT_OK);
    return e;
}

static void test_tls_with_client_cert(void **state)
{
    (void)state;
    assert_memory_equal(graft_etcd_server_endpoint(server), "https://", 8);
    graft_etcd_t *c = client(ca, cli_crt, cli_key);
    int64_t rev = 0;
    assert_int_equal(graft_etcd_put(c, "/tls/a", "secret", 6, 0, NULL, &rev), GRAFT_OK);
    graft_etcd_kv_t kv;
    assert_int_equal(graft_etcd_get(c, "/tls/a", &kv, NULL), GRAFT_OK);
    assert_string_equal((char *)kv.value, "secret");
    graft_etcd_kv_clear(&kv);
    graft_etcd_watch_t *w = NULL;
    assert_int_equal(graft_etcd_watch_create(c, "/tls/", rev, &w), GRAFT_OK);
    graft_etcd_event_t *ev = NULL;
    size_t n = 0;
    for (int i = 0; i < 20 && n == 0; i++)
        assert_int_equal(graft_etcd_watch_next(w, 100, &ev, &n), GRAFT_OK);
    assert_int_equal(n, 1);
    assert_string_equal(ev[0].kv.key, "/tls/a");
    graft_etcd_events_free(ev, n);
    graft_etcd_watch_destroy(w);
    graft_etcd_destroy(c);
}

static void test_tls_refusals(void **state)
{
    (void)state;
    graft_etcd_kv_t kv;
    /* The server's certificate does not chain to the system's CAs. */
    graft_etcd_t *c = client(NULL, cli_crt, cli_key);
    assert_int_equal(graft_etcd_get(c, "/tls/a", &kv, NULL), GRAFT_EAUTH);
    graft_etcd_destroy(c);
    /* No client certificate: etcd refuses the handshake. */
    c = client(ca, NULL, NULL);
    graft_status_t st = graft_etcd_get(c, "/tls/a", &kv, NULL);
    assert_true(st == GRAFT_EAUTH || st == GRAFT_EUNREACHABLE);
    graft_etcd_destroy(c);
    /* A certificate without its key is a usage error of the server. */
    graft_etcd_server_opts_t o = {.cert_file = srv_crt};
    graft_etcd_server_t *s = NULL;
    assert_int_equal(graft_etcd_server_start(&o, &s), GRAFT_EINVAL);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_tls_with_client_cert),
        cmocka_unit_test(test_tls_refusals),
    };
    return cmocka_run_group_tests_name("etcd_tls", tests, group_setup, group_teardown);
}
