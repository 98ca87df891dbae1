# Two commands on a fresh machine: `make demo` and `make test` (both set up the environment first).
# The venv sees system site-packages so a GPU box's own torch (CUDA/ROCm build) is used as is; only
# when no torch is importable do we install TORCH_SPEC (a CPU build where the local index has one).
VENV ?= .venv
PY := $(VENV)/bin/python
TORCH_SPEC ?= torch==2.13.0
STAMP := $(VENV)/.attntune-installed

.PHONY: demo test setup gpu clean

$(STAMP): pyproject.toml
	test -x $(PY) || python3 -m venv --system-site-packages $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -c "import torch" 2>/dev/null || $(PY) -m pip install -q "$(TORCH_SPEC)"
	$(PY) -m pip install -q -e '.[test]'
	touch $(STAMP)

setup: $(STAMP)

demo: $(STAMP)
	$(VENV)/bin/attntune tune --suite demo
	$(VENV)/bin/attntune show

test: $(STAMP)
	$(PY) -m pytest -q

# On a GPU machine: all GPU tests and benchmarks, JSON under $$OUT (default benchmarks/results/latest).
gpu:
	bash benchmarks/run_gpu.sh

clean:
	rm -rf $(VENV) build *.egg-info
