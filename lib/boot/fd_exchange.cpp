#include "boot/fd_exchange.h"

#include <poll.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <cinttypes>
#include <cstdarg>
#include <cstddef>
#include <cstring>
#include <random>

#include "common/log.h"
#include "common/time.h"
#include "sync/process_identity.h"

namespace ucm {
namespace {

constexpr uint64_t kPollSliceNs = 50'000'000;
constexpr uint64_t kHelloBoundNs = 2'000'000'000;
constexpr uint64_t kRefusalSummaryNs = 1'000'000'000;

sockaddr_un make_addr(uint64_t nonce, socklen_t* len) {
  sockaddr_un a{};
  a.sun_family = AF_UNIX;
  const std::string name = boot_socket_name(nonce);
  // Abstract namespace: a leading NUL, no file, gone with the socket.
  std::memcpy(a.sun_path + 1, name.data(), name.size());
  *len = static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + 1 + name.size());
  return a;
}

int poll_in(int fd, uint64_t until_ns) {
  const uint64_t now = now_ns();
  const int ms = now >= until_ns ? 0 : static_cast<int>(std::min<uint64_t>((until_ns - now) / 1000000 + 1, 1000));
  pollfd p{fd, POLLIN, 0};
  int r;
  do r = poll(&p, 1, ms);
  while (r < 0 && errno == EINTR);
  return r;
}

bool header_ok(const WireHeader& h, uint64_t nonce, WireKind kind) {
  return h.magic == kWireMagic && h.version == kWireVersion && h.header_bytes == sizeof(WireHeader) &&
         h.nonce == nonce && h.kind == static_cast<uint32_t>(kind);
}

// *hung_up: the peer closed its end (EPIPE, ECONNRESET) before the grant went.
Result send_grant(int conn, uint64_t nonce, uint32_t seq, const PlaneDescriptor* desc, const int* fds, uint32_t nfds,
                  bool* hung_up) {
  WireHeader h{kWireMagic, kWireVersion, sizeof(WireHeader), nonce, static_cast<uint32_t>(WireKind::kGrant),
               desc ? static_cast<uint32_t>(sizeof(*desc)) : 0u, nfds, seq};
  uint8_t body[sizeof(WireHeader) + sizeof(PlaneDescriptor)];
  std::memcpy(body, &h, sizeof(h));
  size_t len = sizeof(h);
  if (desc) {
    std::memcpy(body + len, desc, sizeof(*desc));
    len += sizeof(*desc);
  }
  iovec iov{body, len};
  msghdr m{};
  m.msg_iov = &iov;
  m.msg_iovlen = 1;
  alignas(cmsghdr) uint8_t cbuf[CMSG_SPACE(sizeof(int) * kMaxFdsPerMessage)];
  if (nfds > 0) {
    m.msg_control = cbuf;
    m.msg_controllen = CMSG_SPACE(sizeof(int) * nfds);
    cmsghdr* c = CMSG_FIRSTHDR(&m);
    c->cmsg_level = SOL_SOCKET;
    c->cmsg_type = SCM_RIGHTS;
    c->cmsg_len = CMSG_LEN(sizeof(int) * nfds);
    std::memcpy(CMSG_DATA(c), fds, sizeof(int) * nfds);
  }
  ssize_t n;
  do n = sendmsg(conn, &m, MSG_NOSIGNAL);
  while (n < 0 && errno == EINTR);
  *hung_up = n < 0 && (errno == EPIPE || errno == ECONNRESET);
  if (n != static_cast<ssize_t>(len))
    return fail(Result::kSystem, "sending plane fds to a peer: %s", n < 0 ? strerror(errno) : "short send");
  return Result::kOk;
}

// Who serves the socket: for a connected Unix socket, SO_PEERCRED holds the
// credentials of the process that called listen(). It must be local rank 0
// itself (pid and start time), running as our own effective uid.
Result check_server(int s, uint64_t nonce, const ProcessIdentity& server) {
  ucred cred{};
  socklen_t cl = sizeof(cred);
  UCM_SYSCHECK(getsockopt(s, SOL_SOCKET, SO_PEERCRED, &cred, &cl), "getsockopt(SO_PEERCRED) on the boot socket");
  const std::string name = boot_socket_name(nonce);
  const uid_t euid = geteuid();
  if (cred.pid != server.pid)
    return fail(Result::kSystem,
                "the boot socket @%s is served by pid %d (uid %u), not by local rank 0 (pid %d): refused, "
                "nothing taken from it",
                name.c_str(), cred.pid, cred.uid, server.pid);
  const uint64_t ticks = read_start_ticks(cred.pid, nullptr);
  if (ticks != server.start_ticks)
    return fail(Result::kSystem,
                "the boot socket @%s is served by pid %d started at tick %" PRIu64
                ", but local rank 0 with that pid started at tick %" PRIu64 ": refused, nothing taken from it",
                name.c_str(), cred.pid, ticks, server.start_ticks);
  if (cred.uid != euid)
    return fail(Result::kSystem,
                "the boot socket @%s is served by local rank 0's pid %d but as uid %u, not our uid %u: refused, "
                "nothing taken from it",
                name.c_str(), cred.pid, cred.uid, euid);
  return Result::kOk;
}

// The fds received from local rank 0, owned until fetch_planes hands them to
// its caller: every other way out closes each of them, once. Move-only.
class ReceivedFds {
 public:
  ReceivedFds() = default;
  ~ReceivedFds() { close_all(); }
  ReceivedFds(ReceivedFds&& o) noexcept : fds_(std::move(o.fds_)) { o.fds_.clear(); }
  ReceivedFds& operator=(ReceivedFds&& o) noexcept {
    if (this != &o) {
      close_all();
      fds_ = std::move(o.fds_);
      o.fds_.clear();
    }
    return *this;
  }
  ReceivedFds(const ReceivedFds&) = delete;
  ReceivedFds& operator=(const ReceivedFds&) = delete;

