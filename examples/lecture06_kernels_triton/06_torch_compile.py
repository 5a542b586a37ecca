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
shows graph breaks and recompilations, which only need TorchDynamo.
"""

# %%
# Setup
# -----
# torch.compile has two halves. **TorchDynamo** watches Python run, records the
# PyTorch operations into a graph (an FX graph), and installs *guards*: cheap checks
# (shapes, dtypes, Python values) that decide whether the recorded graph may be reused.
# **TorchInductor** is the default backend: it fuses the graph's operations and writes
# Triton (GPU) or C++ (CPU) source, which is then compiled.
#
# Both print many log lines (a graph break here, a recompilation there). The text
# below explains those events, so we raise their log level to errors only. To see the
# raw logs, run the script with the environment variable ``TORCH_LOGS``, for example
# ``TORCH_LOGS="graph_breaks,recompiles"`` (or ``"+dynamo"`` for everything), or call
# ``torch._logging.set_logs(graph_breaks=True, recompiles=True)`` from Python.

import copy
import logging
import math
import os
import re
import time

import matplotlib.pyplot as plt
import numpy as np
import torch
import torch._dynamo as dynamo
import torch.nn.functional as F
from torch._dynamo.utils import counters
from torch._inductor.utils import run_and_get_code
from torch.utils.benchmark import Timer

QUIET_LOGGERS = ("torch._dynamo", "torch._inductor")
saved_log_levels = {name: logging.getLogger(name).level for name in QUIET_LOGGERS}
for name in QUIET_LOGGERS:
    logging.getLogger(name).setLevel(logging.ERROR)

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
# calls with the same shapes only run the guards and the generated code. We ask for
# static shapes (``dynamic=False``) so that each width below gets kernels specialised
# to its sizes. ``run_and_get_code`` runs the first call and also hands back the
# Python/Triton/C++ source Inductor wrote, which we read in the next section.
#
# If this machine cannot compile (no C++ compiler, a GPU Triton does not support),
# the exception is caught here and the sections that need Inductor are skipped.


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
    """Compile and run once: (compiled module, output, seconds, generated sources)."""
    compiled = torch.compile(block, dynamic=False)
    synchronize()
    start = time.perf_counter()
    out, sources = run_and_get_code(compiled, x)
    synchronize()
    return compiled, out, time.perf_counter() - start, sources


block, x = make_block(D_MAIN)
try:
    compiled_block, out_compiled, first_call_s, sources = first_compiled_call(block, x)
    COMPILE_WORKS = True
except Exception as error:  # noqa: BLE001 (any failure here means: cannot compile)
    COMPILE_WORKS = False
    dynamo.reset()
    print(f"torch.compile does not work on this machine: {type(error).__name__}")
    for line in first_lines(error):
        print(f"    {line}")
    print("Skipping the sections that need Inductor; graph breaks and recompilation still run.")

if COMPILE_WORKS:
    out_eager = block(x)
    out_reference = copy.deepcopy(block).double()(x.double())
    print(f"first compiled call (trace + codegen + compile + run): {first_call_s:6.2f} s")
    print(f"max |eager    - float64| : {(out_eager - out_reference).abs().max().item():.2e}")
    compiled_error = (out_compiled - out_reference).abs().max().item()
    print(f"max |compiled - float64| : {compiled_error:.2e}")
    print(f"max |compiled - eager|   : {(out_compiled - out_eager).abs().max().item():.2e}")
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
    print("skipped: torch.compile is not available on this machine")

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
    print("skipped: torch.compile is not available on this machine")

# %%
# Compile time is paid once: cumulative cost and break-even
# ---------------------------------------------------------
# After ``N`` calls eager has spent ``N t_eager``; compiled has spent
# ``overhead + N t_compiled``, where the overhead is the first call minus one ordinary
# call. The lines cross at the break-even call ``overhead / (t_eager - t_compiled)``,
# if the compiled version is faster per call at all.
#
# The overhead depends on the cache: Inductor stores compiled graphs and kernels on disk
# (by default under the system's temporary directory), so a second run of this script,
# or a second process with the same model, finds them and compiles far faster. The plot
# shows whatever this run paid.


def break_even_call(overhead_s, eager_s, compiled_s):
    """First call count at which compiling has paid off, or None if it never does."""
    saving_per_call = eager_s - compiled_s
    if saving_per_call <= 0:
        return None
    return math.ceil(overhead_s / saving_per_call)


def plot_cumulative(overhead_s, eager_s, compiled_s, break_even):
    n_max = 1000 if break_even is None else max(10, 3 * break_even)
    calls = np.linspace(0, n_max, 200)
    fig, ax = plt.subplots(figsize=(7, 4.2))
    ax.plot(calls, calls * eager_s, label="eager")
    ax.plot(calls, overhead_s + calls * compiled_s, label="compiled (compile time = intercept)")
    if break_even is None:
        ax.text(0.35, 0.5, "compiled is not faster per call:\nno break-even",
                transform=ax.transAxes)
    else:
        ax.axvline(break_even, color="gray", linestyle=":")
        ax.plot([break_even], [break_even * eager_s], "ko")
        ax.annotate(f"break-even: call {break_even:,}", (break_even, break_even * eager_s),
                    textcoords="offset points", xytext=(8, -16))
    ax.set_xlabel("number of calls N")
    ax.set_ylabel("cumulative time (s)")
    ax.set_title(f"Feed-forward block, d = {D_MAIN}, {device_name()}")
    ax.legend(loc="upper left")
    fig.tight_layout()


if COMPILE_WORKS:
    overhead_s = max(first_call_s - compiled_s, 0.0)
    break_even = break_even_call(overhead_s, eager_s, compiled_s)
    print(f"compile overhead: {overhead_s:.2f} s;  saving per call: {(eager_s - compiled_s) * 1e3:.3f} ms")
    if break_even is None:
        print("the compiled block is not faster per call here, so compiling never pays off")
    else:
        print(f"compiling pays off from call {break_even:,} on")
    plot_cumulative(overhead_s, eager_s, compiled_s, break_even)
else:
    print("skipped: torch.compile is not available on this machine")

# %%
# Speedup as the block grows wider
# --------------------------------
# Each width is a new block compiled for its own static shapes (the width ``d`` already
# measured above is reused). The roofline line uses the byte and FLOP counts from the
# prediction and this machine's two ceilings.


def measure_width(d):
    block_d, x_d = make_block(d)
    compiled_d = torch.compile(block_d, dynamic=False)
    torch.testing.assert_close(compiled_d(x_d), block_d(x_d), rtol=1e-4, atol=1e-4)
    return time_eager_and_compiled(block_d, compiled_d, x_d)


def plot_speedup_vs_width(widths, measured):
    fig, ax = plt.subplots(figsize=(7, 4.2))
    fine = np.geomspace(widths[0], widths[-1], 50)
    ax.plot(fine, [predicted_speedup(d) for d in fine], "--", label="roofline prediction")
    ax.plot(widths, measured, "o-", label="measured (eager / compiled median)")
    ax.axhline(1.0, color="gray", linewidth=0.8)
    ax.set_xscale("log", base=2)
    ax.set_xticks(widths, [str(d) for d in widths])
    ax.set_xlabel("block width d (hidden layer 4d)")
    ax.set_ylabel("speedup of torch.compile (x)")
    ax.set_title(f"Feed-forward block, {TOKENS} tokens, float32, {device_name()}")
    ax.legend()
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
    print("skipped: torch.compile is not available on this machine")
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
    print("\nfullgraph=True accepted sine_then_branch (unexpected on this torch version)")
except RuntimeError as error:  # Dynamo's errors derive from RuntimeError
    print(f"\nfullgraph=True refuses sine_then_branch: {type(error).__name__}")
    for line in first_lines(str(error)):
        print(f"    {line}")

whole = torch.compile(sine_then_where, backend="eager", fullgraph=True)
broken = torch.compile(sine_then_branch, backend="eager")
for sign in (1, -1):  # sin is odd, so the two signs take both branches
    x_signed = sign * x_small
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
# the same log channel that ``TORCH_LOGS=recompiles`` prints.
#
# ``torch._dynamo.mark_dynamic(x, 0)`` declares the dimension dynamic up front, so a
# single graph serves every length. ``torch.compile(fn, dynamic=True)`` does the same
# for every dimension. Recompiles are capped (``torch._dynamo.config.recompile_limit``);
# beyond the cap Dynamo runs that function eagerly, with one warning that is easy to
# miss: a common reason for a "compiled" model that is not faster.

LENGTHS = [8, 13, 21, 34, 55]


def scaled_sine(x):
    return torch.sin(2 * x) + 1


class GraphCounter:
    """A torch.compile backend that records each graph it is given, then runs it."""

    def __init__(self):
        self.kinds = []

    def __call__(self, graph_module, example_inputs):
        dynamic = any(isinstance(a, torch.SymInt) for a in example_inputs)
        self.kinds.append("dynamic" if dynamic else "static")
        return graph_module.forward


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
        torch.testing.assert_close(compiled(x_n), scaled_sine(x_n))
    return counter.kinds, counters["stats"]["unique_graphs"]


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
        torch._logging.set_logs()  # back to torch's defaults ...
        for name in QUIET_LOGGERS:  # ... and to this example's quiet levels
            logging.getLogger(name).setLevel(logging.ERROR)
    return kinds, unique_graphs, handler.reasons


def report(label, kinds, unique_graphs, expected):
    verdict = "as expected" if len(kinds) == expected else f"expected {expected}: this torch version differs"
    print(f"{label:<26} graphs: {len(kinds)} ({', '.join(kinds)}); "
          f"unique_graphs counter: {unique_graphs}  [{verdict}]")


print(f"input lengths: {LENGTHS}")
kinds, unique_graphs, reasons = call_with_lengths_and_log_recompiles()
report("default (automatic dynamic)", kinds, unique_graphs, expected=2)
for reason in reasons or ["(no recompile reason captured: the log layout differs in this torch version)"]:
    print(f"    recompile reason: {reason}")
kinds, unique_graphs = call_with_lengths(mark_dynamic=True)
report("mark_dynamic(x, 0)", kinds, unique_graphs, expected=1)

# %%
# What the compiler cannot do, and one thing it recognises
# ---------------------------------------------------------
# Inductor's power is fusion and scheduling of the operations you wrote. It does not
# invent a different algorithm. FlashAttention is not "the attention operations, fused":
# it reorders the computation around an online softmax that never materialises the
# score matrix (:ref:`sphx_glr_auto_examples_lecture05_gpus_06_flash_attention.py`).
# Also outside its reach are decisions at the system level. How a model is sharded
# across GPUs, and so which communication exists to overlap with computation, is
# decided by frameworks such as FSDP or tensor parallelism; Inductor has optional
# passes that reorder the collectives it is given, nothing more. Mixture-of-Experts
# routing sends a data-dependent number of tokens to each expert, which means graph
# breaks or dynamic shapes, and its fast grouped-matmul kernels are written by hand.
#
# What Inductor *does* do is recognise a known pattern. Its pattern matcher rewrites a
# hand-written ``softmax(Q K^T / sqrt(d)) V`` into a call of PyTorch's fused attention
# (``scaled_dot_product_attention``: a flash or memory-efficient kernel on a GPU, a
# flash-style loop on a CPU). Someone wrote that kernel by hand; the compiler only
# spotted the place to use it. Below we compile the hand-written version and look for
# the fused call in the generated code.


def naive_attention(q, k, v):
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
    return torch.softmax(scores, dim=-1) @ v


ATTENTION_SHAPE = (8, 16, 1024, 64) if DEVICE == "cuda" else (3, 5, 97, 40)


def inspect_compiled_attention():
    q, k, v = (torch.randn(ATTENTION_SHAPE, device=DEVICE) for _ in range(3))
    out, attention_sources = run_and_get_code(torch.compile(naive_attention), q, k, v)
    code = "\n".join(attention_sources)
    fused_calls = re.findall(r"(_scaled_dot_product_\w+)\.default\(", code)
    matmul_calls = re.findall(r"extern_kernels\.b?mm\(", code)
    reference = F.scaled_dot_product_attention(q.double(), k.double(), v.double())
    torch.testing.assert_close(out, reference.float(), rtol=1e-4, atol=1e-4)
    return fused_calls, len(matmul_calls)


if COMPILE_WORKS:
    try:
        fused_calls, matmul_count = inspect_compiled_attention()
        print(f"attention shape (batch, heads, seq, head_dim): {ATTENTION_SHAPE}")
        print(f"calls of a fused attention kernel in the generated code: {len(fused_calls)}"
              f"  {sorted(set(fused_calls))}")
        print(f"separate (b)mm calls left in the generated code        : {matmul_count}")
        print("compiled hand-written attention matches F.scaled_dot_product_attention (float64)")
        if not fused_calls:
            print("the pattern was not rewritten on this device and torch version: plain fusion only")
    except AssertionError:
        raise  # a numerical mismatch must fail the build
    except Exception as error:  # noqa: BLE001 (an Inductor failure only skips this part)
        print(f"compiling attention failed here ({type(error).__name__}); skipped")
else:
    print("skipped: torch.compile is not available on this machine")

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
# function a handful of times. The on-disk cache makes later runs cheaper.
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
# * ``mode="max-autotune"`` also benchmarks kernel configurations and Triton matmul
#   templates, into which it can fuse elementwise epilogues (a longer compile);
#   ``mode="reduce-overhead"`` replays CUDA graphs to cut launch costs.
# * New algorithms (FlashAttention's online softmax, fused MoE dispatch, quantised
#   matmuls) still come from hand-written Triton or CUDA kernels, which the compiler
#   then calls. That is why high-performance LLM code is "compiler plus a few
#   hand-written kernels".

dynamo.reset()
for name, level in saved_log_levels.items():
    logging.getLogger(name).setLevel(level)

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
    KEY_FIGURES["first_compiled_call_s"] = first_call_s
    KEY_FIGURES[f"speedup_d{D_MAIN}"] = eager_s / compiled_s
    KEY_FIGURES[f"predicted_speedup_d{D_MAIN}"] = predicted_speedup(D_MAIN)
    KEY_FIGURES[f"compiled_block_fraction_of_matmul_rate_d{D_MAIN}"] = block_rate / MATMUL_RATE
    # as text, since the report rounds numbers to 4 decimals
    KEY_FIGURES["max_abs_diff_compiled_vs_float64"] = f"{compiled_error:.2e}"
    KEY_FIGURES[f"speedup_d{WIDTHS[-1]}"] = speedups[-1]
