"""A session's files, from the agent's side: fresh work dir and home, stray writes captured
and quarantined, a bounded disk, drift found (and a changed gateway restored), sudo counted."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import threading
import time
from pathlib import Path

import pytest

from sandgate import cleanup
from sandgate.errors import SandboxError
from sandgate.sandbox.workspace import (
    SESSIONS_ROOT,
    Workspace,
    WorkspaceSpec,
    bind_noexec,
    mount_tmpfs,
    our_mounts,
)
from sandgate.session.runner import session_dir
from sandgate.session.stack import Stack

from .conftest import Runner

MiB = 1 << 20


@pytest.fixture
def template(tmp_path: Path) -> Path:
    home = tmp_path / "home"
    (home / ".config" / "pip").mkdir(parents=True)
    (home / ".config" / "pip" / "pip.conf").write_text("[global]\ntimeout = 5\n")
    (home / "notes.txt").write_text("from the template\n")
    return home


@pytest.fixture
def fixtures(tmp_path: Path) -> Path:
    fx = tmp_path / "fixtures"
    (fx / "data").mkdir(parents=True)
    (fx / "data" / "in.csv").write_text("a,b\n1,2\n")
    os.symlink("data/in.csv", fx / "link.csv")
    return fx


def test_fresh_dirs_strays_quarantined_and_nothing_survives(
    sandbox: Runner, template: Path, fixtures: Path
) -> None:
    script = (
        "cat /work/link.csv > /work/seen.txt; cat /home/agent/notes.txt >> /work/seen.txt; "
        "echo stray > /tmp/t.txt; echo v > /var/tmp/v.txt; echo s > /dev/shm/s.bin; "
        "mkdir -p /home/agent/.local/bin && echo '#!/bin/sh' > /home/agent/.local/bin/tool; "
        "echo changed >> /home/agent/notes.txt; echo r > /run/r.txt; "
        "touch /dev/evil 2>/dev/null && echo dev-writable >> /work/seen.txt; "
        "echo work-output > /work/result.txt"
    )
    r = sandbox.sh(script, space=WorkspaceSpec(fixtures=fixtures, home_template=template))
    assert r.exit_code == 0, r.message
    keep = session_dir(r.session, str(sandbox.store_path))
    seen = (keep / "work" / "seen.txt").read_text()
    assert seen == "a,b\n1,2\nfrom the template\n"  # fixtures and home were copied in
    strays = {s["path"]: s for s in r.report.writes["strays"]}
    for path in (
        "/tmp/t.txt",
        "/var/tmp/v.txt",
        "/dev/shm/s.bin",
        "/run/r.txt",
        "/home/agent/.local/bin/tool",
    ):
        assert strays[path]["change"] == "new", path
        kept = keep / strays[path]["kept"]
        assert kept.is_file() and len(strays[path]["sha256"]) == 64
    assert strays["/home/agent/notes.txt"]["change"] == "changed"
    assert "/work/result.txt" not in strays
    assert not any(p.startswith("/run/sandgate") for p in strays)  # bwrap's mount points
    assert (keep / "work" / "result.txt").read_text() == "work-output\n"
    # The template is untouched and the session's disk is gone.
    assert (template / "notes.txt").read_text() == "from the template\n"
    assert not (template / ".local").exists()
    assert not (SESSIONS_ROOT / r.session).exists()
    assert SESSIONS_ROOT / r.session not in our_mounts(SESSIONS_ROOT)


def test_keep_writes_writes_the_home_back(sandbox: Runner, template: Path) -> None:
    r = sandbox.sh(
        "echo kept > /home/agent/new.txt; rm /home/agent/notes.txt",
        space=WorkspaceSpec(home_template=template, keep_writes=True),
    )
    assert r.exit_code == 0
    assert (template / "new.txt").read_text() == "kept\n"
    assert not (template / "notes.txt").exists()
    assert r.report.writes["kept_writes"] == str(template)


def test_a_home_link_to_a_shared_dir_is_refused_before_anything_runs(
    sandbox: Runner, template: Path, tmp_path: Path
) -> None:
    shared = tmp_path / "shared-tools"
    shared.mkdir()
    os.symlink(shared, template / "tools")
    before = set(os.listdir(SESSIONS_ROOT)) if SESSIONS_ROOT.is_dir() else set()
    with pytest.raises(SandboxError, match="outside"):
        sandbox.sh("touch /home/agent/tools/x", space=WorkspaceSpec(home_template=template))
    assert set(os.listdir(SESSIONS_ROOT)) <= before
    assert not list(shared.iterdir())


def test_filling_the_disk_is_bounded_and_reported(sandbox: Runner) -> None:
    r = sandbox.sh(
        "dd if=/dev/zero of=/tmp/fill bs=1M count=20 2>/dev/null; "
        "dd if=/dev/zero of=/work/fill bs=1M count=200 2>/dev/null; df -k /work",
        space=WorkspaceSpec(disk=64 * MiB, quarantine=8 * MiB, keep_work=8 * MiB),
    )
    writes = r.report.writes
    assert writes["disk_full"] is True
    assert writes["disk_used"] <= 64 * MiB + MiB
    (stray,) = [s for s in writes["strays"] if s["path"] == "/tmp/fill"]
    assert stray["kept"] is None and writes["not_kept"] == 1  # larger than the quarantine
    assert any("larger than --keep-work" in n for n in writes["notes"])
    # The next session has its own, empty disk.
    r2 = sandbox.sh("dd if=/dev/zero of=/work/f bs=1M count=8 2>/dev/null")
    assert r2.exit_code == 0 and not r2.report.writes["disk_full"]


def test_only_the_bounded_places_are_writable(sandbox: Runner) -> None:
    """From inside: the sandbox's root and /home (bwrap's own tmpfs, unbounded), /var and /dev
    are read-only; /var/tmp is a scratch area of the session's, not the host's (where every
    session's workspace is mounted). The script's exit status says which check failed."""
    r = sandbox.sh(
        "for p in /x /home/x /var/x /var/lib/x /dev/x; do touch $p 2>/dev/null && exit 10; "
        "done; touch /var/tmp/ok || exit 11; ls /var/tmp | grep -q sandgate && exit 12; exit 0"
    )
    assert r.exit_code == 0, r.exit_code


def test_a_hanging_agent_is_killed_and_still_reported(sandbox: Runner) -> None:
    started = time.monotonic()
    r = sandbox.sh("echo started; echo junk > /tmp/j; sleep 300", timeout=2)
    assert r.exit_code == 124 and "timed out" in (r.message or "")
    assert time.monotonic() - started < 30
    assert any(s["path"] == "/tmp/j" for s in r.report.writes["strays"])
    assert r.report.output and "started" in Path(r.report.output).read_text()


def test_privilege_attempts_are_refused_and_counted(sandbox: Runner) -> None:
    r = sandbox.sh("sudo apt-get install -y jq; su -c id; /usr/bin/su root -c id; id -u")
    text = Path(r.report.output or "").read_text()
    assert "no privileges in a sandgate sandbox" in text
    assert text.rstrip().endswith("61000")
    tools = [p["tool"] for p in r.report.privilege]
    assert tools.count("su") == 2 and tools.count("sudo") == 1


def test_home_config_drift_is_diffed(sandbox: Runner, template: Path) -> None:
    r = sandbox.sh(
        "pip3 config --user set global.index-url http://evil.example/simple >/dev/null; "
        "git config --global http.proxy http://10.0.0.9:3128",
        space=WorkspaceSpec(home_template=template),
    )
    items = {i["what"]: i for i in r.report.drift["items"]}
    assert (
        "+index-url = http://evil.example/simple"
        in items["/home/agent/.config/pip/pip.conf"]["diff"]
    )
    assert items["/home/agent/.gitconfig"]["change"] == "added"
    assert "proxy = http://10.0.0.9:3128" in items["/home/agent/.gitconfig"]["diff"]
    assert not r.report.drift["gateway_changed"]


def test_a_gateway_ruleset_changed_during_a_session_is_restored(
    sandbox: Runner, stack: Stack
) -> None:
    ns = f"--net=/proc/{stack.gateway.pid}/ns/net"

    def tamper() -> None:
        time.sleep(0.5)
        subprocess.run(
            ["nsenter", ns, "nft", "insert", "rule", "inet", "sandgate", "forward",
             "ip", "daddr", "169.254.0.0/16", "accept"],
            check=True,
        )  # fmt: skip

    t = threading.Thread(target=tamper)
    t.start()
    r = sandbox.sh("sleep 1.5")
    t.join()
    drift = r.report.drift
    assert drift["gateway_changed"] is True and drift["gateway_restored"] is True
    (item,) = [i for i in drift["items"] if i["what"] == "gateway ruleset"]
    assert "169.254.0.0" in item["diff"]
    listing = subprocess.run(
        ["nsenter", ns, "nft", "list", "chain", "inet", "sandgate", "forward"],
        capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip
    assert "169.254.0.0/16 accept" not in listing
    with stack.gateway.client() as ctl:
        assert not ctl.call("check")["problems"]
    # And the gateway forwards again: the next session reaches the model server.
    r2 = sandbox.sh("curl -sS -m 5 -o /dev/null -w '%{http_code}' http://10.77.0.10:8000/v1/models")
    assert Path(r2.report.output or "").read_text().strip() == "200"


def test_destroy_leaves_nothing_of_a_mounted_or_unmounted_disk() -> None:
    """destroy's one rmdir (issue 13) and its rmtree fallback: a session's disk with its
    noexec binds, a folder whose disk was never mounted (files in it), and one gone already."""
    if os.geteuid() != 0:
        pytest.skip("needs root")
    SESSIONS_ROOT.mkdir(parents=True, exist_ok=True)
    tag = f"19700101-000000-d{os.getpid()}"
    space = Workspace(SESSIONS_ROOT / f"{tag}a", 0, WorkspaceSpec())
    space.create(None)
    (space.dir / "stray").write_text("x")
    assert space.dir in our_mounts(SESSIONS_ROOT)
    space.destroy()
    assert not space.dir.exists() and space.dir not in our_mounts(SESSIONS_ROOT)
    space.destroy()  # again: nothing to do, no error
    unmounted = Workspace(SESSIONS_ROOT / f"{tag}b", 0, WorkspaceSpec())
    (unmounted.dir / "home").mkdir(parents=True)
    (unmounted.dir / "home" / "f").write_text("x")
    unmounted.destroy()  # not empty: the rmtree fallback
    assert not unmounted.dir.exists()


def test_cleanup_unmounts_a_dead_sessions_disk() -> None:
    target = SESSIONS_ROOT / "19700101-000000-dead"
    SESSIONS_ROOT.mkdir(parents=True, exist_ok=True)
    target.mkdir()
    mount_tmpfs(target, 4 * MiB)
    (target / "home").mkdir()
    bind_noexec(target / "home")  # as a session's home is
    assert {target, target / "home"} <= set(our_mounts(SESSIONS_ROOT))
    result = cleanup.cleanup()
    assert {str(target), str(target / "home")} <= set(result.mounts)
    assert not {target, target / "home"} & set(our_mounts(SESSIONS_ROOT))
    assert not target.exists()


def test_cleanup_leaves_a_live_sessions_folders_alone(sandbox: Runner) -> None:
    """A plain `sandgate cleanup` beside a running session: its disk and the noexec binds of
    its home and scratch folders are its own, kept while its runner lives (the binds were
    once taken for dead sessions' disks, and unmounted and emptied)."""
    stop = threading.Event()
    box: list[object] = []
    import tempfile

    work = Path(tempfile.mkdtemp(prefix="sg-cleanup-"))  # the sandbox's uid reaches it
    work.chmod(0o777)
    started = work / "started"
    script = (
        "echo kept > $HOME/mark; touch /work/started; "
        "while [ ! -e /tmp/go ]; do sleep 0.1; done; cat $HOME/mark"
    )
    runner = threading.Thread(
        target=lambda: box.append(sandbox.sh(script, stop=stop, timeout=60, workdir=work)),
        daemon=True,
    )
    runner.start()
    try:
        deadline = time.monotonic() + 30
        while not started.exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert started.exists(), "the session did not start"
        mine = [m for m in our_mounts(SESSIONS_ROOT) if len(m.relative_to(SESSIONS_ROOT).parts) > 1]
        assert mine, "no noexec binds to protect"  # the session's home and scratch folders
        result = cleanup.cleanup()
        assert not set(map(str, mine)) & set(result.mounts), result.mounts
        assert set(mine) <= set(our_mounts(SESSIONS_ROOT))
        session_dir = SESSIONS_ROOT / mine[0].relative_to(SESSIONS_ROOT).parts[0]
        (session_dir / "tmp" / "go").touch()  # the sandbox's /tmp
    finally:
        runner.join(60)
        stop.set()
        shutil.rmtree(work, ignore_errors=True)
    r = box[0]
    assert r.exit_code == 0  # type: ignore[attr-defined]
    assert Path(r.report.output or "").read_text().strip() == "kept"  # type: ignore[attr-defined]


def test_notify_when_the_session_ends(sandbox: Runner, tmp_path: Path) -> None:
    told = tmp_path / "told.json"
    r = sandbox.sh("exit 3", notify=f"printenv SANDGATE_ALARM > {told}")
    payload = json.loads(told.read_text())
    assert payload["event"] == "session-end"
    assert payload["session"] == r.session and payload["exit_code"] == 3


def test_sandgates_home_is_hidden_from_the_sandbox_wherever_it_is(
    sandbox: Runner,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capfd: pytest.CaptureFixture[str],
) -> None:
    """The store's signing key lives in sandgate's home: set to a place the sandbox sees
    read-only (/opt here), the home is still not there inside."""
    home = Path("/opt/sg-test-home")
    (home / "keys").mkdir(parents=True, exist_ok=True)
    (home / "keys" / "probe").write_text("secret")
    os.chmod(home, 0o755)
    os.chmod(home / "keys", 0o755)
    os.chmod(home / "keys" / "probe", 0o644)
    try:
        monkeypatch.setenv("SANDGATE_HOME", str(home))
        r = sandbox.sh(f"ls {home}/keys 2>&1; cat {home}/keys/probe 2>&1; echo done")
        out = capfd.readouterr().out
        assert r.exit_code == 0 and "done" in out
        assert "secret" not in out, out
    finally:
        subprocess.run(["rm", "-rf", str(home)], check=True)
