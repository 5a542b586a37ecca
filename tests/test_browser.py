"""Both editions in a real browser: Debian's Chromium driven by Playwright.

The site is served from loopback under a path prefix, as a static host would
serve it. Screenshots land in _build/test-artifacts/screenshots/.
"""

import json
from pathlib import Path
from urllib.parse import urljoin, urlsplit

import pytest
from browser import CHROMIUM, CHROMIUM_ARGS, chromium_available

from tools.site_build import REPO

pytestmark = pytest.mark.skipif(
    not chromium_available(), reason="Debian's chromium is not installed (make test installs it)"
)

EDITIONS = ("en", "zh_CN")
SCREENSHOTS = REPO / "_build" / "test-artifacts" / "screenshots"
AXE = REPO / ".cache" / "node_modules" / "axe-core" / "axe.min.js"
LECTURE = "lectures/lecture06_kernels_triton.html"
GALLERY_PAGE = "auto_examples/lecture06_kernels_triton/06_torch_compile.html"


def site_pages(site_root):
    en = sorted(p.relative_to(site_root / "en").as_posix() for p in (site_root / "en").rglob("*.html")
                if "_static" not in p.parts and "_sources" not in p.parts)
    return [(edition, page) for edition in EDITIONS for page in en]


@pytest.fixture(scope="session")
def browser():
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS)
        yield browser
        browser.close()


class PageWatch:
    """Console errors, failed requests and requests to other hosts while a page loads."""

    def __init__(self, page, base):
        self.errors, self.failed, self.third_party = [], [], []
        host = urlsplit(base).netloc
        page.on("console", lambda m: m.type == "error" and self.errors.append(m.text))
        page.on("pageerror", lambda e: self.errors.append(str(e)))
        page.on("requestfailed", lambda r: self.failed.append(r.url))
        page.on("response", lambda r: r.status >= 400 and self.failed.append(f"{r.status} {r.url}"))
        page.on("request", lambda r: urlsplit(r.url).netloc not in (host, "")
                and not r.url.startswith("data:") and self.third_party.append(r.url))


def open_page(browser, url, base, **context_options):
    context = browser.new_context(**context_options)
    page = context.new_page()
    watch = PageWatch(page, base)
    page.goto(url, wait_until="networkidle")
    return context, page, watch


def all_images_decoded(page):
    page.evaluate("""async () => {
        for (const img of document.images) { img.loading = 'eager'; }
        window.scrollTo(0, document.body.scrollHeight);
        await Promise.all(Array.from(document.images).map(i => i.decode().catch(() => null)));
    }""")
    return page.evaluate(
        "Array.from(document.images).filter(i => !(i.complete && i.naturalWidth > 0)).map(i => i.src)"
    )


def test_every_page(served, browser, subtests):
    root, base = served
    pages = site_pages(root)
    third_party = 0
    for edition, name in pages:
        if name == "404.html":
            continue  # checked at depth below
        with subtests.test(page=f"{edition}/{name}"):
            url = urljoin(base, f"{edition}/{name}")
            context, page, watch = open_page(browser, url, base)
            try:
                assert not all_images_decoded(page), "images that did not decode"
                check_switcher(page, edition, name, base)
                check_downloads(page)
                check_dark_mode_figures(page)
                page.set_viewport_size({"width": 390, "height": 844})
                overflow = page.evaluate("document.documentElement.scrollWidth - window.innerWidth")
                assert overflow <= 1, f"{overflow}px of horizontal overflow at 390px"
                assert not watch.errors, watch.errors
                assert not watch.failed, watch.failed
                third_party += len(watch.third_party)
                assert not watch.third_party, watch.third_party
            finally:
                context.close()
    print(f"checked {len(pages)} pages; third-party requests: {third_party}")


def check_switcher(page, edition, name, base):
    other = next(e for e in EDITIONS if e != edition)
    link = page.locator(f'.language-switcher a[hreflang="{other.replace("_", "-")}"]').first
    target = urljoin(page.url, link.get_attribute("href"))
    assert target == urljoin(base, f"{other}/{name}"), target
    assert page.request.get(target).status == 200


def check_downloads(page):
    for href in page.eval_on_selector_all("a.download", "as => as.map(a => a.href)"):
        assert page.request.get(href).status == 200, href


def check_dark_mode_figures(page):
    page.evaluate("document.documentElement.dataset.theme = 'dark'")
    backgrounds = page.eval_on_selector_all(
        "img.sphx-glr-single-img, img.sphx-glr-multi-img",
        "imgs => imgs.map(i => getComputedStyle(i).backgroundColor)",
    )
    assert all(b == "rgb(255, 255, 255)" for b in backgrounds), backgrounds
    page.evaluate("document.documentElement.dataset.theme = 'light'")


@pytest.mark.parametrize("name", [LECTURE, GALLERY_PAGE])
@pytest.mark.parametrize("edition", EDITIONS)
def test_switcher_click_lands_on_counterpart(served, browser, edition, name):
    _, base = served
    context, page, _ = open_page(browser, urljoin(base, f"{edition}/{name}"), base)
    other = next(e for e in EDITIONS if e != edition)
    page.locator(".language-switcher a").first.click()
    page.wait_for_load_state()
    assert page.url == urljoin(base, f"{other}/{name}")
    context.close()


