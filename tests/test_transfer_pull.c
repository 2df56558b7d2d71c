/*
 * Pulls that complete, over real UCX on loopback from real donor processes:
 * from one to three donors, a donor that serves late, many small regions,
 * a GiB, two recipients at once, host blocks; and what the recipient's
 * verification catches (donors that drifted apart, a donor whose bytes
 * changed after hashing). Every test runs in every group of tf_run_wire();
 * the fixture is in transfer_fixture.h.
 */
#include "transfer_fixture.h"

static void pull_from_k(tf_t *f, int k)
{
    tf_donor_opts_t o = tf_opts(tf_small_layout, TF_N_SMALL, 256u << 10);

    tf_donors_start(f, &o, k);
    tf_recipient_of(f, &o);
    assert_int_equal(tf_pull(f), GRAFT_OK);
    assert_true(f->rep.installed);
    assert_true(tf_recipient_matches(f));
    uint64_t sum = 0;
    for (int i = 0; i < k; i++) {
        assert_int_equal(f->rep.donors[i].status, GRAFT_OK);
        tf_assert_group_transports(&f->rep.donors[i]);
        sum += f->rep.donors[i].bytes;
    }
    assert_int_equal(sum, f->rep.bytes);
    tf_recipient_destroy(f);
    tf_donors_stop(f, k);
}

static void test_pull_1_donor(void **state)
{
    pull_from_k(*state, 1);
}

static void test_pull_2_donors(void **state)
{
    pull_from_k(*state, 2);
}

static void test_pull_3_donors(void **state)
{
    pull_from_k(*state, 3);
}

/* A recipient that asks before its donor has begun serving the step (the
 * quorum reached the recipient first) waits for it instead of failing. */
static void test_donor_serves_late(void **state)
{
    tf_t *f = *state;
    tf_donor_opts_t o = tf_opts(tf_small_layout, TF_N_SMALL, 256u << 10);

    o.serve_delay_ms = 300;
    tf_donors_start(f, &o, 1);
    tf_recipient_of(f, &o);
    tf_pull_verified(f);
    assert_int_equal(f->rep.donors[0].status, GRAFT_OK);
    tf_recipient_destroy(f);
    tf_donors_stop(f, 1);
}

static void test_drift(void **state)
{
    tf_t *f = *state;
    tf_donor_opts_t o = tf_opts(tf_small_layout, TF_N_SMALL, 256u << 10);
    const graft_transfer_report_t *rep = &f->rep;

    tf_donors_start(f, &o, 1);
    o.flip_region = 1;
    o.flip_offset = (5u << 18) + 77; /* chunk 5 of "optim" */
    tf_donor_start(f, 1, &o);
    f->po.n_donors = 2;
    tf_recipient_of(f, &o);
    assert_int_equal(tf_pull(f), GRAFT_EDRIFT);
    assert_false(rep->installed);
    assert_string_equal(rep->drift.region, "optim");
    assert_int_equal(rep->drift.chunk, 5);
    assert_true((rep->drift.donor_a == 0 && rep->drift.donor_b == 1) ||
                (rep->drift.donor_a == 1 && rep->drift.donor_b == 0));
    assert_true(rep->drift.hash_a != rep->drift.hash_b);
    tf_recipient_destroy(f);
    tf_donors_stop(f, 2);
}

/* A donor whose memory changes after hashing is caught by the recipient
 * (its bytes no longer match its own hash) and its chunks refetched. */
