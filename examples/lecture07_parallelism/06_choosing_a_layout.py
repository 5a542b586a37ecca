"""
Choosing a layout: memory and communication of DP, TP, CP, PP, EP and FSDP
===========================================================================

Given a model and a cluster, which mix of data, tensor, context, pipeline and
expert parallelism (and how much ZeRO sharding) fits in GPU memory, and which
spends the least time communicating? We write a small planner that answers
this with the memory accounting and the alpha-beta cost model of this
lecture, apply it to Llama 2 7B and 70B on nodes of eight H200 GPUs, check its
picks against layouts published for Llama 3 models, a long-context run among
them, place the experts of a mixture-of-experts model, and then test the cost
model where we can: we fit alpha and beta on this machine, predict the
communication time of a data-parallel and a tensor-parallel step, and measure
it.

**Requirements.** The planner is arithmetic and runs anywhere; its cluster
figures are a model built from NVIDIA's datasheets, not a measurement. The
check at small scale uses gloo on loopback with 2 CPU ranks (on a single GPU,
T4 on Colab included, the same: gloo on CPU ranks). With 2 or more GPUs:
NCCL, one process per GPU, at larger sizes (larger messages and models). Its
numbers describe the machine that ran it, as the first line of output names
it, not a GPU cluster.
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

import itertools
import platform

import matplotlib.pyplot as plt
from torch import nn


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


# The same size on GPUs: wider blocks add up longer float32 sums than the check's tolerance allows.
TP_BLOCKS, TP_WIDTH, TP_FFN, TP_ROWS = 4, 256, 1024, 64
if USE_NCCL:
    SWEEP_BYTES = [2 ** k for k in range(8, 29, 2)]  # 256 B to 256 MiB
    DP_WIDTHS = [1024, 2048, 2048, 1024]  # 8, 17 and 8 MB of weights
    DP_ROWS = 96
    # As many ranks as GPUs (up to 8), if the batch and the hidden width split that many ways.
    CHECK_RANKS = max(n for n in range(2, min(torch.cuda.device_count(), 8) + 1)
                      if DP_ROWS % n == 0 and TP_FFN % n == 0)
    DEVICE_NAME = f"{CHECK_RANKS} x {run_ranks(gpu_name, 1, backend=BACKEND)[0]}"
    CHECK_LINK = "nccl"
    print(f"planner: a model of 8 x H200 nodes (datasheet figures)   check: nccl (one process per "
          f"GPU), {CHECK_RANKS} ranks, {DEVICE_NAME}")
else:
    SWEEP_BYTES = [2 ** k for k in range(8, 25, 2)]  # 256 B to 16 MiB
    DP_WIDTHS = [384, 1000, 1000, 384]  # a three-layer MLP: 1.5, 4 and 1.5 MB of weights
    DP_ROWS = 48
    CHECK_RANKS = 2
    DEVICE_NAME = f"{platform.machine()} CPU, {os.cpu_count()} cores"
    CHECK_LINK = "gloo, loopback"
    print(f"planner: a model of 8 x H200 nodes (datasheet figures)   check: gloo on CPU ranks "
          f"(loopback), 2 ranks, {DEVICE_NAME}")
BACKEND_NAME = "nccl" if USE_NCCL else "gloo"
torch.manual_seed(0)

# %%
# The model and the cluster, with sources
# ---------------------------------------
# The shapes are those of the released Llama 2 models (Touvron et al. 2023:
# 4096-token context, grouped-query attention with 8 key-value heads in 70B;
# layers, widths and vocabulary from the models' published configurations).
# The cluster is a model of DGX H200 nodes: 8 H200 GPUs with 141 GB of HBM3e
# each, joined by NVLink at 900 GB/s per GPU (both directions together, so 450
# GB/s each way), and 8 ConnectX-7 adapters per node at up to 400 Gb/s
# InfiniBand, one per GPU (NVIDIA's H200 and DGX H200 datasheets): 50 GB/s
# each way through one adapter, 400 GB/s out of the node through all eight.
# The datasheet's BF16 tensor-core rate, 1979 TFLOP/s, is quoted with sparsity;
# dense is half. The per-message latencies are assumptions, not datasheet
# figures; they matter only for small messages.

LLAMA2 = {
    "Llama 2 7B": {"layers": 32, "hidden": 4096, "heads": 32, "kv_heads": 32, "ffn": 11008,
                   "vocab": 32000, "nominal_params": 7e9},
    "Llama 2 70B": {"layers": 80, "hidden": 8192, "heads": 64, "kv_heads": 8, "ffn": 28672,
                    "vocab": 32000, "nominal_params": 70e9},
}
H200_CLUSTER = {
    "gpus_per_node": 8,
    "memory_bytes": 141e9,
    "nvlink_bytes_per_s": 450e9,  # per GPU, each direction
    "nic_bytes_per_s": 400e9 / 8,  # one 400 Gb/s ConnectX-7 per GPU, each direction
    "nvlink_latency_s": 3e-6,  # assumed
    "network_latency_s": 10e-6,  # assumed
    "bf16_flops_per_s": 1979e12 / 2,  # dense
}
TRAINING = {"sequence": 4096, "global_batch_sequences": 1024, "microbatch_sequences": 1}
MEMORY_HEADROOM = 0.9  # keep 10 % for the allocator, communication buffers, temporaries
JOBS = [("Llama 2 7B", 8), ("Llama 2 70B", 64)]  # (model, GPUs)


def parameter_count(model):
    """Weights of a Llama layer stack: attention with grouped K/V, SwiGLU MLP, norms, embeddings.

    A mixture-of-experts model (``experts`` and ``top_k`` in its shapes) has ``experts``
    SwiGLU MLPs per layer and a router in place of the one MLP.
    """
    h, head_dim = model["hidden"], model["hidden"] // model["heads"]
    attention = 2 * h * h + 2 * h * model["kv_heads"] * head_dim  # Q and O, then K and V
    mlp = 3 * h * model["ffn"] * model.get("experts", 1) + h * model.get("experts", 0)  # gate, up, down; router
    per_layer = attention + mlp + 2 * h  # two RMSNorm weights
    return model["layers"] * per_layer + 2 * model["vocab"] * h + h  # untied embedding, head


def expert_parameter_count(model):
    """Weights of all the experts of all layers: none in a dense model."""
    return model["layers"] * 3 * model["hidden"] * model["ffn"] * model["experts"] if "experts" in model else 0


def active_parameter_count(model):
    """Weights a token passes through: in a mixture of experts, only ``top_k`` of each layer's experts."""
    experts = expert_parameter_count(model)
    return parameter_count(model) - experts + experts * model.get("top_k", 1) // model.get("experts", 1)


for name, model in LLAMA2.items():
    count = parameter_count(model)
    assert float(f"{count:.1g}") == model["nominal_params"], (name, count)  # the name: one significant digit
    print(f"{name}: {count / 1e9:.2f} billion parameters from its shapes")


