"""No broken internal link or anchor in either edition.

Every page of the built site is parsed once, with the standard library's HTML
parser: each ``href`` and ``src`` that stays inside the site must name a file
that exists, and each ``#fragment`` an ``id`` (or ``<a name>``) on its target
page. LinkChecker did the same over HTTP, but re-parsed the pages so often
that it took 6 to 12 minutes for the 68 pages; this takes seconds.
"""

import html.parser
import posixpath
from pathlib import Path
from urllib.parse import unquote, urlsplit

from browser import PREFIX

LINK_ATTRIBUTES = {"href", "src", "poster", "data"}


class PageParser(html.parser.HTMLParser):
    def __init__(self):
        super().__init__(convert_charrefs=True)
        self.ids, self.links = set(), []

    def handle_starttag(self, tag, attrs):
        for name, value in attrs:
            if value is None:
                continue
            if name == "id" or (tag == "a" and name == "name"):
                self.ids.add(value)
            elif name in LINK_ATTRIBUTES and not (tag == "link" and ("rel", "preconnect") in attrs):
                self.links.append((tag, value, self.getpos()[0]))
            elif name == "srcset":
                self.links += [(tag, part.split()[0], self.getpos()[0]) for part in value.split(",") if part.strip()]


def parse(page, cache={}):  # noqa: B006 - one parse per page for the whole test
    if page not in cache:
        parser = PageParser()
        parser.feed(page.read_text(encoding="utf-8"))
        cache[page] = parser
    return cache[page]


def target_of(root, page, link):
    """The file and fragment an internal link points to, or None for an external one."""
    parts = urlsplit(link)
    if parts.scheme or parts.netloc:
        return None  # external (or the configured public base URL): listed, never fetched
    path = unquote(parts.path)
    if not path:
        return page, unquote(parts.fragment)
    if path.startswith("/"):
        assert path.startswith(PREFIX), f"{path} is outside the site's prefix {PREFIX}"
        file = root / path[len(PREFIX):]
    else:
        file = Path(posixpath.normpath(posixpath.join(str(page.parent), path)))
    if file.is_dir():
        file = file / "index.html"
    return file, unquote(parts.fragment)


def broken_links(root):
    broken, checked = [], 0
    for page in sorted(p for p in root.rglob("*.html") if "_static" not in p.parts):
        for tag, link, line in parse(page).links:
            target = target_of(root, page, link)
            if target is None:
                continue
            checked += 1
            file, fragment = target
            where = f"{page.relative_to(root)}:{line} <{tag}> {link}"
            if not file.is_file() or root.resolve() not in file.resolve().parents:
                broken.append(f"{where}: no such file")
            elif fragment and file.suffix == ".html" and fragment not in parse(file).ids:
                broken.append(f"{where}: no id {fragment!r} on that page")
    return broken, checked


def test_no_broken_internal_links_or_anchors(site):
    root = site[0] / "_build" / "html"
    pages = {edition: len(list((root / edition).rglob("*.html"))) for edition in ("en", "zh_CN")}
    assert min(pages.values()) > 25, pages
    broken, checked = broken_links(root)
    print(f"{checked} internal links in {sum(pages.values())} pages checked")
    assert checked > 3000, checked
    assert not broken, "\n".join(broken[:60])


def test_the_checker_finds_a_broken_file_and_a_broken_anchor(tmp_path):
    (tmp_path / "en").mkdir()
    (tmp_path / "en" / "a.html").write_text('<p id="here"><a href="b.html#gone">b</a> <a href="#here">self</a>'
                                            '<img src="missing.png"><a href="https://example.org/x">out</a>')
    (tmp_path / "en" / "b.html").write_text('<h1 id="there">b</h1><a href="a.html#here">a</a>')
    broken, checked = broken_links(tmp_path)
    assert checked == 4
    assert [line.split(": ")[-1] for line in broken] == ["no id 'gone' on that page", "no such file"], broken
