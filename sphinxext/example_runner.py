"""What happens around each example that the gallery executes, and around the gallery.

sphinx-gallery calls :func:`around_each_example` before and after every example
(``reset_modules_order = "both"``). Before: arm a time limit and point the
example at its artefact folder. After: disarm it, free memory for the next
example, and record the provenance of the outputs that were just produced.

As a Sphinx extension (:func:`setup`), it keeps the gallery's generated tree
truthful around sphinx-gallery's own work: what removed examples left goes, an
MD5 file stays only while a provenance record vouches for its page, a full build
fails on a page without its outputs, and a failed build ends with what failed
and what to do next.
"""

import atexit
import gc
import json
import numbers
import os
import re
import shutil
import signal
import sys
import time
from pathlib import Path

import check_margins
from example_selection import SelectionError, filename_pattern, selected
from provenance import (
    STRICT_REQUIREMENTS,
    collect_provenance,
    page_has_outputs,
    provenance_path,
    read_record,
    record_path,
    source_md5,
    vouching_record,
)
from sphinx.errors import ConfigError, ExtensionError

DEFAULT_TIMEOUT_S = 600


class ExampleTimeout(TimeoutError):
    """Raised inside an example that runs past the per-example limit."""


def around_each_example(gallery_conf, fname, when):
    if fname is None:  # called once per gallery folder, not per example
        return
    src_file = Path(gallery_conf["src_dir"], _example_dir(gallery_conf, fname), fname)
    gallery_dir = _gallery_dir(gallery_conf, fname)
    if when == "before":
        _prepare(src_file, gallery_dir)
        _start_run(gallery_dir, src_file.stem)
    else:
        signal.alarm(0)
        run = _finish_run(gallery_conf, src_file)
        _free_memory()
        _record_provenance(src_file, gallery_dir, run)


# The Chinese edition's figures draw their Han characters from a subset of Noto Sans CJK SC
# vendored with the course (fonts/, made by tools/make_cjk_font.py); Latin text, digits and
# symbols keep matplotlib's DejaVu Sans, and matplotlib falls back glyph by glyph.
FIGURE_FONT = Path(__file__).resolve().parents[1] / "fonts" / "NotoSansCJKsc-Regular-subset.otf"


def figure_font(gallery_conf, fname, when):
    """Before each example of the Chinese edition, after matplotlib's reset: the font."""
    app = _build.get("app")
    if fname is None or when != "before" or app is None or app.config.language != "zh_CN":
        return
    from matplotlib import font_manager, rcParams

    font_manager.fontManager.addfont(str(FIGURE_FONT))
    rcParams["font.family"] = ["DejaVu Sans", font_manager.FontProperties(fname=FIGURE_FONT).get_name()]


def timeout_seconds():
    return int(os.environ.get("COURSE_EXAMPLE_TIMEOUT", DEFAULT_TIMEOUT_S))


def artifact_dir(gallery_dir, stem):
    return Path(gallery_dir, "artifacts", stem)


def _prepare(src_file, gallery_dir):
    """Before an example: required capabilities, Triton's interpreter, artefacts, time limit.

    COURSE_REQUIRE names the capabilities this build must have, so that an example's
    skip of one fails the build: "cxx,triton,inductor,distributed" on a CPU,
    "cxx,nvcc,triton,inductor,distributed" on CUDA. A value already in the environment wins;
    an empty one makes a lenient build.
    """
    os.environ.setdefault("COURSE_REQUIRE", ",".join(required_capabilities()))
    _use_triton_interpreter_without_cuda()
    _quiet_profiler_markers()
    artifacts = artifact_dir(gallery_dir, src_file.stem)
    shutil.rmtree(artifacts, ignore_errors=True)  # files of an earlier run are not this run's
    artifacts.mkdir(parents=True, exist_ok=True)
    os.environ["COURSE_ARTIFACT_DIR"] = str(artifacts)
    limit = timeout_seconds()

    def stop_hung_example(signum, frame):
        raise ExampleTimeout(
            f"{src_file.name} ran longer than the per-example limit of {limit} s "
            "(COURSE_EXAMPLE_TIMEOUT); it was stopped."
        )

    signal.signal(signal.SIGALRM, stop_hung_example)
    signal.alarm(limit)


