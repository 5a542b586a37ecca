"""
The roofline: how fast can an operation possibly run?
=====================================================

An operation is limited either by how fast the machine moves bytes or by how
fast it does arithmetic; which one depends on its arithmetic intensity, the
FLOPs it does per byte it moves. This example measures both ceilings of this
machine, draws its roofline next to the spec-sheet rooflines of three NVIDIA
GPUs, and places real operations (ReLU, GeLU, softmax, matmuls) on it, so
that you can read off whether an operation is memory- or compute-bound. It
ends with a roof for every level of an H100's memory (HBM, L2, shared
memory), which shows what tile sizes those bandwidths call for.

**Requirements.** Full version: a CUDA GPU (bf16 needs compute capability 8.0
or newer). On a CPU the same measurements run in float32 at small sizes; the
CPU's roofline sits orders of magnitude below the GPUs'. On a T4 (compute
capability 7.5, as on free Colab notebooks) it measures in float16 instead of
bfloat16.
"""

# %%
# Setup
# -----
# One device, sizes that fit it, a fixed seed. Memory-bound operations get
# tensors several times larger than the last-level cache, so that their
# bytes really come from DRAM (or HBM) and not from a cache.

import contextlib
import math
import os
import platform
import unicodedata

import matplotlib.pyplot as plt
import torch
import torch.nn.functional as F
from torch.utils import benchmark

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
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
    props = torch.cuda.get_device_properties(0)
    DEVICE_NAME = props.name
    if props.major >= 8:
        DTYPE = torch.bfloat16
    else:
        DTYPE = torch.float16
        print("This GPU has no bf16 tensor cores (needs compute capability 8.0): float16 instead.")
    print(f"GPU                 : {props.name}")
    print(f"compute capability  : {props.major}.{props.minor}")
    print(f"SMs                 : {props.multi_processor_count}")
    print(f"L2 cache            : {props.L2_cache_size / 2**20:.0f} MB")
    print(f"memory              : {props.total_memory / 2**30:.1f} GiB")
    STREAM_ELEMENTS = 1 << 28  # 512 MiB in bf16, far beyond the L2 cache
    SOFTMAX_ROW = 4096
    MATMUL_SHAPES = [(16, 8192, 8192), (256, 256, 256), (1024, 1024, 1024),
                     (2048, 2048, 2048), (4096, 4096, 4096), (8192, 8192, 8192)]
    MIN_RUN_TIME = 0.2
else:
    DEVICE_NAME = f"{cpu_model_name()} CPU, {torch.get_num_threads()} threads"
    DTYPE = torch.float32
    print(f"CPU                 : {cpu_model_name()}")
    print(f"cores (os.cpu_count): {os.cpu_count()}")
    print(f"torch threads       : {torch.get_num_threads()}")
    STREAM_ELEMENTS = 1 << 24  # 64 MiB in float32, beyond a typical L3 cache
    SOFTMAX_ROW = 4096
    MATMUL_SHAPES = [(8, 4096, 4096), (256, 256, 256),
                     (512, 512, 512), (1024, 1024, 1024)]
    MIN_RUN_TIME = 0.2
    print("CPU: the roofline here is the CPU's; the GPU rooflines come from spec sheets.")

ELEMENT_BYTES = torch.finfo(DTYPE).bits // 8
print(f"working dtype       : {DTYPE}")

# %%
# Spec-sheet rooflines
# --------------------
# A roofline has two numbers: the memory bandwidth :math:`B` (bytes/s) and
# the peak arithmetic rate :math:`P` (FLOP/s). An operation with intensity
# :math:`I` (FLOP per byte) can run at most at :math:`\min(P, I \cdot B)`.
# The corner, the *ridge point* :math:`P / B`, is the intensity an operation
# needs before compute, not memory, limits it.
#
# The figures below are the HBM bandwidth and the dense bf16 tensor-core rate
# from NVIDIA's datasheets. The datasheets list bf16 "with sparsity" (2:4
# structured sparsity), which is twice the dense rate; ordinary matmuls are
# dense, so we halve those figures.

