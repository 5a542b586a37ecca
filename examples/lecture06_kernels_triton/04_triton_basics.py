"""
Triton basics: masks, block sizes and GeLU five ways
====================================================

We write a vector add and a GeLU in Triton. The mask makes them correct on
any length, and a sweep shows what the block size changes. Then we compare
five ways to compute GeLU against the memory floor. Afterwards you can write
an elementwise Triton kernel, pick its block size, and judge it by the
fraction of copy bandwidth it reaches.

**Requirements.** Full version: a CUDA GPU and Triton. The fifth GeLU, a CUDA
kernel, also needs ``nvcc`` and a C++ compiler. On a CPU, Triton runs in
interpreter mode (``TRITON_INTERPRET=1``) at small sizes: the page checks
every kernel and counts programs, but times only PyTorch and
``torch.compile``. That a Triton kernel inside ``torch.compile`` stays one
graph is checked on a GPU only. Without Triton, the Triton parts are skipped.
On a T4 (compute capability 7.5, as on free Colab notebooks) it runs as on any
CUDA GPU.
"""

# %%
# Setup
# -----
# On a CPU, ``TRITON_INTERPRET=1`` must be set before Triton is imported.
# Each program then runs as NumPy code, one after another. That is good for
# checking results and useless for timing.

import math
import os
import shutil
import subprocess
import tempfile
import time
import warnings

import matplotlib.pyplot as plt
import torch
import torch.nn.functional as F
from torch.utils import benchmark, cpp_extension

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

# Inductor imports Triton (where it is installed), so it comes after TRITON_INTERPRET.
import torch._inductor.config as inductor_config
from torch._dynamo.utils import counters
from torch._inductor.utils import clear_inductor_caches, fresh_cache

ON_GPU = DEVICE == "cuda"
CHECK_LENGTHS = (1, 1000, 98_437)  # 98_437 is odd: no block size divides it
BLOCK_SIZES = [64, 128, 256, 512, 1024, 2048, 4096]
SWEEP_CHECK_LENGTH = 20_011  # leaves a partial last block for every block size
N_SWEEP_TIMED = 1 << 26  # GPU only
N_GELU_TIMED = 1 << 26 if ON_GPU else 200_003
N_GELU_CHECK = 1_000_003 if ON_GPU else N_GELU_TIMED  # one torch.compile on CPU
COPY_BYTES = 1 << 30 if ON_GPU else 1 << 26
torch.manual_seed(0)

DEVICE_NAME = torch.cuda.get_device_name() if ON_GPU else "CPU"


def skip_or_fail(section, capability, reason):
    """Readers' runs skip a part whose tool is missing; the site's builds require it."""
    if capability in os.environ.get("COURSE_REQUIRE", "").split(","):
        raise RuntimeError(f"{section}: this build requires {capability}, but {reason}")
    print(f"Skipped {section}: {capability} is missing ({reason}).")


if not HAVE_TRITON:
    skip_or_fail("the Triton kernels", "triton", f"import triton failed: {TRITON_IMPORT_ERROR}")
elif ON_GPU:
    print(f"{DEVICE_NAME}: Triton compiled and timed at full size.")
else:
    print("CPU: Triton interpreted, so its kernels are checked, not timed.")

# %%
# Timing and the copy ceiling
# ---------------------------
# On CUDA, :func:`triton.testing.do_bench` times with CUDA events and clears
# the L2 cache between runs. Otherwise :mod:`torch.utils.benchmark` times,
# on one CPU thread by default. The ceiling for a memory-bound kernel is this
# machine's copy bandwidth: a large ``dst.copy_(src)`` that reads and writes
# each byte once.


def time_ms(fn, *args):
    """Median run time of ``fn(*args)`` in milliseconds."""
    if ON_GPU and HAVE_TRITON:
        return triton.testing.do_bench(lambda: fn(*args), return_mode="median")
    timer = benchmark.Timer(stmt="fn(*args)", globals={"fn": fn, "args": args})
    return timer.blocked_autorange(min_run_time=0.2).median * 1e3


