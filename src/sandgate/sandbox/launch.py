"""One sandbox: a guest namespace, its files, and the sandboxed process.

The guest namespace is made here (named, so it outlives a gateway restart); the gateway daemon
gives it its only link. The process runs under bubblewrap as an unprivileged uid (bwrap.py).
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib.util
import os
import select
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from sandgate import TYPE_CHECKING, cleanup
from sandgate.errors import SandboxError, SetupError
from sandgate.net import ns
from sandgate.sandbox import bwrap, enter, privilege
from sandgate.sandbox.workspace import SESSIONS_ROOT, Workspace, WorkspaceSpec

if TYPE_CHECKING:
    from typing import Any

CA_VARS = (
    "SSL_CERT_FILE",
    "REQUESTS_CA_BUNDLE",
    "CURL_CA_BUNDLE",
    "PIP_CERT",
    "GIT_SSL_CAINFO",
    "NODE_EXTRA_CA_CERTS",
)
SYSTEM_BUNDLE = Path("/etc/ssl/certs/ca-certificates.crt")
TOOLS = {"bwrap": "bubblewrap", "setpriv": "util-linux", "nsenter": "util-linux", "nft": "nftables"}


def preflight() -> None:
    """Say plainly what is missing, before anything is created."""
    missing_caps = [
        name
        for bit, name in ((12, "CAP_NET_ADMIN"), (21, "CAP_SYS_ADMIN"))
        if not _has_capability(bit)
    ]
    if missing_caps:
        raise SetupError(
            f"sandgate needs root ({' and '.join(missing_caps)} missing) to create network "
            "namespaces, links and nftables rules",
            "run it as root, e.g. with sudo",
        )
    missing = sorted({pkg for tool, pkg in TOOLS.items() if shutil.which(tool) is None})
    if missing:
        raise SetupError(
            f"missing tools: {', '.join(t for t, p in TOOLS.items() if p in missing)}",
            f"apt-get install {' '.join(missing)}",
        )


def _left(deadline: float | None) -> float | None:
    return None if deadline is None else max(0.0, deadline - time.monotonic())


def _usable_by(uid: int, directory: Path) -> bool:
    """Can ``uid`` enter and write ``directory``? Asked as that uid, not computed from modes."""
    probe = [
        "setpriv",
        f"--reuid={uid}",
        f"--regid={uid}",
        "--clear-groups",
        "--",
        "test",
        "-x",
        str(directory),
        "-a",
        "-w",
        str(directory),
    ]
    return subprocess.run(probe, check=False, capture_output=True).returncode == 0


def _check_workdir(workdir: Path, uid: int) -> None:
    if not workdir.is_dir():
        raise SandboxError(f"work dir {workdir} does not exist")
    if not _usable_by(uid, workdir.resolve()):
        raise SandboxError(
            f"the sandbox's uid {uid} cannot write to {workdir.resolve()} (or reach it)",
            f"chown {uid} {workdir.resolve()}, or choose a directory it can reach",
        )


def _has_capability(bit: int) -> bool:
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("CapEff:"):
                return bool(int(line.split()[1], 16) >> bit & 1)
    except OSError:
        pass
    return os.geteuid() == 0


@dataclass
class Sandbox:
    """One guest: its namespace, folders, cgroup and process."""

    session: str
    instance: str
    netns: str = ""
    dir: Path = field(default_factory=Path)
    space: Workspace | None = None
    proc: subprocess.Popen[bytes] | None = None
    output: Path | None = None  # where the command's output was captured, if it was
    bound: set[str] = field(default_factory=set)  # sandbox paths files were bound onto
    _release: int | None = None  # write end of the pipe a started bwrap waits on
    _pump: threading.Thread | None = None
    _entered: Callable[[], None] = field(default=lambda: None, repr=False)
    _prepared: enter.Entry | None = None  # prepare() started the first process for this
    _launch: Callable[[Sequence[str] | None], None] | None = None
    _hold_fd: int = -1  # the number bwrap's end of the hold pipe has in the started process
    _started: bool = False  # bwrap's command line given: ``run`` releases it
    # prepare(late=True): bwrap runs sandgate-enter --late, which waits for the command and
    # its environment on this pipe (our end); the fds it has there; the spec bwrap was given.
    _late: int | None = None
    _late_fds: tuple[int, int] | None = None  # (blob, self) as numbered in the process
    _late_spec: bwrap.SandboxSpec | None = None

    @property
    def workdir(self) -> Path:
        return self.space.workdir if self.space else Path()

    @property
    def home(self) -> Path:
        return self.space.home if self.space else Path()

    @classmethod
    def create(
        cls,
        session: str,
        instance: str,
        workdir: Path | None,
        uid: int,
        files: WorkspaceSpec | None = None,
        netns: str | None = None,
    ) -> Sandbox:
        """``netns``: a namespace the gateway made ready (its warm pool), taken over: this
        sandbox removes it at the end as one of its own."""
        box = cls(session, instance)
        box.make(workdir, uid, files, netns)
        return box

    def make(
        self,
        workdir: Path | None,
        uid: int,
        files: WorkspaceSpec | None = None,
        netns: str | None = None,
    ) -> None:
        """``create``'s namespace and folders, for a sandbox whose first process was started
        before them (``prepare`` with the namespace given later). On failure all is undone."""
        self.netns = netns or f"sg-{self.instance}-s{os.urandom(3).hex()}"
        self.dir = SESSIONS_ROOT / self.session
        try:
            if workdir is not None:
                _check_workdir(workdir, uid)
            SESSIONS_ROOT.mkdir(parents=True, exist_ok=True)
            os.chmod(SESSIONS_ROOT, 0o711)
            self.space = Workspace(self.dir, uid, files or WorkspaceSpec())
            cleanup.own(f"mount-{self.session}")
            self.space.create(workdir)
            if netns is None:
                ns.create(self.netns)
        except BaseException:
            self.destroy()
            raise

    def etc_files(self, gateway: str, uid: int, extra_ca: list[bytes]) -> dict[str, Path]:
        """The files the sandbox sees in place of the host's: resolver, users, CA trust."""
        etc = self.dir / "etc"
        files: dict[str, Path] = {}
        (etc / "resolv.conf").write_text(
            f"nameserver {gateway}\noptions edns0 timeout:2 attempts:2\n"
        )
        files["/etc/resolv.conf"] = etc / "resolv.conf"
        (etc / "hosts").write_text("127.0.0.1\tlocalhost\n127.0.1.1\tsandgate\n")
        files["/etc/hosts"] = etc / "hosts"
        passwd, group = bwrap.passwd_lines(
            uid, uid, Path("/etc/passwd").read_text(), Path("/etc/group").read_text()
        )
        (etc / "passwd").write_text(passwd)
        (etc / "group").write_text(group)
        files["/etc/passwd"] = etc / "passwd"
        files.update(privilege.shim_targets(privilege.write_shim(etc)))
        files["/etc/group"] = etc / "group"
        if extra_ca:
            # The system's trust plus the gateway's inspection CA (and the test world's CA).
            bundle = etc / "ca-certificates.crt"
            system = SYSTEM_BUNDLE.read_bytes() if SYSTEM_BUNDLE.exists() else b""
            parts = [system.rstrip(b"\n"), *(c.strip() for c in extra_ca)]
            bundle.write_bytes(b"\n".join(parts) + b"\n")
            files[str(SYSTEM_BUNDLE)] = bundle
            # Python clients that ignore SSL_CERT_FILE read certifi's own bundle: cover it too.
            for certifi_path in certifi_bundles():
                files[certifi_path] = bundle
        for path in files.values():
            os.chmod(path, 0o755 if path.name == "no-privileges.sh" else 0o644)
        self.bound.update(files)
        return files

    def copy_in(self, files: dict[str, Path]) -> dict[str, Path]:
        """Copies of host files the sandbox may read (the originals may sit in a private dir)."""
        out: dict[str, Path] = {}
        folder = self.dir / "files"
        for i, (target, source) in enumerate(sorted(files.items())):
            folder.mkdir(mode=0o755, exist_ok=True)
            copy = folder / f"{i}-{Path(target).name}"
            shutil.copyfile(source, copy)
            os.chmod(copy, 0o755 if os.access(source, os.X_OK) else 0o644)
            out[target] = copy
        self.bound.update(out)
        return out

    def prepare(
        self,
        entry: enter.Entry,
        capture: Path | None = None,
        echo: bool = True,
        late: bool = False,
    ) -> bool:
        """Start the sandbox's first process before its command line is known: sandgate-enter
        joins the cgroup and becomes the sandbox's uid meanwhile (``start`` hands it bwrap's
        command line). False where the helper cannot be built (``start`` does it all then).

        ``late``: ``start`` may then be given a spec whose environment is not known yet (bwrap
        sets up, and waits in sandgate-enter --late for it); ``run`` sends it."""
        found = enter.helper()
        if found is None:
            return False
        if late:
            blob, self._late = os.pipe2(os.O_CLOEXEC)
            try:
                self_fd = os.open(found, os.O_RDONLY | os.O_CLOEXEC)
            except BaseException:
                os.close(blob)
                self._unhold()
                raise
            fds: tuple[int, ...] = (blob, self_fd)
        else:
            fds = (self._hold(),)
        try:
            self.proc, self._launch, self._entered = enter.ahead(
                entry, start_new_session=True, pass_fds=fds, **_output(capture)
            )
        except BaseException:
            self._unhold()
            raise
        finally:
            for fd in fds:
                os.close(fd)
        self._prepared = entry
        if late:
            self._late_fds = (fds[0], fds[1])
        else:
            self._hold_fd = fds[0]
        self._capture(capture, echo)
        return True

    def start(
        self,
        spec: bwrap.SandboxSpec,
        capture: Path | None = None,
        echo: bool = True,
        cgroups: Sequence[str] = (),
        oom_score: int | None = None,
    ) -> None:
        """Set the sandbox up and hold it just before the command's exec, until ``run``.

        The process joins ``cgroups`` (cgroup.procs files) and becomes the sandbox's uid
        (enter.py), then bwrap makes its namespaces and mounts and waits on ``--block-fd``.
        Most of that is waiting, not work (a cgroup v1 join waits out an RCU grace period,
        5-17 ms here, and so do bwrap's namespaces): started early, it overlaps the runner's
        own steps. Nothing of the command runs before ``run``: ``kill`` ends a held sandbox
        without running it, and a runner that dies leaves it held, in the session's cgroup,
        for ``sandgate cleanup``. After ``prepare`` the process is there already (its entry,
        output and cgroups are the prepared ones); this hands it bwrap's command line."""
        found = bwrap.find_command(spec.command[0]) if spec.command else None
        if found is None:
            raise CommandNotFound(spec.command[0] if spec.command else "")
        if self._prepared is not None:
            later = self._prepared.netns == enter.LATER
            if (spec.uid, spec.gid) != (self._prepared.uid, self._prepared.gid) or (
                spec.netns != self._prepared.netns and not later
            ):
                raise ValueError("the spec is not the sandbox that was prepared")
            assert self._launch is not None
            first = [spec.netns] if later else []  # the namespace it was started without
            if self._late_fds is not None:
                blob, self_fd = self._late_fds
                late = enter.late_command(self_fd, blob)
                self._launch([*first, *bwrap.bwrap_argv(spec, late=late)])
                self._late_spec = spec
            else:
                self._launch([*first, *bwrap.bwrap_argv(spec, block_fd=self._hold_fd)])
            self._started = True
            return
        entry = enter.Entry(spec.netns, spec.uid, spec.gid, tuple(cgroups), oom_score)
        hold = self._hold()
        try:
            self.proc, self._entered = enter.spawn(
                entry,
                bwrap.bwrap_argv(spec, block_fd=hold),
                start_new_session=True,
                pass_fds=(hold,),
                **_output(capture),
            )
        except BaseException:
            self._unhold()
            raise
        finally:
            os.close(hold)
        self._started = True
        self._capture(capture, echo)

    def _hold(self) -> int:
        """The pipe a started bwrap waits on: its end, to pass (``_release`` keeps ours).

        bwrap goes on at end-of-file too, and while held nothing ties it to its parent (it
        sets its parent-death signal only at the exec). So its end of the pipe is opened for
        writing as well: the pipe never ends, and only the byte ``run`` writes releases."""
        readable, self._release = os.pipe2(os.O_CLOEXEC)
        try:
            return os.open(f"/proc/self/fd/{readable}", os.O_RDWR | os.O_CLOEXEC)
        finally:
            os.close(readable)

    def _unhold(self) -> None:
        if self._release is not None:
            os.close(self._release)
            self._release = None
        if self._late is not None:  # end-of-file with nothing sent: it runs nothing
            os.close(self._late)
            self._late = None

    def _send_late(self, spec: bwrap.SandboxSpec, deadline: float | None) -> bool:
        """The command and its environment, to the sandbox set up ahead (``start``): the same
        sandbox but for the environment, which only the gateway's answer gave. False: the
        deadline passed first (a line longer than the pipe holds waits for bwrap's set-up)."""
        started = self._late_spec
        assert started is not None and self._late is not None and self.proc is not None
        if dataclasses.replace(spec, env=started.env) != started:
            raise ValueError("the spec is not the sandbox that was set up")
        line = memoryview(enter.late_blob(dict(sorted(bwrap.base_env(spec).items())), spec.command))
        os.set_blocking(self._late, False)
        try:
            while line:
                try:
                    line = line[os.write(self._late, line) :]
                except BlockingIOError:
                    left = _left(deadline)
                    if left == 0 or self.proc.poll() is not None:
                        return left != 0  # run() reads the status of a sandbox that died
                    select.select([], [self._late], [], min(left or 0.2, 0.2))
        finally:
            os.close(self._late)
            self._late = None
        return True

    def abandon(self) -> None:
        """Kill a sandbox started (or prepared) and forget it: ``start`` or ``run`` begins
        anew (a profile that wants what was set up ahead otherwise)."""
        self.kill()
        if self._pump is not None:
            self._pump.join(timeout=5)
        self.proc, self._pump, self._prepared, self._launch = None, None, None, None
        self._late_fds, self._late_spec, self._started = None, None, False
        self._entered = lambda: None

    def _capture(self, capture: Path | None, echo: bool) -> None:
        if capture is not None and self.proc is not None:
            self.output = capture
            self._pump = threading.Thread(
                target=_pump, args=(self.proc, capture, echo), name="sandbox-output", daemon=True
            )
            self._pump.start()

    def run(
        self,
        spec: bwrap.SandboxSpec,
        timeout: float | None,
        stop: threading.Event | None = None,
        capture: Path | None = None,
        echo: bool = True,
        cgroups: Sequence[str] = (),
        oom_score: int | None = None,
        released: Callable[[], None] | None = None,
    ) -> int:
        """Run the sandboxed command (set up by ``start`` or now). Returns its exit status (124
        when it ran out of time, 143 when ``stop`` was set). With ``capture`` its output also
        goes to that file (bounded). ``released``: called once the command is let go."""
        if not self._started:  # not set up yet, or only prepared (then start says "not found")
            self.start(spec, capture, echo, cgroups, oom_score)
        assert self.proc is not None
        deadline = None if timeout is None else time.monotonic() + timeout
        try:
            self._entered()  # bwrap runs (held), or the step that failed is raised here
            with contextlib.suppress(BrokenPipeError):  # it died while held: its status says
                if self._late_spec is not None:
                    if not self._send_late(spec, deadline):
                        return 124
                else:
                    assert self._release is not None
                    os.write(self._release, b"g")
            if released is not None:
                released()
            while True:
                try:
                    return self.proc.wait(timeout=0.2 if stop is not None else _left(deadline))
                except subprocess.TimeoutExpired:
                    if stop is not None and stop.is_set():
                        return 143
                    if deadline is not None and time.monotonic() >= deadline:
                        return 124
        finally:
            self.kill()
            if self._pump is not None:
                self._pump.join(timeout=5)

    def kill(self) -> None:
        """Kill the sandboxed process group (by the pid we started), if it still runs."""
        try:
            if self.proc is None or self.proc.poll() is not None:
                return
            # A held bwrap (pid 1 of the sandbox's pid namespace) outlives its parent: killed
            # first, by pid (all of it goes with pid 1); the outer bwrap then reaps it and
            # exits with its status. Then the group we started, if anything is left.
            kids = _children(self.proc.pid)
            for pid in kids:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(timeout=0.5 if kids else 0)
            for sig in (signal.SIGTERM, signal.SIGKILL):
                if self.proc.poll() is not None:
                    return
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(self.proc.pid, sig)
                deadline = time.monotonic() + 2
                while time.monotonic() < deadline and self.proc.poll() is None:
                    time.sleep(0.02)
                if self.proc.poll() is not None:
                    return
        finally:
            self._unhold()  # closing it releases nothing (see _hold)
            if self._launch is not None:
                with contextlib.suppress(ValueError):  # launched: nothing left to close
                    self._launch(None)
                self._launch = None

    def destroy(self) -> None:
        self.kill()
        if self.netns:
            with contextlib.suppress(Exception):
                ns.remove(self.netns)
        if self.space is not None:
            self.space.destroy()
            cleanup.disown(f"mount-{self.session}")


