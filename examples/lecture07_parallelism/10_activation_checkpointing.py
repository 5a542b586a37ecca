"""
Activation checkpointing: memory saved against compute repaid
=============================================================

The backward pass reads tensors that the forward pass computed, so training
keeps them alive until backward needs them. Activation checkpointing keeps
fewer and computes the rest again during backward. We list, tensor by tensor,
what one transformer layer keeps, predict the bytes and the FLOPs of four
policies (keep everything, recompute each whole layer, recompute everything
but the linear layers' outputs, recompute only the core attention), measure
both exactly, and check that every policy's gradients are bitwise those of
the first.

**Requirements.** Any machine: on a CPU a small stack of layers in float64, at
irregular sizes; the byte and FLOP counts are exact on any device. On a CUDA
GPU: a wider, longer stack in bfloat16, and the allocator's peak memory per
policy beside the count. Times per step are printed, never asserted.
"""

# %%
# Setup
# -----
# A stack of ``LAYERS`` pre-norm GPT layers: ``BATCH`` sequences of
# ``SEQUENCE`` tokens, width :math:`h` = ``HEADS`` x ``HEAD_DIM``, an MLP four
# times as wide, dropout on the attention probabilities and after both
# branches, as in the layer that Korthikanti et al. (2023) count. No width,
# head count, head size or sequence length is a power of two.

import functools
import platform
import unicodedata

import matplotlib.pyplot as plt
import torch
import torch.nn.functional as F
from torch import nn
from torch.multiprocessing.reductions import StorageWeakRef
from torch.utils import benchmark
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils.checkpoint import checkpoint, create_selective_checkpoint_contexts
from torch.utils.flop_counter import FlopCounterMode

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
if DEVICE == "cuda":
    DTYPE = torch.bfloat16
    BATCH, SEQUENCE, HEADS, HEAD_DIM, LAYERS = 3, 1031, 12, 85, 4
    DEVICE_NAME = torch.cuda.get_device_name()
else:
    DTYPE = torch.float64
    BATCH, SEQUENCE, HEADS, HEAD_DIM, LAYERS = 2, 67, 3, 13, 3
    DEVICE_NAME = f"{platform.machine()} CPU, {torch.get_num_threads()} threads"
WIDTH = HEADS * HEAD_DIM
P_DROP = 0.1
torch.manual_seed(0)
print(f"device: {DEVICE_NAME}   {DTYPE}   {LAYERS} layers, batch {BATCH}, sequence {SEQUENCE},"
      f" width {WIDTH} = {HEADS} heads x {HEAD_DIM}")

# %%
# Predict: what one layer keeps for backward
# ------------------------------------------
# Each operation keeps what its derivative reads: a linear layer its input (the
# gradient of its weight is :math:`X^T\,\mathrm{d}Y`), a layer norm its input
# and, per token, its mean and inverse standard deviation, a softmax its
# output, a GeLU its input, a dropout its mask. In attention, ``q @ k^T`` reads
# :math:`Q` and :math:`K` and ``p @ v`` reads :math:`P` and :math:`V`; the
# heads are split out of one ``qkv`` tensor by a transpose, so ``matmul``,
# folding sequences and heads into the one batch dimension of ``bmm``, copies
# each of them into a contiguous block (with more than one sequence; with one,
# the fold is a view), and ``bmm`` keeps the copies.
# Korthikanti et al. (2023) count the same list for 16-bit activations,
# 1-byte masks and :math:`s` tokens, :math:`b` sequences, width :math:`h`,
# :math:`a` heads:
#
# .. math:: M_\text{act} = s\,b\,h\left(34 + \frac{5\,a\,s}{h}\right)\ \text{bytes per layer}.
#
# With :math:`e` bytes per activation, :math:`m` per mask element and
# :math:`e_\text{stat}` per layer-norm statistic, our layer keeps
# :math:`s b h\,(16 e + 2 m) + a s^2 b\,(2 e + m) + 4 s b\,e_\text{stat}` bytes.
# At :math:`e = 2`, :math:`m = 1` that is their formula plus the layer norms'
# statistics, which they leave out (float32 on a GPU: :math:`16\,sb` bytes,
# a fraction :math:`16/(34h)` of the first term). Two differences belong to
# the device: in float64 :math:`e = 8`, and on a CPU ``F.dropout`` keeps its
# mask as a scaled noise tensor of the input's dtype (:math:`m = e`), while on
# CUDA its fused kernel keeps a 1-byte ``bool`` mask.

