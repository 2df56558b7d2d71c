/*
 * The runtime end to end: real etcd, real UCX on loopback, real processes.
 * The test plays the orchestrator: it starts examples/train_mlp (3 groups x
 * 2 ranks), kills ranks with SIGKILL, starts replacements, and checks that
 * every group holds bit-identical state at every commit and that strict
 * mode ends bit-identical to a fault-free run (train_mlp --no-graft). The
 * process fixture is runtime_procs.h; the steady path's tests are in
 * test_runtime_steady.c, the API's in-process ones in test_runtime_api.c.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <fcntl.h>
#include <inttypes.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <graft/graft.h>
#include <graft/persist.h>

#include "proto/graft.pb-c.h"
#include "runtime_procs.h"

#include <jansson.h>
#include <sys/time.h>

/* Kill a rank, then another: replacements heal from the donors; strict
 * mode ends bit-identical to the fault-free run. */
static void test_kill_ranks_strict(void **state)
{
    (void)state;
    job_t j;
    const int steps = 30;
    rp_job_init(&j, "kill");
    const char *flags[] = {"--steps", "30", "--step-delay-ms", "20", NULL};
    rp_spawn_all(&j, flags);
    proc_t *victim = &j.p[1 * R + 0]; /* group 1 rank 0 */
    rp_wait_log(victim, 5, 60);
    rp_kill_proc(victim);
    proc_t *repl = rp_spawn(&j, 1, 0, flags);
    rp_wait_log(repl, 2, 60);
    proc_t *victim2 = &j.p[2 * R + 1]; /* group 2 rank 1 */
    rp_kill_proc(victim2);
    rp_spawn(&j, 2, 1, flags);
    rp_wait_all(&j, 120);
    int recovered = rp_check_final(&j, steps);
    assert_int_equal(recovered, 2);
    rp_check_logs(&j, steps);
    rp_rm_rf(j.dir);
}

static void first_heal(const proc_t *p, char *line, size_t len)
{
    FILE *f = fopen(p->role, "r");
    if (f == NULL)
        fail_msg("%s: no role log", p->role);
    while (fgets(line, (int)len, f) != NULL) {
        if (strstr(line, " heal ") != NULL) {
            fclose(f);
            return;
        }
    }
    fclose(f);
    fail_msg("%s: no heal", p->role);
}

/* A donor dies while it serves a recipient: the pull completes from the
 * other donor. The state carries a blob so the pull takes a while, and the
 * donor is killed once its transfer endpoint has begun serving the
 * replacement (its --role-log says so: the manifest is sent, reads follow),
 * not after a guessed delay: a donor killed 15 ms after its quorum was
 * usually dead before the replacement ever connected, which never
 * exercised the resume path. What tells "completed from the other donor"
 * apart from "failed and redone at the next quorum": the replacement's first
 * heal succeeded from 2 donors although the pull lost donor group 2 with
 * chunks in flight (reassigned to group 0), and no heal of it failed. */