  void adopt(int fd) { fds_.push_back(fd); }
  size_t size() const { return fds_.size(); }
  // Gives up ownership: the caller closes what it gets.
  std::vector<int> release() {
    std::vector<int> out;
    out.swap(fds_);
    return out;
  }

 private:
  void close_all() {
    for (int fd : fds_) close(fd);
    fds_.clear();
  }
  std::vector<int> fds_;
};

// The node's other ranks (by local rank; rank 0 and this one are skipped: the
// callers watch rank 0 themselves): a dead one ends this rank's wait with its
// name. Local rank 0 stops serving and closes its socket at the first peer
// that dies unserved (FdServer::serve), so a peer not yet served would retry
// its connect against nothing until its deadline (timeout_ms: 30 s by default)
// and then blame rank 0's socket.
Result check_node_alive(const std::vector<ProcessIdentity>* node, uint32_t self) {
  if (!node) return Result::kOk;
  for (uint32_t r = 1; r < node->size(); ++r)
    if (r != self && !is_alive((*node)[r]))
      return fail(Result::kPeerDead, "local rank %u (pid %d) died during init, before the node's cache was set up", r,
                  (*node)[r].pid);
  return Result::kOk;
}

// Connects to local rank 0's socket, retrying while it is not listening yet,
// as long as rank 0 and the node's other ranks live and the deadline allows.
Result connect_to_rank0(uint64_t nonce, const ProcessIdentity& server, const std::vector<ProcessIdentity>* node,
                        uint32_t self, uint64_t deadline_ns, int* out) {
  socklen_t len;
  const sockaddr_un a = make_addr(nonce, &len);
  uint64_t next_node_check = 0;
  for (;;) {
    int s;
    UCM_SYSCHECK(s = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0), "socket(AF_UNIX)");
    if (connect(s, reinterpret_cast<const sockaddr*>(&a), len) == 0) {
      *out = s;
      return Result::kOk;
    }
    const int e = errno;
    close(s);
    if (e != ECONNREFUSED && e != ENOENT && e != EAGAIN && e != EINTR)
      return fail(Result::kSystem, "connecting to local rank 0's boot socket: %s", strerror(e));
    if (!is_alive(server))
      return fail(Result::kPeerDead, "local rank 0 (pid %d) died during init, before handing out the cache", server.pid);
    const uint64_t now = now_ns();
    if (now >= next_node_check) {  // every poll slice, not every 2 ms try: /proc reads per rank
      UCM_CHECK(check_node_alive(node, self));
      next_node_check = now + kPollSliceNs;
    }
    if (now >= deadline_ns)
      return fail(Result::kTimeout, "local rank 0 (pid %d) did not open its boot socket by the deadline", server.pid);
    usleep(2000);
  }
}

