"""A dashboard deployed before its job (issue 28, item 6), in headless
Chromium: `graftctl dashboard` is started before etcd and before the job
exists. The rendered page says "waiting for job '<job>': etcd unreachable",
then, once etcd is up without the job, "waiting for job '<job>': unknown
job"; once the job's trainers (two groups of `train_mlp`) start, the
waiting line goes and the job is drawn with its groups, and when they end
(each with its closing step) the job reads completed."""
import os
import subprocess
import uuid

from playwright.sync_api import sync_playwright

from conftest import BIN, BUILD, free_port, http_get, wait_for
from test_dashboard_reasons import page_of, stop

ARTIFACTS = os.path.join(BUILD, "test-artifacts", "dashboard")


def start_etcd(tmp, url, peer):
    return subprocess.Popen(
        ["etcd", "--data-dir", os.path.join(tmp, "etcd-late"), "--listen-client-urls", url,
         "--advertise-client-urls", url, "--listen-peer-urls", peer,
         "--initial-advertise-peer-urls", peer, "--initial-cluster", f"default={peer}",
         "--log-level", "error"],
        stdout=subprocess.DEVNULL, stderr=open(os.path.join(tmp, "etcd-late.log"), "w"))


def start_trainer(tmp, etcd_url, job, group):
    env = dict(os.environ, GRAFT_JOB=job, GRAFT_ETCD_ENDPOINTS=etcd_url, GRAFT_GROUP=str(group),
               GRAFT_GROUPS="2", GRAFT_RANK="0", GRAFT_RANKS_PER_GROUP="1",
               GRAFT_LEASE_TTL_MS="2000", GRAFT_JOIN_TIMEOUT_MS="1000", GRAFT_LOG="warn")
    return subprocess.Popen(
        [os.path.join(BIN, "train_mlp"), "--steps", "150", "--step-delay-ms", "20"], env=env,
        stdout=open(os.path.join(tmp, f"late-trainer-{group}.log"), "w"),
        stderr=subprocess.STDOUT)


def header_with(page, text):
    return lambda: (lambda t: t if text in t else None)(page.inner_text("#job"))


def test_waiting_for_job_then_the_job(tmp):
    os.makedirs(ARTIFACTS, exist_ok=True)
    job = "late-" + uuid.uuid4().hex[:8]
    etcd_url = f"http://127.0.0.1:{free_port()}"
    peer = f"http://127.0.0.1:{free_port()}"
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    dash = subprocess.Popen(
        [os.path.join(BIN, "graftctl"), "--etcd", etcd_url, "--job", job, "dashboard",
         "--listen", f"127.0.0.1:{port}", "--interval-ms", "200"],
        stdout=open(os.path.join(tmp, "dashboard-late.log"), "w"), stderr=subprocess.STDOUT)
    procs = [dash]

    def answers():
        try:
            return http_get(url + "/api/state")[0] == 200
        except OSError:
            return False
    try:
        wait_for("the dashboard, with no etcd", answers, 30)
        with sync_playwright() as p:
            browser, page = page_of(p, url)
            header = wait_for("'etcd unreachable' in the header",
                              header_with(page, "etcd unreachable"), 30)
            assert f"waiting for job '{job}': etcd unreachable" in header, header
            assert page.get_attribute("#job", "data-waiting").startswith(
                f"waiting for job '{job}'")
            page.screenshot(path=os.path.join(ARTIFACTS, "dashboard-waiting.png"),
                            full_page=True)

            procs.append(start_etcd(tmp, etcd_url, peer))
            header = wait_for("'unknown job' in the header", header_with(page, "unknown job"), 60)
            assert f"waiting for job '{job}': unknown job" in header, header
            assert page.query_selector('#groups [data-group="0"]') is None

            trainers = [start_trainer(tmp, etcd_url, job, g) for g in range(2)]
            procs.extend(trainers)
            wait_for("the job on the page", lambda: page.get_attribute(
                "#job", "data-waiting") == "" and page.get_attribute("#job", "data-state"), 60)
            assert "waiting for job" not in page.inner_text("#job")
            wait_for("both groups' tiles", lambda: all(
                page.query_selector(f'#groups [data-group="{g}"]') for g in range(2)), 30)
            page.screenshot(path=os.path.join(ARTIFACTS, "dashboard-job-appeared.png"),
                            full_page=True)

            for t in trainers:
                assert t.wait(180) == 0, open(os.path.join(tmp, "late-trainer-0.log")).read()
            wait_for("the job completed on the page", lambda: page.get_attribute(
                "#job", "data-state") == "completed", 30)
            browser.close()
    finally:
        stop(*reversed(procs))
