/*
 * Private parts of the etcd client shared by etcd_client.c (the handle and
 * the request path), etcd_kv.c (key-value, txn, leases), etcd_json.c (encoding and decoding of the JSON
 * gateway's messages) and etcd_watch.c (streaming watches). Not installed;
 * tests include it to exercise the decoders with malformed input.
 */
#ifndef GRAFT_ETCD_INTERNAL_H
#define GRAFT_ETCD_INTERNAL_H

#include <graft/etcd.h>

#include "graft_internal.h"

#include <curl/curl.h>
#include <jansson.h>
#include <pthread.h>
#include <stdatomic.h>

#define GRAFT_MOD_ETCD "etcd"

/* A response body larger than this is refused: etcd's own limit on a
 * request is 1.5 MiB, and a range over a whole job's keys stays far below. */
#define GRAFT_ETCD_MAX_RESPONSE (64u * 1024u * 1024u)

/* One line of a watch stream larger than this is treated as malformed so a
 * server that never sends a newline cannot grow memory without bound. */
#define GRAFT_ETCD_MAX_WATCH_LINE (16u * 1024u * 1024u)

/* What clients sharing a process's view of etcd share (share_load):
 * whether etcd is slow and the counters. Reference counted. */
typedef struct graft__etcd_load {
    atomic_uint refs;
    atomic_uint_fast64_t slow_since_ns; /* 0: answering in time */
    atomic_uint_fast64_t requests, retries, shed, failures, slow_periods;
} graft__etcd_load_t;

/* Tokens of a client while etcd is slow (its share of the budget). */
typedef struct graft__etcd_bucket {
    double tokens;
    uint64_t last_ns;
    double rate_per_s;
    double burst;
} graft__etcd_bucket_t;

struct graft_etcd {
    char **endpoints;
    size_t n_endpoints;
    uint32_t request_timeout_ms;
    uint32_t watch_idle_ms; /* 0: never */
    uint32_t connect_timeout_ms;
    uint32_t max_retries;
    uint32_t retry_backoff_ms;
    uint32_t election_wait_ms; /* 0: never wait out an election */
    char *username;
    char *password;
    char *ca_file;
    char *cert_file;
    char *key_file;

    /* Guards everything below. Requests run without it held. */
    pthread_mutex_t lock;
    /* Idle easy handles; each keeps its connections alive between requests. */
    CURL **pool;
    size_t n_pool;
    size_t cap_pool;
    size_t current;   /* index of the endpoint that answered last */
    char *token;      /* auth token, NULL until authenticated */
    uint64_t token_gen; /* bumped on every new token */
    /* Serialises authentication so concurrent requests do not stampede. */
    pthread_mutex_t auth_lock;
    /* Bytes of the answers to requests (watch streams apart). */
    atomic_uint_fast64_t bytes_read;
    graft_etcd_priority_t priority;
    graft__etcd_load_t *load;   /* shared; never NULL */
    graft__etcd_bucket_t bucket; /* under lock */
};

/* ---- etcd_client.c ------------------------------------------------------ */

/* curl_global_init, once per process. */
GRAFT_WUR graft_status_t graft__etcd_curl_init(void);

/* Apply the client's TLS, timeout and connection options to an easy handle. */
void graft__etcd_curl_setup(graft_etcd_t *etcd, CURL *h, const char *url, uint32_t timeout_ms);

/* Current token as a header line ("Authorization: ..."), authenticating
 * first when the client has credentials and no token. *header_p is NULL
 * without authentication. */
GRAFT_WUR graft_status_t graft__etcd_auth_header(graft_etcd_t *etcd, bool force_new,
                                                 char **header_p);

/* Map a curl failure to a status. */
graft_status_t graft__etcd_curl_status(CURLcode rc);

/* True for curl failures that mean "try another endpoint / retry". */
bool graft__etcd_curl_retryable(CURLcode rc);

/* ---- etcd_budget.c ------------------------------------------------------ */

/* The retry budget. admit: may a request (a retry when
 * retry) be sent now? Counts it as sent or shed. done: what became of a
 * sent one (answered: an HTTP answer other than "no leader"; took_ns: how
 * long it took). */
bool graft__etcd_load_admit(graft_etcd_t *etcd, bool retry);
/* At create: this client's priority and bucket, and the load it shares
 * (config->share_load's, or a new one). Released at destroy (NULL: none). */
GRAFT_WUR graft_status_t graft__etcd_load_attach(graft_etcd_t *etcd,
                                                 const graft_etcd_config_t *config);
void graft__etcd_load_release(graft__etcd_load_t *l);
void graft__etcd_load_done(graft_etcd_t *etcd, bool answered, uint64_t took_ns);

/* Endpoint index to try first, and record the one that answered. */
size_t graft__etcd_endpoint_first(graft_etcd_t *etcd);
void graft__etcd_endpoint_answered(graft_etcd_t *etcd, size_t index);

/* ---- etcd_json.c -------------------------------------------------------- */

/* base64 (standard alphabet, padded) through libcrypto. */
GRAFT_WUR graft_status_t graft__etcd_b64_encode(const void *data, size_t len, char **out_p);
/* Decodes into a NUL-terminated buffer; *len_p excludes the NUL. */
GRAFT_WUR graft_status_t graft__etcd_b64_decode(const char *in, size_t in_len, uint8_t **out_p,
                                                size_t *len_p);

/* Read an int64 field that may be a JSON string, a JSON integer, or absent
 * (then 0). Anything else is GRAFT_EMALFORMED. */
