"""
Fused softmax and tiled matmul in Triton
========================================

Two kernels at the heart of every transformer: a row softmax that reads its
input once and writes its output once, and a tiled matrix multiplication
with a fused activation. For each we predict the gain from a
count of bytes or tiles, write the Triton kernel, check it against PyTorch on
awkward shapes, and measure it against the library.

**Requirements.** Full version: a CUDA GPU and Triton (bfloat16 needs compute
capability 8.0 or newer, else float16 is used). On a CPU, Triton runs in
interpreter mode at small sizes: the page checks correctness, times only
PyTorch, and draws the program-order model, which needs no GPU. On a T4
(compute capability 7.5, as on free Colab notebooks) the matmuls run in float16
instead of bfloat16, and the autotune configurations that need more shared
memory than a block gets there are reported and left out of the check.
"""

# %%
# Setup
# -----
# This page builds on the kernels of
# :ref:`sphx_glr_auto_examples_lecture06_kernels_triton_04_triton_basics.py`.
# On a CPU, ``TRITON_INTERPRET=1`` must be set before Triton is imported: the
# kernels then run as NumPy code, one program at a time.

import contextlib
import os
import platform
from functools import partial

import matplotlib.pyplot as plt
import numpy as np
import torch
import torch.nn.functional as F
from torch.utils import benchmark

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
if DEVICE == "cpu":
    os.environ.setdefault("TRITON_INTERPRET", "1")

try:
    import triton
    import triton.language as tl

    TRITON_IMPORT_ERROR = None
except ImportError as error:
    TRITON_IMPORT_ERROR = error
HAVE_TRITON = TRITON_IMPORT_ERROR is None

torch.manual_seed(0)


def device_name():
    if DEVICE == "cuda":
        return torch.cuda.get_device_name()
    return f"CPU ({platform.machine()})"


def skip_or_fail(section, capability, reason):
    """Readers' runs skip a part whose tool is missing; the site's builds require it."""
    if capability in os.environ.get("COURSE_REQUIRE", "").split(","):
        raise RuntimeError(f"{section}: this build requires {capability}, but {reason}")
    print(f"Skipped {section}: {capability} is missing ({reason}).")


if not HAVE_TRITON:
    skip_or_fail("the Triton kernels (PyTorch is still timed)", "triton",
                 f"import triton failed: {TRITON_IMPORT_ERROR}")
elif DEVICE == "cuda":
    print(f"{device_name()}: full sizes, Triton compiled and timed.")
else:
    print(f"{device_name()}: Triton interpreted, so its kernels are checked, not timed.")


# %%
# Timing and the copy ceiling
# ---------------------------
# On CUDA, :func:`triton.testing.do_bench` clears the L2 cache before each
# run, so a small tensor is not served from cache. Everywhere else,
# :mod:`torch.utils.benchmark` does the timing. The ceiling for a
# memory-bound kernel is a plain copy: it reads and writes every byte once.


def time_ms(fn):
    """Median run time of ``fn()`` in milliseconds."""
    if DEVICE == "cuda" and HAVE_TRITON:
        return triton.testing.do_bench(fn, return_mode="median")
    timer = benchmark.Timer(stmt="fn()", globals={"fn": fn})
    return timer.blocked_autorange(min_run_time=0.2).median * 1e3


