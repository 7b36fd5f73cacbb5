"""Checks the webhook's self-made certificates (controller/admission/certs.py): the served certificate
verifies against the CA for 127.0.0.1 and the DNS names; `needs_renewal` (expiry, hosts changed,
garbage); `ServingTLS` swaps the certificate on the same SSL context and leaves no key on disk;
`CertificateKeeper` with an in-memory Secret store and a fake clock: the leader creates, renews
(keeping the CA and the caBundle), replaces a broken Secret, yields on a write conflict; a
follower waits for the Secret and then loads it; `MountedCertificate` loads files kept by someone else,
reloads a renewed pair and refuses one it cannot serve (the loaded one stays)."""

from __future__ import annotations

import ipaddress
import json
import os
import ssl
import tempfile
from datetime import UTC, datetime, timedelta
from typing import Any, Callable

import pytest
from cryptography import x509
from cryptography.x509.verification import PolicyBuilder, Store
from kubernetes.client.exceptions import ApiException

from controller.admission.certs import (
    CA_CERT,
    CA_KEY,
    TLS_CERT,
    TLS_KEY,
    CertificateKeeper,
    MountedCertificate,
    ServingTLS,
    make_ca,
    make_serving_cert,
    needs_renewal,
)
from controller.kube.writer import ApiError, Outcome
from controller.settings import Settings

NOW = datetime(2026, 7, 1, 12, 0, tzinfo=UTC)
HOSTS = ["egress-placer-webhook.egress-placer.svc", "127.0.0.1", "localhost"]
DAY = 86400.0


def verify(cert_pem: bytes, ca_pem: bytes, host: str, at: datetime) -> None:
    """Raises unless `cert_pem` is a valid server certificate for `host` under `ca_pem` at `at`."""
    store = Store([x509.load_pem_x509_certificate(ca_pem)])
    try:
        subject: x509.GeneralName = x509.IPAddress(ipaddress.ip_address(host))
    except ValueError:
        subject = x509.DNSName(host)
    verifier = PolicyBuilder().store(store).time(at).build_server_verifier(subject)
    verifier.verify(x509.load_pem_x509_certificate(cert_pem), [])


CA = make_ca(NOW)
SERVING = make_serving_cert(CA, HOSTS, NOW, days=90)


@pytest.mark.parametrize("host", HOSTS)
def test_served_certificate_verifies_for_each_host(host: str) -> None:
    verify(SERVING.cert_pem, CA.cert_pem, host, NOW)


@pytest.mark.parametrize("host", ["10.0.0.1", "evil.example.com"])
def test_served_certificate_does_not_verify_for_other_hosts(host: str) -> None:
    with pytest.raises(x509.verification.VerificationError):
        verify(SERVING.cert_pem, CA.cert_pem, host, NOW)


def test_served_certificate_does_not_verify_under_another_ca() -> None:
    with pytest.raises(x509.verification.VerificationError):
        verify(SERVING.cert_pem, make_ca(NOW).cert_pem, "127.0.0.1", NOW)


@pytest.mark.parametrize(
    "cert_pem, at, hosts, renew",
    [
        pytest.param(SERVING.cert_pem, NOW, HOSTS, False, id="fresh"),
        pytest.param(SERVING.cert_pem, NOW, list(reversed(HOSTS)), False, id="same-hosts-other-order"),
        pytest.param(SERVING.cert_pem, NOW + timedelta(days=59), HOSTS, False, id="31-days-left"),
        pytest.param(SERVING.cert_pem, NOW + timedelta(days=61), HOSTS, True, id="29-days-left"),
        pytest.param(SERVING.cert_pem, NOW + timedelta(days=91), HOSTS, True, id="expired"),
        pytest.param(SERVING.cert_pem, NOW - timedelta(days=1), HOSTS, True, id="not-yet-valid"),
        pytest.param(SERVING.cert_pem, NOW, HOSTS + ["new.example.com"], True, id="host-added"),
        pytest.param(SERVING.cert_pem, NOW, HOSTS[:1], True, id="host-removed"),
        pytest.param(b"not a certificate", NOW, HOSTS, True, id="garbage"),
    ],
)
def test_needs_renewal(cert_pem: bytes, at: datetime, hosts: list[str], renew: bool) -> None:
    assert needs_renewal(cert_pem, at, 30, hosts) is renew


