// The names of this process's threads (/proc/self/task/*/comm), for tests
// that check what the library's threads are called (common/thread_name.h).
#pragma once

#include <dirent.h>
#include <sys/types.h>

#include <cstdlib>
#include <fstream>
#include <set>
#include <string>
#include <utility>
#include <vector>

namespace ucm::test {

// Every thread of this process: its tid and its name.
inline std::vector<std::pair<pid_t, std::string>> threads_named() {
  std::vector<std::pair<pid_t, std::string>> out;
  DIR* d = opendir("/proc/self/task");
  if (d == nullptr) return out;
  while (const dirent* e = readdir(d)) {
    if (e->d_name[0] == '.') continue;
    std::ifstream f(std::string("/proc/self/task/") + e->d_name + "/comm");
    std::string n;
    if (std::getline(f, n)) out.emplace_back(static_cast<pid_t>(std::atoi(e->d_name)), n);
  }
  closedir(d);
  return out;
}

inline std::multiset<std::string> thread_names() {
  std::multiset<std::string> names;
  for (const auto& [tid, name] : threads_named()) names.insert(name);
  return names;
}

}  // namespace ucm::test
