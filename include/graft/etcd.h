/**
 * @file graft/etcd.h
 * @brief etcd v3 client over the JSON gateway.
 *
 * The client speaks etcd's gRPC-gateway (`POST /v3/kv/range`, `/v3/kv/put`,
 * `/v3/kv/txn`, `/v3/lease/...`, `/v3/watch`, `/v3/auth/authenticate`) through
 * libcurl with kept-alive connections. It fails over between endpoints,
 * retries connection errors and 503 answers with exponential backoff, waits
 * out the election that follows the loss of a cluster's leader
 * (graft_etcd_config_t::election_wait_ms), and maps etcd's answers onto
 * graft status codes:
 *
 *  | situation                          | status               |
 *  |------------------------------------|----------------------|
 *  | no endpoint accepts a connection   | GRAFT_EUNREACHABLE   |
 *  | a request exceeded its timeout     | GRAFT_EETCD_TIMEOUT  |
 *  | wrong user/password, bad token     | GRAFT_EAUTH          |
 *  | value/request over etcd's limit    | GRAFT_ETOOLARGE      |
 *  | revision compacted                 | GRAFT_ECOMPACTED     |
 *  | key or lease does not exist        | GRAFT_ENOTFOUND      |
 *  | answer is not the JSON expected    | GRAFT_EMALFORMED     |
 *  | any other error etcd reports       | GRAFT_EETCD          |
 *
 * Keys are C strings; values are bytes. Everything this API returns is owned
 * by the caller and freed with the matching *_free() function.
 *
 * Thread safety: one ::graft_etcd_t may be used from several threads at
 * once; each ::graft_etcd_watch_t by one thread at a time.
 *
 * Sections: client life cycle; key-value; transactions; leases; watches.
 * The embedded etcd that tests, the simulator and `make demo` start is not
 * part of the library: tools/etcd_launcher/etcd_launcher.h.
 */
#ifndef GRAFT_ETCD_H
#define GRAFT_ETCD_H

#include <graft/common.h>

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* ------------------------------------------------------------------------ */
/* Client life cycle                                                        */
/* ------------------------------------------------------------------------ */

typedef struct graft_etcd graft_etcd_t;

/**
 * Value of graft_etcd_config_t::max_retries that asks for no retries at all:
 * one attempt per endpoint, then the error. (0 selects the default of 3, so
 * that a zero-initialised configuration retries.) For callers whose request
 * is repeated soon anyway and must not outlast a deadline, such as a lease
 * renewal: against a black-holed etcd every retry costs a connect timeout.
 */
#define GRAFT_ETCD_NO_RETRIES UINT32_MAX

/** graft_etcd_config_t.watch_idle_ms: never re-open a quiet watch stream. */
#define GRAFT_ETCD_WATCH_NO_IDLE UINT32_MAX

/**
 * How much a client's requests matter while etcd is slow
 * (graft_etcd_config_t::priority). etcd is "slow" from a request that got
 * no answer (a timeout, no endpoint reachable, no leader) or an answer that
 * took over a quarter of request_timeout_ms, until a request is answered
 * in time. While it is slow, best-effort requests are shed (answered
 * GRAFT_EUNREACHABLE without being sent), and every other request, retries
 * included, takes a token from its own client's bucket: a request without
 * a token is shed too. A client's bucket is its share, which no other
 * client can use up.
 */
typedef enum graft_etcd_priority {
    GRAFT_ETCD_PRIORITY_NORMAL = 0,      /**< 1 request a second while slow, 2 at once */
    GRAFT_ETCD_PRIORITY_ESSENTIAL = 1,   /**< lease renewals, grants, the quorum: 4 a second,
                                              4 at once */
    GRAFT_ETCD_PRIORITY_BEST_EFFORT = 2  /**< event records, progress, dashboards: shed */
} graft_etcd_priority_t;