def required_capabilities():
    """What this build requires: COURSE_REQUIRE if set (empty: nothing), else the strict
    default for this machine (lecture 7 forks its ranks with torch.distributed)."""
    if "COURSE_REQUIRE" in os.environ:
        return [c for c in os.environ["COURSE_REQUIRE"].split(",") if c]
    return list(STRICT_REQUIREMENTS["cuda" if gpu_present() else "cpu"])


def gpu_present():
    """Whether this machine has a GPU, asked of NVML: ``torch.cuda.is_available()``
    starts the CUDA driver, after which lecture 7's forked NCCL ranks cannot use it."""
    import torch

    return torch.cuda.device_count() > 0


def _use_triton_interpreter_without_cuda():

    if not gpu_present():
        os.environ.setdefault("TRITON_INTERPRET", "1")


def _quiet_profiler_markers():
    """libkineto, torch.profiler's engine, logs a ``USDT: ... profiler_start`` and
    ``profiler_stop`` line to stderr for every profile. Its levels run from VERBOSE (0)
    to USDT (5); KINETO_LOG_LEVEL=6 keeps it quiet (its ERROR lines too) in builds.
    It is read when the profiler first starts, so setting it here is in time."""
    os.environ.setdefault("KINETO_LOG_LEVEL", "6")


def _free_memory():
    import torch

    torch._dynamo.reset()
    gc.collect()
    if torch.cuda.is_initialized():  # nothing to free otherwise, and CUDA stays unstarted
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()


def _sources_of(src_file):
    """The files in git that a program comes from: the example itself, or for another
    edition's program (rendered into the build's tree) the example and its catalog."""
    repo = Path(__file__).resolve().parents[1]
    english = repo / "examples" / src_file.parent.name / src_file.name
    app = _build.get("app")
    if not english.is_file() or english.resolve() == Path(src_file).resolve() or app is None:
        return [src_file]
    return [english, repo / "locale" / app.config.language / "LC_MESSAGES" / "auto_examples"
            / src_file.parent.name / (src_file.stem + ".po")]


def _record_provenance(src_file, gallery_dir, run=None):
    # The MD5 of the copy sphinx-gallery just executed ties the record to this run's outputs.
    record = {**collect_provenance(src_file, _sources_of(src_file)), **(run or {}),
              "required": required_capabilities(),
              "source_md5": source_md5(gallery_dir, src_file.stem)}
    path = provenance_path(gallery_dir, src_file.stem)
    path.write_text(json.dumps(record, indent=2) + "\n", encoding="utf-8")


def _gallery_pair(gallery_conf, fname):
    """The (examples dir, gallery dir) pair that holds the example ``fname``."""
    pairs = zip(gallery_conf["examples_dirs"], gallery_conf["gallery_dirs"])
    for examples_dir, gallery_dir in pairs:
        if Path(gallery_conf["src_dir"], examples_dir, fname).is_file():
            return examples_dir, gallery_dir
    raise FileNotFoundError(f"{fname} is in none of {gallery_conf['examples_dirs']}")


def _example_dir(gallery_conf, fname):
    return _gallery_pair(gallery_conf, fname)[0]


def _gallery_dir(gallery_conf, fname):
    return Path(gallery_conf["src_dir"], _gallery_pair(gallery_conf, fname)[1])


# The GPU build's report (tools/gpu_check.py --from-build) comes from the build's
# own runs, so each example executes once: the record keeps its wall time, peak
# GPU memory and KEY_FIGURES.
_run = {}


def keep_key_figures(block, block_vars, gallery_conf):
    """An image scraper that scrapes no image: after each code block, keep the example's KEY_FIGURES."""
    figures = block_vars["example_globals"].get("KEY_FIGURES")
    if isinstance(figures, dict):
        _run["key_figures"] = {
            str(k): float(f"{v:.4g}") if isinstance(v, numbers.Real) else str(v)
            for k, v in figures.items()
        }
    return ""


