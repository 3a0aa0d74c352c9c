"""``sandgate run`` without typer: its options read with the standard library, its body.

Why (issue 13): typer 0.29 builds every command's parameters and a pydantic ``TypeAdapter``
per option before any command runs; with ``import typer`` that is ~100 ms CPU of a run whose
goal is 200 ms in all (2026-12-01). So ``python -m sandgate run ...`` first tries
:func:`parse_run`, which reads only what it is sure of: long options (``--x v``, ``--x=v``),
the single-letter ones alone (``-q``, ``-p v``), ``--``, and values it converts the way typer
does (digits for ints, plain decimals for floats, non-empty paths). Anything else (``--help``,
``-qp v``, a value that looks like an option, a missing value, an unknown option) returns
None and typer parses the same argv as before: its errors, its ``--help``, byte for byte.

The command body (:func:`run_command`) is the one both parsers call, so the fast path cannot
drift from typer's in what a run does; a bad value it finds (``BadOption``) also goes back
to typer, which calls the body again and reports it as typer always has.
tests/unit/test_cli_fastrun.py runs both parsers over every option and compares what they
hand the body, and checks that :data:`OPTIONS` is typer's list of ``run`` options.
"""

from __future__ import annotations

import errno
import gc
import json
import os
import re
import sys
from dataclasses import dataclass
from pathlib import Path

from sandgate import TYPE_CHECKING
from sandgate.errors import PolicyError, SandgateError

if TYPE_CHECKING:
    from typing import Any, Literal

    Kind = Literal["str", "path", "int", "float", "flag", "multi"]


@dataclass(frozen=True)
class Option:
    """One of ``run``'s options as the fast parser reads it."""

    dest: str  # the parameter of cli.run / run_command
    names: tuple[str, ...]
    kind: Kind
    default: Any = None


# cli.run's options, in its order (test_cli_fastrun checks this against typer's own list).
OPTIONS = (
    Option("policy", ("--policy", "-p"), "str"),
    Option("profile", ("--profile",), "str"),
    Option("mode", ("--mode", "-m"), "str"),
    Option("world", ("--world",), "str"),
    Option("allow", ("--allow",), "multi"),
    Option("deny", ("--deny",), "multi"),
    Option("workdir", ("--workdir",), "path"),
    Option("timeout", ("--timeout",), "float"),
    Option("uid", ("--uid",), "int"),
    Option("env", ("--env", "-e"), "multi"),
    Option("json_out", ("--json",), "flag", False),
    Option("quiet", ("--quiet", "-q"), "flag", False),
    Option("instance", ("--instance",), "str"),
    Option("fixtures", ("--fixtures",), "path"),
    Option("home_template", ("--home-template",), "path"),
    Option("copy_links", ("--copy-links",), "flag", False),
    Option("disk", ("--disk",), "str", "1G"),
    Option("keep_writes", ("--keep-writes",), "flag", False),
    Option("notify", ("--notify",), "str"),
    Option("pids", ("--pids",), "str"),
    Option("memory", ("--memory",), "str"),
    Option("cpus", ("--cpus",), "str"),
    Option("vm", ("--vm",), "flag", False),
    Option("nic", ("--nic",), "str", "tap"),
    Option("vm_image", ("--image",), "path"),
    Option("vm_kernel", ("--kernel",), "path"),
    Option("vm_initrd", ("--initrd",), "path"),
    Option("cloud_init", ("--cloud-init",), "flag", False),
    Option("ask", ("--ask",), "flag", False),
    Option("timings", ("--timings",), "flag", False),
)
_BY_NAME = {name: opt for opt in OPTIONS for name in opt.names}
_INT = re.compile(r"[0-9]+")
_FLOAT = re.compile(r"[0-9]+(\.[0-9]+)?")


class BadOption(Exception):
    """A value ``run`` refuses: typer's BadParameter, raised where typer is not imported."""

    def __init__(self, message: str, hint: str | None = None) -> None:
        super().__init__(message)
        self.message, self.hint = message, hint


def _convert(opt: Option, text: str) -> Any:
    """``text`` as typer hands it to ``run``; None where typer's own conversion must judge."""
    if opt.kind == "str":
        return text
    if opt.kind == "multi":
        return text
    if opt.kind == "path":
        return Path(text) if text else None
    if opt.kind == "int":
        return int(text) if _INT.fullmatch(text) else None
    if opt.kind == "float":
        return float(text) if _FLOAT.fullmatch(text) else None
    return None


