"""What a refused request was aimed at (``aimed_at``), read from raw head bytes however broken;
and what of a target or an h11 error may be shown (``redact_target``, ``h11_message``)."""

from __future__ import annotations

import h11
import pytest
from hypothesis import given
from hypothesis import strategies as st

from sandgate.gateway.proxy.httphead import MAX_HEAD_BYTES, Aim, aimed_at, h11_message

from .test_httphead import BAD, head

AIMS = [
    # (raw head bytes, what it was aimed at)
    (head("GET /p?token=s3cret HTTP/1.1", "Host: a.example"), Aim("a.example", None, "/p?…")),
    (head("GET / HTTP/1.1", "host:  A.Example:8080 "), Aim("a.example", 8080, "/")),
    (head("GET http://u:pw@a.example/x?k=v HTTP/1.1"), Aim("a.example", 80, "/x?…")),
    (head("GET https://a.example:8443 HTTP/1.1"), Aim("a.example", 8443, "/")),
    (head("CONNECT user:pw@a.example:443 HTTP/1.1"), Aim("a.example", 443, None)),
    (head("CONNECT a.example:443\x00 HTTP/1.1"), Aim("a.example", None, None)),  # NUL in port
    (head("CONNECT a.exa\x00mple:443 HTTP/1.1"), Aim("a.exa?mple", 443, None)),
    # origin form naming the metadata service, written every way hostparse reads
    (
        head("GET /latest HTTP/1.1", "Host: 169.254.169.254"),
        Aim("169.254.169.254", None, "/latest", "169.254.169.254"),
    ),
    (
        head("GET / HTTP/1.1", "Host: 0xa9fea9fe"),
        Aim("169.254.169.254", None, "/", "169.254.169.254"),
    ),
    (
        head("GET / HTTP/1.1", "Host: [::ffff:169.254.169.254]:80"),
        Aim("::ffff:a9fe:a9fe", 80, "/", "::ffff:a9fe:a9fe"),
    ),
    (
        head("GET / HTTP/1.1", "Host: metadata.google.internal."),
        Aim("metadata.google.internal", None, "/"),
    ),
    # broken framing: the target is still read
    (b"GET /x HTTP/1.1\nHost: a.example\n\n", Aim("a.example", None, "/x")),
    (b"GET / HTTP/1.1\r\nHost: a.example\r\nX: a\r\n b\r\n\r\n", Aim("a.example", None, "/")),
    (
        b"GET / HTTP/1.1\r\nHost: a.example\r\nX: " + b"a" * (MAX_HEAD_BYTES + 10),
        Aim("a.example", None, "/"),
    ),  # oversized: what came before the limit
    (b"GET /?q=" + b"a" * 500 + b" HTTP/1.1\r\n", Aim(None, None, "/?…")),
    (b"\x16\x03\x01\x02\x00", Aim()),  # a TLS ClientHello on the HTTP port
    (b"", Aim()),
]


@pytest.mark.parametrize(("raw", "aim"), AIMS)
def test_aimed_at(raw: bytes, aim: Aim) -> None:
    assert aimed_at(raw) == aim


# Refused vectors that name nothing a reader could use; every other refusal records its target.
NAMELESS = {
    "missing Host",
    "missing Host, HTTP/1.0 origin-form",
    "empty Host",
    "obs-fold of Host",
    "CONNECT no host",
    "URL without host",
    "HTTP/2 preface",
    "HTTP/0.9",
}


@pytest.mark.parametrize("row", BAD, ids=[str(r[0]) for r in BAD])
def test_every_refused_head_names_its_target(row: tuple[object, ...]) -> None:
    name, raw = str(row[0]), row[1]
    assert isinstance(raw, bytes)
    aim = aimed_at(raw)
    assert (aim.name is None) == (name in NAMELESS), aim
    assert "pw" not in repr(aim) and "u:p" not in repr(aim)


@given(st.binary(max_size=300))
def test_aimed_at_never_raises_and_shows_only_printable_text(raw: bytes) -> None:
    aim = aimed_at(raw)
    for text in (aim.name, aim.path):
        # ASCII but for the redaction marker ("?…", "…@")
        assert text is None or (text.replace("…", "").isascii() and text.isprintable())


@pytest.mark.parametrize(
    "raw",
    [
        b"GET /?key=sk-s3cret HTTP/1.1 junk\r\n\r\n",
        b"GET / HTTP/1.1\r\nAuthorization : Bearer sk-s3cret\r\n\r\n",
        b"GET / HTTP/1.1\r\nHost: a\r\nX-Api-Key: sk-s3cret\x00\r\n\r\n",
    ],
)
def test_h11_messages_lose_the_bytes_they_quote(raw: bytes) -> None:
    conn = h11.Connection(h11.SERVER)
    conn.receive_data(raw)
    with pytest.raises(h11.RemoteProtocolError) as err:
        conn.next_event()
    assert "sk-s3cret" in str(err.value)  # h11 quotes it ...
    shown = h11_message(err.value)
    assert "s3cret" not in shown and shown.startswith(("illegal", "Illegal"))  # ... we do not


def test_h11_messages_without_bytes_are_kept() -> None:
    error = h11.RemoteProtocolError("Missing mandatory Host: header", 400)
    assert h11_message(error) == "Missing mandatory Host: header"
