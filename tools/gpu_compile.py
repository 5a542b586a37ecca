"""Compile the examples' GPU code ahead of time, on a machine without a GPU.

Triton compiles for a GPU target it does not have, with the ``ptxas`` in its
wheel. For every example this check

- lists every ``@triton.jit`` function with a static scan of the source;
- builds the example's *GPU view*: its imports, definitions and constants,
  executed with ``DEVICE == "cuda"`` and the target's compute capability, and
  nothing that times, plots, prints, allocates or writes;
- calls the host functions named in the example's ``GPU_LAUNCHES`` on
  shape-only (``meta``) tensors, so that the example's own code picks the block
  sizes, warps, dtypes and autotune configurations, and records each kernel
  launch instead of running it;
- compiles every launch, and every configuration an autotuner would try, for
  compute capability 7.5, 8.0, 8.9, 9.0 and 10.0, specialised as Triton's
  launcher would specialise it (integer arguments equal to 1 or divisible by
  16, pointers aligned to 16 bytes);
- compiles every CUDA source the examples pass to ``load_inline`` with
  ``nvcc`` for sm_75, sm_80 and sm_90, where ``nvcc`` exists;

and writes registers, spills, shared memory and theoretical occupancy to
``report.md`` and ``report.json``. It exits with 1 if anything failed.

The workers first plan each example on each target (its launches, specialised, in
seconds); then each distinct compile, by Triton's own cache key, is one job, and the
longest (nvcc, then ``tl.dot`` on big tiles for sm_75) start first, so that no worker
is left alone with a queue at the end. A line of progress is printed as each example
finishes on a target, and at least every 30 seconds.

    python tools/gpu_compile.py --out _build/gpu-compile
"""

import argparse
import ast
import builtins
import contextlib
import hashlib
import io
import json
import os
import re
import shutil
import subprocess
import sys
import sysconfig
import tempfile
import time
import traceback
import types
from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait
from dataclasses import asdict, dataclass
from multiprocessing import get_context
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


# %% The targets and their per-SM limits

@dataclass(frozen=True)
class Arch:
    capability: int  # 90 for compute capability 9.0
    gpus: str
    max_warps_per_sm: int
    max_blocks_per_sm: int
    shared_per_sm: int  # bytes, the largest carveout
    shared_per_block: int  # bytes, the opt-in maximum that Triton's loader checks
    shared_granularity: int  # bytes
    registers_per_sm: int = 64 * 1024
    registers_per_block: int = 64 * 1024
    registers_per_thread: int = 255
    register_unit: int = 256  # registers, allocated per warp
    sub_partitions: int = 4

    @property
    def name(self):
        return f"sm_{self.capability}"

    @property
    def reserved_shared(self):
        """Shared memory the driver keeps per block: what a block may not have of the SM's."""
        return self.shared_per_sm - self.shared_per_block


KIB = 1024
ARCHS = {
    75: Arch(75, "T4, RTX 20", 32, 16, 64 * KIB, 64 * KIB, 256),
    80: Arch(80, "A100", 64, 32, 164 * KIB, 163 * KIB, 128),
    89: Arch(89, "L4, RTX 40", 48, 24, 100 * KIB, 99 * KIB, 128),
    90: Arch(90, "H100, H200", 64, 32, 228 * KIB, 227 * KIB, 128),
    100: Arch(100, "B200", 64, 32, 228 * KIB, 227 * KIB, 128),
}
NVCC_ARCHS = (75, 80, 90)
LIMIT_SOURCES = [
    ("Resident warps and blocks per SM, registers per SM, per block and per thread, shared "
     "memory per SM and per block: CUDA Programming Guide, section 5.1.3, Tables 30 and 31 "
     "(https://docs.nvidia.com/cuda/cuda-programming-guide/05-appendices/compute-capabilities.html). "
     "The per-block figure is the opt-in maximum; the 1 KiB by which it falls short of the SM's "
     "is reserved for the system on 8.0 and later."),
    ("Register allocation (256 registers per warp, four sub-partitions), shared-memory "
     "granularity (256 bytes on 7.x, 128 bytes later), and the rule that combines the limits: "
     "cuda_occupancy.h of the CUDA toolkit (cudaOccMaxBlocksPerSM*Limit)."),
    ("A configuration is pruned, as Triton's autotuner prunes it, when loading it would raise "
     "OutOfResources (shared memory above the per-block opt-in maximum, or a block that does not "
     "fit the register file) or when ptxas or a static assertion rejects it "
     "(triton/runtime/autotuner.py, Autotuner._bench)."),
]


def round_up(value, unit):
    return -(-value // unit) * unit


def occupancy(arch, num_warps, registers, shared):
    """Resident blocks and warps per SM for one block shape, as cuda_occupancy.h computes them."""
    limits = {"blocks": arch.max_blocks_per_sm,
              "warps": arch.max_warps_per_sm // num_warps if num_warps * 32 <= 1024 else 0}
    per_warp = round_up(max(registers, 1) * 32, arch.register_unit)
    fits = (per_warp * round_up(num_warps, arch.sub_partitions) <= arch.registers_per_block
            and registers <= arch.registers_per_thread)
    warps_per_partition = arch.registers_per_sm // arch.sub_partitions // per_warp
    limits["registers"] = warps_per_partition * arch.sub_partitions // num_warps if fits else 0
    per_block = round_up(shared + arch.reserved_shared, arch.shared_granularity)
    if per_block > arch.shared_per_block + arch.reserved_shared:
        limits["shared memory"] = 0
    else:
        limits["shared memory"] = arch.shared_per_sm // per_block if per_block else arch.max_blocks_per_sm
    blocks = min(limits.values())
    return {"blocks_per_sm": blocks, "warps_per_sm": blocks * num_warps,
            "occupancy": blocks * num_warps / arch.max_warps_per_sm,
            "limited_by": min(limits, key=limits.get)}


# %% The static scan

def dotted(node):
    """``torch.cuda.is_available`` for that attribute chain, else None."""
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if isinstance(node, ast.Name):
        return ".".join([node.id, *reversed(parts)])
    return None


def decorator_name(node):
    return dotted(node.func if isinstance(node, ast.Call) else node)


def is_jit(node):
    return decorator_name(node) in ("triton.jit", "jit")


def module_level_definitions(tree):
    """Function definitions at module level, including those under ``if`` and ``try``."""
    found, todo = [], list(tree.body)
    while todo:
        node = todo.pop(0)
        if isinstance(node, ast.FunctionDef):
            found.append(node)
        for field in ("body", "orelse", "finalbody"):
            if isinstance(node, (ast.If, ast.Try)):
                todo.extend(getattr(node, field, []))
        if isinstance(node, ast.Try):
            for handler in node.handlers:
                todo.extend(handler.body)
    return found


def scan_example(path):
    """Every ``@triton.jit`` function of an example: name, line, device function or kernel, autotuned."""
    tree = ast.parse(path.read_text(), str(path))
    jitted = {f.name: f for f in module_level_definitions(tree) if any(map(is_jit, f.decorator_list))}
    callers = {name: sorted(other for other, f in jitted.items() if other != name and any(
        isinstance(n, ast.Call) and isinstance(n.func, ast.Name) and n.func.id == name
        for n in ast.walk(f))) for name in jitted}
    autotuned = {f.name for f in jitted.values()
                 if any(decorator_name(d) == "triton.autotune" for d in f.decorator_list)}
    for node in ast.walk(tree):  # triton.autotune(...)(kernel)
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Call)
                and dotted(node.func.func) == "triton.autotune"):
            autotuned.update(a.id for a in node.args if isinstance(a, ast.Name))
    return [{"name": name, "line": f.lineno, "called_by": callers[name],
             "autotuned": name in autotuned} for name, f in jitted.items()]


