"""``sandgate prove``: the gateway attacked from inside a fresh guest, then judged.

A throwaway guest runs the probe driver (driver.py) as the sandboxed uid. A second guest
serves on a port, so lateral movement has a real target. Afterwards every probe gets three
checks: what the policy expects (``decide()``), what the driver observed, and whether the
gateway recorded the attempt with that verdict. A probe fails on a leak (observed allow where
deny was expected), a false block (the reverse), or a missing or wrong record.
"""

from __future__ import annotations

import json
import shutil
import tempfile
import threading
import time
from dataclasses import asdict, dataclass, field, replace
from importlib import resources
from pathlib import Path
from typing import Any

from sandgate.events.schema import Event
from sandgate.events.store import Store
from sandgate.policy.load import load_policy
from sandgate.policy.model import Mode
from sandgate.policy.profile import Profile
from sandgate.prove.catalogue import Context, Probe, catalogue, inbound_catalogue
from sandgate.prove.invariants import Wiring, foreign_sources, leaked_names, never, probe_target
from sandgate.prove.vmprobes import in_channel, in_vm
from sandgate.sandbox.launch import preflight
from sandgate.session.runner import RunOptions, RunResult, run_in, signals_raise
from sandgate.session.stack import Stack, stack_for
from sandgate.vm.launch import CHANNEL_PROXY_URL, VmOptions
from sandgate.vm.launch import preflight as vm_preflight
from sandgate.vm.qemu import CHANNEL_DOOR
from sandgate.world.servers.launch import read_log

DRIVER_TARGET = "/run/sandgate/prove-driver.py"
PROBES_TARGET = "/run/sandgate/probes.json"
PEER_PORT = 8080
PEER_UID = 61999  # tells the peer guest apart in the gateway's status


