"""A large policy loads and compiles in linear time (issue 11: 100,000 rules on one host).

Both were quadratic: the repeat check compared each rule with every earlier one, and each
verdict site counted the sites made before it to number itself. 30,000 rules took minutes."""

from __future__ import annotations

import ipaddress
import time
from pathlib import Path
from typing import Any

from sandgate.net.compile import GuestLink, guest_add
from sandgate.policy.load import load_policy

RULES = 30_000


def _policy(path: Path, n: int, repeat: bool = False) -> None:
    lines = ['[gateway]\ndefault_profile = "big"', "[profiles.big]", 'internet = "allowlist"']
    lines.append("allow = [")
    for i in range(n // 2):
        lines.append(f'  {{ domain = "d{i}.rules.example", port = 443 }},')
        lines.append(f'  {{ cidr = "11.{i // 256 % 256}.{i % 256}.0/24" }},')
    if repeat:
        lines.append('  { domain = "D7.Rules.Example", port = 443 },')
    lines.append("]")
    path.write_text("\n".join(lines) + "\n")


def test_thirty_thousand_rules_load_and_compile_in_seconds(tmp_path: Path) -> None:
    path = tmp_path / "big.toml"
    _policy(path, RULES)
    started = time.monotonic()
    profile = load_policy(str(path)).profile()
    link = GuestLink.from_pool(ipaddress.ip_network("10.201.0.0/16"), 0, "02:00:00:00:00:01")
    cmds, sites = guest_add(link, profile)
    took = time.monotonic() - started
    assert len(profile.allow) == RULES
    assert len({s.prefix for s in sites.values()}) == len(sites)  # numbered uniquely
    # The CIDR rules (disjoint, one scope) share one interval set and one site.
    groups = [s.group for s in sites.values() if s.group is not None]
    assert [len(g.rules) for g in groups] == [RULES // 2], [len(g.rules) for g in groups]
    # The domain rules (one list, one scope) share one pin set and one site (policy/pins.py).
    pin_sites = [s.pins for s in sites.values() if s.pins is not None]
    assert [len(p.rules) for p in pin_sites] == [RULES // 2], [len(p.rules) for p in pin_sites]
    assert len(sites) < 100 and len(cmds) < 300, (len(sites), len(cmds))
    assert took < 30, f"{RULES} rules took {took:.1f} s"  # linear: ~5 s; quadratic: minutes


def test_a_repeat_among_many_is_still_named(tmp_path: Path) -> None:
    from sandgate.policy.load import PolicyError

    path = tmp_path / "big.toml"
    _policy(path, 2_000, repeat=True)
    try:
        load_policy(str(path))
    except PolicyError as exc:
        text = str(exc)
    else:
        raise AssertionError("the repeated rule was not reported")
    assert "big.allow[2000]" in text and "repeats big.allow[14]" in text, text


def test_the_special_block_shortcut_never_skips_a_special_rule() -> None:
    """``touches_special`` lets the compiler skip ``inner_special``/``is_exemption`` for a
    network that overlaps no special block; it must never say no where they would say yes."""
    from sandgate.policy.classify import BLOCKS
    from sandgate.policy.exemptions import inner_special, is_exemption, touches_special

    nets: set[ipaddress.IPv4Network] = set()
    for blk in BLOCKS:
        if not isinstance(blk.network, ipaddress.IPv4Network):
            continue
        lo, hi = int(blk.network.network_address), int(blk.network.broadcast_address)
        for value in (lo - 1, lo, hi, hi + 1):
            for length in (0, 1, 8, 12, 16, 24, 31, 32):
                if 0 <= value < 2**32:
                    nets.add(ipaddress.IPv4Network((value, length), strict=False))
    skipped = [n for n in nets if not touches_special(n)]
    assert skipped, "every network touches a special block: the test tests nothing"
    for net in skipped:
        assert not inner_special(net) and not is_exemption(net), net


def test_a_grouped_sites_log_line_names_the_rule_of_its_address(tmp_path: Path) -> None:
    """The NFLOG reader turns a grouped site's line into an event naming the address's rule."""
    from sandgate.gateway.logs.logreader import gateway_event
    from sandgate.net.nflog import NflogPacket

    path = tmp_path / "big.toml"
    _policy(path, 200)
    profile = load_policy(str(path)).profile()
    link = GuestLink.from_pool(ipaddress.ip_network("10.201.0.0/16"), 0, "02:00:00:00:00:01")
    _, sites = guest_add(link, profile)
    site = next(s for s in sites.values() if s.group is not None)
    pkt = NflogPacket(
        group=2, prefix=site.prefix, hook=None, family=2, indev=None, outdev=None, uid=None,
        gid=None, seq=None, seq_global=None, timestamp=None, proto=6, src=str(link.guest),
        dst="11.0.37.9", sport=40000, dport=8000, tcp_flags=2, icmp_type=None, icmp_code=None,
        length=60, mark=None,
    )  # fmt: skip
    _, event = gateway_event(pkt, site, lambda src: None)
    assert (event.verdict, event.rule) == ("allow", "big.allow[75] (11.0.37.0/24)"), event


def test_the_pool_check_by_numbers_is_subnet_of() -> None:
    """``_inside`` (the guest-pool check of 100,000 rules) answers as ``subnet_of``."""
    from hypothesis import given
    from hypothesis import strategies as st

    from sandgate.policy.load import _inside

    nets = st.builds(
        lambda a, n: ipaddress.ip_network((a, n), strict=False),
        st.sampled_from([0, 0x0AC90000, 0x0AC9FFFF, 0x0A000000, 0x0AC80000, 0xFFFFFFFF]),
        st.integers(0, 32),
    )

    @given(nets, nets)
    def agree(net: ipaddress.IPv4Network, pool: ipaddress.IPv4Network) -> None:
        assert _inside(net, pool) == net.subnet_of(pool), (net, pool)

    agree()
    v6 = ipaddress.ip_network("::/0")
    assert not _inside(v6, ipaddress.ip_network("0.0.0.0/0"))


def test_the_plain_cidr_shortcut_reads_as_ip_network() -> None:
    """``_cidr_network``'s dotted-quad shortcut (100,000 rules) gives ip_network's network, and
    leaves every other spelling, and every error message, to the slow way."""
    from hypothesis import example, given
    from hypothesis import strategies as st

    from sandgate.policy.model import _cidr_network, _cidr_network_slow

    def outcome(read: Any, text: str) -> object:
        try:
            return read(text)
        except ValueError as exc:
            return ("error", str(exc))

    @given(st.text(alphabet="0123456789./ ١", min_size=1, max_size=20))
    @example("11.1.2.0/24")
    @example("011.1.2.0/24")
    @example("11.1.2.1/24")
    @example("256.1.2.0/24")
    @example("0.0.0.0/0")
    @example("1.2.3.4/32")
    @example("1.2.3.4/33")
    @example("1.2.3.0/024")
    def agree(text: str) -> None:
        _cidr_network.cache_clear()
        assert outcome(_cidr_network, text) == outcome(_cidr_network_slow, text), text

    agree()


def test_the_special_block_bisection_is_the_scan() -> None:
    """``touches_special`` (one bisection of the blocks' union) says what a scan of every
    special block says, at and around each block's edges."""
    from hypothesis import given
    from hypothesis import strategies as st

    from sandgate.policy.classify import BLOCKS
    from sandgate.policy.exemptions import touches_special

    v4 = [b.network for b in BLOCKS if isinstance(b.network, ipaddress.IPv4Network)]
    edges = sorted(
        {e + d for n in v4 for e in (int(n.network_address), int(n.broadcast_address))
         for d in (-1, 0, 1) if 0 <= e + d < 2**32}
    )  # fmt: skip

    def scan(net: ipaddress.IPv4Network) -> bool:
        return any(net.overlaps(n) for n in v4)

    for value in edges:
        for length in (0, 4, 8, 12, 16, 24, 31, 32):
            net = ipaddress.IPv4Network((value, length), strict=False)
            assert touches_special(net) == scan(net), net

    @given(st.integers(0, 2**32 - 1), st.integers(0, 32))
    def agree(value: int, length: int) -> None:
        net = ipaddress.IPv4Network((value, length), strict=False)
        assert touches_special(net) == scan(net), net

    agree()


def test_touching_networks_of_a_group_are_one_interval() -> None:
    """A grouped set's elements (touching networks merged) hold exactly the group's networks."""
    from hypothesis import given
    from hypothesis import strategies as st

    from sandgate.net.compile import _intervals
    from tests.nfteval import elem_has

    @given(st.sets(st.integers(0, 63), max_size=40), st.sampled_from([24, 26, 30, 32]))
    def agree(picked: set[int], length: int) -> None:
        size = 1 << (32 - length)
        base = 0x0B000000
        nets = [ipaddress.IPv4Network((base + i * size, length)) for i in sorted(picked)]
        starts = [int(n.network_address) for n in nets]
        ends = [int(n.broadcast_address) for n in nets]
        elems = _intervals(starts, ends)
        assert len(elems) <= len(nets)
        for value in range(base - 1, base + 64 * size + 1, max(1, size // 4)):
            for v in (value, value + size - 1):
                address = ipaddress.IPv4Address(v)
                inside = any(address in n for n in nets)
                assert any(elem_has(e, address) for e in elems) == inside, (address, elems)

    agree()
    # touching networks are one element; a gap keeps two
    assert len(_intervals([0x0B000000, 0x0B000100], [0x0B0000FF, 0x0B0001FF])) == 1
    assert len(_intervals([0x0B000000, 0x0B000200], [0x0B0000FF, 0x0B0002FF])) == 2


def test_dead_allow_rules_are_found_by_index_as_by_scan() -> None:
    """``check_rules`` finds the deny rule that makes an allow rule dead through the index
    once the deny list is long; the same problems, in the same order, as the scan of every
    deny rule for every allow rule."""
    from hypothesis import given, settings
    from hypothesis import strategies as st

    from sandgate.errors import PolicyProblem
    from sandgate.policy import load
    from sandgate.policy.model import RuleSpec
    from sandgate.policy.profile import Rule

    targets = st.one_of(
        st.builds(
            lambda w, a, b: {"domain": ("*." if w else "") + ".".join(x for x in (a, b) if x)},
            st.booleans(),
            st.sampled_from(["", "a", "b.a"]),
            st.sampled_from(["x.com", "y.x.com", "com.x"]),
        ),
        st.builds(
            lambda n, length: {"cidr": str(ipaddress.IPv4Network((n << 24, length), strict=False))},
            st.integers(11, 13),
            st.sampled_from([8, 16, 24, 32]),
        ).map(lambda d: {"cidr": d["cidr"]}),
        st.builds(lambda n: {"cidr": f"11.0.{n}.0/24"}, st.integers(0, 3)),
    )
    specs = st.builds(
        lambda t, port: RuleSpec.model_validate({**t, **({"port": port} if port else {})}),
        targets,
        st.sampled_from([None, 443, 22]),
    )

    def where(ref: str) -> PolicyProblem:
        return PolicyProblem(ref, None, None, "")

    @settings(max_examples=150, deadline=None)
    @given(st.lists(specs, max_size=12), st.lists(specs, min_size=16, max_size=30))
    def agree(allow_specs: list[RuleSpec], deny_specs: list[RuleSpec]) -> None:
        allow = [Rule("allow", s, f"p.allow[{i}]") for i, s in enumerate(allow_specs)]
        deny = [Rule("deny", s, f"p.deny[{i}]") for i, s in enumerate(deny_specs)]
        fast = load.check_rules(allow, deny, where)
        original = load._blockers
        try:
            load._blockers = lambda rules: lambda rule: rules  # type: ignore[assignment]
            slow = load.check_rules(allow, deny, where)
        finally:
            load._blockers = original
        assert fast == slow

    agree()