static void test_kill_donor_during_heal(void **state)
{
    (void)state;
    job_t j;
    const int steps = 16;
    rp_job_init(&j, "donor");
    j.extra_env[0] = "GRAFT_TRANSFER_CHUNK_BYTES=65536";
    /* The test needs group 0 up to date when group 2 is killed: under
     * AddressSanitizer a 1 s vote timeout made group 0 vote no now and
     * then, so it was a recipient of group 2 too and the job rightly lost
     * its state (no up-to-date group left, no persistent tier). */
    j.extra_env[1] = "GRAFT_JOIN_TIMEOUT_MS=3000";
    const char *flags[] = {"--steps", "16", "--step-delay-ms", "20", "--blob-mib", "24", NULL};
    rp_spawn_all(&j, flags);
    /* Rank 1s, not the leaders: a leader killed during the leaders'
     * barrier may leave group 2, which heard its first message, a step
     * ahead of group 0, which waited for its second (docs/RUNTIME.md);
     * group 2 is then the only donor, and killing it loses the job. */
    proc_t *victim = &j.p[1 * R + 1];
    proc_t *donor = &j.p[2 * R + 1];
    rp_wait_log(victim, 4, 60);
    rp_kill_proc(victim);
    proc_t *repl = rp_spawn(&j, 1, 1, flags);
    double end = rp_now_s() + 60;
    while (!rp_file_contains(donor->role, " serving 1 1\n")) {
        if (rp_now_s() > end)
            fail_msg("donor group 2 never served the replacement (%s)", donor->role);
        usleep(1000);
    }
    rp_kill_proc(donor);
    /* Replace it as an orchestrator would. */
    rp_spawn(&j, 2, 1, flags);
    rp_wait_all(&j, 120);
    /* The blob changes the hash: compare groups with each other only. */
    rp_check_logs(&j, steps);
    for (int i = 0; i < j.n; i++) {
        if (WIFSIGNALED(j.p[i].status))
            continue;
        assert_true(WIFEXITED(j.p[i].status) && WEXITSTATUS(j.p[i].status) == 0);
        assert_int_equal(rp_log_lines(j.p[i].log) > 0 || i >= G * R, true);
    }
    uint64_t step, rec;
    char hash[17], start[16];
    rp_read_final(repl, &step, hash, start, &rec);
    assert_int_equal(step, (uint64_t)steps);
    assert_string_equal(start, "peer");
    assert_true(rec >= 1);

    char line[640], status[48];
    uint64_t hstep, bytes, chunks, reassigned;
    size_t donors = 0;
    double ms = 0;
    first_heal(repl, line, sizeof(line));
    if (sscanf(line, "%" SCNu64 " heal %47s %lf %zu donors, %" SCNu64 " bytes", &hstep, status,
               &ms, &donors, &bytes) != 5)
        fail_msg("unexpected heal line '%s' in %s", line, repl->role);
    if (strcmp(status, "GRAFT_OK") != 0 || donors != 2)
        fail_msg("the replacement's first heal was not a 2-donor success: %s", line);
    const char *lost = strstr(line, "; donor group 2 lost (");
    if (lost == NULL)
        fail_msg("the replacement's pull did not lose donor group 2: %s", line);
    const char *after = strstr(lost, ") after ");
    assert_non_null(after);
    assert_int_equal(sscanf(after, ") after %" SCNu64 " chunks, %" SCNu64 " reassigned",
                            &chunks, &reassigned), 2);
    /* The kill follows the donor's "serving" line, after its manifest went
     * out; on a loaded machine the recipient may not have asked it for a
     * chunk yet. The same pull still lost it and finished from the other
     * donor (checked above and by recovery_failures below); the chunk-level
     * resume is then not exercised here (test_transfer_faults' failover tests
     * assert it), so say so rather than fail. */
    if (reassigned == 0 && chunks == 0)
        print_message("donor group 2 was lost before the pull read from it (%s)", line);
    print_message("the replacement's heal: %s", line);
    trainer_metrics_t m;
    rp_read_metrics(repl, &m);
    assert_int_equal(m.recovery_failures, 0);
    rp_rm_rf(j.dir);
}

/* Every group dies at step 12; restarted, they restore the newest valid
 * checkpoint (step 10 is corrupted first, so step 5) and end identical to
 * the fault-free run. */
static void test_kill_all_restore(void **state)
{
    (void)state;
    job_t j;
    const int steps = 18;
    char root[300], env_root[340];
    rp_job_init(&j, "restore");
    snprintf(root, sizeof(root), "%s/ckpt", j.dir);
    snprintf(env_root, sizeof(env_root), "GRAFT_PERSIST_ROOT=%s", root);
    j.extra_env[0] = env_root;
    j.extra_env[1] = "GRAFT_PERSIST_EVERY=5";
    j.extra_env[2] = "GRAFT_PERSIST_KEEP_LAST=5";
    const char *dying[] = {"--steps", "18", "--die-at-step", "13", "--step-delay-ms", "40", NULL};
    rp_spawn_all(&j, dying);
    (void)rp_wait_job_lost(&j, 120, 5.0);
    for (int i = 0; i < j.n; i++)
        assert_true(WIFSIGNALED(j.p[i].status));
    /* As an orchestrator would, restart once the dead members' leases are
     * gone: their records would otherwise look like live donors. */
    usleep(2600 * 1000);

    /* Both checkpoints are complete. */
    graft_persist_entry_t e;
    assert_int_equal(graft_persist_verify(root, 10, GRAFT_PERSIST_VERIFY_FULL, &e), GRAFT_OK);
    assert_int_equal(graft_persist_verify(root, 5, GRAFT_PERSIST_VERIFY_FULL, &e), GRAFT_OK);
    /* Corrupt step 10's shard of rank 1: restore must skip it. */
    char shard[400];
    snprintf(shard, sizeof(shard), "%s/step-%020d/shard-1-of-2", root, 10);
    FILE *f = fopen(shard, "r+b");
    assert_non_null(f);
    assert_int_equal(fseek(f, 200, SEEK_SET), 0);
    int c = fgetc(f);
    assert_int_equal(fseek(f, 200, SEEK_SET), 0);
    fputc(c ^ 0x40, f);
    fclose(f);

    /* The restarted processes are appended to the same job (the killed
     * ones are skipped by the checks; their logs must agree too). */
    job_t *k = &j;
    int first_new = k->n;
    const char *flags[] = {"--steps", "18", NULL};
    rp_spawn_all(k, flags);
    rp_wait_all(k, 120);
    rp_check_final(k, steps);
    rp_check_logs(k, steps);
    /* The restarted processes started from step 5. */
    rp_check_restarted_from(k, first_new, 6);
    rp_rm_rf(j.dir);
}

