"""One clean build of the whole site, shared by the tests that inspect it, and the
margin table of every cell of the portability matrix (tests/test_portability.py)."""

import os
import sys
import tempfile
from collections import defaultdict
from pathlib import Path

import pytest
from browser import serve

from tools.margin_report import rows as build_margins
from tools.site_build import REPO, copy_checkout, make

sys.path.insert(0, str(REPO / "sphinxext"))
import check_margins

# Built for hosting under a path prefix, as the browser tests serve it, and
# published from a GitHub repository, so that pages link to Colab. Its examples run
# with the plainest CPU kernels of PyTorch, MKL (its BLAS) and oneDNN, no AVX2 and
# no AVX-512: one cell of the matrix.
# Inductor's cache of compiled graphs does not key on the instruction set, so each
# cell of the matrix that compiles gets a cache of its own (new in every session).
SITE_ENV = {
    "COURSE_BASE_URL": "http://localhost/course/",
    "COURSE_REPO_URL": "https://github.com/course-authors/gpu-programming-for-llms",
    "ATEN_CPU_CAPABILITY": "default", "MKL_ENABLE_INSTRUCTIONS": "SSE4_2", "ONEDNN_MAX_CPU_ISA": "SSE41",
    "TORCHINDUCTOR_CACHE_DIR": tempfile.mkdtemp(prefix="course-inductor-site-"),
}

# Every process the suite starts gets an Inductor cache new in this session, unless its
# cell names one of its own: the cache's key ignores the CPU's instruction set, so code
# that another run compiled with other instructions (ATEN_CPU_CAPABILITY) must not be
# found there, and a new machine starts with no cache either.
os.environ["TORCHINDUCTOR_CACHE_DIR"] = tempfile.mkdtemp(prefix="course-inductor-suite-")

# cell -> margin rows, and cell -> seconds its example runs took, for the summary.
MARGINS = defaultdict(list)
CELL_SECONDS = defaultdict(float)


def record_margins(cell, rows, seconds=0.0):
    MARGINS[cell] += [{**row, "cell": cell} for row in rows]
    CELL_SECONDS[cell] += seconds


def pytest_terminal_summary(terminalreporter):
    rows = sorted((row for cell in MARGINS.values() for row in cell), key=lambda row: -row["use"])
    if not rows:
        return
    write = terminalreporter.write_line
    terminalreporter.section("margin use of the examples' numeric checks")
    for cell in MARGINS:
        worst = max((row["use"] for row in MARGINS[cell]), default=0.0)
        cost = f", {CELL_SECONDS[cell]:.0f} s" if CELL_SECONDS[cell] else ""
        write(f"{cell}: {len(MARGINS[cell])} checks, the worst uses {worst:.3f} of its tolerance{cost}")
    write(f"The 10 worst of {len(rows)} (above {check_margins.HEADROOM} a check fails its test):")
    for line in check_margins.markdown(rows, limit=10).splitlines():
        write(line)


@pytest.fixture(scope="session")
def site(tmp_path_factory):
    """A fresh checkout copy, built from scratch with ``make html-fresh``.

    COURSE_TEST_CHECKOUT=<folder> reuses a copy built earlier, as it is:
    handy while working on the browser tests themselves.
    """
    if reuse := os.environ.get("COURSE_TEST_CHECKOUT"):
        return Path(reuse), None
    checkout = copy_checkout(tmp_path_factory.mktemp("site"))
    result = make(checkout, "html-fresh", env=SITE_ENV)
    if result.returncode != 0:
        pytest.fail(f"make html failed:\n{result.log[-6000:]}")
    record_margins("site build (ATEN_CPU_CAPABILITY=default)",
                   build_margins(checkout / "source" / "auto_examples"), result.seconds)
    return checkout, result


@pytest.fixture(scope="session")
def served(site):
    """Both editions on a loopback server, under a path prefix: (site root, base URL)."""
    checkout, _ = site
    root = checkout / "_build" / "html"
    server, base = serve(root)
    yield root, base
    server.shutdown()