Result send_hello(int s, uint64_t nonce, uint32_t local_rank, bool want_data) {
  uint8_t hello_buf[sizeof(WireHeader) + sizeof(WireHello)];
  const WireHeader h{kWireMagic, kWireVersion, sizeof(WireHeader), nonce, static_cast<uint32_t>(WireKind::kHello),
                     sizeof(WireHello), 0, 0};
  const WireHello hello{local_rank, static_cast<int32_t>(getpid()), want_data ? 1u : 0u, 0};
  std::memcpy(hello_buf, &h, sizeof(h));
  std::memcpy(hello_buf + sizeof(h), &hello, sizeof(hello));
  ssize_t sent;
  do sent = send(s, hello_buf, sizeof(hello_buf), MSG_NOSIGNAL);
  while (sent < 0 && errno == EINTR);
  if (sent != static_cast<ssize_t>(sizeof(hello_buf)))
    return fail(Result::kSystem, "sending hello to local rank 0: %s", sent < 0 ? strerror(errno) : "short send");
  return Result::kOk;
}

// Waits in slices for the next grant, watching rank 0's process. Not the
// node's: rank 0 serves a connected peer to the end whoever else dies, and a
// peer that hung up on it then would read to rank 0 as one whose own deadline
// passed (the message every rank reports).
Result wait_for_grant(int s, const ProcessIdentity& server, uint64_t deadline_ns) {
  for (;;) {
    if (poll_in(s, std::min(deadline_ns, now_ns() + kPollSliceNs)) > 0) return Result::kOk;
    if (!is_alive(server))
      return fail(Result::kPeerDead, "local rank 0 (pid %d) died while handing out the cache", server.pid);
    if (now_ns() >= deadline_ns)
      return fail(Result::kTimeout, "local rank 0 (pid %d) sent no cache fds by the deadline", server.pid);
  }
}

// One message from rank 0, as received.
struct Grant {
  uint8_t buf[sizeof(WireHeader) + sizeof(PlaneDescriptor) + 16];
  ssize_t n = 0;    // recvmsg's return
  int error = 0;    // its errno when n < 0
  int flags = 0;    // msg_flags
  uint32_t fds = 0; // fds that came with it
};

// Receives one message. Its fds join `fds` before anything about it is
// checked, so that every exit path closes them.
void receive_grant(int s, ReceivedFds* fds, Grant* g) {
  alignas(cmsghdr) uint8_t cbuf[CMSG_SPACE(sizeof(int) * kMaxFdsPerMessage)];
  iovec iov{g->buf, sizeof(g->buf)};
  msghdr m{};
  m.msg_iov = &iov;
  m.msg_iovlen = 1;
  m.msg_control = cbuf;
  m.msg_controllen = sizeof(cbuf);
  do g->n = recvmsg(s, &m, MSG_CMSG_CLOEXEC);
  while (g->n < 0 && errno == EINTR);
  g->error = g->n < 0 ? errno : 0;
  // A failed recvmsg writes nothing back: msg_controllen is still cbuf's
  // size and cbuf was never written, so there are no fds to walk.
  if (g->n < 0) return;
  g->flags = m.msg_flags;
  for (cmsghdr* c = CMSG_FIRSTHDR(&m); c; c = CMSG_NXTHDR(&m, c)) {
    if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS) continue;
    const size_t k = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
    for (size_t i = 0; i < k; ++i) {
      int fd;
      std::memcpy(&fd, CMSG_DATA(c) + i * sizeof(int), sizeof(int));
      fds->adopt(fd);
      ++g->fds;
    }
  }
}

