"""
Kernels inside the compiler
===========================

A hand-written kernel and ``torch.compile`` need not be rivals: the compiler can
trace through a Triton kernel, fuse around it, replay a whole step as one CUDA
graph, and fill an attention template with your own score function. This example
puts a Triton kernel into a compiled function, compares ``triton_op`` with an
opaque ``custom_op``, measures CUDA graphs on a launch-bound step, checks a
FlexAttention variant against a reference, and shows the tools that find graph
breaks, recompiles and slow compiles, and that read what Dynamo made of a
function. Afterwards you can register a kernel so that the compiler sees it, and
diagnose a compiled model yourself.

**Requirements.** Full version: a CUDA GPU with Triton. On a CPU, Inductor writes
C++ (it needs a C++ compiler) and Triton runs in interpreter mode: the page checks
the custom operator, FlexAttention and the troubleshooting tools, and measures
compile times; it explains, without running them, the Triton kernel under
``torch.compile`` and the timings of CUDA graphs, which need a GPU. Inductor compiles
FlexAttention for a CPU only where the CPU has AVX2, ``ATEN_CPU_CAPABILITY`` is not
``default`` and the system is not macOS; elsewhere the page skips that check and says
why. On a T4
(compute capability 7.5, as on free Colab notebooks) FlexAttention's compiled
kernel does not run (pytorch/pytorch#164813), so the page checks it on the CPU
instead and times nothing for it; the rest runs as on any CUDA GPU.
"""

# %%
# Setup
# -----
# ``TRITON_INTERPRET=1`` must be set before Triton is imported. The caches of
# Inductor and Triton point at a new, empty folder, so that compile times below are
# cold compiles.

import importlib.util
import json
import logging
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time

import matplotlib.pyplot as plt
import torch
import torch.nn.functional as F
from torch.nn.attention.flex_attention import create_block_mask, flex_attention
from torch.utils.benchmark import Timer

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
ON_GPU = DEVICE == "cuda"
if not ON_GPU:
    os.environ.setdefault("TRITON_INTERPRET", "1")

try:
    import triton
    import triton.language as tl

    TRITON_IMPORT_ERROR = None
except ImportError as error:
    TRITON_IMPORT_ERROR = error
HAVE_TRITON = TRITON_IMPORT_ERROR is None

# Dynamo and Inductor import Triton (where it is installed), so they come after
# TRITON_INTERPRET.
import torch._dynamo as dynamo
import torch._inductor.config as inductor_config
from torch._dynamo.utils import counters
from torch._inductor.utils import clear_inductor_caches, run_and_get_code

CACHE_VARIABLES = ("TORCHINDUCTOR_CACHE_DIR", "TRITON_CACHE_DIR")
saved_cache_settings = {name: os.environ.get(name) for name in CACHE_VARIABLES}

DEVICE_NAME = torch.cuda.get_device_name() if ON_GPU else f"CPU ({os.cpu_count()} cores)"
VECTOR_SIZES = [1000, 4097, 1 << 20] if ON_GPU else [1000, 4097]
BLOCK = 1024
ALPHA = 2.5
TINY_LAYERS, TINY_WIDTH, TINY_BATCH = 48, 64, 8
FLEX_SHAPE = (4, 8, 2048, 64) if ON_GPU else (2, 3, 300, 40)
WINDOW = 256 if ON_GPU else 100
BLOCK_TILE = 128  # create_block_mask's default tile
REGIONAL_BLOCKS = [1, 2, 4, 8] if ON_GPU else [4]
REGIONAL_WIDTH = 256 if ON_GPU else 64
torch.manual_seed(0)
# float32 matmuls in float32 on a GPU too, not TF32 (cuBLAS and Inductor's FlexAttention
# template read this flag): the checks below compare float32 results with float64
torch.backends.cuda.matmul.allow_tf32 = False


def skip_or_fail(section, capability, reason):
    """Readers' runs skip a part whose tool is missing; the site's builds require it."""
    if capability in os.environ.get("COURSE_REQUIRE", "").split(","):
        raise RuntimeError(f"{section}: this build requires {capability}, but {reason}")
    print(f"Skipped {section}: {capability} is missing ({reason}).")


def cxx_problem(compiler):
    """Why ``compiler`` cannot build C++ here, or None once it compiles a one-line file."""
    if shutil.which(compiler) is None:
        return f"no C++ compiler {compiler!r} is on PATH"
    with tempfile.TemporaryDirectory() as folder:
        source = os.path.join(folder, "probe.cpp")
        with open(source, "w") as file:
            file.write("int probe() { return 0; }\n")
        try:
            done = subprocess.run([compiler, "-c", source, "-o", source + ".o"],
                                  capture_output=True, text=True, check=False)
        except OSError as error:  # on PATH but not runnable
            return f"{compiler} cannot be run ({error})"
    if done.returncode != 0:
        return f"{compiler} fails on a one-line .cpp file (exit {done.returncode})"
    return None


def inductor_problem():
    """(capability, reason) if torch.compile cannot work here, or None (a one-line compile)."""
    if not ON_GPU and (problem := cxx_problem(inductor_config.cpp.cxx[-1])) is not None:
        return "cxx", problem
    if ON_GPU and importlib.util.find_spec("triton") is None:
        return "triton", "Triton is not installed"
    one_line = f"import torch; torch.compile(lambda t: 2 * t + 1)(torch.ones(5, device={DEVICE!r}))"
    done = subprocess.run([sys.executable, "-c", one_line], capture_output=True, text=True,
                          check=False)
    if done.returncode != 0:
        last_line = (done.stderr.strip().splitlines() or [f"exit {done.returncode}"])[-1]
        return "inductor", f"a one-line torch.compile failed: {last_line[:160]}"
    return None


INDUCTOR_MISSING = inductor_problem()
COMPILE_WORKS = INDUCTOR_MISSING is None


