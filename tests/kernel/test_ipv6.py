"""IPv6 egress from inside a sandbox (issue 14 part 5), on a gateway whose uplink has IPv6.

A test world of its own with its IPv6 internet (``TestWorld(ipv6=True)``: 2001:db8::/32 declared
public, AAAA records, v6only.example.net with no A record) and a gateway that sets
``uplink_ipv6`` from its uplink. From one sandbox: the world's IPv6 web server by address and by
name in open mode; ULA, link-local, the mapped metadata endpoint and a NAT64 form of a private
IPv4 refused, each logged with decide()'s reason; in allowlist mode an allowed name's AAAA
address is reachable and another IPv6 address is not; the proxy dials IPv6 for a name with
only AAAA records (explicit CONNECT) and by literal.
"""

from __future__ import annotations

import json
import tempfile
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest

from sandgate.events.schema import Kind
from sandgate.session.stack import Stack, bring_up
from sandgate.world.topology import HOSTS6, V6_ONLY

from .conftest import ROOT, Runner, leftovers

pytestmark = pytest.mark.kernel

VENV_PY = "/opt/sandgate/venv/bin/python"
WEB6 = HOSTS6["example.com"]
POLICY = """
[profiles.open6]
internet = "open"

[profiles.list6]
internet = "allowlist"
allow = [ { domain = "example.com" }, { domain = "v6only.example.net" } ]
"""

CLIENT = r"""
import json, os, socket, subprocess
def curl(*a):
    p = subprocess.run(["curl", "-sS", "-m", "8", "-o", "/dev/null", "-w", "%%{http_code}", *a],
                       capture_output=True, text=True)
    return p.stdout if p.returncode == 0 else "err:" + p.stderr.strip()[:80]
def tcp(host, port):
    try:
        socket.create_connection((host, port), timeout=5).close()
        return "ok"
    except OSError as e:
        return "err:" + type(e).__name__
out = {}
out["lit80"] = curl("--noproxy", "*", "http://[%(web)s]/")
out["lit443"] = curl("--noproxy", "*", "--cacert", "/etc/ssl/certs/ca-certificates.crt",
                     "https://example.com/", "--resolve", "example.com:443:[%(web)s]")
out["name80"] = curl("--noproxy", "*", "-6", "http://example.com/")
out["v6only"] = curl("--noproxy", "*", "http://%(v6only)s/")
proxy = "http://%%s:3128" %% os.environ["GW"]
out["connect"] = curl("-p", "-x", proxy, "http://%(v6only)s/")  # CONNECT to an AAAA-only name
out["explicit"] = curl("-x", proxy, "http://[%(web)s]/")  # the proxy dials an IPv6 literal
def by_name6(name, port):  # the name's AAAA answer, from the gateway's resolver
    address = socket.getaddrinfo(name, port, socket.AF_INET6, socket.SOCK_STREAM)[0][4][0]
    return tcp(address, port) + ":" + address
# Port 22: nothing listens there, so a connection that gets through is refused by the host
# (ConnectionRefusedError) and one the gateway refuses is not (PermissionError).
out["pinned"] = by_name6("example.com", 22)
out["ula"] = tcp("fd00::10", 22)
out["linklocal"] = tcp("fe80::1%%eth0", 22)
out["mapped"] = tcp("::ffff:169.254.169.254", 8080)
out["nat64"] = tcp("64:ff9b::a4d:a", 8000)
out["other"] = tcp("2001:db8:203::99", 22)
ip6 = subprocess.run(["ip", "-6", "addr", "show", "dev", "eth0"], capture_output=True, text=True)
out["addrs"] = ip6.stdout
print(json.dumps(out))
"""


@pytest.fixture(scope="module")
def stack6(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Stack, Path]]:
    if not ROOT:
        pytest.skip("needs root")
    before = leftovers()
    store = tmp_path_factory.mktemp("store6") / "events.db"
    s = bring_up(world=True, world_ipv6=True, store=str(store))
    try:
        yield s, store
    finally:
        s.teardown()
        after = [x for x in leftovers() if x not in before and s.instance in x]
        assert not after, f"left behind: {after}"


@pytest.fixture
def work() -> Iterator[Path]:
    with tempfile.TemporaryDirectory(prefix="sg-ipv6-") as d:
        path = Path(d)
        path.chmod(0o777)
        (path / "p.toml").write_text(POLICY)
        script = textwrap.dedent(CLIENT) % {"web": WEB6, "v6only": V6_ONLY}
        (path / "t.py").write_text(script)
        yield path


def run(
    stack6: tuple[Stack, Path], work: Path, profile: str
) -> tuple[dict[str, str], Runner, object]:
    stack, store = stack6
    runner = Runner(stack, store)
    r = runner.sh(
        f'GW=$(ip -4 route show default | cut -d" " -f3) {VENV_PY} t.py > out.txt 2>&1',
        workdir=work,
        policy=str(work / "p.toml"),
        profile=profile,
    )
    text = (work / "out.txt").read_text()
    got = json.loads(text.strip().splitlines()[-1]) if text.strip().startswith("{") else {}
    assert got, text
    return got, runner, r


