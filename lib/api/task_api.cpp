// C API: tasks, touch, lookup, stats. Every bad argument is its own result
// with a message naming it; nothing is submitted unless every entry is good.
#include <algorithm>
#include <cinttypes>
#include <cstdio>
#include <string>
#include <vector>

#include "api/config.h"
#include "api/handles.h"
#include "backend/store_calls.h"
#include "common/log.h"
#include "common/repeat_table.h"
#include "common/time.h"
#include "common/trace.h"

namespace {

ucm::Key to_key(const ucm_key_t& k) {
  ucm::Key out;
  out.block = ucm::block_from_bytes(k.block.bytes);
  out.shard = k.shard;
  return out;
}

// Checks a task's entries and converts them, in one pass; `take(e, out)`
// copies entry e's dst or src into out and says whether it is non-NULL. The
// first bad entry (in entry order) is the error, a repeated key being entry
// i's last check.
template <typename Entry, typename Take>
ucm::Result check_entries(const ucm::Cache& c, const Entry* entries, size_t n, const ucm_task_t* task, Take take,
                          const char* ptr_name, std::vector<ucm::TaskEntry>* out) {
  using ucm::Result;
  using ucm::fail;
  if (!task) return fail(Result::kNullPointer, "task (the output handle) is NULL");
  if (n == 0) return fail(Result::kEmpty, "n is 0: a task needs at least one entry");
  if (!entries) return fail(Result::kNullPointer, "entries is NULL (n = %zu)", n);
  const uint32_t limit = c.config().max_task_entries;
  if (n > limit) return fail(Result::kTooLarge, "n %zu > max_task_entries %u", n, limit);
  const uint32_t spb = c.config().shards_per_block;
  out->resize(n);
  ucm::TaskEntry* const es = out->data();
  ucm::RepeatTable seen(n);
  auto key_at = [es](size_t i) -> const ucm::Key& { return es[i].key; };
  for (size_t i = 0; i < n; ++i) {
    const Entry& e = entries[i];
    es[i].key = to_key(e.key);
    if (!take(e, &es[i])) return fail(Result::kNullPointer, "entry %zu: %s is NULL", i, ptr_name);
    if (e.key.reserved != 0) return fail(Result::kInvalidArg, "entry %zu: key.reserved %u != 0", i, e.key.reserved);
    if (e.key.shard >= spb)
      return fail(Result::kOutOfRange, "shard %u >= shards_per_block %u in entry %zu", e.key.shard, spb, i);
    if (const size_t earlier = seen.add(key_at, i); earlier != i) {
      const ucm::Key& k = es[i].key;
      return fail(Result::kDuplicateKey, "entry %zu repeats the key of entry %zu (block %016" PRIx64 "%016" PRIx64
                  " shard %u)", i, earlier, k.block.hi, k.block.lo, k.shard);
    }
  }
  return Result::kOk;
}

// Both task kinds: check every entry, submit; nothing is submitted unless
// every entry is good.
template <typename Entry, typename Take>
ucm_result_t submit_task(ucm_cache_t cache, const char* where, const Entry* entries, size_t n, ucm_task_t* task,
                         ucm::TaskKind kind, const char* ptr_name, Take take) {
  UCM_TRACE(ucm::TraceRange::kSubmit);
  return ucm::cache_call(cache, where, [&](ucm::Cache& c) {
    std::vector<ucm::TaskEntry> es;
    const ucm::Result bad = check_entries(c, entries, n, task, take, ptr_name, &es);
    if (bad != ucm::Result::kOk) {
      if (kind == ucm::TaskKind::kLoad) c.reject_load(n, ucm::last_error());  // fan-out: it still takes its turn
      return bad;
    }
    return c.submit(kind, std::move(es), task);
  });
}

// ucm_touch and ucm_lookup take at most max_task_entries items, like a task:
// checked before anything is allocated for them.
ucm::Result check_count(const ucm::Cache& c, size_t n) {
  const uint32_t limit = c.config().max_task_entries;
  if (n > limit) return ucm::fail(ucm::Result::kTooLarge, "n %zu > max_task_entries %u", n, limit);
  return ucm::Result::kOk;
}

// "key I (block HEX shard S)", as lookup's messages name a key.
std::string key_named(const ucm_key_t* keys, size_t i) {
  const ucm::Key k = to_key(keys[i]);
  char buf[96];
  std::snprintf(buf, sizeof(buf), "key %zu (block %016" PRIx64 "%016" PRIx64 " shard %u)", i, k.block.hi, k.block.lo,
                k.shard);
  return buf;
}

// Fills where[] for the keys the store was asked about (at[j] is the index of
// the j-th) from its answers, and says what went wrong: `asked` is ask()'s
// result (kOk or kTimeout).
ucm::Result store_answers(const ucm::Cache& c, const ucm_key_t* keys, size_t n, const std::vector<size_t>& at,
                          const ucm::StoreAnswers& a, ucm::Result asked, uint8_t* where) {
  using ucm::StoreAnswer;
  size_t unasked = 0, errors = 0, first_unasked = 0;
  for (size_t j = 0; j < at.size(); ++j) {
    const StoreAnswer s = a.per_key[j];
    where[at[j]] = s == StoreAnswer::kHeld ? UCM_WHERE_BACKEND : s == StoreAnswer::kNotHeld ? UCM_WHERE_NONE
                                                                                            : UCM_WHERE_ERROR;
    if (s == StoreAnswer::kUnasked && unasked++ == 0) first_unasked = at[j];
    if (s == StoreAnswer::kError) ++errors;
  }
  if (asked == ucm::Result::kTimeout) {
    const std::string also = errors == 0 ? "" : "; " + std::to_string(errors) + " more could not be answered";
    return ucm::fail(ucm::Result::kTimeout,
                     "lookup: the store did not answer for %zu of %zu keys within timeout_ms %u (UCM_WHERE_ERROR); "
                     "the first is %s, in the store's exists() or waiting for it (that call goes on, on a store "
                     "thread)%s",
                     unasked, n, c.config().timeout_ms, key_named(keys, first_unasked).c_str(), also.c_str());
  }
  if (errors == 0) return ucm::Result::kOk;
  return ucm::fail(ucm::Result::kBackend,
                   "lookup: %zu of %zu keys could not be answered (UCM_WHERE_ERROR); the first is %s: %s", errors, n,
                   key_named(keys, at[a.first_error]).c_str(), a.first_error_text.c_str());
}

// ucm_lookup's work, on a cache the call holds a reference on: the cache
// first, on this thread; the store about the rest, on a store-call thread
// (store_calls.h), so that a store stuck in the kernel holds this call no
// longer than timeout_ms.
ucm::Result lookup(ucm::Cache& c, const ucm_key_t* keys, size_t n, uint8_t* where) {
  if (n == 0) return ucm::Result::kOk;
  if (!keys) return ucm::fail(ucm::Result::kNullPointer, "keys is NULL (n = %zu)", n);
  if (!where) return ucm::fail(ucm::Result::kNullPointer, "where (the output array) is NULL");
  UCM_CHECK(check_count(c, n));
  const uint32_t spb = c.config().shards_per_block;
  for (size_t i = 0; i < n; ++i) {
    if (keys[i].shard >= spb)
      return ucm::fail(ucm::Result::kOutOfRange, "shard %u >= shards_per_block %u in key %zu", keys[i].shard, spb, i);
    if (keys[i].reserved != 0)
      return ucm::fail(ucm::Result::kInvalidArg, "key %zu: key.reserved %u != 0", i, keys[i].reserved);
  }
  std::vector<size_t> at;
  std::vector<ucm::Key> ask;
  for (size_t i = 0; i < n; ++i) {
    const ucm::Key k = to_key(keys[i]);
    bool cached = false;
    // A corrupt control region is the whole call's answer, not one key's.
    UCM_CHECK(c.buffer()->exists(k, &cached));
    where[i] = cached ? UCM_WHERE_CACHE : UCM_WHERE_ERROR;  // ERROR until the store answers
    if (cached) continue;
    at.push_back(i);
    ask.push_back(k);
  }
  if (ask.empty()) return ucm::Result::kOk;
  // Per key: one key the store cannot answer for (an unreadable file, a
  // directory under its name) must not hide the answers for the others.
  ucm::StoreAnswers a;
  const ucm::Result r =
      c.store_calls()->ask(ask.data(), ask.size(), ucm::deadline_after_ms(c.config().timeout_ms), &a);
  if (r != ucm::Result::kOk && r != ucm::Result::kTimeout) return r;
  return store_answers(c, keys, n, at, a, r, where);
}

}  // namespace

