"""Limits as data: sizes, CPU counts, the layering run > profile > defaults, the policy table."""

from __future__ import annotations

import pytest

from sandgate.errors import PolicyError
from sandgate.policy.limits import (
    DEFAULT_PIDS,
    LimitError,
    Limits,
    format_size,
    parse_cpus,
    parse_pids,
    parse_size,
)
from sandgate.policy.load import parse_policy

MiB, GiB = 1 << 20, 1 << 30


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("256M", 256 * MiB),
        ("2G", 2 * GiB),
        ("2g", 2 * GiB),
        ("1.5G", 3 * GiB // 2),
        ("512MiB", 512 * MiB),
        ("512MB", 512 * MiB),
        ("1024K", MiB),
        ("1T", 1 << 40),
        (" 64M ", 64 * MiB),
        (str(MiB), MiB),  # bytes
        (8 * MiB, 8 * MiB),  # a TOML integer
    ],
)
def test_sizes(text: str | int, expected: int) -> None:
    assert parse_size(text) == expected


@pytest.mark.parametrize(
    "text", ["", "M", "2X", "-1G", "1e9", "lots", "2 G B", "512K", "1023K", "100", True]
)
def test_bad_sizes_are_refused(text: str | int) -> None:
    with pytest.raises(LimitError):
        parse_size(text)


def test_cpus_and_pids() -> None:
    assert parse_cpus("1.5") == 1.5 and parse_cpus(2) == 2.0
    for bad in ("0", "-1", "many", "2000"):
        with pytest.raises(LimitError):
            parse_cpus(bad)
    assert parse_pids("512") == 512
    for bad in ("0", "7", "1.5", "lots"):
        with pytest.raises(LimitError):
            parse_pids(bad)


def test_format_size() -> None:
    assert format_size(256 * MiB) == "256M"
    assert format_size(2 * GiB) == "2G"
    assert format_size(12638251008) == "11.77G"


def test_run_over_profile_over_defaults() -> None:
    run = Limits(pids=200)
    profile = Limits(pids=512, memory=2 * GiB)
    assert run.over(profile).with_defaults(16 * GiB) == Limits(200, 2 * GiB, None)
    assert Limits().over(Limits()).with_defaults(16 * GiB) == Limits(DEFAULT_PIDS, 8 * GiB, None)
    assert Limits(cpus=1.5).with_defaults(4 * GiB).cpus == 1.5


POLICY = b"""\
[profiles.coder]
internet = "open"

[profiles.coder.limits]
pids = 512
memory = "2G"
cpus = 1.5
"""


def test_profile_limits_table() -> None:
    spec = parse_policy(POLICY, "p.toml").file.profiles["coder"].limits
    assert spec.limits() == Limits(512, 2 * GiB, 1.5)


def test_profile_without_limits_has_none_set() -> None:
    text = b'[profiles.coder]\ninternet = "open"\n'
    assert parse_policy(text, "p.toml").file.profiles["coder"].limits.limits() == Limits()


def test_bad_limits_are_reported_with_their_lines() -> None:
    bad = POLICY.replace(b'"2G"', b'"2X"').replace(b"1.5", b"0").replace(b"pids = 512", b"pid = 5")
    with pytest.raises(PolicyError) as info:
        parse_policy(bad, "p.toml")
    lines = sorted(p.line for p in info.value.problems if p.line is not None)
    assert lines == [5, 6, 7], [str(p) for p in info.value.problems]
    assert any("2X" in p.message for p in info.value.problems)


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["--memory", "lots"], "write a size such as 256M or 2G"),
        (["--memory", "10K"], "less than 1M"),
        (["--pids", "many"], "whole number of processes"),
        (["--cpus", "0"], "between 0.01 and 1024"),
    ],
)
def test_a_bad_limit_on_the_command_line_is_a_clear_error(args: list[str], says: str) -> None:
    from typer.testing import CliRunner

    from sandgate.cli import app

    result = CliRunner().invoke(app, ["run", *args, "--", "true"])
    assert result.exit_code == 2
    assert says in " ".join(result.output.split()), result.output
    assert args[0] in result.output
