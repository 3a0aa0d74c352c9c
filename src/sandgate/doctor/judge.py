"""The doctor's verdicts: what the driver saw inside, and the gateway's own facts, become hops.

Pure: no sockets, no processes, no clock. ``judge(plan, seen, facts)`` returns the hops in the
order traffic crosses them (hops.HOPS), each ok, fail (with the fix) or skip (not applicable:
a tool that is not installed, a profile with no model server).
"""

from __future__ import annotations

import base64
import binascii
import email.utils
from dataclasses import dataclass
from typing import Any

from cryptography import x509

from sandgate.doctor.hops import (
    CLOCK_TOLERANCE,
    NO_PROXY_NEEDS,
    NO_PROXY_VARS,
    PROXY_VARS,
    TOOL_VARS,
    Hop,
    Status,
)
from sandgate.doctor.plan import OFFLINE_NAME, ModelTarget, Plan

RESTART = "restart the gateway (`sandgate down`, then `sandgate up`), or keep it under its own "
RESTART += "watchdog (`sandgate up --watchdog 1s`), which repairs it"


@dataclass(frozen=True)
class GatewayFacts:
    """What the gateway says about itself (the control socket's ``snapshot``), and when the
    driver ran by the host's clock."""

    upstream: tuple[str, ...] = ()
    forwarding: bool = True
    resolver_cut: bool = False
    proxy_cut: bool = False
    host_start: float = 0.0  # host time just before the sandbox started
    host_end: float = 0.0  # and once it ended
    session: str | None = None
    policy: str | None = None  # the policy file, for fixes that say where to write a rule


def ok(name: str, detail: str) -> Hop:
    return Hop(name, Status.OK, detail)


def fail(name: str, detail: str, fix: str) -> Hop:
    return Hop(name, Status.FAIL, detail, fix)


def skip(name: str, detail: str) -> Hop:
    return Hop(name, Status.SKIP, detail)


def judge(plan: Plan, seen: dict[str, Any], facts: GatewayFacts) -> list[Hop]:
    hops = [
        sandbox_resolver(plan, seen),
        gateway_resolver(plan, seen, facts),
        upstream_dns(plan, seen, facts),
        door("explicit proxy", plan, _get(seen, "doors", "explicit"), facts, plan.proxy),
        door("transparent proxy :80", plan, _get(seen, "doors", "transparent"), facts, "port 80"),
    ]
    hops += model_servers(plan, seen.get("models") or [], facts)
    hops += inspection(plan, seen.get("inspected") or [])
    hops += [ca_wiring(tool, plan, seen) for tool in TOOL_VARS]
    hops += [proxy_variables(plan, seen), clock(plan, seen, facts), uplink(plan, seen, facts)]
    return hops


def failed(hops: list[Hop]) -> bool:
    return any(h.status is Status.FAIL for h in hops)


def _get(seen: dict[str, Any], *keys: str) -> dict[str, Any]:
    value: Any = seen
    for k in keys:
        value = value.get(k) if isinstance(value, dict) else None
    return value if isinstance(value, dict) else {}


# -- DNS ---------------------------------------------------------------------------------------


def sandbox_resolver(plan: Plan, seen: dict[str, Any]) -> Hop:
    name = "sandbox resolver"
    servers = _get(seen, "resolv_conf").get("nameservers")
    if servers != [plan.gateway]:
        return fail(
            name,
            f"/etc/resolv.conf names {servers or 'no server'}, not the gateway {plan.gateway}",
            f"the sandbox's /etc/resolv.conf must read `nameserver {plan.gateway}` (sandgate "
            "binds it): something in the image or the agent replaced it; "
            "`sandgate report --session last` shows the drift",
        )
    libc = _get(seen, "libc")
    if plan.known_name is None:
        return ok(name, f"nameserver {plan.gateway} (no allowed name to look up)")
    if libc.get("addresses"):
        return ok(
            name,
            f"nameserver {plan.gateway}; {plan.known_name} → " + ", ".join(libc["addresses"][:3]),
        )
    if _get(seen, "dns_known").get("answers"):
        return fail(
            name,
            f"the C library could not resolve {plan.known_name} ({libc.get('error')}), "
            "though the gateway answers it",
            "check the sandbox's /etc/nsswitch.conf and /etc/hosts (the image's, not sandgate's)",
        )
    return ok(name, f"nameserver {plan.gateway} (lookups fail: see the gateway resolver)")


