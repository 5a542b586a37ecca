"""
ZeRO and FSDP: who holds which bytes
====================================

Data parallelism keeps a full copy of the weights, the gradients and the
optimizer state on every rank. ZeRO shards them instead, in three stages. We
predict the bytes per rank of each stage from the ZeRO paper's accounting,
then train a small model with PyTorch's FSDP2 (``fully_shard``, ZeRO stage 3),
count the bytes each rank really holds and the bytes each collective moves,
and check that sharding changes neither the gradients nor the optimizer's
update, beyond float64 rounding.

**Requirements.** On a CPU: gloo on loopback, 2 ranks. On a single GPU (T4 on
Colab included): the same, gloo on CPU ranks; the memory measured is then CPU
memory, counted tensor by tensor. With 2 or more GPUs: NCCL, one process per
GPU, at larger sizes (a wider model for the byte counts), and
``torch.cuda.memory_allocated`` shows the bytes of each rank's allocator beside
the count. The first line of the output names the run that produced this
page's figures.
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
# A small stack of linear layers whose widths are deliberately odd numbers:
# every weight has an odd number of rows, so no tensor splits evenly over two
# ranks and the padding that FSDP adds becomes visible.

import copy
import gc
import itertools
import math
import platform

import matplotlib.pyplot as plt
from torch import nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
from torch.distributed.optim import ZeroRedundancyOptimizer
from torch.distributed.tensor import DTensor
from torch.nn.parallel import DistributedDataParallel
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
BACKEND = "cpu:gloo,cuda:nccl" if USE_NCCL else "gloo"


def gpu_name(rank, world_size):
    return torch.cuda.get_device_name(rank)


def rank_device(rank):
    return torch.device("cuda", rank) if USE_NCCL else torch.device("cpu")


SMALL_WIDTHS = [29, 67, 51, 23]  # odd everywhere: uneven shards on 2 ranks
ROWS_PER_RANK = 13  # each rank's part of the batch
if USE_NCCL:
    WORLD_SIZE, BACKEND_NAME = torch.cuda.device_count(), "nccl"
    # get_device_name initialises CUDA, which must not happen here before the fork: a rank asks.
    DEVICE_NAME = f"{WORLD_SIZE} x {run_ranks(gpu_name, 1, backend=BACKEND)[0]}"
    # The model whose bytes are counted; primes but for 253 = 11 x 23: uneven shards on 2 to 8 GPUs.
    LAYER_WIDTHS = [509, 2039, 1021, 253]
    print(f"backend: nccl (one process per GPU)   world size: {WORLD_SIZE}   device: {DEVICE_NAME}")
else:
    WORLD_SIZE, BACKEND_NAME = 2, "gloo"
    DEVICE_NAME = f"{platform.machine()} CPU, {os.cpu_count()} cores"
    LAYER_WIDTHS = SMALL_WIDTHS
    if CAN_RUN_RANKS and torch.cuda.device_count() >= 2:
        if not torch.cuda.is_initialized() and torch.cuda._device_count_nvml() < 0:
            print(f"{torch.cuda.device_count()} GPUs, but gloo on CPU ranks: NVML could not count them,"
                  f" and counting them through the CUDA runtime has started CUDA here, so forked ranks cannot use it")
        else:
            print(f"{torch.cuda.device_count()} GPUs, but gloo on CPU ranks: "
                  + ("CUDA is already initialised in this process, so forked ranks cannot use it"
                     if torch.cuda.is_initialized() else "this PyTorch build has no NCCL"))
    print(f"backend: gloo on CPU ranks (loopback)   world size: {WORLD_SIZE}   device: {DEVICE_NAME}")
TRAIN_STEPS = 3
LEARNING_RATE = 1e-2
if not CAN_RUN_RANKS:
    skip_or_fail("the sharded runs", "distributed", WHY_NOT)
    sys.exit(0)  # everything below needs ranks


def make_model(dtype, widths=LAYER_WIDTHS):
    """Linear layers of ``widths`` with a GeLU between them, the same weights every call."""
    torch.manual_seed(0)
    layers = []
    for width_in, width_out in itertools.pairwise(widths):
        layers += [nn.Linear(width_in, width_out, dtype=dtype), nn.GELU()]
    return nn.Sequential(*layers[:-1])


def linear_layers(model):
    return [layer for layer in model if isinstance(layer, nn.Linear)]


# %%
# Predict: the 2 + 2 + 12 accounting
# ----------------------------------
# Rajbhandari et al. (2020) count the bytes of mixed-precision training with
# Adam per parameter: 2 for the bf16 (or fp16) weights the model computes
# with, 2 for their gradients, and :math:`K = 12` for the optimizer state,
# which is an fp32 master copy of the weights and Adam's two moments, 4 bytes
# each. With :math:`\Psi` parameters and :math:`N` data-parallel ranks:
#
# * data parallel (DDP): every rank holds everything,
#   :math:`(2 + 2 + K)\,\Psi = 16\,\Psi`;
# * ZeRO-1 shards the optimizer state: :math:`(2 + 2)\,\Psi + K\Psi/N`;
# * ZeRO-2 also shards the gradients: :math:`2\Psi + (2 + K)\,\Psi/N`;
# * ZeRO-3 also shards the weights: :math:`(2 + 2 + K)\,\Psi/N`.
#
# Activations come on top and are not sharded by any stage. The paper's own
# example (its Figure 1) is a 7.5-billion-parameter model on 64 GPUs; the
# function below reproduces its numbers, which the code asserts.


def zero_bytes_per_rank(params, ranks, weight_bytes=2, grad_bytes=2, state_bytes=12):
    """Bytes of (weights, gradients, optimizer state) on one rank, for each ZeRO stage."""
    weights, grads, states = weight_bytes * params, grad_bytes * params, state_bytes * params
    return {
        "DDP": (weights, grads, states),
        "ZeRO-1": (weights, grads, states / ranks),
        "ZeRO-2": (weights, grads / ranks, states / ranks),
        "ZeRO-3": (weights / ranks, grads / ranks, states / ranks),
    }


PAPER_PARAMS, PAPER_RANKS = 7.5e9, 64
PAPER_FIGURE_1_GB = {"DDP": 120, "ZeRO-1": 31.4, "ZeRO-2": 16.6, "ZeRO-3": 1.9}
paper_prediction = zero_bytes_per_rank(PAPER_PARAMS, PAPER_RANKS)
print(f"predicted GB per GPU, {PAPER_PARAMS / 1e9} B parameters on {PAPER_RANKS} GPUs:")
print(f"{'stage':<8}{'weights':>9}{'grads':>8}{'Adam':>8}{'total':>8}{'paper':>8}")
for stage, parts in paper_prediction.items():
    total_gb = sum(parts) / 1e9
    assert round(total_gb, 1) == PAPER_FIGURE_1_GB[stage], (stage, total_gb)  # the paper prints one decimal
    print(f"{stage:<8}" + "".join(f"{part / 1e9:>8.2f}" for part in parts)
          + f"{total_gb:>8.2f}{PAPER_FIGURE_1_GB[stage]:>8}")

PART_NAMES = ("weights", "gradients", "optimizer state")
PART_COLOURS = ("tab:blue", "tab:orange", "tab:green")
fig, ax = plt.subplots(figsize=(6.4, 3.8))
bottom = [0.0] * len(paper_prediction)
for index, (name, colour) in enumerate(zip(PART_NAMES, PART_COLOURS)):
    heights = [parts[index] / 1e9 for parts in paper_prediction.values()]
    ax.bar(list(paper_prediction), heights, bottom=bottom, color=colour, label=name)
    bottom = [b + h for b, h in zip(bottom, heights)]
for stage, total in zip(paper_prediction, bottom):
    ax.annotate(f"{total:.1f} GB", (stage, total), ha="center", va="bottom", fontsize="small")
ax.set_ylabel("GB per GPU (predicted)")
ax.set_title(f"{PAPER_PARAMS / 1e9} B parameters, {PAPER_RANKS} GPUs, mixed-precision Adam")
ax.legend(fontsize="small")
fig.tight_layout()

# %%
# Measure: the bytes each rank holds
# ----------------------------------
# FSDP2, the FSDP of Zhao et al. (2023) rewritten on DTensor, is PyTorch's
# ZeRO-3: ``fully_shard`` on each layer turns its parameters into DTensors,
# each rank keeping one piece of dimension 0, cut as ``torch.chunk`` cuts:
# ``ceil(rows / N)`` rows per rank, fewer (or none) on the last ranks. We run
# it in plain fp32 (no mixed precision, so no master copy: 4 bytes of weight,
# 4 of gradient, 8 of Adam moments per parameter) and count, after one
# training step, the bytes of every rank's local shards: the parameters, their
# gradients and Adam's moments (``DTensor.to_local()``; Adam's one-element
# step counters are left out). That is what this page measures: tensors, not
# the allocator, so the numbers are exact and the same on any machine.
#
# We also count the bytes of the distinct storages behind those tensors. FSDP
# *pads* each parameter's shard to ``ceil(rows / N)`` rows on every rank,
# because all-gather needs pieces of equal size, so the parameters' storage is
# the padded size on every rank (asserted). Whether the gradients and Adam's
# moments are padded too depends on the FSDP version: the ``stored`` column
# shows this one's. The same count on the DDP run shows the full copy.


def rows_on_rank(rows, rank, ranks):
    """Rows of dimension 0 that ``rank`` keeps when ``torch.chunk`` cuts ``rows`` into ``ranks``."""
    per_rank = math.ceil(rows / ranks)
    return max(0, min(per_rank, rows - rank * per_rank))


def predicted_shard_elements(model, rank, ranks):
    """(elements this rank keeps, elements of its padded storage), over all parameters."""
    kept = padded = 0
    for param in model.parameters():
        row_size = param[0].numel() if param.dim() > 1 else 1
        kept += rows_on_rank(param.shape[0], rank, ranks) * row_size
        padded += math.ceil(param.shape[0] / ranks) * row_size
    return kept, padded


def local_tensor(tensor):
    """This rank's piece of a DTensor; a plain tensor is all local."""
    return tensor.to_local() if isinstance(tensor, DTensor) else tensor


