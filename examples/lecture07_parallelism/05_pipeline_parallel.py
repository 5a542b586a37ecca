"""
Pipeline parallel: GPipe, 1F1B, interleaving and the bubble
===========================================================

A model too deep for one GPU can be cut into consecutive *stages*, one per
rank, with activations sent forward and gradients sent back. We run the GPipe,
1F1B and interleaved 1F1B schedules of ``torch.distributed.pipelining`` on a
stack of linear layers, check them against the unsplit model, draw their
timelines, and
measure the idle time at the start and end of each step (the *bubble*) as the
number of micro-batches grows.

**Requirements.** On a CPU: gloo on loopback, 2 stages for the timings (one
core each) and 4 stages for the exact checks. On one GPU (T4 on Colab
included): the same, gloo on CPU ranks. With 4 or more CPU cores the timings
use 4 stages. With 2 or more GPUs: NCCL, one process per GPU, at larger sizes:
one stage per GPU (up to 8) for the timings, on a wider stack with larger and
more micro-batches, and up to 4 for the checks. The times describe what the
first line of output names: ranks on this machine's cores talking over
loopback, or GPUs talking over NCCL.
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
# The model is a stack of square linear layers with a GeLU between them; a
# stage is a run of consecutive layers. One micro-batch's forward through one
# stage is a few milliseconds of matmuls, large enough that the schedule's shape
# shows through the cost of sending each 128 KiB activation between processes;
# the take-away says how much of that cost remains in the measurement. With
# NCCL the layers are wider and the micro-batches larger, so that a GPU's
# matmuls still outlast the sends.

import copy
import math
import platform
import statistics

import matplotlib.pyplot as plt
from matplotlib.patches import Patch
from torch import nn
from torch.distributed.pipelining import (
    PipelineStage,
    Schedule1F1B,
    ScheduleGPipe,
    ScheduleInterleaved1F1B,
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


def synchronize(device):
    """Wait for the work queued on a GPU, so that the clock read next has seen it done."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def gpu_name(rank, world_size):
    return torch.cuda.get_device_name(rank)  # it initialises CUDA: only ever asked in a rank


CORES = os.cpu_count() or 1
LAYERS_PER_STAGE = 6
TIMED_STEPS = 3
SCHEDULES = {"GPipe": ScheduleGPipe, "1F1B": Schedule1F1B, "Int-1F1B": ScheduleInterleaved1F1B}
CHUNKS = {"GPipe": 1, "1F1B": 1, "Int-1F1B": 2}  # model chunks (stages) per rank: v
if USE_NCCL:
    TIMING_STAGES = min(torch.cuda.device_count(), 8)  # a stage per GPU
    CHECK_STAGES = min(torch.cuda.device_count(), 4)
    # A GPU runs a 512-wide layer in microseconds: wider layers and larger micro-batches keep
    # the matmuls longer than the sends and the schedule's own work.
    WIDTH, MICROBATCH_ROWS = 2048, 1024
    MICROBATCH_COUNTS = [1, 2, 4, 8, 16, 32, 64]
    DEVICE_NAME = f"{TIMING_STAGES} x {run_ranks(gpu_name, 1, backend=BACKEND)[0]}"
    print(f"backend: nccl (one process per GPU)   stages: {TIMING_STAGES} timed, {CHECK_STAGES} checked"
          f"   device: {DEVICE_NAME}")
else:
    TIMING_STAGES = 4 if CORES >= 4 else 2  # one core per busy rank, or the timings lie
    CHECK_STAGES = 4
    WIDTH = 512  # features per layer
    MICROBATCH_ROWS = 64
    MICROBATCH_COUNTS = [1, 2, 4, 8, 16]
    DEVICE_NAME = f"{platform.machine()} CPU, {CORES} cores"
    print(f"backend: gloo on CPU ranks (loopback)   stages: {TIMING_STAGES} timed, {CHECK_STAGES} checked"
          f"   device: {DEVICE_NAME}")
BACKEND_NAME = "nccl" if USE_NCCL else "gloo"
torch.manual_seed(0)


def layer_stack(layers, width, dtype):
    """``layers`` linear layers with a GeLU after each: the model we cut into stages."""
    blocks = []
    for _ in range(layers):
        blocks += [nn.Linear(width, width, dtype=dtype), nn.GELU()]
    return nn.Sequential(*blocks)


def stage_slice(model, stage, stages):
    """The consecutive layers of ``model`` that rank ``stage`` holds (a copy)."""
    per_stage = len(model) // stages
    return copy.deepcopy(model[stage * per_stage:(stage + 1) * per_stage])


