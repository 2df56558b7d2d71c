"""graft.Error and its subclasses, one per blast-radius class of
include/graft/common.h, so recovery code catches the class it can handle.

Every error carries ``status`` (the C code), ``name`` ("ETIMEOUT"), ``cls``
("group") and ``message`` (what failed, and why).
"""
from graft._lib import lib, string


class Error(Exception):
    """A graft call failed."""

    def __init__(self, status, message, name=None, cls=None):
        self.status = status
        self.name = name if name is not None else string(lib.graft_status_name(status))
        self.cls = cls if cls is not None else string(
            lib.graft_status_class_string(lib.graft_status_class(status)))
        self.message = message
        super().__init__("%s (%s, %s): %s" % (message, self.name, self.cls, string(
            lib.graft_status_string(status))))


class UsageError(Error, ValueError):
    """An invalid call or argument; nothing happened."""


class SystemResourceError(Error, OSError):
    """A local resource failed: memory, disk, a system call."""


class ChunkError(Error):
    """One piece of data failed verification."""


class PeerError(Error):
    """One remote endpoint failed or misbehaved."""


class GroupError(Error):
    """This replica group cannot take part (drift, no donor, timeout)."""


class JobError(Error):
    """The coordination service or the whole job is affected."""


class StateTooLarge(UsageError):
    """Python-object state outgrew the bound of its blob region."""


class SpareUnused(Error):
    """A spare's first quorum (``Runtime(spare=True)`` or ``GRAFT_SPARE=1``)
    returned without a slot: every group ended the job cleanly while it
    waited, with no slot of its rank falling vacant that it could fill (a
    spare whose region table differs from its rank's members' takes none,
    docs/RUNTIME.md); the C call's GRAFT_ECANCELED with graft_finished().
    Not a failure: the process has nothing to do and may exit 0. Raised by
    Runtime.quorum(), so by graft.torch.Optimizer.zero_grad() and
    wait_quorum() too; ``runtime.finished`` is then True."""


_BY_CLASS = {
    "usage": UsageError,
    "system": SystemResourceError,
    "chunk": ChunkError,
    "peer": PeerError,
    "group": GroupError,
    "job": JobError,
}


def error_for(status, message):
    """The exception for a failed status."""
    cls = string(lib.graft_status_class_string(lib.graft_status_class(status)))
    return _BY_CLASS.get(cls, Error)(status, message)


def check(status, what):
    """Raise the exception for status unless it is GRAFT_OK (0)."""
    if status != 0:
        raise error_for(status, what)
