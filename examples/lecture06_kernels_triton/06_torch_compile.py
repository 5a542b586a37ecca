"""
torch.compile: what the compiler does for you, and what it cannot
=================================================================

One line, ``torch.compile(model)``, turns PyTorch code into fused kernels: Triton on an
NVIDIA GPU, C++ on a CPU. This example measures what that buys on a Transformer
feed-forward block, when the compile time pays for itself, how graph breaks and
recompilations quietly cost performance, and which optimisations still need a human.
Afterwards you can predict the speedup from a byte count, read Inductor's generated
code, and diagnose graph breaks and recompilations yourself.

**Requirements.** Full version: a CUDA GPU (Triton ships with PyTorch's CUDA wheels).
On a CPU, Inductor writes C++ and needs a C++ compiler; the example then runs at small
sizes and the numbers describe the CPU. Without a working compiler it says so and still
shows graph breaks and recompilations, which only need TorchDynamo. Inductor compiles
FlexAttention for a CPU only where the CPU has AVX2, ``ATEN_CPU_CAPABILITY`` is not
``default`` and the system is not macOS; elsewhere the page skips that part and says why.
On a T4 (compute capability 7.5, as on free Colab notebooks) it runs as on any CUDA GPU.
"""

# %%
# Setup
# -----
# torch.compile has two halves. **TorchDynamo** hooks into CPython's frame
# evaluation (PEP 523): when a compiled function is called, Dynamo takes the frame
# before CPython runs it, interprets its bytecode symbolically on *FakeTensors*
# (tensors with a shape, a dtype and a device but no data), and records the PyTorch
# operations into a graph (an FX graph). It also installs *guards*: cheap checks
# (shapes, dtypes, Python values) that decide whether the recorded graph may be reused.
# CPython then runs a rewritten frame that calls the compiled graph.
# **TorchInductor** is the default backend: it fuses the graph's operations and writes
# Triton (GPU) or C++ (CPU) source, which is then compiled.
#
# By default Dynamo warns about only some of the events that cost performance: the
# recompile limit, and a few kinds of graph break, such as one at ``.item()`` (once per
# process). Most graph breaks, and every recompilation, are logged only on request.
# Those warnings are left on: a run standalone prints them to the terminal; where this
# page shows one, the example has caught it and printed it.
# For more, run the script with the environment variable ``TORCH_LOGS``, for example
# ``TORCH_LOGS="graph_breaks,recompiles"`` (or ``"+dynamo"`` for everything), or call
# ``torch._logging.set_logs(graph_breaks=True, recompiles=True)`` from Python.
#
# Inductor keeps what it compiled in an on-disk cache, so a second run of a script
# compiles much faster than the first. To measure the first compile honestly, this
# example points Inductor's and Triton's caches at a new, empty folder before it
# compiles anything.

import copy
import importlib.util
import logging
import math
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time

import matplotlib.pyplot as plt
import numpy as np
import torch
import torch._dynamo as dynamo
import torch._inductor.config as inductor_config
import torch.nn.functional as F
from torch._dynamo.utils import counters
from torch._inductor.utils import clear_inductor_caches, run_and_get_code
from torch._subclasses.fake_tensor import FakeTensor
from torch.nn.attention.flex_attention import create_block_mask, flex_attention
from torch.utils.benchmark import Timer

CACHE_VARIABLES = ("TORCHINDUCTOR_CACHE_DIR", "TRITON_CACHE_DIR")
saved_cache_settings = {name: os.environ.get(name) for name in CACHE_VARIABLES}
COLD_CACHE_DIR = tempfile.mkdtemp(prefix="inductor-cold-")
os.environ["TORCHINDUCTOR_CACHE_DIR"] = COLD_CACHE_DIR
os.environ["TRITON_CACHE_DIR"] = os.path.join(COLD_CACHE_DIR, "triton")
clear_inductor_caches()  # and forget what this process compiled before, if anything

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
if DEVICE == "cuda":
    BATCH, SEQ = 16, 512  # 8192 tokens
    D_MAIN = 1024
    WIDTHS = [512, 1024, 2048, 4096]
    MIN_RUN_TIME = 0.5
else:
    BATCH, SEQ = 3, 83  # 249 tokens: small and deliberately irregular
    D_MAIN = 256
    WIDTHS = [128, 256, 512]
    MIN_RUN_TIME = 0.2
TOKENS = BATCH * SEQ
torch.manual_seed(0)
# float32 matmuls in float32 on a GPU too, not TF32 (cuBLAS and Inductor's FlexAttention
# template read this flag): the checks compare float32 results with float64
torch.backends.cuda.matmul.allow_tf32 = False


def device_name():
    if DEVICE == "cuda":
        return torch.cuda.get_device_name()
    return f"CPU ({os.cpu_count()} cores)"


def synchronize():
    if DEVICE == "cuda":
        torch.cuda.synchronize()


def first_lines(text, count=2, width=120):
    """The first non-empty lines of an error message, shortened for printing."""
    lines = [line.strip() for line in str(text).strip().splitlines() if line.strip()]
    return [line if len(line) <= width else line[: width - 4] + " ..." for line in lines[:count]]


print(f"device: {device_name()}   torch {torch.__version__}")
print(f"block input: {BATCH} x {SEQ} x d, float32; widths d = {WIDTHS}")
if DEVICE == "cpu":
    print("On this CPU Inductor emits C++: compile costs and speedups describe the CPU, not a GPU.")

# %%
# Measured ceilings of this machine
# ---------------------------------
# Two numbers bound everything below: how fast this device moves bytes (a large
# device-to-device copy reads and writes each byte, so it moves 2 x size) and how fast
# ``torch.matmul`` multiplies float32 matrices. Every timing uses
# ``torch.utils.benchmark.Timer``: it synchronises CUDA, reports the median, and on a
# CPU runs with one thread (its default), which keeps numbers steady on a busy machine.


def median_seconds(fn, *args):
    timer = Timer(stmt="fn(*args)", globals={"fn": fn, "args": args})
    return timer.blocked_autorange(min_run_time=MIN_RUN_TIME).median


def format_rate(flop_per_s):
    if flop_per_s >= 1e12:
        return f"{flop_per_s / 1e12:.2f} TFLOP/s"
    return f"{flop_per_s / 1e9:.1f} GFLOP/s"


def measure_copy_bandwidth():
    n_floats = (1 << 28) if DEVICE == "cuda" else (1 << 24)
    src = torch.randn(n_floats, device=DEVICE)
    dst = torch.empty_like(src)
    seconds = median_seconds(dst.copy_, src)
    return 2 * src.numel() * src.element_size() / seconds


