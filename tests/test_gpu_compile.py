"""The ahead-of-time compile check: every GPU code path of the examples compiles
for five GPU generations, and the check fails when a kernel would fail on a GPU.

One run of ``tools/gpu_compile.py`` over the real examples is shared by most
tests; the fault tests run it on a temporary copy of the examples folder with
one kernel broken, on one target. Its results cache lives in the session's
temporary folder, so each session runs the check from empty caches, as a new
machine would (docs/gpu-compile-check.md gives the times).
"""

import ast
import json
import os
import re
import shutil
import subprocess
import sys

import pytest

from tools.gpu_compile import (
    ARCHS,
    NVCC_ARCHS,
    GpuView,
    constants,
    nvcc_path,
    occupancy,
)
from tools.site_build import REPO

EXAMPLES = REPO / "examples"


@pytest.fixture(scope="session")
def results_cache(tmp_path_factory):
    """The figures of compiles that succeeded, keyed by a hash of everything they depend on: inside
    this session's temporary folder, so that every session times a cold check, and the fault tests
    after it compile only what they broke."""
    return tmp_path_factory.mktemp("gpu-compile-cache")


def run_check(out, cache, *options, say=None):
    """Run the check; ``say`` gets each progress line as it comes."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("COURSE_", "TRITON_"))}
    command = [sys.executable, str(REPO / "tools" / "gpu_compile.py"), "--out", str(out),
               "--jobs", "2", "--cache", str(cache), *options]
    out.mkdir(parents=True, exist_ok=True)
    lines = []
    with open(out / "stderr.txt", "w+") as stderr:
        with subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=stderr, text=True) as process:
            for line in process.stdout:
                lines.append(line)
                if say and re.match(r"\[ *\d+:\d\d\]", line):  # a progress line
                    say(line.rstrip())
        stderr.seek(0)
        done = subprocess.CompletedProcess(command, process.returncode, "".join(lines), stderr.read())
    report_file = out / "report.json"
    report = json.loads(report_file.read_text()) if report_file.exists() else None
    return done, report


PROGRESS = re.compile(r"\[ *(\d+):(\d\d)\] (\d+)/(\d+) compiles")


def on_the_terminal(config):
    """Print a line past pytest's capture, so that a long check does not look hung."""
    capture = config.pluginmanager.getplugin("capturemanager")
    terminal = config.pluginmanager.getplugin("terminalreporter")
    if capture is None or terminal is None:
        return None

    def say(line):
        with capture.global_and_fixture_disabled():
            terminal.write_line(f"gpu-compile {line}")
    return say


@pytest.fixture(scope="module")
def full_check(tmp_path_factory, results_cache, pytestconfig):
    """The check's run, and the @triton.jit functions in the examples as it started."""
    in_source = jit_functions_in_source()
    done, report = run_check(tmp_path_factory.mktemp("gpu-compile"), results_cache,
                             say=on_the_terminal(pytestconfig))
    print(done.stdout[-3000:], done.stderr[-3000:])
    assert report is not None, done.stderr[-3000:]
    report["jit_functions_in_source"] = in_source
    return done, report


def jit_functions_in_source():
    """{example: names of @triton.jit functions}, found by reading the text, not the AST."""
    found = {}
    for path in sorted(EXAMPLES.glob("lecture*/[0-9][0-9]_*.py")):
        names = re.findall(r"@triton\.jit\s*\n\s*def (\w+)", path.read_text())
        if names:
            found[str(path.relative_to(EXAMPLES))] = set(names)
    return found


def test_the_check_passes(full_check):
    done, report = full_check
    assert report["failures"] == [], "\n".join(f["error"] for f in report["failures"])
    assert done.returncode == 0
    summary = re.search(r"compiled (\d+) specialisations × 5 targets = (\d+), (\d+) pruned, 0 failed",
                        done.stdout)
    assert summary, done.stdout[-2000:]
    assert int(summary.group(1)) * 5 == int(summary.group(2)) == len(report["compiles"])
    # progress while it ran, ending with every compile done; each distinct one compiled once
    progress = [PROGRESS.match(line) for line in done.stdout.splitlines()]
    progress = [m for m in progress if m]
    assert progress and progress[-1].group(3) == progress[-1].group(4), done.stdout[-2000:]
    assert int(progress[-1].group(4)) == len({(c["target"], c["key"]) for c in report["compiles"]})
    assert len({(c["example"], c["target"], c["key"]) for c in report["compiles"]}) == len(report["compiles"])


def test_the_scan_finds_every_kernel_and_each_is_compiled_everywhere(full_check):
    _, report = full_check
    assert {example: {k["name"] for k in kernels} for example, kernels in report["kernels"].items()
            if kernels} == report["jit_functions_in_source"]
    for example, kernels in report["kernels"].items():
        for kernel in kernels:
            for cc in ARCHS:
                names = {c["kernel"] for c in report["compiles"]
                         if c["example"] == example and c["target"] == cc and c["status"] == "ok"}
                assert kernel["name"] in names or names & set(kernel["called_by"]), (example, kernel, cc)


