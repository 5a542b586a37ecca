"""
Fewer bytes: precision and access patterns
==========================================

A memory-bound kernel runs as fast as it can move bytes. We cut the bytes
in half by storing bfloat16 instead of float32, and then waste bytes on
purpose by reading memory with a stride. Afterwards you can predict both
effects from the size of a number and the size of a memory transaction.

**Requirements.** Full version: a CUDA GPU with bfloat16 support (compute
capability 8.0 or newer). A CPU shows the same byte accounting at smaller
sizes; whether bfloat16 arithmetic is fast there depends on the CPU. On a T4
(compute capability 7.5, as on free Colab notebooks), which has no native
bfloat16, the precision section times float32 alone and skips the bfloat16
checks and ratios; the coalescing section runs as on any CUDA GPU.
"""

# %%
# Setup
# -----
# The hardware moves memory in fixed-size pieces: a CPU moves 64-byte cache
# lines, and an NVIDIA GPU moves 32-byte sectors between L2 and its SMs
# (NVIDIA CUDA C++ Best Practices Guide, "Coalesced Access to Global
# Memory"). That size is the ``TRANSACTION_BYTES`` of the model below.

import contextlib
import math
import os
import platform

import matplotlib.pyplot as plt
import torch
from torch.utils.benchmark import Timer

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
torch.manual_seed(0)

if DEVICE == "cuda":
    ELEMENTWISE_SIZES = [1 << k for k in range(18, 29, 2)]  # 256 Ki .. 256 Mi elements
    MATMUL_SIZES = [1024, 2048, 4096, 8192]
    STRIDED_BUFFER_ELEMENTS = 1 << 30  # 4 GiB of float32
    TRANSPOSE_SHAPE = (16381, 16383)
    TRANSACTION_BYTES = 32  # L2 sector
    COPY_ELEMENTS = 1 << 28
    BF16_OK = torch.cuda.is_bf16_supported(including_emulation=False)
else:
    ELEMENTWISE_SIZES = [1 << k for k in range(16, 25, 2)]  # 64 Ki .. 16 Mi elements
    MATMUL_SIZES = [256, 512, 1024]
    STRIDED_BUFFER_ELEMENTS = 1 << 26  # 256 MiB, well past the last-level cache
    TRANSPOSE_SHAPE = (4093, 4091)
    TRANSACTION_BYTES = 64  # cache line
    COPY_ELEMENTS = 1 << 24
    BF16_OK = True
STRIDES = [1, 2, 4, 8, 16, 32, 64]
BF16_RTOL = 1.6e-2  # PyTorch's default relative tolerance for bfloat16
# float32 matmuls in full FP32, PyTorch's default, whatever ran before in this process
torch.backends.cuda.matmul.allow_tf32 = False


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
else:
    DEVICE_NAME = f"{cpu_model_name()} CPU, {torch.get_num_threads()} threads"


def median_seconds(stmt, min_run_time=0.1, **names):
    """Median time of ``stmt`` with torch.utils.benchmark, using all threads."""
    timer = Timer(stmt, globals={"torch": torch, **names}, num_threads=torch.get_num_threads())
    return timer.blocked_autorange(min_run_time=min_run_time).median


def copy_bandwidth(n_elements):
    src = torch.rand(n_elements, device=DEVICE)
    dst = torch.empty_like(src)
    return 2 * src.nbytes / median_seconds("dst.copy_(src)", src=src, dst=dst)


print(f"device: {DEVICE_NAME}, torch {torch.__version__}")
COPY_GBS = copy_bandwidth(COPY_ELEMENTS) / 1e9
print(f"copy bandwidth (ceiling): {COPY_GBS:.1f} GB/s")


def skip_or_fail(section, capability, reason):
    """Readers' runs skip a part whose tool is missing; the site's builds require it."""
    if capability in os.environ.get("COURSE_REQUIRE", "").split(","):
        raise RuntimeError(f"{section}: this build requires {capability}, but {reason}")
    print(f"Skipped {section}: {capability} is missing ({reason}).")


if not BF16_OK:  # the whole section is about bfloat16, so float32 alone stays
    skip_or_fail("the precision section (float32 against bfloat16)", "sm80",
                 "compute capability {}.{} has no native bfloat16".format(
                     *torch.cuda.get_device_capability()))