// Grant `seq` as a message: it arrived whole, and its header says what it
// carries (the descriptor in grant 0 only, and the fds that came with it).
Result check_grant(const Grant& grant, uint64_t nonce, uint32_t seq, size_t fds_so_far, uint32_t expected_total) {
  const ssize_t n = grant.n;
  if (n <= 0)
    return fail(n == 0 ? Result::kPeerDead : Result::kSystem, "local rank 0 closed the boot socket after %u of %u fds%s%s",
                static_cast<uint32_t>(fds_so_far), expected_total, n < 0 ? ": " : "", n < 0 ? strerror(grant.error) : "");
  if (grant.flags & (MSG_TRUNC | MSG_CTRUNC))
    return fail(Result::kCorrupt, "a boot message from local rank 0 was truncated (%s)",
                (grant.flags & MSG_CTRUNC) ? "fds lost" : "payload cut");
  WireHeader g{};
  if (n >= static_cast<ssize_t>(sizeof(g))) std::memcpy(&g, grant.buf, sizeof(g));
  const size_t payload = n >= static_cast<ssize_t>(sizeof(g)) ? static_cast<size_t>(n) - sizeof(g) : 0;
  const size_t want_payload = seq == 0 ? sizeof(PlaneDescriptor) : 0;
  if (n < static_cast<ssize_t>(sizeof(g)) || !header_ok(g, nonce, WireKind::kGrant) || g.seq != seq ||
      g.payload_bytes != payload || payload != want_payload || g.nfds != grant.fds)
    return fail(Result::kCorrupt,
                "malformed boot message %u from local rank 0: %zd bytes, %u fds (magic 0x%016" PRIx64 ", kind %u)", seq,
                n, grant.fds, g.magic, g.kind);
  return Result::kOk;
}

// The descriptor's fd counts add up (in 64 bits: 1 + 0xffffffff segments
// must not wrap to an empty fd list), and a scheduler is sent no segments.
Result check_announced_fds(const PlaneDescriptor& d, bool want_data) {
  if (d.store_fds > 1 || uint64_t{d.total_fds} != uint64_t{1} + d.segment_count + d.store_fds ||
      (!want_data && d.segment_count != 0))
    return fail(Result::kCorrupt, "boot descriptor announces %u fds for %u segments and %u store fds", d.total_fds,
                d.segment_count, d.store_fds);
  return Result::kOk;
}

// Receives grants until the fds the descriptor announced are all in.
Result receive_planes(int s, uint64_t nonce, bool want_data, const ProcessIdentity& server, uint64_t deadline_ns,
                      const PlaneExpectation* expect, PlaneDescriptor* desc, ReceivedFds* fds) {
  uint32_t expected_total = 0;
  for (uint32_t seq = 0;; ++seq) {
    UCM_CHECK(wait_for_grant(s, server, deadline_ns));
    Grant grant;
    receive_grant(s, fds, &grant);
    const Result checked = check_grant(grant, nonce, seq, fds->size(), expected_total);
    // A reset or hang-up is rank 0's death when its process is going (its
    // sockets close before it is a zombie: give that a moment).
    for (int i = 0; !ok(checked) && grant.n <= 0 && i < 20 && is_alive(server); ++i) usleep(5000);
    if (!ok(checked) && !is_alive(server))
      return fail(Result::kPeerDead, "local rank 0 (pid %d) died while handing out the cache (%s)", server.pid,
                  last_error().c_str());
    UCM_CHECK(checked);
    if (seq == 0) {
      std::memcpy(desc, grant.buf + sizeof(WireHeader), sizeof(*desc));
      expected_total = desc->total_fds;
      UCM_CHECK(check_announced_fds(*desc, want_data));
      UCM_CHECK(check_plane_descriptor(*desc, expect));
    }
    if (fds->size() > expected_total)
      return fail(Result::kCorrupt, "local rank 0 sent %zu fds, %u were announced", fds->size(), expected_total);
    if (fds->size() == expected_total) return Result::kOk;
  }
}

}  // namespace

