/*
 * Embedded etcd: Debian's etcd started as a child process on free loopback
 * ports in a temporary directory, for tests, the simulator and the demo.
 * The child is tied to its parent with PR_SET_PDEATHSIG so a crashed test
 * never leaves an etcd behind. Not part of libgraft (etcd_launcher.h); it
 * is built on libgraft.a's internals of common/ and etcd/ (allocation,
 * logging, clocks, curl's one-time set-up), which is why its users link
 * the static library.
 */
#include "etcd_launcher.h"

#include "etcd/etcd_internal.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

struct graft_etcd_server {
    char *binary;
    char *work_dir;  /* our temporary directory: log, and data unless given */
    char *data_dir;
    char *log_path;
    char *endpoint;  /* http://127.0.0.1:<client_port> */
    char **extra_args;
    char *cert_file;  /* TLS, all three optional */
    char *key_file;
    char *ca_file;
    char *name;            /* member name: "default" alone, "m<i>" in a cluster */
    char *initial_cluster; /* name=peer URL of every member */
    char *cluster_token;   /* NULL alone; keeps clusters of one host apart */
    size_t n_extra;
    uint32_t start_timeout_ms;
    int client_port;
    int peer_port;
    pid_t pid;
};

struct graft_etcd_cluster {
    graft_etcd_server_t **members;
    size_t n_members;
    char *endpoints; /* comma-separated client URLs */
};

/* A loopback port that binds now, below the ephemeral range, or -1. The
 * system's own choice (bind to port 0) is in that range, where an outgoing
 * connection can take it before etcd binds it: seen as "bind: address
 * already in use" on a machine where other programs held tens of
 * thousands of connections (runtime_bench starting an etcd per size). */
int graft_etcd_server_free_port(void)
{
    int low = 32768, high = 60999;
    FILE *f = fopen("/proc/sys/net/ipv4/ip_local_port_range", "re");
    if (f != NULL) {
        if (fscanf(f, "%d %d", &low, &high) != 2)
            low = 32768;
        fclose(f);
    }
    if (low <= 12000)
        return -1; /* no room below it: leave the choice to the system */
    unsigned seed = (unsigned)getpid() ^ (unsigned)graft__now_ns();
    for (int i = 0; i < 100; i++) {
        int port = 10000 + (int)(rand_r(&seed) % (unsigned)(low - 10000));
        int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
        struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
        a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
        bool ok = fd >= 0 && bind(fd, (struct sockaddr *)&a, sizeof(a)) == 0;
        if (fd >= 0)
            close(fd);
        if (ok)
            return port;
    }
    return -1;
}

static int free_port(graft_status_t *st_p)
{
    int port = -1;
    if (*st_p != GRAFT_OK)
        return -1;
    port = graft_etcd_server_free_port();
    if (port > 0)
        return port;
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) {
        GRAFT_ERROR(GRAFT_MOD_ETCD, "socket: %s", strerror(errno));
        *st_p = GRAFT_ESYS;
        return -1;
    }
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = 0};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof(a);
    if (bind(fd, (struct sockaddr *)&a, sizeof(a)) != 0 ||
        getsockname(fd, (struct sockaddr *)&a, &len) != 0) {
        GRAFT_ERROR(GRAFT_MOD_ETCD, "bind 127.0.0.1:0: %s", strerror(errno));
        *st_p = GRAFT_ESYS;
    } else {
        port = ntohs(a.sin_port);
    }
    close(fd);
    return port;
}

static char *find_binary(const char *name)
{
    if (strchr(name, '/') != NULL)
        return access(name, X_OK) == 0 ? graft__strdup(name) : NULL;
    const char *path = getenv("PATH");
    if (path == NULL || path[0] == '\0')
        path = "/usr/local/bin:/usr/bin:/bin";
    while (*path) {
        const char *colon = strchr(path, ':');
        size_t n = colon ? (size_t)(colon - path) : strlen(path);
        char *cand = graft__asprintf("%.*s/%s", (int)n, path, name);
        if (cand != NULL && access(cand, X_OK) == 0)
            return cand;
        graft_free(cand);
        path += n + (colon ? 1 : 0);
    }
    return NULL;
}

