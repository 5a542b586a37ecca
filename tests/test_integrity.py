"""Build integrity: no page loses its outputs or keeps another run's provenance, a
removed example leaves nothing behind, and the commands do what their docs say.

The build sequences run in the very folder where the suite built its site (the
other tests read a snapshot of it), one after another, each ending in a full build,
in the site build's environment, so that each build starts from that one's pages; 02_profiling (fast, and it uses the
profiler) is the example they edit. (example_runner and provenance come from
sphinxext/, which tools.site_build puts on the path.)
"""

import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from types import SimpleNamespace

import example_runner
import example_selection
import provenance
import pytest
from babel.messages.pofile import read_po
from bs4 import BeautifulSoup
from conftest import SITE_ENV

from tools.site_build import EXAMPLES, REPO
from tools.site_build import make as make_in

pytestmark = pytest.mark.xdist_group("builds")  # the tests that build in the site's own folder


def make(checkout, target="html", **variables):
    """``make`` in the site build's environment, so that its configuration stays the same."""
    return make_in(checkout, target, env=SITE_ENV, **variables)

EDITIONS = ("en", "zh_CN")
EDITED = next(e for e in EXAMPLES if e.stem == "02_profiling")
UNCHANGED = next(e for e in EXAMPLES if e.stem == "01_roofline")
LECTURE = EDITED.parent.name

EXTRA = '''"""
Added for a while
=================

An example that is added, built and removed again.
"""

import os
from pathlib import Path

import matplotlib.pyplot as plt

print("COURSE_REQUIRE=" + os.environ.get("COURSE_REQUIRE", "<unset>"))
folder = Path(os.environ.get("COURSE_ARTIFACT_DIR", "."))
(folder / "97_extra_note.txt").write_text("written by 97_extra")
fig, ax = plt.subplots()
ax.plot([0, 1], [1, 0])
ax.set_title("a line")
'''

SILENT = '''"""
Says nothing
============

An example that prints nothing and draws nothing.
"""

answer = 6 * 7
'''


# -- Pieces, without a build ----------------------------------------------------


def _gallery(tmp_path, stem="01_x", source="print(1)\n", executed=True):
    """A gallery folder as sphinx-gallery and the runner leave it after running ``stem``."""
    gallery = tmp_path / "auto_examples" / "lecture"
    (gallery / "provenance").mkdir(parents=True)
    copy = gallery / f"{stem}.py"
    copy.write_text(source)
    md5 = provenance.source_md5(gallery, stem)
    (gallery / f"{stem}.py.md5").write_text(md5)
    outputs = ".. rst-class:: sphx-glr-script-out\n\n .. code-block:: none\n\n    1\n" if executed else ""
    (gallery / f"{stem}.rst").write_text(f"Title\n=====\n\n{outputs}")
    required = json.dumps(sorted(provenance.STRICT_REQUIREMENTS["cuda"]))  # what any strict build asks
    provenance.record_path(gallery, stem).write_text(
        f'{{"device": "CPU: test", "passed": true, "source_md5": "{md5}", "required": {required}}}')
    return gallery


def test_a_record_vouches_only_for_the_outputs_of_the_source_it_ran(tmp_path):
    gallery = _gallery(tmp_path)
    assert provenance.vouching_record(gallery, "01_x")["device"] == "CPU: test"

    (gallery / "01_x.py").write_text("print(2)\n")  # a build wrote the page of another version
    assert provenance.vouching_record(gallery, "01_x") is None


def test_a_page_without_outputs_or_a_failed_run_is_not_vouched_for(tmp_path):
    assert provenance.vouching_record(_gallery(tmp_path / "a", executed=False), "01_x") is None
    gallery = _gallery(tmp_path / "b")
    record = provenance.record_path(gallery, "01_x")
    record.write_text(record.read_text().replace('"passed": true', '"passed": false'))
    assert provenance.vouching_record(gallery, "01_x") is None


def _app(tmp_path, examples):
    folder = tmp_path / "examples" / "lecture"
    folder.mkdir(parents=True)
    for name in examples:
        (folder / name).write_text("print(1)\n")
    conf = {"examples_dirs": ["../examples/lecture"], "gallery_dirs": ["auto_examples/lecture"],
            "ignore_pattern": r"__init__\.py", "backreferences_dir": "auto_examples/backreferences",
            "filename_pattern": r"/\d\d_\w+\.py$", "plot_gallery": True, "failing_examples": {}}
    return SimpleNamespace(srcdir=str(tmp_path / "source"), outdir=str(tmp_path / "out"),
                           doctreedir=str(tmp_path / "doctrees"),
                           config=SimpleNamespace(sphinx_gallery_conf=conf),
                           builder=SimpleNamespace(format="html"))


