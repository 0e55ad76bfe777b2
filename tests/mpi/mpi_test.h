#pragma once

#include <gtest/gtest.h>

namespace ucm::test {

class MpiTest : public ::testing::Test {
 protected:
  void TearDown() override;
};

bool any_rank_failed(bool mine);
int world_rank();
int world_size();

}  // namespace ucm::test
