/*
 * The transfer handshake's MACs (docs/SECURITY.md). The donor sends a fresh
 * nonce as it accepts a connection; the recipient's request carries its own
 * nonce and an HMAC-SHA256, keyed with the job secret, over both nonces and
 * what it asks for; the donor's first manifest carries an HMAC over both
 * nonces the other way round. Neither side ever sends the secret, and a MAC
 * seen on one connection is worthless on another (its donor nonce differs).
 */
#include "transfer_int.h"

#include <string.h>

static const char REQUEST_LABEL[] = "graft/transfer/request/v1";
static const char DONOR_LABEL[] = "graft/transfer/donor/v1";

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

graft_status_t graft__xfer_donor_mac(const uint8_t *secret, size_t secret_len,
                                     const uint8_t *recipient_nonce, const uint8_t *donor_nonce,
                                     uint64_t step, uint64_t layout_hash,
                                     uint8_t out[GRAFT_MAC_BYTES])
{
    const uint64_t v[] = {step, layout_hash};
    return mac(secret, secret_len, DONOR_LABEL, recipient_nonce, donor_nonce, v,
               GRAFT_ARRAY_SIZE(v), out);
}
