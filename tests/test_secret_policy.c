/*
 * The job secret and the etcd password where they belong (docs/SECURITY.md,
 * "The job secret" and "etcd credentials"):
 *
 *  - the job keeps its secret in etcd only over https with authentication
 *    or on loopback: graft_init() against a real etcd reached by plain http
 *    at a non-loopback address of this host (a relay on that address to
 *    the test's etcd) fails with GRAFT_EINVAL and says how to give a
 *    secret, and no secret record is made; with a secret file it starts;
 *  - GRAFT_JOB_SECRET is gone from the environment once graft_init() read
 *    it, so a child process does not inherit it;
 *  - graft_config_get() never returns the etcd password;
 *  - a password over plain http is warned about, once;
 *  - graftctl takes the password from a file or the environment, and warns
 *    when it is given on the command line.
 */
#include "graftctl_fixture.h"

#include <arpa/inet.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <sys/socket.h>

#include <graft/graft.h>

#include "graft_internal.h"

#define SECRET "a-secret-of-thirty-two-bytes-ok!"

/* ------------------------------------------------------------ the log --- */

static pthread_mutex_t log_lock = PTHREAD_MUTEX_INITIALIZER;
static char log_text[16384];

static void log_sink(graft_log_level_t level, const char *module, const char *message, void *arg)
{
    (void)level;
    (void)module;
    (void)arg;
    pthread_mutex_lock(&log_lock);
    size_t n = strlen(log_text);
    snprintf(log_text + n, sizeof(log_text) - n, "%s\n", message);
    pthread_mutex_unlock(&log_lock);
}

static void log_capture(void)
{
    pthread_mutex_lock(&log_lock);
    log_text[0] = '\0';
    pthread_mutex_unlock(&log_lock);
    graft_log_level_set(GRAFT_LOG_WARN);
    graft_log_sink_set(log_sink, NULL);
}

static int log_count(const char *what)
{
    int n = 0;
    pthread_mutex_lock(&log_lock);
    for (const char *p = strstr(log_text, what); p != NULL; p = strstr(p + 1, what))
        n++;
    if (n == 0)
        print_message("# log: %s\n", log_text);
    pthread_mutex_unlock(&log_lock);
    return n;
}

static void log_release(void)
{
    graft_log_sink_set(NULL, NULL);
}

/* ------------------------------------------- a non-loopback address --- */

/* This host's first IPv4 address that is not loopback, on an interface that
 * is up; else one of a dummy interface made for the test (needs
 * CAP_NET_ADMIN). */
static bool dummy_made;

static bool host_address(char *buf, size_t len)
{
    struct ifaddrs *ifs = NULL;
    bool found = false;
    for (int pass = 0; pass < 2 && !found; pass++) {
        if (pass == 1) {
            if (system("ip link add graftsp0 type dummy 2>/dev/null && "
                       "ip addr add 198.51.100.77/32 dev graftsp0 && "
                       "ip link set graftsp0 up") != 0)
                return false;
            dummy_made = true;
        }
        if (getifaddrs(&ifs) != 0)
            return false;
        for (struct ifaddrs *i = ifs; i != NULL && !found; i = i->ifa_next) {
            if (i->ifa_addr == NULL || i->ifa_addr->sa_family != AF_INET ||
                (i->ifa_flags & IFF_UP) == 0 || (i->ifa_flags & IFF_LOOPBACK) != 0)
                continue;
            const struct sockaddr_in *a = (const struct sockaddr_in *)i->ifa_addr;
            if ((ntohl(a->sin_addr.s_addr) >> 24) == 127)
                continue;
            found = inet_ntop(AF_INET, &a->sin_addr, buf, (socklen_t)len) != NULL;
        }
        freeifaddrs(ifs);
    }
    return found;
}

/* A relay: connections to addr:port (a free port) go on to the etcd on
 * loopback, byte for byte. */
typedef struct relay {
    int lfd;
    int port;
    struct sockaddr_in upstream;
    atomic_int accepted;
    pthread_t thread;
} relay_t;

static relay_t relay;

