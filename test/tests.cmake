# The test suite, read by CTest through CMakeLists.txt or the CTestTestfile.cmake the Makefile
# writes. Expects TEST_BIN (folder of the test executables), GPU (ON for the nvcc build) and
# MPIRUN (an mpirun command line that may run as root and oversubscribe).

# MPI (ON unless the build has no MPI library, make MPI=0): without it, MPIRUN is test/no_mpi_launch.sh,
# which runs one-rank commands directly and reports anything of more ranks skipped (77); the tests that
# signal mpirun itself are skipped outright.
if(NOT DEFINED MPI)
  set(MPI ON)
endif()
if(NOT MPI)
  set(MPIRUN ${CMAKE_CURRENT_LIST_DIR}/no_mpi_launch.sh)
endif()
set(launched_tests)  # tests that run MPIRUN: skipped (77) past one rank without MPI (set at the end)
# The command that runs the tests of test/<name>.cu from the binary of precision suffix `suffix` ("" or
# "_fp32"): <name><suffix>, or for a file with the line "// built into: <suite>" (test/test_model_suite.cu),
# <suite><suffix> choosing the file's tests by Catch2's filename tag, then `ARGN` (more test specs).
function(test_command out name suffix)
  file(STRINGS ${CMAKE_CURRENT_LIST_DIR}/${name}.cu suite REGEX "^// built into: ")
  if(suite)
    string(REGEX REPLACE "^// built into: ([a-z0-9_]+).*" "\\1" suite "${suite}")
    list(JOIN ARGN "" more)
    set(${out} ${TEST_BIN}/${suite}${suffix} "-#" "[#${name}]${more}" PARENT_SCOPE)
  else()
    set(${out} ${TEST_BIN}/${name}${suffix} ${ARGN} PARENT_SCOPE)
  endif()
endfunction()
# A test that cannot run at all in this configuration: registered, and reported skipped with the reason.
function(add_skipped_test name reason)
  add_test(${name} sh -c "echo 'skipped: ${reason}'; exit 77")
  set_tests_properties(${name} PROPERTIES SKIP_RETURN_CODE 77)
endfunction()

# Every test executable fails a test case that executes no assertion (test/catch_main.cpp and the
# MPI tests' mains), and one that cannot run in a configuration exits with 77: CTest reports it
# skipped, never passed.

# Kernel-level tests run under every schedule order, with shared memory poisoned.
foreach(order forward reverse random)
  if(GPU AND NOT order STREQUAL "forward")
    continue()  # schedule orders mean nothing on a GPU: run once
  endif()
  add_test(test_executor_${order} ${TEST_BIN}/test_executor)
  set_tests_properties(test_executor_${order} PROPERTIES ENVIRONMENT "CUEMU_SCHEDULE=${order};CUEMU_SEED=12345;CUEMU_CHECK=1;CUEMU_RACECHECK=1")
endforeach()
# The emulated cuBLASLt launches no kernels: the schedule order cannot change it, so it runs once.
add_test(test_cublaslt ${TEST_BIN}/test_cublaslt)
set_tests_properties(test_cublaslt PROPERTIES ENVIRONMENT "CUEMU_RACECHECK=1")

# Kernel and model tests: built in both precisions (test_X and test_X_fp32), each run under every
# schedule order (reverse with the tensor cores' instructions, see below): every test/test_kernel_*.cu
# and test/test_model*.cu, except that a source with the line "// precision: BF16 only" has no FP32
# twin (the Makefile reads the same line).
# Under ASan only the BF16 binaries and the forward order (memory use depends on neither the precision
# nor the order in which the emulator runs blocks, and both run without ASan; see Makefile).
file(GLOB precision_test_sources ${CMAKE_CURRENT_LIST_DIR}/test_kernel_*.cu ${CMAKE_CURRENT_LIST_DIR}/test_model*.cu)
list(FILTER precision_test_sources EXCLUDE REGEX "_suite\\.cu$")  # test_model_suite.cu: its files are tests
foreach(source ${precision_test_sources})
  get_filename_component(t ${source} NAME_WE)
  file(STRINGS ${source} bf16_only REGEX "^// precision: BF16 only")
  foreach(suffix "" "_fp32")
    if(suffix STREQUAL "_fp32" AND (ASAN OR bf16_only))
      continue()
    endif()
    foreach(order forward reverse random)
      if((GPU OR ASAN) AND NOT order STREQUAL "forward")
        continue()
      endif()
      test_command(command ${t} "${suffix}")
      # The reverse order also runs the tensor cores' tile products as their ldmatrix and mma.sync
      # instructions (CUEMU_TENSOR_CORE=instructions), the other orders as one collective each.
      set(tensor_core tiles)
      if(order STREQUAL "reverse")
        set(tensor_core instructions)
      endif()
      add_test(${t}${suffix}_${order} ${command})
      set_tests_properties(${t}${suffix}_${order} PROPERTIES
        ENVIRONMENT "CUEMU_SCHEDULE=${order};CUEMU_SEED=12345;CUEMU_CHECK=1;CUEMU_RACECHECK=1;CUEMU_TENSOR_CORE=${tensor_core};TRAIN_GPT_ROOT=${CMAKE_CURRENT_LIST_DIR}/..")
    endforeach()
  endforeach()
