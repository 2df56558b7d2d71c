/*
 * Spares end to end (docs/RUNTIME.md, "Spares"): real etcd, real UCX on
 * loopback, jobs of examples/train_mlp (3 groups x 2 ranks) as real
 * processes, and spares (GRAFT_SPARE=1) started beside them. No
 * replacement is started on a failure unless a test says so: a spare takes
 * the dead rank's slot by compare-and-swap once its lease lapsed, pulls the
 * state and the job ends bit-identical to the fault-free run. The cases:
 * a whole group replaced by a spare group; two groups dying with one spare
 * group (one slot per rank is filled, the rest wait for a later spawn); a
 * spare killed the moment it took a slot (another spare takes it after);
 * etcd restarting while a spare takes a slot; an orchestrator evicting a
 * rank it saw die, so the spare need not wait for the lease to lapse.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <inttypes.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <graft/graft.h>
#include <graft/membership.h>

#include "runtime_procs.h"

static const char *const flags[] = {"--steps", "40", "--step-delay-ms", "20", NULL};
#define STEPS 40

/* Wait until a process not in @p old_pids holds slot (group, rank). */
static int wait_slot_taken(graft_membership_t *obs, int group, int rank, int old_pid,
                           double timeout_s)
{
    double end = rp_now_s() + timeout_s;
    for (;;) {
        int pid = rp_slot_pid(obs, group, rank);
        if (pid != 0 && pid != old_pid)
            return pid;
        if (rp_now_s() > end)
            fail_msg("slot (%d, %d) not taken within %.0f s", group, rank, timeout_s);
        usleep(5000);
    }
}

static proc_t *proc_of_pid(job_t *j, int pid)
{
    for (int i = 0; i < j->n; i++)
        if (j->p[i].pid == pid)
            return &j->p[i];
    fail_msg("pid %d is none of the job's processes", pid);
    return NULL;
}

static void start_job(job_t *j, const char *name, int spares_per_rank)
{
    rp_job_init(j, name);
    rp_spawn_all(j, flags);
    for (int s = 0; s < spares_per_rank; s++)
        for (int r = 0; r < R; r++)
            rp_spawn_spare(j, r, flags);
}

/* A whole group dies; the spare group takes its two slots, with no process
 * started after the failure, and the job ends bit-identical. An unpromoted
 * spare would have said "spare unused": both were needed here. */
static void test_spare_group_replaces_dead_group(void **state)
{
    (void)state;
    job_t j;
    start_job(&j, "spare-group", 1);
    graft_membership_t *obs = rp_observe(j.name, R);
    rp_wait_spares(obs, R, 60);
    rp_wait_log(&j.p[1 * R + 0], 5, 60);
    int old0 = j.p[1 * R + 0].pid, old1 = j.p[1 * R + 1].pid;
    rp_kill_proc(&j.p[1 * R + 0]);
    rp_kill_proc(&j.p[1 * R + 1]);
    int n_before = j.n;
    proc_t *s0 = proc_of_pid(&j, wait_slot_taken(obs, 1, 0, old0, 30));
    proc_t *s1 = proc_of_pid(&j, wait_slot_taken(obs, 1, 1, old1, 30));
    assert_true(s0->spare && s0->rank == 0);
    assert_true(s1->spare && s1->rank == 1);
    assert_int_equal(rp_spares_registered(obs), 0);
    rp_wait_all(&j, 120);
    assert_int_equal(j.n, n_before); /* nothing was spawned */
    assert_int_equal(rp_spare_group(s0), 1);
    assert_int_equal(rp_spare_group(s1), 1);
    int recovered = rp_check_final(&j, STEPS);
    assert_int_equal(recovered, 2);
    rp_check_logs(&j, STEPS);
    graft_membership_destroy(obs);
    rp_rm_rf(j.dir);
}

/* How many of rank r's slots in groups 1 and 2 a process outside
 * dead[][r] (the killed ones) holds. */
