"""The web server: vhosts over HTTP/1.1, HTTPS with SNI, HTTP/2, SSE, WebSocket, pip, git.

Every client here talks to 127.0.0.1 only, with proxies and user configuration switched
off (trust_env=False, --noproxy, PIP_CONFIG_FILE=/dev/null, GIT_CONFIG_GLOBAL=/dev/null).
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import queue
import socket
import ssl
import subprocess
import sys
import threading
import zipfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import h11
import httpx
import pytest

from sandgate.gateway.proxy.ca import make_ca
from sandgate.world.servers.launch import read_log, start, wait_log
from sandgate.world.servers.static import byte_pattern
from sandgate.world.servers.websocket import Frame, Opcode, encode_frame, parse_frame


def _clean_env(**extra: str) -> dict[str, str]:
    drop = ("proxy", "pip_", "git_", "ssl_cert", "requests_ca", "curl_ca")
    env = {k: v for k, v in os.environ.items() if not k.lower().startswith(drop)}
    env = {k: v for k, v in env.items() if "proxy" not in k.lower()}
    return {**env, "NO_PROXY": "*", "no_proxy": "*", **extra}


def _git(*args: str, cwd: Path | None = None, **env: str) -> None:
    genv = _clean_env(
        GIT_CONFIG_GLOBAL="/dev/null",
        GIT_CONFIG_NOSYSTEM="1",
        GIT_TERMINAL_PROMPT="0",
        GIT_AUTHOR_NAME="sg",
        GIT_AUTHOR_EMAIL="sg@example.test",
        GIT_COMMITTER_NAME="sg",
        GIT_COMMITTER_EMAIL="sg@example.test",
        **env,
    )
    subprocess.run(["git", *args], cwd=cwd, env=genv, check=True, capture_output=True, timeout=30)


def _make_wheel(directory: Path) -> Path:
    """A minimal valid wheel, made by hand: METADATA, WHEEL, RECORD and one module."""
    files = {
        "sgdemo/__init__.py": b"VALUE = 42\n",
        "sgdemo-1.0.dist-info/METADATA": b"Metadata-Version: 2.1\nName: sgdemo\nVersion: 1.0\n",
        "sgdemo-1.0.dist-info/WHEEL": b"Wheel-Version: 1.0\nGenerator: sg\n"
        b"Root-Is-Purelib: true\nTag: py3-none-any\n",
    }
    record = []
    for name, data in files.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
        record.append(f"{name},sha256={digest},{len(data)}")
    record.append("sgdemo-1.0.dist-info/RECORD,,")
    path = directory / "sgdemo-1.0-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as zf:
        for name, data in files.items():
            zf.writestr(name, data)
        zf.writestr("sgdemo-1.0.dist-info/RECORD", "\n".join(record) + "\n")
    return path


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    tmp = tmp_path_factory.mktemp("web")
    make_ca("sg web test CA").save(tmp / "ca")
    (tmp / "wheels").mkdir()
    _make_wheel(tmp / "wheels")
    work, bare = tmp / "work", tmp / "git" / "octo" / "demo.git"
    work.mkdir()
    (work / "README.md").write_text("hello from the test world\n")
    _git("init", "-q", "-b", "main", str(work))
    _git("add", "README.md", cwd=work)
    _git("commit", "-q", "-m", "first", cwd=work)
    _git("clone", "-q", "--bare", str(work), str(bare))
    (tmp / "page.bin").write_bytes(b"file-body" * 1000)
    config = {
        "http": ["127.0.0.1:0"],
        "https": ["127.0.0.1:0"],
        "ca_dir": str(tmp / "ca"),
        "log": str(tmp / "web.jsonl"),
        "vhosts": [
            {
                "names": ["127.0.0.1", "example.test"],
                "routes": {
                    "/": {"body": "hello\n", "headers": {"X-Route": "root"}},
                    "/page.bin": {"file": str(tmp / "page.bin")},
                },
                "pypi": str(tmp / "wheels"),
                "git": str(tmp / "git"),
            },
            {"names": ["other.test", "*.wild.test"]},
            {"names": ["plain.test"], "builtins": False, "routes": {"/": {"status": 418}}},
        ],
    }
    (tmp / "web.json").write_text(json.dumps(config))
    with start("web", ["--config", str(tmp / "web.json")]) as running:
        yield {
            "ready": running.ready,
            "http": running.ready["http"][0],
            "https": running.ready["https"][0],
            "ca": str(tmp / "ca" / "ca.pem"),
            "log": str(tmp / "web.jsonl"),
            "tmp": tmp,
        }


def _http(world: dict[str, Any], **kw: Any) -> httpx.Client:
    return httpx.Client(base_url=f"http://{world['http']}", trust_env=False, timeout=10, **kw)


def _https(world: dict[str, Any], **kw: Any) -> httpx.Client:
    ctx = ssl.create_default_context(cafile=world["ca"])
    return httpx.Client(
        base_url=f"https://{world['https']}", verify=ctx, trust_env=False, timeout=10, **kw
    )


def _curl(*args: str) -> str:
    cmd = ["curl", "-sS", "--noproxy", "*", "--max-time", "20", *args]
    return subprocess.run(cmd, capture_output=True, check=True, text=True, env=_clean_env()).stdout


def test_static_route_head_and_421(world: dict[str, Any]) -> None:
    with _http(world) as c:
        r = c.get("/")
        assert (r.status_code, r.text, r.headers["x-route"]) == (200, "hello\n", "root")
        head = c.head("/page.bin")
        assert head.status_code == 200 and head.headers["content-length"] == "9000"
        assert head.content == b""
        assert c.get("/page.bin").content == b"file-body" * 1000
        assert c.get("/", headers={"host": "nowhere.test"}).status_code == 421
        assert c.get("/", headers={"host": "plain.test"}).status_code == 418
        assert c.get("/echo", headers={"host": "plain.test"}).status_code == 404
        assert c.get("/echo", headers={"host": "a.b.wild.test"}).json()["host"] == "a.b.wild.test"
        assert c.get("/status/503").status_code == 503
        assert c.get("/status/204").content == b""
    record = wait_log(world["log"], lambda r: r.get("status") == 421)
    assert record["host"] == "nowhere.test" and record["vhost"] is None


def test_echo_keepalive_and_chunked_body(world: dict[str, Any]) -> None:
    body = b"x" * 100_000

    def chunks() -> Iterator[bytes]:
        yield body[:30_000]
        yield body[30_000:]

    with _http(world) as c:
        first = c.get("/echo/a?b=1", headers={"authorization": "Bearer sk-real"}).json()
        second = c.post("/echo", content=chunks()).json()
    assert first["headers"]["authorization"] == "Bearer sk-real"
    assert (first["path"], first["query"], first["method"]) == ("/echo/a", {"b": "1"}, "GET")
    assert second["headers"]["transfer-encoding"] == "chunked"
    assert second["body_length"] == len(body)
    assert second["body_sha256"] == hashlib.sha256(body).hexdigest()
    assert first["client"] == second["client"]  # one kept-alive connection


def test_bytes_are_the_documented_pattern(world: dict[str, Any]) -> None:
    with _http(world) as c:
        r = c.get(f"/bytes/{3 * 1024 * 1024 + 7}")
    assert len(r.content) == 3 * 1024 * 1024 + 7
    assert r.content[:1000] == byte_pattern(0, 1000)
    assert r.content[-7:] == byte_pattern(3 * 1024 * 1024, 7)


def test_bytes_throughput(world: dict[str, Any]) -> None:
    out = _curl(
        "-o", "/dev/null", "-w", "%{size_download}", f"http://{world['http']}/bytes/268435456"
    )
    assert out == "268435456"


def _peer_sans(world: dict[str, Any], sni: str | None) -> list[tuple[str, str]]:
    ctx = ssl.create_default_context(cafile=world["ca"])
    ctx.check_hostname = False
    host, port = world["https"].rsplit(":", 1)
    with (
        socket.create_connection((host, int(port)), timeout=5) as raw,
        ctx.wrap_socket(raw, server_hostname=sni) as tls,
    ):
        cert = tls.getpeercert()
    assert cert is not None
    return list(cert["subjectAltName"])  # type: ignore[arg-type]


def test_sni_picks_the_vhost_certificate(world: dict[str, Any]) -> None:
    assert _peer_sans(world, "other.test") == [("DNS", "other.test"), ("DNS", "*.wild.test")]
    assert ("DNS", "example.test") in _peer_sans(world, "example.test")
    assert _peer_sans(world, None) == [("IP Address", "127.0.0.1")]
    assert _peer_sans(world, "unknown.test") == [("IP Address", "127.0.0.1")]


def test_https_echo_reports_sni_and_host(world: dict[str, Any]) -> None:
    with _https(world) as c:
        by_ip = c.get("/echo").json()
    with _https(world) as c:  # a new connection: SNI is per connection
        # the URL names the IP (nothing resolves other.test); SNI and Host are set apart
        fronted = c.get(
            "/echo", headers={"host": "other.test"}, extensions={"sni_hostname": "other.test"}
        ).json()
    assert (by_ip["scheme"], by_ip["sni"], by_ip["host"]) == ("https", None, "127.0.0.1")
    assert (fronted["sni"], fronted["host"]) == ("other.test", "other.test")
    assert wait_log(world["log"], lambda r: r.get("sni") == "other.test")["vhost"] == "other.test"


def test_http2_by_alpn_with_curl(world: dict[str, Any]) -> None:
    port = world["https"].rsplit(":", 1)[1]
    out = _curl(
        "--http2", "--cacert", world["ca"], "--resolve", f"example.test:{port}:127.0.0.1",
        "-H", "authorization: Bearer h2", f"https://example.test:{port}/echo",
    )  # fmt: skip
    echo = json.loads(out)
    assert (echo["http_version"], echo["alpn"], echo["sni"]) == ("2", "h2", "example.test")
    assert echo["headers"]["authorization"] == "Bearer h2"
    size = _curl(
        "--http2", "--cacert", world["ca"], "-o", "/dev/null",
        "-w", "%{http_version} %{size_download}", f"https://{world['https']}/bytes/5000000",
    )  # fmt: skip
    assert size == "2 5000000"


def _sse_reader(resp: httpx.Response, out: queue.Queue[dict[str, Any]]) -> None:
    try:
        for line in resp.iter_lines():
            if line.startswith("data: "):
                out.put(json.loads(line[6:]))
    except httpx.HTTPError:
        pass


def test_sse_lockstep(world: dict[str, Any]) -> None:
    events: queue.Queue[dict[str, Any]] = queue.Queue()
    with _http(world) as c, c.stream("GET", "/sse?n=3&lockstep=1&id=w1") as resp:
        threading.Thread(target=_sse_reader, args=(resp, events), daemon=True).start()
        assert events.get(timeout=5) == {"n": 0, "stream": "w1"}
        with pytest.raises(queue.Empty):
            events.get(timeout=0.3)
        with _http(world) as side:
            assert side.get("/lockstep/w1").json()["sent"] == 1
            for n in range(2):
                assert side.post(f"/lockstep/w1/ack/{n}").status_code == 200
                assert events.get(timeout=5)["n"] == n + 1
            assert side.get("/lockstep/w1").json()["done"]
    with _http(world) as c:
        plain = [ln for ln in c.get("/sse?n=2").text.splitlines() if ln.startswith("data")]
    assert plain == ['data: {"n": 0, "stream": null}', 'data: {"n": 1, "stream": null}']


def test_websocket_echo(world: dict[str, Any]) -> None:
    host, port = world["http"].rsplit(":", 1)
    key = base64.b64encode(os.urandom(16)).decode()
    client = h11.Connection(h11.CLIENT)
    with socket.create_connection((host, int(port)), timeout=5) as sock:
        request = h11.Request(
            method="GET",
            target="/ws",
            headers=[
                ("host", "127.0.0.1"),
                ("upgrade", "websocket"),
                ("connection", "Upgrade"),
                ("sec-websocket-key", key),
                ("sec-websocket-version", "13"),
            ],
        )
        sock.sendall((client.send(request) or b"") + (client.send(h11.EndOfMessage()) or b""))
        while True:
            event = client.next_event()
            if event is h11.NEED_DATA:
                client.receive_data(sock.recv(4096))
                continue
            break
        assert isinstance(event, h11.InformationalResponse) and event.status_code == 101
        accept = dict(event.headers)[b"sec-websocket-accept"].decode()
        digest = hashlib.sha1((key + "258EAFA5-E914-47DA-95CA-C5AB0DC85B11").encode()).digest()
        assert accept == base64.b64encode(digest).decode()
        buf = bytearray(client.trailing_data[0])
        big = os.urandom(70_000)
        sock.sendall(encode_frame(Opcode.TEXT, b"hel", fin=False, mask=True))
        sock.sendall(encode_frame(Opcode.CONT, b"lo", mask=True))
        sock.sendall(encode_frame(Opcode.PING, b"p", mask=True))
        sock.sendall(encode_frame(Opcode.BINARY, big, mask=True))
        sock.sendall(encode_frame(Opcode.CLOSE, b"\x03\xe8", mask=True))
        frames: list[Frame] = []
        while not frames or frames[-1].opcode != Opcode.CLOSE:
            parsed = parse_frame(bytes(buf), require_mask=False)
            if isinstance(parsed, tuple):
                frames.append(parsed[0])
                del buf[: parsed[1]]
            else:
                buf += sock.recv(65536)
    assert [(f.opcode, f.payload) for f in frames[:2]] == [
        (Opcode.TEXT, b"hello"),
        (Opcode.PONG, b"p"),
    ]
    assert frames[2] == Frame(True, Opcode.BINARY, big)
    assert frames[3].payload == b"\x03\xe8"
    assert wait_log(world["log"], lambda r: r["event"] == "ws_close")["messages"] == 2


def test_simple_index_pages(world: dict[str, Any]) -> None:
    with _https(world) as c:
        assert c.get("/simple/").text.count('href="/simple/sgdemo/"') == 1
        redirect = c.get("/simple/SGDemo")
        assert (redirect.status_code, redirect.headers["location"]) == (301, "/simple/sgdemo/")
        page = c.get("/simple/sgdemo/").text
        assert c.get("/simple/nothing/").status_code == 404
    wheel = (world["tmp"] / "wheels" / "sgdemo-1.0-py3-none-any.whl").read_bytes()
    assert f"#sha256={hashlib.sha256(wheel).hexdigest()}" in page


def test_pip_download_from_the_index(world: dict[str, Any], tmp_path: Path) -> None:
    cmd = [
        sys.executable, "-m", "pip", "download", "--isolated", "--no-deps", "--no-cache-dir",
        "--disable-pip-version-check", "--only-binary", ":all:",
        "--index-url", f"https://{world['https']}/simple", "--cert", world["ca"],
        "-d", str(tmp_path), "sgdemo==1.0",
    ]  # fmt: skip
    env = _clean_env(PIP_CONFIG_FILE=os.devnull)  # no global or user pip.conf indexes
    done = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=60, check=False)
    assert done.returncode == 0, done.stdout + done.stderr
    assert (tmp_path / "sgdemo-1.0-py3-none-any.whl").exists()
    hosts = {
        r.get("host") for r in read_log(world["log"]) if r.get("target", "").startswith("/files/")
    }
    assert hosts == {"127.0.0.1"}


def test_git_clone_over_https(world: dict[str, Any], tmp_path: Path) -> None:
    for url in (f"https://{world['https']}/octo/demo.git", f"https://{world['https']}/octo/demo"):
        dest = tmp_path / url.rsplit("/", 1)[1]
        _git("clone", "-q", url, str(dest), GIT_SSL_CAINFO=world["ca"])
        assert (dest / "README.md").read_text() == "hello from the test world\n"
    assert any(r.get("git") == "/octo/demo.git/git-upload-pack" for r in read_log(world["log"]))


def test_flags_only_catch_all_vhost_and_delay(tmp_path: Path) -> None:
    with start("web", ["--http", "127.0.0.1:0", "--delay-ms", "150"]) as running:
        url = f"http://{running.ready['http'][0]}/echo"
        with httpx.Client(trust_env=False, timeout=5) as c:
            r = c.get(url, headers={"host": "anything.invalid"})
        assert r.status_code == 200 and r.json()["host"] == "anything.invalid"
        assert r.elapsed.total_seconds() >= 0.15
        assert running.ready["vhosts"] == ["*"]
