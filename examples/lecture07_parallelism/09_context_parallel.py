"""
Context parallel: ring attention over a sequence split across ranks
===================================================================

Context parallelism splits one sequence's tokens across :math:`c` ranks in
every layer, attention included. Most of a layer acts on each token alone;
attention does not, since every query needs the keys and values of every
token before it. In Ring Attention each rank keeps its own queries while the
key and value blocks travel around a ring of ranks, one hop per step, and
each rank merges its partial results with lecture 5's online softmax. We
write the causal forward pass by hand with point-to-point sends, for two ways
of splitting the sequence (contiguous blocks, and the load-balanced *zigzag*
of two chunks per rank) and for the all-gather variant that Llama 3 trained
with; check all three against one process's causal attention in float64;
count the FLOPs and the bytes of every rank at every step; and ask how long a
block must be for its attention to hide its transfer on H200s.

**Requirements.** On a CPU: gloo on loopback, 4 ranks, small sizes. On a
single GPU (T4 on Colab included): the same, gloo on CPU ranks, since the
lesson is what each rank computes and sends, not how fast. With 2 or more
GPUs: NCCL, one process per GPU (2, 4 or 8 of them), with longer sequences
and wider heads. The first line of output names the backend. The cluster
figures at the end are a model from NVIDIA's datasheets. Nothing here is
timed.
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
# A batch of :math:`B` sequences of :math:`S` tokens, :math:`H` query heads
# and :math:`H_{kv}` key-value heads of dimension :math:`D`: grouped-query
# attention, each key-value head serving :math:`g = H/H_{kv}` query heads.
# The sequence is cut into :math:`2c` chunks of :math:`n = S/2c` tokens, from
# which both layouts below are built. Everything is float64, so that the check
# against one process can be tight.

import math
import platform
import unicodedata

import matplotlib.pyplot as plt
import torch.nn.functional as F
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


def padded(text, width):
    """``text`` left-aligned in ``width`` columns, a Chinese character taking two."""
    return text + " " * (width - sum(2 if unicodedata.east_asian_width(c) in "WF" else 1 for c in text))


def rank_device(rank):
    """Where rank ``rank`` keeps its tensors: its own GPU under NCCL, else the CPU."""
    return torch.device("cuda", rank) if USE_NCCL else torch.device("cpu")


def gpu_name(rank, world_size):
    return torch.cuda.get_device_name(rank)  # it initialises CUDA: only ever asked in a rank


torch.manual_seed(0)
if USE_NCCL:
    WORLD_SIZE = 2 ** (min(torch.cuda.device_count(), 8).bit_length() - 1)  # 2, 4 or 8 ranks
    BATCH, HEADS, KV_HEADS, HEAD_DIM, CHUNK = 2, 8, 2, 64, 64
    DEVICE_NAME = f"{WORLD_SIZE} x {run_ranks(gpu_name, 1, backend=BACKEND)[0]}"
    print(f"backend: nccl (one process per GPU)   world size: {WORLD_SIZE}   device: {DEVICE_NAME}")
else:
    WORLD_SIZE = 4
    BATCH, HEADS, KV_HEADS, HEAD_DIM, CHUNK = 2, 6, 2, 11, 7  # irregular on purpose
    DEVICE_NAME = f"{platform.machine()} CPU, {os.cpu_count()} cores"
    print(f"backend: gloo on CPU ranks (loopback)   world size: {WORLD_SIZE}   device: {DEVICE_NAME}")
SEQUENCE = 2 * WORLD_SIZE * CHUNK
GROUP = HEADS // KV_HEADS  # g: query heads per key-value head
SCALE = 1 / math.sqrt(HEAD_DIM)
DTYPE = torch.float64
ELEMENT_BYTES = torch.empty(0, dtype=DTYPE).element_size()
UNIT = 2.0**-53  # float64's unit roundoff
print(f"batch {BATCH}, sequence {SEQUENCE} ({2 * WORLD_SIZE} chunks of {CHUNK} tokens), {HEADS} query heads,"
      f" {KV_HEADS} key-value heads (g = {GROUP}), head dimension {HEAD_DIM}")
if not CAN_RUN_RANKS:
    skip_or_fail("the context-parallel runs", "distributed", WHY_NOT)
    sys.exit(0)  # everything below needs ranks

# %%
# Predict: who computes what, in which step
# -----------------------------------------
# Query chunk :math:`a` and key chunk :math:`b` form a *chunk pair*. Under the
# causal mask a pair with :math:`b > a` is all masked and is skipped, a pair
# with :math:`b = a` is computed with the mask inside it, and a pair with
# :math:`b < a` is computed whole: each costs the same two matmuls,
# :math:`4BHn^2D` FLOPs. There are :math:`2c(2c+1)/2` pairs to compute in all,
# :math:`2c+1` per rank if they were spread evenly.
#
# *Contiguous*: rank :math:`r` holds chunks :math:`2r` and :math:`2r+1`. At
# step :math:`i` of the ring it holds the keys and values of rank
# :math:`(r - i) \bmod c`: at step 0 its own (3 pairs, the diagonal ones and
# the one below them), afterwards an earlier rank's (4 pairs) when
# :math:`r \ge i`, and a later rank's (0 pairs) when :math:`r < i`.
# *Zigzag*: rank :math:`r` holds chunks :math:`r` and :math:`2c-1-r`, one from
# each end of the sequence (Megatron-LM's load balancing, and PyTorch's
# head-tail balancer). At step 0 it computes 3 pairs, at every later step
# exactly 2, whichever block it holds: of its four pairs with another rank's
# block, the late query chunk always needs the early key chunk, the early
# query chunk never needs the late key chunk, and of the other two exactly
# one is below the diagonal.
#
# No rank can start a step before it has received its block, so a step
# cannot end before its busiest rank's; here the busiest rank is the same at
# every step (the last one, contiguous; any, zigzag), and the ring costs
# :math:`3 + 4(c-1) = 4c-1` pair times contiguous and
# :math:`3 + 2(c-1) = 2c+1` zigzag: the even share, the best any layout can
# do. (A diagonal pair counts as a whole pair here, as this example computes
# it; a kernel that skips its masked half costs :math:`4c-2` against
# :math:`2c`.)


def chunks_of(layout, rank, world_size=WORLD_SIZE):
    """The sequence chunks rank ``rank`` holds, in the order it stores them."""
    if layout == "contiguous":
        return [2 * rank, 2 * rank + 1]
    return [rank, 2 * world_size - 1 - rank]  # zigzag: one from each end


def predicted_pairs(layout, rank, step, world_size=WORLD_SIZE):
    """How many chunk pairs rank ``rank`` computes at ring step ``step``: the closed forms above."""
    if step == 0:
        return 3
    if layout == "zigzag":
        return 2
    return 4 if rank >= step else 0


PAIR_FLOPS = 4 * BATCH * HEADS * CHUNK**2 * HEAD_DIM  # q k^T and p v of one chunk pair
BLOCK_BYTES = 2 * BATCH * KV_HEADS * 2 * CHUNK * HEAD_DIM * ELEMENT_BYTES  # a rank's keys and values
CRITICAL_PATH = {layout: sum(max(predicted_pairs(layout, r, i) for r in range(WORLD_SIZE)) for i in range(WORLD_SIZE))
                 for layout in ("contiguous", "zigzag")}
assert CRITICAL_PATH == {"contiguous": 4 * WORLD_SIZE - 1, "zigzag": 2 * WORLD_SIZE + 1}, CRITICAL_PATH
assert sum(predicted_pairs("zigzag", r, i) for r in range(WORLD_SIZE) for i in range(WORLD_SIZE)) == \
    WORLD_SIZE * (2 * WORLD_SIZE + 1) == sum(predicted_pairs("contiguous", r, i) for r in range(WORLD_SIZE)
                                             for i in range(WORLD_SIZE))
print(f"predicted ring time in chunk pairs: contiguous {CRITICAL_PATH['contiguous']},"
      f" zigzag {CRITICAL_PATH['zigzag']} (a factor {CRITICAL_PATH['contiguous'] / CRITICAL_PATH['zigzag']:.2f} shorter)")

# %%
# The figure draws the prediction: the causal attention matrix in chunks,
# each computed pair coloured by the rank that computes it and labelled with
# the step. Contiguous blocks give the last rank the two bottom rows, four
# pairs per step, while the first rank waits; zigzag gives every rank two
# pairs per step. The ranks' own records must reproduce this figure pair by pair.


def computed_pairs(layout, query_rank, key_rank):
    """The chunk pairs a rank computes when it holds ``key_rank``'s keys and values."""
    return [(a, b) for a in chunks_of(layout, query_rank) for b in chunks_of(layout, key_rank) if b <= a]


