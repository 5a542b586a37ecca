"""
Data parallel, from scratch and with DistributedDataParallel
============================================================

Data parallel gives every rank a full copy of the model and a slice of the
batch; after the backward pass the ranks average their gradients with one
all-reduce, so every copy takes the same step. We write it by hand and prove
that the weights equal those of one process trained on the whole batch, then
look at what ``DistributedDataParallel`` adds: gradient buckets, and
all-reduces that run while the backward pass is still computing.

**Requirements.** Any machine with ``torch.distributed`` and ``fork`` (Linux,
macOS). On a CPU or a single GPU (a T4 on Colab included): 2 CPU ranks over
gloo on loopback, and the timeline shows CPU ranks on this machine's cores.
With 2 or more GPUs: NCCL, one process per GPU, at larger sizes (a wider and
deeper model for DDP), and the timeline shows GPU kernels, the all-reduces on
their own CUDA stream. The first line of the output names the run that produced
this page's figures.
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
# The ranks return their weights and measurements; this process compares and
# prints them (a forked rank's output does not reach this page).

import math
import platform

import matplotlib.pyplot as plt
import torch.nn.functional as F
from torch import nn
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
from torch.func import functional_call
from torch.nn.parallel import DistributedDataParallel


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
BACKEND = "cpu:gloo,cuda:nccl" if USE_NCCL else "gloo"


def gpu_name(rank, world_size):
    return torch.cuda.get_device_name(rank)


def rank_device(rank):
    return torch.device("cuda", rank) if USE_NCCL else torch.device("cpu")


def synchronize(device):
    """Wait for the kernels queued on a GPU; a CPU rank has none."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


if USE_NCCL:
    WORLD_SIZE, BACKEND_NAME = torch.cuda.device_count(), "nccl"
    # get_device_name initialises CUDA, which must not happen here before the fork: a rank asks.
    DEVICE_NAME = f"{WORLD_SIZE} x {run_ranks(gpu_name, 1, backend=BACKEND)[0]}"
else:
    WORLD_SIZE, BACKEND_NAME = 2, "gloo"
    DEVICE_NAME = f"{platform.machine()} CPU, {os.cpu_count()} cores"
    if CAN_RUN_RANKS and torch.cuda.device_count() >= 2:
        if not torch.cuda.is_initialized() and torch.cuda._device_count_nvml() < 0:
            print(f"{torch.cuda.device_count()} GPUs, but gloo on CPU ranks: NVML could not count them,"
                  f" and counting them through the CUDA runtime has started CUDA here, so forked ranks cannot use it")
        else:
            print(f"{torch.cuda.device_count()} GPUs, but gloo on CPU ranks: "
                  + ("CUDA is already initialised in this process, so forked ranks cannot use it"
                     if torch.cuda.is_initialized() else "this PyTorch build has no NCCL"))
# Part 1: a small MLP with awkward widths, a few SGD steps.
IN_FEATURES, HIDDEN, OUT_FEATURES = 13, 37, 7
ROWS_PER_RANK = 23
GLOBAL_BATCH = ROWS_PER_RANK * WORLD_SIZE  # 46 on 2 ranks
STEPS = 6
LEARNING_RATE = 0.2
# Part 2: layers large enough that backward takes a while; on GPUs, wider and more of them.
DDP_WIDTH, DDP_LAYERS, DDP_ROWS_PER_RANK = (2048, 8, 512) if USE_NCCL else (512, 6, 256)
DDP_BATCH = DDP_ROWS_PER_RANK * WORLD_SIZE
BUCKET_CAP_MB = 1  # the default is 25; smaller, so that this model needs several buckets
DDP_STEPS = 3
if USE_NCCL:
    print(f"backend: nccl (one process per GPU)   world size: {WORLD_SIZE}   device: {DEVICE_NAME}")
else:
    print(f"backend: gloo (loopback, CPU ranks)   world size: {WORLD_SIZE}   device: {DEVICE_NAME}")


def small_mlp(dtype):
    torch.manual_seed(0)  # every rank, and the reference, start from the same weights
    return nn.Sequential(nn.Linear(IN_FEATURES, HIDDEN, dtype=dtype), nn.GELU(),
                         nn.Linear(HIDDEN, OUT_FEATURES, dtype=dtype))


