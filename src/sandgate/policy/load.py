"""Loading a policy: TOML file (or the built-in default) -> validated ``Policy``.

Every problem is reported with file, line and a fix, and all of them at once: a policy that
has any problem is not used at all. A named file that is missing or broken is an error, never
a fall-back to the default (which is open): only when no file is named does the built-in
default apply.
"""

from __future__ import annotations

import difflib
import re
import tomllib
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ValidationError

from sandgate.errors import PolicyError, PolicyProblem
from sandgate.gcpause import paused_gc
from sandgate.policy.hostparse import HostParseError, IPHost, parse_host
from sandgate.policy.locate import Position, Positions, find
from sandgate.policy.model import (
    ExposeSpec,
    GatewaySpec,
    IPAddress,
    IPNetwork,
    Mode,
    PolicyFile,
    ProfileSpec,
    Protocol,
    RuleSpec,
    SecretSpec,
    front_upstream,
)
from sandgate.policy.overlay import BUILTIN_NAME, EXTENDS, OverlayFile
from sandgate.policy.plainrules import put_plain_rules, read_plain_rules
from sandgate.policy.profile import (
    Expose,
    Front,
    Profile,
    Rule,
    inspect_patterns,
    rules_from_specs,
)

BUILTIN = "<built-in default>"
# Keys that only sandgate's own test world may set. Refused in files, with a reason.
_WORLD_ONLY = {"public_override", "test_internet"}
# Keys that once existed and mean nothing now: refused with what to do instead.
_RETIRED = {
    ("gateway", "uplink_subnet"): (
        "uplink_subnet is not used: the real uplink goes through pasta, which gives the "
        "gateway the host's own address",
        "delete this line",
    ),
}


