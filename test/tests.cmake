# The test suite, read by CTest through CMakeLists.txt or the CTestTestfile.cmake the Makefile
# writes. Expects TEST_BIN (folder of the test executables), GPU (ON for the nvcc build) and
# MPIRUN (an mpirun command line that may run as root and oversubscribe).

# Kernel-level tests run under every schedule order, with shared memory poisoned.
foreach(order forward reverse random)
  set(env "CUEMU_SCHEDULE=${order};CUEMU_SEED=12345;CUEMU_CHECK=1")
  foreach(t test_executor test_cublaslt)
    if(GPU AND NOT order STREQUAL "forward")
      continue()  # schedule orders mean nothing on a GPU: run once
    endif()
    add_test(${t}_${order} ${TEST_BIN}/${t})
    set_tests_properties(${t}_${order} PROPERTIES ENVIRONMENT "${env}")
  endforeach()
endforeach()

# Emulator-only behaviour: deadlock detection, race exposure, launch limits, memory counters.
if(NOT GPU)
  add_test(test_emu_executor ${TEST_BIN}/test_emu_executor)
  add_test(test_emu_executor_2threads ${TEST_BIN}/test_emu_executor)
  set_tests_properties(test_emu_executor_2threads PROPERTIES ENVIRONMENT "CUEMU_THREADS=2")
endif()

# NCCL collectives across ranks.
foreach(np 2 3)
  add_test(test_mpi_nccl_np${np} ${MPIRUN} -np ${np} ${TEST_BIN}/test_mpi_nccl)
endforeach()

# Reference fixtures (dev/gpt2_reference.py): the test finds them from the repository root.
add_test(test_fixtures ${TEST_BIN}/test_fixtures)
set_tests_properties(test_fixtures PROPERTIES ENVIRONMENT "TRAIN_GPT_ROOT=${CMAKE_CURRENT_LIST_DIR}/..")
