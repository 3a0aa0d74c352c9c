"""The ``sandgate`` command: parse, call one part, render. Only this module imports typer."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, cast

import typer

from sandgate.errors import PolicyError, SandgateError

app = typer.Typer(
    add_completion=False,
    no_args_is_help=True,
    # Help texts hold brackets (TARGET[:PORTS][/PROTO]); they are text, not rich markup.
    rich_markup_mode=None,
    help="Run AI agents so that they reach the model server and what you allow, nothing else; "
    "every network attempt is logged; real credentials never enter the sandbox.",
)
policy_app = typer.Typer(no_args_is_help=True, help="Check and inspect policy files.")
app.add_typer(policy_app, name="policy")
export_app = typer.Typer(
    no_args_is_help=True, help="Write the policy for another engine (Cilium, Kubernetes)."
)
app.add_typer(export_app, name="export")

if TYPE_CHECKING:
    from rich.console import Console


class _LazyConsole:
    """rich's Console, made on first use: importing rich costs ~25 ms (2026-12-01) that a
    `run -q` which prints nothing never needs."""

    def __init__(self, **kwargs: Any) -> None:
        self._kwargs = kwargs
        self._console: Any = None

    def __getattr__(self, name: str) -> Any:
        if self._console is None:
            from rich.console import Console

            self._console = Console(**self._kwargs)
        return getattr(self._console, name)


def _wide_console() -> Console:
    from rich.console import Console

    return out if out.is_terminal else Console(width=160)


out = cast("Console", _LazyConsole())
err = cast("Console", _LazyConsole(stderr=True))

PolicyOpt = Annotated[
    str | None, typer.Option("--policy", "-p", help="policy file (default: the built-in policy)")
]
ProfileOpt = Annotated[str | None, typer.Option("--profile", help="profile in the policy")]
ModeOpt = Annotated[
    str | None,
    typer.Option("--mode", "-m", help="override the internet mode: locked, open or allowlist"),
]
JsonOpt = Annotated[bool, typer.Option("--json", help="machine-readable output")]
NotifyOpt = Annotated[
    str | None,
    typer.Option("--notify", help="command (gets $SANDGATE_ALARM) or URL told when it ends"),
]

# -- HTML reports (report/html.py) ---------------------------------------------------------------
HtmlOpt = Annotated[
    Path | None,
    typer.Option("--html", help="also write one self-contained HTML file (opens offline)"),
]


def _write_html(path: Path, text: str) -> None:
    try:
        path.write_text(text, encoding="utf-8")
    except OSError as exc:
        _fail(SandgateError(f"cannot write {path}: {exc.strerror}", "choose a writable path"))
    err.print(f"HTML report: {path}", highlight=False)


def _write_suite_html(path: Path, result: Any) -> None:
    """Every row's session report, read back from the store, embedded in one file."""
    from sandgate.events.store import Store
    from sandgate.report.html import suite_html
    from sandgate.report.session import build_report

    sessions = {}
    store = Store()
    try:
        for r in result.rows:
            row = store.session(r.session) if r.session else None
            if row is not None:
                events = store.events(session=row.id)
                sessions[row.id] = (build_report(row, events, row.details.get("counters")), events)
    finally:
        store.close()
    _write_html(path, suite_html(result, sessions))


# -- end of HTML reports ----------------------------------------------------------------------


def _fail(exc: SandgateError, code: int = 2) -> None:
    from sandgate.runcli import print_error

    print_error(exc)
    raise typer.Exit(code)


def _session_row(store: Any, session: str) -> Any:
    """The session called ``session`` ("last" for the latest), or a clear exit."""
    row = store.session(session)
    if row is None:
        store.close()
        _fail(
            SandgateError(
                f"no session {session!r} in {store.path}",
                "list sessions with `sandgate log --sessions`",
            )
        )
    return row


def _size(text: str, flag: str) -> int:
    from sandgate.runcli import size_option

    return cast(int, _typer_bad(size_option, text, flag))


def _typer_bad(check: Any, *args: Any) -> Any:
    """``check(*args)`` (sandgate/runcli.py, typer-free) with its BadOption as typer's."""
    from sandgate.runcli import BadOption

    try:
        return check(*args)
    except BadOption as exc:
        raise typer.BadParameter(exc.message, param_hint=exc.hint) from None


def _mode(value: str | None) -> str | None:
    from sandgate.runcli import mode_option

    return cast("str | None", _typer_bad(mode_option, value))


# --- per-session resource limits (sandbox/limits.py) ---
PidsOpt = Annotated[
    str | None, typer.Option("--pids", help="max processes+threads per session (default 1024)")
]
MemoryOpt = Annotated[
    str | None,
    typer.Option("--memory", help="RAM per session, swap off, e.g. 256M, 2G (default: half)"),
]
CpusOpt = Annotated[
    str | None, typer.Option("--cpus", help="CPU time per session in cores, e.g. 1.5")
]
# issue 15: the test world's model server (scripted, or a real model: world/llm.py)
WorldModelOpt = Annotated[
    str | None,
    typer.Option(
        "--world-model", help="the test world's model: scripted (default) or smollm2 (llama.cpp)"
    ),
]


def _limits(pids: str | None, memory: str | None, cpus: str | None) -> Any:
    from sandgate.runcli import limits_option

    return _typer_bad(limits_option, pids, memory, cpus)


# --- end limits ---


# --- VM guests (issue 9) ---
def _vm_options(
    vm: bool,
    nic: str,
    uid: int | None,
    own: tuple[Path | None, Path | None, Path | None, bool] = (None, None, None, False),
) -> Any:
    """--vm [--nic tap|none] [--image DISK ...]: sandgate/runcli.py's vm_option."""
    from sandgate.runcli import vm_option

    return _typer_bad(vm_option, vm, nic, uid, own)


# --- end VM guests ---


