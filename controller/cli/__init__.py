"""The `egress-placer` command line (also `kubectl egress-placer`): one subcommand per entry of COMMANDS.

To add a subcommand, write a `configure(parser)` that declares its arguments and a `run(args) -> int`
that returns the exit status, and add a `Command` to COMMANDS. A command that cannot do its work
raises `CommandError` (or `ClusterUnreachable`): its message is printed in one line on stderr and
the exit status is the error's (controller/cli/errors.py has the table: 0 ok, 1 drift or findings,
2 usage or configuration, 3 cannot reach the cluster, 4 internal error).

Commands that talk to a cluster find it as kubectl does (controller/kube/client.py): --kubeconfig,
else EGRESS_PLACER_KUBECONFIG, else $KUBECONFIG, else ~/.kube/config, else the pod's ServiceAccount.
Installed as `kubectl-egress_placer` too, so that kubectl runs it as the plugin `kubectl egress-placer`.

Every command that prints a result takes `-o json|yaml` (the default output is unchanged); a file
argument `-` is standard input. Commands other than `run` log nothing unless given `-v`/`--verbose`.
`egress-placer completion bash|zsh|tcsh` prints a shell completion script (shtab).
"""

from __future__ import annotations

import argparse
import os
import sys
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Mapping, NoReturn, Sequence

from loguru import logger

from controller import __version__
from controller.cli.errors import ClusterUnreachable, CommandError, Exit
from controller.cli.explain import run_explain

if TYPE_CHECKING:
    from controller.settings import Settings

PLUGIN_EXECUTABLE = "kubectl-egress_placer"  # kubectl runs it for `kubectl egress-placer`


@dataclass(frozen=True)
class Command:
    help: str
    configure: Callable[[argparse.ArgumentParser], None]
    run: Callable[[argparse.Namespace], int]


class Parser(argparse.ArgumentParser):
    """argparse with its usage errors in one line, exit status 2."""

    def error(self, message: str) -> NoReturn:
        self.exit(Exit.USAGE, f"{self.prog}: {message} (see {self.prog} --help)\n")


def _file(action: argparse.Action) -> argparse.Action:
    """Shell completion completes file names for this argument."""
    action.complete = {"bash": "_shtab_compgen_files", "zsh": "_files", "tcsh": "f"}  # type: ignore[attr-defined]
    return action


def _configure_output(parser: argparse.ArgumentParser, default: str) -> None:
    parser.add_argument(
        "-o", "--output", choices=["json", "yaml"], metavar="json|yaml",
        help=f"print the result as one JSON or YAML document (default: {default})",
    )


def _configure_explain(parser: argparse.ArgumentParser) -> None:
    _file(parser.add_argument(
        "--policy",
        required=True,
        metavar="POLICY.yaml",
        help="the policy: a PlacementPolicy file, or EgressPool and EgressPlacerConfig objects ('-': standard input); "
        "EgressPools as `kubectl get egresspools -o yaml` prints them carry their measured sets (status.history)",
    ))
    _file(parser.add_argument(
        "manifests", nargs="+", metavar="MANIFEST.yaml",
        help="runs, pods and their context (Namespaces, Tasks, ...); '-': standard input. At least one TaskRun, "
        "PipelineRun or Tekton pod (else exit 2)",
    ))
    _configure_output(parser, "one JSON line per run, pipeline task and pod")


def _run_explain(args: argparse.Namespace) -> int:
    return run_explain(args.policy, args.manifests, out=sys.stdout, err=sys.stderr, output=args.output)


def _configure_cluster(parser: argparse.ArgumentParser, verbose: bool = True) -> None:
    """The options of every command that talks to a cluster, as kubectl names them."""
    _file(parser.add_argument(
        "--kubeconfig",
        metavar="PATH",
        help="kubeconfig file (default: EGRESS_PLACER_KUBECONFIG, else $KUBECONFIG, else ~/.kube/config, else in-cluster)",
    ))
    parser.add_argument("--context", metavar="NAME", help="kubeconfig context (default: its current-context)")
    if verbose:
        parser.add_argument("-v", "--verbose", action="store_true", help="log what the command does (DEBUG) on stderr")