# %%
# Predict: half the bytes, half the time?
# ---------------------------------------
# A residual add, ``torch.add(x, y, out=out)``, reads two numbers and
# writes one per element: ``3 n x 4`` bytes in float32, ``3 n x 2`` bytes in
# bfloat16. It does one addition per 12 (or 6) bytes, far left of any ridge,
# so time should be proportional to bytes, and bfloat16 should take half the
# time.
#
# A square matrix multiply of size ``n`` does ``2 n^3`` FLOPs on ``3 n^2``
# numbers. For large ``n`` it is compute-bound, so halving the bytes alone
# buys little. What matters is whether the hardware multiplies bfloat16
# faster than float32. GPU tensor cores do: NVIDIA's H100 datasheet lists
# BF16 at 1,979 TFLOP/s *with sparsity*, so about 989 dense, against 67 for
# FP32, about 15 times. PyTorch keeps float32 matmuls in full FP32 by
# default; TF32 has to be switched on, since torch 2.9 with
# ``torch.backends.cuda.matmul.fp32_precision = "tf32"``. cuDNN
# convolutions, by contrast, use TF32 unless told otherwise. CPUs differ: some have
# bfloat16 dot-product instructions, and the rest convert to float32 and can
# end up slower than plain float32.
#
# Verify first
# ------------
# Before timing, check that bfloat16 gives the float32 answer to bfloat16
# accuracy. bfloat16 keeps 8 significant bits, so one rounding is off by up
# to ``u = 2^-8``, about 0.4%. The tolerances follow from that, with
# deliberately irregular shapes:
#
# - add: rounding the inputs moves ``x + y`` by at most ``u (|x| + |y|)``,
#   and rounding the output by at most ``u |x + y|``. A correct add comes
#   close to the sum of the two, so we hold every element to twice it (with
#   a hair more for the products of roundings). Rounding to nearest also
#   leaves magnitudes unchanged on average, so the mean change of
#   ``|x + y|``, each element's over its bound, must stay within what chance
#   allows ``n`` errors of at most ``u``: ``6 u / sqrt(n)``, plus ``u^2`` for
#   second-order effects. An add that truncates instead of rounding misses
#   that by a factor of about 19 (truncating its result) to 47 (its inputs
#   too).
# - matmul with inner size ``K``: each of the ``K`` products carries the
#   rounding of its two inputs, and these errors add up like a random walk,
#   to a few ``u sqrt(K)`` for standard normal inputs. We allow
#   ``atol = 8 u sqrt(K)`` on top of the relative tolerance. A wrong result
#   (a transposed operand, a missing block) would miss by about ``sqrt(K)``.
#   PyTorch also lets cuBLAS add the partial sums of a split-K product in
#   bfloat16, an error that grows with the number of partials cuBLAS picks:
#   the check turns that off, and the timings keep PyTorch's default.

BF16_UNIT_ROUNDOFF = 2.0**-8


@contextlib.contextmanager
def split_k_sums_in_float32():
    """cuBLAS adds split-K partial sums in float32, not in the 16-bit output type as PyTorch allows."""
    matmul = torch.backends.cuda.matmul
    defaults = matmul.allow_bf16_reduced_precision_reduction, matmul.allow_fp16_reduced_precision_reduction
    matmul.allow_bf16_reduced_precision_reduction = matmul.allow_fp16_reduced_precision_reduction = False
    try:
        yield
    finally:
        matmul.allow_bf16_reduced_precision_reduction, matmul.allow_fp16_reduced_precision_reduction = defaults


def check_bf16_add(n):
    x = torch.randn(n, device=DEVICE)
    y = torch.randn(n, device=DEVICE)
    reference = x.double() + y.double()
    result = (x.bfloat16() + y.bfloat16()).double()
    u = BF16_UNIT_ROUNDOFF
    scale = x.abs().double() + y.abs().double() + reference.abs()  # each element's bound, over u
    # worst case u (|x| + |y| + |x + y|) (1 + 2u), which a correct add nearly reaches: allowed twice
    torch.testing.assert_close(result / scale, reference / scale, rtol=0, atol=2 * u * (1 + 2 * u))
    # rounding to nearest is unbiased: Hoeffding for n terms within +-u, and u^2 of second order
    magnitude_bias = ((result.abs() - reference.abs()) / scale).mean()
    torch.testing.assert_close(magnitude_bias, torch.zeros_like(magnitude_bias), rtol=0,
                               atol=6 * u / math.sqrt(n) + u**2)


