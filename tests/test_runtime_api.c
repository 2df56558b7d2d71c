/*
 * The runtime's API in one process, against the program's etcd: bad
 * configuration and misuse get precise errors, allocation failures are
 * survived, and two runtimes of one process (runtime_fixture.h) exchange
 * quorum blobs, wire an NCCL backend, open a donor's fence and switch skip
 * regions. test_runtime.c has the end-to-end jobs.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "alloc_fail.h"

#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <graft/graft.h>

#include "runtime/runtime_internal.h"
#include "transfer/transfer_int.h"
#include "proto/graft.pb-c.h"
#include "runtime_procs.h"

static void test_bad_config_names_field(void **state)
{
    (void)state;
    graft_config_t *c = NULL;
    graft_runtime_t *rt = NULL;
    assert_int_equal(graft_config_create(&c), GRAFT_OK);
    assert_int_equal(graft_config_set(c, "job", "x", NULL), GRAFT_OK);
    assert_int_equal(graft_config_set(c, "groups", "2", NULL), GRAFT_OK);
    assert_int_equal(graft_config_set(c, "group", "5", NULL), GRAFT_OK);
    assert_int_equal(graft_init(c, &rt), GRAFT_EINVAL);
    assert_null(rt);
    graft_config_destroy(c);

    /* The trainer reads GRAFT_* and names the bad variable. */
    char cmd[1400];
    snprintf(cmd, sizeof(cmd),
             "GRAFT_JOB=x GRAFT_GROUPS=3 GRAFT_GROUP=0 GRAFT_LEASE_TTL_MS=soon '%s' 2>&1",
             rp_trainer);
    FILE *f = popen(cmd, "r");
    char out[512] = "";
    size_t got = fread(out, 1, sizeof(out) - 1, f);
    out[got] = '\0';
    int rc = pclose(f);
    assert_true(WIFEXITED(rc));
    assert_int_equal(WEXITSTATUS(rc), 2);
    if (strstr(out, "GRAFT_LEASE_TTL_MS") == NULL || strstr(out, "lease_ttl_ms") == NULL)
        fail_msg("error does not name the field: %s", out);

    snprintf(cmd, sizeof(cmd),
             "GRAFT_JOB=x GRAFT_GROUPS=3 GRAFT_GROUP=0 GRAFT_MIN_GROUPS=2 '%s' 2>&1", rp_trainer);
    f = popen(cmd, "r");
    got = fread(out, 1, sizeof(out) - 1, f);
    out[got] = '\0';
    rc = pclose(f);
    assert_int_equal(WEXITSTATUS(rc), 2);
    if (strstr(out, "min_groups") == NULL)
        fail_msg("error does not name min_groups: %s", out);

    /* Unknown flag. */
    snprintf(cmd, sizeof(cmd), "'%s' --stepz 3 2>/dev/null", rp_trainer);
    assert_int_equal(WEXITSTATUS(system(cmd)), 2);
}

typedef struct seen_events {
    int n[8];
    uint64_t last_quorum_id;
} seen_events_t;

static void on_event(const graft_runtime_event_t *ev, void *arg)
{
    seen_events_t *se = arg;
    assert_non_null(ev->detail);
    if ((int)ev->kind >= 0 && (int)ev->kind < 8)
        se->n[ev->kind]++;
    if (ev->kind == GRAFT_RUNTIME_EVENT_QUORUM_CHANGED)
        se->last_quorum_id = ev->quorum_id;
}

/* The drift check's record: what one rank writes, another decodes, and
 * hostile bytes are refused without touching the hashes. */
static void test_drift_record(void **state)
{
    (void)state;
    graft__rt_region_t regions[2] = {{.name = (char *)"w"}, {.name = (char *)"b"}};
    graft_runtime_t rt;
    memset(&rt, 0, sizeof(rt));
    rt.regions = regions;
    rt.n_regions = 2;
    rt.group = 3;
    uint64_t mine[2] = {0x1111, 0xffffffffffffffffull};
    uint8_t *buf = NULL;
    size_t len = 0;
    assert_int_equal(graft__rt_drift_encode(&rt, mine, &buf, &len), GRAFT_OK);
    uint64_t got[2] = {0};
    bool have[2] = {false, false};
    uint32_t group = 0;
    assert_int_equal(graft__rt_drift_decode(&rt, buf, len, &group, got, have), GRAFT_OK);
    assert_int_equal(group, 3);
    assert_true(have[0] && have[1]);
    assert_int_equal(got[0], mine[0]);
    assert_int_equal(got[1], mine[1]);
    graft_free(buf);

    /* not a record */
    const uint8_t junk[] = {0xff, 0xff, 0xff};
    have[0] = have[1] = false;
    assert_int_equal(graft__rt_drift_decode(&rt, junk, sizeof(junk), &group, got, have),
                     GRAFT_EMALFORMED);
    assert_false(have[0] || have[1]);
    /* another version; no version */
    Graft__DriftRecord rec = GRAFT__DRIFT_RECORD__INIT;
    uint8_t raw[16];
    rec.version = 2;
    len = graft__drift_record__pack(&rec, raw);
    assert_int_equal(graft__rt_drift_decode(&rt, raw, len, &group, got, have), GRAFT_EFORMAT);
    rec.version = 0;
    len = graft__drift_record__pack(&rec, raw);
    assert_int_equal(graft__rt_drift_decode(&rt, raw, len, &group, got, have), GRAFT_EMALFORMED);
    assert_false(have[0] || have[1]);
}

