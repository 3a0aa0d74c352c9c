"""Every file a gateway VM and its hypervisor need, from the one policy (issue 10, part 2).

``export_files`` returns ``{relative path: bytes}``; the same policy gives the same bytes (no
dates, no paths of the machine that exported, JSON in the compiler's order). The files, in
the order report 001 applies them (the Ansible playbook follows it):

hypervisor: the host-drop table (its own ``table inet``; nothing delivered to the host from
the agents' bridges, nothing else flushed) and its unit; one ``bridge-ports none`` bridge per
guest with IPv6 off and ``arp_ignore=8`` (ifupdown, Proxmox/Debian).
gateway VM: sysctls with forwarding *off* at boot; the nftables ruleset (made by the daemon's
own compiler, net/handed.py) loaded by ``sandgate-rules.service`` before the network; then
``sandgate-forwarding.service`` switches forwarding on; then ``sandgate-gateway.service``
runs the daemon. The ruleset forwards nothing until a live daemon vouches for its links.
"""

from __future__ import annotations

import json
import shlex
from dataclasses import dataclass

import sandgate.net.handed as hd
from sandgate.policy.load import Policy

ETC = "/etc/sandgate"
POLICY = f"{ETC}/policy.toml"
RULESET = f"{ETC}/sandgate.nft.json"
FORWARDING = f"{ETC}/forwarding.conf"
HOST_DROP = "/etc/nftables.d/sandgate-host-drop.nft"
HOST_DROP_TABLE = "sandgate_host_drop"
SANDGATE_BIN = "/usr/local/bin/sandgate"
NFT = "/usr/sbin/nft"
SYSCTL = "/usr/sbin/sysctl"


@dataclass(frozen=True)
class GatewayVm:
    files: dict[str, bytes]  # relative to the output directory


def export_files(
    policy: Policy, policy_bytes: bytes, links: hd.Handed, sandgate_bin: str = SANDGATE_BIN
) -> GatewayVm:
    """All files, keyed by their path under the output directory."""
    files: dict[str, str] = {
        "gateway/etc/sandgate/sandgate.nft.json": _ruleset(links, policy),
        "gateway/etc/sysctl.d/90-sandgate.conf": _sysctl(links),
        "gateway/etc/sandgate/forwarding.conf": _forwarding(),
        "gateway/etc/systemd/system/sandgate-rules.service": _rules_unit(),
        "gateway/etc/systemd/system/sandgate-forwarding.service": _forwarding_unit(),
        "gateway/etc/systemd/system/sandgate-gateway.service": _gateway_unit(links, sandgate_bin),
        "hypervisor/etc/network/interfaces.d/sandgate": _bridges(links),
        "hypervisor/etc/nftables.d/sandgate-host-drop.nft": _host_drop(links),
        "hypervisor/etc/systemd/system/sandgate-host-drop.service": _host_drop_unit(),
        "ansible/playbook.yml": _playbook(links, policy),
        "ansible/inventory.ini.example": _inventory(),
        "README.md": _readme(links, policy, sandgate_bin),
    }
    out = {k: v.encode() for k, v in files.items()}
    out["gateway/etc/sandgate/policy.toml"] = policy_bytes
    return GatewayVm(dict(sorted(out.items())))


def gateway_command(links: hd.Handed, sandgate_bin: str = SANDGATE_BIN) -> list[str]:
    """The daemon's command line in ``sandgate-gateway.service`` (the test world runs it)."""
    cmd = [sandgate_bin, "gateway", "--policy", POLICY, "--uplink", links.uplink]
    for g in links.guests:
        cmd += ["--guest", f"{g.ifname}={g.profile}"]
    return cmd


def _ruleset(links: hd.Handed, policy: Policy) -> str:
    doc = {"nftables": [{"metainfo": {"json_schema_version": 1}}, *hd.ruleset(links, policy)]}
    return json.dumps(doc, indent=1) + "\n"


def _sysctl(links: hd.Handed) -> str:
    lines = [
        "# sandgate gateway VM: hardening, loaded at boot by systemd-sysctl (and for each link",
        "# when it appears). Forwarding stays OFF here: sandgate-forwarding.service switches it",
        "# on only after sandgate-rules.service has loaded the ruleset.",
        "net.ipv4.ip_forward = 0",
    ]
    lines += [f"{k} = {v}" for k, v in hd.sysctls(links).items()]
    return "\n".join(lines) + "\n"