@app.command(context_settings={"allow_interspersed_args": False})
def run(
    command: Annotated[list[str], typer.Argument(help="the command to run in the sandbox")],
    policy: PolicyOpt = None,
    profile: ProfileOpt = None,
    mode: ModeOpt = None,
    world: Annotated[
        str | None, typer.Option("--world", help="'test': run in sandgate's own test world")
    ] = None,
    allow: Annotated[
        list[str] | None, typer.Option("--allow", help="extra allow rule: TARGET[:PORTS][/PROTO]")
    ] = None,
    deny: Annotated[
        list[str] | None, typer.Option("--deny", help="extra deny rule: TARGET[:PORTS][/PROTO]")
    ] = None,
    workdir: Annotated[
        Path | None,
        typer.Option("--workdir", help="directory mounted at /work (default: a fresh one)"),
    ] = None,
    timeout: Annotated[
        float | None, typer.Option("--timeout", help="seconds before the sandbox is killed")
    ] = None,
    uid: Annotated[
        int | None, typer.Option("--uid", help="unprivileged uid to run as (default 61000)")
    ] = None,
    env: Annotated[
        list[str] | None, typer.Option("--env", "-e", help="NAME=VALUE inside the sandbox")
    ] = None,
    json_out: JsonOpt = False,
    quiet: Annotated[bool, typer.Option("--quiet", "-q", help="no report")] = False,
    instance: Annotated[
        str | None, typer.Option("--instance", help="use this running gateway")
    ] = None,
    fixtures: Annotated[
        Path | None, typer.Option("--fixtures", help="copy this directory into the fresh /work")
    ] = None,
    home_template: Annotated[
        Path | None,
        typer.Option("--home-template", help="copy this directory into the fresh agent home"),
    ] = None,
    copy_links: Annotated[
        bool,
        typer.Option(
            "--copy-links", help="copy what links outside fixtures/home point to (default: refuse)"
        ),
    ] = False,
    disk: Annotated[
        str, typer.Option("--disk", help="the session's disk: work, home and scratch (e.g. 2G)")
    ] = "1G",
    keep_writes: Annotated[
        bool,
        typer.Option("--keep-writes", help="write the home's changes back to --home-template"),
    ] = False,
    notify: NotifyOpt = None,
    pids: PidsOpt = None,
    memory: MemoryOpt = None,
    cpus: CpusOpt = None,
    # -- issue 9: VM guests ---------------------------------------------------------------
    vm: Annotated[
        bool, typer.Option("--vm", help="run the command in a QEMU VM, as root in the guest")
    ] = False,
    nic: Annotated[
        str, typer.Option("--nic", help="the VM's network: 'tap' (its guest link) or 'none'")
    ] = "tap",
    vm_image: Annotated[
        Path | None,
        typer.Option("--image", help="--vm: boot this qcow2/raw disk (never written: an overlay)"),
    ] = None,
    vm_kernel: Annotated[
        Path | None, typer.Option("--kernel", help="--image: boot this kernel (needs --initrd)")
    ] = None,
    vm_initrd: Annotated[
        Path | None, typer.Option("--initrd", help="--image: the kernel's initrd")
    ] = None,
    cloud_init: Annotated[
        bool, typer.Option("--cloud-init", help="--image: the image runs cloud-init (NoCloud)")
    ] = False,
    ask: Annotated[
        bool,
        typer.Option(
            "--ask",
            help="allowlist mode where a new name waits for `sandgate approve` (issue 14)",
        ),
    ] = False,
    # -- issue 13: each phase of the run, wall and CPU ----------------------------------
    timings: Annotated[
        bool, typer.Option("--timings", help="print each phase of the run (wall, CPU) on stderr")
    ] = False,
) -> None:
    """Run one command in a fresh sandbox behind the gateway; print what it reached for."""
    # The body is sandgate/runcli.py's, shared with `python -m sandgate run`'s fast path
    # (issue 13: that path reads these options without typer; its test compares the two).
    options = dict(locals())
    from sandgate.runcli import run_command

    raise typer.Exit(_typer_bad(lambda: run_command(**options)))


@app.command()
def explain(
    targets: Annotated[list[str], typer.Argument(help="host, host:port, [v6]:port or URL")],
    policy: PolicyOpt = None,
    profile: ProfileOpt = None,
    mode: ModeOpt = None,
    protocol: Annotated[str, typer.Option("--protocol", help="tcp, udp or icmp")] = "tcp",
    world: Annotated[
        str | None,
        typer.Option("--world", help="'test': names and policy as in sandgate's test world"),
    ] = None,
    json_out: JsonOpt = False,
    ipv6: Annotated[  # issue 14 part 5
        bool,
        typer.Option(
            "--ipv6/--no-ipv6",
            help="judge as a gateway whose uplink has IPv6 (the default), or one without "
            "(--no-ipv6: IPv6 is deny.ipv6, as on pasta and handed uplinks today)",
        ),
    ] = True,
) -> None:
    """Say whether the policy allows each target, by which rule, and why."""
    import ipaddress

    from sandgate.explain import explain as explain_one
    from sandgate.explain import system_resolve
    from sandgate.policy.load import load_policy
    from sandgate.policy.model import Mode, Protocol

    if world not in (None, "test"):
        raise typer.BadParameter("the only world is 'test'", param_hint="--world")
    resolve = system_resolve
    override: tuple[Any, ...] = ()
    if world == "test":
        from importlib import resources

        from sandgate.world import topology

        def resolve(name: str) -> list[Any]:
            return [ipaddress.ip_address(a) for a in topology.resolve_name(name)]

        override = tuple(ipaddress.ip_network(n) for n in topology.PUBLIC)
        policy = policy or str(resources.files("sandgate.world").joinpath("testworld.toml"))
    try:
        pol = load_policy(policy)
        m = _mode(mode)
        prof = pol.profile(
            profile, mode=Mode(m) if m else None, public_override=override, uplink_ipv6=ipv6
        )
        proto = Protocol(protocol)
    except SandgateError as exc:
        _fail(exc)
        return
    except ValueError:
        raise typer.BadParameter(
            f"{protocol!r}: choose tcp, udp or icmp", param_hint="--protocol"
        ) from None
    denied = False
    v4_only = None
    if ipv6:  # what a gateway without IPv6 would say instead, where it differs
        v4_only = pol.profile(
            profile, mode=Mode(m) if m else None, public_override=override, uplink_ipv6=False
        )
    for target in targets:
        e = explain_one(prof, target, proto, resolve)
        denied |= e.verdict != "allow"
        other = explain_one(v4_only, target, proto, resolve) if v4_only is not None else None
        if other is not None and other.reason == e.reason:
            other = None
        if json_out:
            shown = {**e.as_json(), "uplink_ipv6": ipv6}
            if other is not None:
                shown["without_ipv6"] = {"verdict": other.verdict, "reason": other.reason}
            print(json.dumps(shown))
        else:
            style = "green" if e.verdict == "allow" else "red"
            addrs = ", ".join(a["address"] for a in e.addresses)
            out.print(
                f"[{style}]{e.verdict:5}[/{style}] {target}"
                + (f" → {addrs}" if addrs and addrs != target else "")
                + f"  [dim]{e.reason}[/dim]  {e.detail}"
                + (f"  [dim]rule {e.rule}[/dim]" if e.rule else ""),
                highlight=False,
            )
            if e.requests:  # issue 14: request rules
                out.print(f"      requests: only {', '.join(e.requests)}", highlight=False)
            if e.inspected:
                out.print(f"      {e.inspected}", highlight=False)
            if other is not None:
                out.print(
                    f"      on a gateway whose uplink has no IPv6 (--no-ipv6): {other.verdict} "
                    f"{other.reason}",
                    highlight=False,
                )
    raise typer.Exit(0)


