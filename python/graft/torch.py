"""graft.torch: a PyTorch optimizer wrapper in torchft's style.

    rt = graft.Runtime(job=..., group=..., groups=...)
    opt = graft.torch.Optimizer(rt, torch.optim.Adam(model.parameters()),
                                objects=lambda: {...}, load_objects=...)
    for batch in data:
        opt.zero_grad()          # quorum; heals this group when it is behind
        loss(model(batch)).backward()
        opt.step()               # commit; applies the step only on a yes

The wrapper registers every parameter and every optimizer state tensor as a
region (zero-copy: the tensors' own storage), after materializing the
optimizer's lazily created state so a replacement registers the same region
table before its first quorum. Python-object state (RNG states, a scheduler,
a sampler position) travels in a bounded ObjectState region.

The quorum can overlap the forward pass: start_quorum() is the first half
of zero_grad() (the quorum runs on a thread), wait_quorum() the second; it
says when the forward pass must run again (another step or replica rank
than expected, or this group's state replaced):

    for batch in data:
        step, rank = opt.start_quorum()
        loss = loss_fn(model(shard(batch, step, rank)))
        if opt.wait_quorum():
            loss = loss_fn(model(shard(batch, opt.info.step, opt.info.replica_rank)))
        loss.backward()
        opt.step()
"""
import inspect
import threading
from typing import Any, Callable, Dict, Iterable, Optional, Tuple

import torch

from graft.errors import Error, GroupError, PeerError, UsageError
from graft.stateful import StateDicts
from graft.torch_average import GradientAverager, LayoutMismatch, _layout_diff  # noqa: F401

# The installed torch's default for zero_grad(set_to_none=...): False up to
# 1.13, True from 2.0.
_SET_TO_NONE = inspect.signature(torch.optim.Optimizer.zero_grad).parameters[
    "set_to_none"].default


class HealFailed(GroupError):
    """This group failed to heal max_failed_heals times in a row: it cannot
    take part in the job (the last heal's error is in ``cause``, its text in
    the message). Raised by Optimizer.zero_grad()."""

    def __init__(self, status, message, cause=None):
        super().__init__(status, message)
        self.cause = cause
from graft.state import ObjectState

__all__ = ["BufferState", "HealFailed", "LayoutMismatch", "Optimizer", "materialize_state",
           "local_optimizer", "DataPosition", "GradientAverager", "LocalSGD", "DiLoCo",
           "DistributedDataParallel"]


def materialize_state(optim):
    """Create the per-parameter state an optimizer would create lazily at its
    first step, with the values it would start from, so the state exists (and
    can be registered) before any step. Adam, AdamW and SGD (with momentum
    and no dampening) directly; any other optimizer by a step with zero
    gradients (parameters put back, step counters reset) once two small
    stand-ins proved that exact for its class and hyperparameters, or an
    error says why not."""
    for group in optim.param_groups:
        for p in group["params"]:
            st = optim.state[p]
            if st:
                continue
            if isinstance(optim, (torch.optim.Adam, torch.optim.AdamW)):
                if group.get("capturable") or group.get("fused"):
                    raise UsageError(-2, "graft: capturable/fused Adam is not supported")
                st["step"] = torch.tensor(0.0)
                st["exp_avg"] = torch.zeros_like(p, memory_format=torch.preserve_format)
                st["exp_avg_sq"] = torch.zeros_like(p, memory_format=torch.preserve_format)
                if group.get("amsgrad"):
                    st["max_exp_avg_sq"] = torch.zeros_like(p, memory_format=torch.preserve_format)
            elif isinstance(optim, torch.optim.SGD):
                if group.get("momentum", 0) == 0:
                    continue
                if group.get("dampening", 0) != 0:
                    raise UsageError(-2, "graft: SGD with dampening creates its momentum "
                                     "buffer differently at the first step; not supported")
                # With no dampening, momentum * 0 + grad equals the first
                # step's clone of the gradient, bit for bit.
                st["momentum_buffer"] = torch.zeros_like(p, memory_format=torch.preserve_format)
            else:
                _materialize_by_dry_step(optim)
                return


