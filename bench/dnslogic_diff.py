"""Differential check of dnslogic's fast readers against its dnspython path.

    python -m bench.dnslogic_diff [SEED] [COUNT] [MUTATION_RATE]     (bench/run's PYTHONPATH)

Generates queries (odd labels, escapes, EDNS with and without options, other types, the root)
and upstream answers (A/CNAME/AAAA/TXT/SOA, TTLs above 2^31, compression), mutates a share of
them byte-wise, and checks that whatever the fast readers accept, dnspython accepts and reads
the same: question id/name/type, the upstream query and empty/blocked answers byte for byte,
and judged answers (addresses, TTL, rcode, refusal, and an equal message). Prints how many
took each path; raises AssertionError on the first difference.
"""

from __future__ import annotations

import random
import sys
from typing import Any

import dns.edns
import dns.flags
import dns.message
import dns.name
import dns.rcode
import dns.rrset

from sandgate.gateway.dns import dnslogic as L

FAST_Q, FAST_A = L._fast_question, L._fast_answer


def ref_parse(wire: bytes) -> L.Question:
    L._fast_question = lambda w: None  # type: ignore[assignment]
    try:
        return L.parse_question(wire)
    finally:
        L._fast_question = FAST_Q


def ref_judge(q: L.Question, up: bytes, check: Any) -> L.Answer:
    L._fast_answer = lambda w: None  # type: ignore[assignment]
    try:
        return L.judge_answer(q, up, check)
    finally:
        L._fast_answer = FAST_A


