/*
 * Pulls that something interrupts: a donor killed or stopped mid-pull
 * (with malloc'ed memory and with host blocks), every donor dead, the
 * recipient itself killed, a pull cancelled, and each allocation of a pull
 * failed in turn. A peer lost mid-operation must surface as an error of
 * the peer class, or be absorbed by the donors left. Every test runs in
 * every group of tf_run_wire(); the fixture is in transfer_fixture.h.
 */
#include "transfer_fixture.h"

#include "alloc_fail.h"

#include <inttypes.h>

/* A progress callback that strikes once @at bytes are in: signals its
 * victims and, with @cancel_ep, cancels the pull. */
typedef struct injector {
    pid_t victims[3];
    int n_victims;
    int sig;
    uint64_t at;
    bool fired;
    graft_transfer_endpoint_t *cancel_ep;
} injector_t;

static void inject(uint64_t done, uint64_t total, void *arg)
{
    injector_t *in = arg;
    (void)total;
    if (in->fired || done < in->at)
        return;
    in->fired = true;
    for (int i = 0; i < in->n_victims; i++)
        kill(in->victims[i], in->sig);
    if (in->cancel_ep != NULL)
        graft_transfer_pull_cancel(in->cancel_ep);
}

static uint64_t big_total(void)
{
    uint64_t t = 0;
    for (size_t i = 0; i < TF_N_BIG; i++)
        t += tf_big_layout[i].bytes;
    return t;
}

/* Points the next pull's progress at @in, two reads in flight per donor. */
static void inject_with(tf_t *f, injector_t *in)
{
    f->po.window = 2;
    f->po.progress = inject;
    f->po.progress_arg = in;
}

/* Checks of failover_in() on the report: who finished, who was dropped,
 * and that every byte and chunk is counted once. */
static void failover_check(const graft_transfer_report_t *rep, int sig, bool host_mem)
{
    /* The healthy donors finish; on a machine loaded enough that one of
     * them also goes quiet past the stall timeout it is dropped the same way,
     * and at least one of them must have carried the pull to the end. */
    assert_true(rep->donors[0].status == GRAFT_OK ||
                rep->donors[0].status == GRAFT_EPEER_TIMEOUT);
    assert_true(rep->donors[2].status == GRAFT_OK ||
                rep->donors[2].status == GRAFT_EPEER_TIMEOUT);
    assert_true(rep->donors[0].status == GRAFT_OK || rep->donors[2].status == GRAFT_OK);
    /* Over TCP the victim is dropped; over shared memory a stopped donor's
     * memory stays readable, so it may legitimately finish its share, and
     * so may a killed one's host block, which the recipient has mapped. */
    bool shared = strcmp(getenv("UCX_TLS"), "tcp") != 0;
    if ((sig == SIGKILL && !(host_mem && shared)) || !shared)
        assert_int_equal(graft_status_class(rep->donors[1].status), GRAFT_CLASS_PEER);
    if (rep->donors[1].status != GRAFT_OK)
        assert_int_equal(graft_status_class(rep->donors[1].status), GRAFT_CLASS_PEER);
    if (sig == SIGSTOP && rep->donors[1].status != GRAFT_OK)
        assert_int_equal(rep->donors[1].status, GRAFT_EPEER_TIMEOUT);
    /* Resumed, not restarted: a dropped victim's reads in flight went back
     * to the queue for the others (reassigned), what it delivered before it
     * was stopped stays installed (its chunks count, and every byte is
     * counted exactly once across the donors). Over shared memory the
     * recipient reads a pushed chunk's bytes by itself (cma), which does
     * not wait on the victim, so it may be dropped with none of its
     * fetched chunks left unverified. */
    /* On a loaded machine the victim can be the last donor connected and
     * be struck before its first chunk is verified (the other two carried
     * the first quarter): nothing of it to keep then, which is said, and
     * no read of it need have been in flight to be reassigned (a tcp push
     * run failed so once in CI, the figures not kept: they are now). */
    if (rep->donors[1].chunks == 0)
        print_message("the victim was struck before any chunk of its was verified\n");
    if (rep->donors[1].status != GRAFT_OK && !shared && rep->donors[1].chunks > 0 &&
        rep->donors[1].reassigned == 0)
        fail_msg("the victim (%s, %" PRIu64 " chunks, %" PRIu64 " bytes) was dropped with no "
                 "read of it reassigned", graft_status_string(rep->donors[1].status),
                 rep->donors[1].chunks, rep->donors[1].bytes);
    for (int i = 0; i < 3; i += 2) {
        if (rep->donors[i].status == GRAFT_OK)
            assert_int_equal(rep->donors[i].reassigned, 0);
    }
    assert_int_equal(rep->donors[0].bytes + rep->donors[1].bytes + rep->donors[2].bytes,
                     rep->bytes);
    assert_int_equal(rep->donors[0].chunks + rep->donors[1].chunks + rep->donors[2].chunks,
                     rep->chunks);
    /* Striped: more than one donor served a share. */
    int serving = 0;
    for (int i = 0; i < 3; i++)
        serving += rep->donors[i].chunks > 0;
    assert_true(serving >= 2);
}

