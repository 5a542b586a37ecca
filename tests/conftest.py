"""One clean build of the whole site, shared by the tests that inspect it (and by all
of pytest-xdist's workers), the margin table of every cell of the portability matrix
(tests/test_portability.py), and the order in which the workers take the tests.

``make test`` runs the suite on three workers (``-n 3 --dist loadgroup``): most of its
time goes to one-core processes (Sphinx builds, compilers), so they fill a 2-core
machine. Each test gets a group, in the order below: one worker builds the site, one
waits for it to run the build sequences in its folder, and one runs the tests that
need no site.
"""

import dataclasses
import json
import os
import shutil
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

import pytest
from browser import serve
from filelock import FileLock

from tools.margin_report import rows as build_margins
from tools.site_build import REPO, BuildResult, copy_checkout, make

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
# The Chinese edition executes its own programs, which compute what the English ones do
# (tools/program_messages.py), so the site build runs it at the other end of the matrix:
# the machine's own instructions (AVX-512 where it has them), with a cache of its own.
ISA = ("ATEN_CPU_CAPABILITY", "MKL_ENABLE_INSTRUCTIONS", "ONEDNN_MAX_CPU_ISA")
SITE_ENV_CHINESE = {**{k: v for k, v in SITE_ENV.items() if k not in ISA},
                    "TORCHINDUCTOR_CACHE_DIR": tempfile.mkdtemp(prefix="course-inductor-site-zh-")}

# Every process the suite starts gets an Inductor cache new in this session, unless its
# cell names one of its own: the cache's key ignores the CPU's instruction set, so code
# that another run compiled with other instructions (ATEN_CPU_CAPABILITY) must not be
# found there, and a new machine starts with no cache either.
os.environ["TORCHINDUCTOR_CACHE_DIR"] = tempfile.mkdtemp(prefix="course-inductor-suite-")
# C++ extensions likewise get a folder per worker: two processes that build one extension
# in one folder race on its lock file and on ninja's outputs (a CI run failed on it, with
# "No such file or directory: .../lecture06_gelu_cpu_twin/lock").
os.environ["TORCH_EXTENSIONS_DIR"] = tempfile.mkdtemp(prefix="course-extensions-suite-")

# Groups of tests that share a costly fixture run on one worker, in this order. A test's
# group is its xdist_group mark, or else its file's name; the files not named here go
# between the first groups and the groups that read the site.
FIRST = ["site", "builds"]  # "builds", the longest, waits for the site on a worker of its own
# The browser tests before the shorter ones: in the last run they began last and ran alone
# for five minutes while two workers idled.
SITE_READERS = ["portability-reader", "portability-newest", "browser", "publishing", "cache",
                "links", "code_links"]


def group_of(item):
    mark = item.get_closest_marker("xdist_group")
    return mark.args[0] if mark else item.module.__name__.removeprefix("test_")


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(items):
    rank = {group: i for i, group in enumerate(FIRST)}
    rank |= {group: 1000 + i for i, group in enumerate(SITE_READERS)}
    items.sort(key=lambda item: rank.get(group_of(item), 500))  # stable: each file keeps its order


@pytest.fixture(autouse=True)
def _critical_path_first(request):
    """Under xdist, a worker that takes a group off the critical path (the site build, then
    the build sequences in its folder) runs it, and all it starts, at nice 10: the two cores
    serve the site and the sequences first, and the rest fills what they leave."""
    off_the_path = os.environ.get("PYTEST_XDIST_WORKER") and group_of(request.node) not in FIRST
    if off_the_path and os.getpriority(os.PRIO_PROCESS, 0) < 10:
        os.setpriority(os.PRIO_PROCESS, 0, 10)
    yield


