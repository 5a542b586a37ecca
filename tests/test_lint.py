"""The code is ruff clean."""

import subprocess
import sys
from pathlib import Path


def test_ruff():
    ruff = Path(sys.prefix, "bin", "ruff")
    done = subprocess.run([str(ruff), "check", "."], capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stdout + done.stderr
