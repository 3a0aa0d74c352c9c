"""The Prometheus text exposition format (version 0.0.4), and the gateway's metrics in it.

Pure: ``families(reply, dashboard)`` turns the control socket's ``metrics`` reply (exact totals
since the gateway started, gateway/server.py) and the dashboard's own health into families;
``exposition(families)`` writes them. Served at ``/metrics`` by report/dashboard.py.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
_NAME = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*")
_LABEL = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]*")
TYPES = ("counter", "gauge", "untyped")


@dataclass(frozen=True)
class Sample:
    labels: tuple[tuple[str, str], ...]
    value: float

    def __post_init__(self) -> None:
        for name, _ in self.labels:
            if not _LABEL.fullmatch(name) or name.startswith("__"):
                raise ValueError(f"not a Prometheus label name: {name!r}")


@dataclass(frozen=True)
class Family:
    name: str
    type: str
    help: str
    samples: list[Sample] = field(default_factory=list)

    def __post_init__(self) -> None:
        if not _NAME.fullmatch(self.name):
            raise ValueError(f"not a Prometheus metric name: {self.name!r}")
        if self.type not in TYPES:
            raise ValueError(f"not a metric type: {self.type!r}")
        if self.type == "counter" and not self.name.endswith("_total"):
            raise ValueError(f"a counter's name ends in _total: {self.name!r}")

    def add(self, value: float, **labels: object) -> None:
        self.samples.append(
            Sample(tuple((k, "" if v is None else str(v)) for k, v in labels.items()), value)
        )


def escape_label(value: str) -> str:
    """A label value inside double quotes: backslash, double quote and newline escaped."""
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def escape_help(text: str) -> str:
    """A HELP text: backslash and newline escaped (quotes stay)."""
    return text.replace("\\", "\\\\").replace("\n", "\\n")


def format_value(value: float) -> str:
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    if float(value).is_integer() and abs(value) < 2**53:
        return str(int(value))
    return repr(float(value))


def exposition(families: Iterable[Family]) -> str:
    lines: list[str] = []
    seen: set[str] = set()
    for f in families:
        if f.name in seen:  # one HELP/TYPE block per name, or the scrape fails
            raise ValueError(f"metric {f.name!r} twice")
        seen.add(f.name)
        lines.append(f"# HELP {f.name} {escape_help(f.help)}")
        lines.append(f"# TYPE {f.name} {f.type}")
        for s in f.samples:
            labels = ",".join(f'{k}="{escape_label(v)}"' for k, v in s.labels)
            lines.append(
                f"{f.name}{{{labels}}} {format_value(s.value)}"
                if labels
                else f"{f.name} {format_value(s.value)}"
            )
    return "\n".join(lines) + "\n"


def gateway_families(reply: Mapping[str, Any] | None, instance: str) -> list[Family]:
    """The gateway's exact counters and health from its ``metrics`` reply (None: not answering)."""
    up = Family("sandgate_gateway_up", "gauge", "1 when the gateway answered this scrape")
    up.add(1 if reply is not None else 0, instance=instance)
    if reply is None:
        return [up]
    sites = Family(
        "sandgate_site_packets_total",
        "counter",
        "Packets judged at each nftables site since the gateway started (exact; the event log "
        "of drops is rate-limited), per profile, rule, verdict and reason",
    )
    for s in reply.get("sites", []):
        sites.add(
            s["packets"],
            instance=instance,
            profile=s.get("profile"),
            rule=s.get("rule"),
            verdict=s.get("verdict"),
            reason=s.get("reason"),
        )
    events = Family(
        "sandgate_events_total",
        "counter",
        "Events the gateway logged (counting folded repeats), per kind, verdict, reason and "
        "category",
    )
    for kind, verdict, reason, category, n in reply.get("events", []):
        events.add(
            n, instance=instance, kind=kind, verdict=verdict, reason=reason, category=category
        )
    out = [up, sites, events]
    for key, name, kind, text in (
        ("questions", "sandgate_dns_questions_total", "counter", "DNS questions answered"),
        ("attributed", "sandgate_attributed_total", "counter", "Flows traced to their sender"),
        (
            "unattributed",
            "sandgate_unattributed_total",
            "counter",
            "Flows logged without a sender (it was not found in time)",
        ),
        (
            "nflog_lost",
            "sandgate_nflog_lost_total",
            "counter",
            "Kernel log records lost to a full receive buffer (the counters stay exact)",
        ),
        ("guests", "sandgate_guests", "gauge", "Guests on the gateway"),
        ("watchers", "sandgate_watchers", "gauge", "Clients streaming the gateway's events"),
    ):
        f = Family(name, kind, text)
        f.add(float(reply.get(key) or 0), instance=instance)
        out.append(f)
    queues = Family("sandgate_queue_depth", "gauge", "Items waiting in the gateway's queues")
    for queue, depth in sorted((reply.get("queues") or {}).items()):
        queues.add(depth, instance=instance, queue=queue)
    out.append(queues)
    return out


def dashboard_families(health: Mapping[str, float]) -> list[Family]:
    """The dashboard's own health (report/dashboard.py's ``Health``)."""
    rows = (
        (
            "events_per_second",
            "sandgate_events_per_second",
            "gauge",
            "Events streamed from the gateway per second, over the last 10 seconds",
        ),
        (
            "watch_connected",
            "sandgate_dashboard_watch_connected",
            "gauge",
            "1 while the dashboard is streaming the gateway's events",
        ),
        ("clients", "sandgate_dashboard_clients", "gauge", "Browsers streaming live events"),
        (
            "streamed",
            "sandgate_dashboard_events_total",
            "counter",
            "Events received from the gateway's stream",
        ),
        (
            "dropped_clients",
            "sandgate_dashboard_slow_clients_total",
            "counter",
            "Browsers cut off because they did not keep up",
        ),
        (
            "refused",
            "sandgate_dashboard_refused_total",
            "counter",
            "Requests refused for want of a token",
        ),
        ("requests", "sandgate_dashboard_requests_total", "counter", "HTTP requests served"),
    )
    out = []
    for key, name, kind, text in rows:
        f = Family(name, kind, text)
        f.add(float(health.get(key, 0)))
        out.append(f)
    return out


__all__ = [
    "CONTENT_TYPE",
    "Family",
    "Sample",
    "dashboard_families",
    "escape_help",
    "escape_label",
    "exposition",
    "format_value",
    "gateway_families",
]
