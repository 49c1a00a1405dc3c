// The process grid (parallel/process_groups.h): every rank has one position and back, the groups along
// each axis partition the world, tensor-parallel ranks are adjacent, and bad shapes are refused naming
// the axis. The communicators themselves are tested across ranks in test_mpi_nccl.
#include "test_util.h"

#include <algorithm>
#include <set>

#include "parallel/process_groups.h"

namespace {

// Every (tensor, context, pipeline, data) split of `world` ranks.
std::vector<GridCoordinates> shapes_of(int world) {
    std::vector<GridCoordinates> shapes;
    for (int t = 1; t <= world; ++t)
        for (int c = 1; c <= world; ++c)
            for (int p = 1; p <= world; ++p)
                if (world % (t * c * p) == 0) shapes.push_back({t, c, p, world / (t * c * p)});
    return shapes;
}

}  // namespace

TEST_CASE("process grid: positions round-trip, groups partition the world along every axis") {
    for (int world : {1, 2, 6, 8, 12}) {
        for (const GridCoordinates& shape : shapes_of(world)) {
            INFO("world " << world << ": tp " << shape.tensor << " cp " << shape.context << " pp " << shape.pipeline
                          << " dp " << shape.data);
            REQUIRE(grid_problem(shape, world).empty());
            for (int rank = 0; rank < world; ++rank) {
                const GridCoordinates at = grid_position(rank, shape);
                for (Axis a : kAxes) REQUIRE((at[a] >= 0 && at[a] < shape[a]));
                REQUIRE(grid_rank(at, shape) == rank);
            }
            for (Axis axis : kAxes) {
                std::set<std::vector<int>> groups;
                for (int rank = 0; rank < world; ++rank) {
                    const std::vector<int> g = group_ranks(rank, shape, axis);
                    REQUIRE(int(g.size()) == shape[axis]);
                    // The rank is in its own group, at its coordinate; the others differ in this axis only.
                    REQUIRE(g[grid_position(rank, shape)[axis]] == rank);
                    for (int member : g)
                        for (Axis other : kAxes)
                            if (other != axis) REQUIRE(grid_position(member, shape)[other] == grid_position(rank, shape)[other]);
                    groups.insert(g);
                }
                // Disjoint and covering: world / size groups whose members are all ranks once.
                REQUIRE(int(groups.size()) == world / shape[axis]);
                std::vector<int> all;
                for (const std::vector<int>& g : groups) all.insert(all.end(), g.begin(), g.end());
                std::sort(all.begin(), all.end());
                for (int i = 0; i < world; ++i) REQUIRE(all[i] == i);
            }
        }
    }
}

TEST_CASE("process grid: tensor-parallel ranks are adjacent, data-parallel ranks farthest apart") {
    const GridCoordinates shape{2, 1, 2, 2};  // 8 ranks: tp 2, pp 2, dp 2
    CHECK(group_ranks(5, shape, Axis::tensor) == std::vector<int>{4, 5});
    CHECK(group_ranks(5, shape, Axis::pipeline) == std::vector<int>{5, 7});
    CHECK(group_ranks(5, shape, Axis::data) == std::vector<int>{1, 5});
    CHECK(group_ranks(5, shape, Axis::context) == std::vector<int>{5});
}

TEST_CASE("process grid: shapes that do not span the world are refused, naming why") {
    CHECK_THAT(grid_problem({2, 1, 1, 2}, 8), Catch::Contains("= 4 ranks, but the world has 8"));
    CHECK_THAT(grid_problem({0, 1, 1, 8}, 8), Catch::Contains("tensor-parallel size 0"));
    CHECK_THAT(grid_problem({1, 1, -1, 8}, 8), Catch::Contains("pipeline-parallel size -1"));
}
