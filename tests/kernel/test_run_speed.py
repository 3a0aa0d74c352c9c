"""The fast paths of a run (issue 13) see what the slow paths see: a drift snapshot reused
while no commit reached the kernel still shows a change made from outside the gateway."""

from __future__ import annotations

import os
import secrets
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from sandgate import cleanup
from sandgate.events.store import Store, home_of
from sandgate.gateway import integrity
from sandgate.net import ns
from sandgate.net.nft import Nft
from sandgate.sandbox.launch import Sandbox
from sandgate.session.stack import Stack
from sandgate.session.timings import Timings

from .conftest import Runner, conns


@contextmanager
def _box(stack: Stack, tag: str) -> Iterator[Sandbox]:
    """A sandbox's namespace and folders for a test that talks to the gateway itself."""
    box = Sandbox.create(f"{tag}-{secrets.token_hex(3)}", stack.instance, None, 61000)
    cleanup.own(box.netns)
    try:
        yield box
    finally:
        box.destroy()
        cleanup.disown(box.netns)


def test_a_snapshot_lists_nothing_until_another_process_commits(stack: Stack) -> None:
    """While only the gateway commits, a snapshot needs no listing (it would grow with the
    guests); another process's commit is shown with what it changed, and the chain as it is."""
    ns = f"--net=/proc/{stack.gateway.pid}/ns/net"
    with stack.gateway.client() as ctl:
        first = ctl.call("snapshot")
        assert not first["listed"] and first["ruleset"] == []
        assert first["digest"] == first["expected"]
        subprocess.run(
            ["nsenter", ns, "nft", "insert", "rule", "inet", "sandgate", "forward",
             "ip", "daddr", "192.0.2.77", "accept"],
            check=True,
        )  # fmt: skip
        changed = ctl.call("snapshot")
        assert changed["listed"] and changed["digest"] != changed["expected"]
        text = "\n".join(changed["ruleset"])
        assert "committed by nft (pid" in text, text
        assert "rule in chain inet sandgate forward: added" in text, text
        assert any("192.0.2.77" in line for line in changed["ruleset"]), text
        ctl.call("check")  # the watchdog's round restores the gateway's own rules
        assert not ctl.call("check")["problems"]
        restored = ctl.call("snapshot")
        assert restored["digest"] == restored["expected"] and restored["ruleset"] == []
        forward = subprocess.run(
            ["nsenter", ns, "nft", "list", "chain", "inet", "sandgate", "forward"],
            capture_output=True, text=True, check=True,
        ).stdout  # fmt: skip
        assert "192.0.2.77" not in forward


def test_a_harmless_outside_commit_then_a_join_is_no_drift(stack: Stack) -> None:
    """Another process commits a transaction that changes nothing (a chain made and deleted),
    then a guest joins: no drift, so the watchdog repairs nothing (its repair would empty the
    joining session's counters). Before, the join's own commit made the two indistinguishable."""
    with _box(stack, "noop") as box, stack.gateway.client() as ctl:
        subprocess.run(
            ["nsenter", f"--net=/proc/{stack.gateway.pid}/ns/net", "nft",
             "add chain inet sandgate sg_noop; delete chain inet sandgate sg_noop"],
            check=True,
        )  # fmt: skip
        guest = ctl.call("add_guest", netns=box.netns, session=box.session, mode="open")
        try:
            snap = ctl.call("snapshot")
            assert snap["digest"] == snap["expected"]
            assert not ctl.call("check")["problems"]
        finally:
            ctl.call("remove_guest", guest=guest["guest"])


def test_timings_cover_the_run_and_the_gateway_steps(sandbox: Runner) -> None:
    clock = Timings()
    r = sandbox.sh("true", timings=clock)
    assert r.exit_code == 0, r.message
    phases = {p.name: p for p in clock.phases}
    for name in ("workspace (netns, dirs, tmpfs)", "drift snapshot before", "sandbox exec",
                 "findings (drift snapshot after, writes)", "teardown: netns, dirs", "report"
                 " (store, claims, OCSF)"):  # fmt: skip
        assert name in phases, name
    assert "link" in phases["control add_guest"].steps  # the gateway's own timing_ms
    assert "settle" in phases["control remove_guest (log settle)"].steps
    assert all(p.wall_ms >= 0 and p.cpu_ms >= 0 for p in clock.phases)
    # Correctness, not speed: the table names every phase and sums them.
    text = "\n".join(clock.lines())
    assert "sandbox exec" in text and text.splitlines()[-1].startswith("total")