static void *pipe_main(void *p)
{
    int *fds = p;
    struct pollfd pf[2] = {{fds[0], POLLIN, 0}, {fds[1], POLLIN, 0}};
    char buf[16384];
    for (;;) {
        if (poll(pf, 2, -1) < 0 && errno != EINTR)
            break;
        bool done = false;
        for (int k = 0; k < 2 && !done; k++) {
            if ((pf[k].revents & (POLLIN | POLLHUP | POLLERR)) == 0)
                continue;
            ssize_t n = read(pf[k].fd, buf, sizeof(buf));
            done = n <= 0 || write(pf[1 - k].fd, buf, (size_t)n) != n;
        }
        if (done)
            break;
    }
    close(fds[0]);
    close(fds[1]);
    free(fds);
    return NULL;
}

static void *relay_main(void *p)
{
    relay_t *r = p;
    for (;;) {
        int c = accept(r->lfd, NULL, NULL);
        if (c < 0)
            return NULL; /* closed at teardown */
        int u = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
        if (u < 0 || connect(u, (struct sockaddr *)&r->upstream, sizeof(r->upstream)) != 0) {
            close(c);
            if (u >= 0)
                close(u);
            continue;
        }
        atomic_fetch_add(&r->accepted, 1);
        int *fds = malloc(2 * sizeof(int));
        pthread_t t;
        fds[0] = c;
        fds[1] = u;
        if (pthread_create(&t, NULL, pipe_main, fds) == 0)
            pthread_detach(t);
    }
}

static bool relay_start(const char *addr, int upstream_port)
{
    struct sockaddr_in a = {.sin_family = AF_INET};
    socklen_t alen = sizeof(a);
    relay.lfd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (relay.lfd < 0 || inet_pton(AF_INET, addr, &a.sin_addr) != 1 ||
        bind(relay.lfd, (struct sockaddr *)&a, sizeof(a)) != 0 || listen(relay.lfd, 64) != 0 ||
        getsockname(relay.lfd, (struct sockaddr *)&a, &alen) != 0)
        return false;
    relay.port = ntohs(a.sin_port);
    relay.upstream = (struct sockaddr_in){.sin_family = AF_INET,
                                          .sin_port = htons((uint16_t)upstream_port)};
    relay.upstream.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    return pthread_create(&relay.thread, NULL, relay_main, &relay) == 0;
}

static char host_addr[64];
static char far_endpoint[128]; /* http://<host address>:<relay port> */
static const char *skip_reason;

static int setup(void **state)
{
    if (gc_setup(state) != 0)
        return -1;
    unsetenv("GRAFT_JOB_SECRET");
    unsetenv("GRAFT_JOB_SECRET_FILE");
    const char *port = strrchr(gc_endpoint, ':');
    if (!host_address(host_addr, sizeof(host_addr)))
        skip_reason = "no non-loopback IPv4 address on this host, and no dummy interface allowed";
    else if (!relay_start(host_addr, atoi(port + 1)))
        skip_reason = "cannot listen on this host's non-loopback address";
    else
        snprintf(far_endpoint, sizeof(far_endpoint), "http://%s:%d", host_addr, relay.port);
    return 0;
}

static int teardown(void **state)
{
    if (relay.lfd > 0) {
        shutdown(relay.lfd, SHUT_RDWR);
        close(relay.lfd);
        pthread_join(relay.thread, NULL);
    }
    if (dummy_made && system("ip link del graftsp0") != 0)
        fprintf(stderr, "could not remove the dummy interface graftsp0\n");
    return gc_teardown(state);
}

static graft_config_t *job_config(const char *job, const char *endpoints)
{
    graft_config_t *c = NULL;
    assert_int_equal(graft_config_create(&c), GRAFT_OK);
    assert_int_equal(graft_config_set(c, "job", job, NULL), GRAFT_OK);
    assert_int_equal(graft_config_set(c, "groups", "2", NULL), GRAFT_OK);
    assert_int_equal(graft_config_set(c, "group", "0", NULL), GRAFT_OK);
    assert_int_equal(graft_config_set(c, "etcd_endpoints", endpoints, NULL), GRAFT_OK);
    assert_int_equal(graft_config_set(c, "lease_ttl_ms", "2000", NULL), GRAFT_OK);
    assert_int_equal(graft_config_set(c, "join_timeout_ms", "1000", NULL), GRAFT_OK);
    assert_int_equal(graft_config_set(c, "quorum_timeout_ms", "3000", NULL), GRAFT_OK);
    return c;
}