def _refused(got: dict[str, Any]) -> bool:
    """The gateway's own refusal (its EDE text says "sandgate: deny..."); a SERVFAIL with the
    gateway's "Network Error" EDE is upstream not answering, not a refusal."""
    return "sandgate" in str(got.get("ede", "")) and got.get("status") != "SERVFAIL"


def gateway_resolver(plan: Plan, seen: dict[str, Any], facts: GatewayFacts) -> Hop:
    name = "gateway resolver"
    if plan.known_name is None:
        return skip(name, "the policy allows no name to ask (add a domain allow rule)")
    got = _get(seen, "dns_known")
    status = got.get("status", "none")
    where = f"{plan.gateway}:53"
    if status == "none":
        why = (
            "the gateway cut its guests off after a failed self-check (see its alarm); it "
            "lets them back once the check passes"
            if facts.resolver_cut
            else f"the gateway's resolver does not answer on {where}: {RESTART}"
        )
        return fail(name, f"no answer from {where} for {plan.known_name}", why)
    if _refused(got):
        return fail(
            name,
            f"the gateway refused {plan.known_name}: {got.get('ede')}",
            f"`sandgate explain {plan.known_name}` says why; allow it with "
            f'{{ domain = "{plan.known_name}" }}',
        )
    if status == "NOERROR" and got.get("answers"):
        return ok(name, f"{where} answered {plan.known_name} ({got['answers']} answer(s))")
    if status == "SERVFAIL":
        return ok(name, f"{where} answers, but SERVFAIL for {plan.known_name}: see upstream DNS")
    return fail(
        name,
        f"{where} answered {plan.known_name} with {status} and no address",
        f"the upstream resolver ({_servers(facts)}) says {plan.known_name} has no address: is "
        "`upstream_dns` under [gateway] the resolver that knows it?",
    )


def _servers(facts: GatewayFacts) -> str:
    return ", ".join(facts.upstream) or "the host's resolvers"


def upstream_dns(plan: Plan, seen: dict[str, Any], facts: GatewayFacts) -> Hop:
    name = "upstream DNS"
    asked = plan.fresh_name or plan.known_name
    if asked is None:
        return skip(name, "the policy allows no name to ask")
    got = _get(seen, "dns_fresh" if plan.fresh_name else "dns_known")
    status = got.get("status", "none")
    cached = "" if plan.fresh_name else " (an answer that may have come from the cache)"
    if status == "none":
        return fail(name, f"no answer for {asked}", "fix the gateway resolver first")
    if _refused(got):
        return skip(name, f"the gateway refused {asked} itself: {got.get('ede')}")
    if status in ("NOERROR", "NXDOMAIN"):
        return ok(name, f"{_servers(facts)} answered {asked}: {status}{cached}")
    ede = f" ({got['ede']})" if got.get("ede") else ""
    return fail(
        name,
        f"{status} for {asked}{ede}: the gateway's upstream resolver ({_servers(facts)}) "
        "did not answer",
        f"make {_servers(facts)} reachable from the gateway's uplink, or name one that is with "
        '`upstream_dns = ["ADDRESS"]` under [gateway] in the policy file',
    )


# -- the proxy doors ---------------------------------------------------------------------------


