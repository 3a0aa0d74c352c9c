"""``sandgate run``: one command in a fresh sandbox behind a gateway, then a report.

Uses the running gateway of the instance if there is one (``sandgate up``); otherwise brings
one up for its own duration (and, with ``world="test"``, the test world behind it). Everything
it made is removed on the way out: on success, on error, on Ctrl-C and on SIGTERM.
"""

from __future__ import annotations

import contextlib
import functools
import os
import re
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType

from sandgate import TYPE_CHECKING, cleanup
from sandgate.errors import SandboxError, SandgateError
from sandgate.events.schema import Event, Kind
from sandgate.events.store import SessionRow, Store, home_of
from sandgate.policy.limits import Limits, format_size
from sandgate.sandbox import bwrap, enter, limits, privilege
from sandgate.sandbox.launch import (
    CommandNotFound,
    Sandbox,
    ca_env,
    place_secrets,
    preflight,
    proxy_env,
)
from sandgate.sandbox.tree import compare
from sandgate.sandbox.workspace import WorkspaceSpec, stray_files
from sandgate.session import drift, evidence, modeluse
from sandgate.session.stack import Stack, stack_for
from sandgate.session.timings import Timings

if TYPE_CHECKING:  # QEMU guests' module is imported by the runs that use one (issue 13)
    from typing import Any

    from sandgate.gateway.control import ControlClient
    from sandgate.report.session import SessionReport
    from sandgate.vm.launch import VmOptions

UID_BASE = 61000


@dataclass
class RunOptions:
    """What ``run`` is asked to do."""

    command: Sequence[str]
    policy: str | None = None
    profile: str | None = None
    mode: str | None = None
    allow: Sequence[str] = ()
    deny: Sequence[str] = ()
    world: str | None = None  # "test" or None (the real uplink)
    workdir: Path | None = None
    timeout: float | None = None
    uid: int | None = None
    env: dict[str, str] = field(default_factory=dict)
    files: dict[str, Path] = field(default_factory=dict)  # extra read-only files: target -> source
    instance: str | None = None
    store: str | None = None
    label: str | None = None
    stop: threading.Event | None = None  # set it to end the session early (exit status 143)
    # Files that depend on the guest (its addresses, placeholders): called once it exists.
    late_files: Callable[[dict[str, Any]], dict[str, Path]] | None = None
    # The session's files: fixtures, home template, disk and quarantine limits, --keep-writes.
    space: WorkspaceSpec = field(default_factory=WorkspaceSpec)
    capture: bool = True  # keep the command's output (needed for claim checks); off for a TTY
    echo: bool = True  # and show it as it comes
    notify: str | None = None  # command or URL told when the session ends
    # Where the final answer starts in the output: a line matching this pattern (the answer is
    # its remainder and what follows). Default: "ANSWER:" lines, else the output's tail.
    answer_after: str | None = None
    details: dict[str, Any] = field(default_factory=dict)  # recorded with the session
    # --pids/--memory/--cpus; unset ones come from the profile's [limits], then the defaults.
    limits: Limits = field(default_factory=Limits)
    vm: VmOptions | None = None  # --vm: the command runs in a QEMU guest on the same link
    ask: bool = False  # --ask: a name the allowlist refuses waits for `sandgate approve`
    timings: Timings = field(default_factory=Timings)  # --timings: each phase, wall and CPU


@dataclass
class RunResult:
    """What a run ended with."""

    session: str
    exit_code: int
    # The report is built from the session's row and events, read before the store closed,
    # on first use: a quiet run shows none and loads no report code (issue 13).
    report_of: Callable[[], SessionReport] = field(repr=False, compare=False)
    message: str | None = None

    @functools.cached_property
    def report(self) -> SessionReport:
        return self.report_of()


class Interrupted(SandgateError):
    pass


def new_session_id() -> str:
    """The time to the second and 32 random bits. Sixteen bits collided in a 3,000-session
    soak (four at a time, ~4 a second): the second session's folder existed already.
    ``os.urandom(n).hex()`` is what ``secrets.token_hex`` returns; ``secrets`` (random, hmac)
    cost a run ~3 ms CPU to import (issue 13)."""
    return time.strftime("%Y%m%d-%H%M%S", time.gmtime()) + "-" + os.urandom(4).hex()