def _configure_migrate(parser: argparse.ArgumentParser) -> None:
    _file(parser.add_argument("policy", metavar="POLICY.yaml", help="the PlacementPolicy file ('-': standard input)"))
    _configure_output(parser, "YAML documents ready for kubectl apply -f -")
    parser.add_argument(
        "--api-version", choices=("v1beta1", "v1alpha1"), default="v1beta1",
        help="the objects' version (default v1beta1, the stored one: it applies with no controller running to "
        "convert; priorities 999990, 999980, ... higher first); v1alpha1: deprecated, priorities 10, 20, ... lower first",
    )


def _run_migrate(args: argparse.Namespace) -> int:
    from controller.cli.migrate import run_migrate

    return run_migrate(args.policy, out=sys.stdout, output=args.output, api_version=args.api_version)


def _configure_run(parser: argparse.ArgumentParser, verbose: bool = False) -> None:
    _configure_cluster(parser, verbose)
    _file(parser.add_argument(
        "--policy", metavar="POLICY.yaml",
        help="read the policy from this file (default: the pools API's EgressPool objects and the EgressPlacerConfig "
        "`cluster`; EGRESS_PLACER_POLICY_SOURCE=configmap reads the ConfigMap of the settings instead)",
    ))


def _settings(args: argparse.Namespace) -> "Settings":
    """The settings from EGRESS_PLACER_* and the command line; CommandError (naming the variable or
    option) when they are invalid."""
    from controller.settings import SettingsError, load_settings

    options = {"policy_file": "--policy", "kubeconfig": "--kubeconfig", "kube_context": "--context"}
    given = {field: getattr(args, option[2:], None) for field, option in options.items()}
    try:
        return load_settings({k: v for k, v in given.items() if v}, options)
    except SettingsError as e:
        raise CommandError(str(e)) from None


def _run_controller(args: argparse.Namespace) -> int:
    from controller.app import StartupError, run

    settings = _settings(args)
    try:
        return run(settings)
    except StartupError as e:
        raise (ClusterUnreachable if e.unreachable else CommandError)(str(e)) from None


def _configure_status(parser: argparse.ArgumentParser) -> None:
    _configure_run(parser, verbose=True)
    parser.add_argument("--json", action="store_true", help="one JSON list instead of a table (as -o json)")
    _configure_output(parser, "a table")


def _run_status(args: argparse.Namespace) -> int:
    from controller.cli.status import run_status

    return run_status(_settings(args), out=sys.stdout, as_json=args.json, output=args.output)


def _configure_uninstall(parser: argparse.ArgumentParser) -> None:
    _configure_cluster(parser)
    _configure_output(parser, "lines of text")
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--dry-run", action="store_true", help="show what would be removed, change nothing")
    mode.add_argument("--yes", action="store_true", help="remove it")
    parser.add_argument(
        "--timeout", type=float, default=120.0, metavar="SECONDS",
        help="how long to wait for the controller to stop leading before removing the taints (default 120)",
    )


def _run_uninstall(args: argparse.Namespace) -> int:
    from controller.cli.status import connect
    from controller.cli.uninstall import run_uninstall

    settings = _settings(args)
    return run_uninstall(
        settings, connect(settings), sys.stdout, dry_run=args.dry_run, yes=args.yes, timeout=args.timeout, output=args.output
    )


def _configure_migrate_storage(parser: argparse.ArgumentParser) -> None:
    _configure_cluster(parser)
    _configure_output(parser, "lines of text")
    parser.add_argument("--dry-run", action="store_true", help="read only: show what would be written, change nothing")


