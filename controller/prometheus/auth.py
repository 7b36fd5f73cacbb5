"""How the controller and `egress-placer suggest` reach a Prometheus as users run it (Thanos, Mimir or a
Prometheus behind an authenticating proxy): a bearer token, or basic auth, and a CA bundle for its TLS
certificate. One HTTP client path for both (`PrometheusAuth.session`, given to `PrometheusClient`).

Secrets are files, never values on a command line nor in an EgressPool: the CLI's `--prometheus-token-file`
and `--prometheus-password-file`, the controller's `EGRESS_PLACER_PROMETHEUS_*_FILE` settings (a Secret of
the controller's namespace mounted into its pod). The token and the password are read again at every
request, so a rotated Secret (the kubelet swaps the mounted file) or a projected, expiring token is taken
without a restart; a file that cannot be read fails that query (`PrometheusAnswerError`, naming the file,
never its content) and the next one reads it again.
"""

from __future__ import annotations

from dataclasses import dataclass

import requests
from requests.auth import AuthBase, HTTPBasicAuth

from controller.prometheus.egress_source import PrometheusAnswerError


def read_secret(path: str, what: str) -> str:
    """The stripped content of a secret file. ValueError naming `what` and the path (never the content)."""
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read().strip()
    except OSError as e:
        raise ValueError(f"{what}: cannot read {path}: {e.strerror or e}") from None
    except UnicodeDecodeError:
        raise ValueError(f"{what}: {path} is not UTF-8 text") from None
    if not text:
        raise ValueError(f"{what}: {path} is empty")
    return text


@dataclass(frozen=True)
class PrometheusAuth:
    """A bearer token (a file), or basic auth (a user and a password file), and a CA bundle (a file)."""

    token_file: str | None = None
    username: str | None = None
    password_file: str | None = None
    ca_file: str | None = None
    # Names of the settings or flags, for errors ("--prometheus-token-file" or the environment variable).
    token_name: str = "token file"
    password_name: str = "password file"
    ca_name: str = "CA file"

    def problems(self) -> list[str]:
        """What is wrong with the combination, in words; [] when it is usable (files are read later)."""
        out = []
        if self.token_file and (self.username or self.password_file):
            out.append(f"give a bearer token ({self.token_name}) or basic auth (user and {self.password_name}), not both")
        if bool(self.username) != bool(self.password_file):
            out.append(f"basic auth needs both a user name and {self.password_name}")
        return out

    def check(self) -> "PrometheusAuth":
        """ValueError when the combination is wrong or a file cannot be read now."""
        problems = self.problems()
        if problems:
            raise ValueError("; ".join(problems))
        for path, what in ((self.token_file, self.token_name), (self.password_file, self.password_name)):
            if path:
                read_secret(path, what)
        if self.ca_file:
            try:
                with open(self.ca_file, "rb"):
                    pass
            except OSError as e:
                raise ValueError(f"{self.ca_name}: cannot read {self.ca_file}: {e.strerror or e}") from None
        return self

    def session(self) -> requests.Session:
        session = _CASession(self.ca_file) if self.ca_file else requests.Session()
        if self.token_file or self.username:
            session.auth = _FileAuth(self)
        return session


class _CASession(requests.Session):
    """A session that verifies with the CA file given, whatever the environment says.

    requests lets REQUESTS_CA_BUNDLE or CURL_CA_BUNDLE replace a session's own `verify` at every request
    (psf/requests#3829): on a machine or image that sets them (many do, to the system bundle) the CA file
    would be silently ignored and Prometheus' certificate refused. Proxies still come from the environment.
    """

    def __init__(self, ca_file: str) -> None:
        super().__init__()
        self.verify = ca_file

    def merge_environment_settings(self, url, proxies, stream, verify, cert):  # type: ignore[no-untyped-def]
        settings = super().merge_environment_settings(url, proxies, stream, verify, cert)
        if verify is None or verify is True:  # the request itself said nothing: the CA file given wins
            settings["verify"] = self.verify
        return settings


class _FileAuth(AuthBase):
    """Sets the Authorization header of every request from the files, read at that request."""

    def __init__(self, auth: PrometheusAuth) -> None:
        self._auth = auth

    def __call__(self, request: requests.PreparedRequest) -> requests.PreparedRequest:
        auth = self._auth
        try:
            if auth.token_file:
                request.headers["Authorization"] = "Bearer " + read_secret(auth.token_file, auth.token_name)
            elif auth.username:
                password = read_secret(auth.password_file, auth.password_name) if auth.password_file else ""
                return HTTPBasicAuth(auth.username, password)(request)
        except ValueError as e:
            raise PrometheusAnswerError(str(e)) from None
        return request