def copy_bandwidth_gbs(n_bytes):
    """GB/s of ``dst.copy_(src)``, counting the bytes read and written."""
    src = torch.randn(n_bytes // 4, device=DEVICE)
    dst = torch.empty_like(src)
    return 2 * n_bytes / time_ms(dst.copy_, src) / 1e6


COPY_GBS = copy_bandwidth_gbs(COPY_BYTES)
print(f"measured copy bandwidth: {COPY_GBS:.1f} GB/s")

# %%
# Vector add with a mask
# ----------------------
# A Triton kernel is written for one *program*, which handles a block of
# ``BLOCK_SIZE`` elements with vector operations. We launch
# ``cdiv(n, BLOCK_SIZE)`` programs, and program ``p`` covers offsets
# ``p * BLOCK_SIZE`` to ``p * BLOCK_SIZE + BLOCK_SIZE - 1``. When ``n`` is no
# multiple of the block, the last program reaches past the end of the
# tensors. The mask ``offsets < n`` switches those lanes off: masked loads
# read nothing, and masked stores write nothing.

if HAVE_TRITON:

    @triton.jit
    def add_kernel(x_ptr, y_ptr, out_ptr, n_elements, BLOCK_SIZE: tl.constexpr):
        offsets = tl.program_id(axis=0) * BLOCK_SIZE + tl.arange(0, BLOCK_SIZE)
        mask = offsets < n_elements
        x = tl.load(x_ptr + offsets, mask=mask)
        y = tl.load(y_ptr + offsets, mask=mask)
        tl.store(out_ptr + offsets, x + y, mask=mask)

    def triton_add(x, y, block_size=1024):
        out = torch.empty_like(x)
        grid = (triton.cdiv(x.numel(), block_size),)
        add_kernel[grid](x, y, out, x.numel(), BLOCK_SIZE=block_size)
        return out


# %%
# Without the mask
# ----------------
# We do not run the unmasked kernel. Here is what it would do. In the last
# program, the lanes past ``n`` would load whatever lies after the tensors in
# memory: another tensor's data, or an unmapped page, which crashes with an
# illegal memory access. Their stores would overwrite memory the kernel does
# not own. That corruption shows up later, somewhere else, or not at all on
# the lengths you happened to test. The table counts these lanes for the
# lengths checked below. Each would be an out-of-bounds access without the
# mask.


def out_of_bounds_lanes(n, block_size):
    programs = math.ceil(n / block_size)
    return programs, programs * block_size - n


print(f"{'n':>8} {'BLOCK_SIZE':>10} {'programs':>9} {'lanes past the end':>19}")
for n in CHECK_LENGTHS:
    programs, past_end = out_of_bounds_lanes(n, 1024)
    print(f"{n:>8} {1024:>10} {programs:>9} {past_end:>19}")

# %%
# Verify the vector add
# ---------------------
# A float32 sum is exact to the bit whichever code computes it, so the
# tolerance is zero. We check every length above and every block size of the
# sweep, each time on fresh random inputs.


def check_add(n, block_size):
    x = torch.randn(n, device=DEVICE)
    y = torch.randn(n, device=DEVICE)
    # one correctly rounded float32 add per element, on any device: exactly equal
    torch.testing.assert_close(triton_add(x, y, block_size), x + y, rtol=0, atol=0)


if HAVE_TRITON:
    for n in CHECK_LENGTHS:
        check_add(n, 1024)
    for block_size in BLOCK_SIZES:
        check_add(SWEEP_CHECK_LENGTH, block_size)
    print("Triton add matches x + y on every length and block size")

# %%
# Block-size sweep
# ----------------
# The block size sets how many programs are launched and how much work each
# one does. A GPU keeps only a limited number of programs resident on each
# streaming multiprocessor. With tiny blocks, those programs together have
# too few bytes in flight to hide the memory latency. Very large blocks give
# each thread many elements to hold in registers. In between, a memory-bound
# kernel should reach the copy bandwidth. Vector add reads two floats and writes one, so we count
# 12 bytes per element.
#
# On the GPU the timed length is a power of two. Triton specializes on
# integer arguments divisible by 16, so it can prove that the mask is constant
# over groups of lanes and use wide loads. A length like 98437 is correct but
# may lose a little speed.


def program_counts(n):
    return [math.ceil(n / block_size) for block_size in BLOCK_SIZES]


def add_bandwidth_sweep(n):
    x = torch.randn(n, device=DEVICE)
    y = torch.randn(n, device=DEVICE)
    bytes_moved = 3 * 4 * n
    triton_gbs = [
        bytes_moved / time_ms(triton_add, x, y, block_size) / 1e6
        for block_size in BLOCK_SIZES
    ]
    torch_gbs = bytes_moved / time_ms(torch.add, x, y) / 1e6
    return triton_gbs, torch_gbs


def plot_bandwidth_sweep(triton_gbs, torch_gbs):
    fig, ax = plt.subplots(figsize=(6.4, 4))
    ax.plot(BLOCK_SIZES, triton_gbs, "o-", label="Triton add")
    ax.axhline(torch_gbs, color="tab:orange", label="torch add")
    ax.axhline(COPY_GBS, color="black", linestyle="--", label="measured copy")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("BLOCK_SIZE (elements per program)")
    ax.set_ylabel("effective bandwidth (GB/s)")
    ax.set_title(f"Vector add, {N_SWEEP_TIMED:,} float32, {DEVICE_NAME}")
    ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.2), ncol=3, frameon=False)
    fig.tight_layout()


