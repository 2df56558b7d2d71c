/*
 * Allocation-failure torture for every decoder of outside bytes: each
 * allocation of a decode fails in turn, and every failure must come back
 * as an error (GRAFT_ENOMEM where the decoder can tell, never success with
 * a half-filled result), leave nothing allocated, and the run without a
 * failure must decode. The inputs are real encodings: the codecs' own
 * encoders, the gateway's answer shapes and the golden checkpoint.
 *
 * The shard records a committing rank decodes (graft_persist_commit) are
 * tortured with a real two-rank checkpoint.
 *
 * Covered elsewhere: the etcd range answer and one watch line
 * (test_etcd_json.c), a whole checkpoint save and restore (test_persist.c),
 * pulls with the transfer messages on the wire (test_transfer_faults.c).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "alloc_fail.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "persist_fixture.h"

#include "etcd/etcd_internal.h"
#include "membership/membership_internal.h"
#include "persist/persist_internal.h"
#include "transfer/transfer_int.h"

#ifndef GRAFT_GOLDEN_DIR
#define GRAFT_GOLDEN_DIR "tests/golden"
#endif
#define GOLDEN_STEP7 GRAFT_GOLDEN_DIR "/step-00000000000000000007"

/* One decode: returns its status and frees whatever it produced. */
typedef graft_status_t (*decode_fn)(void *ctx);

/*
 * Fail allocation n of fn for n = 0, 1, ... until a run sees no refusal.
 * Each failed run must return an error (exactly GRAFT_ENOMEM unless
 * any_error) and leave as many blocks allocated as before it. Returns the
 * number of allocations the successful run made.
 */
static int torture(const char *what, decode_fn fn, void *ctx, bool any_error)
{
    for (int n = 0; n < 10000; n++) {
        int live = graft_test_alloc_live();
        graft_test_alloc_fail_after(n);
        graft_status_t st = fn(ctx);
        graft_test_alloc_restore();
        int refused = graft_test_alloc_refused();
        if (graft_test_alloc_live() != live)
            fail_msg("%s: %d block(s) leaked with allocation %d failing", what,
                     graft_test_alloc_live() - live, n);
        if (refused == 0) {
            if (st != GRAFT_OK)
                fail_msg("%s: %s with no allocation failing", what, graft_status_string(st));
            return n;
        }
        if (st == GRAFT_OK)
            fail_msg("%s: success with allocation %d failing", what, n);
        if (!any_error && st != GRAFT_ENOMEM)
            fail_msg("%s: %s, not GRAFT_ENOMEM, with allocation %d failing", what,
                     graft_status_string(st), n);
    }
    fail_msg("%s: still failing after 10000 allocations", what);
    return -1;
}

typedef struct bytes {
    uint8_t *data;
    size_t len;
} bytes_t;

/* ------------------------------------------------------- membership --- */

static graft_status_t dec_member(void *ctx)
{
    bytes_t *b = ctx;
    graft_member_t m;
    graft_status_t st = graft__mship_member_decode(b->data, b->len, &m);
    if (st == GRAFT_OK) {
        assert_string_equal(m.host, "node-7");
        assert_string_equal(m.transfer_address, "10.0.0.7:41000");
        graft__mship_member_clear(&m);
    }
    return st;
}

static graft_status_t dec_ready(void *ctx)
{
    bytes_t *b = ctx;
    graft__ready_t r;
    graft_status_t st = graft__mship_ready_decode(b->data, b->len, &r);
    if (st == GRAFT_OK)
        assert_int_equal(r.round, 9);
    return st;
}

static graft_status_t dec_vote(void *ctx)
{
    bytes_t *b = ctx;
    graft__vote_t v;
    graft_status_t st = graft__mship_vote_decode(b->data, b->len, &v);
    if (st == GRAFT_OK)
        assert_string_equal(v.reason, "donor 2 timed out");
    return st;
}