def _start_run(gallery_dir, stem):
    import torch

    _run.clear()
    if torch.cuda.is_initialized():
        torch.cuda.reset_peak_memory_stats()
    log = Path(gallery_dir, "provenance", f"{stem}.margins.jsonl")
    log.parent.mkdir(parents=True, exist_ok=True)
    log.unlink(missing_ok=True)
    check_margins.install(log)  # every assert_close of the example logs its margin use here
    _run["margin_log"] = log
    _run["start"] = time.perf_counter()


def _finish_run(gallery_conf, src_file):
    import torch

    seconds = time.perf_counter() - _run.pop("start", time.perf_counter())
    log = _run.pop("margin_log", None)
    margins = check_margins.table(check_margins.read(log)) if log else []
    if log:
        log.unlink(missing_ok=True)
        os.environ.pop(check_margins.LOG_VARIABLE, None)
    cuda = gpu_present()
    failures = {Path(k).resolve(): v for k, v in gallery_conf["failing_examples"].items()}
    failure = failures.get(src_file.resolve())
    return {
        "passed": failure is None,
        "error": failure.strip().splitlines()[-1] if failure else None,
        "seconds": round(seconds, 2),
        "peak_gpu_memory_gib": round(torch.cuda.max_memory_allocated() / 2**30, 3) if cuda else None,
        "key_figures": _run.pop("key_figures", {}),
        "margins": margins,  # each assert_close: its worst error over the error it allowed
    }


# -- Around the whole gallery: what its generated tree may hold ---------------
#
# sphinx-gallery skips an example whose MD5 file matches the example and keeps
# the page it wrote last. A build that does not execute an example (make preview,
# EXAMPLES=) rewrites its page without outputs, and the MD5 file of the earlier
# run stays: once the example is back as it was, every later build would skip it
# and show an empty page. So an MD5 file stays only while a provenance record
# vouches for the outputs its page shows, generated files of examples that are
# gone are removed, and a full build checks every page.

_build = {"unvouched": []}


def setup(app):
    app.connect("config-inited", check_the_selection)
    app.connect("builder-inited", keep_the_environment, priority=100)
    app.connect("builder-inited", apply_the_selection, priority=300)
    app.connect("builder-inited", remove_what_removed_examples_left, priority=400)
    app.connect("builder-inited", drop_outputs_nobody_vouches_for, priority=400)
    app.connect("builder-inited", execute_what_the_selection_names, priority=450)
    # sphinx-gallery generates the pages at the default priority, 500.
    app.connect("builder-inited", check_the_generated_pages, priority=600)
    app.connect("env-get-outdated", note_pages_that_come_or_go)
    app.connect("env-updated", rewrite_every_page_when_pages_come_or_go)
    # Before sphinx-gallery's report of failing examples (500), which raises.
    app.connect("build-finished", keep_the_environment, priority=100)
    if "app" not in _build:
        atexit.register(print_what_to_do_next)  # after Sphinx's own error report
    _build["app"] = app
    return {"parallel_read_safe": True, "version": "1"}


# -- What this build executes (COURSE_EXAMPLES, COURSE_LECTURES) -----------------
#
# Applied to sphinx-gallery's settings once the builder has started, so that the
# HTML builder's record of the configuration (and so the pages it decides to write)
# is the same for a partial build as for a full one.


def _selection(app):
    lectures, pattern = os.environ.get("COURSE_LECTURES"), os.environ.get("COURSE_EXAMPLES")
    if not (lectures or pattern):
        return None
    return selected([e for _, gallery in galleries(app) for e in gallery], lectures, pattern)


def check_the_selection(app, config):
    """Fail at once, naming the examples, when EXAMPLES= or COURSE_LECTURES matches nothing."""
    try:
        _selection(app)
    except SelectionError as error:
        raise ConfigError(str(error)) from None


def apply_the_selection(app):
    if (chosen := _selection(app)) is not None:
        app.config.sphinx_gallery_conf["filename_pattern"] = filename_pattern(chosen)