def autotune_config_counts():
    """{(example, kernel): number of configurations its triton.autotune call lists}, from the source."""
    counts = {}
    for path in EXAMPLES.glob("lecture*/[0-9][0-9]_*.py"):
        tree = ast.parse(path.read_text())
        lists = {n.targets[0].id: n.value for n in ast.walk(tree)
                 if isinstance(n, ast.Assign) and isinstance(n.targets[0], ast.Name)}
        for node in ast.walk(tree):
            if (isinstance(node, ast.Call) and isinstance(node.func, ast.Call)
                    and ast.unparse(node.func.func) == "triton.autotune"):
                configs = next(k.value for k in node.func.keywords if k.arg == "configs")
                configs = lists.get(configs.id, configs) if isinstance(configs, ast.Name) else configs
                counts[(str(path.relative_to(EXAMPLES)), node.args[0].id)] = len(configs.elts)
    return counts


def test_every_autotune_configuration_is_compiled_for_every_target(full_check):
    _, report = full_check
    counts = autotune_config_counts()
    assert counts, "no autotuned kernel found in the examples"
    for (example, kernel), count in counts.items():
        for cc in ARCHS:
            configs = {re.sub(r" ACTIVATION=\S*| \w+==1| \*\S+| div16:\S+", "", c["specialisation"])
                       for c in report["compiles"]
                       if (c["example"], c["kernel"], c["target"]) == (example, kernel, cc)}
            assert len(configs) == count, (example, kernel, cc, sorted(configs))


def test_the_gpu_branch_dtypes_and_the_launcher_specialisations(full_check):
    _, report = full_check

    def specialisations(example, kernel, cc):
        found = [c["specialisation"] for c in report["compiles"]
                 if (c["example"], c["kernel"], c["target"]) == (example, kernel, cc)]
        assert found, (example, kernel, cc)
        return found

    matmul = "lecture06_kernels_triton/05_triton_softmax_matmul.py", "matmul_kernel"
    attention = "lecture05_gpus/06_flash_attention.py", "flash_attention_kernel"
    for cc in ARCHS:  # 16-bit matmuls: bfloat16 from compute capability 8.0 on, float16 before
        assert all(("*bf16" if cc >= 80 else "*fp16") in s for s in specialisations(*matmul, cc))
        assert all("*fp16" in s for s in specialisations(*attention, cc))
    # lengths 1, odd ones, and 2**26 among the launches
    adds = specialisations("lecture06_kernels_triton/04_triton_basics.py", "add_kernel", 90)
    assert any("n_elements==1" in s for s in adds)
    assert any("div16:n_elements" in s for s in adds)
    assert any("n_elements" not in s for s in adds)


def test_resources_are_within_each_targets_limits(full_check):
    _, report = full_check
    for c in report["compiles"]:
        arch = ARCHS[c["target"]]
        if c["status"] == "ok":
            assert c["shared"] <= arch.shared_per_block, c
            assert 0 < c["registers"] <= arch.registers_per_thread, c
            assert 0 < c["occupancy"]["occupancy"] <= 1, c
        else:
            assert c["status"] == "pruned" and c["autotuned"] and c["reason"], c


def test_the_report_has_a_row_per_kernel_and_target(full_check):
    _, report = full_check
    rows = report["kernel_table"]
    assert len(rows) == len({(c["example"], c["kernel"]) for c in report["compiles"]}) * len(ARCHS)
    assert all(r["registers"] and r["occupancy"] for r in rows)
    assert "cuda-programming-guide" in " ".join(report["limit_sources"])


def test_the_load_inline_cuda_sources_compile_with_nvcc(full_check):
    _, report = full_check
    sources = report["cuda_sources"]
    assert sources, "no load_inline call with CUDA sources found"
    for source in sources:
        if nvcc_path() is None:
            assert source["status"] == "skipped" and "nvcc" in source["reason"]
            continue
        assert source["status"] == "ok", source.get("reason")
        assert {k["arch"] for k in source["kernels"]} == {f"sm_{cc}" for cc in NVCC_ARCHS}
        assert all(k["registers"] > 0 for k in source["kernels"])


# %% The check can fail


def broken_copy(tmp_path, example, anchor, old, new):
    """A copy of the examples folder with the first ``old`` after ``anchor`` in ``example`` replaced."""
    copy = tmp_path / "examples"
    shutil.copytree(EXAMPLES, copy)
    path = copy / example
    text = path.read_text()
    start = text.index(anchor)
    assert old in text[start:], f"{old!r} is no longer in {example}: update this test"
    path.write_text(text[:start] + text[start:].replace(old, new, 1))
    return copy


def test_a_non_power_of_two_arange_fails_the_check(tmp_path, results_cache):
    example = "lecture06_kernels_triton/04_triton_basics.py"
    copy = broken_copy(tmp_path, example, "def gelu_kernel", "tl.arange(0, BLOCK_SIZE)",
                       "tl.arange(0, BLOCK_SIZE - 24)")
    done, report = run_check(tmp_path / "out", results_cache, "--root", str(copy), "--examples", "04_triton_basics",
                             "--kernels", "gelu_kernel", "--targets", "90", "--no-nvcc")
    assert done.returncode == 1
    failures = [f for f in report["failures"] if f["kernel"] == "gelu_kernel"]
    assert failures and all(f["example"] == example and f["target"] == 90 for f in failures)
    assert all("power of 2" in f["error"] for f in failures)
    assert "FAILED: gelu_kernel in lecture06_kernels_triton/04_triton_basics.py on sm_90" in done.stdout