def parse_run(args: list[str]) -> dict[str, Any] | None:
    """``run``'s arguments (after ``run``) -> the keyword arguments typer would pass, or None
    where only typer can say (help, errors, spellings this reader does not take)."""
    if any(k.startswith("_") and k.endswith("_COMPLETE") for k in os.environ):
        return None  # a shell asking click for completions
    out: dict[str, Any] = {opt.dest: opt.default for opt in OPTIONS}
    i = 0
    while i < len(args):
        arg = args[i]
        if arg == "--":
            i += 1
            break
        if not arg.startswith("-") or arg == "-":
            break  # the command: everything from here is its (no interspersed options)
        name, eq, value = arg.partition("=") if arg.startswith("--") else (arg, "", "")
        opt = _BY_NAME.get(name)
        if opt is None:
            return None
        if opt.kind == "flag":
            if eq:
                return None
            out[opt.dest] = True
            i += 1
            continue
        if not eq:
            if i + 1 >= len(args) or args[i + 1].startswith("-"):
                return None
            value = args[i + 1]
            i += 1
        i += 1
        converted = _convert(opt, value)
        if converted is None:
            return None
        if opt.kind == "multi":
            out[opt.dest] = [*(out[opt.dest] or []), converted]
        else:
            out[opt.dest] = converted
    command = args[i:]
    if not command:
        return None  # typer's "Missing argument"
    return {"command": command, **out}


# --- option values (cli.py's other commands use these through typer.BadParameter) ---
def size_option(text: str, flag: str) -> int:
    units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    t = text.strip().upper().removesuffix("B").removesuffix("I")
    try:
        value = int(float(t[:-1]) * units[t[-1]]) if t and t[-1] in units else int(t)
    except ValueError:
        raise BadOption(f"{text!r}: write a size such as 512M or 2G", flag) from None
    if value < 1 << 20:
        raise BadOption(f"{text!r} is less than 1M", flag)
    return value


def mode_option(value: str | None) -> str | None:
    if value is not None and value not in ("locked", "open", "allowlist"):
        raise BadOption(f"{value!r}: choose locked, open or allowlist", "--mode")
    return value


def limits_option(pids: str | None, memory: str | None, cpus: str | None) -> Any:
    from sandgate.policy.limits import LimitError, Limits, parse_cpus, parse_pids, parse_size

    parsers = (
        ("--pids", pids, parse_pids),
        ("--memory", memory, parse_size),
        ("--cpus", cpus, parse_cpus),
    )
    values: list[Any] = []
    for flag, text, parse in parsers:
        try:
            values.append(None if text is None else parse(text))
        except LimitError as exc:
            raise BadOption(str(exc), flag) from None
    return Limits(*values)


def vm_option(
    vm: bool,
    nic: str,
    uid: int | None,
    own: tuple[Path | None, Path | None, Path | None, bool] = (None, None, None, False),
) -> Any:
    """--vm [--nic tap|none]; with --uid the command runs as that uid in the guest, else root.
    ``own``: --image DISK [--kernel K --initrd I] [--cloud-init] (bring your own guest)."""
    disk_path, kernel, initrd, cloud_init = own
    if not vm:
        if nic != "tap":
            raise BadOption("--nic applies to --vm guests only", "--nic")
        if disk_path or kernel or initrd or cloud_init:
            raise BadOption("--image/--kernel/--initrd/--cloud-init need --vm")
        return None
    from sandgate.vm.disk import ImageOptions
    from sandgate.vm.launch import BOOT_TIMEOUT, VmOptions

    if nic not in ("tap", "none"):
        raise BadOption(f"{nic!r}: use tap or none", "--nic")
    if disk_path is None and (kernel or initrd or cloud_init):
        raise BadOption("--kernel/--initrd/--cloud-init go with --image DISK")
    image = None if disk_path is None else ImageOptions(disk_path, kernel, initrd, cloud_init)
    return VmOptions(
        nic="tap" if nic == "tap" else "none",
        as_uid=uid is not None,
        # A cloud image boots a whole distribution (systemd, cloud-init) under TCG: minutes.
        boot_timeout=BOOT_TIMEOUT if image is None else 2 * BOOT_TIMEOUT,
        image=image,
    )


def _stderr() -> Any:
    from rich.console import Console

    return Console(stderr=True)  # what cli.py's ``err`` is


def print_error(exc: SandgateError) -> None:
    """A SandgateError as every command prints it (cli._fail prints through this)."""
    from sandgate.session.tasks import TaskFileError

    err = _stderr()
    if isinstance(exc, PolicyError):
        kind = "task file error" if isinstance(exc, TaskFileError) else "policy error"
        err.print(f"[red]{kind}[/red]")
        err.print(str(exc), highlight=False, markup=False)
    else:
        err.print(f"[red]sandgate:[/red] {exc.message}", highlight=False)
        if exc.fix:
            err.print(f"  fix: {exc.fix}", highlight=False)


