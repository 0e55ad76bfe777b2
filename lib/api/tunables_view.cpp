#include "api/tunables_view.h"

#include <cstdlib>

#include "api/config.h"
#include "common/log.h"

namespace ucm {

Result tunables_view(std::vector<TunableRow>* out) {
  ucm_config_t defaults;
  config_defaults(&defaults);
  ucm_config_t current = defaults;
  UCM_CHECK(config_from_env(&current));
  size_t n = 0;
  const Tunable* table = tunables(&n);
  out->clear();
  for (size_t i = 0; i < n; ++i) {
    const Tunable& t = table[i];
    TunableRow row;
    row.field = t.name;
    row.env = t.env;
    row.value = tunable_text(current, t);
    row.default_value = tunable_text(defaults, t);
    row.source = std::getenv(t.env) ? "environment" : "default";
    row.type = tunable_type_name(t.type);
    row.bounds = tunable_bounds(t);
    row.layout = t.layout;
    row.help = std::string(t.help) + (t.layout ? " [layout]" : "");
    out->push_back(row);
  }
  return Result::kOk;
}

}  // namespace ucm