def test_an_md5_whose_page_was_rewritten_without_outputs_is_dropped(tmp_path):
    app = _app(tmp_path, ["01_x.py"])
    gallery = _gallery(tmp_path / "source", executed=False)  # as a preview leaves it
    example_runner.drop_outputs_nobody_vouches_for(app)
    assert not (gallery / "01_x.py.md5").exists()  # so the next build executes it

    vouched = _gallery(tmp_path / "other" / "source")
    example_runner.drop_outputs_nobody_vouches_for(_app(tmp_path / "other", ["01_x.py"]))
    assert (vouched / "01_x.py.md5").exists()


def test_outputs_of_a_lenient_run_are_dropped_by_a_stricter_build(tmp_path, monkeypatch):
    app = _app(tmp_path, ["01_x.py"])
    gallery = _gallery(tmp_path / "source")
    record = provenance.record_path(gallery, "01_x")
    record.write_text(record.read_text().replace('"required": [', '"required": ["x", '))
    monkeypatch.setenv("COURSE_REQUIRE", "cxx,triton")
    example_runner.drop_outputs_nobody_vouches_for(app)
    assert (gallery / "01_x.py.md5").exists()  # it required more than this build does

    record.write_text(record.read_text().replace('"required": ["x", ', '"required": ["cxx"], "r": ['))
    example_runner.drop_outputs_nobody_vouches_for(app)
    assert not record.exists() and not (gallery / "01_x.py.md5").exists()  # it executes again


def test_generated_files_of_a_removed_example_go(tmp_path):
    app = _app(tmp_path, ["01_x.py"])
    gallery = _gallery(tmp_path / "source", stem="02_gone")
    _gallery_files = [gallery / "images" / "sphx_glr_02_gone_001.png",
                      gallery / "images" / "thumb" / "sphx_glr_02_gone_thumb.png",
                      gallery / "artifacts" / "02_gone" / "trace.json"]
    for path in _gallery_files:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("x")
    kept = gallery / "images" / "sphx_glr_02_gone_more_001.png"  # another example's figure
    kept.write_text("x")
    example_runner.remove_what_removed_examples_left(app)
    assert sorted(p.name for p in gallery.rglob("*") if p.is_file()) == [kept.name]


def test_codeautolink_s_memo_reuses_only_what_its_arguments_determine(tmp_path, monkeypatch):
    import codeautolink_memo

    calls = []

    def compute(document, html, transforms, inventory, *rest, disable_link_titles):
        calls.append(html)
        if "warn" in html:
            app._warncount += 1
        return html.replace("torch", f'<a href="{inventory["torch"]}">torch</a>')

    app = SimpleNamespace(doctreedir=str(tmp_path), _warncount=0)
    monkeypatch.delenv("COURSE_CODEAUTOLINK_MEMO", raising=False)  # the suite shares one
    monkeypatch.setattr(codeautolink_memo, "_compute", compute)
    codeautolink_memo._remember_app(app)
    name = SimpleNamespace(code_str="torch", lineno=1, end_lineno=1, context=None,
                           resolved_location="torch")
    transforms = [SimpleNamespace(source="import torch", names=[name])]

    def link(html, inventory):
        return codeautolink_memo.link_html("lecture/page", html, transforms, inventory, {}, [],
                                           disable_link_titles=True)

    first = link("<pre>torch</pre>", {"torch": "a.html"})
    assert link("<pre>torch</pre>", {"torch": "a.html"}) == first and len(calls) == 1
    assert link("<pre>torch </pre>", {"torch": "a.html"}) != first and len(calls) == 2  # the body
    assert 'href="b.html"' in link("<pre>torch </pre>", {"torch": "b.html"})  # where a name links
    assert len(calls) == 3
    link("<pre>warn torch</pre>", {"torch": "a.html"})
    link("<pre>warn torch</pre>", {"torch": "a.html"})
    assert len(calls) == 5, "a call that warned was remembered: the next build would not warn"
    assert codeautolink_memo._state["hits"] == 1