GRAFT_WUR graft_status_t graft__etcd_json_int64(const json_t *obj, const char *field,
                                                int64_t *value_p);
/* The same for a uint64 field (member ids use the whole range), which
 * must be a decimal string or a non-negative integer. */
GRAFT_WUR graft_status_t graft__etcd_json_uint64(const json_t *obj, const char *field,
                                                 uint64_t *value_p);
/* Read a bool field that may be absent (false). */
GRAFT_WUR graft_status_t graft__etcd_json_bool(const json_t *obj, const char *field,
                                               bool *value_p);

/* Set a base64-encoded bytes field. */
GRAFT_WUR graft_status_t graft__etcd_json_set_bytes(json_t *obj, const char *field,
                                                    const void *data, size_t len);
/* Set an int64 field as a decimal string, as the gateway writes them. */
GRAFT_WUR graft_status_t graft__etcd_json_set_int64(json_t *obj, const char *field,
                                                    int64_t value);

/* End of the key range covering every key that starts with prefix; an empty
 * prefix gives "\0" (every key). Returns bytes in *end_p/len_p. */
GRAFT_WUR graft_status_t graft__etcd_prefix_end(const char *prefix, char **end_p, size_t *len_p);

/* Decode a mvccpb.KeyValue. */
GRAFT_WUR graft_status_t graft__etcd_kv_decode(const json_t *obj, graft_etcd_kv_t *kv_p);
/* Decode a RangeResponse. */
GRAFT_WUR graft_status_t graft__etcd_range_decode(const json_t *obj,
                                                  graft_etcd_range_result_t *result_p);
/* Decode a TxnResponse for the branch that ran, whose operations were ops:
 * one range result per RANGE operation, into *r, which starts zeroed. On
 * failure *r may hold part of the ranges; the caller clears it with
 * graft_etcd_txn_result_clear(). */
GRAFT_WUR graft_status_t graft__etcd_txn_decode(const json_t *resp, const graft_etcd_op_t *ops,
                                                size_t n_ops, graft_etcd_txn_result_t *r);
/* header.revision of a response (0 when absent). */
GRAFT_WUR graft_status_t graft__etcd_header_revision(const json_t *obj, int64_t *revision_p);

/* Status for an error answer: {"error": "...", "code": n} with HTTP status
 * http_code. Also recognises the streaming form {"error": {...}}. */
graft_status_t graft__etcd_error_status(const json_t *obj, long http_code);
/* True when an error answer (the raw body) says the member has no leader
 * now: an election is on, and another try soon will likely succeed. */
bool graft__etcd_error_is_leaderless(const char *body, size_t len);
/* True when an error answer says the auth token is invalid or expired. */
bool graft__etcd_error_is_bad_token(const json_t *obj);
/* The token of an answer to /v3/auth/authenticate, copied into *token_p
 * (graft_free()): a non-empty string of printable ASCII, at most
 * GRAFT_ETCD_TOKEN_MAX bytes, since it goes back in an HTTP header. */
#define GRAFT_ETCD_TOKEN_MAX 4096u
GRAFT_WUR graft_status_t graft__etcd_auth_token_decode(const json_t *resp, char **token_p);

/* One decoded line of a watch stream. */
typedef enum graft_etcd_watch_msg_kind {
    GRAFT_ETCD_WATCH_MSG_CREATED,  /* the watch exists; header revision set */
    GRAFT_ETCD_WATCH_MSG_EVENTS,   /* zero or more events (progress when zero) */
    GRAFT_ETCD_WATCH_MSG_CANCELED, /* compact_revision set when compacted */
    GRAFT_ETCD_WATCH_MSG_ERROR     /* error status set */
} graft_etcd_watch_msg_kind_t;

typedef struct graft_etcd_watch_msg {
    graft_etcd_watch_msg_kind_t kind;
    int64_t header_revision;
    int64_t compact_revision;
    graft_status_t error;
    bool bad_token;
    graft_etcd_event_t *events;
    size_t n_events;
} graft_etcd_watch_msg_t;

/* Decode one complete line of a watch stream. On failure nothing is kept. */
GRAFT_WUR graft_status_t graft__etcd_watch_msg_decode(const char *line, size_t len,
                                                      graft_etcd_watch_msg_t *msg_p);
void graft__etcd_watch_msg_clear(graft_etcd_watch_msg_t *msg);

/* The watch stream's line splitter: appends n bytes to *line and hands each
 * complete line to on_line (without its newline and trailing "\r" or
 * spaces; empty lines are skipped), keeping the bytes after the last
 * newline in *line. Returns on_line's first error, GRAFT_ENOMEM when the
 * bytes cannot be kept, or GRAFT_EMALFORMED when more than max_line bytes
 * wait for a newline. */
typedef graft_status_t (*graft__etcd_line_fn)(void *arg, const char *line, size_t len);
GRAFT_WUR graft_status_t graft__etcd_watch_split(graft_buf_t *line, const char *data, size_t n,
                                                 size_t max_line, graft__etcd_line_fn on_line,
                                                 void *arg);

/* POST a JSON request to path and decode the JSON answer, with failover,
 * retries, authentication and error mapping. *resp_p is the decoded 200
 * answer (caller json_decref()s it). */
GRAFT_WUR graft_status_t graft__etcd_call(graft_etcd_t *etcd, const char *path, json_t *req,
                                          json_t **resp_p);

#endif /* GRAFT_ETCD_INTERNAL_H */
