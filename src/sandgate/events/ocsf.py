"""Events as OCSF 1.8.0 records, for a SIEM: ``record(event) -> dict | None``, pure.

One record per attempt, in the Network Activity category (4):

| sandgate event | OCSF class | activity_id |
| --- | --- | --- |
| ``dns`` (a question to the gateway resolver) | DNS Activity 4003 | 6 Traffic (answered), 1 Query |
| ``conn`` (a connection attempt at L3/L4) | Network Activity 4001 | 1 Open, 5 Refuse, 6 Traffic |
| ``http`` tunnel (CONNECT, TLS passthrough, raw relay) | Network Activity 4001 | same |
| ``http`` request through the proxy (any other method) | HTTP Activity 4002 | the method's |

``session``, ``guest``, ``integrity``, ``drift``, ``stray`` and ``notice`` events are findings
about a session or the gateway, not network activity: ``record`` returns None for them (the CLI
says how many it left out) and ``sandgate report`` shows them.

The Decision lands in ``action_id`` (1 Allowed, 2 Denied), ``disposition_id`` (1 Allowed;
6 Dropped for a kernel drop, 2 Blocked for a refused question, request or tunnel) and
``firewall_rule`` (``uid`` the rule's reference such as ``coder.allow[2]``, or the reason key
when no rule matched; ``name`` the rule's label or the reason key; ``desc`` the reason).
Sandgate's own fields (session, guest, reason key, category...) go in ``unmapped``.

Why 1.8.0: the latest released OCSF schema (tag 1.8.0, March 2026) and the version peers emit
(OpenShell). Not older: 1.3.0 lacks ``app_protocol_name`` and the HTTP ``Patch`` activity, and
required ``dst_endpoint`` and ``action_id`` where 1.8.0 recommends them. The records
use the ``host`` (actor) and ``security_control`` (action, disposition, firewall_rule) profiles
and say so in ``metadata.profiles``. Nothing secret is written: the proxy redacts paths before
they are events, the path's ``?…`` marker is dropped here, and URLs in a process's command line
lose their userinfo and query (``/proc`` cmdlines are stored as the kernel gave them).
"""

from __future__ import annotations

import ipaddress
import json
import shlex
from collections import Counter
from collections.abc import Iterable
from functools import cache

from sandgate import TYPE_CHECKING
from sandgate.events.redact import redact_arg
from sandgate.events.schema import Event, Kind

if TYPE_CHECKING:
    from typing import Any, TextIO

OCSF_VERSION = "1.8.0"
PRODUCT = "sandgate"
PROFILES = ["host", "security_control"]

CATEGORY_UID, CATEGORY_NAME = 4, "Network Activity"
NETWORK_ACTIVITY, HTTP_ACTIVITY, DNS_ACTIVITY = 4001, 4002, 4003
CLASS_NAMES = {
    NETWORK_ACTIVITY: "Network Activity",
    HTTP_ACTIVITY: "HTTP Activity",
    DNS_ACTIVITY: "DNS Activity",
}
SKIPPED_KINDS = frozenset(
    {Kind.SESSION, Kind.GUEST, Kind.INTEGRITY, Kind.DRIFT, Kind.STRAY, Kind.NOTICE}
)

# activity_id -> caption, per class (0 Unknown and 99 Other come from base_event).
NETWORK_ACTIVITIES = {1: "Open", 2: "Close", 3: "Reset", 4: "Fail", 5: "Refuse", 6: "Traffic"}
DNS_ACTIVITIES = {1: "Query", 2: "Response", 6: "Traffic"}
HTTP_METHODS = {
    "CONNECT": 1, "DELETE": 2, "GET": 3, "HEAD": 4, "OPTIONS": 5, "POST": 6, "PUT": 7,
    "TRACE": 8, "PATCH": 9,
}  # fmt: skip
ACTIONS = {0: "Unknown", 1: "Allowed", 2: "Denied"}
DISPOSITIONS = {0: "Unknown", 1: "Allowed", 2: "Blocked", 6: "Dropped"}
SEVERITIES = {1: "Informational", 3: "Medium"}
# DNS Activity's rcode_id captions (RFC 6895 numbering; 24 Unassigned, 25 Reserved).
RCODES = {
    0: "NoError", 1: "FormError", 2: "ServError", 3: "NXDomain", 4: "NotImp", 5: "Refused",
    6: "YXDomain", 7: "YXRRSet", 8: "NXRRSet", 9: "NotAuth", 10: "NotZone", 11: "DSOTYPENI",
    16: "BADSIG_VERS", 17: "BADKEY", 18: "BADTIME", 19: "BADMODE", 20: "BADNAME", 21: "BADALG",
    22: "BADTRUNC", 23: "BADCOOKIE", 24: "Unassigned", 25: "Reserved",
}  # fmt: skip
PROTOCOL_NUMBERS = {"icmp": 1, "tcp": 6, "udp": 17, "ipv6-icmp": 58}
DIRECTIONS = {1: "Inbound", 2: "Outbound", 3: "Lateral"}


