"""The portability matrix: every example's checks hold on the machines its readers have,
each with at least 2x headroom on its tolerance.

A check that passes on one machine can fail on another (a float64 check once failed
a fresh clone on a CPU without AVX-512), so the suite runs every example in several
cells, one process per example, and logs the margin use of every ``assert_close``
(its worst error over the error it allowed, sphinxext/check_margins.py):

| cell | where | CPU instructions | threads | versions | environment |
| --- | --- | --- | --- | --- | --- |
| site build, English | tests/conftest.py | none beyond SSE4 (``ATEN_CPU_CAPABILITY=default``, MKL's and oneDNN's likewise) | 2 | pins | ``make html`` |
| site build, Chinese | tests/conftest.py | the machine's own (AVX-512 where it has it) | 2 | pins | ``make html``, executing the Chinese programs, which compute what the English ones do |
| reader, loaded | here | AVX2 (PyTorch's, MKL's and oneDNN's) | 1 | pins | the Chinese edition's downloaded ``.py`` in an empty folder, no variables; two runs at a time, beside the suite's other workers and a lowest-priority busy loop on every core |
| newest | here | the machine's own (AVX-512 where it has it) | 1 | the newest triton and numpy on PyPI | the English downloads that import triton or numpy or compile with Inductor (``uses_the_newest``), as a reader, two at a time |
| no Triton, no C++ | tests/test_strict_builds.py | the machine's own | 1 | pins | ``import triton`` fails; ``CXX=/bin/false`` (a compiler missing from PATH: its probe, by itself) |

Each cell fails a test when an example fails, or when one of its checks uses more
than half of its tolerance (``HEADROOM``). Timing claims are not tolerances: on a
CPU the examples report them, and excuse them when other programs took the cores.
``make test`` prints the worst margins of every cell at the end.
"""

import ast
import os
import re
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from conftest import record_margins

from tools.site_build import EXAMPLES, REPO

sys.path.insert(0, str(REPO / "sphinxext"))
import check_margins

RUNNER = REPO / "tools" / "run_as_reader.py"
NEWEST = ("triton", "numpy")  # what a reader who installs today gets beside the pinned torch


def uses_the_newest(example):
    """Whether an example can meet the newest triton or numpy: it imports one of them, or
    compiles with Inductor (which imports Triton). The others reach them only through
    torch and matplotlib, as these do too; every example runs at the machine's own
    instructions in the site build's Chinese edition."""
    tree = ast.parse(example.read_text(encoding="utf-8"))
    modules = {alias.name.split(".")[0] for node in ast.walk(tree) if isinstance(node, ast.Import)
               for alias in node.names}
    modules |= {node.module.split(".")[0] for node in ast.walk(tree)
                if isinstance(node, ast.ImportFrom) and node.module}
    compiles = any(isinstance(node, ast.Attribute) and node.attr in ("compile", "_inductor")
                   and isinstance(node.value, ast.Name) and node.value.id == "torch" for node in ast.walk(tree))
    return bool(modules & set(NEWEST)) or compiles


NEWEST_EXAMPLES = [e for e in EXAMPLES if uses_the_newest(e)]
HAN = re.compile(r"[\u4e00-\u9fff]")


@dataclass
class Run:
    returncode: int
    seconds: float
    output: str
    margins: list = field(default_factory=list)


def reader_env(cache, **extra):
    """The environment of a reader's shell: none of the build's or the suite's variables.

    Inductor's cache of compiled graphs gets a folder of its own (``cache``): it does
    not key on the instruction set, and code compiled for another cell's could be reused.
    So do the C++ extensions: cells that run at once must not build one in one folder.
    """
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("COURSE_", "TRITON_", "ATEN_", "MKL_", "ONEDNN_", "OMP_", "TORCHINDUCTOR_"))
           and k != "PYTHONPATH"}
    return {**env, "MPLBACKEND": "Agg", "TORCHINDUCTOR_CACHE_DIR": str(cache),
            "TORCH_EXTENSIONS_DIR": str(cache.with_name(cache.name + "-extensions")), **extra}