# %% The GPU view of an example

SAFE_BUILTINS = {"range", "len", "min", "max", "sum", "sorted", "set", "frozenset", "list", "tuple",
                 "dict", "zip", "enumerate", "reversed", "int", "float", "str", "bool", "abs",
                 "round", "any", "all", "isinstance", "print"}
SAFE_CALLS = {"triton.next_power_of_2", "triton.cdiv", "triton.Config", "triton.autotune",
              "triton.heuristics", "triton.jit", "os.environ.get", "torch.cuda.is_available",
              "torch.cuda.get_device_capability", "torch.cuda.get_device_name",
              "torch.cuda.is_bf16_supported"}
SAFE_METHODS = {"append", "extend", "items", "keys", "values", "get", "index", "split",
                "removeprefix", "format", "copy"}


def imported_names(tree):
    """Names the example binds by importing: modules and what it takes from them."""
    return {alias.asname or alias.name.split(".")[0] for node in ast.walk(tree)
            if isinstance(node, (ast.Import, ast.ImportFrom)) for alias in node.names}


def calls_only(node, harmless, imported):
    """Whether every call inside ``node`` is harmless: it computes a value and touches nothing."""
    for call in ast.walk(node):
        if not isinstance(call, ast.Call) or isinstance(call.func, ast.Call):
            continue  # a decorator factory's result; the factory itself is checked
        name = dotted(call.func)
        if name in SAFE_CALLS or name in harmless or (name or "").startswith("math."):
            continue
        if isinstance(call.func, ast.Name) and (call.func.id in SAFE_BUILTINS or isinstance(
                getattr(builtins, call.func.id, None), type) and issubclass(
                getattr(builtins, call.func.id), Exception)):
            continue  # building an exception to raise touches nothing
        if (isinstance(call.func, ast.Attribute) and call.func.attr in SAFE_METHODS
                and (name or ".").split(".")[0] not in imported):
            continue  # a method of a value (SIZES.append), not of a module (shutil.copy)
        return False
    return True


def harmless_functions(tree):
    """The example's functions that only compute values from others like them."""
    functions = {f.name: f for f in module_level_definitions(tree)}
    imported = imported_names(tree)
    harmless = set()
    while True:
        grown = {name for name, f in functions.items()
                 if name not in harmless and calls_only(ast.Module(f.body, []), harmless, imported)}
        if not grown:
            return harmless
        harmless |= grown


class GpuView:
    """The parts of an example that define its kernels and GPU configuration, executed as on CUDA."""

    def __init__(self, path):
        self.path = path
        self.tree = ast.parse(path.read_text(), str(path))
        self.harmless = harmless_functions(self.tree)
        self.imported = imported_names(self.tree)
        self.skipped = []  # (line, why) of statements left out
        name = f"gpu_view_{path.stem}"
        self.module = types.ModuleType(name)
        self.module.__file__ = str(path)
        sys.modules[name] = self.module
        self.namespace = self.module.__dict__
        with contextlib.redirect_stdout(io.StringIO()):
            self.run(self.tree.body)

    def harmless_code(self, node):
        return calls_only(node, self.harmless, self.imported)

    def execute(self, node):
        code = compile(ast.Module([node], []), str(self.path), "exec")
        exec(code, self.namespace)  # noqa: S102 (a statement of our own example)

    def attempt(self, node):
        try:
            self.execute(node)
        except Exception as error:  # noqa: BLE001 (a value a CPU cannot compute: left out)
            self.skipped.append((node.lineno, f"{type(error).__name__}: {error}"))

    def run(self, statements):
        for node in statements:
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                self.execute(node)  # the GPU path needs every import
            elif isinstance(node, (ast.FunctionDef, ast.ClassDef)):
                if self.harmless_code(ast.Module(node.decorator_list, [])):
                    self.attempt(node)
                else:
                    self.skipped.append((node.lineno, "a decorator with side effects"))
            elif isinstance(node, ast.If):
                if not self.harmless_code(node.test):
                    self.skipped.append((node.lineno, "a condition with side effects"))
                    continue
                try:
                    taken = eval(compile(ast.Expression(node.test), str(self.path), "eval"),
                                 self.namespace)
                except Exception as error:  # noqa: BLE001
                    self.skipped.append((node.lineno, f"condition: {type(error).__name__}: {error}"))
                    continue
                self.run(node.body if taken else node.orelse)
            elif isinstance(node, ast.Try):
                self.run(node.body)  # the GPU path takes no except branch
            elif isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
                if node.value is not None and self.harmless_code(node.value):
                    self.attempt(node)
                else:
                    self.skipped.append((node.lineno, "computes with side effects"))
            elif (isinstance(node, ast.Expr) and isinstance(node.value, ast.Call)
                  and isinstance(node.value.func, ast.Attribute)
                  and node.value.func.attr in ("append", "extend")
                  and self.harmless_code(node.value)):
                self.attempt(node)  # SIZES.append(...) in a CUDA branch
            else:
                self.skipped.append((node.lineno, type(node).__name__))


# %% Recording launches and compiling them (in worker processes)

@dataclass
class Launch:
    call: str  # the GPU_LAUNCHES entry that led to it
    kernel: object  # the JITFunction
    args: tuple
    kwargs: dict
    configs: list | None  # what the autotuner would try, or None


def pretend_cuda(capability):
    """Make ``torch.cuda`` answer as a GPU of this capability would, for the GPU view."""
    import torch

    major, minor = divmod(capability, 10)
    torch.cuda.is_available = lambda: True
    torch.cuda.get_device_capability = lambda device=None: (major, minor)
    torch.cuda.get_device_name = lambda device=None: f"ahead-of-time target sm_{capability}"
    torch.cuda.is_bf16_supported = lambda *args, **kwargs: capability >= 80


@contextlib.contextmanager
def recording_launches(sink, call):
    """Within the block, a kernel launch appends a Launch to ``sink`` instead of running."""
    from triton.runtime.autotuner import Autotuner
    from triton.runtime.jit import JITFunction

    def record_jit(kernel, *args, grid, warmup, **kwargs):
        sink.append(Launch(call, kernel, args, kwargs, None))

    def record_autotuned(tuner, *args, **kwargs):
        if not isinstance(tuner.fn, JITFunction):
            raise TypeError(f"autotuning a {type(tuner.fn).__name__} is not supported by this check")
        tuner.nargs = dict(zip(tuner.arg_names, args))
        configs = list(tuner.prune_configs(kwargs)) if len(tuner.configs) > 1 else tuner.configs[:1]
        tuner.nargs = None
        kernel_kwargs = {k: v for k, v in kwargs.items() if k not in ("grid", "warmup")}
        conflicts = set(kernel_kwargs) & {k for c in configs for k in c.kwargs}
        if conflicts:
            raise ValueError(f"Conflicting meta-parameters: {', '.join(sorted(conflicts))}.")
        sink.append(Launch(call, tuner.fn, args, kernel_kwargs, configs))

    saved = JITFunction.run, Autotuner.run
    JITFunction.run, Autotuner.run = record_jit, record_autotuned
    try:
        yield
    finally:
        JITFunction.run, Autotuner.run = saved


