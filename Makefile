# ferry's front door. `make` alone lists the targets.
#
# Every target that builds or runs something first runs scripts/install-deps.sh, which installs
# only what is missing (a provisioned machine never reaches apt) and keeps .venv in step with
# requirements-dev.txt.

SHELL := bash
.SHELLFLAGS := -eu -o pipefail -c
.ONESHELL:
.DEFAULT_GOAL := help
MAKEFLAGS += --no-print-directory

ROOT := $(patsubst %/,%,$(dir $(abspath $(lastword $(MAKEFILE_LIST)))))

# ---- knobs (override on the command line: make test TEST_FUZZ_SECONDS=10) ----
BUILD_DIR ?= $(ROOT)/build
ASAN_DIR ?= $(ROOT)/build-asan
FUZZ_DIR ?= $(ROOT)/build-fuzz
TSAN_DIR ?= $(ROOT)/build-tsan
VENV ?= $(ROOT)/.venv
CMAKE ?= cmake
CTEST ?= ctest
# Compilers for build/ and build-asan/, and for build-fuzz/ (libFuzzer needs clang).
# They are read when a build tree is first configured; `make clean` to switch.
BUILD_CC ?= gcc
BUILD_CXX ?= g++
FUZZ_CC ?= clang-14
FUZZ_CXX ?= clang++-14
# Parallel compile jobs (empty: Ninja's default) and parallel ctest jobs.
BUILD_JOBS ?=
TEST_JOBS ?= 2
# Seconds each fuzz target runs in `make fuzz`, and in `make test` (sized for CI's time budget);
# 0 builds the fuzzers but runs none.
FUZZ_SECONDS ?= 60
TEST_FUZZ_SECONDS ?= 15
# Fuzz targets run at once (each is one process on one core).
FUZZ_JOBS ?= $(shell nproc 2>/dev/null || echo 2)
# Sanitizer runtime options for the build-asan/ test run.
TEST_ASAN_OPTIONS ?= detect_leaks=1:abort_on_error=1
TEST_UBSAN_OPTIONS ?= print_stacktrace=1:halt_on_error=1
TEST_TSAN_OPTIONS ?= halt_on_error=1:second_deadlock_stack=1
# The ThreadSanitizer pass: the C++ tests (every one is multi-threaded: progress threads, workers,
# agents), not the Python, packaging, bench, namespace or RDMA ones, nor the kill campaign (its
# hundreds of processes add nothing a data race could hide in).
TSAN_CTEST_ARGS ?= -LE 'rdma|packaging|bench|netns|python|paths' -E KillAndStopCampaign
# Extra arguments for `ferry demo`.
DEMO_ARGS ?=
# The rxe VM (QEMU guest with the kernel's soft-RoCE, rdma_rxe) that runs the RDMA tests: its
# scripts (scripts/rxe-vm/README.md), where its image is built, and the time limit of its one boot
# in seconds. FERRY_REQUIRE_RDMA_VM=1 makes a VM that cannot be built or booted a failure;
# otherwise test-rdma says why and passes.
RXEVM_TOOLS ?= $(ROOT)/scripts/rxe-vm
RXEVM_DIR ?= /var/tmp/ferry-rxe-vm
RDMA_TIMEOUT ?= 1500
# Parallel ctest jobs inside the VM (it has RXEVM_SMP=2 CPUs).
RDMA_TEST_JOBS ?= 2
CLANG_FORMAT ?= clang-format-14
CLANG_TIDY ?= clang-tidy-14
TIDY_JOBS ?= $(shell nproc 2>/dev/null || echo 2)

SOURCE_DIRS := $(wildcard $(addprefix $(ROOT)/,include src tools tests bench python))
BUILD_JOBS_FLAG := $(if $(BUILD_JOBS),-j $(BUILD_JOBS))
# The sanitizer and fuzzing trees exist to run tests: they keep line tables only (-g1: a report's
# stack names functions, files and lines) and compile as unity builds (FERRY_UNITY_BUILD), which
# halves their compile time; build/ keeps full debug information and compiles file by file.
CHECK_TREE_FLAGS ?= -DFERRY_UNITY_BUILD=ON
DEBUG_O1 := '-DCMAKE_C_FLAGS_DEBUG=-O1 -g1' '-DCMAKE_CXX_FLAGS_DEBUG=-O1 -g1'
RELWITHDEBINFO_G1 := '-DCMAKE_C_FLAGS_RELWITHDEBINFO=-O2 -g1 -DNDEBUG' '-DCMAKE_CXX_FLAGS_RELWITHDEBINFO=-O2 -g1 -DNDEBUG'

# Shell prelude for recipes: `run CMD...` prints the command, then runs it.
RUN := run() { printf '+ %s\n' "$$*"; "$$@"; }

