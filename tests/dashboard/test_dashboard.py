"""`graftctl dashboard` with a live simulation: the page in headless
Chromium sees a group go from healthy to recovering or dead and back, with
its step lag and the job's step-rate sparkline, and once the run ended
shows the job completed and its groups finished;
/metrics parses with prometheus_client's parser and agrees with the run's
report; the server is read-only but for evict, which needs the token; a
request whose Host is a foreign name (DNS rebinding) reads nothing."""
import http.client
import json
import os
import re
import shutil
import subprocess
import urllib.error
import urllib.parse
import urllib.request

from playwright.sync_api import sync_playwright
from prometheus_client.parser import text_string_to_metric_families

from conftest import BUILD, SCHEDULE, STEPS, TOKEN, http_get, wait_for

ARTIFACTS = os.path.join(BUILD, "test-artifacts", "dashboard")
# scripts/dashboard-screenshots.sh sets it: the folder the docs' two
# screenshots go to (during the kill, after the end).
SHOTS = os.environ.get("GRAFT_DASHBOARD_SHOTS")
KILL_STEP = next(e["at_step"] for e in SCHEDULE["events"] if e["kind"] == "kill_group")


def browser_page(p, dashboard, outside):
    browser = p.chromium.launch(executable_path="/usr/bin/chromium", headless=True,
                                args=["--no-sandbox"])
    page = browser.new_page(viewport={"width": 1280, "height": 1000})
    page.on("request", lambda r: None if r.url.startswith(dashboard) else outside.append(r.url))
    page.goto(dashboard + "/")
    return browser, page


def tiles(page):
    """{group: (health, lag or None)} as the page draws them."""
    return {int(t["g"]): (t["h"], int(t["lag"]) if t["lag"] != "" else None)
            for t in page.eval_on_selector_all(
                "#groups .group", "els => els.map(e => ({g: e.dataset.group, h: e.dataset.health,"
                " lag: e.querySelector('.glag').dataset.lag}))")}


def job_step(page):
    v = page.get_attribute("#step", "data-step")
    return int(v) if v else None


def metrics(url):
    status, ctype, text = http_get(url + "/metrics")
    assert status == 200 and ctype.startswith("text/plain")
    return {f.name: f for f in text_string_to_metric_families(text)}