def record(event: Event, uid: int | str | None = None) -> dict[str, Any] | None:
    """The OCSF record of one event, or None for a kind that is not network activity.
    ``uid``: the event's id in the store, kept as ``metadata.uid``."""
    if event.kind is Kind.DNS:
        out = _dns(event)
    elif event.kind is Kind.CONN:
        out = _network(event)
    elif event.kind is Kind.HTTP:
        method = event.details.get("method")
        out = _network(event) if method in (None, "CONNECT") else _http(event, str(method))
    else:
        return None
    return _common(event, out, uid)


def write_jsonl(rows: Iterable[tuple[int | None, Event]], out: TextIO) -> Counter[str]:
    """One OCSF record a line for each (store id, event); the kinds left out, counted."""
    skipped: Counter[str] = Counter()
    for uid, event in rows:
        rec = record(event, uid)
        if rec is None:
            skipped[str(event.kind)] += 1
            continue
        out.write(json.dumps(rec, sort_keys=True, separators=(",", ":")) + "\n")
    return skipped


# -- the classes --------------------------------------------------------------------------------


def _dns(e: Event) -> dict[str, Any]:
    d = e.details
    rcode = d.get("rcode")
    out: dict[str, Any] = {
        "class_uid": DNS_ACTIVITY,
        "activity_id": 6 if isinstance(rcode, int) else 1,
    }
    out["activity_name"] = DNS_ACTIVITIES[out["activity_id"]]
    if e.name:
        query: dict[str, Any] = {"hostname": e.name, "class": "IN"}
        if d.get("qtype"):
            query["type"] = str(d["qtype"])
        out["query"] = query
    answers = d.get("answers") or []
    if answers:
        answer_type = str(d["qtype"]) if d.get("qtype") else None
        out["answers"] = [
            {"rdata": str(a), "class": "IN", **({"type": answer_type} if answer_type else {})}
            for a in answers
        ]
    if isinstance(rcode, int):
        out["rcode_id"] = rcode_id(rcode)
        out["rcode"] = RCODES[out["rcode_id"]]
    out["src_endpoint"] = _endpoint(e.src, d.get("sport"))
    out["dst_endpoint"] = _endpoint(e.dst, e.port)
    return out


def _network(e: Event) -> dict[str, Any]:
    """A connection attempt, or a tunnel through the proxy (one record at its end)."""
    d = e.details
    if e.verdict == "allow":
        activity = 1
    elif e.verdict == "deny":
        activity = 5
    else:
        activity = 6  # not judged (an inferred flow): traffic seen, nothing more claimed
    out: dict[str, Any] = {
        "class_uid": NETWORK_ACTIVITY,
        "activity_id": activity,
        "activity_name": NETWORK_ACTIVITIES[activity],
        "src_endpoint": _endpoint(e.src, d.get("sport")),
        "dst_endpoint": _endpoint(e.dst, e.port, e.name),
        "connection_info": _connection(e),
    }
    traffic = _traffic(e)
    if traffic:
        out["traffic"] = traffic
    if e.kind is Kind.HTTP:
        tls = d.get("tls")
        out["app_protocol_name"] = "tls" if tls in ("passthrough", "inspected") else "tcp"
    return out