/* How many keys the job's secret record has in etcd (0 or 1). */
static int64_t secret_keys(const char *job)
{
    char key[128];
    graft_etcd_range_result_t res = {0};
    graft_etcd_range_opts_t o = {.count_only = true};
    snprintf(key, sizeof(key), "/graft/%s/secret", job);
    assert_int_equal(graft_etcd_range(gc_etcd.client, key, &o, &res), GRAFT_OK);
    int64_t n = res.count;
    graft_etcd_range_result_clear(&res);
    return n;
}

/* ------------------------------------------------------------ tests --- */

static void test_endpoint_policy(void **state)
{
    (void)state;
    static const struct {
        const char *url;
        bool loopback;
    } cases[] = {
        {"http://127.0.0.1:2379", true},    {"http://127.8.9.10", true},
        {"https://localhost:2379/", true},  {"http://LOCALHOST:1", true},
        {"http://[::1]:2379", true},        {"http://[::ffff:127.0.0.1]:2379", true},
        {"http://u:p@127.0.0.1:2379", true}, {"http://10.0.0.1:2379", false},
        {"http://128.0.0.1:2379", false},   {"http://localhost.example.com", false},
        {"http://[::2]:2379", false},       {"http://etcd:2379", false},
        {"http://", false},                 {"127.0.0.1:2379", false},
        {"http://[::1", false},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        if (graft_etcd_endpoint_is_loopback(cases[i].url) != cases[i].loopback)
            print_error("%s\n", cases[i].url);
        assert_int_equal(graft_etcd_endpoint_is_loopback(cases[i].url), cases[i].loopback);
    }
    assert_false(graft_etcd_endpoint_is_loopback(NULL));

    const char *lo[] = {"http://127.0.0.1:2379", "http://[::1]:2379"};
    const char *mixed[] = {"http://127.0.0.1:2379", "http://10.1.2.3:2379"};
    const char *tls[] = {"https://10.1.2.3:2379", "https://etcd.example:2379"};
    const char *first = NULL, *why = NULL;
    graft_etcd_config_t c = {.endpoints = lo, .n_endpoints = 2};
    assert_true(graft_etcd_config_is_private(&c, &first, &why));
    c.endpoints = mixed; /* every endpoint counts */
    assert_false(graft_etcd_config_is_private(&c, &first, &why));
    assert_string_equal(first, "http://10.1.2.3:2379");
    assert_non_null(strstr(why, "in clear"));
    c.username = "job"; /* a password does not make plain http private */
    c.password = "pw";
    assert_false(graft_etcd_config_is_private(&c, NULL, NULL));
    c = (graft_etcd_config_t){.endpoints = tls, .n_endpoints = 2};
    assert_false(graft_etcd_config_is_private(&c, &first, &why));
    assert_string_equal(first, "https://10.1.2.3:2379");
    assert_non_null(strstr(why, "without authentication"));
    c.username = "job";
    c.password = "pw";
    assert_true(graft_etcd_config_is_private(&c, NULL, NULL));
    c.username = c.password = NULL;
    c.cert_file = "client.crt";
    c.key_file = "client.key";
    assert_true(graft_etcd_config_is_private(&c, NULL, NULL));
}

/* The refusal through graft_init(), against an etcd that answers at that
 * address (so the refusal is the policy's, not an unreachable etcd's). */
