"""The built site: every example page shows executed outputs, figures, downloads and provenance."""

import json
import re
from pathlib import Path

import pytest
from bs4 import BeautifulSoup
from conftest import SITE_ENV

from tools.site_build import EXAMPLES, make

HTML = Path("_build", "html", "en")


def page_of(example):
    return Path(HTML, "auto_examples", example.parent.name, example.stem + ".html")


def soup(path):
    return BeautifulSoup(path.read_text(encoding="utf-8"), "html.parser")


def test_build_is_clean(site):
    _, result = site
    assert "build succeeded" in result.log
    assert "WARNING" not in result.log
    assert result.examples_executed_per_edition == {"en": len(EXAMPLES), "zh_CN": 0}


@pytest.mark.parametrize("example", EXAMPLES, ids=lambda p: p.stem)
def test_example_page(site, example):
    checkout, _ = site
    page = checkout / page_of(example)
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
    assert downloads[".py"].read_text() == example.read_text()
    assert json.loads(downloads[".ipynb"].read_text())["cells"]

    provenance = html.select_one("div.provenance")
    assert provenance is not None, "no provenance note"
    text = provenance.get_text(" ", strip=True)
    assert re.search(r"Executed on .+ with torch \d", text), text


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


def test_noop_rebuild_executes_nothing(site):
    checkout, _ = site
    again = make(checkout, "html", env=SITE_ENV)
    assert again.returncode == 0, again.log[-3000:]
    assert again.examples_executed == 0


def test_changing_one_example_reexecutes_only_it(site):
    """A stand-in example is added, then edited: each build executes it alone."""
    checkout, _ = site
    tiny = checkout / "examples" / "lecture05_gpus" / "97_tiny.py"
    tiny.write_text('"""\nTiny\n====\n\nA stand-in example.\n"""\n\nprint(1 + 1)\n')
    added = make(checkout, "html", env=SITE_ENV)
    assert added.returncode == 0, added.log[-3000:]
    assert added.examples_executed == 1

    tiny.write_text(tiny.read_text() + "print(2 + 2)\n")
    changed = make(checkout, "html", env=SITE_ENV)
    assert changed.returncode == 0, changed.log[-3000:]
    assert changed.examples_executed == 1
    assert "4" in (checkout / HTML / "auto_examples/lecture05_gpus/97_tiny.html").read_text()

    tiny.unlink()  # leave the shared site as it was for later tests
    for generated in (checkout / "source/auto_examples/lecture05_gpus").glob("97_tiny*"):
        generated.unlink()
