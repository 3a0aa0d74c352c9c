"""Who the dashboard lets in (report/dashboard.py): pure checks, a table of cases."""

from __future__ import annotations

from pathlib import Path

import pytest

from sandgate.errors import SandgateError
from sandgate.report.dashboard import (
    Access,
    approval_call,
    is_loopback,
    let_in,
    listener_hosts,
    load_token,
    options,
    parse_listen,
    token_given,
    token_matches,
)

TOKEN = "s3cret-token_value"
HOSTS = listener_hosts("127.0.0.1", 8377)
ACCESS = Access(TOKEN, frozenset({1000}), HOSTS)
HOST = "127.0.0.1:8377"


def test_token_compare() -> None:
    assert token_matches(TOKEN, TOKEN)
    assert not token_matches(TOKEN[:-1], TOKEN)
    assert not token_matches(TOKEN + "x", TOKEN)
    assert not token_matches("", TOKEN)
    assert not token_matches(None, TOKEN)
    assert not token_matches("", "")  # no token configured lets nobody in by token


@pytest.mark.parametrize(
    ("target", "headers", "want"),
    [
        ("/", {}, None),
        ("/events?token=abc", {}, "abc"),
        ("/metrics?x=1&token=a%2Fb", {}, "a/b"),
        ("/", {"authorization": "Bearer abc"}, "abc"),
        ("/", {"authorization": "bearer  abc "}, "abc"),
        ("/?token=q", {"authorization": "Bearer h"}, "h"),
        ("/", {"authorization": "Basic abc"}, None),
        ("/", {"authorization": "Bearer "}, None),
    ],
)
def test_token_given(target: str, headers: dict[str, str], want: str | None) -> None:
    assert token_given(target, headers) == want


@pytest.mark.parametrize(
    ("peer", "owner", "token", "host", "allowed"),
    [
        ("127.0.0.1", 0, None, HOST, True),  # root's socket: let in by its owner
        ("127.0.0.1", 1000, None, HOST, True),  # an --allow-uid
        ("127.0.0.1", 65534, None, HOST, False),  # anyone else needs the token
        ("127.0.0.1", 65534, TOKEN, HOST, True),
        ("127.0.0.1", 65534, "wrong", HOST, False),
        ("127.0.0.1", None, None, HOST, False),  # owner unknown: token
        ("::1", 0, None, "[::1]:8377", False),  # not a Host of this listener
        ("127.0.0.1", 0, None, "localhost:8377", True),
        ("127.0.0.1", 0, None, "LOCALHOST:8377", True),
        ("127.0.0.1", 0, None, "evil.example:8377", False),  # DNS rebinding
        ("127.0.0.1", 0, TOKEN, "evil.example:8377", False),
        ("127.0.0.1", 0, None, None, False),
        ("10.1.2.3", 0, None, HOST, False),  # the owner rule is for loopback only
        ("10.1.2.3", 0, TOKEN, HOST, True),
        ("::ffff:127.0.0.1", 0, None, HOST, True),
    ],
)
def test_let_in(
    peer: str, owner: int | None, token: str | None, host: str | None, allowed: bool
) -> None:
    assert let_in(ACCESS, peer, owner, token, host) is allowed


def test_public_listener_takes_any_host_but_the_token() -> None:
    public = Access(TOKEN)
    assert let_in(public, "192.0.2.7", None, TOKEN, "dash.example:8377")
    assert not let_in(public, "192.0.2.7", None, None, "dash.example:8377")
    assert not let_in(public, "192.0.2.7", 0, None, "dash.example:8377")


@pytest.mark.parametrize(
    ("address", "loopback"),
    [("127.0.0.1", True), ("127.9.9.9", True), ("::1", True), ("::ffff:127.0.0.1", True),
     ("10.0.0.1", False), ("0.0.0.0", False), ("::", False), ("not-an-ip", False), ("", False)],
)  # fmt: skip
def test_is_loopback(address: str, loopback: bool) -> None:
    assert is_loopback(address) is loopback


def test_listener_hosts_v6() -> None:
    assert "[::1]:8377" in listener_hosts("::1", 8377)
    assert "localhost:8377" in listener_hosts("::1", 8377)


def test_parse_listen() -> None:
    assert parse_listen("127.0.0.1:8377") == ("127.0.0.1", 8377)
    assert parse_listen("[::1]:0") == ("::1", 0)
    for bad in ("8377", "127.0.0.1", "127.0.0.1:http", "localhost:8377", ":8377", "1.2.3.4:70000"):
        with pytest.raises(SandgateError, match="--listen"):
            parse_listen(bad)


def test_non_loopback_needs_public() -> None:
    with pytest.raises(SandgateError, match="not a loopback address") as info:
        options("t", Path("/nonexistent"), Path("/nonexistent"), "0.0.0.0:8377")
    assert "--public" in (info.value.fix or "")
    opts = options("t", Path("/x"), Path("/x"), "0.0.0.0:8377", public=True)
    assert opts.access.hosts == frozenset()  # token for everyone
    assert len(opts.access.token) >= 32
    local = options("t", Path("/x"), Path("/x"), "127.0.0.1:8377", [1000])
    assert local.access.allow_uids == {1000}
    assert local.access.token != opts.access.token


def test_token_file(tmp_path: Path) -> None:
    path = tmp_path / "token"
    made = load_token(path)
    assert path.stat().st_mode & 0o777 == 0o600
    assert load_token(path) == made  # the same across restarts
    path.write_text("short\n")
    with pytest.raises(SandgateError, match="too short"):
        load_token(path)
    with pytest.raises(SandgateError, match="cannot write"):
        load_token(tmp_path / "no-such-dir" / "token")


JSON = {"content-type": "application/json"}


@pytest.mark.parametrize(
    ("headers", "body", "want"),
    [
        (JSON, b'{"name": "pypi.org"}', {"op": "approve", "name": "pypi.org", "verdict": "allow"}),
        (
            {**JSON, "origin": "http://127.0.0.1:8377"},
            b'{"name": "pypi.org", "verdict": "always", "guest": "sg-g1"}',
            {"op": "approve", "name": "pypi.org", "verdict": "always", "guest": "sg-g1"},
        ),
        # A page elsewhere: a form post (no preflight) or a fetch from another origin.
        ({"content-type": "text/plain"}, b'{"name": "pypi.org"}', "content-type"),
        ({"content-type": "application/x-www-form-urlencoded"}, b"name=pypi.org", "content-type"),
        ({**JSON, "origin": "http://evil.example"}, b'{"name": "pypi.org"}', "own page"),
        ({**JSON, "origin": "null"}, b'{"name": "pypi.org"}', "own page"),
        (JSON, b"{not json", "not JSON"),
        (JSON, b'{"verdict": "allow"}', "names what waits"),
        (JSON, b'{"name": "pypi.org", "verdict": "maybe"}', "allow, always, deny"),
    ],
)
def test_an_answer_from_the_page(headers: dict[str, str], body: bytes, want: object) -> None:
    call, why = approval_call(headers, body, HOSTS)
    if isinstance(want, dict):
        assert call == want and why == ""
    else:
        assert call is None and str(want) in why