def run_cell(name, scripts, folder, env, timeout=600, record=True, at_once=1):
    """Each script in its own process, ``at_once`` at a time, with its margin log."""
    with ThreadPoolExecutor(max_workers=at_once) as pool:
        finished = pool.map(lambda script: run_one(name, script, folder, env, timeout), scripts)
        runs = {script.stem: run for script, run in zip(scripts, finished)}
    if record:
        for run in runs.values():
            record_margins(name, run.margins, run.seconds)
    return runs


def run_one(cell, script, folder, env, timeout):
    log = folder / f"{script.stem}.margins.jsonl"
    start = time.perf_counter()
    try:
        done = subprocess.run([sys.executable, str(RUNNER), str(script), "--log", str(log)],
                              cwd=script.parent, env=env, capture_output=True, text=True,
                              timeout=timeout, check=False)
        code, output = done.returncode, done.stdout + done.stderr
    except subprocess.TimeoutExpired as stopped:
        code, output = -1, f"ran longer than {timeout} s\n{stopped.stdout or ''}{stopped.stderr or ''}"
    margins = check_margins.table(check_margins.read(log), cell=cell)
    return Run(code, round(time.perf_counter() - start, 1), output, margins)


class BusyCores:
    """A busy loop on every core while the block runs, under Linux's idle policy (SCHED_IDLE,
    below nice 19): no core is ever idle, and the loops take only the time the runs and the
    suite's other workers leave, even when those run at nice 10."""

    LOOP = ("import os\ntry:\n    os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))\n"
            "except (AttributeError, OSError):\n    os.nice(19)\nwhile True: pass")

    def __enter__(self):
        self.loops = [subprocess.Popen([sys.executable, "-c", self.LOOP])
                      for _ in range(os.cpu_count() or 1)]
        return self

    def __exit__(self, *exc):
        for loop in self.loops:
            loop.kill()
            loop.wait()


def downloads(site_root, edition="en"):
    """The ``.py`` of every example as the built site's ``edition`` offers it for download."""
    found = {p.name: p for p in (site_root / "_build" / "html" / edition / "_downloads").rglob("*.py")}
    missing = [e.name for e in EXAMPLES if e.name not in found]
    assert not missing, f"no download for {missing}"
    return [found[e.name] for e in EXAMPLES]


# AVX2 in PyTorch's, MKL's and oneDNN's kernels, as on a CPU without AVX-512; one thread.
LOADED = {"ATEN_CPU_CAPABILITY": "avx2", "MKL_ENABLE_INSTRUCTIONS": "AVX2", "ONEDNN_MAX_CPU_ISA": "AVX2",
          "OMP_NUM_THREADS": "1"}


@pytest.fixture(scope="session")
def reader_cell(site, tmp_path_factory):
    """The pinned versions, on a loaded machine: two one-thread runs at a time, beside the
    suite's other workers (``make test`` runs three) and a busy loop on every core."""
    folder = tmp_path_factory.mktemp("reader")
    scripts = downloaded_into_empty_folders(site, folder, "zh_CN")
    with BusyCores():
        return run_cell("reader (avx2, 1 thread, loaded)", scripts, folder,
                        reader_env(folder / "inductor", **LOADED), at_once=2)


def downloaded_into_empty_folders(site, folder, edition="en"):
    """Each download copied into a folder of its own, as a reader saves it."""
    checkout, _ = site
    scripts = []
    for download in downloads(checkout, edition):
        empty = folder / download.stem
        empty.mkdir(parents=True)
        scripts.append(empty / download.name)
        scripts[-1].write_bytes(download.read_bytes())
    return scripts


