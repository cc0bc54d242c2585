"""The cluster's TLS material: a CA, and a key and certificate per process, signed by it
(``meridian certs --config FILE``); and the cluster secret of the RPC core.

Each process's certificate names the process (``shard-0``, ``shard-0-eu``, ``cm-us``: the
name its peers check, whatever address they dial, since links may go through a proxy) and
its host (an IP address or a DNS name) as subject alternative names. Keys are ECDSA P-256.
"""

from __future__ import annotations

import datetime
import ipaddress
import os
import secrets
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from store.config import ClusterConfig, ConfigError

SECRET_BYTES = 32


@dataclass(frozen=True)
class Issued:
    key_pem: bytes
    certificate_pem: bytes


def _name(common: str) -> x509.Name:
    return x509.Name([
        x509.NameAttribute(NameOID.ORGANIZATION_NAME, "Meridian"),
        x509.NameAttribute(NameOID.COMMON_NAME, common),
    ])


def _key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )


def make_ca(name: str, days: int, now: datetime.datetime | None = None) -> Issued:
    """A self-signed CA certificate and its key."""
    now = now or datetime.datetime.now(datetime.UTC)
    key = ec.generate_private_key(ec.SECP256R1())
    subject = _name(f"{name} CA")
    certificate = (
        x509.CertificateBuilder()
        .subject_name(subject).issuer_name(subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=days))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=False, content_commitment=False, key_encipherment=False,
                data_encipherment=False, key_agreement=False, key_cert_sign=True,
                crl_sign=True, encipher_only=False, decipher_only=False,
            ),
            critical=True,
        )
        .sign(key, hashes.SHA256())
    )
    return Issued(_key_pem(key), certificate.public_bytes(serialization.Encoding.PEM))


def make_certificate(
    ca: Issued, process: str, hosts: list[str], days: int,
    now: datetime.datetime | None = None,
) -> Issued:
    """A certificate for one process, for both ends of a TLS link (server and client)."""
    now = now or datetime.datetime.now(datetime.UTC)
    ca_key = serialization.load_pem_private_key(ca.key_pem, password=None)
    assert isinstance(ca_key, ec.EllipticCurvePrivateKey)
    ca_certificate = x509.load_pem_x509_certificate(ca.certificate_pem)
    key = ec.generate_private_key(ec.SECP256R1())
    names: list[x509.GeneralName] = [x509.DNSName(process)]
    for host in hosts:
        try:
            names.append(x509.IPAddress(ipaddress.ip_address(host)))
        except ValueError:
            names.append(x509.DNSName(host))
    certificate = (
        x509.CertificateBuilder()
        .subject_name(_name(process)).issuer_name(ca_certificate.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=days))
        .add_extension(x509.SubjectAlternativeName(names), critical=False)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(
            x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH]),
            critical=False,
        )
        .sign(ca_key, hashes.SHA256())
    )
    return Issued(_key_pem(key), certificate.public_bytes(serialization.Encoding.PEM))


def _write(path: Path, data: bytes, private: bool) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    if private:
        os.chmod(path, 0o600)


def write_cluster_certs(config: ClusterConfig, days: int = 365) -> list[Path]:
    """The CA, every process's key and certificate, and the cluster secret, where the
    cluster file's ``[security]`` says they are. An existing CA (and its key) and secret
    are kept, so that certificates issued again still match; process files are replaced."""
    security = config.security
    if security is None or security.ca is None or security.cert_dir is None:
        raise ConfigError("[security] needs ca and cert_dir to write certificates")
    written = []
    ca_key_path = security.ca.with_suffix(".key")
    if security.ca.exists() and ca_key_path.exists():
        ca = Issued(ca_key_path.read_bytes(), security.ca.read_bytes())
    else:
        ca = make_ca(config.name, days * 3)
        _write(ca_key_path, ca.key_pem, private=True)
        _write(security.ca, ca.certificate_pem, private=False)
        written += [security.ca, ca_key_path]
    for node in config.nodes():
        issued = make_certificate(ca, node.name, [node.rpc[0]], days)
        key_path, cert_path = security.identity_files(node)
        _write(key_path, issued.key_pem, private=True)
        _write(cert_path, issued.certificate_pem, private=False)
        written += [cert_path, key_path]
    if security.secret_file is not None and not security.secret_file.exists():
        _write(security.secret_file, secrets.token_hex(SECRET_BYTES).encode() + b"\n", private=True)
        written.append(security.secret_file)
    return written
