/**
 * @file graft/transfer.h
 * @brief State transfer engine: verified, multi-donor pulls of a rank's
 *        regions over UCX (host memory), NCCL or staged UCX (GPU memory).
 *
 * Every rank runs one ::graft_transfer_endpoint_t: a UCX context, a worker
 * driven by a progress thread, and a listener whose address ("ip:port") the
 * membership record publishes. The rank registers its regions once (host
 * memory is mapped with ucp_mem_map at registration, never per pull). Host
 * memory from graft_transfer_host_alloc() is read by peers on the same host
 * without the donor's involvement and is the fastest to pull from.
 *
 * A donor calls graft_transfer_serve_begin() for a step: chunk hashes
 * (XXH3-64, chunk size configurable) are computed by background threads
 * while recipients already read. As it accepts a connection the donor sends
 * a fresh nonce; the recipient's request carries its own nonce, the step,
 * the layout hash and an HMAC-SHA256 over all of them keyed with the job
 * secret, which itself never crosses the wire (docs/SECURITY.md). A wrong
 * MAC, step or layout is refused with ::GRAFT_ETOKEN, ::GRAFT_ESTEP or
 * ::GRAFT_ELAYOUT. Otherwise the donor
 * answers with a manifest (per region: remote address, packed rkey) carrying
 * its own MAC over both nonces, so the recipient knows the donor holds the
 * secret too, and then streams the chunk hashes as they are computed.
 *
 * A recipient calls graft_transfer_pull() with 1..k donor addresses. Chunks
 * are striped across all donors, at most `window` per donor in flight, and
 * land straight in the registered regions: either pushed by the donor's
 * progress thread on request (rendezvous active messages, the default) or
 * read with one-sided gets (ucp_get_nbx); see ::graft_transfer_read_t.
 * A chunk counts as installed only once its bytes hash to the value its
 * donor published and no other donor published a different value:
 *
 *  | situation                                     | outcome                   |
 *  |-----------------------------------------------|---------------------------|
 *  | donor refuses (token/step/layout)             | donor dropped; its status |
 *  | donor fails (transport error callback)        | its chunks go to others   |
 *  | donor makes no progress for stall_timeout_ms  | its chunks go to others   |
 *  | donor busy: queued (GRAFT_EBUSY)              | ask again every 100 ms    |
 *  | bytes do not match the donor's own hash       | donor dropped (EHASH)     |
 *  | two donors publish different hashes for chunk | ::GRAFT_EDRIFT, stop      |
 *  | no donor left with chunks still missing       | ::GRAFT_ENODONOR          |
 *  | graft_transfer_pull_cancel()                  | ::GRAFT_ECANCELED         |
 *
 * A pull that fails leaves the recipient's regions with undefined contents:
 * the report's `installed` is false and the caller must not use them.
 *
 * When a recipient finishes it tells each donor (TransferDone), and
 * graft_transfer_fence_wait() lets the donor's runtime hold its optimizer step
 * until every expected recipient of the step is done.
 *
 * Thread safety: the endpoint's own progress thread serves donors' requests.
 * All other functions may be called from any thread, but calls that change
 * the region table (register) must not run concurrently with serve or pull
 * calls on the same endpoint. One pull at a time per endpoint;
 * graft_transfer_pull_cancel(), graft_transfer_fence_wait() and
 * graft_transfer_endpoint_address() may be called from any thread at any
 * time. Progress callbacks run on the pulling thread.
 *
 * Environment: unless the user set it, `UCX_MM_ERROR_HANDLING=y` is set before
 * the UCX configuration is read, so that same-host pulls use shared memory
 * even with peer error handling.
 *
 * Sections: configuration and life cycle; regions; serving (donor);
 * pulling (recipient); GPU pairs over NCCL.
 */
#ifndef GRAFT_TRANSFER_H
#define GRAFT_TRANSFER_H

#include <graft/common.h>

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* ------------------------------------------------------------------------ */
/* Configuration and life cycle                                             */
/* ------------------------------------------------------------------------ */

typedef struct graft_transfer_endpoint graft_transfer_endpoint_t;

/** Default chunk size: hashes are computed and verified per chunk. */
#define GRAFT_TRANSFER_DEFAULT_CHUNK_BYTES (4u << 20)

