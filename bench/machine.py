"""What the figures were measured on: CPU, cores, memory, load, and the versions of everything."""

from __future__ import annotations

import os
import platform
from importlib.metadata import version
from pathlib import Path
from typing import Any

from devcluster import build


def _cpu_model() -> str | None:
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return platform.processor() or None


def _memory_gb() -> float | None:
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemTotal:"):
            return round(int(line.split()[1]) / 1024 / 1024, 1)
    return None


def cpu_seconds(pid: int) -> float | None:
    """User + system CPU seconds a process has used so far (None when it is gone)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def loadavg() -> float:
    return float(Path("/proc/loadavg").read_text().split()[0])


def describe() -> dict[str, Any]:
    pins = {c.module: build.pinned_version(c) for c in build.COMPONENTS}
    return {
        "cpu_model": _cpu_model(),
        "cores": os.cpu_count(),
        "memory_gb": _memory_gb(),
        "os": f"{platform.system()} {platform.release()}",
        "python": platform.python_version(),
        "go": build.go_version(),
        "kubernetes": pins.get("kubernetes"),
        "etcd": pins.get("etcd"),
        "kwok": pins.get("kwok"),
        "tekton": pins.get("tekton"),
        "aiohttp": version("aiohttp"),
        "loadavg_start": loadavg(),
        "loadavg_end": None,
    }
