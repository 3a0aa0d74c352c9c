"""export gateway-vm (issue 10): every file from the one policy, byte-identical on re-export,
the ruleset the daemon's own compiler makes, units ordered rules → forwarding → daemon."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from sandgate.cli import app
from sandgate.errors import SandgateError
from sandgate.export.gatewayvm import export_files, gateway_command
from sandgate.net import handed as hd
from sandgate.policy.load import load_policy

HOMELAB = Path(__file__).parents[2] / "examples" / "homelab.toml"


def _export() -> dict[str, bytes]:
    pol = load_policy(str(HOMELAB))
    return export_files(pol, HOMELAB.read_bytes(), hd.handed_from(pol, None, [])).files


def test_every_file_and_byte_identical_again(tmp_path: Path) -> None:
    runner = CliRunner()
    for out in ("a", "b"):
        res = runner.invoke(
            app, ["export", "gateway-vm", "--policy", str(HOMELAB), "--out", str(tmp_path / out)]
        )
        assert res.exit_code == 0, res.output
    a, b = (
        {p.relative_to(d): p.read_bytes() for p in d.rglob("*") if p.is_file()}
        for d in (tmp_path / "a", tmp_path / "b")
    )
    assert a == b and len(a) >= 12
    assert (tmp_path / "a/gateway/etc/sandgate/policy.toml").read_bytes() == HOMELAB.read_bytes()
    readme = (tmp_path / "a/README.md").read_text()
    for rel in _export():
        if not rel.startswith("ansible/") and rel != "README.md":
            assert rel in readme, f"the README does not say what {rel} is"


def test_ruleset_is_the_daemons_compiler_output() -> None:
    pol = load_policy(str(HOMELAB))
    links = hd.handed_from(pol, None, [])
    doc = json.loads(_export()["gateway/etc/sandgate/sandgate.nft.json"])
    assert doc["nftables"][1:] == hd.ruleset(links, pol)
    cmds = json.dumps(doc)
    # The guest links by name (not the daemon's own g*), each with its ingress chain; the fence.
    assert '"dev": "eth1"' in cmds and '"dev": "eth2"' in cmds and '"g*"' not in cmds
    forward = [
        c["add"]["rule"]["expr"]
        for c in doc["nftables"][1:]
        if "rule" in c.get("add", {}) and c["add"]["rule"]["chain"] == "forward"
    ]
    assert forward[0] == [
        {"match": {"op": "!=", "left": {"meta": {"key": "iifname"}}, "right": "@alive"}},
        {"drop": None},
    ], "the alive fence must be the first rule of forward"


def test_sysctls_keep_forwarding_off_and_units_order_it() -> None:
    files = {k: v.decode() for k, v in _export().items()}
    sysctl = files["gateway/etc/sysctl.d/90-sandgate.conf"]
    assert "net.ipv4.ip_forward = 0" in sysctl and "net.ipv4.ip_forward = 1" not in sysctl
    for key in ("net.ipv6.conf.eth1.disable_ipv6 = 1", "net.ipv4.conf.eth2.rp_filter = 1"):
        assert key in sysctl
    assert files["gateway/etc/sandgate/forwarding.conf"].strip().endswith("ip_forward = 1")
    fwd = files["gateway/etc/systemd/system/sandgate-forwarding.service"]
    assert "Requires=sandgate-rules.service" in fwd and "After=sandgate-rules.service" in fwd
    rules = files["gateway/etc/systemd/system/sandgate-rules.service"]
    assert "Before=network-pre.target" in rules and "nft -j -f /etc/sandgate/" in rules
    unit = files["gateway/etc/systemd/system/sandgate-gateway.service"]
    assert "After=sandgate-rules.service sandgate-forwarding.service" in unit
    pol = load_policy(str(HOMELAB))
    cmd = " ".join(gateway_command(hd.handed_from(pol, None, [])))
    assert f"ExecStart={cmd}\n" in unit
    assert "--guest eth1=coder --guest eth2=orchestrator" in cmd


def test_hypervisor_bridges_and_host_drop() -> None:
    files = {k: v.decode() for k, v in _export().items()}
    stanzas = files["hypervisor/etc/network/interfaces.d/sandgate"]
    for bridge in ("vmbr11", "vmbr12"):
        block = stanzas.split(f"iface {bridge} inet manual\n", 1)[1].split("\n\n")[0]
        assert "bridge-ports none" in block
        assert f"net.ipv6.conf.{bridge}.disable_ipv6=1" in block
        assert f"net.ipv4.conf.{bridge}.arp_ignore=8" in block
    drop = files["hypervisor/etc/nftables.d/sandgate-host-drop.nft"]
    commands = [ln for ln in drop.splitlines() if not ln.startswith("#")]
    assert not any("flush" in ln for ln in commands)
    assert drop.count("delete table") == 1 and "delete table inet sandgate_host_drop" in drop
    assert 'iifname { "vmbr11", "vmbr12" } counter drop' in drop


def test_playbook_applies_in_report_001_order() -> None:
    plays = yaml.safe_load(_export()["ansible/playbook.yml"])
    assert [p["hosts"] for p in plays] == ["hypervisor", "gateway"]
    names = [t["name"] for p in plays for t in p["tasks"]]

    def at(text: str) -> int:
        return next(i for i, n in enumerate(names) if text in n)

    assert at("host-drop table loaded") < at("bridges up")
    assert at("bridges up") < at("sysctls applied") < at("the ruleset first")
    assert at("the ruleset first") < at("then forwarding") < at("then the daemon")
    assert at("then the daemon") < at("resolver addresses") == len(names) - 1
    assert "10.201.0.1" in json.dumps(plays[1]["tasks"][-1])


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--uplink", "eth0", "--guest", "eth0=coder"], "eth0 is the uplink and a guest link"),
        (["--guest", "eth1=coder", "--guest", "eth1=offline"], "eth1 is named twice"),
        (["--guest", "eth1=nobody"], "no profile 'nobody'"),
        (["--guest", "eth1"], "write IF=PROFILE"),
        (["--uplink", "a/b"], "not an interface name"),
    ],
)
def test_bad_links_write_nothing(tmp_path: Path, args: list[str], message: str) -> None:
    out = tmp_path / "out"
    res = CliRunner().invoke(
        app, ["export", "gateway-vm", "--policy", str(HOMELAB), "--out", str(out), *args]
    )
    assert res.exit_code == 2 and message in " ".join(res.output.split()), res.output
    assert not out.exists()


def test_no_links_anywhere_is_an_error(tmp_path: Path) -> None:
    policy = tmp_path / "p.toml"
    policy.write_text('[profiles.a]\ninternet = "open"\n')
    with pytest.raises(SandgateError, match="no uplink"):
        hd.handed_from(load_policy(str(policy)), None, [])


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="no systemd-analyze here")
def test_units_pass_systemd_analyze_verify(tmp_path: Path) -> None:
    pol = load_policy(str(HOMELAB))
    links = hd.handed_from(pol, None, [])
    # verify checks that ExecStart's program exists: point it at this machine's sandgate.
    sandgate = shutil.which("sandgate") or "/opt/sandgate/venv/bin/sandgate"
    files = export_files(pol, HOMELAB.read_bytes(), links, sandgate).files
    units = []
    for rel, data in files.items():
        if rel.endswith(".service"):
            path = tmp_path / rel
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(data)
            units.append(path)
    for side in ("gateway", "hypervisor"):
        mine = [str(u) for u in units if u.parts[len(tmp_path.parts)] == side]
        done = subprocess.run(
            ["systemd-analyze", "verify", *mine], capture_output=True, text=True, check=False
        )
        assert done.returncode == 0 and not done.stderr.strip(), done.stderr


def test_one_gateway_table_drives_run_and_the_gateway_vm(tmp_path: Path) -> None:
    """Part 6: `sandgate run` reads the same [gateway] (pool, upstream DNS) the export uses."""
    from sandgate.session.stack import gateway_config

    text = HOMELAB.read_text().replace(
        'guest_pool = "10.201.0.0/16"', 'guest_pool = "10.202.0.0/16"'
    )
    text = text.replace("# upstream_dns", "upstream_dns", 1)
    policy = tmp_path / "homelab.toml"
    policy.write_text(text)
    pol = load_policy(str(policy))
    cfg = gateway_config("t", None, None, pol)
    assert cfg.guest_pool == "10.202.0.0/16" and cfg.upstream_dns == ("192.168.1.1",)
    files = export_files(pol, policy.read_bytes(), hd.handed_from(pol, None, [])).files
    assert "| eth1 | vmbr11 | coder | 10.202.0.2/30 | 10.202.0.1 |" in files["README.md"].decode()
    assert b'"10.202.0.1"' in files["gateway/etc/sandgate/sandgate.nft.json"]


def test_resolver_listeners_are_read_from_proc() -> None:
    """The daemon's start-up check (report 001's assertion) reads /proc/net/{tcp,udp}."""
    from sandgate.gateway.handed import parse_proc_net

    udp = (
        "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  "
        "timeout inode ref pointer drops\n"
        "  1: 0100C90A:0035 00000000:0000 07 00000000:00000000 00:00000000 00000000     0 "
        "       0 4242 2 0000000000000000 0\n"
        "  2: 00000000:0035 00000000:0000 07 00000000:00000000 00:00000000 00000000     0 "
        "       0 4343 2 0000000000000000 0\n"
        "  3: 0100007F:1F90 00000000:0000 07 00000000:00000000 00:00000000 00000000     0 "
        "       0 4444 2 0000000000000000 0\n"
    )
    assert parse_proc_net(udp, 53, listen_only=False) == [("10.201.0.1", 4242), ("0.0.0.0", 4343)]
    tcp = udp.replace(" 07 ", " 0A ", 1)
    assert parse_proc_net(tcp, 53, listen_only=True) == [("10.201.0.1", 4242)]
