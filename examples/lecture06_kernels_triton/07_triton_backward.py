"""
A Triton kernel with its backward pass: RMSNorm
===============================================

Training needs the gradient of every kernel, so a fused forward kernel is only
half the job. We derive the backward pass of RMSNorm, write forward and
backward in Triton, reduce the weight gradient across rows in two
deterministic stages, and wrap both in ``torch.autograd.Function``. The
gradients are checked with ``gradcheck`` in float64 and against PyTorch's
autograd, a wrong weight gradient is planted to show that the checks catch it,
the bytes of the backward are predicted and, on a GPU, measured against
PyTorch and ``torch.compile``, and a small training run follows PyTorch's loss
curve. Afterwards you can write and check the backward of your own kernels.

**Requirements.** Full version: a CUDA GPU and Triton (bfloat16 needs compute
capability 8.0 or newer, else float16 is used). On a CPU, Triton runs in
interpreter mode at small sizes, in float32: the page checks every gradient
(``torch.compile``'s too, for which Inductor writes C++ and needs a C++
compiler), trains the small model, and draws the byte model instead of
timings. Without Triton, only the PyTorch parts run: the formulas, the byte
model, the compiled reference and the reference training run. On a T4 (compute
capability 7.5, as on free Colab notebooks) the Triton kernels are checked and
timed in float16 instead of bfloat16.
"""

# %%
# Setup
# -----
# On a CPU, ``TRITON_INTERPRET=1`` must be set before Triton is imported; the
# kernels then run as NumPy code, one program after another.

import math
import os
import shutil
import subprocess
import tempfile

import matplotlib.pyplot as plt
import torch
import torch.nn.functional as F
from torch import nn
from torch.autograd.gradcheck import GradcheckError
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
if DEVICE == "cpu":
    os.environ.setdefault("TRITON_INTERPRET", "1")

try:
    import triton
    import triton.language as tl

    TRITON_IMPORT_ERROR = None
except ImportError as error:
    TRITON_IMPORT_ERROR = error
HAVE_TRITON = TRITON_IMPORT_ERROR is None

# Inductor imports Triton (where it is installed), so it comes after TRITON_INTERPRET.
import torch._inductor.config as inductor_config
from torch._inductor.utils import fresh_cache

ON_GPU = DEVICE == "cuda"
DEVICE_NAME = torch.cuda.get_device_name() if ON_GPU else "CPU"
EPS = 1e-6
torch.manual_seed(0)


def skip_or_fail(section, capability, reason):
    """Readers' runs skip a part whose tool is missing; the site's builds require it."""
    if capability in os.environ.get("COURSE_REQUIRE", "").split(","):
        raise RuntimeError(f"{section}: this build requires {capability}, but {reason}")
    print(f"Skipped {section}: {capability} is missing ({reason}).")


def working_dtype():
    """The dtype a model would train in here: bfloat16 on sm80+, float32 on a CPU."""
    if not ON_GPU:
        return torch.float32
    capability = torch.cuda.get_device_capability()
    if capability >= (8, 0):
        return torch.bfloat16
    skip_or_fail("bfloat16", "sm80",
                 "compute capability {}.{} predates bfloat16; float16 instead".format(*capability))
    return torch.float16


WORKING_DTYPE = working_dtype()
# (rows, columns, rows per backward program; None: the kernel's own choice)
GRADCHECK_CASE = (6, 11, 4)
CHECK_CASES = ([(1823, 781, None), (1, 3000, None), (4097, 1000, None), (37, 781, 4),
                (33, 8192, 4), (300, 16384, None)] if ON_GPU
               else [(37, 781, 4), (1, 3000, None), (130, 100, 16), (19, 4096, None)])
FAULT_CASE = (37, 781, 4)
SWEEP_ROWS = 8192
SWEEP_COLS = [256, 512, 1024, 2048, 4096, 8192, 16384]
TRAIN_TOKENS, TRAIN_WIDTH = (512, 1000) if ON_GPU else (48, 96)
TRAIN_STEPS = 10

if not HAVE_TRITON:
    skip_or_fail("the Triton kernels (the PyTorch parts still run)", "triton",
                 f"import triton failed: {TRITON_IMPORT_ERROR}")
elif ON_GPU:
    print(f"{DEVICE_NAME}: Triton compiled, checked and timed in {WORKING_DTYPE}.")
else:
    print("CPU: Triton interpreted in float32, so its kernels are checked, not timed.")

# %%
# RMSNorm and its gradient
# ------------------------
# RMSNorm scales each row :math:`x \in \mathbb{R}^N` by the reciprocal of its
# root mean square, :math:`r = (\tfrac1N \sum_j x_j^2 + \epsilon)^{-1/2}`, and
# multiplies by a learned weight: :math:`y = w \odot \hat x` with
# :math:`\hat x = r\,x`. Write :math:`dy` for the gradient
# :math:`\partial L / \partial y` of the loss and :math:`g = w \odot dy`.
# With :math:`\partial r/\partial x_k = -r^3 x_k / N`, the chain rule gives
# ``dx`` for each row, and ``dw`` as a sum over the rows :math:`i`:
#
# .. math::
#
#    dx = r \Big(g - \hat x \, \frac{1}{N}\sum_{j} g_j \hat x_j\Big),
#    \qquad
#    dw = \sum_{i} dy_i \odot \hat x_i .
#
# So ``dx`` needs one more reduction along the row (the mean of
# :math:`g \odot \hat x`) and nothing from other rows, while ``dw`` is a
# reduction *across* rows: every row contributes to every element of it.
#
# The reference is RMSNorm written in PyTorch operations, computing in float32
# or wider whatever the input dtype, as model code commonly does. We check the formulas, in
# PyTorch, against the reference's autograd in float64 before writing a
# kernel: if the derivation were wrong, no kernel could be right.


def reference_rmsnorm(x, weight, eps=EPS):
    """RMSNorm in PyTorch operations, computed in float32 or wider."""
    compute = torch.promote_types(x.dtype, torch.float32)
    x_wide = x.to(compute)
    rstd = torch.rsqrt(x_wide.pow(2).mean(-1, keepdim=True) + eps)
    return (x_wide * rstd * weight.to(compute)).to(x.dtype)