/* One of three donors is killed (or stopped) after a quarter of the bytes.
 * With @host_mem the donors' regions lie in host blocks: on shared memory
 * the recipient then reads them by itself, so a victim's memory may stay
 * readable after it died and it may legitimately finish its share. */
static void failover_in(tf_t *f, int sig, bool host_mem)
{
    tf_donor_opts_t o = tf_opts(tf_big_layout, TF_N_BIG, 64u << 10);
    o.host_mem = host_mem;
    injector_t in = {.n_victims = 1, .sig = sig, .at = big_total() / 4};

    tf_donors_start(f, &o, 3);
    in.victims[0] = f->d[1].pid;
    tf_recipient_of(f, &o); /* malloc'ed memory, whatever the donors' */
    inject_with(f, &in);
    f->po.stall_timeout_ms = 1500;
    assert_int_equal(tf_pull(f), GRAFT_OK);
    assert_true(in.fired);
    assert_true(f->rep.installed);
    assert_true(tf_recipient_matches(f));
    failover_check(&f->rep, sig, host_mem);
    tf_recipient_destroy(f);
    /* With host blocks on shared memory no get reaches a donor's progress
     * thread, so the stopped donor, resumed, must end cleanly. */
    bool shared = strcmp(getenv("UCX_TLS"), "tcp") != 0;
    int victim_ws = tf_donor_stop(&f->d[1]);
    if (sig == SIGSTOP && host_mem && shared)
        assert_int_equal(victim_ws, 0);
    (void)tf_donor_stop(&f->d[0]);
    (void)tf_donor_stop(&f->d[2]);
}

static void test_donor_killed(void **state)
{
    failover_in(*state, SIGKILL, false);
}

static void test_donor_stopped(void **state)
{
    failover_in(*state, SIGSTOP, false);
}

static void test_donor_killed_host_mem(void **state)
{
    failover_in(*state, SIGKILL, true);
}

/* A stopped donor resumed after it was dropped must survive (its exit
 * status is checked): with host blocks the recipient's gets never reach
 * its progress thread. */
static void test_donor_stopped_host_mem(void **state)
{
    failover_in(*state, SIGSTOP, true);
}

static void test_all_donors_dead(void **state)
{
    tf_t *f = *state;
    tf_donor_opts_t o = tf_opts(tf_big_layout, TF_N_BIG, 64u << 10);
    const graft_transfer_report_t *rep = &f->rep;
    injector_t in = {.n_victims = 2, .sig = SIGKILL, .at = big_total() / 5};

    tf_donors_start(f, &o, 2);
    for (int i = 0; i < 2; i++)
        in.victims[i] = f->d[i].pid;
    tf_recipient_of(f, &o);
    inject_with(f, &in);
    f->po.stall_timeout_ms = 1500;
    assert_int_equal(tf_pull(f), GRAFT_ENODONOR);
    assert_false(rep->installed);
    assert_int_equal(rep->status, GRAFT_ENODONOR);
    assert_true(rep->donors[0].bytes + rep->donors[1].bytes < rep->bytes);
    /* Both are reported failed. (Their reassigned counts are not checked:
     * once no donor is left the pull ends without reaping the reads that
     * the last ones had in flight.) */
    for (int i = 0; i < 2; i++)
        assert_int_equal(graft_status_class(rep->donors[i].status), GRAFT_CLASS_PEER);
    tf_recipient_destroy(f);
    for (int i = 0; i < 2; i++)
        (void)tf_donor_stop(&f->d[i]);
}

static void suicide(uint64_t done, uint64_t total, void *arg)
{
    (void)arg;
    if (done >= total / 4)
        raise(SIGKILL);
}

