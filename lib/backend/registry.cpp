// The stores this library knows, by scheme. Adding a store: one file that
// defines its factory, and one line here.
#include <cstring>

#include "backend/backend.h"
#include "backend/spec.h"
#include "common/log.h"

namespace ucm {

Result make_sim_backend(const Spec& spec, const BackendContext& ctx, std::unique_ptr<Backend>* out);
Result make_posix_backend(const Spec& spec, const BackendContext& ctx, std::unique_ptr<Backend>* out);

namespace {

struct Registration {
  const char* scheme;
  Result (*make)(const Spec&, const BackendContext&, std::unique_ptr<Backend>*);
};

constexpr Registration kStores[] = {
    {"sim", &make_sim_backend},
    {"posix", &make_posix_backend},
};

}  // namespace

Result make_backend(const std::string& text, const BackendContext& ctx, std::unique_ptr<Backend>* out) {
  if (ctx.shard_bytes == 0) return fail(Result::kInvalidArg, "backend: shard_bytes is 0");
  if (ctx.shards_per_block == 0) return fail(Result::kInvalidArg, "backend: shards_per_block is 0");
  Spec spec;
  UCM_CHECK(parse_spec(text, &spec));
  for (const Registration& r : kStores)
    if (spec.scheme == r.scheme) return r.make(spec, ctx, out);
  return fail(Result::kInvalidArg, "unknown backend \"%s\" in spec \"%s\" (known: sim, posix)", spec.scheme.c_str(),
              text.c_str());
}

}  // namespace ucm
