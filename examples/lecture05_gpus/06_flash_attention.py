"""
FlashAttention: online softmax and tiled attention
==================================================

Naive attention stores the whole :math:`N \\times N` score matrix of
:math:`\\mathrm{softmax}(QK^T/\\sqrt{d})\\,V`; FlashAttention streams over
blocks of keys with a running maximum and sum per query (the *online
softmax*), so its memory grows linearly with :math:`N`. We build the online
softmax, a tiled attention in PyTorch to read, and the same algorithm as a
Triton kernel to run fast, check all three against PyTorch, and measure
memory and speed.

**Requirements.** Full version: a CUDA GPU and Triton (float16). On a CPU the
Triton kernel runs in the interpreter at tiny sizes in float32 and float16,
which checks correctness, not speed. Peak memory is then a byte model instead
of a measurement, and the speed comparison with PyTorch's fused attention is
skipped. On a T4 (compute capability 7.5, as on free Colab notebooks) it runs
as on any CUDA GPU, in float16, but with blocks of 64 query rows instead of 128
when the head dimension is above 64, because a block gets less shared memory
there.
"""

# %%
# Setup
# -----
# On a CPU, ``TRITON_INTERPRET=1`` must be set before Triton is imported.

import math
import os
import platform

import torch

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
if DEVICE == "cpu":
    os.environ.setdefault("TRITON_INTERPRET", "1")  # before any module imports Triton

import matplotlib.pyplot as plt
import torch.nn.functional as F
from torch.utils import benchmark

try:
    import triton
    import triton.language as tl

    TRITON_IMPORT_ERROR = None
except ImportError as error:
    TRITON_IMPORT_ERROR = error
HAVE_TRITON = TRITON_IMPORT_ERROR is None

torch.manual_seed(0)


def cpu_model_name():
    """The CPU's marketing name from /proc/cpuinfo (Linux), else from platform."""
    try:
        with open("/proc/cpuinfo") as cpuinfo:
            for line in cpuinfo:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


if DEVICE == "cuda":
    DEVICE_NAME = torch.cuda.get_device_name()
    KERNEL_DTYPE = torch.float16
    # (batch, heads, queries, keys, head_dim): irregular lengths exercise the masks
    KERNEL_TEST_SHAPES = [(2, 3, 193, 193, 64), (1, 4, 77, 1000, 128), (2, 2, 1000, 1000, 128)]
    # Few queries, many keys: errors of a low-precision accumulator grow with the key blocks
    LONG_ROW_SHAPES = [(1, 2, 64, 16384, 64), (1, 2, 64, 16384, 128)]
    CHECK_DTYPES = [torch.float16]
    MEMORY_SEQ_LENS = [1024, 2048, 4096, 8192, 16384]
else:
    DEVICE_NAME = f"{cpu_model_name()} CPU, {torch.get_num_threads()} threads"
    KERNEL_DTYPE = torch.float32
    KERNEL_TEST_SHAPES = [(1, 2, 77, 77, 32), (1, 2, 77, 193, 32)]
    LONG_ROW_SHAPES = [(1, 1, 16, 8192, 32)]
    CHECK_DTYPES = [torch.float32, torch.float16]  # the interpreter also runs the GPU's dtype
    MEMORY_SEQ_LENS = [1024, 2048, 4096, 8192, 16384, 32768]


def skip_or_fail(section, capability, reason):
    """Readers' runs skip a part whose tool is missing; the site's builds require it."""
    if capability in os.environ.get("COURSE_REQUIRE", "").split(","):
        raise RuntimeError(f"{section}: this build requires {capability}, but {reason}")
    print(f"Skipped {section}: {capability} is missing ({reason}).")


if not HAVE_TRITON:
    skip_or_fail("the Triton kernel (the PyTorch versions still run)", "triton",
                 f"import triton failed: {TRITON_IMPORT_ERROR}")
elif DEVICE == "cuda":
    print(f"{DEVICE_NAME}: Triton compiled, float16, checked and timed against SDPA.")
else:
    print(f"{DEVICE_NAME}: Triton interpreted at tiny sizes, float32 and float16: "
          "checked; its times count blocks, not GPU speed.")

# %%
# Online softmax
# --------------
# The softmax of a row needs its maximum (to keep ``exp`` from overflowing)
# and the sum of ``exp(x - max)``. Both can be built in one pass over blocks
# of the row. Keep a running maximum ``m`` and a running sum ``l``. When a
# new block raises the maximum from ``m`` to ``m'``, every term already in
# ``l`` was computed against the old maximum, so it must be rescaled:
#
# .. math:: l' = l\, e^{m - m'} + \sum_{j \in \text{block}} e^{x_j - m'}.
#
# After the last block, ``exp(x - m) / l`` is the softmax. Nothing but ``m``
# and ``l`` survives from one block to the next.


def online_softmax(x, block):
    """Softmax over the last dimension, reading the columns ``block`` at a time."""
    running_max = torch.full(x.shape[:-1], -math.inf, dtype=x.dtype, device=x.device)
    running_sum = torch.zeros(x.shape[:-1], dtype=x.dtype, device=x.device)
    for start in range(0, x.shape[-1], block):
        chunk = x[..., start:start + block]
        new_max = torch.maximum(running_max, chunk.amax(dim=-1))
        rescale = torch.exp(running_max - new_max)  # exp(-inf) = 0 on the first block
        running_sum = running_sum * rescale + torch.exp(chunk - new_max[..., None]).sum(dim=-1)
        running_max = new_max
    return torch.exp(x - running_max[..., None]) / running_sum[..., None]


