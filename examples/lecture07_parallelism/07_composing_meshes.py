"""
Composing parallelisms on a device mesh: FSDP2 with tensor and sequence parallel, and HSDP
==========================================================================================

A large training run combines several ways of splitting the work, each along
one dimension of a grid of ranks, the *device mesh*. On four ranks arranged
as a 2 x 2 mesh we run a small stack of transformer-like MLP blocks with
tensor parallel, with tensor and sequence parallel, with FSDP2 on top of
both, with FSDP over all four ranks and with hybrid sharding (HSDP). Each
run must match one process in float64, and each collective it issues is
counted, with the mesh dimension it runs on and its bytes, against the
counts the algebra predicts.

**Requirements.** On a CPU: gloo on loopback, 4 ranks. On 4 or more GPUs:
NCCL, 4 ranks, one per GPU, at larger sizes. On 2 or 3 GPUs, or where CUDA
is already initialised in this process: gloo on CPU ranks, as on a CPU. The
first line of output names the backend the figures come from. Nothing here
is timed: the lesson is which bytes move on which group of ranks.
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
# A stack of two blocks, each a layer norm and a Megatron MLP (a linear layer
# up to ``D_HIDDEN`` features, a GeLU, a linear layer back down to
# ``D_MODEL``) with a residual connection around them: a transformer layer
# without its attention block (which tensor parallel splits the same way, by
# heads). The sizes are deliberately irregular (no power of two). Every
# activation size that a mesh dimension splits divides evenly: the hidden
# width and the sequence by the 2 ranks of tensor and sequence parallel, the
# batch by the 4 ranks of data parallel. The parameters' rows, which FSDP
# splits, not all do: FSDP pads them (below).

import copy
import math
import platform
import warnings
from fractions import Fraction

import matplotlib.pyplot as plt
import torch.nn.functional as F
from matplotlib.patches import FancyBboxPatch
from torch import nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor import DTensor, Replicate, Shard
from torch.distributed.tensor.debug import CommDebugMode
from torch.distributed.tensor.parallel import (
    ColwiseParallel,
    RowwiseParallel,
    SequenceParallel,
    parallelize_module,
)
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten


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

WORLD_SIZE = 4  # a 2 x 2 mesh
# NCCL needs one process per GPU, and CUDA must not be initialised before the fork. Where NVML
# fails, device_count() asks the CUDA runtime, which starts the driver and so breaks the fork
# too, unseen by is_initialized(); only the private _device_count_nvml() tells (< 0: failed).
USE_NCCL = (CAN_RUN_RANKS and torch.cuda.device_count() >= WORLD_SIZE and not torch.cuda.is_initialized()
            and torch.cuda._device_count_nvml() >= 0 and dist.is_nccl_available())
BACKEND = "cpu:gloo,cuda:nccl" if USE_NCCL else "gloo"
if CAN_RUN_RANKS and torch.cuda.device_count() >= 2 and not USE_NCCL:
    if torch.cuda.device_count() < WORLD_SIZE:
        print(f"{torch.cuda.device_count()} GPUs, but this example needs 4, one per rank:"
              f" gloo on CPU ranks instead")
    elif torch.cuda.is_initialized():
        print(f"{torch.cuda.device_count()} GPUs, but CUDA is already initialised in this process,"
              f" so no rank can be forked onto them: gloo on CPU ranks instead")
    elif torch.cuda._device_count_nvml() < 0:
        print(f"{torch.cuda.device_count()} GPUs, but NVML could not count them, and counting them through"
              f" the CUDA runtime has started CUDA here, so no rank can be forked onto them: gloo on CPU ranks instead")
    else:
        print(f"{torch.cuda.device_count()} GPUs, but this PyTorch has no NCCL: gloo on CPU ranks instead")


def rank_device(rank):
    """Where rank ``rank`` keeps its tensors: its own GPU under NCCL, else the CPU."""
    return torch.device("cuda", rank) if USE_NCCL else torch.device("cpu")


def gpu_name(rank, world_size):
    return torch.cuda.get_device_name(rank)  # it initialises CUDA: only ever asked in a rank


if USE_NCCL:
    D_MODEL, D_HIDDEN, SEQUENCE, BATCH = 253, 2 * 509, 2 * 257, 4 * 3
    DEVICE_NAME = f"{WORLD_SIZE} x {run_ranks(gpu_name, 1, backend=BACKEND)[0]}"
    print(f"backend: nccl (one process per GPU)   world size: {WORLD_SIZE}   device: {DEVICE_NAME}")
else:
    D_MODEL, D_HIDDEN, SEQUENCE, BATCH = 13, 2 * 17, 2 * 7, 4 * 3
    DEVICE_NAME = f"{platform.machine()} CPU, {os.cpu_count()} cores"
    print(f"backend: gloo on CPU ranks (loopback)   world size: {WORLD_SIZE}   device: {DEVICE_NAME}")
BLOCKS = 2
DTYPE = torch.float64  # every run does the reference's sums in another order: equal up to rounding
ELEMENT_BYTES = torch.empty(0, dtype=DTYPE).element_size()
LEARNING_RATE = 0.1
SETUPS = ("TP", "TP+SP", "FSDP x TP+SP", "FSDP", "HSDP")
print(f"{BLOCKS} blocks: {D_MODEL} -> {D_HIDDEN} -> {D_MODEL} features; batch {BATCH} sequences"
      f" of {SEQUENCE} tokens; {DTYPE}")
if not CAN_RUN_RANKS:
    skip_or_fail("the device-mesh runs", "distributed", WHY_NOT)
    sys.exit(0)  # everything below needs ranks


class Block(nn.Module):
    """x + down(GeLU(up(norm(x)))): a transformer layer's MLP half, residual included."""

    def __init__(self, d_model, d_hidden, dtype):
        super().__init__()
        self.norm = nn.LayerNorm(d_model, dtype=dtype)
        self.up = nn.Linear(d_model, d_hidden, dtype=dtype)
        self.down = nn.Linear(d_hidden, d_model, dtype=dtype)

    def forward(self, x):
        return x + self.down(F.gelu(self.up(self.norm(x))))


def make_model():
    """The blocks every run starts from, with a norm whose weights are not all ones."""
    torch.manual_seed(0)
    model = nn.Sequential(*(Block(D_MODEL, D_HIDDEN, DTYPE) for _ in range(BLOCKS)))
    with torch.no_grad():
        for block in model:
            block.norm.weight.copy_(1 + 0.1 * torch.randn(D_MODEL, dtype=DTYPE))
            block.norm.bias.copy_(0.1 * torch.randn(D_MODEL, dtype=DTYPE))
    return model