/* One rank's state is corrupted after step 7: the drift check at step 10
 * names the region, that group votes no, heals from the others at the
 * next quorum, and every group ends identical to the fault-free run. */
static void test_drift_detected_and_healed(void **state)
{
    (void)state;
    job_t j;
    const int steps = 14;
    rp_job_init(&j, "drift");
    j.extra_env[0] = "GRAFT_DRIFT_CHECK_EVERY=5";
    const char *flags[] = {"--steps", "14", NULL};
    const char *bad[] = {"--steps", "14", "--corrupt-at-step", "7", NULL};
    for (int g = 0; g < G; g++)
        for (int r = 0; r < R; r++)
            rp_spawn(&j, g, r, g == 1 && r == 0 ? bad : flags);
    rp_wait_all(&j, 120);
    rp_check_final(&j, steps);
    /* The metrics line: every rank ran the checks; the corrupted rank saw
     * the mismatch, and so did rank 0 of the other groups. */
    for (int i = 0; i < j.n; i++) {
        FILE *f = fopen(j.p[i].out, "r");
        char line[256];
        uint64_t commits, failed, checks, mism, restores;
        assert_non_null(f);
        assert_non_null(fgets(line, sizeof(line), f));
        assert_non_null(fgets(line, sizeof(line), f));
        fclose(f);
        assert_int_equal(sscanf(line, "metrics commits %" SCNu64 " commits_failed %" SCNu64
                                " drift_checks %" SCNu64 " drift_mismatches %" SCNu64
                                " restores %" SCNu64, &commits, &failed, &checks, &mism,
                                &restores), 5);
        assert_true(checks >= 2);
        if (j.p[i].rank == 0)
            assert_int_equal(mism, 1);
        else
            assert_int_equal(mism, 0);
        if (j.p[i].group == 1)
            assert_true(failed >= 1);
    }
    rp_rm_rf(j.dir);
}

/* Elastic mode: a group loses a rank and the others go on without it;
 * the replacement heals from them. Every commit any group logged agrees,
 * and group 0 takes a checkpoint on demand (graft_checkpoint_now). */
static void test_elastic_and_checkpoint_now(void **state)
{
    (void)state;
    job_t j;
    const int steps = 40;
    char root[300], env_root[340];
    rp_job_init(&j, "elastic");
    snprintf(root, sizeof(root), "%s/ckpt", j.dir);
    snprintf(env_root, sizeof(env_root), "GRAFT_PERSIST_ROOT=%s", root);
    j.extra_env[0] = "GRAFT_MODE=elastic";
    j.extra_env[1] = "GRAFT_MIN_GROUPS=2";
    j.extra_env[2] = env_root;
    j.extra_env[3] = "GRAFT_PERSIST_EVERY=1000";
    const char *flags[] = {"--steps", "40", "--step-delay-ms", "20", NULL};
    const char *ckpt[] = {"--steps", "40", "--step-delay-ms", "20", "--checkpoint-at", "4",
                          NULL};
    for (int g = 0; g < G; g++)
        for (int r = 0; r < R; r++)
            rp_spawn(&j, g, r, g == 0 ? ckpt : flags);
    proc_t *victim = &j.p[2 * R + 1];
    rp_wait_log(victim, 6, 60);
    rp_kill_proc(victim);
    /* The others keep committing without group 2 before it is replaced. */
    int before = rp_log_lines(j.p[0].log);
    rp_wait_log(&j.p[0], before + 3, 60);
    rp_spawn(&j, 2, 1, flags);
    rp_wait_all(&j, 120);
    rp_check_final(&j, steps);
    rp_check_logs(&j, steps);
    assert_int_equal(graft_persist_verify(root, 4, GRAFT_PERSIST_VERIFY_FULL, NULL), GRAFT_OK);
    /* The checkpoint record for tools. */
    char key[160];
    graft_etcd_kv_t kv;
    snprintf(key, sizeof(key), "/graft/%s/checkpoints/%020d", j.name, 4);
    assert_int_equal(graft_etcd_get(rtf_etcd.client, key, &kv, NULL), GRAFT_OK);
    graft_etcd_kv_clear(&kv);
}

