"""The one-call GPU build, rehearsed on a CPU: wheels, tools/gpu_build.sh, make gpu-import, make html.

The GPU machine has torch, triton, numpy and matplotlib, no Sphinx and no
network. The rehearsal gives gpu_build.sh a Python like that one: this
interpreter without its site-packages (``-S``), seeing only those four packages
and what they depend on, so the build succeeds only if the wheel folder brings
every other tool. Two shards, one lecture each, stand in for the publishing
workflow's jobs; each executes one fast example.
"""

import importlib.metadata
import json
import os
import re
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest
import yaml
from bs4 import BeautifulSoup
from conftest import SITE_ENV
from packaging.requirements import Requirement

from tools.site_build import EXAMPLES, REPO, copy_checkout, make

sys.path.insert(0, str(REPO / "tools"))
import gpu_check

SHARDS = {"lecture05_gpus": "01_roofline", "lecture06_kernels_triton": "01_benchmarking"}
THIS_PYTHON = f"{sys.version_info.major}.{sys.version_info.minor}"
# What the GPU machine has, by the course's account of it; pip as well, to install the wheels.
ON_THE_GPU_MACHINE = ["torch", "triton", "numpy", "matplotlib", "pip", "setuptools"]


def make_wheels(**variables):
    """``make gpu-wheels`` in this checkout; skips only when PyPI cannot be reached."""
    args = [f"{k}={v}" for k, v in {"VENV": sys.prefix, **variables}.items()]
    done = subprocess.run(["make", "-C", str(REPO), "gpu-wheels", *args],
                          capture_output=True, text=True, check=False)
    if done.returncode != 0:
        probe = subprocess.run(
            [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
             "-d", str(REPO / ".cache" / "pypi-probe"), "sphinx-copybutton==0.5.2"],
            capture_output=True, text=True, check=False, timeout=120)
        if probe.returncode != 0:
            pytest.skip(f"PyPI is unreachable, so make gpu-wheels cannot run:\n{probe.stderr[-500:]}")
        pytest.fail(f"make gpu-wheels failed:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}")
    return done.stdout


def wheel_names(folder):
    return {re.sub(r"[-_.]+", "-", w.name.split("-")[0]).lower() for w in folder.glob("*.whl")}


def dependency_closure(roots):
    found, todo = {}, list(roots)
    while todo:
        name = re.sub(r"[-_.]+", "-", todo.pop()).lower()
        if name in found:
            continue
        try:
            dist = importlib.metadata.distribution(name)
        except importlib.metadata.PackageNotFoundError:
            continue
        found[name] = dist
        for line in dist.requires or []:
            requirement = Requirement(line)
            if requirement.marker is None or requirement.marker.evaluate({"extra": ""}):
                todo.append(requirement.name)
    return found.values()


def gpu_machine_python(folder):
    """A Python that sees only what the GPU machine has: this one with -S and a few linked packages."""
    packages = folder / "site-packages"
    packages.mkdir(parents=True)
    for dist in dependency_closure(ON_THE_GPU_MACHINE):
        tops = {Path(f).parts[0] for f in dist.files if not str(f).startswith("..")} - {"__pycache__"}
        for top in tops:
            source = Path(dist.locate_file(top))
            if source.exists() and not (packages / top).exists():
                (packages / top).symlink_to(source)
    wrapper = folder / "python3"
    wrapper.write_text(f'#!/bin/sh\nPYTHONPATH="${{PYTHONPATH:+$PYTHONPATH:}}{packages}" '
                       f'exec {sys.executable} -S "$@"\n')
    wrapper.chmod(0o755)
    return wrapper


@pytest.fixture(scope="module")
def rehearsal_wheels():
    """The wheels for this interpreter's Python version, the same packages as the GPU machine's."""
    folder = REPO / ".cache" / f"gpu-wheels-py{THIS_PYTHON}"
    make_wheels(GPU_PYTHON_VERSION=THIS_PYTHON, GPU_WHEELS=folder)
    return folder


