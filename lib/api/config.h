// Configuration: defaults, UCM_* variables, checks, the layout it implies, and
// the record ranks compare to agree on it.
#pragma once

#include <cstdint>
#include <string>

#include "common/result.h"
#include "ctrl/buffer_ctrl.h"
#include "data/buffer_data.h"
#include "ucmcache/ucm.h"

namespace ucm {

void config_defaults(ucm_config_t* c);
[[nodiscard]] Result config_from_env(ucm_config_t* c);
[[nodiscard]] Result check_config(const ucm_config_t& c);

// Layout of the shared planes for a node of `local_size` ranks.
[[nodiscard]] Result layout_from_config(const ucm_config_t& c, uint32_t local_size, CtrlParams* ctrl, DataParams* data);

// One line per field, for the effective configuration printed at init.
std::string describe_config(const ucm_config_t& c);

// The fields every rank of a node must agree on, as (name, value) rows in a
// fixed order; `backend` is compared by its hash and printed in full.
struct AgreementRecord {
  static constexpr int kFields = 14;
  uint64_t values[kFields];
};
AgreementRecord agreement_record(const ucm_config_t& c);
const char* agreement_field_name(int i);

}  // namespace ucm
