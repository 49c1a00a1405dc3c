# train_gpt: one CUDA source, two builds.
#   make train_gpt       nvcc build for NVIDIA GPUs (sm_80, sm_90 + PTX), cuBLASLt, NCCL, MPI
#   make train_gpt_cpu   the same sources through g++ against emu/ (CUDA on the CPU)
#   make test            build and run the test suite (CTest) on the CPU build; where nvcc exists,
#                        also build train_gpt and fail on any ptxas register spill
#   make test-gpu        the same tests built with nvcc, for machines with a GPU (test-gpu-binaries: build only)
#   make test-asan       the CPU tests under AddressSanitizer + UndefinedBehaviorSanitizer
#   make deps            install missing Debian packages
#   make train           set up, prepare the Shakespeare data and train a small GPT-2 (~10 min on 2 cores)
#   make cpu-bench       GPT-2 124M s/step of both CPU builds against the step's GEMM limit
#   make mutation-test   plant each fault of dev/mutations/ and check that the suite catches it
# PRECISION=FP32 builds FP32 parameters/activations instead of BF16. MPI=0, DEPS_PREFIX=DIR, NCCL_HOME=DIR:
# builds for machines without MPI, Debian's -dev packages or a network (below; scripts/gpu_check.sh).

# Build with every core unless the caller chose (-j / MAKEFLAGS): the test suite is ~30 binaries.
# Not in no-mpi-check-build's sub-make (SHARED_JOBS=1): it shares its caller's job slots, where a -j of
# its own reset the jobserver ("-j2 forced in makefile") and ran two more compiles beside the caller's.
ifeq ($(filter -j%,$(MAKEFLAGS))$(SHARED_JOBS),)
MAKEFLAGS += -j$(shell nproc)
endif

CXX      ?= g++
NVCC     ?= nvcc
CUDA_HOME ?= /usr/local/cuda
PRECISION ?= BF16
BUILD    ?= build
# make train's and make cpu-bench's data (data/prepare.py)
DATA_DIR := data/shakespeare

ifneq ($(PRECISION),BF16)
ifneq ($(PRECISION),FP32)
$(error PRECISION must be BF16 or FP32, got '$(PRECISION)')
endif
endif

HAVE_NVCC := $(shell command -v $(NVCC) >/dev/null 2>&1 && echo yes)

# Builds for machines without Debian's -dev packages or a network (a lent GPU node; scripts/gpu_check.sh):
#   MPI=0             no MPI library: parallel/single_process_mpi.h, one process (one GPU); mpirun refused
#   DEPS_PREFIX=DIR   the header-only C++ dependencies (cxxopts, nlohmann-json, Catch2) from DIR/usr/include,
#                     unpacked there by scripts/gpu_deps.sh; nothing is installed (no apt-get)
#   NCCL_HOME=DIR     NCCL's DIR/include/nccl.h and DIR/lib/libnccl.so.2 (e.g. the nvidia-nccl-cu13 Python
#                     package's nvidia/nccl folder), found at run time through the binary's rpath
MPI ?= 1
ifneq ($(MPI),1)
ifneq ($(MPI),0)
$(error MPI must be 1 or 0, got '$(MPI)')
endif
endif
DEPS_OK := $(if $(DEPS_PREFIX),yes,$(shell scripts/deps.sh --check >/dev/null 2>&1 && echo yes))

# MPI flags (evaluated lazily: `make deps` may have to install MPI first)
ifeq ($(MPI),1)
MPI_INC = $(addprefix -I,$(shell mpicxx --showme:incdirs))
MPI_LIB = $(addprefix -L,$(shell mpicxx --showme:libdirs)) $(addprefix -l,$(shell mpicxx --showme:libs))
MPI_DEFINE :=
MPI_SUFFIX :=
else
MPI_INC =
MPI_LIB =
MPI_DEFINE := -DTRAIN_GPT_NO_MPI
MPI_SUFFIX := -nompi
endif
DEPS_INC = $(if $(DEPS_PREFIX),-isystem $(abspath $(DEPS_PREFIX))/usr/include)
NCCL_INC = $(if $(NCCL_HOME),-I$(NCCL_HOME)/include)
NCCL_LIB = $(if $(NCCL_HOME),-L$(NCCL_HOME)/lib -Xlinker -l:libnccl.so.2 -Xlinker -rpath -Xlinker $(NCCL_HOME)/lib,-lnccl)

# One folder per precision (and MPI choice), so switching PRECISION never links objects of the other one.
PRECISION_SUFFIX := $(if $(filter FP32,$(PRECISION)),-fp32,)
CPU_DIR  := $(BUILD)/cpu$(PRECISION_SUFFIX)$(MPI_SUFFIX)
GPU_DIR  := $(BUILD)/gpu$(PRECISION_SUFFIX)$(MPI_SUFFIX)
ASAN_DIR := $(BUILD)/asan$(PRECISION_SUFFIX)$(MPI_SUFFIX)

# Target-specific overrides give the _fp32 test variants FP32 whatever PRECISION says.
PRECISION_DEFINE = -DPRECISION_$(PRECISION)
COMMON_FLAGS = -std=c++20 -I. $(NCCL_INC) -I$(CUDA_HOME)/include $(DEPS_INC) $(MPI_DEFINE) $(PRECISION_DEFINE)
WARN := -Wall -Wextra -Wno-unused-parameter
# The CPU build runs the kernels: -O3 vectorizes their per-thread loops (AdamW, LayerNorm, attention
# tiles); -fno-math-errno lets sqrtf vectorize (no result changes: errno is all it drops);
# -fno-trapping-math lets selects on floats (x < y ? a : b) vectorize as compares and blends (no
# result changes: floating-point exception flags are all it drops; the classifier 102 -> 57 ms).
# -g1: line tables (backtraces and perf annotate keep file:line), not full debug information,
# which made the largest test units compile 40% longer (test_mpi_train.o 87.6 s with -g, 62.5 s).
# -Wno-restrict: g++ 12 -O3 warns falsely inside libstdc++ on "literal" + std::string.
CPU_OPT = -O3
CPU_CXXFLAGS = $(COMMON_FLAGS) $(CPU_OPT) -fno-math-errno -fno-trapping-math -g1 -march=native $(WARN) -Wno-restrict $(MPI_INC) -pthread \
               -DKERNELS_COMPILED_ONCE  # kernels/cuda_common.h: COMPILED_ONCE
