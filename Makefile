PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: test demo bench clean

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
	$(PY) -m bench.recovery --sizes 250000 500000 1000000 --rows 1000000 --iters 300 --shares 0.5 0.2
	$(PY) -m bench.workloads --scale 0.1
	command -v redis-server >/dev/null || apt-get install -y -q redis-server || sudo apt-get install -y -q redis-server \
		|| echo "no redis-server: the Redis baseline is skipped"
	if command -v redis-server >/dev/null; then $(PY) -m bench.redis_baseline; fi
	$(PY) -m bench.plots

clean:
	rm -rf $(VENV) build *.egg-info
