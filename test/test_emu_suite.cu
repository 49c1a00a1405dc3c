// One test program, one translation unit, for the emulator's tests that run training steps of the whole
// model (as test/test_model_suite.cu does for the model's tests: one compilation of train_gpt.cu, not
// three). CTest runs each file's tests by its Catch2 -# tag ("[#test_emu_graphs]").
#include "test_emu_graphs.cu"
#include "test_emu_host_waits.cu"
#include "test_emu_racecheck.cu"