static int live_held(graft_membership_t *obs, int r, int dead[2][R])
{
    int n = 0;
    for (int g = 1; g <= 2; g++) {
        int pid = rp_slot_pid(obs, g, r);
        n += pid != 0 && pid != dead[0][r] && pid != dead[1][r];
    }
    return n;
}

/* Two groups die at once with one spare group: each rank's spare takes one
 * of its two vacant slots (never both), the other slot of that rank stays
 * vacant until a spawn, here spares started 4 s later as an orchestrator
 * would; the job ends bit-identical. */
static void test_two_groups_die_one_spare(void **state)
{
    (void)state;
    job_t j;
    start_job(&j, "spare-two-die", 1);
    graft_membership_t *obs = rp_observe(j.name, R);
    rp_wait_spares(obs, R, 60);
    rp_wait_log(&j.p[0], 5, 60);
    int dead[2][R];
    for (int g = 1; g <= 2; g++)
        for (int r = 0; r < R; r++) {
            dead[g - 1][r] = j.p[g * R + r].pid;
            rp_kill_proc(&j.p[g * R + r]);
        }
    double killed = rp_now_s();
    /* Both spares promoted (the leases lapse within the 2 s TTL); each
     * holds one of its rank's two slots. A killed rank's record may still
     * be there for a moment after the other's lapsed: only live ones count. */
    rp_wait_spares(obs, 0, 30);
    for (int r = 0; r < R; r++) {
        double end = rp_now_s() + 10;
        int held = 0;
        while ((held = live_held(obs, r, dead)) == 0 && rp_now_s() < end)
            usleep(20000);
        assert_int_equal(held, 1);
    }
    /* Nothing else fills the other slots until the spawn. */
    while (rp_now_s() < killed + 4.0) {
        for (int r = 0; r < R; r++)
            assert_int_equal(live_held(obs, r, dead), 1);
        usleep(100000);
    }
    for (int r = 0; r < R; r++)
        rp_spawn_spare(&j, r, flags);
    rp_wait_all(&j, 120);
    for (int i = 0; i < j.n; i++)
        if (j.p[i].spare)
            assert_true(rp_spare_group(&j.p[i]) == 1 || rp_spare_group(&j.p[i]) == 2);
    int recovered = rp_check_final(&j, STEPS);
    assert_int_equal(recovered, 4);
    rp_check_logs(&j, STEPS);
    graft_membership_destroy(obs);
    rp_rm_rf(j.dir);
}

/* A spare killed the moment its promotion shows in etcd (before it pulled
 * anything): its lease lapses, the slot is vacant again, and the second
 * spare of that rank takes it. */
static void test_spare_dies_while_promoted(void **state)
{
    (void)state;
    job_t j;
    start_job(&j, "spare-dies", 2);
    graft_membership_t *obs = rp_observe(j.name, R);
    rp_wait_spares(obs, 2 * R, 60);
    rp_wait_log(&j.p[2 * R + 1], 5, 60);
    int old = j.p[2 * R + 1].pid;
    rp_kill_proc(&j.p[2 * R + 1]);
    proc_t *first = proc_of_pid(&j, wait_slot_taken(obs, 2, 1, old, 30));
    assert_true(first->spare);
    rp_kill_proc(first);
    proc_t *second = proc_of_pid(&j, wait_slot_taken(obs, 2, 1, first->pid, 30));
    assert_true(second->spare && second != first && second->rank == 1);
    rp_wait_all(&j, 120);
    assert_int_equal(rp_spare_group(second), 2);
    int recovered = rp_check_final(&j, STEPS);
    assert_int_equal(recovered, 1);
    rp_check_logs(&j, STEPS);
    /* The rank-0 spares were never needed and ended by themselves. */
    int unused = 0;
    for (int i = 0; i < j.n; i++)
        unused += j.p[i].spare && rp_file_contains(j.p[i].out, "spare unused");
    assert_int_equal(unused, 2);
    graft_membership_destroy(obs);
    rp_rm_rf(j.dir);
}

