"""
Tensor parallel: a Megatron MLP block by hand and with DTensor
==============================================================

Tensor parallelism splits each weight matrix of a layer across ranks, so that
every rank holds and multiplies only its slice. We write the two-layer MLP
block of Megatron-LM by hand (the first linear layer split by its output
columns, the second by its input rows, one all-reduce in the forward pass and
one in the backward pass), check it against the unsharded block in float64,
then build the same block with DTensor's ``parallelize_module`` and count the
collectives each layer issues, forward and backward.

**Requirements.** On a CPU: gloo on loopback, 2 ranks. On a single GPU (T4 on
Colab included): the same, gloo on CPU ranks, since the lesson is which bytes
move, not how fast. With 2 or more GPUs: NCCL, one process per GPU (as many
ranks as GPUs where the hidden width divides), at larger sizes: a wider block
and more tokens. The first line of output names the backend the figures come
from. Nothing here is timed.
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
# One MLP block of a transformer: ``up`` widens each token from ``D_MODEL`` to
# ``D_HIDDEN`` features, a GeLU acts on each feature, ``down`` narrows back.
# The sizes are deliberately irregular (neither is a power of two), and the
# hidden width is a multiple of the number of ranks, as Megatron requires.

import copy
import math
import platform

import matplotlib.pyplot as plt
import torch.nn.functional as F
from torch import nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import Shard
from torch.distributed.tensor.debug import CommDebugMode
from torch.distributed.tensor.parallel import (
    ColwiseParallel,
    RowwiseParallel,
    parallelize_module,
)


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
if CAN_RUN_RANKS and torch.cuda.device_count() >= 2 and not USE_NCCL:
    if not torch.cuda.is_initialized() and torch.cuda._device_count_nvml() < 0:
        print(f"{torch.cuda.device_count()} GPUs, but NVML could not count them, and counting them through"
              f" the CUDA runtime has started CUDA here, so no rank can be forked onto them: gloo on CPU ranks instead")
    else:
        print(f"{torch.cuda.device_count()} GPUs, but "
              + ("CUDA is already initialised in this process, so no rank can be forked onto them"
                 if torch.cuda.is_initialized() else "this PyTorch has no NCCL")
              + ": gloo on CPU ranks instead")


def rank_device(rank):
    """Where rank ``rank`` keeps its tensors: its own GPU under NCCL, else the CPU."""
    return torch.device("cuda", rank) if USE_NCCL else torch.device("cpu")


def gpu_name(rank, world_size):
    return torch.cuda.get_device_name(rank)  # it initialises CUDA: only ever asked in a rank


if USE_NCCL:
    D_MODEL, D_HIDDEN, TOKENS = 1021, 4080, 1031  # 4080 splits into 2, 3, 4, 5, 6 or 8 shards
    # As many ranks as GPUs, if the hidden width splits into that many shards.
    WORLD_SIZE = max(n for n in range(2, torch.cuda.device_count() + 1) if D_HIDDEN % n == 0)
    DEVICE_NAME = f"{WORLD_SIZE} x {run_ranks(gpu_name, 1, backend=BACKEND)[0]}"
    print(f"backend: nccl (one process per GPU)   world size: {WORLD_SIZE}   device: {DEVICE_NAME}")
else:
    WORLD_SIZE = 2
    D_MODEL = 29
    D_HIDDEN = 37 * WORLD_SIZE
    TOKENS = 11  # batch x sequence, flattened: the block treats every token alike
    DEVICE_NAME = f"{platform.machine()} CPU, {os.cpu_count()} cores"
    print(f"backend: gloo on CPU ranks (loopback)   world size: {WORLD_SIZE}   device: {DEVICE_NAME}")
DTYPE = torch.float64  # the sharded and the whole block do the same sums: exact up to rounding
torch.manual_seed(0)
print(f"block: {D_MODEL} -> {D_HIDDEN} -> {D_MODEL} features, {TOKENS} tokens, {DTYPE}")
if not CAN_RUN_RANKS:
    skip_or_fail("the tensor-parallel runs", "distributed", WHY_NOT)
    sys.exit(0)  # everything below needs ranks


class MLPBlock(nn.Module):
    """The unsharded block: the reference every sharded version must match."""

    def __init__(self, d_model, d_hidden, dtype):
        super().__init__()
        self.up = nn.Linear(d_model, d_hidden, dtype=dtype)
        self.down = nn.Linear(d_hidden, d_model, dtype=dtype)

    def forward(self, x):
        return self.down(F.gelu(self.up(x)))


# %%
# Predict: what moves, and how much
# ---------------------------------
# Megatron-LM (Shoeybi et al., 2019) writes the block as
# :math:`Z = \mathrm{GeLU}(XA)\,B`. Split :math:`A` by columns,
# :math:`A = [A_1, A_2]`: rank :math:`r` computes
# :math:`Y_r = \mathrm{GeLU}(X A_r)`, its own slice of the hidden features,
# with no communication, because GeLU acts on each feature alone. Split
# :math:`B` by rows to match: :math:`Y_r B_r` is a full-sized but *partial*
# output, and :math:`Z = \sum_r Y_r B_r` is one all-reduce. (``nn.Linear``
# stores :math:`A^T`, so a column of :math:`A` is a row of ``up.weight``.)
#
# Backward mirrors it. Every rank's slice contributes to the gradient of the
# shared input :math:`X`, so that gradient needs one all-reduce; the gradient
# arriving at :math:`Z` is already whole on every rank. Megatron names the two
# conjugate operators :math:`f` (identity forward, all-reduce backward) before
# the block and :math:`g` (all-reduce forward, identity backward) after it.
#
# So per block and step: two all-reduces of a tokens x ``d_model`` tensor of
# activations, whatever the number of ranks. Data parallelism all-reduces the
# *gradients of the weights* instead, once per step. The figure compares the
# two message sizes for a GPT-sized block (``d_model`` = 4096, hidden = 4 x
# that, bf16): tensor parallelism sends activations, so its traffic grows with
# the tokens per step, and it pays it twice in every layer, on the critical
# path. Both messages then cost the same ring factor :math:`2(n-1)/n` per rank.


def tensor_parallel_bytes(tokens, d_model, bytes_per_element):
    """Bytes all-reduced per block per step: one forward, one backward, tokens x d_model each."""
    return 2 * tokens * d_model * bytes_per_element


def data_parallel_bytes(d_model, d_hidden, bytes_per_element):
    """Bytes all-reduced per block per step by data parallelism: every weight's gradient."""
    return (2 * d_model * d_hidden + d_hidden + d_model) * bytes_per_element


