"""Build the site in a throwaway copy of the checkout, as the tests and benchmarks need.

``make html`` is what runs, with this virtual environment, so the tests check
the command a reader types.
"""

import os
import re
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "sphinxext"))

from provenance import git_commit

EXAMPLES = sorted(REPO.glob("examples/lecture*/[0-9][0-9]_*.py"))


@dataclass
class BuildResult:
    returncode: int
    log: str
    seconds: float

    @property
    def examples_executed(self):
        """How many examples sphinx-gallery executed in this build, over all editions."""
        return sum(self.examples_executed_per_edition.values())

    @property
    def examples_executed_per_edition(self):
        """Examples executed while each edition was built (``make html`` marks them "== en edition")."""
        parts = re.split(r"^== (\S+) edition$", self.log, flags=re.MULTILINE)
        sections = dict(zip(parts[1::2], parts[2::2])) or {"all": self.log}
        return {edition: _executed_in(text) for edition, text in sections.items()}


def _executed_in(log):
    counts = re.findall(r"successfully executed (\d+) out of", log)
    failed = re.findall(r"Unexpected failing examples \((\d+)\)", log)
    return sum(map(int, counts)) + sum(map(int, failed))


def copy_checkout(destination):
    """Copy the files git knows about (tracked or not ignored) into ``destination``."""
    listed = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard", "-z"],
        cwd=REPO, capture_output=True, check=True, text=True,
    ).stdout.split("\0")
    for name in filter(None, listed):
        source = REPO / name
        if source.is_file():
            target = Path(destination, name)
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, target)
    return Path(destination)


def make(checkout, target="html", env=None, **variables):
    """Run ``make target`` in ``checkout`` with this interpreter's virtual environment.

    ``env`` adds environment variables; ``variables`` are passed to make.
    """
    args = [f"VENV={sys.prefix}", *(f"{k}={v}" for k, v in variables.items())]
    env = {"COURSE_GIT_COMMIT": git_commit(REPO), **(env or {})}
    start = time.perf_counter()
    done = subprocess.run(
        ["make", "-C", str(checkout), target, *args],
        capture_output=True, text=True, env={**os.environ, **env}, check=False,
    )
    return BuildResult(done.returncode, done.stdout + done.stderr, time.perf_counter() - start)