OUTPUT_LIMIT = 16 << 20


def _output(capture: Path | None) -> dict[str, Any]:
    return {"stdout": subprocess.PIPE, "stderr": subprocess.STDOUT} if capture else {}


def _children(pid: int) -> list[int]:
    try:
        with open(f"/proc/{pid}/task/{pid}/children") as f:
            return [int(k) for k in f.read().split()]
    except OSError:
        return []


def _pump(proc: subprocess.Popen[bytes], path: Path, echo: bool) -> None:
    """Copy the sandbox's output to ``path`` (at most OUTPUT_LIMIT bytes) and, if asked, to ours."""
    assert proc.stdout is not None
    written = 0
    with open(path, "wb") as log:
        while chunk := os.read(proc.stdout.fileno(), 65536):
            if written < OUTPUT_LIMIT:
                log.write(chunk[: OUTPUT_LIMIT - written])
                log.flush()
                written += len(chunk)
                if written >= OUTPUT_LIMIT:
                    log.write(b"\n[sandgate: output truncated here]\n")
            if echo:
                with contextlib.suppress(OSError, AttributeError, ValueError):
                    sys.stdout.buffer.write(chunk)
                    sys.stdout.buffer.flush()


class CommandNotFound(SandboxError):
    def __init__(self, command: str) -> None:
        super().__init__(
            f"command not found inside the sandbox: {command!r}",
            "the sandbox sees /usr, /opt and the work dir (mounted at /work); give a path there",
        )
        self.command = command