# %%
# Predict: the mesh and its groups
# --------------------------------
# ``init_device_mesh(device, (2, 2), mesh_dim_names=("dp", "tp"))`` lays the
# ranks out row by row, as ``torch.arange(4).view(2, 2)``: rank
# :math:`r = 2i + j` sits at row :math:`i`, column :math:`j`. A collective
# along one dimension runs among the ranks that share the other coordinate,
# so ``mesh["tp"]`` is a row, {0, 1} or {2, 3}, and ``mesh["dp"]`` a column,
# {0, 2} or {1, 3} (lecture 7, :ref:`l7-combining`). Launchers such as
# ``torchrun`` number the ranks of a node consecutively, so the groups of the
# *last* dimension are the ones that stay inside a node. That is why tensor
# parallel, whose traffic is the largest and on the critical path, is the
# last dimension; in this figure, a model of two nodes of two GPUs, its rows
# are the nodes. HSDP's mesh, ``("replicate", "shard")``, has the same
# groups: it shards inside a node and replicates across nodes.

RANKS_PER_NODE = 2  # the model of the figures: consecutive pairs of ranks share a node
MESH_SHAPE = (2, 2)


def predicted_group(dim, rank):
    """The ranks of ``rank``'s group along ``dim``: its row for a mesh's last dimension, its column for the first."""
    row, column = divmod(rank, MESH_SHAPE[1])
    if dim == "fsdp":  # the one dimension of a flat mesh of all the ranks
        return tuple(range(WORLD_SIZE))
    if dim in ("tp", "shard"):
        return tuple(MESH_SHAPE[1] * row + j for j in range(MESH_SHAPE[1]))
    return tuple(MESH_SHAPE[1] * i + column for i in range(MESH_SHAPE[0]))



def draw_mesh(ax, names, row_label, column_label):
    """The 2 x 2 grid of ranks: rows are groups of the last dimension, columns of the first."""
    for i in range(MESH_SHAPE[0]):
        ax.add_patch(FancyBboxPatch((-0.35, -i - 0.3), 1.7, 0.6, boxstyle="round,pad=0.05",
                                    facecolor="tab:blue", alpha=0.15, edgecolor="tab:blue"))
        ax.text(-0.5, -i, f"node {i}", ha="right", va="center", color="tab:blue", fontsize="small")
        for j in range(MESH_SHAPE[1]):
            ax.text(j, -i, f"rank {MESH_SHAPE[1] * i + j}", ha="center", va="center",
                    bbox={"boxstyle": "round", "facecolor": "white", "edgecolor": "black"})
    for j in range(MESH_SHAPE[1]):
        ax.plot([j, j], [-0.18, -0.82], color="tab:red", lw=2, ls="--")
    ax.text(0.5, 0.42, row_label, ha="center", color="tab:blue", fontsize="small")
    ax.text(1.45, -0.5, column_label, ha="left", va="center", color="tab:red", fontsize="small")
    ax.set_title(names, fontsize="medium")
    ax.set_xlim(-1.1, 3.0)
    ax.set_ylim(-1.5, 0.9)
    ax.axis("off")


fig, axes = plt.subplots(1, 2, figsize=(10.4, 3.6))
draw_mesh(axes[0], "TP, TP+SP, FSDP x TP+SP: mesh (dp, tp)",
          "tp, a row: activations:\nall-reduce, or all-gather + reduce-scatter",
          "dp, a column:\nweights: all-gathers\ngradients:\nreduce-scatter")
draw_mesh(axes[1], "HSDP: mesh (replicate, shard)",
          "shard, a row: weights: all-gathers,\ngradients: reduce-scatter",
          "replicate, a column:\ngradient shards:\nall-reduce")
fig.suptitle(f"Which ranks each collective joins on a (2, 2) mesh, rows one node each (a model);"
             f" {WORLD_SIZE} ranks on {DEVICE_NAME}", fontsize="medium")
fig.tight_layout()

# %%
# Predict: what each setup sends
# ------------------------------
# Let a data-parallel row of the mesh hold :math:`b` sequences of :math:`s`
# tokens, so the activations between two blocks are a tensor of
# :math:`A = b\,s\,h` elements, :math:`h` = ``D_MODEL``. Per block and
# training step:
#
# * **Tensor parallel (TP)**, Megatron's column-then-row split: one all-reduce
#   of :math:`A` in forward (after ``down``) and one in backward (of the
#   gradient at ``up``'s input), as in
#   :ref:`sphx_glr_auto_examples_lecture07_parallelism_04_tensor_parallel.py`.
# * **Sequence parallel (SP)** (Korthikanti et al., 2023) keeps the norm and
#   the residual sharded along the sequence: ``SequenceParallel`` for the
#   norm, ``ColwiseParallel(input_layouts=Shard(1))`` for ``up`` (an
#   all-gather of the tokens before it) and
#   ``RowwiseParallel(output_layouts=Shard(1))`` for ``down`` (a
#   reduce-scatter after it). Each all-reduce becomes an all-gather and a
#   reduce-scatter of :math:`A`, in forward and in backward alike: four
#   collectives per block, eight per transformer layer with its attention
#   block, the same bytes as TP's two all-reduces, since by the ring formula
#   each rank of :math:`t` sends :math:`\frac{t-1}{t}A` in each half and
#   :math:`2\frac{t-1}{t}A` in an all-reduce. One thing is new: the norm's
#   weight and bias are replicated, but each rank computes their gradient
#   from its own tokens only, a *partial* sum, so each needs an all-reduce of
#   ``D_MODEL`` elements once per step, as Megatron-LM reduces its
#   sequence-parallel norms' gradients.
# * **FSDP2 on dp** (``fully_shard`` on each block, then on the stack) adds,
#   on the dp group, an all-gather of the block's weights before its forward,
#   a second one before its backward (``reshard_after_forward=True``, ZeRO-3)
#   and a reduce-scatter of its gradients: :math:`3\frac{d-1}{d}P` per rank,
#   where :math:`P` is the block's parameters *as tensor parallel left them*
#   (the rank's slice of ``up`` and ``down``), each padded along its first
#   dimension to a multiple of :math:`d`, as in
#   :ref:`sphx_glr_auto_examples_lecture07_parallelism_03_zero_and_fsdp.py`.
#   The tensor-parallel traffic does not change.
# * **FSDP over all 4 ranks**: the same three collectives of the whole block,
#   on one group that spans both nodes.
# * **HSDP**, ``fully_shard`` on the 2-D mesh ``("replicate", "shard")``:
#   the all-gathers and the reduce-scatter run on the shard group, inside a
#   node, over the block padded to a multiple of 2; then the replicas
#   all-reduce their gradient *shards*, half a block, across nodes. With
#   :math:`r` replicas of shard groups of :math:`k` ranks, a rank sends
#   :math:`3\frac{k-1}{k}P` inside its node and only
#   :math:`2\frac{r-1}{r}\frac{P}{k}` across nodes.
#
# The functions below write these rules down as the list of collectives each
# rank must issue: (pass, mesh dimension, collective, bytes of the whole
# buffer, as nccl-tests counts message size).

