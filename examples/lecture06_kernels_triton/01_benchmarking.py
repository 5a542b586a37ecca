"""
Benchmarking by hand, and why it is easy to get wrong
=====================================================

How long does a matrix multiplication take? We first time it the obvious way
and see that the answer is wrong, then build a correct timer, check it against
``torch.utils.benchmark``, and use it to measure how the matmul rate in TFLOP/s
grows with the size of the matrices.

**Requirements.** Full version: a CUDA GPU (bf16 needs compute capability 8.0
or newer). On a CPU the page shows the warm-up effect, the spread between runs
and the matmul sweep at small sizes; the asynchronous-launch trap needs a GPU.
On a T4 (compute capability 7.5, as on free Colab notebooks) the matmul sweep
runs in float32 only, because bfloat16 is emulated there.
"""

# %%
# Setup
# -----
# One device, sizes that fit it, a fixed seed.

import contextlib
import platform
import statistics
import time

import matplotlib.pyplot as plt
import torch
from matplotlib.ticker import NullLocator
from torch.utils import benchmark as torch_benchmark

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
torch.manual_seed(0)
# float32 matmuls in float32 on a GPU too, not TF32: what the sweep times as float32, and
# what the check below compares with float64
torch.backends.cuda.matmul.allow_tf32 = False

if DEVICE == "cuda":
    DEMO_N = 8192  # a matmul that keeps the GPU busy for a while
    SWEEP_SIZES = [16, 24, 32, 48, 64, 96, 128, 192, 256, 384, 512, 768, 1024,
                   1536, 2048, 3072, 4096, 6144, 8192]
    SWEEP_REPEATS = 50
    SPREAD_CALLS = 200
    if torch.cuda.is_bf16_supported(including_emulation=False):  # emulation would time it
        SWEEP_DTYPES = [torch.bfloat16, torch.float32]
    else:
        SWEEP_DTYPES = [torch.float32]
        print("This GPU has no fast bf16 (needs compute capability 8.0): float32 only.")
    DEVICE_NAME = torch.cuda.get_device_name()
    print("CUDA: this page shows the asynchronous-launch trap, warm-up and spread.")
else:
    DEMO_N = 512  # about ten milliseconds on two cores
    SWEEP_SIZES = [8, 12, 16, 24, 32, 48, 64, 96, 128, 192, 256, 384, 512, 768, 1024]
    SWEEP_REPEATS = 15
    SPREAD_CALLS = 80
    SWEEP_DTYPES = [torch.float32]
    DEVICE_NAME = f"{platform.machine()} CPU, {torch.get_num_threads()} threads"
    print("CPU: warm-up and spread are visible here; the asynchronous-launch trap needs a GPU.")

DEMO_DTYPE = SWEEP_DTYPES[0]
print(f"device: {DEVICE_NAME}   demo matmul: {DEMO_N} x {DEMO_N}, {DEMO_DTYPE}")


def synchronize():
    """Wait until the device has finished all queued work (a no-op on CPU)."""
    if DEVICE == "cuda":
        torch.cuda.synchronize()


def square_matmul(n, dtype):
    """Return a no-argument function that multiplies two random n x n matrices."""
    a = torch.randn(n, n, device=DEVICE, dtype=dtype)
    b = torch.randn(n, n, device=DEVICE, dtype=dtype)
    return lambda: a @ b


def elementwise_add(numel):
    """Return a no-argument function that adds two random vectors of numel floats."""
    x = torch.randn(numel, device=DEVICE)
    y = torch.randn(numel, device=DEVICE)
    return lambda: x + y


def label_sizes(ax):
    """Log-2 x axis labelled with plain matrix sizes at the powers of two."""
    powers_of_two = [n for n in SWEEP_SIZES if n & (n - 1) == 0]
    ax.set_xscale("log", base=2)
    ax.set_xticks(powers_of_two, labels=[str(n) for n in powers_of_two])
    ax.xaxis.set_minor_locator(NullLocator())
    ax.set_xlabel("matrix size n (n x n @ n x n)")


def legend_below(ax):
    """The legend under the plot, where no measured point or line can lie beneath it."""
    ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.2), ncol=2, frameon=False,
              fontsize="small")


def dtype_name(dtype):
    return str(dtype).removeprefix("torch.")


def ms(seconds):
    return 1e3 * seconds


