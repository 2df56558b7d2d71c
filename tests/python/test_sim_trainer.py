"""graft-sim run --trainer drives the PyTorch example: 3 groups x 1 rank,
random failures, strict mode; the verdict must be bit-exact against the
--no-graft reference of the same script and seed."""
import json
import os
import subprocess
import sys

import pytest

from conftest import BUILD, ROOT

SIM = os.path.join(BUILD, "bin", "graft-sim")


def test_train_ddp_under_graft_sim(tmp_path):
    if not os.access(SIM, os.X_OK):
        pytest.fail("%s is missing: run make" % SIM)
    env = dict(os.environ, PYTHONPATH=os.path.join(ROOT, "python"),
               GRAFT_LIBRARY=os.environ["GRAFT_LIBRARY"],
               GRAFT_SIM_CACHE_DIR=str(tmp_path / "cache"), TMPDIR=str(tmp_path))
    report = tmp_path / "report.json"
    cmd = [SIM, "run", "--trainer",
           "%s %s" % (sys.executable, os.path.join(ROOT, "examples", "python", "train_ddp.py")),
           "--groups", "3", "--ranks", "1", "--steps", "24", "--random-failures", "3",
           "--seed", "11", "--json", str(report)]
    r = subprocess.run(cmd, env=env, cwd=str(tmp_path), capture_output=True, text=True,
                       timeout=400)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert "verdict            bit-exact" in r.stdout
    rep = json.loads(report.read_text())
    assert rep["verdict"] == "bit-exact"
    assert rep["failures_injected_total"] >= 1


def test_torch_worlds_under_graft_sim(tmp_path):
    """--torch-world: each group 2 ranks of one torch world (gloo, as torchrun
    would start them), which split each step's micro-batches; a rank killed
    takes its world down and both restart, a group killed restarts whole;
    both heal and the run ends bit-exact against the reference of one
    world trained alone."""
    env = dict(os.environ, PYTHONPATH=os.path.join(ROOT, "python"),
               GRAFT_LIBRARY=os.environ["GRAFT_LIBRARY"],
               GRAFT_SIM_CACHE_DIR=str(tmp_path / "cache"), TMPDIR=str(tmp_path))
    report = tmp_path / "report.json"
    schedule = tmp_path / "schedule.json"
    schedule.write_text(json.dumps({"events": [
        {"kind": "kill_rank", "at_step": 4, "group": 1, "rank": 1},
        {"kind": "kill_group", "at_step": 10, "group": 0}]}))
    cmd = [SIM, "run", "--torch-world", "--trainer",
           "%s %s" % (sys.executable, os.path.join(ROOT, "examples", "python", "train_ddp.py")),
           "--groups", "2", "--ranks", "2", "--steps", "16", "--schedule", str(schedule),
           "--seed", "5", "--json", str(report)]
    r = subprocess.run(cmd, env=env, cwd=str(tmp_path), capture_output=True, text=True,
                       timeout=400)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    rep = json.loads(report.read_text())
    assert rep["verdict"] == "bit-exact"
    assert rep["failures_injected_total"] == 2


def test_trainer_flag_is_validated(tmp_path):
    r = subprocess.run([SIM, "run", "--trainer", "  "], capture_output=True, text=True)
    assert r.returncode == 2 and "--trainer: empty command" in r.stderr
    r = subprocess.run([SIM, "run", "--trainer"], capture_output=True, text=True)
    assert r.returncode == 2 and "needs a value" in r.stderr
    r = subprocess.run([SIM, "run", "--torch-world", "--netns"], capture_output=True, text=True)
    assert r.returncode == 2 and "--torch-world's rendezvous is on loopback" in r.stderr
