"""`pip install` of an sdist built from the repository, into a fresh venv,
gives a package that carries its own libgraft.so and runs a 2-group job
with a kill and a heal, with nothing of the checkout in reach.

It is worth its cost (pip compiles libgraft.so from scratch with the
Makefile: about 15 s of the test's 20-35 s on the project's 2-core machine,
11 s of CPU) because it is the only test of what a Python user gets from
`pip install graft-<v>.tar.gz`: that the sdist carries
every file the build reads (a module or header left out of MANIFEST.in
fails here, not on the user's machine), that setup.py's make run works from
an unpacked sdist in pip's temporary directory, and that the installed
package loads the bundled library rather than the checkout's build."""
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tarfile
import time

import numpy as np

from conftest import ROOT, job_settings
from test_install import clean_env, run_python, site_of, venv_with

# The trainer each group runs with the venv's python: numpy state, one
# deterministic update per step (so a fault-free run's result is known), a
# progress line per step, and at the end what it ran on.
WORKER = r'''
import hashlib, json, os, sys, time
import numpy as np
import graft

steps, out, checkout = int(sys.argv[1]), sys.argv[2], sys.argv[3]
w = np.zeros(4096, dtype=np.float32)
with graft.Runtime() as rt:
    rt.register("w", w, "param")
    while rt.step < steps:
        info = rt.quorum()
        if info.step >= steps:
            break
        if info.healing:
            rt.heal_wait()
        grad = np.sin(np.arange(w.size, dtype=np.float32) + np.float32(info.step))
        if rt.commit():
            w -= np.float32(0.1) * grad
        print("step", rt.step, flush=True)
        time.sleep(0.05)
    with open("/proc/self/maps") as f:
        from_checkout = sorted({l.split()[-1] for l in f if checkout + "/" in l})
    with open(out, "w") as f:
        json.dump({"step": rt.step, "sha": hashlib.sha256(w.tobytes()).hexdigest(),
                   "start": rt.start_kind, "metrics": rt.metrics(),
                   "library": graft.library_path, "package": graft.__file__,
                   "from_checkout": from_checkout}, f)
'''


def _expected_sha(steps):
    w = np.zeros(4096, dtype=np.float32)
    for step in range(steps):
        w -= np.float32(0.1) * np.sin(np.arange(w.size, dtype=np.float32) + np.float32(step))
    return hashlib.sha256(w.tobytes()).hexdigest()


def _build_sdist(dist):
    """The sdist, made as python/README.md says: `python3 -m build --sdist
    --no-isolation` (Debian's python3-build, scripts/deps.sh), or, where
    that is missing, setuptools' PEP 517 hook that it calls."""
    try:
        import build  # noqa: F401

        cmd = [sys.executable, "-m", "build", "--sdist", "--no-isolation", "--outdir",
               str(dist), "."]
    except ImportError:
        cmd = [sys.executable, "-c", "import sys; from setuptools import build_meta as b; "
               "b.build_sdist(sys.argv[1])", str(dist)]
    r = subprocess.run(cmd, cwd=ROOT, env=clean_env(), capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr
    made = [p for p in dist.iterdir() if p.name.endswith(".tar.gz")]
    assert len(made) == 1, made
    return made[0]


def _check_sdist_contents(sdist):
    with tarfile.open(sdist) as tar:
        names = [n.split("/", 1)[1] for n in tar.getnames() if "/" in n]
    for needed in ("Makefile", "setup.py", "pyproject.toml", "proto/graft.proto",
                   "include/graft/graft.h", "scripts/libgraft.map", "tests/testlib.mk",
                   "fuzz/fuzz.mk", "runtime/runtime.c", "python/graft/_lib.py"):
        assert needed in names, "%s is not in the sdist" % needed
    for n in names:
        assert not n.startswith(("build/", ".git", "python/build/")), n
        assert not n.endswith((".o", ".so", ".a")), n
        assert not n.endswith("_checkout.py"), n


def _spawn(py, script, group, out, env, steps):
    e = dict(env, GRAFT_GROUP=str(group), GRAFT_GROUPS="2")
    return subprocess.Popen([py, script, str(steps), str(out), ROOT], env=e,
                            cwd=str(out.parent), stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)


def _wait_step(proc, step, timeout=120):
    lines = []
    deadline = time.time() + timeout
    while time.time() < deadline:
        line = proc.stdout.readline()
        if not line:
            break
        lines.append(line)
        if line.startswith("step ") and int(line.split()[1]) >= step:
            return
    raise AssertionError("worker never reached step %d:\n%s" % (step, "".join(lines)))


def _finish(proc, timeout=180):
    try:
        out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, _ = proc.communicate()
        raise AssertionError("worker hung:\n" + out)
    assert proc.returncode == 0, "worker failed:\n" + out


def test_sdist_installs_bundled_library_and_heals(etcd, tmp_path):
    sdist = _build_sdist(tmp_path / "dist")
    assert sdist.name == "graft-%s.tar.gz" % _package_version()
    _check_sdist_contents(sdist)

    # Somewhere else, as a user who downloaded the sdist would have it.
    away = tmp_path / "away"
    away.mkdir()
    shutil.copy(sdist, away)
    t0 = time.time()
    py = venv_with(away / sdist.name, away)
    print("venv and pip install of the sdist: %.1f s" % (time.time() - t0))

    library, package, checkout_spec = run_python(
        py, "import graft, importlib.util; print(graft.library_path, graft.__file__, "
        "importlib.util.find_spec('graft._checkout'))", away)
    site = site_of(py)
    assert os.path.realpath(library).startswith(site), library
    assert os.path.basename(library) == "libgraft.so"
    assert os.path.realpath(package).startswith(site), package
    assert checkout_spec == "None"  # no recorded checkout path to fall back on

    # A 2-group job in strict mode: group 1 killed at step 5 and started
    # again; the replacement heals from group 0 and both end bit-identical to
    # a fault-free run, on the venv's package and library only.
    steps = 20
    script = away / "worker.py"
    script.write_text(WORKER)
    env = clean_env()
    env.update(job_settings(etcd, prefix="sdist-"))
    outs = [away / "g0.json", away / "g1.json"]
    g0 = _spawn(py, script, 0, outs[0], env, steps)
    g1 = _spawn(py, script, 1, outs[1], env, steps)
    try:
        _wait_step(g1, 5)
        g1.kill()
        g1.wait()
        repl = _spawn(py, script, 1, outs[1], env, steps)
        _finish(repl)
        _finish(g0)
    finally:
        for p in (g0, g1):
            if p.poll() is None:
                p.kill()
                p.wait()
    res = [json.loads(o.read_text()) for o in outs]
    expected = _expected_sha(steps)
    for o in res:
        assert o["step"] == steps
        assert o["sha"] == expected
        assert os.path.realpath(o["library"]).startswith(site)
        assert o["from_checkout"] == []  # nothing mapped from the checkout
    assert res[1]["start"] == "peer" and res[1]["metrics"]["recoveries"] >= 1
    assert res[0]["metrics"]["serves"] >= 1


def _package_version():
    with open(os.path.join(ROOT, "python", "graft", "__init__.py")) as f:
        for line in f:
            if line.startswith("__version__"):
                return line.split("=")[1].strip().strip("\"'")
    raise AssertionError("no __version__ in python/graft/__init__.py")
