"""
Collectives and what they cost
==============================

Every parallel layout of this lecture is built from five collectives:
broadcast, all-reduce, reduce-scatter, all-gather and all-to-all. We run each
across several ranks and check it against a single-process reference, then
time it against the message size, report the algorithm and bus bandwidths as
nccl-tests defines them, fit the alpha-beta model and draw it beside the
measurements. Last, we show that an all-reduce is a reduce-scatter followed by
an all-gather, in bytes and in time.

**Requirements.** On a CPU: gloo over loopback, 3 ranks for the checks and 2
for the timings (4 with 4 or more cores), one core each. On a single GPU (a T4
on Colab included): the same, gloo on CPU ranks. With 2 or more GPUs: NCCL, one
process per GPU, at larger sizes. The gloo numbers describe processes on this
machine's cores talking over loopback, not GPUs over NVLink or InfiniBand.
"""

# %%
# Starting the ranks
# ------------------
# Each example of this lecture that runs ranks forks them with the same small launcher:
# a file store for the rendezvous (no port), a timeout on the process group,
# and a rank's exception or death fails the example with its traceback.

import datetime
import os
import sys
import tempfile
import time
import traceback

import torch
import torch.distributed as dist
import torch.multiprocessing as mp


def run_ranks(worker, world_size, *args, timeout_s=60, backend="gloo"):
    """Run ``worker(rank, world_size, *args)`` in ``world_size`` forked processes.

    Returns the list of the ranks' return values. A rank that raises fails the
    call with its traceback; ranks that have not finished after ``timeout_s`` are
    killed and a TimeoutError is raised, so the example can never hang.
    ``backend`` is gloo for CPU ranks, or ``"cpu:gloo,cuda:nccl"`` for one GPU
    per rank: NCCL for CUDA tensors, gloo for CPU ones.
    """
    with tempfile.TemporaryDirectory() as tmp:
        # Fork, not spawn: a sphinx-gallery script is not an importable module.
        ranks = mp.start_processes(_rank_main, args=(world_size, tmp, worker, args, timeout_s, backend),
                                   nprocs=world_size, join=False, start_method="fork")
        deadline = time.monotonic() + timeout_s
        try:
            while not ranks.join(timeout=0.2):
                if time.monotonic() > deadline:
                    raise TimeoutError(f"{worker.__name__}: ranks still running after {timeout_s} s")
        except mp.ProcessRaisedException:
            # When one rank raises, its peers' collectives fail too; show the first error.
            first = min(name for name in os.listdir(tmp) if name.endswith(".error"))
            with open(os.path.join(tmp, first)) as error:
                raise RuntimeError(error.read()) from None
        finally:
            for process in ranks.processes:
                process.kill()
                process.join()
        # On the CPU: this process must not start CUDA, or its next fork is unsafe.
        return [torch.load(os.path.join(tmp, f"rank{r}.pt"), map_location="cpu") for r in range(world_size)]


def _rank_main(rank, world_size, tmp, worker, args, timeout_s, backend):
    torch.set_num_threads(1)  # one core per rank: the ranks share the machine
    try:
        if "nccl" in backend:
            torch.cuda.set_device(rank)  # one GPU per rank, chosen before NCCL starts
        # A file store needs no port, so nothing is left listening afterwards. The group's
        # own timeout is longer than the parent's deadline, so that the parent reports every hang.
        dist.init_process_group(backend, init_method=f"file://{tmp}/store", rank=rank, world_size=world_size,
                                timeout=datetime.timedelta(seconds=timeout_s + 30))
        torch.save(worker(rank, world_size, *args), os.path.join(tmp, f"rank{rank}.pt"))
    except BaseException:
        # Named by the time, so that the parent can tell the first failure from its echoes.
        with open(os.path.join(tmp, f"{time.time():020.6f}.rank{rank}.error"), "w") as error:
            error.write(f"rank {rank} of {world_size} failed first:\n{traceback.format_exc()}")
        raise
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


