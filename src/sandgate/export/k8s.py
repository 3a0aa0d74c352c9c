"""A profile as a plain Kubernetes NetworkPolicy (networking.k8s.io/v1): CIDRs only.

NetworkPolicy can only allow, so only what ``decide()`` allows by address is written (export/
space.py: exemptions, host and cidr rules, open mode's public space less every refused cell);
everything else is refused by the policy's default deny. Names cannot be said at all: allowed
names are dropped (narrowed), and DNS to kube-dns is opened unfiltered when the profile lets any
name resolve (widened: every name resolves). ICMP is allowed only where every port is.
"""

from __future__ import annotations

from sandgate.export import space
from sandgate.export.cilium import PROFILE_LABEL, Export, Json, _gateway_features, resource_name
from sandgate.export.unexpressed import Unexpressed, at_rule
from sandgate.policy.load import Policy
from sandgate.policy.model import Mode, Protocol

KUBE_DNS_PEER: Json = {
    "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "kube-system"}},
    "podSelector": {"matchLabels": {"k8s-app": "kube-dns"}},
}


def _ports(cells: space.PortSet) -> list[Json] | None:
    if cells == space.full_ports():
        return None
    return [
        {"protocol": proto.value.upper(), "port": lo, **({"endPort": hi} if hi > lo else {})}
        for proto, lo, hi in sorted(cells)
        if proto is not Protocol.ICMP
    ]


def export_profile(
    policy: Policy, name: str, *, namespace: str | None = None, selector: str | None = None
) -> Export:
    from sandgate.export.cilium import selector_of

    profile = policy.profile(name)
    plan = space.plan(profile)
    warnings: list[Unexpressed] = _gateway_features(policy, profile)
    egress: list[Json] = []
    refs: list[str] = []
    names = [r for r in profile.allow if r.spec.pattern is not None]
    if names or profile.mode is Mode.OPEN:
        egress.append(
            {
                "to": [KUBE_DNS_PEER],
                "ports": [{"protocol": "UDP", "port": 53}, {"protocol": "TCP", "port": 53}],
            }
        )
        refs.append("dns")
        first = names[0].ref if names else None
        warnings.append(
            Unexpressed(
                "dns-visibility", "widened",
                "NetworkPolicy cannot filter DNS by name: kube-dns answers every name",
                first, *(_line(policy, first)),
            )
        )  # fmt: skip
    for rule in names if profile.mode is not Mode.OPEN else ():
        if profile.mode is Mode.ALLOWLIST:
            warnings.append(
                at_rule(
                    policy, rule.ref, "names", "narrowed",
                    f"NetworkPolicy has no names: {rule.label} is not allowed by the export",
                )
            )  # fmt: skip
    for rule in profile.deny:
        if rule.spec.pattern is not None and profile.mode is Mode.OPEN:
            warnings.append(
                at_rule(
                    policy, rule.ref, "domain-deny", "widened",
                    f"NetworkPolicy has no names and no deny: {rule.label} stays reachable",
                )
            )  # fmt: skip
    for cells, nets in sorted(plan.allow.items(), key=lambda kv: sorted(kv[0])):
        from sandgate.export.cilium import cidr_set

        peer = [{"ipBlock": b} for b in cidr_set(nets, profile)]
        ports = _ports(cells)
        if ports == []:
            continue  # ICMP alone: NetworkPolicy cannot say it (narrowed, safe)
        egress.append({"to": peer, **({"ports": ports} if ports is not None else {})})
        refs.append("addresses")
    metadata: Json = {
        "name": resource_name(profile.name),
        "labels": {"app.kubernetes.io/managed-by": "sandgate", PROFILE_LABEL: profile.name},
    }
    if namespace:
        metadata["namespace"] = namespace
    document: Json = {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": metadata,
        "spec": {
            "podSelector": selector_of(selector, profile.name),
            "policyTypes": ["Egress"],
            "egress": egress,
        },
    }
    warnings.sort(key=lambda w: (w.line or 0, w.feature))
    return Export(document, tuple(warnings), tuple(refs))


def _line(policy: Policy, ref: str | None) -> tuple[str, int | None]:
    if ref is None:
        return policy.source, None
    stub = policy._where(ref)
    return stub.file, stub.line


__all__ = ["KUBE_DNS_PEER", "export_profile"]