def test_a_join_is_no_drift_and_its_uid_log_is_made_with_it(stack: Stack) -> None:
    """After add_guest the guest's own uid-log table is there, and a snapshot lists nothing
    (only the gateway committed); the watchdog, which hashes the rules, agrees."""
    with _box(stack, "joined") as box, stack.gateway.client() as ctl:
        guest = ctl.call("add_guest", netns=box.netns, session=box.session, mode="open")
        try:
            # Made beside the link, there when the join returns: the guest's uid log.
            uid_table = subprocess.run(
                ["nsenter", f"--net={ns.path(box.netns)}", "nft", "list", "table", "inet",
                 "sandgate"],
                capture_output=True, text=True, check=True,
            ).stdout  # fmt: skip
            assert "hook output" in uid_table and "sg:uid" in uid_table, uid_table
            snap = ctl.call("snapshot")
            assert not snap["listed"] and snap["ruleset"] == []
            assert snap["digest"] == snap["expected"]
            # Hashed now, from outside too: what the gateway expects is what is there.
            verified = ctl.call("snapshot", verify=True)
            def digest_here() -> str:
                nft = Nft()
                try:
                    return integrity.live_digest(nft)
                finally:
                    nft.close()

            outside = ns.run_in(f"/proc/{stack.gateway.pid}/ns/net", digest_here)
            assert verified["listed"] and verified["digest"] == verified["expected"] == outside
            assert not ctl.call("check")["problems"]
        finally:
            ctl.call("remove_guest", guest=guest["guest"])


def test_counters_read_inside_the_settle_count_every_attempt(sandbox: Runner) -> None:
    """remove_guest reads a quiet guest's counters before the log settle, not after it: they
    must still hold every flow the session started, as its logged events do."""
    script = (
        "import socket\n"
        "for _ in range(3):\n"
        "    c = socket.socket(); c.settimeout(0.3)\n"
        "    try: c.connect(('10.77.0.20', 22))\n"
        "    except OSError: pass\n"
        "    c.close()\n"
    )
    r = sandbox("python3", "-c", script, mode="open")
    assert r.exit_code == 0, r.message
    tripwire = [c for c in r.report.counters.values() if c["verdict"] != "allow"]
    logged = [e for e in conns(sandbox.events(r), "10.77.0.20", 22) if e.verdict != "allow"]
    assert len(logged) == 3, logged
    assert sum(int(c["packets"]) for c in tripwire) == 3, r.report.counters


def test_every_drop_right_before_leaving_is_logged_and_counted(
    stack: Stack, store_path: Path
) -> None:
    """A burst of dropped flows in a guest's last instant, then remove_guest at once: it no
    longer waits out the kernel's log batches (10 ms timer, 64 records) but flushes them with
    a marker, so every attempt is an event and counted when it returns, and no marker is."""
    n = 300  # several full batches and a partial one, under the drop log's burst (1000)
    script = (
        "import os, socket\n"
        "s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)\n"
        f"for port in range(20000, {20000 + n}):\n"
        "    try: s.sendto(b'x', ('10.77.0.20', port))\n"
        "    except OSError: pass\n"
        "os._exit(0)\n"  # no interpreter teardown: the control call follows the last drop
    )
    with _box(stack, "burst") as box, stack.gateway.client() as ctl:
        guest = ctl.call("add_guest", netns=box.netns, session=box.session, mode="open")
        try:
            subprocess.run(
                ["nsenter", f"--net={ns.path(box.netns)}", "python3", "-c", script],
                check=True,
            )
        finally:
            removed = ctl.call("remove_guest", guest=guest["guest"], quiet_since=time.time())
    store = Store(store_path)
    try:
        events = store.events(session=box.session)
    finally:
        store.close()
    logged = [e for e in conns(events, "10.77.0.20") if e.verdict != "allow"]
    assert sum(e.count for e in logged) == n, (len(logged), removed)
    assert not [e for e in logged if e.details.get("inferred")], "a gateway record came late"
    assert {e.port for e in logged} == set(range(20000, 20000 + n))
    dropped = [c for c in removed["counters"].values() if c["verdict"] != "allow"]
    assert sum(int(c["packets"]) for c in dropped) == n, removed["counters"]
    assert not [e for e in events if e.dst == "127.0.0.1"], "a flush marker became an event"
    assert removed["flushed"], f"the barrier was not met, the settle waited: {removed}"