# %%
# Setup
# -----
# The ranks print nothing (a forked rank's output does not reach this page);
# they return their results, and this process checks and prints them.

import platform

import matplotlib.pyplot as plt
import numpy as np
from torch.utils._python_dispatch import TorchDispatchMode


def skip_or_fail(section, capability, reason):
    """Readers' runs skip a part whose tool is missing; the site's builds require it."""
    if capability in os.environ.get("COURSE_REQUIRE", "").split(","):
        raise RuntimeError(f"{section}: this build requires {capability}, but {reason}")
    print(f"Skipped {section}: {reason}.")


if not dist.is_available():
    CAN_RUN_RANKS, WHY_NOT = False, "torch.distributed is not available in this PyTorch build"
elif "fork" not in mp.get_all_start_methods():
    CAN_RUN_RANKS, WHY_NOT = False, f"processes cannot be forked on {sys.platform}"
else:
    CAN_RUN_RANKS, WHY_NOT = True, ""

# NCCL needs one process per GPU, and CUDA must not be initialised before the fork. Where NVML
# fails, device_count() asks the CUDA runtime, which starts the driver and so breaks the fork
# too, unseen by is_initialized(); only the private _device_count_nvml() tells (< 0: failed).
USE_NCCL = (CAN_RUN_RANKS and torch.cuda.device_count() >= 2 and not torch.cuda.is_initialized()
            and torch.cuda._device_count_nvml() >= 0 and dist.is_nccl_available())
CORES = os.cpu_count() or 1


def gpu_name(rank, world_size):
    return torch.cuda.get_device_name(0)


if USE_NCCL:
    # The sizes are powers of two, which reduce-scatter, all-gather and all-to-all cut into
    # world-size equal chunks: as many GPUs as the largest power of two among them.
    TIMING_RANKS = 2 ** (torch.cuda.device_count().bit_length() - 1)
    # get_device_name initialises CUDA, which must not happen here before the fork: a rank asks.
    BACKEND, DEVICE_NAME = "nccl", f"{TIMING_RANKS} x {run_ranks(gpu_name, 1)[0]}"
    SIZES = [2**k for k in range(12, 29, 2)]  # bytes: 4 KiB to 256 MiB
else:
    TIMING_RANKS = 4 if CORES >= 4 else 2  # one core per rank, or the timings measure contention
    BACKEND, DEVICE_NAME = "gloo", f"{platform.machine()} CPU, {CORES} cores"
    SIZES = [2**k for k in range(12, 25, 2)]  # bytes: 4 KiB to 16 MiB
    if CAN_RUN_RANKS and torch.cuda.device_count() >= 2:
        if not torch.cuda.is_initialized() and torch.cuda._device_count_nvml() < 0:
            print(f"{torch.cuda.device_count()} GPUs, but gloo on CPU ranks: NVML could not count them,"
                  f" and counting them through the CUDA runtime has started CUDA here, so forked ranks cannot use it")
        else:
            print(f"{torch.cuda.device_count()} GPUs, but gloo on CPU ranks: "
                  + ("CUDA is already initialised in this process, so forked ranks cannot use it"
                     if torch.cuda.is_initialized() else "this PyTorch build has no NCCL"))
CHECK_RANKS = 3  # an odd count: no collective may assume a power of two
CHECK_CHUNK = 1013  # elements per rank's chunk: a prime, so nothing divides evenly by luck
REPEATS = 7
COLLECTIVES = ["broadcast", "all-reduce", "reduce-scatter", "all-gather", "all-to-all"]
# Newer PyTorch names the tensor forms *_single; the older names still work in 2.11.
reduce_scatter = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor
all_gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
print(f"backend: {BACKEND}{' (loopback, CPU ranks)' if BACKEND == 'gloo' else ''}"
      f"   ranks: {CHECK_RANKS} checked, {TIMING_RANKS} timed   device: {DEVICE_NAME}")


def rank_device(rank):
    if USE_NCCL:
        torch.cuda.set_device(rank)
        return torch.device("cuda", rank)
    return torch.device("cpu")


