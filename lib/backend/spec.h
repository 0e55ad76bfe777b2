// Parsing of store specs: "scheme:first,key=value,key=value".
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "common/result.h"

namespace ucm {

struct Spec {
  std::string scheme;
  std::string positional;  // the first item when it has no '=' (a path, for posix)
  std::vector<std::pair<std::string, std::string>> options;
};

[[nodiscard]] Result parse_spec(const std::string& text, Spec* out);

// Typed option readers: each names the option and the bad value on error.
[[nodiscard]] Result spec_u64(const std::string& name, const std::string& value, uint64_t lo, uint64_t hi, uint64_t* out);
[[nodiscard]] Result spec_double(const std::string& name, const std::string& value, double lo, double hi, double* out);

}  // namespace ucm
