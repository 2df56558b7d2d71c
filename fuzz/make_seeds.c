/*
 * Writes the seed corpora under fuzz/corpus/<harness>/ from real
 * encodings: the membership codec's encoders, protobuf-c packing of the
 * transfer messages, the etcd JSON gateway's answer shapes with base64
 * fields made by the client's own encoder, and the golden checkpoint of
 * tests/golden/. Run from the repository root (`make fuzz-seeds`); the
 * output is committed, so a change of an encoding shows in review.
 */
#include "etcd_internal.h"
#include "membership_internal.h"
#include "persist_internal.h"
#include "runtime_internal.h"
#include "transfer_int.h"

#include "fuzz_transfer_table.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#define GOLDEN "tests/golden/step-00000000000000000007"
#define GOLDEN8 "tests/golden/step-00000000000000000008"

static void die(const char *what)
{
    fprintf(stderr, "make_seeds: %s\n", what);
    exit(1);
}

static void seed(const char *harness, const char *name, const void *prefix, size_t prefix_len,
                 const void *data, size_t len)
{
    char path[512];
    snprintf(path, sizeof(path), "fuzz/corpus/%s", harness);
    if (mkdir(path, 0755) != 0 && errno != EEXIST)
        die(path);
    snprintf(path, sizeof(path), "fuzz/corpus/%s/%s", harness, name);
    FILE *f = fopen(path, "wb");
    if (f == NULL || fwrite(prefix, 1, prefix_len, f) != prefix_len ||
        (len > 0 && fwrite(data, 1, len, f) != len) || fclose(f) != 0)
        die(path);
}

static void seed_owned(const char *harness, const char *name, graft_status_t st, uint8_t *buf,
                       size_t len)
{
    if (st != GRAFT_OK)
        die(name);
    seed(harness, name, "", 0, buf, len);
    graft_free(buf);
}

static uint8_t *slurp(const char *path, size_t *len_p)
{
    FILE *f = fopen(path, "rb");
    if (f == NULL)
        die(path);
    uint8_t *buf = malloc(1 << 20);
    if (buf == NULL)
        die("out of memory");
    *len_p = fread(buf, 1, 1 << 20, f);
    fclose(f);
    return buf;
}

static void membership_seeds(void)
{
    uint8_t *buf = NULL;
    size_t len = 0;
    graft_status_t st;
    graft_member_t mem = {.group = 2, .rank = 1, .incarnation = 3, .host = "node-7", .pid = 4242,
                          .transfer_address = "10.0.0.7:41000", .layout_hash = 0x1234abcdull,
                          .committed_step = 120, .state = GRAFT_MEMBER_HEALTHY,
                          .lease_id = 0x694d7a1b2c3d4e5fll, .joined_unix_ms = 1700000000000ull};
    st = graft__mship_member_encode(&mem, &buf, &len);
    seed_owned("fuzz_member", "healthy", st, buf, len);
    graft_member_t bare = {.group = 0, .rank = 0, .incarnation = 1, .host = "",
                           .transfer_address = ""};
    st = graft__mship_member_encode(&bare, &buf, &len);
    seed_owned("fuzz_member", "bare", st, buf, len);

    graft__ready_t r = {.group = 1, .rank = 0, .incarnation = 2, .round = 9,
                        .committed_step = 57, .unix_ms = 1700000001234ull};
    st = graft__mship_ready_encode(&r, &buf, &len);
    seed_owned("fuzz_ready", "ready", st, buf, len);

    graft__vote_t v = {.group = 1, .rank = 3, .incarnation = 2, .quorum_id = 4, .round = 9,
                       .step = 57, .ok = true};
    st = graft__mship_vote_encode(&v, &buf, &len);
    seed_owned("fuzz_vote", "yes", st, buf, len);
    v.ok = false;
    snprintf(v.reason, sizeof(v.reason), "transfer failed: donor 2 timed out");
    st = graft__mship_vote_encode(&v, &buf, &len);
    seed_owned("fuzz_vote", "no", st, buf, len);

    uint32_t members[] = {0, 1, 2, 5};
    uint32_t donors[] = {0, 2};
    graft_recovery_t rec[] = {{.recipient = 1, .donors = donors, .n_donors = 2},
                              {.recipient = 5, .donors = donors, .n_donors = 1}};
    graft_quorum_t q = {.id = 7, .round = 9, .step = 57, .max_committed_step = 57,
                        .members = members, .n_members = 4, .recoveries = rec,
                        .n_recoveries = 2, .min_groups = 3, .formed_unix_ms = 1700000002000ull,
                        .duration_us = 1500, .members_hash = 0xfeedull};
    st = graft__mship_quorum_encode(&q, &buf, &len);
    seed_owned("fuzz_quorum", "recovering", st, buf, len);
    q.n_recoveries = 0;
    q.n_members = 1;
    st = graft__mship_quorum_encode(&q, &buf, &len);
    seed_owned("fuzz_quorum", "single", st, buf, len);

    graft_event_t ev = {.seq = 12, .kind = GRAFT_EVENT_RECOVERY_DONE, .unix_ms = 1700000003000ull,
                        .group = 1, .rank = 0, .incarnation = 2, .quorum_id = 7, .round = 9,
                        .step = 57, .members = donors, .n_members = 2, .duration_us = 250000,
                        .ok = true, .detail = "pulled 3 regions from 2 donors"};
    st = graft__mship_event_encode(&ev, &buf, &len);
    seed_owned("fuzz_event", "recovery_done", st, buf, len);
    ev.kind = GRAFT_EVENT_QUORUM_FORMED;
    ev.members = members;
    ev.n_members = 4;
    ev.detail = "";
    st = graft__mship_event_encode(&ev, &buf, &len);
    seed_owned("fuzz_event", "quorum_formed", st, buf, len);
}