@pytest.fixture(scope="module")
def rehearsal(tmp_path_factory, rehearsal_wheels):
    """Two shards of the GPU build, imported into a fresh checkout, then make html there."""
    tmp = tmp_path_factory.mktemp("gpu-build")
    checkout = copy_checkout(tmp / "site")
    python = gpu_machine_python(tmp / "gpu-machine")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("COURSE_", "TRITON_", "PYTHON"))}
    outs = {}
    for lecture, example in SHARDS.items():
        outs[lecture] = tmp / f"out-{lecture}"
        done = subprocess.run(
            [str(checkout / "tools" / "gpu_build.sh"), str(outs[lecture])],
            env={**env, "PYTHON": str(python), "WHEELS": str(rehearsal_wheels), "LECTURES": lecture,
                 "EXAMPLES": example, "COURSE_GIT_COMMIT": "rehearsal"},
            capture_output=True, text=True, check=False,
        )
        if done.returncode != 0:
            pytest.fail(f"gpu_build.sh failed for {lecture}:\n{done.stdout[-5000:]}{done.stderr[-2000:]}")
    imported = make(checkout, "gpu-import", OUT=" ".join(map(str, outs.values())))
    if imported.returncode != 0:
        pytest.fail(f"make gpu-import failed:\n{imported.log[-3000:]}")
    built = make(checkout, "html", env=SITE_ENV, EXAMPLES="|".join(SHARDS.values()))
    if built.returncode != 0:
        pytest.fail(f"make html after the import failed:\n{built.log[-5000:]}")
    return checkout, outs, imported, built