def execute_what_the_selection_names(app):
    """``make html RUN=...`` executes what it names, even when its outputs are current.

    COURSE_RUN_AGAIN holds the time ``make`` started (seconds since the epoch): outputs
    recorded before it execute again, and those that the English edition's build has
    just recorded serve the Chinese edition, as in any build.
    """
    started = os.environ.get("COURSE_RUN_AGAIN")
    if not (os.environ.get("COURSE_EXAMPLES") and started) or not app.config.sphinx_gallery_conf["plot_gallery"]:
        return
    for gallery_dir, example in _selection_in_galleries(app):
        record = record_path(gallery_dir, example.stem)
        if not record.is_file() or record.stat().st_mtime < float(started):
            (gallery_dir / f"{example.name}.md5").unlink(missing_ok=True)


def _selection_in_galleries(app):
    chosen = set(_selection(app) or ())
    return [(gallery_dir, e) for gallery_dir, examples in galleries(app) for e in examples if e in chosen]


# -- A failed build keeps what it read ------------------------------------------
#
# Sphinx deletes its pickled environment when a build raises (sphinx-gallery raises
# at the end when an example failed), so the next build would read every page again.
# A copy made before that is put back once the build has stopped: a failed example
# has no MD5 file and executes again, and the pages that changed are read again.


def _environment_pickle(app):
    from sphinx.application import ENV_PICKLE_FILENAME

    return Path(app.doctreedir, ENV_PICKLE_FILENAME)


def keep_the_environment(app, exception=None):
    pickled = _environment_pickle(app)
    kept = pickled.with_name(pickled.name + ".kept")
    if exception is None and pickled.is_file():
        shutil.copy2(pickled, kept)
    elif exception is not None and not pickled.is_file() and kept.is_file():
        kept.replace(pickled)


# -- Pages that come or go change every page's navigation ---------------------
#
# Sphinx writes the pages it read again and the gallery's index, but every page's
# sidebar and previous/next links name the pages around it: when a page is added or
# removed, every page is written again, so that none links to a page that is gone.


def note_pages_that_come_or_go(app, env, added, changed, removed):
    _build["pages_come_or_go"] = bool(added or removed)
    return []


def rewrite_every_page_when_pages_come_or_go(app, env):
    if _build.pop("pages_come_or_go", False):
        return sorted(env.found_docs)
    return None


def galleries(app):
    """(gallery folder, example files) of each lecture, as sphinx-gallery sees them."""
    conf = app.config.sphinx_gallery_conf
    for examples_dir, gallery_dir in zip(conf["examples_dirs"], conf["gallery_dirs"]):
        folder = Path(os.path.normpath(Path(app.srcdir, examples_dir)))
        examples = sorted(p for p in folder.glob("*.py") if not re.search(conf["ignore_pattern"], str(p)))
        yield Path(app.srcdir, gallery_dir), examples


def drop_outputs_nobody_vouches_for(app):
    """Keep an example's MD5 file only while a provenance record vouches for its page.

    A record vouches only for a build that requires no more than the run it records
    did (COURSE_REQUIRE): outputs of a lenient build execute again in a strict one.
    Runs before sphinx-gallery generates the pages, so that this build executes
    what it may, and after, so that a partial build leaves no MD5 file that would
    keep the next build from executing a page it left without outputs.
    """
    required = set(required_capabilities())
    for gallery_dir, examples in galleries(app):
        for example in examples:
            record = read_record(gallery_dir, example.stem)
            if record is None:
                pass
            elif record.get("source_md5") != source_md5(gallery_dir, example.stem):
                _drop_record(gallery_dir, example.stem)  # a record of another version
            elif not required <= set(record.get("required", ())):
                _drop_record(gallery_dir, example.stem)  # a more lenient build's: it runs again
                logger().info(f"{example.name} executes again: its outputs come from a build that required"
                              f" only {','.join(record.get('required', [])) or 'nothing'}")
            md5_file = gallery_dir / f"{example.name}.md5"
            if md5_file.is_file() and vouching_record(gallery_dir, example.stem) is None:
                md5_file.unlink()


def _drop_record(gallery_dir, stem):
    record_path(gallery_dir, stem).unlink()
    shutil.rmtree(artifact_dir(gallery_dir, stem), ignore_errors=True)


