"""graft.torch's state API (issue 23): the optimizer wrapper is a
torch.optim.Optimizer, and any object with state_dict()/load_state_dict()
registered with it (a scheduler made on the wrapper, the user's own object
holding a large tensor, a data loader's position) is carried through a heal,
its large tensors as regions of their own."""
import pickle

import pytest

import graft
from conftest import ROOT  # noqa: F401  (sys.path and GRAFT_LIBRARY)

torch = pytest.importorskip("torch")
import graft.torch  # noqa: E402


def _load(path):
    with open(path, "rb") as f:
        return pickle.load(f)


def _runtime(job_env, name):
    env = dict(job_env, GRAFT_JOB=job_env["GRAFT_JOB"] + name)
    return graft.Runtime(env=False, job=env["GRAFT_JOB"], group=0, groups=1,
                         etcd_endpoints=env["GRAFT_ETCD_ENDPOINTS"])


def test_wrapper_is_a_torch_optimizer(job_env):
    model = torch.nn.Linear(4, 2)
    with _runtime(job_env, "-api") as rt:
        opt = graft.torch.Optimizer(rt, torch.optim.SGD(model.parameters(), lr=0.1))
        assert isinstance(opt, torch.optim.Optimizer)
        assert opt.state is opt.optim.state and opt.defaults["lr"] == 0.1
        sched = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5)
        opt.register_stateful("sched", sched)
        with pytest.raises(graft.UsageError, match="twice"):
            opt.register_stateful("sched", sched)
        with pytest.raises(graft.UsageError, match="no state_dict"):
            opt.register_stateful("bad", object())
        with pytest.raises(graft.UsageError, match="without dots"):
            opt.register_state_dict_fn("a.b", lambda sd: None, dict)
        with pytest.raises(graft.UsageError, match="before making"):
            opt.load_state_dict(opt.state_dict())
        model(torch.ones(1, 4)).sum().backward()
        opt.zero_grad()
        # The installed torch's default: 1.13 keeps the gradients as zeros,
        # 2.x drops them.
        default = graft.torch._SET_TO_NONE
        assert (model.weight.grad is None) == default
        model(torch.ones(1, 4)).sum().backward()
        assert opt.step()
        sched.step()
        assert opt.param_groups[0]["lr"] == 0.05
        with pytest.raises(graft.UsageError, match="after the first step"):
            opt.register_state_dict_fn("late", lambda sd: None, dict)
    assert graft.__version__ == graft.version()


def test_state_dicts_are_healed(spawn, tmp_path):
    """Two groups; group 1 killed at step 8 and restarted. The scheduler
    (made on the wrapper), the EMA's 128 KiB tensor (a region: sd.ema.t)
    and its count, and the data position come back identical."""
    args = ["--steps", 20, "--stateful", "--delay", 0.05]
    ws = [spawn(g, 2, tmp_path / ("g%d" % g), *args) for g in range(2)]
    ws[1].wait_step(8)
    ws[1].kill()
    repl = spawn(1, 2, tmp_path / "g1", *args)
    for w in [ws[0], repl]:
        w.finish()
    a, b = _load(tmp_path / "g0"), _load(tmp_path / "g1")
    assert b["start"] == "peer" and b["metrics"]["recoveries"] >= 1
    assert "sd.ema.t" in b["regions"]               # zero-copy, not pickled
    assert not any(r.startswith("sd.sched") for r in b["regions"])  # small: pickled
    assert a["step"] == b["step"] == 20
    assert a["sched"] == b["sched"] and a["sched"]["last_epoch"] == 20
    assert a["lr"] == b["lr"]
    assert a["ema"][1] == b["ema"][1] == 20
    assert a["ema"][0].tobytes() == b["ema"][0].tobytes()
    assert a["ema"][0].any()
    assert a["position"] == b["position"] == 20 * 32
    for x, y in zip(a["params"], b["params"]):
        assert x.tobytes() == y.tobytes()


