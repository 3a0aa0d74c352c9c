"""Task files for ``sandgate suite``: the model, the loader, and the checks' pure evaluation.

    [suite]
    name = "report-000"
    modes = ["locked", "open"]      # default modes of every task
    timeout = 120                   # seconds per session
    fixtures = "fixtures"           # folder that task fixtures are relative to

    [[task]]
    id = "H04"
    prompt = "Convert people.csv to people.json (a list of objects)."
    fixtures = "H04"                # copied into the fresh /work
    home = "homes/pip-broken"       # optional: copied into the fresh agent home
    check = [
      { file = "people.json", pattern = '"name": "Ada"' },
      { answer = "(?i)unreachable", modes = ["locked"] },
    ]

A check passes when its regular expression is found (``answer``: the agent's final answer;
``output``: everything it printed; ``file`` + ``pattern``: that file in the work dir after the
session; ``file`` alone: the file exists); ``absent = true`` turns it around. A task's outcome
in a mode: every check that applies passes -> pass, some -> partial, none -> fail. Every
mistake in the file is reported with its line before anything runs.
"""

from __future__ import annotations

import difflib
import re
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from sandgate.errors import PolicyError, PolicyProblem
from sandgate.policy.locate import Position, find, locate

Mode = Literal["locked", "open", "allowlist"]
ID_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$"


class CheckSpec(BaseModel):
    model_config = ConfigDict(extra="forbid")

    answer: str | None = None  # regex on the final answer
    output: str | None = None  # regex on everything the agent printed
    file: str | None = None  # a path in the work dir
    pattern: str | None = None  # regex on that file's content
    absent: bool = False  # pass when it is NOT found
    modes: list[Mode] | None = None  # only in these modes
    name: str | None = None  # what the results table calls it

    @model_validator(mode="after")
    def _one_target(self) -> CheckSpec:
        targets = [k for k in ("answer", "output", "file") if getattr(self, k) is not None]
        if len(targets) != 1:
            raise ValueError("a check looks at exactly one of answer, output or file")
        if self.pattern is not None and self.file is None:
            raise ValueError("pattern goes with file (for the answer, write answer = '...')")
        for key in ("answer", "output", "pattern"):
            value = getattr(self, key)
            if value is not None:
                try:
                    re.compile(value)
                except re.error as exc:
                    raise ValueError(f"{key} is not a valid regular expression: {exc}") from None
        if self.file is not None and (self.file.startswith("/") or ".." in Path(self.file).parts):
            raise ValueError("file is a path inside the work dir, e.g. 'out/result.json'")
        return self

    def label(self) -> str:
        if self.name:
            return self.name
        what = (
            f"answer ~ {self.answer}"
            if self.answer is not None
            else f"output ~ {self.output}"
            if self.output is not None
            else f"{self.file}" + (f" ~ {self.pattern}" if self.pattern else " exists")
        )
        return ("not " if self.absent else "") + what


class TaskSpec(BaseModel):
    model_config = ConfigDict(extra="forbid")

    id: Annotated[str, Field(pattern=ID_PATTERN)]
    prompt: Annotated[str, Field(min_length=1)]
    fixtures: str | None = None
    home: str | None = None
    modes: list[Mode] | None = None
    timeout: Annotated[float, Field(gt=0, le=86400)] | None = None
    check: list[CheckSpec] = Field(default_factory=list)
    note: str | None = None  # what the task is about (shown nowhere but the file)


