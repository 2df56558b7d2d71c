/*
 * etcd that does not keep up (issue 25): the client's retry budget, and a
 * job of real processes through an etcd stopped (SIGSTOP) for 5 s.
 *
 * - In one process: clients of one load against a stopped etcd. The first
 *   request that gets no answer makes etcd "slow"; a best-effort client's
 *   requests are then shed without being sent, an essential client's are
 *   paced to its share (burst 4, then 4 a second), and the first answer in
 *   time ends it (docs/ETCD.md, "When etcd is slow").
 * - A job of OVERLOAD_GROUPS groups of one rank (examples/train_mlp) whose
 *   every etcd request passes through a counting proxy in this program:
 *   etcd is stopped for 5 s mid-run. No rank commits once its lease may
 *   have expired (5/6 of the 2 s TTL after the last renewal), every rank
 *   commits again within 10 s of SIGCONT, and the requests that reached the
 *   proxy while etcd was stopped are printed and stay within the budget.
 * - The same job while etcd gets a quarter of its time for 5 s (stopped
 *   150 ms of every 200 ms): the requests, printed, stay within the
 *   budget, and every rank commits within 10 s of the end.
 */
#include "test_runtime_procs.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>
#include <sys/socket.h>

/* Groups of the job (OVERLOAD_GROUPS overrides): 16 ran in about 20 s on
 * the 2-core machine this was written on, beside other builds. */
#define OVERLOAD_GROUPS_DEFAULT 16
#define GRAFT_TEST_MIN(a, b) ((a) < (b) ? (a) : (b))
#define GRAFT_TEST_MAX(a, b) ((a) > (b) ? (a) : (b))

/* ---------------------------------------------------- the counting proxy --- */

static atomic_uint_fast64_t proxy_requests;
static atomic_bool proxy_stop;
static int proxy_fd = -1;
static uint16_t proxy_port, etcd_port;
static pthread_t proxy_thread;

/* Count "POST /v3/" in a client's bytes (the gateway's every request),
 * across reads: the last bytes of one read are kept for the next. */
static void count_posts(char *carry, size_t *n_carry, const char *buf, size_t n)
{
    static const char pat[] = "POST /v3/";
    const size_t m = sizeof(pat) - 1;
    char tmp[16384 + 16];
    size_t len = *n_carry;
    memcpy(tmp, carry, len);
    memcpy(tmp + len, buf, n);
    len += n;
    for (size_t i = 0; i + m <= len; i++)
        if (memcmp(tmp + i, pat, m) == 0)
            atomic_fetch_add(&proxy_requests, 1);
    size_t keep = len < m - 1 ? len : m - 1;
    memcpy(carry, tmp + len - keep, keep);
    *n_carry = keep;
}

static void *pipe_main(void *arg)
{
    int c = (int)(intptr_t)arg;
    int s = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons(etcd_port)};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    char carry[16];
    size_t n_carry = 0;
    char buf[16384];
    if (s < 0 || connect(s, (struct sockaddr *)&a, sizeof(a)) != 0)
        goto out;
    while (!atomic_load(&proxy_stop)) {
        struct pollfd p[2] = {{c, POLLIN, 0}, {s, POLLIN, 0}};
        if (poll(p, 2, 200) < 0)
            break;
        if (p[0].revents) {
            ssize_t n = read(c, buf, sizeof(buf));
            if (n <= 0)
                break;
            count_posts(carry, &n_carry, buf, (size_t)n);
            if (write(s, buf, (size_t)n) != n)
                break;
        }
        if (p[1].revents) {
            ssize_t n = read(s, buf, sizeof(buf));
            if (n <= 0 || write(c, buf, (size_t)n) != n)
                break;
        }
    }
out:
    if (s >= 0)
        close(s);
    close(c);
    return NULL;
}