/** Client configuration. Zero values select the defaults given. */
typedef struct graft_etcd_config {
    const char *const *endpoints; /**< e.g. "http://127.0.0.1:2379"; tried in order */
    size_t n_endpoints;
    uint32_t request_timeout_ms; /**< per attempt; default 5000 */
    uint32_t connect_timeout_ms; /**< default 1000 */
    uint32_t max_retries;        /**< rounds over the endpoints after the first, on
                                      connection errors and 503; 0: default 3;
                                      GRAFT_ETCD_NO_RETRIES: none */
    uint32_t retry_backoff_ms;   /**< first backoff, doubled each retry; default 50 */
    const char *username;        /**< NULL: no authentication */
    const char *password;
    const char *ca_file;   /**< TLS: CA bundle to verify the server */
    const char *cert_file; /**< TLS: client certificate */
    const char *key_file;  /**< TLS: client key */
    /** A watch stream that delivered nothing for this long is re-opened
     *  from the revision it owes (etcd replays what it missed): a stalled
     *  connection, such as one to a frozen etcd member, cannot be told from
     *  a quiet prefix otherwise. Default 10000; GRAFT_ETCD_WATCH_NO_IDLE:
     *  never. A stream that has not confirmed its watch within
     *  request_timeout_ms is a failed attempt: the next endpoint is tried. */
    uint32_t watch_idle_ms;
    /** While a member answers that it has no leader (an election after the
     *  leader died: "no leader", "leader changed", a dropped proposal), a
     *  request keeps trying the endpoints past max_retries for up to this
     *  long, pausing at most 100 ms between rounds. Default 5000 (etcd's
     *  default election timeout is 1 s); none with GRAFT_ETCD_NO_RETRIES. */
    uint32_t election_wait_ms;
    /** What its requests are worth while etcd is slow; default normal. */
    graft_etcd_priority_t priority;
    /** NULL, or a client whose view of etcd (slow or not) and counters
     *  this one shares: clients of one process that talk to the same etcd
     *  learn from each other's timeouts, and graft_etcd_stats_get() of any
     *  of them counts them all. The shared part lives as long as the last
     *  client that uses it. */
    graft_etcd_t *share_load;
} graft_etcd_config_t;

/** Request counters of a client and the clients that share its load. */
typedef struct graft_etcd_stats {
    uint64_t requests; /**< HTTP requests sent: every attempt, watch streams opened included */
    uint64_t retries;  /**< of which the client's own repeats of a request */
    uint64_t shed;     /**< requests not sent: best-effort or over the budget while slow */
    uint64_t failures; /**< requests that got no answer in time */
    uint64_t slow_periods; /**< times etcd turned slow */
    bool slow;         /**< etcd is slow now */
} graft_etcd_stats_t;

/**
 * @brief Read the request counters.
 * @param [in]  etcd     the client (NULL gives zeros).
 * @param [out] stats_p  the counters of every client sharing its load.
 */
void graft_etcd_stats_get(graft_etcd_t *etcd, graft_etcd_stats_t *stats_p);

/**
 * @brief Create a client. Does not contact etcd until the first request
 *        (authentication included).
 * @param [in]  config  configuration; copied.
 * @param [out] etcd_p  the client, on success.
 * @return GRAFT_OK, GRAFT_EINVAL (no endpoints), GRAFT_ENOMEM.
 */
GRAFT_WUR graft_status_t graft_etcd_create(const graft_etcd_config_t *config,
                                           graft_etcd_t **etcd_p);

/**
 * @brief Destroy a client. Accepts NULL.
 * @param [in] etcd  the client.
 */
void graft_etcd_destroy(graft_etcd_t *etcd);

/**
 * @brief Bytes of etcd's answers to this client's requests so far (bodies;
 *        watch streams apart).
 * @param [in] etcd  client; NULL gives 0.
 * @return the count.
 */
uint64_t graft_etcd_bytes_read(graft_etcd_t *etcd);

/**
 * @brief The endpoint that answered last (for logs and tools).
 * @param [in] etcd  the client.
 * @return a string owned by the client.
 */
const char *graft_etcd_current_endpoint(graft_etcd_t *etcd);