def global_batch(step, dtype):
    """The whole batch of one step; every rank draws it and keeps its own slice."""
    generator = torch.Generator().manual_seed(100 + step)
    inputs = torch.randn(GLOBAL_BATCH, IN_FEATURES, generator=generator, dtype=dtype)
    targets = torch.randn(GLOBAL_BATCH, OUT_FEATURES, generator=generator, dtype=dtype)
    return inputs, targets


def sgd_step(model, learning_rate):
    with torch.no_grad():
        for param in model.parameters():
            param -= learning_rate * param.grad


def flat_weights(model):
    return torch.cat([p.detach().reshape(-1) for p in model.parameters()])


# %%
# Data parallel by hand
# ---------------------
# The loss is the mean over the batch, so its gradient is the mean of the
# per-row gradients. Split the batch into equal slices, one per rank: each
# rank's gradient of its own mean loss is the mean over its slice, and the
# mean of those over the ranks is the gradient of the whole batch. One
# all-reduce (a sum) and a division by the world size compute it. Every rank
# then holds the same gradient, takes the same step, and keeps the same weights
# as one process that saw the whole batch.
#
# The worker also trains a copy that skips the all-reduce, as a bug would:
# each rank then follows the gradient of its own half of the data.


def data_parallel_step(model, inputs, targets, world_size, synchronise):
    loss = F.mse_loss(model(inputs), targets)  # the mean over this rank's slice
    model.zero_grad()
    loss.backward()
    if synchronise:
        for param in model.parameters():
            dist.all_reduce(param.grad)  # the sum of the ranks' gradients ...
            param.grad /= world_size  # ... and their mean: the whole batch's gradient
    sgd_step(model, LEARNING_RATE)


def data_parallel_worker(rank, world_size, dtype, synchronise):
    torch.backends.cuda.matmul.allow_tf32 = False  # float32 products on a GPU, as the bound counts them
    device = rank_device(rank)
    model = small_mlp(dtype).to(device)
    rows = GLOBAL_BATCH // world_size
    history = []
    for step in range(STEPS):
        inputs, targets = global_batch(step, dtype)
        mine = slice(rank * rows, (rank + 1) * rows)
        data_parallel_step(model, inputs[mine].to(device), targets[mine].to(device), world_size, synchronise)
        history.append(flat_weights(model).cpu())
    return history


def single_process_history(dtype):
    """The reference: one process, the whole batch at every step."""
    model = small_mlp(dtype)
    history = []
    for step in range(STEPS):
        inputs, targets = global_batch(step, dtype)
        loss = F.mse_loss(model(inputs), targets)
        model.zero_grad()
        loss.backward()
        sgd_step(model, LEARNING_RATE)
        history.append(flat_weights(model))
    return history


def relative_difference(a, b):
    return ((a - b).abs().max() / b.abs().max()).item()


# %%
# Same weights, in float64 and float32
# ------------------------------------
# The sums are not done in the same order: the single process adds all the rows
# (46 on two ranks) in one matrix product, data parallel adds 23 on each rank
# and then the ranks' partial sums. Floating-point addition is not associative,
# so the weights may differ in the last bits. They are checked against a bound
# on that rounding, in each format's rounding steps (:math:`2^{-53}` in
# ``float64``, :math:`2^{-24}` in ``float32``): each step's gradient is within a
# running error bound of the exact one on either side (a sum of n terms is off
# by at most n rounding steps of the sum of its terms' absolute values, plus
# the errors its inputs carry); the step adds the learning rate :math:`\eta`
# times the difference to the weights, and each later step carries it on,
# multiplied by at most the largest row sum of :math:`|I - \eta H|`, where
# :math:`H` is the Hessian of the loss, which one process computes for this
# small model. A missing all-reduce, a missing division by the world size or a
# wrong slice each change the weights by orders of magnitude more: the copy
# without the all-reduce is asserted to lie beyond the bound at every step.


def gelu_slope(z):
    """GeLU's derivative, Phi(z) + z phi(z): at most 1.13 in size, its own derivative at most 0.8."""
    return 0.5 * (1 + torch.erf(z / math.sqrt(2))) + z * torch.exp(-z.square() / 2) / math.sqrt(2 * math.pi)


