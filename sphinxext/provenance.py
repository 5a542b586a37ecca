"""Provenance: which machine and software produced an example's outputs.

The record is written when the example *executes* (see ``example_runner``), as
``<gallery dir>/provenance/<stem>.json``, with the MD5 of the source it ran.
When Sphinx reads the generated page, the record is rendered as a note under the
title, so a page rebuilt from sphinx-gallery's cache still names the machine that
really ran it. A record vouches for a page only while it belongs to the outputs
the page shows (:func:`vouching_record`); a page without such a record says that
this build did not execute it, and claims nothing else.
"""

import datetime
import html
import importlib.metadata
import json
import os
import platform
import subprocess
from pathlib import Path

GALLERY_ROOT = "auto_examples"

# What a site build requires of its machine, by default (docs/how-the-build-works.md):
# an example that would skip one of these fails the build instead.
STRICT_REQUIREMENTS = {
    "cpu": ("cxx", "triton", "inductor", "distributed"),
    "cuda": ("cxx", "nvcc", "triton", "inductor", "distributed"),
}


def is_strict(record):
    """True when the run it records required everything a strict build on its device requires."""
    strict = STRICT_REQUIREMENTS.get(record.get("device_type", "cpu"), STRICT_REQUIREMENTS["cuda"])
    return set(record.get("required", ())) >= set(strict)


def provenance_path(gallery_dir, stem):
    folder = Path(gallery_dir, "provenance")
    folder.mkdir(parents=True, exist_ok=True)
    return folder / f"{stem}.json"


def record_path(gallery_dir, stem):
    return Path(gallery_dir, "provenance", f"{stem}.json")


def source_md5(gallery_dir, stem):
    """sphinx-gallery's MD5 of the example's copy in the gallery: the source its page shows."""
    # Imported here: tools/gpu_check.py uses this module on a machine without Sphinx.
    from sphinx_gallery.utils import get_md5sum

    copy = Path(gallery_dir, f"{stem}.py")
    return get_md5sum(copy, mode="t") if copy.is_file() else None


def page_has_outputs(gallery_dir, stem):
    """True when the generated page holds printed output or a figure, as an executed page does."""
    page = Path(gallery_dir, f"{stem}.rst")
    text = page.read_text(encoding="utf-8") if page.is_file() else ""
    return "sphx-glr-script-out" in text or f"/sphx_glr_{stem}_0" in text


def read_record(gallery_dir, stem):
    path = record_path(gallery_dir, stem)
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


def vouching_record(gallery_dir, stem):
    """The provenance record, if it belongs to the outputs the page shows; else None.

    It belongs when the run it records passed, ran the source the page shows, and
    sphinx-gallery's MD5 (which keeps a page from being executed again) names that
    same source, so the page holds that run's outputs.
    """
    record = read_record(gallery_dir, stem)
    md5_file = Path(gallery_dir, f"{stem}.py.md5")
    if record is None or not md5_file.is_file() or not record.get("passed", True):
        return None
    ran = record.get("source_md5")
    if ran is None or ran != md5_file.read_text().strip() or ran != source_md5(gallery_dir, stem):
        return None
    return record if page_has_outputs(gallery_dir, stem) else None


def collect_provenance(src_file, sources=None):
    """The record's machine and versions; ``sources``: the files in git that the program
    comes from (the Chinese program, in the build's tree, comes from its example and its
    catalog), ``src_file`` itself by default."""
    import torch

    cuda = torch.cuda.is_available()
    return {
        "device": torch.cuda.get_device_name() if cuda else f"CPU: {cpu_model()}",
        "device_type": "cuda" if cuda else "cpu",
        "cpu_count": _cpu_count(),
        "torch": torch.__version__,
        "triton": _version_of("triton"),
        "cuda": torch.version.cuda or "none",
        "python": platform.python_version(),
        "platform": platform.platform(terse=True),
        "executed_at": datetime.datetime.now(datetime.UTC).strftime(
            "%Y-%m-%d %H:%M UTC"
        ),
        "git_commit": git_commit(*(sources or [src_file])),
    }


def cpu_model():
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _cpu_count():
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()


def _version_of(package):
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return "not installed"


def git_commit(path, *more):
    """Short commit of the checkout, marked ``+modified`` if ``path`` (a file or folder), or
    any of ``more``, differs from it."""
    path = Path(path)

    def git(*args):
        return subprocess.run(
            ["git", *args], cwd=path if path.is_dir() else path.parent, capture_output=True,
            text=True, check=True,
        ).stdout.strip()

    try:
        commit = git("rev-parse", "--short", "HEAD")
        modified = git("status", "--porcelain", "--", str(path), *map(str, more))
    except (OSError, subprocess.CalledProcessError):
        # A copy without .git (an unpacked archive, the tests' scratch copies)
        # may be told its commit by whoever made it.
        return os.environ.get("COURSE_GIT_COMMIT", "unknown (not a git checkout)")
    return f"{commit}+modified" if modified else commit


