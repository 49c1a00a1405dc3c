// Catch2's main, compiled once for all test executables that do not need MPI. A test case that
// executes no assertion fails (Catch2's NoAssertions warning, always on): it cannot have checked
// anything, and must not count as passed.
#define CATCH_CONFIG_RUNNER
#include <catch2/catch.hpp>

int main(int argc, char** argv) {
    Catch::Session session;
    if (const int failed = session.applyCommandLine(argc, argv)) return failed;
    Catch::ConfigData config = session.configData();
    config.warnings = Catch::WarnAbout::What(config.warnings | Catch::WarnAbout::NoAssertions);
    session.useConfigData(config);
    return session.run();
}