def rank_input(rank, numel, dtype=torch.float64):
    """The tensor that rank ``rank`` starts with: random, different on every rank, reproducible."""
    generator = torch.Generator().manual_seed(1000 + rank)
    return torch.randn(numel, generator=generator, dtype=dtype)


def run_collective(name, x, world_size, group=None):
    """One collective on this rank's tensor ``x``; returns this rank's output.

    ``x`` holds ``world_size`` chunks. Broadcast sends rank 0's ``x``; all-reduce
    sums every rank's ``x``; reduce-scatter leaves chunk r of that sum on rank r;
    all-gather concatenates every rank's first chunk; all-to-all sends chunk j
    of rank r to rank j, which stores it as its chunk r.
    """
    chunk = x.numel() // world_size
    if name == "broadcast":
        out = x.clone()
        dist.broadcast(out, src=0, group=group)
    elif name == "all-reduce":
        out = x.clone()
        dist.all_reduce(out, group=group)
    elif name == "reduce-scatter":
        out = x.new_empty(chunk)
        reduce_scatter(out, x, group=group)
    elif name == "all-gather":
        out = x.new_empty(x.numel())
        all_gather(out, x[:chunk], group=group)
    else:
        out = x.new_empty(x.numel())
        dist.all_to_all_single(out, x, group=group)
    return out


# %%
# The five collectives, checked
# -----------------------------
# Each rank starts with its own random ``float64`` tensor of three chunks of
# 1013 elements. The reference computes every collective's result in this one
# process from all ranks' inputs; each rank's output must match it. Broadcast,
# all-gather and all-to-all only move data, so they must match exactly; the
# sums of all-reduce and reduce-scatter may add in another order, so they
# match to a tolerance of ``float64`` rounding scaled to the values.


def collectives_worker(rank, world_size, chunk):
    x = rank_input(rank, world_size * chunk)
    return {name: run_collective(name, x, world_size) for name in COLLECTIVES}


def reference_outputs(world_size, chunk):
    """What every collective must leave on each rank, computed in one process."""
    inputs = [rank_input(r, world_size * chunk) for r in range(world_size)]
    total = torch.stack(inputs).sum(dim=0)
    chunks = [x.split(chunk) for x in inputs]
    return [{
        "broadcast": inputs[0],
        "all-reduce": total,
        "reduce-scatter": total.split(chunk)[rank],
        "all-gather": torch.cat([c[0] for c in chunks]),
        "all-to-all": torch.cat([c[rank] for c in chunks]),
    } for rank in range(world_size)]


def sum_rounding(world_size, chunk):
    """How far two float64 sums of the ranks' inputs, added in different orders, can be apart.

    Each of the n - 1 additions rounds once, by at most 2**-53 of the partial sum,
    so each order is within (n - 1) 2**-53 sum_i |x_i| of the exact sum, on gloo
    or NCCL alike, whatever their algorithm: two orders, twice that.
    """
    magnitude = torch.stack([rank_input(r, world_size * chunk) for r in range(world_size)]).abs().sum(0)
    return 2 * (world_size - 1) * 2**-53 * magnitude.max().item()


def check_collectives():
    outputs = run_ranks(collectives_worker, CHECK_RANKS, CHECK_CHUNK)
    expected = reference_outputs(CHECK_RANKS, CHECK_CHUNK)
    tolerance = sum_rounding(CHECK_RANKS, CHECK_CHUNK)
    for rank, (got, want) in enumerate(zip(outputs, expected)):
        for name in COLLECTIVES:
            if name in ("all-reduce", "reduce-scatter"):
                # The same sums in another order: apart by at most the two orders' roundings.
                torch.testing.assert_close(got[name], want[name], rtol=0, atol=tolerance,
                                           msg=lambda m, n=name, r=rank: f"{n} on rank {r}: {m}")
            elif not torch.equal(got[name], want[name]):
                raise AssertionError(f"{name} on rank {rank} differs from the reference")
    print(f"All 5 collectives match the single-process reference on each of {CHECK_RANKS} ranks"
          f" ({CHECK_RANKS} x {CHECK_CHUNK} float64 elements per rank).")