def _reset_counters(optim):
    """Step counters (a state's "step") back to 0, tensor or number."""
    for st in optim.state.values():
        if "step" in st:
            if torch.is_tensor(st["step"]):
                st["step"].zero_()
            else:
                st["step"] = 0


def _dry_step(optim):
    """One step with zero gradients, the parameters (and gradients) put back
    and the step counters reset: the state exists, at the values a zero
    gradient leaves, which are the fresh ones for most optimizers."""
    params = [p for g in optim.param_groups for p in g["params"]]
    saved = [(p.detach().clone(), p.grad) for p in params]
    for p in params:
        p.grad = torch.zeros_like(p)
    optim.step()
    with torch.no_grad():
        for p, (data, grad) in zip(params, saved):
            p.copy_(data)
            p.grad = grad
    _reset_counters(optim)


def _stand_in(optim, gen):
    """An optimizer of optim's class and hyperparameters over small tensors
    (5 elements per parameter group, of its first parameter's dtype)."""
    groups = []
    for g in optim.param_groups:
        p0 = g["params"][0]
        t = torch.randn(5, generator=gen, dtype=torch.float64).to(p0.dtype).to(p0.device)
        groups.append(dict({k: v for k, v in g.items() if k != "params"},
                           params=[t.requires_grad_()]))
    try:
        return type(optim)(groups, **optim.defaults)
    except TypeError:
        return type(optim)(groups)


def _materialize_by_dry_step(optim):
    """The state of any other optimizer: _dry_step(), first verified on two
    small stand-ins (one fresh, one materialized so) that take the same 3
    steps and must end bit-identical, parameters and state. Refused with
    the reason otherwise (NAdam's mu_product, ASGD's eta and mu: a zero
    gradient moves them)."""
    name = type(optim).__name__
    if any(optim.state.get(p) for g in optim.param_groups for p in g["params"]):
        # A step with zero gradients would move the state that exists.
        raise UsageError(-2, "graft: %s holds state for some parameters and not for others; "
                         "take a step with every parameter's gradient before wrapping it"
                         % name)
    try:
        a, b = _stand_in(optim, torch.Generator().manual_seed(7)), \
            _stand_in(optim, torch.Generator().manual_seed(7))
        _dry_step(b)
        gen = torch.Generator().manual_seed(11)
        for _ in range(3):
            for ga, gb in zip(a.param_groups, b.param_groups):
                for pa, pb in zip(ga["params"], gb["params"]):
                    g = torch.randn(pa.shape, generator=gen, dtype=torch.float64)
                    pa.grad = g.to(pa.dtype).to(pa.device)
                    pb.grad = pa.grad.clone()
            a.step()
            b.step()
        same = all(torch.equal(pa, pb) for ga, gb in zip(a.param_groups, b.param_groups)
                   for pa, pb in zip(ga["params"], gb["params"]))
        sa, sb = a.state_dict()["state"], b.state_dict()["state"]
        for k in sa:
            for key, va in sa[k].items():
                vb = sb[k].get(key)
                same = same and (torch.equal(va, vb) if torch.is_tensor(va) else va == vb)
    except Exception as e:  # an optimizer graft cannot build or step a copy of
        raise UsageError(-2, "graft: %s creates its state lazily, and graft could not check "
                         "that a step with zero gradients creates it as the first step would "
                         "(%s); take one step before wrapping it" % (name, e)) from e
    if not same:
        raise UsageError(-2, "graft: %s creates its state lazily, and a step with zero "
                         "gradients does not leave it as the first step would; take one step "
                         "before wrapping it" % name)
    _dry_step(optim)


def local_optimizer(optim):
    """The optimizer that holds this rank's state: for a
    ZeroRedundancyOptimizer, the local optimizer of its shard (each rank of
    a group holds its own part, and rank r of a replacement pulls rank r's
    part from a donor); otherwise optim itself."""
    try:
        from torch.distributed.optim import ZeroRedundancyOptimizer
    except ImportError:  # a torch built without distributed
        return optim
    if isinstance(optim, ZeroRedundancyOptimizer):
        if getattr(optim, "_overlap_with_ddp", False):
            raise UsageError(-2, "graft: ZeroRedundancyOptimizer(overlap_with_ddp=True) "
                             "creates its local optimizer at run time; not supported")
        return optim.optim
    return optim