TP_LOCAL_SHAPES = {  # each block's parameters as tensor parallel over 2 ranks leaves them on a rank
    "norm.weight": (D_MODEL,), "norm.bias": (D_MODEL,), "up.weight": (D_HIDDEN // 2, D_MODEL),
    "up.bias": (D_HIDDEN // 2,), "down.weight": (D_MODEL, D_HIDDEN // 2), "down.bias": (D_MODEL,)}
FULL_SHAPES = {"norm.weight": (D_MODEL,), "norm.bias": (D_MODEL,), "up.weight": (D_HIDDEN, D_MODEL),
               "up.bias": (D_HIDDEN,), "down.weight": (D_MODEL, D_HIDDEN), "down.bias": (D_MODEL,)}
ROWS_PER_DP_GROUP = BATCH // 2
ACTIVATION_BYTES = ELEMENT_BYTES * ROWS_PER_DP_GROUP * SEQUENCE * D_MODEL  # A, between two blocks
NORM_GRADIENT_BYTES = ELEMENT_BYTES * D_MODEL  # a norm's weight or bias


def rows_on_rank(rows, index, ranks):
    """Rows of dimension 0 that shard ``index`` keeps when ``torch.chunk`` cuts ``rows`` into ``ranks``."""
    per_rank = math.ceil(rows / ranks)
    return max(0, min(per_rank, rows - index * per_rank))


def padded_bytes(shapes, ranks):
    """Bytes of FSDP's all-gather buffer: every tensor's rows padded to a multiple of ``ranks``."""
    return ELEMENT_BYTES * sum(math.ceil(shape[0] / ranks) * ranks * math.prod(shape[1:])
                               for shape in shapes.values())


def predicted_collectives(setup):
    """(pass, mesh dimension, collective, bytes) of every collective one rank issues in one step, sorted."""
    activations, norm_gradient = ACTIVATION_BYTES, NORM_GRADIENT_BYTES
    per_block = {
        "TP": [("forward", "tp", "all-reduce", activations), ("backward", "tp", "all-reduce", activations)],
        "TP+SP": [("forward", "tp", "all-gather", activations), ("forward", "tp", "reduce-scatter", activations),
                  ("backward", "tp", "all-gather", activations), ("backward", "tp", "reduce-scatter", activations),
                  ("after backward", "tp", "all-reduce", norm_gradient),
                  ("after backward", "tp", "all-reduce", norm_gradient)],
    }
    sequence_parallel = [(phase if phase != "after backward" else "backward", dim, kind, size)
                         for phase, dim, kind, size in per_block["TP+SP"]]  # FSDP2 reduces them in backward
    per_block["FSDP x TP+SP"] = sequence_parallel + zero3("dp", padded_bytes(TP_LOCAL_SHAPES, 2))
    per_block["FSDP"] = zero3("fsdp", padded_bytes(FULL_SHAPES, 4))
    shards = padded_bytes(FULL_SHAPES, 2)
    per_block["HSDP"] = zero3("shard", shards) + [("backward", "replicate", "all-reduce", shards // 2)]
    return sorted(per_block[setup] * BLOCKS)


def zero3(dim, block_bytes):
    """FSDP2 with resharding after forward: gather for forward, again for backward, reduce-scatter."""
    return [("forward", dim, "all-gather", block_bytes), ("backward", dim, "all-gather", block_bytes),
            ("backward", dim, "reduce-scatter", block_bytes)]


def ring_bytes_sent(kind, group_size, size):
    """Bytes one rank sends in a ring: (n - 1)/n of the buffer for each half, twice that for an all-reduce."""
    return Fraction(2 if kind == "all-reduce" else 1) * (group_size - 1) * size / group_size


def predicted_held(setup, rank):
    """Parameter elements that ``rank`` keeps between steps."""
    dp, tp = divmod(rank, 2)
    if setup in ("TP", "TP+SP"):
        return BLOCKS * sum(math.prod(shape) for shape in TP_LOCAL_SHAPES.values())
    shapes, index, ranks = {"FSDP x TP+SP": (TP_LOCAL_SHAPES, dp, 2), "FSDP": (FULL_SHAPES, rank, 4),
                            "HSDP": (FULL_SHAPES, tp, 2)}[setup]
    return BLOCKS * sum(rows_on_rank(shape[0], index, ranks) * math.prod(shape[1:]) for shape in shapes.values())


def activation_collectives(setup, phase):
    """How many of each collective of the activations one block issues in ``phase``."""
    found = [kind for p, _, kind, size in predicted_collectives(setup) if p == phase and size == ACTIVATION_BYTES]
    return {kind: found.count(kind) // BLOCKS for kind in ("all-reduce", "all-gather", "reduce-scatter")}


def activation_bytes_sent(setup):
    return sum(ring_bytes_sent(kind, 2, size) for _, _, kind, size in predicted_collectives(setup)
               if size == ACTIVATION_BYTES)


assert ACTIVATION_BYTES not in (NORM_GRADIENT_BYTES, padded_bytes(TP_LOCAL_SHAPES, 2))  # told apart by size
for phase in ("forward", "backward"):
    assert activation_collectives("TP", phase) == {"all-reduce": 1, "all-gather": 0, "reduce-scatter": 0}
    assert activation_collectives("TP+SP", phase) == {"all-reduce": 0, "all-gather": 1, "reduce-scatter": 1}
assert activation_bytes_sent("TP+SP") == activation_bytes_sent("TP")  # the ring formula: AG + RS = AR
print(f"predicted collectives of the activations per block, on the tp group ({ACTIVATION_BYTES} bytes each):")
print(f"{'setup':<8}{'pass':<10}{'all-reduce':>11}{'all-gather':>11}{'reduce-scatter':>15}")
for setup in ("TP", "TP+SP"):
    for phase in ("forward", "backward"):
        counts = activation_collectives(setup, phase)
        print(f"{setup:<8}{phase:<10}{counts['all-reduce']:>11}{counts['all-gather']:>11}"
              f"{counts['reduce-scatter']:>15}")
layer_collectives = {setup: 2 * sum(sum(activation_collectives(setup, phase).values())
                                    for phase in ("forward", "backward")) for setup in ("TP", "TP+SP")}
print(f"a transformer layer (attention and MLP blocks): {layer_collectives['TP']} with TP,"
      f" {layer_collectives['TP+SP']} with TP+SP; both send {int(activation_bytes_sent('TP'))} bytes per rank"
      f" for these {BLOCKS} blocks")

# %%
# Implement: five setups on the same four ranks
# ---------------------------------------------
# Every setup starts from the same blocks and the same batch of
# ``BATCH`` sequences. Tensor parallel shards the weights of ``up`` and
# ``down`` over ``mesh["tp"]`` with ``parallelize_module``; with sequence
# parallel, each rank of a tp group also gets only its half of the tokens.
# FSDP2's ``fully_shard`` goes on each block, then on the stack. Each
# data-parallel group of ranks gets its own share of the batch: a row of the
# (dp, tp) mesh half of it, each rank of FSDP and HSDP a quarter. The TP and
# TP+SP runs have no data-parallel step, so each row trains on its half
# alone.
#
# The loss is the mean squared error against random targets, normalised by
# the elements of the share a rank's gradient stands for (with sequence
# parallel, a tp group's, so that the two halves of the tokens add up), and
# FSDP2 averages the gradients over its data-parallel ranks: the mean over
# the whole batch. The input requires its gradient, as a layer's input does
# inside a deep model.


def tensor_parallel_plan(sequence_parallel):
    if not sequence_parallel:
        return {"up": ColwiseParallel(), "down": RowwiseParallel()}
    return {"norm": SequenceParallel(), "up": ColwiseParallel(input_layouts=Shard(1)),
            "down": RowwiseParallel(output_layouts=Shard(1))}


def shard_blocks(model, mesh):
    for block in model:
        fully_shard(block, mesh=mesh, reshard_after_forward=True)  # gather again for backward: ZeRO-3
    fully_shard(model, mesh=mesh)


def make_meshes(device_type):
    """The three meshes of the five setups, built once: each mesh's groups are made when it is."""
    return {"dp, tp": init_device_mesh(device_type, MESH_SHAPE, mesh_dim_names=("dp", "tp")),
            "fsdp": init_device_mesh(device_type, (WORLD_SIZE,), mesh_dim_names=("fsdp",)),
            "replicate, shard": init_device_mesh(device_type, MESH_SHAPE, mesh_dim_names=("replicate", "shard"))}


def build(setup, model, meshes):
    """The setup's model on this rank, and the mesh it runs on."""
    if setup == "FSDP":
        mesh = meshes["fsdp"]
        shard_blocks(model, mesh)
    elif setup == "HSDP":
        mesh = meshes["replicate, shard"]
        shard_blocks(model, mesh)  # a 2-D mesh: shard along the last dimension, replicate along the first
    else:
        mesh = meshes["dp, tp"]
        for block in model:
            parallelize_module(block, mesh["tp"], tensor_parallel_plan(setup != "TP"))
        if setup == "FSDP x TP+SP":
            shard_blocks(model, mesh["dp"])
    return model, mesh


def rank_share(setup, rank, inputs, targets):
    """This rank's part of the batch, and how many ranks split the tokens of its data-parallel share."""
    if setup in ("FSDP", "HSDP"):
        rows = slice(rank * BATCH // WORLD_SIZE, (rank + 1) * BATCH // WORLD_SIZE)
        return inputs[rows], targets[rows], 1
    dp, tp = divmod(rank, 2)
    rows = slice(dp * ROWS_PER_DP_GROUP, (dp + 1) * ROWS_PER_DP_GROUP)
    inputs, targets = inputs[rows], targets[rows]
    if setup == "TP":
        return inputs, targets, 1
    return inputs.chunk(2, dim=1)[tp].contiguous(), targets.chunk(2, dim=1)[tp].contiguous(), 2


def reduce_partial_gradients(model):
    """Sequence parallel leaves the norms' gradients partial on each tp rank: sum them, as FSDP2 would."""
    for p in model.parameters():
        if isinstance(p.grad, DTensor) and any(place.is_partial() for place in p.grad.placements):
            p.grad = p.grad.redistribute(placements=p.placements)


def whole(tensor):
    """A DTensor's full value (collectives, outside the counted step), or a plain tensor."""
    if not isinstance(tensor, DTensor):
        return tensor.detach().cpu()
    # One mesh dimension at a time: FSDP's strided shards of TP's shards gather in order.
    first_gathered = tensor.redistribute(placements=[Replicate(), *tensor.placements[1:]])
    return first_gathered.full_tensor().detach().cpu()


def local_elements(tensor):
    return tensor.to_local().numel() if isinstance(tensor, DTensor) else tensor.numel()


# %%
# Two counters watch the step. ``CommDebugMode``, DTensor's own, counts the
# collectives of its lists that reach the dispatcher: DTensor's functional
# collectives (``_c10d_functional``) and also FSDP2's c10d ones. FSDP2 calls
# ``dist.all_gather_into_tensor`` and ``dist.reduce_scatter_tensor`` in torch
# 2.11 and ``dist.all_gather_single`` and ``dist.reduce_scatter_single`` in
# 2.13, all of which reach the dispatcher as ``c10d._allgather_base_`` and
# ``c10d._reduce_scatter_base_``, and, for HSDP's replicas,
# ``dist.all_reduce``, ``c10d.allreduce_``. Its counts do not say on which
# group a collective ran, or how many bytes it moved; a ``TorchDispatchMode`` of a
# few lines does, reading the group from the op's ``group_name`` or
# ``process_group`` argument. Its totals must equal ``CommDebugMode``'s.

COLLECTIVE_KINDS = {"all_reduce": "all-reduce", "allreduce_": "all-reduce",
                    "all_gather_into_tensor": "all-gather", "_allgather_base_": "all-gather",
                    "reduce_scatter_tensor": "reduce-scatter", "_reduce_scatter_base_": "reduce-scatter"}
BOOKKEEPING = {"wait_tensor", "_wrap_tensor_autograd"}  # functional collectives' handles, not messages


class CollectiveLog(TorchDispatchMode):
    """Records (pass, mesh dimension, collective, bytes of its whole buffer) of each collective."""

    def __init__(self, dims_by_group):
        super().__init__()
        self.dims_by_group, self.phase, self.records = dims_by_group, "forward", []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if any(issubclass(t, DTensor) for t in types):
            return NotImplemented  # DTensor first turns the op into local ops and collectives
        out = func(*args, **(kwargs or {}))
        name = func.overloadpacket.__name__
        if func.namespace in ("c10d", "_c10d_functional") and name not in BOOKKEEPING:
            tensors = [t for t in tree_flatten((args, out))[0] if isinstance(t, torch.Tensor)]
            self.records.append((self.phase, self.mesh_dim(func, args), COLLECTIVE_KINDS.get(name, name),
                                 max(t.numel() * t.element_size() for t in tensors)))
        return out

    def mesh_dim(self, func, args):
        names = [argument.name for argument in func._schema.arguments]
        if "group_name" in names:  # functional collectives name their group
            return self.dims_by_group[args[names.index("group_name")]]
        group = dist.ProcessGroup.unbox(args[names.index("process_group")])  # c10d ops carry it
        return self.dims_by_group[group.group_name]


def kinds_counted(comm_mode):
    """CommDebugMode's totals, by collective."""
    counts = {}
    for op, count in comm_mode.get_comm_counts().items():
        kind = COLLECTIVE_KINDS.get(str(op).split(".")[-1], str(op))
        counts[kind] = counts.get(kind, 0) + count
    return counts


def run_setup(setup, rank, meshes, model, inputs, targets):
    """One training step of ``setup`` on this rank: its collectives, loss share, gradients, new weights."""
    device = rank_device(rank)
    model, mesh = build(setup, model.to(device), meshes)
    x, target, token_split = rank_share(setup, rank, inputs.to(device), targets.to(device))
    x.requires_grad_()
    log = CollectiveLog({mesh.get_group(dim).group_name: dim for dim in mesh.mesh_dim_names})
    comm_mode = CommDebugMode()
    with warnings.catch_warnings(), comm_mode, log:
        # CommDebugMode's backward hooks hand each module's output on as a view, and FSDP2 warns
        # that an in-place op on that view would skip its hook: this step has none.
        warnings.filterwarnings("ignore", "FSDP2-wrapped module", UserWarning)
        loss = F.mse_loss(model(x), target, reduction="sum") / (target.numel() * token_split)
        log.phase = "backward"
        loss.backward()
        log.phase = "after backward"
        reduce_partial_gradients(model)
    result = {"loss": loss.item(), "collectives": sorted(log.records), "comm_debug": kinds_counted(comm_mode),
              "groups": {dim: tuple(dist.get_process_group_ranks(mesh.get_group(dim)))
                         for dim in mesh.mesh_dim_names},
              "held": sum(local_elements(p) for p in model.parameters()),
              "grads": {name: whole(p.grad) for name, p in model.named_parameters()}}
    if setup in ("FSDP x TP+SP", "FSDP", "HSDP"):  # one step of plain SGD on the sharded weights
        torch.optim.SGD(model.parameters(), lr=LEARNING_RATE).step()
        result["weights"] = {name: whole(p) for name, p in model.named_parameters()}
    return result


def every_setup(rank, world_size, model, inputs, targets):
    meshes = make_meshes(rank_device(rank).type)
    return {setup: run_setup(setup, rank, meshes, copy.deepcopy(model), inputs, targets) for setup in SETUPS}


model = make_model()
generator = torch.Generator().manual_seed(1)
inputs = torch.randn(BATCH, SEQUENCE, D_MODEL, generator=generator, dtype=DTYPE)
targets = torch.randn(BATCH, SEQUENCE, D_MODEL, generator=generator, dtype=DTYPE)
ranks = run_ranks(every_setup, WORLD_SIZE, model, inputs, targets, timeout_s=180, backend=BACKEND)
runs = {setup: [result[setup] for result in ranks] for setup in SETUPS}

# %%
# Verify against one process
# --------------------------
# One process runs the same blocks on the whole batch (for the FSDP and HSDP
# runs) or on each row's half (for TP and TP+SP), with plain ``nn.Linear``
# and ``nn.LayerNorm``, and takes the same SGD step. The runs add the same
# products in another order (partial sums on ranks, then a reduce-scatter or
# an all-reduce; a batch's gradient split by rows and by tokens), on other
# devices too. The tolerance bounds that rounding for each element by running
# error analysis (Higham 2002, chapter 3), to first order and in units of
# float64's unit roundoff :math:`u = 2^{-53}`, element by element. A sum of
# :math:`n` terms, in any order, is off by at most :math:`n` steps of the sum
# of their sizes, plus the errors its terms carry: through a linear layer,
# times :math:`|W|`; GeLU adds 8 steps and passes an error on times its
# slope. The norm :math:`\hat x = (x - \mu)/\sigma` passes an error on
# through the absolute value of its Jacobian,
# :math:`\frac{1}{\sigma}(I - \frac{1}{h}\mathbf{1}\mathbf{1}^T -
# \frac{1}{h}\hat x \hat x^T)`, and its mean and variance are off by
# :math:`h + 4` steps of their largest term, whether a kernel takes two passes
# or Welford's updates. Both sides are within :math:`u` times the bound of
# the exact result, so they may differ by twice that. A wrong shard, a missing
# rescaling or a gradient left unsummed is off by order one.

U64 = 2.0**-53  # float64's unit roundoff


def reference_step(model, inputs, targets):
    """Loss, gradients and weights after one SGD step of the unsplit blocks."""
    model = copy.deepcopy(model)
    loss = F.mse_loss(model(inputs), targets)
    loss.backward()
    grads = {name: p.grad.clone() for name, p in model.named_parameters()}
    torch.optim.SGD(model.parameters(), lr=LEARNING_RATE).step()
    return {"loss": loss.item(), "grads": grads,
            "weights": {name: p.detach().clone() for name, p in model.named_parameters()}}


def gelu_slope(h):
    """GeLU's derivative, Phi(h) + h phi(h): at most 1.13 in size, its own derivative at most 0.8."""
    return 0.5 * (1 + torch.erf(h / math.sqrt(2))) + h * torch.exp(-h.square() / 2) / math.sqrt(2 * math.pi)


def largest(t):
    """Each token's largest size."""
    return t.abs().amax(-1, keepdim=True)


def mean(t):
    return t.mean(-1, keepdim=True)


def norm_jacobian_times(r, x_hat, error):
    """|J| error for the norm's Jacobian r (I - 1/h - x_hat x_hat^T / h), token by token."""
    return r * (error + mean(error) + x_hat.abs() * mean(x_hat.abs() * error))


@torch.no_grad()
def rounding_bounds(model, inputs, targets):
    """The loss and each gradient of the float64 step are within U64 times these of the exact ones.

    Each activation's bound is carried element by element: a linear layer's
    input error through |W|, its own rounding as (inputs + 2) steps of
    |x| |W|^T + |b|; GeLU's as 8 steps of |z|. A weight's gradient is a sum
    over the tokens: each factor's error times the other factor, plus
    (tokens + 4) steps of the sum of the products' sizes (the mean's
    scalings, FSDP's divisions by 2 and 4 and the partial sums on ranks
    included).
    """
    x, t = inputs.reshape(-1, D_MODEL), targets.reshape(-1, D_MODEL)
    tokens, h = x.shape
    error, saved = torch.zeros_like(x), []
    for block in model:
        norm, up, down = block.norm, block.up, block.down
        mu = mean(x)
        r = (mean((x - mu).square()) + norm.eps).rsqrt()  # 1 / sigma
        x_hat = (x - mu) * r
        # The mean and the variance, by two passes or by Welford's updates: h + 4 steps of the largest term.
        mean_error = (h + 4) * largest(x)
        variance_error = (h + 4) * largest(x - mu).square() + 4 * largest(x) * mean_error
        r_error = r.square() * variance_error / 2 + 3  # relative: the variance's error, then rsqrt
        x_hat_error = (r * mean_error + x_hat.abs() * r_error + 2 * r * (x.abs() + mu.abs()) + 2 * x_hat.abs()
                       + norm_jacobian_times(r, x_hat, error))
        y = norm(x)
        y_error = norm.weight.abs() * x_hat_error + 2 * ((norm.weight * x_hat).abs() + norm.bias.abs())
        z = up(y)
        z_error = y_error @ up.weight.abs().T + (h + 2) * (y.abs() @ up.weight.abs().T + up.bias.abs())
        a = F.gelu(z)
        a_error = gelu_slope(z).abs() * z_error + 8 * z.abs()
        out = x + down(a)
        out_error = (error + a_error @ down.weight.abs().T
                     + (D_HIDDEN + 2) * (a.abs() @ down.weight.abs().T + down.bias.abs()) + out.abs())
        r_error_total = r_error + r * mean(x_hat.abs() * error)  # r's relative error, the input's share too
        saved.append((x, mu, r, x_hat, x_hat_error, r_error_total, y, y_error, z, z_error, a, a_error))
        x, error = out, out_error
    count, difference = t.numel(), x - t
    difference_error = error + difference.abs()
    loss_bound = (2 * difference.abs() * difference_error + (count + 4) * difference.square()).sum() / count
    grad, grad_error = 2 * difference / count, 2 * (difference_error + 3 * difference.abs()) / count
    bounds = {}
    for index in reversed(range(BLOCKS)):
        norm, up, down = model[index].norm, model[index].up, model[index].down
        x, mu, r, x_hat, x_hat_error, r_error, y, y_error, z, z_error, a, a_error = saved[index]
        bounds[f"{index}.down.bias"] = grad_error.sum(0) + (tokens + 4) * grad.abs().sum(0)
        bounds[f"{index}.down.weight"] = (grad_error.T @ a.abs() + grad.abs().T @ a_error
                                          + (tokens + 4) * grad.abs().T @ a.abs())
        grad_a = grad @ down.weight
        grad_a_error = grad_error @ down.weight.abs() + (h + 2) * grad.abs() @ down.weight.abs()
        slope = gelu_slope(z)
        grad_z = grad_a * slope
        grad_z_error = slope.abs() * grad_a_error + grad_a.abs() * (0.8 * z_error + 8) + grad_z.abs()
        bounds[f"{index}.up.bias"] = grad_z_error.sum(0) + (tokens + 4) * grad_z.abs().sum(0)
        bounds[f"{index}.up.weight"] = (grad_z_error.T @ y.abs() + grad_z.abs().T @ y_error
                                        + (tokens + 4) * grad_z.abs().T @ y.abs())
        grad_y = grad_z @ up.weight
        grad_y_error = grad_z_error @ up.weight.abs() + (D_HIDDEN + 2) * grad_z.abs() @ up.weight.abs()
        bounds[f"{index}.norm.bias"] = grad_y_error.sum(0) + (tokens + 4) * grad_y.abs().sum(0)
        bounds[f"{index}.norm.weight"] = ((grad_y_error * x_hat.abs()).sum(0) + (grad_y.abs() * x_hat_error).sum(0)
                                          + (tokens + 4) * (grad_y * x_hat).abs().sum(0))
        # The norm's input gradient r (g - mean(g) - x_hat mean(g x_hat)), g = weight * grad_y, or the
        # same in terms of x and the mean, as a CPU kernel computes it.
        g = norm.weight * grad_y
        grad_norm = r * (g - mean(g) - x_hat * mean(g * x_hat))
        own = ((h + 8) * r * (mean(g.abs()) + r.square() * (mean((g * x).abs()) + mu.abs() * mean(g.abs()))
                              * (x.abs() + mu.abs())) + 4 * grad_norm.abs() + 2 * r * g.abs())
        grad_norm_error = (norm_jacobian_times(r, x_hat, norm.weight.abs() * grad_y_error)
                           + r * (x_hat_error * mean(g * x_hat).abs() + x_hat.abs() * mean(g.abs() * x_hat_error))
                           + grad_norm.abs() * r_error + own)
        grad_in = grad + grad_norm
        grad, grad_error = grad_in, grad_error + grad_norm_error + grad_in.abs()
    return {"loss": loss_bound.item(), "grads": {name: bounds[name] for name, _ in model.named_parameters()}}


def weight_bounds(reference, grad_bounds):
    """SGD's w - lr g on gradients within U64 * bound: the gradient's share, then two roundings."""
    return {name: LEARNING_RATE * (grad_bounds[name] + reference["grads"][name].abs()) + w.abs()
            for name, w in reference["weights"].items()}


def assert_within_rounding(actual, expected, bound, what):
    """Both sides are within U64 * bound of the exact value: apart by at most twice that."""
    use = (torch.as_tensor(actual) - expected) / (2 * U64 * torch.as_tensor(bound))
    torch.testing.assert_close(use, torch.zeros_like(use), rtol=0, atol=1.0,
                               msg=lambda message: f"{what} (difference over its bound): {message}")
    return use.abs().max().item()


whole_batch = reference_step(model, inputs, targets)
halves = [reference_step(model, inputs[rows], targets[rows])
          for rows in (slice(0, ROWS_PER_DP_GROUP), slice(ROWS_PER_DP_GROUP, BATCH))]
whole_bounds = rounding_bounds(model, inputs, targets)
half_bounds = [rounding_bounds(model, inputs[rows], targets[rows])
               for rows in (slice(0, ROWS_PER_DP_GROUP), slice(ROWS_PER_DP_GROUP, BATCH))]


def combined_losses(setup, losses):
    """(loss, reference half or None for the whole batch) from the ranks' shares."""
    if setup == "TP":  # both ranks of a tp group hold the whole row's output
        return [(loss, rank // 2) for rank, loss in enumerate(losses)]
    if setup == "TP+SP":  # each holds its half of the tokens
        return [(losses[0] + losses[1], 0), (losses[2] + losses[3], 1)]
    data_parallel = 2 if setup == "FSDP x TP+SP" else WORLD_SIZE  # the ranks FSDP2 averages over
    return [(sum(losses) / data_parallel, None)]


worst_use = {}
for setup in SETUPS:
    uses = []
    for loss, half in combined_losses(setup, [result["loss"] for result in runs[setup]]):
        reference, bound = (whole_batch, whole_bounds) if half is None else (halves[half], half_bounds[half])
        # The ranks' partial sums, added here: a sum of the same terms in another grouping.
        uses.append(assert_within_rounding(loss, reference["loss"], bound["loss"], f"{setup} loss"))
    for rank, result in enumerate(runs[setup]):
        half = None if setup not in ("TP", "TP+SP") else rank // 2
        reference, bound = (whole_batch, whole_bounds) if half is None else (halves[half], half_bounds[half])
        for name, grad in result["grads"].items():
            uses.append(assert_within_rounding(grad, reference["grads"][name], bound["grads"][name],
                                               f"{setup}, rank {rank}: gradient of {name}"))
        if "weights" in result:
            sgd_bounds = weight_bounds(reference, bound["grads"])
            for name, weight in result["weights"].items():
                assert not torch.equal(weight, model.state_dict()[name]), f"{setup}: {name} did not move"
                uses.append(assert_within_rounding(weight, reference["weights"][name], sgd_bounds[name],
                                                   f"{setup}, rank {rank}: {name} after SGD"))
    worst_use[setup] = max(uses)
print(f"\n{'setup':<14}{'checked against':<20}{'worst error / bound':>20}")
for setup in SETUPS:
    against = "each row's half" if setup in ("TP", "TP+SP") else "the whole batch"
    print(f"{setup:<14}{against:<20}{worst_use[setup]:>20.1e}")
print("loss, every gradient (and after one SGD step every weight) of every rank match one process")

# %%
# Count the collectives
# ---------------------
# Every rank's list of collectives must be exactly the predicted one: the
# same collectives, on the same mesh dimension, in the same pass, with the
# same bytes. The groups must be the rows and columns drawn above,
# ``CommDebugMode`` must have counted as many of each kind, and each rank must
# keep its predicted share of the parameters (FSDP's rows as ``torch.chunk``
# cuts them). ``after
# backward`` is the reduction of the sequence-parallel norms' gradients that
# the TP+SP run does itself; under FSDP2 it happens inside the backward pass.

GROUP_SIZES = {dim: len(predicted_group(dim, 0)) for dim in ("dp", "tp", "fsdp", "replicate", "shard")}


def totals(collectives):
    counts = {}
    for _, _, kind, _ in collectives:
        counts[kind] = counts.get(kind, 0) + 1
    return counts


for setup in SETUPS:
    for rank, result in enumerate(runs[setup]):
        assert result["collectives"] == predicted_collectives(setup), (setup, rank, result["collectives"])
        assert result["comm_debug"] == totals(result["collectives"]), (setup, rank, result["comm_debug"])
        assert result["held"] == predicted_held(setup, rank), (setup, rank, result["held"])
        for dim, group in result["groups"].items():
            assert group == predicted_group(dim, rank), (setup, rank, dim, group)


def table_rows(collectives):
    """(pass, dim, collective, bytes) -> count, in the order of the step."""
    order = {"forward": 0, "backward": 1, "after backward": 2}
    rows = {}
    for record in sorted(collectives, key=lambda r: (order[r[0]], r[1], r[2], r[3])):
        rows[record] = rows.get(record, 0) + 1
    return rows


print("\ncollectives per step on rank 0 (all ranks asserted equal to the prediction):")
print(f"{'setup':<14}{'pass':<16}{'group':<20}{'collective':<16}{'count':>6}{'bytes each':>12}{'sent B':>10}")
for setup in SETUPS:
    groups = runs[setup][0]["groups"]
    for (phase, dim, kind, size), count in table_rows(runs[setup][0]["collectives"]).items():
        sent = count * ring_bytes_sent(kind, GROUP_SIZES[dim], size)
        group = f"{dim} {groups[dim]}"
        print(f"{setup:<14}{phase:<16}{group:<20}{kind:<16}{count:>6}{size:>12}{float(sent):>10.0f}")
print("CommDebugMode counted as many of each collective in every run, FSDP2's c10d ones included")


def within_a_node(group):
    return len({rank // RANKS_PER_NODE for rank in group}) == 1


def bytes_sent(setup, inside):
    """Bytes rank 0 sends per step, by collective, on groups inside one node (or spanning nodes)."""
    groups, sent = runs[setup][0]["groups"], {}
    for _, dim, kind, size in runs[setup][0]["collectives"]:
        if within_a_node(groups[dim]) == inside:
            sent[kind] = sent.get(kind, 0) + ring_bytes_sent(kind, GROUP_SIZES[dim], size)
    return sent


held = {setup: runs[setup][0]["held"] for setup in SETUPS}
print("\nbytes rank 0 sends per step (ring formula) on groups inside a node and on groups across nodes,"
      " and the parameter elements it keeps:")
print(f"{'setup':<14}{'in a node B':>13}{'across nodes B':>16}{'parameters':>12}")
for setup in SETUPS:
    inside, across = sum(bytes_sent(setup, True).values()), sum(bytes_sent(setup, False).values())
    print(f"{setup:<14}{float(inside):>13.0f}{float(across):>16.0f}{held[setup]:>12}")
tp_sent, sp_sent = sum(bytes_sent("TP", True).values()), sum(bytes_sent("TP+SP", True).values())
norm_sent = BLOCKS * 2 * ring_bytes_sent("all-reduce", 2, NORM_GRADIENT_BYTES)
assert sp_sent == tp_sent + norm_sent  # the activations' bytes are TP's; the norms' gradients come on top
assert bytes_sent("FSDP x TP+SP", True) == bytes_sent("TP+SP", True)  # FSDP2 adds only dp traffic
hsdp_across, fsdp_across = sum(bytes_sent("HSDP", False).values()), sum(bytes_sent("FSDP", False).values())
assert hsdp_across == ring_bytes_sent("all-reduce", 2, padded_bytes(FULL_SHAPES, 2) // 2) * BLOCKS
assert sum(bytes_sent("FSDP", True).values()) == 0  # one group of all four ranks spans both nodes

# %%
# Measure: bytes per rank, inside a node and across nodes
# -------------------------------------------------------
# The figure adds up, for each setup, the bytes rank 0 sends per step by the
# ring formula, split by whether the group stays inside one node (a row of
# the mesh) or spans two, and by collective. All the bytes of a group that
# spans nodes count as "across", though a ring sends only some of them
# between nodes: the split says which collectives depend on the network.

KIND_COLOURS = {"all-reduce": "tab:purple", "all-gather": "tab:green", "reduce-scatter": "tab:orange"}
fig, axes = plt.subplots(1, 2, figsize=(10.4, 4.0), sharey=True)
for ax, inside, where in ((axes[0], True, "groups inside a node (tp, shard)"),
                          (axes[1], False, "groups across nodes (dp, replicate, all 4)")):
    bottom = [0.0] * len(SETUPS)
    for kind, colour in KIND_COLOURS.items():
        heights = [float(bytes_sent(setup, inside).get(kind, 0)) / 1e3 for setup in SETUPS]
        ax.bar(SETUPS, heights, bottom=bottom, color=colour, label=kind)
        bottom = [b + height for b, height in zip(bottom, heights)]
    ax.set_title(where, fontsize="medium")
    ax.tick_params(axis="x", labelsize="small", rotation=20)
axes[0].set_ylabel("kB sent per rank per step (ring)")
axes[0].legend(fontsize="small")
fig.suptitle(f"Bytes each rank sends per step, by group and collective ({DEVICE_NAME})", fontsize="medium")
fig.tight_layout()

# %%
# Read the result
# ---------------
# The tables hold the predictions exactly. Tensor parallel costs one
# all-reduce of the activations in each pass of each block. Sequence parallel
# replaces each by an all-gather and a reduce-scatter of the same tensor, the
# same bytes (the ``sent B`` column), four collectives per block and so eight
# in a transformer layer with its attention block (lecture 7, exercise 4),
# plus, once per step, an all-reduce of the gradient of each norm's
# replicated weight and bias, ``D_MODEL`` elements each. What sequence
# parallel buys is memory: the norm and the residual, and the input the
# norm saves for backward, hold only a rank's :math:`1/t` of the tokens.
# FSDP2 on dp leaves the tensor-parallel traffic as it was (asserted) and
# adds its three collectives per block on the columns of the mesh, over the
# tensor-parallel slices of the weights: each rank keeps about a quarter of
# the parameters (more on rank 0, which ``torch.chunk`` gives the larger
# rows), as FSDP over all four ranks does.
#
# The last two bars are hybrid sharding's point (lecture 7,
# :ref:`l7-combining`). FSDP over all four ranks runs every all-gather and
# reduce-scatter on a group that spans both nodes, so each waits on the
# network, its bandwidth and its latency, on the critical path of every
# block. HSDP keeps about twice as many parameters per rank (a shard
# group's share, the last column of the table), but its all-gathers and
# reduce-scatters stay inside a node, on NVLink, and only the all-reduce of
# the gradient shards crosses nodes:
# :math:`2\frac{r-1}{r}\frac{P}{k}` bytes per rank and block, once per step,
# which the backward pass can overlap. Each GPU sends across the network its
# :math:`1/k` share of the gradients only, :math:`k` times fewer bytes than an
# all-reduce of whole gradients among the replicas. On DGX H200 nodes
# :math:`k = 8`: HSDP's all-gathers get NVLink's 450 GB/s per GPU each way,
# and the node's eight 400 Gb/s adapters, 50 GB/s each, carry only that
# all-reduce (NVIDIA's H200 and DGX H200 datasheets). A flat group with all
# eight GPUs of each node is not held to one adapter's 50 GB/s either, since
# NCCL runs a ring per adapter (the model of
# :ref:`sphx_glr_auto_examples_lecture07_parallelism_06_choosing_a_layout.py`),
# but every all-gather and reduce-scatter of every block then goes through
# those adapters, at the network's latency. The price is memory: :math:`k` ranks share the model states, not all
# :math:`rk`. The same reasoning puts tensor parallel on the last mesh
# dimension: its groups are consecutive ranks, the GPUs of one node.
#
# On this page the ranks are CPU processes (or GPUs of one machine, as the
# first line of output says): "inside a node" and "across nodes" are a model,
# two ranks per node, applied to the groups the mesh really built. The counts
# and the buffer sizes (``bytes each``) are what the collectives carried, the
# bytes sent are the ring formula's; nothing here is timed.

KEY_FIGURES = {
    "tp_collectives_per_layer": layer_collectives["TP"],
    "sp_collectives_per_layer": layer_collectives["TP+SP"],
    "tp_bytes_sent_per_rank": int(tp_sent),
    "sp_bytes_sent_per_rank": int(sp_sent),
    "fsdp_bytes_sent_across_nodes_per_rank": int(fsdp_across),
    "hsdp_bytes_sent_across_nodes_per_rank": int(hsdp_across),
    "worst_error_over_bound": max(worst_use.values()),
    "world_size": WORLD_SIZE,
    "device": DEVICE_NAME,
}