GPT_D_MODEL, GPT_BYTES = 4096, 2
token_counts = [2 ** k for k in range(8, 19)]
fig, ax = plt.subplots(figsize=(6.4, 3.8))
tensor_parallel_mib = [tensor_parallel_bytes(t, GPT_D_MODEL, GPT_BYTES) / 2**20 for t in token_counts]
ax.plot(token_counts, tensor_parallel_mib, "o-", label="tensor parallel: activations (2 all-reduces)")
ax.plot(token_counts, [data_parallel_bytes(GPT_D_MODEL, 4 * GPT_D_MODEL, GPT_BYTES) / 2**20]
        * len(token_counts), "--", label="data parallel: weight gradients (1 all-reduce)")
ax.set_xscale("log", base=2)
ax.set_yscale("log", base=2)
ax.set_xlabel("tokens per step through the block")
ax.set_ylabel("MiB all-reduced per block per step")
ax.set_title(f"One MLP block, d_model = {GPT_D_MODEL}, hidden = {4 * GPT_D_MODEL}, bf16 (model)")
ax.legend(loc="upper left", fontsize="small")
fig.tight_layout()

crossover_tokens = data_parallel_bytes(GPT_D_MODEL, 4 * GPT_D_MODEL, 1) / (2 * GPT_D_MODEL)
print(f"tensor parallel sends more than data parallel above {crossover_tokens:.0f} tokens per step"
      f" (about the hidden width, {4 * GPT_D_MODEL})")