def _state_tensors(optim):
    """(name, tensor) of every state tensor, in a fixed order."""
    index = {}
    for gi, group in enumerate(optim.param_groups):
        for pi, p in enumerate(group["params"]):
            index[id(p)] = "%d.%d" % (gi, pi)
    out = []
    for group in optim.param_groups:
        for p in group["params"]:
            st = optim.state.get(p, {})
            for key in sorted(st):
                v = st[key]
                if torch.is_tensor(v):
                    out.append(("optim.%s.%s" % (index[id(p)], key), v))
    return out


def _module_buffers(modules, exclude):
    """(region name, buffer) of every buffer of modules, in a fixed order;
    a buffer is left out when its name (``named_buffers()``'s, such as
    ``1.running_mean``) or the name's last part is in exclude."""
    if modules is None:
        return []
    if isinstance(modules, torch.nn.Module):
        modules = [modules]
    out = []
    seen = set()
    for mi, m in enumerate(modules):
        if not isinstance(m, torch.nn.Module):
            raise UsageError(-1, "graft: modules takes torch.nn.Module objects, not %s"
                             % type(m).__name__)
        for name, b in m.named_buffers():
            if name in exclude or name.rsplit(".", 1)[-1] in exclude or id(b) in seen:
                continue
            seen.add(id(b))
            out.append(("buffer.%d.%s" % (mi, name), b))
    return out


class BufferState:
    """Module buffers (BatchNorm's running statistics and batch count) as
    state. The forward pass updates a buffer in place during the step, while
    a donor may be serving it, and before the commit says whether the step
    is taken; so each buffer's region is a shadow copy: save() copies the
    buffers in before the quorum (the committed state, what a donor serves
    and the drift check compares), load() copies the shadows back into the
    buffers after a heal or restore, or when the step was not taken."""

    def __init__(self, runtime, modules, exclude=()):
        self.buffers = _module_buffers(modules, set(exclude))
        self.shadows = []
        for name, b in self.buffers:
            if b.numel() == 0:
                continue
            shadow = b.detach().clone().contiguous()
            runtime.register(name, shadow, "param")
            self.shadows.append((name, b, b.data_ptr(), shadow))

    @property
    def names(self):
        return [n for n, _, _, _ in self.shadows]

    def save(self):
        with torch.no_grad():
            for name, b, ptr, shadow in self.shadows:
                if b.data_ptr() != ptr:
                    raise UsageError(-1, "graft: buffer %r was replaced by a new tensor; "
                                     "graft keeps buffers that are updated in place "
                                     "(exclude it by name otherwise)" % name)
                shadow.copy_(b)

    def load(self):
        with torch.no_grad():
            for _, b, _, shadow in self.shadows:
                b.copy_(shadow)


def _wait_heal(owner, info, unit):
    """The heal a quorum started, when it did: True once healed. A failed
    heal is kept in owner.heal_error (the commit votes no, the group heals
    at the next quorum, and until then it is no participant) and counted in
    owner.failed_heals; max_failed_heals in a row raise HealFailed."""
    if not info.healing:
        return False
    try:
        owner.runtime.heal_wait()
    except Error as e:
        owner.heal_error = e
        owner.failed_heals += 1
        if owner.failed_heals >= owner.max_failed_heals:
            raise HealFailed(e.status, "graft: this group failed to heal %d times in a row at "
                             "%s %d (max_failed_heals %d); last error: %s"
                             % (owner.failed_heals, unit, info.step, owner.max_failed_heals,
                                e.message), cause=e) from e
        return False
    owner.failed_heals = 0
    return True


