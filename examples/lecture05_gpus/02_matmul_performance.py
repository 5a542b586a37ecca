"""
Matmul speed depends on the shape, not only the size
====================================================

A square matmul of size :math:`n` does :math:`2n^3` FLOPs, yet its rate in
TFLOP/s is not a smooth function of :math:`n`. This example measures two
effects: alignment (which powers of two divide :math:`n`) and wave
quantisation (how many tiles the output splits into, compared with the number
of streaming multiprocessors), and compares the second with a simple model.

**Requirements.** Full version: a CUDA GPU (bf16 needs compute capability 8.0
or newer). On a CPU the page measures float32 matmuls up to about
:math:`n = 1000` and draws the wave model for an H200 without measuring it. On
a T4 (compute capability 7.5, as on free Colab notebooks) it times float16
matmuls instead of bfloat16 ones.
"""

# %%
# Setup
# -----
# Sizes are built as ``base + offset`` with offsets 0, 1, 2, 4, ..., 64, so
# that every alignment class (odd, divisible by 2 but not 4, ...) appears at
# every scale.

import contextlib
import itertools
import math
import platform

import matplotlib.pyplot as plt
import torch
from torch.utils import benchmark

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
torch.manual_seed(0)

OFFSETS = (0, 1, 2, 4, 8, 16, 32, 64)
if DEVICE == "cuda":
    props = torch.cuda.get_device_properties(0)
    DEVICE_NAME = props.name
    SM_COUNT = props.multi_processor_count
    DTYPE = torch.bfloat16 if props.major >= 8 else torch.float16
    if DTYPE == torch.float16:
        print("This GPU has no bf16 tensor cores (needs compute capability 8.0): float16 instead.")
    BASES = range(1024, 4097, 256)
    MIN_RUN_TIME = 0.02  # about 200 sizes are timed; keeps the page under a minute
    print(f"CUDA: {DEVICE_NAME}, {SM_COUNT} SMs, {DTYPE}; both effects are measured.")
else:
    DEVICE_NAME = f"{platform.machine()} CPU, {torch.get_num_threads()} threads"
    DTYPE = torch.float32
    BASES = range(128, 897, 128)
    MIN_RUN_TIME = 0.05
    print("CPU: alignment is measured here; wave quantisation is a GPU effect, "
          "so for it we only draw the model of an H200.")

SIZES = sorted({base + offset for base in BASES for offset in OFFSETS})
print(f"{len(SIZES)} sizes from {SIZES[0]} to {SIZES[-1]}, dtype {DTYPE}")


def time_it(fn):
    """Median time of fn() with torch.utils.benchmark on all threads torch uses."""
    timer = benchmark.Timer(stmt="fn()", globals={"fn": fn},
                            num_threads=torch.get_num_threads())
    return timer.blocked_autorange(min_run_time=MIN_RUN_TIME).median


