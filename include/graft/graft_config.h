/**
 * @file graft/graft_config.h
 * @brief The trainer's configuration: every setting by name, from code or
 *        from the environment.
 *
 * Part of the trainer's API; include <graft/graft.h>, which includes it.
 */
#ifndef GRAFT_GRAFT_CONFIG_H
#define GRAFT_GRAFT_CONFIG_H

#include <graft/common.h>

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* ------------------------------------------------------------------------ */
/* Configuration                                                            */
/* ------------------------------------------------------------------------ */

/**
 * Settings, by name (environment variable in brackets), with defaults:
 *
 * | name                | env                       | default                 |
 * |---------------------|---------------------------|-------------------------|
 * | job                 | GRAFT_JOB                 | (required)              |
 * | etcd_endpoints      | GRAFT_ETCD_ENDPOINTS      | http://127.0.0.1:2379   |
 * | etcd_user           | GRAFT_ETCD_USER           | (none)                  |
 * | etcd_password       | GRAFT_ETCD_PASSWORD       | (none)                  |
 * | etcd_ca             | GRAFT_ETCD_CA             | (none)                  |
 * | etcd_cert           | GRAFT_ETCD_CERT           | (none)                  |
 * | etcd_key            | GRAFT_ETCD_KEY            | (none)                  |
 * | group               | GRAFT_GROUP               | (required unless spare) |
 * | spare               | GRAFT_SPARE               | 0 (or 1)                |
 * | spare_follow        | GRAFT_SPARE_FOLLOW        | 0 (or 1, with spare)    |
 * | spare_group         | GRAFT_SPARE_GROUP         | (none: promoted alone)  |
 * | rank                | GRAFT_RANK                | 0                       |
 * | ranks_per_group     | GRAFT_RANKS_PER_GROUP     | 1                       |
 * | groups              | GRAFT_GROUPS              | (required)              |
 * | min_groups          | GRAFT_MIN_GROUPS          | = groups (strict)       |
 * | mode                | GRAFT_MODE                | strict (or elastic)     |
 * | lease_ttl_ms        | GRAFT_LEASE_TTL_MS        | 3000                    |
 * | join_timeout_ms     | GRAFT_JOIN_TIMEOUT_MS     | 10000                   |
 * | steady_path         | GRAFT_STEADY_PATH         | peers (or etcd)         |
 * | gather_timeout_ms   | GRAFT_GATHER_TIMEOUT_MS   | 200 (0: no delegation)  |
 * | transfer_address    | GRAFT_TRANSFER_ADDRESS    | 127.0.0.1:0             |
 * | transfer_advertise  | GRAFT_TRANSFER_ADVERTISE  | (the listening address) |
 * | transfer_chunk_bytes| GRAFT_TRANSFER_CHUNK_BYTES| 4194304                 |
 * | transfer_max_recipients | GRAFT_TRANSFER_MAX_RECIPIENTS | 4 (served at once) |
 * | transfer_backend    | GRAFT_TRANSFER_BACKEND    | ucx (or nccl)           |
 * | cuda_device         | GRAFT_CUDA_DEVICE         | 0                       |
 * | job_secret_file     | GRAFT_JOB_SECRET_FILE     | (none: see below)       |
 * | persist_root        | GRAFT_PERSIST_ROOT        | (none: no disk tier)    |
 * | persist_every       | GRAFT_PERSIST_EVERY       | 100 (steps)             |
 * | persist_keep_last   | GRAFT_PERSIST_KEEP_LAST   | 3                       |
 * | persist_milestone_every | GRAFT_PERSIST_MILESTONE_EVERY | 0 (none)        |
 * | persist_second_root | GRAFT_PERSIST_SECOND_ROOT | (none)                  |
 * | persist_remote      | GRAFT_PERSIST_REMOTE      | (none) s3://bucket/prefix |
 * | persist_remote_endpoint | GRAFT_PERSIST_REMOTE_ENDPOINT | (AWS) a non-AWS store's URL |
 * | persist_remote_region | GRAFT_PERSIST_REMOTE_REGION | AWS_REGION, else us-east-1 |
 * | persist_remote_keep_last | GRAFT_PERSIST_REMOTE_KEEP_LAST | 0 (keep all) |
 * | persist_final       | GRAFT_PERSIST_FINAL       | 1 (0: off; see graft_finish()) |
 * | drift_check_every   | GRAFT_DRIFT_CHECK_EVERY   | 0 (off)                 |
 * | quorum_timeout_ms   | GRAFT_QUORUM_TIMEOUT_MS   | 300000                  |
 * | stall_timeout_ms    | GRAFT_STALL_TIMEOUT_MS    | 5000 (donor stall)      |
 * | transfer_timeout_ms | GRAFT_TRANSFER_TIMEOUT_MS | 0 (no limit)            |
 * | fence_timeout_ms    | GRAFT_FENCE_TIMEOUT_MS    | 30000                   |
 * | persist_compression | GRAFT_PERSIST_COMPRESSION | auto (adaptive), 0 (stored), zstd 1..19 |
 * | persist_file_mode   | GRAFT_PERSIST_FILE_MODE   | 0600 (directories 0700) |
 * | etcd_connect_timeout_ms | GRAFT_ETCD_CONNECT_TIMEOUT_MS | 10000 (at start-up) |
 *
 * transfer_address is where the transfer endpoint listens: an IPv4 address
 * or an interface name (its first IPv4 address), optionally with ":port"
 * (0 or none: the system picks); a whole string that names an interface,
 * such as the alias "eth0:1", is a name. transfer_advertise is the address
 * (IPv4 or interface name, no port) published to peers instead; listening
 * on 0.0.0.0 needs it.
 *
 * transfer_backend nccl (builds with CUDA and NCCL only) moves a rank's
 * CUDA regions over an NCCL pair with one donor, its host regions still
 * over UCX; cuda_device is the device the pair uses.
 *
 * persist_file_mode is the octal mode of the checkpoint files the job
 * creates (0640 lets the owner's group read them); each directory created
 * gets the search bit of every class that may read (0640: 0750). Owner
 * read and write are required, execute bits refused. The process umask
 * still applies on top; directories that exist keep their mode. Every
 * manifest carries a MAC under the job secret, and a restore skips a
 * checkpoint whose MAC is absent or wrong (docs/SECURITY.md, "Checkpoint
 * files").
 *
 * spare = 1 starts the process as a spare (docs/RUNTIME.md, "Spares"):
 * graft_init() and the region registration run as for any rank of rank
 * `rank`, and the first graft_quorum() waits, with a lease, until the
 * spare takes the slot of a dead rank `rank` of some group (which
 * graft_group() then names) and heals like any replacement; that call
 * returns GRAFT_ECANCELED, with graft_finished() true, when every group
 * ended the job cleanly first. `group` is not used. With ranks_per_group
 * above 1, spare_group names a group of spares (the ranks of one world,
 * [A-Za-z0-9_.-]{1,64}): its rank 0 takes all the slots of a group whose
 * every rank died, for all of them in one compare-and-swap, so the world
 * stays together; without it each rank's spare takes any slot of its rank.
 * spare_follow = 1 makes the spare a follower (docs/RUNTIME.md, "Follow
 * spares"): while it waits it pulls each step's state from rank `rank` of
 * the lowest healthy group, verified, so that a promotion at the step it
 * holds pulls nothing; that donor holds its optimizer step until the
 * follower's pull of the step is done (the cost, docs/PERFORMANCE.md).
 *
 * etcd_endpoints is a comma-separated list of http:// or https:// URLs
 * (graft_config_validate() refuses "127.0.0.1:2379", saying so). In strict
 * mode min_groups must equal groups; in elastic mode it must be in
 * [1, groups]. etcd_connect_timeout_ms bounds how long graft_init() waits
 * for etcd to answer when it reads the job's secret there (at most
 * quorum_timeout_ms): past it, graft_init() fails (GRAFT_EUNREACHABLE or
 * GRAFT_EETCD_TIMEOUT) and the log names the endpoints.
 *
 * The job secret (docs/SECURITY.md) keys the transfer handshake and the
 * steady path's messages; it is not a setting, so no dump of the settings
 * shows it. graft_init() takes it from the environment variable
 * GRAFT_JOB_SECRET (16 to 256 bytes) when set, and then removes the
 * variable from the environment (children do not inherit it); else from
 * job_secret_file, a regular file that only its owner may read or write
 * (mode & 077 == 0, refused otherwise; 16 to 256 bytes, a trailing newline
 * is not part of it); else from the job's record /graft/<job>/secret in
 * etcd, 32 random bytes that the job's first process creates and every
 * other one reads, but only when every etcd endpoint is on loopback or is
 * https with etcd_user or etcd_cert set: elsewhere graft_init() fails with
 * GRAFT_EINVAL and says how to give a secret.
 *
 * etcd_password is never read back: graft_config_get() gives
 * GRAFT_CONFIG_REDACTED when one is set. A password over plain http to an
 * address that is not loopback is warned about once per process.
 *
 * steady_path peers: once a quorum has formed in etcd, the steps that change
 * nothing but the step number (same groups, same processes) are agreed
 * between the members over their transfer endpoints, and etcd sees only
 * keep-alives; any miss falls back to etcd (docs/RUNTIME.md, "The steady
 * path"). etcd: every step goes through etcd.
 *
 * gather_timeout_ms: on the etcd path, a group's leader (rank 0) waits up
 * to this long for its ranks' ready records and votes, sent over the
 * transfer endpoints, and writes them with its own in one etcd transaction
 * each; a rank whose record the leader did not write in time writes it
 * itself (docs/RUNTIME.md, "Delegated records"). 0: every rank writes its
 * own.
 */