fig, axes = plt.subplots(1, 2, figsize=(10, 4.6))
colours = plt.get_cmap("tab10")
for ax, layout in zip(axes, ("contiguous", "zigzag")):
    ax.set_xlim(-0.5, 2 * WORLD_SIZE - 0.5)
    ax.set_ylim(2 * WORLD_SIZE - 0.5, -0.5)
    for rank in range(WORLD_SIZE):
        for step in range(WORLD_SIZE):
            for a, b in computed_pairs(layout, rank, (rank - step) % WORLD_SIZE):
                ax.add_patch(plt.Rectangle((b - 0.5, a - 0.5), 1, 1, color=colours(rank), alpha=0.75))
                ax.text(b, a, str(step), ha="center", va="center", fontsize="small")
    ax.set_xticks(range(2 * WORLD_SIZE))
    ax.set_yticks(range(2 * WORLD_SIZE))
    ax.set_xlabel("key chunk")
    ax.set_ylabel("query chunk")
    ax.set_aspect("equal")
    steps = ", ".join(str(max(predicted_pairs(layout, r, i) for r in range(WORLD_SIZE))) for i in range(WORLD_SIZE))
    ax.set_title(f"{layout}: busiest rank's pairs per step {steps}", fontsize="medium")
handles = [plt.Rectangle((0, 0), 1, 1, color=colours(r), alpha=0.75) for r in range(WORLD_SIZE)]
fig.legend(handles, [f"rank {r}" for r in range(WORLD_SIZE)], loc="lower center", ncol=WORLD_SIZE,
           frameon=False)
