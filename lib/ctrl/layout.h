// The shared control region: its layout, which is ABI.
//
// One memfd, sealed against resizing, mapped by every local rank at a different
// address: everything below is fixed-width and addressed by offsets from the
// region base, never by pointers. Change any struct or the meaning of a field,
// bump kCtrlAbi.
//
//   [CtrlHeader][CtrlGlobals][RankRecord x kMaxRanks][Bucket x bucket_count]
//   [SlotMeta x total_slots][pin rows: uint32 x total_slots, one row per rank]
//   [accessed: uint8 x total_slots][stored: uint32 x total_slots]
//   [guard: uint64 x total_slots]
//
// Slots [0, regular_slots) are the regular pool (CLOCK/ring eviction); slots
// [regular_slots, total_slots) are the reserved pool, used only by Prealloc.
//
// Who writes what:
// - Header: the creator, once; `magic` last (release) means "ready".
// - Bucket.lock: any rank (shared_lock, holder id = local rank + 1).
//   Bucket.head and SlotMeta.next: only the holder of that bucket's lock, each
//   edit one release store, so a chain is well-formed at every instruction.
// - SlotMeta key fields: only the rank holding the slot's claim; and the
//   owner of a load past its deadline (CacheBuffer::abandon_load), which
//   clears `shard` while its pins keep every claimer out, under the bucket
//   lock, after unlinking the slot: the slot then floats keyless and Failed
//   until its pins go, and CLOCK takes it as it takes any floating slot.
// - SlotMeta.word (the futex word): its transition table in slot_word.h says
//   who may make each change (T0-T10) and which release each acquire pairs with.
// - pins[r][slot]: only rank r (and recovery, after r died).
// - accessed[slot]: hits, loads and Touch set it (1); the CLOCK hand clears
//   it. kAccessedUnstored (2) marks a slot whose bytes are not in the store:
//   set by the rank that becomes its writer, kept by hits, cleared only by
//   that write's success or a re-key (clock.h).
// - stored[slot]: the dumpers of a Ready slot, and recovery (see below).
// - guard[slot]: the eviction protection of a loaded shard (protect.h): the
//   claimer resets it on re-key, the load's owner arms it just before Ready,
//   each rank that takes the slot sets its bit (fetch_or, once).
// - RankRecord r: rank r, and recovery after r died.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>

#include "ctrl/slot_word.h"

