"""The GPU check (tools/gpu_check.py) runs examples on their own and writes its report.

On the GPU machine it runs every example, one process each; here it runs two fast
ones at CPU sizes, with no TRITON_INTERPRET or COURSE_* variable set for them, to
check that the check itself works and writes its report, margins included. Every
example's own checks run in the cells of tests/test_portability.py, and its
KEY_FIGURES are checked in the site build (tests/test_site.py).
"""

import json
import os
import re
import subprocess
import sys

import pytest
from conftest import record_margins

from tools.site_build import EXAMPLES, REPO

sys.path.insert(0, str(REPO / "sphinxext"))
import check_margins

CHECKED = [e for e in EXAMPLES if e.stem in ("01_roofline", "01_benchmarking")]


@pytest.fixture(scope="session")
def gpu_check_report(tmp_path_factory):
    out = tmp_path_factory.mktemp("gpu-check")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("COURSE_", "TRITON_"))}
    env["TORCHINDUCTOR_CACHE_DIR"] = str(out / "inductor")
    done = subprocess.run(
        [sys.executable, str(REPO / "tools" / "gpu_check.py"), "--out", str(out), "--timeout", "600",
         *(e.stem for e in CHECKED)],
        env=env, capture_output=True, text=True, check=False,
    )
    print(done.stdout)
    report = json.loads((out / "report.json").read_text())
    for result in report["examples"].values():
        record_margins("GPU check", result.get("margins", []), result["seconds"])
    return done, out


def test_report_is_written(gpu_check_report):
    done, out = gpu_check_report
    report = json.loads((out / "report.json").read_text())
    assert len(CHECKED) == 2 and len(report["examples"]) == len(CHECKED)
    assert report["machine"]["device"]
    markdown = (out / "report.md").read_text()
    rows = re.findall(r"^\| `lecture[^`]*` \| (?:pass|FAIL)", markdown, flags=re.MULTILINE)
    assert len(rows) == len(CHECKED)  # one row per example (the targets table comes after)
    assert done.returncode == (0 if report["passed"] == len(CHECKED) else 1)


@pytest.mark.parametrize("example", CHECKED, ids=lambda p: p.stem)
def test_each_checked_example_passes_with_its_figures_and_margins(gpu_check_report, example):
    _, out = gpu_check_report
    result = json.loads((out / "report.json").read_text())["examples"][
        f"{example.parent.name}/{example.name}"
    ]
    assert result["passed"], result["error"]
    assert result["key_figures"], "the example reports no KEY_FIGURES"
    assert result["margins"], "the report kept no margins"
    over = [m for m in result["margins"] if m["use"] > check_margins.HEADROOM]
    assert not over, "checks that use more than half of their tolerance:\n" + check_margins.markdown(over)