def held_bytes(model, optimizer):
    """Bytes of this rank's parameters, gradients and Adam moments, and of their storages."""
    groups = {
        "weights": [local_tensor(p) for p in model.parameters()],
        "gradients": [local_tensor(p.grad) for p in model.parameters()],
        # ZeroRedundancyOptimizer keeps this rank's Adam in ``.optim``.
        "optimizer state": [local_tensor(value) for state in getattr(optimizer, "optim", optimizer).state.values()
                            for key, value in state.items() if key != "step"],
    }
    tensor_bytes = {name: sum(t.numel() * t.element_size() for t in tensors)
                    for name, tensors in groups.items()}
    storages = {name: {t.untyped_storage().data_ptr(): t.untyped_storage().nbytes()
                       for t in tensors}
                for name, tensors in groups.items()}
    storage_bytes = {name: sum(sizes.values()) for name, sizes in storages.items()}
    return tensor_bytes, storage_bytes


# %%
# A small ``TorchDispatchMode`` records every collective the rank issues
# during the step, with the size of its whole (unsharded) buffer, as nccl-tests
# counts message size. Collectives reach PyTorch's dispatcher as ``c10d`` ops,
# whether DDP's C++ reducer or FSDP issues them.

COLLECTIVE_NAMES = {"allreduce_": "all-reduce", "_allgather_base_": "all-gather",
                    "_reduce_scatter_base_": "reduce-scatter", "broadcast_": "broadcast"}