MASK_DTYPE = torch.bool if DEVICE == "cuda" else DTYPE
# layer norm's mean and 1/std: CUDA keeps them in the accumulation type, a CPU in the input's
STAT_DTYPE = torch.float32 if DEVICE == "cuda" and DTYPE.itemsize == 2 else DTYPE


def saved_by_one_layer(b, s, h, a, dtype, mask_dtype, stat_dtype):
    """What autograd keeps for one layer, in forward order: (tensor, elements, dtype)."""
    sbh, sb, scores = s * b * h, s * b, a * s * s * b
    return [
        ("LN1 input (the layer's input)", sbh, dtype), ("LN1 mean per token", sb, stat_dtype),
        ("LN1 1/std per token", sb, stat_dtype), ("QKV input (LN1 output)", sbh, dtype),
        ("Q (contiguous copy)", sbh, dtype), ("K transposed (copy)", sbh, dtype),
        ("softmax output", scores, dtype), ("dropout mask on P", scores, mask_dtype),
        ("P after dropout", scores, dtype), ("V (contiguous copy)", sbh, dtype),
        ("proj input (heads merged)", sbh, dtype), ("dropout mask after proj", sbh, mask_dtype),
        ("LN2 input (after attention)", sbh, dtype), ("LN2 mean per token", sb, stat_dtype),
        ("LN2 1/std per token", sb, stat_dtype),
        ("fc1 input (LN2 output)", sbh, dtype), ("GeLU input (fc1 output)", 4 * sbh, dtype),
        ("fc2 input (GeLU output)", 4 * sbh, dtype), ("dropout mask after fc2", sbh, mask_dtype),
    ]


def layer_bytes(b, s, h, a, e, m, e_stat):
    """The same list in closed form."""
    return s * b * h * (16 * e + 2 * m) + a * s * s * b * (2 * e + m) + 4 * s * b * e_stat


def korthikanti_bytes(b, s, h, a):
    """s b h (34 + 5 a s / h), 16-bit activations, 1-byte dropout masks."""
    return 34 * s * b * h + 5 * a * s * s * b


SAVED = saved_by_one_layer(BATCH, SEQUENCE, WIDTH, HEADS, DTYPE, MASK_DTYPE, STAT_DTYPE)
LAYER_BYTES = sum(n * dtype.itemsize for _, n, dtype in SAVED)
assert LAYER_BYTES == layer_bytes(BATCH, SEQUENCE, WIDTH, HEADS, DTYPE.itemsize, MASK_DTYPE.itemsize,
                                  STAT_DTYPE.itemsize)
for shape in [(BATCH, SEQUENCE, WIDTH, HEADS), (1, 4096, 8192, 64)]:  # ours, and the lecture's layer
    assert layer_bytes(*shape, e=2, m=1, e_stat=0) == korthikanti_bytes(*shape)  # an identity: it checks the code


def padded(text, width):
    """``text`` left-aligned in ``width`` columns, a Chinese character taking two."""
    return text + " " * (width - sum(2 if unicodedata.east_asian_width(c) in "WF" else 1 for c in text))


print(f"{'saved for backward, one layer':<32}{'elements':>10}{'dtype':>10}{'bytes':>10}")
for name, n, dtype in SAVED:
    print(f"  {padded(name, 30)}{n:>10,}{str(dtype).removeprefix('torch.'):>10}{n * dtype.itemsize:>10,}")
print(f"  {'total':<30}{'':>20}{LAYER_BYTES:>10,}")

