"""The cluster's PKI: one CA, the API server's serving certificate, client certificates, the
service-account signing key, and kubeconfig files that embed them."""

from __future__ import annotations

import base64
import datetime
import ipaddress
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import yaml
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

VALIDITY = datetime.timedelta(days=365)
ADMIN_USER = "devcluster-admin"
ADMIN_GROUPS = ("system:masters",)


@dataclass(frozen=True)
class Pki:
    """File layout of the PKI directory (`DIR/pki`)."""

    dir: Path

    @property
    def ca_cert(self) -> Path:
        return self.dir / "ca.crt"

    @property
    def ca_key(self) -> Path:
        return self.dir / "ca.key"

    @property
    def serving_cert(self) -> Path:
        return self.dir / "apiserver.crt"

    @property
    def serving_key(self) -> Path:
        return self.dir / "apiserver.key"

    @property
    def service_account_key(self) -> Path:
        return self.dir / "sa.key"

    @property
    def service_account_pub(self) -> Path:
        return self.dir / "sa.pub"


@dataclass(frozen=True)
class ClientCredentials:
    """A client certificate and key in PEM form."""

    cert_pem: bytes
    key_pem: bytes


def _new_key() -> ec.EllipticCurvePrivateKey:
    return ec.generate_private_key(ec.SECP256R1())


def _key_pem(key: ec.EllipticCurvePrivateKey | rsa.RSAPrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )


def _cert_pem(cert: x509.Certificate) -> bytes:
    return cert.public_bytes(serialization.Encoding.PEM)


def _write_private(path: Path, data: bytes) -> None:
    path.touch(mode=0o600, exist_ok=True)
    path.write_bytes(data)


def _builder(subject: x509.Name, issuer: x509.Name, public_key: ec.EllipticCurvePublicKey) -> x509.CertificateBuilder:
    now = datetime.datetime.now(datetime.timezone.utc)
    return (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(issuer)
        .public_key(public_key)
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + VALIDITY)
    )


def _load_ca(pki: Pki) -> tuple[x509.Certificate, ec.EllipticCurvePrivateKey]:
    cert = x509.load_pem_x509_certificate(pki.ca_cert.read_bytes())
    key = serialization.load_pem_private_key(pki.ca_key.read_bytes(), password=None)
    assert isinstance(key, ec.EllipticCurvePrivateKey)
    return cert, key


def create_pki(directory: Path) -> Pki:
    """Write a fresh CA, the API server's serving cert (127.0.0.1, localhost) and the SA key pair."""
    pki = Pki(directory)
    directory.mkdir(parents=True, exist_ok=True)
    ca_key = _new_key()
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "egress-placer-devcluster-ca")])
    ca_cert = (
        _builder(ca_name, ca_name, ca_key.public_key())
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .add_extension(x509.KeyUsage(True, False, False, False, False, True, True, False, False), critical=True)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key()), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    _write_private(pki.ca_key, _key_pem(ca_key))
    pki.ca_cert.write_bytes(_cert_pem(ca_cert))

    serving = issue_serving_cert(pki, "kube-apiserver", dns_names=("localhost", "kubernetes", "kubernetes.default"))
    _write_private(pki.serving_key, serving.key_pem)
    pki.serving_cert.write_bytes(serving.cert_pem)

    sa_key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    _write_private(pki.service_account_key, _key_pem(sa_key))
    pki.service_account_pub.write_bytes(
        sa_key.public_key().public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
    )
    return pki


def issue_serving_cert(
    pki: Pki, common_name: str, dns_names: Sequence[str] = ("localhost",), ips: Sequence[str] = ("127.0.0.1",)
) -> ClientCredentials:
    """A TLS server certificate signed by the cluster CA (e.g. for an admission webhook on loopback)."""
    ca_cert, ca_key = _load_ca(pki)
    key = _new_key()
    names: list[x509.GeneralName] = [x509.DNSName(n) for n in dns_names]
    names += [x509.IPAddress(ipaddress.ip_address(ip)) for ip in ips]
    cert = (
        _builder(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)]), ca_cert.subject, key.public_key())
        .add_extension(x509.SubjectAlternativeName(names), critical=False)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .sign(ca_key, hashes.SHA256())
    )
    return ClientCredentials(cert_pem=_cert_pem(cert), key_pem=_key_pem(key))


def issue_client_cert(pki: Pki, user: str, groups: Sequence[str]) -> ClientCredentials:
    """A client certificate the API server maps to `user` (CN) in `groups` (O, one each)."""
    ca_cert, ca_key = _load_ca(pki)
    key = _new_key()
    subject = x509.Name(
        [x509.NameAttribute(NameOID.ORGANIZATION_NAME, g) for g in groups]
        + [x509.NameAttribute(NameOID.COMMON_NAME, user)]
    )
    cert = (
        _builder(subject, ca_cert.subject, key.public_key())
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.CLIENT_AUTH]), critical=False)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .sign(ca_key, hashes.SHA256())
    )
    return ClientCredentials(cert_pem=_cert_pem(cert), key_pem=_key_pem(key))


def service_account_groups(user: str) -> tuple[str, ...]:
    """The groups the API server gives `system:serviceaccount:NS:NAME` users; () for other users."""
    parts = user.split(":")
    if len(parts) == 4 and parts[:2] == ["system", "serviceaccount"] and parts[2] and parts[3]:
        return ("system:serviceaccounts", f"system:serviceaccounts:{parts[2]}", "system:authenticated")
    return ("system:authenticated",)


def write_kubeconfig(path: Path, server: str, pki: Pki, user: str, credentials: ClientCredentials) -> Path:
    """A self-contained kubeconfig (CA and client cert embedded), readable by its owner only."""

    def b64(data: bytes) -> str:
        return base64.b64encode(data).decode()

    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [
            {
                "name": "devcluster",
                "cluster": {"server": server, "certificate-authority-data": b64(pki.ca_cert.read_bytes())},
            }
        ],
        "users": [
            {
                "name": user,
                "user": {
                    "client-certificate-data": b64(credentials.cert_pem),
                    "client-key-data": b64(credentials.key_pem),
                },
            }
        ],
        "contexts": [{"name": "devcluster", "context": {"cluster": "devcluster", "user": user}}],
        "current-context": "devcluster",
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    _write_private(path, yaml.safe_dump(config, sort_keys=False).encode())
    return path