class CollectiveRecorder(TorchDispatchMode):
    """Records (collective, bytes of its whole buffer) for every c10d op it sees."""

    def __init__(self):
        super().__init__()
        self.messages = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func.namespace in ("c10d", "_c10d_functional"):
            tensors = [t for arg in args for t in (arg if isinstance(arg, (list, tuple)) else [arg])
                       if isinstance(t, torch.Tensor)]
            name = func.overloadpacket.__name__
            self.messages.append((COLLECTIVE_NAMES.get(name, name),
                                  max(t.numel() * t.element_size() for t in tensors)))
        return func(*args, **(kwargs or {}))


def mean_squared_error(model, inputs, targets):
    return (model(inputs) - targets).square().mean()


def make_batch(dtype, widths=LAYER_WIDTHS, ranks=WORLD_SIZE):
    generator = torch.Generator().manual_seed(1)
    inputs = torch.randn(ranks * ROWS_PER_RANK, widths[0], generator=generator)
    targets = torch.randn(ranks * ROWS_PER_RANK, widths[-1], generator=generator)
    return inputs.to(dtype), targets.to(dtype)


def rank_rows(tensor, rank):
    return tensor[rank * ROWS_PER_RANK:(rank + 1) * ROWS_PER_RANK]


def shard_with_fsdp(model, world_size, reshard_after_forward):
    """ZeRO-3 (reshard after forward) or ZeRO-2 (keep the gathered weights until backward)."""
    # The ranks' device, named: by default FSDP would pick a GPU where there is one, even for CPU ranks.
    mesh = init_device_mesh("cuda" if USE_NCCL else "cpu", (world_size,))
    for layer in linear_layers(model):
        fully_shard(layer, mesh=mesh, reshard_after_forward=reshard_after_forward)
    return fully_shard(model, mesh=mesh, reshard_after_forward=reshard_after_forward)


def allocated_bytes(device):
    """(now, peak) bytes of the CUDA caching allocator on ``device``; a CPU keeps no such count."""
    if device.type != "cuda":
        return None
    torch.cuda.synchronize(device)
    return torch.cuda.memory_allocated(device), torch.cuda.max_memory_allocated(device)


def one_step(rank, world_size, stage, model, inputs, targets):
    """One recorded Adam step of ``stage`` on this rank's rows; bytes held afterwards."""
    device = rank_device(rank)
    inputs, targets = inputs.to(device), targets.to(device)
    gc.collect()  # the previous stage's model and optimizer are gone before the baseline
    before = allocated_bytes(device)
    model = model.to(device)
    if stage in ("DDP", "ZeRO-1"):
        wrapped = DistributedDataParallel(model, device_ids=[rank] if device.type == "cuda" else None,
                                          gradient_as_bucket_view=True)
    else:
        wrapped = shard_with_fsdp(model, world_size, reshard_after_forward=(stage == "ZeRO-3"))
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)  # the peak of the step, not of the full copy FSDP shards
    if stage == "ZeRO-1":  # each rank keeps Adam's state of whole parameters, its share of them
        optimizer = ZeroRedundancyOptimizer(wrapped.parameters(), torch.optim.Adam, lr=LEARNING_RATE)
    else:
        optimizer = torch.optim.Adam(wrapped.parameters(), lr=LEARNING_RATE)
    recorder = CollectiveRecorder()
    with recorder:
        loss = mean_squared_error(wrapped, rank_rows(inputs, rank), rank_rows(targets, rank))
        weights_between_passes = sum(local_tensor(p).numel() * p.element_size()
                                     for p in wrapped.parameters())
        loss.backward()
        optimizer.step()
    tensor_bytes, storage_bytes = held_bytes(wrapped, optimizer)
    after = allocated_bytes(device)
    allocator = None if before is None else {"after step": after[0] - before[0], "peak": after[1] - before[0],
                                             "allocated": after[0]}
    return {"tensor_bytes": tensor_bytes, "storage_bytes": storage_bytes, "allocator": allocator,
            "weights_between_passes": weights_between_passes, "messages": recorder.messages}