/*
 * The persistent tier's shard rotation and the checkpoint record: 3 groups
 * x 2 ranks, a checkpoint every 5 steps (at quorum steps 5, 10, 15) and
 * the final one of step 16 (train_mlp ends with graft_finish()), no
 * failures, so the members are always {0, 1, 2}. Shard r of a scheduled
 * step s must be written by group (s/5 + r) % 3 (docs/RUNTIME.md), as the
 * manifest's sidecar records per shard; the manifest by rank 0 of the
 * writer of shard 0; every shard of the final one by group (16/5) % 3; and
 * etcd holds one record per checkpoint with its step, the root and status
 * "complete".
 */
static void test_persist_rotation_and_record(void **state)
{
    (void)state;
    job_t j;
    const int steps = 16, every = 5, ckpts[] = {5, 10, 15, 16};
    char root[300], env_root[340];
    struct timeval tv;
    gettimeofday(&tv, NULL);
    uint64_t t_start_ms = (uint64_t)tv.tv_sec * 1000u + (uint64_t)tv.tv_usec / 1000u;
    rp_job_init(&j, "rotation");
    snprintf(root, sizeof(root), "%s/ckpt", j.dir);
    snprintf(env_root, sizeof(env_root), "GRAFT_PERSIST_ROOT=%s", root);
    j.extra_env[0] = env_root;
    j.extra_env[1] = "GRAFT_PERSIST_EVERY=5";
    j.extra_env[2] = "GRAFT_PERSIST_KEEP_LAST=10";
    const char *flags[] = {"--steps", "16", NULL};
    rp_spawn_all(&j, flags);
    rp_wait_all(&j, 120);
    rp_check_final(&j, steps);
    gettimeofday(&tv, NULL);
    uint64_t t_end_ms = (uint64_t)tv.tv_sec * 1000u + (uint64_t)tv.tv_usec / 1000u;

    for (size_t c = 0; c < sizeof(ckpts) / sizeof(ckpts[0]); c++) {
        int s = ckpts[c];
        assert_int_equal(graft_persist_verify(root, (uint64_t)s, GRAFT_PERSIST_VERIFY_FULL, NULL),
                         GRAFT_OK);
        /* Which group wrote which shard: the manifest's sidecar. */
        char path[400];
        snprintf(path, sizeof(path), "%s/step-%020d/manifest.json", root, s);
        json_error_t jerr;
        json_t *m = json_load_file(path, 0, &jerr);
        if (m == NULL)
            fail_msg("%s: %s", path, jerr.text);
        assert_int_equal(json_integer_value(json_object_get(m, "step")), s);
        json_t *shards = json_object_get(m, "shards");
        assert_int_equal(json_array_size(shards), R);
        for (size_t i = 0; i < json_array_size(shards); i++) {
            json_t *sh = json_array_get(shards, i);
            int r = (int)json_integer_value(json_object_get(sh, "rank"));
            int by = (int)json_integer_value(json_object_get(sh, "written_by_group"));
            assert_true(r >= 0 && r < R);
            int want = s == steps ? (s / every) % G : (s / every + r) % G; /* final: one group */
            if (by != want)
                fail_msg("step %d shard %d written by group %d, not group %d", s, r, by, want);
        }
        json_decref(m);

        /* The record for tools: step, location, status. */
        char key[200];
        graft_etcd_kv_t kv;
        snprintf(key, sizeof(key), "/graft/%s/checkpoints/%020d", j.name, s);
        assert_int_equal(graft_etcd_get(rtf_etcd.client, key, &kv, NULL), GRAFT_OK);
        Graft__CheckpointRecord *rec =
            graft__checkpoint_record__unpack(NULL, kv.value_len, (const uint8_t *)kv.value);
        graft_etcd_kv_clear(&kv);
        assert_non_null(rec);
        assert_int_equal(rec->step, (uint64_t)s);
        assert_string_equal(rec->location, root);
        assert_string_equal(rec->status, "complete");
        assert_true(rec->unix_ms >= t_start_ms && rec->unix_ms <= t_end_ms);
        graft__checkpoint_record__free_unpacked(rec, NULL);
    }
    /* Those four and no other. */
    char prefix[200];
    graft_etcd_range_opts_t ro = {.prefix = true, .count_only = true};
    graft_etcd_range_result_t res;
    memset(&res, 0, sizeof(res));
    snprintf(prefix, sizeof(prefix), "/graft/%s/checkpoints/", j.name);
    assert_int_equal(graft_etcd_range(rtf_etcd.client, prefix, &ro, &res), GRAFT_OK);
    assert_int_equal(res.count, 4);
    graft_etcd_range_result_clear(&res);

    /* Each process counted what it wrote: rank r of group g the shards
     * whose rotation names it, rank 0 of the writer of shard 0 the
     * manifest. The trainer calls graft_checkpoint_wait() before it prints
     * its metrics, so step 15's background part is counted too. */
    for (int i = 0; i < j.n; i++) {
        const proc_t *p = &j.p[i];
        trainer_metrics_t mt;
        uint64_t w = 0, c = 0;
        rp_read_metrics(p, &mt);
        for (int s = 5; s <= 15; s += every) {
            w += (s / every + p->rank) % G == p->group;
            c += p->rank == 0 && (s / every) % G == p->group;
        }
        w += (steps / every) % G == p->group; /* the final one: its writer group's */
        c += p->rank == 0 && (steps / every) % G == p->group;
        if (mt.checkpoints_written != w || mt.checkpoints_committed != c)
            fail_msg("group %d rank %d wrote %" PRIu64 " shards and %" PRIu64 " manifests, "
                     "not %" PRIu64 " and %" PRIu64, p->group, p->rank, mt.checkpoints_written,
                     mt.checkpoints_committed, w, c);
    }
    rp_rm_rf(j.dir);
}