def backward_formulas(dy, x, weight, eps=EPS):
    """dx and dw from the two formulas above, in PyTorch."""
    rstd = torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)
    x_hat = x * rstd
    w_dy = weight * dy
    dx = rstd * (w_dy - x_hat * (w_dy * x_hat).mean(-1, keepdim=True))
    return dx, (dy * x_hat).reshape(-1, x.shape[-1]).sum(0)


def autograd_gradients(rmsnorm, x, weight, dy):
    """y, dx and dw of ``rmsnorm`` at (x, weight) for the output gradient dy."""
    x = x.detach().requires_grad_()
    weight = weight.detach().requires_grad_()
    y = rmsnorm(x, weight)
    dx, dw = torch.autograd.grad(y, (x, weight), dy)
    return y.detach(), dx, dw


def random_case(rows, cols, dtype):
    """x, a weight away from 1 (so that dw is not symmetric in it), and dy."""
    x = torch.randn(rows, cols, device=DEVICE).to(dtype)
    weight = (1 + 0.5 * torch.randn(cols, device=DEVICE)).to(dtype)
    return x, weight, torch.randn(rows, cols, device=DEVICE).to(dtype)


x64, w64, dy64 = random_case(37, 781, torch.float64)
_, dx_autograd, dw_autograd = autograd_gradients(reference_rmsnorm, x64, w64, dy64)
dx_formula, dw_formula = backward_formulas(dy64, x64, w64)
# two float64 evaluations in different orders: sums of up to 781 terms of order one,
# n * eps = 781 * 2.2e-16 = 1.7e-13, under 1e-12 relative and absolute
torch.testing.assert_close(dx_formula, dx_autograd, rtol=1e-12, atol=1e-12)
torch.testing.assert_close(dw_formula, dw_autograd, rtol=1e-12, atol=1e-12)
print("the formulas for dx and dw match autograd in float64 (rtol 1e-12)")

# %%
# The forward kernel
# ------------------
# One program per row, as for the softmax of
# :ref:`sphx_glr_auto_examples_lecture06_kernels_triton_05_triton_softmax_matmul.py`.
# Besides ``y``, the forward writes one number per row, :math:`r`, that the
# backward needs: saving it costs 4 bytes per row and spares the backward a
# reduction over the row. ``ACC_DTYPE`` is the precision of the arithmetic:
# float32 for 16- and 32-bit inputs, float64 for float64, which ``gradcheck``
# needs. The kernel divides by a square root rather than calling
# ``tl.rsqrt``: in float64, Triton compiles the latter to an approximate
# instruction (``rsqrt.approx.f64``), and gradcheck's finite differences need
# correctly rounded arithmetic.

