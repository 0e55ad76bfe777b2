// C API without MPI: no cache can exist, so every handle's last error is the
// thread's (ucm_config_* and ucm_get_version are the calls that can fail).
#include "api/guard.h"
#include "ucmcache/ucm_base.h"

extern "C" {

UCM_API const char* ucm_last_error(ucm_cache_t) { return ucm::orphan_error(); }

}  // extern "C"