# %%
# The cost model
# --------------
# A layout is a data-parallel degree :math:`d`, a tensor-parallel degree
# :math:`t` (inside a node, Megatron's column and row split with sequence
# parallelism), a context-parallel degree :math:`c` (Ring Attention, below),
# a pipeline-parallel degree :math:`p` (1F1B schedule), for a
# mixture-of-experts model an expert-parallel degree :math:`e`, a ZeRO stage
# for the data-parallel group (3 is FSDP), and whether activations are
# recomputed. Ranks are numbered tensor-parallel first, then
# context-parallel, then data-parallel, then pipeline (Megatron-LM's order),
# so a group stays inside a node when its span fits in eight GPUs. The
# :math:`cd` ranks that hold the same weights, context- and data-parallel
# together, reduce their gradients and share ZeRO's shards. An
# expert-parallel group is :math:`e` consecutive ones among them: as in
# Megatron-LM, expert parallelism reuses the data-parallel ranks. The
# planner tries :math:`c > 1` only where no layout without it fits, as step
# 5 of the lecture's procedure has it; the long-context run below shows
# why.
#
# **Memory per GPU.** Mixed-precision Adam keeps 2 bytes of BF16 weights, 2
# of BF16 gradients and 12 of FP32 master weights and moments per parameter
# (ZeRO's accounting); TP and PP divide all three, and EP divides the
# experts' by :math:`e`. ZeRO stage 1, 2 and 3 then divide the optimizer
# state, the gradients and the weights by :math:`cd` (an expert's by
# :math:`cd/e`, the ranks that hold the same experts).
# Activations follow Korthikanti et al. (2023): with tensor and sequence
# parallelism and selective recomputation a layer keeps :math:`34\,sbh/t`
# bytes per micro-batch (:math:`s` tokens, :math:`b` sequences, width
# :math:`h`), and each of the :math:`c` context-parallel ranks holds
# :math:`s/c` of the tokens: :math:`34\,sbh/(tc)`. In a mixture-of-experts
# layer the MLP's :math:`19\,sbh` of them hold the :math:`k` routed copies of
# each token, :math:`(15 + 19k)\,sbh/(tc)`. With full recomputation a layer
# keeps only its input, :math:`2\,sbh/(tc)`, plus one layer's working set.
# Under 1F1B the first stage holds :math:`\min(p, m)` micro-batches of its
# :math:`\lceil L/p \rceil` layers (when :math:`p` does not divide the
# :math:`L` layers, the largest stage sets the memory and the pace); the
# last stage also holds the FP32 logits.
#
# **Communication per step.** Ring collectives in the alpha-beta model: over
# :math:`n` ranks an all-reduce of :math:`S` bytes takes
# :math:`2(n-1)\alpha + 2\frac{n-1}{n} S/B`, a reduce-scatter or an
# all-gather half of that. TP all-reduces :math:`2sbh/c` bytes four times
# per layer and micro-batch (six with full recomputation); in a
# mixture-of-experts layer the two of the MLP carry the :math:`k` routed
# copies of each token (the experts are split over :math:`t` as the dense
# MLP is). PP sends :math:`2sbh/(tc)` bytes each way per micro-batch, and
# DP reduces the gradients: once per step (ZeRO 0 and 1), reduce-scatter
# per micro-batch (ZeRO 2), or all-gather the weights twice and
# reduce-scatter the gradients per micro-batch (ZeRO 3); the dense weights'
# over the :math:`cd` ranks, the experts' over the :math:`cd/e`.
#
# *Context parallel.* A rank holds the keys and values of its :math:`s/c`
# tokens for its :math:`n_\text{kv}/t` key-value heads: a block of
# :math:`2 \cdot 2(s/c)\,b\,n_\text{kv} d_\text{head}/t` bytes in bf16. Per
# layer and micro-batch, Ring Attention (Liu et al. 2023) passes
# :math:`c-1` blocks along the ring in the forward pass; the backward pass
# passes them again, :math:`c-1` times, and their gradients :math:`c` times,
# back to their owners, in float32 as torch's ``context_parallel``
# accumulates them by default, so twice a block's bytes; full recomputation
# repeats the forward's. (By default torch all-gathers the keys and values
# instead; ``set_rotate_method("alltoall")`` gives the ring: the same bytes
# in the same steps. The gradients always go round the ring.) Each pass is a ring step, a send to the
# neighbour: NVLink when the ring lies in one node, one adapter otherwise.
# The ring is built so that attention hides these sends; the planner still
# charges them in full, as it charges all communication, and prints below
# how much attention there is to hide them.
#
# *Expert parallel.* Per mixture-of-experts layer and micro-batch, two
# all-to-alls forward (dispatch and combine) and two backward, two more with
# full recomputation. In each, a GPU sends the :math:`k` routed copies of the
# tokens of its own shard, :math:`S = 2k\,sbh/(tc)` bytes (uniform
# routing), all but :math:`S/e` of them to the other GPUs of its group. With
# :math:`g` of the :math:`e` GPUs in each node, :math:`(g-1)S/e` go over
# NVLink and, when the group spans nodes, :math:`(e-g)S/e` through the
# GPU's own adapter, at the same time:
# :math:`\max\left(\frac{(g-1)S}{e\,B_\text{NVLink}}, \frac{(e-g)S}{e\,B_\text{NIC}}\right)`.
# No overlap with compute is assumed anywhere, so the total is an upper
# bound on the exposed time.
#
# **Across nodes.** :math:`B` is NVLink's 450 GB/s for a group inside one
# node. A group with :math:`k` members in each of several nodes is not held
# to one adapter's 50 GB/s: NCCL runs a ring (or a tree) per adapter, in
# parallel, so the bytes that cross between nodes, about :math:`2S` in an
# all-reduce, leave each node through its :math:`k` members' adapters at
# once, while each GPU still moves about :math:`2S` over NVLink. Both run
# together and the slower sets the pace: :math:`B = \min(450, 50k)` GB/s,
# the node's egress of 400 GB/s when all eight GPUs of every node take part,
# and one adapter's 50 GB/s when the group has one GPU per node, as a
# data-parallel group has under :math:`t = 8`. The hierarchical form,
# reduce-scatter in the node, all-reduce of the :math:`S/k` shards across
# nodes, all-gather in the node, sends :math:`2(1 - k/n)\,S/k` bytes through
# each adapter, less than the ring's :math:`2(1 - 1/n)\,S/k`; below, its
# time with the phases one after the other, and with them all at once,
# brackets this model's. A pipeline stage, or a step of the ring, sends to
# its neighbour through its own adapter: 50 GB/s.
#
# **Compute.** :math:`6N + 12Lsh` FLOPs per token (Narayanan et al. 2021;
# :math:`N` counts the weights a token passes through, only :math:`k` of a
# layer's experts; a third more with full recomputation) at the dense
# datasheet peak, a lower bound, stretched by the pipeline bubble
# :math:`(p-1)/(m+p-1)` and by the largest stage's share of the layers,
# :math:`p\lceil L/p \rceil / L`. The :math:`12Lsh` counts attention's whole
# :math:`s \times s` score matrix. A causal kernel computes about half of
# it, and that half is what can hide a ring's sends; at 131,072 tokens the
# term is more than half of all the FLOPs, so the step times estimated there
# are high.

COLLECTIVE_STEPS = {"all_reduce": 2, "reduce_scatter": 1, "all_gather": 1}
CP_DEGREES = [2 ** i for i in range(8)]  # 1 to 128


def ring_time(collective, ranks, nbytes, latency_s, bytes_per_s):
    """alpha-beta time of a ring collective over ``ranks`` ranks on a buffer of ``nbytes``."""
    if ranks == 1:
        return 0.0
    steps = COLLECTIVE_STEPS[collective] * (ranks - 1)
    return steps * latency_s + steps / ranks * nbytes / bytes_per_s


