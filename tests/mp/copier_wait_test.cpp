// An entry whose key must be got again (its load was abandoned at a deadline)
// while the cache has no free slot never holds back the copier's other
// entries, in real processes. The copier used to wait for space inside
// regain(), one sleep after another until that entry's task's deadline, while
// the only slot that could free was pinned by another of its own entries,
// Ready and waiting for the copier to copy it: that task ended at the other's
// deadline, not its own (an adversarial run: 900 ms past its deadline with
// the public API). The copier now looks for a slot once per round and serves
// the rest in between (docs/design.md 9.1, "The copier never waits for space").
//
// The cache has 4 slots. Rank 1 (a bare CacheBuffer) owns X and Z without
// filling them and pins H1 and H2, Ready. Rank 0's queue submits C = {Z}
// (its deadline 6 s) and B = {X} (20 s): both wait in the copier. Rank 1
// abandons X's load as a store's expiry does, keeping its pin on X's old slot
// (the store's I/O pin), so rank 0's copier must get X again and finds every
// slot pinned. Then rank 1 fills Z and unpins it: Z's slot now waits only for
// rank 0's copy of C. Before the fix C ended with B, at 20 s; now C ends at
// once and B takes Z's slot after it.
#include <gtest/gtest.h>

#include <unistd.h>

#include <cstdio>
#include <memory>
#include <vector>

#include "backend/sim_content.h"
#include "common/mp_util.h"
#include "common/test_util.h"
#include "mp/queue_rank.h"
#include "queue/counters.h"
#include "queue/load_queue.h"