class TimedStage(PipelineStage):
    """A pipeline stage that records when each micro-batch's forward and backward ran."""

    def __init__(self, module, stage_index, num_stages, device):
        super().__init__(module, stage_index, num_stages, device)
        self.timed_device = device
        self.events = []  # (kind, micro-batch, start, end, seconds on a core, stage)

    def _timed(self, kind, chunk, run):
        # CUDA spins while it waits when a process has fewer GPU contexts than the machine has
        # cores (its default), so on a GPU a forward's time on a core still tells if the rank had one.
        synchronize(self.timed_device)  # on a GPU: the received micro-batch has arrived
        start, start_on_core = time.perf_counter(), time.thread_time()
        output = run()
        synchronize(self.timed_device)  # on a GPU: its matmuls have run, not just been queued
        self.events.append((kind, chunk, start, time.perf_counter(),
                            time.thread_time() - start_on_core, self.stage_index))
        return output

    def forward_one_chunk(self, chunk, *args, **kwargs):
        return self._timed("F", chunk, lambda: super(TimedStage, self).forward_one_chunk(
            chunk, *args, **kwargs))

    def backward_one_chunk(self, chunk, *args, **kwargs):
        return self._timed("B", chunk, lambda: super(TimedStage, self).backward_one_chunk(
            chunk, *args, **kwargs))


def make_schedule(rank, ranks, model, schedule_name, microbatches):
    """The stages rank ``rank`` of ``ranks`` holds, on its device, and their schedule.

    With v chunks per rank the model is cut into v p stages, and rank r holds
    stages r, r + p, ..., spread along the model.
    """
    device, chunks = rank_device(rank), CHUNKS[schedule_name]
    stages = [TimedStage(stage_slice(model, index, chunks * ranks).to(device), index, chunks * ranks, device)
              for index in range(rank, chunks * ranks, ranks)]
    schedule_class = SCHEDULES[schedule_name]
    return stages, schedule_class(stages if chunks > 1 else stages[0], microbatches,
                                  loss_fn=nn.functional.mse_loss)


def train_step(rank, ranks, stages, schedule, inputs, targets):
    """One step: the first stage feeds the inputs, the last compares with the targets.

    Returns this step's (kind, micro-batch, start, end, seconds on a core, stage) events and, on
    the rank of the last stage, the micro-batches' losses.
    """
    for stage in stages:
        stage.events = []
    losses = []
    if rank == 0:
        schedule.step(inputs.to(stages[0].timed_device))
    elif rank == ranks - 1:
        schedule.step(target=targets.to(stages[0].timed_device), losses=losses)
    else:
        schedule.step()
    events = sorted((event for stage in stages for event in stage.events), key=lambda event: event[2])
    return events, [loss.item() for loss in losses]


# %%
# Predict: the bubble
# -------------------
# With :math:`p` stages and the batch cut into :math:`m` micro-batches, the
# last stage cannot start before the first micro-batch has crossed the other
# :math:`p-1` stages, and the first stage has nothing to do while the last
# backward comes back. If every stage takes the same time per micro-batch,
# each rank is idle for :math:`p-1` of the :math:`m+p-1` slots of a step
# (GPipe, Huang et al. 2019). 1F1B (one forward, one backward: from PipeDream,
# Narayanan et al. 2019, in the flushed form that Megatron-LM uses, Narayanan
# et al. 2021) reorders the same work, a backward as soon as one is possible,
# so its bubble is the same; what it saves is memory, as the last section
# counts. The interleaved 1F1B of Narayanan et al. (2021) cuts the model into
# :math:`v p` smaller stages and gives rank :math:`r` the stages
# :math:`r, r + p, \dots`: a micro-batch passes each rank :math:`v` times, in
# slots :math:`v` times shorter, and the idle slots at the two ends shrink
# with them, to a bubble of :math:`\frac{(p-1)/v}{m + (p-1)/v}`, for
# :math:`v` times as many sends. Here :math:`v = 2` (``Int-1F1B``).


def predicted_bubble(stages, microbatches, chunks=1):
    return (stages - 1) / chunks / (microbatches + (stages - 1) / chunks)


print(f"predicted bubble, p = {TIMING_STAGES}:  "
      + "  ".join(f"m={m}: {predicted_bubble(TIMING_STAGES, m):.3f}" for m in MICROBATCH_COUNTS))
print(f"interleaved, v = {CHUNKS['Int-1F1B']}:       "
      + "  ".join(f"m={m}: {predicted_bubble(TIMING_STAGES, m, CHUNKS['Int-1F1B']):.3f}"
                  for m in MICROBATCH_COUNTS))