# Irregular width (not a multiple of the block), and a shift that would make exp overflow
for shift in (0.0, 1000.0):
    x = torch.randn(37, 1003, dtype=torch.float64, device=DEVICE) * 3 + shift
    # float64, the same terms in another order: about |x| eps64 <= 3e-13, inside the defaults (1e-7)
    torch.testing.assert_close(online_softmax(x, block=128), torch.softmax(x, dim=-1))
print("online softmax (blocks of 128 over 1003 columns) matches torch.softmax, shifts 0 and 1000")

# %%
# Tiled attention in PyTorch
# --------------------------
# Attention applies the same idea to every query row, and carries a third
# running quantity: the output accumulator ``acc``, the running
# ``sum_j exp(s_j - m) v_j``. It is rescaled by the same factor as ``l``.
# The loop below visits the keys and values one block at a time. It never
# holds more than a ``queries x block`` slice of the score matrix. With
# ``causal=True``, query ``i`` sees only keys ``j <= i``. With fewer queries
# than keys that is the *top-left* alignment of
# ``F.scaled_dot_product_attention(is_causal=True)``, which all checks here
# use. Decoding with a KV cache needs the *bottom-right* one, in which the
# last query sees every key (``torch.nn.attention.bias.causal_lower_right``).
# The first key block always contains key 0, which every query may see, so
# the running maximum is finite after the first step.
#
# As for the online softmax, we also shift every score by 1000, where
# ``exp`` without the running maximum overflows even in float64. The shift
# comes from one channel: setting ``q[..., 0] = k[..., 0] = a`` adds
# ``a^2 / sqrt(d)`` to every score and leaves the softmax unchanged.


def tiled_attention(q, k, v, causal=False, block=64):
    """softmax(q k^T / sqrt(d)) v for (..., N, d) tensors, one pass over key blocks."""
    scale = q.shape[-1] ** -0.5
    query_index = torch.arange(q.shape[-2], device=q.device)[:, None]
    running_max = torch.full(q.shape[:-1], -math.inf, dtype=q.dtype, device=q.device)
    running_sum = torch.zeros(q.shape[:-1], dtype=q.dtype, device=q.device)
    acc = torch.zeros_like(q)
    for start in range(0, k.shape[-2], block):
        k_block, v_block = k[..., start:start + block, :], v[..., start:start + block, :]
        scores = (q @ k_block.transpose(-2, -1)) * scale  # (..., queries, block)
        if causal:
            key_index = torch.arange(start, start + k_block.shape[-2], device=q.device)
            scores = scores.masked_fill(key_index > query_index, -math.inf)
        new_max = torch.maximum(running_max, scores.amax(dim=-1))
        rescale = torch.exp(running_max - new_max)
        p = torch.exp(scores - new_max[..., None])
        running_sum = running_sum * rescale + p.sum(dim=-1)
        acc = acc * rescale[..., None] + p @ v_block
        running_max = new_max
    return acc / running_sum[..., None]


def random_qkv(batch, heads, n_queries, n_keys, head_dim, dtype, score_shift=0.0):
    """Fresh standard-normal q, k, v; ``score_shift`` is added to every score q.k/sqrt(d)."""
    q = torch.randn(batch, heads, n_queries, head_dim, device=DEVICE, dtype=dtype)
    k = torch.randn(batch, heads, n_keys, head_dim, device=DEVICE, dtype=dtype)
    v = torch.randn(batch, heads, n_keys, head_dim, device=DEVICE, dtype=dtype)
    if score_shift:
        q[..., 0] = k[..., 0] = math.sqrt(score_shift * math.sqrt(head_dim))
    return q, k, v


for n_queries, n_keys, causal in [(77, 193, False), (193, 193, True), (77, 193, True)]:
    for shift in (0.0, 1000.0):
        q, k, v = random_qkv(2, 3, n_queries, n_keys, 40, torch.float64, score_shift=shift)
        expected = F.scaled_dot_product_attention(q, k, v, is_causal=causal)
        # float64, exact algorithm in another order: about |S| eps64 <= 3e-13 anywhere; defaults (1e-7)
        torch.testing.assert_close(tiled_attention(q, k, v, causal=causal, block=32), expected,
                                   msg=lambda message, shift=shift: f"score shift {shift:g}: {message}")
    print(f"PyTorch tiled attention, {n_queries} queries x {n_keys} keys, "
          f"causal={causal!s:<5}: matches SDPA (float64), score shifts 0 and 1000")

