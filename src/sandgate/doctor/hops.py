"""The hops ``sandgate doctor`` walks, as data: a name, what passing means, and the fix.

A hop is one link of the chain an agent's traffic crosses, in the order it crosses them; the
first failed hop usually explains the ones after it, so the table reads top to bottom. Fixes
are templates filled in by the judge (judge.py) with what it saw.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Any


class Status(enum.StrEnum):
    OK = "ok"
    FAIL = "fail"
    SKIP = "skip"


@dataclass(frozen=True)
class Hop:
    name: str
    status: Status
    detail: str
    fix: str = ""  # what to do about it; set exactly when the hop failed

    def __post_init__(self) -> None:
        if (self.status is Status.FAIL) != bool(self.fix):
            raise ValueError(f"hop {self.name!r}: a failed hop, and only one, carries a fix")

    def as_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "status": str(self.status),
            "detail": self.detail,
            "fix": self.fix or None,
        }


@dataclass(frozen=True)
class HopKind:
    key: str
    checks: str  # what passing means, for people (README, --help)


# In the order traffic crosses them.
HOPS: tuple[HopKind, ...] = (
    HopKind("sandbox resolver", "/etc/resolv.conf names the gateway; the C library resolves"),
    HopKind("gateway resolver", "the gateway's resolver answers a name the policy allows"),
    HopKind("upstream DNS", "an uncached allowed name reaches the gateway's upstream resolver"),
    HopKind("explicit proxy", "the proxy at HTTP_PROXY (gateway:3128) answers a request"),
    HopKind("transparent proxy :80", "plain HTTP to port 80 is answered by the gateway's proxy"),
    HopKind("model server", "each exempted model server: a TCP connect, then GET /v1/models"),
    HopKind("inspection", "each inspected name: the certificate seen inside is the gateway's"),
    HopKind("CA wiring", "curl, pip, requests, git, node trust the gateway's CA"),
    HopKind("proxy variables", "HTTP(S)_PROXY and NO_PROXY point where they should"),
    HopKind("clock skew", "the sandbox's clock agrees with the host's (and the world's web)"),
    HopKind("uplink", "traffic the policy allows gets past the gateway"),
)

# Each tool, the variables it reads for extra trust, in the order it prefers them, and how the
# driver checks it live (driver.py, TOOLS). SSL_CERT_FILE is OpenSSL's (curl, Python's ssl).
TOOL_VARS: dict[str, tuple[str, ...]] = {
    "curl": ("CURL_CA_BUNDLE", "SSL_CERT_FILE"),
    "pip": ("PIP_CERT", "REQUESTS_CA_BUNDLE"),
    "requests": ("REQUESTS_CA_BUNDLE", "CURL_CA_BUNDLE"),
    "git": ("GIT_SSL_CAINFO",),
    "node": ("NODE_EXTRA_CA_CERTS",),
}

PROXY_VARS = ("HTTP_PROXY", "HTTPS_PROXY", "http_proxy", "https_proxy")
NO_PROXY_VARS = ("NO_PROXY", "no_proxy")
NO_PROXY_NEEDS = ("localhost", "127.0.0.1")

CLOCK_TOLERANCE = 5.0  # seconds; an HTTP Date has 1 s resolution, a launch takes about 1 s
