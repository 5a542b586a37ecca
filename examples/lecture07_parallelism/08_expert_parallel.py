"""
Expert parallel: a mixture-of-experts layer with all-to-all dispatch and combine
================================================================================

A mixture-of-experts (MoE) layer replaces one MLP by many, the *experts*, and
a router that sends each token to :math:`k` of them. Expert parallelism gives
each rank a few experts and its own tokens: every token travels to the ranks
that hold its experts and back, in two all-to-alls with uneven splits. We
write that layer by hand (top-2 gating, a capacity factor that drops the
tokens an expert has no room for), check its outputs and gradients against
one process that holds every expert, count the tokens dropped and the bytes
each rank sends, and ask when those bytes cost more than the experts'
arithmetic on a cluster of H200 nodes.

**Requirements.** On a CPU: gloo on loopback, 4 ranks, small sizes. On a
single GPU (T4 on Colab included): the same, gloo on CPU ranks, since the
lesson is which bytes move, not how fast. With 2 or more GPUs: NCCL, one
process per GPU (up to 8), with wider tokens and more of them. The first line
of output names the backend. The cluster figures at the end are a model from
NVIDIA's datasheets. Nothing here is timed.
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
# :math:`E` experts, each a two-layer GeLU MLP of its own (deliberately
# irregular) hidden width, :math:`n` ranks holding :math:`E/n` experts each,
# :math:`T` tokens of width :math:`d` on every rank, top-:math:`k` routing
# with :math:`k = 2` and a capacity factor :math:`C`.

import copy
import math
import platform
from fractions import Fraction

import matplotlib.pyplot as plt
import torch.nn.functional as F
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils.flop_counter import FlopCounterMode


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


torch.manual_seed(0)
TOP_K, CAPACITY_FACTOR = 2, 1.25
if USE_NCCL:
    EXPERTS, D_MODEL, TOKENS = 24, 509, 1524  # 24 experts split over 2, 3, 4, 6 or 8 ranks
    WORLD_SIZE = max(n for n in range(2, min(torch.cuda.device_count(), 8) + 1) if EXPERTS % n == 0)
    HIDDEN = torch.randint(300, 700, (EXPERTS,)).tolist()
    DEVICE_NAME = f"{WORLD_SIZE} x {run_ranks(gpu_name, 1, backend=BACKEND)[0]}"
    print(f"backend: nccl (one process per GPU)   world size: {WORLD_SIZE}   device: {DEVICE_NAME}")
else:
    WORLD_SIZE = 4
    EXPERTS, D_MODEL, TOKENS = 8, 13, 44
    HIDDEN = [11, 17, 7, 19, 13, 23, 5, 29]
    DEVICE_NAME = f"{platform.machine()} CPU, {os.cpu_count()} cores"
    print(f"backend: gloo on CPU ranks (loopback)   world size: {WORLD_SIZE}   device: {DEVICE_NAME}")
LOCAL_EXPERTS = EXPERTS // WORLD_SIZE
DTYPE = torch.float64  # the ranks and the reference do the same sums: equal up to rounding
ELEMENT_BYTES = torch.empty(0, dtype=DTYPE).element_size()
UNIT = 2.0**-53  # float64's unit roundoff
print(f"{EXPERTS} experts ({LOCAL_EXPERTS} per rank), d_model {D_MODEL}, hidden widths"
      f" {min(HIDDEN)} to {max(HIDDEN)}, {TOKENS} tokens per rank, top-{TOP_K}, C = {CAPACITY_FACTOR}")
if not CAN_RUN_RANKS:
    skip_or_fail("the expert-parallel runs", "distributed", WHY_NOT)
    sys.exit(0)  # everything below needs ranks


class MLPBlock(nn.Module):
    """One expert: d_model -> hidden -> d_model, GeLU between."""

    def __init__(self, d_model, d_hidden, dtype):
        super().__init__()
        self.up = nn.Linear(d_model, d_hidden, dtype=dtype)
        self.down = nn.Linear(d_hidden, d_model, dtype=dtype)

    def forward(self, x):
        return self.down(F.gelu(self.up(x)))


# %%
# Routing with a capacity
# -----------------------
# The router is one linear map to :math:`E` logits per token. Each token picks
# its top :math:`k` experts and weighs them by the softmax of those :math:`k`
# logits (top-2 gating as in GShard, Lepikhin et al. 2021). An expert has room
# for
#
# .. math:: \text{capacity} = \left\lceil C \cdot \frac{kT}{E} \right\rceil
#
# tokens *from each rank's batch* of :math:`T`: the capacity is per source
# rank, like GShard's groups, so that a rank decides its drops alone, before
# anything is sent, and an expert never receives more than :math:`n` times the
# capacity. Switch Transformers (Fedus, Zoph and Shazeer 2022) define the
# capacity factor the same way for :math:`k = 1`. Within a rank the
# assignments queue in GShard's order: every token's first choice, in token
# order, before any second choice (GShard also drops some second choices with
# small gates at random; we do not). An assignment past the capacity is dropped:
# that expert adds nothing to the token, whose input still passes through the
# residual connection. With uniform routing every expert would get exactly
# :math:`kT/E` tokens per rank and :math:`C \ge 1` would drop none; a real
# router is uneven, so it drops some at any :math:`C` that is not large.


def route(x, router_weight, capacity, priority="first choices first"):
    """Experts, gates and kept-masks of a rank's tokens, each of shape (tokens, k)."""
    logits = x @ router_weight.T
    top_logits, chosen = logits.topk(TOP_K, dim=-1)
    gates = top_logits.softmax(dim=-1)  # renormalised over the k chosen experts
    queue = chosen.T.reshape(-1) if priority == "first choices first" else chosen.reshape(-1)
    one_hot = F.one_hot(queue, router_weight.shape[0])
    place_in_expert = (one_hot.cumsum(0) * one_hot).sum(1) - 1
    kept = place_in_expert < capacity
    kept = kept.view(TOP_K, -1).T if priority == "first choices first" else kept.view(-1, TOP_K)
    return chosen, gates, kept