# %%
# The Triton kernel
# -----------------
# One program computes one block of ``BLOCK_M`` query rows of one (batch,
# head) pair: the grid is ``(ceil(N / BLOCK_M), batch * heads)``. It loads
# its query block once, then loops over key blocks of ``BLOCK_N``: the loop
# order of FlashAttention-2 (Dao 2023, Algorithm 1), with the query block
# outside and one division at the end. Both
# products, ``Q K^T`` and ``P V``, are ``tl.dot`` calls on tiles held in
# registers and shared memory; the running ``m``, ``l`` and ``acc`` never
# leave the chip, and the output is written once at the end. The statistics
# and the accumulator are float32 even when the inputs are float16. ``P`` is
# cast back to the input dtype for the second ``tl.dot``, so that it runs on
# tensor cores. We fold ``log2(e)`` into the scale and use ``exp2``, which
# maps to a single hardware instruction on NVIDIA GPUs.
#
# Masks handle the irregular lengths. Query rows past the end are computed
# but not stored. Keys past the end, and keys after the query in causal
# mode, get a score of ``-inf``, so they add ``exp(-inf) = 0``. In causal
# mode the loop stops at the last key block the query block can see, which
# skips about half of the blocks of a long sequence.
#
# On a GPU the kernel runs in float16, although the lecture teaches bfloat16
# for training. Attention's values stay in float16's range here: the
# probabilities lie in [0, 1], the output is a weighted average of value
# rows, and the scores are float32 inside the kernel. float16's three extra
# mantissa bits make ``P`` and the output eight times finer, which lets the
# check below be eight times stricter, and float16 tensor cores also exist
# on older GPUs without bfloat16, such as the T4 (compute capability 7.5).
# The kernel itself runs unchanged on bfloat16.
#
# One practical note for CPUs: with NumPy 2.4 or newer, Triton 3.6's
# interpreter cannot use a runtime value as a loop bound, as the key loop does
# (triton-lang/triton issue 9171). The compiled GPU path is unaffected. The
# course pins NumPy 2.3; elsewhere the check below says why it stops.

if HAVE_TRITON:

    @triton.jit
    def flash_attention_kernel(q_ptr, k_ptr, v_ptr, out_ptr,
                               stride_q_head, stride_q_row, stride_k_head, stride_k_row,
                               stride_v_head, stride_v_row, stride_o_head, stride_o_row,
                               n_queries, n_keys, qk_scale_log2,
                               HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr,
                               BLOCK_N: tl.constexpr, IS_CAUSAL: tl.constexpr):
        query_block = tl.program_id(0)
        head = tl.program_id(1).to(tl.int64)
        rows = query_block * BLOCK_M + tl.arange(0, BLOCK_M)
        cols = tl.arange(0, HEAD_DIM)
        key_offsets = tl.arange(0, BLOCK_N)

        q = tl.load(q_ptr + head * stride_q_head + rows[:, None] * stride_q_row + cols[None, :],
                    mask=rows[:, None] < n_queries, other=0.0)
        running_max = tl.full([BLOCK_M], float("-inf"), tl.float32)
        running_sum = tl.zeros([BLOCK_M], tl.float32)
        acc = tl.zeros([BLOCK_M, HEAD_DIM], tl.float32)

        key_end = n_keys
        if IS_CAUSAL:
            key_end = tl.minimum((query_block + 1) * BLOCK_M, n_keys)
        for start in range(0, key_end, BLOCK_N):
            keys = start + key_offsets
            key_in_range = keys < n_keys
            k = tl.load(k_ptr + head * stride_k_head + keys[:, None] * stride_k_row + cols[None, :],
                        mask=key_in_range[:, None], other=0.0)
            scores = tl.dot(q, tl.trans(k)) * qk_scale_log2  # (BLOCK_M, BLOCK_N), log2 units
            visible = key_in_range[None, :]
            if IS_CAUSAL:
                visible = visible & (keys[None, :] <= rows[:, None])
            scores = tl.where(visible, scores, float("-inf"))

            new_max = tl.maximum(running_max, tl.max(scores, axis=1))
            rescale = tl.exp2(running_max - new_max)
            p = tl.exp2(scores - new_max[:, None])
            running_sum = running_sum * rescale + tl.sum(p, axis=1)
            v = tl.load(v_ptr + head * stride_v_head + keys[:, None] * stride_v_row + cols[None, :],
                        mask=key_in_range[:, None], other=0.0)
            acc = acc * rescale[:, None] + tl.dot(p.to(v.dtype), v)
            running_max = new_max

        out = acc / running_sum[:, None]
        tl.store(out_ptr + head * stride_o_head + rows[:, None] * stride_o_row + cols[None, :],
                 out.to(out_ptr.dtype.element_ty), mask=rows[:, None] < n_queries)

    def triton_attention(q, k, v, causal=False):
        """FlashAttention forward for (batch, heads, N, d) tensors; d a power of two >= 16."""
        batch, heads, n_queries, head_dim = q.shape
        if head_dim < 16 or head_dim & (head_dim - 1):  # tl.arange and tl.dot need it
            raise ValueError(f"head dimension {head_dim} is not a power of two >= 16")
        n_keys = k.shape[2]
        q3, k3, v3 = (t.reshape(batch * heads, t.shape[2], head_dim).contiguous() for t in (q, k, v))
        out = torch.empty_like(q3)
        if DEVICE == "cuda":
            # On compute capability 7.5 (a T4) a block may use 64 KiB of shared memory (CUDA
            # C++ Programming Guide, compute capabilities): too little for 128 rows of d = 128.
            old_gpu = torch.cuda.get_device_capability() < (8, 0)
            block_m, block_n = (64 if old_gpu and head_dim > 64 else 128), 64
            launch = {"num_warps": 4 if head_dim <= 64 else 8, "num_stages": 3}
        else:  # the interpreter: small tiles keep it quick
            block_m, block_n, launch = 16, 32, {}
        grid = (triton.cdiv(n_queries, block_m), batch * heads)
        flash_attention_kernel[grid](
            q3, k3, v3, out,
            q3.stride(0), q3.stride(1), k3.stride(0), k3.stride(1),
            v3.stride(0), v3.stride(1), out.stride(0), out.stride(1),
            n_queries, n_keys, head_dim ** -0.5 * math.log2(math.e),
            HEAD_DIM=head_dim, BLOCK_M=block_m, BLOCK_N=block_n, IS_CAUSAL=causal, **launch)
        return out.view(batch, heads, n_queries, head_dim)