/* ------------------------------------------ no up-to-date group left --- */

/* The restores counter of a trainer's metrics line. */
static uint64_t read_restores(const proc_t *p)
{
    FILE *f = fopen(p->out, "r");
    char line[256];
    uint64_t commits, failed, checks, mism, restores = 0;
    assert_non_null(f);
    assert_non_null(fgets(line, sizeof(line), f));
    assert_non_null(fgets(line, sizeof(line), f));
    fclose(f);
    assert_int_equal(sscanf(line, "metrics commits %" SCNu64 " commits_failed %" SCNu64
                            " drift_checks %" SCNu64 " drift_mismatches %" SCNu64
                            " restores %" SCNu64, &commits, &failed, &checks, &mism, &restores),
                     5);
    return restores;
}

#define LOST_STEPS 16
#define LOST_BLOB_MIB 8

/* Wait until the last line of @p's hash log is of step @step. */
static void wait_log_step(const proc_t *p, uint64_t step, double timeout_s)
{
    double end = rp_now_s() + timeout_s;
    for (;;) {
        char line[128], last[128] = "";
        uint64_t got = 0;
        FILE *f = fopen(p->log, "r");
        while (f != NULL && fgets(line, sizeof(line), f) != NULL)
            memcpy(last, line, sizeof(last));
        if (f != NULL)
            fclose(f);
        if (sscanf(last, "%" SCNu64, &got) == 1 && got == step)
            return;
        if (rp_now_s() > end) {
            rp_print_err_tail(p);
            fail_msg("%s never logged step %" PRIu64 " (last line: %s)", p->log, step, last);
        }
        usleep(10000);
    }
}

/* Elastic job of groups 0 and 1 (2 ranks each); group 1 kills itself as
 * soon as it serves. Rank 0 of group 0 is killed and replaced: group 0
 * becomes a recipient, its only donor dies during the heal, and no
 * up-to-date group is left. Returns with group 1 dead and group 0's two
 * processes (old rank 1, the replacement rank 0) finished. */
