"""Every claim that lecture 6's examples 05 and 06 assert makes them raise when it fails.

The checks are small functions in the examples. Here they are read out of the
example's source (without running the example), passed good data, which they
accept, and one planted fault each, which they must refuse. The every-config
check of example 05 needs the example's own kernel, so it runs in a scratch
copy of the example whose kernel is wrong only for the widest tiles.
"""

import ast
import logging
import math
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

EXAMPLES = Path(__file__).resolve().parent.parent / "examples" / "lecture06_kernels_triton"
SOFTMAX_EXAMPLE = EXAMPLES / "05_triton_softmax_matmul.py"
COMPILE_EXAMPLE = EXAMPLES / "06_torch_compile.py"


def definitions(example, *names):
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
    namespace = {"torch": torch, "math": math, "re": re, "os": os, "logging": logging}
    exec(compile(ast.Module(found, type_ignores=[]), str(example), "exec"), namespace)  # noqa: S102 (our own example)
    return namespace


# Example 05: softmax checked relative to each entry, rows summing to 1.


@pytest.fixture(scope="module")
def softmax_checks():
    return definitions(SOFTMAX_EXAMPLE, "SOFTMAX_RTOL", "assert_rows_sum_to_one",
                       "assert_softmax_matches")


def test_softmax_check_refuses_a_two_percent_error_that_the_old_tolerance_passed(softmax_checks):
    torch.manual_seed(0)
    x = torch.randn(33, 3000)
    right = torch.softmax(x, dim=1)
    softmax_checks["assert_softmax_matches"](right, x)
    wrong = right.clone()
    typical = right[0].argsort()[1500]  # an entry of the size of most, about 1/3000
    wrong[0, typical] *= 1.02  # 2 per cent off
    expected = torch.softmax(x.double(), dim=1).float()
    torch.testing.assert_close(wrong, expected)  # float32's default tolerance lets it pass
    with pytest.raises(AssertionError):
        softmax_checks["assert_softmax_matches"](wrong, x)


def test_rows_must_sum_to_one(softmax_checks):
    x = torch.randn(7, 100)
    softmax_checks["assert_rows_sum_to_one"](torch.softmax(x, dim=1))
    unnormalised = torch.exp(x - x.max(dim=1, keepdim=True).values)
    with pytest.raises(AssertionError):
        softmax_checks["assert_rows_sum_to_one"](unnormalised)


# Example 05: every autotune configuration is checked, not only the one that ran.

WIDE_TILES_ONLY_FAULT = '''        if BLOCK_N > 128:  # planted: wrong only for the widest tiles
            acc = acc * 1.01
        if ACTIVATION == "gelu_tanh":'''