def test_a_dot_on_an_8_wide_tile_fails_the_check(tmp_path, results_cache):
    # Triton 3.6 accepts M and N of 1 and more in tl.dot; K, the reduction, must be 16 or more.
    example = "lecture06_kernels_triton/05_triton_softmax_matmul.py"
    anchor = "MATMUL_AUTOTUNE_CONFIGS = ["
    copy = broken_copy(tmp_path, example, anchor, anchor, anchor + "matmul_config(64, 64, 8, 4, 4), ")
    done, report = run_check(tmp_path / "out", results_cache, "--root", str(copy), "--examples", "05_triton",
                             "--kernels", "matmul_kernel", "--targets", "90", "--no-nvcc")
    assert done.returncode == 1
    failed = [c for c in report["compiles"] if c["status"] == "failed"]
    assert failed and all("BLOCK_K=8 " in c["specialisation"] for c in failed)
    assert all("K >= 16" in c["reason"] for c in failed)
    assert any(c["status"] == "ok" for c in report["compiles"])  # the other configurations still pass
    assert all(f["kernel"] == "matmul_kernel" and f["example"] == example and f["target"] == 90
               for f in report["failures"])


def test_an_autotuned_kernel_with_no_configuration_that_fits_fails_the_check(tmp_path, results_cache):
    # 128 x 256 x 64 tiles in four stages need more shared memory than an sm_89 block may have.
    example = "lecture06_kernels_triton/05_triton_softmax_matmul.py"
    text = (EXAMPLES / example).read_text()
    start = text.index("MATMUL_AUTOTUNE_CONFIGS = [")
    configs = text[start:text.index("]", start) + 1]
    copy = broken_copy(tmp_path, example, configs, configs,
                       "MATMUL_AUTOTUNE_CONFIGS = [matmul_config(128, 256, 64, 4, 8)]")
    done, report = run_check(tmp_path / "out", results_cache, "--root", str(copy), "--examples", "05_triton",
                             "--kernels", "matmul_kernel", "--targets", "89,90", "--no-nvcc")
    assert done.returncode == 1
    # Shapes that are multiples of 16 are software-pipelined, in stages of shared memory; the
    # others are not, and fit. So the launches on aligned shapes fail on sm_89, and only they.
    pruned = [c for c in report["compiles"] if c["status"] == "pruned"]
    assert pruned and all(c["target"] == 89 and "div16:" in c["specialisation"] for c in pruned)
    assert all("shared memory" in c["reason"] for c in pruned)
    assert {c["status"] for c in report["compiles"] if c["target"] == 90} == {"ok"}
    assert report["failures"] and all(f["target"] == 89 and "no autotune configuration fits sm_89"
                                      in f["error"] for f in report["failures"])


# %% Pieces of the check, without compiling


def test_occupancy_follows_the_per_sm_limits():
    hopper, ada = ARCHS[90], ARCHS[89]
    assert occupancy(hopper, 4, 32, 0) == {"blocks_per_sm": 16, "warps_per_sm": 64, "occupancy": 1.0,
                                           "limited_by": "warps"}
    # 255 registers round up to 8192 a warp: two warps fit each of four sub-partitions
    assert occupancy(hopper, 8, 255, 0)["warps_per_sm"] == 8
    # 40 KiB plus the 1 KiB the system keeps: two blocks in 100 KiB
    assert occupancy(ada, 4, 32, 40 * 1024)["blocks_per_sm"] == 2
    assert occupancy(ada, 4, 32, 100 * 1024)["blocks_per_sm"] == 0


def test_the_gpu_view_leaves_out_what_would_act(tmp_path):
    example = tmp_path / "01_example.py"
    marker = tmp_path / "written"
    example.write_text(
        "import math\n"
        "import shutil\n"
        "DEVICE = 'cuda'\n"
        f"open({str(marker)!r}, 'w').write('x')\n"
        f"WRITTEN = open({str(marker)!r}, 'w').write('x')\n"
        f"COPIED = shutil.copy({__file__!r}, {str(marker)!r})\n"
        "SIZES = [1, 2] if DEVICE == 'cuda' else [1]\n"
        "if DEVICE == 'cuda':\n"
        "    SIZES.append(math.isqrt(9))\n")
    view = GpuView(example)
    assert not marker.exists()
    assert view.namespace["SIZES"] == [1, 2, 3]
    assert "WRITTEN" not in view.namespace and "COPIED" not in view.namespace


def test_constants_follow_dict_unpacking():
    tree = ast.parse("BASE = {'BLOCK': 64}\nWIDE = {**BASE, 'BLOCK': 128, 'WARPS': 8}")
    assert constants(tree.body, {})["WIDE"] == {"BLOCK": 128, "WARPS": 8}