@contextlib.contextmanager
def signals_raise() -> Iterator[None]:
    """Turn SIGTERM/SIGHUP into an exception so every ``finally`` on the way out runs."""

    def handler(signum: int, frame: FrameType | None) -> None:
        raise Interrupted(f"stopped by signal {signal.Signals(signum).name}")

    old = {s: signal.signal(s, handler) for s in (signal.SIGTERM, signal.SIGHUP)}
    try:
        yield
    finally:
        for s, h in old.items():
            signal.signal(s, h)


def run(opts: RunOptions) -> RunResult:
    """Bring up (or find) a gateway, run one session in it, tear down what we brought up."""
    t = opts.timings
    with t.phase("preflight"):
        preflight()
    # Validate the policy before anything is built: a broken file changes nothing.
    with t.phase("policy check"):
        # On a running gateway without --policy there is no file of ours to check, and the
        # gateway answers for its profile: no policy/ (pydantic, ~100 ms CPU) in this process.
        if opts.policy is not None or (opts.world is None and opts.instance is None):
            from sandgate.policy.load import load_policy

            load_policy(opts.policy)
    if opts.vm is not None:
        from sandgate.vm import launch as vm_launch

        vm_launch.preflight(opts.vm)  # QEMU there, the guest built (once): before any stack
    with signals_raise(), contextlib.ExitStack() as exits:
        with t.phase("gateway (find or bring up)"):
            stack = exits.enter_context(
                stack_for(opts.world, opts.instance, opts.store, opts.policy)
            )
        return run_in(stack, opts)


