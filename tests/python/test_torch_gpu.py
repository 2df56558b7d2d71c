"""graft.torch on a GPU: the model and its optimizer state are CUDA tensors
registered zero-copy (their heals go through the transfer engine's
pinned-host staging), gradients are averaged over NCCL, and the CUDA RNG
travels with the other RNG states. Skipped where torch has no CUDA or NCCL,
or no GPU is visible (Debian's torch is CPU-only: these run on a lent GPU
machine, docs/PERFORMANCE.md "On a GPU").

Two groups share one GPU here: NCCL refuses two ranks of a communicator on
one GPU of one host, so each worker gets its own NCCL_HOSTID and the pair
talks over loopback sockets, as two hosts would."""
import pytest

from test_torch import _assert_identical, _load

torch = pytest.importorskip("torch")
import torch.distributed as dist  # noqa: E402

pytestmark = pytest.mark.skipif(
    not (torch.cuda.is_available() and dist.is_nccl_available()),
    reason="needs a CUDA build of torch with NCCL and a visible GPU")


def _nccl_env(group):
    return {"NCCL_HOSTID": "graft-test-%d" % group, "NCCL_SOCKET_IFNAME": "lo",
            "NCCL_IB_DISABLE": "1"}


def test_cuda_state_heals_identical(spawn, tmp_path):
    """Model and Adam state on the GPU; a group killed mid-run is replaced
    and heals its CUDA regions from the other group; both end identical,
    CUDA RNG included (the model's dropout draws from it)."""
    steps = 16
    ws = [spawn(g, 2, tmp_path / ("g%d" % g), "--steps", steps, "--device", "cuda",
                "--delay", 0.05) for g in range(2)]
    ws[1].wait_step(5)
    ws[1].kill()
    repl = spawn(1, 2, tmp_path / "g1", "--steps", steps, "--device", "cuda", "--delay", 0.05)
    for w in [ws[0], repl]:
        w.finish()
    outs = [_load(tmp_path / ("g%d" % g)) for g in range(2)]
    _assert_identical(outs)
    assert outs[1]["start"] == "peer"
    assert outs[1]["cuda_rng"] is not None


def test_nccl_averaging_survives_a_kill(spawn, tmp_path):
    """Each group trains on its own data on the GPU and averages gradients
    over NCCL; a group killed mid-run makes the other's collective fail or
    its quorum change: the process group is rebuilt over the new quorum's
    rendezvous and both groups end identical."""
    steps = 16
    ws = [spawn(g, 2, tmp_path / ("g%d" % g), "--steps", steps, "--device", "cuda",
                "--average", "--backend", "nccl", "--delay", 0.05, env=_nccl_env(g))
          for g in range(2)]
    ws[1].wait_step(5)
    ws[1].kill()
    repl = spawn(1, 2, tmp_path / "g1", "--steps", steps, "--device", "cuda", "--average",
                 "--backend", "nccl", "--delay", 0.05, env=_nccl_env(1))
    for w in [ws[0], repl]:
        w.finish()
    outs = [_load(tmp_path / ("g%d" % g)) for g in range(2)]
    _assert_identical(outs)
    assert outs[1]["start"] == "peer"
    rebuilds, failures = outs[0]["avg"]
    assert rebuilds >= 2  # the first quorum's group, then the one after the kill
