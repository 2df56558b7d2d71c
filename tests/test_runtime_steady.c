/*
 * The steady path and delegated records end to end (docs/RUNTIME.md): real
 * etcd, real UCX on loopback, jobs of examples/train_mlp as real processes
 * (the fixture is runtime_procs.h). An unchanged epoch's steps leave
 * etcd; a job cut off from etcd stops committing; a hung rank, or a hung
 * group leader, keeps its group out while the others go on; a late vote
 * outlasts another group's member change; every job ends bit-identical to
 * the fault-free run.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <graft/graft.h>

#include "runtime_procs.h"


/*
 * The steady path (docs/RUNTIME.md): with nothing changing, steps after the
 * first are agreed between the members and etcd sees no request of theirs;
 * the same job with steady_path = etcd makes requests every step. Both end
 * bit-identical to the fault-free run.
 */
static void run_steady(const char *path, const char *gather_ms, int steps,
                       trainer_metrics_t *sum)
{
    job_t j;
    char env[64], genv[64], nsteps[16], name[48];
    /* a job each: the first leaves progress */
    snprintf(name, sizeof(name), "steady-%s-%s", path, gather_ms);
    rp_job_init(&j, name);
    snprintf(env, sizeof(env), "GRAFT_STEADY_PATH=%s", path);
    snprintf(genv, sizeof(genv), "GRAFT_GATHER_TIMEOUT_MS=%s", gather_ms);
    snprintf(nsteps, sizeof(nsteps), "%d", steps);
    j.extra_env[0] = env;
    j.extra_env[1] = genv;
    const char *flags[] = {"--steps", nsteps, NULL};
    rp_spawn_all(&j, flags);
    rp_wait_all(&j, 120);
    rp_check_final(&j, steps);
    rp_check_logs(&j, steps);
    memset(sum, 0, sizeof(*sum));
    for (int i = 0; i < j.n; i++) {
        trainer_metrics_t m;
        rp_read_metrics(&j.p[i], &m);
        sum->commits += m.commits;
        sum->steady_steps += m.steady_steps;
        sum->steady_fallbacks += m.steady_fallbacks;
        sum->etcd_requests += m.etcd_requests;
    }
    rp_rm_rf(j.dir);
}

static void test_steady_path_leaves_etcd(void **state)
{
    (void)state;
    const int steps = 60;
    trainer_metrics_t peers, viaetcd, own;
    run_steady("peers", "200", steps, &peers);
    run_steady("etcd", "200", steps, &viaetcd);
    run_steady("etcd", "0", steps, &own);
    /* Every rank: the start-up rounds through etcd (cold sync, the
     * healthy-state update), then the rest between the members. A step
     * that falls back (a loaded machine misses a timeout) and the back-off
     * after it go through etcd, so "most", not "all". */
    assert_int_equal(peers.commits, (uint64_t)(G * R * steps));
    if (peers.steady_steps < (uint64_t)(G * R * steps / 2))
        fail_msg("%" PRIu64 " of %d rank-steps on the steady path (%" PRIu64 " fallbacks)",
                 peers.steady_steps, G * R * steps, peers.steady_fallbacks);
    assert_int_equal(viaetcd.steady_steps, 0);
    assert_int_equal(own.steady_steps, 0);
    assert_int_equal(own.commits, (uint64_t)(G * R * steps));
    /* etcd requests through etcd: at least 2 per rank and step when each
     * rank writes its own records; with the leaders writing their groups'
     * (delegated records), at least 2 per group and step, and far fewer
     * in all. On the steady path the start-up's (about 15 per rank: join,
     * the first rounds and votes, progress) and those of steps that fell
     * back. */
    print_message("etcd requests: steady path %" PRIu64 ", etcd path %" PRIu64
                  " (delegated records) and %" PRIu64 " (each rank its own)\n",
                  peers.etcd_requests, viaetcd.etcd_requests, own.etcd_requests);
    assert_true(own.etcd_requests >= (uint64_t)(2 * G * R * steps));
    assert_true(viaetcd.etcd_requests >= (uint64_t)(2 * G * steps));
    if (viaetcd.etcd_requests * 4 > own.etcd_requests * 3)
        fail_msg("delegated records: %" PRIu64 " etcd requests, each rank its own: %" PRIu64,
                 viaetcd.etcd_requests, own.etcd_requests);
    if (peers.etcd_requests * 3 > viaetcd.etcd_requests)
        fail_msg("steady path: %" PRIu64 " etcd requests, etcd path: %" PRIu64,
                 peers.etcd_requests, viaetcd.etcd_requests);
}