def run_in(stack: Stack, opts: RunOptions) -> RunResult:
    """One session on an existing stack: create, snapshot, run, collect, snapshot, tear down."""
    t = opts.timings
    sid = new_session_id()
    with t.phase("store open"):
        store = Store(opts.store) if opts.store else Store()
    keep = session_dir(sid, opts.store)
    uid = opts.uid or UID_BASE
    exit_code, message = 1, None
    counters: dict[str, Any] = {}
    findings: dict[str, Any] = {}
    box: Sandbox | None = None
    started_at: float | None = None
    guest: dict[str, Any] | None = None
    cgroup: limits.Cgroup | None = None
    usage: limits.Usage | None = None
    before: dict[str, str | None] = {}
    retain: threading.Thread | None = None
    snapping: ControlClient | None = None  # the drift snapshot before, asked and not read yet
    destroyed = False  # the sandbox's namespace and folders are gone
    start_details = {**opts.details, **({"label": opts.label} if opts.label else {})}
    if opts.vm is not None:
        from sandgate.vm import launch as vm_launch
    vm = vm_launch.preflight(opts.vm) if opts.vm is not None else None
    if vm is not None and opts.vm is not None:
        start_details["vm"] = vm_launch.details(vm[1], opts.vm, vm[0])
        sys.stderr.write(
            f"sandgate: VM guest, accelerator {vm[1].name} ({vm[1].why}); "
            f"attempts are attributed {vm_launch.ATTRIBUTION}\n"
        )
    try:
        capture = keep / "output.log" if opts.capture else None
        # bwrap set up before the gateway answers (issue 13), where nothing it binds depends
        # on the answer: files that do (late_files) are bound where the answer says.
        ahead = vm is None and opts.late_files is None
        with t.phase("cgroup, first process"):
            # Made first (limits follow the gateway's answer): the sandbox's first process
            # joins it while the namespace, folders and add_guest are made, and the join's
            # wait (an RCU grace period) overlaps them; it is told its namespace after.
            cgroup = _cgroup(sid)
            if vm is None:
                box = Sandbox(sid, stack.instance)
                keep.mkdir(parents=True, exist_ok=True)
                entry = enter.Entry(enter.LATER, uid, uid, cgroup.procs, limits.SANDBOX_OOM_SCORE)
                ahead = box.prepare(entry, capture=capture, echo=opts.echo, late=ahead) and ahead
        with t.phase("workspace (netns, dirs, tmpfs)"):
            warm = _warm_netns(stack) if vm is None else None
            if box is None:
                box = Sandbox.create(sid, stack.instance, opts.workdir, uid, opts.space, warm)
            else:
                box.make(opts.workdir, uid, opts.space, warm)
            cleanup.own(box.netns)
        if ahead:
            with t.phase("sandbox set-up ahead (held before exec)"):
                _start_ahead(box, opts, uid, capture, cgroup)
        with t.phase("control add_guest") as ph:
            guest, snapping = _add_guest(stack, box, sid, opts, uid)
            ph.steps = dict(guest.get("timing_ms") or {})
        with t.phase("noexec, sandbox files"):
            if ahead and not _wants_noexec(stack, guest, opts):
                # Set up noexec ahead (the default), for a profile that opts out: again.
                box.abandon()
                if box.space is not None:
                    box.space.exec_again()
                ahead = False
            elif not ahead:
                _noexec(stack, box, guest, opts)
            spec = _spec(stack, box, guest, opts, uid)
        if vm is None and not ahead:
            # bwrap makes its namespaces and mounts while the limits are written: it stops
            # at its --block-fd before the command, which runs only once they are set.
            with t.phase("sandbox set-up (held before exec)"), contextlib.suppress(CommandNotFound):
                box.start(  # run() says "not found" in its place
                    spec,
                    capture=capture,
                    echo=opts.echo,
                    cgroups=cgroup.procs,
                    oom_score=limits.SANDBOX_OOM_SCORE,
                )
        with t.phase("cgroup limits"):
            _limit(cgroup, stack, guest, opts)
            start_details["limits"] = cgroup.as_json()
        with t.phase("drift snapshot before"):
            asked, snapping = snapping, None  # _snapshot closes it
            before, _ = _snapshot(stack, box, asked=asked)
        t_row = t.begin("session row")
        store.session_start(
            sid,
            mode=guest["mode"],
            profile=guest["profile"],
            policy=guest["policy"],
            world=opts.world,
            guest=guest["guest"],
            uid=uid,
            command=list(opts.command),
            details=start_details or None,
        )
        keep.mkdir(parents=True, exist_ok=True)
        t_row.end()
        started_at = time.time()
        # Retention of older sessions' files meanwhile: the main thread only waits for the
        # sandbox now, and this session's own folder is never a candidate (issue 13). Started
        # once the command is released: before, its Python work delayed the release.
        retain = threading.Thread(target=_retain, args=(opts.store, sid), name="retention")
        t_exec = t.begin("sandbox exec")
        try:
            if vm is not None and opts.vm is not None:
                retain.start()
                exit_code = vm_launch.run(
                    box,
                    spec,
                    guest,
                    opts.vm,
                    *vm,
                    opts.timeout,
                    opts.stop,
                    capture=keep / "output.log" if opts.capture else None,
                    echo=opts.echo,
                    prefix=cgroup.prefix_argv(),
                )
            else:
                exit_code = box.run(
                    spec,
                    opts.timeout,
                    opts.stop,
                    capture=keep / "output.log" if opts.capture else None,
                    echo=opts.echo,
                    cgroups=cgroup.procs,
                    oom_score=limits.SANDBOX_OOM_SCORE,
                    released=retain.start,
                )
            if exit_code == 124 and opts.timeout:
                message = f"timed out after {opts.timeout:g} s; the sandbox was killed"
        except CommandNotFound as exc:
            exit_code, message = 127, str(exc)
        except SandboxError as exc:
            if opts.vm is None:
                raise
            exit_code, message = 125, str(exc)  # the VM did not boot or run the command
        finally:
            t_exec.end()
        if not stack.gateway.alive():
            message = (
                "the gateway died during the session; the sandbox had no way out (fail closed)"
            )
    except KeyboardInterrupt:
        exit_code, message = 130, "interrupted"
    except Interrupted as exc:
        exit_code, message = 143, exc.message
    finally:
        if snapping is not None:  # failed before reading it: nobody wants the answer
            snapping.close()
        try:
            with t.phase("teardown: kill, cgroup"):
                if box is not None:
                    box.kill()
                if cgroup is not None:
                    usage = cgroup.usage()
                    cgroup.remove()  # kills what is left of the sandbox's processes, then rmdir
                    cleanup.disown(cgroup.name)
            quiet_since = time.time()  # nothing of the guest's runs any more
            removal = _Removal(stack, guest["guest"], quiet_since) if guest is not None else None
            if guest is not None and box is not None and removal is not None:
                with t.phase("findings (drift snapshot after, writes)"):
                    try:
                        findings = _findings(stack, box, keep, before, set(box.bound), removal)
                    except Exception as exc:  # a finding we cannot make must not keep the box
                        findings = {"findings_error": f"{type(exc).__name__}: {exc}"}
            # The sandbox's disk is read: its namespace and folders go while the gateway
            # removes the guest (both mostly wait on the kernel; issue 13). The gateway's
            # sockets in the namespace keep it alive until the gateway lets go of it.
            with t.phase("teardown: netns, dirs"):
                if box is not None:
                    box.destroy()
                    if box.netns:
                        cleanup.disown(box.netns)
                    destroyed = True
            if removal is not None:
                with t.phase("control remove_guest (log settle)") as ph:
                    removed = removal.result()
                    if removed is not None:
                        counters = removed.get("counters", {})
                        ph.steps = dict(removed.get("timing_ms") or {})
        finally:
            if box is not None and not destroyed:  # on the way out with an error
                with t.phase("teardown: netns, dirs"):
                    box.destroy()
                    if box.netns:
                        cleanup.disown(box.netns)
    if guest is None:
        store.close()
        raise SandgateError(message or "the sandbox could not be started")
    t_report = t.begin("report (store, claims, OCSF)")
    facts = findings.pop(FILE_FACTS, None)
    hits: list[dict[str, Any]] = []
    if cgroup is not None and usage is not None:
        hits = _limit_events(store, sid, guest["guest"], cgroup, usage)
        if hits and not message:
            message = "; ".join(h["text"] for h in hits)
    end = {**findings, "counters": counters, **({"message": message} if message else {})}
    model_broke = False
    if stack.world is not None and started_at is not None:
        end["model_use"] = use = _model_use(stack.world.logs, started_at, time.time())
        if use.get("aborted"):
            # The agent's answer after a broken stream is the model server's failure, not a
            # claim the agent made: it is reported, and not held against the evidence.
            model_broke = True
            broke = f"the model server stopped mid-stream ({use['aborted']} stream(s))"
            message = end["message"] = f"{message}; {broke}" if message else broke
    if cgroup is not None:
        end["limits"] = cgroup.as_json()
        end["limit_hits"] = hits
        if usage is not None:
            end["usage"] = {"pids_peak": usage.pids_peak, "memory_peak": usage.memory_peak}
    # Every event of the session is in: the gateway flushed its own before remove_guest's
    # reply, and the runner's (limit notices) are added above. Read once (issue 13).
    rows = store.events_with_ids(session=sid)
    events = [e for _, e in rows]
    if box is not None and box.output is not None:
        end["output"] = str(box.output)
        end["answer"] = answer = final_answer(_read_output(box.output), opts.answer_after)
        if model_broke:
            end["claims_skipped"] = "the model server stopped mid-stream"
        else:
            end.update(_claims(stack, opts, guest, events, answer, facts))
    store.session_end(sid, exit_code, {**start_details, **end})
    export_ocsf(keep / OCSF_FILE, rows)
    report_of = _report_of(store.session(sid), events, counters)
    store.close()
    t_report.end()
    result = RunResult(sid, exit_code, report_of, message)
    if opts.notify:
        notify(opts.notify, {"event": "session-end", **report_summary(result.report)})
    with t.phase("retention"):
        if retain is not None and retain.ident is not None:
            retain.join()
        else:  # the command never started
            _retain(opts.store, sid)
    return result