fig.suptitle(f"Causal attention in {2 * WORLD_SIZE} chunks on {WORLD_SIZE} ranks: the number is the ring step",
             fontsize="medium")
fig.tight_layout(rect=(0, 0.07, 1, 1))

# %%
# One chunk pair, and the merge
# -----------------------------
# For its queries against one key chunk a rank computes the chunk's output
# and, per query row, the log-sum-exp of its scores,
#
# .. math:: O = \operatorname{softmax}(s)\,V, \qquad \ell = \log \sum_j e^{s_j}, \qquad s = q k^\top / \sqrt{D}.
#
# Two partial results for the same queries over disjoint sets of keys merge
# exactly, by lecture 5's online softmax:
# :math:`\ell = \log(e^{\ell_1} + e^{\ell_2})` and
# :math:`O = e^{\ell_1 - \ell} O_1 + e^{\ell_2 - \ell} O_2`. A rank starts from
# :math:`O = 0` and :math:`\ell = -\infty` and merges pair after pair, in any
# order. The keys and values travel with their :math:`H_{kv}` heads, and each
# rank repeats them :math:`g` times only for its own matmuls, so that a block
# costs :math:`g` times fewer bytes than the queries it serves.


def chunk_attention(q, k, v, diagonal, fault=None):
    """Output and log-sum-exp of queries ``q`` against one chunk of keys and values."""
    if fault == "float32 scores":  # planted: a precision bug
        scores = (q.float() @ k.float().transpose(-2, -1)).to(q.dtype) * SCALE
    else:
        scores = q @ k.transpose(-2, -1) * SCALE
    if diagonal:  # a query sees its own token and the ones before it
        above = torch.ones(q.shape[-2], k.shape[-2], dtype=torch.bool, device=q.device).triu(1)
        scores = scores.masked_fill(above, -math.inf)
    lse = torch.logsumexp(scores, dim=-1, keepdim=True)
    return torch.exp(scores - lse) @ v, lse


def merge(out, lse, block_out, block_lse, fault=None):
    """The online-softmax merge of two partial results over disjoint keys."""
    merged = torch.logaddexp(lse, block_lse)
    if fault == "no rescaling":  # planted: adds the partial outputs as they are
        return out + block_out, merged
    return out * torch.exp(lse - merged) + block_out * torch.exp(block_lse - merged), merged


def attend(q, kv, query_chunks, key_chunks, out, lse, fault=None):
    """Merge the attention of this rank's queries to one block of keys and values into ``out``, ``lse``."""
    pairs = []
    for i, a in enumerate(query_chunks):
        rows = slice(i * CHUNK, (i + 1) * CHUNK)
        for j, b in enumerate(key_chunks):
            if b > a:
                continue  # masked out entirely: not computed
            cols = slice(j * CHUNK, (j + 1) * CHUNK)
            k = kv[0][:, :, cols].repeat_interleave(GROUP, dim=1)
            v = kv[1][:, :, cols].repeat_interleave(GROUP, dim=1)
            block_out, block_lse = chunk_attention(q[:, :, rows], k, v, diagonal=a == b, fault=fault)
            out[:, :, rows], lse[:, :, rows] = merge(out[:, :, rows], lse[:, :, rows], block_out, block_lse, fault)
            pairs.append((a, b))
    return pairs