# %%
# The timer everybody writes first
# --------------------------------
# Read the clock, call the function, read the clock again. This timer has two
# problems.
#
# * **No warm-up.** The first call of an operation pays one-off costs: loading
#   library code and GPU kernels, creating handles, choosing an algorithm,
#   allocating memory, filling caches. Later calls do not pay them again.
# * **No synchronisation.** On a GPU, PyTorch *queues* a kernel and returns to
#   Python at once; the GPU works through the queue in the background. The clock
#   therefore stops when the launch is done, not when the work is done. On a CPU
#   every operation runs to completion before it returns, so this trap does not
#   exist there.


def time_without_warmup_or_sync(fn, calls):
    """The wrong timer: one clock reading per call, no warm-up, no synchronisation."""
    times = []
    for _ in range(calls):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return times


demo_matmul = square_matmul(DEMO_N, DEMO_DTYPE)
wrong_times = time_without_warmup_or_sync(demo_matmul, calls=10)
print(f"{'call':>4}  {'wrong timer (ms)':>16}")
for call, seconds in enumerate(wrong_times, start=1):
    print(f"{call:>4}  {ms(seconds):16.4f}")

# %%
# The right timer
# ---------------
# Three fixes. Warm up first and throw those calls away. Synchronise before
# reading the clock, so the work is inside the measurement. Repeat many times
# and summarise with the **median**.
#
# Why the median and not the mean? Noise in timings is one-sided: an interrupt,
# another process, a frequency change or a cache miss can only make a call
# slower, never faster than the work allows. The distribution of call times
# therefore has a long tail on the slow side, and a handful of slow calls pulls
# the mean up. The median describes a typical call and barely moves when a few
# outliers come and go, so it is also more repeatable from one run to the next.
# The minimum is sometimes used too, but it reports a best case that a real
# program may rarely see.
#
# Synchronising after every call adds the synchronisation latency to each
# sample. For work that takes much longer than that latency this does not
# matter; for tiny operations a library timer that times blocks of calls does
# better (see the comparison below).


def timed_calls(fn, repeats):
    """Time each of ``repeats`` calls of fn, synchronising so the work is included."""
    synchronize()  # do not inherit queued work from earlier code
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        synchronize()
        times.append(time.perf_counter() - start)
    return times


def benchmark(fn, warmup, repeats):
    """Median seconds per call of fn, after ``warmup`` untimed calls."""
    for _ in range(warmup):
        fn()
    return statistics.median(timed_calls(fn, repeats))


right_median = benchmark(demo_matmul, warmup=5, repeats=50)
print(f"right timer, median of 50 calls: {ms(right_median):.4f} ms")
print(f"wrong timer, median of calls 2-10 / right median: "
      f"{statistics.median(wrong_times[1:]) / right_median:.3f}")

# %%
# On a GPU the wrong timer reports the launch, a small fraction of the real
# time, so we can check that claim. (On a CPU both timers measure the work;
# only the first call stands out, and only when it pays a one-off cost.)

if DEVICE == "cuda" and statistics.median(wrong_times[1:]) > 0.5 * right_median:
    raise RuntimeError("Expected unsynchronised calls to return long before the GPU finished.")

# %%
# Spread: between calls, and between runs
# ----------------------------------------
# Time many calls after warm-up and look at the distribution, then repeat the
# whole measurement a few times. Compare how much the medians of the runs
# differ with how much their means differ.

spread_times = timed_calls(demo_matmul, SPREAD_CALLS)
print(f"{SPREAD_CALLS} calls (ms): min {ms(min(spread_times)):.4f}   "
      f"median {ms(statistics.median(spread_times)):.4f}   "
      f"mean {ms(statistics.mean(spread_times)):.4f}   max {ms(max(spread_times)):.4f}")

