"""Chinese search that works with Sphinx 9.0.

Sphinx 9.0's ``SearchChinese`` segments text with jieba and stems the Latin
words in it with the English Snowball stemmer. For the browser it ships
``english-stemmer.js``, but ``IndexBuilder.get_js_stemmer_code`` names the
JavaScript class after the language (``window.Stemmer = ChineseStemmer;``),
and no ``ChineseStemmer`` exists. ``language_data.js`` then throws a
ReferenceError and the search page spins forever ("正在搜索中").

The fix keeps Sphinx's Chinese search as it is and gives the browser the stemmer
the index was built with: the English one, under its real name.

jieba also learns the course's own terms from the glossary (docs/glossary.md),
so that 核函数 is indexed as one word rather than as 核 and 函数, and a reader
who searches for it finds the pages that use it.
"""

import re
from pathlib import Path

from sphinx.search import _MINIFIED_JS_PATH
from sphinx.search.zh import SearchChinese

GLOSSARY = Path(__file__).resolve().parents[1] / "docs" / "glossary.md"
CJK_WORD = re.compile(r"[\u4e00-\u9fff]{2,}")


def _english_stemmer_js():
    base = (_MINIFIED_JS_PATH / "base-stemmer.js").read_text(encoding="utf-8")
    english = (_MINIFIED_JS_PATH / "english-stemmer.js").read_text(encoding="utf-8")
    return f"{base}\n{english}\nwindow.Stemmer = EnglishStemmer;"


class SearchChineseWithEnglishStemmer(SearchChinese):
    js_stemmer_rawcode = ""  # so that Sphinx inserts js_stemmer_code as it is
    js_stemmer_code = _english_stemmer_js()


def glossary_terms(glossary=GLOSSARY):
    """The Chinese terms of the glossary's tables, without their English glosses."""
    terms = set()
    for line in glossary.read_text(encoding="utf-8").splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) != 2:
            continue
        chinese = re.sub(r"（[^）]*）|\([^)]*\)", "", cells[1])
        for term in re.split(r"[，、；/]", chinese):
            if CJK_WORD.fullmatch(term.strip()):
                terms.add(term.strip())
    return sorted(terms)


def teach_jieba_the_glossary(app, config):
    if not config.language.startswith("zh"):
        return
    # One path for every build of this checkout (make html, make serve, the previews):
    # the path is part of the configuration, and another one makes Sphinx write every
    # Chinese page again.
    words = Path(app.confdir, ".cache", "jieba-glossary.txt")
    words.parent.mkdir(parents=True, exist_ok=True)
    words.write_text("".join(f"{term} 1000\n" for term in glossary_terms()), encoding="utf-8")
    config.html_search_options = {**config.html_search_options, "dict": str(words)}


def setup(app):
    app.add_search_language(SearchChineseWithEnglishStemmer)
    app.connect("config-inited", teach_jieba_the_glossary)
    return {"parallel_read_safe": True, "version": "1"}
