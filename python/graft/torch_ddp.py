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
import threading
from typing import Any, Optional

import torch
import torch.distributed as dist

from graft.errors import UsageError
from graft.torch import GradientAverager, LayoutMismatch


class _CrossGroup:
    """The hook's state: the runtime, the averager whose process group
    reduces across groups, and the step's count of participants, launched
    at its first bucket beside that bucket's reduction (a non-participant
    knows by itself to send zeros; only the division waits for the count)."""

    def __init__(self, runtime: Any, averager: GradientAverager, group_pg: Any) -> None:
        self.runtime = runtime
        self.averager = averager
        self.group_pg = group_pg
        self.group_size = group_pg.size()
        self.reduce = False     # whether this step reduces across groups
        self._lock = threading.Lock()
        self._count_t = None    # the count's tensor while its reduction runs
        self._count_work = None
        self._count = None      # the count, once known

    def start(self) -> None:
        """At a backward's first bucket: the process group (rebuilt for a new
        quorum) and the count of participants launched, not waited for."""
        av, rt = self.averager, self.runtime
        part = bool(rt.participating)
        av.participating = part
        self.reduce = False
        self._count = None
        if rt.replica_world == 1:
            av.participants = self._count = int(part)
            return
        try:
            if rt.quorum_id != av._qid or av.pg is None:
                av._rebuild()
            self._count_t = torch.tensor([1.0 if part else 0.0])
            self._count_work = av.pg.allreduce([self._count_t])
        except LayoutMismatch:
            raise
        except Exception as e:  # a failed collective: the step is vetoed
            av._failed(e)
            return
        self.reduce = True

    def count(self) -> int:
        """The participants of this step (waiting for their count once);
        in strict mode a count below the members vetoes the step."""
        with self._lock:
            if self._count is None:
                av, rt = self.averager, self.runtime
                self._count_work.wait(av.timeout)
                self._count = int(self._count_t.item())
                av.participants = self._count
                if rt.mode == "strict" and self._count < rt.replica_world:
                    av.held += 1
                    rt.veto()
            return self._count

    def failed(self, e: Exception) -> None:
        with self._lock:
            if self.reduce:
                self.reduce = False
                self.averager._failed(e)

    def launch(self, t: torch.Tensor) -> Any:
        """t's reduction across groups started (zeros from a non-participant):
        its future, or None when this step does not reduce."""
        if not self.reduce:
            return None
        if not self.averager.participating:
            t.zero_()
        try:
            return self.averager.pg.allreduce([t]).get_future()
        except Exception as e:
            self.failed(e)
            return None

    def divided(self, fut: Any, t: torch.Tensor) -> torch.Tensor:
        """After t's reduction: t divided by the participants."""
        try:
            fut.value()
            n = self.count()
        except Exception as e:  # the collective failed: the step is vetoed
            self.failed(e)
            return t
        return t.div_(n) if n > 0 else t

    def cross(self, t: torch.Tensor) -> torch.Tensor:
        """t (the group's average) averaged over the participants, blocking."""
        fut = self.launch(t)
        if fut is None:
            return t
        try:
            fut.wait()
        except Exception:
            pass  # divided() sees the error
        return self.divided(fut, t)


def _hook(state: _CrossGroup, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    buf = bucket.buffer()
    if bucket.index() == 0:
        state.start()
    if state.group_size == 1:
        # Asynchronous: the backward goes on while the bucket travels.
        fut = state.launch(buf)
        if fut is not None:
            return fut.then(lambda f: state.divided(f, buf))
        done = torch.futures.Future()
        done.set_result(buf)
        return done
    work = state.group_pg.allreduce([buf])
    return work.get_future().then(
        lambda f: state.cross(f.value()[0].div_(state.group_size)))


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
