/*
 * A downstream C program, built against the *installed* ucmcache through
 * `pkg-config --cflags --libs ucmcache` by install_test.sh. It proves that the
 * public header is plain C, is found as <ucmcache/ucm.h>, and that the library
 * links and runs from its installed location.
 *
 * Prints "version <v>" and "result <string>" lines; install_test.sh checks them.
 */
#include <ucmcache/ucm.h>

#include <stdio.h>
#include <string.h>

int main(void) {
  const char* version = ucm_version_string();
  const char* ok = ucm_result_string(UCM_OK);
  const char* no_space = ucm_result_string(UCM_ERR_NO_SPACE);
  const char* unknown = ucm_result_string((ucm_result_t)9999);
  if (version == NULL || ok == NULL || no_space == NULL || unknown == NULL) {
    fprintf(stderr, "consumer: a C API call returned NULL\n");
    return 1;
  }
  if (strncmp(no_space, "UCM_ERR_NO_SPACE", strlen("UCM_ERR_NO_SPACE")) != 0) {
    fprintf(stderr, "consumer: unexpected result string '%s'\n", no_space);
    return 1;
  }
  printf("version %s\n", version);
  printf("result %s\n", ok);
  printf("result %s\n", no_space);
  printf("result %s\n", unknown);
  return 0;
}
