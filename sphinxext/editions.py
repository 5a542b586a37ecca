"""Two editions from one source: English and Simplified Chinese.

* Each page offers a link to the same page in the other edition (the template
  ``_templates/language-switcher.html`` draws it from ``html_context``).
* The 404 page links into its own edition.
* sphinx-gallery's running-time line changes on every execution. As a
  translatable paragraph it would churn the catalogs, so it becomes raw HTML,
  translated here.
"""

import re
from urllib.parse import urlsplit

EDITIONS = {"en": "English", "zh_CN": "简体中文"}

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
    context["edition_root"] = "../" * (pagename.count("/") + 1)


def place_absolute_urls_in_this_edition(app, config):
    """Absolute URLs point into this edition's folder.

    The 404 page is served at any depth, so its links are absolute (base path +
    edition); OpenGraph URLs are absolute by definition.
    """
    base_path = urlsplit(config.html_baseurl).path.rstrip("/")
    config.notfound_urls_prefix = f"{base_path}/{config.language}/"
    config.ogp_site_url = f"{config.html_baseurl.rstrip('/')}/{config.language}/"


def setup(app):
    app.connect("config-inited", place_absolute_urls_in_this_edition)
    app.connect("source-read", running_time_as_raw_html)
    app.connect("html-page-context", add_editions_to_context)
    return {"parallel_read_safe": True, "version": "1"}