def test_serving_certificate_does_not_outlive_its_ca() -> None:
    short_ca = make_ca(NOW, days=10)
    cert = x509.load_pem_x509_certificate(make_serving_cert(short_ca, HOSTS, NOW, days=90).cert_pem)
    assert cert.not_valid_after_utc == x509.load_pem_x509_certificate(short_ca.cert_pem).not_valid_after_utc


def test_serving_tls_swaps_on_the_same_context_and_leaves_no_files() -> None:
    before = set(os.listdir(tempfile.gettempdir()))
    tls = ServingTLS()
    context = tls.context
    assert not tls.loaded
    tls.load(SERVING)
    other = make_serving_cert(CA, HOSTS, NOW, days=90)
    tls.load(other)
    assert tls.context is context and tls.cert_pem == other.cert_pem
    # The key does not stay on disk: no directory of ours is left in the temp dir.
    assert not [d for d in os.listdir(tempfile.gettempdir()) if d.startswith("egress-placer-tls-") and d not in before]
    with pytest.raises(Exception):
        tls.load(type(SERVING)(SERVING.cert_pem, other.key_pem))  # key of another certificate
    assert tls.cert_pem == other.cert_pem  # the old one stays
    assert not [d for d in os.listdir(tempfile.gettempdir()) if d.startswith("egress-placer-tls-") and d not in before]


def _client_session(server: ssl.SSLContext, version: ssl.TLSVersion) -> ssl.SSLSession | None:
    """A whole handshake in memory, one record of data after it (TLS 1.3 sends its tickets then); the client's
    session. The client does not verify: SERVING is dated NOW, and tickets do not depend on it."""
    client = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    client.check_hostname, client.verify_mode = False, ssl.CERT_NONE
    client.minimum_version = client.maximum_version = version
    to_server, to_client = ssl.MemoryBIO(), ssl.MemoryBIO()
    theirs, ours = ssl.MemoryBIO(), ssl.MemoryBIO()
    c = client.wrap_bio(theirs, to_server, server_hostname=HOSTS[0])
    s = server.wrap_bio(to_server, ours, server_side=True)
    for _ in range(10):
        for side in (c, s):
            try:
                side.do_handshake()
            except ssl.SSLWantReadError:
                pass
        theirs.write(ours.read())
        if c.version() and s.version():
            break
    s.write(b"ok")
    theirs.write(ours.read())
    assert c.read(2) == b"ok" and c.version() == s.version()
    return c.session


@pytest.mark.parametrize("version", [ssl.TLSVersion.TLSv1_3, ssl.TLSVersion.TLSv1_2])
def test_the_webhook_issues_no_session_tickets(version: ssl.TLSVersion) -> None:
    """The API server's client never resumes a session (client-go keeps no session cache): the tickets a
    server sends by default are work for nothing in every handshake. The same context with OpenSSL's
    defaults for tickets put back issues them, so the check sees one when there is one."""
    tls = ServingTLS()
    tls.load(SERVING)
    session = _client_session(tls.context, version)
    assert session is None or not session.has_ticket
    default = ServingTLS()
    default.context.num_tickets = 2
    default.context.options &= ~ssl.OP_NO_TICKET
    default.load(SERVING)
    session = _client_session(default.context, version)
    assert session is not None and session.has_ticket


# --- the keeper ----------------------------------------------------------------------------------


class Conflict(Exception):
    """A 409 as kubernetes.client.ApiException reports it."""

    status = 409


def adapter_conflict(message: str) -> Exception:
    """A 409 as the adapter's ApiError reports it (status and reason of the API server's answer)."""
    answer = ApiException(status=409, reason="Conflict")
    answer.body = json.dumps({"kind": "Status", "reason": "AlreadyExists", "code": 409, "message": message})
    return ApiError("create-secret", Outcome.CONFLICT, "conflict", answer)


