"""Plain rule entries read without pydantic: what makes a 100,000-rule file load in well under
a second (issue 11 part 4).

Almost every entry of a large list is ``{ domain = "…" }``, ``{ cidr = "…" }`` or
``{ host = "…" }`` with perhaps an integer ``port``, a ``protocol`` and a ``name``. For such an
entry ``plain_rule`` builds the ``RuleSpec`` pydantic would build (the same field values, the
same fields set) and fills in its derived values (``network``, ``pattern``, ``ports``,
``protocols``) as the model would compute them. It reads an entry only when the model's
validators would accept it as written; anything else (another key, another type, a list of
ports, a target the model refuses) returns None and goes to pydantic, so every error message
is the model's own. tests/unit/test_plainrules.py compares both ways on generated entries.
"""

from __future__ import annotations

from typing import Any

from sandgate.policy.model import (
    PolicyFile,
    RuleSpec,
    _cidr_network,
    _host_network,
    _protocols,
    _unmapped,
)
from sandgate.policy.patterns import parse_pattern

_TARGETS = ("domain", "cidr", "host")
_KEYS = frozenset({*_TARGETS, "port", "protocol", "name"})
_PROTOCOLS = frozenset({"tcp", "udp", "icmp", "any"})
_DEFAULTS: dict[str, Any] = dict.fromkeys(RuleSpec.model_fields)
# (port, protocol) -> (ports, protocols): a few scopes serve a whole list.
_SCOPES: dict[tuple[int | None, str | None], tuple[Any, Any]] = {}
# An entry's keys, in order -> its one target key, or "" where pydantic must read it.
_SHAPES: dict[tuple[str, ...], str] = {}
_set = object.__setattr__
_read_pattern = parse_pattern.__wrapped__
_read_cidr = _cidr_network.__wrapped__


def _target(shape: tuple[str, ...]) -> str:
    given = [k for k in _TARGETS if k in shape]
    return given[0] if len(given) == 1 and _KEYS.issuperset(shape) else ""


def plain_rule(entry: object) -> RuleSpec | None:
    """The ``RuleSpec`` pydantic would make of ``entry``, or None where pydantic must read it."""
    if type(entry) is not dict:
        return None
    shape = tuple(entry)
    target = _SHAPES.get(shape)
    if target is None:
        target = _target(shape)
        if len(_SHAPES) < 256:  # a file has a few shapes; an odd one is not remembered
            _SHAPES[shape] = target
    if not target:
        return None
    text = entry[target]
    port = entry.get("port")
    protocol = entry.get("protocol")
    if type(text) is not str or (port is not None and type(port) is not int):
        return None
    if protocol is not None and type(protocol) is not str:
        return None
    if "name" in entry and type(entry["name"]) is not str:
        return None
    scope = _SCOPES.get((port, protocol))
    if scope is None:
        if port is not None and not 1 <= port <= 65535:
            return None
        if protocol is not None and protocol not in _PROTOCOLS:
            return None
        if port is not None and protocol == "icmp":
            return None  # the model's "ICMP has no ports"
        ports = ((port, port),) if port is not None else ()
        scope = _SCOPES[(port, protocol)] = (ports, _protocols(protocol, has_ports=bool(ports)))
    try:
        # Uncached: each is read once here, then kept in the spec (a miss costs a third).
        if target == "domain":
            pattern, network = _read_pattern(text), None
        elif target == "cidr":
            pattern, network = None, _unmapped(_read_cidr(text))
        else:
            pattern, network = None, _unmapped(_host_network(text))
    except ValueError:  # PatternError too
        return None  # the model words the error
    spec = RuleSpec.__new__(RuleSpec)
    values = _DEFAULTS.copy()
    values.update(entry)
    # The cached properties' values, where functools.cached_property keeps them.
    values["pattern"] = pattern
    values["network"] = network
    values["ports"], values["protocols"] = scope
    values["requests"] = ()  # no http
    # What model_construct sets (pydantic 2): the test compares with model_validate.
    _set(spec, "__dict__", values)
    _set(spec, "__pydantic_fields_set__", set(shape))
    _set(spec, "__pydantic_extra__", None)
    _set(spec, "__pydantic_private__", None)
    return spec


# (profile, "allow" or "deny") -> a list every entry of which was plain.
WholeLists = dict[tuple[str, str], list[RuleSpec]]


def read_plain_rules(raw: object) -> tuple[object, WholeLists]:
    """``raw`` (a parsed policy file) with each profile's plain allow and deny entries made
    ``RuleSpec``s (pydantic takes an instance as it is); everything else untouched, so
    pydantic reports what is wrong, at the same place. A list whose every entry is plain is
    left out (empty) and returned beside: pydantic would only run each instance's model
    validator again (``_one_target``, 0.1 s of 100,000); ``put_plain_rules`` puts it back."""
    whole: WholeLists = {}
    if type(raw) is not dict or type(raw.get("profiles")) is not dict:
        return raw, whole
    profiles: dict[str, Any] = {}
    for key, written in raw["profiles"].items():
        if type(written) is dict:
            spec = dict(written)
            for action in ("allow", "deny"):
                entries = spec.get(action)
                if type(entries) is list:
                    read = [plain_rule(e) for e in entries]
                    if entries and all(r is not None for r in read):
                        whole[(key, action)] = read  # type: ignore[assignment]
                        spec[action] = []
                    else:
                        spec[action] = [r or e for r, e in zip(read, entries, strict=True)]
            profiles[key] = spec
        else:
            profiles[key] = written
    return {**raw, "profiles": profiles}, whole


def put_plain_rules(file: PolicyFile, whole: WholeLists) -> None:
    """The lists ``read_plain_rules`` left out, into the validated file's profiles."""
    for (name, action), specs in whole.items():
        # Frozen models: the field as pydantic itself keeps it, where it put the empty list.
        file.profiles[name].__dict__[action] = specs


__all__ = ["WholeLists", "plain_rule", "put_plain_rules", "read_plain_rules"]