static graft_status_t dec_quorum(void *ctx)
{
    bytes_t *b = ctx;
    graft_quorum_t *q = NULL;
    graft_status_t st = graft__mship_quorum_decode(b->data, b->len, &q);
    if (st == GRAFT_OK) {
        assert_int_equal(q->n_members, 4);
        assert_int_equal(q->n_recoveries, 2);
        assert_int_equal(q->recoveries[0].n_donors, 2);
        graft_membership_quorum_free(q);
    } else {
        assert_null(q);
    }
    return st;
}

static graft_status_t dec_event(void *ctx)
{
    bytes_t *b = ctx;
    graft_event_t ev;
    graft_status_t st = graft__mship_event_decode(b->data, b->len, &ev);
    if (st == GRAFT_OK) {
        assert_int_equal(ev.n_members, 2);
        assert_string_equal(ev.detail, "pulled 3 regions from 2 donors");
        graft__mship_event_clear(&ev);
    }
    return st;
}

static void test_membership_records(void **state)
{
    (void)state;
    bytes_t b;
    graft_member_t mem = {.group = 2, .rank = 1, .incarnation = 3, .host = "node-7", .pid = 1,
                          .transfer_address = "10.0.0.7:41000", .state = GRAFT_MEMBER_HEALTHY};
    assert_int_equal(graft__mship_member_encode(&mem, &b.data, &b.len), GRAFT_OK);
    assert_true(torture("member record", dec_member, &b, false) > 0);
    graft_free(b.data);

    graft__ready_t r = {.group = 1, .incarnation = 2, .round = 9, .committed_step = 57};
    assert_int_equal(graft__mship_ready_encode(&r, &b.data, &b.len), GRAFT_OK);
    assert_true(torture("ready record", dec_ready, &b, false) > 0);
    graft_free(b.data);

    graft__vote_t v = {.group = 1, .incarnation = 2, .quorum_id = 4, .round = 9, .step = 57,
                       .reason = "donor 2 timed out"};
    assert_int_equal(graft__mship_vote_encode(&v, &b.data, &b.len), GRAFT_OK);
    assert_true(torture("vote", dec_vote, &b, false) > 0);
    graft_free(b.data);

    uint32_t members[] = {0, 1, 2, 5}, donors[] = {0, 2};
    graft_recovery_t rec[] = {{.recipient = 1, .donors = donors, .n_donors = 2},
                              {.recipient = 5, .donors = donors, .n_donors = 1}};
    graft_quorum_t q = {.id = 7, .round = 9, .step = 57, .members = members, .n_members = 4,
                        .recoveries = rec, .n_recoveries = 2, .min_groups = 3};
    assert_int_equal(graft__mship_quorum_encode(&q, &b.data, &b.len), GRAFT_OK);
    /* unpack, quorum, members, recoveries, two donor lists */
    assert_true(torture("quorum record", dec_quorum, &b, false) >= 5);
    graft_free(b.data);

    graft_event_t ev = {.seq = 12, .kind = GRAFT_EVENT_RECOVERY_DONE, .members = donors,
                        .n_members = 2, .ok = true, .detail = "pulled 3 regions from 2 donors"};
    assert_int_equal(graft__mship_event_encode(&ev, &b.data, &b.len), GRAFT_OK);
    assert_true(torture("event", dec_event, &b, false) > 0);
    graft_free(b.data);
}

/* ------------------------------------------------------------- etcd --- */

static graft_status_t dec_b64(void *ctx)
{
    const char *in = ctx;
    uint8_t *out = NULL;
    size_t len = 0;
    graft_status_t st = graft__etcd_b64_decode(in, strlen(in), &out, &len);
    if (st == GRAFT_OK) {
        assert_int_equal(len, 11);
        assert_memory_equal(out, "graft-value", 11);
        graft_free(out);
    } else {
        assert_null(out);
    }
    return st;
}

static graft_status_t dec_kv(void *ctx)
{
    graft_etcd_kv_t kv;
    graft_status_t st = graft__etcd_kv_decode(ctx, &kv);
    if (st == GRAFT_OK) {
        assert_string_equal(kv.key, "/graft/j/quorum");
        assert_int_equal(kv.value_len, 11);
        assert_int_equal(kv.mod_revision, 41);
        graft_etcd_kv_clear(&kv);
    }
    return st;
}