@dataclass(frozen=True)
class Policy:
    file: PolicyFile
    source: str  # the path, or BUILTIN
    positions: Mapping[tuple[str | int, ...], Position]
    # An overlay (policy/overlay.py): each rule's file and position, and the policy it extends.
    origins: dict[tuple[str | int, ...], tuple[str, Position | None]] = field(default_factory=dict)
    extends: str | None = None

    def check(self) -> None:
        """Rules that repeat each other, are made dead by a deny rule, or name a guest."""
        problems = []
        for name in self.file.profiles:
            allow, deny = self._file_rules(name)
            problems += check_rules(allow, deny, self._where)
            problems += _pool_rules(allow, self.file.gateway.pool, self._where)
        problems += _expose_problems(self.file, self.positions, self.source)
        if problems:
            raise PolicyError(problems)
        # profile() need not check the file's own rules against its own pool again (a second
        # of 100,000 rules' worth, issue 11). Not a field: it is a fact of this object.
        object.__setattr__(self, "_checked", True)

    @property
    def _was_checked(self) -> bool:
        return bool(getattr(self, "_checked", False))

    def _file_rules(self, name: str) -> tuple[tuple[Rule, ...], tuple[Rule, ...]]:
        """The file's own allow and deny rules of profile ``name``, made once: ``check()`` and
        every ``profile()`` share them (frozen; 100,000 rules are worth not making twice)."""
        made: dict[str, tuple[tuple[Rule, ...], tuple[Rule, ...]]]
        made = self.__dict__.setdefault("_rules", {})
        if name not in made:
            spec = self.file.profiles[name]
            made[name] = (
                rules_from_specs("allow", spec.allow, f"{name}.allow"),
                rules_from_specs("deny", spec.deny, f"{name}.deny"),
            )
        return made[name]

    @property
    def builtin(self) -> bool:
        return self.source == BUILTIN

    def default_profile(self) -> str:
        chosen = self.file.gateway.default_profile
        if chosen is not None:
            return chosen
        names = sorted(self.file.profiles)
        if "default" in self.file.profiles:
            return "default"
        if len(names) == 1:
            return names[0]
        raise PolicyError(
            [
                PolicyProblem(
                    self.source,
                    None,
                    None,
                    f"this policy has several profiles ({', '.join(names)}) and no default",
                    "pass --profile NAME, or set default_profile under [gateway]",
                )
            ]
        )

    def profile(
        self,
        name: str | None = None,
        *,
        mode: Mode | None = None,
        extra_allow: Sequence[str] = (),
        extra_deny: Sequence[str] = (),
        public_override: tuple[IPNetwork, ...] = (),
        gateway_address: IPAddress | None = None,
        guest_pool: IPNetwork | None = None,
        host_addresses: tuple[IPAddress, ...] = (),
        ask: bool = False,
        uplink_ipv6: bool = False,
    ) -> Profile:
        """The effective profile for one guest, with the run's overrides applied.

        ``guest_pool`` is the running gateway's (the daemon passes its own); without one, the
        file's ``[gateway] guest_pool``, which the daemon was started with (session/stack.py)."""
        chosen = name or self.default_profile()
        spec = self.file.profiles.get(chosen)
        if spec is None:
            close = difflib.get_close_matches(chosen, list(self.file.profiles), n=1)
            raise PolicyError(
                [
                    PolicyProblem(
                        self.source,
                        None,
                        None,
                        f"no profile named {chosen!r}",
                        f"did you mean {close[0]!r}?"
                        if close
                        else f"choose one of {', '.join(sorted(self.file.profiles))}",
                    )
                ]
            )
        allow, deny = self._file_rules(chosen)
        allow += tuple(
            Rule("allow", s, f"--allow[{i}]") for i, s in _cli_rules(extra_allow, "--allow")
        )
        deny += tuple(Rule("deny", s, f"--deny[{i}]") for i, s in _cli_rules(extra_deny, "--deny"))
        pool = guest_pool or self.file.gateway.pool
        if extra_allow or extra_deny or pool != self.file.gateway.pool or not self._was_checked:
            problems = check_rules(allow, deny, self._where)
            problems += _pool_rules(allow, pool, self._where)
            if problems:
                raise PolicyError(problems)
        profile = Profile(
            name=chosen,
            mode=mode or spec.internet,
            allow=allow,
            deny=deny,
            inspect=inspect_patterns(spec.inspect),
            secrets=tuple(spec.secret),
            public_override=public_override,
            guest_pool=guest_pool or self.file.gateway.pool,
            host_addresses=host_addresses,
            gateway_address=gateway_address,
            uplink_ipv6=uplink_ipv6,
            fronts=tuple(Front(f.name, *front_upstream(f.upstream)) for f in spec.front),
            expose=tuple(
                Expose(e.port, e.networks, f"expose[{i}]")
                for i, e in enumerate(self.file.expose)
                if e.guest == chosen
            ),
            tunnel_idle=spec.tunnels.idle_seconds,
            tunnel_max_seconds=spec.tunnels.max_seconds,
            tunnel_max_bytes=spec.tunnels.max_bytes,
            ask=(ask or spec.ask) and (mode or spec.internet) is Mode.ALLOWLIST,
        )
        self._check_fronts(chosen, profile)
        return profile

    def host_loopback_ports(self) -> tuple[int, ...]:
        """Every port of the host's loopback some profile opens: what the gateway started
        with this policy relays (gateway/hostlo.py)."""
        return tuple(
            sorted(
                {
                    r.host_loopback
                    for spec in self.file.profiles.values()
                    for r in spec.allow
                    if r.host_loopback is not None
                }
            )
        )

    def host_loopback_problem(self, port: int, message: str, fix: str) -> PolicyError:
        """An error located at the first rule that names host-loopback ``port``."""
        for name, spec in self.file.profiles.items():
            for i, r in enumerate(spec.allow):
                if r.host_loopback == port:
                    pos = find(self.positions, ("profiles", name, "allow", i))
                    return PolicyError([_located(self.source, pos, message, fix)])
        return _one(self.source, message, fix)

    def warnings(self, exists: Any = None) -> list[PolicyProblem]:
        """What is valid but probably not meant: a process rule's executable that this machine
        does not have (the sandbox sees this machine's system folders), e.g. a typo."""
        import os

        exists = exists or os.path.exists
        found = []
        for name, spec in self.file.profiles.items():
            for i, rule in enumerate(spec.allow):
                for exe in (*(rule.process or ()), *(rule.under or ())):
                    if not exists(exe):
                        found.append(
                            _at(
                                self._where(f"{name}.allow[{i}]"),
                                f"{exe} does not exist here, so {name}.allow[{i}] matches no "
                                "process",
                                "check the path: `sandgate log` shows each flow's "
                                "details.process.exe",
                            )
                        )
        return found

    def gateway_problem(self, key: str, message: str, fix: str) -> PolicyError:
        """An error about a key of ``[gateway]``, located at that key (or the table)."""
        pos = find(self.positions, ("gateway", key))
        return PolicyError([_located(self.source, pos, message, fix)])

    def _check_fronts(self, name: str, profile: Profile) -> None:
        """A front may only lead where the profile's own rules already allow."""
        from sandgate.policy.decide import Attempt, decide

        problems = []
        for i, front in enumerate(profile.fronts):
            d = decide(profile, Attempt(Protocol.TCP, front.address, front.port))
            if not d.allowed:
                pos = find(self.positions, ("profiles", name, "front", i))
                problems.append(
                    _located(
                        self.source,
                        pos,
                        f"front {front.name!r} leads to {front.address}:{front.port}, which this "
                        f"profile does not allow ({d.key})",
                        f'add {{ host = "{front.address}", port = {front.port} }} to allow',
                    )
                )
        if problems:
            raise PolicyError(problems)

    def _where(self, ref: str) -> PolicyProblem:
        """A problem stub located at a rule reference like 'coder.allow[2]' or '--allow[0]'."""
        match = re.fullmatch(r"(.+)\.(allow|deny)\[(\d+)\]", ref)
        if match is None:
            return PolicyProblem(ref.split("[", maxsplit=1)[0], None, None, "")
        path = ("profiles", match[1], match[2], int(match[3]))
        origin = self.origins.get(path)
        if origin is not None:
            return _located(origin[0], origin[1], "")
        pos = find(self.positions, path)
        return _located(self.source, pos, "")


