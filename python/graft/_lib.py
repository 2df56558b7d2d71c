"""Loads libgraft.so with cffi (ABI mode) and declares the part of
include/graft/graft.h and include/graft/common.h the package uses.

The library is found, in order, at $GRAFT_LIBRARY, bundled in the package
(graft/libgraft.so, which `pip install` of the repository or of its sdist
compiles and copies there), next to the checkout this package was installed
from (`pip install ./python` records it at build time), at ../build/lib
relative to a source tree the package is imported from, and on the loader's
path.
"""
import os

import cffi

CDEF = """
typedef int graft_status_t;
const char *graft_status_string(graft_status_t status);
const char *graft_status_name(graft_status_t status);
int graft_status_class(graft_status_t status);
const char *graft_status_class_string(int cls);
void graft_free(void *ptr);
const char *graft_version(void);
typedef void (*graft_log_fn)(int level, const char *module, const char *message, void *arg);
void graft_log_callback_set(graft_log_fn fn, void *arg);
void graft_log_level_set(int level);

typedef struct graft_config graft_config_t;
graft_status_t graft_config_create(graft_config_t **config_p);
void graft_config_destroy(graft_config_t *config);
graft_status_t graft_config_set(graft_config_t *config, const char *name,
                                const char *value, char **error_p);
graft_status_t graft_config_get(const graft_config_t *config, const char *name,
                                char **value_p);
graft_status_t graft_config_from_env(graft_config_t *config, char **error_p);
graft_status_t graft_config_validate(const graft_config_t *config, char **error_p);

typedef struct graft_runtime graft_runtime_t;
typedef struct graft_region {
    const char *name;
    int kind;
    uint32_t dtype;
    int device;
    void *ptr;
    uint64_t bytes;
    uint64_t global_offset;
    uint64_t global_bytes;
} graft_region_t;
graft_status_t graft_init(const graft_config_t *config, graft_runtime_t **rt_p);
void graft_destroy(graft_runtime_t *rt);
graft_status_t graft_region_register(graft_runtime_t *rt, const graft_region_t *region);

typedef struct graft_step_info {
    uint64_t step;
    uint64_t quorum_id;
    bool quorum_changed;
    uint32_t replica_rank;
    uint32_t replica_world;
    bool healing;
    bool donor;
    uint32_t n_recipients;
    uint64_t round;
} graft_step_info_t;
graft_status_t graft_quorum(graft_runtime_t *rt, graft_step_info_t *info_p);
graft_status_t graft_heal_wait(graft_runtime_t *rt);
graft_status_t graft_commit(graft_runtime_t *rt, bool *apply_p);
graft_status_t graft_commit_veto(graft_runtime_t *rt);
graft_status_t graft_restart(graft_runtime_t *rt);
graft_status_t graft_finish(graft_runtime_t *rt);
bool graft_finished(const graft_runtime_t *rt);
uint64_t graft_step(graft_runtime_t *rt);
uint64_t graft_quorum_id(graft_runtime_t *rt);
uint32_t graft_replica_rank(graft_runtime_t *rt);
uint32_t graft_replica_world(graft_runtime_t *rt);
uint32_t graft_group(graft_runtime_t *rt);
int graft_start_kind(graft_runtime_t *rt);

graft_status_t graft_quorum_blob_publish(graft_runtime_t *rt, const void *data, size_t len);
graft_status_t graft_quorum_blob_get(graft_runtime_t *rt, uint64_t quorum_id,
                                     uint32_t timeout_ms, void *buf, size_t cap,
                                     size_t *len_p);

graft_status_t graft_checkpoint_now(graft_runtime_t *rt);
graft_status_t graft_checkpoint_wait(graft_runtime_t *rt);

typedef struct graft_metrics {
    uint64_t step;
    uint64_t quorum_id;
    uint64_t quorums;
    uint64_t quorum_changes;
    uint64_t commits;
    uint64_t commits_failed;
    uint64_t last_quorum_ns;
    uint64_t last_commit_ns;
    uint64_t recoveries;
    uint64_t recovery_failures;
    uint64_t recovery_bytes;
    uint64_t last_detect_ns;
    uint64_t last_quorum_phase_ns;
    uint64_t last_transfer_ns;
    uint64_t last_verify_ns;
    uint64_t serves;
    uint64_t fence_timeouts;
    uint64_t restores;
    uint64_t checkpoints_written;
    uint64_t checkpoints_committed;
    uint64_t checkpoints_failed;
    uint64_t checkpoint_bytes;
    uint64_t last_checkpoint_step;
    uint64_t last_snapshot_ns;
    uint64_t last_write_ns;
    uint64_t drift_checks;
    uint64_t drift_mismatches;
    uint64_t serve_peak_recipients;
    uint64_t steady_steps;
    uint64_t steady_fallbacks;
    uint64_t etcd_requests;
    uint64_t steady_rejected;
    uint64_t remote_uploaded;
    uint64_t remote_superseded;
    uint64_t remote_failed;
    uint64_t remote_lag_steps;
    uint64_t follow_pulls;
    uint64_t follow_bytes;
    uint64_t follow_serves;
    uint64_t follow_wait_ns;
} graft_metrics_t;
void graft_metrics_get(graft_runtime_t *rt, graft_metrics_t *metrics_p);

typedef struct graft_runtime_event {
    int kind;
    graft_status_t status;
    uint64_t step;
    uint64_t quorum_id;
    uint64_t bytes;
    uint64_t detect_ns;
    uint64_t quorum_ns;
    uint64_t transfer_ns;
    uint64_t verify_ns;
    uint32_t n_donors;
    const char *detail;
} graft_runtime_event_t;
typedef void (*graft_runtime_event_fn)(const graft_runtime_event_t *event, void *arg);
void graft_event_callback_set(graft_runtime_t *rt, graft_runtime_event_fn fn, void *arg);
const char *graft_runtime_event_kind_string(int kind);
"""