def members_per_node(cluster, ranks, stride):
    """How many of a group's ``ranks``, numbered ``stride`` apart, share each node."""
    node = cluster["gpus_per_node"]
    assert node % stride == 0 or stride % node == 0, (stride, node)  # groups tile the nodes
    return min(ranks, max(1, node // stride))


def collective_link(cluster, ranks, stride):
    """(latency, bus bandwidth per GPU) of a collective over ``ranks`` GPUs ``stride`` apart."""
    k = members_per_node(cluster, ranks, stride)
    if k == ranks:
        return cluster["nvlink_latency_s"], cluster["nvlink_bytes_per_s"]
    # Across nodes each GPU still moves its 2(n-1)/n S over NVLink, while the node's k members send
    # the bytes that leave the node through their k NICs at once (a ring per NIC): the slower sets the pace.
    return cluster["network_latency_s"], min(cluster["nvlink_bytes_per_s"], k * cluster["nic_bytes_per_s"])


def point_to_point_link(cluster, ranks, stride):
    """(latency, bandwidth) of a send between neighbours of a group: one GPU's own NIC across nodes."""
    if members_per_node(cluster, ranks, stride) == ranks:
        return cluster["nvlink_latency_s"], cluster["nvlink_bytes_per_s"]
    return cluster["network_latency_s"], cluster["nic_bytes_per_s"]


def all_to_all_time(cluster, ranks, stride, nbytes):
    """Seconds of an all-to-all in which each of ``ranks`` GPUs sends ``nbytes``, an equal share to each."""
    if ranks == 1:
        return 0.0
    g = members_per_node(cluster, ranks, stride)
    over_nvlink = (g - 1) / ranks * nbytes / cluster["nvlink_bytes_per_s"]
    if g == ranks:
        return cluster["nvlink_latency_s"] + over_nvlink
    # Every GPU of the node runs its own all-to-all at once: each has only its own adapter.
    through_nic = (ranks - g) / ranks * nbytes / cluster["nic_bytes_per_s"]
    return cluster["network_latency_s"] + max(over_nvlink, through_nic)


def stage_layers(model, p):
    """Layers of the largest of ``p`` pipeline stages: it sets the memory and the pace."""
    return -(-model["layers"] // p)


def parameters_per_gpu(model, layout):
    """(dense, expert) weights on one GPU: its stage's share, split by TP, the experts also by EP."""
    share = stage_layers(model, layout["pp"]) / model["layers"]
    experts = expert_parameter_count(model)
    return ((parameter_count(model) - experts) * share / layout["tp"],
            experts * share / (layout["tp"] * layout["ep"]))


def memory_per_gpu(model, layout, training):
    """Bytes per GPU: weights, gradients, optimizer state and activations."""
    t, c, p, e, zero = (layout[k] for k in ("tp", "cp", "pp", "ep", "zero"))
    s, b, h = training["sequence"], training["microbatch_sequences"], model["hidden"]
    dense, experts = parameters_per_gpu(model, layout)
    sharers = layout["dp"] * c  # the ranks that hold the same weights

    def states(bytes_per_parameter, sharded):
        return bytes_per_parameter * (dense / (sharers if sharded else 1)
                                      + experts / (sharers // e if sharded else 1))

    layers = stage_layers(model, p)
    per_layer = (15 + 19 * model.get("top_k", 1)) * s * b * h / (t * c)  # 34 sbh/(tc) in a dense layer
    if layout["recompute"]:
        stored_per_layer, working_set = 2 * s * b * h / (t * c), per_layer
    else:
        stored_per_layer, working_set = per_layer, 0.0
    first_stage = min(p, layout["microbatches"]) * layers * stored_per_layer + working_set
    last_stage = layers * stored_per_layer + working_set + 4 * s * b * model["vocab"] / (t * c)
    return {"weights": states(2, zero >= 3), "gradients": states(2, zero >= 2),
            "optimizer": states(12, zero >= 1), "activations": max(first_stage, last_stage)}


def gradient_traffic(zero, microbatches, ranks, nbytes, link):
    """Seconds per step that data parallel spends on ``nbytes`` of gradients over ``ranks`` GPUs."""
    if zero <= 1:
        return ring_time("all_reduce", ranks, nbytes, *link)
    if zero == 2:
        return (microbatches * ring_time("reduce_scatter", ranks, nbytes, *link)
                + ring_time("all_gather", ranks, nbytes, *link))
    return microbatches * (2 * ring_time("all_gather", ranks, nbytes, *link)
                           + ring_time("reduce_scatter", ranks, nbytes, *link))


def ring_attention_sends(model, layout, training):
    """(sends, bytes) of one GPU's K/V ring per layer and micro-batch, forward and backward."""
    c, t = layout["cp"], layout["tp"]
    if c == 1:
        return 0, 0.0
    head_dim = model["hidden"] // model["heads"]
    block = 2 * 2 * (training["sequence"] // c) * training["microbatch_sequences"] * (model["kv_heads"] // t) * head_dim
    forward = (c - 1) * (2 if layout["recompute"] else 1)  # recomputation runs the forward ring again
    # Backward: K and V again, then dK and dV, in float32, all the way back to their owners.
    return forward + (c - 1) + c, block * (forward + (c - 1) + 2 * c)


def ring_attention_seconds(model, layout, training, cluster):
    """One GPU's ring per layer and micro-batch: each pass is a send to its neighbour."""
    sends, nbytes = ring_attention_sends(model, layout, training)
    latency, bandwidth = point_to_point_link(cluster, layout["cp"], layout["tp"])
    return sends * latency + nbytes / bandwidth


def communication_per_step(model, layout, training, cluster):
    """Seconds per step each kind of parallelism spends communicating (no overlap)."""
    d, t, c, p, e, zero, m = (layout[k] for k in ("dp", "tp", "cp", "pp", "ep", "zero", "microbatches"))
    layers = stage_layers(model, p)
    tokens = training["sequence"] // c * training["microbatch_sequences"]  # one GPU's share of a micro-batch
    activation_bytes = 2 * tokens * model["hidden"]
    passes = 3 if layout["recompute"] else 2  # forward, backward, and the recomputed forward
    tp_all_reduces = m * layers * passes * (1 + model.get("top_k", 1))  # attention's, then the MLP's
    tp = tp_all_reduces * ring_time("all_reduce", t, activation_bytes, *collective_link(cluster, t, 1))
    cp = m * layers * ring_attention_seconds(model, layout, training, cluster)
    pp_latency, pp_bandwidth = point_to_point_link(cluster, p, t * c * d)
    pp = 2 * m * (pp_latency + activation_bytes / t / pp_bandwidth) if p > 1 else 0.0
    routed_bytes = model.get("top_k", 0) * activation_bytes / t  # the k copies of this GPU's tokens
    ep = m * layers * 2 * passes * all_to_all_time(cluster, e, t, routed_bytes)
    dense, experts = parameters_per_gpu(model, layout)
    dp = gradient_traffic(zero, m, d * c, 2 * dense, collective_link(cluster, d * c, t))
    if experts:
        dp += gradient_traffic(zero, m, d * c // e, 2 * experts, collective_link(cluster, d * c // e, t * e))
    return {"tp": tp, "cp": cp, "pp": pp, "ep": ep, "dp": dp}


def compute_per_step(model, layout, training, cluster, gpus):
    """Seconds of matmuls per step at the datasheet peak, with the pipeline bubble."""
    tokens = training["global_batch_sequences"] * training["sequence"]
    per_token = 6 * active_parameter_count(model) + 12 * model["layers"] * training["sequence"] * model["hidden"]
    if layout["recompute"]:
        per_token *= 4 / 3
    p, m = layout["pp"], layout["microbatches"]
    busy = tokens * per_token / gpus / cluster["bf16_flops_per_s"] * p * stage_layers(model, p) / model["layers"]
    return busy / (1 - (p - 1) / (m + p - 1))


def layouts(model, gpus, training, cluster, cp_degrees):
    """Every layout of ``gpus`` GPUs that divides the model's key-value heads, its experts and the batch."""
    experts = model.get("experts", 1)
    for t, c, p in itertools.product([1, 2, 4, 8], cp_degrees, range(1, model["layers"] + 1)):
        if (t > cluster["gpus_per_node"] or model["kv_heads"] % t or gpus % (t * c * p)
                or training["sequence"] % (2 * c)):  # load-balanced causal CP: 2c chunks
            continue
        d = gpus // (t * c * p)
        sequences_per_replica, rest = divmod(training["global_batch_sequences"], d)
        microbatches = sequences_per_replica // training["microbatch_sequences"]
        if rest or microbatches < p:
            continue
        ep_degrees = [e for e in range(1, experts + 1) if experts % e == 0 and d * c % e == 0]
        for e, zero, recompute in itertools.product(ep_degrees, [0, 1, 2, 3] if d * c > 1 else [0],
                                                    [False, True]):
            yield {"dp": d, "tp": t, "cp": c, "pp": p, "ep": e, "zero": zero, "recompute": recompute,
                   "microbatches": microbatches}


def planned(model, gpus, training, cluster, layout):
    """One layout with its memory, communication and estimated step time."""
    memory = memory_per_gpu(model, layout, training)
    communication = communication_per_step(model, layout, training, cluster)
    compute = compute_per_step(model, layout, training, cluster, gpus)
    total_memory = sum(memory.values())
    return {**layout, "memory": total_memory, "memory_by_kind": memory,
            "communication": sum(communication.values()),
            "by_kind": communication, "compute": compute, "step": compute + sum(communication.values()),
            "fits": total_memory <= MEMORY_HEADROOM * cluster["memory_bytes"]}


def plan(model, gpus, training, cluster, cp_degrees=None):
    """Each layout with its memory, communication and estimated step time.

    Context parallel enters only where no layout without it fits (the lecture's procedure),
    unless ``cp_degrees`` names the degrees to try.
    """
    rows = [planned(model, gpus, training, cluster, layout)
            for layout in layouts(model, gpus, training, cluster, cp_degrees or [1])]
    if cp_degrees is None and not any(row["fits"] for row in rows):
        rows += [planned(model, gpus, training, cluster, layout)
                 for layout in layouts(model, gpus, training, cluster, CP_DEGREES[1:])]
    return rows


def layout_name(row):
    zero = "FSDP" if row["zero"] == 3 else (f"ZeRO-{row['zero']}" if row["zero"] else "DDP")
    recompute = " +recompute" if row["recompute"] else ""
    return f"{degrees_name(*degrees(row))} {zero}{recompute}"


def degrees(row):
    return row["dp"], row["tp"], row["pp"], row["cp"], row["ep"]


def degrees_name(dp, tp, pp, cp=1, ep=1):
    """Degrees as the tables print them: CP and EP only where they are used."""
    return f"DP{dp} TP{tp}" + (f" CP{cp}" if cp > 1 else "") + f" PP{pp}" + (f" EP{ep}" if ep > 1 else "")


# %%
# Collectives across nodes
# ------------------------
# How many GPUs of a group share each node decides the bandwidth its
# collectives get. The table takes the lecture's example, an all-reduce of
# the 14 GB of bf16 gradients of a 7-billion-parameter model, over one node
# and over 32 GPUs spread four ways, beside the hierarchical form's two
# bounds. Then the figures the lecture quotes: how many tokens per GPU hide
# the gradient traffic of data parallel and of ZeRO-3 behind the matmuls, and
# the network time of one step of a 70-billion-parameter model on four nodes,
# FSDP over all 32 GPUs against tensor parallel in each node and data
# parallel across the four. All are bandwidth terms: latency adds under a
# millisecond here.


def hierarchical_all_reduce(cluster, ranks, stride, nbytes):
    """Seconds of the hierarchical form's two parts: in the node (NVLink), across nodes (k NICs)."""
    k = members_per_node(cluster, ranks, stride)
    nvlink = cluster["nvlink_bytes_per_s"]
    in_node = ring_time("reduce_scatter", k, nbytes, 0.0, nvlink) + ring_time("all_gather", k, nbytes, 0.0, nvlink)
    across = ring_time("all_reduce", ranks // k, nbytes / k, 0.0, cluster["nic_bytes_per_s"])
    return in_node, across


GRADIENTS_7B = 2 * 7e9  # bytes of bf16 gradients
GROUPS = [(8, 1), (32, 1), (32, 2), (32, 4), (32, 8)]  # (GPUs, stride): 8, 4, 2 or 1 of them per node
print(f"\nall-reduce of {GRADIENTS_7B / 1e9:.0f} GB of gradients\n"
      f"GPUs  per node  nodes  bus GB/s      ms   hierarchical (ms): phases at once, one after another")
all_reduce_ms = {}
for ranks, stride in GROUPS:
    k = members_per_node(H200_CLUSTER, ranks, stride)
    latency, bus = collective_link(H200_CLUSTER, ranks, stride)
    seconds = ring_time("all_reduce", ranks, GRADIENTS_7B, 0.0, bus)
    assert ring_time("all_reduce", ranks, GRADIENTS_7B, latency, bus) - seconds < 1e-3  # latency: under 1 ms
    parts = hierarchical_all_reduce(H200_CLUSTER, ranks, stride, GRADIENTS_7B)
    assert max(parts) <= seconds * (1 + 1e-12) and seconds <= sum(parts) * (1 + 1e-12), (ranks, k, parts)
    all_reduce_ms[ranks, k] = 1e3 * seconds
    print(f"{ranks:>4} {k:>9} {ranks // k:>6} {bus / 1e9:>9.0f} {1e3 * seconds:>7.1f}   "
          f"{1e3 * max(parts):>32.1f} {1e3 * sum(parts):>15.1f}")

NIC, NODE = H200_CLUSTER["nic_bytes_per_s"], H200_CLUSTER["gpus_per_node"]
assert collective_link(H200_CLUSTER, 8, 1)[1] == H200_CLUSTER["nvlink_bytes_per_s"]  # one node: NVLink
assert collective_link(H200_CLUSTER, 32, 1)[1] == NODE * NIC == 400e9  # 8 per node: the node's egress
assert collective_link(H200_CLUSTER, 32, 8)[1] == NIC == 50e9  # 1 per node: one adapter
assert collective_link(H200_CLUSTER, 4, 8)[1] == NIC  # data parallel across 4 nodes under TP = 8
assert point_to_point_link(H200_CLUSTER, 16, 8)[1] == NIC  # a pipeline send: one adapter

PEAK = H200_CLUSTER["bf16_flops_per_s"]
# Data parallel's all-reduce can overlap only the backward pass (4 Psi b FLOPs): the gradients do not
# exist before it and the next forward needs the new weights. ZeRO-3 hides each pass's own collectives.
print("\ntokens per GPU per step that hide the gradient traffic (b > P/B, for data parallel and ZeRO-3 alike)")
hiding_tokens = {}
for what, (ranks, stride) in [("one node", (8, 1)), ("8 GPUs per node", (32, 1)), ("1 GPU per node", (32, 8))]:
    bus = collective_link(H200_CLUSTER, ranks, stride)[1]
    hiding_tokens[what] = PEAK / bus
    print(f"  {what:16s} B = {bus / 1e9:3.0f} GB/s: {PEAK / bus:7,.0f}")

PSI_70B = 70e9  # parameters of the lecture's 70-billion-parameter example
fsdp_link = collective_link(H200_CLUSTER, 32, 1)  # FSDP over the 32 GPUs of four nodes: 8 per node
fsdp_bytes = 3 * 31 / 32 * 2 * PSI_70B  # all-gather twice, reduce-scatter once, per GPU
fsdp_s = (2 * ring_time("all_gather", 32, 2 * PSI_70B, 0.0, fsdp_link[1])
          + ring_time("reduce_scatter", 32, 2 * PSI_70B, 0.0, fsdp_link[1]))
hybrid_link = collective_link(H200_CLUSTER, 4, 8)  # TP 8 in each node, DP 4 across: 1 per node
hybrid_bytes = 2 * 3 / 4 * 2 * PSI_70B / 8  # all-reduce of each GPU's eighth of the gradients
hybrid_s = ring_time("all_reduce", 4, 2 * PSI_70B / 8, 0.0, hybrid_link[1])
assert 3 * ring_time("all_gather", 32, 0, *fsdp_link) < 1e-3  # FSDP's latency: under 1 ms
assert abs(fsdp_s - fsdp_bytes / fsdp_link[1]) < 1e-9 and abs(hybrid_s - hybrid_bytes / hybrid_link[1]) < 1e-9
print(f"\n70B model on 4 nodes, network time per step (one micro-batch):\n"
      f"  FSDP over 32 GPUs:    {fsdp_bytes / 1e9:5.0f} GB per GPU at {fsdp_link[1] / 1e9:3.0f} GB/s = {fsdp_s:.2f} s, "
      f"hidden by {fsdp_s * PEAK / (6 * PSI_70B):,.0f} tokens per GPU\n"
      f"  TP 8 x DP 4, ZeRO-1:  {hybrid_bytes / 1e9:5.1f} GB per GPU at {hybrid_link[1] / 1e9:3.0f} GB/s = "
      f"{hybrid_s:.2f} s\n  FSDP / (TP 8 x DP 4): {fsdp_s / hybrid_s:.1f}")


# %%
# The planner's answer
# --------------------
# For each job, the feasible layouts with the shortest estimated step, then
# the figure of every layout: memory per GPU against communication per step.

def ranked(rows):
    """The layouts that fit, fastest first; at equal estimated steps, the most memory to spare."""
    return sorted((row for row in rows if row["fits"]), key=lambda row: (row["step"], row["memory"]))


def print_plan(job, rows, cluster=H200_CLUSTER, shown=6, with_cp_and_ep=False):
    feasible = ranked(rows)
    print(f"\n{job}: {len(feasible)} of {len(rows)} layouts fit in "
          f"{MEMORY_HEADROOM:.0%} of {cluster['memory_bytes'] / 1e9:.0f} GB")
    if with_cp_and_ep:
        print(f"{'layout':37s} {'GB/GPU':>7} {'TP s':>6} {'CP s':>6} {'PP s':>6} {'EP s':>6} {'DP s':>6} "
              f"{'compute s':>10} {'step s':>7}")
    else:
        print(f"{'layout':34s} {'GB/GPU':>7} {'TP s':>7} {'PP s':>7} {'DP s':>7} {'compute s':>10} "
              f"{'step s':>7}")
    for row in feasible[:shown]:
        kind = row["by_kind"]
        if with_cp_and_ep:
            print(f"{layout_name(row):37s} {row['memory'] / 1e9:7.1f} {kind['tp']:6.2f} {kind['cp']:6.2f} "
                  f"{kind['pp']:6.2f} {kind['ep']:6.2f} {kind['dp']:6.2f} {row['compute']:10.2f} "
                  f"{row['step']:7.2f}")
        else:
            print(f"{layout_name(row):34s} {row['memory'] / 1e9:7.1f} {kind['tp']:7.2f} {kind['pp']:7.2f} "
                  f"{kind['dp']:7.2f} {row['compute']:10.2f} {row['step']:7.2f}")
    return feasible[0]


plans = {f"{name} on {gpus} GPUs": plan(LLAMA2[name], gpus, TRAINING, H200_CLUSTER)
         for name, gpus in JOBS}
picks = {job: print_plan(job, rows) for job, rows in plans.items()}

fig, axes = plt.subplots(1, len(plans), figsize=(11, 4.2))
for ax, (job, rows) in zip(axes, plans.items()):
    for fits, style in [(True, {"color": "tab:blue", "label": "fits"}),
                        (False, {"color": "lightgrey", "label": "does not fit"})]:
        chosen = [row for row in rows if row["fits"] == fits]
        ax.scatter([row["communication"] for row in chosen], [row["memory"] / 1e9 for row in chosen],
                   s=14, **style)
    pick = picks[job]
    ax.scatter([pick["communication"]], [pick["memory"] / 1e9], marker="*", s=160, color="tab:red",
               label=f"pick: {layout_name(pick)}")
    ax.axhline(H200_CLUSTER["memory_bytes"] / 1e9, color="black", lw=0.8)
    ax.text(ax.get_xlim()[0], H200_CLUSTER["memory_bytes"] / 1e9, " 141 GB HBM3e", va="bottom",
            fontsize="small")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_ylim(top=max(2 * H200_CLUSTER["memory_bytes"] / 1e9, ax.get_ylim()[1]))
    ax.set_xlabel("communication per step, no overlap (s)")
    ax.set_ylabel("memory per GPU (GB)")
    ax.set_title(job, fontsize="medium")
    ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.18), frameon=False, fontsize="small")
fig.suptitle("Layouts on 8 x H200 nodes: a model from datasheet figures, not a measurement",
             fontsize="medium")
fig.tight_layout()

# %%
# Checking the picks against published layouts
# --------------------------------------------
# The planner is a model; published runs are evidence. Three of them give
# degrees we can check. Llama 3 405B was pretrained, after its first 2.87T
# tokens, on 8192-token sequences in batches of 16M tokens (Llama Team 2024,
# section 3.4.1), on 8,192 and then 16,384 H100 GPUs, as tensor parallel 8 in
# each node, pipeline parallel 16 and data parallel 64 or 128 (its Table 4,
# the rows without context parallelism; the shapes are those of its Table 3,
# except the vocabulary, 128,256 tokens in the released models where Table 3
# gives 128,000). torchtitan trained Llama 3.1 8B on 128 H100 GPUs
# with FSDP alone, two sequences per GPU (its performance report, Table 3;
# 8192-token sequences, the length of its preset). Their nodes are modelled
# with the figures above except memory: 80 GB per H100 (NVIDIA's datasheet),
# 96 GB on torchtitan's. Llama 3's micro-batches are taken as one sequence, as
# above; torchtitan's as the two sequences of a step. On each job the planner
# must choose the published degrees of data, tensor and pipeline parallelism;
# the ZeRO stage and the recomputation are left to its own model. The 8B run
# tests the cross-node model: its data-parallel group holds all eight GPUs of
# every node.

LLAMA3 = {
    "Llama 3 405B": {"layers": 126, "hidden": 16384, "heads": 128, "kv_heads": 8, "ffn": 53248,
                     "vocab": 128256, "nominal_params": 405e9},
    "Llama 3.1 8B": {"layers": 32, "hidden": 4096, "heads": 32, "kv_heads": 8, "ffn": 14336,
                     "vocab": 128256, "nominal_params": 8e9},
}
LLAMA3_PRETRAINING = {"sequence": 8192, "global_batch_sequences": 2048, "microbatch_sequences": 1}  # 16M tokens
PUBLISHED = [  # (source, model, GPUs, memory per GPU, training, published (DP, TP, PP, CP, EP))
    ("Llama 3, Table 4", "Llama 3 405B", 8192, 80e9, LLAMA3_PRETRAINING, (64, 8, 16, 1, 1)),
    ("Llama 3, Table 4", "Llama 3 405B", 16384, 80e9, LLAMA3_PRETRAINING, (128, 8, 16, 1, 1)),
    ("torchtitan, Table 3", "Llama 3.1 8B", 128, 96e9,
     {"sequence": 8192, "global_batch_sequences": 256, "microbatch_sequences": 2}, (128, 1, 1, 1, 1)),
]

print()
for name, model in LLAMA3.items():
    count = parameter_count(model)
    assert int(count / 1e9) == model["nominal_params"] / 1e9, (name, count)  # Llama 3's names: whole billions
    print(f"{name}: {count / 1e9:.2f} billion parameters from its shapes")


print(f"\npublished layouts, planned on H100 nodes\n{'source':20s} {'model':13s} {'GPUs':>6} {'GB':>4}  "
      f"{'published':15s} {'pick':34s} {'step s':>6}  nearest other degrees")
published_picks = {}
for source, name, gpus, memory, training, published in PUBLISHED:
    cluster = {**H200_CLUSTER, "memory_bytes": memory}
    rows = ranked(plan(LLAMA3[name], gpus, training, cluster))
    pick = rows[0]
    other = next(row for row in rows if degrees(row) != degrees(pick))
    print(f"{source:20s} {name:13s} {gpus:>6} {memory / 1e9:>4.0f}  {degrees_name(*published):15s} "
          f"{layout_name(pick):34s} {pick['step']:6.2f}  {degrees_name(*degrees(other))}, "
          f"{other['step'] / pick['step'] - 1:+.2%}")
    assert degrees(pick) == published, f"{source}: the planner picks {layout_name(pick)}"
    published_picks[f"{name} on {gpus} GPUs"] = pick
print("the planner picks the published degrees for all three runs")


# %%
# Context parallel: a long-context run
# ------------------------------------
# Llama 3 405B's pretraining continued with long-context stages (before a
# final annealing), up to 131,072-token sequences, still in batches of 16M tokens, and the last row
# of its Table 4 runs them on 16,384 H100 GPUs as TP 8, CP 16, PP 16 and DP 8.
# A batch is then 128 sequences, and 1F1B needs at least as many
# micro-batches per replica as stages (the planner requires it; with fewer,
# some stages idle throughout): with one sequence per micro-batch,
# :math:`d \cdot p \le d \cdot m = 128`, so :math:`t \cdot c \ge 16384 / 128
# = 128`. No layout without context parallel exists. The planner, which
# turns to it only where nothing without it fits (step 5 of the lecture's
# procedure), must choose :math:`c`; whether it chooses 16 is the test.
# Llama 3 itself all-gathered the keys and values (its section 3.3.2) and
# exposed the transfer; the model charges its layout as a ring, with the
# same bytes, in full.
# Below, its ranking, with the ring's sends in a column of their own; then
# the published degrees beside its pick; then, per layer and micro-batch,
# each GPU's ring sends beside the causal attention that could hide them,
# counted as half of Narayanan's :math:`s^2` term.

LONG_CONTEXT = {"sequence": 131072, "global_batch_sequences": 128, "microbatch_sequences": 1}  # 16M tokens
LONG_CONTEXT_GPUS = 16384
LONG_CONTEXT_PUBLISHED = (8, 8, 16, 16, 1)  # Llama 3, Table 4: DP, TP, PP, CP, EP
H100_CLUSTER = {**H200_CLUSTER, "memory_bytes": 80e9}
LLAMA3_405B = LLAMA3["Llama 3 405B"]


def causal_attention_seconds(model, layout, training, cluster):
    """One GPU's attention matmuls per layer and micro-batch: causal, balanced over the CP ranks, at peak."""
    s, b = training["sequence"], training["microbatch_sequences"]
    passes = 4 if layout["recompute"] else 3  # forward 1, backward 2, recomputed forward 1
    return passes * 2 * s * s * b * model["hidden"] / (layout["tp"] * layout["cp"]) / cluster["bf16_flops_per_s"]


def bubble(row):
    return (row["pp"] - 1) / (row["microbatches"] + row["pp"] - 1)


long_job = f"Llama 3 405B on {LONG_CONTEXT_GPUS} GPUs, 131,072-token sequences"
long_rows = plan(LLAMA3_405B, LONG_CONTEXT_GPUS, LONG_CONTEXT, H100_CLUSTER)
long_pick = print_plan(long_job, long_rows, H100_CLUSTER, with_cp_and_ep=True)
long_published = next(row for row in ranked(long_rows) if degrees(row) == LONG_CONTEXT_PUBLISHED)
long_published_kept = next(row for row in long_rows if degrees(row) == LONG_CONTEXT_PUBLISHED
                           and row["zero"] == long_published["zero"] and not row["recompute"])
print(f"\npublished, {degrees_name(*LONG_CONTEXT_PUBLISHED)}: at best {layout_name(long_published)}, "
      f"{long_published['step']:.2f} s, {long_published['step'] / long_pick['step'] - 1:.0%} slower than the pick")
print(f"  without recomputation it needs {long_published_kept['memory'] / 1e9:.0f} GB per GPU, "
      f"{long_published_kept['memory_by_kind']['activations'] / 1e9:.0f} GB of them activations")
print(f"  pipeline bubble: {bubble(long_published):.0%} ({long_published['microbatches']} micro-batches), "
      f"the pick's {bubble(long_pick):.0%} ({long_pick['microbatches']})")
print(f"  communication: {long_published['communication']:.2f} s, the pick's {long_pick['communication']:.2f} s")

smallest_tc = LONG_CONTEXT_GPUS * LONG_CONTEXT["microbatch_sequences"] // LONG_CONTEXT["global_batch_sequences"]
assert long_rows and not list(layouts(LLAMA3_405B, LONG_CONTEXT_GPUS, LONG_CONTEXT, H100_CLUSTER, [1]))  # CP needed
# At t c = 128 a stage's p micro-batches hold about L layers' activations, 72 GB: only recomputation fits.
assert all(row["recompute"] for row in ranked(long_rows) if row["tp"] * row["cp"] == smallest_tc)
assert not long_published_kept["fits"]
assert long_published["communication"] < long_pick["communication"]  # the gap is compute, not bytes
assert degrees(long_pick) != LONG_CONTEXT_PUBLISHED and long_pick["cp"] > long_published["cp"]  # not reproduced
assert 1.4 < long_published["step"] / long_pick["step"] < 1.6  # the gap the text quotes
assert bubble(long_published) > bubble(long_pick)

print(f"\nper layer and micro-batch, one GPU    {'ring sends ms':>13} {'causal attention ms':>20} "
      f"{'attention / ring':>17}")
hiding = {}
for row in (long_pick, long_published):
    ring = ring_attention_seconds(LLAMA3_405B, row, LONG_CONTEXT, H100_CLUSTER)
    attention = causal_attention_seconds(LLAMA3_405B, row, LONG_CONTEXT, H100_CLUSTER)
    hiding[degrees_name(*degrees(row))] = attention / ring
    print(f"{layout_name(row):37s} {1e3 * ring:13.2f} {1e3 * attention:20.2f} {attention / ring:17.1f}")
assert hiding[degrees_name(*LONG_CONTEXT_PUBLISHED)] > 2  # a ring would hide the published layout's K/V traffic
assert 1 < hiding[degrees_name(*degrees(long_pick))] < 2  # the pick's only just

# The published ring in closed form: 16 ranks, blocks of 8192 tokens of one K/V head of 128, bf16.
ring_ranks = long_published["cp"]
block = 2 * 2 * (LONG_CONTEXT["sequence"] // ring_ranks) * (LLAMA3_405B["kv_heads"] // long_published["tp"]) * 128
assert block == 4 * 2 ** 20 and long_published["recompute"]
ring_sends, ring_blocks = 3 * (ring_ranks - 1) + ring_ranks, 3 * (ring_ranks - 1) + 2 * ring_ranks
assert ring_attention_sends(LLAMA3_405B, long_published, LONG_CONTEXT) == (ring_sends, ring_blocks * block)
# The ring crosses nodes (t c = 128): every send goes through one adapter, 50 GB/s, 10 us assumed.
assert abs(long_published["by_kind"]["cp"]
           - long_published["microbatches"] * stage_layers(LLAMA3_405B, long_published["pp"])
           * (ring_sends * 10e-6 + ring_blocks * block / 50e9)) < 1e-9

# %%
# The planner tries context parallel only where nothing fits without it.
# Left to the model alone, it would use context parallel at 8,192 tokens
# too: splitting the sequences gives each replica more, shorter
# micro-batches, which shrinks the 1F1B bubble, and less activation memory,
# which can spare the full recomputation; the ring's bytes cost little
# against that. The model overstates both savings: it knows no interleaved
# schedule (section 7 of the lecture) and no recomputation between all and
# nothing
# (:ref:`sphx_glr_auto_examples_lecture07_parallelism_10_activation_checkpointing.py`).
# Llama 3 trained these stages without it.

print("\nwith context parallel tried at 8,192 tokens too")
open_cp_picks = {}
for source, name, gpus, memory, training, published in PUBLISHED[:2]:
    cluster = {**H200_CLUSTER, "memory_bytes": memory}
    open_pick = ranked(plan(LLAMA3[name], gpus, training, cluster, cp_degrees=CP_DEGREES))[0]
    published_pick = published_picks[f"{name} on {gpus} GPUs"]
    open_cp_picks[gpus] = open_pick
    print(f"  {name} on {gpus} GPUs: {layout_name(open_pick)}, {open_pick['step']:.2f} s against "
          f"{published_pick['step']:.2f} s for the published degrees; bubble {bubble(open_pick):.0%} "
          f"against {bubble(published_pick):.0%}")
    assert open_pick["cp"] > 1

# %%
# Expert parallel: a mixture of experts on eight nodes
# ----------------------------------------------------
# Mixtral 8x22B (Mistral AI 2024) has, by its published configuration (of
# Instruct-v0.1; the base model's vocabulary is 32,000, not 32,768), 56
# layers of width 6144 with 48 query and 8 key-value heads, and in each
# layer 8 SwiGLU experts of width 16,384 and a router that sends each token
# to 2 of them: 141B parameters, 39B of them for each token. No training
# layout has been published for it, so no degree is checked; the job is the
# Llama 2 70B one, 64 H200 GPUs and 4M tokens per step, and we assert only
# what the model makes robust: the pick keeps its expert-parallel group
# inside a node, and every layout whose group spans nodes is well behind.
# DeepSeek-V3's published layout (64-way expert parallel over eight nodes)
# is not checked: its attention (MLA), its FP8 matmuls, its nodes' NVLink
# (160 GB/s measured, by its report) and the DualPipe schedule that hides
# its all-to-alls behind computation are all outside this model, which
# charges every byte.

MIXTRAL_8X22B = {"layers": 56, "hidden": 6144, "heads": 48, "kv_heads": 8, "ffn": 16384, "vocab": 32768,
                 "experts": 8, "top_k": 2}
MOE_GPUS = 64
total, active = parameter_count(MIXTRAL_8X22B), active_parameter_count(MIXTRAL_8X22B)
assert round(total / 1e9) == 141 and round(active / 1e9) == 39, (total, active)  # Mistral AI's figures
print(f"\nMixtral 8x22B: {total / 1e9:.2f} billion parameters from its shapes, {active / 1e9:.2f} billion "
      f"of them for each token")


def ep_in_one_node(row, cluster=H200_CLUSTER):
    return members_per_node(cluster, row["ep"], row["tp"]) == row["ep"]


moe_job = f"Mixtral 8x22B on {MOE_GPUS} GPUs"
moe_rows = plan(MIXTRAL_8X22B, MOE_GPUS, TRAINING, H200_CLUSTER)
moe_pick = print_plan(moe_job, moe_rows, with_cp_and_ep=True)
moe_across = next(row for row in ranked(moe_rows) if not ep_in_one_node(row))
moe_without_ep = next(row for row in ranked(moe_rows) if row["ep"] == 1)
print(f"fastest with its EP group across nodes: {layout_name(moe_across)}, "
      f"{moe_across['step'] / moe_pick['step'] - 1:+.0%}, EP {moe_across['by_kind']['ep']:.2f} s")
print(f"fastest without EP: {layout_name(moe_without_ep)}, {moe_without_ep['step'] / moe_pick['step'] - 1:+.1%}")
assert ep_in_one_node(moe_pick)
assert moe_across["step"] > 1.1 * moe_pick["step"]

# The pick's EP column in closed form: its group is in one node, so (e-1)/e of the routed bytes cross NVLink.
ep_ranks = moe_pick["ep"]
pick_routed = 2 * MIXTRAL_8X22B["top_k"] * TRAINING["sequence"] * MIXTRAL_8X22B["hidden"] // moe_pick["tp"]
all_to_alls = moe_pick["microbatches"] * stage_layers(MIXTRAL_8X22B, moe_pick["pp"]) * (6 if moe_pick["recompute"] else 4)
assert abs(moe_pick["by_kind"]["ep"]
           - all_to_alls * (3e-6 + (ep_ranks - 1) / ep_ranks * pick_routed / 450e9)) < 1e-9

# One all-to-all of a GPU's 2 routed copies of 4096 tokens: 8 GPUs in a node, then 4 in each of 2 nodes.
routed = 2 * 2 * TRAINING["sequence"] * MIXTRAL_8X22B["hidden"]
assert abs(all_to_all_time(H200_CLUSTER, 8, 1, routed) - (3e-6 + 7 / 8 * routed / 450e9)) < 1e-15
assert abs(all_to_all_time(H200_CLUSTER, 8, 2, routed) - (10e-6 + 4 / 8 * routed / 50e9)) < 1e-15


# %%
# Checking the cost model where we can
# ------------------------------------
# We cannot measure the cluster, but we can test the model's method on the
# machine at hand. Two gloo ranks (with NCCL, one rank per GPU) first time
# all-reduces over a range of sizes; a least-squares fit of :math:`t = 2(n-1)\alpha + 2\frac{n-1}{n}S/\beta`
# (relative errors, so small and large messages count alike) gives this
# machine's :math:`\alpha` and :math:`\beta`. From them we *predict* the
# communication of two steps before running them:
#
# * a data-parallel step of a three-layer MLP, one all-reduce per gradient
#   tensor (large messages: :math:`\beta` dominates);
# * a tensor-parallel step of four Megatron MLP blocks split over the ranks,
#   one all-reduce of the activations per block forward and one of the
#   input gradient backward (small messages: :math:`\alpha` matters).
#
# Then each rank runs the steps and times its all-reduces. As in the sweep, a
# barrier before each all-reduce makes the ranks start it together, so the
# time is the collective's own; the steps are run a second time without the
# barriers, where a rank's time inside an all-reduce also includes waiting for
# the other rank to finish its matmuls or to get a core (printed, not
# compared). Both steps are also checked against one process computing the
# same thing. The measured communication must come within a factor of 2 of the
# prediction for the data-parallel step, and of 4 for the tensor-parallel one:
# its messages are small, and on a CPU a small message's latency is mostly the
# time the operating system takes to wake the receiving rank, which varies from
# run to run far more than bandwidth does.

REPEATS = 8  # the sizes are set with the backend, in the setup


def timed_all_reduce(tensor, log, aligned):
    """All-reduce ``tensor`` and log its seconds; ``aligned`` first waits for every rank."""
    synchronize(tensor.device)  # on a GPU: this rank's own work before it is not counted
    if aligned:
        dist.barrier()
    start = time.perf_counter()
    dist.all_reduce(tensor)
    synchronize(tensor.device)  # on a GPU: the all-reduce has run, not just been queued
    log.append(time.perf_counter() - start)


class AllReduceForward(torch.autograd.Function):
    """Megatron's g: sum the partial outputs in forward, pass the gradient through."""

    @staticmethod
    def forward(ctx, partial, log, aligned):
        total = partial.clone()
        timed_all_reduce(total, log, aligned)
        return total

    @staticmethod
    def backward(ctx, grad):
        return grad, None, None


class AllReduceBackward(torch.autograd.Function):
    """Megatron's f: pass the input through in forward, sum its gradient in backward."""

    @staticmethod
    def forward(ctx, x, log, aligned):
        ctx.log, ctx.aligned = log, aligned
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        grad = grad.clone()
        timed_all_reduce(grad, ctx.log, ctx.aligned)
        return grad, None, None


def sweep_all_reduce(device):
    """This rank's seconds for ``REPEATS`` all-reduces of each size in SWEEP_BYTES."""
    samples = {}
    for nbytes in SWEEP_BYTES:
        buffer = torch.ones(nbytes // 4, device=device)
        samples[nbytes] = []
        for _ in range(REPEATS):
            timed_all_reduce(buffer, samples[nbytes], aligned=True)
    return samples


def collective_seconds(ranks_logs):
    """Seconds of a step's collectives, from each rank's logs of its repeated runs.

    A rank that reaches a collective early also times its wait for the others;
    the last to arrive times only the collective. So each collective counts
    with its fastest time over ranks and runs, as each size of the sweep does.
    """
    per_rank_and_run = [log for logs in ranks_logs for log in logs]
    return sum(min(times) for times in zip(*per_rank_and_run))


def seconds_in_step(ranks_logs):
    """Seconds the slowest rank spent inside all-reduces, waits included; best run."""
    return min(max(sum(log) for log in logs) for logs in zip(*ranks_logs))


def data_parallel_step(rank, world_size, model, inputs, targets, aligned):
    """Backward on this rank's half of the batch, then average the gradients."""
    rows = len(inputs) // world_size
    mine = slice(rank * rows, (rank + 1) * rows)
    model.zero_grad()
    nn.functional.mse_loss(model(inputs[mine]), targets[mine]).backward()
    log = []
    for p in model.parameters():
        timed_all_reduce(p.grad, log, aligned)
        p.grad /= world_size
    return log, [p.grad.clone() for p in model.parameters()]


def tensor_parallel_step(blocks, inputs, aligned):
    """Each block: column-split up projection, GeLU, row-split down projection."""
    x = inputs.clone().requires_grad_()
    log = []
    hidden = x
    for up_columns, down_rows in blocks:
        local = AllReduceBackward.apply(hidden, log, aligned)
        partial = nn.functional.gelu(local @ up_columns) @ down_rows
        hidden = AllReduceForward.apply(partial, log, aligned)
    hidden.sum().backward()
    return log, hidden.detach(), x.grad


def on_core_fraction(seconds=0.05):
    """Fraction of ``seconds`` of matmuls that this process actually ran on a core."""
    a = torch.randn(128, 128)
    start, start_on_core = time.perf_counter(), time.thread_time()
    while time.perf_counter() - start < seconds:
        a @ a
    return (time.thread_time() - start_on_core) / (time.perf_counter() - start)


def sweep_worker(rank, world_size):
    return sweep_all_reduce(rank_device(rank))


def steps_worker(rank, world_size, dp_model, dp_inputs, dp_targets, tp_blocks, tp_inputs):
    torch.backends.cuda.matmul.allow_tf32 = False  # float32 products on a GPU, as the tolerance counts them
    device = rank_device(rank)
    dp_model, dp_inputs, dp_targets = dp_model.to(device), dp_inputs.to(device), dp_targets.to(device)
    tp_inputs = tp_inputs.to(device)
    shard = TP_FFN // world_size
    mine = slice(rank * shard, (rank + 1) * shard)
    my_blocks = [(up[:, mine].clone().to(device), down[mine, :].clone().to(device))
                 for up, down in tp_blocks]
    dist.barrier()
    on_core_before = on_core_fraction()
    logs = {}
    for aligned in (True, False):
        dist.barrier()
        dp_runs = [data_parallel_step(rank, world_size, dp_model, dp_inputs, dp_targets, aligned)
                   for _ in range(REPEATS)]
        tp_runs = [tensor_parallel_step(my_blocks, tp_inputs, aligned) for _ in range(REPEATS)]
        logs["DP", aligned] = [run[0] for run in dp_runs]
        logs["TP", aligned] = [run[0] for run in tp_runs]
    return {"on_core": min(on_core_before, on_core_fraction()), "logs": logs,
            "dp_grads": [grad.cpu() for grad in dp_runs[-1][1]], "tp_output": tp_runs[-1][1].cpu(),
            "tp_input_grad": tp_runs[-1][2].cpu()}


def single_process_steps(rank, world_size, dp_model, dp_inputs, dp_targets, tp_blocks, tp_inputs):
    """Both steps whole, in one process on rank ``rank``'s device: what every rank must match."""
    torch.backends.cuda.matmul.allow_tf32 = False
    device = rank_device(rank)
    reference = mlp(DP_WIDTHS).to(device)
    reference.load_state_dict(dp_model.state_dict())
    nn.functional.mse_loss(reference(dp_inputs.to(device)), dp_targets.to(device)).backward()
    x = tp_inputs.to(device).clone().requires_grad_()
    hidden = x
    for up, down in tp_blocks:
        hidden = nn.functional.gelu(hidden @ up.to(device)) @ down.to(device)
    hidden.sum().backward()
    return [p.grad.cpu() for p in reference.parameters()], hidden.detach().cpu(), x.grad.cpu()


def fit_alpha_beta(sweep, ranks):
    """Least squares on relative error: t_i ~ 2(n-1) alpha + 2(n-1)/n S_i / beta; returns (s, B/s)."""
    sizes = torch.tensor(list(sweep), dtype=torch.float64)
    seconds = torch.tensor(list(sweep.values()), dtype=torch.float64)
    design = torch.stack([torch.full_like(sizes, 2.0 * (ranks - 1)), 2 * (ranks - 1) / ranks * sizes], 1)
    alpha, seconds_per_byte = torch.linalg.lstsq(design / seconds[:, None], torch.ones_like(seconds)).solution
    return alpha.item(), 1 / seconds_per_byte.item()


def mlp(widths):
    layers = []
    for fan_in, fan_out in itertools.pairwise(widths):
        layers += [nn.Linear(fan_in, fan_out), nn.GELU()]
    return nn.Sequential(*layers[:-1])


if CAN_RUN_RANKS:
    sweep_logs = run_ranks(sweep_worker, CHECK_RANKS, backend=BACKEND)
    sweep = {nbytes: collective_seconds([[[t] for t in logs[nbytes]] for logs in sweep_logs])
             for nbytes in SWEEP_BYTES}
    alpha, beta = fit_alpha_beta(sweep, CHECK_RANKS)
    print(f"fitted on this machine: alpha = {1e6 * alpha:.1f} us, beta = {beta / 1e9:.2f} GB/s "
          f"({CHECK_LINK}, {CHECK_RANKS} ranks)")

    fig, ax = plt.subplots(figsize=(6.5, 4))
    sizes = list(sweep)
    ax.plot(sizes, [1e3 * t for t in sweep.values()], "o", label="measured all-reduce")
    ax.plot(sizes, [1e3 * ring_time("all_reduce", CHECK_RANKS, n, alpha, beta) for n in sizes],
            label=f"fit: alpha = {1e6 * alpha:.0f} us, beta = {beta / 1e9:.2f} GB/s")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("message size (bytes)")
    ax.set_ylabel("time (ms)")
    ax.set_title(f"All-reduce, {CHECK_RANKS} {BACKEND_NAME} ranks on {DEVICE_NAME}", fontsize="medium")
    ax.legend(frameon=False)
    fig.tight_layout()

    dp_model = mlp(DP_WIDTHS)
    dp_inputs, dp_targets = torch.randn(DP_ROWS, DP_WIDTHS[0]), torch.randn(DP_ROWS, DP_WIDTHS[-1])
    tp_blocks = [(torch.randn(TP_WIDTH, TP_FFN) / TP_WIDTH ** 0.5,
                  torch.randn(TP_FFN, TP_WIDTH) / TP_FFN ** 0.5) for _ in range(TP_BLOCKS)]
    tp_inputs = torch.randn(TP_ROWS, TP_WIDTH)
    predicted = {
        "DP": sum(ring_time("all_reduce", CHECK_RANKS, 4 * p.numel(), alpha, beta)
                  for p in dp_model.parameters()),
        "TP": 2 * TP_BLOCKS * ring_time("all_reduce", CHECK_RANKS, 4 * TP_ROWS * TP_WIDTH, alpha, beta),
    }
    print("predicted communication per step: "
          + ", ".join(f"{kind} {1e3 * seconds:.2f} ms" for kind, seconds in predicted.items()))
else:
    skip_or_fail("the check on this machine", "distributed", WHY_NOT)

# %%
# Now the measurement, and the check that both steps compute what one process
# computes.

if CAN_RUN_RANKS:
    step_inputs = (dp_model, dp_inputs, dp_targets, tp_blocks, tp_inputs)
    results = run_ranks(steps_worker, CHECK_RANKS, *step_inputs, backend=BACKEND)
    if USE_NCCL:
        # One GPU computes the reference: the same float32 sums on another chip (this CPU)
        # would differ by more than the ranks' own reordering of them.
        want_dp_grads, want_tp_output, want_tp_input_grad = run_ranks(
            single_process_steps, 1, *step_inputs, backend=BACKEND)[0]
    else:
        want_dp_grads, want_tp_output, want_tp_input_grad = single_process_steps(0, 1, *step_inputs)

    # A float32 sum of n terms, added in another order, moves by about sqrt(n) rounding
    # steps of its terms: the tolerance grows with the longest sum (the FFN's width), and a
    # bfloat16 or a missing all-reduce still misses it by orders of magnitude.
    summed = 4 * torch.finfo(torch.float32).eps * max(TP_FFN, *DP_WIDTHS) ** 0.5

    def check(got, want, what):
        torch.testing.assert_close(got, want, rtol=summed, atol=summed * want.abs().max().item(), msg=what)

    for rank, result in enumerate(results):
        for got, want in zip(result["dp_grads"], want_dp_grads):
            check(got, want, lambda m, rank=rank: f"DP gradient, rank {rank}: {m}")
    for rank, result in enumerate(results):
        assert all(len(log) == 2 * TP_BLOCKS for log in result["logs"]["TP", True]), "all-reduces per step"
        check(result["tp_output"], want_tp_output, lambda m, rank=rank: f"TP output, rank {rank}: {m}")
        check(result["tp_input_grad"], want_tp_input_grad,
              lambda m, rank=rank: f"TP input gradient, rank {rank}: {m}")
    print(f"DP gradients and TP outputs and input gradients match one process on all "
          f"{CHECK_RANKS} ranks")

    measured = {kind: collective_seconds([r["logs"][kind, True] for r in results]) for kind in predicted}
    in_step = {kind: seconds_in_step([r["logs"][kind, False] for r in results]) for kind in predicted}
    print(f"{'step':>5} {'predicted ms':>13} {'measured ms':>12} {'ratio':>6} {'in the step, waits too':>23}")
    for kind, seconds in predicted.items():
        print(f"{kind:>5} {1e3 * seconds:13.2f} {1e3 * measured[kind]:12.2f} "
              f"{measured[kind] / seconds:6.2f} {1e3 * in_step[kind]:20.2f} ms")
    # Loaded cores turn a rank's wait for a message into a wait for a core.
    on_core = min(r["on_core"] for r in results)
    print(f"ranks' time on a core while computing: at least {on_core:.0%}")
    # Small messages cost mostly the wake-up of the receiving rank's thread, which
    # varies from run to run far more than bandwidth: TP's bound is looser.
    allowed = {"DP": 2, "TP": 4}
    if on_core >= 0.9:
        for kind, seconds in predicted.items():
            assert 1 / allowed[kind] <= measured[kind] / seconds <= allowed[kind], (
                f"{kind}: measured {measured[kind]:.2e} s, predicted {seconds:.2e} s")
        print("measured within a factor of 2 of the prediction for DP, of 4 for TP")
    else:
        print("Other processes took this machine's cores during the check: the measured times "
              "are not compared with the prediction.")


# %%
# What to take away
# -----------------
# * Memory decides first. With the whole optimizer state on every GPU, plain
#   data parallelism only just fits the 7B model; ZeRO-1 frees most of it at no
#   extra communication. The 70B model needs its weights split, by pipeline,
#   tensor or FSDP sharding, before any layout fits at all.
# * Among the layouts that fit, the estimated step times are close: at the
#   datasheet peak the matmuls of a 4M-token batch take far longer than the
#   gradient all-reduce, and a well-placed layout keeps the heavy traffic
#   (tensor parallelism) on NVLink. What separates layouts is how often they
#   communicate: FSDP with one-sequence micro-batches gathers every weight
#   twice per micro-batch, across the network once its group leaves the
#   node, and lands at the right of the figure.
# * Across nodes a collective gets the adapters of its members in each node:
#   the node's whole egress, 400 GB/s, when all eight GPUs of every node are
#   in the group, one adapter's 50 GB/s when only one is. The picks for the
#   three published 8,192-token runs, Llama 3 405B's and torchtitan's FSDP
#   over 128 GPUs, agree with the degrees those runs used.
# * At 131,072 tokens the batch alone demands context parallel: 128
#   sequences cannot fill 16,384 GPUs unless :math:`tc \ge 128`. The planner
#   then prefers more of it than Llama 3 used, and the tables above say why:
#   the published layout spends less time communicating than the pick, but
#   in this model its activations fit only with full recomputation and its 16
#   micro-batches leave half the step to the bubble. Both hold as much for
#   Llama 3's 8,192-token layout on the same GPUs, which the planner
#   reproduces only because it may not use context parallel there. The
#   disagreement lies in the compute model, all-or-nothing recomputation and
#   a plain 1F1B bubble, not in context parallel's traffic; for the same
#   reasons the model alone would put context parallel into the 8192-token
#   runs too, which is why the planner tries it only where nothing fits
#   without it. It also leaves out what would narrow the gap: Llama 3's
#   interleaved schedule, the output head's weight on the last stage (a
#   larger share of the pick's 4-layer stages than of the published 8-layer
#   ones), and kernel efficiency on shorter shards. Causal attention could
#   hide a ring at the published degrees with room to spare, the pick's only
#   just, and less in the backward pass, where each step also returns float32
#   gradients.
# * Expert parallel buys memory and costs all-to-alls. Inside a node they
#   cross NVLink and cost little against the experts' matmuls; once the
#   group spans nodes, each GPU's adapter carries most of the routed tokens,
#   and every such layout falls well behind. Where the experts must be split
#   to fit, the planner splits them within a node.
# * The model is simple on purpose: no overlap of communication with compute,
#   a peak compute rate no real step reaches, ring collectives only, assumed
#   latencies, stages split by their count of layers alone; uniform routing
#   with no capacity padding and no limit on the nodes a token reaches;
#   recomputation of everything or of nothing; no interleaved schedule. It
#   ranks layouts; it does not predict a step time to the second.
# * The method, fit alpha and beta and add up the messages, is the part we
#   could test here, on gloo over loopback with two ranks (with 2 or more
#   GPUs, on NCCL); the table above
#   compares its prediction with the measured communication of both steps.
#   The fitted values describe this machine, not a GPU cluster.

KEY_FIGURES = {"device": DEVICE_NAME}
KEY_FIGURES.update({f"pick_{job.replace(' ', '_')}": layout_name(pick) for job, pick in picks.items()})
KEY_FIGURES.update({f"published_pick_{job.replace(' ', '_')}": layout_name(pick)
                    for job, pick in published_picks.items()})
KEY_FIGURES.update({
    "allreduce_14GB_one_node_ms": all_reduce_ms[8, 8],
    "allreduce_14GB_4_nodes_x_8_ms": all_reduce_ms[32, 8],
    "allreduce_14GB_32_nodes_x_1_ms": all_reduce_ms[32, 1],
    "dp_hiding_tokens_per_gpu_8_per_node": hiding_tokens["8 GPUs per node"],
    "dp_hiding_tokens_per_gpu_1_per_node": hiding_tokens["1 GPU per node"],
    "fsdp_70B_32_gpus_network_s": fsdp_s,
    "tp8_dp4_70B_network_s": hybrid_s,
    "fsdp_over_tp8_dp4": fsdp_s / hybrid_s,
    "pick_long_context_131072": layout_name(long_pick),
    "long_context_published_over_pick": long_published["step"] / long_pick["step"],
    "long_context_published_attention_over_ring": hiding[degrees_name(*LONG_CONTEXT_PUBLISHED)],
    "long_context_pick_attention_over_ring": hiding[degrees_name(*degrees(long_pick))],
    **{f"pick_cp_open_8192_tokens_{gpus}_gpus": layout_name(row) for gpus, row in open_cp_picks.items()},
    "pick_Mixtral_8x22B_on_64_GPUs": layout_name(moe_pick),
    "moe_ep_across_nodes_over_pick": moe_across["step"] / moe_pick["step"],
    "moe_without_ep_over_pick": moe_without_ep["step"] / moe_pick["step"],
})
if CAN_RUN_RANKS:
    KEY_FIGURES.update({"alpha_us": 1e6 * alpha, "bandwidth_GBps": beta / 1e9,
                        **{f"{kind}_comm_predicted_ms": 1e3 * t for kind, t in predicted.items()},
                        **{f"{kind}_comm_measured_ms": 1e3 * t for kind, t in measured.items()}})
