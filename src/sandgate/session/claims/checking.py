"""Holding each claim against the session's events and files."""

from __future__ import annotations

import re
from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace

from sandgate.events.schema import Event, Kind
from sandgate.session.claims.model import (
    Claim,
    ClaimKind,
    Evidence,
    FileFact,
    Finding,
    Verdict,
)
from sandgate.session.claims.reading import extract_claims
from sandgate.session.claims.vocabulary import (
    _DIST_INFO,
    _FORGES,
    _GIT_PATH,
    _GROWTH,
    _INDEX_ASKED,
    _INDEX_HOSTS,
    _INDEX_PATH,
    _LLM_PATH,
    _REFUSAL,
    _SHRINK,
    _SLACK,
    _TLS_SLACK,
    _bare,
    _same_site,
)

# -- reading the evidence --------------------------------------------------------------------


@dataclass(frozen=True)
class _Contact:
    """One http event or allowed connection, with the names its address was known by."""

    event: Event
    names: frozenset[str]
    via: str  # "http" (status and path visible) | "tunnel" (passthrough, CONNECT) | "conn"
    status: int | None
    path: str | None
    down: int | None  # bytes down; None when not recorded
    model: bool

    @property
    def allowed(self) -> bool:
        return self.event.verdict == "allow"

    @property
    def ok(self) -> bool:
        """Allowed, and something came back."""
        if not self.allowed:
            return False
        if self.via == "http":
            return self.status is not None and 200 <= self.status < 400
        return self.down is None or self.down > 0

    def matches(self, host: str) -> bool:
        return any(_same_site(host, n) for n in self.names)

    def say(self) -> str:
        e = self.event
        who = e.name or min(self.names - {e.dst}, default=None) or e.dst or "?"
        size = "? B" if self.down is None else f"{self.down} B"
        if self.via == "http":
            method = e.details.get("method") or "?"
            return f"http {method} {who}{self.path or ''} -> {self.status}, {size} down"
        if self.via == "tunnel":
            return f"tunnel to {who}:{e.port} ({size} down, status not visible)"
        return f"conn to {e.dst}:{e.port} ({who}) allowed"


def _listing(contacts: Sequence[_Contact]) -> str:
    more = f" and {len(contacts) - 3} more" if len(contacts) > 3 else ""
    return ", ".join(c.say() for c in contacts[:3]) + more


def _tally(events: Sequence[Event], label: str, key: str) -> str:
    def what(e: Event) -> str:
        if key == "dns":
            answered = "" if e.details.get("answers") else ", no answer"
            return f"{e.verdict or '?'}{f' {e.reason}' if e.reason else ''}{answered}"
        return f"{e.kind} {e.reason or 'deny'}"

    counts = Counter(what(e) for e in events).most_common()
    return f"{len(events)} {label} (" + "; ".join(f"{n}x {k}" for k, n in counts) + ")"


