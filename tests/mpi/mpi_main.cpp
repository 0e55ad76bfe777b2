// gtest under mpirun: every rank runs every test; rank 0 prints and writes
// the XML; the exit code is the worst over all ranks. Fixtures derived from
// MpiTest report a failure that happened on any rank on rank 0 too.
#include <mpi.h>

#include <cstdio>

#include <gtest/gtest.h>

#include "mpi/mpi_test.h"

#if defined(__SANITIZE_ADDRESS__)
#include <sanitizer/lsan_interface.h>
#endif

namespace ucm::test {

bool any_rank_failed(bool mine) {
  int local = mine ? 1 : 0, any = 0;
  MPI_Allreduce(&local, &any, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  return any != 0;
}

void MpiTest::TearDown() {
  const bool failed_here = HasFailure();
  const bool failed_anywhere = any_rank_failed(failed_here);
  if (failed_anywhere && !failed_here) ADD_FAILURE() << "a failure on another rank (see its output above)";
}

int world_rank() {
  int r = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &r);
  return r;
}

int world_size() {
  int s = 0;
  MPI_Comm_size(MPI_COMM_WORLD, &s);
  return s;
}

// On ranks other than 0 the printer is gone; this says what failed there,
// with the rank, so rank 0's "a failure on another rank" has its details.
class RankFailurePrinter : public ::testing::EmptyTestEventListener {
 public:
  explicit RankFailurePrinter(int rank) : rank_(rank) {}
  void OnTestPartResult(const ::testing::TestPartResult& r) override {
    if (!r.failed()) return;
    std::fprintf(stderr, "[rank %d] %s:%d: Failure\n%s\n", rank_, r.file_name() ? r.file_name() : "?",
                 r.line_number(), r.message());
  }

 private:
  int rank_;
};

}  // namespace ucm::test

int main(int argc, char** argv) {
#ifdef UCM_TEST_THREAD_MULTIPLE
  // Fan-out's thread calls MPI beside the test's (UCM_FANOUT=mpi needs it).
  int provided = MPI_THREAD_SINGLE;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
  if (provided < MPI_THREAD_MULTIPLE) {
    std::fprintf(stderr, "MPI_THREAD_MULTIPLE not provided (%d)\n", provided);
    MPI_Abort(MPI_COMM_WORLD, 2);
  }
#else
  MPI_Init(&argc, &argv);
#endif
  ::testing::InitGoogleTest(&argc, argv);
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  if (rank != 0) {
    auto& listeners = ::testing::UnitTest::GetInstance()->listeners();
    delete listeners.Release(listeners.default_result_printer());
    delete listeners.Release(listeners.default_xml_generator());
    listeners.Append(new ucm::test::RankFailurePrinter(rank));
  }
  int rc = RUN_ALL_TESTS();
  int worst = 0;
  MPI_Allreduce(&rc, &worst, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
#if defined(__SANITIZE_ADDRESS__)
  // LeakSanitizer's check runs here, before MPI_Finalize, instead of at exit:
  // every cache is finalized by now, so what our code allocated and did not
  // free is reported, while Open MPI's own state is still reachable from its
  // globals. MPI_Finalize drops its pointers to much of that state without
  // freeing it and unloads its plugins, which leaves thousands of reports at
  // exit whose stacks end in the unloaded plugins: nothing a suppression can
  // name, and not ours.
  __lsan_do_leak_check();
#endif
  MPI_Finalize();
  return worst;
}