def test_a_connection_as_the_commands_last_act_is_in_the_report_and_then_nothing_stays(
    sandbox: Runner, stack: Stack
) -> None:
    """remove_guest answers once the guest's counters and events are in, and undoes its
    rules, services and link after the reply; the runner asks for it right behind the drift
    snapshot. The flows the command made as its very last act (a SYN and a datagram, then
    ``os._exit``) must still be in the report, counted, and in the store; and what the
    removal undoes after its reply must be gone soon after: rules, link, slot."""
    script = (
        "import os, socket\n"
        "t = socket.socket(); t.setblocking(False)\n"
        "t.connect_ex(('10.77.0.20', 22))\n"  # the SYN leaves inside connect
        "u = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)\n"
        "u.sendto(b'x', ('10.77.0.20', 5353))\n"
        "os._exit(0)\n"
    )
    r = sandbox("python3", "-c", script, mode="open")
    assert r.exit_code == 0, r.message
    events = sandbox.events(r)
    ssh = [e for e in conns(events, "10.77.0.20", 22) if e.verdict != "allow"]
    udp = [e for e in conns(events, "10.77.0.20", 5353) if e.verdict != "allow"]
    assert sum(e.count for e in ssh) == 1 and sum(e.count for e in udp) == 1, events
    denied = [c for c in r.report.counters.values() if c["verdict"] != "allow"]
    assert sum(int(c["packets"]) for c in denied) == 2, r.report.counters
    seen = {(d.dst, d.port) for d in r.report.destinations if d.verdict != "allow"}
    assert {("10.77.0.20", 22), ("10.77.0.20", 5353)} <= seen, r.report.destinations
    store = Store(sandbox.store_path)
    try:
        row = store.session(r.session)
    finally:
        store.close()
    assert row is not None and row.guest
    guest = row.guest
    gw = f"--net=/proc/{stack.gateway.pid}/ns/net"
    with stack.gateway.client() as ctl:
        assert guest not in ctl.call("status")["guests"]
    deadline = time.monotonic() + 10  # a bound, not a speed: the undoing runs after the reply
    while True:
        rules = subprocess.run(
            ["nsenter", gw, "nft", "list", "ruleset"], capture_output=True, text=True, check=True
        ).stdout
        links = subprocess.run(
            ["nsenter", gw, "ip", "-o", "link"], capture_output=True, text=True, check=True
        ).stdout
        left = [w for w in (f"fwd_{guest}", f"in_{guest}", f"ing_{guest}") if w in rules]
        left += [f"link {guest}"] if f" {guest}@" in links or f" {guest}:" in links else []
        if not left or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    assert not left, f"the removed guest's {left} stayed"


def test_retention_runs_beside_the_command_and_is_done_when_the_run_returns(
    sandbox: Runner,
) -> None:
    """Older sessions' files are pruned while the command runs (not after it): the run still
    returns only once that is done, and never touches its own folder."""
    sessions = home_of(str(sandbox.store_path)) / "sessions"
    old = sessions / "20000101-000000-0ld0"
    (old / "deep").mkdir(parents=True)
    (old / "deep" / "output.log").write_text("from long ago\n")
    for path in (old / "deep" / "output.log", old / "deep", old):
        os.utime(path, (0, 0))  # 1970: older than any SANDGATE_KEEP_DAYS
    r = sandbox("true")
    assert r.exit_code == 0, r.message
    assert not old.exists()
    assert (sessions / r.session).is_dir()
