/*
 * Private to persist/: a small S3 client over libcurl (persist_s3.c on
 * persist_s3_multi.c, persist_s3_sweep.c and persist_s3_get.c beside it,
 * all on persist_s3_request.c), signed by libcurl's own SigV4
 * (CURLOPT_AWS_SIGV4).
 * Every request is retried with jittered, doubling back-off on a
 * connection error, a 5xx or a 429 (honouring Retry-After); a multipart
 * upload resends only the part that failed. Used by the remote tier
 * (persist_remote.c).
 */
#ifndef GRAFT_PERSIST_S3_H
#define GRAFT_PERSIST_S3_H

#include "graft_internal.h"
#include <graft/persist.h>

#include <curl/curl.h>

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

#define GP_S3_MIN_PART_BYTES (5ull << 20)
#define GP_S3_DEFAULT_PART_BYTES (8ull << 20)
#define GP_S3_MAX_PART_BYTES (5ull << 30)
#define GP_S3_MAX_PARTS 10000u

/* A multipart upload this client began and could not abort. */
#define GP_S3_MAX_ORPHANS 64
typedef struct graft__s3_orphan {
    char key[1024]; /* the full key, prefix included */
    char upload_id[512];
} graft__s3_orphan_t;

/* An upload with no part yet, and when this client first listed it (some
 * stores, moto among them, answer a made-up Initiated time). */
typedef struct graft__s3_seen {
    char upload_id[512];
    int64_t first_s;
} graft__s3_seen_t;

typedef struct graft__s3 {
    char *url;       /* s3://bucket/prefix, as configured (messages) */
    char *bucket;
    char *prefix;    /* "" or "a/b/" (ends in '/') */
    char *base;      /* "http://host:port/bucket" or "https://bucket.s3.region.amazonaws.com" */
    char *region;
    char *sigv4;     /* "aws:amz:<region>:s3" */
    char *access_key;
    char *secret_key;
    char *token_header; /* "x-amz-security-token: ..." or NULL */
    uint64_t part_bytes;
    uint32_t parallel;
    uint32_t max_retries;
    uint32_t backoff_ms;
    uint32_t timeout_ms;
    /* Connections (and DNS, TLS sessions) kept between requests: a new
     * TLS handshake per part would cost more than many parts. */
    CURLSH *share;
    pthread_mutex_t locks[CURL_LOCK_DATA_LAST];
    bool locks_made;
    /* Set by the owner to end retries early (the writer being destroyed). */
    atomic_bool *stop;
    /* Uploads whose abort failed, for the next sweep. */
    pthread_mutex_t orphans_mu;
    graft__s3_orphan_t orphans[GP_S3_MAX_ORPHANS];
    size_t n_orphans;
    graft__s3_seen_t seen[GP_S3_MAX_ORPHANS];
    size_t n_seen;
    /* Counters, read by the remote tier's statistics. */
    atomic_uint_least64_t retries;
    atomic_uint_least64_t bytes_sent;
} graft__s3_t;

/* Resolve the configuration: the URL, endpoint, region and credentials
 * (the configuration, else AWS_* variables, else the credentials file).
 * A missing piece is GRAFT_EINVAL with why naming it. */
GRAFT_WUR graft_status_t graft__s3_create(const graft_persist_remote_config_t *cfg,
                                          graft__s3_t **s3_p, char *why, size_t why_len);
void graft__s3_destroy(graft__s3_t *s3);
/* GRAFT_OK when url is an s3://bucket[/prefix] URL; else GRAFT_EINVAL. */
GRAFT_WUR graft_status_t graft__s3_url_check(const char *url, char *why, size_t why_len);

/* A response: status, body (NUL-terminated), the ETag and Retry-After
 * headers. */
typedef struct graft__s3_resp {
    long http;
    char *body;
    size_t len;
    size_t cap;
    int fd;           /* >= 0: the body goes to this file instead */
    uint64_t written; /* bytes written to fd */
    bool at_offset;   /* the body goes to fd at offset + written (a ranged GET), */
    uint64_t offset;
    uint64_t limit;   /* and no more than limit bytes of it (a store ignoring the range) */
    bool write_failed;
    char etag[128];
    long retry_after_s;
} graft__s3_resp_t;

/* An easy handle for one request, signed, with the configured timeouts;
 * body may be NULL. *hdrs_p must be freed (curl_slist_free_all) after the
 * transfer. NULL when out of memory. */
void *graft__s3_easy(graft__s3_t *s3, const char *method, const char *key, const char *query,
                     const uint8_t *body, size_t body_len, const char *content_md5,
                     graft__s3_resp_t *resp, struct curl_slist **hdrs_p);
/* The same, with the body's SHA-256 (64 hex digits) computed already. */
void *graft__s3_easy_hashed(graft__s3_t *s3, const char *method, const char *key,
                            const char *query, const uint8_t *body, size_t body_len,
                            const char *content_md5, const char *sha256_hex,
                            graft__s3_resp_t *resp, struct curl_slist **hdrs_p);
