"""Run one example as a reader runs a download, and log how much of its tolerances it uses.

    python tools/run_as_reader.py path/to/NN_topic.py [--log margins.jsonl] [--without-triton]

The script runs as ``python NN_topic.py`` would run it: as ``__main__``, with its own
folder first on ``sys.path`` and as the working directory. This wrapper adds
nothing a reader lacks: it imports only ``torch`` (which imports no Triton) and
sets no variable, so an example that forgets to set ``TRITON_INTERPRET`` before
Triton is imported fails here as it fails for a reader. It wraps
``torch.testing.assert_close`` to log each check's margin use
(``sphinxext/check_margins.py``) and prints the table at the end, unless
``--log`` names the file to append it to.
``--without-triton`` makes ``import triton`` fail, as on macOS.
The exit status is the example's: 0 when it ran to the end.
"""

import argparse
import importlib.abc
import os
import runpy
import sys
import tempfile
import traceback
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "sphinxext"))
import check_margins

sys.path.pop(0)


class _NoTriton(importlib.abc.MetaPathFinder):
    """Finds ``triton`` and refuses it, as an interpreter without the package would."""

    def find_spec(self, name, path=None, target=None):
        if name == "triton" or name.startswith("triton."):
            raise ModuleNotFoundError(f"No module named '{name}'", name=name)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("example", type=Path)
    parser.add_argument("--log", type=Path, help="append the margin log here (default: a temporary file)")
    parser.add_argument("--without-triton", action="store_true", help="make `import triton` fail")
    args = parser.parse_args()
    example = args.example.resolve()
    log = args.log or Path(tempfile.mkstemp(suffix=".jsonl")[1])
    check_margins.install(log)
    if args.without_triton:
        sys.meta_path.insert(0, _NoTriton())
    sys.argv = [str(example)]
    sys.path[0] = str(example.parent)
    os.chdir(example.parent)
    status = 0
    try:
        runpy.run_path(str(example), run_name="__main__")
    except SystemExit as stop:
        status = stop.code if isinstance(stop.code, int) else (0 if stop.code is None else 1)
    except BaseException:  # noqa: BLE001 - the example's failure is the result
        traceback.print_exc()
        status = 1
    if args.log is None:  # else whoever asked for the log reads it
        sys.stdout.flush()
        checks = check_margins.table(check_margins.read(log))
        print(f"\n{len(checks)} checks through assert_close; margin use (error / allowed error):",
              file=sys.stderr)
        print(check_margins.markdown(checks), file=sys.stderr)
    return status


if __name__ == "__main__":
    sys.exit(main())