std::string boot_socket_name(uint64_t nonce) {
  char name[48];
  std::snprintf(name, sizeof(name), "ucmcache.%016" PRIx64, nonce);
  return name;
}

uint64_t random_nonce() {
  std::random_device rd;
  return (static_cast<uint64_t>(rd()) << 32) ^ rd() ^ (now_ns() * 0x9E3779B97F4A7C15ull);
}

FdServer::~FdServer() { close_socket(); }

void FdServer::close_socket() {
  if (fd_ >= 0) close(fd_);
  fd_ = -1;
}

Result FdServer::listen_on(uint64_t nonce) {
  close_socket();
  nonce_ = nonce;
  int fd;
  UCM_SYSCHECK(fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0), "socket(AF_UNIX)");
  fd_ = fd;
  socklen_t len;
  sockaddr_un a = make_addr(nonce, &len);
  UCM_SYSCHECK(bind(fd, reinterpret_cast<sockaddr*>(&a), len), "bind(boot socket)");
  UCM_SYSCHECK(listen(fd, 64), "listen(boot socket)");
  return Result::kOk;
}

Result FdServer::serve(const std::vector<PeerExpectation>& peers, const PlaneDescriptor& desc, int ctrl_fd,
                       const std::vector<int>& data_fds, uint64_t deadline_ns, int store_fd) {
  std::vector<bool> served(peers.size(), false);
  size_t remaining = peers.size();
  while (remaining > 0) {
    const uint64_t now = now_ns();
    summarize_refusals(false);
    for (size_t i = 0; i < peers.size(); ++i)
      if (!served[i] && !is_alive(peers[i].id)) {
        summarize_refusals(true);
        return fail(Result::kPeerDead, "local rank %u (pid %d) exited before it took the shared cache",
                    peers[i].local_rank, peers[i].id.pid);
      }
    if (now >= deadline_ns) {
      summarize_refusals(true);
      std::string missing;
      for (size_t i = 0; i < peers.size(); ++i)
        if (!served[i]) missing += (missing.empty() ? "" : ", ") + std::to_string(peers[i].local_rank);
      return fail(Result::kTimeout, "served %zu of %zu peers by the deadline; local ranks %s never connected",
                  peers.size() - remaining, peers.size(), missing.c_str());
    }
    if (poll_in(fd_, std::min(deadline_ns, now + kPollSliceNs)) <= 0) continue;
    int conn = accept4(fd_, nullptr, nullptr, SOCK_CLOEXEC);
    if (conn < 0) continue;
    const size_t before = std::count(served.begin(), served.end(), true);
    Result r = serve_one(conn, peers, &served, desc, ctrl_fd, data_fds, deadline_ns, store_fd);
    close(conn);
    if (!ok(r)) summarize_refusals(true);
    UCM_CHECK(r);
    remaining -= static_cast<size_t>(std::count(served.begin(), served.end(), true)) - before;
  }
  summarize_refusals(true);
  return Result::kOk;
}

void FdServer::refuse(const char* fmt, ...) {
  ++refused_;
  if (refused_ > kRefusalLinesInFull) {
    ++unlogged_;
    summarize_refusals(false);
    return;
  }
  char line[256];
  va_list ap;
  va_start(ap, fmt);
  std::vsnprintf(line, sizeof(line), fmt, ap);
  va_end(ap);
  UCM_WARN("boot socket: %s%s", line,
           refused_ == kRefusalLinesInFull ? " (further refusals are summarized, one line a second)" : "");
  last_summary_ns_ = now_ns();
}

