#!/usr/bin/env bash
# The GPU build in one call, on a machine that has torch, triton, numpy and
# matplotlib but no Sphinx and no network (docs/building-on-a-gpu-machine.md):
#
#   tools/gpu_build.sh OUT                           # every example
#   LECTURES=lecture05_gpus tools/gpu_build.sh OUT   # one shard: that lecture's examples
#
# It installs the wheels that `make gpu-wheels` downloaded into a temporary
# folder (the machine's own torch and triton stay in use), builds both editions
# in a temporary copy of this checkout with no earlier outputs and cold Inductor,
# Triton and extension caches, executing each chosen example once in English and
# once as its Chinese program (each edition shows its own program's outputs), and
# writes to OUT:
#   gallery-cache.tar.gz     the executed outputs, for `make gpu-import` on any machine
#   report.md, report.json   pass or fail, wall time, peak GPU memory, key figures against the targets
#   zh_CN/report.md, .json   the same for the Chinese programs' runs
#   build.log                everything the build printed
#
# Settings (environment): LECTURES (comma-separated), EXAMPLES (a regular
# expression over file names, as for make html), PYTHON (python3), WHEELS
# (.cache/gpu-wheels), COURSE_EXAMPLE_TIMEOUT (300 s per example).
set -euo pipefail

