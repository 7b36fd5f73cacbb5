"""devplacer.image without running anything: which tools it installs and when, the reason it gives
when it cannot (the e2e test skips with it), and what the base's cache key depends on."""

from __future__ import annotations

import subprocess
from typing import Any

import pytest

from devplacer import image


def no_subprocess(*args: Any, **kwargs: Any) -> Any:
    raise AssertionError(f"ran {args}")


@pytest.mark.parametrize(
    ("missing", "apt_get", "euid", "reason"),
    [
        ({"runc"}, False, 0, "runc missing and no apt-get to install them"),
        ({"buildah", "podman"}, True, 1000, "buildah, podman missing and apt-get needs root"),
    ],
)
def test_missing_tools_that_cannot_be_installed_say_why(
    monkeypatch: pytest.MonkeyPatch, missing: set[str], apt_get: bool, euid: int, reason: str
) -> None:
    present = (set(image.TOOLS) - missing) | ({"apt-get"} if apt_get else set())
    monkeypatch.setattr(image.shutil, "which", lambda cmd: f"/usr/bin/{cmd}" if cmd in present else None)
    monkeypatch.setattr(image.os, "geteuid", lambda: euid)
    monkeypatch.setattr(subprocess, "run", no_subprocess)
    with pytest.raises(image.ImageToolsUnavailable, match=reason):
        image.ensure_tools(log=lambda _: None)


def test_present_tools_are_not_installed_again(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(image.shutil, "which", lambda cmd: f"/usr/bin/{cmd}")
    monkeypatch.setattr(subprocess, "run", no_subprocess)
    image.ensure_tools(log=no_subprocess)


def test_missing_tools_are_installed_after_one_update(monkeypatch: pytest.MonkeyPatch) -> None:
    ran: list[list[str]] = []

    def succeed(argv: list[str], **_: Any) -> subprocess.CompletedProcess[str]:
        ran.append(argv)
        return subprocess.CompletedProcess(argv, 0, "", "")

    monkeypatch.setattr(image.shutil, "which", lambda cmd: None if cmd in ("mmdebstrap", "runc") else f"/usr/bin/{cmd}")
    monkeypatch.setattr(image.os, "geteuid", lambda: 0)
    monkeypatch.setattr(subprocess, "run", succeed)
    image.ensure_tools(log=lambda _: None)
    assert ran == [["apt-get", "update"], ["apt-get", "install", "-y", "--no-install-recommends", "mmdebstrap", "runc"]]


def test_the_base_key_changes_with_what_goes_into_the_base(monkeypatch: pytest.MonkeyPatch) -> None:
    key = image.base_key()
    assert image.base_key() == key
    monkeypatch.setattr(image, "BASE_PACKAGES", (*image.BASE_PACKAGES, "tzdata"))
    assert image.base_key() != key
