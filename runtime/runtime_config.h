/* The configuration's fields, for the runtime's own files. */
#ifndef GRAFT_RUNTIME_CONFIG_H
#define GRAFT_RUNTIME_CONFIG_H

#include <graft/graft.h>
#include <graft/transfer.h>

#include <stdint.h>

/* FIELD_CHOICE settings are stored as an int: these enums must be too. */
typedef enum { GRAFT_MODE_STRICT = 0, GRAFT_MODE_ELASTIC = 1 } graft_mode_t;
/* Where a steady step is agreed: between the members (runtime_steady.c) or
 * in etcd only. */
typedef enum { GRAFT_STEADY_PEERS = 0, GRAFT_STEADY_ETCD = 1 } graft_steady_path_t;

struct graft_config {
    uint64_t set_mask; /* bit i: fields[i] was set explicitly */
    char *job;
    char *etcd_endpoints;
    char *etcd_user;
    char *etcd_password;
    char *etcd_ca;
    char *etcd_cert;
    char *etcd_key;
    uint64_t group;
    uint64_t spare; /* 0 or 1 */
    uint64_t spare_follow; /* 0 or 1: the spare follows the job's state */
    char *spare_group; /* a spare's group of spares, or NULL */
    uint64_t rank;
    uint64_t ranks_per_group;
    uint64_t groups;
    uint64_t min_groups;
    graft_mode_t mode;
    uint64_t lease_ttl_ms;
    uint64_t join_timeout_ms;
    graft_steady_path_t steady_path;
    uint64_t gather_timeout_ms;
    char *transfer_address;
    char *transfer_advertise;
    uint64_t transfer_chunk_bytes;
    uint64_t transfer_max_recipients;
    graft_transfer_backend_t transfer_backend;
    uint64_t cuda_device;
    char *job_secret_file; /* the secret itself is never a setting (docs/SECURITY.md) */
    char *persist_root;
    uint64_t persist_every;
    uint64_t persist_keep_last;
    uint64_t persist_milestone_every;
    char *persist_second_root;
    char *persist_remote;          /* s3://bucket/prefix (persist.h, "Remote tier") */
    char *persist_remote_endpoint; /* a non-AWS store's URL */
    char *persist_remote_region;
    uint64_t persist_remote_keep_last;
    uint64_t persist_final; /* 1: a checkpoint at graft_finish()'s commit */
    uint64_t drift_check_every;
    uint64_t quorum_timeout_ms;
    uint64_t stall_timeout_ms;
    uint64_t transfer_timeout_ms;
    uint64_t fence_timeout_ms;
    uint64_t persist_compression;
    uint64_t persist_file_mode; /* octal, e.g. 0600 (FIELD_MODE) */
    uint64_t etcd_connect_timeout_ms;
};

/* Effective min_groups (groups when unset). */
uint64_t graft__config_min_groups(const graft_config_t *c);

#endif /* GRAFT_RUNTIME_CONFIG_H */