def median(values):
    return sorted(values)[len(values) // 2]


def matmul_tflops(n):
    a = torch.randn(n, n, device=DEVICE, dtype=DTYPE)
    b = torch.randn(n, n, device=DEVICE, dtype=DTYPE)
    return 2 * n**3 / time_it(lambda: a @ b) / 1e12


# %%
# Verify: correct at every alignment
# ----------------------------------
# Odd sizes take different code paths (unaligned loads, padded tiles) from
# aligned ones, so we check one size of each kind against float64 on the
# same rounded inputs. An entry of the product is a sum of :math:`n` terms,
# so its size, and its rounding error, grow like :math:`\sqrt{n}`; the
# absolute tolerance scales with it.


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


def check_matmul(n):
    a = torch.randn(n, n, device=DEVICE, dtype=DTYPE)
    b = torch.randn(n, n, device=DEVICE, dtype=DTYPE)
    # split-K partials added in 16 bits (PyTorch's default) would add an error that grows with
    # their number, which cuBLAS picks: at 8 partials it nearly fills this tolerance (simulated)
    with split_k_sums_in_float32():
        product = (a @ b).double()
    # 16-bit (GPU): float32 sums, one rounding of at most u |c| (u = 2^-8 bf16, 2^-11 float16), 0.2 of
    # rtol = 5u; an accumulator rounded to 16 bits every 16 products uses over 2 of it (simulated).
    # float32 (CPU): n roundings of partial sums random-walk to ~n u32 = 1e-5, against 1e-4 sqrt(n)
    tolerance = 5 * torch.finfo(DTYPE).eps / 2 if DTYPE != torch.float32 else 1e-4
    torch.testing.assert_close(product, a.double() @ b.double(), rtol=tolerance, atol=tolerance * math.sqrt(n))


for n in (SIZES[1], SIZES[2], SIZES[0]):
    check_matmul(n)
print(f"matmul of sizes {SIZES[1]}, {SIZES[2]}, {SIZES[0]} matches float64")

# %%
# Alignment: colour each size by the largest power of two dividing it
# -------------------------------------------------------------------
# Prediction: fast matmul kernels load blocks of 16 to 128 bytes at a time
# and work on tiles whose sides are multiples of 16 or more. When a row of
# the matrix is not a multiple of that block, the library falls back to
# slower loads or pads the edges, so sizes divisible by large powers of two
# should be faster. We put every power of two from 64 up in one class.


def alignment_class(n):
    """Largest power of two dividing n, capped at 64."""
    return min(n & -n, 64)


def class_label(power):
    return {1: "1 (odd)", 64: "64 or more"}.get(power, str(power))


CLASSES = (1, 2, 4, 8, 16, 32, 64)
tflops = {n: matmul_tflops(n) for n in SIZES}
class_median = {power: median([rate for n, rate in tflops.items() if alignment_class(n) == power])
                for power in CLASSES}

print(f"{'divisible by':>12} {'median TFLOP/s':>15} {'vs 64+':>7}")
for power in CLASSES:
    print(f"{class_label(power):>12} {class_median[power]:>15.3f} "
          f"{class_median[power] / class_median[64]:>7.2f}")

fig, ax = plt.subplots(figsize=(8, 5))
colours = plt.get_cmap("viridis")
for index, power in enumerate(CLASSES):
    ns = [n for n in SIZES if alignment_class(n) == power]
    ax.scatter(ns, [tflops[n] for n in ns], s=18, color=colours(index / (len(CLASSES) - 1)),
               label=class_label(power))
ax.set_xlabel("matrix size n (n x n times n x n)")
ax.set_ylabel(f"{DTYPE} matmul rate (TFLOP/s)")
ax.set_title(f"torch.matmul rate by alignment on {DEVICE_NAME}")
ax.legend(title="largest power of 2 dividing n", fontsize=8, ncols=2)
ax.grid(alpha=0.3)
fig.tight_layout()

# %%
# Wave quantisation: a model
# --------------------------
# A GPU matmul kernel cuts the :math:`n \times n` output into tiles of
# :math:`t_1 \times t_2` and gives each tile to one streaming multiprocessor
# (SM). With :math:`S` SMs the tiles run in *waves* of :math:`S` tiles:
#
# .. math::
#
#    \text{tiles} = \lceil n / t_1 \rceil \lceil n / t_2 \rceil, \qquad
#    \text{waves} = \lceil \text{tiles} / S \rceil .
#
# Every tile costs time proportional to :math:`n` (its length along the
# shared dimension), so the predicted time is proportional to
# :math:`\text{waves} \cdot n` and the fraction of the machine doing useful
# work is :math:`n^2 / (\text{waves} \cdot S \, t_1 t_2)`. One tile too many
# starts a whole new wave in which most SMs idle: the rate should drop in a
# step just past each wave boundary, then recover as the wave fills.
#
# This is a model, not a description of cuBLAS, which picks tile shapes by
# heuristics and can split the shared dimension (split-K, stream-K) to fill
# the last wave. We assume 128 x 256 tiles on Hopper and newer GPUs and
# 128 x 128 before, and take :math:`S` from the device. For the H200 model
# drawn on a CPU we use :math:`S = 132`: the H200 is built on the same
# GH100 GPU as the H100 SXM, whose 132 SMs are listed in the NVIDIA H100
# Tensor Core GPU Architecture whitepaper.


def wave_model(n, sm_count, tile):
    """Tiles, waves and predicted fraction of useful work for an n x n matmul."""
    tiles = math.ceil(n / tile[0]) * math.ceil(n / tile[1])
    waves = math.ceil(tiles / sm_count)
    return tiles, waves, n * n / (waves * sm_count * tile[0] * tile[1])


def first_two_wave_size(sm_count, tile, step=16):
    """Smallest multiple of step whose output no longer fits in one wave."""
    n = step
    while wave_model(n, sm_count, tile)[1] == 1:
        n += step
    return n


if DEVICE == "cuda":
    MODEL_SMS, MODEL_TILE = SM_COUNT, ((128, 256) if props.major >= 9 else (128, 128))
    MODEL_NAME = f"{DEVICE_NAME}: {MODEL_SMS} SMs"
else:
    MODEL_SMS, MODEL_TILE = 132, (128, 256)
    MODEL_NAME = "H200 (132 SMs)"

# Multiples of 16 only, so that alignment does not blur the wave steps.
boundary = first_two_wave_size(MODEL_SMS, MODEL_TILE)
FINE_SIZES = list(range(16 * round(0.75 * boundary / 16), 16 * round(1.5 * boundary / 16) + 1, 16))
model = {n: wave_model(n, MODEL_SMS, MODEL_TILE) for n in FINE_SIZES}
WAVE_STEPS = [(previous, n) for previous, n in itertools.pairwise(FINE_SIZES)
              if model[n][1] != model[previous][1]]
print(f"model: {MODEL_NAME}, tiles {MODEL_TILE[0]} x {MODEL_TILE[1]}; "
      f"first size (multiple of 16) needing two waves: {boundary}")

# %%
# Measure near the wave boundaries (GPU) or draw the model alone (CPU)
# --------------------------------------------------------------------
# On a GPU the model's one free constant, the rate :math:`P` of a full wave,
# is fitted as the median of measured rate / predicted fraction. The table
# shows the sizes on both sides of each predicted step.

fine_tflops = {n: matmul_tflops(n) for n in FINE_SIZES} if DEVICE == "cuda" else {}
full_wave_rate = None
if fine_tflops:
    full_wave_rate = median([fine_tflops[n] / model[n][2] for n in FINE_SIZES])

print(f"{'n':>6} {'tiles':>6} {'waves':>6} {'model fraction':>15}"
      + (f" {'TFLOP/s':>9}" if fine_tflops else ""))
for step in WAVE_STEPS:
    for size in step:
        tiles, waves, fraction = model[size]
        measured = f" {fine_tflops[size]:>9.1f}" if fine_tflops else ""
        print(f"{size:>6} {tiles:>6} {waves:>6} {fraction:>15.1%}{measured}")

fig, ax = plt.subplots(figsize=(8, 5))
fractions = [model[n][2] for n in FINE_SIZES]
if fine_tflops:
    ax.plot(FINE_SIZES, [fine_tflops[n] for n in FINE_SIZES], "o", markersize=4,
            label=f"measured, {DTYPE}")
    ax.plot(FINE_SIZES, [full_wave_rate * f for f in fractions], "-", color="tab:red",
            label=f"model: P x fraction, tiles {MODEL_TILE[0]}x{MODEL_TILE[1]}, P fitted")
    ax.set_ylabel("matmul rate (TFLOP/s)")
    ax.set_ylim(bottom=0)  # keeps the lower right, where the legend goes, free of points
    ax.set_title(f"Wave quantisation on {DEVICE_NAME} ({MODEL_SMS} SMs)")
else:
    ax.plot(FINE_SIZES, fractions, "-", color="tab:red",
            label=f"model for an H200, tiles {MODEL_TILE[0]}x{MODEL_TILE[1]} (not a measurement)")
    ax.set_ylabel("predicted fraction of peak (model)")
    ax.set_ylim(0, 1.05)
    ax.set_title(f"Wave quantisation model for an H200 (132 SMs); drawn on {DEVICE_NAME}")
for _, first_of_new_wave in WAVE_STEPS:
    ax.axvline(first_of_new_wave, color="gray", linestyle=":", linewidth=1)
ax.set_xlabel("matrix size n (multiples of 16)")
ax.legend(fontsize=8, loc="lower right")
ax.grid(alpha=0.3)
fig.tight_layout()

# %%
# Reading the result
# ------------------
# **Alignment.** The first figure and the first table compare the alignment
# classes at the same scale. On a GPU, bf16 tensor-core kernels want rows
# whose length in bytes is a multiple of 16 (8 bf16 elements) or more, so
# odd sizes and sizes divisible only by 2 or 4 typically fall well below the
# rest; padding a model's dimensions (vocabulary, hidden size) to a multiple
# of 64 or 128 is the cheap fix. A CPU library vectorises differently, and
# the effect there is weaker; sizes that are large powers of two can even be
# slower on a CPU, because the rows of such a matrix all map onto the same
# few cache sets.
#
# **Waves.** On a GPU the second figure shows how closely the measured rate
# follows the model's saw teeth. Where it does, tiles and waves are the
# explanation; where it does not, the library chose another tile shape or
# split the work to fill the last wave. On a CPU the figure shows the model
# only: an H200 would waste most of a wave just past each dotted line, so a
# matmul a little larger than a boundary can take as long as one a good deal
# larger. The roofline of
# :ref:`sphx_glr_auto_examples_lecture05_gpus_01_roofline.py` gives the
# ceiling these rates are measured against.

# %%
# Key figures
# -----------
# The numbers this example exists to measure, collected for the course's GPU check.

best_size = max(tflops, key=tflops.get)
KEY_FIGURES = {
    "device": DEVICE_NAME,
    "dtype": str(DTYPE).removeprefix("torch."),
    "best_TFLOPps": tflops[best_size],
    "best_size": best_size,
    "aligned_64_median_TFLOPps": class_median[64],
    "odd_over_aligned_64_median_rate": class_median[1] / class_median[64],
    "model_first_two_wave_size": boundary,
}
if full_wave_rate is not None:
    KEY_FIGURES["full_wave_rate_fitted_TFLOPps"] = full_wave_rate
    KEY_FIGURES["fine_sizes_best_TFLOPps"] = max(fine_tflops.values())
    before_step, after_step = WAVE_STEPS[0]
    KEY_FIGURES[f"wave_step_rate_n{after_step}_over_n{before_step}"] = (
        fine_tflops[after_step] / fine_tflops[before_step])
