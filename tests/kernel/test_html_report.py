"""The HTML report of real sessions, written by the real CLI, rendered in a real browser.

A session in the test world asks for an allowed name, a denied one and a name with markup in it;
``sandgate report --html`` writes the file; headless Chromium renders it (``--dump-dom`` holds the
names and destinations, the markup as text; ``--screenshot`` is not blank). Chromium runs with
every fetch sent to a trap on loopback (a proxy that counts connections and answers nothing)
and a resolver that finds no name, so "nothing is fetched from elsewhere" is measured, and a
control page with one remote image shows the trap does catch a fetch.
"""

from __future__ import annotations

import html
import os
import re
import shutil
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import zlib
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from sandgate.session.stack import Stack

from .test_cli import sg

pytestmark = [
    pytest.mark.kernel,
    pytest.mark.skipif(shutil.which("chromium") is None, reason="needs chromium (setup.sh test)"),
]

ROOT = Path(__file__).resolve().parents[2]
TASKS = ROOT / "examples" / "tasks" / "report-000.toml"
EVIL = "<script>document.title='owned'</script>.evil.example"
# Chromium's own services, which it calls at start-up whatever the page (network time, the
# component updater, sign-in) even with --disable-background-networking and
# --disable-component-update (Chromium 156, measured 2026-12-01). The trap answers them nothing;
# any other request in the trap's list was asked for by the page.


def page_fetches(requests: list[str]) -> list[str]:
    """The trap's requests that are not Chromium's own start-up calls."""
    own = (
        "CONNECT accounts.google.com:443 ",
        "CONNECT update.googleapis.com:443 ",
        "GET http://clients2.google.com/time/",
        "POST http://update.googleapis.com/service/",
    )
    # "": a connection closed before it sent a byte (Chromium preconnects to its proxy and
    # may drop the socket unused as it exits; seen once in CI): no request, so no fetch.
    return [r for r in requests if r and not r.startswith(own)]  # fmt: skip


class Trap:
    """A proxy on loopback that accepts, counts and closes: where any fetch would land."""

    def __init__(self) -> None:
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(16)
        self.port = self.sock.getsockname()[1]
        self.requests: list[str] = []  # the first line of each (CONNECT host:443 HTTP/1.1)
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            conn.settimeout(2)
            try:
                first = conn.recv(4096).split(b"\r\n", 1)[0].decode("ascii", "replace")
            except OSError:
                first = "?"
            self.requests.append(first)
            conn.close()

    def close(self) -> None:
        self.sock.close()


@contextmanager
def trap() -> Iterator[Trap]:
    t = Trap()
    try:
        yield t
    finally:
        t.close()


def chromium(url: str, *args: str, proxy: int, timeout: float = 90) -> str:
    profile = tempfile.mkdtemp(prefix="sg-chromium-")
    cmd = [
        "chromium", "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
        "--no-first-run", "--disable-background-networking", "--disable-component-update",
        "--disable-sync", f"--user-data-dir={profile}",
        f"--proxy-server=http://127.0.0.1:{proxy}", "--proxy-bypass-list=<-loopback>",
        "--host-resolver-rules=MAP * ~NOTFOUND, EXCLUDE 127.0.0.1",
        *args, url,
    ]  # fmt: skip
    p = subprocess.Popen(
        cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True
    )
    try:
        stdout, stderr = p.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, signal.SIGKILL)  # the group we started: chromium and its helpers
        p.communicate()
        raise
    finally:
        shutil.rmtree(profile, ignore_errors=True)
    assert p.returncode == 0, stderr[-2000:]
    return stdout