GPU_SPECS = {
    "A100 SXM 80GB": {
        "bandwidth": 2.039e12, "peak_flops": 312e12,
        "source": "NVIDIA A100 Tensor Core GPU datasheet: HBM2e 2,039 GB/s; "
                  "BF16 312 TFLOPS dense (624 with sparsity)",
    },
    "H100 SXM": {
        "bandwidth": 3.35e12, "peak_flops": 1979e12 / 2,
        "source": "NVIDIA H100 Tensor Core GPU datasheet: HBM3 3.35 TB/s; "
                  "BF16 1,979 TFLOPS with sparsity",
    },
    "H200 SXM": {
        "bandwidth": 4.8e12, "peak_flops": 1979e12 / 2,
        "source": "NVIDIA H200 Tensor Core GPU datasheet: HBM3e 4.8 TB/s; "
                  "BF16 1,979 TFLOPS with sparsity",
    },
}


def ridge_point(roofline):
    return roofline["peak_flops"] / roofline["bandwidth"]


print(f"{'GPU':<14} {'TB/s':>6} {'dense TFLOP/s':>14} {'ridge FLOP/B':>13}")
for gpu, spec in GPU_SPECS.items():
    print(f"{gpu:<14} {spec['bandwidth'] / 1e12:>6.2f} {spec['peak_flops'] / 1e12:>14.1f} "
          f"{ridge_point(spec):>13.0f}")
for gpu, spec in GPU_SPECS.items():
    print(f"  {gpu}: {spec['source']}")

# %%
# Predict: FLOPs and bytes of real operations
# -------------------------------------------
# For each operation we count the FLOPs and the *minimum* bytes it must move:
# read each input once and write each output once.
#
# * **ReLU** on :math:`N` elements: 1 FLOP per element (a max), read
#   :math:`N`, write :math:`N`.
# * **GeLU (tanh form)** :math:`\tfrac12 x (1 + \tanh(\sqrt{2/\pi}(x + 0.044715
#   x^3)))`: 8 FLOPs per element, counting ``tanh`` as one (a convention: the
#   hardware spends several instructions on it); read :math:`N`, write
#   :math:`N`.
# * **Softmax** over rows: 5 FLOPs per element (max, subtract, exp, sum,
#   divide), again read :math:`N`, write :math:`N` when a row stays on chip.
# * **Matmul** :math:`(M \times K)(K \times N)`: :math:`2MNK` FLOPs, read
#   :math:`MK + KN`, write :math:`MN` elements.
#
# Elementwise operations do a handful of FLOPs per element that is 2 or 4
# bytes each way, so their intensity is a few FLOPs per byte at most (in
# bf16, ReLU 1/4 and the tanh GeLU 2), far left of every ridge point: they
# are memory-bound everywhere. A square
# matmul of :math:`b`-byte elements has intensity :math:`2n/(3b)`, so large
# ones cross the ridge, while a matmul with a thin dimension (a few rows, as
# when a small batch decodes one token each) stays memory-bound.
#
# A useful consequence: left of the ridge the bound is :math:`I \cdot B`, so
# the fraction of the bound an operation reaches is
# :math:`(F/t)/(F/\text{bytes} \cdot B) = \text{bytes}/(t B)`, whatever
# convention we used for counting its FLOPs.


def streaming_ops(n_elements):
    """Elementwise and row-wise operations on one large tensor: read it once, write once."""
    x = torch.randn(n_elements, device=DEVICE, dtype=DTYPE)
    rows = x.view(-1, SOFTMAX_ROW)
    moved = 2 * n_elements * ELEMENT_BYTES
    return [
        {"name": "ReLU", "fn": lambda: torch.relu(x), "flops": 1 * n_elements, "bytes": moved},
        {"name": "GeLU (tanh)", "fn": lambda: F.gelu(x, approximate="tanh"),
         "flops": 8 * n_elements, "bytes": moved},
        {"name": "softmax", "fn": lambda: torch.softmax(rows, dim=-1),
         "flops": 5 * n_elements, "bytes": moved},
    ]


def matmul_op(m, k, n):
    a = torch.randn(m, k, device=DEVICE, dtype=DTYPE)
    b = torch.randn(k, n, device=DEVICE, dtype=DTYPE)
    return {"name": f"matmul {m}x{k}x{n}", "fn": lambda: a @ b, "flops": 2 * m * n * k,
            "bytes": (m * k + k * n + m * n) * ELEMENT_BYTES, "square": m == k == n}


OPERATIONS = streaming_ops(STREAM_ELEMENTS) + [matmul_op(*shape) for shape in MATMUL_SHAPES]

H200_RIDGE = ridge_point(GPU_SPECS["H200 SXM"])
print(f"{'operation':<22} {'FLOP/B':>8}  vs the H200 ridge ({H200_RIDGE:.0f} FLOP/B, spec)")
for op in OPERATIONS:
    intensity = op["flops"] / op["bytes"]
    side = "below: memory-bound" if intensity < H200_RIDGE else "above: compute-bound"
    print(f"{op['name']:<22} {intensity:>8.2f}  {side}")

