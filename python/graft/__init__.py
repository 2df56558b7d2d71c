"""graft: checkpointless recovery of data-parallel training.

    import graft
    with graft.Runtime(job="j", group=0, groups=3) as rt:
        rt.register("w", weights, "param")
        for step in ...:
            info = rt.quorum()
            if info.healing:
                rt.heal_wait()
            grads = compute(weights)
            if rt.commit():
                weights -= lr * grads

The PyTorch adapter is graft.torch (imported on its own).
"""
# The package's version (pyproject.toml reads it here); graft.version() is
# the loaded libgraft's.
__version__ = "0.1.0"

from graft._lib import LibraryNotFound, path as library_path
from graft.errors import (ChunkError, Error, GroupError, JobError, PeerError, SpareUnused,
                          StateTooLarge, SystemResourceError, UsageError)
from graft.runtime import (DTYPES, KINDS, LOG_LEVELS, Event, Runtime, StepInfo,
                           set_log_callback, set_log_level, version)
from graft.launcher import launcher_settings
from graft.state import ObjectState, rng_state, set_rng_state

__all__ = [
    "Runtime", "StepInfo", "Event", "ObjectState", "rng_state", "set_rng_state",
    "Error", "UsageError", "SystemResourceError", "ChunkError", "PeerError", "GroupError",
    "JobError", "StateTooLarge", "SpareUnused", "LibraryNotFound", "KINDS", "DTYPES", "version",
    "library_path", "set_log_callback", "set_log_level", "LOG_LEVELS", "launcher_settings",
    "__version__",
]