def measure_matmul_rate():
    n = 4096 if DEVICE == "cuda" else 512
    a = torch.randn(n, n, device=DEVICE)
    b = torch.randn(n, n, device=DEVICE)
    return 2 * n**3 / median_seconds(torch.matmul, a, b)


COPY_BANDWIDTH = measure_copy_bandwidth()
MATMUL_RATE = measure_matmul_rate()
print(f"copy bandwidth       : {COPY_BANDWIDTH / 1e9:8.1f} GB/s")
print(f"float32 matmul rate  : {format_rate(MATMUL_RATE):>13}")

# %%
# Predict: where can a compiler save time in this block?
# ------------------------------------------------------
# The block is a simplified Transformer feed-forward sub-layer with a 4x expansion:
# ``y = x + W2 GeLU(W1 RMSNorm(x))``, with the tanh form of GeLU. The two matrix
# multiplications already call a tuned library (cuBLAS, or oneDNN/MKL on a CPU), so
# a compiler cannot make them much faster. What it *can* remove is memory traffic of
# the elementwise and reduction operations around them (see
# :ref:`sphx_glr_auto_examples_lecture05_gpus_03_fusion.py`).
#
# Count float32 values read plus written per token, in units of the width ``d``.
# Eagerly, every operation is its own kernel with its own trip to memory:
#
# * RMSNorm: ``x.pow(2)`` 2, ``mean`` 1, ``x * r`` 2, ``* gain`` 2: **7 d**;
# * GeLU on the ``4d``-wide hidden layer: eight operations (``h**3``, ``* 0.044715``,
#   ``h + .``, ``* sqrt(2/pi)``, ``tanh``, ``1 + .``, ``0.5 * h``, the final product),
#   two or three ``4d`` passes each: **72 d**;
# * residual add: read two, write one: **3 d**.
#
# That is 82 d values. Fused, the minimum is one read and one write per tensor that
# must exist: RMSNorm 2 d, GeLU 8 d, residual 3 d, so **13 d**, about six times less.
# The matmuls do ``16 d^2`` FLOPs per token and their traffic is the same either way,
# so we leave it out. A simple roofline model adds the memory time (bytes over the
# measured copy bandwidth) to the matmul time (FLOPs over the measured matmul rate).
# The elementwise share of the time, and with it the possible speedup, shrinks like
# ``1/d`` as the block gets wider.

EAGER_FLOATS_PER_TOKEN_PER_D = 82
FUSED_FLOATS_PER_TOKEN_PER_D = 13


def block_flops(d):
    return 16 * TOKENS * d**2


def predicted_memory_seconds(d, fused):
    floats = FUSED_FLOATS_PER_TOKEN_PER_D if fused else EAGER_FLOATS_PER_TOKEN_PER_D
    return TOKENS * floats * d * 4 / COPY_BANDWIDTH


def predicted_seconds(d, fused):
    return predicted_memory_seconds(d, fused) + block_flops(d) / MATMUL_RATE


def predicted_speedup(d):
    return predicted_seconds(d, fused=False) / predicted_seconds(d, fused=True)


print("roofline prediction")
print(f"{'d':>6} {'eager ms':>9} {'fused ms':>9} {'elementwise share':>18} {'speedup':>8}")
for d in WIDTHS:
    eager_pred, fused_pred = predicted_seconds(d, False), predicted_seconds(d, True)
    share = predicted_memory_seconds(d, False) / eager_pred
    print(f"{d:6d} {eager_pred * 1e3:9.3f} {fused_pred * 1e3:9.3f} {share:18.0%}"
          f" {eager_pred / fused_pred:7.2f}x")

# %%
# Compile the block: first call and correctness
# ---------------------------------------------
# The first call of a compiled module pays for tracing and code generation; later
# calls with the same shapes only run the guards and the generated code. Here the
# caches are empty, so the first call is a cold compile. We ask for
# static shapes (``dynamic=False``) so that each width below gets kernels specialised
# to its sizes. ``run_and_get_code`` runs the first call and also hands back the
# Python/Triton/C++ source Inductor wrote, which we read in the next section.
#
# If this machine cannot compile (no C++ compiler, a GPU Triton does not support),
# a one-line compile tried first says so, and the sections that need Inductor are skipped.


class FeedForwardBlock(torch.nn.Module):
    """y = x + W2 GeLU(W1 RMSNorm(x)), 4x expansion, tanh GeLU."""

    def __init__(self, d):
        super().__init__()
        self.gain = torch.nn.Parameter(torch.ones(d))
        self.up = torch.nn.Linear(d, 4 * d, bias=False)
        self.down = torch.nn.Linear(4 * d, d, bias=False)

    def forward(self, x):
        h = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * self.gain
        h = self.up(h)
        h = 0.5 * h * (1 + torch.tanh(math.sqrt(2 / math.pi) * (h + 0.044715 * h**3)))
        return x + self.down(h)


def make_block(d):
    block = FeedForwardBlock(d).to(DEVICE).requires_grad_(False)
    x = torch.randn(BATCH, SEQ, d, device=DEVICE)
    return block, x


def first_compiled_call(block, x):
    """Compile and run once, caches cold: (compiled module, output, seconds, sources)."""
    compiled = torch.compile(block, dynamic=False)
    synchronize()
    start = time.perf_counter()
    out, sources = run_and_get_code(compiled, x)
    synchronize()
    return compiled, out, time.perf_counter() - start, sources


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
    """(capability, reason) if torch.compile cannot work here, or None.

    The one-line compile runs in a child process with this machine's usual caches, so
    that the cold first call below still pays, and shows, every one-time cost.
    """
    if DEVICE == "cpu" and (problem := cxx_problem(inductor_config.cpp.cxx[-1])) is not None:
        return "cxx", problem  # Inductor's compiler on a CPU: $CXX, else g++
    if DEVICE == "cuda" and importlib.util.find_spec("triton") is None:
        return "triton", "Triton is not installed"
    env = {name: value for name, value in os.environ.items() if name not in CACHE_VARIABLES}
    env.update({name: value for name, value in saved_cache_settings.items() if value is not None})
    one_line = f"import torch; torch.compile(lambda t: 2 * t + 1)(torch.ones(5, device={DEVICE!r}))"
    done = subprocess.run([sys.executable, "-c", one_line], env=env,
                          capture_output=True, text=True, check=False)
    if done.returncode != 0:
        last_line = (done.stderr.strip().splitlines() or [f"exit {done.returncode}"])[-1]
        return "inductor", f"a one-line torch.compile failed: {last_line[:160]}"
    return None


