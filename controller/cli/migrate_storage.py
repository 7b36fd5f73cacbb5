"""`egress-placer migrate-storage`: the pools API's storage migration (controller/kube/storage_migration.py),
run by an admin without the controller's leader: every EgressPool and the EgressPlacerConfig written back
so that the API server stores them as `v1beta1`, then the CRDs' `status.storedVersions` pruned to
`[v1beta1]` (docs/pools-api.md, "Serving, storing, converting"). Idempotent: a second run only reads.

`--dry-run` reads only and says what it would write. `-o json|yaml`: one object, `dryRun` and `steps`.
Exit status: 0 done (or planned), 2 the CRDs installed do not store v1beta1 (install the newer CRDs
first), 3 the cluster cannot be reached or a request is refused (missing rights: it needs update on
the EgressPools, the EgressPlacerConfig and customresourcedefinitions/status), in one line.
"""

from __future__ import annotations

import json
from typing import TextIO

import yaml

from controller.cli.errors import CommandError, Exit
from controller.cli.status import reach, unreachable
from controller.kube.client import KubeApi
from controller.kube.storage_migration import NotStoringV1beta1, migrate_storage


def run_migrate_storage(api: KubeApi, out: TextIO, *, dry_run: bool, output: str | None = None) -> int:
    reach(api)  # at once, in one line
    try:
        steps = migrate_storage(api, dry_run=dry_run)
    except NotStoringV1beta1 as e:
        raise CommandError(str(e)) from None
    except Exception as e:  # an answer refused (403: rights; 404: no CRD) or none
        raise unreachable(e, api) from None
    if output in ("json", "yaml"):
        report = {"dryRun": dry_run, "steps": steps}
        out.write(json.dumps(report, indent=2) + "\n" if output == "json" else yaml.safe_dump(report, sort_keys=False))
        return Exit.OK
    print(f"egress-placer migrate-storage{' --dry-run: nothing is changed' if dry_run else ''}:", file=out)
    for step in steps:
        print(f"  {step}", file=out)
    if not steps:
        print("  nothing to do: every object is stored as v1beta1 and storedVersions is [v1beta1]", file=out)
    return Exit.OK