/** Endpoint configuration. Zero values select the defaults given. */
typedef struct graft_transfer_config {
    /** Where to listen: an IPv4 address or the name of a network interface
     *  (its first IPv4 address is used), optionally followed by ":port"
     *  ("10.0.0.5", "eth0", "eth0:7000"); default "127.0.0.1". The wildcard
     *  0.0.0.0 is accepted only with @ref advertise_address: peers cannot
     *  connect to a published wildcard. */
    const char *listen_address;
    uint16_t port;              /**< 0 = let the system pick (or the port in
                                     listen_address; both given must agree) */
    /** The job's secret, at least GRAFT_TRANSFER_SECRET_MIN_BYTES bytes
     *  (copied): donor and recipient each prove they hold it with an HMAC
     *  over fresh nonces, so it never crosses the wire. Required. */
    const void *job_secret;
    size_t job_secret_len;
    uint32_t group;             /**< this rank's replica group (sent in requests) */
    uint32_t rank;              /**< this rank's index in its group */
    uint64_t chunk_bytes;       /**< default GRAFT_TRANSFER_DEFAULT_CHUNK_BYTES */
    uint32_t hash_threads;      /**< donor hashing threads; default 2 */
    /** The address to publish instead of the listening one: an IPv4
     *  address or an interface name, no port (the listener's is used).
     *  Required when listening on 0.0.0.0; NULL = the listening address. */
    const char *advertise_address;
    /** Recipients served at once; more are queued (answered GRAFT_EBUSY
     *  with their place, admitted first come first served as others end),
     *  not left to time out. Default GRAFT_TRANSFER_DEFAULT_MAX_RECIPIENTS. */
    uint32_t max_recipients;
} graft_transfer_config_t;

/** The shortest and the longest job secret an endpoint accepts. */
#define GRAFT_TRANSFER_SECRET_MIN_BYTES 16u
#define GRAFT_TRANSFER_SECRET_MAX_BYTES 256u

/** Default graft_transfer_config_t::max_recipients. */
#define GRAFT_TRANSFER_DEFAULT_MAX_RECIPIENTS 4

/**
 * @brief Create an endpoint: UCX context, worker, progress thread, listener.
 * @param [in]  config  configuration; strings and the secret are copied.
 *                      It must carry the job secret.
 * @param [out] ep_p    the endpoint, on success.
 * @return GRAFT_OK, GRAFT_EINVAL (no job secret or a shorter one than
 *         GRAFT_TRANSFER_SECRET_MIN_BYTES, bad address or port, no such interface or
 *         one without an IPv4 address, 0.0.0.0 without an advertised
 *         address, a wildcard advertised address), GRAFT_ENOMEM,
 *         GRAFT_ETRANSPORT (UCX failed, e.g. the port is taken), GRAFT_ESYS
 *         (thread, getifaddrs).
 */
GRAFT_WUR graft_status_t graft_transfer_endpoint_create(const graft_transfer_config_t *config,
                                                        graft_transfer_endpoint_t **ep_p);

/**
 * @brief Stop serving, close every connection and free the endpoint.
 *        Registered memory stays owned by the caller. Accepts NULL.
 * @param [in] ep  the endpoint.
 */
void graft_transfer_endpoint_destroy(graft_transfer_endpoint_t *ep);

/**
 * @brief Address to publish, "ip:port": the advertised address, or the
 *        listening one (an interface name resolved), with the listener's port.
 * @param [in] ep  the endpoint.
 * @return a string owned by the endpoint, valid until it is destroyed.
 */
const char *graft_transfer_endpoint_address(const graft_transfer_endpoint_t *ep);

/**
 * @brief Give the endpoint the group it speaks for (a spare learns it at
 *        its promotion). Only before its first serve or pull.
 * @param [in] ep     the endpoint.
 * @param [in] group  the group.
 * @return GRAFT_OK, GRAFT_EINVAL (NULL), GRAFT_ESTATE (it served or pulled
 *         already).
 */
GRAFT_WUR graft_status_t graft_transfer_endpoint_group_set(graft_transfer_endpoint_t *ep,
                                                           uint32_t group);

/* ------------------------------------------------------------------------ */
/* Regions                                                                  */
/* ------------------------------------------------------------------------ */