def capacity_for(factor, tokens=TOKENS):
    return math.ceil(Fraction(str(factor)) * TOP_K * tokens / EXPERTS)


CAPACITY = capacity_for(CAPACITY_FACTOR)
experts = [MLPBlock(D_MODEL, h, DTYPE) for h in HIDDEN]
router_weight = torch.randn(EXPERTS, D_MODEL, dtype=DTYPE) / math.sqrt(D_MODEL)  # logits of size ~1
# Real activations share a common direction, which skews the router's load; so do these.
x_random = torch.randn(WORLD_SIZE, TOKENS, D_MODEL, dtype=DTYPE) + 0.3 * torch.randn(D_MODEL, dtype=DTYPE)
grad_y = torch.randn(WORLD_SIZE, TOKENS, D_MODEL, dtype=DTYPE)  # a random upstream gradient: no loss hides a term


def balanced_inputs():
    """Tokens and a router under which every expert gets exactly kT/E tokens from every rank."""
    assert D_MODEL >= EXPERTS and TOP_K * TOKENS % EXPERTS == 0
    weight = torch.zeros(EXPERTS, D_MODEL, dtype=DTYPE)
    weight[:, :EXPERTS] = torch.eye(EXPERTS, dtype=DTYPE)  # logit e reads feature e
    x = 0.1 * torch.randn(WORLD_SIZE, TOKENS, D_MODEL, dtype=DTYPE)
    assignment = torch.arange(TOP_K * TOKENS).view(TOKENS, TOP_K) % EXPERTS  # k t + j, round robin
    for choice in range(TOP_K):
        x[:, torch.arange(TOKENS), assignment[:, choice]] += 3.0 - choice
    return x, weight


INPUTS = {"random router": (x_random, router_weight), "balanced router": balanced_inputs()}


def routes_of_all_ranks(x_by_rank, weight, capacity, priority="first choices first"):
    """The routing each rank computes for its own batch, stacked in rank order."""
    parts = [route(x_by_rank[r], weight, capacity, priority) for r in range(WORLD_SIZE)]
    return [torch.cat(column) for column in zip(*parts)]


chosen, gates, kept = routes_of_all_ranks(x_random, router_weight, CAPACITY)
load = torch.bincount(chosen.reshape(-1), minlength=EXPERTS)
kept_load = torch.bincount(chosen[kept], minlength=EXPERTS)
DROPPED = int((~kept).sum())
print(f"capacity: {CAPACITY} tokens per expert per rank (at most {WORLD_SIZE * CAPACITY} in all)"
      f"   uniform load: {TOP_K * TOKENS // EXPERTS} per rank")
print(f"dropped: {DROPPED} of {TOP_K * TOKENS * WORLD_SIZE} assignments"
      f" ({DROPPED / (TOP_K * TOKENS * WORLD_SIZE):.1%})")

# %%
# The figure shows what the ranks are about to send: on the left, the tokens
# each expert is asked to take (summed over the ranks), what it keeps, and its
# capacity; on the right, the fraction of assignments dropped as the capacity
# factor grows, for this random router and for a perfectly balanced one. An
# expert can drop tokens even when its total is under :math:`n` times the
# capacity, because each rank's batch is held to the capacity on its own.

FACTORS = [0.5, 0.75, 1.0, 1.25, 1.5, 2.0, 2.5, 3.0]


def dropped_fraction(x_by_rank, weight, factor):
    _, _, kept_at = routes_of_all_ranks(x_by_rank, weight, capacity_for(factor))
    return float((~kept_at).double().mean())


fig, (load_ax, sweep_ax) = plt.subplots(1, 2, figsize=(10, 3.8))
load_ax.bar(range(EXPERTS), kept_load.tolist(), label="kept")
load_ax.bar(range(EXPERTS), (load - kept_load).tolist(), bottom=kept_load.tolist(), label="dropped")
load_ax.axhline(WORLD_SIZE * CAPACITY, color="k", linestyle="--", label="capacity x ranks")
load_ax.axhline(WORLD_SIZE * TOP_K * TOKENS / EXPERTS, color="gray", linestyle=":", label="uniform load")
load_ax.set_xlabel("expert")
load_ax.set_ylabel("tokens routed to the expert")
load_ax.set_title(f"Load per expert, top-{TOP_K}, C = {CAPACITY_FACTOR}")
load_ax.set_ylim(0, 1.4 * WORLD_SIZE * CAPACITY)
load_ax.legend(fontsize="small", loc="upper left", ncol=2)
for name, (x_by_rank, weight) in INPUTS.items():
    sweep_ax.plot(FACTORS, [dropped_fraction(x_by_rank, weight, c) for c in FACTORS], "o-", label=name)
sweep_ax.plot(FACTORS, [max(0.0, 1 - capacity_for(c) * EXPERTS / (TOP_K * TOKENS)) for c in FACTORS],
              "k+", markersize=10, label="balanced: 1 - capacity / (kT/E)")
sweep_ax.set_xlabel("capacity factor C")
sweep_ax.set_ylabel("fraction of assignments dropped")
sweep_ax.set_title(f"Drops against capacity factor ({DEVICE_NAME})")
sweep_ax.legend(fontsize="small")
fig.tight_layout()

