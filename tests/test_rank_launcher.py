"""Lecture 7's rank launcher: one copy in every example, and it never hangs.

Each example carries the same ``run_ranks`` (a download is one file, so it
cannot import a shared one). The copies must stay identical, so that a fix
reaches every example that forks ranks. The launcher itself is run here with
ranks that raise, die and hang: each must fail the call quickly, with what went
wrong, and leave no process behind.
"""

import ast
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ALL_EXAMPLES = sorted((Path(__file__).resolve().parent.parent / "examples" / "lecture07_parallelism").glob("[0-9]*.py"))
# One process, which uses CUDA itself on a GPU: it runs last, since a forking example that
# finds CUDA initialised in the gallery's process falls back from NCCL to gloo.
SINGLE_PROCESS = ["10_activation_checkpointing.py"]
EXAMPLES = [e for e in ALL_EXAMPLES if e.name not in SINGLE_PROCESS]


def function_source(example, name):
    source = example.read_text()
    for node in ast.parse(source).body:
        if isinstance(node, ast.FunctionDef) and node.name == name:
            return ast.get_source_segment(source, node)
    raise AssertionError(f"{example.name} has no function {name}")


def test_the_single_process_examples_run_after_every_forking_one():
    names = [e.name for e in ALL_EXAMPLES]
    assert set(SINGLE_PROCESS) <= set(names), names
    for example in ALL_EXAMPLES:
        forks = "run_ranks(" in example.read_text()
        assert forks == (example.name not in SINGLE_PROCESS), f"{example.name}: forks = {forks}"
    assert names[-len(SINGLE_PROCESS):] == SINGLE_PROCESS, names


def test_every_example_carries_the_same_launcher():
    assert len(EXAMPLES) == 9, [e.name for e in EXAMPLES]
    first = function_source(EXAMPLES[0], "run_ranks")
    for example in EXAMPLES[1:]:
        assert function_source(example, "run_ranks") == first, f"{example.name}'s run_ranks differs from {EXAMPLES[0].name}'s"


# A reader's run of the launcher, copied out of example 02 (gloo ranks only).
LAUNCHER = "\n\n".join(function_source(EXAMPLES[1], name) for name in ("run_ranks", "_rank_main"))
PRELUDE = "import datetime, os, signal, sys, tempfile, time, traceback\nimport torch\nimport torch.distributed as dist\nimport torch.multiprocessing as mp\n"


def run_launcher(worker_body, timeout_s):
    body = worker_body.splitlines() + ["tensor = torch.ones(3)", "dist.all_reduce(tensor)", "return tensor"]
    worker = "def worker(rank, world_size):\n" + "".join(f"    {line}\n" for line in body)
    script = PRELUDE + LAUNCHER + "\n\n" + worker + textwrap.dedent(f"""
        started = time.monotonic()
        try:
            print("result", run_ranks(worker, 2, timeout_s={timeout_s}))
        except Exception as error:
            print("raised", type(error).__name__, error)
        print(f"seconds {{time.monotonic() - started:.2f}}")
        print("children left", len(mp.active_children()))
        """)
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": ""}
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=timeout_s + 60, env=env, check=False)
    assert done.returncode == 0, done.stdout + done.stderr
    lines = dict(line.split(" ", 1) for line in done.stdout.splitlines() if " " in line)
    return lines, done.stdout + done.stderr


def test_healthy_ranks_return_their_results():
    lines, _ = run_launcher("pass", timeout_s=30)
    assert lines["result"] == "[tensor([2., 2., 2.]), tensor([2., 2., 2.])]"
    assert lines["children"] == "left 0"


@pytest.mark.parametrize("body, error, shown", [
    # Rank 0's all-reduce fails too when rank 1 is gone: the error shown must be rank 1's.
    ("if rank == 1:\n    raise ValueError('rank 1 planted failure')", "RuntimeError rank 1 of 2 failed first",
     "ValueError: rank 1 planted failure"),
    ("if rank == 1:\n    os.kill(os.getpid(), signal.SIGKILL)", "ProcessExitedException", "SIGKILL"),
    ("if rank == 1:\n    time.sleep(3600)", "TimeoutError", "still running after 8 s"),
], ids=["raises", "dies", "hangs"])
def test_a_failing_rank_fails_the_call_in_time_and_leaves_nothing(body, error, shown):
    lines, output = run_launcher(body, timeout_s=8)
    assert lines["raised"].startswith(error), output
    assert shown in output, output
    assert float(lines["seconds"]) < 8 + 10, output  # within the timeout, plus the kill
    assert lines["children"] == "left 0", output


@pytest.mark.parametrize("example", EXAMPLES[1:], ids=lambda e: e.stem)
def test_every_launch_names_the_backend_that_the_machine_chose(example):
    """On 2+ GPUs every example runs NCCL ranks: no call may fall back to the gloo default by omission."""
    source = example.read_text()
    assert 'BACKEND = "cpu:gloo,cuda:nccl" if USE_NCCL else "gloo"' in source
    calls = [node for node in ast.walk(ast.parse(source))
             if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "run_ranks"]
    assert calls, f"{example.name} starts no ranks"
    for call in calls:
        backend = {k.arg: k.value for k in call.keywords}.get("backend")
        assert isinstance(backend, ast.Name) and backend.id == "BACKEND", \
            f"{example.name}:{call.lineno}: run_ranks(...) without backend=BACKEND"
