# mgpu - build everything that can be built here.
#
#   make              programs in build/bin, libraries in build/lib
#   make test         unit tests, then integration tests against the real binaries
#   make asan         the same build and tests under AddressSanitizer + UBSan (build-asan/)
#   make install PREFIX=/usr/local
#   CUDA=0 / CUDA=1   force the CUDA parts off / on (default: on when nvcc is found)
#
# Sources are found by wildcard, so a new module is a new .c/.h pair and nothing here changes:
#   common/*.c                       -> libmgpu_common.a (no CUDA, shared by all)
#   launcher/*.c (main.c is main)    -> bin/mgpu-launch
#   worker/*.c kernels/*.c (+ .cu)   -> lib/libmgpu.a; worker/worker_main.c -> bin/mgpu-worker
#   tests/unit/test_*.c              -> tests/test_* (each links everything above)
#   tests/helper/*.c                 -> tests/<name> (programs the integration tests spawn)

BUILD    ?= build
comma    := ,
PREFIX   ?= /usr/local
CC       ?= cc
SANITIZE ?=

CUDA_HOME ?= /usr/local/cuda
NVCC      ?= $(shell command -v nvcc 2>/dev/null || ls $(CUDA_HOME)/bin/nvcc 2>/dev/null)
ifeq ($(origin CUDA),undefined)
CUDA := $(if $(NVCC),1,0)
endif
CUDA_ARCH ?= -gencode arch=compute_90,code=sm_90

LIBUV_A ?= $(firstword $(wildcard /usr/lib/$(shell $(CC) -dumpmachine)/libuv_a.a /usr/lib/libuv_a.a /usr/local/lib/libuv_a.a))
CJSON_SO ?= $(firstword $(wildcard /usr/lib/$(shell $(CC) -dumpmachine)/libcjson.so.1 /usr/lib/libcjson.so.1 /usr/local/lib/libcjson.so.1))

# snprintf truncation is how messages are bounded here, so that warning is off.
WARN     := -Wall -Wextra -Werror -Wshadow -Wno-unused-parameter -Wno-format-truncation
CFLAGS   ?= -O2 -g
CPPFLAGS += -D_GNU_SOURCE -Icommon -Ilauncher -Iworker -Ikernels -MMD -MP
ALL_CFLAGS = -std=gnu11 $(WARN) $(CFLAGS) $(SANITIZE) -fno-omit-frame-pointer
LDFLAGS  += $(SANITIZE) -Wl,-rpath,'$$ORIGIN/../lib'
LAUNCH_LIBS = $(LIBUV_A) $(BUILD)/lib/libcjson.so.1 -lpthread -ldl -lm
WORKER_LIBS = $(BUILD)/lib/libcjson.so.1 -lpthread -lm -lrt