def door(name: str, plan: Plan, got: dict[str, Any], facts: GatewayFacts, where: str) -> Hop:
    code = str(got.get("code") or "000")
    reason = got.get("sandgate_reason")
    if code == "000":
        why = (
            "the gateway cut its guests off after a failed self-check (see its alarm)"
            if facts.proxy_cut
            else f"the gateway's proxy does not answer at {where}: {RESTART}"
        )
        return fail(name, f"no answer for {plan.door_url}: {got.get('error') or 'nothing'}", why)
    if plan.door_resolve is not None:
        # Offline: the proxy must refuse the .invalid name itself (nothing is forwarded).
        if reason:
            return ok(name, f"answered {code} for {OFFLINE_NAME} ({reason}), as it must")
        return fail(
            name,
            f"{plan.door_url} was answered {code} by something other than the gateway's proxy",
            "the gateway's proxy must answer every plain-HTTP request of a guest: check the "
            "gateway's nftables table (`sandgate report --session last` shows its drift)",
        )
    if reason:
        return fail(
            name,
            f"the proxy refused {plan.door_url}: {code} ({reason})",
            f"`sandgate log --session {facts.session or 'last'} --kind http` shows the "
            "proxy's reason; `sandgate explain` the name",
        )
    return ok(name, f"{plan.door_url} → {code}")


# -- the model servers -------------------------------------------------------------------------


def model_servers(plan: Plan, seen: list[Any], facts: GatewayFacts) -> list[Hop]:
    if not plan.models:
        return [
            skip(
                "model server",
                "the profile exempts no model server (no single-address "
                "allow rule with a port, no front)",
            )
        ]
    return [
        _model(t, seen[i] if i < len(seen) and isinstance(seen[i], dict) else {}, plan, facts)
        for i, t in enumerate(plan.models)
    ]


def add_rule(t: ModelTarget, profile: str, policy: str | None) -> str:
    where = f" in {policy}" if policy else ""
    return (
        f'add {{ host = "{t.address}", port = {t.port}, name = "model server" }} to '
        f"[profiles.{profile}] allow{where}"
    )


def _model(t: ModelTarget, got: dict[str, Any], plan: Plan, facts: GatewayFacts) -> Hop:
    name = f"model server {t.address}:{t.port}" + (f" ({t.via})" if t.via != "direct" else "")
    if t.via == "direct" and got.get("connect") != "ok":
        detail = f"TCP connect to {t.address}:{t.port}: {got.get('connect') or got}"
        if t.rule is None:
            return fail(
                name,
                detail + " (no allow rule exempts it)",
                add_rule(t, plan.profile, facts.policy),
            )
        return fail(
            name,
            detail,
            f"{t.rule} allows it, but nothing answers at {t.address}:{t.port}: is the model "
            "server running, and listening on that address (not 127.0.0.1)?",
        )
    paths = got.get("paths") or {}
    shown = ", ".join(f"GET {_path(u)} → {c}" for u, c in paths.items()) or "no request made"
    connected = "connect ok; " if t.via == "direct" else ""
    if any(str(c).startswith("2") for c in paths.values()):
        return ok(name, connected + shown + (f"; {t.rule}" if t.rule else ""))
    if t.rule is None:
        return fail(name, connected + shown, add_rule(t, plan.profile, facts.policy))
    return fail(
        name,
        connected + shown,
        f"{t.address}:{t.port} answers, but not as an OpenAI-compatible (/v1/models) or "
        "Ollama (/api/tags) server: is it the model server's port?",
    )


def _path(url: str) -> str:
    return "/" + url.split("://", 1)[-1].split("/", 1)[-1]


# -- TLS inspection ----------------------------------------------------------------------------


def issuer_of(der_b64: str) -> x509.Name | None:
    try:
        return x509.load_der_x509_certificate(base64.b64decode(der_b64)).issuer
    except (ValueError, binascii.Error):
        return None


def _gateway_ca(plan: Plan) -> x509.Name | None:
    try:
        return x509.load_pem_x509_certificate(plan.gateway_ca.encode()).subject
    except ValueError:
        return None