class MemorySecrets:
    """An in-memory SecretWriter: one Secret store with resourceVersions, and the caBundle."""

    def __init__(self) -> None:
        self.secrets: dict[tuple[str, str], tuple[dict[str, bytes], str]] = {}
        self.version = 0
        self.ca_bundles: dict[tuple[str, str], bytes] = {}  # (kind, name) -> the webhook configuration's caBundle
        self.writes = 0
        self.before_write: Any = None  # called before a write: lets a test simulate another replica
        self.conflict: Callable[[str], Exception] = Conflict

    def read_secret(self, namespace: str, name: str) -> tuple[dict[str, bytes], str] | None:
        found = self.secrets.get((namespace, name))
        return (dict(found[0]), found[1]) if found else None

    def put(self, namespace: str, name: str, data: dict[str, bytes]) -> None:
        self.version += 1
        self.secrets[(namespace, name)] = (dict(data), str(self.version))

    def write_secret(self, namespace: str, name: str, data: dict[str, bytes], resource_version: str | None) -> bool:
        if self.before_write:
            hook, self.before_write = self.before_write, None
            hook()
        current = self.secrets.get((namespace, name))
        if (current is None) != (resource_version is None) or (current and current[1] != resource_version):
            raise self.conflict("409 Conflict")
        self.writes += 1
        self.put(namespace, name, data)
        return True

    def set_webhook_ca_bundle(self, config_name: str, ca_pem: bytes, kind: str = "mutating") -> bool:
        changed = self.ca_bundles.get((kind, config_name)) != ca_pem
        self.ca_bundles[(kind, config_name)] = ca_pem
        return changed

    def set_crd_conversion_ca_bundle(self, crd_name: str, ca_pem: bytes) -> bool:
        return self.set_webhook_ca_bundle(crd_name, ca_pem, "crd")

    @property
    def ca_bundle(self) -> bytes | None:
        """The one caBundle every webhook configuration and the CRDs' conversion have (None: none has one; an error: they differ)."""
        found = set(self.ca_bundles.values())
        assert len(found) <= 1, f"the webhook configurations have different CA bundles: {self.ca_bundles}"
        if found:
            assert set(self.ca_bundles) == {
                ("mutating", "egress-placer"), ("validating", "egress-placer-pools"),
                ("crd", "egresspools.egress-placer.io"), ("crd", "egressplacerconfigs.egress-placer.io"),
            }
        return found.pop() if found else None


class Clock:
    def __init__(self) -> None:
        self.now = NOW.timestamp()

    def __call__(self) -> float:
        return self.now


SETTINGS = Settings(tls_hosts=HOSTS, tls_cert_days=90, tls_renew_before_days=30)
KEY = (SETTINGS.namespace, SETTINGS.tls_secret)


def keeper(store: MemorySecrets, clock: Clock, settings: Settings = SETTINGS) -> CertificateKeeper:
    return CertificateKeeper(settings, store, clock)


def test_leader_creates_the_secret_loads_it_and_sets_the_ca_bundle() -> None:
    store, clock = MemorySecrets(), Clock()
    k = keeper(store, clock)
    assert k.ensure(leader=True) is True
    data, _ = store.secrets[KEY]
    assert set(data) == {CA_CERT, CA_KEY, TLS_CERT, TLS_KEY}
    assert k.tls.cert_pem == data[TLS_CERT] and store.ca_bundle == data[CA_CERT] and k.problem is None
    verify(data[TLS_CERT], data[CA_CERT], "127.0.0.1", NOW)
    assert k.ensure(leader=True) and store.writes == 1  # nothing to renew: no second write


def test_follower_waits_for_the_secret_then_loads_it() -> None:
    store, clock = MemorySecrets(), Clock()
    follower = keeper(store, clock)
    assert follower.ensure(leader=False) is False
    assert "waiting for the leader" in (follower.problem or "")
    assert store.secrets == {} and store.ca_bundle is None
    keeper(store, clock).ensure(leader=True)
    assert follower.ensure(leader=False) is True
    assert follower.tls.cert_pem == store.secrets[KEY][0][TLS_CERT]