# %%
# Verify: is the matmul we time correct?
# --------------------------------------
# A fast wrong answer is worthless. We compare ``torch.matmul`` in the
# working dtype against float64 on the same (rounded) inputs, on an awkward
# shape. bf16 keeps 8 significant bits (7 stored), so rounding the output
# alone is off by up to :math:`2^{-8}`, about 0.4 % (:math:`2^{-11}` in the
# float16 of a T4). PyTorch also lets cuBLAS add the partial sums of a split-K
# product in bf16 (:ref:`lecture 5, section 6 <l5-precision>`), an error that
# grows with the number of partials cuBLAS picks, so the check turns that off
# and the timings keep PyTorch's default. The tolerance is five times the
# output's rounding; an accumulator rounded to bf16 after every 16 products
# fails it. An entry of the product is a sum of :math:`K` terms, so its size
# and its rounding error grow like :math:`\sqrt{K}`, and the absolute
# tolerance scales with it.


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


a_check = torch.randn(333, 517, device=DEVICE, dtype=DTYPE)
b_check = torch.randn(517, 271, device=DEVICE, dtype=DTYPE)
reference = a_check.double() @ b_check.double()
with split_k_sums_in_float32():
    product = (a_check @ b_check).double()
# 16-bit (GPU): float32 sums, then one rounding of at most u |c| (u = 2^-8 bf16, 2^-11 float16), 0.2 of
# rtol = 5u; an accumulator rounded to 16 bits every 16 products uses 1.3 of it (simulated).
# float32 (CPU): K roundings of partial sums random-walk to ~K u32 = 3e-5, against 1e-4 sqrt(K)
tolerance = 5 * torch.finfo(DTYPE).eps / 2 if ELEMENT_BYTES == 2 else 1e-4
absolute_tolerance = tolerance * math.sqrt(a_check.shape[1])
torch.testing.assert_close(product, reference, rtol=tolerance, atol=absolute_tolerance)
print(f"matmul {DTYPE} matches float64 (rtol {tolerance:g}, atol {absolute_tolerance:.2g})")

# %%
# Measure: this machine's ceilings and the operations
# ---------------------------------------------------
# We measure the two ceilings instead of trusting a spec sheet. Bandwidth: a
# large device-to-device copy, which reads and writes each byte once, so it
# moves :math:`2 \times` the tensor size. Arithmetic: the best rate
# ``torch.matmul`` (:math:`2n^3` FLOPs) reaches on the square sizes in the
# list above; on a GPU that is the largest one. A ceiling is what the
# machine *can* do, and background load only ever slows a measurement down,
# so for the ceilings we keep the fastest timed block, and we time the copy
# both before and after the operations.
#
# Each operation is timed with ``torch.utils.benchmark``; its time is the
# median of the timed blocks, its achieved rate is FLOPs / time, and its
# bound is this machine's roofline at its intensity.


def time_it(fn, min_run_time=MIN_RUN_TIME):
    """Time fn() with torch.utils.benchmark on all threads torch uses."""
    timer = benchmark.Timer(stmt="fn()", globals={"fn": fn},
                            num_threads=torch.get_num_threads())
    return timer.blocked_autorange(min_run_time=min_run_time)


def measure_copy_bandwidth(n_elements):
    src = torch.randn(n_elements, device=DEVICE, dtype=DTYPE)
    dst = torch.empty_like(src)
    fastest = min(time_it(lambda: dst.copy_(src), 2 * MIN_RUN_TIME).times)
    return 2 * src.numel() * src.element_size() / fastest


def roofline_bound(roofline, intensity):
    return min(roofline["peak_flops"], intensity * roofline["bandwidth"])


bandwidth_before = measure_copy_bandwidth(STREAM_ELEMENTS)
measurements = [time_it(op["fn"]) for op in OPERATIONS]
THIS_MACHINE = {
    "bandwidth": max(bandwidth_before, measure_copy_bandwidth(STREAM_ELEMENTS)),
    "peak_flops": max(op["flops"] / min(measurement.times)
                      for op, measurement in zip(OPERATIONS, measurements) if op.get("square")),
}
print(f"copy bandwidth ({STREAM_ELEMENTS * ELEMENT_BYTES / 2**20:.0f} MiB copy): "
      f"{THIS_MACHINE['bandwidth'] / 1e9:8.1f} GB/s")