static char *b64(const char *s, size_t len)
{
    char *out = NULL;
    if (graft__etcd_b64_encode(s, len, &out) != GRAFT_OK)
        die("base64");
    return out;
}

static void etcd_seeds(void)
{
    uint8_t *rec;
    size_t rec_len;
    graft_member_t mem = {.group = 0, .rank = 1, .incarnation = 1, .host = "h",
                          .transfer_address = "127.0.0.1:1"};
    if (graft__mship_member_encode(&mem, &rec, &rec_len) != GRAFT_OK)
        die("member");
    char *key = b64("/graft/job/members/0/1", 22);
    char *val = b64((const char *)rec, rec_len);
    char *key2 = b64("/graft/job/quorum", 17);
    graft_free(rec);
    char text[4096];
    int n;

    n = snprintf(text, sizeof(text),
                 "{\"header\":{\"cluster_id\":\"14841639068965178418\",\"member_id\":"
                 "\"10276657743932975437\",\"revision\":\"42\",\"raft_term\":\"2\"},"
                 "\"kvs\":[{\"key\":\"%s\",\"create_revision\":\"40\",\"mod_revision\":\"41\","
                 "\"version\":\"2\",\"value\":\"%s\",\"lease\":\"7587862127377086724\"},"
                 "{\"key\":\"%s\",\"create_revision\":\"3\",\"mod_revision\":\"3\","
                 "\"version\":\"1\"}],\"count\":\"2\",\"more\":true}",
                 key, val, key2);
    seed("fuzz_etcd_json", "range", "", 0, text, (size_t)n);
    n = snprintf(text, sizeof(text), "{\"header\":{\"revision\":\"7\"},\"count\":\"0\"}");
    seed("fuzz_etcd_json", "range_empty", "", 0, text, (size_t)n);
    n = snprintf(text, sizeof(text),
                 "{\"error\":\"etcdserver: invalid auth token\",\"code\":16,"
                 "\"message\":\"etcdserver: invalid auth token\"}");
    seed("fuzz_etcd_json", "error_token", "", 0, text, (size_t)n);
    n = snprintf(text, sizeof(text), "%s", val);
    seed("fuzz_etcd_json", "base64", "", 0, text, (size_t)n);

    /* Transactions: bytes 0 and 1 give the branch's operations (here a
     * put, then a range; then two ranges). */
    n = snprintf(text, sizeof(text),
                 "{\"header\":{\"revision\":\"44\"},\"succeeded\":true,\"responses\":["
                 "{\"response_put\":{\"header\":{\"revision\":\"44\"}}},"
                 "{\"response_range\":{\"header\":{},\"kvs\":[{\"key\":\"%s\","
                 "\"mod_revision\":\"41\",\"value\":\"%s\"}],\"count\":\"1\"}}]}",
                 key, val);
    seed("fuzz_etcd_txn", "put_range", "\x02\x04", 2, text, (size_t)n);
    n = snprintf(text, sizeof(text),
                 "{\"header\":{\"revision\":\"45\"},\"responses\":["
                 "{\"response_range\":{\"header\":{}}},"
                 "{\"response_range\":{\"header\":{},\"kvs\":[{\"key\":\"%s\","
                 "\"mod_revision\":\"3\"}],\"count\":\"1\"}}]}",
                 key2);
    seed("fuzz_etcd_txn", "failed_two_ranges", "\x02\x05", 2, text, (size_t)n);
    n = snprintf(text, sizeof(text),
                 "{\"header\":{\"revision\":\"46\"},\"ID\":\"7587862127377086724\","
                 "\"TTL\":\"5\"}");
    seed("fuzz_etcd_txn", "lease_grant", "\x00\x00", 2, text, (size_t)n);

    /* The watch harness's first byte: pieces of 7 bytes, the full limit. */
    const uint8_t cut = 6;
    n = snprintf(text, sizeof(text),
                 "{\"result\":{\"header\":{\"revision\":\"41\"},\"created\":true}}\n"
                 "{\"result\":{\"header\":{\"revision\":\"42\"},\"events\":[{\"kv\":"
                 "{\"key\":\"%s\",\"create_revision\":\"40\",\"mod_revision\":\"42\","
                 "\"version\":\"3\",\"value\":\"%s\"}},{\"type\":\"DELETE\",\"kv\":"
                 "{\"key\":\"%s\",\"mod_revision\":\"42\"}}]}}\r\n"
                 "{\"result\":{\"header\":{\"revision\":\"43\"}}}\n",
                 key, val, key2);
    seed("fuzz_etcd_watch", "created_events", &cut, 1, text, (size_t)n);
    n = snprintf(text, sizeof(text),
                 "{\"result\":{\"header\":{\"revision\":\"90\"},\"canceled\":true,"
                 "\"compact_revision\":\"77\"}}\n");
    seed("fuzz_etcd_watch", "compacted", &cut, 1, text, (size_t)n);
    n = snprintf(text, sizeof(text),
                 "{\"error\":{\"grpc_code\":16,\"http_code\":401,\"message\":"
                 "\"etcdserver: invalid auth token\",\"http_status\":\"Unauthorized\"}}\n");
    seed("fuzz_etcd_watch", "error", &cut, 1, text, (size_t)n);
    graft_free(key);
    graft_free(key2);
    graft_free(val);
}

