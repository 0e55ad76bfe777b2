#include "api/tunables_view.h"

#include <cstdlib>
#include <cstring>
#include <map>

#include "api/config.h"
#include "common/log.h"

namespace ucm {
namespace {

struct Doc {
  const char* field;
  const char* env;
  const char* help;
};

// In the order of ucm_config_t; the help follows ucm.h's field comments.
constexpr Doc kDocs[] = {
    {"shards_per_block", "UCM_SHARDS_PER_BLOCK", "shards per block: shard indexes are below this [layout]"},
    {"shard_bytes", "UCM_SHARD_BYTES", "bytes per shard and per cache slot (K/M/G suffixes) [layout]"},
    {"cache_bytes", "UCM_CACHE_BYTES", "the node's regular pool of slots, in bytes (K/M/G suffixes) [layout]"},
    {"reserved_slots", "UCM_RESERVED_SLOTS", "slots only prealloc may use [layout]"},
    {"max_task_entries", "UCM_MAX_TASK_ENTRIES", "entries per task at most [layout]"},
    {"device_id", "UCM_DEVICE_ID", "the GPU ordinal, auto (the local rank), or below 0 for a scheduler rank"},
    {"ranks_per_node", "UCM_RANKS_PER_NODE", "split a machine into pretend nodes of this many ranks (0: the real node)"},
    {"order", "UCM_ORDER", "rotate|natural: the order a task's shards are loaded in [layout]"},
    {"evict", "UCM_EVICT", "clock|ring: the eviction policy [layout]"},
    {"wait", "UCM_WAIT", "futex|poll: how a rank waits for a shard another rank loads [layout]"},
    {"prealloc", "UCM_PREALLOC", "1|0: let prealloc take reserved slots [layout]"},
    {"hugepages", "UCM_HUGEPAGES", "auto|on|off: the data plane on 2 MiB hugetlb pages (auto falls back) [layout]"},
    {"bind_threads", "UCM_BIND", "1|0: pin the queue threads near the rank's GPU"},
    {"timeout_ms", "UCM_TIMEOUT_MS", "bound on init and on any wait for a peer, in ms"},
    {"liveness_ms", "UCM_LIVENESS_MS", "how often a waiter checks that its peer lives, in ms [layout]"},
    {"load_retries", "UCM_LOAD_RETRIES", "owner retries of a failed backend load"},
    {"io_depth", "UCM_IO_DEPTH", "backend loads in flight per rank"},
    {"owner_grace_us", "UCM_OWNER_GRACE_US",
     "how long a peer's share of a task waits for that peer to load it before this rank does, in us"},
    {"segment_bytes", "UCM_SEGMENT_BYTES", "bound on one data-plane segment, in bytes (K/M/G suffixes) [layout]"},
    {"backend", "UCM_BACKEND", "the store: posix:/dir[,depth=8] or sim:latency_us=... (no default) [layout]"},
    {"copy_engine", "UCM_COPY_ENGINE", "auto|cuda|host|async-test: what copies slots to the app's buffers"},
    {"allow_overcommit", "UCM_OVERCOMMIT",
     "1|0: 1 maps the data plane lazily, unchecked; 0 refuses one larger than the node can give"},
};

// describe_config's "a=1 b=x ..." line as field -> value. A value may hold
// blanks (a backend spec): a word that does not start with `name=` belongs to
// the value before it.
std::map<std::string, std::string> parse_described(const std::string& line) {
  std::map<std::string, std::string> out;
  std::string* last = nullptr;
  size_t i = 0;
  while (i <= line.size()) {
    size_t end = line.find(' ', i);
    if (end == std::string::npos) end = line.size();
    const std::string word = line.substr(i, end - i);
    const size_t eq = word.find('=');
    bool field = eq != std::string::npos && eq > 0;
    for (size_t k = 0; field && k < eq; ++k) field = (word[k] >= 'a' && word[k] <= 'z') || word[k] == '_';
    if (field) {
      last = &out[word.substr(0, eq)];
      *last = word.substr(eq + 1);
    } else if (last) {
      *last += " " + word;
    }
    i = end + 1;
  }
  return out;
}

}  // namespace

Result tunables_view(std::vector<TunableRow>* out) {
  ucm_config_t defaults;
  config_defaults(&defaults);
  ucm_config_t current = defaults;
  UCM_CHECK(config_from_env(&current));
  std::map<std::string, std::string> def = parse_described(describe_config(defaults));
  std::map<std::string, std::string> cur = parse_described(describe_config(current));
  out->clear();
  for (const Doc& d : kDocs) {
    TunableRow row;
    row.field = d.field;
    row.env = d.env;
    row.value = cur[d.field];
    row.default_value = def[d.field];
    row.source = std::getenv(d.env) ? "environment" : "default";
    row.help = d.help;
    out->push_back(row);
    cur.erase(d.field);
  }
  // A field the init line prints but this view does not document still shows,
  // with no variable: the test of ucm_info -c refuses such a row.
  for (const auto& [field, value] : cur) out->push_back({field, "", value, "", "default", ""});
  return Result::kOk;
}

}  // namespace ucm