def cold_caches():
    """Point Inductor's and Triton's caches at a new, empty folder; return it."""
    folder = tempfile.mkdtemp(prefix="inductor-cold-")
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = folder
    os.environ["TRITON_CACHE_DIR"] = os.path.join(folder, "triton")
    clear_inductor_caches()
    dynamo.reset()
    return folder


COLD_FOLDERS = [cold_caches()]
print(f"device: {DEVICE_NAME}   torch {torch.__version__}"
      f"   triton {triton.__version__ if HAVE_TRITON else 'missing'}")
if not ON_GPU:
    print("CPU: Triton is interpreted and Inductor writes C++; CUDA graphs and the Triton "
          "kernel under torch.compile are explained, not run.")

# %%
# 1. A Triton kernel inside a compiled function
# ---------------------------------------------
# **Predict.** The kernel body is not Python that runs on tensors, so Dynamo does not
# trace into it. It recognises a ``@triton.jit`` launch, though, and records it in the
# graph as a call of the kernel, so on a GPU even a raw launch compiles without a graph
# break. Only ``torch.compile`` knows such a launch; autograd, tensor subclasses and
# dispatcher-level tracing (``make_fx``) do not. Two ways make the kernel an operator
# with a known output, like PyTorch's own, and the function still compiles as one graph:
#
# * ``torch.library.custom_op`` makes an **opaque** operator. We give it a *fake*
#   implementation (the shape and dtype of the output); Inductor calls it as an
#   external function and cannot fuse anything into it.
# * ``torch.library.triton_op`` makes an operator whose body, launched through
#   ``torch.library.wrap_triton``, Inductor **can see**: it traces the body, finds the
#   Triton kernel, and puts its source into the code it generates, beside its own
#   kernels, so it can schedule it and reason about which buffers it writes.
#
# The kernel is ``out = alpha * x + y``, one program per ``BLOCK`` elements.

if HAVE_TRITON:

    @triton.jit
    def scaled_add_kernel(x_ptr, y_ptr, out_ptr, n, alpha, BLOCK: tl.constexpr):
        offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        inside = offsets < n
        x = tl.load(x_ptr + offsets, mask=inside)
        y = tl.load(y_ptr + offsets, mask=inside)
        tl.store(out_ptr + offsets, alpha * x + y, mask=inside)

    def scaled_add(x, y, alpha=ALPHA, launcher=None):
        """alpha * x + y by the Triton kernel; ``launcher`` wraps it (wrap_triton) or not."""
        out = torch.empty_like(x)
        n = x.numel()
        kernel = scaled_add_kernel if launcher is None else launcher(scaled_add_kernel)
        kernel[(triton.cdiv(n, BLOCK),)](x, y, out, n, alpha, BLOCK=BLOCK)
        return out

    @torch.library.triton_op("course::scaled_add_visible", mutates_args=())
    def scaled_add_visible(x: torch.Tensor, y: torch.Tensor, alpha: float) -> torch.Tensor:
        return scaled_add(x, y, alpha, launcher=torch.library.wrap_triton)

    @torch.library.custom_op("course::scaled_add_opaque", mutates_args=())
    def scaled_add_opaque(x: torch.Tensor, y: torch.Tensor, alpha: float) -> torch.Tensor:
        return scaled_add(x, y, alpha)

    @scaled_add_opaque.register_fake
    def _(x, y, alpha):
        return torch.empty_like(x)

    def save_alpha(ctx, inputs, output):
        ctx.alpha = inputs[2]

    def scaled_add_backward(ctx, grad):
        return ctx.alpha * grad, grad, None  # d/dx = alpha, d/dy = 1; alpha is a float

    scaled_add_opaque.register_autograd(scaled_add_backward, setup_context=save_alpha)

    def step_visible(x, y):
        return torch.relu(scaled_add_visible(x, y, ALPHA)) * 3 + 1

    def step_opaque(x, y):
        return torch.relu(scaled_add_opaque(x, y, ALPHA)) * 3 + 1


def step_reference(x, y):
    return torch.relu(ALPHA * x.double() + y.double()) * 3 + 1


def check_against_float64(out, x, y):
    # float32, any device: four roundings at most (alpha * x + y two, or one as an FMA;
    # * 3 and + 1), 2.4e-7 relative; where alpha * x and y cancel, 3 * eps/2 * |alpha x|,
    # about 2e-6 for |x| < 5
    torch.testing.assert_close(out.double(), step_reference(x, y), rtol=1e-6, atol=1e-5)


def check_gradients_against_float64(n):
    """The backward registered for the opaque operator against the exact gradient in float64."""
    x, y = (torch.randn(n, device=DEVICE, requires_grad=True) for _ in range(2))
    weights = torch.randn(n, device=DEVICE)
    grad_x, grad_y = torch.autograd.grad((scaled_add_opaque(x, y, ALPHA) * weights).sum(), (x, y))
    # d/dx of sum(w * (alpha x + y)) is alpha * w, one float32 rounding (eps/2 = 6e-8
    # relative) on any device; d/dy is w, exactly
    torch.testing.assert_close(grad_x.double(), ALPHA * weights.double(), rtol=2.4e-7, atol=0)
    torch.testing.assert_close(grad_y.double(), weights.double(), rtol=0, atol=0)


# %%
# **Verify, eagerly.** Both operators run the same kernel (interpreted on a CPU) on
# irregular lengths, against float64. The opaque operator also has a backward,
# registered with ``register_autograd`` (``alpha`` times the output's gradient for
# ``x``, the gradient itself for ``y``), and its gradients are checked against the
# exact ones in float64. ``torch.library.opcheck`` then tests the opaque operator's
# registration: that the fake implementation agrees with the real one in shape, dtype
# and strides, that the schema's claims about mutation hold, that autograd is
# registered, and that it survives tracing, gradients included. Its inputs require
# grad: with none that does, opcheck skips the autograd test and the gradient
# comparison, and still reports SUCCESS. It raises if any check fails. Older PyTorch
# releases' ``wrap_triton`` refuse the interpreter's kernels (pytorch/pytorch#152868,
# fixed by #185597), so on a CPU with one of them only the opaque operator runs; a
# probe asks.