static void test_secret_refused_over_plain_http(void **state)
{
    (void)state;
    if (skip_reason != NULL) {
        print_message("skipped: %s\n", skip_reason);
        skip();
    }
    const char *job = "secret-far";
    graft_etcd_t *far = graft_test_etcd_client((const char *const[]){far_endpoint}, 1, NULL,
                                               NULL);
    assert_non_null(far);
    assert_int_equal(graft_etcd_put(far, "/graft/secret-far/probe", "1", 1, 0, NULL, NULL),
                     GRAFT_OK);
    graft_etcd_destroy(far);
    assert_true(atomic_load(&relay.accepted) > 0);

    graft_config_t *c = job_config(job, far_endpoint);
    graft_runtime_t *rt = NULL;
    log_capture();
    assert_int_equal(graft_init(c, &rt), GRAFT_EINVAL);
    assert_null(rt);
    assert_int_equal(log_count("job_secret_file (GRAFT_JOB_SECRET_FILE)"), 1);
    assert_int_equal(log_count("GRAFT_JOB_SECRET;"), 1);
    assert_int_equal(log_count("would cross the network in clear"), 1);
    assert_int_equal(log_count(far_endpoint), 1);
    log_release();
    assert_int_equal(secret_keys(job), 0);

    /* https without a user or certificate: refused too (before any
     * connection is made, so no TLS server is needed to show it). */
    char tls_endpoint[160];
    snprintf(tls_endpoint, sizeof(tls_endpoint), "https://%s:%d", host_addr, relay.port);
    graft_config_t *ct = job_config(job, tls_endpoint);
    log_capture();
    assert_int_equal(graft_init(ct, &rt), GRAFT_EINVAL);
    assert_int_equal(log_count("https without authentication"), 1);
    log_release();
    graft_config_destroy(ct);

    /* Given a secret, the same process starts over the same endpoint. */
    char path[PATH_MAX + 32];
    snprintf(path, sizeof(path), "%s/secret", gc_tmpdir);
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    fputs(SECRET "\n", f);
    fclose(f);
    assert_int_equal(chmod(path, 0600), 0);
    assert_int_equal(graft_config_set(c, "job_secret_file", path, NULL), GRAFT_OK);
    assert_int_equal(graft_init(c, &rt), GRAFT_OK);
    graft_destroy(rt);
    assert_int_equal(secret_keys(job), 0);
    graft_config_destroy(c);
}

/* On loopback the job keeps its secret in etcd, as before. */
static void test_secret_kept_on_loopback(void **state)
{
    (void)state;
    graft_config_t *c = job_config("secret-near", gc_endpoint);
    graft_runtime_t *rt = NULL;
    assert_int_equal(graft_init(c, &rt), GRAFT_OK);
    graft_destroy(rt);
    graft_config_destroy(c);
    assert_int_equal(secret_keys("secret-near"), 1);
}

static void test_env_secret_unset_after_init(void **state)
{
    (void)state;
    graft_config_t *c = job_config("secret-env", gc_endpoint);
    graft_runtime_t *rt = NULL;
    assert_int_equal(setenv("GRAFT_JOB_SECRET", SECRET, 1), 0);
    assert_int_equal(graft_init(c, &rt), GRAFT_OK);
    assert_null(getenv("GRAFT_JOB_SECRET"));
    /* a child of this process does not have it */
    assert_int_equal(system("test -z \"${GRAFT_JOB_SECRET+set}\""), 0);
    graft_destroy(rt);
    assert_int_equal(secret_keys("secret-env"), 0); /* the variable's, not etcd's */
    /* also when graft_init() refuses it (too short) */
    assert_int_equal(setenv("GRAFT_JOB_SECRET", "too-short", 1), 0);
    assert_int_equal(graft_init(c, &rt), GRAFT_EINVAL);
    assert_null(getenv("GRAFT_JOB_SECRET"));
    graft_config_destroy(c);
}

static void test_password_not_returned(void **state)
{
    (void)state;
    graft_config_t *c = NULL;
    char *v = NULL;
    assert_int_equal(graft_config_create(&c), GRAFT_OK);
    assert_int_equal(graft_config_get(c, "etcd_password", &v), GRAFT_OK);
    assert_string_equal(v, "");
    graft_free(v);
    assert_int_equal(graft_config_set(c, "etcd_user", "job", NULL), GRAFT_OK);
    assert_int_equal(graft_config_set(c, "etcd_password", "hunter2-pw", NULL), GRAFT_OK);
    assert_int_equal(graft_config_get(c, "etcd_password", &v), GRAFT_OK);
    assert_string_equal(v, GRAFT_CONFIG_REDACTED);
    assert_null(strstr(v, "hunter2"));
    graft_free(v);
    assert_int_equal(graft_config_get(c, "etcd_user", &v), GRAFT_OK);
    assert_string_equal(v, "job");
    graft_free(v);
    graft_config_destroy(c);
}

