"""A CPU build reuses outputs kept in the gallery cache and keeps their provenance."""

import json
import shutil
import subprocess
import sys

from bs4 import BeautifulSoup
from conftest import SITE_ENV

from tools.site_build import EXAMPLES, copy_checkout, make

CACHED_DEVICE = "NVIDIA H200 (stand-in for a GPU build)"


def provenance_text(checkout, example):
    page = checkout / "_build/html/en/auto_examples" / example.parent.name / f"{example.stem}.html"
    note = BeautifulSoup(page.read_text(), "html.parser").select_one("div.provenance")
    return note.get_text(" ", strip=True)


def test_rebuild_from_cache_executes_nothing_and_keeps_provenance(site, tmp_path):
    built, _ = site
    cache = tmp_path / "gallery-cache"
    subprocess.run([sys.executable, "tools/gallery_cache.py", "save", "--cache", str(cache)],
                   cwd=built, check=True)
    # Stand in for a cache made on the GPU machine: say so in every provenance record.
    for record_file in cache.glob("*/*/provenance/*.json"):
        record = json.loads(record_file.read_text())
        record["device"] = CACHED_DEVICE
        record_file.write_text(json.dumps(record))

    checkout = copy_checkout(tmp_path / "site")
    shutil.copytree(cache, checkout / "gallery-cache")
    rebuilt = make(checkout, "html", env=SITE_ENV)
    assert rebuilt.returncode == 0, rebuilt.log[-3000:]
    assert rebuilt.examples_executed == 0
    assert rebuilt.log.count("from the gallery cache") == len(EXAMPLES)
    for example in EXAMPLES:
        assert CACHED_DEVICE in provenance_text(checkout, example)

    edited = checkout / EXAMPLES[0].relative_to(EXAMPLES[0].parents[2])
    edited.write_text(edited.read_text() + "\n# edited after the cache was made\n")
    changed = make(checkout, "html", env=SITE_ENV)
    assert changed.returncode == 0, changed.log[-3000:]
    assert changed.examples_executed == 1
    assert CACHED_DEVICE not in provenance_text(checkout, EXAMPLES[0])
    assert CACHED_DEVICE in provenance_text(checkout, EXAMPLES[1])