static void pack_seed(const char *name, uint8_t which, const ProtobufCMessage *msg)
{
    size_t len = protobuf_c_message_get_packed_size(msg);
    uint8_t *buf = malloc(len + 1);
    if (buf == NULL)
        die("out of memory");
    protobuf_c_message_pack(msg, buf);
    seed("fuzz_transfer", name, &which, 1, buf, len);
    free(buf);
}

static void transfer_seeds(void)
{
    Graft__TransferRequest req = GRAFT__TRANSFER_REQUEST__INIT;
    req.version = GRAFT__XFER_WIRE_VERSION;
    static uint8_t nonce[16] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16};
    static uint8_t mac[32] = {7};
    req.nonce.data = nonce;
    req.nonce.len = sizeof(nonce);
    req.mac.data = mac;
    req.mac.len = sizeof(mac);
    req.step = 57;
    req.layout_hash = 0x1234abcdull;
    req.recipient_group = 1;
    req.rank = 0;
    req.request_id = 99;
    pack_seed("request", 0, &req.base);

    Graft__TransferChallenge ch = GRAFT__TRANSFER_CHALLENGE__INIT;
    ch.version = GRAFT__XFER_WIRE_VERSION;
    ch.nonce.data = nonce;
    ch.nonce.len = sizeof(nonce);
    pack_seed("challenge", 5, &ch.base);

    Graft__TransferDone done = GRAFT__TRANSFER_DONE__INIT;
    done.version = GRAFT__XFER_WIRE_VERSION;
    done.request_id = 99;
    done.ok = true;
    done.bytes = 1 << 20;
    done.step = 57;
    done.recipient_group = 1;
    pack_seed("done", 1, &done.base);

    Graft__ChunkRequest cr = GRAFT__CHUNK_REQUEST__INIT;
    cr.version = GRAFT__XFER_WIRE_VERSION;
    cr.region = 1;
    cr.chunk = 3;
    cr.tag = 17;
    pack_seed("chunk_request", 2, &cr.base);

    Graft__RegionDesc desc[2] = {GRAFT__REGION_DESC__INIT, GRAFT__REGION_DESC__INIT};
    desc[0].name = "param";
    desc[0].kind = GRAFT__REGION_KIND__REGION_PARAM;
    desc[0].bytes = 3 << 20;
    desc[1].name = "optim";
    desc[1].kind = GRAFT__REGION_KIND__REGION_OPTIM;
    desc[1].bytes = 4096;
    uint64_t hashes[3] = {0x1111, 0x2222, 0x3333};
    uint8_t rkey[24] = {1, 2, 3, 4, 5, 6, 7, 8};
    Graft__RegionManifest rm[2] = {GRAFT__REGION_MANIFEST__INIT, GRAFT__REGION_MANIFEST__INIT};
    Graft__RegionManifest *rmp[2] = {&rm[0], &rm[1]};
    for (int i = 0; i < 2; i++) {
        rm[i].region = &desc[i];
        rm[i].remote_address = 0x7f0000001000ull + (uint64_t)i * 0x400000;
        rm[i].rkey.data = rkey;
        rm[i].rkey.len = sizeof(rkey);
    }
    rm[0].n_chunk_hashes = 3;
    rm[0].chunk_hashes = hashes;
    Graft__ChunkHashes part = GRAFT__CHUNK_HASHES__INIT;
    Graft__ChunkHashes *partp = &part;
    part.region = 1;
    part.n_hashes = 1;
    part.hashes = hashes;
    Graft__TransferManifest m = GRAFT__TRANSFER_MANIFEST__INIT;
    m.version = GRAFT__XFER_WIRE_VERSION;
    m.step = 57;
    m.layout_hash = 0x1234abcdull;
    m.chunk_bytes = 1 << 20;
    m.n_regions = 2;
    m.regions = rmp;
    m.donor_group = 0;
    m.n_hash_parts = 1;
    m.hash_parts = &partp;
    m.hashes_final = true;
    pack_seed("manifest", 3, &m.base);
    Graft__TransferManifest refusal = GRAFT__TRANSFER_MANIFEST__INIT;
    refusal.version = GRAFT__XFER_WIRE_VERSION;
    refusal.status = GRAFT_ESTEP;
    refusal.error = "donor serves step 56, not 57";
    refusal.step = 56;
    refusal.donor_serving = true;
    pack_seed("refusal", 3, &refusal.base);
    /* As a donor sends it now: its seal (field 14) written last. */
    size_t len = graft__transfer_manifest__get_packed_size(&m);
    uint8_t *buf = malloc(len + GRAFT__XFER_SEAL_BYTES);
    if (buf == NULL)
        die("out of memory");
    graft__transfer_manifest__pack(&m, buf);
    if (graft__xfer_seal(ftt_secret, sizeof(ftt_secret) - 1, ftt_nr, ftt_nd, 0, buf, len) !=
        GRAFT_OK)
        die("seal");
    uint8_t which = 3;
    seed("fuzz_transfer", "manifest_sealed", &which, 1, buf, len + GRAFT__XFER_SEAL_BYTES);
    free(buf);
}