@app.command()
def log(
    action: Annotated[
        str | None,
        typer.Argument(
            help="verify: recompute the store's hash chain and check its signed checkpoints"
        ),
    ] = None,
    session: Annotated[
        str | None, typer.Option("--session", "-s", help="session id or 'last'")
    ] = None,
    kind: Annotated[
        list[str] | None, typer.Option("--kind", "-k", help="dns, conn, http, session, guest, ...")
    ] = None,
    json_out: JsonOpt = False,
    limit: Annotated[int | None, typer.Option("--limit", help="at most this many events")] = None,
    sessions: Annotated[bool, typer.Option("--sessions", help="list the sessions instead")] = False,
    fmt: Annotated[
        str | None,
        typer.Option(
            "--format", help="text, json (as --json) or ocsf (OCSF 1.8.0 JSONL, for a SIEM)"
        ),
    ] = None,
) -> None:
    """Every attempt of a session (or of everything), from the event store.
    `sandgate log verify` checks that the store was not changed."""
    from sandgate.events.schema import Kind
    from sandgate.events.store import Store
    from sandgate.report.render import events_table

    if action is not None:
        _log_verify(action, session, json_out)
        return

    try:
        kinds = [Kind(k) for k in kind or []]
    except ValueError:
        raise typer.BadParameter(
            f"choose among {', '.join(k.value for k in Kind)}", param_hint="--kind"
        ) from None
    fmt = _log_format(fmt, json_out, sessions)
    json_out = fmt == "json"
    store = Store()
    if sessions:
        rows = store.sessions(limit or 50)
        store.close()
        for s in rows:
            if json_out:
                print(json.dumps(s.__dict__))
            else:
                out.print(
                    f"{s.id}  {s.mode or '-':9} {s.profile or '-':12} exit "
                    f"{s.exit_code if s.exit_code is not None else '-':>3}  "
                    f"{' '.join(s.command)[:60]}",
                    highlight=False,
                )
        return
    try:
        sid = _session_row(store, session).id if session is not None else None
        if fmt == "ocsf":
            id_rows = store.events_with_ids(session=sid, kinds=kinds, limit=limit)
        else:
            events = store.events(session=sid, kinds=kinds, limit=limit)
    finally:
        store.close()
    if fmt == "ocsf":
        _print_ocsf(id_rows)
    elif json_out:
        for e in events:
            print(json.dumps(e.as_json()))
    else:
        out.print(events_table(events))


# -- log --format (OCSF export: events/ocsf.py) ------------------------------------------------

LOG_FORMATS = ("text", "json", "ocsf")


def _log_format(fmt: str | None, json_out: bool, sessions: bool) -> str:
    """``--format``, with ``--json`` kept as its alias; a clash is a clear error."""
    if fmt is not None and fmt not in LOG_FORMATS:
        raise typer.BadParameter(f"choose among {', '.join(LOG_FORMATS)}", param_hint="--format")
    if json_out and fmt not in (None, "json"):
        raise typer.BadParameter(f"--json means --format json, not {fmt}", param_hint="--format")
    chosen = "json" if json_out else fmt or "text"
    if sessions and chosen == "ocsf":
        raise typer.BadParameter("OCSF is for events; list sessions as text or json")
    return chosen


def _print_ocsf(rows: list[tuple[int, Any]]) -> None:
    from sandgate.events.ocsf import write_jsonl

    skipped = write_jsonl(rows, sys.stdout)
    if skipped:
        left = ", ".join(f"{n} {kind}" for kind, n in sorted(skipped.items()))
        sys.stderr.write(f"sandgate: not network activity, left out of OCSF: {left}\n")


def _log_verify(action: str, session: str | None, json_out: bool) -> None:
    """`sandgate log verify [--session ID]`: exit 0 with a summary, or 1 naming the first break."""
    from sandgate.events.store import Store

    if action != "verify":
        raise typer.BadParameter(f"{action!r}: the only action is 'verify'", param_hint="ACTION")
    try:
        store = Store()
        try:
            sid = _session_row(store, session).id if session is not None else None
            result = store.verify(sid)
        finally:
            store.close()
    except SandgateError as exc:
        _fail(exc)
    if json_out:
        print(json.dumps({"ok": result.ok, "summary": result.summary(),
                          "problems": [{"key": p.why.key, "event": p.event, "session": p.session,
                                        "text": p.line()} for p in result.problems]}))  # fmt: skip
    else:
        # plain print: one line a script can grep, never wrapped at the terminal's width
        print(result.summary(), file=sys.stdout if result.ok else sys.stderr)
        for p in result.problems[1:]:
            print(f"  also: {p.line()}", file=sys.stderr)
    if not result.ok:
        raise typer.Exit(1)