def inspection(plan: Plan, seen: list[Any]) -> list[Hop]:
    if not plan.inspected:
        extra = f" (wildcards not tried: {', '.join(plan.skipped_inspect)})"
        return [
            skip(
                "inspection",
                "the profile inspects no name" + (extra if plan.skipped_inspect else ""),
            )
        ]
    ca = _gateway_ca(plan)
    hops = []
    for i, host in enumerate(plan.inspected):
        got = seen[i] if i < len(seen) and isinstance(seen[i], dict) else {}
        name = f"inspection {host}"
        parts, passthrough, broken = [], [], []
        for path in ("direct", "proxy"):
            cert = got.get(path) if isinstance(got.get(path), dict) else {}
            assert isinstance(cert, dict)
            label = "direct" if path == "direct" else "via HTTPS_PROXY"
            issuer = issuer_of(cert["der"]) if cert.get("der") else None
            if issuer is None:
                broken.append(f"{label}: {cert.get('error') or 'no certificate'}")
                continue
            mine = ca is not None and issuer == ca
            parts.append(
                f"{label}: issuer {issuer.rfc4514_string()} "
                + ("(the gateway's CA: inspected)" if mine else "(passthrough)")
            )
            if not mine:
                passthrough.append(label)
        detail = "; ".join(parts + broken)
        if passthrough:
            return_fix = (
                f"{host} is listed in inspect, but {' and '.join(passthrough)} got the server's "
                "own certificate: a raw tunnel, so no secret is swapped in and no request is "
                "judged. The gateway inspects the addresses it resolved the name to: let the "
                "client resolve it through the gateway (no DoH, no /etc/hosts entry, no "
                f"hard-coded address); `sandgate explain {host}:443` shows the TLS mode"
            )
            hops.append(fail(name, detail, return_fix))
        elif broken:
            hops.append(
                fail(
                    name,
                    detail,
                    f"the sandbox could not reach {host}:443: "
                    f"`sandgate explain {host}:443` says whether the policy allows it",
                )
            )
        else:
            hops.append(ok(name, detail))
    return hops


# -- CA wiring and proxy variables -------------------------------------------------------------

# Tools that fall back to the system bundle when none of their variables is set.
SYSTEM_FALLBACK = {"curl", "git"}


def ca_wiring(tool: str, plan: Plan, seen: dict[str, Any]) -> Hop:
    name = f"CA wiring: {tool}"
    env = seen.get("env") or {}
    bundles = seen.get("bundles") or {}
    live = _get(seen, "tools", tool)
    names = TOOL_VARS[tool]
    chosen = next((v for v in names if env.get(v)), None)
    want = f"{names[0]}={plan.bundle}"
    if chosen is None and tool in SYSTEM_FALLBACK:
        path, via = plan.bundle, "the system bundle"
    elif chosen is None:
        problem = f"none of {', '.join(names)} is set"
        if live.get("installed") is False:
            return skip(name, f"not installed in the sandbox ({problem})")
        return fail(
            name,
            problem,
            f"set {want} in the sandbox (sandgate run sets it; "
            "an --env or the agent's own start script removed it)",
        )
    else:
        path, via = str(env[chosen]), f"{chosen}={env[chosen]}"
    info = bundles.get(path) or {}
    if not info.get("readable") or not info.get("gateway_ca"):
        problem = (
            f"{via}: {path} cannot be read"
            if not info.get("readable")
            else f"{via}: {path} lacks the gateway's CA"
        )
        if live.get("installed") is False:
            return skip(name, f"not installed in the sandbox ({problem})")
        return fail(
            name,
            problem,
            f"point {names[0]} at {plan.bundle}, which holds the "
            "gateway's CA (sandgate binds it into every sandbox)",
        )
    if live.get("installed") is False:
        return skip(name, f"not installed in the sandbox (its wiring: {via})")
    if "trusted" not in live:
        return ok(name, f"{via} holds the gateway's CA (no gateway-signed name to try)")
    if not live["trusted"]:
        return fail(
            name,
            f"{via}, yet {tool} did not trust {plan.tls_url}: {live.get('detail')}",
            f"{tool} reads its trust elsewhere: point {names[0]} at {plan.bundle}"
            + (
                " (node also needs NODE_OPTIONS=--use-openssl-ca for a bundle as its only trust)"
                if tool == "node"
                else ""
            ),
        )
    return ok(name, f"{via}; {plan.tls_url} → {live.get('detail')}")