@pytest.fixture(scope="session")
def newest_cell(site, tmp_path_factory):
    """The newest triton and numpy from PyPI, put in front of the pinned ones."""
    overlay = tmp_path_factory.mktemp("newest")
    installed = subprocess.run(
        [sys.executable, "-m", "pip", "install", "--quiet", "--disable-pip-version-check", "--no-deps",
         "--upgrade", "--target", str(overlay / "site"), *NEWEST],
        capture_output=True, text=True, check=False)
    if installed.returncode != 0:
        pytest.skip(f"could not install the newest {' and '.join(NEWEST)} from PyPI:"
                    f" {installed.stderr.strip().splitlines()[-1:]}")
    versions = sorted(p.name.removesuffix(".dist-info") for p in (overlay / "site").glob("*.dist-info"))
    print("newest releases:", ", ".join(versions))
    scripts = [s for s in downloaded_into_empty_folders(site, overlay / "downloads")
               if s.stem in {e.stem for e in NEWEST_EXAMPLES}]
    return versions, run_cell("newest", scripts, overlay,
                              reader_env(overlay / "inductor", PYTHONPATH=str(overlay / "site"),
                                         OMP_NUM_THREADS="1"), at_once=2)


def _check(run, stem):
    assert run.returncode == 0, f"{stem} failed:\n{run.output[-4000:]}"
    over = [m for m in run.margins if m["use"] > check_margins.HEADROOM]
    assert not over, (f"{stem}: checks that use more than half of their tolerance:\n"
                      + check_margins.markdown(over))


def _every_run_checks_numbers(runs):
    """The log sees the checks: a cell with no margin rows would prove nothing."""
    checked = [stem for stem, run in runs.items() if run.margins]
    assert len(checked) >= len(runs) - 2, sorted(set(runs) - set(checked))


@pytest.mark.xdist_group("portability-reader")
@pytest.mark.parametrize("example", EXAMPLES, ids=lambda p: p.stem)
def test_a_reader_s_download_runs_with_headroom(reader_cell, example):
    _check(reader_cell[example.stem], example.stem)


@pytest.mark.xdist_group("portability-reader")
def test_the_reader_cell_checks_numbers(reader_cell):
    _every_run_checks_numbers(reader_cell)


@pytest.mark.xdist_group("portability-reader")
@pytest.mark.parametrize("example", EXAMPLES, ids=lambda p: p.stem)
def test_a_chinese_download_prints_chinese(reader_cell, example):
    """The Chinese edition's download is the Chinese program: run by itself, it prints Chinese."""
    run = reader_cell[example.stem]
    printed = [line for line in run.output.splitlines() if line.strip()]
    chinese = [line for line in printed if HAN.search(line)]  # tables' rows of numbers hold none
    assert len(chinese) >= 5 and sum(len(HAN.findall(line)) for line in chinese) >= 50, (example.stem, printed[:20])


@pytest.mark.xdist_group("portability-newest")
@pytest.mark.parametrize("example", NEWEST_EXAMPLES, ids=lambda p: p.stem)
def test_the_newest_releases_run_with_headroom(newest_cell, example):
    versions, runs = newest_cell
    assert any(v.startswith("triton-") for v in versions), versions
    _check(runs[example.stem], example.stem)


@pytest.mark.xdist_group("portability-newest")
def test_the_newest_cell_checks_numbers(newest_cell):
    _every_run_checks_numbers(newest_cell[1])


def test_the_log_reads_a_planted_precision_bug(tmp_path):
    """A float32 sum compared to float64 at float64's tolerance: the log shows it, and assert_close fails."""
    script = tmp_path / "planted.py"
    script.write_text("import torch\nx = torch.rand(10_000, dtype=torch.float64)\n"
                      "torch.testing.assert_close(x.float().sum().double(), x.sum(), rtol=1e-12, atol=0)\n")
    runs = run_cell("planted", [script], tmp_path, reader_env(tmp_path / "inductor"), record=False)
    assert runs["planted"].returncode != 0
    assert runs["planted"].margins and runs["planted"].margins[0]["use"] > 1
    assert Path(runs["planted"].margins[0]["file"]).name == "planted.py"
