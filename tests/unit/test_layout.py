"""The house rules: each part's ``__all__`` (pinned here, like httpx's test_exported_members.py)
and DESIGN.md's forbidden import directions, read from every module's source with ``ast``.

An import counts wherever it is written: at the top, inside a function, under TYPE_CHECKING.
A part's ``__all__`` names its modules (and sub-parts), so a module added, moved or removed
must be named here too: the map a newcomer reads stays true.
"""

from __future__ import annotations

import ast
import importlib
from dataclasses import dataclass
from pathlib import Path

import pytest

import sandgate

SRC = Path(sandgate.__file__).parent

EXPORTS = {
    "sandgate.agents": ["demo_agent", "frameworks", "registry", "scripted_agent"],
    "sandgate.doctor": ["driver", "hops", "judge", "plan", "runner"],
    "sandgate.events": ["chain", "ocsf", "redact", "schema", "store", "verify", "writer"],
    "sandgate.export": ["cilium", "gatewayvm", "k8s", "space", "unexpressed"],
    "sandgate.gateway": [
        "approvals", "collector", "config", "control", "daemon", "dns", "guests", "handed",
        "heap", "hostlo", "integrity", "lifecycle", "logfeed", "logs", "manage", "pool", "proxy",
        "registry", "reload", "selfcheck", "server", "sink", "watchdog",
    ],
    "sandgate.gateway.dns": ["cache", "dnslogic", "resolver", "upstream"],
    "sandgate.gateway.logs": ["attribution", "logreader", "procattr", "prochold", "procparse"],
    "sandgate.gateway.proxy": [
        "ca", "chunked", "credentials", "firstflight", "flow", "http1", "httphead", "relay",
        "lookup", "server", "sni", "splice", "tls", "tlsgate", "tlsio",
        "sockmap",
        "accept",
    ],
    "sandgate.net": [
        "compile", "iphead", "iptables", "links", "netlink", "nflog", "nfqueue", "nft", "ns",
        "sockdiag",
        "lowfd",
        "conntrack",
        "handed",
        "bpf",
        "btf",
    ],
    "sandgate.policy": [
        "classify", "decide", "dnsnames", "exemptions", "groups", "hostparse", "httprules",
        "index", "limits", "load", "locate", "model", "overlay", "patterns", "pins", "plainrules",
        "profile", "reach", "requests", "suggest",
    ],
    "sandgate.prove": ["catalogue", "driver", "homelab", "invariants", "runner", "vmprobes"],
    "sandgate.report": ["dashboard", "dashpage", "html", "metrics", "render", "session"],
    "sandgate.sandbox": ["bwrap", "enter", "launch", "limits", "privilege", "tree", "workspace"],
    "sandgate.session": [
        "claims", "demo", "drift", "evidence", "modeluse", "runner", "stack", "suite", "tasks",
        "retention", "timings",
    ],
    "sandgate.session.claims": [
        "Claim", "ClaimKind", "Evidence", "FileFact", "Finding", "Verdict", "check_claims",
        "extract_claims", "flagged",
    ],
    "sandgate.vm": ["accel", "bzimage", "disk", "image", "launch", "qemu"],
    "sandgate.world": ["fixtures", "homelab", "info", "llm", "loadgen", "servers", "topology"],
    "sandgate.world.servers": [],  # each server is run as its own process (python -m ...)
}  # fmt: skip

# Names the claims part re-exports; every other part's __all__ lists its modules.
API_PARTS = {"sandgate.session.claims", "sandgate.world.servers"}

# What a pure part must never import: sockets, event loops, the kernel, the parts that use them.
IO_MODULES = {
    "asyncio", "selectors", "socket", "socketserver", "ssl", "subprocess", "pyroute2",
    "nftables", "h11", "h2",
}  # fmt: skip


@dataclass(frozen=True)
class Rule:
    source: str  # a module or a part (a prefix ending at a dot)
    target: str
    why: str