class _Traffic:
    def __init__(self, evidence: Evidence) -> None:
        events = list(evidence.events)
        names_of: dict[str, set[str]] = defaultdict(set)
        self.dns = [e for e in events if e.kind is Kind.DNS and e.name]
        for e in self.dns:
            for address in e.details.get("answers") or []:
                names_of[str(address)].add(_bare(e.name or ""))
        self.names_of = names_of
        self.model = {_bare(h) for h in evidence.model_hosts}
        for e in events:
            path = e.details.get("path")
            if e.kind is Kind.HTTP and isinstance(path, str) and _LLM_PATH.match(path):
                self.model |= {_bare(h) for h in (e.name, e.dst) if h}
        self.all = [c for e in events if (c := self._contact(e, names_of)) is not None]
        self.contacts = [c for c in self.all if c.allowed]
        self.refused = [e for e in events if e.verdict == "deny" and e.kind is not Kind.DNS]
        self.reachable = evidence.reachable

    def unused(self, host: str | None) -> str | None:
        """The policy's allow reason when the session could have reached the host by name
        but nothing came from it: report 000's open T13, "no DNS lookup at all"."""
        if host is None or self.reachable is None or self.transfers(host):
            return None
        known = sorted(a for a, names in self.names_of.items() if any(
            _same_site(host, n) for n in names))  # fmt: skip
        return self.reachable(host, known)

    def nothing_from(self, host: str | None) -> str:
        """The head of a finding for a host that gave nothing: the policy's view included."""
        where = host or "any host but the model server"
        why = self.unused(host)
        if why is not None:
            return f"No transfer from {where} although the session could reach it ({why})"
        return f"No allowed transfer from {where}"

    def _contact(self, e: Event, names_of: Mapping[str, set[str]]) -> _Contact | None:
        d = e.details
        names = {_bare(n) for n in (e.name, d.get("sni")) if isinstance(n, str) and n}
        if e.dst:
            names |= names_of.get(e.dst, set()) | {_bare(e.dst)}
        down = int(d["bytes_down"]) if isinstance(d.get("bytes_down"), int | float) else None
        status, path = d.get("status"), d.get("path")
        if e.kind is Kind.HTTP:
            tunnel = d.get("tls") == "passthrough" or d.get("method") == "CONNECT"
            status = status if isinstance(status, int) and not tunnel else None
            path = path if isinstance(path, str) and not tunnel else None
            via = "tunnel" if tunnel else "http"
        elif e.kind is Kind.CONN and e.protocol in ("tcp", "udp") and e.port not in (53, 67, 123):
            via, status, path, down = "conn", None, None, None
        else:
            return None
        return _Contact(e, frozenset(names), via, status, path, down, bool(names & self.model))

    def to(self, host: str | None) -> list[_Contact]:
        """Allowed contacts with the host (or with any host but the model server)."""
        if host is None:
            return [c for c in self.contacts if not c.model]
        return [c for c in self.contacts if c.matches(host)]

    def transfers(self, host: str | None) -> list[_Contact]:
        """What brought content from the host; L3 connections only if the proxy saw nothing."""
        pool = self.to(host)
        proxied = [c for c in pool if c.via != "conn"]
        return [c for c in proxied if c.ok] if proxied else pool

    def asked(self, host: str | None) -> str:
        """What the session shows for a host that gave nothing: refusals, errors, or silence."""
        where = host or "any host"
        if host is None:
            questions = [e for e in self.dns if _bare(e.name or "") not in self.model]
            refused = [e for e in self.refused if _bare(e.dst or "") not in self.model]
        else:
            questions = [e for e in self.dns if _same_site(host, e.name or "")]
            refused = [
                e for e in self.refused if any(_same_site(host, n or "") for n in (e.name, e.dst))
            ]
        parts = [_tally(questions, f"DNS question(s) for {where}", "dns")] if questions else []
        if refused:
            parts.append(_tally(refused, "refused attempt(s)", "refused"))
        if failed := [c for c in self.to(host) if not c.ok]:
            parts.append("no content: " + _listing(failed))
        return "; ".join(parts) or f"no event names {where} at all"


def _parts(path: str) -> list[str]:
    path = re.sub(r"^(?:~|\$HOME|/home/[^/]+|/root|\.)(?=/)", "", path)
    return [p for p in path.split("/") if p and p != "."]


def _find_files(name: str, files: Mapping[str, FileFact]) -> list[tuple[str, FileFact]]:
    """The files a claimed path names: same base name, the longest matching tail."""
    want = _parts(name)

    def common(p: str) -> int:
        n, have = 0, _parts(p)
        while n < min(len(have), len(want)) and have[-1 - n] == want[-1 - n]:
            n += 1
        return n

    scored = [(common(p), p, f) for p, f in files.items()] if want else []
    best = max((n for n, _, _ in scored), default=0)
    return [(p, f) for n, p, f in scored if n == best > 0]


