/*
 * The runtime's decoders of outside bytes: the steady path's StepMessage
 * with its MAC (from any peer that reaches the transfer port) and the
 * job's JobSecret record (from etcd). Byte 0 picks: even, the rest is a
 * message checked under a fixed secret (a forgery is refused, never
 * accepted; what is accepted survives a round trip); odd, the rest is a
 * secret record. A third use of the input: its bytes as a message's
 * fields, encoded under the secret, must decode to the same fields.
 */
#include "fuzz_common.h"
#include "runtime_internal.h"

#include <assert.h>

static const uint8_t secret[] = "fuzz-secret-of-sixteen-bytes-or-more";

static void fields_round_trip(const uint8_t *d, size_t n)
{
    graft__step_msg_t m = {0}, back;
    uint8_t buf[512];
    size_t len = 0;
    uint64_t v[10] = {0};
    memcpy(v, d, n < sizeof(v) ? n : sizeof(v));
    m.kind = (int)(v[0] % 10);
    m.quorum_id = v[1];
    m.members_hash = v[2];
    m.epoch_round = v[3];
    m.step = v[4];
    m.group = (uint32_t)v[5];
    m.rank = (uint32_t)(v[5] >> 32);
    m.round = (uint32_t)(v[0] >> 8);
    m.ok = (v[0] >> 40) & 1;
    /* The delegated records' fields (carried by their kinds only). */
    m.incarnation = v[6];
    m.lease = (int64_t)v[7];
    m.etcd_round = v[8];
    m.prev_round = v[9];
    size_t rlen = n > sizeof(v) ? GRAFT_MIN(n - sizeof(v), sizeof(m.reason)) : 0;
    for (size_t i = 0; i < rlen; i++)
        m.reason[i] = (char)('a' + d[sizeof(v) + i] % 26);
    bool delegated = graft__rt_step_delegated(m.kind);
    if (graft__rt_step_encode(secret, sizeof(secret) - 1, &m, buf, sizeof(buf), &len) != GRAFT_OK)
        return;
    assert(graft__rt_step_decode(secret, sizeof(secret) - 1, buf, len, &back) == GRAFT_OK);
    assert(back.kind == m.kind && back.quorum_id == m.quorum_id &&
           back.members_hash == m.members_hash && back.epoch_round == m.epoch_round &&
           back.step == m.step && back.group == m.group && back.rank == m.rank &&
           back.round == m.round && back.ok == m.ok);
    assert(!delegated || (back.incarnation == m.incarnation && back.lease == m.lease &&
                          back.etcd_round == m.etcd_round && back.prev_round == m.prev_round &&
                          memcmp(back.reason, m.reason, sizeof(m.reason)) == 0));
    /* The same bytes under another secret are a forgery. */
    assert(graft__rt_step_decode((const uint8_t *)"another-secret-16b", 18, buf, len, &back) ==
           GRAFT_ETOKEN);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1)
        return 0;
    const uint8_t *msg = data + 1;
    size_t len = size - 1;
    if ((data[0] & 1) == 0) {
        graft__step_msg_t m;
        graft_status_t st = graft__rt_step_decode(secret, sizeof(secret) - 1, msg, len, &m);
        assert(st == GRAFT_OK || st == GRAFT_ETOKEN || st == GRAFT_EPROTO ||
               st == GRAFT_EFORMAT || st == GRAFT_ENOMEM);
        fields_round_trip(msg, len);
    } else {
        uint8_t out[GRAFT_TRANSFER_SECRET_MAX_BYTES];
        size_t n = 0;
        if (graft__rt_secret_decode(msg, len, out, sizeof(out), &n) == GRAFT_OK)
            assert(n >= GRAFT_TRANSFER_SECRET_MIN_BYTES && n <= sizeof(out));
    }
    return 0;
}
