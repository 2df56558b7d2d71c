"""graft.torch.GradientAverager: gradients averaged across the quorum's
groups over a torch.distributed process group of its members, rebuilt
whenever the quorum id changes (graft.torch re-exports it; the step
protocol is in torch.py). graft.torch.DistributedDataParallel and the
round-based LocalSGD/DiLoCo reduce through it too.
"""
import os

import torch

from graft.errors import UsageError


class LayoutMismatch(UsageError):
    """This group's region table (names, kinds, dtypes, sizes) differs from
    the other groups': a different model, optimizer or object_bytes. Raised
    by GradientAverager when it first reduces with them, naming the first
    differing region on both sides, instead of a crash inside gloo."""


def _layout_diff(mine, theirs, me, them):
    """The first difference between two region tables, as a sentence."""
    for i in range(max(len(mine), len(theirs))):
        a = mine[i] if i < len(mine) else None
        b = theirs[i] if i < len(theirs) else None
        if a != b:
            def say(r):
                return ("no region" if r is None else
                        "region %r (kind %d, dtype %d, %d bytes)" % tuple(r))
            return ("region %d: %s in this group (%s), %s in %s"
                    % (i, say(a), me, say(b), them))
    return None


class GradientAverager:
    """Averages gradients across the quorum's groups over a torch.distributed
    process group of its members (rank = replica rank): gloo for tensors on
    the CPU, or ``backend="nccl"`` for CUDA tensors (a CUDA build of torch
    with NCCL and a GPU; refused with a clear error otherwise).

    The process group is rebuilt whenever the quorum id changes; its
    rendezvous address travels in the runtime's quorum blob (rank 0 of
    replica rank 0 hosts a store on ``host``, on a port it holds before
    publishing it). A replacement, or a spare promoted into a dead rank's
    slot, builds its process group at its first call, and the members
    rebuild theirs then, since its joining changed the quorum id: what is
    kept between calls (store, prefix, replica rank, world) is keyed by the
    quorum id and never by group. A collective that fails or times out
    vetoes this rank's commit, so the group votes no instead of hanging, and
    the next call rebuilds the group; with restart_on_failure=True it
    restarts the rank in place instead (Runtime.restart(): the step
    abandoned, a new transfer endpoint and incarnation, the state kept). With several ranks per group (a
    torchrun world, ``ranks_per_group`` > 1), rank r of every group reduces
    with rank r of the others only, over a process group of its own, beside
    the group's own process group (DDP, ZeroRedundancyOptimizer). Call it
    after backward() and before step().

    Only participants' gradients count: a rank that is healing (heal_wait()
    not called), failed its heal, or does not hold the quorum's step
    (``runtime.participating`` false) contributes zeros, and the sum is
    divided by the number of participants, not the world size (torchft's
    num_participants()). In strict mode a step is bit-exact with a run
    without failures only when every group took part, so a reduction with
    fewer participants than members vetoes the step in every member (each
    sees the same count): every group retries it, and the group whose heal
    failed heals again. A member whose region table differs from the
    first participant's raises LayoutMismatch when the process group is
    built (strict_layout=False: only a warning). A non-participant receives
    the participants' average; its commit says no when its heal failed or it is at another
    step, so no group commits a step computed from wrong state.
    """

    def __init__(self, runtime, host="127.0.0.1", timeout_s=10.0, backend="gloo",
                 strict_layout=True, restart_on_failure=False):
        import datetime

        import torch.distributed as dist

        if backend not in ("gloo", "nccl"):
            raise UsageError(-1, "graft: GradientAverager backend %r: gloo or nccl" % (backend,))
        if backend == "nccl" and not (torch.cuda.is_available() and dist.is_nccl_available()):
            raise UsageError(-1, "graft: GradientAverager backend 'nccl' needs a CUDA build of "
                             "torch with NCCL and a visible GPU (this torch: cuda %s, nccl %s)"
                             % (torch.cuda.is_available(), dist.is_nccl_available()))
        self.backend = backend
        self.runtime = runtime
        self.host = host
        self.timeout = datetime.timedelta(seconds=timeout_s)
        self.timeout_ms = int(timeout_s * 1000)
        self._qid = 0
        self._store = None
        self.pg = None
        self.rebuilds = 0
        self.failures = 0
        self.last_error = None
        self.participating = True   # of the last average()
        self.participants = 0       # of the last average()
        self.held = 0               # strict-mode steps vetoed for a missing participant
        # True: a failed collective restarts this rank in place
        # (Runtime.restart(): new transfer endpoint, new incarnation, the
        # step abandoned) instead of only vetoing the step.
        self.restart_on_failure = restart_on_failure
        # False: a member whose region table differs is only warned about
        # (it stays a non-participant while its heals fail); every member
        # still exchanges its table.
        self.strict_layout = strict_layout
        self.layout_error = None

    def _rebuild(self):
        import torch.distributed as dist

        self.pg = None
        rt = self.runtime
        qid, rank, world = rt.quorum_id, rt.replica_rank, rt.replica_world
        me = getattr(rt, "rank", 0) or 0
        if qid != self._qid:
            # A new member set: a new store, its address in the quorum's
            # blob. One store serves the whole job (every rank of every
            # group); rank 0 of replica rank 0 hosts it.
            self._store = None
            # Not waiting for the workers here: that wait holds the GIL, and
            # the runtime's transfer thread may need it (a log or event
            # callback) to serve a heal the other members are waiting for.
            if rank == 0 and me == 0:
                # Port 0: the store binds a port the system picks and holds
                # it; picking a free port first and binding it later let
                # another process take it in between.
                self._store = dist.TCPStore(self.host, 0, None, True, self.timeout,
                                            wait_for_workers=False)
                rt.blob_publish(("gloo %s:%d" % (self.host, self._store.port)).encode())
            blob = rt.blob_get(qid, self.timeout_ms).decode()
            if not blob.startswith("gloo "):
                raise UsageError(-1, "graft: the quorum blob of quorum %d is not a gloo "
                                 "rendezvous: %r" % (qid, blob[:40]))
            host, port = blob[5:].rsplit(":", 1)
            if self._store is None or self._store.port != int(port):
                self._store = dist.TCPStore(host, int(port), None, False, self.timeout,
                                            wait_for_workers=False)
            self._qid = qid
        # Within one quorum the store stays; a group rebuilt after a failed
        # collective gets a fresh key prefix, named by what every member
        # agrees on: the quorum's step (not this rank's committed one: a
        # rank that failed to heal reduces with the others) and the etcd
        # round of its epoch, which is new after a failed step. A count of
        # this process's own attempts drifted apart between members (one
        # whose quorum call failed skipped an attempt the others made), and
        # their prefixes never met again: every group vetoed the same step
        # round after round.
        info = getattr(rt, "_info", None)
        step = info.step if info is not None else rt.step
        rnd = info.round if info is not None else 0
        # Rank r of every group reduces with rank r of the others (HSDP's
        # replicate dimension): one process group per rank in the group.
        prefix = "q%ds%dr%d/rank%d" % (qid, step, rnd, me)
        store = dist.PrefixStore(prefix, self._store)
        if self.backend == "nccl":
            # A collective that times out must raise in wait() (and the
            # communicator be aborted), not have NCCL's watchdog end the
            # process: the trainer vetoes the step and goes on.
            os.environ.setdefault("TORCH_NCCL_BLOCKING_WAIT", "1")
            os.environ.setdefault("TORCH_NCCL_ASYNC_ERROR_HANDLING", "2")
            opts = dist.ProcessGroupNCCL.Options()
            opts._timeout = self.timeout
            self.pg = dist.ProcessGroupNCCL(store, rank, world, opts)
        else:
            self.pg = dist.ProcessGroupGloo(store, rank, world, self.timeout)
        self.rebuilds += 1
        self._check_layout()

    def _check_layout(self):
        """Every member's region table against the first participant's;
        raises LayoutMismatch in a member whose table differs."""
        import json

        rt = self.runtime
        world, me = rt.replica_world, rt.replica_rank
        if world == 1:
            return
        data = json.dumps(rt.region_table).encode()
        # NCCL reduces CUDA tensors only ("Tensors must be CUDA and dense").
        dev = torch.device("cuda", torch.cuda.current_device()) if self.backend == "nccl" \
            else torch.device("cpu")
        head = torch.tensor([len(data), int(bool(rt.participating))], dtype=torch.int64,
                            device=dev)
        heads = [torch.zeros(2, dtype=torch.int64, device=dev) for _ in range(world)]
        self.pg.allgather([heads], [head]).wait(self.timeout)
        size = max(int(h[0]) for h in heads)
        buf = torch.zeros(size, dtype=torch.uint8, device=dev)
        buf[:len(data)] = torch.tensor(list(data), dtype=torch.uint8, device=dev)
        outs = [torch.empty(size, dtype=torch.uint8, device=dev) for _ in range(world)]
        self.pg.allgather([outs], [buf]).wait(self.timeout)
        tables = [[list(r) for r in json.loads(bytes(o[:int(h[0])].tolist()).decode())]
                  for o, h in zip(outs, heads)]
        ref = next((i for i, h in enumerate(heads) if int(h[1]) == 1), 0)
        diff = _layout_diff(tables[me], tables[ref], "replica rank %d" % me,
                            "replica rank %d" % ref)
        if diff is not None:
            self.layout_error = diff
            if not self.strict_layout:
                import warnings

                warnings.warn("graft: region tables differ: " + diff)
                return
            raise LayoutMismatch(-1, "graft: this group's state does not match the "
                                 "job's (a different model, optimizer or object_bytes): "
                                 + diff)

    def all_gather(self, tensor):
        """Every member's copy of tensor (same shape on all), by replica rank:
        an exact exchange, so a trainer can sum in a fixed order of its own
        choosing. None (and the commit vetoed) when the collective failed."""
        try:
            if self.runtime.quorum_id != self._qid or self.pg is None:
                self._rebuild()
            world = self.runtime.replica_world
            out = [torch.empty_like(tensor) for _ in range(world)]
            self.pg.allgather([out], [tensor.contiguous()]).wait(self.timeout)
            return out
        except LayoutMismatch:
            raise
        except Exception as e:
            self._failed(e)
            return None

    def _failed(self, e):
        self.failures += 1
        self.last_error = e
        self.pg = None
        if self.restart_on_failure:
            self.runtime.restart()
        else:
            self.runtime.veto()

    def average(self, parameters):
        """Average the gradients of parameters across the quorum in place.
        Returns False (and vetoes the commit) when the collective failed, or
        in strict mode when a member did not participate."""
        grads = [p.grad for p in parameters if p.grad is not None]
        part = bool(self.runtime.participating)
        self.participating = part
        if self.runtime.replica_world == 1:
            # Nothing to reduce: no process group (and no port to bind).
            self.participants = int(part)
            return True
        try:
            if self.runtime.quorum_id != self._qid or self.pg is None:
                self._rebuild()
            if grads:
                # One flat buffer in a fixed order: the same reduction in
                # every group, every step. Its last element counts the
                # participants (a small integer: exact in any float type).
                if part:
                    flat = torch.cat([g.reshape(-1) for g in grads]
                                     + [grads[0].new_ones(1).reshape(-1)])
                else:
                    n = sum(g.numel() for g in grads) + 1
                    flat = grads[0].new_zeros(n)
                self.pg.allreduce([flat]).wait(self.timeout)
                count = int(flat[-1].item())
                self.participants = count
                if count > 0:
                    flat.div_(count)
                off = 0
                for g in grads:
                    n = g.numel()
                    g.copy_(flat[off:off + n].view_as(g))
                    off += n
                if self.runtime.mode == "strict" and count < self.runtime.replica_world:
                    self.held += 1
                    self.runtime.veto()
                    return False
            return True
        except LayoutMismatch:
            raise
        except Exception as e:  # a failed or timed-out collective
            self._failed(e)
            return False
