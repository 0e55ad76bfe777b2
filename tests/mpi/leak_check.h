/* For the mpi suite's C programs: under AddressSanitizer, run LeakSanitizer's
 * check now, before MPI_Finalize, instead of at exit (see mpi_main.cpp for
 * why: at exit Open MPI has dropped and unloaded what it allocated, leaving
 * reports no suppression can name). A no-op in other builds. */
#ifndef UCM_TESTS_MPI_LEAK_CHECK_H
#define UCM_TESTS_MPI_LEAK_CHECK_H

#if defined(__SANITIZE_ADDRESS__)
#include <sanitizer/lsan_interface.h>
static inline void leak_check_before_mpi_finalize(void) { __lsan_do_leak_check(); }
#else
static inline void leak_check_before_mpi_finalize(void) {}
#endif

#endif