# Once the probe passes, a failure to compile this example's own code fails the page.
INDUCTOR_MISSING = inductor_problem()
COMPILE_WORKS = INDUCTOR_MISSING is None


def skip_section(section):
    """Each section that needs Inductor says, by name, that it is skipped (or fails a build)."""
    skip_or_fail(section, *INDUCTOR_MISSING)


block, x = make_block(D_MAIN)
if COMPILE_WORKS:
    compiled_block, out_compiled, first_call_s, sources = first_compiled_call(block, x)
else:
    skip_section("compiling the block")

if COMPILE_WORKS:
    out_eager = block(x)
    out_reference = copy.deepcopy(block).double()(x.double())
    print(f"first compiled call, cold caches (trace + codegen + compile + run): {first_call_s:6.2f} s")
    print(f"max |eager    - float64| : {(out_eager - out_reference).abs().max().item():.2e}")
    compiled_error = (out_compiled - out_reference).abs().max().item()
    print(f"max |compiled - float64| : {compiled_error:.2e}")
    print(f"max |compiled - eager|   : {(out_compiled - out_eager).abs().max().item():.2e}")
    # float32 sums of K <= 4d order-one products in some order: about sqrt(K) eps, 8e-6
    # at the GPU's K = 4096, plus a few roundings in RMSNorm and GeLU; TF32 is off
    torch.testing.assert_close(out_compiled, out_eager, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(out_compiled, out_reference.float(), rtol=1e-4, atol=1e-4)
    print("compiled block matches eager and the float64 reference (rtol = atol = 1e-4)")
    del out_eager, out_reference, out_compiled

# %%
# What Inductor wrote
# -------------------
# The generated module is ordinary Python that calls the matmul library for the two
# projections (``extern_kernels.mm``) and Inductor's own kernels for the rest. The
# kernel names list the operations fused into each one. The excerpt is the kernel that
# contains the ``tanh``: the whole GeLU, eight eager kernels, is now one loop that reads
# each hidden value once and writes it once.

KERNEL_DEFINITION = re.compile(r"^(\w+) = async_compile\.\w+\(", re.MULTILINE)
KERNEL_SOURCE = re.compile(r"'''(.*?)'''", re.DOTALL)


def generated_language(code):
    if "@triton.jit" in code or "import triton" in code:
        return "Triton"
    if "#include" in code or "cpp_fused" in code:
        return "C++"
    return "unknown"


def excerpt_around(source, keyword, lines_before=30, lines_after=8):
    lines = source.strip("\n").splitlines()
    hit = next(i for i, line in enumerate(lines) if keyword in line)
    start = max(0, hit - lines_before)
    return "\n".join(lines[start : hit + lines_after])


if COMPILE_WORKS:
    code = "\n".join(sources)
    kernel_names = KERNEL_DEFINITION.findall(code)
    library_calls = re.findall(r"extern_kernels\.\w+", code)
    print(f"Inductor kernels ({len(kernel_names)}):")
    for name in kernel_names:
        print(f"  {name}")
    print(f"library calls: {', '.join(library_calls) or 'none'}")
    tanh_kernels = [k for k in KERNEL_SOURCE.findall(code) if "tanh" in k]
    if tanh_kernels:
        print(f"\n--- excerpt of the fused GeLU kernel ({generated_language(tanh_kernels[0])}) ---")
        print(excerpt_around(tanh_kernels[0], "tanh"))
    else:
        print("no kernel containing tanh found (this torch version lays out its code differently)")
    print(f"\nlanguage of the generated kernels on this machine: {generated_language(code)}")
else:
    skip_section("what Inductor wrote")

# %%
# Speed: eager against compiled
# -----------------------------
# Same input, same weights. The predicted speedup from the table above is printed next
# to the measured one.


def time_eager_and_compiled(block, compiled, x):
    return median_seconds(block, x), median_seconds(compiled, x)


if COMPILE_WORKS:
    eager_s, compiled_s = time_eager_and_compiled(block, compiled_block, x)
    print(f"eager    : {eager_s * 1e3:8.3f} ms")
    print(f"compiled : {compiled_s * 1e3:8.3f} ms")
    print(f"speedup  : {eager_s / compiled_s:8.2f}x   (roofline prediction {predicted_speedup(D_MAIN):.2f}x)")
    block_rate = block_flops(D_MAIN) / compiled_s
    print(f"compiled block: {format_rate(block_rate)} = {block_rate / MATMUL_RATE:.0%} of the measured matmul rate")
else:
    skip_section("eager against compiled")

# %%
# Compile time is paid once: cumulative cost and break-even
# ---------------------------------------------------------
# After ``N`` calls eager has spent ``N t_eager``; compiled has spent
# ``overhead + N t_compiled``, where the overhead is the first call minus one ordinary
# call. The lines cross at the break-even call ``overhead / (t_eager - t_compiled)``,
# if the compiled version is faster per call at all.
#
# The overhead depends on the cache. The first call above was a cold compile: this
# example started with empty caches. Inductor stored what it compiled on disk, so a
# second run of this script, or a second process with the same model, compiles far
# faster. Below, the same block is compiled again after ``torch._dynamo.reset()`` and
# after Inductor's in-memory caches are emptied, much as in a new process: Dynamo traces
# again, and Inductor finds the compiled graph in its on-disk cache. (A new process would
# also pay again for importing and starting the compiler, which this one has done.)
# Both first calls are printed, and the plot draws both; its axes are logarithmic so
# that both break-even points show.


def warm_compiled_call(block, x):
    """Compile the block again, as a new process would: (compiled, output, seconds, hits)."""
    dynamo.reset()
    clear_inductor_caches()  # in-memory copies only; the on-disk cache stays
    counters.clear()
    compiled = torch.compile(block, dynamic=False)
    synchronize()
    start = time.perf_counter()
    out = compiled(x)
    synchronize()
    return compiled, out, time.perf_counter() - start, counters["inductor"]["fxgraph_cache_hit"]


def check_warm_compile(cold_s, warm_s, cache_hits):
    """The second compile must come from Inductor's cache and be faster than the cold one."""
    if cache_hits < 1:
        raise AssertionError("the second compile did not hit Inductor's FX graph cache")
    if not warm_s < cold_s:
        raise AssertionError(f"the warm first call ({warm_s:.2f} s) is not faster "
                             f"than the cold one ({cold_s:.2f} s)")


def break_even_call(overhead_s, eager_s, compiled_s):
    """First call count at which compiling has paid off, or None if it never does."""
    saving_per_call = eager_s - compiled_s
    if saving_per_call <= 0:
        return None
    return math.ceil(overhead_s / saving_per_call)


def plot_cumulative(overheads_s, eager_s, compiled_s):
    """Cumulative time of eager and of compiled, one compiled line per cache state."""
    break_evens = {label: break_even_call(o, eager_s, compiled_s) for label, o in overheads_s.items()}
    known = [n for n in break_evens.values() if n is not None]
    calls = np.geomspace(1, max(1000, 10 * max(known, default=0)), 200)
    fig, ax = plt.subplots(figsize=(7, 4.8))
    ax.plot(calls, calls * eager_s, color="black", label="eager")
    for (label, overhead_s), color in zip(overheads_s.items(), ("C0", "C1")):
        ax.plot(calls, overhead_s + calls * compiled_s, color=color, label=f"compiled, {label}")
        break_even = break_evens[label]
        if break_even is not None:  # label above the plateau, left of the crossing: empty there
            ax.plot([break_even], [break_even * eager_s], "o", color=color)
            ax.annotate(f"break-even: call {break_even:,}", (break_even, break_even * eager_s),
                        textcoords="offset points", xytext=(-8, 8), ha="right", color=color)
    if not known:
        ax.text(0.05, 0.5, "compiled is not faster per call:\nno break-even",
                transform=ax.transAxes)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("number of calls N")
    ax.set_ylabel("cumulative time (s)")
    ax.set_title(f"Feed-forward block, d = {D_MAIN}, {device_name()}")
    ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.17), ncol=3, frameon=False)
    fig.tight_layout()
    return break_evens


