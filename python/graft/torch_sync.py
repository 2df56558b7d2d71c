"""LocalSGD and DiLoCo through graft (graft.torch.LocalSGD, graft.torch.DiLoCo).

Each group trains on its own for ``sync_every`` inner steps, then the groups
synchronize: LocalSGD averages the parameters, DiLoCo averages the
pseudo-gradient (global parameters minus the trained ones) and takes an
outer optimizer step with it. One graft step is one round:

    sync = graft.torch.DiLoCo(rt, model, inner, outer, sync_every=50)
    while True:
        info = sync.begin()            # at a round's first step: the quorum, a heal
        if info.step >= rounds:
            break
        x, y = batch(info.step, sync.inner_step, info.replica_rank)
        inner.zero_grad()
        loss_fn(model(x), y).backward()
        inner.step()
        sync.end()                     # after sync_every steps: average and commit

The state graft keeps is the global parameters at the round's start, in
copies of their own (regions that no inner step touches, so a donor serves
them while it trains), and the outer optimizer's state. A replacement heals
at the next round's quorum and trains the round from the same global
parameters as the others; a round a group did not finish (its member died)
is vetoed and taken again by every group. In strict mode that makes a run
with failures bit-identical to one without, as long as the inner
optimizer keeps no state across rounds (plain SGD): an inner optimizer's
state (Adam's moments) is each group's own and a replacement starts it
afresh, as in torchft.
"""
from typing import Any, Dict, Optional

import torch

from graft.errors import GroupError, PeerError, UsageError
from graft.state import ObjectState
from graft.stateful import StateDicts
from graft.torch import GradientAverager, _state_tensors, _wait_heal, materialize_state


class _Carrier:
    """What GradientAverager.average() reduces: an object with a .grad."""

    __slots__ = ("grad",)

    def __init__(self, grad: torch.Tensor) -> None:
        self.grad = grad


class _Rounds:
    """The round protocol both algorithms share."""

    def __init__(self, runtime: Any, model: torch.nn.Module, sync_every: int,
                 averager: Optional[GradientAverager] = None,
                 stateful: Optional[Dict[str, Any]] = None, object_bytes: int = 1 << 20,
                 max_failed_heals: int = 3) -> None:
        if sync_every < 1:
            raise UsageError(-1, "graft: sync_every must be at least 1, not %r" % (sync_every,))
        if max_failed_heals < 1:
            raise UsageError(-1, "graft: max_failed_heals must be at least 1")
        self.runtime = runtime
        self.model = model
        self.sync_every = sync_every
        self.max_failed_heals = max_failed_heals
        self.failed_heals = 0
        self.live = [p for p in model.parameters()]
        if not self.live:
            raise UsageError(-1, "graft: the model has no parameters")
        # The global parameters at the round's start: regions of their own.
        self.glob = [p.detach().clone(memory_format=torch.contiguous_format)
                     for p in self.live]
        for i, g in enumerate(self.glob):
            runtime.register("global.%d" % i, g, "param")
        self.state_dicts = StateDicts(runtime)
        for key, obj in (stateful or {}).items():
            self.state_dicts.add_object(key, obj)
        self.object_state = ObjectState(runtime, "objects", object_bytes)
        self.averager = averager if averager is not None else GradientAverager(runtime)
        self.info = None
        self._started = False
        self.inner_step = 0
        self.heal_error = None
        self.applied = None
        self.rounds_applied = 0

    def begin(self) -> Any:
        """The round's quorum (a group that is behind heals here), once per
        round; inside a round it returns the round's StepInfo."""
        if self.info is not None:
            return self.info
        self.object_state.pack(self.state_dicts.save())
        self.heal_error = None
        info = self.runtime.quorum()
        if _wait_heal(self, info, "round"):
            self._load_objects()
        elif not info.healing and not self._started and self.runtime.start_kind != "cold":
            self._load_objects()       # restored from a checkpoint before the quorum
        self._started = True
        self.info = info
        self.inner_step = 0
        self._to_live()
        return info

    def end(self) -> Optional[bool]:
        """After an inner step: None inside the round; at its last step the
        synchronization and the commit, and whether the round was applied."""
        if self.info is None:
            raise UsageError(-3, "graft: end() before begin()")
        self.inner_step += 1
        if self.inner_step < self.sync_every:
            return None
        carriers = [_Carrier(self._contribution(g, p)) for g, p in zip(self.glob, self.live)]
        self.averager.average(carriers)
        try:
            self.applied = self.runtime.commit()
        except (GroupError, PeerError):
            self.applied = False
        if self.applied:
            self._outer_step([c.grad for c in carriers])
            self.rounds_applied += 1
        else:
            self._load_objects()
        self.info = None
        self._to_live()
        return self.applied

    def _load_objects(self) -> None:
        saved = self.object_state.unpack()
        if saved is not None:
            self.state_dicts.load(saved)

    def _to_live(self) -> None:
        with torch.no_grad():
            for g, p in zip(self.glob, self.live):
                p.copy_(g)

    def _contribution(self, glob: torch.Tensor, live: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def _outer_step(self, averaged) -> None:
        raise NotImplementedError


class LocalSGD(_Rounds):
    """Local SGD: every sync_every inner steps the groups' parameters are
    averaged (over the participants) and become every group's."""

    def _contribution(self, glob, live):
        return live.detach().clone()

    def _outer_step(self, averaged):
        with torch.no_grad():
            for g, a in zip(self.glob, averaged):
                g.copy_(a)


class DiLoCo(_Rounds):
    """DiLoCo: every sync_every inner steps the pseudo-gradient (global
    parameters minus trained ones) is averaged over the participants and
    outer_optimizer, made over the model's parameters (SGD with Nesterov
    momentum in the paper), takes a step with it from the global
    parameters. Its state is registered and healed."""

    def __init__(self, runtime: Any, model: torch.nn.Module,
                 outer_optimizer: torch.optim.Optimizer, sync_every: int, **kw: Any) -> None:
        params = {id(p) for g in outer_optimizer.param_groups for p in g["params"]}
        if params != {id(p) for p in model.parameters()}:
            raise UsageError(-1, "graft: DiLoCo's outer optimizer must be made over the model's "
                             "parameters")
        super().__init__(runtime, model, sync_every, **kw)
        self.outer = outer_optimizer
        materialize_state(outer_optimizer)
        for name, t in _state_tensors(outer_optimizer):
            runtime.register("outer." + name, t, "optim")

    def _contribution(self, glob, live):
        return glob - live.detach()

    def _outer_step(self, averaged):
        # From the global parameters, with the averaged pseudo-gradient.
        self._to_live()
        saved = [p.grad for p in self.live]
        for p, a in zip(self.live, averaged):
            p.grad = a
        self.outer.step()
        with torch.no_grad():
            for g, p, grad in zip(self.glob, self.live, saved):
                g.copy_(p)
                p.grad = grad