if CAN_RUN_RANKS:
    check_collectives()
else:
    skip_or_fail("the collectives", "distributed", WHY_NOT)

# %%
# Predict: the alpha-beta model and the bus bandwidth
# ---------------------------------------------------
# A message of S bytes costs a fixed latency alpha (software, synchronisation,
# the first byte's trip) plus S divided by the bandwidth. A collective over n
# ranks moves at least factor x S bytes through each rank's link, with a factor
# that depends on the collective and not on the algorithm (as long as it is
# built from point-to-point sends), as nccl-tests explains
# (`PERFORMANCE.md <https://github.com/NVIDIA/nccl-tests/blob/master/doc/PERFORMANCE.md>`__).
# In a ring all-reduce, each rank sends (n-1)/n of the buffer while the partial
# sums go round, then (n-1)/n again while the finished chunks go round:
# 2(n-1)/n S in all. Reduce-scatter and all-gather are one half each,
# (n-1)/n S; all-to-all keeps one of its n chunks and sends the rest,
# (n-1)/n S; a broadcast's root must send all of S.
#
# nccl-tests reports two bandwidths: the *algorithm bandwidth*
# algbw = S / t, where S is the size of the whole buffer (for reduce-scatter
# the input, for all-gather the output), and the *bus bandwidth*
# busbw = algbw x factor, the rate at which each rank's link actually carried
# data. Busbw is comparable across collectives and rank counts, and with the
# link's speed. Our model is therefore
#
# .. math:: t(S) = \alpha + \frac{\text{factor} \cdot S}{\beta},
#
# with beta the bus bandwidth a large message reaches.


def bus_factor(name, n):
    """nccl-tests' correction from algorithm to bus bandwidth for ``n`` ranks."""
    return {"broadcast": 1.0, "all-reduce": 2 * (n - 1) / n}.get(name, (n - 1) / n)


print(f"bus-bandwidth factors for n = {TIMING_RANKS}:")
for name in COLLECTIVES:
    print(f"  {name:15s} {bus_factor(name, TIMING_RANKS):.3f}")

# %%
# Measure: time against message size
# -----------------------------------
# Every rank runs each collective once to warm up (the first call sets up
# connections and buffers), then times it ``REPEATS`` times, taking the five
# collectives in turn so that a burst of load from elsewhere on the machine
# hits them alike. A barrier before
# each timed call starts the ranks together, so a rank's clock does not count
# time spent waiting for a late peer; the time of a call is the slowest
# rank's, and we report the fastest of the repeats: load from other processes
# only ever adds time. This is hand timing, as
# lecture 6 teaches it: ``torch.utils.benchmark`` times one process, and a
# collective is only done when every rank is.


def synchronize():
    if USE_NCCL:
        torch.cuda.synchronize()