/* Lower-case hex of the first n (<= 32) bytes of md. */
void graft__s3_hex(const unsigned char *md, unsigned int n, char out[65]);
void graft__s3_resp_reset(graft__s3_resp_t *r);
/* The outcome of a finished transfer: GRAFT_OK on a 2xx, GRAFT_ENOTFOUND
 * on a 404, GRAFT_EAUTH on a 403, GRAFT_EIO otherwise; why names the
 * request and the store's error code. *retry_p: worth another try. */
graft_status_t graft__s3_outcome(const graft__s3_t *s3, int curl_code, const graft__s3_resp_t *r,
                                 const char *what, bool *retry_p, char *why, size_t why_len);
/* Sleep before try number attempt (1 = first retry): doubling back-off
 * with full jitter, at least Retry-After. false when told to stop. */
bool graft__s3_backoff(graft__s3_t *s3, uint32_t attempt, long retry_after_s);
/* The same delay in ms, counted as a retry, without sleeping. */
uint64_t graft__s3_backoff_ms(graft__s3_t *s3, uint32_t attempt, long retry_after_s);
/* One request, retried; resp->fd set by the caller (-1: body kept in
 * resp->body, freed by the caller). what names it in messages. */
GRAFT_WUR graft_status_t graft__s3_request(graft__s3_t *s3, const char *method, const char *key,
                                           const char *query, const uint8_t *body,
                                           size_t body_len, const char *md5,
                                           graft__s3_resp_t *resp, const char *what, char *why,
                                           size_t why_len);
/* One request without a body, tried once with its own timeout (a probe,
 * a clean-up that is tried again later anyway). */
GRAFT_WUR graft_status_t graft__s3_request_once(graft__s3_t *s3, const char *method,
                                                const char *key, const char *query,
                                                long timeout_ms, graft__s3_resp_t *resp,
                                                const char *what, char *why, size_t why_len);
/* The text of <tag>...</tag> in xml, copied into out; false if absent. */
bool graft__s3_xml_tag(const char *xml, const char *tag, char *out, size_t out_len);
/* Multipart upload (persist_s3_multi.c). */
GRAFT_WUR graft_status_t graft__s3_multipart(graft__s3_t *s3, const char *key, int fd,
                                             uint64_t bytes, char *why, size_t why_len);

/* Abort the multipart uploads below the prefix that were abandoned: those
 * this client failed to abort, and those of anyone whose newest part is
 * older than idle_ms (with no part: first listed by this client idle_ms
 * ago); *aborted_p how many (persist_s3_sweep.c). A live writer's upload
 * sends a part at least every request timeout plus back-off, so idle_ms
 * must exceed that. */
GRAFT_WUR graft_status_t graft__s3_sweep_uploads(graft__s3_t *s3, uint64_t idle_ms,
                                                 size_t *aborted_p, char *why, size_t why_len);

/* Base64 of the MD5 of data (25 bytes with the NUL). */
void graft__s3_md5_b64(const void *data, size_t len, char out[32]);

/* Upload the file at path to key: one PUT when it fits a part, else a
 * multipart upload with parallel parts (persist_s3_multi.c). */
GRAFT_WUR graft_status_t graft__s3_put_file(graft__s3_t *s3, const char *key, int fd,
                                            uint64_t bytes, char *why, size_t why_len);
GRAFT_WUR graft_status_t graft__s3_put_bytes(graft__s3_t *s3, const char *key,
                                             const uint8_t *data, size_t len, char *why,
                                             size_t why_len);
/* Download key into the file fd (truncated first); *bytes_p its size. */
GRAFT_WUR graft_status_t graft__s3_get_file(graft__s3_t *s3, const char *key, int fd,
                                            uint64_t *bytes_p, char *why, size_t why_len);
/* Download key, bytes long, into fd with ranged GETs of part_bytes,
 * parallel ones in flight (persist_s3_get.c); each range is retried
 * alone. A store holding another size is GRAFT_ETRUNCATED. */
GRAFT_WUR graft_status_t graft__s3_get_ranged(graft__s3_t *s3, const char *key, int fd,
                                              uint64_t bytes, char *why, size_t why_len);
/* GRAFT_OK when the store holds key with this size (HEAD); else
 * GRAFT_ENOTFOUND or GRAFT_ETRUNCATED, why naming s3://bucket/key. */
GRAFT_WUR graft_status_t graft__s3_size_check(graft__s3_t *s3, const char *key, uint64_t bytes,
                                              char *why, size_t why_len);
/* Size of key; GRAFT_ENOTFOUND when absent. */
GRAFT_WUR graft_status_t graft__s3_head(graft__s3_t *s3, const char *key, uint64_t *bytes_p,
                                        char *why, size_t why_len);
GRAFT_WUR graft_status_t graft__s3_delete(graft__s3_t *s3, const char *key, char *why,
                                          size_t why_len);
/* Every key below prefix + sub (sub may be ""), relative to the prefix;
 * free with graft__s3_keys_free(). */
GRAFT_WUR graft_status_t graft__s3_list(graft__s3_t *s3, const char *sub, char ***keys_p,
                                        size_t *n_p, char *why, size_t why_len);
void graft__s3_keys_free(char **keys, size_t n);

#endif
