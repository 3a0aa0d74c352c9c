"""A small X.509 certificate authority: the proxy's inspection CA (tls.py), and the test world's.

The test world (world/topology.py) makes its own CA with it for its servers; production code
never imports ``world/``, so the mechanism lives here with the proxy that depends on it.

Everything here is pure (objects and PEM bytes in, objects and PEM bytes out) except
`CA.save`, `CA.load` and `write_pair`, which touch the file system. Keys are ECDSA P-256:
quick to generate, so issuing a leaf per name at server start-up costs milliseconds.

Layout written by `CA.save(dir)`: `dir/ca.pem` (0644) and `dir/ca.key` (0600, unencrypted).
"""

from __future__ import annotations

import datetime as dt
import ipaddress
import os
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

__all__ = ["CA", "IPLike", "make_ca", "write_pair"]

IPLike = str | ipaddress.IPv4Address | ipaddress.IPv6Address
CA_CERT_FILE = "ca.pem"
CA_KEY_FILE = "ca.key"
# Certificates start an hour in the past so that a namespace whose clock lags a little
# (or a test that fakes time) still accepts them.
_BACKDATE = dt.timedelta(hours=1)


def _now(now: dt.datetime | None) -> dt.datetime:
    return now if now is not None else dt.datetime.now(dt.UTC)


def _new_key() -> ec.EllipticCurvePrivateKey:
    return ec.generate_private_key(ec.SECP256R1())


def _key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )


def _as_ip(value: IPLike) -> ipaddress.IPv4Address | ipaddress.IPv6Address:
    return value if not isinstance(value, str) else ipaddress.ip_address(value)


@dataclass(frozen=True)
class CA:
    """A CA certificate with its private key; `issue` signs leaf certificates."""

    cert: x509.Certificate
    key: ec.EllipticCurvePrivateKey

    @property
    def cert_pem(self) -> bytes:
        return self.cert.public_bytes(serialization.Encoding.PEM)

    @property
    def key_pem(self) -> bytes:
        return _key_pem(self.key)

    def issue(
        self,
        names: Iterable[str] = (),
        ips: Iterable[IPLike] = (),
        days: float = 30,
        *,
        common_name: str | None = None,
        key: ec.EllipticCurvePrivateKey | None = None,
        now: dt.datetime | None = None,
    ) -> tuple[bytes, bytes]:
        """A server leaf for `names` and `ips` (the SANs); returns (cert PEM, key PEM).

        Pass `key` to reuse a leaf key (an inspecting proxy may keep one key for all the
        certificates it forges); by default each leaf gets a fresh key.
        """
        cert, leaf_key = self.issue_cert(
            names, ips, days, common_name=common_name, key=key, now=now
        )
        return cert.public_bytes(serialization.Encoding.PEM), _key_pem(leaf_key)

    def issue_cert(
        self,
        names: Iterable[str] = (),
        ips: Iterable[IPLike] = (),
        days: float = 30,
        *,
        common_name: str | None = None,
        key: ec.EllipticCurvePrivateKey | None = None,
        now: dt.datetime | None = None,
    ) -> tuple[x509.Certificate, ec.EllipticCurvePrivateKey]:
        """Like `issue`, returning objects instead of PEM."""
        dns_names = list(dict.fromkeys(names))
        ip_addrs = list(dict.fromkeys(_as_ip(ip) for ip in ips))
        if not dns_names and not ip_addrs:
            raise ValueError("a leaf certificate needs at least one DNS name or IP address")
        leaf_key = key if key is not None else _new_key()
        sans: list[x509.GeneralName] = [x509.DNSName(n) for n in dns_names]
        sans += [x509.IPAddress(ip) for ip in ip_addrs]
        cn = common_name or (dns_names[0] if dns_names else str(ip_addrs[0]))
        start = _now(now)
        issuer_ski = self.cert.extensions.get_extension_for_class(x509.SubjectKeyIdentifier)
        builder = (
            x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn[:64])]))
            .issuer_name(self.cert.subject)
            .public_key(leaf_key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(start - _BACKDATE)
            .not_valid_after(start + dt.timedelta(days=days))
            .add_extension(x509.SubjectAlternativeName(sans), critical=False)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(_key_usage(cert_sign=False), critical=True)
            .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
            .add_extension(
                x509.SubjectKeyIdentifier.from_public_key(leaf_key.public_key()), critical=False
            )
            .add_extension(
                x509.AuthorityKeyIdentifier.from_issuer_subject_key_identifier(issuer_ski.value),
                critical=False,
            )
        )
        return builder.sign(self.key, hashes.SHA256()), leaf_key

    def save(self, directory: str | os.PathLike[str]) -> None:
        """Write `ca.pem` and `ca.key` (mode 0600) into `directory`, creating it."""
        write_pair(directory, "ca", self.cert_pem, self.key_pem)

    @classmethod
    def load(cls, directory: str | os.PathLike[str]) -> CA:
        folder = Path(directory)
        cert = x509.load_pem_x509_certificate((folder / CA_CERT_FILE).read_bytes())
        key = serialization.load_pem_private_key((folder / CA_KEY_FILE).read_bytes(), None)
        if not isinstance(key, ec.EllipticCurvePrivateKey):
            raise ValueError(f"{folder / CA_KEY_FILE}: not an EC private key")
        return cls(cert=cert, key=key)


