/*
 * The job secret as the runtime gets and uses it (docs/SECURITY.md): made
 * once in etcd and shared by every process of the job, given by
 * GRAFT_JOB_SECRET or by a file only its owner can read, and a group with
 * another secret neither heals from the job nor speaks on its steady path.
 * Real etcd, real UCX on loopback, runtimes in this process; the codecs of
 * the JobSecret record and of the steady path's MAC are tested alone first.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <graft/graft.h>
#include <graft/transfer.h>

#include "alloc_fail.h"
#include "proto/graft.pb-c.h"
#include "runtime/runtime_internal.h"
#include "runtime_fixture.h"

#define N 512
/* A secret given from outside, and another one (both at least 16 bytes). */
#define SECRET_A "the-job-secret-given-from-outside"
#define SECRET_B "another-job's-secret-entirely"

static char tmpdir[256];

static int setup(void **state)
{
    (void)state;
    snprintf(tmpdir, sizeof(tmpdir), "%s/graft-secret-XXXXXX",
             getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp");
    if (mkdtemp(tmpdir) == NULL)
        return -1;
    unsetenv("GRAFT_JOB_SECRET");
    return graft_test_etcd_start(&rtf_etcd, NULL);
}

static int teardown(void **state)
{
    (void)state;
    char cmd[300];
    snprintf(cmd, sizeof(cmd), "rm -rf '%s'", tmpdir);
    if (system(cmd) != 0)
        fprintf(stderr, "could not remove %s\n", tmpdir);
    graft_test_etcd_stop(&rtf_etcd);
    return 0;
}

static void job_name(char *job, size_t len, const char *what)
{
    snprintf(job, len, "%s-%d", what, (int)getpid());
}

/* The job's secret record in etcd: its length (0: none) and bytes. */
static size_t etcd_secret(const char *job, uint8_t out[GRAFT_TRANSFER_SECRET_MAX_BYTES])
{
    char key[128];
    graft_etcd_kv_t kv;
    size_t len = 0;
    snprintf(key, sizeof(key), "/graft/%s/secret", job);
    graft_status_t st = graft_etcd_get(rtf_etcd.client, key, &kv, NULL);
    if (st == GRAFT_ENOTFOUND)
        return 0;
    assert_int_equal(st, GRAFT_OK);
    assert_int_equal(kv.lease, 0); /* outlives every process of the job */
    assert_int_equal(graft__rt_secret_decode(kv.value, kv.value_len, out,
                                             GRAFT_TRANSFER_SECRET_MAX_BYTES, &len),
                     GRAFT_OK);
    graft_etcd_kv_clear(&kv);
    return len;
}

/* A file of `content` with `mode` (the umask does not apply). */
static void write_file(const char *path, const char *content, mode_t mode)
{
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0600);
    assert_true(fd >= 0);
    assert_int_equal(write(fd, content, strlen(content)), (ssize_t)strlen(content));
    assert_int_equal(fchmod(fd, mode), 0);
    close(fd);
}

static void assert_filled(const uint64_t *r, uint64_t v)
{
    for (size_t i = 0; i < N; i++)
        if (r[i] != v)
            fail_msg("word %zu holds %" PRIu64 ", not %" PRIu64, i, r[i], v);
}

/* The first step of group 0 (regions "a" = 1, "b" = 2) and group 1, whose
 * regions a1, b1 are then healed from group 0 and committed by both. */
static void first_step_heals(graft_runtime_t *rt0, graft_runtime_t *rt1, const uint64_t *a1,
                             const uint64_t *b1)
{
    peer_t p0 = {.rt = rt0}, p1 = {.rt = rt1};
    rtf_step_pair(&p0, &p1);
    assert_true(p1.info.healing);
    assert_int_equal(p1.heal_st, GRAFT_OK);
    assert_true(p0.apply && p1.apply);
    assert_filled(a1, 1);
    assert_filled(b1, 2);
}

/* ------------------------------------------------------------- codecs --- */

/* The wire form of m as the runtime's own encoder (graft__rt_step_encode())
 * packs it, unpacked again, for messages made wrong on purpose: the caller
 * changes fields of a shallow copy (its MAC is one with an unrelated key:
 * the caller sets or drops it) and frees this with
 * graft__step_message__free_unpacked() when done. */
static Graft__StepMessage *step_message_of(const graft__step_msg_t *m)
{
    static const uint8_t other_key[] = "not-the-key-of-any-test-0123456789";
    uint8_t buf[512];
    size_t len = 0;
    assert_int_equal(graft__rt_step_encode(other_key, sizeof(other_key) - 1, m, buf, sizeof(buf),
                                           &len),
                     GRAFT_OK);
    Graft__StepMessage *pm = graft__step_message__unpack(NULL, len, buf);
    assert_non_null(pm);
    return pm;
}

/* Each decoder with each of its allocations failed in turn: GRAFT_ENOMEM
 * or the answer, never another status, nothing left allocated. */