# %%
# The block by hand
# -----------------
# The two conjugate operators are ``autograd.Function`` classes of a few lines each.
# Each rank slices its part out of the *same* full block (the ranks are forked
# from this process, so they all see the weights drawn above), which lets us
# compare every shard with the matching slice of the full gradients.


class CopyToRanks(torch.autograd.Function):
    """Megatron's f: identity forward; backward all-reduces the input's gradient."""

    @staticmethod
    def forward(ctx, x):
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        grad = grad.clone()
        dist.all_reduce(grad)
        return grad


class ReduceFromRanks(torch.autograd.Function):
    """Megatron's g: forward all-reduces the partial outputs; identity backward."""

    @staticmethod
    def forward(ctx, partial):
        total = partial.clone()
        dist.all_reduce(total)
        return total

    @staticmethod
    def backward(ctx, grad):
        return grad


def shard_slice(size, rank, world_size):
    """The contiguous block of ``size`` indices that ``rank`` owns."""
    assert size % world_size == 0, f"{size} does not split into {world_size} equal shards"
    per_rank = size // world_size
    return slice(rank * per_rank, (rank + 1) * per_rank)


class ColumnParallelLinear(nn.Module):
    """This rank's output features of ``full``: A's columns, ``weight``'s rows."""

    def __init__(self, full, rank, world_size):
        super().__init__()
        self.rows = shard_slice(full.out_features, rank, world_size)
        self.weight = nn.Parameter(full.weight.detach()[self.rows].clone())
        self.bias = nn.Parameter(full.bias.detach()[self.rows].clone())

    def forward(self, x):
        return F.linear(CopyToRanks.apply(x), self.weight, self.bias)


class RowParallelLinear(nn.Module):
    """This rank's input features of ``full``; the bias is added once, after the sum."""

    def __init__(self, full, rank, world_size):
        super().__init__()
        self.columns = shard_slice(full.in_features, rank, world_size)
        self.weight = nn.Parameter(full.weight.detach()[:, self.columns].clone())
        self.bias = nn.Parameter(full.bias.detach().clone())

    def forward(self, y):
        return ReduceFromRanks.apply(F.linear(y, self.weight)) + self.bias


class TensorParallelMLP(nn.Module):
    def __init__(self, full_block, rank, world_size):
        super().__init__()
        self.up = ColumnParallelLinear(full_block.up, rank, world_size)
        self.down = RowParallelLinear(full_block.down, rank, world_size)

    def forward(self, x):
        return self.down(F.gelu(self.up(x)))


# %%
# A rank runs one forward and backward under ``CommDebugMode``, PyTorch's
# counter of collectives: it sees every collective that reaches the
# dispatcher, ours included, and files it under the module that was running,
# forward or backward. The rank returns its output, its gradients and the
# counts.


def forward_backward_counted(block, x, grad_z):
    """Output, input gradient and per-module collective counts of one step."""
    x = x.clone().requires_grad_()
    comm_mode = CommDebugMode()
    with comm_mode:
        z = block(x)
        z.backward(grad_z)
    counts = {module: {phase: sum(ops.values()) for phase, ops in phases.items()}
              for module, phases in comm_mode.comm_module_counts.items()}
    kinds = sorted({str(op) for op in comm_mode.get_comm_counts()})
    return z.detach().clone(), x.grad, counts, kinds


def bounds(index_slice):
    """A slice as (start, stop): what a rank can send back to the parent."""
    return index_slice.start, index_slice.stop