/* fuzz_transfer_accept: answers for the table of fuzz_transfer_table.h,
 * byte 0 = 2 * seq (the harness seals them) or 2 * seq + 1 (sealed here). */
static void accept_seed(const char *name, uint8_t seq, bool sealed,
                        const Graft__TransferManifest *m)
{
    size_t len = graft__transfer_manifest__get_packed_size(m);
    uint8_t *buf = malloc(len + GRAFT__XFER_SEAL_BYTES);
    uint8_t mode = (uint8_t)(2 * seq + (sealed ? 1 : 0));
    if (buf == NULL)
        die("out of memory");
    graft__transfer_manifest__pack(m, buf);
    if (sealed) {
        if (graft__xfer_seal(ftt_secret, sizeof(ftt_secret) - 1, ftt_nr, ftt_nd, seq, buf, len) !=
            GRAFT_OK)
            die("seal");
        len += GRAFT__XFER_SEAL_BYTES;
    }
    seed("fuzz_transfer_accept", name, &mode, 1, buf, len);
    free(buf);
}

static void transfer_accept_seeds(void)
{
    Graft__RegionDesc desc[FTT_N_REGIONS];
    Graft__RegionManifest rm[FTT_N_REGIONS], *rmp[FTT_N_REGIONS];
    Graft__ChunkHashes parts[FTT_N_REGIONS], *pp[FTT_N_REGIONS];
    static uint64_t hashes[8] = {0x11, 0x22, 0x33, 0x44, 0x55, 0x66, 0x77, 0x88};
    static uint8_t rkey[24] = {1, 0, 0, 0, 0, 0, 0, 0, 0, 1, 2, 3};
    size_t np = 0;
    for (size_t i = 0; i < FTT_N_REGIONS; i++) {
        graft__region_desc__init(&desc[i]);
        desc[i].name = (char *)ftt_regions[i].name;
        desc[i].bytes = ftt_regions[i].bytes;
        graft__region_manifest__init(&rm[i]);
        rm[i].region = &desc[i];
        rm[i].remote_address = 0x7f0000001000ull + i * 0x10000;
        if (ftt_regions[i].bytes > 0) {
            rm[i].rkey.data = rkey;
            rm[i].rkey.len = sizeof(rkey);
        }
        rmp[i] = &rm[i];
        uint64_t n = (ftt_regions[i].bytes + FTT_CHUNK - 1) / FTT_CHUNK;
        if (n == 0)
            continue;
        graft__chunk_hashes__init(&parts[np]);
        parts[np].region = (uint32_t)i;
        parts[np].n_hashes = (size_t)n;
        parts[np].hashes = hashes;
        pp[np] = &parts[np];
        np++;
    }
    Graft__TransferManifest m = GRAFT__TRANSFER_MANIFEST__INIT;
    m.version = GRAFT__XFER_WIRE_VERSION;
    m.step = FTT_STEP;
    m.layout_hash = FTT_LAYOUT_HASH;
    m.chunk_bytes = FTT_CHUNK;
    m.n_regions = FTT_N_REGIONS;
    m.regions = rmp;
    m.n_hash_parts = 1;
    m.hash_parts = pp;
    accept_seed("manifest", 0, false, &m);
    accept_seed("manifest_sealed", 0, true, &m);
    Graft__TransferManifest part = GRAFT__TRANSFER_MANIFEST__INIT;
    part.version = GRAFT__XFER_WIRE_VERSION;
    part.step = FTT_STEP;
    part.layout_hash = FTT_LAYOUT_HASH;
    part.chunk_bytes = FTT_CHUNK;
    part.n_hash_parts = np - 1;
    part.hash_parts = pp + 1;
    part.hashes_final = true;
    accept_seed("hash_part", 1, false, &part);
    accept_seed("hash_part_sealed", 1, true, &part);
    Graft__TransferManifest busy = GRAFT__TRANSFER_MANIFEST__INIT;
    busy.version = GRAFT__XFER_WIRE_VERSION;
    busy.status = GRAFT_EBUSY;
    busy.error = "queued at place 0; serving 4 recipients at once";
    busy.step = FTT_STEP;
    busy.donor_serving = true;
    accept_seed("queued", 0, false, &busy);
    Graft__TransferManifest refused = GRAFT__TRANSFER_MANIFEST__INIT;
    refused.version = GRAFT__XFER_WIRE_VERSION;
    refused.status = GRAFT_ETOKEN;
    refused.error = "request not authenticated with the job secret";
    accept_seed("unsealed_refusal", 0, false, &refused);
    uint8_t mode = 1; /* as it came: no seal */
    size_t len = graft__transfer_manifest__get_packed_size(&refused);
    uint8_t buf[256];
    if (len > sizeof(buf))
        die("refusal too long");
    graft__transfer_manifest__pack(&refused, buf);
    seed("fuzz_transfer_accept", "unsealed_as_it_came", &mode, 1, buf, len);
}