# %%
# Check the kernel
# ----------------
# The reference is SDPA in float64 on the same (rounded) inputs, with and
# without causal masking, and with every score shifted by 1000 as above.
#
# How close must the kernel be? Each output row is a weighted average of
# value rows, and the kernel keeps its statistics and accumulator in
# float32. Two things limit a correct kernel:
#
# - it rounds to its dtype twice, ``P`` before the second product and the
#   output when it stores it, each by at most :math:`u` of the value
#   (:math:`u = 2^{-11} \approx 4.9 \times 10^{-4}` in float16, which keeps
#   11 significant bits; :math:`2^{-24}` in float32);
# - it computes the scores in float32: a score of size :math:`|S|` is a sum
#   of :math:`d` products, rounded at each of its :math:`d` additions by at
#   most :math:`u_{32}` of a partial sum of size up to :math:`|S|`. These
#   errors add up like a random walk, to about
#   :math:`\sqrt{d/3}\, u_{32} |S|`, and the score's probability is off by
#   that much relatively.
#
# Relative to the size of the output, we allow the two roundings and twice
# the random walk, :math:`2u + 2 \sqrt{d/3}\, u_{32} \max|S|`, over the whole
# output and twice that in any one row. For float16 and ordinary scores this
# is about :math:`2u` and :math:`4u`. A running sum or accumulator kept in
# float16 would be rounded again after every key block, so its error grows
# with the number of blocks: the long rows of ``LONG_ROW_SHAPES``, hundreds
# of key blocks each, push such a kernel past both limits. The table gives
# the errors and the limit for the whole output in units of each dtype's
# :math:`u`.

FLOAT32_ROUNDING = 2.0**-24  # u of float32, in which the kernel computes the scores


def relative_errors(result, expected):
    """The error's norm over the output's norm: for the whole output, and for each row."""
    error = result.double() - expected
    return error.norm() / expected.norm(), error.norm(dim=-1) / expected.norm(dim=-1)


def error_limits(dtype, max_score, head_dim):
    """Allowed relative errors (whole output, any row) of a kernel that is correct."""
    unit_roundoff = torch.finfo(dtype).eps / 2
    # two roundings to the dtype, and twice the random walk of a float32 score's d roundings
    whole = 2 * unit_roundoff + 2 * math.sqrt(head_dim / 3) * FLOAT32_ROUNDING * max_score
    return whole, 2 * whole


def check_errors(result, q, k, v, causal, what):
    """Relative errors of ``result`` against float64 SDPA (whole, worst row) and the whole's limit."""
    q64, k64, v64 = q.double(), k.double(), v.double()
    expected = F.scaled_dot_product_attention(q64, k64, v64, is_causal=causal)
    max_score = (q64 @ k64.transpose(-2, -1)).abs().max().item() / math.sqrt(q.shape[-1])
    errors, limits = relative_errors(result, expected), error_limits(q.dtype, max_score, q.shape[-1])
    for part, error, limit in zip(("whole output", "worst row"), errors, limits):
        # a relative error against 0, allowed its limit; NaN fails too
        torch.testing.assert_close(error, torch.zeros_like(error), rtol=0, atol=limit,
                                   msg=lambda _, part=part, error=error, limit=limit:
                                   f"{what}: relative error {error.max().item():.3g} in the {part}, "
                                   f"limit {limit:.3g}")
    return errors[0].item(), errors[1].max().item(), limits[0]


def check_triton_attention(shape, dtype, causal, score_shift):
    """Check the kernel on fresh inputs; its errors and limit in units of the dtype's u."""
    q, k, v = random_qkv(*shape, dtype, score_shift=score_shift)
    what = f"Triton attention {shape} {str(dtype)[6:]}, causal={causal}, score shift {score_shift:g}"
    errors = check_errors(triton_attention(q, k, v, causal=causal), q, k, v, causal, what)
    unit_roundoff = torch.finfo(dtype).eps / 2
    return tuple(value / unit_roundoff for value in errors)


def interpreter_cannot_loop(error):
    """The known interpreter bug, and only on a CPU: on CUDA no Triton failure is excused."""
    interpreted = DEVICE == "cpu" and os.environ.get("TRITON_INTERPRET") == "1"
    return interpreted and "0-dimensional arrays" in str(error)