@app.command()
def suite(
    tasks: Annotated[
        Path, typer.Argument(help="task file (TOML), e.g. examples/tasks/report-000.toml")
    ],
    agent: Annotated[
        str,
        typer.Option("--agent", "-a", help="built-in agent (scripted, ...) or a command template"),
    ] = "scripted",
    modes: Annotated[
        str | None, typer.Option("--modes", help="comma-separated, e.g. locked,open")
    ] = None,
    only: Annotated[
        str | None, typer.Option("--only", help="comma-separated task ids to run")
    ] = None,
    timeout: Annotated[
        float | None, typer.Option("--timeout", help="seconds per session (overrides the file)")
    ] = None,
    json_out: Annotated[
        bool, typer.Option("--json", help="one JSON object per task and mode, per line")
    ] = False,
    verbose: Annotated[
        bool, typer.Option("--verbose", "-v", help="show the agent's output")
    ] = False,
    notify: NotifyOpt = None,
    html_out: HtmlOpt = None,
    pids: PidsOpt = None,
    memory: MemoryOpt = None,
    cpus: CpusOpt = None,
    parallel: Annotated[
        int, typer.Option("--parallel", "-j", min=1, help="sessions at once on the one gateway")
    ] = 1,
    world_model: WorldModelOpt = None,
) -> None:
    """Run every task of a task file in each mode, each in a fresh session; a results table."""
    from sandgate.agents.registry import resolve
    from sandgate.report.render import suite_table
    from sandgate.session.suite import Row, SuiteOptions, run_suite

    mode_list = tuple(m.strip() for m in modes.split(",") if m.strip()) if modes else None
    for m in mode_list or ():
        _mode(m)

    def on_row(row: Row) -> None:
        if json_out:
            print(json.dumps(row.as_json()), flush=True)
        else:
            flagged = f"  {len(row.flagged_claims)} claim(s) flagged" if row.flagged_claims else ""
            err.print(
                f"{row.task:5} {row.mode:9} {row.outcome:15} {row.session}{flagged}",
                highlight=False,
            )

    try:
        opts = SuiteOptions(
            tasks=tasks,
            agent=resolve(agent),
            modes=mode_list,
            only=tuple(t.strip() for t in only.split(",")) if only else (),
            timeout=timeout,
            echo=verbose,
            notify=notify,
            on_row=on_row,
            limits=_limits(pids, memory, cpus),
            parallel=parallel,
            world_model=world_model,
        )
        result = run_suite(opts)
    except SandgateError as exc:
        _fail(exc)
        return
    if not json_out:
        wide = _wide_console()
        wide.print(suite_table(result))
        share = result.attribution_share()
        if share is not None:
            out.print(f"TCP attempts traced to a process: {100 * share:.1f}%")
        out.print(f"saved: {result.saved}", highlight=False)
    if html_out is not None:
        _write_suite_html(html_out, result)


@app.command()
def report(
    session: Annotated[str, typer.Option("--session", "-s", help="session id or 'last'")] = "last",
    json_out: JsonOpt = False,
    html_out: HtmlOpt = None,
) -> None:
    """What a session reached for, what it changed, which claims the evidence contradicts."""
    from sandgate.events.store import Store
    from sandgate.report.render import print_report
    from sandgate.report.session import build_report

    store = Store()
    try:
        row = _session_row(store, session)
        events = store.events(session=row.id)
        r = build_report(row, events, row.details.get("counters"))
    finally:
        store.close()
    if html_out is not None:
        from sandgate.report.html import session_html

        _write_html(html_out, session_html(r, events))
    if json_out:
        print(json.dumps({"session": r.session, **r.as_json()}))
    elif html_out is None:
        print_report(r, out)


@app.command()
def watch(
    instance: Annotated[
        str | None, typer.Option("--instance", help="which gateway (default: main, then test)")
    ] = None,
    json_out: JsonOpt = False,
) -> None:
    """Stream every attempt live from a running gateway (`sandgate up`)."""
    from sandgate.events.schema import Event
    from sandgate.gateway import manage
    from sandgate.report.render import event_line

    try:
        handle = manage.running(instance)
    except SandgateError as exc:
        _fail(exc)
        return
    try:
        with handle.client() as client:
            for raw in client.stream("watch"):
                if json_out:
                    print(json.dumps(raw), flush=True)
                else:
                    out.print(event_line(Event.from_json(raw)), highlight=False)
    except KeyboardInterrupt:
        pass


# -- dashboard (issue 12, parts 2 and 6) ---------------------------------------------------------


@app.command()
def dashboard(
    instance: Annotated[
        str | None, typer.Option("--instance", help="which gateway (default: main, then test)")
    ] = None,
    listen: Annotated[
        str, typer.Option("--listen", help="HOST:PORT to serve on (loopback unless --public)")
    ] = "127.0.0.1:8377",
    allow_uid: Annotated[
        list[int] | None,
        typer.Option("--allow-uid", help="a local uid let in without the token, like root"),
    ] = None,
    public: Annotated[
        bool, typer.Option("--public", help="allow a non-loopback --listen (token for all)")
    ] = False,
    backlog: Annotated[int, typer.Option("--backlog", help="events shown on load")] = 500,
    token_file: Annotated[
        Path | None,
        typer.Option("--token-file", help="keep the token here (made if missing) across restarts"),
    ] = None,
) -> None:
    """Live web view of a running gateway's attempts, and /metrics for Prometheus."""
    import dataclasses

    from sandgate.events.store import default_path
    from sandgate.gateway import manage
    from sandgate.gateway.config import GatewayConfig, run_dir
    from sandgate.report import dashboard as dash

    try:
        handle = manage.running(instance)
    except SandgateError as exc:
        _fail(exc)
        return
    try:
        cfg = GatewayConfig.load((run_dir(handle.instance) / "gateway.json").read_text())
        store = Path(cfg.store) if cfg.store else default_path()
    except (OSError, ValueError):
        store = default_path()
    try:
        opts = dash.options(
            handle.instance,
            handle.control,
            store,
            listen,
            allow_uid or (),
            public=public,
            token_file=token_file,
        )
        dash.run(dataclasses.replace(opts, backlog=max(0, backlog)))
    except SandgateError as exc:
        _fail(exc)
    except KeyboardInterrupt:
        pass