def shape_only(spec):
    import torch

    shape, dtype = spec
    return torch.empty(shape, dtype=dtype, device="meta")


class PointerArgument:
    """What Triton's launcher reads from a tensor argument: its dtype and address."""

    def __init__(self, tensor):
        self.dtype = tensor.dtype
        self.address = tensor.storage_offset() * tensor.element_size()  # allocations are aligned

    def data_ptr(self):
        return self.address


def launch_arguments(values):
    import torch

    return tuple(PointerArgument(v) if isinstance(v, torch.Tensor) else v for v in values)


PTXAS_FIELDS = {"registers": r"Used (\d+) registers", "spill_stores": r"(\d+) bytes spill stores",
                "spill_loads": r"(\d+) bytes spill loads", "stack_frame": r"(\d+) bytes stack frame"}


def ptxas_figures(log):
    found = {key: re.search(pattern, log) for key, pattern in PTXAS_FIELDS.items()}
    if not all(found.values()):
        raise RuntimeError(f"no ptxas -v figures in Triton's ptxas log:\n{log[-2000:]}")
    return {key: int(match.group(1)) for key, match in found.items()}


def describe(signature, constexprs, attrs, options, kernel):
    """One short line: constexpr values, warps and stages, dtypes, what the launcher specialised."""
    names = kernel.arg_names
    parts = [f"{names[path[0]]}={value}" for path, value in constexprs.items()
             if kernel.params[path[0]].is_constexpr]
    parts += [f"{names[path[0]]}==1" for path, value in constexprs.items()
              if not kernel.params[path[0]].is_constexpr]
    parts.append(f"warps={options.num_warps} stages={options.num_stages}")
    parts.append(",".join(sorted({t for t in signature.values() if t.startswith("*")})))
    aligned = {names[path[0]] for path, value in attrs.items()
               if value and not kernel.params[path[0]].is_constexpr}
    divisible = [n for n in aligned if not signature[n].startswith("*")]
    unaligned = [n for n, t in signature.items() if t.startswith("*") and n not in aligned]
    if divisible:
        parts.append("div16:" + ",".join(sorted(divisible, key=names.index)))
    if unaligned:
        parts.append("unaligned:" + ",".join(unaligned))
    return " ".join(parts)


def triton_key(source, backend, options):
    """Triton's own cache key: Triton and its ptxas, the kernel's source and the constexpr
    globals it reads, the specialisation and the options. Two launches with the same key
    get the same binary from Triton, so they are compiled once."""
    from triton.runtime.cache import get_cache_key
    from triton.runtime.jit import get_cache_invalidating_env_vars

    return get_cache_key(source, backend, options, get_cache_invalidating_env_vars())


def cached_figures(key):
    """Where the figures of a compile that succeeded are kept, if --cache names a folder.

    The key is Triton's cache key and this file's text: a compile that succeeded once
    succeeds again. Failures are never kept."""
    folder = os.environ.get("GPU_COMPILE_RESULTS")
    if not folder:
        return None
    key += Path(__file__).read_text()
    return Path(folder) / (hashlib.sha256(key.encode()).hexdigest() + ".json")


def estimated_cost(kernel, constexprs, capability):
    """A rough order of compile times, to start the longest first: a tl.dot on big tiles
    costs most (on sm_75, which has no tensor cores for Triton 3.6, most of all)."""
    size = 1
    for path, value in constexprs.items():
        if kernel.params[path[0]].is_constexpr and isinstance(value, int) and value > 1 \
                and kernel.arg_names[path[0]].upper().startswith(("BLOCK", "HEAD")):
            size *= value
    dot = "tl.dot" in kernel.src
    return (dot, capability == 75, size)


PTXAS = {}  # what the last compile's ptxas stage did, in this worker


def run_ptxas_once(folder):
    """Make Triton run ``ptxas`` once per distinct input in this run, across the workers.

    Specialisations that differ (an argument divisible by 16 that the kernel only compares)
    can lower to the same PTX; ``ptxas`` given the same PTX, target and flags gives the same
    binary and log, so the second one reads both back. Triton's stages are unchanged: this
    wraps the method that writes the PTX to a file and runs ``ptxas`` on it."""
    from triton import knobs
    from triton.backends.nvidia.compiler import CUDABackend, get_ptxas

    make_cubin = CUDABackend.make_cubin
    os.makedirs(folder, exist_ok=True)

    def once(self, src, metadata, opt, capability):
        flags = (capability, get_ptxas(self.target.arch).path, opt.enable_fp_fusion, opt.ptx_options,
                 knobs.compilation.disable_line_info, knobs.nvidia.disable_ptxas_opt,
                 knobs.nvidia.dump_ptxas_log)
        name = hashlib.sha256((repr(flags) + src).encode()).hexdigest()
        memo, log_memo = Path(folder) / f"{name}.cubin", Path(folder) / f"{name}.log"
        if memo.exists() and log_memo.exists():
            print(log_memo.read_text(), end="")
            PTXAS.update(reused=True, cpu_seconds=0.0)
            return memo.read_bytes()
        log = io.StringIO()
        start = sum(os.times()[2:4])
        with contextlib.redirect_stdout(log):
            cubin = make_cubin(self, src, metadata, opt, capability)
        PTXAS.update(reused=False, cpu_seconds=round(sum(os.times()[2:4]) - start, 3))
        print(log.getvalue(), end="")
        for path, data in ((log_memo, log.getvalue().encode()), (memo, cubin)):
            partial = path.with_suffix(f".{os.getpid()}")
            partial.write_bytes(data)
            partial.replace(path)  # the log first, then the binary: a binary means both are whole
        return cubin

    CUDABackend.make_cubin = once


def compile_one(kernel, target, arch, args, kwargs):
    """Specialise as JITFunction.run does; return Triton's key, the report row and a build."""
    import triton
    from triton import knobs
    from triton.compiler import ASTSource
    from triton.compiler.compiler import make_backend
    from triton.runtime.jit import create_function_from_signature

    kwargs = dict(kwargs, debug=kwargs.get("debug", kernel.debug) or knobs.runtime.debug,
                  instrumentation_mode=knobs.compilation.instrumentation_mode)
    backend = make_backend(target)
    binder = create_function_from_signature(kernel.signature, kernel.params, backend)
    bound, specialization, options = binder(*args, **kwargs)
    options, signature, constexprs, attrs = kernel._pack_args(backend, kwargs, bound, specialization, options)
    key = hashlib.sha256(triton_key(ASTSource(kernel, signature, constexprs, attrs), backend,
                                    options).encode()).hexdigest()
    result = {"kernel": kernel.__name__, "target": arch.capability, "key": key,
              "specialisation": describe(signature, constexprs, attrs, options, kernel),
              "num_warps": options.num_warps, "num_stages": options.num_stages}

    def build():
        """Compile (or read the results cache) and return the figures."""
        cached = cached_figures(key)
        if cached is not None and cached.exists():
            return dict(json.loads(cached.read_text()), cached=True)
        # A fresh Triton cache for each compile: Triton prints ptxas's log only when it runs it.
        os.environ["TRITON_CACHE_DIR"] = tempfile.mkdtemp(dir=os.environ["GPU_COMPILE_CACHES"])
        knobs.nvidia.dump_ptxas_log = True
        PTXAS.clear()
        log = io.StringIO()
        start, times = time.perf_counter(), os.times()
        try:
            with contextlib.redirect_stdout(log):
                compiled = triton.compile(ASTSource(kernel, signature, constexprs, attrs),
                                          target=target, options=options.__dict__)
        finally:
            shutil.rmtree(os.environ["TRITON_CACHE_DIR"], ignore_errors=True)
        figures = ptxas_figures(log.getvalue())
        figures.update(shared=compiled.metadata.shared,
                       tmem_size=getattr(compiled.metadata, "tmem_size", None),
                       ptx=hashlib.sha256(compiled.asm["ptx"].encode()).hexdigest()[:16],
                       ptxas_reused=PTXAS.get("reused"), ptxas_cpu_seconds=PTXAS.get("cpu_seconds"),
                       seconds=round(time.perf_counter() - start, 3),
                       cpu_seconds=round(sum(os.times()[:4]) - sum(times[:4]), 3))  # with ptxas
        if cached is not None:
            partial = cached.with_suffix(f".{os.getpid()}")
            partial.write_text(json.dumps(figures))
            partial.replace(cached)  # whole or not at all, with other runs writing alongside
        return figures

    return key, result, build, estimated_cost(kernel, constexprs, arch.capability)


