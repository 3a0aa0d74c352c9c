"""procattr's parsers on text and bytes captured from kernel 6.18, and ProcessFinder on a fake
/proc (directories, hard links for ``ns/net``, symlinks for ``fd/N`` and ``exe``).

The captures come from one process (uid 61234, in a throwaway namespace) holding: a TCP listener
on 127.0.0.1:4444 with one accepted connection, a dual-stack listener on [::]:4446 with a
connection to it through ``::ffff:127.0.0.1``, a listener on [::1]:4447, an unconnected UDP
socket on *:5353, and UDP sockets connected to 127.0.0.1:53 and [::1]:53.
"""

from __future__ import annotations

import errno
import os
import struct
from pathlib import Path

import pytest

from sandgate.gateway.logs.procattr import (
    LAUNCHERS,
    ProcessFinder,
    ProcInfo,
    ProcStat,
    Role,
    SockEntry,
    classify_chain,
    parse_cmdline,
    parse_hex_address,
    parse_proc_net,
    parse_socket_link,
    parse_stat,
    parse_status_ppid,
)
from sandgate.net.netlink import NetlinkParseError
from sandgate.net.sockdiag import pack_diag_request, parse_diag_reply

# --- /proc/PID/net tables ------------------------------------------------------------------------

# fmt: off
TCP = (
    "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode                                                     \n"  # noqa: E501
    "   0: 0100007F:115C 00000000:0000 0A 00000000:00000000 00:00000000 00000000 61234        0 1195163 1 00000000b09e183c 100 0 0 10 0                   \n"  # noqa: E501
    "   1: 0100007F:AE46 0100007F:115C 01 00000000:00000000 00:00000000 00000000 61234        0 1195164 2 0000000090b5f379 20 0 0 10 -1                   \n"  # noqa: E501
    "   2: 0100007F:115C 0100007F:AE46 01 00000000:00000000 00:00000000 00000000 61234        0 1195165 1 00000000591474c0 20 0 0 10 -1                   \n"  # noqa: E501
)
TCP6 = (
    "  sl  local_address                         remote_address                        st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode\n"  # noqa: E501
    "   0: 00000000000000000000000001000000:115F 00000000000000000000000000000000:0000 0A 00000000:00000000 00:00000000 00000000 61234        0 1195168 1 00000000f9306087 100 0 0 10 0\n"  # noqa: E501
    "   1: 00000000000000000000000000000000:115E 00000000000000000000000000000000:0000 0A 00000000:00000001 00:00000000 00000000 61234        0 1195166 2 00000000f41405e5 100 0 0 10 0\n"  # noqa: E501
    # the accepted side of the mapped connection, still in the accept queue: no socket file yet
    "   2: 0000000000000000FFFF00000100007F:115E 0000000000000000FFFF00000100007F:9808 01 00000000:00000000 00:00000000 00000000 61234        0 0 1 000000009ecb7c63 20 0 0 10 -1\n"  # noqa: E501
    "   3: 0000000000000000FFFF00000100007F:9808 0000000000000000FFFF00000100007F:115E 01 00000000:00000000 00:00000000 00000000 61234        0 1195167 2 00000000d8eec8b2 20 0 0 10 -1\n"  # noqa: E501
)
UDP = (
    "   sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode ref pointer drops            \n"  # noqa: E501
    "12214: 0100007F:92AD 0100007F:0035 01 00000000:00000000 00:00000000 00000000 61234        0 1195170 2 000000003633c4b8 0       \n"  # noqa: E501
    "12786: 00000000:14E9 00000000:0000 07 00000000:00000000 00:00000000 00000000 61234        0 1195169 2 000000004edb328c 0       \n"  # noqa: E501
)
UDP6 = (
    "  sl  local_address                         remote_address                        st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode ref pointer drops\n"  # noqa: E501
    " 2240: 00000000000000000000000001000000:ABB7 00000000000000000000000001000000:0035 01 00000000:00000000 00:00000000 00000000 61234        0 1195171 2 00000000704b26c2 0\n"  # noqa: E501
)
# fmt: on


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("0100007F:0050", ("127.0.0.1", 80)),  # 127.0.0.1 as a little-endian word
        ("00000000:0000", ("0.0.0.0", 0)),
        ("0202A8C0:FFFF", ("192.168.2.2", 65535)),
        ("00000000000000000000000001000000:115F", ("::1", 4447)),  # four words, each LE
        ("0000000000000000FFFF00000100007F:9808", ("127.0.0.1", 38920)),  # v4-mapped: unmapped
        ("B80D0120000000000000000001000000:0035", ("2001:db8::1", 53)),
    ],
)
def test_hex_addresses(text: str, expected: tuple[str, int]) -> None:
    assert parse_hex_address(text) == expected