def run_command(
    command: list[str],
    policy: str | None,
    profile: str | None,
    mode: str | None,
    world: str | None,
    allow: list[str] | None,
    deny: list[str] | None,
    workdir: Path | None,
    timeout: float | None,
    uid: int | None,
    env: list[str] | None,
    json_out: bool,
    quiet: bool,
    instance: str | None,
    fixtures: Path | None,
    home_template: Path | None,
    copy_links: bool,
    disk: str,
    keep_writes: bool,
    notify: str | None,
    pids: str | None,
    memory: str | None,
    cpus: str | None,
    vm: bool,
    nic: str,
    vm_image: Path | None,
    vm_kernel: Path | None,
    vm_initrd: Path | None,
    cloud_init: bool,
    ask: bool,
    timings: bool,
) -> int:
    """``sandgate run``'s body, for typer (cli.run) and the fast path alike: the exit status.
    Every BadOption is raised before anything is made."""
    from sandgate.session.timings import Timings, cpu_now, since_process_start

    clock = Timings()
    clock.add("python start, CLI imports, options", since_process_start() or 0.0, cpu_now())
    with clock.phase("imports of run"):
        from sandgate.sandbox.workspace import WorkspaceSpec
        from sandgate.session.runner import RunOptions
        from sandgate.session.runner import run as run_session
    # What is loaded lives until exit: out of the collector's sight (nor walked again when
    # the interpreter ends), and the collector on for the run (__main__ held it off).
    gc.freeze()
    gc.enable()

    if world not in (None, "test"):
        raise BadOption("the only world is 'test'", "--world")
    extra_env = {}
    for item in env or []:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise BadOption(f"{item!r}: write NAME=VALUE", "--env")
        extra_env[key] = value
    if keep_writes and home_template is None:
        raise BadOption(
            "--keep-writes writes the home's changes back to --home-template: give one",
            "--keep-writes",
        )
    for flag, folder in (("--fixtures", fixtures), ("--home-template", home_template)):
        if folder is not None and not folder.is_dir():
            raise BadOption(f"{folder} is not a directory", flag)
    opts = RunOptions(
        command=command,
        policy=policy,
        profile=profile,
        mode=mode_option(mode) or ("allowlist" if ask else None),
        allow=allow or (),
        deny=deny or (),
        world=world,
        workdir=workdir,
        timeout=timeout,
        ask=ask,
        uid=uid,
        env=extra_env,
        instance=instance,
        space=WorkspaceSpec(
            fixtures=fixtures,
            home_template=home_template,
            copy_links=copy_links,
            disk=size_option(disk, "--disk"),
            keep_writes=keep_writes,
        ),
        capture=not sys.stdin.isatty(),
        notify=notify,
        limits=limits_option(pids, memory, cpus),
        vm=vm_option(vm, nic, uid, (vm_image, vm_kernel, vm_initrd, cloud_init)),
        timings=clock,
    )
    try:
        result = run_session(opts)
    except SandgateError as exc:
        print_error(exc)
        return 2
    if result.message:
        _stderr().print(f"[yellow]sandgate:[/yellow] {result.message}", highlight=False)
    with clock.phase("render"):
        if json_out:
            print(
                json.dumps(
                    {
                        "session": result.session,
                        "exit_code": result.exit_code,
                        **result.report.as_json(),
                        **({"timings": clock.as_json()} if timings else {}),
                    }
                )
            )
        elif not quiet:
            from sandgate.report.render import print_report

            print_report(result.report)
    if timings and not json_out:
        sys.stderr.write("\n".join(["sandgate: timings", *clock.lines()]) + "\n")
    return result.exit_code


def fast_main(argv: list[str]) -> int | None:
    """``sandgate ARGV`` when it is a ``run`` this module reads, as typer would have run it
    (its exit status); None: hand ``argv`` to typer (nothing has been done yet)."""
    if not argv or argv[0] != "run":
        return None
    kwargs = parse_run(argv[1:])
    if kwargs is None:
        return None
    try:
        return run_command(**kwargs)
    except BadOption:
        return None  # typer calls the body again and says it as it always has
    # What typer's main does with what escapes a command (typer/core.py _main, __call__).
    except KeyboardInterrupt:
        return 130  # Exit(130), nothing printed
    except EOFError:
        print(file=sys.stderr)
        print("Aborted!", file=sys.stderr)
        return 1
    except OSError as exc:
        if exc.errno != errno.EPIPE:
            _typer_traceback(exc)
            raise
        from typer._click.utils import PacifyFlushWrapper

        sys.stdout = PacifyFlushWrapper(sys.stdout)
        sys.stderr = PacifyFlushWrapper(sys.stderr)
        return 1
    except Exception as exc:
        _typer_traceback(exc)
        raise


def _typer_traceback(exc: Exception) -> None:
    """A crash is shown by typer's hook, as if typer had run the command (a bug's report)."""
    from typer import main as typer_main
    from typer.models import DeveloperExceptionConfig

    sys.excepthook = typer_main.except_hook
    config = DeveloperExceptionConfig(pretty_exceptions_show_locals=False)  # cli.app's
    setattr(exc, typer_main._typer_developer_exception_attr_name, config)