def test_codeautolink_s_shared_memo_serves_builds_in_other_folders(tmp_path, monkeypatch):
    """With COURSE_CODEAUTOLINK_MEMO (as the suite sets it), a build in another folder
    reuses a body another build linked, and still computes a body it has not seen."""
    import codeautolink_memo

    calls = []
    monkeypatch.setenv("COURSE_CODEAUTOLINK_MEMO", str(tmp_path / "shared"))
    monkeypatch.setattr(codeautolink_memo, "_compute",
                        lambda document, html, *rest, disable_link_titles: calls.append(html) or html + "!")

    def link(doctrees, html, document="lecture/page"):
        codeautolink_memo._remember_app(SimpleNamespace(doctreedir=str(tmp_path / doctrees), _warncount=0))
        return codeautolink_memo.link_html(document, html, [], {}, {}, [], disable_link_titles=True)

    assert link("first", "<pre>a</pre>") == "<pre>a</pre>!"
    assert link("second", "<pre>a</pre>") == "<pre>a</pre>!" and len(calls) == 1
    assert link("second", "<pre>b</pre>") == "<pre>b</pre>!" and len(calls) == 2
    assert link("first", "<pre>a</pre>") == "<pre>a</pre>!" and len(calls) == 2  # b did not evict a
    assert link("first", "<pre>a</pre>", "other/page") == "<pre>a</pre>!" and len(calls) == 3
    assert not list((tmp_path / "first").glob("**/*.pickle"))
    assert len(list((tmp_path / "shared").glob("*.pickle"))) == 3


def test_codeautolink_s_cache_keeps_the_code_blocks_of_markdown_pages(tmp_path):
    import codeautolink_sources
    from sphinx_codeautolink.extension.block import CodeExample, SourceTransform
    from sphinx_codeautolink.extension.cache import DataCache
    from sphinx_codeautolink.parse import Name

    (tmp_path / "lectures").mkdir()
    (tmp_path / "lectures" / "page.md").write_text("# A page\n")
    suffixes = {".rst": "restructuredtext", ".md": "markdown"}
    codeautolink_sources._remember_suffixes(SimpleNamespace(config=SimpleNamespace(source_suffix=suffixes)))
    written = DataCache(tmp_path, tmp_path)
    name = Name(import_components=["torch", "profiler"], code_str="torch.profiler", lineno=1,
                end_lineno=1, resolved_location="torch.profiler")
    for page in ("lectures/page", "lectures/gone"):
        written.transforms[page] = [SourceTransform("import torch.profiler\n", [name],
                                                    CodeExample(page, "id", ["h"]), 3)]
    written.write()
    read = DataCache(tmp_path, tmp_path)
    codeautolink_sources.read_every_source(read)  # what DataCache.read is in a build
    assert list(read.transforms) == ["lectures/page"]  # kept, and the removed page's entry goes
    assert read.transforms["lectures/page"][0].names[0].code_str == "torch.profiler"


def test_make_help_names_every_knob():
    text = subprocess.run(["make", "-s", "-C", str(REPO), "help"], capture_output=True, text=True,
                          check=True).stdout
    for name in ["COURSE_EXAMPLE_TIMEOUT", "CACHE_RESTORE", "VENV_FLAGS", "REQUIREMENTS",
                 "COURSE_REQUIRE", "EXAMPLES", "RUN=", "Ctrl+C", "TEST_WORKERS"]:
        assert name in text, name
    bench = text[text.index("make bench"):].split("\nmake ")[0]
    assert "clean build" in bench and "no-op rebuild" in bench and "editing one example" in bench


def test_docs_stand_on_their_own():
    """Nothing points outside the repository (the development checkout's shared/ folder)."""
    for doc in [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]:
        assert "../shared" not in doc.read_text(encoding="utf-8"), doc.name


def test_examples_is_a_search_in_the_file_names():
    def stems(pattern, lectures=None):
        return [e.stem for e in example_selection.selected(EXAMPLES, lectures, pattern)]

    assert stems("torch_compile") == ["06_torch_compile"]
    assert stems("06") == ["06_flash_attention", "06_torch_compile", "06_choosing_a_layout"]
    assert stems("^0[12]_", "lecture07_parallelism") == ["01_collectives", "02_data_parallel"]
    for pattern in ("does_not_exist", "(", "07_triton"):
        with pytest.raises(example_selection.SelectionError) as error:
            stems(pattern, "lecture05_gpus")
        assert repr(pattern) in str(error.value)
    assert "06_torch_compile" in str(error.value)  # the examples there are, by name