NEVER = [
    Rule("sandgate.policy", "sandgate.net", "policy/ is pure: no kernel"),
    Rule("sandgate.policy", "sandgate.gateway", "policy/ is pure: no daemon"),
    Rule("sandgate.policy", "sandgate.sandbox", "policy/ is pure: no processes"),
    Rule("sandgate.policy", "sandgate.session", "policy/ is pure"),
    Rule("sandgate.policy", "sandgate.world", "policy/ is pure"),
    Rule("sandgate.export", "sandgate.net", "export/ is pure: policy in, documents out"),
    Rule("sandgate.export", "sandgate.gateway", "export/ is pure"),
    Rule("sandgate.export", "sandgate.session", "export/ is pure"),
    Rule("sandgate", "sandgate.cli", "nothing below the CLI imports it"),
    Rule("sandgate.net", "sandgate.gateway", "kernel plumbing knows no daemon"),
    Rule("sandgate.events", "sandgate.gateway", "the event schema knows no daemon"),
    Rule("sandgate.gateway", "sandgate.session", "the gateway runs no sessions"),
    Rule("sandgate.gateway", "sandgate.world", "production code imports no test world"),
    Rule("sandgate.gateway.proxy", "sandgate.gateway.server", "the proxy is handed lookups"),
    Rule("sandgate.gateway.logs", "sandgate.gateway.server", "the log readers are handed a sink"),
    Rule("sandgate.gateway.dns", "sandgate.gateway.server", "the resolver: lookups"),
    Rule("sandgate.gateway.selfcheck", "sandgate.gateway.server", "a Protocol of what it needs"),
    Rule("sandgate.agents", "sandgate.session", "agents are data the runner runs"),
    Rule("sandgate.world", "sandgate.agents", "the test world is handed its script"),
]

# Services of the daemon: what each may import from gateway/ (anything else there is the daemon).
SERVICES = {
    "sandgate.gateway.proxy": ("sandgate.gateway.proxy",),
    "sandgate.gateway.logs": ("sandgate.gateway.logs",),
    "sandgate.gateway.dns": ("sandgate.gateway.dns",),
}

# Import circles between modules (lazy imports included), each with the reason it stays.
CIRCLES = [
    # The registry names the real frameworks (lazily, to build hermes's spec); frameworks take
    # the prompt file and the task marker from it. One part; no runtime circle.
    ["sandgate.agents.frameworks", "sandgate.agents.registry"],
    # h11 and h2 serving of the test world's servers hand requests to each other. One part.
    ["sandgate.world.servers.http2", "sandgate.world.servers.httpio"],
]

# Imports that break a rule today, each with the reason it stays (empty: none).
KNOWN: dict[tuple[str, str], str] = {
    # The entry point `python -m sandgate` is the CLI itself, not something below it.
    ("sandgate.__main__", "sandgate.cli"): "the entry point",
    # A gateway VM's ruleset must be the daemon's own compiler's, not a copy (issue 10);
    # net/handed.py is pure (policy in, nftables JSON out).
    ("sandgate.export.gatewayvm", "sandgate.net.handed"): "the daemon's own compiler",
}


def _modules() -> dict[str, Path]:
    out = {}
    for path in sorted(SRC.rglob("*.py")):
        parts = path.relative_to(SRC.parent).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        out[name] = path
    return out


MODULES = _modules()