namespace ucm::test {
namespace {

constexpr uint64_t kDeadlineMs = 40000;  // a hang, not slowness
constexpr uint64_t kShardBytes = 4096;
constexpr uint32_t kSlots = 4;
constexpr uint64_t kTaskCMs = 6000;
constexpr uint64_t kTaskBMs = 20000;

Key x_key() { return key(93001, 0); }
Key z_key() { return key(93002, 0); }
Key h_key(uint32_t i) { return key(93010 + i, 0); }

struct CopierShared {
  ShmSignal full;       // rank 1 holds every slot
  ShmSignal waiting;    // rank 0's copier waits on X and Z
  ShmSignal c_ended;    // rank 0's task C ended (in time or not)
  ShmSignal finished;   // rank 0 is done
  std::atomic<uint32_t> x_slot{0}, z_slot{0};
  std::atomic<uint64_t> c_ms{0};
};

// A bare rank over the parent's planes: joined as `rank`, with a CacheBuffer
// of its own (no queue: the test drives its slots by hand).
struct BareRank {
  TestCache mine;
  std::unique_ptr<CacheBuffer> cb;
};

void join_bare(const TestCache& parent, uint32_t rank, BareRank* out) {
  attach_copy(parent, &out->mine);
  ASSERT_EQ(join_rank_retrying(out->mine.ctrl, rank, deadline_after_ms(kDeadlineMs)), Result::kOk) << last_error();
  CacheOptions o;
  o.rank = rank;
  out->cb = std::make_unique<CacheBuffer>(&out->mine.ctrl, &out->mine.data, o);
}

void owner_of(CacheBuffer& cb, const Key& k, uint32_t* slot) {
  GetResult g;
  ASSERT_EQ(cb.get(k, &g), Result::kOk) << last_error();
  ASSERT_EQ(g.kind, GetKind::kOwner);
  *slot = g.slot;
}

// Rank 1: owns X and Z (Idle), pins H1 and H2 (Ready); then abandons X and,
// once rank 0 found no space, fills Z.
void hold_and_abandon(const TestCache& parent, CopierShared* sh) {
  BareRank bare;
  ASSERT_NO_FATAL_FAILURE(join_bare(parent, 1, &bare));
  TestCache& mine = bare.mine;
  CacheBuffer& cb = *bare.cb;
  uint32_t x = 0, z = 0;
  std::vector<uint32_t> held(2);
  ASSERT_NO_FATAL_FAILURE(owner_of(cb, x_key(), &x));
  ASSERT_NO_FATAL_FAILURE(owner_of(cb, z_key(), &z));
  for (uint32_t i = 0; i < 2; ++i) {
    ASSERT_NO_FATAL_FAILURE(owner_of(cb, h_key(i), &held[i]));
    fill_pattern(cb.data_at(held[i]), kShardBytes, h_key(i));
    ASSERT_EQ(cb.mark_ready(held[i]), Result::kOk) << last_error();
  }
  sh->x_slot.store(x);
  sh->z_slot.store(z);
  sh->full.set(1);
  ASSERT_TRUE(sh->waiting.wait_ge(1, deadline_after_ms(kDeadlineMs)));
  // As the store's expiry does (LoadQueue::expire_due_ios): the key goes,
  // the I/O's pin stays until the store lets go of the slot.
  const uint64_t no_space0 = mine.ctrl.rank(0).counters.no_space.load();
  ASSERT_EQ(cb.abandon_load(x, cb.word(x)), Result::kOk) << last_error();
  const uint64_t until = deadline_after_ms(kDeadlineMs);
  while (mine.ctrl.rank(0).counters.no_space.load() == no_space0 && now_ns() < until) usleep(500);
  ASSERT_GT(mine.ctrl.rank(0).counters.no_space.load(), no_space0) << "rank 0 never looked for a slot for X again";
  sim_fill(z_key(), cb.data_at(z), kShardBytes);
  ASSERT_EQ(cb.mark_ready(z), Result::kOk) << last_error();
  cb.release(z);
  ASSERT_TRUE(sh->c_ended.wait_ge(1, deadline_after_ms(kDeadlineMs)));
  cb.release(x);
  for (uint32_t s : held) cb.release(s);
  ASSERT_TRUE(sh->finished.wait_ge(1, deadline_after_ms(kDeadlineMs)));
  mine.ctrl.leave(1);
}

std::shared_ptr<Task> load_task(uint64_t id, const Key& k, uint8_t* dst, uint64_t ms) {
  std::vector<TaskEntry> es(1);
  es[0].key = k;
  es[0].dst = dst;
  return std::make_shared<Task>(id, TaskKind::kLoad, es, deadline_after_ms(ms));
}

// Rank 0: its queue loads C = {Z}, then B = {X}.
void load_both(const TestCache& parent, CopierShared* sh) {
  ASSERT_TRUE(sh->full.wait_ge(1, deadline_after_ms(kDeadlineMs)));
  QueueRank me;
  ASSERT_NO_FATAL_FAILURE(me.open(parent, 0, CacheOptions{}, solo_queue(), kShardBytes, kDeadlineMs));
  std::vector<uint8_t> dc(kShardBytes, 0xee), db(kShardBytes, 0xee);
  const uint64_t t0 = now_ns();
  auto c = load_task(1, z_key(), dc.data(), kTaskCMs);
  auto b = load_task(2, x_key(), db.data(), kTaskBMs);
  ASSERT_EQ(me.queue->submit(c), Result::kOk) << last_error();
  ASSERT_EQ(me.queue->submit(b), Result::kOk) << last_error();
  // The dispatcher pinned both slots as a waiter: both entries go to the copier.
  const BufferCtrl& ctrl = me.cache->ctrl();
  const uint64_t until = deadline_after_ms(kDeadlineMs);
  while ((ctrl.pin(0, sh->x_slot.load()).load() == 0 || ctrl.pin(0, sh->z_slot.load()).load() == 0) &&
         now_ns() < until)
    usleep(200);
  ASSERT_GE(ctrl.pin(0, sh->x_slot.load()).load(), 1u);
  ASSERT_GE(ctrl.pin(0, sh->z_slot.load()).load(), 1u);
  sh->waiting.set(1);
  const bool c_in_time = c->wait_until(c->deadline_ns());
  sh->c_ms.store((now_ns() - t0) / 1'000'000);
  sh->c_ended.set(1);
  EXPECT_TRUE(c_in_time) << "task C ended past its deadline: the copier waited for space for B instead of copying C";
  ASSERT_TRUE(c->wait_until(deadline_after_ms(kDeadlineMs))) << "task C hung";
  EXPECT_EQ(c->result(), Result::kOk) << c->error();
  EXPECT_EQ(sim_verify(z_key(), dc.data(), kShardBytes), kShardBytes);
  ASSERT_TRUE(b->wait_until(deadline_after_ms(kDeadlineMs))) << "task B hung";
  EXPECT_EQ(b->result(), Result::kOk) << b->error();
  EXPECT_EQ(sim_verify(x_key(), db.data(), kShardBytes), kShardBytes);
  sh->finished.set(1);
  me.close(0);
}

// Rank 1 (bare) and rank 0 (a queue) over one cache of `slots` slots, each
// in a process of its own; both must exit cleanly.
template <typename S>
void run_pair(void (*rank1)(const TestCache&, S*), void (*rank0)(const TestCache&, S*), Shared<S>& sh,
              uint32_t slots = kSlots) {
  TestCache tc;
  make_cache(params(slots, 0, kShardBytes, 8, 2), &tc);
  Children ch;
  const pid_t r1 = ch.spawn([&] { rank1(tc, sh.get()); });
  const pid_t r0 = ch.spawn([&] { rank0(tc, sh.get()); });
  EXPECT_EQ(ch.wait(r0, 2 * kDeadlineMs), 0);
  EXPECT_EQ(ch.wait(r1, 2 * kDeadlineMs), 0);
}

TEST(CopierSpace, AnEntryWaitingForAFreeSlotDoesNotHoldBackTheCopiesOfOthers) {
  Shared<CopierShared> sh;
  run_pair(hold_and_abandon, load_both, sh);
  std::printf("[CopierSpace] task C (deadline %llu ms) ended at %llu ms\n",
              static_cast<unsigned long long>(kTaskCMs), static_cast<unsigned long long>(sh->c_ms.load()));
}

// A slotless entry looks once more at its deadline, as the dispatcher's get
// does (the look, then the deadline): it used to fail with NoSpace at its
// deadline without looking, although the key had come back meanwhile. Rank 1
// abandons X's load with every slot held; rank 0's copier looks for a slot
// with pauses that end only when the protection relaxes (5 ms, then half of
// the task's time) and at the deadline. After its third look rank 1 loads X
// itself into a slot it frees: rank 0's look at the deadline finds X Ready.
constexpr uint64_t kTaskLastLookMs = 3000;

struct LastLookShared {
  ShmSignal full;     // rank 1 holds every slot, X among them (Idle)
  ShmSignal waiting;  // rank 0's copier waits on X
  ShmSignal loaded;   // rank 1 loaded X again
  std::atomic<uint32_t> x_slot{0};
};

void abandon_then_reload(const TestCache& parent, LastLookShared* sh) {
  BareRank bare;
  ASSERT_NO_FATAL_FAILURE(join_bare(parent, 1, &bare));
  TestCache& mine = bare.mine;
  CacheBuffer& cb = *bare.cb;
  uint32_t x = 0;
  std::vector<uint32_t> held(kSlots - 1);
  ASSERT_NO_FATAL_FAILURE(owner_of(cb, x_key(), &x));
  for (uint32_t i = 0; i < held.size(); ++i) {
    ASSERT_NO_FATAL_FAILURE(owner_of(cb, h_key(i), &held[i]));
    fill_pattern(cb.data_at(held[i]), kShardBytes, h_key(i));
    ASSERT_EQ(cb.mark_ready(held[i]), Result::kOk) << last_error();
  }
  sh->x_slot.store(x);
  sh->full.set(1);
  ASSERT_TRUE(sh->waiting.wait_ge(1, deadline_after_ms(kDeadlineMs)));
  const uint64_t no_space0 = mine.ctrl.rank(0).counters.no_space.load();
  ASSERT_EQ(cb.abandon_load(x, cb.word(x)), Result::kOk) << last_error();
  // Rank 0 looks at once, at 5 ms and at half of its task's time.
  const uint64_t until = deadline_after_ms(kDeadlineMs);
  while (mine.ctrl.rank(0).counters.no_space.load() < no_space0 + 3 && now_ns() < until) usleep(500);
  ASSERT_GE(mine.ctrl.rank(0).counters.no_space.load(), no_space0 + 3) << "rank 0 never looked a third time";
  cb.release(held[0]);
  uint32_t again = 0;
  ASSERT_NO_FATAL_FAILURE(owner_of(cb, x_key(), &again));
  sim_fill(x_key(), cb.data_at(again), kShardBytes);
  ASSERT_EQ(cb.mark_ready(again), Result::kOk) << last_error();
  sh->loaded.set(1);
  cb.release(again);
  cb.release(x);  // the abandoned load's pin, as the store's late completion drops it
  for (size_t i = 1; i < held.size(); ++i) cb.release(held[i]);
  mine.ctrl.leave(1);
}

void load_x_slotless(const TestCache& parent, LastLookShared* sh) {
  ASSERT_TRUE(sh->full.wait_ge(1, deadline_after_ms(kDeadlineMs)));
  QueueRank me;
  QueueOptions qo = solo_queue();
  qo.no_space_backoff_ns = 60'000'000'000;  // pauses end at the relaxing's steps and the deadline only
  qo.no_space_backoff_max_ns = qo.no_space_backoff_ns;
  ASSERT_NO_FATAL_FAILURE(me.open(parent, 0, CacheOptions{}, qo, kShardBytes, kDeadlineMs));
  std::vector<uint8_t> dst(kShardBytes, 0xee);
  auto b = load_task(1, x_key(), dst.data(), kTaskLastLookMs);
  ASSERT_EQ(me.queue->submit(b), Result::kOk) << last_error();
  const uint64_t until = deadline_after_ms(kDeadlineMs);
  while (me.cache->ctrl().pin(0, sh->x_slot.load()).load() == 0 && now_ns() < until) usleep(200);
  sh->waiting.set(1);
  ASSERT_TRUE(b->wait_until(deadline_after_ms(kDeadlineMs))) << "the task hung";
  EXPECT_EQ(sh->loaded.get(), 1u) << "rank 1 loaded X again before rank 0's task ended";
  EXPECT_EQ(b->result(), Result::kOk) << b->error();
  EXPECT_EQ(sim_verify(x_key(), dst.data(), kShardBytes), kShardBytes);
  me.close(0);
}

TEST(CopierSpace, ASlotlessEntryLooksOnceMoreAtItsDeadline) {
  Shared<LastLookShared> sh;
  run_pair(abandon_then_reload, load_x_slotless, sh);
}

// A dump of a key whose write-through another rank has in flight waits for
// that write's outcome; the copier used to wait for it in place (await_write),
// up to the dump's deadline, and every entry behind it waited too. Rank 1 (a
// bare CacheBuffer) fills K and marks it Ready for its write-through, which
// never ends until told (a hung store). Rank 0 dumps K (deadline 20 s), then
// loads Y (6 s) from its sim store: the load is copied at once now; before,
// it ended with the dump, past its own deadline.
constexpr uint64_t kTaskDumpMs = 20000;
constexpr uint64_t kTaskLoadMs = 6000;

Key k_key() { return key(93101, 0); }
Key y_key() { return key(93102, 0); }

// K filled and Ready, its write-through begun by cb's rank (the stored word
// Writing), as a dump's owner does before its store.dump.
void begin_write_of_k(CacheBuffer& cb, uint32_t* k) {
  ASSERT_NO_FATAL_FAILURE(owner_of(cb, k_key(), k));
  fill_pattern(cb.data_at(*k), kShardBytes, k_key());
  ASSERT_EQ(cb.mark_ready_for_write(*k), Result::kOk) << last_error();
}

struct DumpShared {
  ShmSignal writing;   // rank 1's write-through of K is in flight
  ShmSignal l_ended;   // rank 0's load ended (in time or not)
  ShmSignal finished;  // rank 0 is done
  std::atomic<uint32_t> k_slot{0};
  std::atomic<uint64_t> l_ms{0};
};

void write_forever(const TestCache& parent, DumpShared* sh) {
  BareRank bare;
  ASSERT_NO_FATAL_FAILURE(join_bare(parent, 1, &bare));
  TestCache& mine = bare.mine;
  CacheBuffer& cb = *bare.cb;
  uint32_t k = 0;
  ASSERT_NO_FATAL_FAILURE(begin_write_of_k(cb, &k));
  sh->k_slot.store(k);
  sh->writing.set(1);
  ASSERT_TRUE(sh->l_ended.wait_ge(1, deadline_after_ms(kDeadlineMs)));
  ASSERT_EQ(cb.finish_write(k, true), Result::kOk) << last_error();
  cb.release(k);
  ASSERT_TRUE(sh->finished.wait_ge(1, deadline_after_ms(kDeadlineMs)));
  mine.ctrl.leave(1);
}

void dump_then_load(const TestCache& parent, DumpShared* sh) {
  ASSERT_TRUE(sh->writing.wait_ge(1, deadline_after_ms(kDeadlineMs)));
  QueueRank me;
  ASSERT_NO_FATAL_FAILURE(me.open(parent, 0, CacheOptions{}, solo_queue(), kShardBytes, kDeadlineMs));
  std::vector<uint8_t> src(kShardBytes), dst(kShardBytes, 0xee);
  fill_pattern(src.data(), kShardBytes, k_key());
  std::vector<TaskEntry> de(1);
  de[0].key = k_key();
  de[0].src = src.data();
  auto d = std::make_shared<Task>(1, TaskKind::kDump, de, deadline_after_ms(kTaskDumpMs));
  const uint64_t t0 = now_ns();
  ASSERT_EQ(me.queue->submit(d), Result::kOk) << last_error();
  // The dispatcher found K being written and pinned it for the copier.
  const BufferCtrl& ctrl = me.cache->ctrl();
  const uint64_t until = deadline_after_ms(kDeadlineMs);
  while (ctrl.pin(0, sh->k_slot.load()).load() == 0 && now_ns() < until) usleep(200);
  ASSERT_GE(ctrl.pin(0, sh->k_slot.load()).load(), 1u);
  auto l = load_task(2, y_key(), dst.data(), kTaskLoadMs);
  ASSERT_EQ(me.queue->submit(l), Result::kOk) << last_error();
  const bool l_in_time = l->wait_until(l->deadline_ns());
  sh->l_ms.store((now_ns() - t0) / 1'000'000);
  sh->l_ended.set(1);
  EXPECT_TRUE(l_in_time) << "the load ended past its deadline: the copier waited for a peer's write-through instead";
  ASSERT_TRUE(l->wait_until(deadline_after_ms(kDeadlineMs))) << "the load hung";
  EXPECT_EQ(l->result(), Result::kOk) << l->error();
  EXPECT_EQ(sim_verify(y_key(), dst.data(), kShardBytes), kShardBytes);
  ASSERT_TRUE(d->wait_until(deadline_after_ms(kDeadlineMs))) << "the dump hung";
  EXPECT_EQ(d->result(), Result::kOk) << d->error();
  sh->finished.set(1);
  me.close(0);
}

TEST(CopierDump, ADumpWaitingForAPeersWriteThroughDoesNotHoldBackALoad) {
  Shared<DumpShared> sh;
  run_pair(write_forever, dump_then_load, sh);
  std::printf("[CopierDump] the load (deadline %llu ms) ended at %llu ms\n",
              static_cast<unsigned long long>(kTaskLoadMs), static_cast<unsigned long long>(sh->l_ms.load()));
}

// The same wait when the writer dies: the copier looks at the liveness of
// the ranks it waits on every slice, finds the writer dead (recovery makes the
// write NotStored without ringing), and the dump writes the bytes itself. It
// used to look only after a slice in which nothing rang the doorbell (never,
// on a node whose other ranks work), and never in wait=poll: the dump then
// found the dead writer at its deadline and failed with a timeout (a helper's
// adversarial run; the other ranks' rings stand in for their work here).
struct KilledShared {
  ShmSignal writing;  // rank 1's write-through of K is in flight
  ShmSignal waiting;  // rank 0's dump waits for it
  std::atomic<uint32_t> k_slot{0};
  std::atomic<uint64_t> dumps{0};
  std::atomic<uint32_t> stored{0};
};

void write_then_die(const TestCache& parent, KilledShared* sh) {
  BareRank bare;
  ASSERT_NO_FATAL_FAILURE(join_bare(parent, 1, &bare));
  CacheBuffer& cb = *bare.cb;
  uint32_t k = 0;
  ASSERT_NO_FATAL_FAILURE(begin_write_of_k(cb, &k));
  cb.add_pin(k);  // the write's own pin
  sh->k_slot.store(k);
  sh->writing.set(1);
  for (;;) pause();  // until SIGKILL
}

void dump_past_a_dead_writer(const TestCache& parent, KilledShared* sh, WaitMode mode) {
  ASSERT_TRUE(sh->writing.wait_ge(1, deadline_after_ms(kDeadlineMs)));
  QueueRank me;
  QueueOptions qo = solo_queue();
  CacheOptions co;
  co.wait = mode;
  ASSERT_NO_FATAL_FAILURE(me.open(parent, 0, co, qo, kShardBytes, kDeadlineMs));
  std::vector<uint8_t> src(kShardBytes);
  fill_pattern(src.data(), kShardBytes, k_key());
  std::vector<TaskEntry> de(1);
  de[0].key = k_key();
  de[0].src = src.data();
  auto d = std::make_shared<Task>(1, TaskKind::kDump, de, deadline_after_ms(kTaskDumpMs));
  ASSERT_EQ(me.queue->submit(d), Result::kOk) << last_error();
  const BufferCtrl& ctrl = me.cache->ctrl();
  const uint32_t k = sh->k_slot.load();
  const uint64_t until = deadline_after_ms(kDeadlineMs);
  // In wait=futex the copier's sleep sets the stored word's waiters bit; in
  // wait=poll nothing shows, past the pin its dispatcher took for the copier.
  auto waits = [&] {
    return ctrl.pin(0, k).load() != 0 && (mode == WaitMode::kPoll || (ctrl.stored(k).load() & kStoredWaiters) != 0);
  };
  while (!waits() && now_ns() < until) usleep(200);
  ASSERT_TRUE(waits()) << "rank 0 never waited for rank 1's write-through";
  sh->waiting.set(1);
  EXPECT_TRUE(d->wait_until(d->deadline_ns())) << "the dump did not end by its deadline after its writer died";
  ASSERT_TRUE(d->wait_until(deadline_after_ms(kDeadlineMs))) << "the dump hung";
  EXPECT_EQ(d->result(), Result::kOk) << d->error();
  sh->dumps.store(queue_counters(ctrl.rank(0)).dumps.load());
  sh->stored.store(static_cast<uint32_t>(stored_state(ctrl.stored(k).load(), ctrl.slot(k).word.load())));
  me.close(0);
}

// Rank 2 stands in for the node's other work: it rings the completion
// doorbell every 5 ms, as every change of a word with waiters does.
void ring_often(const TestCache& parent, ShmSignal* stop) {
  BareRank bare;
  ASSERT_NO_FATAL_FAILURE(join_bare(parent, 2, &bare));
  TestCache& mine = bare.mine;
  CacheBuffer& cb = *bare.cb;
  while (stop->get() == 0) {
    cb.ring_bell();
    usleep(5000);
  }
  mine.ctrl.leave(2);
}

void run_killed_writer(WaitMode mode, bool rings) {
  TestCache tc;
  make_cache(params(kSlots, 0, kShardBytes, 8, 3), &tc);
  Shared<KilledShared> sh;
  Shared<ShmSignal> stop_rings;
  Children ch;
  const pid_t r1 = ch.spawn([&] { write_then_die(tc, sh.get()); });
  const pid_t r2 = rings ? ch.spawn([&] { ring_often(tc, stop_rings.get()); }) : 0;
  const pid_t r0 = ch.spawn([&] { dump_past_a_dead_writer(tc, sh.get(), mode); });
  ASSERT_TRUE(sh->waiting.wait_ge(1, deadline_after_ms(kDeadlineMs)));
  ch.kill_now(r1);
  EXPECT_EQ(ch.wait(r0, 2 * kDeadlineMs), 0);
  stop_rings->set(1);
  if (rings) {
    EXPECT_EQ(ch.wait(r2, kDeadlineMs), 0);
  }
  EXPECT_EQ(sh->dumps.load(), 1u) << "rank 0 wrote the dead writer's bytes through itself";
  EXPECT_EQ(sh->stored.load(), static_cast<uint32_t>(StoreState::kStored));
}

TEST(CopierDump, ADumpWaitingForAKilledWritersWriteThroughWritesTheBytesItself) {
  run_killed_writer(WaitMode::kFutex, false);
}

TEST(CopierDump, AKilledWriterIsFoundWhileOtherRanksRingTheDoorbell) { run_killed_writer(WaitMode::kFutex, true); }

TEST(CopierDump, AKilledWriterIsFoundInWaitPollMode) { run_killed_writer(WaitMode::kPoll, false); }

// A load waiting for a killed owner's load, on a node whose other ranks
// ring the doorbell: the copier finds the owner dead within a slice and takes
// the load over (the gap above was there for loads too, since the doorbell).
struct OwnerShared {
  ShmSignal owning;  // rank 1 owns Z and never fills it
  ShmSignal waiting; // rank 0's copier waits on it
  std::atomic<uint32_t> z_slot{0};
  std::atomic<uint32_t> result{~0u};
};

void own_then_die(const TestCache& parent, OwnerShared* sh) {
  BareRank bare;
  ASSERT_NO_FATAL_FAILURE(join_bare(parent, 1, &bare));
  CacheBuffer& cb = *bare.cb;
  uint32_t z = 0;
  ASSERT_NO_FATAL_FAILURE(owner_of(cb, z_key(), &z));
  sh->z_slot.store(z);
  sh->owning.set(1);
  for (;;) pause();  // until SIGKILL
}

void load_past_a_dead_owner(const TestCache& parent, OwnerShared* sh) {
  ASSERT_TRUE(sh->owning.wait_ge(1, deadline_after_ms(kDeadlineMs)));
  QueueRank me;
  ASSERT_NO_FATAL_FAILURE(me.open(parent, 0, CacheOptions{}, solo_queue(), kShardBytes, kDeadlineMs));
  std::vector<uint8_t> dst(kShardBytes, 0xee);
  auto t = load_task(1, z_key(), dst.data(), kTaskBMs);
  ASSERT_EQ(me.queue->submit(t), Result::kOk) << last_error();
  const BufferCtrl& ctrl = me.cache->ctrl();
  const uint32_t z = sh->z_slot.load();
  const uint64_t until = deadline_after_ms(kDeadlineMs);
  auto waits = [&] { return ctrl.pin(0, z).load() != 0 && word_has_waiters(ctrl.slot(z).word.load()); };
  while (!waits() && now_ns() < until) usleep(200);
  ASSERT_TRUE(waits()) << "rank 0's copier never waited on Z";
  sh->waiting.set(1);
  ASSERT_TRUE(t->wait_until(deadline_after_ms(kDeadlineMs))) << "the load hung";
  sh->result.store(static_cast<uint32_t>(t->result()));
  EXPECT_EQ(t->result(), Result::kOk) << t->error();
  EXPECT_EQ(sim_verify(z_key(), dst.data(), kShardBytes), kShardBytes);
  me.close(0);
}

TEST(CopierLoad, AKilledOwnerIsFoundWhileOtherRanksRingTheDoorbell) {
  TestCache tc;
  make_cache(params(kSlots, 0, kShardBytes, 8, 3), &tc);
  Shared<OwnerShared> sh;
  Shared<ShmSignal> stop_rings;
  Children ch;
  const pid_t r1 = ch.spawn([&] { own_then_die(tc, sh.get()); });
  const pid_t r2 = ch.spawn([&] { ring_often(tc, stop_rings.get()); });
  const pid_t r0 = ch.spawn([&] { load_past_a_dead_owner(tc, sh.get()); });
  ASSERT_TRUE(sh->waiting.wait_ge(1, deadline_after_ms(kDeadlineMs)));
  ch.kill_now(r1);
  EXPECT_EQ(ch.wait(r0, 2 * kDeadlineMs), 0);
  stop_rings->set(1);
  EXPECT_EQ(ch.wait(r2, kDeadlineMs), 0);
  EXPECT_EQ(sh->result.load(), static_cast<uint32_t>(Result::kOk)) << "the dead owner was found only at the deadline";
}

// An entry the copier comes to own (a take-over, or a key got again) while
// every one of the rank's io_depth I/Os is in flight never holds back the
// copier's other entries. The copier used to wait for depth inside
// start_load, until an older I/O ended or expired; with a hung store that is
// the hung load's deadline, and a hit queued behind ended with it. Now the
// entry stays owned and unsent, and the copier sends it in a later round.
//
// Rank 0's queue has io_depth 1, taken by A = {H}, a load the store never
// completes (A's deadline 2 s). Rank 1 (bare) owns X and fills Y (hit_key). Rank 0
// submits B = {X}: a waiter, in the copier. Rank 1 abandons X's load (its
// I/O pin stays), so rank 0's copier gets X again, as owner, with no depth
// left. Then rank 0 submits C = {Y}, a hit: C ends while A still waits for H;
// B loads X once H's I/O expires at A's deadline.
constexpr uint64_t kTaskAMs = 2000;  // C, a hit, takes a millisecond: 2 s is a hang, not slowness
Key hung_key() { return key(93201, 0); }
Key hit_key() { return key(93203, 0); }

struct DepthShared {
  ShmSignal ready;    // rank 1 owns X and holds Y, Ready
  ShmSignal waiting;  // rank 0's copier waits on X; H's load holds the depth
  ShmSignal owns;     // rank 0 owns X again, in a slot of its own
  ShmSignal finished; // rank 0 is done
  std::atomic<uint32_t> x_slot{0};
  std::atomic<uint64_t> c_ms{0};
};

void abandon_x_for_owner(const TestCache& parent, DepthShared* sh) {
  BareRank bare;
  ASSERT_NO_FATAL_FAILURE(join_bare(parent, 1, &bare));
  TestCache& mine = bare.mine;
  CacheBuffer& cb = *bare.cb;
  uint32_t x = 0, y = 0;
  ASSERT_NO_FATAL_FAILURE(owner_of(cb, x_key(), &x));
  ASSERT_NO_FATAL_FAILURE(owner_of(cb, hit_key(), &y));
  sim_fill(hit_key(), cb.data_at(y), kShardBytes);
  ASSERT_EQ(cb.mark_ready(y), Result::kOk) << last_error();
  sh->x_slot.store(x);
  sh->ready.set(1);
  ASSERT_TRUE(sh->waiting.wait_ge(1, deadline_after_ms(kDeadlineMs)));
  ASSERT_EQ(cb.abandon_load(x, cb.word(x)), Result::kOk) << last_error();
  // Rank 0's copier owns X in another slot (get() made it owner; it then
  // needs a depth it cannot have until A's deadline).
  auto owned = [&] {
    for (uint32_t s = 0; s < kSlots; ++s) {
      const SlotView v(cb.word(s));
      if (s != x && cb.holds_key(s, x_key()) && v.state() == State::kIdle && !v.is_unowned() && v.owner() == 0)
        return true;
    }
    return false;
  };
  const uint64_t until = deadline_after_ms(kDeadlineMs);
  while (!owned() && now_ns() < until) usleep(200);
  ASSERT_TRUE(owned()) << "rank 0's copier never took X's load over";
  sh->owns.set(1);
  ASSERT_TRUE(sh->finished.wait_ge(1, deadline_after_ms(kDeadlineMs)));
  cb.release(x);
  cb.release(y);
  mine.ctrl.leave(1);
}

void own_without_depth(const TestCache& parent, DepthShared* sh) {
  ASSERT_TRUE(sh->ready.wait_ge(1, deadline_after_ms(kDeadlineMs)));
  QueueRank me;
  QueueOptions qo = solo_queue();
  qo.io_depth = 1;
  ASSERT_NO_FATAL_FAILURE(me.open(parent, 0, CacheOptions{}, qo, kShardBytes, kDeadlineMs));
  me.store->hang_key(hung_key());
  std::vector<uint8_t> da(kShardBytes, 0xee), db(kShardBytes, 0xee), dc(kShardBytes, 0xee);
  const uint64_t t0 = now_ns();
  auto a = load_task(1, hung_key(), da.data(), kTaskAMs);
  ASSERT_EQ(me.queue->submit(a), Result::kOk) << last_error();
  const uint64_t until = deadline_after_ms(kDeadlineMs);
  while (me.queue->io_in_flight() == 0 && now_ns() < until) usleep(200);
  ASSERT_EQ(me.queue->io_in_flight(), 1u) << "H's load never went to the store";
  auto b = load_task(2, x_key(), db.data(), kTaskBMs);
  ASSERT_EQ(me.queue->submit(b), Result::kOk) << last_error();
  const BufferCtrl& ctrl = me.cache->ctrl();
  const uint32_t x = sh->x_slot.load();
  while (!word_has_waiters(ctrl.slot(x).word.load()) && now_ns() < until) usleep(200);
  ASSERT_TRUE(word_has_waiters(ctrl.slot(x).word.load())) << "rank 0's copier never waited on X";
  sh->waiting.set(1);
  ASSERT_TRUE(sh->owns.wait_ge(1, deadline_after_ms(kDeadlineMs)));
  auto c = load_task(3, hit_key(), dc.data(), kTaskBMs);
  ASSERT_EQ(me.queue->submit(c), Result::kOk) << last_error();
  ASSERT_TRUE(c->wait_until(deadline_after_ms(kDeadlineMs))) << "task C hung";
  sh->c_ms.store((now_ns() - t0) / 1'000'000);
  EXPECT_FALSE(a->done()) << "task C (a hit) ended only after A's hung load gave its I/O depth back, at "
                          << sh->c_ms.load() << " ms: the copier waited for depth in place";
  EXPECT_EQ(c->result(), Result::kOk) << c->error();
  EXPECT_EQ(sim_verify(hit_key(), dc.data(), kShardBytes), kShardBytes);
  ASSERT_TRUE(a->wait_until(deadline_after_ms(kDeadlineMs))) << "task A hung";
  EXPECT_EQ(a->result(), Result::kTimeout) << a->error();
  ASSERT_TRUE(b->wait_until(deadline_after_ms(kDeadlineMs))) << "task B hung";
  EXPECT_EQ(b->result(), Result::kOk) << b->error();
  EXPECT_EQ(sim_verify(x_key(), db.data(), kShardBytes), kShardBytes);
  sh->finished.set(1);
  me.close(0);
}

TEST(CopierDepth, AnEntryWaitingForIoDepthDoesNotHoldBackTheCopiesOfOthers) {
  Shared<DepthShared> sh;
  run_pair(abandon_x_for_owner, own_without_depth, sh);
  std::printf("[CopierDepth] task C (a hit) ended at %llu ms; A's deadline %llu ms\n",
              static_cast<unsigned long long>(sh->c_ms.load()), static_cast<unsigned long long>(kTaskAMs));
}

// The copier's unsent entry is not starved by its own dispatcher. Both want
// the next free place of io_depth; the dispatcher, woken by the completion
// itself, always came first, and in wait=poll the copier looks only once a
// poll, so its take-over waited behind every miss the dispatcher had to send
// (a helper's review: up to 217 ms, once past the task's deadline). While
// the copier wants a place, the dispatcher now leaves it one.
//
// Rank 0's queue: wait=poll with a long poll, io_depth 1. B = {X} waits on
// rank 1's load of X; D's misses keep the one place busy; rank 1 abandons X,
// so rank 0's copier owns it again and finds the place taken by one of D's
// loads: X's load goes next, not after D's next loads (about 50 a poll).
constexpr uint32_t kStarveSlots = 1024;
constexpr uint32_t kStarveMisses = 400;
Key miss_key(uint32_t i) { return key(94000 + i, 0); }

struct StarveShared {
  ShmSignal ready, go, abandoned, finished;
  std::atomic<uint32_t> x_slot{0};
  std::atomic<uint64_t> loads_between{0};
};

void own_then_abandon(const TestCache& parent, StarveShared* sh) {
  BareRank bare;
  ASSERT_NO_FATAL_FAILURE(join_bare(parent, 1, &bare));
  CacheBuffer& cb = *bare.cb;
  uint32_t x = 0;
  ASSERT_NO_FATAL_FAILURE(owner_of(cb, x_key(), &x));
  sh->x_slot.store(x);
  sh->ready.set(1);
  ASSERT_TRUE(sh->go.wait_ge(1, deadline_after_ms(kDeadlineMs)));
  ASSERT_EQ(cb.abandon_load(x, cb.word(x)), Result::kOk) << last_error();
  sh->abandoned.set(1);
  ASSERT_TRUE(sh->finished.wait_ge(1, deadline_after_ms(kDeadlineMs)));
  cb.release(x);
  bare.mine.ctrl.leave(1);
}

void take_over_beside_misses(const TestCache& parent, StarveShared* sh) {
  ASSERT_TRUE(sh->ready.wait_ge(1, deadline_after_ms(kDeadlineMs)));
  QueueRank me;
  QueueOptions qo = solo_queue();
  qo.io_depth = 1;
  CacheOptions co;
  co.wait = WaitMode::kPoll;
  co.poll_interval_ms = 50;
  ASSERT_NO_FATAL_FAILURE(me.open(parent, 0, co, qo, kShardBytes, kDeadlineMs));
  std::vector<uint8_t> db(kShardBytes, 0xee), dd(kShardBytes * kStarveMisses, 0);
  auto b = load_task(1, x_key(), db.data(), kTaskBMs);
  ASSERT_EQ(me.queue->submit(b), Result::kOk) << last_error();
  const BufferCtrl& ctrl = me.cache->ctrl();
  const uint64_t until = deadline_after_ms(kDeadlineMs);
  while (ctrl.pin(0, sh->x_slot.load()).load() == 0 && now_ns() < until) usleep(200);
  ASSERT_NE(ctrl.pin(0, sh->x_slot.load()).load(), 0u) << "B never waited on X";
  std::vector<TaskEntry> de(kStarveMisses);
  for (uint32_t i = 0; i < kStarveMisses; ++i) {
    de[i].key = miss_key(i);
    de[i].dst = dd.data() + uint64_t{i} * kShardBytes;
  }
  auto d = std::make_shared<Task>(2, TaskKind::kLoad, de, deadline_after_ms(kDeadlineMs));
  ASSERT_EQ(me.queue->submit(d), Result::kOk) << last_error();
  const QueueCounters& qc = queue_counters(ctrl.rank(0));
  while (qc.backend_loads.load() < 5 && now_ns() < until) usleep(100);
  sh->go.set(1);
  ASSERT_TRUE(sh->abandoned.wait_ge(1, deadline_after_ms(kDeadlineMs)));
  // The copier owns X again (in another slot) and tries for a place at once,
  // while one of D's loads holds it.
  const uint32_t old_x = sh->x_slot.load();
  auto x_in = [&](State want) {
    for (uint32_t s = 0; s < kStarveSlots; ++s) {
      const SlotView v(me.cache->word(s));
      if (s != old_x && v.state() == want && (want != State::kIdle || (!v.is_unowned() && v.owner() == 0)) &&
          me.cache->holds_key(s, x_key()))
        return true;
    }
    return false;
  };
  while (!x_in(State::kIdle) && now_ns() < until) usleep(50);
  ASSERT_TRUE(x_in(State::kIdle)) << "rank 0's copier never owned X again";
  const uint64_t at_owned = qc.backend_loads.load();
  // X's bytes land (B itself ends only at the copier's next poll).
  while (!x_in(State::kReady) && now_ns() < until) usleep(50);
  sh->loads_between.store(qc.backend_loads.load() - at_owned);
  ASSERT_TRUE(b->wait_until(deadline_after_ms(kDeadlineMs))) << "task B hung";
  EXPECT_EQ(b->result(), Result::kOk) << b->error();
  EXPECT_EQ(sim_verify(x_key(), db.data(), kShardBytes), kShardBytes);
  // X's own load, the D load in flight, and those that went out after X's
  // while the test looked (one a millisecond); without the kept place, every
  // D load of the copier's poll (about 40 in 50 ms) went before X's.
  EXPECT_LE(sh->loads_between.load(), 10u)
      << "X's load waited behind the dispatcher's misses: each freed place went to the dispatcher";
  ASSERT_TRUE(d->wait_until(deadline_after_ms(kDeadlineMs))) << "task D hung";
  EXPECT_EQ(d->result(), Result::kOk) << d->error();
  sh->finished.set(1);
  me.close(0);
}

TEST(CopierDepth, AnUnsentEntryIsNotStarvedByItsDispatcher) {
  Shared<StarveShared> sh;
  run_pair(own_then_abandon, take_over_beside_misses, sh, kStarveSlots);
  std::printf("[CopierDepth] loads sent after the copier owned X, X's included: %llu (D: %u misses)\n",
              static_cast<unsigned long long>(sh->loads_between.load()), kStarveMisses);
}

}  // namespace
}  // namespace ucm::test