# -- Sequences of builds ----------------------------------------------------------


@pytest.fixture(scope="module")
def checkout(site_to_build_in):
    """The folder of the suite's full build, to run build sequences in."""
    return site_to_build_in


def page(checkout, example, edition="en", build="html"):
    folder = checkout / "_build" / build
    folder = folder / edition if build != "preview" else folder
    return folder / "auto_examples" / example.parent.name / f"{example.stem}.html"


def shows(path):
    """What an example page shows: outputs, figures, a provenance claim, a not-executed note."""
    html = BeautifulSoup(path.read_text(encoding="utf-8"), "html.parser")
    return SimpleNamespace(
        outputs=len(html.select("div.sphx-glr-script-out")),
        figures=len(html.select("img.sphx-glr-single-img, img.sphx-glr-multi-img")),
        provenance=html.select_one("div.provenance"),
        not_executed=html.select_one("div.not-executed"),
        text=html.get_text(" ", strip=True),
    )


def edit(example_in_checkout):
    original = example_in_checkout.read_text()
    example_in_checkout.write_text(original + "\n# edited by the integrity test\n")
    return original


def checked(result):
    assert result.returncode == 0, result.log[-4000:]
    return result


def assert_executed_and_vouched(checkout, example):
    for edition in EDITIONS:
        seen = shows(page(checkout, example, edition))
        assert seen.outputs and seen.figures, f"{example.stem} lost its outputs ({edition})"
        assert seen.provenance is not None and seen.not_executed is None, edition


def assert_not_executed(seen):
    assert seen.not_executed is not None, "no 'not executed' note"
    assert seen.provenance is None and seen.outputs == 0 and seen.figures == 0


@pytest.fixture(scope="module")
def after_preview(checkout):
    """Edit an example, preview, put it back, build in full (issue 15, §1, first sequence)."""
    edited = checkout / EDITED.relative_to(REPO)
    original = edit(edited)
    preview = checked(make(checkout, "preview"))
    preview_pages = {e: shows(page(checkout, e, build="preview")) for e in (EDITED, UNCHANGED)}
    edited.write_text(original)
    return preview, preview_pages, checked(make(checkout, "html"))


def test_preview_page_of_an_edited_example_makes_no_claim(after_preview):
    preview, pages, _ = after_preview
    assert_not_executed(pages[EDITED])
    assert pages[UNCHANGED].outputs and pages[UNCHANGED].provenance is not None
    assert "No example was executed" in preview.log


def test_full_build_after_a_preview_shows_every_output(checkout, after_preview):
    _, _, html = after_preview
    assert html.examples_executed_per_edition == {"en": 1, "zh_CN": 0}
    assert_executed_and_vouched(checkout, EDITED)


def test_profiler_prints_no_usdt_lines_in_the_build(after_preview):
    _, _, html = after_preview  # it executed 02_profiling, which profiles five workloads
    assert "02_profiling.py" in html.log
    assert "USDT" not in html.log and "profiler_start" not in html.log


def code_links(root):
    """Page -> how many names in its code blocks link to their documentation (codeautolink)."""
    return {str(p.relative_to(root)): p.read_text(encoding="utf-8").count("sphinx-codeautolink-a")
            for p in root.rglob("*.html")}


def links_to(root, page_name):
    """Built pages (both editions) with a link to ``page_name``."""
    pattern = re.compile(rf'href="(?:[^"]*/)?{re.escape(page_name)}(?:#[^"]*)?"')
    return sorted(str(p.relative_to(root)) for p in root.rglob("*.html")
                  if p.name != page_name and pattern.search(p.read_text(encoding="utf-8")))


