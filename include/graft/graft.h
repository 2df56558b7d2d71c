/**
 * @file graft/graft.h
 * @brief The trainer's API: configuration and the step protocol.
 *
 * A trainer creates one runtime per rank from a ::graft_config_t, registers
 * the regions of its training state, and calls graft_quorum() at the start
 * of each step and graft_commit() before the optimizer step (see DESIGN.md,
 * "The step protocol").
 *
 * This header grows section by section. Present today:
 *  - Configuration: every setting by name, from code or from the
 *    environment (GRAFT_<NAME> in upper case), validated with an error that
 *    names the bad field.
 *
 * Thread safety: a ::graft_config_t is not locked; fill it from one thread.
 */
#ifndef GRAFT_GRAFT_H
#define GRAFT_GRAFT_H

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
 * | group               | GRAFT_GROUP               | (required)              |
 * | rank                | GRAFT_RANK                | 0                       |
 * | ranks_per_group     | GRAFT_RANKS_PER_GROUP     | 1                       |
 * | groups              | GRAFT_GROUPS              | (required)              |
 * | min_groups          | GRAFT_MIN_GROUPS          | = groups (strict)       |
 * | mode                | GRAFT_MODE                | strict (or elastic)     |
 * | lease_ttl_ms        | GRAFT_LEASE_TTL_MS        | 3000                    |
 * | join_timeout_ms     | GRAFT_JOIN_TIMEOUT_MS     | 10000                   |
 * | transfer_address    | GRAFT_TRANSFER_ADDRESS    | 127.0.0.1:0             |
 * | transfer_chunk_bytes| GRAFT_TRANSFER_CHUNK_BYTES| 4194304                 |
 * | job_token           | GRAFT_JOB_TOKEN           | (the job name)          |
 * | persist_root        | GRAFT_PERSIST_ROOT        | (none: no disk tier)    |
 * | persist_every       | GRAFT_PERSIST_EVERY       | 100 (steps)             |
 * | persist_keep_last   | GRAFT_PERSIST_KEEP_LAST   | 3                       |
 * | persist_milestone_every | GRAFT_PERSIST_MILESTONE_EVERY | 0 (none)        |
 * | persist_second_root | GRAFT_PERSIST_SECOND_ROOT | (none)                  |
 * | drift_check_every   | GRAFT_DRIFT_CHECK_EVERY   | 0 (off)                 |
 *
 * etcd_endpoints is a comma-separated list. In strict mode min_groups must
 * equal groups; in elastic mode it must be in [1, groups].
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

/**
 * @brief Read a setting back as text.
 * @param [in]  config   the configuration.
 * @param [in]  name     a name from the table above.
 * @param [out] value_p  a copy of its text form ("" when unset); free with
 *                       graft_free().
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

#endif /* GRAFT_GRAFT_H */
