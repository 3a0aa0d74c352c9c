#!/usr/bin/python3
"""The probe driver: runs inside the sandbox as the sandboxed uid (stdlib only).

Reads the probes (JSON) from argv[1], tries each one the way an agent would, and writes one
JSON line per probe to argv[2]: ``{"id", "observed": "allow"|"deny", "sport", "detail"}``.
"allow" means the attempt got through to something (a connection, an answer, a capability);
"deny" means it did not. What the gateway recorded is checked afterwards, outside.
"""

from __future__ import annotations

import concurrent.futures
import json
import os
import socket
import ssl
import struct
import subprocess
import sys
import time
from typing import Any

TIMEOUT = 2.0


def tcp(a: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    family = socket.AF_INET6 if ":" in a["address"] else socket.AF_INET
    s = socket.socket(family, socket.SOCK_STREAM)
    s.settimeout(TIMEOUT)
    try:
        s.bind(("::" if family == socket.AF_INET6 else "0.0.0.0", 0))
        sport = s.getsockname()[1]
        s.connect((a["address"], a["port"]))
        not_connected = unconnected(s)
        if not_connected is not None:
            return not_connected[0], {"sport": sport, "error": not_connected[1]}
        # Connected means reached: the gateway refuses with ICMP, and only web ports (never
        # probed with plain TCP here) meet a proxy that accepts connections itself.
        return "allow", {"sport": sport}
    except ConnectionRefusedError:
        if a.get("reset_by_qemu"):
            # A NIC-less VM: QEMU's restricted user stack resets what it does not forward
            # itself; nothing was contacted.
            return "deny", {"sport": locals().get("sport"), "error": "reset by QEMU's stack"}
        # The far end answered (with a reset): the attempt got through the gateway, whose own
        # refusals are ICMP "administratively prohibited" (no route to host).
        return "allow", {"sport": locals().get("sport"), "error": "refused by the destination"}
    except TimeoutError:
        # Neither the gateway's refusal nor the far end's answer: the gateway's record tells.
        return "silent", {"sport": locals().get("sport"), "error": "TimeoutError"}
    except OSError as exc:
        return "deny", {"sport": locals().get("sport"), "error": exc.__class__.__name__}
    finally:
        s.close()


def unconnected(s: socket.socket) -> tuple[str, str] | None:
    """Whether a TCP socket whose ``connect()`` returned is really connected: None if so.

    With a timeout, Python's ``connect()`` polls and then trusts ``SO_ERROR == 0``. A socket
    woken while its handshake failed (an ICMP refusal taken as a soft error, the error already
    read) passes that test unconnected, and was counted as a leak of the gateway (a flaky
    ``block 192.88.99.2/32: LEAK`` whose only packet the gateway had refused). The kernel's
    own answer: ``getpeername()`` works on a connected socket only. A socket that connected
    and was reset at once no longer has a peer either, but it received segments."""
    try:
        s.getpeername()
        return None
    except OSError:
        pass
    try:
        info = s.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, 144)
        segs_in = struct.unpack_from("I", info, 140)[0] if len(info) >= 144 else 0
    except OSError:
        segs_in = 0
    if segs_in:
        return "allow", "reset by the destination after connecting"
    # Neither the gateway's refusal nor the far end's answer reached us: its record tells.
    return "silent", "connect() returned an unconnected socket"