static void persist_seeds(void)
{
    size_t len;
    uint8_t *buf = slurp(GOLDEN "/" GP_MANIFEST_PB, &len);
    /* Odd first byte: the file as is; even: the payload, wrapped by the
     * harness. The second byte is the step. */
    seed("fuzz_manifest", "golden7_file", "\x01\x07", 2, buf, len);
    seed("fuzz_manifest", "golden7_payload", "\x00\x07", 2, buf + GP_MANIFEST_HEADER_BYTES,
         len - GP_MANIFEST_HEADER_BYTES);
    free(buf);
    buf = slurp(GOLDEN8 "/" GP_MANIFEST_PB, &len);
    seed("fuzz_manifest", "golden8_payload", "\x00\x08", 2, buf + GP_MANIFEST_HEADER_BYTES,
         len - GP_MANIFEST_HEADER_BYTES);
    free(buf);
    buf = slurp(GOLDEN "/shard-0-of-2", &len);
    seed("fuzz_shard", "golden7_0_file", "\x01", 1, buf, len);
    seed("fuzz_shard", "golden7_0_repair", "\x00", 1, buf, len);
    free(buf);
    buf = slurp(GOLDEN8 "/shard-1-of-2", &len);
    seed("fuzz_shard", "golden8_1_repair", "\x00", 1, buf, len);
    free(buf);
}

