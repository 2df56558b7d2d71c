"""State dicts as graft state: any object with state_dict()/load_state_dict()
(a scheduler, a GradScaler, a StatefulDataLoader, the user's own), or any
pair of save and load functions, kept identical across groups and carried
through a heal or a restore.

A state dict is walked when it is registered: each tensor of at least
``min_tensor_bytes`` becomes a region of its own, registered zero-copy (the
tensor the state dict returned; when a later state_dict() returns another
tensor at the same place, its bytes are copied into the registered one).
Everything else (numbers, small tensors, strings) is pickled into the
caller's ObjectState with a placeholder for each region. A load rebuilds the
dict with the healed region tensors in their places and hands it to the
load function.
"""
from typing import Any, Callable, Dict, Optional, Tuple

from graft.errors import UsageError

_REGION = "__graft_region__"

# A state dict's structure as this module walks it.
Path = Tuple[Any, ...]


def _is_tensor(obj: Any) -> bool:
    mod = type(obj).__module__
    return mod.startswith("torch") and hasattr(obj, "data_ptr") and hasattr(obj, "numel")


def _nbytes(t: Any) -> int:
    return t.numel() * t.element_size()


def _walk(obj: Any, path: Path, visit: Callable[[Path, Any], Any]) -> Any:
    """obj with every tensor leaf replaced by visit(path, tensor)."""
    if _is_tensor(obj):
        return visit(path, obj)
    if isinstance(obj, dict):
        return {k: _walk(v, path + (k,), visit) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_walk(v, path + (i,), visit) for i, v in enumerate(obj)]
    if isinstance(obj, tuple):
        return tuple(_walk(v, path + (i,), visit) for i, v in enumerate(obj))
    return obj


def _restore(obj: Any, regions: Dict[str, Any]) -> Any:
    """The inverse of a save: placeholders become their region tensors."""
    if isinstance(obj, tuple) and len(obj) == 2 and obj[0] == _REGION:
        return regions[obj[1]]
    if isinstance(obj, dict):
        return {k: _restore(v, regions) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_restore(v, regions) for v in obj]
    if isinstance(obj, tuple):
        return tuple(_restore(v, regions) for v in obj)
    return obj


class StateDicts:
    """The state dicts a group keeps as state, by key (see the module's
    text). Register every key before the first quorum, the same keys in
    every group: the regions are part of the layout the groups compare."""

    def __init__(self, runtime: Any, prefix: str = "sd", min_tensor_bytes: int = 64 << 10):
        self.runtime = runtime
        self.prefix = prefix
        self.min_tensor_bytes = min_tensor_bytes
        self._fns: Dict[str, Tuple[Callable[[Any], None], Callable[[], Any]]] = {}
        self._regions: Dict[str, Any] = {}     # region name -> registered tensor

    def __len__(self) -> int:
        return len(self._fns)

    def _region_name(self, key: str, path: Path) -> str:
        return ".".join([self.prefix, key] + [str(p) for p in path])

    def add(self, key: str, load_fn: Callable[[Any], None], save_fn: Callable[[], Any]) -> None:
        """Keep save_fn()'s state dict as state under key; load_fn(sd) puts a
        healed or restored one back."""
        if not isinstance(key, str) or not key or "." in key:
            raise UsageError(-1, "graft: a state dict key is a non-empty name without dots, "
                             "not %r" % (key,))
        if key in self._fns:
            raise UsageError(-1, "graft: state dict key %r is registered twice" % key)
        if not callable(load_fn) or not callable(save_fn):
            raise UsageError(-1, "graft: state dict %r: load_fn and save_fn must be callable"
                             % key)

        def register(path: Path, t: Any) -> Any:
            if _nbytes(t) >= self.min_tensor_bytes:
                name = self._region_name(key, path)
                if not t.is_contiguous():
                    t = t.contiguous()
                self.runtime.register(name, t.detach(), "blob")
                self._regions[name] = t
            return t

        _walk(save_fn(), (), register)
        self._fns[key] = (load_fn, save_fn)

    def add_object(self, key: str, obj: Any) -> None:
        """add() for an object with state_dict() and load_state_dict()."""
        if not (hasattr(obj, "state_dict") and hasattr(obj, "load_state_dict")):
            raise UsageError(-1, "graft: %r (a %s) has no state_dict()/load_state_dict()"
                             % (key, type(obj).__name__))
        self.add(key, obj.load_state_dict, obj.state_dict)

    def save(self) -> Dict[str, Any]:
        """Every state dict now, large tensors as placeholders of their
        regions (their bytes copied there when the dict returned others)."""
        out = {}
        for key, (_, save_fn) in self._fns.items():
            def visit(path: Path, t: Any, key: str = key) -> Any:
                name = self._region_name(key, path)
                reg = self._regions.get(name)
                if reg is None:
                    if _nbytes(t) >= self.min_tensor_bytes:
                        raise UsageError(-1, "graft: state dict %r grew a tensor at %s after "
                                         "it was registered; its regions are fixed"
                                         % (key, name))
                    return t
                if tuple(t.shape) != tuple(reg.shape) or t.dtype != reg.dtype:
                    raise UsageError(-1, "graft: state dict %r: the tensor at %s is now %s %s, "
                                     "registered as %s %s" % (key, name, t.dtype,
                                                              tuple(t.shape), reg.dtype,
                                                              tuple(reg.shape)))
                if t.data_ptr() != reg.data_ptr():
                    reg.detach().copy_(t.detach())
                return (_REGION, name)
            out[key] = _walk(save_fn(), (), visit)
        return out

    def load(self, saved: Optional[Dict[str, Any]]) -> None:
        """Hand each state dict of saved (what save() gave, here or in a
        donor) to its load function, with the region tensors in place."""
        if not saved:
            return
        for key, (load_fn, _) in self._fns.items():
            if key not in saved:
                raise UsageError(-1, "graft: the healed state has no state dict %r (the "
                                 "groups registered different keys)" % key)
            load_fn(_restore(saved[key], self._regions))