static void test_api_misuse(void **state)
{
    seen_events_t se;
    memset(&se, 0, sizeof(se));
    graft_config_t *c = NULL;
    graft_runtime_t *rt = NULL;
    bool apply = true;
    uint64_t buf[4] = {0};
    assert_int_equal(graft_config_create(&c), GRAFT_OK);
    assert_int_equal(graft_config_set(c, "job", "misuse", NULL), GRAFT_OK);
    assert_int_equal(graft_config_set(c, "groups", "1", NULL), GRAFT_OK);
    assert_int_equal(graft_config_set(c, "group", "0", NULL), GRAFT_OK);
    assert_int_equal(
        graft_config_set(c, "etcd_endpoints", graft_etcd_server_endpoint(rtf_etcd.server), NULL),
        GRAFT_OK);
    assert_int_equal(graft_init(c, &rt), GRAFT_OK);
    graft_config_destroy(c);
    assert_int_equal(graft_commit(rt, &apply), GRAFT_ESTATE);
    assert_false(apply);
    assert_int_equal(graft_quorum(rt, NULL), GRAFT_EINVAL); /* no regions */
    graft_region_t bad = {"w", GRAFT_REGION_PARAM, 0, GRAFT_DEVICE_HOST, NULL, 8, 0, 0};
    assert_int_equal(graft_region_register(rt, &bad), GRAFT_EINVAL);
    bad.ptr = buf;
    bad.kind = (graft_region_kind_t)42;
    assert_int_equal(graft_region_register(rt, &bad), GRAFT_EINVAL);
    bad.kind = GRAFT_REGION_PARAM;
    bad.global_bytes = 4;
    assert_int_equal(graft_region_register(rt, &bad), GRAFT_EINVAL);
    bad.global_bytes = 0;
    assert_int_equal(graft_region_register(rt, &bad), GRAFT_OK);
    assert_int_equal(graft_region_register(rt, &bad), GRAFT_EEXIST);
    assert_int_equal(graft_checkpoint_now(rt), GRAFT_ENOTSUP);
    assert_int_equal(graft_start_kind(rt), GRAFT_START_UNDECIDED);

    /* One group alone: a quorum of one, cold start, commits apply. */
    graft_event_callback_set(rt, on_event, &se);
    graft_step_info_t info;
    assert_int_equal(graft_quorum(rt, &info), GRAFT_OK);
    assert_int_equal(graft_start_kind(rt), GRAFT_START_COLD);
    assert_int_equal(info.step, 0);
    assert_int_equal(info.replica_world, 1);
    assert_true(info.quorum_changed);
    assert_int_equal(graft_quorum(rt, &info), GRAFT_ESTATE);
    assert_int_equal(graft_region_register(rt, &bad), GRAFT_ESTATE);
    assert_int_equal(graft_commit(rt, &apply), GRAFT_OK);
    assert_true(apply);
    assert_int_equal(graft_step(rt), 1);
    graft_metrics_t m;
    graft_metrics_get(rt, &m);
    assert_int_equal(m.commits, 1);
    assert_int_equal(m.quorums, 1);
    assert_int_equal(m.step, 1);
    assert_int_equal(m.quorum_changes, 1);
    assert_int_equal(se.n[GRAFT_RUNTIME_EVENT_QUORUM_CHANGED], 1);
    assert_int_equal(se.last_quorum_id, graft_quorum_id(rt));
    assert_int_equal(se.n[GRAFT_RUNTIME_EVENT_COMMIT_FAILED], 0);
    assert_int_equal(graft_replica_world(rt), 1);
    assert_int_equal(graft_replica_rank(rt), 0);
    /* A second step: same quorum id, no new event. */
    assert_int_equal(graft_quorum(rt, &info), GRAFT_OK);
    assert_false(info.quorum_changed);
    assert_int_equal(info.step, 1);
    assert_int_equal(graft_commit(rt, &apply), GRAFT_OK);
    assert_true(apply);
    assert_int_equal(se.n[GRAFT_RUNTIME_EVENT_QUORUM_CHANGED], 1);
    /* A vetoed step (the trainer's collective failed) does not apply; the
     * veto lasts one step. */
    assert_int_equal(graft_commit_veto(rt), GRAFT_ESTATE);
    assert_int_equal(graft_commit_veto(NULL), GRAFT_EINVAL);
    assert_int_equal(graft_quorum(rt, &info), GRAFT_OK);
    assert_int_equal(graft_commit_veto(rt), GRAFT_OK);
    assert_int_equal(graft_commit(rt, &apply), GRAFT_OK);
    assert_false(apply);
    assert_int_equal(graft_step(rt), 2);
    assert_int_equal(se.n[GRAFT_RUNTIME_EVENT_COMMIT_FAILED], 1);
    assert_int_equal(graft_quorum(rt, &info), GRAFT_OK);
    assert_int_equal(graft_commit(rt, &apply), GRAFT_OK);
    assert_true(apply);
    assert_int_equal(graft_step(rt), 3);
    assert_string_equal(graft_runtime_event_kind_string(GRAFT_RUNTIME_EVENT_DRIFT), "drift");
    assert_string_equal(graft_version(), graft_version_string());
    /* No checkpoint was started (no persist root): nothing to wait for. */
    assert_int_equal(graft_checkpoint_wait(rt), GRAFT_OK);
    assert_int_equal(graft_checkpoint_wait(NULL), GRAFT_EINVAL);
    graft_destroy(rt);
    graft_destroy(NULL);
    (void)state;
}

