"""Math rendered by KaTeX, served from the site, loaded only on pages that have math.

Sphinx's MathJax renderer works the same way, but MathJax's browser bundle is
about 1.3 MB and would take a gallery page past the course's 1.5 MB target;
KaTeX's is about 0.3 MB. The markup is Sphinx's own (``\\(...\\)`` and
``\\[...\\]`` in ``span.math`` and ``div.math``), rendered in the browser by
KaTeX's auto-render.
"""

from sphinx.ext.mathjax import html_visit_displaymath, html_visit_math

KATEX = "vendor/katex/"
RENDER_ON_LOAD = """
document.addEventListener("DOMContentLoaded", function () {
  document.querySelectorAll("span.math, div.math").forEach(function (element) {
    renderMathInElement(element, {
      delimiters: [
        {left: "\\\\[", right: "\\\\]", display: true},
        {left: "\\\\(", right: "\\\\)", display: false}
      ],
      throwOnError: false
    });
  });
  // A formula wider than the column scrolls; a keyboard user must be able to reach it.
  function focusWideFormulas() {
    document.querySelectorAll(".katex-display").forEach(function (display) {
      if (display.scrollWidth > display.clientWidth) {
        display.tabIndex = 0;
      } else {
        display.removeAttribute("tabindex");
      }
    });
  }
  focusWideFormulas();
  window.addEventListener("resize", focusWideFormulas);
});
"""


def add_katex_to_pages_with_math(app, pagename, templatename, context, doctree):
    if app.builder.math_renderer_name != "katex" or doctree is None:
        return
    if not app.env.domains.math_domain.has_equations(pagename):
        return
    app.add_css_file(KATEX + "katex.min.css")
    app.add_js_file(KATEX + "katex.min.js", defer="defer")
    app.add_js_file(KATEX + "contrib/auto-render.min.js", defer="defer")
    app.add_js_file(None, body=RENDER_ON_LOAD)


def setup(app):
    app.add_html_math_renderer(
        "katex",
        inline_renderers=(html_visit_math, None),
        block_renderers=(html_visit_displaymath, None),
    )
    app.connect("html-page-context", add_katex_to_pages_with_math)
    return {"parallel_read_safe": True, "version": "1"}
