// The boot socket with real processes: who gets the fds, who gets nothing,
// and what a peer sees when local rank 0 dies or lies.
#include <poll.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/un.h>

#include <atomic>
#include <cstddef>
#include <cstring>

#include <gtest/gtest.h>

#include "boot/fd_exchange.h"
#include "common/test_util.h"

namespace ucm::test {
namespace {

struct Planes {
  BufferCtrl ctrl;
  BufferData data;
  DataParams dp;
};

void make_planes(Planes* p, uint32_t slots, uint64_t segment_bytes) {
  ASSERT_EQ(BufferCtrl::create(params(slots, 0, 4096), &p->ctrl), Result::kOk) << last_error();
  p->dp.slot_bytes = 4096;
  p->dp.total_slots = slots;
  p->dp.segment_bytes = segment_bytes;
  p->dp.hugepages = HugePolicy::kOff;
  ASSERT_EQ(BufferData::create(p->dp, &p->data), Result::kOk) << last_error();
}

std::vector<int> data_fds(const Planes& p) {
  std::vector<int> fds;
  for (size_t s = 0; s < p.data.segment_count(); ++s) fds.push_back(p.data.segment_fd(s));
  return fds;
}

// A peer: fetch, map, check the byte rank 0 wrote, write its own.
int run_peer(uint64_t nonce, uint32_t rank, pid_t server, const Planes& p) {
  PlaneDescriptor d{};
  std::vector<int> fds;
  if (fetch_planes(nonce, rank, true, server, deadline_after_ms(10000), &d, &fds) != Result::kOk) {
    std::fprintf(stderr, "peer %u: %s\n", rank, last_error().c_str());
    return 10;
  }
  if (fds.size() != 1 + p.data.segment_count() || d.segment_count != p.data.segment_count()) return 11;
  BufferCtrl c;
  if (BufferCtrl::attach(fds[0], nullptr, &c) != Result::kOk) return 12;
  BufferData data;
  if (BufferData::attach(p.dp, d.hugetlb != 0, fds.data() + 1, fds.size() - 1, &data) != Result::kOk) return 13;
  for (int fd : fds) close(fd);
  const uint32_t last = p.dp.total_slots - 1;
  if (static_cast<uint8_t*>(data.at(last))[0] != 0xab) return 14;
  static_cast<uint8_t*>(data.at(rank))[0] = static_cast<uint8_t>(rank);
  c.slot(rank).key_lo.store(100 + rank);
  return 0;
}

// A process that is no rank: finds the socket by its nonce, connects, sends
// `garbage` bytes, and reports whether anything (bytes or fds) came back.
int run_intruder(uint64_t nonce, bool garbage, int attempts = 2000) {
  for (int attempt = 0; attempt < attempts; ++attempt) {
    int s = socket(AF_UNIX, SOCK_SEQPACKET, 0);
    sockaddr_un a{};
    a.sun_family = AF_UNIX;
    const std::string name = boot_socket_name(nonce);
    std::memcpy(a.sun_path + 1, name.data(), name.size());
    const socklen_t len = static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + 1 + name.size());
    if (connect(s, reinterpret_cast<sockaddr*>(&a), len) != 0) {
      close(s);
      usleep(1000);
      continue;
    }
    if (garbage) {
      const char junk[64] = "GET / HTTP/1.1 and other nonsense";
      (void)send(s, junk, sizeof(junk), MSG_NOSIGNAL);
    }
    char buf[512];
    alignas(cmsghdr) char cbuf[CMSG_SPACE(sizeof(int) * 8)];
    iovec iov{buf, sizeof(buf)};
    msghdr m{};
    m.msg_iov = &iov;
    m.msg_iovlen = 1;
    m.msg_control = cbuf;
    m.msg_controllen = sizeof(cbuf);
    pollfd pf{s, POLLIN, 0};
    poll(&pf, 1, 5000);
    const ssize_t n = recvmsg(s, &m, MSG_DONTWAIT);
    close(s);
    // Closed without a byte: EOF, or a reset when our garbage was left unread.
    return n <= 0 ? 0 : 20;  // fds only ever come with bytes
  }
  return 21;  // never reached the socket
}

TEST(BootSocket, PeersGetTheFdsAndShareThePlanes) {
  Planes p;
  make_planes(&p, 64, 16 * 4096);
  static_cast<uint8_t*>(p.data.at(63))[0] = 0xab;
  const uint64_t nonce = random_nonce();
  FdServer server;
  ASSERT_EQ(server.listen_on(nonce), Result::kOk) << last_error();
  std::vector<PeerExpectation> peers;
  std::vector<pid_t> kids;
  for (uint32_t r = 1; r <= 3; ++r) {
    pid_t k = fork_child([&] { return run_peer(nonce, r, getppid(), p); });
    kids.push_back(k);
    peers.push_back({r, k});
  }
  ASSERT_EQ(server.serve(peers, describe_planes(p.ctrl, p.dp, p.data), p.ctrl.fd(), data_fds(p), deadline_after_ms(10000)),
            Result::kOk)
      << last_error();
  for (pid_t k : kids) EXPECT_EQ(wait_child(k, 10000), 0);
  for (uint32_t r = 1; r <= 3; ++r) {
    EXPECT_EQ(static_cast<uint8_t*>(p.data.at(r))[0], r) << "peer " << r << " wrote through its own mapping";
    EXPECT_EQ(p.ctrl.slot(r).key_lo.load(), 100u + r);
  }
  EXPECT_EQ(server.refused(), 0u);
}

TEST(BootSocket, ManySegmentsTravelInSeveralMessages) {
  Planes p;
  make_planes(&p, 450, 4096);  // 450 segments: three grants of at most 200 fds
  ASSERT_EQ(p.data.segment_count(), 450u);
  static_cast<uint8_t*>(p.data.at(449))[0] = 0xab;
  const uint64_t nonce = random_nonce();
  FdServer server;
  ASSERT_EQ(server.listen_on(nonce), Result::kOk);
  pid_t k = fork_child([&] { return run_peer(nonce, 1, getppid(), p); });
  ASSERT_EQ(server.serve({{1, k}}, describe_planes(p.ctrl, p.dp, p.data), p.ctrl.fd(), data_fds(p),
                         deadline_after_ms(10000)),
            Result::kOk)
      << last_error();
  EXPECT_EQ(wait_child(k, 10000), 0);
}

TEST(BootSocket, AForeignProcessGetsNothingAndTheRealPeerIsStillServed) {
  Planes p;
  make_planes(&p, 16, 16 * 4096);
  static_cast<uint8_t*>(p.data.at(15))[0] = 0xab;
  const uint64_t nonce = random_nonce();
  FdServer server;
  ASSERT_EQ(server.listen_on(nonce), Result::kOk);
  // The intruders connect first; the real peer waits until they are done.
  auto* go = static_cast<std::atomic<int>*>(
      mmap(nullptr, 4096, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0));
  new (go) std::atomic<int>(0);
  pid_t quiet = fork_child([&] { return run_intruder(nonce, false); });
  pid_t noisy = fork_child([&] { return run_intruder(nonce, true); });
  pid_t peer = fork_child([&] {
    while (go->load() == 0) usleep(1000);
    return run_peer(nonce, 1, getppid(), p);
  });
  std::thread release([&] {
    EXPECT_EQ(wait_child(quiet, 10000), 0) << "the silent intruder got bytes or fds";
    EXPECT_EQ(wait_child(noisy, 10000), 0) << "the garbage-sending intruder got bytes or fds";
    go->store(1);
  });
  EXPECT_EQ(server.serve({{1, peer}}, describe_planes(p.ctrl, p.dp, p.data), p.ctrl.fd(), data_fds(p),
                         deadline_after_ms(15000)),
            Result::kOk)
      << last_error();
  release.join();
  EXPECT_EQ(wait_child(peer, 10000), 0);
  EXPECT_EQ(server.refused(), 2u);
  munmap(go, 4096);
}

TEST(BootSocket, AGarbledHelloFromARealPeerIsRefusedUntilItSpeaksProperly) {
  Planes p;
  make_planes(&p, 16, 16 * 4096);
  static_cast<uint8_t*>(p.data.at(15))[0] = 0xab;
  const uint64_t nonce = random_nonce();
  FdServer server;
  ASSERT_EQ(server.listen_on(nonce), Result::kOk);
  pid_t peer = fork_child([&] {
    if (run_intruder(nonce, true) != 0) return 30;  // its own pid, but garbage: nothing back
    if (run_intruder(nonce ^ 1, true, 20) != 21) return 31;  // a wrong nonce names no socket at all
    return run_peer(nonce, 1, getppid(), p);
  });
  EXPECT_EQ(server.serve({{1, peer}}, describe_planes(p.ctrl, p.dp, p.data), p.ctrl.fd(), data_fds(p),
                         deadline_after_ms(30000)),
            Result::kOk)
      << last_error();
  EXPECT_EQ(wait_child(peer, 30000), 0);
  EXPECT_EQ(server.refused(), 1u);
}

TEST(BootSocket, PeersOfADeadRankZeroFailClearlyWithinTheBound) {
  // Rank 0 announces itself and dies before listening (or while serving).
  const uint64_t nonce = random_nonce();
  pid_t rank0 = fork_child([] {
    pause();
    return 0;
  });
  pid_t peer = fork_child([&] {
    PlaneDescriptor d{};
    std::vector<int> fds;
    const uint64_t t0 = now_ns();
    const Result r = fetch_planes(nonce, 1, true, rank0, deadline_after_ms(20000), &d, &fds);
    const uint64_t took_ms = (now_ns() - t0) / 1000000;
    std::fprintf(stderr, "peer saw: %s (%llu ms)\n", last_error().c_str(), static_cast<unsigned long long>(took_ms));
    if (r != Result::kPeerDead) return 40;
    if (last_error().find("local rank 0") == std::string::npos || last_error().find("died") == std::string::npos) return 41;
    return took_ms < 2000 ? 0 : 42;
  });
  usleep(100000);
  kill(rank0, SIGKILL);
  wait_child(rank0, 5000);
  EXPECT_EQ(wait_child(peer, 10000), 0);
}

TEST(BootSocket, RankZeroNamesAPeerThatDiedBeforeConnecting) {
  Planes p;
  make_planes(&p, 16, 16 * 4096);
  const uint64_t nonce = random_nonce();
  FdServer server;
  ASSERT_EQ(server.listen_on(nonce), Result::kOk);
  pid_t dead = fork_child([] { return 0; });
  wait_child(dead, 5000);
  EXPECT_EQ(server.serve({{2, dead}}, describe_planes(p.ctrl, p.dp, p.data), p.ctrl.fd(), data_fds(p),
                         deadline_after_ms(10000)),
            Result::kPeerDead);
  EXPECT_NE(last_error().find("local rank 2"), std::string::npos) << last_error();
}

TEST(BootSocket, AServerThatNeverListensIsATimeoutNamingIt) {
  PlaneDescriptor d{};
  std::vector<int> fds;
  EXPECT_EQ(fetch_planes(random_nonce(), 1, true, getpid(), deadline_after_ms(100), &d, &fds), Result::kTimeout);
  EXPECT_NE(last_error().find("did not open its boot socket"), std::string::npos) << last_error();
}

// A fake rank 0 that answers the hello with `reply` (and maybe an fd).
Result fetch_from_liar(const std::function<void(int conn, uint64_t nonce)>& reply) {
  const uint64_t nonce = random_nonce();
  int s = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
  sockaddr_un a{};
  a.sun_family = AF_UNIX;
  const std::string name = boot_socket_name(nonce);
  std::memcpy(a.sun_path + 1, name.data(), name.size());
  const socklen_t len = static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + 1 + name.size());
  EXPECT_EQ(bind(s, reinterpret_cast<sockaddr*>(&a), len), 0);
  EXPECT_EQ(listen(s, 4), 0);
  std::thread liar([&] {
    int c = accept(s, nullptr, nullptr);
    char hello[256];
    (void)recv(c, hello, sizeof(hello), 0);
    reply(c, nonce);
    usleep(50000);
    close(c);
  });
  PlaneDescriptor d{};
  std::vector<int> fds;
  const Result r = fetch_planes(nonce, 1, true, getpid(), deadline_after_ms(5000), &d, &fds);
  liar.join();
  close(s);
  EXPECT_TRUE(fds.empty()) << "no fd is kept from a bad exchange";
  return r;
}

