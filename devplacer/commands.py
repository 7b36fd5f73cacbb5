"""egress-placer's commands of the launcher: `python -m devcluster controller` and `demo`.

Declared as entry points of the group `devcluster.commands` in pyproject.toml (`devcluster.commands`
reads them), so the launcher names neither. Their options are the command-line contract: keep them.
What they run is imported when they run, so `up` and `down` do not load the product.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Callable

from devcluster.cluster import Cluster

Log = Callable[[str], None]


class ControllerCommand:
    help = "start egress-placer on the cluster in DIR under the k8s/ identity, webhook registered"

    def configure(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("--dir", required=True, type=Path, help="the cluster directory")
        parser.add_argument("--policy", required=True, type=Path, help="the policy file (into the policy ConfigMap; with --pools, as objects)")
        parser.add_argument("--pools", action="store_true", help="the policy as the pools API's objects (the default install) instead of the ConfigMap")
        parser.add_argument("--replicas", type=int, default=1,
                            help="controller processes (one leader; default 1); with more than one, admission reaches all of them "
                                 "through a proxy that splits per connection, as a Service does")
        parser.add_argument("--pool-guard", action="store_true", help="also install the pool guard (k8s/pool-guard.yaml)")

    def run(self, args: argparse.Namespace, log: Log) -> int:
        from devplacer.local_placer import RECORD, start_controller

        source = "pools" if args.pools else "configmap"
        cluster = Cluster(args.dir, log=log)
        # More than one replica: the webhooks call a round-robin proxy in front of all of them (devplacer.webhook_proxy)
        replicas = start_controller(cluster, args.policy, replicas=args.replicas, pool_guard=args.pool_guard, policy_source=source,
                                    proxy=args.replicas > 1)
        for replica in replicas:
            log(f"[devcluster] {replica.name} ready: webhook {replica.webhook_url}, health {replica.health_url}")
        if args.replicas > 1:
            log(f"[devcluster] admission: {(cluster.recorded(RECORD) or {}).get('webhook_url')} (a proxy to every replica, one per connection)")
        return 0


class DemoCommand:
    help = "the main job: cluster, Tekton, controller, a mix of runs, where they went"

    def configure(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("--dir", type=Path, help="the cluster directory (default: a new temporary one)")
        parser.add_argument("--keep", action="store_true", help="leave the cluster running afterwards")

    def run(self, args: argparse.Namespace, log: Log) -> int:
        from devplacer.demo import run_demo

        return run_demo(args.dir, keep=args.keep, log=log)


CONTROLLER = ControllerCommand()
DEMO = DemoCommand()