def _report_of(
    row: SessionRow | None, events: list[Event], counters: dict[str, Any]
) -> Callable[[], SessionReport]:
    def build() -> SessionReport:
        from sandgate.report.session import build_report

        return build_report(row, events, counters)

    return build


def _claims(
    stack: Stack,
    opts: RunOptions,
    guest: dict[str, Any],
    events: Sequence[Event],
    answer: str,
    facts: Any,
) -> dict[str, Any]:
    """The claim check's findings (``claims``), or why it failed (``claims_error``), from the
    session's ``events`` (read once for the check, the OCSF file and the report)."""
    if not answer.strip():
        return {"claims": []}  # an empty answer claims nothing (evidence.findings agrees)
    try:
        override = stack.world.public_override if stack.world is not None else ()
        reach = evidence.reach_when_asked(
            lambda: evidence.reach_by_policy(
                _policy_of(stack, opts),
                guest["profile"],
                guest["mode"],
                opts.allow,
                opts.deny,
                override,
            )
        )
        found = evidence.findings(answer, events, facts, guest.get("model_hosts", []), reach)
    except Exception as exc:  # the claim check is a finding, never a reason to lose a run
        return {"claims_error": f"{type(exc).__name__}: {exc}"}
    return {"claims": found}


def _model_use(logs: dict[str, Path], start: float, end: float) -> dict[str, Any]:
    """The session's requests to the test world's model servers (the LAN one and the hosted
    look-alike), from their own logs (session/modeluse.py)."""
    records = [r for k in ("model", "openai") if k in logs for r in modeluse.read_log(logs[k])]
    return modeluse.summarize(records, start, end).as_json()