void FdServer::summarize_refusals(bool final) {
  if (unlogged_ == 0) return;
  const uint64_t now = now_ns();
  if (!final && now - last_summary_ns_ < kRefusalSummaryNs) return;
  UCM_WARN("boot socket: refused %u more connections (%u in all so far)", unlogged_, refused_);
  unlogged_ = 0;
  last_summary_ns_ = now;
}

bool FdServer::read_hello(int conn, uint32_t local_rank, pid_t pid, uint64_t deadline_ns, WireHello* hello) {
  // The Hello: one message, exactly a header and a WireHello.
  uint8_t buf[sizeof(WireHeader) + sizeof(WireHello) + 16];
  if (poll_in(conn, std::min(deadline_ns, now_ns() + kHelloBoundNs)) <= 0) {
    refuse("pid %d connected but sent no hello in time; refused", pid);
    return false;
  }
  msghdr m{};
  iovec iov{buf, sizeof(buf)};
  m.msg_iov = &iov;
  m.msg_iovlen = 1;
  const ssize_t n = recvmsg(conn, &m, MSG_DONTWAIT);
  WireHeader h{};
  if (n == static_cast<ssize_t>(sizeof(h) + sizeof(*hello)) && !(m.msg_flags & (MSG_TRUNC | MSG_CTRUNC))) {
    std::memcpy(&h, buf, sizeof(h));
    std::memcpy(hello, buf + sizeof(h), sizeof(*hello));
  }
  if (!header_ok(h, nonce_, WireKind::kHello) || h.payload_bytes != sizeof(*hello) || h.nfds != 0 ||
      hello->local_rank != local_rank || hello->pid != pid) {
    if (n == 0)
      refuse("pid %d hung up without a hello; refused", pid);
    else
      refuse("pid %d sent a malformed hello (%zd bytes); refused", pid, n);
    return false;
  }
  return true;
}

Result FdServer::serve_one(int conn, const std::vector<PeerExpectation>& peers, std::vector<bool>* served,
                           const PlaneDescriptor& desc, int ctrl_fd, const std::vector<int>& data_fds,
                           uint64_t deadline_ns, int store_fd) {
  ucred cred{};
  socklen_t cl = sizeof(cred);
  if (getsockopt(conn, SOL_SOCKET, SO_PEERCRED, &cred, &cl) != 0) return Result::kOk;
  size_t idx = peers.size();
  for (size_t i = 0; i < peers.size(); ++i)
    if (peers[i].id.pid == cred.pid && !(*served)[i]) idx = i;
  if (idx == peers.size()) {
    refuse("refused a connection from pid %d (uid %u), which is no waiting rank of this node", cred.pid, cred.uid);
    return Result::kOk;
  }
  // The same pid, but is it the same process? A rank that died may have left
  // its pid to another.
  const uint64_t ticks = read_start_ticks(cred.pid, nullptr);
  if (ticks != peers[idx].id.start_ticks) {
    refuse("refused a connection from pid %d: local rank %u had that pid but started at tick %" PRIu64
           ", this process at tick %" PRIu64,
           cred.pid, peers[idx].local_rank, peers[idx].id.start_ticks, ticks);
    return Result::kOk;
  }
  WireHello hello{};
  if (!read_hello(conn, peers[idx].local_rank, cred.pid, deadline_ns, &hello)) return Result::kOk;
  std::vector<int> fds{ctrl_fd};
  if (hello.want_data) fds.insert(fds.end(), data_fds.begin(), data_fds.end());
  if (store_fd >= 0) fds.push_back(store_fd);
  PlaneDescriptor d = desc;
  d.segment_count = hello.want_data ? static_cast<uint32_t>(data_fds.size()) : 0;
  d.store_fds = store_fd >= 0 ? 1 : 0;
  d.total_fds = static_cast<uint32_t>(fds.size());
  uint32_t seq = 0;
  for (size_t off = 0; off < fds.size(); off += kMaxFdsPerMessage, ++seq) {
    const uint32_t count = static_cast<uint32_t>(std::min<size_t>(kMaxFdsPerMessage, fds.size() - off));
    bool hung_up = false;
    const Result sent = send_grant(conn, nonce_, seq, seq == 0 ? &d : nullptr, fds.data() + off, count, &hung_up);
    // A peer that said hello and hung up gave up waiting (its own deadline),
    // or died: its failure, not this socket's.
    if (hung_up && !is_alive(peers[idx].id))
      return fail(Result::kPeerDead, "local rank %u (pid %d) exited while it was being sent the shared cache",
                  peers[idx].local_rank, cred.pid);
    if (hung_up)
      return fail(Result::kTimeout,
                  "local rank %u (pid %d) hung up while it was being sent the shared cache: it stopped waiting "
                  "(its deadline passed)",
                  peers[idx].local_rank, cred.pid);
    UCM_CHECK(sent);
  }
  (*served)[idx] = true;
  UCM_DEBUG(kBoot, "boot socket: gave %zu fds to local rank %u (pid %d)", fds.size(), hello.local_rank, cred.pid);
  return Result::kOk;
}

