/*
 * Internal helpers shared by every module: allocation through the hooks,
 * logging macros, clocks and a growable byte buffer. Not installed.
 */
#ifndef GRAFT_INTERNAL_H
#define GRAFT_INTERNAL_H

#include <graft/common.h>

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define GRAFT_ARRAY_SIZE(a) (sizeof(a) / sizeof((a)[0]))
#define GRAFT_MIN(a, b) ((a) < (b) ? (a) : (b))
#define GRAFT_MAX(a, b) ((a) > (b) ? (a) : (b))

/* Allocation: always through the hooks of graft_alloc_hooks_set(). */
void *graft__malloc(size_t size);
void *graft__calloc(size_t nmemb, size_t size);
void *graft__realloc(void *ptr, size_t size);
char *graft__strdup(const char *s);
char *graft__strndup(const char *s, size_t n);
char *graft__asprintf(const char *fmt, ...) GRAFT_PRINTF(1, 2);
#define graft__free graft_free

/* Logging. Log once, where an error is first detected. */
void graft__log(graft_log_level_t level, const char *module, const char *fmt, ...)
    GRAFT_PRINTF(3, 4);
bool graft__log_enabled(graft_log_level_t level);

/* @p mod is the module's tag, GRAFT_MOD_<MODULE> ("persist", "transfer", ...),
 * defined in the module's internal header. */
#define GRAFT_LOG_AT(lvl, mod, ...)                                                      \
    do {                                                                                 \
        if (graft__log_enabled(lvl))                                                     \
            graft__log(lvl, mod, __VA_ARGS__);                                           \
    } while (0)
#define GRAFT_ERROR(mod, ...) GRAFT_LOG_AT(GRAFT_LOG_ERROR, mod, __VA_ARGS__)
#define GRAFT_WARN(mod, ...) GRAFT_LOG_AT(GRAFT_LOG_WARN, mod, __VA_ARGS__)
#define GRAFT_INFO(mod, ...) GRAFT_LOG_AT(GRAFT_LOG_INFO, mod, __VA_ARGS__)
#define GRAFT_DEBUG(mod, ...) GRAFT_LOG_AT(GRAFT_LOG_DEBUG, mod, __VA_ARGS__)
#define GRAFT_TRACE(mod, ...) GRAFT_LOG_AT(GRAFT_LOG_TRACE, mod, __VA_ARGS__)

/* Device memory (common/cuda_copy.c; common/nocuda.c in a build without
 * CUDA, where no device is usable). */
#define GRAFT_MOD_CUDA "cuda"
/* Number of CUDA devices; 0 without a GPU or without CUDA. */
int graft__cuda_devices(void);
/* GRAFT_OK when a device is usable, else GRAFT_ENOTSUP with the reason
 * logged: asked before anything is read or written. */
GRAFT_WUR graft_status_t graft__cuda_usable(void);
/* Pinned host memory (the transfer engine's shadows of device regions). */
GRAFT_WUR graft_status_t graft__cuda_host_alloc(uint64_t bytes, void **host_p);
void graft__cuda_host_free(void *host);
/* Copy @p bytes between device memory and host memory (pinned or not),
 * pipelined in pieces over two private streams (never the trainer's), on
 * the device that holds the memory; the calling thread's current device is
 * left as it was. A CUDA error is GRAFT_EIO. */
GRAFT_WUR graft_status_t graft__cuda_copy(void *dst, const void *src, uint64_t bytes,
                                          bool to_device);

/* Cryptography (common/crypto.c, libcrypto). A MAC is HMAC-SHA256. */
#define GRAFT_MOD_CRYPTO "crypto"
#define GRAFT_MAC_BYTES 32u
/* Nonces of the transfer handshake. */
#define GRAFT_NONCE_BYTES 16u
GRAFT_WUR graft_status_t graft__random_bytes(void *buf, size_t n);
GRAFT_WUR graft_status_t graft__hmac_sha256(const void *key, size_t key_len, const void *msg,
                                            size_t msg_len, uint8_t out[GRAFT_MAC_BYTES]);
/* @p a (a_len bytes from a peer) equals @p b, compared in constant time. */
bool graft__mac_equal(const void *a, size_t a_len, const uint8_t b[GRAFT_MAC_BYTES]);
/* Append @p v big-endian at buf[at]; returns the new length (MAC inputs). */
size_t graft__mac_put_u64(uint8_t *buf, size_t at, uint64_t v);

/* Clocks. */
uint64_t graft__now_ns(void);      /* CLOCK_MONOTONIC */
uint64_t graft__wall_ns(void);     /* CLOCK_REALTIME */
void graft__sleep_ns(uint64_t ns);
/* A back-off with jitter: uniform in [ns/2, ns], so that processes that
 * failed together do not come back together (not for cryptography). */
uint64_t graft__jitter_ns(uint64_t ns);

/* Growable byte buffer; data is always NUL-terminated for convenience. */
typedef struct graft_buf {
    char *data;
    size_t len;
    size_t cap;
} graft_buf_t;

void graft__buf_init(graft_buf_t *b);
void graft__buf_free(graft_buf_t *b);
void graft__buf_reset(graft_buf_t *b);
GRAFT_WUR graft_status_t graft__buf_append(graft_buf_t *b, const void *data, size_t len);
GRAFT_WUR graft_status_t graft__buf_printf(graft_buf_t *b, const char *fmt, ...) GRAFT_PRINTF(2, 3);
/* Drop the first n bytes. */
void graft__buf_consume(graft_buf_t *b, size_t n);

#endif /* GRAFT_INTERNAL_H */