/*
 * etcd stops answering (SIGSTOP) in the middle of a steady run: every rank
 * loses the certainty that its lease lives within 5/6 of the TTL and stops
 * committing, although the members still reach each other; once etcd is
 * back the job goes on and ends bit-identical.
 */
static void test_steady_stops_without_etcd(void **state)
{
    (void)state;
    job_t j;
    const int steps = 200;
    rp_job_init(&j, "steady-cut");
    const char *flags[] = {"--steps", "200", "--step-delay-ms", "10", NULL};
    rp_spawn_all(&j, flags);
    rp_wait_log(&j.p[0], 30, 60);
    pid_t etcd_pid = graft_etcd_server_pid(rtf_etcd.server);
    assert_int_equal(kill(etcd_pid, SIGSTOP), 0);
    /* TTL 2 s: within 5/6 of it after the last renewal no rank commits. */
    usleep(2000 * 1000);
    int frozen[G * R];
    for (int i = 0; i < G * R; i++)
        frozen[i] = rp_log_lines(j.p[i].log);
    usleep(1500 * 1000);
    for (int i = 0; i < G * R; i++) {
        int now = rp_log_lines(j.p[i].log);
        if (now != frozen[i]) {
            kill(etcd_pid, SIGCONT);
            fail_msg("group %d rank %d committed %d steps with etcd unreachable", j.p[i].group,
                     j.p[i].rank, now - frozen[i]);
        }
    }
    assert_true(frozen[0] < steps);
    assert_int_equal(kill(etcd_pid, SIGCONT), 0);
    rp_wait_all(&j, 120);
    rp_check_final(&j, steps);
    rp_check_logs(&j, steps);
    rp_rm_rf(j.dir);
}

/* An elastic 3 x 2 job of `steps` steps (GRAFT_STEADY_PATH = path) in
 * which rank `rank` of group 1 is stopped (SIGSTOP) after its 10th step
 * until group 0 has committed 5 more without it, then resumed: every rank
 * ends bit-identical to the fault-free run. The metrics of group 0's rank
 * 0 into *m. */
static void run_hung(const char *name, const char *path, int steps, int rank,
                     trainer_metrics_t *m)
{
    job_t j;
    char nsteps[16], env[64];
    rp_job_init(&j, name);
    snprintf(nsteps, sizeof(nsteps), "%d", steps);
    snprintf(env, sizeof(env), "GRAFT_STEADY_PATH=%s", path);
    j.extra_env[0] = "GRAFT_MODE=elastic";
    j.extra_env[1] = "GRAFT_MIN_GROUPS=2";
    j.extra_env[2] = env;
    const char *flags[] = {"--steps", nsteps, "--step-delay-ms", "20", NULL};
    rp_spawn_all(&j, flags);
    proc_t *hung = &j.p[1 * R + rank];
    rp_wait_log(hung, 10, 60);
    assert_int_equal(kill(hung->pid, SIGSTOP), 0);
    int before = rp_log_lines(j.p[0].log);
    rp_wait_log(&j.p[0], before + 5, 60);
    assert_int_equal(kill(hung->pid, SIGCONT), 0);
    rp_wait_all(&j, 120);
    rp_check_final(&j, steps);
    rp_check_logs(&j, steps);
    rp_read_metrics(&j.p[0], m);
    rp_rm_rf(j.dir);
}