@pytest.mark.parametrize("bad", ["", "0100007F", "0100007F:", "0100007:0050", "ZZ00007F:0050"])
def test_hex_address_garbage(bad: str) -> None:
    with pytest.raises(ValueError):
        parse_hex_address(bad)


def test_tcp_table() -> None:
    assert parse_proc_net(TCP, "tcp") == [
        SockEntry("tcp", "127.0.0.1", 4444, "0.0.0.0", 0, 0x0A, 61234, 1195163),  # LISTEN
        SockEntry("tcp", "127.0.0.1", 44614, "127.0.0.1", 4444, 1, 61234, 1195164),
        SockEntry("tcp", "127.0.0.1", 4444, "127.0.0.1", 44614, 1, 61234, 1195165),
    ]


def test_tcp6_table_unmaps_and_keeps_sockets_without_a_file() -> None:
    entries = parse_proc_net(TCP6, "tcp6")
    assert [(e.local, e.lport, e.remote, e.rport, e.inode) for e in entries] == [
        ("::1", 4447, "::", 0, 1195168),
        ("::", 4446, "::", 0, 1195166),
        ("127.0.0.1", 4446, "127.0.0.1", 38920, 0),
        ("127.0.0.1", 38920, "127.0.0.1", 4446, 1195167),
    ]
    assert {e.proto for e in entries} == {"tcp"}


def test_udp_tables() -> None:
    assert parse_proc_net(UDP, "udp") == [
        SockEntry("udp", "127.0.0.1", 37549, "127.0.0.1", 53, 1, 61234, 1195170),  # connected
        SockEntry("udp", "0.0.0.0", 5353, "0.0.0.0", 0, 7, 61234, 1195169),
    ]
    [six] = parse_proc_net(UDP6, "udp6")
    assert (six.local, six.lport, six.remote, six.rport, six.inode) == (
        "::1",
        43959,
        "::1",
        53,
        1195171,
    )


def test_table_lines_that_do_not_parse_are_skipped() -> None:
    header, first, rest = TCP.split("\n", 2)
    assert parse_proc_net(header + "\n", "tcp") == []
    assert parse_proc_net("", "tcp") == []
    torn = header + "\n" + first[:40] + "\n" + rest  # a line cut short while the table changed
    assert len(parse_proc_net(torn, "tcp")) == 2
    garbled = TCP.replace("0100007F:AE46", "XX00007F:AE46", 1)
    assert [e.inode for e in parse_proc_net(garbled, "tcp")] == [1195163, 1195165]


def test_unknown_table() -> None:
    with pytest.raises(ValueError):
        parse_proc_net(TCP, "raw")


# --- /proc/PID files -----------------------------------------------------------------------------

# The process above renamed itself "we(i)rd )x": parentheses and a space inside the parentheses.
# fmt: off
STAT = ("27813 (we(i)rd )x) S 27809 27805 20077 0 -1 4194560 1493 0 0 0 1 0 0 0 20 0 1 0 685278 "
        "15843328 2534 18446744073709551615 4321280 7148169 140720547357328 0 0 0 0 16781312 2 1 0 "
        "0 17 0 0 0 0 0 0 9723336 11027064 1071251456 140720547358659 140720547359450 "
        "140720547359450 140720547360743 0\n")
STATUS = ("Name:\twe(i)rd )x\nUmask:\t0022\nState:\tS (sleeping)\nTgid:\t27813\nNgid:\t0\n"
          "Pid:\t27813\nPPid:\t27809\nTracerPid:\t0\nUid:\t61234\t61234\t61234\t61234\n")
# fmt: on
CMDLINE = b"/usr/bin/python3\0-c\0import os\0arg with space\0\xc3\xbc\0"


def test_stat() -> None:
    assert parse_stat(STAT) == ProcStat(27813, "we(i)rd )x", "S", 27809, 685278)


