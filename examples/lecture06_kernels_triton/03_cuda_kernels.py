"""
A GeLU kernel in CUDA
=====================

We write one CUDA kernel by hand, with one thread per element. We compile it
from a Python string with ``torch.utils.cpp_extension.load_inline``, check it
against PyTorch, and time it against the memory floor. Afterwards you can turn
any elementwise formula into a compiled kernel and tell whether it is as fast
as memory allows.

**Requirements.** Full version: a CUDA GPU, the CUDA toolkit (``nvcc``) and a
C++ compiler. On a CPU the same algorithm is compiled as a C++ extension and
walks the same grid in a plain loop, so the page shows the real build, launch
arithmetic and checks, but CPU speed. Without a C++ compiler the build is
skipped and only the source is shown. On a T4 (compute capability 7.5, as on
free Colab notebooks) it runs as on any CUDA GPU.
"""

# %%
# Setup
# -----
# On a GPU, we time a large vector. On a CPU, the vector is smaller so the
# page builds quickly. The correctness checks use lengths that are not a
# multiple of the block size.

import json
import math
import os
import shutil
import subprocess
import sys
import tempfile
import time

import matplotlib.pyplot as plt
import torch
import torch.nn.functional as F
from torch.utils import benchmark, cpp_extension

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
N_TIMED = 1 << 26 if DEVICE == "cuda" else 1 << 21
COPY_BYTES = 1 << 30 if DEVICE == "cuda" else 1 << 26
CHECK_LENGTHS = (1, 1023, 1025, 1_000_003)
THREADS_PER_BLOCK = 1024  # the value of `threads` in both C++ sources below
torch.manual_seed(0)

DEVICE_NAME = torch.cuda.get_device_name() if DEVICE == "cuda" else "CPU"
print(f"device: {DEVICE_NAME}")
if DEVICE == "cuda":
    print("This machine builds and times the CUDA kernel.")
else:
    print("No CUDA GPU: the same grid runs as a C++ loop; timings are CPU timings.")

# %%
# Predict
# -------
# GeLU with the tanh approximation is
#
# .. math:: \mathrm{GeLU}(x) = \tfrac12 x \left(1 + \tanh\left(\sqrt{2/\pi}\,(x + 0.044715\,x^3)\right)\right).
#
# Written with PyTorch operators, each operator is its own kernel. Each kernel
# reads its inputs from memory and writes its result back. The comments count
# the float32 values read (r) and written (w) per element.

SQRT_2_OVER_PI = math.sqrt(2.0 / math.pi)


def manual_gelu(x):
    cube = x * x * x  # 2 kernels: r 4, w 2
    inner = SQRT_2_OVER_PI * (x + 0.044715 * cube)  # 3 kernels: r 4, w 3
    return 0.5 * x * (1.0 + torch.tanh(inner))  # 4 kernels: r 5, w 4


MANUAL_VALUES_MOVED = (4 + 4 + 5) + (2 + 3 + 4)  # reads + writes per element
FUSED_VALUES_MOVED = 1 + 1  # read x once, write y once
print(f"manual PyTorch GeLU: {MANUAL_VALUES_MOVED} float32 values moved per element")
print(f"one fused kernel:    {FUSED_VALUES_MOVED} float32 values moved per element")
predicted_speedup = MANUAL_VALUES_MOVED / FUSED_VALUES_MOVED
print(f"predicted speedup of a fused kernel if memory-bound: {predicted_speedup:.0f}x")

# %%
# The fused kernel does about nine operations per element, one of them a
# ``tanh`` of several instructions: a few FLOPs per 8 bytes. Elementwise
# float32 work runs on the GPU's ordinary float32 units, not the Tensor Cores,
# so the ridge that matters is theirs: on an H200 about 67 TFLOP/s over
# 4.8 TB/s, some 14 FLOPs per byte (`NVIDIA's H200 specifications
# <https://www.nvidia.com/en-us/data-center/h200/>`_). The kernel is below it,
# so it should run as fast as a plain copy of the same bytes.
# That is the floor we measure against: ``dst.copy_(src)`` also reads 4 and
# writes 4 bytes per element.

