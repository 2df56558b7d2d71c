# graft — top-level build. Everything lands under $(BUILD):
#   lib/libgraft.a lib/libgraft.so   the library
#   bin/                             tools, the simulator, examples
#   bench/                           benchmarks
#   tests/                           test programs
# `make check SAN=1` builds into build/san with ASan+UBSan and runs the suite.

VERSION := 0.1.0

SAN ?= 0
ifeq ($(SAN),1)
BUILD ?= build/san
SAN_FLAGS := -fsanitize=address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=undefined
OPT := -O1
else ifeq ($(TSAN),1)
BUILD ?= build/tsan
SAN_FLAGS := -fsanitize=thread -fno-omit-frame-pointer
OPT := -O1
else
BUILD ?= build
SAN_FLAGS :=
OPT := -O2
endif

CC ?= cc
PKG_CONFIG ?= pkg-config
PROTOC_C ?= protoc-c
PKGS := ucx libcurl libprotobuf-c libzstd libxxhash jansson libcrypto
# Ask pkg-config only when building; `make clean` and `make info` must work
# on a machine where the dependencies are still missing.
# UCX_PREFIX=DIR (DIR/include, DIR/lib): build against that UCX instead of
# Debian's, e.g. `make ucx-pypi` (UCX 1.22, which fixed the stale descriptor
# events a connection flood trips in 1.13; docs/SECURITY.md). Every program
# finds it again through an rpath.
UCX_PREFIX ?=
ifneq ($(UCX_PREFIX),)
PKGS := $(filter-out ucx,$(PKGS))
UCX_CFLAGS := -isystem $(UCX_PREFIX)/include
UCX_LIBS := -L$(UCX_PREFIX)/lib -Wl,-rpath,$(UCX_PREFIX)/lib -lucp -luct -lucs -lucm
endif
PKG_CFLAGS = $(shell $(PKG_CONFIG) --cflags $(PKGS) 2>/dev/null)
PKG_LIBS = $(shell $(PKG_CONFIG) --libs $(PKGS) 2>/dev/null)
TEST_LIBS = $(shell $(PKG_CONFIG) --libs cmocka 2>/dev/null)

# ---- optional CUDA/NCCL --------------------------------------------------
CUDA_HOME ?= /usr/local/cuda
CUDA_INC := $(CUDA_HOME)/include
CUDA_LIBDIR := $(firstword $(wildcard $(CUDA_HOME)/lib64 $(CUDA_HOME)/lib))
NCCL_HEADER := $(firstword $(wildcard $(CUDA_INC)/nccl.h /usr/include/nccl.h))
NCCL_LIB := $(firstword $(wildcard $(CUDA_LIBDIR)/libnccl.so /usr/lib/x86_64-linux-gnu/libnccl.so))
CUDART_LIB := $(wildcard $(CUDA_LIBDIR)/libcudart.so)
ifneq ($(and $(wildcard $(CUDA_INC)/cuda_runtime.h),$(NCCL_HEADER),$(NCCL_LIB),$(CUDART_LIB)),)
HAVE_CUDA := 1
CUDA_CFLAGS := -DGRAFT_HAVE_CUDA=1 -I$(CUDA_INC) -I$(dir $(NCCL_HEADER))
CUDA_LIBS := -L$(CUDA_LIBDIR) -L$(dir $(NCCL_LIB)) -Wl,-rpath,$(CUDA_LIBDIR) -lnccl -lcudart
else
HAVE_CUDA := 0
CUDA_CFLAGS :=
CUDA_LIBS :=
endif

WARN := -Wall -Wextra -Werror -Wshadow -Wstrict-prototypes -Wno-unused-parameter
CFLAGS_ALL = -std=c11 -D_GNU_SOURCE $(OPT) -g -fPIC $(WARN) $(SAN_FLAGS) \
	-DGRAFT_VERSION=\"$(VERSION)\" -Iinclude -Icommon -I$(BUILD)/gen \
	$(UCX_CFLAGS) $(PKG_CFLAGS) $(CUDA_CFLAGS) $(CFLAGS)