def resource_problem(result, arch):
    """Why loading this kernel on the target would raise OutOfResources, or None."""
    from triton.runtime.errors import OutOfResources

    if result["shared"] > arch.shared_per_block:
        return OutOfResources(result["shared"], arch.shared_per_block, "shared memory")
    if (result.get("tmem_size") or 0) > 512:
        return OutOfResources(result["tmem_size"], 512, "tensor memory")
    if result["occupancy"]["limited_by"] == "registers" and result["occupancy"]["blocks_per_sm"] == 0:
        return OutOfResources(result["num_warps"] * 32, "fewer threads at this register count", "threads")
    return None


def first_lines(error, limit=1500):
    text = f"{type(error).__name__}: {error}".strip()
    return text if len(text) <= limit else text[:limit] + " ..."


def launch_text(name, tensors, options):
    shapes = [f"{tuple(shape)}:{str(dtype).removeprefix('torch.')}" for shape, dtype in tensors]
    return f"{name}({', '.join(shapes + [f'{k}={v!r}' for k, v in options.items()])})"


@dataclass
class Plan:
    """One example on one target: its launches, specialised, and what is left to compile."""
    out: dict  # example, target, failures of the planning, launches, skipped
    variants: list  # [(key, report row, build, cost)], one per distinct specialisation, in order
    autotuned: list  # [(call, kernel name, indices into variants)] for each autotuned launch


PLANS = {}  # a worker's plans, so that its compiles of the same example and target plan once


def planned(relative, path, capability, kernels):
    """Worker: the plan of these kernels' launches from one example's GPU_LAUNCHES, for one target."""
    where = (relative, path, capability, tuple(kernels))
    if where not in PLANS:
        out = {"example": relative, "target": capability, "compiles": [], "failures": [], "launches": 0}
        plan = Plan(out, [], [])
        try:
            plan_launches(relative, Path(path), capability, set(kernels), plan)
        except Exception as error:  # noqa: BLE001 (a bug of this check: reported, not hidden)
            out["failures"].append({"example": relative, "kernel": None, "target": capability,
                                    "error": "the check itself failed: " + first_lines(error)
                                             + "\n" + traceback.format_exc()})
        PLANS[where] = plan
    return PLANS[where]


def plan_example_on_target(relative, path, capability, kernels):
    """Worker: what the parent needs of a plan to hand its compiles out (no JITFunctions)."""
    plan = planned(relative, path, capability, kernels)
    return {"out": plan.out, "variants": [(key, row, cost) for key, row, _, cost in plan.variants],
            "autotuned": plan.autotuned}


def plan_launches(relative, path, capability, kernels, plan):
    from triton.backends.compiler import GPUTarget

    out = plan.out

    def fail(kernel, message):
        out["failures"].append({"example": relative, "kernel": kernel, "target": capability,
                                "error": message})

    arch = ARCHS[capability]
    target = GPUTarget("cuda", capability, 32)
    pretend_cuda(capability)
    try:
        view = GpuView(path)
    except Exception as error:  # noqa: BLE001 (reported, with the example's name)
        fail(None, "the GPU view could not be built: " + first_lines(error))
        return
    out["skipped"] = view.skipped
    declared = view.namespace.get("GPU_LAUNCHES")
    if declared is None:
        return  # an example with kernels but no GPU_LAUNCHES fails the coverage check
    launches = []
    for entry in declared:
        try:
            name, tensors, options = entry
            call = launch_text(name, tensors, options)
        except (TypeError, ValueError) as error:
            fail(None, f"a GPU_LAUNCHES entry is not (name, [(shape, dtype), ...], {{...}}): {entry!r} ({error})")
            continue
        host = view.namespace.get(name)
        if host is None:
            lines = "; ".join(f"line {line}: {why}" for line, why in view.skipped[-5:])
            fail(None, f"GPU_LAUNCHES calls {name}, which the GPU view does not define ({lines})")
            continue
        try:
            with recording_launches(launches, call), contextlib.redirect_stdout(io.StringIO()):
                host(*map(shape_only, tensors), **options)
        except Exception as error:  # noqa: BLE001
            fail(None, f"{call} raised on shape-only tensors: "
                       + first_lines(error) + "\n" + traceback.format_exc(limit=-3))
    launches = [launch for launch in launches if launch.kernel.__name__ in kernels]
    out["launches"] = len(launches)

    index = {}  # key -> position in plan.variants: launches that specialise alike compile once
    for launch in launches:
        variants = [launch.kwargs] if launch.configs is None else [
            dict(launch.kwargs, **config.all_kwargs()) for config in launch.configs]
        positions = []
        for kwargs in variants:
            try:
                key, result, build, cost = compile_one(launch.kernel, target, arch,
                                                       launch_arguments(launch.args), kwargs)
            except Exception as error:  # noqa: BLE001 (bad arguments, as a launch would fail)
                fail(launch.kernel.__name__, f"{launch.call}: " + first_lines(error))
                continue
            if key in index:
                plan.variants[index[key]][1]["launches"] += 1
            else:
                result.update(example=relative, autotuned=launch.configs is not None, launches=1,
                              first_call=launch.call)
                index[key] = len(plan.variants)
                plan.variants.append((key, result, build, cost))
            positions.append(index[key])
        if launch.configs is not None and positions:
            plan.autotuned.append((launch.call, launch.kernel.__name__, positions))


def compile_planned(relative, path, capability, kernels, position, key):
    """Worker: compile one specialisation of a plan; its figures, or why it would not load."""
    from triton.compiler.errors import CompileTimeAssertionFailure
    from triton.runtime.errors import OutOfResources, PTXASError

    plan = planned(relative, path, capability, kernels)
    planned_key, row, build, _ = plan.variants[position]
    if planned_key != key:
        raise RuntimeError(f"{relative} on sm_{capability}: specialisation {position} planned twice "
                           "differently (the GPU view is not deterministic)")
    arch = ARCHS[capability]
    figures = {}
    try:
        figures = build()
        figures["occupancy"] = occupancy(arch, row["num_warps"], figures["registers"], figures["shared"])
        problem = resource_problem({**row, **figures}, arch)
        if problem is not None:
            raise problem
    except (OutOfResources, CompileTimeAssertionFailure, PTXASError) as error:
        return {**figures, "problem": "would not load", "reason": first_lines(error, 400)}
    except Exception as error:  # noqa: BLE001 (a compile error: the GPU run would fail)
        return {**figures, "problem": "error", "reason": first_lines(error)}
    return {**figures, "problem": None, "reason": None}


