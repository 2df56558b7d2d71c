"""One group of a job trained by graft.torch.LocalSGD or DiLoCo: a small
model, plain SGD inside the rounds, each group its own data (fixed by the
round, the inner step and the group's replica rank). At the end it writes
its state (a pickle) to --out. With GRAFT_SPARE=1 (no GRAFT_GROUP) it is a
spare: its first begin() waits for a dead rank's slot, and it prints
"spare promoted to group G" once it took one."""
import argparse
import os
import pickle
import sys
import time

import torch

import graft
import graft.torch


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--algo", choices=["localsgd", "diloco"], required=True)
    ap.add_argument("--rounds", type=int, default=10)
    ap.add_argument("--sync-every", type=int, default=3)
    ap.add_argument("--delay", type=float, default=0.0, help="seconds to sleep after a round")
    a = ap.parse_args()

    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
    spare = os.environ.get("GRAFT_SPARE") == "1"
    group = 50 if spare else int(os.environ["GRAFT_GROUP"])
    torch.manual_seed(5 + group)     # different weights: the cold start aligns them
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1))
    inner = torch.optim.SGD(model.parameters(), lr=0.05)
    rt = graft.Runtime()
    avg = graft.torch.GradientAverager(rt, timeout_s=5)
    if a.algo == "diloco":
        outer = torch.optim.SGD(model.parameters(), lr=0.7, momentum=0.9, nesterov=True)
        sync = graft.torch.DiLoCo(rt, model, outer, a.sync_every, averager=avg)
    else:
        outer = None
        sync = graft.torch.LocalSGD(rt, model, a.sync_every, averager=avg)
    losses = []
    while True:
        info = sync.begin()
        if spare:
            print("spare promoted to group %d" % rt.group, flush=True)
            spare = False
        if info.step >= a.rounds:
            break
        g = torch.Generator().manual_seed((info.step * 64 + sync.inner_step) * 16
                                          + info.replica_rank)
        x = torch.randn(16, 8, generator=g)
        y = torch.sin(x).sum(dim=1, keepdim=True)
        inner.zero_grad()
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()
        inner.step()
        applied = sync.end()
        if applied is not None:
            if applied:
                losses.append((info.step, float(loss.item())))
            print("step %d applied %d participants %d" % (rt.step, int(applied),
                                                          avg.participants), flush=True)
            if a.delay:
                time.sleep(a.delay)
    out = {
        "step": rt.step, "start": rt.start_kind, "metrics": rt.metrics(), "losses": losses,
        "group": rt.group,
        "global": [t.numpy().copy() for t in sync.glob],
        "params": [p.detach().numpy().copy() for p in model.parameters()],
        "outer": ([(n, t.numpy().copy()) for n, t in graft.torch._state_tensors(outer)]
                  if outer is not None else []),
    }
    rt.close()
    with open(a.out, "wb") as f:
        pickle.dump(out, f)
    return 0


if __name__ == "__main__":
    sys.exit(main())
