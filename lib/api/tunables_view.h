// Every tunable as ucm_info -c / -f prints it: the field, its UCM_* variable,
// the value ucm_config_init gives now, the default, where the value came from,
// and one line of help.
//
// A view, not the definition: every row comes from the one table of
// tunables in config.cpp (name, variable, default, help, layout flag).
#pragma once

#include <string>
#include <vector>

#include "common/result.h"

namespace ucm {

struct TunableRow {
  std::string field;          // the ucm_config_t field ("shard_bytes")
  std::string env;            // its variable ("UCM_SHARD_BYTES")
  std::string value;          // what ucm_config_init gives in this environment
  std::string default_value;  // what it gives with the variable unset
  std::string source;         // "environment" or "default"
  std::string type;           // "uint", "int", "size", "enum", "device", "string"
  std::string bounds;         // the values it takes: "1..65536", "rotate|natural"
  bool layout = false;        // every rank of a node must agree on it
  std::string help;
};

// Fails, naming the variable and its bad value, when a UCM_* variable does not
// parse (as ucm_config_init would).
[[nodiscard]] Result tunables_view(std::vector<TunableRow>* out);

}  // namespace ucm
