PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: test demo bench clean

# make bench: a few minutes on 2 cores; make bench FULL=1: the full sizes (tens of minutes)
ifeq ($(FULL),1)
RECOVERY_ARGS :=
SCALE := 1.0
REDIS_ARGS := --rows 2000000 --iters 40
else
RECOVERY_ARGS := --sizes 250000 500000 1000000 --rows 1000000 --iters 300 --shares 0.5 0.2
SCALE := 0.1
REDIS_ARGS :=
endif

$(STAMP): setup.cfg pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[test]'
	touch $(STAMP)

$(VENV)/.bench-installed: $(STAMP) setup.cfg
	$(PY) -m pip install --quiet -e '.[test,bench]'
	touch $@

test: $(STAMP)
	HYPOTHESIS_PROFILE=$${HYPOTHESIS_PROFILE:-ci} $(PY) -m pytest -q

demo: $(STAMP)
	$(PY) -m pip install --quiet --no-deps recbole==1.2.1 || echo "could not install recbole (MovieLens-100K): the demo falls back to synthetic data"
	$(PY) -m ectable.demo

bench: $(VENV)/.bench-installed
	$(PY) -m bench.gf_kernel
	$(PY) -m bench.memory
	$(PY) -m bench.window_cost
	$(PY) -m bench.train_loop --compute-ms 20
	$(PY) -m bench.train_loop
	$(PY) -m bench.garbage_stream
	$(PY) -m bench.recovery $(RECOVERY_ARGS)
	$(PY) -m bench.workloads --scale $(SCALE)
	command -v redis-server >/dev/null || apt-get install -y -q redis-server || sudo apt-get install -y -q redis-server \
		|| echo "no redis-server: the Redis baseline is skipped"
	if command -v redis-server >/dev/null; then $(PY) -m bench.redis_baseline $(REDIS_ARGS); fi
	$(PY) -m bench.plots

clean:
	rm -rf $(VENV) build *.egg-info