endforeach()

# Emulator-only behaviour: deadlock detection, race exposure, launch limits, memory counters.
if(NOT GPU)
  add_test(test_emu_executor ${TEST_BIN}/test_emu_executor)
  add_test(test_emu_executor_2threads ${TEST_BIN}/test_emu_executor)
  set_tests_properties(test_emu_executor_2threads PROPERTIES ENVIRONMENT "CUEMU_THREADS=2")
  # The cross-stream race detector: planted stream-ordering bugs are caught, their fixed twins are not.
  test_command(racecheck test_emu_racecheck "")
  add_test(test_emu_racecheck ${racecheck})
  # Where a GPU's host would wait (cuemu::host_waits): a training step's waits do not grow with micro-steps.
  test_command(host_waits test_emu_host_waits "")
  add_test(test_emu_host_waits ${host_waits})
  set_tests_properties(test_emu_host_waits PROPERTIES ENVIRONMENT "CUEMU_RACECHECK=1")
  # Stream capture and CUDA graphs: CUDA's capture rules, and training steps replayed from graphs
  # equal to eager ones bitwise, under two schedule orders.
  test_command(graphs test_emu_graphs "")
  foreach(order forward random)
    add_test(test_emu_graphs_${order} ${graphs})
    set_tests_properties(test_emu_graphs_${order} PROPERTIES ENVIRONMENT "CUEMU_SCHEDULE=${order};CUEMU_SEED=12345;CUEMU_RACECHECK=1")
  endforeach()
endif()

# NCCL collectives across ranks (skipped, exit 77, on a GPU node with fewer GPUs than ranks), and on one.
foreach(np 1 2 3 4)  # 1: the single-rank path (no MPI work, a copy); 4: process grids of two axes
  add_test(test_mpi_nccl_np${np} ${MPIRUN} -np ${np} ${TEST_BIN}/test_mpi_nccl)
  set_tests_properties(test_mpi_nccl_np${np} PROPERTIES SKIP_RETURN_CODE 77 ENVIRONMENT "CUEMU_RACECHECK=1")
endforeach()
# A rank that fails a REQUIRE (or throws) aborts the job (mpi_test_util.h): the MPI tests end with a
# failure instead of hanging with the other ranks waiting in a collective. The hidden test case fails
# on rank 1 while rank 0 waits at a barrier: the test passes when the abort's message comes, and the
# timeout catches a hang. Skipped (77) without MPI (test/no_mpi_launch.sh).
add_test(mpi_rank_leaves ${MPIRUN} -np 2 ${TEST_BIN}/test_mpi_nccl "[.rank-leaves]")
set_tests_properties(mpi_rank_leaves PROPERTIES SKIP_RETURN_CODE 77 TIMEOUT 120
                     PASS_REGULAR_EXPRESSION "this rank left the test case early.*aborting the job")
list(APPEND launched_tests mpi_rank_leaves)

# Ring attention (parallel/context.h) over 1-4 context ranks, both precisions, against a double reference
# over the whole sequence: odd lengths split unevenly, and bitwise repeatable (skipped, 77, as above).
# The ring's own kernels (the merge, the row copies) run under every schedule order: forward at 1 and
# 4 ranks, reverse at 2, random at 3.
set(context_orders forward reverse random forward)
foreach(np 1 2 3 4)
  math(EXPR order_index "${np} - 1")
  list(GET context_orders ${order_index} order)
  foreach(suffix "" "_fp32")
    if(suffix STREQUAL "_fp32" AND ASAN)
      continue()
    endif()
    add_test(test_mpi_context${suffix}_np${np} ${MPIRUN} -np ${np} ${TEST_BIN}/test_mpi_context${suffix})
    set_tests_properties(test_mpi_context${suffix}_np${np} PROPERTIES SKIP_RETURN_CODE 77
                         ENVIRONMENT "CUEMU_RACECHECK=1;CUEMU_SCHEDULE=${order};CUEMU_SEED=12345")
  endforeach()
endforeach()

# Reference fixtures (dev/gpt2_reference.py): the test finds them from the repository root.
add_test(test_fixtures ${TEST_BIN}/test_fixtures)
set_tests_properties(test_fixtures PROPERTIES ENVIRONMENT "TRAIN_GPT_ROOT=${CMAKE_CURRENT_LIST_DIR}/..")