typedef struct graft_config graft_config_t;

/**
 * @brief Create a configuration holding the defaults.
 * @param [out] config_p  the configuration.
 * @return GRAFT_OK or GRAFT_ENOMEM.
 */
GRAFT_WUR graft_status_t graft_config_create(graft_config_t **config_p);

/**
 * @brief Destroy a configuration. Accepts NULL.
 * @param [in] config  the configuration.
 */
void graft_config_destroy(graft_config_t *config);

/**
 * @brief Set one setting from its text form.
 * @param [in]  config   the configuration.
 * @param [in]  name     a name from the table above.
 * @param [in]  value    its value as text ("3", "elastic", "a,b").
 * @param [out] error_p  on failure, a message naming the field and why
 *                       (free with graft_free()); may be NULL.
 * @return GRAFT_OK, GRAFT_ENOTFOUND (no such setting), GRAFT_EINVAL (bad
 *         value), GRAFT_ENOMEM.
 */
GRAFT_WUR graft_status_t graft_config_set(graft_config_t *config, const char *name,
                                          const char *value, char **error_p);

/** What graft_config_get() gives for etcd_password when one is set: the
 *  password itself is never read back. */
#define GRAFT_CONFIG_REDACTED "(set, not shown)"

/**
 * @brief Read a setting back as text.
 * @param [in]  config   the configuration.
 * @param [in]  name     a name from the table above.
 * @param [out] value_p  a copy of its text form ("" when unset); free with
 *                       graft_free(). For etcd_password, when set, the fixed
 *                       text GRAFT_CONFIG_REDACTED, never the password.
 * @return GRAFT_OK, GRAFT_ENOTFOUND, GRAFT_ENOMEM.
 */
GRAFT_WUR graft_status_t graft_config_get(const graft_config_t *config, const char *name,
                                          char **value_p);

/**
 * @brief Apply every GRAFT_<NAME> variable present in the environment.
 * @param [in]  config   the configuration.
 * @param [out] error_p  on failure, a message naming the variable; may be NULL.
 * @return GRAFT_OK, or the first failure of graft_config_set().
 */
GRAFT_WUR graft_status_t graft_config_from_env(graft_config_t *config, char **error_p);

/**
 * @brief Check the configuration as a whole (required fields, ranges,
 *        min_groups against groups and mode).
 * @param [in]  config   the configuration.
 * @param [out] error_p  on failure, a message naming the bad field; may be NULL.
 * @return GRAFT_OK or GRAFT_EINVAL.
 */
GRAFT_WUR graft_status_t graft_config_validate(const graft_config_t *config, char **error_p);

#ifdef __cplusplus
}
#endif

#endif /* GRAFT_GRAFT_CONFIG_H */
