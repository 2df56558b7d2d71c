/*
 * Forgery on the path between a recipient and an honest donor. A relay of
 * our own stands between them: it accepts the recipient's connection over
 * real UCX, opens one of its own to the donor's real listener, and carries
 * every message both ways (challenge, request, manifest, hash parts,
 * refusals, chunk requests and pushed chunks), changing the donor's
 * answers as its mode says. It holds no job secret. What it keeps of the
 * donor is the donor's own seal of each answer, which proves the secret
 * for this connection as the first version's MAC did (that one covered
 * only the nonces, the step and the layout, which the relay leaves alone):
 * under that version a swapped region table with hashes to match, a
 * changed or reordered hash part, or a refusal made up by the relay were
 * used. Now each ends with the donor dropped as GRAFT_ETOKEN, nothing
 * installed, a log line that says why, and the honest donor serving on.
 *
 * Push reads only (a relay cannot carry one-sided gets), over tcp and
 * shared memory. The fixture is in transfer_fixture.h, the relay in
 * test_transfer_forgery_relay.h.
 */
#include "test_transfer_forgery_relay.h"

#include <pthread.h>

/* Two regions of one size, which a forger could swap, and 32868 chunks of
 * 64 bytes in all: a donor sends at most 16384 hashes an answer, so its
 * manifest is followed by at least two hash parts, and a pull takes long
 * enough (about a second) that a forged donor is always heard before an
 * honest one beside it has served everything. */
static const tf_region_t layout[] = {{"weights", 1u << 20}, {"optim", 1u << 20}, {"step", 6400}};
#define CHUNK 64u

/* ---- the recipient's log ---------------------------------------------------- */

static pthread_mutex_t log_lock = PTHREAD_MUTEX_INITIALIZER;
static char log_text[16384];
static size_t log_used;

static void log_sink(graft_log_level_t level, const char *module, const char *message, void *arg)
{
    (void)arg;
    pthread_mutex_lock(&log_lock);
    if (level <= GRAFT_LOG_WARN && log_used < sizeof(log_text) - 1)
        log_used += (size_t)snprintf(log_text + log_used, sizeof(log_text) - log_used, "%s: %s\n",
                                     module, message);
    log_used = log_used < sizeof(log_text) ? log_used : sizeof(log_text) - 1;
    pthread_mutex_unlock(&log_lock);
}

/* Warnings from here on are kept (and not printed). */
static void log_capture(void)
{
    pthread_mutex_lock(&log_lock);
    log_used = 0;
    log_text[0] = '\0';
    pthread_mutex_unlock(&log_lock);
    graft_log_level_set(GRAFT_LOG_WARN);
    graft_log_sink_set(log_sink, NULL);
}

/* Whether a kept warning contains @p what. */
static bool log_has(const char *what)
{
    pthread_mutex_lock(&log_lock);
    bool has = strstr(log_text, what) != NULL;
    if (!has)
        print_message("# log: %s\n", log_text);
    pthread_mutex_unlock(&log_lock);
    return has;
}

static void log_release(void)
{
    graft_log_sink_set(NULL, NULL);
    if (getenv("GRAFT_LOG") == NULL)
        graft_log_level_set(GRAFT_LOG_ERROR);
}

/* ---- the tests ------------------------------------------------------------ */

/* An honest donor of @o in slot 0, the relay to it in slot 1, the
 * recipient of @o; the next pull asks the relay alone. */
static void relay_setup(tf_t *f, const tf_donor_opts_t *o)
{
    tf_donor_t *good = tf_donor_start(f, 0, o);
    tf_child_start(f, 1, relay_child, good->addr);
    tf_recipient_of(f, o);
    f->po = (graft_transfer_pull_options_t){.donors = &f->addrs[1], .n_donors = 1, .step = STEP,
                                            .window = 32, .connect_timeout_ms = 5000,
                                            .stall_timeout_ms = 5000, .timeout_ms = 30000};
}

/* Through the relay in @p mode alone: the donor is dropped as GRAFT_ETOKEN
 * with a warning that holds @p says, within @p within_s seconds; nothing
 * is installed (and nothing written, with @p untouched). */