# Tests of the Python tools run none of this build's binaries: under ASan they would repeat the CPU
# build's runs unchanged (~55 s of ASan's suite, data_prepare most of it), so they run there only.
if(NOT ASAN)
  # Data preparation (data/prepare.py): GPT-2 token ids, shard and tokenizer file formats, text and
  # JSON-lines input, the validation split, 1 vs 2 workers, resuming after SIGKILL and Ctrl-C, bad input.
  # Needs scripts/install_python_deps.sh (about 5 MB from PyPI).
  add_test(data_prepare python3 ${CMAKE_CURRENT_LIST_DIR}/../data/test_prepare.py)
  # Its parquet input (FineWeb's format): skipped (77) where pyarrow, optional, is not installed.
  add_test(data_prepare_parquet python3 ${CMAKE_CURRENT_LIST_DIR}/../data/test_prepare_parquet.py)
  set_tests_properties(data_prepare_parquet PROPERTIES SKIP_RETURN_CODE 77)
  # scripts/plot_metrics.py: one four-panel PNG from a metrics.jsonl with a resumed step, a null loss and
  # a cut line (skipped, 77, where matplotlib is not installed).
  add_test(plot_metrics ${CMAKE_CURRENT_LIST_DIR}/test_plot_metrics.sh)
  set_tests_properties(plot_metrics PROPERTIES SKIP_RETURN_CODE 77)
  # scripts/profile_delta.py: per-kernel change between two --profile-step tables (the GPU check's
  # profile stage against the H100 profile of 2026-11-27).
  add_test(profile_delta python3 ${CMAKE_CURRENT_LIST_DIR}/test_profile_delta.py)
  # HellaSwag conversion (data/hellaswag.py): llm.c's eval file format, against the committed fixture.
  add_test(data_hellaswag python3 ${CMAKE_CURRENT_LIST_DIR}/../data/test_hellaswag.py)
endif()

# Host: llm.c token shards (DataLoader) and the tokenizer decoder; files written to a temp dir.
add_test(test_dataloader ${TEST_BIN}/test_dataloader)
add_test(test_tokenizer ${TEST_BIN}/test_tokenizer)

# Checkpoint files (host/checkpoint.h): llm.c model format, training state, directory policy.
add_test(test_checkpoint ${TEST_BIN}/test_checkpoint)

# Host modules of the training program: CLI + JSON config, LR and batch-size schedules, reporting.
add_test(test_config ${TEST_BIN}/test_config)
add_test(test_schedule ${TEST_BIN}/test_schedule)
add_test(test_process_groups ${TEST_BIN}/test_process_groups)
# Pipeline schedules (host/pipeline_schedule.h): every op once, the published bubble, activations held.
add_test(test_pipeline_schedule ${TEST_BIN}/test_pipeline_schedule)

# Every header can be included by two translation units of one program: test_linkage is built from
# test/test_linkage.cu and test/second_unit_linkage.cu, both including train_gpt.cu whole. Not under
# ASan: what it checks is the link, and its two units took ~110 s of ASan's build (the model pass it
# runs is under ASan in test_model).
if(NOT ASAN)
  add_test(test_linkage ${TEST_BIN}/test_linkage)
endif()

# The training step under mpirun (test_mpi_train.cu), both precisions: ranks, ZeRO stage and
# micro-steps per rank. The issue's equivalences (same global batch): 1 rank; 1 rank x 4 micro-steps;
# 2 ranks ZeRO-1; 4 ranks ZeRO-2 x 2 micro-steps; 3 ranks ZeRO-1 (shard padding). Masked targets
# spread unevenly: 1 rank x 3 micro-steps and 3 ranks, both at stage 0 (full gradients to compare).
set(train_configs "1,0,1" "1,0,4" "2,1,1" "4,2,2" "3,1,1" "1,0,3" "3,0,1")
set(train_precisions bf16 fp32)
if(ASAN)  # the emulated training runs 15-25x slower under ASan: 2 ranks, ZeRO-2, 2 micro-steps (its
  # baseline is the one-rank run; the program's one-rank step runs in test_train_smoke), BF16 only
  set(train_configs "2,2,2")
  set(train_precisions bf16)
endif()
# One configuration of test_mpi_train in each of train_precisions: test_mpi_train[_fp32]_np<np><tail>
# on np ranks, with the environment `env` (a ;-list; the race detector and the repository root added).
macro(add_train_test np tail env)
  foreach(precision IN LISTS train_precisions)
    set(suffix "")
    if(precision STREQUAL "fp32")
      set(suffix "_fp32")
    endif()
    set(name test_mpi_train${suffix}_np${np}${tail})
    add_test(${name} ${MPIRUN} -np ${np} ${TEST_BIN}/test_mpi_train${suffix})
    list(APPEND launched_tests ${name})
    set_tests_properties(${name} PROPERTIES
      ENVIRONMENT "CUEMU_RACECHECK=1;${env};TRAIN_GPT_ROOT=${CMAKE_CURRENT_LIST_DIR}/..")
  endforeach()
