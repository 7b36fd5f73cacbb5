"""The webhook's serving certificate, made by the controller itself (no cert-manager needed), or
read from files that someone else keeps (cert-manager).

- Pure functions (`make_ca`, `make_serving_cert`, `needs_renewal`) with the `cryptography`
  library and a `now` passed in. Keys are ECDSA P-256 (small, fast handshakes, accepted by the
  API server).
- `ServingTLS` owns the server's `ssl.SSLContext`; `load` swaps the certificate on that SAME
  context, so new handshakes present the new certificate without a restart.
- `CertificateKeeper` keeps the Secret `settings.tls_secret` (keys `ca.crt`, `ca.key`, `tls.crt`,
  `tls.key`) current: the leader makes and renews it and keeps the webhooks' caBundle equal to the
  CA (the placement webhooks' and the pools API's); every replica loads what the Secret holds.
- `MountedCertificate` instead serves the pair in `settings.tls_cert_file` / `tls_key_file` (e.g.
  cert-manager's Secret mounted into the pod), loads it again when the files change, and writes
  nothing: the Secret and the webhook's caBundle belong to cert-manager (its CA injector).
"""

from __future__ import annotations

import asyncio
import ipaddress
import os
import shutil
import ssl
import tempfile
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Callable, Iterable, Protocol

from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID
from loguru import logger

from controller.core.pools_v1beta1 import crd_names
from controller.settings import Settings

CA_CERT, CA_KEY, TLS_CERT, TLS_KEY = "ca.crt", "ca.key", "tls.crt", "tls.key"
HTTP_CONFLICT = 409  # a write lost to another (resourceVersion changed, or the object already exists)
# Certificates start this much before `now`, so a replica whose clock lags a little accepts them.
BACKDATE = timedelta(hours=1)


@dataclass(frozen=True)
class KeyPair:
    """A PEM certificate and its PEM (PKCS#8, unencrypted) private key."""

    cert_pem: bytes
    key_pem: bytes


# --- pure functions -------------------------------------------------------------------------


def _new_key() -> ec.EllipticCurvePrivateKey:
    return ec.generate_private_key(ec.SECP256R1())


def _key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())


def _utc(now: datetime) -> datetime:
    return now if now.tzinfo else now.replace(tzinfo=UTC)


def _subject_alternative_names(hosts: Iterable[str]) -> list[x509.GeneralName]:
    names: list[x509.GeneralName] = []
    for host in dict.fromkeys(hosts):
        try:
            names.append(x509.IPAddress(ipaddress.ip_address(host)))
        except ValueError:
            names.append(x509.DNSName(host))
    return names


def make_ca(now: datetime, days: int = 3650) -> KeyPair:
    """A self-signed CA that signs only end-entity certificates (path length 0)."""
    now = _utc(now)
    key = _new_key()
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "egress-placer webhook CA")])
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - BACKDATE)
        .not_valid_after(now + timedelta(days=days))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(_key_usage(signs_certificates=True), critical=True)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .sign(key, hashes.SHA256())
    )
    return KeyPair(cert.public_bytes(serialization.Encoding.PEM), _key_pem(key))


def _key_usage(signs_certificates: bool) -> x509.KeyUsage:
    """Digital signatures (ECDSA TLS); a CA also signs certificates and CRLs."""
    return x509.KeyUsage(
        digital_signature=True,
        content_commitment=False,
        key_encipherment=False,
        data_encipherment=False,
        key_agreement=False,
        key_cert_sign=signs_certificates,
        crl_sign=signs_certificates,
        encipher_only=False,
        decipher_only=False,
    )