/* etcd goes down the moment the dead rank's record lapses, which is when
 * the spare's compare-and-swap is due, and comes back a second later: the
 * spare takes the slot once (or had taken it), and the job ends
 * bit-identical. */
static void test_etcd_restart_during_promotion(void **state)
{
    (void)state;
    job_t j;
    start_job(&j, "spare-etcd", 1);
    graft_membership_t *obs = rp_observe(j.name, R);
    rp_wait_spares(obs, R, 60);
    rp_wait_log(&j.p[1 * R + 0], 5, 60);
    int old = j.p[1 * R + 0].pid;
    rp_kill_proc(&j.p[1 * R + 0]);
    double end = rp_now_s() + 30;
    while (rp_slot_pid(obs, 1, 0) == old) {
        assert_true(rp_now_s() < end);
        usleep(2000);
    }
    assert_int_equal(graft_etcd_server_kill(rtf_etcd.server), GRAFT_OK);
    usleep(1000000);
    assert_int_equal(graft_etcd_server_restart(rtf_etcd.server), GRAFT_OK);
    proc_t *s = proc_of_pid(&j, wait_slot_taken(obs, 1, 0, old, 60));
    assert_true(s->spare && s->rank == 0);
    rp_wait_all(&j, 180);
    assert_int_equal(rp_spare_group(s), 1);
    int recovered = rp_check_final(&j, STEPS);
    assert_int_equal(recovered, 1);
    rp_check_logs(&j, STEPS);
    graft_membership_destroy(obs);
    rp_rm_rf(j.dir);
}

/* An orchestrator that saw the process die evicts it (its lease revoked)
 * instead of waiting for the lease to lapse. Only the dead process's record
 * is touched: a wrong pid, or the spare that took the slot, is refused. */
static void test_evict_dead_rank(void **state)
{
    (void)state;
    job_t j;
    start_job(&j, "spare-evict", 1);
    graft_membership_t *obs = rp_observe(j.name, R);
    rp_wait_spares(obs, R, 60);
    rp_wait_log(&j.p[0], 5, 60);
    char host[256];
    assert_int_equal(gethostname(host, sizeof(host)), 0);
    proc_t *victim = &j.p[0 * R + 1];
    int old = victim->pid;
    /* A live rank is no one's to evict. */
    assert_int_equal(graft_membership_evict(obs, 0, 1, host, old + 1), GRAFT_ESTATE);
    assert_int_equal(graft_membership_evict(obs, 0, 1, "not-this-host", old), GRAFT_ESTATE);
    assert_int_equal(rp_slot_pid(obs, 0, 1), old);
    rp_kill_proc(victim);
    assert_int_equal(graft_membership_evict(obs, 0, 1, host, old), GRAFT_OK);
    proc_t *s = proc_of_pid(&j, wait_slot_taken(obs, 0, 1, old, 30));
    assert_true(s->spare);
    graft_status_t again = graft_membership_evict(obs, 0, 1, host, old);
    assert_true(again == GRAFT_ESTATE || again == GRAFT_ENOTFOUND);
    assert_int_equal(rp_slot_pid(obs, 0, 1), s->pid);
    rp_wait_all(&j, 120);
    assert_int_equal(rp_check_final(&j, STEPS), 1);
    rp_check_logs(&j, STEPS);
    graft_membership_destroy(obs);
    rp_rm_rf(j.dir);
}

/* A spare built with another region table (here a 1 MiB blob the job's
 * ranks do not have) would take a slot no donor serves: it stays a spare,
 * says why, and a right one takes the slot; the wrong one ends unused. */