# %%
# The CUDA kernel
# ---------------
# The kernel computes its global index from its block and thread coordinates
# and handles one element. The host function checks its input, picks the
# launch configuration and launches the kernel on PyTorch's current stream.
# The number of blocks is rounded up, so the last block may have threads past
# the end of the vector. The ``if (i < n)`` guard keeps them idle.
#
# Two habits prevent silent failures. ``TORCH_CHECK`` turns a wrong input
# (CPU tensor, strided view, wrong dtype) into a Python ``RuntimeError``
# rather than garbage. ``C10_CUDA_KERNEL_LAUNCH_CHECK`` reads
# ``cudaGetLastError`` after the launch, so a bad launch configuration fails
# here and not at some later, unrelated call.

CUDA_SOURCE = r"""
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty_like.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

__global__ void gelu_kernel(const float* in, float* out, int64_t n) {
    int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
    if (i < n) {
        float x = in[i];
        float inner = 0.7978845608f * (x + 0.044715f * x * x * x);
        out[i] = 0.5f * x * (1.0f + tanhf(inner));
    }
}

at::Tensor gelu(const at::Tensor& x) {
    TORCH_CHECK(x.is_cuda(), "x must be a CUDA tensor");
    TORCH_CHECK(x.is_contiguous(), "x must be contiguous");
    TORCH_CHECK(x.scalar_type() == at::kFloat, "x must be float32");
    const c10::cuda::CUDAGuard guard(x.device());
    at::Tensor y = at::empty_like(x);
    const int64_t n = x.numel();
    const int threads = 1024;
    const unsigned int blocks = static_cast<unsigned int>((n + threads - 1) / threads);
    if (n > 0) {
        gelu_kernel<<<blocks, threads, 0, c10::cuda::getCurrentCUDAStream()>>>(
            x.data_ptr<float>(), y.data_ptr<float>(), n);
        C10_CUDA_KERNEL_LAUNCH_CHECK();
    }
    return y;
}
"""

# %%
# The CPU twin
# ------------
# A CPU cannot run ``__global__`` code. The twin below keeps the algorithm and
# the launch arithmetic: ``gelu_thread`` is the kernel body, and two loops walk
# every (block, thread) pair of the same grid, one after the other. The GPU
# runs all these threads at once.

CPU_SOURCE = r"""
#include <cmath>

static inline void gelu_thread(const float* in, float* out, int64_t n,
                               int64_t block, int64_t thread, int64_t threads) {
    int64_t i = block * threads + thread;
    if (i < n) {
        float x = in[i];
        float inner = 0.7978845608f * (x + 0.044715f * x * x * x);
        out[i] = 0.5f * x * (1.0f + std::tanh(inner));
    }
}

at::Tensor gelu(const at::Tensor& x) {
    TORCH_CHECK(x.device().is_cpu(), "x must be a CPU tensor");
    TORCH_CHECK(x.is_contiguous(), "x must be contiguous");
    TORCH_CHECK(x.scalar_type() == at::kFloat, "x must be float32");
    at::Tensor y = at::empty_like(x);
    const float* in = x.data_ptr<float>();
    float* out = y.data_ptr<float>();
    const int64_t n = x.numel();
    const int64_t threads = 1024;
    const int64_t blocks = (n + threads - 1) / threads;
    for (int64_t block = 0; block < blocks; ++block)
        for (int64_t thread = 0; thread < threads; ++thread)
            gelu_thread(in, out, n, block, thread, threads);
    return y;
}
"""

# %%
# Build
# -----
# ``load_inline`` writes the strings to files, compiles them with ``nvcc`` or
# the C++ compiler (through ninja), links a Python module and imports it. The
# ``functions`` argument asks it to generate the Python binding for ``gelu``.
# By default it prepends ``#include <torch/extension.h>``, which pulls in
# thousands of headers and dominates the build time. With
# ``no_implicit_headers=True`` we include only what the code uses.
#
# The build is cached: ``load_inline`` keeps it in a folder of PyTorch's
# extensions directory, and a later run with the same source and flags only
# checks that it is up to date and loads it. So that the time printed below is
# what a first build costs, we empty this extension's own folder first (a cold
# build). A rerun is a new process, so we then start one and time its
# ``load_inline`` of the same extension (the warm load). Example 04 loads this
# same CUDA build with the same arguments instead of compiling it again.