static void run_donors_lost(job_t *j, proc_t **rank1_p, proc_t **repl_p)
{
    const char *flags[] = {"--steps", "16", "--step-delay-ms", "20", "--blob-mib", "8", NULL};
    /* --serve-at 2: group 0 holds at step 2 until group 1 has joined and
     * pulled from it. Without it, group 0 could finish its 16 steps before
     * group 1's processes had started (about 0.5 s each with UCX 1.22),
     * and group 1 then found no state to join. */
    const char *first[] = {"--steps", "16", "--step-delay-ms", "20", "--blob-mib", "8",
                           "--serve-at", "2", NULL};
    /* --serve-before-end: group 1 holds at its last step until it serves.
     * Without it, where the replacement is slow to start (one core under
     * AddressSanitizer), group 1 finished all 16 steps before the
     * replacement joined, never served, and exited 0. */
    const char *dying[] = {"--steps", "16", "--step-delay-ms", "20", "--blob-mib", "8",
                           "--die-when-serving", "0", "--serve-before-end", NULL};
    j->extra_env[0] = "GRAFT_MODE=elastic";
    j->extra_env[1] = "GRAFT_MIN_GROUPS=1";
    j->extra_env[2] = "GRAFT_TRANSFER_CHUNK_BYTES=65536";
    j->capture_err = true;
    /* Group 0 starts the job alone (elastic, one group is enough) and group
     * 1 joins once group 0 has committed, as a recipient: the first time
     * group 1 serves is the heal below. (Started together, group 1 could
     * form the first quorum on its own before group 0 had joined, and then
     * serve group 0's start-up sync and die there.) */
    proc_t *victim = rp_spawn(j, 0, 0, first);
    proc_t *rank1 = rp_spawn(j, 0, 1, first);
    rp_wait_log(victim, 1, 60);
    proc_t *d0 = rp_spawn(j, 1, 0, dying);
    proc_t *d1 = rp_spawn(j, 1, 1, dying);
    rp_wait_log(d0, 1, 60);
    rp_wait_log(victim, 5, 60);
    rp_kill_proc(victim);
    /* Group 1 goes on alone (elastic), past group 0's step, up to its
     * last step, where it holds (--serve-before-end). Its hash log's last
     * line is then step 15 (not "two more commits": on one core under
     * AddressSanitizer group 1 could be that close to its hold when the
     * victim died). */
    wait_log_step(d0, LOST_STEPS - 1, 60);
    proc_t *repl = rp_spawn(j, 0, 0, flags);
    rp_wait_proc(d0, 60);
    rp_wait_proc(d1, 60);
    assert_true(WIFSIGNALED(d0->status) && WTERMSIG(d0->status) == SIGKILL);
    assert_true(WIFSIGNALED(d1->status) && WTERMSIG(d1->status) == SIGKILL);
    rp_wait_proc(rank1, 60);
    rp_wait_proc(repl, 60);
    *rank1_p = rank1;
    *repl_p = repl;
}

/* Every donor dies during the heal, with the persistent tier on: both
 * ranks of the recipient group restore the newest valid checkpoint, go on
 * from its step and end identical to the fault-free run (the trainer is
 * deterministic, so the lost steps are recomputed exactly). */
static void test_donors_lost_restore(void **state)
{
    (void)state;
    job_t j;
    char root[300], env_root[340];
    rp_job_init(&j, "lost");
    snprintf(root, sizeof(root), "%s/ckpt", j.dir);
    snprintf(env_root, sizeof(env_root), "GRAFT_PERSIST_ROOT=%s", root);
    j.extra_env[3] = env_root;
    j.extra_env[4] = "GRAFT_PERSIST_EVERY=3";
    proc_t *rank1 = NULL, *repl = NULL;
    run_donors_lost(&j, &rank1, &repl);
    if (!WIFEXITED(repl->status) || WEXITSTATUS(repl->status) != 0)
        fail_msg("the replacement exited with status 0x%x (stderr %s)", repl->status, repl->err);
    rp_check_final_blob(&j, LOST_STEPS, LOST_BLOB_MIB);
    rp_check_logs(&j, LOST_STEPS);
    /* Both took the state from disk, not from a cold start. */
    assert_true(read_restores(rank1) >= 1);
    assert_true(read_restores(repl) >= 1);
    uint64_t step, rec;
    char hash[17], start[16];
    rp_read_final(repl, &step, hash, start, &rec);
    assert_string_equal(start, "restore");
    assert_true(rp_file_contains(repl->err, "restored checkpoint step"));
    rp_rm_rf(j.dir);
}

/* The same without a persistent tier: a clear error, and the recipient
 * group never commits a step on the state it could not get. */
