/* For the mpi suite's C programs: the small host-memory cache they start
 * (cache_bytes of 64 KiB shards over the sim store at latency 0, no
 * hugepages, the host copy engine), with their own timeout_ms. */
#ifndef UCM_TESTS_MPI_C_CONFIG_H
#define UCM_TESTS_MPI_C_CONFIG_H

#include <stdint.h>
#include <stdio.h>

#include "ucmcache/ucm.h"

static inline ucm_config_t small_host_config(uint64_t cache_bytes, uint32_t timeout_ms) {
  ucm_config_t cfg;
  ucm_config_init(&cfg);
  cfg.cache_bytes = cache_bytes;
  cfg.shard_bytes = 64u << 10;
  cfg.hugepages = UCM_HUGEPAGES_OFF;
  cfg.copy_engine = UCM_COPY_ENGINE_HOST;
  cfg.timeout_ms = timeout_ms;
  snprintf(cfg.backend, sizeof(cfg.backend), "sim:latency_us=0");
  return cfg;
}

#endif