@pytest.fixture(scope="module")
def after_partial_build(checkout, after_preview):
    """Edit one example, build a new one alone, put the first back and edit the new one,
    build in full (§1, second sequence). A third comes that prints nothing, and the new one
    goes, so that the full build fails (§1's guard); then the third goes too, and the next
    full build succeeds (§2). Adding and removing pages rewrites every page (their
    navigation changes), so one sequence adds and removes for all the tests that need it."""
    edited = checkout / EDITED.relative_to(REPO)
    added = {name: checkout / "examples" / LECTURE / f"{name}.py" for name in ("97_extra", "96_silent")}
    html = checkout / "_build" / "html"
    code_links_before = code_links(html)
    added["97_extra"].write_text(EXTRA)
    original = edit(edited)
    partial = checked(make(checkout, "html", EXAMPLES="97_extra"))
    pages = {edition: shows(page(checkout, EDITED, edition)) for edition in EDITIONS}
    extra_page = shows(page(checkout, added["97_extra"]))
    linking = links_to(html, "97_extra.html")

    edited.write_text(original)
    added["97_extra"].write_text(EXTRA + 'print("edited:", 2 + 2)\n')
    changed = checked(make(checkout, "html"))
    extra_after_change = shows(page(checkout, added["97_extra"]))

    added["97_extra"].unlink()
    added["96_silent"].write_text(SILENT)
    refused = make(checkout, "html")
    added["96_silent"].unlink()
    return SimpleNamespace(partial=partial, pages=pages, extra=extra_page, linking=linking,
                           changed=changed, extra_after_change=extra_after_change,
                           refused=refused, html=checked(make(checkout, "html")),
                           linking_after=links_to(html, "97_extra.html"),
                           code_links_before=code_links_before, code_links_after=code_links(html))


def test_partial_build_says_which_pages_it_did_not_execute(after_partial_build):
    built = after_partial_build
    assert built.partial.examples_executed_per_edition == {"en": 1, "zh_CN": 1}  # each its own program
    for edition in EDITIONS:
        assert_not_executed(built.pages[edition])
    assert "Not executed in this build" in built.pages["en"].text
    assert "本次构建未运行此示例" in built.pages["zh_CN"].text
    assert built.extra.outputs and built.extra.figures and built.extra.provenance is not None


def test_build_declares_what_its_machine_must_have(after_partial_build):
    import torch

    default = "cxx,nvcc,triton,inductor" if torch.cuda.is_available() else "cxx,triton,inductor"
    default += ",distributed"
    assert f"COURSE_REQUIRE={os.environ.get('COURSE_REQUIRE', default)}" in after_partial_build.extra.text


def test_full_build_fails_on_a_page_without_outputs(after_partial_build):
    refused = after_partial_build.refused
    assert refused.returncode != 0
    tail = refused.log[refused.log.rindex("Extension error"):]
    assert "96_silent.py: its page shows no printed output and no figure" in tail
    assert "What to do next" in tail


def test_an_added_example_appears_in_every_page_s_navigation(after_partial_build):
    last = next(e for e in reversed(EXAMPLES) if e.parent.name == LECTURE)  # the page before it
    for edition in EDITIONS:  # its neighbour's "next" link, and its lecture's gallery
        assert f"{edition}/auto_examples/{LECTURE}/{last.stem}.html" in after_partial_build.linking, edition
        assert f"{edition}/auto_examples/{LECTURE}/index.html" in after_partial_build.linking, edition


def test_a_full_build_executes_only_the_examples_that_are_not_current(after_partial_build):
    """The example edited after the partial build, and the one that build did not execute."""
    built = after_partial_build
    assert built.changed.examples_executed_per_edition == {"en": 2, "zh_CN": 2}
    assert "edited: 4" in built.extra_after_change.text
    assert built.extra_after_change.provenance is not None


def test_full_build_after_a_partial_one_shows_every_output(checkout, after_partial_build):
    assert after_partial_build.html.examples_executed == 0
    assert_executed_and_vouched(checkout, EDITED)


def test_removed_examples_leave_nothing_behind(checkout, after_partial_build):
    assert "isn't included in any toctree" not in after_partial_build.html.log
    left = [p.relative_to(checkout) for folder in ("source", "_build")
            for name in ("97_extra", "96_silent") for p in (checkout / folder).rglob(f"*{name}*")]
    assert not left, left
    assert after_partial_build.linking_after == [], "pages still link to the removed example"


def test_pages_written_again_keep_their_code_links(after_partial_build):
    """The last build rewrote every page (a page went), mostly from codeautolink's memo
    (sphinxext/codeautolink_memo.py): the links in the code blocks are those of before."""
    built = after_partial_build
    assert sum(built.code_links_before.values()) > 100
    assert built.code_links_after == built.code_links_before
    reused = [int(n) for n in re.findall(r"reused the links of (\d+) unchanged", built.html.log)]
    assert len(reused) == len(EDITIONS) and min(reused) >= 20, reused


# -- make serve --------------------------------------------------------------------


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _fetch(url):
    with urllib.request.urlopen(url, timeout=30) as response:
        return response.status, response.read().decode("utf-8")


