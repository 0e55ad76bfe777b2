#include "backend/spec.h"

#include <cctype>
#include <cerrno>
#include <cinttypes>
#include <cstdlib>

namespace ucm {

Result parse_spec(const std::string& text, Spec* out) {
  const size_t colon = text.find(':');
  const std::string scheme = colon == std::string::npos ? text : text.substr(0, colon);
  if (scheme.empty()) return fail(Result::kInvalidArg, "backend spec \"%s\" has no scheme (sim:..., posix:...)", text.c_str());
  Spec s;
  s.scheme = scheme;
  if (colon != std::string::npos) {
    const std::string rest = text.substr(colon + 1);
    size_t pos = 0;
    bool first = true;
    while (pos <= rest.size()) {
      size_t end = rest.find(',', pos);
      if (end == std::string::npos) end = rest.size();
      const std::string item = rest.substr(pos, end - pos);
      pos = end + 1;
      if (item.empty()) {
        first = false;
        continue;
      }
      const size_t eq = item.find('=');
      if (eq == std::string::npos) {
        if (!first) return fail(Result::kInvalidArg, "backend spec item \"%s\" is not key=value", item.c_str());
        s.positional = item;
      } else {
        s.options.emplace_back(item.substr(0, eq), item.substr(eq + 1));
      }
      first = false;
    }
  }
  *out = std::move(s);
  return Result::kOk;
}

Result spec_u64(const std::string& name, const std::string& value, uint64_t lo, uint64_t hi, uint64_t* out) {
  errno = 0;
  char* end = nullptr;
  const unsigned long long v = std::strtoull(value.c_str(), &end, 10);
  // Digits only: strtoull would skip blanks and wrap a minus sign around.
  if (value.empty() || !isdigit(static_cast<unsigned char>(value[0])) || errno != 0 || *end != '\0')
    return fail(Result::kInvalidArg, "backend option %s=%s is not an unsigned integer", name.c_str(), value.c_str());
  if (v < lo || v > hi)
    return fail(Result::kInvalidArg, "backend option %s=%s is out of range %" PRIu64 "..%" PRIu64, name.c_str(),
                value.c_str(), lo, hi);
  *out = v;
  return Result::kOk;
}

Result spec_double(const std::string& name, const std::string& value, double lo, double hi, double* out) {
  errno = 0;
  char* end = nullptr;
  const double v = std::strtod(value.c_str(), &end);
  if (value.empty() || errno != 0 || *end != '\0')
    return fail(Result::kInvalidArg, "backend option %s=%s is not a number", name.c_str(), value.c_str());
  if (!(v >= lo && v <= hi))
    return fail(Result::kInvalidArg, "backend option %s=%s is out of range %g..%g", name.c_str(), value.c_str(), lo, hi);
  *out = v;
  return Result::kOk;
}

}  // namespace ucm
