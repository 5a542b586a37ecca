"""One clean build of the whole site, shared by the tests that inspect it."""

import os
from pathlib import Path

import pytest
from browser import serve

from tools.site_build import copy_checkout, make

# Built for hosting under a path prefix, as the browser tests serve it, and
# published from a GitHub repository, so that pages link to Colab.
SITE_ENV = {
    "COURSE_BASE_URL": "http://localhost/course/",
    "COURSE_REPO_URL": "https://github.com/course-authors/gpu-programming-for-llms",
}


@pytest.fixture(scope="session")
def site(tmp_path_factory):
    """A fresh checkout copy, built from scratch with ``make html-fresh``.

    COURSE_TEST_CHECKOUT=<folder> reuses a copy built earlier, as it is:
    handy while working on the browser tests themselves.
    """
    if reuse := os.environ.get("COURSE_TEST_CHECKOUT"):
        return Path(reuse), None
    checkout = copy_checkout(tmp_path_factory.mktemp("site"))
    result = make(checkout, "html-fresh", env=SITE_ENV)
    if result.returncode != 0:
        pytest.fail(f"make html failed:\n{result.log[-6000:]}")
    return checkout, result


@pytest.fixture(scope="session")
def served(site):
    """Both editions on a loopback server, under a path prefix: (site root, base URL)."""
    checkout, _ = site
    root = checkout / "_build" / "html"
    server, base = serve(root)
    yield root, base
    server.shutdown()