def copy_bandwidth_gbs(n_bytes):
    """GB/s of ``dst.copy_(src)``: the copy reads and writes ``n_bytes`` each."""
    src = torch.ones(n_bytes // 4, device=DEVICE)
    dst = torch.empty_like(src)
    ms = time_ms(lambda: dst.copy_(src))
    return 2 * n_bytes / ms / 1e6


COPY_GBS = copy_bandwidth_gbs(1 << 30 if DEVICE == "cuda" else 1 << 26)
print(f"measured copy bandwidth: {COPY_GBS:8.1f} GB/s")

# %%
# Part 1: softmax, predicted from a byte count
# --------------------------------------------
# Written as separate PyTorch operations, softmax over the rows of an
# ``M x N`` matrix launches five kernels, and each one reads its input from
# memory and writes its result back: the cost of not fusing, met in
# :ref:`sphx_glr_auto_examples_lecture05_gpus_03_fusion.py`. The comments
# count elements.


def naive_softmax(x):
    """Row softmax of an ``M x N`` matrix, one PyTorch op per line."""
    row_max = x.amax(dim=1)  # read MN, write M (max(dim=1) would also write M indices)
    shifted = x - row_max[:, None]  # read MN + M, write MN
    numerator = torch.exp(shifted)  # read MN, write MN
    denominator = numerator.sum(dim=1)  # read MN, write M
    return numerator / denominator[:, None]  # read MN + M, write MN


# %%
# In total the naive version reads ``5MN + 2M`` elements and writes
# ``3MN + 2M``. A fused kernel that keeps each row on chip reads ``MN`` and
# writes ``MN``. If both run at the copy bandwidth, the fused kernel should be
# faster by the ratio of the byte counts, ``(8MN + 4M) / 2MN = 4 + 2/N``:
# about four times for any row longer than a handful of elements.


def naive_softmax_bytes(m, n, elem_bytes=4):
    return (8 * m * n + 4 * m) * elem_bytes


def fused_softmax_bytes(m, n, elem_bytes=4):
    return 2 * m * n * elem_bytes


print(f"M = 4096 rows, float32\n{'N':>6} {'naive MB':>9} {'fused MB':>9} {'predicted speed-up':>19}")
for n in (1, 781, 4096):
    naive_mb = naive_softmax_bytes(4096, n) / 1e6
    fused_mb = fused_softmax_bytes(4096, n) / 1e6
    print(f"{n:>6} {naive_mb:9.2f} {fused_mb:9.2f} {naive_mb / fused_mb:19.2f}")

# %%
# The fused kernel
# ----------------
# One program handles one row. ``BLOCK_SIZE`` is the row length rounded up to
# a power of two (Triton's ranges must be powers of two); the lanes past the
# end of the row load ``-inf``, which leaves the maximum unchanged and gives
# ``exp(-inf) = 0`` in the sum. Subtracting the row maximum keeps ``exp``
# from overflowing, exactly as in the naive version. More warps share a
# longer row, so each thread holds a bounded number of elements. The row
# index is cast to ``int64`` first: ``tl.program_id`` and a stride below
# ``2**31`` are ``int32``, so ``row * in_row_stride`` would wrap around past
# ``2**31`` elements, a size that the logits of a language model reach
# (32,768 tokens times a vocabulary of 128,000).

if HAVE_TRITON:

    @triton.jit
    def softmax_kernel(out_ptr, in_ptr, in_row_stride, out_row_stride, n_cols,
                       BLOCK_SIZE: tl.constexpr):
        row = tl.program_id(0).to(tl.int64)  # int32 * int32 would wrap past 2**31
        cols = tl.arange(0, BLOCK_SIZE)
        in_bounds = cols < n_cols
        x = tl.load(in_ptr + row * in_row_stride + cols, mask=in_bounds, other=-float("inf"))
        numerator = tl.exp(x - tl.max(x, axis=0))
        y = numerator / tl.sum(numerator, axis=0)
        tl.store(out_ptr + row * out_row_stride + cols, y, mask=in_bounds)

    def triton_softmax(x):
        """Row softmax of a 2-D tensor whose rows are contiguous (rows may lie apart)."""
        if x.ndim != 2 or x.stride(1) != 1:
            raise ValueError(f"expected a 2-D tensor with contiguous rows, got shape "
                             f"{tuple(x.shape)} and strides {x.stride()}: pass x.contiguous()")
        n_rows, n_cols = x.shape
        block_size = triton.next_power_of_2(n_cols)
        num_warps = min(max(block_size // 512, 4), 16)
        y = torch.empty_like(x)
        softmax_kernel[(n_rows,)](y, x, x.stride(0), y.stride(0), n_cols,
                                  BLOCK_SIZE=block_size, num_warps=num_warps)
        return y

# %%
# Check on awkward shapes
# -----------------------
# The irregular shape ``1823 x 781`` means 1823 programs; interpreted on a CPU
# each program costs milliseconds, so the CPU uses ``183 x 781`` instead. The
# other shapes cover one column, a row length far from a power of two, and
# inputs shifted by 1000, where ``exp`` without the max subtraction would
# overflow to ``inf``. The reference is ``torch.softmax`` in float64. Each
# case runs a second time on a view whose rows lie further apart than their
# length, a slice of a wider tensor, so that a kernel that mixed up the row
# strides of its input and output would fail; a transposed input, whose rows
# are not contiguous, is refused with an error.
#
# The entries of a row of length ``N`` are about ``1/N``, so an absolute
# tolerance such as float32's default ``1e-5`` would pass errors of several
# per cent. The check is relative to each entry instead: ``1e-5``, about 80
# float32 rounding steps, more than the few that ``exp``, the sum and the
# division add. Each row must also sum to 1.

SOFTMAX_RTOL = 1e-5
SOFTMAX_TEST_CASES = [  # (rows, columns, shift added to the input)
    (1823 if DEVICE == "cuda" else 183, 781, 0.0),
    (7, 1, 0.0),
    (33, 3000, 0.0),
    (5, 1000, 1000.0),
]


def assert_rows_sum_to_one(y):
    """Every row of a softmax is a probability distribution."""
    row_sums = y.double().sum(dim=1)
    # entries each within SOFTMAX_RTOL of theirs sum to within SOFTMAX_RTOL of 1
    torch.testing.assert_close(row_sums, torch.ones_like(row_sums), rtol=0, atol=SOFTMAX_RTOL)


def assert_softmax_matches(y, x):
    """``y`` against the float64 softmax of ``x``, relative to each entry's size."""
    expected = torch.softmax(x.double(), dim=1)
    # exp's few ulps, a tree-reduced sum (log2 N roundings) and a division, relative to
    # each entry on any device: some tens of eps, under 1e-5 = 84 eps
    torch.testing.assert_close(y.double(), expected, rtol=SOFTMAX_RTOL, atol=0)
    assert_rows_sum_to_one(y)


def check_softmax(rows, cols, shift):
    x = torch.randn(rows, cols, device=DEVICE) + shift
    assert_softmax_matches(triton_softmax(x), x)
    assert_softmax_matches(naive_softmax(x), x)
    sliced = (torch.randn(rows, cols + 13, device=DEVICE) + shift)[:, 7:7 + cols]
    output = triton_softmax(sliced)  # a new, contiguous tensor: its row stride is cols
    if sliced.stride(0) == output.stride(0):
        raise AssertionError("the sliced view's rows are not further apart than the output's")
    assert_softmax_matches(output, sliced)
    assert_softmax_matches(naive_softmax(sliced), sliced)


def check_rejects_transposed_input():
    transposed = torch.randn(64, 33, device=DEVICE).t()
    try:
        triton_softmax(transposed)
    except ValueError as error:
        print(f"a transposed input is refused: {error}")
    else:
        raise AssertionError("triton_softmax accepted a tensor whose rows are not contiguous")


if HAVE_TRITON:
    for rows, cols, shift in SOFTMAX_TEST_CASES:
        check_softmax(rows, cols, shift)
        print(f"softmax {rows:>5} x {cols:<5} (shift {shift:6.1f}), contiguous and sliced: "
              f"Triton and naive match float64 (rtol {SOFTMAX_RTOL:.0e}), rows sum to 1")
    check_rejects_transposed_input()

# %%
# Measure: effective bandwidth against row length
# -----------------------------------------------
# Every implementation is credited with the same ``2MN`` elements, the bytes
# the fused kernel must move, so the naive version shows up at about a quarter
# of the copy ceiling if the prediction holds. The dotted line is that
# prediction: copy bandwidth times ``2MN / (8MN + 4M)``. On a CPU the Triton
# line is absent: interpreted code says nothing about speed. Each output that
# is timed is first checked as above, so no point on the plot comes from a
# wrong result.

SOFTMAX_ROWS = 4096 if DEVICE == "cuda" else 512
SOFTMAX_COLS = ([256, 512, 1024, 2048, 4096, 8192, 16384, 32768] if DEVICE == "cuda"
                else [128, 512, 2048, 8192])


def softmax_implementations():
    implementations = {"torch.softmax": lambda x: torch.softmax(x, dim=1),
                       "naive (5 ops)": naive_softmax}
    if HAVE_TRITON and DEVICE == "cuda":
        implementations["Triton fused"] = triton_softmax
    return implementations


def softmax_bandwidth_table():
    """Effective GB/s of each implementation, per row length."""
    table = {name: [] for name in softmax_implementations()}
    for n_cols in SOFTMAX_COLS:
        x = torch.randn(SOFTMAX_ROWS, n_cols, device=DEVICE)
        for name, softmax in softmax_implementations().items():
            assert_softmax_matches(softmax(x), x)
            ms = time_ms(partial(softmax, x))
            table[name].append(fused_softmax_bytes(SOFTMAX_ROWS, n_cols) / ms / 1e6)
        del x
    return table


softmax_gbs = softmax_bandwidth_table()
print(f"M = {SOFTMAX_ROWS} rows, effective GB/s (copy: {COPY_GBS:.1f})")
print(f"{'N':>6} " + " ".join(f"{name:>14}" for name in softmax_gbs))
for i, n_cols in enumerate(SOFTMAX_COLS):
    print(f"{n_cols:>6} " + " ".join(f"{gbs[i]:14.1f}" for gbs in softmax_gbs.values()))


def legend_below(ax):
    """The legend under the plot, where no measured line can run beneath it."""
    ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.17), ncol=2, frameon=False)


fig, ax = plt.subplots(figsize=(7, 4.8))
for name, gbs in softmax_gbs.items():
    ax.plot(SOFTMAX_COLS, gbs, marker="o", label=name)
ax.axhline(COPY_GBS, color="black", linestyle="--", label="copy bandwidth (measured)")
naive_bound = [COPY_GBS * fused_softmax_bytes(SOFTMAX_ROWS, n) / naive_softmax_bytes(SOFTMAX_ROWS, n)
               for n in SOFTMAX_COLS]
ax.plot(SOFTMAX_COLS, naive_bound, color="gray", linestyle=":", label="naive, predicted from bytes")
ax.set_xscale("log", base=2)
ax.set_ylim(bottom=0)
ax.set_xlabel("row length N (columns, float32)")
ax.set_ylabel("effective bandwidth (GB/s), 2MN x 4 bytes")
note = "" if DEVICE == "cuda" else " (Triton interpreted: not timed)"
ax.set_title(f"Row softmax, M = {SOFTMAX_ROWS}: {device_name()}{note}")
legend_below(ax)
fig.tight_layout()

# %%
# Reading the softmax figure
# --------------------------
# The fused kernel can match or beat the library because it moves the fewest
# bytes possible, one read and one write of each element, and because a row
# of a few thousand float32 values fits in the registers of one program: the
# max, the exponentials and the sum never leave the chip. It is also
# specialised. Triton compiles it once for each value of the ``tl.constexpr``
# ``BLOCK_SIZE``, here the row length rounded up to a power of two, and for
# each pattern of its integer arguments: an argument equal to 1 becomes a
# constant, and one divisible by 16 is marked so, which lets the compiler
# prove that rows start aligned and use wider loads. Row lengths that share a
# ``BLOCK_SIZE`` and that pattern share one compiled kernel; the row length
# itself is a runtime argument that only sets the mask. ``torch.softmax`` is
# a single kernel too, but it must serve every shape and dtype. PyTorch's CUDA
# softmax picks its kernel by row length: a short row is held in one warp's
# registers, a longer one is staged in shared memory if it fits there, and
# otherwise its general kernel passes over each row more than once, leaning on
# the caches. The naive version pays for five round trips to memory, and the
# dotted line shows what that costs by the byte count.
#
# The one-pass kernel stops working when a row no longer fits. One program can
# hold at most the register file of one streaming multiprocessor (256 KB on
# Hopper, from NVIDIA's H100 Tensor Core GPU Architecture whitepaper), shared
# with everything else in flight. Beyond some tens of thousands of columns the
# compiler spills the row to local memory, which lives in DRAM, and the single
# pass quietly becomes several. A kernel for very long rows must loop over the
# row in chunks, keeping a running maximum and a running sum (the online
# softmax that FlashAttention also uses), and read the input more than once.
#
# The byte model counts only memory traffic. On a GPU the naive version can
# beat its dotted line when its temporaries fit in L2 (tens of megabytes on
# Hopper). On a CPU it can fall below the line, because computing ``exp`` on
# one core (the timer runs PyTorch on one thread) and allocating three
# temporaries cost time that the model ignores.
#
# Part 2: tiled matrix multiplication
# -----------------------------------
# Each program computes one ``BLOCK_M x BLOCK_N`` tile of ``C = A @ B``. It
# walks along ``K`` in steps of ``BLOCK_K``, loading a ``BLOCK_M x BLOCK_K``
# tile of ``A`` and a ``BLOCK_K x BLOCK_N`` tile of ``B`` and accumulating
# their product with ``tl.dot`` into a float32 accumulator, so that a sum of
# thousands of 16-bit products keeps float32 precision. After the loop the activation is applied to
# the accumulator while it is still in registers (the fused epilogue), and the
# tile is converted to the output type and stored once.
#
# Rows and columns past the edge of ``A`` and ``B`` are wrapped back into range
# with ``%``: their results are garbage, but they are never stored, and the
# loads in the hot loop need a mask only along ``K``.
#
# The order in which program ids map to tiles matters for the L2 cache.
# Programs running at the same time that share a row of ``A`` tiles or a
# column of ``B`` tiles can serve each other from L2. Row-major order walks
# one long row of ``C`` tiles; grouped order walks ``GROUP_M`` rows of tiles
# column by column, which touches fewer distinct ``A`` and ``B`` tiles per
# wave of programs. ``GROUP_M = 1`` is exactly row-major order.
#
# The activation is GELU with the tanh approximation, used by GPT-2. Since
# ``0.5 (1 + tanh(u)) = sigmoid(2u)``, it needs only ``tl.sigmoid``.

if HAVE_TRITON:

    @triton.jit
    def gelu_tanh(x):
        u = 0.7978845608028654 * (x + 0.044715 * x * x * x)  # sqrt(2/pi) * (...)
        return x * tl.sigmoid(2.0 * u)

    @triton.jit
    def matmul_kernel(a_ptr, b_ptr, c_ptr, M, N, K,
                      stride_am, stride_ak, stride_bk, stride_bn, stride_cm, stride_cn,
                      BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                      GROUP_M: tl.constexpr, ACTIVATION: tl.constexpr):
        # Grouped order; tile_of_program below is the same arithmetic in Python.
        pid = tl.program_id(0)
        num_pid_m = tl.cdiv(M, BLOCK_M)
        num_pid_n = tl.cdiv(N, BLOCK_N)
        programs_per_group = GROUP_M * num_pid_n
        first_pid_m = (pid // programs_per_group) * GROUP_M
        group_rows = tl.minimum(num_pid_m - first_pid_m, GROUP_M)
        pid_m = first_pid_m + (pid % programs_per_group) % group_rows
        pid_n = (pid % programs_per_group) // group_rows

        offs_m = (pid_m * BLOCK_M + tl.arange(0, BLOCK_M)) % M
        offs_n = (pid_n * BLOCK_N + tl.arange(0, BLOCK_N)) % N
        offs_k = tl.arange(0, BLOCK_K)
        a_ptrs = a_ptr + offs_m[:, None] * stride_am + offs_k[None, :] * stride_ak
        b_ptrs = b_ptr + offs_k[:, None] * stride_bk + offs_n[None, :] * stride_bn

        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        for k_step in range(tl.cdiv(K, BLOCK_K)):
            k_left = K - k_step * BLOCK_K
            a = tl.load(a_ptrs, mask=offs_k[None, :] < k_left, other=0.0)
            b = tl.load(b_ptrs, mask=offs_k[:, None] < k_left, other=0.0)
            acc = tl.dot(a, b, acc)
            a_ptrs += BLOCK_K * stride_ak
            b_ptrs += BLOCK_K * stride_bk

        if ACTIVATION == "gelu_tanh":
            acc = gelu_tanh(acc)

        rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
        cols = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
        c_ptrs = c_ptr + rows[:, None] * stride_cm + cols[None, :] * stride_cn
        tl.store(c_ptrs, acc.to(c_ptr.dtype.element_ty),
                 mask=(rows[:, None] < M) & (cols[None, :] < N))

# %%
# Autotuning
# ----------
# The best tile shape depends on the GPU and the problem, so on CUDA
# :func:`triton.autotune` times a handful of configurations the first time it
# sees a new ``(M, N, K)`` and keeps the fastest. The interpreter cannot
# autotune meaningfully, so a CPU launches one small fixed configuration
# (``tl.dot`` needs a ``BLOCK_K`` of at least 16 for 16- and 32-bit inputs; in
# Triton 3.6 ``BLOCK_M`` and ``BLOCK_N`` may be smaller, padded inside the
# Tensor Core instruction); the check further below still runs every
# configuration in the list once.

if HAVE_TRITON:

    def matmul_config(block_m, block_n, block_k, num_stages, num_warps):
        meta = {"BLOCK_M": block_m, "BLOCK_N": block_n, "BLOCK_K": block_k, "GROUP_M": 8}
        return triton.Config(meta, num_stages=num_stages, num_warps=num_warps)

    MATMUL_AUTOTUNE_CONFIGS = [  # (BLOCK_M, BLOCK_N, BLOCK_K, num_stages, num_warps)
        matmul_config(128, 256, 64, 3, 8), matmul_config(256, 128, 64, 3, 8),
        matmul_config(128, 128, 64, 4, 8), matmul_config(128, 128, 32, 4, 4),
        matmul_config(64, 128, 32, 4, 4), matmul_config(64, 64, 32, 4, 4)]
    if DEVICE == "cuda":
        matmul_launcher = triton.autotune(configs=MATMUL_AUTOTUNE_CONFIGS,
                                          key=["M", "N", "K"])(matmul_kernel)
        FIXED_META = {}
    else:
        matmul_launcher = matmul_kernel
        FIXED_META = {"BLOCK_M": 32, "BLOCK_N": 32, "BLOCK_K": 32, "GROUP_M": 4}

    def triton_matmul(a, b, activation="", config=None):
        """``activation(a @ b)`` with ``activation`` in {"", "gelu_tanh"}.

        A ``config`` launches that one configuration, bypassing the autotuner.
        """
        m, k = a.shape
        n = b.shape[1]
        c = torch.empty((m, n), device=a.device, dtype=a.dtype)

        def grid(meta):
            return (triton.cdiv(m, meta["BLOCK_M"]) * triton.cdiv(n, meta["BLOCK_N"]),)

        launcher, meta = ((matmul_launcher, FIXED_META) if config is None
                          else (matmul_kernel, config.all_kwargs()))
        launcher[grid](a, b, c, m, n, k, a.stride(0), a.stride(1), b.stride(0),
                       b.stride(1), c.stride(0), c.stride(1), ACTIVATION=activation, **meta)
        return c

# %%
# Check on awkward shapes
# -----------------------
# ``257 x 129 x 193`` is one past a multiple of 64 in every dimension, so with
# every tile shape in the list the last tile is partial along all three
# dimensions and the masks do work. The reference is computed in float64
# from the same rounded inputs. Inputs are scaled by ``K**-0.25`` so that
# outputs are of order one and a single tolerance fits every shape: 16-bit
# outputs carry a relative rounding error of up to ``2**-8`` (bfloat16). The
# Triton kernel accumulates in float32 and rounds once, so it is allowed twice
# that, ``torch.finfo(dtype).eps``, relative: a 16-bit accumulator would exceed
# it. By default PyTorch lets cuBLAS add split-K partial sums in 16 bits
# (``torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction``), an
# error that grows with the number of partials, which cuBLAS picks; so
# ``torch.matmul`` is checked with float32 sums, and timed with the default.
# It still gets a looser bound on a GPU, because ``F.gelu`` after it rounds a
# second time.


def matmul_dtype():
    if DEVICE == "cpu":
        return torch.float32
    capability = torch.cuda.get_device_capability()
    if capability >= (8, 0):
        return torch.bfloat16
    skip_or_fail("the bfloat16 matmuls", "sm80",
                 "compute capability {}.{} predates bfloat16; float16 instead".format(*capability))
    return torch.float16


MATMUL_DTYPE = matmul_dtype()
# rtol: the output's one rounding (eps / 2) with 2x headroom; atol: float32 accumulation
# of K products of order 1/sqrt(K) on order-one outputs, about sqrt(K) eps (7e-6 at
# K = 2053), which is all a float32 CPU run has
TRITON_MATMUL_TOLERANCE = {"rtol": torch.finfo(MATMUL_DTYPE).eps, "atol": 1e-4}
# on a GPU, the 16-bit rounding of the product and F.gelu's second one: 2 x 2**-9 relative,
# 2.5x headroom, with split-K sums in float32 (below); on a CPU float32 accumulation as above
LIBRARY_MATMUL_TOLERANCE = ({"rtol": 1e-4, "atol": 1e-4} if DEVICE == "cpu"
                            else {"rtol": 1e-2, "atol": 1e-2})


@contextlib.contextmanager
def split_k_sums_in_float32():
    """cuBLAS adds split-K partial sums in float32, not in the 16-bit output type as PyTorch
    allows by default."""
    matmul = torch.backends.cuda.matmul
    defaults = matmul.allow_bf16_reduced_precision_reduction, matmul.allow_fp16_reduced_precision_reduction
    matmul.allow_bf16_reduced_precision_reduction = matmul.allow_fp16_reduced_precision_reduction = False
    try:
        yield
    finally:
        matmul.allow_bf16_reduced_precision_reduction, matmul.allow_fp16_reduced_precision_reduction = defaults
MATMUL_TEST_SHAPES = [(257, 129, 193), (64, 48, 16), (100, 300, 70)]
if DEVICE == "cuda":
    MATMUL_TEST_SHAPES.append((1531, 769, 2053))


def random_operands(m, n, k):
    scale = k ** -0.25
    a = (torch.randn(m, k, device=DEVICE) * scale).to(MATMUL_DTYPE)
    b = (torch.randn(k, n, device=DEVICE) * scale).to(MATMUL_DTYPE)
    return a, b


def check_matmul(m, n, k, config=None):
    a, b = random_operands(m, n, k)
    product = a.double() @ b.double()
    expected = {"": product, "gelu_tanh": F.gelu(product, approximate="tanh")}
    for activation, reference in expected.items():
        result = triton_matmul(a, b, activation, config).double()
        torch.testing.assert_close(result, reference, **TRITON_MATMUL_TOLERANCE)


# %%
# The autotuner only times its configurations; it never checks what they
# compute, and a tile shape that breaks the masks would win the race as
# happily as a correct one. So every configuration is launched directly once
# and checked, not only those that won for the shapes above. On a CPU the
# interpreter runs the same configurations, in float32, which checks their
# index arithmetic but not whether they fit a GPU: that is the compile check's
# job. On a GPU too small for a configuration's tiles, Triton refuses to load
# it, and the autotuner would skip it the same way.


def check_every_matmul_config(m, n, k):
    """Check each autotune configuration; return the ones this device could not load."""
    too_large = []
    for config in MATMUL_AUTOTUNE_CONFIGS:
        try:
            check_matmul(m, n, k, config)
        except triton.runtime.errors.OutOfResources:
            too_large.append(config)
    if len(too_large) == len(MATMUL_AUTOTUNE_CONFIGS):
        raise RuntimeError("no matmul configuration fits this GPU")
    return too_large


# %%
# One practical note for CPUs: with NumPy 2.4 or newer, Triton 3.6's
# interpreter cannot run a ``for`` loop whose bound is a runtime argument, as
# the ``K`` loop is (triton-lang/triton issue 9171). The compiled path on a GPU
# is unaffected. The course pins NumPy 2.3; elsewhere the check says why it
# stops instead of crashing.


def interpreter_cannot_loop(error):
    """The known interpreter bug, and only on a CPU: on CUDA no Triton failure is excused."""
    interpreted = DEVICE == "cpu" and os.environ.get("TRITON_INTERPRET") == "1"
    return interpreted and "0-dimensional arrays" in str(error)


if HAVE_TRITON:
    try:
        for m, n, k in MATMUL_TEST_SHAPES:
            check_matmul(m, n, k)
            print(f"matmul {m:>5} x {n:<5} x {k:<5} {MATMUL_DTYPE!s:>15}: "
                  "plain and GELU epilogue match float64")
        too_large = check_every_matmul_config(*MATMUL_TEST_SHAPES[0])
        print(f"every autotune configuration at {' x '.join(map(str, MATMUL_TEST_SHAPES[0]))}: "
              f"{len(MATMUL_AUTOTUNE_CONFIGS) - len(too_large)} of {len(MATMUL_AUTOTUNE_CONFIGS)} "
              "checked against float64")
        for config in too_large:
            print(f"  not loadable on this GPU (too little shared memory), as the autotuner "
                  f"would skip it: {config}")
    except Exception as error:  # only the known interpreter bug is excused below
        if not interpreter_cannot_loop(error):
            raise
        skip_or_fail("the interpreted matmul check", "triton",
                     f"Triton {triton.__version__}'s interpreter cannot run a loop with a "
                     f"runtime bound under NumPy {np.__version__} (triton-lang/triton#9171); "
                     "use numpy<2.4, or Triton 3.9, whose interpreter runs it")

# %%
# Program order and L2 reuse, counted
# -----------------------------------
# How much does grouped order save? Programs are started roughly in order of
# their id, so take a *wave* of consecutive ids, as many as can run at once
# (one per SM for large tiles), and count the distinct ``A`` and ``B`` tiles the
# wave needs at each step along ``K``. If L2 holds them, that count, not two
# per program, is what the wave reads from DRAM. This is a count, exact for
# the mapping in the kernel; it needs no GPU. On a GPU the wave is its own SM
# count; elsewhere it is 132, the SM count of the H100 SXM5 in NVIDIA's H100
# Tensor Core GPU Architecture whitepaper, which the H200 shares.


def tile_of_program(pid, num_pid_m, num_pid_n, group_m):
    """The kernel's program-id to (tile row, tile column) mapping, in Python."""
    programs_per_group = group_m * num_pid_n
    first_pid_m = (pid // programs_per_group) * group_m
    group_rows = min(num_pid_m - first_pid_m, group_m)
    return (first_pid_m + (pid % programs_per_group) % group_rows,
            (pid % programs_per_group) // group_rows)


def tiles_per_wave(size, tile, group_m, wave):
    """Mean distinct (A tiles, B tiles) per K step over the full waves of a square matmul."""
    num_pid = -(-size // tile)
    tiles = [tile_of_program(pid, num_pid, num_pid, group_m) for pid in range(num_pid**2)]
    if sorted(tiles) != [(m, n) for m in range(num_pid) for n in range(num_pid)]:
        raise RuntimeError("the program order does not visit every tile exactly once")
    last_start = max(len(tiles) - wave, 0)  # drop a partial last wave, keep at least one
    waves = [tiles[start:start + wave] for start in range(0, last_start + 1, wave)]
    a_tiles = sum(len({m for m, _ in w}) for w in waves) / len(waves)
    b_tiles = sum(len({n for _, n in w}) for w in waves) / len(waves)
    return a_tiles, b_tiles


WAVE = torch.cuda.get_device_properties(0).multi_processor_count if DEVICE == "cuda" else 132
WAVE_SOURCE = device_name() if DEVICE == "cuda" else "an H200's SMs, modeled"
TILE = 128
MODEL_SIZES = [2048, 3072, 4096, 6144, 8192, 12288, 16384]
GROUP_SIZES = [1, 4, 8, 16]

print(f"wave = {WAVE} programs, {TILE}x{TILE} tiles, size 4096: distinct tiles per K step")
print(f"{'GROUP_M':>8} {'A tiles':>8} {'B tiles':>8} {'total':>7} {'/ (2 x wave)':>13}")
for group_m in GROUP_SIZES:
    a_tiles, b_tiles = tiles_per_wave(4096, TILE, group_m, WAVE)
    total = a_tiles + b_tiles
    print(f"{group_m:>8} {a_tiles:8.1f} {b_tiles:8.1f} {total:7.1f} {total / (2 * WAVE):13.2f}")

fig, ax = plt.subplots(figsize=(7, 4.8))
for group_m in GROUP_SIZES:
    totals = [sum(tiles_per_wave(size, TILE, group_m, WAVE)) for size in MODEL_SIZES]
    label = "row-major (GROUP_M = 1)" if group_m == 1 else f"grouped, GROUP_M = {group_m}"
    ax.plot(MODEL_SIZES, totals, marker="o", label=label)
ax.axhline(2 * WAVE, color="black", linestyle="--", label="no sharing: 2 per program")
ax.set_xscale("log", base=2)
ax.set_ylim(bottom=0)
ax.set_xlabel("matrix size M = N (elements)")
ax.set_ylabel("distinct A + B tiles per K step per wave")
ax.set_title(f"Grouped order, one wave = {WAVE} programs ({WAVE_SOURCE})")
legend_below(ax)
fig.tight_layout()

# %%
# Row-major order fills one row of ``C`` tiles after another, so a wave
# needs one ``B`` tile per column it covers. Once a row of tiles is as long as
# a wave, that is one ``B`` tile per program and the sharing is gone. Grouped
# order keeps the wave inside a band ``GROUP_M`` tiles tall, so ``A`` tiles are
# shared along a row and ``B`` tiles down a column, and the count stays flat
# as the matrices grow. The band must be tall enough: if ``GROUP_M`` times the
# row length of tiles is smaller than the wave, the wave still spans every
# column and grouping saves nothing (for a wave of 132 at size 4096, the
# ``GROUP_M = 4`` row of the table).
# Whether the saving shows up in time depends on whether the tiles really stay
# in L2 and on how close the kernel is to being memory-bound.
#
# Measure: TFLOP/s against size
# -----------------------------
# A square matmul of size ``S`` does ``2 S^3`` floating-point operations. On
# CUDA the autotuned Triton kernel is timed beside ``torch.matmul`` (cuBLAS)
# in 16-bit, and the table gives the fraction of the library's rate. On a CPU
# only ``torch.matmul`` in float32 is timed. At every size, each product that
# is timed is also checked against float64.

MATMUL_SIZES = [256, 512, 1024, 2048, 3072, 4096] if DEVICE == "cuda" else [128, 256, 512, 1024]


def matmul_tflops_table():
    """TFLOP/s of each implementation, per square size."""
    table = {"torch.matmul": []}
    if HAVE_TRITON and DEVICE == "cuda":
        table["Triton"] = []
    for size in MATMUL_SIZES:
        a, b = random_operands(size, size, size)
        reference = a.double() @ b.double()
        for name, rates in table.items():
            matmul, tolerance = ((torch.matmul, LIBRARY_MATMUL_TOLERANCE) if name == "torch.matmul"
                                 else (triton_matmul, TRITON_MATMUL_TOLERANCE))
            with split_k_sums_in_float32():
                product = matmul(a, b).double()
            torch.testing.assert_close(product, reference, **tolerance)
            rates.append(2 * size**3 / time_ms(partial(matmul, a, b)) / 1e9)
    return table


matmul_tflops = matmul_tflops_table()
print(f"{'size':>6} " + " ".join(f"{name:>13}" for name in matmul_tflops)
      + ("  Triton / torch" if len(matmul_tflops) > 1 else ""))
for i, size in enumerate(MATMUL_SIZES):
    rates = [tflops[i] for tflops in matmul_tflops.values()]
    ratio = f"  {rates[1] / rates[0]:14.2f}" if len(rates) > 1 else ""
    print(f"{size:>6} " + " ".join(f"{rate:13.2f}" for rate in rates) + ratio)

fig, ax = plt.subplots(figsize=(7, 4.8))
for name, tflops in matmul_tflops.items():
    ax.plot(MATMUL_SIZES, tflops, marker="o", label=name)
ax.set_xscale("log", base=2)
ax.set_ylim(bottom=0)
ax.set_xlabel("matrix size M = N = K (elements)")
ax.set_ylabel(f"TFLOP/s ({str(MATMUL_DTYPE).removeprefix('torch.')})")
note = "" if DEVICE == "cuda" else " (Triton interpreted: not timed)"
ax.set_title(f"Square matmul: {device_name()}{note}")
legend_below(ax)
fig.tight_layout()

# %%
# The fused epilogue, measured
# ----------------------------
# Without fusion, the activation is a second kernel that reads and writes the
# whole output again. On CUDA, compare at the largest size.


def epilogue_comparison(size):
    a, b = random_operands(size, size, size)
    reference = F.gelu(a.double() @ b.double(), approximate="tanh")
    with split_k_sums_in_float32():
        unfused = F.gelu(a @ b, approximate="tanh").double()
    torch.testing.assert_close(unfused, reference, **LIBRARY_MATMUL_TOLERANCE)
    torch.testing.assert_close(triton_matmul(a, b, "gelu_tanh").double(), reference,
                               **TRITON_MATMUL_TOLERANCE)
    unfused_ms = time_ms(lambda: F.gelu(a @ b, approximate="tanh"))
    fused_ms = time_ms(lambda: triton_matmul(a, b, "gelu_tanh"))
    print(f"GELU(A @ B), size {size}:")
    print(f"  torch.matmul then F.gelu : {unfused_ms:8.3f} ms")
    print(f"  Triton, fused epilogue   : {fused_ms:8.3f} ms")


if HAVE_TRITON and DEVICE == "cuda":
    epilogue_comparison(MATMUL_SIZES[-1])
else:
    print("Epilogue timing needs a CUDA GPU with Triton: skipped.")

# %%
# Reading the matmul figure
# -------------------------
# On a GPU, small matrices give too few tiles to fill every SM, so both
# curves start low. At the larger sizes a page of Triton with a tuned tile
# shape should come close to cuBLAS; the last column of the table says how
# close on this machine. What gap remains comes from what cuBLAS does beyond
# this kernel on Hopper, such as TMA loads and warp-specialized pipelines. At
# these sizes the matmul is compute-bound, so the fused epilogue saves only
# one read and one write of ``C``: little next to ``2MNK`` FLOPs, and more the
# smaller ``K`` is. On a CPU, the figure shows what PyTorch's float32 matmul
# gets from the cores of this machine; the Triton kernel ran there only to
# show that it is correct.

# %%
# Key figures
# -----------
# The numbers this example exists to measure, collected for the course's GPU check.

KEY_SOFTMAX_COLS = 4096 if DEVICE == "cuda" else 2048
softmax_at_key = {name: gbs[SOFTMAX_COLS.index(KEY_SOFTMAX_COLS)] for name, gbs in softmax_gbs.items()}
largest = MATMUL_SIZES[-1]
KEY_FIGURES = {
    "device": device_name(),
    "copy_GBps": COPY_GBS,
    f"softmax_torch_N{KEY_SOFTMAX_COLS}_GBps": softmax_at_key["torch.softmax"],
    f"softmax_naive_N{KEY_SOFTMAX_COLS}_fraction_of_copy_bw": softmax_at_key["naive (5 ops)"] / COPY_GBS,
    f"matmul_torch_{largest}_TFLOPps": matmul_tflops["torch.matmul"][-1],
    "matmul_dtype": str(MATMUL_DTYPE).removeprefix("torch."),
}
if "Triton fused" in softmax_at_key:
    triton_gbs = softmax_at_key["Triton fused"]
    KEY_FIGURES[f"softmax_triton_N{KEY_SOFTMAX_COLS}_GBps"] = triton_gbs
    KEY_FIGURES[f"softmax_triton_N{KEY_SOFTMAX_COLS}_fraction_of_copy_bw"] = triton_gbs / COPY_GBS
    KEY_FIGURES[f"softmax_triton_over_torch_N{KEY_SOFTMAX_COLS}"] = (
        triton_gbs / softmax_at_key["torch.softmax"])
if "Triton" in matmul_tflops:
    KEY_FIGURES[f"matmul_triton_{largest}_TFLOPps"] = matmul_tflops["Triton"][-1]
    KEY_FIGURES[f"matmul_triton_fraction_of_torch_{largest}"] = (
        matmul_tflops["Triton"][-1] / matmul_tflops["torch.matmul"][-1])

# The Triton calls of the CUDA branch, for the course's ahead-of-time compile check: it
# calls each host function on shape-only tensors, with DEVICE == "cuda", and compiles
# every launch, and every autotune configuration, for five GPU generations.
# (host function, [(shape, dtype)], keywords)
GPU_LAUNCHES = (
    [("triton_softmax", [((rows, cols), torch.float32)], {}) for rows, cols, _ in SOFTMAX_TEST_CASES]
    + [("triton_softmax", [((SOFTMAX_ROWS, cols), torch.float32)], {}) for cols in SOFTMAX_COLS]
    + [("triton_matmul", [((m, k), MATMUL_DTYPE), ((k, n), MATMUL_DTYPE)], {"activation": activation})
       for m, n, k in MATMUL_TEST_SHAPES for activation in ("", "gelu_tanh")]
    + [("triton_matmul", [((size, size), MATMUL_DTYPE)] * 2, {}) for size in MATMUL_SIZES]
    + [("triton_matmul", [((largest, largest), MATMUL_DTYPE)] * 2, {"activation": "gelu_tanh"})]
)