def wrap_triton_problem():
    """Why ``torch.library.wrap_triton`` refuses this Triton kernel here, or None."""
    try:
        torch.library.wrap_triton(scaled_add_kernel)
    except RuntimeError as error:
        return str(error)
    return None


if HAVE_TRITON:
    WRAP_TRITON_REFUSES = wrap_triton_problem()
    steps = [step_opaque] if WRAP_TRITON_REFUSES else [step_opaque, step_visible]
    for n in VECTOR_SIZES:
        x, y = torch.randn(n, device=DEVICE), torch.randn(n, device=DEVICE)
        for step in steps:
            check_against_float64(step(x, y), x, y)
        check_gradients_against_float64(n)
    print(f"eager: {' and '.join(step.__name__ for step in steps)} match float64 "
          f"for lengths {VECTOR_SIZES}")
    print(f"autograd: the backward of course::scaled_add_opaque matches float64 "
          f"for lengths {VECTOR_SIZES}")
    if WRAP_TRITON_REFUSES:
        print(f"eager: step_visible not run: torch {torch.__version__}'s wrap_triton refuses "
              f"an interpreted kernel ({WRAP_TRITON_REFUSES})")
    # inputs that require grad: without one, opcheck skips its autograd test and still
    # reports SUCCESS
    opcheck_x, opcheck_y = (torch.randn(777, device=DEVICE, requires_grad=True) for _ in range(2))
    opcheck_results = torch.library.opcheck(scaled_add_opaque, (opcheck_x, opcheck_y, ALPHA))
    failed = [name for name, result in opcheck_results.items() if result != "SUCCESS"]
    if failed:
        raise AssertionError(f"opcheck failed for course::scaled_add_opaque: {failed}")
    print(f"opcheck(course::scaled_add_opaque): {', '.join(opcheck_results)}: all SUCCESS")
else:
    skip_or_fail("the Triton operators", "triton", f"import triton failed: {TRITON_IMPORT_ERROR}")

# %%
# **Compile.** ``torch._dynamo.explain`` counts graphs and graph breaks;
# ``fullgraph=True`` makes any graph break an error. ``run_and_get_code`` hands back
# what Inductor wrote, where we look for the kernel's name. The opaque operator
# compiles on any device, so a CPU shows its extern call; the visible one needs a GPU.
# Under ``TRITON_INTERPRET=1`` a ``@triton.jit`` function is an interpreter object
# that ``wrap_triton`` passes through unwrapped, so tracing it with fake tensors would
# ask a fake tensor for its data. Triton's interpreter is for running kernels, not for
# compiling them.


def compile_and_read(step, x, y):
    """Graph breaks, output and generated code of ``step`` compiled with fullgraph=True."""
    explanation = dynamo.explain(step)(x, y)
    if explanation.graph_break_count != 0 or explanation.graph_count != 1:
        raise AssertionError(f"{step.__name__}: {explanation.graph_count} graphs, "
                             f"{explanation.graph_break_count} graph breaks; expected 1 and 0")
    dynamo.reset()
    out, sources = run_and_get_code(torch.compile(step, fullgraph=True), x, y)
    check_against_float64(out, x, y)
    return explanation, "\n".join(sources)


def check_opaque_call(code):
    if "torch.ops.course.scaled_add_opaque.default" not in code:
        raise AssertionError("Inductor's code does not call the opaque operator")
    if "def scaled_add_kernel" in code:
        raise AssertionError("Inductor's code contains the kernel of the opaque operator")


def check_kernel_inlined(code):
    if "def scaled_add_kernel" not in code or "torch.ops.course.scaled_add_visible" in code:
        raise AssertionError("Inductor's code does not contain the Triton kernel of triton_op")


if HAVE_TRITON and COMPILE_WORKS:
    x, y = torch.randn(4097, device=DEVICE), torch.randn(4097, device=DEVICE)
    explanation, opaque_code = compile_and_read(step_opaque, x, y)
    check_opaque_call(opaque_code)
    print(f"custom_op in torch.compile: {explanation.graph_count} graph, "
          f"{explanation.graph_break_count} graph breaks; matches float64")
    print("  Inductor's code calls it as an extern: "
          + next(line.strip() for line in opaque_code.splitlines()
                 if "torch.ops.course.scaled_add_opaque.default" in line))
    if ON_GPU:
        explanation, visible_code = compile_and_read(step_visible, x, y)
        check_kernel_inlined(visible_code)
        print(f"triton_op in torch.compile: {explanation.graph_count} graph, "
              f"{explanation.graph_break_count} graph breaks; matches float64")
        print("  Inductor's code defines the Triton kernel itself: "
              + next(line.strip() for line in visible_code.splitlines()
                     if "def scaled_add_kernel" in line))
    else:
        print("triton_op in torch.compile: not run here (Triton interpreted: no traceable "
              "kernel); a GPU run asserts 0 graph breaks and finds the kernel in Inductor's code")
elif HAVE_TRITON:
    skip_or_fail("the Triton operators under torch.compile", *INDUCTOR_MISSING)