# %%
# The ring, and the all-gather
# ----------------------------
# At each step a rank first posts the next hop, sending the block it holds to
# rank :math:`r+1` and receiving rank :math:`r-1`'s (``batch_isend_irecv``,
# so that neither waits for the other), then computes with the block it holds
# while the transfer runs, and waits for the hop before the next step. After
# :math:`c` steps every block has visited every rank; the last step sends
# nothing, so a rank sends :math:`c-1` blocks.
#
# The all-gather variant, which Llama 3 used for its long-context training
# (and the default of PyTorch's ``context_parallel``), collects every block
# first and then computes. It moves the same bytes in a ring all-gather,
# :math:`(c-1)` blocks per rank, but holds all :math:`c` blocks at once. Llama
# 3's reasons: with grouped-query attention the keys and values are
# :math:`g` times smaller than the queries, so the exposed transfer is small,
# and any mask (one per document, say) is easy, since every rank sees every
# key. Here it overlaps nothing; PyTorch's issues the all-gather
# asynchronously and computes the rank's own block meanwhile.


def ring_attention(q, k, v, rank, world_size, layout, fault=None):
    """This rank's causal attention output, the keys and values passed around the ring; and its steps."""
    mask_layout = "contiguous" if fault == "zigzag masked as contiguous" else layout
    kv = torch.stack([k, v])  # one message per hop
    out = torch.zeros_like(q)
    lse = torch.full((*q.shape[:-1], 1), -math.inf, dtype=q.dtype, device=q.device)
    steps = []
    for step in range(world_size):
        source = (rank - step) % world_size
        if step + 1 < world_size:  # post the next hop first: it travels while this block is computed
            incoming = torch.empty_like(kv)
            hop = dist.batch_isend_irecv([dist.P2POp(dist.isend, kv, (rank + 1) % world_size),
                                          dist.P2POp(dist.irecv, incoming, (rank - 1) % world_size)])
        with FlopCounterMode(display=False) as flops:
            pairs = attend(q, kv, chunks_of(mask_layout, rank), chunks_of(mask_layout, source), out, lse, fault)
        steps.append({"pairs": pairs, "flops": flops.get_total_flops()})
        if step + 1 < world_size:
            for request in hop:
                request.wait()
            kv = incoming
    return out, steps


def all_gather_attention(q, k, v, rank, world_size, layout, fault=None):
    """The same output, with every rank's keys and values gathered first: one step."""
    blocks = [torch.empty_like(torch.stack([k, v])) for _ in range(world_size)]
    dist.all_gather(blocks, torch.stack([k, v]))
    out = torch.zeros_like(q)
    lse = torch.full((*q.shape[:-1], 1), -math.inf, dtype=q.dtype, device=q.device)
    with FlopCounterMode(display=False) as flops:
        pairs = [pair for source in range(world_size)
                 for pair in attend(q, blocks[source], chunks_of(layout, rank), chunks_of(layout, source), out, lse)]
    return out, [{"pairs": pairs, "flops": flops.get_total_flops()}]


# %%
# Each rank runs every variant and counts what it hands to the library to
# send: a ``TorchDispatchMode`` sees each ``c10d.send`` (the op behind
# ``isend``) and each ``c10d.allgather_``, and ``FlopCounterMode`` counts the
# matmul FLOPs of every step. Three of the variants plant a fault that the
# check below must reject: merging without the rescaling, zigzag data with
# the masks of contiguous blocks, and scores computed in float32.


class SentBytes(TorchDispatchMode):
    """What this rank passes to sends and to all-gathers: (op, bytes) per call."""

    def __init__(self):
        super().__init__()
        self.calls = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func is torch.ops.c10d.send.default:  # (tensors, group, peer, tag)
            self.calls.append(("send", sum(t.numel() * t.element_size() for t in args[0])))
        elif func is torch.ops.c10d.allgather_.default:  # (output lists, inputs, group, ...)
            self.calls.append(("all-gather", sum(t.numel() * t.element_size() for t in args[1])))
        return func(*args, **(kwargs or {}))


VARIANTS = [  # (label, algorithm, layout, planted fault)
    ("ring, contiguous blocks", "ring", "contiguous", None),
    ("ring, zigzag chunks", "ring", "zigzag", None),
    ("all-gather, zigzag chunks", "all-gather", "zigzag", None),
    ("fault: merge without rescaling", "ring", "zigzag", "no rescaling"),
    ("fault: zigzag data, contiguous masks", "ring", "zigzag", "zigzag masked as contiguous"),
    ("fault: scores in float32", "ring", "zigzag", "float32 scores"),
]
ALGORITHMS = {"ring": ring_attention, "all-gather": all_gather_attention}