.PHONY: help deps lint-deps configure build demo check build-asan build-fuzz fuzz test test-run test-rdma \
	test-rdma-run soak build-tsan env format \
	format-check tidy tidy-size clean distclean

help: ## List the targets
	@echo "ferry: make <target> [VAR=value ...]"
	echo
	awk -F':.*## ' '/^[a-z][a-z-]*:.*## / { printf "  %-13s %s\n", $$1, $$2 }' $(MAKEFILE_LIST)
	echo
	echo "Variables: TEST_JOBS=$(TEST_JOBS) FUZZ_SECONDS=$(FUZZ_SECONDS) TEST_FUZZ_SECONDS=$(TEST_FUZZ_SECONDS) FUZZ_JOBS=$(FUZZ_JOBS) RDMA_TEST_JOBS=$(RDMA_TEST_JOBS) BUILD_JOBS=$(BUILD_JOBS) DEMO_ARGS=$(DEMO_ARGS)"
	echo 'Shell setup: eval "$$(make -s env)"'

deps: ## Install missing Debian packages and the Python venv (.venv)
	@FERRY_VENV=$(VENV) bash $(ROOT)/scripts/install-deps.sh </dev/null

lint-deps:
	@bash $(ROOT)/scripts/install-deps.sh --lint --no-venv </dev/null

configure: deps ## Configure build/ (Ninja, RelWithDebInfo, gcc)
	@$(RUN)
	run env CC=$(BUILD_CC) CXX=$(BUILD_CXX) $(CMAKE) -S $(ROOT) -B $(BUILD_DIR) -G Ninja \
	  -DCMAKE_BUILD_TYPE=RelWithDebInfo -DPython_EXECUTABLE=$(VENV)/bin/python

build: configure ## Build everything in build/ (library, ferry CLI, tests)
	@$(RUN)
	run $(CMAKE) --build $(BUILD_DIR) $(BUILD_JOBS_FLAG)

demo: build ## Two processes move 1 GiB by RDMA WRITE and READ over a software device
	@$(RUN)
	run $(BUILD_DIR)/ferry demo $(DEMO_ARGS)

check: build ## Build build/ and run its tests (the quick loop; no sanitizers, fuzzing, VM or packaging)
	@$(RUN)
	run $(CTEST) --test-dir $(BUILD_DIR) -LE 'rdma|packaging' -j$(TEST_JOBS) --output-on-failure

build-asan: deps ## Build build-asan/ (AddressSanitizer + UBSan, Debug at -O1, unity)
	@$(RUN)
	run env CC=$(BUILD_CC) CXX=$(BUILD_CXX) $(CMAKE) -S $(ROOT) -B $(ASAN_DIR) -G Ninja \
	  -DCMAKE_BUILD_TYPE=Debug $(DEBUG_O1) -DFERRY_SANITIZE=address,undefined $(CHECK_TREE_FLAGS)
	run $(CMAKE) --build $(ASAN_DIR) $(BUILD_JOBS_FLAG)

build-tsan: deps ## Build build-tsan/ (ThreadSanitizer, RelWithDebInfo, unity; no Python module)
	@$(RUN)
	run env CC=$(BUILD_CC) CXX=$(BUILD_CXX) $(CMAKE) -S $(ROOT) -B $(TSAN_DIR) -G Ninja \
	  -DCMAKE_BUILD_TYPE=RelWithDebInfo $(RELWITHDEBINFO_G1) -DFERRY_SANITIZE=thread $(CHECK_TREE_FLAGS)
	run $(CMAKE) --build $(TSAN_DIR) $(BUILD_JOBS_FLAG)

build-fuzz: deps ## Build the libFuzzer targets in build-fuzz/ (clang-14)
	@$(RUN)
	run env CC=$(FUZZ_CC) CXX=$(FUZZ_CXX) $(CMAKE) -S $(ROOT) -B $(FUZZ_DIR) -G Ninja \
	  -DCMAKE_BUILD_TYPE=Debug $(DEBUG_O1) -DFERRY_BUILD_FUZZERS=ON -DFERRY_BUILD_TESTS=OFF $(CHECK_TREE_FLAGS)
	run $(CMAKE) --build $(FUZZ_DIR) $(BUILD_JOBS_FLAG)

# Each tests/fuzz/<name>_fuzz.cc runs for FUZZ_SECONDS, FUZZ_JOBS targets at a time, on the corpus
# build-fuzz/corpus/<name>_fuzz seeded from tests/fuzz/corpus/ (scripts/run-fuzzers.sh). Crashes
# land in build-fuzz/artifacts/<name>_fuzz/, the full output in build-fuzz/logs/<name>_fuzz.log.
fuzz: build-fuzz ## Run every fuzz target for FUZZ_SECONDS seconds (FUZZ_JOBS at a time)
	@bash $(ROOT)/scripts/run-fuzzers.sh $(FUZZ_DIR) $(ROOT) $(FUZZ_SECONDS) $(FUZZ_JOBS)