/** Region kinds and devices: the types of graft/common.h, by older names. */
typedef graft_region_kind_t graft_transfer_region_kind_t;
#define GRAFT_TRANSFER_REGION_PARAM GRAFT_REGION_PARAM
#define GRAFT_TRANSFER_REGION_OPTIM GRAFT_REGION_OPTIM
#define GRAFT_TRANSFER_REGION_RNG GRAFT_REGION_RNG
#define GRAFT_TRANSFER_REGION_SCHED GRAFT_REGION_SCHED
#define GRAFT_TRANSFER_REGION_DATA GRAFT_REGION_DATA
#define GRAFT_TRANSFER_REGION_SCALER GRAFT_REGION_SCALER
#define GRAFT_TRANSFER_REGION_STEP GRAFT_REGION_STEP
#define GRAFT_TRANSFER_REGION_BLOB GRAFT_REGION_BLOB

typedef graft_device_t graft_transfer_device_t;
#define GRAFT_TRANSFER_HOST GRAFT_DEVICE_HOST
#define GRAFT_TRANSFER_CUDA GRAFT_DEVICE_CUDA

/** A contiguous, named piece of a rank's state. */
typedef struct graft_transfer_region {
    const char *name;                  /**< unique per endpoint; copied */
    graft_transfer_region_kind_t kind; /**< one of the kinds above */
    uint32_t dtype;                    /**< opaque to graft; part of the layout */
    graft_transfer_device_t device;    /**< host or CUDA */
    void *ptr;                         /**< the memory; stays owned by the caller */
    uint64_t bytes;                    /**< size; 0 is allowed */
} graft_transfer_region_t;

/**
 * @brief Register a region (host memory is mapped with UCX now). Regions
 *        keep their registration order, which is part of the layout hash.
 * @param [in] ep      the endpoint; not serving and not pulling.
 * @param [in] region  the region; name copied, memory referenced.
 * Host memory inside a graft_transfer_host_alloc() block reuses the block's
 * mapping; it must not run past the block's end.
 * @return GRAFT_OK, GRAFT_EINVAL (NULL name/ptr with bytes > 0, bad kind,
 *         starts inside a host block and runs past its end),
 *         GRAFT_EEXIST (name taken), GRAFT_ESTATE (serving or pulling),
 *         GRAFT_ENOTSUP (CUDA memory in a build without CUDA),
 *         GRAFT_ETRANSPORT (ucp_mem_map failed), GRAFT_ENOMEM.
 */
GRAFT_WUR graft_status_t graft_transfer_region_register(graft_transfer_endpoint_t *ep,
                                                        const graft_transfer_region_t *region);

/**
 * @brief Allocate host memory for regions that peers on the same host can
 *        read one-sidedly. UCX allocates it (ucp_mem_map with
 *        UCP_MEM_MAP_ALLOCATE) from shared memory where it can, so a
 *        recipient's get is a plain copy out of the donor's block, with no
 *        work for the donor's progress thread; memory from malloc can only
 *        be registered, and UCX 1.13 then serves gets through the donor's
 *        progress thread (about a third of the speed; see TRANSFER.md).
 *        Regions registered inside a block (the whole block or any part of
 *        it, several per block) reuse its mapping. Over tcp it behaves as
 *        ordinary memory. A transport that cannot allocate such memory
 *        hands out plain memory with the same alignment and says so once
 *        in the log.
 *
 *        The block is aligned to at least 64 bytes (whole pages with UCX's
 *        allocators and the fallback), its contents are unspecified, and it
 *        lives until graft_transfer_host_free() or until the endpoint is
 *        destroyed, whichever comes first. It is shared memory: a forked
 *        child sees the parent's writes.
 * @param [in]  ep     the endpoint.
 * @param [in]  bytes  size, > 0.
 * @param [out] ptr_p  the block, on success.
 * @return GRAFT_OK, GRAFT_EINVAL (NULL argument, bytes == 0), GRAFT_ENOMEM
 *         (no memory, or UCX could not allocate that much),
 *         GRAFT_ETRANSPORT (UCX failed otherwise).
 */
GRAFT_WUR graft_status_t graft_transfer_host_alloc(graft_transfer_endpoint_t *ep, uint64_t bytes,
                                                   void **ptr_p);