if HAVE_TRITON:

    @triton.jit
    def rmsnorm_forward_kernel(x_ptr, w_ptr, y_ptr, rstd_ptr, n_cols, eps,
                               BLOCK_N: tl.constexpr, ACC_DTYPE: tl.constexpr):
        row = tl.program_id(0)
        cols = tl.arange(0, BLOCK_N)
        in_row = cols < n_cols
        x = tl.load(x_ptr + row * n_cols + cols, mask=in_row, other=0.0).to(ACC_DTYPE)
        w = tl.load(w_ptr + cols, mask=in_row, other=0.0).to(ACC_DTYPE)
        rstd = 1.0 / tl.sqrt(tl.sum(x * x, axis=0) / n_cols + eps)
        tl.store(rstd_ptr + row, rstd)
        tl.store(y_ptr + row * n_cols + cols, (x * rstd * w).to(y_ptr.dtype.element_ty),
                 mask=in_row)

    def accumulator_dtypes(dtype):
        """(torch, Triton) dtype of the arithmetic for inputs of ``dtype``."""
        if dtype == torch.float64:
            return torch.float64, tl.float64
        return torch.float32, tl.float32

    def warps_for(block_n):
        """More warps for longer rows, so that each thread holds a bounded share."""
        return min(max(block_n // 256, 1), 32)

    def rmsnorm_forward(x, weight, eps=EPS):
        """y and the per-row reciprocal RMS of a tensor whose last dimension is normalised."""
        n_cols = x.shape[-1]
        rows = x.reshape(-1, n_cols).contiguous()
        y = torch.empty_like(rows)
        rstd_dtype, acc_dtype = accumulator_dtypes(x.dtype)
        rstd = torch.empty(rows.shape[0], dtype=rstd_dtype, device=x.device)
        block_n = triton.next_power_of_2(n_cols)
        rmsnorm_forward_kernel[(rows.shape[0],)](rows, weight.contiguous(), y, rstd, n_cols, eps,
                                                 BLOCK_N=block_n, ACC_DTYPE=acc_dtype,
                                                 num_warps=warps_for(block_n))
        return y.reshape(x.shape), rstd

# %%
# The backward, and a reduction across rows
# -----------------------------------------
# ``dx`` is again one row's work. ``dw`` needs a sum over all ``M`` rows, and
# there are two ways for many programs to build one sum.
#
# **Atomics.** Each program adds its rows' contributions into one float32
# ``dw`` with ``tl.atomic_add``. That needs no partial buffer (only ``dw``
# itself, zeroed before and cast to the weight's dtype after), but every
# program updates the same ``N`` addresses, so the additions queue up at the
# L2 cache; and the order in which they land changes from run to run.
# Floating-point addition is not associative, so ``dw`` can then differ in its
# last bits between two runs on the same inputs: a training run can no longer
# be reproduced bit for bit, and a bug is harder to tell from noise.
#
# **Two stages**, which we use. Program ``g`` of the backward handles a group
# of ``ROWS_PER_PROGRAM`` consecutive rows: it computes their ``dx`` and adds
# their :math:`dy \odot \hat x` into a float32 row held in registers, then
# writes that row once, to row ``g`` of a ``[num_groups, N]`` buffer of
# partial sums. A second, small kernel sums the buffer down its columns, in a
# fixed order. No two programs write the same address, and the result is the
# same bits on every run. The price is the buffer: ``num_groups x N x 4``
# bytes written and read again, next to the ``3 x M x N x s`` bytes of ``x``,
# ``dy`` and ``dx`` (``s`` bytes per element): a fraction ``8 G / (3 s M)``
# for ``G`` groups, whatever the row length. More groups give more programs to
# spread over the SMs, fewer groups a smaller buffer; the kernel makes at most
# 512 groups, and the byte table below shows what that costs.
#
# Rows past the end of the last group are masked: they load zeros, and with
# :math:`dy = 0` they add nothing to ``dw``. The loop over a group's rows
# updates ``partial_dw`` before the row reduction and loads ``w`` afresh for
# each row (from the cache), so that fewer row-length values are alive at
# once and long rows need fewer registers. The course's ahead-of-time compile
# check reports the registers and spills of every specialisation.

MAX_GROUPS = 512


def default_rows_per_program(n_rows):
    """The smallest power of two that makes at most MAX_GROUPS groups."""
    return 1 << (-(-n_rows // MAX_GROUPS) - 1).bit_length()


if HAVE_TRITON:

    @triton.jit
    def rmsnorm_backward_kernel(dy_ptr, x_ptr, w_ptr, rstd_ptr, dx_ptr, partial_dw_ptr,
                                n_rows, n_cols, ROWS_PER_PROGRAM: tl.constexpr,
                                BLOCK_N: tl.constexpr, ACC_DTYPE: tl.constexpr):
        group = tl.program_id(0)
        cols = tl.arange(0, BLOCK_N)
        in_row = cols < n_cols
        partial_dw = tl.zeros([BLOCK_N], dtype=ACC_DTYPE)
        for i in range(ROWS_PER_PROGRAM):
            row = group * ROWS_PER_PROGRAM + i
            # compared as a block: Triton 3.9's interpreter refuses the int32 mask that
            # in_row & (row < n_rows) becomes there (3.6 accepted it)
            mask = in_row & (tl.broadcast_to(row, [BLOCK_N]) < n_rows)
            x = tl.load(x_ptr + row * n_cols + cols, mask=mask, other=0.0).to(ACC_DTYPE)
            dy = tl.load(dy_ptr + row * n_cols + cols, mask=mask, other=0.0).to(ACC_DTYPE)
            rstd = tl.load(rstd_ptr + row, mask=row < n_rows, other=0.0)
            x_hat = x * rstd
            partial_dw += dy * x_hat
            w_dy = tl.load(w_ptr + cols, mask=in_row, other=0.0).to(ACC_DTYPE) * dy
            mean_w_dy_x_hat = tl.sum(w_dy * x_hat, axis=0) / n_cols
            dx = rstd * (w_dy - x_hat * mean_w_dy_x_hat)
            tl.store(dx_ptr + row * n_cols + cols, dx.to(dx_ptr.dtype.element_ty), mask=mask)
        tl.store(partial_dw_ptr + group * n_cols + cols, partial_dw, mask=in_row)

    @triton.jit
    def sum_partials_kernel(partial_ptr, dw_ptr, n_groups, n_cols, GROUPS_POW2: tl.constexpr,
                            BLOCK_G: tl.constexpr, BLOCK_COLS: tl.constexpr,
                            ACC_DTYPE: tl.constexpr):
        cols = tl.program_id(0) * BLOCK_COLS + tl.arange(0, BLOCK_COLS)
        total = tl.zeros([BLOCK_COLS], dtype=ACC_DTYPE)
        for start in range(0, GROUPS_POW2, BLOCK_G):  # always the same order: deterministic
            groups = start + tl.arange(0, BLOCK_G)
            mask = (groups[:, None] < n_groups) & (cols[None, :] < n_cols)
            tile = tl.load(partial_ptr + groups[:, None] * n_cols + cols[None, :], mask=mask,
                           other=0.0)
            total += tl.sum(tile, axis=0)
        tl.store(dw_ptr + cols, total.to(dw_ptr.dtype.element_ty), mask=cols < n_cols)

    def backward_partials(dy, x, weight, rstd, rows_per_program=None):
        """dx, and one partial sum of dw per group of rows (stage 1)."""
        n_cols = x.shape[-1]
        rows = x.reshape(-1, n_cols).contiguous()  # the saved x may be a strided view
        n_rows = rows.shape[0]
        rows_per_program = rows_per_program or default_rows_per_program(n_rows)
        n_groups = triton.cdiv(n_rows, rows_per_program)
        dx = torch.empty_like(rows)
        partial_dw = torch.empty(n_groups, n_cols, dtype=rstd.dtype, device=x.device)
        block_n = triton.next_power_of_2(n_cols)
        rmsnorm_backward_kernel[(n_groups,)](
            dy.reshape(-1, n_cols).contiguous(), rows, weight.contiguous(), rstd, dx, partial_dw,
            n_rows, n_cols, ROWS_PER_PROGRAM=rows_per_program, BLOCK_N=block_n,
            ACC_DTYPE=accumulator_dtypes(x.dtype)[1], num_warps=warps_for(block_n))
        return dx.reshape(x.shape), partial_dw

    def sum_partials(partial_dw, dtype):
        """dw: the partial sums added down their columns (stage 2)."""
        n_groups, n_cols = partial_dw.shape
        dw = torch.empty(n_cols, dtype=dtype, device=partial_dw.device)
        block_cols = 64
        sum_partials_kernel[(triton.cdiv(n_cols, block_cols),)](
            partial_dw, dw, n_groups, n_cols, GROUPS_POW2=triton.next_power_of_2(n_groups),
            BLOCK_G=32, BLOCK_COLS=block_cols, ACC_DTYPE=accumulator_dtypes(partial_dw.dtype)[1])
        return dw

    def rmsnorm_backward(dy, x, weight, rstd, rows_per_program=None):
        """dx and dw of RMSNorm, from the forward's saved reciprocal RMS."""
        dx, partial_dw = backward_partials(dy, x, weight, rstd, rows_per_program)
        return dx, sum_partials(partial_dw, weight.dtype)

# %%
# Wrapping it for autograd
# ------------------------
# ``torch.autograd.Function`` pairs the two: ``forward`` runs the forward
# kernel and saves what the backward needs (``x``, ``w`` and ``r``, not
# ``y``), and ``backward`` returns one gradient per input of ``forward``,
# ``None`` for those that are not tensors. The backward is a parameter here
# only so that the faults planted below can be swapped in.

if HAVE_TRITON:

    class TritonRMSNorm(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x, weight, eps, rows_per_program, backward):
            y, rstd = rmsnorm_forward(x, weight, eps)
            ctx.save_for_backward(x, weight, rstd)
            ctx.rows_per_program, ctx.backward_fn = rows_per_program, backward
            return y

        @staticmethod
        def backward(ctx, dy):
            x, weight, rstd = ctx.saved_tensors
            dx, dw = ctx.backward_fn(dy, x, weight, rstd, ctx.rows_per_program)
            return dx, dw, None, None, None

    def triton_rmsnorm(x, weight, eps=EPS, rows_per_program=None, backward=rmsnorm_backward):
        return TritonRMSNorm.apply(x, weight, eps, rows_per_program, backward)

# %%
# Verify: gradcheck in float64
# ----------------------------
# :func:`torch.autograd.gradcheck` perturbs every input element by a small
# step, measures how the outputs move, and compares that numerical Jacobian
# with the one our backward implies. It needs float64 to tell a wrong
# gradient from rounding, so the kernels run in float64 here (on a GPU too:
# Triton compiles float64), on a 6 x 11 input split into groups of 4 rows, so
# that the last group is partial.


def gradcheck_rmsnorm(backward, rows, cols, rows_per_program, fast_mode=False):
    """gradcheck of the Triton RMSNorm with the given backward; raises if it fails."""
    x, weight, _ = random_case(rows, cols, torch.float64)
    return torch.autograd.gradcheck(
        lambda x, weight: triton_rmsnorm(x, weight, EPS, rows_per_program, backward),
        (x.requires_grad_(), weight.requires_grad_()), fast_mode=fast_mode)


if HAVE_TRITON:
    gradcheck_rmsnorm(rmsnorm_backward, *GRADCHECK_CASE)
    rows, cols, group = GRADCHECK_CASE
    print(f"gradcheck, float64, {rows} x {cols} in groups of {group} rows: passed")

# %%
# Verify: against PyTorch on awkward shapes
# -----------------------------------------
# In the working dtype, each of ``y``, ``dx`` and ``dw`` is compared with the
# reference's autograd in float64 on the same rounded inputs. The kernels
# compute in float32 and round each result once to the working dtype, of
# machine epsilon :math:`\varepsilon`; that rounding moves an element
# :math:`v` by at most :math:`\varepsilon |v| / 2`. So each element may err by
# :math:`\varepsilon` times its own magnitude, plus ``TOLERANCE_STEPS``
# float32 epsilons times the largest magnitude of the reference, for the
# float32 arithmetic (which decides the elements near zero, and everything in
# a float32 run). The table gives each largest error as a fraction of that
# allowance. A limit scaled only to the largest magnitude would be too loose
# in a 16-bit dtype: it would pass a kernel that forgot to accumulate in
# float32, whose errors on the small elements of ``dx`` and ``dw`` are many
# times their size. The shapes have row lengths far from powers of two, a
# single row, and groups whose last one is partial; one input is stored
# column by column, as a transposed view is.

TOLERANCE_STEPS = 4


def tolerance(reference, dtype, steps=TOLERANCE_STEPS):
    """rtol: one step of ``dtype`` at each element's size (its one rounding, eps / 2, with
    2x headroom); atol: ``steps`` steps of the arithmetic (float32; float64 for float64)
    at the largest size, the floor near zero."""
    arithmetic = torch.float64 if dtype == torch.float64 else torch.float32
    return {"rtol": torch.finfo(dtype).eps,
            "atol": steps * torch.finfo(arithmetic).eps * reference.abs().max().item()}


def error_over_allowed(result, reference, dtype, steps=TOLERANCE_STEPS):
    """The largest error as a fraction of the allowed error, as assert_close measures it."""
    allowed = tolerance(reference, dtype, steps)
    return ((result.double() - reference).abs()
            / (allowed["atol"] + allowed["rtol"] * reference.abs())).max().item()


def assert_within_allowed(result, reference, dtype, what, steps=TOLERANCE_STEPS):
    """Raise unless the shapes agree and every element is within its allowed error."""
    torch.testing.assert_close(result.double(), reference, **tolerance(reference, dtype, steps),
                               msg=lambda message: f"{what}: {message}")


def check_gradients(rmsnorm, rows, cols, dtype, column_major=False, steps=TOLERANCE_STEPS):
    """y, dx and dw of ``rmsnorm`` against the float64 reference; errors over the allowed."""
    x, weight, dy = random_case(rows, cols, dtype)
    if column_major:  # the same values, laid out as a transposed view's are
        x = x.t().contiguous().t()
    expected = autograd_gradients(reference_rmsnorm, x.double(), weight.double(), dy.double())
    result = autograd_gradients(rmsnorm, x, weight, dy)
    for name, got, want in zip(("y", "dx", "dw"), result, expected):
        assert_within_allowed(got, want, dtype, f"{name} of {rows} x {cols}", steps)
    return [error_over_allowed(got, want, dtype, steps) for got, want in zip(result, expected)]


def triton_with(rows_per_program=None, backward=None):
    """The Triton RMSNorm with this grouping and backward, as a function of (x, weight)."""
    return lambda x, weight: triton_rmsnorm(x, weight, EPS, rows_per_program,
                                            backward or rmsnorm_backward)


if HAVE_TRITON:
    print(f"{WORKING_DTYPE}: largest error / allowed error (at most 1)")
    print(f"{'rows':>6} {'cols':>6} {'groups':>7} {'y':>6} {'dx':>6} {'dw':>6}")
    for rows, cols, rows_per_program in CHECK_CASES:
        fractions = check_gradients(triton_with(rows_per_program), rows, cols, WORKING_DTYPE)
        groups = triton.cdiv(rows, rows_per_program or default_rows_per_program(rows))
        print(f"{rows:>6} {cols:>6} {groups:>7} " + " ".join(f"{f:6.2f}" for f in fractions))
    rows, cols, rows_per_program = FAULT_CASE
    fractions = check_gradients(triton_with(rows_per_program), rows, cols, WORKING_DTYPE,
                                column_major=True)
    print(f"x stored column by column, {rows} x {cols}: y, dx, dw at "
          + ", ".join(f"{f:.2f}" for f in fractions) + " of the allowed error")

    x, weight, dy = random_case(*CHECK_CASES[0][:2], WORKING_DTYPE)
    _, _, dw_first = autograd_gradients(triton_with(), x, weight, dy)
    _, _, dw_second = autograd_gradients(triton_with(), x, weight, dy)
    if not torch.equal(dw_first, dw_second):
        raise AssertionError("two backward passes on the same inputs gave different dw")
    print("dw is bitwise identical over two backward passes on the same inputs")

# %%
# Planted faults: a wrong dw must fail
# ------------------------------------
# A check that passes everything proves nothing. Two plausible mistakes in
# ``dw``, each dropped into the same autograd wrapper:
#
# - *forgetting* :math:`\hat x`: summing ``dy`` alone, the gradient of
#   :math:`y = w \odot x` (written in PyTorch here, for brevity);
# - *losing a group*: running both real kernels, but summing the partial
#   buffer without its first row, so that four rows never reach ``dw``.
#
# Each must be rejected both by the comparison above and by ``gradcheck``
# (in its fast mode, which compares one random projection of the Jacobian,
# :math:`v^\top J u`, rather than all of it). ``dx`` is untouched,
# so only ``dw`` can fail.

if HAVE_TRITON:

    def backward_without_x_hat(dy, x, weight, rstd, rows_per_program=None):
        dx, _ = backward_partials(dy, x, weight, rstd, rows_per_program)
        return dx, dy.reshape(-1, x.shape[-1]).sum(0)

    def backward_losing_first_group(dy, x, weight, rstd, rows_per_program=None):
        dx, partial_dw = backward_partials(dy, x, weight, rstd, rows_per_program)
        return dx, sum_partials(partial_dw[1:], weight.dtype)

    PLANTED_FAULTS = {"dw without x_hat": backward_without_x_hat,
                      "dw losing group 0": backward_losing_first_group}


def rejection(check):
    """The first line of the error by which ``check()`` rejects a fault; raises if it accepts."""
    try:
        check()
    except GradcheckError as error:
        return str(error).strip().splitlines()[0]
    raise RuntimeError("a planted fault passed the check")


def show_fault_rejected(name, backward):
    """How far the planted ``backward`` is off, and that both checks reject it."""
    rows, cols, rows_per_program = FAULT_CASE
    planted = triton_with(rows_per_program, backward)
    x, weight, dy = random_case(rows, cols, WORKING_DTYPE)
    _, _, dw_expected = autograd_gradients(reference_rmsnorm, x.double(), weight.double(),
                                           dy.double())
    _, _, dw_planted = autograd_gradients(planted, x, weight, dy)
    # the comparison's own measure, computed here rather than raised, so that the margin
    # log of the real checks does not count a fault that is meant to fail
    fraction = error_over_allowed(dw_planted, dw_expected, WORKING_DTYPE)
    if not fraction > 1:  # NaN is rejected too
        raise RuntimeError(f"{name}: the comparison passed a planted fault")
    print(f"{name}: dw errs by {fraction:.0f} times the allowed error; rejected by")
    print(f"  the comparison: error / allowed error {fraction:.3g} > 1")
    print("  gradcheck:      "
          + rejection(lambda: gradcheck_rmsnorm(backward, *GRADCHECK_CASE, fast_mode=True)))


if HAVE_TRITON:
    print("planted faults at {} x {} in groups of {} rows".format(*FAULT_CASE))
    for name, backward in PLANTED_FAULTS.items():
        show_fault_rejected(name, backward)

# %%
# Predict: the bytes of the backward
# ----------------------------------
# A backward of RMSNorm must read ``x`` and ``dy``, write ``dx`` (``M x N``
# elements each) and ``dw``, read ``w``, and read the saved :math:`r` (4 bytes
# per row): at ``s`` bytes per element, about ``3MNs`` bytes, the minimum
# that all implementations are credited with below. Our two kernels add the
# partial buffer, written once and read once, and ``w``, which reaches DRAM
# about once per program (the rows after the first find it in the cache).
#
# PyTorch's eager backward runs one kernel per operation of the reference's
# graph, and each reads its inputs from memory and writes its output back.
# Rather than count them by hand, we let PyTorch tell us: a
# ``TorchDispatchMode`` sees every operation autograd runs, and we add up the
# bytes of their inputs and outputs. On ``meta`` tensors, which have shapes but
# no data, this costs nothing at any size.


def triton_backward_bytes(rows, cols, element_size, rows_per_program=None):
    """Bytes our two backward kernels read and write (float32 partials and r)."""
    rows_per_program = rows_per_program or default_rows_per_program(rows)
    groups = -(-rows // rows_per_program)
    partial_buffer = 2 * 4 * groups * cols  # written by stage 1, read by stage 2
    return (3 * rows * cols + groups * cols + cols) * element_size + 4 * rows + partial_buffer


def minimum_backward_bytes(rows, cols, element_size):
    """Read x, dy, w and r once; write dx and dw once."""
    return (3 * rows * cols + 2 * cols) * element_size + 4 * rows


def distinct_bytes(tensor):
    """Bytes of the distinct elements: a broadcast (stride-0) dimension counts once."""
    kept = [size for size, stride in zip(tensor.shape, tensor.stride()) if stride != 0]
    return math.prod(kept) * tensor.element_size()


class KernelBytes(TorchDispatchMode):
    """Records (operation, bytes read, bytes written) of every non-view operation."""

    def __init__(self):
        super().__init__()
        self.kernels = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if not func.is_view:
            tensors_in = [t for t in tree_leaves((args, kwargs)) if isinstance(t, torch.Tensor)]
            tensors_out = [t for t in tree_leaves(out) if isinstance(t, torch.Tensor)]
            self.kernels.append((str(func.overloadpacket).removeprefix("aten."),
                                 sum(map(distinct_bytes, tensors_in)),
                                 sum(map(distinct_bytes, tensors_out))))
        return out


def eager_backward_kernels(rows, cols, dtype):
    """The kernels of the reference's eager backward, counted on meta tensors."""
    x = torch.empty(rows, cols, dtype=dtype, device="meta", requires_grad=True)
    weight = torch.empty(cols, dtype=dtype, device="meta", requires_grad=True)
    y = reference_rmsnorm(x, weight)
    dy = torch.empty_like(y)
    with KernelBytes() as counter:
        torch.autograd.grad(y, (x, weight), dy)
    return counter.kernels


MODEL_DTYPE = WORKING_DTYPE if ON_GPU else torch.bfloat16  # the GPU build's dtype
MODEL_ELEMENT = torch.finfo(MODEL_DTYPE).bits // 8
kernels = eager_backward_kernels(SWEEP_ROWS, 4096, MODEL_DTYPE)
per_element = SWEEP_ROWS * 4096
print(f"eager backward of the reference, {SWEEP_ROWS} x 4096 {MODEL_DTYPE}: {len(kernels)} kernels")
print(f"{'operation':<16} {'read B/elem':>11} {'written B/elem':>14}")
for name, read, written in kernels:
    print(f"{name:<16} {read / per_element:11.2f} {written / per_element:14.2f}")
EAGER_BYTES_PER_ELEMENT = sum(r + w for _, r, w in kernels) / per_element
print(f"{'total':<16} {EAGER_BYTES_PER_ELEMENT:26.2f}   (minimum {3 * MODEL_ELEMENT})")

# %%
# The upcast to float32 is what makes eager expensive: all but the first and
# last operations move 4-byte temporaries, and the two sums re-read
# products written just before. Across row lengths, at the GPU build's size:

eager_bytes = [sum(r + w for _, r, w in eager_backward_kernels(SWEEP_ROWS, cols, MODEL_DTYPE))
               for cols in SWEEP_COLS]
triton_bytes = [triton_backward_bytes(SWEEP_ROWS, cols, MODEL_ELEMENT) for cols in SWEEP_COLS]
minimum_bytes = [minimum_backward_bytes(SWEEP_ROWS, cols, MODEL_ELEMENT) for cols in SWEEP_COLS]
print(f"M = {SWEEP_ROWS}, {MODEL_DTYPE}, MB per backward")
print(f"{'N':>6} {'minimum':>9} {'Triton':>9} {'eager':>9} {'eager / Triton':>15}")
for cols, low, ours, eager in zip(SWEEP_COLS, minimum_bytes, triton_bytes, eager_bytes):
    print(f"{cols:>6} {low / 1e6:9.1f} {ours / 1e6:9.1f} {eager / 1e6:9.1f} {eager / ours:15.2f}")

fig, ax = plt.subplots(figsize=(6.4, 4.2))
ax.plot(SWEEP_COLS, [b / 1e6 for b in eager_bytes], "o-", label="eager PyTorch (counted per kernel)")
ax.plot(SWEEP_COLS, [b / 1e6 for b in triton_bytes], "s-", label="Triton, two stages")
ax.plot(SWEEP_COLS, [b / 1e6 for b in minimum_bytes], "k--", label="minimum: x, dy, dx once")
ax.set_xscale("log", base=2)
ax.set_yscale("log")
ax.set_xlabel("row length N")
ax.set_ylabel("bytes per backward (MB)")
ax.set_title(f"RMSNorm backward, M = {SWEEP_ROWS}, {str(MODEL_DTYPE).removeprefix('torch.')}\n"
             f"model, not measured (drawn on {DEVICE_NAME})")
ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.17), ncol=2, frameon=False)
fig.tight_layout()

# %%
# The compiled reference, checked
# -------------------------------
# ``torch.compile`` of the reference traces its forward, derives the backward
# graph with AOTAutograd, and fuses both with Inductor: into Triton kernels on
# a GPU, into C++ on a CPU. Before it is timed, its gradients go through the
# same check as ours, with one difference. Inductor's C++ for a CPU without
# vector instructions adds up a row in order, not in a tree, and a float32 sum
# of ``n`` terms added in order errs by about :math:`\sqrt{n}` steps; so the
# floor of this check is :math:`\sqrt{n}` times ours, for the longest sum.
# The compiler is probed first with a one-line function: a missing tool skips
# this part (and fails a site build, which requires it), while a failure on
# the reference itself fails the page.


def compile_problem(command, suffix, code):
    """Why ``command`` cannot compile a one-line file of ``code``, or None if it can."""
    with tempfile.TemporaryDirectory() as folder:
        source = os.path.join(folder, "probe" + suffix)
        with open(source, "w") as file:
            file.write(code)
        try:
            done = subprocess.run([*command, "-c", source, "-o", source + ".o"],
                                  capture_output=True, text=True, check=False)
        except OSError as error:  # on PATH but not runnable
            return f"{command[0]} cannot be run ({error})"
    if done.returncode != 0:
        return f"{command[0]} fails on a one-line {suffix} file (exit {done.returncode})"
    return None


def cxx_problem(compiler):
    """Why the C++ compiler Inductor calls cannot build here, or None."""
    if shutil.which(compiler) is None:
        return f"no C++ compiler {compiler!r} is on PATH"
    return compile_problem([compiler], ".cpp", "int probe() { return 0; }\n")


def inductor_problem():
    """(capability, reason) if torch.compile cannot work here, or None."""
    if not ON_GPU and (problem := cxx_problem(inductor_config.cpp.cxx[-1])) is not None:
        return "cxx", problem  # Inductor's compiler on a CPU: $CXX, else g++
    if ON_GPU and not HAVE_TRITON:
        return "triton", f"import triton failed: {TRITON_IMPORT_ERROR}"
    try:
        torch.compile(lambda t: 2 * t + 1)(torch.arange(5.0, device=DEVICE))
    except Exception as error:  # noqa: BLE001 (a one-line function failed: Inductor is broken)
        return "inductor", f"a one-line torch.compile failed, {type(error).__name__}"
    finally:
        torch.compiler.reset()
    return None


def compiled_reference():
    torch.compiler.reset()  # one compile per shape, never near the recompile limit
    return torch.compile(reference_rmsnorm, dynamic=False)


COMPILE_MISSING = inductor_problem()
COMPILE_WORKS = COMPILE_MISSING is None
if COMPILE_WORKS:
    rows, cols, _ = CHECK_CASES[0]
    in_order_steps = TOLERANCE_STEPS * math.ceil(math.sqrt(max(rows, cols)))  # see above
    # Empty caches: torch 2.13's Inductor cache does not key its C++ on ATEN_CPU_CAPABILITY,
    # and loads code vectorised for AVX-512 into an AVX2 run, which computes garbage.
    with fresh_cache():
        fractions = check_gradients(compiled_reference(), rows, cols, WORKING_DTYPE,
                                    steps=in_order_steps)
    print(f"torch.compile of the reference, {rows} x {cols}: y, dx, dw at "
          + ", ".join(f"{f:.2f}" for f in fractions) + " of the allowed error")
else:
    skip_or_fail("torch.compile of the reference", *COMPILE_MISSING)

# %%
# Measure: effective bandwidth against row length
# -----------------------------------------------
# On a GPU we time the backward alone, ``torch.autograd.grad`` of an output
# that was computed once, for the Triton kernels, eager PyTorch and
# ``torch.compile`` of the reference (which writes its own fused Triton
# kernels for forward and backward), with :func:`triton.testing.do_bench`.
# Every implementation is credited with the same minimum bytes, so the
# effective bandwidth compares times. The dotted lines are the predictions:
# copy bandwidth times minimum bytes over each model's bytes. Each timed
# gradient is first checked against float64 as above.
#
# On a CPU this section does not run: interpreted Triton time measures the
# interpreter, and the byte model above is what the page can show.


def copy_bandwidth_gbs(n_bytes):
    """GB/s of a large device-to-device copy, counting bytes read and written."""
    src = torch.empty(n_bytes // 4, device=DEVICE)
    dst = torch.empty_like(src)
    return 2 * n_bytes / triton.testing.do_bench(lambda: dst.copy_(src), return_mode="median") / 1e6


def backward_ms(rmsnorm, x, weight, dy, expected):
    """Check the gradients of ``rmsnorm``, then time its backward alone (ms)."""
    x = x.detach().requires_grad_()
    weight = weight.detach().requires_grad_()
    y = rmsnorm(x, weight)
    dx, dw = torch.autograd.grad(y, (x, weight), dy, retain_graph=True)
    assert_within_allowed(dx, expected[0], WORKING_DTYPE, f"dx of {tuple(x.shape)}")
    assert_within_allowed(dw, expected[1], WORKING_DTYPE, f"dw of {tuple(x.shape)}")
    return triton.testing.do_bench(lambda: torch.autograd.grad(y, (x, weight), dy, retain_graph=True),
                                   return_mode="median")


def bandwidth_sweep(implementations):
    """Effective GB/s of each implementation's backward, per row length."""
    table = {name: [] for name in implementations}
    for cols in SWEEP_COLS:
        x, weight, dy = random_case(SWEEP_ROWS, cols, WORKING_DTYPE)
        _, *expected = autograd_gradients(reference_rmsnorm, x.double(), weight.double(),
                                          dy.double())
        minimum = minimum_backward_bytes(SWEEP_ROWS, cols, MODEL_ELEMENT)
        for name, make in implementations.items():
            ms = backward_ms(make(), x, weight, dy, expected)
            table[name].append(minimum / ms / 1e6)
        del x, weight, dy, expected
    return table


bandwidth = {}
if ON_GPU and HAVE_TRITON:
    COPY_GBS = copy_bandwidth_gbs(1 << 30)
    implementations = {"Triton": triton_with, "eager PyTorch": lambda: reference_rmsnorm}
    if COMPILE_WORKS:
        implementations["torch.compile"] = compiled_reference
    # A compiled backward frees some saved tensors early (donated buffers), which
    # forbids the retain_graph=True that timing the backward alone needs.
    with torch._functorch.config.patch(donated_buffer=False):
        bandwidth = bandwidth_sweep(implementations)
    print(f"M = {SWEEP_ROWS}, {WORKING_DTYPE}: effective GB/s of the backward "
          f"(minimum bytes / time; copy {COPY_GBS:.0f})")
    print(f"{'N':>6} " + " ".join(f"{name:>14}" for name in bandwidth))
    for i, cols in enumerate(SWEEP_COLS):
        print(f"{cols:>6} " + " ".join(f"{gbs[i]:14.1f}" for gbs in bandwidth.values()))

    fig, ax = plt.subplots(figsize=(6.4, 4.4))
    for (name, gbs), color in zip(bandwidth.items(), ("C0", "C1", "C2")):
        ax.plot(SWEEP_COLS, gbs, "o-", color=color, label=name)
    ax.axhline(COPY_GBS, color="black", linestyle="--", label="copy bandwidth (measured)")
    for model, label, color in ((triton_bytes, "Triton, predicted", "C0"),
                                (eager_bytes, "eager, predicted", "C1")):
        ax.plot(SWEEP_COLS, [COPY_GBS * low / b for low, b in zip(minimum_bytes, model)],
                color=color, linestyle=":", label=label)
    ax.set_xscale("log", base=2)
    ax.set_ylim(bottom=0)
    ax.set_xlabel("row length N")
    ax.set_ylabel("effective bandwidth (GB/s), 3MN x s bytes")
    ax.set_title(f"RMSNorm backward, M = {SWEEP_ROWS}: {DEVICE_NAME}")
    ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.17), ncol=3, frameon=False)
    fig.tight_layout()
elif HAVE_TRITON:
    print("Timing needs a CUDA GPU: the interpreter's time says nothing about a kernel.")

# %%
# A tiny training run
# -------------------
# Last, the kernels in use. A pre-norm MLP block,
# :math:`x + W_2\,\mathrm{GELU}(W_1\,\mathrm{RMSNorm}(x))`, learns a fixed
# random target with plain SGD, once with the Triton RMSNorm and once with the
# reference, from the same initial weights. The weights are kept in float32,
# as mixed-precision training keeps them, and cast to the working dtype for
# the computation. Both runs must give the same loss at every step, within
# ``TOLERANCE_STEPS`` rounding steps of the working dtype, relative to the loss.
#
# This is not where ``dw`` is judged: a wrong gradient of one small parameter
# moves the loss little over a few steps, and in a 16-bit dtype rounding moves
# it too. The gradient checks above are the sharp test. This run checks what
# they cannot: the kernels inside a real training step, with the shapes and
# strides an ``nn.Module`` passes, gradients flowing on into the linear layers,
# and an optimizer updating from them.


class PreNormBlock(nn.Module):
    def __init__(self, width, rmsnorm):
        super().__init__()
        self.rmsnorm = rmsnorm
        self.norm_weight = nn.Parameter(torch.ones(width))
        self.up = nn.Linear(width, 4 * width)
        self.down = nn.Linear(4 * width, width)

    def forward(self, x):
        dtype = x.dtype  # float32 weights, computed in the working dtype
        h = self.rmsnorm(x, self.norm_weight.to(dtype))
        h = F.gelu(F.linear(h, self.up.weight.to(dtype), self.up.bias.to(dtype)))
        return x + F.linear(h, self.down.weight.to(dtype), self.down.bias.to(dtype))


TRAIN_LR = 0.5
generator = torch.Generator().manual_seed(1)
train_inputs = torch.randn(TRAIN_TOKENS, TRAIN_WIDTH, generator=generator).to(DEVICE, WORKING_DTYPE)
train_targets = torch.randn(TRAIN_TOKENS, TRAIN_WIDTH, generator=generator).to(DEVICE)


def training_losses(rmsnorm):
    """Loss at each SGD step of the block with this RMSNorm, from a fixed initialisation."""
    torch.manual_seed(2)
    block = PreNormBlock(TRAIN_WIDTH, rmsnorm).to(DEVICE)
    optimizer = torch.optim.SGD(block.parameters(), lr=TRAIN_LR)
    losses = []
    for _ in range(TRAIN_STEPS):
        loss = F.mse_loss(block(train_inputs).float(), train_targets)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    return losses


TRAIN_RTOL = TOLERANCE_STEPS * torch.finfo(WORKING_DTYPE).eps
reference_losses = training_losses(reference_rmsnorm)
runs = {"PyTorch reference": reference_losses}
if HAVE_TRITON:
    runs["Triton"] = training_losses(triton_rmsnorm)
    # TOLERANCE_STEPS steps of the working dtype on losses of order one (no atol needed):
    # the runs differ only by RMSNorm's rounding, which SGD carries forward
    torch.testing.assert_close(torch.tensor(runs["Triton"]), torch.tensor(reference_losses),
                               rtol=TRAIN_RTOL, atol=0)
if reference_losses[-1] >= reference_losses[0]:
    raise AssertionError(f"the loss did not fall: {reference_losses}")

print(f"{TRAIN_TOKENS} tokens x {TRAIN_WIDTH}, {WORKING_DTYPE}, SGD lr {TRAIN_LR}")
print(f"{'step':>4} " + " ".join(f"{name:>18}" for name in runs))
for step in range(TRAIN_STEPS):
    print(f"{step:>4} " + " ".join(f"{losses[step]:18.6f}" for losses in runs.values()))
if HAVE_TRITON:
    gap = max(abs(a - b) / b for a, b in zip(runs["Triton"], reference_losses))
    print(f"largest relative gap {gap:.1e} (limit {TRAIN_RTOL:.1e})")

fig, ax = plt.subplots(figsize=(6.4, 4))
for (name, losses), style in zip(runs.items(), ("o-", "x--")):
    ax.plot(range(TRAIN_STEPS), losses, style, label=name)
ax.set_xlabel("SGD step")
ax.set_ylabel("training loss (MSE)")
ax.set_title(f"Pre-norm MLP block, {str(WORKING_DTYPE).removeprefix('torch.')}: {DEVICE_NAME}")
ax.legend(frameon=False)
fig.tight_layout()

# %%
# Read the result
# ---------------
# **Gradients.** ``gradcheck`` in float64 settles whether the backward is the
# derivative of the forward; the comparison in the working dtype settles
# whether it is accurate enough: every element within one rounding step of
# the dtype at its own size, as a kernel that computes in float32 and rounds
# once must be, with a float32 floor near zero. The planted faults show the
# checks have teeth: both wrong ``dw`` err by far more than the limit (the
# lines printed there say by how much) and are rejected by both checks.
#
# **Bytes.** The fused backward moves close to the minimum, because each row
# of ``x`` and ``dy`` is read once and everything else stays in registers;
# the partial sums add the fraction ``8 G / (3 s M)``. Eager PyTorch moves
# many times more (the last column of the byte table), mostly float32
# temporaries, so on a GPU it should run near its predicted dotted line, and
# the Triton kernels near the copy line once rows are long enough to keep the
# memory system busy; short rows give each program little work per load and
# should fall short of it. ``torch.compile`` fuses the reference's graph into
# Triton kernels of its own; how close it comes to the hand-written backward
# is in the table of the measurement, on a GPU.
#
# **Determinism.** Two stages make ``dw`` the same bits on every run, at the
# cost of a small buffer. Atomics would save the buffer and the second
# launch, at the price of contention and of run-to-run differences.
#
# **Training.** The two loss curves lie on top of each other. In a 16-bit
# dtype they agree to about its precision rather than to the last bit: the
# two implementations sum in different orders, so a few values round the
# other way, and SGD carries the differences forward.

# sphinx_gallery_thumbnail_number = 1

# %%
# Key figures
# -----------
# The numbers this example exists to measure, collected for the course's GPU check.

KEY_FIGURES = {
    "device": DEVICE_NAME,
    "dtype": str(WORKING_DTYPE).removeprefix("torch."),
    "eager_backward_bytes_per_element_model": EAGER_BYTES_PER_ELEMENT,
    "eager_over_triton_bytes_N4096_model": eager_bytes[SWEEP_COLS.index(4096)]
    / triton_bytes[SWEEP_COLS.index(4096)],
    "training_final_loss": reference_losses[-1],
}
if bandwidth:
    at_4096 = {name: gbs[SWEEP_COLS.index(4096)] for name, gbs in bandwidth.items()}
    KEY_FIGURES["copy_GBps"] = COPY_GBS
    KEY_FIGURES["backward_triton_N4096_GBps"] = at_4096["Triton"]
    KEY_FIGURES["backward_triton_N4096_fraction_of_copy_bw"] = at_4096["Triton"] / COPY_GBS
    KEY_FIGURES["backward_triton_over_eager_N4096"] = at_4096["Triton"] / at_4096["eager PyTorch"]
    if "torch.compile" in at_4096:
        KEY_FIGURES["backward_triton_over_compile_N4096"] = (
            at_4096["Triton"] / at_4096["torch.compile"])

# The Triton calls of the CUDA branch, for the course's ahead-of-time compile check: it
# calls each host function on shape-only tensors, with DEVICE == "cuda", and compiles
# every launch for five GPU generations. (host function, [(shape, dtype)], keywords)


def forward_and_backward_launches(rows, cols, dtype, rows_per_program):
    rstd_dtype = torch.float64 if dtype == torch.float64 else torch.float32
    return [("rmsnorm_forward", [((rows, cols), dtype), ((cols,), dtype)], {}),
            ("rmsnorm_backward", [((rows, cols), dtype), ((rows, cols), dtype), ((cols,), dtype),
                                  ((rows,), rstd_dtype)], {"rows_per_program": rows_per_program})]


GPU_LAUNCHES = (
    forward_and_backward_launches(*GRADCHECK_CASE[:2], torch.float64, GRADCHECK_CASE[2])
    + [launch for rows, cols, rows_per_program in CHECK_CASES
       for launch in forward_and_backward_launches(rows, cols, WORKING_DTYPE, rows_per_program)]
    + [launch for cols in SWEEP_COLS
       for launch in forward_and_backward_launches(SWEEP_ROWS, cols, WORKING_DTYPE, None)]
    + forward_and_backward_launches(TRAIN_TOKENS, TRAIN_WIDTH, WORKING_DTYPE, None)
)