def check_bf16_matmul(m, k, n):
    a = torch.randn(m, k, device=DEVICE)
    b = torch.randn(k, n, device=DEVICE)
    reference = a.double() @ b.double()
    # float32, TF32 off: K roundings of partial sums ~sqrt(K) random-walk to ~K u32 = 6e-5 << 1e-4 sqrt(K)
    torch.testing.assert_close((a @ b).double(), reference, rtol=1e-4, atol=1e-4 * math.sqrt(k))
    # bfloat16: the inputs' roundings random-walk to ~0.6 u sqrt(K), the output's is within BF16_RTOL (4u).
    # Split-K partials added in bfloat16 would add ~0.4 u sqrt(K (s + 1) / 2) for s partials (cuBLAS's
    # choice), up to 0.9 of the tolerance at s = 16 (simulated), so the check sums them in float32
    with split_k_sums_in_float32():
        result = a.bfloat16() @ b.bfloat16()
    torch.testing.assert_close(result.double(), reference, rtol=BF16_RTOL,
                               atol=8 * BF16_UNIT_ROUNDOFF * math.sqrt(k))


if BF16_OK:
    check_bf16_add(1_000_003)
    check_bf16_matmul(517, 1031, 263)
    print("bfloat16 add and matmul agree with float64 within bfloat16 tolerance")

# %%
# Measure
# -------
# We time the add over a range of sizes and matmul at a few sizes, in both
# dtypes. The add writes into a preallocated ``out``, so no allocation is
# timed.


def time_add(n, dtype):
    x = torch.randn(n, device=DEVICE, dtype=dtype)
    y = torch.randn(n, device=DEVICE, dtype=dtype)
    out = torch.empty_like(x)
    return median_seconds("torch.add(x, y, out=out)", x=x, y=y, out=out)


def time_matmul(n, dtype):
    a = torch.randn(n, n, device=DEVICE, dtype=dtype)
    b = torch.randn(n, n, device=DEVICE, dtype=dtype)
    return median_seconds("a @ b", a=a, b=b)


DTYPES = [torch.float32, torch.bfloat16] if BF16_OK else [torch.float32]
add_seconds = {d: [time_add(n, d) for n in ELEMENTWISE_SIZES] for d in DTYPES}
matmul_seconds = {d: [time_matmul(n, d) for n in MATMUL_SIZES] for d in DTYPES}

print(f"\n{'add n':>14} {'dtype':>9} {'MB moved':>9} {'time ms':>9} {'GB/s':>7} {'% copy':>7}")
for d in DTYPES:
    for n, seconds in zip(ELEMENTWISE_SIZES, add_seconds[d]):
        moved = 3 * n * d.itemsize
        print(f"{n:>14,} {str(d)[6:]:>9} {moved / 1e6:>9.1f} {seconds * 1e3:>9.3f} "
              f"{moved / seconds / 1e9:>7.1f} {100 * moved / seconds / 1e9 / COPY_GBS:>7.1f}")

print(f"\n{'matmul n':>9} {'dtype':>9} {'time ms':>9} {'TFLOP/s':>8}")
for d in DTYPES:
    for n, seconds in zip(MATMUL_SIZES, matmul_seconds[d]):
        print(f"{n:>9} {str(d)[6:]:>9} {seconds * 1e3:>9.3f} {2 * n**3 / seconds / 1e12:>8.3f}")

if BF16_OK:
    add_ratio = add_seconds[torch.float32][-1] / add_seconds[torch.bfloat16][-1]
    matmul_ratio = matmul_seconds[torch.float32][-1] / matmul_seconds[torch.bfloat16][-1]
    print(f"\ntime float32 / time bfloat16: add {add_ratio:.2f}x at {ELEMENTWISE_SIZES[-1]:,} "
          f"elements, matmul {matmul_ratio:.2f}x at n={MATMUL_SIZES[-1]}")

# %%
# Bytes against time
# ------------------

fig, (ax_bytes, ax_matmul) = plt.subplots(1, 2, figsize=(11, 4.5))
for d, marker in zip(DTYPES, "os"):
    moved = [3 * n * d.itemsize for n in ELEMENTWISE_SIZES]
    ax_bytes.loglog(moved, [s * 1e3 for s in add_seconds[d]], marker + "-",
                    label=f"add, {str(d)[6:]}")
    ax_matmul.plot(MATMUL_SIZES, [2 * n**3 / s / 1e12 for n, s in zip(MATMUL_SIZES, matmul_seconds[d])],
                   marker + "-", label=f"matmul, {str(d)[6:]}")
all_moved = [3 * n * d.itemsize for n in ELEMENTWISE_SIZES for d in DTYPES]
model_moved = [min(all_moved), max(all_moved)]
ax_bytes.loglog(model_moved, [b / COPY_GBS / 1e6 for b in model_moved], ":", color="gray",
                label="bytes / copy bandwidth")
