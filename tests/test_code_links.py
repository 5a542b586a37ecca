"""Names in the examples' code link to the PyTorch and Triton API reference.

The links come from the inventories committed in inventories/ (see
tools/make_inventories.py); these tests check the built pages and the
inventories themselves.
"""

from pathlib import Path
from urllib.parse import urlsplit

import pytest
from bs4 import BeautifulSoup
from sphinx.util.inventory import InventoryFile

from tools.make_inventories import OUTPUT, TORCH_DOCS, TRITON_DOCS, inventories

HTML = Path("_build", "html", "en")
LECTURE6 = HTML / "auto_examples" / "lecture06_kernels_triton"
DOCS = {"torch": TORCH_DOCS, "triton": TRITON_DOCS}
DOCS_HOSTS = {urlsplit(url).netloc for url in DOCS.values()}


def code_links(page):
    """Each linked name in the page's code blocks, mapped to the set of URLs it links to."""
    html = BeautifulSoup(page.read_text(encoding="utf-8"), "html.parser")
    links = {}
    for a in html.select("div.highlight a[href]"):
        links.setdefault(a.get_text(), set()).add(a["href"])
    return links


def committed(package):
    inventory = InventoryFile.loads((OUTPUT / f"{package}.inv").read_bytes(), uri=DOCS[package])
    return {name: item.uri for items in inventory.data.values() for name, item in items.items()}


@pytest.mark.parametrize(
    ("page", "written", "url"),
    [
        ("06_torch_compile", "torch.compile", TORCH_DOCS + "generated/torch.compile.html#torch.compile"),
        ("04_triton_basics", "torch.compile", TORCH_DOCS + "generated/torch.compile.html#torch.compile"),
        ("04_triton_basics", "@triton.jit", TRITON_DOCS + "python-api/generated/triton.jit.html#triton.jit"),
        ("04_triton_basics", "tl.load",
         TRITON_DOCS + "python-api/generated/triton.language.load.html#triton.language.load"),
    ],
)
def test_code_names_link_to_api_reference(site, page, written, url):
    checkout, _ = site
    links = code_links(checkout / LECTURE6 / f"{page}.html")
    assert links.get(written) == {url}, f"{written} links to {links.get(written)}"


def test_code_links_point_at_the_docs_sites(site):
    checkout, _ = site
    pages = sorted((checkout / HTML / "auto_examples").glob("lecture*/[0-9][0-9]_*.html"))
    assert pages
    for page in pages:
        links = code_links(page)
        assert links, f"no code links on {page.name}"
        for written, urls in links.items():
            hosts = {urlsplit(url).netloc for url in urls}
            assert hosts <= DOCS_HOSTS, f"{page.name}: {written} links to {urls}"


@pytest.mark.parametrize("package", sorted(DOCS))
def test_inventory_entries_are_on_the_docs_site(package):
    uris = committed(package)
    assert uris
    for name, uri in uris.items():
        assert uri.startswith(DOCS[package]), f"{name}: {uri}"
        assert urlsplit(uri).netloc in DOCS_HOSTS


def test_inventories_match_the_examples():
    """The committed inventories are what tools/make_inventories.py makes from today's examples."""
    for package, (project, entries, _) in inventories().items():
        expected = {entry.name: project.base + entry.uri for entry in entries}
        assert committed(package) == expected, "run: python tools/make_inventories.py"