def local_rows(layout, rank, full):
    """A rank's tokens of a (B, heads, S, D) tensor: its chunks, in the order it holds them."""
    return torch.cat([full[:, :, c * CHUNK:(c + 1) * CHUNK] for c in chunks_of(layout, rank)], dim=2)


def context_parallel_worker(rank, world_size, q, k, v):
    device = rank_device(rank)
    results = []
    for _, algorithm, layout, fault in VARIANTS:
        mine = [local_rows(layout, rank, t).to(device) for t in (q, k, v)]
        with SentBytes() as sent:
            out, steps = ALGORITHMS[algorithm](*mine, rank, world_size, layout, fault)
        results.append({"out": out.cpu(), "steps": steps, "sent": sent.calls})
    return results


Q = torch.randn(BATCH, HEADS, SEQUENCE, HEAD_DIM, dtype=DTYPE)
K = torch.randn(BATCH, KV_HEADS, SEQUENCE, HEAD_DIM, dtype=DTYPE)
V = torch.randn(BATCH, KV_HEADS, SEQUENCE, HEAD_DIM, dtype=DTYPE)
ranks = run_ranks(context_parallel_worker, WORLD_SIZE, Q, K, V, backend=BACKEND)

# %%
# Verify against one process
# --------------------------
# The reference is PyTorch's ``scaled_dot_product_attention``, causal, on the
# whole sequence in this process. Both sides compute the same sums in other
# orders, so they agree up to rounding, and the tolerance is a first-order
# bound on it, element by element, in units of float64's :math:`u = 2^{-53}`
# (a first-order bound evaluated on the data, as in the other examples of
# this lecture). A score is off by at most
# :math:`\lambda = (D+2)\,u\,|q|^\top|k|/\sqrt{D}` on each side (absolute
# values taken element by element). A softmax weight is then off, relative
# to itself, by the propagated :math:`2\lambda_{\max}` (the largest in its
# row), by a few :math:`u` for each exponential (accurate to one ulp,
# :math:`2u`), the sum of at most :math:`S` terms and the division, and by
# the absolute roundings of the shifts in the exponents (:math:`s - m`,
# :math:`s - \ell`, and :math:`\ell_1 - \ell` in each of at most :math:`2c`
# merges), which an exponential turns into relative errors of about
# :math:`u\,(2\max|s| + \log S)` each. The output, a sum of at most
# :math:`S` weighted values, is off by that times :math:`\sum_j p_j |v_j|`,
# plus :math:`(S + 2c)\,u` of the same sum. Twice this bounds the difference
# of the two sides. A missing rescaling or a wrong mask is off by order one,
# float32 scores by about :math:`10^{-7}`: far outside.


def reference_attention(q, k, v):
    return F.scaled_dot_product_attention(q, k.repeat_interleave(GROUP, dim=1), v.repeat_interleave(GROUP, dim=1),
                                          is_causal=True)


def rounding_bound(q, k, v):
    """A first-order bound on |ranks - reference| for every output element."""
    k, v = k.repeat_interleave(GROUP, dim=1), v.repeat_interleave(GROUP, dim=1)
    causal = torch.ones(SEQUENCE, SEQUENCE, dtype=torch.bool).tril()
    scores = (q @ k.transpose(-2, -1) * SCALE).masked_fill(~causal, -math.inf)
    weights = scores.softmax(dim=-1)
    score_error = (HEAD_DIM + 2) * UNIT * SCALE * (q.abs() @ k.abs().transpose(-2, -1))
    worst_in_row = score_error.masked_fill(~causal, 0).amax(dim=-1, keepdim=True)
    largest = scores.masked_fill(~causal, 0).abs().amax(dim=-1, keepdim=True)
    shifts = (2 * WORLD_SIZE + 5) * UNIT * (2 * largest + math.log(SEQUENCE))  # absolute roundings in exponents
    relative = 2 * worst_in_row + shifts + (SEQUENCE + 8) * UNIT + (SEQUENCE + 2 * WORLD_SIZE) * UNIT
    return 2 * relative * (weights @ v.abs())


def assembled(layout, outputs):
    """The full (B, H, S, D) output from the ranks' chunks."""
    full = torch.empty(BATCH, HEADS, SEQUENCE, HEAD_DIM, dtype=DTYPE)
    for rank, out in enumerate(outputs):
        for i, c in enumerate(chunks_of(layout, rank)):
            full[:, :, c * CHUNK:(c + 1) * CHUNK] = out[:, :, i * CHUNK:(i + 1) * CHUNK]
    return full