# %%
# 2. CUDA graphs: ``mode="reduce-overhead"``
# ------------------------------------------
# **Predict.** A step of many tiny operations is bound by launches: every kernel costs
# a few microseconds of CPU work to launch, whatever it computes. Here a stack of
# ``TINY_LAYERS`` small linear layers with a GeLU each: Inductor fuses the elementwise
# work, but each matmul stays a library call, so the compiled step still launches
# about two kernels per layer. A CUDA graph records the launches once and replays the
# whole sequence with one call, so ``reduce-overhead`` should beat the default mode by
# roughly the launch cost times the number of kernels.
#
# **Caveats.** A graph replays fixed addresses and sizes: inputs are copied into static
# buffers, a new input shape records a new graph (and with static shapes compiles
# anew), and an output lives in a buffer that the next replay overwrites, so clone it
# if you keep it across calls (``torch.compiler.cudagraph_mark_step_begin()`` marks
# where a new iteration starts). Below, the mode's options; then, on a GPU, the
# timings and the price of a new shape. Inductor counts the graphs it declined to
# build in ``counters["inductor"]["cudagraph_skips"]``: on a GPU it must stay 0, and
# on a CPU, which has no CUDA graphs, the mode quietly compiles as the default does.
#
# **Timing.** The steps are timed with ``torch.utils.benchmark.Timer``'s
# ``blocked_autorange``, the median over blocks of calls with the GPU synchronised at
# both ends of each block, not with ``triton.testing.do_bench``: before each call
# ``do_bench`` zeroes a 256 MiB buffer to flush L2, and while the GPU runs that memset
# the CPU queues the step's launches, which hides part of the launch overhead this
# section measures; it also returns the mean.


def check_reduce_overhead_options(options):
    if not options.get("triton.cudagraphs"):
        raise AssertionError("mode reduce-overhead does not switch on triton.cudagraphs")


def check_cudagraph_skips(skips, on_gpu):
    if on_gpu and skips != 0:
        raise AssertionError(f"Inductor skipped CUDA graphs {skips} times on a GPU")
    if not on_gpu and skips == 0:
        raise AssertionError("on a CPU, Inductor did not report skipping CUDA graphs")


reduce_overhead_options = torch._inductor.list_mode_options("reduce-overhead")
print(f'torch._inductor.list_mode_options("reduce-overhead") = {reduce_overhead_options}')
check_reduce_overhead_options(reduce_overhead_options)


