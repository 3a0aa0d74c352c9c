"""Placeholder credentials: the swap, the refusals, and the redaction of responses."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from sandgate.errors import SandgateError
from sandgate.gateway.proxy.credentials import (
    BodyScanner,
    Redactor,
    Secret,
    load_secrets,
    make_placeholder,
    read_value,
    redact_headers,
    rewrite_headers,
)
from sandgate.policy.model import SecretSpec
from sandgate.policy.patterns import parse_pattern

REAL = "sk-real-0123456789abcdefghijklmnopqrstuv"
OPENAI = Secret(
    "openai", (parse_pattern("api.openai.com"),), make_placeholder("openai", len(REAL)), REAL
)
OTHER = Secret(
    "gh", (parse_pattern("*.github.com"),), make_placeholder("gh", 40), "ghp_" + "x" * 36
)
SECRETS = (OPENAI, OTHER)


def test_placeholder_is_as_long_as_the_value_and_hides_it() -> None:
    assert len(OPENAI.placeholder) == len(REAL) and OPENAI.placeholder.startswith("sg-openai-")
    assert REAL not in repr(OPENAI)


def test_swap_on_inspected_tls_to_the_secrets_host() -> None:
    headers = [
        (b"Host", b"api.openai.com"),
        (b"Authorization", b"Bearer " + OPENAI.placeholder.encode()),
    ]
    v = rewrite_headers(headers, "api.openai.com", SECRETS, tls=True)
    assert v.exfiltration is None and v.injected == ("openai",)
    assert (b"Authorization", b"Bearer " + REAL.encode()) in v.headers


@pytest.mark.parametrize("name", [b"authorization", b"X-Api-Key", b"API-KEY", b"Cookie"])
def test_the_clients_own_credentials_for_that_host_are_dropped(name: bytes) -> None:
    v = rewrite_headers([(name, b"my-own-token")], "api.openai.com", SECRETS, tls=True)
    assert v.headers == [] and v.dropped == (name.decode().lower(),)


def test_never_on_plaintext_even_to_its_own_host() -> None:
    headers = [(b"authorization", b"Bearer " + OPENAI.placeholder.encode())]
    assert rewrite_headers(headers, "api.openai.com", SECRETS, tls=False).exfiltration == "openai"


@pytest.mark.parametrize(
    "headers,target",
    [
        ([(b"authorization", b"Bearer {p}")], b"/"),
        ([(b"x-anything", b"{p}")], b"/"),
        ([(b"{p}", b"1")], b"/"),
        ([], b"/?key={p}"),
    ],
)
def test_placeholder_bound_elsewhere_is_exfiltration(
    headers: list[tuple[bytes, bytes]], target: bytes
) -> None:
    p = OPENAI.placeholder.encode()
    hs = [(n.replace(b"{p}", p), v.replace(b"{p}", p)) for n, v in headers]
    v = rewrite_headers(hs, "example.com", SECRETS, tls=True, target=target.replace(b"{p}", p))
    assert v.exfiltration == "openai"


def test_body_scanner_finds_placeholders_across_chunks() -> None:
    p = OPENAI.placeholder.encode()
    for cut in range(len(p) + 1):
        scanner = BodyScanner(SECRETS)
        first = scanner.feed(b"data=" + p[:cut])
        if cut == len(p):  # the placeholder arrived whole in one chunk
            assert first == "openai"
            continue
        assert first is None
        assert scanner.feed(p[cut:] + b"&x=1") == "openai"
    assert BodyScanner(SECRETS).feed(p) == "openai"
    assert BodyScanner(SECRETS).feed(b"x" * 100) is None


@given(st.lists(st.binary(max_size=50), max_size=20))
def test_redactor_is_lossless_without_secrets(chunks: list[bytes]) -> None:
    r = Redactor(SECRETS)
    out = b"".join(r.feed(c) for c in chunks) + r.flush()
    joined = b"".join(chunks)
    if REAL.encode() not in joined and OTHER.value.encode() not in joined:
        assert out == joined


def test_redactor_replaces_a_value_split_anywhere_and_holds_back_only_a_possible_start() -> None:
    body = b'{"echo": "Bearer ' + REAL.encode() + b'"}\n\n'
    for cut in range(len(body)):
        r = Redactor(SECRETS)
        out = r.feed(body[:cut]) + r.feed(body[cut:]) + r.flush()
        assert REAL.encode() not in out and OPENAI.placeholder.encode() in out
    r = Redactor(SECRETS)
    assert r.feed(b"data: done\n\n") == b"data: done\n\n"  # nothing held: SSE stays live


def test_response_headers_are_redacted() -> None:
    out = redact_headers([(b"x-echo", REAL.encode())], SECRETS)
    assert out == [(b"x-echo", OPENAI.placeholder.encode())]


@pytest.mark.parametrize("mode", [0o640, 0o604, 0o620, 0o602, 0o644, 0o660])
def test_a_secret_file_others_can_reach_is_refused(tmp_path: Path, mode: int) -> None:
    path = tmp_path / "key"
    path.write_text(REAL + "\n")
    path.chmod(mode)
    with pytest.raises(SandgateError) as err:
        read_value("openai", f"file:{path}")
    assert "'openai'" in err.value.message and f"{mode:04o}" in err.value.message
    assert REAL not in str(err.value) and err.value.fix == f"chmod 600 {path} (and chown root)"
    path.chmod(0o600)
    assert read_value("openai", f"file:{path}") == REAL


def test_missing_and_empty_secret_sources_are_refused(tmp_path: Path) -> None:
    with pytest.raises(SandgateError, match="'gh': cannot read"):
        read_value("gh", f"file:{tmp_path / 'nothing'}")
    (tmp_path / "empty").write_text("\n")
    (tmp_path / "empty").chmod(0o600)
    with pytest.raises(SandgateError, match=r"'gh': .* is empty"):
        read_value("gh", f"file:{tmp_path / 'empty'}")
    with pytest.raises(SandgateError, match="no SG_TEST_UNSET_VAR") as err:
        read_value("gh", "env:SG_TEST_UNSET_VAR")
    assert err.value.fix is not None and "export SG_TEST_UNSET_VAR" in err.value.fix


@pytest.mark.parametrize(
    "placeholder",
    [REAL, REAL[:20], "x" + REAL + "x", REAL[5:], "Bearer " + REAL],
)
def test_a_placeholder_that_overlaps_the_real_value_is_refused(
    monkeypatch: pytest.MonkeyPatch, placeholder: str
) -> None:
    monkeypatch.setenv("SG_TEST_KEY", REAL)
    spec = SecretSpec(
        name="openai", hosts=["api.openai.com"], value="env:SG_TEST_KEY", placeholder=placeholder
    )
    with pytest.raises(SandgateError) as err:
        load_secrets([spec])
    assert "'openai'" in err.value.message and "overlaps" in err.value.message
    assert err.value.fix == "choose another placeholder"
    assert REAL not in str(err.value)
    ok = spec.model_copy(update={"placeholder": "sg-openai-placeholder-0123456789"})
    assert load_secrets([ok])[0].value == REAL
