"""Every example runs on its own, as a reader who downloaded it would run it."""

import os
import subprocess
import sys

import pytest

from tools.site_build import EXAMPLES


@pytest.mark.parametrize("example", EXAMPLES, ids=lambda p: p.stem)
def test_runs_standalone(example, tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith(("COURSE_", "TRITON_"))}
    env["MPLBACKEND"] = "Agg"
    done = subprocess.run(
        [sys.executable, str(example)], cwd=tmp_path, env=env,
        capture_output=True, text=True, timeout=600,
    )
    assert done.returncode == 0, f"{example.name} failed:\n{done.stderr[-4000:]}"
    assert done.stdout.strip(), "printed nothing"