LDLIBS_ALL = $(UCX_LIBS) $(PKG_LIBS) $(CUDA_LIBS) -lpthread -lm $(LDLIBS)
LDFLAGS_ALL = $(SAN_FLAGS) $(LDFLAGS)

# ---- sources -------------------------------------------------------------
# Library modules, in dependency order (see docs/ARCHITECTURE.md).
MODULES := common etcd membership transfer persist runtime
# Files named nccl*.c or cuda*.c need CUDA and NCCL; they are built only
# when both are found.
ALL_LIB_SRCS := $(foreach m,$(MODULES),$(wildcard $(m)/*.c))
CUDA_ONLY_SRCS := $(filter $(addsuffix /nccl%,$(MODULES)) $(addsuffix /cuda%,$(MODULES)),$(ALL_LIB_SRCS))
ifeq ($(HAVE_CUDA),1)
LIB_SRCS := $(ALL_LIB_SRCS)
else
LIB_SRCS := $(filter-out $(CUDA_ONLY_SRCS),$(ALL_LIB_SRCS))
endif
PROTO_C := $(BUILD)/gen/proto/graft.pb-c.c
PROTO_H := $(BUILD)/gen/proto/graft.pb-c.h
LIB_OBJS := $(LIB_SRCS:%.c=$(BUILD)/obj/%.o) $(BUILD)/obj/proto/graft.pb-c.o

LIB_A := $(BUILD)/lib/libgraft.a
LIB_SO := $(BUILD)/lib/libgraft.so

# One program per tools/*.c and examples/*.c; the simulator is all of sim/
# (its two tools in sim/live/ and sim/model/): its main (sim/sim_main.c)
# over its library part, which the tests of the simulator link too.
TOOL_SRCS := $(wildcard tools/*.c)
EXAMPLE_SRCS := $(wildcard examples/*.c)
SIM_SRCS := $(wildcard sim/*.c sim/*/*.c)
SIM_MAIN_SRCS := $(filter sim/sim_main.c,$(SIM_SRCS))
SIM_LIB_SRCS := $(filter-out $(SIM_MAIN_SRCS),$(SIM_SRCS))
SIM_LIB_A := $(BUILD)/lib/libgraft-sim.a
# The embedded etcd launcher (graft_etcd_server_*, graft_etcd_cluster_*,
# tools/etcd_launcher/) is not part of libgraft: a static library of its own
# for the programs that start an etcd (graft-sim, graft-demo, the tests
# through tests/support/etcd_fixture.h, the benchmarks), linked before
# libgraft.a, whose internals of common/ and etcd/ it uses. Its users find
# etcd_launcher.h through LAUNCHER_CFLAGS.
LAUNCHER_SRCS := $(wildcard tools/etcd_launcher/*.c)
LAUNCHER_A := $(BUILD)/lib/libgraft_etcd_launcher.a
LAUNCHER_CFLAGS := -Itools/etcd_launcher
BIN_PROGS := $(TOOL_SRCS:tools/%.c=$(BUILD)/bin/%) $(EXAMPLE_SRCS:examples/%.c=$(BUILD)/bin/%)
ifneq ($(SIM_SRCS),)
BIN_PROGS += $(BUILD)/bin/graft-sim
endif
# graftctl is all of tools/graftctl/ (docs/OPERATIONS.md) and the HTTP answer
# it shares with graft-agent (tools/common/).
GRAFTCTL_SRCS := $(wildcard tools/graftctl/*.c) tools/common/http_answer.c
ifneq ($(GRAFTCTL_SRCS),)
BIN_PROGS += $(BUILD)/bin/graftctl
endif
# graft-agent is all of tools/graft_agent/ (docs/OPERATIONS.md, "graft-agent")
# and tools/common/.
GRAFT_AGENT_SRCS := $(wildcard tools/graft_agent/*.c) tools/common/http_answer.c
ifneq ($(GRAFT_AGENT_SRCS),)
BIN_PROGS += $(BUILD)/bin/graft-agent
endif

BENCH_SRCS := $(wildcard bench/*.c)
BENCH_PROGS := $(BENCH_SRCS:bench/%.c=$(BUILD)/bench/%)

# Each tests/test_*.c is one cmocka program; tests/support/*.c (the fixtures)
# is one archive linked into every test and benchmark, so a program takes
# only the fixtures it calls (a benchmark links no cmocka).
TEST_SRCS := $(wildcard tests/test_*.c)
TEST_PROGS := $(TEST_SRCS:tests/%.c=$(BUILD)/tests/%)
SUPPORT_OBJS := $(patsubst %.c,$(BUILD)/obj/%.o,$(wildcard tests/support/*.c))
SUPPORT_A := $(BUILD)/lib/libgraft-testsupport.a
TEST_CFLAGS = -I. -Itests/support $(LAUNCHER_CFLAGS)
# pytest suites that `make check` runs after the test programs (see
# scripts/run-tests.sh); their tests count in the same total.
PYTEST_DIRS :=
PYTEST_DIRS += tests/dashboard
PYTEST_DIRS += tests/python

.PHONY: all lib demo soak check check-tsan tests bench clean info deps layering ucx-pypi check-ucx-pypi
.DEFAULT_GOAL := all

all: lib $(BIN_PROGS) $(BENCH_PROGS)

lib: $(LIB_A) $(LIB_SO)

deps:
	@sh scripts/deps.sh

# UCX 1.22 from PyPI into build/ucx-pypi; then build with the UCX_PREFIX it prints.
ucx-pypi:
	@echo "make UCX_PREFIX=$$(sh scripts/ucx-pypi.sh $(CURDIR)/build/ucx-pypi) BUILD=build/ucx122 ..."

# The transfer tests that hold UCX's configuration to account (the
# listener's transports, the second connection, the attacks), built
# against UCX 1.22 from PyPI: a setting whose name moved between versions
# shows here (UCX 1.22 took "PUT_ENABLE" no longer, and a stranger's put
# went through).
UCX_PYPI_TESTS := test_transfer test_transfer_attack
check-ucx-pypi:
	@prefix=$$(sh scripts/ucx-pypi.sh $(CURDIR)/build/ucx-pypi) && \
	$(MAKE) --no-print-directory UCX_PREFIX=$$prefix BUILD=build/ucx122 \
		$(UCX_PYPI_TESTS:%=build/ucx122/tests/%) && \
	BUILD=build/ucx122 sh scripts/run-tests.sh $(UCX_PYPI_TESTS:%=build/ucx122/tests/%)

# ---- rules ---------------------------------------------------------------
$(PROTO_C) $(PROTO_H): proto/graft.proto
	@mkdir -p $(BUILD)/gen
	$(PROTOC_C) --c_out=$(BUILD)/gen proto/graft.proto

$(BUILD)/obj/proto/graft.pb-c.o: $(PROTO_C)
	@mkdir -p $(dir $@)
	$(CC) $(filter-out -Wshadow -Wextra,$(CFLAGS_ALL)) -c $< -o $@

$(BUILD)/obj/tests/%.o: tests/%.c $(PROTO_H)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS_ALL) $(TEST_CFLAGS) -MMD -MP -c $< -o $@

$(BUILD)/obj/%.o: %.c $(PROTO_H)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS_ALL) -MMD -MP -c $< -o $@

$(LIB_A): $(LIB_OBJS)
	@mkdir -p $(dir $@)
	rm -f $@
	ar rcs $@ $^

# Only the public API (graft_*) is exported: scripts/libgraft.map.
LIB_MAP := scripts/libgraft.map
$(LIB_SO): $(LIB_OBJS) $(LIB_MAP)
	@mkdir -p $(dir $@)
	$(CC) -shared -Wl,-soname,libgraft.so.0 -Wl,--version-script=$(LIB_MAP) $(LDFLAGS_ALL) \
		-o $@ $(LIB_OBJS) $(LDLIBS_ALL)
# tests/test_lib_exports.c reads the shared library's symbol table.
$(BUILD)/tests/test_lib_exports: | $(LIB_SO)

$(SIM_LIB_A): $(SIM_LIB_SRCS:%.c=$(BUILD)/obj/%.o)
	@mkdir -p $(dir $@)
	rm -f $@
	ar rcs $@ $^

$(LAUNCHER_A): $(LAUNCHER_SRCS:%.c=$(BUILD)/obj/%.o)
	@mkdir -p $(dir $@)
	rm -f $@
	ar rcs $@ $^
# The launcher includes etcd/etcd_internal.h; sim/ and tools/ include
# etcd_launcher.h.
$(BUILD)/obj/tools/etcd_launcher/%.o: CFLAGS_ALL += -I.
$(BUILD)/obj/sim/%.o $(BUILD)/obj/tools/%.o: CFLAGS_ALL += $(LAUNCHER_CFLAGS)

$(BUILD)/bin/graft-sim: $(SIM_MAIN_SRCS:%.c=$(BUILD)/obj/%.o) $(SIM_LIB_A) $(LAUNCHER_A) $(LIB_A)
	@mkdir -p $(dir $@)
	$(CC) $(LDFLAGS_ALL) -o $@ $^ $(LDLIBS_ALL)

$(BUILD)/bin/graftctl: $(GRAFTCTL_SRCS:%.c=$(BUILD)/obj/%.o) $(LIB_A)
	@mkdir -p $(dir $@)
	$(CC) $(LDFLAGS_ALL) -o $@ $^ $(LDLIBS_ALL) $(shell $(PKG_CONFIG) --libs libmicrohttpd 2>/dev/null)

$(BUILD)/bin/graft-agent: $(GRAFT_AGENT_SRCS:%.c=$(BUILD)/obj/%.o) $(LIB_A)
	@mkdir -p $(dir $@)
	$(CC) $(LDFLAGS_ALL) -o $@ $^ $(LDLIBS_ALL) $(shell $(PKG_CONFIG) --libs libmicrohttpd 2>/dev/null)

$(BUILD)/bin/%: $(BUILD)/obj/tools/%.o $(LAUNCHER_A) $(LIB_A)
	@mkdir -p $(dir $@)
	$(CC) $(LDFLAGS_ALL) -o $@ $^ $(LDLIBS_ALL)

$(BUILD)/bin/%: $(BUILD)/obj/examples/%.o $(LIB_A)
	@mkdir -p $(dir $@)
	$(CC) $(LDFLAGS_ALL) -o $@ $^ $(LDLIBS_ALL)

$(BUILD)/obj/bench/%.o: bench/%.c $(PROTO_H)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS_ALL) $(TEST_CFLAGS) -MMD -MP -c $< -o $@

$(SUPPORT_A): $(SUPPORT_OBJS)
	@mkdir -p $(dir $@)
	rm -f $@
	ar rcs $@ $^

$(BUILD)/bench/%: $(BUILD)/obj/bench/%.o $(SUPPORT_A) $(LAUNCHER_A) $(LIB_A)
	@mkdir -p $(dir $@)
	$(CC) $(LDFLAGS_ALL) -o $@ $^ $(LDLIBS_ALL)

$(BUILD)/tests/%: $(BUILD)/obj/tests/%.o $(SUPPORT_A) $(LAUNCHER_A) $(LIB_A)
	@mkdir -p $(dir $@)
	$(CC) $(LDFLAGS_ALL) -o $@ $^ $(TEST_LIBS) $(LDLIBS_ALL)

# The simulator's tests link its library part (test_sim_model_cli supplies
# its own graft_sim_live_run, so the live engine is not pulled in there).
SIM_TEST_PROGS := $(BUILD)/tests/test_sim_model $(BUILD)/tests/test_sim_model_params \
	$(BUILD)/tests/test_sim_model_cli $(BUILD)/tests/test_sim_plan \
	$(BUILD)/tests/test_sim_live $(BUILD)/tests/test_sim_netns
$(SIM_TEST_PROGS): $(BUILD)/tests/%: $(BUILD)/obj/tests/%.o $(SUPPORT_A) $(SIM_LIB_A) $(LAUNCHER_A) $(LIB_A)
	@mkdir -p $(dir $@)
	$(CC) $(LDFLAGS_ALL) -o $@ $^ $(TEST_LIBS) $(LDLIBS_ALL)

# ---- top-level targets ---------------------------------------------------
tests: $(TEST_PROGS) $(BIN_PROGS)

layering: $(LIB_OBJS)
	@sh scripts/check-layering.sh $(BUILD)
	@sh scripts/check-runtime-objects.sh $(BUILD)
	@python3 scripts/check-circles.py $(BUILD) common etcd membership transfer persist runtime \
		sim/live sim/model tools/graftctl tools/graft_agent

check: deps
	@$(MAKE) --no-print-directory all tests layering
	@$(if $(strip $(PYTEST_DIRS)),BUILD=$(BUILD) sh scripts/python-env.sh)
	@# Under SAN=1 a plain python cannot load the instrumented libgraft.so:
	@# the Python tests load a plain one from build/ (tests/python/conftest.py).
	@$(if $(filter 1,$(SAN)),$(if $(strip $(PYTEST_DIRS)),$(MAKE) --no-print-directory SAN=0 BUILD=build lib))
	@BUILD=$(BUILD) SAN=$(SAN) PYTEST_DIRS="$(PYTEST_DIRS)" sh scripts/run-tests.sh $(TEST_PROGS)

# ThreadSanitizer tier (TSAN=1): the threaded parts that run under it (see
# docs/ARCHITECTURE.md, "Build conventions", for what does not and why).
TSAN_TESTS := test_etcd test_membership test_membership_votes test_membership_lease \
	test_membership_delegate test_membership_failures test_persist test_persist_golden \
	test_persist_fsync \
	test_transfer_msg test_runtime_steady
check-tsan: deps
	@$(MAKE) --no-print-directory TSAN=1 $(addprefix build/tsan/tests/,$(TSAN_TESTS)) \
		build/tsan/bin/train_mlp
	@BUILD=build/tsan TSAN=1 sh scripts/run-tests.sh $(addprefix build/tsan/tests/,$(TSAN_TESTS))

# A long graft-sim run (1000 random failures by default) with the memory and
# descriptors of its processes watched; SOAK_ARGS go to scripts/soak.py
# (--help). Outside CI: it takes about half an hour (docs/PERFORMANCE.md).
soak: deps
	@$(MAKE) --no-print-directory all
	@python3 scripts/soak.py --build $(BUILD) $(SOAK_ARGS)

demo: deps
	@$(MAKE) --no-print-directory all
	@BUILD=$(BUILD) sh scripts/demo.sh

bench: deps
	@$(MAKE) --no-print-directory all
	@for b in $(BENCH_PROGS); do echo "== $$b"; $$b || exit 1; done

info:
	@echo "graft $(VERSION)"
	@echo "build dir:      $(BUILD)"
	@echo "sanitizers:     $(if $(SAN_FLAGS),ASan+UBSan,off)"
	@echo "library:        $(LIB_A) $(LIB_SO)"
	@echo "etcd launcher:  $(LAUNCHER_A) (not in the library)"
	@echo "modules:        $(MODULES) proto"
ifeq ($(HAVE_CUDA),1)
	@echo "CUDA/NCCL:      built (CUDA_HOME=$(CUDA_HOME), nccl.h=$(NCCL_HEADER), libnccl=$(NCCL_LIB))"
	@echo "CUDA sources:   $(CUDA_ONLY_SRCS)"
else
	@echo "CUDA/NCCL:      skipped (no cuda_runtime.h + nccl.h + libcudart + libnccl under CUDA_HOME=$(CUDA_HOME))"
endif
	@echo "tools:          $(notdir $(BIN_PROGS))"
	@echo "benchmarks:     $(notdir $(BENCH_PROGS))"
	@echo "tests:          $(words $(TEST_PROGS)) programs"

clean:
	rm -rf build

# The test build of the library (fault switches, see tests/testlib.mk).
include tests/testlib.mk

# libFuzzer harnesses: `make fuzz` (see docs/FUZZING.md).
include fuzz/fuzz.mk

-include $(shell find $(BUILD)/obj -name '*.d' 2>/dev/null)
