"""How long the site takes to build, and how many examples each build executes.

Builds a temporary copy of the checkout three times: from scratch, again with
nothing changed, and after editing one example.
"""

import tempfile

from tools.site_build import EXAMPLES, copy_checkout, make


def report(label, result):
    if result.returncode != 0:
        raise SystemExit(f"{label} failed:\n{result.log[-4000:]}")
    per_edition = ", ".join(f"{k}: {v}" for k, v in result.examples_executed_per_edition.items())
    print(f"{label:<36} {result.seconds:8.1f} s   examples executed: {result.examples_executed}"
          f" ({per_edition})")


def main():
    with tempfile.TemporaryDirectory() as tmp:
        checkout = copy_checkout(tmp)
        print(f"{len(EXAMPLES)} examples\n")
        report("clean build", make(checkout, "html-fresh"))
        report("no-op rebuild", make(checkout, "html"))
        edited = checkout / EXAMPLES[0].relative_to(EXAMPLES[0].parents[2])
        edited.write_text(edited.read_text() + "\n# edited by the benchmark\n")
        report(f"rebuild after editing {edited.stem}", make(checkout, "html"))


if __name__ == "__main__":
    main()
