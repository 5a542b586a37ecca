"""The Chinese edition is complete, current and well formed.

Complete and current: every message of every page is translated. Well formed:
CJK typography (autocorrect-py and our rules) and markup parity, checked by
tools/check_translation.py; each check also runs on a planted bad translation
to show that it fails. Terminology is tests/test_terminology.py.
"""

import subprocess
import sys

import pytest
from babel.messages.pofile import read_po

from tools.catalog_stats import LOCALE, all_stats, fuzzy_headers
from tools.check_translation import (
    markup_findings,
    rst_findings,
    translated_messages,
    typography_findings,
    write_catalog,
)
from tools.site_build import copy_checkout

PLANTED = "auto_examples/lecture06_kernels_triton/planted.po"


def test_every_catalog_is_fully_translated():
    stats = all_stats()
    assert stats, "no catalogs"
    incomplete = {name: s for name, s in stats.items() if s[1] or s[2]}
    assert not incomplete, f"(translated, untranslated, fuzzy): {incomplete}"


@pytest.fixture(scope="module")
def templates(tmp_path_factory):
    """The messages the English pages have now, extracted afresh with the gettext builder."""
    checkout = copy_checkout(tmp_path_factory.mktemp("gettext"))
    out = checkout / "_build" / "gettext"
    subprocess.run(
        [sys.executable, "-m", "sphinx", "-c", ".", "-b", "gettext", "-D", "plot_gallery=0",
         "-q", "source", str(out)],
        cwd=checkout, check=True, capture_output=True,
    )
    return out


def test_catalogs_are_current(templates):
    pages = sorted(templates.rglob("*.pot"))
    assert pages
    for pot in pages:
        name = pot.relative_to(templates).with_suffix(".po")
        po = LOCALE / name
        assert po.is_file(), f"no catalog for {name}: run make translations"
        with open(pot, "rb") as f:
            wanted = {m.id for m in read_po(f) if m.id}
        with open(po, "rb") as f:
            have = {m.id for m in read_po(f) if m.id and m.string and not m.fuzzy}
        missing = wanted - have
        assert not missing, f"{name}: {len(missing)} messages not translated, e.g. {sorted(missing)[:2]}"


def test_no_catalog_header_is_fuzzy():
    """A fuzzy header makes msgfmt drop the header, charset included."""
    fuzzy = fuzzy_headers()
    assert not fuzzy, f"delete the '#, fuzzy' line above msgid \"\" in: {fuzzy}"


def test_a_fuzzy_header_is_reported(tmp_path):
    path = write_catalog(tmp_path, PLANTED, [("Setup", "准备工作")])
    path.write_text("#, fuzzy\n" + path.read_text(encoding="utf-8"), encoding="utf-8")
    assert fuzzy_headers(tmp_path) == [PLANTED]


# -- CJK typography ------------------------------------------------------------------------


def test_cjk_typography_of_every_translation():
    findings = typography_findings(translated_messages())
    assert not findings, "\n".join(map(str, findings))


def planted_typography(tmp_path, msgstr):
    write_catalog(tmp_path, PLANTED, [("A planted message.", msgstr)])
    return typography_findings(translated_messages(tmp_path))


@pytest.mark.parametrize("msgstr, wrong", [
    ("使用Triton编写核函数。", "使用Triton编写"),           # no space between Chinese and Latin
    ("运行10次。", "运行10次"),                              # nor between Chinese and digits
    ("先热身,再计时。", "热身,再计时"),                        # a half-width comma between Chinese words
    ("先热身 , 再计时。", "热身 , 再计时"),
    ("测到的是什么?", "什么?"),                              # half-width question mark
    ("这是\"说谎\"的计时器。", "\"说谎\""),                   # straight quotes
    ("用(括号)说明。", "(括号)"),                            # half-width parentheses around Chinese
    ("调用``torch.compile``即可。", "``torch.compile``"),    # code is Latin text: it wants spaces too
    ("`0.044715 * ·`, `x + ·`, `c * ·`", "`, `"),            # a Chinese list of code takes 、
    ("占用率为 25 %。", "25 %"),                             # no space before a percent sign
    ("读取 32 x 32 的分块。", "32 x 32"),                     # ASCII x for multiplication
    ("读取 32x32 的分块。", "32x32"),
    ("快了约 3x，仍受限。", "3x"),
    ("各个组成部分（流式多处理器（SM）、寄存器）", "（SM）"),    # nested full-width parentheses
    ("内存的延迟–带宽图景", "延迟–带宽"),                        # an en dash joining Chinese words
    ("按 α-β 模型估算", "α-β"),                                # or a hyphen
])
def test_a_typography_error_is_reported(tmp_path, msgstr, wrong):
    findings = planted_typography(tmp_path, msgstr)
    assert findings, f"no finding for {msgstr!r}"
    assert all(f.catalog == PLANTED and f.msgid == "A planted message." for f in findings)
    assert any(wrong in f.detail for f in findings), [f.detail for f in findings]


