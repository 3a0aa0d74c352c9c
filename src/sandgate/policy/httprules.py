"""Request rules: the ``http = ["POST /v1/chat/completions", "GET /v1/*"]`` of an allow rule.

An entry is ``METHOD /path``: a method (or ``*`` for any) and a path that is matched exactly,
or as a prefix when it ends in ``*`` (``/v1/*`` matches ``/v1/models``, not ``/v1``). A query
string is never part of a rule and is ignored when matching (and redacted in logs).

A request path that could mean another path to the server behind the proxy (dot segments,
percent-encoded dots, slashes or backslashes) matches no rule: ``/v1/../api/pull`` must not pass
as ``/v1/*``. Anything else is compared as sent, so another spelling of an allowed path
(``/v1/%6dodels``) is refused rather than guessed at: the rules are an allowlist.

Pure: parsing and matching only; ``decide()`` says what a match means.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

__all__ = ["METHODS", "RequestRule", "RequestRuleError", "ambiguous_path", "parse_request_rule"]

# The methods a rule may name (RFC 9110 and PATCH); ``*`` names them all. A typo (``GTE``)
# is an error, not a rule that never matches.
METHODS = frozenset({"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"})
_PATH_CHARS = re.compile(r"/[A-Za-z0-9\-._~!$&'()+,;=:@%/]*\*?")
_AMBIGUOUS = re.compile(r"(^|/)\.\.?(/|$)|%2[eEfF]|%5[cC]|\\")


class RequestRuleError(ValueError):
    """An ``http`` entry that is not ``METHOD /path``; the message says how to write it."""


@dataclass(frozen=True)
class RequestRule:
    method: str  # upper-case, or "*"
    path: str  # without the trailing "*" of a prefix
    prefix: bool

    def matches(self, method: str, path: str) -> bool:
        """Does a request (``path`` as sent, query included or not) match this entry?"""
        if self.method not in ("*", method):
            return False
        bare = path.split("?", 1)[0].split("#", 1)[0] or "/"
        if ambiguous_path(bare):
            return False
        return bare.startswith(self.path) if self.prefix else bare == self.path

    def __str__(self) -> str:
        return f"{self.method} {self.path}{'*' if self.prefix else ''}"


def ambiguous_path(path: str) -> bool:
    """A path the server might read as another one (dot segments, encoded separators)."""
    return _AMBIGUOUS.search(path) is not None


def parse_request_rule(text: str) -> RequestRule:
    """``"POST /v1/chat/completions"`` → RequestRule; RequestRuleError with the fix otherwise."""
    parts = text.split(" ")
    example = 'write it as "METHOD /path", e.g. "POST /v1/chat/completions" or "GET /v1/*"'
    if len(parts) != 2 or not parts[0] or not parts[1]:
        raise RequestRuleError(f"{text!r} is not METHOD /path (one space between); {example}")
    method, path = parts
    if method != "*" and method not in METHODS:
        hint = f"; did you mean {method.upper()!r}?" if method.upper() in METHODS else ""
        raise RequestRuleError(
            f"{method!r} is not an HTTP method: use one of {', '.join(sorted(METHODS))} "
            f"or * for any{hint}"
        )
    if "?" in path or "#" in path:
        raise RequestRuleError(
            f"{path!r}: a request rule names a path only (the query is ignored when matching); "
            f"drop everything from {'?' if '?' in path else '#'}"
        )
    if _PATH_CHARS.fullmatch(path) is None:
        raise RequestRuleError(
            f"{path!r} is not a path: it starts with /, has no spaces, and may end in * "
            "(a prefix)"
        )
    if ambiguous_path(path.rstrip("*")):
        raise RequestRuleError(
            f"{path!r} has a dot segment or an encoded separator, which no request can match"
        )
    prefix = path.endswith("*")
    return RequestRule(method, path[:-1] if prefix else path, prefix)
