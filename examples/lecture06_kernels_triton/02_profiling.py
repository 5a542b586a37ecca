"""
Profiling: what ran, and for how long
=====================================

A timer tells you how long a piece of code takes; a profiler tells you what
ran inside it. We profile an addition, two matrix multiplications, GeLU and
softmax with ``torch.profiler``, read its tables, count the kernels that each
version launches, and save a trace that you can open in a browser.

**Requirements.** Full version: a CUDA GPU, where the profiler records every
kernel with its name and its time on the device. On a CPU it records PyTorch
operators and their CPU time, so the page shows operator counts instead of
kernel counts; kernel names need a GPU. On a T4 (compute capability 7.5, as on
free Colab notebooks) it profiles float32 matmuls instead of bfloat16 ones.
"""

# %%
# Setup
# -----
# One device, sizes that fit it, a fixed seed, and the profiler settings that
# go with the device.

import math
import os
import re
import tempfile
from collections import Counter
from functools import partial
from pathlib import Path

import matplotlib.pyplot as plt
import torch
import torch.nn.functional as F
from torch.autograd import DeviceType
from torch.profiler import ProfilerActivity, record_function
from torch.utils import benchmark as torch_benchmark

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
torch.manual_seed(0)

if DEVICE == "cuda":
    ACTIVITIES = [ProfilerActivity.CPU, ProfilerActivity.CUDA]
    SORT_KEY = "self_device_time_total"
    ROWS, COLS = 4096, 4096  # elementwise and softmax inputs: 16M floats
    MATMUL_SIZES = (64, 4096)
    # Emulated bfloat16 (before compute capability 8.0) would profile the emulation.
    MATMUL_DTYPE = torch.bfloat16 if torch.cuda.get_device_capability() >= (8, 0) else torch.float32
    if MATMUL_DTYPE == torch.float32:
        print("This GPU has no native bfloat16 (needs compute capability 8.0): float32 matmuls.")
    DEVICE_NAME = torch.cuda.get_device_name()
    print("CUDA: the profiler sees every kernel and its time on the GPU.")
else:
    ACTIVITIES = [ProfilerActivity.CPU]
    SORT_KEY = "self_cpu_time_total"
    ROWS, COLS = 1024, 1024
    MATMUL_SIZES = (64, 512)
    MATMUL_DTYPE = torch.float32
    DEVICE_NAME = f"CPU, {torch.get_num_threads()} threads"
    print("CPU: the profiler sees PyTorch operators; GPU kernel names need a GPU.")

PROFILED_CALLS = 5
print(f"device: {DEVICE_NAME}   inputs: {ROWS} x {COLS} float32   "
      f"matmul sizes: {MATMUL_SIZES}, {MATMUL_DTYPE}")


def synchronize():
    if DEVICE == "cuda":
        torch.cuda.synchronize()


# %%
# Profiling one workload
# ----------------------
# ``profile`` warms the workload up outside the profiler, then records
# ``PROFILED_CALLS`` calls. From the recording we take *what was launched*: on
# a GPU the kernels (events on the CUDA device), on a CPU the top-level
# PyTorch operators (events with no parent), each with its duration.


def profile(fn):
    fn()
    synchronize()
    with torch.profiler.profile(activities=ACTIVITIES) as prof:
        for _ in range(PROFILED_CALLS):
            fn()
        synchronize()
    return prof


def launched(prof):
    """Every kernel (CUDA) or top-level operator (CPU) the profile recorded, in order."""
    if DEVICE == "cuda":
        return [e for e in prof.events() if e.device_type == DeviceType.CUDA]
    return [e for e in prof.events() if e.cpu_parent is None]


def event_label(event, width=100):
    """A short label: the kernel name without C++ decorations, or the operator name."""
    return short_kernel_name(event.name, width) if DEVICE == "cuda" else event.name


def describe(event):
    """For the compact list: the label, plus on CPU the operators it called."""
    called = list(dict.fromkeys(child.name for child in event.cpu_children))
    if DEVICE == "cuda" or not called:
        return event_label(event)
    return f"{event.name} > {', '.join(called)}"


def short_kernel_name(name, width=100):
    """Drop namespaces, argument lists and lambda decorations from a C++ kernel name."""
    name = name.removeprefix("void ")
    name = re.sub(r"\(anonymous namespace\)::|\b\w+::", "", name)
    while (shorter := re.sub(r"\([^()]*\)", "", name)) != name:
        name = shorter
    name = re.sub(r"\s*(::)?\{lambda#\d+\}|::operator| const", "", name)
    name = re.sub(r"^(vectorized|unrolled)_elementwise_kernel<\d+, ", "elementwise<", name)
    name = re.sub(r", array<char\*, \d+ul> >$", ">", name)
    name = re.sub(r"(?:(?:float|BFloat16|Half), )+", "", name).strip()
    return name if len(name) <= width else name[: width - 3] + "..."