def proxy_variables(plan: Plan, seen: dict[str, Any]) -> Hop:
    name = "proxy variables"
    env = seen.get("env") or {}
    wrong = [f"{v}={env.get(v, '(unset)')}" for v in PROXY_VARS if env.get(v) != plan.proxy]
    for v in NO_PROXY_VARS:
        items = {i.strip() for i in str(env.get(v, "")).split(",") if i.strip()}
        if "*" in items or not set(NO_PROXY_NEEDS) <= items:
            wrong.append(f"{v}={env.get(v, '(unset)')}")
    if wrong:
        return fail(
            name,
            "; ".join(wrong),
            f"set HTTP_PROXY, HTTPS_PROXY, http_proxy and https_proxy to {plan.proxy}, and "
            f"NO_PROXY/no_proxy to {','.join(NO_PROXY_NEEDS)} (sandgate run sets them; an "
            "--env or the agent's own start script changed them)",
        )
    return ok(name, f"HTTP(S)_PROXY={plan.proxy}; NO_PROXY={env.get('NO_PROXY')}")


# -- the clock and the uplink ------------------------------------------------------------------


def clock(plan: Plan, seen: dict[str, Any], facts: GatewayFacts) -> Hop:
    name = "clock skew"
    start = _get(seen, "clock").get("start")
    if not isinstance(start, int | float):
        return fail(name, "the driver reported no time", "rerun; the driver did not finish")
    # The driver read its clock while the host's read between host_start and host_end.
    low, high = facts.host_start - CLOCK_TOLERANCE, facts.host_end + CLOCK_TOLERANCE
    off = start - facts.host_end if start > high else start - facts.host_start if start < low else 0
    problems, parts = [], [f"{off:+.0f} s against the host" if off else "agrees with the host"]
    if off:
        problems.append(
            f"the sandbox's clock is {abs(off):.0f} s "
            + ("ahead of" if off > 0 else "behind")
            + " the host's"
        )
    date = _get(seen, "date")
    if plan.date_url and date.get("date"):
        world_off = _date_skew(str(date["date"]), date.get("at"))
        if world_off is None:
            parts.append(f"unreadable Date {date['date']!r}")
        else:
            parts.append(f"{world_off:+.0f} s against {plan.date_url}'s Date")
            if abs(world_off) > CLOCK_TOLERANCE + 1:
                problems.append(f"{plan.date_url} says {date['date']}")
    elif plan.date_url:
        parts.append(f"no Date header from {plan.date_url}")
    if problems:
        return fail(
            name,
            "; ".join(problems + parts),
            "sync the clock: in a VM guest run chrony or systemd-timesyncd (report 000's VM "
            "drifted 9 minutes); a sandbox on this host shares its clock, so sync the host "
            "(`timedatectl set-ntp true`). TLS and signed requests fail on a clock that is off",
        )
    return ok(name, "; ".join(parts))


def _date_skew(header: str, at: object) -> float | None:
    try:
        when = email.utils.parsedate_to_datetime(header)
    except (TypeError, ValueError):
        return None
    if not isinstance(at, int | float):
        return None
    return float(at) - when.timestamp()


def uplink(plan: Plan, seen: dict[str, Any], facts: GatewayFacts) -> Hop:
    name = "uplink"
    if not facts.forwarding:
        return fail(name, "IPv4 forwarding is off in the gateway's namespace", RESTART)
    if plan.uplink_url is None:
        return ok(name, "forwarding on; no allowed name to try over HTTPS")
    got = _get(seen, "uplink")
    code = str(got.get("code") or "000")
    if code != "000" and not got.get("sandgate_reason"):
        return ok(name, f"{plan.uplink_url} → {code}")
    detail = f"{plan.uplink_url}: " + (
        f"{code} ({got['sandgate_reason']})"
        if got.get("sandgate_reason")
        else str(got.get("error") or "no answer")
    )
    if got.get("sandgate_reason"):
        return fail(name, detail, f"`sandgate explain {plan.uplink_url}` says why it is refused")
    if plan.world:
        return fail(
            name,
            detail,
            "the test world behind the gateway does not answer: "
            "`sandgate cleanup`, then bring it up again (`sandgate up --world test`)",
        )
    return fail(
        name,
        detail,
        "check the gateway's uplink: the link is up, has a default "
        "route, and reaches the name's address (try it from the host)",
    )