def ca_env(path: str = str(SYSTEM_BUNDLE)) -> dict[str, str]:
    """Point every common TLS client at the sandbox's CA bundle."""
    return dict.fromkeys(CA_VARS, path)


def certifi_bundles() -> list[str]:
    """certifi bundles the sandbox can see (the one of the venv sandgate runs from, if any).
    Found, not imported: ``certifi.where()`` goes through importlib.resources (and zipfile),
    10-14 ms of a run's path to exec (2026-12-01, load 3). A bundle inside a zip is no file to
    bind, so only the package folder's own ``cacert.pem`` counts, which is what where() gives
    for a package installed as files."""
    try:
        spec = importlib.util.find_spec("certifi")
    except (ImportError, ValueError):
        return []
    if spec is None or spec.origin is None:
        return []
    where = os.path.realpath(os.path.join(os.path.dirname(spec.origin), "cacert.pem"))
    return [where] if where.startswith(("/opt/", "/usr/")) and os.path.isfile(where) else []


def proxy_env(url: str) -> dict[str, str]:
    """The explicit proxy, for clients that prefer one (the transparent door catches the rest)."""
    env = dict.fromkeys(("http_proxy", "https_proxy", "HTTP_PROXY", "HTTPS_PROXY"), url)
    env["no_proxy"] = env["NO_PROXY"] = "localhost,127.0.0.1"
    return env


def place_secrets(home: Path, uid: int, view: dict[str, dict[str, str | None]]) -> dict[str, str]:
    """Put each placeholder where the profile says: an environment variable and/or a file."""
    env: dict[str, str] = {}
    for item in view.values():
        placeholder = item["placeholder"] or ""
        if item.get("env"):
            env[str(item["env"])] = placeholder
        target = item.get("file")
        if target:
            path = home / str(target).removeprefix("~/").lstrip("/")
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(placeholder + "\n")
            for p in [path, *[q for q in path.parents if home in q.parents]]:
                os.chown(p, uid, uid)
    return env