TEST(BootSocket, ABadMagicFromRankZeroIsCorrupt) {
  EXPECT_EQ(fetch_from_liar([](int c, uint64_t nonce) {
              WireHeader h{0xdeadbeef, kWireVersion, sizeof(WireHeader), nonce, 2, sizeof(PlaneDescriptor), 0, 0};
              uint8_t buf[sizeof(h) + sizeof(PlaneDescriptor)] = {};
              std::memcpy(buf, &h, sizeof(h));
              (void)send(c, buf, sizeof(buf), MSG_NOSIGNAL);
            }),
            Result::kCorrupt);
  EXPECT_NE(last_error().find("malformed boot message"), std::string::npos) << last_error();
}

TEST(BootSocket, ATruncatedGrantIsCorrupt) {
  EXPECT_EQ(fetch_from_liar([](int c, uint64_t nonce) {
              WireHeader h{kWireMagic, kWireVersion, sizeof(WireHeader), nonce, 2, sizeof(PlaneDescriptor), 0, 0};
              (void)send(c, &h, sizeof(h), MSG_NOSIGNAL);  // the descriptor is missing
            }),
            Result::kCorrupt);
}

TEST(BootSocket, AGrantWhoseFdCountDisagreesIsCorruptAndLeaksNothing) {
  EXPECT_EQ(fetch_from_liar([](int c, uint64_t nonce) {
              // Announces 2 fds, sends 1.
              WireHeader h{kWireMagic, kWireVersion, sizeof(WireHeader), nonce, 2, sizeof(PlaneDescriptor), 2, 0};
              PlaneDescriptor d{};
              d.segment_count = 1;
              d.total_fds = 2;
              uint8_t buf[sizeof(h) + sizeof(d)];
              std::memcpy(buf, &h, sizeof(h));
              std::memcpy(buf + sizeof(h), &d, sizeof(d));
              int fd = memfd_create("x", MFD_CLOEXEC);
              iovec iov{buf, sizeof(buf)};
              msghdr m{};
              m.msg_iov = &iov;
              m.msg_iovlen = 1;
              alignas(cmsghdr) char cbuf[CMSG_SPACE(sizeof(int))];
              m.msg_control = cbuf;
              m.msg_controllen = sizeof(cbuf);
              cmsghdr* cm = CMSG_FIRSTHDR(&m);
              cm->cmsg_level = SOL_SOCKET;
              cm->cmsg_type = SCM_RIGHTS;
              cm->cmsg_len = CMSG_LEN(sizeof(int));
              std::memcpy(CMSG_DATA(cm), &fd, sizeof(int));
              (void)sendmsg(c, &m, MSG_NOSIGNAL);
              close(fd);
            }),
            Result::kCorrupt);
}

}  // namespace
}  // namespace ucm::test