def load_policy(path: str | Path | None = None) -> Policy:
    """The policy at ``path``; the built-in default only when ``path`` is None."""
    if path is None:
        text = resources.files("sandgate.policy").joinpath("default.toml").read_bytes()
        return parse_policy(text, BUILTIN)
    source = str(path)
    try:
        text = Path(path).read_bytes()
    except FileNotFoundError:
        raise _one(
            source,
            "the policy file does not exist",
            "check the path; sandgate "
            "never falls back to its open default when a named policy is missing",
        ) from None
    except OSError as exc:
        raise _one(
            source, f"cannot read the policy file: {exc.strerror}", "check its permissions"
        ) from exc
    return parse_policy(text, source)


def parse_policy(text: bytes, source: str) -> Policy:
    with paused_gc():  # a large file's objects all live on (sandgate/gcpause.py)
        return _parse_policy(text, source)


def _parse_policy(text: bytes, source: str) -> Policy:
    try:
        raw = tomllib.loads(text.decode("utf-8"))
    except UnicodeDecodeError as exc:
        line_start = text.rfind(b"\n", 0, exc.start) + 1
        raise PolicyError(
            [
                PolicyProblem(
                    source,
                    text.count(b"\n", 0, exc.start) + 1,
                    exc.start - line_start + 1,
                    f"not UTF-8 text (byte {exc.start})",
                    "save the file as UTF-8",
                )
            ]
        ) from exc
    except tomllib.TOMLDecodeError as exc:
        line, col, msg = _toml_position(str(exc), text)
        raise PolicyError(
            [PolicyProblem(source, line, col, f"TOML syntax: {msg}", "fix the syntax at that spot")]
        ) from exc
    positions = Positions(text)  # walked only if a problem needs its line
    # Plain rule entries are read without pydantic (policy/plainrules.py), the rest by it. A
    # plain entry has a rule's keys only, none of the test world's: the walk passes them by.
    plain, whole = read_plain_rules(raw) if EXTENDS not in raw else (raw, {})
    problems = list(_world_only_keys(plain, positions, source))
    if problems:
        raise PolicyError(problems)
    if EXTENDS in raw:
        return parse_overlay(raw, positions, source)
    try:
        file = PolicyFile.model_validate(plain)
    except ValidationError as exc:
        found = [_problem_from_pydantic(err, positions, source) for err in exc.errors()]
        raise PolicyError(sorted(found, key=_in_file_order)) from None
    put_plain_rules(file, whole)
    policy = Policy(file, source, positions)
    policy.check()
    return policy