/* A recipient that dies mid-pull must not hurt the donor. */
static void test_recipient_killed(void **state)
{
    tf_t *f = *state;
    tf_donor_opts_t o = tf_opts(tf_big_layout, TF_N_BIG, 64u << 10);
    int ws = 0;

    /* With one-sided gets UCX 1.13 serves the reads by emulation in the
     * donor's progress thread, and a recipient that vanishes with reads
     * queued can abort the donor ("ucp_get_req_handler: Fatal"; see
     * graft_transfer_read_t and docs/TRANSFER.md). That is why push is the
     * default; only push promises a donor that outlives its recipient. */
    if (tf_read != GRAFT_TRANSFER_READ_PUSH) {
        skip();
        return;
    }
    tf_donors_start(f, &o, 1);
    pid_t child = fork();
    assert_true(child >= 0);
    if (child == 0) {
        tf_recipient_of(f, &o);
        f->po.window = 2;
        f->po.progress = suicide;
        graft_status_t st = tf_pull(f);
        _exit(st == GRAFT_OK ? 3 : 4);
    }
    assert_int_equal(waitpid(child, &ws, 0), child);
    assert_true(WIFSIGNALED(ws) && WTERMSIG(ws) == SIGKILL);
    /* The lost connection counts for the fence at once (UCX reports the
     * dead peer), not after the fence timeout. */
    int32_t st, count;
    tf_fence(&f->d[0], 1, 10000, &st, &count);
    assert_int_equal(st, GRAFT_OK);
    assert_int_equal(count, 1);

    tf_recipient_of(f, &o);
    tf_pull_verified(f);
    tf_recipient_destroy(f);
    /* The finished pull counts once, though its connection closes too. */
    tf_fence(&f->d[0], 2, 5000, &st, &count);
    assert_int_equal(st, GRAFT_OK);
    usleep(300000);
    tf_fence(&f->d[0], 3, 0, &st, &count);
    assert_int_equal(count, 2);
    tf_donors_stop(f, 1);
}

static void test_cancel(void **state)
{
    tf_t *f = *state;
    tf_donor_opts_t o = tf_opts(tf_big_layout, TF_N_BIG, 64u << 10);
    injector_t in = {.n_victims = 0, .at = big_total() / 4};

    tf_donors_start(f, &o, 1);
    tf_recipient_of(f, &o);
    in.cancel_ep = f->r.ep;
    inject_with(f, &in);
    assert_int_equal(tf_pull(f), GRAFT_ECANCELED);
    assert_false(f->rep.installed);
    /* A cancel outside a pull is a no-op; the next pull works. */
    graft_transfer_pull_cancel(f->r.ep);
    f->po.progress = NULL;
    tf_pull_verified(f);
    tf_recipient_destroy(f);
    tf_donors_stop(f, 1);
}

/* Fail each allocation of a pull in turn: the pull returns GRAFT_ENOMEM (or
 * succeeds once enough are allowed), never crashes, hangs or leaks, and the
 * donor keeps serving. */
static void test_pull_alloc_failures(void **state)
{
    tf_t *f = *state;
    tf_donor_opts_t o = tf_opts(tf_small_layout, TF_N_SMALL, 1u << 20);

    tf_donors_start(f, &o, 1);
    tf_recipient_of(f, &o);
    f->po.connect_timeout_ms = 3000;
    graft_test_alloc_fail_after(-1); /* count only */
    graft_status_t st = tf_pull(f);
    graft_test_alloc_restore();
    assert_int_equal(st, GRAFT_OK);
    int needed = graft_test_alloc_calls();
    assert_true(needed > 5);

    for (int n = 0; n < needed; n++) {
        graft_test_alloc_fail_after(n);
        st = tf_pull(f);
        graft_test_alloc_restore();
        /* The recipient's allocations failed: its own error, not the donor's. */
        if (st != GRAFT_OK)
            assert_int_equal(st, GRAFT_ENOMEM);
        assert_int_equal(f->rep.installed, st == GRAFT_OK);
    }
    tf_pull_verified(f);
    tf_recipient_destroy(f);
    tf_donors_stop(f, 1);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        TF_TEST(test_donor_killed),          TF_TEST(test_donor_stopped),
        TF_TEST(test_all_donors_dead),       TF_TEST(test_recipient_killed),
        TF_TEST(test_cancel),                TF_TEST(test_pull_alloc_failures),
        TF_TEST(test_donor_killed_host_mem), TF_TEST(test_donor_stopped_host_mem),
    };
    return tf_run_wire("faults", tests, ARRAY_SIZE(tests));
}
