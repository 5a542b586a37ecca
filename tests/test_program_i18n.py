"""The Chinese rendering of a program computes what the English one does.

sphinxext/program_i18n.py finds the messages of an example (comments, docstrings, the
strings a reader sees) and rebuilds the program from their translations. These tests
check it on every example with a stand-in translation, and plant the translations that
must be refused: one that changes the code, one that drops or adds an f-string's field,
one that is missing.
"""

import ast
import sys

import pytest

from tools.site_build import EXAMPLES, REPO

sys.path.insert(0, str(REPO / "sphinxext"))
import program_i18n
from program_i18n import (
    ProgramTranslationError,
    display_width,
    fields,
    masked_tree,
    messages,
    translate,
)


def stand_in(message):
    """A translation that keeps every field and adds wide characters: 「译」 in front."""
    if message.kind == "f-string" and program_i18n._only_labels(message.msgid):
        return message.msgid  # a table's header: its width is its columns'
    if message.kind == "docstring":
        first, _, rest = message.msgid.partition("\n")
        return "译：" + first + ("\n" + rest if rest else "")
    return "译：" + message.msgid


@pytest.mark.parametrize("example", EXAMPLES, ids=lambda p: p.stem)
def test_every_example_renders_to_an_equivalent_program(example):
    source = example.read_text(encoding="utf-8")
    found = messages(source)
    assert len(found) >= 10, f"{example.name}: only {len(found)} messages"
    assert translate(source, {m.msgid: "" for m in found}) == source  # nothing translated: the same file
    rendering = translate(source, {m.msgid: stand_in(m) for m in found})
    assert masked_tree(rendering) == masked_tree(source)
    compile(rendering, example.name, "exec")
    headers = {m.msgid for m in found if m.kind == "f-string" and program_i18n._only_labels(m.msgid)}
    assert rendering.count("译：") >= len({m.msgid for m in found} - headers)
    too_wide = [line for line in rendering.splitlines()
                if line.lstrip().startswith("#") and "译" in line and display_width(line) > program_i18n.WIDTH]
    assert not too_wide, too_wide[:3]


PROGRAM = '''\
"""The module's docstring: the page's title, translated with the page."""

import torch

# %%
# A text block of the gallery: the page's prose, not a program message.

MODES = {"max-autotune": 1}


def speedup(eager_ms, compiled_ms):
    """How many times faster the compiled function is."""
    return eager_ms / compiled_ms  # a ratio of two times


# Compile once, then time it.
# The first call includes the compilation.
compiled = torch.compile(torch.sin, mode="max-autotune")
device = "cuda" if torch.cuda.is_available() else "cpu"
if device == "cuda":
    print("on a GPU")
print(f"eager: {1.5:.2f} ms; compiled: {0.5:.2f} ms ({speedup(1.5, 0.5):.1f}x faster)")
label = "first call (includes compilation)"
'''


def by_text():
    return {m.msgid: m for m in messages(PROGRAM)}


def test_messages_are_what_a_reader_sees_and_nothing_the_code_uses():
    found = by_text()
    assert set(found) == {
        "How many times faster the compiled function is.",
        "a ratio of two times",
        "Compile once, then time it. The first call includes the compilation.",
        "on a GPU",
        "eager: {1.5:.2f} ms; compiled: {0.5:.2f} ms ({speedup(1.5, 0.5):.1f}x faster)",
        "first call (includes compilation)",
    }, sorted(found)
    assert found["on a GPU"].kind == "string"
    assert found["a ratio of two times"].kind == "comment"
    assert found["How many times faster the compiled function is."].kind == "docstring"


ZH = {
    "How many times faster the compiled function is.": "编译后的函数快多少倍。",
    "a ratio of two times": "两个时间之比",
    "Compile once, then time it. The first call includes the compilation.": "先编译一次，再计时。首次调用包含编译。",
    "on a GPU": "在 GPU 上",
    "eager: {1.5:.2f} ms; compiled: {0.5:.2f} ms ({speedup(1.5, 0.5):.1f}x faster)":
        "普通执行：{1.5:.2f} ms；编译后：{0.5:.2f} ms（加速 {speedup(1.5, 0.5):.1f} 倍）",
    "first call (includes compilation)": "首次调用（包含编译）",
}