@pytest.mark.parametrize("bad", ["", "27813 we S 1", "27813 (x) S 1 2 3", "x (y) S 1" + " 0" * 20])
def test_stat_garbage(bad: str) -> None:
    with pytest.raises(ValueError):
        parse_stat(bad)


def test_status_ppid() -> None:
    assert parse_status_ppid(STATUS) == 27809
    with pytest.raises(ValueError):
        parse_status_ppid("Name:\tx\n")


def test_cmdline() -> None:
    assert parse_cmdline(CMDLINE) == [
        "/usr/bin/python3",
        "-c",
        "import os",
        "arg with space",
        "ü",
    ]
    assert parse_cmdline(b"") == []  # a kernel thread, or a zombie
    assert parse_cmdline(b"a\0\xff\0") == ["a", "\\xff"]
    assert parse_cmdline(b"no-terminator") == ["no-terminator"]  # setproctitle() may drop it


@pytest.mark.parametrize(
    ("link", "inode"),
    [
        ("socket:[1195164]", 1195164),
        ("pipe:[1195155]", None),
        ("/dev/null", None),
        ("socket:[]", None),
        ("socket:[12x]", None),
        ("anon_inode:[eventpoll]", None),
    ],
)
def test_socket_links(link: str, inode: int | None) -> None:
    assert parse_socket_link(link) == inode


# --- sock_diag -----------------------------------------------------------------------------------


def test_tcp_request_asks_with_the_local_end_first() -> None:
    # fmt: off
    assert pack_diag_request("tcp", "10.79.0.2", 40000, "10.79.0.1", 80, seq=1) == bytes.fromhex(
        "48000000" "1400" "0100" "01000000" "00000000"  # nlmsghdr: 72 bytes, SOCK_DIAG_BY_FAMILY,
        #                                                 NLM_F_REQUEST, seq 1, port 0
        "02" "06" "00" "00" "ffffffff"                 # AF_INET, IPPROTO_TCP, no ext, all states
        "9c40" "0050"                                  # sport 40000, dport 80 (network order)
        "0a4f0002" + "00" * 12 +                       # src 10.79.0.2 (the guest's end)
        "0a4f0001" + "00" * 12 +                       # dst 10.79.0.1
        "00000000" "ffffffff" "ffffffff"               # any interface, INET_DIAG_NOCOOKIE
    )
    # fmt: on


def test_udp_request_asks_as_the_reply_would_be_looked_up() -> None:
    udp = pack_diag_request("udp", "10.79.0.2", 40000, "10.79.0.1", 53)
    assert udp[16:18] == bytes([2, 17])
    assert udp[24:28] == bytes.fromhex("00359c40")  # the remote end first
    assert udp[28:32] == bytes([10, 79, 0, 1]) and udp[44:48] == bytes([10, 79, 0, 2])


def test_mixed_families_are_asked_as_v6_with_the_v4_end_mapped() -> None:
    req = pack_diag_request("tcp", "127.0.0.1", 1, "::1", 2)
    assert req[16] == 10
    assert req[28:44] == bytes(10) + b"\xff\xff" + bytes([127, 0, 0, 1])
    assert req[44:60] == bytes(15) + b"\x01"


@pytest.mark.parametrize(
    ("args", "problem"),
    [(("icmp", "10.0.0.1", 1, "10.0.0.2", 2), "tcp or udp"), (("tcp", "x", 1, "::1", 2), "'x'")],
)
def test_bad_requests(args: tuple[str, str, int, str, int], problem: str) -> None:
    with pytest.raises(ValueError, match=problem):
        pack_diag_request(*args)