def _expose_problems(
    file: PolicyFile, positions: Mapping[Any, Position], source: str
) -> list[PolicyProblem]:
    """Each expose rule names a profile, and each uplink port is forwarded to one guest only."""
    problems: list[PolicyProblem] = []
    ports: dict[int, int] = {}
    for i, rule in enumerate(file.expose):
        if rule.guest not in file.profiles:
            close = difflib.get_close_matches(rule.guest, list(file.profiles), n=1)
            problems.append(
                _located(
                    source,
                    find(positions, ("expose", i, "guest")),
                    f"expose[{i}]: guest = {rule.guest!r} is not a profile here",
                    f"did you mean {close[0]!r}?"
                    if close
                    else f"name one of {', '.join(sorted(file.profiles))}",
                )
            )
        first = ports.setdefault(rule.port, i)
        if first != i:
            problems.append(
                _located(
                    source,
                    find(positions, ("expose", i, "port")),
                    f"expose[{i}]: port {rule.port} is forwarded by expose[{first}] already "
                    "(one uplink port leads to one guest)",
                    "merge the two rules' from lists, or use another port",
                )
            )
    return problems


def _pool_rules(allow: Sequence[Rule], pool: IPNetwork, where: Any) -> list[PolicyProblem]:
    """Allow rules that name addresses inside the guest pool: guests never reach each other.

    A rule *covering* the pool (``10.0.0.0/8``) is fine; one inside it would name a guest."""
    return [
        _at(
            where(rule.ref),
            f"{rule} names addresses in the guest pool {pool}; guests never reach each other "
            "or their gateway's other ports",
            "remove the rule, or move the pool with guest_pool under [gateway]",
        )
        for rule in allow
        if (net := rule.spec.network) is not None and _inside(net, pool)
    ]


def _inside(net: IPNetwork, pool: IPNetwork) -> bool:
    """``net.subnet_of(pool)`` for two prefixes, by their numbers (ten times faster)."""
    if net.version != pool.version or net.prefixlen < pool.prefixlen:
        return False
    shift = net.max_prefixlen - pool.prefixlen
    return int(net.network_address) >> shift == int(pool.network_address) >> shift


def check_rules(allow: Sequence[Rule], deny: Sequence[Rule], where: Any) -> list[PolicyProblem]:
    """Rules that repeat each other, or allow rules a deny rule makes dead."""
    problems: list[PolicyProblem] = [
        _at(
            where(rule.ref),
            f"{rule} is a host_loopback rule in deny: the host is closed to guests already",
            "move it to allow to open that one port of the host's loopback, or delete it",
        )
        for rule in deny
        if rule.spec.host_loopback is not None
    ] + [
        _at(
            where(rule.ref),
            f"{rule} has request rules (http), which only an allow rule can have: a deny "
            "rule refuses its destination whole",
            "move the rule to allow with the requests it may make, or drop 'http'",
        )
        for rule in deny
        if rule.spec.http is not None
    ]
    for rules in (allow, deny):
        # By key, not pairwise: a 100,000-rule policy is checked in linear time.
        first: dict[tuple[Any, ...], Rule] = {}
        for rule in rules:
            earlier = first.setdefault(_same_key(rule.spec), rule)
            if earlier is not rule:
                problems.append(
                    _at(where(rule.ref), f"{rule} repeats {earlier}", "delete one of them")
                )
    blockers = _blockers(deny)
    for rule in allow:
        for blocker in blockers(rule):
            if _covers(blocker.spec, rule.spec):
                problems.append(
                    _at(
                        where(rule.ref),
                        f"{rule} can never match: {blocker} denies everything it allows "
                        "(deny wins)",
                        "remove the allow rule, or narrow the deny rule",
                    )
                )
                break
    return problems


def _blockers(deny: Sequence[Rule]) -> Any:
    """For an allow rule, the deny rules that could cover it (``_covers``), in profile order:
    by the index (policy/index.py) once the deny list is long, not every deny rule for every
    allow rule (100,000 allow rules by 1,000 deny rules were 10^8 comparisons). A pattern is
    covered by exact and wildcard patterns that match its base, and by the same wildcard; a
    network by networks that hold its first address."""
    if len(deny) < 16:
        return lambda rule: deny
    from sandgate.policy.index import RuleList

    index = RuleList.of(deny)
    order = {id(r): i for i, r in enumerate(deny)}

    def blockers(rule: Rule) -> Sequence[Rule]:
        spec = rule.spec
        if spec.pattern is not None:
            found: Sequence[Rule] = index.candidates(None, spec.pattern.base)
            same = index.wild.get(spec.pattern.base) if spec.pattern.wildcard else None
            if same:  # "*.x.com" covers "*.x.com", whose base it does not match
                numbers = sorted({order[id(r)] for r in found} | set(same))
                found = [deny[i] for i in numbers]
            return found
        if spec.network is not None:
            return index.candidates(spec.network.network_address, None)
        return ()

    return blockers