static void *proxy_main(void *arg)
{
    (void)arg;
    while (!atomic_load(&proxy_stop)) {
        struct pollfd p = {proxy_fd, POLLIN, 0};
        if (poll(&p, 1, 200) <= 0)
            continue;
        int c = accept(proxy_fd, NULL, NULL);
        if (c < 0)
            continue;
        pthread_t t;
        pthread_attr_t at;
        pthread_attr_init(&at);
        pthread_attr_setdetachstate(&at, PTHREAD_CREATE_DETACHED);
        pthread_attr_setstacksize(&at, 1024 * 1024); /* 32 KiB of buffers, and the loader's xsave area */
        if (pthread_create(&t, &at, pipe_main, (void *)(intptr_t)c) != 0)
            close(c);
        pthread_attr_destroy(&at);
    }
    return NULL;
}

static void proxy_start(void)
{
    const char *e = graft_etcd_server_endpoint(etcd.server);
    const char *colon = strrchr(e, ':');
    assert_non_null(colon);
    etcd_port = (uint16_t)atoi(colon + 1);
    proxy_fd = socket(AF_INET, SOCK_STREAM, 0);
    assert_true(proxy_fd >= 0);
    struct sockaddr_in a = {.sin_family = AF_INET};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof(a);
    assert_int_equal(bind(proxy_fd, (struct sockaddr *)&a, sizeof(a)), 0);
    assert_int_equal(listen(proxy_fd, 512), 0);
    assert_int_equal(getsockname(proxy_fd, (struct sockaddr *)&a, &len), 0);
    proxy_port = ntohs(a.sin_port);
    atomic_store(&proxy_stop, false);
    assert_int_equal(pthread_create(&proxy_thread, NULL, proxy_main, NULL), 0);
}

static void proxy_end(void)
{
    atomic_store(&proxy_stop, true);
    pthread_join(proxy_thread, NULL);
    close(proxy_fd);
    usleep(300 * 1000); /* the pipes see the flag within their poll */
}

/* ------------------------------------------------ the budget, in-process --- */

/* SIGSTOP etcd and wait until every thread of it is stopped: kill()
 * returns before that, and on a loaded machine a request sent right after
 * was still answered (test_budget_sheds_and_paces under AddressSanitizer). */
static void etcd_stop(pid_t pid)
{
    assert_int_equal(kill(pid, SIGSTOP), 0);
    char path[64], buf[512];
    snprintf(path, sizeof(path), "/proc/%d/stat", (int)pid);
    for (int i = 0; i < 400; i++) {
        FILE *f = fopen(path, "r");
        size_t n = f != NULL ? fread(buf, 1, sizeof(buf) - 1, f) : 0;
        if (f != NULL)
            fclose(f);
        buf[n] = '\0';
        const char *st = strrchr(buf, ')');  /* "pid (comm) S ..." */
        if (st != NULL && st[1] == ' ' && st[2] == 'T')
            return;
        usleep(5000);
    }
    fail_msg("etcd (pid %d) did not stop within 2 s of SIGSTOP", (int)pid);
}

/* After each test: etcd running again, whatever the test left it as. */
static int etcd_resume(void **state)
{
    (void)state;
    if (etcd.server != NULL)
        kill(graft_etcd_server_pid(etcd.server), SIGCONT);
    return 0;
}

static graft_etcd_t *client(graft_etcd_t *share, graft_etcd_priority_t priority)
{
    const char *ep[] = {graft_etcd_server_endpoint(etcd.server)};
    graft_etcd_config_t c = graft_test_etcd_config(ep, 1, 300);
    c.priority = priority;
    c.share_load = share;
    graft_etcd_t *e = NULL;
    assert_int_equal(graft_etcd_create(&c, &e), GRAFT_OK);
    return e;
}

static atomic_int gets_failed;

static void *five_gets(void *arg)
{
    for (int i = 0; i < 5; i++) {
        graft_etcd_kv_t kv = {0};
        if (graft_etcd_get(arg, "/ov/k", &kv, NULL) == GRAFT_EETCD_TIMEOUT)
            atomic_fetch_add(&gets_failed, 1);
        graft_etcd_kv_clear(&kv);
    }
    return NULL;
}

