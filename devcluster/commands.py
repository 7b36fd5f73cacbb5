"""Commands that what runs on the cluster adds to `python -m devcluster` (entry points, group
`devcluster.commands`): the launcher names none of them and imports nothing of theirs.

A distribution declares them in its pyproject.toml, e.g. egress-placer's `controller` and `demo`:

    [project.entry-points."devcluster.commands"]
    controller = "devplacer.commands:CONTROLLER"

Each names a `Command`: `help` (its line in `--help`), `configure(parser)` (its options) and
`run(args, log)` (does it; returns the exit status, may raise `ClusterError`). They are read from the
installed distributions' metadata and from the pyproject.toml of the checkout this launcher runs from,
which wins: a checkout on PYTHONPATH, or an editable install whose metadata predates a command.
"""

from __future__ import annotations

import argparse
import sys
import tomllib
from importlib.metadata import EntryPoint, entry_points
from pathlib import Path
from typing import Callable, Protocol

GROUP = "devcluster.commands"
CHECKOUT_PYPROJECT = Path(__file__).resolve().parents[1] / "pyproject.toml"


class Command(Protocol):
    help: str

    def configure(self, parser: argparse.ArgumentParser) -> None: ...

    def run(self, args: argparse.Namespace, log: Callable[[str], None]) -> int: ...


def declared_in(pyproject: Path) -> dict[str, EntryPoint]:
    """The group's entry points a pyproject.toml declares ({} when there is no such file)."""
    try:
        project = tomllib.loads(pyproject.read_text()).get("project", {})
    except FileNotFoundError:
        return {}
    declared = project.get("entry-points", {}).get(GROUP, {})
    return {name: EntryPoint(name, value, GROUP) for name, value in declared.items()}


def command_entry_points(pyproject: Path = CHECKOUT_PYPROJECT) -> dict[str, EntryPoint]:
    """Every command's entry point by name, in name order: installed ones, then the checkout's over them."""
    found = {ep.name: ep for ep in entry_points(group=GROUP)}
    found.update(declared_in(pyproject))
    return dict(sorted(found.items()))


def load_commands(pyproject: Path = CHECKOUT_PYPROJECT) -> dict[str, Command]:
    """Every command, loaded; one that does not load is left out, with a line on stderr saying why."""
    loaded = {}
    for name, entry in command_entry_points(pyproject).items():
        try:
            loaded[name] = entry.load()
        except Exception as err:  # noqa: BLE001 - `up` and `down` must work whatever a plugin does
            print(f"[devcluster] command {name} ({entry.value}) not available: {type(err).__name__}: {err}", file=sys.stderr)
    return loaded
