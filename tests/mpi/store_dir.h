// A fresh posix store directory for a test under mpirun: made by rank 0 (0700,
// this user's), its name broadcast to every rank; removed by rank 0 once every
// rank has left the test (a barrier in the destructor). Shared by the mpi
// suite's store and dump tests.
#pragma once

#include <ftw.h>
#include <mpi.h>
#include <stdlib.h>

#include <cstdio>
#include <string>

#include <gtest/gtest.h>

#include "mpi/mpi_test.h"
#include "mpi/task_util.h"

namespace ucm::test {

class StoreDir {
 public:
  // `name` tells the test's directories apart under /tmp: /tmp/ucm-<name>-XXXXXX.
  explicit StoreDir(const char* name = "store-test") {
    std::string d;
    if (world_rank() == 0) {
      std::string tmpl = std::string("/tmp/ucm-") + name + "-XXXXXX";
      if (mkdtemp(tmpl.data())) d = tmpl;
    }
    dir_ = bcast_string(d);
    EXPECT_FALSE(dir_.empty()) << "mkdtemp failed on rank 0";
  }
  ~StoreDir() {
    MPI_Barrier(MPI_COMM_WORLD);
    if (world_rank() == 0 && !dir_.empty())
      nftw(dir_.c_str(), [](const char* p, const struct stat*, int, FTW*) { return remove(p); }, 8,
           FTW_DEPTH | FTW_PHYS);
  }
  StoreDir(const StoreDir&) = delete;
  StoreDir& operator=(const StoreDir&) = delete;

  std::string spec() const { return "posix:" + dir_; }
  const std::string& path() const { return dir_; }
  // The file the posix store keeps block b (numbered as ukey(b, s)) in.
  std::string file_of(uint64_t b) const {
    const Key k = ikey(ukey(b, 0));
    char name[64];
    std::snprintf(name, sizeof(name), "/%016llx%016llx.ucmblk", static_cast<unsigned long long>(k.block.hi),
                  static_cast<unsigned long long>(k.block.lo));
    return dir_ + name;
  }

 private:
  std::string dir_;
};

}  // namespace ucm::test
