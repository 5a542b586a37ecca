"""Lecture 6, examples 03 and 04: their checks refuse a planted fault, and they share one build.

The checks are small functions in the examples, read out of the source (the
examples are not run) and given good data, which they accept, and one planted
fault each, which they must refuse. Example 04 loads example 03's CUDA build
instead of compiling the kernel again, which works only while both pass
``load_inline`` the very same arguments.
"""

import ast
import math
import os
import warnings
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

EXAMPLES = Path(__file__).resolve().parent.parent / "examples" / "lecture06_kernels_triton"
CUDA_EXAMPLE = EXAMPLES / "03_cuda_kernels.py"
TRITON_EXAMPLE = EXAMPLES / "04_triton_basics.py"


def definitions(example, names, **namespace):
    """The named top-level functions and constants of an example, defined on their own."""
    tree = ast.parse(example.read_text())

    def name_of(node):
        if isinstance(node, ast.FunctionDef):
            return node.name
        if isinstance(node, ast.Assign) and isinstance(node.targets[0], ast.Name):
            return node.targets[0].id
        return None

    found = [node for node in tree.body if name_of(node) in names]
    assert sorted(map(name_of, found)) == sorted(names), f"{example.name} lacks one of {names}"
    namespace = {"torch": torch, "F": F, "math": math, "os": os, "warnings": warnings, **namespace}
    exec(compile(ast.Module(found, type_ignores=[]), str(example), "exec"), namespace)  # noqa: S102 (our own example)
    return namespace


# Example 04: a function around a Triton kernel must be one graph (checked on a GPU).


def test_one_graph_check_accepts_one_graph_and_refuses_a_graph_break():
    assert_one_graph = definitions(TRITON_EXAMPLE, ["assert_one_graph"])["assert_one_graph"]

    def one_graph(x):
        return torch.sin(x) * 2 + 1

    def broken(x):
        y = torch.sin(x) * 2
        if y.sum().item() > 0:  # a value read in Python: a graph break
            y = y + 1
        return torch.cos(y)

    x = torch.randn(100)
    try:
        assert_one_graph(one_graph, x)
        with pytest.raises(RuntimeError, match="expected one graph"):
            assert_one_graph(broken, x)
    finally:
        torch._dynamo.reset()


# Example 04: every GeLU checked on its own fresh input, to float32 rounding.


def test_gelu_check_accepts_float32_and_refuses_bfloat16_rounding():
    check_gelu = definitions(TRITON_EXAMPLE, ["check_gelu"], DEVICE="cpu",
                             N_GELU_CHECK=100_003)["check_gelu"]
    torch.manual_seed(0)
    assert check_gelu(lambda x: F.gelu(x, approximate="tanh")) < 1e-5

    def gelu_of_rounded_input(x):  # a precision bug: the input passes through bfloat16
        return F.gelu(x.bfloat16().float(), approximate="tanh")

    with pytest.raises(AssertionError):
        check_gelu(gelu_of_rounded_input)


# Examples 03 and 04: one CUDA build, because the load_inline arguments are the same.


def test_example_04_loads_example_03s_cuda_build_with_the_same_arguments():
    names = ["CUDA_SOURCE", "BINDING_HEADERS", "CUDA_DECLARATION", "GELU_CUDA_EXTENSION"]
    ours = definitions(CUDA_EXAMPLE, names)["GELU_CUDA_EXTENSION"]
    theirs = definitions(TRITON_EXAMPLE, names)["GELU_CUDA_EXTENSION"]
    assert ours == theirs
    assert ours["cuda_sources"] and ours["name"] == "lecture06_gelu_cuda"