def launches_per_call(prof):
    return len(launched(prof)) / PROFILED_CALLS


def show(title, prof):
    """The profiler's own table, then what was launched per call as a compact list."""
    print(f"=== {title}")
    print(prof.key_averages().table(sort_by=SORT_KEY, row_limit=6, max_name_column_width=60))
    counts = Counter(describe(event) for event in launched(prof))
    print(f"launched per call: {launches_per_call(prof):g}")
    for name, count in counts.items():
        print(f"  {count / PROFILED_CALLS:g} x {name}")


# %%
# An elementwise addition
# -----------------------
# The simplest case: one operator, and on a GPU one kernel that reads two
# arrays and writes one. In the table, *self* time is time spent in an entry
# itself, excluding what it called; on a GPU, sorting by self device time
# puts the kernels that kept the GPU busy at the top. An operator's self CPU
# time is its own C++ work (argument checks, dispatch; on a CPU also the
# arithmetic). On a GPU the launch call is an entry of its own, such as
# ``cudaLaunchKernel``, inside the operator's total CPU time but not its self
# time. Time spent in Python belongs to no entry: the
# trace at the end shows it as gaps between operators.

x = torch.randn(ROWS, COLS, device=DEVICE)
y = torch.randn(ROWS, COLS, device=DEVICE)
add_profile = profile(partial(torch.add, x, y))
show("x + y", add_profile)

# %%
# Matrix multiplication at two sizes
# ----------------------------------
# ``torch.matmul`` hands the work to a vendor library: cuBLAS (or cuBLASLt) on
# an NVIDIA GPU, oneDNN or MKL on a CPU. The library keeps many kernels, each
# tuned for a range of shapes (tile sizes, split strategies, tensor-core
# instructions), and a heuristic picks one per call. The kernel name often
# encodes those choices, so on a GPU compare the names for the small and the
# large matrix below. On a CPU, the operator names show the path through
# PyTorch instead (``aten::matmul`` calling ``aten::mm``); which code path the
# CPU library then takes inside is invisible to the profiler.

matmul_kernels = {}
for n in MATMUL_SIZES:
    a = torch.randn(n, n, device=DEVICE, dtype=MATMUL_DTYPE)
    b = torch.randn(n, n, device=DEVICE, dtype=MATMUL_DTYPE)
    matmul_profile = profile(partial(torch.matmul, a, b))
    show(f"matmul {n} x {n}, {MATMUL_DTYPE}", matmul_profile)
    matmul_kernels[n] = {event.name for event in launched(matmul_profile)}
del a, b
if DEVICE == "cuda":
    small, large = MATMUL_SIZES
    same = matmul_kernels[small] == matmul_kernels[large]
    print(f"same kernels for n = {small} and n = {large}: {'yes' if same else 'no'}")

# %%
# GeLU by hand and from the library
# ---------------------------------
# The tanh approximation of GeLU is
# ``0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))``. Written with PyTorch
# operators, every ``*``, ``+`` and ``tanh`` is a separate operator, and on a
# GPU a separate kernel that reads its inputs from memory and writes its result
# back. ``F.gelu(x, approximate="tanh")`` computes the same function in one
# kernel that reads ``x`` once and writes the result once. Predict: the
# hand-written version launches as many kernels as it has operators (nine, as
# written below), the library one, and since each of these kernels is limited
# by memory traffic, the time should grow roughly with the count.
#
# First we check that both compute the same function, against a float64
# reference on an irregular shape.


def hand_gelu(x):
    inner = math.sqrt(2.0 / math.pi) * (x + 0.044715 * x * x * x)
    return 0.5 * x * (1.0 + torch.tanh(inner))


def library_gelu(x):
    return F.gelu(x, approximate="tanh")


check = torch.randn(1023, 517, device=DEVICE)
reference = F.gelu(check.double(), approximate="tanh")
for gelu in (hand_gelu, library_gelu):
    # float32: about ten roundings of values of the output's size plus tanh's few ulps,
    # under 2e-6 relative on any device; atol for outputs near 0, where 1 + tanh cancels
    torch.testing.assert_close(gelu(check).double(), reference, rtol=1e-5, atol=1e-6)
print("hand-written and library GeLU match the float64 reference")

hand_gelu_profile = profile(partial(hand_gelu, x))
show("hand-written GeLU", hand_gelu_profile)
library_gelu_profile = profile(partial(library_gelu, x))
show('F.gelu(x, approximate="tanh")', library_gelu_profile)