/* Once per process, and not for loopback or https. */
static void test_password_over_http_warned(void **state)
{
    (void)state;
    const char *near[] = {gc_endpoint};
    const char *tls[] = {"https://10.9.8.7:2379"};
    const char *far[] = {"http://127.0.0.1:2379", "http://10.9.8.7:2379"};
    graft_etcd_config_t ec = {.endpoints = near, .n_endpoints = 1, .username = "u",
                              .password = "pw-in-clear"};
    graft_etcd_t *e = NULL;
    log_capture();
    assert_int_equal(graft_etcd_create(&ec, &e), GRAFT_OK);
    graft_etcd_destroy(e);
    ec.endpoints = tls;
    assert_int_equal(graft_etcd_create(&ec, &e), GRAFT_OK);
    graft_etcd_destroy(e);
    pthread_mutex_lock(&log_lock);
    assert_null(strstr(log_text, "plain http"));
    pthread_mutex_unlock(&log_lock);
    ec.endpoints = far;
    ec.n_endpoints = 2;
    for (int i = 0; i < 3; i++) {
        assert_int_equal(graft_etcd_create(&ec, &e), GRAFT_OK);
        graft_etcd_destroy(e);
    }
    assert_int_equal(log_count("etcd password for user 'u' goes over plain http to "
                               "http://10.9.8.7:2379"), 1);
    assert_int_equal(log_count("pw-in-clear"), 0);
    log_release();
}

/* graftctl against an etcd with users on: the password from a file, from
 * the environment, or (with a warning) from the command line. */