endmacro()
foreach(config IN LISTS train_configs)
  string(REPLACE "," ";" config "${config}")
  list(GET config 0 np)
  list(GET config 1 zero)
  list(GET config 2 accum)
  add_train_test(${np} "_zero${zero}_accum${accum}" "TRAIN_ZERO=${zero};TRAIN_ACCUM=${accum}")
endforeach()

# Tensor and pipeline parallelism (the [tp] case of test_mpi_train.cu) against one process on the same
# global batch: ranks, ZeRO stage, micro-batches per data rank, pipeline stages, schedule, recompute
# mode, tensor ranks, sequence parallelism, model chunks per stage. BF16 runs the tensor-core
# attention, FP32 the SIMT one.
# Tensor parallelism's set: tp 2 and tp 4 on one data rank, 2 data x 2 tensor with ZeRO-1 and
# accumulation, tp 2 with full recompute; with and without sequence parallelism; and ZeRO-2 with
# selective recompute.
set(model_parallel_configs "2,0,1,1,-,none,2,off,1" "2,0,1,1,-,none,2,on,1" "4,0,1,1,-,none,4,on,1"
                           "4,0,1,1,-,full,4,off,1" "4,1,2,1,-,none,2,on,1" "2,0,1,1,-,full,2,on,1"
                           "4,2,1,1,-,selective,2,on,1")
# Pipeline parallelism's: pp 2 and pp 4 with each schedule (interleaved with 2 chunks), 2 data x 2
# stages with ZeRO-1, 2 stages x 2 tensor ranks (with and without sequence parallelism); and 3 stages
# (more layers on the first), full and selective recompute, 2 x 2 x 2 (3D), 3 chunks, ZeRO-2 (layers
# reduced after each backward pass).
list(APPEND model_parallel_configs
     "2,0,4,2,afab,none,1,off,1" "2,0,4,2,1f1b,full,1,off,1" "4,0,4,4,afab,none,1,off,1"
     "4,0,4,4,1f1b,selective,1,off,1" "4,1,4,2,1f1b,none,1,off,1" "3,0,3,3,1f1b,none,1,off,1"
     "4,0,4,2,1f1b,none,2,off,1" "4,0,4,2,afab,none,2,on,1" "8,1,2,2,1f1b,selective,2,on,1"
     "2,0,4,2,interleaved,none,1,off,2" "4,0,8,4,interleaved,none,1,off,2" "4,1,4,2,interleaved,none,1,off,2"
     "4,0,4,2,interleaved,selective,2,on,2" "2,0,6,2,interleaved,full,1,off,3"
     "4,2,4,2,1f1b,none,1,off,1" "4,2,4,2,interleaved,none,1,off,2")
if(ASAN)
  set(model_parallel_configs "2,0,1,1,-,none,2,on,1" "2,0,4,2,1f1b,none,1,off,1")
endif()
foreach(config IN LISTS model_parallel_configs)
  string(REPLACE "," ";" config "${config}")
  list(GET config 0 np)
  list(GET config 1 zero)
  list(GET config 2 accum)
  list(GET config 3 pp)
  list(GET config 4 schedule)
  list(GET config 5 recompute)
  list(GET config 6 tp)
  list(GET config 7 sp)
  list(GET config 8 chunks)
  set(layout "")
  if(pp GREATER 1)
    set(layout "_pp${pp}_${schedule}")
    if(chunks GREATER 1)
      set(layout "${layout}${chunks}")
    endif()
  else()
    set(schedule "1f1b")
  endif()
  if(tp GREATER 1)
    set(layout "${layout}_tp${tp}")
    if(sp STREQUAL "on")
      set(layout "${layout}_sp")
    endif()
  endif()
  add_train_test(${np} "${layout}_zero${zero}_accum${accum}_${recompute}"
                 "TRAIN_ZERO=${zero};TRAIN_ACCUM=${accum};TRAIN_PP=${pp};TRAIN_PP_SCHEDULE=${schedule};TRAIN_PP_VIRTUAL=${chunks};TRAIN_RECOMPUTE=${recompute};TRAIN_TP=${tp};TRAIN_SEQUENCE_PARALLEL=${sp}")
endforeach()