# %%
# Softmax by hand and from the library
# ------------------------------------
# Softmax along the last dimension needs a maximum and a sum per row besides
# the elementwise work. Written by hand it is five operators (two reductions,
# subtract, exponential, divide); ``F.softmax`` does it in one.


def hand_softmax(x):
    shifted = x - x.amax(dim=-1, keepdim=True)
    exponentials = shifted.exp()
    return exponentials / exponentials.sum(dim=-1, keepdim=True)


def library_softmax(x):
    return F.softmax(x, dim=-1)


reference = F.softmax(check.double(), dim=-1)
for softmax in (hand_softmax, library_softmax):
    # float32: exp's few ulps and a tree-reduced sum of 517 terms (about log2 517 = 9
    # roundings) relative to each entry, on any device; atol far below the entries (~1/517)
    torch.testing.assert_close(softmax(check).double(), reference, rtol=1e-5, atol=1e-7)
print("hand-written and library softmax match the float64 reference")

hand_softmax_profile = profile(partial(hand_softmax, x))
show("hand-written softmax", hand_softmax_profile)
library_softmax_profile = profile(partial(library_softmax, x))
show("F.softmax(x, dim=-1)", library_softmax_profile)

# %%
# Checking the claim
# ------------------
# The prediction was that the hand-written GeLU launches nine kernels (on a
# CPU: operators) and ``F.gelu`` one, and that the hand-written softmax
# launches five and ``F.softmax`` one. If a count differed, the argument of
# this page would be wrong, so we raise.

PREDICTED_LAUNCHES = {"hand-written GeLU": 9, "F.gelu": 1, "hand-written softmax": 5,
                      "F.softmax": 1}
workload_profiles = {"hand-written GeLU": hand_gelu_profile, "F.gelu": library_gelu_profile,
                     "hand-written softmax": hand_softmax_profile,
                     "F.softmax": library_softmax_profile}
print(f"{'workload':<22}  {'predicted':>9}  {'launched per call':>17}")
for workload, prof in workload_profiles.items():
    print(f"{workload:<22}  {PREDICTED_LAUNCHES[workload]:>9}  {launches_per_call(prof):>17g}")
for workload, prof in workload_profiles.items():
    if launches_per_call(prof) != PREDICTED_LAUNCHES[workload]:
        raise RuntimeError(f"{workload}: predicted {PREDICTED_LAUNCHES[workload]} launches per "
                           f"call, the profiler counted {launches_per_call(prof):g}")

# %%
# Where the time goes in GeLU
# ---------------------------
# Left: the time per call of each kernel (CPU: operator) from the profiles
# above, summed over repeats of the same name. Right: the whole call timed
# with ``torch.utils.benchmark``, which also includes the launch overhead
# between kernels.


def time_per_name(prof):
    """Microseconds per call and launches per call for each name, in first-launch order."""
    times, counts = {}, Counter()
    for event in launched(prof):
        name = event_label(event, width=44)
        times[name] = times.get(name, 0.0) + event.time_range.elapsed_us() / PROFILED_CALLS
        counts[name] += 1
    return {f"{name} (x{counts[name] / PROFILED_CALLS:g})": microseconds
            for name, microseconds in times.items()}


def median_us(fn):
    timer = torch_benchmark.Timer(stmt="fn()", globals={"fn": fn},
                                  num_threads=torch.get_num_threads())
    return 1e6 * timer.blocked_autorange(min_run_time=0.2).median


gelu_profiles = {"hand-written": hand_gelu_profile, "F.gelu": library_gelu_profile}
gelu_totals = {"hand-written": median_us(partial(hand_gelu, x)),
               "F.gelu": median_us(partial(library_gelu, x))}
print(f"{'GeLU':<13}  {'launched':>8}  {'time per call (us)':>18}")
for name, prof in gelu_profiles.items():
    print(f"{name:<13}  {launches_per_call(prof):>8g}  {gelu_totals[name]:18.1f}")
# On a GPU each extra launch is a full pass over memory, so the time follows the
# count. A CPU's time for a small input swings with what else the cores run (a
# loaded build machine can invert it), so there the time is only printed.
if DEVICE == "cuda" and gelu_totals["hand-written"] <= gelu_totals["F.gelu"]:
    raise RuntimeError("expected the hand-written GeLU to take longer than F.gelu")

gelu_colors = {"hand-written": "tab:red", "F.gelu": "tab:blue"}
fig, (parts_ax, totals_ax) = plt.subplots(
    1, 2, figsize=(10, 4.5), gridspec_kw={"width_ratios": [2.2, 1]})
row = 0
for name, prof in gelu_profiles.items():
    parts = time_per_name(prof)
    rows = range(row, row + len(parts))
    parts_ax.barh(rows, list(parts.values()), color=gelu_colors[name], label=name)
    for y_position, part in zip(rows, parts):
        parts_ax.annotate(part, (0, y_position), xytext=(3, 0), textcoords="offset points",
                          va="center", fontsize="small")
    row += len(parts)
