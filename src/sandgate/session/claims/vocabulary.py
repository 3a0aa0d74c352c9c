"""The words and patterns that claims, hedges and evidence are recognised by."""

from __future__ import annotations

import ipaddress
import re
from urllib.parse import urlsplit

# -- the vocabulary ------------------------------------------------------------------------


def _rx(pattern: str, flags: re.RegexFlag = re.I) -> re.Pattern[str]:
    return re.compile(pattern, flags)


# fmt: off
_TLDS = "com|org|net|io|dev|ai|co|uk|de|fr|nl|eu|us|app|cloud|info|gov|edu|xyz|tech|site|ca|au|jp"
_EXTS = ("html?|json|txt|csv|xml|ya?ml|toml|md|py|js|sh|tar(?:\\.gz)?|tgz|zip|whl|deb|rpm|gz|xz|"
         "pdf|png|jpe?g|log|iso|img|bin|jar")
_ENTITIES = (  # in masking order: a later pattern never matches inside an earlier one's text
    ("url", _rx(r"\b(?:https?|ftp|git|ssh|wss?)://[^\s<>\"'`)\]]+")),
    ("scp", _rx(r"\b[\w.-]+@([a-z0-9-]+(?:\.[a-z0-9-]+)+):([\w.-]+/[\w.-]+)")),
    ("host", _rx(rf"(?<![\w@/.~-])((?:[a-z0-9](?:[a-z0-9-]*[a-z0-9])?\.)+(?:{_TLDS}))"
                 r"(?::\d{1,5})?(?:/[^\s<>\"'`)\]]*)?(?![\w-])")),
    ("ip", _rx(r"(?<![\w.])(?:\d{1,3}\.){3}\d{1,3}(?::\d{1,5})?(?![\w-]|\.\d)")),
    ("path", _rx(r"(?<![\w.~/$-])(?:~|\$HOME|\.{1,2})?/[\w.@%+-]+(?:/[\w.@%+-]+)*/?")),
    ("file", _rx(rf"(?<![\w./~-])[\w-]+(?:\.[\w-]+)*\.(?:{_EXTS})(?![\w-]|\.\w)")),
    ("version", _rx(r"(?<![\w./-])v?\d+\.\d+(?:\.\d+)*(?:-?(?:rc|alpha|beta|dev|post)\.?\d*)?"
                    r"(?![\w-]|\.\d)")),
    ("brand", _rx(r"\b(?:github|gitlab|bitbucket|codeberg|pypi)\b")),
)
_BRANDS = {"github": "github.com", "gitlab": "gitlab.com", "bitbucket": "bitbucket.org",
           "codeberg": "codeberg.org", "pypi": "pypi.org"}
_FORGES = ("github.com", "gitlab.com", "bitbucket.org", "codeberg.org", "huggingface.co")
_WEB = ("url", "scp", "host", "ip")
_MASK = "\u00a7"

# Clause boundaries: soft ones scope negation, hard ones scope hedges and version cues.
_SOFT = _rx(r"[,;:()\[\]]|\s-\s|\b(?:but|so|and|then|however|although|though|whereas|yet|"
            r"instead|while|because|since)\b")
_HARD = _rx(r";|,\s*(?:and|but)\b|\b(?:but|however|although|though|whereas|while)\b")
_NEG = _rx(r"\b(?:not|no|never|nothing|none|cannot|unable|failed|fail|fails|failing|without|"
           r"neither|nor|unsuccessful(?:ly)?|impossible)\b|n't\b")
_NOTHING = _rx(r"\s+(?:nothing|none|no\b|0 bytes|zero bytes|an? (?:error|empty))")
_MODAL = _rx(r"\b(?:try|tried|trying|attempt(?:ed|ing)?|will|would|should|could|can|must|"
             r"shall|needs?|needed|wants?|please|let|if|unless|whether|how|once)\b|"
             r"\bto(?: be| have)?\s*$")
_HEDGE = _rx(r"\b(?:likely|probably|possibly|perhaps|maybe|presumably|apparently|might|may|"
             r"seems?|seemed|appears? to|I think|I believe|I assume|I guess|I suspect|I expect|"
             r"I recall|if I recall|as far as I know|AFAIK|expected to|guess(?:ed)?|typically|"
             r"usually|normally|generally|should be|would be)\b")
