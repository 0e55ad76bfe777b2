// The load path's threads carry names (common/thread_name.h), so that a
// profile or `top -H` of an inference job says which of its threads are the
// cache's and what each does: before, every one was called like the program.
#include <gtest/gtest.h>

#include "common/thread_names.h"
#include "queue_fixture.h"

namespace ucm::test {
namespace {

TEST(ThreadNames, TheQueueAndTheSimStoreNameTheirThreadsWithTheRank) {
  QueuePath path;
  QueueParts p;
  p.rank = 3;
  ASSERT_NO_FATAL_FAILURE(path.open_alone(64, std::move(p)));
  // A thread names itself as it starts: wait (bounded) until both have.
  std::multiset<std::string> names;
  for (int i = 0; i < 2000; ++i) {
    names = thread_names();
    if (names.count("ucm-disp3") == 1 && names.count("ucm-copy3") == 1) break;
    usleep(1000);
  }
  EXPECT_EQ(names.count("ucm-disp3"), 1u);
  EXPECT_EQ(names.count("ucm-copy3"), 1u);
  EXPECT_GE(names.count("ucm-sim"), 1u);
  path.queue->stop();
  // Joined, a thread may still be listed in /proc/self/task for a moment
  // while the kernel finishes its exit (seen once under ASan): bounded too.
  for (int i = 0; i < 2000 && thread_names().count("ucm-disp3") != 0; ++i) usleep(1000);
  EXPECT_EQ(thread_names().count("ucm-disp3"), 0u) << "the dispatcher is joined at stop";
}

}  // namespace
}  // namespace ucm::test
