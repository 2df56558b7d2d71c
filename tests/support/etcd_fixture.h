/*
 * Test helpers around the embedded etcd: start one per test program (or per
 * test), and make clients for it. Public headers and the launcher's
 * (tools/etcd_launcher/etcd_launcher.h) only, so benchmarks can link them too.
 */
#ifndef GRAFT_TEST_ETCD_FIXTURE_H
#define GRAFT_TEST_ETCD_FIXTURE_H

#include "etcd_launcher.h"

typedef struct graft_test_etcd {
    graft_etcd_server_t *server;
    graft_etcd_t *client;
} graft_test_etcd_t;

/* Start an embedded etcd (extra_args may be NULL) and a client for it.
 * Returns 0 on success, -1 (with a message on stderr) otherwise. */
int graft_test_etcd_start(graft_test_etcd_t *t, const char *const *extra_args);

/* Destroy client and server; the temporary directory goes with them. */
void graft_test_etcd_stop(graft_test_etcd_t *t);

/* A real etcd cluster on loopback (graft_etcd_cluster_start()) and a
 * client of every member's endpoint, in member order. */
typedef struct graft_test_etcd_cluster {
    graft_etcd_cluster_t *cluster;
    graft_etcd_t *client;
    char **endpoints;
    size_t n_endpoints;
} graft_test_etcd_cluster_t;

/* Start an n-member cluster and its client. Returns 0 on success, -1 (with
 * a message on stderr) otherwise. */
int graft_test_etcd_cluster_start(graft_test_etcd_cluster_t *t, size_t n_members);

/* Destroy client and cluster with their directories. */
void graft_test_etcd_cluster_stop(graft_test_etcd_cluster_t *t);

/* Wait up to timeout_ms for a member to lead; its index in *leader_p.
 * Returns 0, or -1 when none did. */
int graft_test_etcd_cluster_wait_leader(graft_test_etcd_cluster_t *t, uint32_t timeout_ms,
                                        size_t *leader_p);

/* The client settings of the membership tests: the given endpoints and
 * request timeout, a 300 ms connect timeout, one retry after 20 ms. */
graft_etcd_config_t graft_test_etcd_config(const char *const *endpoints, size_t n,
                                           uint32_t request_timeout_ms);

/* A client for the given endpoints with short timeouts suited to tests. */
graft_etcd_t *graft_test_etcd_client(const char *const *endpoints, size_t n,
                                     const char *user, const char *password);

/* Run etcdctl against endpoint with the given arguments (NULL-terminated);
 * output goes to out (may be NULL). Returns the exit status, -1 on failure
 * to run it. */
int graft_test_etcdctl(const char *endpoint, char *out, size_t out_len, const char *const *args);

/* Make a CA and a server and a client certificate for IP 127.0.0.1
 * (ca.crt, server.crt/.key, client.crt/.key) in dir with the openssl
 * command. Returns 0 on success, -1 (with a message on stderr) otherwise. */
int graft_test_tls_certs(const char *dir);

#endif