# Sub-makes, one after the other (also under make -j). Each pass is timed; the end of the run
# lists every pass's wall time and closes with one summary line (passed, or the pass that failed).
# Fuzzing runs TEST_FUZZ_SECONDS per target here (`make fuzz` runs FUZZ_SECONDS).
test: deps ## The whole suite: format check, builds, fuzzing, tests, RDMA tests in the rxe VM, sanitizer tests
	@$(RUN)
	timings=(); failed=""
	summary() {
	  echo "== test passes (wall time)"
	  printf '  %s\n' "$${timings[@]}"
	  if [[ -n $$failed ]]; then echo "test: FAILED in pass '$$failed' after $$SECONDS s"; else
	    echo "test: all $${#timings[@]} passes passed in $$SECONDS s"; fi
	}
	trap summary EXIT
	pass() {
	  local name=$$1 t0=$$SECONDS rc=0; shift
	  "$$@" || rc=$$?
	  timings+=("$$(printf '%-10s %5d s%s' "$$name" $$((SECONDS - t0)) "$$( ((rc)) && echo '  FAILED')")")
	  if ((rc)); then failed=$$name; exit $$rc; fi
	}
	pass format $(MAKE) format-check
	pass build $(MAKE) build
	pass tidy $(MAKE) tidy-size
	pass asan-build $(MAKE) build-asan
	pass tsan-build $(MAKE) build-tsan
	pass fuzz $(MAKE) fuzz FUZZ_SECONDS=$(TEST_FUZZ_SECONDS)
	pass packaging run $(CTEST) --test-dir $(BUILD_DIR) -L packaging --output-on-failure
	pass host run $(CTEST) --test-dir $(BUILD_DIR) -LE 'rdma|packaging' -j$(TEST_JOBS) --output-on-failure
	pass rdma-vm $(MAKE) test-rdma-run
	pass tsan run env TSAN_OPTIONS=$(TEST_TSAN_OPTIONS) $(CTEST) --test-dir $(TSAN_DIR) $(TSAN_CTEST_ARGS) \
	  -j$(TEST_JOBS) --output-on-failure
	pass asan run env ASAN_OPTIONS=$(TEST_ASAN_OPTIONS) UBSAN_OPTIONS=$(TEST_UBSAN_OPTIONS) \
	  $(CTEST) --test-dir $(ASAN_DIR) -LE 'rdma|paths' -j$(TEST_JOBS) --output-on-failure

# The test passes of `make test` without its builds and fuzzing.
test-run:
	@$(RUN)
	run $(CTEST) --test-dir $(BUILD_DIR) -L packaging --output-on-failure
	run $(CTEST) --test-dir $(BUILD_DIR) -LE 'rdma|packaging' -j$(TEST_JOBS) --output-on-failure
	$(MAKE) test-rdma-run
	run env TSAN_OPTIONS=$(TEST_TSAN_OPTIONS) $(CTEST) --test-dir $(TSAN_DIR) $(TSAN_CTEST_ARGS) -j$(TEST_JOBS) \
	  --output-on-failure
	run env ASAN_OPTIONS=$(TEST_ASAN_OPTIONS) UBSAN_OPTIONS=$(TEST_UBSAN_OPTIONS) \
	  $(CTEST) --test-dir $(ASAN_DIR) -LE 'rdma|paths' -j$(TEST_JOBS) --output-on-failure

test-rdma: build ## The RDMA tests (ctest -L rdma: ibverbs on rxe0) in one boot of the rxe VM
	@$(MAKE) test-rdma-run

