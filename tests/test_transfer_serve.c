/*
 * What a donor serves, to whom and when: its fence counts the recipients
 * that pulled a step (and starts again when the step is served again), it
 * admits max_recipients at once and queues the rest, and it may announce a
 * step before serving it (a relay still healing) or withdraw it. Every
 * test runs in every group of tf_run_wire(); the fixture is in
 * transfer_fixture.h.
 */
#include "transfer_fixture.h"

/* One verified pull of the small layout from the fixture's donor 0, by a
 * recipient made for it. */
static void pull_small(tf_t *f)
{
    tf_recipient_create(f, tf_small_layout, TF_N_SMALL, 256u << 10, SECRET, false);
    assert_int_equal(tf_pull(f), GRAFT_OK);
    tf_recipient_destroy(f);
}

static void test_fence(void **state)
{
    tf_t *f = *state;
    tf_donor_opts_t o = tf_opts(tf_small_layout, TF_N_SMALL, 256u << 10);
    tf_donor_t *d;
    int32_t out[2];

    tf_donors_start(f, &o, 1);
    d = &f->d[0];
    tf_fence_is(d, 2, 0, GRAFT_ETIMEOUT, 0);
    pull_small(f);
    /* One recipient of two: the fence holds. */
    tf_fence_is(d, 2, 300, GRAFT_ETIMEOUT, 1);
    pull_small(f);
    tf_fence_is(d, 2, 5000, GRAFT_OK, 2);

    /* The same step served again (a job that rolled back to a checkpoint):
     * the earlier serve's recipients do not open the new fence. */
    tf_donor_ask(d, 'R', 0, 0, 10000, out);
    assert_int_equal(out[0], GRAFT_OK);
    tf_fence_is(d, 1, 0, GRAFT_ETIMEOUT, 0);
    pull_small(f);
    tf_fence_is(d, 1, 5000, GRAFT_OK, 1);
    tf_donors_stop(f, 1);
}

/* ---- admission: a donor serves max_recipients at once, queues the rest -- */

static int32_t donor_peak(tf_donor_t *d)
{
    int32_t out[2];
    tf_donor_ask(d, 'P', 0, 0, 10000, out);
    return out[0];
}

/* Three recipients at once, a donor that serves one at a time: each is
 * queued, then admitted in turn, and none times out (the connect timeout
 * restarts with each queue answer, the stall timeout counts from
 * admission); the donor never had two at once, and its fence counts all. */
static void test_queue_admits_in_turn(void **state)
{
    tf_t *f = *state;
    enum { N = 3 };
    tf_donor_opts_t o = tf_opts(tf_big_layout, TF_N_BIG, 64u << 10);
    o.max_recipients = 1;
    int pfd[2];
    pid_t kids[N - 1];

    tf_donors_start(f, &o, 1);
    f->po.connect_timeout_ms = 300;
    f->po.stall_timeout_ms = 2000;
    assert_int_equal(pipe(pfd), 0);
    for (int k = 0; k < N - 1; k++) {
        kids[k] = fork();
        assert_true(kids[k] >= 0);
        if (kids[k] == 0) {
            tf_recipient_of(f, &o);
            graft_status_t pst = tf_pull(f);
            uint64_t out[2] = {pst == GRAFT_OK && tf_recipient_matches(f),
                               f->rep.donors[0].queued_ns};
            _exit(tf_write_full(pfd[1], out, sizeof(out)) ? 0 : 5);
        }
    }
    tf_recipient_of(f, &o);
    tf_pull_verified(f);
    uint64_t queued_ns = f->rep.donors[0].queued_ns, most_queued = queued_ns;
    tf_recipient_destroy(f);
    for (int k = 0; k < N - 1; k++) {
        uint64_t out[2];
        int ws = 0;
        assert_true(tf_read_full(pfd[0], out, sizeof(out), 60000));
        assert_int_equal(out[0], 1);
        most_queued = out[1] > most_queued ? out[1] : most_queued;
        assert_int_equal(waitpid(kids[k], &ws, 0), kids[k]);
        assert_true(WIFEXITED(ws) && WEXITSTATUS(ws) == 0);
    }
    close(pfd[0]);
    close(pfd[1]);
    /* Someone waited in the queue (here about 400 ms, longer than the
     * connect timeout; test_expected_serve asserts that case). */
    print_message("# longest queue wait %.0f ms\n", most_queued / 1e6);
    assert_true(most_queued > 0);
    assert_int_equal(donor_peak(&f->d[0]), 1);
    tf_fence_is(&f->d[0], N, 10000, GRAFT_OK, N);
    tf_donors_stop(f, 1);
}

/* A donor that announced the step but serves it only later (a relay still
 * healing) keeps its recipients queued past their connect timeout; they
 * are then served. */
static void test_expected_serve(void **state)
{
    tf_t *f = *state;
    tf_donor_opts_t o = tf_opts(tf_small_layout, TF_N_SMALL, 256u << 10);
    o.expect = true;
    o.begin_after_ms = 1500;

    tf_donors_start(f, &o, 1);
    f->po.connect_timeout_ms = 500;
    tf_recipient_of(f, &o);
    tf_pull_verified(f);
    assert_true(f->rep.donors[0].queued_ns > 500ull * 1000000ull);
    tf_recipient_destroy(f);
    tf_fence_is(&f->d[0], 1, 5000, GRAFT_OK, 1);
    tf_donors_stop(f, 1);
}

/* The announcement withdrawn (the relay's own heal failed): the queued
 * recipient is refused and gives up within its connect timeout; a second
 * donor that serves gives it everything, without waiting for the queue. */
static void test_expected_serve_withdrawn(void **state)
{
    tf_t *f = *state;
    tf_donor_opts_t o = tf_opts(tf_small_layout, TF_N_SMALL, 256u << 10);
    tf_donor_opts_t ro = o;
    ro.expect = true;
    ro.withdraw_after_ms = 700;
    tf_donor_t *relay, *src;

    tf_donors_start(f, &ro, 1);
    relay = &f->d[0];
    f->po.connect_timeout_ms = 500;
    tf_recipient_of(f, &o);
    double t0 = graft_test_now_s();
    assert_int_equal(tf_pull(f), GRAFT_ENODONOR);
    assert_int_equal(f->rep.donors[0].status, GRAFT_ESTEP);
    assert_true(graft_test_now_s() - t0 < 10.0);
    tf_recipient_destroy(f);
    assert_int_equal(tf_donor_stop(relay), 0);

    /* Queued at one donor, served by the other: the pull ends when every
     * chunk is in, and the queued donor's fence counts it. */
    ro.withdraw_after_ms = 0;
    relay = tf_donor_start(f, 0, &ro);
    src = tf_donor_start(f, 1, &o);
    f->po.n_donors = 2;
    f->po.connect_timeout_ms = 5000;
    tf_recipient_of(f, &o);
    t0 = graft_test_now_s();
    tf_pull_verified(f);
    assert_true(graft_test_now_s() - t0 < 4.0);
    assert_int_equal(f->rep.donors[0].chunks, 0);
    tf_recipient_destroy(f);
    tf_fence_is(relay, 1, 5000, GRAFT_OK, 1);
    tf_fence_is(src, 1, 5000, GRAFT_OK, 1);
    assert_int_equal(tf_donor_stop(relay), 0);
    assert_int_equal(tf_donor_stop(src), 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        TF_TEST(test_fence),
        TF_TEST(test_queue_admits_in_turn),
        TF_TEST(test_expected_serve),
        TF_TEST(test_expected_serve_withdrawn),
    };
    return tf_run_wire("serve", tests, ARRAY_SIZE(tests));
}