def plot_program_counts(n):
    fig, ax = plt.subplots(figsize=(6.4, 4))
    ax.plot(BLOCK_SIZES, program_counts(n), "o-")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("BLOCK_SIZE (elements per program)")
    ax.set_ylabel("programs launched")
    ax.set_title(f"Vector add of {n:,} elements, {DEVICE_NAME} (interpreter)")
    fig.tight_layout()


counted_length = N_SWEEP_TIMED if ON_GPU else SWEEP_CHECK_LENGTH
print(f"programs launched for n = {counted_length}")
print(f"{'BLOCK_SIZE':>10} {'programs':>9}")
for block_size, programs in zip(BLOCK_SIZES, program_counts(counted_length)):
    print(f"{block_size:>10} {programs:>9}")

if HAVE_TRITON and ON_GPU:
    triton_gbs, torch_gbs = add_bandwidth_sweep(N_SWEEP_TIMED)
    print(f"{'BLOCK_SIZE':>10} {'GB/s':>8} {'% of copy':>10}")
    for block_size, gbs in zip(BLOCK_SIZES, triton_gbs):
        print(f"{block_size:>10} {gbs:>8.1f} {100 * gbs / COPY_GBS:>10.1f}")
    best = max(triton_gbs)
    print(f"best Triton add: {100 * best / COPY_GBS:.1f}% of copy bandwidth (target >= 90%)")
    print(f"torch add:       {100 * torch_gbs / COPY_GBS:.1f}% of copy bandwidth")
    print(f"best Triton add / torch add: {best / torch_gbs:.2f}")
    plot_bandwidth_sweep(triton_gbs, torch_gbs)
elif HAVE_TRITON:
    print("Interpreted Triton time means nothing for a GPU: we plot programs launched.")
    plot_program_counts(SWEEP_CHECK_LENGTH)

# %%
# GeLU in Triton
# --------------
# Triton offers ``tanh`` in ``triton.language.extra.libdevice`` (the vendors'
# math libraries; Inductor emits it for ``torch.tanh``) and the logistic
# sigmoid :math:`\sigma` as ``tl.sigmoid``. Triton 3.6's interpreter runs only
# the second, so the kernel uses the identity
# :math:`\tfrac12(1 + \tanh z) = \sigma(2z)`: :math:`\mathrm{GeLU}(x) = x\,\sigma(2z)`
# with :math:`z = \sqrt{2/\pi}\,(x + 0.044715\,x^3)`. Large :math:`|z|` is no
# problem: :math:`\sigma(2z) = 1/(1 + e^{-2z})` tends to 0 or 1 as the
# exponential tends to infinity or 0.

