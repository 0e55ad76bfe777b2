// Handing the shared planes' memfds from local rank 0 to its peers.
//
// Local rank 0 listens on an abstract Unix socket named "ucmcache.<nonce>"
// (nothing in any file system; the name dies with the socket) and broadcasts
// the nonce over MPI. Each peer connects and sends a Hello (its local rank,
// its pid, whether it wants the data plane). Rank 0 accepts only a peer whose
// SO_PEERCRED pid is the pid that local rank announced over MPI, running since
// the start time it announced with it (so a recycled pid is no rank), and only
// once per rank; anything else (another process, garbage, a wrong nonce, a
// second connection) is closed without a byte. It then sends the plane
// descriptor and the fds with SCM_RIGHTS, in as many Grant messages as the fd
// count needs: the control fd, the data segments (if the peer wants them), and
// last the store's node-shared state (backend/node_state.h) when the store has
// one.
//
// The name is no secret: every local user sees it in /proc/net/unix, and once
// rank 0 has closed its socket anyone can bind it. So a peer, before it sends
// a byte, checks who serves it: the server's SO_PEERCRED pid must be local
// rank 0's, with rank 0's start time, and its uid the peer's own euid.
// Anything else is refused; no fd from it is ever received.
//
// Refused connections are counted; the first few are logged one line each,
// the rest as one summary line per second at most, so a connect flood cannot
// flood the log.
//
// Every message starts with a fixed WireHeader (magic, version, header size,
// nonce, kind, payload size, fd count); a short read, a truncated control
// message (MSG_CTRUNC) or any field out of place is an error, never a guess.
// Both sides are bounded by a deadline and watch the other side's pid, so a
// dead rank 0 is a clear error for its peers, not a hang.
#pragma once

#include <sys/types.h>

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "common/result.h"
#include "ctrl/buffer_ctrl.h"
#include "data/buffer_data.h"
#include "sync/process_identity.h"

namespace ucm {

constexpr uint64_t kWireMagic = 0x31544f4f424d4355ull;  // "UCMBOOT1"
constexpr uint32_t kWireVersion = 3;  // 2: PlaneDescriptor.store_fds; 3: CtrlParams whole, fingerprinted
constexpr uint32_t kMaxFdsPerMessage = 200;  // below the kernel's SCM_MAX_FD (253)

enum class WireKind : uint32_t { kHello = 1, kGrant = 2 };

struct WireHeader {
  uint64_t magic;
  uint32_t version;
  uint32_t header_bytes;
  uint64_t nonce;
  uint32_t kind;
  uint32_t payload_bytes;
  uint32_t nfds;
  uint32_t seq;  // Grant: index of this message among the grants
};
static_assert(sizeof(WireHeader) == 40);

struct WireHello {
  uint32_t local_rank;
  int32_t pid;
  uint32_t want_data;
  uint32_t pad;
};

// What a peer needs to map the planes, sent with the first Grant. The layout
// parameters travel whole, with their fingerprint: a peer refuses a
// descriptor whose fingerprint disagrees with its parameters (kCorrupt) or
// whose parameters are not the ones it expects (kConfigMismatch), naming each
// field that differs.
struct PlaneDescriptor {
  CtrlParams ctrl;            // rank 0's control header's parameters (resolved)
  uint64_t ctrl_fingerprint;  // ctrl_fingerprint(ctrl)
  uint64_t segment_bytes;     // DataParams.segment_bytes
  uint32_t data_total_slots;  // DataParams.total_slots
  uint32_t hugetlb;
  uint32_t segment_count;  // data fds that follow the control fd (0 for a scheduler)
  uint32_t total_fds;      // across all grants: 1 + segment_count + store_fds
  uint32_t store_fds;      // 0 or 1: the store's node-shared state, after the segments
  uint32_t pad;
};
static_assert(sizeof(PlaneDescriptor) == 80);
static_assert(offsetof(PlaneDescriptor, ctrl) == 0);
static_assert(offsetof(PlaneDescriptor, segment_bytes) == 48);

// What a peer expects of the descriptor: its own layout, from its own config.
struct PlaneExpectation {
  CtrlParams ctrl;
  uint64_t segment_bytes = 0;
  uint32_t data_total_slots = 0;
};

struct PeerExpectation {
  uint32_t local_rank;
  ProcessIdentity id;  // pid and start time, exchanged over MPI
};

// Refused connections logged one line each; past these, one summary a second.
constexpr uint32_t kRefusalLinesInFull = 5;

std::string boot_socket_name(uint64_t nonce);
uint64_t random_nonce();

class FdServer {
 public:
  FdServer() = default;
  ~FdServer();
  FdServer(const FdServer&) = delete;
  FdServer& operator=(const FdServer&) = delete;