/*
 * A rank hangs (SIGSTOP) in a steady step of an elastic job: its group's
 * leader, and through the barrier every member, falls back to etcd, which
 * forms the next epoch without the hung group; the others keep committing.
 * Resumed, the hung rank finds its epoch over and its group heals.
 */
static void test_steady_hung_rank(void **state)
{
    (void)state;
    trainer_metrics_t m;
    run_hung("steady-hang", "peers", 60, 1, &m);
    assert_true(m.steady_fallbacks >= 1);
    assert_true(m.steady_steps >= 10);
}

/*
 * Delegated records with a hung leader: every step through etcd
 * (steady_path = etcd), so every step's ready records and votes go through
 * the groups' leaders, and group 1's leader is stopped mid-run. Its rank 1
 * hears no answer, announces itself, and the other groups go on without
 * group 1; once the leader runs again the group heals.
 */
static void test_delegate_leader_hung(void **state)
{
    (void)state;
    trainer_metrics_t m;
    run_hung("delegate-hang", "etcd", 40, 0, &m);
    assert_int_equal(m.steady_steps, 0);
}

/* The first heal line of a trainer's --role-log ("step heal STATUS MS
 * DETAIL"), or fails. */

/* A member of another group killed between ready and vote does not make a
 * group whose rank votes late say no. At step 10 group 2's rank 1 dies
 * before its vote and group 0's rank 1 votes 4 s late, after etcd let the
 * dead rank's lease go (TTL 2 s): group 0 still commits the step, as group
 * 1 does, so neither heals (group 2 does, with its replacement), and the
 * job ends bit-identical to the fault-free run. Before, a wait for a vote
 * ended 500 ms after any member change, and group 0 voted no on a step
 * group 1 committed. */
static void test_late_vote_outlasts_other_group(void **state)
{
    (void)state;
    job_t j;
    const int steps = 30;
    rp_job_init(&j, "late-vote");
    j.extra_env[0] = "GRAFT_JOIN_TIMEOUT_MS=8000";
    const char *flags[] = {"--steps", "30", "--step-delay-ms", "20", NULL};
    const char *late[] = {"--steps", "30", "--step-delay-ms", "20", "--vote-delay-at", "10",
                          "--vote-delay-ms", "4000", NULL};
    const char *dies[] = {"--steps", "30", "--step-delay-ms", "20", "--die-before-vote", "10",
                          NULL};
    for (int g = 0; g < G; g++)
        for (int r = 0; r < R; r++)
            rp_spawn(&j, g, r, g == 0 && r == 1 ? late : g == 2 && r == 1 ? dies : flags);
    proc_t *dead = &j.p[2 * R + 1];
    rp_wait_proc(dead, 60);
    assert_true(WIFSIGNALED(dead->status));
    rp_spawn(&j, 2, 1, flags);
    rp_wait_all(&j, 120);
    rp_check_final(&j, steps);
    rp_check_logs(&j, steps);
    for (int r = 0; r < R; r++) {
        const proc_t *p = &j.p[0 * R + r];
        if (rp_file_contains(p->role, " heal "))
            fail_msg("group 0 rank %d healed (%s): it voted no on a step group 1 committed", r,
                     p->role);
        assert_true(rp_log_lines(p->log) == steps);
    }
    rp_rm_rf(j.dir);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_steady_path_leaves_etcd),
        cmocka_unit_test(test_steady_stops_without_etcd),
        cmocka_unit_test(test_steady_hung_rank),
        cmocka_unit_test(test_delegate_leader_hung),
        cmocka_unit_test(test_late_vote_outlasts_other_group),
    };
    if (getenv("TEST_FILTER") != NULL)
        cmocka_set_test_filter(getenv("TEST_FILTER"));
    return cmocka_run_group_tests(tests, rp_setup, rp_teardown);
}
