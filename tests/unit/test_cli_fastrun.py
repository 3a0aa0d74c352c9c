"""`python -m sandgate run`'s fast path (sandgate/runcli.py) against typer's parser (cli.py).

Both parsers read the same argv; where the fast one takes it, the body must be handed exactly
what typer hands it (values and types). Where it does not (None), typer runs as it always has,
so every error and --help stays typer's own. The option table must be typer's list of options.
"""

from __future__ import annotations

import contextlib
import io
import subprocess
import sys
import typing
from pathlib import Path
from typing import Any

import pytest
import typer.main
from hypothesis import given, settings
from hypothesis import strategies as st

from sandgate import cli, runcli

COMMAND = typer.main.get_command(cli.app)


def typer_kwargs(argv: list[str], monkeypatch: pytest.MonkeyPatch) -> dict[str, Any] | None:
    """What typer hands the body for ``sandgate run ARGV`` (None: it stopped before)."""
    got: list[dict[str, Any]] = []

    def body(**kwargs: Any) -> int:
        got.append(kwargs)
        return 0

    with (
        monkeypatch.context() as m,
        contextlib.redirect_stdout(io.StringIO()),
        contextlib.redirect_stderr(io.StringIO()),
        contextlib.suppress(Exception, SystemExit),
    ):
        m.setattr(runcli, "run_command", body)
        COMMAND.main(["run", *argv], prog_name="sandgate", standalone_mode=False)
    return got[0] if got else None


def same(fast: dict[str, Any], slow: dict[str, Any]) -> None:
    assert fast.keys() == slow.keys()
    for key, value in fast.items():
        assert (type(value), value) == (type(slow[key]), slow[key]), key


# Values for each option kind: ones typer takes, and spellings the fast path must leave to it.
VALUES = {
    "str": ["x", "a b", "2G", "locked", "bogus", "", "-x", "--json", "="],
    "multi": ["pypi.org", "X=1", "NOEQ", "", "-x"],
    "path": ["w", "/tmp", "./a b", "", "-w"],
    "int": ["5", "0012", "61000", "-1", "+3", "1.5", "x", "", " 7"],
    "float": ["1", "1.5", "0.25", "1e3", "inf", "nan", "-2", ".5", "5.", "x", ""],
}


def spellings(opt: runcli.Option, value: str) -> list[list[str]]:
    out = []
    for name in opt.names:
        if opt.kind == "flag":
            out += [[name], [name, name], [f"{name}={value}"]]
        else:
            out += [[name, value], [name]]
            if name.startswith("--"):
                out.append([f"{name}={value}"])
    return out


SINGLE = [
    argv
    for opt in runcli.OPTIONS
    for value in VALUES.get(opt.kind, ["x"])
    for argv in spellings(opt, value)
]
TAILS = [["--", "true"], ["true"], ["--", "--json", "x"], ["sh", "-c", "exit 3"], [], ["--"]]


def test_the_table_is_typers_list_of_run_options() -> None:
    params = [p for p in COMMAND.commands["run"].params if p.name != "command"]  # type: ignore[attr-defined]
    hints = typing.get_type_hints(cli.run)
    assert [o.dest for o in runcli.OPTIONS] == [p.name for p in params]
    for opt, p in zip(runcli.OPTIONS, params, strict=True):
        assert opt.names == tuple(p.opts) and not p.secondary_opts, opt
        assert opt.default == p.default, opt
        hint = typing.get_args(hints[opt.dest]) or (hints[opt.dest],)
        base = next(a for a in hint if a is not type(None))
        kinds = {str: "str", Path: "path", int: "int", float: "float", bool: "flag"}
        assert opt.kind == ("multi" if p.multiple else kinds[base]), opt
    fast = typing.get_type_hints(runcli.run_command)
    assert list(fast) == ["command", *[o.dest for o in runcli.OPTIONS], "return"]