static void forged_refused(tf_t *f, int32_t mode, const char *says, double within_s,
                           bool untouched)
{
    relay_mode(&f->d[1], mode);
    tf_recipient_zero(f);
    f->po.donors = &f->addrs[1];
    f->po.n_donors = 1;
    print_message("# relay mode %d\n", mode);
    log_capture();
    double t0 = graft_test_now_s();
    graft_status_t st = tf_pull(f);
    double took = graft_test_now_s() - t0;
    bool logged = log_has(says);
    log_release();
    assert_int_equal(st, GRAFT_ENODONOR);
    assert_int_equal(f->rep.donors[0].status, GRAFT_ETOKEN);
    assert_false(f->rep.installed);
    assert_true(logged);
    assert_true(took < within_s);
    if (untouched) {
        assert_int_equal(f->rep.donors[0].chunks, 0);
        assert_true(tf_recipient_untouched(f));
    }
}

/* The relay in @p mode beside the honest donor: the pull fails over and
 * holds the donor's bytes, each region where it belongs. Chunks the relay
 * carried before its forged answer arrived may count (the manifest's own
 * hashes cover them: they verified, as in forged_refused()); the rest
 * came from the honest donor. */
static void forged_failover(tf_t *f, int32_t mode)
{
    const char *two[2] = {f->addrs[1], f->addrs[0]};
    relay_mode(&f->d[1], mode);
    tf_recipient_zero(f);
    f->po.donors = two;
    f->po.n_donors = 2;
    tf_pull_verified(f);
    assert_int_equal(f->rep.donors[0].status, GRAFT_ETOKEN);
    assert_int_equal(f->rep.donors[1].status, GRAFT_OK);
    assert_true(f->rep.donors[1].chunks > 0);
    assert_int_equal(f->rep.donors[0].bytes + f->rep.donors[1].bytes, f->rep.bytes);
    f->po.donors = &f->addrs[1];
    f->po.n_donors = 1;
}

/* The honest donor refused no request of ours (the relay carried them
 * unchanged) and stops cleanly. */
static void honest_donor_ends_well(tf_t *f)
{
    int32_t out[2];
    tf_donor_ask(&f->d[0], 'X', 0, 0, 5000, out);
    assert_int_equal(out[0], 0);
    tf_recipient_destroy(f);
    tf_child_kill(&f->d[1]);
    assert_int_equal(tf_donor_stop(&f->d[0]), 0);
}

/* The relay as such is faithful: a pull through it is served whole. */
static void test_relay_carries_a_pull(void **state)
{
    tf_t *f = *state;
    tf_donor_opts_t o = tf_opts(layout, ARRAY_SIZE(layout), CHUNK);
    relay_setup(f, &o);
    relay_mode(&f->d[1], R_PASS);
    tf_pull_verified(f);
    assert_int_equal(f->rep.donors[0].status, GRAFT_OK);
    assert_int_equal(f->rep.donors[0].bytes, f->rep.bytes);
    honest_donor_ends_well(f);
}

/* The donor's own manifest, with regions 0 and 1 swapped (addresses,
 * keys, and hashes that match the swapped memory). The first version's
 * MAC did not cover them: the recipient would have installed each region
 * into the other. */
static void test_forged_manifest(void **state)
{
    tf_t *f = *state;
    tf_donor_opts_t o = tf_opts(layout, ARRAY_SIZE(layout), CHUNK);
    relay_setup(f, &o);
    forged_refused(f, R_SWAP, "answer 0 fails its seal", 10.0, true);
    forged_failover(f, R_SWAP);
    honest_donor_ends_well(f);
}

/* Hash parts changed, reordered, dropped or replayed on the way. Reads of
 * chunks the authentic manifest covers may have begun, so what is asked
 * is that the pull fails and installs nothing. */
