# mgpu - build everything that can be built here.
#
#   make              programs in build/bin, libraries in build/lib
#   make test         the layering check, unit tests, then integration tests against the binaries
#   make asan         the same build and tests under AddressSanitizer + UBSan (build-asan/)
#   make asan-build   that build without its tests
#   make check-layers fail on an #include that crosses a layer (tests/layers.sh)
#   make install PREFIX=/usr/local   (also builds the man pages: help2man, go-md2man)
#   make man          the man pages under build/man
#   CUDA=0 / CUDA=1   force the CUDA parts off / on (default: on when nvcc is found)
#
# Sources are found by wildcard, so a new module is a new .c/.h pair and nothing here changes.
# Each layer sees only the folders below it, by its own include path:
#   common/*.c               -> libmgpu_common.a   sees common
#   launcher/*.c             -> bin/mgpu-launch    sees launcher, common
#   worker/runtime/*.c (.cu) -> lib/libmgpu.a      sees runtime, common (the library users link;
#                               libmgpu_cuda.a is the same with NCCL, in CUDA builds)
#   kernels/*.c (.cu)        -> libmgpu_kernels.a  sees kernels, common
#   worker/trainer/*.c (.cu) -> bin/mgpu-worker    sees trainer, runtime, kernels, common
#   tests/unit/test_*.c      -> tests/test_*       sees everything
#   tests/helper/*.c         -> tests/<name>       programs the integration tests spawn

BUILD    ?= build
comma    := ,
PREFIX   ?= /usr/local
CC       ?= cc
SANITIZE ?=
# The one version string, also compiled into the programs (common/version.h).
VERSION  := $(shell sed -n 's/^\#define MGPU_VERSION "\(.*\)"/\1/p' common/version.h)

CUDA_HOME ?= /usr/local/cuda
NVCC      ?= $(shell command -v nvcc 2>/dev/null || ls $(CUDA_HOME)/bin/nvcc 2>/dev/null)
ifeq ($(origin CUDA),undefined)
CUDA := $(if $(NVCC),1,0)
endif
CUDA_ARCH ?= -gencode arch=compute_90,code=sm_90
# Hopper's warpgroup MMAs (kernels/gpt_attention_wg.cu) need the architecture-specific target
# sm_90a; a CUDA_ARCH without compute_90 builds that file for its own targets, without them.
WGMMA_ARCH ?= $(if $(findstring compute_90,$(CUDA_ARCH)),-gencode arch=compute_90a$(comma)code=sm_90a -DMGPU_HAVE_WGMMA=1,$(CUDA_ARCH))

LIBUV_A ?= $(firstword $(wildcard /usr/lib/$(shell $(CC) -dumpmachine)/libuv_a.a /usr/lib/libuv_a.a /usr/local/lib/libuv_a.a))
CJSON_SO ?= $(firstword $(wildcard /usr/lib/$(shell $(CC) -dumpmachine)/libcjson.so.1 /usr/lib/libcjson.so.1 /usr/local/lib/libcjson.so.1))

# snprintf truncation is how messages are bounded here, so that warning is off.
WARN     := -Wall -Wextra -Werror -Wshadow -Wno-unused-parameter -Wno-format-truncation
CFLAGS   ?= -O2 -g
CPPFLAGS += -D_GNU_SOURCE -MMD -MP
ALL_CFLAGS = -std=gnu11 $(WARN) $(CFLAGS) $(SANITIZE) -fno-omit-frame-pointer
LDFLAGS  += $(SANITIZE) -Wl,-rpath,'$$ORIGIN/../lib'
LAUNCH_LIBS = $(LIBUV_A) $(BUILD)/lib/libcjson.so.1 -lpthread -ldl -lm
BASE_LIBS   = $(BUILD)/lib/libcjson.so.1 -lpthread -lm -lrt