# Context parallelism (the [cp] case of test_mpi_train.cu) against one process on the same global batch:
# ranks, ZeRO stage, micro-batches per data rank, context ranks, recompute mode, tensor ranks, sequence
# parallelism, documents (--doc-mask and --doc-positions, crossing the chunks), pipeline stages and
# schedule. cp 2 and cp 4 alone, 2 data x 2 context ranks with ZeRO-1 and accumulation, ZeRO-2 with full
# recompute, cp 4 selective; 2 context x 2 tensor ranks with and without sequence parallelism, and 2 data
# x 2 context x 2 tensor (8 ranks) with ZeRO-1, accumulation and selective recompute; documents at cp 2,
# cp 4 (ZeRO-1, full recompute) and 2 context x 2 tensor. With pipeline stages: 2 context x 2 stages
# (1F1B; AFAB with documents, ZeRO-1 and selective recompute), 2 data x 2 stages x 2 context, and 2
# stages x 2 context x 2 tensor with sequence parallelism, ZeRO-2 and full recompute (4D but data). The
# last field names the attention kernels: simt, or tc (the tensor-core kernels, BF16 only: no FP32 twin)
# at cp 2 with and without documents, and 2 data x 2 context with ZeRO-1, accumulation and selective
# recompute. One context group at ZeRO-0 with one micro-step and no documents (cp 2 and 4 on the SIMT
# kernels, cp 2 on the tensor cores) also runs the PyTorch fixture's AdamW steps ([cp-pytorch]).
set(context_parallel_configs "2,0,1,2,none,1,off,off,1,-,simt" "4,0,1,4,none,1,off,off,1,-,simt"
                             "4,1,2,2,none,1,off,off,1,-,simt" "2,2,1,2,full,1,off,off,1,-,simt"
                             "4,0,1,4,selective,1,off,off,1,-,simt" "4,0,1,2,none,2,on,off,1,-,simt"
                             "4,1,1,2,full,2,off,off,1,-,simt" "8,1,2,2,selective,2,on,off,1,-,simt"
                             "2,0,1,2,none,1,off,on,1,-,simt" "4,1,2,4,full,1,off,on,1,-,simt"
                             "4,0,1,2,none,2,on,on,1,-,simt" "4,0,4,2,none,1,off,off,2,1f1b,simt"
                             "4,1,4,2,selective,1,off,on,2,afab,simt" "8,1,2,2,none,1,off,off,2,1f1b,simt"
                             "8,2,4,2,full,2,on,off,2,1f1b,simt" "2,0,1,2,none,1,off,on,1,-,tc"
                             "4,1,2,2,selective,1,off,off,1,-,tc" "2,0,1,2,none,1,off,off,1,-,tc")
if(ASAN)
  set(context_parallel_configs "2,0,1,2,none,1,off,on,1,-,simt")
endif()
set(all_train_precisions ${train_precisions})
foreach(config IN LISTS context_parallel_configs)
  string(REPLACE "," ";" config "${config}")
  list(GET config 0 np)
  list(GET config 1 zero)
  list(GET config 2 accum)
  list(GET config 3 cp)
  list(GET config 4 recompute)
  list(GET config 5 tp)
  list(GET config 6 sp)
  list(GET config 7 docs)
  list(GET config 8 pp)
  list(GET config 9 schedule)
  list(GET config 10 attention)
  set(layout "_cp${cp}")
  if(pp GREATER 1)
    set(layout "_pp${pp}_${schedule}${layout}")
  else()
    set(schedule "1f1b")
  endif()
  if(tp GREATER 1)
    set(layout "${layout}_tp${tp}")
    if(sp STREQUAL "on")
      set(layout "${layout}_sp")
    endif()
  endif()
  if(docs STREQUAL "on")
    set(layout "${layout}_docs")
  endif()
  set(train_precisions ${all_train_precisions})
  if(attention STREQUAL "tc")
    set(layout "${layout}_tc")
    set(train_precisions bf16)
  endif()
  add_train_test(${np} "${layout}_zero${zero}_accum${accum}_${recompute}"
                 "TRAIN_ZERO=${zero};TRAIN_ACCUM=${accum};TRAIN_CP=${cp};TRAIN_RECOMPUTE=${recompute};TRAIN_TP=${tp};TRAIN_SEQUENCE_PARALLEL=${sp};TRAIN_DOCS=${docs};TRAIN_PP=${pp};TRAIN_PP_SCHEDULE=${schedule};TRAIN_ATTENTION=${attention}")
endforeach()
set(train_precisions ${all_train_precisions})

# Resume through the program: bitwise equal to an uninterrupted run, and on a different rank count.
if(GPU)
  set(train_binary ${TEST_BIN}/train_gpt)
else()
  set(train_binary ${TEST_BIN}/train_gpt_cpu)
endif()
string(REPLACE ";" " " mpirun_line "${MPIRUN}")
if(NOT ASAN)  # 2 min under ASan; its file code runs there in test_checkpoint, the program in test_train_smoke
  add_test(test_resume ${CMAKE_CURRENT_LIST_DIR}/test_resume.sh ${train_binary} "${mpirun_line}")
  list(APPEND launched_tests test_resume)