# %%
# Predict: the four policies
# --------------------------
# **Keep all** keeps the list above for every layer. **Full recompute** wraps
# each layer in ``torch.utils.checkpoint.checkpoint``: it keeps only each
# layer's input, :math:`s b h\,e` bytes, and runs the layer's forward again
# when backward reaches it. **Save matmuls** wraps each layer too, with a
# *selective* policy (``create_selective_checkpoint_contexts``): the outputs of
# the linear layers' matmuls (``aten.addmm``, ``aten.mm``) are kept, everything
# else is recomputed from them, the attention's two batched matmuls
# (``aten.bmm``) included, since their outputs are the :math:`s \times s`
# scores and the attention output. It keeps the layer's input and the outputs
# of ``qkv``, ``proj``, ``fc1`` and ``fc2``: :math:`(1 + 3 + 1 + 4 + 1)\,s b h\,e`
# bytes. **Core attention** is Korthikanti's selective recomputation, as
# Megatron-LM implements it: a checkpoint around the scores, softmax, dropout and
# ``p @ v`` only. It drops the three :math:`s \times s` tensors, the
# :math:`5as/h` term, and keeps :math:`Q, K, V` as slices of ``qkv``, the
# same bytes as the three copies.
#
# FLOPs: a forward pass of the stack costs :math:`F = L\,(24 b s h^2 + 4 b s^2 h)`
# in its matmuls (the four linear layers :math:`2bs \cdot 12h^2`, the two
# attention matmuls :math:`2bs^2h` each), and backward twice that, two matmuls
# for each one of the forward. A step is :math:`3F`. Full recompute adds one
# forward: :math:`4F`, a third more. Save matmuls adds the two attention
# matmuls, :math:`4 b s^2 h` per layer. Core attention adds only
# :math:`Q K^T`, :math:`2 b s^2 h`: by default non-reentrant checkpointing
# stops recomputing as soon as it has rebuilt as many tensors as the region
# saved, and the last of them are the inputs of ``p @ v``, saved as that op is
# called, before it computes. A reentrant checkpoint, such as Megatron-LM's,
# reruns the whole region: both matmuls. (For the same reason full
# recomputation would skip ``fc2`` if no dropout followed it; here the
# dropout's mask comes after.)
# FlashAttention's backward makes the same trade: it recomputes the scores
# from :math:`Q, K` and never needs them stored. ``FlopCounterMode`` counts
# only matmul-like ops (matmuls, convolutions, attention kernels); the
# recomputed layer norms, softmaxes, GeLUs and dropouts cost time, not counted
# FLOPs.

POLICIES = ["keep all", "core attention", "save matmuls", "full recompute"]


def held_bytes_per_layer(b, s, h, a, e, m, e_stat):
    """Bytes each policy keeps for backward, per layer."""
    keep_all = layer_bytes(b, s, h, a, e, m, e_stat)
    return {"keep all": keep_all, "core attention": keep_all - a * s * s * b * (2 * e + m),
            "save matmuls": 10 * s * b * h * e, "full recompute": s * b * h * e}


def step_flops_per_layer(b, s, h):
    """Matmul FLOPs of one forward and backward step, per layer, under each policy."""
    linear, attention_matmul = 24 * b * s * h * h, 2 * b * s * s * h
    forward = linear + 2 * attention_matmul
    return {"keep all": 3 * forward, "core attention": 3 * forward + attention_matmul,
            "save matmuls": 3 * forward + 2 * attention_matmul, "full recompute": 4 * forward}


# %%
# The trade at the lecture's scale
# --------------------------------
# Before measuring, the same counts for the lecture's example layer (width
# 8192 and 64 heads, as in Llama 2 70B but without its grouped-query
# attention, and a GPT-style MLP, bf16 on a GPU), one sequence of growing
# length: gigabytes kept per layer, and the extra matmul FLOPs of a step.
# The :math:`s^2` term takes over the memory of "keep all" at long
# sequences; the selective policies remove it for a compute cost that grows
# with :math:`s` too, but stays a few percent while :math:`s` is not much
# larger than :math:`h`.

