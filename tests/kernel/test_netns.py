"""Named network namespaces made and removed without ``ip netns`` (issue 13): each is a fresh
namespace that iproute2 sees as its own, and removing one really ends it (its links go)."""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

import pytest

from sandgate.errors import NetError
from sandgate.net import ns

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