# Answers read off the socket (the requests of the captures above, seq 11..15).
# fmt: off
DIAG_TCP4 = bytes.fromhex(
    "7c000000" "1400" "0000" "0b000000" "a16c0000"  # nlmsghdr: 124 bytes, type 20, seq 11
    "02" "01" "00" "00"                              # AF_INET, ESTABLISHED, no timer, no retrans
    "ae46" "115c"                                    # sport 44614, dport 4444
    "7f000001" + "00" * 12 + "7f000001" + "00" * 12 +  # src, dst
    "00000000" "94140000" "00000000"                 # if 0, cookie
    "00000000" "00000000" "00000000"                 # expires, rqueue, wqueue
    "32ef0000"                                       # uid 61234
    "9c3c1200"                                       # inode 1195164
    "0500080000000000" "08000f0000000000" "0c0015000100000000000000" "0600160052000000"  # attrs
)
DIAG_TCP_MAPPED = bytes.fromhex(
    "7c000000140000000c000000a16c00000a0100009808115e00000000000000000000ffff7f000001000000"
    "00000000000000ffff7f00000100000000951400000000000000000000000000000000000032ef00009f3c"
    "1200050008000000000008000f00000000000c00150001000000000000000600160012000000"
)
DIAG_UDP6 = bytes.fromhex(
    "7c000000140000000e000000a16c00000a010000abb700350000000000000000000000000000000100000000"
    "00000000000000000000000100000000971400000000000000000000000000000000000032ef0000a33c1200"
    "050008000000000008000f00000000000c00150001000000000000000600160010000000"
)
DIAG_MISSING = bytes.fromhex(
    "5c000000" "0200" "0000" "0f000000" "a16c0000"  # NLMSG_ERROR, seq 15
    "feffffff"                                       # -ENOENT: no such socket
    "48000000140001000f0000000000000002060000ffffffff0001115c7f00000100000000000000000000"
    "00007f00000100000000000000000000000000000000ffffffffffffffff"  # the request, echoed
)
# fmt: on


def test_diag_answers() -> None:
    assert parse_diag_reply(DIAG_TCP4, seq=11) == (1195164, 61234, 1)
    assert parse_diag_reply(DIAG_TCP4) == (1195164, 61234, 1)
    # the v4-mapped connection's socket is AF_INET6; asked as v4 or v6, the same inode
    assert parse_diag_reply(DIAG_TCP_MAPPED, seq=12) == (1195167, 61234, 1)
    assert parse_diag_reply(DIAG_UDP6, seq=14) == (1195171, 61234, 1)
    assert parse_diag_reply(DIAG_MISSING, seq=15) == -errno.ENOENT


def test_diag_answer_to_another_question_is_skipped() -> None:
    assert parse_diag_reply(DIAG_TCP4, seq=12) is None
    assert parse_diag_reply(DIAG_TCP4 + DIAG_TCP_MAPPED, seq=12) == (1195167, 61234, 1)


def test_diag_answer_cut_anywhere_is_malformed() -> None:
    for cut in range(1, len(DIAG_TCP4)):
        with pytest.raises(NetlinkParseError):
            parse_diag_reply(DIAG_TCP4[:cut])


def test_diag_answer_too_short_for_its_type() -> None:
    body = DIAG_TCP4[16:56]  # an inet_diag_msg cut inside its sockid
    short = struct.pack("=IHHII", 16 + len(body), 20, 0, 11, 0) + body
    with pytest.raises(NetlinkParseError):
        parse_diag_reply(short)


# --- roles ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("exes", "reached", "role"),
    [
        (["curl", "dash", "bwrap", "bwrap"], True, Role.TOOL),
        (["python3.11", "bwrap", "bwrap"], True, Role.FRAMEWORK),  # also any of its threads
        (["node", "bwrap", "bwrap", "setpriv"], True, Role.FRAMEWORK),
        (["bwrap", "bwrap"], True, Role.LAUNCHER),
        (["curl"], True, Role.FRAMEWORK),  # the root itself is the command
        (["python3.11", "dash"], True, Role.TOOL),  # no launcher in the chain
        (["curl", "bwrap", "bwrap", "node", "bwrap", "bwrap"], True, Role.TOOL),  # nested sandbox
        (["bwrap", "node", "bwrap", "bwrap"], True, Role.TOOL),  # a tool that is a launcher
        ([None, "dash", "bwrap"], True, Role.TOOL),  # exe unreadable: not a launcher
        (["curl", "dash"], False, Role.OUTSIDE),
        ([], True, Role.OUTSIDE),
    ],
)
def test_roles(exes: list[str | None], reached: bool, role: Role) -> None:
    assert classify_chain(exes, reached) is role


def test_launchers_are_what_sandbox_bwrap_runs() -> None:
    assert {"nsenter", "setpriv", "bwrap"} <= LAUNCHERS


def test_details_are_json() -> None:
    chain = [(7, "curl"), (5, "sh")]
    info = ProcInfo(7, "/usr/bin/curl", ["curl", "-s"], chain, Role.TOOL, 9, 1, ("/usr/bin/dash",))
    assert info.details() == {
        "pid": 7,
        "exe": "/usr/bin/curl",
        "cmdline": ["curl", "-s"],
        "chain": [[7, "curl"], [5, "sh"]],
        "parents": ["/usr/bin/dash"],
        "role": "tool",
    }


