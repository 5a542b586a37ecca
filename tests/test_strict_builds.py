"""Lenient runs, strict builds: every skip path of the examples, forced on a CPU.

A reader's run of an example skips the part whose tool is missing or broken and
says so in one line. The site's builds list in COURSE_REQUIRE what their machine
must have, and there the same skip fails the example. A tool that passes the
example's probe but fails on the example's own code fails it everywhere: that is
the "no silent skip on a GPU" rule, checked here with a C++ compiler that works
except on the example's source.

The branches are forced with real conditions, not hooks: ``CXX=/bin/false``, a
``triton`` package that cannot be imported, and that picky compiler. The runs are
independent processes, so they run two at a time, one thread each. A compiler that
is not on PATH at all takes another branch of the same probe, which is called by
itself for every example that compiles.
"""

import ast
import os
import re
import shutil
import stat
import subprocess
import sys
import tempfile
import textwrap
import types
from concurrent.futures import ThreadPoolExecutor

import pytest
from conftest import record_margins

from tools.site_build import EXAMPLES, REPO

sys.path.insert(0, str(REPO / "sphinxext"))
import check_margins

RUNNER = REPO / "tools" / "run_as_reader.py"


def source(example):
    return example.read_text(encoding="utf-8")


def compiles_cxx(example):
    """load_inline, or torch.compile with Inductor (the default backend): C++ on a CPU."""
    text = source(example)
    return "load_inline(" in text or re.search(r"torch\.compile\((?![^)\n]*backend=)", text)


def writes_triton(example):
    return re.search(r"^\s*import triton\.language", source(example), re.MULTILINE) is not None


CXX_EXAMPLES = [e for e in EXAMPLES if compiles_cxx(e)]
TRITON_EXAMPLES = [e for e in EXAMPLES if writes_triton(e)]
CAPABILITIES = {"cxx", "nvcc", "triton", "inductor", "flex-cpu", "distributed", "sm80"}


def example(name):
    return next(e for e in EXAMPLES if e.name == name)


# A compiler that works (it is g++) except on a source that contains $FAIL_ON.
PICKY_COMPILER = '''#!{python}
import os, sys
for arg in sys.argv[1:]:
    if arg.endswith((".cpp", ".cc", ".cu")) and os.path.isfile(arg):
        with open(arg, errors="replace") as file:
            if os.environ["FAIL_ON"] in file.read():
                sys.exit(f"picky compiler: refusing {{arg}}")
os.execv({gxx!r}, [{gxx!r}, *sys.argv[1:]])
'''

# As on a machine where Triton does not install (macOS): ``import triton`` fails.
HIDDEN_TRITON = 'raise ImportError("Triton is hidden by the test")\n'


@pytest.fixture(scope="module")
def tools(tmp_path_factory):
    folder = tmp_path_factory.mktemp("tools")
    picky = folder / "picky-c++"
    gxx = shutil.which("g++")
    if gxx is None:
        pytest.skip("no g++ on this machine to build the picky compiler on")
    picky.write_text(PICKY_COMPILER.format(python=sys.executable, gxx=gxx))
    picky.chmod(picky.stat().st_mode | stat.S_IXUSR)
    (folder / "no-triton" / "triton").mkdir(parents=True)
    (folder / "no-triton" / "triton" / "__init__.py").write_text(HIDDEN_TRITON)
    return {"picky": str(picky), "no-triton": str(folder / "no-triton")}


def scenarios():
    """(id, example, environment changes): None removes a variable."""
    cases = []
    for path in CXX_EXAMPLES:
        cases += [
            (f"cxx-false-{path.stem}", path, {"CXX": "/bin/false"}),
            (f"require-cxx-{path.stem}", path, {"CXX": "/bin/false", "COURSE_REQUIRE": "cxx"}),
        ]
    for path in TRITON_EXAMPLES:
        cases += [
            (f"no-triton-{path.stem}", path, {"PYTHONPATH": "{no-triton}"}),
            (f"require-triton-{path.stem}", path,
             {"PYTHONPATH": "{no-triton}", "COURSE_REQUIRE": "cxx,triton,inductor"}),
        ]
    # The probe's one-line file compiles; the example's own source does not.
    cases += [
        ("picky-03_cuda_kernels", example("03_cuda_kernels.py"),
         {"CXX": "{picky}", "FAIL_ON": "gelu_thread"}),
        ("picky-03_fusion", example("03_fusion.py"), {"CXX": "{picky}", "FAIL_ON": "sin("}),
        # The relu of the step around the opaque operator; the probe's 2 * t + 1 has none.
        ("picky-08_kernels_in_the_compiler", example("08_kernels_in_the_compiler.py"),
         {"CXX": "{picky}", "FAIL_ON": "clamp_min"}),
    ]
    return cases