SQRT_2_OVER_PI = math.sqrt(2.0 / math.pi)

if HAVE_TRITON:

    @triton.jit
    def gelu_kernel(x_ptr, out_ptr, n_elements, BLOCK_SIZE: tl.constexpr):
        offsets = tl.program_id(axis=0) * BLOCK_SIZE + tl.arange(0, BLOCK_SIZE)
        mask = offsets < n_elements
        x = tl.load(x_ptr + offsets, mask=mask)
        z = 0.7978845608028654 * (x + 0.044715 * x * x * x)
        tl.store(out_ptr + offsets, x * tl.sigmoid(2.0 * z), mask=mask)

    def triton_gelu(x, block_size=1024):
        out = torch.empty_like(x)
        grid = (triton.cdiv(x.numel(), block_size),)
        gelu_kernel[grid](x, out, x.numel(), BLOCK_SIZE=block_size)
        return out


# %%
# The other four ways
# -------------------
# The manual PyTorch version runs nine kernels and moves 22 float32 values per
# element. One fused kernel moves two, so it should be about eleven times
# faster if both are memory-bound. ``torch.compile`` should find that fusion
# by itself. On a GPU it generates a Triton kernel much like ours. On a CPU it
# generates vectorized C++.
#
# Its first call compiles, and Inductor and Triton keep what they compile in
# caches on disk, so the first call of a second run is far quicker. We time
# it both ways: once with empty caches (``fresh_cache`` gives Inductor and
# Triton new, empty cache folders), and once more after
# ``torch.compiler.reset()``, which makes Dynamo forget the compiled function,
# and ``clear_inductor_caches()``, which empties Inductor's copies in memory.
# The caches on disk stay, as a second run would find them, and the example
# asserts that the second compile found its graph in Inductor's FX graph cache.
#
# The CUDA kernel is the one of
# :ref:`sphx_glr_auto_examples_lecture06_kernels_triton_03_cuda_kernels.py`,
# only where CUDA is present. It is loaded with the same ``load_inline``
# arguments, so it lands in the same build folder: after example 03 has run,
# the build is found up to date and only loaded; run on its own, this example
# builds it.


def manual_gelu(x):
    cube = x * x * x  # 2 kernels: read 4, write 2
    inner = SQRT_2_OVER_PI * (x + 0.044715 * cube)  # 3 kernels: read 4, write 3
    return 0.5 * x * (1.0 + torch.tanh(inner))  # 4 kernels: read 5, write 4


def library_gelu(x):
    return F.gelu(x, approximate="tanh")


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
BINDING_HEADERS = """
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty_like.h>
#include <torch/csrc/utils/pybind.h>
"""
CUDA_DECLARATION = "at::Tensor gelu(const at::Tensor& x);"


# Each tool is probed with a one-line job first: a missing tool skips its way (and
# fails a site build, which requires it), while a failure on our own code fails the page.


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
    """Why the C++ compiler torch calls cannot build here, or None."""
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


def inductor_problem():
    """(capability, reason) if torch.compile cannot work here, or None."""
    if not ON_GPU and (problem := cxx_problem(inductor_config.cpp.cxx[-1])) is not None:
        return "cxx", problem  # Inductor's compiler on a CPU: $CXX, else g++
    if ON_GPU and not HAVE_TRITON:
        return "triton", f"import triton failed: {TRITON_IMPORT_ERROR}"
    try:
        torch.compile(lambda t: 2 * t + 1)(torch.arange(5.0, device=DEVICE))
    except Exception as error:  # noqa: BLE001 (a one-line function failed: Inductor is broken)
        return "inductor", f"a one-line torch.compile failed, {type(error).__name__}"
    finally:
        torch.compiler.reset()
    return None


# The arguments of example 03's CUDA build, to the letter: the same build is then found
# up to date, instead of being compiled a second time.
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