@pytest.mark.parametrize("tail", TAILS, ids=" ".join)
def test_every_option_alone(tail: list[str], monkeypatch: pytest.MonkeyPatch) -> None:
    taken = 0
    for argv in SINGLE:
        fast = runcli.parse_run([*argv, *tail])
        if fast is None:
            continue
        slow = typer_kwargs([*argv, *tail], monkeypatch)
        assert slow is not None, argv
        same(fast, slow)
        taken += 1
    assert taken > (len(SINGLE) // 3 if tail and tail != ["--"] else -1)


def test_the_usual_runs_take_the_fast_path(monkeypatch: pytest.MonkeyPatch) -> None:
    for argv in (
        ["--instance", "I", "-q", "--", "true"],
        ["--instance=I", "--json", "--timings", "--", "true"],
        ["--world", "test", "--mode", "locked", "--", "curl", "-sS", "https://example.com/"],
        ["-p", "homelab.toml", "--profile", "coder", "--", "bash"],
        ["--pids", "512", "--memory", "2G", "--cpus", "1.5", "--", "make", "test"],
        ["--allow", "pypi.org", "--allow", "10.0.0.1:22/tcp", "-e", "A=1", "--uid", "61001",
         "--timeout", "30", "--workdir", "/tmp", "--disk", "2G", "pip", "install", "x"],
        ["--ask", "--", "pip", "install", "requests"],
        ["--policy", "a.toml", "--policy", "b.toml", "-q", "-q", "--", "x"],  # the last one
    ):  # fmt: skip
        fast = runcli.parse_run(argv)
        assert fast is not None, argv
        slow = typer_kwargs(argv, monkeypatch)
        assert slow is not None
        same(fast, slow)


def test_help_and_errors_are_left_to_typer() -> None:
    for argv in (
        ["--help"], ["--instance", "I", "--help", "--", "true"], ["-h", "true"], ["--bogus", "x"],
        ["-qe", "A=1", "true"], ["-pfile", "true"], ["--json=1", "true"], ["--uid", "x", "true"],
        ["--instance"], ["-q"], [], ["--timeout", "1e3", "true"], ["--polic", "x", "true"],
    ):  # fmt: skip
        assert runcli.parse_run(argv) is None, argv


def test_a_bad_value_goes_back_to_typer_before_anything_is_made(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from sandgate.session import runner

    def never(opts: Any) -> Any:
        raise AssertionError("the session started")

    monkeypatch.setattr(runner, "run", never)
    for argv in (
        ["--mode", "bogus"], ["--world", "mars"], ["-e", "NOEQ"], ["--disk", "1K"],
        ["--pids", "x"], ["--nic", "none"], ["--keep-writes"], ["--fixtures", "/nonexistent"],
        ["--image", "d.qcow2"],
    ):  # fmt: skip
        assert runcli.fast_main(["run", *argv, "--", "true"]) is None, argv


TOKENS = st.sampled_from(
    ["--instance", "I", "-q", "--json", "--allow", "a.example", "-e", "K=V", "--uid", "7",
     "--timeout", "2.5", "--", "true", "-p", "f.toml", "--disk=2G", "--vm", "--nic", "tap",
     "--workdir", "w", "--timings", "-m", "open", "--env=X=1", "--copy-links", "x", "-"]
)  # fmt: skip


@settings(max_examples=150, deadline=None)
@given(st.lists(TOKENS, max_size=10))
def test_random_argv(argv: list[str]) -> None:
    fast = runcli.parse_run(argv)
    if fast is None:
        return
    with pytest.MonkeyPatch.context() as m:
        slow = typer_kwargs(argv, m)
    assert slow is not None, argv
    same(fast, slow)


def test_the_fast_path_imports_neither_typer_nor_pydantic() -> None:
    # What each cost a run on this machine (2026-12-01): pydantic ~115 ms CPU, typer ~45, rich
    # ~25, zipfile ~15 (world fixtures), concurrent.futures ~12 (logging), statistics ~8;
    # (2026-12-02) the world's builder ~6, the report ~6, the claim model ~5, traceback ~3,
    # difflib ~1.5 (a drift diff is made only where something changed); secrets ~2.5 (random,
    # hmac: the names' random parts are os.urandom's), typing ~4 (sandgate.TYPE_CHECKING).
    heavy = (
        "typer", "pydantic", "rich", "zipfile", "concurrent.futures", "statistics",
        "sandgate.world.topology", "sandgate.report.session", "sandgate.session.claims", "difflib",
        "traceback", "secrets", "random", "hmac", "typing",
    )  # fmt: skip
    code = (
        f"HEAVY = {heavy!r}; "
        "import sys; from sandgate import runcli; import sandgate.session.runner; "
        "assert runcli.parse_run(['--instance', 'I', '-q', '--', 'true']); "
        "print(sorted(m for m in HEAVY if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_what_a_run_loads_has_its_own_docstrings_and_no_classvar() -> None:
    # A dataclass without a docstring gets one made at import from inspect.signature of the
    # class: ~0.15 ms each, ~4 ms a run for the 26 a run loaded (2026-12-02). And with typing
    # not loaded, dataclasses cannot tell a ClassVar annotation from a field: none may have one.
    code = (
        "import dataclasses, sys; from sandgate import runcli; import sandgate.session.runner, "
        "sandgate.session.retention, sandgate.events.ocsf; "
        "made = [c for m in list(sys.modules.values()) if m.__name__.startswith('sandgate') "
        "for c in vars(m).values() if isinstance(c, type) and c.__module__ == m.__name__ "
        "and dataclasses.is_dataclass(c)]; "
        "print(len(made), sorted(c.__name__ for c in made "
        "if (c.__doc__ or '').startswith(c.__name__ + '(') "
        "or any('ClassVar' in str(a) for a in vars(c).get('__annotations__', {}).values())))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    count, missing = out.stdout.split(" ", 1)
    assert int(count) > 30
    assert missing.strip() == "[]"