static int rm_entry(const char *path, const struct stat *sb, int flag, struct FTW *ftw)
{
    (void)sb;
    (void)flag;
    (void)ftw;
    if (remove(path) != 0 && errno != ENOENT)
        GRAFT_WARN(GRAFT_MOD_ETCD, "remove %s: %s", path, strerror(errno));
    return 0;
}

static void remove_tree(const char *dir)
{
    if (dir != NULL)
        nftw(dir, rm_entry, 16, FTW_DEPTH | FTW_PHYS);
}

/* Runs in the child between fork and exec: only async-signal-safe calls. */
static void child_exec(const graft_etcd_server_t *s, char *const argv[], pid_t parent)
{
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    /* The parent may have died before prctl took effect. */
    if (getppid() != parent)
        _exit(127);
    int fd = open(s->log_path, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0600);
    int null = open("/dev/null", O_RDONLY | O_CLOEXEC);
    if (fd < 0 || null < 0)
        _exit(126);
    dup2(null, 0);
    dup2(fd, 1);
    dup2(fd, 2);
    /* Do not hand the parent's sockets (curl connections, listeners of
     * other tests) to etcd. */
    for (int i = 3; i < 1024; i++)
        if (i != fd && i != null)
            close(i);
    execv(s->binary, argv);
    _exit(127);
}