endif()
# The program on many grids: --cuda-graphs (steps replayed from CUDA graphs on 2 ranks equal eager ones
# byte for byte); --tp (2 data x 2 tensor ranks train like 2 data ranks); --cp (2 context ranks train
# like one, 2 data x 2 context like 2 data ranks, with stages and tensor ranks too; resume across grids;
# the dry run's plan); --pp; and what each cannot do is refused. Not under ASan: 30-40 program runs,
# 5.5 min of CI there; the same code runs under ASan in test_mpi_train's tp, pp and cp configurations
# and the program's host code in test_train_smoke.
if(NOT ASAN)
  foreach(t test_cuda_graphs test_tensor_parallel test_context_parallel test_pipeline_parallel)
    add_test(${t} ${CMAKE_CURRENT_LIST_DIR}/${t}.sh ${train_binary} "${mpirun_line}")
    list(APPEND launched_tests ${t})
    set_tests_properties(${t} PROPERTIES ENVIRONMENT "CUEMU_RACECHECK=1")
  endforeach()
endif()
add_test(test_train_smoke ${CMAKE_CURRENT_LIST_DIR}/test_train_smoke.sh ${train_binary})
# Run identity across resumes (host/run_identity.h): a fresh run over checkpoints, changed identity
# settings, --resume-override, --overwrite.
if(NOT ASAN)  # six short runs of the program
  add_test(run_identity ${CMAKE_CURRENT_LIST_DIR}/test_run_identity.sh ${train_binary})
  set_tests_properties(run_identity PROPERTIES ENVIRONMENT "CUEMU_RACECHECK=1")
endif()
# --matmul-autotune's picks kept in a file (host/matmul_algos.h): written, taken without timing, resumed
# byte for byte, another device's timed over, a broken file refused, a file per rank.
if(NOT ASAN)  # ten short runs of the program; ~8 s
  add_test(matmul_algos ${CMAKE_CURRENT_LIST_DIR}/test_matmul_algos.sh ${train_binary} "${mpirun_line}")
  set_tests_properties(matmul_algos PROPERTIES ENVIRONMENT "CUEMU_RACECHECK=1")
  list(APPEND launched_tests matmul_algos)
endif()
# Preemption (host/preemption.h): SIGTERM, or SIGUSR1 through mpirun and scripts/run_gpt2.sh, stops
# after the step with a checkpoint and exit status 75; -y resumes there.
if(NOT MPI)
  add_skipped_test(preemption "its second half signals mpirun; this build has no MPI (make MPI=0)")
elseif(NOT ASAN)  # program runs stopped by signals; ~7 s
  add_test(preemption ${CMAKE_CURRENT_LIST_DIR}/test_preemption.sh ${train_binary} "${mpirun_line}")
  set_tests_properties(preemption PROPERTIES ENVIRONMENT "CUEMU_RACECHECK=1")
endif()
# A checkpoint that cannot be written (a failed write; too little free space) leaves no file and
# training goes on. no-space mounts a tmpfs: skipped (77) where that is not allowed.
if(NOT ASAN)  # program runs writing ~47 MB checkpoints
  add_test(disk_write_error ${CMAKE_CURRENT_LIST_DIR}/test_disk_full.sh write-error ${train_binary})
  add_test(disk_no_space ${CMAKE_CURRENT_LIST_DIR}/test_disk_full.sh no-space ${train_binary})
  # A bit flipped on its way to the disk (a preloaded pwrite): the read-back of --keep-last finds it.
  add_test(disk_silent_corruption ${CMAKE_CURRENT_LIST_DIR}/test_disk_full.sh silent-corruption ${train_binary})
  set_tests_properties(disk_write_error disk_no_space disk_silent_corruption PROPERTIES ENVIRONMENT "CUEMU_RACECHECK=1"
                       SKIP_RETURN_CODE 77)
endif()
# kill -9 at random moments (seeded), resumed with -y until done: the final model and state equal an
# uninterrupted run's byte for byte, on 1 rank and on 2 ranks at ZeRO-1 with one rank killed.
if(NOT ASAN)  # ~20 interrupted program runs: ~35 s here
  add_test(kill_resume ${CMAKE_CURRENT_LIST_DIR}/test_kill_resume.sh ${train_binary} "${mpirun_line}")
  set_tests_properties(kill_resume PROPERTIES ENVIRONMENT "CUEMU_RACECHECK=1")
  list(APPEND launched_tests kill_resume)
endif()
# The watchdog (host/watchdog.h): one of 2 ranks stopped with SIGSTOP ends the whole job, non-zero,
# within --collective-timeout 3 s + 10 s, naming the rank and the operation.
if(NOT MPI)
  add_skipped_test(watchdog "it stops one of 2 ranks; this build has no MPI (make MPI=0)")
elseif(NOT ASAN)
  add_test(watchdog ${CMAKE_CURRENT_LIST_DIR}/test_watchdog.sh ${train_binary} "${mpirun_line}")
  set_tests_properties(watchdog PROPERTIES ENVIRONMENT "CUEMU_RACECHECK=1")