# %%
# Predict: what the all-to-alls move
# ----------------------------------
# Expert :math:`e` lives on rank :math:`\lfloor e / (E/n) \rfloor`. A rank
# sorts its kept assignments by expert, so the rows bound for each rank are
# contiguous, and runs three all-to-alls per forward pass:
#
# 1. **counts**: how many rows it sends to each expert, :math:`E/n` integers
#    to each rank, so that every rank can size its receive buffer and knows
#    which rows are for which of its experts;
# 2. **dispatch**: the rows themselves, :math:`d` elements each, with uneven
#    split sizes (``all_to_all_single`` with ``input_split_sizes`` and
#    ``output_split_sizes``);
# 3. **combine**: the experts' outputs, back along the same splits reversed.
#    The source rank weighs each by its gate and adds it to the token.
#
# The backward pass mirrors the last two: the gradients of the outputs go out
# along the dispatch splits, those of the inputs come back along the combine
# splits; the counts are known by then. Five all-to-alls per step, two of them
# in each direction carrying rows. With uniform routing and no drops a rank
# keeps :math:`1/n` of its :math:`kT` rows and sends the rest, so each of the
# four row all-to-alls sends
#
# .. math:: kTd \cdot b \cdot \frac{n-1}{n}
#
# bytes per rank, with :math:`b` bytes per element: the all-to-all's
# :math:`(n-1)/n\,S` of
# :ref:`sphx_glr_auto_examples_lecture07_parallelism_01_collectives.py`, with
# :math:`S = kTd\,b`. A real router sends more from some ranks and less from
# others; drops send less. GShard and Switch send a
# padded buffer of the capacity per expert instead: :math:`E \cdot
# \text{capacity} \cdot d\,b\,(n-1)/n`, about :math:`C` times the uniform
# bytes, whatever the routing. We count the bytes from the split sizes the
# ranks use, and the balanced router must give the formula exactly.

UNIFORM_BYTES = TOP_K * TOKENS * D_MODEL * ELEMENT_BYTES * (WORLD_SIZE - 1) // WORLD_SIZE
PADDED_BYTES = EXPERTS * CAPACITY * D_MODEL * ELEMENT_BYTES * (WORLD_SIZE - 1) // WORLD_SIZE
COUNTS_BYTES = LOCAL_EXPERTS * (WORLD_SIZE - 1) * torch.empty(0, dtype=torch.int64).element_size()
print(f"predicted bytes per rank per row all-to-all: uniform routing {UNIFORM_BYTES:,},"
      f" padded to capacity {PADDED_BYTES:,}; counts exchange {COUNTS_BYTES:,}")

# %%
# The layer on n ranks
# --------------------
# The all-to-all is an ``autograd.Function`` of a few lines, as Megatron's
# operators were in
# :ref:`sphx_glr_auto_examples_lecture07_parallelism_04_tensor_parallel.py`:
# its backward is the all-to-all with the splits swapped
# (``torch.distributed.nn.functional.all_to_all_single`` is PyTorch's own,
# the same with autograd; torch 2.13 marks it deprecated, with a
# ``FutureWarning``, in favour of
# ``torch.distributed._functional_collectives.all_to_all_single``). Each rank
# holds its own tokens and its :math:`E/n` experts; a row arrives tagged only
# by its position, so the receiving rank must label it by the counts, source
# rank first, then expert, in the order the sender sorted it.


class AllToAll(torch.autograd.Function):
    """Rows cut by ``send_splits`` go to the ranks in order; the reverse all-to-all in backward."""

    @staticmethod
    def forward(ctx, rows, receive_splits, send_splits):
        ctx.splits = receive_splits, send_splits
        received = rows.new_empty(sum(receive_splits), *rows.shape[1:])
        dist.all_to_all_single(received, rows.contiguous(), receive_splits, send_splits)
        return received

    @staticmethod
    def backward(ctx, grad):
        receive_splits, send_splits = ctx.splits
        grad_rows = grad.new_empty(sum(send_splits), *grad.shape[1:])
        dist.all_to_all_single(grad_rows, grad.contiguous(), send_splits, receive_splits)
        return grad_rows, None, None


def expert_parallel_moe(x, weight, local_experts, rank, world_size, fault=None):
    """This rank's tokens through the MoE layer; returns the output and what was sent."""
    priority = "token order" if fault == "token-order drops" else "first choices first"
    chosen, gates, kept = route(x, weight, CAPACITY, priority)
    token = torch.arange(x.shape[0], device=x.device).repeat_interleave(TOP_K)[kept.reshape(-1)]
    expert, gate = chosen[kept], gates[kept]
    by_expert = torch.argsort(expert, stable=True)  # the rows for each rank become contiguous
    token, expert, gate = token[by_expert], expert[by_expert], gate[by_expert]

    rows_per_expert = torch.bincount(expert, minlength=EXPERTS)  # grouped by the rank that owns them
    counts_received = torch.empty_like(rows_per_expert)
    dist.all_to_all_single(counts_received, rows_per_expert)
    counts_received = counts_received.view(world_size, LOCAL_EXPERTS)  # [source rank, local expert]
    send_splits = rows_per_expert.view(world_size, LOCAL_EXPERTS).sum(1).tolist()
    receive_splits = counts_received.sum(1).tolist()

    received = AllToAll.apply(x[token], receive_splits, send_splits)
    if fault == "wrong split order":  # labels the rows as if grouped by expert, then source
        local_expert = torch.arange(LOCAL_EXPERTS, device=x.device).repeat_interleave(world_size)
        local_expert = local_expert.repeat_interleave(counts_received.T.reshape(-1))
    else:
        local_expert = torch.arange(LOCAL_EXPERTS, device=x.device).repeat(world_size)
        local_expert = local_expert.repeat_interleave(counts_received.reshape(-1))
    by_local_expert = torch.argsort(local_expert, stable=True)
    rows_per_local_expert = torch.bincount(local_expert, minlength=LOCAL_EXPERTS).tolist()
    inputs = received[by_local_expert].split(rows_per_local_expert)
    outputs = torch.cat([block(rows) for block, rows in zip(local_experts, inputs)])
    outputs = outputs[torch.argsort(by_local_expert)]  # back in the order the rows arrived

    returned = AllToAll.apply(outputs, send_splits, receive_splits)
    contributions = returned if fault == "no gates" else gate[:, None] * returned
    y = x.index_add(0, token, contributions)
    return y, {"dropped": int((~kept).sum()), "send_rows": send_splits, "receive_rows": receive_splits,
               "rows_per_local_expert": rows_per_local_expert}