@pytest.mark.parametrize("msgstr", [
    "调用 ``torch.compile(fn, fullgraph=True)`` 即可，不需要 `a,b`。",   # code is left alone
    "设带宽为 :math:`B`\\ （字节/秒），则 $t = F/P,\\ Q/B$。",          # math and escapes too
    "这是\\ :ref:`sphx_glr_auto_examples_lecture05_gpus_03_fusion.py`\\ 的主题。",
    "{ref}`第 6 讲 <l6-fusion>`会讲到。",                             # the label shows Chinese
    "见 [NVIDIA 数据手册](https://www.nvidia.com/en-us/data-center/h200/)。",
    "`由 Sphinx-Gallery 生成的示例集 <https://sphinx-gallery.github.io>`_",
    "依据张量\\ *数值*\\ 的 Python ``if`` 语句",                 # emphasis joined with escapes
])
def test_markup_is_not_linted(tmp_path, msgstr):
    assert not planted_typography(tmp_path, msgstr)


@pytest.mark.parametrize("msgstr", [
    "占用率为 25%，约为 8%。",
    "读取 32×32 的分块，快了约 3×。",
    "调用 ``torch.empty(32, 32)`` 或 ``0x10``，并取 :math:`2 x 3`。",   # code and math are left alone
    "（见第 5 讲）和（SM）",                                          # side by side, not nested
    "内存的延迟—带宽图景，按 α—β 模型估算——先看小消息。",
    "如 ``a - b`` 和 $m - m'$ 所示。",
    "它的编号是 sm_90a，即 x86-64 上的 T4-16GB。",                     # hyphens inside Latin words
])
def test_the_good_form_is_not_reported(tmp_path, msgstr):
    assert not planted_typography(tmp_path, msgstr), planted_typography(tmp_path, msgstr)


def planted_example(tmp_path, msgstr, catalog=PLANTED, msgid="A planted message."):
    write_catalog(tmp_path, catalog, [(msgid, msgstr)])
    return typography_findings(translated_messages(tmp_path))


@pytest.mark.parametrize("msgstr, wrong", [
    ("编译器 *能* 消除的开销", "编译器 *能* 消除"),                # reStructuredText shows both spaces
    ("用 **中位数** 来汇总。", "**中位数** 来"),
    ("固定的 **开销**，来自 Python。", "的 **开销**"),
])
def test_a_visible_space_around_emphasis_is_reported_in_an_example(tmp_path, msgstr, wrong):
    findings = planted_example(tmp_path, msgstr)
    assert any("emphasis" in f.detail and wrong in f.detail for f in findings), [f.detail for f in findings]


@pytest.mark.parametrize("msgstr, catalog", [
    ("编译器\\ *能*\\ 消除的开销，用\\ **中位数**\\ 来汇总。", PLANTED),   # joined with escapes
    ("**运行要求。** 任何机器，用 *Triton* 编写。", PLANTED),                # a lead-in, Latin emphasis
    ("编译器 *能* 消除的开销", "lectures/planted.po"),                        # MyST: not this rule's business
])
def test_emphasis_joined_without_a_visible_space_is_not_reported(tmp_path, msgstr, catalog):
    assert not [f for f in planted_example(tmp_path, msgstr, catalog) if "emphasis" in f.detail]


def test_a_translated_source_title_is_reported(tmp_path):
    msgid = 'Each bank serves one word per cycle ("Shared Memory" in the guide), as "tile it" says.'
    bad = planted_example(tmp_path, "每个存储体每个周期提供一个字（指南中的“共享内存”一节），即“分块”。", msgid=msgid)
    assert [f.detail for f in bad] == ["quoted source title translated; keep it as it is: “Shared Memory”"], bad
    good = planted_example(tmp_path, "每个存储体每个周期提供一个字（指南中的“Shared Memory”一节），即“分块”。", msgid=msgid)
    assert not good, good


