"""graft.Runtime over numpy arrays, and the error hierarchy, against a real
etcd and UCX (two groups as threads of this process: each C call releases
the GIL)."""
import os
import threading

import numpy as np
import pytest

import graft


def test_library_missing_is_a_clear_error(tmp_path):
    import subprocess
    import sys

    env = dict(os.environ, GRAFT_LIBRARY=str(tmp_path / "nope.so"),
               PYTHONPATH=os.path.join(os.path.dirname(__file__), "..", "..", "python"))
    r = subprocess.run([sys.executable, "-c", "import graft"], env=env,
                       capture_output=True, text=True)
    assert r.returncode != 0
    assert "cannot load libgraft.so" in r.stderr and "GRAFT_LIBRARY" in r.stderr


def test_config_errors_carry_name_class_and_message(job_env):
    with pytest.raises(graft.UsageError) as e:
        graft.Runtime(env=False, job="j", groups=2)  # no group
    assert e.value.name == "GRAFT_EINVAL" and e.value.cls == "usage"
    assert "group" in e.value.message
    with pytest.raises(graft.UsageError) as e:
        graft.Runtime(env=False, job="j", group=0, groups=2, mode="bogus")
    assert "bogus" in str(e.value)
    with pytest.raises(graft.Error) as e:
        graft.Runtime(env=False, job="j", group=0, groups=2, no_such_setting=1)
    assert e.value.name == "GRAFT_ENOTFOUND"


def test_environment_and_keywords(job_env, monkeypatch):
    for k, v in job_env.items():
        monkeypatch.setenv(k, v)
    monkeypatch.setenv("GRAFT_GROUPS", "1")
    monkeypatch.setenv("GRAFT_GROUP", "7")
    monkeypatch.setenv("GRAFT_MODE", "nonsense")
    with pytest.raises(graft.UsageError) as e:
        graft.Runtime()
    assert "GRAFT_MODE" in e.value.message or "mode" in e.value.message
    # Keywords win over the environment.
    monkeypatch.setenv("GRAFT_MODE", "strict")
    with graft.Runtime(group=0) as rt:
        assert rt.step == 0 and rt.start_kind == "undecided"


def test_job_secret_file_owner_only(job_env, tmp_path, monkeypatch):
    """The job secret from a file (docs/SECURITY.md): refused while group or
    others may read it, used at 0600; job_token is no setting any more."""
    monkeypatch.delenv("GRAFT_JOB_SECRET", raising=False)
    path = tmp_path / "secret"
    path.write_text("a-job-secret-of-more-than-16-bytes\n")
    settings = dict(env=False, job=job_env["GRAFT_JOB"], group=0, groups=1,
                    etcd_endpoints=job_env["GRAFT_ETCD_ENDPOINTS"], job_secret_file=str(path))
    path.chmod(0o644)
    with pytest.raises(graft.UsageError) as e:
        graft.Runtime(**settings)
    assert e.value.name == "GRAFT_EINVAL"
    path.chmod(0o600)
    with graft.Runtime(**settings) as rt:
        rt.register("w", np.zeros(16), "param")
        rt.quorum()
        assert rt.commit()
        assert rt.metrics()["steady_rejected"] == 0
    with pytest.raises(graft.Error) as e:
        graft.Runtime(env=False, job="j", group=0, groups=1, job_token="public")
    assert e.value.name == "GRAFT_ENOTFOUND"


def test_register_rejects_bad_memory(job_env):
    with graft.Runtime(env=False, job=job_env["GRAFT_JOB"], group=0, groups=1,
                       etcd_endpoints=job_env["GRAFT_ETCD_ENDPOINTS"]) as rt:
        a = np.zeros((4, 4), dtype=np.float32)
        with pytest.raises(graft.UsageError, match="contiguous"):
            rt.register("t", a.T, "param")
        ro = np.zeros(4)
        ro.setflags(write=False)
        with pytest.raises(graft.UsageError, match="read-only"):
            rt.register("ro", ro, "param")
        with pytest.raises(graft.UsageError, match="numpy array or a CPU or CUDA torch tensor"):
            rt.register("l", [1, 2, 3], "param")
        torch = pytest.importorskip("torch")
        with pytest.raises(graft.UsageError, match="only CPU and CUDA tensors"):
            rt.register("m", torch.zeros(4, device="meta"), "param")
        with pytest.raises(graft.UsageError, match="region name"):
            rt.register(7, a, "param")
        with pytest.raises(graft.UsageError, match="kind"):
            rt.register("k", a, "weights")
        rt.register("a", a, "param")
        with pytest.raises(graft.UsageError) as e:
            rt.register("a", a, "param")
        assert e.value.name == "GRAFT_EEXIST"
        with pytest.raises(graft.UsageError) as e:
            rt.commit()
        assert e.value.name == "GRAFT_ESTATE"
    with pytest.raises(graft.UsageError, match="closed"):
        rt.quorum()


def _group(env, group, groups, arr, steps, results, delta):
    with graft.Runtime(env=False, job=env["GRAFT_JOB"], group=group, groups=groups,
                       etcd_endpoints=env["GRAFT_ETCD_ENDPOINTS"], lease_ttl_ms=2000,
                       join_timeout_ms=1000) as rt:
        rt.register("w", arr, "param")
        events = []
        rt.on_event(events.append)
        for _ in range(steps):
            info = rt.quorum()
            if info.healing:
                rt.heal_wait()
            if rt.commit():
                arr += delta
        rt.checkpoint_wait()
        results[group] = (rt.step, rt.start_kind, rt.metrics(), list(rt.events()), events)


def test_numpy_regions_sync_zero_copy(job_env):
    """Two groups start from different arrays; the cold start makes them
    identical in place (the registered arrays themselves), and every step
    keeps them so."""
    arrays = [np.full(1 << 16, g + 1, dtype=np.float64) for g in range(2)]
    results = {}
    ts = [threading.Thread(target=_group, args=(job_env, g, 2, arrays[g], 5, results, 0.5))
          for g in range(2)]
    for t in ts:
        t.start()
    for t in ts:
        t.join(120)
    assert not any(t.is_alive() for t in ts)
    assert set(results) == {0, 1}
    assert np.array_equal(arrays[0], arrays[1])
    assert arrays[0][0] == 1 + 5 * 0.5  # group 0's start, five applied steps
    for g in range(2):
        step, start, metrics, queued, called = results[g]
        assert step == 5 and start == "cold"
        assert metrics["commits"] == 5 and metrics["quorums"] == 5
        assert queued == called  # the iterator and the callback saw the same events
        assert all(isinstance(e, graft.Event) for e in queued)


def test_object_state_bound(job_env):
    with graft.Runtime(env=False, job=job_env["GRAFT_JOB"], group=0, groups=1,
                       etcd_endpoints=job_env["GRAFT_ETCD_ENDPOINTS"]) as rt:
        st = graft.ObjectState(rt, "objs", capacity=256)
        assert st.unpack() is None
        st.pack({"epoch": 3, "pos": 17, "rng": graft.rng_state()["numpy"][1][:4]})
        back = st.unpack()
        assert back["epoch"] == 3 and back["pos"] == 17
        with pytest.raises(graft.StateTooLarge, match="bound is 256"):
            st.pack({"big": "x" * 1000})
        assert st.unpack()["pos"] == 17  # left as it was
        st.pack("y" * 200)
        st.pack(1)  # shorter: what the longer one used is zeroed again
        n = int.from_bytes(bytes(st.buffer[:8]), "little")
        assert st.unpack() == 1 and not st.buffer[8 + n:].any()