def hand_tensor_parallel(rank, world_size, full_block, x, grad_z):
    device = rank_device(rank)
    block = TensorParallelMLP(full_block, rank, world_size).to(device)
    z, grad_x, counts, kinds = forward_backward_counted(block, x.to(device), grad_z.to(device))
    grads = {name: p.grad.cpu() for name, p in block.named_parameters()}
    return {"z": z.cpu(), "grad_x": grad_x.cpu(), "grads": grads, "counts": counts, "kinds": kinds,
            "rows": bounds(block.up.rows), "columns": bounds(block.down.columns)}


full_block = MLPBlock(D_MODEL, D_HIDDEN, DTYPE)
x = torch.randn(TOKENS, D_MODEL, dtype=DTYPE)
grad_z = torch.randn(TOKENS, D_MODEL, dtype=DTYPE)  # random upstream gradient: no loss hides a term
hand_ranks = run_ranks(hand_tensor_parallel, WORLD_SIZE, full_block, x, grad_z, backend=BACKEND)

# %%
# Verify against the unsharded block
# ----------------------------------
# The reference runs the whole block in this process. Every rank's output and
# input gradient must equal the whole block's, and every shard's gradient the
# matching slice of the whole block's gradient. The sharded block adds the
# same products in a different order, split into partial sums and all-reduced,
# on other devices too; the tolerance bounds that rounding element by element,
# by running error analysis (Higham 2002, chapter 3): a sum of n terms, in any
# order, is off by at most n float64 rounding steps of the sum of its terms'
# absolute values, plus the errors its inputs carry. A wrong slice is off by
# order one.


def reference_step(block, x, grad_z):
    x = x.clone().requires_grad_()
    z = block(x)
    z.backward(grad_z)
    return z.detach(), x.grad, {name: p.grad for name, p in block.named_parameters()}


def gelu_slope(h):
    """GeLU's derivative, Phi(h) + h phi(h): at most 1.13 in size, its own derivative at most 0.8."""
    return 0.5 * (1 + torch.erf(h / math.sqrt(2))) + h * torch.exp(-h.square() / 2) / math.sqrt(2 * math.pi)


@torch.no_grad()
def rounding_bounds(block, x, grad_z):
    """Each float64 result of a forward and backward step is within 2**-53 times its bound of the exact one.

    Running error analysis, to first order: a sum of n products a_k w_k whose
    factors are off by e(a_k) and e(w_k) is off by at most
    sum(|w_k| e(a_k) + |a_k| e(w_k)) + n sum |a_k w_k| rounding steps, in any
    order and grouping of the sum (partial sums on ranks, then an all-reduce);
    GeLU and its slope add 8 steps each. ``x`` and ``grad_z`` are exact.
    """
    up, down, tokens = block.up, block.down, x.shape[0]
    h = F.linear(x, up.weight, up.bias)
    h_error = (up.in_features + 1) * (x.abs() @ up.weight.abs().T + up.bias.abs())
    y, slope = F.gelu(h), gelu_slope(h)
    y_error = 1.13 * h_error + 8 * h.abs()
    z_error = y_error @ down.weight.abs().T + (down.in_features + 1) * (y.abs() @ down.weight.abs().T
                                                                        + down.bias.abs())
    grad_y = grad_z @ down.weight
    grad_h = grad_y * slope
    grad_h_error = (down.out_features * (grad_z.abs() @ down.weight.abs()) * slope.abs()
                    + grad_y.abs() * (0.8 * h_error + 8) + grad_h.abs())
    return {
        "z": z_error,
        "grad_x": grad_h_error @ up.weight.abs() + up.out_features * grad_h.abs() @ up.weight.abs(),
        "down.weight": grad_z.abs().T @ y_error + tokens * grad_z.abs().T @ y.abs(),
        "down.bias": tokens * grad_z.abs().sum(0),
        "up.weight": grad_h_error.T @ x.abs() + tokens * grad_h.abs().T @ x.abs(),
        "up.bias": grad_h_error.sum(0) + tokens * grad_h.abs().sum(0),
    }


