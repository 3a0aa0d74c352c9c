"""The throughput benches' paired method (bench/throughput.py, bench/proxy.py): a row's ratio
is the median of the per-pair ratios (each pair taken back to back), not the ratio of two
medians taken minutes apart, and CPU is charged per GB to the side that spent it."""

from __future__ import annotations

from typing import Any

import pytest
from bench import proxy, throughput
from bench.common import Sample, Sampler, paired
from bench.proxy_agents import Step


def run(mb_s: float, cpu: float, ok: bool = True) -> dict[str, Any]:
    return {"MB_s": mb_s, "cpu_s_per_GB": cpu, "ok": ok}


# The machine halves its speed after the second pair, and the third pair straddles the change
# (sandgate's side fast, the kernel's slow): within every other pair the sandgate side is 0.9x
# the kernel side. The medians of the two sides come from different halves of the run.
OURS = [run(900, 1.1), run(900, 1.1), run(900, 1.1), run(450, 1.1), run(450, 1.1)]
PEER = [run(1000, 1.0), run(1000, 1.0), run(500, 1.0), run(500, 1.0), run(500, 1.0)]


def test_ratio_is_the_median_of_pairs_not_of_medians() -> None:
    pairs = paired(OURS, PEER)
    assert pairs["ratio"] == pytest.approx(0.9)
    assert pairs["ratio_p10"] == pytest.approx(0.9)
    assert pairs["ratio_p90"] == pytest.approx(1.44)  # the straddling pair shows in the spread
    # the old method's figure, for contrast: median 900 / median 500
    old = throughput.median([r["MB_s"] for r in OURS]) / throughput.median(
        [r["MB_s"] for r in PEER]
    )
    assert old == pytest.approx(1.8)
    assert pairs["added_cpu_s_per_GB"] == pytest.approx(0.1)


def test_proxy_pairs_agree_and_skip_failed_rounds() -> None:
    assert proxy.pairs({"runs": OURS}, {"runs": PEER})["ratio"] == pytest.approx(0.9)
    broken = [*OURS[:4], run(0, 9.9, ok=False)]
    got = proxy.pairs({"runs": broken}, {"runs": PEER})
    assert len(got["ratios"]) == 4
    assert got["added_cpu_s_per_GB"] == pytest.approx(0.1)
    assert proxy.pairs({"runs": OURS[:4]}, {"runs": PEER}) == {}  # rounds must line up


def sampler(server_s: float, gateway_s: float) -> Sampler:
    """Two samples 1 s apart: the server and the gateway spent this much CPU between them."""
    s = Sampler({"bulk": 1, "gateway": 2})
    s.samples = [
        Sample(100.0, 0.0, 0.0, 0.0, {"bulk": (0.0, 0.0), "gateway": (0.0, 0.0)}),
        Sample(101.0, 100.0, 30.0, 200.0, {"bulk": (server_s, 0.0), "gateway": (gateway_s, 0.0)}),
    ]
    return s


def step(out: str, cpu: float) -> Step:
    return Step(1, "bulk", "direct.kernel", 100.0, 101.0, 1.0, cpu, out, "")


@pytest.mark.parametrize(
    ("out", "mb_s", "ok"),
    [
        ("500000000 0.5 0.002\n", 1000.0, True),  # one stream: curl's own time
        ("500000000 0.9 0.002\n500000000 0.8 0.003\n", 1000.0, True),  # two: the step's wall
        ("1000 0.5 0.002\n", 0.002, False),  # short: not a whole transfer
    ],
)
def test_judge_step(out: str, mb_s: float, ok: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(throughput, "SIZE", 500_000_000 if ok else 1 << 20)
    got = throughput.judge_step(step(out, cpu=0.8), sampler(0.1, 0.05), "bulk")
    assert got["MB_s"] == pytest.approx(mb_s)
    assert got["ok"] is ok
    gb = sum(int(line.split()[0]) for line in out.splitlines()) / 1e9
    # ours: curl's 0.8 s, the server's 0.1, the gateway's 0.05, per GB moved
    assert got["cpu_s_per_GB"] == pytest.approx(0.95 / gb)
    assert got["cpu_s_per_GB_by"]["client"] == pytest.approx(0.8 / gb)
    assert got["cores"]["client"] == pytest.approx(0.8)


def test_client_bound_is_said() -> None:
    runs = [
        {**run(1000, 1.0), "cores": {"client": c, "server": 0.1, "gateway": 0.0, "softirq": 0.3,
         "all": 1.2}, "cpu_s_per_GB_by": {"client": 1.0, "server": 0.1, "gateway": 0.0,
         "softirq": 0.3, "all": 1.2}, "error": "", "setup_ms": 1.0}
        for c in (0.95, 0.97, 0.5)
    ]  # fmt: skip
    got = throughput.side_summary(runs)
    assert got["client_bound"]
    assert got["limit"].startswith("client-bound: curl 0.95")
    assert not throughput.side_summary(runs[2:])["client_bound"]


def test_proxy_rounds_pair_the_kernel_paths_back_to_back() -> None:
    def spec(key: str) -> proxy.PathSpec:
        return proxy.PathSpec(key, key, "cl", (), None, None)

    specs = [spec(k) for k in ("source", "kernel", "mitm-pass", "sg-kernel", "srt")]
    firsts = []
    for r in range(4):
        keys = [p.key for p in proxy.round_order(specs, r)]
        assert sorted(keys) == sorted(p.key for p in specs)  # every path once a round
        i = keys.index("kernel")
        assert "sg-kernel" in (keys[i - 1 : i] + keys[i + 1 : i + 2])  # neighbours
        firsts.append(min(("kernel", "sg-kernel"), key=keys.index))
    assert firsts == ["kernel", "sg-kernel"] * 2
    assert [p.key for p in proxy.round_order([spec("kernel")], 1)] == ["kernel"]
