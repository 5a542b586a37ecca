"""The Chinese edition keeps to its glossary: one rendering per term, no rejected variant.

The data is docs/glossary.toml; the checks are in tools/check_translation.py. Each
check is also run on a planted catalog with a bad translation, to show it fails.
"""

import re
import tomllib

from tools.check_translation import (
    GLOSSARY_DATA,
    load_glossary,
    terminology_findings,
    translated_messages,
    unused_exceptions,
    write_catalog,
)

GLOSSARY_PAGE = GLOSSARY_DATA.with_suffix(".md")
PLANTED = "lectures/planted.po"
PLANTED_EXAMPLE = "auto_examples/lecture05_gpus/planted.po"  # reStructuredText, whose formulas translate


def glossary_tables():
    """The rows of glossary.md's tables, as lists of cells."""
    rows = []
    for line in GLOSSARY_PAGE.read_text(encoding="utf-8").splitlines():
        if line.startswith("|") and not line.startswith("| ---"):
            rows.append([c.strip() for c in line.strip().strip("|").split("|")])
    return rows


def findings_for(tmp_path, pairs, fuzzy=(), glossary=None, catalog=PLANTED):
    write_catalog(tmp_path, catalog, pairs, fuzzy)
    return terminology_findings(translated_messages(tmp_path), glossary)


# -- The catalogs ----------------------------------------------------------------------------


def test_catalogs_keep_to_the_glossary():
    findings = terminology_findings(translated_messages())
    assert not findings, "\n".join(map(str, findings))


def test_every_exception_gives_a_reason_and_is_still_needed():
    glossary = load_glossary()
    terms = {t["en"] for t in glossary["term"]}
    for exception in glossary.get("exception", []):
        assert exception["term"] in terms, exception
        assert len(exception.get("reason", "")) > 20, f"say why: {exception}"
    stale = unused_exceptions(translated_messages(), glossary)
    assert not stale, f"these exceptions silence nothing any more; remove them: {stale}"


def test_glossary_page_and_data_agree():
    rows = glossary_tables()
    renderings = {cells[0]: cells[1] for cells in rows if len(cells) == 2}
    avoided = {cells[0]: cells[2] for cells in rows if len(cells) == 4}
    glossary = load_glossary()
    for term in glossary["term"]:
        assert term["en"] in renderings, f"glossary.md has no row for {term['en']!r}"
        assert term["zh"] in renderings[term["en"]], (term["en"], renderings[term["en"]], term["zh"])
        if term.get("reject") or term.get("reject_pattern"):
            assert term["en"] in avoided, f"glossary.md's 'One term for one idea' lacks {term['en']!r}"
            for variant in term.get("reject", []):
                assert variant in avoided[term["en"]], (term["en"], variant)
    rejecting = {t["en"] for t in glossary["term"] if t.get("reject") or t.get("reject_pattern")}
    assert set(avoided) - {"English"} <= rejecting, set(avoided) - rejecting


def test_glossary_patterns_compile():
    with open(GLOSSARY_DATA, "rb") as f:
        glossary = tomllib.load(f)
    for entry in glossary["term"] + glossary.get("style", []):
        for pattern in [entry.get("match", "x")] + entry.get("reject_pattern", []):
            re.compile(pattern)


# -- Planted failures ------------------------------------------------------------------------


def test_a_rejected_variant_is_reported_with_file_message_and_variant(tmp_path):
    findings = findings_for(tmp_path, [
        ("Eager PyTorch runs one kernel per operation.", "即时执行的 PyTorch 每个运算运行一个核函数。"),
    ])
    assert {(f.catalog, f.msgid) for f in findings} == {(PLANTED, "Eager PyTorch runs one kernel per operation.")}
    assert any("rejected '即时执行'" in f.detail and "eager" in f.detail for f in findings), findings


def test_a_rejected_style_is_reported(tmp_path):
    findings = findings_for(tmp_path, [("Compare them.", "对两者进行比较。")])
    assert len(findings) == 1 and "进行" in findings[0].detail


def test_a_missing_rendering_is_reported(tmp_path):
    findings = findings_for(tmp_path, [
        ("A fused kernel reads its input once.", "一个融合的内核只读一次输入。"),
    ])
    assert len(findings) == 1
    assert findings[0].msgid == "A fused kernel reads its input once."
    assert "'kernel'" in findings[0].detail and "核函数" in findings[0].detail


def test_an_exception_silences_its_message_only(tmp_path):
    glossary = load_glossary()
    glossary["exception"] = [{"term": "kernel", "catalog": PLANTED, "msgid": "The first",
                              "reason": "a planted exception for this test"}]
    findings = findings_for(tmp_path, [
        ("The first kernel.", "第一个内核。"),
        ("The second kernel.", "第二个内核。"),
    ], glossary=glossary)
    assert [f.msgid for f in findings] == ["The second kernel."]


def test_english_left_in_math_is_reported(tmp_path):
    findings = findings_for(tmp_path, [
        ("\\text{waves} = \\lceil b / S \\rceil", "\\text{waves} = \\lceil b / S \\rceil"),
        ("\\text{tiles} = \\lceil n / t \\rceil", "\\text{分块数} = \\lceil n / t \\rceil"),
        ("It takes :math:`t_\\text{eager}` at :math:`I\\ \\text{FLOP/byte}`.",
         "它耗时 :math:`t_\\text{eager}`，算术强度为 :math:`I\\ \\text{FLOP/byte}`。"),
    ], catalog=PLANTED_EXAMPLE)
    assert [f.msgid for f in findings] == ["\\text{waves} = \\lceil b / S \\rceil"]
    assert "\\text{waves}" in findings[0].detail


def test_code_and_math_are_not_read_as_prose(tmp_path):
    assert not findings_for(tmp_path, [
        ("Pass ``backend=\"eager\"`` and time ``kernel``.", "传入 ``backend=\"eager\"``，再为 ``kernel`` 计时。"),
        ("Call `x.item()` on the mask.", "对掩码调用 `x.item()`。"),
    ])


def test_untranslated_and_fuzzy_messages_are_left_to_the_completeness_test(tmp_path):
    assert not findings_for(tmp_path, [
        ("A new kernel.", ""),
        ("Eager mode.", "即时执行模式。"),
    ], fuzzy={"Eager mode."})