QUORUM_BLOB_MAX = 65536

ffi = cffi.FFI()
ffi.cdef(CDEF)


class LibraryNotFound(ImportError):
    """libgraft.so could not be loaded from any of the places searched."""


def _candidates():
    env = os.environ.get("GRAFT_LIBRARY")
    if env:
        # An explicit choice is the only one tried: a wrong path must fail
        # loudly, not fall back to some other build.
        return [env], True
    here = os.path.dirname(os.path.abspath(__file__))
    found = []
    bundled = os.path.join(here, "libgraft.so")
    if os.path.exists(bundled):
        found.append(bundled)
    try:
        from graft import _checkout  # written at install time

        found.append(_checkout.LIBRARY)
    except ImportError:
        pass
    found.append(os.path.join(here, "..", "..", "build", "lib", "libgraft.so"))
    found.append("libgraft.so")
    return found, False


def _load():
    paths, explicit = _candidates()
    errors = []
    for path in paths:
        if os.sep in path and not os.path.exists(path):
            errors.append("%s: no such file" % path)
            continue
        try:
            return ffi.dlopen(path), path
        except OSError as e:
            errors.append("%s: %s" % (path, e))
    how = "GRAFT_LIBRARY" if explicit else "the places searched"
    raise LibraryNotFound(
        "graft: cannot load libgraft.so from %s (build it with `make` in the "
        "checkout, or set GRAFT_LIBRARY to its path):\n  %s" % (how, "\n  ".join(errors))
    )


lib, path = _load()


def string(p):
    """A C string as str ('' for NULL)."""
    return "" if p == ffi.NULL else ffi.string(p).decode("utf-8", "replace")


def take_string(pp):
    """The string a char ** output points to, freed with graft_free()."""
    if pp[0] == ffi.NULL:
        return ""
    s = string(pp[0])
    lib.graft_free(pp[0])
    pp[0] = ffi.NULL
    return s
