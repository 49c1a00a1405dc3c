// One test program, one translation unit, for the test files that run the whole model. Each of them
// includes train_gpt.cu whole, and compiling that is most of a unit's build (~40 s at -O3, ~65 s under
// ASan, on 2 cores): built apart, these five took ~150 s of CI's CPU time per build, together ~55.
// Each file keeps its own tests; CTest runs them by file (Catch2's -# tags: "[#test_model]").
// A file listed here carries the line "// built into: test_model_suite", and the Makefile, CMakeLists.txt
// and test/tests.cmake build no program of its own for it.
#include "test_model.cu"
#include "test_model_generate.cu"
#include "test_model_hellaswag.cu"
#include "test_memory_plan.cu"
#include "test_roofline.cu"
