"""A profile as a CiliumNetworkPolicy (cilium.io/v2), for Cilium 1.16 and later.

The address-level part is ``decide()`` laid over the IPv4 space (export/space.py): every cell it
refuses whatever the name becomes ``egressDeny`` (deny wins in Cilium, so an exempted address, the
model server, is an ``except`` of the special-purpose deny and is refused again on the ports its
rule does not name); every cell it allows becomes ``egress`` ``toCIDRSet``. IPv6 is refused whole
(``::/0``): the gateway routes IPv4 only. Names: a DNS rule to kube-dns lists what may resolve, so
Cilium's DNS proxy refuses the rest as sandgate's resolver does; in allowlist mode each allowed name
is a ``toFQDNs`` rule on its ports (``serverNames`` pins the TLS name on a 443-only rule, against
shared addresses); locked mode lets names resolve and opens nothing by name; open mode lets every
name resolve and opens the public IPv4 space by address.

Cilium 1.16's ``*.example.com`` matches one label and never the apex; sandgate's matches any depth
(``**.`` exists only from Cilium 1.19), so a wildcard is exported narrowed, with a warning. Domain
deny rules have no counterpart (``EgressDenyRule`` has no ``toFQDNs``): an allow rule they cut into
loses the denied ports, or is left out, and where even that cannot keep the deny (open mode) the
export says it widens. See export/unexpressed.py and docs/cilium.md.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from sandgate.export import space
from sandgate.export.unexpressed import Unexpressed, at_key, at_rule
from sandgate.policy.load import Policy
from sandgate.policy.locate import find
from sandgate.policy.model import Mode, Protocol
from sandgate.policy.patterns import DomainPattern
from sandgate.policy.profile import Profile, Rule

Json = dict[str, Any]

TARGET = "1.16"  # the Cilium release whose CRD and wildcard rules the export follows
KUBE_DNS: Json = {
    "matchLabels": {"k8s:io.kubernetes.pod.namespace": "kube-system", "k8s:k8s-app": "kube-dns"}
}
# Cilium's toPorts cannot match ICMP; icmps lists types, at most 40 to a rule: all 256 types.
ICMP_ALL: list[Json] = [
    {"fields": [{"type": t} for t in range(start, min(start + 40, 256))]}
    for start in range(0, 256, 40)
]
MAX_PORTS = 40  # PortRule.ports maxItems in the CRD
PROFILE_LABEL = "sandgate.io/profile"


@dataclass(frozen=True)
class NameRule:
    """An allowed name as exported: its rule and the port cells left after domain denies."""

    rule: Rule
    ports: space.PortSet

    @property
    def pattern(self) -> DomainPattern:
        assert self.rule.spec.pattern is not None
        return self.rule.spec.pattern


@dataclass(frozen=True)
class Export:
    document: Json
    warnings: tuple[Unexpressed, ...]
    # What each egress entry stands for: "dns", "addresses" or the rule reference (for tests
    # and for people reading a diff).
    egress_refs: tuple[str, ...] = field(default=())


def selector_of(text: str | None, profile: str) -> Json:
    """``key=value[,key=value]`` as matchLabels; default ``sandgate.io/profile=<profile>``."""
    if not text:
        return {"matchLabels": {PROFILE_LABEL: profile}}
    labels = {}
    for item in text.split(","):
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise ValueError(f"selector {text!r}: write key=value[,key=value]")
        labels[key.strip()] = value.strip()
    return {"matchLabels": labels}


def resource_name(profile: str) -> str:
    """A DNS-1123 name for the policy object."""
    return "sandgate-" + (re.sub(r"[^a-z0-9-]+", "-", profile.lower()).strip("-") or "profile")


def dns_selector(pattern: DomainPattern) -> Json:
    return (
        {"matchPattern": f"*.{pattern.base}"} if pattern.wildcard else {"matchName": pattern.base}
    )


def l4(cells: space.PortSet) -> list[Json]:
    """Port cells as the parts of a rule that say them: [{}] for everything, else toPorts
    (TCP/UDP ranges, 40 to a PortRule) and/or icmps (every type)."""
    if cells == space.full_ports():
        return [{}]
    ports = [
        {"port": str(lo), **({"endPort": hi} if hi > lo else {}), "protocol": proto.value.upper()}
        for proto, lo, hi in sorted(cells)
        if proto is not Protocol.ICMP
    ]
    out: list[Json] = []
    if ports:
        chunks = [ports[i : i + MAX_PORTS] for i in range(0, len(ports), MAX_PORTS)]
        out.append({"toPorts": [{"ports": c} for c in chunks]})
    if space.ICMP_CELL in cells:
        out.append({"icmps": ICMP_ALL})
    return out


def cidr_set(nets: list[space.Net4], profile: Profile) -> list[Json]:
    return [
        {"cidr": str(net), **({"except": [str(h) for h in holes]} if holes else {})}
        for net, holes in space.cidr_rules(nets, profile.public_override)
    ]


def _overlap(a: DomainPattern, b: DomainPattern) -> bool:
    """Is some name matched by both patterns?"""
    return a.covers(b) or b.covers(a)


def name_rules(
    policy: Policy, profile: Profile, address_allows: bool = False
) -> tuple[list[NameRule], list[Unexpressed]]:
    """Allowed names after the profile's domain deny rules, which Cilium cannot say: a deny that
    covers an allow rule whole is kept exactly (the allow loses the denied ports, or goes); one
    that covers only part of it narrows the whole allow rule, with a warning. Where addresses
    are allowed by address (host and cidr rules, exemptions), a name resolving there is allowed
    whatever a domain deny says: that widens, and is said too."""
    rules = [NameRule(r, space.rule_ports(r.spec)) for r in profile.allow if r.spec.pattern]
    warnings: list[Unexpressed] = []
    for deny in profile.deny:
        dpat = deny.spec.pattern
        if dpat is None:
            continue
        if profile.mode is Mode.OPEN:
            warnings.append(
                at_rule(
                    policy, deny.ref, "domain-deny", "widened",
                    f"Cilium cannot refuse the name {dpat} (egressDeny has no toFQDNs) and open "
                    "mode allows every public address: it stays reachable and resolvable",
                )
            )  # fmt: skip
            continue
        if address_allows:
            warnings.append(
                at_rule(
                    policy, deny.ref, "domain-deny", "widened",
                    f"Cilium cannot refuse the name {dpat} at addresses this profile allows by "
                    "host or cidr rule: if it resolves there, it is reached",
                )
            )  # fmt: skip
        kept: list[NameRule] = []
        for nr in rules:
            if not _overlap(dpat, nr.pattern):
                kept.append(nr)
                continue
            exact = dpat.covers(nr.pattern)
            if deny.whole:
                if not exact:
                    warnings.append(
                        at_rule(
                            policy, deny.ref, "domain-deny", "narrowed",
                            f"Cilium cannot refuse {dpat} inside {nr.pattern} ({nr.rule.ref}): "
                            f"{nr.pattern} is left out of the export",
                        )
                    )  # fmt: skip
                continue
            kept.append(NameRule(nr.rule, space.minus(nr.ports, space.rule_ports(deny.spec))))
            if not exact and profile.mode is Mode.ALLOWLIST:
                warnings.append(
                    at_rule(
                        policy, deny.ref, "domain-deny", "narrowed",
                        f"Cilium cannot refuse {deny.spec.target_text()} for {dpat} alone: every "
                        f"name of {nr.pattern} ({nr.rule.ref}) loses those ports",
                    )
                )  # fmt: skip
        rules = kept
    return rules, warnings


def _gateway_features(policy: Policy, profile: Profile) -> list[Unexpressed]:
    spec = policy.file.profiles[profile.name]
    found = []
    if spec.inspect:
        found.append(
            at_key(
                policy, profile.name, "inspect", "inspect", "dropped",
                "TLS inspection is the gateway's: Cilium passes these names through unread",
            )
        )  # fmt: skip
    if spec.secret:
        found.append(
            at_key(
                policy, profile.name, "secret", "credentials", "dropped",
                "placeholder credentials need the gateway's proxy: a pod would need the real "
                "secret, which sandgate never hands out",
            )
        )  # fmt: skip
    if spec.front:
        found.append(
            at_key(
                policy, profile.name, "front", "front", "dropped",
                "fronts are served by the gateway itself; the export has no gateway",
            )
        )  # fmt: skip
    for rule in profile.host_loopback():
        found.append(
            at_rule(
                policy, rule.ref, "host-loopback", "dropped",
                "a port of the gateway host's own loopback is relayed by the gateway; a pod "
                "has no such host",
            )
        )  # fmt: skip
    for e in profile.expose:
        pos = find(policy.positions, ("expose", int(e.ref.removeprefix("expose[")[:-1])))
        found.append(
            Unexpressed(
                "expose", "dropped",
                f"{e} forwards through the gateway's uplink; use a Service (and an ingress "
                "policy) for the pod",
                None, policy.source, pos[0] if pos else None,
            )
        )  # fmt: skip
    for rule in profile.allow:  # issue 14: request and process rules are the proxy's
        if rule.spec.http is not None:
            found.append(
                at_rule(
                    policy, rule.ref, "request-rules", "widened",
                    "request rules (http) are judged by the gateway's proxy: the export "
                    "allows every request to this destination",
                )
            )  # fmt: skip
        if rule.spec.process is not None:
            found.append(
                at_rule(
                    policy, rule.ref, "process-rules", "widened",
                    "process rules are matched by the gateway's proxy: the export allows "
                    "every program of the pod",
                )
            )  # fmt: skip
    if ("profiles", profile.name, "tunnels") in policy.positions:
        found.append(
            at_key(
                policy, profile.name, "tunnels", "tunnel-limits", "dropped",
                "per-tunnel idle, time and byte caps are the proxy's; Cilium has none",
            )
        )  # fmt: skip
    return found


def export_profile(
    policy: Policy,
    name: str,
    *,
    namespace: str | None = None,
    selector: str | None = None,
) -> Export:
    """The CiliumNetworkPolicy for profile ``name`` and what it cannot say."""
    profile = policy.profile(name)
    plan = space.plan(profile)
    names, warnings = name_rules(policy, profile, bool(plan.allow))
    warnings += _gateway_features(policy, profile)

    egress: list[Json] = []
    refs: list[str] = []
    dns: list[Json] = []
    if profile.mode is Mode.OPEN:
        dns = [{"matchPattern": "*"}]
    else:
        for nr in names:
            if dns_selector(nr.pattern) not in dns:
                dns.append(dns_selector(nr.pattern))
    for nr in names:
        if nr.pattern.wildcard and profile.mode is not Mode.OPEN:
            warnings.append(
                at_rule(
                    policy, nr.rule.ref, "wildcard-depth", "narrowed",
                    f"Cilium {TARGET} matches *.{nr.pattern.base} one label deep: deeper names "
                    "are refused (** patterns only from Cilium 1.19)",
                )
            )  # fmt: skip
    if dns:
        egress.append(
            {
                "toEndpoints": [KUBE_DNS],
                "toPorts": [{"ports": [{"port": "53", "protocol": "ANY"}], "rules": {"dns": dns}}],
            }
        )
        refs.append("dns")
    for cells, nets in sorted(plan.allow.items(), key=lambda kv: sorted(kv[0])):
        for part in l4(cells):
            egress.append({"toCIDRSet": cidr_set(nets, profile), **part})
            refs.append("addresses")
    if profile.mode is Mode.ALLOWLIST:
        for nr in names:
            if not nr.ports:
                continue
            sel = [dns_selector(nr.pattern)]
            tls_only = nr.ports == frozenset({(Protocol.TCP, 443, 443)})
            if tls_only and not nr.pattern.wildcard:
                # The TLS name must be this one: an address shared with another name opens
                # nothing else (cilium/cilium#31803).
                tls: Json = {
                    "toPorts": [
                        {
                            "ports": [{"port": "443", "protocol": "TCP"}],
                            "serverNames": [nr.pattern.base],
                        }
                    ]
                }
                egress.append({"toFQDNs": sel, **tls})
                refs.append(nr.rule.ref)
            else:
                for part in l4(nr.ports):
                    egress.append({"toFQDNs": sel, **part})
                    refs.append(nr.rule.ref)
            warnings.append(
                at_rule(
                    policy, nr.rule.ref, "fqdn-ip-limit", "narrowed",
                    "Cilium keeps a bounded number of addresses per name (50 by default, "
                    "--tofqdns-endpoint-max-ip-per-hostname): older ones are refused",
                )
            )  # fmt: skip

    deny: list[Json] = [{"toCIDRSet": [{"cidr": "::/0"}]}]  # IPv4 only, as the gateway
    for cells, nets in sorted(plan.deny.items(), key=lambda kv: sorted(kv[0])):
        for part in l4(cells):
            deny.append({"toCIDRSet": cidr_set(nets, profile), **part})

    spec = policy.file.profiles[profile.name]
    metadata: Json = {
        "name": resource_name(profile.name),
        "labels": {"app.kubernetes.io/managed-by": "sandgate", PROFILE_LABEL: profile.name},
        "annotations": {
            "sandgate.io/source": policy.source,
            "sandgate.io/cilium-version": f">={TARGET}",
        },
    }
    if namespace:
        metadata["namespace"] = namespace
    document: Json = {
        "apiVersion": "cilium.io/v2",
        "kind": "CiliumNetworkPolicy",
        "metadata": metadata,
        "spec": {
            "description": spec.description or f"sandgate profile {profile.name}",
            "endpointSelector": selector_of(selector, profile.name),
            # Egress is default-deny even if another policy has no egress rules; ingress is
            # not this policy's business.
            "enableDefaultDeny": {"egress": True, "ingress": False},
            "egress": egress,
            "egressDeny": deny,
        },
    }
    warnings.sort(key=lambda w: (w.line or 0, w.feature))
    return Export(document, tuple(warnings), tuple(refs))


__all__ = [
    "ICMP_ALL", "KUBE_DNS", "TARGET", "Export", "NameRule", "cidr_set", "dns_selector",
    "export_profile", "l4", "name_rules", "resource_name", "selector_of",
]  # fmt: skip
