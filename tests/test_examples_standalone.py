"""Every example runs on its own, as the GPU check runs it, in one cell of the
portability matrix (tests/test_portability.py): AVX2 kernels, one thread, and a
busy loop on every core, as on a machine that other programs keep busy. Its
correctness checks must hold there; its timing claims, on a CPU, only report.

The runs are the GPU check's (tools/gpu_check.py): one process per example,
here at CPU sizes, with no TRITON_INTERPRET or COURSE_* variable set for them.
So this also checks that the check itself works and writes its report, margins
included.
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


class BusyCores:
    """A busy loop on every core while the block runs: the load of a shared machine."""

    def __enter__(self):
        self.loops = [subprocess.Popen([sys.executable, "-c", "while True: pass"])
                      for _ in range(os.cpu_count() or 1)]
        return self

    def __exit__(self, *exc):
        for loop in self.loops:
            loop.kill()
            loop.wait()


# AVX2 in PyTorch's kernels, MKL's and oneDNN's, as on a CPU without AVX-512; one thread.
CELL = {"ATEN_CPU_CAPABILITY": "avx2", "MKL_ENABLE_INSTRUCTIONS": "AVX2", "ONEDNN_MAX_CPU_ISA": "AVX2",
        "OMP_NUM_THREADS": "1"}


@pytest.fixture(scope="session")
def gpu_check_report(tmp_path_factory):
    out = tmp_path_factory.mktemp("gpu-check")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("COURSE_", "TRITON_"))} | CELL
    env["TORCHINDUCTOR_CACHE_DIR"] = str(out / "inductor")  # its own: the cache ignores the ISA
    with BusyCores():
        done = subprocess.run(
            [sys.executable, str(REPO / "tools" / "gpu_check.py"), "--out", str(out), "--timeout", "600"],
            env=env, capture_output=True, text=True, check=False,
        )
    print(done.stdout)
    report = json.loads((out / "report.json").read_text())
    for result in report["examples"].values():
        record_margins("GPU check (avx2, 1 thread, busy cores)", result.get("margins", []), result["seconds"])
    return done, out


def test_report_is_written(gpu_check_report):
    done, out = gpu_check_report
    report = json.loads((out / "report.json").read_text())
    assert len(report["examples"]) == len(EXAMPLES)
    assert report["machine"]["device"]
    markdown = (out / "report.md").read_text()
    rows = re.findall(r"^\| `lecture[^`]*` \| (?:pass|FAIL)", markdown, flags=re.MULTILINE)
    assert len(rows) == len(EXAMPLES)  # one row per example (the targets table comes after)
    assert done.returncode == (0 if report["passed"] == len(EXAMPLES) else 1)


@pytest.mark.parametrize("example", EXAMPLES, ids=lambda p: p.stem)
def test_runs_standalone(gpu_check_report, example):
    _, out = gpu_check_report
    result = json.loads((out / "report.json").read_text())["examples"][
        f"{example.parent.name}/{example.name}"
    ]
    assert result["passed"], result["error"]
    assert result["key_figures"], "the example reports no KEY_FIGURES"
    over = [m for m in result["margins"] if m["use"] > check_margins.HEADROOM]
    assert not over, "checks that use more than half of their tolerance:\n" + check_margins.markdown(over)
