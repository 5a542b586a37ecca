"""Lecture 7's examples fail when the parallel code they check is wrong.

Each planted fault is written into a scratch copy of an example, which then
runs as a reader would run it; it must exit with an error that names what went
wrong. The checks that need no ranks (the bucket check of example 02) are read
out of the example's source and given wrong data directly.
"""

import ast
import os
import subprocess
import sys
from pathlib import Path

import pytest

EXAMPLES = Path(__file__).resolve().parent.parent / "examples" / "lecture07_parallelism"
COLLECTIVES_EXAMPLE = EXAMPLES / "01_collectives.py"
DATA_PARALLEL_EXAMPLE = EXAMPLES / "02_data_parallel.py"


def run_with_fault(example, tmp_path, anchor, planted):
    """Run a copy of ``example`` in which ``anchor`` (found exactly once) is replaced by ``planted``."""
    source = example.read_text()
    assert source.count(anchor) == 1, f"{example.name} no longer contains {anchor!r}"
    scratch = tmp_path / example.name
    scratch.write_text(source.replace(anchor, planted))
    # No GPU (the CPU path is the one under test); a build's requirement, so nothing may skip.
    env = {**os.environ, "MPLBACKEND": "Agg", "CUDA_VISIBLE_DEVICES": "", "COURSE_REQUIRE": "distributed"}
    return subprocess.run([sys.executable, str(scratch)], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=180, check=False)


def definitions(example, *names):
    """The named top-level functions of an example, defined on their own."""
    tree = ast.parse(example.read_text())
    found = [node for node in tree.body if isinstance(node, ast.FunctionDef) and node.name in names]
    assert sorted(node.name for node in found) == sorted(names), f"{example.name} lacks one of {names}"
    namespace = {}
    exec(compile(ast.Module(found, type_ignores=[]), str(example), "exec"), namespace)  # noqa: S102 (our own example)
    return namespace


# Example 01: the hand-written ring must add in its reduce pass.


def test_a_ring_that_forgets_to_add_fails_example_01(tmp_path):
    done = run_with_fault(COLLECTIVES_EXAMPLE, tmp_path,
                          "            chunks[receive_index] += incoming",
                          "            chunks[receive_index] = incoming  # planted: no reduction")
    assert done.returncode != 0, done.stdout[-2000:]
    assert "All 5 collectives match" in done.stdout  # the library's collectives passed
    assert "AssertionError" in done.stderr
    assert "ring reduce-scatter, then ring all-gather = all-reduce" not in done.stdout


# Example 02: data parallel without its all-reduce, or without the division by the world size.


@pytest.mark.parametrize(("anchor", "planted"), [
    ("            dist.all_reduce(param.grad)  # the sum of the ranks' gradients ...",
     "            pass  # planted: a missing all-reduce"),
    ("            param.grad /= world_size  # ... and their mean: the whole batch's gradient",
     "            pass  # planted: the sum, not the mean"),
], ids=["missing all-reduce", "missing division by the world size"])
def test_a_wrong_data_parallel_step_fails_example_02(tmp_path, anchor, planted):
    done = run_with_fault(DATA_PARALLEL_EXAMPLE, tmp_path, anchor, planted)
    assert done.returncode != 0, done.stdout[-2000:]
    assert "data parallel = single process" not in done.stdout
    assert "AssertionError" in done.stderr
    assert "float64, rank 0" in done.stderr  # the first check, in float64, names the rank


def test_bucket_check_refuses_a_lost_or_doubled_parameter():
    check_buckets = definitions(DATA_PARALLEL_EXAMPLE, "check_buckets")["check_buckets"]
    names = ["0.weight", "0.bias", "2.weight", "2.bias"]
    right = [[(0, 10, ["2.bias", "2.weight"]), (1, 10, ["0.bias", "0.weight"])]]
    check_buckets(right, names)
    lost = [[(0, 10, ["2.bias", "2.weight"]), (1, 10, ["0.bias"])]]
    doubled = [[(0, 10, ["2.bias", "2.weight", "0.bias"]), (1, 10, ["0.bias", "0.weight"])]]
    for wrong in (lost, doubled):
        with pytest.raises(AssertionError):
            check_buckets(wrong, names)


# Examples 03 and 04 (sharding): tests such as a wrong shard offset go below.

ZERO_EXAMPLE = EXAMPLES / "03_zero_and_fsdp.py"
TENSOR_PARALLEL_EXAMPLE = EXAMPLES / "04_tensor_parallel.py"