@torch.no_grad()
def gradient_error_bounds(model, inputs, targets):
    """Each gradient of the mean squared error is within one rounding step times this bound of the exact one.

    Running error analysis, to first order: a sum of n products a_k w_k whose
    factors are off by e(a_k) and e(w_k) is off by at most
    sum(|w_k| e(a_k) + |a_k| e(w_k)) + n sum |a_k w_k| steps, in any order of
    the sum; GeLU and its slope add 8 rounding steps each.
    """
    values, errors = [inputs], [torch.zeros_like(inputs)]  # each layer's input, and its bound
    for layer in model:
        a, e = values[-1], errors[-1]
        if isinstance(layer, nn.Linear):
            terms = a.abs() @ layer.weight.abs().T + layer.bias.abs()
            errors.append(e @ layer.weight.abs().T + (layer.in_features + 1) * terms)
        else:
            errors.append(1.13 * e + 8 * a.abs())
        values.append(layer(a))
    rows, difference = inputs.shape[0], values[-1] - targets
    grad = 2 * difference / targets.numel()  # the loss's gradient by the output, and its bound
    grad_error = 2 * (errors[-1] + 4 * difference.abs()) / targets.numel()
    bounds = {}
    for index in reversed(range(len(model))):
        layer, a, e = model[index], values[index], errors[index]
        if isinstance(layer, nn.Linear):
            # Sums over the batch, whether in one process or by rank and then across ranks,
            # with the mean's scalings and the division by the number of ranks.
            bounds[f"{index}.weight"] = (grad_error.T @ a.abs() + grad.abs().T @ e
                                         + (rows + 4) * grad.abs().T @ a.abs())
            bounds[f"{index}.bias"] = grad_error.sum(0) + (rows + 4) * grad.abs().sum(0)
            weight = layer.weight.abs()
            grad_error = grad_error @ weight + layer.out_features * grad.abs() @ weight
            grad = grad @ layer.weight
        else:
            slope = gelu_slope(a)
            grad_error = grad_error * slope.abs() + grad.abs() * (0.8 * e + 8) + (grad * slope).abs()
            grad = grad * slope
    return bounds


def weight_error_bounds(dtype):
    """After each SGD step, the most by which data parallel's weights and one process's may differ.

    In rounding steps of ``dtype``, to first order: the two gradients differ by at
    most twice their bound E, each side rounds lr * g and the new weight once, and
    the step carries the earlier difference on through I - lr H.
    """
    model = small_mlp(dtype).double()  # the bound's arithmetic in float64, on dtype's weights
    shapes = {name: p.shape for name, p in model.named_parameters()}

    def loss_of(flat, inputs, targets):
        pieces = torch.split(flat, [shape.numel() for shape in shapes.values()])
        params = {name: piece.view(shape) for (name, shape), piece in zip(shapes.items(), pieces)}
        return F.mse_loss(functional_call(model, params, (inputs,)), targets)

    before, bound, bounds = flat_weights(model), 0.0, []
    for step, after in enumerate(single_process_history(dtype)):
        inputs, targets = (t.double() for t in global_batch(step, dtype))
        hessian = torch.autograd.functional.hessian(lambda flat, x=inputs, t=targets: loss_of(flat, x, t),
                                                    before, vectorize=True)
        growth = (torch.eye(before.numel(), dtype=torch.float64) - LEARNING_RATE * hessian).abs().sum(1).max()
        torch.nn.utils.vector_to_parameters(before, model.parameters())
        gradient_bound = max(b.max() for b in gradient_error_bounds(model, inputs, targets).values())
        bound = growth.item() * bound + 4 * LEARNING_RATE * gradient_bound.item() + 2 * after.abs().max().item()
        bounds.append(bound)
        before = after.double()
    return bounds