def make_serving_cert(ca: KeyPair, hosts: Iterable[str], now: datetime, days: int) -> KeyPair:
    """A server certificate signed by `ca` for `hosts` (DNS names and IP addresses, as SANs)."""
    now = _utc(now)
    hosts = list(dict.fromkeys(hosts))
    if not hosts:
        raise ValueError("a serving certificate needs at least one host")
    ca_cert = x509.load_pem_x509_certificate(ca.cert_pem)
    ca_key = serialization.load_pem_private_key(ca.key_pem, password=None)
    if not isinstance(ca_key, ec.EllipticCurvePrivateKey):
        raise ValueError("the CA key is not an ECDSA key")
    key = _new_key()
    # The certificate must not outlive its CA.
    not_after = min(now + timedelta(days=days), ca_cert.not_valid_after_utc)
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, hosts[0][:64])]))
        .issuer_name(ca_cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - BACKDATE)
        .not_valid_after(not_after)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(_key_usage(signs_certificates=False), critical=True)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .add_extension(x509.SubjectAlternativeName(_subject_alternative_names(hosts)), critical=False)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), critical=False
        )
        .sign(ca_key, hashes.SHA256())
    )
    return KeyPair(cert.public_bytes(serialization.Encoding.PEM), _key_pem(key))


def certificate_hosts(cert: x509.Certificate) -> set[str]:
    """The DNS names and IP addresses (as text) a certificate's SAN extension names."""
    try:
        san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except x509.ExtensionNotFound:
        return set()
    return set(san.get_values_for_type(x509.DNSName)) | {str(ip) for ip in san.get_values_for_type(x509.IPAddress)}


def _normal_hosts(hosts: Iterable[str]) -> set[str]:
    out = set()
    for host in hosts:
        try:
            out.add(str(ipaddress.ip_address(host)))
        except ValueError:
            out.add(host)
    return out


def needs_renewal(cert_pem: bytes, now: datetime, renew_before_days: float, hosts: Iterable[str]) -> bool:
    """True when the certificate is unreadable, not yet valid, expires within `renew_before_days`,
    or names other hosts than `hosts`."""
    now = _utc(now)
    try:
        cert = x509.load_pem_x509_certificate(cert_pem)
    except ValueError:
        return True
    if cert.not_valid_before_utc > now:
        return True
    if cert.not_valid_after_utc - now <= timedelta(days=renew_before_days):
        return True
    return certificate_hosts(cert) != _normal_hosts(hosts)


def signed_by(cert_pem: bytes, ca_pem: bytes) -> bool:
    """Is `cert_pem` issued and signed by the CA `ca_pem`?"""
    try:
        cert = x509.load_pem_x509_certificate(cert_pem)
        ca = x509.load_pem_x509_certificate(ca_pem)
        cert.verify_directly_issued_by(ca)
    except (ValueError, TypeError, InvalidSignature):
        return False
    return True


def key_matches(cert_pem: bytes, key_pem: bytes) -> bool:
    """Does the private key `key_pem` belong to the certificate `cert_pem`?"""
    try:
        cert = x509.load_pem_x509_certificate(cert_pem)
        key = serialization.load_pem_private_key(key_pem, password=None)
    except (ValueError, TypeError):
        return False
    return cert.public_key() == key.public_key()


# --- the SSL context the server uses --------------------------------------------------------


class ServingTLS:
    """The server's `ssl.SSLContext` and the certificate loaded into it.

    `load_cert_chain` only reads files, so the PEMs are written into a private directory (mode
    0700, under the temp dir: `/tmp` is an emptyDir in the cluster, the root filesystem is
    read-only), loaded, and the directory is deleted at once: the key does not stay on disk.
    """

    def __init__(self) -> None:
        self.context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        self.context.minimum_version = ssl.TLSVersion.TLSv1_2
        # No session tickets: the API server's webhook client (client-go's transport) keeps no session cache,
        # so it never resumes, and making the two tickets TLS 1.3 sends by default was a quarter of the
        # server's CPU for each handshake (193 against 253 us, bench/README.md, #24). Each recycled
        # connection is a handshake inside some call.
        self.context.num_tickets = 0
        self.context.options |= ssl.OP_NO_TICKET  # TLS 1.2's
        self.cert_pem: bytes | None = None

    @property
    def loaded(self) -> bool:
        return self.cert_pem is not None

    @property
    def not_after(self) -> float | None:
        """When the certificate presented now expires (Unix seconds); None while none is loaded."""
        if self.cert_pem is None:
            return None
        return x509.load_pem_x509_certificate(self.cert_pem).not_valid_after_utc.timestamp()

    def load(self, pair: KeyPair) -> None:
        """Present `pair` on every new handshake (same context: no restart). Raises ssl.SSLError
        when the key does not match the certificate; the old certificate then stays."""
        if pair.cert_pem == self.cert_pem:
            return
        directory = tempfile.mkdtemp(prefix="egress-placer-tls-")
        cert_file = os.path.join(directory, "tls.crt")
        key_file = os.path.join(directory, "tls.key")
        try:
            for path, content in ((cert_file, pair.cert_pem), (key_file, pair.key_pem)):
                fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
                with os.fdopen(fd, "wb") as f:
                    f.write(content)
            self.context.load_cert_chain(cert_file, key_file)
        finally:
            shutil.rmtree(directory, ignore_errors=True)
        self.cert_pem = pair.cert_pem


