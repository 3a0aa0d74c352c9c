"""What may not reach a log: secrets in request targets and in command lines.

One rule for every place a target or a process's argv enters an event, a terminal or an error
message: userinfo (``user:pass@``) becomes ``…@``, a query becomes ``?…``, a fragment is dropped;
in a command line, the value of a credential header (``-H 'Authorization: Bearer …'``) or of a
``--password=``/``--token=``-style option becomes ``…``. Secrets inside a path are not found.
"""

from __future__ import annotations

import re

SCHEME_PREFIX = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*://")
_HEADER = re.compile(
    r"^(\s*(?:authorization|proxy-authorization|cookie|x-api-key|api-key|x-auth-token)\s*:)"
    r"\s*\S.*$",
    re.IGNORECASE,
)
_OPTION = re.compile(
    r"^(-{1,2}[A-Za-z0-9_-]*(?:pass(?:word)?|token|secret|api[-_]?key|auth)[A-Za-z0-9_-]*=).+$",
    re.IGNORECASE,
)
_URL_IN_WORD = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*://\S*")


def redact_target(target: str) -> str:
    """A request target, URL or CONNECT authority fit for logs, terminals and error messages.
    Everything before the first ``/`` of a URL or authority counts as authority here, whatever
    a URL parser would say, so no spelling of ``user:pass@`` slips through."""
    match = SCHEME_PREFIX.match(target)
    start = match.end() if match is not None else 0
    if match is not None or not target.startswith("/"):
        slash = target.find("/", start)
        cut = len(target) if slash == -1 else slash
        at = target.rfind("@", start, cut)
        if at != -1:
            target = target[:start] + "…@" + target[at + 1 :]
    path = target.partition("#")[0]
    base, question, _ = path.partition("?")
    return base + "?…" if question else base


def redact_arg(word: str) -> str:
    """One command-line word fit for a log (URLs anywhere in it, credential headers and
    options). Other words pass unchanged."""
    header = _HEADER.match(word)
    if header is not None:
        return header.group(1) + " …"
    option = _OPTION.match(word)
    if option is not None:
        return option.group(1) + "…"
    return _URL_IN_WORD.sub(lambda m: redact_target(m.group(0)), word)


def redact_argv(argv: list[str]) -> list[str]:
    return [redact_arg(word) for word in argv]


__all__ = ["SCHEME_PREFIX", "redact_arg", "redact_argv", "redact_target"]
