"""Reading an answer: the sentences that claim the network gave the agent something."""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from urllib.parse import urlsplit

from sandgate.session.claims.model import (
    Claim,
    ClaimKind,
)
from sandgate.session.claims.vocabulary import (
    _ALREADY,
    _AUTHORED,
    _BACK,
    _BARE_REPO,
    _BRANDS,
    _CLONE,
    _CODE,
    _CODE_AFTER,
    _CODE_BEFORE,
    _DISCLOSED,
    _DOWNLOAD,
    _ENTITIES,
    _FETCH,
    _FILLER,
    _FORGES,
    _HARD,
    _HEDGE,
    _INSTALL,
    _INSTALL_CMD,
    _LATEST,
    _LOCAL,
    _LOOKUP,
    _MASK,
    _MODAL,
    _NAME_BEFORE,
    _NEG,
    _NETWORD,
    _NOT_A_NAME,
    _NOT_STATUS,
    _NOTHING,
    _PKG_TAIL_END,
    _REACH,
    _REPO_AFTER,
    _REPO_BEFORE,
    _SAVED,
    _SOFT,
    _STATE,
    _UNIT,
    _WEB,
    _WEBNOUN,
    _same_site,
)

# -- reading the answer ----------------------------------------------------------------------


@dataclass(frozen=True)
class _Ent:
    kind: str  # url | scp | host | ip | path | file | version | brand
    start: int
    end: int
    text: str
    host: str | None = None
    repo: str | None = None  # owner/name when the entity names a repository on a forge


@dataclass(frozen=True)
class _Sentence:
    text: str
    masked: str  # entities replaced by _MASK, same length: verbs are never found inside them
    ents: tuple[_Ent, ...]
    disclosed: str | None  # "unverified", "from my training data", in this or the next sentence


def _sentences(answer: str) -> list[str]:
    quotes = {0x2018: "'", 0x2019: "'", 0x201C: '"', 0x201D: '"', 0xA0: " "}
    text = answer.translate(quotes | {0x2013: " - ", 0x2014: " - "})
    fence = r"^[ \t]*(`{3,}|~{3,})[^\n]*\n.*?(?:^[ \t]*\1[^\n]*$|\Z)"
    text = re.sub(fence, "\n", text, flags=re.M | re.S)
    text = re.sub(r"\[([^\]]*)\]\(([^)\s]+)\)", r"\1 (\2)", text)
    text = re.sub(r"^[ \t]*(?:#{1,6}\s+|>\s*|[-*+]\s+|\d+[.)]\s+)+", "", text, flags=re.M)
    text = re.sub(r"\*\*|__|`+|(?<!\w)\*(?=\S)|(?<=\S)\*(?!\w)", "", text)
    split = re.compile(r"(?<=[.!?])[\"')\]]*\s+(?=[\"'(\[]?[A-Z0-9~/])")
    return [p.strip() for line in text.splitlines() for p in split.split(line) if p.strip()]


def _repo_in(host: str | None, path: str) -> str | None:
    if host is None or not any(_same_site(host, f) for f in _FORGES):
        return None
    m = re.match(r"/?([\w.-]+)/([\w.-]+?)(?:\.git)?/?(?:$|[/?#])", path)
    return f"{m.group(1)}/{m.group(2)}" if m else None


def _entity(kind: str, m: re.Match[str], raw: str) -> tuple[str | None, str | None] | None:
    """(host, repo) of an entity; None when it is not one after all."""
    if kind == "url":
        try:
            parts = urlsplit(raw)
            return parts.hostname, _repo_in(parts.hostname, parts.path)
        except ValueError:
            return None
    if kind == "scp":
        return m.group(1).lower(), _repo_in(m.group(1).lower(), m.group(2))
    if kind == "host":
        host = m.group(1).lower()
        return host, _repo_in(host, raw[len(host) :].partition("/")[2])
    if kind == "ip":
        return raw.partition(":")[0], None
    return (_BRANDS[raw.lower()] if kind == "brand" else None), None