BINDING_HEADERS = """
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty_like.h>
#include <torch/csrc/utils/pybind.h>
"""
CUDA_DECLARATION = "at::Tensor gelu(const at::Tensor& x);"


def skip_or_fail(section, capability, reason):
    """Readers' runs skip a part whose tool is missing; the site's builds require it."""
    if capability in os.environ.get("COURSE_REQUIRE", "").split(","):
        raise RuntimeError(f"{section}: this build requires {capability}, but {reason}")
    print(f"Skipped {section}: {capability} is missing ({reason}).")


def compile_problem(command, suffix, code):
    """Why ``command`` cannot compile a one-line file of ``code``, or None if it can."""
    with tempfile.TemporaryDirectory() as folder:
        source = os.path.join(folder, "probe" + suffix)
        with open(source, "w") as file:
            file.write(code)
        try:
            done = subprocess.run([*command, "-c", source, "-o", source + ".o"],
                                  capture_output=True, text=True, check=False)
        except OSError as error:  # on PATH but not runnable, e.g. a script without #!
            return f"{command[0]} cannot be run ({error})"
    if done.returncode != 0:
        return f"{command[0]} fails on a one-line {suffix} file (exit {done.returncode})"
    return None


def cxx_problem(compiler):
    """Why the C++ compiler torch calls cannot build here, or None: probe, do not guess."""
    if shutil.which(compiler) is None:
        return f"no C++ compiler {compiler!r} is on PATH"
    return compile_problem([compiler], ".cpp", "int probe() { return 0; }\n")


def nvcc_problem():
    """Why the CUDA toolkit torch would use cannot build here, or None."""
    if cpp_extension.CUDA_HOME is None:
        return "no CUDA toolkit was found (CUDA_HOME, nvcc on PATH, /usr/local/cuda)"
    nvcc = os.path.join(cpp_extension.CUDA_HOME, "bin", "nvcc")
    if shutil.which(nvcc) is None:
        return f"{nvcc} does not exist"
    return compile_problem([nvcc], ".cu", "__global__ void probe() {}\n")


def missing_toolchain():
    """(capability, reason) for what this machine lacks to build the extension, or None."""
    problem = cxx_problem(cpp_extension.get_cxx_compiler())
    if problem is not None:
        return "cxx", problem
    if DEVICE == "cuda" and (problem := nvcc_problem()) is not None:
        return "nvcc", problem
    return None


# The arguments of the two builds, as plain data: example 04 loads the CUDA
# build with exactly these.
GELU_CUDA_EXTENSION = {
    "name": "lecture06_gelu_cuda",
    "cpp_sources": BINDING_HEADERS + CUDA_DECLARATION,
    "cuda_sources": CUDA_SOURCE,
    "functions": ["gelu"],
    "extra_cflags": ["-O2"],
    "no_implicit_headers": True,
    "with_pytorch_error_handling": False,
    "verbose": False,
}
GELU_CPU_TWIN_EXTENSION = {
    "name": "lecture06_gelu_cpu_twin",
    "cpp_sources": BINDING_HEADERS + CPU_SOURCE,
    "functions": ["gelu"],
    "extra_cflags": ["-O2"],
    "no_implicit_headers": True,
    "with_pytorch_error_handling": False,
    "verbose": False,
}
GELU_EXTENSION = GELU_CUDA_EXTENSION if DEVICE == "cuda" else GELU_CPU_TWIN_EXTENSION


def build_gelu_extension():
    """A cold build: empty the folder ``load_inline`` builds in, then compile and load."""
    # torch has no public name for that folder (under TORCH_EXTENSIONS_DIR, or its default)
    shutil.rmtree(cpp_extension._get_build_directory(GELU_EXTENSION["name"], verbose=False))
    if DEVICE == "cuda":
        return cpp_extension.load_inline(**GELU_CUDA_EXTENSION)
    return cpp_extension.load_inline(**GELU_CPU_TWIN_EXTENSION)


WARM_LOAD = """
import json, sys, time
from torch.utils import cpp_extension
arguments = json.load(sys.stdin)
start = time.perf_counter()
cpp_extension.load_inline(**arguments)
print(time.perf_counter() - start)
"""


