"""HSDP on a GPU (issue 23): 2 groups x 2 ranks, each group a torchrun world
running hsdp_worker.py, FSDP (FULL_SHARD over NCCL) inside the group and
graft's GradientAverager (NCCL) across groups, rank r with rank r. Group 1
is killed whole mid-run and a new torchrun replaces it: its rank r heals
rank r's shard (FSDP's flat parameter and its part of Adam's state) from
group 0, and every rank of both groups ends bit-identical to the same rank
of a fault-free run.

Skipped unless torch has CUDA with NCCL, a GPU is visible and
torch.distributed.fsdp imports (Debian's torch 1.13 is CPU-only, and its
fsdp fails to import on Python 3.11): it runs on a lent GPU machine. All
four ranks share the one GPU, each with an NCCL host id of its own."""
import os

import pytest

torch = pytest.importorskip("torch")
import torch.distributed as dist  # noqa: E402

if not (torch.cuda.is_available() and dist.is_available() and dist.is_nccl_available()):
    pytest.skip("needs a CUDA build of torch with NCCL and a visible GPU",
                allow_module_level=True)
try:
    import torch.distributed.fsdp  # noqa: E402,F401
except Exception as e:  # Debian's torch 1.13: a dataclass ValueError
    pytest.skip("torch.distributed.fsdp does not import: %s" % e, allow_module_level=True)

from test_torchrun import _assert_same, _states, torchrun  # noqa: E402,F401

WORKER = os.path.join(os.path.dirname(__file__), "hsdp_worker.py")
STEPS = 16


def test_hsdp_group_killed_and_replaced(torchrun, tmp_path):  # noqa: F811
    ref_out, out = tmp_path / "ref", tmp_path / "run"
    ref_env = {"GRAFT_JOB": "hsdp-ref-" + os.urandom(4).hex()}
    refs = [torchrun(g, ref_out, env=ref_env, groups=2, steps=STEPS, delay=0, trainer=WORKER)
            for g in range(2)]
    for t in refs:
        t.finish(timeout=90)
    groups = [torchrun(g, out, groups=2, steps=STEPS, delay=0.2, trainer=WORKER)
              for g in range(2)]
    groups[1].wait_step(4)
    groups[1].kill()
    repl = torchrun(1, out, groups=2, steps=STEPS, delay=0.2, trainer=WORKER)
    for t in [groups[0], repl]:
        t.finish(timeout=120)
    states, ref = _states(out, groups=2), _states(ref_out, groups=2)
    for r in range(2):
        assert states[1, r]["start"] == "peer", repl.text()
        assert states[1, r]["metrics"]["recoveries"] >= 1
    # Sharded: the two ranks of a group hold different parts.
    assert states[0, 0]["params"][0].tobytes() != states[0, 1]["params"][0].tobytes()
    for (g, r), st in states.items():
        _assert_same(st, ref[g, r], "group %d rank %d" % (g, r), steps=STEPS)
        assert st["cuda_rng"].tobytes() == ref[g, r]["cuda_rng"].tobytes()
    print("".join(x for x in repl.lines if x and ("start" in x or "done" in x)))