def assert_within_rounding(actual, expected, bound, what):
    """Both sides are within 2**-53 * bound of the exact value: apart by at most twice that."""
    use = (actual - expected) / (2 * 2**-53 * bound)
    torch.testing.assert_close(use, torch.zeros_like(use), rtol=0, atol=1.0,
                               msg=lambda message: f"{what} (difference over its bound): {message}")


def check_sharded_against_whole(ranks, reference, shard_of):
    """Outputs and input gradients whole on every rank; each parameter gradient its slice."""
    z_ref, grad_x_ref, grads_ref = reference
    for rank, result in enumerate(ranks):
        assert_within_rounding(result["z"], z_ref, BOUNDS["z"], f"rank {rank} output")
        assert_within_rounding(result["grad_x"], grad_x_ref, BOUNDS["grad_x"], f"rank {rank} input gradient")
        for name, grad in result["grads"].items():
            where = shard_of(name, result)
            assert_within_rounding(grad, grads_ref[name][where], BOUNDS[name][where],
                                   f"rank {rank} gradient of {name}")


def hand_shard_of(name, result):
    """Which part of the whole gradient a hand-sharded parameter's gradient is."""
    rows, columns = slice(*result["rows"]), slice(*result["columns"])
    return {"up.weight": rows, "up.bias": rows,
            "down.weight": (slice(None), columns), "down.bias": slice(None)}[name]


reference = reference_step(copy.deepcopy(full_block), x, grad_z)
BOUNDS = rounding_bounds(full_block, x, grad_z)
check_sharded_against_whole(hand_ranks, reference, hand_shard_of)
print(f"hand-written tensor parallel: outputs, input gradients and the"
      f" {len(hand_ranks[0]['grads'])} parameter gradients of {WORLD_SIZE} ranks"
      f" match the whole block (float64)")

# %%
# Count the collectives
# ---------------------
# The prediction, as an assertion: the column-parallel layer communicates only
# in backward (``f``), the row-parallel layer only in forward (``g``), one
# all-reduce each. ``Global`` is the whole step.

PREDICTED_HAND_COUNTS = {
    "TensorParallelMLP.up": {"forward": 0, "backward": 1},
    "TensorParallelMLP.down": {"forward": 1, "backward": 0},
    "Global": {"forward": 1, "backward": 1},
}


def check_counts(measured, predicted, kinds, expected_kinds):
    for module, phases in predicted.items():
        got = {phase: measured.get(module, {}).get(phase, 0) for phase in phases}
        assert got == phases, f"{module}: collectives {got}, predicted {phases}"
    assert kinds == expected_kinds, f"collectives {kinds}, expected only {expected_kinds}"


def print_counts(title, counts, predicted):
    print(f"{title:<34}{'forward':>9}{'backward':>10}")
    for module in predicted:
        phases = counts.get(module, {})
        print(f"  {module:<32}{phases.get('forward', 0):>9}{phases.get('backward', 0):>10}")


for result in hand_ranks:
    check_counts(result["counts"], PREDICTED_HAND_COUNTS, result["kinds"], ["c10d.allreduce_"])
print_counts("all-reduces per step, by hand", hand_ranks[0]["counts"], PREDICTED_HAND_COUNTS)
print(f"each all-reduce: {TOKENS} x {D_MODEL} float64 = {TOKENS * D_MODEL * 8} bytes")

# %%
# The same block with DTensor
# ---------------------------
# ``parallelize_module`` does the slicing for us: ``ColwiseParallel`` shards
# ``up.weight`` along dimension 0 (``Shard(0)``), ``RowwiseParallel`` shards
# ``down.weight`` along dimension 1, on a one-dimensional ``DeviceMesh``
# of all ranks (of CPUs, or of GPUs under NCCL). The parameters become DTensors: a local shard plus its
# placement. We check that DTensor picked the same slices as our hand version,
# compare outputs and gradients with the whole block, and count again.


