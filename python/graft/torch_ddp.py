"""graft.torch.DistributedDataParallel: torch's DDP with the cross-group
gradient reduction in its communication hook, so it overlaps the backward
pass and needs no hand-written call.

    model = graft.torch.DistributedDataParallel(rt, net)
    for ...:
        info = opt.zero_grad()                # graft.torch.Optimizer: the quorum
        loss_fn(model(x), y).backward()       # every bucket: the group's ranks,
        opt.step()                            # then rank r of every group

Inside a group the module is an ordinary DDP over the group's process group
(torchrun's default group, or the one given); a group of one rank gets a
process group of its own size 1. For each gradient bucket DDP hands over,
the hook averages it over the group's ranks and then over the groups'
participants, on GradientAverager's process group (rank r of every group):
the same rules as GradientAverager.average() (a non-participant contributes
zeros, the sum is divided by the participants, a strict-mode step without
every group is vetoed, a failed collective vetoes), element for element the
same result.
"""
from typing import Any, Optional

import torch
import torch.distributed as dist

from graft.errors import UsageError
from graft.torch import GradientAverager, LayoutMismatch


class _CrossGroup:
    """The hook's state: the runtime, the averager whose process group
    reduces across groups, and what the step's first bucket learnt."""

    def __init__(self, runtime: Any, averager: GradientAverager, group_pg: Any) -> None:
        self.runtime = runtime
        self.averager = averager
        self.group_pg = group_pg
        self.group_size = group_pg.size()
        self.count = 0          # participants of this step (its first bucket counts them)
        self.reduce = False     # whether this step reduces across groups

    def start(self) -> None:
        """At a backward's first bucket: the process group (rebuilt for a new
        quorum) and the number of participants, counted by every member."""
        av, rt = self.averager, self.runtime
        part = bool(rt.participating)
        av.participating = part
        self.reduce = False
        if rt.replica_world == 1:
            av.participants = self.count = int(part)
            return
        try:
            if rt.quorum_id != av._qid or av.pg is None:
                av._rebuild()
            c = torch.tensor([1.0 if part else 0.0])
            av.pg.allreduce([c]).wait(av.timeout)
        except LayoutMismatch:
            raise
        except Exception as e:  # a failed or timed-out collective: the step is vetoed
            av._failed(e)
            return
        av.participants = self.count = int(c.item())
        if rt.mode == "strict" and self.count < rt.replica_world:
            av.held += 1
            rt.veto()
        self.reduce = self.count > 0

    def cross(self, t: torch.Tensor) -> torch.Tensor:
        """t (the group's average) averaged over the participants, in place."""
        av = self.averager
        if not self.reduce:
            return t
        try:
            if not av.participating:
                t.zero_()
            av.pg.allreduce([t]).wait(av.timeout)
            t.div_(self.count)
        except Exception as e:
            self.reduce = False
            av._failed(e)
        return t


def _hook(state: _CrossGroup, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    buf = bucket.buffer()
    if bucket.index() == 0:
        state.start()
    if state.group_size == 1:
        if state.reduce and state.averager.participating:
            # Asynchronous: the backward goes on while the bucket travels.
            work = state.averager.pg.allreduce([buf])
            return work.get_future().then(lambda f: _divided(state, f, buf))
        done = torch.futures.Future()
        done.set_result(state.cross(buf))
        return done
    work = state.group_pg.allreduce([buf])
    return work.get_future().then(
        lambda f: state.cross(f.value()[0].div_(state.group_size)))


def _divided(state: _CrossGroup, fut: Any, buf: torch.Tensor) -> torch.Tensor:
    try:
        fut.value()
    except Exception as e:  # the collective failed: the step is vetoed
        state.reduce = False
        state.averager._failed(e)
        return buf
    return buf.div_(state.count)


class DistributedDataParallel(torch.nn.parallel.DistributedDataParallel):
    """torch's DDP whose communication hook also reduces across groups (see
    the module's text). averager: the GradientAverager whose process group
    is used (a new one when None, with timeout_s); process_group: the
    group's own (the default group when torch.distributed is initialized,
    else one of this rank alone); the other keywords go to torch's DDP,
    find_unused_parameters always True (see __init__)."""

    def __init__(self, runtime: Any, module: torch.nn.Module,
                 averager: Optional[GradientAverager] = None, process_group: Any = None,
                 timeout_s: float = 10.0, **kwargs: Any) -> None:
        # DDP re-buckets the gradients after its first iteration unless it
        # looks for unused parameters; a replacement, at its first
        # iteration, would then reduce buckets laid out otherwise than the
        # other groups' (elements summed with the wrong ones). With
        # find_unused_parameters every member keeps the first layout.
        if kwargs.get("static_graph") or kwargs.get("find_unused_parameters") is False:
            raise UsageError(-1, "graft: DistributedDataParallel needs find_unused_parameters="
                             "True and no static_graph: DDP re-buckets the gradients after "
                             "its first iteration otherwise, and a replacement's buckets "
                             "would not match the other groups'")
        kwargs["find_unused_parameters"] = True
        if process_group is None:
            if dist.is_available() and dist.is_initialized():
                process_group = dist.distributed_c10d._get_default_group()
            else:
                process_group = dist.ProcessGroupGloo(dist.HashStore(), 0, 1)
        super().__init__(module, process_group=process_group, **kwargs)
        self.averager = averager if averager is not None else GradientAverager(
            runtime, timeout_s=timeout_s)
        self.cross_group = _CrossGroup(runtime, self.averager, process_group)
        self.register_comm_hook(self.cross_group, _hook)