def check_data_parallel():
    differences, tolerances, relative_bounds = {}, {}, {}
    for dtype in (torch.float64, torch.float32):
        reference = single_process_history(dtype)
        # The bound, in dtype's rounding steps: the same for float32 on a GPU (TF32 off) as on a CPU.
        tolerances[dtype] = [torch.finfo(dtype).eps / 2 * bound for bound in weight_error_bounds(dtype)]
        for synchronise in (True, False):
            ranks = run_ranks(data_parallel_worker, WORLD_SIZE, dtype, synchronise, backend=BACKEND)
            differences[dtype, synchronise] = [relative_difference(w, ref) for w, ref in zip(ranks[0], reference)]
            if not synchronise:
                drift = [(w - ref).abs().max().item() for w, ref in zip(ranks[0], reference)]
                if not all(d > tolerance for d, tolerance in zip(drift, tolerances[dtype])):
                    raise AssertionError(f"{dtype}: without the all-reduce the weights stay within the bound")
                continue
            for rank, history in enumerate(ranks):
                for step, (weights, expected) in enumerate(zip(history, reference)):
                    # |w_DP - w_single| <= the first-order bound of the rounding of STEPS SGD steps.
                    torch.testing.assert_close(weights, expected, rtol=0, atol=tolerances[dtype][step],
                                               msg=lambda m, r=rank, d=dtype, k=step: f"{d}, rank {r}, step {k}: {m}")
            relative_bounds[dtype] = [bound / w.abs().max().item() for bound, w in zip(tolerances[dtype], reference)]
            print(f"{str(dtype).removeprefix('torch.'):8s} data parallel = single process after {STEPS} steps:"
                  f" largest difference {differences[dtype, True][-1]:.1e} of the largest weight"
                  f" (bound {relative_bounds[dtype][-1]:.1e})")
        print(f"{'':8s} without the all-reduce, rank 0's weights differ by"
              f" {differences[dtype, False][-1]:.1e} of the largest weight")
    return differences, relative_bounds


if CAN_RUN_RANKS:
    DIFFERENCES, BOUNDS = check_data_parallel()

    fig, ax = plt.subplots(figsize=(6.5, 4))
    steps = range(1, STEPS + 1)
    for (dtype, synchronise), values in DIFFERENCES.items():
        name = str(dtype).removeprefix("torch.")
        label = f"{name}, all-reduce" if synchronise else f"{name}, no all-reduce (a bug)"
        ax.plot(steps, [max(v, 1e-18) for v in values], "o-" if synchronise else "x--", label=label)
    for dtype, relative in BOUNDS.items():
        ax.plot(steps, relative, color="grey", linewidth=0.8, linestyle=":")
        ax.annotate(f"{str(dtype).removeprefix('torch.')} bound", (STEPS, relative[-1]), fontsize="x-small",
                    ha="right", va="bottom", color="grey")
    ax.set_yscale("log")
    ax.set_xlabel("SGD step")
    ax.set_ylabel("max |w_DP - w_single| / max |w_single|")
    ax.set_title(f"Data parallel against one process, {WORLD_SIZE} ranks, {BACKEND_NAME}, {DEVICE_NAME}",
                 fontsize="medium")
    ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.18), ncol=2, frameon=False, fontsize="small")
    fig.tight_layout()
else:
    skip_or_fail("data parallel by hand", "distributed", WHY_NOT)

# %%
# DistributedDataParallel: gradient buckets
# -----------------------------------------
# All-reducing every parameter separately pays the collective's fixed cost
# once per tensor; all-reducing them all at the end waits for the whole
# backward pass. ``DistributedDataParallel`` (DDP) groups the gradients into
# *buckets* of about ``bucket_cap_mb`` MiB (25 by default), in reverse order of
# the parameters, which is roughly the order in which backward produces them,
# and starts a bucket's all-reduce as soon as its last gradient is ready.
#
# DDP fills a bucket until it holds at least ``bucket_cap_mb`` MiB, then starts
# the next (with the default cap, the first bucket is held to 1 MiB). It does so
# from the second step on: the first step all-reduces every gradient as one
# bucket and records the order in which they became ready, and DDP then builds
# its buckets in that order. Our model is six 512 x 512 layers, 1 MiB of weights
# and 2 KiB of bias each (on GPUs, eight 2048 x 2048 layers of 16 MiB); with a
# 1 MiB cap, we predict one bucket per layer in the last step. A
# communication hook sees every bucket as DDP hands it over; ours records which
# parameters it holds and this rank's own gradients, then calls DDP's default
# all-reduce. After each backward pass every rank checks that DDP left in each
# gradient the mean of the ranks' own, to float32 rounding.


def ddp_model():
    torch.manual_seed(0)
    layers = []
    for _ in range(DDP_LAYERS):
        layers += [nn.Linear(DDP_WIDTH, DDP_WIDTH), nn.GELU()]
    return nn.Sequential(*layers)


def ddp_batch(step):
    generator = torch.Generator().manual_seed(200 + step)
    return (torch.randn(DDP_BATCH, DDP_WIDTH, generator=generator),
            torch.randn(DDP_BATCH, DDP_WIDTH, generator=generator))


