/* Membership with real processes: 8 groups x 2 ranks, each rank a child
 * process (this program re-executed with --child) running a training-like
 * loop of quorum, compute, commit vote. The parent injects the failures:
 * SIGKILL of a rank, SIGSTOP/SIGCONT of a rank, an etcd restart, and checks
 * from the children's reports that every round was seen identically by
 * everyone in it. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <graft/membership.h>

#include "etcd_fixture.h"

#define G 8
#define R 2
/* Short enough for a quick test, long enough that a shared, loaded machine
 * does not make healthy ranks miss renewals or the join timeout. */
#define TTL_S 3
/* The rank of the short-hang test (group 6, rank 1) has a longer lease, so
 * that a SIGSTOP well past the join timeout still ends well inside its TTL
 * on a loaded machine (its keep-alive thread is stopped too). */
#define SHORT_G 6
#define SHORT_R 1
#define SHORT_TTL_S 12
#define JOIN_MS 1000
#define VOTE_MS 1500
#define JOB "fail"

static uint64_t now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
}

/* ---------------------------------------------------------------- child --- */

static volatile sig_atomic_t child_stop;

static void on_term(int sig)
{
    (void)sig;
    child_stop = 1;
}

static void report(int fd, const char *fmt, ...) GRAFT_PRINTF(2, 3);
static void report(int fd, const char *fmt, ...)
{
    char line[512];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(line, sizeof(line), fmt, ap);
    va_end(ap);
    /* one write per line on an O_APPEND file: lines never interleave */
    if (n > 0 && write(fd, line, (size_t)n) != n)
        _exit(3);
}

static int child_main(char **argv)
{
    const char *endpoint = argv[2];
    uint32_t g = (uint32_t)atoi(argv[3]), r = (uint32_t)atoi(argv[4]);
    const char *results = argv[5];
    uint64_t committed = strtoull(argv[6], NULL, 10);
    uint32_t ttl_s = argv[7] != NULL ? (uint32_t)atoi(argv[7]) : TTL_S;
    signal(SIGTERM, on_term);
    int fd = open(results, O_WRONLY | O_APPEND | O_CREAT, 0644);
    if (fd < 0)
        return 2;
    graft_etcd_config_t e = graft_test_etcd_config(&endpoint, 1, 1500);
    graft_membership_config_t c = {0};
    c.job = JOB;
    c.etcd = &e;
    c.group = g;
    c.rank = r;
    c.ranks_per_group = R;
    c.min_groups = 1;
    c.lease_ttl_s = ttl_s;
    c.join_timeout_ms = JOIN_MS;
    c.transfer_address = "tcp://127.0.0.1:9";
    graft_membership_t *m = NULL;
    graft_status_t st = graft_membership_create(&c, &m);
    if (st != GRAFT_OK) {
        report(fd, "E %u %u create %s\n", g, r, graft_status_name(st));
        return 1;
    }
    while (!child_stop) {
        graft_quorum_t *q = NULL;
        st = graft_membership_quorum_wait(m, committed, 3000, &q);
        if (st != GRAFT_OK) {
            report(fd, "E %u %u quorum %s\n", g, r, graft_status_name(st));
            usleep(50000);
            continue;
        }
        /* A recipient would pull its state from q->recoveries' donors here. */
        bool recover = q->must_recover;
        if (recover)
            committed = q->step;
        usleep(50000); /* the step's compute */
        bool decision = false;
        st = graft_membership_commit_vote(m, q, true, NULL, VOTE_MS, &decision);
        if (st == GRAFT_OK && decision)
            committed = q->step + 1;
        char members[256] = "";
        size_t off = 0;
        for (size_t i = 0; i < q->n_members && off < sizeof(members) - 12; i++)
            off += (size_t)snprintf(members + off, sizeof(members) - off, "%s%u", i ? "," : "",
                                    q->members[i]);
        report(fd, "R %u %u %" PRIu64 " %" PRIu64 " %" PRIu64 " %d %d %" PRIu64 " %s\n", g, r,
               q->round, q->id, q->step, recover ? 1 : 0, st == GRAFT_OK && decision ? 1 : 0,
               now_ms(), members);
        graft_membership_quorum_free(q);
    }
    graft_membership_destroy(m);
    close(fd);
    return 0;
}

/* --------------------------------------------------------------- parent --- */