# --- the keeper -----------------------------------------------------------------------------


class SecretWriter(Protocol):
    """What the keeper needs from the Kubernetes adapter.

    `write_secret` creates the Secret (`resource_version` None) or replaces it (optimistic
    concurrency on `resource_version`). A conflict (HTTP 409: another replica wrote first, or the
    Secret already exists) is reported by returning False or by raising an exception whose
    `status` is the HTTP status 409 (the adapter's ApiError, the client's ApiException); True or
    None means written.
    """

    def read_secret(self, namespace: str, name: str) -> tuple[dict[str, bytes], str] | None: ...

    def write_secret(
        self, namespace: str, name: str, data: dict[str, bytes], resource_version: str | None
    ) -> bool | None: ...

    def set_webhook_ca_bundle(self, config_name: str, ca_pem: bytes, kind: str = "mutating") -> bool: ...

    def set_crd_conversion_ca_bundle(self, crd_name: str, ca_pem: bytes) -> bool: ...


def webhook_configurations(settings: Settings) -> list[tuple[str, str]]:
    """(kind, name) of each webhook configuration whose caBundle the leader keeps."""
    return [("mutating", settings.webhook_config_name), ("validating", settings.pools_webhook_config_name)]


def _is_conflict(error: BaseException) -> bool:
    """The API server answered 409 Conflict (reason Conflict or AlreadyExists)."""
    return getattr(error, "status", None) == HTTP_CONFLICT