def test_gpu_build_says_which_python_its_wheels_are_for(tmp_path):
    """Wheels for another Python would stop pip at 'No matching distribution': it says so first."""
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    (wheels / "requirements.txt").write_text("sphinx\n")
    (wheels / "python-version").write_text("3.99\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("COURSE_", "TRITON_"))}
    done = subprocess.run([str(REPO / "tools" / "gpu_build.sh"), str(tmp_path / "out")],
                          env={**env, "PYTHON": sys.executable, "WHEELS": str(wheels)},
                          capture_output=True, text=True, check=False)
    assert done.returncode != 0
    assert "are for Python 3.99" in done.stdout, done.stdout[-2000:]
    assert f"make gpu-wheels GPU_PYTHON_VERSION={THIS_PYTHON}" in done.stdout


def test_wheels_for_the_gpu_machine_fit_in_40_mib():
    folder = REPO / ".cache" / "gpu-wheels"
    log = make_wheels(GPU_WHEELS=folder)
    mib = sum(w.stat().st_size for w in folder.glob("*.whl")) / 2**20
    print(f"{mib:.1f} MiB of wheels for Python 3.12", log)
    assert 0 < mib <= 40
    names = wheel_names(folder)
    assert {"sphinx", "sphinx-gallery", "pydata-sphinx-theme", "myst-parser"} <= names
    assert not names & {"torch", "triton", "numpy", "matplotlib", "jieba", "sphinx-intl"}
    assert all("cp312" in w.name or "py3-none" in w.name or "py2.py3-none" in w.name
               for w in folder.glob("*.whl")), "a wheel is not for CPython 3.12"


def test_the_gpu_machine_python_has_no_sphinx(tmp_path):
    python = gpu_machine_python(tmp_path)
    has = subprocess.run([str(python), "-c", "import torch, triton, numpy, matplotlib"], check=False)
    lacks = subprocess.run([str(python), "-c", "import sphinx"], capture_output=True, check=False)
    assert has.returncode == 0 and lacks.returncode != 0


def test_each_shard_executes_its_example_once_and_reports_it(rehearsal):
    _, outs, _, _ = rehearsal
    for lecture, example in SHARDS.items():
        out = outs[lecture]
        log = (out / "build.log").read_text()
        assert log.count("successfully executed 1 out of 1 file") == 2  # once in each edition
        report = json.loads((out / "report.json").read_text())
        result = report["examples"][f"{lecture}/{example}.py"]
        assert list(report["examples"]) == [f"{lecture}/{example}.py"]
        assert result["passed"] and result["seconds"] > 0
        assert result["key_figures"]["device"], "the build's run kept no KEY_FIGURES"
        with tarfile.open(out / "gallery-cache.tar.gz") as archive:
            entries = {m.name for m in archive.getmembers() if m.name.endswith("/CACHE.json")}
        assert entries == {f"gallery-cache/{lecture}/{example}/CACHE.json",
                           f"gallery-cache/zh_CN/{lecture}/{example}/CACHE.json"}


def test_import_merges_the_shards_and_their_reports(rehearsal):
    checkout, _, imported, _ = rehearsal
    assert len(re.findall(r"^imported ", imported.log, flags=re.MULTILINE)) == 2 * len(SHARDS)  # two editions
    merged = json.loads((checkout / "_build" / "gpu-report" / "report.json").read_text())
    assert merged["shards"] == len(SHARDS) and merged["passed"] == len(SHARDS)
    status = subprocess.run([sys.executable, "tools/gallery_cache.py", "status", "--tree", "_build/tree-zh_CN"],
                            cwd=checkout, capture_output=True, text=True, check=True).stdout
    assert status.count(f"{len(SHARDS)} of {len(EXAMPLES)} examples have a current entry") == 2, status


@pytest.mark.parametrize("edition", ["en", "zh_CN"])
def test_html_shows_the_gpu_builds_outputs_and_provenance(rehearsal, edition):
    checkout, outs, _, built = rehearsal
    assert built.examples_executed == 0
    for lecture, example in SHARDS.items():
        entry = f"{lecture}/{example}" if edition == "en" else f"{edition}/{lecture}/{example}"
        with tarfile.open(outs[lecture] / "gallery-cache.tar.gz") as archive:
            member = archive.extractfile(f"gallery-cache/{entry}/provenance/{example}.json")
            record = json.loads(member.read())
        page = checkout / "_build" / "html" / edition / "auto_examples" / lecture / f"{example}.html"
        html = BeautifulSoup(page.read_text(encoding="utf-8"), "html.parser")
        assert any(o.get_text(strip=True) for o in html.select("div.sphx-glr-script-out"))
        note = html.select_one("div.provenance").get_text(" ", strip=True)
        assert record["device"] in note and record["executed_at"] in note and "rehearsal" in note


def test_targets_are_judged_only_on_a_gpu():
    results = {"lecture06_kernels_triton/05_triton_softmax_matmul.py": {"key_figures": {
        "matmul_triton_fraction_of_torch_4096x4096x4096": 0.93,
        "softmax_triton_N4096_fraction_of_copy_bw": 0.85,
        "copy_GBps": 4100.0}}}
    rows = {r["figure"]: r for r in gpu_check.against_targets(results, on_gpu=True)}
    assert rows["matmul_triton_fraction_of_torch_4096x4096x4096"]["met"] is True
    assert rows["softmax_triton_N4096_fraction_of_copy_bw"]["met"] is False
    assert "copy_GBps" not in rows
    on_cpu = gpu_check.against_targets(results, on_gpu=False)
    assert {r["met"] for r in on_cpu} == {None}


def test_publishing_runs_one_gpu_job_per_lecture():
    workflow = yaml.safe_load((REPO / ".github" / "workflows" / "gpu-publish.yml").read_text())
    lectures = sorted(p.name for p in (REPO / "examples").glob("lecture*") if p.is_dir())
    assert workflow["jobs"]["lecture"]["strategy"]["matrix"]["lecture"] == lectures


def test_an_unknown_lecture_stops_the_build_before_it_starts(tmp_path):
    done = subprocess.run([str(REPO / "tools" / "gpu_build.sh"), str(tmp_path / "out")],
                          env={**os.environ, "PYTHON": sys.executable, "LECTURES": "lecture99"},
                          capture_output=True, text=True, check=False)
    assert done.returncode != 0
    assert "unknown lecture(s) lecture99" in (tmp_path / "out" / "build.log").read_text()