static void test_budget_sheds_and_paces(void **state)
{
    (void)state;
    graft_etcd_t *ess = client(NULL, GRAFT_ETCD_PRIORITY_ESSENTIAL);
    graft_etcd_t *bg = client(ess, GRAFT_ETCD_PRIORITY_BEST_EFFORT);
    graft_etcd_kv_t kv = {0};
    graft_etcd_stats_t s0, s1, s2;
    /* Answered in time: nothing is shed, not even best effort. */
    assert_int_equal(graft_etcd_put(bg, "/ov/k", "v", 1, 0, NULL, NULL), GRAFT_OK);
    assert_int_equal(graft_etcd_get(ess, "/ov/k", &kv, NULL), GRAFT_OK);
    graft_etcd_kv_clear(&kv);
    graft_etcd_stats_get(bg, &s0);
    assert_int_equal(s0.requests, 2);
    assert_int_equal(s0.shed, 0);
    assert_false(s0.slow);

    pid_t pid = graft_etcd_server_pid(etcd.server);
    etcd_stop(pid);
    /* The first timeout makes etcd slow for every client of the load. */
    assert_int_equal(graft_etcd_get(ess, "/ov/k", &kv, NULL), GRAFT_EETCD_TIMEOUT);
    graft_etcd_stats_get(bg, &s1);
    assert_true(s1.slow);
    assert_int_equal(s1.slow_periods, 1);
    /* Best effort: shed at once, nothing sent. */
    double t0 = now_s();
    for (int i = 0; i < 20; i++)
        assert_int_equal(graft_etcd_put(bg, "/ov/k", "v", 1, 0, NULL, NULL), GRAFT_EUNREACHABLE);
    assert_true(now_s() - t0 < 0.2);
    /* Essential, from 4 threads at once: 4 at once, then 4 a second,
     * where 4 threads with a 300 ms timeout each would send 13 a second. */
    t0 = now_s();
    pthread_t th[4];
    for (int i = 0; i < 4; i++)
        assert_int_equal(pthread_create(&th[i], NULL, five_gets, ess), 0);
    for (int i = 0; i < 4; i++)
        pthread_join(th[i], NULL);
    double took = now_s() - t0;
    graft_etcd_stats_get(ess, &s2);
    assert_int_equal(kill(pid, SIGCONT), 0);
    print_message("stopped etcd: 20 best-effort requests shed; 20 essential ones from 4 threads "
                  "took %.2f s (unpaced: about 1.5 s); counters: %" PRIu64 " sent, %" PRIu64
                  " shed, %" PRIu64 " without answer\n",
                  took, s2.requests - s1.requests, s2.shed - s1.shed, s2.failures);
    assert_int_equal(atomic_load(&gets_failed), 20);
    assert_int_equal(s2.shed - s1.shed, 20);
    assert_int_equal(s2.requests - s1.requests, 20);
    /* (20 - 4) / 4 a second = 4 s of pacing, less what refilled while the
     * first 4 waited for their timeouts. */
    assert_true(took >= 3.0);
    /* Answered in time again: the slow period ends and nothing is shed. */
    for (int i = 0; i < 50; i++) {
        if (graft_etcd_get(ess, "/ov/k", &kv, NULL) == GRAFT_OK)
            break;
        usleep(100 * 1000);
    }
    graft_etcd_kv_clear(&kv);
    assert_int_equal(graft_etcd_put(bg, "/ov/k", "w", 1, 0, NULL, NULL), GRAFT_OK);
    graft_etcd_stats_get(bg, &s2);
    assert_false(s2.slow);
    graft_etcd_destroy(ess); /* the load lives on in bg */
    graft_etcd_stats_get(bg, &s2);
    assert_true(s2.requests >= 24);
    graft_etcd_destroy(bg);
}

/* --------------------------------------------- a job through a stopped etcd --- */