static void decode_under_alloc_failures(const uint8_t *rec, size_t rec_len, const uint8_t *msg,
                                        size_t msg_len, const uint8_t *key, size_t key_len)
{
    for (int which = 0; which < 2; which++) {
        bool done = false;
        for (int n = 0; n < 64 && !done; n++) {
            uint8_t out[GRAFT_TRANSFER_SECRET_MAX_BYTES];
            size_t out_len = 0;
            graft__step_msg_t m;
            int live = graft_test_alloc_live();
            graft_test_alloc_fail_after(n);
            graft_status_t st =
                which == 0 ? graft__rt_secret_decode(rec, rec_len, out, sizeof(out), &out_len)
                           : graft__rt_step_decode(key, key_len, msg, msg_len, &m);
            int refused = graft_test_alloc_refused();
            graft_test_alloc_restore();
            assert_int_equal(graft_test_alloc_live(), live);
            if (st == GRAFT_OK)
                done = refused == 0;
            else if (st != GRAFT_ENOMEM)
                fail_msg("decoder %d with allocation %d failed: %s", which, n,
                         graft_status_string(st));
        }
        assert_true(done);
    }
}

/* The JobSecret record: what one process writes another reads back, and a
 * record that is not one, of another version or with a secret too short
 * for the transfer endpoint is refused without writing the output. */
static void test_secret_record(void **state)
{
    (void)state;
    uint8_t secret[32], got[GRAFT_TRANSFER_SECRET_MAX_BYTES];
    uint8_t *buf = NULL;
    size_t len = 0, got_len = 0;
    for (size_t i = 0; i < sizeof(secret); i++)
        secret[i] = (uint8_t)(i * 37 + 1);
    assert_int_equal(graft__rt_secret_encode(secret, sizeof(secret), &buf, &len), GRAFT_OK);
    assert_int_equal(graft__rt_secret_decode(buf, len, got, sizeof(got), &got_len), GRAFT_OK);
    assert_int_equal(got_len, sizeof(secret));
    assert_memory_equal(got, secret, sizeof(secret));
    /* A buffer too small for it. */
    got_len = 7;
    assert_int_equal(graft__rt_secret_decode(buf, len, got, 16, &got_len), GRAFT_EMALFORMED);
    assert_int_equal(got_len, 7);
    graft_free(buf);

    const uint8_t junk[] = {0xff, 0xff, 0xff};
    assert_int_equal(graft__rt_secret_decode(junk, sizeof(junk), got, sizeof(got), &got_len),
                     GRAFT_EMALFORMED);
    Graft__JobSecret rec = GRAFT__JOB_SECRET__INIT;
    uint8_t raw[64];
    rec.secret.data = secret;
    rec.secret.len = sizeof(secret);
    rec.version = 2;
    len = graft__job_secret__pack(&rec, raw);
    assert_int_equal(graft__rt_secret_decode(raw, len, got, sizeof(got), &got_len), GRAFT_EFORMAT);
    rec.version = 0;
    len = graft__job_secret__pack(&rec, raw);
    assert_int_equal(graft__rt_secret_decode(raw, len, got, sizeof(got), &got_len),
                     GRAFT_EMALFORMED);
    rec.version = 1;
    rec.secret.len = GRAFT_TRANSFER_SECRET_MIN_BYTES - 1;
    len = graft__job_secret__pack(&rec, raw);
    assert_int_equal(graft__rt_secret_decode(raw, len, got, sizeof(got), &got_len),
                     GRAFT_EMALFORMED);
    assert_int_equal(got_len, 7);

    /* With allocations failing (the step message's decoder too). */
    static const uint8_t key[] = "0123456789abcdef";
    const graft__step_msg_t m = {.kind = GRAFT__STEP_MESSAGE__KIND__VOTE, .step = 9, .ok = true};
    uint8_t msg[256];
    size_t msg_len = 0;
    assert_int_equal(graft__rt_step_encode(key, sizeof(key) - 1, &m, msg, sizeof(msg), &msg_len),
                     GRAFT_OK);
    assert_int_equal(graft__rt_secret_encode(secret, sizeof(secret), &buf, &len), GRAFT_OK);
    decode_under_alloc_failures(buf, len, msg, msg_len, key, sizeof(key) - 1);
    graft_free(buf);
}

/* The steady path's MAC: the documented bytes (a fixed vector, computed
 * apart with Python's hmac), a round trip, and every way a message can be
 * wrong: another secret, any field changed after the MAC was made, no MAC,
 * a short one, not a StepMessage, another version. */
