"""What gets published is what was built: every page in the sitemap, canonical
URLs inside their edition, twins linked by hreflang, notebooks that open on
Colab's GPU, and pages that reserve their room before images and sidebars arrive."""

import json
import re
import sys
from pathlib import Path
from types import SimpleNamespace
from xml.etree import ElementTree

import pytest
from bs4 import BeautifulSoup
from conftest import SITE_ENV

from tools.site_build import EXAMPLES, REPO, make

sys.path.insert(0, str(REPO / "sphinxext"))
import colab

EDITIONS = ("en", "zh_CN")
BASE = SITE_ENV["COURSE_BASE_URL"]
SITEMAP_NS = {"s": "http://www.sitemaps.org/schemas/sitemap/0.9",
              "x": "http://www.w3.org/1999/xhtml"}
NOT_IN_SITEMAP = {"search.html", "genindex.html", "404.html"}


def content_pages(edition_root):
    return sorted(p.relative_to(edition_root).as_posix() for p in edition_root.rglob("*.html")
                  if "_static" not in p.parts and "_images" not in p.parts
                  and p.name not in NOT_IN_SITEMAP)


def sitemap_locations(edition_root):
    tree = ElementTree.parse(edition_root / "sitemap.xml")
    return tree.getroot().findall("s:url", SITEMAP_NS)


def soup(path):
    return BeautifulSoup(path.read_text(encoding="utf-8"), "html.parser")


@pytest.fixture(scope="module")
def incremental(site_to_build_in):
    """The clean build's page lists, then an incremental build that rewrites one page."""
    checkout = site_to_build_in
    html = checkout / "_build" / "html"
    clean = {e: content_pages(html / e) for e in EDITIONS}
    clean_sitemaps = {e: len(sitemap_locations(html / e)) for e in EDITIONS}
    page = checkout / "source" / "index.md"
    page.write_text(page.read_text(encoding="utf-8") + "\n", encoding="utf-8")
    result = make(checkout, "html", env=SITE_ENV)
    assert result.returncode == 0, result.log[-3000:]
    return checkout, clean, clean_sitemaps


@pytest.mark.xdist_group("builds")
@pytest.mark.parametrize("edition", EDITIONS)
def test_incremental_build_publishes_every_page(incremental, edition):
    checkout, clean, clean_sitemaps = incremental
    root = checkout / "_build" / "html" / edition
    assert content_pages(root) == clean[edition]
    urls = sitemap_locations(root)
    listed = sorted(u.find("s:loc", SITEMAP_NS).text.removeprefix(f"{BASE}{edition}/")
                    for u in urls)
    assert listed == clean[edition], "the sitemap lost pages in an incremental build"
    assert len(urls) == clean_sitemaps[edition]
    twins = {a.get("hreflang") for a in urls[0].findall("x:link", SITEMAP_NS)}
    assert twins == {"en", "zh-CN"}


@pytest.mark.parametrize("edition", EDITIONS)
def test_canonical_and_twins(site, edition):
    checkout, _ = site
    name = "lectures/lecture05_gpus.html"
    html = soup(checkout / "_build" / "html" / edition / name)
    assert html.select_one('link[rel="canonical"]')["href"] == f"{BASE}{edition}/{name}"
    alternates = {a["hreflang"]: a["href"] for a in html.select('link[rel="alternate"][hreflang]')}
    assert alternates == {"en": f"{BASE}en/{name}", "zh-CN": f"{BASE}zh_CN/{name}",
                          "x-default": f"{BASE}en/{name}"}


GALLERIES = {"en": Path("source", "auto_examples"), "zh_CN": Path("_build", "tree-zh_CN", "source", "auto_examples")}
FIRST_CELL_SAYS = {"en": "nothing is installed", "zh_CN": "无须安装"}


@pytest.mark.parametrize("example", EXAMPLES, ids=lambda p: p.stem)
def test_example_opens_on_colab_with_a_gpu(site, example):
    """Each edition's page opens its own program's notebook: the Chinese one, the Chinese program."""
    checkout, _ = site
    lecture = example.parent.name
    for edition in EDITIONS:
        page = checkout / "_build" / "html" / edition / "auto_examples" / lecture / (
            example.stem + ".html")
        link = soup(page).select_one("p.colab-link a")
        assert link is not None, f"{edition}: no Colab link"
        owner_repo = SITE_ENV["COURSE_REPO_URL"].removeprefix("https://github.com/")
        folder = "" if edition == "en" else f"{edition}/"
        assert link["href"] == (f"https://colab.research.google.com/github/{owner_repo}"
                                f"/blob/notebooks/{folder}{lecture}/{example.stem}.ipynb")
        notebook = json.loads((checkout / GALLERIES[edition] / lecture / f"{example.stem}.ipynb").read_text())
        assert notebook["metadata"]["accelerator"] == "GPU"
        assert notebook["metadata"]["colab"]["gpuType"] == "T4"
        first = "".join(notebook["cells"][0]["source"])
        assert FIRST_CELL_SAYS[edition] in first
        code = "".join("".join(c["source"]) for c in notebook["cells"] if c["cell_type"] == "code")
        assert not re.search(r"^\s*[!%]pip install .*\b(torch|triton)\b", code, re.MULTILINE)
        if edition == "zh_CN":  # the Chinese program: its comments and printed lines are Chinese
            assert len(re.findall(r"[\u4e00-\u9fff]", code)) > 200, f"{example.stem}: not the Chinese program"