@pytest.mark.parametrize(("anchor", "planted"), [
    ("        self.rows = shard_slice(full.out_features, rank, world_size)",
     "        self.rows = shard_slice(full.out_features, (rank + 1) % world_size, world_size)"),
    ("        self.columns = shard_slice(full.in_features, rank, world_size)",
     "        self.columns = shard_slice(full.in_features, (rank + 1) % world_size, world_size)"),
], ids=["column-parallel shard", "row-parallel shard"])
def test_a_wrong_shard_offset_fails_example_04(tmp_path, anchor, planted):
    done = run_with_fault(TENSOR_PARALLEL_EXAMPLE, tmp_path, anchor, planted)
    assert done.returncode != 0, done.stdout[-2000:]
    assert "match the whole block" not in done.stdout
    assert "AssertionError" in done.stderr
    assert "rank 0 output" in done.stderr  # the output is already wrong, before any gradient


def test_a_wrong_batch_shard_offset_fails_example_03(tmp_path):
    # Overlapping shards: row 12 trains twice, the last row never. (Swapped shards would pass.)
    done = run_with_fault(ZERO_EXAMPLE, tmp_path,
                          "    return tensor[rank * ROWS_PER_RANK:(rank + 1) * ROWS_PER_RANK]",
                          "    return tensor[rank * (ROWS_PER_RANK - 1):(rank + 1) * ROWS_PER_RANK - rank]")
    assert done.returncode != 0, done.stdout[-2000:]
    assert "prediction asserted" in done.stdout  # the byte counts do not see the batch
    assert "= one process" not in done.stdout
    assert "AssertionError" in done.stderr
    assert "rank 0 0.weight" in done.stderr


# Examples 05 and 06 (pipeline, layout): stages out of order, gradients not averaged, lost all-reduces.

PIPELINE_EXAMPLE = EXAMPLES / "05_pipeline_parallel.py"
LAYOUT_EXAMPLE = EXAMPLES / "06_choosing_a_layout.py"


@pytest.mark.parametrize(("anchor", "planted", "named"), [
    ("TimedStage(stage_slice(model, index, chunks * ranks)",
     "TimedStage(stage_slice(model, chunks * ranks - 1 - index, chunks * ranks)",  # planted: stages reversed
     "GPipe: pipeline loss"),
    ("loss_fn=nn.functional.mse_loss)",
     "loss_fn=nn.functional.mse_loss, scale_grads=False)  # planted: summed, not averaged",
     "GPipe gradient 0"),
], ids=["stages in the wrong order", "micro-batch gradients not averaged"])
def test_a_wrong_pipeline_fails_example_05(tmp_path, anchor, planted, named):
    done = run_with_fault(PIPELINE_EXAMPLE, tmp_path, anchor, planted)
    assert done.returncode != 0, done.stdout[-2000:]
    assert "worst gradient difference" not in done.stdout
    assert "AssertionError" in done.stderr
    assert named in done.stderr


@pytest.mark.parametrize(("anchor", "planted", "named"), [
    ("        timed_all_reduce(p.grad, log, aligned)",
     "        log.append(0.0)  # planted: a missing all-reduce",
     "DP gradient, rank 0"),
    ("        timed_all_reduce(grad, ctx.log, ctx.aligned)",
     "        ctx.log.append(0.0)  # planted: the input gradient is not summed",
     "TP input gradient, rank 0"),
], ids=["data parallel without its all-reduce", "tensor parallel without its backward all-reduce"])
def test_a_missing_all_reduce_fails_example_06(tmp_path, anchor, planted, named):
    done = run_with_fault(LAYOUT_EXAMPLE, tmp_path, anchor, planted)
    assert done.returncode != 0, done.stdout[-2000:]
    assert "match one process" not in done.stdout
    assert "AssertionError" in done.stderr
    assert named in done.stderr


# Example 07: a rank that takes the data-parallel share of its tensor-parallel peer.

MESH_EXAMPLE = EXAMPLES / "07_composing_meshes.py"


def test_ranks_on_the_wrong_mesh_axis_fail_example_07(tmp_path):
    done = run_with_fault(MESH_EXAMPLE, tmp_path, "    dp, tp = divmod(rank, 2)\n    rows = slice(dp",
                          "    tp, dp = divmod(rank, 2)  # planted: the mesh's axes swapped\n    rows = slice(dp")
    assert done.returncode != 0, done.stdout[-2000:]
    assert "AssertionError: TP loss" in done.stderr, done.stderr[-2000:]
    assert "match one process" not in done.stdout