static void test_step_mac(void **state)
{
    (void)state;
    static const uint8_t key[] = "0123456789abcdef0123456789abcdef";
    const size_t key_len = sizeof(key) - 1;
    const graft__step_msg_t m = {.kind = GRAFT__STEP_MESSAGE__KIND__READY_ROUND,
                                 .quorum_id = 7, .members_hash = 0x1122334455667788ull,
                                 .epoch_round = 3, .step = 42, .group = 1, .rank = 0,
                                 .round = 0, .ok = true};
    /* HMAC-SHA256(key, "graft/step/v1" || kind, quorum_id, members_hash,
     * epoch_round, step, group, rank, round, ok as u64 big-endian). */
    static const uint8_t golden[GRAFT_MAC_BYTES] = {
        0x11, 0x6a, 0xca, 0x29, 0x64, 0x18, 0xee, 0x50, 0x52, 0x13, 0x58, 0x73, 0xae, 0x60, 0xb1, 0x6e,
        0x75, 0x0d, 0xc2, 0x3f, 0x28, 0xc9, 0xe5, 0x4c, 0xb5, 0x3f, 0xc9, 0xed, 0x01, 0x45, 0x60, 0x7c};
    uint8_t mac[GRAFT_MAC_BYTES];
    assert_int_equal(graft__rt_step_mac(key, key_len, &m, mac), GRAFT_OK);
    assert_memory_equal(mac, golden, sizeof(mac));

    uint8_t buf[256];
    size_t len = 0;
    graft__step_msg_t got;
    assert_int_equal(graft__rt_step_encode(key, key_len, &m, buf, sizeof(buf), &len), GRAFT_OK);
    memset(&got, 0, sizeof(got));
    assert_int_equal(graft__rt_step_decode(key, key_len, buf, len, &got), GRAFT_OK);
    assert_int_equal(got.kind, m.kind);
    assert_int_equal(got.quorum_id, m.quorum_id);
    assert_int_equal(got.members_hash, m.members_hash);
    assert_int_equal(got.epoch_round, m.epoch_round);
    assert_int_equal(got.step, m.step);
    assert_int_equal(got.group, m.group);
    assert_int_equal(got.rank, m.rank);
    assert_int_equal(got.round, m.round);
    assert_true(got.ok);
    assert_int_equal(graft__rt_step_encode(key, key_len, &m, buf, 8, &len), GRAFT_ERANGE);

    /* Keyed with another secret. */
    assert_int_equal(graft__rt_step_encode((const uint8_t *)SECRET_B, strlen(SECRET_B), &m, buf,
                                           sizeof(buf), &len),
                     GRAFT_OK);
    assert_int_equal(graft__rt_step_decode(key, key_len, buf, len, &got), GRAFT_ETOKEN);

    /* Each field changed under the right MAC (a "yes" made a "no", another
     * step, another sender, ...). */
    for (int field = 0; field < 9; field++) {
        Graft__StepMessage *wire = step_message_of(&m);
        Graft__StepMessage pm = *wire;
        pm.mac.data = mac;
        pm.mac.len = sizeof(mac);
        len = graft__step_message__pack(&pm, buf);
        assert_int_equal(graft__rt_step_decode(key, key_len, buf, len, &got), GRAFT_OK);
        switch (field) {
        case 0: pm.kind = GRAFT__STEP_MESSAGE__KIND__READY; break;
        case 1: pm.quorum_id++; break;
        case 2: pm.members_hash ^= 1; break;
        case 3: pm.epoch_round++; break;
        case 4: pm.step++; break;
        case 5: pm.group = 0; break;
        case 6: pm.rank = 1; break;
        case 7: pm.barrier_round = 1; break;
        case 8: pm.ok = false; break;
        }
        len = graft__step_message__pack(&pm, buf);
        if (graft__rt_step_decode(key, key_len, buf, len, &got) != GRAFT_ETOKEN)
            fail_msg("field %d changed under the MAC was accepted", field);
        /* No MAC; a MAC cut short. */
        pm.mac.len = 0;
        len = graft__step_message__pack(&pm, buf);
        assert_int_equal(graft__rt_step_decode(key, key_len, buf, len, &got), GRAFT_ETOKEN);
        pm.mac.len = GRAFT_MAC_BYTES - 1;
        len = graft__step_message__pack(&pm, buf);
        assert_int_equal(graft__rt_step_decode(key, key_len, buf, len, &got), GRAFT_ETOKEN);
        graft__step_message__free_unpacked(wire, NULL);
    }
    const uint8_t junk[] = {0xff, 0xff, 0xff};
    assert_int_equal(graft__rt_step_decode(key, key_len, junk, sizeof(junk), &got), GRAFT_EPROTO);
    Graft__StepMessage v2 = GRAFT__STEP_MESSAGE__INIT;
    v2.version = 2;
    v2.mac.data = mac;
    v2.mac.len = sizeof(mac);
    len = graft__step_message__pack(&v2, buf);
    assert_int_equal(graft__rt_step_decode(key, key_len, buf, len, &got), GRAFT_EFORMAT);
}

/* The delegated records' messages (ANNOUNCE, ANNOUNCED, VOTE_DELEGATE)
 * carry more fields, and the MAC covers each: a vote made a yes, a reason
 * changed, another lease or round is refused; a reason longer than any
 * sender writes is malformed. Other kinds do not carry them. */