def _forwarding() -> str:
    return (
        "# Applied by sandgate-forwarding.service only (sysctl -p), after the ruleset is in\n"
        "# force; not a sysctl.d file, so boot never switches it on early.\n"
        "net.ipv4.ip_forward = 1\n"
    )


def _rules_unit() -> str:
    return f"""[Unit]
Description=sandgate: the gateway's nftables ruleset, before any network or forwarding
Documentation=file://{ETC}/README.md
DefaultDependencies=no
Wants=network-pre.target
Before=network-pre.target shutdown.target sandgate-forwarding.service sandgate-gateway.service
After=local-fs.target
Conflicts=shutdown.target

[Service]
Type=oneshot
RemainAfterExit=yes
ExecStart={NFT} -j -f {RULESET}

[Install]
WantedBy=sysinit.target
"""


def _forwarding_unit() -> str:
    return f"""[Unit]
Description=sandgate: IPv4 forwarding on, only once the ruleset is in force
Requires=sandgate-rules.service
After=sandgate-rules.service
Before=sandgate-gateway.service

[Service]
Type=oneshot
RemainAfterExit=yes
ExecStart={SYSCTL} -q -p {FORWARDING}
ExecStop={SYSCTL} -q -w net.ipv4.ip_forward=0

[Install]
WantedBy=multi-user.target
"""


def _gateway_unit(links: hd.Handed, sandgate_bin: str) -> str:
    cmd = shlex.join(gateway_command(links, sandgate_bin))
    return f"""[Unit]
Description=sandgate gateway: resolver, proxy and logs on handed links
Requires=sandgate-rules.service
Wants=sandgate-forwarding.service network-online.target
After=sandgate-rules.service sandgate-forwarding.service network-online.target

[Service]
Type=simple
ExecStart={cmd}
Restart=always
RestartSec=1

[Install]
WantedBy=multi-user.target
"""


def _bridges(links: hd.Handed) -> str:
    out = [
        "# sandgate: one private bridge per agent VM. No physical port, no host address, IPv6",
        "# off, never answers ARP: the hypervisor is not on the agents' network. Give the agent",
        "# VM one NIC on its bridge and the gateway VM its ethN on the same bridge.",
    ]
    for g in links.guests:
        b = g.bridge
        out += [
            "",
            f"# {g.ifname} of the gateway VM <-> the {g.profile} guest",
            f"auto {b}",
            f"iface {b} inet manual",
            "\tbridge-ports none",
            "\tbridge-stp off",
            "\tbridge-fd 0",
            f"\tpost-up {SYSCTL} -q -w net.ipv6.conf.{b}.disable_ipv6=1",
            f"\tpost-up {SYSCTL} -q -w net.ipv4.conf.{b}.arp_ignore=8",
        ]
    return "\n".join(out) + "\n"


def _host_drop(links: hd.Handed) -> str:
    bridges = ", ".join(f'"{g.bridge}"' for g in links.guests)
    routed = "\n".join(
        f'\t\tiifname "{g.bridge}" oifname != "{g.bridge}" counter drop' for g in links.guests
    )
    return f"""#!{NFT} -f
# sandgate on the hypervisor: nothing from the agents' bridges is delivered to the host itself
# (IPv4, IPv6 link-local, anything) or routed through it. Its own table: loading it replaces
# this table only and flushes nothing else.
table inet {HOST_DROP_TABLE}
delete table inet {HOST_DROP_TABLE}
table inet {HOST_DROP_TABLE} {{
\tchain input {{
\t\ttype filter hook input priority filter - 10; policy accept;
\t\tiifname {{ {bridges} }} counter drop
\t}}
\tchain forward {{
\t\ttype filter hook forward priority filter - 10; policy accept;
{routed}
\t}}
}}
"""