def _http(e: Event, method: str) -> dict[str, Any]:
    d = e.details
    activity = HTTP_METHODS.get(method, 99)
    request: dict[str, Any] = {}
    if activity != 99:
        request["http_method"] = method
    url = _url(e)
    if url:
        request["url"] = url
    out: dict[str, Any] = {
        "class_uid": HTTP_ACTIVITY,
        "activity_id": activity,
        "activity_name": method.title() if activity == 99 else _caption(method),
        "http_request": request,
        "src_endpoint": _endpoint(e.src, d.get("sport")),
        "dst_endpoint": _endpoint(e.dst, e.port, e.name),
        "connection_info": _connection(e),
        "app_protocol_name": "https" if d.get("tls") == "inspected" else "http",
    }
    status = d.get("status")
    if isinstance(status, int):
        out["http_response"] = {"code": status}
    traffic = _traffic(e)
    if traffic:
        out["traffic"] = traffic
    return out


# -- what every record has ----------------------------------------------------------------------


def _common(e: Event, out: dict[str, Any], uid: int | str | None) -> dict[str, Any]:
    class_uid = out["class_uid"]
    action = {"allow": 1, "deny": 2}.get(e.verdict or "", 0)
    disposition = (6 if e.kind is Kind.CONN else 2) if action == 2 else action
    severity = 3 if action == 2 else 1
    metadata: dict[str, Any] = {
        "version": OCSF_VERSION,
        "product": {"name": PRODUCT, "vendor_name": PRODUCT, "version": product_version()},
        "profiles": PROFILES,
        "log_name": "events",
    }
    if uid is not None:
        metadata["uid"] = str(uid)
    if e.session:
        metadata["correlation_uid"] = e.session
    out.update(
        category_uid=CATEGORY_UID,
        category_name=CATEGORY_NAME,
        class_name=CLASS_NAMES[class_uid],
        type_uid=class_uid * 100 + out["activity_id"],
        type_name=f"{CLASS_NAMES[class_uid]}: {out['activity_name']}",
        time=round(e.ts * 1000),
        severity_id=severity,
        severity=SEVERITIES[severity],
        action_id=action,
        action=ACTIONS[action],
        disposition_id=disposition,
        disposition=DISPOSITIONS[disposition],
        metadata=metadata,
    )
    if e.count > 1:
        out["count"] = e.count
    duration = e.details.get("duration_ms")
    if isinstance(duration, (int, float)):
        out["duration"] = round(duration)
    rule = _firewall_rule(e)
    if rule:
        out["firewall_rule"] = rule
    actor = _actor(e)
    if actor:
        out["actor"] = actor
    if e.reason and e.verdict:
        out["message"] = f"{e.verdict}: {_reason_label(e.reason) or e.reason}"
    if "src_endpoint" in out and out["src_endpoint"] is None:
        del out["src_endpoint"]
    if out.get("dst_endpoint") is None:
        out.pop("dst_endpoint", None)
        if "src_endpoint" not in out:  # the class needs one endpoint: the guest's link
            out["src_endpoint"] = {"name": e.guest or "unknown"}
    out["unmapped"] = _unmapped(e)
    return out


def _endpoint(
    ip: str | None, port: object = None, hostname: str | None = None
) -> dict[str, Any] | None:
    out: dict[str, Any] = {}
    if ip:
        try:
            out["ip"] = str(ipaddress.ip_address(ip))
        except ValueError:  # not an address (a record built by hand): keep it as a name
            out["name"] = ip
    if hostname:
        out["hostname"] = hostname
    if not out:
        return None
    if isinstance(port, int) and 0 <= port <= 65535:
        out["port"] = port
    return out


def _connection(e: Event) -> dict[str, Any]:
    if e.reason == "deny.inbound":
        direction = 1
    elif e.reason == "deny.lateral":
        direction = 3
    else:
        direction = 2  # a guest reaching out: everything else the gateway judges
    out: dict[str, Any] = {"direction_id": direction, "direction": DIRECTIONS[direction]}
    if e.protocol:
        out["protocol_name"] = e.protocol
        if e.protocol in PROTOCOL_NUMBERS:
            out["protocol_num"] = PROTOCOL_NUMBERS[e.protocol]
    address = e.dst or e.src or ""
    if e.protocol not in ("arp", None) and address:
        out["protocol_ver_id"] = 6 if ":" in address else 4
    return out


