"""The `egress-placer` command line: one subcommand per entry of COMMANDS.

To add a subcommand, write a `configure(parser)` that declares its arguments and a `run(args) -> int`
that returns the exit status, and add a `Command` to COMMANDS. A command that cannot do its work
raises `CommandError`: its message is printed and the exit status is 2.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable, Mapping, Sequence

from controller.cli.errors import CommandError
from controller.cli.explain import run_explain

if TYPE_CHECKING:
    from controller.settings import Settings


@dataclass(frozen=True)
class Command:
    help: str
    configure: Callable[[argparse.ArgumentParser], None]
    run: Callable[[argparse.Namespace], int]


def _configure_explain(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--policy", required=True, metavar="POLICY.yaml", help="the PlacementPolicy file")
    parser.add_argument(
        "manifests", nargs="+", metavar="MANIFEST.yaml", help="runs, pods and their context (Namespaces, Tasks, ...)"
    )


def _run_explain(args: argparse.Namespace) -> int:
    return run_explain(args.policy, args.manifests, out=sys.stdout, err=sys.stderr)


def _configure_run(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--policy", metavar="POLICY.yaml", help="read the policy from this file (default: the ConfigMap in the settings)"
    )


def _settings(args: argparse.Namespace) -> "Settings":
    """The settings from EGRESS_PLACER_* and the command line; CommandError when they are invalid."""
    from pydantic import ValidationError

    from controller.settings import Settings

    overrides = {"policy_file": args.policy} if args.policy else {}
    try:
        return Settings(**overrides)
    except ValidationError as e:
        raise CommandError(f"invalid settings (EGRESS_PLACER_*): {e}") from None


def _run_controller(args: argparse.Namespace) -> int:
    from controller.app import run

    return run(_settings(args))


def _configure_status(parser: argparse.ArgumentParser) -> None:
    _configure_run(parser)
    parser.add_argument("--json", action="store_true", help="one JSON list instead of a table")


def _run_status(args: argparse.Namespace) -> int:
    from controller.cli.status import run_status

    return run_status(_settings(args), out=sys.stdout, as_json=args.json)


COMMANDS: Mapping[str, Command] = {
    "run": Command(
        help="run the controller (settings from EGRESS_PLACER_* environment variables)",
        configure=_configure_run,
        run=_run_controller,
    ),
    "status": Command(
        help="pool nodes, their taints, load and intruders; exit 1 when a taint is wrong or an intruder is there, "
        "2 when the cluster or the policy cannot be read",
        configure=_configure_status,
        run=_run_status,
    ),
    "explain": Command(
        help="print, one JSON line each, where the runs and pods of manifest files would be placed",
        configure=_configure_explain,
        run=_run_explain,
    ),
}


def build_parser(commands: Mapping[str, Command] = COMMANDS) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="egress-placer", description="Places Tekton runs that need good egress onto the node pools that have it."
    )
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name, command in commands.items():
        sub = subparsers.add_parser(name, help=command.help, description=command.help)
        command.configure(sub)
        sub.set_defaults(run=command.run)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return int(args.run(args))
    except CommandError as error:
        print(f"egress-placer {args.command}: {error}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