if COMPILE_WORKS:
    compiled_block, out_warm, warm_first_call_s, warm_cache_hits = warm_compiled_call(block, x)
    torch.testing.assert_close(out_warm, block(x), rtol=1e-4, atol=1e-4)  # as above
    check_warm_compile(first_call_s, warm_first_call_s, warm_cache_hits)
    del out_warm
    overheads_s = {"cold cache": max(first_call_s - compiled_s, 0.0),
                   "warm cache": max(warm_first_call_s - compiled_s, 0.0)}
    print(f"first compiled call, cold caches: {first_call_s:7.2f} s")
    print(f"first compiled call, warm caches: {warm_first_call_s:7.2f} s"
          f"   (Inductor cache hits: {warm_cache_hits})")
    print(f"saving per call: {(eager_s - compiled_s) * 1e3:.3f} ms")
    break_evens = plot_cumulative(overheads_s, eager_s, compiled_s)
    for label, break_even in break_evens.items():
        if break_even is None:
            print(f"{label}: the compiled block is not faster per call here, so it never pays off")
        else:
            print(f"{label}: overhead {overheads_s[label]:.2f} s, "
                  f"compiling pays off from call {break_even:,} on")
else:
    skip_section("compile time and break-even")

# %%
# Speedup as the block grows wider
# --------------------------------
# Each width is a new block compiled for its own static shapes (the width ``d`` already
# measured above is reused). The roofline line uses the byte and FLOP counts from the
# prediction and this machine's two ceilings.


def measure_width(d):
    block_d, x_d = make_block(d)
    compiled_d = torch.compile(block_d, dynamic=False)
    # as for D_MAIN: sqrt(4d) eps, 1.5e-5 at d = 4096
    torch.testing.assert_close(compiled_d(x_d), block_d(x_d), rtol=1e-4, atol=1e-4)
    return time_eager_and_compiled(block_d, compiled_d, x_d)


def plot_speedup_vs_width(widths, measured):
    fig, ax = plt.subplots(figsize=(7, 4.8))
    fine = np.geomspace(widths[0], widths[-1], 50)
    ax.plot(fine, [predicted_speedup(d) for d in fine], "--", label="roofline prediction")
    ax.plot(widths, measured, "o-", label="measured (eager / compiled median)")
    ax.axhline(1.0, color="gray", linewidth=0.8)
    ax.set_xscale("log", base=2)
    ax.set_xticks(widths, [str(d) for d in widths])
    ax.set_xlabel("block width d (hidden layer 4d)")
    ax.set_ylabel("speedup of torch.compile (x)")
    ax.set_title(f"Feed-forward block, {TOKENS} tokens, float32, {device_name()}")
    ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.17), ncol=2, frameon=False)
    fig.tight_layout()


if COMPILE_WORKS:
    speedups = []
    print(f"{'d':>6} {'eager ms':>9} {'compiled ms':>12} {'speedup':>8} {'predicted':>10}")
    for d in WIDTHS:
        eager_d, compiled_d = (eager_s, compiled_s) if d == D_MAIN else measure_width(d)
        speedups.append(eager_d / compiled_d)
        print(f"{d:6d} {eager_d * 1e3:9.3f} {compiled_d * 1e3:12.3f} {speedups[-1]:7.2f}x"
              f" {predicted_speedup(d):9.2f}x")
    plot_speedup_vs_width(WIDTHS, speedups)
else:
    skip_section("speedup as the block grows wider")
del block, x

# %%
# Graph breaks
# ------------
# Dynamo records tensor operations. When it meets something it cannot put in a graph,
# for example a Python ``if`` on a tensor's *value* (``.item()`` copies it to Python,
# which on a GPU also waits for the device), it cuts the graph: the part before is
# compiled, Python runs the branch, and the part after becomes a second graph. Fusion
# cannot cross the cut. The same logic written with ``torch.where`` stays a single graph.
#
# ``torch._dynamo.explain`` reports graphs and breaks without compiling anything.
# ``fullgraph=True`` turns a break into an error, the way to make sure a model is one
# graph. This section only needs Dynamo, so it uses ``backend="eager"``: Dynamo
# captures the graphs and ordinary PyTorch runs them, which saves the compile time.


def sine_then_branch(x):
    y = torch.sin(x) * 2
    if y.sum().item() > 0:  # data-dependent Python control flow
        y = y + 1
    return torch.cos(y)


def sine_then_where(x):
    y = torch.sin(x) * 2
    y = torch.where(y.sum() > 0, y + 1, y)
    return torch.cos(y)


x_small = torch.randn(1001, device=DEVICE)
print(f"{'function':<18} {'graphs':>6} {'breaks':>6}  first break reason")
for fn in (sine_then_branch, sine_then_where):
    dynamo.reset()
    explanation = dynamo.explain(fn)(x_small)
    reason = explanation.break_reasons[0].reason if explanation.break_reasons else "-"
    print(f"{fn.__name__:<18} {explanation.graph_count:6d} {explanation.graph_break_count:6d}"
          f"  {first_lines(reason, count=1)[0]}")

