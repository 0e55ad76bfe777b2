#include "boot/node.h"

#include <unistd.h>

#include <algorithm>
#include <climits>
#include <cinttypes>
#include <cstring>
#include <mutex>

#include "ctrl/layout.h"
#include "common/log.h"
#include "common/time.h"

namespace ucm {
namespace {

Result mpi_check(int rc, const char* what) {
  if (rc == MPI_SUCCESS) return Result::kOk;
  char msg[MPI_MAX_ERROR_STRING];
  int len = 0;
  MPI_Error_string(rc, msg, &len);
  return fail(Result::kSystem, "%s: %s", what, msg);
}

#define UCM_MPI(call) UCM_CHECK(mpi_check((call), #call))

constexpr uint64_t kWatchSliceNs = 50'000'000;

// A collective given up on (a peer died) may still complete into its
// buffers: they live on the heap, freed only once it has completed.
struct NodeNumbering {
  int leader = 0, before = 0, id = 0, count = 0;
};

// An allgather's buffers: each rank's `send`, everybody's in `recv`.
struct Gathered {
  std::vector<char> send, recv;
};

struct StatusMessage {
  int32_t result;
  char text[500];
};

// The watched ranks that are gone, as "1 (pid 123), 3 (pid 456)"; empty if none.
std::string dead_ranks(const std::vector<ProcessIdentity>& watch) {
  std::string dead;
  for (size_t i = 0; i < watch.size(); ++i)
    if (!is_alive(watch[i]))
      dead.append(dead.empty() ? "" : ", ").append(std::to_string(i)).append(" (pid ")
          .append(std::to_string(watch[i].pid)).append(")");
  return dead;
}
}  // namespace

Result wait_watching(MPI_Request* req, const std::vector<ProcessIdentity>* watch, const char* what) {
  if (!watch) return mpi_check(MPI_Wait(req, MPI_STATUS_IGNORE), what);
  uint64_t nap = 20'000, next_look = now_ns() + kWatchSliceNs;
  for (;;) {
    int flag = 0;
    const int rc = MPI_Test(req, &flag, MPI_STATUS_IGNORE);
    if (rc == MPI_SUCCESS && flag) return Result::kOk;
    // An MPI that reports the failure itself (a process-failure error) is
    // still a death to name, if one of the node's ranks is gone.
    const bool look = rc != MPI_SUCCESS || now_ns() >= next_look;
    const std::string dead = look ? dead_ranks(*watch) : std::string();
    if (!dead.empty())
      return fail(Result::kPeerDead, "local rank(s) %s died during ucm_cache_init, in %s", dead.c_str(), what);
    UCM_CHECK(mpi_check(rc, what));
    if (look) next_look = now_ns() + kWatchSliceNs;
    sleep_for_ns(nap);
    nap = std::min<uint64_t>(nap * 2, 1'000'000);
  }
}

namespace {
struct StatusExchange {
  int mine = INT_MAX, first = INT_MAX;
  StatusMessage m{};
};
}  // namespace

void keep_for_abandoned_collective(void* buffer) {
  static std::mutex mu;
  static auto* kept = new std::vector<void*>();  // never freed: reachable, not a leak
  std::lock_guard<std::mutex> g(mu);
  kept->push_back(buffer);
}

Result collective_status(MPI_Comm comm, Result local, const std::vector<ProcessIdentity>* watch) {
  int rank = 0;
  MPI_Comm_rank(comm, &rank);
  const std::string mine = ok(local) ? std::string() : last_error();
  // A collective given up on may still complete into its buffers: they are
  // freed only once it has, and left allocated otherwise.
  auto* s = new StatusExchange;
  s->mine = ok(local) ? INT_MAX : rank;
  MPI_Request q = MPI_REQUEST_NULL;
  Result r = mpi_check(MPI_Iallreduce(&s->mine, &s->first, 1, MPI_INT, MPI_MIN, comm, &q), "MPI_Iallreduce");
  if (ok(r)) r = wait_watching(&q, watch, "the node's exchange of each rank's init status (MPI_Iallreduce)");
  if (ok(r) && s->first != INT_MAX) {
    if (rank == s->first) {
      s->m.result = static_cast<int32_t>(local);
      std::snprintf(s->m.text, sizeof(s->m.text), "%s", mine.c_str());
    }
    r = mpi_check(MPI_Ibcast(&s->m, sizeof(s->m), MPI_BYTE, s->first, comm, &q), "MPI_Ibcast");
    if (ok(r)) r = wait_watching(&q, watch, "the node's exchange of the first failing rank's message (MPI_Ibcast)");
  }
  if (!ok(r)) {
    keep_for_abandoned_collective(s);
    // Both parts, also when both name a death: the exchange's list names every
    // rank gone by now (the one that died first among them), while this rank's
    // own step may blame a rank that only left after it saw that death.
    return fail(r, "%s%s%s", last_error().c_str(), ok(local) ? "" : "; before that, this rank: ", mine.c_str());
  }
  const StatusExchange got = *s;
  delete s;
  if (got.first == INT_MAX) return Result::kOk;
  if (rank == got.first) return local;  // keep our own message as it is
  return fail(static_cast<Result>(got.m.result), "rank %d: %s", got.first, got.m.text);
}

namespace {
// Node ids: the nodes numbered by their local rank 0, in rank order (over
// every rank, watching this node's).
Result number_nodes(NodeContext* n) {
  auto* ids = new NodeNumbering;
  ids->leader = n->local_rank == 0 ? 1 : 0;
  MPI_Request q = MPI_REQUEST_NULL;
  Result r = mpi_check(MPI_Iexscan(&ids->leader, &ids->before, 1, MPI_INT, MPI_SUM, n->comm, &q), "MPI_Iexscan");
  if (ok(r)) r = wait_watching(&q, &n->local_ids, "numbering the nodes (MPI_Iexscan)");
  if (ok(r)) {
    if (n->rank == 0) ids->before = 0;  // MPI_Exscan leaves rank 0's result undefined
    ids->id = n->local_rank == 0 ? ids->before : 0;
    r = mpi_check(MPI_Ibcast(&ids->id, 1, MPI_INT, 0, n->node, &q), "MPI_Ibcast");
  }
  if (ok(r)) r = wait_watching(&q, &n->local_ids, "numbering the nodes (MPI_Ibcast)");
  if (ok(r)) r = mpi_check(MPI_Iallreduce(&ids->leader, &ids->count, 1, MPI_INT, MPI_SUM, n->comm, &q), "MPI_Iallreduce");
  if (ok(r)) r = wait_watching(&q, &n->local_ids, "counting the nodes (MPI_Iallreduce)");
  if (!ok(r)) {
    keep_for_abandoned_collective(ids);
    return r;
  }
  n->node_id = ids->id;
  n->node_count = ids->count;
  delete ids;
  return Result::kOk;
}
}  // namespace

Result bcast_watching(void* buf, size_t bytes, const NodeContext& n, const char* what) {
  auto* sent = new std::vector<char>(static_cast<const char*>(buf), static_cast<const char*>(buf) + bytes);
  MPI_Request q = MPI_REQUEST_NULL;
  if (MPI_Ibcast(sent->data(), static_cast<int>(bytes), MPI_BYTE, 0, n.node, &q) != MPI_SUCCESS) {
    delete sent;
    return fail(Result::kSystem, "%s over the node communicator failed (MPI_Ibcast)", what);
  }
  if (const Result r = wait_watching(&q, &n.local_ids, what); !ok(r)) {
    keep_for_abandoned_collective(sent);
    return r;
  }
  std::memcpy(buf, sent->data(), bytes);
  delete sent;
  return Result::kOk;
}

Result node_setup(MPI_Comm user_comm, uint32_t ranks_per_node, NodeContext* out) {
  NodeContext n;
  UCM_MPI(MPI_Comm_dup(user_comm, &n.comm));
  // Errors come back as codes on our communicators, never abort the job.
  MPI_Comm_set_errhandler(n.comm, MPI_ERRORS_RETURN);
  MPI_Comm_rank(n.comm, &n.rank);
  MPI_Comm_size(n.comm, &n.size);
  MPI_Comm shared = MPI_COMM_NULL;
  UCM_MPI(MPI_Comm_split_type(n.comm, MPI_COMM_TYPE_SHARED, n.rank, MPI_INFO_NULL, &shared));
  // Every rank of the machine splits, whatever its ranks_per_node: ranks that
  // disagree on it (config agreement comes later and names the field) must
  // still make the same collective calls.
  int shared_rank = 0;
  MPI_Comm_rank(shared, &shared_rank);
  const int color = ranks_per_node > 0 ? shared_rank / static_cast<int>(ranks_per_node) : 0;
  const int split = MPI_Comm_split(shared, color, shared_rank, &n.node);
  MPI_Comm_free(&shared);
  UCM_MPI(split);
  MPI_Comm_set_errhandler(n.node, MPI_ERRORS_RETURN);
  MPI_Comm_rank(n.node, &n.local_rank);
  MPI_Comm_size(n.node, &n.local_size);

  // The node's pids first: every collective after this one watches them, so
  // a local rank killed in it is kPeerDead on the survivors, not a wait in
  // MPI for good. The split and this gather cannot be watched (MPI has no
  // nonblocking split, and no pid is known before it).
  const ProcessIdentity self = self_identity();
  n.local_ids.resize(n.local_size);
  UCM_MPI(MPI_Allgather(&self, sizeof(self), MPI_BYTE, n.local_ids.data(), sizeof(self), MPI_BYTE, n.node));
  for (const ProcessIdentity& id : n.local_ids) n.local_pids.push_back(id.pid);

  if (const Result r = number_nodes(&n); !ok(r)) {
    *out = std::move(n);
    return r;
  }
  char host[256] = {};
  gethostname(host, sizeof(host) - 1);
  n.host = host;
  // What fails from here fails on the ranks of one node only: the caller
  // gets the communicators with the error and passes it through a
  // collective status over every rank, so other nodes never wait in a
  // collective this node skipped.
  Result r = Result::kOk;
  for (int i = 0; i < n.local_size && ok(r); ++i)
    if (n.local_ids[i].start_ticks == 0)
      r = fail(Result::kSystem, "local rank %d (pid %d) could not read its start time from /proc/self/stat", i,
               n.local_ids[i].pid);
  if (ok(r) && n.local_size > static_cast<int>(kMaxRanks))
    r = fail(Result::kInvalidArg, "%d ranks share this node's cache; at most %u can (set ranks_per_node)",
             n.local_size, kMaxRanks);
  *out = std::move(n);
  return r;
}

bool mpi_finalized() {
  int finalized = 0;
  return MPI_Finalized(&finalized) == MPI_SUCCESS && finalized != 0;
}

Result check_mpi_usable(MPI_Comm comm) {
  int initialized = 0;
  if (mpi_finalized())
    return fail(Result::kBadState, "MPI was finalized (MPI_Finalize was called): ucm_cache_init runs between MPI_Init "
                "and MPI_Finalize");
  if (MPI_Initialized(&initialized) != MPI_SUCCESS || !initialized)
    return fail(Result::kBadState, "MPI is not initialized: call MPI_Init (or MPI_Init_thread) before ucm_cache_init");
  if (comm == MPI_COMM_NULL)
    return fail(Result::kInvalidArg, "comm is MPI_COMM_NULL: this rank is in no communicator to share a cache over");
  return Result::kOk;
}

void node_teardown(NodeContext* n) {
  if (mpi_finalized()) {
    n->node = n->comm = MPI_COMM_NULL;
    return;
  }
  if (n->node != MPI_COMM_NULL) MPI_Comm_free(&n->node);
  if (n->comm != MPI_COMM_NULL) MPI_Comm_free(&n->comm);
}

Result allgather_watching(const void* mine, size_t bytes, const NodeContext& n, const char* what,
                          std::vector<char>* all) {
  auto* g = new Gathered{std::vector<char>(static_cast<const char*>(mine), static_cast<const char*>(mine) + bytes),
                         std::vector<char>(bytes * static_cast<size_t>(n.local_size))};
  MPI_Request q = MPI_REQUEST_NULL;
  Result r = mpi_check(MPI_Iallgather(g->send.data(), static_cast<int>(bytes), MPI_BYTE, g->recv.data(),
                                      static_cast<int>(bytes), MPI_BYTE, n.node, &q),
                       what);
  if (ok(r)) r = wait_watching(&q, &n.local_ids, what);
  if (!ok(r)) {
    keep_for_abandoned_collective(g);
    return r;
  }
  *all = std::move(g->recv);
  delete g;
  return Result::kOk;
}

Result agree_on_config(const NodeContext& n, const Agreement& a) {
  std::vector<char> gathered;
  UCM_CHECK(allgather_watching(&a.record, sizeof(AgreementRecord), n,
                               "the node's comparison of its configs (MPI_Iallgather)", &gathered));
  std::vector<AgreementRecord> all(n.local_size);
  std::memcpy(all.data(), gathered.data(), gathered.size());
  const size_t backend_bytes = a.backend_bytes;
  for (int r = 1; r < n.local_size; ++r) {
    for (int f = 0; f < AgreementRecord::kFields; ++f) {
      if (all[r].values[f] == all[0].values[f]) continue;
      if (std::strcmp(a.field_name(f), "backend") == 0) {
        // Compare the text itself to say what differs.
        std::vector<char> specs;
        UCM_CHECK(allgather_watching(a.backend, backend_bytes, n,
                                     "the node's comparison of its backend specs (MPI_Iallgather)", &specs));
        return fail(Result::kConfigMismatch,
                    "config field backend differs on node %d: local rank 0 has \"%s\", local rank %d has \"%s\"",
                    n.node_id, specs.data(), r, specs.data() + static_cast<size_t>(r) * backend_bytes);
      }
      return fail(Result::kConfigMismatch,
                  "config field %s differs on node %d: local rank 0 has %" PRIu64 ", local rank %d has %" PRIu64,
                  a.field_name(f), n.node_id, all[0].values[f], r, all[r].values[f]);
    }
  }
  return Result::kOk;
}

}  // namespace ucm
