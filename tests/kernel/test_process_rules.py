"""Process rules from inside a sandbox (issue 14, part 3): git may reach github.com, curl not.

git's HTTPS is made by its helper, so the rule names the executable the kernel reports for it
(``/usr/lib/git-core/git-remote-http``: ``git-remote-https`` is a symlink to it). The same
policy lets curl through to another name, and refuses curl to github.com with
``deny.process`` whichever door it takes (the transparent TLS door, the explicit proxy).
"""

from __future__ import annotations

import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from sandgate.events.schema import Kind

from .conftest import Runner

pytestmark = pytest.mark.kernel

POLICY = """
[profiles.dev]
internet = "allowlist"
allow = [
  { domain = "github.com", process = ["/usr/lib/git-core/git-remote-http"] },
  { domain = "pypi.org", port = 443 },
]
"""
SCRIPT = (
    "git clone -q https://github.com/octocat/Hello-World /work/hw && echo CLONED; "
    'curl -sS -m 5 --noproxy "*" -o /dev/null https://github.com/ && echo CURL-NOPROXY; '
    "curl -sS -m 5 -o /dev/null https://github.com/ && echo CURL-PROXY; "
    'curl -sS -m 5 --noproxy "*" -o /dev/null https://pypi.org/simple/ && echo CURL-PYPI; true'
)


@pytest.fixture
def work() -> Iterator[Path]:
    with tempfile.TemporaryDirectory(prefix="sg-procrules-") as d:
        path = Path(d)
        path.chmod(0o777)
        (path / "p.toml").write_text(POLICY)
        yield path


def test_git_reaches_github_and_curl_does_not(sandbox: Runner, work: Path) -> None:
    r = sandbox.sh(
        f"({SCRIPT}) > /work/out.txt 2>&1", workdir=work, policy=str(work / "p.toml"), timeout=90
    )
    out = (work / "out.txt").read_text()
    assert "CLONED" in out and "CURL-PYPI" in out, out
    assert "CURL-NOPROXY" not in out and "CURL-PROXY" not in out, out
    events = [e for e in sandbox.events(r, Kind.HTTP) if e.name == "github.com"]
    allowed = [e for e in events if e.verdict == "allow"]
    refused = [e for e in events if e.verdict == "deny"]
    assert allowed and all(e.rule == "dev.allow[0] (github.com:80,443)" for e in allowed)
    assert {e.reason for e in refused} == {"deny.process"}, [(e.reason, e.details) for e in refused]
    assert {e.details["door"] for e in refused} == {"transparent", "explicit"}
    assert all(e.details.get("process", {}).get("exe") == "/usr/bin/curl" for e in refused)