def one_step_of_each(rank, world_size, stages, model, inputs, targets):
    return {stage: one_step(rank, world_size, stage, copy.deepcopy(model), inputs, targets)
            for stage in stages}


MEASURED_STAGES = ("DDP", "ZeRO-1", "ZeRO-2", "ZeRO-3")
fp32_model = make_model(torch.float32)
fp32_batch = make_batch(torch.float32)
rank_results = run_ranks(one_step_of_each, WORLD_SIZE, MEASURED_STAGES, fp32_model, *fp32_batch,
                         backend=BACKEND)
measured = {stage: [result[stage] for result in rank_results] for stage in MEASURED_STAGES}

# %%
# The prediction for this run is the accounting above with fp32 sizes (4, 4
# and 8 bytes) applied to each rank's own rows; the code asserts that the
# measured bytes equal it, rank by rank, and that the weights' storage is the
# padded size. ``ZeRO-2`` here is FSDP2 with ``reshard_after_forward=False``,
# PyTorch's ZeRO-2 flavour: it keeps each layer's gathered weights from the
# forward pass until the backward pass instead of gathering them again. After
# the step it holds ZeRO-3's bytes; *between* the passes it holds the full
# weights, as ZeRO-2 does (the last column, also asserted).
#
# ``ZeRO-1`` is DDP with ``ZeroRedundancyOptimizer``, PyTorch's ZeRO-1. It
# shards the optimizer state by whole parameters, not by rows: sorted by size,
# largest first, each parameter goes to the rank that holds the fewest
# elements so far (its documented sorted-greedy partition). The prediction
# applies that rule to the model's parameters.

FP32_BYTES = {"weights": 4, "gradients": 4, "optimizer state": 8}
params_total = sum(p.numel() for p in fp32_model.parameters())


def greedy_partition(sizes, ranks):
    """Elements each rank gets when the sizes, largest first, go to the least loaded rank."""
    loads = [0] * ranks
    for size in sorted(sizes, reverse=True):
        loads[loads.index(min(loads))] += size  # ties: the lowest rank, as torch's _get_min_index
    return loads


def predicted_bytes(stage, rank):
    """fp32 bytes of weights, gradients, Adam moments that ``rank`` keeps under ``stage``."""
    kept, _ = predicted_shard_elements(fp32_model, rank, WORLD_SIZE)
    if stage == "ZeRO-1":
        kept = greedy_partition([p.numel() for p in fp32_model.parameters()], WORLD_SIZE)[rank]
    sharded = {"DDP": (), "ZeRO-1": ("optimizer state",), "ZeRO-2": ("weights", "gradients", "optimizer state"),
               "ZeRO-3": ("weights", "gradients", "optimizer state")}[stage]
    return {part: size * (kept if part in sharded else params_total)
            for part, size in FP32_BYTES.items()}