def test_open_mode_reaches_the_ipv6_internet_and_refuses_the_special_forms(
    stack6: tuple[Stack, Path], work: Path
) -> None:
    got, runner, r = run(stack6, work, "open6")
    assert got["lit80"] == "200", got
    assert got["name80"] == "200", got
    assert got["v6only"] == "200", got
    assert got["connect"] == "200", got
    assert got["explicit"] == "200", got
    for k in ("ula", "linklocal", "mapped", "nat64"):
        assert got[k].startswith("err:") and "Refused" not in got[k], (k, got)
    events = runner.events(r)  # type: ignore[arg-type]
    conns = {e.dst: e for e in events if e.kind is Kind.CONN}
    # Each refusal logged with the class decide() names (deny.special, refined by address).
    assert conns["fd00::10"].reason == "deny.unique_local", conns.get("fd00::10")
    assert conns["fe80::1"].reason == "deny.link_local", conns.get("fe80::1")
    assert conns["169.254.169.254"].reason == "deny.metadata", conns.get("169.254.169.254")
    assert conns["64:ff9b::a4d:a"].reason == "deny.private", conns.get("64:ff9b::a4d:a")
    web = [e for e in events if e.kind is Kind.HTTP and e.dst in (WEB6, HOSTS6[V6_ONLY])]
    assert web and all(e.reason == "allow.open" for e in web), web
    assert got["pinned"] == f"err:ConnectionRefusedError:{WEB6}", got
    # No link-local chatter: the guest's only IPv6 address is its own, nothing left the link
    # with another source (the ingress chain would have logged deny.spoof_ip).
    assert "fd53:4700:" in got["addrs"] and "scope link" not in got["addrs"], got["addrs"]
    assert not [e for e in events if e.reason in ("deny.spoof_ip", "deny.ipv6")], events


def test_allowlist_pins_aaaa_answers(stack6: tuple[Stack, Path], work: Path) -> None:
    """An allowed name's AAAA address is pinned and reachable on any port (the rule has
    none); an IPv6 address no allowed name resolved to is refused and logged."""
    got, runner, r = run(stack6, work, "list6")
    assert got["v6only"] == "200", got
    assert got["connect"] == "200", got
    assert got["pinned"] == f"err:ConnectionRefusedError:{WEB6}", got
    assert got["other"] == "err:PermissionError", got
    assert got["explicit"] == "403", got  # an IPv6 literal no rule allows
    events = runner.events(r)  # type: ignore[arg-type]
    conns = {e.dst: e for e in events if e.kind is Kind.CONN}
    assert conns["2001:db8:203::99"].reason == "deny.not_allowlisted"
    assert conns[WEB6].reason == "allow.pinned", conns.get(WEB6)


@pytest.mark.parametrize("mode", ["open", "allowlist"])
def test_prove_passes_its_ipv6_probes(stack6: tuple[Stack, Path], mode: str) -> None:
    """Every probe, IPv6 ones included, against a gateway whose uplink has IPv6: the
    expectations come from decide() with ``uplink_ipv6``, and each is found in the log."""
    from sandgate.prove.runner import ProveOptions, prove_on

    stack, store = stack6
    result = prove_on(stack, ProveOptions(world="test", mode=mode, store=str(store)))
    assert not result.failed, "\n".join(f"{r.probe}: {r.why}" for r in result.failed)
    six = [r for r in result.results if r.group == "ipv6"]
    assert len(six) >= 7, [r.probe for r in six]


HELD = r"""
import socket, time
s = socket.create_connection(("%(web)s", %(port)d), timeout=3)
log = open("/work/log", "a", buffering=1)
while True:
    try:
        s.sendall(b"x")
        if s.recv(1) != b"x":
            raise OSError("no echo")
        log.write("ok\n")
    except OSError as exc:
        log.write(f"error {type(exc).__name__}\n")
        break
    time.sleep(0.1)
"""


def test_reload_cuts_an_ipv6_flow(stack6: tuple[Stack, Path], work: Path) -> None:
    """A reload that refuses an IPv6 host ends the session's open flow to it, as it does an
    IPv4 one (conntrack's IPv6 table is read and cut too)."""
    import threading

    from sandgate.gateway import manage
    from sandgate.session.runner import RunOptions, RunResult, run_in

    from .test_reload import Echo, _wait, _wait_prefix

    stack, store = stack6
    assert stack.world is not None
    wan = next(n for n in stack.world.namespaces if n.endswith("-wan"))
    port = 7313
    server = Echo(wan, (WEB6,), port)
    (work / "held.py").write_text(HELD % {"web": WEB6, "port": port})
    stop = threading.Event()
    box: list[RunResult] = []
    opts = RunOptions(
        command=["python3", "/work/held.py"],
        world="test",
        workdir=work,
        timeout=60,
        stop=stop,
        store=str(store),
        policy=str(work / "p.toml"),
        profile="open6",
    )
    runner = threading.Thread(target=lambda: box.append(run_in(stack, opts)), daemon=True)
    runner.start()
    log = work / "log"
    try:
        _wait(log, "ok")
        refusing = POLICY.replace(
            'internet = "open"\n',
            f'internet = "open"\ndeny = [ {{ host = "{WEB6}", name = "not any more" }} ]\n',
            1,
        )
        (work / "p.toml").write_text(refusing)
        r = manage.reload(stack.instance, work / "p.toml")
        assert (r.guests, r.changed, r.cut) == (1, 1, 1)
        assert _wait_prefix(log, "error", within=5) in (
            "error ConnectionAbortedError",
            "error ConnectionResetError",
        )
    finally:
        stop.set()
        runner.join(60)
        server.close()
        (work / "p.toml").write_text(POLICY)