# %%
# Check: the pipeline computes what the unsplit model computes
# ------------------------------------------------------------
# Four ranks (one per GPU if there are fewer) of two layers each (two stages
# of one layer under ``Int-1F1B``), on an
# awkward width, in float64. Each rank runs one step of each schedule and one
# SGD update on its own layers; the parent compares the losses, gradients and
# updated weights with one process running the whole model on the whole batch. The schedules average the
# micro-batches' gradients (``scale_grads=True``), so the two should agree to
# rounding: the tolerance bounds it element by element, by running error
# analysis (Higham 2002, chapter 3). A sum of n terms, in any order and split
# over micro-batches or not, is off by at most n float64 rounding steps of the
# sum of its terms' absolute values. Each such rounding reaches the loss and
# the gradients through the network's Jacobian, row by row, and the bound
# follows it there as :math:`|J|` times the rounding's own bound. Carried
# through :math:`|W|` layer after layer instead, it would grow by the row sums
# of :math:`|W|` at every layer, forward and back, until the first layers'
# gradients could be rounded to float32 and still pass.

CHECK_WIDTH, CHECK_ROWS_PER_MICROBATCH, CHECK_MICROBATCHES = 37, 5, 8
LEARNING_RATE = 0.1


def check_worker(rank, ranks, model, inputs, targets, microbatches):
    results = {}
    for schedule_name in SCHEDULES:
        stages, schedule = make_schedule(rank, ranks, model, schedule_name, microbatches)
        events, losses = train_step(rank, ranks, stages, schedule, inputs, targets)
        grads, weights = {}, {}
        for stage in stages:  # by stage index: the parent puts the model back in order
            grads[stage.stage_index] = [p.grad.clone().cpu() for p in stage.submod.parameters()]
            with torch.no_grad():
                for p in stage.submod.parameters():
                    p -= LEARNING_RATE * p.grad
            weights[stage.stage_index] = [p.detach().clone().cpu() for p in stage.submod.parameters()]
        results[schedule_name] = {"events": events, "losses": losses, "grads": grads, "weights": weights}
    return results


def reference_step(model, inputs, targets):
    """The unsplit model on the whole batch: loss, gradients and updated weights."""
    model = copy.deepcopy(model)
    loss = nn.functional.mse_loss(model(inputs), targets)
    loss.backward()
    grads = [p.grad.clone() for p in model.parameters()]
    with torch.no_grad():
        for p in model.parameters():
            p -= LEARNING_RATE * p.grad
    return loss.item(), grads, [p.detach().clone() for p in model.parameters()]


def gelu_slope(z):
    """GeLU's derivative, Phi(z) + z phi(z): at most 1.13 in size, its own derivative at most 0.8."""
    return 0.5 * (1 + torch.erf(z / math.sqrt(2))) + z * torch.exp(-z.square() / 2) / math.sqrt(2 * math.pi)


def carried(sources, matrix):
    """Each (Jacobian, local bound) pair carried one step on: the Jacobian times ``matrix``."""
    return [(matrix @ jacobian, local) for jacobian, local in sources]


def new_source(local):
    """A rounding's bound where it happens, each row's Jacobian there the identity."""
    rows, width = local.shape
    return torch.eye(width, dtype=local.dtype).expand(rows, width, width), local


def bound_of(sources):
    """Each row's first-order bound here: the sum over the roundings so far of |J| times their bound."""
    return sum((jacobian.abs() @ local.unsqueeze(-1)).squeeze(-1) for jacobian, local in sources)


@torch.no_grad()
def rounding_bounds(model, inputs, targets):
    """The mean squared error and each gradient are within 2**-53 times these bounds of the exact ones.

    Running error analysis, to first order. Each operation's own rounding is
    bounded where it happens: a sum of n products a_k w_k by n sum |a_k w_k|
    rounding steps, in any order of the sum; GeLU and its slope by 8 steps each.
    It reaches a later value through the row's Jacobian J, so that value is off
    by at most the sum of |J| times those bounds, the tightest first-order bound
    they allow; the product of the layers' |W| instead grows by their row sums,
    about 3 here, at every layer. Returns the loss's bound and a list of the
    parameters' bounds, in the order of ``parameters()``.
    """
    values, errors, sources = [inputs], [torch.zeros_like(inputs)], []  # each layer's input, its bound, the roundings
    for layer in model:
        a = values[-1]
        if isinstance(layer, nn.Linear):
            sources = carried(sources, layer.weight)
            local = (layer.in_features + 1) * (a.abs() @ layer.weight.abs().T + layer.bias.abs())
        else:
            sources = carried(sources, torch.diag_embed(gelu_slope(a)))
            local = 8 * a.abs()
        sources.append(new_source(local))
        values.append(layer(a))
        errors.append(bound_of(sources))
    rows, count, difference = inputs.shape[0], targets.numel(), values[-1] - targets
    difference_error = errors[-1] + difference.abs()
    loss_error = (2 * difference.abs() * difference_error + (count + 4) * difference.square()).sum() / count
    grad = 2 * difference / count  # the loss's gradient by the output, and the bound of its rounding
    sources = [new_source(2 * (difference_error + 3 * difference.abs()) / count)]
    bounds = {}
    for index in reversed(range(len(model))):
        layer, a, e = model[index], values[index], errors[index]
        if isinstance(layer, nn.Linear):
            grad_error = bound_of(sources)
            # Sums over the batch, whole or by micro-batch, with the mean's scalings.
            bounds[f"{index}.weight"] = (grad_error.T @ a.abs() + grad.abs().T @ e
                                         + (rows + 4) * grad.abs().T @ a.abs())
            bounds[f"{index}.bias"] = grad_error.sum(0) + (rows + 4) * grad.abs().sum(0)
            sources = carried(sources, layer.weight.T)
            sources.append(new_source(layer.out_features * grad.abs() @ layer.weight.abs()))
            grad = grad @ layer.weight
        else:
            slope = gelu_slope(a)
            sources = carried(sources, torch.diag_embed(slope))
            sources.append(new_source(grad.abs() * (0.8 * e + 8) + (grad * slope).abs()))
            grad = grad * slope
    return loss_error.item(), [bounds[name] for name, _ in model.named_parameters()]


