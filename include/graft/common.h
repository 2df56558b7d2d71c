/**
 * @file graft/common.h
 * @brief Status codes, logging, allocation hooks and the region vocabulary
 *        shared by every module.
 *
 * Every graft function that can fail returns a ::graft_status_t: zero is
 * success and every failure is negative. Codes are grouped by blast radius
 * (see ::graft_status_class_t) so recovery code can branch on the class of a
 * failure instead of on every code:
 *
 *  - usage:  the caller passed something invalid; nothing happened.
 *  - system: a local resource failed (memory, disk, a system call).
 *  - chunk:  one piece of data is bad (hash mismatch, corrupt shard chunk);
 *            fetch it again or from elsewhere.
 *  - peer:   one remote endpoint failed or misbehaved; drop it, use others.
 *  - group:  this replica group cannot take part in the step; it heals later.
 *  - job:    the coordination service or the whole job is affected.
 *
 * The table below is append-only: a code, once published, never changes its
 * number or meaning.
 */
#ifndef GRAFT_COMMON_H
#define GRAFT_COMMON_H

#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#if defined(__GNUC__)
#define GRAFT_WUR __attribute__((warn_unused_result))
#define GRAFT_PRINTF(f, a) __attribute__((format(printf, f, a)))
#else
#define GRAFT_WUR
#define GRAFT_PRINTF(f, a)
#endif

/* ------------------------------------------------------------------------ */
/* Status codes                                                             */
/* ------------------------------------------------------------------------ */

/** Blast radius of a failure. */
typedef enum graft_status_class {
    GRAFT_CLASS_NONE = 0, /**< success */
    GRAFT_CLASS_USAGE,    /**< invalid call; nothing happened */
    GRAFT_CLASS_SYSTEM,   /**< local resource: memory, disk, syscall */
    GRAFT_CLASS_CHUNK,    /**< one piece of data failed verification */
    GRAFT_CLASS_PEER,     /**< one remote endpoint failed or misbehaved */
    GRAFT_CLASS_GROUP,    /**< this replica group cannot take part */
    GRAFT_CLASS_JOB       /**< coordination service or whole job affected */
} graft_status_class_t;

/*
 * X(name, value, class, message). Ranges by class: usage -1.., system -100..,
 * chunk -200.., peer -300.., group -400.., job -500... Append only.
 */
#define GRAFT_STATUS_MAP(X)                                                              \
    X(OK, 0, NONE, "success")                                                            \
    X(EINVAL, -1, USAGE, "invalid argument")                                             \
    X(ENOTSUP, -2, USAGE, "operation not supported in this build or configuration")     \
    X(ESTATE, -3, USAGE, "operation not allowed in the current state")                   \
    X(EEXIST, -4, USAGE, "already exists")                                               \
    X(ENOTFOUND, -5, USAGE, "not found")                                                 \
    X(ECANCELED, -6, USAGE, "operation canceled")                                        \
    X(ERANGE, -7, USAGE, "value out of range")                                           \
    X(ENOMEM, -100, SYSTEM, "out of memory")                                             \
    X(EIO, -101, SYSTEM, "input/output error")                                           \
    X(ENOSPC, -102, SYSTEM, "not enough free space")                                     \
    X(ESYS, -103, SYSTEM, "system call failed")                                          \
    X(EINTERNAL, -104, SYSTEM, "internal error")                                         \
    X(EHASH, -200, CHUNK, "chunk hash mismatch")                                         \
    X(ECORRUPT, -201, CHUNK, "corrupt data")                                             \
    X(ETRUNCATED, -202, CHUNK, "truncated data")                                         \
    X(EFORMAT, -203, CHUNK, "unsupported format or version")                             \
    X(EPEER, -300, PEER, "peer failed")                                                  \
    X(EPEER_UNREACHABLE, -301, PEER, "peer unreachable")                                 \
    X(EPEER_TIMEOUT, -302, PEER, "peer timed out")                                       \
    X(EPROTO, -303, PEER, "malformed or unexpected message")                             \
    X(ETOKEN, -304, PEER, "job secret not proven (transfer handshake)")                  \
    X(ESTEP, -305, PEER, "step mismatch")                                                \
    X(ELAYOUT, -306, PEER, "layout hash mismatch")                                       \
    X(ETRANSPORT, -307, PEER, "transport error")                                         \
    X(EBUSY, -308, PEER, "donor busy: recipient queued")                                 \
    X(EDRIFT, -400, GROUP, "replica drift: donors disagree")                             \
    X(ENODONOR, -401, GROUP, "no usable donor")                                          \
    X(EVOTE, -402, GROUP, "commit vote failed")                                          \
    X(ELEASE, -403, GROUP, "membership lease lost")                                      \
    X(ENOTMEMBER, -404, GROUP, "not a member of the quorum")                             \
    X(ETIMEOUT, -405, GROUP, "timed out")                                                \
    X(EUNREACHABLE, -500, JOB, "etcd unreachable")                                       \
    X(EETCD_TIMEOUT, -501, JOB, "etcd request timed out")                                \
    X(EAUTH, -502, JOB, "etcd authentication failed")                                    \
    X(ETOOLARGE, -503, JOB, "etcd request too large")                                    \
    X(ECOMPACTED, -504, JOB, "etcd revision compacted")                                  \
    X(EMALFORMED, -505, JOB, "malformed etcd response")                                  \
    X(EETCD, -506, JOB, "etcd returned an error")                                        \
    X(ENOQUORUM, -507, JOB, "not enough groups for a quorum")                            \
    X(ENOCHECKPOINT, -508, JOB, "no valid checkpoint")                                   \
    X(ESTATELOST, -509, JOB, "job state lost: no up-to-date group and no valid checkpoint") \
    X(ENOTRECIPIENT, -309, PEER, "not a recipient the donor serves at this step")

