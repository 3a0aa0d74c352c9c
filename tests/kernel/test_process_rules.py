"""Process rules from inside a sandbox (issue 14, part 3): git may reach github.com, curl not.

git's HTTPS is made by its helper, so the rule names the executable the kernel reports for it
(``/usr/lib/git-core/git-remote-http``: ``git-remote-https`` is a symlink to it). The same
policy lets curl through to another name, and refuses curl to github.com with
``deny.process`` whichever door it takes (the transparent TLS door, the explicit proxy).
"""

from __future__ import annotations

import os
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


UNDER = """
[profiles.dev]
internet = "allowlist"
allow = [{ domain = "pypi.org", port = 443, process = ["/usr/bin/curl"], under = ["PY"] }]
"""
CURL = "curl -sS -m 5 --noproxy '*' -o /dev/null https://pypi.org/simple/"
UNDER_SCRIPT = (
    'python3 -c "import shlex, subprocess, sys; subprocess.run(shlex.split(sys.argv[1]), '
    f'check=True)" "{CURL}" && echo BY-PYTHON; {CURL} && echo BY-SHELL; true'
)


def test_under_lets_the_framework_run_curl_but_not_a_shell(sandbox: Runner, work: Path) -> None:
    """``under``: curl run by Python itself reaches pypi.org; the same curl run by a shell is
    refused (``deny.process``), each event naming the parents it was judged with."""
    py = os.path.realpath("/usr/bin/python3")
    (work / "u.toml").write_text(UNDER.replace("PY", py))
    r = sandbox.sh(
        f"({UNDER_SCRIPT}) > /work/out.txt 2>&1",
        workdir=work,
        policy=str(work / "u.toml"),
        timeout=60,
    )
    out = (work / "out.txt").read_text()
    assert "BY-PYTHON" in out and "BY-SHELL" not in out, out
    events = [e for e in sandbox.events(r, Kind.HTTP) if e.name == "pypi.org"]
    allowed = [e for e in events if e.verdict == "allow"]
    refused = [e for e in events if e.verdict == "deny"]
    parents = [(e.verdict, e.details.get("process", {}).get("parents")) for e in events]
    assert allowed and all(e.details["process"]["parents"][0] == py for e in allowed), parents
    assert refused and {e.reason for e in refused} == {"deny.process"}, parents
    assert all(e.details["process"]["parents"][0] != py for e in refused), parents