namespace ucm {

constexpr uint64_t kCtrlMagic = 0x314c525443434d55ull;  // "UCMCCTRL1" little-endian-ish tag
constexpr uint32_t kCtrlAbi = 15;  // 9: CtrlParams whole in the header, with tunables_hash; 10: log-linear latency buckets; 11: per-slot guard words, copiers and deferral bell; 12: the queue counters gain inline_tasks (queue/counters.h); 13: RankRecord.tasks_passed and the guard's task stamp (protect.h); 14: RankRecord.idle_since_ms and lapsed_ms (protect.h); 15: CtrlGlobals.space_waiting and space_bell (space_bell.h), QueueCounters.protect_overrides
constexpr uint32_t kMaxRanks = 16;      // local ranks per node sharing one cache
constexpr uint32_t kNoSlot = 0xffffffffu;
constexpr uint32_t kEmptyShard = 0xffffffffu;  // SlotMeta.shard of a slot that holds no key

constexpr uint8_t kAccessedUnstored = 2;  // accessed[slot]: CLOCK keeps it over every stored slot

enum class EvictMode : uint32_t { kClock = 0, kRing = 1 };
enum class WaitMode : uint32_t { kFutex = 0, kPoll = 1 };

// ---- the futex word of a slot -------------------------------------------------
// SlotMeta.word: its encoding, transition table, memory-order pairs and the
// functions that compute a new word are in ctrl/slot_word.h, the only place
// its rules are written.
//
// The completion doorbell (CtrlGlobals.bell) lets one thread sleep on many
// slots at once (a copier with entries in several loads): it sets the
// waiters bit of every word it waits on, reads the bell, re-reads the words,
// and futex-waits on the bell's value. Whoever changes a word whose waiters
// bit was set wakes the word's sleepers and then bumps the bell (seq_cst
// add) and wakes the bell's. A hit and an uncontended miss never see the bit,
// so they never touch the bell. Pairs: the changer's word CAS precedes its
// bell add; a sleeper that reads the bumped bell re-reads the word after it
// and sees the change; one that read the bell before sleeps on a stale value
// and returns at once. Recovery (a dead or leaving rank's load, hold or
// write dropped: ctrl/pins.h) rings it too when the waiters bit was set; and
// a sleeper looks every liveness slice whether the ranks it waits on live,
// whatever rang in between (CacheBuffer::check_waited_on), so that a dead
// rank nobody reaped yet is found.

// ---- the stored word of a slot (stored[slot]) ---------------------------------
// Whether the bytes of a Ready slot are in the backend store. Every local rank
// dumps through the same slot, so this lives here, not in a rank's queue.
// bits 0-1: StoreState, bit 2: someone sleeps on this word, bits 3-8: writer
// local rank (kNoOwner = none), bits 10-31: epoch.
//
// The word speaks only for the Ready residency whose futex-word version equals
// its epoch; any other value is stale and reads as kStored. Ready is reached
// only through a load (its bytes came from the store) or a dump owner that
// writes this word first, so a load's miss path never touches it, and a
// re-key resets it without a store: the new Ready version differs. (After the
// 22-bit version wraps, a stale word can match again; it is then NotStored or
// WriteFailed at worst, never Writing, since a write holds a pin until it
// ends: the cost is one redundant write-through, never a lost one.)
//
// Transitions. Each is made by a rank holding a reference (pin or hold) on
// the slot while it is Ready, so its key and Ready version cannot change
// underneath; recovery acts for the dead.
//   from              to               who, how                                  pairs with
//   stale             Writing(r, v)    dump owner r, release store, before the   [S1] the Ready CAS (release) that
//                                      CAS that makes the slot Ready (version v)      readers acquire; then they load
//                                      (nobody else writes the stored word of         this word (acquire)
//                                      a slot that is not Ready)
//   NotStored,        Writing(r)       a dumper r that found the slot Ready:     [S2] CAS acq_rel: one writer per node
//   WriteFailed(x)                     it writes the slot's bytes through
//   Writing(r)        Stored           r: its write-through succeeded            [S3] CAS release -> a sleeper's
//   Writing(r)        WriteFailed(r)   r: its write-through failed                    acquire load after its wake
//   Writing(r)        NotStored        recovery or leave(): r is dead/leaving    [S3]
// A sleeper (a dumper waiting for another rank's write) sets the waiters bit
// by CAS and futex-waits on exactly the value it saw, or on the completion
// doorbell beside its other words (a copier, as for SlotMeta.word above);
// every transition out of Writing clears the bit and, if it was set, wakes
// all and rings the doorbell (finish_write, and drop_rank_write for a writer
// that left or died). A sleeper woken by
// WriteFailed reports that write's failure; by NotStored it becomes the
// writer (S2). A dumper that finds WriteFailed without having waited for it
// writes again (S2): a dump never answers OK for bytes the store lacks.
enum class StoreState : uint32_t { kNotStored = 0, kWriting = 1, kStored = 2, kWriteFailed = 3 };

constexpr uint32_t kStoredStateMask = 0x3u;
constexpr uint32_t kStoredWaiters = 0x4u;
constexpr uint32_t kStoredEpochShift = 10;

inline uint32_t stored_make(StoreState s, uint32_t writer, uint32_t epoch) {
  return (epoch << kStoredEpochShift) | (writer << kWordOwnerShift) | static_cast<uint32_t>(s);
}
inline uint32_t stored_writer(uint32_t sw) { return (sw & kWordOwnerMask) >> kWordOwnerShift; }
inline uint32_t stored_epoch(uint32_t sw) { return sw >> kStoredEpochShift; }
// What stored word `sw` says about a slot whose futex word is the Ready `w`.
inline StoreState stored_state(uint32_t sw, uint32_t w) {
  return stored_epoch(sw) == word_version(w) ? static_cast<StoreState>(sw & kStoredStateMask) : StoreState::kStored;
}

// ---- structs ------------------------------------------------------------------

// The layout parameters: everything that decides where a byte of the region
// lies and what the slots mean. One struct, copied whole into the header
// (below), into the boot socket's PlaneDescriptor (boot/fd_exchange.h) and
// out of them; ctrl_param_fields() (buffer_ctrl.h) lists its fields once for
// the fingerprint and for the field-by-field mismatch message. Layout is ABI.
struct CtrlParams {
  uint64_t slot_bytes = 0;             // bytes per slot (one shard)
  uint32_t regular_slots = 0;          // slots CLOCK/ring may evict
  uint32_t reserved_slots = 0;         // slots only Prealloc uses
  uint32_t bucket_count = 0;           // 0: the next power of two >= regular + reserved
  uint32_t shards_per_block = 0;       // shard indexes are < this
  uint32_t max_ranks = 0;              // local ranks that may attach, 1..kMaxRanks
  EvictMode evict = EvictMode::kClock;  // uint32_t on the wire
  // A hash of every layout row of the tunables table (api/config.h,
  // tunables_layout_hash): rows that the planes do not spell out above
  // (order, wait, liveness, the backend...) but every rank of a node must
  // agree on. 0 for callers without a configuration (tests, benchmarks).
  uint64_t tunables_hash = 0;
};
static_assert(sizeof(CtrlParams) == 40, "CtrlParams is ABI: no padding, fixed-width fields");
static_assert(sizeof(EvictMode) == 4);
static_assert(offsetof(CtrlParams, tunables_hash) == 32);

// Written once by the creator. `magic` last: attach refuses a region without it.
struct alignas(64) CtrlHeader {
  uint64_t magic;             // creator, written last (release): "ready"
  uint32_t abi;               // creator: kCtrlAbi; attach refuses a mismatch
  uint32_t header_bytes;      // creator: sizeof(CtrlHeader) as compiled there
  uint64_t fingerprint;       // creator: ctrl_fingerprint(params)
  uint64_t region_bytes;      // creator: size of the whole region
  CtrlParams params;          // creator: resolved (bucket_count a power of two)
  uint64_t buckets_off;       // creator: offsets from the region base
  uint64_t slots_off;
  uint64_t pins_off;
  uint64_t pin_row_bytes;     // creator: bytes between two ranks' pin rows
  uint64_t accessed_off;
  uint64_t stored_off;
  uint8_t reserved_[8];
};
static_assert(sizeof(CtrlHeader) == 128);
static_assert(offsetof(CtrlHeader, magic) == 0);
static_assert(offsetof(CtrlHeader, fingerprint) == 16);
static_assert(offsetof(CtrlHeader, params) == 32);
static_assert(offsetof(CtrlHeader, buckets_off) == 72);

// Node-wide mutable state, one cache line per writer-hot field.
struct alignas(64) CtrlGlobals {
  alignas(64) std::atomic<uint64_t> clock_hand;     // any rank: regular pool cursor
  alignas(64) std::atomic<uint64_t> reserved_hand;  // any rank: reserved pool cursor
  alignas(64) std::atomic<uint32_t> unused_regular;  // any rank: next never-used regular slot
  std::atomic<uint32_t> unused_reserved;             // any rank: next never-used reserved slot (offset)
  std::atomic<uint32_t> departing;                   // rank r sets bit r when it enters finalize (departure.h)
  std::atomic<uint32_t> copiers;                     // bit r: rank r copies the node's loads (protect.h); r, leave, reap
  std::atomic<uint32_t> protect_grace_ms;            // the creator, before any peer attaches: 0 = no protection
  std::atomic<uint32_t> deferring;                   // bit r: rank r's dispatcher sleeps on defer_bell (protect.h)
  std::atomic<uint32_t> defer_bell;                  // a rank that starts serving a key while someone defers
  alignas(64) std::atomic<uint64_t> recovery_lock;   // the reaper of dead ranks (process_lock: pid + start time)
  std::atomic<uint32_t> reap_count;                  // reaper: completed reaps
  std::atomic<uint32_t> bell;                        // any rank: the completion doorbell (below)
  // Read by every release (ctrl/space_bell.h): a line of its own, written
  // only while some rank waits for a free slot.
  alignas(64) std::atomic<uint32_t> space_waiting;   // bit r: rank r's dispatcher sleeps on space_bell (NoSpace)
  std::atomic<uint32_t> space_bell;                  // a release while someone waits for space bumps it
};
static_assert(sizeof(CtrlGlobals) == 320);
static_assert(offsetof(CtrlGlobals, recovery_lock) == 192);

enum class RankState : uint32_t { kFree = 0, kJoining = 1, kAlive = 2, kReaping = 3 };

// Per-rank counters of the cache core; only rank r writes its own (relaxed adds).
struct RankCounters {
  std::atomic<uint64_t> hits;
  std::atomic<uint64_t> owner_misses;       // new key: victim taken, this rank loads
  std::atomic<uint64_t> takeovers;          // Idle/Failed slot re-owned by this rank
  std::atomic<uint64_t> waits;              // Get answered Waiter
  std::atomic<uint64_t> evictions;          // a resident key was evicted by this rank
  std::atomic<uint64_t> no_space;           // Get answered NoSpace
  std::atomic<uint64_t> prealloc_made;
  std::atomic<uint64_t> prealloc_used;      // a takeover of a preallocated slot
  std::atomic<uint64_t> touched_slots;
  std::atomic<uint64_t> reaps;              // dead ranks this rank recovered
};
static_assert(sizeof(RankCounters) == 8 * 10);

// One per local rank, 4 KiB each. Line 0 is the identity; the counters follow.
// The rest of the record belongs to the load queue: its per-rank counters
// (queue/counters.h, a layer above this one). The region reserves the bytes
// (zero in a new region) and never reads them, so where every byte lies is
// decided here, and what the queue counts is decided in queue/.
struct alignas(64) RankRecord {
  std::atomic<uint32_t> state;        // rank r (join/leave), recovery (reap): RankState
  std::atomic<int32_t> pid;           // rank r, before state = kAlive
  std::atomic<uint64_t> start_ticks;  // rank r: start time of pid (pid reuse guard)
  std::atomic<uint64_t> generation;   // rank r: bumped at each join
  std::atomic<uint32_t> tasks_passed; // rank r's queue: load tasks it has finished dispatching (protect.h); 0 at join
  std::atomic<uint32_t> idle_since_ms; // rank r's queue: protect_now_ms() (never 0) since it passed every load task it took, 0 while one is in it (protect.h); 0 at join
  std::atomic<uint32_t> lapsed_ms;     // any rank's evictor: protect_now_ms() (never 0) when a slot's grace ran out owed to rank r while r was idle (protect.h); 0 at join
  uint8_t pad_[28];
  alignas(64) RankCounters counters;
  alignas(8) uint8_t queue_area[4096 - 64 - sizeof(RankCounters)];  // rank r's queue only
};
static_assert(offsetof(RankRecord, queue_area) == 144);
static_assert(sizeof(RankRecord) == 4096);

struct Bucket {
  std::atomic<uint32_t> lock;  // shared_lock word
  std::atomic<uint32_t> head;  // holder of `lock`: first slot of the chain, kNoSlot if empty
};
static_assert(sizeof(Bucket) == 8);

// Hits only read this struct; writes come from misses, evictions and state
// changes, so two slots per cache line costs no false sharing on the hit path.
struct SlotMeta {
  std::atomic<uint64_t> key_lo;  // claim holder: block id, low half
  std::atomic<uint64_t> key_hi;  // claim holder: block id, high half
  std::atomic<uint32_t> shard;   // claim holder: shard index, kEmptyShard when empty
  std::atomic<uint32_t> next;    // holder of the chain's bucket lock: next slot in chain
  std::atomic<uint32_t> word;    // the futex word: slot_word.h (transitions T0-T10)
  std::atomic<uint32_t> claim;   // 0, or holder id of the rank re-keying this slot
};
static_assert(sizeof(SlotMeta) == 32);
static_assert(offsetof(SlotMeta, word) == 24);

constexpr size_t kCtrlGlobalsOff = sizeof(CtrlHeader);
constexpr size_t kRanksOff = kCtrlGlobalsOff + sizeof(CtrlGlobals);

}  // namespace ucm
