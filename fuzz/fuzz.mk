# libFuzzer harnesses (fuzz/fuzz_*.c), included by the top-level Makefile.
# The library is built again with clang and
# -fsanitize=fuzzer-no-link,address,undefined into $(BUILD)/fuzz/; each
# harness reaches the internal decoders through the modules' private
# headers. See docs/FUZZING.md.
#
#   make fuzz                  every harness for FUZZ_SECONDS (default 30)
#   make fuzz FUZZ=shard       only the harnesses whose name contains "shard"
#   make fuzz-build            build the harnesses only
#   make fuzz-seeds            rewrite the committed seeds (fuzz/corpus/)

FUZZ_CC ?= clang
FUZZ_SECONDS ?= 30
FUZZ ?=
FUZZ_BUILD := $(BUILD)/fuzz
FUZZ_SAN := -fsanitize=address,undefined -fno-sanitize-recover=undefined -fno-omit-frame-pointer
FUZZ_CFLAGS = -std=c11 -D_GNU_SOURCE -O1 -g -fPIC $(WARN) $(FUZZ_SAN) \
	-DGRAFT_VERSION=\"$(VERSION)\" -Iinclude -Icommon -I$(BUILD)/gen \
	$(PKG_CFLAGS) $(CUDA_CFLAGS)
FUZZ_SRCS := $(wildcard fuzz/fuzz_*.c)
FUZZ_PROGS := $(FUZZ_SRCS:fuzz/%.c=$(FUZZ_BUILD)/bin/%)
# The decoders live below runtime/, so the runtime is left out, but for the
# files of its own decoders of outside bytes (steady-path messages, records).
FUZZ_RT_SRCS := runtime/runtime_stepmsg.c runtime/runtime_records.c
FUZZ_LIB_OBJS := $(patsubst %.c,$(FUZZ_BUILD)/obj/%.o,$(filter-out runtime/%,$(LIB_SRCS)) \
	$(FUZZ_RT_SRCS)) $(FUZZ_BUILD)/obj/proto/graft.pb-c.o
FUZZ_LIB := $(FUZZ_BUILD)/libgraft-fuzz.a

.PHONY: fuzz fuzz-build fuzz-seeds

$(FUZZ_BUILD)/obj/proto/graft.pb-c.o: $(PROTO_C)
	@mkdir -p $(dir $@)
	$(FUZZ_CC) $(filter-out -Wshadow -Wextra,$(FUZZ_CFLAGS)) -fsanitize=fuzzer-no-link -c $< -o $@

$(FUZZ_BUILD)/obj/%.o: %.c $(PROTO_H)
	@mkdir -p $(dir $@)
	$(FUZZ_CC) $(FUZZ_CFLAGS) -fsanitize=fuzzer-no-link -MMD -MP -c $< -o $@

$(FUZZ_LIB): $(FUZZ_LIB_OBJS)
	@mkdir -p $(dir $@)
	rm -f $@
	ar rcs $@ $^

$(FUZZ_BUILD)/bin/%: fuzz/%.c fuzz/harness_init.c fuzz/fuzz_common.h $(FUZZ_LIB)
	@mkdir -p $(dir $@)
	$(FUZZ_CC) $(FUZZ_CFLAGS) -I. -Ietcd -Imembership -Ipersist -Itransfer -Iruntime -fsanitize=fuzzer \
		-o $@ $< fuzz/harness_init.c $(FUZZ_LIB) $(LDLIBS_ALL)

# The seed writer is an ordinary program against the ordinary library.
$(BUILD)/fuzz/make_seeds: fuzz/make_seeds.c $(LIB_A)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS_ALL) -Ietcd -Imembership -Ipersist -Itransfer -Iruntime $(LDFLAGS_ALL) -o $@ $< $(LIB_A) \
		$(LDLIBS_ALL)

fuzz-seeds: $(BUILD)/fuzz/make_seeds
	$(BUILD)/fuzz/make_seeds

fuzz-build: deps
	@$(MAKE) --no-print-directory $(FUZZ_PROGS)

fuzz: fuzz-build
	@FUZZ_BUILD=$(FUZZ_BUILD) FUZZ_SECONDS=$(FUZZ_SECONDS) sh fuzz/run.sh \
		$(if $(FUZZ),$(foreach p,$(FUZZ_PROGS),$(if $(findstring $(FUZZ),$(notdir $(p))),$(p))),$(FUZZ_PROGS))
-include $(shell find $(FUZZ_BUILD)/obj -name '*.d' 2>/dev/null)