SCENARIOS = {name: (path, changes) for name, path, changes in scenarios()}


def run(path, changes, tools, scratch):
    """As a reader runs it (no TRITON_INTERPRET: the example sets it), with its margin log."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("COURSE_", "TRITON_"))}
    # No earlier build is reused; one thread, as two runs share the cores with the other workers.
    env.update(MPLBACKEND="Agg", TORCH_EXTENSIONS_DIR=str(scratch / "extensions"), OMP_NUM_THREADS="1")
    for name, value in changes.items():
        if value is None:
            env.pop(name, None)
        else:
            env[name] = value.format(**tools)
    scratch.mkdir(parents=True)
    copy = scratch / path.name  # run_as_reader works in the script's folder: a copy's, not the repository's
    copy.write_bytes(path.read_bytes())
    done = subprocess.run([sys.executable, str(RUNNER), str(copy), "--log", str(scratch / "margins.jsonl")],
                          cwd=scratch, env=env, capture_output=True, text=True, timeout=400, check=False)
    done.margins = check_margins.table(check_margins.read(scratch / "margins.jsonl"))
    return done


@pytest.fixture(scope="module")
def runs(tools, tmp_path_factory):
    """Every scenario's finished process, two at a time (each is mostly one core)."""
    root = tmp_path_factory.mktemp("runs")
    with ThreadPoolExecutor(max_workers=2) as pool:
        futures = {name: pool.submit(run, path, changes, tools, root / name)
                   for name, (path, changes) in SCENARIOS.items()}
        return {name: future.result() for name, future in futures.items()}


def skipped_lines(done):
    return [line for line in done.stdout.splitlines() if line.startswith("Skipped ")]


def test_the_examples_that_compile_and_use_triton_are_found():
    names = {path.name for path in CXX_EXAMPLES}
    assert {"03_cuda_kernels.py", "03_fusion.py", "06_torch_compile.py"} <= names
    assert {"06_flash_attention.py", "05_triton_softmax_matmul.py"} <= {
        path.name for path in TRITON_EXAMPLES}


LENIENT = [name for name in SCENARIOS if name.startswith(("cxx-false", "no-triton"))]
STRICT = [name for name in SCENARIOS if name.startswith("require-")]
PICKY = [name for name in SCENARIOS if name.startswith("picky-")]


@pytest.mark.parametrize("name", LENIENT)
def test_a_reader_s_run_skips_what_is_missing_and_says_so(runs, name):
    done = runs[name]
    assert done.returncode == 0, done.stderr[-3000:]
    cell = "no Triton" if name.startswith("no-triton") else "no C++ compiler"
    record_margins(cell, done.margins)
    over = [m for m in done.margins if m["use"] > check_margins.HEADROOM]
    assert not over, "checks that use more than half of their tolerance:\n" + check_margins.markdown(over)
    capability = "triton" if name.startswith("no-triton") else "cxx"
    lines = skipped_lines(done)
    assert any(f": {capability} is missing (" in line for line in lines), done.stdout[-3000:]
    # Each line names its section: no two are the same (06 once printed five identical ones).
    assert len(lines) == len(set(lines)), lines


@pytest.mark.parametrize("name", STRICT)
def test_a_build_that_requires_the_missing_capability_fails_and_names_it(runs, name):
    done = runs[name]
    capability = "triton" if name.startswith("require-triton") else "cxx"
    assert done.returncode != 0, done.stdout[-3000:]
    last_line = done.stderr.strip().splitlines()[-1]
    assert last_line.startswith("RuntimeError: "), done.stderr[-3000:]
    assert f"this build requires {capability}, but " in last_line


@pytest.mark.parametrize("name", PICKY)
def test_a_working_compiler_that_fails_on_the_example_fails_it(runs, name):
    done = runs[name]
    assert done.returncode != 0, done.stdout[-3000:]
    assert "picky compiler: refusing" in done.stdout + done.stderr
    assert not skipped_lines(done), "a failure of the example's own build was turned into a skip"


# Static checks: the skip helper is used with known capabilities, and no example catches
# the failure of its own build with a broad handler.

BROAD = {"Exception", "BaseException", "RuntimeError", "OSError", "CalledProcessError",
         "CppCompileError", "InductorError", "BackendCompilerFailed", "CompilationError"}
BUILDS = re.compile(r"compile|load_inline|build|run_and_get_code|^check_|^inspect_|^triton_")