print(f"matmul rate ({DTYPE}, best square size): {THIS_MACHINE['peak_flops'] / 1e9:8.1f} GFLOP/s")
print(f"ridge point: {ridge_point(THIS_MACHINE):.1f} FLOP/B")


def datasheet_entry(device_name):
    """The GPU_SPECS entry this GPU is, or None (other GPUs, and the PCIe and NVL variants)."""
    if "PCIe" in device_name or "NVL" in device_name:
        return None
    for gpu, token in (("H200 SXM", "H200"), ("H100 SXM", "H100"), ("A100 SXM 80GB", "A100-SXM4-80GB")):
        if token in device_name:
            return gpu
    return None


DATASHEET = datasheet_entry(DEVICE_NAME) if DEVICE == "cuda" and DTYPE == torch.bfloat16 else None
if DATASHEET is not None:
    spec = GPU_SPECS[DATASHEET]
    print(f"measured / {DATASHEET} datasheet: matmul {THIS_MACHINE['peak_flops'] / spec['peak_flops']:.0%}, "
          f"copy bandwidth {THIS_MACHINE['bandwidth'] / spec['bandwidth']:.0%}")

results = []
for op, measurement in zip(OPERATIONS, measurements):
    intensity = op["flops"] / op["bytes"]
    achieved = op["flops"] / measurement.median
    results.append({"name": op["name"], "flops": op["flops"], "bytes": op["bytes"],
                    "intensity": intensity, "seconds": measurement.median, "achieved": achieved,
                    "fraction": achieved / roofline_bound(THIS_MACHINE, intensity)})

print(f"{'operation':<22} {'FLOPs':>9} {'bytes':>9} {'FLOP/B':>8} {'time ms':>9} "
      f"{'GFLOP/s':>9} {'of bound':>9}")
for row in results:
    print(f"{row['name']:<22} {row['flops']:>9.2e} {row['bytes']:>9.2e} {row['intensity']:>8.2f} "
          f"{row['seconds'] * 1e3:>9.3f} {row['achieved'] / 1e9:>9.1f} {row['fraction']:>9.1%}")

# %%
# Check the model against the measurements
# ----------------------------------------
# The roofline is a claim that can fail: no operation may run above its
# bound. The square matmuls set the flat part of the roof, so the test has
# teeth on the slanted part: a memory-bound operation far above the line
# would mean that it moves fewer bytes than we counted (a cache serves some
# of them, say) or that the timer is broken. We allow 50 % slack: for timing
# noise, and because a stream that only reads (the thin matmul) can beat a
# copy, which also writes, and writes cost more than reads (on a CPU a write
# may first fetch the cache line it overwrites). An operation that runs near
# its bound still fails the check if we counted twice its real bytes.

SLACK = 1.5
for row in results:
    if row["fraction"] > SLACK:
        raise AssertionError(
            f"{row['name']} runs at {row['fraction']:.0%} of this machine's roofline: "
            "check its byte and FLOP counts")
print(f"all {len(results)} operations lie at or below {SLACK} x this machine's roofline")

# %%
# Plot
# ----
# Both axes are logarithmic, so a roofline is a rising line of slope one
# (memory-bound) that turns flat at the ridge point (compute-bound).

intensities = torch.logspace(-2, 4, 400).tolist()
fig, ax = plt.subplots(figsize=(8, 5.5))
for (gpu, spec), colour in zip(GPU_SPECS.items(), ["tab:green", "tab:orange", "tab:red"]):
    ax.plot(intensities, [roofline_bound(spec, i) / 1e12 for i in intensities],
            "--", color=colour, label=f"{gpu} (datasheet, dense bf16)")
ax.plot(intensities, [roofline_bound(THIS_MACHINE, i) / 1e12 for i in intensities],
        "-", color="black", linewidth=2, label="this machine (measured)")


def point_label(name):
    """'n=1024' for a square matmul, '16x8192x8192' for another one, else the name."""
    dims = name.removeprefix("matmul ").split("x")
    if name.startswith("matmul") and len(set(dims)) == 1:
        return f"n={dims[0]}"
    return name.removeprefix("matmul ")


for index, row in enumerate(results):
    point = (row["intensity"], row["achieved"] / 1e12)
    ax.scatter(*point, color="tab:blue", zorder=3)
    # Below and right of a point is off the roof; softmax, just left of GeLU, goes above left.
    left = row["name"] == "softmax"
    ax.annotate(point_label(row["name"]), point, fontsize=7, textcoords="offset points",
                ha="right" if left else "left",
                xytext=(-5, 5) if left else (5, -19 if index % 2 else -11))
