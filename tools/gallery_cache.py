"""Keep executed gallery outputs, keyed by each example's content hash, and bring them back.

A build on the GPU machine executes every example; ``save`` copies each
example's outputs (its page, figures, downloads, provenance record and
artefacts) into ``gallery-cache/<lecture>/<stem>/``, with the SHA-256 of the
source they came from. Before a later build, on any machine, ``restore`` puts
back every entry whose hash still matches its example, so sphinx-gallery finds
those outputs current and executes only the examples that changed. Each page
keeps the provenance note of the machine that really executed it.

    python tools/gallery_cache.py save      # after a build: keep its outputs
    python tools/gallery_cache.py restore   # before a build: reuse what still matches
    python tools/gallery_cache.py status    # which entries match the sources
    python tools/gallery_cache.py import OUT...   # merge the GPU build's tarballs (tools/gpu_build.sh)

Each edition executes its own programs, so each has its own entries: the English
edition's in ``gallery-cache/<lecture>/<stem>/``, the Chinese edition's (its
programs and pages are in the tree that ``make html`` writes, ``--tree
_build/tree-zh_CN``) in ``gallery-cache/zh_CN/<lecture>/<stem>/``, keyed by the
Chinese program's hash. Without ``--tree`` only the English entries are handled.

An entry that matches its example wins over outputs a local build left for the
same source: the cache holds what the site should show (the GPU's outputs).
"""

import argparse
import hashlib
import json
import shutil
import sys
import tarfile
import tempfile
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "sphinxext"))

from provenance import is_strict

GENERATED = REPO / "source" / "auto_examples"
DEFAULT_CACHE = REPO / "gallery-cache"
EXAMPLES = sorted(REPO.glob("examples/lecture*/[0-9][0-9]_*.py"))


@dataclass(frozen=True)
class Edition:
    name: str
    examples: list  # the programs this edition executes
    generated: Path  # its gallery's folder, source/auto_examples in its tree
    folder: str  # its entries' folder in the cache ("" for English)

    def cache(self, cache):
        return cache / self.folder if self.folder else cache

    def label(self, example):
        return example.name if not self.folder else f"{example.name} ({self.name})"


ENGLISH = Edition("en", EXAMPLES, GENERATED, "")


def editions(tree=None):
    """English, and the Chinese edition when its tree is given."""
    if tree is None:
        return [ENGLISH]
    chinese = sorted(tree.resolve().glob("examples/lecture*/[0-9][0-9]_*.py"))
    return [ENGLISH, Edition("zh_CN", chinese, tree.resolve() / "source" / "auto_examples", "zh_CN")]


def source_hash(example):
    return hashlib.sha256(example.read_bytes()).hexdigest()


def generated_files(gallery, stem):
    """Everything sphinx-gallery and our runner wrote for one example, relative to its gallery."""
    patterns = [f"{stem}.*", f"images/sphx_glr_{stem}_*.png", f"images/thumb/sphx_glr_{stem}_thumb.*",
                f"provenance/{stem}.json", f"artifacts/{stem}/*"]
    found = (path for pattern in patterns for path in gallery.glob(pattern))
    return sorted(p.relative_to(gallery) for p in found if p.is_file())


def outputs_are_current(gallery, example):
    """True when the gallery holds outputs executed from this very source."""
    md5_file = gallery / f"{example.name}.md5"
    executed = (gallery / "provenance" / f"{example.stem}.json").is_file()
    if not (md5_file.is_file() and executed):
        return False
    text = example.read_text(encoding="utf-8")
    return md5_file.read_text().strip() == hashlib.md5(text.encode("utf-8")).hexdigest()