def _traffic(e: Event) -> dict[str, Any]:
    d = e.details
    up, down = d.get("bytes_up"), d.get("bytes_down")
    out: dict[str, Any] = {}
    if isinstance(up, int) and isinstance(down, int):
        out = {"bytes_out": up, "bytes_in": down, "bytes": up + down}
    if e.kind is Kind.CONN:
        out["packets"] = e.count  # NFLOG folds repeats of one attempt into one event
    return out


def _url(e: Event) -> dict[str, Any]:
    scheme = "https" if e.details.get("tls") == "inspected" else "http"
    raw = e.details.get("path")
    path = _strip_query(str(raw)) if isinstance(raw, str) and raw.startswith("/") else None
    out: dict[str, Any] = {"scheme": scheme}
    if path:
        out["path"] = path
    if e.name:
        out["hostname"] = e.name
        default = 443 if scheme == "https" else 80
        port = f":{e.port}" if e.port and e.port != default else ""
        out["url_string"] = f"{scheme}://{e.name}{port}{path or '/'}"
    if e.port:
        out["port"] = e.port
    return out if ("path" in out or "url_string" in out) else {}


def _firewall_rule(e: Event) -> dict[str, Any] | None:
    if e.verdict is None or not (e.rule or e.reason):
        return None
    if e.rule:
        ref, _, label = e.rule.partition(" (")
        out = {"uid": ref, "name": label.removesuffix(")") or ref}
    else:
        out = {"uid": str(e.reason), "name": str(e.reason)}
    if e.reason:
        why = _reason_label(e.reason)
        out["desc"] = f"{e.reason}: {why}" if why else e.reason
    return out


def _actor(e: Event) -> dict[str, Any] | None:
    user = {"uid": str(e.uid)} if e.uid is not None else None
    process = e.details.get("process")
    if not isinstance(process, dict) or not isinstance(process.get("pid"), int):
        return {"user": user} if user else None
    cmdline = [str(a) for a in process.get("cmdline") or []]
    exe = process.get("exe")
    proc: dict[str, Any] = {"pid": process["pid"]}
    name = (cmdline[0] if cmdline else str(exe or "")).rsplit("/", 1)[-1]
    if name:
        proc["name"] = name
    if cmdline:
        proc["cmd_line"] = shlex.join(redact_arg(a) for a in cmdline)
    if user:
        proc["user"] = user
    chain = process.get("chain") or []
    if len(chain) > 1 and isinstance(chain[1], list) and isinstance(chain[1][0], int):
        proc["parent_process"] = {"pid": chain[1][0], "name": str(chain[1][1])}
    return {"process": proc, **({"user": user} if user else {})}


def _unmapped(e: Event) -> dict[str, Any]:
    out: dict[str, Any] = {"kind": str(e.kind)}
    for key in ("session", "guest", "verdict", "reason", "rule", "category"):
        value = getattr(e, key)
        if value is not None:
            out[key] = value
    for key in ("door", "tls", "cached", "inferred", "would_be", "site", "note", "credentials"):
        if key in e.details:
            out[key] = e.details[key]
    process = e.details.get("process")
    if isinstance(process, dict) and process.get("role"):
        out["process_role"] = process["role"]  # framework or tool (procattr)
    return out


# -- small pieces -------------------------------------------------------------------------------


def rcode_id(rcode: int) -> int:
    """DNS Activity's rcode_id for a wire rcode: RFC 6895's numbers, unassigned and reserved
    ranges folded into 24 and 25."""
    if rcode in RCODES and rcode < 24:
        return rcode
    if 3841 <= rcode <= 4095 or rcode == 65535:
        return 25
    return 24


def _strip_query(path: str) -> str:
    return path.partition("#")[0].partition("?")[0]


def _caption(method: str) -> str:
    return method.capitalize()


@cache
def _reason_labels() -> dict[str, str]:
    from sandgate.policy.classify import AddressClass
    from sandgate.policy.decide import Reason

    labels = {r.key: r.label for r in Reason}
    for cls in AddressClass:
        labels.setdefault(f"deny.{cls.value}", cls.label)
    return labels


def _reason_label(key: str) -> str | None:
    return _reason_labels().get(key)


@cache
def product_version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(PRODUCT)
    except PackageNotFoundError:
        return "unknown"


__all__ = [
    "OCSF_VERSION",
    "SKIPPED_KINDS",
    "product_version",
    "rcode_id",
    "record",
    "redact_arg",
    "write_jsonl",
]
