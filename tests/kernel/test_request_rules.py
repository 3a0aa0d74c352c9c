"""Request rules from inside a sandbox (issue 14, part 1): the LAN model server and a name.

The model server (10.77.0.10:8000) may be asked for chat completions and its model list only:
``POST /api/pull`` is refused with 403 whichever way it is sent (through the proxy, with
``--noproxy``, from a raw socket), and logged with its method and path (never its query).
pypi.org's request rule (``GET /simple/*``) forces inspection of its HTTPS.
"""

from __future__ import annotations

import tempfile
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest

from sandgate.events.schema import Kind

from .conftest import Runner

pytestmark = pytest.mark.kernel

VENV_PY = "/opt/sandgate/venv/bin/python"
POLICY = """
[profiles.lan]
internet = "open"

[[profiles.lan.allow]]
host = "10.77.0.10"
port = 8000
name = "model server"
http = ["POST /v1/chat/completions", "GET /v1/models"]

[[profiles.lan.allow]]
domain = "pypi.org"
http = ["GET /simple/*"]
"""

CLIENT = r"""
import json, socket, subprocess
def curl(*a):
    p = subprocess.run(["curl", "-sS", "-m", "10", "-o", "body.txt", "-w", "%{http_code}", *a],
                       capture_output=True, text=True)
    body = open("body.txt").read() if p.returncode == 0 else p.stderr.strip()
    print(json.dumps([p.stdout, body]))
chat = json.dumps({"model": "sg-test-model", "messages": [{"role": "user", "content": "hi"}]})
M = "http://10.77.0.10:8000"
curl("-X", "POST", M + "/api/pull", "-d", "{}")
curl("--noproxy", "*", "-X", "POST", M + "/api/pull?token=SECRET1", "-d", "{}")
curl("--noproxy", "*", "-X", "POST", M + "/v1/chat/completions", "-H",
     "content-type: application/json", "-d", chat)
curl("--noproxy", "*", M + "/v1/models")
curl("--noproxy", "*", "--path-as-is", M + "/v1/../api/tags")
s = socket.create_connection(("10.77.0.10", 8000), timeout=10)
s.sendall(b"DELETE /api/delete HTTP/1.1\r\nHost: 10.77.0.10:8000\r\nContent-Length: 0\r\n\r\n")
print(json.dumps([s.recv(12).decode()[9:12], "raw"]))
curl("--noproxy", "*", "https://pypi.org/simple/")
curl("--noproxy", "*", "-X", "POST", "https://pypi.org/simple/")
"""


@pytest.fixture
def work() -> Iterator[Path]:
    with tempfile.TemporaryDirectory(prefix="sg-reqrules-") as d:
        path = Path(d)
        path.chmod(0o777)
        (path / "p.toml").write_text(POLICY)
        (path / "t.py").write_text(textwrap.dedent(CLIENT))
        yield path


def test_model_server_requests_are_judged_every_way_in(sandbox: Runner, work: Path) -> None:
    import json

    r = sandbox.sh(
        f"{VENV_PY} t.py > out.txt 2>&1", workdir=work, policy=str(work / "p.toml"), mode="open"
    )
    out = (work / "out.txt").read_text()
    got = [json.loads(line) for line in out.splitlines() if line.startswith("[")]
    codes = [c for c, _ in got]
    # pull (proxy env), pull (--noproxy), chat, models, dot segments, raw DELETE, pypi GET, POST
    assert codes == ["403", "403", "200", "200", "403", "403", "200", "403"], out
    assert "model server" in got[0][1] and "deny.request" in got[0][1], got[0]
    events = sandbox.events(r, Kind.HTTP)
    seen = [(e.verdict, e.reason, e.details.get("method"), e.details.get("path")) for e in events]
    assert ("deny", "deny.request", "POST", "/api/pull") in seen, seen
    assert ("deny", "deny.request", "POST", "/api/pull?…") in seen, seen  # query redacted
    assert ("allow", "allow.exempt", "POST", "/v1/chat/completions") in seen, seen
    assert ("deny", "deny.request", "DELETE", "/api/delete") in seen, seen
    assert ("deny", "deny.request", "GET", "/v1/../api/tags") in seen, seen
    assert ("allow", "allow.rule", "GET", "/simple/") in seen, seen
    assert ("deny", "deny.request", "POST", "/simple/") in seen, seen
    pypi = [e for e in events if e.name == "pypi.org"]
    assert pypi and all(e.details["tls"] == "inspected" for e in pypi)
    assert "SECRET1" not in json.dumps([e.details for e in events]) + str(events)
    refused = next(e for e in events if e.reason == "deny.request")
    assert refused.rule == "lan.allow[0] (model server)" and refused.port == 8000
