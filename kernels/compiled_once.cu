// The CPU build's one unit for the kernel launchers the headers list as COMPILED_ONCE (see
// kernels/cuda_common.h): their explicit instantiations, per build folder and precision, linked into
// every CPU program and test as libkernels-<precision>.a. nvcc never compiles this file.
#define KERNELS_COMPILED_HERE
#include "attention.cuh"
#include "attention_tc.cuh"