def test_page_follows_a_group_through_a_recovery(dashboard, sim):
    os.makedirs(ARTIFACTS, exist_ok=True)
    outside = []
    lags = []  # group 1's lag while it was not healthy
    shot = []  # the health the docs' screenshot caught (GRAFT_DASHBOARD_SHOTS)
    with sync_playwright() as p:
        browser, page = browser_page(p, dashboard, outside)
        tile = '#groups [data-group="1"]'

        def health():
            return page.get_attribute(tile, "data-health") if page.query_selector(tile) else None
        seen = []

        def note(want):
            h = health()
            if h is not None and (not seen or seen[-1] != h):
                seen.append(h)
            if h is not None and h != "healthy":
                lag = tiles(page).get(1, (h, None))[1]
                if lag is not None:
                    lags.append(lag)
                if SHOTS and not shot and h in ("recovering", "dead") and \
                        KILL_STEP - 10 <= (job_step(page) or 0) < STEPS - 50:
                    # The docs' screenshot: group 1 down after the kill.
                    page.screenshot(path=os.path.join(SHOTS, "dashboard-during-kill.png"))
                    shot.append(h)
            return want(h)
        wait_for("group 1 healthy on the page", lambda: note(lambda h: h == "healthy"), 90)
        seen = ["healthy"]  # what it went through from here
        wait_for("group 1 no longer healthy", lambda: note(lambda h: h in ("recovering", "dead", "hung")), 90)
        page.screenshot(path=os.path.join(ARTIFACTS, "dashboard-recovering.png"), full_page=True)
        wait_for("group 1 healthy again", lambda: note(lambda h: h == "healthy"), 90)
        # The recovery shows in the timeline with its phases.
        wait_for("a recovery of group 1 in the timeline",
                 lambda: any(c.startswith("1/") for c in
                             page.eval_on_selector_all("#recoveries tr td:nth-child(2)",
                                                       "els => els.map(e => e.textContent)")), 30)
        assert page.query_selector("#recoveries .bar.ph-transfer") is not None
        assert page.query_selector("#checkpoints tr") is not None
        assert "no drift recorded" in page.inner_text("#drift")
        # Every group's tile has its lag behind the job's step; the header
        # a sparkline of the dashboard's step-rate samples (one a second).
        drawn = wait_for("a lag on every tile", lambda: (lambda t: t if len(t) == 3 and all(
            lag is not None and lag >= 0 for _, lag in t.values()) else None)(tiles(page)), 30)
        wait_for("the step-rate sparkline", lambda: int(
            page.get_attribute("#ratespark", "data-samples")) >= 3, 30)
        points = page.get_attribute("#ratespark polyline", "points").split()
        assert len(points) >= 3 and "steps/s" in page.inner_text("#ratemax"), points
        # Steps are going up, so some sample drew above the floor (y < 24).
        assert min(float(pt.split(",")[1]) for pt in points) < 24, points
        page.screenshot(path=os.path.join(ARTIFACTS, "dashboard.png"), full_page=True)
        seen_here = list(seen)
        if SHOTS:
            # The kill may come after the hang's recovery seen above.
            wait_for("group 1 down after the kill", lambda: note(lambda h: bool(shot)), 120)
        browser.close()
    seen = seen_here
    assert seen[0] == "healthy" and seen[-1] == "healthy" and len(seen) >= 3, seen
    assert any(h in ("recovering", "dead", "hung") for h in seen[1:-1]), seen
    # Group 1's tile kept its lag while it was down (how far behind it
    # fell depends on the mode and the machine's speed).
    assert lags and min(lags) >= 0, (lags, drawn)
    assert outside == [], f"the page fetched from elsewhere: {outside}"


def test_metrics_parse_while_running(dashboard, sim):
    fams = metrics(dashboard)
    groups = fams["graft_groups"]
    assert groups.type == "gauge"
    by_health = {s.labels["health"]: s.value for s in groups.samples}
    assert set(by_health) == {"healthy", "recovering", "cannot-serve", "voting-no", "hung",
                              "dead", "finished", "misconfigured"}
    assert sum(by_health.values()) == 3
    states = {s.labels["state"]: s.value for s in fams["graft_job_state"].samples}
    assert set(states) == {"running", "degraded", "paused", "completed", "failed"}
    assert sum(states.values()) == 1 and states["completed"] == 0
    hist = fams["graft_recovery_phase_seconds"]
    assert hist.type == "histogram"
    phases = {s.labels["phase"] for s in hist.samples}
    # The total is its own histogram, so a sum over phase counts once.
    assert {"transfer", "verify", "rejoin_to_assign"} <= phases and "total" not in phases
    assert fams["graft_recovery_seconds"].type == "histogram"
    for phase in phases:
        buckets = [s for s in hist.samples
                   if s.name.endswith("_bucket") and s.labels["phase"] == phase]
        counts = [s.value for s in buckets]
        assert counts == sorted(counts), "buckets are cumulative"
        assert buckets[-1].labels["le"] == "+Inf"
        count = next(s.value for s in hist.samples
                     if s.name.endswith("_count") and s.labels["phase"] == phase)
        assert count == counts[-1]
    for name in ("graft_events", "graft_recoveries", "graft_initial_syncs",
                 "graft_recovery_bytes", "graft_checkpoints"):
        assert fams[name].type == "counter", name
        assert all(s.name.endswith("_total") or s.name.endswith("_created")
                   for s in fams[name].samples)


