"""The CA (inspection, test world): leaves verify against it, carry their SANs, keys stay secret."""

from __future__ import annotations

import datetime as dt
import ipaddress
import stat
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import serialization
from cryptography.x509.verification import PolicyBuilder, Store, VerificationError

from sandgate.gateway.proxy.ca import CA, make_ca, write_pair


@pytest.fixture(scope="module")
def ca() -> CA:
    return make_ca("sg test CA")


def _verify(ca: CA, cert_pem: bytes, name: x509.DNSName | x509.IPAddress) -> None:
    leaf = x509.load_pem_x509_certificate(cert_pem)
    verifier = PolicyBuilder().store(Store([ca.cert])).build_server_verifier(name)
    verifier.verify(leaf, [])


def test_leaf_verifies_for_its_names_and_ips(ca: CA) -> None:
    cert_pem, _ = ca.issue(["example.test", "www.example.test"], ["203.0.113.10", "2001:db8::1"])
    _verify(ca, cert_pem, x509.DNSName("example.test"))
    _verify(ca, cert_pem, x509.DNSName("www.example.test"))
    _verify(ca, cert_pem, x509.IPAddress(ipaddress.ip_address("203.0.113.10")))
    _verify(ca, cert_pem, x509.IPAddress(ipaddress.ip_address("2001:db8::1")))
    with pytest.raises(VerificationError):
        _verify(ca, cert_pem, x509.DNSName("other.test"))


def test_leaf_sans_and_extensions(ca: CA) -> None:
    cert_pem, key_pem = ca.issue(["a.test"], ["198.51.100.7"], days=3)
    cert = x509.load_pem_x509_certificate(cert_pem)
    san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert san.get_values_for_type(x509.DNSName) == ["a.test"]
    assert san.get_values_for_type(x509.IPAddress) == [ipaddress.ip_address("198.51.100.7")]
    assert cert.extensions.get_extension_for_class(x509.BasicConstraints).value.ca is False
    life = cert.not_valid_after_utc - cert.not_valid_before_utc
    assert dt.timedelta(days=3) < life <= dt.timedelta(days=3, hours=1)
    cert.verify_directly_issued_by(ca.cert)
    key = serialization.load_pem_private_key(key_pem, None)
    assert key.public_key().public_bytes(
        serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
    ) == cert.public_key().public_bytes(
        serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
    )


def test_serials_are_random_and_keys_fresh(ca: CA) -> None:
    leaves = [x509.load_pem_x509_certificate(ca.issue(["a.test"])[0]) for _ in range(3)]
    assert len({c.serial_number for c in leaves}) == 3
    assert len({c.public_key().public_numbers().x for c in leaves}) == 3  # type: ignore[union-attr]


def test_issue_can_reuse_a_key(ca: CA) -> None:
    _, key = ca.issue_cert(["a.test"])
    cert, same = ca.issue_cert(["b.test"], key=key)
    assert same is key
    assert cert.public_key() == key.public_key()


def test_needs_a_name(ca: CA) -> None:
    with pytest.raises(ValueError, match="at least one"):
        ca.issue([], [])


def test_save_load_roundtrip_and_key_mode(ca: CA, tmp_path: Path) -> None:
    ca.save(tmp_path / "ca")
    assert stat.S_IMODE((tmp_path / "ca" / "ca.key").stat().st_mode) == 0o600
    assert stat.S_IMODE((tmp_path / "ca" / "ca.pem").stat().st_mode) == 0o644
    loaded = CA.load(tmp_path / "ca")
    assert loaded.cert == ca.cert
    cert_pem, _ = loaded.issue(["x.test"])
    _verify(ca, cert_pem, x509.DNSName("x.test"))


def test_write_pair_tightens_an_existing_key_file(ca: CA, tmp_path: Path) -> None:
    key_path = tmp_path / "leaf.key"
    key_path.write_bytes(b"old")
    key_path.chmod(0o644)
    cert_pem, key_pem = ca.issue(["a.test"])
    write_pair(tmp_path, "leaf", cert_pem, key_pem)
    assert stat.S_IMODE(key_path.stat().st_mode) == 0o600
    assert key_path.read_bytes() == key_pem


def test_name_constraints_limit_the_ca() -> None:
    limited = make_ca(
        "sg inspect CA", permitted_dns=["allowed.test"], permitted_ips=["203.0.113.0/24"]
    )
    nc = limited.cert.extensions.get_extension_for_class(x509.NameConstraints)
    assert nc.critical
    good, _ = limited.issue(["api.allowed.test"], ["203.0.113.5"])
    _verify(limited, good, x509.DNSName("api.allowed.test"))
    bad, _ = limited.issue(["evil.test"])
    with pytest.raises(VerificationError):
        _verify(limited, bad, x509.DNSName("evil.test"))


def test_ca_validity_is_configurable() -> None:
    now = dt.datetime(2030, 1, 1, tzinfo=dt.UTC)
    short = make_ca("short", days=2, now=now)
    assert short.cert.not_valid_after_utc == now + dt.timedelta(days=2)
    assert short.cert.extensions.get_extension_for_class(x509.BasicConstraints).value.ca