def _run_migrate_storage(args: argparse.Namespace) -> int:
    from controller.cli.migrate_storage import run_migrate_storage
    from controller.cli.status import connect

    return run_migrate_storage(connect(_settings(args)), sys.stdout, dry_run=args.dry_run, output=args.output)


def _configure_suggest(parser: argparse.ArgumentParser) -> None:
    _configure_cluster(parser)
    parser.add_argument("--prometheus", required=True, metavar="URL", help="Prometheus' base URL, e.g. http://prometheus.monitoring:9090")
    parser.add_argument("--window", default="7d", metavar="DURATION", help="how far back to look (default 7d)")
    parser.add_argument("--step", default="1m", metavar="DURATION", help="resolution of the run durations (default 1m)")
    parser.add_argument(
        "-o", "--output", choices=["table", "yaml", "json"], default="table", metavar="table|yaml|json",
        help="a table (default); yaml: the complete EgressPool objects the proposals change, for "
        "`kubectl apply --server-side -f -`; json: the whole report",
    )
    parser.add_argument(
        "--explain", action="store_true",
        help="replay the window's runs still in the cluster with the proposal applied; say how many would move and how many were pruned",
    )
    parser.add_argument("--heavy-bytes", default="1Gi", metavar="SIZE", help="a run that sent at least this is heavy (default 1Gi)")
    parser.add_argument("--quiet-bytes", default="50Mi", metavar="SIZE", help="a run that sent less than this is quiet (default 50Mi)")
    parser.add_argument("--min-runs", type=int, default=3, metavar="N", help="fewer runs than this prove nothing (default 3)")
    parser.add_argument(
        "--bytes-query", metavar="PROMQL",
        help="bytes each pod sent to the internet in the window, one series per namespace and pod (a flow "
        "exporter's external-destination series); default: every byte the pod sent (cAdvisor), an upper bound",
    )
    _file(parser.add_argument("--prometheus-token-file", metavar="PATH", help="a bearer token for Prometheus, read from this file"))
    parser.add_argument("--prometheus-username", metavar="NAME", help="basic auth user for Prometheus")
    _file(parser.add_argument("--prometheus-password-file", metavar="PATH", help="basic auth password, read from this file"))
    _file(parser.add_argument("--prometheus-ca-file", metavar="PATH", help="CA bundle that signed Prometheus' TLS certificate"))


def _run_suggest(args: argparse.Namespace) -> int:
    from controller.cli.suggest import parse_bytes, run_suggest
    from controller.prometheus.auth import PrometheusAuth
    from controller.prometheus.history import check_duration, check_url, client
    from controller.suggest.core import Thresholds

    try:
        url, window, step = check_url(args.prometheus), check_duration(args.window, "--window"), check_duration(args.step, "--step")
        thresholds = Thresholds(parse_bytes(args.heavy_bytes), parse_bytes(args.quiet_bytes), args.min_runs)
        auth = PrometheusAuth(
            token_file=args.prometheus_token_file,
            username=args.prometheus_username,
            password_file=args.prometheus_password_file,
            ca_file=args.prometheus_ca_file,
            token_name="--prometheus-token-file",
            password_name="--prometheus-password-file",
            ca_name="--prometheus-ca-file",
        ).check()
    except ValueError as e:
        raise CommandError(str(e)) from None
    return run_suggest(
        _settings(args), client(url, auth), url, window, step, thresholds,
        out=sys.stdout, err=sys.stderr, output=args.output, explain=args.explain, bytes_query=args.bytes_query,
    )


SHELLS = ("bash", "zsh", "tcsh")