static void test_spare_with_other_layout_stays_out(void **state)
{
    (void)state;
    job_t j;
    rp_job_init(&j, "spare-layout");
    j.capture_err = true;
    rp_spawn_all(&j, flags);
    const char *other[] = {"--steps", "40", "--step-delay-ms", "20", "--blob-mib", "1", NULL};
    proc_t *wrong = rp_spawn_spare(&j, 0, other);
    graft_membership_t *obs = rp_observe(j.name, R);
    rp_wait_spares(obs, 1, 60);
    rp_wait_log(&j.p[2 * R + 0], 5, 60);
    char host[256];
    assert_int_equal(gethostname(host, sizeof(host)), 0);
    int old = j.p[2 * R + 0].pid;
    rp_kill_proc(&j.p[2 * R + 0]);
    assert_int_equal(graft_membership_evict(obs, 2, 0, host, old), GRAFT_OK);
    double end = rp_now_s() + 10;
    while (rp_slot_pid(obs, 2, 0) == old && rp_now_s() < end)
        usleep(2000); /* the observer's watch brings the eviction */
    end = rp_now_s() + 2.0;
    while (rp_now_s() < end) {
        assert_int_equal(rp_slot_pid(obs, 2, 0), 0);
        usleep(50000);
    }
    assert_true(rp_file_contains(wrong->err, "differs from rank 0's live members'"));
    proc_t *right = rp_spawn_spare(&j, 0, flags);
    assert_int_equal(wait_slot_taken(obs, 2, 0, 0, 60), right->pid);
    rp_wait_all(&j, 120);
    assert_true(rp_file_contains(wrong->out, "spare unused"));
    assert_int_equal(rp_check_final(&j, STEPS), 1);
    rp_check_logs(&j, STEPS);
    graft_membership_destroy(obs);
    rp_rm_rf(j.dir);
}

/* Groups of spares (GRAFT_SPARE_GROUP, the ranks of one world): two groups
 * die whole, and each takes all the slots of one of them, never a slot of
 * each, as the ranks' lone spares may. */
static void test_spare_groups_stay_whole(void **state)
{
    (void)state;
    job_t j;
    rp_job_init(&j, "spare-worlds");
    rp_spawn_all(&j, flags);
    proc_t *sg[2][R];
    for (int r = 0; r < R; r++) {
        sg[0][r] = rp_spawn_spare_in(&j, "world-a", r, flags);
        sg[1][r] = rp_spawn_spare_in(&j, "world-b", r, flags);
    }
    graft_membership_t *obs = rp_observe(j.name, R);
    rp_wait_spares(obs, 2 * R, 60);
    rp_wait_log(&j.p[0], 5, 60);
    char host[256];
    assert_int_equal(gethostname(host, sizeof(host)), 0);
    for (int g = 1; g <= 2; g++)
        for (int r = 0; r < R; r++) {
            int pid = j.p[g * R + r].pid;
            rp_kill_proc(&j.p[g * R + r]);
            assert_int_equal(graft_membership_evict(obs, g, r, host, pid), GRAFT_OK);
        }
    rp_wait_spares(obs, 0, 30);
    for (int g = 1; g <= 2; g++) {
        proc_t *p0 = proc_of_pid(&j, wait_slot_taken(obs, g, 0, 0, 30));
        proc_t *p1 = proc_of_pid(&j, wait_slot_taken(obs, g, 1, 0, 30));
        int w = p0 == sg[0][0] ? 0 : 1;
        assert_ptr_equal(p0, sg[w][0]);
        assert_ptr_equal(p1, sg[w][1]); /* the same world's rank 1 */
    }
    rp_wait_all(&j, 120);
    for (int w = 0; w < 2; w++)
        assert_int_equal(rp_spare_group(sg[w][0]), rp_spare_group(sg[w][1]));
    assert_int_equal(rp_check_final(&j, STEPS), 4);
    rp_check_logs(&j, STEPS);
    graft_membership_destroy(obs);
    rp_rm_rf(j.dir);
}

/* A group that dies before its first commit wrote no group_progress
 * record, but the first quorum formed with it: a spare takes its slots
 * (without the quorum's word the slot would wait for a spawn forever). */