REFERENCE = reference_attention(Q, K, V)
BOUND = rounding_bound(Q, K, V)
print(f"\n{'variant':<38}{'worst error / bound':>20}")
USE = []
for index, (label, _, layout, fault) in enumerate(VARIANTS):
    use = (assembled(layout, [result[index]["out"] for result in ranks]) - REFERENCE) / BOUND
    USE.append(use.abs().max().item())
    print(f"{padded(label, 38)}{USE[index]:>20.2e}")
    if fault is None:
        torch.testing.assert_close(use, torch.zeros_like(use), rtol=0, atol=1.0,
                                   msg=lambda message, label=label: f"{label} (difference over its bound): {message}")
    else:
        assert USE[index] > 1e3, f"{label}: the check did not catch the planted fault"
print("all three match one process's causal attention (float64); the three planted faults are caught")

# %%
# Check the counts
# ----------------
# Every rank's records against the prediction: the pairs it computed at each
# step are those of the figure, as many as the closed forms say, and
# together the ranks computed every pair below or on the diagonal exactly
# once; FlopCounterMode's count of each step is :math:`4BHn^2D` per pair; and
# a rank of the ring sent :math:`c-1` blocks of keys and values, while the
# all-gather moved the same :math:`c-1` blocks per rank in the ring model of
# :ref:`sphx_glr_auto_examples_lecture07_parallelism_01_collectives.py`.

ALL_PAIRS = sorted((a, b) for a in range(2 * WORLD_SIZE) for b in range(a + 1))
for index, (label, algorithm, layout, fault) in enumerate(VARIANTS[:3]):
    every_pair = []
    for rank, result in enumerate(ranks):
        steps = result[index]["steps"]
        for step, record in enumerate(steps):
            every_pair += record["pairs"]
            assert record["flops"] == PAIR_FLOPS * len(record["pairs"]), (label, rank, step)
            if algorithm == "ring":
                assert record["pairs"] == computed_pairs(layout, rank, (rank - step) % WORLD_SIZE), (label, rank, step)
                assert len(record["pairs"]) == predicted_pairs(layout, rank, step), (label, rank, step)
        if algorithm == "ring":
            assert len(steps) == WORLD_SIZE and result[index]["sent"] == [("send", BLOCK_BYTES)] * (WORLD_SIZE - 1)
        else:
            assert len(steps) == 1 and result[index]["sent"] == [("all-gather", BLOCK_BYTES)]
            assert len(steps[0]["pairs"]) == 2 * WORLD_SIZE + 1  # zigzag: the even share
    assert sorted(every_pair) == ALL_PAIRS, label

RING_TIME = {layout: sum(max(ranks[r][index]["steps"][i]["flops"] for r in range(WORLD_SIZE))
                         for i in range(WORLD_SIZE)) // PAIR_FLOPS
             for index, (_, _, layout, _) in enumerate(VARIANTS[:2])}
assert RING_TIME == CRITICAL_PATH, RING_TIME
print(f"\nchunk pairs computed by ranks 0 to {WORLD_SIZE - 1} at each step (each pair {PAIR_FLOPS:,} FLOPs)")
print(f"{'step':>4}   {'contiguous':<{3 * WORLD_SIZE + 4}}{'zigzag':<{3 * WORLD_SIZE}}")
for step in range(WORLD_SIZE):
    row = [" ".join(f"{len(ranks[r][index]['steps'][step]['pairs']):>2}" for r in range(WORLD_SIZE))
           for index in (0, 1)]
    print(f"{step:>4}   {row[0]:<{3 * WORLD_SIZE + 4}}{row[1]}")
print(f"busiest rank per step, summed: contiguous {RING_TIME['contiguous']} pairs, zigzag {RING_TIME['zigzag']}"
      f" = 2c + 1, the even share (a factor {RING_TIME['contiguous'] / RING_TIME['zigzag']:.2f} shorter)")
print(f"bytes each rank sends in the ring: {WORLD_SIZE - 1} blocks, {(WORLD_SIZE - 1) * BLOCK_BYTES:,} B (counted);"
      f" in a ring all-gather the same {WORLD_SIZE - 1} blocks (the model of example 01), and it holds {WORLD_SIZE} at once")