def _names(node):
    """The exception class names a handler catches ([] for a bare ``except:``)."""
    if node is None:
        return ["BaseException"]
    if isinstance(node, ast.Tuple):
        return [name for element in node.elts for name in _names(element)]
    if isinstance(node, ast.Attribute):
        return [node.attr]
    return [node.id] if isinstance(node, ast.Name) else []


def _called(node):
    for call in ast.walk(node):
        if isinstance(call, ast.Call):
            func = call.func
            if isinstance(func, ast.Subscript):  # kernel[grid](...): a Triton launch
                yield "triton_launch"
            elif isinstance(func, ast.Attribute):
                yield func.attr
            elif isinstance(func, ast.Name):
                yield func.id


def _raises(statements):
    return any(isinstance(node, ast.Raise) for s in statements for node in ast.walk(s))


def hidden_build_failures(text):
    """Handlers that turn a failure of the example's own build into something else.

    Allowed: inside a probe (a function named ``*_problem``); a handler that re-raises
    (the known-bug excuse); a ``try`` whose ``else`` raises (a failure that must happen);
    ``except ImportError`` around imports only (that is the probe for Triton).
    """
    tree = ast.parse(text)
    parents = {child: node for node in ast.walk(tree) for child in ast.iter_child_nodes(node)}

    def in_probe(node):
        while node in parents:
            node = parents[node]
            if isinstance(node, ast.FunctionDef) and node.name.endswith("_problem"):
                return True
        return False

    found = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Try) or in_probe(node) or _raises(node.orelse):
            continue
        builds = any(BUILDS.search(name) for s in node.body for name in _called(s))
        only_imports = all(isinstance(s, (ast.Import, ast.ImportFrom))
                           or isinstance(s, ast.Assign) and isinstance(s.value, ast.Constant)
                           for s in node.body)
        for handler in node.handlers:
            caught = set(_names(handler.type))
            if _raises(handler.body):
                continue
            if caught & BROAD and builds or "ImportError" in caught and not only_imports:
                found.append(f"line {handler.lineno}: except {', '.join(sorted(caught))}")
    return found


HIDING = {
    "03_cuda_kernels before the fix": """
        try:
            gelu_extension = build_gelu_extension()
        except (RuntimeError, OSError) as error:
            skip_reason = f"build failed: {error}"
    """,
    "04_overhead before the fix": """
        for repeats in CHAIN_LENGTHS:
            try:
                compiled, seconds = compile_chain(x, out, repeats)
            except Exception as error:  # noqa: BLE001
                break
    """,
    "03_fusion before the fix": """
        def compile_chain(fn, args):
            compiled = torch.compile(fn)
            try:
                compiled(*args)
            except (RuntimeError, OSError, ImportError):
                return None
    """,
    "a launch that is caught": """
        try:
            add_kernel[grid](x, y, out, n, BLOCK_SIZE=1024)
        except Exception:
            print("skipped")
    """,
}
ALLOWED = {
    "a probe": """
        def inductor_problem():
            try:
                torch.compile(lambda t: 2 * t)(x)
            except Exception as error:
                return "inductor", str(error)
    """,
    "the known-bug excuse": """
        try:
            check_matmul(m, n, k)
        except Exception as error:
            if not interpreter_cannot_loop(error):
                raise
    """,
    "an expected failure": """
        try:
            torch.compile(f, fullgraph=True)(x)
        except RuntimeError as error:
            print(error)
        else:
            raise AssertionError("accepted")
    """,
    "the Triton import": """
        try:
            import triton
        except ImportError as error:
            TRITON_IMPORT_ERROR = error
    """,
}


@pytest.mark.parametrize("snippet", HIDING, ids=str)
def test_the_scan_finds_a_caught_build_failure(snippet):
    assert hidden_build_failures(textwrap.dedent(HIDING[snippet]))


@pytest.mark.parametrize("snippet", ALLOWED, ids=str)
def test_the_scan_allows_probes_and_expected_failures(snippet):
    assert not hidden_build_failures(textwrap.dedent(ALLOWED[snippet]))


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.stem)
def test_no_example_catches_the_failure_of_its_own_build(path):
    assert not hidden_build_failures(source(path)), hidden_build_failures(source(path))


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.stem)
def test_skips_name_a_known_capability(path):
    tree = ast.parse(source(path))
    for call in ast.walk(tree):
        if (isinstance(call, ast.Call) and getattr(call.func, "id", None) == "skip_or_fail"
                and len(call.args) >= 2 and isinstance(call.args[1], ast.Constant)):
            assert call.args[1].value in CAPABILITIES, ast.unparse(call)