/**
 * @brief Split a comma-separated endpoint list ("http://a:2379,http://b:2379",
 *        the form of --etcd and GRAFT_ETCD_ENDPOINTS) into an array for
 *        graft_etcd_config_t::endpoints. Empty items are skipped; the items
 *        are not checked (graft_etcd_create() does).
 * @param [in]  list         the list.
 * @param [out] endpoints_p  a new array of new strings; free with
 *                           graft_etcd_endpoints_free().
 * @param [out] n_p          how many.
 * @return GRAFT_OK, GRAFT_EINVAL (NULL or no endpoint in the list),
 *         GRAFT_ENOMEM.
 */
GRAFT_WUR graft_status_t graft_etcd_endpoints_split(const char *list, char ***endpoints_p,
                                                    size_t *n_p);

/**
 * @brief Is an endpoint's host on this machine's loopback: an IPv4 address
 *        in 127.0.0.0/8, ::1 (also as ::ffff:127.x.y.z), or the name
 *        "localhost"? Other names are not resolved, so they are not.
 * @param [in] url  "http://host:port" or "https://[v6]:port" (NULL: false).
 * @return true when it is.
 */
bool graft_etcd_endpoint_is_loopback(const char *url);

/**
 * @brief Is what crosses this configuration's connections private: every
 *        endpoint either on loopback, or https with authentication (a
 *        username or a client certificate), so that a value neither
 *        crosses a network in clear nor is read by whoever reaches etcd?
 *        The job secret is kept in etcd only then (docs/SECURITY.md).
 * @param [in]  config   the configuration (endpoints, username, cert_file).
 * @param [out] first_p  when not, the first endpoint that is not (owned by
 *                       config); may be NULL.
 * @param [out] why_p    when not, a static phrase saying why; may be NULL.
 * @return true when it is.
 */
bool graft_etcd_config_is_private(const graft_etcd_config_t *config, const char **first_p,
                                  const char **why_p);

/**
 * @brief Free what graft_etcd_endpoints_split() returned. Accepts NULL.
 * @param [in] endpoints  the array.
 * @param [in] n          its length.
 */
void graft_etcd_endpoints_free(char **endpoints, size_t n);

/** What a member says of itself (maintenance status). */
typedef struct graft_etcd_member_status {
    uint64_t member_id; /**< the member that answered */
    uint64_t leader_id; /**< the leader it follows; 0: none (an election is on) */
    uint64_t raft_term;
    int64_t revision;
} graft_etcd_member_status_t;

/**
 * @brief Maintenance status of the member that answers (POST
 *        /v3/maintenance/status). With several endpoints that is whichever
 *        answered (graft_etcd_current_endpoint()); to ask one member, use a
 *        client of that endpoint alone. The leader is the member whose
 *        member_id equals its leader_id.
 * @param [in]  etcd      the client.
 * @param [out] status_p  the status.
 * @return GRAFT_OK or an etcd error.
 */
GRAFT_WUR graft_status_t graft_etcd_member_status(graft_etcd_t *etcd,
                                                  graft_etcd_member_status_t *status_p);

/* ------------------------------------------------------------------------ */
/* Key-value                                                                */
/* ------------------------------------------------------------------------ */

/** One key-value pair as etcd stores it. */
typedef struct graft_etcd_kv {
    char *key;
    uint8_t *value; /**< NUL-terminated for convenience; value_len excludes it */
    size_t value_len;
    int64_t create_revision;
    int64_t mod_revision;
    int64_t version;
    int64_t lease;
} graft_etcd_kv_t;

/**
 * @brief Free the contents of a kv (not the struct itself).
 * @param [in] kv  may be NULL.
 */
void graft_etcd_kv_clear(graft_etcd_kv_t *kv);

/** Options of a range request. Zero-initialised: one key, latest revision. */
typedef struct graft_etcd_range_opts {
    bool prefix;        /**< every key starting with key */
    const char *range_end; /**< explicit [key, range_end) when not prefix; NULL: one key */
    int64_t limit;      /**< 0: no limit */
    int64_t revision;   /**< 0: latest */
    bool keys_only;
    bool count_only;
} graft_etcd_range_opts_t;