Result check_plane_descriptor(const PlaneDescriptor& d, const PlaneExpectation* expect) {
  const char* from = "the boot descriptor from local rank 0";
  std::string diff;
  if (expect) {
    diff = ctrl_params_diff(d.ctrl, resolve_ctrl_params(expect->ctrl), from, "this rank");
    char clause[200];
    if (d.segment_bytes != expect->segment_bytes) {
      std::snprintf(clause, sizeof(clause), "segment_bytes: %s has %" PRIu64 ", this rank expects %" PRIu64, from,
                    d.segment_bytes, expect->segment_bytes);
      diff += (diff.empty() ? "" : "; ") + std::string(clause);
    }
    if (d.data_total_slots != expect->data_total_slots) {
      std::snprintf(clause, sizeof(clause), "data_total_slots: %s has %u, this rank expects %u", from,
                    d.data_total_slots, expect->data_total_slots);
      diff += (diff.empty() ? "" : "; ") + std::string(clause);
    }
  }
  const uint64_t fp = ctrl_fingerprint(d.ctrl);
  if (fp != d.ctrl_fingerprint)
    return fail(Result::kCorrupt,
                "%s is corrupt: its fingerprint 0x%016" PRIx64 " does not match its parameters (0x%016" PRIx64 ")%s%s",
                from, d.ctrl_fingerprint, fp, diff.empty() ? "" : "; ", diff.c_str());
  if (!diff.empty()) return fail(Result::kConfigMismatch, "%s", diff.c_str());
  return Result::kOk;
}

Result fetch_planes(uint64_t nonce, uint32_t local_rank, bool want_data, const ProcessIdentity& server,
                    uint64_t deadline_ns, PlaneDescriptor* desc, std::vector<int>* fds,
                    const PlaneExpectation* expect, const std::vector<ProcessIdentity>* node) {
  fds->clear();
  int s = -1;
  UCM_CHECK(connect_to_rank0(nonce, server, node, local_rank, deadline_ns, &s));
  struct Closer {
    int fd;
    ~Closer() { close(fd); }
  } closer{s};
  UCM_CHECK(check_server(s, nonce, server));
  UCM_CHECK(send_hello(s, nonce, local_rank, want_data));
  ReceivedFds received;
  UCM_CHECK(receive_planes(s, nonce, want_data, server, deadline_ns, expect, desc, &received));
  *fds = received.release();
  return Result::kOk;
}

PlaneDescriptor describe_planes(const BufferCtrl& ctrl, const DataParams& dp, const BufferData& data) {
  PlaneDescriptor d{};
  const CtrlParams p = ctrl.params();
  d.ctrl = p;
  d.ctrl_fingerprint = ctrl_fingerprint(p);
  d.segment_bytes = dp.segment_bytes;
  d.data_total_slots = dp.total_slots;
  d.hugetlb = data.hugetlb() ? 1 : 0;
  d.segment_count = static_cast<uint32_t>(data.segment_count());
  d.store_fds = 0;  // FdServer::serve sets it
  d.total_fds = 1 + d.segment_count;
  return d;
}

}  // namespace ucm