/* Initialises a one-group runtime listening on @addr (advertising @adv when
 * not NULL); with GRAFT_OK, takes one step and returns in @published the
 * transfer address of its member record in etcd. */
static graft_status_t init_with_address(const char *job, const char *addr, const char *adv,
                                        char *published, size_t len)
{
    graft_config_t *c = NULL;
    graft_runtime_t *rt = NULL;
    uint64_t w = 7;
    graft_step_info_t info;
    bool apply = false;
    assert_int_equal(graft_config_create(&c), GRAFT_OK);
    assert_int_equal(graft_config_set(c, "job", job, NULL), GRAFT_OK);
    assert_int_equal(graft_config_set(c, "groups", "1", NULL), GRAFT_OK);
    assert_int_equal(graft_config_set(c, "group", "0", NULL), GRAFT_OK);
    assert_int_equal(
        graft_config_set(c, "etcd_endpoints", graft_etcd_server_endpoint(rtf_etcd.server), NULL),
        GRAFT_OK);
    assert_int_equal(graft_config_set(c, "transfer_address", addr, NULL), GRAFT_OK);
    if (adv != NULL)
        assert_int_equal(graft_config_set(c, "transfer_advertise", adv, NULL), GRAFT_OK);
    graft_status_t st = graft_init(c, &rt);
    graft_config_destroy(c);
    if (st != GRAFT_OK)
        return st;
    graft_region_t reg = {"w", GRAFT_REGION_PARAM, 0, GRAFT_DEVICE_HOST, &w, sizeof(w), 0, 0};
    assert_int_equal(graft_region_register(rt, &reg), GRAFT_OK);
    assert_int_equal(graft_quorum(rt, &info), GRAFT_OK);
    assert_int_equal(graft_commit(rt, &apply), GRAFT_OK);
    char key[128];
    graft_etcd_kv_t kv;
    snprintf(key, sizeof(key), "/graft/%s/members/0/0", job);
    assert_int_equal(graft_etcd_get(rtf_etcd.client, key, &kv, NULL), GRAFT_OK);
    Graft__MemberRecord *rec =
        graft__member_record__unpack(NULL, kv.value_len, (const uint8_t *)kv.value);
    graft_etcd_kv_clear(&kv);
    assert_non_null(rec);
    snprintf(published, len, "%s", rec->transfer_address);
    graft__member_record__free_unpacked(rec, NULL);
    graft_destroy(rt);
    return GRAFT_OK;
}

/* transfer_address takes what the transfer endpoint takes (an interface
 * name, with or without a port; the wildcard with transfer_advertise), and
 * the member record publishes a reachable ip:port. */
static void test_transfer_address_forms(void **state)
{
    (void)state;
    char pub[64];
    unsigned port = 0;
    assert_int_equal(init_with_address("addr-lo", "lo", NULL, pub, sizeof(pub)), GRAFT_OK);
    assert_int_equal(sscanf(pub, "127.0.0.1:%u", &port), 1);
    assert_true(port > 0);
    assert_int_equal(init_with_address("addr-any", "0.0.0.0:0", "lo", pub, sizeof(pub)),
                     GRAFT_OK);
    assert_int_equal(sscanf(pub, "127.0.0.1:%u", &port), 1);
    assert_true(port > 0);
    assert_int_equal(init_with_address("addr-ip", "127.0.0.1", NULL, pub, sizeof(pub)), GRAFT_OK);
    assert_int_equal(sscanf(pub, "127.0.0.1:%u", &port), 1);
    /* Refused, naming the field: the wildcard alone, a name that is no
     * interface, a bad port. */
    assert_int_equal(init_with_address("addr-bad", "0.0.0.0:0", NULL, pub, sizeof(pub)),
                     GRAFT_EINVAL);
    assert_int_equal(init_with_address("addr-bad", "no-such-if0", NULL, pub, sizeof(pub)),
                     GRAFT_EINVAL);
    assert_int_equal(init_with_address("addr-bad", "127.0.0.1:99999", NULL, pub, sizeof(pub)),
                     GRAFT_EINVAL);
}