ax_bytes.set_xlabel("bytes moved (read + write)")
ax_bytes.set_ylabel("time (ms)")
ax_bytes.set_title("Memory-bound: time follows bytes")
ax_matmul.set_xscale("log", base=2)
ax_matmul.set_xlabel("matrix size n (n x n times n x n)")
ax_matmul.set_ylabel("throughput (TFLOP/s)")
ax_matmul.set_title("Compute-bound: time follows the arithmetic units")
for ax in (ax_bytes, ax_matmul):
    ax.legend(fontsize=8)
fig.suptitle(f"float32 vs bfloat16 - {DEVICE_NAME}")
fig.tight_layout()

# %%
# Predict: strided reads
# ----------------------
# Now keep the dtype fixed (float32, 4 bytes) and read every ``s``-th
# element of a large buffer, summing them: ``buffer[::s].sum()``. Only
# ``4`` bytes per element are *useful*, but memory delivers whole
# transactions of ``T`` bytes (``TRANSACTION_BYTES``). Consecutive useful
# elements are ``4s`` bytes apart, so the memory system fetches
# ``min(4s, T)`` bytes for each useful 4. The model for useful bandwidth is
#
# .. math:: \text{useful GB/s} \approx \text{GB/s at stride 1} \times \frac{4}{\min(4s,\ T)}
#
# It halves with every doubling of the stride until ``4s = T``, and stays
# flat after that, at one useful element per transaction. The buffer size is
# fixed, so even the largest stride touches far more memory than the
# last-level cache holds. The last column of the table turns each
# measurement back into bytes: ``4 x (GB/s at stride 1) / (GB/s at stride
# s)`` is what the memory system really moved per useful element, to be
# compared with ``min(4s, T)``.


def strided_sum_seconds(buffer, stride):
    view = buffer[::stride]
    return median_seconds("view.sum()", view=view), view.numel()


buffer = torch.rand(STRIDED_BUFFER_ELEMENTS, device=DEVICE)
# float32 sum of positive terms: relative error at most u32 per addition in sequence. ATen's cascade
# (CPU) makes few; a GPU adds a few hundred per thread, then trees: < 2e-5, against rtol 1e-4
torch.testing.assert_close(buffer[::7].sum().double(), buffer[::7].double().sum(), rtol=1e-4, atol=0)
strided = [strided_sum_seconds(buffer, s) for s in STRIDES]
useful_gbs = [4 * n / s / 1e9 for s, n in strided]
model_gbs = [useful_gbs[0] * 4 / min(4 * s, TRANSACTION_BYTES) for s in STRIDES]
del buffer

# Bytes the memory system moved per useful 4-byte element, relative to stride 1
bytes_per_useful = [4 * useful_gbs[0] / gbs for gbs in useful_gbs]

print(f"\n{'stride':>6} {'useful MB':>10} {'time ms':>9} {'useful GB/s':>12} {'model GB/s':>11} "
      f"{'% copy':>7} {'B moved/elem':>13}")
for stride, (seconds, n), gbs, model, moved in zip(STRIDES, strided, useful_gbs, model_gbs,
                                                   bytes_per_useful):
    print(f"{stride:>6} {4 * n / 1e6:>10.1f} {seconds * 1e3:>9.3f} {gbs:>12.1f} {model:>11.1f} "
          f"{100 * gbs / COPY_GBS:>7.1f} {moved:>13.1f}")
print(f"measured floor at stride {STRIDES[-1]}: 4 useful bytes in every {bytes_per_useful[-1]:.0f} moved "
      f"(the model's floor: 4 in {TRANSACTION_BYTES})")

# %%
# Useful bandwidth against stride
# -------------------------------

fig, ax = plt.subplots(figsize=(7, 4.5))
ax.plot(STRIDES, useful_gbs, "o-", label="measured: buffer[::s].sum()")
ax.plot(STRIDES, model_gbs, "--", color="gray",
        label=f"model: {TRANSACTION_BYTES}-byte transactions, 4 / min(4s, {TRANSACTION_BYTES})")
ax.axhline(COPY_GBS, color="tab:red", ls=":", label="copy bandwidth (measured)")
ax.set_xscale("log", base=2)
ax.set_yscale("log")
ax.set_xlabel("stride s (elements of 4 bytes)")
ax.set_ylabel("useful bandwidth (GB/s)")
ax.set_title(f"Strided float32 reads - {DEVICE_NAME}")
ax.legend(fontsize=8)
fig.tight_layout()