class Optimizer(torch.optim.Optimizer):
    """Wraps a torch optimizer so every step runs graft's step protocol. It
    is a torch.optim.Optimizer (a scheduler takes it), whose param_groups,
    state and defaults are the wrapped optimizer's.

    runtime       a graft.Runtime with no quorum taken yet.
    optim         the optimizer; its parameters must be contiguous CPU tensors.
                  A ZeroRedundancyOptimizer (a group of many ranks) is
                  supported: every rank registers every parameter and its
                  own shard of the state (local_optimizer()).
    objects       optional callable returning the Python-object state to keep
                  identical across groups (RNG states, scheduler state_dict,
                  sampler position); packed before every quorum.
    load_objects  callable receiving those objects after this group's state
                  was replaced by a heal or a restore.
    object_bytes  the bound of the object region.
    modules       a torch.nn.Module or a list of them: every buffer of each
                  (BatchNorm's running_mean, running_var,
                  num_batches_tracked) is state, registered, healed,
                  restored and drift-checked as ``buffer.<i>.<name>``.
    exclude_buffers  buffer names (full, as named_buffers() gives them, or
                  their last part, such as "running_var") left out.
    stateful      optional {key: object with state_dict()/load_state_dict()}
                  kept as state (a scheduler, a GradScaler, a data loader);
                  see register_state_dict_fn().
    max_failed_heals  consecutive failed heals after which zero_grad() raises
                  HealFailed instead of trying again at the next quorum. While
                  its heal fails, the group is no participant: it contributes
                  zero to GradientAverager's reduction and its commit says no,
                  so the healthy groups never commit a step computed from its
                  state.

    On a spare's runtime (Runtime(spare=True), GRAFT_SPARE=1) the first
    zero_grad() (or start_quorum()/wait_quorum()) is where the spare waits
    until it takes a dead rank's slot; it then heals like a replacement
    (parameters, optimizer state, buffers, objects, state dicts) and
    returns the step's StepInfo, ``runtime.group`` naming the slot's group.
    When the job ends without it, graft.SpareUnused is raised there.
    """

    def __init__(self, runtime: Any, optim: torch.optim.Optimizer,
                 objects: Optional[Callable[[], Any]] = None,
                 load_objects: Optional[Callable[[Any], None]] = None,
                 object_bytes: int = 1 << 20, max_failed_heals: int = 3,
                 modules: Any = None, exclude_buffers: Iterable[str] = (),
                 stateful: Optional[Dict[str, Any]] = None) -> None:
        # torch.optim.Optimizer.__init__ is not called: the wrapped optimizer
        # holds the parameters, their groups and the state.
        if max_failed_heals < 1:
            raise UsageError(-1, "graft: max_failed_heals must be at least 1")
        if (objects is None) != (load_objects is None):
            raise UsageError(-1, "graft: objects and load_objects go together")
        self.runtime = runtime
        self.optim = optim
        self._objects = objects
        self._load_objects = load_objects
        self.info = None
        self.heal_error = None
        self.commit_error = None
        self.applied = None
        self._last_step = None
        self._last_replica_rank = 0
        self._pending = None    # start_quorum()'s thread and its outcome
        self.max_failed_heals = max_failed_heals
        self.failed_heals = 0   # consecutive
        # A ZeroRedundancyOptimizer's parameters are every parameter (each
        # rank holds them all); its state is the local optimizer's shard.
        self.local_optim = local_optimizer(optim)
        materialize_state(self.local_optim)
        seen = set()
        for gi, group in enumerate(optim.param_groups):
            for pi, p in enumerate(group["params"]):
                if id(p) in seen:
                    continue
                seen.add(id(p))
                runtime.register("param.%d.%d" % (gi, pi), p.data, "param")
        for name, t in _state_tensors(self.local_optim):
            runtime.register(name, t, "optim")
        self.buffer_state = BufferState(runtime, modules, exclude_buffers)
        self.state_dicts = StateDicts(runtime)
        for key, obj in (stateful or {}).items():
            self.state_dicts.add_object(key, obj)
        # The param groups' hyperparameters (a scheduler's lr) are Python
        # state too; they travel with the caller's objects.
        self.object_state = ObjectState(runtime, "objects", object_bytes)

    @property
    def param_groups(self):
        return self.optim.param_groups

    @property
    def state(self):
        return self.optim.state

    @property
    def defaults(self):
        return self.optim.defaults

    def __repr__(self) -> str:
        return "graft.torch.Optimizer(%r)" % (self.optim,)

    def state_dict(self) -> Dict[str, Any]:
        return self.optim.state_dict()

    def load_state_dict(self, state_dict: Dict[str, Any]) -> None:
        """Refused: the wrapped optimizer's state tensors are registered
        regions, and a load replaces them. Load into the optimizer before
        wrapping it; later, restore through graft (persist_root)."""
        raise UsageError(-3, "graft: load the state into the wrapped optimizer before making "
                         "graft.torch.Optimizer (its state tensors are registered regions); "
                         "a running job restores through persist_root")

    def add_param_group(self, param_group: Dict[str, Any]) -> None:
        raise UsageError(-1, "graft: the parameters are registered when the Optimizer is "
                         "made; add the group to the wrapped optimizer before that")

    def register_state_dict_fn(self, key: str, load_fn: Callable[[Any], None],
                               save_fn: Callable[[], Any]) -> None:
        """Keep save_fn()'s state dict as state under key (torchft's
        register_state_dict_fn): packed before every quorum, handed to
        load_fn after a heal, a restore or a step that was not applied.
        Tensors of 64 KiB and more are regions of their own (zero-copy),
        the rest is pickled. Before the first zero_grad(); the same keys in
        every group."""
        self._before_first_step("register_state_dict_fn()")
        self.state_dicts.add(key, load_fn, save_fn)

    def register_stateful(self, key: str, obj: Any) -> None:
        """register_state_dict_fn() for an object with state_dict() and
        load_state_dict()."""
        self._before_first_step("register_stateful()")
        self.state_dicts.add_object(key, obj)

    def _before_first_step(self, what: str) -> None:
        if self.info is not None or self._last_step is not None:
            raise UsageError(-3, "graft: %s after the first step" % what)

    def zero_grad(self, set_to_none: Optional[bool] = None) -> Any:
        """Start of a step: the quorum, and the heal when this group is
        behind. set_to_none defaults to the installed torch's default."""
        self._step_start()
        self.info = self.runtime.quorum()
        self._after_quorum(set_to_none)
        return self.info

    def start_quorum(self) -> Tuple[int, int]:
        """zero_grad() in two halves, so that the forward pass overlaps the
        quorum: this half saves the step's Python state and buffers and
        starts the quorum on a thread; wait_quorum() is the other. Returns
        the (step, replica_rank) the quorum is expected to give, which the
        forward pass may use (its data shard); between the two halves the
        thread's quorum is the only call into the runtime."""
        if self._pending is not None:
            raise UsageError(-3, "graft: start_quorum() twice without wait_quorum()")
        self._step_start()
        self.expected = (self.runtime.step, self._last_replica_rank)
        box = {}

        def run():
            try:
                box["info"] = self.runtime.quorum()
            except BaseException as e:  # re-raised by wait_quorum()
                box["error"] = e
        t = threading.Thread(target=run, name="graft-quorum", daemon=True)
        self._pending = (t, box)
        t.start()
        return self.expected

    def wait_quorum(self, set_to_none: Optional[bool] = None) -> bool:
        """The second half of start_quorum(): waits for the quorum, heals
        when this group is behind, and zeroes the gradients. Returns True
        when the forward pass run meanwhile must be run again: the quorum
        gave another step or replica rank than expected, or this group's
        state was replaced (healed, restored). The Python state and buffers
        are then those of the step's start again (the forward pass may have
        drawn from the RNGs and moved running statistics). A forward pass
        that ran while a heal wrote the parameters is one of these. The
        step's StepInfo is in self.info."""
        if self._pending is None:
            raise UsageError(-3, "graft: wait_quorum() without start_quorum()")
        t, box = self._pending
        self._pending = None
        t.join()
        if "error" in box:
            raise box["error"]
        self.info = box["info"]
        replaced = self._after_quorum(set_to_none)
        again = replaced or (self.info.step, self.info.replica_rank) != self.expected
        if again and not replaced and self.heal_error is None:
            self._restore_step_start()
        return again

    def _step_start(self) -> None:
        self.object_state.pack(self._all_objects())
        self.buffer_state.save()
        self.heal_error = None

    def _restore_step_start(self) -> None:
        """Python state and buffers as saved at the step's start (or as the
        heal installed them)."""
        self.buffer_state.load()
        objs = self.object_state.unpack()
        if objs is not None:
            self._load_all_objects(objs)

    def _after_quorum(self, set_to_none: Optional[bool]) -> bool:
        """After the quorum: the heal, and the Python state and buffers a
        replaced group takes from its donors. Whether it was replaced."""
        if set_to_none is None:
            set_to_none = _SET_TO_NONE
        _wait_heal(self, self.info, "step")
        replaced = self.info.healing or (
            self._last_step is None and self.runtime.start_kind != "cold") or (
            self._last_step is not None and self.info.step != self._last_step)
        if replaced and self.heal_error is None:
            self._restore_step_start()
        self._last_replica_rank = self.info.replica_rank
        self.optim.zero_grad(set_to_none=set_to_none)
        return replaced

    def _all_objects(self):
        hyper = [{k: v for k, v in g.items() if k != "params"}
                 for g in self.optim.param_groups]
        user = self._objects() if self._objects is not None else None
        return {"param_groups": hyper, "user": user, "state_dicts": self.state_dicts.save()}

    def _load_all_objects(self, objs):
        for g, saved in zip(self.optim.param_groups, objs["param_groups"]):
            g.update(saved)
        if self._load_objects is not None and objs["user"] is not None:
            self._load_objects(objs["user"])
        self.state_dicts.load(objs.get("state_dicts"))

    def finish(self) -> bool:
        """End the job cleanly instead of training the step zero_grad()
        opened (every rank of every group, at the same step): the final
        state's checkpoint is written when persist_root is set
        (Runtime.finish()). Returns whether this group committed the
        closing step; on False, call zero_grad() and finish() again (the
        groups that ended are not waited for)."""
        if self.info is None:
            raise UsageError(-3, "graft: finish() outside a step (call zero_grad() first)")
        try:
            return self.runtime.finish()
        except (GroupError, PeerError) as e:
            # As at step(): a group- or peer-level failure is a no.
            self.commit_error = e
            return False
        finally:
            self._last_step = self.runtime.step
            self.info = None

    def step(self, closure: Optional[Callable[[], Any]] = None) -> bool:
        """End of a step: the commit; applies the optimizer step only on a
        yes. Returns whether it applied."""
        if self.info is None:
            raise UsageError(-3, "graft: step() before zero_grad()")
        self.commit_error = None
        try:
            self.applied = self.runtime.commit()
        except (GroupError, PeerError) as e:
            # A group- or peer-level failure (drift, a lost donor) is a no:
            # this group stays at its step and heals at the next quorum.
            self.commit_error = e
            self.applied = False
        if self.applied:
            self.optim.step(closure)
        else:
            # The step is not taken: Python-object state (RNG states drawn
            # from during the step) and the buffers the forward pass
            # updated go back to what they were at its start.
            self.buffer_state.load()
            objs = self.object_state.unpack()
            if objs is not None:
                self._load_all_objects(objs)
        self._last_step = self.runtime.step
        self.info = None
        return self.applied


class DataPosition:
    """A data-loader position kept in a region (kind data), so a healed or
    restored group resumes where the others are, neither repeating nor
    skipping samples. The position is (epoch, index of the next batch)."""

    def __init__(self, runtime, name="data.position"):
        import numpy as np

        self.array = np.zeros(2, dtype=np.int64)
        runtime.register(name, self.array, "data")

    @property
    def epoch(self):
        return int(self.array[0])

    @property
    def index(self):
        return int(self.array[1])

    def advance(self, batches_per_epoch):
        """Move past one batch (call after an applied step)."""
        self.array[1] += 1
        if self.array[1] >= batches_per_epoch:
            self.array[0] += 1
            self.array[1] = 0


# Round-based synchronization (LocalSGD, DiLoCo) and the DDP wrapper build on
# the above.
from graft.torch_sync import DiLoCo, LocalSGD  # noqa: E402,F401
from graft.torch_ddp import DistributedDataParallel  # noqa: E402,F401