ax.set_xscale("log")
ax.set_yscale("log")
ax.set_xlabel("arithmetic intensity (FLOP / byte)")
ax.set_ylabel("performance (TFLOP/s)")
ax.set_title(f"Roofline: operations measured in {str(DTYPE).removeprefix('torch.')}\n{DEVICE_NAME}",
             fontsize=10)
ax.grid(True, which="both", alpha=0.3)
ax.legend(loc="upper left", fontsize=8)
fig.tight_layout()

del OPERATIONS  # frees the large tensors the timed functions hold

# %%
# Reading the result
# ------------------
# The elementwise operations sit far left of every ridge point, on the
# slanted part of the roof: making their arithmetic faster would change
# nothing, only moving fewer bytes helps. Their fraction of the bound in the
# table above says how close each comes to streaming at the copy bandwidth.
# On a CPU each out-of-place operation also allocates a fresh output, and the
# operating system zeroes those pages on first touch, a cost a copy into an
# existing buffer does not pay; on a GPU PyTorch's caching allocator reuses
# memory and this cost disappears.
#
# The thin matmul (16 or 8 rows) is memory-bound too: it reads a whole
# weight matrix to do two FLOPs per weight element per row. Square matmuls
# move right as they grow and, past the ridge point, are limited by
# arithmetic. Small ones fall below the roof for another reason: they are
# too small to fill the machine, and fixed launch or dispatch costs dominate.
#
# On a GPU the measured roof also sits below the datasheet's, by the
# fractions printed above. cuBLAS does not reach the datasheet matmul rate,
# in part because the GPU lowers its clock to stay within its power limit,
# and the power a matrix product draws depends on the numbers multiplied
# (He 2024 found cuBLAS on an A100 faster on all-zero inputs than on random
# ones).
# The measured ridge point, not the datasheet's, is the one that classifies
# operations on this machine.
#
# The spec-sheet lines show why the same code behaves differently on
# different GPUs: from A100 to H100 the peak rate grew much more than the
# bandwidth, so the ridge point moved right and more operations became
# memory-bound. The H200 has the H100's arithmetic and more bandwidth, so
# memory-bound operations gain and compute-bound ones do not. Fusing
# elementwise operations, which removes bytes rather than FLOPs, is the
# subject of :ref:`sphx_glr_auto_examples_lecture05_gpus_03_fusion.py`.

# %%
# A roof at every level of memory
# -------------------------------
# The roofline above counts the bytes that cross one boundary, from HBM onto
# the chip. A matmul's operands cross two more on their way to the tensor
# cores: L2 to each SM's shared memory, and shared memory to the tensor cores.
# Each boundary has its own bandwidth and so its own ridge point, and a kernel
# at full speed must clear all of them: its intensity *against each level*
# (the FLOPs it does per byte that level delivers) must reach that level's
# ridge, or that level sets the speed.
#
# The figures for an H100 SXM (the H200 has the same SMs and tensor cores;
# its L2 may differ):
#
# * **Tensor cores:** the datasheet's 989 TFLOP/s of dense bf16 are 132 SMs
#   times 4,096 FLOPs per clock (twice an A100 SM's, clock for clock, H100
#   whitepaper) at 1.83 GHz, the clock the datasheet's figure implies (the
#   SMs' maximum is 1.98 GHz).
# * **Shared memory:** 32 banks, each 4 bytes per clock (CUDA C++ Programming
#   Guide), so 128 bytes per clock per SM; its ridge, 4,096 / 128 = 32 FLOP/B,
#   holds at any clock. Multiplied out at the tensor cores' clock it is the
#   bandwidth below. NVIDIA documents this rate for ordinary shared-memory
#   loads; the model assumes the tensor cores read at the same rate and
#   fetch an operand once for the whole warpgroup.
# * **L2:** NVIDIA publishes no L2 bandwidth. Ernst's gpu-benches measured
#   about 9.8 TB/s reading data sets of 10 to 40 MB from an H200's L2 (and
#   about 6.9 TB/s on an H100 PCIe, which has 114 SMs), with ordinary loads,
#   not TMA. It stands in for the H100 SXM's, and it is a lower bound: on an
#   A100 the same benchmark reaches about 75 % of the 5,120 bytes per clock
#   that NVIDIA gives for the A100's L2 (A100 whitepaper).
# * **HBM:** 3.35 TB/s (datasheet).