# --- ProcessFinder on a fake /proc ---------------------------------------------------------------


def _line(sl: int, local: str, remote: str, st: str, inode: int) -> str:
    return f"{sl:4}: {local} {remote} {st} 00000000:00000000 00:00000000 00000000 61000 0 {inode} 1"


HEADER = "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode"  # noqa: E501
# the guest 10.79.0.2 (0200 4F0A) to 10.79.0.1 (0100 4F0A): TCP 40000 -> 80, UDP *:40001
FAKE_TCP = "\n".join([HEADER, _line(0, "02004F0A:9C40", "01004F0A:0050", "02", 555)]) + "\n"
FAKE_UDP = "\n".join([HEADER, _line(0, "00000000:9C41", "00000000:0000", "07", 556)]) + "\n"


class FakeProc:
    def __init__(self, root: Path) -> None:
        self.root = root / "proc"
        self.root.mkdir()
        self.guest = root / "guest-netns"
        self.host = root / "host-netns"
        self.guest.write_text("")
        self.host.write_text("")
        self.start = 1000

    @property
    def inode(self) -> int:
        return os.stat(self.guest).st_ino

    def add(
        self,
        pid: int,
        comm: str,
        ppid: int,
        exe: str,
        fds: dict[int, str] | None = None,
        argv: list[str] | None = None,
        guest: bool = True,
        tgid: int | None = None,
    ) -> None:
        d = self.root / str(pid)
        (d / "ns").mkdir(parents=True)
        os.link(self.guest if guest else self.host, d / "ns" / "net")
        self.start += 1
        zeros = " ".join(["0"] * 17)
        (d / "stat").write_text(f"{pid} ({comm}) S {ppid} {zeros} {self.start} 0 0\n")
        (d / "status").write_text(f"Name:\t{comm}\nTgid:\t{tgid or pid}\nPPid:\t{ppid}\n")
        (d / "exe").symlink_to(exe)
        (d / "cmdline").write_bytes(b"".join(a.encode() + b"\0" for a in (argv or [comm])))
        (d / "fd").mkdir()
        for n, target in {0: "/dev/null", 1: "pipe:[1]", **(fds or {})}.items():
            (d / "fd" / str(n)).symlink_to(target)
        (d / "net").mkdir()
        for table, text in (
            ("tcp", FAKE_TCP),
            ("udp", FAKE_UDP),
            ("tcp6", HEADER),
            ("udp6", HEADER),
        ):
            (d / "net" / table).write_text(text)

    def replace(self, pid: int) -> None:
        """The process exits and its pid goes to the next one: a new /proc entry (the old one
        is kept aside, so the file system cannot hand its inode number straight back)."""
        (self.root / str(pid)).rename(self.root / f"gone-{pid}")

    def remove(self, pid: int) -> None:
        d = self.root / str(pid)
        for p in sorted(d.rglob("*"), key=lambda p: len(p.parts), reverse=True):
            p.rmdir() if p.is_dir() and not p.is_symlink() else p.unlink()
        d.rmdir()

    def last_pid(self, pid: int) -> None:
        (self.root / "sys" / "kernel").mkdir(parents=True, exist_ok=True)
        (self.root / "sys" / "kernel" / "ns_last_pid").write_text(f"{pid}\n")


@pytest.fixture
def fake(tmp_path: Path) -> FakeProc:
    """bwrap (100) -> bwrap (101) -> sh (102) -> curl (103, holds socket 555), and a process of
    the host (200) holding an unrelated socket."""
    f = FakeProc(tmp_path)
    f.add(100, "bwrap", 1, "/usr/bin/bwrap")
    f.add(101, "bwrap", 100, "/usr/bin/bwrap")
    f.add(102, "sh", 101, "/usr/bin/dash", argv=["sh", "-c", "curl http://10.79.0.1/; true"])
    f.add(103, "curl", 102, "/usr/bin/curl", {3: "socket:[555]"}, ["curl", "http://10.79.0.1/"])
    f.add(200, "sshd", 1, "/usr/sbin/sshd", {3: "socket:[900]"}, guest=False)
    return f