ifeq ($(CUDA),1)
CPPFLAGS   += -DMGPU_HAVE_CUDA=1 -I$(CUDA_HOME)/include
NVCCFLAGS  ?= -O3 -std=c++17 $(CUDA_ARCH) -Xcompiler -Wall,-Wextra,-Werror,-Wno-unused-parameter -Werror all-warnings
# cuBLAS is dlopen'ed by kernels_cuda.cu (through this run path), not linked: see there.
WORKER_LIBS += -L$(CUDA_HOME)/lib64 -Wl,-rpath,$(CUDA_HOME)/lib64 -lcudart_static -lnccl -lstdc++ -ldl
CU_SRC := $(wildcard kernels/*.cu worker/*.cu)
else
CU_SRC :=
endif

COMMON_SRC   := $(wildcard common/*.c)
LAUNCHER_SRC := $(filter-out launcher/main.c,$(wildcard launcher/*.c))
WORKER_SRC   := $(filter-out worker/worker_main.c,$(wildcard worker/*.c)) $(wildcard kernels/*.c)
UNIT_SRC     := $(wildcard tests/unit/test_*.c)
HELPER_SRC   := $(wildcard tests/helper/*.c)

obj = $(patsubst %.c,$(BUILD)/obj/%.o,$(patsubst %.cu,$(BUILD)/obj/%.cu.o,$(1)))
COMMON_OBJ   := $(call obj,$(COMMON_SRC))
# The launcher checks a train.cfg before it starts anything, with the worker's own parser
# (plain C, no CUDA).
LAUNCHER_OBJ := $(call obj,$(LAUNCHER_SRC) $(wildcard worker/cfg.c))
WORKER_OBJ   := $(call obj,$(WORKER_SRC) $(CU_SRC))

LAUNCH_BIN := $(BUILD)/bin/mgpu-launch
WORKER_BIN := $(if $(wildcard worker/worker_main.c),$(BUILD)/bin/mgpu-worker)
UNIT_BINS  := $(patsubst tests/unit/%.c,$(BUILD)/tests/%,$(UNIT_SRC))
HELPER_BINS:= $(patsubst tests/helper/%.c,$(BUILD)/tests/%,$(HELPER_SRC))

.PHONY: all test unit integration asan install clean info format
all: info $(LAUNCH_BIN) $(WORKER_BIN) $(BUILD)/lib/libmgpu.a $(UNIT_BINS) $(HELPER_BINS)

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
	$(CC) $(CPPFLAGS) $(ALL_CFLAGS) -c $< -o $@

$(BUILD)/obj/%.cu.o: %.cu
	@mkdir -p $(@D)
	$(NVCC) $(NVCCFLAGS) -Icommon -Iworker -Ikernels -DMGPU_HAVE_CUDA=1 -MMD -MP -c $< -o $@

$(BUILD)/lib/libmgpu_common.a: $(COMMON_OBJ)
	@mkdir -p $(@D)
	rm -f $@ && ar rcs $@ $^

$(BUILD)/lib/libmgpu_launcher.a: $(LAUNCHER_OBJ)
	@mkdir -p $(@D)
	rm -f $@ && ar rcs $@ $^

# libmgpu.a holds common/ too, so a worker program links one library.
$(BUILD)/lib/libmgpu.a: $(WORKER_OBJ) $(COMMON_OBJ)
	@mkdir -p $(@D)
	rm -f $@ && ar rcs $@ $^

$(LAUNCH_BIN): $(BUILD)/obj/launcher/main.o $(BUILD)/lib/libmgpu_launcher.a $(BUILD)/lib/libmgpu_common.a $(BUILD)/lib/libcjson.so.1
	@mkdir -p $(@D)
	$(CC) $(LDFLAGS) -o $@ $< $(BUILD)/lib/libmgpu_launcher.a $(BUILD)/lib/libmgpu_common.a $(LAUNCH_LIBS)

$(BUILD)/bin/mgpu-worker: $(BUILD)/obj/worker/worker_main.o $(BUILD)/lib/libmgpu.a $(BUILD)/lib/libcjson.so.1
	@mkdir -p $(@D)
	$(CC) $(LDFLAGS) -o $@ $< $(BUILD)/lib/libmgpu.a $(WORKER_LIBS)

$(BUILD)/tests/%: tests/unit/%.c $(BUILD)/lib/libmgpu_launcher.a $(BUILD)/lib/libmgpu.a $(BUILD)/lib/libcjson.so.1
	@mkdir -p $(@D) $(BUILD)/obj/tests
	$(CC) $(CPPFLAGS) -Itests/unit $(ALL_CFLAGS) -MF $(BUILD)/obj/tests/$*.d -o $@ $< \
	  $(BUILD)/lib/libmgpu_launcher.a $(BUILD)/lib/libmgpu.a $(LDFLAGS) $(LIBUV_A) $(WORKER_LIBS) -ldl

$(BUILD)/tests/%: tests/helper/%.c $(BUILD)/lib/libmgpu.a $(BUILD)/lib/libcjson.so.1
	@mkdir -p $(@D) $(BUILD)/obj/tests
	$(CC) $(CPPFLAGS) $(ALL_CFLAGS) -MF $(BUILD)/obj/tests/$*.d -o $@ $< $(BUILD)/lib/libmgpu.a $(LDFLAGS) $(WORKER_LIBS) $(HELPER_LIBS_$*)

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

test: all
	@MGPU_BUILD=$(abspath $(BUILD)) bash tests/run.sh

unit: all
	@MGPU_BUILD=$(abspath $(BUILD)) bash tests/run.sh unit

integration: all
	@MGPU_BUILD=$(abspath $(BUILD)) bash tests/run.sh integration

# Tests that check deaths by SIGSEGV need the signal itself, not ASan's report of it.
asan:
	ASAN_OPTIONS=handle_segv=0:$(ASAN_OPTIONS) $(MAKE) BUILD=build-asan CUDA=0 CFLAGS="-O1 -g" \
	  SANITIZE="-fsanitize=address,undefined -fno-sanitize-recover=undefined" test

install: all
	install -d $(DESTDIR)$(PREFIX)/bin $(DESTDIR)$(PREFIX)/lib $(DESTDIR)$(PREFIX)/include/mgpu $(DESTDIR)$(PREFIX)/lib/pkgconfig
	install -m 755 $(LAUNCH_BIN) $(WORKER_BIN) $(DESTDIR)$(PREFIX)/bin/
	install -m 644 $(BUILD)/lib/libmgpu.a $(DESTDIR)$(PREFIX)/lib/
	install -m 644 $(BUILD)/lib/libcjson.so.1 $(DESTDIR)$(PREFIX)/lib/
	install -m 644 $(wildcard worker/mgpu.h common/error.h) $(DESTDIR)$(PREFIX)/include/mgpu/
	printf 'prefix=%s\nName: mgpu\nDescription: mgpu worker runtime (libmgpu)\nVersion: 0.1.0\nCflags: -I$${prefix}/include/mgpu\nLibs: -L$${prefix}/lib -lmgpu $${prefix}/lib/libcjson.so.1 -Wl,-rpath,$${prefix}/lib %s -lpthread -lm -lrt\n' \
	  '$(PREFIX)' '$(if $(filter 1,$(CUDA)),-L$(CUDA_HOME)/lib64 -Wl$(comma)-rpath$(comma)$(CUDA_HOME)/lib64 -lcudart_static -lnccl -lstdc++ -ldl)' > $(DESTDIR)$(PREFIX)/lib/pkgconfig/mgpu.pc

format:
	clang-format -i $(wildcard common/*.[ch] launcher/*.[ch] worker/*.[ch] kernels/*.[ch] kernels/*.cu tests/unit/*.[ch] tests/helper/*.c)

clean:
	rm -rf build build-asan

-include $(shell find $(BUILD)/obj -name '*.d' 2>/dev/null)