/**
 * @brief Free a block from graft_transfer_host_alloc() on the same endpoint.
 *        Regions cannot be unregistered, so a block with registered regions
 *        inside it lives as long as the endpoint.
 * @param [in] ep   the endpoint that allocated it.
 * @param [in] ptr  the pointer graft_transfer_host_alloc() returned; NULL is
 *                  a no-op.
 * @return GRAFT_OK, GRAFT_EINVAL (NULL endpoint, or @p ptr is not a block of
 *         this endpoint, e.g. from malloc or already freed), GRAFT_ESTATE
 *         (registered regions lie in it).
 */
GRAFT_WUR graft_status_t graft_transfer_host_free(graft_transfer_endpoint_t *ep, void *ptr);

/**
 * @brief Layout hash of the registered region table: XXH3-64 over every
 *        region's name, kind, dtype, device and size, in order.
 * @param [in]  ep       the endpoint.
 * @param [out] hash_p   the hash.
 * @return GRAFT_OK or GRAFT_EINVAL.
 */
GRAFT_WUR graft_status_t graft_transfer_layout_hash(const graft_transfer_endpoint_t *ep,
                                                    uint64_t *hash_p);

/* ------------------------------------------------------------------------ */
/* Serving (donor)                                                          */
/* ------------------------------------------------------------------------ */

/**
 * @brief Expose the registered regions at @p step. Starts hashing in the
 *        background and returns at once; every recipient of the step shares
 *        the one set of hashes (a second call for the step being served is a
 *        no-op). The caller must not modify the regions until
 *        graft_transfer_serve_end(). CUDA regions are copied to their pinned
 *        host shadows first (builds with CUDA).
 * @param [in] ep    the endpoint.
 * @param [in] step  the step whose state the regions hold.
 * @return GRAFT_OK, GRAFT_ESTATE (already serving another step),
 *         GRAFT_ENOMEM, GRAFT_ESYS (thread).
 */
GRAFT_WUR graft_status_t graft_transfer_serve_begin(graft_transfer_endpoint_t *ep, uint64_t step);

/**
 * @brief Announce that this endpoint will serve @p step once it holds it: a
 *        relay of a broadcast tree, still pulling the step itself. Until
 *        graft_transfer_serve_begin() of that step, requests for it are
 *        queued (answered GRAFT_EBUSY) instead of refused, and the fence
 *        counts from here: recipients that give up while queued count as
 *        done. graft_transfer_serve_end() withdraws the announcement (the
 *        relay's own pull failed); queued recipients are then refused.
 * @param [in] ep    the endpoint.
 * @param [in] step  the step to be served.
 * @return GRAFT_OK, GRAFT_EINVAL or GRAFT_ESTATE (serving already).
 */
GRAFT_WUR graft_status_t graft_transfer_serve_expect(graft_transfer_endpoint_t *ep, uint64_t step);

/**
 * @brief Serve only recipients of these groups (the groups the quorum
 *        names as recipients of the step): a request from any other group
 *        is refused with GRAFT_ENOTRECIPIENT, even when it proves the job
 *        secret. The list stays until changed; @p n == 0 lifts it (any
 *        holder of the secret is served, the default).
 * @param [in] ep      the endpoint.
 * @param [in] groups  @p n group ids (copied).
 * @param [in] n       how many; at most 65536.
 * @return GRAFT_OK, GRAFT_EINVAL, GRAFT_ENOMEM.
 */
GRAFT_WUR graft_status_t graft_transfer_serve_recipients(graft_transfer_endpoint_t *ep,
                                                         const uint32_t *groups, size_t n);

/**
 * @brief Stop exposing the regions: new requests are refused with
 *        GRAFT_ESTEP; reads already granted may still land until the
 *        recipients are done (use graft_transfer_fence_wait() first). Waits
 *        for the hashing threads. Forgets the cached hashes (the regions may
 *        change afterwards). Also withdraws a graft_transfer_serve_expect().
 * @param [in] ep  the endpoint.
 * @return GRAFT_OK or GRAFT_ESTATE (neither serving nor expecting to).
 */
GRAFT_WUR graft_status_t graft_transfer_serve_end(graft_transfer_endpoint_t *ep);

