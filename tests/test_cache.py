"""A CPU build reuses outputs kept in the gallery cache and keeps their provenance.

The cache's own bookkeeping (status, import of the GPU build's tarballs, restore)
is checked first, without a build.
"""

import hashlib
import json
import shutil
import subprocess
import sys
import tarfile

from bs4 import BeautifulSoup
from conftest import SITE_ENV

from tools.site_build import EXAMPLES, REPO, copy_checkout, make

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
    rebuilt = make(checkout, "html", env=SITE_ENV, EDITIONS="en")  # the English pages are checked
    assert rebuilt.returncode == 0, rebuilt.log[-3000:]
    assert rebuilt.examples_executed == 0
    assert rebuilt.log.count("from the gallery cache") == len(EXAMPLES)
    for example in EXAMPLES:
        assert CACHED_DEVICE in provenance_text(checkout, example)

    edited = checkout / EXAMPLES[0].relative_to(EXAMPLES[0].parents[2])
    edited.write_text(edited.read_text() + "\n# edited after the cache was made\n")
    changed = make(checkout, "html", env=SITE_ENV, EDITIONS="en")
    assert changed.returncode == 0, changed.log[-3000:]
    assert changed.examples_executed == 1
    assert CACHED_DEVICE not in provenance_text(checkout, EXAMPLES[0])
    assert CACHED_DEVICE in provenance_text(checkout, EXAMPLES[1])


def gallery_cache(*args, cwd=REPO):
    done = subprocess.run([sys.executable, "tools/gallery_cache.py", *map(str, args)], cwd=cwd,
                          capture_output=True, text=True, check=True)
    return done.stdout


def fake_entry(cache, example, device, source_sha256=None, images=("001",)):
    """A cache entry as ``save`` writes one, with made-up outputs."""
    entry = cache / example.parent.name / example.stem
    (entry / "provenance").mkdir(parents=True)
    (entry / "images").mkdir()
    (entry / example.name).write_bytes(example.read_bytes())
    md5 = hashlib.md5(example.read_text(encoding="utf-8").encode("utf-8")).hexdigest()
    (entry / f"{example.name}.md5").write_text(md5)
    (entry / f"{example.stem}.rst").write_text("outputs of " + device)
    for number in images:
        (entry / "images" / f"sphx_glr_{example.stem}_{number}.png").write_bytes(b"png")
    (entry / "provenance" / f"{example.stem}.json").write_text(json.dumps({"device": device}))
    sha = source_sha256 or hashlib.sha256(example.read_bytes()).hexdigest()
    (entry / "CACHE.json").write_text(json.dumps({"source_sha256": sha, "device": device}))
    return entry


def test_status_says_plainly_that_there_is_no_cache(tmp_path):
    said = gallery_cache("status", "--cache", tmp_path / "gallery-cache")
    assert said.startswith("There is no gallery cache")
    assert f"executes all {len(EXAMPLES)} examples on this machine" in said
    assert "stale" not in said and "missing" not in said


def test_status_tells_current_stale_and_missing_apart(tmp_path):
    cache = tmp_path / "gallery-cache"
    fake_entry(cache, EXAMPLES[0], "GPU")
    fake_entry(cache, EXAMPLES[1], "GPU", source_sha256="0" * 64)
    lines = gallery_cache("status", "--cache", cache).splitlines()
    names = [f"{e.parent.name}/{e.name}" for e in EXAMPLES]
    assert lines[0].startswith(f"current  {names[0]}")
    assert lines[1].startswith(f"stale    {names[1]}")
    assert lines[2].startswith(f"missing  {names[2]}")
    assert lines[-1].startswith(f"1 of {len(EXAMPLES)} examples have a current entry")


def test_import_merges_shards_and_refuses_entries_of_other_versions(tmp_path):
    outs = []
    for shard, entries in enumerate([[(EXAMPLES[0], None), (EXAMPLES[1], "0" * 64)], [(EXAMPLES[-1], None)]]):
        made = tmp_path / f"shard{shard}" / "gallery-cache"
        for example, sha in entries:
            fake_entry(made, example, f"GPU shard {shard}", source_sha256=sha)
        outs.append(made.parent / "out")
        outs[-1].mkdir()
        with tarfile.open(outs[-1] / "gallery-cache.tar.gz", "w:gz") as archive:
            archive.add(made, arcname="gallery-cache")
    cache = tmp_path / "gallery-cache"
    said = gallery_cache("import", *outs, "--cache", cache)
    kept = sorted(p.parent.relative_to(cache).as_posix() for p in cache.glob("*/*/CACHE.json"))
    assert kept == sorted(f"{e.parent.name}/{e.stem}" for e in (EXAMPLES[0], EXAMPLES[-1]))
    assert f"skipped  {EXAMPLES[1].parent.name}/{EXAMPLES[1].stem}" in said
    assert said.rstrip().endswith(f"2 entries imported into {cache}")


def test_restore_replaces_the_outputs_of_another_run(tmp_path):
    """A cache entry wins over a local run of the same source, and leaves none of its files behind."""
    checkout = copy_checkout(tmp_path / "site")
    example = EXAMPLES[0]
    gallery = checkout / "source" / "auto_examples" / example.parent.name
    local = fake_entry(tmp_path / "local", example, "a local CPU", images=("001", "002"))
    shutil.copytree(local, gallery, ignore=shutil.ignore_patterns("CACHE.json"))
    fake_entry(checkout / "gallery-cache", example, "NVIDIA H200")

    assert f"restored {example.name}" in gallery_cache("restore", cwd=checkout)
    assert json.loads((gallery / "provenance" / f"{example.stem}.json").read_text())["device"] == "NVIDIA H200"
    assert not (gallery / "images" / f"sphx_glr_{example.stem}_002.png").exists()
    assert f"restored {example.name}" not in gallery_cache("restore", cwd=checkout)