static void test_delegate_mac(void **state)
{
    (void)state;
    static const uint8_t key[] = "0123456789abcdef0123456789abcdef";
    const size_t key_len = sizeof(key) - 1;
    graft__step_msg_t m = {.kind = GRAFT__STEP_MESSAGE__KIND__VOTE_DELEGATE, .quorum_id = 9,
                           .step = 41, .group = 2, .rank = 3, .ok = false, .incarnation = 77,
                           .lease = 0x7ffe1234, .etcd_round = 12, .prev_round = 11};
    snprintf(m.reason, sizeof(m.reason), "heal failed");
    uint8_t buf[512], mac[GRAFT_MAC_BYTES];
    size_t len = 0;
    graft__step_msg_t got;
    assert_int_equal(graft__rt_step_encode(key, key_len, &m, buf, sizeof(buf), &len), GRAFT_OK);
    memset(&got, 0, sizeof(got));
    assert_int_equal(graft__rt_step_decode(key, key_len, buf, len, &got), GRAFT_OK);
    assert_int_equal(got.incarnation, 77);
    assert_int_equal(got.lease, 0x7ffe1234);
    assert_int_equal(got.etcd_round, 12);
    assert_int_equal(got.prev_round, 11);
    assert_string_equal(got.reason, "heal failed");
    assert_false(got.ok);
    assert_int_equal(graft__rt_step_mac(key, key_len, &m, mac), GRAFT_OK);
    for (int field = 0; field < 6; field++) {
        Graft__StepMessage *wire = step_message_of(&m);
        Graft__StepMessage pm = *wire;
        pm.mac.data = mac;
        pm.mac.len = sizeof(mac);
        len = graft__step_message__pack(&pm, buf);
        assert_int_equal(graft__rt_step_decode(key, key_len, buf, len, &got), GRAFT_OK);
        switch (field) {
        case 0: pm.incarnation++; break;
        case 1: pm.lease++; break;
        case 2: pm.etcd_round++; break;
        case 3: pm.prev_round = 0; break;
        case 4: pm.reason = "heal failed!"; break;
        case 5: pm.ok = true; break;
        }
        len = graft__step_message__pack(&pm, buf);
        if (graft__rt_step_decode(key, key_len, buf, len, &got) != GRAFT_ETOKEN)
            fail_msg("delegated field %d changed under the MAC was accepted", field);
        graft__step_message__free_unpacked(wire, NULL);
    }
    char long_reason[200];
    memset(long_reason, 'x', sizeof(long_reason) - 1);
    long_reason[sizeof(long_reason) - 1] = '\0';
    Graft__StepMessage *wire = step_message_of(&m);
    Graft__StepMessage pm = *wire;
    pm.reason = long_reason;
    pm.mac.data = mac;
    pm.mac.len = sizeof(mac);
    len = graft__step_message__pack(&pm, buf);
    assert_int_equal(graft__rt_step_decode(key, key_len, buf, len, &got), GRAFT_EPROTO);
    /* A READY with the extra fields set: they are neither MAC'd nor read. */
    m.kind = GRAFT__STEP_MESSAGE__KIND__READY;
    assert_int_equal(graft__rt_step_mac(key, key_len, &m, mac), GRAFT_OK);
    graft__step_message__free_unpacked(wire, NULL);
    wire = step_message_of(&m);
    pm = *wire;
    pm.incarnation = 5;
    pm.reason = "ignored";
    pm.mac.data = mac;
    pm.mac.len = sizeof(mac);
    len = graft__step_message__pack(&pm, buf);
    assert_int_equal(graft__rt_step_decode(key, key_len, buf, len, &got), GRAFT_OK);
    assert_int_equal(got.incarnation, 0);
    assert_string_equal(got.reason, "");
    graft__step_message__free_unpacked(wire, NULL);
}

/* ------------------------------------------------------- the runtime --- */

/* Without GRAFT_JOB_SECRET or a file, the job's first process makes the
 * secret in etcd and every other reads it: group 1's step-0 sync from
 * group 0 works, and so does a replacement's heal, which finds the same
 * record and changes nothing in it. */
static void test_secret_from_etcd_shared(void **state)
{
    (void)state;
    static uint64_t a0[N], b0[N], a1[N], b1[N];
    uint8_t first[GRAFT_TRANSFER_SECRET_MAX_BYTES], again[GRAFT_TRANSFER_SECRET_MAX_BYTES];
    char job[64];
    job_name(job, sizeof(job), "secret-etcd");
    assert_int_equal(etcd_secret(job, first), 0);
    graft_runtime_t *rt0 = rtf_make(job, 0);
    assert_int_equal(etcd_secret(job, first), 32);
    graft_runtime_t *rt1 = rtf_make(job, 1);
    assert_int_equal(etcd_secret(job, again), 32);
    assert_memory_equal(again, first, 32);

    rtf_register_ab(rt0, a0, b0, N, 1, 2);
    rtf_register_ab(rt1, a1, b1, N, 5, 6);
    first_step_heals(rt0, rt1, a1, b1);

    /* A replacement of group 1 heals from group 0. */
    graft_destroy(rt1);
    rt1 = rtf_make(job, 1);
    rtf_register_ab(rt1, a1, b1, N, 8, 9);
    peer_t r0 = {.rt = rt0}, r1 = {.rt = rt1};
    rtf_step_pair(&r0, &r1);
    assert_true(r1.info.healing);
    assert_int_equal(r1.heal_st, GRAFT_OK);
    assert_int_equal(graft_start_kind(rt1), GRAFT_START_PEER);
    assert_true(r0.apply && r1.apply);
    assert_filled(a1, 1);
    assert_filled(b1, 2);
    assert_int_equal(etcd_secret(job, again), 32);
    assert_memory_equal(again, first, 32);
    graft_destroy(rt1);
    graft_destroy(rt0);
}

typedef struct recovery_seen {
    int n;
    graft_status_t status;
} recovery_seen_t;

