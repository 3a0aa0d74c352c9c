"""Suite-wide guard: the tests must leave no sg-*/sandgate* object on the machine."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator

import pytest


def sandgate_objects() -> set[str]:
    if os.geteuid() != 0:
        return set()
    found: set[str] = set()
    ns = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, check=False)
    found |= {
        f"netns {ln.split()[0]}"
        for ln in ns.stdout.splitlines()
        if ln.startswith(("sg-", "sandgate"))
    }
    links = subprocess.run(["ip", "-o", "link"], capture_output=True, text=True, check=False)
    for line in links.stdout.splitlines():
        name = line.split(": ")[1].split("@")[0]
        if name.startswith(("sg-", "sandgate")):
            found.add(f"link {name}")
    tables = subprocess.run(["nft", "list", "tables"], capture_output=True, text=True, check=False)
    found |= {f"table {t}" for t in tables.stdout.splitlines() if " sandgate" in t or " sg-" in t}
    from sandgate.sandbox import limits

    found |= {f"cgroup {name}" for name in limits.ours()}
    return found


@pytest.fixture(scope="session", autouse=True)
def nothing_left_behind() -> Iterator[None]:
    before = sandgate_objects()
    yield
    left = sandgate_objects() - before
    assert not left, f"the test suite left these behind: {sorted(left)}"
