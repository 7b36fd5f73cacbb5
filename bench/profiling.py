"""Profiles as evidence for a missed target: py-spy on a running process (when the `py-spy` binary
is installed) and cProfile in-process. Both are summarized as the functions that take the most
time (own time, and inclusive time of the project's own functions)."""

from __future__ import annotations

import cProfile
import pstats
import re
import shutil
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Any, Callable

_LINE = re.compile(r":\d+\)$")


def py_spy_binary() -> str | None:
    beside = Path(sys.executable).parent / "py-spy"
    return str(beside) if beside.exists() else shutil.which("py-spy")


def py_spy_version() -> str | None:
    binary = py_spy_binary()
    if binary is None:
        return None
    out = subprocess.run([binary, "--version"], capture_output=True, text=True, check=False)
    return out.stdout.strip() or None


def start_py_spy(pid: int, seconds: float, out: Path) -> subprocess.Popen[bytes] | None:
    """Sample `pid` for `seconds` into `out` (collapsed stacks); None without py-spy."""
    binary = py_spy_binary()
    if binary is None:
        return None
    argv = [binary, "record", "--pid", str(pid), "--duration", str(max(1, round(seconds))), "--rate", "250",
            "--format", "raw", "--nonblocking", "--output", str(out)]
    return subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def _short_path(path: str) -> str:
    """The project's files from their package ('controller/state.py'), others by their last two parts."""
    parts = path.split("/")
    for package in ("controller", "bench"):
        if package in parts[:-1]:
            return "/".join(parts[len(parts) - 1 - parts[::-1].index(package):])
    return "/".join(parts[-2:])


def _frame(frame: str) -> str:
    """'func (/repo/controller/state.py:12)' -> 'func (controller/state.py)'."""
    frame = _LINE.sub(")", frame.strip())
    name, _, where = frame.partition(" (")
    return f"{name} ({_short_path(where.rstrip(')'))})" if where else name


def summarize_collapsed(path: Path, top: int = 12) -> dict[str, Any]:
    """Top frames of a collapsed-stack file: by own time, and the project's frames by inclusive time."""
    self_time: Counter[str] = Counter()
    inclusive: Counter[str] = Counter()
    total = 0
    for line in path.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack or not count.isdigit():
            continue
        n = int(count)
        total += n
        frames = [_frame(f) for f in stack.split(";")]
        self_time[frames[-1]] += n
        for frame in set(frames):
            if _own(frame):
                inclusive[frame] += n
    return _summary(self_time, inclusive, total, top)


def _own(frame: str) -> bool:
    return "(controller/" in frame


def _summary(self_time: Counter[str], inclusive: Counter[str], total: int, top: int) -> dict[str, Any]:
    def rows(counter: Counter[str], count: int) -> list[dict[str, Any]]:
        return [{"function": f, "pct": round(100.0 * n / max(total, 1), 1)} for f, n in counter.most_common(count)]

    return {"samples": total, "top_self": rows(self_time, top), "top_inclusive": rows(inclusive, 2 * top)}


def cprofile(work: Callable[[], object], top: int = 12) -> dict[str, Any]:
    """Run `work` under cProfile; the same summary shape as `summarize_collapsed` (by time, not samples)."""
    profiler = cProfile.Profile()
    profiler.enable()
    work()
    profiler.disable()
    stats = pstats.Stats(profiler)
    self_time: Counter[str] = Counter()
    inclusive: Counter[str] = Counter()
    total_time = 0.0
    for (filename, _, name), (_, _, tottime, cumtime, _) in stats.stats.items():  # type: ignore[attr-defined]
        frame = f"{name} ({_short_path(filename)})"
        self_time[frame] += int(tottime * 1e6)
        total_time += tottime
        if _own(frame):
            inclusive[frame] += int(cumtime * 1e6)
    return _summary(self_time, inclusive, int(total_time * 1e6), top)