if [ $# -ne 1 ]; then
  echo "usage: [LECTURES=a,b] [EXAMPLES=regex] $0 OUT" >&2
  exit 2
fi
REPO=$(cd "$(dirname "$0")/.." && pwd)
mkdir -p "$1"
OUT=$(cd "$1" && pwd)
rm -f "$OUT/report.md" "$OUT/report.json" "$OUT/gallery-cache.tar.gz"  # no results of an earlier call
PYTHON=${PYTHON:-python3}
WHEELS=${WHEELS:-$REPO/.cache/gpu-wheels}

build() {
  local tmp=$1 started=$SECONDS
  [ -z "${LECTURES:-}" ] || export COURSE_LECTURES=$LECTURES
  [ -z "${EXAMPLES:-}" ] || export COURSE_EXAMPLES=$EXAMPLES
  echo "== Examples to execute (LECTURES=${LECTURES:-all}, EXAMPLES=${EXAMPLES:-all}):"
  "$PYTHON" "$REPO/tools/gpu_check.py" --list

  echo "== Installing the build tools from $WHEELS"
  if [ ! -f "$WHEELS/requirements.txt" ]; then
    echo "No wheels in $WHEELS: run 'make gpu-wheels' on a machine with a network and bring the folder along."
    return 1
  fi
  WHEELS=$(cd "$WHEELS" && pwd)
  local wanted here
  wanted=$(cat "$WHEELS/python-version" 2>/dev/null || true)
  here=$("$PYTHON" -c 'import sys; print("%d.%d" % sys.version_info[:2])')
  if [ -n "$wanted" ] && [ "$wanted" != "$here" ]; then
    echo "The wheels in $WHEELS are for Python $wanted, and $PYTHON is Python $here: pip would stop at"
    echo "'No matching distribution'. Run 'make gpu-wheels GPU_PYTHON_VERSION=$here' and bring that folder."
    return 1
  fi
  PIP_ROOT_USER_ACTION=ignore "$PYTHON" -m pip install --quiet --disable-pip-version-check --no-index \
    --find-links "$WHEELS" --target "$tmp/site" -r "$WHEELS/requirements.txt"
  export PYTHONPATH="$tmp/site${PYTHONPATH:+:$PYTHONPATH}"

  # The pages name the commit; the copy below has no .git to ask.
  if [ -z "${COURSE_GIT_COMMIT:-}" ] && COURSE_GIT_COMMIT=$(git -C "$REPO" rev-parse --short HEAD 2>/dev/null); then
    [ -z "$(git -C "$REPO" status --porcelain -- examples)" ] || COURSE_GIT_COMMIT+="+modified"
  fi
  export COURSE_GIT_COMMIT=${COURSE_GIT_COMMIT:-unknown (not a git checkout)}
  # A copy without earlier outputs: no md5 or provenance of another build can count.
  mkdir "$tmp/work"
  tar -C "$REPO" --exclude=.git --exclude=.venv --exclude=.cache --exclude=_build \
    --exclude=gallery-cache --exclude=source/auto_examples --exclude=source/sg_execution_times.rst \
    --exclude=__pycache__ -cf - . | tar -C "$tmp/work" -xf -

  # Cold caches, so that first-call and build times are what a new reader sees.
  export TORCHINDUCTOR_CACHE_DIR=$tmp/cache/inductor TRITON_CACHE_DIR=$tmp/cache/triton \
    TORCH_EXTENSIONS_DIR=$tmp/cache/torch_extensions MPLBACKEND=Agg \
    COURSE_EXAMPLE_TIMEOUT=${COURSE_EXAMPLE_TIMEOUT:-300}

  # Sphinx's dummy builder: the gallery executes the examples as it does for HTML, and
  # the pages, which nobody would keep, are not written (a shard of one example: 21 s of
  # CPU against 87 s for -b html). make html writes them from the imported outputs.
  local status=0 t0=$SECONDS
  echo "== Building the English edition at commit $COURSE_GIT_COMMIT (executing, writing no pages)"
  (cd "$tmp/work" && "$PYTHON" -m sphinx -c . -W --keep-going -b dummy -D language=en \
    -d "$tmp/doctrees/en" source "$tmp/html/en") || status=$?
  local english=$((SECONDS - t0))
  echo "== Building the Chinese edition from its programs (executing, writing no pages)"
  # Cold caches again: its pages' first-call and compile times are a new reader's too.
  export TORCHINDUCTOR_CACHE_DIR=$tmp/cache-zh/inductor TRITON_CACHE_DIR=$tmp/cache-zh/triton \
    TORCH_EXTENSIONS_DIR=$tmp/cache-zh/torch_extensions
  (cd "$tmp/work" && "$PYTHON" tools/program_messages.py write _build/tree-zh_CN && \
    "$PYTHON" -m sphinx -c . -W --keep-going -b dummy -D language=zh_CN \
    -d "$tmp/doctrees/zh_CN" _build/tree-zh_CN/source "$tmp/html/zh_CN") || status=$?
  echo "== The English edition took $english s, the Chinese $((SECONDS - t0 - english)) s"
  local seconds=$((SECONDS - started))

  echo "== Report and gallery cache"
  (cd "$tmp/work" && "$PYTHON" tools/gpu_check.py --from-build source/auto_examples \
    --build-seconds "$seconds" --out "$OUT") || status=1
  # The Chinese programs' runs, passed or failed, in a report of their own.
  (cd "$tmp/work" && "$PYTHON" tools/gpu_check.py --from-build _build/tree-zh_CN/source/auto_examples \
    --out "$OUT/zh_CN") || status=1
  mkdir -p "$tmp/work/gallery-cache"
  "$PYTHON" "$tmp/work/tools/gallery_cache.py" save --cache "$tmp/work/gallery-cache" \
    --tree "$tmp/work/_build/tree-zh_CN"
  tar -C "$tmp/work" -czf "$OUT/gallery-cache.tar.gz" gallery-cache
  echo "== GPU build finished in $seconds s with status $status; results in $OUT"
  if [ "$seconds" -gt 480 ]; then
    echo "That is over the 8-minute budget of one GPU call: split the build with LECTURES=."
  fi
  return "$status"
}

TMP=$(mktemp -d "${TMPDIR:-/tmp}/gpu-build.XXXXXX")
trap 'rm -rf "$TMP"' EXIT
build "$TMP" 2>&1 | tee "$OUT/build.log"
exit "${PIPESTATUS[0]}"