def assert_matches(name, got, want, bound):
    """Both sides are within 2**-53 * bound of the exact value: apart by at most twice that."""
    use = (got - want) / (2 * 2**-53 * bound)
    torch.testing.assert_close(use, torch.zeros_like(use), rtol=0, atol=1.0,
                               msg=lambda m: f"{name} (difference over its bound): {m}")


if CAN_RUN_RANKS:
    check_model = layer_stack(2 * CHECK_STAGES, CHECK_WIDTH, torch.float64)
    check_inputs = torch.randn(CHECK_ROWS_PER_MICROBATCH * CHECK_MICROBATCHES, CHECK_WIDTH,
                               dtype=torch.float64)
    check_targets = torch.randn_like(check_inputs)
    check_results = run_ranks(check_worker, CHECK_STAGES, check_model, check_inputs,
                              check_targets, CHECK_MICROBATCHES, backend=BACKEND)
    want_loss, want_grads, want_weights = reference_step(check_model, check_inputs, check_targets)
    loss_bound, grad_bounds = rounding_bounds(check_model, check_inputs, check_targets)
    # w - lr g rounds twice, and carries lr times the gradient's error. Those two roundings alone
    # can leave the two sides a unit in the last place apart, nearly all of the bound: allowed twice.
    weight_bounds = [2 * (LEARNING_RATE * (b + g.abs()) + w.abs())
                     for b, g, w in zip(grad_bounds, want_grads, want_weights)]
    for schedule_name in SCHEDULES:
        per_rank = [result[schedule_name] for result in check_results]
        pipeline_loss = statistics.fmean(per_rank[-1]["losses"])  # equal micro-batches
        got_grads = [g for _, grads in sorted(item for result in per_rank for item in result["grads"].items())
                     for g in grads]
        got_weights = [w for _, weights in sorted(item for result in per_rank
                                                  for item in result["weights"].items()) for w in weights]
        assert len(got_grads) == len(want_grads), "the stages do not hold every layer once"
        assert_matches(f"{schedule_name}: pipeline loss", *(torch.tensor(value, dtype=torch.float64)
                                                             for value in (pipeline_loss, want_loss, loss_bound)))
        for i, (got, want, bound) in enumerate(zip(got_grads, want_grads, grad_bounds)):
            assert_matches(f"{schedule_name} gradient {i}", got, want, bound)
        for i, (got, want, bound) in enumerate(zip(got_weights, want_weights, weight_bounds)):
            assert_matches(f"{schedule_name} weight {i}", got, want, bound)
        worst = max(((g - w).abs().max() / w.abs().max()).item()
                    for g, w in zip(got_grads, want_grads))
        print(f"{schedule_name:8s} {CHECK_STAGES} ranks x {CHECK_MICROBATCHES} micro-batches: "
              f"loss {pipeline_loss:.12f} (unsplit {want_loss:.12f}), "
              f"worst gradient difference {worst:.1e} of its largest entry")
else:
    skip_or_fail("the pipeline examples", "distributed", WHY_NOT)


# %%
# Measure: the schedules' timelines
# -------------------------------------
# Now the float32 stack that keeps each rank busy for milliseconds per
# micro-batch. For every schedule and micro-batch count each rank runs one
# warm-up step and then a few timed steps, recording when each forward (F) and
# backward (B) started and ended. ``time.perf_counter`` reads the same
# monotonic clock in every process on Linux, so the ranks' bars share one axis;
# on a GPU a rank synchronises with it before each reading, so that a bar spans
# the GPU's work, not only its launch.
# The micro-batch size is fixed: a larger :math:`m` is a larger batch, and the
# work per micro-batch stays the same.


