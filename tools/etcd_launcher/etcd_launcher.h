/**
 * @file etcd_launcher.h
 * @brief The embedded etcd: Debian's etcd started as a child process (one
 *        server, or a cluster on loopback) for the tests, the benchmarks,
 *        the simulator and graft-demo.
 *
 * Not part of libgraft: a trainer linking the library never starts an etcd.
 * Built into build/lib/libgraft_etcd_launcher.a (tools/etcd_launcher/),
 * which those programs link before libgraft.a; see docs/ARCHITECTURE.md.
 * The client that talks to what it starts is graft/etcd.h.
 */
#ifndef GRAFT_ETCD_LAUNCHER_H
#define GRAFT_ETCD_LAUNCHER_H

#include <graft/etcd.h>

#ifdef __cplusplus
extern "C" {
#endif

/* ------------------------------------------------------------------------ */
/* Embedded server                                                          */
/* ------------------------------------------------------------------------ */

typedef struct graft_etcd_server graft_etcd_server_t;

/** Options for an embedded etcd. Zero-initialised: defaults. */
typedef struct graft_etcd_server_opts {
    const char *binary;   /**< default: "etcd" from PATH */
    const char *data_dir; /**< default: a new temporary directory, removed on destroy */
    const char *const *extra_args; /**< NULL-terminated extra command-line arguments */
    uint32_t start_timeout_ms;     /**< default 20000 */
    /** TLS: server certificate and key (PEM). Set: the client URL is
     *  https:// and the same pair identifies the start-up health check. */
    const char *cert_file;
    const char *key_file;
    /** TLS: CA that client certificates must chain to; set: etcd requires
     *  client certificates (--client-cert-auth). */
    const char *trusted_ca_file;
} graft_etcd_server_opts_t;

/**
 * @brief Start Debian's etcd on free loopback ports and wait until it answers.
 *        The child is killed if the thread that started it exits
 *        (PR_SET_PDEATHSIG), so a crashed test leaves no etcd behind; start
 *        it from a thread that outlives its use. etcd's log goes to
 *        etcd.log in the server's temporary directory.
 * @param [in]  opts      options, or NULL.
 * @param [out] server_p  the running server.
 * @return GRAFT_OK, GRAFT_ENOTFOUND (no etcd binary), GRAFT_ETIMEOUT (never
 *         became healthy), GRAFT_ESYS.
 */
GRAFT_WUR graft_status_t graft_etcd_server_start(const graft_etcd_server_opts_t *opts,
                                                 graft_etcd_server_t **server_p);

/**
 * @brief A loopback TCP port that binds now, chosen as the embedded etcd's
 *        ports are: below the ephemeral range, so that no outgoing
 *        connection takes it before its server binds it (graft-sim gives
 *        each group's torch rendezvous one).
 * @return the port, or -1 when there is no room below the ephemeral range
 *         or none bound.
 */
int graft_etcd_server_free_port(void);

/**
 * @brief Client URL, e.g. "http://127.0.0.1:40123".
 * @param [in] server  the server.
 * @return a string owned by the server.
 */
const char *graft_etcd_server_endpoint(const graft_etcd_server_t *server);

/**
 * @brief Data directory of the server.
 * @param [in] server  the server.
 * @return a string owned by the server.
 */
const char *graft_etcd_server_data_dir(const graft_etcd_server_t *server);

/**
 * @brief The server's log file (stdout and stderr of etcd, across restarts);
 *        removed with the server.
 * @param [in] server  the server.
 * @return a string owned by the server.
 */
const char *graft_etcd_server_log_path(const graft_etcd_server_t *server);

/**
 * @brief Process id of the running server, or -1 when stopped.
 * @param [in] server  the server.
 * @return the pid.
 */
int graft_etcd_server_pid(const graft_etcd_server_t *server);

/**
 * @brief Stop the server (SIGTERM, then SIGKILL), keeping its data directory.
 * @param [in] server  the server.
 * @return GRAFT_OK or GRAFT_ESYS.
 */
GRAFT_WUR graft_status_t graft_etcd_server_stop(graft_etcd_server_t *server);

/**
 * @brief Kill the server with SIGKILL, as a crash would, and reap it; its
 *        data directory stays, so graft_etcd_server_restart() brings it back.
 *        (graft_etcd_server_stop() lets a leader hand its leadership over
 *        first, which a crash never does.)
 * @param [in] server  the server.
 * @return GRAFT_OK or GRAFT_ESYS.
 */
GRAFT_WUR graft_status_t graft_etcd_server_kill(graft_etcd_server_t *server);

/**
 * @brief Start a stopped server again on the same ports and data directory.
 * @param [in] server  the server.
 * @return as graft_etcd_server_start().
 */
GRAFT_WUR graft_status_t graft_etcd_server_restart(graft_etcd_server_t *server);

/**
 * @brief Stop the server and remove its data directory if it created it.
 *        Accepts NULL.
 * @param [in] server  the server.
 */
void graft_etcd_server_destroy(graft_etcd_server_t *server);

/* ------------------------------------------------------------------------ */
/* Embedded cluster                                                         */
/* ------------------------------------------------------------------------ */

typedef struct graft_etcd_cluster graft_etcd_cluster_t;

/**
 * @brief Start n_members etcd members on free loopback ports, each in a
 *        temporary directory of its own, as one cluster, and wait until every
 *        member answers. Each member is a ::graft_etcd_server_t
 *        (graft_etcd_cluster_member()) that can be killed, stopped and
 *        restarted on its own; peers talk plain HTTP, clients as opts says.
 * @param [in]  opts       as for graft_etcd_server_start(), or NULL; data_dir
 *                         must be NULL when n_members > 1.
 * @param [in]  n_members  1 to 9 (3 survives the loss of one member).
 * @param [out] cluster_p  the running cluster.
 * @return as graft_etcd_server_start(); GRAFT_EINVAL for a bad size.
 */
GRAFT_WUR graft_status_t graft_etcd_cluster_start(const graft_etcd_server_opts_t *opts,
                                                  size_t n_members,
                                                  graft_etcd_cluster_t **cluster_p);

/**
 * @brief Number of members.
 * @param [in] cluster  the cluster.
 * @return the count.
 */
size_t graft_etcd_cluster_size(const graft_etcd_cluster_t *cluster);

/**
 * @brief One member.
 * @param [in] cluster  the cluster.
 * @param [in] index    0 .. size-1.
 * @return the member, owned by the cluster; NULL when index is out of range.
 */
graft_etcd_server_t *graft_etcd_cluster_member(graft_etcd_cluster_t *cluster, size_t index);

/**
 * @brief Every member's client URL, comma-separated (the form
 *        graft_etcd_endpoints_split() and GRAFT_ETCD_ENDPOINTS take).
 * @param [in] cluster  the cluster.
 * @return a string owned by the cluster.
 */
const char *graft_etcd_cluster_endpoints(const graft_etcd_cluster_t *cluster);

/**
 * @brief Which member leads now, asking each running member for its
 *        maintenance status (graft_etcd_member_status()).
 * @param [in]  cluster  the cluster.
 * @param [out] index_p  the leader's index.
 * @return GRAFT_OK, GRAFT_ENOTFOUND (no member claims to lead: an election
 *         is on), GRAFT_EINVAL.
 */
GRAFT_WUR graft_status_t graft_etcd_cluster_leader(graft_etcd_cluster_t *cluster,
                                                   size_t *index_p);

/**
 * @brief Stop every member and remove their directories. Accepts NULL.
 * @param [in] cluster  the cluster.
 */
void graft_etcd_cluster_destroy(graft_etcd_cluster_t *cluster);

#ifdef __cplusplus
}
#endif

#endif /* GRAFT_ETCD_LAUNCHER_H */