/* Fail each allocation of graft_init() + graft_region_register() in turn:
 * a clean error every time, no crash, no leak (under SAN=1). */

static void test_init_allocation_failures(void **state)
{
    (void)state;
    static uint64_t buf[64];
    graft_config_t *c = NULL;
    assert_int_equal(graft_config_create(&c), GRAFT_OK);
    assert_int_equal(graft_config_set(c, "job", "alloc", NULL), GRAFT_OK);
    assert_int_equal(graft_config_set(c, "groups", "1", NULL), GRAFT_OK);
    assert_int_equal(graft_config_set(c, "group", "0", NULL), GRAFT_OK);
    assert_int_equal(
        graft_config_set(c, "etcd_endpoints", graft_etcd_server_endpoint(rtf_etcd.server), NULL),
        GRAFT_OK);
    bool completed = false;
    int failures = 0;
    for (int n = 0; n < 400 && !completed; n++) {
        graft_runtime_t *rt = NULL;
        graft_test_alloc_fail_after(n);
        graft_status_t st = graft_init(c, &rt);
        if (st == GRAFT_OK) {
            graft_region_t r = {"w", GRAFT_REGION_PARAM, 0, GRAFT_DEVICE_HOST, buf, sizeof(buf),
                                0, 0};
            st = graft_region_register(rt, &r);
            completed = st == GRAFT_OK;
        }
        if (st != GRAFT_OK) {
            assert_true(st == GRAFT_ENOMEM || graft_status_class(st) == GRAFT_CLASS_SYSTEM ||
                        st == GRAFT_ETRANSPORT);
            failures++;
        }
        graft_destroy(rt);
        graft_test_alloc_restore();
    }
    graft_config_destroy(c);
    assert_true(completed);
    assert_true(failures > 5);
}

/* ------------------------------------------- two runtimes, one process --- */

/* rtf_make(), rtf_register_ab(), rtf_step_pair(): tests/support/runtime_fixture.h. */

static void expect_blob(graft_runtime_t *rt, uint64_t quorum_id, const char *want)
{
    char buf[64] = "";
    size_t len = 0;
    assert_int_equal(graft_quorum_blob_get(rt, quorum_id, 5000, buf, sizeof(buf), &len),
                     GRAFT_OK);
    assert_int_equal(len, strlen(want));
    assert_memory_equal(buf, want, len);
}

/* The blob published for a quorum id by one group is read by the other
 * group for that id; another quorum id does not see it, and has its own. */
