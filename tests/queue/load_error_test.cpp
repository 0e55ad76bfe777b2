// What an entry that failed says: its own key's last store error. An entry
// out of retries quoted the rank's last store error of any key (helper-18,
// session 23): with many keys failing at once, mostly another key's, so the
// message pointed at the wrong file.
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "common/test_util.h"
#include "common/time.h"
#include "queue/queue_fixture.h"

namespace ucm {
namespace {

constexpr uint64_t kShard = 4096;
constexpr uint64_t kWaitMs = 20000;  // a hang, not slowness

// 32 keys the store fails every time, in one task, 8 loads at once: each
// entry runs out of retries quoting its own key's failure.
TEST(LoadErrors, AnEntryOutOfRetriesQuotesItsOwnKeysLastStoreError) {
  test::QueuePath p;
  test::QueueParts parts;
  parts.shard_bytes = kShard;
  parts.queue.io_depth = 8;
  ASSERT_NO_FATAL_FAILURE(p.open_alone(64, std::move(parts), kWaitMs));
  constexpr uint32_t kKeys = 32;
  std::vector<uint8_t> dst(kKeys * kShard, 0xee);
  std::vector<TaskEntry> es(kKeys);
  for (uint32_t i = 0; i < kKeys; ++i) {
    es[i].key = test::key(93000 + i, 0);
    es[i].dst = dst.data() + uint64_t{i} * kShard;
    p.store->fail_key(es[i].key);
  }
  auto t = std::make_shared<Task>(1, TaskKind::kLoad, std::move(es), deadline_after_ms(kWaitMs));
  std::mutex mu;
  std::map<uint32_t, std::string> why;  // entry -> its message
  t->set_on_failed([&](uint32_t i, Result, const std::string& w) {
    std::lock_guard<std::mutex> g(mu);
    why[i] = w;
  });
  ASSERT_EQ(p.queue->submit(t), Result::kOk) << last_error();
  ASSERT_TRUE(t->wait_until(deadline_after_ms(kWaitMs)));
  EXPECT_EQ(t->result(), Result::kBackend) << t->error();
  std::lock_guard<std::mutex> g(mu);
  ASSERT_EQ(why.size(), kKeys);
  for (const auto& [i, w] : why) {
    const std::string own = "(last error here: sim store: injected failure loading block " +
                            std::to_string(93000 + i) + " shard 0)";
    EXPECT_NE(w.find("the backend load failed"), std::string::npos) << "entry " << i << ": " << w;
    EXPECT_NE(w.find(own), std::string::npos) << "entry " << i << " does not quote its own key's failure: " << w;
  }
}

}  // namespace
}  // namespace ucm