def save(cache, edition=ENGLISH):
    saved = 0
    for example in edition.examples:
        gallery = edition.generated / example.parent.name
        if not outputs_are_current(gallery, example):
            print(f"skip     {edition.label(example)}: no current executed outputs")
            continue
        record = json.loads((gallery / "provenance" / f"{example.stem}.json").read_text())
        if not is_strict(record):
            print(f"skip     {edition.label(example)}: executed by a lenient build (it required only"
                  f" {','.join(record.get('required', [])) or 'nothing'}); run a strict make html first")
            continue
        entry = edition.cache(cache) / example.parent.name / example.stem
        shutil.rmtree(entry, ignore_errors=True)
        for name in generated_files(gallery, example.stem):
            (entry / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(gallery / name, entry / name)
        (entry / "CACHE.json").write_text(json.dumps(
            {"source_sha256": source_hash(example), "device": record["device"]}, indent=2) + "\n")
        saved += 1
        print(f"saved    {edition.label(example)} ({record['device']})")
    return saved


def matching_entry(cache, example):
    entry = cache / example.parent.name / example.stem
    key = entry / "CACHE.json"
    if key.is_file() and json.loads(key.read_text())["source_sha256"] == source_hash(example):
        return entry
    return None


def already_restored(gallery, entry, example):
    """True when the gallery holds this very entry's outputs, not another run's."""
    record = Path("provenance", f"{example.stem}.json")
    local, cached = gallery / record, entry / record
    return (outputs_are_current(gallery, example) and local.is_file() and cached.is_file()
            and local.read_bytes() == cached.read_bytes())


def restore(cache, edition=ENGLISH):
    restored = 0
    for example in edition.examples:
        gallery = edition.generated / example.parent.name
        entry = matching_entry(edition.cache(cache), example)
        if entry is None or already_restored(gallery, entry, example):
            continue
        for name in generated_files(gallery, example.stem):  # another run's figures must not linger
            (gallery / name).unlink()
        for path in entry.rglob("*"):
            if path.is_file() and path.name != "CACHE.json":
                target = gallery / path.relative_to(entry)
                target.parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(path, target)
        restored += 1
        print(f"restored {edition.label(example)} from the gallery cache")
    return restored


def status(cache, edition=ENGLISH):
    EXAMPLES = edition.examples
    cache = edition.cache(cache)
    entries = sorted(cache.glob("lecture*/*/CACHE.json")) if cache.is_dir() else []
    if not entries:
        where = cache.relative_to(REPO) if cache.is_relative_to(REPO) else cache
        why = "holds no entries" if cache.is_dir() else "does not exist"
        whose = "" if not edition.folder else f" for the {edition.name} edition"
        print(f"There is no gallery cache{whose}: {where}/ {why}. No example's outputs are kept, so"
              f" make html executes all {len(EXAMPLES)} examples on this machine. GPU outputs"
              " get there with tools/gpu_build.sh and make gpu-import"
              " (docs/building-on-a-gpu-machine.md).")
        return 0
    current = 0
    for example in EXAMPLES:
        name = f"{example.parent.name}/{example.name}"
        key = cache / example.parent.name / example.stem / "CACHE.json"
        if not key.is_file():
            print(f"missing  {name}: no entry; make html executes it here")
        elif matching_entry(cache, example) is None:
            print(f"stale    {name}: the example changed since its entry was made; make html executes it here")
        else:
            current += 1
            device = json.loads(key.read_text())["device"]
            print(f"current  {name}  ({device})")
    print(f"{current} of {len(EXAMPLES)} examples have a current entry in {cache}")
    return current


def import_outputs(cache, outs, edition=ENGLISH):
    """Merge the gallery-cache tarballs of one or more GPU builds (or shards of one) into ``cache``."""
    imported = 0
    EXAMPLES, cache = edition.examples, edition.cache(cache)
    pattern = "/".join(filter(None, ["gallery-cache", edition.folder, "lecture*/*/CACHE.json"]))
    for out in outs:
        tarball = out / "gallery-cache.tar.gz" if out.is_dir() else out
        if not tarball.is_file():
            raise SystemExit(f"{tarball} does not exist: give the folders tools/gpu_build.sh wrote")
        with tempfile.TemporaryDirectory() as tmp, tarfile.open(tarball) as archive:
            archive.extractall(tmp, filter="data")
            for key in sorted(Path(tmp).glob(pattern)):
                lecture, stem = key.parent.parent.name, key.parent.name
                example = next((e for e in EXAMPLES if e.parent.name == lecture and e.stem == stem), None)
                made_from = json.loads(key.read_text())["source_sha256"]
                if example is None or made_from != source_hash(example):
                    print(f"skipped  {lecture}/{stem}{edition.folder and ' (' + edition.name + ')'}:"
                          f" {tarball} was made from another version of it")
                    continue
                entry = cache / lecture / stem
                shutil.rmtree(entry, ignore_errors=True)
                shutil.copytree(key.parent, entry)
                imported += 1
                print(f"imported {lecture}/{stem}{edition.folder and ' (' + edition.name + ')'}"
                      f" ({json.loads(key.read_text())['device']})")
    return imported


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("command", choices=["save", "restore", "status", "import"])
    parser.add_argument("outs", nargs="*", type=Path,
                        help="import: folders that tools/gpu_build.sh wrote, or their gallery-cache.tar.gz")
    parser.add_argument("--cache", type=Path, default=DEFAULT_CACHE)
    parser.add_argument("--require-all", action="store_true",
                        help="status: fail unless every example has a current entry (the publishing workflow)")
    parser.add_argument("--tree", type=Path,
                        help="the Chinese edition's tree (make html writes _build/tree-zh_CN): its entries too")
    args = parser.parse_args()
    if args.command == "import" and not args.outs:
        parser.error("import needs the folders tools/gpu_build.sh wrote")
    if args.tree and not (args.tree / "examples").is_dir():
        parser.error(f"{args.tree} holds no Chinese programs: make html writes them (or"
                     f" python tools/program_messages.py write {args.tree})")
    complete = True
    for edition in editions(args.tree):
        whose = "" if not edition.folder else f" of the {edition.name} edition"
        if args.command == "import":
            print(f"{import_outputs(args.cache, args.outs, edition)} entries{whose} imported into {args.cache}")
        elif args.command == "save":
            print(f"{save(args.cache, edition)} of {len(edition.examples)} examples{whose} saved to {args.cache}")
        elif args.command == "restore":
            if args.cache.is_dir():
                print(f"{restore(args.cache, edition)} examples{whose} restored from {args.cache}")
        else:
            complete &= status(args.cache, edition) == len(edition.examples)
    return 1 if args.require_all and not complete else 0


if __name__ == "__main__":
    sys.exit(main())