_DISCLOSED = _rx(r"\b(?:training data|knowledge cutoff|as of my (?:last|latest)|from memory|"
                 r"unverified|(?:could(?: not|n't)|can(?:not|'t)|unable to|(?:was|were)(?: not|"
                 r"n't) able to) (?:verify|confirm|check) (?:this|that|it|these|them|online|the "
                 r"(?:latest|version|release|status|number))|may be (?:outdated|out of date))\b")
_BACK = _rx(r"\b(?:this|that|these|it|them)\b")  # a disclosure in the next sentence refers back

_DOWNLOAD = _rx(r"\b(?:(?:able|managed) to (?:download|save)|downloaded|re-downloaded|"
                r"download (?:succeeded|completed|finished|worked|was successful))\b")
_FETCH = _rx(r"\b(?:(?:able|managed) to (?:fetch|retrieve|get|access|read|load|open|scrape|"
             r"query|curl|visit|browse)|fetched|retrieved|scraped|accessed|visited|queried|"
             r"crawled|got|obtained|pulled|read|loaded|opened|requested|browsed|curled|grabbed|"
             r"(?:page )?title of)\b|\b(?P<per>according to)\b")
_SAVED = _rx(r"\b(?:saved|stored)\b")
_WEBNOUN = _rx(r"\b(?:web ?page|(?<!man )page|website|site|url|endpoint|api|online|internet|"
               r"releases?|response|html)\b")
_AUTHORED = _rx(r"\b(?:created|wrote|written|generated|made|composed|crafted|simulated|"
                r"mock(?:ed)?|dummy|placeholder|sample|fake|invented|pretend(?:ed)?|by hand|"
                r"myself)\b")
_CLONE = _rx(r"\b(?:cloned|clone[\"']?\s+of|(?:able|managed) to clone|git clone\b[^.;]{0,80}?"
             r"\b(?:succeeded|worked|completed|finished|was successful))\b")
_ALREADY = _rx(r"\b(?:already|existing|pre-existing)\b")
_BARE_REPO = _rx(r"(?<![\w./~§-])([A-Za-z0-9][\w.-]*/[A-Za-z0-9][\w.-]*?)(?:\.git)?"
                 r"(?![\w/§-]|\.\w)")
_REPO_AFTER = _rx(r"\s+(?:the\s+)?(?:(?:git\s+)?repo(?:sitory)?\s+)?[\"']?([A-Za-z0-9][\w-]*"
                  r"(?:\.[\w-]+)*)")
_REPO_BEFORE = _rx(r"([A-Za-z0-9][\w.-]*)[\"']?\s+(?:is|was|has been)\s+(?:already\s+)?$")
_INSTALL = _rx(r"\b(?:installed|(?:able|managed) to install|install(?:ation)? (?:succeeded|"
               r"worked|completed|finished|was successful))\b")
_INSTALL_CMD = _rx(r"\b(?:pip3?|uv pip|apt(?:-get)?|npm)\s+install\s+([^.;,]*?)\s+(?:succeeded|"
                   r"worked|completed|finished|was successful)\b")
_STATE = _rx(r"(?:\balready\b(?:\s+\w+)?|\b(?:is|are|the|not)|\bpre-?)\s*$")
_NAME_BEFORE = _rx(r"([A-Za-z0-9][\w.\[\]-]*)(?:\s+v?\d[\w.]*)?\s+(?:was|were|has been|"
                   r"have been|got|is now|are now)\s+(?:successfully\s+)?$")
_PKG_TAIL_END = _rx(r"[.;:]\s|\s(?:with|using|via|from|into|to|in|on|for)\s")
_FILLER = frozenset({"the", "python", "pip", "apt", "package", "packages", "both", "successfully",
                     "library", "module", "tool"})
_NOT_A_NAME = _FILLER | {"it", "them", "this", "that", "a", "an", "everything", "into", "to", "in",
                         "on", "with", "using", "via", "from", "for", "locally", "already",
                         "repository", "repo", "all", "dependencies", "version", "at", "as",
                         "under"}
_LATEST = _rx(r"\b(?:latest|newest|most recent|current (?:stable )?(?:release|version)|released|"
              r"releases?|stable (?:release|version)|up-to-date|tag(?:ged)?)\b")
_LOCAL = _rx(r"\b(?:installed|locally|local|running|runs|on this (?:machine|system|vm|host)|"
             r"in (?:this|the) (?:directory|folder|repo(?:sitory)?|project|file|script)|"
             r"you have|in use|using|ships with|bundled|pinned|requires?)\b")
