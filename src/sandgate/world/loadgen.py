"""A session's load of known size, for counting what the gateway stored: ``names`` DNS questions
(raw UDP, exactly one question each: no AAAA twin, no retry) and one TCP connection the policy
drops. The soak (bench/scale.py) and the concurrency test run it; exit 10+i means question i got
no answer."""

from __future__ import annotations

SCRIPT = r"""
import socket, struct, sys
ns = open("/etc/resolv.conf").read().split()[1]
for i in range(int(sys.argv[1])):
    q = struct.pack(">HHHHHH", 0x1000 + i, 0x0100, 1, 0, 0, 0)
    for part in (f"{sys.argv[4]}{i}", *sys.argv[5].split(".")):
        q += bytes([len(part)]) + part.encode()
    q += b"\0" + struct.pack(">HH", 1, 1)
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.settimeout(3)
    s.sendto(q, (ns, 53))
    try:
        s.recv(4096)
    except OSError:
        sys.exit(10 + i)
    s.close()
c = socket.socket()
c.settimeout(0.3)
try:
    c.connect((sys.argv[2], int(sys.argv[3])))
except OSError:
    pass
"""


def command(names: int, dropped: tuple[str, int], label: str, zone: str) -> list[str]:
    """The sandbox command: ask ``<label><i>.<zone>`` for i < names, then connect to ``dropped``."""
    return ["/usr/bin/python3", "-c", SCRIPT, str(names), dropped[0], str(dropped[1]), label, zone]