static void on_recovery(const graft_runtime_event_t *ev, void *arg)
{
    recovery_seen_t *r = arg;
    if (ev->kind != GRAFT_RUNTIME_EVENT_RECOVERY)
        return;
    r->n++;
    r->status = ev->status;
}

/* A group whose process was given another secret (GRAFT_JOB_SECRET) joins
 * the job in etcd, but its pull of the job's state is refused: its heal
 * fails, its regions keep what they held, its vote is no; the group that
 * would have served it is not disturbed. */
static void test_other_secret_cannot_heal(void **state)
{
    (void)state;
    static uint64_t a0[N], b0[N], a1[N], b1[N];
    char job[64];
    recovery_seen_t seen = {0};
    job_name(job, sizeof(job), "secret-other");
    graft_runtime_t *rt0 = rtf_make(job, 0);
    setenv("GRAFT_JOB_SECRET", SECRET_B, 1);
    graft_runtime_t *rt1 = rtf_make(job, 1);
    unsetenv("GRAFT_JOB_SECRET");
    graft_event_callback_set(rt1, on_recovery, &seen);
    rtf_register_ab(rt0, a0, b0, N, 1, 2);
    rtf_register_ab(rt1, a1, b1, N, 5, 6);

    peer_t p0 = {.rt = rt0}, p1 = {.rt = rt1};
    rtf_step_pair(&p0, &p1);
    assert_true(p1.info.healing);
    if (p1.heal_st != GRAFT_ETOKEN && p1.heal_st != GRAFT_ENODONOR)
        fail_msg("the heal ended with %s", graft_status_string(p1.heal_st));
    assert_int_equal(seen.n, 1);
    assert_int_equal(seen.status, p1.heal_st);
    assert_filled(a1, 5); /* nothing of group 0's state */
    assert_filled(b1, 6);
    assert_false(p1.apply);
    graft_metrics_t m;
    graft_metrics_get(rt1, &m);
    assert_int_equal(m.recoveries, 0);
    assert_int_equal(m.recovery_failures, 1);
    assert_int_equal(m.recovery_bytes, 0);
    assert_int_equal(p0.commit_st, GRAFT_OK);
    assert_true(p0.apply);
    assert_filled(a0, 1);
    graft_destroy(rt1);
    graft_destroy(rt0);
}

/* job_secret_file: refused (GRAFT_EINVAL) when group or others may read or
 * write it, when missing, not a regular file, too short or too long; used
 * at mode 0600, its trailing newline not part of the secret (group 0 reads
 * the file, group 1 gets the same bytes from GRAFT_JOB_SECRET, and group
 * 1's sync from group 0 works), with nothing written to etcd. The
 * environment wins over the file. */
static void test_secret_file(void **state)
{
    (void)state;
    static uint64_t a0[N], b0[N], a1[N], b1[N];
    uint8_t none[GRAFT_TRANSFER_SECRET_MAX_BYTES];
    char job[64], path[320], missing[320], longer[400];
    graft_runtime_t *rt = NULL;
    job_name(job, sizeof(job), "secret-file");
    snprintf(path, sizeof(path), "%s/secret", tmpdir);
    snprintf(missing, sizeof(missing), "%s/no-such-file", tmpdir);

    static const mode_t open_modes[] = {0644, 0640, 0604, 0620, 0602, 0660};
    for (size_t i = 0; i < sizeof(open_modes) / sizeof(open_modes[0]); i++) {
        write_file(path, SECRET_A "\n", open_modes[i]);
        if (rtf_make_status(job, 0, "job_secret_file", path, &rt) != GRAFT_EINVAL)
            fail_msg("a secret file of mode %04o was not refused", (unsigned)open_modes[i]);
        assert_null(rt);
    }
    assert_int_equal(rtf_make_status(job, 0, "job_secret_file", missing, &rt), GRAFT_EINVAL);
    assert_int_equal(rtf_make_status(job, 0, "job_secret_file", tmpdir, &rt), GRAFT_EINVAL);
    write_file(path, "0123456789abcde\n", 0600); /* 15 bytes and a newline */
    assert_int_equal(rtf_make_status(job, 0, "job_secret_file", path, &rt), GRAFT_EINVAL);
    memset(longer, 'x', 257);
    longer[257] = '\0';
    write_file(path, longer, 0600);
    assert_int_equal(rtf_make_status(job, 0, "job_secret_file", path, &rt), GRAFT_EINVAL);
    /* GRAFT_JOB_SECRET too short; then given, it wins over a missing file. */
    setenv("GRAFT_JOB_SECRET", "too-short", 1);
    assert_int_equal(rtf_make_status(job, 0, NULL, NULL, &rt), GRAFT_EINVAL);
    setenv("GRAFT_JOB_SECRET", SECRET_A, 1);
    assert_int_equal(rtf_make_status(job, 0, "job_secret_file", missing, &rt), GRAFT_OK);
    graft_destroy(rt);
    unsetenv("GRAFT_JOB_SECRET");
    assert_int_equal(etcd_secret(job, none), 0);

    write_file(path, SECRET_A "\n", 0600);
    graft_runtime_t *rt0 = rtf_make_set(job, 0, "job_secret_file", path);
    setenv("GRAFT_JOB_SECRET", SECRET_A, 1);
    graft_runtime_t *rt1 = rtf_make(job, 1);
    unsetenv("GRAFT_JOB_SECRET");
    rtf_register_ab(rt0, a0, b0, N, 1, 2);
    rtf_register_ab(rt1, a1, b1, N, 5, 6);
    first_step_heals(rt0, rt1, a1, b1);
    assert_int_equal(etcd_secret(job, none), 0); /* the file's secret never goes to etcd */
    graft_destroy(rt1);
    graft_destroy(rt0);
}

