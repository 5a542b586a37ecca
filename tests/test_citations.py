"""Citations resolve both ways: every cited key is in source/references.bib (an
unknown key is a Sphinx warning, so the build fails), and every entry of the
bibliography is cited by some lecture."""

import re

import pytest

from tools.site_build import REPO

BIB = REPO / "source" / "references.bib"
LECTURES = sorted((REPO / "source" / "lectures").glob("*.md"))
CITE = re.compile(r"\{footcite:[pt]s?\}`([^`]+)`")
ENTRY = re.compile(r"^@\w+\{([^,\s]+),", re.MULTILINE)


def cited_keys(text):
    return {key.strip() for group in CITE.findall(text) for key in group.split(",")}


def bib_keys(text):
    return set(ENTRY.findall(text))


def test_every_entry_is_cited():
    cited = set().union(*(cited_keys(p.read_text(encoding="utf-8")) for p in LECTURES))
    unused = bib_keys(BIB.read_text(encoding="utf-8")) - cited
    assert not unused, f"entries of references.bib that no lecture cites: {sorted(unused)}"


@pytest.mark.parametrize("lecture", LECTURES, ids=lambda p: p.stem)
def test_each_lecture_has_its_bibliography(lecture):
    text = lecture.read_text(encoding="utf-8")
    assert cited_keys(text), "cites nothing"
    assert "```{footbibliography}" in text, "no bibliography section"


def test_the_checks_can_fail():
    assert cited_keys("see {footcite:p}`a2020,b2021` and {footcite:t}`c2022`") == {
        "a2020", "b2021", "c2022"}
    assert bib_keys("@misc{x2020,\n title={T}}\n@article{y2021, a=1}") == {"x2020", "y2021"}


def test_an_unknown_key_fails_the_build(tmp_path):
    """The site's settings, a page citing a key that references.bib lacks: -W makes it an error."""
    import subprocess
    import sys

    (tmp_path / "conf.py").write_text(
        "extensions = ['myst_parser', 'sphinxcontrib.bibtex']\n"
        f"bibtex_bibfiles = [{str(BIB)!r}]\n"
    )
    (tmp_path / "index.md").write_text(
        "# Page\n\nA claim {footcite:p}`nobody1999`.\n\n```{footbibliography}\n```\n")
    done = subprocess.run(
        [sys.executable, "-m", "sphinx", "-W", "-q", "-b", "html", str(tmp_path),
         str(tmp_path / "_build")], capture_output=True, text=True, check=False)
    assert done.returncode != 0
    assert "nobody1999" in done.stderr