def time_collectives_worker(rank, world_size, sizes, repeats):
    device = rank_device(rank)
    group = dist.new_group(backend="nccl") if USE_NCCL else None
    times = {}
    for size in sizes:
        x = torch.randn(size // 4, device=device)  # float32: 4 bytes per element
        for name in COLLECTIVES:
            run_collective(name, x, world_size, group)
        synchronize()
        for _ in range(repeats):  # interleaved, so a burst of load hits every collective alike
            for name in COLLECTIVES:
                dist.barrier()
                start = time.perf_counter()
                run_collective(name, x, world_size, group)
                synchronize()
                times.setdefault((name, size), []).append(time.perf_counter() - start)
    return times


def fastest_times(per_rank):
    """The fastest repeat of the slowest rank's time of each call, keyed (name, size)."""
    return {key: min(max(ts) for ts in zip(*(r[key] for r in per_rank)))
            for key in per_rank[0] if isinstance(key, tuple)}


def fit_alpha_beta(sizes, seconds, factor):
    """Least squares on relative error: t = alpha + factor * S / beta; returns (alpha s, beta B/s).

    Weighting each point by 1/t makes the small messages, which set alpha, count
    as much as the large ones, which set beta.
    """
    t = np.asarray(seconds)
    design = np.column_stack([np.ones_like(t), factor * np.asarray(sizes, dtype=float)]) / t[:, None]
    (alpha, inverse_beta), *_ = np.linalg.lstsq(design, np.ones_like(t), rcond=None)
    return alpha, 1 / inverse_beta


def label_sizes(ax):
    ax.set_xscale("log", base=2)
    ticks = SIZES[::2] if len(SIZES) > 6 else SIZES
    ax.set_xticks(ticks, labels=[f"{s // 1024} KiB" if s < 2**20 else f"{s // 2**20} MiB" for s in ticks])
    ax.minorticks_off()
    ax.set_xlabel("message size S (whole buffer)")


if CAN_RUN_RANKS:
    started = time.perf_counter()
    TIMES = fastest_times(run_ranks(time_collectives_worker, TIMING_RANKS, SIZES, REPEATS))
    print(f"{len(COLLECTIVES)} collectives x {len(SIZES)} sizes x {REPEATS} repeats"
          f" on {TIMING_RANKS} ranks in {time.perf_counter() - started:.1f} s")
    FITS = {}
    for name in COLLECTIVES:
        alpha, beta = fit_alpha_beta(SIZES, [TIMES[name, s] for s in SIZES], bus_factor(name, TIMING_RANKS))
        if not (alpha > 0 and beta > 0):
            raise AssertionError(f"{name}: the fit gives alpha = {alpha:.3g} s, beta = {beta:.3g} B/s")
        FITS[name] = alpha, beta
    print(f"\nfitted model t = alpha + factor * S / beta ({BACKEND}, {TIMING_RANKS} ranks, {DEVICE_NAME}):")
    print(f"  {'collective':15s} {'alpha (us)':>11s} {'beta (GB/s)':>12s}")
    for name, (alpha, beta) in FITS.items():
        print(f"  {name:15s} {1e6 * alpha:11.1f} {beta / 1e9:12.3f}")
    ALPHA_US, BETA_GBPS = 1e6 * FITS["all-reduce"][0], FITS["all-reduce"][1] / 1e9
    print(f"all-reduce: alpha = {ALPHA_US:.1f} us, beta = {BETA_GBPS:.3f} GB/s (bus bandwidth)")

    fig, ax = plt.subplots(figsize=(7.5, 4.8))
    curve = np.geomspace(SIZES[0], SIZES[-1], 100)
    for name, colour in zip(COLLECTIVES, plt.rcParams["axes.prop_cycle"].by_key()["color"]):
        alpha, beta = FITS[name]
        ax.plot(SIZES, [1e3 * TIMES[name, s] for s in SIZES], "o", color=colour, label=f"{name}, measured")
        ax.plot(curve, 1e3 * (alpha + bus_factor(name, TIMING_RANKS) * curve / beta), "-", color=colour,
                alpha=0.6, label=f"{name}, alpha-beta fit")
    label_sizes(ax)
    ax.set_yscale("log")
    ax.set_ylabel("time per call (ms, fastest repeat)")
    ax.set_title(f"Collectives on {TIMING_RANKS} ranks: {BACKEND}, {DEVICE_NAME}", fontsize="medium")
    ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.18), ncol=3, frameon=False, fontsize="x-small")
    fig.tight_layout()

# %%
# Algorithm and bus bandwidth
# ---------------------------
# Dividing the size by the time gives algbw; the factors above turn it into
# busbw. The dashed line is the all-reduce fit's beta: a message must be
# large before alpha stops mattering and a collective approaches it.