static graft_status_t dec_txn(void *ctx)
{
    const graft_etcd_op_t ops[3] = {{.type = GRAFT_ETCD_OP_PUT},
                                    {.type = GRAFT_ETCD_OP_RANGE},
                                    {.type = GRAFT_ETCD_OP_RANGE}};
    graft_etcd_txn_result_t r = {0};
    graft_status_t st = graft__etcd_txn_decode(ctx, ops, 3, &r);
    if (st == GRAFT_OK) {
        assert_int_equal(r.n_ranges, 2);
        assert_int_equal(r.ranges[1].n_kvs, 1);
        assert_int_equal(r.ranges[1].revision, 44);
    }
    graft_etcd_txn_result_clear(&r);
    return st;
}

typedef struct split_ctx {
    const char *stream;
    size_t lines;
} split_ctx_t;

static graft_status_t count_line(void *arg, const char *line, size_t len)
{
    split_ctx_t *c = arg;
    graft_etcd_watch_msg_t m;
    graft_status_t st = graft__etcd_watch_msg_decode(line, len, &m);
    if (st != GRAFT_OK)
        return st;
    graft__etcd_watch_msg_clear(&m);
    c->lines++;
    return GRAFT_OK;
}

/* The stream in pieces of 5 bytes, as curl may deliver it. */
static graft_status_t dec_stream(void *ctx)
{
    split_ctx_t *c = ctx;
    graft_buf_t line;
    graft_status_t st = GRAFT_OK;
    size_t len = strlen(c->stream);
    graft__buf_init(&line);
    c->lines = 0;
    for (size_t off = 0; off < len && st == GRAFT_OK; off += 5)
        st = graft__etcd_watch_split(&line, c->stream + off, len - off < 5 ? len - off : 5,
                                     GRAFT_ETCD_MAX_WATCH_LINE, count_line, c);
    graft__buf_free(&line);
    if (st == GRAFT_OK)
        assert_int_equal(c->lines, 3);
    return st;
}

static void test_etcd_answers(void **state)
{
    (void)state;
    char *val = NULL, *key = NULL;
    assert_int_equal(graft__etcd_b64_encode("graft-value", 11, &val), GRAFT_OK);
    assert_int_equal(graft__etcd_b64_encode("/graft/j/quorum", 15, &key), GRAFT_OK);
    assert_true(torture("base64", dec_b64, val, false) > 0);

    char text[1024];
    snprintf(text, sizeof(text),
             "{\"key\":\"%s\",\"create_revision\":\"40\",\"mod_revision\":\"41\","
             "\"version\":\"2\",\"value\":\"%s\",\"lease\":\"7587862127377086724\"}",
             key, val);
    json_error_t jerr;
    json_t *kv = json_loads(text, 0, &jerr);
    assert_non_null(kv);
    assert_true(torture("key-value", dec_kv, kv, false) >= 2);
    json_decref(kv);

    snprintf(text, sizeof(text),
             "{\"header\":{\"revision\":\"44\"},\"succeeded\":true,\"responses\":["
             "{\"response_put\":{}},{\"response_range\":{\"header\":{}}},"
             "{\"response_range\":{\"kvs\":[{\"key\":\"%s\",\"value\":\"%s\","
             "\"mod_revision\":\"41\"}],\"count\":\"1\"}}]}",
             key, val);
    json_t *txn = json_loads(text, 0, &jerr);
    assert_non_null(txn);
    assert_true(torture("transaction answer", dec_txn, txn, false) >= 3);
    json_decref(txn);

    snprintf(text, sizeof(text),
             "{\"result\":{\"header\":{\"revision\":\"41\"},\"created\":true}}\n"
             "{\"result\":{\"events\":[{\"kv\":{\"key\":\"%s\",\"value\":\"%s\","
             "\"mod_revision\":\"42\"}}]}}\r\n\n"
             "{\"result\":{\"header\":{\"revision\":\"43\"}}}\n",
             key, val);
    split_ctx_t c = {.stream = text};
    assert_true(torture("watch stream", dec_stream, &c, false) > 0);
    graft_free(key);
    graft_free(val);
}