/* What etcd says of the job's latest epoch, and where rank 0 of each group
 * listens, for messages made by hand. */
typedef struct epoch_seen {
    uint64_t id, round, members_hash;
    char address[2][64];
} epoch_seen_t;

static void epoch_read(const char *job, epoch_seen_t *e)
{
    char key[128];
    graft_etcd_kv_t kv;
    snprintf(key, sizeof(key), "/graft/%s/quorum", job);
    assert_int_equal(graft_etcd_get(rtf_etcd.client, key, &kv, NULL), GRAFT_OK);
    Graft__Quorum *q = graft__quorum__unpack(NULL, kv.value_len, kv.value);
    graft_etcd_kv_clear(&kv);
    assert_non_null(q);
    e->id = q->id;
    e->round = q->round;
    e->members_hash = q->members_hash;
    graft__quorum__free_unpacked(q, NULL);
    for (int g = 0; g < 2; g++) {
        snprintf(key, sizeof(key), "/graft/%s/members/%d/0", job, g);
        assert_int_equal(graft_etcd_get(rtf_etcd.client, key, &kv, NULL), GRAFT_OK);
        Graft__MemberRecord *mr = graft__member_record__unpack(NULL, kv.value_len, kv.value);
        graft_etcd_kv_clear(&kv);
        assert_non_null(mr);
        snprintf(e->address[g], sizeof(e->address[g]), "%s", mr->transfer_address);
        graft__member_record__free_unpacked(mr, NULL);
    }
}

/* To each group's leader, the other leader's "no" of the barrier's first
 * round for `step`, keyed with `secret` (NULL: no MAC at all). */
static void send_no(graft_transfer_endpoint_t *ep, const epoch_seen_t *e, uint64_t step,
                    const uint8_t *secret, size_t secret_len)
{
    for (uint32_t to = 0; to < 2; to++) {
        graft__step_msg_t m = {.kind = GRAFT__STEP_MESSAGE__KIND__READY_ROUND,
                               .quorum_id = e->id, .members_hash = e->members_hash,
                               .epoch_round = e->round, .step = step, .group = 1 - to,
                               .rank = 0, .round = 0, .ok = false};
        uint8_t buf[256];
        size_t len = 0;
        if (secret != NULL) {
            assert_int_equal(graft__rt_step_encode(secret, secret_len, &m, buf, sizeof(buf), &len),
                             GRAFT_OK);
        } else {
            Graft__StepMessage *wire = step_message_of(&m);
            Graft__StepMessage pm = *wire;
            pm.mac.data = NULL;
            pm.mac.len = 0;
            len = graft__step_message__pack(&pm, buf);
            graft__step_message__free_unpacked(wire, NULL);
        }
        assert_int_equal(graft_transfer_msg_send(ep, e->address[to], buf, len, 5000), GRAFT_OK);
    }
    /* Delivery is unordered between senders: let these arrive before the
     * members' own messages of the step. */
    usleep(300 * 1000);
}

static void steady_counts(graft_runtime_t *rt, uint64_t *steps, uint64_t *fallbacks,
                          uint64_t *rejected)
{
    graft_metrics_t m;
    graft_metrics_get(rt, &m);
    *steps = m.steady_steps;
    *fallbacks = m.steady_fallbacks;
    *rejected = m.steady_rejected;
}

/* On the steady path a "no" that each leader hears first, apparently from
 * the other, ends the epoch when it carries the job's MAC (the control).
 * Sent by a process without the secret, with a MAC of another secret or
 * none, it is dropped and counted (steady_rejected), and the step is agreed
 * on the steady path all the same. */
