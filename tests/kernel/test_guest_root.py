"""A guest with root in its own namespace (what a VM guest has): the gateway still holds.

The sandboxed uid cannot change its link, addresses or rules (test_attacks.py). Here we go
further and act as root inside the guest's namespace, as a compromised VM would: spoof the
source address, the MAC, ARP; turn IPv6 back on; flush the guest-side table. The gateway's
rules live outside, so each attempt must fail there and be logged as such.
"""

from __future__ import annotations

import secrets
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from sandgate import cleanup
from sandgate.events.schema import Event, Kind
from sandgate.events.store import Store
from sandgate.sandbox.launch import Sandbox
from sandgate.session.stack import Stack

pytestmark = pytest.mark.kernel


@dataclass
class RootGuest:
    stack: Stack
    box: Sandbox
    guest: dict[str, str]
    store_path: Path

    def sh(self, script: str) -> str:
        done = subprocess.run(
            ["nsenter", f"--net=/run/netns/{self.box.netns}", "sh", "-c", script],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        return done.stdout + done.stderr

    def events(self) -> list[Event]:
        with self.stack.gateway.client() as ctl:
            ctl.call("flush")
        store = Store(self.store_path)
        try:
            return store.events(session=self.box.session)
        finally:
            store.close()


@pytest.fixture
def root_guest(stack: Stack, store_path: Path) -> Iterator[RootGuest]:
    box = Sandbox.create(f"guest-root-{secrets.token_hex(3)}", stack.instance, None, 61000)
    cleanup.own(box.netns)
    try:
        with stack.gateway.client() as ctl:
            guest = ctl.call(
                "add_guest",
                netns=box.netns,
                session=box.session,
                policy=str(stack.world.policy) if stack.world else None,
                mode="open",
            )
        try:
            yield RootGuest(stack, box, guest, store_path)
        finally:
            with stack.gateway.client() as ctl:
                ctl.call("remove_guest", guest=guest["guest"])
    finally:
        box.destroy()
        cleanup.disown(box.netns)


def _l2(events: list[Event], reason: str) -> list[Event]:
    return [e for e in events if e.kind is Kind.CONN and e.reason == reason]


def test_spoofed_source_address_is_dropped_at_the_link(root_guest: RootGuest) -> None:
    out = root_guest.sh(
        "ip addr add 10.77.0.99/32 dev eth0 && "
        "curl -sS -m 2 --interface 10.77.0.99 http://203.0.113.10/ ; echo rc=$?"
    )
    assert "rc=0" not in out
    # The kernel ARPs first, with the spoofed sender address: the ARP is what the link drops.
    events = root_guest.events()
    spoofed = _l2(events, "deny.spoof_arp") + _l2(events, "deny.spoof_ip")
    assert spoofed and spoofed[0].src == "10.77.0.99" and spoofed[0].category == "L2"
    # The flow the guest's side saw leave never passed the gateway: not reported as allowed.
    assert not [e for e in events if e.dst == "203.0.113.10" and e.verdict == "allow"]


def test_spoofed_mac_is_dropped(root_guest: RootGuest) -> None:
    out = root_guest.sh(
        "ip link set eth0 address 02:00:00:00:00:99 && "
        "curl -sS -m 2 http://203.0.113.10/ ; echo rc=$?"
    )
    assert "rc=0" not in out
    assert _l2(root_guest.events(), "deny.spoof_mac")


def test_ipv6_turned_back_on_goes_nowhere(root_guest: RootGuest) -> None:
    gateway = root_guest.guest["gateway"]
    # Flush the guest-side table first: it drops IPv6 too, and we want to see the gateway's wall.
    out = root_guest.sh(
        "nft flush ruleset; "
        "sysctl -qw net.ipv6.conf.eth0.disable_ipv6=0 net.ipv6.conf.all.disable_ipv6=0; "
        "sleep 2; ping -6 -c 2 -W 1 fe80::1%eth0; echo rc=$?; "
        f"ping -c 1 -W 1 {gateway} >/dev/null; echo v4=$?"
    )
    assert "rc=0" not in out
    assert _l2(root_guest.events(), "deny.ipv6")


def test_flushing_the_guest_side_table_changes_nothing_at_the_gateway(
    root_guest: RootGuest,
) -> None:
    out = root_guest.sh("nft flush ruleset && curl -sS -m 2 http://10.77.0.20:22/ ; echo rc=$?")
    assert "SSH-2.0" not in out
    nas = [e for e in root_guest.events() if e.kind is Kind.CONN and e.dst == "10.77.0.20"]
    assert nas and all(e.verdict == "deny" and e.reason == "deny.private" for e in nas)
    assert all(e.uid is None for e in nas)  # the guest-side uid log is gone, the gateway's is not