def check_the_generated_pages(app):
    drop_outputs_nobody_vouches_for(app)
    if is_full_build(app):
        check_every_page_shows_its_outputs(app)


def is_full_build(app):
    """True when this build may execute every example (no preview, no EXAMPLES= or shard)."""
    conf = app.config.sphinx_gallery_conf
    examples = [e for _, gallery in galleries(app) for e in gallery]
    return bool(conf["plot_gallery"]) and all(re.search(conf["filename_pattern"], str(e)) for e in examples)


def check_every_page_shows_its_outputs(app):
    """A full build fails on any example page without outputs that a record vouches for.

    Failing examples are left to sphinx-gallery, which reports them at the end.
    """
    failing = {os.path.normpath(path) for path in app.config.sphinx_gallery_conf["failing_examples"]}
    for gallery_dir, examples in galleries(app):
        for example in examples:
            if str(example) not in failing and vouching_record(gallery_dir, example.stem) is None:
                _build["unvouched"].append((example, _why_unvouched(gallery_dir, example.stem)))
    if _build["unvouched"]:
        names = ", ".join(example.name for example, _ in _build["unvouched"])
        raise ExtensionError(f"example pages without the outputs of their source: {names} (see below)")


def _why_unvouched(gallery_dir, stem):
    if not page_has_outputs(gallery_dir, stem):
        return "its page shows no printed output and no figure"
    if read_record(gallery_dir, stem) is None:
        return "no provenance record belongs to the outputs its page shows"
    return "its provenance record and its page come from different runs"


def remove_what_removed_examples_left(app):
    """Generated files and built pages of examples (or lectures) no longer in examples/ go."""
    conf = app.config.sphinx_gallery_conf
    current = {}
    for gallery_dir, examples in galleries(app):
        current[gallery_dir.name] = {e.stem for e in examples}
        for stem in sorted(_generated_stems(gallery_dir) - current[gallery_dir.name]):
            _remove_generated(gallery_dir, stem)
            logger().info(f"removed the generated files of {gallery_dir.name}/{stem}, whose example is gone")
    generated_root = Path(app.srcdir, conf["gallery_dirs"][0]).parent
    if generated_root == Path(app.srcdir) or any(Path(app.srcdir, d).parent != generated_root
                                                 for d in conf["gallery_dirs"]):
        return  # the galleries do not share a folder of their own: nothing else is safe to remove
    keep = {Path(app.srcdir, d).name for d in conf["gallery_dirs"]} | {Path(conf["backreferences_dir"]).name}
    for folder in sorted(generated_root.glob("*/")):
        if folder.name not in keep:
            shutil.rmtree(folder)
            logger().info(f"removed {folder}, a gallery no longer in conf.py")
    relative = generated_root.relative_to(app.srcdir)
    for doctree in sorted(Path(app.doctreedir, relative).glob("*/*.doctree")):
        if not _is_current(doctree, current):
            doctree.unlink()  # Sphinx forgets a gone page but keeps its doctree
    if app.builder.format == "html":
        _remove_stale_built_pages(Path(app.outdir), Path(app.outdir, relative), current)


def _is_current(path, current):
    """True for a gallery's index or an example's page (or doctree) that is still there."""
    lecture, stem = path.parent.name, path.stem
    return lecture in current and (stem == "index" or stem in current[lecture])


def _generated_stems(gallery_dir):
    stems = {p.stem for p in gallery_dir.glob("*.py")}
    stems |= {p.stem for p in gallery_dir.glob("*.rst")} - {"index"}
    stems |= {p.stem for p in (gallery_dir / "provenance").glob("*.json")}
    return stems | {p.name for p in (gallery_dir / "artifacts").glob("*/")}


def _remove_generated(gallery_dir, stem):
    images = gallery_dir / "images"
    for path in [*gallery_dir.glob(f"{stem}.*"), *images.glob(f"sphx_glr_{stem}_[0-9][0-9][0-9].*"),
                 *images.glob(f"thumb/sphx_glr_{stem}_thumb.*"), record_path(gallery_dir, stem)]:
        path.unlink(missing_ok=True)
    shutil.rmtree(artifact_dir(gallery_dir, stem), ignore_errors=True)


