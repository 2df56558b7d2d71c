"""The page says why a job does not move: in headless Chromium against a
live `graft-sim run`, a strict job whose group 1 is stopped (SIGSTOP, its
lease lost, no replacement while it lasts) is drawn paused with the reason
(no quorum: 1 groups live, 2 needed) and 'no progress for N s' in place of
a step rate; a job whose group 1 was started with other settings
(GRAFT_GROUPS 3) is drawn with group 1 misconfigured and the config
mismatch named on its tile."""
import json
import os
import signal
import stat
import subprocess

from playwright.sync_api import sync_playwright

from conftest import BIN, BUILD, free_port, http_get, wait_for

ARTIFACTS = os.path.join(BUILD, "test-artifacts", "dashboard")


def start_run(tmp, etcd, name, extra, env=None):
    """graft-sim run (2 groups of 1 rank) with extra arguments and the job's
    dashboard; (sim, dashboard, url)."""
    root = os.path.join(tmp, "ckpt-" + name)
    os.makedirs(root)
    log = open(os.path.join(tmp, f"sim-{name}.log"), "w")
    sim = subprocess.Popen(
        [os.path.join(BIN, "graft-sim"), "run", "--groups", "2", "--ranks", "1", "--seed", "7",
         "--etcd", etcd, "--persist-root", root] + extra,
        stdout=log, stderr=subprocess.STDOUT,
        env=dict(os.environ, GRAFT_SIM_STEP_MS="25", **(env or {})))
    job = wait_for("the run's job", lambda: next(
        (d for d in os.listdir(root) if d.startswith("sim-")), None), 60)
    port = free_port()
    dash = subprocess.Popen(
        [os.path.join(BIN, "graftctl"), "--etcd", etcd, "--job", job, "dashboard", "--listen",
         f"127.0.0.1:{port}", "--interval-ms", "200"],
        stdout=open(os.path.join(tmp, f"dashboard-{name}.log"), "w"), stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"

    def answers():
        try:
            return http_get(url + "/api/state")[0] == 200
        except OSError:
            return False
    wait_for("the dashboard", answers, 30)
    return sim, dash, url


def stop(*procs):
    for p in procs:
        if p.poll() is None:
            p.send_signal(signal.SIGTERM)
            p.wait(60)


def page_of(p, url):
    browser = p.chromium.launch(executable_path="/usr/bin/chromium", headless=True,
                                args=["--no-sandbox"])
    page = browser.new_page(viewport={"width": 1280, "height": 1000})
    page.goto(url + "/")
    return browser, page


def test_paused_job_shows_why(tmp, etcd):
    os.makedirs(ARTIFACTS, exist_ok=True)
    sched = os.path.join(tmp, "stop.json")
    with open(sched, "w") as f:
        json.dump({"events": [{"kind": "hang", "group": 1, "rank": 0, "at_step": 100,
                               "duration_ms": 40000}]}, f)
    sim, dash, url = start_run(tmp, etcd, "paused", ["--steps", "400", "--schedule", sched])
    try:
        with sync_playwright() as p:
            browser, page = page_of(p, url)
            wait_for("the job paused on the page",
                     lambda: page.get_attribute("#job", "data-state") == "paused", 60)
            header = wait_for("the reason in the header", lambda: (lambda t: t if "no quorum" in t
                              else None)(page.inner_text("#job")), 10)
            assert "paused: no quorum: 1 groups live, 2 needed (min_groups)" in header, header
            step = wait_for("'no progress for' in place of the rate", lambda: (
                lambda t: t if "no progress for" in t else None)(page.inner_text("#step")), 10)
            assert "steps/s" not in step, step
            tile0 = page.inner_text('#groups [data-group="0"]')
            assert "no progress for" in tile0, tile0
            page.screenshot(path=os.path.join(ARTIFACTS, "dashboard-paused.png"), full_page=True)
            browser.close()
    finally:
        stop(dash, sim)


def test_config_mismatch_named_on_the_page(tmp, etcd):
    os.makedirs(ARTIFACTS, exist_ok=True)
    wrapper = os.path.join(tmp, "trainer.sh")
    with open(wrapper, "w") as f:
        f.write('#!/bin/sh\nif [ "$GRAFT_GROUP" = 1 ]; then\n'
                '  GRAFT_GROUPS=3 GRAFT_MIN_GROUPS=3; export GRAFT_GROUPS GRAFT_MIN_GROUPS\n'
                f"fi\nexec '{BIN}/train_mlp' \"$@\"\n")
    os.chmod(wrapper, os.stat(wrapper).st_mode | stat.S_IXUSR)
    sim, dash, url = start_run(tmp, etcd, "mismatch", ["--steps", "100000", "--mode", "elastic",
                                                      "--trainer", wrapper])
    try:
        with sync_playwright() as p:
            browser, page = page_of(p, url)
            tile = '#groups [data-group="1"]'
            wait_for("group 1 misconfigured on the page", lambda: page.query_selector(tile) and
                     page.get_attribute(tile, "data-health") == "misconfigured", 60)
            reason = wait_for("its reason on the tile", lambda: (
                lambda e: e.inner_text() if e else None)(page.query_selector(tile + " .reason")),
                10)
            assert "config mismatch: min_groups 3 in group 1 (GRAFT_GROUPS 3)" in reason, reason
            assert page.get_attribute('#groups [data-group="0"]', "data-health") != \
                "misconfigured"
            page.screenshot(path=os.path.join(ARTIFACTS, "dashboard-mismatch.png"),
                            full_page=True)
            browser.close()
    finally:
        stop(dash, sim)