def recording_allreduce_hook(calls, local, names):
    """Records each bucket's parameters and this rank's own gradients, then all-reduces as DDP does."""
    def hook(state, bucket):
        calls.append((bucket.index(), bucket.buffer().numel(),
                      [names[p.data_ptr()] for p in bucket.parameters()]))
        local.update({names[p.data_ptr()]: g.clone() for p, g in zip(bucket.parameters(), bucket.gradients())})
        return default_hooks.allreduce_hook(None, bucket)  # DDP's default: divide by the world size, then sum
    return hook


def timeline_events(profile, device):
    """(name, lane, start, end), in microseconds, of the backward pass's work and its all-reduces.

    CPU ranks: the autograd engine's functions, on the training thread, and
    gloo's all-reduces, on gloo's threads. A GPU: every kernel, on its CUDA
    stream (the device's resource id): the backward pass's kernels and NCCL's
    all-reduce kernels. NCCL's CPU-side "nccl:all_reduce" event only marks the launch.
    """
    if device.type == "cuda":
        return [(e.name, e.device_resource_id, e.time_range.start, e.time_range.end)
                for e in profile.events() if e.device_type == torch.autograd.DeviceType.CUDA]
    return [(e.name, e.thread, e.time_range.start, e.time_range.end) for e in profile.events()
            if e.name.startswith(("autograd::engine::evaluate_function:", "gloo:"))]


def check_gradient_average(model, local, world_size, what):
    """The gradients DDP left in ``model`` are the mean of the ranks' own, ``local``, gathered from every rank."""
    for name, param in model.named_parameters():
        gathered = [torch.empty_like(local[name]) for _ in range(world_size)]
        dist.all_gather(gathered, local[name])
        ranks = torch.stack(gathered).double()  # in float64, whose rounding is 2**-29 of float32's
        # One float32 rounding per division by the world size and per addition, in any order:
        # at most 2**-24 of sum_r |g_r|, on gloo or NCCL alike; allowed twice over (2x headroom).
        allowed = (2 * 2**-24 * ranks.abs().sum(0)).clamp_min(torch.finfo(torch.float64).tiny)
        use = (param.grad.double() - ranks.mean(0)) / allowed
        torch.testing.assert_close(use, torch.zeros_like(use), rtol=0, atol=1.0,
                                   msg=lambda m, n=name: f"DDP {what}, {n} (difference over its bound): {m}")


def ddp_worker(rank, world_size):
    device = rank_device(rank)
    model = ddp_model().to(device)
    names = {p.data_ptr(): name for name, p in model.named_parameters()}
    # Gradients as views of the buckets: DDP copies nothing back after the all-reduces,
    # so on a GPU no kernel of DDP's runs after them to blur the timeline.
    ddp = DistributedDataParallel(model, device_ids=[rank] if device.type == "cuda" else None,
                                  bucket_cap_mb=BUCKET_CAP_MB, gradient_as_bucket_view=True)
    calls, local = [], {}
    ddp.register_comm_hook(None, recording_allreduce_hook(calls, local, names))
    rows = DDP_BATCH // world_size
    mine = slice(rank * rows, (rank + 1) * rows)
    buckets_per_step = []
    for step in range(DDP_STEPS):
        inputs, targets = ddp_batch(step)
        calls.clear()
        F.mse_loss(ddp(inputs[mine].to(device)), targets[mine].to(device)).backward()
        buckets_per_step.append(list(calls))
        check_gradient_average(ddp.module, local, world_size, f"step {step}, rank {rank}")
        sgd_step(ddp.module, LEARNING_RATE)
        ddp.zero_grad()
    # One more backward, alone under the profiler: its events are the timeline below.
    inputs, targets = ddp_batch(DDP_STEPS)
    loss = F.mse_loss(ddp(inputs[mine].to(device)), targets[mine].to(device))
    activities = [torch.profiler.ProfilerActivity.CPU]
    if device.type == "cuda":
        activities.append(torch.profiler.ProfilerActivity.CUDA)
    synchronize(device)  # the forward's kernels end before the profile begins
    with torch.profiler.profile(activities=activities) as profile:
        loss.backward()
        synchronize(device)
    return {"buckets": buckets_per_step, "events": timeline_events(profile, device)}


