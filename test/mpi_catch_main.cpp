// Catch2's implementation for the tests run under mpirun (test_mpi_*), compiled once per build folder
// instead of inside each of them (test_mpi_nccl.o compiled in 51 s on one core with it, 16 s without),
// with the listener their ranks need. Their mains set up MPI and their groups, then call
// run_catch_session (test/mpi_test_util.h).
#define CATCH_CONFIG_RUNNER
#include <catch2/catch.hpp>

#include <cstdio>
#include <cstdlib>
#include <string>

#include "parallel/mpi_api.h"

namespace {

// A rank that leaves a test case early (a failed REQUIRE, an unexpected exception, a fatal signal) has
// also left the collectives its peers are in, and they would wait for it forever. (Seen: rank 0's
// single-process baseline threw on an emulated cuBLASLt failure under memory pressure, and the np2 and
// np4 runs hung for 20 minutes.) So once Catch has reported such a test case, its rank aborts the job:
// mpirun ends every rank and exits non-zero. A failed CHECK goes on, as the ranks do.
struct AbortJobWhenARankLeaves : Catch::TestEventListenerBase {
    using TestEventListenerBase::TestEventListenerBase;
    bool left_early = false;
    bool assertionEnded(const Catch::AssertionStats& stats) override {
        const Catch::AssertionResult& r = stats.assertionResult;
        if (!r.isOk() && (r.getResultType() == Catch::ResultWas::ThrewException ||
                          r.getResultType() == Catch::ResultWas::FatalErrorCondition ||
                          !Catch::shouldContinueOnFailure(r.m_info.resultDisposition)))
            left_early = true;
        return true;
    }
    void testCaseEnded(const Catch::TestCaseStats& stats) override {
        if (!left_early) return;
        std::fflush(stdout);
        std::fprintf(stderr, "%s: this rank left the test case early (a failed REQUIRE or an exception, reported above); "
                             "aborting the job, whose other ranks would wait for it\n",
                     stats.testInfo.name.c_str());
        std::fflush(stderr);
        MPI_Abort(MPI_COMM_WORLD, EXIT_FAILURE);
    }
};

}  // namespace

CATCH_REGISTER_LISTENER(AbortJobWhenARankLeaves)

// Declared in test/mpi_test_util.h.
int run_catch_session(int argc, char** argv, const std::string& name) {
    Catch::Session session;
    int failed = session.applyCommandLine(argc, argv);
    if (failed != 0) return failed;
    Catch::ConfigData config = session.configData();
    config.name = name;  // names the rank in its failure reports
    config.warnings = Catch::WarnAbout::What(config.warnings | Catch::WarnAbout::NoAssertions);  // checks nothing: fails
    session.useConfigData(config);
    return session.run();
}