def test_finds_the_tool_and_its_chain(fake: FakeProc) -> None:
    finder = ProcessFinder(fake.inode, 100, proc=str(fake.root))
    info = finder.find("tcp", 40000, "10.79.0.1", 80)
    assert info == ProcInfo(
        pid=103,
        exe="/usr/bin/curl",
        cmdline=["curl", "http://10.79.0.1/"],
        chain=[(103, "curl"), (102, "sh"), (101, "bwrap"), (100, "bwrap")],
        role=Role.TOOL,
        inode=555,
        uid=61000,
        parents=("/usr/bin/dash", "/usr/bin/bwrap", "/usr/bin/bwrap"),  # for `under` rules
    )
    assert finder.processes() == [103, 102, 101, 100]
    assert (finder.stats.lookups, finder.stats.found) == (1, 1)


def test_the_top_command_is_the_framework(fake: FakeProc) -> None:
    (fake.root / "103" / "fd" / "3").unlink()
    (fake.root / "102" / "fd" / "5").symlink_to("socket:[555]")
    info = ProcessFinder(fake.inode, 100, proc=str(fake.root)).find("tcp", 40000, "10.79.0.1", 80)
    assert info is not None
    assert (info.pid, info.role, info.cmdline[0]) == (102, Role.FRAMEWORK, "sh")


def test_without_a_root_the_chain_stops_at_the_namespace_edge(fake: FakeProc) -> None:
    fake.add(99, "nsenter", 1, "/usr/bin/nsenter", guest=False)  # bwrap's parent, outside
    stat = fake.root / "100" / "stat"
    stat.write_text(stat.read_text().replace(" S 1 ", " S 99 "))
    info = ProcessFinder(fake.inode, None, proc=str(fake.root)).find("tcp", 40000, "10.79.0.1", 80)
    assert info is not None
    assert [pid for pid, _ in info.chain] == [103, 102, 101, 100]
    assert info.role == Role.TOOL


def test_a_process_outside_the_tree(fake: FakeProc) -> None:
    (fake.root / "103" / "fd" / "3").unlink()
    fake.add(300, "ip", 1, "/usr/bin/python3.11", {4: "socket:[555]"})  # e.g. `ip netns exec`
    info = ProcessFinder(fake.inode, 100, proc=str(fake.root)).find("tcp", 40000, "10.79.0.1", 80)
    assert info is not None
    assert (info.pid, info.role, info.chain) == (300, Role.OUTSIDE, [(300, "ip")])


def test_unconnected_udp_from_the_tables(fake: FakeProc) -> None:
    (fake.root / "103" / "fd" / "4").symlink_to("socket:[556]")
    info = ProcessFinder(fake.inode, 100, proc=str(fake.root)).find("udp", 40001, "10.79.0.1", 53)
    assert info is not None and (info.pid, info.inode) == (103, 556)


def test_gone_socket_and_gone_holder(fake: FakeProc) -> None:
    finder = ProcessFinder(fake.inode, 100, proc=str(fake.root))
    assert finder.find("tcp", 40001, "10.79.0.1", 80) is None  # no such socket
    assert finder.find("icmp", 0, "10.79.0.1", 0) is None
    fake.remove(103)  # the socket is still in the table, its holder has exited
    assert finder.find("tcp", 40000, "10.79.0.1", 80) is None
    assert (finder.stats.no_socket, finder.stats.no_holder, finder.stats.found) == (2, 1, 0)


def test_a_socket_seen_before_is_not_searched_again(fake: FakeProc) -> None:
    finder = ProcessFinder(fake.inode, 100, proc=str(fake.root))
    assert finder.find("tcp", 40000, "10.79.0.1", 80) is not None
    read = finder.stats.fds_read
    again = finder.find("tcp", 40000, "10.79.0.1", 80)
    assert again is not None and again.pid == 103
    assert (finder.stats.cache_hits, finder.stats.fds_read) == (1, read)
    # the same pid, the socket moved on: the cached holder is checked, not trusted
    (fake.root / "103" / "fd" / "3").unlink()
    (fake.root / "102" / "fd" / "3").symlink_to("socket:[555]")
    moved = finder.find("tcp", 40000, "10.79.0.1", 80)
    assert moved is not None and moved.pid == 102