# -- Markup parity ---------------------------------------------------------------------------


def test_every_translation_keeps_its_markup():
    findings = markup_findings(translated_messages())
    assert not findings, "\n".join(map(str, findings))


@pytest.mark.parametrize("msgid, msgstr, lost", [
    ("Call `torch.compile` once.", "调用一次即可。", "`torch.compile`"),
    ("Time it with ``do_bench``.", "用 ``do_bench()`` 计时。", "``do_bench``"),
    ("See {ref}`the fusion section <l5-fusion>`.", "见{ref}`融合一节 <l5-fusion2>`。", "{ref}`l5-fusion`"),
    ("See :doc:`/lectures/lecture05_gpus`.", "见第 5 讲。", "{doc}`/lectures/lecture05_gpus`"),
    ("It reads [the guide](https://docs.nvidia.com/cuda/).", "见[指南](https://docs.nvidia.com/)。",
     "link https://docs.nvidia.com/cuda/"),
    ("It needs $2n^3$ FLOPs.", "它需要 $2n^2$ 次浮点运算。", "$2n^3$"),
    ("With :math:`B` (bytes/s).", "带宽为 B。", "{math}`B`"),
    ("Built by |project|.", "由本项目构建。", "|project|"),
    ("S = \\frac{QK^\\top}{\\sqrt{d}}", "S = \\frac{QK}{\\sqrt{d}}", ""),
])
def test_a_markup_change_is_reported(tmp_path, msgid, msgstr, lost):
    write_catalog(tmp_path, PLANTED, [(msgid, msgstr)])
    findings = markup_findings(translated_messages(tmp_path))
    assert [(f.catalog, f.msgid) for f in findings] == [(PLANTED, msgid)]
    assert lost in findings[0].detail, findings[0].detail


def test_every_example_translation_is_well_formed_rst():
    findings = rst_findings(translated_messages())
    assert not findings, "\n".join(map(str, findings))


@pytest.mark.parametrize("msgstr, ok", [
    ("``torch.cuda.memory_allocated``（按 rank 打印）", False),
    ("见 :math:`B`的值", False),
    ("``torch.cuda.memory_allocated``\\ （按 rank 打印）", True),
    ("用 ``do_bench`` 计时，见 :ref:`基准 <bench>`。", True),
])
def test_an_unclosed_literal_is_reported(tmp_path, msgstr, ok):
    name = "auto_examples/lecture07_parallelism/planted.po"
    write_catalog(tmp_path, name, [("Planted.", msgstr)])
    findings = rst_findings(translated_messages(tmp_path))
    assert [f.msgid for f in findings] == ([] if ok else ["Planted."]), findings


def test_a_formula_of_a_myst_page_translates_its_words_only(tmp_path):
    """sphinxext/myst_math_i18n.py renders a lecture page's translated formulas, so
    their \\text{} words translate as on the example pages, and nothing else may change."""
    write_catalog(tmp_path, "lectures/planted.po", [
        ("\\text{waves} = \\lceil b/S \\rceil", "\\text{波次数} = \\lceil b/S \\rceil"),
        ("\\text{tiles} = \\lceil n/t \\rceil", "\\text{分块数} = \\lceil n/s \\rceil"),
    ])
    findings = markup_findings(translated_messages(tmp_path))
    assert [f.msgid for f in findings] == ["\\text{tiles} = \\lceil n/t \\rceil"]
    assert "formula differs" in findings[0].detail


def test_translated_words_in_math_and_labels_keep_parity(tmp_path):
    write_catalog(tmp_path, PLANTED, [
        ("\\text{waves} = \\lceil b/S \\rceil", "\\text{波次数} = \\lceil b/S \\rceil"),
        ("See {ref}`the fusion section <l5-fusion>` and $t_\\text{eager}$.",
         "见{ref}`融合一节 <l5-fusion>`和 $t_\\text{eager}$。"),
        (":ref:`Go to the end <sphx_glr_download_x.py>` to download.", ":ref:`跳转到页末 <sphx_glr_download_x.py>` 下载。"),
    ])
    assert not markup_findings(translated_messages(tmp_path))