# %%
# Communication against compute on H200s
# --------------------------------------
# Take one sequence and a model of width :math:`h = HD`, whose keys and
# values are :math:`h/g` wide. A rank of the zigzag ring computes two chunk
# pairs per step, :math:`2h\,(s/c)^2` FLOPs, and sends one block,
# :math:`2\,(s/c)\,(h/g)` numbers, :math:`4\,(s/c)\,(h/g)` bytes in bf16.
# The intensity of a step is :math:`g\,(s/c)/2` FLOPs per byte, and the
# transfer hides behind the attention when it exceeds the link's ratio
# :math:`P/\beta`: for blocks of
#
# .. math:: \frac{s}{c} \ \ge\ \frac{2P}{g\,\beta}
#
# tokens. Non-causal attention computes twice the pairs, so it needs half the
# block. The cluster is that of
# :ref:`sphx_glr_auto_examples_lecture07_parallelism_06_choosing_a_layout.py`:
# NVLink at 450 GB/s per GPU each way, one 400 Gb/s ConnectX-7 adapter per
# GPU, 50 GB/s each way, for a ring whose neighbours sit in different nodes
# (NVIDIA's H200 and DGX H200 datasheets), and the datasheet's BF16 rate of
# 1979 TFLOP/s, which counts sparsity: 989.5 TFLOP/s dense. A step lasts as
# long as its slowest hop, so a ring that crosses nodes anywhere runs at the
# adapter's rate. These are the forward pass's figures at the peak rates:
# attention that reaches only part of its peak hides a transfer with a
# smaller block; a link that reaches only part of its peak, or a transfer
# that takes SMs from the attention, needs a larger one.

H200 = {"bf16_flops_per_s": 1979e12 / 2, "links": [("NVLink", 450e9), ("one adapter", 400e9 / 8)]}
NVLINK, ADAPTER = 0, 1  # positions in the list of links


def step_flops(tokens_per_rank, width, batch=1):
    """Matmul FLOPs of one zigzag ring step: two chunk pairs."""
    return 2 * batch * width * tokens_per_rank**2