/**
 * @brief Wait until @p expected_recipients recipients reported their pull of
 *        @p step done (successful or not), so the optimizer step may run.
 * @param [in] ep                   the endpoint.
 * @param [in] step                 the step.
 * @param [in] expected_recipients  how many to wait for; 0 returns at once.
 * @param [in] timeout_ms           0 = do not wait, only check.
 * @return GRAFT_OK or GRAFT_ETIMEOUT.
 */
GRAFT_WUR graft_status_t graft_transfer_fence_wait(graft_transfer_endpoint_t *ep, uint64_t step,
                                                   uint32_t expected_recipients,
                                                   uint32_t timeout_ms);

/**
 * @brief How many recipients reported @p step done so far.
 * @param [in] ep    the endpoint.
 * @param [in] step  the step.
 * @return the count (0 for an unknown step).
 */
uint32_t graft_transfer_fence_count(graft_transfer_endpoint_t *ep, uint64_t step);

/** The recipient group a follower sends (a follow spare, docs/RUNTIME.md,
 *  "Follow spares"): it holds no slot, and its pulls are no recipient's. */
#define GRAFT_TRANSFER_FOLLOWER_GROUP UINT32_MAX

/**
 * @brief Whether serving @p step with followers admitted would give a
 *        follower (a request from ::GRAFT_TRANSFER_FOLLOWER_GROUP that
 *        proved the job secret) a step it has not got: one asks for it (or
 *        an earlier one), or, in the last 500 ms, one asked or was admitted
 *        and none asks for a later step.
 * @param [in] ep    the endpoint.
 * @param [in] step  the step this endpoint could serve.
 * @return true or false (false for NULL).
 */
bool graft_transfer_followers_wanted(graft_transfer_endpoint_t *ep, uint64_t step);

/**
 * @brief Wait until no follower reads this serve: those admitted have
 *        reported done or were lost, and none asked for the served step
 *        (or an earlier one) without having been admitted since. A
 *        follower's completion never counts for graft_transfer_fence_wait().
 * @param [in] ep          the endpoint.
 * @param [in] timeout_ms  0 = only check.
 * @return GRAFT_OK (none left, or not serving) or GRAFT_ETIMEOUT.
 */
GRAFT_WUR graft_status_t graft_transfer_followers_wait(graft_transfer_endpoint_t *ep,
                                                       uint32_t timeout_ms);

/**
 * @brief The most recipients this endpoint has served at once (admitted
 *        and not yet done), over its whole life.
 * @param [in] ep  the endpoint.
 * @return the count (0 for NULL).
 */
uint32_t graft_transfer_serve_peak(graft_transfer_endpoint_t *ep);

/**
 * @brief Transfer requests this endpoint refused for who sent them, over its
 *        whole life: no valid MAC of the job secret (GRAFT_ETOKEN) or a group
 *        that is not a recipient of the step (GRAFT_ENOTRECIPIENT). The
 *        runtime records an event when it grows.
 * @param [in] ep  the endpoint.
 * @return the count (0 for NULL).
 */
uint64_t graft_transfer_refused_count(graft_transfer_endpoint_t *ep);

/**
 * @brief Whether this endpoint can serve: the number of consecutive times
 *        its UCX backend failed to make what serving a new connection needs
 *        (a worker: e.g. "No such device" after a network interface went
 *        away). 0 while all is well; it returns to 0 at the next success.
 *        Each failure rebuilds the backend's context on the interfaces as
 *        they are now. A rank whose count stays above 0 cannot serve and
 *        should not report itself healthy.
 * @param [in] ep  the endpoint.
 * @return the count (0 for NULL).
 */
uint64_t graft_transfer_serve_failures(graft_transfer_endpoint_t *ep);

/* ------------------------------------------------------------------------ */
/* Pulling (recipient)                                                      */
/* ------------------------------------------------------------------------ */

/**
 * Progress callback: @p bytes_done of @p bytes_total are verified and
 * installed. Runs on the pulling thread; keep it short.
 */
typedef void (*graft_transfer_progress_fn)(uint64_t bytes_done, uint64_t bytes_total, void *arg);