/* ---------------------------------------------------------- persist --- */

static graft_status_t dec_manifest(void *ctx)
{
    (void)ctx;
    char why[256];
    Graft__CheckpointManifest *m = NULL;
    graft_status_t st = graft__manifest_read(GOLDEN_STEP7, 7, &m, why, sizeof(why));
    if (st == GRAFT_OK) {
        assert_int_equal(m->step, 7);
        graft__manifest_free(m);
    } else {
        assert_null(m);
    }
    return st;
}

static graft_status_t dec_shard(void *ctx)
{
    (void)ctx;
    char why[256];
    graft__shard_t *s = NULL;
    graft_status_t st = graft__shard_open(GOLDEN_STEP7 "/shard-0-of-2", &s, why, sizeof(why));
    if (st != GRAFT_OK)
        return st;
    assert_true(s->footer.chunk_count > 0);
    for (uint64_t i = 0; i < s->footer.chunk_count && st == GRAFT_OK; i++) {
        const uint8_t *raw = NULL;
        st = graft__shard_chunk(s, i, &raw, why, sizeof(why));
    }
    graft__shard_close(s);
    return st;
}

static void test_checkpoint_files(void **state)
{
    (void)state;
    assert_true(torture("manifest reader", dec_manifest, NULL, false) > 0);
    assert_true(torture("shard reader", dec_shard, NULL, false) > 0);
}

typedef struct commit_ctx {
    char *root;
    uint8_t *info[2];
    size_t len[2];
} commit_ctx_t;

/* The committing rank decodes the other ranks' records; a commit that
 * fails leaves no checkpoint behind, one that succeeds leaves one that
 * verifies. */
static graft_status_t dec_commit(void *ctx)
{
    commit_ctx_t *c = ctx;
    const uint8_t *infos[2] = {c->info[1], c->info[0]}; /* any order */
    size_t lens[2] = {c->len[1], c->len[0]};
    graft_status_t st = graft_persist_commit(c->root, 1, 2, infos, lens, NULL, NULL);
    graft_test_alloc_restore();
    graft_status_t v = graft_persist_verify(c->root, 1, GRAFT_PERSIST_VERIFY_QUICK, NULL);
    if (st == GRAFT_OK)
        assert_int_equal(v, GRAFT_OK);
    else
        assert_int_equal(v, GRAFT_ENOTFOUND);
    return st;
}

static void test_shard_records(void **state)
{
    (void)state;
    static uint8_t param[3 * 4096], optim[4096];
    pt_fill(param, sizeof(param), 1);
    pt_fill(optim, sizeof(optim), 2);
    commit_ctx_t c = {.root = pt_tmpdir()};
    graft_persist_config_t cfg = {.root = c.root, .chunk_bytes = 4096};
    graft_persist_writer_t *w = NULL;
    assert_int_equal(graft_persist_writer_create(&cfg, &w), GRAFT_OK);
    for (uint32_t r = 0; r < 2; r++) {
        graft_persist_region_t regions[2] = {
            {.name = "param", .kind = GRAFT_PERSIST_KIND_PARAM, .ptr = param + r * 6144,
             .bytes = 6144, .global_offset = r * 6144, .global_bytes = sizeof(param)},
            {.name = "optim", .kind = GRAFT_PERSIST_KIND_OPTIM, .ptr = optim + r * 2048,
             .bytes = 2048, .global_offset = r * 2048, .global_bytes = sizeof(optim)}};
        assert_int_equal(graft_persist_shard_write(w, 1, r, 2, regions, 2), GRAFT_OK);
        assert_int_equal(graft_persist_shard_wait(w, 1, r, &c.info[r], &c.len[r]), GRAFT_OK);
    }
    graft_persist_writer_destroy(w);
    /* A record lost to memory is reported as a bad record (GRAFT_EPROTO):
     * any error, as long as it is one. */
    assert_true(torture("shard records", dec_commit, &c, true) > 0);
    graft_free(c.info[0]);
    graft_free(c.info[1]);
    pt_rmtree(c.root);
}

/* --------------------------------------------------------- transfer --- */