static void test_donors_lost_no_checkpoint(void **state)
{
    (void)state;
    job_t j;
    rp_job_init(&j, "lostnp");
    proc_t *rank1 = NULL, *repl = NULL;
    run_donors_lost(&j, &rank1, &repl);
    const char *want = graft_status_string(GRAFT_ESTATELOST);
    proc_t *ps[2] = {rank1, repl};
    for (int i = 0; i < 2; i++) {
        if (!WIFEXITED(ps[i]->status) || WEXITSTATUS(ps[i]->status) != 1)
            fail_msg("group 0 rank %d exited with status 0x%x, not the error", ps[i]->rank,
                     ps[i]->status);
        if (!rp_file_contains(ps[i]->err, want) ||
            !rp_file_contains(ps[i]->err, "no persistent tier is configured"))
            fail_msg("%s does not say '%s'", ps[i]->err, want);
    }
    /* The replacement never committed; everything logged agrees. */
    assert_int_equal(rp_log_lines(repl->log), 0);
    rp_check_logs(&j, LOST_STEPS);
    rp_rm_rf(j.dir);
}

/* The ranks of a donor group disagree on their step and the one ahead
 * restores a checkpoint of the quorum's own step: it must serve, like the
 * rest of its group. Strict job of 2 groups x 2 ranks. Rank 0 of group 0 is
 * replaced and pulls from group 1, whose rank 0 kills itself as soon as it
 * serves: the replacement's heal fails, so group 0 stays behind. Rank 0 of
 * group 1 is replaced too; with no healthy group to pull from it restores
 * the newest checkpoint (step 4), while rank 1 of group 1 still holds step
 * 6. The next quorum is at step 4 with group 1 as the donor: rank 1 of
 * group 1 is ahead and restores step 4 too; if it then did not serve,
 * rank 1 of group 0 would pull from a donor that refuses the step until
 * its connect timeout and the heal would fail. */
static void test_restored_rank_serves(void **state)
{
    (void)state;
    job_t j;
    const int steps = 16, blob_mib = 8;
    char root[300], env_root[340];
    rp_job_init(&j, "rserve");
    snprintf(root, sizeof(root), "%s/ckpt", j.dir);
    snprintf(env_root, sizeof(env_root), "GRAFT_PERSIST_ROOT=%s", root);
    j.extra_env[0] = "GRAFT_GROUPS=2";
    j.extra_env[1] = env_root;
    j.extra_env[2] = "GRAFT_PERSIST_EVERY=4";
    j.capture_err = true;
    const char *flags[] = {"--steps", "16", "--step-delay-ms", "20", "--blob-mib", "8", NULL};
    const char *dying[] = {"--steps", "16", "--step-delay-ms", "20", "--blob-mib", "8",
                           "--die-when-serving", "0", NULL};
    proc_t *victim = rp_spawn(&j, 0, 0, flags);
    proc_t *g0r1 = rp_spawn(&j, 0, 1, flags);
    proc_t *g1r0 = rp_spawn(&j, 1, 0, dying);
    proc_t *g1r1 = rp_spawn(&j, 1, 1, flags);
    rp_wait_log(victim, 6, 60);
    graft_persist_entry_t e;
    double end = rp_now_s() + 30;
    while (graft_persist_verify(root, 4, GRAFT_PERSIST_VERIFY_QUICK, &e) != GRAFT_OK) {
        if (rp_now_s() > end)
            fail_msg("checkpoint step 4 never completed under %s", root);
        usleep(10000);
    }
    rp_kill_proc(victim);
    proc_t *g0r0 = rp_spawn(&j, 0, 0, flags);
    rp_wait_proc(g1r0, 60);
    assert_true(WIFSIGNALED(g1r0->status) && WTERMSIG(g1r0->status) == SIGKILL);
    proc_t *g1r0b = rp_spawn(&j, 1, 0, flags);
    rp_wait_all(&j, 120);
    rp_check_final_blob(&j, steps, blob_mib);
    rp_check_logs(&j, steps);

    /* The scenario happened: the first replacement's heal failed, the
     * second one restored, and rank 1 of group 1 restored as well. */
    trainer_metrics_t m;
    rp_read_metrics(g0r0, &m);
    assert_true(m.recovery_failures >= 1);
    uint64_t step, rec;
    char hash[17], start[16];
    rp_read_final(g1r0b, &step, hash, start, &rec);
    assert_string_equal(start, "restore");
    rp_read_metrics(g1r1, &m);
    assert_true(m.restores >= 1);
    /* What it is about: rank 1 of group 0 healed from it at once. */
    rp_read_metrics(g0r1, &m);
    if (m.recovery_failures != 0)
        fail_msg("group 0 rank 1 failed %" PRIu64 " heals (%s)", m.recovery_failures, g0r1->role);
    rp_rm_rf(j.dir);
}

