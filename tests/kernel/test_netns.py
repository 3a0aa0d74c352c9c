"""Named network namespaces made and removed without ``ip netns`` (issue 13): each is a fresh
namespace that iproute2 sees as its own, and removing one really ends it (its links go). And
the guest's process hold, installed without waiting for its restore process to exit."""

from __future__ import annotations

import os
import socket
import subprocess
import time
from pathlib import Path

import pytest

from sandgate.errors import NetError
from sandgate.gateway.logs.prochold import ProcessHold
from sandgate.net import iptables, ns
from sandgate.net.nft import Nft

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="needs root")


def _mounted(name: str) -> bool:
    return any(
        line.split()[4] == str(ns.NETNS_DIR / name)
        for line in Path("/proc/self/mountinfo").read_text().splitlines()
    )


def test_a_namespace_is_fresh_shared_with_iproute2_and_ends_when_removed() -> None:
    a, b = f"sg-nstest-{os.getpid()}-a", f"sg-nstest-{os.getpid()}-b"
    try:
        ns.create(a)
        ns.create(b)
        cookies = {ns.netns_cookie(None), ns.netns_cookie(a), ns.netns_cookie(b)}
        assert len(cookies) == 3  # neither is ours, nor the other
        assert _mounted(a) and _mounted(b)
        links = subprocess.run(
            ["ip", "-n", a, "-o", "link"], capture_output=True, text=True, check=True
        ).stdout
        assert links.count("\n") == 1 and ": lo:" in links  # only loopback, made by the kernel
        with pytest.raises(NetError, match="already exists"):
            ns.create(a)
        # A veth between the two: ending a takes its end, so b's end goes too.
        subprocess.run(
            ["ip", "-n", a, "link", "add", "sg-nst0", "type", "veth", "peer", "sg-nst1",
             "netns", b],
            check=True,
        )  # fmt: skip
        ns.remove(a)
        assert not ns.exists(a) and not _mounted(a)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:  # the kernel cleans a namespace up on a worker
            peer = subprocess.run(
                ["ip", "-n", b, "-o", "link"], capture_output=True, text=True, check=True
            )
            if "sg-nst1" not in peer.stdout:
                break
            time.sleep(0.05)
        assert "sg-nst1" not in peer.stdout, "the removed namespace lives on"
        ns.remove(a)  # removing a missing one is not an error
    finally:
        ns.remove(a)
        ns.remove(b)
    assert not ns.exists(b) and not _mounted(b)


def test_only_our_names() -> None:
    with pytest.raises(NetError, match="refusing"):
        ns.create("nstest-not-ours")
    with pytest.raises(NetError, match="refusing"):
        ns.remove("../nstest")


def test_the_process_hold_is_in_force_when_its_install_returns() -> None:
    """install_hold returns at the kernel's commit, before iptables-nft-restore has exited: the
    rules are there at once, a rejected restore is still an error, the child is reaped, and the
    host's namespace is still refused before anything runs."""
    name = f"sg-nstest-{os.getpid()}-h"
    try:
        ns.create(name)
        with ns.NsThread(name) as worker:

            def install_then_list() -> str | None:
                iptables.install_hold(7)
                nft = Nft()  # in-process, at once: no time for a late commit to land
                try:
                    return nft.list_text("list table ip mangle")
                finally:
                    nft.close()

            rules = worker.call(install_then_list) or ""
            assert "queue" in rules and "num 7" in rules, rules
            with pytest.raises(NetError, match="failed"):
                worker.call(
                    lambda: iptables._restore_committed("*mangle\n-A NOSUCH -j X\nCOMMIT\n")
                )
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and _children("iptables-nft-re"):
            time.sleep(0.05)
        assert not _children("iptables-nft-re"), "the restore was not reaped"
    finally:
        ns.remove(name)
    with pytest.raises(NetError, match="host"):
        iptables.install_hold(7)  # this thread is in the host's namespace


def _children(comm: str) -> list[str]:
    me = str(os.getpid())
    out = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().split(") ")[-1].split()
            name = stat.read_text().split("(", 1)[1].split(")")[0]
        except (OSError, IndexError):
            continue
        if fields[1] == me and name == comm:
            out.append(stat.parent.name)
    return out


def test_a_stopped_hold_reports_nothing_more_and_its_worker_ends() -> None:
    """ProcessHold.stop returns once the worker's loop is over (its socket closes after): every
    report came before stop returned, and the worker still ends."""
    name = f"sg-nstest-{os.getpid()}-p"
    reports: list[object] = []
    try:
        ns.create(name)
        hold = ProcessHold("g9", name, lambda key, uid, process: reports.append(key))
        hold.start()

        def send() -> None:
            for cmd in ("link add sg-nstd0 type veth peer name sg-nstd1", "link set sg-nstd0 up",
                        "addr add 192.0.2.9/24 dev sg-nstd0"):  # fmt: skip
                subprocess.run(["ip", *cmd.split()], check=True)  # in this namespace only
            with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
                s.sendto(b"x", ("192.0.2.77", 9))  # out of a link that is not lo: held

        ns.run_in(name, send)
        deadline = time.monotonic() + 10
        while not reports and time.monotonic() < deadline:
            time.sleep(0.02)
        assert reports, "the hold reported nothing"
        hold.stop()
        seen = len(reports)
        assert hold._thread is not None
        hold._thread.join(timeout=10)
        assert not hold._thread.is_alive()
        assert len(reports) == seen
    finally:
        ns.remove(name)