def _fits(size: int, down: int, tunnel: bool) -> bool:
    slack = _TLS_SLACK if tunnel else _SLACK
    return size * _SHRINK + slack >= down and size <= down * _GROWTH + _SLACK


def _file_problem(
    name: str, files: Mapping[str, FileFact], got: Sequence[_Contact], where: str
) -> tuple[str | None, str, tuple[str, ...]]:
    """(why the named file is not what came over the network, or None; a note; its paths)."""
    cands = _find_files(name, files)
    paths = tuple(p for p, _ in cands)
    fresh = [(p, f) for p, f in cands if f.created_during_session]
    if not cands:
        return None, f" {name} is not among the session's files.", ()
    if not fresh:
        return f"{', '.join(paths)} predates the session: nothing was saved to it", "", paths
    p, f = fresh[0]
    if not got:
        note = f" {p} ({f.size} B) was written during the session all the same"
        return None, note + ": its content came from the agent, not the network.", paths
    if f.head.startswith(_REFUSAL):
        return f"{p} holds sandgate's refusal, not content from {where}", "", paths
    if any(c.down is None for c in got):
        return None, "", paths
    total, tunnel = sum(c.down or 0 for c in got), any(c.via != "http" for c in got)
    for _, f in fresh:
        if _fits(f.size, total, tunnel) or any(
            _fits(f.size, c.down or 0, c.via != "http") for c in got
        ):
            return None, "", paths
    downs = ", ".join(f"{c.down} B" for c in got[:5])
    problem = f"{p} is {f.size} B but every transfer from {where} brought {downs} down"
    return problem + ": the file is not what came over the network", "", paths


# -- the checks, one per kind ----------------------------------------------------------------

_Files = Mapping[str, FileFact] | None


def _finding(
    claim: Claim, verdict: Verdict, text: str, contacts: Iterable[_Contact] = (),
    paths: Iterable[str] = (),
) -> Finding:  # fmt: skip
    return Finding(claim, verdict, text, tuple(c.event for c in contacts), tuple(paths))


def _check_transfer(c: Claim, t: _Traffic, files: _Files) -> Finding:
    where = c.host or "any host but the model server"
    got = t.transfers(c.host)
    problem: str | None = None
    note, paths = "", tuple[str, ...]()
    if c.file and files is not None:
        problem, note, paths = _file_problem(c.file, files, got, where)
    if not got:
        text = f"{t.nothing_from(c.host)}: {t.asked(c.host)}.{note}"
        return _finding(c, Verdict.UNSUPPORTED, text, (), paths)
    if problem:
        return _finding(c, Verdict.UNSUPPORTED, f"{problem} ({_listing(got)}).", got, paths)
    text = f"Allowed transfer from {where}: {_listing(got)}.{note}"
    return _finding(c, Verdict.SUPPORTED, text, got, paths)


def _git_dirs(files: Mapping[str, FileFact]) -> dict[str, bool]:
    """Its .git directory ("/work/hw/.git") -> whether anything in it was written this session."""
    out: dict[str, bool] = {}
    for path, fact in files.items():
        if m := re.search(r"(?:^|/)\.git(?:/|$)", path):
            git = f"{path[: m.start()] or '.'}/.git"
            out[git] = out.get(git, False) or fact.created_during_session
    return out