# -g1 here too: ASan's and UBSan's reports name file:line from the line tables alone. -Og, not -O1:
# the build is most of this stage. test_model_suite.o compiles in 85 s instead of 139 under the
# sanitizers; a fresh clone's make test-asan took 605 s instead of 743-768, its build about 340 s
# instead of 515, its tests 268 s instead of 223-228 (test_cublaslt the most: 86 s against 58).
ASAN_CXXFLAGS = $(COMMON_FLAGS) -Og -g1 -fno-omit-frame-pointer -fsanitize=address,undefined \
                -fno-sanitize-recover=undefined $(WARN) $(MPI_INC) -pthread -DKERNELS_COMPILED_ONCE \
                -Wno-maybe-uninitialized  # false positives in Catch2's std::regex at -O1
# The emulated cuBLASLt: oneDNN's BF16 matmul, glibc's SIMD math (libmvec), OpenMP for its epilogue.
EMU_LDLIBS = -ldnnl -lmvec -lgomp
CPU_LDLIBS = $(MPI_LIB) $(EMU_LDLIBS) -ldl -pthread

# sm_80 and sm_90 machine code, plus PTX for newer GPUs.
GPU_ARCH := -gencode arch=compute_80,code=sm_80 -gencode arch=compute_90,code=[sm_90,compute_90]
# --threads 2: the two architectures' device code compiles at once (make test's train_gpt on 2 cores:
# 82 s -> 57 s). nvcc still writes each architecture's ptxas report as one block (88 sm_80 kernels,
# then 88 sm_90: the same records as a serial build's), which check_spills.sh and kernel_report.py read.
NVCCFLAGS = $(COMMON_FLAGS) -O3 $(GPU_ARCH) --threads 2 -Xptxas -v -Xcompiler -pthread $(MPI_INC)
GPU_LDLIBS = -L$(CUDA_HOME)/lib64 -lcublasLt $(NCCL_LIB) $(MPI_LIB)