def _retain(store: str | None, sid: str) -> None:
    """Retention of kept session files (session/retention.py), while each session's command
    runs; a problem is said on stderr and never changes the session's outcome."""
    from sandgate.session import retention

    try:
        retention.apply(home_of(store), keep={sid})
    except (SandgateError, OSError) as exc:
        sys.stderr.write(f"sandgate: session retention: {exc}\n")


def notify(target: str, payload: dict[str, Any]) -> None:
    """--notify: run the command (payload in $SANDGATE_ALARM) or POST to the URL; a failure
    to notify is said on stderr and never changes the session's outcome."""
    from sandgate.gateway.integrity import alarm

    problem = alarm(target, payload)
    if problem:
        sys.stderr.write(f"sandgate: --notify {target!r} failed: {problem}\n")


def report_summary(report: SessionReport) -> dict[str, Any]:
    names = sorted({n.name for n in report.names})
    return {
        "session": report.session,
        "exit_code": report.exit_code,
        "mode": report.mode,
        "names": names,
        "totals": report.totals,
    }


FILE_FACTS = "_file_facts"  # not stored: the claim check's view of the session's files
ANSWER_MARK = "ANSWER:"
ANSWER_LIMIT = 8000


def final_answer(output: str, after: str | None = None) -> str:
    """The agent's final answer: what follows the last line matching ``after`` (default: an
    ``ANSWER:`` line, whose remainder is part of it), else the output's tail."""
    pattern = re.compile(after or rf"^{ANSWER_MARK}", re.M)
    matches = list(pattern.finditer(output))
    if matches:
        return output[matches[-1].end() :].strip()[:ANSWER_LIMIT]
    return output.strip()[-ANSWER_LIMIT:]


def _read_output(path: Path) -> str:
    try:
        return path.read_bytes()[-(1 << 20) :].decode("utf-8", "replace")
    except OSError:
        return ""


OCSF_FILE = "events.ocsf.jsonl"  # the session's attempts as OCSF, for a SIEM (events/ocsf.py)


def export_ocsf(path: Path, rows: list[tuple[int, Any]]) -> None:
    """Write the session's OCSF file whole (a temporary file renamed into place); a failure is
    said on stderr and never changes the session's outcome: the store still has the events."""
    from sandgate.events.ocsf import write_jsonl

    tmp = path.with_name(f".{path.name}.tmp")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), "w") as f:
            write_jsonl(rows, f)
        tmp.replace(path)
    except OSError as exc:
        sys.stderr.write(f"sandgate: could not write {path}: {exc}\n")
        with contextlib.suppress(OSError):
            tmp.unlink()


def session_dir(sid: str, store: str | None = None) -> Path:
    """Where a session's kept files live: output, quarantine, work dir copy."""
    return home_of(store) / "sessions" / sid


def _policy_of(stack: Stack, opts: RunOptions) -> str | None:
    world = stack.world
    policy = opts.policy or stack.policy or (str(world.policy) if world is not None else None)
    # The daemon's working folder is not ours: an absolute path, so `sandgate reload` (and
    # the watchdog's policy check) find the file this guest was started with.
    return str(Path(policy).resolve()) if policy is not None else None