def test_a_translation_rebuilds_the_program_in_chinese(capsys):
    rendering = translate(PROGRAM, ZH)
    assert "# 先编译一次，再计时。首次调用包含编译。\n" in rendering
    assert "return eager_ms / compiled_ms  # 两个时间之比\n" in rendering
    assert '"""编译后的函数快多少倍。"""' in rendering
    assert 'mode="max-autotune"' in rendering and 'device == "cuda"' in rendering
    assert "# A text block of the gallery" in rendering  # the page's prose stays for the page catalog
    namespace = {}
    runnable = (rendering.replace("import torch\n", "").replace("torch.compile(torch.sin, ", "dict(")
                .replace("torch.cuda.is_available()", "False"))
    exec(compile(runnable, "zh", "exec"), namespace)  # noqa: S102 (the test's own program)
    assert capsys.readouterr().out == "普通执行：1.50 ms；编译后：0.50 ms（加速 3.0 倍）\n"
    assert namespace["label"] == "首次调用（包含编译）"


def test_a_translation_cannot_break_out_of_its_string():
    planted = dict(ZH, **{"on a GPU": '在 GPU 上"); import os; os.remove("x'})
    rendering = translate(PROGRAM, planted)
    assert masked_tree(rendering) == masked_tree(PROGRAM)
    assert 'os.remove("x' in rendering and "import os" not in ast.dump(ast.parse(rendering)).split("Constant")[0]


@pytest.mark.parametrize("planted, complaint", [
    ("普通执行：{1.5:.2f} ms；编译后：{0.5:.2f} ms", "replacement fields"),  # a field dropped
    ("普通执行：{1.5:.3f} ms；编译后：{0.5:.2f} ms（加速 {speedup(1.5, 0.5):.1f} 倍）", "replacement fields"),
    ("普通执行：{1.5:.2f} ms；编译后：{0.5:.2f} ms（加速 {speedup(0.5, 1.5):.1f} 倍）", "replacement fields"),
    ("普通执行：{1.5:.2f} ms；编译后：{0.5:.2f} ms（加速 {speedup(1.5, 0.5):.1f} 倍）{device}", "replacement fields"),
])
def test_an_f_string_keeps_exactly_its_fields(planted, complaint):
    key = "eager: {1.5:.2f} ms; compiled: {0.5:.2f} ms ({speedup(1.5, 0.5):.1f}x faster)"
    with pytest.raises(ProgramTranslationError, match=complaint):
        translate(PROGRAM, dict(ZH, **{key: planted}))


def test_fields_are_read_as_the_parser_reads_them():
    assert fields("a {x:>8} b {y!r}") == fields("甲 {x:>8} 乙 {y!r}")
    assert fields("{x:>8}") != fields("{x:>9}")
    assert fields("{{not a field}} {x}") == fields("{x}")


def test_a_missing_translation_is_named():
    partial = {k: v for k, v in ZH.items() if k != "on a GPU"}
    with pytest.raises(ProgramTranslationError, match="line 21: 'on a GPU'"):
        translate(PROGRAM, partial)
    assert "on a GPU" in translate(PROGRAM, partial, strict=False)


def test_the_invariant_sees_a_change_of_code():
    with pytest.raises(ProgramTranslationError, match="computes something else"):
        program_i18n.check_equivalent(PROGRAM, PROGRAM.replace("eager_ms / compiled_ms", "compiled_ms / eager_ms"))
    with pytest.raises(ProgramTranslationError, match="computes something else"):
        program_i18n.check_equivalent(PROGRAM, PROGRAM.replace('{1.5:.2f} ms;', '{1.5:.3f} ms;'))
    with pytest.raises(ProgramTranslationError, match="does not parse"):
        program_i18n.check_equivalent(PROGRAM, PROGRAM.replace('print("on a GPU")', 'print("on a GPU)'))
    program_i18n.check_equivalent(PROGRAM, PROGRAM.replace('"on a GPU"', '"在 GPU 上"'))


TABLE = '''\
cpu, threads, ms = "x86", 2, 1.25
print(f"CPU          : {cpu}")
print(f"torch threads: {threads}")
print(f"{'workload':<10} {'time ms':>9}")
print(f"{'GeLU':<10} {ms:>9.3f}")
'''
TABLE_ZH = {"CPU          : {cpu}": "CPU：         {cpu}", "torch threads: {threads}": "torch 线程数：{threads}",
            "{'workload':<10} {'time ms':>9}": "{'工作负载':<6} {'耗时 ms':>7}",
            "{'GeLU':<10} {ms:>9.3f}": "{'GeLU':<10} {ms:>9.3f}"}  # a name: kept