def test_renewal_near_expiry_keeps_the_ca() -> None:
    store, clock = MemorySecrets(), Clock()
    k = keeper(store, clock)
    k.ensure(leader=True)
    first, _ = store.secrets[KEY]
    clock.now += 50 * DAY  # 40 days left: nothing to do
    k.ensure(leader=True)
    assert store.secrets[KEY][0][TLS_CERT] == first[TLS_CERT]
    clock.now += 15 * DAY  # 25 days left: renew
    k.ensure(leader=True)
    second, _ = store.secrets[KEY]
    assert second[TLS_CERT] != first[TLS_CERT]
    assert (second[CA_CERT], second[CA_KEY]) == (first[CA_CERT], first[CA_KEY])
    assert store.ca_bundle == first[CA_CERT]
    assert k.tls.cert_pem == second[TLS_CERT]
    verify(second[TLS_CERT], first[CA_CERT], "127.0.0.1", datetime.fromtimestamp(clock.now, UTC))


def test_follower_keeps_serving_an_expiring_certificate_until_the_leader_renews() -> None:
    store, clock = MemorySecrets(), Clock()
    keeper(store, clock).ensure(leader=True)
    clock.now += 70 * DAY  # due for renewal, still valid
    follower = keeper(store, clock)
    assert follower.ensure(leader=False) is True
    assert store.writes == 1


def test_hosts_changed_means_a_new_certificate() -> None:
    store, clock = MemorySecrets(), Clock()
    keeper(store, clock).ensure(leader=True)
    first, _ = store.secrets[KEY]
    more = Settings(tls_hosts=HOSTS + ["egress-placer-webhook.egress-placer.svc.cluster.local"])
    keeper(store, clock, more).ensure(leader=True)
    second, _ = store.secrets[KEY]
    assert second[TLS_CERT] != first[TLS_CERT] and second[CA_CERT] == first[CA_CERT]
    verify(second[TLS_CERT], second[CA_CERT], "egress-placer-webhook.egress-placer.svc.cluster.local", NOW)


@pytest.mark.parametrize(
    "breakage",
    [
        pytest.param(lambda d: d.pop(TLS_KEY), id="key-missing"),
        pytest.param(lambda d: d.update({TLS_KEY: make_serving_cert(CA, HOSTS, NOW, 90).key_pem}), id="key-of-another-cert"),
        pytest.param(lambda d: d.update({CA_CERT: b"garbage"}), id="ca-garbage"),
        pytest.param(lambda d: d.update({TLS_CERT: SERVING.cert_pem, TLS_KEY: SERVING.key_pem}), id="cert-of-another-ca"),
    ],
)
def test_leader_replaces_a_broken_secret(breakage: Any) -> None:
    store, clock = MemorySecrets(), Clock()
    keeper(store, clock).ensure(leader=True)
    data, _ = store.secrets[KEY]
    breakage(data)
    store.put(*KEY, data)
    k = keeper(store, clock)
    assert k.ensure(leader=True) is True
    fixed, _ = store.secrets[KEY]
    verify(fixed[TLS_CERT], fixed[CA_CERT], "127.0.0.1", NOW)
    assert store.ca_bundle == fixed[CA_CERT] and k.tls.cert_pem == fixed[TLS_CERT]


def test_expiring_ca_is_replaced_and_the_ca_bundle_follows() -> None:
    store, clock = MemorySecrets(), Clock()
    old_ca = make_ca(NOW, days=100)
    serving = make_serving_cert(old_ca, HOSTS, NOW, 90)
    store.put(*KEY, {CA_CERT: old_ca.cert_pem, CA_KEY: old_ca.key_pem, TLS_CERT: serving.cert_pem, TLS_KEY: serving.key_pem})
    keeper(store, clock).ensure(leader=True)
    data, _ = store.secrets[KEY]
    assert data[CA_CERT] != old_ca.cert_pem and store.ca_bundle == data[CA_CERT]