  [[nodiscard]] Result listen_on(uint64_t nonce);
  // Serves every expected peer once; returns when all are served or fails at
  // the deadline (naming who is missing) or when a peer's process is gone.
  // `store_fd` (>= 0) goes to every peer, schedulers too, as the last fd.
  [[nodiscard]] Result serve(const std::vector<PeerExpectation>& peers, const PlaneDescriptor& desc, int ctrl_fd,
                             const std::vector<int>& data_fds, uint64_t deadline_ns, int store_fd = -1);
  void close_socket();
  // Connections refused so far (foreign processes, garbage).
  uint32_t refused() const { return refused_; }

 private:
  Result serve_one(int conn, const std::vector<PeerExpectation>& peers, std::vector<bool>* served,
                   const PlaneDescriptor& desc, int ctrl_fd, const std::vector<int>& data_fds, uint64_t deadline_ns,
                   int store_fd);
  // Reads the connected peer's Hello (bounded by kHelloBoundNs); false when
  // it sent none, or one that is not local rank `local_rank`'s from `pid`
  // (the connection is refused and counted).
  bool read_hello(int conn, uint32_t local_rank, pid_t pid, uint64_t deadline_ns, WireHello* hello);
  // Counts a refusal; logs it in full, or folds it into the next summary line.
  void refuse(const char* fmt, ...) __attribute__((format(printf, 2, 3)));
  // Logs the refusals not yet logged (at most once a second unless `final`).
  void summarize_refusals(bool final);
  int fd_ = -1;
  uint64_t nonce_ = 0;
  uint32_t refused_ = 0;
  uint32_t unlogged_ = 0;         // refusals since the last line about them
  uint64_t last_summary_ns_ = 0;
};

// Connects to local rank 0 (`server`: its pid and start time) and receives
// the planes, after checking that `server` is who serves the socket.
// `fds` receives the control fd first, then the data segment fds, then the
// store's state fd when desc->store_fds says there is one (all owned by the
// caller). With `expect`, the descriptor must carry those parameters (see
// PlaneDescriptor); without, only its own fingerprint is checked. With
// `node` (the node's ranks by local rank), a rank that dies while this one
// waits for rank 0's socket ends the wait at once, named (kPeerDead): rank 0
// stops serving at such a death, and the wait would otherwise last until the
// deadline.
[[nodiscard]] Result fetch_planes(uint64_t nonce, uint32_t local_rank, bool want_data, const ProcessIdentity& server,
                                  uint64_t deadline_ns, PlaneDescriptor* desc, std::vector<int>* fds,
                                  const PlaneExpectation* expect = nullptr,
                                  const std::vector<ProcessIdentity>* node = nullptr);

// The descriptor's own consistency, then (with `expect`) its parameters
// against the peer's; the error names every field that differs.
[[nodiscard]] Result check_plane_descriptor(const PlaneDescriptor& d, const PlaneExpectation* expect);

PlaneDescriptor describe_planes(const BufferCtrl& ctrl, const DataParams& data_params, const BufferData& data);

}  // namespace ucm