def built_libraries(folder):
    """Modification time of each library in a build folder: a rebuild changes them."""
    return {name: os.path.getmtime(os.path.join(folder, name))
            for name in os.listdir(folder) if name.endswith(".so")}


def build_cuda_gelu():
    """The CUDA GeLU as a Python function, or None where it cannot be built."""
    if not ON_GPU:
        print("CUDA GeLU: absent, no CUDA GPU on this machine.")
        return None
    for capability, problem in (("cxx", cxx_problem(cpp_extension.get_cxx_compiler())),
                                ("nvcc", nvcc_problem())):
        if problem is not None:
            skip_or_fail("the CUDA GeLU", capability, problem)
            return None
    # the folder load_inline builds in (torch has no public name for it)
    folder = cpp_extension._get_build_directory(GELU_CUDA_EXTENSION["name"], verbose=False)
    libraries_before = built_libraries(folder)
    start = time.perf_counter()
    module = cpp_extension.load_inline(**GELU_CUDA_EXTENSION)
    seconds = time.perf_counter() - start
    if libraries_before and built_libraries(folder) == libraries_before:
        print(f"CUDA GeLU: the build was up to date (example 03 makes the same one), "
              f"loaded in {seconds:.2f} s")
    else:
        print(f"CUDA GeLU: built and loaded in {seconds:.1f} s")
    return module.gelu


COMPILE_SECONDS = {}


def compile_gelu(example_input):
    """``torch.compile`` of the manual GeLU, or None where torch.compile cannot work."""
    missing = inductor_problem()
    if missing is not None:
        skip_or_fail("GeLU by torch.compile", *missing)
        return None
    with fresh_cache():
        start = time.perf_counter()
        torch.compile(manual_gelu, dynamic=False)(example_input)
        cold_seconds = time.perf_counter() - start
        torch.compiler.reset()  # Dynamo only
        clear_inductor_caches()  # Inductor's in-memory copies; the on-disk caches stay
        counters.clear()
        start = time.perf_counter()
        compiled = torch.compile(manual_gelu, dynamic=False)
        compiled(example_input)
        warm_seconds = time.perf_counter() - start
    cache_hits = counters["inductor"]["fxgraph_cache_hit"]
    if cache_hits < 1:
        raise AssertionError("the second compile did not hit Inductor's FX graph cache")
    print(f"torch.compile: first call {cold_seconds:.1f} s with empty caches, "
          f"{warm_seconds:.2f} s with warm caches (Inductor cache hits: {cache_hits})")
    COMPILE_SECONDS.update(cold=cold_seconds, warm=warm_seconds)
    return compiled


gelu_ways = {"manual PyTorch": manual_gelu, "F.gelu": library_gelu}
compiled_gelu = compile_gelu(torch.randn(N_GELU_CHECK, device=DEVICE))
if compiled_gelu is not None:
    gelu_ways["torch.compile"] = compiled_gelu
if HAVE_TRITON:
    gelu_ways["Triton"] = triton_gelu
cuda_gelu = build_cuda_gelu()
if cuda_gelu is not None:
    gelu_ways["CUDA"] = cuda_gelu

# %%
# Verify the five ways
# --------------------
# Each way runs on its own fresh random input, of a length that no block size
# divides, and is compared with the same formula in float64. The table gives
# each way's largest error: float32 rounding, of the same order for every way.


def check_gelu(gelu):
    """Largest error of ``gelu`` on a fresh input; raises if it is not float32 rounding."""
    x = 4 * torch.randn(N_GELU_CHECK, device=DEVICE)
    exact = F.gelu(x.double(), approximate="tanh")
    with warnings.catch_warnings():  # interpreted sigmoid: NumPy's exp overflows to inf, as it should
        warnings.filterwarnings("ignore", "overflow encountered in exp", RuntimeWarning)
        result = gelu(x)
    # float32's default: a few roundings and a few-ulp exp or tanh, relative to the output
    # (rtol 1.3e-6 = 11 eps, on any device); atol 1e-5 for outputs near 0 (x < 0)
    torch.testing.assert_close(result, exact.float(), rtol=1.3e-6, atol=1e-5)
    return (result.double() - exact).abs().max().item()