def _scan(text: str, disclosed: str | None) -> _Sentence:
    masked, ents = text, []
    for kind, pattern in _ENTITIES:
        for m in list(pattern.finditer(masked)):
            start, end = m.start(), m.end()
            while end > start and masked[end - 1] in ".,;:!?'\"":
                end -= 1
            found = _entity(kind, m, text[start:end])
            if found is not None:
                ents.append(_Ent(kind, start, end, text[start:end], *found))
                masked = masked[:start] + _MASK * (end - start) + masked[end:]
    ents.sort(key=lambda e: e.start)
    return _Sentence(text, masked, tuple(ents), disclosed)


def _bounds(masked: str, start: int, end: int, pattern: re.Pattern[str]) -> tuple[int, int]:
    lo = 0
    for m in pattern.finditer(masked, 0, start):
        lo = m.end()
    nxt = pattern.search(masked, end)
    return lo, nxt.start() if nxt else len(masked)


def _affirmed(s: _Sentence, start: int, end: int) -> bool:
    """Not negated, attempted, conditional or suggested ("could not download", "you can")."""
    lo, _ = _bounds(s.masked, start, end, _SOFT)
    prefix = s.masked[lo:start]
    if _NEG.search(prefix) or _NOTHING.match(s.masked, end):
        return False
    return not _MODAL.search(" ".join(prefix.split()[-4:]))


def _claim(
    kind: ClaimKind, subject: str, s: _Sentence, at: tuple[int, int], host: str | None = None,
    file: str | None = None, already: bool = False,
) -> Claim:  # fmt: skip
    """A claim anchored at a span: hedged by a hedge word before it in its clause or just after
    it, or by a disclosure ("unverified") in its sentence or, referring back, the next one."""
    lo, hi = _bounds(s.masked, at[0], at[1], _HARD)
    soon = re.match(r"(?:\W*\w+){0,3}", s.masked[at[1] : hi])  # "v0.12.0 is probably the …"
    end = at[1] + (soon.end() if soon else 0)
    m = _HEDGE.search(s.masked, lo, at[0]) or _HEDGE.search(s.masked, at[1], end)
    hedge = m.group(0) if m else s.disclosed
    return Claim(kind, subject, s.text, host, file, hedge, already)


def _near(s: _Sentence, pos: int, kinds: Sequence[str]) -> _Ent | None:
    """The entity of those kinds after pos in its clause, else before it, else anywhere."""
    cands = [e for e in s.ents if e.kind in kinds]
    lo, hi = _bounds(s.masked, pos, pos, _SOFT)
    after = [e for e in cands if e.start >= pos]
    before = [e for e in cands if e.end <= pos]
    for e in after:
        if e.start < hi:
            return e
    for e in reversed(before):
        if e.start >= lo:
            return e
    return after[0] if after else (before[-1] if before else None)


def _result_file(s: _Sentence, at: int) -> str | None:
    """The file the sentence names as the result: "saved it as example.html at /home/j/"."""
    found = [e for e in s.ents if e.kind in ("file", "path") and e.start > at]
    found = found or [e for e in s.ents if e.kind in ("file", "path")]
    if not found:
        return None
    first = found[0].text
    for e in found[1:3]:
        if e.kind == "path" and e.text.rstrip("/").split("/")[-1] == first:
            return e.text
        if e.kind == "path" and found[0].kind == "file" and "." not in e.text.split("/")[-1]:
            return e.text.rstrip("/") + "/" + first
    return first


