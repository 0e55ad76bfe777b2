#include "backend/spec.h"

#include <cctype>
#include <cerrno>
#include <cinttypes>
#include <cstdlib>

namespace ucm {

namespace {

// Whether an option ("key=") starts at `pos` of `text`.
bool option_at(const std::string& text, size_t pos) {
  if (pos >= text.size()) return false;
  const unsigned char c0 = static_cast<unsigned char>(text[pos]);
  if (!isalpha(c0) && c0 != '_') return false;
  size_t i = pos + 1;
  while (i < text.size() && (isalnum(static_cast<unsigned char>(text[i])) || text[i] == '_')) ++i;
  return i < text.size() && text[i] == '=';
}

}  // namespace

Result parse_spec(const std::string& text, Spec* out) {
  const size_t colon = text.find(':');
  const std::string scheme = colon == std::string::npos ? text : text.substr(0, colon);
  if (scheme.empty()) return fail(Result::kInvalidArg, "backend spec \"%s\" has no scheme (sim:..., posix:...)", text.c_str());
  Spec s;
  s.scheme = scheme;
  if (colon != std::string::npos) {
    const std::string rest = text.substr(colon + 1);
    // The positional part ends at the first ',' followed (after any further
    // ','s) by an option or by the end of the text.
    size_t opts = 0;
    if (!option_at(rest, 0)) {
      opts = rest.size();
      for (size_t c = rest.find(','); c != std::string::npos; c = rest.find(',', c + 1)) {
        size_t next = c;
        while (next < rest.size() && rest[next] == ',') ++next;
        if (next == rest.size() || option_at(rest, next)) {
          opts = c;
          break;
        }
      }
      s.positional = rest.substr(0, opts);
    }
    size_t pos = opts;
    while (pos < rest.size()) {
      size_t end = rest.find(',', pos);
      if (end == std::string::npos) end = rest.size();
      const std::string item = rest.substr(pos, end - pos);
      pos = end + 1;
      if (item.empty()) continue;
      const size_t eq = item.find('=');
      if (eq == std::string::npos)
        return fail(Result::kInvalidArg, "backend spec item \"%s\" is not key=value", item.c_str());
      const std::string key = item.substr(0, eq);
      for (const auto& o : s.options)
        if (o.first == key)
          return fail(Result::kInvalidArg, "backend option %s is given twice (%s=%s and %s)", key.c_str(), key.c_str(),
                      o.second.c_str(), item.c_str());
      s.options.emplace_back(key, item.substr(eq + 1));
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

Result spec_octal(const std::string& name, const std::string& value, uint64_t hi, uint64_t* out) {
  uint64_t v = 0;
  for (const char ch : value) {
    if (ch < '0' || ch > '7' || v > hi)
      return fail(Result::kInvalidArg, "backend option %s=%s is not an octal mode (like 0600)", name.c_str(), value.c_str());
    v = v * 8 + static_cast<uint64_t>(ch - '0');
  }
  if (value.empty())
    return fail(Result::kInvalidArg, "backend option %s=%s is not an octal mode (like 0600)", name.c_str(), value.c_str());
  if (v > hi)
    return fail(Result::kInvalidArg, "backend option %s=%s has bits beyond the permission bits 0%" PRIo64, name.c_str(),
                value.c_str(), hi);
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