@policy_app.command("check")
def policy_check(
    path: Annotated[Path, typer.Argument(help="the policy file")],
    json_out: JsonOpt = False,
) -> None:
    """Validate a policy file; name the line of each mistake and how to fix it."""
    from sandgate.policy.load import load_policy

    try:
        pol = load_policy(path)
    except PolicyError as exc:
        if json_out:
            for p in exc.problems:
                print(
                    json.dumps(
                        {
                            "file": p.file,
                            "line": p.line,
                            "column": p.column,
                            "message": p.message,
                            "fix": p.fix,
                        }
                    )
                )
        else:
            err.print(f"[red]{len(exc.problems)} problem(s)[/red]\n{exc}", highlight=False)
        raise typer.Exit(1) from None
    profiles = ", ".join(f"{n} ({p.internet})" for n, p in pol.file.profiles.items())
    warnings = pol.warnings()  # issue 14: a process rule's executable that is not here
    for w in warnings:
        if not json_out:
            err.print(f"warning: {w}", highlight=False, markup=False)
    if json_out:
        print(
            json.dumps(
                {
                    "file": str(path),
                    "ok": True,
                    "profiles": list(pol.file.profiles),
                    "warnings": [w.message for w in warnings],
                }
            )
        )
    else:
        out.print(f"[green]ok[/green] {path}: profiles {profiles}", highlight=False)
    # host_loopback (issue 10): a port nothing listens on here yet is worth a warning.
    from sandgate.gateway.hostlo import unserved

    for port in unserved(pol.host_loopback_ports()):
        err.print(
            f"warning: host_loopback {port}: nothing listens on 127.0.0.1:{port} of this host "
            "(yet); guests' connections fail until the server runs",
            highlight=False,
            markup=False,
        )


# -- issue 14: policy suggest ------------------------------------------------------------------
@policy_app.command("suggest")
def policy_suggest(
    session: Annotated[str, typer.Option("--session", "-s", help="session id or 'last'")] = "last",
    json_out: JsonOpt = False,
) -> None:
    """A session's refusals as the allow rules that would have let them through: an overlay on
    the session's policy (TOML on stdout), a comment per rule, risky ones commented out."""
    import ipaddress

    from sandgate.events.store import Store
    from sandgate.policy.load import BUILTIN, load_policy
    from sandgate.policy.model import Mode
    from sandgate.policy.suggest import suggest

    store = Store()
    row = _session_row(store, session)
    events = store.events(session=row.id)
    store.close()
    source = row.policy if row.policy and row.policy != BUILTIN else None
    if source is not None:
        source = str(Path(source).resolve())
    override: tuple[Any, ...] = ()
    if row.world == "test":
        from sandgate.world import topology

        override = tuple(ipaddress.ip_network(n) for n in topology.PUBLIC)
    try:
        pol = load_policy(source)
        mode = Mode(row.mode) if row.mode else None
        result = suggest(
            pol, row.profile, mode, events, session=row.id, public_override=override,
            extends=source,
        )
    except SandgateError as exc:
        _fail(exc)
        return
    if json_out:
        print(
            json.dumps(
                {
                    "session": row.id,
                    "toml": result.text,
                    "rules": [s.toml() for s in result.rules if not s.risky],
                    "risky": [{"rule": s.toml(), "why": s.risky} for s in result.rules if s.risky],
                    "request_notes": result.notes,
                    "allowed_after": len(result.allowed_after),
                    "still_refused": len(result.still_refused),
                }
            )
        )
        return
    sys.stdout.write(result.text)


# -- end issue 14: policy suggest ---------------------------------------------------------------


def _export(
    kind: str,
    policy: str | None,
    profile: str | None,
    all_profiles: bool,
    out_path: Path | None,
    namespace: str | None,
    selector: str | None,
    strict: bool,
) -> None:
    import yaml

    from sandgate.export import cilium, k8s
    from sandgate.export.unexpressed import strict_error
    from sandgate.policy.load import load_policy

    build = cilium.export_profile if kind == "cilium" else k8s.export_profile
    try:
        pol = load_policy(policy)
        names = sorted(pol.file.profiles) if all_profiles else [profile or pol.default_profile()]
        if all_profiles and profile:
            raise SandgateError("--profile and --all-profiles exclude each other", "give one")
        exports = [
            (name, build(pol, name, namespace=namespace, selector=selector)) for name in names
        ]
    except ValueError as exc:
        _fail(SandgateError(str(exc), "see --help"))
        return
    except SandgateError as exc:
        _fail(exc)
        return
    warnings = [w for _, e in exports for w in e.warnings]
    for w in warnings:
        err.print(f"warning: {w}", highlight=False, markup=False, soft_wrap=True)
    if strict and warnings:
        _fail(strict_error(warnings))
    texts = {name: yaml.safe_dump(e.document, sort_keys=False) for name, e in exports}
    if out_path is None:
        print("---\n".join(texts.values()), end="")
    elif all_profiles:
        out_path.mkdir(parents=True, exist_ok=True)
        for name, text in texts.items():
            (out_path / f"{cilium.resource_name(name)}.yaml").write_text(text, encoding="utf-8")
        err.print(f"wrote {len(texts)} file(s) to {out_path}/", highlight=False)
    else:
        out_path.write_text(next(iter(texts.values())), encoding="utf-8")
        err.print(f"wrote {out_path}", highlight=False)


AllProfilesOpt = Annotated[
    bool, typer.Option("--all-profiles", help="every profile, one file each")
]
OutOpt = Annotated[
    Path | None,
    typer.Option("--out", "-o", help="file (a directory with --all-profiles); default stdout"),
]
NamespaceOpt = Annotated[str | None, typer.Option("--namespace", help="metadata.namespace")]
SelectorOpt = Annotated[
    str | None,
    typer.Option(
        "--selector", help="pods it applies to: key=value[,...] (sandgate.io/profile=NAME)"
    ),
]
StrictOpt = Annotated[
    bool, typer.Option("--strict", help="fail if any rule cannot be said exactly (see warnings)")
]


@export_app.command("cilium")
def export_cilium(
    policy: PolicyOpt = None,
    profile: ProfileOpt = None,
    all_profiles: AllProfilesOpt = False,
    out_path: OutOpt = None,
    namespace: NamespaceOpt = None,
    selector: SelectorOpt = None,
    strict: StrictOpt = False,
) -> None:
    """A CiliumNetworkPolicy (cilium.io/v2, Cilium 1.16+) per profile: names via toFQDNs and
    the DNS proxy; what Cilium cannot say is a warning with its line."""
    _export("cilium", policy, profile, all_profiles, out_path, namespace, selector, strict)