def _noexec(stack: Stack, box: Sandbox, guest: dict[str, Any], opts: RunOptions) -> None:
    """Writable places are noexec unless the profile opts out (issue 14: a process identity
    is worth little if the agent can write its own executable, or preload a library)."""
    if _wants_noexec(stack, guest, opts) and box.space is not None:
        box.space.noexec()


def _wants_noexec(stack: Stack, guest: dict[str, Any], opts: RunOptions) -> bool:
    noexec = guest.get("noexec")
    if noexec is None:  # a gateway from before it said so
        from sandgate.policy.load import load_policy

        profile = load_policy(_policy_of(stack, opts)).file.profiles.get(guest["profile"])
        noexec = profile is None or profile.noexec
    return bool(noexec)


PLACEHOLDER_GATEWAY = "0.0.0.0"  # resolv.conf until the gateway answers


def _start_ahead(
    box: Sandbox, opts: RunOptions, uid: int, capture: Path | None, cgroup: limits.Cgroup
) -> None:
    """bwrap's namespaces and mounts, made while the gateway joins the guest (issue 13): the
    writable places noexec (the default; undone for a profile that opts out), and every file
    bound where the gateway's answer will fill it in (``_spec`` writes the same files again,
    in place, so the binds show the new content). The command and its environment follow at
    ``run``. A command not found is said there, as before."""
    if box.space is not None:
        box.space.noexec()
    files = {**box.etc_files(PLACEHOLDER_GATEWAY, uid, [b""]), **box.copy_in(dict(opts.files))}
    frame = _sandbox_spec(box, opts, uid, files)
    with contextlib.suppress(CommandNotFound):
        box.start(
            frame,
            capture=capture,
            echo=opts.echo,
            cgroups=cgroup.procs,
            oom_score=limits.SANDBOX_OOM_SCORE,
        )


def _cgroup(sid: str) -> limits.Cgroup:
    """The session's cgroup, its limits not set yet (``_limit``)."""
    name = limits.PREFIX + sid
    cleanup.own(name)  # before it exists: a crash in between leaves it to `sandgate cleanup`
    try:
        return limits.make(name)
    except BaseException:
        cleanup.disown(name)
        raise


def _limit(cg: limits.Cgroup, stack: Stack, guest: dict[str, Any], opts: RunOptions) -> None:
    """The run's limits over the profile's, over the defaults: set before the command runs."""
    if "limits" in guest:  # the profile's [limits], as the gateway read its file
        wanted = opts.limits.over(Limits(**guest["limits"]))
    else:  # a gateway from before it said so
        from sandgate.policy.load import load_policy

        profile = load_policy(_policy_of(stack, opts)).file.profiles.get(guest["profile"])
        wanted = opts.limits.over(profile.limits.limits() if profile else Limits())
    limits.apply(cg, wanted.with_defaults(limits.host_memory()))
    cg.start_sampling()


def _limit_events(
    store: Store, sid: str, guest: str, cg: limits.Cgroup, usage: limits.Usage
) -> list[dict[str, Any]]:
    """One notice per limit the session hit (``limit.pids``, ``limit.memory``), with the peak."""
    hits: list[dict[str, Any]] = []
    lim = cg.limits
    if usage.pids_hits:
        hits.append(
            {
                "reason": limits.REASON_PIDS,
                "limit": lim.pids,
                "peak": usage.pids_peak,
                "refused": usage.pids_hits,
                "text": f"pids limit hit: {usage.pids_hits} fork(s) refused at {lim.pids} "
                f"processes (peak {usage.pids_peak})",
            }
        )
    if usage.oom_kills:
        assert lim.memory is not None
        text = (
            f"memory limit hit: {usage.oom_kills} process(es) killed by the kernel at "
            f"{format_size(lim.memory)} (peak {format_size(usage.memory_peak)}); "
            "a killed process exits 137 (SIGKILL)"
        )
        if lim.memory < limits.TOO_SMALL:
            text += f"; --memory {format_size(lim.memory)} is too little for the command to start"
        hits.append(
            {
                "reason": limits.REASON_MEMORY,
                "limit": lim.memory,
                "peak": usage.memory_peak,
                "oom_kills": usage.oom_kills,
                "text": text,
            }
        )
    if hits:
        store.add(
            Event(
                kind=Kind.NOTICE,
                session=sid,
                guest=guest,
                reason=h["reason"],
                details={k: v for k, v in h.items() if k != "reason"},
            )
            for h in hits
        )
    return hits