class Diff:
    def __init__(self, seed: int, mutation: float) -> None:
        self.rnd = random.Random(seed)
        self.mutation = mutation
        self.stats = {
            "query_fast": 0,
            "query_dnspython": 0,
            "answer_fast": 0,
            "answer_dnspython": 0,
        }

    def label(self) -> str:
        r = self.rnd.random()
        if r < 0.05:
            return "".join(self.rnd.choice("a\\. @*é$") for _ in range(self.rnd.randint(1, 5)))
        if r < 0.07:
            return "x" * self.rnd.randint(60, 63)
        return "".join(self.rnd.choice("abcXYZ019-_") for _ in range(self.rnd.randint(1, 12)))

    def name(self) -> dns.name.Name:
        n = 40 if self.rnd.random() < 0.02 else self.rnd.randint(0, 5)
        labels = [self.label() for _ in range(n)]
        try:
            return dns.name.from_text(".".join(labels) + ".") if labels else dns.name.root
        except Exception:
            return dns.name.from_text("fallback.example.")

    def mutate(self, wire: bytes) -> bytes:
        w = bytearray(wire)
        r = self.rnd.random()
        if r < 0.3 and len(w) > 1:
            del w[self.rnd.randrange(len(w)) :]
        elif r < 0.7 and w:
            w[self.rnd.randrange(len(w))] = self.rnd.randrange(256)
        else:
            w += bytes(self.rnd.randrange(256) for _ in range(self.rnd.randint(1, 3)))
        return bytes(w)

    def query(self, wire: bytes) -> L.Question | None:
        try:
            ref: L.Question | None = ref_parse(wire)
        except L.Malformed:
            ref = None
        fast = FAST_Q(wire)
        if fast is None:
            self.stats["query_dnspython"] += 1
            return ref
        self.stats["query_fast"] += 1
        assert ref is not None, ("fast accepted what dnspython refused", wire.hex())
        assert (fast.id, fast.name, fast.qtype) == (ref.id, ref.name, ref.qtype), wire.hex()
        qid = self.rnd.randrange(65536)
        assert L.query_for_upstream(fast, qid) == L.query_for_upstream(ref, qid), wire.hex()
        assert L.empty(fast) == L.empty(ref), wire.hex()
        assert L.blocked(fast, "deny.x") == L.blocked(ref, "deny.x"), wire.hex()
        return fast

    def answer(self, q: L.Question, up: bytes) -> None:
        verdicts: dict[Any, str | None] = {}

        def check(address: Any) -> str | None:
            if address not in verdicts:
                verdicts[address] = "deny.rebinding" if self.rnd.random() < 0.1 else None
            return verdicts[address]

        ref = ref_judge(q, up, check)
        if FAST_A(up) is None:
            self.stats["answer_dnspython"] += 1
            return
        self.stats["answer_fast"] += 1
        got = L.judge_answer(q, up, check)
        assert ref.rcode != dns.rcode.SERVFAIL or got.rcode == ref.rcode, up.hex()
        mine = (got.addresses, got.ttl, got.rcode, got.refused, got.refused_address)
        theirs = (ref.addresses, ref.ttl, ref.rcode, ref.refused, ref.refused_address)
        assert mine == theirs, (mine, theirs, up.hex())
        if got.refused is not None:
            assert got.wire == ref.wire, up.hex()
            return
        m1, m2 = dns.message.from_wire(got.wire), dns.message.from_wire(ref.wire)
        assert m1 == m2 and (m1.id, m1.flags, m1.ednsflags, m1.payload) == (
            m2.id,
            m2.flags,
            m2.ednsflags,
            m2.payload,
        ), up.hex()
        assert (m1.answer, m1.authority, m1.additional) == (m2.answer, m2.authority, m2.additional)

    def one(self) -> None:
        rnd = self.rnd
        rdtype: Any = rnd.choice(["A", "A", "AAAA", "TXT", "MX", "PTR", "ANY", 65000])
        edns = rnd.choice([None, 0, 0, 1])
        cookie: list[dns.edns.Option] = [dns.edns.CookieOption(b"12345678", b"")]
        opts = cookie if edns == 0 and rnd.random() < 0.3 else None
        try:
            m = dns.message.make_query(
                self.name(), rdtype, use_edns=edns, options=opts, want_dnssec=rnd.random() < 0.2
            )
        except Exception:
            return
        m.id = rnd.randrange(65536)
        if rnd.random() < 0.1:
            m.flags |= dns.flags.CD
        if rnd.random() < 0.05:
            m.flags &= ~dns.flags.RD
        wire = m.to_wire()
        q = self.query(self.mutate(wire) if rnd.random() < 0.25 else wire)
        if q is None:
            return
        up = dns.message.from_wire(L.query_for_upstream(q, 4242))
        r = dns.message.make_response(up)
        r.flags |= dns.flags.RA
        if rnd.random() < 0.1:
            r.set_rcode(dns.rcode.NXDOMAIN)
        for _ in range(rnd.randint(0, 3)):
            kind = rnd.choice(["A", "A", "A", "CNAME", "AAAA", "TXT"])
            owner = up.question[0].name if rnd.random() < 0.7 else dns.name.from_text("o.example.")
            ttl = rnd.choice([0, 5, 300, 86400, 1234567])
            values = {
                "A": [f"{rnd.choice([203, 10, 127, 8])}.0.0.{rnd.randint(1, 3)}" for _ in range(2)],
                "CNAME": ["target.example."],
                "AAAA": ["2001:db8::1"],
                "TXT": ['"hi"'],
            }[kind]
            r.answer.append(dns.rrset.from_text(owner, ttl, "IN", kind, *values))
        if rnd.random() < 0.2:
            soa = "ns.example. h.example. 1 2 3 4 5"
            r.authority.append(dns.rrset.from_text("example.", 60, "IN", "SOA", soa))
        try:
            upw = r.to_wire()
        except Exception:
            return
        if rnd.random() < 0.3:  # raw TTLs above 2^31, which dnspython reads as 0
            upw = upw.replace((1234567).to_bytes(4, "big"), (2**31 + 5).to_bytes(4, "big"))
        self.answer(q, self.mutate(upw) if rnd.random() < self.mutation else upw)


def main(argv: list[str]) -> int:
    seed = int(argv[0]) if argv else 1
    count = int(argv[1]) if len(argv) > 1 else 20_000
    diff = Diff(seed, float(argv[2]) if len(argv) > 2 else 0.2)
    for _ in range(count):
        diff.one()
    print(diff.stats)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