@export_app.command("k8s-networkpolicy")
def export_k8s(
    policy: PolicyOpt = None,
    profile: ProfileOpt = None,
    all_profiles: AllProfilesOpt = False,
    out_path: OutOpt = None,
    namespace: NamespaceOpt = None,
    selector: SelectorOpt = None,
    strict: StrictOpt = False,
) -> None:
    """A plain Kubernetes NetworkPolicy per profile: CIDRs only, names dropped with a warning."""
    _export("k8s", policy, profile, all_profiles, out_path, namespace, selector, strict)


# -- export gateway-vm / gateway (issue 10: the homelab gateway VM) ---------------------------
UplinkOpt = Annotated[
    str | None, typer.Option("--uplink", help="the gateway's uplink interface (eth0)")
]
GuestLinkOpt = Annotated[
    list[str] | None,
    typer.Option("--guest", help="IF=PROFILE: one guest behind this interface (repeat)"),
]


@export_app.command("gateway-vm")
def export_gateway_vm(
    out_dir: Annotated[Path, typer.Option("--out", "-o", help="directory to write into")],
    policy: PolicyOpt = None,
    uplink: UplinkOpt = None,
    guest: GuestLinkOpt = None,
    sandgate_bin: Annotated[
        str, typer.Option("--sandgate-bin", help="sandgate's path on the gateway VM")
    ] = "/usr/local/bin/sandgate",
) -> None:
    """Every file a gateway VM and its hypervisor need (ruleset, sysctls, systemd units,
    ifupdown bridges, host-drop table, Ansible playbook, README); links from [gateway]."""
    from sandgate.export.gatewayvm import export_files
    from sandgate.net.handed import handed_from
    from sandgate.policy.load import load_policy

    try:
        pol = load_policy(policy)
        if pol.builtin:
            raise SandgateError("export gateway-vm needs a policy file", "give --policy FILE")
        links = handed_from(pol, uplink, guest or [])
        files = export_files(pol, Path(pol.source).read_bytes(), links, sandgate_bin).files
    except SandgateError as exc:
        _fail(exc)
        return
    for rel, data in files.items():
        target = out_dir / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(data)
    err.print(
        f"wrote {len(files)} file(s) to {out_dir}/ (see {out_dir}/README.md)", highlight=False
    )


@app.command()
def gateway(
    policy: PolicyOpt = None,
    uplink: UplinkOpt = None,
    guest: GuestLinkOpt = None,
) -> None:
    """Run the gateway daemon on interfaces it did not create (a gateway VM): --uplink IF and
    --guest IF=PROFILE per guest link, or uplink/guests in the policy's [gateway]."""
    from sandgate.gateway.handed import prepare
    from sandgate.gateway.server import run as run_daemon

    try:
        config = prepare(policy, uplink, guest or [])
    except SandgateError as exc:
        _fail(exc)
        return
    raise typer.Exit(run_daemon(str(config)))


@app.command()
def prove(
    world: Annotated[
        str | None,
        typer.Option(
            "--world",
            help="'test': sandgate's own test world; 'homelab': report 001's gateway VM, "
            "configured from its exported files, proved from every guest, rebooted, proved again",
        ),
    ] = None,
    policy: PolicyOpt = None,
    profile: ProfileOpt = None,
    mode: ModeOpt = None,
    instance: Annotated[
        str | None, typer.Option("--instance", help="prove this running gateway")
    ] = None,
    json_out: JsonOpt = False,
    # -- issue 9: VM guests ---------------------------------------------------------------
    vm: Annotated[
        bool, typer.Option("--vm", help="run the probes as root in a QEMU VM guest")
    ] = False,
    nic: Annotated[
        str, typer.Option("--nic", help="the VM's network: 'tap' (its guest link) or 'none'")
    ] = "tap",
) -> None:
    """Attack the gateway from inside a fresh guest; a table; exit 1 on any leak or false block."""
    from sandgate.prove.runner import ProveOptions
    from sandgate.prove.runner import prove as run_prove
    from sandgate.report.render import prove_table

    if world == "homelab":
        if nic != "tap":  # issue 10: --vm makes one homelab guest a QEMU VM on its bridge
            raise typer.BadParameter("--world homelab --vm: the VM's NIC is on its bridge")
        _prove_homelab(policy, profile, mode, instance, json_out, vm)
        return
    if world not in (None, "test"):
        raise typer.BadParameter("the worlds are 'test' and 'homelab'", param_hint="--world")
    try:
        result = run_prove(
            ProveOptions(
                world=world,
                policy=policy,
                profile=profile,
                mode=_mode(mode),
                instance=instance,
                vm=_vm_options(vm, nic, None),
            )
        )
    except SandgateError as exc:
        _fail(exc)
        return
    if json_out:
        for r in result.results:
            print(json.dumps(r.as_json()))
    else:
        out.print(prove_table(result))
        totals = result.totals()
        out.print(
            f"[green]{totals['PASS']} passed[/green], "
            f"[red]{totals['FAIL']} failed[/red], {totals['SKIP']} skipped "
            f"(session {result.session}; every attempt: sandgate log --session {result.session})"
        )
    raise typer.Exit(1 if result.failed else 0)


def _prove_homelab(
    policy: str | None,
    profile: str | None,
    mode: str | None,
    instance: str | None,
    js: bool,
    vm: bool = False,
) -> None:
    from sandgate.prove.homelab import prove_homelab, totals
    from sandgate.report.render import prove_table
    from sandgate.sandbox.launch import preflight

    if profile or mode or instance:
        _fail(SandgateError("--world homelab takes its guests from [gateway]", "drop the option"))
    try:
        preflight()
        proves = prove_homelab(policy, vm=vm)
    except SandgateError as exc:
        _fail(exc)
        return
    failed = totals(proves)["FAIL"] > 0
    if js:
        for p in proves:
            for row in p.rows():
                print(json.dumps(row))
    else:
        for p in proves:
            out.print(f"[bold]guest {p.guest} ({p.profile}), boot {p.boot}[/bold]")
            out.print(prove_table(p.result))
        t = totals(proves)
        out.print(
            f"[green]{t['PASS']} passed[/green], [red]{t['FAIL']} failed[/red], "
            f"{t['SKIP']} skipped: {len(proves)} guest runs, before and after a reboot from "
            "the exported files"
        )
    raise typer.Exit(1 if failed else 0)