def predicted_bucket_count(model, cap_mb):
    """Fill buckets in reverse order of the parameters, closing each at ``cap_mb`` MiB."""
    count, filled = 0, 0
    for param in reversed(list(model.parameters())):
        if filled == 0:
            count += 1
        filled += param.numel() * param.element_size()
        if filled >= cap_mb * 2**20:
            filled = 0
    return count


def check_buckets(buckets_per_step, parameter_names):
    """Every step hands each parameter to exactly one bucket, one hook call per bucket."""
    for step, calls in enumerate(buckets_per_step):
        held = [name for _, _, names in calls for name in names]
        if sorted(held) != sorted(parameter_names):
            raise AssertionError(f"step {step}: the buckets hold {sorted(held)}")
        if sorted(index for index, _, _ in calls) != list(range(len(calls))):
            raise AssertionError(f"step {step}: bucket indices {[c[0] for c in calls]}")


if CAN_RUN_RANKS:
    DDP_RANKS = run_ranks(ddp_worker, WORLD_SIZE, backend=BACKEND)
    parameter_names = [name for name, _ in ddp_model().named_parameters()]
    check_buckets(DDP_RANKS[0]["buckets"], parameter_names)
    last_step = DDP_RANKS[0]["buckets"][-1]
    predicted = predicted_bucket_count(ddp_model(), BUCKET_CAP_MB)
    if len(last_step) != predicted:
        raise AssertionError(f"DDP made {len(last_step)} buckets; we predicted {predicted}")
    print(f"predicted {predicted} buckets; DDP made {len(last_step)}, in this order (step {DDP_STEPS}):")
    for index, numel, names in last_step:
        print(f"  bucket {index}: {numel * 4 / 2**20:5.2f} MiB  {', '.join(names)}")
    on_ranks = "both ranks" if WORLD_SIZE == 2 else f"all {WORLD_SIZE} ranks"
    print(f"DDP gradients = the mean of the ranks' own gradients, at each of {DDP_STEPS} steps,"
          f" on {on_ranks} (float32, within the rounding of the all-reduce)")
else:
    skip_or_fail("DistributedDataParallel", "distributed", WHY_NOT)

# %%
# Overlap: the all-reduces run during the backward pass
# -----------------------------------------------------
# The profiler recorded rank 0's fourth backward pass: the autograd engine's
# functions on the training thread, and gloo's all-reduces on gloo's own
# threads (on GPUs: the backward pass's kernels, and NCCL's all-reduce kernels
# on NCCL's own CUDA stream). If DDP waited for the backward pass to finish,
# every all-reduce would start after the last backward function; we assert
# that the first one starts before it, and measure how much of the
# communication the backward pass hid.


def is_all_reduce(name):
    """gloo's all-reduce, or an NCCL all-reduce kernel: ncclDevKernel_AllReduce_Sum_f32_RING_LL(...)
    since NCCL 2.19, whatever algorithm runs; ncclKernel_AllReduce_... before."""
    return name == "gloo:all_reduce" or (name.startswith("nccl") and "AllReduce" in name)


def is_backward(name):
    """An autograd engine function on CPU ranks; on a GPU, any kernel that is not NCCL's."""
    return name.startswith("autograd::") or not name.startswith(("nccl", "gloo:"))


def overlap_summary(events):
    backward = [(start, end) for name, _, start, end in events if is_backward(name)]
    allreduce = sorted((start, end, lane) for name, lane, start, end in events if is_all_reduce(name))
    if not backward or not allreduce:
        raise AssertionError(f"the profile holds {len(backward)} backward and {len(allreduce)} all-reduce events")
    origin, backward_end = min(s for s, _ in backward), max(e for _, e in backward)
    hidden = sum(max(0.0, min(end, backward_end) - start) for start, end, _ in allreduce)
    total = sum(end - start for start, end, _ in allreduce)
    return origin, backward_end, backward, allreduce, hidden, total