/** Result of a range request. */
typedef struct graft_etcd_range_result {
    graft_etcd_kv_t *kvs;
    size_t n_kvs;
    int64_t count;    /**< keys in the range (may exceed n_kvs with a limit) */
    bool more;        /**< more keys beyond the limit */
    int64_t revision; /**< store revision the answer was read at */
} graft_etcd_range_result_t;

/**
 * @brief Free a range result's contents. Accepts NULL.
 * @param [in] result  the result.
 */
void graft_etcd_range_result_clear(graft_etcd_range_result_t *result);

/**
 * @brief Read one key, a prefix or a key range.
 * @param [in]  etcd      client.
 * @param [in]  key       first key (or the prefix).
 * @param [in]  opts      options, or NULL for one key at the latest revision.
 * @param [out] result_p  the result; an absent key gives n_kvs == 0, not an error.
 * @return GRAFT_OK or an etcd error (table above).
 */
GRAFT_WUR graft_status_t graft_etcd_range(graft_etcd_t *etcd, const char *key,
                                          const graft_etcd_range_opts_t *opts,
                                          graft_etcd_range_result_t *result_p);

/**
 * @brief Read one key.
 * @param [in]  etcd        client.
 * @param [in]  key         the key.
 * @param [out] kv_p        the pair, on success.
 * @param [out] revision_p  store revision of the answer; may be NULL.
 * @return GRAFT_OK, GRAFT_ENOTFOUND, or an etcd error.
 */
GRAFT_WUR graft_status_t graft_etcd_get(graft_etcd_t *etcd, const char *key, graft_etcd_kv_t *kv_p,
                                        int64_t *revision_p);

/**
 * @brief Write one key.
 * @param [in]  etcd        client.
 * @param [in]  key         the key.
 * @param [in]  value       bytes; may be NULL when len is 0.
 * @param [in]  len         length of value.
 * @param [in]  lease       lease to attach, 0 for none.
 * @param [out] prev_kv_p   previous pair if any (key NULL when there was none);
 *                          NULL to not ask for it.
 * @param [out] revision_p  revision of the write; may be NULL.
 * @return GRAFT_OK, GRAFT_ETOOLARGE, GRAFT_ENOTFOUND (lease), or an etcd error.
 */
GRAFT_WUR graft_status_t graft_etcd_put(graft_etcd_t *etcd, const char *key, const void *value,
                                        size_t len, int64_t lease, graft_etcd_kv_t *prev_kv_p,
                                        int64_t *revision_p);

/**
 * @brief Delete one key or every key under a prefix.
 * @param [in]  etcd        client.
 * @param [in]  key         the key or prefix.
 * @param [in]  prefix      delete the whole prefix.
 * @param [out] deleted_p   number of keys deleted; may be NULL.
 * @param [out] revision_p  revision after the delete; may be NULL.
 * @return GRAFT_OK or an etcd error.
 */
GRAFT_WUR graft_status_t graft_etcd_delete(graft_etcd_t *etcd, const char *key, bool prefix,
                                           int64_t *deleted_p, int64_t *revision_p);

/**
 * @brief Compact the store's history up to a revision (operators, tests).
 * @param [in] etcd      client.
 * @param [in] revision  revisions below this one are dropped.
 * @return GRAFT_OK, GRAFT_ECOMPACTED (already compacted), or an etcd error.
 */
GRAFT_WUR graft_status_t graft_etcd_compact(graft_etcd_t *etcd, int64_t revision);

/* ------------------------------------------------------------------------ */
/* Transactions                                                             */
/* ------------------------------------------------------------------------ */

typedef enum graft_etcd_cmp_target {
    GRAFT_ETCD_CMP_VERSION,
    GRAFT_ETCD_CMP_CREATE,
    GRAFT_ETCD_CMP_MOD,
    GRAFT_ETCD_CMP_VALUE,
    GRAFT_ETCD_CMP_LEASE
} graft_etcd_cmp_target_t;

typedef enum graft_etcd_cmp_op {
    GRAFT_ETCD_CMP_EQUAL,
    GRAFT_ETCD_CMP_GREATER,
    GRAFT_ETCD_CMP_LESS,
    GRAFT_ETCD_CMP_NOT_EQUAL
} graft_etcd_cmp_op_t;