static void test_quorum_blob(void **state)
{
    (void)state;
    static uint64_t a0[512], b0[512], a1[512], b1[512];
    char job[64], buf[64];
    size_t len = 7777;
    snprintf(job, sizeof(job), "blob-%d", (int)getpid());
    graft_runtime_t *rt0 = rtf_make(job, 0), *rt1 = rtf_make(job, 1);

    /* Misuse: nothing reaches etcd. */
    assert_int_equal(graft_quorum_blob_publish(rt0, "x", 1), GRAFT_ESTATE);
    assert_int_equal(graft_quorum_blob_get(rt0, 1, 10, buf, sizeof(buf), &len), GRAFT_ESTATE);
    assert_int_equal(graft_quorum_blob_publish(NULL, "x", 1), GRAFT_EINVAL);
    assert_int_equal(graft_quorum_blob_publish(rt0, NULL, 1), GRAFT_EINVAL);
    assert_int_equal(graft_quorum_blob_publish(rt0, "x", 0), GRAFT_EINVAL);
    assert_int_equal(graft_quorum_blob_publish(rt0, a0, GRAFT_QUORUM_BLOB_MAX + 1), GRAFT_EINVAL);
    assert_int_equal(graft_quorum_blob_get(NULL, 1, 10, buf, sizeof(buf), &len), GRAFT_EINVAL);
    assert_int_equal(graft_quorum_blob_get(rt0, 0, 10, buf, sizeof(buf), &len), GRAFT_EINVAL);
    assert_int_equal(graft_quorum_blob_get(rt0, 1, 10, NULL, sizeof(buf), &len), GRAFT_EINVAL);
    assert_int_equal(graft_quorum_blob_get(rt0, 1, 10, buf, sizeof(buf), NULL), GRAFT_EINVAL);
    assert_int_equal(len, 7777); /* untouched on failure */

    rtf_register_ab(rt0, a0, b0, 512, 1, 2);
    rtf_register_ab(rt1, a1, b1, 512, 1, 2);

    /* Quorum 1: group 0 (replica rank 0) publishes, group 1 reads it and
     * cannot overwrite it. */
    peer_t p0 = {.rt = rt0, .publish = "blob-A"}, p1 = {.rt = rt1, .read_blob = true};
    rtf_step_pair(&p0, &p1);
    uint64_t q1 = p0.info.quorum_id;
    assert_true(q1 > 0);
    assert_int_equal(p1.info.quorum_id, q1);
    assert_int_equal(p0.info.replica_rank, 0);
    assert_int_equal(p0.pub_st, GRAFT_OK);
    assert_int_equal(p1.get_st, GRAFT_OK);
    assert_int_equal(p1.blob_len, 6);
    assert_memory_equal(p1.blob, "blob-A", 6);
    assert_int_equal(p1.late_pub_st, GRAFT_EEXIST);
    assert_true(p0.apply && p1.apply);
    expect_blob(rt0, q1, "blob-A");
    /* A buffer too small: ERANGE, nothing written. */
    len = 7777;
    assert_int_equal(graft_quorum_blob_get(rt0, q1, 1000, buf, 3, &len), GRAFT_ERANGE);
    assert_int_equal(len, 7777);
    /* A quorum id that never formed has no blob. */
    assert_int_equal(graft_quorum_blob_get(rt0, q1 + 100, 200, buf, sizeof(buf), &len),
                     GRAFT_ETIMEOUT);

    /* Group 1 is replaced: a new member set, a new quorum id, whose blob
     * is not quorum 1's. */
    graft_destroy(rt1);
    rt1 = rtf_make(job, 1);
    rtf_register_ab(rt1, a1, b1, 512, 5, 6);
    peer_t r1 = {.rt = rt1, .read_blob = true};
    pthread_t t;
    assert_int_equal(pthread_create(&t, NULL, rtf_peer_step, &r1), 0);
    graft_step_info_t info;
    bool apply = false;
    assert_int_equal(graft_quorum(rt0, &info), GRAFT_OK);
    uint64_t q2 = info.quorum_id;
    assert_true(q2 != q1);
    assert_true(info.quorum_changed);
    assert_int_equal(graft_quorum_id(rt0), q2);
    assert_int_equal(graft_quorum_blob_get(rt0, q2, 300, buf, sizeof(buf), &len),
                     GRAFT_ETIMEOUT);
    assert_int_equal(graft_quorum_blob_publish(rt0, "blob-B", 6), GRAFT_OK);
    assert_int_equal(graft_quorum_blob_publish(rt0, "blob-C", 6), GRAFT_EEXIST);
    expect_blob(rt0, q2, "blob-B");
    expect_blob(rt0, q1, "blob-A");
    assert_int_equal(graft_heal_wait(rt0), GRAFT_OK);
    assert_int_equal(graft_commit(rt0, &apply), GRAFT_OK);
    assert_int_equal(pthread_join(t, NULL), 0);
    assert_true(apply);
    assert_int_equal(r1.q_st, GRAFT_OK);
    assert_int_equal(r1.info.quorum_id, q2);
    assert_true(r1.info.healing); /* the replacement pulled group 0's state */
    assert_int_equal(r1.get_st, GRAFT_OK);
    assert_int_equal(r1.blob_len, 6);
    assert_memory_equal(r1.blob, "blob-B", 6);
    assert_int_equal(r1.late_pub_st, GRAFT_EEXIST);
    assert_true(r1.apply);
    assert_memory_equal(a1, a0, sizeof(a0));
    graft_destroy(rt1);
    graft_destroy(rt0);
}

/* transfer_backend = nccl. Host regions still move over UCX: a rank with
 * no CUDA region heals as with ucx. The unique id of an NCCL pair goes
 * through etcd, keyed by quorum and both groups (the GPU side of the pair
 * is in test_runtime_gpu). */
static void test_nccl_backend_wiring(void **state)
{
    (void)state;
    static uint64_t a0[512], b0[512], a1[512], b1[512];
    char job[64];
    uint8_t uid[GRAFT_TRANSFER_NCCL_UID_BYTES], got[GRAFT_TRANSFER_NCCL_UID_BYTES];
    snprintf(job, sizeof(job), "nccl-%d", (int)getpid());
#ifdef GRAFT_HAVE_CUDA
    const char *backend = "nccl";
#else
    const char *backend = "ucx"; /* nccl is refused here (test_config) */
#endif
    graft_runtime_t *rt0 = rtf_make_set(job, 0, "transfer_backend", backend);
    graft_runtime_t *rt1 = rtf_make_set(job, 1, "transfer_backend", backend);
    for (size_t i = 0; i < sizeof(uid); i++)
        uid[i] = (uint8_t)(i * 7 + 3);
    /* Not joined yet: nothing to publish with. */
    assert_int_not_equal(graft__rt_nccl_exchange(rt0, 1, 0, 1, true, uid, sizeof(uid)), GRAFT_OK);

    rtf_register_ab(rt0, a0, b0, 512, 1, 2);
    rtf_register_ab(rt1, a1, b1, 512, 5, 6);
    peer_t p0 = {.rt = rt0}, p1 = {.rt = rt1};
    rtf_step_pair(&p0, &p1);
    assert_int_equal(p1.heal_st, GRAFT_OK);
    assert_true(p0.apply && p1.apply);
    /* the step-0 sync gave group 1 group 0's state */
    assert_memory_equal(a1, a0, sizeof(a0));
    assert_memory_equal(b1, b0, sizeof(b0));

    uint64_t round = 7; /* a slot per round */
    assert_int_equal(graft__rt_nccl_exchange(rt0, round, 0, 1, true, uid, sizeof(uid)),
                     GRAFT_OK);
    memset(got, 0, sizeof(got));
    assert_int_equal(graft__rt_nccl_exchange(rt1, round, 0, 1, false, got, sizeof(got)),
                     GRAFT_OK);
    assert_memory_equal(got, uid, sizeof(uid));
    /* An id of the wrong size is refused, not truncated or padded. */
    assert_int_equal(graft__rt_nccl_exchange(rt0, round + 1, 0, 1, true, uid, 16), GRAFT_OK);
    assert_int_equal(graft__rt_nccl_exchange(rt1, round + 1, 0, 1, false, got, sizeof(got)),
                     GRAFT_EPROTO);
    graft_destroy(rt1);
    graft_destroy(rt0);
}