/* The transfer handlers tell a peer's garbage from their own lack of
 * memory by the tracked allocator's flag: it must be set exactly when an
 * allocation failed. */
static graft_status_t dec_xfer_manifest(void *ctx)
{
    bytes_t *b = ctx;
    bool oom = false;
    ProtobufCAllocator pa = graft__pb_allocator_tracked(&oom);
    Graft__TransferManifest *m = graft__transfer_manifest__unpack(&pa, b->len, b->data);
    if (m == NULL) {
        assert_true(oom);
        return GRAFT_ENOMEM;
    }
    assert_false(oom);
    assert_int_equal(m->n_regions, 2);
    assert_string_equal(m->regions[1]->region->name, "optim");
    graft__transfer_manifest__free_unpacked(m, &graft__pb_allocator);
    return GRAFT_OK;
}

static graft_status_t dec_xfer_request(void *ctx)
{
    bytes_t *b = ctx;
    bool oom = false;
    ProtobufCAllocator pa = graft__pb_allocator_tracked(&oom);
    Graft__TransferRequest *r = graft__transfer_request__unpack(&pa, b->len, b->data);
    if (r == NULL) {
        assert_true(oom);
        return GRAFT_ENOMEM;
    }
    assert_false(oom);
    assert_int_equal(r->step, 57);
    graft__transfer_request__free_unpacked(r, &graft__pb_allocator);
    return GRAFT_OK;
}

static void pack(const ProtobufCMessage *msg, bytes_t *b)
{
    b->len = protobuf_c_message_get_packed_size(msg);
    b->data = malloc(b->len + 1);
    assert_non_null(b->data);
    assert_int_equal(protobuf_c_message_pack(msg, b->data), b->len);
}

static void test_transfer_messages(void **state)
{
    (void)state;
    bytes_t b;
    Graft__RegionDesc desc[2] = {GRAFT__REGION_DESC__INIT, GRAFT__REGION_DESC__INIT};
    Graft__RegionManifest rm[2] = {GRAFT__REGION_MANIFEST__INIT, GRAFT__REGION_MANIFEST__INIT};
    Graft__RegionManifest *rmp[2] = {&rm[0], &rm[1]};
    uint64_t hashes[3] = {1, 2, 3};
    uint8_t rkey[16] = {1, 2, 3};
    desc[0].name = "param";
    desc[1].name = "optim";
    for (int i = 0; i < 2; i++) {
        desc[i].bytes = 3u << 20;
        rm[i].region = &desc[i];
        rm[i].rkey.data = rkey;
        rm[i].rkey.len = sizeof(rkey);
        rm[i].n_chunk_hashes = 3;
        rm[i].chunk_hashes = hashes;
    }
    Graft__TransferManifest m = GRAFT__TRANSFER_MANIFEST__INIT;
    m.version = 1;
    m.step = 57;
    m.n_regions = 2;
    m.regions = rmp;
    pack(&m.base, &b);
    assert_true(torture("transfer manifest", dec_xfer_manifest, &b, false) >= 5);
    free(b.data);

    Graft__TransferRequest req = GRAFT__TRANSFER_REQUEST__INIT;
    req.version = 1;
    static uint8_t nonce[16] = {1}, mac[32] = {2};
    req.nonce.data = nonce;
    req.nonce.len = sizeof(nonce);
    req.mac.data = mac;
    req.mac.len = sizeof(mac);
    req.step = 57;
    pack(&req.base, &b);
    assert_true(torture("transfer request", dec_xfer_request, &b, false) > 0);
    free(b.data);
}

int main(void)
{
    /* Every refused allocation is logged where it is detected; the
     * statuses are what is checked. */
    graft_log_level_set(GRAFT_LOG_OFF);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_membership_records),
        cmocka_unit_test(test_etcd_answers),
        cmocka_unit_test(test_checkpoint_files),
        cmocka_unit_test(test_shard_records),
        cmocka_unit_test(test_transfer_messages),
    };
    if (getenv("TEST_FILTER") != NULL)
        cmocka_set_test_filter(getenv("TEST_FILTER"));
    return cmocka_run_group_tests(tests, NULL, NULL);
}