dynamo.reset()
try:
    torch.compile(sine_then_branch, backend="eager", fullgraph=True)(x_small)
except RuntimeError as error:  # Dynamo's errors derive from RuntimeError
    print(f"\nfullgraph=True refuses sine_then_branch: {type(error).__name__}")
    for line in first_lines(str(error)):
        print(f"    {line}")
else:  # the page says a graph break is an error under fullgraph=True
    raise AssertionError("fullgraph=True accepted sine_then_branch, which has a graph break")

whole = torch.compile(sine_then_where, backend="eager", fullgraph=True)
broken = torch.compile(sine_then_branch, backend="eager")
for sign in (1, -1):  # sin is odd, so the two signs take both branches
    x_signed = sign * x_small
    # backend "eager" runs the same operations: float32's default tolerance
    torch.testing.assert_close(whole(x_signed), sine_then_where(x_signed))
    torch.testing.assert_close(broken(x_signed), sine_then_branch(x_signed))
print("fullgraph=True accepts sine_then_where; both compiled versions match eager on both branches")

# %%
# Recompilation when shapes change
# --------------------------------
# A graph is valid only while its guards hold. The first call specialises on the exact
# input length; a second length fails the guard ``size mismatch``, and Dynamo
# recompiles, this time marking that dimension as dynamic (a symbol instead of a
# number). Later lengths reuse the dynamic graph. We count graphs with a custom backend,
# a function that receives each captured graph, and capture the recompile reason from
# the same log channel that ``TORCH_LOGS=recompiles`` prints. The backend also looks at
# what the graph's inputs were while Dynamo traced: FakeTensors, not the real inputs.
#
# ``torch._dynamo.mark_dynamic(x, 0)`` declares the dimension dynamic up front, so a
# single graph serves every length. ``torch.compile(fn, dynamic=True)`` does the same
# for every dimension. The example checks both graph counts and raises if this torch
# makes a different number.

LENGTHS = [8, 13, 21, 34, 55]


def scaled_sine(x):
    return torch.sin(2 * x) + 1


class GraphCounter:
    """A torch.compile backend that records each graph it is given and counts its runs."""

    def __init__(self):
        self.kinds = []
        self.traced_on_fake_tensors = []
        self.runs = 0

    def __call__(self, graph_module, example_inputs):
        dynamic = any(isinstance(a, torch.SymInt) for a in example_inputs)
        self.kinds.append("dynamic" if dynamic else "static")
        inputs = [node.meta.get("example_value") for node in graph_module.graph.nodes
                  if node.op == "placeholder"]
        tensors = [value for value in inputs if isinstance(value, torch.Tensor)]
        self.traced_on_fake_tensors.append(bool(tensors) and all(isinstance(t, FakeTensor)
                                                                 for t in tensors))

        def run_graph(*args):
            self.runs += 1
            return graph_module.forward(*args)

        return run_graph


class RecompileReasons(logging.Handler):
    """Collects the guard failures that Dynamo's 'recompiles' log artifact reports."""

    def __init__(self):
        super().__init__(level=logging.DEBUG)
        self.reasons = []

    def emit(self, record):
        lines = record.getMessage().splitlines()
        self.reasons += [line.strip()[2:] for line in lines if line.strip().startswith("- ")]


def call_with_lengths(mark_dynamic):
    dynamo.reset()
    counters.clear()
    counter = GraphCounter()
    compiled = torch.compile(scaled_sine, backend=counter)
    for n in LENGTHS:
        x_n = torch.randn(n, device=DEVICE)
        if mark_dynamic:
            dynamo.mark_dynamic(x_n, 0)
        # GraphCounter runs the traced graph as is: float32's default tolerance
        torch.testing.assert_close(compiled(x_n), scaled_sine(x_n))
    check_traced_on_fake_tensors(counter.traced_on_fake_tensors)
    return counter.kinds, counters["stats"]["unique_graphs"]


def check_traced_on_fake_tensors(per_graph):
    """Every graph's tensor inputs must have been FakeTensors while Dynamo traced."""
    if not per_graph or not all(per_graph):
        raise AssertionError("Dynamo traced a graph on real tensors, not FakeTensors")


def recompile_loggers():
    """The artifact loggers behind TORCH_LOGS=recompiles, wherever this torch defines them."""
    names = list(logging.Logger.manager.loggerDict)
    return [logging.getLogger(name) for name in names if name.endswith(".__recompiles")]


def call_with_lengths_and_log_recompiles():
    handler = RecompileReasons()
    torch._logging.set_logs(recompiles=True)
    loggers = recompile_loggers()
    for logger in loggers:
        logger.addHandler(handler)
        logger.propagate = False  # to our handler only, not to stderr
    try:
        kinds, unique_graphs = call_with_lengths(mark_dynamic=False)
    finally:
        for logger in loggers:
            logger.removeHandler(handler)
        torch._logging.set_logs()  # back to torch's defaults
    return kinds, unique_graphs, handler.reasons


def check_graph_count(label, kinds, unique_graphs, expected):
    """Print the graphs Dynamo made; raise if there are not ``expected`` of them."""
    print(f"{label:<28} graphs: {len(kinds)} ({', '.join(kinds)}); "
          f"unique_graphs counter: {unique_graphs}")
    if len(kinds) != expected or unique_graphs != expected:
        raise AssertionError(f"{label}: expected {expected} graphs, Dynamo made {len(kinds)}")


print(f"input lengths: {LENGTHS}")
kinds, unique_graphs, reasons = call_with_lengths_and_log_recompiles()
check_graph_count("default (automatic dynamic)", kinds, unique_graphs, expected=2)
for reason in reasons or ["(no recompile reason captured: the log layout differs in this torch version)"]:
    print(f"    recompile reason: {reason}")
kinds, unique_graphs = call_with_lengths(mark_dynamic=True)
check_graph_count("mark_dynamic(x, 0)", kinds, unique_graphs, expected=1)
print("every graph was traced on FakeTensors (shapes and dtypes, no data)")

# %%
# The recompile limit
# -------------------
# Dynamo keeps at most ``torch._dynamo.config.recompile_limit`` compiled graphs for one
# function (printed below). With ``dynamic=False`` every new length is a new static
# graph, so the limit is soon reached. Dynamo then logs one warning and compiles no more
# graphs for that function. A call that matches a graph already compiled still runs it;
# a call that matches none runs eagerly, at eager speed: a common reason for a
# "compiled" model that is not faster. The warning is the only sign, so the example
# catches it and prints it here, and checks each of these behaviours.