static void test_graftctl_password_sources(void **state)
{
    (void)state;
    graft_test_etcd_t auth;
    static const char *const args[] = {"--auth-token=simple", "--bcrypt-cost=4", NULL};
    assert_int_equal(graft_test_etcd_start(&auth, args), 0);
    const char *ep = graft_etcd_server_endpoint(auth.server);
    const char *ctl[][5] = {{"user", "add", "root:rootpw"}, {"user", "grant-role", "root", "root"},
                            {"auth", "enable"}};
    const char *role[] = {"role", "add", "root", NULL};
    (void)graft_test_etcdctl(ep, NULL, 0, role); /* may exist already */
    for (size_t i = 0; i < 3; i++)
        assert_int_equal(graft_test_etcdctl(ep, NULL, 0, ctl[i]), 0);
    char good[PATH_MAX + 32], open_file[PATH_MAX + 32], wrong[PATH_MAX + 32];
    snprintf(good, sizeof(good), "%s/pw", gc_tmpdir);
    snprintf(open_file, sizeof(open_file), "%s/pw-open", gc_tmpdir);
    snprintf(wrong, sizeof(wrong), "%s/pw-wrong", gc_tmpdir);
    gc_sh("printf 'rootpw\\n' > '%s' && chmod 600 '%s'", good, good);
    gc_sh("printf 'rootpw\\n' > '%s' && chmod 644 '%s'", open_file, open_file);
    gc_sh("printf 'nope\\n' > '%s' && chmod 600 '%s'", wrong, wrong);
    char *out = NULL, *err = NULL;
    /* Authenticated: the job is unknown (no keys), which etcd only says to
     * a user it let in. */
    const char *from_file[] = {"--etcd", ep, "--job", "nojob", "--user", "root",
                               "--password-file", good, "status", NULL};
    assert_int_equal(gc_run_ctl(from_file, &out, &err), 1);
    assert_non_null(strstr(err, "unknown job 'nojob'"));
    assert_null(strstr(err, "warning"));
    free(out);
    free(err);
    const char *from_wrong[] = {"--etcd", ep, "--job", "nojob", "--user", "root",
                                "--password-file", wrong, "status", NULL};
    assert_int_equal(gc_run_ctl(from_wrong, &out, &err), 1);
    assert_non_null(strstr(err, "check --user and --password"));
    free(out);
    free(err);
    const char *from_open[] = {"--etcd", ep, "--job", "nojob", "--user", "root",
                               "--password-file", open_file, "status", NULL};
    assert_int_equal(gc_run_ctl(from_open, &out, &err), 1);
    assert_non_null(strstr(err, "lets group or others read"));
    free(out);
    free(err);
    const char *on_line[] = {"--etcd", ep, "--job", "nojob", "--user", "root",
                             "--password", "rootpw", "status", NULL};
    assert_int_equal(gc_run_ctl(on_line, &out, &err), 1);
    assert_non_null(strstr(err, "visible to every user of this host"));
    assert_non_null(strstr(err, "unknown job 'nojob'"));
    free(out);
    free(err);
    /* The environment: GRAFT_ETCD_PASSWORD_FILE, then GRAFT_ETCD_PASSWORD. */
    const char *bare[] = {"--etcd", ep, "--job", "nojob", "--user", "root", "status", NULL};
    assert_int_equal(setenv("GRAFT_ETCD_PASSWORD_FILE", good, 1), 0);
    assert_int_equal(gc_run_ctl(bare, &out, &err), 1);
    assert_non_null(strstr(err, "unknown job 'nojob'"));
    free(out);
    free(err);
    unsetenv("GRAFT_ETCD_PASSWORD_FILE");
    assert_int_equal(setenv("GRAFT_ETCD_PASSWORD", "rootpw", 1), 0);
    assert_int_equal(gc_run_ctl(bare, &out, &err), 1);
    assert_non_null(strstr(err, "unknown job 'nojob'"));
    assert_null(strstr(err, "warning"));
    free(out);
    free(err);
    unsetenv("GRAFT_ETCD_PASSWORD");

    /* Given on the command line, the password is wiped from graftctl's
     * arguments once read: a running graftctl's cmdline (what ps shows)
     * no longer has it. */
    graft_etcd_t *root = graft_test_etcd_client(&ep, 1, "root", "rootpw");
    assert_non_null(root);
    assert_int_equal(graft_etcd_put(root, "/graft/pwjob/x", "1", 1, 0, NULL, NULL), GRAFT_OK);
    graft_etcd_destroy(root);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        int null = open("/dev/null", O_RDWR);
        dup2(null, 0);
        dup2(null, 1);
        dup2(null, 2);
        execl(gc_ctl_bin, gc_ctl_bin, "--etcd", ep, "--job", "pwjob", "--user", "root",
              "--password", "rootpw", "watch", "--interval-ms", "100", "--count", "100",
              (char *)NULL);
        _exit(127);
    }
    char cmdline_path[64], *cmdline = NULL;
    snprintf(cmdline_path, sizeof(cmdline_path), "/proc/%d/cmdline", (int)pid);
    bool wiped = false;
    for (int tries = 0; tries < 100 && !wiped; tries++) {
        gc_sleep_ms(50);
        FILE *f = fopen(cmdline_path, "r");
        assert_non_null(f);
        char raw[1024];
        size_t n = fread(raw, 1, sizeof(raw) - 1, f);
        fclose(f);
        for (size_t k = 0; k < n; k++)
            raw[k] = raw[k] == '\0' ? ' ' : raw[k];
        raw[n] = '\0';
        free(cmdline);
        cmdline = strdup(raw);
        wiped = strstr(raw, "--password xxxxxx watch") != NULL;
    }
    if (!wiped)
        print_error("cmdline: %s\n", cmdline);
    assert_true(wiped);
    assert_null(strstr(cmdline, "rootpw"));
    free(cmdline);
    kill(pid, SIGTERM);
    waitpid(pid, NULL, 0);
    graft_test_etcd_stop(&auth);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_endpoint_policy),
        cmocka_unit_test(test_secret_refused_over_plain_http),
        cmocka_unit_test(test_secret_kept_on_loopback),
        cmocka_unit_test(test_env_secret_unset_after_init),
        cmocka_unit_test(test_password_not_returned),
        cmocka_unit_test(test_password_over_http_warned),
        cmocka_unit_test(test_graftctl_password_sources),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
