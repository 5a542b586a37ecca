"""Build the Chinese edition in a scratch copy and report warnings and untranslated messages.

    .venv/bin/python tools/check_translation.py

The copy takes the examples' outputs from source/auto_examples as they are and
executes nothing, so it is quick and safe to run while other work goes on.
"""

import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from tools.catalog_stats import main as print_catalog_stats
from tools.site_build import copy_checkout


def main():
    with tempfile.TemporaryDirectory() as tmp:
        checkout = copy_checkout(Path(tmp, "site"))
        generated = REPO / "source" / "auto_examples"
        if generated.is_dir():
            shutil.copytree(generated, checkout / "source" / "auto_examples", dirs_exist_ok=True)
        done = subprocess.run(
            [str(Path(sys.prefix, "bin", "sphinx-build")), "-c", ".", "-W", "--keep-going",
             "-b", "html", "-D", "language=zh_CN", "-D", "plot_gallery=0", "-q",
             "-d", "_build/doctrees", "source", "_build/html"],
            cwd=checkout, capture_output=True, text=True, check=False,
        )
        warnings = [line for line in done.stderr.splitlines() if "WARNING" in line or "ERROR" in line]
        print("\n".join(warnings) or "zh_CN edition: no warnings")
    return max(print_catalog_stats(), 1 if warnings else 0)


if __name__ == "__main__":
    sys.exit(main())