def test_read_only_but_evict_with_token(dashboard):
    req = urllib.request.Request(dashboard + "/api/state", method="DELETE")
    try:
        urllib.request.urlopen(req, timeout=5)
        raise AssertionError("DELETE was accepted")
    except urllib.error.HTTPError as e:
        assert e.code == 405
    for headers in ({}, {"Authorization": "Bearer wrong-token-value"}):
        req = urllib.request.Request(dashboard + "/api/evict?group=0", method="POST",
                                     headers=headers)
        try:
            urllib.request.urlopen(req, timeout=5)
            raise AssertionError("evict without the token was accepted")
        except urllib.error.HTTPError as e:
            assert e.code == 403
    # With the token, a group with no live member is a clean 404.
    req = urllib.request.Request(dashboard + "/api/evict?group=99", method="POST",
                                 headers={"Authorization": "Bearer " + TOKEN})
    try:
        urllib.request.urlopen(req, timeout=5)
        raise AssertionError("evict of an absent group succeeded")
    except urllib.error.HTTPError as e:
        assert e.code == 404
        assert "no live member" in json.loads(e.read())["error"]


def get_with_host(url, path, host):
    """GET path with the given Host header: (status, body)."""
    port = urllib.parse.urlparse(url).port
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
    try:
        conn.putrequest("GET", path, skip_host=True)
        conn.putheader("Host", host)
        conn.endheaders()
        r = conn.getresponse()
        return r.status, r.read().decode()
    finally:
        conn.close()


def test_foreign_host_is_refused(dashboard, sim):
    port = urllib.parse.urlparse(dashboard).port
    for host in (f"localhost:{port}", f"127.0.0.1:{port}", f"[::1]:{port}"):
        status, body = get_with_host(dashboard, "/api/state", host)
        assert status == 200, (host, body)
        assert json.loads(body)["job"] == sim["job"]
    # A page whose DNS name was rebound to this host sends its own name.
    for path in ("/api/state", "/api/events", "/metrics", "/"):
        status, body = get_with_host(dashboard, path, f"rebind.attacker.example:{port}")
        assert status == 403, (path, body)
        assert "not a name of this dashboard" in json.loads(body)["error"]
        assert sim["job"] not in body


GRAFANA = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__)))), "docs", "grafana", "graft.json")


def grafana_exprs():
    """Every PromQL expression of the Grafana dashboard's panels."""
    with open(GRAFANA) as f:
        dash = json.load(f)
    exprs = []
    for panel in dash["panels"]:
        if panel["type"] == "row":
            continue
        assert panel["targets"], panel["title"]
        exprs += [(panel["title"], t["expr"]) for t in panel["targets"]]
    return dash, exprs