/** Which transport moves the bytes of a pull. */
typedef enum graft_transfer_backend {
    /** UCX one-sided gets, multi-donor; CUDA regions are staged through
     *  pinned host buffers (builds with CUDA only). */
    GRAFT_TRANSFER_BACKEND_UCX = 0,
    /** NCCL send/recv of the CUDA regions over a 2-rank communicator with
     *  one donor (builds with CUDA and NCCL only). */
    GRAFT_TRANSFER_BACKEND_NCCL = 1
} graft_transfer_backend_t;

struct graft_transfer_nccl_options;

/** How a recipient reads a chunk over UCX. */
typedef enum graft_transfer_read {
    /** The recipient asks for each chunk (ChunkRequest) and the donor's
     *  progress thread sends its bytes as a rendezvous active message that
     *  UCX receives zero-copy into the region (cma on shared memory,
     *  put_zcopy on tcp). The default: a recipient that dies mid-pull only
     *  fails the donor's sends. */
    GRAFT_TRANSFER_READ_PUSH = 0,
    /** One-sided ucp_get_nbx where the donor's block is mapped here (a
     *  graft_transfer_host_alloc() block on shared memory: a copy in the
     *  recipient); every other chunk is pushed as with READ_PUSH. Donors
     *  serve no one-sided reads: UCX 1.13 emulated them in the donor at
     *  any address without a key check (docs/SECURITY.md, "One layer
     *  below: UCX"). */
    GRAFT_TRANSFER_READ_GET = 1
} graft_transfer_read_t;

/** What to pull and how. Zero values select the defaults given. */
typedef struct graft_transfer_pull_options {
    const char *const *donors;   /**< donor addresses, "ip:port" */
    size_t n_donors;             /**< 1..GRAFT_TRANSFER_MAX_DONORS */
    uint64_t step;               /**< the step to pull */
    uint32_t window;             /**< gets in flight per donor; default 4 */
    uint32_t stall_timeout_ms;   /**< no progress from a donor this long = failed; default 5000 */
    /** until a donor's manifest arrives; a donor that queued this
     *  recipient restarts it with each answer; default 5000 */
    uint32_t connect_timeout_ms;
    uint32_t timeout_ms;         /**< whole pull; 0 = no limit */
    graft_transfer_progress_fn progress; /**< optional */
    void *progress_arg;
    graft_transfer_backend_t backend;    /**< UCX (default) or NCCL */
    const struct graft_transfer_nccl_options *nccl; /**< required with the NCCL backend */
    graft_transfer_read_t read;          /**< UCX read protocol; default PUSH */
    /** UCX only: leave the CUDA regions alone (they come by an NCCL pull
     *  of their own); the report counts the host regions' bytes. */
    bool host_only;
    /** Benchmarks only: install chunks without checking their hashes (and
     *  without drift detection), to measure what verification costs. */
    bool skip_verify;
    /** While a donor does not serve the step yet, ask again every this
     *  many ms instead of backing off from 10 ms to 200 ms (a follower
     *  waiting for the next step); 0: the back-off. */
    uint32_t step_retry_ms;
    /** A follower's pull (docs/RUNTIME.md, "Follow spares"): with one
     *  donor, a donor serving a later step than asked is asked for that
     *  step at once on the same connection (report.step says which was
     *  pulled); its refusals, and a pull that ends for them, are routine
     *  and logged at the debug level, not as warnings. */
    bool follower;
} graft_transfer_pull_options_t;

#define GRAFT_TRANSFER_MAX_DONORS 16

/** What happened to one donor during a pull. */
typedef struct graft_transfer_donor_report {
    graft_status_t status;   /**< GRAFT_OK, or why the donor was dropped */
    uint64_t bytes;          /**< verified bytes read from it */
    uint64_t chunks;         /**< verified chunks read from it */
    uint64_t reassigned;     /**< chunks taken from it after it failed */
    /** Time spent queued at it (answered GRAFT_EBUSY) before it admitted
     *  this recipient, or until the pull ended without it. */
    uint64_t queued_ns;
    /** The transports UCX chose for the connection to it, one
     *  "transport/device[:use,...]" per lane in UCX's lane order, separated
     *  by spaces, as ucp_ep_print_info() names them when the connection is
     *  closed; the connection manager's lane is left out. E.g. over shared
     *  memory "sysv/memory:am,am_bw,keepalive posix/memory tcp/lo:rma_bw,wireup"
     *  (the lane used "am" carries the protocol messages and eager data,
     *  "rma_bw" rendezvous and get bytes of memory that shared memory cannot
     *  map), over tcp "tcp/lo:rma_bw,am,am_bw,wireup". Empty when
     *  the donor never answered (the connection may not be up), and with
     *  the NCCL backend; cut at a lane boundary when longer. */
    char transports[160];
    /** The lanes, written as transports is, of the second connection that
     *  a donor on this host offered after the handshake (shared-memory
     *  transports only; the chunks came over it). Empty when none was
     *  used: another host, UCX_TLS without shared memory, or NCCL. */
    char shm_transports[160];
    /** When the donor refused the step (GRAFT_ESTEP) while serving another:
     *  that step; else 0. A follower asks for it next. */
    uint64_t serving_step;
} graft_transfer_donor_report_t;

