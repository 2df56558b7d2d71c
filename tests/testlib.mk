# The test build of the library, included by the top-level Makefile.
#
# Fault switches that break recovery on purpose (GRAFT_TEST_SKIP_REGION, see
# docs/RUNTIME.md) and the persistent tier's test hooks (the crash
# countdown and the delays of persist/persist_internal.h) and the UCX
# backend's (graft__ucx_test_no_ticket, transfer/ucx_int.h) are compiled
# only with -DGRAFT_TEST_FAULTS. Only runtime/, persist/ and transfer/ have
# them, so the test library is the ordinary objects of the other modules
# plus those three built again with the flag:
#   $(BUILD)/testlib/lib/libgraft-test.a   the library with the switches
#   $(BUILD)/testlib/bin/train_mlp         the example trainer linked to it
# Only the tests that exercise a switch link them (test_runtime_api,
# test_persist, test_persist_kill and test_transfer, and test_sim_live's broken-heal run
# through that train_mlp); lib/, bin/,
# `make demo` and the shared library never have them
# (tests/test_fault_switches.c checks).

TESTLIB_BUILD := $(BUILD)/testlib
TESTLIB_RT_OBJS := $(patsubst %.c,$(TESTLIB_BUILD)/obj/%.o,$(filter runtime/% persist/% transfer/%,$(LIB_SRCS)))
TESTLIB_A := $(TESTLIB_BUILD)/lib/libgraft-test.a
TESTLIB_TRAINER := $(TESTLIB_BUILD)/bin/train_mlp

$(TESTLIB_BUILD)/obj/%.o: %.c $(PROTO_H)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS_ALL) -DGRAFT_TEST_FAULTS -MMD -MP -c $< -o $@

$(TESTLIB_A): $(filter-out $(BUILD)/obj/runtime/% $(BUILD)/obj/persist/% $(BUILD)/obj/transfer/%,$(LIB_OBJS)) $(TESTLIB_RT_OBJS)
	@mkdir -p $(dir $@)
	rm -f $@
	ar rcs $@ $^

$(TESTLIB_TRAINER): $(BUILD)/obj/examples/train_mlp.o $(TESTLIB_A)
	@mkdir -p $(dir $@)
	$(CC) $(LDFLAGS_ALL) -o $@ $^ $(LDLIBS_ALL)

# test_runtime_api includes runtime_internal.h, whose struct has the
# switch's fields only with the flag: its object is built with it too.
$(BUILD)/obj/tests/test_runtime_api.o: TEST_CFLAGS += -DGRAFT_TEST_FAULTS
$(BUILD)/tests/test_runtime_api: $(BUILD)/obj/tests/test_runtime_api.o $(SUPPORT_A) $(LAUNCHER_A) $(TESTLIB_A)
	@mkdir -p $(dir $@)
	$(CC) $(LDFLAGS_ALL) -o $@ $^ $(TEST_LIBS) $(LDLIBS_ALL)

# The tests that drive the hooks (the crash countdown, the delays, the
# ticket): built with the flag, which declares them, and linked to the
# test library.
TESTLIB_HOOK_TESTS := test_persist test_persist_kill test_transfer
$(TESTLIB_HOOK_TESTS:%=$(BUILD)/obj/tests/%.o): TEST_CFLAGS += -DGRAFT_TEST_FAULTS
$(TESTLIB_HOOK_TESTS:%=$(BUILD)/tests/%): $(BUILD)/tests/%: $(BUILD)/obj/tests/%.o $(SUPPORT_A) $(LAUNCHER_A) $(TESTLIB_A)
	@mkdir -p $(dir $@)
	$(CC) $(LDFLAGS_ALL) -o $@ $^ $(TEST_LIBS) $(LDLIBS_ALL)

# test_sim_live runs the trainer above; test_fault_switches reads both
# libraries. Order-only: the programs themselves link the ordinary library.
$(BUILD)/tests/test_sim_live $(BUILD)/tests/test_fault_switches: | $(TESTLIB_TRAINER) $(LIB_SO)

-include $(shell find $(TESTLIB_BUILD)/obj -name '*.d' 2>/dev/null)