run_medians, run_means = [], []
print(f"{'run':>3}  {'median (ms)':>11}  {'mean (ms)':>9}  {'max (ms)':>9}")
for run in range(1, 6):
    samples = timed_calls(demo_matmul, SPREAD_CALLS // 4)
    run_medians.append(statistics.median(samples))
    run_means.append(statistics.mean(samples))
    print(f"{run:>3}  {ms(run_medians[-1]):11.4f}  {ms(run_means[-1]):9.4f}  {ms(max(samples)):9.4f}")
print(f"largest / smallest over the runs: medians {max(run_medians) / min(run_medians):.3f}, "
      f"means {max(run_means) / min(run_means):.3f}")

# %%
# Every call as a dot: the first calls of the wrong timer, then the calls of
# the right one with their median and mean. On a machine shared with other
# programs, a call that uses several threads waits whenever one of its threads
# loses its core, so the slow calls may form a cluster of their own.

fig, ax = plt.subplots(figsize=(7, 4))
ax.plot(range(1, len(wrong_times) + 1), [ms(t) for t in wrong_times], "o", color="tab:red",
        label="wrong timer (no warm-up, no sync)")
right_calls = range(len(wrong_times) + 1, len(wrong_times) + 1 + len(spread_times))
ax.plot(right_calls, [ms(t) for t in spread_times], ".", color="tab:blue",
        label="right timer (warmed up, synchronised)")
ax.axhline(ms(statistics.median(spread_times)), color="black", label="median")
ax.axhline(ms(statistics.mean(spread_times)), color="gray", linestyle="--", label="mean")
ax.set_yscale("log")
ax.set_xlabel("sample number (in order of measurement)")
ax.set_ylabel("time per call (ms)")
ax.set_title(f"{DEMO_N}x{DEMO_N} matmul, {dtype_name(DEMO_DTYPE)}, {DEVICE_NAME}")
legend_below(ax)
fig.tight_layout()

# %%
# The library timer
# -----------------
# ``torch.utils.benchmark.Timer`` does all of the above for us. Its
# ``blocked_autorange`` warms up, then runs the statement in blocks of calls,
# each block long enough that reading the clock costs nothing in comparison.
# It synchronises the GPU around each block and reports the median over
# blocks. Each block gives a *mean* over its calls, so on a busy machine with
# frequent slow calls the library's figure sits above a per-call median. A
# block is a single call, and the two statistics coincide, only when one call
# lasts ten thousand times as long as reading the timer (on a GPU, a
# synchronisation), or longer than ``min_run_time``.
#
# One detail matters on a CPU: ``Timer`` uses **one thread** unless told
# otherwise, while PyTorch normally uses all cores, so we pass
# ``num_threads`` to compare like with like.
#
# For work that is large compared with the synchronisation latency, the hand
# timer and the library should agree. We check this on the matmul above and
# on a large elementwise addition, and raise if they still differ by more than
# a factor of two after three attempts: another program on a busy machine can
# upset one pair of measurements, but not a correct timer every time. One
# exception, on a CPU only: if every attempt disagrees and in each this process
# ran less than 80 % of its threads' time, both while the hand timer ran and
# while the library ran, as when other programs keep the cores busy
# throughout, the timers are printed but not compared. On a GPU a disagreement
# always raises.

AGREEMENT_FACTOR = 2.0
ATTEMPTS = 3
add_numel = (1 << 26) if DEVICE == "cuda" else (1 << 22)


def library_median(fn):
    timer = torch_benchmark.Timer(stmt="fn()", globals={"fn": fn},
                                  num_threads=torch.get_num_threads())
    return timer.blocked_autorange(min_run_time=0.3).median


print(f"{'workload':<24}  {'hand (ms)':>9}  {'library (ms)':>12}  {'hand/library':>12}")
def cpu_share(wall, cpu):
    """The share of its threads' time this process ran since those two clock readings."""
    return (time.process_time() - cpu) / (time.perf_counter() - wall) / torch.get_num_threads()


def timers_agree(label, fn):
    """Whether the two timers agree, and the most of its threads' time the process got in any phase."""
    most_share = 0.0
    for _ in range(ATTEMPTS):
        wall, cpu = time.perf_counter(), time.process_time()
        hand = benchmark(fn, warmup=5, repeats=50)
        hand_share = cpu_share(wall, cpu)
        wall, cpu = time.perf_counter(), time.process_time()
        library = library_median(fn)
        most_share = max(most_share, hand_share, cpu_share(wall, cpu))
        print(f"{label:<24}  {ms(hand):9.4f}  {ms(library):12.4f}  {hand / library:12.3f}")
        if 1 / AGREEMENT_FACTOR < hand / library < AGREEMENT_FACTOR:
            return True, most_share
    return False, most_share


for label, fn in [(f"matmul {DEMO_N}, {dtype_name(DEMO_DTYPE)}", demo_matmul),
                  (f"add of {add_numel} floats", elementwise_add(add_numel))]:
    agree, share = timers_agree(label, fn)
    # Excused on a CPU only, and only if both timers ran starved in every attempt: a timer
    # that itself runs fewer threads (Timer without num_threads) starves one phase only.
    if not agree and DEVICE == "cpu" and share < 0.8:
        print(f"This process ran at most {share:.0%} of its {torch.get_num_threads()} threads' time"
              f" while the timers on {label} ran: they are printed, not compared.")
    elif not agree:
        raise RuntimeError(f"hand timer and torch.utils.benchmark disagree on {label}")

# %%
# Matmul rate against size: predict
# ---------------------------------
# Multiplying two n x n matrices takes n\ :sup:`3` multiply-adds, that is
# 2n\ :sup:`3` floating-point operations, on 3n\ :sup:`2` numbers. A simple
# model of the time is the larger of two costs:
#
# * a fixed **overhead** per call (Python, the PyTorch dispatcher, the kernel
#   launch, and on a GPU the synchronisation), independent of n;
# * the **compute** time, 2n\ :sup:`3` divided by the best rate the hardware
#   reaches.
#
# For small n the overhead wins: the time stays flat as n grows and the rate in
# TFLOP/s is tiny. For large n the compute wins: the time grows like n\ :sup:`3`
# (a slope of 3 on a log-log plot) and the rate levels off at the machine's
# best. Before sweeping we check the result once against a float64 reference,
# on an irregular shape.

# float32: a K-term sum of products of order 1/sqrt(K), about sqrt(K) eps of sum|a||b|,
# 3e-6 at K = 777 (no TF32, above). bfloat16: float32 sums (split-K partials too, below),
# then the output's one rounding, 2**-8 relative: rtol 4 roundings, atol for entries near 0.
MATMUL_TOLERANCES = {torch.float32: {"rtol": 1e-4, "atol": 1e-4},
                     torch.bfloat16: {"rtol": 1.6e-2, "atol": 1e-2}}


@contextlib.contextmanager
def split_k_sums_in_float32():
    """cuBLAS adds split-K partial sums in float32, not in the 16-bit output type as PyTorch
    allows by default (an error that grows with the number of partials, which cuBLAS picks)."""
    matmul = torch.backends.cuda.matmul
    defaults = matmul.allow_bf16_reduced_precision_reduction, matmul.allow_fp16_reduced_precision_reduction
    matmul.allow_bf16_reduced_precision_reduction = matmul.allow_fp16_reduced_precision_reduction = False
    try:
        yield
    finally:
        matmul.allow_bf16_reduced_precision_reduction, matmul.allow_fp16_reduced_precision_reduction = defaults

check_m, check_k, check_n = (1000, 777, 513) if DEVICE == "cuda" else (300, 257, 129)
for dtype in SWEEP_DTYPES:
    # scaled so that entries of the product are of order one
    a = (torch.randn(check_m, check_k, device=DEVICE) / check_k ** 0.5).to(dtype)
    b = torch.randn(check_k, check_n, device=DEVICE).to(dtype)
    reference = a.double() @ b.double()
    with split_k_sums_in_float32():  # the timed sweep keeps PyTorch's default
        product = (a @ b).double()
    torch.testing.assert_close(product, reference, **MATMUL_TOLERANCES[dtype])
    print(f"{dtype_name(dtype):>8} matmul {check_m}x{check_k} @ {check_k}x{check_n} "
          "matches the float64 reference")

# %%
# Matmul rate against size: measure
# ---------------------------------
# The sweep uses the ``benchmark`` function written above.


def tflops(n, seconds):
    return 2 * n ** 3 / seconds / 1e12


sweep_seconds = {}
for dtype in SWEEP_DTYPES:
    sweep_seconds[dtype] = [benchmark(square_matmul(n, dtype), warmup=3, repeats=SWEEP_REPEATS)
                            for n in SWEEP_SIZES]

header = "".join(f"  {dtype_name(d) + ' ms':>14}  {dtype_name(d) + ' TFLOP/s':>15}" for d in SWEEP_DTYPES)
print(f"{'n':>6}{header}")
for i, n in enumerate(SWEEP_SIZES):
    row = "".join(f"  {ms(sweep_seconds[d][i]):14.4f}  {tflops(n, sweep_seconds[d][i]):15.4f}"
                  for d in SWEEP_DTYPES)
    print(f"{n:>6}{row}")

overhead_floor = min(min(seconds) for seconds in sweep_seconds.values())
best_rate = {d: max(tflops(n, s) for n, s in zip(SWEEP_SIZES, sweep_seconds[d]))
             for d in SWEEP_DTYPES}
print(f"overhead floor (fastest call): {ms(overhead_floor):.4f} ms")
for dtype, rate in best_rate.items():
    print(f"best measured rate, {dtype_name(dtype)}: {rate:.4f} TFLOP/s")

# %%
# Time on a log-log plot with the two lines of the model: the flat overhead
# floor and the compute line 2n\ :sup:`3` / (best measured rate).

colors = {torch.bfloat16: "tab:orange", torch.float32: "tab:blue"}
fig, ax = plt.subplots(figsize=(7, 4.5))
ax.axhline(ms(overhead_floor), color="gray", linestyle="--", label="overhead floor")
for dtype in SWEEP_DTYPES:
    name = dtype_name(dtype)
    ax.plot(SWEEP_SIZES, [ms(s) for s in sweep_seconds[dtype]], "o-", color=colors[dtype],
            label=f"{name} measured")
    ax.plot(SWEEP_SIZES, [ms(2 * n ** 3 / (best_rate[dtype] * 1e12)) for n in SWEEP_SIZES],
            ":", color=colors[dtype], label=f"{name} at best measured rate")
label_sizes(ax)
ax.set_yscale("log")
ax.set_ylim(bottom=ms(overhead_floor) / 3)
ax.set_ylabel("median time per matmul (ms)")
ax.set_title(f"Matmul time against size, {DEVICE_NAME}")
legend_below(ax)
fig.tight_layout()

# %%
# The same measurements as a rate, with this machine's best measured rate as
# the ceiling.

fig, ax = plt.subplots(figsize=(7, 4.5))
for dtype in SWEEP_DTYPES:
    name = dtype_name(dtype)
    ax.plot(SWEEP_SIZES, [tflops(n, s) for n, s in zip(SWEEP_SIZES, sweep_seconds[dtype])],
            "o-", color=colors[dtype], label=f"{name} measured")
    ax.axhline(best_rate[dtype], color=colors[dtype], linestyle="--",
               label=f"{name} best measured rate")
label_sizes(ax)
ax.set_yscale("log")
ax.set_ylabel("TFLOP/s")
ax.set_title(f"Matmul rate against size, {DEVICE_NAME}")
legend_below(ax)
fig.tight_layout()

# sphinx_gallery_thumbnail_number = 3

# %%
# Reading the result
# ------------------
# The time plot has the two regions the model predicts. At small n the points
# sit on the overhead floor: the matrices are so small that the fixed cost of a
# call dominates, and the TFLOP/s plot shows a rate far below the ceiling. As n
# grows the points leave the floor and bend onto the compute line, and the rate
# climbs towards the best measured value. Where the bend happens tells you how
# much work one call must carry before the hardware, not the software around
# it, sets the speed.
#
# On a GPU the overhead floor is the launch and synchronisation latency and the
# compute-bound region begins only at large n, because thousands of cores need
# large matrices to keep them busy; bf16 on tensor cores reaches a much higher
# ceiling than float32. On a CPU the floor is lower and the compute-bound
# region begins at smaller n, but the ceiling is far lower. The lesson carries
# over to every kernel in this lecture: time warmed-up, synchronised calls,
# report medians, and make each call carry enough work. The next example,
# :ref:`sphx_glr_auto_examples_lecture06_kernels_triton_02_profiling.py`,
# looks inside a call to see which kernels ran.

del demo_matmul

# %%
# Key figures
# -----------
# The numbers this example exists to measure, collected for the course's GPU check.

KEY_FIGURES = {
    "device": DEVICE_NAME,
    "demo_matmul_median_ms": ms(right_median),
    "unsynchronised_over_synchronised_time": statistics.median(wrong_times[1:]) / right_median,
    "overhead_floor_us": 1e6 * overhead_floor,
}
for dtype, rate in best_rate.items():
    KEY_FIGURES[f"best_matmul_TFLOPps_{dtype_name(dtype)}"] = float(rate)