EMU_SRC := $(wildcard emu/*.cpp)
HOST_SRC := $(wildcard host/*.cpp)
# Header dependencies come from the compilers (-MMD: each object's .d lists the project headers it
# includes, train_gpt.cu included), so touching one header rebuilds only what includes it.
DEPFLAGS = -MMD -MP -MF $@.d
# Every compiled output also depends on this stamp, made once per build folder: outputs built
# before dependency lists existed (so without one) are rebuilt once, then never for it again.
DEPS_TRACKED := $(BUILD)/dependency-lists.stamp
$(DEPS_TRACKED):
	@mkdir -p $(@D)
	@touch $@

# Tests: test_<name>.cu -> one executable each. test_emu_* test the emulator itself and have no
# GPU build; test_mpi_* bring their own main (MPI_Init). A file with the line "// built into: test_<suite>"
# has none of its own: test/test_<suite>.cu includes it, one translation unit for several files that
# each include train_gpt.cu whole (test/test_model_suite.cu says why; test/tests.cmake and
# CMakeLists.txt read the same line).
TEST_SRC := $(filter-out $(shell grep -l '^// built into: ' test/test_*.cu),$(wildcard test/test_*.cu))
TEST_NAMES := $(patsubst test/%.cu,%,$(TEST_SRC))
# Kernel and model tests are built in both precisions: test_X (PRECISION) and test_X_fp32, except
# those whose source has the line "// precision: BF16 only" (test/tests.cmake reads the same line):
# they are built in BF16 whatever PRECISION says, and have no twin.
BF16_ONLY_TESTS := $(patsubst test/%.cu,%,$(shell grep -l '^// precision: BF16 only' $(TEST_SRC)))
# Tests of sm_90a-only instructions (wgmma) have the line "// gpu arch: sm_90a": their GPU build is
# sm_90a machine code alone (CMakeLists.txt reads the same line); they skip themselves elsewhere.
SM90A_TESTS := $(patsubst test/%.cu,%,$(shell grep -l '^// gpu arch: sm_90a' $(TEST_SRC)))
BOTH_PRECISION_TESTS := $(filter-out $(BF16_ONLY_TESTS),$(filter test_kernel_% test_model% test_mpi_train test_mpi_context,$(TEST_NAMES)))
FP32_TEST_NAMES := $(addsuffix _fp32,$(BOTH_PRECISION_TESTS))
ALL_TEST_NAMES := $(TEST_NAMES) $(FP32_TEST_NAMES)
GPU_TEST_NAMES := $(filter-out test_emu_%,$(ALL_TEST_NAMES))
CATCH_MAIN_TESTS := $(filter-out test_mpi_%,$(ALL_TEST_NAMES))
# dev/forward_logits.cu in both precisions, which test/test_hf_interop.py runs (rules below gemm_limit's).
FORWARD_LOGITS := forward_logits forward_logits_fp32

# A test may have a second translation unit, test/second_unit_<name>.cu, compiled apart and linked into
# test_<name> (test_linkage: two units that both include every header). $(1): test name, $(2): build folder.
second_unit_of = $(patsubst test/%.cu,$(2)/%.o,$(wildcard test/second_unit_$(patsubst test_%,%,$(1)).cu))
SECOND_UNITS := $(patsubst test/%.cu,%,$(wildcard test/second_unit_*.cu))
# The Catch2 runner a test links, from the name after test_: the MPI tests' (their own mains call its
# session) or the common one with its main. $(1): that name, $(2): build folder.
catch_main_of = $(2)/$(if $(filter mpi_%,$(1)),mpi_catch_main,catch_main).o

# The precision a binary is built in: the _fp32 twins FP32, the BF16-only tests BF16, others PRECISION.
precision_of = $(if $(filter %_fp32,$(1)),FP32,$(if $(filter $(BF16_ONLY_TESTS),$(1)),BF16,$(PRECISION)))
# The libraries of a build folder and precision, linked into every program and test there instead of
# compiled inside each of them: the host library (host/*.cpp: flag parsing, JSON, metrics; config.cpp's
# --attention default depends on the precision, hence one per precision) and, in the CPU builds, the
# kernel launchers compiled once (kernels/compiled_once.cu; COMPILED_ONCE in kernels/cuda_common.h).
# KERNELS_LIB_DIR: where the CPU folder's kernel library is instead (no-mpi-check-build reuses the main one).
precision_libs = $(if $(filter $(GPU_DIR),$(1)),,$(or $(if $(filter $(CPU_DIR),$(1)),$(KERNELS_LIB_DIR)),$(1))/libkernels-$(2).a) \
                 $(1)/libhost-$(2).a
define host_library_rules
$(1)/host-$(2)/%.o: PRECISION_DEFINE = -DPRECISION_$(2)
$(1)/host-$(2)/%.o: host/%.cpp $$(DEPS_TRACKED) | deps-if-missing
	@mkdir -p $$(@D)
	$$(CXX) $$($(3)) $$(DEPFLAGS) -c $$< -o $$@
$(1)/libhost-$(2).a: $$(patsubst host/%.cpp,$(1)/host-$(2)/%.o,$$(HOST_SRC))
	ar rcs $$@ $$^
endef
define kernel_library_rules
$(1)/kernels-$(2)/compiled_once.o: PRECISION_DEFINE = -DPRECISION_$(2)
$(1)/kernels-$(2)/compiled_once.o: kernels/compiled_once.cu $$(DEPS_TRACKED) | deps-if-missing
	@mkdir -p $$(@D)
	$$(CXX) $$($(3)) $$(DEPFLAGS) -x c++ -c $$< -o $$@
$(1)/libkernels-$(2).a: $(1)/kernels-$(2)/compiled_once.o
	ar rcs $$@ $$^
endef
.SECONDEXPANSION:

# Keep the test objects between builds (the mpirun tests' link rule makes theirs intermediate). Named
# one by one: a bare .SECONDARY would also make the dependency-list stamp secondary, and a missing
# secondary prerequisite does not force a rebuild.
.SECONDARY: $(foreach dir,$(CPU_DIR) $(GPU_DIR) $(ASAN_DIR),$(addprefix $(dir)/,$(addsuffix .o,$(ALL_TEST_NAMES) $(SECOND_UNITS))))
.PHONY: FORCE all train_gpt train_gpt_cpu test test-gpu test-gpu-binaries test-asan deps deps-if-missing train clean emu-bench

all: train_gpt_cpu

deps:
	scripts/deps.sh

# make train / make test install dependencies only when something is missing.
deps-if-missing:
ifneq ($(DEPS_OK),yes)
	scripts/deps.sh
endif

# ---------------------------------------------------------------------------------------------
# CPU build

$(CPU_DIR)/emu/%.o: emu/%.cpp $(DEPS_TRACKED) | deps-if-missing
	@mkdir -p $(@D)
	$(CXX) $(CPU_CXXFLAGS) $(DEPFLAGS) -c $< -o $@

$(CPU_DIR)/emu/cublaslt.o $(ASAN_DIR)/emu/cublaslt.o: COMMON_FLAGS += -fopenmp

# EMU_LIB_DIR: where the emulator objects that read no MPI header come from instead (no-mpi-check-build
# reuses the main CPU build's: of emu/, only nccl.cpp includes parallel/mpi_api.h; one that called MPI
# would leave undefined MPI symbols in the no-MPI link, which has no libmpi).
EMU_MPI_SRC := emu/nccl.cpp
emu_objects = $(patsubst emu/%.cpp,$(CPU_DIR)/emu/%.o,$(if $(EMU_LIB_DIR),$(EMU_MPI_SRC),$(EMU_SRC))) \
              $(if $(EMU_LIB_DIR),$(patsubst emu/%.cpp,$(EMU_LIB_DIR)/emu/%.o,$(filter-out $(EMU_MPI_SRC),$(EMU_SRC))))
$(CPU_DIR)/libcuemu.a: $(emu_objects)
	ar rcs $@ $^

$(foreach p,BF16 FP32,$(eval $(call host_library_rules,$(CPU_DIR),$(p),CPU_CXXFLAGS)))
$(foreach p,BF16 FP32,$(eval $(call kernel_library_rules,$(CPU_DIR),$(p),CPU_CXXFLAGS)))

# The copies at the root name their precision: ./train_gpt_cpu and ./train_gpt are BF16 builds,
# ./train_gpt_cpu_fp32 and ./train_gpt_fp32 FP32 ones (build/<folder>/ keeps each build).
ROOT_SUFFIX := $(if $(filter FP32,$(PRECISION)),_fp32,)
train_gpt_cpu: $(CPU_DIR)/train_gpt_cpu
	cp $< $@$(ROOT_SUFFIX)

# Compiled apart from its link, and listed first: train_gpt.cu is the build's longest compile (~90 s
# on one core here), so under -j it starts at once, beside the libraries, not after them (a fresh
# clone's make train_gpt_cpu on 2 cores: 135 s when it waited, 102 s now).
$(CPU_DIR)/train_gpt_cpu.o: train_gpt.cu $(DEPS_TRACKED) | deps-if-missing
	@mkdir -p $(@D)
	$(CXX) $(CPU_CXXFLAGS) $(DEPFLAGS) -x c++ -c $< -o $@

$(CPU_DIR)/train_gpt_cpu: $(CPU_DIR)/train_gpt_cpu.o $(call precision_libs,$(CPU_DIR),$(PRECISION)) $(CPU_DIR)/libcuemu.a
	$(CXX) $(CPU_CXXFLAGS) $< $(call precision_libs,$(CPU_DIR),$(PRECISION)) $(CPU_DIR)/libcuemu.a $(CPU_LDLIBS) -o $@

$(CPU_DIR)/catch_main.o: test/catch_main.cpp $(DEPS_TRACKED) | deps-if-missing
	@mkdir -p $(@D)
	$(CXX) $(CPU_CXXFLAGS) $(DEPFLAGS) -c $< -o $@
# The same for the tests run under mpirun (test_mpi_*: their mains call test/mpi_catch_main.cpp's session).
$(CPU_DIR)/mpi_catch_main.o: test/mpi_catch_main.cpp $(DEPS_TRACKED) | deps-if-missing
	@mkdir -p $(@D)
	$(CXX) $(CPU_CXXFLAGS) $(DEPFLAGS) -c $< -o $@
# Catch2's runner and reporters, compiled whole here (the tests' assertions expand in their own units):
# -O1 compiles it in 26 s instead of 45 at -O3 (this VM, one core), and no test waits on it.
$(CPU_DIR)/catch_main.o $(CPU_DIR)/mpi_catch_main.o: CPU_OPT = -O1

$(CPU_DIR)/test_%.o: test/test_%.cu $(DEPS_TRACKED) | deps-if-missing
	@mkdir -p $(@D)
	$(CXX) $(CPU_CXXFLAGS) $(DEPFLAGS) -x c++ -c $< -o $@

$(CPU_DIR)/second_unit_%.o: test/second_unit_%.cu $(DEPS_TRACKED) | deps-if-missing
	@mkdir -p $(@D)
	$(CXX) $(CPU_CXXFLAGS) $(DEPFLAGS) -x c++ -c $< -o $@
# test_linkage checks what links and that its two units agree with each other, on a tiny model (0.1 s
# at -O0): -O0 also emits every inline function in both units for the linker to reconcile, and takes
# 19 s a unit where -O3 took 54 (each includes train_gpt.cu whole).
$(CPU_DIR)/test_linkage.o $(CPU_DIR)/second_unit_linkage.o: CPU_OPT = -O0

$(addprefix $(CPU_DIR)/,$(addsuffix .o,$(BF16_ONLY_TESTS))): PRECISION_DEFINE = -DPRECISION_BF16
$(CPU_DIR)/test_%_fp32.o: PRECISION_DEFINE = -DPRECISION_FP32
$(CPU_DIR)/test_%_fp32.o: test/test_%.cu $(DEPS_TRACKED) | deps-if-missing
	@mkdir -p $(@D)
	$(CXX) $(CPU_CXXFLAGS) $(DEPFLAGS) -x c++ -c $< -o $@

$(addprefix $(CPU_DIR)/,$(CATCH_MAIN_TESTS)): $(CPU_DIR)/%: $(CPU_DIR)/%.o $$(call second_unit_of,$$*,$(CPU_DIR)) \
  $(CPU_DIR)/catch_main.o $$(call precision_libs,$(CPU_DIR),$$(call precision_of,$$*)) $(CPU_DIR)/libcuemu.a
	$(CXX) $^ $(CPU_LDLIBS) -o $@

$(CPU_DIR)/test_mpi_%: $(CPU_DIR)/test_mpi_%.o $(CPU_DIR)/mpi_catch_main.o \
  $$(call precision_libs,$(CPU_DIR),$$(call precision_of,test_mpi_$$*)) $(CPU_DIR)/libcuemu.a
	$(CXX) $^ $(CPU_LDLIBS) -o $@

# CTest reads the suite from test/tests.cmake (shared with CMakeLists.txt).
define ctest_file
	@mkdir -p $(1)
	@printf 'set(TEST_BIN %s)\nset(GPU %s)\nset(ASAN %s)\nset(MPI %s)\nset(MPIRUN mpirun --allow-run-as-root --oversubscribe)\nset(NO_MPI_BUILD %s)\nset(NO_MPI_DEPS %s)\ninclude(%s/test/tests.cmake)\n' \
	  "$(abspath $(1))" "$(2)" "$(3)" "$(if $(filter 1,$(MPI)),ON,OFF)" "$(abspath $(NO_MPI_CPU_DIR))" "$(NO_MPI_DEPS)" "$(CURDIR)" \
	  > $(1)/CTestTestfile.cmake
endef

$(CPU_DIR)/CTestTestfile.cmake: FORCE
	$(call ctest_file,$(CPU_DIR),OFF,OFF)

# Every header a build read, system ones included (g++ -M of the program, the host library and the
# Catch2 mains): test/test_no_mpi_build.sh checks where the dependencies' headers came from.
$(CPU_DIR)/headers.txt: FORCE | deps-if-missing  # always: the prefix the flags name may have changed
	@mkdir -p $(@D)
	$(CXX) $(CPU_CXXFLAGS) -M -x c++ train_gpt.cu > $@
	$(foreach f,$(HOST_SRC) test/catch_main.cpp test/mpi_catch_main.cpp,$(CXX) $(CPU_CXXFLAGS) -M $(f) >> $@ &&) true

# The offline build as a GPU node without packages or a network makes it (scripts/gpu_check.sh): no
# MPI (MPI=0) and the header-only dependencies from a prefix (scripts/gpu_deps.sh, here from the
# installed packages). test/test_no_mpi_build.sh runs what it builds.
# With DEPS_PREFIX given, that prefix is the one checked (no dpkg needed).
# In PRECISION, as the program it is compared with (the sub-make's CPU_DIR).
NO_MPI_CHECK := $(BUILD)/no-mpi-check
NO_MPI_CPU_DIR := $(NO_MPI_CHECK)/cpu$(PRECISION_SUFFIX)-nompi
NO_MPI_DEPS := $(abspath $(or $(DEPS_PREFIX),$(NO_MPI_CHECK)/deps))
$(NO_MPI_CHECK)/deps/PACKAGES: scripts/gpu_deps.sh scripts/deps.sh | deps-if-missing
	scripts/gpu_deps.sh --from-installed $(NO_MPI_CHECK)/deps > /dev/null
.PHONY: no-mpi-check-build
# Its kernel library and emulator objects (all but emu/nccl.cpp) are the main CPU build's: they include
# neither MPI nor the header-only dependencies (g++ -M), so second copies would only cost their compile
# (~60 s and ~80 s on one core; objdump -d of the emulator objects built both ways: the same code).
no-mpi-check-build: $(if $(DEPS_PREFIX),,$(NO_MPI_CHECK)/deps/PACKAGES) $(CPU_DIR)/libkernels-$(PRECISION).a \
  $(patsubst emu/%.cpp,$(CPU_DIR)/emu/%.o,$(filter-out $(EMU_MPI_SRC),$(EMU_SRC)))
	$(MAKE) --no-print-directory MPI=0 PRECISION=$(PRECISION) DEPS_PREFIX=$(NO_MPI_DEPS) BUILD=$(NO_MPI_CHECK) \
	  KERNELS_LIB_DIR=$(abspath $(CPU_DIR)) EMU_LIB_DIR=$(abspath $(CPU_DIR)) SHARED_JOBS=1 \
	  $(addprefix $(NO_MPI_CPU_DIR)/,train_gpt_cpu test_config test_mpi_nccl headers.txt)

# The CUDA build (and its spill check) is a prerequisite where nvcc exists, so it compiles beside the CPU
# objects under -j instead of after the tests with one core left idle for its serial parts. Make starts
# prerequisites in the order listed: the longest chains first, so that none is left running alone at the
# end (listed last, nvcc started after every CPU test object and was the build's tail).
LONGEST_CPU_UNITS := train_gpt_cpu test_model_suite test_model_suite_fp32 test_mpi_train test_mpi_train_fp32
test: deps-if-missing $(if $(HAVE_NVCC),train_gpt) no-mpi-check-build $(addprefix $(CPU_DIR)/,$(LONGEST_CPU_UNITS)) \
  $(addprefix $(CPU_DIR)/,$(ALL_TEST_NAMES) $(FORWARD_LOGITS)) $(CPU_DIR)/train_gpt_cpu \
  $(CPU_DIR)/attention_bench $(CPU_DIR)/CTestTestfile.cmake
	ctest --test-dir $(CPU_DIR) --output-on-failure -j2
ifneq ($(HAVE_NVCC),yes)
	@echo "nvcc not found: skipped the CUDA build and its register-spill check"
endif

# ---------------------------------------------------------------------------------------------
# GPU build: the ptxas report of every project kernel is kept, and any spill fails the build.

train_gpt: $(GPU_DIR)/train_gpt
	cp $< $@$(ROOT_SUFFIX)

# Host code has no CUDA in it: g++ builds its library for the GPU binaries too, without -march=native
# (the GPU node's CPU may differ).
GPU_HOST_CXXFLAGS = $(COMMON_FLAGS) -O2 -g $(WARN) $(MPI_INC) -pthread
$(foreach p,BF16 FP32,$(eval $(call host_library_rules,$(GPU_DIR),$(p),GPU_HOST_CXXFLAGS)))

$(GPU_DIR)/train_gpt: train_gpt.cu $(DEPS_TRACKED) $(call precision_libs,$(GPU_DIR),$(PRECISION)) | deps-if-missing
	@mkdir -p $(@D)
	$(NVCC) $(NVCCFLAGS) $(DEPFLAGS) -x cu $< -L$(GPU_DIR) -lhost-$(PRECISION) $(GPU_LDLIBS) -o $@ 2> $(GPU_DIR)/train_gpt.ptxas.log || { cat $(GPU_DIR)/train_gpt.ptxas.log; exit 1; }
	@scripts/check_spills.sh $(GPU_DIR)/train_gpt.ptxas.log

$(GPU_DIR)/catch_main.o $(GPU_DIR)/mpi_catch_main.o: $(GPU_DIR)/%.o: test/%.cpp | deps-if-missing
	@mkdir -p $(@D)
	$(NVCC) $(NVCCFLAGS) -x cu -c $< -o $@ 2>/dev/null

$(GPU_DIR)/test_%.o: test/test_%.cu $(DEPS_TRACKED) | deps-if-missing
	@mkdir -p $(@D)
	$(NVCC) $(NVCCFLAGS) $(DEPFLAGS) -x cu -c $< -o $@ 2> $@.ptxas.log || { cat $@.ptxas.log; exit 1; }
	@scripts/check_spills.sh $@.ptxas.log

$(GPU_DIR)/second_unit_%.o: test/second_unit_%.cu $(DEPS_TRACKED) | deps-if-missing
	@mkdir -p $(@D)
	$(NVCC) $(NVCCFLAGS) $(DEPFLAGS) -x cu -c $< -o $@ 2> $@.ptxas.log || { cat $@.ptxas.log; exit 1; }
	@scripts/check_spills.sh $@.ptxas.log

$(addprefix $(GPU_DIR)/,$(addsuffix .o,$(BF16_ONLY_TESTS))): PRECISION_DEFINE = -DPRECISION_BF16
# override: also over a GPU_ARCH given on the command line (scripts/gpu_prebuild.sh gives sm_90).
$(addprefix $(GPU_DIR)/,$(addsuffix .o,$(SM90A_TESTS))): override GPU_ARCH = -gencode arch=compute_90a,code=sm_90a
$(GPU_DIR)/test_%_fp32.o: PRECISION_DEFINE = -DPRECISION_FP32
$(GPU_DIR)/test_%_fp32.o: test/test_%.cu $(DEPS_TRACKED) | deps-if-missing
	@mkdir -p $(@D)
	$(NVCC) $(NVCCFLAGS) $(DEPFLAGS) -x cu -c $< -o $@ 2> $@.ptxas.log || { cat $@.ptxas.log; exit 1; }
	@scripts/check_spills.sh $@.ptxas.log

$(GPU_DIR)/test_%: $(GPU_DIR)/test_%.o $$(call second_unit_of,test_$$*,$(GPU_DIR)) $$(call catch_main_of,$$*,$(GPU_DIR)) \
  $$(call precision_libs,$(GPU_DIR),$$(call precision_of,test_$$*))
	$(NVCC) $< $(call second_unit_of,test_$*,$(GPU_DIR)) $(call catch_main_of,$*,$(GPU_DIR)) $(call precision_libs,$(GPU_DIR),$(call precision_of,test_$*)) \
	  $(GPU_LDLIBS) -o $@

$(GPU_DIR)/CTestTestfile.cmake: FORCE
	$(call ctest_file,$(GPU_DIR),ON,OFF)

# The binaries alone (scripts/gpu_check.sh builds them in one stage and runs them in the next).
test-gpu-binaries: deps-if-missing $(addprefix $(GPU_DIR)/,$(GPU_TEST_NAMES) $(FORWARD_LOGITS)) $(GPU_DIR)/train_gpt \
  $(GPU_DIR)/attention_bench

test-gpu: test-gpu-binaries $(GPU_DIR)/CTestTestfile.cmake
	ctest --test-dir $(GPU_DIR) --output-on-failure

# ---------------------------------------------------------------------------------------------
# Sanitizers: the CPU tests under ASan + UBSan (the executor tells ASan about fiber switches).

$(ASAN_DIR)/emu/%.o: emu/%.cpp $(DEPS_TRACKED) | deps-if-missing
	@mkdir -p $(@D)
	$(CXX) $(ASAN_CXXFLAGS) $(DEPFLAGS) -c $< -o $@

$(ASAN_DIR)/catch_main.o $(ASAN_DIR)/mpi_catch_main.o: $(ASAN_DIR)/%.o: test/%.cpp $(DEPS_TRACKED) | deps-if-missing
	@mkdir -p $(@D)
	$(CXX) $(ASAN_CXXFLAGS) $(DEPFLAGS) -c $< -o $@

$(addprefix $(ASAN_DIR)/,$(addsuffix .o,$(BF16_ONLY_TESTS))): PRECISION_DEFINE = -DPRECISION_BF16
$(ASAN_DIR)/test_%_fp32.o: PRECISION_DEFINE = -DPRECISION_FP32
$(ASAN_DIR)/test_%_fp32.o: test/test_%.cu $(DEPS_TRACKED) | deps-if-missing
	@mkdir -p $(@D)
	$(CXX) $(ASAN_CXXFLAGS) $(DEPFLAGS) -x c++ -c $< -o $@

$(ASAN_DIR)/test_%.o: test/test_%.cu $(DEPS_TRACKED) | deps-if-missing
	@mkdir -p $(@D)
	$(CXX) $(ASAN_CXXFLAGS) $(DEPFLAGS) -x c++ -c $< -o $@

$(ASAN_DIR)/second_unit_%.o: test/second_unit_%.cu $(DEPS_TRACKED) | deps-if-missing
	@mkdir -p $(@D)
	$(CXX) $(ASAN_CXXFLAGS) $(DEPFLAGS) -x c++ -c $< -o $@

$(foreach p,BF16 FP32,$(eval $(call host_library_rules,$(ASAN_DIR),$(p),ASAN_CXXFLAGS)))
$(foreach p,BF16 FP32,$(eval $(call kernel_library_rules,$(ASAN_DIR),$(p),ASAN_CXXFLAGS)))

$(ASAN_DIR)/test_%: $(ASAN_DIR)/test_%.o $$(call second_unit_of,test_$$*,$(ASAN_DIR)) \
  $(patsubst emu/%.cpp,$(ASAN_DIR)/emu/%.o,$(EMU_SRC)) $$(call catch_main_of,$$*,$(ASAN_DIR)) $$(call precision_libs,$(ASAN_DIR),$$(call precision_of,test_$$*))
	$(CXX) $(ASAN_CXXFLAGS) $< $(call second_unit_of,test_$*,$(ASAN_DIR)) $(call precision_libs,$(ASAN_DIR),$(call precision_of,test_$*)) \
	  $(patsubst emu/%.cpp,$(ASAN_DIR)/emu/%.o,$(EMU_SRC)) $(call catch_main_of,$*,$(ASAN_DIR)) $(CPU_LDLIBS) -o $@

$(ASAN_DIR)/train_gpt_cpu: train_gpt.cu $(DEPS_TRACKED) $(patsubst emu/%.cpp,$(ASAN_DIR)/emu/%.o,$(EMU_SRC)) \
  $(call precision_libs,$(ASAN_DIR),$(PRECISION))
	$(CXX) $(ASAN_CXXFLAGS) $(DEPFLAGS) -x c++ $< -x none $(call precision_libs,$(ASAN_DIR),$(PRECISION)) \
	  $(patsubst emu/%.cpp,$(ASAN_DIR)/emu/%.o,$(EMU_SRC)) $(CPU_LDLIBS) -o $@

# ASan checks memory use, which the precision does not change: BF16 binaries only (the _fp32 twins
# would add ~3 min of build and ~1.5 min of tests to CI), and not test_linkage (test/tests.cmake).
test-asan: deps-if-missing $(addprefix $(ASAN_DIR)/,train_gpt_cpu test_mpi_train test_model_suite) \
  $(addprefix $(ASAN_DIR)/,$(filter-out test_linkage,$(TEST_NAMES)))  # the longest first, as for make test
	$(call ctest_file,$(ASAN_DIR),OFF,ON)
	ASAN_OPTIONS=detect_leaks=0 ctest --test-dir $(ASAN_DIR) --output-on-failure -j2

# ---------------------------------------------------------------------------------------------

$(CPU_DIR)/emu_bench: dev/emu_bench.cu $(DEPS_TRACKED) $(CPU_DIR)/libcuemu.a
	$(CXX) $(CPU_CXXFLAGS) $(DEPFLAGS) -x c++ $< -x none $(CPU_DIR)/libcuemu.a $(CPU_LDLIBS) -o $@

emu-bench: $(CPU_DIR)/emu_bench
	CUEMU_THREADS=1 $<

# The CPU build as a trainer (scripts/cpu_bench.sh): GPT-2 124M, B=4, T=64, median s/step of the BF16
# and FP32 builds, against the step's matmuls alone (dev/gemm_limit.cu) measured in the same run.
.PHONY: cpu-bench
$(CPU_DIR)/gemm_limit: dev/gemm_limit.cu $(DEPS_TRACKED) $(call precision_libs,$(CPU_DIR),$(PRECISION)) $(CPU_DIR)/libcuemu.a
	$(CXX) $(CPU_CXXFLAGS) $(DEPFLAGS) -x c++ $< -x none $(call precision_libs,$(CPU_DIR),$(PRECISION)) $(CPU_DIR)/libcuemu.a \
	  $(CPU_LDLIBS) -o $@

cpu-bench: deps-if-missing $(DATA_DIR)/tokenizer.bin
	$(MAKE) --no-print-directory PRECISION=BF16 $(BUILD)/cpu/train_gpt_cpu $(BUILD)/cpu/gemm_limit
	$(MAKE) --no-print-directory PRECISION=FP32 $(BUILD)/cpu-fp32/train_gpt_cpu $(BUILD)/cpu-fp32/gemm_limit
	scripts/cpu_bench.sh $(BUILD)/cpu $(BUILD)/cpu-fp32

# The forward pass's logits for given tokens from an llm.c model file (dev/forward_logits.cu), in FP32
# (forward_logits_fp32) and in PRECISION (forward_logits): test/test_hf_interop.py compares them with
# transformers' GPT-2. make test builds both, like the test binaries.
$(addprefix $(CPU_DIR)/,$(addsuffix .o,$(FORWARD_LOGITS))): $(CPU_DIR)/%.o: dev/forward_logits.cu $(DEPS_TRACKED) | deps-if-missing
	@mkdir -p $(@D)
	$(CXX) $(CPU_CXXFLAGS) $(DEPFLAGS) -x c++ -c $< -o $@
$(CPU_DIR)/forward_logits_fp32.o: PRECISION_DEFINE = -DPRECISION_FP32
$(addprefix $(CPU_DIR)/,$(FORWARD_LOGITS)): $(CPU_DIR)/%: $(CPU_DIR)/%.o $$(call precision_libs,$(CPU_DIR),$$(call precision_of,$$*)) \
  $(CPU_DIR)/libcuemu.a
	$(CXX) $^ $(CPU_LDLIBS) -o $@
$(addprefix $(GPU_DIR)/,$(FORWARD_LOGITS)): $(GPU_DIR)/%: dev/forward_logits.cu $(DEPS_TRACKED) \
  $$(call precision_libs,$(GPU_DIR),$$(call precision_of,$$*)) | deps-if-missing
	@mkdir -p $(@D)
	$(NVCC) $(NVCCFLAGS) $(DEPFLAGS) -x cu $< -L$(GPU_DIR) -lhost-$(call precision_of,$*) $(GPU_LDLIBS) -o $@ \
	  2> $@.ptxas.log || { cat $@.ptxas.log; exit 1; }
	@scripts/check_spills.sh $@.ptxas.log
$(GPU_DIR)/forward_logits_fp32: PRECISION_DEFINE = -DPRECISION_FP32

# The attention forward's mma.sync and wgmma kernels timed at a model's shapes (dev/attention_bench.cu):
# scripts/gpu_check.sh's profile stage runs the GPU build; make test runs the CPU one at a small shape.
# BF16 (the kernels' precision) whatever PRECISION says; the GPU build is sm_80 and sm_90a machine code
# (wgmma needs the latter; override: also over scripts/gpu_prebuild.sh's sm_90).
$(CPU_DIR)/attention_bench: PRECISION_DEFINE = -DPRECISION_BF16
$(CPU_DIR)/attention_bench: dev/attention_bench.cu $(DEPS_TRACKED) $(call precision_libs,$(CPU_DIR),BF16) $(CPU_DIR)/libcuemu.a \
  | deps-if-missing
	$(CXX) $(CPU_CXXFLAGS) $(DEPFLAGS) -x c++ $< -x none $(call precision_libs,$(CPU_DIR),BF16) $(CPU_DIR)/libcuemu.a $(CPU_LDLIBS) -o $@
$(GPU_DIR)/attention_bench: PRECISION_DEFINE = -DPRECISION_BF16
$(GPU_DIR)/attention_bench: override GPU_ARCH = -gencode arch=compute_80,code=sm_80 -gencode arch=compute_90a,code=sm_90a
$(GPU_DIR)/attention_bench: dev/attention_bench.cu $(DEPS_TRACKED) $(call precision_libs,$(GPU_DIR),BF16) | deps-if-missing
	@mkdir -p $(@D)
	$(NVCC) $(NVCCFLAGS) $(DEPFLAGS) -x cu $< -L$(GPU_DIR) -lhost-BF16 $(GPU_LDLIBS) -o $@ \
	  2> $@.ptxas.log || { cat $@.ptxas.log; exit 1; }
	@scripts/check_spills.sh $@.ptxas.log

# The roofline of one training step at full size (dev/roofline.cu; dev/README.md has examples).
.PHONY: roofline kernel-report
$(CPU_DIR)/roofline: dev/roofline.cu $(DEPS_TRACKED) $(call precision_libs,$(CPU_DIR),$(PRECISION)) $(CPU_DIR)/libcuemu.a \
  | deps-if-missing
	$(CXX) $(CPU_CXXFLAGS) $(DEPFLAGS) -x c++ $< -x none $(call precision_libs,$(CPU_DIR),$(PRECISION)) $(CPU_DIR)/libcuemu.a \
	  $(CPU_LDLIBS) -o $@

roofline: $(CPU_DIR)/roofline

# Per kernel of the sm_90 build: registers, spills, static shared memory, theoretical H100
# occupancy (block sizes from recorded d12 steps, one per attention kind and tensor-core backward); fails on any spill
# (scripts/kernel_report.py).
$(GPU_DIR)/launches_%.json: $(CPU_DIR)/roofline
	@mkdir -p $(@D)
	$(CPU_DIR)/roofline -e d12 -b 4 -t 1024 -z 1 -w 8 -d 32768 --attention $* --launches-json $@ > /dev/null
$(GPU_DIR)/launches_tc_fused.json: $(CPU_DIR)/roofline
	@mkdir -p $(@D)
	$(CPU_DIR)/roofline -e d12 -b 4 -t 1024 -z 1 -w 8 -d 32768 --attention tc --attention-backward fused \
	  --launches-json $@ > /dev/null

$(GPU_DIR)/train_gpt_sm90.ptx: train_gpt.cu $(DEPS_TRACKED) | deps-if-missing
	@mkdir -p $(@D)
	$(NVCC) $(COMMON_FLAGS) $(DEPFLAGS) -O3 -arch=compute_90 -ptx $(MPI_INC) -x cu $< -o $@

kernel-report: $(GPU_DIR)/train_gpt $(GPU_DIR)/launches_tc.json $(GPU_DIR)/launches_tc_fused.json \
               $(GPU_DIR)/launches_simt.json $(GPU_DIR)/train_gpt_sm90.ptx
	python3 scripts/kernel_report.py --ptxas-log $(GPU_DIR)/train_gpt.ptxas.log --binary $(GPU_DIR)/train_gpt \
	  --launches $(GPU_DIR)/launches_tc.json $(GPU_DIR)/launches_tc_fused.json $(GPU_DIR)/launches_simt.json \
	  --ptx $(GPU_DIR)/train_gpt_sm90.ptx

# make train: a small GPT-2 ("mini" with one block: 128 channels, GPT-2's vocabulary) on Shakespeare,
# in about 10 minutes on 2 CPU cores (the GPU build when a GPU is present). Prints falling train and
# val loss and a text sample; writes out/mini_shakespeare/ (config.json, metrics.jsonl, checkpoints).
# The settings were picked by validation loss (README, "make train"): a 5e-3 peak held stable by 200
# warmup steps and beta2 0.99, beta1 0.8, linear decay to 0; at this budget 1, 2 and 4 blocks end alike
# at equal steps (64 and 192 channels worse), so the one-block model takes the most steps in the time;
# 16 sequences of 32 tokens a step learned faster than 8 of 64 (and 32 of 16 slower). The curve reads
# 32 validation batches (16384 tokens) every 500 steps, the last validation the whole split.
HAVE_GPU := $(shell nvidia-smi -L >/dev/null 2>&1 && echo yes)
TRAIN_BIN := $(if $(HAVE_GPU),./train_gpt,./train_gpt_cpu)$(ROOT_SUFFIX)
TRAIN_FLAGS ?= -e mini --layers 1 -b 16 -t 32 -x 2800 -l 5e-3 -u 200 -k linear -q 0 --beta1 0.8 --beta2 0.99 -c 0.2 \
               -v 500 -m 32 --final-val-batches 0 -s 2800 -g 31 --top-k 40 -n 500 -o out/mini_shakespeare

$(DATA_DIR)/tokenizer.bin: | deps-if-missing
	python3 data/prepare.py --out $(DATA_DIR)

train: deps-if-missing $(if $(HAVE_GPU),train_gpt,train_gpt_cpu) $(DATA_DIR)/tokenizer.bin
	$(TRAIN_BIN) $(TRAIN_FLAGS)

# Fuzzing (scripts/fuzz.sh): libFuzzer targets for every reader of untrusted files (test/fuzz/fuzz_*.cpp:
# model file, state file, token shard, tokenizer, HellaSwag file, --config JSON, matmul picks) built with clang under
# ASan + UBSan, each run for FUZZ_SECONDS from its committed seed corpus. Not run by CI; its last numbers
# are in the README. Needs clang (scripts/deps.sh --fuzz installs it).
.PHONY: fuzz
FUZZ_DIR := $(BUILD)/fuzz
FUZZ_SECONDS ?= 60
FUZZ_CXX ?= clang++
FUZZ_TARGETS := $(patsubst test/fuzz/fuzz_%.cpp,$(FUZZ_DIR)/fuzz_%,$(wildcard test/fuzz/fuzz_*.cpp))
FUZZ_FLAGS = -std=c++20 -I. -DPRECISION_BF16 -g -O1 -fno-omit-frame-pointer -fsanitize=address,undefined \
             -fno-sanitize-recover=undefined
$(FUZZ_DIR)/host/%.o: host/%.cpp $(DEPS_TRACKED)
	@mkdir -p $(@D)
	$(FUZZ_CXX) $(FUZZ_FLAGS) -fsanitize=fuzzer-no-link $(DEPFLAGS) -c $< -o $@
$(FUZZ_DIR)/fuzz_%: test/fuzz/fuzz_%.cpp $(patsubst host/%.cpp,$(FUZZ_DIR)/host/%.o,$(HOST_SRC)) $(DEPS_TRACKED)
	@mkdir -p $(@D)
	$(FUZZ_CXX) $(FUZZ_FLAGS) -fsanitize=fuzzer $(DEPFLAGS) $< $(patsubst host/%.cpp,$(FUZZ_DIR)/host/%.o,$(HOST_SRC)) \
	  -pthread -o $@
.SECONDARY: $(patsubst host/%.cpp,$(FUZZ_DIR)/host/%.o,$(HOST_SRC))
fuzz:
	@command -v $(FUZZ_CXX) >/dev/null 2>&1 || scripts/deps.sh --fuzz
	$(MAKE) --no-print-directory $(FUZZ_TARGETS)
	scripts/fuzz.sh $(FUZZ_DIR) $(FUZZ_SECONDS)

# The suite's mutation score (dev/mutation_test.py): each planted fault in dev/mutations/ is built in a
# scratch copy of the tree (build/mutation/) and must make one of its tests fail. Not run by CI
# (it rebuilds test binaries once per fault); its last score is in the README.
.PHONY: mutation-test
mutation-test: deps-if-missing
	python3 dev/mutation_test.py

clean:
	rm -rf $(BUILD) train_gpt train_gpt_cpu train_gpt_fp32 train_gpt_cpu_fp32

# The compilers' dependency lists (DEPFLAGS) of every build folder.
-include $(wildcard $(BUILD)/*/*.d $(BUILD)/*/emu/*.d $(BUILD)/*/host-*/*.d)
