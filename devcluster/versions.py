"""Adds a version of a versioned tool module: `python -m devcluster.versions MODULE VERSION`.

Writes `tools/_versions/<module>/<version>/go.mod` and `go.sum` (`go mod tidy` against the module proxy) for a
Tekton module (`tekton`, `tekton-webhook`, `tekton-resolvers`) or `kubernetes`: the pinned module's go.mod
header (comment, module path, go line), the upstream module at VERSION, for Kubernetes its staging modules
replaced by v0.MINOR.PATCH as upstream's own go.mod lists them, and the tool module's `tool` lines. Go files
of the variant (a copy of an upstream `main.go`, a patched dependency) are not written here: where the
upstream file the module copies differs between the pin and VERSION, lay a copy of VERSION's file with the
same changes under the variant (devcluster/README.md, "Versions").
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from devcluster import build


def _upstream_go_mod(component: build.Component, version: str, cwd: Path) -> str:
    out = subprocess.run(["go", "mod", "download", "-json", f"{component.pin}@{version}"], cwd=cwd,
                         env=build._go_env(), capture_output=True, text=True)
    if out.returncode != 0:
        raise build.BuildError(f"{component.pin}@{version}: {out.stderr.strip() or out.stdout.strip()}")
    return Path(json.loads(out.stdout)["GoMod"]).read_text()


def staging_replaces(upstream_go_mod: str, version: str) -> list[str]:
    """`replace` lines pinning each staging module (`k8s.io/X => ./staging/src/k8s.io/X`) to v0.MINOR.PATCH."""
    staging_version = "v0." + version.lstrip("v").split(".", 1)[1]
    names = re.findall(r"^\s*(k8s\.io/\S+)\s+=>\s+\./staging/src/", upstream_go_mod, re.MULTILINE)
    return [f"\t{name} => {name} {staging_version}" for name in names]


def variant_go_mod(pinned_go_mod: str, pin: str, version: str, replaces: list[str]) -> str:
    """The variant's go.mod before tidying: the pinned one's header and `tool` block, `pin` at `version`."""
    header = pinned_go_mod.split("\nrequire", 1)[0].rstrip()
    tools = re.search(r"^tool (?:\((?:.|\n)*?^\)|[^(\s]\S*)$", pinned_go_mod, re.MULTILINE)
    parts = [header, f"require {pin} {version}"]
    if replaces:
        parts.append("replace (\n" + "\n".join(replaces) + "\n)")
    if tools:
        parts.append(tools.group(0))
    return "\n\n".join(parts) + "\n"


def add_variant(module: str, version: str, log: build.Log = print) -> Path:
    """Write tools/_versions/MODULE/VERSION/go.mod and go.sum; returns that directory."""
    if module not in build.VERSIONED_MODULES:
        raise build.BuildError(f"{module} does not follow a version choice; these do: {', '.join(build.VERSIONED_MODULES)}")
    base = next(c for c in (*build.COMPONENTS, *build.OPTIONAL_COMPONENTS.values()) if c.module == module)
    target = build.VERSIONS_DIR / module / version
    with tempfile.TemporaryDirectory(prefix="variant-") as work:
        work_dir = Path(work)
        variant = build.Component(base.module, base.pin, base.binaries, base.why, variant=version) if target.is_dir() else base
        for relative, path in build.module_files(variant).items():
            (work_dir / relative).parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(path, work_dir / relative)
        replaces = []
        if base.stamp_kubernetes_version:
            replaces = staging_replaces(_upstream_go_mod(base, version, work_dir), version)
        pinned = (build.TOOLS_DIR / module / "go.mod").read_text()
        (work_dir / "go.mod").write_text(variant_go_mod(pinned, base.pin, version, replaces))
        (work_dir / "go.sum").write_text("")
        log(f"[versions] go mod tidy for {module} at {version}")
        tidy = subprocess.run(["go", "mod", "tidy"], cwd=work_dir, env=build._go_env(), capture_output=True, text=True)
        if tidy.returncode != 0:
            raise build.BuildError(f"go mod tidy failed:\n{tidy.stderr[-3000:]}")
        target.mkdir(parents=True, exist_ok=True)
        for name in ("go.mod", "go.sum"):
            shutil.copyfile(work_dir / name, target / name)
    log(f"[versions] wrote {target.relative_to(build.TOOLS_DIR.parent)}/go.mod and go.sum")
    return target


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m devcluster.versions", description=__doc__.split("\n\n")[0])
    p.add_argument("module", choices=sorted(build.VERSIONED_MODULES))
    p.add_argument("version", help="e.g. v1.12.0")
    args = p.parse_args(argv)
    try:
        add_variant(args.module, args.version)
    except build.BuildError as err:
        print(f"[versions] error: {err}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