@pytest.mark.parametrize("conflict", [Conflict, adapter_conflict])
def test_write_conflict_loads_what_the_other_replica_wrote(conflict: Callable[[str], Exception]) -> None:
    store, clock = MemorySecrets(), Clock()
    store.conflict = conflict
    other = keeper(MemorySecrets(), clock)
    other.ensure(leader=True)
    theirs = other.writer.read_secret(*KEY)[0]  # type: ignore[index]
    store.before_write = lambda: store.put(*KEY, theirs)  # the other replica wins the race
    k = keeper(store, clock)
    assert k.ensure(leader=True) is True
    assert k.tls.cert_pem == theirs[TLS_CERT] and store.writes == 0
    assert store.ca_bundle == theirs[CA_CERT]


def test_writer_failure_is_reported_not_raised() -> None:
    class Broken(MemorySecrets):
        def read_secret(self, namespace: str, name: str) -> Any:
            raise OSError("API server unreachable")

    k = keeper(Broken(), Clock())
    assert k.ensure(leader=True) is False
    assert "unreachable" in (k.problem or "")


# --- a certificate kept by someone else (cert-manager), mounted as files ---------------------------


def mounted(tmp_path: Any, pair: Any, clock: Any = lambda: NOW.timestamp()) -> MountedCertificate:
    write_pair(tmp_path, pair)
    return MountedCertificate(str(tmp_path / TLS_CERT), str(tmp_path / TLS_KEY), clock)


def write_pair(directory: Any, pair: Any) -> None:
    (directory / TLS_CERT).write_bytes(pair.cert_pem)
    (directory / TLS_KEY).write_bytes(pair.key_pem)


def test_mounted_files_are_loaded_and_a_renewed_pair_replaces_them(tmp_path) -> None:
    certs = mounted(tmp_path, SERVING)
    assert not certs.ready
    assert certs.ensure() and certs.tls.cert_pem == SERVING.cert_pem and certs.problem is None
    renewed = make_serving_cert(CA, HOSTS, NOW, days=90)
    write_pair(tmp_path, renewed)  # the kubelet swaps the mounted Secret's files
    assert certs.ensure() and certs.tls.cert_pem == renewed.cert_pem


@pytest.mark.parametrize(
    ("broken", "reason"),
    [
        pytest.param(lambda d: (d / TLS_KEY).write_bytes(make_serving_cert(CA, HOSTS, NOW, 90).key_pem), "does not match", id="other-key"),
        pytest.param(lambda d: (d / TLS_CERT).write_bytes(b"garbage"), "does not match", id="garbage"),
        pytest.param(lambda d: write_pair(d, make_serving_cert(CA, HOSTS, NOW - timedelta(days=200), 90)), "not valid now", id="expired"),
        pytest.param(lambda d: (d / TLS_CERT).unlink(), "cannot read", id="missing"),
    ],
)
def test_a_pair_that_cannot_be_served_is_refused_and_the_loaded_one_stays(tmp_path, broken, reason) -> None:
    certs = mounted(tmp_path, SERVING)
    assert certs.ensure()
    broken(tmp_path)
    assert certs.ensure()  # still serving
    assert certs.tls.cert_pem == SERVING.cert_pem and reason in (certs.problem or "")
    fresh = MountedCertificate(str(tmp_path / TLS_CERT), str(tmp_path / TLS_KEY), lambda: NOW.timestamp())
    assert not fresh.ensure() and reason in (fresh.problem or "")  # nothing loaded at all: not ready


def test_certificate_files_come_in_pairs(monkeypatch) -> None:
    monkeypatch.setenv("EGRESS_PLACER_TLS_CERT_FILE", "/certs/tls.crt")
    with pytest.raises(ValueError, match="both EGRESS_PLACER_TLS_CERT_FILE and EGRESS_PLACER_TLS_KEY_FILE"):
        Settings()
    monkeypatch.setenv("EGRESS_PLACER_TLS_KEY_FILE", "/certs/tls.key")
    assert Settings().tls_key_file == "/certs/tls.key"