if HAVE_TRITON:
    try:
        print(f"{'(batch, heads, queries, keys, d)':<33} {'dtype':>7} {'causal':>6} {'shift':>6} "
              f"{'error/u':>8} {'worst row':>10} {'limit/u':>8}")
        for dtype in CHECK_DTYPES:
            long_rows = LONG_ROW_SHAPES if dtype == torch.float16 else []
            for shape in KERNEL_TEST_SHAPES + long_rows:
                for causal in (False, True):
                    for shift in (0.0, 1000.0):
                        whole, worst_row, limit = check_triton_attention(shape, dtype, causal, shift)
                        print(f"{shape!s:<33} {str(dtype)[6:]:>7} {causal!s:>6} {shift:>6.0f} "
                              f"{whole:>8.2f} {worst_row:>10.2f} {limit:>8.2f}")
        print("all within their limits (the worst row's limit is twice the whole output's)")
    except Exception as error:  # only the known interpreter bug is excused below
        if not interpreter_cannot_loop(error):
            raise
        HAVE_TRITON = False
        skip_or_fail("the interpreted Triton kernel", "triton",
                     "this NumPy breaks Triton's interpreter on runtime loop bounds "
                     "(triton-lang/triton#9171); use numpy<2.4")

# %%
# Predict: peak memory
# --------------------
# Naive attention builds the score matrix ``S = Q K^T / sqrt(d)``, then
# ``P = softmax(S)``, then ``P V``. ``S`` and ``P`` are both alive while the
# softmax runs. With ``BH`` (batch x heads) independent heads and ``e`` bytes
# per element, its extra memory is
#
# .. math:: \text{naive} \approx 2\, BH\, N^2 e + BH\, N d\, e,
#
# where the second term is the output. The tiled kernel keeps its tiles on
# chip and allocates only the output, ``BH N d e``. On a GPU we measure the
# peak with ``torch.cuda.max_memory_allocated`` (minus what was allocated
# before the call). On a CPU we only draw the model. PyTorch's own fused
# attention (SDPA) is measured alongside.

MEMORY_BATCH_HEADS, MEMORY_HEAD_DIM = 16, 64
MEMORY_ELEMENT_BYTES = 2  # float16


def naive_attention(q, k, v):
    scores = (q @ k.transpose(-2, -1)) * q.shape[-1] ** -0.5
    return torch.softmax(scores, dim=-1) @ v


def naive_bytes_model(n):
    bh, d, e = MEMORY_BATCH_HEADS, MEMORY_HEAD_DIM, MEMORY_ELEMENT_BYTES
    return 2 * bh * n * n * e + bh * n * d * e


def tiled_bytes_model(n):
    return MEMORY_BATCH_HEADS * n * MEMORY_HEAD_DIM * MEMORY_ELEMENT_BYTES


def measured_peak_bytes(attention, n):
    """Peak extra GPU memory of one attention call on fresh float16 inputs."""
    q, k, v = random_qkv(1, MEMORY_BATCH_HEADS, n, n, MEMORY_HEAD_DIM, torch.float16)
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    before = torch.cuda.memory_allocated()
    out = attention(q, k, v)
    torch.cuda.synchronize()
    peak = torch.cuda.max_memory_allocated() - before
    del out
    return peak


MEMORY_CANDIDATES = {"naive (S materialised)": naive_attention,
                     "SDPA": F.scaled_dot_product_attention}
if HAVE_TRITON:
    MEMORY_CANDIDATES["Triton tiled"] = triton_attention
memory_measured = {}
if DEVICE == "cuda":
    memory_measured = {name: [measured_peak_bytes(fn, n) for n in MEMORY_SEQ_LENS]
                       for name, fn in MEMORY_CANDIDATES.items()}

header = f"{'N':>6} {'naive model MiB':>16} {'tiled model MiB':>16}"
print(header + "".join(f" {name[:14] + ' MiB':>19}" for name in memory_measured))
for i, n in enumerate(MEMORY_SEQ_LENS):
    row = f"{n:>6} {naive_bytes_model(n) / 2**20:>16.1f} {tiled_bytes_model(n) / 2**20:>16.1f}"
    print(row + "".join(f" {values[i] / 2**20:>19.1f}" for values in memory_measured.values()))

# %%
# Peak memory against sequence length
# -----------------------------------

fig, ax = plt.subplots(figsize=(7, 4.5))
ax.loglog(MEMORY_SEQ_LENS, [naive_bytes_model(n) / 2**20 for n in MEMORY_SEQ_LENS], "--",
          color="tab:red", label="model: naive, 2 BH N^2 e + BH N d e")
ax.loglog(MEMORY_SEQ_LENS, [tiled_bytes_model(n) / 2**20 for n in MEMORY_SEQ_LENS], "--",
          color="tab:blue", label="model: tiled, output only, BH N d e")
for (name, values), marker in zip(memory_measured.items(), "os^"):
    ax.loglog(MEMORY_SEQ_LENS, [b / 2**20 for b in values], marker, label=f"measured: {name}")
ax.set_xlabel("sequence length N")
ax.set_ylabel("peak extra memory (MiB)")
kind = "measured and model" if memory_measured else "byte model only"
ax.set_title(f"Attention memory, BH={MEMORY_BATCH_HEADS}, d={MEMORY_HEAD_DIM}, float16 "
             f"({kind})\n{DEVICE_NAME}", fontsize=10)
ax.legend(fontsize=8)
fig.tight_layout()