def warm_load_seconds():
    """Seconds ``load_inline`` takes in a new Python process that finds the build up to date."""
    done = subprocess.run([sys.executable, "-c", WARM_LOAD], input=json.dumps(GELU_EXTENSION),
                          capture_output=True, text=True, check=True)
    return float(done.stdout.split()[-1])


gelu_extension = None
missing = missing_toolchain()
skip_reason = None if missing is None else missing[1]
if missing is None:
    start = time.perf_counter()
    gelu_extension = build_gelu_extension()  # a working compiler that fails here fails the page
    cold_build_seconds = time.perf_counter() - start
    warm_seconds = warm_load_seconds()
    kind = "CUDA kernel" if DEVICE == "cuda" else "C++ CPU twin"
    print(f"{kind}: cold build and load {cold_build_seconds:.1f} s, "
          f"warm load in a new process {warm_seconds:.2f} s")
else:
    skip_or_fail("the build and everything that runs the extension", *missing)

# %%
# Verify
# ------
# Fresh random inputs of several lengths, none of them a multiple of the
# 1024-thread block, are compared with PyTorch's own
# ``F.gelu(approximate="tanh")`` in float32, and with the same formula in
# float64 to see how far each is from the exact value.
# ``assert_close`` raises on a mismatch, so a wrong kernel fails the build.
# Last, we feed the kernel a strided view to confirm that ``TORCH_CHECK``
# rejects it.


def check_against_pytorch(gelu):
    header = ("length", "blocks", "idle threads", "max err ours", "max err F.gelu")
    print("{:>10} {:>7} {:>13} {:>13} {:>15}".format(*header))
    for n in CHECK_LENGTHS:
        x = 4 * torch.randn(n, device=DEVICE)
        ours = gelu(x)
        torch_fp32 = F.gelu(x, approximate="tanh")
        exact = F.gelu(x.double(), approximate="tanh")
        # float32's default tolerance: a few roundings and a few-ulp tanhf, relative to the
        # output (rtol 1.3e-6 = 11 eps, CPU or GPU); atol 1e-5 for outputs near 0 (x < 0)
        torch.testing.assert_close(ours, torch_fp32, rtol=1.3e-6, atol=1e-5)
        torch.testing.assert_close(ours, exact.float(), rtol=1.3e-6, atol=1e-5)
        blocks = math.ceil(n / THREADS_PER_BLOCK)
        idle = blocks * THREADS_PER_BLOCK - n
        err_ours = (ours.double() - exact).abs().max().item()
        err_torch = (torch_fp32.double() - exact).abs().max().item()
        print(f"{n:>10} {blocks:>7} {idle:>13} {err_ours:>13.2e} {err_torch:>15.2e}")


def check_rejects_strided_input(gelu):
    strided = torch.randn(2 * 1025, device=DEVICE)[::2]
    try:
        gelu(strided)
    except RuntimeError as error:
        print(f"strided input rejected: {str(error).splitlines()[0]}")
    else:
        raise AssertionError("the kernel accepted a non-contiguous tensor")


if gelu_extension is not None:
    check_against_pytorch(gelu_extension.gelu)
    check_rejects_strided_input(gelu_extension.gelu)

# %%
# Measure
# -------
# ``torch.utils.benchmark.Timer`` handles warm-up, repetition and, on a GPU,
# synchronization. On a CPU it runs on one thread by default. That is fair
# here, since our C++ loop is single-threaded too. The ceiling is this
# machine's copy bandwidth, measured with a large ``dst.copy_(src)`` (bytes
# moved = 2 x size). Dividing GeLU's bytes by it gives the floor: the least
# time any GeLU can take.


def median_seconds(fn, x):
    timer = benchmark.Timer(stmt="fn(x)", globals={"fn": fn, "x": x})
    return timer.blocked_autorange(min_run_time=0.3).median


