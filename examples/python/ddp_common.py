"""What train_ddp.py and train_ddp_plain.py share: the model, the data, the
deterministic gradient, the state hash, and the flags and output of the
simulator's trainer contract (docs/SIM.md, "The trainer contract").

Determinism: one intra-op thread, deterministic algorithms, and a gradient
that does not depend on how many groups compute it. Each step's global batch
is MICRO micro-batches; the group of replica rank r of W computes
micro-batches r, r + W, ...; the groups exchange them exactly (all_gather)
and every group sums the MICRO gradients in micro-batch order. So G groups,
any failure, and one process alone (the --no-graft reference) all apply the
same bits.
"""
import argparse
import hashlib
import os
import sys
import time

import torch

MICRO = 6        # micro-batches per step
MICRO_BATCH = 8  # samples per micro-batch


def parse(argv=None):
    ap = argparse.ArgumentParser(description="a small CNN trained data-parallel by groups")
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--state-hash-out")
    ap.add_argument("--hash-log")
    ap.add_argument("--role-log")
    ap.add_argument("--blob-mib", type=int, default=0)
    ap.add_argument("--step-delay-ms", type=int, default=0)
    ap.add_argument("--no-graft", action="store_true",
                    help="train alone, all micro-batches, no runtime: the fault-free reference")
    try:
        return ap.parse_args(argv)
    except SystemExit as e:
        sys.exit(0 if e.code == 0 else 2)


class Net(torch.nn.Module):
    """A small CNN on 1 x 12 x 12 images, 4 classes."""

    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv2d(1, 8, 3)
        self.fc = torch.nn.Linear(8 * 5 * 5, 4)

    def forward(self, x):
        x = torch.nn.functional.max_pool2d(torch.relu(self.conv(x)), 2)
        return self.fc(x.flatten(1))


def torch_world():
    """The ranks of a group are one torch world (torchrun's, or graft-sim
    --torch-world's): WORLD_SIZE above 1."""
    return int(os.environ.get("WORLD_SIZE", "1")) > 1


def setup(a):
    """Deterministic CPU torch; the model (rank r of a group seeds with seed +
    r, except in a torch world, whose ranks are replicas of one model),
    Adam, a step LR schedule, and the ballast of --blob-mib."""
    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
    torch.manual_seed(a.seed + (0 if torch_world() else int(os.environ.get("GRAFT_RANK", "0"))))
    model = Net()
    adam = torch.optim.Adam(model.parameters(), lr=0.01)
    sched = torch.optim.lr_scheduler.StepLR(adam, step_size=10, gamma=0.8)
    blob = torch.zeros(a.blob_mib << 20, dtype=torch.uint8) if a.blob_mib > 0 else None
    return model, adam, sched, blob


def micro_batch(seed, step, k):
    """Micro-batch k of a step: images of noise around a class pattern."""
    g = torch.Generator().manual_seed((seed * 1000003 + step) * 64 + k)
    y = torch.randint(0, 4, (MICRO_BATCH,), generator=g)
    x = torch.randn(MICRO_BATCH, 1, 12, 12, generator=g) * 0.5
    x[torch.arange(MICRO_BATCH), 0, y * 3, :] += 1.0
    return x, y


def micro_grads(model, seed, step, ks):
    """The flattened gradient of each micro-batch in ks, stacked."""
    rows = []
    scale = 1.0 + 0.01 * torch.rand(1).item()  # the global RNG is state too
    for k in ks:
        model.zero_grad(set_to_none=False)
        x, y = micro_batch(seed, step, k)
        (torch.nn.functional.cross_entropy(model(x), y) * scale).backward()
        rows.append(torch.cat([p.grad.reshape(-1) for p in model.parameters()]))
    return torch.stack(rows) if rows else None


def my_micro(rank, world):
    return list(range(rank, MICRO, world))


def apply_sum(model, gathered, world):
    """Sum the micro-batch gradients in micro-batch order into .grad."""
    rows = {}
    for r, t in enumerate(gathered):
        for i, k in enumerate(my_micro(r, world)):
            rows[k] = t[i]
    total = rows[0].clone()
    for k in range(1, MICRO):
        total += rows[k]
    total /= MICRO
    off = 0
    for p in model.parameters():
        n = p.numel()
        p.grad.copy_(total[off:off + n].view_as(p))
        off += n