def finish_plan(plan, outcomes):
    """The report rows and failures of one example on one target, from the compiles' outcomes."""
    out = plan["out"]
    for key, row, _ in plan["variants"]:
        outcome = dict(outcomes[(row["target"], key)])
        problem = outcome.pop("problem")
        row = {**row, **outcome}
        if problem is None:
            row["status"] = "ok"
        else:  # the autotuner skips a configuration that would not load; a plain launch fails
            row["status"] = "pruned" if problem == "would not load" and row["autotuned"] else "failed"
        if row["status"] == "failed":
            out["failures"].append({"example": row["example"], "kernel": row["kernel"],
                                    "target": row["target"],
                                    "error": f"{row['specialisation']}: {row['reason']}"})
        out["compiles"].append(row)
    for call, kernel, positions in plan["autotuned"]:
        if all(out["compiles"][p]["status"] == "pruned" for p in positions):
            out["failures"].append({"example": out["example"], "kernel": kernel, "target": out["target"],
                                    "error": f"{call}: no autotune configuration fits {ARCHS[out['target']].name}"})
    return out


# %% CUDA sources passed to load_inline

def static_value(node, env):
    """The value of a constant expression made of literals, names of constants and ``+``."""
    if isinstance(node, ast.Constant):
        return node.value
    if isinstance(node, ast.Name):
        return env[node.id]
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
        return static_value(node.left, env) + static_value(node.right, env)
    if isinstance(node, ast.List):
        return [static_value(e, env) for e in node.elts]
    if isinstance(node, ast.Tuple):  # hashable, for a dict keyed by tuples
        return tuple(static_value(e, env) for e in node.elts)
    if isinstance(node, ast.Dict):
        value = {}
        for key, item in zip(node.keys, node.values):
            if key is None:  # ``**mapping`` unpacking
                value.update(static_value(item, env))
            else:
                value[static_value(key, env)] = static_value(item, env)
        return value
    raise ValueError(f"line {node.lineno}: {ast.unparse(node)} is not a constant expression")


def constants(statements, env):
    """``env`` extended with the names these statements bind to constant expressions."""
    env = dict(env)
    for node in statements:
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            with contextlib.suppress(ValueError, KeyError, TypeError):
                env[node.targets[0].id] = static_value(node.value, env)
    return env


def load_inline_parameters():
    """The names of load_inline's parameters, in order, for calls that pass some by position."""
    import inspect

    from torch.utils import cpp_extension

    return list(inspect.signature(cpp_extension.load_inline).parameters)


def load_inline_calls(path):
    """Each ``load_inline`` call with CUDA sources, its arguments read from the source."""
    tree = ast.parse(path.read_text(), str(path))
    module_env = constants(tree.body, {})
    functions = [n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef)]
    seen, found = set(), []
    for scope in [*reversed(functions), tree]:  # innermost first: its constants are the nearest
        env = module_env if scope is tree else constants(scope.body, module_env)
        for node in ast.walk(scope):
            if (id(node) in seen or not isinstance(node, ast.Call)
                    or not (dotted(node.func) or "").endswith("load_inline")):
                continue
            seen.add(id(node))
            call = {"line": node.lineno}
            try:
                if node.args:  # (imports torch)
                    call.update(zip(load_inline_parameters(), (static_value(a, env) for a in node.args)))
                for keyword in node.keywords:
                    value = static_value(keyword.value, env)
                    call.update(value if keyword.arg is None else {keyword.arg: value})
            except (ValueError, KeyError, TypeError) as error:
                call["unreadable"] = f"its arguments are not constants ({error})"
            if call.get("cuda_sources") or "unreadable" in call:
                found.append(call)
    return found


def nvcc_path():
    home = os.environ.get("CUDA_HOME") or os.environ.get("CUDA_PATH")
    candidates = [Path(home) / "bin" / "nvcc"] if home else []
    candidates += [Path(p) for p in [shutil.which("nvcc")] if p] + [Path("/usr/local/cuda/bin/nvcc")]
    return next((str(c) for c in candidates if c.is_file()), None)


def nvcc_command(nvcc, name, extra_flags, source, obj):
    """The command torch's load_inline runs for a CUDA source, for NVCC_ARCHS, with ptxas -v."""
    from torch.utils import cpp_extension

    torch_include = Path(cpp_extension.include_paths()[0])
    command = [nvcc, "-c", str(source), "-o", str(obj), f"-DTORCH_EXTENSION_NAME={name}",
               "-DTORCH_API_INCLUDE_EXTENSION_H"]
    for include in [*cpp_extension.include_paths(), sysconfig.get_path("include")]:
        command += ["-isystem", include]
    if not (torch_include / "c10/cuda/impl/cuda_cmake_macros.h").exists():
        # A CPU wheel lacks this one generated header (an export macro for Windows and the CUDA
        # version); the switch is c10's own, and code that needed the header would not compile.
        command.append("-DC10_CUDA_NO_CMAKE_CONFIGURE_FILE")
    command += [*cpp_extension.COMMON_NVCC_FLAGS, "--compiler-options", "-fPIC", "-std=c++20"]
    command += [f"-gencode=arch=compute_{cc},code=sm_{cc}" for cc in NVCC_ARCHS]
    return command + ["-Xptxas", "-v", *extra_flags]


def nvcc_kernels(log):
    """Per (kernel, sm_XX): registers and spills from ptxas -v."""
    figures = []
    for block in re.split(r"(?=ptxas info\s+: Compiling entry function)", log)[1:]:
        entry = re.search(r"entry function '([^']+)' for '(sm_\d+)'", block)
        fields = {key: int(m.group(1)) for key, p in PTXAS_FIELDS.items() if (m := re.search(p, block))}
        smem = re.search(r"(\d+) bytes smem", block)
        figures.append({"kernel": entry.group(1), "arch": entry.group(2), **fields,
                        "shared": int(smem.group(1)) if smem else 0})
    return figures