def test_grafana_panels_use_real_metrics(dashboard, sim):
    """docs/grafana/graft.json draws the page's panels from /metrics: each
    metric its expressions name is in a real /metrics of the running job
    (a renamed metric fails here), and each expression parses (promtool
    check rules, where Debian's prometheus package is installed)."""
    dash, exprs = grafana_exprs()
    titles = " ".join(p["title"].lower() for p in dash["panels"])
    for section in ("job state", "step rate", "step lag", "groups by health", "recover",
                    "transfer throughput", "quorum", "checkpoint", "drift", "events"):
        assert section in titles, section
    _, _, text = http_get(dashboard + "/metrics")
    known = set()
    for fam in text_string_to_metric_families(text):
        known.add(fam.name)
        known.update(s.name for s in fam.samples)
    known.update(line.split()[2] for line in text.splitlines() if line.startswith("# TYPE "))
    used = set()
    for title, expr in exprs:
        names = set(re.findall(r"\bgraft_[a-z0-9_]+", expr))
        assert names, (title, expr)
        missing = names - known
        assert not missing, f"panel {title!r} uses {missing}, not in /metrics"
        used |= names
    assert len(used) >= 20, sorted(used)
    promtool = shutil.which("promtool")
    if promtool is None:
        print("promtool not installed: the expressions' syntax is not checked")
        return
    rules = {"groups": [{"name": "grafana", "rules": [
        {"record": f"graft:panel_{i}", "expr": expr.replace("$instance", ".*")}
        for i, (_, expr) in enumerate(exprs)]}]}
    path = os.path.join(ARTIFACTS, "grafana-rules.json")
    os.makedirs(ARTIFACTS, exist_ok=True)
    with open(path, "w") as f:
        json.dump(rules, f)  # YAML is a superset of JSON
    r = subprocess.run([promtool, "check", "rules", path], capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr


def test_metrics_agree_with_the_report(dashboard, sim, etcd):
    rc = sim["proc"].wait(300)
    assert rc == 0, open(sim["log"]).read()[-3000:]
    with open(sim["report"]) as f:
        report = json.load(f)
    assert report["verdict"] == "bit-exact"

    def settled():
        fams = metrics(dashboard)
        got = fams["graft_recovery_bytes"].samples[0].value
        return fams if got == report["bytes_transferred"] else None
    fams = wait_for("the dashboard to count every heal's bytes", settled, 30)
    ok = next(s.value for s in fams["graft_recoveries"].samples if s.labels.get("result") == "ok")
    # Each heal of a rank in the job's history, as graftctl reads it: a
    # recovery pulls for as many ranks as fell behind (the hung rank alone,
    # both, or none when no group committed meanwhile), so the count is the
    # history's, and the killed group's two new ranks pulled at least.
    hist = subprocess.run([os.path.join(BUILD, "bin", "graftctl"), "--etcd", etcd, "--job",
                           sim["job"], "--json", "events", "--recoveries"],
                          capture_output=True, text=True, check=True)
    heals = [r for r in json.loads(hist.stdout)["recoveries"] if r["ok"] and not r["initial"]]
    assert ok == len(heals), hist.stdout
    killed_at = next(r["step_at_fail"] for r in report["recoveries"] if r["kind"] == "kill_group")
    assert sum(1 for r in heals if r["group"] == 1 and r["step"] >= killed_at) >= 2, hist.stdout
    _, _, state = http_get(dashboard + "/api/state")
    state = json.loads(state)
    assert state["checkpoints"], "the job's folder, named by its checkpoint events, is listed"
    assert state["checkpoint_root"] == os.path.realpath(sim["root"])
    assert state["checkpoint_root_note"] == ""
    # A writer killed by the run can leave an incomplete directory, which
    # retention keeps for a while (docs/FORMAT.md); nothing is corrupt.
    states = {c["state"] for c in state["checkpoints"]}
    assert states <= {"complete", "incomplete"}, states
    complete = [c for c in state["checkpoints"] if c["state"] == "complete"]
    assert complete
    last = max(c["step"] for c in complete)
    assert fams["graft_checkpoint_last_step"].samples[0].value >= last


def test_page_shows_the_finished_job(dashboard, sim):
    """After the run ended (test_metrics_agree_with_the_report waited for
    it): the job completed, every group finished (not dead), none behind."""
    assert sim["proc"].wait(300) == 0
    outside = []
    with sync_playwright() as p:
        browser, page = browser_page(p, dashboard, outside)
        try:
            wait_for("the job completed on the page",
                     lambda: page.get_attribute("#job", "data-state") == "completed", 60)
        except AssertionError:
            print(http_get(dashboard + "/api/status")[2])
            raise
        got = wait_for("every group finished", lambda: (lambda t: t if len(t) == 3 and all(
            h == "finished" for h, _ in t.values()) else None)(tiles(page)), 30)
        assert all(lag == 0 for _, lag in got.values()), got
        assert job_step(page) == STEPS
        # A job that ended steps no more: its rate reads 0.
        assert json.loads(http_get(dashboard + "/api/status")[2])["steps_per_second"] == 0
        assert "completed" in page.inner_text("#job")
        assert int(page.get_attribute("#ratespark", "data-samples")) >= 3
        page.screenshot(path=os.path.join(ARTIFACTS, "dashboard-finished.png"), full_page=True)
        if SHOTS:
            page.screenshot(path=os.path.join(SHOTS, "dashboard-finished.png"))
        browser.close()
    assert outside == [], f"the page fetched from elsewhere: {outside}"
    fams = metrics(dashboard)
    states = {s.labels["state"]: s.value for s in fams["graft_job_state"].samples}
    assert states["completed"] == 1, states
    by_health = {s.labels["health"]: s.value for s in fams["graft_groups"].samples}
    assert by_health["finished"] == 3 and by_health["dead"] == 0, by_health