static void test_forged_hash_parts(void **state)
{
    tf_t *f = *state;
    static const struct {
        int32_t mode;
        const char *says;
    } cases[] = {
        {R_PART_FORGED, "answer 1 fails its seal"},
        {R_PART_REORDER, "answer 1 fails its seal"},
        {R_PART_DROP, "answer 1 fails its seal"},
        {R_PART_REPLAY, "answer 3 fails its seal"},
    };
    tf_donor_opts_t o = tf_opts(layout, ARRAY_SIZE(layout), CHUNK);
    relay_setup(f, &o);
    for (size_t i = 0; i < ARRAY_SIZE(cases); i++)
        forged_refused(f, cases[i].mode, cases[i].says, 25.0, false);
    forged_failover(f, R_PART_REORDER);
    honest_donor_ends_well(f);
}

/* Refusals the donor did not make: a made-up "queued" answer (which kept a
 * recipient asking until its timeout), the donor's manifest turned into a
 * layout refusal under its seal, and an answer replayed from an earlier
 * connection. Each drops the relay at once. */
static void test_forged_refusal(void **state)
{
    tf_t *f = *state;
    tf_donor_opts_t o = tf_opts(layout, ARRAY_SIZE(layout), CHUNK);
    relay_setup(f, &o);
    /* The first connection's first answer, for the replay below. */
    relay_mode(&f->d[1], R_PASS);
    tf_pull_verified(f);
    forged_refused(f, R_BUSY_FORGED, "unsealed refusal, says GRAFT_EBUSY", 4.0, true);
    forged_refused(f, R_REFUSAL_SEALED, "answer 0 fails its seal", 4.0, true);
    forged_refused(f, R_REPLAY_CONN, "answer 0 fails its seal", 4.0, true);
    forged_failover(f, R_BUSY_FORGED);
    forged_failover(f, R_REPLAY_CONN);
    honest_donor_ends_well(f);
}

/* The seal's bytes (docs/SECURITY.md), computed apart with Python's hmac:
 * HMAC-SHA256(key, "graft/transfer/manifest/v2" || Nr || Nd || seq as a
 * u64 big-endian || body), and the answer it makes: the body, 0x72, 0x20,
 * the MAC. Then every way it must fail: any byte changed, another
 * sequence number, the nonces swapped or of another connection, another
 * secret, cut short, no seal. */
