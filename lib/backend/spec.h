// Parsing of store specs: "scheme:positional,key=value,key=value".
//
// Grammar:
//   spec       = scheme [ ":" [ positional ] { "," option } ]
//   option     = key "=" value          key = [A-Za-z_][A-Za-z0-9_]*
// The positional part (a directory, for posix) is everything after the ':'
// up to the first ',' that starts an option (or ends the text; trailing ','s
// are dropped), so it may hold '=' and ',': "posix:/data/run=5,depth=4" is the
// directory "/data/run=5". What cannot be expressed: a positional that begins
// with key= (write a relative one as ./key=...), and one holding ",key=" (no
// escape exists; rename the directory or reach it through a symlink).
// Empty items between options are skipped; after the first option every item
// must be key=value.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "common/result.h"

namespace ucm {

struct Spec {
  std::string scheme;
  std::string positional;  // up to the first ",key=" (a path, for posix); see the grammar above
  std::vector<std::pair<std::string, std::string>> options;
};

[[nodiscard]] Result parse_spec(const std::string& text, Spec* out);

// Typed option readers: each names the option and the bad value on error.
[[nodiscard]] Result spec_u64(const std::string& name, const std::string& value, uint64_t lo, uint64_t hi, uint64_t* out);
// Octal digits only ("0640", "640"), at most `hi`: permission bits.
[[nodiscard]] Result spec_octal(const std::string& name, const std::string& value, uint64_t hi, uint64_t* out);
[[nodiscard]] Result spec_double(const std::string& name, const std::string& value, double lo, double hi, double* out);

}  // namespace ucm