def _warm_netns(stack: Stack) -> str | None:
    """A namespace the gateway made ready with its link (gateway/pool.py), or None: make one.
    An older gateway without the op answers an error, which means the same."""
    try:
        with stack.gateway.client() as ctl:
            name = ctl.call("take_netns", pid=os.getpid()).get("netns")
    except SandgateError:
        return None
    return name if isinstance(name, str) else None


def _add_guest(
    stack: Stack, box: Sandbox, sid: str, opts: RunOptions, uid: int
) -> tuple[dict[str, Any], ControlClient]:
    """The join, and the connection the drift snapshot before is asked on: right behind the
    join (one connection's requests are answered in order, so it sees the guest joined), its
    answer read once the sandbox is set up (``_snapshot``), so the gateway's part of it
    overlaps the runner's files, limits and bwrap (issue 13)."""
    policy = _policy_of(stack, opts)
    ctl = stack.gateway.client()
    try:
        ctl.send(
            "add_guest",
            netns=box.netns,
            session=sid,
            policy=policy,
            profile=opts.profile,
            mode=opts.mode,
            allow=list(opts.allow),
            deny=list(opts.deny),
            uid=uid,
            **({"ask": True} if opts.ask else {}),
        )
        ctl.send("snapshot")
        guest: dict[str, Any] = ctl.receive()
    except BaseException:
        ctl.close()
        raise
    return guest, ctl


def _spec(
    stack: Stack, box: Sandbox, guest: dict[str, Any], opts: RunOptions, uid: int
) -> bwrap.SandboxSpec:
    world = stack.world
    cas = [guest["ca"].encode()] + ([world.ca_cert.read_bytes()] if world else [])
    late = opts.late_files(guest) if opts.late_files is not None else {}
    files = {
        **box.etc_files(guest["gateway"], uid, cas),
        **box.copy_in({**opts.files, **late}),
    }
    env = {
        **ca_env(),
        **proxy_env(guest["proxy"]),
        **place_secrets(box.home, uid, guest.get("secrets", {})),
        "PATH": f"{privilege.SHIM_DIR}:{bwrap.SANDBOX_PATH}",
        # Where host_loopback ports are reached: OLLAMA_HOST=http://$SANDGATE_GATEWAY:11434
        "SANDGATE_GATEWAY": guest["gateway"],
        **opts.env,
    }
    return _sandbox_spec(box, opts, uid, files, env)


def _sandbox_spec(
    box: Sandbox,
    opts: RunOptions,
    uid: int,
    files: dict[str, Path],
    env: dict[str, str] | None = None,
) -> bwrap.SandboxSpec:
    assert box.space is not None
    return bwrap.SandboxSpec(
        netns=f"/run/netns/{box.netns}",
        uid=uid,
        gid=uid,
        command=tuple(opts.command),
        workdir=box.workdir,
        home=box.home,
        files=files,
        scratch=box.space.scratch(),
        env=env if env is not None else {},
    )


def _snapshot(
    stack: Stack,
    box: Sandbox,
    removal: _Removal | None = None,
    asked: ControlClient | None = None,
) -> tuple[dict[str, str | None], dict[str, Any]]:
    """The drift snapshot, and the gateway's own answer (digest, expected digest).
    ``removal``: asked on the same connection, right behind the snapshot. ``asked``: a
    connection the snapshot was asked on already (``_add_guest``): its answer is read there."""
    ctl = asked or stack.gateway.client()
    try:
        if asked is None:
            ctl.send("snapshot")
        if removal is not None:
            removal.send_on(ctl)
        raw: dict[str, Any] = ctl.receive()
    finally:
        if removal is None or not removal.owns(ctl):
            ctl.close()
    # Read after the answer: read while the gateway answered, on two busy cores, it made
    # teardown no faster (18.8/21.7 against 15.6/21.7 ms median, load 4; issue 13).
    snap = {**drift.gateway_snapshot(raw), **drift.sandbox_snapshot(box.home, box.dir / "etc")}
    return snap, raw