# %%
# The HBM-access model of the FlashAttention paper
# ------------------------------------------------
# Memory size is one saving; memory *traffic* is the other. Dao et al.
# (2022), "FlashAttention: Fast and Memory-Efficient Exact Attention with
# IO-Awareness" (NeurIPS 2022, arXiv:2205.14135), Theorem 2, counts the
# accesses to HBM per head. For sequence length :math:`N`, head dimension
# :math:`d` and on-chip SRAM of :math:`M` elements (:math:`d \le M \le Nd`):
#
# - standard attention: :math:`\Theta(Nd + N^2)`,
# - FlashAttention: :math:`\Theta(N^2 d^2 / M)`.
#
# In the loop order of our kernel, ``K`` and ``V`` are read once for every
# block of queries. A block of queries can hold about :math:`M/d` rows, so
# there are :math:`Nd/M` blocks, each reading :math:`Nd` elements. The
# paper's Algorithm 1 swaps the roles, rereading ``Q`` and ``O`` once for
# every block of keys. We plot both counts
# with the constants dropped, for the paper's A100 figure of 192 KB of SRAM
# per SM (its Section 2.1), that is :math:`M` = 98,304 float16 elements. The
# count is a model, not a measurement. FlashAttention wins by about
# :math:`M / d^2` whenever :math:`d^2` is smaller than :math:`M`: a factor
# of 24 for :math:`d = 64`, but only 6 for :math:`d = 128`. FlashAttention-2
# (Dao 2023) changes the loop order, not this count.

SRAM_ELEMENTS = 192 * 1024 // 2  # A100 SRAM per SM (Dao et al. 2022, Sec. 2.1), float16
HBM_SEQ_LENS = [2**k for k in range(11, 18)]  # the theorem needs M <= N d


def standard_hbm_accesses(n, d):
    return n * d + n * n


def flash_hbm_accesses(n, d, sram_elements=SRAM_ELEMENTS):
    return n * n * d * d / sram_elements


print(f"\n{'N':>6} {'d':>4} {'standard':>14} {'flash':>14} {'ratio':>7}   (HBM accesses, model)")
for d in (64, 128):
    for n in (2048, 8192, 65536):
        standard, flash = standard_hbm_accesses(n, d), flash_hbm_accesses(n, d)
        print(f"{n:>6} {d:>4} {standard:>14.3e} {flash:>14.3e} {standard / flash:>7.1f}")

fig, ax = plt.subplots(figsize=(7, 4.5))
# N^2 dominates the standard count: its lines for d = 64 and 128 would lie on each other
ax.loglog(HBM_SEQ_LENS, [standard_hbm_accesses(n, 128) for n in HBM_SEQ_LENS], "-",
          color="tab:red", label="standard, Nd + N^2 (d=64 and d=128 coincide)")
for d, style in ((64, "-"), (128, ":")):
    ax.loglog(HBM_SEQ_LENS, [flash_hbm_accesses(n, d) for n in HBM_SEQ_LENS], style,
              color="tab:blue", label=f"FlashAttention, N^2 d^2 / M (d={d})")
ax.set_xlabel("sequence length N")
ax.set_ylabel("HBM accesses per head (elements, model)")
ax.set_title(f"Model of Dao et al. 2022, Thm. 2, M = {SRAM_ELEMENTS:,} elements "
             "(constants dropped)", fontsize=10)
ax.legend(fontsize=8)
fig.tight_layout()

# %%
# Speed, and what causal masking saves
# ------------------------------------
# ``F.scaled_dot_product_attention`` dispatches to a hand-tuned fused kernel
# on a recent GPU. We time both forward passes with
# ``triton.testing.do_bench`` on float16 inputs, without causal masking. The
# batch is 4 with 16 heads, so that even the shortest sequence launches
# hundreds of programs. A forward pass does ``4 BH N^2 d`` FLOPs (two
# matmuls of ``2 N^2 d`` each per head). We report them as TFLOP/s and as a
# fraction of this GPU's measured ``torch.matmul`` rate in float16. Our
# target for this plain kernel is at least 60% of SDPA's speed at
# ``N >= 4096``; the table says whether it got there.
#
# We also time the Triton kernel with causal masking. Each query block then
# stops at the diagonal, so for a long sequence it visits about half of the
# key blocks, and the time should follow. On a GPU we require the causal time
# to lie between 0.35 and 0.75 of the full time for ``N >= 4096``, where the
# diagonal blocks, which need the mask, are a small part of the work. The
# output of every timed call is checked against float64 SDPA, with the
# limits of the kernel check, on the first and the last (batch, head) pair.
#
# On a CPU the interpreter runs only the causal comparison, at tiny sizes.
# Its times measure NumPy working through the blocks, not a GPU, so the
# ratio is printed and not asserted.

if DEVICE == "cuda":
    TIMING_BATCH, TIMING_HEADS = 4, 16
    TIMING_SEQ_LENS = [1024, 2048, 4096, 8192]
    TIMING_HEAD_DIMS = [64, 128]
else:  # the interpreter takes seconds for one call at this size
    TIMING_BATCH, TIMING_HEADS = 1, 1
    TIMING_SEQ_LENS = [256]
    TIMING_HEAD_DIMS = [32]
CAUSAL_TIME_BOUNDS = (0.35, 0.75)  # causal time / full time, asserted on a GPU at N >= 4096


def matmul_tflops(n=8192):
    a = torch.randn(n, n, device=DEVICE, dtype=torch.float16)
    b = torch.randn(n, n, device=DEVICE, dtype=torch.float16)
    return 2 * n**3 / triton.testing.do_bench(lambda: a @ b, return_mode="median") / 1e9