def _same_key(spec: RuleSpec) -> tuple[Any, ...]:
    """Two rules repeat each other when their keys are equal. Patterns compare by their normal
    form ("PyPI.org" repeats "pypi.org")."""
    pattern = spec.pattern
    named = (pattern.base, pattern.wildcard) if pattern is not None else None  # its str()
    return (spec.network, named, spec.ports, spec.protocols)


def _covers(wide: RuleSpec, narrow: RuleSpec) -> bool:
    """True when every attempt ``narrow`` matches is matched by ``wide``."""
    if not narrow.protocols <= wide.protocols:
        return False
    if wide.ports and not (
        narrow.ports
        and all(any(lo <= a and b <= hi for lo, hi in wide.ports) for a, b in narrow.ports)
    ):
        return False
    if wide.pattern is not None and narrow.pattern is not None:
        return wide.pattern.covers(narrow.pattern)
    if wide.network is not None and narrow.network is not None:
        return wide.network.version == narrow.network.version and narrow.network.subnet_of(
            wide.network  # type: ignore[arg-type]
        )
    return False


def parse_rule_text(text: str) -> RuleSpec:
    """A rule from the command line: TARGET[:PORTS][/PROTO].

    TARGET is a domain pattern, an address (any spelling; IPv6 in brackets when a port
    follows) or a CIDR; PORTS is ``443``, ``80,443`` or ``8000-8100``; PROTO is tcp, udp,
    icmp or any. Examples: ``pypi.org``, ``*.github.com:443``, ``10.77.0.10:8000``,
    ``10.77.0.0/24``, ``[fd00::1]:53/udp``.
    """
    rest = text.strip()
    fields: dict[str, Any] = {}
    proto = re.search(r"/(tcp|udp|icmp|any)$", rest)
    if proto:
        fields["protocol"] = proto[1]
        rest = rest[: proto.start()]
    ports: str | None = None
    if rest.startswith("["):
        host, _, tail = rest[1:].partition("]")
        if tail.startswith(":"):
            ports = tail[1:]
        elif tail:
            raise ValueError(f"{text!r}: after ']' only ':PORT' may follow")
        rest = host
    elif rest.count(":") == 1:
        rest, _, ports = rest.partition(":")
    if ports is not None:
        items = [p.strip() for p in ports.split(",")]
        fields["port"] = [int(p) if p.isdigit() else p for p in items]
        if len(items) == 1:
            fields["port"] = fields["port"][0]
    if "/" in rest:
        fields["cidr"] = rest
    elif "*" in rest:
        fields["domain"] = rest  # a pattern, right or wrong: parse_pattern says how to write it
    else:
        try:
            parsed = parse_host(rest)
        except HostParseError as exc:
            raise ValueError(str(exc)) from exc
        fields["host" if isinstance(parsed, IPHost) else "domain"] = rest
    return RuleSpec.model_validate(fields)


def _cli_rules(texts: Iterable[str], flag: str) -> list[tuple[int, RuleSpec]]:
    out: list[tuple[int, RuleSpec]] = []
    problems: list[PolicyProblem] = []
    for i, text in enumerate(texts):
        try:
            out.append((i, parse_rule_text(text)))
        except ValidationError as exc:
            msg = "; ".join(_clean(e["msg"]) for e in exc.errors())
            problems.append(PolicyProblem(f"{flag} {text!r}", None, None, msg, _RULE_HELP))
        except ValueError as exc:
            problems.append(PolicyProblem(f"{flag} {text!r}", None, None, str(exc), _RULE_HELP))
    if problems:
        raise PolicyError(problems)
    return out


_RULE_HELP = "write TARGET[:PORTS][/PROTO], e.g. pypi.org, *.github.com:443, 10.77.0.10:8000"


