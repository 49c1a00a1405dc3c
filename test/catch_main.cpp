// Catch2's main, compiled once for all test executables that do not need MPI. A test case that
// executes no assertion fails (Catch2's NoAssertions warning, always on): it cannot have checked
// anything, and must not count as passed. So does a run whose filter matches no test case (a test
// program of several files runs each file's tests by its tag, test/tests.cmake: a renamed file's tag
// would otherwise pass by running nothing).
#define CATCH_CONFIG_RUNNER
#include <catch2/catch.hpp>

#include <cstdio>

namespace {

struct CountTestCases : Catch::TestEventListenerBase {
    using TestEventListenerBase::TestEventListenerBase;
    void testCaseStarting(Catch::TestCaseInfo const&) override { ++started; }
    static inline int started = 0;
};

}  // namespace

CATCH_REGISTER_LISTENER(CountTestCases)

int main(int argc, char** argv) {
    Catch::Session session;
    if (const int failed = session.applyCommandLine(argc, argv)) return failed;
    Catch::ConfigData config = session.configData();
    config.warnings = Catch::WarnAbout::What(config.warnings | Catch::WarnAbout::NoAssertions);
    session.useConfigData(config);
    const int failed = session.run();
    const bool listed = config.listTests || config.listTestNamesOnly || config.listTags || config.listReporters ||
                        config.showHelp || config.libIdentify;
    if (failed == 0 && !listed && CountTestCases::started == 0) {
        std::fprintf(stderr, "%s: no test case matches the filter: nothing was checked\n", argv[0]);
        return 1;
    }
    return failed;
}
