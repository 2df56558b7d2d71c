/*
 * The few cryptographic pieces graft needs, through libcrypto (OpenSSL):
 * random bytes for secrets and nonces, HMAC-SHA256 for the transfer
 * handshake and the steady path's messages, and a comparison of MACs in
 * constant time. docs/SECURITY.md says what is authenticated and how.
 */
#include "graft_internal.h"

#include <openssl/core_names.h>
#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/rand.h>

#include <string.h>

graft_status_t graft__random_bytes(void *buf, size_t n)
{
    if (n > INT32_MAX || RAND_bytes(buf, (int)n) != 1) {
        GRAFT_ERROR(GRAFT_MOD_CRYPTO, "no random bytes from libcrypto");
        return GRAFT_ESYS;
    }
    return GRAFT_OK;
}

graft_status_t graft__hmac_sha256(const void *key, size_t key_len, const void *msg,
                                  size_t msg_len, uint8_t out[GRAFT_MAC_BYTES])
{
    size_t out_len = 0;
    /* EVP_Q_mac: one call, no context to manage (OpenSSL 3). */
    if (EVP_Q_mac(NULL, "HMAC", NULL, "SHA256", NULL, key, key_len, msg, msg_len, out,
                  GRAFT_MAC_BYTES, &out_len) == NULL ||
        out_len != GRAFT_MAC_BYTES) {
        GRAFT_ERROR(GRAFT_MOD_CRYPTO, "HMAC-SHA256 failed in libcrypto");
        return GRAFT_ESYS;
    }
    return GRAFT_OK;
}

bool graft__mac_equal(const void *a, size_t a_len, const uint8_t b[GRAFT_MAC_BYTES])
{
    return a != NULL && a_len == GRAFT_MAC_BYTES && CRYPTO_memcmp(a, b, GRAFT_MAC_BYTES) == 0;
}

size_t graft__mac_put_u64(uint8_t *buf, size_t at, uint64_t v)
{
    for (int i = 7; i >= 0; i--)
        buf[at++] = (uint8_t)(v >> (8 * i));
    return at;
}