def dtensor_tensor_parallel(rank, world_size, full_block, x, grad_z):
    device = rank_device(rank)
    mesh = init_device_mesh(device.type, (world_size,))
    block = parallelize_module(copy.deepcopy(full_block).to(device), mesh,
                               {"up": ColwiseParallel(), "down": RowwiseParallel()})
    z, grad_x, counts, kinds = forward_backward_counted(block, x.to(device), grad_z.to(device))
    placements = {name: str(tuple(p.placements)) for name, p in block.named_parameters()}
    local_weights = {name: p.to_local().detach().clone().cpu() for name, p in block.named_parameters()}
    grads = {name: p.grad.to_local().cpu() for name, p in block.named_parameters()}
    hand = TensorParallelMLP(full_block, rank, world_size)  # on the CPU, as the parent compares
    return {"z": z.cpu(), "grad_x": grad_x.cpu(), "grads": grads, "counts": counts, "kinds": kinds,
            "placements": placements, "local_weights": local_weights,
            "hand_weights": {name: p.detach() for name, p in hand.named_parameters()},
            "rows": bounds(hand.up.rows), "columns": bounds(hand.down.columns)}


dtensor_ranks = run_ranks(dtensor_tensor_parallel, WORLD_SIZE, full_block, x, grad_z, backend=BACKEND)

for rank, result in enumerate(dtensor_ranks):
    assert result["placements"]["up.weight"] == str((Shard(0),)), result["placements"]
    assert result["placements"]["down.weight"] == str((Shard(1),)), result["placements"]
    for name, local in result["local_weights"].items():
        assert torch.equal(local, result["hand_weights"][name]), \
            f"rank {rank} {name}: DTensor's shard is not the slice we took by hand"
check_sharded_against_whole(dtensor_ranks, reference, hand_shard_of)
print("DTensor tensor parallel: the same shards as by hand;"
      " outputs and gradients match the whole block")

PREDICTED_DTENSOR_COUNTS = {
    "MLPBlock.up": {"forward": 0, "backward": 1},
    "MLPBlock.down": {"forward": 1, "backward": 0},
    "Global": {"forward": 1, "backward": 1},
}
for result in dtensor_ranks:
    check_counts(result["counts"], PREDICTED_DTENSOR_COUNTS, result["kinds"],
                 ["c10d_functional.all_reduce"])
print_counts("all-reduces per step, DTensor", dtensor_ranks[0]["counts"], PREDICTED_DTENSOR_COUNTS)

# %%
# Read the result
# ---------------
# Both versions communicate exactly what the algebra predicts: one all-reduce
# of the activations in forward (after the row-parallel layer) and one in
# backward (before the column-parallel layer), nothing for the GeLU between
# them, whatever the hidden width. DTensor issues them as functional
# collectives (``c10d_functional.all_reduce``), our hand version calls
# ``dist.all_reduce`` (``c10d.allreduce_``); the counts agree.
#
# What this buys: each rank stores and multiplies ``1 / n`` of the block's
# weights, gradients and optimizer state. What it costs: the two all-reduces
# are on the critical path of every layer, and, as the figure shows, their
# size grows with the tokens per step. That is why tensor parallelism is kept
# inside one node, where the GPUs share NVLink, while data parallelism and
# FSDP span nodes. An attention block splits the same way, by heads: the
# query, key and value projections column-parallel, the output projection
# row-parallel.
#
# The all-reduces here are gloo between CPU processes on loopback, or NCCL
# between GPUs, as the first line of output says: this page counts bytes and
# collectives, it does not time them.

KEY_FIGURES = {
    "hand_allreduces_forward": hand_ranks[0]["counts"]["Global"]["forward"],
    "hand_allreduces_backward": hand_ranks[0]["counts"]["Global"]["backward"],
    "dtensor_allreduces_forward": dtensor_ranks[0]["counts"]["Global"]["forward"],
    "dtensor_allreduces_backward": dtensor_ranks[0]["counts"]["Global"]["backward"],
    "allreduce_bytes": TOKENS * D_MODEL * 8,
    "world_size": WORLD_SIZE,
}