/** One comparison of a transaction. An absent key has version/create/mod 0. */
typedef struct graft_etcd_compare {
    const char *key;
    graft_etcd_cmp_target_t target;
    graft_etcd_cmp_op_t op;
    int64_t number;    /**< for VERSION, CREATE, MOD, LEASE */
    const void *value; /**< for VALUE */
    size_t value_len;
} graft_etcd_compare_t;

typedef enum graft_etcd_op_type {
    GRAFT_ETCD_OP_PUT,
    GRAFT_ETCD_OP_RANGE,
    GRAFT_ETCD_OP_DELETE
} graft_etcd_op_type_t;

/** One operation of a transaction branch. */
typedef struct graft_etcd_op {
    graft_etcd_op_type_t type;
    const char *key;
    const void *value; /**< PUT */
    size_t value_len;  /**< PUT */
    int64_t lease;     /**< PUT */
    bool prefix;       /**< RANGE, DELETE */
    bool count_only;   /**< RANGE: the number of keys only (the result's count) */
} graft_etcd_op_t;

/** Result of a transaction. */
typedef struct graft_etcd_txn_result {
    bool succeeded;                    /**< the compares held: success branch ran */
    int64_t revision;                  /**< store revision after the txn */
    graft_etcd_range_result_t *ranges; /**< one per RANGE op of the branch that ran, in order */
    size_t n_ranges;
} graft_etcd_txn_result_t;

/**
 * @brief Free a transaction result's contents. Accepts NULL.
 * @param [in] result  the result.
 */
void graft_etcd_txn_result_clear(graft_etcd_txn_result_t *result);

/**
 * @brief Run a transaction: if every compare holds, the success operations,
 *        otherwise the failure operations, atomically.
 * @param [in]  etcd       client.
 * @param [in]  cmp        compares; may be NULL when n_cmp is 0.
 * @param [in]  n_cmp      number of compares.
 * @param [in]  success    operations when all compares hold.
 * @param [in]  n_success  their number.
 * @param [in]  failure    operations otherwise.
 * @param [in]  n_failure  their number.
 * @param [out] result_p   the outcome.
 * @return GRAFT_OK (whichever branch ran) or an etcd error.
 */
GRAFT_WUR graft_status_t graft_etcd_txn(graft_etcd_t *etcd, const graft_etcd_compare_t *cmp,
                                        size_t n_cmp, const graft_etcd_op_t *success,
                                        size_t n_success, const graft_etcd_op_t *failure,
                                        size_t n_failure, graft_etcd_txn_result_t *result_p);

/* ------------------------------------------------------------------------ */
/* Leases                                                                   */
/* ------------------------------------------------------------------------ */

/**
 * @brief Grant a lease.
 * @param [in]  etcd        client.
 * @param [in]  ttl_s       requested time to live in seconds.
 * @param [out] lease_id_p  the lease id.
 * @param [out] ttl_p       granted TTL in seconds; may be NULL.
 * @return GRAFT_OK or an etcd error.
 */
GRAFT_WUR graft_status_t graft_etcd_lease_grant(graft_etcd_t *etcd, int64_t ttl_s,
                                                int64_t *lease_id_p, int64_t *ttl_p);

/**
 * @brief Renew a lease once.
 * @param [in]  etcd   client.
 * @param [in]  lease  the lease id.
 * @param [out] ttl_p  the TTL after renewal; may be NULL.
 * @return GRAFT_OK, GRAFT_ENOTFOUND (the lease expired or was revoked), or an
 *         etcd error.
 */
GRAFT_WUR graft_status_t graft_etcd_lease_keepalive(graft_etcd_t *etcd, int64_t lease,
                                                    int64_t *ttl_p);

/**
 * @brief Revoke a lease, deleting every key attached to it.
 * @param [in] etcd   client.
 * @param [in] lease  the lease id.
 * @return GRAFT_OK, GRAFT_ENOTFOUND, or an etcd error.
 */