static graft_test_etcd_t T;
static const char *endpoint;
static graft_etcd_config_t ecfg;
static char dir[256];
static char results[300];
static char self[4096];
static pid_t pids[G][R];
static graft_membership_t *obs;

static pid_t spawn(uint32_t g, uint32_t r, uint64_t committed)
{
    char gs[16], rs[16], cs[32], ts[16];
    snprintf(gs, sizeof(gs), "%u", g);
    snprintf(rs, sizeof(rs), "%u", r);
    snprintf(cs, sizeof(cs), "%" PRIu64, committed);
    snprintf(ts, sizeof(ts), "%d", g == SHORT_G && r == SHORT_R ? SHORT_TTL_S : TTL_S);
    pid_t pid = fork();
    if (pid == 0) {
        char *args[] = {self, "--child", (char *)endpoint, gs, rs, results, cs, ts, NULL};
        execv(self, args);
        _exit(127);
    }
    return pid;
}

typedef struct line {
    uint32_t g, r;
    uint64_t round, id, step;
    int recover, decision;
    uint64_t t_ms;
    char members[256];
} line_t;

/* Read every report so far. */
static size_t read_lines(line_t **out_p)
{
    FILE *f = fopen(results, "r");
    size_t n = 0, cap = 0;
    line_t *out = NULL;
    char buf[512];
    while (f != NULL && fgets(buf, sizeof(buf), f) != NULL) {
        line_t l;
        /* a child may be in the middle of writing the last line */
        if (strchr(buf, '\n') == NULL)
            continue;
        memset(&l, 0, sizeof(l));
        if (sscanf(buf, "R %u %u %" SCNu64 " %" SCNu64 " %" SCNu64 " %d %d %" SCNu64 " %255s",
                   &l.g, &l.r, &l.round, &l.id, &l.step, &l.recover, &l.decision, &l.t_ms,
                   l.members) != 9)
            continue;
        if (n == cap) {
            cap = cap ? cap * 2 : 1024;
            out = realloc(out, cap * sizeof(*out));
            assert_non_null(out);
        }
        out[n++] = l;
    }
    if (f != NULL)
        fclose(f);
    *out_p = out;
    return n;
}

static bool member_of(const char *members, uint32_t g)
{
    char tmp[256];
    snprintf(tmp, sizeof(tmp), "%s", members);
    for (char *tok = strtok(tmp, ","); tok != NULL; tok = strtok(NULL, ","))
        if ((uint32_t)atoi(tok) == g)
            return true;
    return false;
}

/* Every report of a round agrees with every other report of it; the same
 * id always means the same member set; reporters are members. */
static uint64_t check_agreement(void)
{
    line_t *l = NULL;
    size_t n = read_lines(&l);
    uint64_t max_round = 0;
    for (size_t i = 0; i < n; i++) {
        if (!member_of(l[i].members, l[i].g))
            print_message("# bad report: group %u round %" PRIu64 " members %s\n", l[i].g, l[i].round, l[i].members);
        assert_true(member_of(l[i].members, l[i].g));
        for (size_t j = 0; j < i; j++) {
            if (l[j].round == l[i].round) {
                assert_int_equal(l[j].id, l[i].id);
                assert_int_equal(l[j].step, l[i].step);
                assert_string_equal(l[j].members, l[i].members);
                break;
            }
        }
        for (size_t j = 0; j < i; j++) {
            if (l[j].id == l[i].id) {
                assert_string_equal(l[j].members, l[i].members);
                break;
            }
        }
        if (l[i].round > max_round)
            max_round = l[i].round;
    }
    free(l);
    return max_round;
}

/* Wait until a round after `after_round` has all G groups, with every
 * rank of them reporting; returns that round, 0 on timeout. */
static uint64_t wait_full_round(uint64_t after_round, uint32_t timeout_ms)
{
    uint64_t end = now_ms() + timeout_ms;
    while (now_ms() < end) {
        line_t *l = NULL;
        size_t n = read_lines(&l);
        for (size_t i = 0; i < n; i++) {
            if (l[i].round <= after_round || strcmp(l[i].members, "0,1,2,3,4,5,6,7") != 0)
                continue;
            size_t reports = 0;
            for (size_t j = 0; j < n; j++)
                reports += l[j].round == l[i].round;
            if (reports == G * R) {
                uint64_t round = l[i].round;
                free(l);
                return round;
            }
        }
        free(l);
        usleep(50000);
    }
    return 0;
}