/* The recipient of fence_case(): group 1, pulling from a donor that
 * advertises an address nobody listens on, so its pull never reaches it. */
typedef struct fence_recipient {
    graft_runtime_t *rt;
    bool leave;              /* leave the job at once, or vote and stay */
    atomic_bool donor_done;  /* the donor's commit returned */
    graft_status_t heal_st;
    bool apply;
} fence_recipient_t;

static void *fence_recipient_main(void *arg)
{
    fence_recipient_t *f = arg;
    graft_step_info_t info;
    graft_status_t st = graft_quorum(f->rt, &info);
    if (st == GRAFT_OK && !f->leave) {
        f->heal_st = graft_heal_wait(f->rt);
        st = graft_commit(f->rt, &f->apply);
        while (!atomic_load(&f->donor_done))
            usleep(10000);
    }
    graft_destroy(f->rt); /* a heal still running is cancelled; the lease revoked */
    return (void *)(intptr_t)st;
}

/* Group 0 serves group 1's step-0 sync and must commit without its fence
 * timing out, though the recipient's pull never reaches it. */
static void fence_case(const char *name, fence_recipient_t *f)
{
    static uint64_t a0[512], b0[512], a1[512], b1[512];
    char job[64];
    snprintf(job, sizeof(job), "%s-%d", name, (int)getpid());
    graft_runtime_t *rt0 = rtf_make_set(job, 0, "transfer_advertise", "127.0.0.2");
    f->rt = rtf_make(job, 1);
    rtf_register_ab(rt0, a0, b0, 512, 1, 2);
    rtf_register_ab(f->rt, a1, b1, 512, 5, 6);
    pthread_t t;
    void *ret = NULL;
    assert_int_equal(pthread_create(&t, NULL, fence_recipient_main, f), 0);
    graft_step_info_t info;
    bool apply = false;
    assert_int_equal(graft_quorum(rt0, &info), GRAFT_OK);
    assert_true(info.donor);
    /* Group 0 decides on its own ranks' votes and commits. */
    assert_int_equal(graft_commit(rt0, &apply), GRAFT_OK);
    atomic_store(&f->donor_done, true);
    assert_int_equal(pthread_join(t, &ret), 0);
    assert_int_equal((graft_status_t)(intptr_t)ret, GRAFT_OK);
    assert_true(apply);
    graft_metrics_t m;
    graft_metrics_get(rt0, &m);
    assert_int_equal(m.serves, 1);
    assert_int_equal(m.fence_timeouts, 0);
    graft_destroy(rt0);
}

/* A recipient that leaves the job before it reached its donor does not
 * hold the donor's fence until fence_timeout_ms. */
static void test_fence_skips_recipient_gone(void **state)
{
    (void)state;
    fence_recipient_t f = {.leave = true};
    fence_case("fence", &f);
}

/* Nor does one that stays in the job: its heal fails, it votes no, and the
 * fence opens on that vote (a recipient that gave up sends no
 * TransferDone). */
static void test_fence_opens_on_recipient_vote(void **state)
{
    (void)state;
    fence_recipient_t f = {.leave = false};
    fence_case("fvote", &f);
    assert_int_not_equal(f.heal_st, GRAFT_OK);
    assert_false(f.apply);
}

/* The test-only broken heal: with GRAFT_TEST_SKIP_REGION=b at graft_init(),
 * a heal installs "a" but leaves "b" as it was, and reports success. */
