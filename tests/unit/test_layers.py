"""The layers stay honest: import-linter's contracts (pyproject.toml) hold for the whole package.

The core imports no client and no I/O library; only `controller.kube` imports `kubernetes`;
admission reads memory only. A violation fails here with the offending import chain.
"""

import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_import_contracts_hold():
    lint = shutil.which("lint-imports", path=str(Path(sys.executable).parent))
    assert lint, "import-linter is a dev dependency: lint-imports must be installed beside this Python"
    result = subprocess.run([lint], cwd=ROOT, capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "broken" not in result.stdout.lower().replace("0 broken", "")
