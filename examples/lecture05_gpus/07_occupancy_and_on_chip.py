"""
Occupancy and the on-chip machinery
===================================

A tiled kernel is fast when the SM has enough work in flight to hide memory
latency and when its on-chip traffic runs without stalls. We compile the
course's Triton kernels for the A100 (``sm_80``) and the H100 (``sm_90a``), read
their registers and shared memory, compute how many warps an SM can keep
resident, count shared-memory bank conflicts, and find in the compiled code
the swizzled layouts, tensor-core instructions and TMA loads that Triton
generates for us.

**Requirements.** The compiled figures need only Triton: its wheel carries
``ptxas`` and ``nvdisasm``, so a CPU compiles for GPUs it does not have
(labelled "compiled for H100 (sm_90a) on this machine, not executed"). On a CPU the kernels are checked in
Triton's interpreter, and the latency-hiding plot is a model. The
measurements (bandwidth against occupancy, a shared-memory transpose with and
without padding, Nsight Compute) need a CUDA GPU, and the CUDA kernels need
``nvcc``. On a T4 (compute capability 7.5, as on free Colab notebooks) it runs
as on any CUDA GPU, but an SM there holds 32 warps instead of 64 and a block
gets at most 64 KiB of shared memory, so the measured occupancies are lower;
the compiled figures are still those of sm_80 and sm_90a.
"""

# %%
# Setup
# -----
# On a CPU, ``TRITON_INTERPRET=1`` must be set before Triton is imported. The
# interpreter replaces Triton's language functions when Triton is imported,
# so the ahead-of-time compiles below run in a child process without it.

import csv
import inspect
import itertools
import json
import math
import os
import platform
import re
import shutil
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

import torch

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
if DEVICE == "cpu":
    os.environ.setdefault("TRITON_INTERPRET", "1")  # before any module imports Triton

import matplotlib.pyplot as plt
from torch.utils import cpp_extension

try:
    import triton
    import triton.language as tl

    TRITON_IMPORT_ERROR = None
except ImportError as error:
    TRITON_IMPORT_ERROR = error
HAVE_TRITON = TRITON_IMPORT_ERROR is None

torch.manual_seed(0)


def cpu_model_name():
    """The CPU's marketing name from /proc/cpuinfo (Linux), else from platform."""
    try:
        with open("/proc/cpuinfo") as cpuinfo:
            for line in cpuinfo:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


if DEVICE == "cuda":
    DEVICE_NAME = torch.cuda.get_device_name()
    KERNEL_DTYPE = torch.float16
    SOFTMAX_SHAPES = [(1823, 781), (4096, 8192)]
    ATTENTION_SHAPES = [(2, 3, 193, 193, 64), (1, 4, 77, 1000, 128)]
    MATMUL_SHAPES = [(257, 193, 320), (2048, 2048, 2048)]
    TMA_SHAPES = [(255, 392, 520), (2048, 2048, 2048)]  # TMA needs 16-byte aligned strides
else:
    DEVICE_NAME = f"{cpu_model_name()} CPU, {torch.get_num_threads()} threads"
    KERNEL_DTYPE = torch.float32
    SOFTMAX_SHAPES = [(37, 781)]
    ATTENTION_SHAPES = [(1, 2, 77, 93, 32)]
    MATMUL_SHAPES = [(67, 45, 70)]
    TMA_SHAPES = [(67, 44, 72)]  # strides of 44 and 72 floats are 16-byte aligned


def skip_or_fail(section, capability, reason):
    """Readers' runs skip a part whose tool is missing; the site's builds require it."""
    if capability in os.environ.get("COURSE_REQUIRE", "").split(","):
        raise RuntimeError(f"{section}: this build requires {capability}, but {reason}")
    print(f"Skipped {section}: {capability} is missing ({reason}).")


def triton_tool(name):
    """A binary that ships in Triton's NVIDIA backend (ptxas, nvdisasm, cuobjdump), or None."""
    if not HAVE_TRITON:
        return None
    path = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / name
    return path if path.is_file() and os.access(path, os.X_OK) else None


def ptxas_problem():
    """Why Triton cannot compile for a GPU here, or None."""
    if not HAVE_TRITON:
        return f"import triton failed: {TRITON_IMPORT_ERROR}"
    try:  # the ptxas Triton itself would run: TRITON_PTXAS_PATH, else its wheel's
        ptxas = triton.knobs.nvidia.ptxas
    except (AttributeError, RuntimeError) as error:
        return f"Triton finds no ptxas that runs ({error})"
    return None if ptxas.version else f"{ptxas.path} reports no version"


PTXAS_PROBLEM = ptxas_problem()
print(f"{DEVICE_NAME}: " + ("kernels compiled and timed on this GPU; " if DEVICE == "cuda" else
                            "kernels checked in Triton's interpreter; ")
      + ("sm_80 and sm_90a compiled ahead of time, not executed." if PTXAS_PROBLEM is None
         else "no ahead-of-time compile."))

# %%
# Three kernels of the course
# ---------------------------
# A row softmax (lecture 6), the FlashAttention forward of
# :ref:`sphx_glr_auto_examples_lecture05_gpus_06_flash_attention.py`
# (without its causal branch), and a
# tiled matrix multiplication, once with pointer arithmetic and once with
# tensor descriptors (``tl.make_tensor_descriptor``), which Triton lowers to
# TMA on Hopper. Each is checked against PyTorch on irregular shapes.