# The layers' include paths (see the table above); tests/layers.sh checks the same rules.
INC_common   := -Icommon
INC_launcher := -Ilauncher -Icommon
INC_runtime  := -Iworker/runtime -Icommon
INC_kernels  := -Ikernels -Icommon
INC_trainer  := -Iworker/trainer -Iworker/runtime -Ikernels -Icommon
INC_tests    := -Itests/unit -Ilauncher -Iworker/trainer -Iworker/runtime -Ikernels -Icommon
layer = $(if $(filter common/%,$1),common,$(if $(filter launcher/%,$1),launcher,$(if \
        $(filter worker/runtime/%,$1),runtime,$(if $(filter kernels/%,$1),kernels,$(if \
        $(filter worker/trainer/%,$1),trainer,tests)))))

ifeq ($(CUDA),1)
CUDA_CPPFLAGS := -DMGPU_HAVE_CUDA=1 -I$(CUDA_HOME)/include
NVCCFLAGS  ?= -O3 -std=c++17 $(CUDA_ARCH) -Xcompiler -Wall,-Wextra,-Werror,-Wno-unused-parameter -Werror all-warnings
# cuBLAS is dlopen'ed by the kernels (through this run path), not linked: see kernels/README.md.
CUDA_LIBS  := -L$(CUDA_HOME)/lib64 -Wl,-rpath,$(CUDA_HOME)/lib64 -lcudart_static -lnccl -lstdc++ -ldl
RUNTIME_CU := $(wildcard worker/runtime/*.cu)
KERNELS_CU := $(wildcard kernels/*.cu)
TRAINER_CU := $(wildcard worker/trainer/*.cu)
else
CUDA_CPPFLAGS :=
CUDA_LIBS  :=
RUNTIME_CU :=
KERNELS_CU :=
TRAINER_CU :=
endif
# CUDA headers and MGPU_HAVE_CUDA reach the layers that may use them, never common or launcher.
CUDA_OK = $(filter runtime kernels trainer tests,$(call layer,$1))

COMMON_SRC   := $(wildcard common/*.c)
LAUNCHER_SRC := $(filter-out launcher/main.c,$(wildcard launcher/*.c))
RUNTIME_SRC  := $(wildcard worker/runtime/*.c)
KERNELS_SRC  := $(wildcard kernels/*.c)
TRAINER_SRC  := $(filter-out worker/trainer/main.c,$(wildcard worker/trainer/*.c))
UNIT_SRC     := $(wildcard tests/unit/test_*.c)
HELPER_SRC   := $(wildcard tests/helper/*.c)

obj = $(patsubst %.c,$(BUILD)/obj/%.o,$(patsubst %.cu,$(BUILD)/obj/%.cu.o,$(1)))
COMMON_OBJ   := $(call obj,$(COMMON_SRC))
LAUNCHER_OBJ := $(call obj,$(LAUNCHER_SRC))
KERNELS_OBJ  := $(call obj,$(KERNELS_SRC) $(KERNELS_CU))
TRAINER_OBJ  := $(call obj,$(TRAINER_SRC) $(TRAINER_CU))
# libmgpu.a is the runtime without NCCL or CUDA (mgpu.c built a second time, without
# MGPU_HAVE_CUDA), so a CPU-only program links nothing of CUDA's; libmgpu_cuda.a has NCCL.
RUNTIME_OBJ     := $(call obj,$(RUNTIME_SRC) $(RUNTIME_CU))
RUNTIME_CPU_OBJ := $(call obj,$(filter-out worker/runtime/mgpu.c,$(RUNTIME_SRC))) $(BUILD)/obj-cpu/worker/runtime/mgpu.o

LIB_COMMON   := $(BUILD)/lib/libmgpu_common.a
LIB_LAUNCHER := $(BUILD)/lib/libmgpu_launcher.a
LIB_MGPU     := $(BUILD)/lib/libmgpu.a
LIB_KERNELS  := $(BUILD)/lib/libmgpu_kernels.a
LIB_TRAINER  := $(BUILD)/lib/libmgpu_trainer.a
ifeq ($(CUDA),1)
LIB_RUNTIME  := $(BUILD)/lib/libmgpu_cuda.a
else
LIB_RUNTIME  := $(LIB_MGPU)
endif
WORKER_LIBS = $(BASE_LIBS) $(CUDA_LIBS)

LAUNCH_BIN := $(BUILD)/bin/mgpu-launch
WORKER_BIN := $(BUILD)/bin/mgpu-worker
UNIT_BINS  := $(patsubst tests/unit/%.c,$(BUILD)/tests/%,$(UNIT_SRC))
HELPER_BINS:= $(patsubst tests/helper/%.c,$(BUILD)/tests/%,$(HELPER_SRC))

.PHONY: all test unit integration asan asan-build install man clean info format check-layers
all: info $(LAUNCH_BIN) $(WORKER_BIN) $(LIB_MGPU) $(LIB_RUNTIME) $(UNIT_BINS) $(HELPER_BINS)

info:
	@echo "mgpu: CUDA=$(CUDA) nvcc=$(or $(NVCC),none) libuv=$(or $(LIBUV_A),MISSING) cjson=$(or $(CJSON_SO),MISSING) build=$(BUILD)"
	@test -n "$(LIBUV_A)" || { echo "libuv_a.a not found: apt-get install libuv1-dev" >&2; exit 1; }
	@test -n "$(CJSON_SO)" || { echo "libcjson.so.1 not found: apt-get install libcjson-dev" >&2; exit 1; }

# cJSON travels next to the binaries (rpath $ORIGIN/../lib) for hosts where it is not installed.
$(BUILD)/lib/libcjson.so.1: $(CJSON_SO)
	@mkdir -p $(@D)
	cp -L $< $@

$(BUILD)/obj/%.o: %.c
	@mkdir -p $(@D)
	$(CC) $(CPPFLAGS) $(INC_$(call layer,$<)) $(if $(call CUDA_OK,$<),$(CUDA_CPPFLAGS)) $(ALL_CFLAGS) -c $< -o $@

$(BUILD)/obj-cpu/%.o: %.c
	@mkdir -p $(@D)
	$(CC) $(CPPFLAGS) $(INC_$(call layer,$<)) $(ALL_CFLAGS) -c $< -o $@

$(BUILD)/obj/%.cu.o: %.cu
	@mkdir -p $(@D)
	$(NVCC) $(NVCCFLAGS) $(INC_$(call layer,$<)) -DMGPU_HAVE_CUDA=1 -MMD -MP -c $< -o $@

$(BUILD)/obj/kernels/gpt_attention_wg.cu.o: CUDA_ARCH := $(WGMMA_ARCH)

# ar of a fresh archive: an object removed from the tree never lingers in a library.
define archive
	@mkdir -p $(@D)
	rm -f $@ && ar rcs $@ $^
endef
$(LIB_COMMON): $(COMMON_OBJ) ; $(archive)
$(LIB_LAUNCHER): $(LAUNCHER_OBJ) ; $(archive)
$(LIB_KERNELS): $(KERNELS_OBJ) ; $(archive)
$(LIB_TRAINER): $(TRAINER_OBJ) ; $(archive)
# The runtime libraries hold common/ too, so a user's program links one library.
$(LIB_MGPU): $(RUNTIME_CPU_OBJ) $(COMMON_OBJ) ; $(archive)
ifeq ($(CUDA),1)
$(BUILD)/lib/libmgpu_cuda.a: $(RUNTIME_OBJ) $(COMMON_OBJ) ; $(archive)
endif

$(LAUNCH_BIN): $(BUILD)/obj/launcher/main.o $(LIB_LAUNCHER) $(LIB_COMMON) $(BUILD)/lib/libcjson.so.1
	@mkdir -p $(@D)
	$(CC) $(LDFLAGS) -o $@ $< $(LIB_LAUNCHER) $(LIB_COMMON) $(LAUNCH_LIBS)

$(WORKER_BIN): $(BUILD)/obj/worker/trainer/main.o $(LIB_TRAINER) $(LIB_KERNELS) $(LIB_RUNTIME) $(BUILD)/lib/libcjson.so.1
	@mkdir -p $(@D)
	$(CC) $(LDFLAGS) -o $@ $< $(LIB_TRAINER) $(LIB_KERNELS) $(LIB_RUNTIME) $(WORKER_LIBS)

$(BUILD)/tests/%: tests/unit/%.c $(LIB_LAUNCHER) $(LIB_TRAINER) $(LIB_KERNELS) $(LIB_RUNTIME) $(BUILD)/lib/libcjson.so.1
	@mkdir -p $(@D) $(BUILD)/obj/tests
	$(CC) $(CPPFLAGS) $(INC_tests) $(CUDA_CPPFLAGS) $(ALL_CFLAGS) -MF $(BUILD)/obj/tests/$*.d -o $@ $< \
	  $(LIB_LAUNCHER) $(LIB_TRAINER) $(LIB_KERNELS) $(LIB_RUNTIME) $(LDFLAGS) $(LIBUV_A) $(WORKER_LIBS) -ldl

$(BUILD)/tests/%: tests/helper/%.c $(LIB_TRAINER) $(LIB_KERNELS) $(LIB_RUNTIME) $(BUILD)/lib/libcjson.so.1
	@mkdir -p $(@D) $(BUILD)/obj/tests
	$(CC) $(CPPFLAGS) $(INC_tests) $(CUDA_CPPFLAGS) $(ALL_CFLAGS) -MF $(BUILD)/obj/tests/$*.d -o $@ $< \
	  $(LIB_TRAINER) $(LIB_KERNELS) $(LIB_RUNTIME) $(LDFLAGS) $(WORKER_LIBS) $(HELPER_LIBS_$*)

# tests/bench/gpt_kernels_bench.c: the GPT kernels' figures, built as the helpers are.
BENCH_BINS := $(BUILD)/tests/gpt_kernels_bench
all: $(BENCH_BINS)
$(BUILD)/tests/gpt_kernels_bench: tests/bench/gpt_kernels_bench.c $(LIB_TRAINER) $(LIB_KERNELS) $(LIB_RUNTIME) $(BUILD)/lib/libcjson.so.1
	@mkdir -p $(@D) $(BUILD)/obj/tests
	$(CC) $(CPPFLAGS) $(INC_tests) $(CUDA_CPPFLAGS) $(ALL_CFLAGS) -MF $(BUILD)/obj/tests/gpt_kernels_bench.d -o $@ $< \
	  $(LIB_TRAINER) $(LIB_KERNELS) $(LIB_RUNTIME) $(LDFLAGS) $(WORKER_LIBS)

# kernels_bench calls cuBLAS itself (its bare reference GEMMs).
ifeq ($(CUDA),1)
HELPER_LIBS_kernels_bench = -lcublas -lcublasLt
endif

# tests/gpu/kernel_trace.c: a CUPTI injection library for tests/gpu/trace_steps.sh, built when
# CUPTI is found; libcupti travels next to it, as cJSON does (GPU hosts may lack CUPTI).
CUPTI_SO := $(if $(filter 1,$(CUDA)),$(firstword $(wildcard $(CUDA_HOME)/extras/CUPTI/lib64/libcupti.so.[0-9]* $(CUDA_HOME)/lib/libcupti.so.[0-9]* $(CUDA_HOME)/lib64/libcupti.so.[0-9]*)))
CUPTI_INC := $(firstword $(wildcard $(CUDA_HOME)/extras/CUPTI/include/cupti.h $(CUDA_HOME)/include/cupti.h))
ifneq ($(and $(CUPTI_SO),$(CUPTI_INC)),)
TRACE_LIB := $(BUILD)/lib/libmgpu_trace.so
all: $(TRACE_LIB)
$(BUILD)/lib/$(notdir $(CUPTI_SO)): $(CUPTI_SO)
	@mkdir -p $(@D)
	cp -L $< $@
$(TRACE_LIB): tests/gpu/kernel_trace.c $(BUILD)/lib/$(notdir $(CUPTI_SO))
	$(CC) $(ALL_CFLAGS) -fPIC -shared -I$(dir $(CUPTI_INC)) -o $@ $< $(BUILD)/lib/$(notdir $(CUPTI_SO)) -Wl,-rpath,'$$ORIGIN'
endif

# tests/shim/io_trace.c: an LD_PRELOAD library that logs the order of file calls, for
# tests/integration/test_durability.sh. Built without SANITIZE: it is preloaded into any binary.
IO_TRACE_LIB := $(BUILD)/lib/libmgpu_io_trace.so
all: $(IO_TRACE_LIB)
$(IO_TRACE_LIB): tests/shim/io_trace.c
	@mkdir -p $(@D)
	$(CC) -D_GNU_SOURCE -std=gnu11 $(WARN) $(CFLAGS) -fPIC -shared -o $@ $< -ldl

check-layers:
	@bash tests/layers.sh

test: all check-layers
	@MGPU_BUILD=$(abspath $(BUILD)) bash tests/run.sh

unit: all
	@MGPU_BUILD=$(abspath $(BUILD)) bash tests/run.sh unit

integration: all
	@MGPU_BUILD=$(abspath $(BUILD)) bash tests/run.sh integration

ASAN_VARS = BUILD=build-asan CUDA=0 CFLAGS="-O1 -g" \
  SANITIZE="-fsanitize=address,undefined -fno-sanitize-recover=undefined"

# Tests that check deaths by SIGSEGV need the signal itself, not ASan's report of it.
asan:
	ASAN_OPTIONS=handle_segv=0:$(ASAN_OPTIONS) $(MAKE) $(ASAN_VARS) test

# The sanitizer build alone: .ci/run makes it while its containment statistics wait.
asan-build:
	$(MAKE) $(ASAN_VARS) all

# Headers install under include/mgpu/ and are included as <mgpu/mgpu.h>: -I<prefix>/include
# never hides a system header (glibc's <error.h>) behind one of mgpu's.
# A header installed there includes the others it needs with quotes, so they are installed too.
PUBLIC_H := worker/runtime/mgpu.h common/error.h common/store.h common/progress.h
# pc_file NAME,DESCRIPTION,LIBRARY,EXTRA LIBS: a pkg-config file on stdout.
pc_file = printf 'prefix=%s\nName: %s\nDescription: %s\nVersion: %s\nCflags: -I$${prefix}/include\nLibs: -L$${prefix}/lib -l%s $${prefix}/lib/libcjson.so.1 -Wl,-rpath,$${prefix}/lib %s -lpthread -lm -lrt\n' \
  '$(PREFIX)' '$(1)' '$(2)' '$(VERSION)' '$(3)' '$(4)'

# Man pages: help2man makes the programs' from their --help and --version (so the page and
# the program cannot disagree), go-md2man makes train.cfg(5) from configs/README.md (the
# table of keys kept beside the examples). A missing tool fails with the package to install.
MAN_DIR   := $(BUILD)/man
MAN_PAGES := $(MAN_DIR)/mgpu-launch.1 $(MAN_DIR)/mgpu-worker.1 $(MAN_DIR)/train.cfg.5
HELP2MAN  ?= help2man
GO_MD2MAN ?= go-md2man
MAN_NAME_mgpu-launch := start and supervise one worker process per GPU, as torchrun does
MAN_NAME_mgpu-worker := train a model data-parallel as one rank of an mgpu job
MAN_SEE_mgpu-launch  := mgpu-worker(1), train.cfg(5)
MAN_SEE_mgpu-worker  := mgpu-launch(1), train.cfg(5)
need_tool = @command -v $(1) >/dev/null 2>&1 || { echo "$(1) not found: apt-get install $(2) (it makes the man pages)" >&2; exit 1; }

man: $(MAN_PAGES)

$(MAN_DIR)/%.1: $(BUILD)/bin/% common/version.h
	$(call need_tool,$(HELP2MAN),help2man)
	@mkdir -p $(@D)
	printf '[SEE ALSO]\n%s\n' '$(MAN_SEE_$*)' > $@.h2m
	$(HELP2MAN) --no-info --section=1 --name='$(MAN_NAME_$*)' --include=$@.h2m --output=$@.tmp $<
	mv $@.tmp $@

# The README's first heading becomes NAME and DESCRIPTION; its sections about the files of
# configs/ are the repository's, not the format's.
$(MAN_DIR)/train.cfg.5: configs/README.md common/version.h
	$(call need_tool,$(GO_MD2MAN),go-md2man)
	@mkdir -p $(@D)
	{ printf '%% TRAIN.CFG 5 "mgpu $(VERSION)" "mgpu" "File Formats"\n\n# NAME\n\ntrain.cfg - %s\n\n# DESCRIPTION\n\n' \
	    'the settings of an mgpu-worker training run'; \
	  sed -e '1{/^# /d}' -e '/^## Files here/,$$d' -e 's/^## /# /' $<; \
	  printf '\n# SEE ALSO\n\nmgpu-worker(1), mgpu-launch(1)\n'; } | $(GO_MD2MAN) > $@.tmp
	mv $@.tmp $@

install: all man
	install -d $(DESTDIR)$(PREFIX)/bin $(DESTDIR)$(PREFIX)/lib $(DESTDIR)$(PREFIX)/include/mgpu $(DESTDIR)$(PREFIX)/lib/pkgconfig
	install -d $(DESTDIR)$(PREFIX)/share/man/man1 $(DESTDIR)$(PREFIX)/share/man/man5
	install -m 644 $(MAN_DIR)/mgpu-launch.1 $(MAN_DIR)/mgpu-worker.1 $(DESTDIR)$(PREFIX)/share/man/man1/
	install -m 644 $(MAN_DIR)/train.cfg.5 $(DESTDIR)$(PREFIX)/share/man/man5/
	install -m 755 $(LAUNCH_BIN) $(WORKER_BIN) $(DESTDIR)$(PREFIX)/bin/
	install -m 644 $(LIB_MGPU) $(BUILD)/lib/libcjson.so.1 $(DESTDIR)$(PREFIX)/lib/
	install -m 644 $(PUBLIC_H) $(DESTDIR)$(PREFIX)/include/mgpu/
	$(call pc_file,mgpu,mgpu worker runtime (libmgpu) on the CPU,mgpu,) > $(DESTDIR)$(PREFIX)/lib/pkgconfig/mgpu.pc
ifeq ($(CUDA),1)
	install -m 644 $(BUILD)/lib/libmgpu_cuda.a $(DESTDIR)$(PREFIX)/lib/
	$(call pc_file,mgpu-cuda,mgpu worker runtime (libmgpu) with NCCL,mgpu_cuda,-L$(CUDA_HOME)/lib64 -Wl$(comma)-rpath$(comma)$(CUDA_HOME)/lib64 -lcudart_static -lnccl -lstdc++ -ldl) > $(DESTDIR)$(PREFIX)/lib/pkgconfig/mgpu-cuda.pc
endif

format:
	clang-format -i $(shell find common launcher worker kernels tests/unit tests/helper -name '*.[ch]' -o -name '*.cu')

clean:
	rm -rf build build-asan

-include $(shell find $(BUILD)/obj $(BUILD)/obj-cpu -name '*.d' 2>/dev/null)
