"""The messages of the examples' programs in their catalogs, and the programs rebuilt from them.

    python tools/program_messages.py extract _build/gettext
        adds each example's program messages (context "program") to its page's .pot,
        which ``make translations`` then merges into locale/zh_CN (sphinx-intl update)
    python tools/program_messages.py render examples/lecture06_kernels_triton/06_torch_compile.py
        prints the Chinese program, from the example and its catalog in locale/zh_CN
    python tools/program_messages.py pending examples/.../06_torch_compile.py > todo.json
        the example's program messages that have no translation yet, as JSON
        ({msgid: ""}, with each message's kind and line in a "_notes" entry)
    python tools/program_messages.py apply examples/.../06_torch_compile.py done.json
        puts translations ({msgid: msgstr}) into the example's catalog, after checking that
        the program renders with them (fields kept, same syntax tree)
    python tools/program_messages.py write _build/tree-zh_CN
        the tree the Chinese edition is built from: examples/ holds every example's Chinese
        program (with the page's prose, its title and text blocks, translated from the page's
        own messages), source/ links to our pages (its auto_examples/ is the gallery's, made from
        those programs) and locale/ to our catalogs, so every path the configuration names
        relative to the source folder means the same there; a file is written only when its
        text changes, so sphinx-gallery re-executes only what changed
    python tools/program_messages.py check
        renders every example, and fails naming each message without a translation, each
        f-string whose translation changes its fields, and each program that would differ
        from the English one in anything but its strings and comments

The messages are those of sphinxext/program_i18n.py; docs/translating.md says how to
translate them.
"""

import argparse
import json
import os
import sys
from pathlib import Path

try:
    from babel.messages.pofile import read_po, write_po
except ImportError:  # a Python without Sphinx's dependencies (the GPU machine's own)
    raise SystemExit("tools/program_messages.py reads the catalogs with babel, which this Python lacks:"
                     " use the virtual environment (make venv), or pip install babel") from None

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "sphinxext"))
import program_i18n

CATALOGS = REPO / "locale" / "zh_CN" / "LC_MESSAGES"
NOTES = {
    "comment": "program comment: one line or more, re-wrapped to 88 columns",
    "docstring": "program docstring: keep its line structure (a blank line between paragraphs)",
    "string": "program string: printed or drawn",
    "f-string": "program f-string: keep every replacement field {...} exactly, format included",
}


def examples():
    return sorted(p for p in (REPO / "examples").glob("lecture*/[0-9]*.py"))


def catalog_path(example, root=CATALOGS, suffix=".po"):
    return root / "auto_examples" / example.parent.name / (example.stem + suffix)


def extract(gettext_dir):
    """Add every example's program messages to its page's template."""
    for example in examples():
        pot = catalog_path(example, Path(gettext_dir), ".pot")
        if not pot.exists():
            raise SystemExit(f"{pot}: no template for {example.name}; run Sphinx's gettext builder first")
        with pot.open("rb") as f:
            template = read_po(f)
        for message in program_i18n.messages(example.read_text(encoding="utf-8")):  # no line numbers:
            template.add(message.msgid, auto_comments=[NOTES[message.kind]],  # they move with every edit
                         context=program_i18n.CONTEXT)
        with pot.open("wb") as f:
            write_po(f, template, width=0, omit_header=False)


def translations(example, root=CATALOGS):
    """msgid -> msgstr of the example's program messages in its catalog (fuzzy ones count as missing)."""
    path = catalog_path(example, root)
    if not path.exists():
        return {}
    with path.open("rb") as f:
        catalog = read_po(f)
    return {m.id: m.string for m in catalog
            if m.id and m.context == program_i18n.CONTEXT and not m.fuzzy}


def page_translations(example, root=CATALOGS):
    """msgid -> msgstr of the page's own messages (its prose: title, text blocks), fuzzy ones left out."""
    path = catalog_path(example, root)
    if not path.exists():
        return {}
    with path.open("rb") as f:
        return {m.id: m.string for m in read_po(f) if m.id and m.context is None and m.string and not m.fuzzy}


def pending(example, root=CATALOGS):
    done = {k for k, v in translations(example, root).items() if v}
    todo = [m for m in program_i18n.messages(example.read_text(encoding="utf-8")) if m.msgid not in done]
    return {"_notes": {m.msgid: f"{m.kind}, line {m.line}" for m in todo}, **{m.msgid: "" for m in todo}}