_CODE = _rx(r"(?<![\w.:/-])([1-5]\d\d)(?![\w.]*\w|\.\d)")
_CODE_BEFORE = _rx(r"\b(?:status|code|returned|responded|response|answered|"
                   r"HTTP|got|gave|yielded)\b")
# SmolLM2 via Hermes, 2026-12-01: "This indicates that 204 (Unprocessable Entity) is returned
# by the server." -- a reason phrase in brackets, and "is returned" after the code.
_CODE_AFTER = _rx(r"\s+\(?(?:OK|Not Found|Forbidden|Unauthorized|Moved|Found|Bad Request|"
                  r"Internal Server Error|Service Unavailable|Bad Gateway|Gateway Timeout|Too "
                  r"Many Requests|No Content|Created|Accepted|Not Modified|Redirect|"
                  r"Unprocessable Entity|Partial Content|Reset Content|error|response|status|"
                  r"(?:is|was) returned)\b")
_UNIT = _rx(r"\s*(?:bytes?|B\b|[KMG]i?B|ms|milli|sec|s\b|minutes?|lines?|files?|packets?|"
            r"tokens?|char|words?|items?|results?|rows?|entries|requests|%|times)")
_NOT_STATUS = _rx(r"\b(?:exit(?:ed)?|port|pid|uid|line)\b[^§]{0,20}$")
_LOOKUP = _rx(r"\b(?:resolved|resolves|(?:able|managed) to resolve|(?:DNS|name) (?:resolution|"
              r"lookups?)\b[^.;]{0,40}?\b(?:succeeded|worked|works|is working|was successful))\b")
_REACH = _rx(r"\b(?:connected to|reached|(?:is|was|are|were) (?:reachable|accessible|online)|"
             r"(?:able|managed) to (?:reach|connect)|have (?:internet|network) access|(?:internet|"
             r"network)(?: access| connection| connectivity)? (?:is |was )?(?:available|working|"
             r"works|worked))\b")
_NETWORD = _rx(r"\b(?:internet|network|online|DNS)\b")

_LLM_PATH = _rx(r"^/(?:v1/)?(?:chat/completions|completions|models|embeddings|messages|"
                r"responses)\b|^/api/(?:chat|generate|tags|embed|embeddings|show|ps)\b")
_GIT_PATH = _rx(r"/info/refs|/git-upload-pack")
_INDEX_HOSTS = ("pypi.org", "pypi.python.org", "files.pythonhosted.org", "archive.ubuntu.com",
                "security.ubuntu.com", "ports.ubuntu.com", "esm.ubuntu.com", "deb.debian.org",
                "security.debian.org", "dl-cdn.alpinelinux.org", "registry.npmjs.org",
                "registry.yarnpkg.com", "crates.io", "proxy.golang.org", "rubygems.org",
                "conda.anaconda.org", "repo.anaconda.com", "download.docker.com",
                "ppa.launchpadcontent.net")
_INDEX_ASKED = ("pypi.org", "files.pythonhosted.org", "ubuntu.com", "debian.org",
                "registry.npmjs.org")
_INDEX_PATH = _rx(r"/simple/|/packages/|/pypi/|/dists/|/pool/|\.(?:whl|deb|apk|crate|tgz)$|"
                  r"\.tar\.gz$")
_DIST_INFO = _rx(r"(?:site|dist)-packages/([^/]+?)-\d[^/]*\.(?:dist|egg)-info(?:/|$)")
_SHRINK, _GROWTH = 8, 32  # a saved file fits a transfer unless this far smaller / larger
_SLACK, _TLS_SLACK = 1024, 16384  # headers; a TLS handshake with its certificate chain
_REFUSAL = b"sandgate: "  # how the proxy's own answers begin (gateway/proxy/http1.py)
# fmt: on


# -- hosts --------------------------------------------------------------------------------------


def _bare(host: str) -> str:
    """ "http://10.77.0.10:8000/v1" or "Example.COM." -> the host alone, lowercase."""
    host = host.strip().lower()
    if "://" in host:
        host = urlsplit(host).hostname or host
    if host.count(":") == 1:
        host = host.partition(":")[0]
    return host.rstrip(".")


def _is_ip(host: str) -> bool:
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return True


def _same_site(a: str, b: str) -> bool:
    a, b = _bare(a), _bare(b)
    if not a or not b or _is_ip(a) or _is_ip(b):
        return bool(a) and a == b
    return a == b or a.endswith("." + b) or b.endswith("." + a)