@pytest.mark.parametrize("make", [
    lambda ps: torch.optim.RMSprop(ps, lr=0.01, momentum=0.9, centered=True),
    lambda ps: torch.optim.Adagrad(ps, lr=0.1),
    lambda ps: torch.optim.RAdam(ps, lr=0.01),
], ids=["RMSprop", "Adagrad", "RAdam"])
def test_any_optimizer_with_lazy_state(job_env, make):
    """An optimizer graft knows nothing of: its lazy state is made by a step
    with zero gradients (checked on stand-ins first), registered, and the
    wrapped run stays bit-identical to the plain one."""
    torch.manual_seed(3)
    m, plain_m = torch.nn.Linear(6, 3), torch.nn.Linear(6, 3)
    plain_m.load_state_dict(m.state_dict())
    plain = make(plain_m.parameters())
    with _runtime(job_env, "-lazy") as rt:
        opt = graft.torch.Optimizer(rt, make(m.parameters()))
        assert any(r[0].startswith("optim.") for r in rt.region_table)
        for i in range(6):
            x = torch.randn(4, 6, generator=torch.Generator().manual_seed(i))
            opt.zero_grad()
            m(x).pow(2).sum().backward()
            assert opt.step()
            plain.zero_grad()
            plain_m(x).pow(2).sum().backward()
            plain.step()
    for a, b in zip(m.parameters(), plain_m.parameters()):
        assert torch.equal(a, b)


def test_optimizer_whose_lazy_state_cannot_be_made_is_refused(job_env):
    m = torch.nn.Linear(6, 3)
    with _runtime(job_env, "-nadam") as rt:
        with pytest.raises(graft.UsageError, match="NAdam creates its state lazily.*take one step"):
            graft.torch.Optimizer(rt, torch.optim.NAdam(m.parameters()))


def test_finish_writes_the_final_checkpoint(job_env, tmp_path):
    """A clean end through Optimizer.finish(): with persist_every far past
    the run, the only checkpoint is the final step's, and it holds the
    final parameters (a second runtime restores them)."""
    root = tmp_path / "ckpt"
    m = torch.nn.Linear(4, 2)

    def runtime():
        return graft.Runtime(env=False, job=job_env["GRAFT_JOB"] + "-fin", group=0, groups=1,
                             etcd_endpoints=job_env["GRAFT_ETCD_ENDPOINTS"],
                             persist_root=str(root), persist_every=1000)

    with runtime() as rt:
        opt = graft.torch.Optimizer(rt, torch.optim.SGD(m.parameters(), lr=0.1))
        while True:
            info = opt.zero_grad()
            if info.step >= 5:
                assert opt.finish()  # the group committed its closing step
                assert rt.finished
                break
            m(torch.ones(1, 4)).sum().backward()
            assert opt.step()
        assert rt.step == 5
    final = [p.detach().clone() for p in m.parameters()]
    steps = sorted(d.name for d in root.iterdir() if d.name.startswith("step-"))
    assert steps == ["step-%020d" % 5]
    m2 = torch.nn.Linear(4, 2)
    with runtime() as rt:
        graft.torch.Optimizer(rt, torch.optim.SGD(m2.parameters(), lr=0.1))
        rt.quorum()
        assert rt.start_kind == "restore" and rt.step == 5
    for a, b in zip(final, m2.parameters()):
        assert torch.equal(a, b)


def test_optimizer_with_partial_lazy_state_is_refused(job_env):
    """RMSprop that stepped with only one of its parameters' gradients:
    a zero-gradient step would move the state that exists, so it is refused."""
    m = torch.nn.Linear(6, 3)
    opt = torch.optim.RMSprop(m.parameters(), lr=0.01)
    m.weight.grad = torch.ones_like(m.weight)
    opt.step()
    with _runtime(job_env, "-partial") as rt:
        with pytest.raises(graft.UsageError, match="some parameters and not for others"):
            graft.torch.Optimizer(rt, opt)


def test_wrong_uses_are_refused_with_the_reason(job_env):
    """finish() outside a step, a LocalSGD round of no steps, a DiLoCo outer
    optimizer over other parameters, a DDP wrapper that would re-bucket."""
    m, other = torch.nn.Linear(4, 2), torch.nn.Linear(4, 2)
    with _runtime(job_env, "-wrong") as rt:
        opt = graft.torch.Optimizer(rt, torch.optim.SGD(m.parameters(), lr=0.1))
        with pytest.raises(graft.UsageError, match="outside a step"):
            opt.finish()
        with pytest.raises(graft.UsageError, match="sync_every must be at least 1"):
            graft.torch.LocalSGD(rt, m, 0)
        with pytest.raises(graft.UsageError, match="over the model's parameters"):
            graft.torch.DiLoCo(rt, m, torch.optim.SGD(other.parameters(), lr=0.7), 3)
        for kw in ({"static_graph": True}, {"find_unused_parameters": False}):
            with pytest.raises(graft.UsageError, match="re-buckets"):
                graft.torch.DistributedDataParallel(rt, m, **kw)