static void test_spare_fills_group_dead_before_first_commit(void **state)
{
    (void)state;
    job_t j;
    rp_job_init(&j, "spare-early");
    const char *die[] = {"--steps", "40", "--step-delay-ms", "20", "--die-before-vote", "0",
                         NULL};
    graft_membership_t *obs = rp_observe(j.name, R);
    for (int r = 0; r < R; r++)
        rp_spawn_spare(&j, r, flags);
    rp_wait_spares(obs, R, 60);
    for (int g = 0; g < G; g++)
        for (int r = 0; r < R; r++)
            rp_spawn(&j, g, r, g == 2 ? die : flags);
    rp_wait_proc(&j.p[R + 2 * R], 60); /* group 2 rank 0 died at step 0 */
    proc_t *s0 = proc_of_pid(&j, wait_slot_taken(obs, 2, 0, j.p[R + 2 * R].pid, 30));
    assert_true(s0->spare);
    rp_wait_all(&j, 120);
    assert_int_equal(rp_spare_group(&j.p[0]), 2);
    assert_int_equal(rp_spare_group(&j.p[1]), 2);
    assert_int_equal(rp_check_final(&j, STEPS), 2);
    rp_check_logs(&j, STEPS);
    graft_membership_destroy(obs);
    rp_rm_rf(j.dir);
}

/* Follow spares (docs/RUNTIME.md, "Follow spares"): a whole group dies
 * while each rank's follower holds the job's step. The survivors wait for
 * the group (strict mode) and serve that step to the followers meanwhile;
 * each follower takes its slot once the lease lapsed and joins without a
 * pull: no heal in its role log, no recovery, and the job ends
 * bit-identical to the fault-free run. */
static void test_follow_spares_join_without_pull(void **state)
{
    (void)state;
    job_t j;
    rp_job_init(&j, "spare-follow");
    rp_spawn_all(&j, flags);
    j.extra_env[0] = "GRAFT_SPARE_FOLLOW=1";
    for (int r = 0; r < R; r++)
        rp_spawn_spare(&j, r, flags);
    j.extra_env[0] = NULL;
    graft_membership_t *obs = rp_observe(j.name, R);
    rp_wait_spares(obs, R, 60);
    rp_wait_log(&j.p[1 * R + 0], 5, 60);
    int old[R];
    for (int r = 0; r < R; r++) {
        old[r] = j.p[1 * R + r].pid;
        rp_kill_proc(&j.p[1 * R + r]);
    }
    proc_t *s[R];
    for (int r = 0; r < R; r++) {
        s[r] = proc_of_pid(&j, wait_slot_taken(obs, 1, r, old[r], 30));
        assert_true(s[r]->spare && s[r]->rank == r);
    }
    rp_wait_all(&j, 120);
    for (int r = 0; r < R; r++) {
        uint64_t step, rec;
        char hash[17], start[16];
        rp_read_final(s[r], &step, hash, start, &rec);
        if (rec != 0 || rp_file_contains(s[r]->role, " heal "))
            fail_msg("rank %d's follower pulled at its join (recoveries %" PRIu64 "): see %s",
                     r, rec, s[r]->role);
    }
    rp_check_final(&j, STEPS);
    rp_check_logs(&j, STEPS);
    graft_membership_destroy(obs);
    rp_rm_rf(j.dir);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_spare_group_replaces_dead_group),
        cmocka_unit_test(test_two_groups_die_one_spare),
        cmocka_unit_test(test_spare_dies_while_promoted),
        cmocka_unit_test(test_etcd_restart_during_promotion),
        cmocka_unit_test(test_evict_dead_rank),
        cmocka_unit_test(test_spare_with_other_layout_stays_out),
        cmocka_unit_test(test_spare_groups_stay_whole),
        cmocka_unit_test(test_spare_fills_group_dead_before_first_commit),
        cmocka_unit_test(test_follow_spares_join_without_pull),
    };
    if (getenv("TEST_FILTER") != NULL)
        cmocka_set_test_filter(getenv("TEST_FILTER"));
    return cmocka_run_group_tests(tests, rp_setup, rp_teardown);
}
