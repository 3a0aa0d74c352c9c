"""What the gateway checks about itself, as pure functions and small probes.

- ``ruleset_digest``: a hash of the gateway's own tables as the kernel lists them, leaving out
  what changes by design (rule handles, counter values, the elements of sets that time out:
  DNS-pinned and inspected addresses). A rule added, removed or changed from outside changes it.
  ``live_digest`` is what the daemon uses: the same idea from nft's text, cheap at 100 guests.
- ``canary_denied`` / ``canary_answered``: probes run from inside the canary guest (a guest of
  the gateway's own, on the same rules as every other): a connection the policy refuses must be
  refused *by the gateway* (ICMP administratively prohibited), and the resolver must answer.
- ``alarm``: telling a person, through a command or a webhook.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import socket
import subprocess
from typing import Any, Protocol

from sandgate.net.compile import TABLE

DENIED_PROBE = ("169.254.169.254", 9)  # the cloud metadata endpoint: denied by every profile
PROBE_TIMEOUT = 1.0


def ruleset_digest(listing: list[dict[str, Any]]) -> str:
    """A stable hash of the gateway's tables (``nft -j list ruleset`` objects)."""
    return hashlib.sha256("\n".join(ruleset_lines(listing)).encode()).hexdigest()


# The tables the digest covers: the gateway's own and the TLS gate's (iptables-nft).
DIGEST_TABLES = (("inet", TABLE), ("netdev", TABLE), ("ip", "mangle"), ("ip", "filter"))
_SET_BLOCK = re.compile(r"^\t(set|map) (\S+) \{\n(.*?)^\t\}", re.M | re.S)
_TIMED = re.compile(r"^\t\t(flags .*\btimeout\b|timeout )", re.M)


class TextLister(Protocol):
    def list_text(self, command: str) -> str | None: ...
    def run(self, command: dict[str, Any] | str) -> dict[str, Any] | None: ...


def live_digest(nft: TextLister) -> str:
    """``ruleset_digest``'s meaning, from nft's own text (stateless, terse) instead of its JSON
    made into Python objects: at 100 guests that listing took most of add_guest's 300 ms and
    its peak (tens of MB of dicts) set the daemon's RSS (2026-12-01). The text leaves out
    counts and handles; terse leaves out set elements, so the sets that do not time out (the
    verdict maps, the gateway's fixed sets) are listed one by one after their table, and the
    pinned and inspected addresses, which time out, stay out as before. The same rules print
    the same text, in the kernel's order."""
    h = hashlib.sha256()
    for family, table in DIGEST_TABLES:
        text = nft.list_text(f"list table {family} {table}")
        h.update(f"# {family} {table}\n".encode())
        if text is None:
            h.update(b"(absent)\n")
            continue
        h.update(text.encode())
        for m in _SET_BLOCK.finditer(text):
            if _TIMED.search(m.group(3)):
                continue
            kind, name = m.group(1), m.group(2).strip('"')
            spec = {"family": family, "table": table, "name": name}
            listed = nft.run({"nftables": [{"list": {kind: spec}}]}) or {}
            items = [i for i in listed.get("nftables", []) if "metainfo" not in i]
            h.update(json.dumps(items, sort_keys=True).encode())
    return h.hexdigest()


def ruleset_lines(listing: list[dict[str, Any]]) -> list[str]:
    """The gateway's tables as sorted canonical lines, without handles and counts: equal
    lines mean equal rules, and a diff of two listings shows what was added or taken away."""
    keep: list[Any] = []
    for item in listing:
        ((kind, body),) = item.items()
        if kind == "metainfo":
            continue
        if body.get("table") not in (TABLE, "mangle", "filter") and body.get("name") not in (
            TABLE,
            "mangle",
            "filter",
        ):
            continue
        body = {k: v for k, v in body.items() if k != "handle"}
        if kind == "counter":
            body = {k: v for k, v in body.items() if k not in ("packets", "bytes")}
        if kind == "rule":
            body["expr"] = [_without_counts(e) for e in body.get("expr", [])]
        if kind == "set" and "timeout" in body.get("flags", []):
            body.pop("elem", None)
        keep.append({kind: body})
    return sorted(json.dumps(x, sort_keys=True) for x in keep)


def _without_counts(expr: Any) -> Any:
    # Anonymous counters in rules (iptables-nft's) carry live packet counts.
    if isinstance(expr, dict) and "counter" in expr and isinstance(expr["counter"], dict):
        return {
            "counter": {k: v for k, v in expr["counter"].items() if k not in ("packets", "bytes")}
        }
    return expr


def canary_denied(cut: bool = False) -> str | None:
    """Run inside the canary guest: None when the gateway still refuses, else what happened.

    While the gateway is cut off (forwarding off), silence is the expected refusal."""
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    s.settimeout(PROBE_TIMEOUT)
    try:
        s.connect(DENIED_PROBE)
        return f"a connection to {DENIED_PROBE[0]}:{DENIED_PROBE[1]} got through"
    except OSError as exc:
        if exc.errno in (113, 101):  # EHOSTUNREACH, ENETUNREACH: the gateway's ICMP refusal
            return None
        if cut and isinstance(exc, TimeoutError):
            return None
        return f"{DENIED_PROBE[0]}:{DENIED_PROBE[1]} was not refused by the gateway ({exc})"
    finally:
        s.close()


def canary_answered(gateway: str) -> str | None:
    """Run inside the canary guest: None when the gateway's resolver answers, else why not."""
    query = _ptr_query()
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.settimeout(PROBE_TIMEOUT)
    try:
        s.sendto(query, (gateway, 53))
        reply = s.recv(512)
        return None if reply[:2] == query[:2] else "the resolver answered something else"
    except OSError as exc:
        return f"the resolver did not answer ({exc.__class__.__name__})"
    finally:
        s.close()


def proxy_accepts(address: str, port: int) -> str | None:
    try:
        with socket.create_connection((address, port), timeout=PROBE_TIMEOUT):
            return None
    except OSError as exc:
        return f"the proxy on {address}:{port} does not accept ({exc.__class__.__name__})"


def _ptr_query() -> bytes:
    import dns.message

    q = dns.message.make_query("1.0.0.10.in-addr.arpa.", "PTR")
    return q.to_wire()


def alarm(target: str, payload: dict[str, Any]) -> str | None:
    """Run a command (the alarm in SANDGATE_ALARM, as JSON) or POST to a webhook URL."""
    body = json.dumps(payload)
    try:
        if target.startswith(("http://", "https://")):
            import urllib.request  # ~10 ms (ssl, http.client): only when an alarm is posted

            req = urllib.request.Request(
                target,
                data=body.encode(),
                method="POST",
                headers={"content-type": "application/json"},
            )
            with urllib.request.urlopen(req, timeout=5):
                return None
        subprocess.run(
            ["sh", "-c", target],
            env={**os.environ, "SANDGATE_ALARM": body},
            timeout=30,
            check=False,
            capture_output=True,
        )
        return None
    except (OSError, subprocess.SubprocessError) as exc:
        return str(exc)
