"""graft.torch with groups as real processes (tests/python/torch_worker.py):
a killed group heals, a drifting group's step is skipped, and a job whose
every group was killed restores from a persistent checkpoint. Every group
must end with identical parameters, optimizer state and RNG states."""
import pickle

import numpy as np

import graft  # noqa: F401  (GRAFT_LIBRARY and sys.path come from conftest)


def _load(path):
    with open(path, "rb") as f:
        return pickle.load(f)


def _assert_identical(outs):
    ref = outs[0]
    for o in outs[1:]:
        assert o["step"] == ref["step"]
        for a, b in zip(o["params"], ref["params"]):
            assert a.tobytes() == b.tobytes()
        assert [n for n, _ in o["optim"]] == [n for n, _ in ref["optim"]]
        for (_, a), (_, b) in zip(o["optim"], ref["optim"]):
            assert a.tobytes() == b.tobytes()
        assert np.array_equal(o["torch_rng"], ref["torch_rng"])
        if ref.get("cuda_rng") is not None:
            assert np.array_equal(o["cuda_rng"], ref["cuda_rng"])
        assert np.array_equal(o["numpy_rng"], ref["numpy_rng"])
        assert o["random_rng"] == ref["random_rng"]
        assert o["sched"] == ref["sched"] and o["lr"] == ref["lr"]


def test_killed_group_heals_identical(spawn, tmp_path):
    steps = 30
    ws = [spawn(g, 3, tmp_path / ("g%d" % g), "--steps", steps, "--delay", 0.05)
          for g in range(3)]
    ws[1].wait_step(8)
    ws[1].kill()
    repl = spawn(1, 3, tmp_path / "g1", "--steps", steps, "--delay", 0.05)
    for w in [ws[0], ws[2], repl]:
        w.finish()
    outs = [_load(tmp_path / ("g%d" % g)) for g in range(3)]
    assert all(o["step"] == steps for o in outs)
    assert outs[1]["start"] == "peer" and outs[1]["metrics"]["recoveries"] >= 1
    assert outs[0]["metrics"]["serves"] + outs[2]["metrics"]["serves"] >= 1
    _assert_identical(outs)
    # The Adam state was materialized and registered before the first step.
    assert any(n.endswith("exp_avg_sq") for n, _ in outs[0]["optim"])


def test_matches_a_fault_free_run(spawn, job_env, tmp_path):
    """Strict mode: the run with a heal ends bit-identical to one without."""
    steps = 12
    other = {"GRAFT_JOB": job_env["GRAFT_JOB"] + "-ref"}
    ref = [spawn(g, 2, tmp_path / ("r%d" % g), "--steps", steps, env=other) for g in range(2)]
    for w in ref:
        w.finish()
    ws = [spawn(g, 2, tmp_path / ("g%d" % g), "--steps", steps, "--delay", 0.05)
          for g in range(2)]
    ws[0].wait_step(4)
    ws[0].kill()
    repl = spawn(0, 2, tmp_path / "g0", "--steps", steps, "--delay", 0.05)
    repl.finish()
    ws[1].finish()
    outs = [_load(tmp_path / n) for n in ("r0", "r1", "g0", "g1")]
    assert outs[2]["start"] == "peer"
    _assert_identical(outs)


def test_failed_commit_skips_the_step(spawn, tmp_path):
    """Group 2 flips a weight after step 5; the drift check at the next
    commit makes its vote no: the wrapper skips the optimizer step, the group
    heals at the next quorum, and all groups end identical."""
    steps = 12
    env = {"GRAFT_DRIFT_CHECK_EVERY": "1"}
    ws = [spawn(g, 3, tmp_path / ("g%d" % g), "--steps", steps,
                *(["--corrupt-at", 5] if g == 2 else []), env=env) for g in range(3)]
    for w in ws:
        w.finish()
    outs = [_load(tmp_path / ("g%d" % g)) for g in range(3)]
    assert outs[2]["skipped"] >= 1 and outs[2]["metrics"]["commits_failed"] >= 1
    assert outs[2]["metrics"]["recoveries"] >= 1
    assert outs[0]["skipped"] == 0 and outs[1]["skipped"] == 0
    assert any("applied 0" in line for line in ws[2].lines)
    _assert_identical(outs)


