// The MPI C API: the MPI library's own header, or, in builds without MPI (make MPI=0, which defines
// TRAIN_GPT_NO_MPI), parallel/single_process_mpi.h for a world of one process. Every file that calls
// MPI includes this header, never <mpi.h> directly, so the choice is made here once.
#pragma once

#ifdef TRAIN_GPT_NO_MPI
#include "parallel/single_process_mpi.h"
#else
#define OMPI_SKIP_MPICXX 1  // the deprecated MPI C++ bindings: unused, and noisy under -Wextra
#include <mpi.h>
#endif