@dataclass
class ProbeResult:
    probe: str
    group: str
    target: str
    expected: str
    observed: str
    logged: str  # "yes", "no", "wrong: <verdict>", or "n/a: <why>"
    result: str  # PASS | FAIL | SKIP
    why: str = ""
    reason: str = ""  # the reason key decide() gives

    def as_json(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class ProveResult:
    mode: str
    profile: str
    policy: str | None
    session: str | None
    results: list[ProbeResult] = field(default_factory=list)

    @property
    def failed(self) -> list[ProbeResult]:
        return [r for r in self.results if r.result == "FAIL"]

    def totals(self) -> dict[str, int]:
        out = {"PASS": 0, "FAIL": 0, "SKIP": 0}
        for r in self.results:
            out[r.result] += 1
        return out


@dataclass
class ProveOptions:
    world: str | None = None
    policy: str | None = None
    profile: str | None = None
    mode: str | None = None
    instance: str | None = None
    store: str | None = None
    vm: VmOptions | None = None  # --vm: the driver runs as root in a VM guest


def prove(opts: ProveOptions) -> ProveResult:
    preflight()
    if opts.vm is not None:
        vm_preflight(opts.vm)
    if opts.policy is not None or opts.world is None:
        load_policy(opts.policy)
    with signals_raise(), stack_for(opts.world, opts.instance, opts.store, opts.policy) as stack:
        return prove_on(stack, opts)


def prove_on(stack: Stack, opts: ProveOptions) -> ProveResult:
    world = stack.world
    policy_path = opts.policy or (str(world.policy) if world else None)
    work = Path(tempfile.mkdtemp(prefix="sg-prove-", dir="/var/tmp"))
    work.chmod(0o777)
    stop = threading.Event()
    peer = _start_peer(stack, opts, policy_path, stop)
    try:
        peer_address = _wait_for_peer(stack, peer)
        probes_file = work / "probes.json"
        holder: dict[str, Any] = {}
        wiring: dict[str, Wiring] = {}

        def probes_for(guest: dict[str, Any]) -> dict[str, Path]:
            policy = load_policy(policy_path)
            profile = policy.profile(
                opts.profile,
                mode=Mode(opts.mode) if opts.mode else None,
                public_override=tuple(_networks(world.public_override)) if world else (),
                gateway_address=_ip(guest["gateway"]),
                guest_pool=_networks((guest["guest_pool"],))[0],
                host_addresses=tuple(_ip(a) for a in guest.get("host_addresses", ())),
                uplink_ipv6=bool(guest.get("ipv6")),  # the gateway's wiring (issue 14 part 5)
            )
            secrets = guest.get("secrets") or {}
            placeholder = next((s["placeholder"] for s in secrets.values()), None)
            ctx = Context(
                profile=profile,
                gateway=guest["gateway"],
                proxy=guest["proxy"],
                world=world is not None,
                peer=peer_address,
                placeholder=placeholder,
                host_addresses=[str(a) for a in profile.host_addresses],
            )
            wiring["guest"] = Wiring(
                guest_pool=profile.guest_pool,
                gateway=_ip(guest["gateway"]),
                host_addresses=profile.host_addresses,
                named_exactly=tuple(
                    r.spec.network.network_address
                    for r in profile.allow
                    if r.spec.network is not None and r.spec.network.num_addresses == 1
                ),
                relayed=tuple(int(a.rsplit(":", 1)[1]) for a in guest.get("host_loopback", ())),
            )
            holder["profile"] = profile
            # Root in a VM: capability probes out, attacks on the wire in (vmprobes.py); with
            # no NIC, the host channel's door is the proxy and the rest has no route.
            if opts.vm is not None and opts.vm.nic == "none":
                ctx = replace(ctx, proxy=CHANNEL_PROXY_URL)
                holder["probes"] = in_channel(catalogue(ctx), ctx, CHANNEL_DOOR)
            elif opts.vm is not None:
                holder["probes"] = in_vm(catalogue(ctx), ctx)
            else:
                holder["probes"] = catalogue(ctx)
            runnable = [p for p in holder["probes"] if world is not None or not p.needs_world]
            probes_file.write_text(json.dumps([p.as_driver() for p in runnable]))
            return {PROBES_TARGET: probes_file}

        logs_before = {k: len(read_log(v)) for k, v in world.logs.items()} if world else {}
        run = run_in(
            stack,
            RunOptions(
                command=["/usr/bin/python3", DRIVER_TARGET, PROBES_TARGET, "/work/results.jsonl"],
                policy=policy_path,
                profile=opts.profile,
                mode=opts.mode,
                world="test" if world else None,
                workdir=work,
                timeout=300,
                store=opts.store,
                files={DRIVER_TARGET: _driver_path()},
                late_files=probes_for,
                label="prove",
                vm=opts.vm,
            ),
        )
        observed = _observed(work / "results.jsonl")
        events = _events(run, opts.store)
        seen = {k: read_log(v)[logs_before[k] :] for k, v in world.logs.items()} if world else {}
        upstream = seen.get("dns", [])
        results = [
            _judge(p, observed.get(p.id), events, upstream, wiring.get("guest"))
            if world is not None or not p.needs_world
            else ProbeResult(
                p.id,
                p.group,
                p.target,
                p.expected,
                "-",
                "-",
                "SKIP",
                "needs the test world (its hosts and tripwires)",
                p.why,
            )
            for p in holder["probes"]
        ]
        if world is not None:
            results += _session_invariants(
                world.uplink.address, events, seen, world.uplink.address6
            )
            results += _inbound(stack, holder["profile"], work, opts.store, run.session)
        report = run.report
        return ProveResult(
            report.mode or "", report.profile or "", policy_path, run.session, results
        )
    finally:
        stop.set()
        peer.join(30)
        shutil.rmtree(work, ignore_errors=True)


# -- the lateral target ----------------------------------------------------------------------------


def _start_peer(
    stack: Stack, opts: ProveOptions, policy: str | None, stop: threading.Event
) -> threading.Thread:
    command = ["/usr/bin/python3", "-m", "http.server", str(PEER_PORT), "--bind", "0.0.0.0"]
    peer_opts = RunOptions(
        command=command,
        policy=policy,
        profile=opts.profile,
        mode=opts.mode,
        world="test" if stack.world else None,
        timeout=300,
        store=opts.store,
        label="prove peer",
        stop=stop,
        uid=PEER_UID,
    )
    thread = threading.Thread(target=lambda: run_in(stack, peer_opts), daemon=True)
    thread.start()
    return thread


def _wait_for_peer(stack: Stack, peer: threading.Thread) -> str | None:
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline and peer.is_alive():
        with stack.gateway.client() as ctl:
            guests = ctl.call("status")["guests"]
        for g in guests.values():
            if g.get("uid") == PEER_UID:
                return str(g["address"])
        time.sleep(0.1)
    return None


# -- judging ---------------------------------------------------------------------------------------


def _judge(
    probe: Probe,
    seen: dict[str, Any] | None,
    events: list[Event],
    upstream: list[dict[str, Any]],
    wiring: Wiring | None = None,
) -> ProbeResult:
    def result(res: str, observed: str, logged: str, why: str = "") -> ProbeResult:
        return ProbeResult(
            probe.id,
            probe.group,
            probe.target,
            probe.expected,
            observed,
            logged,
            res,
            why,
            probe.why,
        )

    if seen is None:
        return result("FAIL", "-", "-", "the driver did not report this probe")
    observed = str(seen.get("observed"))
    logged = _logged(probe, seen, events)
    if observed == "silent":
        # No refusal and no answer: the gateway let it pass (to nobody) if it recorded an
        # allow; otherwise it is counted as refused, as before there was a record to read.
        observed = "allow" if probe.expected == "allow" and logged == "yes" else "deny"
    protocol = probe.action if probe.action in ("udp", "icmp") else "tcp"
    broken = never(wiring, *probe_target(probe.args), protocol) if wiring is not None else None
    if broken is not None and (probe.expected == "allow" or observed == "allow"):
        return result(
            "FAIL",
            observed,
            logged,
            f"policy and invariant disagree: decide() expects {probe.expected} "
            f"({probe.why}), observed {observed}, but {broken} holds for every policy",
        )
    if observed == "error":
        return result("FAIL", observed, logged, f"the probe broke: {seen.get('error')}")
    if observed != probe.expected:
        kind = "LEAK" if probe.expected == "deny" else "false block"
        return result("FAIL", observed, logged, f"{kind}: {_detail(seen)}")
    if not (logged == "yes" or logged.startswith("n/a")):
        return result("FAIL", observed, logged, "the gateway did not record it as expected")
    if probe.upstream_silent and any(
        probe.upstream_silent in str(x.get("qname", "")) for x in upstream
    ):
        return result("FAIL", observed, logged, "the name reached the upstream DNS server")
    return result("PASS", observed, logged)


def _session_invariants(
    uplink: str, events: list[Event], seen: dict[str, list[dict[str, Any]]], uplink6: str = ""
) -> list[ProbeResult]:
    """The never-rules over the whole session: the outside saw only the gateway's uplink
    address, and no name the resolver refused before forwarding reached the upstream."""
    source = uplink.split("/", maxsplit=1)[0]
    entries = [
        {**x, "src": str(x.get("src") or x.get("client") or "").rsplit(":", 1)[0] or None}
        for log in seen.values()
        for x in log
    ]
    foreign = foreign_sources(entries, source)
    if uplink6:  # and its IPv6 address, as the world's logs write it: [2001:db8:77::2]
        source += f" or [{uplink6.split('/', maxsplit=1)[0]}]"
        foreign = [x for x in foreign if x.get("src") != source.rsplit(" or ", 1)[1]]
    # A name refused as such: denied before any answer, and never allowed in the session (an
    # AAAA or ANY question is refused by its type while the name's A question is answered).
    questions = [e for e in events if e.kind.value == "dns" and e.name]
    answered = {e.name for e in questions if e.verdict == "allow"}
    # Asked upstream, then its answer refused (rebinding: an answer in special-purpose space,
    # which is every answer of the world's "internet" where no override makes it public).
    forwarded = ("deny.cname_target", "deny.cname_loop", "deny.rebinding")
    # A name once asked upstream is in the upstream's log; a later refusal of it (from the
    # resolver's memory of the refused answer) does not make that a leak.
    asked = {e.name for e in questions if "answers" in e.details or e.reason in forwarded}
    refused = [
        str(e.name)
        for e in questions
        if e.verdict == "deny"
        and "answers" not in e.details
        and e.reason not in forwarded
        and e.name not in answered
        and e.name not in asked
    ]
    leaked = leaked_names(refused, seen.get("dns", []))
    rows = []
    for pid, bad, what in (
        ("never: another source", foreign, f"every packet outside came from {source}"),
        ("never: refused name upstream", leaked, "no refused name reached the upstream resolver"),
    ):
        rows.append(
            ProbeResult(
                pid,
                "invariants",
                what,
                "deny",
                "allow" if bad else "deny",
                "n/a: the outside world's own logs",
                "FAIL" if bad else "PASS",
                f"policy and invariant disagree: {bad[:3]}" if bad else "",
                "never." + pid.split(": ")[1].replace(" ", "_"),
            )
        )
    return rows


def _logged(probe: Probe, seen: dict[str, Any], events: list[Event]) -> str:
    m = probe.match
    if m is None:
        return f"n/a: {probe.no_log_why}"
    candidates = []
    for e in events:
        if str(e.kind) not in m.kinds:
            continue
        if (
            m.dst is not None
            and e.dst != m.dst
            and not (e.kind.value == "http" and e.name == m.dst)
        ):
            continue
        if m.port is not None and e.port not in (m.port, None):
            continue
        if m.name is not None and e.name != m.name:
            continue
        if m.protocol is not None and e.protocol != m.protocol:
            continue
        if (
            m.by_sport
            and seen.get("sport") is not None
            and e.details.get("sport") not in (None, seen.get("sport"))
        ):
            continue
        candidates.append(e)
    if not candidates:
        return "no"
    if any(e.verdict == probe.expected for e in candidates):
        return "yes"
    return f"wrong: {candidates[0].verdict} ({candidates[0].reason})"


def _detail(seen: dict[str, Any]) -> str:
    return ", ".join(f"{k}={v}" for k, v in seen.items() if k not in ("id", "observed"))


# The test world's LAN hosts that probe the gateway's exposed ports from outside.
LAN_CLIENTS = {"model": "10.77.0.10", "nas": "10.77.0.20"}


def _inbound(
    stack: Stack, profile: Profile, work: Path, store: str | None, session: str
) -> list[ProbeResult]:
    """The profile's exposed ports, probed from the LAN side (each client in its own world
    namespace, with the same driver), while the guests are still up."""
    import subprocess

    assert stack.world is not None
    uplink = stack.world.uplink.address.split("/", maxsplit=1)[0]
    # The clients this world has (another world may name its LAN hosts otherwise).
    spaces = {
        role: n
        for role in LAN_CLIENTS
        for n in stack.world.namespaces
        if n.endswith(f"-{role}")
    }
    clients = {role: a for role, a in LAN_CLIENTS.items() if role in spaces}
    probes = inbound_catalogue(profile, uplink, clients)
    if not probes:
        return []
    s = Store(store) if store else Store()
    try:
        # After the guest's session: the LAN probes come later (its peer is still up).
        since = max((i for i, _ in s.events_with_ids(session=session)), default=0)
    finally:
        s.close()
    observed: dict[str, dict[str, Any]] = {}
    for role, netns in spaces.items():
        mine = [p for p in probes if p.args["from"] == role]
        probes_file, out = work / f"inbound-{role}.json", work / f"inbound-{role}.jsonl"
        probes_file.write_text(json.dumps([p.as_driver() for p in mine]))
        subprocess.run(
            ["ip", "netns", "exec", netns, "/usr/bin/python3", str(_driver_path()),
             str(probes_file), str(out)],
            check=False,
            capture_output=True,
            timeout=60,
        )  # fmt: skip
        observed.update(_observed(out))
    results: list[ProbeResult] = []
    deadline = time.monotonic() + 5.0  # the gateway's records arrive in batches
    while True:
        s = Store(store) if store else Store()
        try:
            events = s.events(kinds=["conn"], since_id=since)
        finally:
            s.close()
        results = [_judge(p, observed.get(p.id), events, []) for p in probes]
        if all(r.result == "PASS" for r in results) or time.monotonic() > deadline:
            return results
        time.sleep(0.25)


def _observed(path: Path) -> dict[str, dict[str, Any]]:
    out: dict[str, dict[str, Any]] = {}
    if path.exists():
        for line in path.read_text().splitlines():
            row = json.loads(line)
            out[row["id"]] = row
    return out


def _events(run: RunResult, store: str | None) -> list[Event]:
    s = Store(store) if store else Store()
    try:
        return s.events(session=run.session)
    finally:
        s.close()


def _driver_path() -> Path:
    return Path(str(resources.files("sandgate.prove").joinpath("driver.py")))


def _networks(texts: tuple[str, ...]) -> list[Any]:
    import ipaddress

    return [ipaddress.ip_network(t) for t in texts]


def _ip(text: str) -> Any:
    import ipaddress

    return ipaddress.ip_address(text)
