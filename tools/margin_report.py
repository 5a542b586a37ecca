"""The margin table of a build: how much of its tolerance each numeric check used.

    python tools/margin_report.py --out _build/check-margins.md

Reads the provenance record of every example page (source/auto_examples/<lecture>/
provenance/<stem>.json), where the build's runner keeps the margin use of each
``assert_close`` the example called (sphinxext/check_margins.py), writes the whole
table, worst first, and prints its worst rows. A check above 0.5 keeps less than
the 2x headroom the course asks of every tolerance, and this says so.
"""

import argparse
import json
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "sphinxext"))

from check_margins import HEADROOM, markdown

GENERATED = REPO / "source" / "auto_examples"


def rows(generated=GENERATED):
    found = []
    for record_file in sorted(generated.glob("*/provenance/*.json")):
        record = json.loads(record_file.read_text(encoding="utf-8"))
        found += [{**row, "device": record.get("device", "?")} for row in record.get("margins", [])]
    return sorted(found, key=lambda row: -row["use"])


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--show", type=int, default=5, help="how many of the worst rows to print")
    parser.add_argument("--tree", type=Path, help="the Chinese edition's tree: its programs' checks too")
    args = parser.parse_args()
    table = rows()
    if args.tree and (args.tree / "source" / "auto_examples").is_dir():
        chinese = [{**row, "file": f"{row['file']} (zh_CN)"} for row in rows(args.tree / "source" / "auto_examples")]
        table = sorted(table + chinese, key=lambda row: -row["use"])  # its lines are its own program's
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text("# How much of its tolerance each check used\n\n"
                        "Each `assert_close` of the examples this build's pages show: its worst error over"
                        f" the error it allowed. Above {HEADROOM} a check keeps less than 2x headroom.\n\n"
                        + markdown(table), encoding="utf-8")
    over = [row for row in table if row["use"] > HEADROOM]
    print(f"{len(table)} numeric checks; the worst use {table[0]['use']:.2f} of their tolerance"
          if table else "No numeric check recorded its margin (no example page was executed here).")
    if table:
        print(markdown(table, limit=args.show), end="")
    if over:
        print(f"{len(over)} check(s) keep less than 2x headroom (above {HEADROOM}); see {args.out}")
    print(f"The whole table: {args.out}")


if __name__ == "__main__":
    main()
