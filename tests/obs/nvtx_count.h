/* A counting NVTX tool for tests (nvtx_count.c): loaded by NVTX through
 * NVTX_INJECTION64_PATH, it counts the ranges pushed in the `ucmcache`
 * domain by name, and the pops. A program linked against it reads the counts;
 * without the variable NVTX never initializes it, and every count stays 0. */
#ifndef UCM_TESTS_OBS_NVTX_COUNT_H
#define UCM_TESTS_OBS_NVTX_COUNT_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* 1 once NVTX has called the tool's InitializeInjectionNvtx2. */
int nvtx_count_initialized(void);
/* 1 once a domain named "ucmcache" was created. */
int nvtx_count_domain_created(void);
/* Pushes of ranges named `name` in the ucmcache domain. */
uint64_t nvtx_count_pushes(const char* name);
/* All pushes and pops in the ucmcache domain; pops without a push on their
 * thread; pushes and pops in any other domain, or without a registered or
 * ASCII name. */
uint64_t nvtx_count_total_pushes(void);
uint64_t nvtx_count_total_pops(void);
uint64_t nvtx_count_unmatched_pops(void);
uint64_t nvtx_count_foreign(void);
/* The names seen, one per line, for a failure message (static storage). */
const char* nvtx_count_names(void);

#ifdef __cplusplus
}
#endif

#endif
