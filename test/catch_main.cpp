// Catch2's main, compiled once for all test executables that do not need MPI.
#define CATCH_CONFIG_MAIN
#include <catch2/catch.hpp>