def extract(path, *names, **namespace):
    """The named module-level functions of an example, defined in ``namespace``."""
    tree = ast.parse(source(path))
    wanted = [node for node in tree.body if isinstance(node, ast.FunctionDef) and node.name in names]
    assert {node.name for node in wanted} == set(names)
    exec(compile(ast.Module(wanted, type_ignores=[]), str(path), "exec"), namespace)  # noqa: S102
    return [namespace[name] for name in names]


NVCC_EXAMPLES = [e for e in EXAMPLES if "def nvcc_problem" in source(e)]


@pytest.mark.parametrize("path", NVCC_EXAMPLES, ids=lambda p: p.stem)
def test_the_nvcc_probe_finds_a_missing_or_broken_toolkit(path, tmp_path):
    """nvcc is probed only on a GPU, so its probe is called here by itself."""
    fake = tmp_path / "toolkit"
    (fake / "bin").mkdir(parents=True)
    (fake / "bin" / "nvcc").write_text("#!/bin/sh\nexit 1\n")
    (fake / "bin" / "nvcc").chmod(0o755)
    cpp_extension = types.SimpleNamespace(CUDA_HOME=None)
    _, nvcc_problem = extract(path, "compile_problem", "nvcc_problem", os=os, shutil=shutil,
                              subprocess=subprocess, tempfile=tempfile, cpp_extension=cpp_extension)
    assert "no CUDA toolkit" in nvcc_problem()
    cpp_extension.CUDA_HOME = str(tmp_path / "nowhere")
    assert "does not exist" in nvcc_problem()
    cpp_extension.CUDA_HOME = str(fake)
    assert "fails on a one-line .cu file (exit 1)" in nvcc_problem()


NO_COMPILER = "no-such-c++"


@pytest.mark.parametrize("path", CXX_EXAMPLES, ids=lambda p: p.stem)
def test_the_cxx_probe_names_a_compiler_that_is_not_on_path(path, monkeypatch):
    """The probe's branch for a machine with no compiler at all, called by itself; the
    runs above take the other branch (CXX=/bin/false is there but fails) to the skips."""
    from torch.utils import cpp_extension

    text = source(path)
    names = [n for n in ("compile_problem", "cxx_problem", "nvcc_problem", "missing_toolchain")
             if f"\ndef {n}(" in text]
    monkeypatch.setenv("CXX", NO_COMPILER)  # what cpp_extension.get_cxx_compiler() returns
    probes = dict(zip(names, extract(path, *names, os=os, shutil=shutil, subprocess=subprocess,
                                     tempfile=tempfile, cpp_extension=cpp_extension, DEVICE="cpu")))
    if "cxx_problem" in probes:
        reason = probes["cxx_problem"](NO_COMPILER)
    else:
        capability, reason = probes["missing_toolchain"]()
        assert capability == "cxx"
    assert reason == f"no C++ compiler {NO_COMPILER!r} is on PATH"


INTERPRETER_EXCUSES = [e for e in EXAMPLES if "def interpreter_cannot_loop" in source(e)]


@pytest.mark.parametrize("path", INTERPRETER_EXCUSES, ids=lambda p: p.stem)
def test_the_interpreter_bug_is_excused_only_on_a_cpu_under_the_interpreter(path, monkeypatch):
    bug = ValueError("setting an array element with a sequence: 0-dimensional arrays ...")
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    for device, excused in (("cuda", False), ("cpu", True)):
        (excuse,) = extract(path, "interpreter_cannot_loop", os=os, DEVICE=device)
        assert excuse(bug) is excused, device
    assert not excuse(ValueError("another error"))
    monkeypatch.delenv("TRITON_INTERPRET")
    assert not excuse(bug)


def test_the_build_requires_the_cpu_capabilities_unless_told_otherwise(tmp_path):
    """sphinxext/example_runner.py sets COURSE_REQUIRE before each example."""
    script = textwrap.dedent(f"""
        import os, signal, sys
        from pathlib import Path
        sys.path.insert(0, {str(REPO / "sphinxext")!r})
        import example_runner
        src, gallery = Path({str(tmp_path / "01_x.py")!r}), Path({str(tmp_path)!r})
        example_runner._prepare(src, gallery)
        print(os.environ["COURSE_REQUIRE"])
        os.environ["COURSE_REQUIRE"] = ""
        example_runner._prepare(src, gallery)
        signal.alarm(0)
        print(repr(os.environ["COURSE_REQUIRE"]))
    """)
    env = {k: v for k, v in os.environ.items() if not k.startswith("COURSE_")}
    done = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True,
                          text=True, check=True, timeout=120)
    import torch

    expected = "cxx,nvcc,triton,inductor" if torch.cuda.is_available() else "cxx,triton,inductor"
    expected += ",distributed"
    assert done.stdout.split() == [expected, "''"]