def _world_only_keys(
    raw: Any, positions: Mapping[Any, Position], source: str
) -> Iterable[PolicyProblem]:
    def walk(node: Any, path: tuple[str | int, ...]) -> Iterable[PolicyProblem]:
        if isinstance(node, dict):
            for key, value in node.items():
                if key in _WORLD_ONLY:
                    yield _located(
                        source,
                        find(positions, (*path, key)),
                        f"{key!r} is set by sandgate's test world only",
                        "remove it; to reach a network, add an allow rule for it",
                    )
                elif isinstance(value, dict | list):  # a scalar holds no key
                    yield from walk(value, (*path, key))
        elif isinstance(node, list):
            for i, item in enumerate(node):
                if isinstance(item, dict | list):
                    yield from walk(item, (*path, i))

    return walk(raw, ())


# Errors the model raises for the file as a whole, and the key each one is about.
_MODEL_ERROR_LOC: dict[str, tuple[str, ...]] = {
    "unknown_default_profile": ("gateway", "default_profile"),
    "no_profiles": ("profiles",),
    "unknown_guest_profile": ("gateway", "guests"),
    "uplink_is_guest": ("gateway", "uplink"),
    "guest_link_twice": ("gateway", "guests"),
}


def _problem_from_pydantic(
    err: Any, positions: Mapping[Any, Position], source: str
) -> PolicyProblem:
    kind = err["type"]
    loc: tuple[str | int, ...] = tuple(err["loc"]) or _MODEL_ERROR_LOC.get(kind, ())
    pos = find(positions, loc)
    where = ".".join(str(p) for p in loc if not _is_type_tag(p))
    if kind == "extra_forbidden" and loc in _RETIRED:
        return _located(source, pos, *_RETIRED[loc])
    if kind == "extra_forbidden":
        key = str(loc[-1])
        known = _known_keys(loc[:-1])
        close = difflib.get_close_matches(key, known, n=1)
        fix = f"did you mean {close[0]!r}?" if close else f"known keys here: {', '.join(known)}"
        return _located(source, pos, f"unknown key {where!r}", fix)
    if kind == "missing":
        return _located(source, pos, f"{where!r} is required", f"add {loc[-1]} = ...")
    if kind in ("literal_error", "enum"):
        expected = err.get("ctx", {}).get("expected", "")
        return _located(
            source, pos, f"{where} = {err.get('input')!r} is not allowed", f"use one of {expected}"
        )
    message = _clean(err["msg"])
    return _located(source, pos, f"{where}: {message}" if where else message, _fix_for(loc))


def _in_file_order(problem: PolicyProblem) -> tuple[int, int]:
    return (problem.line or 0, problem.column or 0)


def _is_type_tag(part: str | int) -> bool:
    # pydantic names the union member it tried, e.g. 'int' or 'list[int]'; not a file key.
    return isinstance(part, str) and (part in {"int", "str", "float", "bool"} or "[" in part)


def _known_keys(loc: tuple[str | int, ...]) -> list[str]:
    model: type[BaseModel] = PolicyFile
    for part in loc:
        if model is PolicyFile and part == "profiles":
            model = ProfileSpec
            continue
        if model is ProfileSpec and isinstance(part, str) and part in ("allow", "deny"):
            model = RuleSpec
        elif model is ProfileSpec and part == "secret":
            model = SecretSpec
        elif model is PolicyFile and part == "gateway":
            model = GatewaySpec
        elif model is PolicyFile and part == "expose":
            model = ExposeSpec
    return sorted(f.alias or k for k, f in model.model_fields.items())


def _fix_for(loc: tuple[str | int, ...]) -> str | None:
    keys = {p for p in loc if isinstance(p, str)}
    if "host_loopback" in keys:
        return 'e.g. { host_loopback = 11434, name = "ollama" } (Ollama on the host\'s 127.0.0.1)'
    if "expose" in keys:
        return 'e.g. expose = [{ guest = "orchestrator", port = 9119, from = "192.168.1.10" }]'
    if keys & {"allow", "deny"} and "http" in keys:
        return 'http = ["POST /v1/chat/completions", "GET /v1/*"]: METHOD /path, * ends a prefix'
    if keys & {"allow", "deny"}:
        return (
            'a rule is { host = "10.77.0.10", port = 8000 } or { cidr = ... } or { domain = ... }'
        )
    if "secret" in keys:
        return 'e.g. value = "env:OPENAI_API_KEY" or value = "file:/run/secrets/openai"'
    if "guest_pool" in keys:
        return 'an IPv4 network outside every network you use, e.g. guest_pool = "10.201.0.0/16"'
    if "default_profile" in keys:
        return "name one of the [profiles.NAME] tables, or drop default_profile"
    if "profiles" in keys and len(loc) == 1:
        return 'add a profile, e.g. [profiles.default] with internet = "locked"'
    return None