static void test_steady_forged_no(void **state)
{
    (void)state;
    static uint64_t a0[N], b0[N], a1[N], b1[N];
    char job[64];
    uint8_t secret[GRAFT_TRANSFER_SECRET_MAX_BYTES];
    job_name(job, sizeof(job), "secret-steady");
    graft_runtime_t *rt0 = rtf_make(job, 0), *rt1 = rtf_make(job, 1);
    rtf_register_ab(rt0, a0, b0, N, 1, 2);
    rtf_register_ab(rt1, a1, b1, N, 5, 6);
    for (int i = 0; i < 3; i++) {
        peer_t p0 = {.rt = rt0}, p1 = {.rt = rt1};
        rtf_step_pair(&p0, &p1);
        assert_true(p0.apply && p1.apply);
    }
    uint64_t steps0, fb0, rej0, steps1, fb1, rej1;
    steady_counts(rt0, &steps0, &fb0, &rej0);
    steady_counts(rt1, &steps1, &fb1, &rej1);
    assert_true(steps0 >= 1 && steps1 >= 1); /* the epoch is on the steady path */
    assert_int_equal(rej0 + rej1, 0);

    graft_transfer_config_t tc = {.listen_address = "127.0.0.1",
                                  .job_secret = SECRET_B,
                                  .job_secret_len = strlen(SECRET_B)};
    graft_transfer_endpoint_t *forger = NULL;
    assert_int_equal(graft_transfer_endpoint_create(&tc, &forger), GRAFT_OK);
    epoch_seen_t e;
    epoch_read(job, &e);

    /* Forged: another secret's MAC, and none. */
    send_no(forger, &e, graft_step(rt0), (const uint8_t *)SECRET_B, strlen(SECRET_B));
    send_no(forger, &e, graft_step(rt0), NULL, 0);
    peer_t p0 = {.rt = rt0}, p1 = {.rt = rt1};
    rtf_step_pair(&p0, &p1);
    assert_true(p0.apply && p1.apply);
    uint64_t s, f, r;
    steady_counts(rt0, &s, &f, &r);
    assert_int_equal(s, steps0 + 1);
    assert_int_equal(f, fb0);
    assert_int_equal(r, 2);
    steady_counts(rt1, &s, &f, &r);
    assert_int_equal(s, steps1 + 1);
    assert_int_equal(f, fb1);
    assert_int_equal(r, 2);
    assert_memory_equal(a1, a0, sizeof(a0));

    /* The control: the same "no" with the job's MAC is heard. */
    size_t len = etcd_secret(job, secret);
    assert_int_equal(len, 32);
    send_no(forger, &e, graft_step(rt0), secret, len);
    explicit_bzero(secret, sizeof(secret));
    peer_t c0 = {.rt = rt0}, c1 = {.rt = rt1};
    rtf_step_pair(&c0, &c1);
    assert_true(c0.apply && c1.apply); /* through etcd */
    steady_counts(rt0, &s, &f, &r);
    assert_int_equal(f, fb0 + 1);
    assert_int_equal(r, 2);
    steady_counts(rt1, &s, &f, &r);
    assert_int_equal(f, fb1 + 1);
    assert_int_equal(r, 2);
    assert_memory_equal(a1, a0, sizeof(a0));
    graft_transfer_endpoint_destroy(forger);
    graft_destroy(rt1);
    graft_destroy(rt0);
}

/* ------------------------------------------ etcd with TLS and auth --- */

/* A runtime of group @p group of a 2-group job on the etcd at @p ep (https
 * with client certificates, all under @p dir), logged in as @p user. */
static graft_status_t make_rt_auth(const char *job, int group, const char *ep, const char *dir,
                                   const char *user, const char *password, graft_runtime_t **rt_p)
{
    char ca[320], crt[320], key[320];
    snprintf(ca, sizeof(ca), "%s/ca.crt", dir);
    snprintf(crt, sizeof(crt), "%s/job.crt", dir);
    snprintf(key, sizeof(key), "%s/job.key", dir);
    graft_config_t *c = NULL;
    char g[16];
    snprintf(g, sizeof(g), "%d", group);
    const char *set[][2] = {
        {"job", job}, {"groups", "2"}, {"group", g}, {"etcd_endpoints", ep}, {"etcd_ca", ca},
        {"etcd_cert", crt}, {"etcd_key", key}, {"etcd_user", user}, {"etcd_password", password}, {"lease_ttl_ms", "2000"},
        {"join_timeout_ms", "1000"}, {"fence_timeout_ms", "5000"}, {"stall_timeout_ms", "2000"},
        {"quorum_timeout_ms", "30000"},
    };
    assert_int_equal(graft_config_create(&c), GRAFT_OK);
    for (size_t i = 0; i < sizeof(set) / sizeof(set[0]); i++)
        assert_int_equal(graft_config_set(c, set[i][0], set[i][1], NULL), GRAFT_OK);
    graft_status_t st = graft_init(c, rt_p);
    graft_config_destroy(c);
    return st;
}

/* The job on an etcd with TLS (certificates made here with openssl) and
 * authentication on: the job's user makes and reads the secret, and its
 * groups heal; a user without a role on the job, or no user at all, cannot
 * read the secret and cannot start a process of the job. */