def compile_cuda_source(relative, call, folder):
    """Worker: nvcc on one load_inline CUDA source, as load_inline writes and compiles it."""
    nvcc = nvcc_path()
    if "unreadable" in call:
        return {"example": relative, "line": call["line"], "name": call.get("name"),
                "status": "failed", "reason": call["unreadable"]}
    result = {"example": relative, "line": call["line"], "name": call.get("name"),
              "archs": [f"sm_{cc}" for cc in NVCC_ARCHS]}
    if nvcc is None:
        return {**result, "status": "skipped", "reason": "nvcc not found (CUDA_HOME, PATH, /usr/local/cuda)"}
    sources = call["cuda_sources"]
    sources = [sources] if isinstance(sources, str) else list(sources)
    if not call.get("no_implicit_headers", False):
        sources = ["#include <torch/types.h>", "#include <cuda.h>", "#include <cuda_runtime.h>", *sources]
    work = Path(folder) / f"{Path(relative).stem}-{call['line']}"
    work.mkdir(parents=True, exist_ok=True)
    source = work / "cuda.cu"
    source.write_text("\n".join(sources))
    command = nvcc_command(nvcc, call.get("name", "extension"), call.get("extra_cuda_cflags", []),
                           source, work / "cuda.o")
    cached = cached_nvcc_figures(command, work, source.read_text())
    if cached is not None and cached.exists():
        return {**result, **json.loads(cached.read_text()), "cached": True}
    start, times = time.perf_counter(), os.times()
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    result["seconds"] = round(time.perf_counter() - start, 1)
    result["cpu_seconds"] = round(sum(os.times()[2:4]) - sum(times[2:4]), 1)
    if done.returncode != 0:
        return {**result, "status": "failed", "reason": (done.stderr or done.stdout)[-3000:]}
    kernels = nvcc_kernels(done.stdout + done.stderr)
    compiled = sorted({k["arch"] for k in kernels})
    if compiled != sorted(result["archs"]):
        return {**result, "status": "failed", "reason": f"ptxas compiled for {compiled} only"}
    figures = {"status": "ok", "kernels": kernels, "seconds": result["seconds"],
               "cpu_seconds": result["cpu_seconds"]}
    if cached is not None:
        partial = cached.with_suffix(f".{os.getpid()}")
        partial.write_text(json.dumps(figures))
        partial.replace(cached)
    return {**result, **figures}


def cached_nvcc_figures(command, work, text):
    """Where nvcc's figures for this source are kept, if --cache names a folder: keyed by the
    command (without this run's folder), the source, nvcc's and the host compiler's versions,
    torch's (its headers) and this file's text. Failures are never kept."""
    import torch

    folder = os.environ.get("GPU_COMPILE_RESULTS")
    if not folder:
        return None
    versions = [subprocess.run([tool, "--version"], capture_output=True, text=True, check=False).stdout
                for tool in (command[0], shutil.which("g++") or "g++") if shutil.which(tool)]
    key = json.dumps([[part.replace(str(work), "") for part in command], text, versions,
                      torch.__version__, Path(__file__).read_text()])
    return Path(folder) / ("nvcc-" + hashlib.sha256(key.encode()).hexdigest() + ".json")


# %% Running it all, and the report

def worker_setup(cache, results):
    if results:
        os.makedirs(results, exist_ok=True)
        os.environ["GPU_COMPILE_RESULTS"] = results
    for name in [n for n in os.environ if n.startswith("COURSE_")]:
        del os.environ[name]  # the examples' GPU branch as a reader runs it, not a strict build
    os.environ.pop("TRITON_INTERPRET", None)
    os.environ["GPU_COMPILE_CACHES"] = cache
    os.makedirs(cache, exist_ok=True)
    import torch  # noqa: F401 (imported once per worker)
    import triton  # noqa: F401

    run_ptxas_once(os.path.join(cache, "ptxas"))


def examples_matching(folder, pattern):
    """{name relative to the examples folder: path} for the examples whose file names match."""
    return {str(p.relative_to(folder)): p for p in sorted(folder.glob("lecture*/[0-9][0-9]_*.py"))
            if re.search(pattern, p.name)}


def source_key(call):
    """What load_inline compiles with nvcc: calls that agree on it build the same object."""
    return json.dumps({k: call.get(k) for k in (
        "name", "cuda_sources", "extra_cuda_cflags", "no_implicit_headers", "unreadable")})


class Progress:
    """Lines while the check runs: one as each example finishes on a target, each CUDA source,
    and a line at least every ``every`` seconds otherwise, with counts and the time so far."""

    def __init__(self, say, every=30.0):
        self.say, self.every = say, every
        self.start = self.last = time.perf_counter()
        self.compiles = self.done = self.cached = self.failed = 0
        self.cuda = self.cuda_done = 0

    def line(self, text):
        now = time.perf_counter()
        self.last = now
        elapsed = now - self.start
        counts = [f"{self.done}/{self.compiles} compiles"] if self.compiles else []
        if self.cached:
            counts[-1] += f" ({self.cached} from the results cache)"
        if self.cuda:
            counts.append(f"nvcc {self.cuda_done}/{self.cuda}")
        counts = " " + ", ".join(counts) if counts else ""
        self.say(f"[{int(elapsed // 60):2d}:{int(elapsed % 60):02d}]{counts}: {text}")

    def quiet(self):
        if time.perf_counter() - self.last >= self.every:
            self.line(f"running, {self.failed} failed or pruned so far")