def test_restore_after_every_group_killed(spawn, job_env, tmp_path):
    steps = 16
    env = {"GRAFT_PERSIST_ROOT": str(tmp_path / "ckpt"), "GRAFT_PERSIST_EVERY": "4"}
    ws = [spawn(g, 2, tmp_path / ("a%d" % g), "--steps", steps, "--delay", 0.1, env=env)
          for g in range(2)]
    ws[0].wait_step(10)
    for w in ws:
        w.kill()
    ws = [spawn(g, 2, tmp_path / ("g%d" % g), "--steps", steps, env=env) for g in range(2)]
    for w in ws:
        w.finish()
    outs = [_load(tmp_path / ("g%d" % g)) for g in range(2)]
    # A group restores the newest checkpoint; the other restores it too or
    # pulls it from that group: neither starts the job over.
    starts = sorted(o["start"] for o in outs)
    assert "restore" in starts and "cold" not in starts, starts
    assert sum(o["metrics"]["restores"] for o in outs) >= 1
    _assert_identical(outs)
    # The restored job ends where a fault-free run ends.
    other = {"GRAFT_JOB": job_env["GRAFT_JOB"] + "-ref"}
    ref = [spawn(g, 2, tmp_path / ("r%d" % g), "--steps", steps, env=other) for g in range(2)]
    for w in ref:
        w.finish()
    _assert_identical(outs + [_load(tmp_path / "r0")])


def test_gradient_averaging_survives_a_kill(spawn, tmp_path):
    """Each group computes gradients on its own data and averages them over
    gloo; a group killed mid-run makes the others' collective fail or their
    quorum change: they rebuild the process group and every group ends
    identical (without the averaging, different data would make them drift)."""
    steps = 20
    ws = [spawn(g, 3, tmp_path / ("g%d" % g), "--steps", steps, "--average", "--delay", 0.05)
          for g in range(3)]
    ws[2].wait_step(6)
    ws[2].kill()
    repl = spawn(2, 3, tmp_path / "g2", "--steps", steps, "--average", "--delay", 0.05)
    for w in [ws[0], ws[1], repl]:
        w.finish()
    outs = [_load(tmp_path / ("g%d" % g)) for g in range(3)]
    _assert_identical(outs)
    assert outs[2]["start"] == "peer"
    for o in outs[:2]:
        rebuilds, failures = o["avg"]
        assert rebuilds >= 2  # the first quorum's group, then the one after the kill


def _kill_one_of_two_against_a_plain_reference(spawn, job_env, tmp_path, *way):
    """Two groups averaging gradients the plain way (zero_grad(),
    GradientAverager.average()) without a fault, then two groups that train
    @way with group 1 killed at step 8 and replaced: both must end
    bit-identical to the plain run, with its losses. Returns the plain
    run's group 0, the run's outputs and its group-0 worker."""
    steps = 16
    ref_env = {"GRAFT_JOB": job_env["GRAFT_JOB"] + "-ref"}
    refs = [spawn(g, 2, tmp_path / ("ref%d" % g), "--steps", steps, "--average", env=ref_env)
            for g in range(2)]
    for w in refs:
        w.finish()
    args = ["--steps", steps, "--average", *way, "--delay", 0.05]
    ws = [spawn(g, 2, tmp_path / ("g%d" % g), *args) for g in range(2)]
    ws[1].wait_step(8)
    ws[1].kill()
    repl = spawn(1, 2, tmp_path / "g1", *args)
    for w in [ws[0], repl]:
        w.finish()
    outs = [_load(tmp_path / ("g%d" % g)) for g in range(2)]
    ref = _load(tmp_path / "ref0")
    _assert_identical([ref] + outs)
    assert outs[1]["start"] == "peer" and outs[1]["metrics"]["recoveries"] >= 1
    assert outs[0]["losses"] == ref["losses"]
    return ref, outs, ws[0]


