"""Run an example on a free GPU: "Open in Colab" links and notebooks that ask for a GPU.

sphinx-gallery writes each example as a notebook beside its page. Here each
notebook gains the metadata that makes Colab start a GPU runtime (a T4 on the
free tier) and a first cell saying that nothing needs installing: Colab ships
torch, triton and matplotlib.

Colab opens notebooks from GitHub, so the links point at the ``notebooks``
branch that the publishing workflow pushes: ``<lecture>/<example>.ipynb`` for the English
edition, ``zh_CN/<lecture>/<example>.ipynb`` for the Chinese one, whose notebooks are its
own programs.
The repository comes from ``course_repo_url`` (``COURSE_REPO_URL`` in the
workflow); with none set, no link is drawn, so a local build shows no dead link.
"""

import html
import json
from pathlib import Path
from urllib.parse import urlsplit

from provenance import _after_title

GALLERY_ROOT = "auto_examples"
COLAB = "https://colab.research.google.com/github"
FIRST_CELL = {
    "en": "Runs as it is on Colab's free GPU runtime (a T4, compute capability 7.5):"
          " torch, triton and matplotlib come preinstalled, so nothing is installed here."
          " Without a GPU runtime the example runs at CPU sizes.",
    "zh_CN": "可以直接在 Colab 的免费 GPU 运行时（T4，计算能力 7.5）上运行：torch、triton 和"
             " matplotlib 都已预装，这里无须安装任何东西。没有 GPU 运行时，示例按 CPU 的规模运行。",
}
LINK_TEXT = {
    "en": {"one": "Open in Colab (free GPU)", "all": "Run these examples on a free GPU:"},
    "zh_CN": {"one": "在 Colab 中打开（免费 GPU）", "all": "在免费 GPU 上运行这些示例："},
}


def notebook_url(repo_url, branch, lecture, stem, language="en"):
    """Colab's URL for a notebook in a GitHub repository, or None without a repository."""
    if not repo_url:
        return None
    owner_repo = urlsplit(repo_url).path.strip("/").removesuffix(".git")
    edition = "" if language == "en" else f"{language}/"
    return f"{COLAB}/{owner_repo}/blob/{branch}/{edition}{lecture}/{stem}.ipynb"


def ask_for_a_gpu(notebook, language="en"):
    """Add Colab's GPU metadata and the first cell, once."""
    metadata = notebook.setdefault("metadata", {})
    if metadata.get("accelerator") == "GPU":
        return False
    metadata["accelerator"] = "GPU"
    metadata["colab"] = {"gpuType": "T4", "provenance": []}
    notebook["cells"].insert(0, {"cell_type": "markdown", "metadata": {}, "source": [FIRST_CELL.get(language, FIRST_CELL["en"])]})
    return True


def prepare_notebooks(app):
    for path in Path(app.srcdir, GALLERY_ROOT).glob("*/*.ipynb"):
        notebook = json.loads(path.read_text(encoding="utf-8"))
        if ask_for_a_gpu(notebook, app.config.language):
            path.write_text(json.dumps(notebook, indent=1, ensure_ascii=False) + "\n",
                            encoding="utf-8")


def _raw_html(markup):
    return f".. raw:: html\n\n   {markup}\n\n"


def insert_colab_links(app, docname, source):
    parts = docname.split("/")
    if len(parts) != 3 or parts[0] != GALLERY_ROOT:
        return
    repo, branch = app.config.course_repo_url, app.config.course_notebook_branch
    if not repo or app.builder.name == "gettext":
        return  # the catalogs hold the examples' own text, not what a build adds
    text = LINK_TEXT.get(app.config.language, LINK_TEXT["en"])
    lecture = parts[1]
    if parts[2] == "index":
        stems = sorted(p.stem for p in Path(app.srcdir, GALLERY_ROOT, lecture).glob("*.ipynb"))
        links = " · ".join(
            f'<a href="{html.escape(notebook_url(repo, branch, lecture, stem, app.config.language))}">{stem}</a>'
            for stem in stems
        )
        block = _raw_html(f'<p class="colab-links">{text["all"]} {links}</p>')
    else:
        url = notebook_url(repo, branch, lecture, parts[2], app.config.language)
        block = _raw_html(
            f'<p class="colab-link"><a href="{html.escape(url)}">{text["one"]}</a></p>'
        )
    source[0] = _after_title(source[0], block.rstrip() + "\n")


def setup(app):
    app.add_config_value("course_repo_url", "", "html")
    app.add_config_value("course_notebook_branch", "notebooks", "html")
    # After sphinx-gallery has written the notebooks (its handler has priority 500).
    app.connect("builder-inited", prepare_notebooks, priority=900)
    app.connect("source-read", insert_colab_links)
    return {"parallel_read_safe": True, "version": "1"}