@app.command()
def doctor(
    world: Annotated[
        str | None, typer.Option("--world", help="'test': check sandgate's own test world")
    ] = None,
    policy: PolicyOpt = None,
    profile: ProfileOpt = None,
    instance: Annotated[
        str | None, typer.Option("--instance", help="check this running gateway")
    ] = None,
    json_out: Annotated[bool, typer.Option("--json", help="one JSON object: every hop")] = False,
) -> None:
    """Hop by hop from inside a fresh sandbox: what works, what does not, and the fix."""
    from sandgate.doctor.runner import DoctorOptions
    from sandgate.doctor.runner import doctor as run_doctor
    from sandgate.report.render import doctor_table

    if world not in (None, "test"):
        raise typer.BadParameter("the only world is 'test'", param_hint="--world")
    try:
        result = run_doctor(
            DoctorOptions(world=world, policy=policy, profile=profile, instance=instance)
        )
    except SandgateError as exc:
        _fail(exc)
        return
    if json_out:
        print(json.dumps(result.as_json()))
    else:
        wide = _wide_console()
        wide.print(doctor_table(result))
        t = result.totals()
        out.print(
            f"[green]{t['ok']} ok[/green], [red]{t['fail']} failed[/red], {t['skip']} skipped "
            f"(session {result.session}; every attempt: sandgate log --session {result.session})"
        )
    raise typer.Exit(1 if result.failed else 0)


@app.command()
def cleanup(
    everything: Annotated[
        bool, typer.Option("--all", help="also what live sandgate processes own")
    ] = False,
    sessions: Annotated[
        bool,
        typer.Option(
            "--sessions",
            help="instead: remove kept session files past SANDGATE_KEEP_DAYS / SANDGATE_KEEP_MB",
        ),
    ] = False,
) -> None:
    """Remove every kernel object and process sandgate left behind after a crash."""
    from sandgate.cleanup import cleanup as do_cleanup
    from sandgate.sandbox.launch import preflight

    if sessions:  # issue 11, part 6: retention
        _cleanup_sessions()
        return
    try:
        preflight()
        result = do_cleanup(everything)
    except SandgateError as exc:
        _fail(exc)
        return
    if result.nothing:
        out.print(
            "nothing to clean up" + (f" (in use: {', '.join(result.kept)})" if result.kept else "")
        )
        return
    for label, items in (
        ("processes", result.processes),
        ("namespaces", result.namespaces),
        ("links", result.links),
        ("nftables tables", result.tables),
        ("session mounts", result.mounts),
        ("cgroups", result.cgroups),
        ("stale gateway guests", result.guests),
    ):
        if items:
            out.print(f"removed {label}: {', '.join(str(i) for i in items)}")
    if result.kept:
        out.print(f"left (still in use): {', '.join(result.kept)}")


def _cleanup_sessions() -> None:
    from sandgate.events.store import default_home
    from sandgate.session import retention

    try:
        limits = retention.Limits.from_env()
        result = retention.apply(default_home(), limits, full=True)  # issue 13: walks all
    except SandgateError as exc:
        _fail(exc)
        return
    days = f"{limits.days:g} days" if limits.days else "no age limit"
    size = f"{limits.mb:g} MB" if limits.mb else "no size limit"
    if result.removed:
        out.print(
            f"removed {len(result.removed)} session(s), {result.freed / 1048576:.1f} MB "
            f"({days}, {size}): {', '.join(result.removed)}"
        )
    else:
        out.print(f"no session to remove ({days}, {size})")
    if result.kept_running:
        out.print(f"left (still running): {', '.join(result.kept_running)}")


@app.command()
def demo(
    json_out: JsonOpt = False,
) -> None:
    """Build the test world, run a scripted agent locked and open, print both reports."""
    from sandgate.report.render import print_side_by_side
    from sandgate.session.demo import demo as run_demo

    try:
        result = run_demo()
    except SandgateError as exc:
        _fail(exc)
        return
    if json_out:
        for mode, r in result.runs:
            print(
                json.dumps(
                    {
                        "mode": mode,
                        "session": r.session,
                        "exit_code": r.exit_code,
                        **r.report.as_json(),
                    }
                )
            )
        return
    print_side_by_side([(mode, r.report) for mode, r in result.runs])
    out.print("Every attempt is in the event store: [bold]sandgate log --session last[/bold]")


@app.command()
def up(
    world: Annotated[
        str | None, typer.Option("--world", help="'test': bring up the test world behind it")
    ] = None,
    instance: Annotated[str | None, typer.Option("--instance", help="name of this gateway")] = None,
    policy: Annotated[
        str | None, typer.Option("--policy", "-p", help="default policy for runs on this gateway")
    ] = None,
    watchdog: Annotated[
        str | None, typer.Option("--watchdog", help="check the gateway every DURATION (1s, 500ms)")
    ] = None,
    notify: Annotated[
        str | None,
        typer.Option("--notify", help="on an alarm: run this command, or POST to this URL"),
    ] = None,
    world_model: WorldModelOpt = None,
    world_ipv6: Annotated[  # issue 14 part 5
        bool,
        typer.Option(
            "--world-ipv6",
            help="the test world gets an IPv6 internet (2001:db8::/32); guests get IPv6 egress",
        ),
    ] = False,
) -> None:
    """Bring up a gateway and keep it until Ctrl-C or `sandgate down`; restart it if it dies."""
    import signal as _signal
    import threading

    from sandgate.gateway.config import run_dir
    from sandgate.policy.load import load_policy
    from sandgate.sandbox.launch import preflight
    from sandgate.session.stack import bring_up, keep_up

    if world not in (None, "test"):
        raise typer.BadParameter("the only world is 'test'", param_hint="--world")
    interval = _duration(watchdog) if watchdog else None
    name = instance or ("test" if world == "test" else "main")
    try:
        preflight()
        if policy is not None:
            load_policy(policy)  # a broken policy file stops here, before anything is built
        if world_model is not None and world != "test":
            raise SandgateError("--world-model needs --world test", "add --world test")
        if world_ipv6 and world != "test":
            raise SandgateError("--world-ipv6 needs --world test", "add --world test")
        stack = bring_up(
            name,
            world=world == "test",
            watchdog=interval,
            notify=notify,
            policy=policy,
            world_model=world_model,
            world_ipv6=world_ipv6,
        )
    except SandgateError as exc:
        _fail(exc)
        return
    if policy is not None:
        (run_dir(name) / "policy").write_text(str(Path(policy).resolve()))
    stopping = threading.Event()

    def stop(signum: int, frame: object) -> None:
        stopping.set()

    def died() -> None:
        err.print(
            "[red]ALARM[/red] the gateway daemon died; its guests have no way out "
            "while it is down. Restarting it."
        )

    def restarted() -> None:
        err.print(f"gateway restarted (pid {stack.gateway.pid}); guests re-attached")
        _print_alarms(stack, stopping)

    _signal.signal(_signal.SIGTERM, stop)
    _signal.signal(_signal.SIGINT, stop)
    err.print(
        f"gateway [bold]{name}[/bold] is up (pid {stack.gateway.pid})"
        + (" with the test world" if stack.world else "")
        + (f", watchdog every {interval:g} s" if interval else "")
        + "; Ctrl-C or `sandgate down` stops it"
    )
    _print_alarms(stack, stopping)
    try:
        keep_up(stack, stopping, died=died, restarted=restarted)
    except SandgateError as exc:
        err.print(f"[red]ALARM[/red] the gateway could not be restarted: {exc}")
        raise typer.Exit(1) from None
    finally:
        stack.teardown()
    raise typer.Exit(0)