# Builds the VM image (scripts/rxe-vm/make-image.sh) when it is missing or older than the scripts
# baked into it, boots the VM with the checkout (sources, build/ and .venv) shared read-write and
# runs ctest -L rdma there (scripts/rxe-vm/run-in-vm.sh). A VM that cannot be built or booted (no
# qemu, no kernel package, TCG failure: run-in-vm.sh exits 125) fails only under
# FERRY_REQUIRE_RDMA_VM=1; a test failure or a timeout (124) always fails.
test-rdma-run:
	@$(RUN)
	unavailable() {
	  echo "test-rdma: RDMA tests not run: $$*" >&2
	  if [[ "$${FERRY_REQUIRE_RDMA_VM:-0}" == 1 ]]; then
	    echo "test-rdma: FAILED: FERRY_REQUIRE_RDMA_VM=1 requires them" >&2
	    exit 1
	  fi
	  exit 0
	}
	if [[ ! -x $(RXEVM_TOOLS)/run-in-vm.sh || ! -f $(RXEVM_TOOLS)/make-image.sh ]]; then
	  unavailable "no rxe VM scripts in $(RXEVM_TOOLS) (set RXEVM_TOOLS)"
	fi
	if ! $(CTEST) --test-dir $(BUILD_DIR) -N -L rdma | grep -q '^Total Tests: [1-9]'; then
	  unavailable "no tests labelled rdma in $(BUILD_DIR) (the ibverbs provider needs libibverbs-dev to build)"
	fi
	image=$(RXEVM_DIR)/initrd.img
	if [[ ! -f $$image || ! -f $(RXEVM_DIR)/vmlinuz || $(RXEVM_TOOLS)/make-image.sh -nt $$image \
	  || $(RXEVM_TOOLS)/guest-init.sh -nt $$image ]]; then
	  if ! run env RXEVM_DIR=$(RXEVM_DIR) bash $(RXEVM_TOOLS)/make-image.sh; then
	    unavailable "the VM image could not be built (make-image.sh failed, see above)"
	  fi
	fi
	rc=0
	cd $(BUILD_DIR)
	run env RXEVM_DIR=$(RXEVM_DIR) RXEVM_SHARE=$(ROOT) RXEVM_TIMEOUT=$(RDMA_TIMEOUT) \
	  $(RXEVM_TOOLS)/run-in-vm.sh $(CTEST) --test-dir $(BUILD_DIR) -L rdma -j$(RDMA_TEST_JOBS) --output-on-failure \
	  || rc=$$?
	case $$rc in
	  0) ;;
	  124) echo "test-rdma: FAILED: the VM run exceeded $(RDMA_TIMEOUT) s (RDMA_TIMEOUT)" >&2; exit 1 ;;
	  125) unavailable "the rxe VM did not boot or set up rxe0 (run-in-vm.sh exit 125, log above)" ;;
	  *) echo "test-rdma: FAILED: ctest -L rdma in the rxe VM exited $$rc" >&2; exit "$$rc" ;;
	esac

soak: build ## SOAK_SECONDS (600) of verified transfers between two namespaces under netem loss, delay, reordering
	@$(RUN)
	run $(ROOT)/tests/netns/netns_soak.sh $(BUILD_DIR)/ferry $${SOAK_SECONDS:-600}

env: ## Print shell exports: eval "$(make -s env)"
	@if [[ ! -x $(BUILD_DIR)/ferry ]]; then echo "# note: $(BUILD_DIR)/ferry is not built yet (make build)" >&2; fi
	printf 'export VIRTUAL_ENV=%q\n' '$(VENV)'
	printf 'export PATH=%q:%q:"$$PATH"\n' '$(VENV)/bin' '$(BUILD_DIR)'
	printf 'export LD_LIBRARY_PATH=%q"$${LD_LIBRARY_PATH:+:$$LD_LIBRARY_PATH}"\n' '$(BUILD_DIR)'
	printf 'export PYTHONPATH=%q"$${PYTHONPATH:+:$$PYTHONPATH}"\n' '$(BUILD_DIR)/python'
	printf 'unset PYTHONHOME\n'
	printf 'hash -r 2>/dev/null || true\n'

format: lint-deps ## clang-format -i every C++ source
	@find $(SOURCE_DIRS) -type f \( -name '*.h' -o -name '*.cc' -o -name '*.hpp' -o -name '*.cpp' \) \
	  -print0 | xargs -0 -r $(CLANG_FORMAT) -i

format-check: lint-deps ## Fail if any C++ source is not clang-formatted
	@find $(SOURCE_DIRS) -type f \( -name '*.h' -o -name '*.cc' -o -name '*.hpp' -o -name '*.cpp' \) \
	  -print0 | xargs -0 -r $(CLANG_FORMAT) --dry-run -Werror

tidy: lint-deps configure ## clang-tidy over src/ and tools/ with build/compile_commands.json
	@find $(wildcard $(ROOT)/src $(ROOT)/tools) -type f -name '*.cc' -print0 \
	  | xargs -0 -r -n 4 -P $(TIDY_JOBS) $(CLANG_TIDY) -p $(BUILD_DIR) --quiet

tidy-size: lint-deps configure ## clang-tidy's function-size guard over src/ (scripts/tidy-size.yaml: none over 80 lines)
	@find $(ROOT)/src -type f -name '*.cc' -print0 \
	  | xargs -0 -r -n 8 -P $(TIDY_JOBS) $(CLANG_TIDY) -p $(BUILD_DIR) --quiet \
	    --config-file=$(ROOT)/scripts/tidy-size.yaml 2>/dev/null \
	  && echo "tidy-size: no function in src/ over 80 lines"

clean: ## Remove the build trees (build/, build-asan/, build-tsan/, build-fuzz/)
	@rm -rf $(BUILD_DIR) $(ASAN_DIR) $(TSAN_DIR) $(FUZZ_DIR)

distclean: clean ## Also remove .venv
	@rm -rf $(VENV)
