// Hugepages in tests: reserve some for a test's life (restored after, also
// when an ASSERT ends it), and a real competitor that takes every free one.
#pragma once

#include <linux/memfd.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <string>
#include <utility>
#include <vector>

namespace ucm::test {

inline long read_nr_hugepages() {
  std::ifstream f("/proc/sys/vm/nr_hugepages");
  long n = -1;
  f >> n;
  return n;
}

inline bool write_nr_hugepages(long n) {
  FILE* f = std::fopen("/proc/sys/vm/nr_hugepages", "w");
  if (!f) return false;
  const bool ok = std::fprintf(f, "%ld\n", n) > 0;
  return std::fclose(f) == 0 && ok;
}

// Reserves `extra` more 2 MiB pages for the life of the object and restores the
// old count in its destructor, which also runs when an ASSERT ends the test.
class HugepageReservation {
 public:
  explicit HugepageReservation(long extra) : before_(read_nr_hugepages()) {
    if (before_ < 0) {
      why_ = "no /proc/sys/vm/nr_hugepages on this kernel";
      return;
    }
    if (!write_nr_hugepages(before_ + extra) || read_nr_hugepages() < before_ + extra) {
      why_ = "cannot reserve hugepages here (not root, a read-only /proc/sys, or no free memory)";
      return;
    }
    ok_ = true;
  }
  ~HugepageReservation() {
    if (before_ >= 0) write_nr_hugepages(before_);
  }
  bool ok() const { return ok_; }
  const std::string& why() const { return why_; }

 private:
  long before_;
  bool ok_ = false;
  std::string why_;
};

// Takes every free 2 MiB page it can, one MFD_HUGETLB mapping each, until the
// kernel says no: a real competitor, as another job on the node would be.
struct HugepageHog {
  std::vector<std::pair<int, void*>> held;
  void take_all() {
    for (;;) {
      int fd = memfd_create("hog", MFD_CLOEXEC | MFD_HUGETLB | MFD_HUGE_2MB);
      if (fd < 0) return;
      void* m = MAP_FAILED;
      if (ftruncate(fd, 2 << 20) == 0) m = mmap(nullptr, 2 << 20, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
      if (m == MAP_FAILED) {
        close(fd);
        return;
      }
      held.emplace_back(fd, m);
    }
  }
  ~HugepageHog() {
    for (auto& [fd, m] : held) {
      munmap(m, 2 << 20);
      close(fd);
    }
  }
};

}  // namespace ucm::test