/** Outcome of a pull. */
typedef struct graft_transfer_report {
    graft_status_t status;  /**< same as the pull's return value */
    bool installed;         /**< every region verified and installed */
    uint64_t bytes;         /**< total bytes of the registered regions */
    uint64_t chunks;        /**< total chunks */
    uint64_t elapsed_ns;    /**< from the first connect to the end */
    /** The step pulled (or asked for): options.step, or with
     *  options.follower and one donor the later step that donor served. */
    uint64_t step;
    size_t n_donors;
    graft_transfer_donor_report_t donors[GRAFT_TRANSFER_MAX_DONORS];
    /** When status is GRAFT_EDRIFT: where donors disagree. */
    struct {
        char region[128];   /**< region name */
        uint64_t chunk;     /**< chunk index within the region */
        uint32_t donor_a;   /**< index into options.donors */
        uint32_t donor_b;
        uint64_t hash_a;
        uint64_t hash_b;
    } drift;
} graft_transfer_report_t;

/**
 * @brief Pull every registered region from the donors, verified. Blocks.
 * @param [in]  ep        the endpoint, with the same region table as the
 *                        donors (its layout hash is sent).
 * @param [in]  options   donors, step, window, timeouts, progress.
 * @param [out] report_p  filled in always (also on failure); may be NULL.
 * With options->backend == GRAFT_TRANSFER_BACKEND_NCCL the pull moves the
 * CUDA regions only, from exactly one donor that runs
 * graft_transfer_serve_nccl(); each chunk is verified on the host after a
 * copy back, and nothing is reported installed unless all match.
 * @return GRAFT_OK (installed), GRAFT_EINVAL, GRAFT_ESTATE (serving, or
 *         another pull running), GRAFT_ENOTSUP (CUDA regions or NCCL in a
 *         build without CUDA), GRAFT_EDRIFT, GRAFT_ENODONOR (all donors
 *         refused or failed; the report says why each),
 *         GRAFT_ECANCELED, GRAFT_ETIMEOUT, GRAFT_ENOMEM, GRAFT_ETRANSPORT.
 */
GRAFT_WUR graft_status_t graft_transfer_pull(graft_transfer_endpoint_t *ep,
                                             const graft_transfer_pull_options_t *options,
                                             graft_transfer_report_t *report_p);

/**
 * @brief Ask the pull running on @p ep to stop; it returns GRAFT_ECANCELED.
 *        A cancel with no pull running is remembered by nothing (no-op).
 * @param [in] ep  the endpoint.
 */
void graft_transfer_pull_cancel(graft_transfer_endpoint_t *ep);

/* ------------------------------------------------------------------------ */
/* Short messages between endpoints                                         */
/* ------------------------------------------------------------------------ */

/*
 * Endpoints of a job exchange short messages over the same listener that
 * serves pulls (the runtime's steady path agrees steps this way, without
 * etcd). Delivery is best effort and unordered between senders; the bytes
 * are the caller's protocol, which must check what it receives (any process
 * that reaches the port can send).
 */

/** Longest message; longer ones are refused by the receiver. */
#define GRAFT_TRANSFER_MSG_MAX 4096u
/** Messages an endpoint holds unread; more are dropped (and counted). */
#define GRAFT_TRANSFER_MSG_INBOX 4096u