def udp(a: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.settimeout(TIMEOUT)
    try:
        s.bind(("0.0.0.0", 0))
        sport = s.getsockname()[1]
        s.connect((a["address"], a["port"]))  # connected: ICMP errors come back as exceptions
        s.send(a.get("payload", "sandgate-probe").encode())
        data = s.recv(512)
        return ("allow" if data else "deny"), {"sport": sport}
    except ConnectionRefusedError:
        return "allow", {"sport": locals().get("sport"), "error": "refused by the destination"}
    except OSError as exc:
        return "deny", {"sport": locals().get("sport"), "error": exc.__class__.__name__}
    finally:
        s.close()


def icmp(a: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    r = subprocess.run(
        ["ping", "-c", "1", "-W", "1", a["address"]], capture_output=True, text=True, check=False
    )
    return ("allow" if r.returncode == 0 else "deny"), {"rc": r.returncode}


def dns(a: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    cmd = ["dig", "+time=2", "+tries=1", "+ednsopt=65001"]
    if a.get("tcp"):
        cmd.append("+tcp")
    if a.get("server"):
        cmd.append("@" + a["server"])
    if a.get("reverse"):
        cmd += ["-x", a["reverse"]]
    else:
        cmd += [a["name"], a.get("qtype", "A")]
    r = subprocess.run(cmd, capture_output=True, text=True, check=False)
    out = r.stdout
    status = out.split("status: ", 1)[1].split(",", 1)[0] if "status: " in out else "none"
    by_gateway = "sandgate:" in out  # the gateway's Extended DNS Error text
    answered = status == "NOERROR" and "ANSWER: 0" not in out
    detail = {"status": status, "by_gateway": by_gateway}
    if a.get("expect") == "gateway-answers":
        # A question to another server: "allow" would mean that server answered it.
        return ("deny" if by_gateway or status == "none" else "allow"), detail
    return ("allow" if answered else "deny"), detail


def http(a: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    cmd = ["curl", "-sS", "-m", "4", "-o", "/dev/null", "-D", "-", "-w", "CODE:%{http_code}\n"]
    cmd += ["-x", a["proxy"]] if a.get("proxy") else ["--noproxy", "*"]
    for h in a.get("headers", []):
        cmd += ["-H", h]
    if a.get("resolve"):
        cmd += ["--resolve", a["resolve"]]
    if a.get("insecure"):
        cmd.append("-k")
    cmd.append(a["url"])
    env = (
        {k: v for k, v in os.environ.items() if "proxy" not in k.lower()}
        if a.get("noenv")
        else None
    )
    r = subprocess.run(cmd, capture_output=True, text=True, check=False, env=env)
    code = r.stdout.rsplit("CODE:", 1)[-1].strip() if "CODE:" in r.stdout else "000"
    refused = "x-sandgate-reason" in r.stdout.lower() or code in ("000", "")
    return ("deny" if refused else "allow"), {"code": code, "rc": r.returncode}


def tls(a: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    ctx = ssl.create_default_context()
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    s.settimeout(TIMEOUT)
    try:
        s.bind(("0.0.0.0", 0))
        sport = s.getsockname()[1]
        s.connect((a["address"], a["port"]))
        not_connected = unconnected(s)
        if not_connected is not None:
            return "deny", {"sport": sport, "error": not_connected[1]}
        with ctx.wrap_socket(s, server_hostname=a.get("sni")) as t:
            t.do_handshake()
        return "allow", {"sport": sport}
    except OSError as exc:
        return "deny", {"sport": locals().get("sport"), "error": exc.__class__.__name__}
    finally:
        s.close()


def connect(a: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    host, port = a["proxy"].removeprefix("http://").rsplit(":", 1)
    s = socket.create_connection((host, int(port)), timeout=TIMEOUT)
    try:
        sport = s.getsockname()[1]
        s.sendall(f"CONNECT {a['target']} HTTP/1.1\r\nHost: {a['target']}\r\n\r\n".encode())
        head = s.recv(200).split(b"\r\n", 1)[0].decode(errors="replace")
        return ("allow" if " 200 " in head + " " else "deny"), {"sport": sport, "head": head}
    except OSError as exc:
        return "deny", {"error": exc.__class__.__name__}
    finally:
        s.close()


def local(a: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    r = subprocess.run(["sh", "-c", a["command"]], capture_output=True, text=True, check=False)
    return ("allow" if r.returncode == 0 else "deny"), {
        "rc": r.returncode,
        "out": (r.stdout + r.stderr)[-120:],
    }


def unix_sockets(a: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    found = []
    for top in ("/run", "/var/run", "/tmp", "/var/tmp", "/home", "/work", "/dev/shm"):
        for root, _dirs, files in os.walk(top):
            for f in files:
                path = os.path.join(root, f)
                try:
                    if stat_is_socket(path):
                        found.append(path)
                except OSError:
                    pass
    return ("allow" if found else "deny"), {"found": found[:5]}


def stat_is_socket(path: str) -> bool:
    import stat

    return stat.S_ISSOCK(os.lstat(path).st_mode)


# -- root in a VM guest (prove/vmprobes.py): frames crafted by hand on an AF_PACKET socket ------
IFACE = "eth0"
ETH_IP, ETH_ARP, ETH_IP6 = 0x0800, 0x0806, 0x86DD


def _read(path: str) -> str:
    with open(path) as f:
        return f.read()


def _mac(text: str) -> bytes:
    return bytes.fromhex(text.replace(":", ""))


def _own() -> tuple[bytes, str]:
    mac = _mac(_read(f"/sys/class/net/{IFACE}/address").strip())
    probe = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        probe.connect(("192.0.2.1", 9))  # no packet: it only picks the source address
        return mac, probe.getsockname()[0]
    finally:
        probe.close()


def _gateway() -> tuple[str, bytes]:
    """The default gateway and its MAC (a UDP packet to its resolver fills the ARP cache)."""
    gw = ""
    for line in _read("/proc/net/route").splitlines()[1:]:
        f = line.split()
        if f[1] == "00000000":
            gw = socket.inet_ntoa(bytes.fromhex(f[2])[::-1])
    u = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    u.sendto(b"\0" * 12, (gw, 53))
    u.close()
    for _ in range(50):
        for line in _read("/proc/net/arp").splitlines()[1:]:
            f = line.split()
            if f[0] == gw and f[3] != "00:00:00:00:00:00":
                return gw, _mac(f[3])
        time.sleep(0.1)
    raise OSError(f"no ARP entry for the gateway {gw}")


def _sum(data: bytes) -> int:
    if len(data) % 2:
        data += b"\0"
    total = sum(struct.unpack(f"!{len(data) // 2}H", data))
    while total >> 16:
        total = (total & 0xFFFF) + (total >> 16)
    return int(~total & 0xFFFF)


def _ipv4(src: str, dst: str, proto: int, payload: bytes) -> bytes:
    s, d = socket.inet_aton(src), socket.inet_aton(dst)
    head = struct.pack("!BBHHHBBH4s4s", 0x45, 0, 20 + len(payload), 1, 0, 64, proto, 0, s, d)
    head = head[:10] + struct.pack("!H", _sum(head)) + head[12:]
    if proto in (6, 17):  # the transport checksum covers a pseudo header
        pseudo = s + d + struct.pack("!BBH", 0, proto, len(payload))
        at = 16 if proto == 6 else 6
        payload = payload[:at] + struct.pack("!H", _sum(pseudo + payload)) + payload[at + 2 :]
    return head + payload


def _syn(sport: int, dport: int) -> bytes:
    return struct.pack("!HHIIBBHHH", sport, dport, 1, 0, 5 << 4, 0x02, 64240, 0, 0)


def _udp(sport: int, dport: int, data: bytes) -> bytes:
    return struct.pack("!HHHH", sport, dport, 8 + len(data), 0) + data


def _arp(op: int, smac: bytes, sip: str, tmac: bytes, tip: str) -> bytes:
    return struct.pack("!HHBBH", 1, ETH_IP, 6, 4, op) + (
        smac + socket.inet_aton(sip) + tmac + socket.inet_aton(tip)
    )


def _ipv6_echo(src_mac: bytes, dst: str) -> bytes:
    src = b"\xfe\x80" + b"\0" * 6 + src_mac[:3] + b"\xff\xfe" + src_mac[3:]
    dst_b = socket.inet_pton(socket.AF_INET6, dst)
    icmp = struct.pack("!BBHHH", 128, 0, 0, 1, 1)
    pseudo = src + dst_b + struct.pack("!I3xB", len(icmp), 58)
    icmp = icmp[:2] + struct.pack("!H", _sum(pseudo + icmp)) + icmp[4:]
    return struct.pack("!IHBB", 6 << 28, len(icmp), 58, 64) + src + dst_b + icmp


def raw(a: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    """Send one hand-made frame; "allow" if anything answers it within TIMEOUT."""
    own_mac, own_ip = _own()
    _gw, gw_mac = _gateway()
    kind = a["kind"]
    src_mac = _mac(a["mac"]) if a.get("mac") else own_mac
    src = own_ip if a.get("src", "own") == "own" else a["src"]
    sport = 20000 + int.from_bytes(os.urandom(2), "big") % 40000  # names this probe's record
    dst_mac, etype = gw_mac, ETH_IP

    def answers(frame: bytes) -> bool:
        return False

    if kind == "tcp":
        body = _ipv4(src, a["dst"], 6, _syn(sport, a["port"]))
        dst_ip = socket.inet_aton(a["dst"])

        def answers(frame: bytes) -> bool:  # a SYN-ACK or RST from the target to our port
            return (
                frame[12:14] == b"\x08\x00"
                and frame[26:30] == dst_ip
                and (struct.unpack("!H", frame[36:38])[0] == sport)
            )
    elif kind == "dhcp":
        # DHCPDISCOVER: op 1, htype 1, hlen 6, a transaction id, the client MAC, the cookie.
        dhcp = struct.pack("!BBBBI", 1, 1, 6, 0, 0x5347) + b"\0" * 20 + own_mac + b"\0" * 202
        dhcp += b"\x63\x82\x53\x63\x35\x01\x01\xff"
        body = _ipv4("0.0.0.0", "255.255.255.255", 17, _udp(68, 67, dhcp))
        dst_mac = b"\xff" * 6

        def answers(frame: bytes) -> bool:
            return frame[12:14] == b"\x08\x00" and frame[34:38] == b"\x00\x43\x00\x44"
    elif kind == "arp":
        claim = own_ip if a["claim"] == "own" else a["claim"]
        ask = a["ask"]
        body = _arp(1, src_mac, claim, b"\0" * 6, ask)
        dst_mac, etype = b"\xff" * 6, ETH_ARP
        asked = socket.inet_aton(ask)

        def answers(frame: bytes) -> bool:  # an ARP reply from the asked address
            return (
                frame[12:14] == b"\x08\x06"
                and frame[20:22] == b"\x00\x02"
                and (frame[28:32] == asked)
            )
    elif kind == "ipv6":
        body = _ipv6_echo(src_mac, a["dst6"])
        dst_mac, etype = b"\x33\x33\x00\x00\x00\x01", ETH_IP6

        def answers(frame: bytes) -> bool:
            return frame[12:14] == b"\x86\xdd"
    elif kind == "ethertype":
        body, etype = b"sandgate probe".ljust(46, b"\0"), int(a["type"])
    else:
        raise ValueError(f"unknown raw kind {kind}")
    s = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.htons(0x0003))
    try:
        s.bind((IFACE, 0))
        s.settimeout(0.2)
        s.send(dst_mac + src_mac + struct.pack("!H", etype) + body)
        deadline = time.monotonic() + TIMEOUT
        while time.monotonic() < deadline:
            try:
                frame, where = s.recvfrom(2048)
            except TimeoutError:
                continue
            if where[2] != socket.PACKET_OUTGOING and answers(frame):
                return "allow", {"sport": sport, "src": src}
        return "silent", {"sport": sport, "src": src}
    finally:
        s.close()


def rootnet(a: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    """Change the guest's own routing as root, try a connection, change it back."""
    if a.get("setup"):
        subprocess.run(["sh", "-c", a["setup"]], check=True, capture_output=True)
    try:
        return tcp({k: v for k, v in a.items() if k not in ("setup", "undo")})
    finally:
        if a.get("undo"):
            subprocess.run(["sh", "-c", a["undo"]], check=False, capture_output=True)


SERIAL = {"rootnet"}  # actions that change the guest's state: run alone, after the others


ACTIONS = {
    "tcp": tcp,
    "udp": udp,
    "icmp": icmp,
    "dns": dns,
    "http": http,
    "tls": tls,
    "connect": connect,
    "local": local,
    "unix_sockets": unix_sockets,
    "raw": raw,
    "rootnet": rootnet,
}


def run(probe: dict[str, Any]) -> dict[str, Any]:
    try:
        observed, detail = ACTIONS[probe["action"]](probe["args"])
    except Exception as exc:  # a probe that breaks reports it; the others go on
        observed, detail = "error", {"error": repr(exc)}
    return {"id": probe["id"], "observed": observed, **detail}


def main() -> int:
    with open(sys.argv[1]) as f:
        probes = json.load(f)
    parallel = [p for p in probes if p["action"] not in SERIAL]
    with concurrent.futures.ThreadPoolExecutor(8) as pool, open(sys.argv[2], "w") as out:
        for result in pool.map(run, parallel):
            out.write(json.dumps(result) + "\n")
        for probe in probes:
            if probe["action"] in SERIAL:
                out.write(json.dumps(run(probe)) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