def copy_bandwidth(n_bytes):
    """Bytes per second of ``dst.copy_(src)``, counting reads and writes."""
    src = torch.randn(n_bytes // 4, device=DEVICE)
    dst = torch.empty_like(src)
    return 2 * n_bytes / median_seconds(dst.copy_, src)


def time_gelus(candidates, x):
    bytes_moved = FUSED_VALUES_MOVED * x.element_size() * x.numel()
    ceiling = copy_bandwidth(COPY_BYTES)
    print(f"measured copy bandwidth: {ceiling / 1e9:.1f} GB/s")
    print(f"{'implementation':<16} {'time (ms)':>10} {'GB/s':>8} {'% of copy':>10}")
    times = {}
    for name, fn in candidates.items():
        times[name] = median_seconds(fn, x)
        achieved = bytes_moved / times[name]
        percent = 100 * achieved / ceiling
        print(f"{name:<16} {times[name] * 1e3:>10.3f} {achieved / 1e9:>8.1f} {percent:>10.1f}")
    return times, bytes_moved / ceiling


candidates = {
    "manual PyTorch": manual_gelu,
    "F.gelu (tanh)": lambda x: F.gelu(x, approximate="tanh"),
}
if gelu_extension is not None:
    candidates["ours, CUDA" if DEVICE == "cuda" else "ours, C++ loop"] = gelu_extension.gelu

x_timed = torch.randn(N_TIMED, device=DEVICE)
times, floor_time = time_gelus(candidates, x_timed)

# %%
# Plot
# ----
# One bar per implementation. The dashed line is the floor: the bytes of one
# fused GeLU divided by the measured copy bandwidth.

fig, ax = plt.subplots(figsize=(6.4, 4))
names = list(times)
colors = ["tab:gray", "tab:blue", "tab:orange"][: len(names)]
ax.bar(names, [times[name] * 1e3 for name in names], color=colors)
ax.axhline(
    floor_time * 1e3, color="black", linestyle="--", label="floor: bytes / copy bandwidth"
)
ax.set_ylabel("time per call (ms)")
ax.set_title(f"GeLU on {N_TIMED:,} float32, {DEVICE_NAME}")
ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.12), ncol=3, frameon=False)
fig.tight_layout()

# %%
# Read the result
# ---------------
# On a GPU, the hand-written kernel reads each element once and writes it
# once. It should sit close to the copy floor and be several times faster
# than the manual PyTorch version, which launches nine kernels and moves
# about eleven times the bytes (see the prediction above). ``F.gelu`` is
# already one fused kernel in PyTorch, so ours can only match it. Its value
# is that the same recipe works for formulas PyTorch has no kernel for.
#
# On a CPU, the table compares a scalar C++ loop with PyTorch's CPU kernels,
# all on one thread. ``F.gelu`` evaluates ``tanh`` on several elements at
# once with SIMD instructions, while our loop calls ``std::tanh`` on one
# element at a time. On one core, this arithmetic sets the time, not memory,
# so none of them reaches the floor. The manual version is still slower than
# ``F.gelu`` because of its extra passes over memory. A GPU has far more
# arithmetic per byte, which is why the same kernel is memory-bound there.
#
# The next example,
# :ref:`sphx_glr_auto_examples_lecture06_kernels_triton_04_triton_basics.py`,
# writes the same kernel in Triton, which takes care of the thread indexing
# and launch details for us.

del x_timed

# %%
# Key figures
# -----------
# The numbers this example exists to measure, collected for the course's GPU check.

gelu_bytes = FUSED_VALUES_MOVED * 4 * N_TIMED  # float32 in and out
copy_gbs = gelu_bytes / floor_time / 1e9
KEY_FIGURES = {
    "device": DEVICE_NAME,
    "backend": f"none ({skip_reason})",
    "copy_GBps": copy_gbs,
    "F_gelu_GBps": gelu_bytes / times["F.gelu (tanh)"] / 1e9,
    "manual_over_F_gelu_time": times["manual PyTorch"] / times["F.gelu (tanh)"],
}
if gelu_extension is not None:
    ours_seconds = times["ours, CUDA" if DEVICE == "cuda" else "ours, C++ loop"]
    KEY_FIGURES["backend"] = "CUDA" if DEVICE == "cuda" else "C++"
    KEY_FIGURES["ours_gelu_GBps"] = gelu_bytes / ours_seconds / 1e9
    KEY_FIGURES["ours_gelu_fraction_of_copy_bw"] = KEY_FIGURES["ours_gelu_GBps"] / copy_gbs
    KEY_FIGURES["manual_over_ours_time"] = times["manual PyTorch"] / ours_seconds
    KEY_FIGURES["cold_build_s"] = cold_build_seconds
    KEY_FIGURES["warm_load_s"] = warm_seconds