def padded(rows, world, model):
    """Every worker sends the same shape: ceil(MICRO / world) rows (none of
    its own when there are more workers than micro-batches)."""
    n = -(-MICRO // world)
    out = torch.zeros(n, sum(p.numel() for p in model.parameters()))
    if rows is not None:
        out[:rows.shape[0]] = rows
    return out


def touch_blob(blob, step):
    if blob is not None:
        i = (step * 4099) % blob.numel()
        blob[i] ^= step & 0xFF


def state_hash(model, adam, sched, blob, step):
    """16 hex digits over every piece of the training state."""
    h = hashlib.blake2b(digest_size=8)
    for p in model.parameters():
        h.update(p.detach().numpy().tobytes())
    for p in model.parameters():
        for key in sorted(adam.state[p]):
            h.update(adam.state[p][key].numpy().tobytes())
    h.update(torch.get_rng_state().numpy().tobytes())
    h.update(repr(sorted(sched.state_dict().items())).encode())
    h.update(repr([g["lr"] for g in adam.param_groups]).encode())
    h.update(step.to_bytes(8, "little"))
    if blob is not None:
        h.update(blob.numpy().tobytes())
    return h.hexdigest()


class Contract:
    """The trainer contract's files: --hash-log, --role-log, --state-hash-out.
    In their names each "{group}" stands for this process's group (the
    runtime's, rt below): graft-sim names a spare's files so, since the slot
    a spare takes is known only once its first quorum returned; until then
    a spare writes nothing there, as train_mlp."""

    def __init__(self, a):
        self.a = a
        self.rt = None  # the graft.Runtime whose group fills "{group}"

    def path(self, name):
        """name with "{group}" replaced; None while the group is unknown."""
        if not name or "{group}" not in name:
            return name
        group = self.rt.group if self.rt is not None else None
        return None if group is None else name.replace("{group}", str(group))

    def _append(self, name, line):
        path = self.path(name)
        if path:
            with open(path, "a") as f:
                f.write(line + "\n")

    def committed(self, step, digest):
        self._append(self.a.hash_log, "%d %s" % (step, digest))

    def role(self, line):
        self._append(self.a.role_log, line)

    def delay(self):
        if self.a.step_delay_ms:
            time.sleep(self.a.step_delay_ms / 1000.0)

    def finish(self, step, digest, rt=None, start="cold"):
        """The final lines and --state-hash-out; with a graft runtime, after
        its last checkpoint is durable, and with its metrics."""
        metrics, recoveries = None, 0
        if rt is not None:
            rt.checkpoint_wait()
            metrics, start = rt.metrics(), rt.start_kind
            recoveries = metrics["recoveries"]
            rt.close()
        print("final step %d hash %s start %s recoveries %d" % (step, digest, start, recoveries),
              flush=True)
        if metrics is not None:
            print("metrics " + " ".join("%s %d" % (k, metrics[k]) for k in (
                "commits", "commits_failed", "drift_checks", "drift_mismatches", "restores",
                "recovery_failures", "serves", "checkpoints_written",
                "checkpoints_committed")), flush=True)
        if self.a.state_hash_out:
            path = self.path(self.a.state_hash_out)
            if path is None:
                sys.stderr.write("--state-hash-out %s: no group to put in its name\n"
                                 % self.a.state_hash_out)
                return 1
            with open(path, "w") as f:
                f.write(digest + "\n")
        return 0


def run_alone(a):
    """--no-graft: one process computes every micro-batch."""
    model, adam, sched, blob = setup(a)
    c = Contract(a)
    for step in range(a.steps):
        model.zero_grad(set_to_none=False)
        rows = micro_grads(model, a.seed, step, my_micro(0, 1))
        apply_sum(model, [rows], 1)
        adam.step()
        sched.step()
        touch_blob(blob, step + 1)
        c.committed(step + 1, state_hash(model, adam, sched, blob, step + 1))
    return c.finish(a.steps, state_hash(model, adam, sched, blob, a.steps), start="alone")