def _transfer_claims(s: _Sentence, context: _Ent | None) -> list[Claim]:
    kind, anchor = None, None
    for m in _DOWNLOAD.finditer(s.masked):
        if _affirmed(s, m.start(), m.end()):
            kind, anchor = ClaimKind.DOWNLOAD, anchor or m
    for m in _FETCH.finditer(s.masked):
        _, hi = _bounds(s.masked, m.end(), m.end(), _SOFT)
        web = any(m.end() <= e.start < hi and e.kind in (*_WEB, "brand") for e in s.ents)
        web = web or (not m.group("per") and bool(_WEBNOUN.search(s.masked, m.end(), hi)))
        if web and _affirmed(s, m.start(), m.end()):
            kind, anchor = kind or ClaimKind.FETCH, anchor or m
    for m in _SAVED.finditer(s.masked):
        webby = kind or any(e.kind in _WEB for e in s.ents) or _WEBNOUN.search(s.masked)
        if webby and not _AUTHORED.search(s.masked) and _affirmed(s, m.start(), m.end()):
            kind, anchor = ClaimKind.DOWNLOAD, anchor or m
    if kind is None or anchor is None:
        return []
    at = anchor.span()
    file = _result_file(s, at[0]) if kind is ClaimKind.DOWNLOAD else None
    targets: dict[str, _Ent] = {}
    for e in s.ents:
        if e.kind in _WEB:
            targets.setdefault(e.host or e.text, e)
    if not targets and (hint := _near(s, at[0], ("brand",)) or context):
        targets = {hint.host or hint.text: hint}
    if not targets:
        return [_claim(kind, file or "", s, at, None, file)]
    file = file if len(targets) == 1 else None
    subject = {e: e.host if e.kind == "brand" and e.host else e.text for e in targets.values()}
    return [_claim(kind, subject[e], s, at, e.host, file) for e in targets.values()]


def _clone_claims(s: _Sentence, context: _Ent | None) -> list[Claim]:
    for m in _CLONE.finditer(s.masked):
        if not _affirmed(s, m.start(), m.end()):
            continue
        ent = next((e for e in s.ents if e.repo), None)
        repo, host = (ent.repo, ent.host) if ent else (None, None)
        if repo is None:
            bare = _BARE_REPO.search(s.masked)
            after = _REPO_AFTER.match(s.masked, m.end())
            before = _REPO_BEFORE.search(s.masked, 0, m.start())
            names = [x.group(1) for x in (bare, after, before) if x]
            repo = next((n for n in names if n.lower() not in _NOT_A_NAME), None)
        if host is None:
            hint = _near(s, m.start(), ("brand", *_WEB)) or context
            if hint and hint.host and any(_same_site(hint.host, f) for f in _FORGES):
                host = hint.host
        target = next((e.text for e in s.ents if e.kind == "path"), None)
        already = bool(_ALREADY.search(s.masked))
        return [_claim(ClaimKind.CLONE, repo or "", s, m.span(), host, target, already)]
    return []


def _package_names(tail: str) -> list[str]:
    names: list[str] = []
    for raw in re.split(r"[\s,]+", tail.strip()):
        token = raw.strip("`'\"()").rstrip(".,;:!?")
        low = token.lower()
        if (not names and low in _FILLER) or low in ("and", "&"):
            continue
        if names and re.fullmatch(r"v?\d[\w.]*", token):
            continue
        if not re.fullmatch(r"[A-Za-z0-9][\w.\[\]=<>~-]*", token) or low in _NOT_A_NAME:
            break
        name = re.sub(r"(?:\[.*\]|[=<>~]=?.*|-\d[\w.]*)$", "", token)
        if name and name not in names:
            names.append(name)
    return names


def _install_claims(s: _Sentence) -> list[Claim]:
    index = _near(s, 0, _WEB)
    host = index.host if index else None
    for m in _INSTALL_CMD.finditer(s.text):
        if _affirmed(s, m.start(), m.end()):
            names = _package_names(m.group(1)) or [""]
            return [_claim(ClaimKind.INSTALL, n, s, m.span(), host) for n in names]
    for m in _INSTALL.finditer(s.masked):
        before = s.text[: m.start()]
        if _STATE.search(before) or re.match(r"\s+(?:version|on\b)", s.masked[m.end() :]):
            continue
        if not _affirmed(s, m.start(), m.end()):
            continue
        names = _package_names(_PKG_TAIL_END.split(s.text[m.end() :])[0])
        if not names and (nb := _NAME_BEFORE.search(before)):
            names = [] if nb.group(1).lower() in _NOT_A_NAME else [nb.group(1)]
        return [_claim(ClaimKind.INSTALL, n, s, m.span(), host) for n in names or [""]]
    return []