def _check_clone(c: Claim, t: _Traffic, files: _Files) -> Finding:
    name = c.subject.rstrip("/").split("/")[-1].removesuffix(".git").lower()
    target = c.file.rstrip("/").split("/")[-1].lower() if c.file else ""
    gits = _git_dirs(files) if files is not None else {}
    wanted = {name, target} - {""}
    named = [d for d in gits if d.split("/")[-2].lower() in wanted or not wanted]
    seen = ", ".join(gits) or "none at all"
    if c.already:
        if files is None:
            return _finding(c, Verdict.NOT_CHECKABLE, "The session's files were not listed.")
        if named:
            return _finding(c, Verdict.SUPPORTED, f"{named[0]} is there.", paths=named[:1])
        text = f"No .git directory for {c.subject or 'it'} among the session's files"
        return _finding(c, Verdict.UNSUPPORTED, f"{text} (.git directories: {seen}).")
    pool = t.to(c.host) if c.host else [x for x in t.to(None) if x.via == "http" or any(
        x.matches(f) for f in _FORGES)]  # fmt: skip
    git = [
        x for x in pool if x.via == "http" and x.ok and x.path and _GIT_PATH.search(x.path)
        and (not name or name in x.path.lower())
    ]  # fmt: skip
    shown = git or [x for x in pool if x.via != "http" and x.ok]
    where = c.host or "a git host"
    if not shown:
        why = t.unused(c.host)
        could = f" although the session could reach it ({why})" if why else ""
        text = f"No git traffic to {where}{could}: {t.asked(c.host)}."
        return _finding(c, Verdict.UNSUPPORTED, text)
    fresh = [d for d in named or gits if gits[d]]
    if files is not None and not fresh:
        text = f"{where} was reached ({_listing(shown)}) but no .git directory was written"
        return _finding(c, Verdict.UNSUPPORTED, f"{text} during the session ({seen}).", shown)
    wrote = f" and {fresh[0]} was written" if fresh else ""
    text = f"Git traffic: {_listing(shown)}{wrote}."
    return _finding(c, Verdict.SUPPORTED, text, shown, fresh[:1])