def median_ms(fn):
    """Median time of fn() in ms: do_bench on a GPU; one interpreted call on a CPU."""
    if DEVICE == "cuda":
        return triton.testing.do_bench(fn, return_mode="median")
    return benchmark.Timer("fn()", globals={"fn": fn}).timeit(1).median * 1e3


def check_timed_output(q, k, v, causal):
    """The timed call's output, checked on the first and the last (batch, head) pair."""
    out = triton_attention(q, k, v, causal=causal)
    for b, h in ((0, 0), (q.shape[0] - 1, q.shape[1] - 1)):
        pair = (slice(b, b + 1), slice(h, h + 1))
        check_errors(out[pair], q[pair], k[pair], v[pair], causal,
                     f"timed Triton attention {tuple(q.shape)}, causal={causal}, pair {(b, h)}")


def attention_times(n, head_dim):
    """Median ms of SDPA (GPU only), of the Triton kernel, and of it with causal masking."""
    q, k, v = random_qkv(TIMING_BATCH, TIMING_HEADS, n, n, head_dim, KERNEL_DTYPE)
    for causal in (False, True):
        check_timed_output(q, k, v, causal)
    sdpa_ms = median_ms(lambda: F.scaled_dot_product_attention(q, k, v)) if DEVICE == "cuda" else None
    triton_ms = median_ms(lambda: triton_attention(q, k, v))
    causal_ms = median_ms(lambda: triton_attention(q, k, v, causal=True))
    return sdpa_ms, triton_ms, causal_ms


speed_rows = []
if HAVE_TRITON and DEVICE == "cuda":
    MATMUL_TFLOPS = matmul_tflops()
    print(f"\nfloat16 torch.matmul ceiling: {MATMUL_TFLOPS:.0f} TFLOP/s")
    print(f"{'d':>4} {'N':>6} {'SDPA ms':>8} {'Triton ms':>10} {'SDPA TF/s':>10} {'Triton TF/s':>12} "
          f"{'Triton % mm':>12} {'Triton/SDPA':>12} {'causal/full':>12}")
elif HAVE_TRITON:
    print("\nTriton interpreter on a CPU (NumPy, not a GPU), one call each: full and causal")
    print(f"{'d':>4} {'N':>6} {'full ms':>9} {'causal ms':>10} {'causal/full':>12}")
else:
    print("\nNo Triton here: the timing is skipped.")
for head_dim in TIMING_HEAD_DIMS if HAVE_TRITON else []:
    for n in TIMING_SEQ_LENS:
        sdpa_ms, triton_ms, causal_ms = attention_times(n, head_dim)
        row = {"head_dim": head_dim, "n": n, "causal_over_full": causal_ms / triton_ms}
        if DEVICE == "cuda":
            flops = 4 * TIMING_BATCH * TIMING_HEADS * n * n * head_dim
            row.update(sdpa_tf=flops / sdpa_ms / 1e9, triton_tf=flops / triton_ms / 1e9)
            print(f"{head_dim:>4} {n:>6} {sdpa_ms:>8.3f} {triton_ms:>10.3f} {row['sdpa_tf']:>10.1f} "
                  f"{row['triton_tf']:>12.1f} {100 * row['triton_tf'] / MATMUL_TFLOPS:>11.1f}% "
                  f"{row['triton_tf'] / row['sdpa_tf']:>11.2f}x {row['causal_over_full']:>12.2f}")
        else:
            print(f"{head_dim:>4} {n:>6} {triton_ms:>9.1f} {causal_ms:>10.1f} "
                  f"{row['causal_over_full']:>12.2f}")
        speed_rows.append(row)
if speed_rows:
    print("the outputs of all timed calls, full and causal, match float64 SDPA")
if speed_rows and DEVICE == "cuda":
    long_rows = [row for row in speed_rows if row["n"] >= 4096]
    long_fractions = [row["triton_tf"] / row["sdpa_tf"] for row in long_rows]
    verdict = "meets" if min(long_fractions) >= 0.6 else "misses"
    print(f"Triton speed / SDPA speed at N >= 4096: min {min(long_fractions):.2f}, "
          f"max {max(long_fractions):.2f} ({verdict} the 0.60 target)")
    low, high = CAUSAL_TIME_BOUNDS
    for row in long_rows:
        if not low <= row["causal_over_full"] <= high:
            raise AssertionError(f"causal / full time {row['causal_over_full']:.2f} at d={row['head_dim']}, "
                                 f"N={row['n']}: outside {CAUSAL_TIME_BOUNDS}; causal masking "
                                 "should skip about half of the work")
    print(f"causal / full time at N >= 4096 within {CAUSAL_TIME_BOUNDS}: about half the work")

    fig, ax = plt.subplots(figsize=(7, 4.5))
    for head_dim, style in zip(TIMING_HEAD_DIMS, ("-", "--")):
        rows = [row for row in speed_rows if row["head_dim"] == head_dim]
        ax.plot([row["n"] for row in rows], [row["sdpa_tf"] for row in rows], "o" + style,
                color="tab:gray", label=f"SDPA, d={head_dim}")
        ax.plot([row["n"] for row in rows], [row["triton_tf"] for row in rows], "s" + style,
                color="tab:blue", label=f"Triton tiled, d={head_dim}")
    ax.axhline(MATMUL_TFLOPS, color="tab:red", ls=":", label="float16 torch.matmul (measured)")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("sequence length N")
    ax.set_ylabel("throughput (TFLOP/s)")
    ax.set_ylim(bottom=0)
    ax.set_title(f"Attention forward, float16, batch {TIMING_BATCH} x {TIMING_HEADS} heads"
                 f"\n{DEVICE_NAME}", fontsize=10)
    # below the axes, so that it covers neither the points nor the matmul ceiling
    ax.legend(fontsize=8, ncol=3, loc="upper center", bbox_to_anchor=(0.5, -0.15))
    fig.tight_layout()