LECTURE = {"b": 1, "h": 8192, "a": 64}
lengths = [2**k for k in range(10, 16)]
fig, (ax_bytes, ax_flops) = plt.subplots(1, 2, figsize=(9.6, 3.8))
for policy in POLICIES:
    held = [held_bytes_per_layer(LECTURE["b"], s, LECTURE["h"], LECTURE["a"], 2, 1, 4)[policy] / 1e9
            for s in lengths]
    flops = [step_flops_per_layer(LECTURE["b"], s, LECTURE["h"]) for s in lengths]
    extra = [100 * (f[policy] / f["keep all"] - 1) for f in flops]
    ax_bytes.plot(lengths, held, "o-", label=policy)
    ax_flops.plot(lengths, extra, "o-", label=policy)
for ax in (ax_bytes, ax_flops):
    ax.set_xscale("log", base=2)
    ax.set_xlabel("sequence length s (tokens)")
ax_bytes.set_yscale("log")
ax_bytes.set_ylabel("GB kept for backward, per layer")
ax_flops.set_ylabel("extra matmul FLOPs per step (%)")
ax_flops.legend(fontsize="small")
fig.suptitle("GPT-style layer, h = 8192, 64 heads, bf16: a model from the counts, not a measurement",
             fontsize="medium")
fig.tight_layout()

s_lecture = 4096
held_4096 = held_bytes_per_layer(LECTURE["b"], s_lecture, LECTURE["h"], LECTURE["a"], 2, 1, 4)
flops_4096 = step_flops_per_layer(LECTURE["b"], s_lecture, LECTURE["h"])
print(f"lecture's layer at s = {s_lecture}:{'GB per layer':>16}{'extra FLOPs':>14}")
for policy in POLICIES:
    print(f"  {policy:<28}{held_4096[policy] / 1e9:>14.3f}{flops_4096[policy] / flops_4096['keep all'] - 1:>14.2%}")

# %%
# Implement
# ---------
# One layer, and four ways to run it. The selective policy is a list of ops
# to save; ``create_selective_checkpoint_contexts`` turns it into the two
# dispatch modes that checkpoint runs its forward and its recomputation under.
# Each checkpoint stashes the random number generators' state and restores it
# before recomputing, so the dropout masks drawn again are the masks drawn the
# first time.


def core_attention(q, k, v):
    """softmax(Q K^T / sqrt(d)) with dropout, times V; the heads merged back into the width."""
    b, a, s, d = q.shape
    scores = (q @ k.transpose(-2, -1)) * d**-0.5
    probabilities = F.dropout(scores.softmax(dim=-1), P_DROP)
    return (probabilities @ v).transpose(1, 2).reshape(b, s, a * d)