# %%
# Each rank runs one forward and backward pass per variant and counts what it
# sends: a ``TorchDispatchMode`` sees every ``c10d.alltoall_base_`` (the op
# behind ``all_to_all_single``) and adds the bytes of the splits bound for
# other ranks (the rank's own split stays in its memory), and
# ``FlopCounterMode`` counts the forward pass's matrix FLOPs. The variants:
# the random router, the balanced one, and three planted faults that the
# checks below must reject: rows labelled in the wrong split order, outputs
# combined without their gates, and drops decided in token order instead of
# first choices first. The last need not drop fewer or more, only other
# assignments, so a count of drops alone would not catch it.


class AllToAllBytes(TorchDispatchMode):
    """Bytes each all-to-all sends to other ranks, one entry per call."""

    def __init__(self, rank, world_size):
        super().__init__()
        self.rank, self.world_size, self.sent = rank, world_size, []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func is torch.ops.c10d.alltoall_base_.default:  # (output, input, group, out splits, in splits, ...)
            rows, splits = args[1], list(args[4]) or [args[1].shape[0] // self.world_size] * self.world_size
            row_bytes = math.prod(rows.shape[1:]) * rows.element_size()
            self.sent.append(row_bytes * sum(s for peer, s in enumerate(splits) if peer != self.rank))
        return func(*args, **(kwargs or {}))


VARIANTS = {  # name: (inputs, planted fault)
    "random router": ("random router", None),
    "balanced router": ("balanced router", None),
    "fault: wrong split order": ("random router", "wrong split order"),
    "fault: no gates": ("random router", "no gates"),
    "fault: token-order drops": ("random router", "token-order drops"),
}


def expert_parallel_worker(rank, world_size, experts, inputs, grad_y, variants):
    device = rank_device(rank)
    results = {}
    for name, (inputs_name, fault) in variants.items():
        x_by_rank, weight = inputs[inputs_name]
        local_experts = [copy.deepcopy(experts[rank * LOCAL_EXPERTS + i]).to(device) for i in range(LOCAL_EXPERTS)]
        x = x_by_rank[rank].to(device).requires_grad_()
        with AllToAllBytes(rank, world_size) as forward_bytes, FlopCounterMode(display=False) as flops:
            y, sent = expert_parallel_moe(x, weight.to(device), local_experts, rank, world_size, fault)
        with AllToAllBytes(rank, world_size) as backward_bytes:
            y.backward(grad_y[rank].to(device))
        results[name] = {
            "y": y.detach().cpu(), "grad_x": x.grad.cpu(), **sent, "flops": flops.get_total_flops(),
            "forward_bytes": forward_bytes.sent, "backward_bytes": backward_bytes.sent,
            "grads": [{p_name: p.grad.cpu() for p_name, p in block.named_parameters()} for block in local_experts],
        }
    return results


ranks = run_ranks(expert_parallel_worker, WORLD_SIZE, experts, INPUTS, grad_y, VARIANTS, backend=BACKEND)

# %%
# Verify against one process with every expert
# ---------------------------------------------
# The reference holds all :math:`E` experts and all :math:`nT` tokens in this
# process, routes each rank's batch with the same capacity, runs every expert
# on the tokens it kept, and adds the weighted outputs to the inputs; autograd
# gives its gradients. Each rank's output, input gradient and experts'
# weight gradients must equal the matching part of the reference's. Both
# sides do the same arithmetic in other orders (and, under NCCL, on other
# devices); the tolerance is a first-order bound on their rounding, element by
# element, by running error analysis (Higham 2002, chapter 3), in units of
# float64's :math:`u = 2^{-53}`: a sum of :math:`m` terms is off by at most
# :math:`m u` times the sum of their sizes, in any order, plus the errors its
# terms carry. A token's logits are off by at most
# :math:`\lambda = d\,u\,\max_e \sum|x||w_e|`; a gate by
# :math:`2\lambda + (k + 5 + |l_1 - l_j|)\,u` of itself (the softmax
# subtracts the largest logit, exponentiates, sums and divides); an expert's
# output by the bound of the MLP block in 04. Every all-to-all moves bits
# unchanged. The routing itself must not depend on rounding: we assert that
# no two of a token's top :math:`k+1` logits, as computed here, are within
# :math:`4\lambda`. The exact ones are then more than :math:`2\lambda`
# apart, and any side's, each within :math:`\lambda` of them, rank them
# alike. A wrong label, a missing gate or another drop is off by order one.


def reference_step(x_by_rank, weight, experts, grad_y):
    """Output and gradients of the whole layer in one process, and its routing."""
    experts = copy.deepcopy(experts)
    x = x_by_rank.reshape(-1, D_MODEL).clone().requires_grad_()
    chosen, gates, kept = routes_of_all_ranks(x.view(WORLD_SIZE, TOKENS, D_MODEL), weight, CAPACITY)
    y = x
    for e, block in enumerate(experts):
        token, choice = ((chosen == e) & kept).nonzero(as_tuple=True)
        y = y.index_add(0, token, gates[token, choice, None] * block(x[token]))
    y.backward(grad_y.reshape(-1, D_MODEL))
    return {"y": y.detach(), "grad_x": x.grad, "chosen": chosen, "gates": gates.detach(), "kept": kept,
            "grads": [{name: p.grad for name, p in block.named_parameters()} for block in experts]}


def gelu_slope(h):
    """GeLU's derivative, Phi(h) + h phi(h): at most 1.13 in size, its own derivative at most 0.8."""
    return 0.5 * (1 + torch.erf(h / math.sqrt(2))) + h * torch.exp(-h.square() / 2) / math.sqrt(2 * math.pi)


def expert_bounds(block, x, grad_z, grad_z_error):
    """Values and rounding bounds (in units of u) of one expert's output and gradients.

    As in 04's block, to first order; ``x`` is exact, the upstream gradient
    ``grad_z`` (gate times the output's gradient) is off by ``grad_z_error``.
    """
    up, down, rows = block.up, block.down, x.shape[0]
    h = F.linear(x, up.weight, up.bias)
    h_error = (up.in_features + 1) * (x.abs() @ up.weight.abs().T + up.bias.abs())
    y, slope = F.gelu(h), gelu_slope(h)
    y_error = 1.13 * h_error + 8 * h.abs()
    z = F.linear(y, down.weight, down.bias)
    z_error = y_error @ down.weight.abs().T + (down.in_features + 1) * (y.abs() @ down.weight.abs().T
                                                                        + down.bias.abs())
    grad_y = grad_z @ down.weight
    grad_h = grad_y * slope
    grad_y_error = grad_z_error @ down.weight.abs() + down.out_features * (grad_z.abs() @ down.weight.abs())
    grad_h_error = grad_y_error * slope.abs() + grad_y.abs() * (0.8 * h_error + 8) + grad_h.abs()
    values = {"z": z, "grad_x": grad_h @ up.weight}
    bounds = {
        "z": z_error,
        "grad_x": grad_h_error @ up.weight.abs() + up.out_features * grad_h.abs() @ up.weight.abs(),
        "down.weight": grad_z_error.T @ y.abs() + grad_z.abs().T @ y_error + rows * grad_z.abs().T @ y.abs(),
        "down.bias": grad_z_error.sum(0) + rows * grad_z.abs().sum(0),
        "up.weight": grad_h_error.T @ x.abs() + rows * grad_h.abs().T @ x.abs(),
        "up.bias": grad_h_error.sum(0) + rows * grad_h.abs().sum(0),
    }
    return values, bounds


@torch.no_grad()
def rounding_bounds(x_by_rank, weight, experts, grad_y, reference):
    """Per element, in units of u: how far a computed output or gradient can be from the exact one."""
    x, grad_y = x_by_rank.reshape(-1, D_MODEL), grad_y.reshape(-1, D_MODEL)
    chosen, gates, kept = reference["chosen"], reference["gates"], reference["kept"]
    logits = x @ weight.T
    reach = D_MODEL * (x.abs() @ weight.abs().T).amax(1, keepdim=True)  # lambda / u, every logit
    top = logits.topk(TOP_K + 1, dim=-1).values
    # Computed here 4 lambda apart: exactly 2 lambda apart, so every side's top k is the same.
    assert (top[:, :-1] - top[:, 1:] > 4 * UNIT * reach).all(), "a routing decision is within rounding"
    top_logits = logits.gather(1, chosen)
    gate_error = (2 * reach + TOP_K + 5 + (top_logits[:, :1] - top_logits)) * gates  # units of u

    z, z_error, gx, gx_error = (torch.zeros(x.shape[0], TOP_K, D_MODEL, dtype=DTYPE) for _ in range(4))
    grads = []
    for e, block in enumerate(experts):
        token, choice = ((chosen == e) & kept).nonzero(as_tuple=True)
        upstream = gates[token, choice, None] * grad_y[token]
        upstream_error = gate_error[token, choice, None] * grad_y[token].abs() + upstream.abs()
        values, bounds = expert_bounds(block, x[token], upstream, upstream_error)
        z[token, choice], z_error[token, choice] = values["z"], bounds["z"]
        gx[token, choice], gx_error[token, choice] = values["grad_x"], bounds["grad_x"]
        grads.append({name: bounds[name] for name, _ in block.named_parameters()})

    weighted = gates[..., None] * z.abs()  # zero where dropped
    y_bound = ((gate_error[..., None] * z.abs() + gates[..., None] * z_error).sum(1)
               + (TOP_K + 2) * (x.abs() + weighted.sum(1)))
    # The router's backward: a_j = <grad_y, z_j>, dl_j = g_j (a_j - sum_i g_i a_i), then dl @ W.
    a = (grad_y[:, None, :] * z).sum(-1)
    a_error = (grad_y.abs()[:, None, :] * z_error).sum(-1) + D_MODEL * (grad_y.abs()[:, None, :] * z.abs()).sum(-1)
    mean_a = (gates * a).sum(1, keepdim=True)
    mean_a_error = (gate_error * a.abs() + gates * a_error).sum(1, keepdim=True)
    dl = gates * (a - mean_a)
    dl_error = (gate_error * (a - mean_a).abs() + gates * (a_error + mean_a_error)
                + (TOP_K + 2) * gates * (a.abs() + (gates * a.abs()).sum(1, keepdim=True)))
    chosen_rows = weight[chosen].abs()  # (tokens, k, d)
    router_grad = (dl[..., None] * weight[chosen]).sum(1)
    router_error = (dl_error[..., None] * chosen_rows).sum(1) + EXPERTS * (dl.abs()[..., None] * chosen_rows).sum(1)
    grad_x_bound = (gx_error.sum(1) + router_error
                    + (2 * TOP_K + 1) * (grad_y.abs() + gx.abs().sum(1) + router_grad.abs()))
    return {"y": y_bound, "grad_x": grad_x_bound, "grads": grads}


def error_over_bound(actual, expected, bound):
    """Both sides are within u * bound of the exact value: apart by at most twice that."""
    return (actual - expected) / (2 * UNIT * bound)


def assert_within_rounding(actual, expected, bound, what):
    use = error_over_bound(actual, expected, bound)
    torch.testing.assert_close(use, torch.zeros_like(use), rtol=0, atol=1.0,
                               msg=lambda message: f"{what} (difference over its bound): {message}")
    return use.abs().max().item()


def rank_rows(rank):
    return slice(rank * TOKENS, (rank + 1) * TOKENS)


REFERENCES, BOUNDS = {}, {}
for inputs_name, (x_by_rank, weight) in INPUTS.items():
    REFERENCES[inputs_name] = reference_step(x_by_rank, weight, experts, grad_y)
    BOUNDS[inputs_name] = rounding_bounds(x_by_rank, weight, experts, grad_y, REFERENCES[inputs_name])

print(f"{'variant':<18}{'rank':>5}{'output':>11}{'grad x':>11}{'grad experts':>14}   (worst error / bound)")
MARGINS = {}
for name in ("random router", "balanced router"):
    reference, bound = REFERENCES[name], BOUNDS[name]
    for rank, result in enumerate(ranks):
        got = result[name]
        rows = rank_rows(rank)
        y_use = assert_within_rounding(got["y"], reference["y"][rows], bound["y"][rows], f"{name}: rank {rank} output")
        gx_use = assert_within_rounding(got["grad_x"], reference["grad_x"][rows], bound["grad_x"][rows],
                                        f"{name}: rank {rank} input gradient")
        grad_use = 0.0
        for i, grads in enumerate(got["grads"]):
            e = rank * LOCAL_EXPERTS + i
            for p_name, grad in grads.items():
                grad_use = max(grad_use, assert_within_rounding(
                    grad, reference["grads"][e][p_name], bound["grads"][e][p_name],
                    f"{name}: rank {rank} gradient of expert {e} {p_name}"))
        MARGINS[name, rank] = max(y_use, gx_use, grad_use)
        print(f"{name:<18}{rank:>5}{y_use:>11.1e}{gx_use:>11.1e}{grad_use:>14.1e}")
print("expert parallel matches one process with every expert: outputs, input and expert gradients (float64)")

# %%
# The planted faults must fail the same comparison of outputs. Their ratios
# are computed here, not passed to ``assert_close``, so that the log of
# margins counts only the real checks.

print(f"{'planted fault':<28}{'worst error / bound':>20}{'dropped':>9}")
for name in ("fault: wrong split order", "fault: no gates", "fault: token-order drops"):
    y_fault = torch.cat([result[name]["y"] for result in ranks])
    reference, bound = REFERENCES["random router"], BOUNDS["random router"]
    worst = error_over_bound(y_fault, reference["y"], bound["y"]).abs().max().item()
    if not worst > 1:  # NaN is rejected too
        raise AssertionError(f"{name}: the comparison passed a planted fault")
    print(f"{name:<28}{worst:>20.2e}{sum(result[name]['dropped'] for result in ranks):>9}")

# %%
# Count the drops, the bytes and the all-to-alls
# ----------------------------------------------
# The predictions, as assertions on what each rank counted: its drops are the
# reference's drops of its batch; the rows it sends to each rank are the
# reference's kept assignments of its tokens to that rank's experts, and
# every rank receives what the others sent it; the bytes of each all-to-all
# follow from those splits (the counts exchange, dispatch and combine
# forward, then combine's and dispatch's mirrors backward); and the forward
# FLOPs are the router's :math:`2TdE` plus :math:`4dh` per row an expert of
# width :math:`h` takes. Under the balanced router the rows are the uniform
# prediction exactly.


def reference_send_rows(reference, rank):
    """Kept assignments of ``rank``'s tokens, counted by the rank that owns their expert."""
    chosen, kept = reference["chosen"][rank_rows(rank)], reference["kept"][rank_rows(rank)]
    return torch.bincount(chosen[kept] // LOCAL_EXPERTS, minlength=WORLD_SIZE).tolist()


def check_counts(name):
    reference = REFERENCES[name]
    for rank, result in enumerate(ranks):
        got = result[name]
        assert got["dropped"] == int((~reference["kept"][rank_rows(rank)]).sum()), (name, rank)
        assert got["send_rows"] == reference_send_rows(reference, rank), (name, rank, got["send_rows"])
        assert got["receive_rows"] == [ranks[s][name]["send_rows"][rank] for s in range(WORLD_SIZE)], (name, rank)
        local_kept = [int(((reference["chosen"] == rank * LOCAL_EXPERTS + i) & reference["kept"]).sum())
                      for i in range(LOCAL_EXPERTS)]
        assert got["rows_per_local_expert"] == local_kept, (name, rank)
        row_bytes = D_MODEL * ELEMENT_BYTES
        dispatch = row_bytes * sum(r for peer, r in enumerate(got["send_rows"]) if peer != rank)
        combine = row_bytes * sum(r for peer, r in enumerate(got["receive_rows"]) if peer != rank)
        assert got["forward_bytes"] == [COUNTS_BYTES, dispatch, combine], (name, rank, got["forward_bytes"])
        assert got["backward_bytes"] == [dispatch, combine], (name, rank, got["backward_bytes"])
        flops = 2 * TOKENS * D_MODEL * EXPERTS + sum(
            4 * D_MODEL * HIDDEN[rank * LOCAL_EXPERTS + i] * rows for i, rows in enumerate(local_kept))
        assert got["flops"] == flops, (name, rank, got["flops"], flops)
    assert sum(result[name]["dropped"] for result in ranks) == int((~reference["kept"]).sum()), name


for name in ("random router", "balanced router"):
    check_counts(name)
for rank, result in enumerate(ranks):
    balanced = result["balanced router"]
    assert balanced["dropped"] == 0 and balanced["forward_bytes"][1:] == [UNIFORM_BYTES] * 2, (rank, balanced)
assert sum(result["random router"]["dropped"] for result in ranks) == DROPPED

print(f"{'rank':>4}{'dropped':>9}{'rows local':>11}{'rows sent':>11}{'dispatch B':>13}{'combine B':>13}"
      f"{'dispatch / uniform':>20}   (random router)")
for rank, result in enumerate(ranks):
    got = result["random router"]
    kept_here = got["send_rows"][rank]
    print(f"{rank:>4}{got['dropped']:>9}{kept_here:>11}{sum(got['send_rows']) - kept_here:>11}"
          f"{got['forward_bytes'][1]:>13,}{got['forward_bytes'][2]:>13,}"
          f"{got['forward_bytes'][1] / UNIFORM_BYTES:>20.3f}")
print(f"all-to-alls per step: {len(ranks[0]['random router']['forward_bytes'])} forward (counts, dispatch,"
      f" combine), {len(ranks[0]['random router']['backward_bytes'])} backward")
print(f"balanced router: every rank sends {UNIFORM_BYTES:,} bytes per row all-to-all,"
      f" k T d b (n-1)/n exactly, and drops nothing")

# %%
# When do the bytes cost more than the experts?
# ---------------------------------------------
# Per row all-to-all a rank sends :math:`kTd\,b\,(n-1)/n` bytes (uniform
# routing); its experts do :math:`2 \cdot 3\,kTdh` FLOPs forward on the
# :math:`kT` rows they receive, for SwiGLU experts of three
# :math:`d \times h` matrices (this example's have two). Forward has two row all-to-alls, so at a link of
# :math:`B` bytes/s and a peak of :math:`P` FLOP/s
#
# .. math:: \frac{t_\text{all-to-all}}{t_\text{experts}} = \frac{b\,f\,P}{3\,h\,B},
#
# where :math:`f` is the fraction of the rows that crosses the slowest link
# (bandwidth terms only: a rank sends megabytes to each peer, more than a
# link moves in the microseconds of latency that the cluster below is
# assumed to have, so even one latency per peer is the smaller term).
# Backward sends the same bytes against twice the FLOPs, so its ratio is
# half. Neither the tokens nor :math:`k` appear: only
# the expert's width against the link. The cluster is the one of
# :ref:`sphx_glr_auto_examples_lecture07_parallelism_06_choosing_a_layout.py`:
# DGX H200 nodes of 8 GPUs, NVLink at 450 GB/s per GPU each way, one 400 Gb/s
# ConnectX-7 adapter per GPU, 50 GB/s each way (NVIDIA's H200 and DGX H200
# datasheets), and the datasheet's BF16 rate of 1979 TFLOP/s, which counts
# sparsity: 989.5 TFLOP/s dense. Up to 8 ranks the all-to-all
# stays on NVLink; beyond, a rank sends :math:`(n-8)/n` of its rows through
# its adapter and :math:`7/n` over NVLink at the same time. The table takes
# :math:`d = 4096`, bf16, 8192 tokens per GPU and :math:`k = 2`, a wide
# expert (:math:`h = 14336`) and a narrow, fine-grained one
# (:math:`h = 2048`), at the peak rates: experts that reach only a fraction
# of the peak FLOP/s multiply the ratio by that fraction, and an all-to-all
# that reaches only a fraction of the links' bandwidth divides it by its own.

H200_CLUSTER = {
    "gpus_per_node": 8,
    "nvlink_bytes_per_s": 450e9,  # per GPU, each direction
    "nic_bytes_per_s": 400e9 / 8,  # one 400 Gb/s ConnectX-7 per GPU, each direction
    "bf16_flops_per_s": 1979e12 / 2,  # dense
}
MOE_LAYER = {"d_model": 4096, "top_k": 2, "tokens_per_gpu": 8192, "bytes_per_element": 2}
EXPERT_WIDTHS = [14336, 2048]
EP_DEGREES = [8, 16, 32, 64]


def all_to_all_seconds(ranks_n, layer, cluster):
    """One row all-to-all under uniform routing: NVLink inside the node and the adapter outside, at once."""
    rows_bytes = layer["top_k"] * layer["tokens_per_gpu"] * layer["d_model"] * layer["bytes_per_element"]
    in_node = min(ranks_n, cluster["gpus_per_node"])
    return max(rows_bytes * (in_node - 1) / ranks_n / cluster["nvlink_bytes_per_s"],
               rows_bytes * (ranks_n - in_node) / ranks_n / cluster["nic_bytes_per_s"])


def expert_seconds(width, layer, cluster):
    """Forward FLOPs of the SwiGLU experts on a rank's k T rows, at the peak rate."""
    return 6 * layer["top_k"] * layer["tokens_per_gpu"] * layer["d_model"] * width / cluster["bf16_flops_per_s"]


def link_fraction_and_bandwidth(ranks_n, cluster):
    """The slowest link's share of the rows and its bandwidth."""
    node = cluster["gpus_per_node"]
    if ranks_n <= node:
        return (ranks_n - 1) / ranks_n, cluster["nvlink_bytes_per_s"]
    return (ranks_n - node) / ranks_n, cluster["nic_bytes_per_s"]


print(f"{'EP ranks':>8}{'expert h':>10}{'2 all-to-alls ms':>18}{'experts ms':>12}{'comm / compute':>16}"
      "   (forward, model)")
RATIOS = {}
for ranks_n in EP_DEGREES:
    for width in EXPERT_WIDTHS:
        comm = 2 * all_to_all_seconds(ranks_n, MOE_LAYER, H200_CLUSTER)
        compute = expert_seconds(width, MOE_LAYER, H200_CLUSTER)
        RATIOS[ranks_n, width] = comm / compute
        f, bandwidth = link_fraction_and_bandwidth(ranks_n, H200_CLUSTER)
        closed_form = MOE_LAYER["bytes_per_element"] * f * H200_CLUSTER["bf16_flops_per_s"] / (3 * width * bandwidth)
        # Each side rounds four times (the integer products are exact): 8u apart to first order.
        assert math.isclose(RATIOS[ranks_n, width], closed_form, rel_tol=9 * UNIT), (ranks_n, width)
        print(f"{ranks_n:>8}{width:>10}{1e3 * comm:>18.2f}{1e3 * compute:>12.2f}{RATIOS[ranks_n, width]:>16.2f}")
assert all(RATIOS[8, width] < 1 for width in EXPERT_WIDTHS)  # one node: the experts take longer
assert all(RATIOS[n, EXPERT_WIDTHS[1]] > 1 for n in EP_DEGREES[1:])  # across nodes: the narrow expert waits
BREAK_EVEN_WIDTH = {n: RATIOS[n, EXPERT_WIDTHS[0]] * EXPERT_WIDTHS[0] for n in (8, EP_DEGREES[-1])}
print(f"the all-to-alls cost as much as the experts at h = {BREAK_EVEN_WIDTH[8]:,.0f} on NVLink (8 ranks) and"
      f" h = {BREAK_EVEN_WIDTH[EP_DEGREES[-1]]:,.0f} across nodes ({EP_DEGREES[-1]} ranks)")

# %%
# Read the result
# ---------------
# Expert parallelism moves tokens, not weights: a rank keeps its experts
# whole and sends each of its kept assignments to the rank of its expert
# and back (those for its own experts stay in its memory): two all-to-alls
# forward and two backward, plus one small exchange of counts so that every
# receiver can size and label its rows. The splits are uneven because
# routing is, and the bytes follow from them exactly, as the table above
# asserts; a perfectly balanced router sends exactly the
# :math:`kTd\,b\,(n-1)/n` of the uniform prediction, a real one more from
# some ranks and less from others. The capacity factor bounds what an
# expert can receive, at the price of the drops the figure shows: a dropped
# assignment costs the token that expert's contribution, silently, in the
# forward and the backward pass alike. Padded implementations in the style
# of GShard and Switch also pay about :math:`C` times the uniform bytes.
# Dropless layers keep every assignment: they send uneven splits as this one
# does, with no capacity, and keep the experts' load even by other means;
# DeepSeek-V3 (DeepSeek-AI 2024) trains so, steering its router with a bias
# per expert.
#
# The cost model says where expert parallelism belongs. Inside a node,
# NVLink moves the rows in less time than the experts take, for either width;
# across nodes the adapters carry half the rows at 16 ranks and more beyond,
# at a ninth of NVLink's bandwidth, and a narrow expert's arithmetic no
# longer covers its all-to-alls. That is why large MoE runs keep expert
# parallelism within a node where they can, overlap the all-to-alls with
# computation, or limit how many nodes a token may visit (DeepSeek-V3 does
# the last two: at most 4 nodes per token, and its DualPipe schedule). The
# all-to-alls here are gloo between CPU processes or NCCL between GPUs, as
# the first line of output says; nothing was timed.

KEY_FIGURES = {
    "device": DEVICE_NAME,
    "world_size": WORLD_SIZE,
    "experts": EXPERTS,
    "capacity_tokens_per_rank": CAPACITY,
    "dropped_assignments": DROPPED,
    "dropped_fraction": DROPPED / (TOP_K * TOKENS * WORLD_SIZE),
    "all_to_alls_forward": len(ranks[0]["random router"]["forward_bytes"]),
    "all_to_alls_backward": len(ranks[0]["random router"]["backward_bytes"]),
    "dispatch_bytes_rank0": ranks[0]["random router"]["forward_bytes"][1],
    "uniform_dispatch_bytes": UNIFORM_BYTES,
    "worst_error_over_bound": max(MARGINS.values()),
    "h200_comm_over_compute_64_ranks_h2048": RATIOS[EP_DEGREES[-1], EXPERT_WIDTHS[1]],
}