/* The records of a real checkpoint of one and of two ranks, step 1, as
 * graft_persist_shard_wait() hands them to the committing rank. */
static void shard_record_seeds(void)
{
    char root[] = "/tmp/graft-seeds.XXXXXX";
    if (mkdtemp(root) == NULL)
        die("mkdtemp");
    static uint8_t param[3 * 4096], optim[4096];
    for (size_t i = 0; i < sizeof(param); i++)
        param[i] = (uint8_t)(i * 7);
    graft_persist_config_t cfg = {.root = root, .chunk_bytes = 4096};
    graft_persist_writer_t *w = NULL;
    if (graft_persist_writer_create(&cfg, &w) != GRAFT_OK)
        die("writer");
    for (uint32_t ranks = 1; ranks <= 2; ranks++) {
        uint8_t *info[2] = {NULL, NULL};
        size_t len[2] = {0, 0};
        for (uint32_t r = 0; r < ranks; r++) {
            graft_persist_region_t regions[2] = {
                {.name = "param", .kind = GRAFT_PERSIST_KIND_PARAM, .ptr = param,
                 .bytes = sizeof(param) / ranks, .global_offset = r * sizeof(param) / ranks,
                 .global_bytes = sizeof(param)},
                {.name = "optim", .kind = GRAFT_PERSIST_KIND_OPTIM, .ptr = optim,
                 .bytes = sizeof(optim) / ranks, .global_offset = r * sizeof(optim) / ranks,
                 .global_bytes = sizeof(optim)}};
            if (graft_persist_shard_write(w, ranks, r, ranks, regions, 2) != GRAFT_OK ||
                graft_persist_shard_wait(w, ranks, r, &info[r], &len[r]) != GRAFT_OK)
                die("shard");
        }
        /* The harness cuts two ranks' input where bytes 1 and 2 say. */
        uint8_t *both = malloc(len[0] + len[1] + 1);
        if (both == NULL)
            die("out of memory");
        memcpy(both, info[0], len[0]);
        if (ranks == 2)
            memcpy(both + len[0], info[1], len[1]);
        uint8_t head[3] = {(uint8_t)(ranks - 1), (uint8_t)(len[0] & 0xff),
                           (uint8_t)(len[0] >> 8)};
        seed("fuzz_shard_record", ranks == 1 ? "one_rank" : "two_ranks", head, 3, both,
             len[0] + (ranks == 2 ? len[1] : 0));
        free(both);
        graft_free(info[0]);
        graft_free(info[1]);
    }
    graft_persist_writer_destroy(w);
    char cmd[sizeof(root) + 16];
    snprintf(cmd, sizeof(cmd), "rm -rf %s", root);
    if (system(cmd) != 0)
        die(cmd);
}

