"""The log flush marker (issue 13): one output rule only the gateway's own marked datagram meets,
logged to each gateway group with queue-threshold 1 and dropped; never a site, never an event."""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass, field
from typing import Any

from sandgate.gateway.logfeed import LogFeed
from sandgate.net.compile import (
    FLUSH_MARK,
    FLUSH_PREFIX,
    GROUP_ACCEPT,
    GROUP_DROP,
    base_ruleset,
)
from sandgate.net.nflog import NflogPacket

POOL = ipaddress.ip_network("10.88.0.0/16")


def _rules(cmds: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [c["add"]["rule"] for c in cmds if "rule" in c.get("add", {})]


def test_the_marker_rule_flushes_both_groups_and_drops() -> None:
    cmds, sites = base_ruleset("up0", POOL)
    marked = [r for r in _rules(cmds) if any(FLUSH_PREFIX in str(e) for e in r["expr"])]
    assert [r["chain"] for r in marked] == ["output"]  # only what the gateway itself sends
    expr = marked[0]["expr"]
    assert expr[0] == {
        "match": {"op": "==", "left": {"meta": {"key": "mark"}}, "right": FLUSH_MARK}
    }
    logs = [e["log"] for e in expr if "log" in e]
    assert {(g["group"], g["queue-threshold"]) for g in logs} == {
        (GROUP_DROP, 1),
        (GROUP_ACCEPT, 1),
    }
    assert expr[-1] == {"drop": None}
    assert not [e for e in expr if "counter" in e]  # a marker is never counted
    assert FLUSH_PREFIX not in sites


@dataclass
class _Reader:
    """A gateway log socket's read side: the records the kernel sent, in order."""

    group: int
    batches: list[list[NflogPacket]] = field(default_factory=list)

    def read(self) -> list[NflogPacket]:
        return self.batches.pop(0) if self.batches else []


def _marker(group: int, token: int) -> NflogPacket:
    return NflogPacket(
        group=group, prefix=FLUSH_PREFIX, hook=3, family=2, indev=None, outdev=1, uid=0,
        gid=0, seq=None, seq_global=None, timestamp=None, proto=17, src="127.0.0.1",
        dst="127.0.0.1", sport=40000, dport=token, tcp_flags=None, icmp_type=None,
        icmp_code=None, length=28, mark=FLUSH_MARK,
    )  # fmt: skip


def test_a_marker_is_no_event_and_answers_only_its_own_flush() -> None:
    feed = LogFeed(sink=None, sites={}, table=None)  # type: ignore[arg-type]  # no site: no sink
    drop, accept = _Reader(GROUP_DROP), _Reader(GROUP_ACCEPT)
    feed.readers = [drop, accept]  # type: ignore[list-item]
    feed._expect([7])
    drop.batches = [[_marker(GROUP_DROP, 6)], [_marker(GROUP_DROP, 7)]]  # an older one first
    assert feed.read_gateway(drop) == 1  # type: ignore[arg-type]
    assert feed._pending[7] == {GROUP_DROP, GROUP_ACCEPT}  # an earlier flush's answers nothing
    feed.read_gateway(drop)  # type: ignore[arg-type]
    assert not feed._done([7])  # the accept group's marker is still to come
    accept.batches = [[_marker(GROUP_ACCEPT, 7)]]
    feed.read_gateway(accept)  # type: ignore[arg-type]
    assert feed._done([7])