static void test_secret_behind_etcd_auth_tls(void **state)
{
    (void)state;
    static uint64_t a0[N], b0[N], a1[N], b1[N];
    char dir[300], ca[320], scrt[320], skey[320], ccrt[320], ckey[320], job[64], key[128];
    char grant[128];
    snprintf(dir, sizeof(dir), "%s/tls", tmpdir);
    assert_int_equal(mkdir(dir, 0700), 0);
    assert_int_equal(graft_test_tls_certs(dir), 0);
    snprintf(ca, sizeof(ca), "%s/ca.crt", dir);
    snprintf(scrt, sizeof(scrt), "%s/server.crt", dir);
    snprintf(skey, sizeof(skey), "%s/server.key", dir);
    /* etcd 3.4's JSON gateway refuses a client certificate with a
     * CommonName once users are on: the job's certificate has none. */
    char cmd[1400];
    snprintf(cmd, sizeof(cmd),
             "cd '%s' && openssl req -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes "
             "-keyout job.key -out job.csr -subj /O=graft-job >/dev/null 2>&1 && "
             "openssl x509 -req -in job.csr -CA ca.crt -CAkey ca.key -CAcreateserial "
             "-out job.crt -days 1 >/dev/null 2>&1",
             dir);
    assert_int_equal(system(cmd), 0);
    snprintf(ccrt, sizeof(ccrt), "%s/job.crt", dir);
    snprintf(ckey, sizeof(ckey), "%s/job.key", dir);
    static const char *const args[] = {"--auth-token=simple", "--bcrypt-cost=4", NULL};
    graft_etcd_server_opts_t so = {.cert_file = scrt, .key_file = skey, .trusted_ca_file = ca,
                                   .extra_args = args};
    graft_etcd_server_t *server = NULL;
    assert_int_equal(graft_etcd_server_start(&so, &server), GRAFT_OK);
    const char *ep = graft_etcd_server_endpoint(server);
    assert_non_null(strstr(ep, "https://"));

    job_name(job, sizeof(job), "secret-tls");
    snprintf(grant, sizeof(grant), "/graft/%s/", job);
    setenv("ETCDCTL_CACERT", ca, 1);
    setenv("ETCDCTL_CERT", ccrt, 1);
    setenv("ETCDCTL_KEY", ckey, 1);
    const char *const role_root[] = {"role", "add", "root", NULL};
    (void)graft_test_etcdctl(ep, NULL, 0, role_root); /* may exist already */
    const char *const setup_cmds[][7] = {
        {"user", "add", "root:rootpw", NULL},
        {"user", "grant-role", "root", "root", NULL},
        {"user", "add", "trainer:trainerpw", NULL},
        {"role", "add", "jobrw", NULL},
        {"role", "grant-permission", "jobrw", "--prefix=true", "readwrite", grant, NULL},
        {"user", "grant-role", "trainer", "jobrw", NULL},
        {"user", "add", "stranger:strangerpw", NULL},
        {"auth", "enable", NULL},
    };
    for (size_t i = 0; i < sizeof(setup_cmds) / sizeof(setup_cmds[0]); i++)
        assert_int_equal(graft_test_etcdctl(ep, NULL, 0, setup_cmds[i]), 0);
    unsetenv("ETCDCTL_CACERT");
    unsetenv("ETCDCTL_CERT");
    unsetenv("ETCDCTL_KEY");

    graft_runtime_t *rt0 = NULL, *rt1 = NULL, *bad = NULL;
    assert_int_equal(make_rt_auth(job, 0, ep, dir, "trainer", "trainerpw", &rt0), GRAFT_OK);
    assert_int_equal(make_rt_auth(job, 1, ep, dir, "trainer", "trainerpw", &rt1), GRAFT_OK);
    rtf_register_ab(rt0, a0, b0, N, 1, 2);
    rtf_register_ab(rt1, a1, b1, N, 5, 6);
    first_step_heals(rt0, rt1, a1, b1);

    /* The job's user reads the record; a stranger and nobody do not. */
    snprintf(key, sizeof(key), "/graft/%s/secret", job);
    const char *eps[] = {ep};
    graft_etcd_config_t ec = {.endpoints = eps, .n_endpoints = 1, .ca_file = ca,
                              .cert_file = ccrt, .key_file = ckey, .username = "trainer",
                              .password = "trainerpw"};
    graft_etcd_t *cl = NULL;
    graft_etcd_kv_t kv = {0};
    assert_int_equal(graft_etcd_create(&ec, &cl), GRAFT_OK);
    assert_int_equal(graft_etcd_get(cl, key, &kv, NULL), GRAFT_OK);
    assert_true(kv.value_len > 32);
    graft_etcd_kv_clear(&kv);
    graft_etcd_destroy(cl);
    ec.username = "stranger";
    ec.password = "strangerpw";
    assert_int_equal(graft_etcd_create(&ec, &cl), GRAFT_OK);
    assert_int_not_equal(graft_etcd_get(cl, key, &kv, NULL), GRAFT_OK);
    assert_null(kv.value);
    graft_etcd_destroy(cl);
    ec.username = ec.password = NULL;
    assert_int_equal(graft_etcd_create(&ec, &cl), GRAFT_OK);
    assert_int_not_equal(graft_etcd_get(cl, key, &kv, NULL), GRAFT_OK);
    graft_etcd_destroy(cl);
    /* Nor can the stranger start a process of the job. */
    assert_int_not_equal(make_rt_auth(job, 1, ep, dir, "stranger", "strangerpw", &bad), GRAFT_OK);
    assert_null(bad);

    graft_destroy(rt1);
    graft_destroy(rt0);
    graft_etcd_server_destroy(server);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_secret_record),
        cmocka_unit_test(test_step_mac),
        cmocka_unit_test(test_delegate_mac),
        cmocka_unit_test(test_secret_from_etcd_shared),
        cmocka_unit_test(test_other_secret_cannot_heal),
        cmocka_unit_test(test_secret_file),
        cmocka_unit_test(test_steady_forged_no),
        cmocka_unit_test(test_secret_behind_etcd_auth_tls),
    };
    if (getenv("TEST_FILTER") != NULL)
        cmocka_set_test_filter(getenv("TEST_FILTER"));
    return cmocka_run_group_tests(tests, setup, teardown);
}
