"""
Launch overhead and arithmetic intensity
========================================

Every kernel call pays a fixed cost before any data moves, then for its
memory traffic, then for its arithmetic. We time one elementwise operation
from one element to hundreds of millions, then raise the arithmetic per byte
of one fused kernel until it stops being memory-bound, so that you can tell
which of the three limits a kernel hits.

**Requirements.** Full version: a CUDA GPU; ``torch.compile`` generates
Triton kernels for it. On a CPU, ``torch.compile`` generates C++ and the page
shows the same three regimes at smaller sizes, with fewer arithmetic steps
because each compile takes seconds. On a T4 (compute capability 7.5, as on free
Colab notebooks) it runs as on any CUDA GPU.
"""

# %%
# Setup
# -----
# Sizes depend on the device: the largest tensors must be far bigger than
# the last-level cache (50 MB of L2 on an H100 per the NVIDIA H100 Tensor Core
# GPU Architecture whitepaper, tens of MB of L3 on a server CPU), otherwise we
# would time the cache instead of main memory.

import math
import os
import platform
import shutil
import statistics
import subprocess
import tempfile
import time

import torch

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
if DEVICE == "cpu":
    os.environ.setdefault("TRITON_INTERPRET", "1")  # torch._inductor imports Triton

import matplotlib.pyplot as plt
import torch._inductor.config as inductor_config
from torch.profiler import ProfilerActivity, profile
from torch.utils.benchmark import Timer

torch.manual_seed(0)

if DEVICE == "cuda":
    LAUNCH_SIZES = [4**k for k in range(15)]  # 1 element .. 2**28 elements (1 GiB)
    COPY_ELEMENTS = 1 << 28
    CHAIN_ELEMENTS = (1 << 26) + 7  # irregular on purpose
    CHAIN_LENGTHS = [1, 4, 16, 32, 64, 128, 256, 512]
else:
    LAUNCH_SIZES = [4**k for k in range(13)]  # 1 element .. 2**24 elements (64 MiB)
    COPY_ELEMENTS = 1 << 24
    CHAIN_ELEMENTS = (1 << 23) + 7
    CHAIN_LENGTHS = [1, 4, 16, 64]
SMALLEST_SIZES = 4  # the overhead floor is the median over these sizes


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


print(f"device: {DEVICE_NAME}, torch {torch.__version__}")
if DEVICE == "cpu":
    print(f"CPU: small sizes and only {len(CHAIN_LENGTHS)} chain lengths, since each compile takes seconds.")

# %%
# The memory ceiling: copy bandwidth
# ----------------------------------
# A large device-to-device copy reads and writes every byte once, so it moves
# ``2 x size`` bytes. Its rate is the bandwidth ceiling we compare against.


def copy_bandwidth(n_elements):
    src = torch.rand(n_elements, device=DEVICE)
    dst = torch.empty_like(src)
    seconds = median_seconds("dst.copy_(src)", src=src, dst=dst)
    return 2 * src.nbytes / seconds


COPY_BYTES_PER_S = copy_bandwidth(COPY_ELEMENTS)
print(f"copy bandwidth: {COPY_BYTES_PER_S / 1e9:.1f} GB/s")

# %%
# Predict: the launch-overhead floor
# ----------------------------------
# ``torch.mul(x, 1.5, out=y)`` reads 4 bytes and writes 4 bytes per float32
# element. A simple model of its time is
#
# .. math:: t(n) \approx t_0 + \frac{8n}{B}
#
# where :math:`t_0` is the fixed cost of one call (Python, the PyTorch
# dispatcher, and on a GPU the kernel launch) and :math:`B` is the copy
# bandwidth. For small :math:`n` the first term wins and time stays flat. The
# crossover is at :math:`n^* = t_0 B / 8` elements. Below that size, a
# faster memory would not help; fewer calls would.
#
# The timer calls the operation back to back. On a GPU the launches queue up
# asynchronously, so the floor we see is the *throughput* cost per call, the
# time the CPU needs to issue it. It is not the latency of a single call.