def _duration(text: str) -> float:
    value = text.strip().lower()
    try:
        if value.endswith("ms"):
            return float(value[:-2]) / 1000
        return float(value.removesuffix("s"))
    except ValueError:
        raise typer.BadParameter(
            f"{text!r}: write a duration like 1s or 500ms", param_hint="--watchdog"
        ) from None


def _print_alarms(stack: Any, stopping: Any) -> None:
    """Alarms (integrity events) from the gateway, to our stderr, as they happen."""
    import threading

    def follow() -> None:
        try:
            with stack.gateway.client() as client:
                for raw in client.stream("watch"):
                    if stopping.is_set():
                        return
                    if raw.get("kind") == "integrity":
                        d = raw.get("details") or {}
                        err.print(
                            f"[red]ALARM[/red] {d.get('integrity')}: "
                            + "; ".join(d.get("problems", []))
                            + (" — guests cut off" if d.get("cut") else ""),
                            highlight=False,
                        )
        except (SandgateError, OSError, ValueError):
            return

    threading.Thread(target=follow, daemon=True).start()


@app.command()
def down(
    instance: Annotated[str, typer.Option("--instance", help="which gateway")] = "",
) -> None:
    """Stop a gateway started with `sandgate up`."""
    from sandgate.session.stack import stop_up

    names = [instance] if instance else ["main", "test"]
    stopped = [name for name in names if stop_up(name)]
    out.print(f"stopped: {', '.join(stopped)}" if stopped else "no gateway was up")


# -- reload (issue 11, part 5) -------------------------------------------------------------------


@app.command()
def reload(
    policy: Annotated[str, typer.Option("--policy", "-p", help="the changed policy file")],
    instance: Annotated[
        str | None, typer.Option("--instance", help="which gateway (default: main, then test)")
    ] = None,
    make_default: Annotated[
        bool, typer.Option("--default", help="also make it the default policy of new runs")
    ] = False,
    json_out: JsonOpt = False,
) -> None:
    """Apply a changed policy to running sessions: new rules at once, refused flows cut."""
    import dataclasses

    from sandgate.gateway.manage import reload as do_reload

    try:
        r = do_reload(instance, policy, make_default)
    except SandgateError as exc:
        _fail(exc)
        return
    if json_out:
        print(json.dumps(dataclasses.asdict(r)))
    elif r.guests == 0:
        out.print(
            f"{r.policy} is valid; no guest uses it on gateway {r.instance}"
            + (" (now the default for new runs)" if r.default else "; --default makes it so")
        )
    else:
        out.print(
            f"reloaded {r.policy} on gateway {r.instance}: {r.guests} guest(s) use it, "
            f"{r.changed} with new rules, {r.cut} open connection(s) cut"
            + ("; now the default for new runs" if r.default else "")
        )


# -- end of reload --------------------------------------------------------------------------------


# -- issue 14: approve ----------------------------------------------------------------------------
@app.command()
def approve(
    name: Annotated[str | None, typer.Argument(help="the name that waits")] = None,
    always: Annotated[
        bool, typer.Option("--always", help="also add its rule to the policy's overlay file")
    ] = False,
    deny_it: Annotated[bool, typer.Option("--deny", help="refuse it (for this session)")] = False,
    list_them: Annotated[bool, typer.Option("--list", help="what waits for an answer")] = False,
    instance: Annotated[
        str | None, typer.Option("--instance", help="which gateway (default: main, then test)")
    ] = None,
    json_out: JsonOpt = False,
) -> None:
    """Answer a session run with --ask (internet = "ask"): a new name waits for this."""
    from sandgate.gateway import manage

    if list_them or name is None:
        try:
            pending = manage.approvals(instance)
        except SandgateError as exc:
            _fail(exc)
            return
        for p in pending:
            if json_out:
                print(json.dumps(p))
            else:
                out.print(
                    f"{p['name']}  session {p['session']}  waiting {p['waiting_s']} s",
                    highlight=False,
                )
        if not pending and not json_out:
            out.print("nothing waits for an answer")
        return
    if always and deny_it:
        raise typer.BadParameter("choose --always or --deny", param_hint="--deny")
    verdict = "deny" if deny_it else "always" if always else "allow"
    try:
        answer = manage.approve(instance, name, verdict)
    except SandgateError as exc:
        _fail(exc)
        return
    if json_out:
        print(json.dumps(answer))
    else:
        out.print(
            f"{verdict} {name}"
            + (f"; its rule is in {answer['overlay']}" if answer.get("overlay") else ""),
            highlight=False,
        )


# -- end issue 14: approve ------------------------------------------------------------------------


def main() -> Any:
    """An entry point from before ``sandgate.__main__:main`` (issue 13): typer is imported by
    now, but a run it reads still skips typer's parsing and pydantic."""
    from sandgate.runcli import fast_main

    code = fast_main(sys.argv[1:])
    if code is not None:
        sys.exit(code)
    return typer_main()


def typer_main() -> Any:
    try:
        return app()
    except KeyboardInterrupt:
        err.print("interrupted")
        sys.exit(130)


if __name__ == "__main__":
    sys.exit(main())
