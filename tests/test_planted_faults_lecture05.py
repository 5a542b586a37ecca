"""Planted faults: lecture 5's checks reject the bugs they exist to catch.

Each fault is one exact text replacement in a copy of an example. The copies
run on the CPU as a reader would run them (Triton in its interpreter), all at
once, and each must fail with the message of the check that should catch its
bug. A copy that fails elsewhere, or passes, fails its test.
"""

import os
import subprocess
import sys
from pathlib import Path

import pytest

EXAMPLES = Path(__file__).resolve().parents[1] / "examples" / "lecture05_gpus"
FLASH = "06_flash_attention.py"
CHAIN = "04_overhead_and_intensity.py"
ON_CHIP = "07_occupancy_and_on_chip.py"

# name: (example, [(text, replacement), ...])
FAULTS = {
    # accumulators that follow the input dtype: float16 on float16 inputs, as a GPU runs them
    "float16 running sum": (FLASH, [
        ("running_sum = tl.zeros([BLOCK_M], tl.float32)", "running_sum = tl.zeros([BLOCK_M], q.dtype)"),
        ("running_sum = running_sum * rescale + tl.sum(p, axis=1)",
         "running_sum = (running_sum * rescale + tl.sum(p, axis=1)).to(q.dtype)"),
    ]),
    "float16 output accumulator": (FLASH, [
        ("acc = tl.zeros([BLOCK_M, HEAD_DIM], tl.float32)", "acc = tl.zeros([BLOCK_M, HEAD_DIM], q.dtype)"),
        ("acc = acc * rescale[:, None] + tl.dot(p.to(v.dtype), v)",
         "acc = (acc * rescale[:, None] + tl.dot(p.to(v.dtype), v)).to(q.dtype)"),
    ]),
    "kernel without running maximum": (FLASH, [
        ("new_max = tl.maximum(running_max, tl.max(scores, axis=1))",
         "new_max = tl.maximum(running_max, 0.0)"),
    ]),
    "tiled attention without running maximum": (FLASH, [
        ("new_max = torch.maximum(running_max, scores.amax(dim=-1))",
         "new_max = torch.zeros_like(running_max)"),
    ]),
    "graph break in the fused chain": (CHAIN, [
        ("    out.copy_(repeated_fma(x, repeats))\n",
         ("    result = repeated_fma(x, repeats)\n    torch._dynamo.graph_break()\n"
          "    out.copy_(result)\n")),
    ]),
    # the register file counted per SM, not per sub-partition: four times the resident warps
    "register file not split in sub-partitions": (ON_CHIP, [
        ("warps_per_partition = sm[\"registers\"] // SUB_PARTITIONS // registers_per_warp",
         "warps_per_partition = sm[\"registers\"] // registers_per_warp"),
    ]),
    # the K loop stops one tile early: the tail of an irregular K is never multiplied
    "matmul drops the last K tile": (ON_CHIP, [
        ("        for k in range(0, K, BLOCK_K):\n            a = tl.load(",
         "        for k in range(0, K - BLOCK_K, BLOCK_K):\n            a = tl.load("),
    ]),
}


@pytest.fixture(scope="module")
def failures(tmp_path_factory):
    """name -> (return code, stdout, stderr) of every faulty copy, run side by side."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("COURSE_")}
    env.update(TRITON_INTERPRET="1", MPLBACKEND="Agg", CUDA_VISIBLE_DEVICES="")
    running = {}
    for name, (example, replacements) in FAULTS.items():
        source = (EXAMPLES / example).read_text()
        for old, new in replacements:
            assert source.count(old) == 1, f"cannot plant {name!r}: {old!r} is not in {example} once"
            source = source.replace(old, new)
        folder = tmp_path_factory.mktemp("fault")
        (folder / example).write_text(source)
        running[name] = subprocess.Popen([sys.executable, example], cwd=folder, env=env, text=True,
                                         stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    return {name: (process.returncode, *process.communicate(timeout=600))
            for name, process in running.items()}


def last_line(failures, name):
    returncode, stdout, stderr = failures[name]
    assert returncode != 0, f"{name}: the faulty copy passed\n{stdout[-3000:]}"
    return stderr.strip().splitlines()[-1]


@pytest.mark.parametrize("name", ["float16 running sum", "float16 output accumulator"])
def test_flash_attention_rejects_a_float16_accumulator(failures, name):
    failure = last_line(failures, name)
    # float32 inputs keep a float32 accumulator and pass; the float16 check must catch it
    assert failure.startswith("AssertionError: Triton attention"), failures[name][2][-3000:]
    assert "float16" in failure and "limit" in failure, failure


def test_flash_attention_kernel_rejects_a_missing_running_maximum(failures):
    failure = last_line(failures, "kernel without running maximum")
    assert failure.startswith("AssertionError: Triton attention"), failure
    assert "score shift 1000" in failure, failure


def test_tiled_attention_rejects_a_missing_running_maximum(failures):
    last_line(failures, "tiled attention without running maximum")
    stderr = failures["tiled attention without running maximum"][2]
    assert "AssertionError: score shift 1000" in stderr, stderr[-3000:]


def test_fused_chain_rejects_a_second_kernel(failures):
    failure = last_line(failures, "graph break in the fused chain")
    assert failure.startswith("AssertionError: the compiled chain r=1 ran 2 kernels, not one"), failure


def test_occupancy_rejects_a_register_file_not_split_in_sub_partitions(failures):
    failure = last_line(failures, "register file not split in sub-partitions")
    # the softmax at 46 registers would get 16 blocks of 4 warps: 64 warps x 1536 registers
    assert failure.startswith("AssertionError: softmax_kernel on sm_"), failure
    assert "blocks overfill the SM" in failure, failure


def test_the_matmul_check_rejects_a_dropped_k_tile(failures):
    last_line(failures, "matmul drops the last K tile")
    stderr = failures["matmul drops the last K tile"][2]
    assert "AssertionError: Tensor-likes are not close!" in stderr, stderr[-3000:]
    assert "triton_matmul(a, b, descriptors)" in stderr, stderr[-3000:]
