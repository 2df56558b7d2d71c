"""Python-object state in a bounded blob region.

An ObjectState owns a fixed-size byte buffer registered as one region (every
group registers the same size, so the layout agrees). pack() serializes the
objects into it before the step's quorum (what a donor serves); unpack()
reads them back after a heal or a restore. The buffer holds an 8-byte
length, then a pickle; tensors and numpy arrays inside the objects are
stored as their own bytes (numpy arrays), never as Python lists.
"""
import io
import pickle
import random
import struct

import numpy as np

from graft.errors import StateTooLarge, UsageError

_HEADER = struct.Struct("<Q")


def _to_plain(obj):
    """Tensors become numpy arrays (their bytes), recursively."""
    mod = type(obj).__module__
    if mod.startswith("torch") and hasattr(obj, "numpy"):
        return ("__torch__", str(obj.dtype), obj.detach().cpu().contiguous().numpy().copy())
    if isinstance(obj, dict):
        return {k: _to_plain(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_to_plain(v) for v in obj]
    if isinstance(obj, tuple):
        return tuple(_to_plain(v) for v in obj)
    return obj


def _from_plain(obj):
    if isinstance(obj, tuple) and len(obj) == 3 and obj[0] == "__torch__":
        import torch

        return torch.from_numpy(obj[2].copy())
    if isinstance(obj, dict):
        return {k: _from_plain(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_from_plain(v) for v in obj]
    if isinstance(obj, tuple):
        return tuple(_from_plain(v) for v in obj)
    return obj


class ObjectState:
    """A bounded blob region for Python-object state.

    ``capacity`` is the bound in bytes (header included). Register it before
    the first quorum; call pack(obj) whenever the state changed (at latest
    before the next quorum) and unpack() after a heal or restore.
    """

    def __init__(self, runtime, name="objects", capacity=1 << 20, kind="blob"):
        if capacity <= _HEADER.size:
            raise UsageError(-1, "graft: ObjectState capacity must exceed %d bytes"
                             % _HEADER.size)
        self.name = name
        self.capacity = capacity
        self.buffer = np.zeros(capacity, dtype=np.uint8)
        runtime.register(name, self.buffer, kind)

    def pack(self, obj):
        """Serialize obj into the region; raises StateTooLarge past the bound
        (the region is left as it was)."""
        data = pickle.dumps(_to_plain(obj), protocol=4)
        need = _HEADER.size + len(data)
        if need > self.capacity:
            raise StateTooLarge(-7, "graft: object state %r needs %d bytes, its bound is %d; "
                                "make the ObjectState larger" % (self.name, need, self.capacity))
        # Invariant (here and in the donor of any heal): every byte past
        # the packed length is zero, so identical objects give identical
        # regions; only what an earlier, longer pack used needs zeroing.
        (old,) = _HEADER.unpack(bytes(self.buffer[:_HEADER.size]))
        old_end = min(self.capacity, _HEADER.size + old)
        view = self.buffer.data
        view[:_HEADER.size] = _HEADER.pack(len(data))
        view[_HEADER.size:need] = data
        if old_end > need:
            self.buffer[need:old_end] = 0

    def unpack(self):
        """The objects last packed (here or by the donor of a heal); None when
        nothing was packed yet."""
        (n,) = _HEADER.unpack(bytes(self.buffer[:_HEADER.size]))
        if n == 0:
            return None
        if _HEADER.size + n > self.capacity:
            raise UsageError(-201, "graft: object state %r is corrupt (length %d past its "
                             "bound %d)" % (self.name, n, self.capacity))
        return _from_plain(pickle.loads(bytes(self.buffer[_HEADER.size:_HEADER.size + n])))


def rng_state():
    """The RNG states of Python's random, numpy and (when imported) torch,
    with every CUDA device's once this process uses CUDA."""
    st = {"random": random.getstate(), "numpy": np.random.get_state()}
    try:
        import torch

        st["torch"] = torch.get_rng_state()
        if torch.cuda.is_available() and torch.cuda.is_initialized():
            st["torch_cuda"] = torch.cuda.get_rng_state_all()
    except ImportError:
        pass
    return st


def set_rng_state(st):
    """Restore what rng_state() returned."""
    random.setstate(st["random"])
    np.random.set_state(st["numpy"])
    if "torch" in st:
        import torch

        torch.set_rng_state(st["torch"])
        if "torch_cuda" in st:
            torch.cuda.set_rng_state_all(st["torch_cuda"])