class SuiteSpec(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: str = "suite"
    description: str | None = None
    modes: list[Mode] = Field(default_factory=lambda: list[Mode](["locked", "open"]))
    timeout: Annotated[float, Field(gt=0, le=86400)] = 120
    fixtures: str = "."
    home: str | None = None  # default home template for every task
    world: Literal["test"] = "test"


class TaskFile(BaseModel):
    model_config = ConfigDict(extra="forbid")

    suite: SuiteSpec = Field(default_factory=SuiteSpec)
    task: Annotated[list[TaskSpec], Field(min_length=1)]


@dataclass(frozen=True)
class Task:
    """A task ready to run: paths resolved, modes decided."""

    id: str
    prompt: str
    fixtures: Path | None
    home: Path | None
    modes: tuple[str, ...]
    timeout: float
    checks: tuple[CheckSpec, ...]


@dataclass(frozen=True)
class Suite:
    name: str
    source: Path
    tasks: tuple[Task, ...]


class TaskFileError(PolicyError):
    """A task file that cannot be run: every problem with its line."""


def load_tasks(path: str | Path) -> Suite:
    source = Path(path)
    try:
        text = source.read_bytes()
    except OSError as exc:
        raise TaskFileError(
            [PolicyProblem(str(source), None, None, f"cannot read: {exc.strerror}", None)]
        ) from exc
    return parse_tasks(text, source)


def parse_tasks(text: bytes, source: Path) -> Suite:
    name = str(source)
    try:
        raw = tomllib.loads(text.decode("utf-8"))
    except (UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
        line, col, msg = _syntax_position(exc, text)
        raise TaskFileError(
            [PolicyProblem(name, line, col, f"TOML syntax: {msg}", "fix the syntax there")]
        ) from exc
    positions = locate(text)
    try:
        spec = TaskFile.model_validate(raw)
    except ValidationError as exc:
        problems = [_problem(err, positions, name) for err in exc.errors()]
        problems += _missing_folders(raw, source, positions)
        raise TaskFileError(sorted(problems, key=lambda p: (p.line or 0, p.column or 0))) from None
    return _resolve(spec, source, positions, _missing_folders(raw, source, positions))


def _resolve(
    spec: TaskFile,
    source: Path,
    positions: dict[Any, Position],
    problems: list[PolicyProblem],
) -> Suite:
    """Paths resolved, modes decided, the remaining cross-checks (``problems``: those found
    already, such as missing fixture folders)."""
    base = source.parent

    def at(loc: tuple[str | int, ...], message: str, fix: str | None) -> None:
        pos = find(positions, loc)
        problems.append(
            PolicyProblem(
                str(source), pos[0] if pos else None, pos[1] if pos else None, message, fix
            )
        )

    fixtures_root = base / spec.suite.fixtures
    default_home = base / spec.suite.home if spec.suite.home else None
    if default_home is not None and not default_home.is_dir():
        at(("suite", "home"), f"home template {default_home} is not a directory", "create it")
    seen: set[str] = set()
    tasks: list[Task] = []
    for i, t in enumerate(spec.task):
        if t.id in seen:
            at(("task", i, "id"), f"task id {t.id!r} is used twice", "give each task its own id")
        seen.add(t.id)
        fixtures = fixtures_root / t.fixtures if t.fixtures else None
        home = base / t.home if t.home else default_home
        if t.home and home is not None and not home.is_dir():
            at(("task", i, "home"), f"task {t.id}: home template {home} does not exist", None)
        modes = tuple(t.modes or spec.suite.modes)
        for j, c in enumerate(t.check):
            if c.modes and not set(c.modes) & set(modes):
                at(
                    ("task", i, "check", j, "modes"),
                    f"task {t.id}: this check's modes {c.modes} are not among the task's {modes}",
                    "drop the check or add the mode to the task",
                )
        tasks.append(
            Task(
                id=t.id,
                prompt=t.prompt,
                fixtures=fixtures,
                home=home,
                modes=modes,
                timeout=t.timeout or spec.suite.timeout,
                checks=tuple(t.check),
            )
        )
    if problems:
        raise TaskFileError(problems)
    return Suite(spec.suite.name, source, tuple(tasks))


def _missing_folders(
    raw: dict[str, Any], source: Path, positions: dict[Any, Position]
) -> list[PolicyProblem]:
    """Fixture folders that do not exist, found even when the file has other mistakes (so
    one round of fixes is enough)."""
    suite: Any = raw.get("suite")
    tasks: Any = raw.get("task")
    suite = suite if isinstance(suite, dict) else {}
    tasks = tasks if isinstance(tasks, list) else []
    root = source.parent / str(suite.get("fixtures", "."))
    out: list[PolicyProblem] = []
    for i, t in enumerate(tasks):
        folder = t.get("fixtures") if isinstance(t, dict) else None
        if isinstance(folder, str) and not (root / folder).is_dir():
            line, col = find(positions, ("task", i, "fixtures")) or (None, None)
            out.append(
                PolicyProblem(
                    str(source),
                    line,
                    col,
                    f"fixtures folder {root / folder} does not exist",
                    f"create it, or fix the path (relative to {root})",
                )
            )
    return out


# -- checks -------------------------------------------------------------------------------------


@dataclass(frozen=True)
class CheckResult:
    label: str
    passed: bool
    detail: str = ""


def applies(check: CheckSpec, mode: str) -> bool:
    return check.modes is None or mode in check.modes


def evaluate(check: CheckSpec, answer: str, output: str, workdir: Path | None) -> CheckResult:
    """One check against what a session left: its answer, its output, its work dir."""
    if check.answer is not None:
        found = re.search(check.answer, answer) is not None
        detail = "" if found else f"answer: {answer[:120]!r}"
    elif check.output is not None:
        found = re.search(check.output, output) is not None
        detail = ""
    else:
        assert check.file is not None
        path = (workdir / check.file) if workdir is not None else None
        if path is None or not path.is_file() or path.is_symlink():
            found, detail = False, f"{check.file} is not in the work dir"
        elif check.pattern is None:
            found, detail = True, ""
        else:
            content = path.read_bytes()[: 1 << 20].decode("utf-8", "replace")
            found = re.search(check.pattern, content) is not None
            detail = "" if found else f"{check.file}: {content[:120]!r}"
    passed = found != check.absent
    return CheckResult(check.label(), passed, "" if passed else detail)


def outcome(results: list[CheckResult]) -> str:
    """pass (all), partial (some), fail (none); a task without checks passes if it ran."""
    if not results:
        return "pass"
    passed = sum(r.passed for r in results)
    return "pass" if passed == len(results) else "partial" if passed else "fail"


# -- errors with lines --------------------------------------------------------------------------


def _problem(err: Any, positions: dict[Any, Position], source: str) -> PolicyProblem:
    loc: tuple[str | int, ...] = tuple(err["loc"])
    pos = find(positions, loc)
    where = ".".join(str(p) for p in loc if not _type_tag(p))
    line, col = pos if pos else (None, None)
    kind = err["type"]
    if kind == "extra_forbidden":
        known = _known_keys(loc[:-1])
        close = difflib.get_close_matches(str(loc[-1]), known, n=1)
        hint = f"did you mean {close[0]!r}?" if close else f"known keys here: {', '.join(known)}"
        return PolicyProblem(source, line, col, f"unknown key {where!r}", hint)
    if kind == "missing":
        return PolicyProblem(source, line, col, f"{where!r} is required", f"add {loc[-1]} = ...")
    msg = str(err["msg"]).removeprefix("Value error, ")
    fix: str | None = None
    if kind == "literal_error":
        fix = f"use one of {err.get('ctx', {}).get('expected', '')}"
        msg = f"{err.get('input')!r} is not allowed"
    elif kind == "string_pattern_mismatch":
        msg = f"{err.get('input')!r} is not a usable id"
        fix = "ids are letters, digits, '_', '.', '-' (e.g. T13)"
    return PolicyProblem(source, line, col, f"{where}: {msg}" if where else msg, fix)


def _type_tag(part: str | int) -> bool:
    return isinstance(part, str) and (part in {"int", "str", "float", "bool"} or "[" in part)


def _known_keys(loc: tuple[str | int, ...]) -> list[str]:
    model: type[BaseModel] = TaskFile
    children: dict[tuple[type[BaseModel], str], type[BaseModel]] = {
        (TaskFile, "suite"): SuiteSpec,
        (TaskFile, "task"): TaskSpec,
        (TaskSpec, "check"): CheckSpec,
    }
    for part in loc:
        if isinstance(part, str):
            model = children.get((model, part), model)
    return sorted(model.model_fields)


def _syntax_position(exc: Exception, text: bytes) -> tuple[int | None, int | None, str]:
    if isinstance(exc, UnicodeDecodeError):
        return text.count(b"\n", 0, exc.start) + 1, None, "not UTF-8 text"
    match = re.search(r"\(at line (\d+), column (\d+)\)", str(exc))
    if match:
        return int(match[1]), int(match[2]), str(exc)[: match.start()].strip()
    return None, None, str(exc)