static int overload_groups(void)
{
    const char *v = getenv("OVERLOAD_GROUPS");
    int n = v != NULL ? atoi(v) : OVERLOAD_GROUPS_DEFAULT;
    return n < 2 ? 2 : (n > MAX_PROCS ? MAX_PROCS : n);
}

/* The job of the overload tests: ng groups of one rank, each request to
 * etcd through the proxy, 20 ms steps, run until 20 steps committed. */
static void job_start(job_t *j, const char *name, int ng)
{
    static char ep_env[96], groups_env[48];
    job_init(j, name); /* a job of its own: another's progress records are not its state */
    proxy_start();
    snprintf(ep_env, sizeof(ep_env), "GRAFT_ETCD_ENDPOINTS=http://127.0.0.1:%u",
             (unsigned)proxy_port);
    snprintf(groups_env, sizeof(groups_env), "GRAFT_GROUPS=%d", ng);
    j->extra_env[0] = ep_env;
    j->extra_env[1] = groups_env;
    j->extra_env[2] = "GRAFT_RANKS_PER_GROUP=1";
    j->capture_err = true;
    static const char *const flags[] = {"--steps", "100000", "--step-delay-ms", "20", NULL};
    for (int g = 0; g < ng; g++)
        spawn(j, g, 0, flags);
    for (int i = 0; i < ng; i++)
        wait_log(&j->p[i], 20, 180);
    usleep(1000 * 1000);
}

/* After etcd's slow period ended at t_end: the seconds until every rank
 * committed a step past mark[] (0 when not within 10 s); after[] the
 * counts then. */
static double job_recovery(job_t *j, int ng, const int *mark, int *after, double t_end)
{
    for (;;) {
        int n = 0;
        for (int i = 0; i < ng; i++) {
            after[i] = log_lines(j->p[i].log);
            n += after[i] > mark[i];
        }
        if (n == ng)
            return now_s() - t_end;
        if (now_s() - t_end > 10.0)
            return 0.0;
        usleep(50 * 1000);
    }
}

/* Per rank while etcd is slow for slow_s: the membership's two essential
 * clients (burst 4 + 4/s each), the runtime's normal one and the
 * persistent tier's (burst 2 + 1/s each), best effort none; plus the
 * view's watch streams re-opened (at most 4). */
static double job_budget(int ng, double slow_s)
{
    return ng * (2 * (4 + 4 * slow_s) + 2 * (2 + slow_s) + 4);
}

static void job_end(job_t *j, int ng, const int *mark, const int *after, double recovered_at,
                    uint64_t during, double budget)
{
    for (int i = 0; i < ng; i++)
        kill_proc(&j->p[i]);
    proxy_end();
    for (int i = 0; i < ng; i++)
        if (after[i] <= mark[i]) {
            print_err_tail(&j->p[i]);
            fail_msg("group %d did not commit within 10 s of etcd's return", j->p[i].group);
        }
    assert_true(recovered_at > 0.0 && recovered_at <= 10.0);
    assert_true((double)during <= budget);
    rm_rf(j->dir);
}