endif()
# --generate (train_gpt.cu's generate(), host/generation.h): the same tokens with and without the
# key/value cache, text and id prompts, -e RUN_DIR, the context limit, the flag mistakes.
if(NOT ASAN)  # ~12 short runs of the program: ~15 s here
  add_test(generate ${CMAKE_CURRENT_LIST_DIR}/test_generate.sh ${train_binary})
  set_tests_properties(generate PROPERTIES ENVIRONMENT "CUEMU_RACECHECK=1")
endif()
# Hugging Face interop (scripts/hf_convert.py): a trained model exported loads in transformers with our
# forward's logits (dev/forward_logits.cu, FP32 build) within 1e-5; imports are bit-exact and fine-tune
# with -e; bad inputs give one-line errors. Skipped (77) where torch or transformers is not installed
# (the README says how). Not under ASan: the converter is Python, and forward_logits is train_gpt's forward.
if(NOT ASAN)
  add_test(hf_interop python3 ${CMAKE_CURRENT_LIST_DIR}/test_hf_interop.py ${TEST_BIN} ${train_binary})
  set_tests_properties(hf_interop PROPERTIES SKIP_RETURN_CODE 77 ENVIRONMENT "CUEMU_RACECHECK=1")
endif()
# The offline build (make MPI=0 with the dependencies' headers from a prefix, as scripts/gpu_check.sh
# builds on a GPU node without packages; the Makefile's no-mpi-check-build): no libmpi linked, no MPI or
# dependency header read from /usr/include, the same model as this build after 3 steps, byte for byte,
# its tests pass on one rank, and mpirun with 2 ranks is refused with one line. Make's CPU suite only.
if(DEFINED NO_MPI_BUILD AND MPI AND NOT GPU AND NOT ASAN)
  add_test(no_mpi_build ${CMAKE_CURRENT_LIST_DIR}/test_no_mpi_build.sh ${NO_MPI_BUILD} ${NO_MPI_DEPS} ${train_binary}
           "${mpirun_line}")
  set_tests_properties(no_mpi_build PROPERTIES ENVIRONMENT "CUEMU_RACECHECK=1")
endif()
# Every token of the data below the vocabulary, checked before the first step (DataLoader::check_tokens).
add_test(data_check ${CMAKE_CURRENT_LIST_DIR}/test_data_check.sh ${train_binary})
set_tests_properties(data_check PROPERTIES ENVIRONMENT "CUEMU_RACECHECK=1")
# Divergence (host/divergence.h): the guard's rules; through the program, a blown-up run stops with a
# non-zero exit and no checkpoint of non-finite parameters, a NaN model file is refused, and
# --on-divergence rollback skips a diverged data window and finishes.
add_test(test_divergence ${TEST_BIN}/test_divergence)
if(NOT ASAN)  # eight runs of the program: ~30 s here, many minutes under ASan (test_train_smoke covers its code there)
  add_test(divergence_program ${CMAKE_CURRENT_LIST_DIR}/test_divergence.sh ${train_binary})
  set_tests_properties(divergence_program PROPERTIES ENVIRONMENT "CUEMU_RACECHECK=1")
endif()

# The memory plan against the seeds' accounting (test_memory_plan.cu); --dry-run plans GPT-2 1.5B
# without allocating it; a run whose plan does not fit stops with the plan before allocating.
test_command(memory_plan test_memory_plan "")
add_test(test_memory_plan ${memory_plan})
add_test(dry_run_d48 ${train_binary} -e d48 -b 16 -t 1024 --world-size 8 -z 1 -r full --dry-run --json)
set_tests_properties(dry_run_d48 PROPERTIES PASS_REGULAR_EXPRESSION "\"parameters\": 1557686400")
# --layers/--heads/--channels reshape a preset: 24 x 2048 channels has 50304 x 2048 + 1024 x 2048 +
# 24 x (12 x 2048^2 + 13 x 2048) + 2 x 2048 = 1,313,722,368 parameters (GPT-2's per-layer count).
add_test(dry_run_shape_flags ${train_binary} -e d12 --layers 24 --heads 16 --channels 2048 -b 8 -t 1024 --world-size 8
         -z 1 --dry-run --json)
set_tests_properties(dry_run_shape_flags PROPERTIES PASS_REGULAR_EXPRESSION "\"parameters\": 1313722368")
# A 6.7B GPT-2 shape (32 x 4096 channels, 32 heads): 6,654,402,560 parameters by the same count, planned
# on 64 ranks (C = 4096 is within LayerNorm's 8192).
add_test(dry_run_6p7b ${train_binary} -e d12 --layers 32 --heads 32 --channels 4096 -b 4 -t 1024 --world-size 64 -z 1
         -r full --dry-run --json)