static void test_seal_vector(void **state)
{
    (void)state;
    static const uint8_t key[] = "0123456789abcdef0123456789abcdef";
    const size_t key_len = sizeof(key) - 1;
    uint8_t nr[GRAFT_NONCE_BYTES], nd[GRAFT_NONCE_BYTES];
    for (unsigned i = 0; i < GRAFT_NONCE_BYTES; i++) {
        nr[i] = (uint8_t)i;
        nd[i] = (uint8_t)(16 + i);
    }
    /* TransferManifest { version = 1, step = 42 }. */
    static const uint8_t body[] = {0x08, 0x01, 0x20, 0x2a};
    static const uint8_t golden[GRAFT_MAC_BYTES] = {
        0x55, 0x5d, 0x1f, 0x12, 0x5b, 0xc2, 0x8e, 0x73, 0xa8, 0x7e, 0xce, 0x9b, 0x85, 0xcc, 0x77, 0xa5,
        0xe1, 0x49, 0x3c, 0xd1, 0x32, 0xd3, 0x4c, 0xb2, 0x2b, 0x4a, 0xd7, 0x80, 0xe7, 0x79, 0x4e, 0x30};
    uint8_t mac[GRAFT_MAC_BYTES];
    assert_int_equal(graft__xfer_seal_mac(key, key_len, nr, nd, 5, body, sizeof(body), mac),
                     GRAFT_OK);
    assert_memory_equal(mac, golden, sizeof(mac));

    uint8_t msg[sizeof(body) + GRAFT__XFER_SEAL_BYTES];
    memcpy(msg, body, sizeof(body));
    assert_int_equal(graft__xfer_seal(key, key_len, nr, nd, 5, msg, sizeof(body)), GRAFT_OK);
    assert_int_equal(msg[sizeof(body)], 0x72);
    assert_int_equal(msg[sizeof(body) + 1], 0x20);
    assert_memory_equal(msg + sizeof(body) + 2, golden, sizeof(golden));
    /* What the recipient decodes: the body's fields and the seal as field 14. */
    Graft__TransferManifest *m = graft__transfer_manifest__unpack(NULL, sizeof(msg), msg);
    assert_non_null(m);
    assert_int_equal(m->step, 42);
    assert_int_equal(m->seal.len, GRAFT_MAC_BYTES);
    graft__transfer_manifest__free_unpacked(m, NULL);

    size_t body_len = 0;
    bool sealed = false;
    assert_int_equal(graft__xfer_unseal(key, key_len, nr, nd, 5, msg, sizeof(msg), &body_len,
                                        &sealed),
                     GRAFT_OK);
    assert_true(sealed);
    assert_int_equal(body_len, sizeof(body));
    for (size_t i = 0; i < sizeof(msg); i++) {
        msg[i] ^= 0x01;
        assert_int_equal(graft__xfer_unseal(key, key_len, nr, nd, 5, msg, sizeof(msg), &body_len,
                                            &sealed),
                         GRAFT_ETOKEN);
        /* A change of the tag or length byte: no seal at all. */
        assert_true(sealed == (i != sizeof(body) && i != sizeof(body) + 1));
        msg[i] ^= 0x01;
    }
    assert_int_equal(graft__xfer_unseal(key, key_len, nr, nd, 4, msg, sizeof(msg), &body_len,
                                        &sealed), GRAFT_ETOKEN);
    assert_int_equal(graft__xfer_unseal(key, key_len, nr, nd, 6, msg, sizeof(msg), &body_len,
                                        &sealed), GRAFT_ETOKEN);
    assert_int_equal(graft__xfer_unseal(key, key_len, nd, nr, 5, msg, sizeof(msg), &body_len,
                                        &sealed), GRAFT_ETOKEN);
    uint8_t other[GRAFT_NONCE_BYTES];
    memcpy(other, nd, sizeof(other));
    other[3] ^= 0x80;
    assert_int_equal(graft__xfer_unseal(key, key_len, nr, other, 5, msg, sizeof(msg), &body_len,
                                        &sealed), GRAFT_ETOKEN);
    assert_int_equal(graft__xfer_unseal(key, key_len - 1, nr, nd, 5, msg, sizeof(msg), &body_len,
                                        &sealed), GRAFT_ETOKEN);
    for (size_t cut = 0; cut < sizeof(msg); cut++) {
        assert_int_equal(graft__xfer_unseal(key, key_len, nr, nd, 5, msg, cut, &body_len,
                                            &sealed), GRAFT_ETOKEN);
    }
    assert_int_equal(graft__xfer_unseal(key, key_len, nr, nd, 5, body, sizeof(body), &body_len,
                                        &sealed), GRAFT_ETOKEN);
    assert_false(sealed);
    /* An empty body seals too (a refusal has fields; the check does not
     * care what they are). */
    assert_int_equal(graft__xfer_seal(key, key_len, nr, nd, 0, msg, 0), GRAFT_OK);
    assert_int_equal(graft__xfer_unseal(key, key_len, nr, nd, 0, msg, GRAFT__XFER_SEAL_BYTES,
                                        &body_len, &sealed), GRAFT_OK);
    assert_int_equal(body_len, 0);
}

int main(void)
{
    static const struct {
        const char *name;
        CMFixtureFunction setup;
    } groups[] = {{"tcp_push", tf_use_tcp_push}, {"shm_push", tf_use_shm_push}};
    const struct CMUnitTest wire[] = {
        TF_TEST(test_relay_carries_a_pull),
        TF_TEST(test_forged_manifest),
        TF_TEST(test_forged_hash_parts),
        TF_TEST(test_forged_refusal),
    };
    const struct CMUnitTest local[] = {
        cmocka_unit_test(test_seal_vector),
    };
    const char *only = getenv("TRANSFER_GROUP");
    int failed = tf_run_local("forgery", local, ARRAY_SIZE(local));
    for (size_t g = 0; g < ARRAY_SIZE(groups); g++) {
        char name[64];
        if (only != NULL && strcmp(only, groups[g].name) != 0)
            continue;
        snprintf(name, sizeof(name), "transfer_forgery_%s", groups[g].name);
        failed += _cmocka_run_group_tests(name, wire, ARRAY_SIZE(wire), groups[g].setup, NULL);
    }
    return failed;
}