@pytest.mark.parametrize("lecture", sorted({e.parent.name for e in EXAMPLES}))
def test_gallery_links_every_notebook(site, lecture):
    checkout, _ = site
    index = checkout / "_build" / "html" / "en" / "auto_examples" / lecture / "index.html"
    links = [a["href"] for a in soup(index).select("p.colab-links a")]
    expected = [e.stem for e in EXAMPLES if e.parent.name == lecture]
    assert [Path(h).stem for h in links] == expected


def test_no_repository_no_colab_link():
    app = SimpleNamespace(config=SimpleNamespace(
        course_repo_url="", course_notebook_branch="notebooks", language="en"))
    source = ["Title\n=====\n\nText.\n"]
    colab.insert_colab_links(app, "auto_examples/lecture05_gpus/01_roofline", source)
    assert source == ["Title\n=====\n\nText.\n"]
    assert colab.notebook_url("", "notebooks", "lecture05_gpus", "01_roofline") is None


def test_pages_reserve_their_room(site):
    checkout, _ = site
    root = checkout / "_build" / "html" / "en"
    gallery = soup(root / "auto_examples" / "lecture05_gpus" / "index.html")
    thumbs = gallery.select("div.sphx-glr-thumbcontainer img")
    assert thumbs
    for img in thumbs:
        assert img.get("width") and img.get("height") and img.get("loading") == "lazy", img
        assert img.parent.name != "a" or "image-reference" not in img.parent.get("class", [])
    head = soup(root / "lectures" / "lecture05_gpus.html").head
    assert not head.select('script[src*="searchindex.js"]'), "search index loads on every page"
    assert soup(root / "search.html").select('script[src*="searchindex.js"]')
    blocking = [s["src"] for s in head.select("script[src]")
                if not s.has_attr("defer") and not s.has_attr("async")]
    assert all("documentation_options.js" in src for src in blocking), blocking
    katex_css = (REPO / "_static" / "vendor" / "katex" / "katex.min.css").read_text()
    faces = katex_css.count("@font-face{")
    assert faces and katex_css.count("@font-face{font-display:swap;") == faces
    css = (REPO / "_static" / "course.css").read_text()
    assert "calc(100% - var(--pst-sidebar-secondary))" in css


@pytest.mark.parametrize("edition", EDITIONS)
def test_figures_and_formulas_are_in_place_at_first_paint(site, edition):
    """Figures carry their PNG's size; formulas arrive typeset, their main faces preloaded."""
    import page_speed

    checkout, _ = site
    root = checkout / "_build" / "html" / edition
    figures = 0
    for page in sorted((root / "auto_examples").glob("lecture*/[0-9][0-9]_*.html")):
        for img in soup(page).select("img.sphx-glr-single-img, img.sphx-glr-multi-img"):
            width, height = page_speed.png_size(page.parent / img["src"])
            assert (img.get("width"), img.get("height")) == (str(width), str(height)), img
            figures += 1
    assert figures
    lecture = soup(root / "lectures" / "lecture05_gpus.html")
    formulas = lecture.select("span.math, div.math")
    assert formulas and all(f.select_one(".katex") for f in formulas)
    assert not any(f.get_text().lstrip().startswith(("\\(", "\\[")) for f in formulas)
    assert not lecture.select('script[src*="katex"]'), "KaTeX runs in the browser"
    fonts = [link["href"] for link in lecture.head.select('link[rel="preload"][as="font"]')]
    assert any("KaTeX_Main-Regular" in href for href in fonts), fonts
    assert all((root / "lectures" / href).resolve().is_file() for href in fonts)


@pytest.mark.parametrize("edition", EDITIONS)
def test_the_icon_fonts_hold_the_icons_the_site_shows_and_no_more(site, edition):
    """Font Awesome's faces are cut to the site's icons, and keep every one of them."""
    import page_speed
    import pydata_sphinx_theme
    from fontTools.ttLib import TTFont

    checkout, _ = site
    root = checkout / "_build" / "html" / edition
    shown = page_speed.icons_in_use(root)
    # the navbar's search, language and theme icons, the note admonition's, GitHub's
    assert {0xF002, 0xF1AB, 0xF185, 0xF05A, 0xF09B} <= shown, sorted(map(hex, shown))
    whole = Path(pydata_sphinx_theme.__file__).parent / "theme" / "pydata_sphinx_theme" / "static"
    kept = set()
    for font in sorted((root / page_speed.FONT_AWESOME).glob("fa-*.woff2")):
        original = set(TTFont(whole / page_speed.FONT_AWESOME.removeprefix("_static/") / font.name).getBestCmap())
        cut = set(TTFont(font).getBestCmap())
        assert cut == original & shown, (font.name, sorted(map(hex, cut ^ (original & shown))))
        assert font.stat().st_size < 10_000, (font.name, font.stat().st_size)
        kept |= cut
    assert kept == shown, sorted(map(hex, shown - kept))  # no icon is in none of the faces