/* A new job cold-starts; once it has committed steps, a new process with
 * no group to pull from and no checkpoint is an error, not a cold start —
 * without a persistent tier and with an empty one. */
static void test_progressed_job_no_cold_start(void **state)
{
    (void)state;
    job_t j;
    char empty[300], env_root[340];
    rp_job_init(&j, "progressed");
    j.extra_env[0] = "GRAFT_MODE=elastic";
    j.extra_env[1] = "GRAFT_MIN_GROUPS=1";
    j.capture_err = true;
    const char *first[] = {"--steps", "4", NULL};
    proc_t *a = rp_spawn(&j, 0, 0, first);
    proc_t *b = rp_spawn(&j, 0, 1, first);
    rp_wait_proc(a, 60);
    rp_wait_proc(b, 60);
    rp_check_final(&j, 4);
    uint64_t step, rec;
    char hash[17], start[16];
    rp_read_final(a, &step, hash, start, &rec);
    assert_string_equal(start, "cold");
    /* What says so: the progress key, a ProgressRecord of a committed step. */
    char key[160];
    graft_etcd_kv_t kv;
    snprintf(key, sizeof(key), "/graft/%s/progress", j.name);
    assert_int_equal(graft_etcd_get(rtf_etcd.client, key, &kv, NULL), GRAFT_OK);
    Graft__ProgressRecord *pr =
        graft__progress_record__unpack(NULL, kv.value_len, (const uint8_t *)kv.value);
    assert_non_null(pr);
    assert_int_equal(pr->version, 1);
    assert_true(pr->step >= 1 && pr->step <= 4);
    graft__progress_record__free_unpacked(pr, NULL);
    graft_etcd_kv_clear(&kv);

    const char *again[] = {"--steps", "8", NULL};
    const char *const want = graft_status_string(GRAFT_ESTATELOST);
    for (int round = 0; round < 2; round++) {
        if (round == 1) {
            /* A persistent tier that holds nothing. */
            snprintf(empty, sizeof(empty), "%s/empty", j.dir);
            assert_int_equal(mkdir(empty, 0755), 0);
            snprintf(env_root, sizeof(env_root), "GRAFT_PERSIST_ROOT=%s", empty);
            j.extra_env[2] = env_root;
        }
        proc_t *p0 = rp_spawn(&j, 0, 0, again);
        proc_t *p1 = rp_spawn(&j, 0, 1, again);
        rp_wait_proc(p0, 60);
        rp_wait_proc(p1, 60);
        proc_t *ps[2] = {p0, p1};
        for (int i = 0; i < 2; i++) {
            if (!WIFEXITED(ps[i]->status) || WEXITSTATUS(ps[i]->status) != 1)
                fail_msg("restart %d rank %d exited with status 0x%x, not the error", round,
                         ps[i]->rank, ps[i]->status);
            if (!rp_file_contains(ps[i]->err, want))
                fail_msg("%s does not say '%s'", ps[i]->err, want);
            if (round == 1 && !rp_file_contains(ps[i]->err, "no checkpoint verifies under"))
                fail_msg("%s does not name the empty persistent tier", ps[i]->err);
            assert_int_equal(rp_log_lines(ps[i]->log), 0);
        }
    }
    rp_rm_rf(j.dir);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_kill_ranks_strict),
        cmocka_unit_test(test_kill_donor_during_heal),
        cmocka_unit_test(test_kill_all_restore),
        cmocka_unit_test(test_drift_detected_and_healed),
        cmocka_unit_test(test_elastic_and_checkpoint_now),
        cmocka_unit_test(test_persist_rotation_and_record),
        cmocka_unit_test(test_donors_lost_restore),
        cmocka_unit_test(test_donors_lost_no_checkpoint),
        cmocka_unit_test(test_progressed_job_no_cold_start),
        cmocka_unit_test(test_restored_rank_serves),
    };
    if (getenv("TEST_FILTER") != NULL)
        cmocka_set_test_filter(getenv("TEST_FILTER"));
    return cmocka_run_group_tests(tests, rp_setup, rp_teardown);
}
