# Two commands on a fresh machine: `make demo` and `make test`.
VENV ?= .venv
# three pytest-xdist workers, a file per worker at a time (module fixtures stay shared);
# `make test PYTEST_ARGS=` runs serially; `make test MARK="not slow"` narrows both phases by marker
PYTEST_ARGS ?= -n 3 --dist loadfile
PY := $(VENV)/bin/python
PIP := $(VENV)/bin/pip

.PHONY: setup demo test bench lint dev clean

setup: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml example_project/pyproject.toml
	python3 -m venv $(VENV)
	$(PIP) install -q --upgrade pip
	$(PIP) install -q -e '.[all,dev]'
	# the example dg project, so `cd example_project && dg list defs` / `dg dev` import it (editable)
	$(PIP) install -q --no-deps -e example_project
	# the browser test drives Debian chromium through playwright (never `playwright install`)
	command -v chromium >/dev/null || { apt-get update -q && apt-get install -y -q chromium; } || \
		echo "setup: chromium not installed (apt-get failed); tests/dagster/test_browser.py needs /usr/bin/chromium"
	# the OS sandbox of untrusted code (noetl_dagster/tools/sandbox.py): bubblewrap and libseccomp2 (its syscall
	# filter); setpriv and prlimit are util-linux
	{ command -v bwrap >/dev/null && ldconfig -p | grep -q libseccomp.so.2; } || \
		{ apt-get update -q && apt-get install -y -q bubblewrap libseccomp2; } || \
		echo "setup: bubblewrap/libseccomp2 not installed (apt-get failed); generated playbooks' code is refused (sandbox_unavailable)"
	# Azurite (Azure Blob emulator) from the npm registry into .tools/azurite, for the payload compliance suite
	command -v npm >/dev/null || { apt-get update -q && apt-get install -y -q npm; } || \
		echo "setup: npm not installed (apt-get failed); tests/storage/test_payload_compliance.py needs it for Azurite"
	test -x .tools/azurite/node_modules/.bin/azurite-blob || \
		npm install --no-audit --no-fund --silent --prefix .tools/azurite azurite@3.37.0 || \
		echo "setup: azurite not installed (npm failed); tests/storage/test_payload_compliance.py installs it on first use"
	touch $@

demo: setup
	$(VENV)/bin/noetl-dagster demo

test: setup
	$(PY) -m pytest $(PYTEST_ARGS) --durations=20 -m "not serial$(if $(MARK), and ($(MARK)))"
	# tests marked serial judge scheduling by the process' own clocks: alone, after the rest (exit 5: none selected)
	$(PY) -m pytest -m "serial$(if $(MARK), and ($(MARK)))" || test $$? -eq 5

bench: setup
	$(PY) -m benchmarks

lint: setup
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

dev: setup
	mkdir -p example_project/.dagster_home && cp -n example_project/dagster.yaml example_project/.dagster_home/
	cd example_project && PYTHONPATH=$(CURDIR) DAGSTER_HOME=$$(pwd)/.dagster_home ../$(VENV)/bin/dagster dev -m example_project.definitions

clean:
	rm -rf .noetl .dagster_home example_project/.dagster_home