if CAN_RUN_RANKS:
    fig, (ax_alg, ax_bus) = plt.subplots(1, 2, figsize=(9, 4), sharey=True)
    for name in COLLECTIVES:
        algbw = [s / TIMES[name, s] / 1e9 for s in SIZES]
        ax_alg.plot(SIZES, algbw, "o-", label=name)
        ax_bus.plot(SIZES, [b * bus_factor(name, TIMING_RANKS) for b in algbw], "o-", label=name)
    ax_bus.axhline(BETA_GBPS, color="grey", linestyle="--", label="all-reduce fit's beta")
    for ax, title in ((ax_alg, "algorithm bandwidth S / t"), (ax_bus, "bus bandwidth algbw x factor")):
        label_sizes(ax)
        ax.set_title(title, fontsize="medium")
    ax_alg.set_ylabel("GB/s")
    ax_bus.legend(fontsize="x-small")
    fig.suptitle(f"{BACKEND}, {TIMING_RANKS} ranks, {DEVICE_NAME}", fontsize="medium")
    fig.tight_layout()

    print(f"\n{'S':>8s} " + " ".join(f"{n:>15s}" for n in COLLECTIVES) + "   (busbw, GB/s)")
    for s in SIZES:
        print(f"{s // 1024:>5d} KiB " + " ".join(
            f"{s / TIMES[n, s] * bus_factor(n, TIMING_RANKS) / 1e9:15.3f}" for n in COLLECTIVES))

# %%
# All-reduce is reduce-scatter, then all-gather
# ---------------------------------------------
# A ring all-reduce is two passes round the ring. In the first, each rank sends
# one chunk to its right neighbour and adds the chunk that arrives from its
# left into its own copy; after n-1 steps rank r holds chunk r of the sum: a
# reduce-scatter. In the second, the finished chunks go round the same way,
# copied instead of added: an all-gather. We write both with point-to-point
# sends, count the bytes each rank sends, and check that the composition gives
# the all-reduce's result and moves exactly its 2(n-1)/n S bytes, half in each
# pass. The same identity is why ZeRO stages 1 and 2 (example 03) can replace
# data parallel's all-reduce by a reduce-scatter of the gradients and an
# all-gather of the weights at no extra communication.


def ring_pass(chunks, rank, world_size, combine):
    """One pass round the ring, in place on ``chunks``."""
    right, left = (rank + 1) % world_size, (rank - 1) % world_size
    # In the reduce pass rank r sends chunk r-1-s at step s; in the gather pass, chunk r-s.
    offset = 1 if combine == "add" else 0
    for step in range(world_size - 1):
        send_index = (rank - step - offset) % world_size
        receive_index = (rank - step - offset - 1) % world_size
        incoming = torch.empty_like(chunks[receive_index])
        request = dist.isend(chunks[send_index], dst=right)
        dist.recv(incoming, src=left)
        request.wait()
        if combine == "add":
            chunks[receive_index] += incoming
        else:
            chunks[receive_index].copy_(incoming)


def ring_reduce_scatter(x, rank, world_size):
    chunks = list(x.clone().chunk(world_size))
    ring_pass(chunks, rank, world_size, "add")
    return chunks[rank]


def ring_all_gather(shard, rank, world_size):
    chunks = [torch.empty_like(shard) for _ in range(world_size)]
    chunks[rank].copy_(shard)
    ring_pass(chunks, rank, world_size, "copy")
    return torch.cat(chunks)


class SentBytes(TorchDispatchMode):
    """Counts the bytes of the sends that reach PyTorch's dispatcher, outside the code it counts."""

    def __init__(self):
        super().__init__()
        self.bytes = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func is torch.ops.c10d.send.default:  # send(tensors, group, destination, tag)
            self.bytes += sum(t.numel() * t.element_size() for t in args[0])
        return func(*args, **(kwargs or {}))


def ring_check_worker(rank, world_size, chunk):
    x = rank_input(rank, world_size * chunk)
    with SentBytes() as reduce_pass:
        shard = ring_reduce_scatter(x, rank, world_size)
    with SentBytes() as gather_pass:
        result = ring_all_gather(shard, rank, world_size)
    return {"result": result, "bytes": (reduce_pass.bytes, gather_pass.bytes)}