print(f"{'way':<15} {'max |error| vs float64':>23}")
for name, gelu in gelu_ways.items():
    print(f"{name:<15} {check_gelu(gelu):>23.2e}")

# %%
# Time the five ways
# ------------------
# A fused GeLU reads 4 bytes and writes 4 bytes per element. At the measured
# copy bandwidth, that takes at least ``8 n / bandwidth``, the floor in the
# chart. Interpreted Triton is left out of the CPU chart: its time measures
# the interpreter, not the kernel.

x_timed = torch.randn(N_GELU_TIMED, device=DEVICE)
floor_ms = 8 * N_GELU_TIMED / COPY_GBS / 1e6
timed_ways = {
    name: gelu for name, gelu in gelu_ways.items() if ON_GPU or name != "Triton"
}
gelu_ms = {name: time_ms(gelu, x_timed) for name, gelu in timed_ways.items()}

print(f"{'way':<15} {'time (ms)':>10} {'GB/s':>8} {'% of copy':>10}")
for name, ms in gelu_ms.items():
    gbs = 8 * N_GELU_TIMED / ms / 1e6
    print(f"{name:<15} {ms:>10.3f} {gbs:>8.1f} {100 * gbs / COPY_GBS:>10.1f}")
print(f"{'floor':<15} {floor_ms:>10.3f} {COPY_GBS:>8.1f} {100.0:>10.1f}")
if HAVE_TRITON and not ON_GPU:
    print("Triton: interpreted on this CPU, checked above, not timed")

fig, ax = plt.subplots(figsize=(6.4, 4))
ax.bar(list(gelu_ms), list(gelu_ms.values()), color="tab:blue")
ax.axhline(floor_ms, color="black", linestyle="--", label="floor: bytes / copy bandwidth")
ax.set_ylabel("time per call (ms)")
ax.set_title(f"GeLU on {N_GELU_TIMED:,} float32, {DEVICE_NAME}")
ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.12), ncol=3, frameon=False)
fig.tight_layout()

# %%
# Our Triton kernel inside torch.compile
# --------------------------------------
# A hand-written kernel does not stop the compiler. Since PyTorch 2.3, Dynamo
# recognises the launch of a ``@triton.jit`` kernel and records it as one
# node of the graph, instead of breaking the graph there; Inductor then calls
# our kernel from the code it generates, between the kernels it writes for the
# PyTorch operations around it. ``torch._dynamo.explain`` counts the graphs
# and graph breaks, and ``fullgraph=True`` would turn any break into an error,
# so the function below must come out as one graph, with the right values.
#
# This needs a GPU. Dynamo recognises Triton kernels only where Triton can
# compile for a device; to Dynamo an interpreted kernel is ordinary Python,
# and tracing it means tracing the interpreter itself.


def residual_gelu(x):
    """PyTorch operations around our Triton GeLU, as a model would mix them."""
    return x + triton_gelu(2.0 * x)


def assert_one_graph(fn, *args):
    """Raise unless Dynamo captures ``fn(*args)`` as one graph with no graph break."""
    explanation = torch._dynamo.explain(fn)(*args)
    print(f"torch._dynamo.explain({fn.__name__}): {explanation.graph_count} graph(s), "
          f"{explanation.graph_break_count} graph break(s)")
    if explanation.graph_count != 1 or explanation.graph_break_count != 0:
        raise RuntimeError(f"{fn.__name__}: expected one graph and no break, "
                           f"got {explanation.break_reasons}")


if HAVE_TRITON and ON_GPU and compiled_gelu is not None:
    assert_one_graph(residual_gelu, torch.randn(N_GELU_CHECK, device=DEVICE))
    compiled_residual_gelu = torch.compile(residual_gelu, fullgraph=True)
    x = 4 * torch.randn(N_GELU_CHECK, device=DEVICE)
    exact = x.double() + F.gelu(2.0 * x.double(), approximate="tanh")
    # as check_gelu's: float32 rounding relative to the output, 1e-5 near 0
    torch.testing.assert_close(compiled_residual_gelu(x), exact.float(), rtol=1.3e-6, atol=1e-5)
    print("compiled with fullgraph=True around the Triton kernel: matches float64")
    del x, exact