def test_a_table_s_columns_line_up_by_display_width(capsys):
    """A header's label fields may change their text and width; what they print keeps its
    columns, a Chinese character counting two."""
    rendering = translate(TABLE, TABLE_ZH)
    exec(compile(rendering, "zh", "exec"), {})  # noqa: S102 (the test's own program)
    lines = capsys.readouterr().out.splitlines()
    assert lines[2] == "工作负载     耗时 ms" and display_width(lines[2]) == display_width(lines[3]) == 20
    assert display_width(lines[0].removesuffix("x86")) == display_width(lines[1].removesuffix("2")) == 14


@pytest.mark.parametrize("planted, complaint", [
    ({"{'workload':<10} {'time ms':>9}": "{'工作负载':<10} {'耗时 ms':>9}"}, "takes 11 columns"),  # padded by len
    ({"{'workload':<10} {'time ms':>9}": "{'工作负载':<6} {x:>7}"}, "replacement fields"),  # a label became code
    ({"CPU          : {cpu}": "CPU：{cpu}"}, "values start at columns"),  # the values no longer line up
    ({"{'workload':<10} {'time ms':>9}": "{'工作负载':<6}{'耗时 ms':>7}"}, "keep its spaces"),  # a space dropped
    ({"{'workload':<10} {'time ms':>9}": "{'工作负载':<100000} {'耗时 ms':>7}"}, "takes 100004 columns"),
    ({"{'workload':<10} {'time ms':>9}": "{'负载的名称工作':<3} {'耗时 ms':>7}"}, "wider than its column"),
    ({"{'workload':<10} {'time ms':>9}": "{'工作负载':=6} {'耗时 ms':>7}"}, "not allowed in string format"),
])
def test_a_misaligned_table_is_refused(planted, complaint):
    with pytest.raises(ProgramTranslationError, match=complaint):
        translate(TABLE, dict(TABLE_ZH, **planted))


def test_display_width_counts_wide_characters_twice():
    assert display_width("GPU") == 3
    assert display_width("普通执行") == 8
    assert display_width("加速 3.0 倍（") == 13


@pytest.mark.parametrize("example", EXAMPLES, ids=lambda p: p.stem)
def test_every_program_message_has_its_translation(example):
    """The Chinese program of each example renders from its catalog: every message has a
    translation (a fuzzy one counts as missing), each f-string keeps its fields, and the
    program equals the English one but for its strings. ``make translations`` puts a new
    message in the catalog; tools/program_messages.py pending lists what to translate."""
    sys.path.insert(0, str(REPO / "tools"))
    import program_messages

    rendering = program_messages.render(example)
    assert masked_tree(rendering) == masked_tree(example.read_text(encoding="utf-8"))
    chinese = [msgid for msgid, msgstr in program_messages.translations(example).items()
               if any("\u4e00" <= c <= "\u9fff" for c in msgstr)]
    assert len(chinese) >= 0.85 * len(messages(example.read_text(encoding="utf-8"))), (
        f"{example.name}: only {len(chinese)} messages in Chinese")


PROSE = '''\
"""
Fusion
======

One kernel instead of three.
It reads the input once.
"""

# %%
# Predict
# -------
# A kernel launch costs
# about 5 us.
#
# - first item,
#   continued
# - second item
#
# .. math:: t = t_0 + n / B

x = 1  # a comment
'''
PROSE_ZH = {"Fusion": "融合", "One kernel instead of three. It reads the input once.": "一个核函数代替三个。它只读一次输入。",
            "Predict": "预测", "A kernel launch costs about 5 us.": "一次核函数启动约需 5 us。",
            "first item, continued": "第一项，接续", "t = t_0 + n / B": "不该用上"}


def test_the_page_s_prose_goes_into_the_program_one_line_a_paragraph():
    out = program_i18n.translate_text_blocks(PROSE, PROSE_ZH, width=None)
    assert '"""\n融合\n====\n\n一个核函数代替三个。它只读一次输入。\n"""' in out  # underline by display width
    assert "# 预测\n# ----\n# 一次核函数启动约需 5 us。\n#\n# - 第一项，接续\n# - second item\n" in out
    assert "# .. math:: t = t_0 + n / B\n" in out and "x = 1  # a comment\n" in out
    assert masked_tree(out) == masked_tree(PROSE)
    wrapped = program_i18n.translate_text_blocks(PROSE, PROSE_ZH, width=20)
    chinese = [line for line in wrapped.splitlines() if line.startswith("# ") and display_width(line) > len(line)]
    assert len(chinese) >= 4 and max(map(display_width, chinese)) <= 20, chinese