def microbatch_counts(schedule_name, stages):
    """Schedule1F1B needs at least one micro-batch per rank; Int-1F1B is timed on the same m, GPipe on all."""
    return [m for m in MICROBATCH_COUNTS if schedule_name == "GPipe" or m >= stages]


def timing_worker(rank, ranks, model):
    torch.manual_seed(1 + rank)
    steps = {}
    for schedule_name in SCHEDULES:
        for microbatches in microbatch_counts(schedule_name, ranks):
            inputs = torch.randn(MICROBATCH_ROWS * microbatches, WIDTH, device=rank_device(rank))
            targets = torch.randn_like(inputs)
            stages, schedule = make_schedule(rank, ranks, model, schedule_name, microbatches)
            timed = []
            for _ in range(1 + TIMED_STEPS):  # the first step also sets the stage up
                dist.barrier()  # all ranks start the step together
                events, _ = train_step(rank, ranks, stages, schedule, inputs, targets)
                for stage in stages:
                    stage.submod.zero_grad()
                timed.append(events)
            steps[schedule_name, microbatches] = timed[1:]
    return steps


def step_of(timing_results, schedule_name, microbatches, index):
    """The ranks' events of one timed step."""
    return [result[schedule_name, microbatches][index] for result in timing_results]


def makespan(step):
    """Seconds from the first event's start on any rank to the last event's end."""
    starts = [start for events in step for _, _, start, *_ in events]
    ends = [end for events in step for _, _, _, end, *_ in events]
    return max(ends) - min(starts)


def least_disturbed_step(timing_results, schedule_name, microbatches):
    """The shortest of the timed steps: other processes on the machine slowed it least."""
    return min((step_of(timing_results, schedule_name, microbatches, i) for i in range(TIMED_STEPS)),
               key=makespan)


