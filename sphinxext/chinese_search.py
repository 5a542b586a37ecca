"""Chinese search that works with Sphinx 9.0.

Sphinx 9.0's ``SearchChinese`` segments text with jieba and stems the Latin
words in it with the English Snowball stemmer. For the browser it ships
``english-stemmer.js``, but ``IndexBuilder.get_js_stemmer_code`` names the
JavaScript class after the language (``window.Stemmer = ChineseStemmer;``),
and no ``ChineseStemmer`` exists. ``language_data.js`` then throws a
ReferenceError and the search page spins forever ("正在搜索中").

The fix keeps Sphinx's Chinese search as it is and gives the browser the stemmer
the index was built with: the English one, under its real name.
"""

from sphinx.search import _MINIFIED_JS_PATH
from sphinx.search.zh import SearchChinese


def _english_stemmer_js():
    base = (_MINIFIED_JS_PATH / "base-stemmer.js").read_text(encoding="utf-8")
    english = (_MINIFIED_JS_PATH / "english-stemmer.js").read_text(encoding="utf-8")
    return f"{base}\n{english}\nwindow.Stemmer = EnglishStemmer;"


class SearchChineseWithEnglishStemmer(SearchChinese):
    js_stemmer_rawcode = ""  # so that Sphinx inserts js_stemmer_code as it is
    js_stemmer_code = _english_stemmer_js()


def setup(app):
    app.add_search_language(SearchChineseWithEnglishStemmer)
    return {"parallel_read_safe": True, "version": "1"}
