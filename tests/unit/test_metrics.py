"""The Prometheus text format (report/metrics.py), checked with prometheus_client's own parser."""

from __future__ import annotations

import math

import pytest
from prometheus_client.parser import text_string_to_metric_families

from sandgate.report.metrics import (
    Family,
    dashboard_families,
    escape_help,
    escape_label,
    exposition,
    format_value,
    gateway_families,
)

NASTY = 'a\\b"c\nd} x="y'

REPLY = {
    "ok": True,
    "sites": [
        {"profile": "coder", "rule": "allow[0]", "verdict": "allow", "reason": "allow.rule",
         "packets": 12},
        {"profile": "gateway", "rule": None, "verdict": "deny", "reason": "deny.default",
         "packets": 3},
    ],
    "events": [["dns", "allow", "allow.rule", "DNS", 4],
               ["conn", "deny", "deny.private", "TCP", 2]],
    "guests": 1,
    "questions": 4,
    "attributed": 2,
    "unattributed": 1,
    "nflog_lost": 0,
    "queues": {"attribution": 0, "store": 5, "watch": 0},
    "watchers": 1,
}  # fmt: skip


def parsed(text: str) -> dict[str, list[tuple[dict[str, str], float]]]:
    return {
        f.name: [(s.labels, s.value) for s in f.samples]
        for f in text_string_to_metric_families(text)
    }


def test_escaping() -> None:
    assert escape_label(NASTY) == 'a\\\\b\\"c\\nd} x=\\"y'
    assert escape_help('say "hi"\\\nbye') == 'say "hi"\\\\\\nbye'


def test_label_values_survive_the_parser() -> None:
    f = Family("sandgate_x_total", "counter", 'help with "quotes" and\nnewline')
    f.add(3, reason=NASTY, rule=None)
    text = exposition([f])
    assert text.endswith("\n")
    assert text.splitlines()[:2] == [
        '# HELP sandgate_x_total help with "quotes" and\\nnewline',
        "# TYPE sandgate_x_total counter",
    ]
    assert parsed(text)["sandgate_x"] == [({"reason": NASTY, "rule": ""}, 3.0)]


def test_help_and_type_once_per_family_before_its_samples() -> None:
    text = exposition([*gateway_families(REPLY, "test"), *dashboard_families({"clients": 2})])
    lines = text.splitlines()
    names = [ln.split()[2] for ln in lines if ln.startswith("# TYPE")]
    assert len(names) == len(set(names))
    for name in names:
        at = lines.index(next(ln for ln in lines if ln.startswith(f"# TYPE {name} ")))
        assert lines[at - 1].startswith(f"# HELP {name} ")
        samples = [i for i, ln in enumerate(lines) if ln.split("{")[0].split(" ")[0] == name]
        assert all(i > at for i in samples)
    families = parsed(text)
    assert ({"instance": "test", "profile": "coder", "rule": "allow[0]", "verdict": "allow",
             "reason": "allow.rule"}, 12.0) in families["sandgate_site_packets"]  # fmt: skip
    assert ({"instance": "test", "profile": "gateway", "rule": "", "verdict": "deny",
             "reason": "deny.default"}, 3.0) in families["sandgate_site_packets"]  # fmt: skip
    assert ({"instance": "test", "kind": "conn", "verdict": "deny", "reason": "deny.private",
             "category": "TCP"}, 2.0) in families["sandgate_events"]  # fmt: skip
    assert families["sandgate_gateway_up"] == [({"instance": "test"}, 1.0)]
    assert ({"instance": "test", "queue": "store"}, 5.0) in families["sandgate_queue_depth"]
    assert families["sandgate_dashboard_clients"] == [({}, 2.0)]


def test_a_gateway_not_answering_is_up_0_only() -> None:
    assert parsed(exposition(gateway_families(None, "main"))) == {
        "sandgate_gateway_up": [({"instance": "main"}, 0.0)]
    }


@pytest.mark.parametrize(
    ("name", "kind"),
    [("9bad", "gauge"), ("has-dash", "gauge"), ("x", "histogram"), ("no_suffix", "counter")],
)
def test_bad_families_cannot_be_made(name: str, kind: str) -> None:
    with pytest.raises(ValueError):
        Family(name, kind, "h")


@pytest.mark.parametrize("label", ["__reserved", "9x", "a-b", ""])
def test_bad_label_names_cannot_be_added(label: str) -> None:
    f = Family("sandgate_y", "gauge", "h")
    with pytest.raises(ValueError):
        f.add(1, **{label: "v"})


def test_a_name_twice_is_refused() -> None:
    with pytest.raises(ValueError, match="twice"):
        exposition([Family("a", "gauge", "h"), Family("a", "gauge", "h")])


@pytest.mark.parametrize(
    ("value", "text"),
    [(3, "3"), (0.25, "0.25"), (math.nan, "NaN"), (math.inf, "+Inf"), (-math.inf, "-Inf"),
     (2.0**60, "1.152921504606847e+18")],
)  # fmt: skip
def test_values(value: float, text: str) -> None:
    assert format_value(value) == text