class Served:
    """``make serve`` on a free port, running in a session of its own."""

    def __init__(self, checkout):
        self.base = f"http://127.0.0.1:{_free_port()}/"
        self.process = subprocess.Popen(
            ["make", "-C", str(checkout), "serve", f"VENV={sys.prefix}",
             f"PORT={self.base.rsplit(':', 1)[1].strip('/')}"],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True,
            env={**os.environ, **SITE_ENV},
        )
        self.lines = []
        self.ready = threading.Event()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self):
        for line in self.process.stdout:
            self.lines.append(line)
            if line.startswith("Serving http"):
                self.ready.set()

    def log(self):
        return "".join(self.lines[-40:])

    def ctrl_c(self, timeout=30):
        """What a terminal sends on Ctrl+C: SIGINT to the whole foreground group."""
        if self.process.poll() is not None:  # stopped already
            return self.process.returncode
        os.killpg(self.process.pid, signal.SIGINT)
        try:
            return self.process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(self.process.pid, signal.SIGKILL)
            return None


@pytest.fixture(scope="module")
def served(checkout, after_partial_build):
    server = Served(checkout)
    server.ready.wait(timeout=600)
    yield server
    if server.process.poll() is None:
        server.ctrl_c()


def test_serve_serves_both_editions_and_the_switcher_works(served):
    assert served.ready.is_set(), served.log()
    status, english = _fetch(served.base + "en/index.html")
    assert status == 200
    switcher = BeautifulSoup(english, "html.parser").select_one(".language-switcher a[hreflang=zh-CN]")
    chinese_url = urllib.request.urljoin(served.base + "en/index.html", switcher["href"])
    assert chinese_url == served.base + "zh_CN/index.html"
    status, chinese = _fetch(chinese_url)
    assert status == 200 and '<html lang="zh-CN"' in chinese


def test_serve_s_first_build_writes_only_what_changed(served):
    """A new serve tree starts from make html's: neither edition writes its pages again (the
    Chinese one did, while jieba's dictionary sat in each build's own doctree folder)."""
    assert served.ready.is_set(), served.log()
    first = "".join(served.lines[:next(i for i, line in enumerate(served.lines) if line.startswith("Serving"))])
    assert "writing output" in first
    for edition in EDITIONS:
        written = pages_written(first, edition)
        assert len(written) <= 3, (edition, written)


def test_serve_and_html_keep_their_own_trees(checkout, served):
    assert served.ready.is_set(), served.log()
    # Stopped first: its watcher must not rebuild into the shared source tree while
    # make html runs (a race that failed this test once in three runs).
    assert served.ctrl_c() is not None, "make serve did not stop on Ctrl+C"
    again = checked(make(checkout, "html"))
    assert again.examples_executed == 0
    # Neither edition reads every page again: no "[new config]", "[config changed ...]"
    # or "source directory has changed", as when both wrote the same doctrees.
    plain = re.sub(r"\x1b\[[0-9;]*m", "", again.log)  # Sphinx colours its log where CI=true
    updates = re.findall(r"^updating environment: .*$", plain, flags=re.MULTILINE)
    assert len(updates) == 2 and not any("[" in line for line in updates), updates
    assert "loading pickled environment... failed" not in again.log
    assert (checkout / "_build" / "serve" / "zh_CN" / "index.html").is_file()


def test_ctrl_c_stops_serve(served):
    assert any("press Ctrl+C to stop" in line for line in served.lines), served.log()
    assert served.ctrl_c() is not None, "make serve did not stop on Ctrl+C"
    time.sleep(0.5)
    assert "Stopped serving" in served.log()
    with pytest.raises(OSError):
        _fetch(served.base + "en/index.html")


# -- What EXAMPLES= executes, and what a lenient build's outputs are worth ------------


def pages_written(log, edition):
    """The pages an edition's build wrote, from Sphinx's "writing output... [ n%] page" lines."""
    # Where CI=true, Sphinx colours its log and ends each progress line with a carriage return.
    plain = re.sub(r"\x1b\[[0-9;]*[A-Za-z]", "", log).replace("\r", "\n")
    parts = re.split(r"^== (\S+) edition$", plain, flags=re.MULTILINE)
    text = dict(zip(parts[1::2], parts[2::2])).get(edition, "")
    return re.findall(r"^writing output\.\.\. \[\s*\d+%\] (\S+)", text, flags=re.MULTILINE)