def run_checks(examples, targets, jobs, use_nvcc, kernel_pattern=".", results_cache=None,
               say=lambda text: print(text, flush=True)):
    progress = Progress(say)
    with tempfile.TemporaryDirectory(prefix="gpu-compile-") as folder:
        # One snapshot of every example: the scan, the GPU view and Triton's reading of the
        # kernels' source must all see the same text, even if a file is edited meanwhile.
        snapshot = {rel: Path(folder) / "examples" / rel for rel in examples}
        for rel, path in examples.items():
            snapshot[rel].parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(path, snapshot[rel])
        scans = {rel: scan_example(path) for rel, path in snapshot.items()}
        cache = os.path.join(folder, "triton-cache")
        saved = os.environ.pop("TRITON_INTERPRET", None)  # the workers inherit the environment
        try:
            with ProcessPoolExecutor(jobs, mp_context=get_context("spawn"), initializer=worker_setup,
                                     initargs=(cache, str(results_cache or ""))) as pool:
                # First each example's launches on each target, specialised (seconds); then one
                # job per distinct compile, longest first, so that no worker is left with a queue.
                units = [(rel, str(snapshot[rel]), cc, tuple(k["name"] for k in kernels
                          if not k["called_by"] and re.search(kernel_pattern, k["name"])))
                         for rel, kernels in scans.items() for cc in targets]
                units = [unit for unit in units if unit[3]]
                progress.line(f"planning {len(units)} examples × targets with {jobs} workers "
                              "(each imports torch and triton first)")
                plan_jobs = [pool.submit(plan_example_on_target, *unit) for unit in units]
                cuda_jobs = {rel: pool.submit(load_inline_calls, path) for rel, path in snapshot.items()}
                plans = [job.result() for job in plan_jobs]
                cuda_calls = [(rel, call) for rel, job in cuda_jobs.items() for call in job.result()]
                work = {}  # (target, Triton's key) -> (cost, unit, position): each compiled once
                for unit, plan in zip(units, plans):
                    for position, (key, _, cost) in enumerate(plan["variants"]):
                        work.setdefault((unit[2], key), (cost, unit, position))
                distinct = {}  # the same CUDA source and flags are compiled once
                for rel, call in cuda_calls if use_nvcc else []:
                    distinct.setdefault(source_key(call), (rel, call))
                progress.compiles, progress.cuda = len(work), len(distinct)
                rows = sum(len(plan["variants"]) for plan in plans)
                progress.line(f"{len(units)} examples × targets planned: {rows} specialisations, "
                              f"{rows - len(work)} of them shared with another example, so "
                              f"{len(work)} compiles; {len(distinct)} CUDA sources for nvcc; {jobs} jobs")
                # nvcc on a source with torch's headers takes longest of all: it goes first.
                futures = {pool.submit(compile_cuda_source, rel, call, folder): ("nvcc", key)
                           for key, (rel, call) in distinct.items()}
                for job, (cost, unit, position) in sorted(work.items(), key=lambda item: item[1][0],
                                                          reverse=True):
                    futures[pool.submit(compile_planned, *unit, position, job[1])] = ("triton", job)
                outcomes, nvcc_done = {}, {}
                waiting = [len(plan["variants"]) for plan in plans]  # compiles each plan awaits
                users = {}  # (target, key) -> the plans that need it
                for i, (unit, plan) in enumerate(zip(units, plans)):
                    for key, _, _ in plan["variants"]:
                        users.setdefault((unit[2], key), []).append(i)
                per_target = [None] * len(plans)
                for i, plan in enumerate(plans):
                    if not plan["variants"]:
                        per_target[i] = finish_plan(plan, outcomes)
                pending = set(futures)
                while pending:
                    finished, pending = wait(pending, timeout=5, return_when=FIRST_COMPLETED)
                    for future in finished:
                        kind, job = futures[future]
                        if kind == "nvcc":
                            nvcc_done[job] = future.result()
                            progress.cuda_done += 1
                            source = nvcc_done[job]
                            when = "from the results cache" if source.get("cached") else \
                                f"{source.get('seconds', '-')} s"
                            progress.line(f"nvcc {source['example']} line {source['line']}: "
                                          f"{source['status']} ({when})")
                            continue
                        try:
                            outcomes[job] = future.result()
                        except Exception as error:  # noqa: BLE001 (a bug of the check, or a worker that died)
                            outcomes[job] = {"problem": "error",
                                             "reason": "the check itself failed: " + first_lines(error)}
                        progress.done += 1
                        progress.cached += bool(outcomes[job].get("cached"))
                        progress.failed += outcomes[job]["problem"] is not None
                        for i in users[job]:
                            waiting[i] -= 1
                            if waiting[i] == 0:
                                out = per_target[i] = finish_plan(plans[i], outcomes)
                                statuses = [c["status"] for c in out["compiles"]]
                                progress.line(f"sm_{out['target']} {out['example']}: {len(statuses)} "
                                              f"specialisations, {statuses.count('pruned')} pruned, "
                                              f"{statuses.count('failed')} failed")
                    progress.quiet()
                cuda, first = [], {}
                for rel, call in cuda_calls if use_nvcc else []:
                    cuda.append({**nvcc_done[source_key(call)], "example": rel, "line": call["line"]})
                    if source_key(call) in first:  # compiled once, for the first call
                        cuda[-1]["same_source_as"] = first[source_key(call)]
                    first.setdefault(source_key(call), f"{rel} line {call['line']}")
        finally:
            if saved is not None:
                os.environ["TRITON_INTERPRET"] = saved
    if not use_nvcc:
        cuda = [{"example": rel, "line": call["line"], "name": call.get("name"), "status": "skipped",
                 "reason": "--no-nvcc"} for rel, call in cuda_calls]
    return scans, per_target, cuda


def timing(compiles, cuda, seconds):
    """Where the time went: the CPU seconds of each distinct compile, in the workers and ptxas."""
    built = {(c["target"], c["key"]): c for c in compiles if "cpu_seconds" in c and not c.get("cached")}
    ran = [s for s in cuda if "cpu_seconds" in s and not s.get("cached") and "same_source_as" not in s]
    figures = {
        "seconds": seconds,
        "triton_cpu_seconds": round(sum(c["cpu_seconds"] for c in built.values()), 1),
        "ptxas_cpu_seconds": round(sum(c.get("ptxas_cpu_seconds") or 0 for c in built.values()), 1),
        "ptxas_reused": sum(bool(c.get("ptxas_reused")) for c in built.values()),
        "nvcc_cpu_seconds": round(sum(s["cpu_seconds"] for s in ran), 1),
        "from_results_cache": sum(bool(c.get("cached")) for c in compiles)
                              + sum(bool(s.get("cached")) for s in cuda if "same_source_as" not in s),
    }
    figures["text"] = (f"{seconds} s; CPU seconds in compiles: Triton {figures['triton_cpu_seconds']} "
                       f"(ptxas {figures['ptxas_cpu_seconds']}, reused for {figures['ptxas_reused']} "
                       f"identical PTX), nvcc {figures['nvcc_cpu_seconds']}; "
                       f"{figures['from_results_cache']} from the results cache")
    return figures


def coverage_failures(scans, per_target, targets):
    """A jit function that no launch compiled, itself or through a caller, fails."""
    compiled = {(r["example"], r["target"]): set() for r in per_target}
    for run in per_target:
        compiled[(run["example"], run["target"])].update(c["kernel"] for c in run["compiles"])
    failures = []
    for rel, kernels in scans.items():
        for kernel in kernels:
            for cc in targets:
                done = compiled.get((rel, cc), set())
                if kernel["name"] in done or done & set(kernel["called_by"]):
                    continue
                failures.append({"example": rel, "kernel": kernel["name"], "target": cc,
                                 "error": "never compiled: no GPU_LAUNCHES entry of the example "
                                          "launches it (or a kernel that calls it)"})
    return failures


def summarise(compiles, targets):
    per_target = {cc: sum(1 for c in compiles if c["target"] == cc) for cc in targets}
    counts = sorted(set(per_target.values()))
    shape = f"{counts[0]} specialisations × {len(targets)} targets" if len(counts) == 1 else \
        " + ".join(f"{n} for sm_{cc}" for cc, n in per_target.items())
    pruned = sum(c["status"] == "pruned" for c in compiles)
    failed = sum(c["status"] == "failed" for c in compiles)
    return shape, pruned, failed


def kernel_table(compiles, targets):
    """Per (example, kernel, target): ranges over its specialisations."""
    rows = []
    keys = sorted({(c["example"], c["kernel"]) for c in compiles})
    for example, kernel in keys:
        for cc in targets:
            group = [c for c in compiles if (c["example"], c["kernel"], c["target"]) == (example, kernel, cc)]
            built = [c for c in group if "registers" in c]
            fitting = [c for c in built if c["status"] == "ok"]
            if not group:
                continue
            occupancies = [c["occupancy"]["occupancy"] for c in fitting]
            rows.append({
                "example": example, "kernel": kernel, "target": cc,
                "specialisations": len(group), "pruned": sum(c["status"] == "pruned" for c in group),
                "failed": sum(c["status"] == "failed" for c in group),
                "registers": [min(c["registers"] for c in built), max(c["registers"] for c in built)] if built else None,
                "spill_bytes": max(c["spill_stores"] + c["spill_loads"] for c in built) if built else None,
                "shared": [min(c["shared"] for c in built), max(c["shared"] for c in built)] if built else None,
                "occupancy": [min(occupancies), max(occupancies)] if occupancies else None,
            })
    return rows


def span(pair, unit=""):
    if pair is None:
        return "-"
    low, high = pair
    return f"{low}{unit}" if low == high else f"{low}-{high}{unit}"


def percent_span(pair):
    return "-" if pair is None else span([round(100 * pair[0]), round(100 * pair[1])], " %")


def kib_span(pair):
    return "-" if pair is None else span([round(pair[0] / KIB, 1), round(pair[1] / KIB, 1)], " KiB")