def pytest_collection_finish(session):
    if groups := os.environ.get("COURSE_TEST_GROUPS"):  # for the scheduler, in the controller
        partial = Path(f"{groups}.{os.getpid()}")
        partial.write_text(json.dumps({item.nodeid: group_of(item) for item in session.items}))
        partial.replace(groups)


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config, log):
    """xdist's own loadgroup marks node IDs, which pytest 9 no longer lets a plugin change;
    this one reads each test's group from the file the workers wrote at collection."""
    if config.getvalue("dist") != "loadgroup":
        return None
    from xdist.scheduler import LoadScopeScheduling

    class GroupScheduling(LoadScopeScheduling):
        def _split_scope(self, nodeid):
            if not hasattr(self, "groups"):
                self.groups = json.loads(Path(os.environ["COURSE_TEST_GROUPS"]).read_text())
            return self.groups[nodeid]

    return GroupScheduling(config, log)


def shared_folder(tmp_path_factory):
    """A folder every worker sees: the parent of their own temporary folders under xdist."""
    base = tmp_path_factory.getbasetemp()
    return base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base


def pytest_configure(config):
    # Margin rows go to one file, which the controller (or the only process) reads at the
    # end; the workers write each test's group to another, for the controller's scheduler.
    if not hasattr(config, "workerinput"):
        folder = Path(tempfile.mkdtemp(prefix="course-suite-"))
        os.environ["COURSE_TEST_MARGINS"] = str(folder / "margins.jsonl")
        os.environ["COURSE_TEST_GROUPS"] = str(folder / "groups.json")
        os.environ["COURSE_TEST_TIMELINE"] = str(folder / "timeline.jsonl")
        os.environ["COURSE_TEST_START"] = repr(time.time())
        # The suite's builds, each in a folder of its own, share codeautolink's memo
        # (keyed on everything a page's links depend on): what one linked, the next reuses.
        os.environ["COURSE_CODEAUTOLINK_MEMO"] = str(folder / "codeautolink-memo")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item):
    """When each test ran, and on which worker: the summary's timeline of the groups."""
    start = time.time()
    yield
    if path := os.environ.get("COURSE_TEST_TIMELINE"):
        entry = {"worker": os.environ.get("PYTEST_XDIST_WORKER", "main"), "group": group_of(item),
                 "start": start, "end": time.time()}
        with FileLock(path + ".lock"), open(path, "a", encoding="utf-8") as log:
            log.write(json.dumps(entry) + "\n")


def timeline():
    """(worker, group, first start, last end) in seconds from the session's start, in order."""
    path = Path(os.environ.get("COURSE_TEST_TIMELINE", "/nonexistent"))
    zero = float(os.environ.get("COURSE_TEST_START", "0"))
    spans = {}
    for line in path.read_text(encoding="utf-8").splitlines() if path.exists() else []:
        e = json.loads(line)
        key = (e["worker"], e["group"])
        first, last = spans.get(key, (e["start"], e["end"]))
        spans[key] = (min(first, e["start"]), max(last, e["end"]))
    return sorted(((w, g, a - zero, b - zero) for (w, g), (a, b) in spans.items()), key=lambda r: (r[0], r[2]))


def record_margins(cell, rows, seconds=0.0):
    """Adds a cell's margin rows (and the seconds its runs took) to the suite's table."""
    path = Path(os.environ["COURSE_TEST_MARGINS"])
    with FileLock(str(path) + ".lock"), path.open("a", encoding="utf-8") as log:
        log.write(json.dumps({"cell": cell, "rows": rows, "seconds": seconds}) + "\n")


def recorded_margins():
    """cell -> margin rows, and cell -> seconds its example runs took."""
    margins, seconds = defaultdict(list), defaultdict(float)
    path = Path(os.environ.get("COURSE_TEST_MARGINS", "/nonexistent"))
    for line in path.read_text(encoding="utf-8").splitlines() if path.exists() else []:
        entry = json.loads(line)
        margins[entry["cell"]] += [{**row, "cell": entry["cell"]} for row in entry["rows"]]
        seconds[entry["cell"]] += entry["seconds"]
    return margins, seconds


def _clock(seconds):
    return f"{int(seconds // 60)}:{int(seconds % 60):02d}"


