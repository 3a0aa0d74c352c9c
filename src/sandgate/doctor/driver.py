#!/usr/bin/python3
"""The doctor's driver: runs inside a fresh sandbox as the sandboxed uid (stdlib only).

Reads the plan (JSON, plan.py) from argv[1], tries each hop the way an agent's tools would
(the C library's resolver, dig, curl, git, node, Python), and writes what it saw as one JSON
object to argv[2]. It judges nothing: judge.py does, outside, with the gateway's own facts.
"""

from __future__ import annotations

import base64
import concurrent.futures
import json
import os
import shutil
import socket
import ssl
import subprocess
import sys
import time
from typing import Any

TIMEOUT = 4.0


def sh(cmd: list[str], env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    try:
        return subprocess.run(
            cmd, capture_output=True, text=True, check=False, env=env, timeout=TIMEOUT * 3
        )
    except subprocess.TimeoutExpired:
        return subprocess.CompletedProcess(cmd, 124, "", "timed out")


def resolv_conf() -> dict[str, Any]:
    try:
        with open("/etc/resolv.conf") as f:
            lines = f.read().splitlines()
    except OSError as exc:
        return {"error": exc.__class__.__name__}
    servers = [ln.split()[1] for ln in lines if ln.startswith("nameserver") and len(ln.split()) > 1]
    return {"nameservers": servers}


def libc(name: str | None) -> dict[str, Any]:
    if not name:
        return {}
    try:
        infos = socket.getaddrinfo(name, None, socket.AF_INET, socket.SOCK_STREAM)
        return {"addresses": sorted({str(i[4][0]) for i in infos})}
    except OSError as exc:
        return {"error": str(exc)}


def dig(server: str, name: str | None) -> dict[str, Any]:
    if not name:
        return {}
    r = sh(["dig", "+time=3", "+tries=1", f"@{server}", name, "A"])
    out = r.stdout
    status = out.split("status: ", 1)[1].split(",", 1)[0] if "status: " in out else "none"
    answers = 0
    if "ANSWER: " in out:
        answers = int(out.split("ANSWER: ", 1)[1].split(",", 1)[0])
    ede = ""
    for line in out.splitlines():
        if "EDE:" in line:
            ede = line.split("EDE:", 1)[1].strip()[:200]
    return {"status": status, "answers": answers, "ede": ede, "rc": r.returncode}


def curl(url: str, *extra: str, env: dict[str, str] | None = None) -> dict[str, Any]:
    cmd = ["curl", "-sS", "-m", str(TIMEOUT), "-o", "/dev/null", "-D", "-"]
    r = sh([*cmd, "-w", "CODE:%{http_code}\n", *extra, url], env=env)
    code = r.stdout.rsplit("CODE:", 1)[-1].strip() if "CODE:" in r.stdout else "000"
    head = r.stdout.rsplit("CODE:", 1)[0]
    headers = {}
    for line in head.splitlines()[1:]:
        k, sep, v = line.partition(":")
        if sep:
            headers[k.strip().lower()] = v.strip()
    return {
        "code": code,
        "rc": r.returncode,
        "error": r.stderr.strip()[-300:],
        "sandgate_reason": headers.get("x-sandgate-reason"),
        "date": headers.get("date"),
        "at": time.time(),
    }


def doors(plan: dict[str, Any]) -> dict[str, Any]:
    url = plan["door_url"]
    explicit = curl(url, "-x", plan["proxy"])
    extra = ["--noproxy", "*"] + (
        ["--resolve", plan["door_resolve"]] if plan["door_resolve"] else []
    )
    transparent = curl(url, *extra)
    return {"explicit": explicit, "transparent": transparent}


def model(target: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {"address": target["address"], "port": target["port"]}
    if target["via"] == "direct":
        s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        s.settimeout(TIMEOUT)
        try:
            s.connect((target["address"], target["port"]))
            out["connect"] = "ok"
        except OSError as exc:
            out["connect"] = f"{exc.__class__.__name__}: {exc.strerror or exc}"
            return out
        finally:
            s.close()
    paths = {}
    for url in (target["url"], target["url"].replace("/v1/models", "/api/tags")):
        got = curl(url, "--noproxy", "*")
        paths[url] = got["code"] if got["rc"] == 0 or got["code"] != "000" else got["error"]
        if got["code"].startswith("2"):
            break
    out["paths"] = paths
    return out


def peer_cert(address: str | None, name: str, proxy: str | None) -> dict[str, Any]:
    """The certificate a client is shown for ``name``: dialled directly (the transparent path)
    or through the explicit proxy's CONNECT (what HTTPS_PROXY clients do)."""
    ctx = ssl.create_default_context()
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    try:
        if proxy:
            host, port = proxy.removeprefix("http://").rsplit(":", 1)
            s = socket.create_connection((host, int(port)), timeout=TIMEOUT)
            s.sendall(f"CONNECT {name}:443 HTTP/1.1\r\nHost: {name}:443\r\n\r\n".encode())
            head = b""
            while b"\r\n\r\n" not in head and len(head) < 4096:
                chunk = s.recv(1)
                if not chunk:
                    break
                head += chunk
            first = head.split(b"\r\n", 1)[0].decode(errors="replace")
            if " 200" not in first:
                s.close()
                return {"error": f"CONNECT answered {first!r}"}
        else:
            s = socket.create_connection((address or name, 443), timeout=TIMEOUT)
        with ctx.wrap_socket(s, server_hostname=name) as t:
            der = t.getpeercert(binary_form=True)
        return {"der": base64.b64encode(der).decode() if der else None}
    except OSError as exc:
        return {"error": f"{exc.__class__.__name__}: {exc}"[:200]}


def inspected(plan: dict[str, Any], name: str) -> dict[str, Any]:
    found = libc(name)  # through the gateway's resolver, which marks the name's addresses
    address = (found.get("addresses") or [None])[0]
    return {
        "name": name,
        "direct": peer_cert(address, name, None)
        if address
        else {"error": found.get("error", "no address")},
        "proxy": peer_cert(None, name, plan["proxy"]),
    }


def bundles(plan: dict[str, Any]) -> dict[str, Any]:
    body = "".join(plan["gateway_ca"].strip().splitlines()[1:-1])
    paths = {plan["bundle"], *(v for k, v in os.environ.items() if k in CA_ENV_NAMES)}
    out: dict[str, dict[str, Any]] = {}
    for path in sorted(paths):
        try:
            with open(path) as f:
                text = "".join(f.read().split())
            out[path] = {"readable": True, "gateway_ca": body in text}
        except OSError as exc:
            out[path] = {"readable": False, "error": exc.__class__.__name__}
    return out


CA_ENV_NAMES = {
    "SSL_CERT_FILE",
    "REQUESTS_CA_BUNDLE",
    "CURL_CA_BUNDLE",
    "PIP_CERT",
    "GIT_SSL_CAINFO",
    "NODE_EXTRA_CA_CERTS",
    "SSL_CERT_DIR",
}
PROXY_ENV_NAMES = {"HTTP_PROXY", "HTTPS_PROXY", "NO_PROXY", "ALL_PROXY"}

NODE_GET = (
    "const u=new URL(process.argv[1]);"
    "require('https').get(u,r=>{console.log('STATUS',r.statusCode);process.exit(0)})"
    ".on('error',e=>{console.log('ERROR',e.code||e.message);process.exit(1)})"
)
PY_GET = (
    "import os,sys\n"
    "try:\n"
    "    {import_line}\n"
    "except ImportError:\n"
    "    print('MISSING'); sys.exit(3)\n"
    "try:\n"
    "    r=requests.get(sys.argv[1],timeout=4,verify={verify})\n"
    "    print('STATUS',r.status_code)\n"
    "except requests.exceptions.SSLError as e:\n"
    "    print('SSLERROR',str(e)[:200]); sys.exit(1)\n"
    "except Exception as e:\n"
    "    print('ERROR',type(e).__name__,str(e)[:200]); sys.exit(2)\n"
)


def tool(name: str, url: str | None) -> dict[str, Any]:
    """Is the tool there, and does it trust the gateway's certificate for ``url``?"""
    if name == "curl":
        if not shutil.which("curl"):
            return {"installed": False}
        if not url:
            return {"installed": True}
        got = curl(url)
        return {
            "installed": True,
            "trusted": got["rc"] not in (60, 77),
            "detail": got["error"] or got["code"],
        }
    if name == "git":
        if not shutil.which("git"):
            return {"installed": False}
        if not url:
            return {"installed": True}
        env = {**os.environ, "GIT_TERMINAL_PROMPT": "0", "HOME": os.environ.get("HOME", "/tmp")}
        r = sh(["git", "ls-remote", url.rstrip("/") + "/doctor.git"], env=env)
        text = (r.stdout + r.stderr).strip()
        bad = "certificate" in text.lower() or "ssl" in text.lower()
        return {"installed": True, "trusted": not bad, "detail": text[-200:]}
    if name == "node":
        exe = shutil.which("node") or shutil.which("nodejs")
        if not exe:
            return {"installed": False}
        if not url:
            return {"installed": True}
        r = sh([exe, "-e", NODE_GET, url])
        text = (r.stdout + r.stderr).strip()
        bad = any(w in text for w in ("CERT", "SELF_SIGNED", "UNABLE_TO", "certificate"))
        return {"installed": True, "trusted": not bad, "detail": text[-200:]}
    # requests, and pip through its own vendored copy of requests (with PIP_CERT, as pip does)
    if name == "pip":
        code = PY_GET.format(
            import_line="from pip._vendor import requests",
            verify="os.environ.get('PIP_CERT', True)",
        )
    else:
        code = PY_GET.format(import_line="import requests", verify="True")
    r = sh([sys.executable, "-c", code, url or "https://sandgate-doctor.invalid/"])
    text = r.stdout.strip()
    if r.returncode == 3 or text.startswith("MISSING"):
        return {"installed": False}
    if not url:
        return {"installed": True}
    return {"installed": True, "trusted": not text.startswith("SSLERROR"), "detail": text[-200:]}


def main() -> int:
    with open(sys.argv[1]) as f:
        plan = json.load(f)
    seen: dict[str, Any] = {"clock": {"start": time.time()}}
    seen["resolv_conf"] = resolv_conf()
    seen["libc"] = libc(plan["known_name"])
    seen["env"] = {
        k: v for k, v in os.environ.items() if k.upper() in CA_ENV_NAMES | PROXY_ENV_NAMES
    }
    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        jobs = {
            "dns_known": pool.submit(dig, plan["gateway"], plan["known_name"]),
            "dns_fresh": pool.submit(dig, plan["gateway"], plan["fresh_name"]),
            "doors": pool.submit(doors, plan),
            "models": [pool.submit(model, t) for t in plan["models"]],
            "inspected": [pool.submit(inspected, plan, n) for n in plan["inspected"]],
            "tools": {t: pool.submit(tool, t, plan["tls_url"]) for t in TOOLS},
            "uplink": pool.submit(curl, plan["uplink_url"]) if plan["uplink_url"] else None,
            "date": pool.submit(curl, plan["date_url"]) if plan["date_url"] else None,
        }
        for key, job in jobs.items():
            seen[key] = _result(job)
    seen["bundles"] = bundles(plan)
    seen["clock"]["end"] = time.time()
    with open(sys.argv[2], "w") as out:
        json.dump(seen, out)
    return 0


TOOLS = ("curl", "pip", "requests", "git", "node")


def _result(job: Any) -> Any:
    if job is None:
        return None
    if isinstance(job, list):
        return [_result(j) for j in job]
    if isinstance(job, dict):
        return {k: _result(v) for k, v in job.items()}
    try:
        return job.result()
    except Exception as exc:  # a check that breaks says so; the others go on
        return {"broken": repr(exc)[:300]}


if __name__ == "__main__":
    sys.exit(main())
