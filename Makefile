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

test: $(STAMP)
	HYPOTHESIS_PROFILE=$${HYPOTHESIS_PROFILE:-ci} $(PY) -m pytest -q

demo: $(STAMP)
	$(PY) -m ectable.demo

bench: $(STAMP)
	$(PY) -m bench.gf_kernel
	$(PY) -m bench.memory
	$(PY) -m bench.window_cost
	$(PY) -m bench.train_loop --compute-ms 20
	$(PY) -m bench.train_loop
	$(PY) -m bench.garbage_stream

clean:
	rm -rf $(VENV) build *.egg-info