# %%
# Read the result
# ---------------
# **Correctness.** The online softmax, the PyTorch tiled attention and the
# Triton kernel all reproduce PyTorch's results on sequence lengths that are
# not multiples of any block size, with and without causal masking, and
# with scores shifted by 1000. The algorithm is exact: only the order of the
# floating-point additions changes, and the kernel's errors stay within the
# few roundings its dtype allows (the first table).
#
# **Memory.** The naive curve grows as :math:`N^2`, the tiled one as
# :math:`N`. At a long context the score matrices alone need gigabytes per
# layer; training also keeps them for the backward pass. FlashAttention's
# backward recomputes them block by block from ``Q``, ``K``, ``V`` and the
# saved row statistics instead. On a GPU the table sets the measured peaks
# beside the two models. A fused kernel, ours or the one behind SDPA, should
# follow the linear line.
#
# **Traffic and speed.** The access-count model explains why the fused
# kernel is also faster: for ``d = 64`` it moves about ``M / d^2`` times
# fewer bytes. That factor is smaller for ``d = 128``, where each query block
# holds fewer rows. The remaining gap to SDPA (table above) comes from
# engineering this kernel leaves out. SDPA's default flash backend is
# FlashAttention-2 (Dao 2023): the same loop order, with the work of a query
# block split between warps so that they need not exchange partial results,
# masks only on the blocks that need them, as little non-matmul arithmetic as
# possible, and tiles tuned per GPU; it uses neither TMA nor warp
# specialisation. FlashAttention-3 (Shah et al. 2024) adds those on Hopper:
# producer warps load tiles with TMA while consumer warps multiply, and the
# softmax of one tile, slowed by the GPU's few exponential units, overlaps
# the matrix products of another.
#
# **Causal masking.** Skipping the blocks above the diagonal makes the causal
# pass take about half the time of the full one at long sequences (the last
# column; asserted on a GPU). On a CPU the interpreter runs each program as
# NumPy code, so its times measure NumPy, not the GPU; its ratio only counts
# the blocks each version visits.
#
# The memory and speed measurements lean on
# :ref:`sphx_glr_auto_examples_lecture05_gpus_05_precision_and_coalescing.py`
# (float16 halves the bytes) and on the roofline of
# :ref:`sphx_glr_auto_examples_lecture05_gpus_01_roofline.py`.

KEY_FIGURES = {
    "device": DEVICE_NAME,
    "naive_over_tiled_memory_model_at_max_N": naive_bytes_model(MEMORY_SEQ_LENS[-1])
    / tiled_bytes_model(MEMORY_SEQ_LENS[-1]),
}
if memory_measured:
    for name, values in memory_measured.items():
        KEY_FIGURES[f"peak_MiB_{name.split()[0]}_N{MEMORY_SEQ_LENS[-1]}"] = values[-1] / 2**20
for row in speed_rows:
    head_dim, n = row["head_dim"], row["n"]
    if n == TIMING_SEQ_LENS[-1]:
        KEY_FIGURES[f"triton_causal_over_full_time_d{head_dim}_N{n}"] = row["causal_over_full"]
    if DEVICE != "cuda":
        continue
    if n >= 4096:
        KEY_FIGURES[f"triton_over_sdpa_d{head_dim}_N{n}"] = row["triton_tf"] / row["sdpa_tf"]
    if n == TIMING_SEQ_LENS[-1]:
        KEY_FIGURES[f"triton_TFLOPps_d{head_dim}_N{n}"] = row["triton_tf"]
        KEY_FIGURES[f"sdpa_TFLOPps_d{head_dim}_N{n}"] = row["sdpa_tf"]

# The Triton calls of the CUDA branch, for the course's ahead-of-time compile check: it
# calls each host function on shape-only tensors, with DEVICE == "cuda", and compiles
# every launch for five GPU generations. (host function, [(shape, dtype)], keywords)
GPU_LAUNCHES = (
    [("triton_attention", [((b, h, n_q, d), dtype)] + [((b, h, n_k, d), dtype)] * 2, {"causal": causal})
     for dtype in CHECK_DTYPES
     for b, h, n_q, n_k, d in KERNEL_TEST_SHAPES + (LONG_ROW_SHAPES if dtype == torch.float16 else [])
     for causal in (False, True)]
    + [("triton_attention", [((1, MEMORY_BATCH_HEADS, n, MEMORY_HEAD_DIM), torch.float16)] * 3, {})
       for n in MEMORY_SEQ_LENS]
    + [("triton_attention", [((TIMING_BATCH, TIMING_HEADS, n, d), KERNEL_DTYPE)] * 3, {"causal": causal})
       for d in TIMING_HEAD_DIMS for n in TIMING_SEQ_LENS for causal in (False, True)]
)
