"""Every claim that lecture 6's examples 05, 06 and 08 assert makes them raise when it fails.

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
                       "check_recompile_limit", "check_warm_compile", "OVERLAP_SCHEDULING", "DISTRIBUTED_PASSES",
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
    good = {"online_softmax": True, **dict.fromkeys(compile_checks["DISTRIBUTED_PASSES"], False),
            "bucket_all_gathers_fx": "none"}
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


# Example 08: kernels inside the compiler.

KERNELS_EXAMPLE = EXAMPLES / "08_kernels_in_the_compiler.py"


@pytest.fixture(scope="module")
def kernel_checks():
    checks = definitions(KERNELS_EXAMPLE, "step_reference", "check_against_float64",
                         "check_opaque_call", "check_kernel_inlined", "check_cudagraph_skips",
                         "alibi_slopes", "alibi_score", "causal_window", "alibi_window_bias",
                         "check_attention", "compiled_graphs", "check_trace", "artifacts")
    checks.update(ALPHA=2.5, WINDOW=7)  # the example's constants, one of them smaller
    return checks


OPAQUE_CODE = "buf0 = torch.ops.course.scaled_add_opaque.default(arg0_1, arg1_1, 2.5)\n"
VISIBLE_CODE = "@triton.jit\ndef scaled_add_kernel(x_ptr, y_ptr, out_ptr, n, alpha, BLOCK):\n"


def test_the_generated_code_must_show_how_the_operator_was_compiled(kernel_checks):
    kernel_checks["check_opaque_call"](OPAQUE_CODE)
    kernel_checks["check_kernel_inlined"](VISIBLE_CODE)
    with pytest.raises(AssertionError):
        kernel_checks["check_opaque_call"](VISIBLE_CODE)
    with pytest.raises(AssertionError):
        kernel_checks["check_opaque_call"](OPAQUE_CODE + VISIBLE_CODE)
    with pytest.raises(AssertionError):
        kernel_checks["check_kernel_inlined"](OPAQUE_CODE)


def test_a_scaled_add_a_thousandth_off_is_refused(kernel_checks):
    x, y = torch.randn(4097), torch.randn(4097)
    right = torch.relu(2.5 * x + y) * 3 + 1
    kernel_checks["check_against_float64"](right, x, y)
    wrong = torch.relu(2.5 * x + y * (1 + 2 ** -10)) * 3 + 1  # y off by about 0.1 %
    with pytest.raises(AssertionError):
        kernel_checks["check_against_float64"](wrong, x, y)


def test_cuda_graph_skips_are_asserted_on_each_device(kernel_checks):
    check = kernel_checks["check_cudagraph_skips"]
    check(0, on_gpu=True)
    check(1, on_gpu=False)
    with pytest.raises(AssertionError):
        check(1, on_gpu=True)
    with pytest.raises(AssertionError):
        check(0, on_gpu=False)


@pytest.mark.parametrize("planted", ["slopes", "window"])
def test_flex_attention_with_a_wrong_bias_or_window_is_refused(kernel_checks, planted):
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

    checks = kernel_checks
    torch.manual_seed(0)
    shape = (1, 3, 37, 8)
    q, k, v = (torch.randn(shape) for _ in range(3))
    slopes = checks["alibi_slopes"](3, "cpu")
    bias = checks["alibi_window_bias"](37, slopes.double())
    reference = torch.nn.functional.scaled_dot_product_attention(
        q.double(), k.double(), v.double(), attn_mask=bias)
    mask = create_block_mask(checks["causal_window"], None, None, 37, 37, device="cpu")
    right = flex_attention(q, k, v, score_mod=checks["alibi_score"](slopes), block_mask=mask)
    checks["check_attention"](right, reference)
    if planted == "slopes":  # the bias of the next head's slope
        wrong = flex_attention(q, k, v, score_mod=checks["alibi_score"](slopes / 2 ** (8 / 3)),
                               block_mask=mask)
    else:  # one key too many in the window

        def one_more_key(batch, head, query_index, key_index):
            return (checks["causal_window"](batch, head, query_index, key_index)
                    | (query_index - key_index == 7))

        wrong_mask = create_block_mask(one_more_key, None, None, 37, 37, device="cpu")
        wrong = flex_attention(q, k, v, score_mod=checks["alibi_score"](slopes),
                               block_mask=wrong_mask)
    with pytest.raises(AssertionError):
        checks["check_attention"](wrong, reference)


def trace_rows(recompile_reason="1/0: activation == 'sin'",
               resume="torch_dynamo_resume_in_breaks_once_at_5"):
    return [("0/0", "breaks_once", ["sum"], 8, None), ("1/0", resume, ["sin"], 13, None),
            ("1/1", resume, ["cos"], 13, recompile_reason)]


GRAPH_BREAK = ({"artifact": {"name": "dynamo_graph_break_reason"}},
               "Unsupported Tensor.item() call with capture_scalar_outputs=False")


@pytest.mark.parametrize("rows, entries", [
    (trace_rows()[:2], [GRAPH_BREAK]),
    (trace_rows(recompile_reason="1/0: ___stack0 == -2.55"), [GRAPH_BREAK]),
    (trace_rows(resume="breaks_once"), [GRAPH_BREAK]),
    (trace_rows(), []),
])
def test_the_trace_must_show_the_break_the_resume_function_and_the_failed_guard(
        kernel_checks, rows, entries):
    kernel_checks["check_trace"](trace_rows(), [GRAPH_BREAK])
    with pytest.raises(AssertionError):
        kernel_checks["check_trace"](rows, entries)


def test_the_trace_is_read_into_one_row_per_graph(kernel_checks):
    entries = [({"dynamo_output_graph": {}}, "    sum_1 = l_x_.sum();  l_x_ = None\n"),
               ({"compilation_metrics": {"compile_id": "0/0", "co_name": "f", "guard_count": 8}},
                "")]
    assert kernel_checks["compiled_graphs"](entries) == [("0/0", "f", ["sum"], 8, None)]


# Example 08, run: a Triton kernel that computes alpha * (x + y) fails its first check.

def test_a_wrong_kernel_fails_example_08(tmp_path):
    source = KERNELS_EXAMPLE.read_text()
    anchor = "tl.store(out_ptr + offsets, alpha * x + y, mask=inside)"
    assert source.count(anchor) == 1
    first_part = source[:source.index("# %%\n# 2. CUDA graphs")]  # setup and section 1
    scratch = tmp_path / KERNELS_EXAMPLE.name
    scratch.write_text(first_part.replace(anchor, anchor.replace("alpha * x + y",
                                                                 "alpha * (x + y)")))
    env = {**os.environ, "TRITON_INTERPRET": "1", "MPLBACKEND": "Agg", "CUDA_VISIBLE_DEVICES": ""}
    done = subprocess.run([sys.executable, str(scratch)], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode != 0, done.stdout[-2000:]
    assert "check_against_float64" in done.stderr
    assert "AssertionError" in done.stderr
    assert "match float64" not in done.stdout
