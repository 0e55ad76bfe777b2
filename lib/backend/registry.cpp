// The stores this library knows, by scheme. Adding a store: one file that
// defines its factory, and one line here.
#include <cinttypes>
#include <cstring>

#include "backend/backend.h"
#include "backend/spec.h"
#include "common/log.h"

namespace ucm {

Result make_sim_backend(const Spec& spec, const BackendContext& ctx, std::unique_ptr<Backend>* out);
Result make_posix_backend(const Spec& spec, const BackendContext& ctx, std::unique_ptr<Backend>* out);
Result sim_node_state_bytes(const Spec& spec, uint64_t* out);

namespace {

struct Registration {
  const char* scheme;
  Result (*make)(const Spec&, const BackendContext&, std::unique_ptr<Backend>*);
  Result (*node_state_bytes)(const Spec&, uint64_t*);  // null: the store keeps no node-shared state
};

constexpr Registration kStores[] = {
    {"sim", &make_sim_backend, &sim_node_state_bytes},
    {"posix", &make_posix_backend, nullptr},
};

Result find_store(const std::string& text, Spec* spec, const Registration** out) {
  UCM_CHECK(parse_spec(text, spec));
  for (const Registration& r : kStores)
    if (spec->scheme == r.scheme) {
      *out = &r;
      return Result::kOk;
    }
  return fail(Result::kInvalidArg, "unknown backend \"%s\" in spec \"%s\" (known: sim, posix)", spec->scheme.c_str(),
              text.c_str());
}

}  // namespace

Result make_backend(const std::string& text, const BackendContext& ctx, std::unique_ptr<Backend>* out) {
  if (ctx.shard_bytes == 0) return fail(Result::kInvalidArg, "backend: shard_bytes is 0");
  if (ctx.shards_per_block == 0) return fail(Result::kInvalidArg, "backend: shards_per_block is 0");
  if ((ctx.node_state == nullptr) != (ctx.node_state_bytes == 0))
    return fail(Result::kInvalidArg, "backend: node state at %p of %" PRIu64 " bytes", ctx.node_state,
                ctx.node_state_bytes);
  Spec spec;
  const Registration* r = nullptr;
  UCM_CHECK(find_store(text, &spec, &r));
  return r->make(spec, ctx, out);
}

Result backend_node_state_bytes(const std::string& text, uint64_t* out) {
  Spec spec;
  const Registration* r = nullptr;
  UCM_CHECK(find_store(text, &spec, &r));
  *out = 0;
  return r->node_state_bytes ? r->node_state_bytes(spec, out) : Result::kOk;
}

}  // namespace ucm