class CertificateKeeper:
    """Keeps the serving certificate in the Secret current and loaded into `tls`.

    `clock` returns the time as epoch seconds (e.g. `time.time`), like ClusterState's.
    `ensure(leader)` is called at start and periodically; it never raises: failures are logged
    and kept in `problem` (the readiness reason while nothing is loaded).
    """

    def __init__(
        self, settings: Settings, writer: SecretWriter, clock: Callable[[], float], tls: ServingTLS | None = None
    ) -> None:
        self.settings = settings
        self.writer = writer
        self.clock = clock
        self.tls = tls or ServingTLS()
        self.problem: str | None = "no certificate loaded yet"
        self._log = logger.bind(namespace=settings.namespace, name=settings.tls_secret)

    @property
    def ready(self) -> bool:
        return self.tls.loaded

    def _now(self) -> datetime:
        return datetime.fromtimestamp(self.clock(), UTC)

    def _stale(self, data: dict[str, bytes], now: datetime) -> str | None:
        """Why the Secret's content must be replaced, or None when it is good."""
        s = self.settings
        if not all(data.get(k) for k in (CA_CERT, CA_KEY, TLS_CERT, TLS_KEY)):
            return "the Secret lacks a key"
        if not self._ca_usable(data, now):
            return "the CA is unreadable or expires too soon"
        if not signed_by(data[TLS_CERT], data[CA_CERT]) or not key_matches(data[TLS_CERT], data[TLS_KEY]):
            return "the serving certificate does not belong to the CA or to its key"
        if needs_renewal(data[TLS_CERT], now, s.tls_renew_before_days, s.tls_hosts):
            return "the serving certificate expires soon or names other hosts"
        return None

    def _ca_usable(self, data: dict[str, bytes], now: datetime) -> bool:
        """The CA can sign a full-length serving certificate and its key belongs to it."""
        s = self.settings
        if not data.get(CA_CERT) or not data.get(CA_KEY) or not key_matches(data[CA_CERT], data[CA_KEY]):
            return False
        return not needs_renewal_ca(data[CA_CERT], now, s.tls_cert_days + s.tls_renew_before_days)

    def _issue(self, old: dict[str, bytes] | None, now: datetime) -> dict[str, bytes]:
        s = self.settings
        if old is not None and self._ca_usable(old, now):
            ca = KeyPair(old[CA_CERT], old[CA_KEY])
        else:
            ca = make_ca(now)
        serving = make_serving_cert(ca, s.tls_hosts, now, s.tls_cert_days)
        return {CA_CERT: ca.cert_pem, CA_KEY: ca.key_pem, TLS_CERT: serving.cert_pem, TLS_KEY: serving.key_pem}

    def ensure(self, leader: bool) -> bool:
        """Make, renew (leader only) and load the certificate. True when one is loaded.

        Blocking (API calls). In an asyncio app prefer `ensure_async`, which does the API calls in
        a thread and swaps the certificate in the loop's own thread, where handshakes happen."""
        try:
            data = self._fetch(leader)
            if data is not None:
                self._install(data)
                if leader:
                    self._set_ca_bundles(data[CA_CERT])
        except Exception as error:  # noqa: BLE001 - the keeper reports, the app keeps running
            self._failed(error)
        return self.ready

    async def ensure_async(self, leader: bool) -> bool:
        """`ensure` for the event loop: API calls in a worker thread, the context swap in the loop."""
        try:
            data = await asyncio.to_thread(self._fetch, leader)
            if data is not None:
                self._install(data)
                if leader:
                    await asyncio.to_thread(self._set_ca_bundles, data[CA_CERT])
        except Exception as error:  # noqa: BLE001
            self._failed(error)
        return self.ready

    def _set_ca_bundles(self, ca_pem: bytes) -> None:
        """The CA into every webhook configuration the controller serves: the placement webhooks
        (mutating) and the pools API's (validating; fail-closed: without its caBundle, the API server
        refuses every EgressPool write)."""
        for kind, name in webhook_configurations(self.settings):
            self.writer.set_webhook_ca_bundle(name, ca_pem, kind)
        # The pools API's CRDs convert v1alpha1 <-> v1beta1 at this server's /convert: without the CA, the
        # API server can read no object stored in the other version (docs/pools-api.md, "v1beta1").
        for name in crd_names():
            self.writer.set_crd_conversion_ca_bundle(name, ca_pem)

    def _failed(self, error: Exception) -> None:
        self.problem = f"certificate upkeep failed: {type(error).__name__}: {error}"
        # No traceback: its variables would print the Secret's private keys.
        self._log.warning("certificate upkeep failed: {}", self.problem)

    def _install(self, data: dict[str, bytes]) -> None:
        self.tls.load(KeyPair(data[TLS_CERT], data[TLS_KEY]))
        self.problem = None

    def _fetch(self, leader: bool) -> dict[str, bytes] | None:
        """Read the Secret, (leader) replace it when it must be, and return what to serve, or None."""
        s = self.settings
        now = self._now()
        secret = self.writer.read_secret(s.namespace, s.tls_secret)
        data, version = secret if secret is not None else ({}, None)
        why = "the Secret does not exist" if secret is None else self._stale(data, now)
        if why is not None and not leader:
            self.problem = f"waiting for the leader: {why}"
            self._log.info("certificate not usable, waiting for the leader: {}", why)
        elif why is not None:
            new = self._issue(data if secret is not None else None, now)
            if self._write(new, version):
                self._log.info("serving certificate written: {}", why)
                data = new
            else:
                self._log.info("another replica wrote the certificate first; reading it")
                again = self.writer.read_secret(s.namespace, s.tls_secret)
                data = again[0] if again is not None else {}
        if not self._loadable(data, now):
            if leader or why is None:
                self.problem = "the Secret holds no usable certificate"
            return None
        return data

    def _loadable(self, data: dict[str, bytes], now: datetime) -> bool:
        """Worth serving: a matching, currently valid certificate and key."""
        return unusable(data.get(TLS_CERT) or b"", data.get(TLS_KEY) or b"", now) is None

    def _write(self, data: dict[str, bytes], version: str | None) -> bool:
        s = self.settings
        try:
            written = self.writer.write_secret(s.namespace, s.tls_secret, data, version)
        except Exception as error:
            if _is_conflict(error):
                return False
            raise
        return written is not False


