"""Command line: `python -m devcluster {build,up,down,status,kubeconfig,controller,demo}` (thin over `Cluster`)."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Mapping

from devcluster.build import (
    KUBERNETES_VERSION_ENV,
    OPTIONAL_COMPONENTS,
    TEKTON_VERSION_ENV,
    BuildError,
    ensure_built,
    ensure_optional,
    with_implied,
)
from devcluster.cluster import DEFAULT_POD_SECONDS, POD_SECONDS_ENV, UP_OPTIONAL, Cluster, ClusterError
from devcluster.commands import Command, load_commands


def _log(message: str) -> None:
    print(message, flush=True)


# Every command takes the version choices; each sets its variable for this process and what it starts.
VERSION_OPTIONS = {"--tekton-version": TEKTON_VERSION_ENV, "--kubernetes-version": KUBERNETES_VERSION_ENV}


def add_version_options(cmd: argparse.ArgumentParser) -> None:
    """`--tekton-version` and `--kubernetes-version` (default: the variables, else the pinned, newest pair)."""
    for option, variable in VERSION_OPTIONS.items():
        cmd.add_argument(option, metavar="vX.Y.Z", help=f"build and run this version (env {variable}; default: the pinned one)")


def apply_version_options(args: argparse.Namespace) -> None:
    """Put the chosen versions into the environment, where `build` reads them (and child processes inherit them)."""
    for option, variable in VERSION_OPTIONS.items():
        value = getattr(args, option.lstrip("-").replace("-", "_"), None)
        if value:
            os.environ[variable] = value


def parser(commands: Mapping[str, Command] | None = None) -> argparse.ArgumentParser:
    """The command line; `commands` are the plugins' (default: those their entry points declare)."""
    commands = load_commands() if commands is None else commands
    p = argparse.ArgumentParser(prog="python -m devcluster", description=__doc__)
    sub = p.add_subparsers(dest="command", required=True)
    build = sub.add_parser("build", help="build the binaries into the cache (nothing when it is complete)")
    build.add_argument(
        "--with",
        dest="optional",
        action="append",
        default=[],
        choices=sorted(OPTIONAL_COMPONENTS),
        help="also build an optional component (repeatable), e.g. prometheus for the egress-load tests",
    )

    def with_dir(name: str, help: str) -> argparse.ArgumentParser:
        cmd = sub.add_parser(name, help=help)
        cmd.add_argument("--dir", required=True, type=Path, help="the cluster directory")
        return cmd

    up = with_dir("up", "start a cluster in DIR (builds first if needed)")
    up.add_argument("--nodes", type=int, default=3, help="ordinary nodes node-N (default 3)")
    up.add_argument("--egress-nodes", type=int, default=3, help="egress nodes egress-N (default 3)")
    up.add_argument(
        "--pod-seconds",
        type=float,
        default=None,
        help=f"how long a Tekton pod runs on a fake node (env {POD_SECONDS_ENV}, default {DEFAULT_POD_SECONDS})",
    )
    up.add_argument(
        "--with",
        dest="optional",
        action="append",
        default=[],
        choices=UP_OPTIONAL,
        help="also run an optional component (repeatable; built first if needed), e.g. tekton-webhook: "
        "Tekton's own defaulting, validation and conversion webhook; karpenter (with its KWOK provider), "
        "kueue, tekton-kueue (implies kueue)",
    )
    with_dir("down", "stop every process the cluster in DIR started")
    with_dir("status", "what runs; exit status 1 when something is down")
    kc = with_dir("kubeconfig", "mint a client-certificate kubeconfig for a user")
    kc.add_argument("--user", required=True, help="e.g. system:serviceaccount:NS:NAME")
    kc.add_argument("--group", action="append", help="override the groups (repeatable)")
    kc.add_argument("--out", type=Path, help="where to write it (default DIR/users/USER.kubeconfig)")
    for name, command in commands.items():  # what runs on the cluster adds these (`devcluster.commands`)
        command.configure(sub.add_parser(name, help=command.help))
    for cmd in sub.choices.values():
        add_version_options(cmd)
    return p


def main(argv: list[str] | None = None) -> int:
    commands = load_commands()
    args = parser(commands).parse_args(argv)
    apply_version_options(args)
    try:
        if args.command in commands:
            return commands[args.command].run(args, _log)
        if args.command == "build":
            ensure_built(_log)
            for name in with_implied(args.optional):  # tekton-kueue implies kueue
                _log(f"[build] {name} ready: {ensure_optional(name, _log)}")
            return 0
        if args.command == "up":
            cluster = Cluster(
                args.dir,
                nodes=args.nodes,
                egress_nodes=args.egress_nodes,
                pod_seconds=args.pod_seconds,
                log=_log,
                optional=args.optional,
            )
            cluster.up()
            print(f"export KUBECONFIG={cluster.kubeconfig}")
            return 0
        cluster = Cluster(args.dir, log=_log)
        if args.command == "down":
            cluster.down()
            _log(f"[devcluster] down: nothing of {cluster.dir} runs")
            return 0
        if args.command == "status":
            rows = cluster.status()
            if not rows:
                _log(f"[devcluster] nothing runs in {cluster.dir}")
                return 1
            _log(f"{'COMPONENT':<26}{'PID':>8}  {'ALIVE':<6}{'HEALTHY':<8}PORT")
            for r in rows:
                _log(f"{r.name:<26}{r.pid:>8}  {str(r.alive).lower():<6}{str(r.healthy).lower():<8}{r.port or '-'}")
            return 0 if all(r.alive and r.healthy for r in rows) else 1
        if args.command == "kubeconfig":
            if not cluster.state():
                raise ClusterError(f"no cluster in {cluster.dir}")
            print(cluster.mint_kubeconfig(args.user, args.group, args.out))
            return 0
    except (BuildError, ClusterError) as err:
        print(f"[devcluster] error: {err}", file=sys.stderr, flush=True)
        return 1
    raise AssertionError(args.command)


if __name__ == "__main__":
    sys.exit(main())