class TinyStack(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.layers = torch.nn.ModuleList(torch.nn.Linear(TINY_WIDTH, TINY_WIDTH)
                                          for _ in range(TINY_LAYERS))

    def forward(self, x):
        for layer in self.layers:
            x = F.gelu(layer(x)) + x
        return x


def synchronized_ms(fn, x):
    """Wall time of one call, the GPU's work included."""
    torch.cuda.synchronize()
    start = time.perf_counter()
    fn(x)
    torch.cuda.synchronize()
    return (time.perf_counter() - start) * 1e3


def time_tiny_stack():
    """Median ms per step of eager, default and reduce-overhead, each checked in float64;
    and the first call of the CUDA-graph step at a new batch size."""
    stack = TinyStack().to(DEVICE).requires_grad_(False)
    x = torch.randn(TINY_BATCH, TINY_WIDTH, device=DEVICE)
    reference = TinyStack().to(DEVICE).double().requires_grad_(False)
    reference.load_state_dict(stack.state_dict())
    expected = reference(x.double()).float()
    modes = {"eager": stack, "default": torch.compile(stack),
             "reduce-overhead": torch.compile(stack, mode="reduce-overhead")}
    times = {}
    for name, fn in modes.items():
        for _ in range(3):  # compile and warm up, record, replay
            out = fn(x).clone()  # a replay overwrites its output: keep a copy
        # 48 float32 layers of 64-term sums, sqrt(64) eps ~ 1e-6 each, grown over the
        # residual stream to some 1e-5 at most; TF32 is off (above)
        torch.testing.assert_close(out, expected, rtol=1e-4, atol=1e-4)
        timer = Timer(stmt="fn(x)", globals={"fn": fn, "x": x})
        times[name] = timer.blocked_autorange(min_run_time=0.5).median * 1e3  # not do_bench (above)
    new_shape = torch.randn(TINY_BATCH + 1, TINY_WIDTH, device=DEVICE)
    new_shape_ms = synchronized_ms(modes["reduce-overhead"], new_shape)
    return times, new_shape_ms


def count_cudagraph_skips(step, x):
    """How often Inductor declined CUDA graphs while compiling ``step`` in reduce-overhead."""
    dynamo.reset()
    counters["inductor"]["cudagraph_skips"] = 0
    torch.compile(step, mode="reduce-overhead")(x)
    return counters["inductor"]["cudagraph_skips"]


def small_step(x):
    return torch.sin(x) * 2 + 1


if COMPILE_WORKS:
    cudagraph_skips = count_cudagraph_skips(small_step, torch.randn(37, device=DEVICE))
    check_cudagraph_skips(cudagraph_skips, ON_GPU)
    print(f'mode="reduce-overhead" on {DEVICE}: Inductor skipped CUDA graphs '
          f"{cudagraph_skips} time(s)")
if ON_GPU and COMPILE_WORKS:
    tiny_times, new_shape_ms = time_tiny_stack()
    for name, ms in tiny_times.items():
        print(f"{TINY_LAYERS} tiny layers, {name:<16}: {ms * 1e3:8.1f} us per step")
    print(f"reduce-overhead, first call at batch {TINY_BATCH + 1} (a new shape: compile "
          f"again and warm up; it is recorded at the next call): {new_shape_ms:.0f} ms")
    if tiny_times["reduce-overhead"] >= tiny_times["default"]:
        raise AssertionError("reduce-overhead is not faster than default on a launch-bound step")
    if new_shape_ms < 10 * tiny_times["reduce-overhead"]:
        raise AssertionError("a new shape cost less than ten replays: was anything recompiled?")
elif ON_GPU:
    skip_or_fail("CUDA graphs", *INDUCTOR_MISSING)
elif COMPILE_WORKS:
    print("CUDA graphs need CUDA: on this CPU, reduce-overhead compiles as the default mode "
          "does, and the timings of eager, default and reduce-overhead are not measured.")
else:
    skip_or_fail("CUDA graphs", *INDUCTOR_MISSING)

# %%
# 3. FlexAttention: ALiBi in a sliding window
# -------------------------------------------
# ALiBi (attention with linear biases) adds ``-slope_h * (i - j)`` to the score of query
# ``i`` and key ``j`` in head ``h``, with one slope per head. In FlexAttention that is a
# ``score_mod``, a scalar function of the score and the indices. Which pairs take part
# at all is a ``mask_mod``: here causal within a window of ``WINDOW`` keys.
# ``create_block_mask`` turns it into a *block mask*, which lists for each tile of
# queries the tiles of keys that hold any allowed pair, so the kernel skips the empty
# tiles instead of computing scores and discarding them. Under ``torch.compile``
# Inductor inlines both functions into its attention template (Triton on a GPU, C++
# on a CPU), so the bias matrix is never materialised. The reference is SDPA with the
# same bias and mask as an explicit float64 matrix.


def alibi_slopes(heads, device):
    return torch.tensor([2.0 ** (-8.0 * (h + 1) / heads) for h in range(heads)], device=device)


def alibi_score(slopes):
    def score_mod(score, batch, head, query_index, key_index):
        return score - slopes[head] * (query_index - key_index)
    return score_mod


def causal_window(batch, head, query_index, key_index):
    distance = query_index - key_index
    return (distance >= 0) & (distance < WINDOW)


def alibi_window_bias(seq, slopes):
    """The same scores as a dense additive mask: the bias, and -inf outside the window."""
    positions = torch.arange(seq, device=slopes.device)
    distance = positions[:, None] - positions
    bias = -slopes[:, None, None] * distance
    return bias.masked_fill((distance < 0) | (distance >= WINDOW), -float("inf"))


def check_attention(out, reference):
    """Within float32's rounding of the largest output; raises otherwise."""
    scale = reference.abs().max().item()
    # float32 scores (head_dim-term dot products, sqrt(64) eps) through an online softmax
    # and a sum over at most WINDOW values: some tens of eps of the largest output, under
    # 1e-5 * scale = 84 eps of it; TF32 is off on a GPU (above)
    torch.testing.assert_close(out.double(), reference, rtol=1e-4, atol=1e-5 * scale)
    return (out.double() - reference).abs().max().item(), scale


def flex_device():
    """Where FlexAttention runs: its compiled kernel needs compute capability 8.0 on a GPU."""
    if not ON_GPU or torch.cuda.get_device_capability() >= (8, 0):
        return DEVICE
    skip_or_fail("FlexAttention on this GPU", "sm80",
                 "compute capability {}.{}: FlexAttention's kernel needs 8.0 "
                 "(pytorch/pytorch#164813); checked on the CPU instead".format(
                     *torch.cuda.get_device_capability()))
    return "cpu"


def cpu_flex_attention_problem():
    """Why Inductor will not compile FlexAttention on this CPU, or None: the same test as
    Inductor's own (check_cpu_supported in torch/_inductor/kernel/flex/flex_cpu.py)."""
    if sys.platform == "darwin":
        return "Inductor's CPU FlexAttention does not support macOS"
    if torch.xpu.is_available():
        return "Inductor's CPU FlexAttention is off where an Intel GPU (XPU) is present"
    if not torch.cpu._is_avx2_supported():
        return "Inductor's CPU FlexAttention needs a CPU with AVX2, and this one has none"
    if os.environ.get("ATEN_CPU_CAPABILITY") == "default":
        return "Inductor's CPU FlexAttention is off under ATEN_CPU_CAPABILITY=default"
    return None


def check_flex_alibi(device):
    _, heads, seq, _ = FLEX_SHAPE
    q, k, v = (torch.randn(FLEX_SHAPE, device=device) for _ in range(3))
    slopes = alibi_slopes(heads, device)
    score_mod = alibi_score(slopes)
    block_mask = create_block_mask(causal_window, None, None, seq, seq, device=device,
                                   BLOCK_SIZE=BLOCK_TILE)
    compiled_flex = torch.compile(flex_attention)
    out = compiled_flex(q, k, v, score_mod=score_mod, block_mask=block_mask)
    bias = alibi_window_bias(seq, slopes.double())
    reference = F.scaled_dot_product_attention(q.double(), k.double(), v.double(), attn_mask=bias)
    error, scale = check_attention(out, reference)
    tiles = block_mask.to_dense()[0, 0]
    timings = None
    if device == "cuda":
        bias_float = bias.float()
        timings = {
            "flex (compiled)": triton.testing.do_bench(
                lambda: compiled_flex(q, k, v, score_mod=score_mod, block_mask=block_mask)),
            "SDPA + bias tensor": triton.testing.do_bench(
                lambda: F.scaled_dot_product_attention(q, k, v, attn_mask=bias_float)),
            "SDPA causal, no bias": triton.testing.do_bench(
                lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True))}
    return error, scale, (int(tiles.sum()), tiles.numel()), timings


FLEX_DEVICE = flex_device() if COMPILE_WORKS else None
FLEX_MISSING = cpu_flex_attention_problem() if FLEX_DEVICE == "cpu" else None
FLEX_CHECKED = FLEX_DEVICE is not None and FLEX_MISSING is None
if FLEX_MISSING is not None:
    skip_or_fail("FlexAttention", "flex-cpu", FLEX_MISSING)
elif COMPILE_WORKS:
    flex_error, flex_scale, (tiles_visited, tiles_total), flex_timings = check_flex_alibi(
        FLEX_DEVICE)
    print(f"FlexAttention, ALiBi in a causal window of {WINDOW}, shape {FLEX_SHAPE}, compiled: "
          f"max |error| vs float64 SDPA {flex_error:.2e} (outputs up to {flex_scale:.2f})")
    print(f"  block mask: the kernel visits {tiles_visited} of {tiles_total} tiles "
          f"of {BLOCK_TILE} x {BLOCK_TILE} (query, key) pairs")
    for name, ms in (flex_timings or {}).items():
        print(f"  {name:<22}: {ms:.3f} ms")