set_tests_properties(dry_run_6p7b PROPERTIES PASS_REGULAR_EXPRESSION "\"parameters\": 6654402560")
# --pp-print-schedule: GPT-2 1.5B on 16 ranks as 4 data x 4 pipeline stages, 16 micro-batches, 1F1B:
# the bubble (4-1)/(16+4-1) = 0.1579. A stage per layer at most: more stages than layers is refused.
add_test(pp_print_schedule ${train_binary} -e d48 -b 16 -t 1024 -d 1048576 --world-size 16 --pp 4 --pp-print-schedule)
set_tests_properties(pp_print_schedule PROPERTIES PASS_REGULAR_EXPRESSION
                     "rank 0 +\\|  F0  F1  F2  F3   \\.   \\.   \\.  B0  F4 .*bubble: 0.1579 of the rank-slots idle, formula 0.1579")
add_test(pp_more_stages_than_layers ${CMAKE_CURRENT_LIST_DIR}/expect_failure.sh "--pp 4: the model has 2 layers"
         ${train_binary} -e tiny -b 2 -t 32 --pp 4 --world-size 4 --dry-run)
add_test(plan_does_not_fit ${CMAKE_CURRENT_LIST_DIR}/expect_failure.sh "more than the .* available"
         ${train_binary} -e tiny -b 4 -t 64 --max-memory 0.01)

# Launch recording, the emulator's record-only mode (the executed and the record-only step record
# the same launches) and the roofline arithmetic (dev/roofline.cu); then --profile-step's table.
if(GPU)  # two calibrations record d48 steps in record-only mode, which only the emulator has
  test_command(roofline test_roofline "" "~[record-only]")
  add_test(test_roofline ${roofline})
  add_skipped_test(test_roofline_calibration "record-only mode, d48 steps recorded and not run, exists in the emulator alone")
else()
  test_command(roofline test_roofline "")
  add_test(test_roofline ${roofline})
endif()
add_test(test_profile_step ${CMAKE_CURRENT_LIST_DIR}/test_profile_step.sh ${train_binary})
# The libraries' time per kernel family (dev/bench/library_baselines.py), run on the CPU: skipped (77)
# without PyTorch.
if(NOT ASAN)
  add_test(library_baselines ${CMAKE_CURRENT_LIST_DIR}/test_library_baselines.sh)
  set_tests_properties(library_baselines PROPERTIES SKIP_RETURN_CODE 77)
endif()

# The attention forward's two tensor-core kernels (dev/attention_bench.cu) on the same inputs: they must
# agree to bf16 rounding, with finite outputs. Here at a small shape (its times mean nothing in the
# emulator); on a GPU at d12's heads, skipped (77) where the GPU is not sm_90. Not under ASan: the kernels
# run there in their own tests.
if(NOT ASAN)
  if(GPU)
    add_test(attention_bench ${TEST_BIN}/attention_bench -e d12 -b 8 -t 1024 --iters 5 --require-wgmma)
  else()
    add_test(attention_bench ${TEST_BIN}/attention_bench -e mini -b 1 -t 200 --iters 1 --require-wgmma)
  endif()
  set_tests_properties(attention_bench PROPERTIES SKIP_RETURN_CODE 77 ENVIRONMENT "CUEMU_RACECHECK=1")
endif()

# The tensor-core fragment layouts (kernels/tensor_core.cuh, emu/tensor_core.cpp) against CuTe's, read
# from the headers the nvidia-cutlass package ships (dev/check_mma_layouts.py; dev/requirements.txt).
if(NOT ASAN)  # Python only, like the data tests above
  add_test(check_mma_layouts python3 ${CMAKE_CURRENT_LIST_DIR}/../dev/check_mma_layouts.py)
endif()

# Every training, resume and profile run of the program runs with the race detector on.
set_tests_properties(test_train_smoke test_profile_step PROPERTIES ENVIRONMENT "CUEMU_RACECHECK=1")
# test_roofline also reads the first H100 run's measurements (docs/gpu_check_2026-11-27_h100/).
set_tests_properties(test_roofline PROPERTIES ENVIRONMENT "CUEMU_RACECHECK=1;TRAIN_GPT_ROOT=${CMAKE_CURRENT_LIST_DIR}/..")
if(NOT ASAN)
  set_tests_properties(test_resume PROPERTIES ENVIRONMENT "CUEMU_RACECHECK=1")
endif()

# Every planted fault of make mutation-test (dev/mutations/*.mut) still applies to today's code: a
# rule that no longer matches would plant nothing. (The score itself rebuilds once per fault: not
# run here; the README has the last one.)
if(NOT ASAN)  # Python only, like the data tests above
  add_test(mutations_apply python3 ${CMAKE_CURRENT_LIST_DIR}/../dev/mutation_test.py --check)
endif()

if(NOT MPI AND launched_tests)
  set_tests_properties(${launched_tests} PROPERTIES SKIP_RETURN_CODE 77)
endif()