def time_per_call(n_elements):
    x = torch.rand(n_elements, device=DEVICE)
    out = torch.empty_like(x)
    return median_seconds("torch.mul(x, 1.5, out=out)", min_run_time=0.05, x=x, out=out)


launch_seconds = [time_per_call(n) for n in LAUNCH_SIZES]
overhead_floor = statistics.median(launch_seconds[:SMALLEST_SIZES])
crossover_elements = overhead_floor * COPY_BYTES_PER_S / 8

print(f"\n{'elements':>11} {'bytes':>13} {'time (us)':>10} {'GB/s':>8}")
for n, seconds in zip(LAUNCH_SIZES, launch_seconds):
    print(f"{n:>11,} {8 * n:>13,} {seconds * 1e6:>10.2f} {8 * n / seconds / 1e9:>8.2f}")
print(f"overhead floor t0 = {overhead_floor * 1e6:.2f} us per call, "
      f"crossover n* = {crossover_elements:,.0f} elements")

# %%
# Time per call against tensor size
# ---------------------------------

bytes_moved = [8 * n for n in LAUNCH_SIZES]
fig, ax = plt.subplots(figsize=(7, 4.5))
ax.loglog(bytes_moved, [s * 1e6 for s in launch_seconds], "o-", label="measured torch.mul")
ax.axhline(overhead_floor * 1e6, color="gray", ls="--",
           label=f"overhead floor t0 (median of {SMALLEST_SIZES} smallest)")
visible_bytes = [b for b in bytes_moved if b / COPY_BYTES_PER_S > overhead_floor / 10]
ax.loglog(visible_bytes, [b / COPY_BYTES_PER_S * 1e6 for b in visible_bytes], ":",
          color="tab:red", label="bytes / copy bandwidth")
ax.axvline(8 * crossover_elements, color="tab:green", ls="-.", label="crossover n*")
ax.set_xlabel("bytes moved per call (read + write)")
ax.set_ylabel("time per call (us)")
ax.set_title(f"Elementwise multiply, float32\n{DEVICE_NAME}", fontsize=10)
ax.legend(fontsize=8)
fig.tight_layout()

# %%
# Predict: arithmetic intensity of a fused chain
# ----------------------------------------------
# The function below applies ``x * 1.0001 + 0.0001`` ``r`` times.
# ``torch.compile`` traces the Python loop into a chain of ``2r`` elementwise
# operations and fuses them into one kernel. That kernel reads each float32
# element once (4 bytes), keeps it in registers for all ``r`` steps, and
# writes it once (4 bytes). Every step is one multiply and one add, so
#
# .. math:: I(r) = \frac{2r\ \text{FLOP}}{8\ \text{bytes}} = \frac{r}{4}\ \text{FLOP/byte}.
#
# The roofline model says the rate is :math:`\min(P, I \cdot B)`. While
# :math:`I B < P` the kernel is memory-bound: time stays flat as ``r`` grows
# and the FLOP rate rises in proportion to ``r``. Past the ridge
# :math:`r = 4P/B` the arithmetic dominates; the FLOP rate flattens at
# :math:`P` and time grows with ``r``. Plain multiplies and adds do not use
# tensor cores, so :math:`P` here is the vector (CUDA-core or SIMD) rate. We
# take it as the highest rate measured in the sweep.
#
# Dynamo unrolls the Python loop, so every ``r`` is a separate graph and a
# separate compile. We reset the compiler caches before each one so that no
# recompilation limit is reached. The result goes into a preallocated
# ``out``, as in the ``out=`` call above: on a CPU, allocating a fresh
# 32 MB tensor on every call costs page faults that can take longer than the
# kernel itself. Inductor turns the final ``copy_`` into the kernel's store.


SCALE, SHIFT = 1.0001, 0.0001


def repeated_fma(x, repeats: int, scale=SCALE, shift=SHIFT):
    for _ in range(repeats):
        x = x * scale + shift
    return x


def repeated_fma_into(x, out, repeats: int):
    out.copy_(repeated_fma(x, repeats))