def png_colours(data: bytes, limit: int = 64) -> int:
    """Distinct pixel values in an 8-bit RGB/RGBA PNG (up to ``limit``): IHDR, IDAT, unfilter."""
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    pos, idat, width, height, channels = 8, b"", 0, 0, 0
    while pos < len(data):
        (length,) = struct.unpack(">I", data[pos : pos + 4])
        kind, body = data[pos + 4 : pos + 8], data[pos + 8 : pos + 8 + length]
        if kind == b"IHDR":
            width, height, depth, colour = struct.unpack(">IIBB", body[:10])
            assert depth == 8 and colour in (2, 6), (depth, colour)
            channels = 3 if colour == 2 else 4
        elif kind == b"IDAT":
            idat += body
        pos += 12 + length
    raw, stride = zlib.decompress(idat), width * channels
    prev, seen = bytearray(stride), set()
    for y in range(height):
        start = y * (stride + 1)
        f, line = raw[start], bytearray(raw[start + 1 : start + 1 + stride])
        for i in range(stride):
            a = line[i - channels] if i >= channels else 0
            b, c = prev[i], prev[i - channels] if i >= channels else 0
            if f == 1:
                line[i] = (line[i] + a) & 255
            elif f == 2:
                line[i] = (line[i] + b) & 255
            elif f == 3:
                line[i] = (line[i] + (a + b) // 2) & 255
            elif f == 4:
                pa, pb, pc = abs(b - c), abs(a - c), abs(a + b - 2 * c)
                pred = a if pa <= pb and pa <= pc else b if pb <= pc else c
                line[i] = (line[i] + pred) & 255
        for x in range(0, stride, channels * 7):  # a sample is enough to tell blank from not
            seen.add(bytes(line[x : x + channels]))
        if len(seen) >= limit:
            break
        prev = line
    return len(seen)


@pytest.fixture
def home(store_path: Path) -> Path:
    return store_path.parent


def test_the_report_of_a_real_session_in_a_real_browser(
    stack: Stack, home: Path, tmp_path: Path
) -> None:
    script = (
        "curl --noproxy '*' -sS -m 5 -o /dev/null https://pypi.org/simple/; "
        "curl --noproxy '*' -sS -m 5 -o /dev/null https://evil.example/; "
        f'dig +short +tries=1 +time=2 "{EVIL}"; true'
    )
    r = sg("run", "--world", "test", "--instance", stack.instance, "--mode", "allowlist", "-q",
           "--", "sh", "-c", script, home=home)  # fmt: skip
    assert r.returncode == 0, r.stderr
    report = tmp_path / "report.html"
    r = sg("report", "--session", "last", "--html", str(report), home=home)
    assert r.returncode == 0, r.stderr
    assert "HTML report" in r.stderr and report.stat().st_size > 2000

    with trap() as t:
        dom = chromium(report.as_uri(), "--dump-dom", proxy=t.port)
        shot = tmp_path / "report.png"
        chromium(report.as_uri(), f"--screenshot={shot}", "--window-size=1280,1800", proxy=t.port)
        assert page_fetches(t.requests) == [], "the report fetched something"
    for text in ("pypi.org", "evil.example", "deny.not_allowlisted", "allow.rule", "tool:curl"):
        assert text in dom, text
    assert re.search(r"203\.0\.113\.\d+:443/tcp", dom)  # a destination, with rule and reason
    # The name with markup in it is text: escaped in the DOM, never a second <script> element.
    assert html.escape(EVIL, quote=False) in dom and dom.count("<script") == 1
    assert "<title>owned" not in dom
    assert not re.search(r"""(src|href)=["']?(https?:|//)""", dom)
    assert png_colours(shot.read_bytes()) > 5  # text, green and red marks: not blank


def test_the_trap_does_catch_a_fetch(tmp_path: Path) -> None:
    """The control for the test above: a page that does fetch something is caught."""
    page = tmp_path / "control.html"
    page.write_text("<!DOCTYPE html><p>x</p><img src='http://sg-trap.example/x.png'>")
    with trap() as t:
        chromium(page.as_uri(), "--dump-dom", proxy=t.port)
        assert any("sg-trap.example" in r for r in page_fetches(t.requests)), t.requests
    assert png_colours(_png(8, 8, b"\xff\xff\xff")) == 1  # and a blank picture counts as blank


def _png(width: int, height: int, pixel: bytes) -> bytes:
    def chunk(kind: bytes, body: bytes) -> bytes:
        crc = struct.pack(">I", zlib.crc32(kind + body))
        return struct.pack(">I", len(body)) + kind + body + crc

    rows = b"".join(b"\x00" + pixel * width for _ in range(height))
    ihdr = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return (
        b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", zlib.compress(rows))
        + chunk(b"IEND", b"")
    )  # fmt: skip


def test_the_suite_file_holds_every_session(tmp_path: Path) -> None:
    env = {**os.environ, "SANDGATE_HOME": str(tmp_path), "COLUMNS": "200"}
    out = tmp_path / "suite.html"
    cmd = [sys.executable, "-m", "sandgate", "suite", str(TASKS), "--agent", "scripted",
           "--only", "C00,T13", "--html", str(out)]  # fmt: skip
    p = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=300, check=False)
    assert p.returncode == 0, p.stderr
    doc = out.read_text()
    links = re.findall(r"<a href='#(s-[A-Za-z0-9_-]+)'>", doc)
    assert len(links) == 4  # C00 and T13, locked and open, each opening its session
    for anchor_id in links:
        assert f"<details class='session' id='{anchor_id}'>" in doc
    with trap() as t:
        dom = chromium(out.as_uri(), "--dump-dom", proxy=t.port)
        shot = tmp_path / "suite.png"
        chromium(out.as_uri(), f"--screenshot={shot}", "--window-size=1280,1200", proxy=t.port)
        assert page_fetches(t.requests) == []
    for text in ("C00", "T13", "locked", "open", "pass", "example.com", "api.github.com"):
        assert text in dom, text
    assert "FLAGGED" in dom  # T13 locked claims a download the evidence does not show
    assert png_colours(shot.read_bytes()) > 5