def _remove_stale_built_pages(outdir, built, current):
    """Pages of gone examples in the output, with their figures, downloads and sources."""
    for page in sorted(built.glob("*/*.html")):
        if _is_current(page, current):
            continue
        stem = page.stem
        text = page.read_text(encoding="utf-8", errors="replace")
        for link in re.findall(r'(?:href|src)="([^"#?]+)"', text):
            target = Path(os.path.normpath(page.parent / link))
            if target.parent.parent == outdir / "_downloads" and target.is_file():
                target.unlink()
                if not any(target.parent.iterdir()):
                    target.parent.rmdir()
        for image in (outdir / "_images").glob(f"sphx_glr_{stem}_*"):
            if re.fullmatch(rf"sphx_glr_{re.escape(stem)}_(\d{{3}}|thumb)\.\w+", image.name):
                image.unlink()
        source = outdir / "_sources" / page.relative_to(outdir).with_suffix(".rst.txt")
        source.unlink(missing_ok=True)
        page.unlink()
        logger().info(f"removed {page.relative_to(outdir)}, whose example is gone")
    for folder in sorted(built.glob("*/")):
        if folder.name not in current and not any(folder.rglob("*.html")):
            shutil.rmtree(folder)


def logger():
    from sphinx.util import logging

    return logging.getLogger(__name__)


# -- When the build fails: the last lines say what failed and what to do ------


def print_what_to_do_next():
    """At exit, after Sphinx's own "Extension error" report: each failure and the way on."""
    app = _build.get("app")
    failing = dict(app.config.sphinx_gallery_conf.get("failing_examples", {})) if app else {}
    if not (failing or _build["unvouched"]):
        return
    here = Path(app.confdir)
    lines = ["", "=" * 78]
    if failing:
        lines.append(f"The build failed: {_count(len(failing), 'example')} raised an error.")
        for path, traceback in failing.items():
            lines += ["", os.path.relpath(path, here), *(f"    {t}" for t in traceback.rstrip().splitlines())]
    if _build["unvouched"]:
        lines += ["", "The build failed: a full build shows every example's outputs, and these pages do not:"]
        lines += [f"    {os.path.relpath(e, here)}: {why}" for e, why in _build["unvouched"]]
    lines += ["", "What to do next:", *_next_steps(here, failing), "The full log is above."]
    sys.stdout.flush()
    print("\n".join(lines), file=sys.stderr, flush=True)


def _next_steps(here, failing):
    python = os.path.relpath(sys.executable, here) if Path(sys.executable).is_relative_to(here) \
        else sys.executable
    interpret = "TRITON_INTERPRET=1 " if os.environ.get("TRITON_INTERPRET") == "1" else ""
    steps = []
    for path, traceback in failing.items():
        name = Path(path).stem
        steps += [f"  - Run {Path(path).name} on its own, as a reader would, to see the error:",
                  f"        {interpret}{python} {os.path.relpath(path, here)}"]
        if ExampleTimeout.__name__ in traceback:
            steps.append(f"    It ran past the time limit of {timeout_seconds()} s: make it finish"
                         " sooner at CPU sizes, or allow longer: make html COURSE_EXAMPLE_TIMEOUT=1200")
        if required := re.search(r"this build requires (\w+)", traceback):
            others = [c for c in os.environ.get("COURSE_REQUIRE", "").split(",") if c and c != required[1]]
            steps.append(f"    This build requires {required[1]} (COURSE_REQUIRE): install it, or build"
                         f" without requiring it: make html COURSE_REQUIRE={','.join(others)}")
        steps.append(f"    While you work on it, make html EXAMPLES={name} executes only this example.")
    if failing:
        steps.append("  - Then run make html again: only the examples that failed or changed execute.")
    if _build["unvouched"]:
        steps += ["  - An example must print or draw what it finds; a page with neither fails the build.",
                  "  - Otherwise run make html again: these examples will execute again.",
                  "    make html-fresh rebuilds every page from scratch."]
    return steps


def _count(n, noun):
    return f"1 {noun}" if n == 1 else f"{n} {noun}s"
