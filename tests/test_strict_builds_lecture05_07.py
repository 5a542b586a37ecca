"""Lecture 5, example 07: its own compile failures fail it, and its occupancy formula is the one
the compile check uses.

The generic skip paths of 07 (no Triton, no C++ compiler, a build that requires them) are
scenarios of tests/test_strict_builds.py, found there like every other example's. This file adds
what only 07 does: it runs ``ptxas`` for sm_80 and sm_90a on a CPU. A ``ptxas`` that passes the
example's probe but rejects the example's own sm_90a code must fail the example, not turn into a
skip. And the occupancy that 07 prints must agree with ``tools/gpu_compile.py``, which computes it
independently for the compile check's report, and with the worked answer of the lecture's exercise.
"""

import ast
import os
import stat
import subprocess
import sys

import pytest

from tools import gpu_compile
from tools.site_build import REPO

EXAMPLE = REPO / "examples" / "lecture05_gpus" / "07_occupancy_and_on_chip.py"

# A ptxas that works (it is Triton's) except on PTX that contains wgmma: only sm_90a code has it.
PICKY_PTXAS = '''#!{python}
import os, sys
for arg in sys.argv[1:]:
    if arg.endswith(".ptx") and os.path.isfile(arg) and "wgmma" in open(arg).read():
        sys.exit(f"picky ptxas: refusing {{arg}}")
os.execv({ptxas!r}, [{ptxas!r}, *sys.argv[1:]])
'''


def test_a_ptxas_that_fails_on_the_example_s_own_code_fails_it(tmp_path):
    triton = pytest.importorskip("triton")
    real = triton.knobs.nvidia.ptxas.path
    picky = tmp_path / "picky-ptxas"
    picky.write_text(PICKY_PTXAS.format(python=sys.executable, ptxas=real))
    picky.chmod(picky.stat().st_mode | stat.S_IXUSR)
    env = {k: v for k, v in os.environ.items() if not k.startswith("COURSE_")}
    env.update(TRITON_INTERPRET="1", MPLBACKEND="Agg", CUDA_VISIBLE_DEVICES="",
               TRITON_PTXAS_PATH=str(picky))
    done = subprocess.run([sys.executable, str(EXAMPLE)], cwd=tmp_path, env=env, capture_output=True,
                          text=True, timeout=400, check=False)
    assert done.returncode != 0, done.stdout[-3000:]
    assert "picky ptxas: refusing" in done.stdout + done.stderr, done.stderr[-3000:]
    assert "Skipped the ahead-of-time compiles" not in done.stdout, "a compile failure became a skip"


def example_occupancy():
    """07's ``occupancy`` with the limits it defines, executed from its source alone."""
    tree = ast.parse(EXAMPLE.read_text(encoding="utf-8"))
    wanted = {"KIB", "SM_LIMITS", "REGISTER_UNIT", "round_up", "occupancy"}
    nodes = []
    for node in tree.body:
        names = ({node.name} if isinstance(node, ast.FunctionDef) else
                 {n.id for t in getattr(node, "targets", []) for n in ast.walk(t) if isinstance(n, ast.Name)})
        if names & wanted:
            nodes.append(node)
    namespace = {}
    exec(compile(ast.Module(nodes, type_ignores=[]), str(EXAMPLE), "exec"), namespace)  # noqa: S102
    return namespace["occupancy"]


@pytest.mark.parametrize("target", [80, 90])
def test_the_example_s_occupancy_is_the_compile_check_s(target):
    occupancy = example_occupancy()
    arch = gpu_compile.ARCHS[target]
    for num_warps in (1, 2, 4, 8, 16, 32):
        for registers in (*range(1, 256, 3), 255):
            for shared in (0, 1, 16 * 1024, 40 * 1024, 100 * 1024 + 7, arch.shared_per_block,
                           arch.shared_per_block + 1):
                ours = occupancy(target, num_warps, registers, shared)
                theirs = gpu_compile.occupancy(arch, num_warps, registers, shared)
                assert (ours["blocks"], ours["warps"]) == (theirs["blocks_per_sm"], theirs["warps_per_sm"]), (
                    target, num_warps, registers, shared, ours, theirs)


def test_the_exercise_s_worked_answer_is_what_the_formula_gives():
    """Lecture 5, exercise 'What limits this kernel?': 8 warps, 40 KiB, on compute capability 9.0."""
    occupancy = example_occupancy()
    answers = {96: (2, 16, "registers"), 64: (4, 32, "registers"), 32: (5, 40, "shared memory")}
    for registers, (blocks, warps, limit) in answers.items():
        result = occupancy(90, 8, registers, 40 * 1024)
        assert (result["blocks"], result["warps"], result["limited_by"]) == (blocks, warps, limit)