@pytest.fixture(scope="module")
def after_named_builds(checkout, served):
    """RUN= names an unchanged example in a lenient build, then a strict build follows."""
    served.ctrl_c()  # its watcher must not build while these do
    stem = EDITED.stem
    named = checked(make(checkout, "html", RUN="profiling", COURSE_REQUIRE=""))
    lenient = provenance.read_record(checkout / "source" / "auto_examples" / LECTURE, stem)
    strict = checked(make(checkout, "html"))
    return SimpleNamespace(named=named, lenient=lenient, strict=strict,
                           record=provenance.read_record(checkout / "source" / "auto_examples" / LECTURE, stem))


def test_run_executes_what_it_names_even_when_current(after_named_builds):
    assert after_named_builds.named.examples_executed_per_edition == {"en": 1, "zh_CN": 1}
    assert "Executing 1 of" in after_named_builds.named.log


def test_a_build_says_its_configuration_changed_only_when_it_did(after_named_builds):
    for build in (after_named_builds.named, after_named_builds.strict):
        assert "The configuration has changed" not in build.log


def test_a_partial_build_writes_only_the_pages_it_changed(after_named_builds):
    """The selection is not configuration: neither it nor the next full build rewrites every page."""
    for build in (after_named_builds.named, after_named_builds.strict):
        for edition in EDITIONS:
            written = pages_written(build.log, edition)
            assert f"auto_examples/{LECTURE}/{EDITED.stem}" in written, (edition, written)
            # The example's page, and the pages that show its thumbnail or running time.
            assert len(written) <= 5, (edition, written)


def test_a_strict_build_executes_again_what_a_lenient_one_ran(after_named_builds):
    built = after_named_builds
    assert built.lenient["required"] == []
    assert built.strict.examples_executed_per_edition == {"en": 1, "zh_CN": 1}
    assert f"{EDITED.name} executes again: its outputs come from a build that required only nothing" \
        in built.strict.log
    assert set(built.record["required"]) >= set(provenance.STRICT_REQUIREMENTS["cpu"])
    assert provenance.is_strict(built.record) and not provenance.is_strict(built.lenient)


def test_examples_that_matches_nothing_fails_at_once_and_lists_the_examples(checkout, after_named_builds):
    result = make(checkout, "html", EXAMPLES="does_not_exist")
    assert result.returncode != 0 and result.seconds < 60
    assert "EXAMPLES='does_not_exist' matches no example's file name" in result.log
    assert "06_torch_compile" in result.log and "== en edition" not in result.log


def _messages(locale):
    found = {}
    for po in sorted(locale.rglob("*.po")):
        with open(po, "rb") as f:
            found[po.relative_to(locale).as_posix()] = {(m.id, m.string, m.fuzzy) for m in read_po(f) if m.id}
    return found


def test_translations_after_a_build_extract_only_the_source(checkout, after_named_builds):
    """make translations after make html: the catalogs gain nothing that a build added to its pages."""
    locale = checkout / "locale" / "zh_CN" / "LC_MESSAGES"
    before = _messages(locale)
    checked(make(checkout, "translations"))
    after = _messages(locale)
    changed = {name: sorted(m[0] for m in after[name] ^ before.get(name, set())) for name in after
               if after[name] != before.get(name)}
    assert changed == {}, changed


def test_a_broken_translation_fails_make_html_before_the_chinese_build(checkout, after_named_builds):
    catalog = checkout / "locale/zh_CN/LC_MESSAGES/auto_examples" / LECTURE / f"{EDITED.stem}.po"
    original = catalog.read_text(encoding="utf-8")
    with open(catalog, "rb") as f:
        message = next(m for m in read_po(f) if m.id and "``" in m.string)
    broken = message.string.replace("``", "`", 1)  # an unbalanced literal
    escaped = json.dumps(message.string, ensure_ascii=False)[1:-1]
    assert escaped in original
    catalog.write_text(original.replace(escaped, json.dumps(broken, ensure_ascii=False)[1:-1], 1),
                       encoding="utf-8")
    try:
        result = make(checkout, "html", EDITIONS="zh_CN")
    finally:
        catalog.write_text(original, encoding="utf-8")
    assert result.returncode != 0
    assert f"auto_examples/{LECTURE}/{EDITED.stem}.po" in result.log
    assert "tools/check_translation.py --lint" in result.log and "== zh_CN edition" not in result.log