parts_ax.set_yticks([])
parts_ax.invert_yaxis()
parts_ax.set_xlabel("time per call (µs)")
parts_ax.set_title("per kernel, from the profiler" if DEVICE == "cuda"
                   else "per operator, from the profiler")
parts_ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.17), ncol=2, frameon=False)
bars = totals_ax.bar(list(gelu_totals), list(gelu_totals.values()),
                     color=[gelu_colors[name] for name in gelu_totals])
totals_ax.bar_label(bars, labels=[f"{launches_per_call(prof):g} launched"
                                  for prof in gelu_profiles.values()])
totals_ax.margins(y=0.15)
totals_ax.set_ylabel("median time per call (µs)")
totals_ax.set_title("whole call, torch.utils.benchmark")
fig.suptitle(f"GeLU on {ROWS}x{COLS} floats, hand-written vs F.gelu, {DEVICE_NAME}")
fig.tight_layout()

# %%
# A trace to explore
# ------------------
# Tables summarise; a trace shows every event on a time line, one row per CPU
# thread and per GPU stream, so gaps between kernels (launch overhead, Python)
# become visible. We record one call of each GeLU under a label and export the
# trace as gzip-compressed JSON.
#
# To look at it, download the file and open https://ui.perfetto.dev (drag the
# file onto the page), or open ``chrome://tracing`` in Chrome or Chromium and
# use *Load*. Zoom with W and S, pan with A and D, and click an event to see its
# duration and arguments. The labels ``hand-written GeLU`` and ``F.gelu`` mark
# the two calls.

trace_dir = Path(os.environ.get("COURSE_ARTIFACT_DIR") or tempfile.mkdtemp())
trace_dir.mkdir(parents=True, exist_ok=True)
trace_path = trace_dir / "02_profiling_trace.json.gz"
small_x = torch.randn(256, 1024, device=DEVICE)
hand_gelu(small_x)  # warm-up outside the trace
library_gelu(small_x)
synchronize()
with torch.profiler.profile(activities=ACTIVITIES, record_shapes=True) as trace_profile:
    with record_function("hand-written GeLU"):
        hand_gelu(small_x)
    with record_function("F.gelu"):
        library_gelu(small_x)
    synchronize()
trace_profile.export_chrome_trace(str(trace_path))
# relative to the folder the example runs in (its own, in a site build): no machine's
# absolute path on the page
print(f"trace: {os.path.relpath(trace_path)} ({trace_path.stat().st_size / 1024:.1f} KiB)")

# %%
# Reading the result
# ------------------
# The profiler answers questions a timer cannot: which operators a line of
# PyTorch turns into, which kernels run and how long each takes. The tables
# above show that every operator of the hand-written GeLU and softmax becomes
# its own launch, while the library versions do the same arithmetic in one.
# The checks above make sure of those counts on every build, and on a GPU
# that the hand-written GeLU is the slower one. Each extra elementwise launch reads and
# writes the whole tensor once more, so the hand-written GeLU moves many times
# the bytes of ``F.gelu`` for the same arithmetic; the figure shows how its
# time is spread over its kernels.
#
# On a GPU the matmul tables also show that the vendor library picks a kernel
# per shape, and the names tell you which. On a CPU there are no kernel
# launches and the operator tables show the CPU work directly; the counts
# still show the extra passes over memory. Fusing such chains of small
# operators into one kernel is what Triton lets us write by hand and what
# ``torch.compile`` does automatically, the subject of the rest of this
# lecture. Timing itself is covered in
# :ref:`sphx_glr_auto_examples_lecture06_kernels_triton_01_benchmarking.py`.

del x, y, check, small_x

# %%
# Key figures
# -----------
# The numbers this example exists to measure, collected for the course's GPU check.

KEY_FIGURES = {
    "device": DEVICE_NAME,
    "launched_per_call_hand_gelu": launches_per_call(hand_gelu_profile),
    "launched_per_call_F_gelu": launches_per_call(library_gelu_profile),
    "launched_per_call_hand_softmax": launches_per_call(hand_softmax_profile),
    "launched_per_call_F_softmax": launches_per_call(library_softmax_profile),
    "gelu_hand_us": gelu_totals["hand-written"],
    "gelu_F_gelu_us": gelu_totals["F.gelu"],
    "gelu_hand_over_F_gelu_time": gelu_totals["hand-written"] / gelu_totals["F.gelu"],
}
if DEVICE == "cuda":
    KEY_FIGURES["matmul_same_kernels_small_and_large"] = "yes" if same else "no"
