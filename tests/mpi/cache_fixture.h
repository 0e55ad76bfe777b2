// The mpi suite's fixture for a test over one node cache: MpiTest (a failure
// on any rank is reported on rank 0) plus the cache's life in one place.
//
//   TEST_F(Load, X) {
//     ucm_config_t cfg = task_config(64, "sim:latency_us=0");
//     ASSERT_NO_FATAL_FAILURE(init(cfg));
//     ucm_cache_t& cache = cache_;
//     ...
//     EXPECT_EQ(finalize(), UCM_OK) << msg(nullptr);
//   }
//
// A test that returns early on some rank (a failed ASSERT) leaves its cache
// up: TearDown finalizes it there, so its threads and shared memory do not
// leak into the next test (its peers, already finalized, do not come: that
// finalize ends at timeout_ms naming them, a failure already reported).
#pragma once

#include <mpi.h>

#include <gtest/gtest.h>

#include "common/hang_guard.h"
#include "mpi/mpi_test.h"
#include "mpi/task_util.h"
#include "ucmcache/ucm.h"

namespace ucm::test {

class CacheTest : public MpiTest {
 protected:
  // ucm_cache_init(MPI_COMM_WORLD, cfg) on every rank (collective) into cache_;
  // a fatal failure naming init's error otherwise.
  void init(const ucm_config_t& cfg) {
    ASSERT_EQ(cache_, nullptr) << "the test's cache is up already";
    ucm_result_t r = UCM_OK;
    {
      HangGuard g("ucm_cache_init");
      r = ucm_cache_init(MPI_COMM_WORLD, &cfg, &cache_);
    }
    ASSERT_EQ(r, UCM_OK) << msg(nullptr);
  }

  // Every rank at a barrier, then ucm_cache_finalize of cache_: its result
  // (its message is msg(nullptr)).
  [[nodiscard]] ucm_result_t finalize() {
    MPI_Barrier(MPI_COMM_WORLD);
    HangGuard g("ucm_cache_finalize");
    return ucm_cache_finalize(&cache_);
  }

  void TearDown() override {
    // Collective, so that every rank takes the same branch.
    if (any_rank_failed(cache_ != nullptr) && cache_ != nullptr) {
      HangGuard g("ucm_cache_finalize of a cache the test left up");
      (void)ucm_cache_finalize(&cache_);
    }
    MpiTest::TearDown();
  }

  ucm_cache_t cache_ = nullptr;
};

}  // namespace ucm::test