# Inductor's FX graph cache does not tell ATen's CPU capabilities apart (ATEN_CPU_CAPABILITY):
# C++ generated for AVX-512 and cached, then compiled for AVX2, leaves half of each vector unset
NO_GRAPH_CACHE = {"fx_graph_cache": False}


def compile_chain(x, out, repeats):
    """Compile the chain for one ``repeats``, run it once; return it and the compile+run seconds."""
    torch.compiler.reset()
    compiled = torch.compile(repeated_fma_into, dynamic=False)
    start = time.perf_counter()
    # enable_kernel_profile names the C++ kernels for the profiler
    with inductor_config.patch({"cpp.enable_kernel_profile": True, **NO_GRAPH_CACHE}):
        compiled(x, out, repeats)
    return compiled, time.perf_counter() - start


# %%
# Implement, verify, measure
# --------------------------
# For every chain length we compare the compiled output with eager PyTorch
# in float64 on the same irregular-length input, applied to the float32
# values of 1.0001 and 0.0001, the numbers the kernel really uses. Only the
# kernel's roundings then differ: two per step, each at most
# :math:`u = 2^{-24}` relative, at most :math:`2ru` in all (to first order).
# A correct chain comes close to that bound at small ``r``, so we allow
# twice it, :math:`4ru` relative. One step too many or too few changes a
# result :math:`y` by :math:`10^{-4} (1 + 1/y)` relative, over
# :math:`3000u` for the :math:`y \le 1.1` of up to 512 steps, and still
# fails. The intensity
# :math:`r/4` also assumes that the chain runs as *one* kernel, so the
# profiler counts the kernels of one call: launches on a GPU; on a CPU the
# C++ kernels Inductor generates (and any ATen operator run outside them).

FLOAT32_ROUNDING = 2.0**-24
FLOAT32_CONSTANTS = [torch.tensor(value, dtype=torch.float32).item() for value in (SCALE, SHIFT)]  # the kernel's
ALLOCATIONS = {"aten::empty", "aten::empty_strided", "aten::empty_like"}


def check_against_eager(x, compiled_out, repeats):
    reference = repeated_fma(x.double(), repeats, *FLOAT32_CONSTANTS)
    # two roundings of at most u per step: 2ru (first order), allowed twice on CPU and GPU
    torch.testing.assert_close(compiled_out.double(), reference,
                               rtol=4 * repeats * FLOAT32_ROUNDING, atol=0)


def is_cpu_kernel(event):
    """An Inductor C++ kernel, or a top-level ATen operator that is not an allocation."""
    if "cpp_fused" in event.name:
        return True
    parent = event.cpu_parent
    top_level = parent is None or not parent.name.startswith("aten::")
    return event.name.startswith("aten::") and top_level and event.name not in ALLOCATIONS


def kernels_per_call(fn, *args):
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if DEVICE == "cuda" else [])
    with profile(activities=activities) as prof:
        fn(*args)
        if DEVICE == "cuda":
            torch.cuda.synchronize()
    if DEVICE == "cuda":
        return sum(1 for event in prof.events() if event.device_type.name == "CUDA")
    return sum(1 for event in prof.events() if is_cpu_kernel(event))


def skip_or_fail(section, capability, reason):
    """Readers' runs skip a part whose tool is missing; the site's builds require it."""
    if capability in os.environ.get("COURSE_REQUIRE", "").split(","):
        raise RuntimeError(f"{section}: this build requires {capability}, but {reason}")
    print(f"Skipped {section}: {capability} is missing ({reason}).")


def cxx_problem(compiler):
    """Why ``compiler`` cannot build C++ here, or None once it compiles a one-line file."""
    if shutil.which(compiler) is None:
        return f"no C++ compiler {compiler!r} is on PATH"
    with tempfile.TemporaryDirectory() as folder:
        source = os.path.join(folder, "probe.cpp")
        with open(source, "w") as file:
            file.write("int probe() { return 0; }\n")
        try:
            done = subprocess.run([compiler, "-c", source, "-o", source + ".o"],
                                  capture_output=True, text=True, check=False)
        except OSError as error:  # on PATH but not runnable, e.g. a script without #!
            return f"{compiler} cannot be run ({error})"
    if done.returncode != 0:
        return f"{compiler} fails on a one-line .cpp file (exit {done.returncode})"
    return None


