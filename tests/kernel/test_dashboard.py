"""``sandgate dashboard`` against the test gateway: who gets in, the live page in headless
Chromium while a session runs, and ``/metrics`` growing with a session."""

from __future__ import annotations

import contextlib
import json
import os
import queue
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from sandgate.session.stack import Stack

from .conftest import Runner

pytestmark = pytest.mark.kernel

CURL = "curl --noproxy '*' -sS -m 3 -o /dev/null -w '%{http_code}'"
CHROMIUM_FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]


@dataclass
class Dash:
    proc: subprocess.Popen[str]
    url: str
    token: str
    port: int


def start_dashboard(stack: Stack, home: Path, *extra: str) -> tuple[subprocess.Popen[str], str]:
    """Start it; its first lines (address and token), or what it said before it exited."""
    env = {**os.environ, "SANDGATE_HOME": str(home)}
    proc = subprocess.Popen(
        [sys.executable, "-m", "sandgate", "dashboard", "--instance", stack.instance, *extra],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    lines: queue.Queue[str] = queue.Queue()

    def read() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            lines.put(line)

    threading.Thread(target=read, daemon=True).start()
    out = ""
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline and "token:" not in out and proc.poll() is None:
        with contextlib.suppress(queue.Empty):
            out += lines.get(timeout=0.2)
    return proc, out


@pytest.fixture(scope="module")
def dash(stack: Stack, store_path: Path) -> Iterator[Dash]:
    proc, out = start_dashboard(stack, store_path.parent, "--listen", "127.0.0.1:0")
    try:
        m = re.search(r"http://127\.0\.0\.1:(\d+)/\n", out)
        t = re.search(r"^token: (\S+)$", out, re.M)
        assert m and t, f"no address and token in {out!r}"
        yield Dash(proc, f"http://127.0.0.1:{m[1]}", t[1], int(m[1]))
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def get(url: str, headers: dict[str, str] | None = None) -> tuple[int, str]:
    req = urllib.request.Request(url, headers=headers or {})
    try:
        with urllib.request.urlopen(req, timeout=10) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


def as_nobody(*args: str) -> str:
    r = subprocess.run(
        ["setpriv", "--reuid", "65534", "--regid", "65534", "--clear-groups", *args],
        capture_output=True,
        text=True,
        timeout=20,
        check=False,
    )
    return r.stdout


@contextlib.contextmanager
def chromium() -> Iterator[Any]:
    """Headless Chromium driven by selenium (skips the test where chromedriver is missing)."""
    if shutil.which("chromedriver") is None:
        pytest.skip("chromedriver is missing (setup.sh test installs it)")
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = "/usr/bin/chromium"
    profile = tempfile.mkdtemp(prefix="sg-dash-chromium-")
    for flag in [*CHROMIUM_FLAGS, f"--user-data-dir={profile}"]:
        options.add_argument(flag)
    os.environ["SE_AVOID_STATS"] = "true"
    driver = webdriver.Chrome(options=options, service=Service("/usr/bin/chromedriver"))
    try:
        yield driver
    finally:
        driver.quit()
        shutil.rmtree(profile, ignore_errors=True)


def test_root_is_let_in_by_its_socket(dash: Dash) -> None:
    status, page = get(dash.url + "/")
    assert status == 200
    assert "EventSource" in page
    # Self-contained: nothing on the page points elsewhere.
    assert not re.search(r"""(src|href)\s*=\s*["']?(https?:)?//""", page)
    status, _ = get(dash.url + "/metrics")
    assert status == 200
    head = subprocess.run(
        ["curl", "-sI", "-o", "/dev/null", "-w", "%{http_code}", "-m", "5", dash.url + "/"],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert head.stdout == "405"
    assert get(dash.url + "/session/no-such-session")[0] == 404


def test_others_need_the_token(dash: Dash) -> None:
    curl = ["curl", "-s", "-o", "/dev/null", "-w", "%{http_code}", "-m", "5"]
    assert as_nobody(*curl, dash.url + "/") == "401"
    assert as_nobody(*curl, dash.url + "/metrics") == "401"
    assert as_nobody(*curl, dash.url + "/?token=wrong") == "401"
    assert as_nobody(*curl, f"{dash.url}/?token={dash.token}") == "200"
    bearer = f"Authorization: Bearer {dash.token}"
    assert as_nobody(*curl, "-H", bearer, dash.url + "/metrics") == "200"
    # Root itself, with a Host that is not this listener's (a DNS rebinding page): refused.
    assert get(dash.url + "/", {"Host": f"evil.example:{dash.port}"})[0] == 401


def test_a_port_in_use_is_a_clear_error(dash: Dash, stack: Stack, store_path: Path) -> None:
    proc, _ = start_dashboard(stack, store_path.parent, "--listen", f"127.0.0.1:{dash.port}")
    _, err = proc.communicate(timeout=20)
    assert proc.returncode != 0
    assert f"port {dash.port} on 127.0.0.1 is in use" in err
    assert "--listen" in err


def test_non_loopback_needs_public(stack: Stack, store_path: Path) -> None:
    proc, _ = start_dashboard(stack, store_path.parent, "--listen", "0.0.0.0:0")
    _, err = proc.communicate(timeout=20)
    assert proc.returncode != 0
    assert "not a loopback address" in err and "--public" in err


def site_totals(text: str) -> tuple[float, float]:
    packets = events = 0.0
    for f in text_string_to_metric_families(text):
        if f.name == "sandgate_site_packets":
            packets += sum(s.value for s in f.samples if s.name.endswith("_total"))
        if f.name == "sandgate_events":
            events += sum(s.value for s in f.samples if s.name.endswith("_total"))
    return packets, events


def test_metrics_grow_after_a_session(dash: Dash, sandbox: Runner) -> None:
    status, before = get(dash.url + "/metrics")
    assert status == 200
    assert 'sandgate_gateway_up{instance="' in before and "} 1" in before
    p0, e0 = site_totals(before)
    sandbox.sh(f"{CURL} http://10.77.0.10:8000/v1/models; {CURL} http://10.77.0.20:22/; true")
    _, after = get(dash.url + "/metrics")
    p1, e1 = site_totals(after)
    # The session's guest is gone, its counters folded into the totals: they only grow.
    assert p1 > p0
    assert e1 > e0
    assert 'verdict="deny"' in after and 'reason="deny.private"' in after


def test_the_page_shows_a_session_live(dash: Dash, sandbox: Runner) -> None:
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    with chromium() as driver:
        driver.get(dash.url + "/")  # root: let in by its socket, no token
        wait = WebDriverWait(driver, 20)
        wait.until(lambda d: d.find_element(By.ID, "conn").text == "live")
        result = sandbox.sh(
            f"{CURL} http://10.77.0.10:8000/v1/models; {CURL} http://10.77.0.20:22/; "
            "getent hosts dash-probe.evil.example; true",
            mode="open",
        )
        sid = result.session

        def rows() -> list[str]:
            script = (
                "return [...document.querySelectorAll('#events tr')]"
                f".filter(r => r.dataset.session === {sid!r}).map(r => r.textContent)"
            )
            return list(driver.execute_script(script))

        wait.until(lambda d: any("dash-probe.evil.example" in r for r in rows()))
        seen = rows()
        assert any("10.77.0.20:22" in r and "deny" in r for r in seen), seen
        assert any("10.77.0.10:8000" in r and "allow" in r for r in seen), seen
        # The session ended: its row links to its report.
        link = wait.until(
            lambda d: d.find_element(By.ID, f"s-{sid}").find_element(By.CSS_SELECTOR, "a.report")
        )
        driver.get(link.get_attribute("href"))
        assert "dash-probe.evil.example" in driver.page_source
        assert "10.77.0.20" in driver.page_source
        # Filters: another session's rows are hidden.
        driver.get(dash.url + "/")
        wait.until(lambda d: d.find_element(By.ID, "conn").text == "live")
        wait.until(lambda d: rows())
        driver.execute_script(
            "const s = document.getElementById('f-session'); s.value = arguments[0];"
            "s.dispatchEvent(new Event('change'));",
            sid,
        )
        shown = driver.execute_script(
            "return [...document.querySelectorAll('#events tr')].filter(r => !r.hidden)"
            ".map(r => r.dataset.session)"
        )
        assert shown and set(shown) == {sid}


ASK_SCRIPT = (
    "curl -sS -m 40 -o /dev/null -w 'pypi %{http_code}\\n' https://pypi.org/simple/; "
    "getent hosts github.com >/dev/null && echo 'github resolved' || echo 'github refused'"
)


def post(dash: Dash, body: bytes, headers: dict[str, str]) -> tuple[int, str]:
    req = urllib.request.Request(dash.url + "/approve", data=body, headers=headers, method="POST")
    try:
        with urllib.request.urlopen(req, timeout=10) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


def test_names_are_answered_from_the_page(dash: Dash, sandbox: Runner) -> None:
    """A session run with ask: its waiting names show on the page, and its buttons answer them
    (Allow once lets pypi.org through the proxy; Deny refuses github.com's question). A POST
    from another origin, or not JSON, answers nothing."""
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    from sandgate.events.schema import Kind

    work = Path(tempfile.mkdtemp(prefix="sg-dash-ask-"))
    (work / "ask.toml").write_text('[profiles.dev]\ninternet = "ask"\n')
    done: list[Any] = []
    run = threading.Thread(
        target=lambda: done.append(
            sandbox.sh(f"({ASK_SCRIPT}) 2>&1", policy=str(work / "ask.toml"), timeout=120)
        )
    )
    try:
        with chromium() as driver:
            driver.get(dash.url + "/")  # root: let in by its socket, no token
            wait = WebDriverWait(driver, 40)
            wait.until(lambda d: d.find_element(By.ID, "conn").text == "live")
            run.start()

            def click(name: str, verdict: str) -> None:
                row = f'#approvals tr[data-name="{name}"] button[data-verdict="{verdict}"]'
                wait.until(lambda d: d.find_elements(By.CSS_SELECTOR, row))[0].click()

            click("pypi.org", "allow")
            github = '#approvals tr[data-name="github.com"]'
            wait.until(lambda d: d.find_elements(By.CSS_SELECTOR, github))
            # From the attacker's side: another origin's page, or a form post, cannot answer.
            evil = {"content-type": "application/json", "origin": "http://evil.example"}
            assert post(dash, b'{"name": "github.com"}', evil)[0] == 400
            form = {"content-type": "application/x-www-form-urlencoded"}
            assert post(dash, b"name=github.com&verdict=allow", form)[0] == 400
            click("github.com", "deny")
            wait.until(lambda d: "deny github.com" in d.find_element(By.ID, "approve-msg").text)
    finally:
        if run.ident is not None:
            run.join(150)
        shutil.rmtree(work, ignore_errors=True)
    r = done[0]
    out = Path(r.report.output or "").read_text()
    assert "pypi 200" in out and "github refused" in out, out
    seen = {
        (e.name, e.details["approval"])
        for e in sandbox.events(r, Kind.NOTICE)
        if e.details.get("approval")
    }
    assert {("pypi.org", "allow"), ("github.com", "deny")} <= seen, seen
    # Nothing waits now: the page's list is empty again.
    assert json.loads(
        get(dash.url + "/approvals", {"authorization": f"Bearer {dash.token}"})[1]
    ) == {"pending": []}