def check_held_bytes(stage, rank, result):
    """Measured bytes equal the prediction; FSDP's weight storage is padded to equal shards."""
    prediction = predicted_bytes(stage, rank)
    assert result["tensor_bytes"] == prediction, (stage, rank, result["tensor_bytes"], prediction)
    kept, padded = predicted_shard_elements(fp32_model, rank, WORLD_SIZE)
    stored_weights = FP32_BYTES["weights"] * (params_total if stage in ("DDP", "ZeRO-1") else padded)
    assert result["storage_bytes"]["weights"] == stored_weights, (stage, rank, result)
    for part in ("gradients", "optimizer state"):  # padded or not, by FSDP version
        assert prediction[part] <= result["storage_bytes"][part] <= stored_weights * (
            FP32_BYTES[part] // FP32_BYTES["weights"]), (stage, rank, part, result)
    full_between_passes = stage != "ZeRO-3"
    between = FP32_BYTES["weights"] * (params_total if full_between_passes else kept)
    assert result["weights_between_passes"] == between, (stage, rank, result)
    return prediction


print(f"\nfp32 bytes per rank after one step ({params_total} parameters; prediction asserted):")
w = max(0, len(str(16 * params_total)) - 6)  # wider columns for the GPUs' model
print(f"{'stage':<8}{'rank':>5}{'weights':>{9 + w}}{'grads':>{8 + w}}{'Adam':>{8 + w}}{'total':>{8 + w}}"
      f"{'predicted':>{11 + w}}{'stored':>{8 + w}}{'fwd-bwd weights':>{17 + w}}")
for stage in MEASURED_STAGES:
    for rank, result in enumerate(measured[stage]):
        prediction = check_held_bytes(stage, rank, result)
        parts = "".join(f"{result['tensor_bytes'][part]:>{8 + w}}" for part in PART_NAMES)
        print(f"{stage:<8}{rank:>5}{parts}"
              f"{sum(result['tensor_bytes'].values()):>{8 + w}}{sum(prediction.values()):>{11 + w}}"
              f"{sum(result['storage_bytes'].values()):>{8 + w}}{result['weights_between_passes']:>{17 + w}}")
last_rank = WORLD_SIZE - 1  # it keeps the fewest rows
padding_bytes = FP32_BYTES["weights"] * (predicted_shard_elements(fp32_model, 0, WORLD_SIZE)[1]
                                         - predicted_shard_elements(fp32_model, last_rank, WORLD_SIZE)[0])
print(f"padding: rank {last_rank}'s weight storage is {padding_bytes} bytes larger than its shards")

if USE_NCCL:
    # The allocator also holds what no tensor of the count is: activations, gathered layers, buffers.
    print("\nCUDA allocator per rank, MB (torch.cuda.memory_allocated after the step, max_memory_allocated"
          " during it), from before the model reached the GPU:")
    print(f"{'stage':<8}{'rank':>5}{'held tensors':>14}{'after step':>12}{'peak':>8}")
    for stage in MEASURED_STAGES:
        for rank, result in enumerate(measured[stage]):
            held, allocator = sum(result["storage_bytes"].values()), result["allocator"]
            # A lower bound that holds whatever else the rank keeps: its tensors are GPU memory.
            assert held <= allocator["allocated"], (stage, rank, held, allocator)
            print(f"{stage:<8}{rank:>5}{held / 1e6:>14.2f}{allocator['after step'] / 1e6:>12.2f}"
                  f"{allocator['peak'] / 1e6:>8.2f}")

fig, ax = plt.subplots(figsize=(max(6.4, 0.45 * WORLD_SIZE * len(MEASURED_STAGES)), 3.8))
bar_labels = [f"{stage}\nrank {rank}" for stage in MEASURED_STAGES for rank in range(WORLD_SIZE)]
bottom = [0] * len(bar_labels)
for name, colour in zip(PART_NAMES, PART_COLOURS):
    heights = [measured[stage][rank]["tensor_bytes"][name] / 1e3
               for stage in MEASURED_STAGES for rank in range(WORLD_SIZE)]
    ax.bar(bar_labels, heights, bottom=bottom, color=colour, label=f"{name} (measured)")
    bottom = [b + h for b, h in zip(bottom, heights)]
predicted_totals = [sum(predicted_bytes(stage, rank).values()) / 1e3
                    for stage in MEASURED_STAGES for rank in range(WORLD_SIZE)]
ax.plot(bar_labels, predicted_totals, "k_", markersize=28, markeredgewidth=2, label="predicted")
ax.set_ylabel("kB per rank after one step")
ax.set_title(f"fp32 Adam, {params_total} parameters, {WORLD_SIZE} ranks ({DEVICE_NAME})")
ax.legend(fontsize="small")
fig.tight_layout()

# %%
# Communication per step
# ----------------------
# DDP all-reduces every gradient once: in a ring each rank sends
# :math:`2\frac{N-1}{N}\Psi` elements. ZeRO-1 and ZeRO-2 replace the
# all-reduce by its two halves, a reduce-scatter of the gradients (each rank
# receives the sum of its shard) and, after each rank updates its shard, an
# all-gather of the new weights: the same :math:`2\frac{N-1}{N}\Psi`. ZeRO-3
# gathers each layer's weights once for forward and again for backward, and
# reduce-scatters its gradients: :math:`3\frac{N-1}{N}\Psi`, 1.5 times DDP's
# traffic, in exchange for the smallest memory. (The all-gather after the
# update of ZeRO-1/2 is, in FSDP, the next step's forward all-gather.)
# PyTorch's ZeRO-1 does not take that form: ``ZeroRedundancyOptimizer`` leaves
# DDP's all-reduce as it is, so every rank gets every summed gradient, and
# after the step each rank broadcasts the parameters it updated. A broadcast of
# :math:`S` bytes delivers :math:`S` to every rank but its root, so, pipelined
# along a ring or a tree, it sends :math:`(N-1) S` in all,
# :math:`\frac{N-1}{N} S` per rank on average: the step sends
# :math:`3\frac{N-1}{N}\Psi`, ZeRO-3's traffic without ZeRO-3's memory. The
# saving is in memory only; the traffic is what the implementation chose.
# :ref:`sphx_glr_auto_examples_lecture07_parallelism_01_collectives.py`
# measured that all-reduce = reduce-scatter + all-gather; here we record
# which collectives each run issued and with how many bytes, and assert that
# they are exactly the ones predicted, padding included (FSDP gathers the
# padded shards).

RING_FACTOR = {"all-reduce": 2 * (WORLD_SIZE - 1) / WORLD_SIZE,
               "all-gather": (WORLD_SIZE - 1) / WORLD_SIZE,
               "reduce-scatter": (WORLD_SIZE - 1) / WORLD_SIZE,
               "broadcast": (WORLD_SIZE - 1) / WORLD_SIZE}  # averaged over the ranks


def padded_elements(layer, ranks):
    """Elements of a layer's all-gather buffer: rows padded to a multiple of ``ranks``."""
    return sum(math.ceil(p.shape[0] / ranks) * ranks * (p[0].numel() if p.dim() > 1 else 1)
               for p in layer.parameters())


def predicted_messages(stage):
    """(collective, bytes of its whole buffer) that one step of ``stage`` issues, sorted."""
    if stage == "DDP":
        return [("all-reduce", FP32_BYTES["gradients"] * params_total)]
    if stage == "ZeRO-1":  # DDP's all-reduce, then one broadcast per parameter from its owner
        return sorted([("all-reduce", FP32_BYTES["gradients"] * params_total)]
                      + [("broadcast", FP32_BYTES["weights"] * p.numel()) for p in fp32_model.parameters()])
    gathers_per_layer = 2 if stage == "ZeRO-3" else 1
    messages = []
    for layer in linear_layers(fp32_model):
        layer_bytes = FP32_BYTES["weights"] * padded_elements(layer, WORLD_SIZE)
        messages += [("all-gather", layer_bytes)] * gathers_per_layer
        messages += [("reduce-scatter", layer_bytes)]
    return sorted(messages)


def merged_all_reduces(messages):
    """DDP may cut its all-reduce into several buckets: add them up."""
    others = [m for m in messages if m[0] != "all-reduce"]
    reduced = sum(size for kind, size in messages if kind == "all-reduce")
    return sorted(others + ([("all-reduce", reduced)] if reduced else []))


def sent_per_rank(messages):
    return sum(RING_FACTOR[kind] * size for kind, size in messages)


padded_params = sum(padded_elements(layer, WORLD_SIZE) for layer in linear_layers(fp32_model))
PSI_FACTOR = {"DDP": 2 * params_total, "ZeRO-1": 3 * params_total, "ZeRO-2": 2 * padded_params,
              "ZeRO-3": 3 * padded_params}
print(f"\ncollectives per step ({params_total} parameters, {padded_params} after padding):")
print(f"{'stage':<8}{'all-reduce':>11}{'all-gather':>11}{'red-scatter':>12}{'broadcast':>10}"
      f"{'sent/rank B':>12}{'formula B':>11}")
for stage in MEASURED_STAGES:
    for rank, result in enumerate(measured[stage]):
        messages = merged_all_reduces(result["messages"])
        assert messages == predicted_messages(stage), (stage, rank, result["messages"])
    raw = measured[stage][0]["messages"]
    counts = [sum(kind == name for kind, _ in raw) for name in RING_FACTOR]
    formula = (WORLD_SIZE - 1) / WORLD_SIZE * PSI_FACTOR[stage] * FP32_BYTES["weights"]
    sent = sent_per_rank(raw)
    # Sums of len(raw) exact sizes times a rounded ring factor, against 2 roundings: float64's few steps.
    torch.testing.assert_close(sent, formula, rtol=(len(raw) + 3) * 2**-53, atol=0, msg=stage)
    print(f"{stage:<8}{counts[0]:>11}{counts[1]:>11}{counts[2]:>12}{counts[3]:>10}{sent:>12.0f}{formula:>11.0f}")
zero3_over_ddp = sent_per_rank(measured["ZeRO-3"][0]["messages"]) / sent_per_rank(
    measured["DDP"][0]["messages"])
print(f"ZeRO-3 sends {zero3_over_ddp:.3f} x DDP's bytes (1.5 x, plus padding)")

# %%
# Training with FSDP2 matches one process
# ---------------------------------------
# Sharding must not change the arithmetic. Each rank computes the gradient of
# its share of the batch, and FSDP's reduce-scatter leaves on each rank its
# rows of the ranks' average, which with equal shares is the gradient of the
# whole batch's mean loss. One process computes that gradient on the whole
# batch. FSDP2 runs in float64, over gloo or NCCL alike, so the two differ only
# by rounding, in sums taken in another order or on another device. The
# tolerance bounds that rounding element by element, by running error
# analysis (Higham 2002, chapter 3): a sum of n terms, in any order, is off by
# at most n float64 rounding steps of the sum of its terms' absolute values,
# plus the errors its inputs carry.
#
# Then the optimizer: for a few steps, each rank applies Adam to its shards of
# the single process's own gradients, as the single process does to the whole
# tensors. Adam works element by element, so equal inputs give equal outputs,
# to a few rounding steps of each weight and of its update. Comparing the
# weights after Adam steps on each run's own gradients can fail with no bug
# at all: Adam divides each gradient by its running root mean square, so where
# a gradient is close to zero it multiplies the gradient's rounding by up to
# lr / eps, here a million. Both checks run on every rank, on any number of
# ranks: the bounds do not depend on how the batch is split.

U64 = 2.0**-53  # float64's unit roundoff: a rounding step is at most U64 relative


def gelu_slope(z):
    """GeLU's derivative, Phi(z) + z phi(z): at most 1.13 in size, its own derivative at most 0.8."""
    return 0.5 * (1 + torch.erf(z / math.sqrt(2))) + z * torch.exp(-z.square() / 2) / math.sqrt(2 * math.pi)


@torch.no_grad()
def gradient_error_bounds(model, inputs, targets):
    """Each float64 gradient of the mean squared error is within U64 times this bound of the exact one.

    Running error analysis, to first order: a sum of n products a_k w_k whose
    factors are off by e(a_k) and e(w_k) is off by at most
    sum(|w_k| e(a_k) + |a_k| e(w_k)) + n sum |a_k w_k|, in any order of the sum;
    GeLU and its slope add 8 rounding steps each.
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
            # Sums over the batch, whether in one process or by rank and then across ranks, with the
            # mean's scalings; FSDP2 divides float64 by a power of two before the sum (exact) and by
            # the rest of the number of ranks after it (one rounding).
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


def adam_ratio(k, betas=(0.9, 0.999)):
    """The most |m| / sqrt(v) can be after k steps, for Adam's bias-corrected moments.

    m = sum_j a_j g_j and v = sum_j b_j g_j**2, so by Cauchy-Schwarz
    sum_j a_j |g_j| <= sqrt(sum_j a_j**2 / b_j) sqrt(v): 1.004 for k <= 3, below 7.3 for any k.
    """
    beta1, beta2 = betas
    return math.sqrt(sum(((1 - beta1) * beta1 ** (k - j) / (1 - beta1 ** k)) ** 2
                         / ((1 - beta2) * beta2 ** (k - j) / (1 - beta2 ** k)) for j in range(1, k + 1)))


def adam_error_bounds(weights, learning_rate):
    """Adam's weights after step k, on equal gradients, are within U64 times this bound of the exact ones.

    Step k rounds the weight (|w_k|) and its update lr m / (sqrt(v) + eps). The
    moments' sums round at most 3 (m) and 4 (v) times a step, so m is within 3k
    rounding steps of the sum of its terms' sizes and sqrt(v) + eps within 2k + 3;
    the division and the step size round twice more: (5k + 5) adam_ratio(k)
    steps of lr. Both sides compute the constants (lr, 1 - beta**k) alike.
    """
    return {name: sum((5 * k + 5) * adam_ratio(k) * learning_rate + weights[k][name].abs()
                      for k in range(1, len(weights)))
            for name in weights[0]}


def shard_rows(tensor, rank, ranks):
    """The rows of dimension 0 that ``rank`` keeps, cut as ``torch.chunk`` cuts."""
    start = rank * math.ceil(tensor.shape[0] / ranks)
    return tensor[start:start + rows_on_rank(tensor.shape[0], rank, ranks)]


def train_sharded(rank, world_size, model, inputs, targets, reference_gradients):
    """This rank's reduce-scattered gradients, then its weights after Adam on the reference's gradients."""
    device = rank_device(rank)
    inputs, targets = inputs.to(device), targets.to(device)
    model = shard_with_fsdp(model.to(device), world_size, reshard_after_forward=True)
    mean_squared_error(model, rank_rows(inputs, rank), rank_rows(targets, rank)).backward()
    gradients = {name: local_tensor(p.grad).cpu().clone() for name, p in model.named_parameters()}
    optimizer = torch.optim.Adam(model.parameters(), lr=LEARNING_RATE)
    for step_gradients in reference_gradients:
        for name, p in model.named_parameters():
            local_tensor(p.grad).copy_(shard_rows(step_gradients[name], rank, world_size))
        optimizer.step()
    return {"gradients": gradients,
            "weights": {name: local_tensor(p).detach().cpu() for name, p in model.named_parameters()}}


def train_in_one_process(model, inputs, targets):
    """Adam on the whole batch: the gradients of each step, the weights before and after each."""
    optimizer = torch.optim.Adam(model.parameters(), lr=LEARNING_RATE)
    gradients, weights = [], [{name: p.detach().clone() for name, p in model.named_parameters()}]
    for _ in range(TRAIN_STEPS):
        optimizer.zero_grad()
        mean_squared_error(model, inputs, targets).backward()
        gradients.append({name: p.grad.clone() for name, p in model.named_parameters()})
        optimizer.step()
        weights.append({name: p.detach().clone() for name, p in model.named_parameters()})
    return gradients, weights


fp64_model = make_model(torch.float64, SMALL_WIDTHS)
fp64_batch = make_batch(torch.float64, SMALL_WIDTHS, WORLD_SIZE)
reference_gradients, reference_weights = train_in_one_process(copy.deepcopy(fp64_model), *fp64_batch)
sharded = run_ranks(train_sharded, WORLD_SIZE, fp64_model, *fp64_batch, reference_gradients, backend=BACKEND)
gradient_bounds = gradient_error_bounds(fp64_model, *fp64_batch)
adam_bounds = adam_error_bounds(reference_weights, LEARNING_RATE)
largest_use = {"gradients": 0.0, "weights": 0.0}
for rank, result in enumerate(sharded):
    for name in reference_gradients[0]:  # in the model's order
        got, want = result["gradients"][name], shard_rows(reference_gradients[0][name], rank, WORLD_SIZE)
        # Each side within U64 * bound of the exact gradient, in any order of the sums and on any
        # device (float64 has no TF32; an FMA only saves a rounding): apart by at most twice that.
        use = (got - want) / shard_rows(2 * U64 * gradient_bounds[name], rank, WORLD_SIZE)
        torch.testing.assert_close(use, torch.zeros_like(use), rtol=0, atol=1.0,
                                   msg=lambda m, n=name, r=rank: f"rank {r} {n} gradient, over its bound: {m}")
        largest_use["gradients"] = max(largest_use["gradients"], use.abs().max().item())
    for name in reference_gradients[0]:
        assert not torch.equal(reference_weights[-1][name], reference_weights[0][name]), f"{name} did not train"
        got, want = result["weights"][name], shard_rows(reference_weights[-1][name], rank, WORLD_SIZE)
        # Elementwise Adam on equal gradients: each side within U64 * bound, so apart by twice that.
        # The weight's own rounding alone can leave the two a unit in the last place apart at each
        # step, nearly all of its share: allowed twice over (2x headroom).
        use = (got - want) / shard_rows(4 * U64 * adam_bounds[name], rank, WORLD_SIZE)
        torch.testing.assert_close(use, torch.zeros_like(use), rtol=0, atol=1.0,
                                   msg=lambda m, n=name, r=rank: f"rank {r} {n} after Adam, over its bound: {m}")
        largest_use["weights"] = max(largest_use["weights"], use.abs().max().item())
print(f"FSDP2 on {WORLD_SIZE} ranks = one process (float64): reduce-scattered gradients within"
      f" {largest_use['gradients']:.1e} of their rounding bound, weights after {TRAIN_STEPS} Adam steps"
      f" on equal gradients within {largest_use['weights']:.1e} of theirs")

# %%
# Read the result
# ---------------
# The first figure is the reason ZeRO exists: with mixed-precision Adam the
# optimizer state is three quarters of the bytes, and DDP replicates it on
# every GPU. Sharding it (ZeRO-1) recovers most of the memory without any
# extra communication; sharding gradients too (ZeRO-2) is also free; only
# sharding the weights (ZeRO-3, FSDP) costs more traffic, half as much again,
# because every layer's weights are gathered twice per step. "Free" holds for
# the paper's reduce-scatter and all-gather: PyTorch's
# ``ZeroRedundancyOptimizer`` keeps DDP's all-reduce and adds broadcasts, as
# much traffic as ZeRO-3, which the communication table counts.
#
# The tables show the same accounting, measured on real shards: each FSDP
# rank holds its share of every tensor (on two ranks, rank 0 one row more
# where the rows are odd), its weight storage is padded so that all ranks'
# pieces are equal, and the collectives carry exactly the padded bytes predicted. The training
# check shows that none of this changes the result.
#
# What a GPU adds: FSDP2 with a ``MixedPrecisionPolicy`` gathers bf16 weights
# (half the all-gather bytes) while keeping fp32 shards as the master copy,
# and ``torch.cuda.memory_allocated``, printed per rank on 2 or more GPUs,
# also counts the gathered layers and the activations, which no ZeRO stage
# shards. On CPU ranks the gloo collectives move bytes between processes on
# loopback; either way this page counts bytes, it does not time NVLink or
# InfiniBand.

KEY_FIGURES = {
    "device": DEVICE_NAME,
    "backend": BACKEND_NAME,
    "params": params_total,
    "ddp_bytes_per_rank": sum(measured["DDP"][0]["tensor_bytes"].values()),
    "zero3_bytes_rank0": sum(measured["ZeRO-3"][0]["tensor_bytes"].values()),
    "zero3_bytes_rank1": sum(measured["ZeRO-3"][1]["tensor_bytes"].values()),
    "zero3_over_ddp_traffic": round(zero3_over_ddp, 4),
    "fsdp_gradient_error_over_bound": largest_use["gradients"],
    "fsdp_adam_error_over_bound": largest_use["weights"],
    "world_size": WORLD_SIZE,
}