if CAN_RUN_RANKS:
    outputs = run_ranks(ring_check_worker, CHECK_RANKS, CHECK_CHUNK)
    total = torch.stack([rank_input(r, CHECK_RANKS * CHECK_CHUNK) for r in range(CHECK_RANKS)]).sum(0)
    buffer_bytes = total.numel() * total.element_size()
    per_pass = (CHECK_RANKS - 1) * buffer_bytes // CHECK_RANKS
    for rank, out in enumerate(outputs):
        # The ring adds in its own order, the reference in stack's: apart by at most both orders' roundings.
        torch.testing.assert_close(out["result"], total, rtol=0, atol=sum_rounding(CHECK_RANKS, CHECK_CHUNK))
        if out["bytes"] != (per_pass, per_pass):
            raise AssertionError(f"rank {rank} sent {out['bytes']} bytes, expected {per_pass} in each pass")
    print(f"ring reduce-scatter, then ring all-gather = all-reduce, on each of {CHECK_RANKS} ranks.")
    print(f"bytes sent by each rank: {per_pass} + {per_pass} = {2 * per_pass}"
          f" = 2(n-1)/n x S for n = {CHECK_RANKS}, S = {buffer_bytes}: all-reduce's factor, half in each pass")

# %%
# And in time: each pass of the ring on its own, the two together, and gloo's
# own all-reduce and reduce-scatter beside them, at the three largest sizes.
# The profiler then lists the gloo operations that gloo's reduce-scatter runs.

