"""Two editions from one source: English and Simplified Chinese.

* Each page offers a link to the same page in the other edition (the template
  ``_templates/language-switcher.html`` draws it from ``html_context``).
* The 404 page links into its own edition.
* Each page's canonical URL names its own edition's folder, and the page names
  its twin in the other edition with ``hreflang`` alternates.
* The sitemap lists every page of the edition, also after an incremental build
  (sphinx-sitemap alone lists only the pages written by that build).
* sphinx-gallery's running-time line changes on every execution. As a
  translatable paragraph it would churn the catalogs, so it becomes raw HTML,
  translated here.
* Gallery thumbnails carry the example's title and introduction as raw HTML,
  which gettext never sees. They are translated here from the examples' own
  catalogs, so they need no messages of their own.
"""

import html
import re
from pathlib import Path
from urllib.parse import urlsplit

from babel.messages.pofile import read_po
from docutils import nodes
from sphinx_gallery.gen_rst import _sanitize_rst

EDITIONS = {"en": "English", "zh_CN": "简体中文"}
SITE_TITLE = {"en": "GPU Programming for LLMs", "zh_CN": "面向大语言模型的 GPU 编程"}
# Strings that come from configuration rather than from a template or a page.
CONFIGURED_TEXT = {
    "zh_CN": {
        "copyright": "2026，课程作者",
        "search_bar_text": "搜索文档……",
        "notfound_context": {
            "title": "找不到页面",
            "body": "<h1>找不到页面</h1>\n\n抱歉，这里没有你要找的内容。"
                    "请从导航栏回到课程讲义，或使用搜索。",
        },
    },
}

RUNNING_TIME = re.compile(
    r"^( *)\*\*Total running time of the script:\*\* \((\d+) minutes ([\d.]+) seconds\)$",
    re.MULTILINE,
)
RUNNING_TIME_TEXT = {
    "en": "<strong>Total running time of the script:</strong> {minutes} min {seconds} s",
    "zh_CN": "<strong>脚本总运行时间：</strong>{minutes} 分 {seconds} 秒",
}


def running_time_as_raw_html(app, docname, source):
    text = RUNNING_TIME_TEXT.get(app.config.language, RUNNING_TIME_TEXT["en"])

    def replace(match):
        indent, minutes, seconds = match.groups()
        line = text.format(minutes=minutes, seconds=f"{float(seconds):.1f}")
        return f"{indent}.. raw:: html\n\n{indent}   <p>{line}</p>\n"

    source[0] = RUNNING_TIME.sub(replace, source[0])


def add_editions_to_context(app, pagename, templatename, context, doctree):
    context["editions"] = EDITIONS
    context["this_edition"] = app.config.language
    if pagename == "404":  # served at any depth: link from the site's root path
        context["edition_root"] = urlsplit(app.config.course_site_root).path.rstrip("/") + "/"
    else:
        context["edition_root"] = "../" * (pagename.count("/") + 1)


def place_absolute_urls_in_this_edition(app, config):
    """Absolute URLs point into this edition's folder.

    ``html_baseurl`` names the site's root in conf.py; here it becomes this
    edition's folder, which is what Sphinx's ``rel=canonical`` is built from.
    The 404 page is served at any depth, so its links are absolute (base path +
    edition); OpenGraph URLs are absolute by definition. The sitemap keeps the
    site's root and adds the edition itself (``sitemap_url_scheme``).
    """
    site_root = config.html_baseurl.rstrip("/") + "/"
    config.site_url = site_root
    config.course_site_root = site_root
    config.html_baseurl = f"{site_root}{config.language}/"
    config.notfound_urls_prefix = f"{urlsplit(site_root).path.rstrip('/')}/{config.language}/"
    config.ogp_site_url = config.html_baseurl


def link_the_twin_pages(app, pagename, templatename, context, doctree):
    """``hreflang`` alternates: this page in every edition, English as the default."""
    root = app.config.course_site_root
    links = [(code.replace("_", "-"), f"{root}{code}/{pagename}.html") for code in EDITIONS]
    links.append(("x-default", f"{root}en/{pagename}.html"))
    tags = "".join(
        f'<link rel="alternate" hreflang="{lang}" href="{html.escape(url)}" />\n'
        for lang, url in links
    )
    context["metatags"] = context.get("metatags", "") + tags


def note_page_written(app, pagename, templatename, context, doctree):
    app.course_pages_written = getattr(app, "course_pages_written", set()) | {pagename}


def list_every_page_in_the_sitemap(app, exception):
    """Queue the pages that this build did not rewrite, before sphinx-sitemap writes the file."""
    if exception is not None or app.builder.format != "html":
        return
    import sphinx_sitemap

    written = getattr(app, "course_pages_written", set())
    for docname in sorted(app.env.found_docs - written):
        sphinx_sitemap.add_html_link(app, docname, None, {}, None)


def name_the_site_in_this_edition(app, config):
    config.html_title = SITE_TITLE.get(config.language, config.html_title)
    config.project = config.html_title
    config.ogp_site_name = config.html_title
    text = CONFIGURED_TEXT.get(config.language)
    if text:
        config.copyright = text["copyright"]
        config.html_theme_options = {**config.html_theme_options,
                                     "search_bar_text": text["search_bar_text"]}
        config.notfound_context = text["notfound_context"]


THUMBNAIL_TEXT = re.compile(r'(tooltip=")([^"]*)(")|(sphx-glr-thumbnail-title">)([^<]*)(<)')


def load_gallery_translations(app):
    """Title and introduction of every example, English to this edition's language."""
    app.env.course_thumbnail_text = {}
    if app.config.language == "en":
        return
    for folder in app.config.locale_dirs:
        catalogs = Path(app.srcdir, folder, app.config.language, "LC_MESSAGES", "auto_examples")
        for po_file in catalogs.rglob("*.po"):
            with open(po_file, "rb") as f:
                for message in read_po(f):
                    if message.id and message.string and not message.fuzzy:
                        app.env.course_thumbnail_text[_sanitize_rst(message.id)] = (
                            _sanitize_rst(message.string))


def translate_thumbnails(app, doctree, docname):
    translations = getattr(app.env, "course_thumbnail_text", {})
    if not translations:
        return

    def translate(match):
        groups = [g for g in match.groups() if g is not None]
        before, text, after = groups
        english = html.unescape(text)
        return before + html.escape(translations.get(english, english)) + after

    for raw in list(doctree.findall(nodes.raw)):
        if "sphx-glr-thumb" in raw.astext():
            raw.replace_self(nodes.raw("", THUMBNAIL_TEXT.sub(translate, raw.astext()),
                                       format=raw.get("format", "html")))


def setup(app):
    app.connect("builder-inited", load_gallery_translations)
    app.connect("doctree-resolved", translate_thumbnails)
    app.connect("config-inited", place_absolute_urls_in_this_edition)
    app.connect("config-inited", name_the_site_in_this_edition)
    app.connect("source-read", running_time_as_raw_html)
    app.connect("html-page-context", add_editions_to_context)
    app.connect("html-page-context", link_the_twin_pages)
    app.connect("html-page-context", note_page_written)
    app.add_config_value("course_site_root", "", "html")
    # Before sphinx-sitemap's own build-finished handler (priority 500).
    app.connect("build-finished", list_every_page_in_the_sitemap, priority=400)
    return {"parallel_read_safe": True, "version": "1"}