if CAN_RUN_RANKS:
    origin, backward_end, backward, allreduce, hidden, total = overlap_summary(DDP_RANKS[0]["events"])
    first_allreduce = allreduce[0][0]
    if not first_allreduce < backward_end:
        raise AssertionError("the first all-reduce started only after the backward pass had ended")
    digits = 2 if USE_NCCL else 1  # a GPU's backward pass takes about a millisecond
    print(f"backward pass: {(backward_end - origin) / 1e3:.{digits}f} ms; first all-reduce starts at"
          f" {(first_allreduce - origin) / 1e3:.{digits}f} ms")
    print(f"all-reduce time: {total / 1e3:.{digits}f} ms in {len(allreduce)} calls, of which"
          f" {hidden / 1e3:.{digits}f} ms ({100 * hidden / total:.0f} %) ran while the backward pass was still computing")
    exposed = max(0.0, max(end for _, end, _ in allreduce) - backward_end)
    print(f"communication left after the backward pass: {exposed / 1e3:.{digits}f} ms")

    lanes = sorted({lane for _, _, lane in allreduce})  # gloo's threads, or NCCL's CUDA streams
    lane_name = "NCCL stream" if USE_NCCL else "gloo thread"
    labels = ["backward (GPU kernels)" if USE_NCCL else "backward (training thread)"] + [
        f"all-reduce ({lane_name} {i + 1})" for i in range(len(lanes))]
    fig, ax = plt.subplots(figsize=(8, 1.2 + 0.7 * len(labels)))
    ax.broken_barh([((s - origin) / 1e3, (e - s) / 1e3) for s, e in backward], (-0.35, 0.7),
                   facecolors="C0", edgecolors="white", linewidth=0.5)
    for bucket, (start, end, lane) in enumerate(allreduce):  # in order of start: bucket 0 first
        y = 1 + lanes.index(lane)
        ax.broken_barh([((start - origin) / 1e3, (end - start) / 1e3)], (y - 0.35, 0.7),
                       facecolors="C1" if bucket % 2 == 0 else "C3", edgecolors="white")
        ax.text((start + end - 2 * origin) / 2e3, y, f"b{bucket}", ha="center", va="center",
                fontsize="x-small", color="white")
    ax.axvline((backward_end - origin) / 1e3, color="grey", linestyle="--", linewidth=1)
    ax.annotate("backward ends", ((backward_end - origin) / 1e3, len(labels) - 0.55), fontsize="small",
                ha="right", color="grey")
    ax.set_yticks(range(len(labels)), labels=labels)
    ax.set_ylim(-0.6, len(labels) - 0.3)
    ax.set_xlabel("time since the backward pass began (ms)")
    ax.set_title(f"DDP on rank 0: {len(last_step)} buckets, {BACKEND_NAME}, {DEVICE_NAME}", fontsize="medium")
    fig.tight_layout()

# %%
# Reading the result
# ------------------
# Data parallel changes where the gradient is computed, not what it is: the
# first figure shows the weights of the two ways agreeing to within rounding
# at every step, in both precisions, while the copy that skips the all-reduce
# drifts away from the first step on. That is the test to keep for any data
# parallel code: train a few steps against one process on the whole batch,
# at a bound on the rounding. With Adam, compare the gradients, then Adam's
# steps on equal gradients, as example 03 does: where a gradient is near zero,
# Adam magnifies its rounding by up to lr / eps.
#
# DDP adds two things that change the time, not the result. Buckets turn one
# all-reduce per tensor into a few larger ones, each paying the fixed cost
# alpha of :ref:`sphx_glr_auto_examples_lecture07_parallelism_01_collectives.py`
# once. And the timeline shows buckets all-reduced while backward is still
# computing the gradients of earlier layers; only what remains after the
# last backward function, the all-reduce of the last bucket among them, adds
# to the step time. With NCCL on 2 or more GPUs the same schedule runs on a
# separate CUDA stream, and the timeline shows GPU kernels; on CPU ranks the
# gloo threads and the training thread share two cores with the other rank,
# so the overlap there shows the order of events, not a speed-up. Example 03
# keeps the same gradients but stops keeping a full copy of everything on
# every rank.

# %%
# Key figures
# -----------
# The numbers this example exists to measure, collected for the course's GPU check.

if CAN_RUN_RANKS:
    KEY_FIGURES = {
        "device": DEVICE_NAME,
        "backend": BACKEND_NAME,
        "world_size": WORLD_SIZE,
        "float64_relative_difference": DIFFERENCES[torch.float64, True][-1],
        "float32_relative_difference": DIFFERENCES[torch.float32, True][-1],
        "ddp_buckets": len(last_step),
        "allreduce_hidden_fraction": hidden / total,
    }
