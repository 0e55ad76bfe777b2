/* A counting NVTX tool (see nvtx_count.h). It installs its own functions in
 * NVTX's CORE2 table (the domain calls the library makes): DomainCreateA,
 * DomainRegisterStringA, DomainRangePushEx, DomainRangePop. */
#define NVTX_NO_IMPL
#include <nvtx3/nvToolsExt.h>

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "nvtx_count.h"

#define MAX_NAMES 64
#define MAX_DOMAINS 16

struct domain {
  char name[64];
};

static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static int initialized, domain_created;
static struct domain domains[MAX_DOMAINS];
static int ndomains;
static struct {
  char name[64];
  uint64_t pushes;
} names[MAX_NAMES];
static int nnames;
static uint64_t pushes, pops, unmatched, foreign;
static __thread int depth;
static char listing[MAX_NAMES * 66];

static int is_ours(nvtxDomainHandle_t d) {
  const struct domain* dom = (const struct domain*)(const void*)d;
  return dom && strcmp(dom->name, "ucmcache") == 0;
}

static nvtxDomainHandle_t count_domain_create(const char* name) {
  pthread_mutex_lock(&mu);
  struct domain* d = NULL;
  if (ndomains < MAX_DOMAINS) {
    d = &domains[ndomains++];
    snprintf(d->name, sizeof(d->name), "%s", name ? name : "");
    if (strcmp(d->name, "ucmcache") == 0) domain_created = 1;
  }
  pthread_mutex_unlock(&mu);
  return (nvtxDomainHandle_t)(void*)d;
}

static nvtxStringHandle_t count_register_string(nvtxDomainHandle_t d, const char* s) {
  (void)d;
  return (nvtxStringHandle_t)(void*)strdup(s ? s : "");
}

static int count_push(nvtxDomainHandle_t d, const nvtxEventAttributes_t* a) {
  const char* name = NULL;
  if (a && a->messageType == NVTX_MESSAGE_TYPE_REGISTERED) name = (const char*)(const void*)a->message.registered;
  else if (a && a->messageType == NVTX_MESSAGE_TYPE_ASCII) name = a->message.ascii;
  pthread_mutex_lock(&mu);
  if (!is_ours(d) || !name) {
    ++foreign;
  } else {
    ++pushes;
    int i = 0;
    while (i < nnames && strcmp(names[i].name, name) != 0) ++i;
    if (i == nnames && nnames < MAX_NAMES) snprintf(names[nnames++].name, sizeof(names[0].name), "%s", name);
    if (i < nnames) ++names[i].pushes;
  }
  pthread_mutex_unlock(&mu);
  return depth++;
}

static int count_pop(nvtxDomainHandle_t d) {
  pthread_mutex_lock(&mu);
  if (!is_ours(d)) ++foreign;
  else ++pops;
  if (depth == 0) ++unmatched;
  pthread_mutex_unlock(&mu);
  return depth > 0 ? --depth : -1;
}

int InitializeInjectionNvtx2(NvtxGetExportTableFunc_t get_table);
int InitializeInjectionNvtx2(NvtxGetExportTableFunc_t get_table) {
  const NvtxExportTableCallbacks* cb = (const NvtxExportTableCallbacks*)get_table(NVTX_ETID_CALLBACKS);
  NvtxFunctionTable table = NULL;
  unsigned int size = 0;
  if (!cb || !cb->GetModuleFunctionTable(NVTX_CB_MODULE_CORE2, &table, &size) || size < NVTX_CBID_CORE2_DomainCreateA)
    return 0;
  *table[NVTX_CBID_CORE2_DomainCreateA] = (NvtxFunctionPointer)count_domain_create;
  *table[NVTX_CBID_CORE2_DomainRegisterStringA] = (NvtxFunctionPointer)count_register_string;
  *table[NVTX_CBID_CORE2_DomainRangePushEx] = (NvtxFunctionPointer)count_push;
  *table[NVTX_CBID_CORE2_DomainRangePop] = (NvtxFunctionPointer)count_pop;
  pthread_mutex_lock(&mu);
  initialized = 1;
  pthread_mutex_unlock(&mu);
  return 1;
}

#define LOCKED_READ(type, expr) \
  do {                          \
    pthread_mutex_lock(&mu);    \
    const type v_ = (expr);     \
    pthread_mutex_unlock(&mu);  \
    return v_;                  \
  } while (0)

int nvtx_count_initialized(void) { LOCKED_READ(int, initialized); }
int nvtx_count_domain_created(void) { LOCKED_READ(int, domain_created); }
uint64_t nvtx_count_total_pushes(void) { LOCKED_READ(uint64_t, pushes); }
uint64_t nvtx_count_total_pops(void) { LOCKED_READ(uint64_t, pops); }
uint64_t nvtx_count_unmatched_pops(void) { LOCKED_READ(uint64_t, unmatched); }
uint64_t nvtx_count_foreign(void) { LOCKED_READ(uint64_t, foreign); }

uint64_t nvtx_count_pushes(const char* name) {
  uint64_t n = 0;
  pthread_mutex_lock(&mu);
  for (int i = 0; i < nnames; ++i)
    if (strcmp(names[i].name, name) == 0) n = names[i].pushes;
  pthread_mutex_unlock(&mu);
  return n;
}

const char* nvtx_count_names(void) {
  pthread_mutex_lock(&mu);
  size_t at = 0;
  listing[0] = '\0';
  for (int i = 0; i < nnames && at < sizeof(listing); ++i)
    at += (size_t)snprintf(listing + at, sizeof(listing) - at, "%s%s", i ? ", " : "", names[i].name);
  pthread_mutex_unlock(&mu);
  return listing;
}