def test_a_fault_in_one_autotune_config_fails_example_05(tmp_path):
    source = SOFTMAX_EXAMPLE.read_text()
    anchor = '        if ACTIVATION == "gelu_tanh":'
    assert source.count(anchor) == 1
    scratch = tmp_path / SOFTMAX_EXAMPLE.name
    scratch.write_text(source.replace(anchor, WIDE_TILES_ONLY_FAULT))
    env = {**os.environ, "TRITON_INTERPRET": "1", "MPLBACKEND": "Agg", "CUDA_VISIBLE_DEVICES": ""}
    done = subprocess.run([sys.executable, str(scratch)], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode != 0, done.stdout[-2000:]
    # The fixed configuration the CPU launches passed; the sweep over all of them did not.
    assert "plain and GELU epilogue match float64" in done.stdout
    assert "check_every_matmul_config" in done.stderr
    assert "AssertionError" in done.stderr


# Example 06: graph counts, FakeTensors, the recompile limit.


@pytest.fixture(scope="module")
def compile_checks():
    return definitions(COMPILE_EXAMPLE, "check_graph_count", "check_traced_on_fake_tensors",
                       "check_recompile_limit", "check_warm_compile", "DISTRIBUTED_PASSES",
                       "check_inductor_defaults", "check_online_softmax_code",
                       "check_attention_rewritten", "allocated_sizes",
                       "check_flex_attention_code", "check_mode_options")


def test_graph_counts_are_asserted(compile_checks):
    check = compile_checks["check_graph_count"]
    check("default", ["static", "dynamic"], 2, expected=2)
    with pytest.raises(AssertionError):
        check("default", ["static", "static", "static"], 3, expected=2)
    with pytest.raises(AssertionError):
        check("mark_dynamic", ["dynamic"], 2, expected=1)  # the counter disagrees


def test_tracing_on_real_tensors_is_refused(compile_checks):
    compile_checks["check_traced_on_fake_tensors"]([True, True])
    with pytest.raises(AssertionError):
        compile_checks["check_traced_on_fake_tensors"]([True, False])


RECOMPILE_WARNING = "torch._dynamo hit config.recompile_limit (8)"


@pytest.mark.parametrize("planted", [
    {"kinds": ["static"] * 9},
    {"warnings": []},
    {"runs": {"new": 1, "old": 1}},
    {"runs": {"new": 0, "old": 0}},
])
def test_recompile_limit_behaviour_is_asserted(compile_checks, planted):
    check = compile_checks["check_recompile_limit"]
    good = {"limit": 8, "kinds": ["static"] * 8, "warnings": [RECOMPILE_WARNING],
            "runs": {"new": 0, "old": 1}}
    check(**good)
    with pytest.raises(AssertionError):
        check(**{**good, **planted})


def test_warm_compile_must_hit_the_cache_and_be_faster(compile_checks):
    check = compile_checks["check_warm_compile"]
    check(cold_s=20.0, warm_s=0.2, cache_hits=1)
    with pytest.raises(AssertionError):
        check(cold_s=20.0, warm_s=0.2, cache_hits=0)
    with pytest.raises(AssertionError):
        check(cold_s=1.0, warm_s=2.0, cache_hits=1)


# Example 06: what the compiler does beyond fusion.


def test_inductor_defaults_are_asserted(compile_checks, monkeypatch):
    monkeypatch.delenv("TORCHINDUCTOR_ONLINE_SOFTMAX", raising=False)
    check = compile_checks["check_inductor_defaults"]
    good = {"online_softmax": True, "_micro_pipeline_tp": False,
            "bucket_all_gathers_fx": "none", "reorder_for_compute_comm_overlap": False}
    check(good)
    with pytest.raises(AssertionError):
        check({**good, "online_softmax": False})
    with pytest.raises(AssertionError):
        check({**good, "bucket_all_gathers_fx": "all"})


def test_online_softmax_must_appear_in_the_kernel(compile_checks):
    check = compile_checks["check_online_softmax_code"]
    check("tmp3, tmp4 = triton_helpers.online_softmax_reduce(tmp0, tmp1, tmp2, 1)")
    with pytest.raises(AssertionError):
        check("tmp1 = triton_helpers.max2(tmp0, 1)")


def test_attention_rewrite_is_asserted(compile_checks):
    check = compile_checks["check_attention_rewritten"]
    check(["_scaled_dot_product_flash_attention_for_cpu"])
    with pytest.raises(AssertionError):
        check([])


FLEX_WRAPPER = """
    buf2 = empty_strided_cpu((2, 3, 97, 40), (11640, 3880, 40, 1), torch.float32)
    cpp_fused_flex_attention_0(arg0_1, arg1_1, arg2_1, buf2)
"""


@pytest.mark.parametrize("planted", [
    "    buf3 = empty_strided_cpu((2, 3, 97, 97), (28227, 9409, 97, 1), torch.float32)\n",
    "    extern_kernels.bmm(arg0_1, arg1_1, out=buf3)\n",
])
def test_flex_attention_must_not_need_the_score_matrix(compile_checks, planted):
    check = compile_checks["check_flex_attention_code"]
    assert check(FLEX_WRAPPER, (2, 3, 97, 40)) == 2 * 3 * 97 * 40
    with pytest.raises(AssertionError):
        check(FLEX_WRAPPER + planted, (2, 3, 97, 40))


def test_max_autotune_options_are_asserted(compile_checks):
    check = compile_checks["check_mode_options"]
    options = torch._inductor.list_mode_options()
    check(options)
    without_graphs = {**options, "max-autotune": {**options["max-autotune"],
                                                  "triton.cudagraphs": False}}
    with pytest.raises(AssertionError):
        check(without_graphs)
    with_graphs = {**options, "max-autotune-no-cudagraphs": options["max-autotune"]}
    with pytest.raises(AssertionError):
        check(with_graphs)