def step_bytes(tokens_per_rank, width, group, element_bytes, batch=1):
    """Bytes of one hop: a rank's keys and values."""
    return 2 * batch * tokens_per_rank * (width // group) * element_bytes


# The model must give this run's own counts at this run's sizes.
assert step_flops(2 * CHUNK, HEADS * HEAD_DIM, BATCH) == 2 * PAIR_FLOPS == ranks[0][1]["steps"][1]["flops"]
assert step_bytes(2 * CHUNK, HEADS * HEAD_DIM, GROUP, ELEMENT_BYTES, BATCH) == BLOCK_BYTES


def smallest_hiding_block(group, bytes_per_s, element_bytes=2, peak=H200["bf16_flops_per_s"]):
    return element_bytes * peak / (group * bytes_per_s)


print(f"\n{'link':<22}{'g':>3}{'smallest block that hides its hop (tokens)':>45}   (forward, bf16, model)")
HIDING = {}
for position, (link, bytes_per_s) in enumerate(H200["links"]):
    for group in (1, 8):
        HIDING[position, group] = smallest_hiding_block(group, bytes_per_s)
        tokens = HIDING[position, group]
        # At that block, the hop and the step's attention take the same time (4 roundings each side).
        width = 8192
        step_s = step_flops(tokens, width) / H200["bf16_flops_per_s"]
        hop_s = step_bytes(tokens, width, group, 2) / bytes_per_s
        assert math.isclose(step_s, hop_s, rel_tol=9 * UNIT), (link, group, step_s, hop_s)
        print(f"{padded(f'{link} {bytes_per_s / 1e9:.0f} GB/s', 22)}{group:>3}{tokens:>45,.0f}")

# Llama 3 405B's long-context stage: 131,072 tokens, context parallel 16 (Llama Team 2024, Table 4),
# 128 query heads and 8 key-value heads (its Table 3).
LLAMA3_CP = {"sequence": 131072, "cp": 16, "heads": 128, "kv_heads": 8}
llama_block = LLAMA3_CP["sequence"] // LLAMA3_CP["cp"]
llama_group = LLAMA3_CP["heads"] // LLAMA3_CP["kv_heads"]
llama_margin = llama_block / smallest_hiding_block(llama_group, H200["links"][ADAPTER][1])
assert llama_margin > 1
print(f"Llama 3 405B at {LLAMA3_CP['sequence']:,} tokens on {LLAMA3_CP['cp']} ranks: blocks of {llama_block:,}"
      f" tokens, g = {llama_group}: {llama_margin:.1f} times the block that hides a hop through one adapter")

# %%
# The figure shows one ring step of a 70B-sized layer (:math:`h = 8192`, eight
# query heads per key-value head) against the block size: the attention's
# time grows with the square of the block, a hop's only linearly, so past the
# crossings the transfer is free. Through one adapter the crossing needs
# blocks nine times longer than on NVLink.

WIDTH_70B, GROUP_70B = 8192, 8
blocks = [2**e for e in range(7, 17)]
fig, ax = plt.subplots(figsize=(7.5, 4.4))
ax.loglog(blocks, [1e6 * step_flops(t, WIDTH_70B) / H200["bf16_flops_per_s"] for t in blocks], "k-",
          label="attention of one step, at the peak rate")
for position, ((link, bytes_per_s), style) in enumerate(zip(H200["links"], ("tab:blue", "tab:orange"))):
    for group, dash in ((1, ":"), (GROUP_70B, "-")):
        ax.loglog(blocks, [1e6 * step_bytes(t, WIDTH_70B, group, 2) / bytes_per_s for t in blocks],
                  linestyle=dash, color=style, label=f"hop over {link}, g = {group}")
        crossing = HIDING[position, group]
        ax.plot([crossing], [1e6 * step_flops(crossing, WIDTH_70B) / H200["bf16_flops_per_s"]], "o", color=style)
ax.set_xlabel("tokens per rank, s / c")
ax.set_ylabel("time per ring step (microseconds)")
ax.set_title("Ring attention on H200s, h = 8192, bf16: a model from datasheet figures", fontsize="medium")
ax.legend(fontsize="small")
fig.tight_layout()

# %%
# Read the result
# ---------------
# Context parallelism is exact: the ring and the all-gather both give the
# causal attention of the whole sequence, to float64's rounding, and the
# three planted faults miss it by orders of magnitude. Where the tokens sit
# decides the time. With contiguous blocks the last rank computes a whole
# row of the causal matrix while the first one waits, and the ring takes
# :math:`4c-1` pair times; two chunks per rank from opposite ends make every
# step equal, :math:`2c+1`, the even share, with the same bytes. The bytes
# are small beside the arithmetic: the intensity of a step grows with the
# block, :math:`g\,(s/c)/2` in bf16, so long sequences, the reason to split at all,
# hide their hops. Grouped-query attention divides the bytes by :math:`g`
# and makes even a ring across nodes cheap: Llama 3's blocks of 8,192
# tokens, with :math:`g = 16`, would hide their hop even through one adapter,
# as the table's last line says (its H100s have the H200's dense bf16 rate
# and a 400 Gb/s adapter per GPU), although Llama 3 all-gathered instead.
#
# What this example leaves out. The backward pass sends the key and value
# blocks around the ring again, and their gradients travel around the ring
# too, one hop behind, with a last hop home that nothing overlaps: per step
# twice the forward's bytes with bf16 gradients, three times in PyTorch,
# which rotates them in float32. Its arithmetic is about 2.5 times the
# forward's (five matmuls against two, as FlashAttention recomputes the
# scores), so it hides its bytes a little better than the forward with bf16
# gradients and a little worse with float32 ones. A real kernel computes
# each chunk pair with FlashAttention and skips the masked half of a
# diagonal pair. DeepSpeed Ulysses re-shards by heads instead, with an
# all-to-all before attention and one after, which limits :math:`c` by the
# number of (key-value) heads. PyTorch's own ``context_parallel``
# (``torch.distributed.tensor.experimental``; it intercepts the CUDA
# kernels of scaled-dot-product attention) shards the tensors it is given
# (the input batch, the labels, positional buffers) along the sequence, in
# place, reorders them head to tail as the zigzag layout does when the
# sequence divides into :math:`2c` chunks, and merges block by block as
# here: by default after one all-gather of the keys and values, issued
# asynchronously so that it overlaps the rank's own block, or around the
# ring with ``set_rotate_method("alltoall")``.

KEY_FIGURES = {
    "device": DEVICE_NAME,
    "world_size": WORLD_SIZE,
    "sequence": SEQUENCE,
    "worst_error_over_bound": max(USE[index] for index, variant in enumerate(VARIANTS) if variant[3] is None),
    "ring_time_pairs_contiguous": RING_TIME["contiguous"],
    "ring_time_pairs_zigzag": RING_TIME["zigzag"],
    "bytes_sent_per_rank": (WORLD_SIZE - 1) * BLOCK_BYTES,
    "h200_hiding_block_nvlink_g1": HIDING[NVLINK, 1],
    "h200_hiding_block_adapter_g1": HIDING[ADAPTER, 1],
    "llama3_block_over_adapter_threshold": llama_margin,
}