def imports_of(name: str, path: Path) -> set[str]:
    """Every module ``name`` imports (``from pkg import mod`` counts as ``pkg.mod``)."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, *([base] if base else [])])
            found.add(base)
            found.update(f"{base}.{a.name}" for a in node.names if f"{base}.{a.name}" in MODULES)
    return found


def _under(module: str, part: str) -> bool:
    return module == part or module.startswith(part + ".")


def _broken(rule: Rule) -> list[tuple[str, str]]:
    return sorted(
        (name, target)
        for name, path in MODULES.items()
        if _under(name, rule.source) and not _under(name, rule.target)
        for target in imports_of(name, path)
        if _under(target, rule.target)
    )


@pytest.mark.parametrize("part", sorted(EXPORTS))
def test_each_part_pins_its_all(part: str) -> None:
    module = importlib.import_module(part)
    assert sorted(module.__all__) == sorted(EXPORTS[part])
    assert len(set(module.__all__)) == len(module.__all__)
    if part not in API_PARTS:
        folder = Path(module.__file__ or "").parent
        children = {p.stem for p in folder.glob("*.py") if p.name != "__init__.py"}
        children |= {p.parent.name for p in folder.glob("*/__init__.py")}
        assert set(module.__all__) == children, "a part's __all__ names all its modules"


def test_every_part_is_pinned() -> None:
    packages = {name for name, path in MODULES.items() if path.name == "__init__.py"}
    assert packages - {"sandgate"} == set(EXPORTS)


@pytest.mark.parametrize("rule", NEVER, ids=lambda r: f"{r.source}->{r.target}")
def test_forbidden_import_directions(rule: Rule) -> None:
    broken = [edge for edge in _broken(rule) if edge not in KNOWN]
    assert not broken, f"{rule.why}: {broken}"


@pytest.mark.parametrize("service", sorted(SERVICES))
def test_services_import_nothing_from_the_daemon(service: str) -> None:
    allowed = SERVICES[service]
    bad = sorted(
        (name, target)
        for name, path in MODULES.items()
        if _under(name, service)
        for target in imports_of(name, path)
        if _under(target, "sandgate.gateway")
        and target not in ("sandgate.gateway",)
        and not any(_under(target, a) for a in allowed)
    )
    assert not bad, f"{service} is handed a sink and lookups, never the daemon: {bad}"


def test_no_import_circles_but_the_known() -> None:
    graph = {
        name: {t for t in imports_of(name, path) if t in MODULES and t != name}
        for name, path in MODULES.items()
    }
    assert sorted(_circles(graph)) == sorted(CIRCLES)


def _circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for root, targets in graph.items():
        if root in index:
            continue
        work = [(root, iter(sorted(targets)))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, edges = work[-1]
            nxt = next(edges, None)
            if nxt is not None:
                if nxt not in index:
                    index[nxt] = low[nxt] = len(index)
                    stack.append(nxt)
                    on_stack.add(nxt)
                    work.append((nxt, iter(sorted(graph[nxt]))))
                elif nxt in on_stack:
                    low[node] = min(low[node], index[nxt])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


@pytest.mark.parametrize("part", ["sandgate.policy", "sandgate.export"])
def test_pure_parts_import_no_io(part: str) -> None:
    bad = sorted(
        (name, target)
        for name, path in MODULES.items()
        if _under(name, part)
        for target in imports_of(name, path)
        if target.split(".")[0] in IO_MODULES
    )
    assert not bad, f"{part} is pure (no sockets, no kernel): {bad}"


def test_known_exceptions_still_exist() -> None:
    # An exception that no longer happens is deleted here, so the list stays the truth.
    edges = {(n, t) for n, p in MODULES.items() for t in imports_of(n, p)}
    assert set(KNOWN) <= edges


def test_the_reader_sees_imports_everywhere(tmp_path: Path) -> None:
    # The checker itself: lazy, TYPE_CHECKING and from-package imports are all seen.
    source = (
        "from typing import TYPE_CHECKING\n"
        "if TYPE_CHECKING:\n    from sandgate.gateway.server import Gateway\n"
        "def f():\n    import socket\n    from sandgate.gateway import manage\n"
    )
    path = tmp_path / "probe.py"
    path.write_text(source)
    found = imports_of("sandgate.net.probe", path)
    assert {"sandgate.gateway.server", "socket", "sandgate.gateway.manage"} <= found