def test_a_reused_pid_is_checked_again(fake: FakeProc) -> None:
    finder = ProcessFinder(fake.inode, 100, proc=str(fake.root))
    assert 103 in finder.processes()
    fake.replace(103)
    fake.add(103, "sshd", 1, "/usr/sbin/sshd", guest=False)  # same pid, another process
    assert 103 not in finder.processes()
    fake.replace(200)
    fake.add(200, "curl", 102, "/usr/bin/curl", {3: "socket:[555]"})  # and the other way round
    assert 200 in finder.processes()


def test_new_pids_are_probed_without_listing(fake: FakeProc) -> None:
    fake.last_pid(200)
    finder = ProcessFinder(fake.inode, 100, proc=str(fake.root))
    assert finder.processes() == [103, 102, 101, 100]  # the first look lists /proc
    fake.add(201, "wget", 102, "/usr/bin/wget")
    fake.add(202, "wget", 102, "/usr/bin/wget", tgid=201)  # a thread of 201: not a process
    fake.add(203, "sshd", 1, "/usr/sbin/sshd", guest=False)
    fake.last_pid(203)
    checked = finder.stats.processes_checked
    assert finder.processes() == [201, 103, 102, 101, 100]
    assert finder.stats.processes_checked - checked == 3  # 201..203, nothing else
    fake.remove(201)  # an exit is noticed when its fds are scanned
    fake.last_pid(203)
    assert finder.find("tcp", 40000, "10.79.0.1", 80) is not None
    assert 201 not in finder.processes()


def test_the_last_holder_is_tried_first_and_a_reused_pid_is_described_anew(
    fake: FakeProc,
) -> None:
    finder = ProcessFinder(fake.inode, 100, proc=str(fake.root))
    first = finder.find("tcp", 40000, "10.79.0.1", 80)
    assert first is not None and first.pid == 103
    # the socket under another number (as a stub resolver's next one): the last holder first
    (fake.root / "103" / "fd" / "3").unlink()
    (fake.root / "103" / "fd" / "7").symlink_to("socket:[555]")
    read = finder.stats.fds_read
    again = finder.find("tcp", 40000, "10.79.0.1", 80)
    assert again == first and finder.stats.recent_hits == 1
    assert finder.stats.fds_read - read == 1  # the new descriptor read first, then no more
    # (b) the pid reused by a new process (another start, another program) of the guest
    fake.replace(103)
    fake.add(103, "wget", 102, "/usr/bin/wget", {3: "socket:[555]"}, ["wget", "x"])
    reused = finder.find("tcp", 40000, "10.79.0.1", 80)
    assert reused is not None
    assert (reused.exe, reused.cmdline, reused.chain[0]) == (
        "/usr/bin/wget",
        ["wget", "x"],
        (103, "wget"),
    )
    # ... and by a process of the host: not the guest's, as a cold lookup says
    fake.remove(103)
    fake.add(103, "sshd", 1, "/usr/sbin/sshd", {3: "socket:[555]"}, guest=False)
    assert finder.find("tcp", 40000, "10.79.0.1", 80) is None
    assert (
        ProcessFinder(fake.inode, 100, proc=str(fake.root)).find("tcp", 40000, "10.79.0.1", 80)
        is None
    )


def test_new_pids_newest_first_the_rest_pending(fake: FakeProc) -> None:
    fake.last_pid(200)
    finder = ProcessFinder(fake.inode, 100, proc=str(fake.root))
    assert finder.processes() == [103, 102, 101, 100]
    (fake.root / "103" / "fd" / "3").unlink()
    fake.add(201, "sh", 102, "/usr/bin/dash")
    fake.add(202, "sleep", 201, "/usr/bin/sleep")
    fake.add(203, "curl", 201, "/usr/bin/curl", {3: "socket:[555]"})
    fake.last_pid(203)
    # as sock_diag answers (the fake has no /proc/net read then, which would list the pids)
    finder.socket_inode = lambda *_: (555, 61000)  # type: ignore[method-assign]
    checked = finder.stats.processes_checked
    info = finder.find("tcp", 40000, "10.79.0.1", 80, "10.79.0.2")
    assert info is not None and [p for p, _ in info.chain] == [203, 201, 102, 101, 100]
    assert finder.stats.processes_checked - checked == 1  # 203 alone; 201 and 202 wait
    assert finder.processes() == [203, 202, 201, 103, 102, 101, 100]