def padded(text, width):
    """``text`` left-aligned in ``width`` columns, a Chinese character taking two."""
    return text + " " * (width - sum(2 if unicodedata.east_asian_width(c) in "WF" else 1 for c in text))


H100 = GPU_SPECS["H100 SXM"]
H100_SMS = 132
FLOP_PER_CLOCK_PER_SM = 4096  # dense bf16 on the tensor cores
TENSOR_CLOCK = H100["peak_flops"] / (H100_SMS * FLOP_PER_CLOCK_PER_SM)
SHARED_BYTES_PER_CLOCK = 32 * 4  # banks x bytes per bank per clock
LEVELS = {  # (label, bytes per second the level hands to the one nearer the tensor cores)
    "hbm": ("HBM", H100["bandwidth"]),
    "l2": ("L2 (measured on H200)", 9.8e12),
    "shared": ("shared memory", SHARED_BYTES_PER_CLOCK * H100_SMS * TENSOR_CLOCK),
}
print(f"H100 SXM: {H100['peak_flops'] / 1e12:.1f} TFLOP/s = {H100_SMS} SMs x {FLOP_PER_CLOCK_PER_SM} "
      f"FLOP/clock x {TENSOR_CLOCK / 1e9:.2f} GHz")
print(f"{'level':<22} {'TB/s':>6} {'ridge FLOP/B':>13}")
for level, bandwidth in LEVELS.values():
    print(f"{padded(level, 22)} {bandwidth / 1e12:>6.2f} {H100['peak_flops'] / bandwidth:>13.0f}")
if abs(H100["peak_flops"] / LEVELS["shared"][1] - FLOP_PER_CLOCK_PER_SM / SHARED_BYTES_PER_CLOCK) > 1e-9:
    raise AssertionError("the shared-memory ridge must be FLOPs per clock over bytes per clock")

# %%
# **L2 to shared memory.** A block that computes a :math:`T_M \times T_N` tile
# of the product loads, per step of :math:`T_K` along the inner dimension, a
# :math:`T_M \times T_K` tile of A and a :math:`T_K \times T_N` tile of B
# from L2, for :math:`2 T_M T_N T_K` FLOPs: :math:`T_M T_N / (T_M + T_N)`
# FLOP/B in bf16 (section 9 of the lecture). Blocks that share a tile still
# each read it, from L2 if not from HBM. A Hopper *cluster* of blocks can do
# better: TMA multicast copies one tile of global memory into the shared
# memory of several blocks of the cluster (PTX's ``.multicast::cluster``).
# In a 2 x 1 cluster of 128 x 256 tiles, two blocks along M need the same tile
# of B; read once, it makes the pair act against L2 like one 256 x 256 tile.
# This model assumes that a multicast costs one read, and that L2, not each
# SM's path from it, sets the limit; the benchmark cannot tell which. Below, the
# L2 bandwidth each tiling needs to feed the tensor cores at the datasheet
# rate, counted load by load for one step.

BF16_BYTES = 2


def l2_traffic(tile_m, tile_n, tile_k, cluster_m=1, multicast=False):
    """FLOPs and bytes read from L2 in one step along K by a column of ``cluster_m`` blocks
    with tiles of tile_m x tile_n, all needing the same tile of B (read once if multicast)."""
    flops = cluster_m * 2 * tile_m * tile_n * tile_k
    loads_of_a = cluster_m * tile_m * tile_k
    loads_of_b = (1 if multicast else cluster_m) * tile_k * tile_n
    return flops, (loads_of_a + loads_of_b) * BF16_BYTES