def _host_drop_unit() -> str:
    return f"""[Unit]
Description=sandgate: the hypervisor drops what the agents' bridges deliver to it
DefaultDependencies=no
Wants=network-pre.target
Before=network-pre.target shutdown.target
After=local-fs.target
Conflicts=shutdown.target

[Service]
Type=oneshot
RemainAfterExit=yes
ExecStart={NFT} -f {HOST_DROP}

[Install]
WantedBy=sysinit.target
"""


def _playbook(links: hd.Handed, policy: Policy) -> str:
    pool = policy.file.gateway.pool
    addresses = [str(link.gateway) for link in links.links(pool)]
    bridges = [g.bridge for g in links.guests]
    gw = "../gateway/etc"
    hv = "../hypervisor/etc"
    return f"""# sandgate: apply the exported files in report 001's order. Hypervisor first (its
# drop table, then the bridges), then the gateway VM: sysctls with forwarding off, the ruleset,
# forwarding on, the daemon; then assert the resolver listens on the guest links only.
# ansible-playbook -i inventory.ini playbook.yml
- name: hypervisor - agents' bridges reach nothing of the host
  hosts: hypervisor
  become: true
  tasks:
    - name: host-drop table
      ansible.builtin.copy:
        src: {hv}/nftables.d/sandgate-host-drop.nft
        dest: {HOST_DROP}
        mode: "0644"
    - name: host-drop unit
      ansible.builtin.copy:
        src: {hv}/systemd/system/sandgate-host-drop.service
        dest: /etc/systemd/system/sandgate-host-drop.service
        mode: "0644"
    - name: host-drop table loaded, and at every boot
      ansible.builtin.systemd:
        name: sandgate-host-drop.service
        enabled: true
        state: restarted
        daemon_reload: true
    - name: one private bridge per agent VM
      ansible.builtin.copy:
        src: {hv}/network/interfaces.d/sandgate
        dest: /etc/network/interfaces.d/sandgate
        mode: "0644"
    - name: bridges up
      ansible.builtin.command: ifup {" ".join(bridges)}
      changed_when: true
    - name: assert no bridge has an address or IPv6
      ansible.builtin.shell: |
        set -e
        for b in {" ".join(bridges)}; do
          test -z "$(ip -o addr show dev "$b")"
          test "$(cat /proc/sys/net/ipv6/conf/$b/disable_ipv6)" = 1
          test "$(cat /proc/sys/net/ipv4/conf/$b/arp_ignore)" = 8
        done
      changed_when: false

- name: gateway VM - rules before forwarding, then the daemon
  hosts: gateway
  become: true
  tasks:
    - name: sandgate is installed
      ansible.builtin.command: {SANDGATE_BIN} --help
      changed_when: false
    - name: configuration directory
      ansible.builtin.file:
        path: {ETC}
        state: directory
        mode: "0755"
    - name: policy, ruleset, forwarding switch
      ansible.builtin.copy:
        src: "{gw}/sandgate/{{{{ item }}}}"
        dest: "{ETC}/{{{{ item }}}}"
        mode: "0644"
      loop: [policy.toml, sandgate.nft.json, forwarding.conf]
    - name: sysctls (forwarding off at boot)
      ansible.builtin.copy:
        src: {gw}/sysctl.d/90-sandgate.conf
        dest: /etc/sysctl.d/90-sandgate.conf
        mode: "0644"
    - name: sysctls applied now
      ansible.builtin.command: {SYSCTL} -q -p /etc/sysctl.d/90-sandgate.conf
      changed_when: true
    - name: units
      ansible.builtin.copy:
        src: "{gw}/systemd/system/{{{{ item }}}}"
        dest: "/etc/systemd/system/{{{{ item }}}}"
        mode: "0644"
      loop: [sandgate-rules.service, sandgate-forwarding.service, sandgate-gateway.service]
    - name: the ruleset first
      ansible.builtin.systemd:
        name: sandgate-rules.service
        enabled: true
        state: restarted
        daemon_reload: true
    - name: then forwarding
      ansible.builtin.systemd:
        name: sandgate-forwarding.service
        enabled: true
        state: started
    - name: then the daemon
      ansible.builtin.systemd:
        name: sandgate-gateway.service
        enabled: true
        state: restarted
    - name: assert the resolver listens on the guest links only
      ansible.builtin.shell: |
        sleep 3
        ss -Hlnu 'sport = :53' | awk '{{print $4}}' | sed 's/:53$//' | sort -u
      register: dns
      changed_when: false
    - name: resolver addresses
      ansible.builtin.assert:
        that:
          - dns.stdout_lines | length > 0
          - dns.stdout_lines | difference({json.dumps(addresses)}) | length == 0
        fail_msg: "the resolver listens beyond the guest links: {{{{ dns.stdout_lines }}}}"
"""