else:
    skip_or_fail("FlexAttention", *INDUCTOR_MISSING)

# %%
# 4. Troubleshooting tools, shown working
# ---------------------------------------
# **Logs.** ``TORCH_LOGS="graph_breaks,recompiles"`` in the environment, or
# ``torch._logging.set_logs(graph_breaks=True, recompiles=True)`` from Python, makes
# Dynamo log each graph break with its reason and each recompile with the guard that
# failed. The function below breaks its graph at ``.item()`` and branches on a Python
# string, so each new ``activation`` fails a guard (a string cannot become dynamic, as an
# integer would); with ``recompile_limit`` lowered to 2,
# the third value hits the limit and Dynamo warns and runs that frame eagerly. We catch
# the log records with a handler. The backend is ``"eager"``: Dynamo only, no code
# generation, since logs are about tracing.


class Records(logging.Handler):
    def __init__(self):
        super().__init__(level=logging.DEBUG)
        self.records = []  # (level, message)

    def emit(self, record):
        self.records.append((record.levelno, record.getMessage()))


EXAMPLE_FILE = os.path.basename(sys._getframe().f_code.co_filename)  # this file, as run
PATH_TO_EXAMPLE = re.compile(r"[^\s'\"(]*[/\\]" + re.escape(EXAMPLE_FILE))


def with_file_name(text):
    """``text`` with every path to this example cut to the file's name: the folders are
    the machine's, not the reader's."""
    return PATH_TO_EXAMPLE.sub(EXAMPLE_FILE, text)


def breaks_and_recompiles(x, activation):
    total = x.sum().item()  # a graph break: a Python float from a tensor
    return getattr(torch, activation)(x) + total  # a guard on the string's value


def log_breaks_and_recompiles():
    dynamo.reset()
    handler = Records()
    torch._logging.set_logs(graph_breaks=True, recompiles=True)
    loggers = [logging.getLogger(name) for name in list(logging.Logger.manager.loggerDict)
               if name.endswith(("__graph_breaks", "__recompiles")) or name == "torch._dynamo"]
    dynamo_handlers = {logger: logger.handlers for logger in loggers}
    for logger in loggers:
        logger.handlers = [handler]  # Dynamo's warnings too: printed below, not to stderr
        logger.propagate = False
    saved_limit = dynamo.config.recompile_limit
    dynamo.config.recompile_limit = 2
    try:
        compiled = torch.compile(breaks_and_recompiles, backend="eager")
        x = torch.randn(16)
        for activation in ("sin", "cos", "tanh"):
            # backend "eager" runs the same operations: float32's default tolerance
            torch.testing.assert_close(compiled(x, activation), breaks_and_recompiles(x, activation))
    finally:
        dynamo.config.recompile_limit = saved_limit
        for logger, handlers in dynamo_handlers.items():
            logger.handlers = handlers
            logger.propagate = True
        torch._logging.set_logs()
    return handler.records


def first_line_with(messages, text):
    for message in messages:
        for line in message.splitlines():
            if text in line:
                return line.strip()[:150]
    raise AssertionError(f"no log record mentions {text!r}")


log_records = log_breaks_and_recompiles()
log_messages = [with_file_name(message) for _, message in log_records]
print(f"log records caught: {len(log_messages)}")
print("  graph break : " + first_line_with(log_messages, "Graph Break Reason"))
print("  recompile   : " + first_line_with(log_messages, "Recompiling function"))
print("  limit       : " + first_line_with(log_messages, "recompile_limit"))
print("Dynamo's warnings among them, as it words them:")
for (level, _), message in zip(log_records, log_messages):
    if level >= logging.WARNING:
        for line in message.splitlines():
            print(f"  | {line.rstrip()}")

# %%
# **torch.compiler.disable.** A function marked with it is never traced: Dynamo splits
# the graph around the call and runs the function eagerly. That is the tool for code
# Dynamo handles badly (logging, a C extension, a debugging hook), and it has a price:
# one more graph, and no fusion across the call. We assert the graph count.


@torch.compiler.disable
def log_norm(t):
    return t / t.norm()


def with_disabled_call(x):
    h = torch.sin(x) + 1
    h = log_norm(h)
    return torch.cos(h) * 2


dynamo.reset()
disabled_explanation = dynamo.explain(with_disabled_call)(torch.randn(33))
print(f"torch.compiler.disable in the middle: {disabled_explanation.graph_count} graphs, "
      f"{disabled_explanation.graph_break_count} graph break")
if disabled_explanation.graph_count != 2:
    raise AssertionError(f"expected 2 graphs around the disabled call, "
                         f"got {disabled_explanation.graph_count}")

# %%
# **Regional compilation.** A Transformer is one block repeated N times. Compiling the
# whole model traces, lowers and compiles all N copies; compiling the block class once
# (``block.compile()`` on each block) compiles the code once, and Dynamo reuses it for
# every instance, since it treats the parameters as inputs. Predict: the whole-model
# compile grows with N, the regional one stays near one block's. Each measurement
# starts from empty caches and a reset Dynamo, and includes the first call.


class Block(torch.nn.Module):
    def __init__(self, width):
        super().__init__()
        self.norm = torch.nn.LayerNorm(width)
        self.up = torch.nn.Linear(width, 4 * width)
        self.down = torch.nn.Linear(4 * width, width)

    def forward(self, x):
        return x + self.down(F.gelu(self.up(self.norm(x))))


def make_model(blocks):
    return torch.nn.Sequential(*[Block(REGIONAL_WIDTH) for _ in range(blocks)]).to(DEVICE)


