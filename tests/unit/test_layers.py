"""The layers stay honest: import-linter's contracts (pyproject.toml) hold for the whole package.

The core imports no client and no I/O library; only `controller.kube` imports `kubernetes`;
admission reads memory only; every module of `controller/` sits in a layer. A violation fails here
with the offending import chain, and a module no contract names fails too.
"""

import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_import_contracts_hold():
    lint = shutil.which("lint-imports", path=str(Path(sys.executable).parent))
    assert lint, "import-linter is a dev dependency: lint-imports must be installed beside this Python"
    result = subprocess.run([lint], cwd=ROOT, capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "broken" not in result.stdout.lower().replace("0 broken", "")


def contract_names(contract: dict) -> set[str]:
    """Every module a contract names: sources, forbidden or independent modules, layers (split at
    "|" and ":"), containers."""
    names: set[str] = set()
    for key in ("source_modules", "forbidden_modules", "modules", "containers"):
        names.update(contract.get(key) or ())
    for layer in contract.get("layers") or ():
        names.update(part.strip() for part in layer.replace(":", "|").split("|"))
    return names


def modules_of_controller() -> set[str]:
    out = set()
    for path in (ROOT / "controller").rglob("*.py"):
        parts = path.relative_to(ROOT).with_suffix("").parts
        out.add(".".join(parts[:-1] if parts[-1] == "__init__" else parts))
    return out


def test_every_module_of_controller_is_named_by_a_contract():
    contracts = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]["contracts"]
    named = set().union(*(contract_names(c) for c in contracts))

    def covered(module: str) -> bool:
        parts = module.split(".")
        return any(".".join(parts[:i]) in named for i in range(2, len(parts) + 1))

    unchecked = sorted(m for m in modules_of_controller() if m != "controller" and not covered(m))
    assert not unchecked, f"modules no import contract names (add them to pyproject.toml): {unchecked}"