if HAVE_TRITON:

    @triton.jit
    def softmax_kernel(x_ptr, out_ptr, n_cols, stride_row, BLOCK: tl.constexpr):
        row = tl.program_id(0).to(tl.int64)
        cols = tl.arange(0, BLOCK)
        x = tl.load(x_ptr + row * stride_row + cols, mask=cols < n_cols, other=float("-inf"))
        x = x.to(tl.float32)
        p = tl.exp(x - tl.max(x, axis=0))
        out = p / tl.sum(p, axis=0)
        tl.store(out_ptr + row * stride_row + cols, out.to(out_ptr.dtype.element_ty), mask=cols < n_cols)

    @triton.jit
    def flash_attention_kernel(q_ptr, k_ptr, v_ptr, out_ptr, stride_head, stride_row_q, stride_row_k,
                               n_queries, n_keys, qk_scale_log2,
                               HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
        query_block = tl.program_id(0)
        head = tl.program_id(1).to(tl.int64)
        rows = query_block * BLOCK_M + tl.arange(0, BLOCK_M)
        cols = tl.arange(0, HEAD_DIM)
        q = tl.load(q_ptr + head * stride_head * n_queries + rows[:, None] * stride_row_q + cols[None, :],
                    mask=rows[:, None] < n_queries, other=0.0)
        running_max = tl.full([BLOCK_M], float("-inf"), tl.float32)
        running_sum = tl.zeros([BLOCK_M], tl.float32)
        acc = tl.zeros([BLOCK_M, HEAD_DIM], tl.float32)
        for start in range(0, n_keys, BLOCK_N):
            keys = start + tl.arange(0, BLOCK_N)
            kv_offsets = head * stride_head * n_keys + keys[:, None] * stride_row_k + cols[None, :]
            k = tl.load(k_ptr + kv_offsets, mask=keys[:, None] < n_keys, other=0.0)
            scores = tl.dot(q, tl.trans(k)) * qk_scale_log2
            scores = tl.where(keys[None, :] < n_keys, scores, float("-inf"))
            new_max = tl.maximum(running_max, tl.max(scores, axis=1))
            rescale = tl.exp2(running_max - new_max)
            p = tl.exp2(scores - new_max[:, None])
            running_sum = running_sum * rescale + tl.sum(p, axis=1)
            v = tl.load(v_ptr + kv_offsets, mask=keys[:, None] < n_keys, other=0.0)
            acc = acc * rescale[:, None] + tl.dot(p.to(v.dtype), v)
            running_max = new_max
        out = acc / running_sum[:, None]
        tl.store(out_ptr + head * stride_head * n_queries + rows[:, None] * stride_row_q + cols[None, :],
                 out.to(out_ptr.dtype.element_ty), mask=rows[:, None] < n_queries)

    @triton.jit
    def matmul_kernel(a_ptr, b_ptr, c_ptr, M, N, K,
                      BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
        rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
        cols = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
        inner = tl.arange(0, BLOCK_K)
        acc = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
        for k in range(0, K, BLOCK_K):
            a = tl.load(a_ptr + rows[:, None] * K + (k + inner)[None, :],
                        mask=(rows[:, None] < M) & ((k + inner)[None, :] < K), other=0.0)
            b = tl.load(b_ptr + (k + inner)[:, None] * N + cols[None, :],
                        mask=((k + inner)[:, None] < K) & (cols[None, :] < N), other=0.0)
            acc = tl.dot(a, b, acc)
        tl.store(c_ptr + rows[:, None] * N + cols[None, :], acc.to(c_ptr.dtype.element_ty),
                 mask=(rows[:, None] < M) & (cols[None, :] < N))

    @triton.jit
    def matmul_tma_kernel(a_ptr, b_ptr, c_ptr, M, N, K,
                          BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
        # The descriptors know the shapes: out-of-range parts of a tile read as 0, are not stored
        a_desc = tl.make_tensor_descriptor(a_ptr, [M, K], [K, 1], [BLOCK_M, BLOCK_K])
        b_desc = tl.make_tensor_descriptor(b_ptr, [K, N], [N, 1], [BLOCK_K, BLOCK_N])
        c_desc = tl.make_tensor_descriptor(c_ptr, [M, N], [N, 1], [BLOCK_M, BLOCK_N])
        row, col = tl.program_id(0) * BLOCK_M, tl.program_id(1) * BLOCK_N
        acc = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
        for k in range(0, K, BLOCK_K):
            acc = tl.dot(a_desc.load([row, k]), b_desc.load([k, col]), acc)
        c_desc.store([row, col], acc.to(c_ptr.dtype.element_ty))

    def gpu_capability():
        return torch.cuda.get_device_capability() if DEVICE == "cuda" else (0, 0)

    def triton_softmax(x):
        out = torch.empty_like(x)
        block = triton.next_power_of_2(x.shape[1])
        num_warps = 4 if block <= 2048 else 8 if block <= 8192 else 16
        softmax_kernel[(x.shape[0],)](x, out, x.shape[1], x.stride(0), BLOCK=block, num_warps=num_warps)
        return out

    def triton_attention(q, k, v):
        """Non-causal FlashAttention forward for (batch, heads, N, d) tensors."""
        batch, heads, n_queries, head_dim = q.shape
        q, k, v = (t.contiguous() for t in (q, k, v))
        out = torch.empty_like(q)
        block_m, block_n = (128, 64) if DEVICE == "cuda" else (16, 32)
        if DEVICE == "cuda" and gpu_capability() < (8, 0) and head_dim > 64:
            block_m = 64  # a block may have at most 64 KiB of shared memory on 7.5, the T4 (Table 31)
        grid = (triton.cdiv(n_queries, block_m), batch * heads)
        flash_attention_kernel[grid](q, k, v, out, head_dim, head_dim, head_dim, n_queries, k.shape[2],
                                     head_dim ** -0.5 * math.log2(math.e), HEAD_DIM=head_dim,
                                     BLOCK_M=block_m, BLOCK_N=block_n,
                                     num_warps=4 if head_dim <= 64 else 8)
        return out

    def triton_matmul(a, b, descriptors=False):
        (M, K), N = a.shape, b.shape[1]
        c = torch.empty(M, N, dtype=a.dtype, device=a.device)
        block_m, block_n, block_k = (128, 128, 64) if DEVICE == "cuda" else (32, 32, 32)
        grid = (triton.cdiv(M, block_m), triton.cdiv(N, block_n))
        if descriptors:
            if DEVICE == "cuda" and gpu_capability() < (9, 0):
                block_m, block_n = 64, 64  # fewer registers where TMA is emulated
                grid = (triton.cdiv(M, block_m), triton.cdiv(N, block_n))
            # Descriptors built inside a kernel live in a scratch buffer that Triton asks for
            triton.set_allocator(lambda size, align, stream: torch.empty(size, dtype=torch.int8,
                                                                         device=DEVICE))
            matmul_tma_kernel[grid](a, b, c, M, N, K, BLOCK_M=block_m, BLOCK_N=block_n,
                                    BLOCK_K=block_k, num_warps=4, num_stages=3)
        else:
            matmul_kernel[grid](a, b, c, M, N, K, BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_K=block_k,
                                num_warps=4, num_stages=3)
        return c


def reference_tolerance(dtype):
    # float16: kernel and reference each round to float16, at most one ulp (2^-10 |p|) apart, a
    # quarter of 2e-3 (1 + |p|); float32: exp and sum round a few times, ~1e-7, inside 1e-5
    return {"atol": 2e-3, "rtol": 2e-3} if dtype == torch.float16 else {"atol": 1e-5, "rtol": 1e-5}


if HAVE_TRITON:
    for rows, cols in SOFTMAX_SHAPES:
        x = torch.randn(rows, cols, device=DEVICE, dtype=KERNEL_DTYPE) * 4
        expected = torch.softmax(x.double(), dim=1).to(KERNEL_DTYPE)
        torch.testing.assert_close(triton_softmax(x), expected, **reference_tolerance(KERNEL_DTYPE))
    for b, h, n_q, n_k, d in ATTENTION_SHAPES:
        q, k, v = (torch.randn(b, h, n, d, device=DEVICE, dtype=KERNEL_DTYPE) for n in (n_q, n_k, n_k))
        expected = torch.nn.functional.scaled_dot_product_attention(q.double(), k.double(), v.double())
        # float16: P, the output and the reference each round once (u = 2^-11 of sum p|v|, about 1):
        # ~1.5e-3 against 5e-3; float32: a score's d roundings, ~sqrt(d) u32 |S|, far inside 1e-5
        torch.testing.assert_close(triton_attention(q, k, v), expected.to(KERNEL_DTYPE),
                                   atol=5e-3 if KERNEL_DTYPE == torch.float16 else 1e-5, rtol=5e-3)
    for shapes, descriptors in ((MATMUL_SHAPES, False), (TMA_SHAPES, True)):
        for M, K, N in shapes:
            a = torch.randn(M, K, device=DEVICE, dtype=KERNEL_DTYPE)
            b = torch.randn(K, N, device=DEVICE, dtype=KERNEL_DTYPE)
            expected = (a.double() @ b.double()).to(KERNEL_DTYPE)
            # both round the output once, so they differ by at most one float16 ulp, 2^-10 |c|: under half of
            # 2e-3 (sqrt(K) + |c|), a quarter where |c| < sqrt(K); the float32 sums add ~sqrt(K) u32 |c|
            torch.testing.assert_close(triton_matmul(a, b, descriptors), expected,
                                       atol=K ** 0.5 * (2e-3 if KERNEL_DTYPE == torch.float16 else 1e-5),
                                       rtol=2e-3)
    how = "compiled for the GPU" if DEVICE == "cuda" else "run by Triton's interpreter"
    print(f"softmax, attention, matmul and the tensor-descriptor matmul, {how}, "
          f"{str(KERNEL_DTYPE).removeprefix('torch.')}: match PyTorch on irregular shapes")
else:
    skip_or_fail("the kernel checks", "triton", f"import triton failed: {TRITON_IMPORT_ERROR}")

# %%
# Compiling for ``sm_80`` and ``sm_90a`` without a GPU
# ----------------------------------------------------
# ``triton.compile(ASTSource(kernel, signature, constexprs, attrs),
# target=GPUTarget("cuda", 90, 32))`` runs the whole pipeline: Triton's IRs,
# PTX, and ``ptxas`` for the target. Its ``-v`` log gives registers per
# thread and spilled bytes; the metadata gives shared memory per block.
# Pointers and integers are specialised as divisible by 16, as Triton's
# launcher specialises them for sizes such as 2048. The compiles run in a
# child process that imports the kernels' source without the interpreter.

KERNELS = {}
if HAVE_TRITON:
    KERNELS = {"softmax_kernel": softmax_kernel, "flash_attention_kernel": flash_attention_kernel,
               "matmul_kernel": matmul_kernel, "matmul_tma_kernel": matmul_tma_kernel}
ARGUMENT_TYPES = {  # what the launcher would pass: fp16 tensors, 32-bit integers, one float
    "softmax_kernel": ["*fp16", "*fp16", "i32", "i32"],
    "flash_attention_kernel": ["*fp16"] * 4 + ["i32"] * 5 + ["fp32"],
    "matmul_kernel": ["*fp16"] * 3 + ["i32"] * 3,
    "matmul_tma_kernel": ["*fp16"] * 3 + ["i32"] * 3,
}
# (kernel, constexprs, num_warps, num_stages, targets)
COMPILE_CASES = (
    [("softmax_kernel", {"BLOCK": block}, warps, 1, (80, 90))
     for block, warps in ((1024, 4), (4096, 4), (16384, 4), (16384, 16))]
    + [("flash_attention_kernel", {"HEAD_DIM": d, "BLOCK_M": bm, "BLOCK_N": 64}, warps, 3, (80, 90))
       for d, bm, warps in ((64, 128, 4), (128, 64, 4), (128, 128, 8))]
    + [("matmul_kernel", {"BLOCK_M": 128, "BLOCK_N": bn, "BLOCK_K": 64}, 4, 3, (80, 90))
       for bn in (64, 128)]
    + [("matmul_tma_kernel", {"BLOCK_M": 128, "BLOCK_N": 128, "BLOCK_K": 64}, 4, 3, (90,))]
)

COMPILE_CHILD = r'''
import contextlib, io, json, re, subprocess, sys
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
sys.path.insert(0, sys.argv[1])
import kernels_for_aot as kernels
jobs, results = json.load(open(sys.argv[2])), []
triton.knobs.nvidia.dump_ptxas_log = True
for job in jobs:
    kernel = getattr(kernels, job["kernel"])
    names = kernel.arg_names
    signature = dict(zip(names, job["types"] + ["constexpr"] * len(job["constexprs"])))
    constexprs = {(names.index(n),): v for n, v in job["constexprs"].items()}
    aligned = {(i,): [["tt.divisibility", 16]] for i, t in enumerate(job["types"]) if t != "fp32"}
    log = io.StringIO()
    with contextlib.redirect_stdout(log):
        compiled = triton.compile(ASTSource(kernel, signature, constexprs, aligned),
                                  target=GPUTarget("cuda", job["target"], 32),
                                  options={"num_warps": job["num_warps"], "num_stages": job["num_stages"]})
    text = log.getvalue()
    sass = ""
    if job["nvdisasm"]:
        cubin = f"{sys.argv[1]}/{len(results)}.cubin"
        open(cubin, "wb").write(compiled.asm["cubin"])
        sass = subprocess.run([job["nvdisasm"], "-c", cubin], capture_output=True, text=True, check=True).stdout
    results.append({**job, "registers": int(re.search(r"Used (\d+) registers", text)[1]),
                    "spill_stores": int(re.search(r"(\d+) bytes spill stores", text)[1]),
                    "shared": compiled.metadata.shared,
                    "scratch": getattr(compiled.metadata, "global_scratch_size", 0),
                    "ttgir": compiled.asm["ttgir"], "ptx": compiled.asm["ptx"], "sass": sass})
json.dump(results, open(sys.argv[3], "w"))
'''


def compile_ahead_of_time(cases):
    """Compile every case in one child process without TRITON_INTERPRET; its results as dicts."""
    nvdisasm = triton_tool("nvdisasm")
    with tempfile.TemporaryDirectory() as folder:
        sources = [textwrap.dedent(inspect.getsource(KERNELS[name].fn)) for name in KERNELS]
        Path(folder, "kernels_for_aot.py").write_text(
            "import triton\nimport triton.language as tl\n\n\n" + "\n\n".join(sources))
        jobs = [{"kernel": name, "types": ARGUMENT_TYPES[name], "constexprs": constexprs,
                 "num_warps": warps, "num_stages": stages, "target": target,
                 "nvdisasm": str(nvdisasm) if nvdisasm and name.startswith("matmul") else None}
                for name, constexprs, warps, stages, targets in cases for target in targets]
        Path(folder, "jobs.json").write_text(json.dumps(jobs))
        env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
        env["TRITON_CACHE_DIR"] = str(Path(folder, "cache"))  # every compile runs ptxas and logs
        subprocess.run([sys.executable, "-c", COMPILE_CHILD, folder, f"{folder}/jobs.json",
                        f"{folder}/results.json"], env=env, check=True)
        return json.loads(Path(folder, "results.json").read_text())


COMPILED = []
if PTXAS_PROBLEM is None:
    COMPILED = compile_ahead_of_time(COMPILE_CASES)
else:
    skip_or_fail("the ahead-of-time compiles", "triton", PTXAS_PROBLEM)

# %%
# Occupancy and what limits it
# ----------------------------
# An SM keeps a block resident until it finishes, so the number of resident
# blocks is the smallest of four limits: resident warps, resident blocks,
# registers and shared memory, each divided by what one block needs.
# Registers are allocated per warp in units of 256, and each warp takes them
# from one of the SM's four sub-partitions, which has a quarter of the
# register file (16,384) and a warp scheduler of its own: the register limit
# is the whole warps that fit in a quarter, times four. Shared memory is
# allocated per block in units of 128 bytes, with 1 KiB per block reserved
# for the system.
# The limits per SM (CUDA C++ Programming Guide, section 5.1.3, Tables 30
# and 31, "Device and Streaming Multiprocessor (SM) Information per Compute
# Capability" and "Memory Information per Compute Capability"; the
# allocation units from the toolkit's ``cuda_occupancy.h``):
#
# ========================================  =========  =========
# limit per SM                              8.0 A100   9.0 H100
# ========================================  =========  =========
# resident warps                            64         64
# resident blocks                           32         32
# 32-bit registers (also per block)         65,536     65,536
# registers per thread                      255        255
# shared memory                             164 KiB    228 KiB
# shared memory per block (opt-in)          163 KiB    227 KiB
# ========================================  =========  =========
#
# Occupancy is resident warps divided by the maximum. A thread may use only
# ``65536 / (64 * 32) = 32`` registers for the SM to hold its full 64 warps.

KIB = 1024
SM_LIMITS = {  # CUDA C++ Programming Guide, Tables 30 and 31
    80: {"gpu": "A100", "warps": 64, "blocks": 32, "registers": 64 * KIB, "shared": 164 * KIB,
         "shared_per_block": 163 * KIB},
    90: {"gpu": "H100", "warps": 64, "blocks": 32, "registers": 64 * KIB, "shared": 228 * KIB,
         "shared_per_block": 227 * KIB},
}
REGISTER_UNIT, SUB_PARTITIONS, SHARED_UNIT, RESERVED_SHARED = 256, 4, 128, 1 * KIB  # cuda_occupancy.h


def round_up(value, unit):
    return -(-value // unit) * unit


def round_down(value, unit):
    return value // unit * unit


def occupancy(target, num_warps, registers, shared):
    """Resident blocks per SM under each limit, the binding one, and the occupancy."""
    sm = SM_LIMITS[target]
    registers_per_warp = round_up(max(registers, 1) * 32, REGISTER_UNIT)
    warps_per_partition = sm["registers"] // SUB_PARTITIONS // registers_per_warp
    shared_per_block = round_up(shared + RESERVED_SHARED, SHARED_UNIT)
    limits = {"warps": sm["warps"] // num_warps, "blocks": sm["blocks"],
              "registers": warps_per_partition * SUB_PARTITIONS // num_warps,
              "shared memory": sm["shared"] // shared_per_block}
    if shared > sm["shared_per_block"] or registers > 255:
        limits["shared memory" if shared > sm["shared_per_block"] else "registers"] = 0
    blocks = min(limits.values())
    return {"limits": limits, "blocks": blocks, "warps": blocks * num_warps,
            "occupancy": blocks * num_warps / sm["warps"],
            "limited_by": " and ".join(name for name, value in limits.items() if value == blocks)}


def constexpr_text(constexprs):
    return " ".join(f"{name.removeprefix('BLOCK_').replace('HEAD_DIM', 'd')}={value}"
                    for name, value in constexprs.items())


if COMPILED:
    print("\nCompiled for H100 (sm_90a) / A100 (sm_80) on this machine, not executed (float16)")
    print(f"{'kernel':<23} {'constexprs':<18} {'warps':>5} {'sm':>4} {'regs':>5} {'spill B':>7} "
          f"{'smem KiB':>8} {'blocks':>6} {'warps/SM':>8} {'occup.':>6}  limited by")
    for row in COMPILED:
        row.update(occupancy(row["target"], row["num_warps"], row["registers"], row["shared"]))
        print(f"{row['kernel']:<23} {constexpr_text(row['constexprs']):<18} {row['num_warps']:>5} "
              f"{row['target']:>4} {row['registers']:>5} {row['spill_stores']:>7} "
              f"{row['shared'] / KIB:>8.1f} {row['blocks']:>6} {row['warps']:>8} "
              f"{row['occupancy']:>6.0%}  {row['limited_by']}")

# %%
# What the table must satisfy
# ---------------------------
# The checks below hold for any compiler version: each row is the formula
# applied to what ``ptxas`` reported, its blocks fit on the SM and one block
# more would not (every resource counted directly, registers per
# sub-partition), a kernel with more than 32 registers per thread cannot fill
# the SM, and at a fixed block shape occupancy never rises as registers grow,
# falling in steps at the thresholds. The formula must also give the resident
# blocks we work out by hand below for a few cases.


def blocks_fit(target, num_warps, registers, shared, blocks):
    """Whether ``blocks`` blocks fit on one SM, counting each resource they take."""
    sm = SM_LIMITS[target]
    warps = blocks * num_warps
    registers_per_partition = math.ceil(warps / SUB_PARTITIONS) * round_up(registers * 32, REGISTER_UNIT)
    return (warps <= sm["warps"] and blocks <= sm["blocks"] and registers <= 255
            and registers_per_partition <= sm["registers"] // SUB_PARTITIONS
            and shared <= sm["shared_per_block"]
            and blocks * round_up(shared + RESERVED_SHARED, SHARED_UNIT) <= sm["shared"])


for row in COMPILED:
    sm = SM_LIMITS[row["target"]]
    if row["warps"] != row["blocks"] * row["num_warps"] or row["warps"] > sm["warps"]:
        raise AssertionError(f"{row['kernel']}: {row['warps']} warps from {row['blocks']} blocks")
    registers_used = round_up(row["registers"] * 32, REGISTER_UNIT) * row["warps"]
    shared_used = round_up(row["shared"] + RESERVED_SHARED, SHARED_UNIT) * row["blocks"]
    if registers_used > sm["registers"] or shared_used > sm["shared"] or row["blocks"] > sm["blocks"]:
        raise AssertionError(f"{row['kernel']} on sm_{row['target']}: {row['blocks']} blocks overfill the SM")
    if row["registers"] > 32 and row["occupancy"] >= 1:
        raise AssertionError(f"{row['kernel']}: {row['registers']} registers yet full occupancy")
    if any(row["limits"][name] != row["blocks"] for name in row["limited_by"].split(" and ")):
        raise AssertionError(f"{row['kernel']}: a named limit is not a binding one")
    if blocks_fit(row["target"], row["num_warps"], row["registers"], row["shared"], row["blocks"] + 1):
        raise AssertionError(f"{row['kernel']} on sm_{row['target']}: one block more than {row['blocks']} fits")
# (target, warps per block, registers per thread, shared bytes): (blocks, limited by), by hand
HAND_WORKED = {
    (90, 4, 32, 0): (16, "warps and registers"),  # 32 x 32 = 1024 registers a warp: 16 per quarter
    (90, 4, 33, 0): (12, "registers"),  # 1056 rounds up to 1280: 12 warps per quarter of 16384
    (90, 4, 46, 0): (10, "registers"),  # 1472 rounds up to 1536: 10 per quarter, 40 warps
    (90, 2, 40, 0): (24, "registers"),  # 1280 a warp: 12 per quarter, 48 warps; 65536 / 2560 would say 25
    (90, 1, 88, 0): (20, "registers"),  # 2816 a warp: 5 per quarter, 20 warps; 65536 / 2816 would say 23
    (80, 8, 255, 0): (1, "registers"),  # 8160 rounds up to 8192: 2 per quarter, 8 warps
    (80, 4, 64, 88 * KIB): (1, "shared memory"),  # 89 KiB with the reserved 1 KiB: 1 in 164 KiB
    (90, 4, 128, 100 * KIB): (2, "shared memory"),  # 101 KiB: 2 in 228 KiB; registers allow 4
    (80, 4, 32, 164 * KIB): (0, "shared memory"),  # more than the 163 KiB a block may opt in to
    (90, 1, 16, 0): (32, "blocks"),  # 64 one-warp blocks would fit, but an SM holds 32
}
for case, (blocks, limited_by) in HAND_WORKED.items():
    computed = occupancy(*case)
    if (computed["blocks"], computed["limited_by"]) != (blocks, limited_by):
        raise AssertionError(f"occupancy{case}: {computed['blocks']} blocks limited by "
                             f"{computed['limited_by']}, worked out by hand: {blocks} by {limited_by}")
REGISTER_STEPS = {}
for warps in (4, 8):
    curve = [occupancy(90, warps, registers, 0)["occupancy"] for registers in range(1, 256)]
    if any(later > earlier for earlier, later in itertools.pairwise(curve)) or curve[31] < 1 or curve[32] >= 1:
        raise AssertionError(f"occupancy against registers is not a falling staircase at {warps} warps")
    REGISTER_STEPS[warps] = [r + 2 for r in range(254) if curve[r + 1] < curve[r]]
print(f"occupancy formula: {len(HAND_WORKED)} cases worked out by hand agree; at 4 warps per block "
      f"occupancy falls above {', '.join(str(r - 1) for r in REGISTER_STEPS[4][:6])}, ... registers")
if COMPILED:
    print(f"{len(COMPILED)} compiles consistent with the limits, each with the most blocks that fit")

# %%
# Occupancy against registers per thread
# --------------------------------------
# The staircase for ``sm_90a``, with the compiled kernels placed on it.

fig, ax = plt.subplots(figsize=(10, 4.8))
for warps, style in ((4, "-"), (8, "--")):
    ax.step(range(1, 256), [100 * occupancy(90, warps, r, 0)["occupancy"] for r in range(1, 256)],
            style, where="post", color="tab:gray", label=f"limit from registers, {warps} warps/block")
markers = {"softmax_kernel": "o", "flash_attention_kernel": "s", "matmul_kernel": "^",
           "matmul_tma_kernel": "D"}
for row in (r for r in COMPILED if r["target"] == 90):
    ax.plot(row["registers"], 100 * row["occupancy"], markers[row["kernel"]], ms=8, alpha=0.7,
            label=f"{row['kernel']} {constexpr_text(row['constexprs'])} w={row['num_warps']}"
                  f" ({row['limited_by']})")
ax.set_xlabel("registers per thread (from ptxas -v)")
ax.set_ylabel("theoretical occupancy (% of 64 warps)")
ax.set_title("Theoretical occupancy, compiled for H100 (sm_90a)\non this machine, not executed"
             f"\n{DEVICE_NAME}", fontsize=9)
ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.02, 1))
fig.tight_layout()

# %%
# Latency hiding: Little's law, and ILP instead of occupancy
# ----------------------------------------------------------
# To stream at bandwidth :math:`B` from memory with latency :math:`L`, the
# SMs together must have :math:`B \cdot L` bytes of loads outstanding
# (Little's law, lecture 5, section 1). Each warp that issues a 16-byte load
# per lane has 512 bytes in flight; with :math:`k` independent loads per
# thread before the first is used (instruction-level parallelism), it has
# :math:`512k`. So the bandwidth a kernel reaches is about
#
# .. math:: \min\left(B,\ \frac{\text{SMs} \times \text{warps per SM} \times 512k}{L}\right),
#
# and :math:`k` multiplies occupancy: Volkov ("Better performance at lower
# occupancy", GTC 2010) showed kernels that reach the peak at a fraction of
# full occupancy by giving each thread more independent work. The model uses
# the H200 figures of section 2 of the lecture (4.8 TB/s, 132 SMs, from
# NVIDIA's datasheet and whitepaper) and the assumed latency of section 1.
# It is a model, not a measurement.

MODEL_BANDWIDTH, MODEL_SMS, MODEL_LATENCY = 4.8e12, 132, 500e-9  # H200 datasheet; assumed latency
WARPS_AXIS = list(range(1, 65))


def little_bandwidth(warps_per_sm, loads_in_flight, bandwidth=MODEL_BANDWIDTH, sms=MODEL_SMS,
                     latency=MODEL_LATENCY):
    return min(bandwidth, sms * warps_per_sm * 512 * loads_in_flight / latency)


for ilp in (1, 4):
    needed = next(w for w in WARPS_AXIS if little_bandwidth(w, ilp) >= MODEL_BANDWIDTH)
    print(f"model: {ilp} load(s) of 16 B in flight per thread reach the peak at {needed} warps/SM "
          f"({needed / 64:.0%} occupancy)")

# %%
# On a GPU we measure it: a grid-stride copy in CUDA whose blocks request
# dynamic shared memory they do not use, so that fewer fit on an SM. The
# CUDA runtime reports the resident blocks
# (``cudaOccupancyMaxActiveBlocksPerMultiprocessor``), which the formula
# above must match on sm_80 and sm_90. One version loads one ``float4`` per
# thread per step, the other four before storing any. Four loads in flight
# move up to four times the bytes, so at the lowest occupancy (one block of
# 8 warps per SM) we require the second to reach at least half of
# ``min(copy bandwidth, 4 x the first's bandwidth)``.

# The source includes only the tensor type it uses: ``<torch/types.h>``, which
# ``load_inline`` would otherwise prepend, brings all of ATen's operators and
# makes ``nvcc`` parse them once for the host and once for each architecture.
CUDA_SOURCE = r"""
#include <cuda_runtime.h>
#include <vector>
#include <ATen/core/Tensor.h>

template <int ILP>
__global__ void copy_kernel(const float4* __restrict__ src, float4* __restrict__ dst, long n) {
    extern __shared__ float unused[];  // only its size matters: it limits resident blocks
    long stride = (long)gridDim.x * blockDim.x;
#pragma unroll 1  // unrolled, the loop would batch loads itself: ILP would not be what we set
    for (long i = blockIdx.x * (long)blockDim.x + threadIdx.x; i < n; i += ILP * stride) {
        float4 v[ILP];
#pragma unroll
        for (int j = 0; j < ILP; ++j) if (i + j * stride < n) v[j] = src[i + j * stride];
#pragma unroll
        for (int j = 0; j < ILP; ++j) if (i + j * stride < n) dst[i + j * stride] = v[j];
    }
}

template <int PAD>
__global__ void transpose_kernel(const float* __restrict__ src, float* __restrict__ dst, int n) {
    __shared__ float tile[32][32 + PAD];  // PAD = 1 moves each row one bank further
    int x = blockIdx.x * 32 + threadIdx.x, y = blockIdx.y * 32 + threadIdx.y;
    for (int j = 0; j < 32; j += 8) tile[threadIdx.y + j][threadIdx.x] = src[(long)(y + j) * n + x];
    __syncthreads();
    x = blockIdx.y * 32 + threadIdx.x, y = blockIdx.x * 32 + threadIdx.y;
    for (int j = 0; j < 32; j += 8) dst[(long)(y + j) * n + x] = tile[threadIdx.x][threadIdx.y + j];
}

std::vector<int64_t> copy(const at::Tensor& src, const at::Tensor& dst, int64_t ilp, int64_t shared_bytes) {
    auto kernel = ilp == 4 ? copy_kernel<4> : copy_kernel<1>;
    cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)shared_bytes);
    int blocks_per_sm = 0, sms = 0, device = 0;
    cudaGetDevice(&device);
    cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device);
    cudaOccupancyMaxActiveBlocksPerMultiprocessor(&blocks_per_sm, kernel, 256, shared_bytes);
    cudaFuncAttributes attributes;
    cudaFuncGetAttributes(&attributes, kernel);
    long n = src.numel() / 4;
    kernel<<<sms * blocks_per_sm, 256, shared_bytes>>>(
        reinterpret_cast<const float4*>(src.data_ptr<float>()), reinterpret_cast<float4*>(dst.data_ptr<float>()), n);
    TORCH_CHECK(cudaGetLastError() == cudaSuccess, "copy_kernel failed to launch");
    return {blocks_per_sm, sms, attributes.numRegs};
}

void transpose(const at::Tensor& src, const at::Tensor& dst, bool padded) {
    int n = src.size(0);
    dim3 grid(n / 32, n / 32), block(32, 8);
    if (padded) transpose_kernel<1><<<grid, block>>>(src.data_ptr<float>(), dst.data_ptr<float>(), n);
    else transpose_kernel<0><<<grid, block>>>(src.data_ptr<float>(), dst.data_ptr<float>(), n);
    TORCH_CHECK(cudaGetLastError() == cudaSuccess, "transpose_kernel failed to launch");
}
"""
CPP_SOURCE = """
#include <vector>
#include <ATen/core/Tensor.h>
#include <torch/csrc/utils/pybind.h>
std::vector<int64_t> copy(const at::Tensor& src, const at::Tensor& dst, int64_t ilp, int64_t shared_bytes);
void transpose(const at::Tensor& src, const at::Tensor& dst, bool padded);
"""


def compile_problem(command, suffix, code):
    """Why ``command`` cannot compile a one-line file of ``code``, or None if it can."""
    with tempfile.TemporaryDirectory() as folder:
        source = os.path.join(folder, "probe" + suffix)
        with open(source, "w") as file:
            file.write(code)
        try:
            done = subprocess.run([*command, "-c", source, "-o", source + ".o"],
                                  capture_output=True, text=True, check=False)
        except OSError as error:  # on PATH but not runnable
            return f"{command[0]} cannot be run ({error})"
    if done.returncode != 0:
        return f"{command[0]} fails on a one-line {suffix} file (exit {done.returncode})"
    return None


def nvcc_problem():
    """Why the CUDA toolkit torch would use cannot build here, or None."""
    if cpp_extension.CUDA_HOME is None:
        return "no CUDA toolkit was found (CUDA_HOME, nvcc on PATH, /usr/local/cuda)"
    nvcc = os.path.join(cpp_extension.CUDA_HOME, "bin", "nvcc")
    if shutil.which(nvcc) is None:
        return f"{nvcc} does not exist"
    return compile_problem([nvcc], ".cu", "__global__ void probe() {}\n")


def missing_toolchain():
    """(capability, reason) for what load_inline lacks here, or None."""
    compiler = cpp_extension.get_cxx_compiler()
    if shutil.which(compiler) is None:
        return "cxx", f"no C++ compiler {compiler!r} is on PATH"
    if (problem := compile_problem([compiler], ".cpp", "int probe() { return 0; }\n")) is not None:
        return "cxx", problem
    if DEVICE == "cuda" and (problem := nvcc_problem()) is not None:
        return "nvcc", problem
    return None


CUDA_EXTENSION = None
MISSING_TOOLCHAIN = missing_toolchain()  # the C++ binding needs cxx on every machine
if MISSING_TOOLCHAIN is not None:
    skip_or_fail("the CUDA copy and transpose", *MISSING_TOOLCHAIN)
elif DEVICE == "cuda":
    CUDA_EXTENSION = cpp_extension.load_inline(
        "occupancy_and_banks", cpp_sources=CPP_SOURCE, cuda_sources=CUDA_SOURCE,
        functions=["copy", "transpose"], extra_cuda_cflags=["-O3"], no_implicit_headers=True,
        with_pytorch_error_handling=False)


def median_ms(fn):
    return triton.testing.do_bench(fn, return_mode="median")


ILP_MARGIN = 0.5  # of Little's law's bandwidth for 4 loads in flight


bandwidth_rows = []
if CUDA_EXTENSION is not None:
    src = torch.randn(1 << 28, device="cuda")  # 1 GiB: far beyond L2
    dst = torch.empty_like(src)
    properties = torch.cuda.get_device_properties(0)
    capability = properties.major * 10 + properties.minor
    # Dynamic shared memory that leaves room for 8, 6, 4, 3, 2 or 1 blocks of 8 warps per SM
    shared_sizes = sorted({min(properties.shared_memory_per_block_optin,
                               round_down(properties.shared_memory_per_multiprocessor // blocks
                                          - RESERVED_SHARED, SHARED_UNIT)) if blocks < 8 else 0
                           for blocks in (8, 6, 4, 3, 2, 1)})
    for ilp in (1, 4):
        for shared_bytes in shared_sizes:
            dst.zero_()
            blocks_per_sm, sms, copy_registers = CUDA_EXTENSION.copy(src, dst, ilp, shared_bytes)
            torch.testing.assert_close(dst, src, atol=0, rtol=0)  # a copy: exact
            if capability in SM_LIMITS:  # the runtime's occupancy calculator against ours
                predicted = occupancy(capability, 8, copy_registers, shared_bytes)["blocks"]
                if blocks_per_sm > predicted or (shared_bytes == 0 and blocks_per_sm != predicted):
                    raise AssertionError(f"CUDA runtime: {blocks_per_sm} blocks per SM, formula: "
                                         f"{predicted} ({copy_registers} registers, {shared_bytes} B)")
            ms = median_ms(lambda ilp=ilp, s=shared_bytes: CUDA_EXTENSION.copy(src, dst, ilp, s))
            bandwidth_rows.append({"ilp": ilp, "warps_per_sm": blocks_per_sm * 8, "shared_bytes": shared_bytes,
                                   "GBps": 2 * src.numel() * 4 / ms / 1e6})
    copy_GBps = 2 * src.numel() * 4 / median_ms(lambda: dst.copy_(src)) / 1e6
    print(f"\n{'ILP':>3} {'warps/SM':>8} {'GB/s':>8} {'% of copy_':>10}")
    for row in bandwidth_rows:
        print(f"{row['ilp']:>3} {row['warps_per_sm']:>8} {row['GBps']:>8.0f} "
              f"{100 * row['GBps'] / copy_GBps:>9.0f}%")
    # Little's law at the lowest occupancy: 4 loads in flight move up to 4 times the bytes
    ilp1, ilp4 = (next(r for r in bandwidth_rows if r["ilp"] == ilp and r["shared_bytes"] == shared_sizes[-1])
                  for ilp in (1, 4))
    predicted_GBps = min(copy_GBps, 4 * ilp1["GBps"])
    print(f"at {ilp1['warps_per_sm']} warps/SM: ILP 4 {ilp4['GBps']:.0f} GB/s, Little's law from ILP 1: "
          f"up to {predicted_GBps:.0f} GB/s")
    if ilp4["GBps"] < ILP_MARGIN * predicted_GBps:
        raise AssertionError(f"ILP 4 copies at {ilp4['GBps']:.0f} GB/s at {ilp4['warps_per_sm']} warps/SM, "
                             f"below {ILP_MARGIN} of min(copy, 4 x ILP 1) = {predicted_GBps:.0f} GB/s")
elif DEVICE == "cpu":
    print("No CUDA GPU here: the copy kernels are not run; the figure shows the model alone.")

fig, ax = plt.subplots(figsize=(10, 4.8))
for ilp, color in ((1, "tab:blue"), (4, "tab:orange")):
    ax.plot(WARPS_AXIS, [little_bandwidth(w, ilp) / 1e9 for w in WARPS_AXIS], "--", color=color,
            label=f"model: {ilp} x 16 B in flight per thread, L = 500 ns (assumed)")
    measured = [row for row in bandwidth_rows if row["ilp"] == ilp]
    if measured:
        ax.plot([r["warps_per_sm"] for r in measured], [r["GBps"] for r in measured], "o-",
                color=color, label=f"measured: CUDA copy, ILP {ilp}")
ax.set_xlabel("resident warps per SM (occupancy x 64)")
ax.set_ylabel("bandwidth (GB/s)")
kind = "measured, with the model" if bandwidth_rows else "model only, H200 figures"
ax.set_title(f"Little's law: bandwidth against occupancy\n({kind})\n{DEVICE_NAME}", fontsize=9)
ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.02, 1))
fig.tight_layout()

# %%
# Shared-memory banks
# -------------------
# Shared memory is split into 32 banks of 4-byte words; word ``w`` lives in
# bank ``w mod 32``, and a bank serves one word per cycle (CUDA C++
# Programming Guide, "Shared Memory" in the compute capability 5.x and later
# sections). When several lanes of a warp touch different words of one bank,
# the access is replayed: an *n-way* conflict costs *n* passes. For a 32 x 32
# fp32 tile ``tile[row][col]``, lane ``i`` reading row 0 touches word ``i``;
# reading column 0 it touches word ``32 i``, always bank 0. One word of
# padding per row (a 33-wide tile) moves column ``i`` to word ``33 i``, bank
# ``i``.


def banks_hit(words):
    return [word % 32 for word in words]


def conflict_ways(words):
    """Passes a warp's access needs: the most distinct words that share one bank."""
    per_bank = {}
    for word in set(words):
        per_bank.setdefault(word % 32, set()).add(word)
    return max(len(w) for w in per_bank.values())


LANES = range(32)
ACCESSES = {"row of tile[32][32]": [0 * 32 + lane for lane in LANES],
            "column of tile[32][32]": [lane * 32 + 0 for lane in LANES],
            "column of tile[32][33]": [lane * 33 + 0 for lane in LANES]}
WAYS = {name: conflict_ways(words) for name, words in ACCESSES.items()}
for name, ways in WAYS.items():
    print(f"{name:<24} banks {banks_hit(ACCESSES[name])[:6]} ...  {ways}-way")
if list(WAYS.values()) != [1, 32, 1]:
    raise AssertionError(f"bank conflicts {WAYS}, expected row 1-way, column 32-way, padded 1-way")
# A column of a tile s words wide: lane i reads word s * i, so gcd(s, 32) lanes share each bank
STRIDE_WAYS = {stride: conflict_ways([lane * stride for lane in LANES]) for stride in range(1, 129)}
if any(ways != math.gcd(stride, 32) for stride, ways in STRIDE_WAYS.items()):
    raise AssertionError("a column read of a tile s words wide is not gcd(s, 32)-way")
print("column of a tile s words wide: " + ", ".join(f"s={s} {STRIDE_WAYS[s]}-way" for s in (32, 33, 34, 48, 64))
      + "; always gcd(s, 32)")

fig, axes = plt.subplots(1, 3, figsize=(10, 4.4), sharey=True)
for ax, (name, words) in zip(axes, ACCESSES.items()):
    grid = torch.zeros(32, 32)
    for lane, bank in enumerate(banks_hit(words)):
        grid[lane, bank] = 1
    ax.imshow(grid, cmap="Blues", aspect="equal")
    ax.set_title(f"{name}\n{WAYS[name]}-way", fontsize=9)
    ax.set_xlabel("bank")
axes[0].set_ylabel("lane of the warp")
fig.suptitle("Which bank each lane reads (computed, 4-byte banks)", fontsize=10)
fig.tight_layout()

# %%
# On a GPU, the transpose that reads the tile by column runs with and
# without the padding; both outputs are checked. Without the padding every
# column read of a warp takes 32 passes, one shared-memory cycle per
# element, so on :math:`S` SMs at clock :math:`f` the transpose of an
# :math:`n \times n` matrix takes at least :math:`n^2 / (S f)`. We require
# 90 % of that bound (for timing noise), and where the bound exceeds 1.5
# times the time of a plain copy of the same bytes, a padded transpose at
# least 1.2 times faster than the unpadded one.

transpose_ms = {}
if CUDA_EXTENSION is not None:
    square = torch.randn(8192, 8192, device="cuda")
    for padded in (False, True):
        out = torch.empty_like(square)
        CUDA_EXTENSION.transpose(square, out, padded)
        torch.testing.assert_close(out, square.t(), atol=0, rtol=0)  # a copy: exact
        transpose_ms[padded] = median_ms(lambda p=padded, o=out: CUDA_EXTENSION.transpose(square, o, p))
    for padded, ms in transpose_ms.items():
        print(f"transpose 8192^2 fp32, {'padded 33' if padded else 'unpadded 32'}: {ms:.3f} ms, "
              f"{2 * square.numel() * 4 / ms / 1e6:.0f} GB/s")
    conflict_ms = square.numel() / (properties.multi_processor_count * properties.clock_rate * 1e3) * 1e3
    copy_ms = 2 * square.numel() * 4 / copy_GBps / 1e6
    print(f"bank-conflict bound n^2 / (S f): {conflict_ms:.3f} ms at {properties.clock_rate / 1e6:.2f} GHz; "
          f"a copy of the same bytes: {copy_ms:.3f} ms")
    if transpose_ms[False] < 0.9 * conflict_ms:
        raise AssertionError(f"the unpadded transpose took {transpose_ms[False]:.3f} ms, below 90 % of its "
                             f"32-way bank-conflict bound {conflict_ms:.3f} ms")
    if conflict_ms > 1.5 * copy_ms and transpose_ms[False] < 1.2 * transpose_ms[True]:
        raise AssertionError(f"padding made the transpose only {transpose_ms[False] / transpose_ms[True]:.2f} "
                             "times faster, not the 1.2 its bank conflicts predict")
elif DEVICE == "cpu":
    print("No CUDA GPU here: the transposes are not run; the bank counts above are arithmetic.")

# %%
# Triton swizzles for you
# -----------------------
# Triton does not pad the tiles it stages for ``tl.dot``: it *swizzles*, XOR-ing the column of each row with a
# function of the row, so that rows and columns both spread over the banks
# without wasting a word. The shared layouts appear as ``#shared``
# attributes in the TTGIR of the matmul: ``swizzled_shared`` (vector, phase)
# on sm_80, ``nvmma_shared`` with a 128-byte swizzle on sm_90a, the layout
# that ``wgmma`` reads and TMA writes.
#
# In ``swizzled_shared`` a row is cut into chunks of ``vec`` elements, and
# row ``r`` stores its chunk ``c`` in place ``c XOR ((r // perPhase) mod
# maxPhase)``; with ``maxPhase = 1`` every row stays as it is, no swizzle at
# all. We read the three numbers from the sm_80 layout and count the banks
# that ``ldmatrix`` reads: one 16-byte chunk from each of eight rows of the
# 64-element float16 tile of ``A``. Without the swizzle the eight chunks lie
# in the same four banks, an 8-way conflict; with it they must cover all 32
# banks once. On sm_90a we check for the 128-byte swizzle, which spreads
# eight rows' chunks in the same way.


def layout_parameters(line):
    """('swizzled_shared', {'vec': '8', ...}) from a TTGIR line '#shared = #ttg.swizzled_shared<{...}>'."""
    kind, body = re.match(r"#\w+ = #ttg\.(\w+)<\{(.*)\}>", line).groups()
    return kind, dict(re.findall(r"(\w+) = (\[[^\]]*\]|[^,]+)", body))


def ldmatrix_ways(vec, per_phase, max_phase, row_elements=64, rows=8, chunk_elements=8):
    """Bank conflict of reading the first 16 bytes (8 float16) of ``rows`` rows of a swizzled tile."""
    words = []
    for r in range(rows):
        phase = (r // per_phase) % max_phase
        for c in range(chunk_elements):
            place = (c // vec) ^ phase  # the chunk's place in its row
            words.append((r * row_elements + place * vec + c % vec) * 2 // 4)
    return conflict_ways(words)


SHARED_LAYOUTS = {}
for row in (r for r in COMPILED if r["kernel"] == "matmul_kernel" and r["constexprs"]["BLOCK_N"] == 128):
    lines = [line for line in row["ttgir"].splitlines() if line.startswith("#shared")]
    SHARED_LAYOUTS[row["target"]] = [layout_parameters(line) for line in lines]
    print(f"sm_{row['target']} TTGIR:", *lines, sep="\n  ")
    if row["target"] == 80:
        tiles = [p for kind, p in SHARED_LAYOUTS[80] if kind == "swizzled_shared" and p["order"].count(",") == 1]
        if not tiles or any(int(p["maxPhase"]) <= 1 for p in tiles):
            raise AssertionError(f"no swizzle (maxPhase > 1) in the sm_80 tile layouts {tiles}")
        for p in tiles:
            vec, per_phase, max_phase = int(p["vec"]), int(p["perPhase"]), int(p["maxPhase"])
            swizzled, plain = ldmatrix_ways(vec, per_phase, max_phase), ldmatrix_ways(vec, 1, 1)
            print(f"  16 bytes of each of 8 rows: {swizzled}-way with vec={vec}, perPhase={per_phase}, "
                  f"maxPhase={max_phase}; {plain}-way without the swizzle")
            if swizzled != 1 or plain != 8:
                raise AssertionError(f"the sm_80 swizzle {p} does not spread 8 rows of 16 bytes over the banks")
    elif not any(kind == "nvmma_shared" and p.get("swizzlingByteWidth") == "128"
                 for kind, p in SHARED_LAYOUTS[row["target"]]):
        raise AssertionError(f"no 128-byte swizzle in the sm_{row['target']} TTGIR")

# %%
# Tensor cores and TMA in the compiled code
# -----------------------------------------
# The same ``tl.dot`` becomes ``mma.sync`` (SASS ``HMMA``) on sm_80: each
# warp multiplies small tiles from registers. On sm_90a it becomes
# ``wgmma.mma_async`` (``HGMMA``): a warpgroup of four warps issues one
# asynchronous product that reads its second operand (and often the first)
# from shared memory, and waits for it later. The tensor-descriptor version adds TMA:
# ``cp.async.bulk.tensor`` (``UTMALDG``), one thread asking the copy engine
# for a whole tile, completion signalled on an mbarrier in shared memory.


def count(pattern, text):
    return len(re.findall(pattern, text))


INSTRUCTIONS = {}
for row in (r for r in COMPILED if r["kernel"].startswith("matmul") and r["constexprs"]["BLOCK_N"] == 128):
    key = f"{row['kernel']} sm_{row['target']}"
    INSTRUCTIONS[key] = {"mma.sync": count(r"mma\.sync", row["ptx"]), "wgmma": count(r"wgmma\.mma_async", row["ptx"]),
                         "cp.async.bulk.tensor": count(r"cp\.async\.bulk\.tensor", row["ptx"]),
                         "mbarrier": count(r"mbarrier\.", row["ptx"]), "HMMA": count(r"\bHMMA\b", row["sass"]),
                         "HGMMA": count(r"\bHGMMA\b", row["sass"]), "UTMALDG": count(r"\bUTMALDG\b", row["sass"])}
    print(f"{key:<26} " + "  ".join(f"{name} {n}" for name, n in INSTRUCTIONS[key].items())
          + (f"  global scratch {row['scratch']} B (needs triton.set_allocator)" if row["scratch"] else ""))
if COMPILED:
    expected = {"matmul_kernel sm_80": "mma.sync", "matmul_kernel sm_90": "wgmma",
                "matmul_tma_kernel sm_90": "cp.async.bulk.tensor"}
    for key, instruction in expected.items():
        if not INSTRUCTIONS[key][instruction]:
            raise AssertionError(f"no {instruction} in the PTX of {key}")
    if INSTRUCTIONS["matmul_kernel sm_80"]["wgmma"]:
        raise AssertionError("wgmma in sm_80 code: it exists from sm_90a on")
    if triton_tool("nvdisasm") and not (INSTRUCTIONS["matmul_kernel sm_80"]["HMMA"]
                                        and INSTRUCTIONS["matmul_kernel sm_90"]["HGMMA"]
                                        and INSTRUCTIONS["matmul_tma_kernel sm_90"]["UTMALDG"]):
        raise AssertionError("the SASS lacks HMMA on sm_80, or HGMMA or UTMALDG on sm_90a")
    sass = next(r["sass"] for r in COMPILED if r["kernel"] == "matmul_tma_kernel")
    print("sm_90a SASS lines of the TMA matmul:",
          *[line.strip() for line in sass.splitlines() if re.search(r"UTMALDG|HGMMA|SYNCS", line)][:4],
          sep="\n  ")

# %%
# On a GPU the two matmuls are timed against ``torch.matmul`` at the largest
# size they were checked at. On a Hopper GPU the second one runs the TMA
# copies counted above; before Hopper, Triton lowers its descriptors to
# ordinary loads.

matmul_TFLOPps = {}
if HAVE_TRITON and DEVICE == "cuda":
    M, K, N = MATMUL_SHAPES[-1]
    a = torch.randn(M, K, device="cuda", dtype=KERNEL_DTYPE)
    b = torch.randn(K, N, device="cuda", dtype=KERNEL_DTYPE)
    for name, run in (("Triton, pointer loads", lambda: triton_matmul(a, b)),
                      ("Triton, tensor descriptors", lambda: triton_matmul(a, b, descriptors=True)),
                      ("torch.matmul", lambda: a @ b)):
        matmul_TFLOPps[name] = 2 * M * N * K / median_ms(run) / 1e9
        print(f"matmul {M}x{K}x{N} {str(KERNEL_DTYPE).removeprefix('torch.')}, {name}: "
              f"{matmul_TFLOPps[name]:.0f} TFLOP/s")

# %%
# Beyond what Triton 3.6 writes for you
# -------------------------------------
# FlashAttention-3 (Shah et al. 2024, arXiv:2407.08608) uses this machinery
# by hand. *Warp specialisation*: one warpgroup only issues TMA loads into a
# ring of shared-memory buffers (the producer); the others only run
# ``wgmma`` and the softmax (the consumers). *mbarriers* in shared memory
# hand each buffer over: the producer arms "full" with the bytes it expects
# and TMA counts them off as they land; consumers arrive on "empty" when they are done reading. The
# *exponential bottleneck*: on an H100 SXM5 the SFUs that compute ``exp2``
# deliver about 3.9 T results per second against 989 TFLOP/s of matmuls, and
# at head dimension 128 each score costs one exponential and 4 x 128 = 512
# FLOPs of matmul, so the exponentials alone would take about half the time
# of the matmuls (the paper's Section 3.1). FlashAttention-3 ping-pongs two consumer warpgroups,
# one doing its softmax while the other's ``wgmma`` runs, and inside each
# warpgroup overlaps the softmax of one block with the second product
# (:math:`PV`) of the block before (the paper's Sections 3.1 and 3.2).
# Triton has experimental warp specialisation (``tl.range(...,
# warp_specialize=True)``), which its 3.6 documentation supports only on
# Blackwell GPUs; this page shows only what it compiles by default.
#
# Hardware-level profiling
# ------------------------
# Occupancy above is *theoretical*. Nsight Compute (``ncu``) measures what a
# launch achieved: ``dram__bytes_read.sum`` and ``dram__bytes_write.sum``
# (DRAM bytes, to compare with the byte model), and
# ``sm__warps_active.avg.pct_of_peak_sustained_active`` (achieved
# occupancy), among hundreds of counters. Where ``ncu`` is on the ``PATH`` of
# a GPU machine we run it in a child process on one elementwise kernel over
# 1 GiB, a negation (``ncu`` profiles kernels, and a contiguous ``copy_`` is
# a ``cudaMemcpy``, not a kernel), and
# check the DRAM counters against the byte model: every byte read once and
# written once, less what L2 still holds when the kernel ends. Elsewhere the example says what ``ncu`` would report, and
# ``torch.profiler`` shows the kernels and their times, not counters.

NCU_METRICS = ["dram__bytes_read.sum", "dram__bytes_write.sum",
               "sm__warps_active.avg.pct_of_peak_sustained_active"]
NCU_ELEMENTS = 1 << 28  # 1 GiB of float32: far beyond L2, so almost every byte crosses DRAM
NCU_MODEL_BYTES = NCU_ELEMENTS * 4  # read once and written once
# The source comes from the host (a cudaMemcpy, not a kernel), so the negation is the only kernel
NCU_SCRIPT = f"""
import torch
src = torch.ones({NCU_ELEMENTS}).cuda()
dst = torch.empty_like(src)
torch.neg(src, out=dst)
torch.cuda.synchronize()
"""


def ncu_metrics(stdout):
    """{metric: value} from ``ncu --csv --print-units base``, for the values in bytes or %."""
    lines = stdout[stdout.find('"ID"'):].splitlines() if '"ID"' in stdout else []
    values = {}
    for record in csv.DictReader(lines):
        name, unit = record.get("Metric Name"), record.get("Metric Unit")
        if name in NCU_METRICS and unit in ("byte", "%"):
            values[name] = float(record["Metric Value"].replace(",", ""))
    return values


if DEVICE == "cuda" and shutil.which("ncu"):
    profiled = subprocess.run(["ncu", "--metrics", ",".join(NCU_METRICS), "--csv", "--print-units", "base",
                               sys.executable, "-c", NCU_SCRIPT],
                              check=False, capture_output=True, text=True, timeout=300)
    measured = ncu_metrics(profiled.stdout)
    print(f"ncu on a negation of {NCU_MODEL_BYTES / 2**20:.0f} MiB (byte model: "
          f"{NCU_MODEL_BYTES / 2**20:.0f} MiB read, {NCU_MODEL_BYTES / 2**20:.0f} MiB written):")
    for name in NCU_METRICS:
        if name in measured:
            value = measured[name]
            print(f"  {name}: " + (f"{value / 2**20:.1f} MiB" if name.startswith("dram") else f"{value:.0f} %"))
    if all(name in measured for name in NCU_METRICS[:2]):
        # ncu flushes the caches before it measures, so every read crosses DRAM; written lines
        # still in L2 when the kernel ends are written back later, outside the measurement
        l2_bytes = torch.cuda.get_device_properties(0).L2_cache_size
        bounds = {NCU_METRICS[0]: (0.95 * NCU_MODEL_BYTES, 1.1 * NCU_MODEL_BYTES),
                  NCU_METRICS[1]: (0.95 * (NCU_MODEL_BYTES - l2_bytes), 1.1 * NCU_MODEL_BYTES)}
        for name, (low, high) in bounds.items():
            if not low <= measured[name] <= high:
                raise AssertionError(f"ncu: {name} = {measured[name]:.0f} B, the model allows {low:.0f} to {high:.0f}")
    else:
        print("ncu ran but reported no counters (they may need admin rights):",
              (profiled.stderr or profiled.stdout)[-300:])
else:
    why_not = "it is not on PATH" if DEVICE == "cuda" else "it needs an NVIDIA GPU"
    print(f"No ncu here ({why_not}). "
          f"Where it runs, ncu --metrics {','.join(NCU_METRICS)} "
          f"would report for a negation of {NCU_MODEL_BYTES / 2**20:.0f} MiB about "
          f"{NCU_MODEL_BYTES / 2**20:.0f} MiB read and {NCU_MODEL_BYTES / 2**20:.0f} MiB written "
          "(the byte model), and the achieved occupancy, at most the theoretical one. "
          "torch.profiler shows kernels and times, not counters:")
    from torch.profiler import ProfilerActivity, profile

    x = torch.randn(512, 1024, device=DEVICE)
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if DEVICE == "cuda" else [])
    with profile(activities=activities) as prof:
        torch.softmax(x, dim=1)
    print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=4))

# %%
# Read the result
# ---------------
# **Occupancy.** The table shows the register file and shared memory, not
# the warp slots, as the limits of the course's tiled kernels, often both at
# once (the last column): FlashAttention and the matmul keep their
# accumulators in registers and their tiles in shared memory, and reach a
# fraction of full occupancy. The softmax starts at full occupancy and loses
# it as its row, held in registers, grows. Low occupancy is not by itself
# slow: these kernels hide latency with large tiles, multi-stage pipelines
# (``num_stages``) and asynchronous copies instead of with more warps, which
# is Volkov's point and the second figure's model.
#
# **Banks.** A column read of an unpadded tile serialises 32 ways; padding or
# swizzling removes the conflict, and Triton chooses a swizzle for every
# tile it stages for ``tl.dot`` (the TTGIR lines above).
#
# **Hopper.** The same Triton source compiles to synchronous warp-level
# ``mma.sync`` on the A100 and asynchronous warpgroup ``wgmma`` on the H100,
# and with tensor descriptors to TMA copies tracked by mbarriers.
#
# On a CPU the registers, shared memory, layouts and instructions are real
# compiler output for the two GPUs, and none of it ran on them; the
# latency-hiding plot is a model and the bank counts are arithmetic.

KEY_FIGURES = {"device": DEVICE_NAME}
for row in COMPILED:
    if row["kernel"] == "flash_attention_kernel" and row["constexprs"]["HEAD_DIM"] == 128:
        name = f"flash_attention_d128_m{row['constexprs']['BLOCK_M']}_sm{row['target']}"
        KEY_FIGURES[f"{name}_registers"] = row["registers"]
        KEY_FIGURES[f"{name}_occupancy"] = row["occupancy"]
for row in bandwidth_rows:
    KEY_FIGURES[f"copy_GBps_ilp{row['ilp']}_warps{row['warps_per_sm']}"] = row["GBps"]
if transpose_ms:
    KEY_FIGURES["transpose_unpadded_over_padded_time"] = transpose_ms[False] / transpose_ms[True]
for name, tflops in matmul_TFLOPps.items():
    KEY_FIGURES[f"matmul_TFLOPps_{name.replace(', ', '_').replace(' ', '_').replace('.', '_')}"] = tflops

# The Triton calls of the CUDA branch, for the course's ahead-of-time compile check
GPU_LAUNCHES = (
    [("triton_softmax", [((rows, cols), KERNEL_DTYPE)], {}) for rows, cols in SOFTMAX_SHAPES]
    + [("triton_attention", [((b, h, n_q, d), KERNEL_DTYPE)] + [((b, h, n_k, d), KERNEL_DTYPE)] * 2, {})
       for b, h, n_q, n_k, d in ATTENTION_SHAPES]
    + [("triton_matmul", [((M, K), KERNEL_DTYPE), ((K, N), KERNEL_DTYPE)], {}) for M, K, N in MATMUL_SHAPES]
    + [("triton_matmul", [((M, K), KERNEL_DTYPE), ((K, N), KERNEL_DTYPE)], {"descriptors": True})
       for M, K, N in TMA_SHAPES]
)