def cold_compile_seconds(blocks, regional):
    COLD_FOLDERS.append(cold_caches())
    model = make_model(blocks).requires_grad_(False)
    x = torch.randn(4, 37, REGIONAL_WIDTH, device=DEVICE)
    expected = model(x)
    if regional:
        for block in model:
            block.compile()
        compiled = model
    else:
        compiled = torch.compile(model)
    start, cpu_start = time.perf_counter(), cpu_seconds()
    out = compiled(x)
    if ON_GPU:
        torch.cuda.synchronize()
    seconds = time.perf_counter() - start
    # compiled and eager float32 sum in different orders: sqrt(4 * width) eps of order-one
    # terms (2e-6 at width 256, over 8 blocks on a GPU), far under 1e-4
    torch.testing.assert_close(out, expected, rtol=1e-4, atol=1e-4)
    return seconds, (cpu_seconds() - cpu_start) / seconds


def cpu_seconds():
    """CPU time of this process and of the compiler processes it waited for."""
    times = os.times()
    return times.user + times.system + times.children_user + times.children_system


compile_seconds = {}
if COMPILE_WORKS:
    print(f"{'blocks':>6} {'whole model s':>14} {'regional s':>11}")
    busy_share = []  # how much of each compile's wall time it spent on a core
    for blocks in REGIONAL_BLOCKS:
        (whole, whole_share), (regional, regional_share) = (cold_compile_seconds(blocks, regional=False),
                                                            cold_compile_seconds(blocks, regional=True))
        compile_seconds[blocks] = whole, regional
        busy_share += [whole_share, regional_share]
        print(f"{blocks:6d} {whole:14.2f} {regional:11.2f}")
    if ON_GPU or min(busy_share) >= 0.8:
        for blocks, (whole, regional) in compile_seconds.items():
            if blocks >= 4 and regional >= whole:
                raise AssertionError(f"{blocks} blocks: regional compile ({regional:.2f} s) is not "
                                     f"faster than the whole model ({whole:.2f} s)")
    else:
        print(f"Other processes took this machine's cores (a compile got {min(busy_share):.0%} of a core):"
              " the compile times are printed, not compared.")
else:
    skip_or_fail("regional compilation", *INDUCTOR_MISSING)

# %%
# The figure: cold compile time against the number of blocks, for both ways.

if compile_seconds:
    fig, ax = plt.subplots(figsize=(7, 3.8))
    counts = list(compile_seconds)
    positions = range(len(counts))
    ax.bar([p - 0.2 for p in positions], [compile_seconds[n][0] for n in counts], width=0.4,
           label="whole model")
    ax.bar([p + 0.2 for p in positions], [compile_seconds[n][1] for n in counts], width=0.4,
           label="regional (one block)")
    ax.set_xticks(list(positions), [str(n) for n in counts])
    ax.set_xlabel("number of repeated blocks")
    ax.set_ylabel("first call, cold caches (s)")
    ax.set_title(f"Compile time: whole model vs regional\n{DEVICE_NAME}")
    ax.legend(loc="upper left", bbox_to_anchor=(1.02, 1))
    fig.tight_layout()

# %%
# **What Dynamo made of the function: TORCH_TRACE.** With the environment variable
# ``TORCH_TRACE=<folder>``, every compile writes a structured log into that folder:
# one JSON line per event, followed by its payload (an FX graph, the guards, the
# graph-break reason, the compile's metrics). ``tlparse <folder>`` (on PyPI) turns it
# into web pages; ``depyf`` (also on PyPI) instead decompiles the rewritten bytecode
# into Python. Here a child process runs the short program below with ``TORCH_TRACE``
# set, and a few lines of JSON parsing read back what Dynamo recorded: each graph it
# compiled, in which function (the part after the graph break is a *resume*
# function that Dynamo generated), its operations and its number of guards, and
# why it recompiled.

TRACED_PROGRAM = '''
import torch

def breaks_once(x, activation):
    total = x.sum().item()
    return getattr(torch, activation)(x) + total

compiled = torch.compile(breaks_once, backend="eager")
x = torch.randn(16)
for activation in ("sin", "cos"):
    compiled(x, activation)
'''


def read_torch_trace(folder):
    """[(event, payload)] of every trace file in ``folder``, in order."""
    entries = []
    for name in sorted(os.listdir(folder)):
        with open(os.path.join(folder, name)) as file:
            for line in file:
                if line.startswith("\t"):  # a payload line of the event above
                    entries[-1][1].append(line[1:])
                else:  # a glog prefix, then the event as JSON
                    entries.append((json.loads(line[line.index("] ") + 2:]), []))
    return [(event, "".join(payload)) for event, payload in entries]


def trace_of(program):
    folder = tempfile.mkdtemp(prefix="torch-trace-")
    COLD_FOLDERS.append(folder)
    env = dict(os.environ, TORCH_TRACE=folder)
    subprocess.run([sys.executable, "-c", program], env=env, check=True,
                   capture_output=True, text=True)
    return read_torch_trace(folder)


def compiled_graphs(entries):
    """One row per compiled graph: compile id, function, its operations, guards, and why."""
    rows, graph = [], None
    for event, payload in entries:
        if "dynamo_output_graph" in event:
            graph = payload
        elif "compilation_metrics" in event and graph is not None:
            metrics = event["compilation_metrics"]
            operations = re.findall(r"= (?:torch\.|l_x_\.|\w+\.)?(\w+)\(", graph)
            rows.append((metrics["compile_id"], metrics["co_name"], operations,
                         metrics["guard_count"], metrics.get("recompile_reason")))
            graph = None
    return rows