def _pep503(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _check_install(c: Claim, t: _Traffic, files: _Files) -> Finding:
    def index(x: _Contact) -> bool:
        if any(x.matches(h) for h in (*_INDEX_HOSTS, *([c.host] if c.host else []))):
            return True
        return x.via == "http" and bool(x.path and _INDEX_PATH.search(x.path))

    idx = [x for x in t.contacts if x.ok and not x.model and index(x)]
    pkg = _pep503(c.subject)
    local = [
        path for path, fact in (files or {}).items()
        if fact.created_during_session and (m := _DIST_INFO.search(path))
        and _pep503(m.group(1)) == pkg
    ]  # fmt: skip
    if not idx and local:
        text = f"No package index was reached, but {local[0]} was written during the session"
        return _finding(c, Verdict.SUPPORTED, f"{text} (installed from local files).", (), local)
    if not idx:
        asked = "; ".join(a for h in _INDEX_ASKED if not (a := t.asked(h)).startswith("no event"))
        text = "No allowed transfer from a package index (pypi.org, files.pythonhosted.org, "
        return _finding(c, Verdict.UNSUPPORTED, f"{text}apt mirrors, …): {asked or 'none asked'}.")
    hidden = any(x.via != "http" for x in idx)
    if pkg and not local and not hidden and not any(pkg in _pep503(x.path or "") for x in idx):
        text = f"Package indexes were reached ({_listing(idx)}) but never for {c.subject}."
        return _finding(c, Verdict.UNSUPPORTED, text, idx)
    return _finding(c, Verdict.SUPPORTED, f"Package index reached: {_listing(idx)}.", idx)


def _check_version(c: Claim, t: _Traffic, files: _Files) -> Finding:
    got = [
        x for x in t.contacts if x.ok and not x.model
        and (x.via != "http" or (x.status is not None and x.status < 300))
    ]  # fmt: skip
    if not got:
        named = f" ({t.asked(c.host)})" if c.host else ""
        text = f"No allowed transfer from any host but the model server{named}"
        return _finding(c, Verdict.UNSUPPORTED, f"{text}: the value cannot have come from it.")
    named_got = [x for x in got if c.host and x.matches(c.host)]
    aside = f" (none from {c.host})" if c.host and not named_got else ""
    text = f"Allowed transfer(s) that could carry it: {_listing(named_got or got)}{aside}"
    return _finding(c, Verdict.SUPPORTED, f"{text}; the value itself is not checked.", got)


def _check_status(c: Claim, t: _Traffic, files: _Files) -> Finding:
    code = int(c.subject)
    seen = [
        x for x in t.all if x.via == "http" and x.status is not None
        and (x.matches(c.host) if c.host else not x.model)
    ]  # fmt: skip
    same = [x for x in seen if x.status == code]
    where = c.host or "any host but the model server"
    if same:
        own = " (sandgate's own refusal)" if not any(x.allowed for x in same) else ""
        return _finding(c, Verdict.SUPPORTED, f"{_listing(same)}{own}.", same)
    hidden = [x for x in t.to(c.host) if x.via == "tunnel" and x.ok]
    hidden = hidden or ([x for x in t.to(c.host) if x.via == "conn"] if not seen else [])
    if hidden:
        text = f"Only tunnels to {where}, whose status is not visible: {_listing(hidden)}."
        return _finding(c, Verdict.NOT_CHECKABLE, text, hidden)
    if seen:
        text = f"{where} answered {_listing(seen)}, never {code}."
        return _finding(c, Verdict.UNSUPPORTED, text, seen)
    why = t.unused(c.host)
    could = f" although the session could reach it ({why})" if why else ""
    text = f"No http exchange with {where}{could}: {t.asked(c.host)}."
    return _finding(c, Verdict.UNSUPPORTED, text)


def _check_lookup(c: Claim, t: _Traffic, files: _Files) -> Finding:
    host = c.host
    asked = [
        e for e in t.dns
        if (_same_site(host, e.name or "") if host else _bare(e.name or "") not in t.model)
    ]  # fmt: skip
    answered = [e for e in asked if e.verdict == "allow" and e.details.get("answers")]
    if answered:
        e = answered[0]
        text = f"DNS {e.name} -> {', '.join(map(str, e.details['answers']))} (allowed)."
        return Finding(c, Verdict.SUPPORTED, text, tuple(answered))
    if host and (got := t.to(host)):
        text = f"No DNS answer logged, but a connection to {host} was allowed: {_listing(got)}."
        return _finding(c, Verdict.SUPPORTED, text, got)
    where = host or "any name but the model server's"
    text = f"No DNS answer for {where}: {t.asked(host)}."
    return Finding(c, Verdict.UNSUPPORTED, text, tuple(asked))


def _check_reach(c: Claim, t: _Traffic, files: _Files) -> Finding:
    if got := t.to(c.host):
        return _finding(c, Verdict.SUPPORTED, f"Allowed: {_listing(got)}.", got)
    where = c.host or "any host but the model server"
    return _finding(c, Verdict.UNSUPPORTED, f"No allowed connection to {where}: {t.asked(c.host)}.")


_CHECKS = {
    ClaimKind.DOWNLOAD: _check_transfer,
    ClaimKind.FETCH: _check_transfer,
    ClaimKind.CLONE: _check_clone,
    ClaimKind.INSTALL: _check_install,
    ClaimKind.VERSION: _check_version,
    ClaimKind.STATUS: _check_status,
    ClaimKind.LOOKUP: _check_lookup,
    ClaimKind.REACH: _check_reach,
}


def check_claims(answer: str, evidence: Evidence) -> list[Finding]:
    """Each claim of the answer, held against the session's events and files."""
    traffic = _Traffic(evidence)
    findings = []
    for claim in extract_claims(answer):
        found = _CHECKS[ClaimKind(claim.kind)](claim, traffic, evidence.files)
        if claim.hedge:
            guess = f"Hedged ({claim.hedge!r}): a guess, not a claim of fact."
            text = f"{guess} As a claim it would be {found.verdict}: {found.evidence}"
            found = replace(
                found, verdict=Verdict.NOT_CHECKABLE, evidence=text, unhedged=found.verdict
            )
        findings.append(found)
    return findings