static int group_setup(void **state)
{
    (void)state;
    ssize_t len = readlink("/proc/self/exe", self, sizeof(self) - 1);
    if (len <= 0)
        return -1;
    self[len] = '\0';
    snprintf(dir, sizeof(dir), "%s/graft-mfail.XXXXXX", getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp");
    if (mkdtemp(dir) == NULL)
        return -1;
    snprintf(results, sizeof(results), "%s/results", dir);
    if (graft_test_etcd_start(&T, NULL) != 0)
        return -1;
    endpoint = graft_etcd_server_endpoint(T.server);
    ecfg = graft_test_etcd_config(&endpoint, 1, 1500);
    for (uint32_t g = 0; g < G; g++)
        for (uint32_t r = 0; r < R; r++)
            pids[g][r] = spawn(g, r, 100);
    graft_membership_config_t c = {0};
    c.job = JOB;
    c.etcd = &ecfg;
    c.observer = true;
    c.ranks_per_group = R;
    if (graft_membership_create(&c, &obs) != GRAFT_OK)
        return -1;
    return 0;
}

static int group_teardown(void **state)
{
    (void)state;
    for (uint32_t g = 0; g < G; g++)
        for (uint32_t r = 0; r < R; r++)
            if (pids[g][r] > 0) {
                kill(pids[g][r], SIGCONT);
                kill(pids[g][r], SIGTERM);
            }
    uint64_t end = now_ms() + 8000;
    for (uint32_t g = 0; g < G; g++) {
        for (uint32_t r = 0; r < R; r++) {
            if (pids[g][r] <= 0)
                continue;
            int status;
            while (waitpid(pids[g][r], &status, WNOHANG) == 0) {
                if (now_ms() > end) {
                    kill(pids[g][r], SIGKILL);
                    waitpid(pids[g][r], &status, 0);
                    break;
                }
                usleep(20000);
            }
            pids[g][r] = 0;
        }
    }
    graft_membership_destroy(obs);
    graft_test_etcd_stop(&T);
    if (getenv("GRAFT_TEST_KEEP") == NULL) {
        unlink(results);
        rmdir(dir);
    } else {
        fprintf(stderr, "kept %s\n", results);
    }
    return 0;
}

static void test_processes_agree(void **state)
{
    (void)state;
    uint64_t r1 = wait_full_round(0, 30000);
    assert_true(r1 > 0);
    uint64_t r2 = wait_full_round(r1 + 1, 30000);
    assert_true(r2 > r1);
    check_agreement();
    graft_membership_view_t *v = NULL;
    assert_int_equal(graft_membership_view_get(obs, &v), GRAFT_OK);
    assert_int_equal(v->n_members, G * R);
    assert_int_equal(v->n_healthy_groups, G);
    graft_membership_view_free(v);
}

static void test_sigkill_detected_within_ttl(void **state)
{
    (void)state;
    graft_quorum_t *before = NULL;
    assert_true(graft_membership_group_healthy(obs, 3));
    assert_int_equal(graft_membership_quorum_latest(obs, &before), GRAFT_OK);
    uint64_t before_round = before->round, before_id = before->id;
    graft_membership_quorum_free(before);
    uint64_t t0 = now_ms();
    assert_int_equal(kill(pids[3][1], SIGKILL), 0);
    int status;
    waitpid(pids[3][1], &status, 0);
    pids[3][1] = 0;
    uint64_t limit = TTL_S * 1000u + TTL_S * 1000u / 3u;
    uint64_t detected = 0;
    while (now_ms() - t0 < limit + 3000) {
        if (!graft_membership_group_healthy(obs, 3)) {
            detected = now_ms() - t0;
            break;
        }
        uint64_t ver = 0;
        if (graft_membership_view_wait(obs, 0, 0, &ver) != GRAFT_OK)
            ver = 0;
        if (graft_membership_view_wait(obs, ver, 50, NULL) != GRAFT_OK)
            continue;
    }
    print_message("# SIGKILL -> group unhealthy after %" PRIu64 " ms (TTL %d s, limit %" PRIu64
                  " ms)\n", detected, TTL_S, limit);
    assert_true(detected > 0);
    assert_true(detected <= limit);
    /* Rounds go on without group 3 ... */
    uint64_t end = now_ms() + 10000;
    bool without = false;
    while (!without && now_ms() < end) {
        graft_quorum_t *q = NULL;
        if (graft_membership_quorum_latest(obs, &q) == GRAFT_OK) {
            without = q->round > before_round && q->n_members == G - 1;
            for (size_t i = 0; i < q->n_members; i++)
                assert_int_not_equal(q->members[i], 3);
            graft_membership_quorum_free(q);
        }
        usleep(50000);
    }
    assert_true(without);
    /* ... and a replacement process re-enters as a recipient with a new id. */
    uint64_t t1 = now_ms();
    pids[3][1] = spawn(3, 1, 0);
    uint64_t full = wait_full_round(check_agreement(), 30000);
    line_t *l = NULL;
    size_t n = read_lines(&l);
    bool recovered = false;
    uint64_t new_id = 0;
    for (size_t i = 0; i < n; i++) {
        if (l[i].t_ms >= t1 && l[i].g == 3 && l[i].recover) {
            recovered = true;
            new_id = l[i].id;
        }
    }
    free(l);
    assert_true(full > 0);
    assert_true(recovered);
    assert_int_not_equal(new_id, before_id);
    check_agreement();
}

static void test_sigstop_left_out_then_recovers(void **state)
{
    (void)state;
    uint64_t start_round = wait_full_round(check_agreement(), 30000);
    assert_true(start_round > 0);
    uint64_t t0 = now_ms();
    assert_int_equal(kill(pids[5][1], SIGSTOP), 0);
    /* The hung rank's keep-alive stops too, but the group must be left out
     * by the join timeout, well before its lease runs out. */
    bool left_out_while_live = false;
    uint64_t left_out_ms = 0;
    while (now_ms() - t0 < 8000 && !left_out_while_live) {
        graft_quorum_t *q = NULL;
        if (graft_membership_quorum_latest(obs, &q) == GRAFT_OK) {
            bool has5 = false;
            for (size_t i = 0; i < q->n_members; i++)
                has5 |= q->members[i] == 5;
            if (!has5 && q->round > start_round) {
                left_out_while_live = graft_membership_group_healthy(obs, 5);
                left_out_ms = now_ms() - t0;
                if (!left_out_while_live) {
                    graft_membership_quorum_free(q);
                    break;
                }
            }
            graft_membership_quorum_free(q);
        }
        usleep(20000);
    }
    print_message("# SIGSTOP -> left out of a quorum after %" PRIu64 " ms (join timeout %d ms)\n",
                  left_out_ms, JOIN_MS);
    assert_true(left_out_while_live);
    assert_true(left_out_ms >= JOIN_MS / 2);
    /* Let its lease expire, then wake it: it must notice, re-join as a new
     * incarnation and come back as a recipient. */
    usleep((TTL_S * 1000u + 1500u) * 1000u);
    assert_false(graft_membership_group_healthy(obs, 5));
    uint64_t t1 = now_ms();
    assert_int_equal(kill(pids[5][1], SIGCONT), 0);
    uint64_t full = wait_full_round(check_agreement(), 30000);
    assert_true(full > 0);
    line_t *l = NULL;
    size_t n = read_lines(&l);
    bool rank1_recovered = false;
    for (size_t i = 0; i < n; i++)
        if (l[i].t_ms >= t1 && l[i].g == 5 && l[i].r == 1 && l[i].recover)
            rank1_recovered = true;
    free(l);
    assert_true(rank1_recovered);
    check_agreement();
}

/* The incarnation of a rank in the observer's view, 0 if absent. */
static uint64_t incarnation_of(uint32_t g, uint32_t r)
{
    graft_membership_view_t *v = NULL;
    uint64_t inc = 0;
    assert_int_equal(graft_membership_view_get(obs, &v), GRAFT_OK);
    for (size_t i = 0; i < v->n_members; i++)
        if (v->members[i].group == g && v->members[i].rank == r)
            inc = v->members[i].incarnation;
    graft_membership_view_free(v);
    return inc;
}

/* A hang longer than the join timeout but well inside the lease: the
 * group is left out of the next quorum while its members stay live, and
 * after SIGCONT the same process, with the same lease and incarnation,
 * comes back as a recipient. No lease is lost, nothing re-joins. */
static void test_short_sigstop_left_out_same_incarnation(void **state)
{
    (void)state;
    uint64_t start_round = wait_full_round(check_agreement(), 30000);
    assert_true(start_round > 0);
    uint64_t inc0 = incarnation_of(SHORT_G, SHORT_R);
    assert_true(inc0 != 0);
    uint64_t t0 = now_ms();
    assert_int_equal(kill(pids[SHORT_G][SHORT_R], SIGSTOP), 0);
    bool left_out_while_live = false;
    uint64_t left_out_ms = 0;
    while (now_ms() - t0 < 6000 && !left_out_while_live) {
        graft_quorum_t *q = NULL;
        if (graft_membership_quorum_latest(obs, &q) == GRAFT_OK) {
            bool has = false;
            for (size_t i = 0; i < q->n_members; i++)
                has |= q->members[i] == SHORT_G;
            if (!has && q->round > start_round) {
                left_out_while_live = graft_membership_group_healthy(obs, SHORT_G);
                left_out_ms = now_ms() - t0;
            }
            graft_membership_quorum_free(q);
        }
        if (!left_out_while_live)
            usleep(20000);
    }
    /* Stopped for at least two join timeouts, whatever the machine's load. */
    while (now_ms() - t0 < 2u * JOIN_MS)
        usleep(20000);
    uint64_t stopped_ms = now_ms() - t0;
    uint64_t t1 = now_ms();
    assert_int_equal(kill(pids[SHORT_G][SHORT_R], SIGCONT), 0);
    print_message("# short SIGSTOP: left out after %" PRIu64 " ms, resumed after %" PRIu64
                  " ms (join timeout %d ms, its TTL %d s)\n", left_out_ms, stopped_ms, JOIN_MS,
                  SHORT_TTL_S);
    assert_true(left_out_while_live);
    assert_true(stopped_ms < SHORT_TTL_S * 1000u * 2u / 3u);
    assert_true(graft_membership_group_healthy(obs, SHORT_G));

    uint64_t full = wait_full_round(check_agreement(), 30000);
    assert_true(full > 0);
    line_t *l = NULL;
    size_t n = read_lines(&l);
    bool rank_recovered = false, group_recovered = false;
    for (size_t i = 0; i < n; i++) {
        if (l[i].t_ms < t1 || l[i].g != SHORT_G || !l[i].recover)
            continue;
        group_recovered = true;
        rank_recovered |= l[i].r == SHORT_R;
    }
    free(l);
    assert_true(group_recovered);
    assert_true(rank_recovered);
    /* Same process, same lease: the incarnation did not change and no lease
     * was reported lost. */
    assert_int_equal(incarnation_of(SHORT_G, SHORT_R), inc0);
    graft_event_t *evs = NULL;
    size_t n_ev = 0;
    assert_int_equal(graft_membership_events_read(obs, 0, &evs, &n_ev), GRAFT_OK);
    size_t joins = 0;
    for (size_t i = 0; i < n_ev; i++) {
        if (evs[i].group != SHORT_G || evs[i].rank != SHORT_R)
            continue;
        assert_int_not_equal(evs[i].kind, GRAFT_EVENT_LEASE_LOST);
        if (evs[i].kind == GRAFT_EVENT_JOIN) {
            assert_int_equal(evs[i].incarnation, inc0);
            joins++;
        }
    }
    assert_int_equal(joins, 1);
    graft_membership_events_free(evs, n_ev);
    check_agreement();
}

static void test_etcd_restart_mid_run(void **state)
{
    (void)state;
    uint64_t before = wait_full_round(check_agreement(), 30000);
    assert_true(before > 0);
    assert_int_equal(graft_etcd_server_stop(T.server), GRAFT_OK);
    usleep(500000);
    assert_int_equal(graft_etcd_server_restart(T.server), GRAFT_OK);
    uint64_t after = wait_full_round(before, 30000);
    assert_true(after > before);
    uint64_t later = wait_full_round(after, 30000);
    assert_true(later > after);
    check_agreement();
    graft_membership_view_t *v = NULL;
    assert_int_equal(graft_membership_view_get(obs, &v), GRAFT_OK);
    assert_int_equal(v->n_healthy_groups, G);
    graft_membership_view_free(v);
}

int main(int argc, char **argv)
{
    if (argc > 1 && strcmp(argv[1], "--child") == 0)
        return argc == 7 || argc == 8 ? child_main(argv) : 2;
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_processes_agree),
        cmocka_unit_test(test_sigkill_detected_within_ttl),
        cmocka_unit_test(test_sigstop_left_out_then_recovers),
        cmocka_unit_test(test_short_sigstop_left_out_same_incarnation),
        cmocka_unit_test(test_etcd_restart_mid_run),
    };
    return cmocka_run_group_tests_name("membership_failures", tests, group_setup, group_teardown);
}