def pytest_terminal_summary(terminalreporter):
    if hasattr(terminalreporter.config, "workerinput"):
        return
    if spans := timeline():
        terminalreporter.section("when each group of tests ran (minutes:seconds from the start)")
        for worker, group, start, end in spans:
            if end - start >= 20:  # the short ones would drown the path
                terminalreporter.write_line(f"{worker}  {_clock(start)} - {_clock(end)}  {group}")
    margins, seconds = recorded_margins()
    rows = sorted((row for cell in margins.values() for row in cell), key=lambda row: -row["use"])
    if not rows:
        return
    write = terminalreporter.write_line
    terminalreporter.section("margin use of the examples' numeric checks")
    for cell in margins:
        worst = max((row["use"] for row in margins[cell]), default=0.0)
        cost = f", {seconds[cell]:.0f} s" if seconds[cell] else ""
        write(f"{cell}: {len(margins[cell])} checks, the worst uses {worst:.3f} of its tolerance{cost}")
    write(f"The 10 worst of {len(rows)} (above {check_margins.HEADROOM} a check fails its test):")
    for line in check_margins.markdown(rows, limit=10).splitlines():
        write(line)


@pytest.fixture(scope="session")
def site(tmp_path_factory):
    """A fresh checkout copy, built from scratch with ``make html-fresh``, once for all
    workers: (a snapshot of it, the build's result). Tests only read the snapshot; the
    tests that build again do so in the build's own folder (``site_to_build_in``).

    COURSE_TEST_CHECKOUT=<folder> reuses a copy built earlier, as it is:
    handy while working on the browser tests themselves.
    """
    if reuse := os.environ.get("COURSE_TEST_CHECKOUT"):
        return Path(reuse), None
    shared = shared_folder(tmp_path_factory)
    built = shared / "site.json"
    with FileLock(str(shared / "site.lock")):
        if built.exists():  # another worker built it
            record = json.loads(built.read_text())
            if record["result"]["returncode"] != 0:
                pytest.fail("make html failed (in another worker's build)")
            return Path(record["snapshot"]), BuildResult(**record["result"])
        checkout = copy_checkout(shared / "site")
        result = make(checkout, "html-fresh", env=SITE_ENV, EDITIONS="en")
        if result.returncode == 0:
            chinese = make(checkout, "html", env=SITE_ENV_CHINESE, EDITIONS="zh_CN")
            result = BuildResult(chinese.returncode, result.log + chinese.log, result.seconds + chinese.seconds)
        snapshot = shared / "site-snapshot"
        if result.returncode == 0:
            shutil.copytree(checkout, snapshot, symlinks=True)
        built.write_text(json.dumps({"checkout": str(checkout), "snapshot": str(snapshot),
                                     "result": dataclasses.asdict(result)}))
    if result.returncode != 0:
        pytest.fail(f"make html failed:\n{result.log[-6000:]}")
    record_margins("site build (ATEN_CPU_CAPABILITY=default)",
                   build_margins(checkout / "source" / "auto_examples"), result.seconds)
    record_margins("site build, Chinese programs (the machine's own instructions)",
                   build_margins(checkout / "_build" / "tree-zh_CN" / "source" / "auto_examples"))
    return snapshot, result


@pytest.fixture(scope="session")
def site_to_build_in(site, tmp_path_factory):
    """The folder the site was built in, for the tests that build again (group "builds",
    one worker, one after another). In its own folder a build starts from the pages
    already there; in a copy, Sphinx would read and write every page anew."""
    if os.environ.get("COURSE_TEST_CHECKOUT"):
        pytest.skip("the build tests need the suite's own build, not COURSE_TEST_CHECKOUT")
    record = json.loads((shared_folder(tmp_path_factory) / "site.json").read_text())
    return Path(record["checkout"])


@pytest.fixture(scope="session")
def served(site):
    """Both editions on a loopback server, under a path prefix: (site root, base URL)."""
    checkout, _ = site
    root = checkout / "_build" / "html"
    server, base = serve(root)
    yield root, base
    server.shutdown()