/* fuzz_runtime_msg: a steady-path message under the harness's secret
 * (byte 0 even) and a job secret record (byte 0 odd). */
static void runtime_seeds(void)
{
    static const uint8_t secret[] = "fuzz-secret-of-sixteen-bytes-or-more";
    graft__step_msg_t m = {.kind = 4, .quorum_id = 7, .members_hash = 0x1234, .epoch_round = 3,
                           .step = 57, .group = 1, .rank = 0, .round = 0, .ok = true};
    uint8_t buf[256], even = 0, odd = 1;
    size_t len = 0;
    if (graft__rt_step_encode(secret, sizeof(secret) - 1, &m, buf, sizeof(buf), &len) != GRAFT_OK)
        die("step message");
    seed("fuzz_runtime_msg", "vote", &even, 1, buf, len);
    graft__step_msg_t d = {.kind = 9, .quorum_id = 7, .step = 57, .group = 1, .rank = 2,
                           .ok = false, .incarnation = 5, .lease = 0x7ffe1234, .etcd_round = 9,
                           .prev_round = 8, .reason = "heal failed"};
    if (graft__rt_step_encode(secret, sizeof(secret) - 1, &d, buf, sizeof(buf), &len) != GRAFT_OK)
        die("delegated vote");
    seed("fuzz_runtime_msg", "vote_delegate", &even, 1, buf, len);
    uint8_t *rec = NULL;
    if (graft__rt_secret_encode(secret, 32, &rec, &len) != GRAFT_OK)
        die("secret record");
    seed("fuzz_runtime_msg", "secret", &odd, 1, rec, len);
    graft_free(rec);
}

/* fuzz_drift, fuzz_progress, fuzz_eventseq: the runtime's DriftRecord
 * (of the harness's region table, and of another table that shares one
 * name with it), its ProgressRecord, and the history's counter. */
static void record_seeds(void)
{
    static char *mine[] = {"params", "optim", "rng"};
    static char *other[] = {"optim", "embedding"};
    graft__rt_region_t regions[3];
    graft_runtime_t *rt = calloc(1, sizeof(*rt));
    uint64_t hashes[3] = {0x1111222233334444ull, 0x5555666677778888ull, 42};
    uint8_t *buf = NULL;
    size_t len = 0;
    if (rt == NULL)
        die("out of memory");
    memset(regions, 0, sizeof(regions));
    for (size_t i = 0; i < 3; i++)
        regions[i].name = mine[i];
    rt->regions = regions;
    rt->n_regions = 3;
    rt->group = 3;
    graft_status_t st = graft__rt_drift_encode(rt, hashes, &buf, &len);
    seed_owned("fuzz_drift", "three_regions", st, buf, len);
    for (size_t i = 0; i < 2; i++)
        regions[i].name = other[i];
    rt->n_regions = 2;
    rt->group = 0;
    st = graft__rt_drift_encode(rt, hashes, &buf, &len);
    seed_owned("fuzz_drift", "other_table", st, buf, len);
    free(rt);
    st = graft__rt_progress_encode(1234, &buf, &len);
    seed_owned("fuzz_progress", "step_1234", st, buf, len);
    st = graft__rt_progress_encode(0, &buf, &len);
    seed_owned("fuzz_progress", "step_0", st, buf, len);
    seed("fuzz_eventseq", "one", "", 0, "1", 1);
    seed("fuzz_eventseq", "seq_4096", "", 0, "4096", 4);
    seed("fuzz_eventseq", "max", "", 0, "18446744073709551615", 20);
}

int main(void)
{
    if (mkdir("fuzz/corpus", 0755) != 0 && errno != EEXIST)
        die("fuzz/corpus (run from the repository root)");
    membership_seeds();
    etcd_seeds();
    transfer_seeds();
    transfer_accept_seeds();
    persist_seeds();
    shard_record_seeds();
    runtime_seeds();
    record_seeds();
    return 0;
}