def draw_timeline(ax, ranks_events, title):
    """One row of F and B bars per rank, in ms from the step's first event."""
    origin = min(start for events in ranks_events for _, _, start, *_ in events)
    colours = {"F": ("tab:blue", "lightsteelblue"), "B": ("tab:orange", "burlywood")}
    ranks = len(ranks_events)
    for rank, events in enumerate(ranks_events):
        for kind, chunk, start, end, _, stage in events:
            left, width = 1e3 * (start - origin), 1e3 * (end - start)
            # A rank's later model chunk (interleaved) in the lighter shade.
            ax.broken_barh([(left, width)], (rank - 0.4, 0.8), facecolors=colours[kind][stage // ranks],
                           edgecolor="white")
            ax.text(left + width / 2, rank, str(chunk), ha="center", va="center",
                    fontsize="x-small", color="white")
    ax.set_yticks(range(len(ranks_events)), labels=[f"rank {r}" for r in range(len(ranks_events))])
    ax.invert_yaxis()
    ax.set_xlabel("time in the step (ms)")
    ax.set_title(title, fontsize="medium")


if CAN_RUN_RANKS:
    timing_model = layer_stack(LAYERS_PER_STAGE * TIMING_STAGES, WIDTH, torch.float32)
    start = time.perf_counter()
    # A sweep of schedules and micro-batch counts: on a loaded machine it takes minutes, not seconds.
    timing_results = run_ranks(timing_worker, TIMING_STAGES, timing_model, timeout_s=300, backend=BACKEND)
    print(f"timed {(1 + TIMED_STEPS) * len(timing_results[0])} steps per rank "
          f"in {time.perf_counter() - start:.1f} s")

    shown_m = min(m for m in MICROBATCH_COUNTS if m >= 2 * TIMING_STAGES)
    fig, axes = plt.subplots(len(SCHEDULES), 1, figsize=(9, 0.4 + 1.8 * len(SCHEDULES) * (0.4 + 0.3 * TIMING_STAGES)),
                             sharex=True)
    for ax, schedule_name in zip(axes, SCHEDULES):
        step = least_disturbed_step(timing_results, schedule_name, shown_m)
        draw_timeline(ax, step, f"{schedule_name}, p = {TIMING_STAGES}, m = {shown_m}")
    fig.legend(handles=[Patch(color="tab:blue", label="forward (F)"),
                        Patch(color="tab:orange", label="backward (B)")],
               loc="lower center", ncol=2, frameon=False)
    fig.suptitle(f"Measured pipeline schedules, {BACKEND_NAME} on {DEVICE_NAME}", fontsize="medium")
    fig.tight_layout(rect=(0, 0.08, 1, 1))

# %%
# The white gaps are the bubble. In GPipe every rank runs all forwards, then
# all backwards, in micro-batch order; in 1F1B the first stage starts the
# backward of micro-batch 0 as soon as its gradient comes back, and then
# alternates. Both leave the same idle time at the start and the end of the
# step. The interleaved schedule's bars are half as long, each rank's second
# model chunk in the lighter shade, and a micro-batch crosses every rank twice.
# A backward takes about twice as long as a forward: it computes the
# gradients of both the inputs and the weights.
#
# Measure: the bubble against the number of micro-batches
# -------------------------------------------------------
# The measured bubble of a step is the fraction of the step's span (first
# start to last end on any rank) that the ranks spent outside their stage's
# forward and backward, averaged over the ranks. It includes the time spent
# sending activations and gradients, which the formula leaves out.
#
# To tell the two apart, each timed step is also *replayed*: every rank keeps
# its order of operations and their measured durations, but a send takes no
# time, so an operation starts as soon as its rank is free and its input
# exists. Replayed with a forward of 1 s and a backward of 2 s on every rank,
# torch's order of operations gives exactly the formula of its schedule (the
# code asserts it for every schedule and :math:`m`): the formula is this
# replay with equal durations. So the table's three columns split the measured bubble into
# its causes: *formula* to *replayed* is what unequal durations add (one rank's
# backward running longer than another's), *replayed* to *measured* is what the
# sends, and the waits for them, add. The replay can never take longer than
# the step did, which is asserted too.
# ``Schedule1F1B`` needs at least one micro-batch per rank, so its points
# start at :math:`m = p`. GPipe runs forward after forward while its sends are
# still in flight, and gloo moves them on threads of its own, which need a
# core too; so GPipe's bubble, and the interleaved schedule's, which sends
# twice as often, are compared with the prediction only where the machine has
# a spare core per rank (with NCCL, the GPUs move them: always), and none is
# compared when other processes held the cores during the
# timing (the printout says which).


def on_core_fraction(step):
    """Seconds the ranks' compute ran on a core over the seconds it took.

    On a GPU only the forwards count: autograd runs a CUDA backward on its own
    device thread, whose time on a core ``time.thread_time`` does not see.
    """
    timed = [event for events in step for event in events if not USE_NCCL or event[0] == "F"]
    return sum(on_core for *_, on_core, _ in timed) / sum(end - start for _, _, start, end, *_ in timed)


def measured_bubble(step):
    busy = [sum(end - start for _, _, start, end, *_ in events) for events in step]
    return 1 - statistics.fmean(busy) / makespan(step)


def replayed_step(step):
    """The same step with every send instantaneous: each rank keeps its order of
    operations and their measured durations, and an operation starts as soon as
    the rank is free and its input exists (a forward needs the previous stage's
    forward of that micro-batch, a backward the next stage's backward)."""
    last = max(stage for events in step for *_, stage in events)
    origin = min(start for events in step for _, _, start, *_ in events)
    ends, replayed = {}, [[] for _ in step]
    while any(len(done) < len(events) for done, events in zip(replayed, step)):
        progressed = False
        for rank, events in enumerate(step):
            while len(replayed[rank]) < len(events):
                kind, chunk, start, end, on_core, stage = events[len(replayed[rank])]
                needs = [(kind, stage - 1, chunk)] if kind == "F" and stage > 0 else []
                needs += [(kind, stage + 1, chunk)] if kind == "B" and stage < last else []
                if any(need not in ends for need in needs):
                    break  # wait for the other rank's replay to get there
                free = replayed[rank][-1][3] if replayed[rank] else origin
                begin = max([free, *(ends[need] for need in needs)])
                ends[kind, stage, chunk] = begin + (end - start)
                replayed[rank].append((kind, chunk, begin, begin + (end - start), on_core, stage))
                progressed = True
        assert progressed, "the ranks' orders of operations wait on each other"
    return replayed


def idealised_step(step):
    """The step's order of operations with a forward lasting 1 s and a backward 2 s on every rank."""
    return [[(kind, chunk, 0.0, 1.0 if kind == "F" else 2.0, 0.0, stage) for kind, chunk, *_, stage in events]
            for events in step]


if CAN_RUN_RANKS:
    timed_steps = {(name, m): least_disturbed_step(timing_results, name, m)
                   for name in SCHEDULES for m in microbatch_counts(name, TIMING_STAGES)}
    bubbles = {key: measured_bubble(step) for key, step in timed_steps.items()}
    replayed = {key: measured_bubble(replayed_step(step)) for key, step in timed_steps.items()}
    for (name, m), step in timed_steps.items():
        # torch's order of operations, with equal durations and free sends, is the formula's step.
        ideal = measured_bubble(replayed_step(idealised_step(step)))
        assert abs(ideal - predicted_bubble(TIMING_STAGES, m, CHUNKS[name])) < 1e-12, (name, m, ideal)
        # The replay relaxes only the sends, so it can never take longer than the step did.
        assert replayed[name, m] <= bubbles[name, m] + 1e-9, (name, m, replayed[name, m], bubbles[name, m])
    print(f"{'':4}" + "".join(f"{name:>27}" for name in SCHEDULES))
    print(f"{'m':>4}" + f"{'formula':>9}{'replayed':>9}{'measured':>9}" * len(SCHEDULES))
    for m in MICROBATCH_COUNTS:
        cells = "".join(
            f"{predicted_bubble(TIMING_STAGES, m, CHUNKS[name]):9.3f}{replayed[name, m]:9.3f}{bubbles[name, m]:9.3f}"
            if (name, m) in bubbles else f"{'-':>9}{'-':>9}{'-':>9}" for name in SCHEDULES)
        print(f"{m:4d}{cells}")

    # On a shared machine a rank can lose its core mid-matmul: then the ranks take
    # turns instead of overlapping, and the bubble measures the queue for a core.
    on_core = min(on_core_fraction(least_disturbed_step(timing_results, name, m))
                  for name, m in bubbles)
    print(f"ranks' time on a core while computing: at least {on_core:.0%} of their busy time")

    fig, ax = plt.subplots(figsize=(6.5, 4))
    many_m = torch.logspace(0, 5, 100, base=2).tolist()
    ax.plot(many_m, [predicted_bubble(TIMING_STAGES, m) for m in many_m], color="black",
            label="predicted (p-1)/(m+p-1)")
    ax.plot(many_m, [predicted_bubble(TIMING_STAGES, m, CHUNKS["Int-1F1B"]) for m in many_m], color="black",
            linestyle="--", label="predicted, interleaved, v = 2")
    for name, marker in zip(SCHEDULES, "os^"):
        counts = microbatch_counts(name, TIMING_STAGES)
        ax.plot(counts, [bubbles[name, m] for m in counts], marker, label=f"measured, {name}")
    ax.set_xscale("log", base=2)
    ax.set_xticks(MICROBATCH_COUNTS, labels=[str(m) for m in MICROBATCH_COUNTS])
    ax.set_xlabel("micro-batches per step m")
    ax.set_ylabel("bubble (fraction of the step idle)")
    ax.set_ylim(0, None)
    ax.set_title(f"Bubble, p = {TIMING_STAGES} stages, {BACKEND_NAME} on {DEVICE_NAME}\n"
                 f"ranks on a core for at least {on_core:.0%} of their compute", fontsize="medium")
    ax.legend(frameon=False)
    fig.tight_layout()

    # GPipe's sends stay in flight while it computes, and the interleaved schedule sends v times
    # as often; gloo moves them on threads of its own, which need a core beside each computing
    # rank (NCCL, on the GPU).
    compared = [name for name in SCHEDULES
                if name == "1F1B" or USE_NCCL or CORES >= 2 * TIMING_STAGES]
    if on_core < 0.9:
        print("Other processes took this machine's cores during the timing: the measured "
              "bubble is not compared with the prediction.")
        compared = []
    elif compared == ["1F1B"]:
        print(f"GPipe's and Int-1F1B's bubbles are not compared: {CORES} cores leave no spare core per rank "
              f"for gloo's sending threads beside {TIMING_STAGES} computing ranks.")
    for name in compared:
        counts = microbatch_counts(name, TIMING_STAGES)
        assert bubbles[name, counts[-1]] < 0.7 * bubbles[name, counts[0]], (
            f"{name}: the bubble did not shrink with more micro-batches: {bubbles}")
        print(f"{name}: the measured bubble shrinks from m = {counts[0]} to m = {counts[-1]}, "
              f"as predicted")


# %%
# Memory: micro-batches in flight
# -------------------------------
# A stage keeps a micro-batch's activations from its forward until its
# backward. From the check run's events (its stages, 8 micro-batches) we count,
# on each rank, the most micro-batches whose forward had run and whose backward
# had not. GPipe holds all :math:`m` of them on every rank; 1F1B holds at most
# :math:`p` (on stage :math:`r`, :math:`p-r`), however large :math:`m` grows.
# That is why 1F1B, with the same bubble, allows the many micro-batches that
# make the bubble small. The interleaved schedule warms up with more, smaller
# forwards: when :math:`p` divides :math:`m`, rank :math:`r` runs
# :math:`2(p-1-r) + (v-1)p` of them, and one more before its first backward,
# so it holds one more than that (at most all :math:`vm` of its forwards),
# each of :math:`1/v` of its layers. On rank 0 that is
# :math:`(2p + (v-1)p - 1)/v` micro-batches' worth of its layers against
# 1F1B's :math:`p`: interleaving buys its smaller bubble with more sends and
# somewhat more memory.


def peak_in_flight(events):
    held = peak = 0
    for kind, *_ in events:
        held += 1 if kind == "F" else -1
        peak = max(peak, held)
    return peak


if CAN_RUN_RANKS:
    peaks = {name: [peak_in_flight(result[name]["events"]) for result in check_results]
             for name in SCHEDULES}
    print(f"peak micro-batches in flight, p = {CHECK_STAGES}, m = {CHECK_MICROBATCHES}")
    print(f"{'rank':>6} " + " ".join(f"{name:>9}" for name in SCHEDULES))
    for rank in range(CHECK_STAGES):
        print(f"{rank:6d} " + " ".join(f"{peaks[name][rank]:9d}" for name in SCHEDULES))
    assert peaks["GPipe"] == [CHECK_MICROBATCHES] * CHECK_STAGES, peaks
    assert peaks["1F1B"] == [min(CHECK_MICROBATCHES, CHECK_STAGES - r)
                             for r in range(CHECK_STAGES)], peaks
    assert max(peaks["1F1B"]) <= CHECK_STAGES < CHECK_MICROBATCHES
    # Interleaved: 2(p-1-r) + (v-1) q warm-up forwards of chunks, q the micro-batches per round (p when
    # p divides m), then one more before the first backward, at most the rank's v m forwards (each of a
    # rank's chunks holds 1/v of its layers).
    v, q = CHUNKS["Int-1F1B"], CHECK_MICROBATCHES // max(1, CHECK_MICROBATCHES // CHECK_STAGES)
    assert peaks["Int-1F1B"] == [min(v * CHECK_MICROBATCHES, 2 * (CHECK_STAGES - 1 - r) + (v - 1) * q + 1)
                                 for r in range(CHECK_STAGES)], peaks
    print(f"Int-1F1B counts chunks of 1/{v} of a rank's layers: rank 0 holds {peaks['Int-1F1B'][0] / v:g} "
          f"micro-batches' worth of its layers, 1F1B {peaks['1F1B'][0]}")


# %%
# What to take away
# -----------------
# * Cutting a model into stages changes nothing in the arithmetic: all three
#   schedules produce the unsplit model's loss, gradients and weights, as the
#   check above asserts to rounding in float64.
# * The bubble is the price of the pipeline: with :math:`p` stages it falls
#   like :math:`(p-1)/(m+p-1)` only as the micro-batch count :math:`m` grows.
#   Expect the measured bubble above the prediction: it also contains the
#   sends and receives and the schedule's own bookkeeping, which the formula
#   leaves out, and on a small CPU model these are not negligible next to a
#   few milliseconds of matmuls. The replay separates them from the unequal
#   durations of the operations: on a CPU, gloo's sending threads compete with
#   the ranks for the cores, so the sends take a large part of the gap there.
#   On a machine whose cores are busy with other
#   work the ranks take turns instead of overlapping, and the measurement says
#   so instead of comparing.
# * GPipe stores all :math:`m` micro-batches' activations at once; 1F1B stores
#   at most :math:`p`. That is what makes a large :math:`m`, and so a small
#   bubble, affordable in memory.
# * With NCCL the stages talk over the GPUs' links (NVLink or PCIe inside a
#   machine, InfiniBand between machines), and the compute per micro-batch is
#   far larger, so the send time matters less. The interleaved schedule,
#   which gives each rank several smaller stages, divides the bubble's idle
#   time by :math:`v` at the cost of :math:`v` times the sends (Narayanan et
#   al. 2021): its replay with equal durations is the formula, asserted
#   above, but on CPU ranks over gloo the extra sends can cost more than the
#   bubble saves, which is why it is compared only where the sends have cores
#   or GPUs of their own. The timings here describe what the first line of
#   output names, nothing more.

KEY_FIGURES = {"device": DEVICE_NAME, "stages_timed": TIMING_STAGES}
if CAN_RUN_RANKS:
    largest_m = MICROBATCH_COUNTS[-1]
    KEY_FIGURES.update({
        f"bubble_predicted_m{largest_m}": predicted_bubble(TIMING_STAGES, largest_m),
        **{f"bubble_measured_{name}_m{largest_m}": bubbles[name, largest_m] for name in SCHEDULES},
        "bubble_measured_GPipe_m1": bubbles["GPipe", 1],
        **{f"peak_in_flight_{name}_rank0": peaks[name][0] for name in SCHEDULES},
    })
