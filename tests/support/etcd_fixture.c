/* Embedded etcd for tests and benchmarks; see etcd_fixture.h. */
#include "etcd_fixture.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

int graft_test_etcd_start(graft_test_etcd_t *t, const char *const *extra_args)
{
    graft_etcd_server_opts_t o = {.extra_args = extra_args};
    memset(t, 0, sizeof(*t));
    graft_status_t st = graft_etcd_server_start(&o, &t->server);
    if (st != GRAFT_OK) {
        fprintf(stderr, "embedded etcd: %s\n", graft_status_string(st));
        return -1;
    }
    const char *ep = graft_etcd_server_endpoint(t->server);
    t->client = graft_test_etcd_client(&ep, 1, NULL, NULL);
    if (t->client == NULL) {
        graft_etcd_server_destroy(t->server);
        t->server = NULL;
        return -1;
    }
    return 0;
}

void graft_test_etcd_stop(graft_test_etcd_t *t)
{
    graft_etcd_destroy(t->client);
    graft_etcd_server_destroy(t->server);
    memset(t, 0, sizeof(*t));
}

int graft_test_etcd_cluster_start(graft_test_etcd_cluster_t *t, size_t n_members)
{
    memset(t, 0, sizeof(*t));
    graft_status_t st = graft_etcd_cluster_start(NULL, n_members, &t->cluster);
    if (st != GRAFT_OK) {
        fprintf(stderr, "embedded etcd cluster of %zu: %s\n", n_members,
                graft_status_string(st));
        return -1;
    }
    st = graft_etcd_endpoints_split(graft_etcd_cluster_endpoints(t->cluster), &t->endpoints,
                                    &t->n_endpoints);
    if (st == GRAFT_OK)
        t->client = graft_test_etcd_client((const char *const *)t->endpoints, t->n_endpoints,
                                           NULL, NULL);
    if (t->client == NULL) {
        graft_test_etcd_cluster_stop(t);
        return -1;
    }
    return 0;
}

void graft_test_etcd_cluster_stop(graft_test_etcd_cluster_t *t)
{
    graft_etcd_destroy(t->client);
    graft_etcd_endpoints_free(t->endpoints, t->n_endpoints);
    graft_etcd_cluster_destroy(t->cluster);
    memset(t, 0, sizeof(*t));
}

int graft_test_etcd_cluster_wait_leader(graft_test_etcd_cluster_t *t, uint32_t timeout_ms,
                                        size_t *leader_p)
{
    for (uint32_t waited = 0;; waited += 50) {
        if (graft_etcd_cluster_leader(t->cluster, leader_p) == GRAFT_OK)
            return 0;
        if (waited >= timeout_ms)
            return -1;
        usleep(50 * 1000);
    }
}

graft_etcd_config_t graft_test_etcd_config(const char *const *endpoints, size_t n,
                                           uint32_t request_timeout_ms)
{
    return (graft_etcd_config_t){
        .endpoints = endpoints,
        .n_endpoints = n,
        .request_timeout_ms = request_timeout_ms,
        .connect_timeout_ms = 300,
        .max_retries = 1,
        .retry_backoff_ms = 20,
    };
}

graft_etcd_t *graft_test_etcd_client(const char *const *endpoints, size_t n, const char *user,
                                     const char *password)
{
    graft_etcd_config_t c = {
        .endpoints = endpoints,
        .n_endpoints = n,
        .request_timeout_ms = 5000,
        .connect_timeout_ms = 500,
        .max_retries = 2,
        .retry_backoff_ms = 20,
        .username = user,
        .password = password,
    };
    graft_etcd_t *e = NULL;
    graft_status_t st = graft_etcd_create(&c, &e);
    if (st != GRAFT_OK) {
        fprintf(stderr, "etcd client: %s\n", graft_status_string(st));
        return NULL;
    }
    return e;
}

int graft_test_etcdctl(const char *endpoint, char *out, size_t out_len, const char *const *args)
{
    int fds[2];
    if (pipe(fds) != 0)
        return -1;
    const char *argv[32];
    size_t a = 0;
    char ep[256];
    snprintf(ep, sizeof(ep), "--endpoints=%s", endpoint);
    argv[a++] = "etcdctl";
    argv[a++] = ep;
    for (size_t i = 0; args[i] != NULL && a < 31; i++)
        argv[a++] = args[i];
    argv[a] = NULL;
    pid_t pid = fork();
    if (pid < 0) {
        close(fds[0]);
        close(fds[1]);
        return -1;
    }
    if (pid == 0) {
        dup2(fds[1], 1);
        dup2(fds[1], 2);
        close(fds[0]);
        close(fds[1]);
        setenv("ETCDCTL_API", "3", 1);
        execvp("etcdctl", (char *const *)argv);
        _exit(127);
    }
    close(fds[1]);
    size_t len = 0;
    char buf[4096];
    ssize_t r;
    while ((r = read(fds[0], buf, sizeof(buf))) != 0) {
        if (r < 0) {
            if (errno == EINTR)
                continue;
            break;
        }
        if (out != NULL && len + 1 < out_len) {
            size_t n = (size_t)r < out_len - 1 - len ? (size_t)r : out_len - 1 - len;
            memcpy(out + len, buf, n);
            len += n;
        }
    }
    if (out != NULL && out_len > 0)
        out[len] = '\0';
    close(fds[0]);
    int wst = 0;
    while (waitpid(pid, &wst, 0) < 0 && errno == EINTR) {
    }
    return WIFEXITED(wst) ? WEXITSTATUS(wst) : -1;
}

int graft_test_tls_certs(const char *dir)
{
    char cmd[2048];
    int n = snprintf(cmd, sizeof(cmd),
                     "(cd '%s' && "
                     "openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes "
                     "-keyout ca.key -out ca.crt -days 1 -subj /CN=graft-test-ca && "
                     "printf 'subjectAltName=IP:127.0.0.1\\n' > san.ext && "
                     "for n in server client; do "
                     "openssl req -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes "
                     "-keyout $n.key -out $n.csr -subj /CN=$n && "
                     "openssl x509 -req -in $n.csr -CA ca.crt -CAkey ca.key -CAcreateserial "
                     "-out $n.crt -days 1 -extfile san.ext || exit 1; done) >/dev/null 2>&1",
                     dir);
    if (n < 0 || (size_t)n >= sizeof(cmd) || system(cmd) != 0) {
        fprintf(stderr, "could not make test certificates in %s with openssl\n", dir);
        return -1;
    }
    return 0;
}