/**
 * @brief Send one message to the endpoint at @p address, connecting on first
 *        use (the connection is kept for later messages). Returns once the
 *        message is out of this process, not once it is read.
 * @param [in] ep          the endpoint.
 * @param [in] address     "host:port", as graft_transfer_endpoint_address() gave it.
 * @param [in] msg         the bytes.
 * @param [in] len         1..GRAFT_TRANSFER_MSG_MAX.
 * @param [in] timeout_ms  connecting and sending.
 * @return GRAFT_OK, GRAFT_EINVAL, GRAFT_ENOTSUP (a backend without messages),
 *         GRAFT_EPEER_UNREACHABLE, GRAFT_EPEER_TIMEOUT, GRAFT_ETRANSPORT.
 */
GRAFT_WUR graft_status_t graft_transfer_msg_send(graft_transfer_endpoint_t *ep,
                                                 const char *address, const void *msg, size_t len,
                                                 uint32_t timeout_ms);

/**
 * @brief Take the oldest received message, waiting up to @p timeout_ms.
 * @param [in]  ep          the endpoint.
 * @param [out] buf         GRAFT_TRANSFER_MSG_MAX bytes.
 * @param [out] len_p       the message's length.
 * @param [in]  timeout_ms  0: do not wait.
 * @return GRAFT_OK, GRAFT_EINVAL, or GRAFT_ETIMEOUT (none arrived).
 */
GRAFT_WUR graft_status_t graft_transfer_msg_recv(graft_transfer_endpoint_t *ep, void *buf,
                                                 size_t *len_p, uint32_t timeout_ms);

/**
 * @brief Close the connections graft_transfer_msg_send() keeps (the peers
 *        changed) and drop unread messages.
 * @param [in] ep  the endpoint.
 */
void graft_transfer_msg_reset(graft_transfer_endpoint_t *ep);

/* ------------------------------------------------------------------------ */
/* GPU pairs over NCCL                                                      */
/* ------------------------------------------------------------------------ */

/** Size of an NCCL unique id. */
#define GRAFT_TRANSFER_NCCL_UID_BYTES 128

/**
 * Exchange of the NCCL unique id of one donor/recipient pair; the runtime
 * wires it to etcd. With @p publish true (donor) store @p uid for @p step;
 * with @p publish false (recipient) fill @p uid in, waiting as needed.
 * Return GRAFT_OK or an error, which aborts the transfer.
 */
typedef graft_status_t (*graft_transfer_uid_exchange_fn)(bool publish, uint8_t *uid,
                                                         size_t uid_bytes, uint64_t step,
                                                         void *arg);

/** Options of an NCCL pair transfer. Zero values select the defaults given. */
typedef struct graft_transfer_nccl_options {
    graft_transfer_uid_exchange_fn exchange; /**< required */
    void *exchange_arg;
    int cuda_device;     /**< device of the regions; default 0 */
    uint32_t timeout_ms; /**< whole transfer; past it the communicator is aborted; default 30000 */
} graft_transfer_nccl_options_t;

/**
 * @brief Donor side of an NCCL pair transfer: publish a unique id, form a
 *        2-rank non-blocking communicator with the recipient, send every
 *        CUDA region (ncclSend inside one group call) and then the chunk
 *        hashes, computed on the host from a copy of the regions. Blocks
 *        until the recipient received everything, the timeout, or an error.
 *        Call between graft_transfer_serve_begin() and serve_end(), from a
 *        thread of the caller's choice. Counts toward the fence.
 * @param [in] ep       the endpoint; serving @p step.
 * @param [in] step     the step served.
 * @param [in] options  id exchange, device, timeout.
 * @return GRAFT_OK, GRAFT_EINVAL, GRAFT_ESTATE (not serving that step),
 *         GRAFT_ENOTSUP (no CUDA/NCCL in this build, or no device),
 *         GRAFT_ETIMEOUT (communicator aborted), GRAFT_ETRANSPORT (NCCL or
 *         CUDA error), or the exchange callback's error.
 */
GRAFT_WUR graft_status_t graft_transfer_serve_nccl(graft_transfer_endpoint_t *ep, uint64_t step,
                                                   const graft_transfer_nccl_options_t *options);

/**
 * @brief Number of CUDA devices usable by this build.
 * @return 0 in builds without CUDA or on machines without a GPU.
 */
int graft_transfer_cuda_device_count(void);

#ifdef __cplusplus
}
#endif

#endif /* GRAFT_TRANSFER_H */