def test_ddp_wrapper_heals_and_matches_the_averager(spawn, job_env, tmp_path):
    """graft.torch.DistributedDataParallel: the cross-group reduction runs in
    DDP's communication hook. Two groups, group 1 killed at step 8 and
    restarted: both end bit-identical to a fault-free run whose groups
    average with GradientAverager.average() (the same reduction, element
    for element), with the same losses."""
    _, _, w0 = _kill_one_of_two_against_a_plain_reference(spawn, job_env, tmp_path, "--ddp")
    assert "participants 2" in "".join(w0.lines + [""])


def test_async_quorum_heals_and_matches_the_plain_loop(spawn, job_env, tmp_path):
    """Optimizer.start_quorum()/wait_quorum(): the quorum runs on a thread
    beside the forward pass. Two groups averaging gradients, group 1 killed
    at step 8 and replaced: both end bit-identical to a fault-free run of
    the plain loop (zero_grad()), with the same losses, and the replacement
    ran its forward pass again at least once (its state was replaced while
    the first one ran)."""
    _, outs, _ = _kill_one_of_two_against_a_plain_reference(spawn, job_env, tmp_path,
                                                             "--async-quorum")
    assert outs[1]["forwards_again"] >= 1


def test_failed_collective_votes_no(spawn, tmp_path):
    """Replica rank 1 stalls past the collective's 5 s timeout at step 4:
    both groups' allreduce fails, each vetoes its commit (no hang, no step
    applied on a partial average), both rebuild the process group and
    retry the step, and the run ends identical."""
    steps = 8
    ws = [spawn(g, 2, tmp_path / ("g%d" % g), "--steps", steps, "--average",
                "--stall-average-at", 4) for g in range(2)]
    for w in ws:
        w.finish()
    outs = [_load(tmp_path / ("g%d" % g)) for g in range(2)]
    _assert_identical(outs)
    for o in outs:
        rebuilds, failures = o["avg"]
        assert failures == 1 and rebuilds == 2
        assert o["skipped"] == 1 and o["metrics"]["commits_failed"] == 1


def test_averager_backends():
    """gloo is the default; nccl is refused with a clear error where this
    torch cannot run it (a CPU build, no GPU); anything else is refused."""
    import pytest
    import torch
    import torch.distributed as dist

    import graft.torch as gt

    rt = object()  # the constructor only keeps it
    assert gt.GradientAverager(rt).backend == "gloo"
    with pytest.raises(graft.UsageError) as e:
        gt.GradientAverager(rt, backend="mpi")
    assert "gloo or nccl" in str(e.value)
    if torch.cuda.is_available() and dist.is_nccl_available():
        assert gt.GradientAverager(rt, backend="nccl").backend == "nccl"
    else:
        with pytest.raises(graft.UsageError) as e:
            gt.GradientAverager(rt, backend="nccl")
        assert "CUDA build of torch with NCCL" in str(e.value)


def test_failed_collective_restarts_in_place(spawn, job_env, tmp_path):
    """Group 1's gloo allreduce at step 5 fails for real (a 50 ms timeout
    while group 0 is held back 1 s): its averager restarts the rank in place
    (Runtime.restart(): the step abandoned, a new transfer endpoint and
    incarnation) instead of exiting, and rejoins; both groups end
    bit-identical to a fault-free run, group 1 the same process throughout
    (never replaced: it healed where the job had moved on)."""
    steps = 10
    ref_env = {"GRAFT_JOB": job_env["GRAFT_JOB"] + "-ref"}
    refs = [spawn(g, 2, tmp_path / ("ref%d" % g), "--steps", steps, "--average", env=ref_env)
            for g in range(2)]
    for w in refs:
        w.finish()
    ws = [spawn(0, 2, tmp_path / "g0", "--steps", steps, "--average", "--late-average-at", 5),
          spawn(1, 2, tmp_path / "g1", "--steps", steps, "--average", "--break-average-at", 5)]
    for w in ws:
        w.finish()
    outs = [_load(tmp_path / ("g%d" % g)) for g in range(2)]
    ref = _load(tmp_path / "ref0")
    _assert_identical([ref] + outs)
    assert outs[1]["restarts"] == 1 and outs[0]["restarts"] == 0
    assert "restarted" in outs[1]["events"]
    assert outs[1]["start"] == "cold"  # the same process: never replaced
    assert outs[1]["avg"][1] == 1  # its collective failed once