@pytest.mark.parametrize("edition, lang", [("en", "en"), ("zh_CN", "zh-CN")])
def test_html_lang(served, browser, edition, lang):
    _, base = served
    context, page, _ = open_page(browser, urljoin(base, f"{edition}/index.html"), base)
    assert page.evaluate("document.documentElement.lang") == lang
    context.close()


@pytest.mark.parametrize("edition, query, expected", [
    ("en", "roofline", "lectures/lecture05_gpus.html"),
    ("en", "bubble", "lectures/lecture07_parallelism.html"),
    ("zh_CN", "核函数", "lectures/lecture06_kernels_triton.html"),
    ("zh_CN", "融合", "lectures/lecture05_gpus.html"),
    ("zh_CN", "图中断", "lectures/lecture06_kernels_triton.html"),
    ("zh_CN", "集合通信", "lectures/lecture07_parallelism.html"),
])
def test_search_finds_the_page(served, browser, edition, query, expected):
    _, base = served
    url = urljoin(base, f"{edition}/search.html?q={query}")
    context, page, watch = open_page(browser, url, base)
    page.wait_for_selector("#search-results ul.search li", timeout=20000)
    found = page.eval_on_selector_all("#search-results ul.search li a", "as => as.map(a => a.href)")
    assert any(f.split("?")[0].split("#")[0].endswith(expected) for f in found), found
    assert not watch.errors, watch.errors
    context.close()


def test_math_renders(served, browser):
    _, base = served
    context, page, watch = open_page(browser, urljoin(base, "en/lectures/lecture05_gpus.html"), base)
    page.wait_for_selector("span.math .katex", timeout=20000)
    assert page.locator("div.math .katex-display").count() > 0
    assert page.locator(".katex-error").count() == 0
    assert not watch.failed, watch.failed
    context.close()


@pytest.mark.parametrize("edition", EDITIONS)
def test_404_page_works_at_any_depth(served, browser, edition):
    _, base = served
    url = urljoin(base, f"{edition}/no/such/deep/page.html")
    context, page, watch = open_page(browser, url, base)
    assert page.locator("h1").first.is_visible()
    assert page.evaluate("document.styleSheets.length") > 2
    assert watch.failed == [f"404 {url}"], watch.failed  # the page itself, and nothing else
    home = page.locator('a[href$="/course/en/index.html"]').first  # hosts serve the root 404.html
    assert page.request.get(urljoin(url, home.get_attribute("href"))).status == 200
    twin = urljoin(url, page.locator(".language-switcher a").first.get_attribute("href"))
    assert twin.endswith("/404.html") and "/no/such/" not in twin, twin  # not relative to the missing page
    assert page.request.get(twin).status == 200, twin
    context.close()


@pytest.mark.parametrize("theme", ["light", "dark"])
@pytest.mark.parametrize("name", [LECTURE, GALLERY_PAGE])
@pytest.mark.parametrize("edition", EDITIONS)
def test_screenshot(served, browser, edition, name, theme):
    _, base = served
    context, page, _ = open_page(
        browser, urljoin(base, f"{edition}/{name}"), base,
        color_scheme=theme, viewport={"width": 1280, "height": 900},
    )
    page.evaluate(f"document.documentElement.dataset.theme = '{theme}'")
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    shot = SCREENSHOTS / f"{edition}-{Path(name).stem}-{theme}.png"
    page.screenshot(path=str(shot))
    assert shot.stat().st_size > 10_000
    context.close()


@pytest.mark.skipif(not AXE.exists(), reason="axe-core is not installed (make test installs it)")
@pytest.mark.parametrize("theme", ["light", "dark"])
@pytest.mark.parametrize("name", [LECTURE, "lectures/lecture05_gpus.html", "lectures/lecture07_parallelism.html",
                                  GALLERY_PAGE])
@pytest.mark.parametrize("edition", EDITIONS)
def test_accessibility(served, browser, edition, name, theme):
    _, base = served
    context, page, _ = open_page(browser, urljoin(base, f"{edition}/{name}"), base,
                                 color_scheme=theme)
    page.evaluate(f"document.documentElement.dataset.theme = '{theme}'")
    page.add_script_tag(path=str(AXE))
    result = page.evaluate("""async () => {
        const wcag = await axe.run(document, {runOnly: {type: 'tag', values: ['wcag2a', 'wcag2aa']}});
        // Rules that the wcag tags leave out (best practice or experimental) but Lighthouse runs.
        const more = await axe.run(document, {runOnly: {type: 'rule', values: [
            'heading-order', 'td-has-header', 'label-content-name-mismatch']}});
        return {violations: wcag.violations.concat(more.violations)};
    }""")
    violations = [
        {"id": v["id"], "impact": v["impact"], "nodes": [n["target"] for n in v["nodes"][:3]]}
        for v in result["violations"]
    ]
    assert not violations, json.dumps(violations, indent=1)
    context.close()