def _files(cmd: str) -> list[tuple[str, str]]:
    """Each file and what it is, in the order the playbook applies them."""
    hv, gw = "hypervisor/etc", "gateway/etc"
    return [
        (
            f"{hv}/nftables.d/sandgate-host-drop.nft",
            f"table `inet {HOST_DROP_TABLE}`: drops everything the agents' bridges deliver to "
            "the hypervisor or route through it; loading it replaces only itself",
        ),
        (f"{hv}/systemd/system/sandgate-host-drop.service", "loads it at boot, before the network"),
        (
            f"{hv}/network/interfaces.d/sandgate",
            "one `bridge-ports none`, `inet manual` bridge per guest; `post-up` IPv6 off and "
            "`arp_ignore=8`",
        ),
        (
            f"{gw}/sysctl.d/90-sandgate.conf",
            "rp_filter, IPv6 off, ARP and redirect hardening; forwarding OFF at boot",
        ),
        (
            f"{gw}/sandgate/sandgate.nft.json",
            "the gateway's whole nftables ruleset, made by the daemon's own compiler (JSON: "
            "`nft -j -f`, check with `nft -c -j -f`); it forwards nothing until the daemon "
            "vouches for its links",
        ),
        (
            f"{gw}/systemd/system/sandgate-rules.service",
            "loads the ruleset, before the network and before forwarding",
        ),
        (f"{gw}/sandgate/forwarding.conf", "`net.ipv4.ip_forward = 1`, applied by the next unit"),
        (
            f"{gw}/systemd/system/sandgate-forwarding.service",
            "forwarding on, only after the rules (`Requires=`, `After=`)",
        ),
        (f"{gw}/systemd/system/sandgate-gateway.service", f"the daemon: `{cmd}`"),
        (f"{gw}/sandgate/policy.toml", "the policy, as exported"),
        (
            "ansible/playbook.yml, ansible/inventory.ini.example",
            "applies all of it in this order; asserts the resolver listens on guest links only",
        ),
    ]


def _inventory() -> str:
    return (
        "# Copy to inventory.ini and name your machines.\n"
        "[hypervisor]\npve.lan\n\n[gateway]\nllm-gw.lan\n"
    )


def _readme(links: hd.Handed, policy: Policy, sandgate_bin: str) -> str:
    pool = policy.file.gateway.pool
    rows = []
    for g, link in zip(links.guests, links.links(pool), strict=True):
        rows.append(f"| {g.ifname} | {g.bridge} | {g.profile} | {link.guest}/30 | {link.gateway} |")
    table = "\n".join(rows)
    cmd = shlex.join(gateway_command(links, sandgate_bin))
    files = "\n".join(
        ["| file | what it is |", "| --- | --- |"]
        + [f"| `{f}` | {what} |" for f, what in _files(cmd)]
    )
    return f"""# sandgate gateway VM: exported files

Written by `sandgate export gateway-vm` from `gateway/etc/sandgate/policy.toml`. Re-export
after changing the policy and review the result as a git diff; an unchanged policy gives
byte-identical files.

## Guests (one per link; static addresses from the pool {pool})

| gateway link | hypervisor bridge | profile | guest address | gateway and DNS |
| --- | --- | --- | --- | --- |
{table}

Uplink: `{links.uplink}` (its address is the VM's own network configuration's; traffic from
the guests leaves it masqueraded).

## Files, in the order they are applied (ansible/playbook.yml)

{files}

## Fail closed

The daemon refreshes the ruleset's `alive` set every {hd.HEARTBEAT:g} s with a {hd.ALIVE_FOR} s
timeout. If it dies, the elements expire and the kernel forwards nothing more (the rule
`iifname != @alive drop` needs no daemon) until it is back.
"""


__all__ = ["GatewayVm", "export_files", "gateway_command"]