/** Status code returned by every fallible graft function. */
typedef enum graft_status {
#define GRAFT__STATUS_ENUM(name, value, cls, msg) GRAFT_##name = value,
    GRAFT_STATUS_MAP(GRAFT__STATUS_ENUM)
#undef GRAFT__STATUS_ENUM
} graft_status_t;

/**
 * @brief Describe a status code.
 * @param [in] status  any value; unknown values get a generic message.
 * @return a static, human-readable string; never NULL.
 */
const char *graft_status_string(graft_status_t status);

/**
 * @brief Name of a status code, e.g. "GRAFT_EHASH".
 * @param [in] status  any value.
 * @return a static string; "GRAFT_UNKNOWN" for unknown values.
 */
const char *graft_status_name(graft_status_t status);

/**
 * @brief Blast radius of a status code.
 * @param [in] status  any value; unknown negative values are ::GRAFT_CLASS_SYSTEM.
 * @return the class.
 */
graft_status_class_t graft_status_class(graft_status_t status);

/**
 * @brief Name of a class ("usage", "system", "chunk", "peer", "group", "job").
 * @param [in] cls  a class.
 * @return a static string.
 */
const char *graft_status_class_string(graft_status_class_t cls);

/* ------------------------------------------------------------------------ */
/* Logging                                                                  */
/* ------------------------------------------------------------------------ */

/** Log levels, most severe first. */
typedef enum graft_log_level {
    GRAFT_LOG_OFF = 0,
    GRAFT_LOG_ERROR,
    GRAFT_LOG_WARN,
    GRAFT_LOG_INFO,
    GRAFT_LOG_DEBUG,
    GRAFT_LOG_TRACE
} graft_log_level_t;

/**
 * Log sink. Called with the module name ("etcd", "transfer", ...), the level
 * and a formatted, NUL-terminated message without a trailing newline.
 */
typedef void (*graft_log_fn)(graft_log_level_t level, const char *module, const char *message,
                             void *arg);

/**
 * @brief Set the log threshold. The initial threshold comes from the
 *        environment variable GRAFT_LOG (off, error, warn, info, debug,
 *        trace; default warn).
 * @param [in] level  messages above this level are dropped.
 */
void graft_log_level_set(graft_log_level_t level);

/**
 * @brief Current log threshold.
 * @return the level.
 */
graft_log_level_t graft_log_level_get(void);

/**
 * @brief Route log messages to @p fn instead of standard error.
 * @param [in] fn   sink, or NULL to restore the default (standard error).
 * @param [in] arg  passed to every call of @p fn.
 */
void graft_log_sink_set(graft_log_fn fn, void *arg);

/**
 * @brief Parse a level name.
 * @param [in]  name     "off", "error", "warn", "info", "debug" or "trace".
 * @param [out] level_p  the level, on success.
 * @return GRAFT_OK or GRAFT_EINVAL.
 */
GRAFT_WUR graft_status_t graft_log_level_parse(const char *name, graft_log_level_t *level_p);

/* ------------------------------------------------------------------------ */
/* Regions                                                                  */
/* ------------------------------------------------------------------------ */

/**
 * What a region holds (values match RegionKind in proto/graft.proto). The
 * runtime, transfer and persist all describe regions with this one type
 * (transfer.h and persist.h keep their older names as aliases).
 */
typedef enum graft_region_kind {
    GRAFT_REGION_PARAM = 1,  /**< model weights */
    GRAFT_REGION_OPTIM = 2,  /**< optimizer state */
    GRAFT_REGION_RNG = 3,    /**< random generator state */
    GRAFT_REGION_SCHED = 4,  /**< learning-rate scheduler */
    GRAFT_REGION_DATA = 5,   /**< data-loader position */
    GRAFT_REGION_SCALER = 6, /**< loss scaler */
    GRAFT_REGION_STEP = 7,   /**< step counters */
    GRAFT_REGION_BLOB = 8    /**< anything else */
} graft_region_kind_t;

/** Where a region's memory lives. */
typedef enum graft_device {
    GRAFT_DEVICE_HOST = 0, /**< host memory */
    GRAFT_DEVICE_CUDA = 1  /**< CUDA device memory (builds with CUDA only) */
} graft_device_t;

/* ------------------------------------------------------------------------ */
/* Allocation hooks                                                         */
/* ------------------------------------------------------------------------ */

/**
 * Allocation hooks. Every allocation graft makes goes through these, so a
 * test can fail the n-th allocation and check that nothing leaks or crashes.
 * Memory handed to the caller (strings, arrays) is freed with graft_free().
 */
typedef struct graft_alloc_hooks {
    void *(*malloc_fn)(size_t size, void *arg);
    void *(*realloc_fn)(void *ptr, size_t size, void *arg);
    void (*free_fn)(void *ptr, void *arg);
    void *arg;
} graft_alloc_hooks_t;

/**
 * @brief Install allocation hooks. Must be called before any other graft
 *        call or with no graft object alive.
 * @param [in] hooks  the hooks, or NULL to restore malloc/realloc/free.
 */
void graft_alloc_hooks_set(const graft_alloc_hooks_t *hooks);

/**
 * @brief Free memory that graft returned to the caller.
 * @param [in] ptr  may be NULL.
 */
void graft_free(void *ptr);

/**
 * @brief Library version string, e.g. "0.1.0".
 * @return a static string.
 */
const char *graft_version_string(void);

#ifdef __cplusplus
}
#endif

#endif /* GRAFT_COMMON_H */
