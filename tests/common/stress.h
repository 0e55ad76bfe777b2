// How long stress loops run, as UCX's test_time_multiplier: a loop names its
// default round count, sized to catch its race in a normal run, and
// UCM_TEST_TIME_MULTIPLIER=N (a positive number, default 1) scales it, e.g.
// 10 for a soak on a quiet machine, 0.1 for a quick look. A bad value fails
// the test naming it, rather than silently running the default.
#pragma once

#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <string>

#include <gtest/gtest.h>

namespace ucm::test {

// The multiplier from UCM_TEST_TIME_MULTIPLIER; 1 when unset, and 1 with a
// test failure naming the value when it is not a positive finite number.
inline double test_time_multiplier() {
  const char* v = std::getenv("UCM_TEST_TIME_MULTIPLIER");
  if (v == nullptr || *v == '\0') return 1.0;
  char* end = nullptr;
  errno = 0;
  const double m = std::strtod(v, &end);
  if (errno != 0 || end == v || *end != '\0' || !std::isfinite(m) || m <= 0) {
    ADD_FAILURE() << "UCM_TEST_TIME_MULTIPLIER=\"" << v << "\" is not a positive number";
    return 1.0;
  }
  return m;
}

// `base` rounds scaled by the multiplier, at least one.
inline int stress_rounds(int base) {
  const double r = std::ceil(static_cast<double>(base) * test_time_multiplier());
  return r < 1 ? 1 : r > 1e9 ? 1000000000 : static_cast<int>(r);
}

}  // namespace ucm::test