TILINGS = {  # (label, label on the plot, tile_m, tile_n, cluster_m, multicast)
    "64": ("64 x 64", "64 x 64", 64, 64, 1, False),
    "128": ("128 x 128", "128 x 128", 128, 128, 1, False),
    "128x256": ("128 x 256", "128 x 256", 128, 256, 1, False),
    "cluster": ("2 x 1 cluster of 128 x 256, no multicast", None, 128, 256, 2, False),
    "multicast": ("2 x 1 cluster of 128 x 256, B multicast", "2 x 1 cluster, multicast", 128, 256, 2, True),
}
L2_MEASURED = LEVELS["l2"][1]
l2_intensity = {}
print(f"{'tiling':<42} {'FLOP/B vs L2':>12} {'L2 TB/s needed':>15}")
for name, (label, _, tile_m, tile_n, cluster_m, multicast) in TILINGS.items():
    flops, loaded = l2_traffic(tile_m, tile_n, 64, cluster_m, multicast)
    l2_intensity[name] = flops / loaded
    rows_sharing_b = cluster_m * tile_m if multicast else tile_m  # rows of the tile it acts as
    closed_form = 2 * rows_sharing_b * tile_n / ((rows_sharing_b + tile_n) * BF16_BYTES)
    if abs(l2_intensity[name] - closed_form) > 1e-9 * closed_form:
        raise AssertionError(f"{label}: counted {l2_intensity[name]} FLOP/B, formula {closed_form}")
    needed = H100["peak_flops"] / l2_intensity[name]
    print(f"{padded(label, 42)} {l2_intensity[name]:>12.1f} {needed / 1e12:>15.1f}")

# Against the one L2 figure we have, a lower bound, 64 x 64 and 128 x 128
# tiles would need far more than it, 128 x 256 somewhat more, and only the
# multicast cluster needs less. (A GEMM at 70 to 80 % of the datasheet rate
# needs that fraction of these bandwidths, which 128 x 256 already gets
# under.)
needs = {name: H100["peak_flops"] / intensity for name, intensity in l2_intensity.items()}
if not (needs["128"] > needs["128x256"] > L2_MEASURED > needs["multicast"]):
    raise AssertionError(f"the tilings no longer bracket the measured L2 bandwidth: {needs}")
if needs["cluster"] != needs["128x256"]:
    raise AssertionError("without multicast a cluster reads what its blocks would read alone")

# %%
# **Shared memory to the tensor cores.** On Hopper the unit of work is one
# warpgroup's (four warps') ``wgmma`` instruction, :math:`64 \times N
# \times 16` in bf16: it reads its B operand from shared memory and its A operand
# from shared memory or from registers, and keeps the fp32 accumulator in
# registers (PTX ISA). With A in shared memory it reads
# :math:`(64 \cdot 16 + 16 N) \cdot 2` bytes for :math:`2 \cdot 64 \cdot 16 N`
# FLOPs, :math:`64 N / (64 + N)` FLOP/B, which clears the ridge of 32 only
# for :math:`N \geq 64`; with A in registers it is 64 for every :math:`N`,
# counting only the ``wgmma`` (an A loaded into registers from shared memory
# costs those bytes once more; FlashAttention-3's probabilities are made in
# registers).
# Wide instructions are what the tensor cores need from shared memory, as
# wide tiles are what they need from L2. (Whether the TMA's writes into shared
# memory share these 128 bytes per clock with the reads, NVIDIA does not say;
# if they do, a 128 x 256 tile at full rate needs 80 bytes per clock of
# operand reads and 48 of writes, all 128.)
#
# **Registers.** An accumulator kept in shared memory would be read and
# written by every instruction: :math:`2 \cdot 64 N \cdot 4` bytes per
# :math:`2 \cdot 64 \cdot 16 N` FLOPs, 4 FLOP/B whatever :math:`N` before
# the operands are counted, eight times below the shared-memory ridge. So the
# accumulator lives in registers (on data-centre Blackwell, compute
# capability 10.0, in tensor memory), and the
# register file's size bounds the tile: a 128 x 256 fp32 accumulator is
# 128 KiB, half of an SM's 256 KiB.
SHARED_RIDGE = FLOP_PER_CLOCK_PER_SM / SHARED_BYTES_PER_CLOCK


def wgmma_intensity(n, a_in_registers):
    """FLOPs per byte read from shared memory by one 64 x n x 16 wgmma in bf16."""
    flops = 2 * 64 * n * 16
    return flops / ((0 if a_in_registers else 64 * 16 * BF16_BYTES) + 16 * n * BF16_BYTES)


def accumulator_intensity(n):
    """FLOPs per byte of a 64 x n fp32 accumulator read and written once per wgmma."""
    return (2 * 64 * n * 16) / (2 * 64 * n * 4)


print(f"shared-memory ridge: {SHARED_RIDGE:.0f} FLOP/B")
print(f"{'wgmma 64 x N x 16':<18} {'A in shared':>11} {'A in registers':>15}")
for n in (16, 32, 64, 128, 256):
    print(f"N = {n:<14} {wgmma_intensity(n, False):>11.1f} {wgmma_intensity(n, True):>15.1f}")
    if abs(wgmma_intensity(n, False) - 64 * n / (64 + n)) > 1e-9 or wgmma_intensity(n, True) != 64:
        raise AssertionError(f"N = {n}: the counted intensity is not the closed form")