def inductor_problem():
    """(capability, reason) if torch.compile cannot work here, or None."""
    if DEVICE == "cpu" and (problem := cxx_problem(inductor_config.cpp.cxx[-1])) is not None:
        return "cxx", problem  # Inductor's compiler on a CPU: $CXX, else g++
    if DEVICE == "cuda":
        try:
            import triton  # noqa: F401 (Inductor writes Triton kernels on a GPU)
        except ImportError as error:
            return "triton", f"import triton failed: {error}"
    try:
        with inductor_config.patch(NO_GRAPH_CACHE):
            torch.compile(lambda t: 2 * t + 1)(torch.arange(5.0, device=DEVICE))
    except Exception as error:  # noqa: BLE001 (a one-line function failed: Inductor is broken)
        return "inductor", f"a one-line torch.compile failed, {type(error).__name__}"
    finally:
        torch.compiler.reset()
    return None


# A missing compiler skips the sweep; a failure to compile our chain fails the page.
x = torch.rand(CHAIN_ELEMENTS, device=DEVICE)
out = torch.empty_like(x)
chain_rows = []
missing = inductor_problem()
if missing is not None:
    skip_or_fail("the fused-chain sweep", *missing)
swept_lengths = CHAIN_LENGTHS if missing is None else []
for repeats in swept_lengths:
    compiled, first_call_seconds = compile_chain(x, out, repeats)
    check_against_eager(x, out, repeats)
    kernels = kernels_per_call(compiled, x, out, repeats)
    if kernels != 1:
        raise AssertionError(f"the compiled chain r={repeats} ran {kernels} kernels, not one: "
                             "its intensity is not r/4")
    seconds = median_seconds("f(x, out, r)", min_run_time=0.2, f=compiled, x=x, out=out, r=repeats)
    chain_rows.append((repeats, first_call_seconds, seconds))
if chain_rows:
    print(f"compiled chains r = {', '.join(str(row[0]) for row in chain_rows)}: each runs as one "
          f"kernel and matches float64 within 4 r u on {x.numel():,} elements")
torch.compiler.reset()

# %%
# The ridge
# ---------

if chain_rows:
    lengths = [row[0] for row in chain_rows]
    gbytes_per_s = [8 * x.numel() / row[2] / 1e9 for row in chain_rows]
    gflops_per_s = [2 * row[0] * x.numel() / row[2] / 1e9 for row in chain_rows]
    compute_plateau = max(gflops_per_s)
    ridge_length = 4 * compute_plateau / (COPY_BYTES_PER_S / 1e9)

    print(f"\n{'r':>5} {'FLOP/B':>7} {'1st call s':>10} {'time ms':>9} "
          f"{'GB/s':>8} {'% copy':>7} {'GFLOP/s':>9}")
    for (repeats, first_s, seconds), gbs, gfs in zip(chain_rows, gbytes_per_s, gflops_per_s):
        print(f"{repeats:>5} {repeats / 4:>7.2f} {first_s:>10.1f} {seconds * 1e3:>9.3f} "
              f"{gbs:>8.1f} {100 * gbs / (COPY_BYTES_PER_S / 1e9):>7.1f} {gfs:>9.1f}")
    print(f"compute plateau P = {compute_plateau:.1f} GFLOP/s (highest measured), "
          f"ridge at r = 4P/B = {ridge_length:.1f}")

    fig, (ax_flops, ax_bytes) = plt.subplots(1, 2, figsize=(11, 4.5))
    model_end = max(lengths[-1], 2 * ridge_length)
    model_lengths = torch.logspace(0, math.log2(model_end), 64, base=2).tolist()
    roofline = [min(compute_plateau, r / 4 * COPY_BYTES_PER_S / 1e9) for r in model_lengths]
    ax_flops.plot(lengths, gflops_per_s, "o-", label="measured (compiled chain)")
    ax_flops.plot(model_lengths, roofline, "--", color="gray",
                  label="roofline: min(P, r/4 x copy bandwidth)")
    ax_flops.set_ylabel("throughput (GFLOP/s)")
    ax_bytes.plot(lengths, gbytes_per_s, "o-", label="measured (8 bytes per element)")
    ax_bytes.axhline(COPY_BYTES_PER_S / 1e9, color="tab:red", ls=":",
                     label="copy bandwidth (measured)")
    ax_bytes.set_ylabel("achieved bandwidth (GB/s)")
    for ax in (ax_flops, ax_bytes):
        ax.axvline(ridge_length, color="tab:green", ls="-.", label="ridge r = 4P/B")
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("r = multiply-add steps per element (FLOP/byte = r/4)")
        ax.legend(fontsize=8)
    fig.suptitle(f"One fused kernel, r steps per element, float32 - {DEVICE_NAME}")
    fig.tight_layout()