class DynamoWarnings(logging.Handler):
    """Keeps the warnings of Dynamo's frame converter, which reports the recompile limit."""

    def __init__(self):
        super().__init__(level=logging.WARNING)
        self.messages = []

    def emit(self, record):
        self.messages.append(record.getMessage())


def call_past_recompile_limit():
    """One length more than the limit, then a new and an old length: what ran compiled?"""
    limit = dynamo.config.recompile_limit
    dynamo.reset()
    counter = GraphCounter()
    compiled = torch.compile(scaled_sine, backend=counter, dynamic=False)
    logger = logging.getLogger("torch._dynamo.convert_frame")
    handler, propagate = DynamoWarnings(), logger.propagate
    logger.addHandler(handler)
    logger.propagate = False  # printed below, once, instead of to stderr

    def compiled_runs(n):
        """Call with an input of length ``n``: how often did a compiled graph run?"""
        x_n = torch.randn(n, device=DEVICE)
        runs_before = counter.runs
        torch.testing.assert_close(compiled(x_n), scaled_sine(x_n))  # the same operations
        return counter.runs - runs_before

    try:
        for n in range(8, 8 + limit + 1):
            compiled_runs(n)
        runs = {"new": compiled_runs(1000), "old": compiled_runs(8)}
    finally:
        logger.removeHandler(handler)
        logger.propagate = propagate
    return limit, counter.kinds, handler.messages, runs


def check_recompile_limit(limit, kinds, warnings, runs):
    """The limit caps the graphs, warns, and sends only calls that miss every graph to eager."""
    if len(kinds) != limit:
        raise AssertionError(f"expected {limit} graphs at the recompile limit, got {len(kinds)}")
    if not any("recompile_limit" in message for message in warnings):
        raise AssertionError("Dynamo did not warn that it hit the recompile limit")
    if runs["new"] != 0:
        raise AssertionError("a length past the limit ran a compiled graph")
    if runs["old"] != 1:
        raise AssertionError("a length compiled before the limit did not run its graph")


limit, kinds, warnings, runs = call_past_recompile_limit()
print(f"recompile_limit = {limit}; lengths 8 to {8 + limit} with dynamic=False: "
      f"{len(kinds)} static graphs")
for message in warnings:
    for line in message.splitlines()[:4]:
        if "function:" not in line:  # skip the line naming this file's path
            print(f"    warning: {line.strip()}")
print(f"then a new length (1000): compiled graph runs {runs['new']}, so it ran eagerly")
print(f"then the first length (8) again: compiled graph runs {runs['old']}, its graph is still used")
check_recompile_limit(limit, kinds, warnings, runs)

# %%
# What the compiler does beyond fusion, and what it cannot do
# ------------------------------------------------------------
# Inductor's power is fusion and scheduling of the operations you wrote, but in torch
# 2.11 to 2.13 it does more than that, in places where someone taught it how:
#
# * **It recognises patterns.** Its pattern matcher rewrites a hand-written
#   ``softmax(Q K^T / sqrt(d)) V`` into a call of PyTorch's fused attention
#   (``scaled_dot_product_attention``: a flash or memory-efficient kernel on a GPU, a
#   flash-style loop on a CPU). Someone wrote that kernel by hand; the compiler spotted
#   the place to use it.
# * **It writes online softmaxes.** With the option ``online_softmax``, on by default,
#   the Triton kernel Inductor writes for a softmax computes the row maximum and the sum
#   of exponentials in one pass, rescaling the running sum whenever the maximum grows,
#   so a row too long for one block is read twice instead of three times. The rewrite
#   applies to Triton kernels, so a CPU run shows only the setting.
# * **It fills attention templates.** FlexAttention
#   (``torch.nn.attention.flex_attention``) takes the mask or score modification as a
#   small Python function; under ``torch.compile``, Inductor inlines it into a
#   FlashAttention-style template (Triton on a GPU, C++ on a CPU). The result is a kernel
#   that walks over tiles of keys with an online softmax and never writes the score
#   matrix to memory. It compiles on this machine, below.
# * **It has opt-in passes for distributed code**: asynchronous tensor parallelism
#   (``_micro_pipeline_tp``), which splits an all-gather and the matmul that consumes it
#   into pieces that overlap, and scheduling of collectives so that they overlap
#   computation, with bucketing. For the latter torch 2.13 recommends the options of
#   ``aten_distributed_optimizations`` (``enable_overlap_scheduling``) over the older
#   ``bucket_all_gathers_fx`` and ``reorder_for_compute_comm_overlap``.
#
# What it does not do is invent the algorithm. Fusing the attention operations and
# recomputing the scores tile by tile also keeps them out of memory; what makes
# FlashAttention a single pass over keys and values is the online softmax, an
# algebraic rewrite that someone derived
# (:ref:`sphx_glr_auto_examples_lecture05_gpus_06_flash_attention.py`) and then taught
# the compiler as a pattern and a template. Nor does it decide how a model is sharded
# across GPUs: which collectives exist is decided by FSDP or tensor parallelism, and
# Inductor's passes only schedule the ones they are given. The cells below check each
# of these claims on this machine and raise if one fails.


OVERLAP_SCHEDULING = "aten_distributed_optimizations.enable_overlap_scheduling"
DISTRIBUTED_PASSES = ("_micro_pipeline_tp", "bucket_all_gathers_fx", "reorder_for_compute_comm_overlap",
                      *((OVERLAP_SCHEDULING,) if hasattr(torch._inductor.config, OVERLAP_SCHEDULING)
                        else ()))


def check_inductor_defaults(options):
    """Online softmax on unless the environment turned it off; the distributed passes off."""
    if not options["online_softmax"] and "TORCHINDUCTOR_ONLINE_SOFTMAX" not in os.environ:
        raise AssertionError("online_softmax is off by default in this torch")
    for name in DISTRIBUTED_PASSES:
        if options[name] not in (False, "none"):
            raise AssertionError(f"{name} is on by default in this torch: {options[name]!r}")


inductor_options = {name: getattr(torch._inductor.config, name)
                    for name in ("online_softmax", *DISTRIBUTED_PASSES)}
print("Inductor options in this torch (torch._inductor.config):")
for name, value in inductor_options.items():
    print(f"  {name:<56} {value!r}")
check_inductor_defaults(inductor_options)


def check_online_softmax_code(code):
    """The Triton kernel of a compiled softmax must use Inductor's online softmax."""
    if "online_softmax" not in code:
        raise AssertionError("the compiled softmax does not use Inductor's online softmax")