def unusable(cert_pem: bytes, key_pem: bytes, now: datetime) -> str | None:
    """Why this pair cannot be served now (None: it can): missing, key not matching, or not valid now."""
    if not cert_pem or not key_pem:
        return "no certificate or no key"
    if not key_matches(cert_pem, key_pem):
        return "the key does not match the certificate (or either is unreadable)"
    if needs_renewal(cert_pem, now, 0, certificate_hosts(x509.load_pem_x509_certificate(cert_pem))):
        return "the certificate is not valid now"
    return None


class MountedCertificate:
    """Serves the certificate in two files that someone else keeps (cert-manager's Secret mounted
    into the pod; the kubelet swaps both files at once when it is renewed).

    `ensure` reads them (at start, then with every periodic check) and loads a new pair into `tls`
    without a restart. A pair that cannot be served is refused with the reason in `problem`, and the
    pair loaded before stays. Nothing is written: not the Secret, not the webhook's caBundle.
    `clock` returns epoch seconds.
    """

    def __init__(
        self, cert_file: str, key_file: str, clock: Callable[[], float], tls: ServingTLS | None = None
    ) -> None:
        self.cert_file = Path(cert_file)
        self.key_file = Path(key_file)
        self.clock = clock
        self.tls = tls or ServingTLS()
        self.problem: str | None = "no certificate loaded yet"
        self._loaded: tuple[bytes, bytes] | None = None
        self._log = logger.bind(cert_file=cert_file, key_file=key_file)

    @property
    def ready(self) -> bool:
        return self.tls.loaded

    def ensure(self, leader: bool = False) -> bool:
        """Load the files' pair if it is new and can be served. True when a certificate is loaded."""
        try:
            cert_pem, key_pem = self.cert_file.read_bytes(), self.key_file.read_bytes()
        except OSError as error:
            return self._refuse(f"cannot read the certificate files: {error}")
        if (cert_pem, key_pem) == self._loaded:
            self.problem = None
            return True
        why = unusable(cert_pem, key_pem, datetime.fromtimestamp(self.clock(), UTC))
        if why is not None:
            return self._refuse(why)
        try:
            self.tls.load(KeyPair(cert_pem, key_pem))
        except ssl.SSLError as error:
            return self._refuse(f"the TLS library refused the pair: {error}")
        self._loaded = (cert_pem, key_pem)
        self.problem = None
        expires = x509.load_pem_x509_certificate(cert_pem).not_valid_after_utc
        self._log.info("serving certificate loaded from files (valid until {})", expires.isoformat())
        return True

    async def ensure_async(self, leader: bool) -> bool:
        """`ensure` in the loop's own thread (two small file reads), where handshakes happen."""
        return self.ensure(leader)

    def _refuse(self, why: str) -> bool:
        if why != self.problem:
            self._log.warning("certificate files not loaded: {}{}", why, "; the loaded one stays" if self.ready else "")
        self.problem = why
        return self.ready


def needs_renewal_ca(ca_pem: bytes, now: datetime, min_days_left: float) -> bool:
    """True when the CA is unreadable, not a CA, or has less than `min_days_left` days of validity."""
    now = _utc(now)
    try:
        cert = x509.load_pem_x509_certificate(ca_pem)
        constraints = cert.extensions.get_extension_for_class(x509.BasicConstraints).value
    except (ValueError, x509.ExtensionNotFound):
        return True
    if not constraints.ca or cert.not_valid_before_utc > now:
        return True
    return cert.not_valid_after_utc - now < timedelta(days=min_days_left)
