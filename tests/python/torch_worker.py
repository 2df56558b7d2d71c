"""One group of a job training a small PyTorch model through graft.torch.

Prints "step N" after every step it took part in and writes, at the end,
a pickle of its final parameters, optimizer state, RNG states, scheduler
state, start kind and metrics to --out.

With GRAFT_SPARE=1 it is a spare (no GRAFT_GROUP): it prints "spare
waiting" before its first quorum, "spare promoted to group G" once that
quorum returned, and "spare unused: the job finished without it" (exit 0,
{"spare_unused": True} to --out) when the job ended without it."""
import argparse
import os
import pickle
import random
import sys

import numpy as np
import torch

import graft
import graft.torch


class Ema:
    """A stateful object of the user's: a running average of the losses
    held in a large tensor (a region of its own) and a count (pickled)."""

    def __init__(self, n):
        self.t = torch.zeros(n, dtype=torch.float32)
        self.count = 0

    def update(self, loss):
        self.t.mul_(0.9).add_(loss * 0.1 + self.count * 1e-3)
        self.count += 1

    def state_dict(self):
        return {"t": self.t, "count": self.count}

    def load_state_dict(self, sd):
        self.t.copy_(sd["t"])
        self.count = sd["count"]


class Position:
    """A data loader's position, as StatefulDataLoader keeps it."""

    def __init__(self):
        self.index = 0

    def state_dict(self):
        return {"index": self.index}

    def load_state_dict(self, sd):
        self.index = sd["index"]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--delay", type=float, default=0.0)
    ap.add_argument("--corrupt-at", type=int, default=-1)
    ap.add_argument("--checkpoint-at", type=int, default=-1)
    ap.add_argument("--stall-average-at", type=int, default=-1,
                    help="sleep 7 s before averaging at this step (past the collective's timeout)")
    ap.add_argument("--break-average-at", type=int, default=-1,
                    help="with --average: at this step (once) the averager's collective gets a "
                         "50 ms timeout and --late-average-at holds the peer, so gloo's "
                         "collective fails here; the averager restarts the rank in place")
    ap.add_argument("--late-average-at", type=int, default=-1,
                    help="sleep 1 s before this step's average (once)")
    ap.add_argument("--average", action="store_true",
                    help="each group trains on its own data; gradients are averaged over "
                         "--backend")
    ap.add_argument("--backend", default="gloo", help="the averager's backend [gloo]")
    ap.add_argument("--ddp", action="store_true",
                    help="with --average: the reduction in graft.torch.DistributedDataParallel's "
                         "hook instead of an average() call")
    ap.add_argument("--object-bytes", type=int, default=1 << 20,
                    help="the bound of the object region (a different one in one group is a "
                         "layout its heals cannot pass)")
    ap.add_argument("--max-failed-heals", type=int, default=None,
                    help="graft.torch.Optimizer's max_failed_heals")
    ap.add_argument("--no-strict-layout", action="store_true",
                    help="GradientAverager(strict_layout=False): a differing region table "
                         "is only a warning")
    ap.add_argument("--hidden", type=int, default=16, help="the hidden layer's width")
    ap.add_argument("--batchnorm", action="store_true",
                    help="a BatchNorm1d after the first layer; its buffers are state")
    ap.add_argument("--exclude-buffers", default="",
                    help="comma-separated buffer names graft leaves out")
    ap.add_argument("--stateful", action="store_true",
                    help="the scheduler (made on the graft optimizer), an EMA holding a 128 KiB "
                         "tensor and a data position kept through register_stateful()")
    ap.add_argument("--async-quorum", action="store_true",
                    help="the quorum overlaps the forward pass (Optimizer.start_quorum/"
                    "wait_quorum), the forward run again when wait_quorum() says so")
    ap.add_argument("--finish", action="store_true",
                    help="end through the closing step (Optimizer.finish()), so that a spare "
                         "sees the group ended, not died")
    ap.add_argument("--device", default="cpu",
                    help="where the model and its optimizer state live (cpu, cuda) [cpu]")
    a = ap.parse_args()

    if a.device == "cuda":
        # cuBLAS is deterministic only with a fixed workspace.
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
    # A spare's group is known only once it took a slot; it starts from
    # weights and RNG states of its own, which its heal replaces.
    spare = os.environ.get("GRAFT_SPARE") == "1"
    group = 50 if spare else int(os.environ["GRAFT_GROUP"])
    # Each group starts from different weights and RNG states: the cold
    # start makes them identical, a heal keeps them so.
    torch.manual_seed(a.seed + group)
    np.random.seed(a.seed + group)
    random.seed(a.seed + group)
    layers = [torch.nn.Linear(8, a.hidden)] + ([torch.nn.BatchNorm1d(a.hidden)]
                                               if a.batchnorm else [])
    model = torch.nn.Sequential(*layers, torch.nn.ReLU(), torch.nn.Dropout(0.2),
                                torch.nn.Linear(a.hidden, 1)).to(a.device)
    adam = torch.optim.Adam(model.parameters(), lr=0.01)
    sched = None if a.stateful else torch.optim.lr_scheduler.StepLR(adam, step_size=5, gamma=0.9)

    rt = graft.Runtime()
    ema, position = Ema(32768), Position()
    opt = graft.torch.Optimizer(
        rt, adam,
        objects=((lambda: {"rng": graft.rng_state()}) if a.stateful else
                 (lambda: {"rng": graft.rng_state(), "sched": sched.state_dict()})),
        load_objects=((lambda o: graft.set_rng_state(o["rng"])) if a.stateful else
                      (lambda o: (graft.set_rng_state(o["rng"]),
                                  sched.load_state_dict(o["sched"])))),
        object_bytes=a.object_bytes,
        modules=model if a.batchnorm else None,
        exclude_buffers=[n for n in a.exclude_buffers.split(",") if n],
        stateful={"ema": ema, "position": position} if a.stateful else None,
        **({} if a.max_failed_heals is None else {"max_failed_heals": a.max_failed_heals}))
    if a.stateful:
        # The wrapper is a torch.optim.Optimizer: the scheduler takes it.
        sched = torch.optim.lr_scheduler.StepLR(opt, step_size=5, gamma=0.9)
        opt.register_stateful("sched", sched)
    avg = (graft.torch.GradientAverager(rt, timeout_s=5, backend=a.backend,
                                        strict_layout=not a.no_strict_layout,
                                        restart_on_failure=a.break_average_at >= 0)
           if a.average else None)
    net = graft.torch.DistributedDataParallel(rt, model, averager=avg) if a.ddp else model
    skipped = 0
    losses = []  # (step, loss) of every applied step

    def forward(step, replica_rank):
        seed = 1000 + step
        if avg is not None:
            seed = seed * 16 + replica_rank  # this group's shard of the step's data
        g = torch.Generator().manual_seed(seed)
        x = torch.randn(32, 8, generator=g) + torch.from_numpy(
            np.random.randn(32, 8).astype(np.float32)) * 0.01
        x = x.to(a.device)
        y = x.sum(dim=1, keepdim=True)
        return torch.nn.functional.mse_loss(net(x), y) * (1.0 + 0.01 * random.random())

    forwards_again = 0
    averages = []  # (step, world, participating, participants) of every average
    promoted_said = False
    if rt.spare:
        print("spare waiting", flush=True)
    while a.finish or rt.step < a.steps:
        try:
            if a.async_quorum:
                loss = forward(*opt.start_quorum())
                again = opt.wait_quorum()
                info = opt.info
            else:
                info, again = opt.zero_grad(), True
        except graft.SpareUnused:
            print("spare unused: the job finished without it", flush=True)
            out = {"spare_unused": True, "group": rt.group, "finished": rt.finished,
                   "events": [e.kind for e in rt.events()]}
            rt.close()
            with open(a.out, "wb") as f:
                pickle.dump(out, f)
            return 0
        if rt.promoted and not promoted_said:
            print("spare promoted to group %d" % rt.group, flush=True)
            promoted_said = True
        if info.step >= a.steps:
            if not a.finish or opt.finish():
                break
            continue
        if again:
            forwards_again += int(a.async_quorum)
            loss = forward(info.step, info.replica_rank)
        loss.backward()
        if avg is not None:
            if info.step == a.stall_average_at and info.replica_rank == 1:
                import time

                time.sleep(7)
                a.stall_average_at = -1
            if info.step == a.late_average_at:
                import time

                time.sleep(1.0)
                a.late_average_at = -1
            timeout = avg.timeout
            if info.step == a.break_average_at:
                import datetime

                avg.timeout = datetime.timedelta(milliseconds=50)
                a.break_average_at = -1
            if not a.ddp:
                avg.average(model.parameters())
            avg.timeout = timeout
            print("average step %d world %d participating %d participants %d"
                  % (info.step, info.replica_world, int(avg.participating),
                     avg.participants), flush=True)
            averages.append((info.step, info.replica_world, int(avg.participating),
                             avg.participants))
        if opt.step():
            losses.append((rt.step - 1, float(loss.item())))
            sched.step()
            ema.update(float(loss.item()))
            position.index += 32
            if rt.step == a.corrupt_at:
                with torch.no_grad():
                    next(model.parameters()).view(-1)[0] += 1.0
            if rt.step == a.checkpoint_at:
                rt.checkpoint_now()
        else:
            skipped += 1
        print("step %d applied %d" % (rt.step, int(opt.applied)), flush=True)
        if a.delay:
            import time

            time.sleep(a.delay)
    rt.checkpoint_wait()
    out = {
        "step": rt.step,
        "start": rt.start_kind,
        "skipped": skipped,
        "metrics": rt.metrics(),
        "params": [p.detach().cpu().numpy().copy() for p in model.parameters()],
        "optim": [(n, t.cpu().numpy().copy()) for n, t in graft.torch._state_tensors(adam)],
        "torch_rng": torch.get_rng_state().numpy().copy(),
        "cuda_rng": (torch.cuda.get_rng_state().numpy().copy() if a.device == "cuda" else None),
        "numpy_rng": np.random.get_state()[1].copy(),
        "random_rng": random.getstate(),
        "sched": sched.state_dict(),
        "lr": [gr["lr"] for gr in adam.param_groups],
        "avg": (avg.rebuilds, avg.failures) if avg is not None else None,
        "losses": losses,
        "forwards_again": forwards_again,
        "buffers": [(n, b.detach().cpu().numpy().copy()) for n, b in model.named_buffers()],
        "ema": (ema.t.numpy().copy(), ema.count),
        "position": position.index,
        "regions": [r[0] for r in rt.region_table],
        "group": rt.group,
        "spare": rt.spare,
        "averages": averages,
        "events": [e.kind for e in rt.events()],
        "restarts": rt.restarts,
        "pid": os.getpid(),
    }
    rt.close()
    with open(a.out, "wb") as f:
        pickle.dump(out, f)
    return 0


if __name__ == "__main__":
    sys.exit(main())