# %%
# Read the result
# ---------------
# The first figure has two regimes. Tensors below the crossover ``n*`` all
# cost about the same, the overhead floor. On a GPU the floor is the CPU-side
# work of issuing a kernel, and the crossover lies at millions of elements,
# because the GPU moves a lot of data in the time the CPU needs to issue one
# call. On a CPU the floor is the PyTorch dispatcher alone, and the crossover
# lies at far fewer elements. The table above gives both numbers for this
# machine. Between the two regimes, a tensor that fits in a cache can run
# faster than the DRAM line predicts. On a CPU, PyTorch splits an elementwise
# operation across threads only above a size threshold (its internal grain
# size of 32,768 elements), and starting the threads can add a step of its
# own. Many small kernels in a row (a layer
# norm on a small batch, the optimizer step over many small parameters) run
# at the floor. That is why fusion, CUDA graphs and ``torch.compile`` pay off
# even when the arithmetic is trivial.
#
# The second figure follows the roofline. Left of the ridge, the achieved
# bandwidth stays near the copy bandwidth and the time per call stays flat:
# the extra arithmetic is free, and the FLOP rate climbs with ``r``. Right
# of the ridge, the arithmetic becomes the limit: time grows with ``r``, the
# bandwidth falls as ``1/r``, and on a GPU the FLOP rate levels off. On an
# H200 the spec sheet (NVIDIA H200 datasheet: 67 TFLOP/s FP32, 4.8 TB/s)
# puts the ridge near 14 FLOP per byte, or ``r`` near 56. Tensor-core
# matmuls move the ridge another order of magnitude to the right.
#
# On a CPU the ridge sits at a small ``r``, and the FLOP rate can even drop
# again for the longest chain. Each step needs the previous step's result, so
# a core can only overlap the chains of the few elements that fit in its
# out-of-order window. A long chain then runs at the *latency* of the
# floating-point unit, not at its throughput. A GPU hides that latency by
# keeping many warps in flight on every SM.
#
# Typical LLM elementwise kernels (activations, residual adds,
# normalisations) do a few FLOPs per byte at most: in bf16 a residual add
# does 1/6 and the tanh GeLU about 2. They sit far left of the ridge, so
# their cost is their bytes.
# :ref:`sphx_glr_auto_examples_lecture05_gpus_05_precision_and_coalescing.py`
# shows the other way to gain: move fewer bytes.

KEY_FIGURES = {
    "device": DEVICE_NAME,
    "copy_GBps": COPY_BYTES_PER_S / 1e9,
    "overhead_floor_us": overhead_floor * 1e6,
    "crossover_elements": crossover_elements,
}
if chain_rows:
    KEY_FIGURES["chain_compute_plateau_GFLOPps"] = compute_plateau
    KEY_FIGURES["chain_ridge_r"] = ridge_length
    KEY_FIGURES["chain_r1_fraction_of_copy_bw"] = gbytes_per_s[0] / (COPY_BYTES_PER_S / 1e9)

del x, out