def check_trace(rows, entries):
    if len(rows) != 3:
        raise AssertionError(f"expected 3 compiled graphs (before the break, after it, and "
                             f"recompiled for 'cos'), the trace has {len(rows)}")
    if not rows[1][1].startswith("torch_dynamo_resume_in_breaks_once"):
        raise AssertionError(f"the second graph is in {rows[1][1]}, not a resume function")
    recompile_reasons = [rows[2][4] or ""] + artifacts(entries, "recompile_reasons")
    if not any("activation == 'sin'" in reason for reason in recompile_reasons):
        raise AssertionError(f"the recompile reasons are {recompile_reasons!r}, "
                             "not the string's guard")
    if not any("item()" in reason for reason in artifacts(entries, "dynamo_graph_break_reason")):
        raise AssertionError("the trace records no graph break at .item()")


def artifacts(entries, name):
    return [payload for event, payload in entries if event.get("artifact", {}).get("name") == name]


trace_entries = trace_of(TRACED_PROGRAM)
trace_rows = compiled_graphs(trace_entries)
check_trace(trace_rows, trace_entries)
print(f"TORCH_TRACE: {len(trace_entries)} events; the compiled graphs:")
print(f"  {'id':<5} {'function':<40} {'guards':>6}  calls / why recompiled")
for compile_id, function, operations, guards, reason in trace_rows:
    why = f" / {reason.split('#')[0].strip()}" if reason else ""
    print(f"  {compile_id:<5} {function:<40} {guards:6d}  {', '.join(operations)}{why}")
first_graph = next(p for e, p in trace_entries if "dynamo_output_graph" in e)
print("  the first graph, up to the break (.item() then runs in Python):")
for line in first_graph.strip().splitlines():
    if line.strip() and not line.strip().startswith("#"):
        print("    " + line.rstrip()[:100])
guards_text = next(p for e, p in trace_entries if "dynamo_cpp_guards_str" in e)
print("  a guard of the first graph: "
      + next(line.strip("| +-") for line in guards_text.splitlines()
             if "TENSOR_MATCH" in line)[:150])

# %%
# Read the result
# ---------------
# **Kernels as operators.** A raw kernel launch is known to ``torch.compile`` alone;
# an operator is known to all of PyTorch. ``custom_op`` with a fake implementation is
# the portable choice: any backend can schedule around it, ``opcheck`` tests its
# registration, and the generated code calls it as an extern, as printed above.
# ``triton_op`` goes one step further on a GPU: Inductor sees the Triton source, so it
# knows which buffers the kernel writes and places it among its own kernels. Neither
# makes Inductor fuse into your kernel by default: fusion inside it is your job. (Since
# torch 2.12 an option, off by default,
# ``torch._inductor.config.epilogue_fusion_user_defined_triton_kernel``, lets Inductor
# fuse a pointwise epilogue into a Triton kernel it sees, if the kernel has a single
# ``tl.store``, into a freshly allocated output, and the epilogue reads nothing but that
# output; an opaque operator never gets one.)
#
# **CUDA graphs** remove launch overhead, not work: they pay off where a step is many
# small kernels (decoding one token, small batches) and do nothing for a step that is
# a few large matmuls. Their price is static shapes and reused output buffers: on a
# GPU, the first call at a new batch size above paid for a new compile and a warm-up
# run, and the next call at that size records. On a CPU the mode changes nothing:
# Inductor counted the graph it could not build and compiled as in the default mode.
#
# **FlexAttention** turns an attention variant into a few lines of Python and one
# compiled kernel, checked above against an explicit bias mask in float64. Its block
# mask is where the speed of a sparse pattern comes from: the kernel skips the tiles
# that the line above counts as not visited, which a dense mask given to SDPA cannot
# do. On a GPU, the table compares it with SDPA given the same scores as a tensor, and
# with SDPA's causal kernel: hand-written, with neither bias nor window, but visiting
# every tile on or below the diagonal, so a reference point rather than the same work.
#
# **Troubleshooting.** Graph-break and recompile logs say why Dynamo split or retraced;
# ``torch.compiler.disable`` fences off code on purpose, at the price of one more
# graph; regional compilation cuts compile time for repeated blocks (the figure); and
# the structured trace shows what Dynamo made of a function: the graph before the
# break, the resume function it generated for the rest, the guards of each graph, and
# the guard that failed when it recompiled.

dynamo.reset()
for name, value in saved_cache_settings.items():
    if value is None:
        os.environ.pop(name, None)
    else:
        os.environ[name] = value
clear_inductor_caches()
for folder in COLD_FOLDERS:
    shutil.rmtree(folder, ignore_errors=True)

# The Triton launches of the CUDA branch, for the course's ahead-of-time compile check.
# (host function, [(shape, dtype)], keywords)
GPU_LAUNCHES = [("scaled_add", [((n,), torch.float32), ((n,), torch.float32)], {})
                for n in VECTOR_SIZES]

# %%
# Key figures
# -----------

KEY_FIGURES = {"device": DEVICE_NAME, "compile_works": "yes" if COMPILE_WORKS else "no"}
if FLEX_CHECKED:
    KEY_FIGURES["flex_alibi_max_abs_error"] = f"{flex_error:.2e}"
    KEY_FIGURES["flex_tiles_visited_fraction"] = tiles_visited / tiles_total
    for name, ms in (flex_timings or {}).items():
        key = re.sub(r"\W+", "_", name.lower()).strip("_")
        KEY_FIGURES[f"alibi_window_{key}_ms"] = ms
if COMPILE_WORKS:
    for blocks, (whole, regional) in compile_seconds.items():
        KEY_FIGURES[f"compile_whole_{blocks}_blocks_s"] = whole
        KEY_FIGURES[f"compile_regional_{blocks}_blocks_s"] = regional
if ON_GPU and COMPILE_WORKS:
    for name, ms in tiny_times.items():
        KEY_FIGURES[f"tiny_stack_{name}_us"] = ms * 1e3
    KEY_FIGURES["reduce_overhead_new_shape_first_call_ms"] = new_shape_ms
