"""Where the real-world Tekton corpora are, for the tests and the benchmarks.

- The public Tekton catalog sits beside this checkout on the project's machines (`../shared/catalog`),
  never on a user's: `EGRESS_PLACER_CATALOG` names another copy. When neither exists, the tests that
  need it are skipped, saying so, and the benchmarks use the Tasks of `tests/data/tekton`.
- Tekton's own `examples/` come with the pinned Tekton module, which every machine has in its Go
  module cache once the local cluster is built (`make cluster-build`).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

REPOSITORY = Path(__file__).resolve().parents[1]
FIXTURE_TASKS = REPOSITORY / "tests" / "data" / "tekton"  # a few catalog Tasks, copied with their licence
CATALOG_VARIABLE = "EGRESS_PLACER_CATALOG"


def catalog_dir() -> Path | None:
    """The Tekton catalog: `$EGRESS_PLACER_CATALOG`, else `shared/catalog` beside the repository, else None."""
    configured = os.environ.get(CATALOG_VARIABLE)
    path = Path(configured) if configured else REPOSITORY.parent / "shared" / "catalog"
    return path if path.is_dir() else None


def catalog_absent_reason() -> str:
    return (f"the public Tekton catalog is not beside this checkout (../shared/catalog) and "
            f"${CATALOG_VARIABLE} names none: the catalog corpus runs only where it is given")


def task_corpus_dir() -> Path:
    """The catalog when present, else the fixture Tasks (same `tasks/NAME/VERSION/NAME.yaml` layout)."""
    return catalog_dir() or FIXTURE_TASKS


def tekton_examples_dir() -> Path | None:
    """`examples/` of the pinned Tekton module in the Go module cache, or None when it is not downloaded
    (nothing is fetched here: `make cluster-build` downloads it)."""
    if shutil.which("go") is None:
        return None
    from devcluster.build import TOOLS_DIR, _go_env  # the pinned module and its Go settings

    listed = subprocess.run(["go", "list", "-m", "-json", "github.com/tektoncd/pipeline"], cwd=TOOLS_DIR / "tekton",
                            env={**_go_env(), "GOFLAGS": "-mod=mod -buildvcs=false", "GOPROXY": "off"},
                            capture_output=True, text=True)
    if listed.returncode != 0:
        return None
    module_dir = json.loads(listed.stdout).get("Dir")
    examples = Path(module_dir) / "examples" if module_dir else None
    return examples if examples is not None and examples.is_dir() else None