RING_STEPS = {
    "RS ring": lambda v, r, n: ring_reduce_scatter(v, r, n),
    "AG ring": lambda v, r, n: ring_all_gather(v[: v.numel() // n], r, n),
    "AR ring": lambda v, r, n: ring_all_gather(ring_reduce_scatter(v, r, n), r, n),
    "AR gloo": lambda v, r, n: dist.all_reduce(v.clone()),
    "RS gloo": lambda v, r, n: reduce_scatter(v.new_empty(v.numel() // n), v),
}


def on_core_fraction(seconds=0.05):
    """Fraction of ``seconds`` of matmuls that this process actually ran on a core."""
    a = torch.randn(128, 128)
    start, start_on_core = time.perf_counter(), time.thread_time()
    while time.perf_counter() - start < seconds:
        a @ a
    return (time.thread_time() - start_on_core) / (time.perf_counter() - start)


def ring_timing_worker(rank, world_size, sizes, repeats):
    out = {"on core": on_core_fraction()}
    for size in sizes:
        v = torch.randn(size // 4)
        for step in RING_STEPS.values():
            step(v, rank, world_size)
        for _ in range(repeats):  # interleaved, so a burst of load hits every variant alike
            for name, step in RING_STEPS.items():
                dist.barrier()
                start = time.perf_counter()
                step(v, rank, world_size)
                out.setdefault((name, size), []).append(time.perf_counter() - start)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as profile:
        RING_STEPS["RS gloo"](torch.randn(1024 * world_size), rank, world_size)
    out["gloo ops in RS"] = sorted({e.name for e in profile.events() if e.name.startswith("gloo:")})
    out["on core"] = min(out["on core"], on_core_fraction())
    return out


if CAN_RUN_RANKS:
    ring_sizes = [2**20, 2**22, 2**24]
    ring_ranks = 4 if CORES >= 4 else 2  # the hand-written ring runs on CPU ranks, over gloo
    outputs = run_ranks(ring_timing_worker, ring_ranks, ring_sizes, REPEATS)
    ring_times = fastest_times(outputs)
    print(f"{ring_ranks} CPU ranks, gloo; RS = reduce-scatter, AG = all-gather, AR = all-reduce;"
          f" ms, fastest of {REPEATS}")
    print(f"{'S':>8s} " + " ".join(f"{name:>8s}" for name in RING_STEPS) + f" {'RS+AG ring':>11s}")
    for s in ring_sizes:
        row = [1e3 * ring_times[name, s] for name in RING_STEPS]
        print(f"{s // 2**20:>4d} MiB " + " ".join(f"{t:8.2f}" for t in row) + f" {row[0] + row[1]:11.2f}")
    # Timings on a shared CPU are noisy: compare the fastest runs' totals over the
    # sizes, within a wide margin, and only while every rank had a core.
    fastest = {key: min(t for out in outputs for t in out[key]) for key in ring_times}
    composed = sum(fastest["AR ring", s] for s in ring_sizes)
    passes = sum(fastest["RS ring", s] + fastest["AG ring", s] for s in ring_sizes)
    on_core = min(out["on core"] for out in outputs)
    print(f"ring: AR / (RS + AG), fastest runs summed over the sizes: {composed / passes:.2f}"
          f" (ranks on a core: at least {on_core:.0%})")
    if on_core < 0.9:
        print("Other processes took this machine's cores: the ring's times are printed, not compared.")
    elif not 1 / 3 < composed / passes < 3:
        raise AssertionError(f"the ring all-reduce took {composed:.4f} s, its two passes {passes:.4f} s")
    gloo_ratio = (sum(ring_times["RS gloo", s] for s in ring_sizes)
                  / sum(ring_times["AR gloo", s] for s in ring_sizes))
    print(f"gloo: RS / AR, summed over the sizes: {gloo_ratio:.2f}")
    print(f"gloo operations inside gloo's reduce-scatter: {', '.join(outputs[0]['gloo ops in RS'])}")

# sphinx_gallery_thumbnail_number = 1

# %%
# Reading the result
# ------------------
# The time plot has the two regimes of the model. Small messages sit on a
# floor of about alpha, whatever their size: each call pays for a barrier-like
# exchange, a handful of system calls and thread wake-ups in gloo. Large
# messages climb along a line of slope one, where the time is the bytes over
# the bandwidth. The printed table gives both numbers for each collective;
# exercise 2 of the lecture multiplies the all-reduce's to find the message
# size at which latency and bandwidth cost the same.
#
# Bus bandwidth makes the collectives comparable: at large sizes they should
# approach the same link speed, and those that do not reveal what the library
# actually does. The table of the last section shows one such case on gloo:
# where the profiler finds ``gloo:all_reduce`` inside gloo's reduce-scatter,
# it reduces the whole buffer and keeps one chunk. It then costs about an
# all-reduce (the printed ratio RS / AR for gloo),
# and its bus bandwidth, computed with the factor (n-1)/n that assumes a real
# reduce-scatter, comes out low. The hand-written ring does what the factor
# assumes: its all-reduce costs about the sum of its two passes.
#
# On GPUs the picture has the same shape at a different scale: alpha is much
# smaller, and beta is NVLink's bandwidth per GPU inside a node; across
# nodes it is set by the network adapters of the group's GPUs in each node:
# one adapter's 50 GB/s for a group with one GPU per node, all eight
# together, the node's 400 GB/s egress, for a group that holds whole nodes.
# The lecture quotes these figures with their sources. NCCL implements
# every collective natively, so its reduce-scatter and all-gather each cost
# about half an all-reduce. Nothing measured on this page describes such links:
# these are processes on one machine's cores, talking through the kernel's
# loopback device.

# %%
# Key figures
# -----------
# The numbers this example exists to measure, collected for the course's GPU check.

if CAN_RUN_RANKS:
    KEY_FIGURES = {
        "device": DEVICE_NAME,
        "backend": BACKEND,
        "ranks": TIMING_RANKS,
        "allreduce_alpha_us": ALPHA_US,
        "allreduce_beta_GBps": BETA_GBPS,
    }
    for name in COLLECTIVES:
        KEY_FIGURES[f"{name.replace('-', '')}_busbw_GBps_at_{SIZES[-1] // 2**20}MiB"] = (
            SIZES[-1] / TIMES[name, SIZES[-1]] * bus_factor(name, TIMING_RANKS) / 1e9)