elif HAVE_TRITON:
    print("Triton inside torch.compile: shown on a GPU only (here the kernel is interpreted).")

# %%
# Read the result
# ---------------
# **Masks.** The mask costs one compare per lane and makes the kernel correct
# for every length. Only the last program ever has lanes switched off.
#
# **Block size.** On a GPU, the sweep shows too-small blocks falling short of
# the copy line. The programs are too small to keep enough memory requests in
# flight. From a few hundred elements per program on, the add should run at
# nearly the copy bandwidth, level with ``torch.add``. The table above gives
# the fraction reached. On a CPU, the chart shows only what is certain: the
# number of programs halves each time the block doubles. The interpreter runs
# them one at a time, so its time says nothing about a GPU.
#
# **GeLU five ways.** On a GPU, every fused way (``F.gelu``,
# ``torch.compile``, Triton, CUDA) should land near the floor. The manual
# version should take several times longer, because it moves about eleven
# times the bytes. How you fuse matters less than *that* you fuse. On a CPU,
# ``tanh`` costs more arithmetic per element, and since every way is timed on
# one thread, the gaps reflect vectorization as much as memory traffic.
#
# **Compile time.** The first call of ``torch.compile`` with empty caches is
# what a new model, or a changed one, costs; with warm caches the same first
# call costs a small part of that, because it only traces the function and
# finds the compiled code on disk. Compare first-call times only when you know
# which of the two they are. The same holds for the CUDA build, which
# example 03 times cold and warm.

# sphinx_gallery_thumbnail_number = 2
del x_timed

# %%
# Key figures
# -----------
# The numbers this example exists to measure, collected for the course's GPU check.

KEY_FIGURES = {"device": DEVICE_NAME, "copy_GBps": COPY_GBS}
if HAVE_TRITON and ON_GPU:
    KEY_FIGURES["add_best_GBps"] = max(triton_gbs)
    KEY_FIGURES["add_best_fraction_of_copy_bw"] = max(triton_gbs) / COPY_GBS
    KEY_FIGURES["add_best_BLOCK_SIZE"] = BLOCK_SIZES[triton_gbs.index(max(triton_gbs))]
    KEY_FIGURES["add_best_over_torch_add"] = max(triton_gbs) / torch_gbs
GELU_KEY_NAMES = {"manual PyTorch": "manual", "F.gelu": "F_gelu", "torch.compile": "compiled",
                  "Triton": "triton", "CUDA": "cuda"}
for name, ms in gelu_ms.items():
    KEY_FIGURES[f"gelu_{GELU_KEY_NAMES[name]}_fraction_of_copy_bw"] = floor_ms / ms
if COMPILE_SECONDS:
    KEY_FIGURES["compile_first_call_cold_s"] = COMPILE_SECONDS["cold"]
    KEY_FIGURES["compile_first_call_warm_s"] = COMPILE_SECONDS["warm"]

# The Triton calls of the CUDA branch, for the course's ahead-of-time compile check: it
# calls each host function on shape-only tensors, with DEVICE == "cuda", and compiles
# every launch for five GPU generations. (host function, [(shape, dtype)], keywords)
GPU_LAUNCHES = (
    [("triton_add", [((n,), torch.float32)] * 2, {"block_size": 1024}) for n in CHECK_LENGTHS]
    + [("triton_add", [((n,), torch.float32)] * 2, {"block_size": block_size})
       for n in (SWEEP_CHECK_LENGTH, N_SWEEP_TIMED) for block_size in BLOCK_SIZES]
    + [("triton_gelu", [((n,), torch.float32)], {}) for n in (N_GELU_CHECK, N_GELU_TIMED)]
)