static void test_job_through_stopped_etcd(void **state)
{
    (void)state;
    const int ng = overload_groups();
    const double stop_s = 5.0, ttl_s = 2.0;
    job_t j;
    job_start(&j, "ov-stopped", ng);
    int before[MAX_PROCS], frozen[MAX_PROCS], after[MAX_PROCS];
    for (int i = 0; i < ng; i++)
        before[i] = log_lines(j.p[i].log);

    pid_t pid = graft_etcd_server_pid(etcd.server);
    uint64_t r0 = atomic_load(&proxy_requests);
    double t_stop = now_s();
    assert_int_equal(kill(pid, SIGSTOP), 0);
    /* 5/6 of the TTL after the last renewal (sent before the stop) no rank
     * may commit; 0.8 s more for a commit decided just before to reach
     * its log. */
    usleep((useconds_t)((ttl_s * 5.0 / 6.0 + 0.8) * 1e6));
    for (int i = 0; i < ng; i++)
        frozen[i] = log_lines(j.p[i].log);
    usleep((useconds_t)((t_stop + stop_s - now_s()) * 1e6));
    int violations = 0;
    for (int i = 0; i < ng; i++) {
        int now = log_lines(j.p[i].log);
        if (now != frozen[i]) {
            fprintf(stderr, "group %d committed %d steps while its lease may have expired\n",
                    j.p[i].group, now - frozen[i]);
            violations++;
        }
    }
    uint64_t r1 = atomic_load(&proxy_requests);
    double t_cont = now_s();
    assert_int_equal(kill(pid, SIGCONT), 0);
    double slow = t_cont - t_stop;
    double recovered_at = job_recovery(&j, ng, frozen, after, t_cont);
    double budget = job_budget(ng, slow);
    uint64_t during = r1 - r0;
    print_message("%d groups, etcd stopped %.1f s: %" PRIu64 " etcd requests reached it "
                  "(%.1f a rank), budget %.0f; steps before the stop %d..%d; every rank "
                  "committed again %.2f s after SIGCONT\n",
                  ng, slow, during, (double)during / ng, budget, before[0], frozen[0],
                  recovered_at);
    assert_int_equal(violations, 0);
    job_end(&j, ng, frozen, after, recovered_at, during, budget);
}

/*
 * etcd starved of CPU for 5 s: stopped 150 ms of every 200 ms, so that it
 * answers, late (the keep-alives' 1/3-TTL timeouts and the others' half
 * timeouts make the clients call it slow). The job must come through with
 * its requests within the budget and every rank committing within 10 s of
 * the end.
 */
static void test_job_through_starved_etcd(void **state)
{
    (void)state;
    const int ng = overload_groups();
    const double starve_s = 5.0;
    job_t j;
    job_start(&j, "ov-starved", ng);
    int before[MAX_PROCS], after[MAX_PROCS];
    for (int i = 0; i < ng; i++)
        before[i] = log_lines(j.p[i].log);
    pid_t pid = graft_etcd_server_pid(etcd.server);
    uint64_t r0 = atomic_load(&proxy_requests);
    double t0 = now_s();
    while (now_s() - t0 < starve_s) {
        assert_int_equal(kill(pid, SIGSTOP), 0);
        usleep(150 * 1000);
        assert_int_equal(kill(pid, SIGCONT), 0);
        usleep(50 * 1000);
    }
    uint64_t r1 = atomic_load(&proxy_requests);
    double t_end = now_s();
    int mark[MAX_PROCS];
    for (int i = 0; i < ng; i++)
        mark[i] = log_lines(j.p[i].log);
    double recovered_at = job_recovery(&j, ng, mark, after, t_end);
    double budget = job_budget(ng, t_end - t0);
    uint64_t during = r1 - r0;
    int least = mark[0] - before[0], most = least;
    for (int i = 0; i < ng; i++) {
        least = GRAFT_TEST_MIN(least, mark[i] - before[i]);
        most = GRAFT_TEST_MAX(most, mark[i] - before[i]);
    }
    print_message("%d groups, etcd given 25 %% of its time for %.1f s: %" PRIu64 " etcd "
                  "requests reached it (%.1f a rank), budget %.0f; %d..%d steps committed a "
                  "rank meanwhile; every rank committed again %.2f s after\n",
                  ng, t_end - t0, during, (double)during / ng, budget, least, most,
                  recovered_at);
    job_end(&j, ng, mark, after, recovered_at, during, budget);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_teardown(test_budget_sheds_and_paces, etcd_resume),
        cmocka_unit_test_teardown(test_job_through_stopped_etcd, etcd_resume),
        cmocka_unit_test_teardown(test_job_through_starved_etcd, etcd_resume),
    };
    if (getenv("TEST_FILTER") != NULL)
        cmocka_set_test_filter(getenv("TEST_FILTER"));
    return cmocka_run_group_tests(tests, setup, teardown);
}