def apply(example, new, root=CATALOGS):
    """Write ``new`` (msgid -> msgstr) into the example's catalog, once the program renders with it."""
    source = example.read_text(encoding="utf-8")
    current = {m.msgid: m for m in program_i18n.messages(source)}
    new = {k: v for k, v in new.items() if k != "_notes"}
    unknown = sorted(set(new) - set(current))
    if unknown:
        raise SystemExit("not messages of " + example.name + ":\n  " + "\n  ".join(map(repr, unknown[:20])))
    merged = {**translations(example, root), **{k: v for k, v in new.items() if v}}
    merged = {k: v for k, v in merged.items() if k in current}
    program_i18n.translate(source, merged, strict=False)  # raises on a bad one
    path = catalog_path(example, root)
    with path.open("rb") as f:
        catalog = read_po(f)
    for message in list(catalog):  # a message the program no longer has goes, as make translations would
        if message.context == program_i18n.CONTEXT and message.id not in current:
            catalog.delete(message.id, context=program_i18n.CONTEXT)
    for msgid, msgstr in merged.items():
        if entry := catalog.get(msgid, context=program_i18n.CONTEXT):
            entry.string = msgstr
        else:
            catalog.add(msgid, msgstr, auto_comments=[NOTES[current[msgid].kind]], context=program_i18n.CONTEXT)
    with path.open("wb") as f:
        write_po(f, catalog, width=0)
    return len(merged)


def render(example, root=CATALOGS, strict=True):
    return program_i18n.translate(example.read_text(encoding="utf-8"), translations(example, root),
                                  strict=strict)


def write_tree(tree, root=CATALOGS):
    """Make or bring up to date the Chinese edition's tree (see ``write`` above)."""
    tree = Path(tree).resolve()
    wanted = {}
    for example in examples():
        lecture = example.parent.name
        # The page's prose goes in too, one line a paragraph (a line break between two
        # Chinese characters would show as a space on the page): the Chinese page, notebook
        # and download then carry it as the program does, and Sphinx finds nothing to translate.
        program = render(example, root, strict=False)
        wanted[Path("examples", lecture, example.name)] = program_i18n.translate_text_blocks(
            program, page_translations(example, root), width=None)
    for header in (REPO / "examples").glob("lecture*/GALLERY_HEADER.rst"):
        wanted[header.relative_to(REPO)] = header.read_text(encoding="utf-8")
    written = 0
    for relative, text in wanted.items():
        path = tree / relative
        if not path.is_file() or path.read_text(encoding="utf-8") != text:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text, encoding="utf-8")
            written += 1
    for path in (tree / "examples").rglob("*"):  # an example that was removed goes with its program
        if path.is_file() and path.relative_to(tree) not in wanted:
            path.unlink()
    links = {Path("locale"): REPO / "locale"}
    links |= {Path("source", p.name): p for p in (REPO / "source").iterdir()
              if p.name not in {"auto_examples", "sg_execution_times.rst"}}
    (tree / "source").mkdir(parents=True, exist_ok=True)
    for entry in (tree / "source").iterdir():
        if entry.is_symlink() and Path("source", entry.name) not in links:
            entry.unlink()
    for relative, target in links.items():  # relative links: a copy of the checkout keeps them
        link = tree / relative
        pointing = Path(os.path.relpath(target, link.parent))
        if not (link.is_symlink() and Path(os.readlink(link)) == pointing):
            if link.is_symlink() or link.is_file():
                link.unlink()
            link.symlink_to(pointing)
    return written


def check(root=CATALOGS):
    problems = []
    for example in examples():
        try:
            render(example, root)
        except program_i18n.ProgramTranslationError as error:
            problems.append(f"{example.relative_to(REPO)}: {error}")
    return problems


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    commands.add_parser("extract").add_argument("gettext_dir")
    commands.add_parser("render").add_argument("example", type=Path)
    commands.add_parser("pending").add_argument("example", type=Path)
    applying = commands.add_parser("apply")
    applying.add_argument("example", type=Path)
    applying.add_argument("translations", type=Path)
    commands.add_parser("write").add_argument("tree", type=Path)
    commands.add_parser("check")
    args = parser.parse_args()
    if args.command == "extract":
        extract(args.gettext_dir)
    elif args.command == "pending":
        json.dump(pending(args.example.resolve()), sys.stdout, ensure_ascii=False, indent=1)
    elif args.command == "apply":
        count = apply(args.example.resolve(), json.loads(args.translations.read_text(encoding="utf-8")))
        print(f"{args.example.name}: {count} program messages translated in its catalog")
    elif args.command == "write":
        written = write_tree(args.tree)
        print(f"The Chinese programs are in {args.tree / 'examples'} ({written} written anew)")
    elif args.command == "render":
        sys.stdout.write(render(args.example.resolve(), strict=False))
    else:
        problems = check()
        print("\n".join(problems) or f"{len(examples())} programs render in Chinese")
        sys.exit(1 if problems else 0)


if __name__ == "__main__":
    main()