def write_report(out, report):
    out.mkdir(parents=True, exist_ok=True)
    (out / "report.json").write_text(json.dumps(report, indent=1, default=str))
    lines = ["# Ahead-of-time compile check", "", f"**{report['summary']}**", ""]
    if report["failures"]:
        lines += ["## Failures", ""]
        lines += [f"- `{f['example']}` {f['kernel'] or ''} on sm_{f['target']}: {f['error']}"
                  if f.get("target") else f"- `{f['example']}`: {f['error']}" for f in report["failures"]]
        lines.append("")
    lines += ["## Registers, spills, shared memory and occupancy per kernel and target", "",
              "Ranges over the kernel's specialisations; occupancy over those that fit.", "",
              ("| example | kernel | target | specialisations | pruned | registers | spill bytes "
               "| shared memory | occupancy |"), "|---|---|---|---|---|---|---|---|---|"]
    for r in report["kernel_table"]:
        lines.append(f"| `{Path(r['example']).name}` | `{r['kernel']}` | sm_{r['target']} | "
                     f"{r['specialisations']} | {r['pruned']} | {span(r['registers'])} | "
                     f"{r['spill_bytes'] if r['spill_bytes'] is not None else '-'} | "
                     f"{kib_span(r['shared'])} | {percent_span(r['occupancy'])} |")
    lines += ["", "## Every specialisation", "",
              ("`div16:n` marks integer arguments the launcher specialises as divisible by 16, "
               "`n==1` those equal to 1."), "",
              ("| kernel | target | specialisation | status | registers | spills (B) | shared | "
               "blocks/SM | occupancy | limited by |"), "|---|---|---|---|---|---|---|---|---|---|"]
    for c in report["compiles"]:
        occ = c.get("occupancy") or {}
        lines.append(
            f"| `{c['kernel']}` | sm_{c['target']} | {c['specialisation']} | {c['status']} | "
            f"{c.get('registers', '-')} | {c.get('spill_stores', 0) + c.get('spill_loads', 0) if 'registers' in c else '-'} | "
            f"{round(c['shared'] / KIB, 1) if 'shared' in c else '-'} KiB | {occ.get('blocks_per_sm', '-')} | "
            f"{round(100 * occ['occupancy']) if occ else '-'} % | {occ.get('limited_by', c.get('reason') or '-')} |")
    lines += ["", "## CUDA sources passed to load_inline (nvcc)", "",
              "| example | line | status | kernel | arch | registers | spill bytes | seconds |",
              "|---|---|---|---|---|---|---|---|"]
    for s in report["cuda_sources"]:
        for k in s.get("kernels") or [{}]:
            spill = k.get("spill_stores", 0) + k.get("spill_loads", 0) if k else "-"
            lines.append(f"| `{Path(s['example']).name}` | {s['line']} | {s['status']} "
                         f"{s.get('reason') or ''} | `{k.get('kernel', '-')}` | {k.get('arch', '-')} | "
                         f"{k.get('registers', '-')} | {spill} | {s.get('seconds', '-')} |")
    lines += ["", "## Targets and the sources of their limits", "",
              "| target | GPUs | warps/SM | blocks/SM | registers/SM | shared/SM | shared/block (opt-in) |",
              "|---|---|---|---|---|---|---|"]
    for a in report["targets"].values():
        lines.append(f"| sm_{a['capability']} | {a['gpus']} | {a['max_warps_per_sm']} | "
                     f"{a['max_blocks_per_sm']} | {a['registers_per_sm'] // KIB} K | "
                     f"{a['shared_per_sm'] // KIB} KiB | {a['shared_per_block'] // KIB} KiB |")
    lines += [""] + [f"- {source}" for source in LIMIT_SOURCES]
    (out / "report.md").write_text("\n".join(lines) + "\n")


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=REPO / "_build" / "gpu-compile")
    parser.add_argument("--root", type=Path, default=REPO / "examples", help="the examples folder")
    parser.add_argument("--examples", default=".", help="regex over example file names")
    parser.add_argument("--kernels", default=".", help="regex over kernel names (a partial check)")
    parser.add_argument("--targets", default=",".join(map(str, ARCHS)),
                        help="compute capabilities, e.g. 90 or 75,80,89,90,100")
    parser.add_argument("--jobs", type=int, default=min(os.cpu_count() or 1, 4))
    parser.add_argument("--no-nvcc", action="store_true", help="skip the load_inline CUDA sources")
    parser.add_argument("--cache", type=Path, help="keep the figures of successful compiles here, "
                        "keyed by a hash of everything they depend on (default: compile everything)")
    args = parser.parse_args(argv)
    targets = [int(t) for t in args.targets.split(",")]
    unknown = [t for t in targets if t not in ARCHS]
    if unknown:
        parser.error(f"unknown targets {unknown}; known: {list(ARCHS)}")
    examples = examples_matching(args.root.resolve(), args.examples)
    start = time.perf_counter()
    scans, per_target, cuda = run_checks(examples, targets, args.jobs, not args.no_nvcc, args.kernels,
                                         args.cache)
    compiles = [c for run in per_target for c in run["compiles"]]
    failures = list({json.dumps(f, sort_keys=True): f for run in per_target for f in run["failures"]}.values())
    checked = {name: [k for k in kernels if re.search(args.kernels, k["name"])
                      or any(re.search(args.kernels, c) for c in k["called_by"])]
               for name, kernels in scans.items()}
    failures += coverage_failures(checked, per_target, targets)
    failures += [{"example": s["example"], "kernel": s["name"], "target": None,
                  "error": f"nvcc failed on the CUDA source of line {s['line']}:\n{s['reason']}"}
                 for s in cuda if s["status"] == "failed"]
    shape, pruned, failed = summarise(compiles, targets)
    nvcc_done = [s for s in cuda if s["status"] == "ok"]
    summary = (f"compiled {shape} = {len(compiles)}, {pruned} pruned, {failed} failed; "
               f"nvcc: {len(nvcc_done)} of {len(cuda)} CUDA sources × {len(NVCC_ARCHS)} archs; "
               f"{len(failures)} failures in all")
    seconds = round(time.perf_counter() - start, 1)
    report = {
        "summary": summary, "seconds": seconds, "timing": timing(compiles, cuda, seconds),
        "targets": {cc: asdict(ARCHS[cc]) | {"reserved_shared": ARCHS[cc].reserved_shared} for cc in targets},
        "limit_sources": LIMIT_SOURCES,
        "kernels": scans,
        "launches": {key: sum(r["launches"] for r in per_target if f"{r['example']}:sm_{r['target']}" == key)
                     for key in {f"{r['example']}:sm_{r['target']}" for r in per_target}},
        "skipped_statements": {r["example"]: r.get("skipped", []) for r in per_target},
        "compiles": compiles, "kernel_table": kernel_table(compiles, targets),
        "cuda_sources": cuda, "failures": failures,
    }
    write_report(args.out, report)
    for failure in failures:
        where = f" on sm_{failure['target']} ({ARCHS[failure['target']].gpus})" if failure["target"] else ""
        print(f"FAILED: {failure['kernel'] or 'example'} in {failure['example']}{where}: {failure['error']}")
    for s in cuda:
        if s["status"] == "skipped":
            print(f"Skipped nvcc for {s['example']} line {s['line']}: {s['reason']}.")
    print(summary)
    print(f"time: {report['timing']['text']}")
    print(f"report: {args.out / 'report.md'}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
