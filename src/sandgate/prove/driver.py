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
import subprocess
import sys
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
        # Connected means reached: the gateway refuses with ICMP, and only web ports (never
        # probed with plain TCP here) meet a proxy that accepts connections itself.
        return "allow", {"sport": sport}
    except ConnectionRefusedError:
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
    with concurrent.futures.ThreadPoolExecutor(8) as pool, open(sys.argv[2], "w") as out:
        for result in pool.map(run, probes):
            out.write(json.dumps(result) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