def row_softmax(t):
    return torch.softmax(t, dim=-1)


if COMPILE_WORKS and DEVICE == "cuda":
    long_rows = torch.randn(2048, 32768, device=DEVICE)
    probabilities, softmax_sources = run_and_get_code(torch.compile(row_softmax), long_rows)
    # float32: exp's ulps and a looped reduction of 32768 terms (each lane adds its
    # 32768 / R0_BLOCK terms in order, online softmax rescales them, then a tree): some
    # tens of eps of each entry, under 1e-4 = 840 eps; atol under the smallest (~2e-7)
    torch.testing.assert_close(probabilities.double(), torch.softmax(long_rows.double(), dim=-1),
                               rtol=1e-4, atol=1e-9)
    if inductor_options["online_softmax"]:
        check_online_softmax_code("\n".join(softmax_sources))
        print("softmax over rows of 32768, compiled: the Triton kernel uses the online softmax")
    del long_rows, probabilities
elif DEVICE == "cuda":
    skip_section("the compiled online softmax")

# %%
# First, the pattern. We compile the hand-written attention and look for the fused call
# in the generated code; the example raises if it is not there.


def naive_attention(q, k, v):
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
    return torch.softmax(scores, dim=-1) @ v


ATTENTION_SHAPE = (8, 16, 1024, 64) if DEVICE == "cuda" else (3, 5, 97, 40)


def check_attention_rewritten(fused_calls):
    """Inductor must have replaced the hand-written attention by a fused SDPA kernel."""
    if not fused_calls:
        raise AssertionError("Inductor did not rewrite the hand-written attention to "
                             "scaled_dot_product_attention")


def inspect_compiled_attention():
    q, k, v = (torch.randn(ATTENTION_SHAPE, device=DEVICE) for _ in range(3))
    out, attention_sources = run_and_get_code(torch.compile(naive_attention), q, k, v)
    code = "\n".join(attention_sources)
    fused_calls = re.findall(r"(_scaled_dot_product_\w+)\.default\(", code)
    matmul_calls = re.findall(r"extern_kernels\.b?mm\(", code)
    reference = F.scaled_dot_product_attention(q.double(), k.double(), v.double())
    # float32 scores (sqrt(head_dim) eps), a softmax and a sum over seq values of order
    # one: some tens of eps, under 1e-4 at the GPU's seq = 1024; TF32 is off
    torch.testing.assert_close(out, reference.float(), rtol=1e-4, atol=1e-4)
    check_attention_rewritten(fused_calls)
    return fused_calls, len(matmul_calls)


if COMPILE_WORKS:
    fused_calls, matmul_count = inspect_compiled_attention()
    print(f"attention shape (batch, heads, seq, head_dim): {ATTENTION_SHAPE}")
    print(f"calls of a fused attention kernel in the generated code: {len(fused_calls)}"
          f"  {sorted(set(fused_calls))}")
    print(f"separate (b)mm calls left in the generated code        : {matmul_count}")
    print("compiled hand-written attention matches F.scaled_dot_product_attention (float64)")
else:
    skip_section("the attention rewrite")

# %%
# Then the template. FlexAttention with a causal mask, compiled. A block mask records
# which tiles of the score matrix the mask leaves empty, so the kernel skips them. In
# the generated code we look for what the fused kernel must not need: a separate
# matmul, or a buffer as large as the score matrix, ``batch x heads x seq x seq``.


def causal(batch, head, query_index, key_index):
    return query_index >= key_index


FLEX_SHAPE = (4, 8, 1024, 64) if DEVICE == "cuda" else (2, 3, 97, 40)


def compile_flex_attention():
    """Compiled causal FlexAttention, checked against float64: the generated code."""
    seq = FLEX_SHAPE[2]
    q, k, v = (torch.randn(FLEX_SHAPE, device=DEVICE) for _ in range(3))
    block_mask = create_block_mask(causal, None, None, seq, seq, device=DEVICE)
    out, flex_sources = run_and_get_code(torch.compile(flex_attention), q, k, v,
                                         block_mask=block_mask)
    reference = F.scaled_dot_product_attention(q.double(), k.double(), v.double(), is_causal=True)
    # as for the rewritten attention: some tens of eps; TF32 is off
    torch.testing.assert_close(out, reference.float(), rtol=1e-4, atol=1e-4)
    return "\n".join(flex_sources)


def allocated_sizes(code):
    """Element counts of the buffers that Inductor's wrapper code allocates."""
    shapes = re.findall(r"empty_strided_\w+\(\(([^)]*)\)", code)
    return [math.prod(int(n) for n in shape.split(",") if n.strip()) for shape in shapes]


def check_flex_attention_code(code, shape):
    """No separate matmul, and no buffer as large as the score matrix."""
    batch, heads, seq, _ = shape
    matmul_calls = re.findall(r"extern_kernels\.\w*mm\(", code)
    if matmul_calls:
        raise AssertionError(f"compiled FlexAttention calls a separate matmul: {matmul_calls}")
    largest = max(allocated_sizes(code), default=0)
    if largest >= batch * heads * seq * seq:
        raise AssertionError(f"compiled FlexAttention allocates {largest:,} elements, "
                             "as many as the score matrix")
    return largest


def cpu_flex_attention_problem():
    """Why Inductor will not compile FlexAttention on this CPU, or None: the same test as
    Inductor's own (check_cpu_supported in torch/_inductor/kernel/flex/flex_cpu.py)."""
    if sys.platform == "darwin":
        return "Inductor's CPU FlexAttention does not support macOS"
    if torch.xpu.is_available():
        return "Inductor's CPU FlexAttention is off where an Intel GPU (XPU) is present"
    if not torch.cpu._is_avx2_supported():
        return "Inductor's CPU FlexAttention needs a CPU with AVX2, and this one has none"
    if os.environ.get("ATEN_CPU_CAPABILITY") == "default":
        return "Inductor's CPU FlexAttention is off under ATEN_CPU_CAPABILITY=default"
    return None


FLEX_MISSING = cpu_flex_attention_problem() if DEVICE == "cpu" else None
if COMPILE_WORKS and FLEX_MISSING is not None:
    skip_or_fail("compiled FlexAttention", "flex-cpu", FLEX_MISSING)
