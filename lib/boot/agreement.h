// The record the ranks of a node compare to agree on the layout
// (agree_on_config, boot/node.h): one 64-bit value per layout row of the
// tunables table, in the table's order, a string row by its hash. The
// configuration layer builds it and names its fields (agreement_record and
// agreement_field_name, api/config.h); the bootstrap only compares records,
// so it needs neither the table nor the configuration. No MPI here: the
// configuration is built without MPI too.
#pragma once

#include <cstddef>
#include <cstdint>

namespace ucm {

struct AgreementRecord {
  static constexpr int kFields = 17;  // layout rows in the table (checked in api/config.cpp)
  uint64_t values[kFields];
};

// A rank's record and what a mismatch message needs: each field's name, and
// the store's spec as text (its field, named "backend", is compared by hash;
// on a mismatch the ranks gather the text to show what differs).
struct Agreement {
  AgreementRecord record;
  const char* (*field_name)(int i);
  const char* backend;   // backend_bytes of text, NUL-terminated within them
  size_t backend_bytes;
};

}  // namespace ucm