extern "C" {

UCM_API ucm_result_t ucm_load_task(ucm_cache_t cache, const ucm_load_entry_t* entries, size_t n, ucm_task_t* task) {
  return submit_task(cache, "ucm_load_task", entries, n, task, ucm::TaskKind::kLoad, "dst",
                     [](const ucm_load_entry_t& e, ucm::TaskEntry* out) { out->dst = e.dst; return e.dst != nullptr; });
}

UCM_API ucm_result_t ucm_dump_task(ucm_cache_t cache, const ucm_dump_entry_t* entries, size_t n, ucm_task_t* task) {
  return submit_task(cache, "ucm_dump_task", entries, n, task, ucm::TaskKind::kDump, "src",
                     [](const ucm_dump_entry_t& e, ucm::TaskEntry* out) { out->src = e.src; return e.src != nullptr; });
}

UCM_API ucm_result_t ucm_task_wait(ucm_cache_t cache, ucm_task_t task, int64_t timeout_ms) {
  UCM_TRACE(ucm::TraceRange::kTaskWait);
  return ucm::cache_call(cache, "ucm_task_wait", [&](ucm::Cache& c) { return c.wait(task, timeout_ms); });
}

UCM_API ucm_result_t ucm_task_test(ucm_cache_t cache, ucm_task_t task, int* is_done) {
  return ucm::cache_call(cache, "ucm_task_test", [&](ucm::Cache& c) {
    if (!is_done) return ucm::fail(ucm::Result::kNullPointer, "done (the output flag) is NULL");
    return c.test(task, is_done);
  });
}

UCM_API ucm_result_t ucm_touch(ucm_cache_t cache, const ucm_block_t* blocks, size_t n) {
  UCM_TRACE(ucm::TraceRange::kTouch);
  return ucm::cache_call(cache, "ucm_touch", [&](ucm::Cache& c) {
    if (n == 0) return ucm::Result::kOk;
    if (!blocks) return ucm::fail(ucm::Result::kNullPointer, "blocks is NULL (n = %zu)", n);
    UCM_CHECK(check_count(c, n));
    std::vector<ucm::BlockId> ids(n);
    for (size_t i = 0; i < n; ++i) ids[i] = ucm::block_from_bytes(blocks[i].bytes);
    return c.buffer()->touch(ids.data(), n);
  });
}

UCM_API ucm_result_t ucm_lookup(ucm_cache_t cache, const ucm_key_t* keys, size_t n, uint8_t* where) {
  return ucm::cache_call(cache, "ucm_lookup", [&](ucm::Cache& c) { return lookup(c, keys, n, where); });
}

UCM_API ucm_result_t ucm_cache_stats(ucm_cache_t cache, ucm_stats_t* rank, ucm_stats_t* node) {
  return ucm::cache_call(cache, "ucm_cache_stats", [&](ucm::Cache& c) {
    for (ucm_stats_t* s : {rank, node}) {
      if (s) UCM_CHECK(ucm::check_struct_bytes(s == rank ? "rank->struct_bytes" : "node->struct_bytes", "ucm_stats_t",
                                               s->struct_bytes, ucm::kStatsFirstBytes, sizeof(ucm_stats_t)));
    }
    c.stats(rank, node);
    return ucm::Result::kOk;
  });
}

}  // extern "C"