# %%
# The transpose case
# ------------------
# ``x.t()`` is free: it only swaps the strides. ``x.t().contiguous()`` has to
# copy, and then one side of the copy walks memory with a stride of a whole
# row. Writes are contiguous and reads are strided, or the other way round.
# We time that copy into a preallocated buffer, ``dst_t.copy_(x.t())``
# (``.contiguous()`` without the allocation), against ``dst.copy_(x)``,
# which moves exactly the same bytes with both sides contiguous.


def copy_rates(shape):
    x = torch.rand(shape, device=DEVICE)
    dst = torch.empty_like(x)
    dst_t = torch.empty(shape[::-1], device=DEVICE)
    dst_t.copy_(x.t())
    torch.testing.assert_close(dst_t, x.t().contiguous(), rtol=0, atol=0)  # a copy: exact
    moved = 2 * x.nbytes
    return {
        "dst.copy_(x)": moved / median_seconds("dst.copy_(x)", x=x, dst=dst) / 1e9,
        "dst_t.copy_(x.t())": moved / median_seconds("dst_t.copy_(x.t())", x=x, dst_t=dst_t) / 1e9,
    }


transpose_gbs = copy_rates(TRANSPOSE_SHAPE)
print(f"\n{'copy of ' + str(TRANSPOSE_SHAPE):>22} {'GB/s':>8} {'% copy':>7}")
for name, gbs in transpose_gbs.items():
    print(f"{name:>22} {gbs:>8.1f} {100 * gbs / COPY_GBS:>7.1f}")

# %%
# Read the result
# ---------------
# **Precision.** In the first figure the float32 and bfloat16 add points
# of the largest tensors fall on one line of time against bytes. A
# memory-bound kernel costs its bytes, whatever the dtype, so bfloat16 takes
# about half the time (the ratio printed above). On a GPU the smallest
# tensors sit on the launch floor of
# :ref:`sphx_glr_auto_examples_lecture05_gpus_04_overhead_and_intensity.py`,
# where the dtype makes no difference. On a CPU they fit in the caches, and
# there converting between bfloat16 and float32 can cost more time than the
# saved bytes. The matmul panel answers a different
# question: is there hardware that multiplies bfloat16 faster? On a GPU the
# tensor cores make bfloat16 many times faster than FP32. On a CPU the answer
# is in the table: with bfloat16 dot-product instructions and a library that
# uses them, bfloat16 gains; without them, converting every element costs
# time and float32 can win. The check above guarantees only bfloat16 accuracy,
# about 2 to 3 significant digits. That is why training keeps master weights,
# softmax statistics and reductions in float32.
#
# **Access pattern.** Up to ``4s = T``, useful bandwidth halves with every
# doubling of the stride, as the model predicts: the whole span between
# useful elements is fetched anyway. On a GPU a warp's 32 loads are
# *coalesced* into as few 32-byte sectors as possible. At stride 1 they need
# four sectors; at stride 8 or more they need 32, and seven eighths of every
# sector is thrown away. A CPU wastes in the same way, in 64-byte lines.
# Beyond ``4s = T`` the model flattens, because it assumes the hardware
# fetches exactly one transaction per useful element. The last column of the
# table shows whether this machine does. If the bytes moved per element keep
# growing past ``T``, the hardware fetches more than was asked for. A CPU's
# prefetchers pull in neighbouring lines, or the next lines of a detected
# stride. A GPU's L2 can fetch from DRAM in units larger than one sector. The
# lesson is the same either way: the only useful bandwidth is contiguous
# bandwidth. The transpose table shows the same effect in a common
# operation: ``.contiguous()`` on a transposed view is slower than a plain
# copy of the same bytes. Fast transpose kernels stage a tile in on-chip
# memory (shared memory on a GPU) so that both the reads and the writes are
# contiguous.

KEY_FIGURES = {
    "device": DEVICE_NAME,
    "copy_GBps": COPY_GBS,
    "stride1_sum_GBps": useful_gbs[0],
    f"stride{STRIDES[-1]}_sum_useful_GBps": useful_gbs[-1],
    f"stride{STRIDES[-1]}_bytes_moved_per_useful_element": bytes_per_useful[-1],
    "transposed_copy_over_plain_copy": transpose_gbs["dst_t.copy_(x.t())"] / transpose_gbs["dst.copy_(x)"],
}
if BF16_OK:
    KEY_FIGURES["add_time_fp32_over_bf16"] = add_ratio
    KEY_FIGURES["matmul_time_fp32_over_bf16"] = matmul_ratio