GRAFT_WUR graft_status_t graft_etcd_lease_revoke(graft_etcd_t *etcd, int64_t lease);

/**
 * @brief Remaining time to live of a lease.
 * @param [in]  etcd       client.
 * @param [in]  lease      the lease id.
 * @param [out] ttl_p      remaining seconds.
 * @param [out] granted_p  TTL it was granted with; may be NULL.
 * @return GRAFT_OK, GRAFT_ENOTFOUND (expired or revoked), or an etcd error.
 */
GRAFT_WUR graft_status_t graft_etcd_lease_ttl(graft_etcd_t *etcd, int64_t lease, int64_t *ttl_p,
                                              int64_t *granted_p);

/* ------------------------------------------------------------------------ */
/* Watches                                                                  */
/* ------------------------------------------------------------------------ */

typedef enum graft_etcd_event_type {
    GRAFT_ETCD_EVENT_PUT,
    GRAFT_ETCD_EVENT_DELETE
} graft_etcd_event_type_t;

/** One change reported by a watch. For DELETE, kv.value is empty and
 *  kv.mod_revision is the revision of the delete. */
typedef struct graft_etcd_event {
    graft_etcd_event_type_t type;
    graft_etcd_kv_t kv;
} graft_etcd_event_t;

/**
 * @brief Free an array of events returned by graft_etcd_watch_next().
 * @param [in] events  may be NULL.
 * @param [in] n       number of events.
 */
void graft_etcd_events_free(graft_etcd_event_t *events, size_t n);

typedef struct graft_etcd_watch graft_etcd_watch_t;

/**
 * @brief Watch every key under a prefix from a revision on. The watch runs
 *        over one streaming HTTP response; a dropped stream is re-established
 *        from the last revision seen + 1, so no event is lost or repeated.
 * @param [in]  etcd            client (must outlive the watch).
 * @param [in]  prefix          key prefix.
 * @param [in]  start_revision  first revision to report; 0 = from now.
 * @param [out] watch_p         the watch.
 * @return GRAFT_OK or an etcd error.
 */
GRAFT_WUR graft_status_t graft_etcd_watch_create(graft_etcd_t *etcd, const char *prefix,
                                                 int64_t start_revision,
                                                 graft_etcd_watch_t **watch_p);

/**
 * @brief Wait for the next events, in revision order.
 * @param [in]  watch       the watch.
 * @param [in]  timeout_ms  how long to wait; 0 = poll.
 * @param [out] events_p    events (NULL when none); free with graft_etcd_events_free().
 * @param [out] n_p         number of events; 0 on timeout.
 * @return GRAFT_OK (events or timeout); GRAFT_ECOMPACTED when the start
 *         revision was compacted: the caller resyncs with a fresh range and
 *         graft_etcd_watch_restart() from that range's revision + 1;
 *         GRAFT_EUNREACHABLE and other errors while etcd cannot be reached
 *         (the watch keeps trying; calling again continues).
 */
GRAFT_WUR graft_status_t graft_etcd_watch_next(graft_etcd_watch_t *watch, uint32_t timeout_ms,
                                               graft_etcd_event_t **events_p, size_t *n_p);

/**
 * @brief Revision the watch reported as compacted (after GRAFT_ECOMPACTED).
 * @param [in] watch  the watch.
 * @return the compact revision, 0 if none.
 */
int64_t graft_etcd_watch_compact_revision(const graft_etcd_watch_t *watch);

/**
 * @brief Restart a watch from a new revision (after a resync).
 * @param [in] watch           the watch.
 * @param [in] start_revision  first revision to report.
 * @return GRAFT_OK or an etcd error.
 */
GRAFT_WUR graft_status_t graft_etcd_watch_restart(graft_etcd_watch_t *watch,
                                                  int64_t start_revision);

/**
 * @brief Stop and free a watch. Accepts NULL. Does not block longer than a
 *        few milliseconds even while the stream is stalled.
 * @param [in] watch  the watch.
 */
void graft_etcd_watch_destroy(graft_etcd_watch_t *watch);

#ifdef __cplusplus
}
#endif

#endif /* GRAFT_ETCD_H */