if not wgmma_intensity(32, False) < SHARED_RIDGE <= wgmma_intensity(64, False):
    raise AssertionError("the shared-memory ridge should fall between N = 32 and N = 64")
ACCUMULATOR_BYTES = 128 * 256 * 4
REGISTER_FILE_BYTES = 65536 * 4
print(f"an accumulator in shared memory: {accumulator_intensity(256):.0f} FLOP/B "
      f"({SHARED_RIDGE / accumulator_intensity(256):.0f}x below the ridge); a 128 x 256 fp32 accumulator "
      f"in registers: {ACCUMULATOR_BYTES // 1024} KiB of the {REGISTER_FILE_BYTES // 1024} KiB register file")
if {accumulator_intensity(n) for n in (16, 64, 256)} != {SHARED_RIDGE / 8}:
    raise AssertionError("an accumulator's traffic should be 4 FLOP/B, 8x below the ridge, for every N")

# %%
# The three roofs on one plot, with each tiling at its intensity against L2
# and each ``wgmma`` width against shared memory. A point below the roof of
# its own level cannot reach the tensor cores' peak, however the other levels
# fare.

fig, ax = plt.subplots(figsize=(8, 5))
for (level, bandwidth), colour in zip(LEVELS.values(), ["tab:red", "tab:orange", "tab:green"]):
    ax.plot(intensities, [min(H100["peak_flops"], i * bandwidth) / 1e12 for i in intensities],
            color=colour, label=f"{level}: {bandwidth / 1e12:.3g} TB/s")
for name, (_, plot_label, *_) in TILINGS.items():
    if plot_label is None:
        continue  # the same point as one 128 x 256 block
    point = (l2_intensity[name], min(H100["peak_flops"], l2_intensity[name] * L2_MEASURED) / 1e12)
    ax.scatter(*point, color="tab:orange", marker="s", zorder=3)
    ax.annotate(plot_label, point, fontsize=7, textcoords="offset points", xytext=(6, -12))
for n, (dx, dy, align) in {32: (-8, 6, "right"), 64: (5, -12, "left"), 256: (4, 6, "left")}.items():
    intensity = wgmma_intensity(n, False)
    point = (intensity, min(H100["peak_flops"], intensity * LEVELS["shared"][1]) / 1e12)
    ax.scatter(*point, color="tab:green", marker="^", zorder=3)
    ax.annotate(f"wgmma N={n}", point, fontsize=7, textcoords="offset points", xytext=(dx, dy), ha=align)
ax.set_xscale("log")
ax.set_yscale("log")
ax.set_xlim(1, 1e3)
ax.set_ylim(10, 2000)
ax.set_xlabel("arithmetic intensity against the level (FLOP / byte)")
ax.set_ylabel("performance bound (TFLOP/s)")
ax.set_title("H100 SXM, dense bf16: one roof per level of memory", fontsize=10)
ax.grid(True, which="both", alpha=0.3)
ax.legend(loc="lower right", fontsize=8)
fig.tight_layout()

# %%
# Key figures
# -----------
# The numbers this example exists to measure, collected for the course's GPU check.

fraction_of_roofline = {row["name"]: row["fraction"] for row in results}
KEY_FIGURES = {
    "device": DEVICE_NAME,
    "dtype": str(DTYPE).removeprefix("torch."),
    "copy_GBps": THIS_MACHINE["bandwidth"] / 1e9,
    "matmul_TFLOPps": THIS_MACHINE["peak_flops"] / 1e12,
    "ridge_FLOP_per_byte": ridge_point(THIS_MACHINE),
    "relu_fraction_of_roofline": fraction_of_roofline["ReLU"],
    "gelu_fraction_of_roofline": fraction_of_roofline["GeLU (tanh)"],
    "softmax_fraction_of_roofline": fraction_of_roofline["softmax"],
    "thin_matmul_fraction_of_roofline": fraction_of_roofline["matmul {}x{}x{}".format(*MATMUL_SHAPES[0])],
}
if DATASHEET is not None:
    KEY_FIGURES["matmul_fraction_of_datasheet"] = THIS_MACHINE["peak_flops"] / GPU_SPECS[DATASHEET]["peak_flops"]
    KEY_FIGURES["copy_fraction_of_datasheet"] = THIS_MACHINE["bandwidth"] / GPU_SPECS[DATASHEET]["bandwidth"]
