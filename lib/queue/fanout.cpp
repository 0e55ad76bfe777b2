#include "queue/fanout.h"

#include <algorithm>
#include <cinttypes>
#include <cstdio>
#include <cstring>

#include "common/hash.h"
#include "common/log.h"
#include "common/thread_name.h"
#include "common/time.h"

namespace ucm {

namespace {

constexpr uint64_t kWaitSliceNs = 20'000'000;  // how often a wait looks at the stop flag

// One rank's turn, as every rank sees it in the turn's allgather.
struct TurnRecord {
  uint64_t turn;
  uint64_t task_id;
  uint64_t n;
  uint64_t fingerprint;
  uint64_t first_hi, first_lo;
  uint32_t first_shard;
  uint32_t refused;
  char why[96];
};
static_assert(sizeof(TurnRecord) == 152);

uint64_t fingerprint(const Task& t) {
  uint64_t h = fnv1a_u64(kFnvOffset, t.entries().size());
  for (const TaskEntry& e : t.entries()) {
    h = fnv1a_u64(h, e.key.block.lo);
    h = fnv1a_u64(h, e.key.block.hi);
    h = fnv1a_u64(h, e.key.shard);
  }
  return h;
}

std::string record_text(uint32_t rank, const TurnRecord& r) {
  char buf[384];
  if (r.refused)
    std::snprintf(buf, sizeof(buf), "local rank %u refused its task %" PRIu64 " of %" PRIu64 " entries (%s)", rank,
                  r.task_id, r.n, r.why);
  else
    std::snprintf(buf, sizeof(buf),
                  "local rank %u's task %" PRIu64 " (%" PRIu64 " keys, first %016" PRIx64 "%016" PRIx64
                  ":%u, fingerprint %016" PRIx64 ")",
                  rank, r.task_id, r.n, r.first_hi, r.first_lo, r.first_shard, r.fingerprint);
  return buf;
}

bool same_turn(const TurnRecord& a, const TurnRecord& b) {
  return a.turn == b.turn && a.n == b.n && a.fingerprint == b.fingerprint && a.refused == 0 && b.refused == 0;
}

}  // namespace

// A chunk's rooted loads on this rank: what the LoadQueue reports per entry.
struct Fanout::Chunk {
  struct Outcome {
    std::mutex mu;
    std::vector<int32_t> result;  // per position in `mine`: 0, or the Result
    std::vector<std::string> why;
  };
  uint32_t begin = 0, end = 0;
  std::vector<uint32_t> mine;  // the task's entry indexes this rank roots
  std::shared_ptr<Task> sub;   // their load through the cache (null when none)
  std::shared_ptr<Outcome> out = std::make_shared<Outcome>();
};

Fanout::Fanout(LoadQueue* queue, std::unique_ptr<Collective> coll, const FanoutOptions& opts)
    : queue_(queue), coll_(std::move(coll)), opts_(opts), rank_(coll_->rank()), size_(coll_->size()) {
  if (opts_.chunk_entries == 0) opts_.chunk_entries = 1;
  coll_->set_stop_flag(&stop_);
}

Fanout::~Fanout() { stop(); }

Result Fanout::start() {
  thread_ = std::thread([this] { main(); });
  return Result::kOk;
}

void Fanout::stop() {
  {
    std::lock_guard<std::mutex> g(mu_);
    stop_.store(true, std::memory_order_release);
    cv_.notify_all();
  }
  if (thread_.joinable()) thread_.join();
}

Result Fanout::submit(const std::shared_ptr<Task>& t) {
  std::lock_guard<std::mutex> g(mu_);
  if (stop_.load(std::memory_order_relaxed)) return fail(Result::kFinalized, "the cache is being finalized");
  Turn turn;
  turn.task = t;
  turn.task_id = t->id();
  turn.n = t->entries().size();
  turns_.push_back(std::move(turn));
  cv_.notify_one();
  return Result::kOk;
}

void Fanout::reject(uint64_t task_id, uint64_t n, const std::string& why) {
  std::lock_guard<std::mutex> g(mu_);
  if (stop_.load(std::memory_order_relaxed)) return;
  Turn turn;
  turn.task_id = task_id;
  turn.n = n;
  turn.why = why;
  turns_.push_back(std::move(turn));
  cv_.notify_one();
}

std::string Fanout::describe() const {
  std::lock_guard<std::mutex> g(why_mu_);
  if (!broken_why_.empty()) return std::string("off since ") + broken_why_;
  return coll_->describe();
}

void Fanout::main() {
  name_this_thread("fanout");
  for (;;) {
    Turn turn;
    {
      std::unique_lock<std::mutex> g(mu_);
      cv_.wait(g, [&] { return stop_.load(std::memory_order_relaxed) || !turns_.empty(); });
      if (stop_.load(std::memory_order_relaxed)) return;
      turn = std::move(turns_.front());
      turns_.pop_front();
    }
    run_turn(turn);
    // A turn that the stop cut short may have left a collective in flight:
    // that communicator is never used (or freed) again.
    if (stop_.load(std::memory_order_acquire)) {
      coll_->abort();
      return;
    }
  }
}

void Fanout::give_up(const std::string& why) {
  if (broken_) return;
  broken_ = true;
  coll_->abort();
  char head[64];
  std::snprintf(head, sizeof(head), "turn %" PRIu64 ": ", turn_no_);
  {
    std::lock_guard<std::mutex> g(why_mu_);
    broken_why_ = head + why;
  }
  UCM_WARN("fan-out: %s%s; this rank copies every shard from the host cache itself from now on", head, why.c_str());
}

void Fanout::run_turn(Turn& turn) {
  const uint64_t turn_no = ++turn_no_;
  ctr_.turns.fetch_add(1, std::memory_order_relaxed);
  if (broken_) {
    if (turn.task) fallback(turn.task, {}, "the communicator was aborted before this task");
    return;
  }
  TurnRecord mine{};
  mine.turn = turn_no;
  mine.task_id = turn.task_id;
  mine.n = turn.n;
  if (turn.task) {
    mine.fingerprint = fingerprint(*turn.task);
    const Key& k = turn.task->entries().front().key;
    mine.first_hi = k.block.hi;
    mine.first_lo = k.block.lo;
    mine.first_shard = k.shard;
  } else {
    mine.refused = 1;
    std::snprintf(mine.why, sizeof(mine.why), "%s", turn.why.c_str());
  }
  std::vector<TurnRecord> all(size_);
  const Result r = coll_->allgather(&mine, all.data(), sizeof(mine), now_ns() + opts_.step_timeout_ns);
  if (!ok(r)) {
    if (r == Result::kFinalized) return;
    give_up(std::string("the task records' allgather failed: ") + last_error());
    if (turn.task) fallback(turn.task, {}, "the turn's allgather failed");
    return;
  }
  // Every rank sees the same records, so every rank decides alike here.
  for (uint32_t b = 1; b < size_; ++b) {
    if (same_turn(all[0], all[b])) continue;
    uint32_t a = 0;
    if (all[0].refused == 0 && all[b].refused != 0) a = b, b = 0;  // name the refusal first
    // Two accepted tasks that differ: one rank may have submitted a task more
    // (or fewer) than the others, so the turns cannot be trusted to pair
    // again: fan-out stops on every rank (the communicator is consistent, just
    // no longer used). Refusals alone keep the turns paired.
    bool accepted_differ = false;
    for (uint32_t x = 0; x < size_ && !accepted_differ; ++x)
      for (uint32_t y = x + 1; y < size_ && !accepted_differ; ++y)
        accepted_differ = !all[x].refused && !all[y].refused &&
                          (all[x].n != all[y].n || all[x].fingerprint != all[y].fingerprint);
    const std::string why = "fan-out turn " + std::to_string(turn_no) + ": the local ranks submitted different tasks: " +
                            record_text(a, all[a]) + " but " + record_text(b, all[b]) +
                            "; in fan-out mode every local rank submits the same keys in the same task order" +
                            (accepted_differ ? " (fan-out is off from here on: each rank copies for itself)" : "");
    if (accepted_differ) {
      broken_ = true;
      std::lock_guard<std::mutex> g(why_mu_);
      broken_why_ = "turn " + std::to_string(turn_no) + ": the local ranks submitted different tasks";
    }
    if (!turn.task) return;  // this rank refused: its caller has the error already
    ctr_.mismatches.fetch_add(1, std::memory_order_relaxed);
    for (uint32_t i = 0; i < turn.task->entries().size(); ++i) turn.task->entry_failed(i, Result::kBadState, why);
    return;
  }
  if (!turn.task) return;  // every rank refused it alike
  run_task(turn.task);
}

// A chunk's loads (and a fallback's copies) end with the caller's task: a
// deadline of their own per chunk let a task of many chunks, each with a
// load that hangs, take a task timeout per chunk (bounded by the task's).
uint64_t Fanout::sub_deadline(const Task& t) const {
  return t.deadline_ns() != 0 ? t.deadline_ns() : now_ns() + opts_.task_timeout_ns;
}

void Fanout::start_chunk(const std::shared_ptr<Task>& t, Chunk* c) {
  for (uint32_t i = c->begin; i < c->end; ++i)
    if (root_of(i) == rank_) c->mine.push_back(i);
  c->out->result.assign(c->mine.size(), 0);
  c->out->why.assign(c->mine.size(), std::string());
  if (c->mine.empty()) return;
  std::vector<TaskEntry> es;
  es.reserve(c->mine.size());
  for (uint32_t i : c->mine) es.push_back(t->entries()[i]);
  c->sub = std::make_shared<Task>(next_internal_id_++, TaskKind::kLoad, std::move(es), sub_deadline(*t));
  std::shared_ptr<Chunk::Outcome> out = c->out;
  c->sub->set_on_failed([out](uint32_t p, Result r, const std::string& why) {
    std::lock_guard<std::mutex> g(out->mu);
    out->result[p] = static_cast<int32_t>(r);
    out->why[p] = why;
  });
  const Result r = queue_->submit(c->sub);
  if (!ok(r)) {
    const std::string why = last_error();
    for (uint32_t p = 0; p < c->mine.size(); ++p) c->sub->entry_failed(p, r, why);
  }
}

bool Fanout::wait_chunk(Chunk* c) {
  if (!c->sub) return true;
  while (!c->sub->wait_until(now_ns() + kWaitSliceNs))
    if (stop_.load(std::memory_order_acquire)) return false;
  return true;
}

void Fanout::fallback(const std::shared_ptr<Task>& t, const std::vector<uint32_t>& only, const char* why) {
  std::vector<uint32_t> idx = only;
  if (idx.empty() && only.empty())
    for (uint32_t i = 0; i < t->entries().size(); ++i) idx.push_back(i);
  ctr_.fallbacks.fetch_add(1, std::memory_order_relaxed);
  UCM_INFO(kQueue, "fan-out: task %" PRIu64 ": %zu entries copied per rank (%s)", t->id(), idx.size(), why);
  Chunk c;
  c.mine = idx;
  c.out->result.assign(idx.size(), 0);
  c.out->why.assign(idx.size(), std::string());
  std::vector<TaskEntry> es;
  for (uint32_t i : idx) es.push_back(t->entries()[i]);
  c.sub = std::make_shared<Task>(next_internal_id_++, TaskKind::kLoad, std::move(es), sub_deadline(*t));
  std::shared_ptr<Chunk::Outcome> out = c.out;
  c.sub->set_on_failed([out](uint32_t p, Result r, const std::string& w) {
    std::lock_guard<std::mutex> g(out->mu);
    out->result[p] = static_cast<int32_t>(r);
    out->why[p] = w;
  });
  const Result r = queue_->submit(c.sub);
  if (!ok(r)) {
    const std::string w = last_error();
    for (uint32_t p = 0; p < idx.size(); ++p) c.sub->entry_failed(p, r, w);
  }
  if (!wait_chunk(&c)) return;
  std::lock_guard<std::mutex> g(out->mu);
  for (uint32_t p = 0; p < idx.size(); ++p) {
    if (out->result[p] == 0) {
      ctr_.host_bytes.fetch_add(opts_.shard_bytes, std::memory_order_relaxed);
      t->entry_ok();
    } else {
      t->entry_failed(idx[p], static_cast<Result>(out->result[p]), out->why[p]);
    }
  }
}

// One task's run over its chunks: what its steps share.
struct Fanout::TaskRun {
  TaskRun(const std::shared_ptr<Task>& task, uint32_t per_chunk, uint32_t ranks)
      : t(task),
        n(static_cast<uint32_t>(task->entries().size())),
        per(per_chunk),
        chunks((n + per_chunk - 1) / per_chunk),
        cs(chunks),
        finished(n, 0),
        st(per_chunk),
        all(static_cast<size_t>(per_chunk) * ranks) {}
  const std::shared_ptr<Task>& t;
  const uint32_t n, per, chunks;
  std::vector<std::unique_ptr<Chunk>> cs;
  std::vector<uint8_t> finished;  // per entry: finished on t
  std::vector<int32_t> st, all;   // a chunk's results: this rank's, then every rank's (allgathered)
};

// A chunk's round of broadcasts: one per entry its root loaded.
struct Fanout::Broadcasts {
  std::vector<BcastOp> ops;
  std::vector<uint32_t> entry;  // per op: the task's entry index
};

void Fanout::run_task(const std::shared_ptr<Task>& t) {
  TaskRun run(t, opts_.chunk_entries, size_);
  start_chunk_of(run, 0);
  for (uint32_t k = 0; k < run.chunks; ++k)
    if (!run_chunk(run, k)) return;
}

bool Fanout::run_chunk(TaskRun& run, uint32_t k) {
  if (k + 1 < run.chunks) start_chunk_of(run, k + 1);  // the next chunk loads while this one broadcasts
  Chunk& c = *run.cs[k];
  if (!wait_chunk(&c)) return false;  // stopping: the cache abandons the task
  Result r = gather_results(run, c);
  if (r == Result::kFinalized) return false;
  if (!ok(r)) {
    give_up("the load results' allgather failed: " + last_error());
    finish_rest(run, k, "the load results' allgather failed");
    return false;
  }
  Broadcasts b;
  plan_broadcasts(run, c, &b);
  r = broadcast(b, k);
  if (r == Result::kFinalized) return false;
  if (!ok(r)) {
    give_up("a broadcast round failed: " + last_error());
    finish_rest(run, k, "a broadcast round failed");
    return false;
  }
  finish_broadcasts(run, c, b);
  return true;
}

void Fanout::start_chunk_of(TaskRun& run, uint32_t k) {
  run.cs[k] = std::make_unique<Chunk>();
  run.cs[k]->begin = k * run.per;
  run.cs[k]->end = std::min(run.n, (k + 1) * run.per);
  start_chunk(run.t, run.cs[k].get());
}

void Fanout::finish_rooted(TaskRun& run, Chunk& c) {
  std::lock_guard<std::mutex> g(c.out->mu);
  for (uint32_t p = 0; p < c.mine.size(); ++p) {
    const uint32_t i = c.mine[p];
    if (run.finished[i]) continue;
    run.finished[i] = 1;
    if (c.out->result[p] == 0) {
      ctr_.host_bytes.fetch_add(opts_.shard_bytes, std::memory_order_relaxed);
      ctr_.rooted.fetch_add(1, std::memory_order_relaxed);
      run.t->entry_ok();
    } else {
      run.t->entry_failed(i, static_cast<Result>(c.out->result[p]), c.out->why[p]);
    }
  }
}

void Fanout::finish_rest(TaskRun& run, uint32_t k, const char* why) {
  finish_rooted(run, *run.cs[k]);
  if (k + 1 < run.chunks && run.cs[k + 1]) {
    if (!wait_chunk(run.cs[k + 1].get())) return;
    finish_rooted(run, *run.cs[k + 1]);
  }
  std::vector<uint32_t> idx;
  for (uint32_t i = run.cs[k]->begin; i < run.n; ++i)
    if (!run.finished[i]) idx.push_back(i);
  if (!idx.empty()) fallback(run.t, idx, why);
}

Result Fanout::gather_results(TaskRun& run, Chunk& c) {
  std::fill(run.st.begin(), run.st.end(), 0);
  {
    std::lock_guard<std::mutex> g(c.out->mu);
    for (uint32_t p = 0; p < c.mine.size(); ++p) run.st[c.mine[p] - c.begin] = c.out->result[p];
  }
  return coll_->allgather(run.st.data(), run.all.data(), run.per * sizeof(int32_t), now_ns() + opts_.step_timeout_ns);
}

void Fanout::plan_broadcasts(TaskRun& run, const Chunk& c, Broadcasts* b) {
  for (uint32_t i = c.begin; i < c.end; ++i) {
    const uint32_t root = root_of(i);
    const int32_t res = run.all[static_cast<size_t>(root) * run.per + (i - c.begin)];
    if (res == 0) {
      b->ops.push_back({run.t->entries()[i].dst, opts_.shard_bytes, root});
      b->entry.push_back(i);
    } else if (root != rank_) {
      run.finished[i] = 1;
      const Key& key = run.t->entries()[i].key;
      char buf[256];
      std::snprintf(buf, sizeof(buf),
                    "block %016" PRIx64 "%016" PRIx64 " shard %u: its load on local rank %u (its fan-out root) "
                    "failed with %s (that rank's error names the cause); it was not broadcast",
                    key.block.hi, key.block.lo, key.shard, root, result_name(static_cast<Result>(res)));
      run.t->entry_failed(i, static_cast<Result>(res), buf);
    }
  }
}

Result Fanout::broadcast(const Broadcasts& b, uint32_t k) {
  if (opts_.stall_rank == static_cast<int64_t>(rank_) && opts_.stall_turn == turn_no_ && k == 0)
    return fail(Result::kTimeout, "UCM_FANOUT_TEST_STALL: this rank stopped calling at turn %" PRIu64, turn_no_);
  return b.ops.empty() ? Result::kOk : coll_->broadcast(b.ops.data(), b.ops.size(), now_ns() + opts_.step_timeout_ns);
}

void Fanout::finish_broadcasts(TaskRun& run, Chunk& c, const Broadcasts& b) {
  finish_rooted(run, c);
  for (size_t o = 0; o < b.ops.size(); ++o) {
    if (b.ops[o].root == rank_) continue;
    run.finished[b.entry[o]] = 1;
    ctr_.bcast_bytes.fetch_add(opts_.shard_bytes, std::memory_order_relaxed);
    run.t->entry_ok();
  }
}

}  // namespace ucm