class _Removal:
    """The guest's remove_guest (issue 13), asked as soon as the guest's processes are gone:
    sent right behind the drift snapshot's request on the same connection, so the gateway
    answers the snapshot first (it must still see the guest's rules, and would otherwise wait
    for the lock the removal holds while the rules and link go), then leaves the guest while
    the runner reads the sandbox's disk. No thread: the reply is read when it is needed. A
    restore waits for it: its check would reset the counters the removal reads."""

    def __init__(self, stack: Stack, guest: str, quiet_since: float) -> None:
        self.stack, self.guest, self.quiet_since = stack, guest, quiet_since
        self._ctl: ControlClient | None = None
        self._done = False
        self._reply: dict[str, Any] | None = None

    def send_on(self, ctl: ControlClient) -> None:
        """Ask on ``ctl``, behind what was sent on it already; this takes over ``ctl``."""
        self._ctl = ctl
        ctl.send("remove_guest", guest=self.guest, quiet_since=self.quiet_since)

    def owns(self, ctl: ControlClient) -> bool:
        return self._ctl is ctl

    def result(self) -> dict[str, Any] | None:
        """The gateway's reply (None: it refused, or went away); asks now if nothing did."""
        if self._done:
            return self._reply
        self._done = True
        try:
            if self._ctl is None:
                self._ctl = self.stack.gateway.client()
                self._ctl.send("remove_guest", guest=self.guest, quiet_since=self.quiet_since)
            self._reply = self._ctl.receive()
        except SandgateError:
            pass  # as before: the report says what it has
        finally:
            if self._ctl is not None:
                self._ctl.close()
        return self._reply


def _findings(
    stack: Stack,
    box: Sandbox,
    keep: Path,
    before: dict[str, str | None],
    mountpoints: set[str],  # sandbox paths bwrap bound files onto: their mount points are ours
    removal: _Removal | None = None,
) -> dict[str, Any]:
    """After the command: drift (restoring a changed gateway), stray writes, privilege attempts.
    ``removal``: asked right behind the drift snapshot, and waited for before a changed
    gateway is restored (a restore's check would reset the counters the removal reads)."""
    assert box.space is not None
    out: dict[str, Any] = {}
    after, raw = _snapshot(stack, box, removal)
    result = drift.Drift(items=drift.diff(before, after))
    if raw.get("digest") != raw.get("expected") or not raw.get("forwarding", True):
        # Changed from outside the gateway's own bookkeeping: restore and flag it.
        result.gateway_changed = True
        if not any(i.what == "gateway ruleset" for i in result.items):
            note = "(the ruleset differs from the one the gateway set)"
            result.items.insert(0, drift.DriftItem("gateway ruleset", "changed", note, True))
        if removal is not None:
            removal.result()
        with stack.gateway.client() as ctl:
            first = ctl.call("check")
            second = ctl.call("check")
        result.gateway_problems = list(first.get("problems", []))
        result.gateway_restored = not second.get("problems")
    else:
        # Other sessions' guests come and go on a shared gateway: not this agent's drift.
        result.items = [i for i in result.items if i.what != "gateway ruleset"]
    out["drift"] = result.as_json()
    log = privilege.PRIVILEGE_LOG
    changes = box.space.changes(mountpoints | {log})  # once: it hashes every file it lists
    work_after = box.space.work_after()
    # Read now, while the session's disk exists; the claims are checked once events are in.
    out[FILE_FACTS] = evidence.file_facts(
        work_after, box.space.work_before, box.workdir, stray_files(changes)
    )
    out["writes"] = box.space.collect(keep, changes, work_after).as_json()
    out["privilege"] = privilege.attempts(box.dir / "run" / log.removeprefix("/run/"))
    out["work_changes"] = [
        {"path": c.path, "change": c.change, "size": c.entry.size, "sha256": c.entry.sha256}
        for c in compare(box.space.work_before, work_after or {})
        if c.entry.kind == "file" and work_after is not None
    ]
    return out
