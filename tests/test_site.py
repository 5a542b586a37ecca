"""The built site: every example page shows executed outputs, figures, downloads and provenance."""

import json
import re
import sys
from pathlib import Path

import pytest
from bs4 import BeautifulSoup
from conftest import SITE_ENV

from tools.site_build import EXAMPLES, REPO, make

sys.path.insert(0, str(REPO / "sphinxext"))
import check_margins

HTML = Path("_build", "html", "en")
EDITIONS = ("en", "zh_CN")
# The gallery folder of each edition, and the programs it executes (tools/program_messages.py).
GENERATED = {"en": Path("source", "auto_examples"), "zh_CN": Path("_build", "tree-zh_CN", "source", "auto_examples")}
PROGRAMS = {"en": Path("examples"), "zh_CN": Path("_build", "tree-zh_CN", "examples")}


def page_of(example, edition="en"):
    return Path("_build", "html", edition, "auto_examples", example.parent.name, example.stem + ".html")


def soup(path):
    return BeautifulSoup(path.read_text(encoding="utf-8"), "html.parser")


def test_build_is_clean(site):
    _, result = site
    assert "build succeeded" in result.log
    assert "WARNING" not in result.log
    # Each edition executes its own programs.
    assert result.examples_executed_per_edition == {"en": len(EXAMPLES), "zh_CN": len(EXAMPLES)}


@pytest.mark.parametrize("edition", EDITIONS)
@pytest.mark.parametrize("example", EXAMPLES, ids=lambda p: p.stem)
def test_example_page(site, example, edition):
    checkout, _ = site
    page = checkout / page_of(example, edition)
    html = soup(page)

    outputs = html.select("div.sphx-glr-script-out")
    assert outputs and any(o.get_text(strip=True) for o in outputs), "no printed output"

    figures = html.select("img.sphx-glr-single-img, img.sphx-glr-multi-img")
    assert figures, "no figure"
    for img in figures:
        image = (page.parent / img["src"]).resolve()
        assert image.stat().st_size > 1000, f"empty figure {image.name}"
        assert img.get("alt"), f"figure {image.name} has no alt text"

    downloads = {Path(a["href"]).suffix: page.parent / a["href"] for a in html.select("a.download")}
    assert {".py", ".ipynb"} <= downloads.keys()
    program = checkout / PROGRAMS[edition] / example.parent.name / example.name
    assert downloads[".py"].read_text() == program.read_text()  # the edition's own program
    assert json.loads(downloads[".ipynb"].read_text())["cells"]

    provenance = html.select_one("div.provenance")
    assert provenance is not None, "no provenance note"
    text = provenance.get_text(" ", strip=True)
    said = {"en": r"Executed on .+ with torch \d", "zh_CN": r"运行于 .+torch \d"}[edition]
    assert re.search(said, text), text

    record = json.loads((checkout / GENERATED[edition] / example.parent.name / "provenance"
                         / f"{example.stem}.json").read_text())
    assert record["key_figures"], "the example reports no KEY_FIGURES (the GPU check's report needs them)"
    over = [m for m in record["margins"] if m["use"] > check_margins.HEADROOM]
    assert not over, "checks that use more than half of their tolerance:\n" + check_margins.markdown(over)


def test_the_chinese_pages_print_chinese(site):
    """What is still English in a Chinese page's output is a name of code, an API, a unit or
    a device, or a line a library printed (tools/english_words.py): the prose left is at
    most 15 % of the English page's English words on every page (the first build of the
    Chinese programs left 8.5 % at most, 3.9 % over all pages)."""
    sys.path.insert(0, str(REPO / "tools"))
    import english_words

    checkout, _ = site
    rows = english_words.table(checkout / "_build" / "html", checkout / "examples")
    assert len(rows) == len(EXAMPLES)
    too_english = [(name, prose, en) for name, en, _, prose in rows if prose > 0.15 * en]
    assert not too_english, too_english
    assert sum(r[2] for r in rows) < 0.8 * sum(r[1] for r in rows)


@pytest.mark.parametrize("lecture", sorted({e.parent.name for e in EXAMPLES}))
def test_gallery_index(site, lecture):
    checkout, _ = site
    index = checkout / HTML / "auto_examples" / lecture / "index.html"
    html = soup(index)
    linked = [a["href"] for a in html.select("div.sphx-glr-thumbcontainer a")]
    stems = [Path(h).stem for h in linked if h.endswith(".html")]
    expected = [e.stem for e in EXAMPLES if e.parent.name == lecture]
    assert stems == expected, "gallery is not in file-number order"

    zips = [index.parent / a["href"] for a in html.select("a.download") if a["href"].endswith(".zip")]
    assert len(zips) == 2 and all(z.stat().st_size > 0 for z in zips)

    for img in html.select("div.sphx-glr-thumbcontainer img"):
        assert "no_image" not in img["src"], "thumbnail is the placeholder, not a figure"


@pytest.mark.xdist_group("builds")
def test_noop_rebuild_executes_nothing(site_to_build_in):
    checkout = site_to_build_in
    again = make(checkout, "html", env=SITE_ENV)
    assert again.returncode == 0, again.log[-3000:]
    assert again.examples_executed == 0


def test_pages_name_no_folder_of_the_build_machine(site):
    """Printed paths are relative to the example's folder: a page names no folder of the build."""
    checkout, _ = site
    root = checkout / "_build" / "html"
    found = [str(p.relative_to(root)) for p in root.rglob("*.html") if str(checkout) in p.read_text("utf-8")]
    assert found == [], f"pages that print {checkout}/...: {found}"


@pytest.mark.parametrize("edition", ["en", "zh_CN"])
def test_a_page_that_lists_its_files_is_described_by_its_own_text(site, edition):
    """02_profiling writes a trace: the list sits in the provenance note, in the page's language,
    and the page's description (og:description) starts with the example's text."""
    checkout, _ = site
    page = soup(checkout / "_build" / "html" / edition / "auto_examples/lecture06_kernels_triton/02_profiling.html")
    note = page.select_one("div.provenance")
    assert note is not None and note.select("a.download"), "the trace is not listed in the note"
    label = {"en": "Files this example wrote:", "zh_CN": "本示例写出的文件："}[edition]
    assert label in note.get_text(" ", strip=True)
    description = page.select_one('meta[property="og:description"]')["content"]
    assert "Files this example wrote" not in description and "本示例写出的文件" not in description