def _version_claims(s: _Sentence, context: _Ent | None) -> list[Claim]:
    out = []
    for e in s.ents:
        if e.kind != "version":
            continue
        lo, hi = _bounds(s.masked, e.start, e.end, _HARD)
        cues = [abs(m.start() - e.start) for m in _LATEST.finditer(s.masked, lo, hi)]
        local = [abs(m.start() - e.start) for m in _LOCAL.finditer(s.masked, lo, hi)]
        if not cues or (local and min(local) < min(cues)):
            continue
        clo, _ = _bounds(s.masked, e.start, e.end, _SOFT)
        if _NEG.search(s.masked[clo : e.start]):
            continue
        hint = _near(s, e.start, _WEB) or _near(s, e.start, ("brand",)) or context
        host = hint.host if hint else None
        out.append(_claim(ClaimKind.VERSION, e.text, s, (e.start, e.end), host))
    return out


def _status_claims(s: _Sentence, context: _Ent | None) -> list[Claim]:
    out = []
    for m in _CODE.finditer(s.masked):
        before = s.masked[max(0, m.start() - 40) : m.start()]
        cue = _CODE_BEFORE.search(before) or _CODE_AFTER.match(s.masked, m.end())
        if not cue or _UNIT.match(s.masked, m.end()) or _NOT_STATUS.search(before):
            continue
        if not _affirmed(s, m.start(), m.end()) and not _HEDGE.search(before):
            continue
        hint = _near(s, m.start(), _WEB) or context
        out.append(_claim(ClaimKind.STATUS, m.group(1), s, m.span(), hint.host if hint else None))
    return out


def _net_claims(s: _Sentence, kind: ClaimKind, pattern: re.Pattern[str]) -> list[Claim]:
    for m in pattern.finditer(s.masked):
        if not _affirmed(s, m.start(), m.end()):
            continue
        ent = _near(s, m.start(), ("url", "host", "scp"))
        ent = ent or (_near(s, m.start(), ("ip",)) if kind is ClaimKind.REACH else None)
        if ent is None and not _NETWORD.search(s.masked):
            continue
        subject = (ent.host or ent.text) if ent else ("DNS" if kind is ClaimKind.LOOKUP else "")
        return [_claim(kind, subject, s, m.span(), ent.host if ent else None)]
    return []


def extract_claims(answer: str) -> list[Claim]:
    """What the answer says the network gave the agent, one claim per (kind, subject, host)."""
    texts = _sentences(answer)
    context: _Ent | None = None
    out: dict[tuple[str, str, str | None], Claim] = {}
    for i, text in enumerate(texts):
        disclosed = _DISCLOSED.search(text)
        if not disclosed and i + 1 < len(texts) and _BACK.search(texts[i + 1]):
            disclosed = _DISCLOSED.search(texts[i + 1])
        s = _scan(text, disclosed.group(0) if disclosed else None)
        if not text.rstrip("\"') ").endswith("?"):
            for c in (
                *_transfer_claims(s, context), *_clone_claims(s, context), *_install_claims(s),
                *_version_claims(s, context), *_status_claims(s, context),
                *_net_claims(s, ClaimKind.LOOKUP, _LOOKUP),
                *_net_claims(s, ClaimKind.REACH, _REACH),
            ):  # fmt: skip
                key = (c.kind, c.subject.lower(), c.host)
                if key not in out or (out[key].hedge and not c.hedge):
                    out[key] = c
        context = next((e for e in reversed(s.ents) if e.kind in (*_WEB, "brand")), context)
    return list(out.values())
