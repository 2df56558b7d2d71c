/*
 * The transfer handshake's MACs (docs/SECURITY.md). The donor sends a fresh
 * nonce as it accepts a connection; the recipient's request carries its own
 * nonce and an HMAC-SHA256, keyed with the job secret, over both nonces and
 * what it asks for. Every answer the donor sends to an authenticated
 * request (a manifest, each hash part, a refusal, a place in its queue) is
 * sealed: it ends with an HMAC over both nonces, the answer's sequence
 * number on the connection and every byte of the answer before it. Neither
 * side ever sends the secret, a MAC seen on one connection is worthless on
 * another (its nonces differ), and an answer cannot be altered, dropped,
 * reordered or replayed on its own connection (its number differs).
 */
#include "transfer_int.h"

#include <string.h>

static const char REQUEST_LABEL[] = "graft/transfer/request/v1";
static const char SEAL_LABEL[] = "graft/transfer/manifest/v2";

/* label || first nonce || second nonce || the numbers, each big-endian. */
static graft_status_t mac(const uint8_t *secret, size_t secret_len, const char *label,
                          const uint8_t *n1, const uint8_t *n2, const uint64_t *v, size_t nv,
                          uint8_t out[GRAFT_MAC_BYTES])
{
    uint8_t msg[64 + 2 * GRAFT_NONCE_BYTES + 8 * 8];
    size_t at = strlen(label);
    memcpy(msg, label, at);
    memcpy(msg + at, n1, GRAFT_NONCE_BYTES);
    at += GRAFT_NONCE_BYTES;
    memcpy(msg + at, n2, GRAFT_NONCE_BYTES);
    at += GRAFT_NONCE_BYTES;
    for (size_t i = 0; i < nv; i++)
        at = graft__mac_put_u64(msg, at, v[i]);
    return graft__hmac_sha256(secret, secret_len, msg, at, out);
}

graft_status_t graft__xfer_request_mac(const uint8_t *secret, size_t secret_len,
                                       const uint8_t *donor_nonce, const uint8_t *recipient_nonce,
                                       const graft__xfer_request_fields_t *f,
                                       uint8_t out[GRAFT_MAC_BYTES])
{
    const uint64_t v[] = {f->step, f->layout_hash, f->group, f->rank, f->request_id};
    return mac(secret, secret_len, REQUEST_LABEL, donor_nonce, recipient_nonce, v,
               GRAFT_ARRAY_SIZE(v), out);
}

graft_status_t graft__xfer_seal_mac(const uint8_t *secret, size_t secret_len,
                                    const uint8_t *recipient_nonce, const uint8_t *donor_nonce,
                                    uint64_t seq, const uint8_t *body, size_t body_len,
                                    uint8_t out[GRAFT_MAC_BYTES])
{
    /* The one-shot HMAC takes one buffer: label, nonces and number go in
     * front of a copy of the body (at most a hash part or a region table). */
    size_t head = sizeof(SEAL_LABEL) - 1 + 2 * GRAFT_NONCE_BYTES + 8;
    uint8_t *msg = graft__malloc(head + body_len + 1);
    if (msg == NULL)
        return GRAFT_ENOMEM;
    size_t at = sizeof(SEAL_LABEL) - 1;
    memcpy(msg, SEAL_LABEL, at);
    memcpy(msg + at, recipient_nonce, GRAFT_NONCE_BYTES);
    at += GRAFT_NONCE_BYTES;
    memcpy(msg + at, donor_nonce, GRAFT_NONCE_BYTES);
    at += GRAFT_NONCE_BYTES;
    at = graft__mac_put_u64(msg, at, seq);
    if (body_len > 0)
        memcpy(msg + at, body, body_len);
    graft_status_t st = graft__hmac_sha256(secret, secret_len, msg, at + body_len, out);
    graft_free(msg);
    return st;
}

graft_status_t graft__xfer_seal(const uint8_t *secret, size_t secret_len,
                                const uint8_t *recipient_nonce, const uint8_t *donor_nonce,
                                uint64_t seq, uint8_t *buf, size_t body_len)
{
    uint8_t mac[GRAFT_MAC_BYTES];
    graft_status_t st = graft__xfer_seal_mac(secret, secret_len, recipient_nonce, donor_nonce, seq,
                                             buf, body_len, mac);
    if (st != GRAFT_OK)
        return st;
    buf[body_len] = GRAFT__XFER_SEAL_TAG;
    buf[body_len + 1] = GRAFT_MAC_BYTES;
    memcpy(buf + body_len + 2, mac, GRAFT_MAC_BYTES);
    return GRAFT_OK;
}

graft_status_t graft__xfer_unseal(const uint8_t *secret, size_t secret_len,
                                  const uint8_t *recipient_nonce, const uint8_t *donor_nonce,
                                  uint64_t seq, const uint8_t *msg, size_t len,
                                  size_t *body_len_p, bool *sealed_p)
{
    uint8_t want[GRAFT_MAC_BYTES];
    *sealed_p = len >= GRAFT__XFER_SEAL_BYTES &&
                msg[len - GRAFT__XFER_SEAL_BYTES] == GRAFT__XFER_SEAL_TAG &&
                msg[len - GRAFT__XFER_SEAL_BYTES + 1] == GRAFT_MAC_BYTES;
    if (!*sealed_p)
        return GRAFT_ETOKEN;
    size_t body_len = len - GRAFT__XFER_SEAL_BYTES;
    graft_status_t st = graft__xfer_seal_mac(secret, secret_len, recipient_nonce, donor_nonce, seq,
                                             msg, body_len, want);
    if (st != GRAFT_OK)
        return st;
    if (!graft__mac_equal(msg + body_len + 2, GRAFT_MAC_BYTES, want))
        return GRAFT_ETOKEN;
    *body_len_p = body_len;
    return GRAFT_OK;
}