def _clean(msg: str) -> str:
    return msg.removeprefix("Value error, ").removeprefix("Assertion failed, ")


def _toml_position(message: str, text: bytes) -> tuple[int | None, int | None, str]:
    match = re.search(r"\(at line (\d+), column (\d+)\)", message)
    if match:
        return int(match[1]), int(match[2]), message[: match.start()].strip()
    end = re.search(r"\(at end of document\)", message)
    if end:
        # Something left open (a bracket, a string): point at the last line that says anything.
        last = len(text.rstrip().splitlines()) or 1
        return last, None, f"{message[: end.start()].strip()} (the file ends too early)"
    return None, None, message


def _located(
    source: str, pos: Position | None, message: str, fix: str | None = None
) -> PolicyProblem:
    line, column = pos if pos is not None else (None, None)
    return PolicyProblem(source, line, column, message, fix)


def _one(source: str, message: str, fix: str) -> PolicyError:
    return PolicyError([PolicyProblem(source, None, None, message, fix)])


def _at(stub: PolicyProblem, message: str, fix: str) -> PolicyProblem:
    return PolicyProblem(stub.file, stub.line, stub.column, message, fix)


# -- overlays (policy/overlay.py): a file that adds rules to another policy ---------------


def parse_overlay(raw: dict[str, Any], positions: Mapping[Any, Position], source: str) -> Policy:
    """The policy an overlay file extends, with the overlay's rules added (a ``Policy``)."""
    try:
        overlay = OverlayFile.model_validate(raw)
    except ValidationError as exc:
        found = [_problem_from_pydantic(e, positions, source) for e in exc.errors()]
        if any(e["loc"][:1] not in (("extends",), ("profiles",)) for e in exc.errors()):
            found.append(
                PolicyProblem(
                    source,
                    None,
                    None,
                    "an overlay (a file with 'extends') holds only extends and the allow "
                    "and deny lists of profiles.NAME tables",
                    "put modes, secrets and new profiles in the policy it extends",
                )
            )
        raise PolicyError(sorted(found, key=_in_file_order)) from None
    if overlay.extends == BUILTIN_NAME:
        base = load_policy(None)
    else:
        target = Path(overlay.extends)
        if not target.is_absolute() and source != BUILTIN_NAME:
            target = Path(source).resolve().parent / target
        if target.resolve() == Path(source).resolve():
            pos = find(positions, (EXTENDS,))
            raise PolicyError([_located(source, pos, "an overlay cannot extend itself", "")])
        base = load_policy(target)
    return apply_overlay(base, overlay, positions, source)


def apply_overlay(
    base: Policy, overlay: OverlayFile, positions: Mapping[Any, Position], source: str
) -> Policy:
    """``base`` (a ``Policy``) with the overlay's rules appended to its profiles."""
    problems: list[PolicyProblem] = []
    profiles = dict(base.file.profiles)
    origins: dict[tuple[str | int, ...], tuple[str, Position | None]] = dict(base.origins)
    for name, extra in overlay.profiles.items():
        spec = profiles.get(name)
        if spec is None:
            problems.append(
                _located(
                    source,
                    find(positions, ("profiles", name)),
                    f"{base.source} has no profile {name!r} to add rules to",
                    f"choose one of {', '.join(sorted(profiles))}",
                )
            )
            continue
        for action in ("allow", "deny"):
            mine: list[RuleSpec] = getattr(spec, action)
            for i in range(len(mine)):
                key = ("profiles", name, action, i)
                origins.setdefault(key, (base.source, find(base.positions, key)))
            for j in range(len(getattr(extra, action))):
                at = ("profiles", name, action, j)
                origins[("profiles", name, action, len(mine) + j)] = (source, find(positions, at))
        profiles[name] = spec.model_copy(
            update={"allow": spec.allow + extra.allow, "deny": spec.deny + extra.deny}
        )
    if problems:
        raise PolicyError(problems)
    file = base.file.model_copy(update={"profiles": profiles})
    merged = Policy(file, source, base.positions, origins, base.source)
    merged.check()
    return merged
