// The names of this process's threads (/proc/self/task/*/comm), for tests
// that check what the library's threads are called (common/thread_name.h).
#pragma once

#include <dirent.h>

#include <fstream>
#include <set>
#include <string>

namespace ucm::test {

inline std::multiset<std::string> thread_names() {
  std::multiset<std::string> names;
  DIR* d = opendir("/proc/self/task");
  if (d == nullptr) return names;
  while (const dirent* e = readdir(d)) {
    if (e->d_name[0] == '.') continue;
    std::ifstream f(std::string("/proc/self/task/") + e->d_name + "/comm");
    std::string n;
    if (std::getline(f, n)) names.insert(n);
  }
  closedir(d);
  return names;
}

}  // namespace ucm::test