static void test_donor_bytes_changed(void **state)
{
    tf_t *f = *state;
    tf_donor_opts_t o = tf_opts(tf_small_layout, TF_N_SMALL, 256u << 10);
    const char *addrs[2];
    int32_t out[2];

    tf_donors_start(f, &o, 2);
    usleep(300000); /* hashing of the 7 MiB is long done */
    tf_donor_ask(&f->d[1], 'M', 1, (3u << 18) + 5, 10000, out);

    addrs[0] = f->d[1].addr;
    f->po.donors = addrs;
    f->po.n_donors = 1;
    tf_recipient_of(f, &o);
    assert_int_equal(tf_pull(f), GRAFT_ENODONOR);
    assert_int_equal(f->rep.donors[0].status, GRAFT_EHASH);
    assert_false(f->rep.installed);

    addrs[1] = f->d[0].addr;
    f->po.n_donors = 2;
    assert_int_equal(tf_pull(f), GRAFT_OK);
    assert_true(f->rep.donors[0].status == GRAFT_OK || f->rep.donors[0].status == GRAFT_EHASH);
    assert_int_equal(f->rep.donors[1].status, GRAFT_OK);
    assert_true(tf_recipient_matches(f));
    tf_recipient_destroy(f);
    tf_donors_stop(f, 2);
}

/* 10,000 small regions of odd sizes (a manifest of about a megabyte, sent
 * by rendezvous) and a 1 KiB state. */
static void test_many_small_regions(void **state)
{
    tf_t *f = *state;
    enum { N = 10000 };
    static tf_region_t many[N];
    static char names[N][16];
    static const tf_region_t tiny[] = {{"kib", 1024}};

    for (int i = 0; i < N; i++) {
        snprintf(names[i], sizeof(names[i]), "r%05d", i);
        many[i].name = names[i];
        many[i].bytes = (uint64_t)((i * 7919) % 3001);
    }
    tf_donor_opts_t o = tf_opts(many, N, 4096);
    tf_donors_start(f, &o, 2);
    tf_recipient_of(f, &o);
    f->po.window = 16;
    tf_pull_verified(f);
    tf_recipient_destroy(f);
    tf_donors_stop(f, 2);

    o = tf_opts(tiny, 1, 256u << 10);
    tf_donors_start(f, &o, 1); /* the window stays 16 */
    tf_recipient_of(f, &o);
    assert_int_equal(tf_pull(f), GRAFT_OK);
    assert_int_equal(f->rep.bytes, 1024);
    assert_true(tf_recipient_matches(f));
    tf_recipient_destroy(f);
    tf_donors_stop(f, 1);
}

/* The largest pull the issue asks for: 1 GiB in two regions (one with an
 * odd size, so the last chunk of each is short) from one donor process,
 * every byte compared with the pattern the donor wrote. AddressSanitizer
 * builds pull 256 MiB instead: a GiB took 22-32 s per group there
 * (instrumented filling, hashing and comparing; 2 cores under load),
 * against 4-8 s uninstrumented. */
#ifdef __SANITIZE_ADDRESS__
#define BIG_PULL_BYTES (256ull << 20)
#else
#define BIG_PULL_BYTES (1ull << 30)
#endif
static void test_pull_1gib(void **state)
{
    tf_t *f = *state;
    static const tf_region_t gib[] = {
        {"weights", BIG_PULL_BYTES / 8 * 5 + 4097},
        {"optim", BIG_PULL_BYTES - (BIG_PULL_BYTES / 8 * 5 + 4097)},
    };
    tf_donor_opts_t o = tf_opts(gib, ARRAY_SIZE(gib), 0); /* default chunk size */
    const graft_transfer_report_t *rep = &f->rep;

    assert_int_equal(gib[0].bytes + gib[1].bytes, BIG_PULL_BYTES);
    tf_donors_start(f, &o, 1);
    tf_recipient_of(f, &o);
    assert_int_equal(tf_pull(f), GRAFT_OK);
    assert_true(rep->installed);
    assert_int_equal(rep->bytes, BIG_PULL_BYTES);
    assert_int_equal(rep->donors[0].bytes, BIG_PULL_BYTES);
    assert_int_equal(rep->chunks, rep->donors[0].chunks);
    tf_assert_group_transports(&rep->donors[0]);
    assert_int_equal(rep->chunks, (gib[0].bytes + GRAFT_TRANSFER_DEFAULT_CHUNK_BYTES - 1) /
                                          GRAFT_TRANSFER_DEFAULT_CHUNK_BYTES +
                                      (gib[1].bytes + GRAFT_TRANSFER_DEFAULT_CHUNK_BYTES - 1) /
                                          GRAFT_TRANSFER_DEFAULT_CHUNK_BYTES);
    double t0 = graft_test_now_s();
    assert_true(tf_recipient_matches(f));
    print_message("# %llu MiB pulled in %.2f s (%.2f GB/s), compared in %.2f s\n",
                  (unsigned long long)(BIG_PULL_BYTES >> 20), rep->elapsed_ns / 1e9,
                  BIG_PULL_BYTES / (rep->elapsed_ns / 1e9) / 1e9, graft_test_now_s() - t0);
    tf_recipient_destroy(f);
    tf_donors_stop(f, 1);
}