class Layer(nn.Module):
    """A pre-norm GPT layer: attention, then a GeLU MLP, each a residual branch ending in dropout."""

    def __init__(self, width, heads):
        super().__init__()
        options = {"dtype": DTYPE, "device": DEVICE}
        self.heads = heads
        self.ln1, self.ln2 = nn.LayerNorm(width, **options), nn.LayerNorm(width, **options)
        self.qkv = nn.Linear(width, 3 * width, **options)
        self.proj = nn.Linear(width, width, **options)
        self.fc1 = nn.Linear(width, 4 * width, **options)
        self.fc2 = nn.Linear(4 * width, width, **options)

    def forward(self, x, recompute_core_attention=False):
        b, s, h = x.shape
        qkv = self.qkv(self.ln1(x)).view(b, s, 3, self.heads, h // self.heads)
        q, k, v = qkv.permute(2, 0, 3, 1, 4)  # each (b, heads, s, head_dim): a view of qkv
        if recompute_core_attention:
            heads = checkpoint(core_attention, q, k, v, use_reentrant=False)
        else:
            heads = core_attention(q, k, v)
        x = x + F.dropout(self.proj(heads), P_DROP)
        return x + F.dropout(self.fc2(F.gelu(self.fc1(self.ln2(x)))), P_DROP)


save_linear_outputs = functools.partial(create_selective_checkpoint_contexts,
                                        [torch.ops.aten.addmm.default, torch.ops.aten.mm.default])
save_every_matmul = functools.partial(create_selective_checkpoint_contexts,
                                      [torch.ops.aten.addmm.default, torch.ops.aten.mm.default,
                                       torch.ops.aten.bmm.default])
RUN_LAYER = {
    "keep all": lambda layer, x: layer(x),
    "core attention": lambda layer, x: layer(x, recompute_core_attention=True),
    "save matmuls": lambda layer, x: checkpoint(layer, x, use_reentrant=False, context_fn=save_linear_outputs),
    "full recompute": lambda layer, x: checkpoint(layer, x, use_reentrant=False),
    # Two faults, run below to show that the checks catch them.
    "save the bmm outputs too": lambda layer, x: checkpoint(layer, x, use_reentrant=False,
                                                            context_fn=save_every_matmul),
    "recompute without the RNG state": lambda layer, x: checkpoint(layer, x, use_reentrant=False,
                                                                   preserve_rng_state=False),
}


class Stack(nn.Module):
    def __init__(self):
        super().__init__()
        self.layers = nn.ModuleList(Layer(WIDTH, HEADS) for _ in range(LAYERS))

    def forward(self, x, policy):
        for layer in self.layers:
            x = RUN_LAYER[policy](layer, x)
        return x


model = Stack()
x = torch.randn(BATCH, SEQUENCE, WIDTH, dtype=DTYPE, device=DEVICE)
grad_out = torch.randn_like(x)  # a random upstream gradient: no loss hides a term
PARAMETER_STORAGES = {p.untyped_storage().data_ptr() for p in model.parameters()}

# %%
# Measure: bytes kept, FLOPs, gradients
# -------------------------------------
# ``torch.autograd.graph.saved_tensors_hooks`` sees every tensor that
# autograd saves: we list what it sees, one entry per storage (views share
# one), parameters left out. Inside a checkpoint it sees only the
# checkpoint's inputs, which checkpoint saves through the same hooks, while
# checkpoint installs its own, innermost, to put placeholders in place of
# what the region saves. A selective policy's saved outputs sit in a cache of
# the checkpoint's own, out of the hooks' sight. To measure every policy the
# same way we also record the storage of every tensor created during the
# forward pass, and count those still alive when it ends: what is kept for
# backward, whoever keeps it. ``FlopCounterMode`` counts the matmul FLOPs of
# forward, backward and recomputation together.


def saved_by_autograd(module, x, run):
    """(bytes, dtype) of each storage that autograd's pack hook sees, parameters left out."""
    storages = {}

    def pack(tensor):
        storage = tensor.untyped_storage()
        if storage.data_ptr() not in PARAMETER_STORAGES:
            storages.setdefault(storage.data_ptr(), (storage.nbytes(), str(tensor.dtype)))
        return tensor

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        out = run(module, x)
    del out
    return sorted(storages.values())


class LiveStorages(TorchDispatchMode):
    """Remembers, without keeping it alive, the storage of every tensor an op creates."""

    def __init__(self):
        super().__init__()
        self.storages = {}

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for tensor in out if isinstance(out, (tuple, list)) else [out]:
            if isinstance(tensor, torch.Tensor) and tensor.device.type == DEVICE:
                storage = tensor.untyped_storage()
                self.storages[storage.data_ptr()] = (StorageWeakRef(storage), storage.nbytes())
        return out

    def alive_bytes(self, exclude):
        return sum(size for ptr, (ref, size) in self.storages.items() if ptr not in exclude and not ref.expired())


def one_step(policy):
    """One forward and backward: bytes kept between them, matmul FLOPs, gradients."""
    torch.manual_seed(1)  # the same dropout masks under every policy
    model.zero_grad(set_to_none=True)
    allocated_before = torch.cuda.memory_allocated() if DEVICE == "cuda" else 0
    with FlopCounterMode(display=False) as flops:
        with LiveStorages() as live:
            inputs = x.clone()  # made here, so that only what the step keeps holds it
            out = model(inputs, policy)
        del inputs
        held = live.alive_bytes(exclude=PARAMETER_STORAGES | {out.untyped_storage().data_ptr()})
        allocated = torch.cuda.memory_allocated() - allocated_before if DEVICE == "cuda" else None
        out.backward(grad_out)
    grads = {name: p.grad.clone() for name, p in model.named_parameters()}
    return {"held": held, "allocated": allocated, "flops": flops.get_total_flops(), "out": out.detach(),
            "grads": grads}


model(x, "keep all").backward(grad_out)  # warm-up: CUDA's first matmuls allocate cuBLAS workspaces, kept
STEPS = {policy: one_step(policy) for policy in RUN_LAYER}
HOOKS_SEE = {policy: sum(size for size, _ in saved_by_autograd(model, x, lambda m, x, p=policy: m(x, p)))
             for policy in POLICIES}
LISTED = saved_by_autograd(model.layers[0], x, RUN_LAYER["keep all"])
PREDICTED_HELD = {p: LAYERS * b for p, b in held_bytes_per_layer(BATCH, SEQUENCE, WIDTH, HEADS, DTYPE.itemsize,
                                                                  MASK_DTYPE.itemsize, STAT_DTYPE.itemsize).items()}
PREDICTED_FLOPS = {p: LAYERS * f for p, f in step_flops_per_layer(BATCH, SEQUENCE, WIDTH).items()}
print(f"{'policy':<18}{'hooks see':>11}{'kept':>11}{'predicted':>11}{'matmul FLOPs':>14}{'predicted':>13}")
for policy in POLICIES:
    step = STEPS[policy]
    print(f"  {policy:<16}{HOOKS_SEE[policy]:>11,}{step['held']:>11,}{PREDICTED_HELD[policy]:>11,}"
          f"{step['flops']:>14,}{PREDICTED_FLOPS[policy]:>13,}")
print("(bytes; hooks see: what saved_tensors_hooks sees; kept: storages alive after the forward pass)")

# %%
# Verify
# ------
# The counts are integers, so the checks are equalities. Autograd's own list
# for one layer must be the predicted list, tensor by tensor (bytes and
# dtype); every policy must keep exactly its predicted bytes and count exactly
# its predicted FLOPs.
#
# The gradients must be *bitwise* those of "keep all". Recomputation replays
# the same ops on the same values in the same order, with the generator's
# state restored for dropout, so each recomputed tensor is bitwise the one it
# replaces; and non-reentrant checkpointing runs backward through the
# original graph, so every gradient is then computed by the same kernels from
# the same bits, and summed in the same order. On a CPU a kernel splits its
# work by shape and thread count, which do not change, and every buffer starts
# on the allocator's 64-byte alignment, so a recomputed copy is aligned as the
# tensor it replaces. On a GPU the argument is the same: cuBLAS documents
# bitwise identical results from run to run on GPUs of one architecture and
# SM count, with one stream active (recomputation runs on the forward's
# stream); the caching allocator starts every block at least on cudaMalloc's
# 256-byte alignment, so kernels that pick a variant by alignment pick the
# same one; none of these kernels accumulates with atomics; and the CUDA
# generator's Philox state is restored for dropout. A nondeterministic kernel
# would break this check, not the recomputation.

predicted_listing = sorted((n * dtype.itemsize, str(dtype)) for _, n, dtype in SAVED)
assert LISTED == predicted_listing, f"autograd saved {LISTED}, predicted {predicted_listing}"
for policy in ["keep all", "core attention", "full recompute"]:
    assert HOOKS_SEE[policy] == PREDICTED_HELD[policy], (policy, HOOKS_SEE[policy])
assert HOOKS_SEE["save matmuls"] == PREDICTED_HELD["full recompute"]  # the inputs; the cache is out of sight
for policy in POLICIES:
    assert STEPS[policy]["held"] == PREDICTED_HELD[policy], (policy, STEPS[policy]["held"])
    assert STEPS[policy]["flops"] == PREDICTED_FLOPS[policy], (policy, STEPS[policy]["flops"])
    if DEVICE == "cuda":  # the allocator rounds each block up, and also holds the output
        assert STEPS[policy]["allocated"] >= STEPS[policy]["held"], policy


def assert_same_gradients(policy, reference="keep all"):
    """Output and every parameter gradient bitwise equal to the reference policy's."""
    got, want = STEPS[policy], STEPS[reference]
    torch.testing.assert_close(got["out"], want["out"], rtol=0, atol=0,  # the same ops replayed: exact
                               msg=lambda message: f"{policy}, output: {message}")
    for name, grad in got["grads"].items():
        torch.testing.assert_close(grad, want["grads"][name], rtol=0, atol=0,  # the same kernels, same bits
                                   msg=lambda message, name=name: f"{policy}, gradient of {name}: {message}")


for policy in POLICIES[1:]:
    assert_same_gradients(policy)
print(f"autograd's list for one layer is the predicted list ({len(LISTED)} tensors, {LAYER_BYTES:,} bytes);"
      f" every policy keeps its predicted bytes, counts its predicted FLOPs, and gives bitwise the"
      f" gradients of keeping all")

# %%
# Two faults the checks catch: a policy that also saves the attention's
# batched matmuls keeps the scores and the attention output, :math:`(a s^2 b
# + s b h)\,e` more bytes per layer; a checkpoint that does not restore the
# generator's state draws new dropout masks when it recomputes, so its
# gradients belong to another network.

bmm_extra = STEPS["save the bmm outputs too"]["held"] - PREDICTED_HELD["save matmuls"]
assert bmm_extra == LAYERS * (HEADS * SEQUENCE**2 * BATCH + SEQUENCE * BATCH * WIDTH) * DTYPE.itemsize, bmm_extra
rng_fault = STEPS["recompute without the RNG state"]
worst_rng_error = max((rng_fault["grads"][name] - grad).abs().max().item()
                      for name, grad in STEPS["keep all"]["grads"].items())
assert worst_rng_error > 0, "without the RNG state the gradients should differ"
assert torch.equal(rng_fault["out"], STEPS["keep all"]["out"])  # forward is untouched: only backward is wrong
print(f"{'fault':<34}{'what the check sees':>40}")
print(f"  {'save the bmm outputs too':<32}{bmm_extra:>28,} bytes more")
print(f"  {'recompute without the RNG state':<32}{worst_rng_error:>28.3g} largest gradient error")

# %%
# Time per step
# -------------
# ``torch.utils.benchmark`` times a plain forward and backward under each
# policy (it synchronises CUDA). On a CPU at these sizes, per-op overheads
# weigh against the arithmetic, so the times need not follow the FLOPs. In
# eager mode selective checkpointing also passes every op of its region,
# forward and recomputation, through a Python ``TorchDispatchMode`` (the two
# contexts above), a cost per op that no FLOP count sees. On a GPU, the
# recomputed elementwise ops cost memory traffic, not counted FLOPs.


def train_step(policy):
    model.zero_grad(set_to_none=True)
    model(x, policy).backward(grad_out)


def peak_bytes(policy):
    """The CUDA allocator's peak over one step, above what was allocated before it."""
    model.zero_grad(set_to_none=True)
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    before = torch.cuda.memory_allocated()
    train_step(policy)
    torch.cuda.synchronize()
    return torch.cuda.max_memory_allocated() - before


MIN_RUN_TIME_S = 1.0 if DEVICE == "cuda" else 0.2
STEP_MS = {policy: 1e3 * benchmark.Timer("train_step(policy)", globals={"train_step": train_step, "policy": policy})
           .blocked_autorange(min_run_time=MIN_RUN_TIME_S).median for policy in POLICIES}
PEAK = {policy: peak_bytes(policy) for policy in POLICIES} if DEVICE == "cuda" else {}
print(f"{'policy':<28}{'ms per step':>12}{'vs keep all':>13}")
for policy in POLICIES:
    print(f"  {policy:<26}{STEP_MS[policy]:>12.3f}{STEP_MS[policy] / STEP_MS['keep all']:>13.2f}")
if DEVICE == "cuda":
    print(f"{'CUDA allocator, bytes':<28}{'after forward':>15}{'peak':>15}{'kept':>15}")
    for policy in POLICIES:
        print(f"  {policy:<26}{STEPS[policy]['allocated']:>15,}{PEAK[policy]:>15,}{STEPS[policy]['held']:>15,}")

fig, axes = plt.subplots(1, 3, figsize=(11, 3.8))
positions = range(len(POLICIES))
axes[0].bar(positions, [STEPS[p]["held"] / 2**20 for p in POLICIES], color="tab:blue")
axes[0].plot(positions, [PREDICTED_HELD[p] / 2**20 for p in POLICIES], "k_", markersize=22, label="predicted")
axes[0].set_ylabel("MiB kept for backward")
axes[1].bar(positions, [STEPS[p]["flops"] / STEPS["keep all"]["flops"] for p in POLICIES], color="tab:orange")
axes[1].plot(positions, [PREDICTED_FLOPS[p] / PREDICTED_FLOPS["keep all"] for p in POLICIES], "k_",
             markersize=22, label="predicted")
axes[1].set_ylabel("matmul FLOPs per step / keep all")
axes[2].bar(positions, [STEP_MS[p] / STEP_MS["keep all"] for p in POLICIES], color="tab:green")
axes[2].set_ylabel("time per step / keep all (median)")
for ax in axes:
    ax.set_xticks(positions, POLICIES, rotation=20, ha="right", fontsize="small")
axes[0].legend(fontsize="small")
fig.suptitle(f"Checkpointing {LAYERS} layers on {DEVICE_NAME} ({str(DTYPE).removeprefix('torch.')})",
             fontsize="medium")
fig.tight_layout()

# %%
# Read the result
# ---------------
# The byte and FLOP counts are exact, so the two left panels show the
# prediction met: full recomputation keeps only one tensor per layer, its
# input, and pays one more forward pass, a third more matmul FLOPs per step,
# whatever the sizes. The selective policies sit between. Both drop the
# :math:`s \times s` tensors, the :math:`5as/h` term that dominates memory at
# long sequences, for the attention matmuls alone: :math:`2bs^2h` per layer
# (core attention) or :math:`4bs^2h` (save matmuls), a fraction
# :math:`s/(36h + 6s)` or :math:`s/(18h + 3s)` of the step, small while
# :math:`s` is not much larger than :math:`h`. Save matmuls keeps less, the
# linear layers' outputs only (among them ``fc2``'s, which no gradient
# formula reads: a policy by op type cannot tell), and recomputes every layer norm,
# GeLU and dropout, which the FLOP count does not see but the clock does.
#
# FlashAttention makes the core-attention trade inside its kernel: it keeps
# :math:`Q, K, V`, the output, one statistic per row and the dropout
# generator's seed and offset, and its backward recomputes the scores and
# draws the dropout mask again, block by block. With it, "keep all" no longer
# has the :math:`5as/h` term, and selective recomputation of the attention has
# nothing left to save.
#
# When to use which: recompute what is cheap first (FlashAttention, or the
# core attention), then, if the activations still do not fit after sharding
# the model states (ZeRO, FSDP) and the activations (tensor and sequence
# parallel), recompute whole layers, as few as memory requires, since each
# costs a third more of its compute. Under tensor parallelism a recomputed
# layer also repeats its forward all-reduces, which the planner of
# :ref:`sphx_glr_auto_examples_lecture07_parallelism_06_choosing_a_layout.py`
# counts. Full recomputation also lowers the peak by less than the kept bytes:
# backward rebuilds one layer's activations at a time, so one layer's full
# list sits on top of the kept inputs, as the allocator's peak shows on a GPU.

KEY_FIGURES = {
    "kept_bytes_keep_all": STEPS["keep all"]["held"],
    "kept_bytes_core_attention": STEPS["core attention"]["held"],
    "kept_bytes_save_matmuls": STEPS["save matmuls"]["held"],
    "kept_bytes_full_recompute": STEPS["full recompute"]["held"],
    "flops_ratio_full_recompute": STEPS["full recompute"]["flops"] / STEPS["keep all"]["flops"],
    "flops_ratio_save_matmuls": STEPS["save matmuls"]["flops"] / STEPS["keep all"]["flops"],
    "step_ms_keep_all": STEP_MS["keep all"],
    "step_ms_full_recompute": STEP_MS["full recompute"],
    "device": DEVICE_NAME,
}
