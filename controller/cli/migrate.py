"""`egress-placer migrate-policy POLICY.yaml`: the EgressPool objects (and the EgressPlacerConfig
`cluster`, when a policy-wide field is not its default) that make the same policy, as YAML on stdout,
ready for `kubectl apply -f -` (docs/pools-api.md, "Migrating from the policy file"). Pools get the
priorities 10, 20, 30... in the file's order (v1alpha1's lower first), so that a node two pools claim keeps its pool. Reads
either form (objects come out renumbered). Exit status 2, with nothing on stdout, when the policy
is invalid. `-` reads the policy from standard input; `-o json` prints the objects as one JSON list,
`-o yaml` the same documents as the default. The objects are `v1beta1` (core.conversion: priorities
turned over, 999990, 999980..., the renamed fields), the version the API server stores: they apply with
no controller running to convert them (the upgrade from the ConfigMap applies them before the new
controller starts). `--api-version v1alpha1` prints the deprecated form (docs/pools-api.md, "v1beta1")."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import TextIO

from controller.cli.errors import CommandError
from controller.core.conversion import GROUP, to_version
from controller.core.policy import PolicyError
from controller.core.pools import dump_objects, load_any_policy, objects_from_policy, policy_from_objects


def run_migrate(
    policy_path: str, out: TextIO, output: str | None = None, stdin: TextIO | None = None, api_version: str = "v1beta1"
) -> int:
    try:
        if policy_path == "-":
            policy_path, text = "(stdin)", (stdin if stdin is not None else sys.stdin).read()
        else:
            text = Path(policy_path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise CommandError(f"{policy_path}: cannot read the file: {e}") from None
    try:
        policy = load_any_policy(text, source=policy_path)
    except PolicyError as e:
        raise CommandError(str(e)) from None
    objects = objects_from_policy(policy)
    if policy_from_objects(objects) != policy:  # never expected: the conversion is tested both ways
        raise CommandError(f"{policy_path}: the objects would not make the same policy; nothing printed")
    objects = [to_version(o, f"{GROUP}/{api_version}") for o in objects]
    if policy_from_objects(objects) != policy:  # the same check, in the version printed
        raise CommandError(f"{policy_path}: the {api_version} objects would not make the same policy; nothing printed")
    if output == "json":
        print(json.dumps([dict(o) for o in objects], indent=2), file=out)
        return 0
    print(f"# The policy of {policy_path} as objects of the pools API: kubectl apply -f THIS-FILE", file=out)
    if objects:
        out.write(dump_objects(objects))
    else:
        print("# (no pool and only defaults: no object is needed)", file=out)
    return 0