/* Two recipients pull from one donor at the same time (each connection has
 * a UCX worker of its own on the donor); both get every byte, and the
 * donor's fence counts both. */
static void test_two_recipients_at_once(void **state)
{
    tf_t *f = *state;
    tf_donor_opts_t o = tf_opts(tf_big_layout, TF_N_BIG, 64u << 10);
    int32_t st, count;
    int ws = 0;

    tf_donors_start(f, &o, 1);
    pid_t child = fork();
    assert_true(child >= 0);
    if (child == 0) {
        tf_recipient_of(f, &o);
        graft_status_t pst = tf_pull(f);
        _exit(pst == GRAFT_OK && tf_recipient_matches(f) ? 0 : 5);
    }
    tf_recipient_of(f, &o);
    tf_pull_verified(f);
    tf_recipient_destroy(f);
    assert_int_equal(waitpid(child, &ws, 0), child);
    assert_true(WIFEXITED(ws));
    assert_int_equal(WEXITSTATUS(ws), 0);
    tf_fence(&f->d[0], 2, 10000, &st, &count);
    assert_int_equal(st, GRAFT_OK);
    assert_int_equal(count, 2);
    tf_donors_stop(f, 1);
}

/* Donors and recipient with their regions in host blocks: pulls are
 * verified and complete, twice in a row (keys are unpacked per pull). */
static void test_pull_host_mem(void **state)
{
    tf_t *f = *state;
    tf_donor_opts_t o = tf_opts(tf_small_layout, TF_N_SMALL, 256u << 10);
    const graft_transfer_report_t *rep = &f->rep;

    o.host_mem = true;
    tf_donors_start(f, &o, 2);
    tf_recipient_create(f, tf_small_layout, TF_N_SMALL, 256u << 10, SECRET, true);
    for (int round = 0; round < 2; round++) {
        tf_recipient_zero(f);
        assert_int_equal(tf_pull(f), GRAFT_OK);
        assert_true(rep->installed);
        assert_true(tf_recipient_matches(f));
        assert_int_equal(rep->donors[0].status, GRAFT_OK);
        assert_int_equal(rep->donors[1].status, GRAFT_OK);
        assert_int_equal(rep->donors[0].bytes + rep->donors[1].bytes, rep->bytes);
    }
    tf_recipient_destroy(f);
    /* A recipient with malloc'ed memory reads host blocks as well. */
    tf_recipient_of(f, &o);
    f->po.n_donors = 1;
    tf_pull_verified(f);
    tf_recipient_destroy(f);
    tf_donors_stop(f, 2);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        TF_TEST(test_pull_1_donor),       TF_TEST(test_pull_2_donors),
        TF_TEST(test_pull_3_donors),      TF_TEST(test_donor_serves_late),
        TF_TEST(test_drift),              TF_TEST(test_donor_bytes_changed),
        TF_TEST(test_many_small_regions), TF_TEST(test_pull_1gib),
        TF_TEST(test_two_recipients_at_once),
        TF_TEST(test_pull_host_mem),
    };
    return tf_run_wire("pull", tests, ARRAY_SIZE(tests));
}
