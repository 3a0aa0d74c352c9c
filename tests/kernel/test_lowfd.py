"""libnftables select()s on its socket: a context made past 1,024 open descriptors must still
commit, not abort the process (issue 11: the gateway died at ~55 guests).

Each check runs in a child process of its own network namespace (``unshare --net``): the
commit goes to that namespace, which ends with the child."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

pytestmark = pytest.mark.kernel

FILL = """
import os
from sandgate.net import lowfd
from sandgate.net.nft import Nft, batch
Nft().close()  # the first context: the reserve is taken while numbers are low
filler = [os.open(os.devnull, os.O_RDONLY) for _ in range(1100)]  # no free number below 1,100
"""


def _child(body: str) -> subprocess.CompletedProcess[str]:
    code = textwrap.dedent(FILL) + textwrap.dedent(body)
    return subprocess.run(
        ["unshare", "--net", sys.executable, "-c", code],
        check=False,
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_a_context_made_past_1024_descriptors_commits() -> None:
    r = _child("""
        nft = Nft()
        nft.run(batch({"add": {"table": {"family": "inet", "name": "sg_lowfd"}}}))
        assert nft.table_exists("inet", "sg_lowfd")
        nft.close()
        Nft().run(batch({"delete": {"table": {"family": "inet", "name": "sg_lowfd"}}}))
        print("committed", max(lowfd.open_fds()))
    """)
    assert r.returncode == 0, r.stderr[-2000:]
    assert "committed" in r.stdout and "FD_SETSIZE" not in r.stderr


def test_with_no_low_descriptor_left_a_context_is_refused_not_fatal() -> None:
    """Every low number taken, the reserve's too (a thread-storm's worst case): a clear error,
    and the process goes on."""
    r = _child("""
        from sandgate.errors import SetupError
        for fd in list(lowfd._held):
            os.close(fd)
        lowfd._held.clear()
        taken = [os.open(os.devnull, os.O_RDONLY) for _ in range(lowfd.RESERVE)]
        assert max(taken) < lowfd.FD_SETSIZE
        try:
            Nft()
        except SetupError as exc:
            print("refused:", exc)
        print("alive")
    """)
    assert r.returncode == 0, r.stderr[-2000:]
    assert "refused: no descriptor below 1024" in r.stdout and "alive" in r.stdout