static void test_skip_region_switch(void **state)
{
    (void)state;
    static uint64_t a0[512], b0[512], a1[512], b1[512], w[4];
    char job[64];
    graft_runtime_t *bad = NULL;
    graft_config_t *c = NULL;

    /* Misuse first: an empty value, and a name no region has. */
    assert_int_equal(graft_config_create(&c), GRAFT_OK);
    assert_int_equal(graft_config_set(c, "job", "skipbad", NULL), GRAFT_OK);
    assert_int_equal(graft_config_set(c, "groups", "1", NULL), GRAFT_OK);
    assert_int_equal(graft_config_set(c, "group", "0", NULL), GRAFT_OK);
    assert_int_equal(
        graft_config_set(c, "etcd_endpoints", graft_etcd_server_endpoint(rtf_etcd.server), NULL),
        GRAFT_OK);
    setenv("GRAFT_TEST_SKIP_REGION", "", 1);
    assert_int_equal(graft_init(c, &bad), GRAFT_EINVAL);
    assert_null(bad);
    setenv("GRAFT_TEST_SKIP_REGION", "nope", 1);
    assert_int_equal(graft_init(c, &bad), GRAFT_OK);
    unsetenv("GRAFT_TEST_SKIP_REGION");
    graft_config_destroy(c);
    graft_region_t rw = {"w", GRAFT_REGION_PARAM, 0, GRAFT_DEVICE_HOST, w, sizeof(w), 0, 0};
    assert_int_equal(graft_region_register(bad, &rw), GRAFT_OK);
    assert_int_equal(graft_quorum(bad, NULL), GRAFT_EINVAL);
    graft_destroy(bad);

    /* Group 1 alone carries the switch (the environment is read at init). */
    snprintf(job, sizeof(job), "skip-%d", (int)getpid());
    graft_runtime_t *rt0 = rtf_make(job, 0);
    setenv("GRAFT_TEST_SKIP_REGION", "b", 1);
    graft_runtime_t *rt1 = rtf_make(job, 1);
    unsetenv("GRAFT_TEST_SKIP_REGION");
    rtf_register_ab(rt0, a0, b0, 512, 1, 2);
    rtf_register_ab(rt1, a1, b1, 512, 9, 8);

    /* The cold start makes group 1 pull group 0's state. */
    peer_t p0 = {.rt = rt0}, p1 = {.rt = rt1};
    rtf_step_pair(&p0, &p1);
    assert_true(p1.info.healing);
    assert_int_equal(p1.heal_st, GRAFT_OK);
    assert_true(p0.apply && p1.apply);
    graft_metrics_t m;
    graft_metrics_get(rt1, &m);
    assert_int_equal(m.recoveries, 1);
    assert_int_equal(m.recovery_failures, 0);
    assert_memory_equal(a1, a0, sizeof(a0)); /* installed */
    for (size_t i = 0; i < 512; i++)
        assert_int_equal(b1[i], 8);          /* left as it was */
    for (size_t i = 0; i < 512; i++)
        assert_int_equal(b0[i], 2);          /* the donor is untouched */
    graft_destroy(rt1);
    graft_destroy(rt0);
}

/* A one-group job of `job` with persist_root `root`, checkpointing every
 * step, keyed with `secret` (GRAFT_JOB_SECRET, which graft_init() unsets). */
static graft_status_t ckpt_rt(const char *job, const char *root, const char *secret,
                              graft_runtime_t **rt_p)
{
    graft_config_t *c = NULL;
    assert_int_equal(setenv("GRAFT_JOB_SECRET", secret, 1), 0);
    assert_int_equal(graft_config_create(&c), GRAFT_OK);
    assert_int_equal(graft_config_set(c, "job", job, NULL), GRAFT_OK);
    assert_int_equal(graft_config_set(c, "groups", "1", NULL), GRAFT_OK);
    assert_int_equal(graft_config_set(c, "group", "0", NULL), GRAFT_OK);
    assert_int_equal(
        graft_config_set(c, "etcd_endpoints", graft_etcd_server_endpoint(rtf_etcd.server), NULL),
        GRAFT_OK);
    assert_int_equal(graft_config_set(c, "persist_root", root, NULL), GRAFT_OK);
    assert_int_equal(graft_config_set(c, "persist_every", "1", NULL), GRAFT_OK);
    graft_status_t st = graft_init(c, rt_p);
    graft_config_destroy(c);
    return st;
}

/* Checkpoints written under one secret, a later job on the same root with
 * another: neither restored (their MAC does not verify) nor thrown away by
 * a start from step 0; with the secret they were written under, restored. */