elif COMPILE_WORKS:
    flex_code = compile_flex_attention()
    largest_buffer = check_flex_attention_code(flex_code, FLEX_SHAPE)
    batch, heads, seq, head_dim = FLEX_SHAPE
    print(f"FlexAttention, causal, shape {FLEX_SHAPE}: matches float64 SDPA")
    print(f"  kernels: {', '.join(KERNEL_DEFINITION.findall(flex_code))}")
    print(f"  separate matmul calls: 0; largest buffer: {largest_buffer:,} elements "
          f"(the score matrix would be {batch * heads * seq * seq:,})")
else:
    skip_section("compiled FlexAttention")

# %%
# Modes: what ``max-autotune`` switches on
# ----------------------------------------
# ``torch.compile(mode=...)`` selects a bundle of Inductor options, and
# ``torch._inductor.list_mode_options()`` lists them. ``max-autotune`` benchmarks
# Triton matmul templates and kernel configurations while compiling, into which it can
# fuse elementwise epilogues, and it also turns on CUDA graphs and coordinate-descent
# tuning (a search over a Triton kernel's block sizes around the heuristic's choice).
# CUDA graphs replay a recorded sequence of kernel launches, which needs fixed input
# addresses and extra memory; ``max-autotune-no-cudagraphs`` is the same search without
# them. ``reduce-overhead`` turns on CUDA graphs alone.

MODES = ("reduce-overhead", "max-autotune-no-cudagraphs", "max-autotune")


def check_mode_options(options):
    """max-autotune brings CUDA graphs and coordinate descent; the no-cudagraphs mode does not."""
    full, no_graphs = options["max-autotune"], options["max-autotune-no-cudagraphs"]
    for option in ("max_autotune", "coordinate_descent_tuning", "triton.cudagraphs"):
        if not full.get(option):
            raise AssertionError(f"mode max-autotune does not set {option}")
    if not no_graphs.get("max_autotune") or no_graphs.get("triton.cudagraphs"):
        raise AssertionError("max-autotune-no-cudagraphs is not max-autotune without CUDA graphs")


mode_options = torch._inductor.list_mode_options()
print("mode                         options it switches on")
for mode in MODES:
    switched_on = [name for name, value in mode_options[mode].items() if value]
    print(f"{mode:<28} {', '.join(switched_on)}")
check_mode_options(mode_options)

# %%
# Read the result
# ---------------
# **Correctness.** The compiled block agrees with eager and with a float64 reference
# to float32 rounding: fusion changes the order of a few operations, not the math.
#
# **Speed.** What the compiler can win is the elementwise work: the RMSNorm, the
# eight-operation GeLU and the residual add each become one kernel that touches memory
# once, while the two matmuls stay library calls. As ``d`` grows, the matmul FLOPs grow
# like ``d^2`` and the elementwise bytes only like ``d``, so the share the compiler can
# save shrinks and the speedup falls towards 1; compare the measured points with the
# dashed roofline line. The model ignores per-operation costs that eager pays for each
# of its many small kernels: a launch of a few microseconds on a GPU; on a CPU the
# Python dispatch and a fresh allocation for every intermediate. Where the measured
# speedup sits above the line, usually at small widths, that is the reason. On a GPU at
# full size the elementwise kernels are bandwidth bound and the model is a fair guide;
# on a CPU it is rough (caches hold small tensors, ``tanh`` costs arithmetic), and a
# busy CPU makes the points noisy. In bfloat16 the matmuls run several times faster
# while the elementwise bytes only halve, so the compiler's share, and its speedup,
# would be larger than in float32.
#
# **Cost model.** Compiling costs seconds to tens of seconds per distinct graph (more
# for a full model, plus every recompilation) and saves a fixed time per call. It pays
# off after ``overhead / saving`` calls: at once for a training loop or a serving
# process that runs the same shapes millions of times; never for a script that calls a
# function a handful of times. The on-disk cache makes later runs cheaper: compare the
# cold and the warm first call printed above, and their two break-even points.
#
# **Takeaways.**
#
# * Use ``torch.compile`` for code that runs many times with stable shapes; measure the
#   first call separately from the steady state, as above.
# * Check for graph breaks (``torch._dynamo.explain``, ``TORCH_LOGS=graph_breaks``,
#   ``fullgraph=True``) and rewrite data-dependent Python into tensor operations such
#   as ``torch.where``.
# * Watch recompilations (``TORCH_LOGS=recompiles``). Pad or bucket lengths, or mark
#   the varying dimension with ``torch._dynamo.mark_dynamic``.
# * ``mode="max-autotune"`` benchmarks kernel configurations and Triton matmul
#   templates, into which it can fuse elementwise epilogues (a longer compile), and also
#   turns on CUDA graphs and coordinate-descent tuning; compare it with
#   ``max-autotune-no-cudagraphs`` to tell the search from the graphs.
#   ``mode="reduce-overhead"`` replays CUDA graphs alone, to cut launch costs.
# * New algorithms (FlashAttention's online softmax, fused MoE dispatch, quantised
#   matmuls) still come from people: as hand-written Triton or CUDA kernels that the
#   compiler calls, or as patterns and templates, such as FlexAttention's, that someone
#   taught it. That is why high-performance LLM code is "compiler plus a few
#   hand-written kernels".

dynamo.reset()
for name, value in saved_cache_settings.items():  # back to the caches this process had
    if value is None:
        os.environ.pop(name, None)
    else:
        os.environ[name] = value
clear_inductor_caches()
shutil.rmtree(COLD_CACHE_DIR, ignore_errors=True)

# sphinx_gallery_thumbnail_number = 2

# %%
# Key figures
# -----------
# The numbers this example exists to measure, collected for the course's GPU check.

KEY_FIGURES = {
    "device": device_name(),
    "copy_GBps": COPY_BANDWIDTH / 1e9,
    "matmul_float32_TFLOPps": MATMUL_RATE / 1e12,
    "compile_works": "yes" if COMPILE_WORKS else "no",
}
if COMPILE_WORKS:
    KEY_FIGURES["first_compiled_call_s"] = first_call_s  # cold caches
    KEY_FIGURES["first_compiled_call_warm_cache_s"] = warm_first_call_s
    KEY_FIGURES[f"speedup_d{D_MAIN}"] = eager_s / compiled_s
    KEY_FIGURES[f"predicted_speedup_d{D_MAIN}"] = predicted_speedup(D_MAIN)
    KEY_FIGURES[f"compiled_block_fraction_of_matmul_rate_d{D_MAIN}"] = block_rate / MATMUL_RATE
    # as text, since the report rounds numbers to 4 decimals
    KEY_FIGURES["max_abs_diff_compiled_vs_float64"] = f"{compiled_error:.2e}"
    KEY_FIGURES[f"speedup_d{WIDTHS[-1]}"] = speedups[-1]