def _key_usage(*, cert_sign: bool) -> x509.KeyUsage:
    return x509.KeyUsage(
        digital_signature=not cert_sign,
        content_commitment=False,
        key_encipherment=False,
        data_encipherment=False,
        key_agreement=False,
        key_cert_sign=cert_sign,
        crl_sign=cert_sign,
        encipher_only=False,
        decipher_only=False,
    )


def make_ca(
    common_name: str,
    *,
    days: float = 365,
    permitted_dns: Sequence[str] | None = None,
    permitted_ips: Sequence[str] | None = None,
    now: dt.datetime | None = None,
) -> CA:
    """A fresh self-signed CA that may sign leaves only (path length 0).

    `permitted_dns` / `permitted_ips` (networks such as "203.0.113.0/24") add a critical
    NameConstraints extension, so a leaked key cannot mint certificates for other names:
    the inspection CA will restrict itself to the hosts a policy lets it intercept.
    """
    key = _new_key()
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name[:64])])
    start = _now(now)
    builder = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(start - _BACKDATE)
        .not_valid_after(start + dt.timedelta(days=days))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(_key_usage(cert_sign=True), critical=True)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
    )
    if permitted_dns is not None or permitted_ips is not None:
        permitted: list[x509.GeneralName] = [x509.DNSName(n) for n in permitted_dns or ()]
        permitted += [x509.IPAddress(ipaddress.ip_network(n)) for n in permitted_ips or ()]
        builder = builder.add_extension(
            x509.NameConstraints(permitted_subtrees=permitted, excluded_subtrees=None),
            critical=True,
        )
    return CA(cert=builder.sign(key, hashes.SHA256()), key=key)


def _write(path: Path, data: bytes, mode: int) -> None:
    # O_CREAT with the final mode, then fchmod: an existing file keeps no wider mode
    # and there is no moment where a key is readable by others.
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    try:
        os.fchmod(fd, mode)
        os.write(fd, data)
    finally:
        os.close(fd)


def write_pair(
    directory: str | os.PathLike[str], stem: str, cert_pem: bytes, key_pem: bytes
) -> tuple[Path, Path]:
    """Write `<stem>.pem` (0644) and `<stem>.key` (0600); returns both paths."""
    folder = Path(directory)
    folder.mkdir(parents=True, exist_ok=True)
    cert_path, key_path = folder / f"{stem}.pem", folder / f"{stem}.key"
    _write(key_path, key_pem, 0o600)
    _write(cert_path, cert_pem, 0o644)
    return cert_path, key_path