static bool healthy(const graft_etcd_server_t *s)
{
    bool ok = false;
    CURL *h = curl_easy_init();
    char *url = graft__asprintf("%s/health", s->endpoint);
    if (h == NULL || url == NULL)
        goto out;
    curl_easy_setopt(h, CURLOPT_URL, url);
    if (s->cert_file != NULL) {
        /* The server's own pair doubles as the client identity here. */
        curl_easy_setopt(h, CURLOPT_SSLCERT, s->cert_file);
        curl_easy_setopt(h, CURLOPT_SSLKEY, s->key_file);
        if (s->ca_file != NULL)
            curl_easy_setopt(h, CURLOPT_CAINFO, s->ca_file);
    }
    curl_easy_setopt(h, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(h, CURLOPT_TIMEOUT_MS, 1000L);
    curl_easy_setopt(h, CURLOPT_CONNECTTIMEOUT_MS, 200L);
    FILE *f = fopen("/dev/null", "w");
    if (f == NULL)
        goto out;
    curl_easy_setopt(h, CURLOPT_WRITEDATA, f);
    long code = 0;
    if (curl_easy_perform(h) == CURLE_OK &&
        curl_easy_getinfo(h, CURLINFO_RESPONSE_CODE, &code) == CURLE_OK && code == 200)
        ok = true;
    fclose(f);
out:
    graft_free(url);
    if (h != NULL)
        curl_easy_cleanup(h);
    return ok;
}

static void log_tail(const graft_etcd_server_t *s)
{
    FILE *f = fopen(s->log_path, "r");
    if (f == NULL)
        return;
    char line[512];
    char last[4][512] = {{0}};
    int n = 0;
    while (fgets(line, sizeof(line), f) != NULL) {
        line[strcspn(line, "\n")] = '\0';
        snprintf(last[n % 4], sizeof(last[0]), "%s", line);
        n++;
    }
    fclose(f);
    for (int i = n > 4 ? n - 4 : 0; i < n; i++)
        GRAFT_ERROR(GRAFT_MOD_ETCD, "etcd log: %s", last[i % 4]);
}

/* Fork and exec etcd without waiting for it; s->pid is set on success. */
static graft_status_t spawn(graft_etcd_server_t *s)
{
    graft_status_t st = GRAFT_ENOMEM;
    char *client = graft__asprintf("%s://127.0.0.1:%d", s->cert_file ? "https" : "http",
                                   s->client_port);
    char *peer = graft__asprintf("http://127.0.0.1:%d", s->peer_port);
    char *name = graft__asprintf("--name=%s", s->name);
    char *cluster = s->initial_cluster != NULL
                        ? graft__strdup(s->initial_cluster)
                        : graft__asprintf("%s=http://127.0.0.1:%d", s->name, s->peer_port);
    char **argv = graft__calloc(32 + s->n_extra, sizeof(char *));
    if (client == NULL || peer == NULL || name == NULL || cluster == NULL || argv == NULL)
        goto out;
    size_t a = 0;
    argv[a++] = s->binary;
    argv[a++] = name;
    argv[a++] = "--data-dir";
    argv[a++] = s->data_dir;
    argv[a++] = "--listen-client-urls";
    argv[a++] = client;
    argv[a++] = "--advertise-client-urls";
    argv[a++] = client;
    argv[a++] = "--listen-peer-urls";
    argv[a++] = peer;
    argv[a++] = "--initial-advertise-peer-urls";
    argv[a++] = peer;
    argv[a++] = "--initial-cluster";
    argv[a++] = cluster;
    if (s->cluster_token != NULL) {
        argv[a++] = "--initial-cluster-token";
        argv[a++] = s->cluster_token;
    }
    argv[a++] = "--logger=zap";
    argv[a++] = "--log-level=warn";
    if (s->cert_file != NULL) {
        argv[a++] = "--cert-file";
        argv[a++] = s->cert_file;
        argv[a++] = "--key-file";
        argv[a++] = s->key_file;
    }
    if (s->ca_file != NULL) {
        argv[a++] = "--trusted-ca-file";
        argv[a++] = s->ca_file;
        argv[a++] = "--client-cert-auth";
    }
    for (size_t i = 0; i < s->n_extra; i++)
        argv[a++] = s->extra_args[i];
    argv[a] = NULL;

    pid_t parent = getpid();
    pid_t pid = fork();
    if (pid < 0) {
        GRAFT_ERROR(GRAFT_MOD_ETCD, "fork: %s", strerror(errno));
        st = GRAFT_ESYS;
        goto out;
    }
    if (pid == 0)
        child_exec(s, argv, parent);
    s->pid = pid;
    st = GRAFT_OK;
out:
    graft_free(argv);
    graft_free(cluster);
    graft_free(name);
    graft_free(peer);
    graft_free(client);
    return st;
}

/* Wait until a spawned etcd answers /health (which needs a leader, so the
 * members of a cluster are all spawned before any is waited for). Stops
 * it when it never does. */
static graft_status_t wait_healthy(graft_etcd_server_t *s)
{
    graft_status_t st = GRAFT_ESYS;
    pid_t pid = s->pid;
    uint64_t deadline = graft__now_ns() + (uint64_t)s->start_timeout_ms * 1000000ull;
    for (;;) {
        int wst;
        pid_t w = waitpid(pid, &wst, WNOHANG);
        if (w == pid) {
            s->pid = -1;
            GRAFT_ERROR(GRAFT_MOD_ETCD, "etcd exited during start-up (status %d); log %s", wst,
                        s->log_path);
            log_tail(s);
            st = GRAFT_ESYS;
            break;
        }
        if (healthy(s)) {
            st = GRAFT_OK;
            break;
        }
        if (graft__now_ns() > deadline) {
            GRAFT_ERROR(GRAFT_MOD_ETCD, "etcd on %s not healthy after %u ms; log %s",
                        s->endpoint, s->start_timeout_ms, s->log_path);
            log_tail(s);
            st = GRAFT_ETIMEOUT;
            if (graft_etcd_server_stop(s) != GRAFT_OK)
                GRAFT_WARN(GRAFT_MOD_ETCD, "etcd: could not stop pid %d", (int)pid);
            break;
        }
        graft__sleep_ns(20 * 1000000ull);
    }
    return st;
}

static graft_status_t launch(graft_etcd_server_t *s)
{
    graft_status_t st = spawn(s);
    return st == GRAFT_OK ? wait_healthy(s) : st;
}

/* True when port is one of the n in used (ports a cluster already took). */
static bool port_taken(int port, const int *used, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (used[i] == port)
            return true;
    return false;
}

/*
 * A server with its directories, ports and endpoint, not started. name is
 * the member name; used/n_used are ports to stay clear of (the kernel may
 * hand out the same free port twice once the probing socket is closed), and
 * the two taken here are appended to used.
 */
static graft_status_t server_new(const graft_etcd_server_opts_t *opts, const char *name,
                                 int *used, size_t *n_used, graft_etcd_server_t **server_p)
{
    graft_status_t st = GRAFT_ENOMEM;
    graft_etcd_server_t *s = NULL;

    s = graft__calloc(1, sizeof(*s));
    if (s == NULL)
        goto out;
    s->pid = -1;
    s->name = graft__strdup(name);
    if (s->name == NULL)
        goto err_server;
    s->start_timeout_ms = opts->start_timeout_ms ? opts->start_timeout_ms : 20000;
    s->binary = find_binary(opts->binary ? opts->binary : "etcd");
    if (s->binary == NULL) {
        GRAFT_ERROR(GRAFT_MOD_ETCD, "no etcd binary '%s' (install etcd-server)",
                    opts->binary ? opts->binary : "etcd");
        st = GRAFT_ENOTFOUND;
        goto err_server;
    }
    if (opts->extra_args != NULL) {
        while (opts->extra_args[s->n_extra] != NULL)
            s->n_extra++;
        s->extra_args = graft__calloc(s->n_extra + 1, sizeof(char *));
        if (s->extra_args == NULL)
            goto err_server;
        for (size_t i = 0; i < s->n_extra; i++)
            if ((s->extra_args[i] = graft__strdup(opts->extra_args[i])) == NULL)
                goto err_server;
    }
    if ((opts->cert_file == NULL) != (opts->key_file == NULL) ||
        (opts->trusted_ca_file != NULL && opts->cert_file == NULL)) {
        GRAFT_ERROR(GRAFT_MOD_ETCD, "embedded etcd: TLS needs a certificate and its key");
        st = GRAFT_EINVAL;
        goto err_server;
    }
    if ((opts->cert_file && (s->cert_file = graft__strdup(opts->cert_file)) == NULL) ||
        (opts->key_file && (s->key_file = graft__strdup(opts->key_file)) == NULL) ||
        (opts->trusted_ca_file && (s->ca_file = graft__strdup(opts->trusted_ca_file)) == NULL))
        goto err_server;
    const char *tmp = getenv("TMPDIR");
    s->work_dir = graft__asprintf("%s/graft-etcd-XXXXXX", tmp && tmp[0] ? tmp : "/tmp");
    if (s->work_dir == NULL)
        goto err_server;
    if (mkdtemp(s->work_dir) == NULL) {
        GRAFT_ERROR(GRAFT_MOD_ETCD, "mkdtemp %s: %s", s->work_dir, strerror(errno));
        graft_free(s->work_dir);
        s->work_dir = NULL;
        st = GRAFT_ESYS;
        goto err_server;
    }
    s->data_dir = opts->data_dir ? graft__strdup(opts->data_dir)
                                 : graft__asprintf("%s/data", s->work_dir);
    s->log_path = graft__asprintf("%s/etcd.log", s->work_dir);
    if (s->data_dir == NULL || s->log_path == NULL)
        goto err_server;
    st = GRAFT_OK;
    for (int tries = 0; tries < 16 && st == GRAFT_OK; tries++) {
        s->client_port = free_port(&st);
        if (st == GRAFT_OK && !port_taken(s->client_port, used, *n_used))
            break;
        s->client_port = -1;
    }
    if (s->client_port > 0)
        used[(*n_used)++] = s->client_port;
    for (int tries = 0; tries < 16 && st == GRAFT_OK && s->client_port > 0; tries++) {
        s->peer_port = free_port(&st);
        if (st == GRAFT_OK && !port_taken(s->peer_port, used, *n_used))
            break;
        s->peer_port = -1;
    }
    if (st != GRAFT_OK || s->client_port <= 0 || s->peer_port <= 0) {
        GRAFT_ERROR(GRAFT_MOD_ETCD, "embedded etcd: no free loopback port");
        st = GRAFT_ESYS;
        goto err_server;
    }
    used[(*n_used)++] = s->peer_port;
    s->endpoint = graft__asprintf("%s://127.0.0.1:%d", s->cert_file ? "https" : "http",
                                  s->client_port);
    if (s->endpoint == NULL) {
        st = GRAFT_ENOMEM;
        goto err_server;
    }
    *server_p = s;
    return GRAFT_OK;

err_server:
    graft_etcd_server_destroy(s);
out:
    return st;
}

graft_status_t graft_etcd_server_start(const graft_etcd_server_opts_t *opts,
                                       graft_etcd_server_t **server_p)
{
    static const graft_etcd_server_opts_t defaults = {0};
    graft_etcd_server_t *s = NULL;
    int used[2];
    size_t n_used = 0;

    if (server_p == NULL)
        return GRAFT_EINVAL;
    graft_status_t st = graft__etcd_curl_init();
    if (st != GRAFT_OK)
        return st;
    st = server_new(opts != NULL ? opts : &defaults, "default", used, &n_used, &s);
    if (st != GRAFT_OK)
        return st;
    st = launch(s);
    if (st != GRAFT_OK) {
        graft_etcd_server_destroy(s);
        return st;
    }
    GRAFT_INFO(GRAFT_MOD_ETCD, "embedded etcd pid %d on %s, data %s", (int)s->pid, s->endpoint,
               s->data_dir);
    *server_p = s;
    return GRAFT_OK;
}

const char *graft_etcd_server_endpoint(const graft_etcd_server_t *server)
{
    return server ? server->endpoint : "";
}

const char *graft_etcd_server_data_dir(const graft_etcd_server_t *server)
{
    return server ? server->data_dir : "";
}

const char *graft_etcd_server_log_path(const graft_etcd_server_t *server)
{
    return server ? server->log_path : NULL;
}

int graft_etcd_server_pid(const graft_etcd_server_t *server)
{
    return server ? (int)server->pid : -1;
}

graft_status_t graft_etcd_server_stop(graft_etcd_server_t *server)
{
    if (server == NULL)
        return GRAFT_EINVAL;
    if (server->pid <= 0)
        return GRAFT_OK;
    pid_t pid = server->pid;
    if (kill(pid, SIGTERM) != 0 && errno != ESRCH) {
        GRAFT_ERROR(GRAFT_MOD_ETCD, "kill %d: %s", (int)pid, strerror(errno));
        return GRAFT_ESYS;
    }
    /* etcd shuts down in well under a second; do not let a wedged one
     * hold a test up. */
    uint64_t deadline = graft__now_ns() + 5000ull * 1000000ull;
    for (;;) {
        int wst;
        pid_t w = waitpid(pid, &wst, WNOHANG);
        if (w == pid || (w < 0 && errno == ECHILD))
            break;
        if (w < 0 && errno != EINTR) {
            GRAFT_ERROR(GRAFT_MOD_ETCD, "waitpid %d: %s", (int)pid, strerror(errno));
            return GRAFT_ESYS;
        }
        if (graft__now_ns() > deadline) {
            GRAFT_WARN(GRAFT_MOD_ETCD, "etcd pid %d ignored SIGTERM; killing it", (int)pid);
            kill(pid, SIGKILL);
            while (waitpid(pid, &wst, 0) < 0 && errno == EINTR) {
            }
            break;
        }
        graft__sleep_ns(5 * 1000000ull);
    }
    server->pid = -1;
    return GRAFT_OK;
}

graft_status_t graft_etcd_server_kill(graft_etcd_server_t *server)
{
    if (server == NULL)
        return GRAFT_EINVAL;
    if (server->pid <= 0)
        return GRAFT_OK;
    pid_t pid = server->pid;
    if (kill(pid, SIGKILL) != 0 && errno != ESRCH) {
        GRAFT_ERROR(GRAFT_MOD_ETCD, "kill %d: %s", (int)pid, strerror(errno));
        return GRAFT_ESYS;
    }
    int wst;
    while (waitpid(pid, &wst, 0) < 0 && errno == EINTR) {
    }
    server->pid = -1;
    return GRAFT_OK;
}

graft_status_t graft_etcd_server_restart(graft_etcd_server_t *server)
{
    if (server == NULL)
        return GRAFT_EINVAL;
    if (server->pid > 0)
        return GRAFT_ESTATE;
    return launch(server);
}

void graft_etcd_server_destroy(graft_etcd_server_t *server)
{
    if (server == NULL)
        return;
    if (graft_etcd_server_stop(server) != GRAFT_OK)
        GRAFT_WARN(GRAFT_MOD_ETCD, "etcd: stop failed during destroy");
    remove_tree(server->work_dir);
    graft_free(server->work_dir);
    graft_free(server->data_dir);
    graft_free(server->log_path);
    graft_free(server->endpoint);
    graft_free(server->binary);
    graft_free(server->cert_file);
    graft_free(server->key_file);
    graft_free(server->ca_file);
    graft_free(server->name);
    graft_free(server->initial_cluster);
    graft_free(server->cluster_token);
    for (size_t i = 0; i < server->n_extra && server->extra_args; i++)
        graft_free(server->extra_args[i]);
    graft_free(server->extra_args);
    graft_free(server);
}

/* ------------------------------------------------------------------------ */
/* Clusters                                                                 */
/* ------------------------------------------------------------------------ */

/* etcd's own advice is an odd size up to 7; more is pointless on one host. */
#define CLUSTER_MAX_MEMBERS 9

/* Tell every member who its peers are, and list the client URLs. */
static graft_status_t cluster_wire(graft_etcd_cluster_t *c)
{
    graft_buf_t peers = {0}, clients = {0};
    graft_status_t st = GRAFT_OK;
    for (size_t i = 0; i < c->n_members && st == GRAFT_OK; i++) {
        const graft_etcd_server_t *m = c->members[i];
        if (graft__buf_printf(&peers, "%s%s=http://127.0.0.1:%d", i ? "," : "", m->name,
                              m->peer_port) != GRAFT_OK ||
            graft__buf_printf(&clients, "%s%s", i ? "," : "", m->endpoint) != GRAFT_OK)
            st = GRAFT_ENOMEM;
    }
    char *token = graft__asprintf("graft-%d-%d", (int)getpid(), c->members[0]->peer_port);
    if (token == NULL)
        st = GRAFT_ENOMEM;
    for (size_t i = 0; i < c->n_members && st == GRAFT_OK; i++) {
        graft_etcd_server_t *m = c->members[i];
        m->initial_cluster = graft__strndup(peers.data, peers.len);
        m->cluster_token = graft__strdup(token);
        if (m->initial_cluster == NULL || m->cluster_token == NULL)
            st = GRAFT_ENOMEM;
    }
    if (st == GRAFT_OK) {
        c->endpoints = graft__strndup(clients.data, clients.len);
        if (c->endpoints == NULL)
            st = GRAFT_ENOMEM;
    }
    graft_free(token);
    graft__buf_free(&peers);
    graft__buf_free(&clients);
    return st;
}

graft_status_t graft_etcd_cluster_start(const graft_etcd_server_opts_t *opts, size_t n_members,
                                        graft_etcd_cluster_t **cluster_p)
{
    static const graft_etcd_server_opts_t defaults = {0};
    graft_status_t st = GRAFT_EINVAL;
    graft_etcd_cluster_t *c = NULL;
    int used[2 * CLUSTER_MAX_MEMBERS];
    size_t n_used = 0;

    if (opts == NULL)
        opts = &defaults;
    if (cluster_p == NULL || n_members == 0 || n_members > CLUSTER_MAX_MEMBERS ||
        (n_members > 1 && opts->data_dir != NULL)) {
        GRAFT_ERROR(GRAFT_MOD_ETCD, "embedded etcd cluster: 1 to %d members, and a data "
                    "directory of its own for each", CLUSTER_MAX_MEMBERS);
        goto out;
    }
    st = graft__etcd_curl_init();
    if (st != GRAFT_OK)
        goto out;
    st = GRAFT_ENOMEM;
    c = graft__calloc(1, sizeof(*c));
    if (c == NULL)
        goto out;
    c->members = graft__calloc(n_members, sizeof(*c->members));
    if (c->members == NULL)
        goto err_cluster;
    for (size_t i = 0; i < n_members; i++) {
        char name[24];
        if (n_members == 1)
            snprintf(name, sizeof(name), "default");
        else
            snprintf(name, sizeof(name), "m%zu", i);
        st = server_new(opts, name, used, &n_used, &c->members[i]);
        if (st != GRAFT_OK)
            goto err_cluster;
        c->n_members++;
    }
    st = cluster_wire(c);
    if (st != GRAFT_OK)
        goto err_cluster;
    /* A member is healthy only once a quorum elected a leader: start them
     * all, then wait for each. */
    for (size_t i = 0; i < n_members; i++) {
        st = spawn(c->members[i]);
        if (st != GRAFT_OK)
            goto err_cluster;
    }
    for (size_t i = 0; i < n_members; i++) {
        st = wait_healthy(c->members[i]);
        if (st != GRAFT_OK)
            goto err_cluster;
    }
    GRAFT_INFO(GRAFT_MOD_ETCD, "embedded etcd cluster of %zu on %s", n_members, c->endpoints);
    *cluster_p = c;
    return GRAFT_OK;

err_cluster:
    graft_etcd_cluster_destroy(c);
out:
    return st;
}

size_t graft_etcd_cluster_size(const graft_etcd_cluster_t *cluster)
{
    return cluster ? cluster->n_members : 0;
}

graft_etcd_server_t *graft_etcd_cluster_member(graft_etcd_cluster_t *cluster, size_t index)
{
    if (cluster == NULL || index >= cluster->n_members)
        return NULL;
    return cluster->members[index];
}

const char *graft_etcd_cluster_endpoints(const graft_etcd_cluster_t *cluster)
{
    return cluster && cluster->endpoints ? cluster->endpoints : "";
}

/* Status of one member, asked of that member alone. */
static graft_status_t member_status(const graft_etcd_server_t *m,
                                    graft_etcd_member_status_t *status_p)
{
    const char *ep = m->endpoint;
    graft_etcd_config_t cfg = {
        .endpoints = &ep,
        .n_endpoints = 1,
        .request_timeout_ms = 1000,
        .connect_timeout_ms = 200,
        .max_retries = GRAFT_ETCD_NO_RETRIES,
        /* The server's own pair doubles as the client identity, as in the
         * start-up health check. */
        .ca_file = m->ca_file,
        .cert_file = m->cert_file,
        .key_file = m->key_file,
    };
    graft_etcd_t *etcd = NULL;
    graft_status_t st = graft_etcd_create(&cfg, &etcd);
    if (st != GRAFT_OK)
        return st;
    st = graft_etcd_member_status(etcd, status_p);
    graft_etcd_destroy(etcd);
    return st;
}

graft_status_t graft_etcd_cluster_leader(graft_etcd_cluster_t *cluster, size_t *index_p)
{
    if (cluster == NULL || index_p == NULL)
        return GRAFT_EINVAL;
    for (size_t i = 0; i < cluster->n_members; i++) {
        graft_etcd_server_t *m = cluster->members[i];
        graft_etcd_member_status_t ms;
        if (m->pid <= 0 || member_status(m, &ms) != GRAFT_OK)
            continue;
        /* Each member names the leader it follows; the leader names itself. */
        if (ms.leader_id != 0 && ms.leader_id == ms.member_id) {
            *index_p = i;
            return GRAFT_OK;
        }
    }
    return GRAFT_ENOTFOUND;
}

void graft_etcd_cluster_destroy(graft_etcd_cluster_t *cluster)
{
    if (cluster == NULL)
        return;
    /* Stop every member before removing any directory, so no member logs
     * a lost peer into a directory being removed. */
    for (size_t i = 0; i < cluster->n_members; i++)
        if (graft_etcd_server_stop(cluster->members[i]) != GRAFT_OK)
            GRAFT_WARN(GRAFT_MOD_ETCD, "etcd: stop of member %zu failed", i);
    for (size_t i = 0; i < cluster->n_members; i++)
        graft_etcd_server_destroy(cluster->members[i]);
    graft_free(cluster->members);
    graft_free(cluster->endpoints);
    graft_free(cluster);
}