def _configure_completion(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("shell", choices=SHELLS, help="the shell")


def _run_completion(args: argparse.Namespace) -> int:
    import shtab

    # For the command `egress-placer` (a shell completes one word; kubectl completes its plugins itself).
    print(shtab.complete(build_parser(prog="egress-placer"), shell=args.shell), end="")
    return Exit.OK


COMMANDS: Mapping[str, Command] = {
    "run": Command(
        help="run the controller (settings from EGRESS_PLACER_* environment variables)",
        configure=_configure_run,
        run=_run_controller,
    ),
    "status": Command(
        help="pool nodes, their taints, load and intruders; exit 1 when a taint is wrong, an intruder is there "
        "or a node agent is missing, 2 when the policy is invalid or missing, 3 when the cluster cannot be read",
        configure=_configure_status,
        run=_run_status,
    ),
    "uninstall": Command(
        help="remove egress-placer from the cluster: the controller, its webhooks and pool guard, the pool "
        "taints, its RBAC and namespace (docs/uninstall.md); --dry-run shows the plan, --yes does it",
        configure=_configure_uninstall,
        run=_run_uninstall,
    ),
    "explain": Command(
        help="print, one JSON line each, where the runs and pods of manifest files would be placed",
        configure=_configure_explain,
        run=_run_explain,
    ),
    "migrate-policy": Command(
        help="print the EgressPool and EgressPlacerConfig objects that make the policy of a PlacementPolicy file",
        configure=_configure_migrate,
        run=_run_migrate,
    ),
    "migrate-storage": Command(
        help="store every EgressPool and the EgressPlacerConfig as v1beta1 and prune the CRDs' storedVersions to "
        "[v1beta1], as the controller's leader does (docs/pools-api.md); for a cluster where no leader runs",
        configure=_configure_migrate_storage,
        run=_run_migrate_storage,
    ),
    "suggest": Command(
        help="read what Tekton runs sent from Prometheus and propose which images the pools should take or drop, "
        "with the evidence (docs/suggest.md); changes nothing",
        configure=_configure_suggest,
        run=_run_suggest,
    ),
    "completion": Command(
        help="print a shell completion script: `source <(egress-placer completion bash)`, or write it where the "
        "shell loads completions (zsh: a file _egress-placer on $fpath)",
        configure=_configure_completion,
        run=_run_completion,
    ),
}

EPILOG = """exit status: 0 ok, 1 drift or findings, 2 usage or configuration, 3 cannot reach the cluster,
4 internal error. Settings: EGRESS_PLACER_* variables (config/settings.md)."""


def program_name(argv0: str | None = None) -> str:
    """`kubectl egress-placer` when run as the kubectl plugin, else `egress-placer`."""
    name = os.path.basename(argv0 if argv0 is not None else (sys.argv[0] if sys.argv else ""))
    return "kubectl egress-placer" if name == PLUGIN_EXECUTABLE else "egress-placer"


def build_parser(commands: Mapping[str, Command] = COMMANDS, prog: str | None = None) -> argparse.ArgumentParser:
    parser = Parser(
        prog=prog or program_name(),
        description="Places Tekton runs that need good egress onto the node pools that have it.",
        epilog=EPILOG,
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name, command in commands.items():
        sub = subparsers.add_parser(name, help=command.help, description=command.help, epilog=EPILOG)
        command.configure(sub)
        sub.set_defaults(run=command.run)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    where = f"{parser.prog} {args.command}"
    quiet = args.command != "run" and not getattr(args, "verbose", False)  # `run` sets up its own logging
    if quiet:
        logger.disable("controller")
    try:
        return int(args.run(args))
    except CommandError as error:
        print(f"{where}: {_one_line(error)}", file=sys.stderr)
        return int(error.status)
    except KeyboardInterrupt:
        return 130
    except Exception as error:  # noqa: BLE001 - a bug: one line, its own status, not "drift found"
        print(f"{where}: internal error (a bug in egress-placer): {type(error).__name__}: {_one_line(error)}", file=sys.stderr)
        return int(Exit.INTERNAL)
    finally:
        if quiet:
            logger.enable("controller")


def _one_line(error: Any) -> str:
    return " ".join(str(error).split())


if __name__ == "__main__":
    sys.exit(main())