NOTE_TEXT = {
    "en": {
        "title": "Where these outputs come from",
        "body": "Executed on <strong>{device}</strong> ({cpu_count} CPU cores available) with"
        " torch {torch}, triton {triton}, CUDA {cuda}, Python {python},"
        " on {executed_at} at commit <code>{git_commit}</code>.",
        "files": "Files this example wrote:",
    },
    "zh_CN": {
        "title": "这些输出来自哪台机器",
        "body": "运行于 <strong>{device}</strong>（可用 CPU 核心 {cpu_count} 个），"
        "torch {torch}，triton {triton}，CUDA {cuda}，Python {python}；"
        "运行时间 {executed_at}，提交 <code>{git_commit}</code>。",
        "files": "本示例写出的文件：",
    },
}


NOT_EXECUTED_TEXT = {
    "en": {
        "title": "Not executed in this build",
        "body": "This page shows the example's code without its outputs: the build that"
        " made it did not execute this version of the example (a <code>make preview</code>,"
        " or a <code>make html EXAMPLES=…</code> that left it out). A full"
        " <code>make html</code> executes it.",
    },
    "zh_CN": {
        "title": "本次构建未运行此示例",
        "body": "本页只有示例的代码，没有输出：生成本页的构建没有运行这一版示例"
        "（<code>make preview</code>，或没有选中它的 <code>make html EXAMPLES=…</code>）。"
        "完整的 <code>make html</code> 会运行它。",
    },
}


def render_note(record, language="en", files=()):
    """The note shown on the example's page: an admonition with the record as raw HTML.

    Raw, because the record changes with every execution: as a translatable
    paragraph it would churn the translation catalogs. It is translated here,
    and so is the list of ``files`` (paths relative to the page) the example wrote,
    which sits inside the note so that no page's description starts with it.
    """
    text = NOTE_TEXT.get(language, NOTE_TEXT["en"])
    body = text["body"].format(**{k: html.escape(str(v)) for k, v in record.items()})
    lines = [f".. admonition:: {text['title']}", "   :class: provenance", "",
             "   .. raw:: html", "", f"      <p>{body}</p>", ""]
    if files:
        lines += [f"   **{text['files']}**", "", *(f"   * :download:`{Path(f).name} <{f}>`" for f in files)]
    return "\n".join([*lines, "", ""])


def render_not_executed(language="en"):
    text = NOT_EXECUTED_TEXT.get(language, NOT_EXECUTED_TEXT["en"])
    return "\n".join([".. raw:: html", "", '   <div class="admonition not-executed">',
                      f'   <p class="admonition-title">{text["title"]}</p>',
                      f"   <p>{text['body']}</p>", "   </div>", "", ""])


def insert_provenance(app, docname, source):
    """``source-read`` handler: put the provenance note under an example's title.

    Not for the gettext builder: the catalogs hold the examples' own text, never
    what a build adds to their pages (the note is translated here instead).
    """
    parts = docname.split("/")
    if len(parts) != 3 or parts[0] != GALLERY_ROOT or parts[2] == "index" or app.builder.name == "gettext":
        return
    record = vouching_record(Path(app.srcdir, *parts[:2]), parts[2])
    if record is None:
        source[0] = _after_title(source[0], render_not_executed(app.config.language))
        return
    source[0] = _after_title(source[0], render_note(record, app.config.language, _artifacts(app, parts)))


def _artifacts(app, parts):
    folder = Path(app.srcdir, *parts[:2], "artifacts", parts[2])
    files = sorted(p for p in folder.glob("*") if p.is_file()) if folder.is_dir() else []
    return [f"artifacts/{parts[2]}/{p.name}" for p in files]


def _after_title(rst, block):
    """Insert ``block`` after the first section title (a line underlined with ``=``)."""
    lines = rst.splitlines(keepends=True)
    for i in range(1, len(lines)):
        underline = lines[i].strip()
        if underline and set(underline) == {"="} and lines[i - 1].strip():
            return "".join(lines[: i + 1]) + "\n" + block + "\n" + "".join(lines[i + 1 :])
    return rst + "\n" + block


def setup(app):
    app.connect("source-read", insert_provenance)
    return {"parallel_read_safe": True, "version": "1"}