static void test_restart_other_secret_refused(void **state)
{
    char root[] = "/tmp/graft-othersecret.XXXXXX";
    uint64_t w[64];
    graft_runtime_t *rt = NULL;
    graft_step_info_t info;
    bool apply = false;
    assert_non_null(mkdtemp(root));
    graft_region_t r = {"w", GRAFT_REGION_PARAM, 0, GRAFT_DEVICE_HOST, w, sizeof(w), 0, 0};

    for (size_t i = 0; i < 64; i++)
        w[i] = i;
    assert_int_equal(ckpt_rt("secret-a", root, "the-first-secret-0123456789", &rt), GRAFT_OK);
    assert_int_equal(graft_region_register(rt, &r), GRAFT_OK);
    for (int s = 0; s < 2; s++) {
        assert_int_equal(graft_quorum(rt, &info), GRAFT_OK);
        assert_int_equal(graft_commit(rt, &apply), GRAFT_OK);
        assert_true(apply);
        w[0]++; /* the optimizer step: the checkpoint at step s holds s of them */
    }
    assert_int_equal(graft_checkpoint_wait(rt), GRAFT_OK);
    graft_destroy(rt);

    /* Another secret: the quorum's start-up decision refuses. */
    assert_int_equal(ckpt_rt("secret-b", root, "another-secret-9876543210xyz", &rt), GRAFT_OK);
    assert_int_equal(graft_region_register(rt, &r), GRAFT_OK);
    assert_int_equal(graft_quorum(rt, &info), GRAFT_ESTATELOST);
    graft_destroy(rt);

    /* The secret they were written with: restored (the newest checkpoint is
     * step 1's: the one of step 2 would be taken at step 2's commit). */
    memset(w, 0, sizeof(w));
    assert_int_equal(ckpt_rt("secret-c", root, "the-first-secret-0123456789", &rt), GRAFT_OK);
    assert_int_equal(graft_region_register(rt, &r), GRAFT_OK);
    assert_int_equal(graft_quorum(rt, &info), GRAFT_OK);
    assert_int_equal(graft_start_kind(rt), GRAFT_START_RESTORE);
    assert_int_equal(info.step, 1);
    assert_int_equal(w[0], 1);
    assert_int_equal(w[63], 63);
    graft_destroy(rt);
    char cmd[128];
    snprintf(cmd, sizeof(cmd), "rm -rf %s", root);
    assert_int_equal(system(cmd), 0);
}

/* The member state of rt's own record as its view holds it, waited for
 * until it is `want` (the view follows etcd through a watch). */
static graft_member_state_t wait_own_state(graft_runtime_t *rt, graft_member_state_t want)
{
    graft_member_state_t seen = GRAFT_MEMBER_UNSPECIFIED;
    for (int i = 0; i < 200 && seen != want; i++) {
        graft_membership_view_t *v = NULL;
        assert_int_equal(graft_membership_view_get(rt->m, &v), GRAFT_OK);
        for (size_t m = 0; m < v->n_members; m++)
            if (v->members[m].group == rt->group && v->members[m].rank == rt->rank)
                seen = v->members[m].state;
        graft_membership_view_free(v);
        if (seen != want)
            usleep(20000);
    }
    return seen;
}

/* A rank whose transfer endpoint cannot serve (its count of failed
 * accepts above 0, as after "No such device") says so in its member
 * record at the next commit, and HEALTHY again once it serves. */
static void test_cannot_serve_published(void **state)
{
    graft_config_t *c = NULL;
    graft_runtime_t *rt = NULL;
    graft_step_info_t info;
    bool apply = false;
    uint64_t w[8] = {0};
    assert_int_equal(graft_config_create(&c), GRAFT_OK);
    assert_int_equal(graft_config_set(c, "job", "cannot-serve", NULL), GRAFT_OK);
    assert_int_equal(graft_config_set(c, "groups", "1", NULL), GRAFT_OK);
    assert_int_equal(graft_config_set(c, "group", "0", NULL), GRAFT_OK);
    assert_int_equal(
        graft_config_set(c, "etcd_endpoints", graft_etcd_server_endpoint(rtf_etcd.server), NULL),
        GRAFT_OK);
    assert_int_equal(graft_init(c, &rt), GRAFT_OK);
    graft_config_destroy(c);
    graft_region_t r = {"w", GRAFT_REGION_PARAM, 0, GRAFT_DEVICE_HOST, w, sizeof(w), 0, 0};
    assert_int_equal(graft_region_register(rt, &r), GRAFT_OK);
    static const struct {
        uint64_t failures;
        graft_member_state_t state;
    } steps[] = {{0, GRAFT_MEMBER_HEALTHY},
                 {3, GRAFT_MEMBER_CANNOT_SERVE},
                 {0, GRAFT_MEMBER_HEALTHY}};
    for (size_t i = 0; i < sizeof(steps) / sizeof(steps[0]); i++) {
        atomic_store(&rt->ep->serve_failures, steps[i].failures);
        assert_int_equal(graft_quorum(rt, &info), GRAFT_OK);
        assert_int_equal(graft_commit(rt, &apply), GRAFT_OK);
        assert_true(apply);
        assert_int_equal(wait_own_state(rt, steps[i].state), steps[i].state);
    }
    graft_destroy(rt);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_bad_config_names_field),
        cmocka_unit_test(test_api_misuse),
        cmocka_unit_test(test_drift_record),
        cmocka_unit_test(test_transfer_address_forms),
        cmocka_unit_test(test_init_allocation_failures),
        cmocka_unit_test(test_quorum_blob),
        cmocka_unit_test(test_nccl_backend_wiring),
        cmocka_unit_test(test_fence_skips_recipient_gone),
        cmocka_unit_test(test_fence_opens_on_recipient_vote),
        cmocka_unit_test(test_skip_region_switch),
        cmocka_unit_test(test_restart_other_secret_refused),
        cmocka_unit_test(test_cannot_serve_published),
    };
    if (getenv("TEST_FILTER") != NULL)
        cmocka_set_test_filter(getenv("TEST_FILTER"));
    return cmocka_run_group_tests(tests, rp_setup, rp_teardown);
}
