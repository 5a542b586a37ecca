"""How much English the Chinese example pages still print, page by page.

    python tools/english_words.py _build/html

For every example page built in both editions, it counts the English words (two
letters or more) in the printed output: all of them in the English page; in the
Chinese page, all of them, and those of its prose, which should be none. A word of
the Chinese output is not prose when it is a name the example's program uses
(an identifier, an attribute, an API string such as a dtype or a mode), a unit or
a device, or when its line holds no Chinese: what a library prints (a profiler's
table, generated code, a compiler's message) no translation of ours can change. tests/test_site.py bounds the prose per page.
A message left untranslated prints a line with no Chinese and so goes unseen here:
tests/test_program_i18n.py fails on it (every program message needs a translation),
and a string the extraction misses (one it takes for data) shows only as prose on a
line that also prints something translated.
"""

import argparse
import ast
import re
import sys
from pathlib import Path

from bs4 import BeautifulSoup

WORD = re.compile(r"[A-Za-z][A-Za-z'’-]*[A-Za-z]")
UNITS = {"us", "ms", "ns", "GB", "MB", "KB", "KiB", "MiB", "GiB", "TB", "FLOP", "FLOPs", "GFLOP",
         "TFLOP", "TFLOPS", "PFLOP", "TF", "elem"}
DEVICES = {"CPU", "CPUs", "GPU", "GPUs", "CUDA", "NVIDIA", "AMD", "EPYC", "Intel", "Xeon", "SXM", "HBM",
           "NVLink", "InfiniBand", "SM", "SMs", "DRAM", "SRAM", "PCIe", "NIC"}


def output_text(page):
    html = BeautifulSoup(page.read_text(encoding="utf-8"), "html.parser")
    return "\n".join(block.get_text() for block in html.select("div.sphx-glr-script-out"))


def english_words(text):
    return WORD.findall(text)


def program_names(example):
    """The names a program uses, and their parts: identifiers, attributes, keywords, imports,
    and string constants that are names (``"float32"``, ``"max-autotune"``)."""
    names = set()
    for node in ast.walk(ast.parse(example.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Name):
            names.add(node.id)
        elif isinstance(node, ast.Attribute):
            names.add(node.attr)
        elif isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, ast.keyword) and node.arg:
            names.add(node.arg)
        elif isinstance(node, ast.alias):
            names.update(node.name.split("."))
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and re.fullmatch(r"[\w.\-/]+", node.value):
            names.add(node.value)
    return names | {part for name in names for part in re.split(r"[_.\-/]", name)}


HAN = re.compile(r"[\u4e00-\u9fff]")
# A run of letters and digits: one with a digit in it is a name (float64, LN1, fc2, sm_90),
# not a word of prose, wherever the program took it from.
TOKEN = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_'’-]*")


def prose_words(english_page, chinese_page, example):
    """The English words of the Chinese page's output that are neither names nor a library's:
    those on the lines that hold Chinese (the lines the program's translated strings wrote;
    a line with none is a library's, or a table's numbers, and may differ from the English
    page's where the two editions ran on different instructions, as generated code does)."""
    kept = program_names(example) | UNITS | DEVICES
    return [word for line in output_text(chinese_page).splitlines() if HAN.search(line)
            for token in TOKEN.findall(line) if not any(c.isdigit() for c in token)
            for word in english_words(token) if word not in kept and word.lower() not in kept]


def pages(html_root, examples_root=Path("examples")):
    """(lecture/stem, English page, Chinese page, example) for every page built in both editions."""
    for page in sorted((html_root / "en" / "auto_examples").glob("lecture*/[0-9][0-9]_*.html")):
        twin = html_root / "zh_CN" / page.relative_to(html_root / "en")
        example = examples_root / page.parent.name / (page.stem + ".py")
        if twin.is_file() and example.is_file():
            yield f"{page.parent.name}/{page.stem}", page, twin, example


def table(html_root, examples_root=Path("examples")):
    """(page, English words in en, English words in zh_CN, prose words in zh_CN) per page."""
    return [(name, len(english_words(output_text(en))), len(english_words(output_text(zh))),
             len(prose_words(en, zh, example)))
            for name, en, zh, example in pages(html_root, examples_root)]


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("html", type=Path, help="the built site (make html writes _build/html)")
    parser.add_argument("--examples", type=Path, default=Path(__file__).resolve().parents[1] / "examples")
    args = parser.parse_args()
    rows = table(args.html, args.examples)
    print("| page | English words printed, en | zh_CN | of which prose | prose / en |")
    print("| --- | ---: | ---: | ---: | ---: |")
    for name, en, zh, prose in rows:
        print(f"| {name} | {en} | {zh} | {prose} | {prose / en if en else 0:.1%} |")
    en, zh, prose = (sum(r[i] for r in rows) for i in (1, 2, 3))
    print(f"| all {len(rows)} pages | {en} | {zh} | {prose} | {prose / en if en else 0:.1%} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
